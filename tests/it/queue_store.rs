//! The `QueueStore` contract, run against SQLite, Redis and a Redis Cluster: what the
//! delivery workers rely on, and the markers an enqueue and a delivery leave.

use std::time::Duration;

use bytes::Bytes;
use dedup_gateway::config::Fsync;
use dedup_gateway::store::queue::{Enqueued, Lease, Leased, Message, Settled};
use dedup_gateway::store::{Claim, KeyState, Marker, QueueStore, SqliteStore, Store, Token, unix_ms};

use crate::servers::{RedisCluster, RedisServer};
use crate::store_contract::contract;
use crate::support::TempFile;

const RECLAIM: Duration = Duration::from_secs(30);

fn message(ns: &str, id: &str) -> Message {
    Message {
        id: id.to_owned(),
        key: Some(format!("dedup:{ns}:{id}")),
        token: Token::generate(),
        first_seen_ms: 1_700_000_000_000,
        queued_at_ms: unix_ms(),
        attempts: 0,
        method: "POST".into(),
        target: "/hook?x=1".into(),
        headers: Bytes::from_static(b"host: bot\r\ncontent-type: application/json\r\nx-bytes: caf\xe9\r\n"),
        body: Bytes::from(format!("{{\"msgId\":\"{id}\"}}")),
        last_error: None,
    }
}

async fn lease(store: &impl QueueStore, route: &str) -> Leased {
    match store.lease(route, unix_ms(), RECLAIM, 1).await.expect("lease") {
        Lease::Leased(mut leased) => {
            assert_eq!(leased.len(), 1, "at most the 1 asked for");
            leased.remove(0)
        }
        Lease::Idle { .. } => panic!("expected a message to lease"),
    }
}

async fn idle(store: &impl QueueStore, route: &str) -> Option<u64> {
    match store.lease(route, unix_ms(), RECLAIM, 8).await.expect("lease") {
        Lease::Idle { next_due_ms } => next_due_ms,
        Lease::Leased(leased) => panic!("expected nothing due, leased {:?}", leased[0].message.id),
    }
}

