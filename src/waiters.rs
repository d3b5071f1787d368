//! Waiting cheaply on a worker thread. A future that waits for something rare (a
//! timeout, the drain, the end of the shutdown grace) is polled at every wake-up of its
//! task, a few per request. Tokio's timer wheel and a cancellation token keep their
//! waiters in lists under locks shared by both workers, taken to register and again
//! to deregister, per request. Here a waiter takes a numbered slot in a table of its
//! own thread on its first poll and frees it when dropped, and whatever it waits for
//! wakes (and frees) the slots it concerns: the worker timer ([`crate::timer`]) and
//! [`Signal`].
//!
//! Only a worker thread (a current-thread runtime for good: [`mark_worker`]) has tables
//! with a task to serve them; elsewhere the waits fall back to tokio's own.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};

use tokio::runtime::{Handle, RuntimeFlavor};
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

thread_local! {
    static WORKER: Cell<bool> = const { Cell::new(false) };
    static SIGNAL_WAITERS: RefCell<Vec<(u64, Waiters<()>)>> = const { RefCell::new(Vec::new()) };
}

/// Makes this thread a worker: its waits use its tables. Only for a thread that runs a
/// current-thread runtime for good: the tables' tasks run on it.
pub fn mark_worker() {
    assert!(
        Handle::current().runtime_flavor() == RuntimeFlavor::CurrentThread,
        "a worker runs a current-thread runtime"
    );
    WORKER.set(true);
}

/// Whether this thread is a worker ([`mark_worker`]).
pub fn on_worker() -> bool {
    WORKER.get()
}

/// Tables made so far: a table's ids start at its number shifted up 40 bits, so ids
/// are unique across threads, and a future polled or dropped on a thread it did not
/// start on (never on a worker) cannot take another's slot for its own.
static TABLES: AtomicU64 = AtomicU64::new(1);

/// Where a waiter waits: what [`Waiters::insert`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Key {
    index: usize,
    id: u64,
}

/// The waiting wakers of one thread, each with what it waits for (`T`).
pub struct Waiters<T> {
    /// The id of the next slot taken (0 until the first).
    next_id: u64,
    slots: Vec<Slot<T>>,
    free: Vec<usize>,
    len: usize,
}

struct Slot<T> {
    /// 0: free.
    id: u64,
    waker: Option<Waker>,
    what: T,
}

impl<T> Default for Waiters<T> {
    fn default() -> Self {
        Waiters {
            next_id: 0,
            slots: Vec::new(),
            free: Vec::new(),
            len: 0,
        }
    }
}

