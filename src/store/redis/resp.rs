//! A lean multiplexed connection to a standalone Redis over plain TCP (`redis://`), for
//! the store's traffic. It does what redis-rs's `MultiplexedConnection` does (every
//! concurrent call pipelined onto one socket, replies matched in order) with less work
//! per call: a caller appends its command to the connection's buffer and queues its reply
//! slot under one lock, where redis-rs sends it through a channel to its driver; the
//! driver reads replies with a RESP2 reader for the five reply types, where redis-rs runs
//! a combinator parser. `rediss://` and RESP3 URLs stay on redis-rs.
//!
//! Failures come out as redis-rs errors, so the store classifies them in one place
//! (`Failure` in [`super::redis`]):
//! - an error reply goes through redis-rs's own parser, and so becomes the same
//!   `ServerError`, with the same kind and code;
//! - a broken transport fails every call waiting on the connection with an I/O error:
//!   each may have taken effect. So does a reply that cannot be read, since the stream
//!   is out of step from then on. The connection stays broken: the store sees it
//!   ([`Connection::usable`]) and opens a fresh one before the next call, so a call is
//!   not sent on a connection known to be broken (one that finds it broken all the
//!   same, in the instant between that check and its send, fails with the same error).

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::{Buf, BytesMut};
use deadpool_redis::redis::{
    self, Cmd, ConnectionAddr, ConnectionInfo, Pipeline, ProtocolVersion, RedisError, RedisFuture, RedisResult, Value,
};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::sync::{Notify, oneshot};

/// Where and how to connect: what a `redis://` URL says.
pub(super) struct Target {
    host: String,
    port: u16,
    username: Option<String>,
    password: Option<String>,
    db: i64,
}

impl Target {
    /// The target of a plain-TCP, RESP2 URL; `None` for what stays on redis-rs.
    pub(super) fn of(info: &ConnectionInfo) -> Option<Target> {
        let ConnectionAddr::Tcp(host, port) = info.addr() else {
            return None;
        };
        let settings = info.redis_settings();
        if settings.protocol() != ProtocolVersion::RESP2 {
            return None;
        }
        Some(Target {
            host: host.clone(),
            port: *port,
            username: settings.username().map(str::to_owned),
            password: settings.password().map(str::to_owned),
            db: settings.db(),
        })
    }

    /// Opens a connection: TCP (no Nagle: commands are batched here already), then
    /// `AUTH` and `SELECT` as the URL asks. The caller's deadline bounds it all.
    pub(super) async fn connect(&self) -> RedisResult<Connection> {
        let stream = TcpStream::connect((self.host.as_str(), self.port)).await?;
        stream.set_nodelay(true)?;
        let conn = Connection::start(stream, self.db);
        let mut hello = redis::pipe();
        if let Some(password) = &self.password {
            let auth = hello.cmd("AUTH");
            if let Some(username) = &self.username {
                auth.arg(username);
            }
            auth.arg(password);
        }
        if self.db != 0 {
            hello.cmd("SELECT").arg(self.db);
        }
        if !hello.is_empty() {
            for reply in conn.request_many(&hello).await? {
                reply.extract_error()?;
            }
        }
        Ok(conn)
    }
}

/// A handle on one connection; clones share it. The connection closes when the last
/// handle is dropped.
#[derive(Clone)]
pub(super) struct Connection {
    handle: Arc<Handle>,
}

pub(super) struct Handle {
    shared: Arc<Shared>,
    db: i64,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.wake.notify_one();
    }
}

/// What callers and the driver share.
pub(super) struct Shared {
    state: Mutex<State>,
    /// The driver stopped (the transport broke, or a reply could not be read): the
    /// store opens a fresh connection rather than send on this one. Read without the
    /// lock, before each call.
    stopped: AtomicBool,
    /// Wakes the driver: there is something to write, or the handles are gone.
    wake: Notify,
}

#[derive(Default)]
pub(super) struct State {
    /// Commands not written yet.
    out: Vec<u8>,
    /// The driver was woken for `out` and has not taken it yet: later calls need not
    /// wake it again.
    flush_due: bool,
    /// One per call sent and unanswered, in the order of their commands.
    waiting: VecDeque<Waiter>,
    /// Why the connection stopped; every later call fails with it.
    broken: Option<(io::ErrorKind, String)>,
    /// Every handle is gone: the driver stops.
    closed: bool,
}

