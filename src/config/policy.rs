//! The per-route and per-store choices the state machine acts on, as enums so an
//! illegal policy cannot be written down.

use super::read::Choice;

/// What a request does when it finds the message still being processed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InFlight {
    /// Hold the request until the first attempt ends (up to `in_flight_wait`).
    Wait,
    /// Answer 409 + `Retry-After` at once.
    Conflict,
    /// Answer the duplicate response at once (lossy if the first attempt fails).
    Ack,
}

/// What happens to the claim when the upstream times out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnUpstreamTimeout {
    /// Delete the marker: the sender's retry is processed.
    Release,
    /// Keep PROCESSING until it expires: a slow upstream that did the work is not hit again.
    Keep,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Enforce,
    /// Forward everything; only record what enforce mode would have dropped.
    Shadow,
}

/// What a request without a derivable key gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnMissingKey {
    Forward,
    Reject,
    Ack,
}

/// What a request gets when the store cannot be reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnStoreError {
    /// 503 + `Retry-After`: the sender retries, nothing is lost.
    Reject,
    /// Forward without dedup: nothing is delayed, duplicates may pass.
    Forward,
}

impl Choice for InFlight {
    const NAMES: &'static [(&'static str, Self)] =
        &[("wait", Self::Wait), ("conflict", Self::Conflict), ("ack", Self::Ack)];
}

impl Choice for OnUpstreamTimeout {
    const NAMES: &'static [(&'static str, Self)] = &[("release", Self::Release), ("keep", Self::Keep)];
}

impl Choice for Mode {
    const NAMES: &'static [(&'static str, Self)] = &[("enforce", Self::Enforce), ("shadow", Self::Shadow)];
}

impl Choice for OnMissingKey {
    const NAMES: &'static [(&'static str, Self)] =
        &[("forward", Self::Forward), ("reject", Self::Reject), ("ack", Self::Ack)];
}

impl Choice for OnStoreError {
    const NAMES: &'static [(&'static str, Self)] = &[("reject", Self::Reject), ("forward", Self::Forward)];
}
