//! The Redis store: shared by every replica, on standalone Redis (>= 7) or Redis
//! Cluster. One round trip per operation: a claim is `SET key v NX PX ttl GET`; complete
//! and release are compare-and-set / compare-and-delete on the owner token. Complete is
//! `SET key v PX ttl IFEQ <PROCESSING value>` where every server has `IFEQ` (Valkey >=
//! 8.1, Redis >= 8.4), release is `DELEX key IFEQ <PROCESSING value>` where every server
//! has `DELEX` (Redis >= 8.4); elsewhere each is a Lua script.
//!
//! Values are JSON, readable with `redis-cli GET`:
//! `{"state":"processing","token":"<32 hex>","first_seen_ms":<unix ms>}` and
//! `{"state":"completed","first_seen_ms":..,"completed_ms":..,"response":{..}}`.
//!
//! Connections are multiplexed: each carries every concurrent call at once (they are
//! pipelined onto the socket and their replies matched in order), so a burst of claims
//! costs one write and one read on each side instead of one per call. `pool_size` of
//! them are used in turn. On a `redis://` URL they are the store's own lean connections
//! (`resp`); on `rediss://` and in a cluster, redis-rs's. A connection is
//! dropped (and the next call connects afresh, to wherever the URL resolves now) when a
//! call on it timed out or broke at the transport, or when Redis answered that it
//! cannot take writes (a demoted primary after a failover): see `connection::Failure`. One of the
//! store's own that broke while idle is replaced before a call is sent on it.
//!
//! Files by job: `connection` (lanes of connections, how a failed call is read),
//! `resp` and `command` (the store's own RESP connection), `probe` (start-up
//! checks, readiness keys), `value` (the stored value format), `queue` (queued
//! routes' streams), `admin` (inspect and forget for the admin API). Waking this
//! process's waiters is [`crate::store::waits`], shared with SQLite.

mod admin;
mod command;
mod connection;
mod probe;
mod queue;
mod resp;
#[cfg(test)]
mod tests;
mod value;

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use deadpool_redis::redis::{self, FromRedisValue, Script};

use super::{Claim, Completion, Forgotten, KeyInfo, Marker, Store, StoreError, Token};
use crate::config::RedisTarget;
use command::Arg;
use connection::{Call, Connections, Connector, Failure};
pub use probe::{durability, key_slot};

/// The store's own RESP reader on `buf` (one reply, and the bytes it took; `None` while
/// part of it has yet to arrive): for the `resp_vs_redis_rs` fuzz target.
#[doc(hidden)]
pub fn read_reply(buf: &[u8]) -> std::io::Result<Option<(redis::Value, usize)>> {
    resp::parse(buf)
}
use super::waits::{LocalWaits, poll_backoff};
use probe::{Check, check_later, check_server, health_keys};
use value::parse_marker;

/// PROCESSING(token) -> COMPLETED, only while the marker holds the caller's token.
/// ARGV[1] is the PROCESSING value's prefix up to and including the token.
const COMPLETE_LUA: &str = r"local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, #ARGV[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0";

/// Deletes PROCESSING(token), only while the marker holds the caller's token.
const RELEASE_LUA: &str = r"local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, #ARGV[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0";

static COMPLETE: LazyLock<Script> = LazyLock::new(|| Script::new(COMPLETE_LUA));
static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_LUA));