/// A call waiting for its replies.
pub(super) enum Waiter {
    One(oneshot::Sender<RedisResult<Value>>),
    /// A pipeline: `skip` replies to pass over (an atomic pipeline's `QUEUED`s), then
    /// `left` to collect.
    Many {
        skip: usize,
        left: usize,
        got: Vec<Value>,
        reply: oneshot::Sender<RedisResult<Vec<Value>>>,
    },
}

impl Waiter {
    pub(super) fn fail(self, error: RedisError) {
        // A receiver that is gone gave up on its call (a timeout): nothing to tell.
        match self {
            Waiter::One(reply) => drop(reply.send(Err(error))),
            Waiter::Many { reply, .. } => drop(reply.send(Err(error))),
        }
    }
}

impl Shared {
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        // The state stays consistent under a panic elsewhere: every change is one step.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues a command (`write` appends it to the buffer) and its waiter, in one step
    /// so that the order of the waiters is the order of the commands.
    pub(super) fn send(&self, write: impl FnOnce(&mut Vec<u8>), waiter: Waiter) {
        let mut state = self.lock();
        if let Some((kind, why)) = &state.broken {
            let error = broken(*kind, why);
            drop(state);
            return waiter.fail(error);
        }
        let mut whole = Whole {
            keep: state.out.len(),
            out: &mut state.out,
        };
        write(whole.out);
        whole.keep = whole.out.len();
        drop(whole);
        state.waiting.push_back(waiter);
        if !std::mem::replace(&mut state.flush_due, true) {
            drop(state);
            self.wake.notify_one();
        }
    }
}

/// Cuts the buffer back to `keep` bytes when dropped: a command whose writing panicked
/// is taken back, so that half of it never goes out (the lock is taken over after a
/// panic, see [`Shared::lock`]).
pub(super) struct Whole<'a> {
    out: &'a mut Vec<u8>,
    keep: usize,
}

impl Drop for Whole<'_> {
    fn drop(&mut self) {
        self.out.truncate(self.keep);
    }
}

pub(super) fn broken(kind: io::ErrorKind, why: &str) -> RedisError {
    RedisError::from(io::Error::new(kind, why.to_owned()))
}

pub(super) fn gone() -> RedisError {
    broken(io::ErrorKind::BrokenPipe, "the redis connection stopped")
}

impl Connection {
    pub(super) fn start(stream: TcpStream, db: i64) -> Connection {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            stopped: AtomicBool::new(false),
            wake: Notify::new(),
        });
        tokio::spawn(drive(Arc::clone(&shared), stream));
        Connection {
            handle: Arc::new(Handle { shared, db }),
        }
    }

    pub(super) async fn request_many(&self, pipeline: &Pipeline) -> RedisResult<Vec<Value>> {
        self.request_pipeline(pipeline, 0, pipeline.len()).await
    }

    pub(super) fn request_pipeline(
        &self,
        pipeline: &Pipeline,
        skip: usize,
        count: usize,
    ) -> impl Future<Output = RedisResult<Vec<Value>>> + Send + 'static {
        let (reply, rx) = oneshot::channel();
        let waiter = Waiter::Many {
            skip,
            left: count,
            got: Vec::with_capacity(count),
            reply,
        };
        let packed = pipeline.get_packed_pipeline();
        self.handle.shared.send(|out| out.extend_from_slice(&packed), waiter);
        async move { rx.await.unwrap_or_else(|_| Err(gone())) }
    }
}

impl Connection {
    /// False once the connection is known to be broken: every call on it would fail
    /// without being sent.
    pub(super) fn usable(&self) -> bool {
        !self.handle.shared.stopped.load(Ordering::Relaxed)
    }

