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
//! ([`super::resp`]); on `rediss://` and in a cluster, redis-rs's. A connection is
//! dropped (and the next call connects afresh, to wherever the URL resolves now) when a
//! call on it timed out or broke at the transport, or when Redis answered that it
//! cannot take writes (a demoted primary after a failover): see [`Failure`]. One of the
//! store's own that broke while idle is replaced before a call is sent on it.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashMap;
use std::io::Write;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use base64::Engine as _;
use bytes::Bytes;
use deadpool_redis::redis::{
    self, AsyncConnectionConfig, ErrorKind, FromRedisValue, RedisError, Script, ServerErrorKind,
    aio::ConnectionLike as _,
};
use http::{HeaderValue, StatusCode};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

use super::command::{Arg, Command};
use super::resp;
use super::{Claim, Completion, Forgotten, KeyInfo, KeyState, Marker, Store, StoreError, StoredResponse, Token};
use crate::config::RedisTarget;
use crate::secret::redact_url;

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
}

/// Requests of this process waiting on a marker that another request of this process
/// may hold: the holder's complete or release wakes them at once. Redis has nothing to
/// wake a waiter by, so each polls ([`Store::wait`]), the first time after 5 ms; a
/// duplicate that arrived while its first delivery was forwarded by the same gateway
/// (the usual case with one replica) no longer waits out that poll. A holder on another
/// replica wakes nobody here: the poll still covers it.
///
/// A holder that finishes after the store answered a waiter but before the waiter
/// registered wakes nobody either. Under load that is common: both replies often come
/// in one read, and the holder's task may run first. So every holder also leaves its
/// mark in a ring of the last [`FINISHED`] finishers, and a waiter that finds its
/// holder's mark there once registered looks again at once instead of waiting out the
/// first poll's 5 ms (which set the p99 of `bench/run`'s Redis half-duplicate rows).
#[derive(Default)]
struct LocalWaits {
    /// How many waits are registered: a holder finishing with none (nearly always)
    /// takes no lock.
    count: AtomicUsize,
    /// By holder token. Weak: the waiters hold the `Notify`, and the last one to leave
    /// removes the entry.
    by_holder: std::sync::Mutex<HashMap<Token, Weak<Notify>>>,
    /// The last finishers' [`finish_mark`]s, written round the ring at `next_finished`.
    finished: [AtomicU64; FINISHED],
    next_finished: AtomicUsize,
}

/// A wait registered in [`LocalWaits`]; dropped, it removes the holder's entry if no
/// other wait holds it, and counts itself out.
struct Registered<'a> {
    waits: &'a LocalWaits,
    holder: Token,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        {
            let mut waits = self.waits.lock();
            if waits.get(&self.holder).is_some_and(|w| w.strong_count() == 0) {
                waits.remove(&self.holder);
            }
        }
        self.waits.count.fetch_sub(1, Ordering::SeqCst);
    }
}

/// How many finishers [`LocalWaits`] remembers: far more than finish between a reply
/// and its task's next step, and a waiter that misses its holder still has the poll.
const FINISHED: usize = 32;

/// A token as one word for [`LocalWaits::finished`]. Two tokens of this process never
/// share one (the counters differ); a token of another replica that matched would only
/// make a waiter look again early.
fn finish_mark(token: Token) -> u64 {
    token.process ^ token.counter.rotate_left(32)
}

impl LocalWaits {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Token, Weak<Notify>>> {
        self.by_holder.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Waits until `holder` finishes here, or `limit` passes. On a waiter's `first`
    /// wait, a holder that has already finished ends it at once. On later ones it
    /// does not: a marker seen again after its holder finished (its complete failed,
    /// say) would otherwise have the waiter ask the store again and again at once.
    async fn wait(&self, holder: Token, limit: Duration, first: bool) {
        self.count.fetch_add(1, Ordering::SeqCst);
        // Declared before `woken`, so dropped after it (the entry's last strong
        // reference), also when the wait is dropped midway (the shutdown's abandon).
        let _registered = Registered { waits: self, holder };
        let woken = {
            let mut waits = self.lock();
            let entry = waits.entry(holder).or_default();
            let notify = entry.upgrade().unwrap_or_else(|| {
                let notify = Arc::new(Notify::new());
                *entry = Arc::downgrade(&notify);
                notify
            });
            // Registered before the lock is released: a wake from now on reaches it.
            notify.notified_owned()
        };
        // SeqCst throughout. If the holder's `count` load sees this wait, it takes
        // the lock: after the registration above, and it wakes it; or before, and
        // then its mark, stored before, is seen here. If not, the mark is seen here
        // too. (Unless 32 later finishers wrote over it: the poll covers that.)
        let mark = finish_mark(holder);
        let finished = first && self.finished.iter().any(|m| m.load(Ordering::SeqCst) == mark);
        if !finished {
            tokio::select! {
                () = woken => {}
                () = tokio::time::sleep(limit) => {}
            }
        }
    }

    /// `holder` finished (its marker completed, released, or its call failed): whoever
    /// waits on it looks again.
    fn wake(&self, holder: Token) {
        let slot = self.next_finished.fetch_add(1, Ordering::Relaxed) % FINISHED;
        self.finished[slot].store(finish_mark(holder), Ordering::SeqCst);
        if self.count.load(Ordering::SeqCst) == 0 {
            return;
        }
        let waiting = self.lock().remove(&holder);
        if let Some(notify) = waiting.and_then(|w| w.upgrade()) {
            notify.notify_waiters();
        }
    }
}

/// What a failed call tells about the command and about the connection it used. One
/// table decides it by the reply's code ([`REPLY_CODES`]); within `ERR`, only a syntax
/// error and an unknown command are told apart ([`Failure::Unsupported`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Failure {
    /// Sent, and no reply came (transport error, timeout): it may have taken effect.
    /// The connection is dropped.
    Lost,
    /// Refused by a node that cannot take writes now (a replica after a failover, a node
    /// loading its data, a cluster without quorum): it did not take effect. Every
    /// connection is dropped, so the next call connects to wherever the URL points now.
    CannotWrite,
    /// Refused for another reason (out of memory, a missing script, a redirect): it did
    /// not take effect, and the connection is fine.
    Refused,
    /// A reply of the wrong shape.
    Unreadable,
    /// Refused as a syntax error or an unknown command: the server does not know this
    /// command or this form of it (`SET ... IFEQ` before Valkey 8.1 / Redis 8.4, `DELEX`
    /// before Redis 8.4). It did not take effect.
    Unsupported,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Drops {
    None,
    This,
    All,
}

/// Reply codes (the first word of a Redis error reply) and what they mean here; any
/// other code is [`Failure::Refused`].
const REPLY_CODES: &[(&str, Failure)] = &[
    ("READONLY", Failure::CannotWrite),
    ("LOADING", Failure::CannotWrite),
    ("MASTERDOWN", Failure::CannotWrite),
    ("CLUSTERDOWN", Failure::CannotWrite),
    ("OOM", Failure::Refused),
    ("NOSCRIPT", Failure::Refused),
    ("MOVED", Failure::Refused),
    ("ASK", Failure::Refused),
    ("TRYAGAIN", Failure::Refused),
    ("BUSY", Failure::Refused),
    ("MISCONF", Failure::Refused),
    ("NOPERM", Failure::Refused),
];

impl Failure {
    fn of(e: &RedisError) -> Self {
        if e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error() {
            return Failure::Lost;
        }
        if e.code() == Some("ERR")
            && e.detail()
                .is_some_and(|d| d.starts_with("syntax error") || d.starts_with("unknown command"))
        {
            return Failure::Unsupported;
        }
        if let Some(code) = e.code() {
            return REPLY_CODES
                .iter()
                .find(|(c, _)| *c == code)
                .map_or(Failure::Refused, |(_, f)| *f);
        }
        match e.kind() {
            ErrorKind::UnexpectedReturnType | ErrorKind::Parse => Failure::Unreadable,
            _ => Failure::Refused,
        }
    }

