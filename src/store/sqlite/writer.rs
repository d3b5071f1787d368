//! The one thread that uses the database. Calls come as jobs on a channel; the thread
//! takes every job waiting, runs each in a savepoint of one transaction and commits
//! once (group commit: with `fsync = "always"`, concurrent claims and appends share one
//! fsync), then answers them all. A job's answer leaves only after the commit, so an
//! acknowledged append is on disk before the sender hears of it.
//!
//! Only what must survive power loss pays for an fsync: a batch with a durable job
//! (an enqueue, a complete, how a delivery ended, an operator's change) commits with
//! `synchronous = FULL`; one of reads, claims, releases and leases with `NORMAL` (in
//! WAL mode: no fsync; the next durable commit's fsync covers it). A claim or a lease
//! lost with the machine costs nothing: nothing was acknowledged on it.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use rusqlite::Connection;

use super::{schema, sweep};
use crate::config::Fsync;
use crate::store::StoreError;

/// What a job has: the connection, inside the batch's transaction, and what the thread
/// keeps between jobs.
pub(super) struct Writer {
    pub conn: Connection,
    /// `store.fsync`.
    pub fsync: Fsync,
    /// The connection's `synchronous` now.
    pub synchronous: &'static str,
    /// Messages each route holds (what `max_queued` counts): counted once per route,
    /// then kept up to date here (this thread is the database's only writer). Cleared
    /// when a commit fails, to be counted again.
    pub held: HashMap<String, u64>,
    pub limits: Arc<Limits>,
}

/// The store's bound, and whether the sweep found it reached.
#[derive(Default)]
pub(super) struct Limits {
    /// `max_bytes`.
    pub max_bytes: u64,
    /// Over `max_bytes` with no COMPLETED marker left to evict: new claims and appends
    /// are refused until sweeps make room.
    pub full: AtomicBool,
}

/// A call for the thread: its work, and whether its effect must survive power loss.
pub(super) struct Job {
    pub work: Box<dyn FnOnce(&mut Writer) -> Done + Send>,
    pub durable: bool,
}

/// A job's work done: whether it succeeded (else its savepoint is rolled back), and
/// its answer, to be sent once the commit's fate is known.
pub(super) struct Done {
    pub ok: bool,
    pub reply: Box<dyn FnOnce(Result<(), StoreError>) + Send>,
}

/// Jobs in one transaction at most: a burst does not hold every answer for long.
const MAX_BATCH: usize = 512;

/// How often expired markers are swept and the size checked.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

impl From<rusqlite::Error> for StoreError {
    /// A failed statement did not take effect: its savepoint is rolled back.
    fn from(e: rusqlite::Error) -> Self {
        StoreError::Unavailable(format!("sqlite: {e}"))
    }
}

/// Opens (creating it and its folder if missing) and prepares the database.
pub(super) fn open(path: &Path, fsync: Fsync, busy: Duration) -> Result<Connection, StoreError> {
    if let Some(folder) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(folder)
            .map_err(|e| StoreError::Unavailable(format!("cannot create {}: {e}", folder.display())))?;
    }
    let conn = Connection::open(path)?;
    conn.busy_timeout(busy)?;
    let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::Unavailable(format!(
            "sqlite: {} cannot use WAL mode (journal_mode is {mode})",
            path.display()
        )));
    }
    conn.pragma_update(None, "synchronous", synchronous(fsync, true))?;
    // Checkpoints are the checkpoint thread's (see `checkpoint`), not a commit's.
    conn.pragma_update(None, "wal_autocheckpoint", 0)?;
    conn.execute_batch(schema::CREATE)?;
    // A message a worker had when the last process stopped is due again, now (its
    // due_ms was its lease's end); its attempt was counted when it was taken.
    let now = i64::try_from(crate::store::unix_ms()).unwrap_or(i64::MAX);
    conn.execute(
        "UPDATE queue SET state = 'ready', due_ms = ?1 WHERE state = 'delivering'",
        [now],
    )?;
    Ok(conn)
}

