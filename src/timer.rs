//! hyper's header timer on HTTP/1 connections, made cheap. hyper starts a timer each
//! time it waits for a request head (every request on a kept-alive connection) and
//! drops it once the head is in. With tokio's timer that is an allocation, a clock
//! read, an insert into the runtime's timer wheel under its lock and a removal under
//! it again, per request, for a timer that almost never fires. Here a sleep is a
//! slot in its worker thread's table: taken when hyper first waits on it, freed when
//! hyper drops it, and a task per worker looks every [`TICK`] for slots that are due.
//! A timeout so fires up to [`TICK`] late, which for `header_timeout` (seconds) is
//! nothing.
//!
//! The table is per thread, which is right for the worker runtimes (current-thread:
//! a connection never changes threads); on a thread that is not a worker
//! ([`crate::waiters::mark_worker`]) the timer hands out tokio's sleeps.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::waiters::{self, Key, Waiters};
use hyper::rt::{Sleep, Timer};
use hyper_util::rt::TokioTimer;

/// How often a worker looks for due sleeps: the most a timeout fires late.
pub const TICK: Duration = Duration::from_millis(100);

/// A [`Timer`] for hyper whose sleeps live in the worker thread's table.
#[derive(Clone, Copy, Debug, Default)]
pub struct CoarseTimer;

impl Timer for CoarseTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn Sleep>> {
        self.sleep_until(Instant::now() + duration)
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn Sleep>> {
        if waiters::on_worker() {
            Box::pin(CoarseSleep { deadline, slot: None })
        } else {
            TokioTimer::new().sleep_until(deadline)
        }
    }
}

/// A sleep of [`CoarseTimer`]: no slot until it is first polled.
struct CoarseSleep {
    deadline: Instant,
    slot: Option<Key>,
}

impl Sleep for CoarseSleep {}

impl Future for CoarseSleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let (deadline, slot) = (self.deadline, self.slot);
        let (waiting, start_watch) = TABLE.with_borrow_mut(|table| match slot {
            // Gone: it fired.
            Some(key) => (table.sleeps.refresh(key, cx.waker()).then_some(key), false),
            None => {
                let key = table.sleeps.insert(deadline, cx.waker().clone());
                table.earliest = Some(table.earliest.map_or(deadline, |e| e.min(deadline)));
                (Some(key), !std::mem::replace(&mut table.watching, true))
            }
        });
        if start_watch {
            tokio::spawn(watch());
        }
        match waiting {
            Some(key) => {
                self.slot = Some(key);
                Poll::Pending
            }
            None => Poll::Ready(()),
        }
    }
}

impl Drop for CoarseSleep {
    fn drop(&mut self) {
        if let Some(key) = self.slot {
            // `try_with`: a connection dropped while its thread exits finds no table.
            let _ = TABLE.try_with(|table| {
                if let Ok(mut table) = table.try_borrow_mut() {
                    table.sleeps.remove(key);
                }
            });
        }
    }
}

thread_local! {
    static TABLE: RefCell<Table> = RefCell::default();
}

/// A thread's waiting sleeps.
#[derive(Default)]
struct Table {
    sleeps: Waiters<Instant>,
    /// Whether a [`watch`] task runs for this table.
    watching: bool,
    /// No sleep is due before this (a lower bound: a dropped sleep may have set it).
    earliest: Option<Instant>,
}

impl Table {
    /// Wakes (and frees) the sleeps due at `now`.
    fn fire(&mut self, now: Instant) {
        if self.earliest.is_none_or(|e| e > now) {
            return;
        }
        let mut earliest = None::<Instant>;
        self.sleeps.wake_where(|&deadline| {
            let due = deadline <= now;
            if !due {
                earliest = Some(earliest.map_or(deadline, |e| e.min(deadline)));
            }
            due
        });
        self.earliest = earliest;
    }
}

/// Fires the thread's due sleeps every [`TICK`] while any wait; ends when none do (the
/// next sleep to wait starts another), so an idle worker has no wake-ups.
async fn watch() {
    loop {
        tokio::time::sleep(TICK).await;
        let done = TABLE.with_borrow_mut(|table| {
            table.fire(Instant::now());
            table.watching = !table.sleeps.is_empty();
            !table.watching
        });
        if done {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::waiters::tests::worker;

    fn table<T>(f: impl FnOnce(&Table) -> T) -> T {
        TABLE.with_borrow(f)
    }

    #[test]
    fn a_sleep_ends_at_its_deadline_not_before() {
        worker().block_on(async {
            let started = Instant::now();
            let sleep = CoarseTimer.sleep(Duration::from_millis(250));
            assert!(sleep.is::<CoarseSleep>(), "a worker runtime gets the table's sleeps");
            sleep.await;
            let took = started.elapsed();
            assert!(took >= Duration::from_millis(250), "ended early: {took:?}");
            assert_eq!(table(|t| t.sleeps.len()), 0, "a fired sleep frees its slot");
        });
    }

    #[test]
    fn dropped_sleeps_free_their_slots_and_the_watch_ends_with_the_last() {
        worker().block_on(async {
            let mut first = CoarseTimer.sleep(Duration::from_secs(60));
            let mut second = CoarseTimer.sleep(Duration::from_secs(60));
            // Polled once each: both wait in the table, one watch for both.
            let mut cx = Context::from_waker(std::task::Waker::noop());
            assert!(first.as_mut().poll(&mut cx).is_pending());
            assert!(second.as_mut().poll(&mut cx).is_pending());
            assert_eq!(table(|t| (t.sleeps.len(), t.watching)), (2, true));
            drop(first);
            assert_eq!(table(|t| t.sleeps.len()), 1);
            let mut third = CoarseTimer.sleep(Duration::from_secs(60));
            assert!(third.as_mut().poll(&mut cx).is_pending());
            drop((second, third));
            assert_eq!(table(|t| t.sleeps.len()), 0);
            // The watch ends at its next look; nothing wakes an idle worker after that.
            while table(|t| t.watching) {
                tokio::time::sleep(TICK).await;
            }
        });
    }

    #[test]
    fn outside_a_worker_the_sleeps_are_tokios() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let sleep = CoarseTimer.sleep(Duration::from_millis(10));
            assert!(!sleep.is::<CoarseSleep>());
            sleep.await;
        });
    }
}
