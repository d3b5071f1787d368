//! The embedded store: one process, bounded by `max_entries`, TTLs on a monotonic
//! clock, and never an eviction of a PROCESSING entry. Forgets everything on restart.
//!
//! When full, the oldest COMPLETED entry (by completion time) makes room: the newest
//! ids are the ones retries need. One mutex guards the map; every critical section is
//! a hash lookup and a few pointer moves, far shorter than a network round trip.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::{Claim, Completion, Marker, Store, StoreError, StoredResponse, Token};

pub struct MemoryStore {
    inner: Mutex<Inner>,
    max_entries: usize,
}

struct Inner {
    map: HashMap<Arc<str>, Entry>,
    /// COMPLETED keys in completion order, for eviction and expiry sweeps. Items whose
    /// `seq` no longer matches the map entry are stale and skipped.
    completed: VecDeque<(Arc<str>, u64)>,
    next_seq: u64,
}

struct Entry {
    state: State,
    expires: Instant,
    first_seen_ms: u64,
    seq: u64,
}

enum State {
    Processing {
        token: Token,
        /// Created by the first waiter; woken when the marker completes or is released.
        waiters: Option<Arc<Notify>>,
    },
    Completed {
        response: Option<Arc<StoredResponse>>,
    },
}

impl Entry {
    fn marker(&self) -> Marker {
        match &self.state {
            State::Processing { token, .. } => Marker::Processing {
                token: *token,
                first_seen_ms: self.first_seen_ms,
            },
            State::Completed { response } => Marker::Completed {
                first_seen_ms: self.first_seen_ms,
                response: response.clone(),
            },
        }
    }

    fn held_by(&self, token: Token, now: Instant) -> bool {
        matches!(self.state, State::Processing { token: t, .. } if t == token) && self.expires > now
    }
}

/// Expired COMPLETED entries removed per claim: keeps memory tidy without a sweeper task.
const SWEEP_PER_CLAIM: usize = 2;

