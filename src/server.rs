//! Running a gateway: the listeners, bound before anything runs (tests bind port 0),
//! then the store checks, the admin listener, the delivery workers of queued routes and
//! the proxy listener until shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;

use crate::admin::{self, reload::Reloader};
use crate::config::ServerConfig;
use crate::gateway::Gateway;
use crate::inbound::listener::{self, ProxySockets};
use crate::tls::{self, Certificates};

/// The sockets the gateway serves on: the proxy's (one per worker) and the admin one;
/// and with HTTPS, the certificate the proxy's serve.
pub struct Listeners {
    proxy: ProxySockets,
    pub admin: Option<TcpListener>,
    tls: Option<Arc<Certificates>>,
}

impl Listeners {
    pub async fn bind(server: &ServerConfig) -> std::io::Result<Self> {
        let tls = match &server.tls {
            Some(files) => {
                let pair = tls::load(files).map_err(std::io::Error::other)?;
                Some(Arc::new(Certificates::new(files.clone(), pair)))
            }
            None => None,
        };
        let proxy = ProxySockets::bind(server)?;
        let admin = match server.admin_listen {
            Some(addr) => Some(TcpListener::bind(addr).await.map_err(listener::at(addr))?),
            None => None,
        };
        Ok(Listeners { proxy, admin, tls })
    }

    pub fn proxy_addr(&self) -> std::io::Result<SocketAddr> {
        self.proxy.addr()
    }
}

/// Serves until `shutdown` resolves, then drains and returns. `reloader` is what
/// `POST /reload` uses (none: the gateway was not started from a file).
pub async fn run(
    gw: Arc<Gateway>,
    server: ServerConfig,
    listeners: Listeners,
    reloader: Option<Arc<Reloader>>,
    shutdown: impl Future<Output = ()>,
) {
    if let Some(certificates) = listeners.tls {
        Arc::clone(&certificates).watch();
        let _ = gw.tls.set(certificates);
    }
    gw.check_store().await;
    gw.spawn_store_checks();
    crate::queue::start(&gw);
    let admin = listeners.admin.as_ref().and_then(|l| l.local_addr().ok());
    if let Some(socket) = listeners.admin {
        admin::spawn(Arc::clone(&gw), socket, reloader);
    }
    listener::serve(gw, server, listeners.proxy, admin, shutdown).await;
}