impl<T> Waiters<T> {
    pub fn insert(&mut self, what: T, waker: Waker) -> Key {
        if self.next_id == 0 {
            self.next_id = (TABLES.fetch_add(1, Ordering::Relaxed) << 40) | 1;
        }
        let id = self.next_id;
        self.next_id += 1;
        let slot = Slot {
            id,
            waker: Some(waker),
            what,
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
        self.len += 1;
        Key { index, id }
    }

    /// Keeps `waker` as the one to wake (a clone only if it changed). False if the slot
    /// is gone: woken, or not this table's.
    pub fn refresh(&mut self, key: Key, waker: &Waker) -> bool {
        let Some(slot) = self.slots.get_mut(key.index).filter(|s| s.id == key.id) else {
            return false;
        };
        if !slot.waker.as_ref().is_some_and(|w| w.will_wake(waker)) {
            slot.waker = Some(waker.clone());
        }
        true
    }

    pub fn remove(&mut self, key: Key) {
        if let Some(slot) = self.slots.get_mut(key.index).filter(|s| s.id == key.id) {
            slot.id = 0;
            slot.waker = None;
            self.free.push(key.index);
            self.len -= 1;
        }
    }

    /// Wakes and frees the slots whose `what` passes `due`.
    pub fn wake_where(&mut self, mut due: impl FnMut(&T) -> bool) {
        for (index, slot) in self.slots.iter_mut().enumerate() {
            if slot.id != 0 && due(&slot.what) {
                slot.id = 0;
                if let Some(waker) = slot.waker.take() {
                    waker.wake();
                }
                self.free.push(index);
                self.len -= 1;
            }
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Signals made so far: a signal's waiters on a thread are found by its number.
static SIGNALS: AtomicU64 = AtomicU64::new(1);

/// A one-way signal, raised once, that many futures wait on ([`Signal::raised`]): the
/// drain and the closing of the listener (every connection), the end of the shutdown
/// grace (every owner). A poll reads a flag and, once its waker is registered, does
/// nothing more. On a worker, a waiter registers in the thread's list for the signal,
/// and one task per worker and signal waits on the token for all of them; elsewhere
/// it waits on the token.
pub struct Signal {
    id: u64,
    raised: AtomicBool,
    token: CancellationToken,
}

impl Default for Signal {
    fn default() -> Self {
        Signal {
            id: SIGNALS.fetch_add(1, Ordering::Relaxed),
            raised: AtomicBool::new(false),
            token: CancellationToken::new(),
        }
    }
}

impl Signal {
    pub fn raise(&self) {
        // Set before the token is cancelled, so a wake-up by the token finds it set.
        self.raised.store(true, Ordering::Release);
        self.token.cancel();
    }

    /// Completes once the signal is raised.
    pub fn raised(&self) -> Raised<'_> {
        Raised {
            signal: self,
            listed: None,
            token: None,
            registered: None,
        }
    }
}

/// See [`Signal::raised`].
pub struct Raised<'a> {
    signal: &'a Signal,
    /// Its slot in this worker's list for the signal.
    listed: Option<Key>,
    /// Off a worker: the token's own wait.
    token: Option<Pin<Box<WaitForCancellationFuture<'a>>>>,
    /// The waker the list or the token will wake: while the task's waker is this one,
    /// a poll has nothing to do but read the flag.
    registered: Option<Waker>,
}

impl Future for Raised<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.signal.raised.load(Ordering::Acquire) {
            return Poll::Ready(());
        }
        if self.registered.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            return Poll::Pending;
        }
        self.register(cx)
    }
}

impl Raised<'_> {
    /// The first poll, or one with another waker.
    #[inline(never)]
    fn register(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        let signal = this.signal;
        if on_worker() {
            let (key, first) = SIGNAL_WAITERS.with_borrow_mut(|lists| {
                let (waiters, first) = match lists.iter().position(|(id, _)| *id == signal.id) {
                    Some(i) => (&mut lists[i].1, false),
                    None => {
                        lists.push((signal.id, Waiters::default()));
                        (&mut lists.last_mut().expect("just pushed").1, true)
                    }
                };
                let key = match this.listed {
                    Some(key) if waiters.refresh(key, cx.waker()) => key,
                    _ => waiters.insert((), cx.waker().clone()),
                };
                (key, first)
            });
            if first {
                tokio::spawn(watch(signal.token.clone(), signal.id));
            }
            this.listed = Some(key);
        } else {
            let wait = this.token.get_or_insert_with(|| Box::pin(signal.token.cancelled()));
            if wait.as_mut().poll(cx).is_ready() {
                return Poll::Ready(());
            }
        }
        this.registered = Some(cx.waker().clone());
        Poll::Pending
    }
}

impl Drop for Raised<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.listed {
            // `try_with`: a connection dropped while its thread exits finds no list.
            let _ = SIGNAL_WAITERS.try_with(|lists| {
                let Ok(mut lists) = lists.try_borrow_mut() else { return };
                if let Some((_, waiters)) = lists.iter_mut().find(|(id, _)| *id == self.signal.id) {
                    waiters.remove(key);
                }
            });
        }
    }
}

