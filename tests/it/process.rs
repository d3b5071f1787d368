//! The binary as users run it: `check`, `key`, `--version`, and `serve` with signals.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use crate::support::{
    BIN, Cfg, Client, Gate, TempFile, Upstream, assert_contains_each, check_accepts, check_refuses, msg, run, text,
    within,
};

#[test]
fn check_accepts_the_shipped_gateway_toml_and_prints_its_routes() {
    let shipped = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/gateway.toml")).expect("gateway.toml");
    assert_contains_each(
        &check_accepts(&shipped),
        &[
            "route \"bot\": /api/v1/webhook -> http://127.0.0.1:5000",
            "key = [json:/msgId, json:/data/msgId, json:/eventId]",
        ],
    );
}

#[test]
fn check_reports_every_problem_with_its_key_path_and_exits_1() {
    let stderr = check_refuses(
        r#"
[server]
listen = "127.0.0.1:0"
header_timout = "10s"

[[routes]]
name = "bot"
path = "/hook"
upstream = "http://127.0.0.1:5000"
key = ["json:/msgId", "jsn:/msgId"]
upstream_timeout = "25s"
completed_ttl = "24 hours please"
processing_ttl = "20s"
"#,
    );
    assert_contains_each(
        &stderr,
        &[
            "server.header_timout: unknown key (did you mean \"header_timeout\"?)",
            "routes[0].key[1]: unknown source \"jsn:/msgId\" (expected json:, xml:, header:, query:, form:, body)",
            "routes[0].completed_ttl: invalid duration \"24 hours please\"",
            "routes[0].processing_ttl: 20s must exceed upstream_timeout (25s) + 4 x store.timeout (250ms) = 26s",
        ],
    );
}

/// The marker must outlive a claim and its re-read, the upstream call, and a complete
/// and its retry: 4 store timeouts, not 2.
#[test]
fn processing_ttl_must_cover_four_store_calls_besides_the_upstream() {
    let cfg = |ttl: &str| {
        Cfg::new()
            .store("timeout = \"1s\"")
            .route("upstream_timeout = \"25s\"")
            .route(&format!("processing_ttl = \"{ttl}\""))
            .toml("http://127.0.0.1:9")
    };
    assert_contains_each(
        &check_refuses(&cfg("28s")),
        &["28s must exceed upstream_timeout (25s) + 4 x store.timeout (1s) = 29s"],
    );
    assert_contains_each(
        &check_accepts(&cfg("30s")),
        &["processing_ttl 30s (> 29s = upstream_timeout + 4 x store.timeout)"],
    );
}

/// A config whose `[store]` has these lines.
fn store_cfg(lines: &[&str]) -> String {
    lines
        .iter()
        .fold(Cfg::new(), |c, l| c.store(l))
        .toml("http://127.0.0.1:9")
}

/// The README's `[store]` template, with the backend switched and the other backend's
/// settings left in: the sizing ones are ignored with a warning, an address is not.
#[test]
fn settings_of_the_other_store_backend_warn_and_a_redis_address_on_memory_is_refused() {
    let redis = store_cfg(&[
        "backend = \"redis\"",
        "url = \"redis://127.0.0.1:6379/0\"",
        "max_entries = 1_000_000",
        "max_bytes = \"256MiB\"",
    ]);
    assert_contains_each(
        &check_accepts(&redis),
        &[
            "warning: store.max_entries: ignored: only applies to backend = \"memory\"",
            "warning: store.max_bytes: ignored: only applies to backend = \"memory\"",
        ],
    );
    assert_contains_each(
        &check_accepts(&store_cfg(&["pool_size = 32"])),
        &["warning: store.pool_size: ignored"],
    );
    assert_contains_each(
        &check_refuses(&store_cfg(&["url = \"redis://127.0.0.1:6379/0\""])),
        &["store.url: only applies to backend = \"redis\""],
    );
}

/// A config without routes loads (the admin port alone is valid) but is most likely a
/// file cut short or mounted empty, where every request would get 404: `check` says so.
#[test]
fn a_config_without_routes_is_warned_about() {
    assert_contains_each(&check_accepts(""), &["warning: routes: none: every request gets 404"]);
    let shipped = run(&["check", "--config", "gateway.toml"], "");
    assert!(
        !text(&shipped.stdout).contains("warning: routes"),
        "{}",
        text(&shipped.stdout)
    );
}