pub struct RedisStore {
    /// Identifies this store's connections in each thread's [`LOCAL`] list.
    id: u64,
    pool_size: usize,
    /// Readiness has a connection of its own: it must answer for the store, not queue
    /// behind (or be dropped with) a traffic connection.
    health: Connections,
    /// Written by the readiness check: `PING` answers on a read-only replica too. One
    /// key, or in a cluster one per sixteenth of the slots ([`health_keys`]).
    health_keys: Vec<String>,
    /// The health key that last took the write: tried first.
    health_good: AtomicUsize,
    timeout: Duration,
    connector: Connector,
    /// Complete with `SET ... IFEQ` rather than [`COMPLETE_LUA`]: every server had it
    /// at start-up. A server that refuses it later (a failover to an older one) turns
    /// it off for good: see [`RedisStore::unless_unknown`].
    set_if_eq: AtomicBool,
    /// Release with `DELEX ... IFEQ` rather than [`RELEASE_LUA`], by the same rules.
    del_if_eq: AtomicBool,
    local_waits: LocalWaits,
    /// Set when a server that did not answer at start answers and cannot be the store
    /// (why): readiness then fails for good, as the claims do.
    unusable: Arc<std::sync::OnceLock<String>>,
    /// `store.key_prefix`: queued routes' keys start with it.
    key_prefix: String,
    /// `store.wait_replicas`: replicas an append waits for (`WAIT`) before its ack.
    wait_replicas: u32,
    /// This store's consumer name in queued routes' consumer groups.
    consumer: String,
    /// A cluster: a message's marker is on another slot than its queue, so it is
    /// written by calls of its own (see `queue`).
    cluster: bool,
    /// When each queued route was last searched for abandoned deliveries (Unix ms).
    reclaimed: std::sync::Mutex<std::collections::HashMap<String, u64>>,
}

thread_local! {
    /// This thread's traffic connections, per store (a process has one; tests have
    /// many). Each worker thread has its own: a multiplexed connection is driven by a
    /// task on the runtime that opened it, so sharing one across workers would cost a
    /// wake-up of another thread on every call, both ways.
    static LOCAL: RefCell<Vec<(u64, Arc<Connections>)>> = const { RefCell::new(Vec::new()) };
}

/// Numbers stores for [`LOCAL`].
static NEXT_STORE: AtomicU64 = AtomicU64::new(0);

impl RedisStore {
    /// Opens the store and checks the server(s): Redis >= 7 (for `SET NX GET`), and a
    /// warning unless `maxmemory-policy` is `noeviction` (an evicting Redis silently
    /// drops markers).
    pub async fn connect(
        target: &RedisTarget,
        pool_size: usize,
        timeout: Duration,
        key_prefix: &str,
    ) -> Result<Self, StoreError> {
        let connector = Connector::new(target, timeout)?;
        let store = RedisStore {
            id: NEXT_STORE.fetch_add(1, Ordering::Relaxed),
            pool_size,
            health: connector.connections(1),
            health_keys: health_keys(target, key_prefix),
            health_good: AtomicUsize::new(0),
            timeout,
            connector,
            set_if_eq: AtomicBool::new(true),
            del_if_eq: AtomicBool::new(true),
            local_waits: LocalWaits::default(),
            unusable: Arc::default(),
            key_prefix: key_prefix.to_owned(),
            wait_replicas: 0,
            consumer: queue::consumer_name(),
            cluster: matches!(target, RedisTarget::Cluster(_)),
            reclaimed: std::sync::Mutex::default(),
        };
        let mut unreachable = Vec::new();
        // Together: a seed that does not answer costs its timeout once, not once each.
        let checks = futures_util::future::join_all(target.urls().iter().map(|url| check_server(url, timeout)));
        let checks = checks.await;
        let some_answer = checks.iter().any(Result::is_ok);
        for (url, check) in target.urls().iter().zip(checks) {
            match check {
                Ok(server) => {
                    if !server.set_if_eq {
                        store.set_if_eq.store(false, Ordering::Relaxed);
                    }
                    if !server.del_if_eq {
                        store.del_if_eq.store(false, Ordering::Relaxed);
                    }
                }
                Err(Check::Unusable(error)) => return Err(error),
                // A cluster answers through any seed: one down is no outage by itself.
                Err(Check::Unreachable(error)) if some_answer => {
                    tracing::warn!(%error, "redis cluster seed not reachable at start: the cluster is reached \
                        through the others");
                    unreachable.push(url.clone());
                }
                Err(Check::Unreachable(error)) => {
                    tracing::warn!(%error, "redis not reachable at start: serving anyway, not ready and per \
                        store.on_error, until it answers");
                    unreachable.push(url.clone());
                }
            }
        }
        if unreachable.is_empty() {
            store.load_scripts().await?;
            store.prepare_thread().await;
        } else {
            // Calls connect as they go, and the scripts load on the first NOSCRIPT.
            // A server not read at start may be older than 8.4: complete and release
            // use the scripts (right on every server) until a restart reads them all.
            store.set_if_eq.store(false, Ordering::Relaxed);
            store.del_if_eq.store(false, Ordering::Relaxed);
            check_later(unreachable, timeout, &store.unusable);
        }
        Ok(store)
    }

