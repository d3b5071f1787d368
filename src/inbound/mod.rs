//! The inbound side: what the senders talk to. [`listener`] binds the proxy's sockets
//! and runs a worker thread per socket; [`connection`] serves one connection (HTTP/1.1
//! or h2c) within the slow- and idle-client bounds; [`guard`] makes HTTP/1 framing
//! strict before hyper reads it; [`accept`] logs failed accepts once per episode.

pub mod accept;
pub mod connection;
pub mod guard;
pub mod listener;
