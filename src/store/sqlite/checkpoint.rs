//! Checkpoints off the writer's thread. A WAL checkpoint copies the log into the
//! database file and syncs it; made by the writer after a commit (SQLite's
//! `wal_autocheckpoint`), it held every call queued behind it: under load, calls then
//! outlived `store.timeout` (measured: 32 answers of 503 and a p99 of 218 ms in one
//! `bench/run` round). Here a connection of its own checkpoints once a second,
//! `PASSIVE` (it never waits for the writer, which goes on appending to the log).

use std::path::Path;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

use rusqlite::Connection;

use crate::store::StoreError;

const EVERY: Duration = Duration::from_secs(1);

/// Starts the checkpoint thread on `path`. It stops when `writer_alive`'s sender (held
/// by the writer's thread) is dropped.
pub(super) fn start(path: &Path, writer_alive: Receiver<()>) -> Result<(), StoreError> {
    let conn = Connection::open(path)?;
    std::thread::Builder::new()
        .name("sqlite-checkpoint".into())
        .spawn(move || run(conn, writer_alive))
        .map_err(|e| StoreError::Unavailable(format!("cannot start the sqlite checkpoint thread: {e}")))?;
    Ok(())
}

fn run(conn: Connection, writer_alive: Receiver<()>) {
    let mut failing = false;
    while let Err(RecvTimeoutError::Timeout) = writer_alive.recv_timeout(EVERY) {
        match conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
            Ok(()) => failing = false,
            Err(error) if !failing => {
                failing = true;
                tracing::warn!(%error, "sqlite checkpoint failed; the log grows until one succeeds");
            }
            Err(_) => {}
        }
    }
}
