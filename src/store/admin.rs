//! What the admin API (`GET` / `DELETE /keys/<route>/<id>`) reads and does to one
//! marker, in terms every backend can answer.

use std::time::Duration;

/// The state of a marker, as the admin API names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyState {
    Processing,
    Completed,
    /// Held in a queued route's queue (see [`crate::store::Marker::Queued`]).
    Queued,
}

impl KeyState {
    pub fn label(self) -> &'static str {
        match self {
            KeyState::Processing => "PROCESSING",
            KeyState::Completed => "COMPLETED",
            KeyState::Queued => "QUEUED",
        }
    }
}

/// One marker, for an operator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyInfo {
    pub state: KeyState,
    /// When the message was first seen (Unix ms; the age is measured from it).
    pub first_seen_ms: u64,
    /// Time to live left; `None` if the store keeps it without expiry (should not happen).
    pub ttl: Option<Duration>,
    /// Whether a reply is stored for `replay`.
    pub reply_stored: bool,
}

/// What a forget found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Forgotten {
    /// The marker was there in this state and is gone now.
    Deleted(KeyState),
    /// Nothing there (never seen, expired, or already forgotten).
    Absent,
    /// PROCESSING and no `force`: left alone.
    Refused,
}
