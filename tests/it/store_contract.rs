//! The `Store` contract, run against every backend: the state machine may rely on
//! exactly this and nothing more.

use std::time::Duration;

use bytes::Bytes;
use dedup_gateway::config::RedisTarget;
use dedup_gateway::store::{
    Claim, Completion, Forgotten, KeyState, Marker, MemoryStore, RedisStore, Store, StoredResponse, Token,
};
use http::{HeaderValue, StatusCode};

use crate::servers::{RedisCluster, RedisServer};

const TTL: Duration = Duration::from_secs(30);
/// When the contract's messages were first seen.
const FIRST: u64 = 1_700_000_000_000;

/// A completion of the claim made at `first_seen_ms` (a completion carries its claim's).
fn completion(first_seen_ms: u64, response: Option<StoredResponse>) -> Completion {
    Completion {
        first_seen_ms,
        ttl: TTL,
        response,
    }
}

fn holder(found: Claim) -> Option<Token> {
    match found {
        Claim::Found(Marker::Processing { token, .. }) => Some(token),
        _ => None,
    }
}

/// Claim, compare-and-set complete, compare-and-delete release, reads.
pub async fn contract(store: &impl Store, ns: &str) {
    let key = |k: &str| format!("contract:{ns}:{k}");
    let (a, b) = (Token::generate(), Token::generate());

    assert_eq!(store.get(&key("k")).await.expect("get"), None);
    assert_eq!(
        store.claim(&key("k"), a, FIRST, TTL).await.expect("claim"),
        Claim::Claimed
    );
    assert_eq!(holder(store.claim(&key("k"), b, 2, TTL).await.expect("claim")), Some(a));
    assert!(
        !store.release(&key("k"), b, FIRST).await.expect("release"),
        "a stranger cannot release, even knowing when the message was first seen"
    );
    assert!(
        !store
            .complete(&key("k"), b, completion(FIRST, None))
            .await
            .expect("complete"),
        "nor complete, even knowing when the message was first seen"
    );
    assert_eq!(
        holder(store.claim(&key("k"), b, 2, TTL).await.expect("claim")),
        Some(a),
        "untouched"
    );

    let reply = StoredResponse {
        status: StatusCode::ACCEPTED,
        content_type: Some(HeaderValue::from_static("application/json")),
        content_encoding: None,
        body: Bytes::from_static(b"{\"reply\":\"hi\"}"),
    };
    assert!(
        store
            .complete(&key("k"), a, completion(FIRST, Some(reply.clone())))
            .await
            .expect("complete")
    );
    assert!(
        !store.release(&key("k"), a, FIRST).await.expect("release"),
        "COMPLETED is not released"
    );
    match store.claim(&key("k"), b, 3, TTL).await.expect("claim") {
        Claim::Found(Marker::Completed {
            first_seen_ms,
            response,
        }) => {
            assert_eq!(first_seen_ms, FIRST, "first sighting survives completion");
            assert_eq!(response.as_deref(), Some(&reply));
        }
        other => panic!("expected COMPLETED, got {other:?}"),
    }

    // A stale owner (its claim was released and taken over) can touch nothing.
    assert_eq!(store.claim(&key("s"), a, 1, TTL).await.expect("claim"), Claim::Claimed);
    assert!(store.release(&key("s"), a, 1).await.expect("release"));
    assert_eq!(store.claim(&key("s"), b, 2, TTL).await.expect("claim"), Claim::Claimed);
    assert!(
        !store
            .complete(&key("s"), a, completion(1, None))
            .await
            .expect("complete")
    );
    assert!(!store.release(&key("s"), a, 1).await.expect("release"));
    assert_eq!(holder(store.claim(&key("s"), a, 3, TTL).await.expect("claim")), Some(b));
    assert!(
        store
            .complete(&key("s"), b, completion(2, None))
            .await
            .expect("complete")
    );

    // Claiming again with one's own token shows the marker as one's own: that is how a
    // lost claim reply is resolved.
    assert_eq!(
        store.claim(&key("own"), a, 1, TTL).await.expect("claim"),
        Claim::Claimed
    );
    assert_eq!(
        holder(store.claim(&key("own"), a, 1, TTL).await.expect("claim")),
        Some(a)
    );
    store.ping().await.expect("ping");
    admin_contract(store, ns).await;
}