/// The task of a worker's list for a signal: waits on the token once for all of them.
async fn watch(token: CancellationToken, signal: u64) {
    token.cancelled().await;
    SIGNAL_WAITERS.with_borrow_mut(|lists| {
        if let Some((_, waiters)) = lists.iter_mut().find(|(id, _)| *id == signal) {
            waiters.wake_where(|()| true);
        }
    });
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;
    use std::task::Wake;

    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn count() -> (Arc<Count>, Waker) {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&count));
        (count, waker)
    }

    /// A runtime on this thread, as a worker's.
    pub(crate) fn worker() -> tokio::runtime::Runtime {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async { mark_worker() });
        runtime
    }

    fn waiting(signal: &Signal) -> usize {
        SIGNAL_WAITERS.with_borrow(|lists| {
            lists
                .iter()
                .find(|(id, _)| *id == signal.id)
                .map_or(0, |(_, waiters)| waiters.len())
        })
    }

    #[test]
    fn a_raised_signal_wakes_and_completes_its_waiters_once_polled_cheaply() {
        let (count, waker) = count();
        let mut cx = Context::from_waker(&waker);
        let signal = Signal::default();
        let mut raised = signal.raised();
        for _ in 0..3 {
            assert!(Pin::new(&mut raised).poll(&mut cx).is_pending());
        }
        assert!(raised.registered.is_some(), "registered after the first poll");
        assert_eq!(count.0.load(Ordering::Relaxed), 0);
        signal.raise();
        assert_eq!(count.0.load(Ordering::Relaxed), 1, "raising wakes the waiter");
        assert!(Pin::new(&mut raised).poll(&mut cx).is_ready());
        // Raised before anyone waits: ready at once.
        assert!(Pin::new(&mut signal.raised()).poll(&mut cx).is_ready());
    }

    #[test]
    fn every_waiter_of_a_worker_ends_when_the_signal_is_raised_from_another_thread() {
        let signal = Arc::new(Signal::default());
        worker().block_on(async {
            let waiters: Vec<_> = (0..3)
                .map(|_| {
                    let signal = Arc::clone(&signal);
                    tokio::spawn(async move { signal.raised().await })
                })
                .collect();
            // A waiter that gives up frees its slot.
            let gone = tokio::time::timeout(std::time::Duration::from_millis(1), signal.raised()).await;
            assert!(gone.is_err());
            while waiting(&signal) < 3 {
                tokio::task::yield_now().await;
            }
            assert_eq!(waiting(&signal), 3, "the one that gave up is not among them");
            let raiser = Arc::clone(&signal);
            std::thread::spawn(move || raiser.raise()).join().expect("raise");
            for waiter in waiters {
                tokio::time::timeout(std::time::Duration::from_secs(10), waiter)
                    .await
                    .expect("woken")
                    .expect("task");
            }
            assert_eq!(waiting(&signal), 0);
            // From now on it is ready at once.
            signal.raised().await;
        });
    }

    #[test]
    fn a_worker_that_first_looks_after_the_raise_finds_it_raised() {
        let signal = Signal::default();
        signal.raise();
        worker().block_on(signal.raised());
    }

    #[test]
    fn off_a_worker_the_token_itself_is_waited_on() {
        let signal = Arc::new(Signal::default());
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let wait = tokio::spawn({
                let signal = Arc::clone(&signal);
                async move { signal.raised().await }
            });
            signal.raise();
            tokio::time::timeout(std::time::Duration::from_secs(10), wait)
                .await
                .expect("woken")
                .expect("task");
        });
        assert_eq!(waiting(&signal), 0, "nothing listed off a worker");
    }

    #[test]
    fn slots_are_woken_once_freed_and_reused_by_new_waiters_only() {
        let (woken, waker) = count();
        let mut waiters = Waiters::default();
        let (a, b) = (waiters.insert(1, waker.clone()), waiters.insert(2, waker.clone()));
        waiters.wake_where(|what| *what == 1);
        assert_eq!((woken.0.load(Ordering::Relaxed), waiters.len()), (1, 1));
        assert!(!waiters.refresh(a, &waker), "a woken slot is gone");
        let c = waiters.insert(3, waker.clone());
        assert_ne!(a, c, "the slot is reused under a new id");
        waiters.remove(a); // the first waiter's drop: the slot is c's now
        assert!(waiters.refresh(c, &waker) && waiters.refresh(b, &waker));
        waiters.wake_where(|_| true);
        assert_eq!((woken.0.load(Ordering::Relaxed), waiters.len()), (3, 0));
        assert!(waiters.is_empty());
    }

    #[test]
    fn ids_of_two_tables_never_meet() {
        let waker = Waker::noop().clone();
        let (mut one, mut two) = (Waiters::default(), Waiters::default());
        let key = one.insert((), waker.clone());
        two.insert((), waker.clone());
        assert!(!two.refresh(key, &waker), "same index, another table: not this slot");
        two.remove(key);
        assert_eq!(two.len(), 1);
    }
}