    /// Which connections a call that failed this way takes out of use.
    fn drops(self) -> Drops {
        match self {
            Failure::Lost => Drops::This,
            // About the node, not this connection: every connection opened before the
            // failover reaches the same demoted node.
            Failure::CannotWrite => Drops::All,
            Failure::Refused | Failure::Unreadable | Failure::Unsupported => Drops::None,
        }
    }

    fn error(self, e: &RedisError) -> StoreError {
        match self {
            Failure::Lost => StoreError::Lost(e.to_string()),
            Failure::CannotWrite | Failure::Refused | Failure::Unsupported => StoreError::Unavailable(e.to_string()),
            Failure::Unreadable => StoreError::Corrupt(e.to_string()),
        }
    }
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

/// The connections of one kind, used in turn.
enum Connections {
    /// redis-rs's, for what [`resp`] does not speak: `rediss://`, RESP3.
    Standalone(Lanes<redis::aio::MultiplexedConnection>),
    /// The store's own, for `redis://`.
    Lean(Lanes<resp::Connection>),
    Cluster(Lanes<redis::cluster_async::ClusterConnection>),
}

/// Opens connections of one kind.
enum Connector {
    Standalone {
        client: redis::Client,
        config: AsyncConnectionConfig,
    },
    Lean(resp::Target),
    Cluster(redis::cluster::ClusterClient),
}

/// `pool_size` slots, each holding a shared connection or nothing (then the next call
/// through it connects).
struct Lanes<C> {
    lanes: Box<[Lane<C>]>,
    next: AtomicUsize,
}

struct Lane<C> {
    conn: ArcSwapOption<C>,
    /// Held while connecting, so a burst of calls opens one connection, not one each.
    connecting: tokio::sync::Mutex<()>,
}

impl<C: Conn + Clone> Lanes<C> {
    fn new(size: usize) -> Self {
        Lanes {
            lanes: (0..size.max(1))
                .map(|_| Lane {
                    conn: ArcSwapOption::empty(),
                    connecting: tokio::sync::Mutex::new(()),
                })
                .collect(),
            next: AtomicUsize::new(0),
        }
    }

    /// A connection to send on: the next lane's, opened by `open` if it has none or
    /// its connection is known to be broken (a Redis restarted while the gateway was
    /// idle then costs no failed call: each lane reconnects as it is next used).
    async fn get<F, Fut>(&self, open: F) -> Result<(usize, Arc<C>), RedisError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<C, RedisError>>,
    {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.lanes.len();
        let lane = &self.lanes[i];
        if let Some(conn) = lane.conn.load_full()
            && conn.usable()
        {
            return Ok((i, conn));
        }
        let _connecting = lane.connecting.lock().await;
        if let Some(conn) = lane.conn.load_full()
            && conn.usable()
        {
            return Ok((i, conn)); // another call connected while this one waited
        }
        let conn = Arc::new(open().await?);
        lane.conn.store(Some(Arc::clone(&conn)));
        Ok((i, conn))
    }

    fn drop_all(&self) {
        for lane in &self.lanes {
            lane.conn.store(None);
        }
    }

    /// [`Connections::send`] on these lanes: a connection (opened by `open` if need
    /// be), noted in `sent`, then the call on it. A failure drops what it shows broken
    /// ([`Failure::drops`]): this connection, or every one on the lanes.
    async fn send<T, F, Fut>(
        &self,
        open: F,
        call: &Call<'_>,
        sent: &mut Option<Sent>,
    ) -> Result<T, (Failure, StoreError)>
    where
        T: FromRedisValue,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<C, RedisError>>,
    {
        let (lane, conn) = self.get(open).await.map_err(|e| {
            let error = StoreError::Unavailable(format!("cannot connect: {e}"));
            (Failure::Refused, error) // nothing was sent
        })?;
        let here = Sent {
            lane,
            conn: Arc::as_ptr(&conn) as usize,
        };
        *sent = Some(here);
        call.on::<T>(&mut (*conn).clone()).await.map_err(|e| {
            let failure = Failure::of(&e);
            match failure.drops() {
                Drops::This => self.drop_conn(here),
                Drops::All => self.drop_all(),
                Drops::None => {}
            }
            (failure, failure.error(&e))
        })
    }

