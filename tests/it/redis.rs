//! The Redis store behind real gateways: values as redis-cli shows them, TTLs, lost
//! replies, round trips, outages, readiness, cross-replica waiting and start-up checks.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use dedup_gateway::store::{Claim, Completion, Store, Token};
use http::Method;

use crate::process::GatewayProcess;
use crate::servers::{RedisCluster, RedisServer, SwallowingProxy, ids_in_one_slot};
use crate::store_contract::redis_store;
use crate::support::{Cfg, Client, Gate, Reply, Resp, TestGateway, Upstream, eventually, msg, within};
use dedup_gateway::store::redis::key_slot;

/// A gateway on this Redis, with the default `store.timeout` (250 ms).
fn redis_cfg(url: &str) -> Cfg {
    Cfg::new()
        .store("backend = \"redis\"")
        .store(&format!("url = \"{url}\""))
}

/// For the 12,000-request runs on a small CI machine: a store call stalled by CPU
/// contention must not turn into a 503 and fail a test about deduplication.
const LOADED_STORE_TIMEOUT: &str = "timeout = \"2s\"";
/// ... and the marker then outlives upstream_timeout (25 s) + 4 x that timeout.
const LOADED_PROCESSING_TTL: &str = "processing_ttl = \"40s\"";

#[tokio::test]
async fn values_are_readable_with_redis_cli() {
    let server = RedisServer::start().await;
    let upstream = Upstream::ok().await;
    let gw = TestGateway::start(&redis_cfg(&server.url()).route("replay = true"), &upstream).await;
    gw.client().post("/hook", &msg("v1")).await;
    let raw = server.cli(&["GET", "dedup:bot:v1"]);
    let value: serde_json::Value = serde_json::from_str(raw.trim()).expect("JSON value");
    assert_eq!(value["state"], "completed");
    assert!(value["first_seen_ms"].as_u64().expect("first_seen_ms") > 1_600_000_000_000);
    assert!(value["completed_ms"].as_u64().expect("completed_ms") >= value["first_seen_ms"].as_u64().expect("ms"));
    assert_eq!(value["response"]["status"], 200);
    assert_eq!(value["response"]["body"], r#"{"reply":"ok v1"}"#);
    assert_eq!(value["response"]["content_type"], "application/json");

    let store = redis_store(server.url()).await;
    let token = Token::generate();
    store
        .claim("dedup:bot:p1", token, 1_700_000_000_000, Duration::from_secs(30))
        .await
        .expect("claim");
    let value: serde_json::Value = serde_json::from_str(server.cli(&["GET", "dedup:bot:p1"]).trim()).expect("JSON");
    assert_eq!(value["state"], "processing");
    assert_eq!(value["token"], token.to_string());
    assert_eq!(value["first_seen_ms"], 1_700_000_000_000u64);
}

/// The store's own connections (`redis://`) log in as the URL's user and use its database,
/// as redis-rs's do.
#[tokio::test]
async fn a_url_with_a_user_and_a_database_reaches_that_database_as_that_user() {
    let server = RedisServer::start().await;
    server.cli(&["ACL", "SETUSER", "bot", "on", ">s3cret", "~*", "+@all"]);
    server.cli(&["ACL", "SETUSER", "default", "off"]);
    let url = format!("redis://bot:s3cret@127.0.0.1:{}/3", server.port);
    let store = redis_store(url).await;
    let token = Token::generate();
    let claim = store
        .claim("db:k", token, 1, Duration::from_secs(30))
        .await
        .expect("claim");
    assert_eq!(claim, Claim::Claimed);
    let as_bot = ["--user", "bot", "--pass", "s3cret", "--no-auth-warning"];
    let in_db = |db: &str| server.cli(&[&as_bot[..], &["-n", db, "GET", "db:k"]].concat());
    assert!(in_db("3").contains("processing"), "{}", in_db("3"));
    assert_eq!(in_db("0").trim(), "");
    let clients = server.cli(&[&as_bot[..], &["CLIENT", "LIST"]].concat());
    assert!(
        clients
            .lines()
            .any(|c| c.contains(" user=bot ") && c.contains(" db=3 ")),
        "{clients}"
    );
}

/// Stored responses much larger than a connection's buffers go out whole and come back
/// whole, many at once: each batch of completes is more than a socket takes in one
/// write, each reply spans many reads and queues behind others, and the connections
/// stay in step for the next call.
#[tokio::test]
async fn large_stored_responses_go_out_and_come_back_whole_many_at_once() {
    let server = RedisServer::start().await;
    // Megabytes per call: a timeout of seconds, not the contract's 500 ms, so that a slow
    // machine does not fail the test.
    let target = dedup_gateway::config::RedisTarget::Standalone(server.url());
    let store = dedup_gateway::store::RedisStore::connect(&target, 4, Duration::from_secs(10), "dedup:");
    let store = Arc::new(store.await.expect("connect"));
    let body: Bytes = (0..4_000_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    let ttl = Duration::from_secs(30);
    let keys = || (0..12).map(|i| format!("big:{i}"));
    let mut completes = tokio::task::JoinSet::new();
    for key in keys() {
        let (store, body) = (Arc::clone(&store), body.clone());
        completes.spawn(async move {
            let owner = Token::generate();
            assert_eq!(store.claim(&key, owner, 1, ttl).await.expect("claim"), Claim::Claimed);
            let reply = dedup_gateway::store::StoredResponse {
                status: http::StatusCode::OK,
                content_type: None,
                content_encoding: None,
                body,
            };
            let completion = Completion {
                first_seen_ms: 1,
                ttl,
                response: Some(reply),
            };
            store.complete(&key, owner, completion).await.expect("complete")
        });
    }
    assert!(completes.join_all().await.into_iter().all(|done| done));
    let mut reads = tokio::task::JoinSet::new();
    for key in keys() {
        let store = Arc::clone(&store);
        reads.spawn(async move { store.claim(&key, Token::generate(), 2, ttl).await });
    }
    for found in reads.join_all().await {
        match found.expect("claim") {
            Claim::Found(dedup_gateway::store::Marker::Completed { response: Some(r), .. }) => {
                assert!(r.body == body, "the body came back changed ({} bytes)", r.body.len());
            }
            other => panic!("expected the completed marker, got {other:?}"),
        }
    }
    let after = store.claim("small", Token::generate(), 3, ttl).await;
    assert_eq!(after.expect("claim"), Claim::Claimed);
}

fn pttl(server: &RedisServer, key: &str) -> i64 {
    server.cli(&["PTTL", key]).trim().parse().expect("PTTL")
}

#[tokio::test]
async fn duplicates_never_refresh_a_ttl_and_markers_expire() {
    let server = RedisServer::start().await;
    let store = redis_store(server.url()).await;
    let owner = Token::generate();
    store
        .claim("ttl:k", owner, 1, Duration::from_secs(10))
        .await
        .expect("claim");
    let before = pttl(&server, "ttl:k");
    assert!(before > 0 && before <= 10_000, "{before}");
    store
        .claim("ttl:k", Token::generate(), 2, Duration::from_secs(60))
        .await
        .expect("dup claim");
    assert!(
        pttl(&server, "ttl:k") <= before,
        "a duplicate claim must not extend PROCESSING"
    );

    let completed = Completion {
        first_seen_ms: 1,
        ttl: Duration::from_secs(20),
        response: None,
    };
    assert!(store.complete("ttl:k", owner, completed).await.expect("complete"));
    let done = pttl(&server, "ttl:k");
    assert!(done > 10_000 && done <= 20_000, "COMPLETED gets completed_ttl: {done}");
    store
        .claim("ttl:k", Token::generate(), 3, Duration::from_secs(60))
        .await
        .expect("dup claim");
    assert!(pttl(&server, "ttl:k") <= done);

    store
        .claim("ttl:short", Token::generate(), 1, Duration::from_millis(200))
        .await
        .expect("claim");
    within("the PROCESSING marker to expire", async {
        while store.get("ttl:short").await.expect("get").is_some() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(
        store
            .claim("ttl:short", Token::generate(), 2, Duration::from_secs(1))
            .await
            .expect("claim"),
        Claim::Claimed
    );
}

/// Commands and how many calls of each, as [`store_commands`] gives them.
fn counts(calls: &[(&str, u64)]) -> BTreeMap<String, u64> {
    calls.iter().map(|(c, n)| ((*c).to_owned(), *n)).collect()
}

/// Only the commands the store issues (the readiness PING, INFO and connection setup
/// are not message costs).
pub(crate) fn store_commands(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    after
        .iter()
        .filter(|(cmd, _)| {
            matches!(
                cmd.as_str(),
                "set" | "get" | "del" | "delex" | "eval" | "evalsha" | "script|load"
            )
        })
        .map(|(cmd, n)| (cmd.clone(), n - before.get(cmd).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// Posts message `id` to /hook: the reply, and the store commands it cost.
async fn post_counted(server: &RedisServer, client: &Client, id: &str) -> (Resp, BTreeMap<String, u64>) {
    let before = server.command_calls();
    let reply = client.post("/hook", &msg(id)).await;
    (reply, store_commands(&before, &server.command_calls()))
}

#[tokio::test]
async fn a_new_message_costs_two_round_trips_and_a_duplicate_one() {
    let server = RedisServer::start().await;
    let upstream = Upstream::ok().await;
    let gw = TestGateway::start(&redis_cfg(&server.url()), &upstream).await;
    let client = gw.client();

    let (r, cost) = post_counted(&server, &client, "rt1").await;
    assert_eq!(r.dedup(), "forwarded");
    // Round trips: SET NX GET (claim) and EVALSHA (complete). Redis also counts the
    // GET and SET the script runs inside, without a round trip.
    assert_eq!(cost, counts(&[("evalsha", 1), ("get", 1), ("set", 2)]));

    let (r, cost) = post_counted(&server, &client, "rt1").await;
    assert_eq!(r.dedup(), "duplicate");
    assert_eq!(cost, counts(&[("set", 1)]), "a duplicate is one SET NX GET");
}

/// On a server with `SET ... IFEQ`, complete is that one command: no script runs, and
/// the marker still becomes COMPLETED only from the owner's PROCESSING.
#[tokio::test]
async fn on_valkey_8_1_a_complete_is_one_set_if_eq_and_no_script() {
    a_complete_is_one_set_if_eq_and_no_script(RedisServer::start_valkey().await).await;
}

#[tokio::test]
async fn on_redis_8_4_a_complete_is_one_set_if_eq_and_no_script() {
    a_complete_is_one_set_if_eq_and_no_script(RedisServer::start_redis8().await).await;
}

async fn a_complete_is_one_set_if_eq_and_no_script(server: RedisServer) {
    let upstream = Upstream::ok().await;
    let gw = TestGateway::start(&redis_cfg(&server.url()).route("replay = true"), &upstream).await;
    let client = gw.client();

    let (r, cost) = post_counted(&server, &client, "if1").await;
    assert_eq!(r.dedup(), "forwarded");
    // Round trips: SET NX GET (claim) and SET IFEQ (complete); nothing inside them.
    assert_eq!(cost, counts(&[("set", 2)]));
    let value: serde_json::Value = serde_json::from_str(server.cli(&["GET", "dedup:bot:if1"]).trim()).expect("JSON");
    assert_eq!(value["state"], "completed");
    assert_eq!(value["response"]["body"], r#"{"reply":"ok if1"}"#);
    let ttl = pttl(&server, "dedup:bot:if1");
    assert!(ttl > 23 * 3600 * 1000, "COMPLETED gets completed_ttl (24h): {ttl}");

    let r = client.post("/hook", &msg("if1")).await;
    assert_eq!((r.dedup(), r.body.as_str()), ("replayed", r#"{"reply":"ok if1"}"#));
    assert_eq!(upstream.count(), 1);
    assert_eq!(gw.metric(r#"dedup_store_errors_total{op="complete"}"#), 0.0);
}

/// The gateway started on Valkey 8.1 (complete by `SET IFEQ`); the server behind the URL
/// is then a Redis 7 (a failover to an older node, a downgrade). Its first complete is
/// refused as a syntax error, which changes nothing, and is made with the script
/// instead; every complete after that goes straight to the script.
#[tokio::test]
async fn a_server_without_set_if_eq_after_the_start_gets_the_script() {
    let mut server = RedisServer::start_valkey().await;
    let upstream = Upstream::ok().await;
    let gw = TestGateway::start(&redis_cfg(&server.url()), &upstream).await;
    let client = gw.client();
    let (r, cost) = post_counted(&server, &client, "dg1").await;
    assert_eq!(r.dedup(), "forwarded");
    assert_eq!(cost, counts(&[("set", 2)]), "SET IFEQ at first");

    server.restart_as("redis-server".into()).await;
    assert!(!server.cli(&["INFO", "server"]).contains("valkey_version"));
    wait_ready(&Client::http1(gw.admin.expect("admin")), 200).await;
    let r = client.post("/hook", &msg("dg2")).await;
    assert_eq!((r.status.as_u16(), r.dedup()), (200, "forwarded"), "{r:?}");
    let value: serde_json::Value = serde_json::from_str(server.cli(&["GET", "dedup:bot:dg2"]).trim()).expect("JSON");
    assert_eq!(
        value["state"], "completed",
        "completed by the script after IFEQ was refused"
    );
    assert_eq!(client.post("/hook", &msg("dg2")).await.dedup(), "duplicate");

    let (r, cost) = post_counted(&server, &client, "dg3").await;
    assert_eq!(r.dedup(), "forwarded");
    assert_eq!(
        cost,
        counts(&[("evalsha", 1), ("get", 1), ("set", 2)]),
        "no more SET IFEQ: the claim and the script (its GET and SET inside)"
    );
    assert_eq!(upstream.count(), 3);
    assert_eq!(gw.metric(r#"dedup_store_errors_total{op="complete"}"#), 0.0);
}

/// An upstream that fails (500) the messages whose id starts with "fail", so that their
/// owners release the claim.
async fn failing_upstream() -> Upstream {
    Upstream::with(|r| async move {
        let id = r.msg_id().unwrap_or_default();
        Reply::new(
            if id.starts_with("fail") { 500 } else { 200 },
            format!("{{\"reply\":\"{id}\"}}"),
        )
    })
    .await
}

/// On Redis >= 8.4 a release is one `DELEX ... IFEQ`: no script, and the retry is
/// forwarded again (the marker is gone).
#[tokio::test]
async fn on_redis_8_4_a_release_is_one_delex_and_no_script() {
    let server = RedisServer::start_redis8().await;
    let upstream = failing_upstream().await;
    let gw = TestGateway::start(&redis_cfg(&server.url()), &upstream).await;
    let client = gw.client();

    let (r, cost) = post_counted(&server, &client, "fail-rl1").await;
    assert_eq!((r.status.as_u16(), r.dedup()), (500, "forwarded"), "{r:?}");
    assert_eq!(cost, counts(&[("delex", 1), ("set", 1)]), "SET NX GET, then DELEX IFEQ");
    assert_eq!(server.cli(&["EXISTS", "dedup:bot:fail-rl1"]).trim(), "0", "released");
    let (r, _) = post_counted(&server, &client, "fail-rl1").await;
    assert_eq!(
        (r.status.as_u16(), r.dedup()),
        (500, "forwarded"),
        "the retry is processed again"
    );
    assert_eq!(upstream.count(), 2);
    assert_eq!(gw.metric(r#"dedup_store_errors_total{op="release"}"#), 0.0);
}

/// The gateway started on Redis 8.6 (release by `DELEX`); the server behind the URL is
/// then a Redis 7, which does not know the command. That release is made with the
/// script instead, and so is every release after it.
#[tokio::test]
async fn a_server_without_delex_after_the_start_gets_the_script() {
    let mut server = RedisServer::start_redis8().await;
    let upstream = failing_upstream().await;
    let gw = TestGateway::start(&redis_cfg(&server.url()), &upstream).await;
    let client = gw.client();
    let (_, cost) = post_counted(&server, &client, "fail-dx1").await;
    assert_eq!(cost, counts(&[("delex", 1), ("set", 1)]), "DELEX at first");

    server.restart_as("redis-server".into()).await;
    assert!(server.cli(&["INFO", "server"]).contains("redis_version:7."));
    wait_ready(&Client::http1(gw.admin.expect("admin")), 200).await;
    let r = client.post("/hook", &msg("fail-dx2")).await;
    assert_eq!((r.status.as_u16(), r.dedup()), (500, "forwarded"), "{r:?}");
    assert_eq!(
        server.cli(&["EXISTS", "dedup:bot:fail-dx2"]).trim(),
        "0",
        "released by the script after DELEX was refused"
    );

    let (r, cost) = post_counted(&server, &client, "fail-dx3").await;
    assert_eq!(r.status.as_u16(), 500);
    assert_eq!(
        cost,
        counts(&[("del", 1), ("evalsha", 1), ("get", 1), ("set", 1)]),
        "no more DELEX: the claim and the script (its GET and DEL inside)"
    );
    assert_eq!(upstream.count(), 3);
    assert_eq!(gw.metric(r#"dedup_store_errors_total{op="release"}"#), 0.0);
}

/// A Redis that lost its scripts (a restart, a `SCRIPT FLUSH`) answers the complete's
/// EVALSHA with NOSCRIPT: the gateway loads the script and sends it again, so the marker
/// still becomes COMPLETED and the retry is a duplicate.
#[tokio::test]
async fn a_complete_after_the_scripts_were_flushed_loads_them_again() {
    let server = RedisServer::start().await;
    let upstream = Upstream::ok().await;
    let gw = TestGateway::start(&redis_cfg(&server.url()), &upstream).await;
    let client = gw.client();
    assert_eq!(server.cli(&["SCRIPT", "FLUSH"]).trim(), "OK");
    let (r, cost) = post_counted(&server, &client, "sf1").await;
    assert_eq!(r.dedup(), "forwarded");
    let value: serde_json::Value = serde_json::from_str(server.cli(&["GET", "dedup:bot:sf1"]).trim()).expect("JSON");
    assert_eq!(value["state"], "completed");
    // The claim; the complete's EVALSHA refused, SCRIPT LOAD, the EVALSHA again (which
    // runs a GET and a SET).
    let expected = counts(&[("evalsha", 2), ("get", 1), ("script|load", 1), ("set", 2)]);
    assert_eq!(cost, expected);
    assert_eq!(client.post("/hook", &msg("sf1")).await.dedup(), "duplicate");
    assert_eq!(upstream.count(), 1);
    assert_eq!(gw.metric(r#"dedup_store_errors_total{op="complete"}"#), 0.0);
}

#[tokio::test]
async fn a_claim_whose_reply_is_lost_still_forwards_exactly_once() {
    let server = RedisServer::start().await;
    let proxy = SwallowingProxy::start(server.addr()).await;
    let upstream = Upstream::ok().await;
    let gw = TestGateway::start(&redis_cfg(&proxy.url()), &upstream).await;
    let client = gw.client();
    proxy.arm(1);
    let r = client.post("/hook", &msg("lost")).await;
    assert_eq!((r.status.as_u16(), r.dedup()), (200, "forwarded"), "{r:?}");
    assert_eq!(
        proxy.swallowed.load(Ordering::SeqCst),
        1,
        "the claim's reply was really dropped"
    );
    assert_eq!(upstream.count(), 1);
    assert_eq!(client.post("/hook", &msg("lost")).await.dedup(), "duplicate");
    assert_eq!(upstream.count(), 1);
    assert_eq!(gw.metric(r#"dedup_store_errors_total{op="claim"}"#), 1.0);
}

/// Markers written by hand (`redis-cli SET`), in shapes a gateway does not write: a
/// PROCESSING one with a foreign token or another field order is held (409, never
/// forwarded, even with on_error = "forward", and not forgotten without force); a
/// COMPLETED one without `first_seen_ms` is a duplicate; a value that is no marker at
/// all is held too.
#[tokio::test]
async fn markers_written_by_hand_are_read_as_held_or_done_never_forwarded_past() {
    let server = RedisServer::start().await;
    let upstream = Upstream::ok().await;
    let cfg = redis_cfg(&server.url())
        .store("on_error = \"forward\"")
        .route("on_in_flight = \"conflict\"");
    let gw = TestGateway::start(&cfg, &upstream).await;
    let client = gw.client();
    let admin = Client::http1(gw.admin.expect("admin"));
    for (id, value) in [
        (
            "foreign",
            r#"{"state":"processing","token":"someone-else","first_seen_ms":1}"#,
        ),
        (
            "reordered",
            r#"{"first_seen_ms":1,"token":"00000000000000000000000000000001","state":"processing"}"#,
        ),
        ("not-json", "1"),
    ] {
        server.cli(&["SET", &format!("dedup:bot:{id}"), value, "PX", "60000"]);
        let r = client.post("/hook", &msg(id)).await;
        assert_eq!((r.status.as_u16(), r.dedup()), (409, "in-flight"), "{id}: {r:?}");
        let r = admin.send(Method::DELETE, &format!("/keys/bot/{id}"), &[], "").await;
        assert_eq!(r.status, 409, "{id}: not forgotten without force: {}", r.body);
        assert!(
            server.cli(&["EXISTS", &format!("dedup:bot:{id}")]).contains('1'),
            "{id}"
        );
    }
    server.cli(&["SET", "dedup:bot:done", r#"{"state":"completed"}"#, "PX", "60000"]);
    assert_eq!(client.post("/hook", &msg("done")).await.dedup(), "duplicate");
    assert_eq!(upstream.count(), 0);
    let r = admin
        .send(Method::DELETE, "/keys/bot/foreign?force=true", &[], "")
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(client.post("/hook", &msg("foreign")).await.dedup(), "forwarded");
}

#[tokio::test]
async fn readiness_follows_redis_and_recovers_by_itself() {
    let mut server = RedisServer::start().await;
    let upstream = Upstream::ok().await;
    let gw = TestGateway::start(&redis_cfg(&server.url()), &upstream).await;
    let admin = Client::http1(gw.admin.expect("admin"));
    let ready = |admin: Client| async move { admin.send(Method::GET, "/readyz", &[], "").await.status.as_u16() };
    assert_eq!(ready(admin.clone()).await, 200);
    server.kill();
    wait_ready(&admin, 503).await;
    let r = gw.client().post("/hook", &msg("down")).await;
    assert_eq!((r.status.as_u16(), r.dedup()), (503, "store-unavailable"));
    assert_eq!(r.headers["retry-after"], "1");
    server.restart().await;
    wait_ready(&admin, 200).await;
    // The readiness write leaves no key behind: Redis holds markers only.
    let checks = || server.command_calls().get("psetex").copied().unwrap_or(0);
    let seen = checks();
    eventually("two more readiness writes", || checks() >= seen + 2).await;
    assert_eq!(server.cli(&["DBSIZE"]).trim(), "0");
    assert_eq!(gw.client().post("/hook", &msg("down")).await.dedup(), "forwarded");
    assert_eq!(server.cli(&["DBSIZE"]).trim(), "1");
}

/// Polls `fut` once, with a waker that does nothing: whether it is ready now.
fn ready_now<F: Future>(fut: std::pin::Pin<&mut F>) -> bool {
    fut.poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
        .is_ready()
}

/// Redis has nothing to wake a waiter by, so a wait polls (5 ms at first, up to
/// 200 ms). A holder in the same process wakes its waiters the moment it completes or
/// releases; a holder elsewhere (another token) wakes nobody, and the wait runs out.
#[tokio::test]
async fn a_holder_in_this_process_wakes_its_waiters_when_it_completes_or_releases() {
    let server = RedisServer::start().await;
    let store = redis_store(server.url()).await;
    let long = Duration::from_secs(60); // the poll waits its longest (200 ms)
    let (a, b) = (Token::generate(), Token::generate());
    for (key, token) in [("dedup:wake-a", a), ("dedup:wake-b", b)] {
        assert_eq!(store.claim(key, token, 1, long).await.expect("claim"), Claim::Claimed);
    }
    let mut on_a = std::pin::pin!(store.wait("dedup:wake-a", a, 10, long));
    let mut on_b = std::pin::pin!(store.wait("dedup:wake-b", b, 10, long));
    assert!(!ready_now(on_a.as_mut()) && !ready_now(on_b.as_mut()), "waiting");
    let done = Completion {
        first_seen_ms: 1,
        ttl: long,
        response: None,
    };
    assert!(store.complete("dedup:wake-a", a, done).await.expect("complete"));
    assert!(ready_now(on_a.as_mut()), "woken by its holder's complete");
    assert!(!ready_now(on_b.as_mut()), "another holder's complete wakes nobody else");
    assert!(store.release("dedup:wake-b", b, 1).await.expect("release"));
    assert!(ready_now(on_b.as_mut()), "woken by its holder's release");
}

/// A Redis restarted while the gateway idles: every connection saw its peer go, and
/// none is sent on again (each lane opens a fresh connection as it is next used), so
/// not one store call after the restart fails. (Before, the first call on each lane
/// failed as lost, was counted and logged as a store error, and was repeated; and a
/// lost complete or release is not repeated.)
#[tokio::test]
async fn a_redis_restarted_while_the_gateway_idles_costs_no_request() {
    let mut server = RedisServer::start().await;
    let upstream = Upstream::ok().await;
    let gw = TestGateway::start(&redis_cfg(&server.url()), &upstream).await;
    let client = gw.client();
    for i in 0..10 {
        assert_eq!(
            client.post("/hook", &msg(&format!("before-{i}"))).await.dedup(),
            "forwarded"
        );
    }
    server.restart().await;
    for i in 0..40 {
        let r = client.post("/hook", &msg(&format!("after-{i}"))).await;
        assert_eq!(
            (r.status.as_u16(), r.dedup()),
            (200, "forwarded"),
            "request {i} after the restart"
        );
    }
    assert_eq!(upstream.count(), 50);
    for op in ["claim", "complete"] {
        let errors = format!(r#"dedup_store_errors_total{{op="{op}"}}"#);
        assert_eq!(gw.metric(&errors), 0.0, "{op}");
    }
}

async fn wait_ready(admin: &Client, status: u16) {
    within(&format!("/readyz {status}"), async {
        while admin.send(Method::GET, "/readyz", &[], "").await.status.as_u16() != status {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

#[tokio::test]
async fn replicas_wait_for_each_other_and_take_over_when_the_owner_fails() {
    let server = RedisServer::start().await;
    let gate = Gate::new();
    let g = gate.clone();
    let calls = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&calls);
    // First call for each id waits at the gate; "fail-*" ids then fail with 500.
    let upstream = Upstream::with(move |r| {
        let g = g.clone();
        let n = c.fetch_add(1, Ordering::SeqCst);
        async move {
            let id = r.msg_id().unwrap_or_default();
            if n < 2 {
                g.pass().await;
            }
            if n < 2 && id.starts_with("fail") {
                Reply::new(500, "boom")
            } else {
                Reply::new(200, format!("bot says {id}"))
            }
        }
    })
    .await;
    let cfg = redis_cfg(&server.url())
        .route("replay = true")
        .route("in_flight_wait = \"10s\"");
    let a = TestGateway::start(&cfg, &upstream).await;
    let b = TestGateway::start(&cfg, &upstream).await;

    let (ca, cb) = (a.client(), b.client());
    let owner_ok = tokio::spawn(async move { ca.post("/hook", &msg("ok-1")).await });
    upstream.wait_for(1).await;
    let ca = a.client();
    let owner_fail = tokio::spawn(async move { ca.post("/hook", &msg("fail-1")).await });
    upstream.wait_for(2).await;
    let cb2 = cb.clone();
    let waiter_ok = tokio::spawn(async move { cb2.post("/hook", &msg("ok-1")).await });
    let waiter_fail = tokio::spawn(async move { cb.post("/hook", &msg("fail-1")).await });
    eventually("both duplicates to reach replica B", || {
        b.metric(r#"dedup_duplicate_age_seconds_count{route="bot"}"#) >= 2.0
    })
    .await;
    gate.open(2);

    let (o1, o2) = (owner_ok.await.expect("o1"), owner_fail.await.expect("o2"));
    assert_eq!((o1.dedup(), o1.body.as_str()), ("forwarded", "bot says ok-1"));
    assert_eq!((o2.status.as_u16(), o2.dedup()), (500, "forwarded"));
    let w1 = within("waiter 1", waiter_ok).await.expect("w1");
    assert_eq!(
        (w1.dedup(), w1.body.as_str()),
        ("replayed", "bot says ok-1"),
        "B answers with A's bot reply"
    );
    let w2 = within("waiter 2", waiter_fail).await.expect("w2");
    assert_eq!(
        (w2.status.as_u16(), w2.dedup(), w2.body.as_str()),
        (200, "forwarded", "bot says fail-1"),
        "B took over"
    );
    let ids: Vec<String> = upstream.received().iter().filter_map(|r| r.msg_id()).collect();
    assert_eq!(ids.iter().filter(|i| *i == "ok-1").count(), 1);
    assert_eq!(
        ids.iter().filter(|i| *i == "fail-1").count(),
        2,
        "delivered again only because the first failed"
    );
}

/// A xorshift shuffle: reproducible, no extra dependency.
pub fn shuffle<T>(items: &mut [T], mut seed: u64) {
    for i in (1..items.len()).rev() {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        items.swap(i, (seed % (i as u64 + 1)) as usize);
    }
}

/// Sends `copies` of each id, shuffled, across the gateways with `parallel` requests in
/// flight; returns the answers' `x-dedup-status` counts.
pub async fn spray(gateways: &[Client], ids: usize, copies: usize, parallel: usize) -> HashMap<String, usize> {
    let mut work: Vec<(usize, usize)> = (0..ids).flat_map(|id| (0..copies).map(move |c| (id, c))).collect();
    shuffle(&mut work, 0x9E37_79B9_7F4A_7C15);
    let work = Arc::new(std::sync::Mutex::new(work));
    let mut workers = Vec::new();
    for w in 0..parallel {
        let work = Arc::clone(&work);
        let gateways = gateways.to_vec();
        workers.push(tokio::spawn(async move {
            let mut seen: HashMap<String, usize> = HashMap::new();
            let mut n = w;
            loop {
                let Some((id, _)) = work.lock().expect("work").pop() else {
                    return seen;
                };
                let client = &gateways[n % gateways.len()];
                n += 1;
                let r = client.post("/hook", &msg(&format!("id-{id}"))).await;
                assert_eq!(r.status, 200, "{r:?}");
                *seen.entry(r.dedup().to_owned()).or_default() += 1;
            }
        }));
    }
    let mut total: HashMap<String, usize> = HashMap::new();
    for w in workers {
        for (k, v) in within("the spray to finish", w).await.expect("worker") {
            *total.entry(k).or_default() += v;
        }
    }
    total
}

pub fn assert_each_delivered_once(upstream: &Upstream, ids: usize) {
    let mut per_id: HashMap<String, usize> = HashMap::new();
    for r in upstream.received() {
        *per_id.entry(r.msg_id().expect("id")).or_default() += 1;
    }
    assert_eq!(per_id.len(), ids, "every id delivered");
    let twice: Vec<_> = per_id.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "delivered more than once: {twice:?}");
}

pub async fn slightly_slow_upstream() -> Upstream {
    Upstream::with(|r| async move {
        tokio::time::sleep(Duration::from_millis(3)).await;
        Reply::new(200, r.msg_id().unwrap_or_default())
    })
    .await
}

/// Three gateway processes on `cfg`; 3000 ids x 4 copies, shuffled and sent concurrently
/// across them: each id reaches the upstream once, and 3000 answers say "forwarded".
async fn three_gateways_deliver_each_of_3000_ids_once(cfg: &Cfg, upstream: &Upstream) {
    let mut clients = Vec::new();
    let mut processes = Vec::new();
    for _ in 0..3 {
        let p = GatewayProcess::start(&cfg.toml(&upstream.url())).await;
        clients.push(Client::http1(p.addr));
        processes.push(p);
    }
    let outcomes = spray(&clients, 3000, 4, 96).await;
    assert_each_delivered_once(upstream, 3000);
    assert_eq!(outcomes.get("forwarded"), Some(&3000), "{outcomes:?}");
    assert_eq!(outcomes.values().sum::<usize>(), 12_000);
}

#[tokio::test]
async fn three_gateway_processes_sharing_one_redis_deliver_each_id_once() {
    let server = RedisServer::start().await;
    let upstream = slightly_slow_upstream().await;
    let cfg = redis_cfg(&server.url())
        .store(LOADED_STORE_TIMEOUT)
        .route(LOADED_PROCESSING_TTL)
        .route("in_flight_wait = \"10s\"");
    three_gateways_deliver_each_of_3000_ids_once(&cfg, &upstream).await;
}

/// A Redis that does not answer at start: the process serves, not ready, and says
/// why (the start itself is tested in `edges`). One that refuses the password is a
/// config mistake: exit 1. An evicting one gets a warning.
#[tokio::test]
async fn starts_not_ready_without_redis_refuses_a_wrong_password_and_warns_about_evicting_redis() {
    let dead = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("redis://{}/0", dead.local_addr().expect("addr"));
    drop(dead);
    let p = GatewayProcess::start(&redis_cfg(&url).toml("http://127.0.0.1:9")).await;
    let admin = Client::http1(p.admin.expect("admin"));
    wait_ready(&admin, 503).await;
    let logs = p.logs.lock().expect("logs").join("\n");
    assert!(logs.contains("redis not reachable at start"), "{logs}");
    drop(p);

    let locked = RedisServer::start().await;
    locked.cli(&["CONFIG", "SET", "requirepass", "right"]);
    let wrong = format!("redis://:wrong@127.0.0.1:{}/0", locked.port);
    let cfg = crate::support::TempFile::new("g.toml", &redis_cfg(&wrong).toml("http://127.0.0.1:9"));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dedup-gateway"))
        .arg("--config")
        .arg(&cfg.0)
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("store") && !stderr.contains("wrong@"), "{stderr}");

    let server = RedisServer::start_with(&["--maxmemory-policy", "allkeys-lru"]).await;
    let p = GatewayProcess::start(&redis_cfg(&server.url()).toml("http://127.0.0.1:9")).await;
    let logs = p.logs.lock().expect("logs").join("\n");
    assert!(
        logs.contains("maxmemory-policy is allkeys-lru, not noeviction"),
        "{logs}"
    );
}

#[tokio::test]
async fn gateways_on_a_redis_cluster_deliver_each_id_once_with_keys_on_every_node() {
    let cluster = RedisCluster::start().await;
    let upstream = slightly_slow_upstream().await;
    let cfg = Cfg::new()
        .store("backend = \"redis\"")
        .store(&cluster.seeds_toml())
        .store(LOADED_STORE_TIMEOUT)
        .route(LOADED_PROCESSING_TTL)
        .route("in_flight_wait = \"10s\"");
    three_gateways_deliver_each_of_3000_ids_once(&cfg, &upstream).await;
    for node in &cluster.nodes {
        let keys: u64 = node.cli(&["DBSIZE"]).trim().parse().expect("DBSIZE");
        assert!(keys > 500, "node {} holds only {keys} keys", node.port);
    }
}

/// A slot half-way through a migration (the resharding an operator runs on a live
/// cluster): keys not yet on the old node are redirected with ASK. Claims arriving
/// together are each followed to the new node, none answered 503, and their
/// duplicates are answered from there.
#[tokio::test]
async fn claims_in_a_migrating_slot_all_reach_the_importing_node() {
    let cluster = RedisCluster::start().await;
    let upstream = Upstream::ok().await;
    let cfg = Cfg::new().store("backend = \"redis\"").store(&cluster.seeds_toml());
    let gw = TestGateway::start(&cfg, &upstream).await;

    let (slot, ids) = ids_in_one_slot("m", 64);
    let from = cluster.owner_of(slot).expect("the owner");
    let to = cluster
        .nodes
        .iter()
        .find(|n| n.port != from.port)
        .expect("another node");
    let slot = slot.to_string();
    assert!(
        to.cli(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &from.node_id()])
            .contains("OK")
    );
    assert!(
        from.cli(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &to.node_id()])
            .contains("OK")
    );

    for expected in ["forwarded", "duplicate"] {
        let mut sends = tokio::task::JoinSet::new();
        for id in &ids {
            let (client, body) = (gw.client(), msg(id));
            sends.spawn(async move { client.post("/hook", &body).await.dedup().to_owned() });
        }
        let answers = sends.join_all().await;
        let unexpected: Vec<&String> = answers.iter().filter(|a| *a != expected).collect();
        assert!(unexpected.is_empty(), "expected {expected}, got {unexpected:?}");
    }
    assert_eq!(upstream.count(), ids.len());
    let moved: usize = to.cli(&["DBSIZE"]).trim().parse().expect("DBSIZE");
    assert!(moved >= ids.len(), "the new keys are on the importing node: {moved}");
}

/// A cluster node down: each request whose key lives there is logged once, by the
/// gateway, with route and key; the client library's warning for every failed attempt
/// to reach the node (thousands of lines a minute) stays out of the log.
#[tokio::test]
async fn a_dead_cluster_node_is_logged_once_per_request_not_per_reconnect() {
    let mut cluster = RedisCluster::start().await;
    let upstream = Upstream::ok().await;
    let cfg = Cfg::new().store("backend = \"redis\"").store(&cluster.seeds_toml());
    let gw = GatewayProcess::start(&cfg.toml(&upstream.url())).await;
    let client = Client::http1(gw.addr);
    let (slot, ids) = ids_in_one_slot("d", 8);
    let victim = cluster.owner_of(slot).expect("the owner").port;
    cluster
        .nodes
        .iter_mut()
        .find(|n| n.port == victim)
        .expect("victim")
        .kill();

    for id in &ids {
        assert_eq!(client.post("/hook", &msg(id)).await.dedup(), "store-unavailable");
    }
    // The log is read from the child's stderr as it comes: wait for the last warning.
    let logged = |id: &str, logs: &str| {
        let key = format!("dedup:bot:{id}\"");
        logs.lines()
            .filter(|l| l.contains("store unavailable") && l.contains(&key))
            .count()
    };
    let last = ids.last().expect("ids");
    eventually("the last request's warning", || {
        logged(last, &gw.logs.lock().expect("logs").join("\n")) > 0
    })
    .await;
    let logs = gw.logs.lock().expect("logs").join("\n");
    for id in &ids {
        assert_eq!(logged(id, &logs), 1, "{id} logged once:\n{logs}");
    }
    assert!(!logs.contains("Failed to connect"), "{logs}");
}

/// A cluster serving on with a node down (`cluster-require-full-coverage no`): the
/// gateway stays ready whichever node it is, since the others' keys still take writes
/// (`/readyz` turns 503 only while every store write fails); with every node down
/// it is not ready.
#[tokio::test]
async fn a_cluster_with_a_node_down_stays_ready_and_with_all_down_is_not() {
    let mut cluster = RedisCluster::start().await;
    for node in &cluster.nodes {
        assert!(
            node.cli(&["CONFIG", "SET", "cluster-require-full-coverage", "no"])
                .contains("OK")
        );
    }
    let upstream = Upstream::ok().await;
    let cfg = Cfg::new().store("backend = \"redis\"").store(&cluster.seeds_toml());
    let gw = TestGateway::start(&cfg, &upstream).await;
    let admin = Client::http1(gw.admin.expect("admin"));
    wait_ready(&admin, 200).await;

    let pings = || gw.metric(r#"dedup_store_duration_seconds_count{op="ping"}"#);
    for down in 0..cluster.nodes.len() {
        cluster.nodes[down].kill();
        let seen = pings();
        // Four checks, 500 ms apart: past the 1.5 s a successful check counts for.
        eventually("four readiness checks after the kill", || pings() >= seen + 4.0).await;
        let ready = admin.send(Method::GET, "/readyz", &[], "").await.status;
        assert_eq!(ready, 200, "ready with node {down} of three down");
        let id = (0..)
            .map(|i| format!("alive-{down}-{i}"))
            .find(|id| cluster.owner_of(key_slot(&format!("dedup:bot:{id}"))).is_some())
            .expect("an id on a live node");
        // As a sender would: a node restarted in an earlier round may cost its first
        // call a broken connection (503, retried), never a wrong answer.
        let answer = within("an answer other than 503", async {
            loop {
                match gw.client().post("/hook", &msg(&id)).await.dedup() {
                    "store-unavailable" => tokio::time::sleep(Duration::from_millis(20)).await,
                    other => return other.to_owned(),
                }
            }
        });
        assert_eq!(answer.await, "forwarded");
        cluster.nodes[down].restart().await;
        cluster.await_ok().await;
    }

    for node in &mut cluster.nodes {
        node.kill();
    }
    wait_ready(&admin, 503).await;
}

#[tokio::test]
async fn a_redis_outage_is_answered_503_and_loses_nothing() {
    // appendfsync always: markers written before the crash survive it.
    let mut server = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]).await;
    let upstream = slightly_slow_upstream().await;
    let gw = TestGateway::start(&redis_cfg(&server.url()), &upstream).await;
    let client = gw.client();

    const IDS: usize = 400;
    // 0 = Redis up, 1 = killed, 2 = restarted.
    let phase = Arc::new(AtomicUsize::new(0));
    let answers = Arc::new(std::sync::Mutex::new(Vec::new()));
    let next = Arc::new(AtomicUsize::new(0));
    let mut senders = Vec::new();
    for _ in 0..16 {
        let (client, phase, answers, next) = (
            client.clone(),
            Arc::clone(&phase),
            Arc::clone(&answers),
            Arc::clone(&next),
        );
        senders.push(tokio::spawn(async move {
            loop {
                let id = next.fetch_add(1, Ordering::SeqCst);
                if id >= IDS {
                    return;
                }
                // A webhook sender: retry until the gateway says 2xx.
                loop {
                    let sent_in = phase.load(Ordering::SeqCst);
                    let r = client.post("/hook", &msg(&format!("o-{id}"))).await;
                    let answered_in = phase.load(Ordering::SeqCst);
                    let ok = r.status.is_success();
                    answers.lock().expect("answers").push((
                        sent_in,
                        answered_in,
                        id,
                        r.status.as_u16(),
                        r.dedup().to_owned(),
                    ));
                    if ok {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        }));
    }
    upstream.wait_for(100).await;
    server.kill();
    phase.store(1, Ordering::SeqCst);
    eventually("answers during the outage", || {
        answers
            .lock()
            .expect("answers")
            .iter()
            .filter(|a| a.0 == 1 && a.1 == 1)
            .count()
            >= 50
    })
    .await;
    // The outage ends before the restart starts: a request answered during the restart
    // may reach the new server, so only what the down server saw counts as phase 1.
    phase.store(2, Ordering::SeqCst);
    server.restart().await;
    for s in senders {
        within("the senders to finish", s).await.expect("sender");
    }

    let answers = answers.lock().expect("answers");
    let during: Vec<_> = answers.iter().filter(|a| a.0 == 1 && a.1 == 1).collect();
    assert!(during.len() >= 50);
    for (_, _, id, status, dedup) in &during {
        assert_eq!((*status, dedup.as_str()), (503, "store-unavailable"), "id {id}");
    }
    let delivered: std::collections::HashSet<String> = upstream.received().iter().filter_map(|r| r.msg_id()).collect();
    for (_, _, id, status, dedup) in answers.iter().filter(|a| (200..300).contains(&a.3)) {
        assert!(
            delivered.contains(&format!("o-{id}")),
            "id {id} answered {status} {dedup} but never delivered"
        );
    }
    assert_each_delivered_once(&upstream, IDS);
}

#[tokio::test]
async fn the_sender_gets_the_bots_answer_even_when_completing_fails() {
    let mut server = RedisServer::start().await;
    let gate = Gate::new();
    let upstream = Upstream::gated(&gate, "the bot's reply").await;
    let gw = TestGateway::start(&redis_cfg(&server.url()), &upstream).await;
    let client = gw.client();
    let sender = tokio::spawn(async move { client.post("/hook", &msg("cf")).await });
    upstream.wait_for(1).await;
    server.kill(); // claimed, forwarded; now the store is gone before the complete
    gate.open(1);
    let r = within("the answer", sender).await.expect("sender");
    assert_eq!(
        (r.status.as_u16(), r.dedup(), r.body.as_str()),
        (200, "forwarded", "the bot's reply")
    );
    assert!(gw.metric(r#"dedup_store_errors_total{op="complete"}"#) >= 1.0);
}

#[tokio::test]
async fn a_claim_that_may_have_landed_is_released_so_the_retry_does_not_wait_for_its_ttl() {
    let server = RedisServer::start().await;
    let proxy = SwallowingProxy::start(server.addr()).await;
    let upstream = Upstream::ok().await;
    let gw = TestGateway::start(&redis_cfg(&proxy.url()), &upstream).await;
    let client = gw.client();
    proxy.arm(2); // the claim and its repeat both land, and both replies are lost
    let r = client.post("/hook", &msg("orphan")).await;
    assert_eq!((r.status.as_u16(), r.dedup()), (503, "store-unavailable"));
    assert_eq!(proxy.swallowed.load(Ordering::SeqCst), 2);
    assert_eq!(upstream.count(), 0, "not delivered: the sender was told to retry");
    // The PROCESSING marker it left (processing_ttl 30 s) is released in the background.
    within("the orphaned claim to be released", async {
        while server.cli(&["EXISTS", "dedup:bot:orphan"]).trim() != "0" {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    crate::support::eventually("the release to be counted", || {
        gw.metric(r#"dedup_orphan_releases_total{result="released"}"#) == 1.0
    })
    .await;
    let retry = client.post("/hook", &msg("orphan")).await;
    assert_eq!((retry.status.as_u16(), retry.dedup()), (200, "forwarded"));
    assert_eq!(upstream.count(), 1);
}
