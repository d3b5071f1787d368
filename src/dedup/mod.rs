//! The dedup state machine: claim -> forward -> complete | release, and what a request
//! that finds the key already claimed gets. See `STATE_MACHINE.md` beside this file.
//!
//! Every path ends in one of: forwarded once, answered as duplicate, or told to retry.
//!
//! ## Future sizes
//!
//! A request's futures are written and copied each time one is awaited or boxed, so
//! the request path keeps them small (`-Zprint-type-sizes` on nightly shows them):
//! - an `async fn` holds its arguments twice (as arguments, and as the locals they are
//!   moved into), so the functions that take the request by value return an
//!   `async move` block, which holds them once;
//! - a layer that only maps its inner future's output is `FutureExt::map`, not an
//!   `async fn`, which would hold its arguments beside the inner future holding them
//!   again;
//! - rare branches with large futures (connecting, reading a body for `replay`) are
//!   boxed.

mod enqueue;
mod owner;

pub use enqueue::append_unkeyed;

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use crate::answer::{Answer, answer, duplicate, duplicate_response, forward_unowned};
use crate::body::Body;
use crate::config::policy::{InFlight, Mode, OnStoreError};
use crate::error::GatewayError;
use crate::gateway::Gateway;
use crate::key::StoredKey;
use crate::metrics::{OrphanRelease, StoreOp};
use crate::outcome::Outcome;
use crate::routing::Route;
use crate::store::{Claim, Marker, Store, StoreError, Token, unix_ms};
use crate::upstream::Peer;

/// A request whose body has been read and whose key has been derived.
pub struct Request {
    pub head: http::request::Parts,
    pub body: Bytes,
    pub peer: Peer,
}

/// How a keyed request goes on from [`process`].
pub enum Start<F> {
    /// Answered at once: a duplicate of a completed message, found by a store that
    /// answers without waiting. Nothing was kept, not even the key.
    Answered(Answer),
    /// The state machine's work, to be awaited, and the key it keeps.
    Running(Arc<str>, F),
}

/// Runs one keyed request through the state machine.
///
/// Everything from the claim on is a future that nobody can cancel (a sender
/// that hangs up, or resets its h2 stream, even while the claim is on its way to the
/// store, must never leave a marker nobody owns nor cancel the upstream call). It runs
/// in the request's own task while the sender waits, which costs no spawn and no
/// wake-up of another task; if the handler is dropped first (even before it polls it
/// once), [`Detached`] hands the unfinished work to a task of its own, where it carries
/// on from where it was.
///
/// A backend that claims without waiting (the memory store) is asked here, before
/// anything is boxed or kept: nothing can cancel a call that does not yield, and a
/// duplicate of a completed message is answered on the spot.
pub fn process(
    gw: &Arc<Gateway>,
    route: &Arc<Route>,
    key: &StoredKey,
    req: Request,
) -> Start<impl Future<Output = Result<Answer, GatewayError>> + Send + 'static> {
    let (token, first_seen_ms) = (Token::generate(), unix_ms());
    let policy = &route.config.policy;
    let first = claim_now(gw, key.as_str(), token, first_seen_ms, policy.processing_ttl);
    if let Some(Ok(Claim::Found(marker @ Marker::Completed { response, .. }))) = &first
        && policy.mode == Mode::Enforce
    {
        count_age(route, marker, first_seen_ms);
        return Start::Answered(duplicate(route, response.as_deref()));
    }
    let key = key.shared();
    let task = Task {
        gw: Arc::clone(gw),
        route: Arc::clone(route),
        key: Arc::clone(&key),
        token,
        first_seen_ms,
    };
    Start::Running(key, Detached::new(&gw.tasks, task.run(req, first)))
}

/// A future that outlives its caller: polled in place, and moved to a task of its own
/// (tracked, so the drain waits for it) if it is dropped before it is done.
struct Detached<F: Future<Output = Result<Answer, GatewayError>> + Send + 'static> {
    work: Option<Pin<Box<F>>>,
    tasks: TaskTracker,
}

