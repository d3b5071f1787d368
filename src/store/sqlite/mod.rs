//! The SQLite store (`backend = "sqlite"`): markers and queues in one database file
//! (WAL mode), durable across restarts, for one gateway instance.
//!
//! One thread owns the connection ([`writer`]): calls are jobs it runs in batches, one
//! transaction and one commit per batch, so with `fsync = "always"` concurrent calls
//! share an fsync and every answer leaves after its commit. Tables: [`schema`]. Expired
//! markers are swept and `max_bytes` kept by [`sweep`]; [`checkpoint`] copies the log
//! into the database from a thread of its own. The marker calls are in [`markers`],
//! the queue's in [`queue`].

mod checkpoint;
mod markers;
mod queue;
mod schema;
mod sweep;
mod writer;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Sender};
use std::time::Duration;

use tokio::sync::oneshot;

use super::queue::{DeadLetter, Enqueued, Lease, Leased, Message, QueueCounts, QueueStore, Settled};
use super::waits::{LocalWaits, poll_backoff};
use super::{Claim, Completion, Forgotten, KeyInfo, Marker, Store, StoreError, Token, unix_ms};
use crate::config::Fsync;
use writer::{Done, Job, Limits, Writer};

pub struct SqliteStore {
    jobs: Sender<Job>,
    timeout: Duration,
    waits: LocalWaits,
    limits: Arc<Limits>,
}

impl SqliteStore {
    /// Opens the database at `path` (created, with its folder, if missing) and starts
    /// its thread. Messages a previous process was delivering are due again.
    pub fn open(path: &Path, fsync: Fsync, max_bytes: u64, timeout: Duration) -> Result<Self, StoreError> {
        let conn = writer::open(path, fsync, timeout)?;
        let limits = Arc::new(Limits {
            max_bytes,
            ..Limits::default()
        });
        let (jobs, queue) = mpsc::channel();
        let (alive, writer_alive) = mpsc::channel::<()>();
        checkpoint::start(path, writer_alive)?;
        let writer = Writer {
            conn,
            fsync,
            synchronous: writer::synchronous(fsync, true),
            held: HashMap::new(),
            limits: Arc::clone(&limits),
        };
        std::thread::Builder::new()
            .name("sqlite-store".into())
            .spawn(move || {
                let _alive = alive;
                writer::run(writer, queue);
            })
            .map_err(|e| StoreError::Unavailable(format!("cannot start the sqlite thread: {e}")))?;
        Ok(SqliteStore {
            jobs,
            timeout,
            waits: LocalWaits::default(),
            limits,
        })
    }

    /// Runs `op` on the writer thread and waits (within `store.timeout`) for its
    /// answer, which comes after the commit (an fsync with `fsync = "always"`).
    async fn run<T: Send + 'static>(
        &self,
        op: impl FnOnce(&mut Writer) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.submit(op, true).await
    }

    /// [`Self::run`] for a call whose effect need not survive power loss (a read, a
    /// claim, a release, a lease): its commit waits for no fsync (see `writer`).
    async fn run_light<T: Send + 'static>(
        &self,
        op: impl FnOnce(&mut Writer) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.submit(op, false).await
    }

    async fn submit<T: Send + 'static>(
        &self,
        op: impl FnOnce(&mut Writer) -> Result<T, StoreError> + Send + 'static,
        durable: bool,
    ) -> Result<T, StoreError> {
        let (tx, rx) = oneshot::channel();
        let work = Box::new(move |w: &mut Writer| {
            let result = op(w);
            Done {
                ok: result.is_ok(),
                reply: Box::new(move |committed: Result<(), StoreError>| {
                    let _ = tx.send(committed.and(result));
                }),
            }
        });
        let job = Job { work, durable };
        self.jobs
            .send(job)
            .map_err(|_| StoreError::Unavailable("the sqlite thread has stopped".into()))?;
        match tokio::time::timeout(self.timeout, rx).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(StoreError::Unavailable("sqlite could not run the call".into())),
            // Still queued or running: it may yet take effect.
            Err(_) => Err(StoreError::Timeout),
        }
    }
}

impl Store for SqliteStore {
    async fn claim(&self, key: &str, token: Token, first_seen_ms: u64, ttl: Duration) -> Result<Claim, StoreError> {
        let key = key.to_owned();
        self.run_light(move |w| markers::claim(w, &key, token, first_seen_ms, ttl, unix_ms()))
            .await
    }

