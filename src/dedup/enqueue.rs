//! A queued route's request: claim the key and store the request in the route's queue
//! (the marker QUEUED), in one store call where the backend can, then answer the
//! sender with the route's ack. Nothing is acknowledged that is not stored: a store
//! that fails or a full queue is a 503, and the sender retries.

use std::sync::Arc;

use tokio::time::Instant;

use super::{Held, Request, Task, count_age};
use crate::answer::{Answer, answer, duplicate_response};
use crate::body::Body;
use crate::error::GatewayError;
use crate::gateway::Gateway;
use crate::outcome::Outcome;
use crate::routing::Route;
use crate::store::queue::{Enqueued, Message, header_block};
use crate::store::{QueueStore, StoreError, Token, unix_ms};
use crate::upstream::rewrite;

/// Runs a keyed request on a queued route to its answer.
pub(super) async fn run(task: &Task, req: Request) -> Result<Answer, GatewayError> {
    let (gw, route, key) = (&task.gw, &task.route, &task.key);
    let id = key
        .get(gw.key_prefix.len() + route.config.name.len() + 1..)
        .unwrap_or(key);
    let message = message(
        route,
        id.to_owned(),
        Some(key.to_string()),
        task.token,
        task.first_seen_ms,
        req,
    );
    let mut held = Held::default();
    loop {
        let marker = match enqueue(gw, route, &message).await {
            Ok(Enqueued::Queued) => return Ok(queued(gw, route, Outcome::Queued)),
            Ok(Enqueued::Full) => return Err(full(route, &message)),
            Ok(Enqueued::Found(marker)) => marker,
            Err(error) if held.waits > 0 => return Err(task.failed_while_held(&error)),
            Err(error) => return Err(failed(route, &message, error)),
        };
        if held.waits == 0 {
            count_age(route, &marker, task.first_seen_ms);
        }
        if let Some(end) = task.found(marker, &mut held).await {
            return end;
        }
    }
}

/// Queues a request without a key (`on_missing_key = "forward"` on a queued route):
/// no marker, so a retry of it is queued again.
pub async fn append_unkeyed(gw: &Arc<Gateway>, route: &Arc<Route>, req: Request) -> Result<Answer, GatewayError> {
    let token = Token::generate();
    let message = message(route, format!("nokey-{token}"), None, token, unix_ms(), req);
    match enqueue(gw, route, &message).await {
        Ok(Enqueued::Queued | Enqueued::Found(_)) => Ok(queued(gw, route, Outcome::NoKey)),
        Ok(Enqueued::Full) => Err(full(route, &message)),
        Err(error) => Err(failed(route, &message, error)),
    }
}

/// The message a request becomes: rewritten for the upstream now (so a delivery
/// carries the same `X-Forwarded-*` as a sync forward), its body as received.
fn message(route: &Route, id: String, key: Option<String>, token: Token, first_seen_ms: u64, req: Request) -> Message {
    let config = &route.config;
    let (head, _) = rewrite::upstream_request(req.head, Body::empty(), &config.upstream, req.peer).into_parts();
    Message {
        id,
        key,
        token,
        first_seen_ms,
        queued_at_ms: unix_ms(),
        attempts: 0,
        method: head.method.as_str().to_owned(),
        target: head.uri.path_and_query().map_or("/", |p| p.as_str()).to_owned(),
        headers: header_block(&head.headers),
        body: req.body,
        last_error: None,
    }
}

/// One enqueue, timed and counted (for the metrics and for readiness).
async fn enqueue(gw: &Gateway, route: &Route, message: &Message) -> Result<Enqueued, StoreError> {
    let policy = &route.config.policy;
    let max_queued = policy.delivery.queue().map_or(0, |q| q.max_queued);
    let started = Instant::now();
    let enqueued = gw
        .store
        .enqueue(&route.config.name, message, max_queued, policy.processing_ttl)
        .await;
    gw.metrics.queue_append(started.elapsed(), enqueued.is_err());
    gw.note_append(enqueued.is_ok());
    enqueued
}

/// Stored: the route's ack, and a worker of this process woken.
fn queued(gw: &Gateway, route: &Route, outcome: Outcome) -> Answer {
    gw.deliveries.wake(&route.config.name);
    answer(outcome, duplicate_response(route))
}

fn full(route: &Route, message: &Message) -> GatewayError {
    let max_queued = route.config.policy.delivery.queue().map_or(0, |q| q.max_queued);
    tracing::warn!(route = %route.config.name, id = %message.id, max_queued, "queue full: answering 503");
    GatewayError::QueueFull
}

/// Not stored (or not known to be: a lost reply; the sender's retry then finds it).
fn failed(route: &Route, message: &Message, error: StoreError) -> GatewayError {
    tracing::warn!(route = %route.config.name, id = %message.id, %error, "cannot queue the message: answering 503");
    GatewayError::StoreUnavailable(error)
}
