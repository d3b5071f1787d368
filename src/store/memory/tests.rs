//! Unit tests of [`crate::store::memory`].

use super::*;

const TTL: Duration = Duration::from_secs(30);

impl MemoryStore {
    fn has_waiters(&self, key: &str) -> bool {
        let d = self.digest(key);
        self.lock().slots.waiters.contains_key(&d)
    }
}

fn done(ttl: Duration) -> Completion {
    Completion {
        first_seen_ms: 1,
        ttl,
        response: None,
    }
}

#[test]
fn millis_round_up_and_saturate() {
    for (d, ms) in [
        (Duration::ZERO, 0),
        (Duration::from_nanos(1), 1),
        (Duration::from_millis(1), 1),
        (Duration::from_nanos(1_000_001), 2),
        (Duration::new(5, 999_999_999), 6000),
        (Duration::from_secs(86_400), 86_400_000),
        (Duration::MAX, u64::MAX),
    ] {
        assert_eq!(millis(d), ms, "{d:?}");
        if d < Duration::from_secs(1 << 40) {
            assert_eq!(u128::from(millis(d)), d.as_nanos().div_ceil(1_000_000), "{d:?}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn claim_complete_release_follow_the_token() {
    let s = MemoryStore::new(10, u64::MAX);
    let (a, b) = (Token::generate(), Token::generate());
    assert_eq!(s.claim("k", a, 1, TTL).await.expect("claim"), Claim::Claimed);
    assert!(
        matches!(s.claim("k", b, 2, TTL).await.expect("claim"), Claim::Found(Marker::Processing { token, first_seen_ms: 1 }) if token == a)
    );
    assert!(
        !s.release("k", b, 1).await.expect("release"),
        "a stranger cannot release"
    );
    assert!(!s.complete("k", b, done(TTL)).await.expect("complete"), "nor complete");
    assert!(s.complete("k", a, done(TTL)).await.expect("complete"));
    assert!(
        !s.release("k", a, 1).await.expect("release"),
        "completed is not processing"
    );
    assert!(matches!(
        s.claim("k", b, 3, TTL).await.expect("claim"),
        Claim::Found(Marker::Completed { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn markers_expire_and_duplicates_do_not_refresh_them() {
    let s = MemoryStore::new(10, u64::MAX);
    let a = Token::generate();
    s.claim("k", a, 1, TTL).await.expect("claim");
    s.complete("k", a, done(Duration::from_secs(60)))
        .await
        .expect("complete");
    tokio::time::advance(Duration::from_secs(59)).await;
    assert!(matches!(
        s.claim("k", Token::generate(), 2, TTL).await.expect("claim"),
        Claim::Found(_)
    ));
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(
        s.claim("k", Token::generate(), 3, TTL).await.expect("claim"),
        Claim::Claimed
    );
    tokio::time::advance(TTL).await;
    assert_eq!(s.get("k").await.expect("get"), None, "PROCESSING expires too");
}

#[tokio::test(start_paused = true)]
async fn full_store_evicts_oldest_completed_never_processing() {
    let s = MemoryStore::new(3, u64::MAX);
    for k in ["a", "b", "c"] {
        let t = Token::generate();
        s.claim(k, t, 1, TTL).await.expect("claim");
        if k != "c" {
            s.complete(k, t, done(TTL)).await.expect("complete");
        }
    }
    assert_eq!(
        s.claim("d", Token::generate(), 1, TTL).await.expect("claim"),
        Claim::Claimed
    );
    assert_eq!(s.get("a").await.expect("get"), None, "oldest completed evicted");
    assert!(s.get("b").await.expect("get").is_some());
    assert_eq!(
        s.claim("e", Token::generate(), 1, TTL).await.expect("claim"),
        Claim::Claimed
    );
    assert_eq!(s.get("b").await.expect("get"), None);
    // Now c, d, e are all PROCESSING: nothing may be evicted.
    assert!(matches!(
        s.claim("f", Token::generate(), 1, TTL).await,
        Err(StoreError::Full(3))
    ));
    assert!(s.get("c").await.expect("get").is_some());
    assert_eq!(s.entries(), Some(3));
}

/// The chunked FIFO against `VecDeque` as the model, through pushes, pops and
/// retains that cross chunk boundaries and empty it now and then.
#[test]
fn the_chunked_fifo_keeps_order_like_a_vecdeque() {
    let (mut fifo, mut model) = (Fifo::default(), VecDeque::new());
    let mut rng = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let item = |seq| Item { hash: seq * 7, seq };
    let (mut seq, mut longest, mut emptied) = (0, 0, 0);
    for step in 0..20_000 {
        // Phases of mostly pushing and mostly popping, so the length swings
        // across several chunks and down to empty.
        let push = next() % 8 < if (step / 3_000) % 2 == 0 { 6 } else { 2 };
        if push {
            for _ in 0..next() % 9 {
                seq += 1;
                fifo.push_back(item(seq));
                model.push_back(item(seq));
            }
        } else if next() % 50 == 0 {
            let cut = next() % 3;
            fifo.retain(|i| i.seq % 3 != cut);
            model.retain(|i: &Item| i.seq % 3 != cut);
        } else {
            assert_eq!(fifo.pop_front().map(|i| i.seq), model.pop_front().map(|i| i.seq));
        }
        assert_eq!(fifo.len, model.len());
        assert_eq!(fifo.front().map(|i| i.seq), model.front().map(|i| i.seq));
        assert!(fifo.chunks.len() <= model.len().div_ceil(CHUNK) + 1);
        longest = longest.max(model.len());
        emptied += usize::from(step > 0 && model.is_empty());
    }
    assert!(
        longest > 2 * CHUNK && emptied > 0,
        "longest {longest}, emptied {emptied}"
    );
    let rest: Vec<u64> = fifo.iter().map(|i| i.seq).collect();
    assert_eq!(rest, model.iter().map(|i| i.seq).collect::<Vec<_>>());
}

/// Many ids over every shard: the bound holds over all of them, the oldest go first,
/// and the counts agree with what is found.
#[test]
fn the_bound_and_the_eviction_order_hold_across_shards() {
    let s = MemoryStore::new(5_000, u64::MAX);
    let key = |i: usize| format!("dedup:r:{i}");
    for i in 0..20_000 {
        let t = Token::generate();
        assert_eq!(s.claim_now(&key(i), t, 1, TTL).expect("claim"), Claim::Claimed);
        assert!(s.complete_now(&key(i), t, done(TTL)).expect("complete"));
    }
    let inner = s.lock();
    let found = |i: usize| inner.slots.find(s.digest(&key(i))).is_some();
    assert!((15_000..20_000).all(found), "the newest 5,000 are kept");
    assert!(!(0..15_000).any(found), "the older ones were evicted");
    assert_eq!(inner.slots.len, 5_000);
    assert_eq!(inner.slots.shards.iter().map(HashTable::len).sum::<usize>(), 5_000);
    assert_eq!(inner.slots.bytes, 5_000 * ENTRY_BYTES);
    assert!(
        inner.slots.shards.iter().all(|t| !t.is_empty()),
        "every shard holds some"
    );
}

#[tokio::test(start_paused = true)]
async fn full_store_prefers_expired_entries_of_any_ttl_to_live_ones() {
    let s = MemoryStore::new(3, u64::MAX);
    let long = Token::generate();
    s.claim("long", long, 1, TTL).await.expect("claim");
    s.complete("long", long, done(Duration::from_secs(3600)))
        .await
        .expect("complete");
    for k in ["short", "stuck"] {
        let t = Token::generate();
        s.claim(k, t, 1, Duration::from_secs(5)).await.expect("claim");
        if k == "short" {
            s.complete(k, t, done(Duration::from_secs(5))).await.expect("complete");
        }
    }
    tokio::time::advance(Duration::from_secs(6)).await;
    // "short" (COMPLETED) and "stuck" (PROCESSING) expired; "long" is the oldest live one.
    assert_eq!(
        s.claim("n1", Token::generate(), 1, TTL).await.expect("claim"),
        Claim::Claimed
    );
    assert_eq!(
        s.claim("n2", Token::generate(), 1, TTL).await.expect("claim"),
        Claim::Claimed
    );
    assert!(
        s.get("long").await.expect("get").is_some(),
        "live entries outlast expired ones"
    );
    assert_eq!(s.entries(), Some(3));
}

#[tokio::test(start_paused = true)]
async fn waiters_wake_on_completion_not_before() {
    let s = Arc::new(MemoryStore::new(10, u64::MAX));
    let a = Token::generate();
    s.claim("k", a, 1, TTL).await.expect("claim");
    let waiter = tokio::spawn({
        let s = Arc::clone(&s);
        async move {
            let start = Instant::now();
            s.wait("k", a, 0, Duration::from_secs(10)).await;
            start.elapsed()
        }
    });
    while !s.has_waiters("k") {
        tokio::task::yield_now().await;
    }
    tokio::time::advance(Duration::from_secs(3)).await;
    assert!(!waiter.is_finished());
    s.complete("k", a, done(TTL)).await.expect("complete");
    let waited = waiter.await.expect("join");
    assert_eq!(waited, Duration::from_secs(3));
}

#[tokio::test(start_paused = true)]
async fn wait_returns_at_once_when_holder_changed() {
    let s = MemoryStore::new(10, u64::MAX);
    let start = Instant::now();
    s.wait("nothing", Token::generate(), 0, Duration::from_secs(10)).await;
    assert_eq!(start.elapsed(), Duration::ZERO);
}

fn reply(len: usize) -> StoredResponse {
    StoredResponse {
        status: http::StatusCode::OK,
        content_type: Some(HeaderValue::from_static("text/plain")),
        content_encoding: None,
        body: bytes::Bytes::from(vec![b'x'; len]),
    }
}

fn with_reply(len: usize) -> Completion {
    Completion {
        first_seen_ms: 1,
        ttl: TTL,
        response: Some(reply(len)),
    }
}

#[test]
fn an_entry_is_a_56_byte_slot_with_no_allocation_of_its_own() {
    // 56, not 64: the state's variant is told by its `seq` (see `State`).
    assert_eq!(std::mem::size_of::<Entry>(), 56);
    assert_eq!(ENTRY_BYTES, 73, "slot + control byte + queue item");
}

#[tokio::test(start_paused = true)]
async fn bytes_are_counted_exactly_through_every_transition() {
    let s = MemoryStore::new(100, u64::MAX);
    let (a, b) = (Token::generate(), Token::generate());
    s.claim("a", a, 1, TTL).await.expect("claim");
    s.claim("b", b, 1, TTL).await.expect("claim");
    assert_eq!(s.bytes(), Some(2 * ENTRY_BYTES));
    s.complete("a", a, with_reply(1000)).await.expect("complete");
    let a_bytes = ENTRY_BYTES + response_bytes(&reply(1000));
    assert_eq!(
        a_bytes,
        ENTRY_BYTES + (std::mem::size_of::<StoredResponse>() + 16 + 1000 + 10) as u64
    );
    assert_eq!(s.bytes(), Some(a_bytes + ENTRY_BYTES));
    s.release("b", b, 1).await.expect("release");
    assert_eq!(s.bytes(), Some(a_bytes));
    // Expired, then reclaimed in place: the reply's bytes go with the old state.
    tokio::time::advance(TTL * 2).await;
    s.claim("a", Token::generate(), 2, TTL).await.expect("claim");
    assert_eq!(s.bytes(), Some(ENTRY_BYTES));
    // A large reply is counted in whole pages (it has pages of its own).
    let c = Token::generate();
    s.claim("c", c, 1, TTL).await.expect("claim");
    s.complete("c", c, with_reply(OWN_PAGES_MIN + 1))
        .await
        .expect("complete");
    let pages = (OWN_PAGES_MIN + 1).next_multiple_of(PAGE);
    assert_eq!(
        s.bytes(),
        Some(3 * ENTRY_BYTES + (std::mem::size_of::<StoredResponse>() + 16 + pages + 10) as u64 - ENTRY_BYTES)
    );
}

#[tokio::test(start_paused = true)]
async fn max_bytes_evicts_the_oldest_completed_and_never_processing() {
    let per = ENTRY_BYTES + response_bytes(&reply(1000));
    let s = MemoryStore::new(1000, 3 * per);
    for k in ["a", "b", "c", "d"] {
        let t = Token::generate();
        s.claim(k, t, 1, TTL).await.expect("claim");
        assert!(s.complete(k, t, with_reply(1000)).await.expect("complete"));
        assert!(s.bytes().is_some_and(|b| b <= 3 * per));
    }
    assert_eq!(
        s.get("a").await.expect("get"),
        None,
        "oldest completed evicted for bytes"
    );
    for k in ["b", "c", "d"] {
        assert!(matches!(
            s.get(k).await.expect("get"),
            Some(Marker::Completed { response: Some(_), .. })
        ));
    }
}

#[tokio::test(start_paused = true)]
async fn a_reply_that_cannot_fit_is_dropped_but_its_marker_kept() {
    let s = MemoryStore::new(1000, 4 * ENTRY_BYTES);
    let mut held = Vec::new();
    for k in ["p1", "p2", "p3"] {
        let t = Token::generate();
        s.claim(k, t, 1, TTL).await.expect("claim");
        held.push(t);
    }
    // Only PROCESSING entries: nothing may be evicted to make room for a reply.
    assert!(s.complete("p1", held[0], with_reply(10_000)).await.expect("complete"));
    assert!(matches!(
        s.get("p1").await.expect("get"),
        Some(Marker::Completed { response: None, .. })
    ));
    assert_eq!(s.bytes(), Some(3 * ENTRY_BYTES));
    s.claim("p4", Token::generate(), 1, TTL).await.expect("fits exactly");
    // Full of PROCESSING (and p1, COMPLETED, goes first).
    s.claim("p5", Token::generate(), 1, TTL).await.expect("evicts p1");
    assert_eq!(s.get("p1").await.expect("get"), None);
    assert!(matches!(
        s.claim("p6", Token::generate(), 1, TTL).await,
        Err(StoreError::Full(4))
    ));
}