/// A Redis address given wrongly gets one error, at the key to fix: not a second one
/// saying that no address was given.
#[test]
fn a_redis_address_given_wrongly_is_one_error_at_its_key() {
    for (lines, expected) in [
        (
            // HOME is set wherever tests run: the variable is there, so both are given.
            &[
                "backend = \"redis\"",
                "url = \"redis://127.0.0.1:6379/0\"",
                "url_env = \"HOME\"",
            ][..],
            "store.url_env: set either url or url_env, not both",
        ),
        (
            &["backend = \"redis\"", "cluster = []"],
            "store.cluster: needs at least one seed url",
        ),
        (
            &[
                "backend = \"redis\"",
                "url = \"redis://127.0.0.1:6379/0\"",
                "cluster = [\"redis://127.0.0.1:7000\"]",
            ],
            "store.cluster: set either a url or a cluster, not both",
        ),
        (
            &["cluster_env = \"HOME\""],
            "store.cluster_env: only applies to backend = \"redis\"",
        ),
        // What serve would refuse at start, check refuses too.
        (
            &["backend = \"redis\"", "url = \"redis://127.0.0.1:6379/abc\""],
            "store.url: \"redis://127.0.0.1:6379/abc\" is not a valid Redis URL (Invalid database number",
        ),
        (
            &["backend = \"redis\"", "url = \"redis://127.0.0.1:port/0\""],
            "store.url: \"redis://127.0.0.1:port/0\" is not a valid Redis URL",
        ),
    ] {
        let errors = check_refuses(&store_cfg(lines));
        assert!(errors.contains(expected), "{expected:?} in:\n{errors}");
        assert_eq!(
            errors.matches("store.").count(),
            1,
            "one error for {lines:?}:\n{errors}"
        );
    }
}

/// The admin listener on the proxy's port is a config error `check` reports, not a
/// failed start.
#[test]
fn check_refuses_an_admin_listener_on_the_proxy_port() {
    let toml = Cfg::new()
        .server("listen = \"0.0.0.0:18181\"")
        .server("admin_listen = \"127.0.0.1:18181\"")
        .toml("http://127.0.0.1:9");
    let errors = check_refuses(&toml);
    assert!(
        errors.contains("server.admin_listen: 127.0.0.1:18181 overlaps server.listen (0.0.0.0:18181)"),
        "{errors}"
    );
}

/// A second gateway started on a running one's address (a unit and a manual run) is
/// refused, as by any server, before it listens: `SO_REUSEPORT` would otherwise let
/// it share the port, and with the memory store each would forward one message.
#[tokio::test]
async fn a_second_gateway_on_the_same_address_is_refused() {
    let upstream = crate::support::Upstream::ok().await;
    let first = GatewayProcess::start(&Cfg::new().toml(&upstream.url())).await;
    let listen = format!("listen = \"{}\"", first.addr);
    let second = TempFile::new("second.toml", &Cfg::new().server(&listen).toml(&upstream.url()));
    let mut child = Command::new(BIN)
        .args(["serve", "--config", second.0.to_str().expect("path")])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    // Its stderr to the end, or to the line that says it serves (then it is stopped).
    let stderr = BufReader::new(child.stderr.take().expect("stderr"));
    let lines: Vec<String> = stderr
        .lines()
        .map_while(Result::ok)
        .take_while(|l| !l.contains("serving"))
        .collect();
    let _ = child.kill();
    let status = child.wait().expect("wait");
    let stderr = lines.join("\n");
    assert_eq!(status.code(), Some(1), "the second gateway serves:\n{stderr}");
    let expected = format!("cannot listen on {}: Address already in use", first.addr);
    assert!(stderr.contains(&expected), "{stderr}");
    // The first still serves alone: one message, one forward.
    let client = crate::support::Client::http1(first.addr);
    for expected in ["forwarded", "duplicate"] {
        assert_eq!(
            client.post("/hook", &crate::support::msg("twice")).await.dedup(),
            expected
        );
    }
    assert_eq!(upstream.count(), 1);
}

