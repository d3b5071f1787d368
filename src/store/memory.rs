//! The embedded store: one process, bounded by `max_entries` and `max_bytes`, TTLs on
//! a monotonic clock, and never an eviction of a PROCESSING entry. Forgets everything
//! on restart.
//!
//! When a bound is reached, an expired entry makes room if there is one, else the
//! oldest COMPLETED entry (by completion time): the newest ids are the ones retries
//! need. Entries are queued per state and TTL, so each queue is in expiry order and
//! both questions are answered from the queues' fronts, never by scanning. One mutex
//! guards it all; critical sections are a hash lookup plus amortised-constant queue work,
//! and the table is 256 tables, so that growing one is a short pause, not a long one.
//!
//! Compact by design (the store may hold a million ids in a small pod): a key is held
//! as its 128-bit keyed SipHash digest, not as a string, so an entry is a fixed 56
//! bytes in the table with no allocation of its own (two different keys would need
//! about 2^64 ids to collide, and the hash key is random per process, so no sender can
//! aim for a collision). A stored `replay` response is the only per-entry allocation.

use std::collections::{HashMap, VecDeque};
use std::hash::Hasher as _;
use std::mem;
use std::num::NonZeroU64;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use hashbrown::HashTable;
use http::HeaderValue;
use siphasher::sip128::{Hasher128 as _, SipHasher13};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::{
    Claim, Completion, Forgotten, KeyInfo, KeyState, Marker, OWN_PAGES_MIN, PAGE, Store, StoreError, StoredResponse,
    Token,
};

pub struct MemoryStore {
    inner: Mutex<Inner>,
    max_entries: usize,
    max_bytes: u64,
    /// The SipHash key, random per process.
    hash_key: (u64, u64),
}

struct Inner {
    slots: Slots,
    processing: Queues,
    completed: Queues,
    next_seq: u64,
    /// Expiry times are milliseconds since this instant.
    epoch: Instant,
}

/// The entries, what they cost, and who waits on them.
struct Slots {
    /// The entries, spread over [`SHARDS`] tables by hash. A table grows all at once,
    /// every entry moved under the store's lock (100 ms for one table going past
    /// 917,504 entries, a pause of every worker); a shard's growth moves 1/256 of that.
    shards: Box<[HashTable<Entry>]>,
    /// Entries over all shards (kept, not summed: `max_entries` is checked per claim).
    len: usize,
    /// The sum of [`Entry::cost`] over the shards: what `max_bytes` bounds.
    bytes: u64,
    /// Requests waiting for a PROCESSING entry to change (few, and only while waiting).
    waiters: HashMap<Digest, Arc<Notify>>,
}

/// A key as the store holds it: its 128-bit keyed SipHash (`.0` doubles as the table hash).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Digest(u64, u64);

struct Entry {
    digest: Digest,
    /// Milliseconds since [`Inner::epoch`].
    expires: u64,
    first_seen_ms: u64,
    state: State,
}

/// The entry's state, with its `seq`, which changes whenever the state does: queue
/// items with another `seq` are stale. `seq` sits in each variant and is never 0, so
/// the variant is told by a 0 there and needs no tag of its own: an entry is 56 bytes,
/// not 64. That also keeps a shard's table under an allocator size class: 8,192 slots
/// of 65 bytes went into a 640 KiB block, 186 bytes of RSS per key at a million keys.
enum State {
    Processing {
        token: Token,
        seq: NonZeroU64,
    },
    Completed {
        response: Option<Arc<StoredResponse>>,
        seq: NonZeroU64,
    },
}

/// A queue item: the entry's table hash and the `seq` it had when queued.
#[derive(Clone, Copy)]
struct Item {
    hash: u64,
    seq: u64,
}

/// What one entry costs against `max_bytes` besides a stored response: its table slot
/// (with its control byte) and its queue item. Counted exactly, so the bound and the
/// `dedup_store_bytes` gauge say the same thing.
pub const ENTRY_BYTES: u64 = (std::mem::size_of::<Entry>() + 1 + std::mem::size_of::<Item>()) as u64;

impl Entry {
    fn seq(&self) -> u64 {
        match self.state {
            State::Processing { seq, .. } | State::Completed { seq, .. } => seq.get(),
        }
    }

    fn marker(&self) -> Marker {
        match &self.state {
            State::Processing { token, .. } => Marker::Processing {
                token: *token,
                first_seen_ms: self.first_seen_ms,
            },
            State::Completed { response, .. } => Marker::Completed {
                first_seen_ms: self.first_seen_ms,
                response: response.clone(),
            },
        }
    }