impl MemoryStore {
    pub fn new(max_entries: usize) -> Self {
        MemoryStore {
            inner: Mutex::new(Inner {
                map: HashMap::new(),
                completed: VecDeque::new(),
                next_seq: 0,
            }),
            max_entries: max_entries.max(1),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the map half-updated in a way
        // that matters more than losing the whole store, so keep serving.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Inner {
    fn live(&self, key: &str, now: Instant) -> Option<&Entry> {
        self.map.get(key).filter(|e| e.expires > now)
    }

    /// Removes expired entries from the front of the completion queue.
    fn sweep(&mut self, now: Instant, budget: usize) {
        for _ in 0..budget {
            let Some((key, seq)) = self.completed.front() else {
                return;
            };
            match self.map.get(key) {
                Some(e) if e.seq == *seq && e.expires > now => return,
                Some(e) if e.seq == *seq => {
                    self.map.remove(key);
                }
                _ => {}
            }
            self.completed.pop_front();
        }
    }

    /// Frees one slot: the oldest COMPLETED entry, else any expired entry.
    fn make_room(&mut self, now: Instant) -> bool {
        while let Some((key, seq)) = self.completed.pop_front() {
            if self.map.get(&key).is_some_and(|e| e.seq == seq) {
                self.map.remove(&key);
                return true;
            }
        }
        let before = self.map.len();
        self.map.retain(|_, e| e.expires > now);
        self.map.len() < before
    }

    fn seq(&mut self) -> u64 {
        self.next_seq += 1;
        self.next_seq
    }
}

impl Store for MemoryStore {
    async fn claim(
        &self,
        key: &str,
        token: Token,
        first_seen_ms: u64,
        ttl: Duration,
    ) -> Result<Claim, StoreError> {
        let now = Instant::now();
        let mut inner = self.lock();
        inner.sweep(now, SWEEP_PER_CLAIM);
        if let Some(entry) = inner.live(key, now) {
            return Ok(Claim::Found(entry.marker()));
        }
        let seq = inner.seq();
        let entry = Entry {
            state: State::Processing {
                token,
                waiters: None,
            },
            expires: now + ttl,
            first_seen_ms,
            seq,
        };
        if let Some(slot) = inner.map.get_mut(key) {
            // An expired entry: reuse its slot and key allocation. Anyone still waiting
            // on it must look again.
            let old = std::mem::replace(slot, entry);
            wake(old.state);
            return Ok(Claim::Claimed);
        }
        if inner.map.len() >= self.max_entries && !inner.make_room(now) {
            return Err(StoreError::Full(inner.map.len()));
        }
        inner.map.insert(Arc::from(key), entry);
        Ok(Claim::Claimed)
    }

    async fn complete(
        &self,
        key: &str,
        token: Token,
        completion: Completion,
    ) -> Result<bool, StoreError> {
        let now = Instant::now();
        let mut inner = self.lock();
        let seq = inner.seq();
        let Some((key, entry)) = inner
            .map
            .get_key_value(key)
            .filter(|(_, e)| e.held_by(token, now))
        else {
            return Ok(false);
        };
        let key = Arc::clone(key);
        let entry = Entry {
            state: State::Completed {
                response: completion.response.map(Arc::new),
            },
            expires: now + completion.ttl,
            first_seen_ms: entry.first_seen_ms,
            seq,
        };
        let old = inner.map.insert(Arc::clone(&key), entry);
        inner.completed.push_back((key, seq));
        if inner.completed.len() > 2 * self.max_entries {
            compact(&mut inner);
        }
        drop(inner);
        if let Some(old) = old {
            wake(old.state);
        }
        Ok(true)
    }

    async fn release(&self, key: &str, token: Token) -> Result<bool, StoreError> {
        let now = Instant::now();
        let mut inner = self.lock();
        if !inner.map.get(key).is_some_and(|e| e.held_by(token, now)) {
            return Ok(false);
        }
        let old = inner.map.remove(key);
        drop(inner);
        if let Some(old) = old {
            wake(old.state);
        }
        Ok(true)
    }

    async fn get(&self, key: &str) -> Result<Option<Marker>, StoreError> {
        Ok(self.lock().live(key, Instant::now()).map(Entry::marker))
    }

    async fn wait(&self, key: &str, holder: Token, _attempt: u32, max: Duration) {
        let now = Instant::now();
        let (notified, limit) = {
            let mut inner = self.lock();
            let Some(entry) = inner.map.get_mut(key).filter(|e| e.held_by(holder, now)) else {
                return; // already changed: look again at once
            };
            let limit = max.min(entry.expires - now);
            let State::Processing { waiters, .. } = &mut entry.state else {
                return;
            };
            let notify = Arc::clone(waiters.get_or_insert_with(Default::default));
            // Registered before the lock is released, so a completion in between still wakes us.
            (notify.notified_owned(), limit)
        };
        let _ = tokio::time::timeout(limit, notified).await;
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }

    fn entries(&self) -> Option<usize> {
        Some(self.lock().map.len())
    }
}

fn wake(state: State) {
    if let State::Processing {
        waiters: Some(n), ..
    } = state
    {
        n.notify_waiters();
    }
}

/// Drops stale items from the completion queue (keys completed again or removed).
fn compact(inner: &mut Inner) {
    let Inner { map, completed, .. } = inner;
    completed.retain(|(key, seq)| map.get(key).is_some_and(|e| e.seq == *seq));
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(30);

    impl MemoryStore {
        fn has_waiters(&self, key: &str) -> bool {
            matches!(
                self.lock().map.get(key).map(|e| &e.state),
                Some(State::Processing {
                    waiters: Some(_),
                    ..
                })
            )
        }
    }

    fn done(ttl: Duration) -> Completion {
        Completion {
            first_seen_ms: 1,
            ttl,
            response: None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn claim_complete_release_follow_the_token() {
        let s = MemoryStore::new(10);
        let (a, b) = (Token::generate(), Token::generate());
        assert_eq!(
            s.claim("k", a, 1, TTL).await.expect("claim"),
            Claim::Claimed
        );
        assert!(
            matches!(s.claim("k", b, 2, TTL).await.expect("claim"), Claim::Found(Marker::Processing { token, first_seen_ms: 1 }) if token == a)
        );
        assert!(
            !s.release("k", b).await.expect("release"),
            "a stranger cannot release"
        );
        assert!(
            !s.complete("k", b, done(TTL)).await.expect("complete"),
            "nor complete"
        );
        assert!(s.complete("k", a, done(TTL)).await.expect("complete"));
        assert!(
            !s.release("k", a).await.expect("release"),
            "completed is not processing"
        );
        assert!(matches!(
            s.claim("k", b, 3, TTL).await.expect("claim"),
            Claim::Found(Marker::Completed { .. })
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn markers_expire_and_duplicates_do_not_refresh_them() {
        let s = MemoryStore::new(10);
        let a = Token::generate();
        s.claim("k", a, 1, TTL).await.expect("claim");
        s.complete("k", a, done(Duration::from_secs(60)))
            .await
            .expect("complete");
        tokio::time::advance(Duration::from_secs(59)).await;
        assert!(matches!(
            s.claim("k", Token::generate(), 2, TTL)
                .await
                .expect("claim"),
            Claim::Found(_)
        ));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(
            s.claim("k", Token::generate(), 3, TTL)
                .await
                .expect("claim"),
            Claim::Claimed
        );
        tokio::time::advance(TTL).await;
        assert_eq!(
            s.get("k").await.expect("get"),
            None,
            "PROCESSING expires too"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn full_store_evicts_oldest_completed_never_processing() {
        let s = MemoryStore::new(3);
        for k in ["a", "b", "c"] {
            let t = Token::generate();
            s.claim(k, t, 1, TTL).await.expect("claim");
            if k != "c" {
                s.complete(k, t, done(TTL)).await.expect("complete");
            }
        }
        assert_eq!(
            s.claim("d", Token::generate(), 1, TTL)
                .await
                .expect("claim"),
            Claim::Claimed
        );
        assert_eq!(
            s.get("a").await.expect("get"),
            None,
            "oldest completed evicted"
        );
        assert!(s.get("b").await.expect("get").is_some());
        assert_eq!(
            s.claim("e", Token::generate(), 1, TTL)
                .await
                .expect("claim"),
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

    #[tokio::test(start_paused = true)]
    async fn waiters_wake_on_completion_not_before() {
        let s = Arc::new(MemoryStore::new(10));
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
        let s = MemoryStore::new(10);
        let start = Instant::now();
        s.wait("nothing", Token::generate(), 0, Duration::from_secs(10))
            .await;
        assert_eq!(start.elapsed(), Duration::ZERO);
    }
}
