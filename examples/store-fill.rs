//! The memory store's slowest calls while it fills, measured outside the network path:
//!
//! ```sh
//! cargo run --release --example store-fill              # 1,100,000 ids, max_entries 1,000,000
//! cargo run --release --example store-fill -- 3000000   # more ids (the bound stays)
//! cargo run --release --example store-fill --features jemalloc   # the shipped allocator
//! ```
//!
//! Each new id is claimed and completed as the state machine does it. Every call runs
//! under the store's one lock, so a slow call is a pause of every worker: the table or
//! a queue growing all at once shows here as the longest calls, and under load as the
//! gateway's p99.

use std::time::{Duration, Instant};

use dedup_gateway::store::{Completion, MemoryStore, Token};

/// `--features jemalloc` measures with the shipped binary's allocator (it grows a
/// large block differently from glibc, which remaps it without copying).
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const MAX_ENTRIES: usize = 1_000_000;

fn main() {
    let ids: usize = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(1_100_000);
    let store = MemoryStore::new(MAX_ENTRIES, u64::MAX);
    let ttl = Duration::from_secs(3600);
    let mut slowest: Vec<(Duration, usize)> = Vec::new();
    let mut over_1ms = 0;
    let mut key = String::new();
    let started = Instant::now();
    for i in 0..ids {
        key.clear();
        key.push_str("dedup:bench:");
        key.push_str(&i.to_string());
        let token = Token::generate();
        let t = Instant::now();
        let claimed = store.claim_now(&key, token, 0, ttl);
        let completion = Completion {
            first_seen_ms: 0,
            ttl,
            response: None,
        };
        let completed = store.complete_now(&key, token, completion);
        let took = t.elapsed();
        assert!(claimed.is_ok() && completed.is_ok_and(|c| c), "id {i} was not stored");
        if took > Duration::from_millis(1) {
            over_1ms += 1;
        }
        slowest.push((took, i));
        if slowest.len() > 64 {
            slowest.sort_unstable_by(|a, b| b.cmp(a));
            slowest.truncate(8);
        }
    }
    let total = started.elapsed();
    slowest.sort_unstable_by(|a, b| b.cmp(a));
    println!(
        "{ids} ids (max_entries {MAX_ENTRIES}): {:.0} ns per claim + complete on average, {over_1ms} calls over 1 ms",
        total.as_nanos() as f64 / ids as f64
    );
    for (took, i) in slowest.iter().take(8) {
        println!("  {:>9.3} ms  at id {i}", took.as_secs_f64() * 1e3);
    }
}
