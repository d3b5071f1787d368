//! Queued routes (`delivery = "queued"`) behind real gateways, on a real SQLite file
//! or a real Redis: the sender is acknowledged once the message is stored, and the bot
//! gets it exactly once, whenever it can take it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use http::{Method, StatusCode};
use tokio::net::TcpListener;
use tokio::time::Instant;

use crate::servers::{RedisServer, free_port};
use crate::signing as s;
use crate::support::{Cfg, Client, Gate, Reply, TempFile, TestGateway, Upstream, eventually, msg, text, within};

/// A SQLite store in a fresh folder.
pub fn sqlite_store(dir: &TempFile) -> String {
    let path = dir.0.with_file_name("gateway.db");
    format!("backend = \"sqlite\"\npath = \"{}\"", path.display())
}

/// A queued route's settings, with `schedule` as its retry schedule.
pub fn queued(schedule: &str) -> String {
    format!("delivery = \"queued\"\nretry_schedule = {schedule}")
}

/// How many times each message id reached the bot.
pub fn deliveries(bot: &Upstream) -> HashMap<String, usize> {
    let mut seen = HashMap::new();
    for r in bot.received() {
        *seen.entry(r.msg_id().unwrap_or_default()).or_insert(0) += 1;
    }
    seen
}

/// Waits until each of `ids` has reached the bot.
pub async fn every_one_delivered(bot: &Upstream, ids: &[String]) {
    let missing = || {
        let seen = deliveries(bot);
        ids.iter()
            .filter(|id| !seen.contains_key(*id))
            .cloned()
            .collect::<Vec<_>>()
    };
    let _report = ReportOnPanic(&missing);
    within("every acknowledged message delivered", async {
        loop {
            let seen = deliveries(bot);
            if ids.iter().all(|id| seen.contains_key(id)) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
}

struct ReportOnPanic<'a, F: Fn() -> Vec<String>>(&'a F);

impl<F: Fn() -> Vec<String>> Drop for ReportOnPanic<'_, F> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("not delivered: {:?}", (self.0)());
        }
    }
}

/// GET `path` on the admin listener, as JSON.
pub async fn admin_json(gw: &TestGateway, path: &str) -> serde_json::Value {
    let admin = Client::http1(gw.admin.expect("admin listener"));
    let resp = admin.send(Method::GET, path, &[], "").await;
    assert_eq!(resp.status, StatusCode::OK, "{path}: {}", resp.body);
    serde_json::from_str(&resp.body).expect("json")
}

/// The route `bot`'s line of `GET /queue`.
pub async fn queue_of(gw: &TestGateway) -> serde_json::Value {
    let all = admin_json(gw, "/queue").await;
    all["routes"]
        .as_array()
        .and_then(|routes| routes.iter().find(|r| r["route"] == "bot").cloned())
        .unwrap_or_else(|| panic!("no queued route bot in {all}"))
}

