//! Timers that almost never fire, made cheap: hyper's header timer on HTTP/1
//! connections (armed each time it waits for a request head, on a kept-alive
//! connection every request, and dropped once the head is in) and the upstream
//! timeout (armed for every forwarded request). With tokio's timer each is a clock
//! read, an insert into the runtime's timer wheel under its lock and a removal under
//! it again, per request. Here a sleep is a slot in its worker thread's table: taken
//! when first polled, freed when dropped. A task per worker sleeps (on one tokio
//! timer) until the earliest deadline in the table and wakes the sleeps that are due,
//! so a sleep ends at its deadline as a tokio sleep would: the timer wheel sees one
//! entry per worker, re-armed when the earliest deadline passes or an earlier one
//! arrives, not one per request.
//!
//! The table is per thread, which is right for the worker runtimes (current-thread:
//! a connection never changes threads, and a sleep must be polled on the thread it
//! was made on); on a thread that is not a worker ([`crate::waiters::mark_worker`])
//! the sleeps are tokio's. Deadlines are on the real clock: a worker runtime must not
//! pause tokio's (test-util), or the watch would see its timer go off before any
//! sleep is due.

use std::cell::RefCell;
use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::waiters::{self, Key, Waiters};
use hyper::rt::{Sleep, Timer};
use hyper_util::rt::TokioTimer;

/// A [`Timer`] for hyper whose sleeps live in the worker thread's table.
#[derive(Clone, Copy, Debug, Default)]
pub struct WorkerTimer;

impl Timer for WorkerTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn Sleep>> {
        self.sleep_until(Instant::now() + duration)
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn Sleep>> {
        if waiters::on_worker() {
            Box::pin(TableSleep { deadline, slot: None })
        } else {
            TokioTimer::new().sleep_until(deadline)
        }
    }
}

/// Runs `future` until `deadline`: its output, or `None` if the deadline came first.
/// `future` is polled first, so one that is ready at the deadline still counts.
pub fn within<F: Future>(deadline: Instant, future: F) -> Within<F> {
    Within {
        future,
        sleep: sleep_until(deadline),
    }
}

pin_project_lite::pin_project! {
    /// See [`within`]. A named future rather than an `async fn`, which would hold
    /// `future` twice (as its argument and pinned).
    pub struct Within<F> {
        #[pin]
        future: F,
        sleep: Deadline,
    }
}

impl<F: Future> Future for Within<F> {
    type Output = Option<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(output) = this.future.poll(cx) {
            return Poll::Ready(Some(output));
        }
        this.sleep.poll(cx).map(|()| None)
    }
}

/// Runs `future` for at most `limit` from when it first waits: its output, or `None`.
/// A future that is ready at once never reads the clock.
pub fn timeout<F: Future>(limit: Duration, future: F) -> Within<F> {
    Within {
        future,
        sleep: Deadline::After(limit),
    }
}

/// A sleep until `deadline`: in the worker's table on a worker, tokio's elsewhere.
fn sleep_until(deadline: Instant) -> Deadline {
    if waiters::on_worker() {
        Deadline::Table(TableSleep { deadline, slot: None })
    } else {
        Deadline::Tokio(Box::pin(tokio::time::sleep_until(deadline.into())))
    }
}

enum Deadline {
    /// Not started: the sleep starts (from now) when first polled.
    After(Duration),
    Table(TableSleep),
    Tokio(Pin<Box<tokio::time::Sleep>>),
}

impl Deadline {
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if let Deadline::After(limit) = *self {
            *self = sleep_until(Instant::now() + limit);
        }
        match self {
            Deadline::Table(sleep) => Pin::new(sleep).poll(cx),
            Deadline::Tokio(sleep) => sleep.as_mut().poll(cx),
            // Replaced just above. Were it not, a timeout now beats a wait that no
            // waker would ever end.
            Deadline::After(_) => Poll::Ready(()),
        }
    }
}

/// A sleep in the worker's table: no slot until it is first polled.
struct TableSleep {
    deadline: Instant,
    slot: Option<Key>,
}

impl Sleep for TableSleep {}

