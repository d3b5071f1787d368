//! Checkpoints off the writer's thread. A WAL checkpoint copies the log into the
//! database file and syncs it; made by the writer after a commit (SQLite's
//! `wal_autocheckpoint`), it held every call queued behind it: under load, calls then
//! outlived `store.timeout` (measured: 32 answers of 503 and a p99 of 218 ms in one
//! `bench/run` round). Here a connection of its own checkpoints once a second,
//! `PASSIVE` (it never waits for the writer, which goes on appending to the log).
//! Under writes that never pause, a passive checkpoint never catches up with the end
//! of the log, which then never starts over: past [`LOG_LIMIT`] a `TRUNCATE`
//! checkpoint waits for a moment between the writer's commits and empties it.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

use rusqlite::Connection;

use crate::store::StoreError;

const EVERY: Duration = Duration::from_secs(1);

/// The log's size past which a checkpoint empties it.
const LOG_LIMIT: u64 = 64 << 20;

/// Starts the checkpoint thread on `path`. It stops when `writer_alive`'s sender (held
/// by the writer's thread) is dropped.
pub(super) fn start(path: &Path, writer_alive: Receiver<()>) -> Result<(), StoreError> {
    let conn = Connection::open(path)?;
    // A TRUNCATE checkpoint waits this long for the writer's commit in progress.
    conn.busy_timeout(Duration::from_secs(2))?;
    let mut log = path.as_os_str().to_owned();
    log.push("-wal");
    let log = PathBuf::from(log);
    std::thread::Builder::new()
        .name("sqlite-checkpoint".into())
        .spawn(move || run(conn, &log, writer_alive))
        .map_err(|e| StoreError::Unavailable(format!("cannot start the sqlite checkpoint thread: {e}")))?;
    Ok(())
}

fn run(conn: Connection, log: &Path, writer_alive: Receiver<()>) {
    let mut failing = false;
    while let Err(RecvTimeoutError::Timeout) = writer_alive.recv_timeout(EVERY) {
        let long = std::fs::metadata(log).is_ok_and(|m| m.len() > LOG_LIMIT);
        let mode = if long {
            "PRAGMA wal_checkpoint(TRUNCATE)"
        } else {
            "PRAGMA wal_checkpoint(PASSIVE)"
        };
        match conn.query_row(mode, [], |_| Ok(())) {
            Ok(()) => failing = false,
            Err(error) if !failing => {
                failing = true;
                tracing::warn!(%error, "sqlite checkpoint failed; the log grows until one succeeds");
            }
            Err(_) => {}
        }
    }
}
