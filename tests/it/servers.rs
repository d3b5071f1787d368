//! Real Redis for the store tests: a `redis-server` per test on a free port, a 3-node
//! Redis Cluster, and a TCP proxy that can swallow a reply. A missing `redis-server`
//! fails the test with the install command; it never skips.

use std::net::{SocketAddr, TcpListener as StdListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::TempFile;
use crate::support::within;

fn require(binary: &str) {
    let found = Command::new(binary)
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok();
    assert!(
        found,
        "{binary} not found: the store tests need a real Redis. Install it with \
         `sudo apt-get install -y redis-server redis-tools` (or run .ci/test, which does)"
    );
}

/// A free TCP port on loopback whose cluster bus port (+10000) is free too.
pub fn free_port() -> u16 {
    loop {
        let l = StdListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        if port < 55000 && StdListener::bind(("127.0.0.1", port + 10000)).is_ok() {
            return port;
        }
    }
}

/// A `valkey-server` >= 8.1 (the first Valkey with `SET ... IFEQ`): `$VALKEY_SERVER`,
/// else what `.ci/server valkey` finds or builds.
pub fn valkey_server() -> PathBuf {
    static FOUND: OnceLock<PathBuf> = OnceLock::new();
    FOUND
        .get_or_init(|| server_with_ifeq("valkey", "VALKEY_SERVER"))
        .clone()
}

/// A `redis-server` >= 8.4 (the first Redis with `SET ... IFEQ`): `$REDIS8_SERVER`, else
/// what `.ci/server redis` finds or builds.
pub fn redis8_server() -> PathBuf {
    static FOUND: OnceLock<PathBuf> = OnceLock::new();
    FOUND.get_or_init(|| server_with_ifeq("redis", "REDIS8_SERVER")).clone()
}

/// `$env`, else `.ci/server <name>` (once per test run; about a minute the first time,
/// then cached in target/<name>/). Fails, never skips, when neither gives one.
fn server_with_ifeq(name: &str, env: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(env) {
        return PathBuf::from(path);
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/.ci/server");
    let out = Command::new(script)
        .arg(name)
        .stderr(Stdio::inherit())
        .output()
        .expect("run .ci/server");
    assert!(
        out.status.success(),
        "no {name} server with SET IFEQ for these tests, and `.ci/server {name}` could not build one \
         (it needs Debian's archive, curl, make and a C compiler); set {env} to one"
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// One `redis-server` (or `valkey-server`) process with its own directory.
pub struct RedisServer {
    child: Option<Child>,
    pub port: u16,
    dir: TempFile,
    args: Vec<String>,
    binary: PathBuf,
}

impl RedisServer {
    pub async fn start() -> Self {
        Self::start_with(&[]).await
    }

    /// Starts with extra `redis-server` arguments, e.g. `["--appendonly", "yes"]`.
    pub async fn start_with(args: &[&str]) -> Self {
        require("redis-server");
        Self::start_binary("redis-server".into(), args).await
    }

    /// Starts a [`valkey_server`].
    pub async fn start_valkey() -> Self {
        Self::start_binary(valkey_server(), &[]).await
    }

    /// Starts a [`redis8_server`].
    pub async fn start_redis8() -> Self {
        Self::start_binary(redis8_server(), &[]).await
    }

    async fn start_binary(binary: PathBuf, args: &[&str]) -> Self {
        require("redis-cli");
        let dir = TempFile::new("redis.marker", "");
        let mut server = RedisServer {
            child: None,
            port: 0,
            dir,
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            binary,
        };
        for _ in 0..5 {
            server.port = free_port();
            if server.spawn().await {
                return server;
            }
        }
        panic!("{} did not start", server.binary.display());
    }

    fn dir(&self) -> PathBuf {
        self.dir.0.parent().expect("dir").to_path_buf()
    }

    async fn spawn(&mut self) -> bool {
        let child = Command::new(&self.binary)
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1", "--save", ""])
            .args(["--protected-mode", "no", "--daemonize", "no", "--loglevel", "warning"])
            .arg("--dir")
            .arg(self.dir())
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn the server");
        self.child = Some(child);
        let pid = self.child.as_ref().map(Child::id).unwrap_or_default();
        for _ in 0..500 {
            if let Some(child) = self.child.as_mut()
                && child.try_wait().expect("try_wait").is_some()
            {
                return false; // the port was taken after all
            }
            // Answering is not enough: it must be our server, not another test's that
            // took the port first.
            let info = self.cli(&["INFO", "server"]);
            if info.lines().any(|l| l.trim() == format!("process_id:{pid}")) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// This node's id in its cluster.
    pub fn node_id(&self) -> String {
        self.cli(&["CLUSTER", "MYID"]).trim().to_owned()
    }

    /// Runs `redis-cli` against this server and returns its output.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// SIGKILL: the crash case (no shutdown, no final save).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts `binary` in its place, on the same port and directory: an upgrade or a
    /// downgrade, as the client sees it.
    pub async fn restart_as(&mut self, binary: PathBuf) {
        self.binary = binary;
        self.restart().await;
    }

    /// Starts again on the same port and directory (an AOF, if enabled, is reloaded).
    pub async fn restart(&mut self) {
        self.kill();
        for _ in 0..50 {
            if self.spawn().await {
                return;
            }
        }
        panic!("redis-server did not restart on port {}", self.port);
    }

    /// `INFO commandstats` as command -> calls.
    pub fn command_calls(&self) -> std::collections::BTreeMap<String, u64> {
        self.cli(&["INFO", "commandstats"])
            .lines()
            .filter_map(|l| {
                let rest = l.strip_prefix("cmdstat_")?;
                let (cmd, stats) = rest.split_once(':')?;
                let calls = stats.strip_prefix("calls=")?.split(',').next()?.parse().ok()?;
                Some((cmd.to_owned(), calls))
            })
            .collect()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A 3-node Redis Cluster (three primaries, no replicas).
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub async fn start() -> Self {
        require("redis-server");
        Self::start_on("redis-server".into()).await
    }

    /// Three [`valkey_server`] nodes.
    pub async fn start_valkey() -> Self {
        Self::start_on(valkey_server()).await
    }

    async fn start_on(binary: PathBuf) -> Self {
        let mut nodes = Vec::new();
        for _ in 0..3 {
            let args = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"];
            nodes.push(RedisServer::start_binary(binary.clone(), &args).await);
        }
        let addrs: Vec<String> = nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("redis-cli --cluster create");
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = RedisCluster { nodes };
        cluster.await_ok().await;
        cluster
    }

    /// Waits until every node says the cluster is ok.
    pub async fn await_ok(&self) {
        within("the cluster to agree on its slots", async {
            while !self
                .nodes
                .iter()
                .all(|n| n.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok"))
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
    }

    /// The node serving `slot`, by each node's own view (`CLUSTER NODES`, "myself");
    /// none while that node is down.
    pub fn owner_of(&self, slot: u16) -> Option<&RedisServer> {
        self.nodes.iter().find(|node| {
            // A node that is down says nothing, and serves nothing.
            let nodes = node.cli(&["CLUSTER", "NODES"]);
            let Some(me) = nodes.lines().find(|l| l.contains("myself")) else {
                return false;
            };
            me.split(' ').skip(8).any(|range| {
                let (from, to) = range.split_once('-').unwrap_or((range, range));
                matches!((from.parse::<u16>(), to.parse::<u16>()), (Ok(a), Ok(b)) if (a..=b).contains(&slot))
            })
        })
    }

    /// `cluster = [...]` for gateway.toml.
    pub fn seeds_toml(&self) -> String {
        let urls: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("\"redis://127.0.0.1:{}\"", n.port))
            .collect();
        format!("cluster = [{}]", urls.join(", "))
    }
}

/// A TCP proxy in front of Redis that can swallow the reply to the next claim
/// (`SET ... NX`), as a broken network would: the request lands, the answer is lost;
/// or hold every reply back until told (a slow network: the command lands, its answer
/// is late).
pub struct SwallowingProxy {
    pub addr: SocketAddr,
    armed: Arc<AtomicUsize>,
    pub swallowed: Arc<AtomicUsize>,
    held: Arc<tokio::sync::watch::Sender<bool>>,
    /// Where new connections go; connections already open stay where they went (as
    /// behind a DNS name or a managed endpoint after a failover).
    target: Arc<std::sync::Mutex<SocketAddr>>,
}

impl SwallowingProxy {
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("addr");
        let armed = Arc::new(AtomicUsize::new(0));
        let swallowed = Arc::new(AtomicUsize::new(0));
        let held = Arc::new(tokio::sync::watch::Sender::new(false));
        let target = Arc::new(std::sync::Mutex::new(upstream));
        let (a, s, h, t) = (
            Arc::clone(&armed),
            Arc::clone(&swallowed),
            Arc::clone(&held),
            Arc::clone(&target),
        );
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let upstream = *t.lock().expect("target");
                let Ok(server) = TcpStream::connect(upstream).await else {
                    continue;
                };
                tokio::spawn(pipe(client, server, Arc::clone(&a), Arc::clone(&s), h.subscribe()));
            }
        });
        SwallowingProxy {
            addr,
            armed,
            swallowed,
            held,
            target,
        }
    }

    /// New connections go to `upstream` from now on; open ones stay where they are.
    pub fn retarget(&self, upstream: SocketAddr) {
        *self.target.lock().expect("target") = upstream;
    }

    /// Holds every reply back (commands still reach Redis) until [`Self::release`].
    pub fn hold(&self) {
        self.held.send_replace(true);
    }

    pub fn release(&self) {
        self.held.send_replace(false);
    }

    pub fn url(&self) -> String {
        format!("redis://{}/0", self.addr)
    }

    /// The replies to the next `claims` claims will be dropped.
    pub fn arm(&self, claims: usize) {
        self.armed.store(claims, Ordering::SeqCst);
    }
}

async fn pipe(
    client: TcpStream,
    server: TcpStream,
    armed: Arc<AtomicUsize>,
    swallowed: Arc<AtomicUsize>,
    mut held: tokio::sync::watch::Receiver<bool>,
) {
    let (mut client_r, mut client_w) = client.into_split();
    let (mut server_r, mut server_w) = server.into_split();
    let drop_next = Arc::new(AtomicBool::new(false));
    let d = Arc::clone(&drop_next);
    let upward = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match client_r.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let chunk = &buf[..n];
            let is_claim = chunk.windows(3).any(|w| w == b"SET") && chunk.windows(2).any(|w| w == b"NX");
            let take = |n: usize| n.checked_sub(1);
            if is_claim && armed.fetch_update(Ordering::SeqCst, Ordering::SeqCst, take).is_ok() {
                d.store(true, Ordering::SeqCst);
            }
            if server_w.write_all(chunk).await.is_err() {
                return;
            }
        }
    };
    let downward = async move {
        let mut buf = vec![0u8; 16 * 1024];
        let mut silent = false;
        loop {
            let n = match server_r.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if drop_next.swap(false, Ordering::SeqCst) {
                swallowed.fetch_add(1, Ordering::SeqCst);
                // From here on this connection is silent, as when the network goes away
                // after the command landed: a stream that lost one reply and carried on
                // with the next is not something TCP does (and replies on a multiplexed
                // connection are matched by order).
                silent = true;
            }
            if silent {
                continue;
            }
            if held.wait_for(|held| !*held).await.is_err() {
                return;
            }
            if client_w.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    tokio::join!(upward, downward);
}

/// `n` message ids (`<prefix>-<i>`) whose keys on the route `bot` (prefix `dedup:`)
/// share one cluster slot, and that slot.
pub fn ids_in_one_slot(prefix: &str, n: usize) -> (u16, Vec<String>) {
    let key = |id: &str| dedup_gateway::store::redis::key_slot(&format!("dedup:bot:{id}"));
    let slot = key(&format!("{prefix}-0"));
    let ids = (0..)
        .map(|i| format!("{prefix}-{i}"))
        .filter(|id| key(id) == slot)
        .take(n);
    (slot, ids.collect())
}