/// Append, lease, every way to settle, dead letters and the markers they leave.
/// `route` must be fresh (no other test uses it on this store).
pub async fn queue_contract(store: &(impl Store + QueueStore), route: &str) {
    let (a, b, c) = (message(route, "a"), message(route, "b"), message(route, "c"));
    let key = |m: &Message| m.key.clone().expect("key");
    for m in [&a, &b] {
        assert_eq!(
            store.enqueue(route, m, 2, RECLAIM).await.expect("enqueue"),
            Enqueued::Queued
        );
        assert_eq!(
            store.get(&key(m)).await.expect("get"),
            Some(Marker::Queued {
                first_seen_ms: m.first_seen_ms
            })
        );
    }
    assert_eq!(
        store.enqueue(route, &c, 2, RECLAIM).await.expect("enqueue"),
        Enqueued::Full,
        "max_queued 2"
    );
    assert_eq!(
        store.get(&key(&c)).await.expect("get"),
        None,
        "a full queue stores nothing"
    );
    assert_eq!(
        store.enqueue(route, &a, 2, RECLAIM).await.expect("enqueue"),
        Enqueued::Found(Marker::Queued {
            first_seen_ms: a.first_seen_ms
        }),
        "a held key is found, nothing stored again"
    );
    store.forget(&key(&a), true).await.expect("forget");
    assert_eq!(
        store.enqueue(route, &a, 2, RECLAIM).await.expect("enqueue"),
        Enqueued::Queued,
        "a held id without its marker is marked again, not stored twice (nor refused as full)"
    );
    let counts = store.counts(route, unix_ms()).await.expect("counts");
    assert_eq!((counts.ready, counts.total()), (2, 2), "{counts:?}");
    assert!(counts.oldest_queued_at_ms.is_some());
    assert_eq!(
        store
            .inspect(&key(&a))
            .await
            .expect("inspect")
            .map(|i| (i.state, i.ttl)),
        Some((KeyState::Queued, None)),
        "QUEUED never expires while its message is held"
    );

    // The oldest first, the request as stored, the attempt counted.
    let first = lease(store, route).await;
    assert_eq!(first.message.id, "a");
    assert_eq!(first.message.attempts, 1);
    assert_eq!(
        (first.message.headers.clone(), first.message.body.clone()),
        (a.headers.clone(), a.body.clone())
    );
    assert_eq!(
        (first.message.method.as_str(), first.message.target.as_str()),
        ("POST", "/hook?x=1")
    );
    assert_eq!(first.message.key, a.key);
    let second = lease(store, route).await;
    assert_eq!(second.message.id, "b");
    // Both are being delivered: nothing to take (SQLite names when their leases end).
    idle(store, route).await;
    let counts = store.counts(route, unix_ms()).await.expect("counts");
    assert_eq!((counts.ready, counts.delivering), (0, 2), "{counts:?}");

    // A retry: not due before its time, then due with its last error and attempt 2.
    let due = unix_ms() + 300;
    let retry = Settled::Retry {
        due_ms: due,
        error: "status 503".into(),
    };
    store.settle(route, &first, retry).await.expect("settle");
    let next = idle(store, route).await.expect("a retry is scheduled");
    assert!(next.abs_diff(due) <= 1, "{next} vs {due}");
    assert_eq!(store.counts(route, unix_ms()).await.expect("counts").scheduled, 1);
    tokio::time::sleep(Duration::from_millis(350)).await;
    let again = lease(store, route).await;
    assert_eq!((again.message.id.as_str(), again.message.attempts), ("a", 2));
    assert_eq!(again.message.last_error.as_deref(), Some("status 503"));

    // Delivered: COMPLETED, gone from the queue, room again.
    let delivered = Settled::Delivered {
        completed_ttl: Duration::from_secs(60),
    };
    store.settle(route, &again, delivered).await.expect("settle");
    match store.get(&key(&a)).await.expect("get") {
        Some(Marker::Completed { first_seen_ms, .. }) => assert_eq!(first_seen_ms, a.first_seen_ms),
        other => panic!("expected COMPLETED, found {other:?}"),
    }
    let ttl = store.inspect(&key(&a)).await.expect("inspect").and_then(|i| i.ttl);
    assert!(ttl.is_some_and(|t| t > Duration::from_secs(50)), "{ttl:?}");

    // Dead: kept, listed, its marker kept; retried with attempts reset; dropped for good.
    let dead = Settled::Dead {
        error: "status 400".into(),
    };
    store.settle(route, &second, dead).await.expect("settle");
    let letters = store.dead_letters(route, 10).await.expect("dead letters");
    assert_eq!(letters.len(), 1);
    assert_eq!((letters[0].id.as_str(), letters[0].attempts), ("b", 1));
    assert_eq!(letters[0].last_error.as_deref(), Some("status 400"));
    assert_eq!(letters[0].key, b.key);
    assert!(matches!(
        store.get(&key(&b)).await.expect("get"),
        Some(Marker::Queued { .. })
    ));
    let counts = store.counts(route, unix_ms()).await.expect("counts");
    assert_eq!((counts.dead, counts.total()), (1, 1), "{counts:?}");
    assert_eq!(
        store.enqueue(route, &c, 1, RECLAIM).await.expect("enqueue"),
        Enqueued::Full,
        "a dead letter counts against max_queued"
    );
    assert_eq!(
        store.retry_dead(route, Some("nope"), unix_ms()).await.expect("retry"),
        0
    );
    assert_eq!(store.retry_dead(route, None, unix_ms()).await.expect("retry"), 1);
    let revived = lease(store, route).await;
    assert_eq!(
        (revived.message.id.as_str(), revived.message.attempts),
        ("b", 1),
        "attempts reset"
    );
    store
        .settle(
            route,
            &revived,
            Settled::Dead {
                error: "status 410".into(),
            },
        )
        .await
        .expect("settle");
    assert!(!store.drop_dead(route, "a").await.expect("drop"), "no dead letter a");
    assert!(store.drop_dead(route, "b").await.expect("drop"));
    assert_eq!(
        store.get(&key(&b)).await.expect("get"),
        None,
        "dropping releases the marker"
    );
    assert!(store.dead_letters(route, 10).await.expect("dead").is_empty());
    assert_eq!(store.counts(route, unix_ms()).await.expect("counts").total(), 0);

    // Returned (shutdown): due again at once, as it was.
    assert_eq!(
        store.enqueue(route, &c, 2, RECLAIM).await.expect("enqueue"),
        Enqueued::Queued
    );
    let taken = lease(store, route).await;
    store.settle(route, &taken, Settled::Returned).await.expect("settle");
    let back = lease(store, route).await;
    assert_eq!(back.message.id, "c");
    store
        .settle(
            route,
            &back,
            Settled::Delivered {
                completed_ttl: Duration::from_secs(60),
            },
        )
        .await
        .expect("settle");
    assert!(matches!(
        store
            .claim(&key(&c), Token::generate(), 1, RECLAIM)
            .await
            .expect("claim"),
        Claim::Found(Marker::Completed { .. })
    ));

    // Taken and never settled (the call's reply lost, or its worker gone): taken over
    // once `reclaim_after` has passed (Redis looks once a second), the attempt counted.
    let d = message(route, "d");
    assert_eq!(
        store.enqueue(route, &d, 5, RECLAIM).await.expect("enqueue"),
        Enqueued::Queued
    );
    let short = Duration::from_millis(200);
    let lost = store.lease(route, unix_ms(), short, 1).await.expect("lease");
    assert!(matches!(&lost, Lease::Leased(l) if l[0].message.id == "d"));
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let again = match store.lease(route, unix_ms(), short, 1).await.expect("lease") {
        Lease::Leased(mut again) => again.remove(0),
        Lease::Idle { .. } => panic!("the unsettled message was not taken over"),
    };
    assert_eq!((again.message.id.as_str(), again.message.attempts), ("d", 2));
    // The first attempt's record, late: it may not re-queue what the second one holds.
    let first = match lost {
        Lease::Leased(mut first) => first.remove(0),
        Lease::Idle { .. } => unreachable!("checked above"),
    };
    let late = Settled::Retry {
        due_ms: unix_ms(),
        error: "late".into(),
    };
    store.settle(route, &first, late).await.expect("settle");
    let counts = store.counts(route, unix_ms()).await.expect("counts");
    assert_eq!(
        (counts.ready, counts.scheduled, counts.delivering),
        (0, 0, 1),
        "{counts:?}"
    );
    let delivered = Settled::Delivered {
        completed_ttl: Duration::from_secs(60),
    };
    store.settle(route, &again, delivered).await.expect("settle");

    // Several taken in one call (up to the number asked for), recorded in one.
    let batch: Vec<Message> = (1..=3).map(|i| message(route, &format!("b{i}"))).collect();
    for m in &batch {
        assert_eq!(
            store.enqueue(route, m, 10, RECLAIM).await.expect("enqueue"),
            Enqueued::Queued
        );
    }
    let Lease::Leased(two) = store.lease(route, unix_ms(), RECLAIM, 2).await.expect("lease") else {
        panic!("nothing leased");
    };
    let Lease::Leased(one) = store.lease(route, unix_ms(), RECLAIM, 2).await.expect("lease") else {
        panic!("nothing leased");
    };
    let mut ids: Vec<&str> = two.iter().chain(&one).map(|l| l.message.id.as_str()).collect();
    ids.sort_unstable();
    assert_eq!((two.len(), one.len(), ids), (2, 1, vec!["b1", "b2", "b3"]));
    let ended: Vec<(&Leased, Settled)> = two
        .iter()
        .chain(&one)
        .map(|l| {
            let delivered = Settled::Delivered {
                completed_ttl: Duration::from_secs(60),
            };
            (l, delivered)
        })
        .collect();
    store.settle_all(route, &ended).await.expect("settle all");
    for m in &batch {
        assert!(matches!(
            store.get(&key(m)).await.expect("get"),
            Some(Marker::Completed { .. })
        ));
    }

    // A message queued without a key leaves no marker.
    let mut unkeyed = message(route, "nokey-1");
    unkeyed.key = None;
    assert_eq!(
        store.enqueue(route, &unkeyed, 5, RECLAIM).await.expect("enqueue"),
        Enqueued::Queued
    );
    let taken = lease(store, route).await;
    assert_eq!(
        (taken.message.id.as_str(), taken.message.key.as_deref()),
        ("nokey-1", None)
    );
    store
        .settle(
            route,
            &taken,
            Settled::Delivered {
                completed_ttl: Duration::from_secs(60),
            },
        )
        .await
        .expect("settle");
    assert_eq!(store.counts(route, unix_ms()).await.expect("counts").total(), 0);
}

