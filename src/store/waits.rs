//! Waking the requests of this process that wait on a marker another request of this
//! process holds (Redis has nothing to wake a waiter by).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::Notify;

use crate::store::Token;

/// Requests of this process waiting on a marker that another request of this process
/// may hold: the holder's complete or release wakes them at once. Redis has nothing to
/// wake a waiter by, so each polls ([`Store::wait`]), the first time after 5 ms; a
/// duplicate that arrived while its first delivery was forwarded by the same gateway
/// (the usual case with one replica) no longer waits out that poll. A holder on another
/// replica wakes nobody here: the poll still covers it.
///
/// A holder that finishes after the store answered a waiter but before the waiter
/// registered wakes nobody either. Under load that is common: both replies often come
/// in one read, and the holder's task may run first. So every holder also leaves its
/// mark in a ring of the last [`FINISHED`] finishers, and a waiter that finds its
/// holder's mark there once registered looks again at once instead of waiting out the
/// first poll's 5 ms (which set the p99 of `bench/run`'s Redis half-duplicate rows).
#[derive(Default)]
pub(crate) struct LocalWaits {
    /// How many waits are registered: a holder finishing with none (nearly always)
    /// takes no lock.
    count: AtomicUsize,
    /// By holder token. Weak: the waiters hold the `Notify`, and the last one to leave
    /// removes the entry.
    by_holder: std::sync::Mutex<HashMap<Token, Weak<Notify>>>,
    /// The last finishers' [`finish_mark`]s, written round the ring at `next_finished`.
    finished: [AtomicU64; FINISHED],
    next_finished: AtomicUsize,
}

/// A wait registered in [`LocalWaits`]; dropped, it removes the holder's entry if no
/// other wait holds it, and counts itself out.
pub(crate) struct Registered<'a> {
    waits: &'a LocalWaits,
    holder: Token,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        {
            let mut waits = self.waits.lock();
            if waits.get(&self.holder).is_some_and(|w| w.strong_count() == 0) {
                waits.remove(&self.holder);
            }
        }
        self.waits.count.fetch_sub(1, Ordering::SeqCst);
    }
}

/// How many finishers [`LocalWaits`] remembers: far more than finish between a reply
/// and its task's next step, and a waiter that misses its holder still has the poll.
pub(crate) const FINISHED: usize = 32;

/// A token as one word for [`LocalWaits::finished`]. Two tokens of this process never
/// share one (the counters differ); a token of another replica that matched would only
/// make a waiter look again early.
pub(crate) fn finish_mark(token: Token) -> u64 {
    token.process ^ token.counter.rotate_left(32)
}

/// How long a waiter that may not be woken waits before it asks the store again:
/// fast at first (most first attempts finish within milliseconds), backing off to
/// 200 ms so a long wait costs a few calls a second.
pub(crate) fn poll_backoff(attempt: u32) -> Duration {
    Duration::from_millis(5u64 << attempt.min(6)).min(Duration::from_millis(200))
}