    /// Sends one command, which `write` appends to the connection's buffer as RESP (so
    /// it is written once, in place, and the reply is the call's).
    pub(super) fn request(
        &self,
        write: impl FnOnce(&mut Vec<u8>),
    ) -> impl Future<Output = RedisResult<Value>> + Send + 'static {
        let (reply, rx) = oneshot::channel();
        self.handle.shared.send(write, Waiter::One(reply));
        async move { rx.await.unwrap_or_else(|_| Err(gone())) }
    }
}

impl redis::aio::ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(self.request(|out| cmd.write_packed_command(out)))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(self.request_pipeline(pipeline, offset, count))
    }

    fn get_db(&self) -> i64 {
        self.handle.db
    }
}

/// The connection's task: writes what callers queued, reads replies and hands each to
/// the oldest waiter. When it stops (the transport broke, or every handle is gone), it
/// fails whatever still waits.
pub(super) async fn drive(shared: Arc<Shared>, mut stream: TcpStream) {
    let why = run(&shared, &mut stream).await;
    shared.stopped.store(true, Ordering::Relaxed);
    let mut state = shared.lock();
    let (kind, why) = state
        .broken
        .insert((why.kind(), format!("redis connection lost: {why}")));
    let (kind, why) = (*kind, why.clone());
    let waiting = std::mem::take(&mut state.waiting);
    drop(state);
    for waiter in waiting {
        waiter.fail(broken(kind, &why));
    }
}

/// Runs the connection until it breaks (or closes: then the error says so, and nobody
/// reads it). Reads go on while a write waits for room, as they must: a server may stop
/// reading commands while its replies are not read.
pub(super) async fn run(shared: &Shared, stream: &mut TcpStream) -> io::Error {
    let (mut rd, wr) = stream.split();
    let mut input = BytesMut::with_capacity(BUFFER);
    // Commands being written: `output[written..]` has yet to go out.
    let mut output = Vec::new();
    let mut written = 0;
    loop {
        {
            let mut state = shared.lock();
            if state.closed {
                return io::Error::new(io::ErrorKind::BrokenPipe, "closed");
            }
            if written == output.len() {
                output.clear();
                // A stored response can be large; the buffers of a long-lived
                // connection should not keep the largest one's size for good.
                output.shrink_to(KEEP);
                written = 0;
                std::mem::swap(&mut state.out, &mut output);
                state.flush_due = false;
            }
        }
        while written < output.len() {
            match wr.try_write(&output[written..]) {
                Ok(0) => return io::Error::from(io::ErrorKind::WriteZero),
                Ok(n) => written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return e,
            }
        }
        if input.is_empty() && input.capacity() > KEEP {
            input = BytesMut::with_capacity(BUFFER);
        } else if input.capacity() - input.len() < BUFFER / 4 {
            input.reserve(BUFFER);
        }
        tokio::select! {
            // Writes after one more turn of the runtime: the calls started by the
            // I/O events it polls in that turn join this write, so Redis reads, and
            // is woken for, fewer and larger batches (0.35 -> 0.23 reads per request
            // at half duplicates, c=32). Waking is most of what a call costs Redis.
            () = shared.wake.notified() => tokio::task::yield_now().await,
            room = wr.writable(), if written < output.len() => {
                if let Err(e) = room {
                    return e;
                }
            }
            read = rd.read_buf(&mut input) => match read {
                Ok(0) => return io::Error::new(io::ErrorKind::UnexpectedEof, "redis closed the connection"),
                Ok(_) => {
                    if let Err(e) = deliver(shared, &mut input) {
                        return e;
                    }
                }
                Err(e) => return e,
            },
        }
    }
}

/// The read buffer's size, and what a buffer may keep between batches.
pub(super) const BUFFER: usize = 16 * 1024;
pub(super) const KEEP: usize = 64 * 1024;

