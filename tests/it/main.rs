//! Integration tests: one binary (one link step), real sockets on loopback, a real
//! recording upstream, and real store servers where a test needs one.

mod dedup;
mod process;
mod proxy;
mod shutdown;
mod support;
