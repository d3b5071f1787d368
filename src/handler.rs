//! The request path. The outer function routes, counts, stamps `x-dedup-status` and
//! logs the one line per request; the inner one reads the body, checks the sender's
//! signature (decrypting where the sender encrypts), derives the key and hands over to
//! the state machine, using `?` for every way it can end early.

use std::convert::Infallible;
use std::sync::Arc;

use http::{Method, Request, Response};
use hyper::body::Incoming;
use tokio::time::Instant;

use crate::answer::{self, Answer};
use crate::body::{self, Body, ReadError};
use crate::config::policy::{Mode, OnMissingKey};
use crate::dedup;
use crate::error::{GatewayError, not_found};
use crate::gateway::Gateway;
use crate::key::{Input, StoredKey};
use crate::outcome::{Outcome, STATUS_HEADER};
use crate::routing::Route;
use crate::senders::Verdict;
use crate::store::unix_ms;
use crate::upstream::Peer;

/// Serves one request on the proxy listener. `busy` is held until the request is
/// answered (or dropped): the connection's watchdog counts it by it. Taken here rather
/// than by a wrapping future, which would move this one's state once more per request.
/// Not an `async fn`: see *Future sizes* in [`crate::dedup`].
#[allow(clippy::manual_async_fn, reason = "an async fn holds its arguments twice")]
pub fn handle<B: Send + 'static>(
    gw: Arc<Gateway>,
    peer: Peer,
    req: Request<Incoming>,
    busy: Option<B>,
) -> impl Future<Output = Result<Response<Body>, Infallible>> + Send {
    async move {
        let _busy = busy;
        let Some(route) = gw.routes.load().find(req.uri().path()).cloned() else {
            return Ok(not_found());
        };
        // Only the debug line uses it.
        let started = tracing::enabled!(tracing::Level::DEBUG).then(Instant::now);
        let method = req.method().clone();
        let (key, result) = if is_deduped(&method) {
            keyed(&gw, &route, peer, req).await
        } else {
            let (head, body) = req.into_parts();
            match route.config.sender.as_ref().map(|s| s.inspect_passthrough(&head)) {
                Some(Err(failure)) => (None, Err(failure.into())),
                _ => {
                    let _in_flight = route.metrics.in_flight();
                    let bypass = answer::forward_unowned(&route, head, Body::Incoming(body), peer, Outcome::Bypass);
                    (None, bypass.await)
                }
            }
        };
        let key = key.as_deref().unwrap_or("-");
        let (outcome, mut response) = match result {
            Ok(Answer { outcome, response }) => (outcome, response),
            Err(error) => {
                // Store failures were logged where they were handled; log the rest once here.
                if matches!(error, GatewayError::Upstream { .. } | GatewayError::Internal(_)) {
                    tracing::warn!(route = %route.config.name, key, %error, "request failed");
                } else if let GatewayError::Rejected(why) = &error {
                    tracing::info!(route = %route.config.name, reason = %why, "signature check failed");
                }
                (error.outcome(), error.to_response())
            }
        };
        route.metrics.request(outcome);
        response.headers_mut().insert(&STATUS_HEADER, outcome.header());
        tracing::debug!(
            route = %route.config.name,
            key,
            %method,
            outcome = outcome.label(),
            status = response.status().as_u16(),
            latency_ms = started.map_or(0.0, |s| s.elapsed().as_secs_f64() * 1e3),
            "request"
        );
        Ok(response)
    }
}

/// Only these carry webhook deliveries; everything else (WeChat's GET verification,
/// health checks) passes straight through.
fn is_deduped(method: &Method) -> bool {
    matches!(*method, Method::POST | Method::PUT | Method::PATCH)
}

/// A request that is deduped: the stored key it had (if any) and how it ended.
async fn keyed(
    gw: &Arc<Gateway>,
    route: &Arc<Route>,
    peer: Peer,
    req: Request<Incoming>,
) -> (Option<Arc<str>>, Result<Answer, GatewayError>) {
    let (head, body) = req.into_parts();
    // A body that came with its head is read at once, without a clock reading.
    let read = tokio::time::timeout(gw.body_timeout, body::read_limited(body, gw.max_body));
    let body = match read.await {
        Ok(Ok(body)) => body,
        Ok(Err(ReadError::TooLarge { limit })) => return (None, Err(GatewayError::TooLarge { limit })),
        Ok(Err(ReadError::Broken(e))) => return (None, Err(GatewayError::BadBody(e))),
        Err(_) => return (None, Err(GatewayError::SlowBody(gw.body_timeout))),
    };
    // In flight from here: what the drain waits for at the end of the shutdown grace
    // (a body still arriving then holds no claim; its connection is simply closed).
    let _in_flight = route.metrics.in_flight();
    let config = &route.config;
    // The sender's check comes before any store call; keys read the plaintext.
    let verdict = match config.sender.as_ref().map(|s| s.inspect(&head, &body, unix_ms())) {
        None => Verdict::Plain,
        Some(Ok(verdict)) => verdict,
        Some(Err(failure)) => return (None, Err(failure.into())),
    };
    let handshake = verdict == Verdict::Handshake;
    let derived = if handshake {
        Ok(None)
    } else {
        let input = Input {
            head: &head,
            body: verdict.key_body(&body),
        };
        config
            .key
            .derive(input)
            .map(|v| v.map(|v| StoredKey::new(&gw.key_prefix, &config.name, &v)))
    };
    drop(verdict); // the plaintext is not needed past here
    let key = match derived {
        Ok(key) => key,
        Err(_refused) => return (None, Err(GatewayError::ForbiddenXml)),
    };
    let Some(key) = key else {
        let policy = match config.policy.mode {
            Mode::Shadow => OnMissingKey::Forward,   // shadow mode forwards every request
            _ if handshake => OnMissingKey::Forward, // the sender's handshake must reach the bot
            Mode::Enforce => config.policy.on_missing_key,
        };
        let result = match policy {
            // Queued like any message, without a marker (a handshake is answered by the bot).
            OnMissingKey::Forward if config.policy.delivery.queue().is_some() && !handshake => {
                dedup::append_unkeyed(gw, route, dedup::Request { head, body, peer }).await
            }
            OnMissingKey::Forward => answer::forward_unowned(route, head, Body::full(body), peer, Outcome::NoKey).await,
            OnMissingKey::Reject => Err(GatewayError::MissingKey),
            OnMissingKey::Ack => Ok(Answer {
                outcome: Outcome::NoKey,
                response: answer::duplicate_response(route),
            }),
        };
        return (None, result);
    };
    let req = dedup::Request { head, body, peer };
    match dedup::process(gw, route, &key, req) {
        // Only the debug line would show this key: made shared just for it.
        dedup::Start::Answered(answer) => (
            tracing::enabled!(tracing::Level::DEBUG).then(|| key.shared()),
            Ok(answer),
        ),
        dedup::Start::Running(shared, work) => {
            drop(key); // back to the thread's buffer, not held while the work waits
            (Some(shared), work.await)
        }
    }
}