impl<F: Future<Output = Result<Answer, GatewayError>> + Send + 'static> Detached<F> {
    fn new(tasks: &TaskTracker, work: F) -> Self {
        Detached {
            work: Some(Box::pin(work)),
            tasks: tasks.clone(),
        }
    }
}

impl<F: Future<Output = Result<Answer, GatewayError>> + Send + 'static> Future for Detached<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let Some(work) = self.work.as_mut() else {
            return Poll::Ready(Err(GatewayError::Internal("polled after completion".into())));
        };
        let done = ready!(work.as_mut().poll(cx));
        self.work = None;
        Poll::Ready(done)
    }
}

impl<F: Future<Output = Result<Answer, GatewayError>> + Send + 'static> Drop for Detached<F> {
    fn drop(&mut self) {
        if let Some(work) = self.work.take() {
            // The sender is gone; the work is not. (Outside a runtime, the process is
            // exiting and the marker expires after processing_ttl.)
            if tokio::runtime::Handle::try_current().is_ok() {
                self.tasks.spawn(async move {
                    let _ = work.await;
                });
            }
        }
    }
}

/// One keyed request from its claim to its answer.
pub(crate) struct Task {
    pub(crate) gw: Arc<Gateway>,
    pub(crate) route: Arc<Route>,
    pub(crate) key: Arc<str>,
    pub(crate) token: Token,
    pub(crate) first_seen_ms: u64,
}

impl Task {
    /// Runs from the first claim on, or from its reply if `process` already has it.
    /// Not an `async fn`: see *Future sizes* in the module doc.
    #[allow(clippy::manual_async_fn, reason = "an async fn holds its arguments twice")]
    fn run(
        self,
        req: Request,
        mut first: Option<Result<Claim, ClaimFailed>>,
    ) -> impl Future<Output = Result<Answer, GatewayError>> + Send + 'static {
        async move {
            let (gw, route) = (&self.gw, &self.route);
            let policy = &route.config.policy;
            if policy.delivery.queue().is_some() {
                // Boxed: the queue's future would make every sync request's larger.
                return Box::pin(enqueue::run(&self, req)).await;
            }
            let mut held = Held::default();
            loop {
                let claimed = match first.take() {
                    Some(claimed) => claimed,
                    None => claim(gw, &self.key, self.token, self.first_seen_ms, policy.processing_ttl).await,
                };
                let marker = match claimed {
                    Ok(Claim::Claimed) => return owner::forward(&self, req).await,
                    Ok(Claim::Found(marker)) => marker,
                    Err(ClaimFailed { error, may_have_landed }) => {
                        if may_have_landed {
                            release_orphan(
                                gw,
                                Arc::clone(&self.key),
                                self.token,
                                self.first_seen_ms,
                                policy.processing_ttl,
                            );
                        }
                        if held.waits > 0 {
                            return Err(self.failed_while_held(&error));
                        }
                        return store_failed(gw, route, &self.key, error, req).await;
                    }
                };
                if held.waits == 0 {
                    count_age(route, &marker, self.first_seen_ms);
                }
                if policy.mode == Mode::Shadow {
                    let outcome = match marker {
                        Marker::Completed { .. } | Marker::Queued { .. } => Outcome::ShadowDuplicate,
                        Marker::Processing { .. } => Outcome::ShadowInFlight,
                    };
                    return forward_unowned(route, req.head, Body::full(req.body), req.peer, outcome).await;
                }
                if let Some(end) = self.found(marker, &mut held).await {
                    return end;
                }
            }
        }
    }

    /// What a request that found `marker` gets: the duplicate answer for a message
    /// completed or queued; for one PROCESSING, per `on_in_flight`. `None`: the wait
    /// is over, claim again.
    async fn found(&self, marker: Marker, held: &mut Held) -> Option<Result<Answer, GatewayError>> {
        let (gw, route) = (&self.gw, &self.route);
        let policy = &route.config.policy;
        let holder = match marker {
            Marker::Completed { response, .. } => return Some(Ok(duplicate(route, response.as_deref()))),
            // Stored: acknowledging it loses nothing.
            Marker::Queued { .. } => return Some(Ok(duplicate(route, None))),
            Marker::Processing { token, .. } => token,
        };
        match policy.on_in_flight {
            InFlight::Conflict => Some(Err(GatewayError::InFlight)),
            InFlight::Ack => Some(Ok(answer(Outcome::InFlight, duplicate_response(route)))),
            InFlight::Wait => {
                let now = Instant::now();
                // The hold starts when PROCESSING is first seen (an owner, the usual
                // case, never reads the clock for it).
                let deadline = *held.deadline.get_or_insert(now + policy.in_flight_wait);
                if now >= deadline {
                    return Some(Err(GatewayError::InFlight));
                }
                tokio::select! {
                    () = gw.store.wait(&self.key, holder, held.waits, deadline - now) => {}
                    () = gw.abandoned() => return Some(Err(GatewayError::Abandoned)),
                }
                held.waits += 1;
                None
            }
        }
    }

    /// A store call failed after the request had seen its key PROCESSING: forwarding
    /// (or queueing) it now, whatever `on_error` says, could be a second concurrent
    /// delivery. 409.
    fn failed_while_held(&self, error: &StoreError) -> GatewayError {
        tracing::warn!(route = %self.route.config.name, key = %self.key, %error,
            "store failed while waiting on PROCESSING: answering 409");
        GatewayError::InFlight
    }
}

