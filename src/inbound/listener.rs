//! The proxy listener: its sockets, a worker thread per socket with its accept loop,
//! and the drain on shutdown (not-ready, keep accepting for `shutdown_delay`, stop,
//! let in-flight requests finish for `shutdown_grace`, release what is abandoned).
//! One connection is [`super::connection`].

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tokio::net::{TcpListener, TcpSocket};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::accept::AcceptFailures;
use super::connection::{self, Protocols};
use crate::config::ServerConfig;
use crate::gateway::Gateway;
use crate::store::Store as _;

/// The proxy's sockets, bound before anything runs (tests bind port 0): one per worker,
/// all on the same port (`SO_REUSEPORT`: the kernel spreads connections over them).
pub struct ProxySockets(Vec<std::net::TcpListener>);

impl ProxySockets {
    pub fn bind(server: &ServerConfig) -> std::io::Result<Self> {
        let mut proxy = Vec::with_capacity(server.workers);
        let mut addr = server.listen;
        if addr.port() != 0 {
            refuse_a_port_in_use(addr)?;
        }
        for _ in 0..server.workers {
            let socket = new_socket(addr)?;
            socket.set_reuseport(true)?;
            socket.set_nodelay(true)?;
            socket.bind(addr).map_err(at(addr))?;
            let listener = socket.listen(4096).map_err(at(addr))?;
            addr = listener.local_addr()?; // port 0: the others join the port the first got
            proxy.push(listener.into_std()?);
        }
        Ok(ProxySockets(proxy))
    }

    pub fn addr(&self) -> std::io::Result<SocketAddr> {
        match self.0.first() {
            Some(listener) => listener.local_addr(),
            None => Err(std::io::Error::other("no proxy listener")),
        }
    }
}

/// `SO_REUSEPORT` admits any socket of the same user to the port, so a second
/// gateway started on this address (a unit and a manual run) would share the traffic,
/// and with the memory store each would dedupe alone: both would forward one message.
/// A bind without it fails while any socket listens there, as it would for any server.
fn refuse_a_port_in_use(addr: SocketAddr) -> std::io::Result<()> {
    new_socket(addr)?.bind(addr).map_err(at(addr))
}

/// A TCP socket for `addr`'s family, with `SO_REUSEADDR` (a restart need not wait out
/// the last run's closed connections).
fn new_socket(addr: SocketAddr) -> std::io::Result<TcpSocket> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    Ok(socket)
}

/// Names the address a bind failed on (the proxy's or the admin listener's).
pub fn at(addr: SocketAddr) -> impl Fn(std::io::Error) -> std::io::Error {
    move |e| std::io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}"))
}

/// Time allowed, after the grace period, for abandoned requests to release their
/// claims and be answered (store calls, bounded by `store.timeout` each).
const RELEASE_BUDGET: Duration = Duration::from_secs(2);

/// Time then allowed for their connections to write those answers. A connection with
/// nothing left to write (a body that never finishes arriving, an h2c client that never
/// acknowledges the GOAWAY) is not waited for beyond it.
const ANSWER_BUDGET: Duration = Duration::from_millis(500);

/// Serves until `shutdown` resolves, then drains and returns. `admin` is only logged.
///
/// Each proxy socket is served by a worker thread with a single-threaded runtime of
/// its own (thread per core, as nginx has a worker process per core): a connection,
/// its requests, their tasks and the upstream connections they use all stay on one
/// thread, with no wake-ups across threads. The caller's runtime coordinates: it runs
/// the admin listener, the store checks and the drain.
pub async fn serve(
    gw: Arc<Gateway>,
    server: ServerConfig,
    sockets: ProxySockets,
    admin: Option<SocketAddr>,
    shutdown: impl Future<Output = ()>,
) {
    let tls = gw.tls.get().and_then(
        |certificates| match crate::tls::server_config(Arc::clone(certificates)) {
            Ok(config) => Some(TlsAcceptor::from(Arc::new(config))),
            Err(error) => {
                tracing::error!(%error, "cannot set up TLS: the listener serves plain HTTP");
                None
            }
        },
    );
    let listen = sockets.addr().ok();
    let mut h1 = http1::Builder::new();
    // Half-close allowed: while a request is in flight hyper does not read to look for
    // the sender's EOF. That read needs room in the read buffer, which the request's
    // head still shares, so it cost a fresh 8 KiB buffer per request (callgrind: one
    // malloc less and 2-3% fewer instructions per request). A sender that hangs up is
    // then noticed when its answer is written; the work itself never depended on it
    // (see `dedup::Detached`, which h2 stream resets still exercise).
    h1.timer(TokioTimer::new())
        .header_read_timeout(server.header_timeout)
        .half_close(true);
    let mut h2 = http2::Builder::new(TokioExecutor::new());
    h2.timer(TokioTimer::new());
    let protocols = Arc::new(Protocols {
        h1,
        h2,
        header_timeout: server.header_timeout,
        idle_timeout: server.idle_timeout,
        closing: CancellationToken::new(),
        draining: CancellationToken::new(),
        tls,
    });
    let connections = TaskTracker::new();
    // Workers accept until `accepting` is cancelled, then stay up (serving what they
    // have) until `exit` is.
    let (accepting, exit) = (CancellationToken::new(), CancellationToken::new());
    let (started, mut all_started) = tokio::sync::mpsc::unbounded_channel::<()>();
    let workers: Vec<_> = sockets
        .0
        .into_iter()
        .enumerate()
        .map(|(i, listener)| {
            let (gw, protocols, connections) = (Arc::clone(&gw), Arc::clone(&protocols), connections.clone());
            let (accepting, exit, started) = (accepting.clone(), exit.clone(), started.clone());
            std::thread::Builder::new().name(format!("worker-{i}")).spawn(move || {
                worker(
                    gw,
                    protocols,
                    connections,
                    listener,
                    Signals {
                        started,
                        accepting,
                        exit,
                    },
                )
            })
        })
        .collect();
    drop(started);
    while all_started.recv().await.is_some() {} // every worker is serving (or gave up)
    tracing::info!(
        listen = %listen.map_or_else(|| "none".to_owned(), |a| a.to_string()),
        admin = %admin.map_or_else(|| "off".to_owned(), |a| a.to_string()),
        workers = workers.len(),
        routes = gw.routes.load().len(),
        version = env!("CARGO_PKG_VERSION"),
        "dedup-gateway serving"
    );

    shutdown.await;
    gw.start_draining();
    if !server.shutdown_delay.is_zero() {
        tracing::info!(delay = ?server.shutdown_delay, "not ready; still accepting during shutdown_delay");
        tokio::time::sleep(server.shutdown_delay).await;
    }
    accepting.cancel();
    protocols.closing.cancel();
    protocols.draining.cancel();
    connections.close();
    drain(&gw, &connections, server.shutdown_grace).await;
    exit.cancel();
    for handle in workers.into_iter().flatten() {
        let _ = tokio::task::spawn_blocking(move || handle.join()).await;
    }
}

