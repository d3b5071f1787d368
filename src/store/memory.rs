//! The embedded store: one process, bounded by `max_entries`, TTLs on a monotonic
//! clock, and never an eviction of a PROCESSING entry. Forgets everything on restart.
//!
//! When full, an expired entry makes room if there is one, else the oldest COMPLETED
//! entry (by completion time): the newest ids are the ones retries need. Entries are
//! queued per state and TTL, so each queue is in expiry order and both questions are
//! answered from the queues' fronts, never by scanning the map. One mutex guards it
//! all; critical sections are a hash lookup plus amortised-constant queue work.

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
    map: Map,
    processing: Queues,
    completed: Queues,
    next_seq: u64,
}

type Map = HashMap<Arc<str>, Entry>;

struct Entry {
    state: State,
    expires: Instant,
    first_seen_ms: u64,
    /// Changes whenever the entry changes state: queue items with another `seq` are stale.
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

/// Keys in the order they entered one state, one FIFO per TTL (a route setting, so
/// there are few): within a FIFO, insertion order is expiry order.
#[derive(Default)]
struct Queues(Vec<(Duration, Fifo)>);

/// Keys with the `seq` they had when queued.
type Fifo = VecDeque<(Arc<str>, u64)>;

impl Queues {
    fn push(&mut self, ttl: Duration, key: Arc<str>, seq: u64) {
        match self.0.iter_mut().find(|(t, _)| *t == ttl) {
            Some((_, q)) => q.push_back((key, seq)),
            None => self.0.push((ttl, VecDeque::from([(key, seq)]))),
        }
    }

    /// The current front of queue `i` (its `seq` and expiry), after dropping stale items.
    fn front(&mut self, i: usize, map: &Map) -> Option<(u64, Instant)> {
        let queue = &mut self.0[i].1;
        while let Some((key, seq)) = queue.front() {
            match map.get(key) {
                Some(e) if e.seq == *seq => return Some((*seq, e.expires)),
                _ => drop(queue.pop_front()),
            }
        }
        None
    }

    fn remove_front(&mut self, i: usize, map: &mut Map) {
        if let Some((key, _)) = self.0[i].1.pop_front() {
            map.remove(&key);
        }
    }

    /// Removes one expired entry of this state, if any queue starts with one.
    fn remove_expired(&mut self, map: &mut Map, now: Instant) -> bool {
        for i in 0..self.0.len() {
            if self.front(i, map).is_some_and(|(_, expires)| expires <= now) {
                self.remove_front(i, map);
                return true;
            }
        }
        false
    }

    /// Removes the entry that entered this state first.
    fn remove_oldest(&mut self, map: &mut Map) -> bool {
        let oldest = (0..self.0.len()).filter_map(|i| Some((self.front(i, map)?.0, i))).min();
        oldest.is_some_and(|(_, i)| {
            self.remove_front(i, map);
            true
        })
    }