impl LocalWaits {
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Token, Weak<Notify>>> {
        self.by_holder.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Waits until `holder` finishes here, or `limit` passes. On a waiter's `first`
    /// wait, a holder that has already finished ends it at once. On later ones it
    /// does not: a marker seen again after its holder finished (its complete failed,
    /// say) would otherwise have the waiter ask the store again and again at once.
    pub(crate) async fn wait(&self, holder: Token, limit: Duration, first: bool) {
        self.count.fetch_add(1, Ordering::SeqCst);
        // Declared before `woken`, so dropped after it (the entry's last strong
        // reference), also when the wait is dropped midway (the shutdown's abandon).
        let _registered = Registered { waits: self, holder };
        let woken = {
            let mut waits = self.lock();
            let entry = waits.entry(holder).or_default();
            let notify = entry.upgrade().unwrap_or_else(|| {
                let notify = Arc::new(Notify::new());
                *entry = Arc::downgrade(&notify);
                notify
            });
            // Registered before the lock is released: a wake from now on reaches it.
            notify.notified_owned()
        };
        // SeqCst throughout. If the holder's `count` load sees this wait, it takes
        // the lock: after the registration above, and it wakes it; or before, and
        // then its mark, stored before, is seen here. If not, the mark is seen here
        // too. (Unless 32 later finishers wrote over it: the poll covers that.)
        let mark = finish_mark(holder);
        let finished = first && self.finished.iter().any(|m| m.load(Ordering::SeqCst) == mark);
        if !finished {
            tokio::select! {
                () = woken => {}
                () = tokio::time::sleep(limit) => {}
            }
        }
    }

    /// `holder` finished (its marker completed, released, or its call failed): whoever
    /// waits on it looks again.
    pub(crate) fn wake(&self, holder: Token) {
        let slot = self.next_finished.fetch_add(1, Ordering::Relaxed) % FINISHED;
        self.finished[slot].store(finish_mark(holder), Ordering::SeqCst);
        if self.count.load(Ordering::SeqCst) == 0 {
            return;
        }
        let waiting = self.lock().remove(&holder);
        if let Some(notify) = waiting.and_then(|w| w.upgrade()) {
            notify.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A holder that finished before its waiter registered (its reply ran first):
    /// the waiter looks again at once rather than waiting out the poll. The clock is
    /// paused, so a wait that sleeps moves it by the whole limit.
    #[tokio::test(start_paused = true)]
    async fn a_waiter_whose_holder_already_finished_does_not_wait_out_the_poll() {
        let waits = LocalWaits::default();
        let (done, running) = (Token::generate(), Token::generate());
        waits.wake(done);
        let limit = Duration::from_secs(5);

        let start = tokio::time::Instant::now();
        waits.wait(done, limit, true).await;
        assert_eq!(start.elapsed(), Duration::ZERO, "finished holder: no wait");

        waits.wait(running, limit, true).await;
        assert_eq!(start.elapsed(), limit, "holder still running: waits the poll");
        assert!(waits.lock().is_empty(), "every entry removed");
        assert_eq!(waits.count.load(Ordering::SeqCst), 0);
    }

    /// A wait dropped midway (the shutdown's abandon wins the select around it)
    /// removes its entry and counts itself out too.
    #[tokio::test(start_paused = true)]
    async fn a_wait_dropped_midway_leaves_nothing_registered() {
        let waits = LocalWaits::default();
        let running = Token::generate();
        let dropped = tokio::time::timeout(
            Duration::from_millis(1),
            waits.wait(running, Duration::from_secs(5), true),
        );
        assert!(dropped.await.is_err(), "the wait was cut short");
        assert!(waits.lock().is_empty());
        assert_eq!(waits.count.load(Ordering::SeqCst), 0);
    }

    /// A holder whose marker was still there when its waiter looked again (its
    /// complete failed) is waited for with the poll: the waiter does not spin on the
    /// store until `in_flight_wait` runs out.
    #[tokio::test(start_paused = true)]
    async fn a_finished_holder_seen_again_is_waited_for_with_the_poll() {
        let waits = LocalWaits::default();
        let failed = Token::generate();
        waits.wake(failed);
        let start = tokio::time::Instant::now();
        waits.wait(failed, Duration::from_millis(10), false).await;
        assert_eq!(start.elapsed(), Duration::from_millis(10));
    }

    /// The ring holds the last [`FINISHED`] finishers; one pushed out of it is left to
    /// the poll, as before the ring.
    #[tokio::test(start_paused = true)]
    async fn a_holder_pushed_out_of_the_ring_is_left_to_the_poll() {
        let waits = LocalWaits::default();
        let first = Token::generate();
        waits.wake(first);
        for _ in 0..FINISHED {
            waits.wake(Token::generate());
        }
        let start = tokio::time::Instant::now();
        waits.wait(first, Duration::from_millis(5), true).await;
        assert_eq!(start.elapsed(), Duration::from_millis(5));
    }
}