/// `serve --log-format json` that cannot start says why in a JSON line too, as its
/// collector reads them; a missing file's error is said once.
#[test]
fn a_start_that_fails_is_logged_as_json_with_the_reason_once() {
    let bad = TempFile::new(
        "bad.toml",
        &Cfg::new().route("on_in_flight = \"later\"").toml("http://127.0.0.1:9"),
    );
    let missing = format!("{}.missing", bad.0.display());
    for (config, reason) in [
        (bad.0.to_str().expect("path"), "on_in_flight"),
        (missing.as_str(), "No such file or directory"),
    ] {
        let out = run(&["--log-format", "json", "serve", "--config", config], "");
        assert_eq!(out.status.code(), Some(1));
        let stderr = text(&out.stderr);
        let lines: Vec<serde_json::Value> = stderr
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|_| panic!("not JSON: {l}")))
            .collect();
        let error = lines
            .iter()
            .find(|l| l["message"] == "cannot start")
            .expect("the reason");
        let error = error["error"].as_str().expect("error field");
        assert_eq!(error.matches(reason).count(), 1, "{error}");
    }
}

/// `check | head -1`: a reader that has gone ends the output, without a panic.
#[test]
fn check_into_a_closed_pipe_exits_0_without_a_panic() {
    let mut child = Command::new(BIN)
        .args([
            "check",
            "--config",
            &format!("{}/gateway.toml", env!("CARGO_MANIFEST_DIR")),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    drop(child.stdout.take()); // the reader goes before a line is written
    let out = child.wait_with_output().expect("wait");
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn serve_refuses_a_bad_config_before_listening() {
    let bad = TempFile::new("bad.toml", "[server]\nlisten = \"127.0.0.1:0\"\nbogus = 1\n");
    let out = run(&["--config", bad.0.to_str().expect("path")], "");
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("bogus: unknown key"));
}

#[test]
fn config_path_comes_from_the_environment_when_not_given() {
    let cfg = TempFile::new("env.toml", &Cfg::new().toml("http://127.0.0.1:9"));
    let out = Command::new(BIN)
        .arg("check")
        .env("DEDUP_GATEWAY_CONFIG", &cfg.0)
        .output()
        .expect("run");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("env.toml: OK"));
}

#[test]
fn key_prints_the_exact_digits_of_a_long_numeric_id() {
    let out = run(&["key", "--route", "bot"], "{\"msgId\": 7891234567890123457}\n");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "dedup:bot:7891234567890123457");
}

#[test]
fn key_explains_why_there_is_no_key() {
    let out = run(&["key", "--route", "bot", "-"], "{\"data\":{\"msgId\":null}}");
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("json:/msgId: not present"), "{stderr}");
    assert!(
        stderr.contains("json:/data/msgId: is null, not a string or number"),
        "{stderr}"
    );
    assert!(stderr.contains("no key"), "{stderr}");
}

/// A body `serve` refuses with 400 (XML with a DOCTYPE) is said to be refused, not
/// handed to `on_missing_key` as a body without a key.
#[test]
fn key_says_a_refused_body_gets_400() {
    let cfg = TempFile::new(
        "x.toml",
        "[[routes]]\nname = \"mp\"\npath = \"/mp\"\nupstream = \"http://127.0.0.1:9\"\nkey = [\"xml:MsgId\", \"header:x-id\"]\n",
    );
    let bomb = "<!DOCTYPE x [<!ENTITY a \"b\">]><xml><MsgId>&a;</MsgId></xml>";
    let args = [
        "key",
        "--config",
        cfg.0.to_str().expect("path"),
        "--route",
        "mp",
        "--header",
        "x-id: h1",
    ];
    let out = run(&args, bomb);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("DOCTYPE or entity declaration"), "{stderr}");
    assert!(stderr.contains("the gateway answers 400"), "{stderr}");
    assert!(!stderr.contains("on_missing_key"), "{stderr}");
    assert_eq!(text(&out.stdout), "", "no key printed");
}