/// A request's hold on a PROCESSING marker (`on_in_flight = "wait"`): until when, and
/// how many waits so far.
#[derive(Default)]
struct Held {
    deadline: Option<Instant>,
    waits: u32,
}

/// Claims `key`, once more when the first reply is lost: the claim may have landed,
/// and the retry (same token) then shows the marker as ours, so an ambiguous reply
/// never turns into a "duplicate" for a message nobody forwarded.
async fn claim(gw: &Gateway, key: &str, token: Token, first_seen_ms: u64, ttl: Duration) -> Result<Claim, ClaimFailed> {
    let call = || timed(gw, StoreOp::Claim, || gw.store.claim(key, token, first_seen_ms, ttl));
    let (result, may_have_landed) = match call().await {
        // The repeat may fail differently (say, connection refused once Redis is gone)
        // and still the first attempt may have landed.
        Err(e) if e.is_ambiguous() => (call().await, true),
        other => (other, false),
    };
    settle(result, token, may_have_landed)
}

/// [`claim`] on a backend that answers without waiting
/// ([`crate::store::AnyStore::claim_now`]), else `None`. Its errors are never
/// ambiguous, so there is nothing to repeat.
fn claim_now(
    gw: &Gateway,
    key: &str,
    token: Token,
    first_seen_ms: u64,
    ttl: Duration,
) -> Option<Result<Claim, ClaimFailed>> {
    let started = Instant::now();
    let result = gw.store.claim_now(key, token, first_seen_ms, ttl)?;
    gw.metrics
        .store_call(StoreOp::Claim, started.elapsed(), result.is_err());
    Some(settle(result, token, false))
}

/// A claim's reply as the state machine reads it: our own marker (found by the repeat
/// of a claim that landed) is ours, and a failure says whether the claim may have
/// landed all the same.
fn settle(result: Result<Claim, StoreError>, token: Token, may_have_landed: bool) -> Result<Claim, ClaimFailed> {
    match result {
        Ok(Claim::Found(Marker::Processing { token: holder, .. })) if holder == token => Ok(Claim::Claimed),
        Ok(claim) => Ok(claim),
        Err(error) => Err(ClaimFailed {
            may_have_landed: may_have_landed || error.is_ambiguous(),
            error,
        }),
    }
}