    /// Stops using the connection at `sent` (if its lane still holds it); calls already
    /// on it finish.
    fn drop_conn(&self, sent: Sent) {
        let lane = &self.lanes[sent.lane];
        let current = lane.conn.load();
        if current.as_ref().is_some_and(|c| Arc::as_ptr(c) as usize == sent.conn) {
            lane.conn.compare_and_swap(&*current, None);
        }
    }
}

/// Which connection a call went out on: its lane, and the connection's address (to
/// drop that one only, not a newer one in the same lane).
#[derive(Clone, Copy)]
struct Sent {
    lane: usize,
    conn: usize,
}

/// One call: a command (its name, then its arguments), a script's (its arguments, the
/// one key first; sent as `EVALSHA <sha> 1 ...` rather than through redis-rs's
/// `ScriptInvocation`, which collects each argument in a Vec of its own), or a pipeline.
enum Call<'a> {
    Cmd(&'a str, &'a [Arg<'a>]),
    Script(&'a Script, &'a [Arg<'a>]),
    Pipe(&'a redis::Pipeline),
}

impl Call<'_> {
    async fn on<T: FromRedisValue>(&self, conn: &mut impl Conn) -> Result<T, RedisError> {
        match *self {
            Call::Cmd(name, args) => query(conn, Command { lead: &[name], args }).await,
            Call::Script(script, args) => {
                let evalsha = Command {
                    lead: &["EVALSHA", script.get_hash(), "1"],
                    args,
                };
                match query(conn, evalsha).await {
                    // A Redis restarted since the scripts were loaded: load, and send
                    // again (NOSCRIPT means the script did not run).
                    Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                        script.load_async(conn).await?;
                        query(conn, evalsha).await
                    }
                    other => other,
                }
            }
            Call::Pipe(pipe) => pipe.query_async(conn).await,
        }
    }
}

/// Sends `command` and reads its reply as a `T`; an error reply is an error.
async fn query<T: FromRedisValue>(conn: &mut impl Conn, command: Command<'_>) -> Result<T, RedisError> {
    let reply = conn.command(command).await?;
    Ok(redis::from_redis_value(reply.extract_error()?)?)
}

/// A connection a [`Call`] goes out on. redis-rs's take the command as a `Cmd`; the
/// store's own have it written in place into their buffer.
trait Conn: redis::aio::ConnectionLike + Send {
    /// False once the connection is known to be broken (the store's own say so;
    /// redis-rs's do not, and fail the call instead).
    fn usable(&self) -> bool {
        true
    }

    fn command(&mut self, command: Command<'_>) -> impl Future<Output = Result<redis::Value, RedisError>> + Send;
}

impl Conn for resp::Connection {
    fn usable(&self) -> bool {
        resp::Connection::usable(self)
    }

    fn command(&mut self, command: Command<'_>) -> impl Future<Output = Result<redis::Value, RedisError>> + Send {
        self.request(move |out| command.write_resp(out))
    }
}

impl Conn for redis::aio::MultiplexedConnection {
    async fn command(&mut self, command: Command<'_>) -> Result<redis::Value, RedisError> {
        self.req_packed_command(&command.to_cmd()).await
    }
}

impl Conn for redis::cluster_async::ClusterConnection {
    async fn command(&mut self, command: Command<'_>) -> Result<redis::Value, RedisError> {
        let cmd = command.to_cmd();
        match self
            .req_packed_command(&cmd)
            .await
            .and_then(redis::Value::extract_error)
        {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::Ask) => asking(self, cmd, &e).await,
            other => other,
        }
    }
}

/// Sends `cmd` again, to the node an ASK redirect names, with `ASKING` before it in
/// the same write. redis-rs follows an ASK by sending `ASKING` as a call of its own,
/// and while a slot migrates, another call to that node can come between the two: the
/// command then meets MOVED back to the old node, which answers ASK again, until the
/// retries run out (under concurrent claims, a third of them did). An ASK means the
/// command did not run, so sending it again is safe.
async fn asking(
    conn: &mut redis::cluster_async::ClusterConnection,
    cmd: redis::Cmd,
    ask: &RedisError,
) -> Result<redis::Value, RedisError> {
    let node = ask.redirect_node().and_then(|(addr, _slot)| addr.rsplit_once(':'));
    let Some((host, Ok(port))) = node.map(|(host, port)| (host, port.parse())) else {
        return Err(ask.clone());
    };
    let mut pipe = redis::pipe();
    pipe.add_command(redis::cmd("ASKING")).add_command(cmd);
    let route = redis::cluster_routing::SingleNodeRoutingInfo::ByAddress {
        host: host.to_owned(),
        port,
    };
    let mut replies = conn.route_pipeline(pipe, 1, 1, route).await?;
    replies.pop().ok_or_else(|| ask.clone())
}

impl Connections {
    /// Sends `call` on one connection, noting in `sent` where it went once it did (so a
    /// timeout can tell "no connection" from "no reply", and drop that connection).
    ///
    /// redis-rs's connections (`rediss://`, unix sockets, RESP3, cluster) are boxed,
    /// at one more allocation per call on them: inline, with the store's own, this
    /// future measured 2,136 bytes against 488 for the store's own alone (`dist`
    /// build), and so did every store call's future, which is copied into its box on
    /// every claim, complete and release.
    async fn send<T: FromRedisValue>(
        &self,
        connector: &Connector,
        call: &Call<'_>,
        sent: &mut Option<Sent>,
    ) -> Result<T, (Failure, StoreError)> {
        match (self, connector) {
            (Connections::Lean(lanes), Connector::Lean(target)) => lanes.send(|| target.connect(), call, sent).await,
            (Connections::Standalone(lanes), Connector::Standalone { client, config }) => {
                let open = || client.get_multiplexed_async_connection_with_config(config);
                Box::pin(lanes.send(open, call, sent)).await
            }
            (Connections::Cluster(lanes), Connector::Cluster(client)) => {
                Box::pin(lanes.send(|| client.get_async_connection(), call, sent)).await
            }
            _ => Err((Failure::Refused, StoreError::Unavailable("store misconfigured".into()))),
        }
    }

    fn drop_conn(&self, sent: Sent) {
        match self {
            Connections::Standalone(lanes) => lanes.drop_conn(sent),
            Connections::Lean(lanes) => lanes.drop_conn(sent),
            Connections::Cluster(lanes) => lanes.drop_conn(sent),
        }
    }

    fn len(&self) -> usize {
        match self {
            Connections::Standalone(lanes) => lanes.lanes.len(),
            Connections::Lean(lanes) => lanes.lanes.len(),
            Connections::Cluster(lanes) => lanes.lanes.len(),
        }
    }
}

impl Connector {
    fn new(target: &RedisTarget, timeout: Duration) -> Result<Self, StoreError> {
        Ok(match target {
            RedisTarget::Standalone(url) => {
                let client = redis::Client::open(url.as_str()).map_err(|e| unavailable("invalid url", &e))?;
                match resp::Target::of(client.get_connection_info()) {
                    Some(target) => Connector::Lean(target),
                    None => Connector::Standalone {
                        client,
                        config: AsyncConnectionConfig::new()
                            .set_connection_timeout(Some(timeout))
                            .set_response_timeout(None), // our own deadline bounds every call
                    },
                }
            }
            RedisTarget::Cluster(seeds) => Connector::Cluster(
                redis::cluster::ClusterClient::builder(seeds.iter().map(String::as_str))
                    .connection_timeout(timeout)
                    .response_timeout(timeout)
                    .retries(2)
                    .build()
                    .map_err(|e| unavailable("invalid cluster seeds", &e))?,
            ),
        })
    }

    /// `size` lanes of the connections this opens.
    fn connections(&self, size: usize) -> Connections {
        match self {
            Connector::Standalone { .. } => Connections::Standalone(Lanes::new(size)),
            Connector::Lean(_) => Connections::Lean(Lanes::new(size)),
            // The cluster connection multiplexes over every node by itself: one suffices.
            Connector::Cluster(_) => Connections::Cluster(Lanes::new(1)),
        }
    }
}

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

fn unavailable(what: &str, e: &RedisError) -> StoreError {
    StoreError::Unavailable(format!("{what}: {e}"))
}

/// What the start-up check learnt about one server.
struct Server {
    /// It has `SET ... IFEQ`.
    set_if_eq: bool,
    /// It has `DELEX ... IFEQ`.
    del_if_eq: bool,
}

/// Why the start-up check of a server failed.
enum Check {
    /// No answer: the gateway starts all the same (a store outage at start is one
    /// like any other), and checks again in the background.
    Unreachable(StoreError),
    /// It answered, and cannot be the store (too old, or it refuses the credentials: a
    /// config mistake): the gateway does not start.
    Unusable(StoreError),
}

impl Check {
    /// A failed connection or first command. Unreachable for now: the network (refused,
    /// reset, timed out, a name not resolvable yet) or a server that says "not now"
    /// (`LOADING`, ...). Anything else is a config mistake or a server that will not do:
    /// refused credentials, a database it will not select, a TLS certificate not
    /// trusted, a command the ACL denies.
    fn of(shown: &str, e: &RedisError) -> Check {
        let error = StoreError::Unavailable(format!("{shown}: {e}"));
        // redis-rs keeps an I/O error as an `Arc<dyn Error>`; TLS failures are
        // `InvalidData` in it (tokio-rustls).
        let io_kind = std::error::Error::source(e)
            .and_then(|s| s.downcast_ref::<Arc<dyn std::error::Error + Send + Sync>>())
            .and_then(|inner| inner.downcast_ref::<std::io::Error>())
            .map(std::io::Error::kind);
        let not_now = matches!(
            e.code(),
            Some("LOADING" | "MASTERDOWN" | "CLUSTERDOWN" | "TRYAGAIN" | "BUSY")
        );
        if not_now || (e.kind() == ErrorKind::Io && io_kind != Some(std::io::ErrorKind::InvalidData)) {
            Check::Unreachable(error)
        } else {
            Check::Unusable(error)
        }
    }
}

/// Start-up checks on one server: version and eviction policy.
/// The readiness check's keys: `<prefix>__readyz`, and in a cluster sixteen of them,
/// `<prefix>__readyz{N}`, the hash tag `N` putting each in another sixteenth of the
/// slots, so that every node of a cluster split evenly (up to 16 primaries) holds one.
fn health_keys(target: &RedisTarget, key_prefix: &str) -> Vec<String> {
    let key = format!("{key_prefix}__readyz");
    let RedisTarget::Cluster(_) = target else {
        return vec![key];
    };
    let mut tags = 0u32..;
    (0..16u16)
        .map(|part| {
            let tag = tags
                .find(|n| key_slot(&n.to_string()) / 1024 == part)
                .expect("every part has tags");
            format!("{key}{{{tag}}}")
        })
        .collect()
}

/// The Redis Cluster hash slot of a key without a `{hash tag}`: CRC16 (XMODEM) of the
/// key, mod 16384.
pub fn key_slot(key: &str) -> u16 {
    let crc = key.bytes().fold(0u16, |crc, byte| {
        (0..8).fold(crc ^ (u16::from(byte) << 8), |crc, _| {
            if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            }
        })
    });
    crc % 16384
}

async fn check_server(url: &str, timeout: Duration) -> Result<Server, Check> {
    let shown = redact_url(url);
    // The whole check, not only the connect: a stopped server's kernel still accepts.
    tokio::time::timeout(timeout * 4, check_answers(url, &shown))
        .await
        .unwrap_or_else(|_| {
            let why = format!("{shown}: no answer within {:?}", timeout * 4);
            Err(Check::Unreachable(StoreError::Unavailable(why)))
        })
}

async fn check_answers(url: &str, shown: &str) -> Result<Server, Check> {
    let client = redis::Client::open(url).map_err(|e| Check::Unusable(unavailable("invalid url", &e)))?;
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| Check::of(shown, &e))?;
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut conn)
        .await
        .map_err(|e| Check::of(shown, &e))?;
    let field = |name: &str| info.lines().find_map(|l| l.strip_prefix(name)).map(str::trim);
    let version = field("redis_version:").unwrap_or("unknown");
    if major_minor(version) < (7, 0) {
        return Err(Check::Unusable(StoreError::Unavailable(format!(
            "{shown}: Redis {version} is too old; dedup-gateway needs Redis >= 7 (SET NX GET)"
        ))));
    }
    let policy: Result<Vec<String>, _> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("maxmemory-policy")
        .query_async(&mut conn)
        .await;
    match policy.as_deref() {
        Ok([_, policy]) if policy == "noeviction" => {}
        Ok([_, policy]) => tracing::warn!(
            server = %shown, %policy,
            "maxmemory-policy is not noeviction: under memory pressure Redis may drop markers and let duplicates through"
        ),
        _ => {
            tracing::warn!(server = %shown, "cannot read maxmemory-policy (CONFIG disabled?); make sure it is noeviction")
        }
    }
    let valkey = field("valkey_version:");
    let (set_if_eq, del_if_eq) = (set_if_eq(version, valkey), del_if_eq(version, valkey));
    tracing::info!(server = %shown, %version, set_if_eq, del_if_eq, "redis store checked");
    Ok(Server { set_if_eq, del_if_eq })
}

/// Checks each of `urls`, not reachable at start, once a second until it answers: for
/// the log (its version and eviction policy), and, for a server that cannot be the
/// store, an error there and `unusable` set (readiness fails from then on).
fn check_later(urls: Vec<String>, timeout: Duration, unusable: &Arc<std::sync::OnceLock<String>>) {
    for url in urls {
        let unusable = Arc::clone(unusable);
        tokio::spawn(async move {
            loop {
                match check_server(&url, timeout).await {
                    Ok(_) => return,
                    Err(Check::Unusable(error)) => {
                        tracing::error!(%error, "redis store cannot serve: not ready, every store call fails");
                        let _ = unusable.set(error.to_string());
                        return;
                    }
                    Err(Check::Unreachable(_)) => tokio::time::sleep(Duration::from_secs(1)).await,
                }
            }
        });
    }
}

/// Whether a server has `SET ... IFEQ`: Valkey from 8.1 (which reports itself as
/// Redis 7.2 in `redis_version`), Redis from 8.4.
fn set_if_eq(redis_version: &str, valkey_version: Option<&str>) -> bool {
    match valkey_version {
        Some(valkey) => major_minor(valkey) >= (8, 1),
        None => major_minor(redis_version) >= (8, 4),
    }
}

/// Whether a server has `DELEX ... IFEQ`: Redis from 8.4. (Valkey's conditional delete
/// is `DELIFEQ`, from 9.0: not used, so Valkey releases with the script.)
fn del_if_eq(redis_version: &str, valkey_version: Option<&str>) -> bool {
    valkey_version.is_none() && major_minor(redis_version) >= (8, 4)
}

/// `major.minor` of a version string; (0, 0) for one that does not parse.
fn major_minor(version: &str) -> (u32, u32) {
    let mut parts = version.split('.').map(|p| p.parse::<u32>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(major), Some(minor)) => (major, minor),
        _ => (0, 0),
    }
}