    fn held_by(&self, token: Token, now: u64) -> bool {
        matches!(self.state, State::Processing { token: t, .. } if t == token) && self.expires > now
    }

    fn cost(&self) -> u64 {
        match &self.state {
            State::Completed {
                response: Some(response),
                ..
            } => ENTRY_BYTES + response_bytes(response),
            _ => ENTRY_BYTES,
        }
    }
}

/// The bytes a stored response holds: the struct behind its `Arc` (with the counts),
/// the body (whole pages when it has pages of its own) and the header values.
fn response_bytes(r: &StoredResponse) -> u64 {
    let header = |v: &Option<HeaderValue>| v.as_ref().map_or(0, |v| v.len());
    let body = match r.body.len() {
        n if n >= OWN_PAGES_MIN => n.next_multiple_of(PAGE),
        n => n,
    };
    (std::mem::size_of::<StoredResponse>() + 16 + body + header(&r.content_type) + header(&r.content_encoding)) as u64
}

/// Tables in [`Slots`]: a power of two.
const SHARDS: usize = 256;

/// The shard of a table hash: bits that a shard's table does not use (its bucket
/// index comes from the low bits, its control byte from the top 7).
fn shard(hash: u64) -> usize {
    (hash >> 40) as usize & (SHARDS - 1)
}

impl Slots {
    fn new() -> Self {
        Slots {
            shards: (0..SHARDS).map(|_| HashTable::new()).collect(),
            len: 0,
            bytes: 0,
            waiters: HashMap::new(),
        }
    }

    /// The table that holds (or would hold) the entries with this hash.
    fn table(&self, hash: u64) -> &HashTable<Entry> {
        &self.shards[shard(hash)]
    }

    fn table_mut(&mut self, hash: u64) -> &mut HashTable<Entry> {
        &mut self.shards[shard(hash)]
    }

    fn find(&self, d: Digest) -> Option<&Entry> {
        self.table(d.0).find(d.0, |e| e.digest == d)
    }

    fn find_mut(&mut self, d: Digest) -> Option<&mut Entry> {
        self.table_mut(d.0).find_mut(d.0, |e| e.digest == d)
    }

    /// The entry a queue item refers to, if the item is current.
    fn current(&self, item: Item) -> Option<&Entry> {
        self.table(item.hash).find(item.hash, |e| e.seq() == item.seq)
    }

    fn insert(&mut self, entry: Entry) {
        self.bytes += entry.cost();
        self.len += 1;
        let hash = entry.digest.0;
        self.table_mut(hash).insert_unique(hash, entry, |e| e.digest.0);
    }

    /// Removes the entry `eq` picks out among those with this hash.
    fn remove(&mut self, hash: u64, eq: impl FnMut(&Entry) -> bool) -> Option<Entry> {
        let (entry, _) = self.table_mut(hash).find_entry(hash, eq).ok()?.remove();
        self.bytes -= entry.cost();
        self.len -= 1;
        self.wake(entry.digest);
        Some(entry)
    }

    /// Replaces an entry's state, keeping the byte count exact and waking its waiters.
    fn change(&mut self, d: Digest, expires: u64, state: State) {
        let Some(entry) = self.find_mut(d) else {
            return;
        };
        let before = entry.cost();
        entry.state = state;
        entry.expires = expires;
        let after = entry.cost();
        self.bytes = self.bytes - before + after;
        self.wake(d);
    }

    fn wake(&mut self, d: Digest) {
        if !self.waiters.is_empty()
            && let Some(notify) = self.waiters.remove(&d)
        {
            notify.notify_waiters();
        }
    }
}

/// Items in the order their entries entered one state, one FIFO per TTL (a route
/// setting, so there are few): within a FIFO, insertion order is expiry order.
#[derive(Default)]
struct Queues(Vec<(u64, Fifo)>);

/// A FIFO of items held in chunks of [`CHUNK`], so it grows a chunk at a time. A
/// `VecDeque` doubles, and jemalloc (the shipped allocator) copies the old buffer to
/// grow it: 4-6 ms at 524,288 items (examples/store-fill.rs), under the store's lock.
#[derive(Default)]
struct Fifo {
    /// Every chunk but the last is full.
    chunks: VecDeque<Vec<Item>>,
    /// Where the front item is in the first chunk.
    head: usize,
    len: usize,
}