    /// The store with appends that wait for `replicas` replicas (`store.wait_replicas`).
    pub fn waiting_for(mut self, replicas: u32) -> Self {
        self.wait_replicas = replicas;
        self
    }

    /// This thread's traffic connections (opened on first use, on this thread).
    fn conns(&self) -> Arc<Connections> {
        LOCAL.with_borrow_mut(|all| {
            if let Some((_, conns)) = all.iter().find(|(id, _)| *id == self.id) {
                return Arc::clone(conns);
            }
            let conns = Arc::new(self.connector.connections(self.pool_size));
            all.push((self.id, Arc::clone(&conns)));
            conns
        })
    }

    /// Opens this thread's connections now (each worker does as it starts): a lane
    /// must not have to connect in the middle of a burst. A failure here is only
    /// logged; the calls connect again and report it.
    pub async fn prepare_thread(&self) {
        let conns = self.conns();
        for _ in 0..conns.len() {
            if let Err(error) = self.call::<redis::Value>(&conns, Call::Cmd("PING", &[])).await {
                tracing::warn!(%error, "cannot open a redis connection yet");
                return;
            }
        }
    }

    /// Writes health key `i` and removes it at once (no key is left behind).
    async fn write_health(&self, i: usize) -> Result<(), StoreError> {
        let key = self.health_keys[i].as_str();
        let args = [key.into(), Arg::Int(10_000), Arg::Int(super::unix_ms())];
        self.call::<redis::Value>(&self.health, Call::Cmd("PSETEX", &args))
            .await?;
        self.call::<redis::Value>(&self.health, Call::Cmd("UNLINK", &[key.into()]))
            .await
            .map(drop)
    }

    /// Loads the scripts up front (on every primary of a cluster), so the first
    /// complete is one EVALSHA rather than EVALSHA, NOSCRIPT, SCRIPT LOAD, EVALSHA.
    /// After a Redis restart the scripts are reloaded on the first NOSCRIPT. One call
    /// (a pipeline of both), on the next connection.
    async fn load_scripts(&self) -> Result<(), StoreError> {
        let mut load = redis::pipe();
        for code in [COMPLETE_LUA, RELEASE_LUA] {
            load.cmd("SCRIPT").arg("LOAD").arg(code);
        }
        self.call::<redis::Value>(&self.conns(), Call::Pipe(&load))
            .await
            .map(drop)
    }

    /// One call, within `store.timeout` in all (connecting included). A call refused
    /// because the node cannot take writes did not take effect, and its connection was
    /// dropped: it is sent once more, on a fresh connection to wherever the URL points
    /// now (after a failover, the new primary), so a failover costs no answer at all.
    async fn call<T: FromRedisValue>(&self, conns: &Connections, call: Call<'_>) -> Result<T, StoreError> {
        self.call_failing(conns, call).await.map_err(|(_, error)| error)
    }

