//! Operations: metrics as scraped, config reload, and a drain that gives up cleanly.

use std::time::Duration;

use http::Method;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::process::GatewayProcess;
use crate::servers::RedisServer;
use crate::support::{Cfg, Client, Gate, Reply, TestGateway, Upstream, metric_value, msg, within};

/// `/metrics` as Prometheus asks for it (its `Accept` names OpenMetrics first).
async fn scrape(admin: &Client) -> String {
    let accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
    let r = admin.send(Method::GET, "/metrics", &[("accept", accept)], "").await;
    assert_eq!(r.status, 200);
    // OpenMetrics text (`# EOF`, an `info` type), labelled as such: a stock Prometheus
    // parses the body by this header and rejects the whole scrape on a mismatch.
    assert_eq!(
        r.headers["content-type"],
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    assert!(r.body.ends_with("# EOF\n"), "{}", r.body);
    r.body
}

#[tokio::test]
async fn metrics_count_what_was_sent_by_outcome_with_bounded_labels() {
    let gate = Gate::new();
    let g = gate.clone();
    let upstream = Upstream::with(move |r| {
        let g = g.clone();
        async move {
            if r.msg_id().as_deref() == Some("slow") {
                g.pass().await;
            }
            Reply::new(200, "ok")
        }
    })
    .await;
    let cfg = Cfg::new()
        .server("max_body = \"1KiB\"")
        .route("on_in_flight = \"conflict\"");
    let gw = TestGateway::start(&cfg, &upstream).await;
    let client = gw.client();
    for id in ["a", "b", "c"] {
        assert_eq!(client.post("/hook", &msg(id)).await.dedup(), "forwarded");
    }
    for id in ["a", "b"] {
        assert_eq!(client.post("/hook", &msg(id)).await.dedup(), "duplicate");
    }
    let c = client.clone();
    let slow = tokio::spawn(async move { c.post("/hook", &msg("slow")).await });
    upstream.wait_for(4).await;
    assert_eq!(gw.metric(r#"dedup_in_flight{route="bot"}"#), 1.0, "the slow one");
    assert_eq!(client.post("/hook", &msg("slow")).await.dedup(), "in-flight");
    gate.open(1);
    assert_eq!(slow.await.expect("slow").dedup(), "forwarded");
    assert_eq!(client.post("/hook", "{}").await.dedup(), "no-key");
    assert_eq!(client.post("/hook", &"x".repeat(2048)).await.dedup(), "too-large");
    assert_eq!(client.send(Method::GET, "/hook", &[], "").await.dedup(), "bypass");

    let text = scrape(&Client::http1(gw.admin.expect("admin"))).await;
    let count = |outcome: &str| {
        metric_value(
            &text,
            &format!("dedup_requests_total{{route=\"bot\",outcome=\"{outcome}\"}}"),
        )
    };
    let expected = [
        ("forwarded", 4.0),
        ("duplicate", 2.0),
        ("in_flight", 1.0),
        ("no_key", 1.0),
        ("too_large", 1.0),
        ("bypass", 1.0),
        ("replayed", 0.0),
        ("store_unavailable", 0.0),
        ("rejected", 0.0),
        ("bad_request", 0.0),
        ("aborted", 0.0),
        ("shadow_duplicate", 0.0),
        ("shadow_in_flight", 0.0),
    ];
    for (outcome, n) in expected {
        assert_eq!(count(outcome), n, "{outcome}");
    }
    assert_eq!(
        metric_value(&text, r#"dedup_upstream_responses_total{route="bot",class="2xx"}"#),
        6.0
    );
    assert_eq!(
        metric_value(&text, r#"dedup_upstream_duration_seconds_count{route="bot"}"#),
        6.0
    );
    assert_eq!(
        metric_value(&text, r#"dedup_duplicate_age_seconds_count{route="bot"}"#),
        3.0
    );
    assert_eq!(
        metric_value(&text, r#"dedup_store_duration_seconds_count{op="claim"}"#),
        7.0
    );
    assert_eq!(metric_value(&text, r#"dedup_store_errors_total{op="claim"}"#), 0.0);
    assert_eq!(metric_value(&text, "dedup_store_entries"), 4.0);
    assert_eq!(metric_value(&text, r#"dedup_in_flight{route="bot"}"#), 0.0);
    assert_eq!(metric_value(&text, "dedup_ready"), 1.0);
    for result in ["released", "not_found", "gave_up", "skipped"] {
        let series = format!("dedup_orphan_releases_total{{result=\"{result}\"}}");
        assert_eq!(metric_value(&text, &series), 0.0);
    }
    let version = format!("dedup_build_info{{version=\"{}\"}}", env!("CARGO_PKG_VERSION"));
    assert_eq!(metric_value(&text, &version), 1.0);
    // Sub-millisecond buckets for store calls.
    assert!(
        text.contains(r#"dedup_store_duration_seconds_bucket{le="0.0001",op="claim"}"#),
        "{text}"
    );
    // Labels are bounded: never a key, an id or a path.
    for leak in ["slow", "/hook", "dedup:bot"] {
        assert!(!text.contains(leak), "{leak} leaked into /metrics");
    }
}

fn with_second_route(cfg: &Cfg, upstream: &str) -> String {
    let mut toml = cfg.toml(upstream);
    toml.push_str(&format!(
        "\n[[routes]]\nname = \"new\"\npath = \"/new\"\nupstream = \"{upstream}\"\nkey = [\"json:/msgId\"]\n"
    ));
    toml
}

async fn reloads(admin: &Client, result: &str) -> f64 {
    metric_value(
        &scrape(admin).await,
        &format!("dedup_config_reloads_total{{result=\"{result}\"}}"),
    )
}

#[tokio::test]
async fn sighup_and_post_reload_swap_routes_and_a_broken_file_changes_nothing() {
    let upstream = Upstream::ok().await;
    let cfg = Cfg::new();
    let gw = GatewayProcess::start(&cfg.toml(&upstream.url())).await;
    let client = Client::http1(gw.addr);
    let admin = Client::http1(gw.admin.expect("admin"));
    assert_eq!(client.post("/new", &msg("n1")).await.status, 404);

    // A broken file: counted, logged, and the running routes keep serving.
    std::fs::write(&gw.config.0, "[[routes]]\nname = \"new\"\nbogus = 1\n").expect("write");
    gw.signal("HUP");
    within("the failed reload to be counted", async {
        while reloads(&admin, "failure").await < 1.0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(client.post("/hook", &msg("h1")).await.dedup(), "forwarded");
    assert_eq!(client.post("/new", &msg("n1")).await.status, 404);

    // A good one: the new route works without a restart, the old one keeps its markers.
    std::fs::write(&gw.config.0, with_second_route(&cfg, &upstream.url())).expect("write");
    gw.signal("HUP");
    within("the new route", async {
        while client.post("/new", &msg("n1")).await.status == 404 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(client.post("/new", &msg("n1")).await.dedup(), "duplicate");
    assert_eq!(
        client.post("/hook", &msg("h1")).await.dedup(),
        "duplicate",
        "markers survive a reload"
    );
    assert_eq!(reloads(&admin, "success").await, 1.0);

    // The same over the admin listener (distroless images have no `kill`).
    std::fs::write(&gw.config.0, "not toml [").expect("write");
    let r = admin.send(Method::POST, "/reload", &[], "").await;
    assert_eq!(r.status, 500, "{}", r.body);
    assert!(r.body.contains("nothing changed"), "{}", r.body);
    std::fs::write(&gw.config.0, cfg.toml(&upstream.url())).expect("write");
    let r = admin.send(Method::POST, "/reload", &[], "").await;
    assert_eq!((r.status.as_u16(), r.body.as_str()), (200, "reloaded 1 route(s)\n"));
    assert_eq!(client.post("/new", &msg("n2")).await.status, 404, "route removed");
    assert_eq!(reloads(&admin, "failure").await, 2.0);
    assert_eq!(reloads(&admin, "success").await, 2.0);
}

/// `[store]` changes wait for a restart, so a reloaded route's `processing_ttl` must
/// be safe with the running store timeout, not only with the one in the file.
#[tokio::test]
async fn a_reload_checks_processing_ttl_against_the_running_store_timeout() {
    let upstream = Upstream::ok().await;
    let cfg = |store_timeout: &str, processing_ttl: &str| {
        Cfg::new()
            .store(&format!("timeout = \"{store_timeout}\""))
            .route("upstream_timeout = \"5s\"")
            .route(&format!("processing_ttl = \"{processing_ttl}\""))
            .toml(&upstream.url())
    };
    let gw = GatewayProcess::start(&cfg("2s", "14s")).await;
    let admin = Client::http1(gw.admin.expect("admin"));

    // Safe with the file's 100ms (5.4s), not with the running 2s (13s).
    std::fs::write(&gw.config.0, cfg("100ms", "6s")).expect("write");
    let r = admin.send(Method::POST, "/reload", &[], "").await;
    assert_eq!(r.status, 500, "{}", r.body);
    assert!(
        r.body
            .contains("routes[0].processing_ttl: 6s must exceed upstream_timeout (5s) + 4 x store.timeout (2s)"),
        "{}",
        r.body
    );
    assert_eq!(reloads(&admin, "failure").await, 1.0);

    // Safe with both: reloaded, the [store] change reported as waiting for a restart.
    std::fs::write(&gw.config.0, cfg("100ms", "14s")).expect("write");
    let r = admin.send(Method::POST, "/reload", &[], "").await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body.contains("[store]"), "{}", r.body);
}

/// The store's state is logged when it changes: once when Redis stops answering, once
/// when it answers again, and not on every readiness check nor through a drain.
#[tokio::test]
async fn store_outages_are_logged_once_each_way() {
    let mut server = RedisServer::start().await;
    let upstream = Upstream::ok().await;
    let cfg = Cfg::new()
        .server("shutdown_delay = \"1500ms\"")
        .store("backend = \"redis\"")
        .store(&format!("url = \"{}\"", server.url()));
    let gw = GatewayProcess::start(&cfg.toml(&upstream.url())).await;
    let admin = Client::http1(gw.admin.expect("admin"));
    let count = |what: &str| {
        gw.logs
            .lock()
            .expect("logs")
            .iter()
            .filter(|l| l.contains(what))
            .count()
    };
    let ping_errors = || async { metric_value(&scrape(&admin).await, r#"dedup_store_errors_total{op="ping"}"#) };

    server.kill();
    within("three failed checks", async {
        while ping_errors().await < 3.0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    server.restart().await;
    crate::support::eventually("the store to answer again", || count("store answers") > 0).await;
    // Through shutdown_delay (three checks) the store answers: nothing more to say.
    gw.signal("TERM");
    let logs = std::sync::Arc::clone(&gw.logs);
    assert_eq!(gw.wait().await, Some(0));
    let logs = logs.lock().expect("logs").join("\n");
    assert_eq!(logs.matches("store stopped answering").count(), 1, "{logs}");
    assert_eq!(logs.matches("store answers").count(), 1, "{logs}");
}

/// A request whose body is still arriving when the shutdown grace ends holds no claim:
/// the drain does not wait for it, nor warn of claims it could not release; its
/// connection is closed (the sender retries), never answered 200.
#[tokio::test]
async fn a_body_still_arriving_when_the_grace_ends_does_not_hold_the_drain() {
    let upstream = Upstream::ok().await;
    let cfg = Cfg::new().server("shutdown_grace = \"300ms\"");
    let gw = GatewayProcess::start(&cfg.toml(&upstream.url())).await;
    let mut stream = tokio::net::TcpStream::connect(gw.addr).await.expect("connect");
    let head = "POST /hook HTTP/1.1\r\nHost: gw\r\nContent-Length: 100\r\nExpect: 100-continue\r\n\r\n";
    stream.write_all(head.as_bytes()).await.expect("head");
    // hyper says 100 Continue when the handler starts reading the body.
    let mut continued = [0u8; 25];
    stream.read_exact(&mut continued).await.expect("100 Continue");
    assert!(continued.starts_with(b"HTTP/1.1 100 Continue"), "{continued:?}");
    stream.write_all(b"{\"msgId\":").await.expect("part of the body");
    gw.signal("TERM");
    let logs = std::sync::Arc::clone(&gw.logs);
    assert_eq!(gw.wait().await, Some(0));
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer).await;
    assert!(!answer.contains(" 200 "), "{answer}");
    let logs = logs.lock().expect("logs").join("\n");
    assert!(!logs.contains("could not be released"), "{logs}");
    assert!(!logs.contains("abandoning in-flight"), "nothing was in flight: {logs}");
    assert_eq!(upstream.count(), 0);
}

#[tokio::test]
async fn a_request_still_running_when_the_grace_ends_leaves_no_marker_in_redis() {
    let server = RedisServer::start().await;
    let gate = Gate::new();
    let upstream = Upstream::gated(&gate, "too late").await;
    let cfg = Cfg::new()
        .server("shutdown_grace = \"500ms\"")
        .store("backend = \"redis\"")
        .store(&format!("url = \"{}\"", server.url()));
    let gw = GatewayProcess::start(&cfg.toml(&upstream.url())).await;
    let client = Client::http1(gw.addr);
    let stuck = tokio::spawn(async move { client.post("/hook", &msg("stuck")).await });
    upstream.wait_for(1).await;
    assert!(server.cli(&["GET", "dedup:bot:stuck"]).contains("processing"));
    gw.signal("TERM");
    let answer = within("the abandoned request", stuck).await.expect("task");
    assert_eq!((answer.status.as_u16(), answer.dedup()), (503, "aborted"));
    let logs = std::sync::Arc::clone(&gw.logs);
    assert_eq!(gw.wait().await, Some(0));
    let logs = logs.lock().expect("logs").join("\n");
    let abandoning = logs.lines().find(|l| l.contains("abandoning in-flight requests"));
    assert!(abandoning.is_some_and(|l| l.contains(r#""still_running":1"#)), "{logs}");
    assert!(!logs.contains("could not be released"), "{logs}");
    assert_eq!(
        server.cli(&["EXISTS", "dedup:bot:stuck"]).trim(),
        "0",
        "the claim was released"
    );
}