impl RedisTarget {
    fn urls(&self) -> &[String] {
        match self {
            RedisTarget::Standalone(url) => std::slice::from_ref(url),
            RedisTarget::Cluster(seeds) => seeds,
        }
    }
}

// ---------------------------------------------------------------- value format

/// A value of the hot path, built by hand on the stack (it is copied into the command
/// that carries it): a PROCESSING value, or a COMPLETED one without a response (no
/// `replay`: nearly every one). Written in parts, with `itoa` for the numbers: through
/// `write!` and serde_json they cost 560 and 1,190 instructions (callgrind).
struct SmallValue {
    bytes: [u8; SMALL_VALUE_MAX],
    len: usize,
}

impl SmallValue {
    /// Starts with the prefix the Lua scripts compare ([`token_prefix`]).
    fn processing(token: Token, first_seen_ms: u64) -> Self {
        Self::of([
            &token_prefix(token),
            FIRST_SEEN_FIELD,
            itoa::Buffer::new().format(first_seen_ms).as_bytes(),
            b"}",
        ])
    }

    /// As serde_json writes it.
    fn completed(first_seen_ms: u64, completed_ms: u64) -> Self {
        Self::of([
            COMPLETED_PREFIX,
            FIRST_SEEN_FIELD,
            itoa::Buffer::new().format(first_seen_ms).as_bytes(),
            COMPLETED_FIELD,
            itoa::Buffer::new().format(completed_ms).as_bytes(),
            b"}",
        ])
    }

    /// `parts` in turn: at most [`SMALL_VALUE_MAX`] bytes, as the two shapes above.
    fn of<const N: usize>(parts: [&[u8]; N]) -> Self {
        let mut value = SmallValue {
            bytes: [0; SMALL_VALUE_MAX],
            len: 0,
        };
        for part in parts {
            value.bytes[value.len..value.len + part.len()].copy_from_slice(part);
            value.len += part.len();
        }
        value
    }

    fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

const FIRST_SEEN_FIELD: &[u8] = b",\"first_seen_ms\":";
const COMPLETED_PREFIX: &[u8] = b"{\"state\":\"completed\"";
const COMPLETED_FIELD: &[u8] = b",\"completed_ms\":";

/// The longest u64, in digits.
const U64_DIGITS: usize = "18446744073709551615".len();

/// The longest PROCESSING value, and the longest COMPLETED value without a response.
const PROCESSING_VALUE_MAX: usize = TOKEN_PREFIX_LEN + FIRST_SEEN_FIELD.len() + U64_DIGITS + 1;
const COMPLETED_SMALL_MAX: usize =
    COMPLETED_PREFIX.len() + FIRST_SEEN_FIELD.len() + U64_DIGITS + COMPLETED_FIELD.len() + U64_DIGITS + 1;
/// The size of a [`SmallValue`]: room for either.
const SMALL_VALUE_MAX: usize = if PROCESSING_VALUE_MAX > COMPLETED_SMALL_MAX {
    PROCESSING_VALUE_MAX
} else {
    COMPLETED_SMALL_MAX
};

const TOKEN_PREFIX_LEN: usize = PROCESSING_PREFIX.len() + TOKEN_FIELD.len() + Token::HEX_LEN + 1;

/// `{"state":"processing","token":"<hex>"`: what identifies the owner in a value. On
/// the stack: it is copied into the command that carries it.
fn token_prefix(token: Token) -> [u8; TOKEN_PREFIX_LEN] {
    let mut prefix = [b'"'; TOKEN_PREFIX_LEN];
    let (state, rest) = prefix.split_at_mut(PROCESSING_PREFIX.len());
    state.copy_from_slice(PROCESSING_PREFIX.as_bytes());
    let (field, rest) = rest.split_at_mut(TOKEN_FIELD.len());
    field.copy_from_slice(TOKEN_FIELD.as_bytes());
    rest[..Token::HEX_LEN].copy_from_slice(&token.hex()); // and the closing quote is already there
    prefix
}

/// How every PROCESSING value starts (see [`token_prefix`]).
const PROCESSING_PREFIX: &str = "{\"state\":\"processing\"";

/// What follows [`PROCESSING_PREFIX`] in a PROCESSING value, up to the token's digits.
const TOKEN_FIELD: &str = ",\"token\":\"";

/// A stored value as it is on the wire. Its strings borrow: written from the
/// completion's own bytes, read from the reply without a copy where no escape needs
/// undoing. One flat struct, not an enum tagged by `state`: serde reads a tagged enum
/// by buffering the whole value first (callgrind: [`parse_marker`] took 2,600
/// instructions per duplicate answered from Redis that way, 2,100 this way).
#[derive(Serialize, Deserialize)]
struct Value<'a> {
    state: State,
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    token: Option<Cow<'a, str>>,
    /// Always written; missing (a value written by hand) reads as 0.
    #[serde(default)]
    first_seen_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    completed_ms: Option<u64>,
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    response: Option<ResponseValue<'a>>,
}

