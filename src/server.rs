//! The proxy listener: accept loop, and the drain on shutdown (not-ready, keep
//! accepting for `shutdown_delay`, stop, let in-flight requests finish for
//! `shutdown_grace`, release what is abandoned). One connection is [`crate::conn`].

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tokio::net::TcpListener;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::admin;
use crate::config::ServerConfig;
use crate::conn::{self, Protocols};
use crate::gateway::Gateway;

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
        idle_timeout: server.idle_timeout,
        closing: CancellationToken::new(),
        draining: CancellationToken::new(),
    });
    let connections = TaskTracker::new();
    let listener = listeners.proxy;

    tokio::select! {
        () = accept_loop(&gw, &protocols, &connections, &listener) => {}
        () = shutdown => {}
    }
    gw.start_draining();
    if !server.shutdown_delay.is_zero() {
        tracing::info!(delay = ?server.shutdown_delay, "not ready; still accepting during shutdown_delay");
        tokio::select! {
            () = accept_loop(&gw, &protocols, &connections, &listener) => {}
            () = tokio::time::sleep(server.shutdown_delay) => {}
        }
    }
    drop(listener);
    protocols.closing.cancel();
    protocols.draining.cancel();
    connections.close();
    drain(&gw, &connections, server.shutdown_grace).await;
}

/// Accepts connections forever.
async fn accept_loop(gw: &Arc<Gateway>, protocols: &Arc<Protocols>, connections: &TaskTracker, listener: &TcpListener) {
    loop {
        match listener.accept().await {
            Ok((stream, addr)) => {
                connections.spawn(conn::serve(Arc::clone(gw), Arc::clone(protocols), stream, addr));
            }
            Err(e) => {
                // Typically EMFILE: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
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
