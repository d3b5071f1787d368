//! Configuration reload (SIGHUP, or `POST /reload` on the admin listener): re-read the
//! file, validate it, and swap the routes in atomically. A bad file changes nothing.
//!
//! Routes are what reloads; `[server]` and `[store]` hold sockets and connections, so
//! changes there wait for a restart (and are reported as such).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use crate::config::{self, Config, ConfigError};
use crate::gateway::Gateway;

/// The file a running gateway was started from, and what of it is in effect.
pub struct Reloader {
    path: PathBuf,
    running: Mutex<Config>,
}

/// What a successful reload did.
#[derive(Debug, PartialEq, Eq)]
pub struct Reloaded {
    pub routes: usize,
    /// Sections whose changes were not applied (they need a restart).
    pub needs_restart: Vec<&'static str>,
    /// With HTTPS: whether the certificate files held a new pair (now served).
    pub new_certificate: bool,
}

impl Reloader {
    pub fn new(path: PathBuf, running: Config) -> Self {
        Reloader {
            path,
            running: Mutex::new(running),
        }
    }

    /// Reloads now; on error the running configuration stays. Logs and counts either way.
    pub fn reload(&self, gw: &Gateway) -> Result<Reloaded, ConfigError> {
        let result = self.apply(gw);
        gw.metrics.config_reload(result.is_ok());
        match &result {
            Ok(done) if done.needs_restart.is_empty() => {
                tracing::info!(
                    routes = done.routes,
                    new_certificate = done.new_certificate,
                    "configuration reloaded"
                )
            }
            Ok(done) => tracing::warn!(
                routes = done.routes,
                ignored = ?done.needs_restart,
                "configuration reloaded; changes to these sections take effect after a restart"
            ),
            Err(e) => tracing::error!(error = %e, "configuration reload failed; keeping the running configuration"),
        }
        result
    }

    fn apply(&self, gw: &Gateway) -> Result<Reloaded, ConfigError> {
        // Held across the read too: of two reloads at once, the later read is applied last.
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        let new = Config::load(&self.path)?;
        for warning in &new.warnings {
            tracing::warn!("config: {warning}");
        }
        let mut needs_restart = Vec::new();
        if new.server != running.server {
            needs_restart.push("server");
        }
        if new.store != running.store {
            needs_restart.push("store");
            // The new routes were checked against the file's store.timeout; the running
            // one stays, and a marker must outlive what an owner can hold it with that.
            let problems = config::ttl_problems(&new.routes, running.store.timeout);
            if !problems.is_empty() {
                let path = self.path.display().to_string();
                return Err(ConfigError::Invalid { path, problems });
            }
        }
        // The files the running listener serves: read again (the config's check above
        // refused a pair that cannot be served, so this one only fails if the files
        // changed since, and then the old pair stays).
        let new_certificate = match gw.tls.get().map(|c| c.reload()) {
            Some(Ok(crate::tls::Reloaded::New)) => true,
            Some(Ok(crate::tls::Reloaded::Same)) | None => false,
            Some(Err(e)) => {
                let path = self.path.display().to_string();
                return Err(ConfigError::Invalid {
                    path,
                    problems: vec![format!("server.tls_cert: {e}")],
                });
            }
        };
        gw.swap_routes(&new);
        running.routes = new.routes;
        Ok(Reloaded {
            routes: running.routes.len(),
            needs_restart,
            new_certificate,
        })
    }

    /// [`Reloader::reload`] off the async runtime (it reads a file).
    pub async fn reload_blocking(self: Arc<Self>, gw: Arc<Gateway>) -> Result<Reloaded, String> {
        tokio::task::spawn_blocking(move || self.reload(&gw).map_err(|e| e.to_string()))
            .await
            .unwrap_or_else(|e| Err(format!("reload task failed: {e}")))
    }

    /// Reloads on every SIGHUP, for as long as the process runs. The handler is in place
    /// when this returns (SIGHUP's default action would end the process).
    pub fn reload_on_sighup(self: Arc<Self>, gw: Arc<Gateway>) {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let mut hup = match signal(SignalKind::hangup()) {
                Ok(hup) => hup,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot listen for SIGHUP; use POST /reload");
                    return;
                }
            };
            tokio::spawn(async move {
                while hup.recv().await.is_some() {
                    let _ = Arc::clone(&self).reload_blocking(Arc::clone(&gw)).await;
                }
            });
        }
    }
}