fn sqlite(dir: &TempFile) -> SqliteStore {
    let path = dir.0.with_file_name("gateway.db");
    SqliteStore::open(&path, Fsync::Always, 64 << 20, Duration::from_secs(2)).expect("open sqlite")
}

#[tokio::test]
async fn sqlite_store_keeps_the_marker_contract() {
    let dir = TempFile::new("sqlite.marker", "");
    contract(&sqlite(&dir), "sqlite").await;
}

#[tokio::test]
async fn sqlite_store_keeps_the_queue_contract() {
    let dir = TempFile::new("sqlite.marker", "");
    queue_contract(&sqlite(&dir), "q").await;
}

#[tokio::test]
async fn redis_store_keeps_the_queue_contract() {
    let redis = RedisServer::start().await;
    let store = crate::store_contract::redis_store(redis.url()).await;
    queue_contract(&store, "q").await;
    // Settled entries are acknowledged, not deleted one by one: a lease trims them
    // (once a second), keeping the last one read.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    idle(&store, "q").await;
    assert_eq!(redis.cli(&["XLEN", "dedup:{q}:q"]).trim(), "1", "trimmed");
    // Every key of the route's queue carries the route as its hash tag.
    let keys = redis.cli(&["--scan", "--pattern", "dedup:{q}:*"]);
    assert!(keys.lines().any(|k| k == "dedup:{q}:q"), "the stream: {keys}");
}