    /// [`RedisStore::call`], telling how a failed call failed.
    async fn call_failing<T: FromRedisValue>(
        &self,
        conns: &Connections,
        call: Call<'_>,
    ) -> Result<T, (Failure, StoreError)> {
        let mut sent = None;
        let attempts = async {
            match conns.send(&self.connector, &call, &mut sent).await {
                Err((Failure::CannotWrite, _)) => conns.send(&self.connector, &call, &mut sent).await,
                other => other,
            }
        };
        match tokio::time::timeout(self.timeout, attempts).await {
            Ok(result) => result,
            Err(_) => match sent {
                // Sent and unanswered: it may have landed. A connection that does not
                // answer in time is suspect (a peer gone silent): the next calls connect
                // afresh. (Replies are matched in order, so a late one answers nobody.)
                Some(sent) => {
                    conns.drop_conn(sent);
                    Err((Failure::Lost, StoreError::Timeout))
                }
                None => Err((
                    Failure::Refused,
                    StoreError::Unavailable("no connection within store.timeout".into()),
                )),
            },
        }
    }

    /// Sends `cmd` (named `what` in the log), a compare-and-set or compare-and-delete that
    /// only newer servers know (`known` says every server had it at start-up). `None` when the server does not
    /// know it, so nothing happened: the caller runs its script instead, as every such
    /// call does from then on (`known` goes off for good).
    async fn unless_unknown<T: FromRedisValue>(
        &self,
        conns: &Connections,
        known: &AtomicBool,
        what: &'static str,
        call: Call<'_>,
    ) -> Option<Result<T, StoreError>> {
        match self.call_failing::<T>(conns, call).await {
            Ok(reply) => Some(Ok(reply)),
            Err((Failure::Unsupported, error)) => {
                if known.swap(false, Ordering::Relaxed) {
                    tracing::warn!(%error, command = what, "redis refused a command it had at start-up (a failover to an older server?): using a Lua script for it from now on");
                }
                None
            }
            Err((_, error)) => Some(Err(error)),
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

impl RedisStore {
    /// PROCESSING(token) -> COMPLETED ([`Store::complete`], but for the wake-up).
    async fn complete_marker(&self, key: &str, token: Token, c: &Completion) -> Result<bool, StoreError> {
        let conns = self.conns();
        // `SET key <COMPLETED> PX ttl IFEQ <PROCESSING value>`: a plain command where the
        // script costs the server a Lua call (Valkey 8.1 on the bench machine: 2.2 µs of
        // server time instead of 6.6).
        let completed = value::completed(c, super::unix_ms());
        if self.set_if_eq.load(Ordering::Relaxed) {
            let processing = value::processing(token, c.first_seen_ms);
            let args = [
                key.into(),
                Arg::Bytes(&completed),
                "PX".into(),
                Arg::Int(millis(c.ttl)),
                "IFEQ".into(),
                Arg::Bytes(&processing),
            ];
            let done = self
                .unless_unknown::<Option<redis::Value>>(&conns, &self.set_if_eq, "SET IFEQ", Call::Cmd("SET", &args))
                .await;
            if let Some(done) = done {
                return done.map(|reply| reply.is_some());
            }
        }
        let prefix = value::token_prefix(token);
        let args = [
            key.into(),
            Arg::Bytes(&prefix),
            Arg::Bytes(&completed),
            Arg::Int(millis(c.ttl)),
        ];
        let done: i64 = self.call(&conns, Call::Script(&COMPLETE, 1, &args)).await?;
        Ok(done == 1)
    }

    /// Deletes PROCESSING(token) ([`Store::release`], but for the wake-up).
    async fn release_marker(&self, key: &str, token: Token, first_seen_ms: u64) -> Result<bool, StoreError> {
        let conns = self.conns();
        if self.del_if_eq.load(Ordering::Relaxed) {
            let processing = value::processing(token, first_seen_ms);
            let args = [key.into(), "IFEQ".into(), Arg::Bytes(&processing)];
            if let Some(deleted) = self
                .unless_unknown::<i64>(&conns, &self.del_if_eq, "DELEX IFEQ", Call::Cmd("DELEX", &args))
                .await
            {
                return deleted.map(|deleted| deleted == 1);
            }
        }
        let prefix = value::token_prefix(token);
        let args = [key.into(), Arg::Bytes(&prefix)];
        let deleted: i64 = self.call(&conns, Call::Script(&RELEASE, 1, &args)).await?;
        Ok(deleted == 1)
    }
}

impl Store for RedisStore {
    async fn claim(&self, key: &str, token: Token, first_seen_ms: u64, ttl: Duration) -> Result<Claim, StoreError> {
        let processing = value::processing(token, first_seen_ms);
        let args = [
            key.into(),
            Arg::Bytes(&processing),
            "NX".into(),
            "PX".into(),
            Arg::Int(millis(ttl)),
            "GET".into(),
        ];
        let previous: Option<Vec<u8>> = self.call(&self.conns(), Call::Cmd("SET", &args)).await?;
        match previous {
            None => Ok(Claim::Claimed),
            Some(raw) => Ok(Claim::Found(parse_marker(key, &raw))),
        }
    }

    /// Not an `async fn`, which would hold `completion` twice: the block holds it
    /// once, and `complete_marker` borrows it.
    #[allow(clippy::manual_async_fn, reason = "an async fn holds its arguments twice")]
    fn complete(
        &self,
        key: &str,
        token: Token,
        completion: Completion,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        async move {
            let done = self.complete_marker(key, token, &completion).await;
            self.local_waits.wake(token);
            done
        }
    }

    async fn release(&self, key: &str, token: Token, first_seen_ms: u64) -> Result<bool, StoreError> {
        let released = self.release_marker(key, token, first_seen_ms).await;
        self.local_waits.wake(token);
        released
    }

    async fn get(&self, key: &str) -> Result<Option<Marker>, StoreError> {
        let raw: Option<Vec<u8>> = self.call(&self.conns(), Call::Cmd("GET", &[key.into()])).await?;
        Ok(raw.map(|raw| parse_marker(key, &raw)))
    }

    /// Woken at once by a holder in this process ([`LocalWaits`]); else a poll
    /// ([`poll_backoff`]).
    async fn wait(&self, _key: &str, holder: Token, attempt: u32, max: Duration) {
        self.local_waits
            .wait(holder, poll_backoff(attempt).min(max), attempt == 0)
            .await;
    }

    /// A write, not a PING: a replica answers PING but refuses writes, and readiness
    /// must say whether claims can land. The key is unlinked at once, so the store
    /// holds nothing but markers (`DBSIZE`, `KEYS <prefix>*`). `PSETEX` and `UNLINK`
    /// rather than `SET` and `DEL` keep it apart from the claims in `INFO commandstats`.
    /// Ready while some write lands: in a cluster with a node down (and
    /// `cluster-require-full-coverage no`), the other nodes' keys still work, and
    /// `/readyz` turns 503 only while every store write fails.
    async fn ping(&self) -> Result<(), StoreError> {
        if let Some(why) = self.unusable.get() {
            return Err(StoreError::Unavailable(why.clone()));
        }
        let first = self.health_good.load(Ordering::Relaxed);
        let Err(error) = self.write_health(first).await else {
            return Ok(());
        };
        let others = (0..self.health_keys.len()).filter(|&i| i != first);
        let tries = futures_util::future::join_all(others.map(|i| async move { (i, self.write_health(i).await) }));
        match tries.await.into_iter().find(|(_, wrote)| wrote.is_ok()) {
            Some((i, _)) => {
                self.health_good.store(i, Ordering::Relaxed);
                Ok(())
            }
            None => Err(error),
        }
    }

    async fn inspect(&self, key: &str) -> Result<Option<KeyInfo>, StoreError> {
        self.inspect_key(key).await
    }

    async fn forget(&self, key: &str, force: bool) -> Result<Forgotten, StoreError> {
        self.forget_key(key, force).await
    }
}