/// The thread's loop: until every sender of jobs is gone.
pub(super) fn run(mut writer: Writer, jobs: Receiver<Job>) {
    let mut next_sweep = Instant::now();
    let mut batch = Vec::with_capacity(MAX_BATCH);
    loop {
        match jobs.recv_timeout(next_sweep.saturating_duration_since(Instant::now())) {
            Ok(job) => batch.push(job),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        while batch.len() < MAX_BATCH {
            match jobs.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        if !batch.is_empty() {
            let durable = batch.iter().any(|job: &Job| job.durable);
            set_synchronous(&mut writer, durable);
            commit(&mut writer, batch.drain(..));
        }
        if Instant::now() >= next_sweep {
            sweep::run(&mut writer);
            next_sweep = Instant::now() + SWEEP_EVERY;
        }
    }
}

/// In WAL mode, FULL syncs the log at every commit, NORMAL at checkpoints only; OFF
/// leaves it to the OS.
pub(super) fn synchronous(fsync: Fsync, durable: bool) -> &'static str {
    match (fsync, durable) {
        (Fsync::Always, true) => "FULL",
        (Fsync::Always, false) => "NORMAL",
        (Fsync::Never, _) => "OFF",
    }
}

/// Sets `synchronous` for the next commit (outside a transaction, where SQLite takes it).
fn set_synchronous(writer: &mut Writer, durable: bool) {
    let wanted = synchronous(writer.fsync, durable);
    if wanted != writer.synchronous {
        match writer.conn.pragma_update(None, "synchronous", wanted) {
            Ok(()) => writer.synchronous = wanted,
            // Left as it was: FULL at worst, a commit slower than it needed to be.
            Err(e) => tracing::warn!(error = %e, "sqlite cannot set synchronous"),
        }
    }
}

/// Runs `jobs` in one transaction, then answers each.
fn commit(writer: &mut Writer, jobs: impl Iterator<Item = Job>) {
    let mut replies = Vec::with_capacity(MAX_BATCH);
    if let Err(e) = writer.conn.execute_batch("BEGIN IMMEDIATE") {
        // Not run, so nothing of them took effect: a job dropped unrun is answered
        // "unavailable" by its closed channel.
        tracing::warn!(error = %e, "sqlite cannot begin a transaction");
        return;
    }
    for job in jobs {
        if let Err(e) = writer.conn.execute_batch("SAVEPOINT job") {
            tracing::warn!(error = %e, "sqlite cannot open a savepoint");
            continue;
        }
        let done = (job.work)(writer);
        let end = if done.ok {
            "RELEASE job"
        } else {
            "ROLLBACK TO job; RELEASE job"
        };
        match writer.conn.execute_batch(end) {
            Ok(()) => replies.push(done.reply),
            Err(e) => {
                // The transaction is in doubt: end it, and fail everything in it.
                let error = StoreError::from(e);
                abort(writer);
                (done.reply)(Err(error_copy(&error)));
                for reply in replies {
                    reply(Err(error_copy(&error)));
                }
                return;
            }
        }
    }
    match writer.conn.execute_batch("COMMIT") {
        Ok(()) => replies.into_iter().for_each(|reply| reply(Ok(()))),
        Err(e) => {
            let error = StoreError::from(e);
            tracing::warn!(%error, "sqlite commit failed: nothing of it was stored");
            abort(writer);
            for reply in replies {
                reply(Err(error_copy(&error)));
            }
        }
    }
}

/// Rolls the open transaction back (if SQLite has not already) and forgets the counts
/// that assumed it would commit.
fn abort(writer: &mut Writer) {
    if !writer.conn.is_autocommit() {
        let _ = writer.conn.execute_batch("ROLLBACK");
    }
    writer.held.clear();
}

fn error_copy(error: &StoreError) -> StoreError {
    StoreError::Unavailable(error.to_string())
}

impl Writer {
    /// How many messages `route` holds.
    pub fn held(&mut self, route: &str) -> Result<u64, StoreError> {
        if let Some(&n) = self.held.get(route) {
            return Ok(n);
        }
        let n: i64 = self
            .conn
            .prepare_cached("SELECT count(*) FROM queue WHERE route = ?1")?
            .query_row([route], |row| row.get(0))?;
        let n = u64::try_from(n).unwrap_or(0);
        self.held.insert(route.to_owned(), n);
        Ok(n)
    }

    /// Adds `delta` to `route`'s count (only after the change is written in this
    /// transaction; a failed commit clears every count).
    pub fn adjust_held(&mut self, route: &str, delta: i64) {
        if let Some(n) = self.held.get_mut(route) {
            *n = n.saturating_add_signed(delta);
        }
    }

    pub fn full(&self) -> bool {
        self.limits.full.load(Ordering::Relaxed)
    }
}
