//! Wakers waiting on one thread, each in a numbered slot: a future takes one on its
//! first poll and frees it when dropped, and whatever it waits for wakes (and frees)
//! the slots it concerns. With thread-local tables, this is what waiting costs on a
//! worker instead of a lock and a linked list per wait: the coarse timer
//! ([`crate::timer`]) and the shutdown's abandon signal ([`crate::gateway`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Waker;

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

#[cfg(test)]
mod tests {
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

    #[test]
    fn slots_are_woken_once_freed_and_reused_by_new_waiters_only() {
        let woken = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&woken));
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
