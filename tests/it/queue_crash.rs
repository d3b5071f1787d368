//! Queued delivery when things break: a replica killed mid-delivery (Redis), a gateway
//! killed and restarted on its SQLite file, a full disk, a shutdown with deliveries
//! running. The kills are of the gateway binary (SIGKILL: no drain, no last write).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Method, StatusCode};
use tokio::net::TcpListener;
use tokio::time::Instant;

use crate::process::GatewayProcess;
use crate::queued::{deliveries, drained, every_one_delivered, queued, sqlite_store};
use crate::servers::{RedisServer, free_port};
use crate::support::{Cfg, Client, Reply, TempFile, TestGateway, Upstream, msg, within};

/// When each delivery of each id started and ended at the bot.
type Visits = Arc<Mutex<HashMap<String, Vec<(Instant, Option<Instant>)>>>>;

/// A bot that takes `took` per message and records when each delivery came and went.
async fn slow_bot(took: Duration) -> (Upstream, Visits) {
    let visits: Visits = Arc::default();
    let log = Arc::clone(&visits);
    let bot = Upstream::with(move |r| {
        let log = Arc::clone(&log);
        async move {
            let id = r.msg_id().unwrap_or_default();
            let index = {
                let mut all = log.lock().expect("visits");
                let mine = all.entry(id.clone()).or_default();
                mine.push((Instant::now(), None));
                mine.len() - 1
            };
            // The work goes on if the gateway hangs up (its process killed): a bot that
            // was sent a message handles it.
            let work = tokio::spawn(async move {
                tokio::time::sleep(took).await;
                log.lock().expect("visits").get_mut(&id).expect("id")[index].1 = Some(Instant::now());
            });
            let _ = work.await;
            Reply::new(200, "ok")
        }
    })
    .await;
    (bot, visits)
}

async fn post_all(addr: std::net::SocketAddr, path: &str, ids: impl Iterator<Item = String>, expect: &str) {
    let client = Client::http1(addr);
    for id in ids {
        let resp = client.post(path, &msg(&id)).await;
        assert_eq!(
            (resp.status, resp.dedup()),
            (StatusCode::OK, expect),
            "{id}: {}",
            resp.body
        );
    }
}