/// Counts how long after its first delivery a message came again: `arrived_ms` is this
/// delivery's arrival (the clock read for its own claim, so none is read here).
fn count_age(route: &Route, marker: &Marker, arrived_ms: u64) {
    let age = arrived_ms.saturating_sub(marker.first_seen_ms());
    route.metrics.duplicate_age(Duration::from_millis(age));
}

/// A claim that failed, and whether it (or its repeat) may have landed all the same.
struct ClaimFailed {
    error: StoreError,
    may_have_landed: bool,
}

/// Makes one store call, measuring and counting it. The clock starts before the call
/// is made: the memory store does its work there, not when the future is polled.
///
/// `store.timeout` is applied by the backend itself, not here: Redis must hold the
/// deadline to discard a connection whose reply is late, and the memory store never
/// waits on anything. An outer timer per call would cost a timer registration and a
/// larger future on the hot path for nothing.
async fn timed<T, F: Future<Output = Result<T, StoreError>>>(
    gw: &Gateway,
    op: StoreOp,
    call: impl FnOnce() -> F,
) -> Result<T, StoreError> {
    let started = Instant::now();
    let result = call().await;
    gw.metrics.store_call(op, started.elapsed(), result.is_err());
    result
}

/// A claim whose replies were lost may have landed, leaving PROCESSING(token) that no
/// request owns: the sender's retry would wait it out for `processing_ttl`. Release it
/// (compare-and-delete on our own token, always safe: this request forwarded nothing as
/// owner) as soon as the store answers again. Untracked: shutdown does not wait for it,
/// and if the process exits first the marker simply expires.
///
/// At most [`MAX_ORPHAN_RELEASES`] run at once: in a long store outage the rest simply
/// expire, rather than a crowd of retries competing with real traffic on recovery.
fn release_orphan(gw: &Arc<Gateway>, key: Arc<str>, token: Token, first_seen_ms: u64, ttl: Duration) {
    if gw.orphan_releases.fetch_add(1, Ordering::Relaxed) >= MAX_ORPHAN_RELEASES {
        gw.orphan_releases.fetch_sub(1, Ordering::Relaxed);
        gw.metrics.orphan_release(OrphanRelease::Skipped);
        return;
    }
    let gw = Arc::clone(gw);
    tokio::spawn(async move {
        let deadline = Instant::now() + ttl;
        let mut pause = Duration::from_millis(100);
        let mut how = OrphanRelease::GaveUp;
        while Instant::now() < deadline {
            if let Ok(released) = timed(&gw, StoreOp::Release, || gw.store.release(&key, token, first_seen_ms)).await {
                how = if released {
                    OrphanRelease::Released
                } else {
                    OrphanRelease::NotFound
                };
                break;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(2));
        }
        gw.metrics.orphan_release(how);
        gw.orphan_releases.fetch_sub(1, Ordering::Relaxed);
    });
}

/// See [`release_orphan`].
const MAX_ORPHAN_RELEASES: usize = 256;

async fn store_failed(
    gw: &Arc<Gateway>,
    route: &Arc<Route>,
    key: &str,
    error: StoreError,
    req: Request,
) -> Result<Answer, GatewayError> {
    let route_name = &route.config.name;
    // Shadow mode forwards every request, whatever enforce mode would answer.
    if gw.on_store_error == OnStoreError::Reject && route.config.policy.mode == Mode::Enforce {
        tracing::warn!(route = %route_name, key, %error, "store unavailable: answering 503");
        Err(GatewayError::StoreUnavailable(error))
    } else {
        tracing::warn!(route = %route_name, key, %error, "store unavailable: forwarding without dedup");
        let (head, body) = (req.head, Body::full(req.body));
        forward_unowned(route, head, body, req.peer, Outcome::StoreUnavailable).await
    }
}
