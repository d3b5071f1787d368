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
//! a connection never changes threads); a worker says so with [`use_on_this_thread`].
//! On any other thread the timer hands out tokio's sleeps.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use hyper::rt::{Sleep, Timer};
use hyper_util::rt::TokioTimer;
use tokio::runtime::{Handle, RuntimeFlavor};

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
        if TABLE_HERE.get() {
            Box::pin(CoarseSleep { deadline, slot: None })
        } else {
            TokioTimer::new().sleep_until(deadline)
        }
    }
}

/// Makes this thread's [`CoarseTimer`] sleeps wait in its table. Only for a thread that
/// runs a current-thread runtime for good (a worker): the table's watch is a task on it.
pub fn use_on_this_thread() {
    assert!(
        Handle::current().runtime_flavor() == RuntimeFlavor::CurrentThread,
        "the coarse timer needs a current-thread runtime"
    );
    TABLE_HERE.set(true);
}

/// A sleep of [`CoarseTimer`]: no slot until it is first polled.
struct CoarseSleep {
    deadline: Instant,
    /// Where it waits: index into the thread's table, and the slot's id there.
    slot: Option<(usize, u64)>,
}

impl Sleep for CoarseSleep {}

impl Future for CoarseSleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let deadline = self.deadline;
        let waiting = TABLE.with_borrow_mut(|table| match self.slot {
            Some((index, id)) => table.poll(index, id, cx.waker()),
            None => Some(table.insert(deadline, cx.waker().clone())),
        });
        match waiting {
            None => Poll::Ready(()),
            Some(Waiting::Still) => Poll::Pending,
            Some(Waiting::Inserted {
                index,
                id,
                watch: start,
            }) => {
                self.slot = Some((index, id));
                if start {
                    tokio::spawn(watch());
                }
                Poll::Pending
            }
        }
    }
}

impl Drop for CoarseSleep {
    fn drop(&mut self) {
        if let Some((index, id)) = self.slot {
            // `try_with`: a connection dropped while its thread exits finds no table.
            let _ = TABLE.try_with(|table| {
                if let Ok(mut table) = table.try_borrow_mut() {
                    table.remove(index, id);
                }
            });
        }
    }
}

/// Tables taken so far: a table's ids start at its number shifted up 40 bits, so ids
/// are unique across threads and a sleep polled or dropped on a thread it did not
/// start on (never on a worker) cannot take another sleep's slot for its own.
static TABLES: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static TABLE: RefCell<Table> = RefCell::default();
    static TABLE_HERE: Cell<bool> = const { Cell::new(false) };
}

/// A thread's waiting sleeps.
#[derive(Default)]
struct Table {
    /// The id of the next slot taken (0 until the first).
    next_id: u64,
    slots: Vec<Slot>,
    free: Vec<usize>,
    used: usize,
    /// Whether a [`watch`] task runs for this table.
    watching: bool,
    /// No slot is due before this (a lower bound: a freed slot may have set it).
    earliest: Option<Instant>,
}

struct Slot {
    /// 0: free (or fired, which frees it).
    id: u64,
    deadline: Instant,
    waker: Option<Waker>,
}

enum Waiting {
    Still,
    /// `watch`: no task watches the table yet; the caller starts one.
    Inserted {
        index: usize,
        id: u64,
        watch: bool,
    },
}

impl Table {
    fn insert(&mut self, deadline: Instant, waker: Waker) -> Waiting {
        if self.next_id == 0 {
            self.next_id = (TABLES.fetch_add(1, Ordering::Relaxed) << 40) | 1;
        }
        let id = self.next_id;
        self.next_id += 1;
        let slot = Slot {
            id,
            deadline,
            waker: Some(waker),
        };
        let index = match self.free.pop() {
            Some(index) => {
                self.slots[index] = slot;
                index
            }
            None => {
                self.slots.push(slot);
                self.slots.len() - 1
            }
        };
        self.used += 1;
        self.earliest = Some(self.earliest.map_or(deadline, |e| e.min(deadline)));
        let watch = !std::mem::replace(&mut self.watching, true);
        Waiting::Inserted { index, id, watch }
    }

    /// `None` once the slot has fired (it is then free, or another sleep's).
    fn poll(&mut self, index: usize, id: u64, waker: &Waker) -> Option<Waiting> {
        let slot = self.slots.get_mut(index).filter(|s| s.id == id)?;
        if !slot.waker.as_ref().is_some_and(|w| w.will_wake(waker)) {
            slot.waker = Some(waker.clone());
        }
        Some(Waiting::Still)
    }

    fn remove(&mut self, index: usize, id: u64) {
        if let Some(slot) = self.slots.get_mut(index).filter(|s| s.id == id) {
            slot.id = 0;
            slot.waker = None;
            self.free.push(index);
            self.used -= 1;
        }
    }

    /// Wakes (and frees) the slots due at `now`.
    fn fire(&mut self, now: Instant) {
        if self.earliest.is_none_or(|e| e > now) {
            return;
        }
        let mut earliest = None::<Instant>;
        for (index, slot) in self.slots.iter_mut().enumerate() {
            if slot.id == 0 {
                continue;
            }
            if slot.deadline <= now {
                slot.id = 0;
                if let Some(waker) = slot.waker.take() {
                    waker.wake();
                }
                self.free.push(index);
                self.used -= 1;
            } else {
                earliest = Some(earliest.map_or(slot.deadline, |e| e.min(slot.deadline)));
            }
        }
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
            table.watching = table.used > 0;
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

    /// A runtime on this thread, as a worker's.
    fn worker() -> tokio::runtime::Runtime {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async { use_on_this_thread() });
        runtime
    }

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
            assert_eq!(table(|t| t.used), 0, "a fired sleep frees its slot");
        });
    }

    #[test]
    fn dropped_sleeps_free_their_slots_and_the_watch_ends_with_the_last() {
        worker().block_on(async {
            let mut first = CoarseTimer.sleep(Duration::from_secs(60));
            let mut second = CoarseTimer.sleep(Duration::from_secs(60));
            // Polled once each: both wait in the table, one watch for both.
            let mut cx = Context::from_waker(Waker::noop());
            assert!(first.as_mut().poll(&mut cx).is_pending());
            assert!(second.as_mut().poll(&mut cx).is_pending());
            assert_eq!(table(|t| (t.used, t.watching)), (2, true));
            drop(first);
            assert_eq!(table(|t| t.used), 1);
            // A slot freed and taken again belongs to the new sleep only.
            let mut third = CoarseTimer.sleep(Duration::from_secs(60));
            assert!(third.as_mut().poll(&mut cx).is_pending());
            assert_eq!(table(|t| (t.used, t.slots.len())), (2, 2), "the freed slot is reused");
            drop((second, third));
            assert_eq!(table(|t| t.used), 0);
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
