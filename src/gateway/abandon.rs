//! The shutdown's abandon signal as a request waits on it. Every owner waits on it
//! while it forwards, and its task is woken a few times per request. Waiting on the
//! shared token itself is a token clone, its lock, and an entry in its waiter list under
//! another lock, per request (~900 instructions). Here a poll reads the gateway's flag
//! and, once its waker is known, does nothing more; the first poll takes a slot in the
//! worker thread's list, and one task per worker waits on the token for all of them and
//! wakes them.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, Waker};

use tokio::runtime::{Handle, RuntimeFlavor};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use super::Gateway;
use crate::waiters::{Key, Waiters};

/// Completes once the gateway's owners are abandoned. See [`Gateway::abandoned`].
pub struct Abandoned<'a> {
    gw: &'a Gateway,
    state: State,
}

enum State {
    Start,
    /// In this thread's list, to be woken through this waker.
    Listed(Key, Waker),
    /// Off a worker (no current-thread runtime to run the list's task): the token.
    Token(Pin<Box<WaitForCancellationFutureOwned>>),
}

impl<'a> Abandoned<'a> {
    pub(super) fn new(gw: &'a Gateway) -> Self {
        Abandoned {
            gw,
            state: State::Start,
        }
    }
}

/// One gateway's waiters on this thread; `None` where the thread's runtime is not a
/// current-thread one.
struct List {
    gateway: u64,
    waiters: Option<Waiters<()>>,
}

thread_local! {
    static LISTS: RefCell<Vec<List>> = const { RefCell::new(Vec::new()) };
}

impl Future for Abandoned<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        // Set before the token is cancelled, so the wake-up that follows finds it set.
        if self.gw.abandoning.load(Ordering::Acquire) {
            return Poll::Ready(());
        }
        // Woken again for something else (several times per request): nothing to do.
        if let State::Listed(_, waker) = &self.state
            && waker.will_wake(cx.waker())
        {
            return Poll::Pending;
        }
        self.wait(cx)
    }
}

impl Abandoned<'_> {
    /// The first poll (or one with another waker): joins the thread's list.
    #[inline(never)]
    fn wait(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        let listed = match &mut this.state {
            State::Token(wait) => return wait.as_mut().poll(cx),
            State::Listed(key, _) => Some(*key),
            State::Start => None,
        };
        let (key, new_list) = LISTS.with_borrow_mut(|lists| {
            let (list, new) = list_for(lists, this.gw);
            let key = list.waiters.as_mut().map(|waiters| match listed {
                Some(key) if waiters.refresh(key, cx.waker()) => key,
                // Gone without the flag set: not this thread's list; join this one.
                _ => waiters.insert((), cx.waker().clone()),
            });
            (key, new)
        });
        if new_list {
            tokio::spawn(watch(this.gw.abandon.clone(), this.gw.id));
        }
        match key {
            Some(key) => this.state = State::Listed(key, cx.waker().clone()),
            None => {
                this.state = State::Token(Box::pin(this.gw.abandon.clone().cancelled_owned()));
                return self.wait(cx);
            }
        }
        Poll::Pending
    }
}

impl Drop for Abandoned<'_> {
    fn drop(&mut self) {
        if let State::Listed(key, _) = self.state {
            let _ = LISTS.try_with(|lists| {
                let Ok(mut lists) = lists.try_borrow_mut() else { return };
                if let Some(waiters) = lists
                    .iter_mut()
                    .find(|l| l.gateway == self.gw.id)
                    .and_then(|l| l.waiters.as_mut())
                {
                    waiters.remove(key);
                }
            });
        }
    }
}

/// This thread's list for `gw`, and whether it was made just now on a worker (its task
/// is then the caller's to start: a list with waiters needs one, and only one).
fn list_for<'l>(lists: &'l mut Vec<List>, gw: &Gateway) -> (&'l mut List, bool) {
    match lists.iter().position(|l| l.gateway == gw.id) {
        Some(i) => (&mut lists[i], false),
        None => {
            let worker = Handle::try_current().is_ok_and(|h| h.runtime_flavor() == RuntimeFlavor::CurrentThread);
            lists.push(List {
                gateway: gw.id,
                waiters: worker.then(Waiters::default),
            });
            (lists.last_mut().expect("just pushed"), worker)
        }
    }
}

/// The list's task: waits on the token once for every request of this thread.
async fn watch(token: CancellationToken, gateway: u64) {
    token.cancelled().await;
    LISTS.with_borrow_mut(|lists| {
        if let Some(waiters) = lists
            .iter_mut()
            .find(|l| l.gateway == gateway)
            .and_then(|l| l.waiters.as_mut())
        {
            waiters.wake_where(|()| true);
        }
    });
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::config::Config;
    use crate::store::{AnyStore, MemoryStore};

    fn gateway() -> Arc<Gateway> {
        let config = Config::parse(
            r#"
            [[routes]]
            name = "a"
            path = "/a"
            upstream = "http://127.0.0.1:1"
            key = ["body"]
            "#,
        )
        .expect("config");
        Gateway::new(&config, AnyStore::Memory(MemoryStore::new(10, 1 << 20)))
    }

    fn worker() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    }

    fn waiting(gw: &Gateway) -> usize {
        LISTS.with_borrow(|lists| {
            lists
                .iter()
                .find(|l| l.gateway == gw.id)
                .and_then(|l| l.waiters.as_ref())
                .map_or(0, Waiters::len)
        })
    }

    #[test]
    fn every_waiter_of_a_worker_ends_when_the_token_is_cancelled_from_another_thread() {
        let gw = gateway();
        worker().block_on(async {
            let waiters: Vec<_> = (0..3)
                .map(|_| {
                    let gw = Arc::clone(&gw);
                    tokio::spawn(async move { gw.abandoned().await })
                })
                .collect();
            // A waiter that gives up frees its slot.
            let gone = tokio::time::timeout(Duration::from_millis(1), gw.abandoned()).await;
            assert!(gone.is_err());
            while waiting(&gw) < 3 {
                tokio::task::yield_now().await;
            }
            assert_eq!(waiting(&gw), 3, "the one that gave up is not among them");
            let token = Arc::clone(&gw);
            std::thread::spawn(move || token.abandon_owners())
                .join()
                .expect("cancel");
            for waiter in waiters {
                tokio::time::timeout(Duration::from_secs(10), waiter)
                    .await
                    .expect("woken")
                    .expect("task");
            }
            assert_eq!(waiting(&gw), 0);
            // From now on it is ready at once.
            gw.abandoned().await;
        });
    }

    #[test]
    fn a_thread_that_first_looks_after_the_cancel_finds_it_ready() {
        let gw = gateway();
        gw.abandon_owners();
        worker().block_on(gw.abandoned());
    }

    #[test]
    fn off_a_worker_the_token_itself_is_waited_on() {
        let gw = gateway();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let wait = tokio::spawn({
                let gw = Arc::clone(&gw);
                async move { gw.abandoned().await }
            });
            gw.abandon_owners();
            tokio::time::timeout(Duration::from_secs(10), wait)
                .await
                .expect("woken")
                .expect("task");
        });
    }
}
