//! Where markers live: the [`Store`] contract the state machine relies on, the
//! [`QueueStore`] contract of queued routes, and the backends (embedded memory,
//! embedded SQLite, Redis).
//!
//! A marker is PROCESSING (held by one owner token, short TTL), COMPLETED (long TTL,
//! maybe with the upstream's response) or, on a queued route, QUEUED (its message is
//! in the queue; no TTL). Claim is atomic; complete and release act only while the
//! marker still holds the caller's token.

pub mod admin;
pub mod memory;
pub mod queue;
pub mod redis;
pub mod sqlite;
mod waits;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;

use crate::config::{Backend, StoreConfig};
use http::{HeaderValue, StatusCode};

pub use admin::{Forgotten, KeyInfo, KeyState};
pub use memory::MemoryStore;
pub use queue::QueueStore;
pub use redis::RedisStore;
pub use sqlite::SqliteStore;

/// Identifies the one request that holds a PROCESSING marker. Unique across replicas:
/// 64 random bits per process, 64 bits of counter. (Two words rather than a `u128`,
/// whose 16-byte alignment would pad every memory store entry.)
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Token {
    process: u64,
    counter: u64,
}

impl Token {
    pub fn generate() -> Self {
        static PROCESS: OnceLock<u64> = OnceLock::new();
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let process = *PROCESS.get_or_init(|| {
            let mut seed = [0u8; 8];
            // Without OS randomness, time and pid still make collisions between
            // replicas vanishingly unlikely.
            if getrandom::fill(&mut seed).is_err() {
                let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
                seed = ((nanos as u64) ^ u64::from(std::process::id()).rotate_left(32)).to_le_bytes();
            }
            u64::from_le_bytes(seed)
        });
        Token {
            process,
            counter: COUNTER.fetch_add(1, Ordering::Relaxed),
        }
    }

    pub fn from_u128(value: u128) -> Self {
        Token {
            process: (value >> 64) as u64,
            counter: value as u64,
        }
    }

    /// How many digits [`Token::hex`] gives.
    pub const HEX_LEN: usize = 32;

    /// The 32 lowercase hex digits that name this token in stored values and logs.
    /// A table lookup per byte: the Redis store writes it twice per forwarded
    /// request, and `{:016x}` pads through the formatter one `write_char` at a time
    /// (about 1,000 instructions per token, measured with callgrind).
    pub fn hex(self) -> [u8; Self::HEX_LEN] {
        let value = (u128::from(self.process) << 64) | u128::from(self.counter);
        let mut out = [0u8; Self::HEX_LEN];
        // Cannot fail: 16 bytes always fill 32 digits exactly.
        let _ = hex::encode_to_slice(value.to_be_bytes(), &mut out);
        out
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(std::str::from_utf8(&self.hex()).map_err(|_| fmt::Error)?)
    }
}

/// A 2xx upstream response kept for `replay`: what a client needs to read the body
/// the same way again (a gzipped reply replayed without its `Content-Encoding` would be
/// garbage to the sender).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredResponse {
    pub status: StatusCode,
    pub content_type: Option<HeaderValue>,
    pub content_encoding: Option<HeaderValue>,
    pub body: Bytes,
}

impl StoredResponse {
    /// What `replay` needs of a received response, in allocations of its own. Header
    /// values hyper parsed are slices of the connection's read buffer: kept as they
    /// are, every stored reply would pin a whole buffer (measured: 64 MiB of replies
    /// held 250 MiB) and the memory store's byte count would be fiction. `body` must own
    /// its allocation ([`crate::body::read_up_to`] gives such bytes).
    pub fn capture(head: &http::response::Parts, body: Bytes) -> Self {
        let copy = |name| {
            head.headers
                .get(name)
                .and_then(|v: &HeaderValue| HeaderValue::from_bytes(v.as_bytes()).ok())
        };
        StoredResponse {
            status: head.status,
            content_type: copy(http::header::CONTENT_TYPE),
            content_encoding: copy(http::header::CONTENT_ENCODING),
            body: own_pages(body),
        }
    }
}

/// Stored replies of at least this size get pages of their own (see [`own_pages`]).
pub const OWN_PAGES_MIN: usize = 32 * 1024;

/// The page size [`own_pages`] rounds to, for the memory store's byte count.
pub const PAGE: usize = 4096;

