//! dedup-gateway: a reverse proxy that makes at-least-once webhook delivery look
//! exactly-once to the bot behind it.
//!
//! # Layout
//!
//! - [`config`]: `gateway.toml` into validated types; every problem with its key path.
//! - [`server`]: accept loop and the drain on shutdown; [`conn`]: one connection
//!   (HTTP/1.1 or h2c) and its slow- and idle-client bounds.
//! - [`framing`]: follows HTTP/1 request framing as hyper does; 400 for requests framed
//!   by both Content-Length and Transfer-Encoding (or that hyper would refuse).
//! - [`handler`]: one request: route, read body, derive key, hand to the state machine.
//! - [`routing`]: which route serves a path.
//! - [`senders`]: sender presets, signature checks and decryption before the store.
//! - [`dedup`]: the state machine (claim -> forward -> complete | release), its
//!   policies, and key extraction ([`dedup::key`]).
//! - [`store`]: the `Store` contract and its backends.
//! - [`proxy`]: the upstream call and the request/response rewrite; [`pool`]: kept-alive
//!   upstream connections per worker; [`client`]: HTTP/1.1 on one of them.
//! - [`body`]: the body type and the limited read.
//! - [`error`]: request-ending errors and their one mapping to an answer.
//! - [`outcome`]: how a request ended (`x-dedup-status` and the metric label).
//! - [`metrics`]: Prometheus metrics; [`admin`]: the admin listener (probes, metrics,
//!   reload, the keys API and its client).
//! - [`gateway`]: the shared state of a running gateway; [`shutdown`]: stop signals;
//!   [`reload`]: SIGHUP / `POST /reload` config reloads.

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
pub mod routing;
pub mod secret;
pub mod senders;
pub mod server;
pub mod shutdown;
pub mod store;
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
