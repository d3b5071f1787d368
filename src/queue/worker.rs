//! One delivery worker: takes up to [`BATCH`] of the route's due messages in one store
//! call, delivers them at once, each with `X-Dedup-Attempt` and `X-Dedup-Queued-At`
//! within `upstream_timeout`, and records how they ended in one more. Idle, it waits
//! for an append in this process, the next retry's time, or a poll (appends on other
//! replicas).

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, HeaderValue, Request};
use tokio::time::Instant;

use super::verdict;
use crate::body::{self, Body};
use crate::gateway::Gateway;
use crate::metrics::{Delivery, UpstreamClass};
use crate::routing::Route;
use crate::store::queue::{Lease, Leased, Message, Settled, parse_header_block, rfc3339};
use crate::store::{QueueStore, unix_ms};
use crate::upstream::{self, UpstreamError};

static ATTEMPT: HeaderName = HeaderName::from_static("x-dedup-attempt");
static QUEUED_AT: HeaderName = HeaderName::from_static("x-dedup-queued-at");

/// How long an idle worker waits before it looks again by itself.
const POLL: Duration = Duration::from_secs(1);

/// How much later than `upstream_timeout` another replica takes over a delivery left
/// unsettled (its replica died).
const RECLAIM_MARGIN: Duration = Duration::from_secs(5);

/// Of a delivery's answer, what is read before it is discarded (so its connection can
/// be used again).
const READ_ANSWER: usize = 64 * 1024;

/// Deliveries a worker runs at once: what one store call takes and one records. A
/// route's `delivery_concurrency` is shared out among workers of up to this many.
pub(super) const BATCH: usize = 4;

/// How many of the route's deliveries worker `index` runs at once (0: none, it stops).
pub(super) fn slots(concurrency: usize, index: usize) -> usize {
    concurrency.saturating_sub(index * BATCH).min(BATCH)
}

/// Runs worker `index` of route `name` until shutdown, or until the route no longer
/// wants it.
pub(super) async fn run(gw: &Arc<Gateway>, name: &str, index: usize) {
    let waker = gw.deliveries.waker(name);
    let mut failing = false;
    while !gw.is_stopping() {
        let Some((route, slots)) = current(gw, name, index) else {
            return;
        };
        let reclaim = route.config.policy.upstream_timeout + RECLAIM_MARGIN;
        let idle_until = match gw.store.lease(name, unix_ms(), reclaim, slots).await {
            Ok(Lease::Leased(taken)) => {
                failing = false;
                let ended = futures_util::future::join_all(taken.iter().map(|leased| deliver(gw, &route, leased)));
                let ended: Vec<(&Leased, Settled)> = taken.iter().zip(ended.await).collect();
                record(gw, &route, &ended).await;
                continue;
            }
            Ok(Lease::Idle { next_due_ms }) => {
                failing = false;
                let next = next_due_ms.map(|due| Duration::from_millis(due.saturating_sub(unix_ms())));
                next.map_or(POLL, |next| next.min(POLL))
            }
            Err(error) => {
                if !failing {
                    tracing::warn!(route = %name, %error, "cannot take messages from the queue; trying again");
                }
                failing = true;
                POLL
            }
        };
        tokio::select! {
            () = gw.stopping() => return,
            () = waker.notified() => {}
            () = tokio::time::sleep(idle_until) => {}
        }
    }
}

/// The route as the current config has it, and how many deliveries worker `index`
/// runs at once, while it wants the worker.
fn current(gw: &Gateway, name: &str, index: usize) -> Option<(Arc<Route>, usize)> {
    let routes = gw.routes.load();
    let route = routes.named(name)?;
    let slots = slots(route.config.policy.delivery.queue()?.concurrency, index);
    (slots > 0).then(|| (Arc::clone(route), slots))
}