#[derive(Clone, Copy, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum State {
    Processing,
    Completed,
}

/// A stored response: the body as text when it is UTF-8, else base64.
#[derive(Serialize, Deserialize)]
struct ResponseValue<'a> {
    status: u16,
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    content_type: Option<Cow<'a, str>>,
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    content_encoding: Option<Cow<'a, str>>,
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    body: Option<Cow<'a, str>>,
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    body_base64: Option<Cow<'a, str>>,
}

/// Writes the COMPLETED value (into a command's argument).
fn write_completed_value(out: impl Write, c: &Completion) {
    write_completed(out, c, super::unix_ms());
}

/// [`write_completed_value`], completed at `completed_ms`. Without a response (no
/// `replay`: nearly every value) written by hand, as serde_json would write it.
fn write_completed(mut out: impl Write, c: &Completion, completed_ms: u64) {
    if c.response.is_none() {
        // Into a command's buffer (a Vec) a write cannot fail.
        let _ = out.write_all(SmallValue::completed(c.first_seen_ms, completed_ms).as_bytes());
        return;
    }
    let response = c.response.as_ref().map(|r| {
        let (body, body_base64) = match std::str::from_utf8(&r.body) {
            Ok(text) => (Some(Cow::Borrowed(text)), None),
            Err(_) => (
                None,
                Some(Cow::Owned(base64::engine::general_purpose::STANDARD.encode(&r.body))),
            ),
        };
        fn text(v: &Option<HeaderValue>) -> Option<Cow<'_, str>> {
            v.as_ref().and_then(|v| v.to_str().ok()).map(Cow::Borrowed)
        }
        ResponseValue {
            status: r.status.as_u16(),
            content_type: text(&r.content_type),
            content_encoding: text(&r.content_encoding),
            body,
            body_base64,
        }
    });
    let value = Value {
        state: State::Completed,
        token: None,
        first_seen_ms: c.first_seen_ms,
        completed_ms: Some(completed_ms),
        response,
    };
    // Cannot fail: a Vec takes every write, and every map key is a string.
    let _ = serde_json::to_writer(out, &value);
}

/// Room for a COMPLETED value: its fields, and the stored body (up to 4/3 of it as
/// base64).
fn completed_value_len(c: &Completion) -> usize {
    let header = |v: &Option<HeaderValue>| v.as_ref().map_or(0, |v| v.len() + 20);
    160 + c.response.as_ref().map_or(0, |r| {
        r.body.len() + r.body.len() / 3 + 4 + header(&r.content_type) + header(&r.content_encoding)
    })
}

/// Reads the value stored at `key`. What a gateway writes is read exactly; a value
/// written by hand or by another tool as leniently as it can be. One that cannot be
/// read at all is still a key someone holds: PROCESSING by a holder that is no request
/// of this gateway, so it is neither forwarded past (not even with `on_error =
/// "forward"`, which is for a store that does not answer) nor answered as a duplicate,
/// and it ends with its TTL or an operator's `DELETE /keys/...?force=true`.
fn parse_marker(key: &str, raw: &[u8]) -> Marker {
    parse_written(raw).or_else(|| parse_json(raw)).unwrap_or_else(|| {
        let shown = String::from_utf8_lossy(raw.get(..80).unwrap_or(raw)).into_owned();
        tracing::warn!(key, value = %shown, "unreadable marker: taken as PROCESSING by another holder");
        Marker::Processing {
            token: foreign_token(raw),
            first_seen_ms: 0,
        }
    })
}

/// Any stored value, through serde: `None` when it is no marker at all. A token that is
/// not one of ours (not hex) names a foreign holder; a stored response that does not
/// read leaves the duplicate answer to the route.
fn parse_json(raw: &[u8]) -> Option<Marker> {
    let Ok(value) = serde_json::from_slice::<Value>(raw) else {
        // The plain word some hand-rolled dedup writes for done.
        return raw
            .trim_ascii()
            .eq_ignore_ascii_case(b"completed")
            .then_some(Marker::Completed {
                first_seen_ms: 0,
                response: None,
            });
    };
    let first_seen_ms = value.first_seen_ms;
    Some(match value.state {
        State::Processing => Marker::Processing {
            token: value
                .token
                .as_deref()
                .and_then(|t| u128::from_str_radix(t, 16).ok())
                .map_or_else(|| foreign_token(raw), Token::from_u128),
            first_seen_ms,
        },
        State::Completed => Marker::Completed {
            first_seen_ms,
            response: value.response.and_then(|r| stored_response(r).ok()).map(Arc::new),
        },
    })
}

/// The holder of a PROCESSING value whose token is not one a gateway writes: derived
/// from the value, so it is no request's of this gateway (a 128-bit collision aside).
fn foreign_token(raw: &[u8]) -> Token {
    let digest = <sha2::Sha256 as sha2::Digest>::digest(raw);
    let mut first = [0u8; 16];
    first.copy_from_slice(&digest[..16]);
    Token::from_u128(u128::from_be_bytes(first))
}

/// The two values nearly every claim finds, read without serde: exactly as
/// [`SmallValue`] writes them.
/// Anything else (another order, spacing, uppercase hex, a response) is `None`, left
/// to serde, which read a marker in 2,100 instructions.
fn parse_written(raw: &[u8]) -> Option<Marker> {
    if let Some(rest) = raw.strip_prefix(PROCESSING_PREFIX.as_bytes()) {
        let (hex, rest) = rest
            .strip_prefix(TOKEN_FIELD.as_bytes())?
            .split_at_checked(Token::HEX_LEN)?;
        let digits = rest
            .strip_prefix(b"\"")?
            .strip_prefix(FIRST_SEEN_FIELD)?
            .strip_suffix(b"}")?;
        let token = hex.iter().try_fold(0u128, |token, &digit| {
            let value = match digit {
                b'0'..=b'9' => digit - b'0',
                b'a'..=b'f' => digit - b'a' + 10,
                _ => return None,
            };
            Some(token << 4 | u128::from(value))
        })?;
        return Some(Marker::Processing {
            token: Token::from_u128(token),
            first_seen_ms: whole_number(digits)?,
        });
    }
    let rest = raw.strip_prefix(COMPLETED_PREFIX)?.strip_prefix(FIRST_SEEN_FIELD)?;
    let (first_seen, completed) = rest.split_at(rest.iter().position(|&b| b == b',')?);
    whole_number(completed.strip_prefix(COMPLETED_FIELD)?.strip_suffix(b"}")?)?;
    Some(Marker::Completed {
        first_seen_ms: whole_number(first_seen)?,
        response: None,
    })
}

