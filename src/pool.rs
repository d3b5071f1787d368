//! Upstream connections: hyper's own HTTP/1.1 client connections, kept alive per worker
//! thread and per upstream. A connection is driven by a task on the runtime that
//! opened it and is only used by that thread's requests, so no lock, no shared pool
//! and no wake-up of another thread is on the path.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::time::Duration;

use http::uri::Authority;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::body::Body;

/// An unused connection older than this is closed rather than reused (upstreams
/// commonly close theirs after 60-75 s; reusing one they are closing loses the request
/// to a race the retry rule below cannot always see).
const IDLE_TIMEOUT: Duration = Duration::from_secs(55);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a request got no response head.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("cannot connect to {0}: {1}")]
    Connect(Authority, #[source] std::io::Error),
    #[error("no connection to {0} within {CONNECT_TIMEOUT:?}")]
    ConnectTimeout(Authority),
    #[error("{0}")]
    Http(#[source] hyper::Error),
}

/// A connection back in the pool, with when it came back.
struct Idle {
    sender: SendRequest<Body>,
    since: Instant,
}

/// This thread's connections, by upstream (a handful of routes: a linear scan).
#[derive(Default)]
struct Pool {
    upstreams: Vec<(Authority, VecDeque<Idle>)>,
    /// Whether this thread's runtime runs [`sweep`].
    sweeping: bool,
}

thread_local! {
    static POOL: RefCell<Pool> = RefCell::default();
}

/// Sends `request` (origin-form URI, Host set) to `authority` on a kept-alive
/// connection, or a new one. A request that a reused connection refused before writing
/// a byte of it (the upstream had closed it) is sent once more on another; once any of
/// it was written it is never sent again: the upstream may have acted on it.
pub async fn send(authority: &Authority, mut request: Request<Body>) -> Result<Response<Incoming>, SendError> {
    loop {
        let (mut sender, reused) = match checkout(authority) {
            Some(sender) => (sender, true),
            None => (connect(authority).await?, false),
        };
        match sender.try_send_request(request).await {
            Ok(response) => {
                checkin(authority, sender);
                return Ok(response);
            }
            Err(mut e) => match e.take_message() {
                Some(unsent) if reused => request = unsent,
                _ => return Err(SendError::Http(e.into_error())),
            },
        }
    }
}

/// The most recently returned connection that can take a request now. Closed ones
/// are dropped on the way; busy ones (a response body still being read) stay. (Expiry
/// is [`checkin`]'s and the sweep's: the oldest sit at the front, which this rarely
/// reaches.)
fn checkout(authority: &Authority) -> Option<SendRequest<Body>> {
    POOL.with_borrow_mut(|pool| {
        let idle = pool.idle(authority)?;
        let mut i = idle.len();
        while i > 0 {
            i -= 1;
            let conn = &idle[i];
            if conn.sender.is_closed() {
                idle.remove(i);
            } else if conn.sender.is_ready() {
                return idle.remove(i).map(|conn| conn.sender);
            }
        }
        None
    })
}

/// Returns a connection after its response head came; it can take the next request
/// once the body has been read. The oldest, unused for [`IDLE_TIMEOUT`], are closed.
fn checkin(authority: &Authority, sender: SendRequest<Body>) {
    let now = Instant::now();
    POOL.with_borrow_mut(|pool| {
        let idle = match pool.idle(authority) {
            Some(idle) => idle,
            None => {
                pool.upstreams.push((authority.clone(), VecDeque::new()));
                &mut pool.upstreams.last_mut().expect("just pushed").1
            }
        };
        expire(idle, now);
        idle.push_back(Idle { sender, since: now });
    });
}

/// Closes the connections unused for [`IDLE_TIMEOUT`] (the oldest are in front).
/// Dropping a connection's sender closes it once its response, if any, is read.
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

impl Pool {
    fn idle(&mut self, authority: &Authority) -> Option<&mut VecDeque<Idle>> {
        self.upstreams
            .iter_mut()
            .find(|(a, _)| a == authority)
            .map(|(_, idle)| idle)
    }
}

/// Opens a connection and starts the task that drives it.
async fn connect(authority: &Authority) -> Result<SendRequest<Body>, SendError> {
    let host = authority.host();
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    let port = authority.port_u16().unwrap_or(80);
    let stream = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect((host, port))).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => return Err(SendError::Connect(authority.clone(), e)),
        Err(_) => return Err(SendError::ConnectTimeout(authority.clone())),
    };
    let _ = stream.set_nodelay(true);
    let (sender, conn) = http1::handshake(TokioIo::new(stream)).await.map_err(SendError::Http)?;
    start_sweeping();
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "upstream connection ended with an error");
        }
    });
    Ok(sender)
}
