//! `check` on queued routes and the SQLite store: what it refuses (naming the key path
//! and the fix), what it warns about, what it prints.

use crate::servers::RedisServer;
use crate::support::{Cfg, assert_contains_each, check_accepts, check_refuses};

fn cfg(store: &[&str], route: &[&str]) -> String {
    let cfg = store.iter().fold(Cfg::new(), |c, l| c.store(l));
    route.iter().fold(cfg, |c, l| c.route(l)).toml("http://127.0.0.1:9")
}

#[test]
fn a_queued_route_needs_a_durable_store_that_refuses_what_it_cannot_store() {
    assert_contains_each(
        &check_refuses(&cfg(&[], &["delivery = \"queued\""])),
        &[
            "routes[0].delivery: \"queued\" needs a durable store for its queue: set store.backend = \"sqlite\"",
            "or \"redis\" (shared by replicas)",
        ],
    );
    let sqlite = "backend = \"sqlite\"\npath = \"/tmp/dedup-gateway-check/gateway.db\"";
    assert_contains_each(
        &check_refuses(&cfg(&[sqlite, "on_error = \"forward\""], &["delivery = \"queued\""])),
        &["routes[0].delivery: \"queued\" with store.on_error = \"forward\""],
    );
    assert_contains_each(
        &check_refuses(&cfg(&[sqlite], &["delivery = \"queued\"", "replay = true"])),
        &["routes[0].replay: not with delivery = \"queued\""],
    );
    assert_contains_each(
        &check_refuses(&cfg(&[sqlite], &["delivery = \"queued\"", "mode = \"shadow\""])),
        &["routes[0].mode: \"shadow\" forwards every request"],
    );
    assert_contains_each(
        &check_refuses(&cfg(
            &[sqlite],
            &[
                "delivery = \"queued\"",
                "retry_schedule = [\"5s\", \"soon\", \"0s\"]",
                "delivery_concurrency = 0",
                "max_queued = 0",
            ],
        )),
        &[
            "routes[0].retry_schedule[1]: invalid duration \"soon\"",
            "routes[0].retry_schedule[2]: must be greater than 0",
            "routes[0].delivery_concurrency: must be at least 1",
            "routes[0].max_queued: must be at least 1",
        ],
    );
    assert_contains_each(
        &check_refuses(&cfg(&["backend = \"sqlite\""], &[])),
        &["store.path: backend = \"sqlite\" needs path"],
    );
    assert_contains_each(
        &check_refuses(&cfg(&[sqlite, "fsync = \"sometimes\"", "url = \"redis://x\""], &[])),
        &["store.fsync", "store.url"],
    );
}

#[test]
fn check_prints_the_queue_and_warns_where_queued_delivery_changes_what_a_sender_gets() {
    let sqlite = "backend = \"sqlite\"\npath = \"/tmp/dedup-gateway-check/gateway.db\"\nfsync = \"never\"";
    let out = check_accepts(&cfg(
        &[sqlite],
        &[
            "delivery = \"queued\"",
            "retry_schedule = [\"10s\", \"1m\"]",
            "delivery_concurrency = 2",
            "max_queued = 500",
        ],
    ));
    assert_contains_each(
        &out,
        &[
            "store: sqlite /tmp/dedup-gateway-check/gateway.db (fsync never, max_bytes 1073741824)",
            "delivery queued: retry_schedule [10s, 1m], delivery_concurrency 2, max_queued 500",
        ],
    );
    let wechat = Cfg::new()
        .store(sqlite)
        .route("preset = \"wechat-mp\"\nsecret = \"t\"\ndelivery = \"queued\"")
        .toml("http://127.0.0.1:9");
    assert_contains_each(
        &check_accepts(&wechat),
        &["warning: routes[0].delivery: queued wechat-mp: the sender gets the ack, so a passive reply"],
    );
    let stripe = Cfg::new()
        .store(sqlite)
        .route("preset = \"stripe\"\nsecret = \"whsec_x\"\ndelivery = \"queued\"")
        .toml("http://127.0.0.1:9");
    assert_contains_each(
        &check_accepts(&stripe),
        &["warning: routes[0].delivery: queued stripe: the signature's timestamp goes with the message"],
    );
    let sync = check_accepts(&cfg(&[sqlite], &["retry_schedule = [\"10s\"]"]));
    assert_contains_each(
        &sync,
        &[
            "warning: routes[0].delivery: sync: retry_schedule, delivery_concurrency and max_queued are ignored",
            "delivery sync",
        ],
    );
}

/// A Redis that may lose what it holds: `check` says so for a queued route.
#[tokio::test]
async fn check_warns_when_redis_may_evict_or_has_no_persistence() {
    let lossy = RedisServer::start_with(&["--maxmemory-policy", "allkeys-lru"]).await;
    let toml = cfg(
        &["backend = \"redis\"", &format!("url = \"{}\"", lossy.url())],
        &["delivery = \"queued\""],
    );
    let out = tokio::task::spawn_blocking(move || check_accepts(&toml))
        .await
        .expect("check");
    assert_contains_each(
        &out,
        &[
            "warning: store: redis://127.0.0.1",
            "maxmemory-policy is allkeys-lru, not noeviction",
            "no persistence (appendonly no, no save points)",
        ],
    );
    let safe = RedisServer::start_with(&["--appendonly", "yes"]).await;
    let toml = cfg(
        &["backend = \"redis\"", &format!("url = \"{}\"", safe.url())],
        &["delivery = \"queued\""],
    );
    let out = tokio::task::spawn_blocking(move || check_accepts(&toml))
        .await
        .expect("check");
    assert!(!out.contains("warning: store"), "{out}");
}
