//! The proxy listener: accept loop, HTTP/1.1 and h2c on one port, header-read timeout,
//! and the drain on shutdown (not-ready, keep accepting for `shutdown_delay`, stop,
//! let in-flight requests finish for `shutdown_grace`, release what is abandoned).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::time::Instant;

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
pub async fn run(
    gw: Arc<Gateway>,
    server: ServerConfig,
    listeners: Listeners,
    shutdown: impl Future<Output = ()>,
) {
    gw.check_store().await;
    gw.spawn_store_checks();
    if let Some(admin) = listeners.admin {
        admin::spawn(Arc::clone(&gw), admin);
    }
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(server.header_timeout);
    builder.http2().timer(TokioTimer::new());
    let graceful = GracefulShutdown::new();
    let listener = listeners.proxy;

    tokio::select! {
        () = accept_loop(&gw, &builder, &graceful, &listener) => {}
        () = shutdown => {}
    }
    gw.start_draining();
    if !server.shutdown_delay.is_zero() {
        tracing::info!(delay = ?server.shutdown_delay, "not ready; still accepting during shutdown_delay");
        tokio::select! {
            () = accept_loop(&gw, &builder, &graceful, &listener) => {}
            () = tokio::time::sleep(server.shutdown_delay) => {}
        }
    }
    drop(listener);
    drain(&gw, graceful, server.shutdown_grace).await;
}

/// Accepts connections forever.
async fn accept_loop(
    gw: &Arc<Gateway>,
    builder: &auto::Builder<TokioExecutor>,
    graceful: &GracefulShutdown,
    listener: &TcpListener,
) {
    loop {
        match listener.accept().await {
            Ok((stream, addr)) => serve(gw, builder, graceful, stream, addr),
            Err(e) => {
                // Typically EMFILE: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

fn serve(
    gw: &Arc<Gateway>,
    builder: &auto::Builder<TokioExecutor>,
    graceful: &GracefulShutdown,
    stream: tokio::net::TcpStream,
    addr: SocketAddr,
) {
    let _ = stream.set_nodelay(true);
    let peer = Peer { addr };
    let gw = Arc::clone(gw);
    let service = service_fn(move |req| handler::handle(Arc::clone(&gw), peer, req));
    let conn = builder.serve_connection(TokioIo::new(FramingGuard::new(stream)), service);
    let conn = graceful.watch(conn.into_owned());
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(client = %addr, error = %e, "connection ended with an error");
        }
    });
}

/// Lets connections and owner tasks finish within `grace`; then owners still running
/// release their claims (so the sender's retry is processed) and are dropped.
async fn drain(gw: &Gateway, graceful: GracefulShutdown, grace: Duration) {
    let deadline = Instant::now() + grace;
    gw.tasks.close();
    let finished = tokio::time::timeout_at(deadline, async {
        graceful.shutdown().await;
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
    if tokio::time::timeout(RELEASE_BUDGET, gw.tasks.wait())
        .await
        .is_err()
    {
        tracing::warn!("some claims could not be released; they expire after processing_ttl");
    }
}