/// Items per chunk: 16 KiB, small next to the store, and a million items are only
/// about a thousand chunks.
const CHUNK: usize = 1024;

impl Fifo {
    fn push_back(&mut self, item: Item) {
        match self.chunks.back_mut() {
            Some(last) if last.len() < CHUNK => last.push(item),
            _ => {
                let mut chunk = Vec::with_capacity(CHUNK);
                chunk.push(item);
                self.chunks.push_back(chunk);
            }
        }
        self.len += 1;
    }

    fn front(&self) -> Option<&Item> {
        self.chunks.front()?.get(self.head)
    }

    fn pop_front(&mut self) -> Option<Item> {
        let only = self.chunks.len() == 1;
        let first = self.chunks.front_mut()?;
        let item = *first.get(self.head)?;
        self.head += 1;
        self.len -= 1;
        if self.head == first.len() {
            self.head = 0;
            if only {
                first.clear(); // kept for the next push
            } else {
                self.chunks.pop_front();
            }
        }
        Some(item)
    }

    fn iter(&self) -> impl Iterator<Item = &Item> {
        let head = self.head;
        self.chunks
            .iter()
            .enumerate()
            .flat_map(move |(i, chunk)| chunk[if i == 0 { head } else { 0 }..].iter())
    }

    /// Keeps the items `keep` accepts, in order, in as few chunks as they need.
    fn retain(&mut self, mut keep: impl FnMut(&Item) -> bool) {
        let old = mem::take(self);
        for item in old.iter().filter(|item| keep(item)) {
            self.push_back(*item);
        }
    }
}

impl Queues {
    fn push(&mut self, ttl: u64, item: Item) {
        match self.0.iter_mut().find(|(t, _)| *t == ttl) {
            Some((_, q)) => q.push_back(item),
            None => {
                let mut queue = Fifo::default();
                queue.push_back(item);
                self.0.push((ttl, queue));
            }
        }
    }

    /// The current front of queue `i` (its `seq` and expiry), after dropping stale items.
    fn front(&mut self, i: usize, slots: &Slots) -> Option<(u64, u64)> {
        let queue = &mut self.0[i].1;
        while let Some(item) = queue.front() {
            match slots.current(*item) {
                Some(e) => return Some((e.seq(), e.expires)),
                None => drop(queue.pop_front()),
            }
        }
        None
    }

    fn remove_front(&mut self, i: usize, slots: &mut Slots) {
        if let Some(item) = self.0[i].1.pop_front() {
            slots.remove(item.hash, |e| e.seq() == item.seq);
        }
    }

    /// Removes one expired entry of this state, if any queue starts with one.
    fn remove_expired(&mut self, slots: &mut Slots, now: u64) -> bool {
        for i in 0..self.0.len() {
            if self.front(i, slots).is_some_and(|(_, expires)| expires <= now) {
                self.remove_front(i, slots);
                return true;
            }
        }
        false
    }

    /// Removes the entry that entered this state first.
    fn remove_oldest(&mut self, slots: &mut Slots) -> bool {
        let oldest = (0..self.0.len())
            .filter_map(|i| Some((self.front(i, slots)?.0, i)))
            .min();
        oldest.is_some_and(|(_, i)| {
            self.remove_front(i, slots);
            true
        })
    }

    /// Drops every stale item once stale items pile up behind a long-lived front.
    fn compact(&mut self, slots: &Slots, limit: usize) {
        if self.0.iter().map(|(_, q)| q.len).sum::<usize>() > limit {
            for (_, queue) in &mut self.0 {
                queue.retain(|item| slots.current(*item).is_some());
            }
        }
    }
}

/// Expired entries removed per claim: keeps memory tidy without a sweeper task.
const SWEEP_PER_CLAIM: usize = 2;