/// Hands every whole reply at the front of `input` to its waiter.
pub(super) fn deliver(shared: &Shared, input: &mut BytesMut) -> Result<(), io::Error> {
    let mut state = shared.lock();
    while let Some((value, used)) = parse(input)? {
        input.advance(used);
        match state.waiting.front_mut() {
            None => return Err(out_of_step("a reply nobody asked for")),
            Some(Waiter::Many { skip, left, got, .. }) => {
                if *skip > 0 {
                    *skip -= 1;
                } else {
                    got.push(value);
                    *left = left.saturating_sub(1);
                }
                if *skip > 0 || *left > 0 {
                    continue;
                }
                if let Some(Waiter::Many { got, reply, .. }) = state.waiting.pop_front() {
                    let _ = reply.send(Ok(got));
                }
            }
            Some(Waiter::One(_)) => {
                if let Some(Waiter::One(reply)) = state.waiting.pop_front() {
                    let _ = reply.send(Ok(value));
                }
            }
        }
    }
    Ok(())
}

pub(super) fn out_of_step(why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("unreadable reply from redis: {why}"),
    )
}

/// Nesting deeper than this is not a reply the store asks for.
pub(super) const MAX_DEPTH: u8 = 8;

/// Reads one RESP2 reply from the front of `buf`: the value and the bytes it took, or
/// `None` while part of it has yet to arrive.
pub(super) fn parse(buf: &[u8]) -> Result<Option<(Value, usize)>, io::Error> {
    value_at(buf, 0, 0)
}

pub(super) fn value_at(buf: &[u8], at: usize, depth: u8) -> Result<Option<(Value, usize)>, io::Error> {
    if buf.get(at).is_some_and(|kind| !b"+-:$*".contains(kind)) {
        return Err(out_of_step("a reply type RESP2 does not have"));
    }
    let Some(end) = line_end(buf, at)? else {
        return Ok(None);
    };
    let line = &buf[at + 1..end];
    let next = end + 2;
    let value = match buf[at] {
        b'+' if line == b"OK" => Value::Okay,
        b'+' => Value::SimpleString(
            String::from_utf8(line.to_vec()).map_err(|_| out_of_step("a status that is not UTF-8"))?,
        ),
        b'-' => redis::parse_redis_value(&buf[at..next]).map_err(|_| out_of_step("an error reply"))?,
        b':' => Value::Int(integer(line)?),
        b'$' => match integer(line)? {
            -1 => Value::Nil,
            len => {
                let len = usize::try_from(len).map_err(|_| out_of_step("a negative length"))?;
                let stop = next + len;
                if buf.len() < stop + 2 {
                    return Ok(None);
                }
                if &buf[stop..stop + 2] != b"\r\n" {
                    return Err(out_of_step("a bulk string longer than its length"));
                }
                return Ok(Some((Value::BulkString(buf[next..stop].to_vec()), stop + 2)));
            }
        },
        b'*' => match integer(line)? {
            -1 => Value::Nil,
            count => {
                if depth >= MAX_DEPTH {
                    return Err(out_of_step("arrays nested too deep"));
                }
                let count = usize::try_from(count).map_err(|_| out_of_step("a negative length"))?;
                // Bounded by what has arrived, not by what the length claims.
                let mut items = Vec::with_capacity(count.min(buf.len() - next));
                let mut pos = next;
                for _ in 0..count {
                    let Some((item, after)) = value_at(buf, pos, depth + 1)? else {
                        return Ok(None);
                    };
                    items.push(item);
                    pos = after;
                }
                return Ok(Some((Value::Array(items), pos)));
            }
        },
        _ => return Err(out_of_step("a reply type RESP2 does not have")),
    };
    Ok(Some((value, next)))
}

/// Where the line starting at `at` ends (its `\r`), once all of it has arrived: at the
/// first CR LF, as redis-rs reads a line (a lone CR or LF is part of the line).
pub(super) fn line_end(buf: &[u8], at: usize) -> Result<Option<usize>, io::Error> {
    let mut from = at + 1;
    while let Some(nl) = buf.get(from..).and_then(|rest| memchr::memchr(b'\n', rest)) {
        let nl = from + nl;
        if nl > at + 1 && buf[nl - 1] == b'\r' {
            return Ok(Some(nl - 1));
        }
        from = nl + 1;
    }
    Ok(None)
}

/// A number line, read as redis-rs reads it (white space around it allowed).
pub(super) fn integer(digits: &[u8]) -> Result<i64, io::Error> {
    std::str::from_utf8(digits)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .ok_or_else(|| out_of_step("a number that is not one"))
}

#[cfg(test)]
mod tests;