impl Future for TableSleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let (deadline, slot) = (self.deadline, self.slot);
        let (waiting, start_watch) = TABLE.with_borrow_mut(|table| match slot {
            // Gone: it fired.
            Some(key) => (table.sleeps.refresh(key, cx.waker()).then_some(key), false),
            None => {
                let key = table.sleeps.insert(deadline, cx.waker().clone());
                (Some(key), table.arrived(deadline))
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

impl Drop for TableSleep {
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
    /// The watch task's waker, once it waits: woken when a sleep due before `armed`
    /// arrives.
    watch: Option<Waker>,
    /// When the watch task's timer is set to go off.
    armed: Option<Instant>,
    /// No sleep is due before this (a lower bound: a dropped sleep may have set it).
    earliest: Option<Instant>,
}

impl Table {
    /// A sleep due at `deadline` took a slot. True if a watch task must be started.
    fn arrived(&mut self, deadline: Instant) -> bool {
        self.earliest = Some(self.earliest.map_or(deadline, |e| e.min(deadline)));
        if !self.watching {
            self.watching = true;
            return true;
        }
        if self.armed.is_some_and(|armed| deadline < armed)
            && let Some(watch) = &self.watch
        {
            watch.wake_by_ref();
        }
        false
    }

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

/// Sleeps until the table's earliest deadline and fires the sleeps due then, over and
/// over; ends when none wait (the next sleep to wait starts another), so an idle
/// worker has no wake-ups.
async fn watch() {
    let mut timer = pin!(tokio::time::sleep(Duration::ZERO));
    poll_fn(|cx| {
        TABLE.with_borrow_mut(|table| {
            loop {
                table.fire(Instant::now());
                let Some(earliest) = table.earliest.filter(|_| !table.sleeps.is_empty()) else {
                    (table.watching, table.watch, table.armed) = (false, None, None);
                    return Poll::Ready(());
                };
                if table.armed != Some(earliest) {
                    timer.as_mut().reset(earliest.into());
                    table.armed = Some(earliest);
                }
                // Ready: the earliest is due now (tokio's timer goes off at or after its
                // deadline), so the next `fire` frees it.
                if timer.as_mut().poll(cx).is_pending() {
                    if !table.watch.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                        table.watch = Some(cx.waker().clone());
                    }
                    return Poll::Pending;
                }
            }
        })
    })
    .await
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
            let sleep = WorkerTimer.sleep(Duration::from_millis(250));
            assert!(sleep.is::<TableSleep>(), "a worker runtime gets the table's sleeps");
            sleep.await;
            let took = started.elapsed();
            assert!(took >= Duration::from_millis(250), "ended early: {took:?}");
            assert_eq!(table(|t| t.sleeps.len()), 0, "a fired sleep frees its slot");
        });
    }

    #[test]
    fn dropped_sleeps_free_their_slots_and_the_watch_ends_with_the_last() {
        worker().block_on(async {
            let soon = Duration::from_millis(100);
            let mut first = WorkerTimer.sleep(soon);
            let mut second = WorkerTimer.sleep(soon);
            // Polled once each: both wait in the table, one watch for both.
            let mut cx = Context::from_waker(std::task::Waker::noop());
            assert!(first.as_mut().poll(&mut cx).is_pending());
            assert!(second.as_mut().poll(&mut cx).is_pending());
            assert_eq!(table(|t| (t.sleeps.len(), t.watching)), (2, true));
            drop(first);
            assert_eq!(table(|t| t.sleeps.len()), 1);
            let mut third = WorkerTimer.sleep(soon);
            assert!(third.as_mut().poll(&mut cx).is_pending());
            drop((second, third));
            assert_eq!(table(|t| t.sleeps.len()), 0);
            // The watch ends when it next wakes (at the earliest deadline it knew);
            // nothing wakes an idle worker after that.
            while table(|t| t.watching) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert_eq!(table(|t| (t.watch.is_none(), t.armed)), (true, None));
        });
    }

    #[test]
    fn an_earlier_sleep_arriving_later_ends_at_its_own_deadline() {
        worker().block_on(async {
            let mut late = WorkerTimer.sleep(Duration::from_secs(600));
            let mut cx = Context::from_waker(std::task::Waker::noop());
            assert!(late.as_mut().poll(&mut cx).is_pending());
            // Let the watch arm its timer for the late one.
            while table(|t| t.armed.is_none()) {
                tokio::task::yield_now().await;
            }
            let started = Instant::now();
            let early = WorkerTimer.sleep(Duration::from_millis(50));
            tokio::time::timeout(Duration::from_secs(30), early)
                .await
                .expect("the watch re-armed for the earlier sleep");
            assert!(started.elapsed() >= Duration::from_millis(50), "ended early");
            assert!(late.as_mut().poll(&mut cx).is_pending(), "the late one still waits");
            assert_eq!(table(|t| t.sleeps.len()), 1);
        });
    }

    #[test]
    fn timeout_runs_from_the_first_wait() {
        worker().block_on(async {
            // Ready at once: no sleep is ever made.
            assert_eq!(timeout(Duration::ZERO, async { 3 }).await, Some(3));
            let started = Instant::now();
            assert_eq!(
                timeout(Duration::from_millis(50), std::future::pending::<()>()).await,
                None
            );
            assert!(started.elapsed() >= Duration::from_millis(50), "ended early");
            assert_eq!(table(|t| t.sleeps.len()), 0, "the sleep freed its slot");
        });
    }

    #[test]
    fn within_gives_the_output_or_none_at_the_deadline() {
        worker().block_on(async {
            let now = Instant::now();
            assert_eq!(within(now, async { 7 }).await, Some(7), "a ready future counts");
            let deadline = now + Duration::from_millis(50);
            assert_eq!(within(deadline, std::future::pending::<()>()).await, None);
            assert!(Instant::now() >= deadline, "ended early");
            assert_eq!(table(|t| t.sleeps.len()), 0, "the sleep freed its slot");
        });
        // Off a worker, on tokio's timer.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let deadline = Instant::now() + Duration::from_millis(20);
            assert_eq!(within(deadline, std::future::pending::<()>()).await, None);
            assert!(Instant::now() >= deadline, "ended early");
        });
    }

    #[test]
    fn outside_a_worker_the_sleeps_are_tokios() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let sleep = WorkerTimer.sleep(Duration::from_millis(10));
            assert!(!sleep.is::<TableSleep>());
            sleep.await;
        });
    }
}
