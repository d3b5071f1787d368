//! dedup-gateway: a reverse proxy that makes at-least-once webhook delivery look
//! exactly-once to the bot behind it.
//!
//! # Layout
//!
//! The folders follow a request: in through [`inbound`], decided by [`dedup`], out
//! through [`upstream`], with the markers in [`store`]. Imports run downhill, in this
//! order from the top (`.ci/imports.py` checks that no two modules import each other,
//! directly or round a cycle):
//!
//! - [`server`]: runs a gateway: store checks, the admin listener, the delivery
//!   workers, the proxy listener.
//! - [`admin`]: the admin listener (probes, metrics, `POST /reload` with
//!   [`admin::reload`], the keys API in [`admin::keys`], the queue API in
//!   [`admin::queue`]) and the CLI's client of it.
//! - [`inbound`]: the proxy listener and its workers ([`inbound::listener`]), one
//!   connection (HTTP/1.1 or h2c) and its slow- and idle-client bounds
//!   ([`inbound::connection`]), the HTTP/1 framing guard ([`inbound::guard`]).
//! - [`handler`]: one request: route, read the body, check the sender, derive the key,
//!   hand over to the state machine.
//! - [`queue`]: the delivery workers of queued routes (take a message from the store,
//!   deliver it, record how it ended: delivered, retry, dead letter).
//! - [`dedup`]: the state machine (claim -> forward -> complete | release, or on a
//!   queued route claim -> append -> QUEUED; what a request that finds its key claimed
//!   gets). `dedup/STATE_MACHINE.md` draws it.
//! - [`answer`]: what a request is answered with when it is no error: the upstream's
//!   response (also for requests nobody claims), or the route's duplicate answer.
//! - [`error`]: the errors that end a request, and their one mapping to an answer.
//! - [`gateway`]: the shared state of a running gateway (routes, store, metrics,
//!   readiness, the owners' tasks).
//! - [`upstream`]: what talks to the bot: the request rewrite
//!   ([`upstream::rewrite`]), connections per worker ([`upstream::pool`]), the
//!   HTTP/1.1 client ([`upstream::client`]).
//! - [`routing`]: which route serves a path.
//! - [`store`]: the `Store` and `QueueStore` contracts; [`store::memory`],
//!   [`store::sqlite`] and [`store::redis`].
//! - [`config`]: `gateway.toml` into validated types, a file per section; every
//!   problem with its key path.
//! - [`senders`]: sender presets ([`senders::presets`], data), signature checks and
//!   decryption, a file per scheme.
//! - [`key`]: key sources (`json:`, `xml:`, `header:`, `query:`, `form:`, `body`,
//!   composites) and the stored key.
//! - [`h1`]: the HTTP/1 wire rules both sides share: hyper's limits, the chunked
//!   decoder, hop-by-hop fields, the response reader.
//! - [`body`]: the one body type and the limited reads; [`metrics`]: Prometheus
//!   metrics; [`outcome`]: how a request ended (`x-dedup-status`, the metric label);
//!   [`secret`]: secrets and their redaction; [`shutdown`]: stop signals.

pub mod admin;
pub mod answer;
pub mod body;
pub mod config;
pub mod dedup;
pub mod error;
pub mod gateway;
pub mod h1;
pub mod handler;
pub mod inbound;
pub mod key;
pub mod metrics;
pub mod outcome;
pub mod queue;
pub mod routing;
pub mod secret;
pub mod senders;
pub mod server;
pub mod shutdown;
pub mod store;
pub mod tls;
pub mod upstream;

pub use config::Config;
pub use gateway::Gateway;
pub use server::{Listeners, run};

/// A seeded xorshift generator, for the unit tests that feed it random inputs:
/// reproducible, and no dependency.
#[cfg(test)]
pub(crate) fn test_rng(mut seed: u64) -> impl FnMut() -> u64 {
    move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    }
}