/// Waits until route `bot`'s queue holds nothing (every delivery recorded).
pub async fn drained(gw: &TestGateway) {
    within("the queue to drain", async {
        loop {
            let q = queue_of(gw).await;
            let held: u64 = ["ready", "scheduled", "delivering", "dead"]
                .iter()
                .map(|s| q[s].as_u64().expect("count"))
                .sum();
            if held == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
}

#[tokio::test]
async fn the_sender_is_acknowledged_at_once_and_the_bot_gets_the_message_once() {
    let dir = TempFile::new("q.marker", "");
    let gate = Gate::new();
    let bot = Upstream::gated(&gate, "bot reply").await;
    let cfg = Cfg::new().store(&sqlite_store(&dir)).route(&queued("[\"1s\"]"));
    let gw = TestGateway::start(&cfg, &bot).await;
    let client = gw.client();

    let first = client
        .send(Method::POST, "/hook?a=1", &[("x-trace", "t1")], &msg("m1"))
        .await;
    assert_eq!(
        (first.status, first.dedup(), first.body.as_str()),
        (StatusCode::OK, "queued", "success")
    );
    let again = client.post("/hook?a=1", &msg("m1")).await;
    assert_eq!(
        (again.status, again.dedup()),
        (StatusCode::OK, "duplicate"),
        "stored: acknowledged"
    );

    bot.wait_for(1).await;
    gate.open(1);
    drained(&gw).await;
    let got = bot.received();
    assert_eq!(got.len(), 1, "one delivery");
    let d = &got[0];
    assert_eq!((d.method.as_str(), d.uri.as_str()), ("POST", "/hook?a=1"));
    assert_eq!(d.body, msg("m1"), "the body byte for byte");
    assert_eq!(d.headers["x-trace"], "t1", "the sender's headers");
    assert_eq!(d.headers["x-dedup-attempt"], "1");
    let queued_at = d.headers["x-dedup-queued-at"].to_str().expect("ascii");
    assert!(humantime::parse_rfc3339(queued_at).is_ok(), "RFC 3339: {queued_at}");
    assert!(d.headers.contains_key("x-forwarded-for"));
    let later = client.post("/hook", &msg("m1")).await;
    assert_eq!(later.dedup(), "duplicate", "delivered: COMPLETED");
    assert_eq!(
        gw.metric("dedup_deliveries_total{route=\"bot\",result=\"delivered\"}"),
        1.0
    );
    assert_eq!(gw.metric("dedup_requests_total{route=\"bot\",outcome=\"queued\"}"), 1.0);
    gw.stop().await;
}

/// Sends `n` messages (ids `<prefix>0`, ...) spread over `gateways`, `lanes` at a time;
/// every one must be acknowledged `queued`. Returns each acknowledgement's latency.
async fn send_all(gateways: &[&TestGateway], prefix: &str, n: usize, lanes: usize) -> Vec<Duration> {
    let clients: Vec<Arc<Client>> = gateways.iter().map(|g| Arc::new(g.client())).collect();
    let mut tasks = Vec::new();
    for lane in 0..lanes {
        let clients = clients.clone();
        let prefix = prefix.to_owned();
        tasks.push(tokio::spawn(async move {
            let mut took = Vec::new();
            for i in (lane..n).step_by(lanes) {
                let client = &clients[i % clients.len()];
                let started = Instant::now();
                let resp = client.post("/hook", &msg(&format!("{prefix}{i}"))).await;
                took.push(started.elapsed());
                assert_eq!(
                    (resp.status, resp.dedup()),
                    (StatusCode::OK, "queued"),
                    "{prefix}{i}: {}",
                    resp.body
                );
            }
            took
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.expect("sender"));
    }
    all
}

fn p99(mut took: Vec<Duration>) -> Duration {
    took.sort();
    took[(took.len() * 99).div_ceil(100) - 1]
}

/// Retries every second, then every few: the bot comes back within the test's minute.
const DOWN_SCHEDULE: &str =
    "[\"1s\", \"2s\", \"4s\", \"8s\", \"8s\", \"8s\", \"8s\", \"8s\", \"8s\", \"8s\", \"8s\", \"8s\"]";

/// The bot refuses connections for 60 s while 1,000 messages arrive; every one is
/// acknowledged at once, and once the bot is back, delivered exactly once.
async fn bot_down_for_a_minute(store: &str, replicas: usize) {
    let port = free_port();
    let cfg = Cfg::new().store(store).route(&queued(DOWN_SCHEDULE));
    let toml = cfg.toml(&format!("http://127.0.0.1:{port}"));
    let mut gateways = Vec::new();
    for _ in 0..replicas {
        gateways.push(TestGateway::start_toml(&toml).await);
    }
    let down = Instant::now();
    let refs: Vec<&TestGateway> = gateways.iter().collect();
    let took = send_all(&refs, "m", 1000, 16).await;
    let p99 = p99(took);
    eprintln!("bot down, {replicas} replica(s): 1000 acknowledged, ack p99 {p99:?}");
    assert!(p99 < Duration::from_millis(50), "ack p99 {p99:?}");
    let q = queue_of(&gateways[0]).await;
    assert_eq!(q["dead"], 0, "{q}");

    tokio::time::sleep_until(down + Duration::from_secs(60)).await;
    let listener = TcpListener::bind(("127.0.0.1", port)).await.expect("the bot's port");
    let bot = Upstream::on(listener, |_| async { Reply::new(200, "ok") });
    within("every message delivered", async {
        while deliveries(&bot).len() < 1000 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    for gw in &gateways {
        drained(gw).await;
    }
    let seen = deliveries(&bot);
    assert_eq!(seen.len(), 1000);
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "delivered more than once: {twice:?}");
    let dead: f64 = gateways
        .iter()
        .map(|g| g.metric("dedup_deliveries_total{route=\"bot\",result=\"dead\"}"))
        .sum();
    assert_eq!(dead, 0.0);
    for gw in gateways {
        gw.stop().await;
    }
}

#[tokio::test]
async fn bot_down_for_a_minute_on_sqlite() {
    let dir = TempFile::new("q.marker", "");
    bot_down_for_a_minute(&sqlite_store(&dir), 1).await;
}

#[tokio::test]
async fn bot_down_for_a_minute_on_redis_with_two_replicas() {
    let redis = RedisServer::start().await;
    bot_down_for_a_minute(&format!("backend = \"redis\"\nurl = \"{}\"", redis.url()), 2).await;
}

/// Runs `dedup-gateway queue ...` against a running gateway's admin listener (off the
/// runtime, which serves that listener).
async fn queue_cli(gw: &TestGateway, config: &TempFile, args: &[&str]) -> (bool, serde_json::Value) {
    let admin = format!("http://{}", gw.admin.expect("admin"));
    let mut all: Vec<String> = vec!["queue".into()];
    all.extend(args.iter().map(|a| (*a).to_owned()));
    all.extend([
        "--admin".into(),
        admin,
        "--config".into(),
        config.0.display().to_string(),
    ]);
    let out = tokio::task::spawn_blocking(move || {
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        crate::support::run(&all, "")
    })
    .await
    .expect("the CLI");
    let json = serde_json::from_str(&text(&out.stdout))
        .unwrap_or_else(|_| panic!("queue {args:?}: {}{}", text(&out.stdout), text(&out.stderr)));
    (out.status.success(), json)
}

#[tokio::test]
async fn dead_letters_wait_for_an_operator_who_retries_or_drops_them() {
    let dir = TempFile::new("q.marker", "");
    let status = Arc::new(std::sync::atomic::AtomicU16::new(500));
    let answer = Arc::clone(&status);
    let bot = Upstream::with(move |r| {
        let code = if r.msg_id().as_deref() == Some("bad") {
            400
        } else {
            answer.load(std::sync::atomic::Ordering::SeqCst)
        };
        async move { Reply::new(code, "bot") }
    })
    .await;
    let cfg = Cfg::new()
        .store(&sqlite_store(&dir))
        .route(&queued("[\"100ms\", \"200ms\"]"));
    let toml = cfg.toml(&bot.url());
    let config = TempFile::new("gateway.toml", &toml);
    let gw = TestGateway::start_toml(&toml).await;
    let client = gw.client();
    for id in ["m1", "bad"] {
        assert_eq!(client.post("/hook", &msg(id)).await.dedup(), "queued");
    }
    eventually("both dead", || {
        gw.metric("dedup_deliveries_total{route=\"bot\",result=\"dead\"}") == 2.0
    })
    .await;
    let seen = deliveries(&bot);
    assert_eq!(
        (seen["m1"], seen["bad"]),
        (3, 1),
        "500: the schedule's 3 attempts; 400: dead at once"
    );
    let (ok, dead) = queue_cli(&gw, &config, &["dead", "bot"]).await;
    assert!(ok);
    let letters = dead["dead"].as_array().expect("dead letters");
    let of = |id: &str| {
        letters
            .iter()
            .find(|l| l["id"] == id)
            .unwrap_or_else(|| panic!("{id} in {dead}"))
    };
    assert_eq!(of("m1")["attempts"], 3);
    assert!(
        of("m1")["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("status 500")),
        "{dead}"
    );
    assert_eq!(of("bad")["last_error"], "status 400");
    assert_eq!(
        client.post("/hook", &msg("m1")).await.dedup(),
        "duplicate",
        "a dead letter's marker stays"
    );

    status.store(200, std::sync::atomic::Ordering::SeqCst);
    let (ok, retried) = queue_cli(&gw, &config, &["retry", "bot", "--all"]).await;
    assert!(ok && retried["retried"] == 2, "{retried}");
    eventually("both delivered", || {
        gw.metric("dedup_deliveries_total{route=\"bot\",result=\"delivered\"}") == 1.0
            && gw.metric("dedup_deliveries_total{route=\"bot\",result=\"dead\"}") == 3.0
    })
    .await;
    assert_eq!(deliveries(&bot)["m1"], 4, "delivered once after the retry");
    let last = bot
        .received()
        .into_iter()
        .rfind(|r| r.msg_id().as_deref() == Some("m1"));
    assert_eq!(last.expect("m1").headers["x-dedup-attempt"], "1", "attempts reset");

    let (ok, dropped) = queue_cli(&gw, &config, &["drop", "bot", "bad"]).await;
    assert!(ok && dropped["dropped"] == true, "{dropped}");
    let (ok, _) = queue_cli(&gw, &config, &["drop", "bot", "bad"]).await;
    assert!(!ok, "dropped already");
    assert_eq!(
        client.post("/hook", &msg("bad")).await.dedup(),
        "queued",
        "the marker was released: a new delivery is queued"
    );
    gw.stop().await;
}

#[tokio::test]
async fn a_full_queue_answers_503_and_loses_nothing() {
    let dir = TempFile::new("q.marker", "");
    let gate = Gate::new();
    let bot = Upstream::gated(&gate, "ok").await;
    let cfg = Cfg::new()
        .store(&sqlite_store(&dir))
        .route(&queued("[\"100ms\"]"))
        .route("max_queued = 3\ndelivery_concurrency = 1");
    let gw = TestGateway::start(&cfg, &bot).await;
    let client = gw.client();
    let mut refused = Vec::new();
    for i in 0..6 {
        let id = format!("m{i}");
        let resp = client.post("/hook", &msg(&id)).await;
        match resp.dedup() {
            "queued" => {}
            "queue-full" => {
                assert_eq!(resp.status, StatusCode::SERVICE_UNAVAILABLE);
                assert_eq!(resp.headers["retry-after"], "1");
                refused.push(id);
            }
            other => panic!("{id}: {other}"),
        }
    }
    assert_eq!(refused.len(), 3, "3 held, 3 refused");
    gate.open(100);
    drained(&gw).await;
    for id in &refused {
        // The claim was released: the sender's retry is queued.
        assert_eq!(client.post("/hook", &msg(id)).await.dedup(), "queued", "{id}");
    }
    drained(&gw).await;
    let seen = deliveries(&bot);
    assert_eq!(seen.len(), 6);
    assert!(seen.values().all(|n| *n == 1), "{seen:?}");
    assert_eq!(
        gw.metric("dedup_requests_total{route=\"bot\",outcome=\"queue_full\"}"),
        3.0
    );
    gw.stop().await;
}

#[tokio::test]
async fn a_forged_request_on_a_queued_route_is_refused_and_stores_nothing() {
    let dir = TempFile::new("q.marker", "");
    let bot = Upstream::ok().await;
    let cfg = Cfg::new()
        .store(&sqlite_store(&dir))
        .route("preset = \"github\"\nsecret = \"test-signing-secret\"")
        .route(&queued("[\"1s\"]"));
    let gw = TestGateway::start(&cfg, &bot).await;
    let forged = s::github("72d3162e-0000", r#"{"action":"opened"}"#, "x");
    let resp = gw
        .client()
        .send(Method::POST, &forged.target, &forged.header_pairs(), &forged.body)
        .await;
    assert_eq!((resp.status, resp.dedup()), (StatusCode::UNAUTHORIZED, "rejected"));
    let q = queue_of(&gw).await;
    assert_eq!((q["ready"].as_u64(), q["dead"].as_u64()), (Some(0), Some(0)), "{q}");
    let admin = Client::http1(gw.admin.expect("admin"));
    let key = admin.send(Method::GET, "/keys/bot/72d3162e-0000", &[], "").await;
    assert_eq!(key.status, StatusCode::NOT_FOUND, "no marker: {}", key.body);
    let signed = s::github("72d3162e-0001", r#"{"action":"opened"}"#, s::SECRET);
    let resp = gw
        .client()
        .send(Method::POST, &signed.target, &signed.header_pairs(), &signed.body)
        .await;
    assert_eq!(resp.dedup(), "queued", "the control: a signed one is queued");
    bot.wait_for(1).await;
    assert_eq!(bot.count(), 1);
    gw.stop().await;
}

/// A message without a key (`on_missing_key = "forward"`) is queued too, without a
/// marker: each delivery of it is queued again.
#[tokio::test]
async fn a_message_without_a_key_is_queued_without_a_marker() {
    let dir = TempFile::new("q.marker", "");
    let bot = Upstream::ok().await;
    let cfg = Cfg::new().store(&sqlite_store(&dir)).route(&queued("[\"1s\"]"));
    let gw = TestGateway::start(&cfg, &bot).await;
    for _ in 0..2 {
        let resp = gw.client().post("/hook", "{\"no\":\"key\"}").await;
        assert_eq!(
            (resp.status, resp.dedup(), resp.body.as_str()),
            (StatusCode::OK, "no-key", "success")
        );
    }
    bot.wait_for(2).await;
    drained(&gw).await;
    assert_eq!(bot.count(), 2);
    gw.stop().await;
}

/// Redis killed (SIGKILL) while messages arrive: those it could not store get 503,
/// and after it restarts (from its append-only file), no acknowledged message is lost.
#[tokio::test]
async fn redis_killed_while_appending_loses_no_acknowledged_message() {
    let mut redis = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]).await;
    let bot = Upstream::ok().await;
    let cfg = Cfg::new()
        .store(&format!(
            "backend = \"redis\"\nurl = \"{}\"\ntimeout = \"200ms\"",
            redis.url()
        ))
        .route(&queued(
            "[\"100ms\", \"200ms\", \"500ms\", \"1s\", \"1s\", \"1s\", \"1s\", \"1s\"]",
        ))
        // A lease whose reply the kill cut off is taken over after upstream_timeout + 5 s.
        .route("upstream_timeout = \"2s\"\nprocessing_ttl = \"5s\"");
    let gw = TestGateway::start(&cfg, &bot).await;
    let client = gw.client();
    let mut acked = Vec::new();
    let mut refused = Vec::new();
    for i in 0..300 {
        if i == 100 {
            redis.kill();
        }
        if i == 200 {
            redis.restart().await;
        }
        let id = format!("m{i}");
        let resp = client.post("/hook", &msg(&id)).await;
        match (resp.status, resp.dedup()) {
            (StatusCode::OK, "queued") => acked.push(id),
            (StatusCode::SERVICE_UNAVAILABLE, "store-unavailable") => refused.push(id),
            other => panic!("{id}: {other:?} {}", resp.body),
        }
    }
    assert!(
        acked.len() >= 150 && refused.len() >= 90,
        "acked {}, refused {}",
        acked.len(),
        refused.len()
    );
    every_one_delivered(&bot, &acked).await;
    gw.stop().await;
}