/// Decimal digits as JSON writes a whole number that fits a `u64`, else `None`.
fn whole_number(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || (digits[0] == b'0' && digits.len() > 1) {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &digit| {
        let digit = digit.checked_sub(b'0').filter(|d| *d <= 9)?;
        n.checked_mul(10)?.checked_add(u64::from(digit))
    })
}

fn stored_response(r: ResponseValue) -> Result<StoredResponse, StoreError> {
    let status = StatusCode::from_u16(r.status).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let body = match (r.body, r.body_base64) {
        (Some(text), _) => Bytes::from(text.into_owned()),
        (None, Some(b64)) => base64::engine::general_purpose::STANDARD
            .decode(b64.as_bytes())
            .map(Bytes::from)
            .map_err(|e| StoreError::Corrupt(e.to_string()))?,
        (None, None) => Bytes::new(),
    };
    let header = |v: Option<Cow<str>>| v.and_then(|v| HeaderValue::from_str(&v).ok());
    Ok(StoredResponse {
        status,
        content_type: header(r.content_type),
        content_encoding: header(r.content_encoding),
        body,
    })
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
        let small = c
            .response
            .is_none()
            .then(|| SmallValue::completed(c.first_seen_ms, super::unix_ms()));
        let write = |out: &mut dyn Write| write_completed_value(out, c);
        let completed = match &small {
            Some(value) => Arg::Bytes(value.as_bytes()),
            None => Arg::With {
                about: completed_value_len(c),
                write: &write,
            },
        };
        if self.set_if_eq.load(Ordering::Relaxed) {
            let value = SmallValue::processing(token, c.first_seen_ms);
            let args = [
                key.into(),
                completed,
                "PX".into(),
                Arg::Int(millis(c.ttl)),
                "IFEQ".into(),
                Arg::Bytes(value.as_bytes()),
            ];
            let done = self
                .unless_unknown::<Option<redis::Value>>(&conns, &self.set_if_eq, "SET IFEQ", Call::Cmd("SET", &args))
                .await;
            if let Some(done) = done {
                return done.map(|reply| reply.is_some());
            }
        }
        let prefix = token_prefix(token);
        let args = [key.into(), Arg::Bytes(&prefix), completed, Arg::Int(millis(c.ttl))];
        let done: i64 = self.call(&conns, Call::Script(&COMPLETE, &args)).await?;
        Ok(done == 1)
    }

    /// Deletes PROCESSING(token) ([`Store::release`], but for the wake-up).
    async fn release_marker(&self, key: &str, token: Token, first_seen_ms: u64) -> Result<bool, StoreError> {
        let conns = self.conns();
        if self.del_if_eq.load(Ordering::Relaxed) {
            let value = SmallValue::processing(token, first_seen_ms);
            let args = [key.into(), "IFEQ".into(), Arg::Bytes(value.as_bytes())];
            if let Some(deleted) = self
                .unless_unknown::<i64>(&conns, &self.del_if_eq, "DELEX IFEQ", Call::Cmd("DELEX", &args))
                .await
            {
                return deleted.map(|deleted| deleted == 1);
            }
        }
        let prefix = token_prefix(token);
        let args = [key.into(), Arg::Bytes(&prefix)];
        let deleted: i64 = self.call(&conns, Call::Script(&RELEASE, &args)).await?;
        Ok(deleted == 1)
    }
}

