//! Integration tests: one binary (one link step), real sockets on loopback, a real
//! recording upstream, and real store servers where a test needs one.

mod admin_keys;
mod conventions;
mod dedup;
mod edges;
mod forwarded;
mod https;
mod model;
mod ops;
mod pki;
mod pool;
mod process;
mod prometheus;
mod proxy;
mod queue_config;
mod queue_crash;
mod queue_store;
mod queued;
mod redis;
mod rediss;
mod secrets;
mod senders;
mod senders_cli;
mod servers;
mod shutdown;
mod signing;
mod store_contract;
mod support;
mod upstream_wire;
