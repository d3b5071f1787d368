//! The state machine through real HTTP: every row of the README's behaviour tables that
//! concerns claims, duplicates and in-flight requests.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use dedup_gateway::store::Store;
use http::Method;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::support::{Cfg, Client, Gate, Reply, TestGateway, Upstream, eventually, msg, within};

#[tokio::test]
async fn first_sighting_is_forwarded_and_a_repeat_is_a_duplicate() {
    let upstream = Upstream::ok().await;
    let gw = TestGateway::start(&Cfg::new(), &upstream).await;
    let client = gw.client();

    let first = client.post("/hook", &msg("m1")).await;
    assert_eq!(first.status, 200);
    assert_eq!(first.dedup(), "forwarded");
    assert_eq!(first.body, r#"{"reply":"ok m1"}"#);

    let second = client.post("/hook", &msg("m1")).await;
    assert_eq!(second.status, 200);
    assert_eq!(second.dedup(), "duplicate");
    assert_eq!(second.body, "success");
    assert_eq!(second.headers["content-type"], "text/plain; charset=utf-8");
    assert_eq!(upstream.count(), 1, "the duplicate never reaches the upstream");
    assert_eq!(
        gw.metric(r#"dedup_requests_total{route="bot",outcome="forwarded"}"#),
        1.0
    );
    assert_eq!(
        gw.metric(r#"dedup_requests_total{route="bot",outcome="duplicate"}"#),
        1.0
    );
}

#[tokio::test]
async fn a_number_and_a_string_with_the_same_digits_are_one_message() {
    let upstream = Upstream::ok().await;
    let gw = TestGateway::start(&Cfg::new(), &upstream).await;
    let client = gw.client();
    assert_eq!(
        client.post("/hook", r#"{"msgId": 7891234567890123457}"#).await.dedup(),
        "forwarded"
    );
    assert_eq!(
        client.post("/hook", r#"{"msgId":"7891234567890123457"}"#).await.dedup(),
        "duplicate"
    );
    // One digit away (what f64 rounding would produce) is a different message.
    assert_eq!(
        client.post("/hook", r#"{"msgId": 7891234567890123456}"#).await.dedup(),
        "forwarded"
    );
}

#[tokio::test]
async fn custom_duplicate_answer() {
    let upstream = Upstream::ok().await;
    let cfg = Cfg::new()
        .route("duplicate_status = 202")
        .route("duplicate_body = '{\"ok\":true}'")
        .route("duplicate_content_type = \"application/json\"");
    let gw = TestGateway::start(&cfg, &upstream).await;
    let client = gw.client();
    client.post("/hook", &msg("c1")).await;
    let dup = client.post("/hook", &msg("c1")).await;
    assert_eq!(
        (dup.status.as_u16(), dup.body.as_str(), dup.dedup()),
        (202, r#"{"ok":true}"#, "duplicate")
    );
    assert_eq!(dup.headers["content-type"], "application/json");
}

#[tokio::test]
async fn replay_answers_duplicates_with_the_stored_response() {
    let upstream = Upstream::with(|r| async move {
        let mut reply = Reply::new(201, format!("reply to {}", r.msg_id().unwrap_or_default()));
        reply.content_type = "text/x-bot";
        reply
    })
    .await;
    let gw = TestGateway::start(&Cfg::new().route("replay = true"), &upstream).await;
    let client = gw.client();
    let first = client.post("/hook", &msg("r1")).await;
    assert_eq!((first.status.as_u16(), first.dedup()), (201, "forwarded"));
    let again = client.post("/hook", &msg("r1")).await;
    assert_eq!(
        (again.status.as_u16(), again.dedup(), again.body.as_str()),
        (201, "replayed", "reply to r1")
    );
    assert_eq!(again.headers["content-type"], "text/x-bot");
    assert_eq!(upstream.count(), 1);
}

#[tokio::test]
async fn replay_of_a_response_over_64k_falls_back_to_the_duplicate_answer() {
    let big = "x".repeat(64 * 1024 + 1);
    let upstream = Upstream::with(move |_| {
        let big = big.clone();
        async move { Reply::new(200, big) }
    })
    .await;
    let gw = TestGateway::start(&Cfg::new().route("replay = true"), &upstream).await;
    let client = gw.client();
    let first = client.post("/hook", &msg("big")).await;
    assert_eq!(first.body.len(), 64 * 1024 + 1, "the sender still gets the whole body");
    let again = client.post("/hook", &msg("big")).await;
    assert_eq!((again.dedup(), again.body.as_str()), ("duplicate", "success"));
}

#[tokio::test]
async fn upstream_failure_releases_the_marker_so_the_retry_is_forwarded() {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&calls);
    let upstream = Upstream::with(move |_| {
        let n = c.fetch_add(1, Ordering::SeqCst);
        async move {
            if n == 0 {
                Reply::new(500, "boom")
            } else {
                Reply::new(200, "ok")
            }
        }
    })
    .await;
    let gw = TestGateway::start(&Cfg::new(), &upstream).await;
    let client = gw.client();
    let failed = client.post("/hook", &msg("f1")).await;
    assert_eq!(
        (failed.status.as_u16(), failed.dedup(), failed.body.as_str()),
        (500, "forwarded", "boom")
    );
    let retry = client.post("/hook", &msg("f1")).await;
    assert_eq!((retry.status.as_u16(), retry.dedup()), (200, "forwarded"));
    let third = client.post("/hook", &msg("f1")).await;
    assert_eq!(third.dedup(), "duplicate");
    assert_eq!(upstream.count(), 2);
    assert_eq!(
        gw.metric(r#"dedup_upstream_responses_total{route="bot",class="5xx"}"#),
        1.0
    );
    assert_eq!(
        gw.metric(r#"dedup_upstream_responses_total{route="bot",class="2xx"}"#),
        1.0
    );
}

#[tokio::test]
async fn unreachable_upstream_is_502_and_released() {
    // Bind and drop a listener: nothing listens on that port any more.
    let dead = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", dead.local_addr().expect("addr"));
    drop(dead);
    let gw = TestGateway::start_toml(&Cfg::new().toml(&url)).await;
    let client = gw.client();
    let r = client.post("/hook", &msg("u1")).await;
    assert_eq!((r.status.as_u16(), r.dedup()), (502, "forwarded"));
    // Released: the retry is forwarded again (and fails again), never "duplicate".
    let r = client.post("/hook", &msg("u1")).await;
    assert_eq!((r.status.as_u16(), r.dedup()), (502, "forwarded"));
    assert_eq!(
        gw.metric(r#"dedup_upstream_responses_total{route="bot",class="error"}"#),
        2.0
    );
}

#[tokio::test]
async fn upstream_timeout_is_504_and_release_or_keep_decides_the_retry() {
    for (policy, retry_status) in [("release", "forwarded"), ("keep", "in-flight")] {
        let gate = Gate::new();
        let upstream = Upstream::gated(&gate, "late").await;
        let cfg = Cfg::new()
            .route("upstream_timeout = \"200ms\"")
            .route("processing_ttl = \"30s\"")
            .route("on_in_flight = \"conflict\"")
            .route(&format!("on_upstream_timeout = \"{policy}\""));
        let gw = TestGateway::start(&cfg, &upstream).await;
        let client = gw.client();
        let r = client.post("/hook", &msg("t1")).await;
        assert_eq!((r.status.as_u16(), r.dedup()), (504, "forwarded"), "{policy}");
        gate.open(10);
        let retry = client.post("/hook", &msg("t1")).await;
        assert_eq!(retry.dedup(), retry_status, "{policy}");
        assert_eq!(
            gw.metric(r#"dedup_upstream_responses_total{route="bot",class="timeout"}"#),
            1.0
        );
    }
}

/// Starts a request for `id` whose upstream call blocks at `gate`; returns once the
/// upstream has it (so the marker is PROCESSING).
async fn hold_in_flight(
    client: &Client,
    upstream: &Upstream,
    id: &str,
) -> tokio::task::JoinHandle<crate::support::Resp> {
    let before = upstream.count();
    let c = client.clone();
    let body = msg(id);
    let first = tokio::spawn(async move { c.post("/hook", &body).await });
    upstream.wait_for(before + 1).await;
    first
}

fn gated_upstream(
    gate: &Gate,
    status_for_first: u16,
) -> impl Fn(crate::support::Received) -> std::pin::Pin<Box<dyn Future<Output = Reply> + Send>> + Send + Sync + 'static
{
    let gate = gate.clone();
    let calls = Arc::new(AtomicUsize::new(0));
    move |r| {
        let gate = gate.clone();
        let n = calls.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            if n == 0 {
                gate.pass().await;
                Reply::new(status_for_first, format!("first {}", r.msg_id().unwrap_or_default()))
            } else {
                Reply::new(200, format!("later {}", r.msg_id().unwrap_or_default()))
            }
        })
    }
}

#[tokio::test]
async fn in_flight_conflict_answers_409_with_retry_after() {
    let gate = Gate::new();
    let upstream = Upstream::with(gated_upstream(&gate, 200)).await;
    let gw = TestGateway::start(&Cfg::new().route("on_in_flight = \"conflict\""), &upstream).await;
    let client = gw.client();
    let first = hold_in_flight(&client, &upstream, "i1").await;
    let dup = client.post("/hook", &msg("i1")).await;
    assert_eq!((dup.status.as_u16(), dup.dedup()), (409, "in-flight"));
    assert_eq!(dup.headers["retry-after"], "1");
    gate.open(1);
    assert_eq!(first.await.expect("first").dedup(), "forwarded");
    assert_eq!(upstream.count(), 1);
}

#[tokio::test]
async fn in_flight_ack_answers_the_duplicate_response_at_once() {
    let gate = Gate::new();
    let upstream = Upstream::with(gated_upstream(&gate, 200)).await;
    let gw = TestGateway::start(&Cfg::new().route("on_in_flight = \"ack\""), &upstream).await;
    let client = gw.client();
    let first = hold_in_flight(&client, &upstream, "a1").await;
    let dup = client.post("/hook", &msg("a1")).await;
    assert_eq!(
        (dup.status.as_u16(), dup.dedup(), dup.body.as_str()),
        (200, "in-flight", "success")
    );
    assert_eq!(
        gw.metric(r#"dedup_requests_total{route="bot",outcome="in_flight"}"#),
        1.0
    );
    gate.open(1);
    first.await.expect("first");
    assert_eq!(upstream.count(), 1);
}

/// Waits until the gateway has seen `n` requests find an existing marker.
async fn duplicates_seen(gw: &TestGateway, n: f64) {
    eventually("the duplicate to reach the gateway", || {
        gw.metric(r#"dedup_duplicate_age_seconds_count{route="bot"}"#) >= n
    })
    .await;
}

#[tokio::test]
async fn in_flight_wait_with_replay_returns_the_upstreams_own_body() {
    let gate = Gate::new();
    let upstream = Upstream::with(gated_upstream(&gate, 200)).await;
    let cfg = Cfg::new().route("replay = true").route("in_flight_wait = \"10s\"");
    let gw = TestGateway::start(&cfg, &upstream).await;
    let client = gw.client();
    let first = hold_in_flight(&client, &upstream, "w1").await;
    let c = client.clone();
    let waiter = tokio::spawn(async move { c.post("/hook", &msg("w1")).await });
    duplicates_seen(&gw, 1.0).await;
    assert!(
        !waiter.is_finished(),
        "the duplicate waits while the first is processed"
    );
    gate.open(1);
    let first = first.await.expect("first");
    let waited = within("the waiter", waiter).await.expect("waiter");
    assert_eq!((first.dedup(), first.body.as_str()), ("forwarded", "first w1"));
    assert_eq!(
        (waited.status.as_u16(), waited.dedup(), waited.body.as_str()),
        (200, "replayed", "first w1")
    );
    assert_eq!(upstream.count(), 1);
}

#[tokio::test]
async fn in_flight_wait_without_replay_answers_duplicate_when_the_first_completes() {
    let gate = Gate::new();
    let upstream = Upstream::with(gated_upstream(&gate, 200)).await;
    let gw = TestGateway::start(&Cfg::new().route("in_flight_wait = \"10s\""), &upstream).await;
    let client = gw.client();
    let first = hold_in_flight(&client, &upstream, "w2").await;
    let c = client.clone();
    let waiter = tokio::spawn(async move { c.post("/hook", &msg("w2")).await });
    duplicates_seen(&gw, 1.0).await;
    gate.open(1);
    first.await.expect("first");
    let waited = within("the waiter", waiter).await.expect("waiter");
    assert_eq!((waited.dedup(), waited.body.as_str()), ("duplicate", "success"));
}

#[tokio::test]
async fn when_the_owner_fails_the_waiter_forwards_itself() {
    let gate = Gate::new();
    let upstream = Upstream::with(gated_upstream(&gate, 503)).await;
    let gw = TestGateway::start(&Cfg::new().route("in_flight_wait = \"10s\""), &upstream).await;
    let client = gw.client();
    let first = hold_in_flight(&client, &upstream, "p1").await;
    let c = client.clone();
    let waiter = tokio::spawn(async move { c.post("/hook", &msg("p1")).await });
    duplicates_seen(&gw, 1.0).await;
    gate.open(1);
    let first = first.await.expect("first");
    assert_eq!((first.status.as_u16(), first.dedup()), (503, "forwarded"));
    let promoted = within("the waiter", waiter).await.expect("waiter");
    assert_eq!(
        (promoted.status.as_u16(), promoted.dedup(), promoted.body.as_str()),
        (200, "forwarded", "later p1")
    );
    assert_eq!(
        upstream.count(),
        2,
        "the waiter delivered the message after the owner failed"
    );
    assert_eq!(client.post("/hook", &msg("p1")).await.dedup(), "duplicate");
}

#[tokio::test]
async fn in_flight_wait_gives_up_with_409_when_the_first_is_still_running() {
    let gate = Gate::new();
    let upstream = Upstream::with(gated_upstream(&gate, 200)).await;
    let gw = TestGateway::start(&Cfg::new().route("in_flight_wait = \"300ms\""), &upstream).await;
    let client = gw.client();
    let first = hold_in_flight(&client, &upstream, "g1").await;
    let dup = client.post("/hook", &msg("g1")).await;
    assert_eq!((dup.status.as_u16(), dup.dedup()), (409, "in-flight"));
    assert_eq!(dup.headers["retry-after"], "1");
    gate.open(1);
    assert_eq!(first.await.expect("first").dedup(), "forwarded");
}

#[tokio::test]
async fn a_sender_that_hangs_up_does_not_cancel_the_delivery() {
    let gate = Gate::new();
    let upstream = Upstream::with(gated_upstream(&gate, 200)).await;
    let gw = TestGateway::start(&Cfg::new().route("on_in_flight = \"conflict\""), &upstream).await;
    let client = gw.client();
    // The sender gives up (WeChat does after 5 s) and closes its socket mid-flight.
    let body = msg("h1");
    let mut sender = TcpStream::connect(gw.addr).await.expect("connect");
    let request = format!(
        "POST /hook HTTP/1.1\r\nHost: gw\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    sender.write_all(request.as_bytes()).await.expect("write");
    upstream.wait_for(1).await;
    drop(sender);
    gate.open(1);
    // The owner task still completes the marker: the retry is a duplicate, not a redelivery.
    eventually("the marker to complete", || {
        gw.metric(r#"dedup_store_duration_seconds_count{op="complete"}"#) >= 1.0
    })
    .await;
    let retry = client.post("/hook", &msg("h1")).await;
    assert_eq!(retry.dedup(), "duplicate");
    assert_eq!(upstream.count(), 1);
}

#[tokio::test]
async fn thousand_ids_times_five_concurrent_copies_are_delivered_exactly_once() {
    let upstream = Upstream::with(|r| async move {
        // A little work so copies overlap with the first attempt.
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        Reply::new(200, r.msg_id().unwrap_or_default())
    })
    .await;
    let gw = TestGateway::start(&Cfg::new().route("in_flight_wait = \"10s\""), &upstream).await;
    let client = gw.client();
    let ids: Vec<String> = (0..1000).map(|i| format!("bulk-{i}")).collect();
    let mut outcomes: HashMap<String, usize> = HashMap::new();
    for batch in ids.chunks(40) {
        let mut tasks = Vec::new();
        for id in batch {
            for _ in 0..5 {
                let c = client.clone();
                let body = msg(id);
                tasks.push(tokio::spawn(async move { c.post("/hook", &body).await }));
            }
        }
        for t in tasks {
            let r = t.await.expect("task");
            assert_eq!(r.status, 200, "{r:?}");
            *outcomes.entry(r.dedup().to_owned()).or_default() += 1;
        }
    }
    let mut per_id: HashMap<String, usize> = HashMap::new();
    for r in upstream.received() {
        *per_id.entry(r.msg_id().expect("id")).or_default() += 1;
    }
    assert_eq!(per_id.len(), 1000);
    assert!(per_id.values().all(|&n| n == 1), "some id was delivered twice");
    assert_eq!(outcomes.get("forwarded"), Some(&1000), "{outcomes:?}");
    assert_eq!(outcomes.values().sum::<usize>(), 5000);
}

#[tokio::test]
async fn missing_key_policies() {
    let upstream = Upstream::ok().await;
    for (policy, status, body_is_upstream) in [("forward", 200, true), ("ack", 200, false), ("reject", 400, false)] {
        let cfg = Cfg::new().route(&format!("on_missing_key = \"{policy}\""));
        let gw = TestGateway::start(&cfg, &upstream).await;
        let before = upstream.count();
        let r = gw.client().post("/hook", r#"{"other":"x"}"#).await;
        assert_eq!((r.status.as_u16(), r.dedup()), (status, "no-key"), "{policy}");
        let expected_body = match policy {
            "forward" => r#"{"reply":"ok "}"#,
            "ack" => "success",
            _ => "no message id in the request\n",
        };
        assert_eq!(r.body, expected_body, "{policy}");
        assert_eq!(upstream.count() - before, usize::from(body_is_upstream), "{policy}");
        assert_eq!(gw.metric(r#"dedup_requests_total{route="bot",outcome="no_key"}"#), 1.0);
    }
}

#[tokio::test]
async fn store_errors_follow_on_error() {
    // A memory store with one slot held by a PROCESSING entry is "down" for new claims.
    for (policy, status, delivered) in [("reject", 503, 0), ("forward", 200, 1)] {
        let gate = Gate::new();
        let upstream = Upstream::with(gated_upstream(&gate, 200)).await;
        let cfg = Cfg::new()
            .store("max_entries = 1")
            .store(&format!("on_error = \"{policy}\""));
        let gw = TestGateway::start(&cfg, &upstream).await;
        let client = gw.client();
        let first = hold_in_flight(&client, &upstream, "s1").await;
        let r = client.post("/hook", &msg("s2")).await;
        assert_eq!(
            (r.status.as_u16(), r.dedup()),
            (status, "store-unavailable"),
            "{policy}"
        );
        if status == 503 {
            assert_eq!(r.headers["retry-after"], "1");
        }
        assert_eq!(upstream.count(), 1 + delivered, "{policy}");
        assert_eq!(
            gw.metric(r#"dedup_store_errors_total{op="claim"}"#),
            1.0,
            "a full store is not retried"
        );
        gate.open(1);
        first.await.expect("first");
    }
}

#[tokio::test]
async fn shadow_mode_forwards_everything_and_labels_what_it_would_drop() {
    let gate = Gate::new();
    let upstream = Upstream::with(gated_upstream(&gate, 200)).await;
    let gw = TestGateway::start(&Cfg::new().route("mode = \"shadow\""), &upstream).await;
    let client = gw.client();
    let first = hold_in_flight(&client, &upstream, "sh1").await;
    let in_flight = client.post("/hook", &msg("sh1")).await;
    assert_eq!(
        (in_flight.status.as_u16(), in_flight.dedup()),
        (200, "shadow-in-flight")
    );
    gate.open(1);
    assert_eq!(first.await.expect("first").dedup(), "forwarded");
    let dup = client.post("/hook", &msg("sh1")).await;
    assert_eq!((dup.dedup(), dup.body.as_str()), ("shadow-duplicate", "later sh1"));
    assert_eq!(upstream.count(), 3, "shadow mode drops nothing");
    assert_eq!(
        gw.metric(r#"dedup_requests_total{route="bot",outcome="shadow_in_flight"}"#),
        1.0
    );
    assert_eq!(
        gw.metric(r#"dedup_requests_total{route="bot",outcome="shadow_duplicate"}"#),
        1.0
    );
    assert_eq!(
        gw.metric(r#"dedup_requests_total{route="bot",outcome="forwarded"}"#),
        1.0
    );
}

#[tokio::test]
async fn put_and_patch_are_deduped_too_and_routes_never_share_keys() {
    let upstream = Upstream::ok().await;
    let cfg = Cfg::new()
        .extra("[[routes]]\nname = \"other\"\npath = \"/other\"\nupstream = \"{upstream}\"\nkey = [\"json:/msgId\"]\n");
    let gw = TestGateway::start(&cfg, &upstream).await;
    let client = gw.client();
    assert_eq!(
        client.send(Method::PUT, "/hook", &[], &msg("k1")).await.dedup(),
        "forwarded"
    );
    assert_eq!(
        client.send(Method::PATCH, "/hook", &[], &msg("k1")).await.dedup(),
        "duplicate"
    );
    assert_eq!(
        client.post("/other", &msg("k1")).await.dedup(),
        "forwarded",
        "another route, another key"
    );
}

#[tokio::test]
async fn shadow_mode_forwards_even_what_enforce_mode_would_refuse() {
    let upstream = Upstream::ok().await;
    let cfg = Cfg::new()
        .route("mode = \"shadow\"")
        .route("on_missing_key = \"reject\"")
        .store("max_entries = 1")
        .store("on_error = \"reject\"");
    let gw = TestGateway::start(&cfg, &upstream).await;
    let client = gw.client();
    let no_key = client.post("/hook", r#"{"other":1}"#).await;
    assert_eq!((no_key.status.as_u16(), no_key.dedup()), (200, "no-key"));
    // Fill the one slot with a PROCESSING marker: further claims are store errors.
    let held = dedup_gateway::store::Token::generate();
    let claim = gw
        .gw
        .store
        .claim("dedup:bot:held", held, 1, std::time::Duration::from_secs(60));
    claim.await.expect("claim");
    let down = client.post("/hook", &msg("sd1")).await;
    assert_eq!((down.status.as_u16(), down.dedup()), (200, "store-unavailable"));
    assert_eq!(upstream.count(), 2, "shadow mode forwards every request");
}

#[tokio::test]
async fn a_waiter_takes_over_an_expired_claim_and_then_has_the_upstream_timeout() {
    // An owner that crashed: its PROCESSING marker is in the store, nobody completes it.
    let upstream = Upstream::with(|r| async move {
        // Slower than in_flight_wait: only upstream_timeout may bound the new owner.
        tokio::time::sleep(std::time::Duration::from_millis(700)).await;
        Reply::new(200, format!("late {}", r.msg_id().unwrap_or_default()))
    })
    .await;
    let cfg = Cfg::new()
        .route("in_flight_wait = \"500ms\"")
        .route("upstream_timeout = \"5s\"");
    let gw = TestGateway::start(&cfg, &upstream).await;
    let crashed = dedup_gateway::store::Token::generate();
    let ttl = std::time::Duration::from_millis(300);
    gw.gw.store.claim("dedup:bot:x1", crashed, 1, ttl).await.expect("claim");
    let r = gw.client().post("/hook", &msg("x1")).await;
    assert_eq!(
        (r.status.as_u16(), r.dedup(), r.body.as_str()),
        (200, "forwarded", "late x1")
    );
    assert_eq!(upstream.count(), 1);
}

/// A bot that gzips its reply: the replayed duplicate must say so, or the sender reads
/// compressed bytes as the body.
#[tokio::test]
async fn replay_keeps_the_content_encoding_of_a_compressed_reply() {
    use std::io::{Read, Write};
    let text = "{\"reply\":\"compressed hello\"}";
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(text.as_bytes()).expect("gzip");
    let gzipped = bytes::Bytes::from(gz.finish().expect("gzip"));
    let body = gzipped.clone();
    let upstream = Upstream::with(move |_| {
        let mut reply = Reply::new(200, body.clone());
        reply.headers.push(("content-encoding", "gzip"));
        async move { reply }
    })
    .await;
    let gw = TestGateway::start(&Cfg::new().route("replay = true"), &upstream).await;
    let client = gw.client();
    let first = client.post("/hook", &msg("gz")).await;
    assert_eq!(first.dedup(), "forwarded");
    let again = client.post("/hook", &msg("gz")).await;
    assert_eq!(again.dedup(), "replayed");
    assert_eq!(
        again.headers.get("content-encoding").map(|v| v.to_str().ok()),
        Some(Some("gzip")),
        "{again:?}"
    );
    assert_eq!(again.bytes, gzipped);
    let mut decoded = String::new();
    flate2::read::GzDecoder::new(&again.bytes[..])
        .read_to_string(&mut decoded)
        .expect("the replayed body decodes as the bot's gzip");
    assert_eq!(decoded, text);
    assert_eq!(upstream.count(), 1);
}