/// Moves a large reply into an anonymous mapping of its own. Stored replies live long
/// and are evicted oldest first while new ones arrive; in malloc's heap the holes they
/// leave are split by short-lived buffers and not reused (measured with 64 KiB replies:
/// RSS 100 MiB for 64 MiB stored). A mapping goes back to the system the moment its
/// reply is evicted. If the system refuses a mapping, the heap copy is kept.
fn own_pages(body: Bytes) -> Bytes {
    if body.len() < OWN_PAGES_MIN {
        return body;
    }
    let Ok(mut pages) = memmap2::MmapOptions::new().len(body.len()).populate().map_anon() else {
        return body;
    };
    pages.copy_from_slice(&body);
    match pages.make_read_only() {
        Ok(pages) => Bytes::from_owner(pages),
        Err(_) => body,
    }
}

/// The largest response body `replay` stores; larger ones get the duplicate answer.
pub const MAX_STORED_BODY: usize = 64 * 1024;

/// The state a claim found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Marker {
    Processing {
        token: Token,
        first_seen_ms: u64,
    },
    Completed {
        first_seen_ms: u64,
        response: Option<Arc<StoredResponse>>,
    },
    /// A queued route's message is held in its queue (ready, retrying, being
    /// delivered, or dead): acknowledged, so a duplicate is acknowledged too. No TTL
    /// while the message is held; delivered, it becomes COMPLETED.
    Queued {
        first_seen_ms: u64,
    },
}

impl Marker {
    pub fn first_seen_ms(&self) -> u64 {
        match self {
            Marker::Processing { first_seen_ms, .. }
            | Marker::Completed { first_seen_ms, .. }
            | Marker::Queued { first_seen_ms } => *first_seen_ms,
        }
    }
}

/// The result of an atomic claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// The key was free: it now holds PROCESSING with the caller's token.
    Claimed,
    /// The key was already held.
    Found(Marker),
}

/// What a COMPLETED marker records.
#[derive(Clone, Debug)]
pub struct Completion {
    /// The claim's `first_seen_ms`: Redis, completing with `SET ... IFEQ`, compares the
    /// whole PROCESSING value, which holds it next to the token.
    pub first_seen_ms: u64,
    pub ttl: Duration,
    pub response: Option<StoredResponse>,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Sent, but no reply in time: it may have taken effect.
    #[error("store call timed out")]
    Timeout,
    /// Sent, and the connection broke before the reply: it may have taken effect.
    #[error("store connection lost: {0}")]
    Lost(String),
    /// Not sent (no connection), or refused by the store: it did not take effect.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    #[error("memory store is full of PROCESSING entries ({0} entries)")]
    Full(usize),
    #[error("unreadable marker: {0}")]
    Corrupt(String),
}

impl StoreError {
    /// Whether the call may have taken effect although it failed (its reply was lost),
    /// so that repeating it is how to find out.
    pub fn is_ambiguous(&self) -> bool {
        matches!(self, StoreError::Timeout | StoreError::Lost(_))
    }
}