    /// Drops every stale item once stale items pile up behind a long-lived front.
    fn compact(&mut self, map: &Map, limit: usize) {
        if self.0.iter().map(|(_, q)| q.len()).sum::<usize>() > limit {
            for (_, queue) in &mut self.0 {
                queue.retain(|(key, seq)| map.get(key).is_some_and(|e| e.seq == *seq));
            }
        }
    }
}

/// Expired entries removed per claim: keeps memory tidy without a sweeper task.
const SWEEP_PER_CLAIM: usize = 2;

impl MemoryStore {
    pub fn new(max_entries: usize) -> Self {
        MemoryStore {
            inner: Mutex::new(Inner {
                map: HashMap::new(),
                processing: Queues::default(),
                completed: Queues::default(),
                next_seq: 0,
            }),
            max_entries: max_entries.max(1),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the map half-updated in a way
        // that matters more than losing the whole store, so keep serving.
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Inner {
    fn live(&self, key: &str, now: Instant) -> Option<&Entry> {
        self.map.get(key).filter(|e| e.expires > now)
    }

    /// Removes up to `budget` expired entries.
    fn sweep(&mut self, now: Instant, budget: usize) {
        for _ in 0..budget {
            if !self.processing.remove_expired(&mut self.map, now) && !self.completed.remove_expired(&mut self.map, now)
            {
                return;
            }
        }
    }

    /// Frees one slot: an expired entry if there is one, else the oldest COMPLETED.
    fn make_room(&mut self, now: Instant) -> bool {
        self.processing.remove_expired(&mut self.map, now)
            || self.completed.remove_expired(&mut self.map, now)
            || self.completed.remove_oldest(&mut self.map)
    }

    fn seq(&mut self) -> u64 {
        self.next_seq += 1;
        self.next_seq
    }
}

impl Store for MemoryStore {
    async fn claim(&self, key: &str, token: Token, first_seen_ms: u64, ttl: Duration) -> Result<Claim, StoreError> {
        let now = Instant::now();
        let mut guard = self.lock();
        let inner = &mut *guard;
        inner.sweep(now, SWEEP_PER_CLAIM);
        if let Some(entry) = inner.live(key, now) {
            return Ok(Claim::Found(entry.marker()));
        }
        let seq = inner.seq();
        let entry = Entry {
            state: State::Processing { token, waiters: None },
            expires: now + ttl,
            first_seen_ms,
            seq,
        };
        // An expired entry keeps its slot (and key allocation); anyone still waiting on
        // it must look again.
        let expired = inner.map.get_key_value(key).map(|(k, _)| Arc::clone(k));
        let key = match expired {
            Some(key) => {
                if let Some(old) = inner.map.insert(Arc::clone(&key), entry) {
                    wake(old.state);
                }
                key
            }
            None => {
                if inner.map.len() >= self.max_entries && !inner.make_room(now) {
                    return Err(StoreError::Full(inner.map.len()));
                }
                let key: Arc<str> = Arc::from(key);
                inner.map.insert(Arc::clone(&key), entry);
                key
            }
        };
        inner.processing.push(ttl, key, seq);
        inner.processing.compact(&inner.map, 2 * self.max_entries);
        Ok(Claim::Claimed)
    }

    async fn complete(&self, key: &str, token: Token, completion: Completion) -> Result<bool, StoreError> {
        let now = Instant::now();
        let mut guard = self.lock();
        let inner = &mut *guard;
        let Some((key, entry)) = inner.map.get_key_value(key).filter(|(_, e)| e.held_by(token, now)) else {
            return Ok(false);
        };
        let (key, first_seen_ms) = (Arc::clone(key), entry.first_seen_ms);
        let seq = inner.seq();
        let entry = Entry {
            state: State::Completed {
                response: completion.response.map(Arc::new),
            },
            expires: now + completion.ttl,
            first_seen_ms,
            seq,
        };
        let old = inner.map.insert(Arc::clone(&key), entry);
        inner.completed.push(completion.ttl, key, seq);
        inner.completed.compact(&inner.map, 2 * self.max_entries);
        drop(guard);
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
    if let State::Processing { waiters: Some(n), .. } = state {
        n.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(30);

    impl MemoryStore {
        fn has_waiters(&self, key: &str) -> bool {
            matches!(
                self.lock().map.get(key).map(|e| &e.state),
                Some(State::Processing { waiters: Some(_), .. })
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
        assert_eq!(s.claim("k", a, 1, TTL).await.expect("claim"), Claim::Claimed);
        assert!(
            matches!(s.claim("k", b, 2, TTL).await.expect("claim"), Claim::Found(Marker::Processing { token, first_seen_ms: 1 }) if token == a)
        );
        assert!(!s.release("k", b).await.expect("release"), "a stranger cannot release");
        assert!(!s.complete("k", b, done(TTL)).await.expect("complete"), "nor complete");
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
        let s = MemoryStore::new(3);
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

    #[tokio::test(start_paused = true)]
    async fn full_store_prefers_expired_entries_of_any_ttl_to_live_ones() {
        let s = MemoryStore::new(3);
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
        s.wait("nothing", Token::generate(), 0, Duration::from_secs(10)).await;
        assert_eq!(start.elapsed(), Duration::ZERO);
    }
}
