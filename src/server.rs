//! The proxy listener: accept loop, HTTP/1.1 and h2c on one port, header-read timeout,
//! and the drain on shutdown (not-ready, keep accepting for `shutdown_delay`, stop,
//! let in-flight requests finish for `shutdown_grace`, release what is abandoned).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hyper::server::conn::{http1, http2};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::ServerConfig;
use crate::framing::FramingGuard;
use crate::gateway::Gateway;
use crate::proxy::Peer;
use crate::{admin, handler};

/// The sockets the gateway serves on, bound before anything runs (tests bind port 0).
pub struct Listeners {
    pub proxy: TcpListener,
    pub admin: Option<TcpListener>,
}

impl Listeners {
    pub async fn bind(server: &ServerConfig) -> std::io::Result<Self> {
        let proxy = TcpListener::bind(server.listen).await?;
        let admin = match server.admin_listen {
            Some(addr) => Some(TcpListener::bind(addr).await?),
            None => None,
        };
        Ok(Listeners { proxy, admin })
    }

    pub fn proxy_addr(&self) -> std::io::Result<SocketAddr> {
        self.proxy.local_addr()
    }
}

/// Time allowed, after the grace period, for abandoned owners to release their claims.
const RELEASE_BUDGET: Duration = Duration::from_secs(2);

/// Serves until `shutdown` resolves, then drains and returns.
pub async fn run(gw: Arc<Gateway>, server: ServerConfig, listeners: Listeners, shutdown: impl Future<Output = ()>) {
    gw.check_store().await;
    gw.spawn_store_checks();
    if let Some(admin) = listeners.admin {
        admin::spawn(Arc::clone(&gw), admin);
    }
    let mut h1 = http1::Builder::new();
    h1.timer(TokioTimer::new()).header_read_timeout(server.header_timeout);
    let mut h2 = http2::Builder::new(TokioExecutor::new());
    h2.timer(TokioTimer::new());
    let protocols = Arc::new(Protocols {
        h1,
        h2,
        header_timeout: server.header_timeout,
        closing: CancellationToken::new(),
    });
    let graceful = GracefulShutdown::new();
    let listener = listeners.proxy;

    tokio::select! {
        () = accept_loop(&gw, &protocols, &graceful, &listener) => {}
        () = shutdown => {}
    }
    gw.start_draining();
    if !server.shutdown_delay.is_zero() {
        tracing::info!(delay = ?server.shutdown_delay, "not ready; still accepting during shutdown_delay");
        tokio::select! {
            () = accept_loop(&gw, &protocols, &graceful, &listener) => {}
            () = tokio::time::sleep(server.shutdown_delay) => {}
        }
    }
    drop(listener);
    protocols.closing.cancel();
    drain(&gw, graceful, server.shutdown_grace).await;
}

/// How connections are served, shared by every connection task.
struct Protocols {
    h1: http1::Builder,
    h2: http2::Builder<TokioExecutor>,
    header_timeout: Duration,
    /// Cancelled when the listener closes: connections that have not said a word yet
    /// are dropped rather than served (or waited for) during the drain.
    closing: CancellationToken,
}

/// Accepts connections forever.
async fn accept_loop(
    gw: &Arc<Gateway>,
    protocols: &Arc<Protocols>,
    graceful: &GracefulShutdown,
    listener: &TcpListener,
) {
    loop {
        match listener.accept().await {
            Ok((stream, addr)) => {
                let task = serve(Arc::clone(gw), Arc::clone(protocols), graceful.watcher(), stream, addr);
                tokio::spawn(task);
            }
            Err(e) => {
                // Typically EMFILE: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Serves one connection: HTTP/2 if it opens with the h2c preface, else HTTP/1.1.
async fn serve(gw: Arc<Gateway>, protocols: Arc<Protocols>, watcher: Watcher, mut stream: TcpStream, addr: SocketAddr) {
    let _ = stream.set_nodelay(true);
    let sniffed = tokio::select! {
        biased;
        () = protocols.closing.cancelled() => return,
        sniffed = tokio::time::timeout(protocols.header_timeout, sniff(&mut stream)) => sniffed,
    };
    let Ok(Some((prefix, is_h2))) = sniffed else {
        return; // silent, closed, or too slow to say which protocol: cut off
    };
    let peer = Peer { addr };
    let service = service_fn(move |req| handler::handle(Arc::clone(&gw), peer, req));
    let io = TokioIo::new(FramingGuard::new(stream, prefix, !is_h2));
    let result = if is_h2 {
        watcher.watch(protocols.h2.serve_connection(io, service)).await
    } else {
        watcher.watch(protocols.h1.serve_connection(io, service)).await
    };
    if let Err(e) = result {
        tracing::debug!(client = %addr, error = %e, "connection ended with an error");
    }
}

const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Reads until the first bytes tell HTTP/2 prior knowledge from HTTP/1 (usually the
/// second byte). Returns what was read and whether it is HTTP/2; `None` if the peer
/// closed first. The caller bounds it by `header_timeout`, which therefore also cuts
/// connections that never send a byte.
async fn sniff(stream: &mut TcpStream) -> Option<(Bytes, bool)> {
    let mut buf = [0u8; H2_PREFACE.len()];
    let mut n = 0;
    loop {
        match stream.read(&mut buf[n..]).await {
            Ok(0) | Err(_) => return None,
            Ok(read) => n += read,
        }
        if buf[..n] != H2_PREFACE[..n] {
            return Some((Bytes::copy_from_slice(&buf[..n]), false));
        }
        if n == H2_PREFACE.len() {
            return Some((Bytes::copy_from_slice(&buf), true));
        }
    }
}

/// Lets connections and owner tasks finish within `grace`; then owners still running
/// release their claims (so the sender's retry is processed) and are dropped.
async fn drain(gw: &Gateway, graceful: GracefulShutdown, grace: Duration) {
    let deadline = Instant::now() + grace;
    gw.tasks.close();
    let connections = graceful.shutdown();
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
    tracing::warn!(
        still_running = gw.tasks.len(),
        "shutdown grace over: abandoning in-flight requests"
    );
    gw.abandon.cancel();
    // The abandoned requests release their claims, then their connections write the
    // 503s: both must happen before the process exits.
    let released = tokio::time::timeout(RELEASE_BUDGET, async {
        gw.tasks.wait().await;
        connections.await;
    })
    .await;
    if released.is_err() {
        tracing::warn!("some claims could not be released; they expire after processing_ttl");
    }
}