/// The store contract. Every call must finish within `store.timeout`: the backend
/// enforces it (the memory store never waits; Redis bounds each call and reports
/// [`StoreError::Timeout`]).
pub trait Store: Send + Sync + 'static {
    /// Atomically: key absent (or expired) -> PROCESSING(token) for `ttl`, else report
    /// what is there. Never changes an existing marker or its TTL.
    fn claim(
        &self,
        key: &str,
        token: Token,
        first_seen_ms: u64,
        ttl: Duration,
    ) -> impl Future<Output = Result<Claim, StoreError>> + Send;

    /// PROCESSING(token) -> COMPLETED. False when the marker no longer holds `token`.
    fn complete(
        &self,
        key: &str,
        token: Token,
        completion: Completion,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Deletes PROCESSING(token). False when the marker no longer holds `token`.
    /// `first_seen_ms` is the claim's, as in [`Completion::first_seen_ms`]: Redis,
    /// releasing with `DELEX ... IFEQ`, compares the whole PROCESSING value.
    fn release(
        &self,
        key: &str,
        token: Token,
        first_seen_ms: u64,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Reads a marker without changing it.
    fn get(&self, key: &str) -> impl Future<Output = Result<Option<Marker>, StoreError>> + Send;

    /// Returns when the PROCESSING marker held by `holder` may have changed, or after
    /// `max`, whichever is first. `attempt` counts the waits so far (for backoff).
    fn wait(&self, key: &str, holder: Token, attempt: u32, max: Duration) -> impl Future<Output = ()> + Send;

    /// A cheap liveness check for readiness.
    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Entries held, for stores that know it cheaply (memory).
    fn entries(&self) -> Option<usize> {
        None
    }

    /// Opens what this thread will use (each worker calls it as it starts).
    fn prepare_thread(&self) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// Bytes held as `max_bytes` counts them, for stores that bound it (memory).
    fn bytes(&self) -> Option<u64> {
        None
    }

    /// For the admin API: a marker's state, age, TTL left and whether a reply is stored.
    fn inspect(&self, key: &str) -> impl Future<Output = Result<Option<KeyInfo>, StoreError>> + Send;

    /// For the admin API: deletes a marker so the next delivery of its message is
    /// forwarded again. A PROCESSING marker only with `force` (its owner may still be
    /// forwarding); what was there either way.
    fn forget(&self, key: &str, force: bool) -> impl Future<Output = Result<Forgotten, StoreError>> + Send;
}

/// The configured backend, chosen at start.
pub enum AnyStore {
    Memory(MemoryStore),
    Sqlite(SqliteStore),
    Redis(Box<RedisStore>),
}

macro_rules! each_backend {
    ($self:ident, $store:ident => $call:expr) => {
        match $self {
            AnyStore::Memory($store) => $call,
            AnyStore::Sqlite($store) => $call,
            AnyStore::Redis($store) => $call,
        }
    };
}

/// Like `each_backend!` for async calls, with the SQLite and Redis futures boxed: the
/// Redis one carries a connection, a deadline and the reply (kilobytes), and inline it
/// would make every caller's future (the memory store's too) that large, to be moved
/// around on every request. A call to another thread or over the network affords the
/// allocation.
macro_rules! each_backend_async {
    ($self:ident, $store:ident => $call:expr) => {
        match $self {
            AnyStore::Memory($store) => $call.await,
            AnyStore::Sqlite($store) => Box::pin($call).await,
            AnyStore::Redis($store) => Box::pin($call).await,
        }
    };
}

impl AnyStore {
    /// A claim the backend answers without waiting (the memory store's), else `None`:
    /// the state machine makes such a claim in place, before it boxes anything.
    pub fn claim_now(
        &self,
        key: &str,
        token: Token,
        first_seen_ms: u64,
        ttl: Duration,
    ) -> Option<Result<Claim, StoreError>> {
        match self {
            AnyStore::Memory(s) => Some(s.claim_now(key, token, first_seen_ms, ttl)),
            AnyStore::Sqlite(_) | AnyStore::Redis(_) => None,
        }
    }
}

/// The future of a claim, complete or release on [`AnyStore`]: the memory store's reply,
/// made when the call is (it never waits), or the SQLite or Redis call, boxed. Nested `async fn`s
/// would each keep their own copy of the arguments, and the state machine's future,
/// which holds these calls, is moved and boxed on every request.
enum StoreCall<T, S, R> {
    Done(Option<T>),
    Sqlite(Pin<Box<S>>),
    Redis(Pin<Box<R>>),
}

impl<T: Unpin, S: Future<Output = T>, R: Future<Output = T>> Future for StoreCall<T, S, R> {
    type Output = T;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        match self.get_mut() {
            StoreCall::Done(reply) => Poll::Ready(reply.take().expect("a store call polled after its reply")),
            StoreCall::Sqlite(call) => call.as_mut().poll(cx),
            StoreCall::Redis(call) => call.as_mut().poll(cx),
        }
    }
}

/// Like `each_backend!` for the calls of the state machine: the memory store's
/// synchronous `*_now` reply, or the SQLite or Redis future, boxed ([`StoreCall`]).
macro_rules! each_backend_call {
    ($self:ident, $store:ident => $now:expr, $call:expr) => {
        match $self {
            AnyStore::Memory($store) => StoreCall::Done(Some($now)),
            AnyStore::Sqlite($store) => StoreCall::Sqlite(Box::pin($call)),
            AnyStore::Redis($store) => StoreCall::Redis(Box::pin($call)),
        }
    };
}

impl Store for AnyStore {
    fn claim(
        &self,
        key: &str,
        token: Token,
        first_seen_ms: u64,
        ttl: Duration,
    ) -> impl Future<Output = Result<Claim, StoreError>> + Send {
        each_backend_call!(self, s => s.claim_now(key, token, first_seen_ms, ttl), s.claim(key, token, first_seen_ms, ttl))
    }