#[test]
fn key_reads_headers_query_and_files() {
    let cfg = TempFile::new(
        "k.toml",
        "[[routes]]\nname = \"gh\"\npath = \"/gh\"\nupstream = \"http://127.0.0.1:9\"\nkey = [\"header:X-GitHub-Delivery+query:a\"]\n",
    );
    let body = TempFile::new("body.json", "{}");
    let out = run(
        &[
            "key",
            "--config",
            cfg.0.to_str().expect("path"),
            "--route",
            "gh",
            "--header",
            "X-GitHub-Delivery: abc",
            "--query",
            "a=1&b=2",
            body.0.to_str().expect("path"),
        ],
        "",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "dedup:gh:abc+1");
}

#[test]
fn version_prints_the_package_version() {
    let out = run(&["--version"], "");
    assert!(out.status.success());
    assert_eq!(
        text(&out.stdout).trim(),
        format!("dedup-gateway {}", env!("CARGO_PKG_VERSION"))
    );
}

/// The gateway binary serving a config, with its log lines collected.
pub struct GatewayProcess {
    child: Child,
    pub addr: SocketAddr,
    pub admin: Option<SocketAddr>,
    pub logs: Arc<Mutex<Vec<String>>>,
    pub config: TempFile,
}

impl GatewayProcess {
    pub async fn start(toml: &str) -> Self {
        Self::start_with(toml, &[], &[]).await
    }

    /// Starts with extra arguments (e.g. `--log-level debug`) and environment variables.
    pub async fn start_with(toml: &str, args: &[&str], env: &[(&str, &str)]) -> Self {
        Self::launch(Command::new(BIN), toml, args, env).await
    }

    /// Starts with the open-file limits `soft` and `hard` (set by `sh`, which then
    /// `exec`s the gateway: same process).
    pub async fn start_with_file_limits(toml: &str, soft: u64, hard: u64) -> Self {
        let mut command = Command::new("sh");
        let script = format!("ulimit -Sn {soft} && ulimit -Hn {hard} && exec \"$0\" \"$@\"");
        command.args(["-c", &script, BIN]);
        Self::launch(command, toml, &[], &[]).await
    }

