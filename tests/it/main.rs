//! Integration tests: one binary (one link step), real sockets on loopback, a real
//! recording upstream, and real store servers where a test needs one.

mod dedup;
mod edges;
mod ops;
mod process;
mod proxy;
mod redis;
mod servers;
mod shutdown;
mod store_contract;
mod support;