impl MemoryStore {
    pub fn new(max_entries: usize, max_bytes: u64) -> Self {
        let mut seed = [0u8; 16];
        // Without OS randomness the digest is still a good hash; only its resistance to
        // a sender searching for collisions would rest on the id space.
        let _ = getrandom::fill(&mut seed);
        let (k0, k1) = seed.split_at(8);
        let word = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or_default());
        MemoryStore {
            inner: Mutex::new(Inner {
                slots: Slots::new(),
                processing: Queues::default(),
                completed: Queues::default(),
                next_seq: 0,
                epoch: Instant::now(),
            }),
            max_entries: max_entries.max(1),
            max_bytes,
            hash_key: (word(k0), word(k1)),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the map half-updated in a way
        // that matters more than losing the whole store, so keep serving.
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn digest(&self, key: &str) -> Digest {
        let mut h = SipHasher13::new_with_keys(self.hash_key.0, self.hash_key.1);
        h.write(key.as_bytes());
        let h = h.finish128();
        Digest(h.h1, h.h2)
    }

    /// Whether an entry of `cost` more bytes (and, if `new`, one more entry) fits.
    fn fits(&self, slots: &Slots, cost: u64, new: bool) -> bool {
        (!new || slots.len < self.max_entries) && slots.bytes + cost <= self.max_bytes
    }
}

impl Inner {
    fn now(&self) -> u64 {
        millis(Instant::now().saturating_duration_since(self.epoch))
    }

    /// Removes up to `budget` expired entries.
    fn sweep(&mut self, now: u64, budget: usize) {
        for _ in 0..budget {
            if !self.processing.remove_expired(&mut self.slots, now)
                && !self.completed.remove_expired(&mut self.slots, now)
            {
                return;
            }
        }
    }

    /// Frees one entry: an expired one if there is one, else the oldest COMPLETED.
    fn make_room(&mut self, now: u64) -> bool {
        self.processing.remove_expired(&mut self.slots, now)
            || self.completed.remove_expired(&mut self.slots, now)
            || self.completed.remove_oldest(&mut self.slots)
    }

    fn seq(&mut self) -> NonZeroU64 {
        self.next_seq += 1;
        NonZeroU64::MIN.saturating_add(self.next_seq - 1)
    }
}

/// A duration in whole milliseconds, rounded up (a TTL never shrinks). Whole seconds
/// are whole milliseconds, so only the fraction rounds (and no 128-bit division runs,
/// twice per claim and per complete).
fn millis(d: Duration) -> u64 {
    d.as_secs()
        .saturating_mul(1000)
        .saturating_add(u64::from(d.subsec_nanos().div_ceil(1_000_000)))
}

impl MemoryStore {
    /// [`Store::claim`], which here never waits: the state machine claims in place with
    /// it (nothing can cancel a call that does not yield).
    pub fn claim_now(&self, key: &str, token: Token, first_seen_ms: u64, ttl: Duration) -> Result<Claim, StoreError> {
        let d = self.digest(key);
        let mut guard = self.lock();
        let inner = &mut *guard;
        let now = inner.now();
        inner.sweep(now, SWEEP_PER_CLAIM);
        let ttl = millis(ttl);
        let expired = match inner.slots.find(d) {
            Some(entry) if entry.expires > now => return Ok(Claim::Found(entry.marker())),
            Some(_) => true,
            None => false,
        };
        let seq = inner.seq();
        if expired {
            // The expired entry's slot is reused; anyone still waiting on it looks again.
            if let Some(entry) = inner.slots.find_mut(d) {
                entry.first_seen_ms = first_seen_ms;
            }
            inner.slots.change(d, now + ttl, State::Processing { token, seq });
        } else {
            while !self.fits(&inner.slots, ENTRY_BYTES, true) {
                if !inner.make_room(now) {
                    return Err(StoreError::Full(inner.slots.len));
                }
            }
            inner.slots.insert(Entry {
                digest: d,
                expires: now + ttl,
                first_seen_ms,
                state: State::Processing { token, seq },
            });
        }
        inner.processing.push(
            ttl,
            Item {
                hash: d.0,
                seq: seq.get(),
            },
        );
        inner.processing.compact(&inner.slots, 2 * self.max_entries);
        Ok(Claim::Claimed)
    }

    /// [`Store::complete`], which here never waits either.
    pub fn complete_now(&self, key: &str, token: Token, completion: Completion) -> Result<bool, StoreError> {
        let d = self.digest(key);
        let mut guard = self.lock();
        let inner = &mut *guard;
        let now = inner.now();
        if !inner.slots.find(d).is_some_and(|e| e.held_by(token, now)) {
            return Ok(false);
        }
        // `StoredResponse::capture` made the reply's allocations exact: counted as they are.
        let mut response = completion.response;
        if let Some(extra) = response.as_ref().map(response_bytes) {
            // Room for the reply, by the same rule (this entry is PROCESSING and live, so
            // it is never the one evicted); if even that is not enough, keep the
            // COMPLETED marker without the reply: duplicates get the duplicate answer.
            while !self.fits(&inner.slots, extra, false) {
                if !inner.make_room(now) {
                    response = None;
                    break;
                }
            }
        }
        let ttl = millis(completion.ttl);
        let seq = inner.seq();
        let response = response.map(Arc::new);
        inner.slots.change(d, now + ttl, State::Completed { response, seq });
        inner.completed.push(
            ttl,
            Item {
                hash: d.0,
                seq: seq.get(),
            },
        );
        inner.completed.compact(&inner.slots, 2 * self.max_entries);
        Ok(true)
    }