/// The admin API's inspect and forget (see `admin_keys.rs` for them behind a gateway).
async fn admin_contract(store: &impl Store, ns: &str) {
    let key = |k: &str| format!("contract:{ns}:admin:{k}");
    let owner = Token::generate();
    assert_eq!(store.inspect(&key("p")).await.expect("inspect"), None);
    assert_eq!(store.forget(&key("p"), true).await.expect("forget"), Forgotten::Absent);
    store.claim(&key("p"), owner, FIRST, TTL).await.expect("claim");
    let info = store.inspect(&key("p")).await.expect("inspect").expect("present");
    assert_eq!(
        (info.state, info.first_seen_ms, info.reply_stored),
        (KeyState::Processing, FIRST, false)
    );
    assert!(info.ttl.is_some_and(|t| t <= TTL && t > TTL / 2), "{info:?}");
    assert_eq!(
        store.forget(&key("p"), false).await.expect("forget"),
        Forgotten::Refused
    );
    assert!(
        store.inspect(&key("p")).await.expect("inspect").is_some(),
        "refused = untouched"
    );
    assert_eq!(
        store.forget(&key("p"), true).await.expect("forget"),
        Forgotten::Deleted(KeyState::Processing)
    );
    assert!(
        !store
            .complete(&key("p"), owner, completion(FIRST, None))
            .await
            .expect("complete"),
        "the owner lost it"
    );
    assert_eq!(
        store.claim(&key("p"), Token::generate(), 2, TTL).await.expect("claim"),
        Claim::Claimed
    );

    store.claim(&key("c"), owner, 3, TTL).await.expect("claim");
    let reply = StoredResponse {
        status: StatusCode::OK,
        content_type: None,
        content_encoding: None,
        body: Bytes::from_static(b"ok"),
    };
    assert!(
        store
            .complete(&key("c"), owner, completion(3, Some(reply)))
            .await
            .expect("complete")
    );
    let info = store.inspect(&key("c")).await.expect("inspect").expect("present");
    assert_eq!((info.state, info.reply_stored), (KeyState::Completed, true));
    let (entries, bytes) = (store.entries(), store.bytes());
    assert_eq!(
        store.forget(&key("c"), false).await.expect("forget"),
        Forgotten::Deleted(KeyState::Completed)
    );
    // A store that counts (memory) counts the forgotten entry and its reply out.
    assert_eq!(store.entries(), entries.map(|n| n - 1));
    assert!(bytes.is_none_or(|before| store.bytes().is_some_and(|after| after < before)));
    assert_eq!(store.inspect(&key("c")).await.expect("inspect"), None);
    assert_eq!(
        store.claim(&key("c"), owner, 4, TTL).await.expect("claim"),
        Claim::Claimed
    );
}

pub async fn redis_store(url: String) -> RedisStore {
    RedisStore::connect(&RedisTarget::Standalone(url), 4, Duration::from_millis(500), "dedup:")
        .await
        .expect("connect to redis")
}

#[tokio::test]
async fn memory_store_keeps_the_contract() {
    contract(&MemoryStore::new(100, u64::MAX), "memory").await;
}

#[tokio::test]
async fn redis_store_keeps_the_contract() {
    let server = RedisServer::start().await;
    contract(&redis_store(server.url()).await, "redis").await;
}

#[tokio::test]
async fn redis_cluster_store_keeps_the_contract() {
    let cluster = RedisCluster::start().await;
    let store = cluster_store(&cluster).await;
    // Keys in different slots, so more than one node answers.
    for ns in ["a", "b", "c", "d", "e", "f"] {
        contract(&store, ns).await;
    }
}

pub async fn cluster_store(cluster: &RedisCluster) -> RedisStore {
    let seeds = cluster
        .nodes
        .iter()
        .map(|n| format!("redis://127.0.0.1:{}", n.port))
        .collect();
    RedisStore::connect(&RedisTarget::Cluster(seeds), 4, Duration::from_millis(500), "dedup:")
        .await
        .expect("connect to cluster")
}

/// The sum over the nodes of each command's calls.
fn cluster_calls(cluster: &RedisCluster) -> std::collections::BTreeMap<String, u64> {
    let mut sum = std::collections::BTreeMap::new();
    for node in &cluster.nodes {
        for (cmd, n) in node.command_calls() {
            *sum.entry(cmd).or_insert(0) += n;
        }
    }
    sum
}

/// On a Valkey 8.1 cluster: the contract, and a complete routed to its key's node as
/// one `SET IFEQ`, no script.
#[tokio::test]
async fn redis_cluster_store_keeps_the_contract_on_valkey_with_set_if_eq() {
    let cluster = RedisCluster::start_valkey().await;
    let store = cluster_store(&cluster).await;
    for ns in ["a", "b", "c"] {
        contract(&store, ns).await;
    }
    let owner = Token::generate();
    let before = cluster_calls(&cluster);
    for k in ["x", "y", "z"] {
        let key = format!("contract:ifeq:{k}");
        assert_eq!(
            store.claim(&key, owner, FIRST, TTL).await.expect("claim"),
            Claim::Claimed
        );
        assert!(
            store
                .complete(&key, owner, completion(FIRST, None))
                .await
                .expect("complete")
        );
    }
    let after = cluster_calls(&cluster);
    let delta = |cmd: &str| after.get(cmd).copied().unwrap_or(0) - before.get(cmd).copied().unwrap_or(0);
    assert_eq!(
        (delta("set"), delta("evalsha")),
        (6, 0),
        "claims and completes: SET only"
    );
}

/// Valkey 8.1 has `SET ... IFEQ`: complete is that command, not the script.
#[tokio::test]
async fn redis_store_keeps_the_contract_on_valkey_with_set_if_eq() {
    let server = RedisServer::start_valkey().await;
    contract(&redis_store(server.url()).await, "valkey").await;
}

/// Redis 8.4 has `SET ... IFEQ` too (found by `redis_version`, where Valkey reports 7.2),
/// and `DELEX ... IFEQ`: the contract holds with each of its four releases a DELEX.
#[tokio::test]
async fn redis_store_keeps_the_contract_on_redis_8_with_set_and_delex_if_eq() {
    let server = RedisServer::start_redis8().await;
    contract(&redis_store(server.url()).await, "redis8").await;
    let calls = server.command_calls();
    assert_eq!(calls.get("delex"), Some(&4), "releases are DELEX: {calls:?}");
}