    async fn launch(mut command: Command, toml: &str, args: &[&str], env: &[(&str, &str)]) -> Self {
        let config = TempFile::new("gateway.toml", toml);
        let mut child = command
            .args(["--log-format", "json"])
            .args(args)
            .arg("--config")
            .arg(&config.0)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn dedup-gateway");
        let stderr = child.stderr.take().expect("stderr");
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel::<serde_json::Value>();
        let sink = Arc::clone(&logs);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Ok(event) = serde_json::from_str::<serde_json::Value>(&line)
                    && event["message"] == "dedup-gateway serving"
                {
                    let _ = tx.send(event);
                }
                sink.lock().expect("logs").push(line);
            }
        });
        let serving = tokio::task::spawn_blocking(move || rx.recv_timeout(crate::support::PATIENCE))
            .await
            .expect("join")
            .unwrap_or_else(|_| panic!("gateway did not start; logs:\n{}", logs_text(&logs)));
        let parse = |v: &serde_json::Value| v.as_str().and_then(|s| s.parse().ok());
        GatewayProcess {
            child,
            addr: parse(&serving["listen"]).expect("listen address in the log"),
            admin: parse(&serving["admin"]),
            logs,
            config,
        }
    }

    /// A field of the process's `/proc/<pid>/status` in bytes, e.g. `VmRSS` (all
    /// resident memory) or `RssAnon` (without the pages of the binary itself, which a
    /// debug build makes large).
    pub fn memory(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).expect("/proc status");
        let kib: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("no {field} in {status}"));
        kib * 1024
    }

    /// The process's open file descriptors.
    pub fn open_files(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.child.id()))
            .expect("/proc fd")
            .count()
    }

    /// The log lines (JSON) whose message is `message`.
    pub fn logged(&self, message: &str) -> Vec<serde_json::Value> {
        self.logged_where(|m| m == message)
    }

    /// The log lines (JSON) whose message starts with `prefix`.
    pub fn logged_starting(&self, prefix: &str) -> Vec<serde_json::Value> {
        self.logged_where(|m| m.starts_with(prefix))
    }

    fn logged_where(&self, matches: impl Fn(&str) -> bool) -> Vec<serde_json::Value> {
        let logs = self.logs.lock().expect("logs");
        logs.iter()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["message"].as_str().is_some_and(&matches))
            .collect()
    }

    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    }

    /// Waits for the process to exit and returns its status code.
    pub async fn wait(mut self) -> Option<i32> {
        let status = within("the gateway to exit", async {
            loop {
                if let Some(status) = self.child.try_wait().expect("try_wait") {
                    return status;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        status.code()
    }
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The soft open-file limit is often 1,024 where the hard one allows far more; `serve`
/// takes the hard one, as Go's runtime does.
#[tokio::test]
async fn serve_raises_its_open_file_limit_to_the_hard_limit() {
    // A hard limit may only be lowered without privileges: this process's, at most 2048.
    let hard = open_file_limits(std::process::id())
        .1
        .parse::<u64>()
        .map_or(2048, |h| h.min(2048));
    let upstream = Upstream::ok().await;
    let gw = GatewayProcess::start_with_file_limits(&Cfg::new().toml(&upstream.url()), 64, hard).await;
    assert_eq!(open_file_limits(gw.child.id()), (hard.to_string(), hard.to_string()));
    let raised = gw.logged("open-file limit raised to the hard limit");
    assert_eq!(raised.len(), 1, "{}", logs_text(&gw.logs));
    assert_eq!(
        (raised[0]["from"].as_u64(), raised[0]["to"].as_u64()),
        (Some(64), Some(hard))
    );
}

/// A process's open-file limits (soft, hard) as /proc shows them.
fn open_file_limits(pid: u32) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("/proc limits");
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("the line");
    let mut numbers = line.split_whitespace().skip(3);
    let mut next = || numbers.next().expect("a number").to_owned();
    (next(), next())
}

/// Out of descriptors, a listener's accepts fail until connections close: that is
/// logged when it starts and when accepts work again, not on each retry (20 a second).
#[tokio::test]
async fn running_out_of_descriptors_is_logged_once_and_so_is_the_recovery() {
    const LIMIT: u64 = 64;
    let upstream = Upstream::ok().await;
    let toml = Cfg::new().server("workers = 1").toml(&upstream.url());
    let gw = GatewayProcess::start_with_file_limits(&toml, LIMIT, LIMIT).await;
    let spare = LIMIT as usize - gw.open_files();
    // Each connection the gateway accepts takes one of its descriptors; these are more.
    let held: Vec<std::net::TcpStream> = (0..spare + 8)
        .map(|_| std::net::TcpStream::connect(gw.addr).expect("connect"))
        .collect();
    let accept_failed = || gw.logged_starting("accept failed");
    crate::support::eventually("an accept to fail", || !accept_failed().is_empty()).await;
    // Not a wait for something: the episode's length, over which accepts are retried
    // every 50 ms. A line per retry would show below.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let failed = accept_failed();
    assert_eq!(failed.len(), 1, "one line for the episode:\n{}", logs_text(&gw.logs));
    assert_eq!(failed[0]["addr"], gw.addr.to_string());
    let upstream_before = upstream.count();
    // Freed as the gateway reads each EOF: accepting the backlog may run out once
    // more on the way, a second episode, so only the first recovery is looked at.
    drop(held);
    let client = Client::http1(gw.addr);
    assert_eq!(client.post("/hook", &msg("after")).await.dedup(), "forwarded");
    assert_eq!(upstream.count(), upstream_before + 1);
    let again = gw.logged_starting("accepting again");
    assert!(!again.is_empty(), "{}", logs_text(&gw.logs));
    assert_eq!(again[0]["listener"], "proxy");
    assert!(again[0]["failed"].as_u64().is_some_and(|n| n >= 2), "{}", again[0]);
}

/// An upstream that answers 200 and closes mid-body leaves the sender a cut-off answer
/// (its head, or nothing): said at warn, so a flaky bot shows in the logs.
#[tokio::test]
async fn an_answer_cut_off_by_the_upstream_is_logged() {
    use std::io::{Read, Write};
    let (listener, authority) = crate::support::raw_listener();
    std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().expect("accept");
        crate::support::read_raw_request(&mut stream).expect("a request");
        let _ = stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n0123456789");
    });
    let gw = GatewayProcess::start(&Cfg::new().toml(&format!("http://{authority}"))).await;
    let body = msg("cut");
    let mut sender = std::net::TcpStream::connect(gw.addr).expect("connect");
    let request = format!(
        "POST /hook HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    sender.write_all(request.as_bytes()).expect("send");
    let mut answer = Vec::new();
    let _ = sender.read_to_end(&mut answer); // closed by the gateway, cut off
    assert!(
        answer.len() < 1000,
        "a whole answer: {}",
        String::from_utf8_lossy(&answer)
    );
    let cut = "the answer broke off mid-body (the upstream's?): connection closed";
    crate::support::eventually("the warning", || !gw.logged(cut).is_empty()).await;
    let line = &gw.logged(cut)[0];
    assert_eq!(line["level"], "WARN");
    assert!(line["error"].as_str().is_some_and(|e| !e.is_empty()), "{line}");
}

fn logs_text(logs: &Mutex<Vec<String>>) -> String {
    logs.lock().expect("logs").join("\n")
}

#[tokio::test]
async fn the_shipped_example_config_dedupes_end_to_end() {
    // gateway.toml as shipped, moved onto free ports and in front of a recording bot.
    let upstream = Upstream::ok().await;
    let shipped = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/gateway.toml")).expect("gateway.toml");
    let toml = shipped
        .replace("0.0.0.0:8080", "127.0.0.1:0")
        .replace("127.0.0.1:9090", "127.0.0.1:0")
        .replace("http://127.0.0.1:5000", &upstream.url());
    let gw = GatewayProcess::start(&toml).await;
    let client = Client::http1(gw.addr);
    let first = client.post("/api/v1/webhook", r#"{"msgId":"m1"}"#).await;
    assert_eq!((first.status.as_u16(), first.dedup()), (200, "forwarded"));
    let second = client.post("/api/v1/webhook", r#"{"msgId":"m1"}"#).await;
    assert_eq!(
        (second.status.as_u16(), second.dedup(), second.body.as_str()),
        (200, "duplicate", "success")
    );
    assert_eq!(upstream.count(), 1);
    gw.signal("TERM");
    assert_eq!(gw.wait().await, Some(0));
}

#[tokio::test]
async fn sigterm_lets_twenty_slow_requests_finish_and_exits_0() {
    let gate = Gate::new();
    let upstream = Upstream::gated(&gate, "done").await;
    let cfg = Cfg::new().server("shutdown_grace = \"20s\"");
    let gw = GatewayProcess::start(&cfg.toml(&upstream.url())).await;
    let admin = Client::http1(gw.admin.expect("admin listener"));
    assert_eq!(admin.send(http::Method::GET, "/readyz", &[], "").await.status, 200);

    let client = Client::http1(gw.addr);
    let requests: Vec<_> = (0..20)
        .map(|i| {
            let c = client.clone();
            tokio::spawn(async move { c.post("/hook", &msg(&format!("slow-{i}"))).await })
        })
        .collect();
    upstream.wait_for(20).await;
    gw.signal("TERM");
    // Not ready at once, while the 20 are still in flight.
    let ready = eventually_status(&admin, "/readyz", 503).await;
    assert_eq!(ready, 503);
    // The listener closes (shutdown_delay is 0): new connections are refused.
    within("the listener to close", async {
        while tokio::net::TcpStream::connect(gw.addr).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(requests.iter().all(|r| !r.is_finished()));
    gate.open(20);
    for r in requests {
        let r = within("a drained request", r).await.expect("task");
        assert_eq!((r.status.as_u16(), r.dedup()), (200, "forwarded"), "{r:?}");
    }
    let logs = Arc::clone(&gw.logs);
    assert_eq!(gw.wait().await, Some(0));
    assert!(logs_text(&logs).contains("drained"), "{}", logs_text(&logs));
}

/// Polls an admin endpoint until it answers `status`.
async fn eventually_status(admin: &Client, path: &str, status: u16) -> u16 {
    let mut last = 0;
    within(&format!("{path} to answer {status}"), async {
        loop {
            last = admin.send(http::Method::GET, path, &[], "").await.status.as_u16();
            if last == status {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    last
}
