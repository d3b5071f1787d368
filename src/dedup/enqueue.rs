//! The owner of a claim on a queued route: appends the request to the route's queue
//! (the marker becomes QUEUED in the same step) and answers the sender with the
//! route's ack. Nothing is acknowledged that is not stored: an append that fails or
//! finds the queue full releases the claim and tells the sender to retry.

use std::sync::Arc;

use tokio::time::Instant;

use super::{Request, Task, timed};
use crate::answer::{Answer, answer, duplicate_response};
use crate::body::Body;
use crate::error::GatewayError;
use crate::gateway::Gateway;
use crate::metrics::StoreOp;
use crate::outcome::Outcome;
use crate::routing::Route;
use crate::store::queue::{Appended, Message, header_block};
use crate::store::{QueueStore, Store, Token, unix_ms};
use crate::upstream::rewrite;

/// Appends a claimed request and answers; see the module doc.
pub(super) async fn append(task: &Task, req: Request) -> Result<Answer, GatewayError> {
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
    match store(gw, route, &message).await {
        Ok(answer) => Ok(answer),
        Err(error) => {
            let released = timed(gw, StoreOp::Release, || {
                gw.store.release(key, task.token, task.first_seen_ms)
            });
            if let Err(e) = released.await {
                tracing::warn!(route = %route.config.name, key = %key, error = %e,
                    "releasing the claim of a message not queued failed: it expires after processing_ttl");
            }
            Err(error)
        }
    }
}

/// Queues a request without a key (`on_missing_key = "forward"` on a queued route):
/// no marker, so a retry of it is queued again.
pub async fn append_unkeyed(gw: &Arc<Gateway>, route: &Arc<Route>, req: Request) -> Result<Answer, GatewayError> {
    let token = Token::generate();
    let id = format!("nokey-{token}");
    let message = message(route, id, None, token, unix_ms(), req);
    store(gw, route, &message).await.map(|ok| Answer {
        outcome: Outcome::NoKey,
        response: ok.response,
    })
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

/// Appends `message` and answers: the route's ack once stored, 503 when the queue is
/// full or the store failed.
async fn store(gw: &Gateway, route: &Route, message: &Message) -> Result<Answer, GatewayError> {
    let Some(queue) = route.config.policy.delivery.queue() else {
        return Err(GatewayError::Internal("append on a sync route".into()));
    };
    let name = &route.config.name;
    let started = Instant::now();
    let appended = gw.store.append(name, message, queue.max_queued).await;
    gw.metrics.queue_append(started.elapsed(), appended.is_err());
    gw.note_append(appended.is_ok());
    match appended {
        Ok(Appended::Queued) => {
            gw.deliveries.wake(name);
            Ok(answer(Outcome::Queued, duplicate_response(route)))
        }
        Ok(Appended::Full) => {
            tracing::warn!(route = %name, id = %message.id, max_queued = queue.max_queued,
                "queue full: answering 503");
            Err(GatewayError::QueueFull)
        }
        Err(error) => {
            tracing::warn!(route = %name, id = %message.id, %error, "append failed: answering 503");
            Err(GatewayError::StoreUnavailable(error))
        }
    }
}
