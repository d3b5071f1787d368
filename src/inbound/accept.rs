//! Failed accepts on a listener (the proxy's or the admin one's), logged once per
//! episode rather than on every retry.

use std::time::Duration;

use tokio::net::TcpListener;
use tokio::time::Instant;

/// A listener's failed accepts. Typically EMFILE (out of file descriptors), which lasts
/// until connections close: each retry waits [`ACCEPT_RETRY`] rather than spinning, and
/// the episode is logged when it starts, when its error changes, every
/// [`ACCEPT_REMINDER`] while it lasts, and when accepts work again (with how many
/// failed), not on every retry.
pub struct AcceptFailures {
    listener: &'static str,
    addr: String,
    count: u64,
    /// When the episode was last logged, and with which error.
    logged: Option<(Instant, std::io::ErrorKind)>,
}

/// How long a listener waits after a failed accept.
const ACCEPT_RETRY: Duration = Duration::from_millis(50);
/// How often a failure that goes on is logged again.
const ACCEPT_REMINDER: Duration = Duration::from_secs(60);

impl AcceptFailures {
    pub fn new(listener: &'static str, socket: &TcpListener) -> Self {
        AcceptFailures {
            listener,
            addr: socket
                .local_addr()
                .map_or_else(|_| "unknown".to_owned(), |a| a.to_string()),
            count: 0,
            logged: None,
        }
    }

    pub async fn failed(&mut self, error: &std::io::Error) {
        if self.log_due(error.kind(), Instant::now()) {
            let (listener, addr, failed) = (self.listener, &self.addr, self.count);
            tracing::warn!(listener, %addr, %error, failed, retry = ?ACCEPT_RETRY,
                "accept failed; retrying until it works (logged again then, or in a minute)");
        }
        self.count += 1;
        tokio::time::sleep(ACCEPT_RETRY).await;
    }

    /// Whether a failure with this error, now, is to be logged (and if so, notes it).
    fn log_due(&mut self, kind: std::io::ErrorKind, now: Instant) -> bool {
        let due = self.count == 0
            || self
                .logged
                .is_none_or(|(at, was)| was != kind || now.duration_since(at) >= ACCEPT_REMINDER);
        if due {
            self.logged = Some((now, kind));
        }
        due
    }

    pub fn accepted(&mut self) {
        if self.count > 0 {
            let (listener, addr, failed) = (self.listener, &self.addr, self.count);
            tracing::info!(listener, %addr, failed, "accepting again");
            self.count = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::ErrorKind;

    use super::*;

    /// An episode of failed accepts is logged when it starts, when its error changes
    /// and once a minute while it lasts; a new episode is logged at once.
    #[tokio::test(start_paused = true)]
    async fn failed_accepts_are_logged_at_the_start_on_a_change_and_once_a_minute() {
        let socket = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let mut failures = AcceptFailures::new("proxy", &socket);
        let mut logged = Vec::new();
        let start = Instant::now();
        for (after, kind) in [
            (0, ErrorKind::OutOfMemory),
            (50, ErrorKind::OutOfMemory),
            (59_000, ErrorKind::OutOfMemory),
            (59_050, ErrorKind::ConnectionAborted),
            (59_100, ErrorKind::ConnectionAborted),
            (119_050, ErrorKind::ConnectionAborted),
        ] {
            logged.push(failures.log_due(kind, start + Duration::from_millis(after)));
            failures.count += 1;
        }
        assert_eq!(logged, [true, false, false, true, false, true]);
        failures.accepted();
        assert!(failures.log_due(ErrorKind::ConnectionAborted, start + Duration::from_millis(119_100)));
    }
}
