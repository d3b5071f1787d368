//! Upstream connections, kept alive per worker thread and per upstream. A connection is
//! written and read by the request that borrowed it ([`crate::client`]), and only by
//! that thread's requests, so no lock, no shared pool, no task per connection and no
//! wake-up of another thread is on the path. A connection is in the pool only while
//! idle: a response body still arriving holds its connection and brings it back at its
//! end.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::time::Duration;

use http::uri::Authority;
use http::{Method, Request, Response};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::client::{self, Conn, WriteFailure};
use crate::body::Body;

/// An unused connection older than this is closed rather than reused (upstreams
/// commonly close theirs after 60-75 s).
const IDLE_TIMEOUT: Duration = Duration::from_secs(55);
/// A connection unused for this long is checked for a close from the upstream before
/// it is reused. Servers close idle connections after a second or more, and the
/// runtime may not have seen that close arrive: a request written into it is lost to
/// the upstream, and the sender gets a 502 for nothing. Connections in steady use are
/// reused sooner and skip the check (a system call): for them, a close the runtime has
/// seen is enough.
pub const PROBE_AFTER: Duration = Duration::from_secs(1);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a request got no response head.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("cannot connect to {0}: {1}")]
    Connect(Authority, #[source] std::io::Error),
    #[error("no connection to {0} within {CONNECT_TIMEOUT:?}")]
    ConnectTimeout(Authority),
    #[error("{0}")]
    Exchange(#[source] client::Error),
}

/// A connection back in the pool, with when it came back.
struct Idle {
    conn: Conn,
    since: Instant,
}

/// This thread's connections, by upstream (a handful of routes: a linear scan).
#[derive(Default)]
struct Pool {
    upstreams: Vec<(Authority, VecDeque<Idle>)>,
    /// Whether this thread's runtime runs [`start_sweeping`]'s task.
    sweeping: bool,
}

thread_local! {
    static POOL: RefCell<Pool> = RefCell::default();
}

/// Sends `request` (origin-form URI, Host set) to `authority` on a kept-alive
/// connection, or a new one. A request that a reused connection refused before a byte
/// of it was written (the upstream had closed it) is sent once more on another; once
/// any of it was written it is never sent again: the upstream may have acted on it.
pub async fn send(authority: &Authority, mut request: Request<Body>) -> Result<Response<Body>, SendError> {
    loop {
        let (mut conn, reused) = match checkout(authority) {
            Some(conn) => (conn, true),
            // Boxed: connecting is rare, and its future would otherwise add its size
            // to every forwarded request's.
            None => (Box::pin(connect(authority)).await?, false),
        };
        let head_request = request.method() == Method::HEAD;
        let read = match conn.write_request(&mut request).await {
            Ok(()) => conn.read_response(head_request, give_back).await,
            Err(WriteFailure::Unsent(_)) if reused => continue,
            Err(WriteFailure::Unsent(e)) => Err(e),
            // The upstream stopped reading: it may have answered first.
            Err(WriteFailure::Partial(e @ client::Error::Write(_))) => conn.read_response_after(head_request, e).await,
            // The sender's body broke: the upstream is still waiting for the rest.
            Err(WriteFailure::Partial(e)) => Err(e),
            Err(WriteFailure::Answered) => conn.read_response_after(head_request, client::Error::Closed).await,
        };
        return read.map_err(SendError::Exchange);
    }
}

/// The most recently returned connection not known to be closed. Expired and closed
/// ones are dropped on the way.
fn checkout(authority: &Authority) -> Option<Conn> {
    let now = Instant::now();
    POOL.with_borrow_mut(|pool| {
        let idle = pool.idle(authority)?;
        expire(idle, now);
        while let Some(mut entry) = idle.pop_back() {
            let open = if now.duration_since(entry.since) < PROBE_AFTER {
                entry.conn.not_seen_closed()
            } else {
                entry.conn.still_open()
            };
            if open {
                return Some(entry.conn);
            }
        }
        None
    })
}

/// Takes back a connection whose response was read to the end. The oldest, unused
/// for [`IDLE_TIMEOUT`], are closed.
fn give_back(conn: Conn) {
    let now = Instant::now();
    POOL.with_borrow_mut(|pool| {
        let authority = conn.authority();
        let idle = match pool.idle(authority) {
            Some(idle) => idle,
            None => {
                pool.upstreams.push((authority.clone(), VecDeque::new()));
                &mut pool.upstreams.last_mut().expect("just pushed").1
            }
        };
        expire(idle, now);
        idle.push_back(Idle { conn, since: now });
    });
}

/// Closes the connections unused for [`IDLE_TIMEOUT`] (the oldest are in front).
fn expire(idle: &mut VecDeque<Idle>, now: Instant) {
    while idle.front().is_some_and(|c| now.duration_since(c.since) > IDLE_TIMEOUT) {
        idle.pop_front();
    }
}

/// Expires idle connections when no request comes to do it. Only on a worker's
/// current-thread runtime: a task of a multi-thread runtime could run on a thread
/// whose pool is not the one it was meant for (there, requests expire them).
fn start_sweeping() {
    let current_thread =
        tokio::runtime::Handle::current().runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread;
    if !current_thread || POOL.with_borrow_mut(|pool| std::mem::replace(&mut pool.sweeping, true)) {
        return;
    }
    tokio::spawn(async {
        loop {
            tokio::time::sleep(IDLE_TIMEOUT / 2).await;
            let now = Instant::now();
            POOL.with_borrow_mut(|pool| {
                for (_, idle) in &mut pool.upstreams {
                    expire(idle, now);
                }
            });
        }
    });
}

/// How many of this thread's connections to `authority` could take a request now
/// (for tests, which must know a connection is reusable before they rely on it).
#[doc(hidden)]
pub fn ready_connections(authority: &Authority) -> usize {
    POOL.with_borrow_mut(|pool| pool.idle(authority).map_or(0, |idle| idle.len()))
}

impl Pool {
    fn idle(&mut self, authority: &Authority) -> Option<&mut VecDeque<Idle>> {
        // Byte equality, not `Authority`'s case-insensitive `==` (a byte loop, twice per
        // request): routes that spell one host two ways only keep two pools.
        self.upstreams
            .iter_mut()
            .find(|(a, _)| a.as_str() == authority.as_str())
            .map(|(_, idle)| idle)
    }
}

/// Opens a connection.
async fn connect(authority: &Authority) -> Result<Conn, SendError> {
    let failed = |e| SendError::Connect(authority.clone(), e);
    let stream = open(authority).await?.into_std().map_err(failed)?;
    let probe = stream.try_clone().map_err(failed)?;
    let stream = TcpStream::from_std(stream).map_err(failed)?;
    let _ = stream.set_nodelay(true);
    start_sweeping();
    Ok(Conn::new(authority.clone(), stream, probe))
}

/// Resolves the upstream's name (no lookup for an IP address) and tries its addresses
/// in order, [`CONNECT_TIMEOUT`] shared among them, so one address that drops packets
/// does not take all of it.
async fn open(authority: &Authority) -> Result<TcpStream, SendError> {
    let host = authority.host();
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    let port = authority.port_u16().unwrap_or(80);
    let failed = |e| SendError::Connect(authority.clone(), e);
    let deadline = Instant::now() + CONNECT_TIMEOUT;
    let addrs: Vec<_> = tokio::time::timeout_at(deadline, tokio::net::lookup_host((host, port)))
        .await
        .map_err(|_| SendError::ConnectTimeout(authority.clone()))?
        .map_err(failed)?
        .collect();
    let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, "the name has no address");
    for (i, addr) in addrs.iter().enumerate() {
        let share = deadline.saturating_duration_since(Instant::now()) / u32::try_from(addrs.len() - i).unwrap_or(1);
        match tokio::time::timeout(share, TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => return Ok(stream),
            Ok(Err(e)) => last = e,
            Err(_) => last = std::io::Error::new(std::io::ErrorKind::TimedOut, format!("{addr}: no answer")),
        }
    }
    match last.kind() {
        std::io::ErrorKind::TimedOut => Err(SendError::ConnectTimeout(authority.clone())),
        _ => Err(failed(last)),
    }
}