#[tokio::test]
async fn redis_cluster_store_keeps_the_queue_contract() {
    let cluster = RedisCluster::start().await;
    let store = crate::store_contract::cluster_store(&cluster).await;
    // Routes whose queues are on different nodes.
    for route in ["q", "r", "s"] {
        queue_contract(&store, route).await;
    }
}

/// In a cluster a delivery's end is two calls (the marker is on another slot): COMPLETED,
/// then the message removed. A replica that died between them leaves the message; taken
/// over, it is removed, not delivered again.
#[tokio::test]
async fn in_a_cluster_a_message_whose_marker_is_completed_is_not_delivered_again() {
    let cluster = RedisCluster::start().await;
    let store = crate::store_contract::cluster_store(&cluster).await;
    let m = message("r", "m");
    assert_eq!(
        store.enqueue("r", &m, 10, RECLAIM).await.expect("enqueue"),
        Enqueued::Queued
    );
    let taken = lease(&store, "r").await;
    assert_eq!(taken.message.attempts, 1);
    let key = m.key.clone().expect("key");
    let completed = format!("{{\"state\":\"completed\",\"first_seen_ms\":{}}}", m.first_seen_ms);
    let owner = cluster
        .owner_of(dedup_gateway::store::redis::key_slot(&key))
        .expect("the marker's node");
    assert_eq!(owner.cli(&["SET", &key, &completed]).trim(), "OK");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let short = Duration::from_millis(200);
    assert!(matches!(
        store.lease("r", unix_ms(), short, 1).await.expect("lease"),
        Lease::Idle { .. }
    ));
    assert_eq!(store.counts("r", unix_ms()).await.expect("counts").total(), 0);
}