impl Store for RedisStore {
    async fn claim(&self, key: &str, token: Token, first_seen_ms: u64, ttl: Duration) -> Result<Claim, StoreError> {
        let value = SmallValue::processing(token, first_seen_ms);
        let args = [
            key.into(),
            Arg::Bytes(value.as_bytes()),
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

    /// Woken at once by a holder in this process ([`LocalWaits`]); else a poll,
    /// starting fast (most first attempts finish within milliseconds) and backing off
    /// to 200 ms so a long wait costs a few round trips a second.
    async fn wait(&self, _key: &str, holder: Token, attempt: u32, max: Duration) {
        let backoff = Duration::from_millis(5u64 << attempt.min(6)).min(Duration::from_millis(200));
        self.local_waits.wait(holder, backoff.min(max), attempt == 0).await;
    }

    /// A write, not a PING: a replica answers PING but refuses writes, and readiness
    /// must say whether claims can land. The key is unlinked at once, so the store
    /// holds nothing but markers (`DBSIZE`, `KEYS <prefix>*`). `PSETEX` and `UNLINK`
    /// rather than `SET` and `DEL` keep it apart from the claims in `INFO commandstats`.
    /// Ready while some write lands: in a cluster with a node down (and
    /// `cluster-require-full-coverage no`), the other nodes' keys still work, and
    /// SPEC has `/readyz` turn 503 only "while every store write fails".
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

// ---------------------------------------------------------------- admin: inspect, forget

/// The value and its TTL in one round trip, read at the same instant.
const INSPECT_LUA: &str = r"return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])}";

/// Deletes the marker; a PROCESSING one only with ARGV[1] = '1'. Returns 0 absent,
/// 1 COMPLETED deleted, 2 PROCESSING refused, 3 PROCESSING deleted. PROCESSING is
/// whatever is not COMPLETED, as [`parse_marker`] reads it: a value written by hand in
/// another field order, or not a marker at all, is not forgotten without force.
const FORGET_LUA: &str = r"local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local ok, m = pcall(cjson.decode, v)
local completed = (ok and type(m) == 'table' and m.state == 'completed') or string.lower(v) == 'completed'
if not completed and ARGV[1] ~= '1' then return 2 end
redis.call('DEL', KEYS[1])
if completed then return 1 end
return 3";

static INSPECT: LazyLock<Script> = LazyLock::new(|| Script::new(INSPECT_LUA));
static FORGET: LazyLock<Script> = LazyLock::new(|| Script::new(FORGET_LUA));

impl RedisStore {
    async fn inspect_key(&self, key: &str) -> Result<Option<KeyInfo>, StoreError> {
        let (raw, pttl): (Option<Vec<u8>>, i64) =
            self.call(&self.conns(), Call::Script(&INSPECT, &[key.into()])).await?;
        let Some(raw) = raw else { return Ok(None) };
        let ttl = u64::try_from(pttl).ok().map(Duration::from_millis);
        Ok(Some(match parse_marker(key, &raw) {
            Marker::Processing { first_seen_ms, .. } => KeyInfo {
                state: KeyState::Processing,
                first_seen_ms,
                ttl,
                reply_stored: false,
            },
            Marker::Completed {
                first_seen_ms,
                response,
            } => KeyInfo {
                state: KeyState::Completed,
                first_seen_ms,
                ttl,
                reply_stored: response.is_some(),
            },
        }))
    }

    async fn forget_key(&self, key: &str, force: bool) -> Result<Forgotten, StoreError> {
        let args = [key.into(), if force { "1" } else { "0" }.into()];
        let outcome: i64 = self.call(&self.conns(), Call::Script(&FORGET, &args)).await?;
        Ok(match outcome {
            1 => Forgotten::Deleted(KeyState::Completed),
            2 => Forgotten::Refused,
            3 => Forgotten::Deleted(KeyState::Processing),
            _ => Forgotten::Absent,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn processing_value(token: Token, first_seen_ms: u64) -> String {
        String::from_utf8(SmallValue::processing(token, first_seen_ms).as_bytes().to_vec()).expect("utf-8")
    }

    fn completed_value(c: &Completion) -> String {
        let mut value = Vec::new();
        write_completed_value(&mut value, c);
        assert!(value.len() <= completed_value_len(c), "room for the value");
        String::from_utf8(value).expect("utf-8")
    }

    /// A holder that finished before its waiter registered (its reply ran first):
    /// the waiter looks again at once rather than waiting out the poll. The clock is
    /// paused, so a wait that sleeps moves it by the whole limit.
    #[tokio::test(start_paused = true)]
    async fn a_waiter_whose_holder_already_finished_does_not_wait_out_the_poll() {
        let waits = LocalWaits::default();
        let (done, running) = (Token::generate(), Token::generate());
        waits.wake(done);
        let limit = Duration::from_secs(5);

        let start = tokio::time::Instant::now();
        waits.wait(done, limit, true).await;
        assert_eq!(start.elapsed(), Duration::ZERO, "finished holder: no wait");

        waits.wait(running, limit, true).await;
        assert_eq!(start.elapsed(), limit, "holder still running: waits the poll");
        assert!(waits.lock().is_empty(), "every entry removed");
        assert_eq!(waits.count.load(Ordering::SeqCst), 0);
    }

    /// A wait dropped midway (the shutdown's abandon wins the select around it)
    /// removes its entry and counts itself out too.
    #[tokio::test(start_paused = true)]
    async fn a_wait_dropped_midway_leaves_nothing_registered() {
        let waits = LocalWaits::default();
        let running = Token::generate();
        let dropped = tokio::time::timeout(
            Duration::from_millis(1),
            waits.wait(running, Duration::from_secs(5), true),
        );
        assert!(dropped.await.is_err(), "the wait was cut short");
        assert!(waits.lock().is_empty());
        assert_eq!(waits.count.load(Ordering::SeqCst), 0);
    }

    /// A holder whose marker was still there when its waiter looked again (its
    /// complete failed) is waited for with the poll: the waiter does not spin on the
    /// store until `in_flight_wait` runs out.
    #[tokio::test(start_paused = true)]
    async fn a_finished_holder_seen_again_is_waited_for_with_the_poll() {
        let waits = LocalWaits::default();
        let failed = Token::generate();
        waits.wake(failed);
        let start = tokio::time::Instant::now();
        waits.wait(failed, Duration::from_millis(10), false).await;
        assert_eq!(start.elapsed(), Duration::from_millis(10));
    }

    /// The ring holds the last [`FINISHED`] finishers; one pushed out of it is left to
    /// the poll, as before the ring.
    #[tokio::test(start_paused = true)]
    async fn a_holder_pushed_out_of_the_ring_is_left_to_the_poll() {
        let waits = LocalWaits::default();
        let first = Token::generate();
        waits.wake(first);
        for _ in 0..FINISHED {
            waits.wake(Token::generate());
        }
        let start = tokio::time::Instant::now();
        waits.wait(first, Duration::from_millis(5), true).await;
        assert_eq!(start.elapsed(), Duration::from_millis(5));
    }

    #[test]
    fn processing_values_start_with_the_token_prefix_and_parse_back() {
        let token = Token::generate();
        let value = processing_value(token, 1_700_000_000_123);
        assert!(value.as_bytes().starts_with(&token_prefix(token)));
        assert_eq!(
            parse_marker("k", value.as_bytes()),
            Marker::Processing {
                token,
                first_seen_ms: 1_700_000_000_123
            }
        );
        let other = Token::generate();
        assert!(!value.as_bytes().starts_with(&token_prefix(other)));
        // The fast reader (`parse_written`) recognises it by this prefix.
        assert!(value.starts_with(PROCESSING_PREFIX));
    }

    #[test]
    fn small_values_have_room_for_the_largest_numbers() {
        let longest = SmallValue::processing(Token::generate(), u64::MAX);
        assert_eq!(longest.as_bytes().len(), PROCESSING_VALUE_MAX);
        let longest = SmallValue::completed(u64::MAX, u64::MAX);
        assert_eq!(longest.as_bytes().len(), COMPLETED_SMALL_MAX);
        assert!(matches!(
            parse_marker("k", longest.as_bytes()),
            Marker::Completed {
                first_seen_ms: u64::MAX,
                response: None
            }
        ));
    }

    #[test]
    fn tokens_are_32_lowercase_hex_digits_most_significant_first() {
        let mixed = 0x0123_4567_89ab_cdef_fedc_ba98_7654_3210;
        for value in [
            0,
            1,
            0xabc,
            u128::from(u64::MAX),
            u128::from(u64::MAX) + 1,
            mixed,
            u128::MAX,
        ] {
            let token = Token::from_u128(value);
            assert_eq!(token.to_string(), format!("{value:032x}"));
            assert!(token_prefix(token).ends_with(format!(",\"token\":\"{value:032x}\"").as_bytes()));
        }
    }

    /// Values are shared by every replica, so a rolling upgrade reads what the older
    /// build wrote: these literals are that format, byte for byte.
    #[test]
    fn values_in_the_stored_format_parse_and_broken_shapes_are_refused() {
        let processing = br#"{"state":"processing","token":"0123456789abcdef0000000000000007","first_seen_ms":5}"#;
        assert_eq!(
            parse_marker("k", processing),
            Marker::Processing {
                token: Token::from_u128(0x0123_4567_89ab_cdef_0000_0000_0000_0007),
                first_seen_ms: 5
            }
        );
        let token = Token::from_u128(0x0123_4567_89ab_cdef_0000_0000_0000_0007);
        assert_eq!(processing_value(token, 5).as_bytes(), processing); // and written so
        let completed = br#"{"state":"completed","first_seen_ms":6,"completed_ms":9,"response":{"status":200,"content_type":"text/plain","body":"say \"hi\"\n"}}"#;
        let Marker::Completed {
            first_seen_ms: 6,
            response: Some(response),
        } = parse_marker("k", completed)
        else {
            panic!("not the completed marker")
        };
        assert_eq!(response.body, Bytes::from_static(b"say \"hi\"\n")); // escapes undone
        assert_eq!(response.content_type, Some(HeaderValue::from_static("text/plain")));
        let bare = br#"{"state":"completed","first_seen_ms":6,"completed_ms":9}"#;
        assert!(matches!(
            parse_marker("k", bare),
            Marker::Completed { response: None, .. }
        ));
        // Written by hand or by another tool: read as leniently as they can be.
        let completed = [
            &br#"{"state":"completed"}"#[..],
            br#"{ "first_seen_ms": 6, "state": "completed" }"#,
            br#"{"state":"completed","first_seen_ms":6,"response":{"status":99}}"#,
            b"COMPLETED",
        ];
        for done in completed {
            let marker = parse_marker("k", done);
            assert!(
                matches!(marker, Marker::Completed { response: None, .. }),
                "{}: {marker:?}",
                String::from_utf8_lossy(done)
            );
        }
        // Anything else is held by someone who is none of this gateway's requests.
        let ours = Token::generate();
        for held in [
            &br#"{"state":"processing","first_seen_ms":5}"#[..],
            br#"{"state":"processing","token":"someone-else","first_seen_ms":5}"#,
            br#"{"first_seen_ms":1,"token":"00000000000000000000000000000001","state":"processing"}"#,
            br#"{"state":"done","first_seen_ms":5}"#,
            b"1",
            b"PROCESSING",
            b"\xff\x00",
        ] {
            let marker = parse_marker("k", held);
            assert!(
                matches!(marker, Marker::Processing { token, .. } if token != ours),
                "{}: {marker:?}",
                String::from_utf8_lossy(held)
            );
        }
    }

    /// The hand-written value without a response is serde_json's, byte for byte.
    #[test]
    fn completed_values_without_a_response_are_written_as_serde_writes_them() {
        for (first_seen_ms, completed_ms) in [(0, 0), (7, 9), (1_700_000_000_123, 1_700_000_004_567), (u64::MAX, 1)] {
            let c = Completion {
                first_seen_ms,
                ttl: Duration::from_secs(1),
                response: None,
            };
            let mut by_hand = Vec::new();
            write_completed(&mut by_hand, &c, completed_ms);
            let by_serde = serde_json::to_vec(&Value {
                state: State::Completed,
                token: None,
                first_seen_ms,
                completed_ms: Some(completed_ms),
                response: None,
            })
            .expect("serialize");
            assert_eq!(String::from_utf8_lossy(&by_hand), String::from_utf8_lossy(&by_serde));
            assert!(by_hand.len() <= completed_value_len(&c), "room for the value");
        }
    }

    /// Whatever the fast reader accepts, serde reads the same; what it refuses, serde
    /// reads. Checked on written values and on every truncation and many one-byte
    /// changes of them.
    #[test]
    fn written_values_are_read_fast_exactly_as_serde_reads_them() {
        let mut next = crate::test_rng(0x9e37_79b9_7f4a_7c15);
        for round in 0..200 {
            let token = Token::from_u128(u128::from(next()) << 64 | u128::from(next()));
            let first_seen_ms = if round % 3 == 0 {
                next()
            } else {
                next() % 10_000_000_000_000
            };
            let completed = Completion {
                first_seen_ms,
                ttl: Duration::from_secs(1),
                response: None,
            };
            let mut values = vec![processing_value(token, first_seen_ms).into_bytes()];
            let mut value = Vec::new();
            write_completed(&mut value, &completed, next() % 10_000_000_000_000);
            values.push(value);
            for value in values {
                let fast = parse_written(&value);
                assert!(fast.is_some(), "{}", String::from_utf8_lossy(&value));
                assert_eq!(fast, parse_json(&value));
                let mut changed = Vec::new();
                for end in 0..value.len() {
                    changed.push(value[..end].to_vec());
                }
                for at in 0..value.len() {
                    for byte in [b'0', b'9', b'a', b'F', b',', b'}', b'"', b' ', b'-'] {
                        let mut v = value.clone();
                        v[at] = byte;
                        changed.push(v);
                    }
                }
                for v in changed {
                    if let Some(fast) = parse_written(&v) {
                        let serde = parse_json(&v);
                        assert_eq!(Some(fast), serde, "{}", String::from_utf8_lossy(&v));
                    }
                }
            }
        }
    }

    #[test]
    fn completed_values_keep_the_response_text_or_binary() {
        for body in [
            Bytes::from_static(b"{\"reply\":\"hi\"}"),
            Bytes::from_static(&[0xff, 0x00, 0x7f]),
        ] {
            let c = Completion {
                first_seen_ms: 7,
                ttl: Duration::from_secs(1),
                response: Some(StoredResponse {
                    status: StatusCode::CREATED,
                    content_type: Some(HeaderValue::from_static("application/json")),
                    content_encoding: Some(HeaderValue::from_static("gzip")),
                    body: body.clone(),
                }),
            };
            let value = completed_value(&c);
            assert!(
                value.starts_with("{\"state\":\"completed\",\"first_seen_ms\":7,"),
                "{value}"
            );
            let Marker::Completed {
                first_seen_ms,
                response,
            } = parse_marker("k", value.as_bytes())
            else {
                panic!("not completed")
            };
            assert_eq!(first_seen_ms, 7);
            assert_eq!(response.as_deref(), c.response.as_ref());
        }
    }

    /// A reply as Redis sends it, as redis-rs turns it into an error.
    fn reply(wire: &str) -> RedisError {
        match redis::parse_redis_value(wire.as_bytes()).expect("a RESP reply") {
            redis::Value::ServerError(e) => RedisError::from(e),
            other => panic!("not an error reply: {other:?}"),
        }
    }

    #[test]
    fn every_kind_of_failure_is_classified_in_one_place() {
        let io = |kind| RedisError::from(std::io::Error::new(kind, "x"));
        let cases = [
            (
                reply("-READONLY You can't write against a read only replica.\r\n"),
                Failure::CannotWrite,
            ),
            (
                reply("-LOADING Redis is loading the dataset in memory\r\n"),
                Failure::CannotWrite,
            ),
            (reply("-MASTERDOWN Link with MASTER is down\r\n"), Failure::CannotWrite),
            (reply("-CLUSTERDOWN The cluster is down\r\n"), Failure::CannotWrite),
            (
                reply("-OOM command not allowed when used memory > 'maxmemory'.\r\n"),
                Failure::Refused,
            ),
            (reply("-NOSCRIPT No matching script.\r\n"), Failure::Refused),
            (reply("-MOVED 3999 127.0.0.1:6381\r\n"), Failure::Refused),
            (reply("-ASK 3999 127.0.0.1:6381\r\n"), Failure::Refused),
            (
                reply("-ERR wrong number of arguments for 'get' command\r\n"),
                Failure::Refused,
            ),
            // Redis 7's answers to `SET ... IFEQ` and to `DELEX`.
            (reply("-ERR syntax error\r\n"), Failure::Unsupported),
            (
                reply("-ERR unknown command 'delex', with args beginning with: 'k' 'IFEQ' 'v' \r\n"),
                Failure::Unsupported,
            ),
            (io(std::io::ErrorKind::ConnectionReset), Failure::Lost),
            (io(std::io::ErrorKind::UnexpectedEof), Failure::Lost),
            (io(std::io::ErrorKind::TimedOut), Failure::Lost),
            (
                RedisError::from((ErrorKind::UnexpectedReturnType, "not a string")),
                Failure::Unreadable,
            ),
        ];
        for (error, expected) in cases {
            assert_eq!(Failure::of(&error), expected, "{error}");
            let drops = match expected {
                Failure::Lost => Drops::This,
                Failure::CannotWrite => Drops::All,
                Failure::Refused | Failure::Unreadable | Failure::Unsupported => Drops::None,
            };
            assert_eq!(Failure::of(&error).drops(), drops, "{error}");
            let ambiguous = Failure::of(&error).error(&error).is_ambiguous();
            assert_eq!(ambiguous, expected == Failure::Lost, "{error}: may it have landed?");
        }
        // A timeout is the caller's own deadline: ambiguous, and it drops the connection
        // too (`RedisStore::call`).
        assert!(StoreError::Timeout.is_ambiguous());
    }

    #[test]
    fn set_if_eq_is_used_from_valkey_8_1_and_redis_8_4_and_delex_from_redis_8_4() {
        // (redis_version, valkey_version) as INFO server gives them; then SET IFEQ, DELEX.
        let cases = [
            ("7.0.15", None, false, false),
            ("8.2.1", None, false, false),
            ("8.4.0", None, true, true),
            ("10.0.0", None, true, true),
            ("7.2.4", Some("8.0.1"), false, false),
            ("7.2.4", Some("8.1.1"), true, false),
            ("7.2.4", Some("9.0.0"), true, false),
            ("unknown", None, false, false),
        ];
        for (redis, valkey, set, del) in cases {
            let found = (set_if_eq(redis, valkey), del_if_eq(redis, valkey));
            assert_eq!(found, (set, del), "{redis} {valkey:?}");
        }
    }

    #[test]
    fn key_slots_are_the_cluster_specs() {
        // CRC16/XMODEM's check value, and the cluster spec's example.
        assert_eq!(key_slot("123456789"), 0x31C3);
        assert_eq!(key_slot("foo"), 12182);
    }

    #[test]
    fn a_cluster_has_a_health_key_in_each_sixteenth_of_the_slots() {
        let standalone = RedisTarget::Standalone("redis://h:6379".into());
        assert_eq!(health_keys(&standalone, "dedup:"), ["dedup:__readyz"]);
        let keys = health_keys(&RedisTarget::Cluster(vec!["redis://h:7000".into()]), "dedup:");
        assert_eq!(keys.len(), 16);
        for (part, key) in keys.iter().enumerate() {
            let tag = key.strip_prefix("dedup:__readyz{").and_then(|k| k.strip_suffix('}'));
            let slot = key_slot(tag.expect("a hash tag"));
            assert_eq!(usize::from(slot / 1024), part, "{key}");
        }
    }
}