    fn complete(
        &self,
        key: &str,
        token: Token,
        completion: Completion,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        each_backend_call!(self, s => s.complete_now(key, token, completion), s.complete(key, token, completion))
    }

    fn release(
        &self,
        key: &str,
        token: Token,
        first_seen_ms: u64,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        each_backend_call!(self, s => s.release_now(key, token), s.release(key, token, first_seen_ms))
    }

    async fn get(&self, key: &str) -> Result<Option<Marker>, StoreError> {
        each_backend_async!(self, s => s.get(key))
    }

    async fn wait(&self, key: &str, holder: Token, attempt: u32, max: Duration) {
        each_backend_async!(self, s => s.wait(key, holder, attempt, max))
    }

    async fn ping(&self) -> Result<(), StoreError> {
        each_backend_async!(self, s => s.ping())
    }

    fn entries(&self) -> Option<usize> {
        each_backend!(self, s => s.entries())
    }

    async fn prepare_thread(&self) {
        if let AnyStore::Redis(s) = self {
            s.prepare_thread().await;
        }
    }

    fn bytes(&self) -> Option<u64> {
        each_backend!(self, s => s.bytes())
    }

    async fn inspect(&self, key: &str) -> Result<Option<KeyInfo>, StoreError> {
        each_backend_async!(self, s => s.inspect(key))
    }

    async fn forget(&self, key: &str, force: bool) -> Result<Forgotten, StoreError> {
        each_backend_async!(self, s => s.forget(key, force))
    }
}

/// Like `each_backend_async!` for the queue calls: the memory store keeps no queue
/// (the config refuses `delivery = "queued"` on it, so this is never reached).
macro_rules! each_queue {
    ($self:ident, $store:ident => $call:expr) => {
        match $self {
            AnyStore::Memory(_) => Err(StoreError::Unavailable("the memory store keeps no queue".into())),
            AnyStore::Sqlite($store) => Box::pin($call).await,
            AnyStore::Redis($store) => Box::pin($call).await,
        }
    };
}

impl QueueStore for AnyStore {
    async fn enqueue(
        &self,
        route: &str,
        message: &queue::Message,
        max_queued: u64,
        processing_ttl: Duration,
    ) -> Result<queue::Enqueued, StoreError> {
        each_queue!(self, s => s.enqueue(route, message, max_queued, processing_ttl))
    }

    async fn lease(
        &self,
        route: &str,
        now_ms: u64,
        reclaim_after: Duration,
        max: usize,
    ) -> Result<queue::Lease, StoreError> {
        each_queue!(self, s => s.lease(route, now_ms, reclaim_after, max))
    }

    async fn settle_all(&self, route: &str, ended: &[(&queue::Leased, queue::Settled)]) -> Result<(), StoreError> {
        each_queue!(self, s => s.settle_all(route, ended))
    }

    async fn counts(&self, route: &str, now_ms: u64) -> Result<queue::QueueCounts, StoreError> {
        each_queue!(self, s => s.counts(route, now_ms))
    }

    async fn dead_letters(&self, route: &str, limit: usize) -> Result<Vec<queue::DeadLetter>, StoreError> {
        each_queue!(self, s => s.dead_letters(route, limit))
    }

    async fn retry_dead(&self, route: &str, id: Option<&str>, now_ms: u64) -> Result<u64, StoreError> {
        each_queue!(self, s => s.retry_dead(route, id, now_ms))
    }

    async fn drop_dead(&self, route: &str, id: &str) -> Result<bool, StoreError> {
        each_queue!(self, s => s.drop_dead(route, id))
    }
}

/// Opens the configured store (for Redis: connects and checks the server first).
pub async fn connect(config: &StoreConfig) -> Result<AnyStore, StoreError> {
    match &config.backend {
        Backend::Memory { max_entries, max_bytes } => Ok(AnyStore::Memory(MemoryStore::new(*max_entries, *max_bytes))),
        Backend::Sqlite { path, fsync, max_bytes } => {
            SqliteStore::open(path, *fsync, *max_bytes, config.timeout).map(AnyStore::Sqlite)
        }
        Backend::Redis {
            target,
            pool_size,
            wait_replicas,
        } => RedisStore::connect(target, *pool_size, config.timeout, &config.key_prefix)
            .await
            .map(|s| AnyStore::Redis(Box::new(s.waiting_for(*wait_replicas)))),
    }
}

/// Milliseconds since the Unix epoch: marker timestamps readable by humans and shared
/// by replicas on different machines.
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