/// Two replicas on one Redis deliver to a bot that takes 2 s; one is killed while it
/// has messages at the bot. The other delivers everything: each id at least once,
/// twice only if the dead replica had it at the bot when it died, never two at once.
#[tokio::test]
async fn a_replica_killed_mid_delivery_leaves_its_messages_to_the_other() {
    let redis = RedisServer::start().await;
    let (bot, visits) = slow_bot(Duration::from_secs(2)).await;
    let cfg = Cfg::new()
        .store(&format!("backend = \"redis\"\nurl = \"{}\"", redis.url()))
        .route(&queued("[\"1s\", \"1s\", \"1s\", \"1s\", \"1s\"]"))
        .route("upstream_timeout = \"3s\"\nprocessing_ttl = \"10s\"\ndelivery_concurrency = 4");
    let toml = cfg.toml(&bot.url());
    let doomed = GatewayProcess::start(&toml).await;
    let survivor = GatewayProcess::start(&toml).await;
    post_all(doomed.addr, "/hook", (0..8).map(|i| format!("a{i}")), "queued").await;
    post_all(survivor.addr, "/hook", (0..8).map(|i| format!("b{i}")), "queued").await;
    // Both replicas have deliveries at the bot.
    bot.wait_for(8).await;
    drop(doomed); // SIGKILL
    let killed = Instant::now();

    // Settled: the route's messages hash (every message held) is empty.
    within(
        "every message delivered (the dead replica's after upstream_timeout + 5 s)",
        async {
            while redis.cli(&["HLEN", "dedup:{bot}:m"]).trim() != "0" {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        },
    )
    .await;
    assert_eq!(visits.lock().expect("visits").len(), 16);
    let all = visits.lock().expect("visits").clone();
    let mut twice = 0;
    for (id, mut visits) in all {
        visits.sort_by_key(|(start, _)| *start);
        for pair in visits.windows(2) {
            let (earlier_end, later_start) = (pair[0].1.expect("ended"), pair[1].0);
            assert!(later_start >= earlier_end, "{id}: two deliveries at once");
        }
        if visits.len() > 1 {
            twice += 1;
            assert_eq!(visits.len(), 2, "{id}: delivered {} times", visits.len());
            let (start, end) = visits[0];
            assert!(
                start < killed && end.is_some_and(|end| end > killed),
                "{id} delivered again, but its first delivery was not at the bot when the replica died"
            );
        }
    }
    eprintln!("replica killed: 16 messages delivered, {twice} of them twice (at the bot when it died)");
    assert!(twice <= 4, "at most the dead replica's delivery_concurrency: {twice}");
    drop(survivor);
}

/// 1,000 messages queued while the bot is down, then `kill -9` and a restart on the
/// same file: all delivered once; the senders' retries after the restart are
/// acknowledged as duplicates, not queued again. COMPLETED markers of a sync route
/// survive too.
#[tokio::test]
async fn sqlite_survives_kill_9_with_every_acknowledged_message() {
    let dir = TempFile::new("q.marker", "");
    let port = free_port();
    let sync_bot = Upstream::ok().await;
    let cfg = Cfg::new()
        .store(&sqlite_store(&dir))
        .route(&queued(
            "[\"500ms\", \"1s\", \"2s\", \"2s\", \"2s\", \"2s\", \"2s\", \"2s\", \"2s\", \"2s\"]",
        ))
        .extra(&format!(
            "[[routes]]\nname = \"sync\"\npath = \"/sync\"\nupstream = \"{}\"\nkey = [\"json:/msgId\"]\n",
            sync_bot.url()
        ));
    let toml = cfg.toml(&format!("http://127.0.0.1:{port}"));
    let first = GatewayProcess::start(&toml).await;
    post_all(first.addr, "/hook", (0..1000).map(|i| format!("m{i}")), "queued").await;
    post_all(first.addr, "/sync", (0..50).map(|i| format!("s{i}")), "forwarded").await;
    drop(first); // SIGKILL

    let second = GatewayProcess::start(&toml).await;
    post_all(second.addr, "/hook", (0..1000).map(|i| format!("m{i}")), "duplicate").await;
    post_all(second.addr, "/sync", (0..50).map(|i| format!("s{i}")), "duplicate").await;
    assert_eq!(sync_bot.count(), 50);
    let listener = TcpListener::bind(("127.0.0.1", port)).await.expect("the bot's port");
    let bot = Upstream::on(listener, |_| async { Reply::new(200, "ok") });
    within("every message delivered after the restart", async {
        while deliveries(&bot).len() < 1000 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let seen = deliveries(&bot);
    assert!(seen.values().all(|n| *n == 1), "delivered more than once");
    let db = dir.0.with_file_name("gateway.db");
    let out = std::process::Command::new("sqlite3")
        .arg(&db)
        .arg("SELECT state, count(*) FROM markers GROUP BY state")
        .output()
        .expect("sqlite3 (Debian: sqlite3)");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "completed|1050",
        "the stock sqlite3 shell reads the markers"
    );
    drop(second);
}

/// A tmpfs mounted for a test, unmounted when dropped.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(size: &str) -> Self {
        let dir = TempFile::new("tmpfs.marker", "").0.with_file_name("mnt");
        std::fs::create_dir_all(&dir).expect("mount point");
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&dir)
            .output()
            .expect("mount");
        assert!(
            out.status.success(),
            "this test fills a small tmpfs to fill the disk under SQLite, and needs to mount one (root, or \
             CAP_SYS_ADMIN): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs(dir)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// The disk full under the SQLite file: appends fail with 503 (never an ack for what
/// was not stored), `/readyz` says not ready; with room again, all is well, and every
/// acknowledged message is delivered.
#[tokio::test]
async fn a_full_disk_answers_503_and_acknowledges_only_what_was_stored() {
    let tmpfs = Tmpfs::mount("2m");
    let port = free_port();
    let store = format!(
        "backend = \"sqlite\"\npath = \"{}\"",
        tmpfs.0.join("gateway.db").display()
    );
    let cfg = Cfg::new()
        .store(&store)
        .route(&queued("[\"200ms\", \"1s\", \"1s\", \"1s\", \"1s\", \"1s\", \"1s\"]"));
    let gw = TestGateway::start_toml(&cfg.toml(&format!("http://127.0.0.1:{port}"))).await;
    let client = gw.client();
    let admin = Client::http1(gw.admin.expect("admin"));
    let mut acked: Vec<String> = (0..20).map(|i| format!("before{i}")).collect();
    for id in &acked {
        assert_eq!(client.post("/hook", &msg(id)).await.dedup(), "queued");
    }
    let filler = tmpfs.0.join("filler");
    let fill = std::process::Command::new("dd")
        .args(["if=/dev/zero", "bs=4k"])
        .arg(format!("of={}", filler.display()))
        .output()
        .expect("dd");
    assert!(!fill.status.success(), "dd stops at a full disk");
    let mut refused = 0;
    for i in 0..400 {
        let id = format!("m{i}");
        let resp = client.post("/hook", &msg(&id)).await;
        match (resp.status, resp.dedup()) {
            (StatusCode::OK, "queued") => acked.push(id),
            (StatusCode::SERVICE_UNAVAILABLE, "store-unavailable") => {
                refused += 1;
                let ready = admin.send(Method::GET, "/readyz", &[], "").await;
                assert_eq!(
                    ready.status,
                    StatusCode::SERVICE_UNAVAILABLE,
                    "not ready while appends fail"
                );
            }
            other => panic!("{id}: {other:?}"),
        }
    }
    eprintln!("full disk: {} acknowledged, {refused} refused", acked.len() - 20);
    assert!(refused > 0, "a full disk refused nothing");

    std::fs::remove_file(&filler).expect("free the disk");
    let resp = client.post("/hook", &msg("after")).await;
    assert_eq!(resp.dedup(), "queued", "{}", resp.body);
    acked.push("after".into());
    within("ready again", async {
        while admin.send(Method::GET, "/readyz", &[], "").await.status != StatusCode::OK {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    let listener = TcpListener::bind(("127.0.0.1", port)).await.expect("the bot's port");
    let bot = Upstream::on(listener, |_| async { Reply::new(200, "ok") });
    every_one_delivered(&bot, &acked).await;
    gw.stop().await;
}

/// On shutdown a running delivery gets `shutdown_grace`: one that ends within it is
/// recorded; one that does not stays queued, and the next start delivers it (its
/// `X-Dedup-Attempt` counting the attempt cut short).
#[tokio::test]
async fn shutdown_lets_deliveries_finish_within_the_grace_and_keeps_the_rest() {
    let dir = TempFile::new("q.marker", "");
    let store = sqlite_store(&dir);
    for (grace, took, delivered_before) in [("3s", 300, true), ("200ms", 5_000, false)] {
        let (bot, _) = slow_bot(Duration::from_millis(took)).await;
        let cfg = Cfg::new()
            .store(&store)
            .server(&format!("shutdown_grace = \"{grace}\""))
            .route(&queued("[\"1s\"]"));
        let gw = TestGateway::start(&cfg, &bot).await;
        let id = format!("g{grace}");
        assert_eq!(gw.client().post("/hook", &msg(&id)).await.dedup(), "queued");
        bot.wait_for(1).await;
        gw.stop().await;

        let fast = Upstream::ok().await;
        let gw = TestGateway::start(&cfg, &fast).await;
        drained(&gw).await;
        if delivered_before {
            assert_eq!(
                fast.count(),
                0,
                "finished within the grace: recorded, not delivered again"
            );
        } else {
            let again = fast.received();
            assert_eq!(again.len(), 1, "cut short: still queued");
            assert_eq!(again[0].headers["x-dedup-attempt"], "2");
        }
        gw.stop().await;
    }
}
