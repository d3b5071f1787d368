//! The signals that stop the gateway: SIGTERM (how orchestrators ask) or SIGINT (Ctrl-C).

use std::io;

/// Stop signals, listened for from the moment [`Stop::listen`] returns: a SIGTERM during
/// start-up drains like any other instead of killing the process.
pub struct Stop {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
}

impl Stop {
    /// Installs the handlers (inside a Tokio runtime).
    pub fn listen() -> io::Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(Stop {
                term: signal(SignalKind::terminate())?,
                int: signal(SignalKind::interrupt())?,
            })
        }
        #[cfg(not(unix))]
        Ok(Stop {})
    }

    /// Resolves on the first SIGTERM or SIGINT.
    pub async fn signalled(mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.term.recv() => tracing::info!("SIGTERM: draining"),
            _ = self.int.recv() => tracing::info!("SIGINT: draining"),
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
