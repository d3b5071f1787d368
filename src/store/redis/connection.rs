//! The store's connections: `pool_size` lanes per worker thread, each holding one
//! multiplexed connection (the store's own on `redis://`, redis-rs's on `rediss://` and
//! in a cluster), and how a failed call is read: what it says about the command (may it
//! have landed?) and about the connection (is it still good?).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use deadpool_redis::redis::{
    self, AsyncConnectionConfig, ErrorKind, FromRedisValue, RedisError, Script, ServerErrorKind,
    aio::ConnectionLike as _,
};

use super::command::{Arg, Command};
use super::resp;
use crate::config::RedisTarget;
use crate::store::StoreError;

/// What a failed call tells about the command and about the connection it used. One
/// table decides it by the reply's code ([`REPLY_CODES`]); within `ERR`, only a syntax
/// error and an unknown command are told apart ([`Failure::Unsupported`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Failure {
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
pub(super) enum Drops {
    None,
    This,
    All,
}

/// Reply codes (the first word of a Redis error reply) and what they mean here; any
/// other code is [`Failure::Refused`].
pub(super) const REPLY_CODES: &[(&str, Failure)] = &[
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
    pub(super) fn of(e: &RedisError) -> Self {
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
    pub(super) fn drops(self) -> Drops {
        match self {
            Failure::Lost => Drops::This,
            // About the node, not this connection: every connection opened before the
            // failover reaches the same demoted node.
            Failure::CannotWrite => Drops::All,
            Failure::Refused | Failure::Unreadable | Failure::Unsupported => Drops::None,
        }
    }

    pub(super) fn error(self, e: &RedisError) -> StoreError {
        match self {
            Failure::Lost => StoreError::Lost(e.to_string()),
            Failure::CannotWrite | Failure::Refused | Failure::Unsupported => StoreError::Unavailable(e.to_string()),
            Failure::Unreadable => StoreError::Corrupt(e.to_string()),
        }
    }
}

/// The connections of one kind, used in turn.
pub(super) enum Connections {
    /// redis-rs's, for what [`resp`] does not speak: `rediss://`, RESP3.
    Standalone(Lanes<redis::aio::MultiplexedConnection>),
    /// The store's own, for `redis://`.
    Lean(Lanes<resp::Connection>),
    Cluster(Lanes<redis::cluster_async::ClusterConnection>),
}

/// Opens connections of one kind.
pub(super) enum Connector {
    Standalone {
        client: redis::Client,
        config: AsyncConnectionConfig,
    },
    Lean(resp::Target),
    Cluster(redis::cluster::ClusterClient),
}

/// `pool_size` slots, each holding a shared connection or nothing (then the next call
/// through it connects).
pub(super) struct Lanes<C> {
    lanes: Box<[Lane<C>]>,
    next: AtomicUsize,
}

pub(super) struct Lane<C> {
    conn: ArcSwapOption<C>,
    /// Held while connecting, so a burst of calls opens one connection, not one each.
    connecting: tokio::sync::Mutex<()>,
}

impl<C: Conn + Clone> Lanes<C> {
    pub(super) fn new(size: usize) -> Self {
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
    pub(super) async fn get<F, Fut>(&self, open: F) -> Result<(usize, Arc<C>), RedisError>
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

    pub(super) fn drop_all(&self) {
        for lane in &self.lanes {
            lane.conn.store(None);
        }
    }

    /// [`Connections::send`] on these lanes: a connection (opened by `open` if need
    /// be), noted in `sent`, then the call on it. A failure drops what it shows broken
    /// ([`Failure::drops`]): this connection, or every one on the lanes.
    pub(super) async fn send<T, F, Fut>(
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
    pub(super) fn drop_conn(&self, sent: Sent) {
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
pub(super) struct Sent {
    lane: usize,
    conn: usize,
}

/// One call: a command (its name, then its arguments), a script's (how many keys, and
/// its arguments, the keys first; sent as `EVALSHA <sha> <keys> ...` rather than
/// through redis-rs's `ScriptInvocation`, which collects each argument in a Vec of its
/// own), or a pipeline.
pub(super) enum Call<'a> {
    Cmd(&'a str, &'a [Arg<'a>]),
    Script(&'a Script, usize, &'a [Arg<'a>]),
    Pipe(&'a redis::Pipeline),
}

/// A script's key count as `EVALSHA` takes it (no script here has more than 16 keys).
const KEY_COUNTS: [&str; 17] = [
    "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15", "16",
];

impl Call<'_> {
    pub(super) async fn on<T: FromRedisValue>(&self, conn: &mut impl Conn) -> Result<T, RedisError> {
        match *self {
            Call::Cmd(name, args) => query(conn, Command { lead: &[name], args }).await,
            Call::Script(script, keys, args) => {
                let evalsha = Command {
                    lead: &["EVALSHA", script.get_hash(), KEY_COUNTS[keys]],
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
pub(super) async fn query<T: FromRedisValue>(conn: &mut impl Conn, command: Command<'_>) -> Result<T, RedisError> {
    let reply = conn.command(command).await?;
    Ok(redis::from_redis_value(reply.extract_error()?)?)
}

/// A connection a [`Call`] goes out on. redis-rs's take the command as a `Cmd`; the
/// store's own have it written in place into their buffer.
pub(super) trait Conn: redis::aio::ConnectionLike + Send {
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
pub(super) async fn asking(
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
    pub(super) async fn send<T: FromRedisValue>(
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

    pub(super) fn drop_conn(&self, sent: Sent) {
        match self {
            Connections::Standalone(lanes) => lanes.drop_conn(sent),
            Connections::Lean(lanes) => lanes.drop_conn(sent),
            Connections::Cluster(lanes) => lanes.drop_conn(sent),
        }
    }

    pub(super) fn len(&self) -> usize {
        match self {
            Connections::Standalone(lanes) => lanes.lanes.len(),
            Connections::Lean(lanes) => lanes.lanes.len(),
            Connections::Cluster(lanes) => lanes.lanes.len(),
        }
    }
}

impl Connector {
    pub(super) fn new(target: &RedisTarget, timeout: Duration) -> Result<Self, StoreError> {
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
    pub(super) fn connections(&self, size: usize) -> Connections {
        match self {
            Connector::Standalone { .. } => Connections::Standalone(Lanes::new(size)),
            Connector::Lean(_) => Connections::Lean(Lanes::new(size)),
            // The cluster connection multiplexes over every node by itself: one suffices.
            Connector::Cluster(_) => Connections::Cluster(Lanes::new(1)),
        }
    }
}

pub(super) fn unavailable(what: &str, e: &RedisError) -> StoreError {
    StoreError::Unavailable(format!("{what}: {e}"))
}