    /// [`Store::release`], which here never waits either.
    pub fn release_now(&self, key: &str, token: Token) -> Result<bool, StoreError> {
        let d = self.digest(key);
        let mut inner = self.lock();
        let now = inner.now();
        Ok(inner
            .slots
            .remove(d.0, |e| e.digest == d && e.held_by(token, now))
            .is_some())
    }
}

impl Store for MemoryStore {
    async fn claim(&self, key: &str, token: Token, first_seen_ms: u64, ttl: Duration) -> Result<Claim, StoreError> {
        self.claim_now(key, token, first_seen_ms, ttl)
    }

    async fn complete(&self, key: &str, token: Token, completion: Completion) -> Result<bool, StoreError> {
        self.complete_now(key, token, completion)
    }

    /// The token alone identifies the holder here.
    async fn release(&self, key: &str, token: Token, _first_seen_ms: u64) -> Result<bool, StoreError> {
        self.release_now(key, token)
    }

    async fn get(&self, key: &str) -> Result<Option<Marker>, StoreError> {
        let d = self.digest(key);
        let inner = self.lock();
        let now = inner.now();
        Ok(inner.slots.find(d).filter(|e| e.expires > now).map(Entry::marker))
    }

    async fn wait(&self, key: &str, holder: Token, _attempt: u32, max: Duration) {
        let d = self.digest(key);
        let (notified, limit) = {
            let mut inner = self.lock();
            let now = inner.now();
            let Some(expires) = inner
                .slots
                .find(d)
                .filter(|e| e.held_by(holder, now))
                .map(|e| e.expires)
            else {
                return; // already changed: look again at once
            };
            let notify = Arc::clone(inner.slots.waiters.entry(d).or_default());
            // Registered before the lock is released, so a change in between still wakes us.
            (notify.notified_owned(), max.min(Duration::from_millis(expires - now)))
        };
        let _ = tokio::time::timeout(limit, notified).await;
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }

    fn entries(&self) -> Option<usize> {
        Some(self.lock().slots.len)
    }

    fn bytes(&self) -> Option<u64> {
        Some(self.lock().slots.bytes)
    }

    async fn inspect(&self, key: &str) -> Result<Option<KeyInfo>, StoreError> {
        Ok(self.inspect_entry(key))
    }

    async fn forget(&self, key: &str, force: bool) -> Result<Forgotten, StoreError> {
        Ok(self.forget_entry(key, force))
    }
}

// ---------------------------------------------------------------- admin: inspect, forget

impl MemoryStore {
    fn inspect_entry(&self, key: &str) -> Option<KeyInfo> {
        let d = self.digest(key);
        let inner = self.lock();
        let now = inner.now();
        let entry = inner.slots.find(d).filter(|e| e.expires > now)?;
        let (state, reply_stored) = match &entry.state {
            State::Processing { .. } => (KeyState::Processing, false),
            State::Completed { response, .. } => (KeyState::Completed, response.is_some()),
        };
        Some(KeyInfo {
            state,
            first_seen_ms: entry.first_seen_ms,
            ttl: Some(Duration::from_millis(entry.expires - now)),
            reply_stored,
        })
    }

    /// Removes the entry (bytes and entries counted down, its queue items turn stale);
    /// anyone waiting on a forgotten PROCESSING entry wakes and claims it.
    fn forget_entry(&self, key: &str, force: bool) -> Forgotten {
        let d = self.digest(key);
        let mut inner = self.lock();
        let now = inner.now();
        let state = match inner.slots.find(d).filter(|e| e.expires > now).map(|e| &e.state) {
            None => return Forgotten::Absent,
            Some(State::Processing { .. }) if !force => return Forgotten::Refused,
            Some(State::Processing { .. }) => KeyState::Processing,
            Some(State::Completed { .. }) => KeyState::Completed,
        };
        inner.slots.remove(d.0, |e| e.digest == d);
        Forgotten::Deleted(state)
    }
}

#[cfg(test)]
mod tests;