/// How the coordinator and a worker tell each other where they are.
struct Signals {
    /// Dropped (or sent on) once the worker serves, or gave up.
    started: tokio::sync::mpsc::UnboundedSender<()>,
    /// Cancelled when the worker must stop accepting.
    accepting: CancellationToken,
    /// Cancelled when the worker may exit (the drain is over).
    exit: CancellationToken,
}

/// One worker thread: a single-threaded runtime serving one listener.
fn worker(
    gw: Arc<Gateway>,
    protocols: Arc<Protocols>,
    connections: TaskTracker,
    listener: std::net::TcpListener,
    signals: Signals,
) {
    let Signals {
        started,
        accepting,
        exit,
    } = signals;
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            tracing::error!(error = %e, "cannot start a worker runtime");
            return;
        }
    };
    runtime.block_on(async move {
        let listener = match listener
            .set_nonblocking(true)
            .and_then(|()| TcpListener::from_std(listener))
        {
            Ok(listener) => listener,
            Err(e) => {
                tracing::error!(error = %e, "cannot serve a proxy listener");
                return;
            }
        };
        gw.store.prepare_thread().await;
        gw.workers_starting.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        drop(started);
        tokio::select! {
            () = accept_loop(&gw, &protocols, &connections, &listener) => {}
            () = accepting.cancelled() => {}
        }
        drop(listener);
        exit.cancelled().await;
    });
}

/// Accepts connections forever.
async fn accept_loop(gw: &Arc<Gateway>, protocols: &Arc<Protocols>, connections: &TaskTracker, listener: &TcpListener) {
    let mut failures = AcceptFailures::new("proxy", listener);
    loop {
        match listener.accept().await {
            Ok((stream, addr)) => {
                failures.accepted();
                connections.spawn(connection::serve(Arc::clone(gw), Arc::clone(protocols), stream, addr));
            }
            Err(e) => failures.failed(&e).await,
        }
    }
}

/// Lets connections and owner tasks finish within `grace`; then owners still running
/// release their claims (so the sender's retry is processed) and are dropped.
async fn drain(gw: &Gateway, connections: &TaskTracker, grace: Duration) {
    let deadline = Instant::now() + grace;
    gw.tasks.close();
    let connections = connections.wait();
    tokio::pin!(connections);
    let finished = tokio::time::timeout_at(deadline, async {
        (&mut connections).await;
        gw.tasks.wait().await;
    })
    .await
    .is_ok();
    if finished {
        tracing::info!("drained");
        return;
    }
    // Requests in their connection's task, and owners on their own (their sender left).
    let running = || gw.routes.load().in_flight().max(0) as usize + gw.tasks.len();
    if running() > 0 {
        tracing::warn!(
            still_running = running(),
            "shutdown grace over: abandoning in-flight requests"
        );
    }
    gw.abandon_owners();
    // The abandoned requests release their claims and are answered 503, then their
    // connections write the answers: both before the process exits.
    let released = tokio::time::timeout(RELEASE_BUDGET, async {
        gw.tasks.wait().await;
        while running() > 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    if released.is_err() {
        tracing::warn!(
            still_running = running(),
            "some claims could not be released; they expire after processing_ttl"
        );
    }
    let _ = tokio::time::timeout(ANSWER_BUDGET, connections).await;
}