    async fn complete(&self, key: &str, token: Token, completion: Completion) -> Result<bool, StoreError> {
        let key = key.to_owned();
        let done = self
            .run(move |w| markers::complete(w, &key, token, &completion, unix_ms()))
            .await;
        self.waits.wake(token);
        done
    }

    async fn release(&self, key: &str, token: Token, _first_seen_ms: u64) -> Result<bool, StoreError> {
        let key = key.to_owned();
        let done = self
            .run_light(move |w| markers::release(w, &key, token, unix_ms()))
            .await;
        self.waits.wake(token);
        done
    }

    async fn get(&self, key: &str) -> Result<Option<Marker>, StoreError> {
        let key = key.to_owned();
        self.run_light(move |w| markers::get(w, &key, unix_ms())).await
    }

    /// Woken at once by the holder (every holder is in this process, but one left by
    /// a process that died: the poll covers it until its marker expires).
    async fn wait(&self, _key: &str, holder: Token, attempt: u32, max: Duration) {
        self.waits
            .wait(holder, poll_backoff(attempt).min(max), attempt == 0)
            .await;
    }

    /// A write that commits (readiness must say whether claims can land: a full disk
    /// or a read-only file fails it), refused too while the store is over `max_bytes`
    /// with nothing to evict.
    async fn ping(&self) -> Result<(), StoreError> {
        if self.limits.full.load(Ordering::Relaxed) {
            return Err(StoreError::Unavailable("sqlite store over max_bytes".into()));
        }
        self.run_light(|w| {
            w.conn
                .prepare_cached("INSERT OR REPLACE INTO health (id, checked_ms) VALUES (1, ?1)")?
                .execute([markers::int(unix_ms())])?;
            Ok(())
        })
        .await
    }

    async fn inspect(&self, key: &str) -> Result<Option<KeyInfo>, StoreError> {
        let key = key.to_owned();
        self.run_light(move |w| markers::inspect(w, &key, unix_ms())).await
    }

    async fn forget(&self, key: &str, force: bool) -> Result<Forgotten, StoreError> {
        let key = key.to_owned();
        self.run(move |w| markers::forget(w, &key, force, unix_ms())).await
    }
}

impl QueueStore for SqliteStore {
    async fn enqueue(
        &self,
        route: &str,
        message: &Message,
        max_queued: u64,
        _processing_ttl: Duration,
    ) -> Result<Enqueued, StoreError> {
        let (route, message) = (route.to_owned(), message.clone());
        self.run(move |w| queue::enqueue(w, &route, &message, max_queued)).await
    }

    async fn lease(&self, route: &str, now_ms: u64, reclaim_after: Duration, max: usize) -> Result<Lease, StoreError> {
        let route = route.to_owned();
        self.run_light(move |w| queue::lease(w, &route, now_ms, reclaim_after, max))
            .await
    }

    async fn settle_all(&self, route: &str, ended: &[(&Leased, Settled)]) -> Result<(), StoreError> {
        let route = route.to_owned();
        let ended: Vec<(Leased, Settled)> = ended.iter().map(|(l, s)| ((*l).clone(), s.clone())).collect();
        self.run(move |w| queue::settle_all(w, &route, &ended)).await
    }

    async fn counts(&self, route: &str, now_ms: u64) -> Result<QueueCounts, StoreError> {
        let route = route.to_owned();
        self.run_light(move |w| queue::counts(w, &route, now_ms)).await
    }

    async fn dead_letters(&self, route: &str, limit: usize) -> Result<Vec<DeadLetter>, StoreError> {
        let route = route.to_owned();
        self.run_light(move |w| queue::dead_letters(w, &route, limit)).await
    }

    async fn retry_dead(&self, route: &str, id: Option<&str>, now_ms: u64) -> Result<u64, StoreError> {
        let (route, id) = (route.to_owned(), id.map(str::to_owned));
        self.run(move |w| queue::retry_dead(w, &route, id.as_deref(), now_ms))
            .await
    }

    async fn drop_dead(&self, route: &str, id: &str) -> Result<bool, StoreError> {
        let (route, id) = (route.to_owned(), id.to_owned());
        self.run(move |w| queue::drop_dead(w, &route, &id)).await
    }
}