/// One attempt of a leased message: how it ended, to be recorded.
async fn deliver(gw: &Gateway, route: &Route, leased: &Leased) -> Settled {
    let (config, m) = (&route.config, &leased.message);
    let Some(queue) = config.policy.delivery.queue() else {
        return Settled::Returned;
    };
    let request = match request(m) {
        Ok(request) => request,
        Err(error) => {
            // Cannot happen for what an append stored; kept, not dropped, for an operator.
            tracing::warn!(route = %config.name, id = %m.id, %error, "queued message cannot be sent: dead letter");
            return Settled::Dead { error };
        }
    };
    let started = Instant::now();
    let sent = tokio::select! {
        biased;
        // The shutdown grace is over: the message stays queued.
        () = gw.abandoned() => {
            tracing::warn!(route = %config.name, id = %m.id, "shutdown grace over: delivery left for later");
            return Settled::Returned;
        }
        sent = upstream::call(&config.upstream.authority, request, started, config.policy.upstream_timeout) => sent,
    };
    let attempt = match &sent {
        Ok(response) => verdict::judge(Ok((response.status(), response.headers()))),
        Err(error) => verdict::judge(Err(error)),
    };
    route.metrics.upstream(class(&sent), started.elapsed());
    if let Ok(response) = sent {
        let status = response.status();
        // Read to its end (bounded), so the connection is used again; then discarded.
        let read = body::read_up_to(response.into_body(), READ_ANSWER);
        let _ = tokio::time::timeout_at(started + config.policy.upstream_timeout, read).await;
        tracing::debug!(route = %config.name, id = %m.id, status = status.as_u16(), attempt = m.attempts, "delivery answered");
    }
    let now = unix_ms();
    let settled = verdict::settle(attempt, m.attempts, queue, now, config.policy.completed_ttl, jitter());
    count(route, m, &settled, now);
    settled
}

/// Counts and logs how an attempt ended.
fn count(route: &Route, m: &Message, settled: &Settled, now: u64) {
    let name = &route.config.name;
    match settled {
        Settled::Delivered { .. } => {
            route.metrics.delivery(Delivery::Delivered);
            route
                .metrics
                .delivery_lag(Duration::from_millis(now.saturating_sub(m.queued_at_ms)));
        }
        Settled::Retry { due_ms, error } => {
            route.metrics.delivery(Delivery::Retry);
            tracing::info!(route = %name, id = %m.id, attempt = m.attempts, %error,
                retry_in_ms = due_ms.saturating_sub(now), "delivery failed; will retry");
        }
        Settled::Dead { error } => {
            route.metrics.delivery(Delivery::Dead);
            tracing::warn!(route = %name, id = %m.id, attempt = m.attempts, %error, "delivery failed: dead letter");
        }
        Settled::Returned => {}
    }
}

/// The request a message is delivered as: as it was forwarded, with the attempt's
/// number and when it was queued.
fn request(m: &Message) -> Result<Request<Body>, String> {
    let mut request = Request::builder()
        .method(m.method.as_str())
        .uri(m.target.as_str())
        .body(Body::full(m.body.clone()))
        .map_err(|e| format!("stored request: {e}"))?;
    let headers = request.headers_mut();
    *headers = parse_header_block(&m.headers);
    headers.insert(&ATTEMPT, HeaderValue::from(m.attempts));
    if let Ok(at) = HeaderValue::from_str(&rfc3339(m.queued_at_ms)) {
        headers.insert(&QUEUED_AT, at);
    }
    Ok(request)
}

fn class(sent: &Result<http::Response<Body>, UpstreamError>) -> UpstreamClass {
    match sent {
        Ok(response) => UpstreamClass::of_status(response.status()),
        Err(UpstreamError::Timeout(_)) => UpstreamClass::Timeout,
        Err(_) => UpstreamClass::Error,
    }
}

/// Records how deliveries ended, trying again while the store fails: the deliveries
/// happened, and only the record tells the queue so. At the end of the shutdown
/// grace it gives up; the messages are then delivered again after a restart (SQLite)
/// or by another replica (Redis): the crash window the README describes.
async fn record(gw: &Gateway, route: &Route, ended: &[(&Leased, Settled)]) {
    let name = &route.config.name;
    let mut pause = Duration::from_millis(100);
    loop {
        let error = match gw.store.settle_all(name, ended).await {
            Ok(()) => return,
            Err(error) => error,
        };
        tracing::warn!(route = %name, deliveries = ended.len(), %error, "cannot record how deliveries ended; trying again");
        tokio::select! {
            () = gw.abandoned() => return,
            () = tokio::time::sleep(pause) => {}
        }
        // Well under the reclaim margin: a record late by more than `upstream_timeout`
        // + 5 s lets another replica deliver the message again.
        pause = (pause * 2).min(Duration::from_secs(1));
    }
}

/// A random number for the retry's jitter.
fn jitter() -> u64 {
    getrandom::u64().unwrap_or_else(|_| unix_ms())
}
