//! Test DSL: a recording upstream, the gateway in-process on port 0 (or as a real
//! process), and an HTTP client. Everything real: sockets on loopback, no mocks.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use dedup_gateway::{Config, Gateway, Listeners};
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::{Notify, oneshot};

/// How long any awaited condition may take before the test fails.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// Awaits `fut`, failing the test with `what` if it takes longer than [`PATIENCE`].
pub async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(PATIENCE, fut)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

/// Polls `cond` until it holds (bounded by [`PATIENCE`]).
pub async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    within(what, async {
        while !cond() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
}

// ---------------------------------------------------------------- upstream

/// A request the upstream received.
#[derive(Clone, Debug)]
pub struct Received {
    pub method: Method,
    pub uri: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Received {
    /// The `msgId` of a JSON body, for counting deliveries per id.
    pub fn msg_id(&self) -> Option<String> {
        let v: serde_json::Value = serde_json::from_slice(&self.body).ok()?;
        match &v["msgId"] {
            serde_json::Value::String(s) => Some(s.clone()),
            serde_json::Value::Number(n) => Some(n.to_string()),
            _ => None,
        }
    }
}

/// What the upstream answers.
#[derive(Clone, Debug)]
pub struct Reply {
    pub status: u16,
    pub body: Bytes,
    pub content_type: &'static str,
    /// Further response headers.
    pub headers: Vec<(&'static str, &'static str)>,
}

impl Reply {
    pub fn new(status: u16, body: impl Into<Bytes>) -> Self {
        Reply {
            status,
            body: body.into(),
            content_type: "application/json",
            headers: Vec::new(),
        }
    }
}

type Behaviour = Arc<dyn Fn(Received) -> Pin<Box<dyn Future<Output = Reply> + Send>> + Send + Sync>;

/// A real HTTP server on loopback that records every request and answers per behaviour.
pub struct Upstream {
    pub addr: SocketAddr,
    log: Arc<(Mutex<Vec<Received>>, Notify)>,
}

impl Upstream {
    /// Answers 200 `{"reply":"ok <msgId>"}` at once.
    pub async fn ok() -> Self {
        Self::with(
            |r| async move { Reply::new(200, format!("{{\"reply\":\"ok {}\"}}", r.msg_id().unwrap_or_default())) },
        )
        .await
    }

    /// Every request waits at `gate` (a bot that is slow until the test says so), then
    /// gets 200 with `body`.
    pub async fn gated(gate: &Gate, body: &'static str) -> Self {
        let gate = gate.clone();
        Self::with(move |_| {
            let gate = gate.clone();
            async move {
                gate.pass().await;
                Reply::new(200, body)
            }
        })
        .await
    }

    pub async fn with<F, Fut>(behaviour: F) -> Self
    where
        F: Fn(Received) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Reply> + Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind upstream");
        Self::on(listener, behaviour)
    }

    /// [`Upstream::with`] on a listener of the test's choosing (say, on the port of a
    /// bot that was down until now).
    pub fn on<F, Fut>(listener: TcpListener, behaviour: F) -> Self
    where
        F: Fn(Received) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Reply> + Send + 'static,
    {
        let behaviour: Behaviour = Arc::new(move |r| Box::pin(behaviour(r)));
        let addr = listener.local_addr().expect("addr");
        let log = Arc::new((Mutex::new(Vec::new()), Notify::new()));
        let log2 = Arc::clone(&log);
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let behaviour = Arc::clone(&behaviour);
                let log = Arc::clone(&log2);
                tokio::spawn(async move {
                    let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                        let behaviour = Arc::clone(&behaviour);
                        let log = Arc::clone(&log);
                        async move {
                            let (head, body) = req.into_parts();
                            let body = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                            let received = Received {
                                method: head.method,
                                uri: head.uri.to_string(),
                                headers: head.headers,
                                body,
                            };
                            {
                                let mut all = log.0.lock().expect("log");
                                all.push(received.clone());
                            }
                            log.1.notify_waiters();
                            let reply = behaviour(received).await;
                            let mut response = http::Response::builder()
                                .status(reply.status)
                                .header("content-type", reply.content_type);
                            for (name, value) in reply.headers {
                                response = response.header(name, value);
                            }
                            let response = response.body(Full::new(reply.body)).expect("response");
                            Ok::<_, std::convert::Infallible>(response)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Upstream { addr, log }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn received(&self) -> Vec<Received> {
        self.log.0.lock().expect("log").clone()
    }

    pub fn count(&self) -> usize {
        self.log.0.lock().expect("log").len()
    }

    /// Waits until at least `n` requests have arrived.
    pub async fn wait_for(&self, n: usize) {
        within(&format!("{n} upstream deliveries"), async {
            loop {
                let notified = self.log.1.notified();
                if self.count() >= n {
                    return;
                }
                notified.await;
            }
        })
        .await
    }
}

/// A gate a slow upstream waits at until the test opens it.
#[derive(Clone)]
pub struct Gate(Arc<tokio::sync::Semaphore>);

impl Gate {
    pub fn new() -> Self {
        Gate(Arc::new(tokio::sync::Semaphore::new(0)))
    }

    pub async fn pass(&self) {
        within("the gate to open", self.0.acquire())
            .await
            .expect("gate")
            .forget();
    }

    /// Lets `n` waiting (or future) passers through.
    pub fn open(&self, n: usize) {
        self.0.add_permits(n);
    }
}

// ---------------------------------------------------------------- config

/// A gateway config around one route named `bot` at `/hook`, keyed on `json:/msgId`.
pub struct Cfg {
    pub server: String,
    pub store: String,
    pub route: String,
    pub extra: String,
}

impl Cfg {
    pub fn new() -> Self {
        Cfg {
            server: String::new(),
            store: String::new(),
            route: String::new(),
            extra: String::new(),
        }
    }

    pub fn server(mut self, line: &str) -> Self {
        self.server.push_str(line);
        self.server.push('\n');
        self
    }

    pub fn store(mut self, line: &str) -> Self {
        self.store.push_str(line);
        self.store.push('\n');
        self
    }

    pub fn route(mut self, line: &str) -> Self {
        self.route.push_str(line);
        self.route.push('\n');
        self
    }

    /// Appends raw TOML (e.g. another `[[routes]]`); `{upstream}` is filled in later.
    pub fn extra(mut self, toml: &str) -> Self {
        self.extra.push_str(toml);
        self
    }

    pub fn toml(&self, upstream: &str) -> String {
        let has = |section: &str, key: &str| section.lines().any(|l| l.trim_start().starts_with(key));
        let mut server = self.server.clone();
        if !has(&server, "listen") {
            server.push_str("listen = \"127.0.0.1:0\"\n");
        }
        if !has(&server, "admin_listen") {
            server.push_str("admin_listen = \"127.0.0.1:0\"\n");
        }
        let key = if has(&self.route, "key") || has(&self.route, "preset") {
            ""
        } else {
            "key = [\"json:/msgId\"]\n"
        };
        format!(
            "[server]\n{server}\n[store]\n{}\n[[routes]]\nname = \"bot\"\npath = \"/hook\"\nupstream = \"{upstream}\"\n{key}{}\n{}",
            self.store,
            self.route,
            self.extra.replace("{upstream}", upstream)
        )
    }
}

// ---------------------------------------------------------------- gateway in-process

/// A gateway running in this test's runtime on port 0.
pub struct TestGateway {
    pub addr: SocketAddr,
    pub admin: Option<SocketAddr>,
    pub gw: Arc<Gateway>,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl TestGateway {
    pub async fn start(cfg: &Cfg, upstream: &Upstream) -> Self {
        Self::start_toml(&cfg.toml(&upstream.url())).await
    }

    pub async fn start_toml(toml: &str) -> Self {
        let config = Config::parse(toml).unwrap_or_else(|e| panic!("test config invalid: {e}\n{toml}"));
        let store = crate::support::store_for(&config).await;
        Self::start_with(config, store).await
    }

    pub async fn start_with(config: Config, store: dedup_gateway::store::AnyStore) -> Self {
        let listeners = Listeners::bind(&config.server).await.expect("bind gateway");
        let addr = listeners.proxy_addr().expect("addr");
        let admin = listeners.admin.as_ref().map(|l| l.local_addr().expect("admin addr"));
        let gw = Gateway::new(&config, store);
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(dedup_gateway::run(
            Arc::clone(&gw),
            config.server.clone(),
            listeners,
            None,
            async {
                let _ = rx.await;
            },
        ));
        // Serving once every worker has opened its store connections.
        eventually("the gateway's workers to start", || {
            gw.workers_starting.load(std::sync::atomic::Ordering::SeqCst) == 0
        })
        .await;
        TestGateway {
            addr,
            admin,
            gw,
            shutdown: Some(tx),
            task: Some(task),
        }
    }

    pub fn client(&self) -> Client {
        Client::http1(self.addr)
    }

    /// The Prometheus text the admin listener would serve.
    pub fn metrics(&self) -> String {
        self.gw.render_metrics(dedup_gateway::metrics::Format::OpenMetrics)
    }

    /// The value of one sample line, e.g. `dedup_requests_total{route="bot",outcome="forwarded"}`.
    pub fn metric(&self, series: &str) -> f64 {
        metric_value(&self.metrics(), series)
    }

    /// Signals shutdown and waits for the drain to finish.
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            within("the gateway to drain", task).await.expect("gateway task");
        }
    }
}

impl Drop for TestGateway {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Reads one sample from Prometheus text; a missing series fails the test (a typo in a
/// series name must not read as 0).
pub fn metric_value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no series {series} in:\n{text}"))
}

/// The store a test config asks for.
pub async fn store_for(config: &Config) -> dedup_gateway::store::AnyStore {
    dedup_gateway::store::connect(&config.store)
        .await
        .unwrap_or_else(|e| panic!("store: {e}"))
}

// ---------------------------------------------------------------- client

/// An HTTP client for the gateway (HTTP/1.1, or h2c with prior knowledge).
#[derive(Clone)]
pub struct Client {
    inner: HyperClient<HttpConnector, Full<Bytes>>,
    base: SocketAddr,
}

/// A response, fully read.
#[derive(Debug)]
pub struct Resp {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
    /// The body as received, byte for byte.
    pub bytes: Bytes,
}

impl Resp {
    /// The `x-dedup-status` header ("" when absent).
    pub fn dedup(&self) -> &str {
        self.headers
            .get("x-dedup-status")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }
}

impl Client {
    pub fn http1(base: SocketAddr) -> Self {
        let inner = HyperClient::builder(TokioExecutor::new()).build_http();
        Client { inner, base }
    }

    pub fn h2c(base: SocketAddr) -> Self {
        let inner = HyperClient::builder(TokioExecutor::new()).http2_only(true).build_http();
        Client { inner, base }
    }

    pub async fn post(&self, path: &str, body: &str) -> Resp {
        self.send(Method::POST, path, &[], body).await
    }

    /// A GET that reports a connection failure as `None` (for polling a server that
    /// is still starting).
    pub async fn try_send(&self, method: Method, path: &str) -> Option<Resp> {
        let req = Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", self.base))
            .body(Full::new(Bytes::new()))
            .expect("request");
        let (head, body) = self.inner.request(req).await.ok()?.into_parts();
        let body = body.collect().await.ok()?.to_bytes();
        Some(Resp {
            status: head.status,
            headers: head.headers,
            body: String::from_utf8_lossy(&body).into_owned(),
            bytes: body,
        })
    }

    pub async fn send(&self, method: Method, path: &str, headers: &[(&str, &str)], body: &str) -> Resp {
        let mut req = Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", self.base));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(Full::new(Bytes::from(body.to_owned()))).expect("request");
        let response = within("a response", self.inner.request(req))
            .await
            .expect("request failed");
        let (head, body) = response.into_parts();
        let body = within("a response body", body.collect())
            .await
            .expect("body")
            .to_bytes();
        Resp {
            status: head.status,
            headers: head.headers,
            body: String::from_utf8_lossy(&body).into_owned(),
            bytes: body,
        }
    }
}

/// A JSON webhook body with this message id.
pub fn msg(id: &str) -> String {
    format!("{{\"msgId\":\"{id}\",\"content\":\"hello\"}}")
}

/// `body` in HTTP/1.1 chunked coding, in chunks of at most `size` bytes, with the last
/// chunk: appended to `head`, for requests and answers written by hand.
pub fn chunked(mut head: Vec<u8>, body: &[u8], size: usize) -> Vec<u8> {
    for chunk in body.chunks(size) {
        head.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        head.extend_from_slice(chunk);
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"0\r\n\r\n");
    head
}

// ---------------------------------------------------------------- raw upstreams

/// A blocking listener on a free loopback port, for upstreams that must act at exact
/// moments (threads of their own, unaffected by the test's runtime), and its authority.
pub fn raw_listener() -> (std::net::TcpListener, http::uri::Authority) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let authority = listener
        .local_addr()
        .expect("addr")
        .to_string()
        .parse()
        .expect("authority");
    (listener, authority)
}

/// Reads one Content-Length request from a blocking stream and returns its body;
/// `None` at EOF. Byte by byte, so nothing of a following request is taken.
pub fn read_raw_request(stream: &mut std::net::TcpStream) -> Option<String> {
    use std::io::Read;
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => buf.push(byte[0]),
            _ => return None,
        }
    }
    let head = String::from_utf8_lossy(&buf).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map_or(0, |v| v.trim().parse().expect("content-length"));
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).ok()?;
    Some(String::from_utf8_lossy(&body).into_owned())
}

/// Blocks (without yielding to the runtime) until the kernel has delivered the peer's
/// close to the loopback socket `local` connected to `remote`: its state in
/// `/proc/net/tcp` is CLOSE_WAIT or later, or it is gone. `close()` on the other end
/// returns before that under load (loopback delivery can wait for ksoftirqd), and a
/// close the kernel has not delivered is one no client can see.
pub fn await_close_delivered(local: SocketAddr, remote: SocketAddr) {
    let hex = |a: SocketAddr| match a {
        SocketAddr::V4(a) => format!("{:08X}:{:04X}", u32::from_ne_bytes(a.ip().octets()), a.port()),
        SocketAddr::V6(_) => panic!("raw upstreams listen on IPv4 loopback"),
    };
    let (local, remote) = (hex(local), hex(remote));
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        let table = std::fs::read_to_string("/proc/net/tcp").expect("read /proc/net/tcp");
        let state = table.lines().skip(1).find_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            (fields.get(1) == Some(&local.as_str()) && fields.get(2) == Some(&remote.as_str()))
                .then(|| u8::from_str_radix(fields[3], 16).expect("state"))
        });
        // 1 ESTABLISHED, 4 FIN_WAIT1, 5 FIN_WAIT2: no FIN received yet; 8 CLOSE_WAIT,
        // 9 LAST_ACK, 7 CLOSE or absent: it was.
        if !matches!(state, Some(1 | 4 | 5)) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the close of {remote} never reached {local} (state {state:?})"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

// ---------------------------------------------------------------- the binary

/// The gateway binary, for tests that run it as users do.
pub const BIN: &str = env!("CARGO_BIN_EXE_dedup-gateway");

/// A file in a fresh temporary directory, removed with the value.
pub struct TempFile(pub PathBuf);

impl TempFile {
    pub fn new(name: &str, contents: &str) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "dedup-gateway-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join(name);
        std::fs::write(&path, contents).expect("write temp file");
        TempFile(path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(dir) = self.0.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Runs the binary with `args` and `stdin`, from the repository's root.
pub fn run(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(BIN)
        .args(args)
        .env_remove("DEDUP_GATEWAY_CONFIG")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn dedup-gateway");
    use std::io::Write;
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("write stdin");
    child.wait_with_output().expect("wait")
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs `check --config <toml>`, which must accept it: its stdout.
pub fn check_accepts(toml: &str) -> String {
    let config = TempFile::new("gateway.toml", toml);
    let out = run(&["check", "--config", config.0.to_str().expect("path")], "");
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
}

/// Runs `check` on `toml`, which it must refuse (exit 1); its stderr.
pub fn check_refuses(toml: &str) -> String {
    let config = TempFile::new("gateway.toml", toml);
    let out = run(&["check", "--config", config.0.to_str().expect("path")], "");
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    stderr
}

/// Asserts that `output` contains each of `expected`, naming the first it lacks.
pub fn assert_contains_each(output: &str, expected: &[&str]) {
    for line in expected {
        assert!(output.contains(line), "missing {line:?} in:\n{output}");
    }
}
