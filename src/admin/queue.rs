//! The queue API of queued routes (`delivery = "queued"`), JSON in and out:
//!
//! - `GET /queue`: per queued route, what its queue holds.
//! - `GET /queue/<route>/dead?limit=N`: its dead letters, the oldest first (100 by default).
//! - `POST /queue/<route>/dead/<id>/retry`, `POST /queue/<route>/dead/retry`: one dead
//!   letter, or every one, back to the queue, due now, attempts reset.
//! - `DELETE /queue/<route>/dead/<id>`: drop it for good; its marker is released.
//!
//! `<id>` is the message id, percent-encoded; like `/keys/`, it is stored under the
//! stored keys' rule (long or unusual ids are hashed), and a listed id (already in
//! that form) addresses its dead letter as it is.

use std::sync::Arc;
use std::time::Duration;

use http::{Method, StatusCode};
use serde_json::{Value, json};

use super::keys::{Reply, percent_decode};
use crate::gateway::Gateway;
use crate::key::stored_key;
use crate::routing::Route;
use crate::store::queue::{DeadLetter, QueueCounts, rfc3339};
use crate::store::{QueueStore, unix_ms};

/// Dead letters listed when `limit` is not given.
const DEFAULT_LIMIT: usize = 100;

/// Serves one request under `/queue` (a write already authorised by the caller).
pub async fn serve(gw: &Arc<Gateway>, method: &Method, path: &str, query: Option<&str>) -> Reply {
    let parts: Vec<&str> = path.trim_end_matches('/').split('/').skip(2).collect();
    match (method, parts.as_slice()) {
        (&Method::GET | &Method::HEAD, []) => status(gw).await,
        (&Method::GET | &Method::HEAD, [route, "dead"]) => with_route(gw, route, |r| dead(gw, r, query)).await,
        (&Method::POST, [route, "dead", "retry"]) => with_route(gw, route, |r| retry(gw, r, None)).await,
        (&Method::POST, [route, "dead", id, "retry"]) => match percent_decode(id) {
            Ok(id) => with_route(gw, route, |r| retry(gw, r, Some(id))).await,
            Err(why) => bad(why),
        },
        (&Method::DELETE, [route, "dead", id]) => match percent_decode(id) {
            Ok(id) => with_route(gw, route, |r| drop_dead(gw, r, id)).await,
            Err(why) => bad(why),
        },
        _ => reply(
            StatusCode::NOT_FOUND,
            json!({ "error": "expected GET /queue, GET /queue/<route>/dead, POST /queue/<route>/dead[/<id>]/retry \
                              or DELETE /queue/<route>/dead/<id>" }),
        ),
    }
}

fn reply(status: StatusCode, body: Value) -> Reply {
    Reply { status, body }
}

fn bad(why: String) -> Reply {
    reply(StatusCode::BAD_REQUEST, json!({ "error": why }))
}

fn store_error(e: impl std::fmt::Display) -> Reply {
    reply(
        StatusCode::SERVICE_UNAVAILABLE,
        json!({ "error": format!("store: {e}") }),
    )
}

/// Runs `then` on the named route if it is a queued one.
async fn with_route<F: Future<Output = Reply>>(gw: &Gateway, name: &str, then: impl FnOnce(Arc<Route>) -> F) -> Reply {
    let route = gw.routes.load().named(name).cloned();
    match route {
        Some(route) if route.config.policy.delivery.queue().is_some() => then(route).await,
        Some(_) => reply(
            StatusCode::NOT_FOUND,
            json!({ "error": format!("route {name:?} is not queued (delivery = \"sync\")") }),
        ),
        None => reply(
            StatusCode::NOT_FOUND,
            json!({ "error": format!("no route named {name:?}") }),
        ),
    }
}

/// The message id a dead letter is stored under: `id` by the stored keys' rule.
fn stored_id(gw: &Gateway, route: &str, id: &str) -> String {
    let key = stored_key(&gw.key_prefix, route, id);
    key.get(gw.key_prefix.len() + route.len() + 1..)
        .unwrap_or(id)
        .to_owned()
}

async fn status(gw: &Gateway) -> Reply {
    let now = unix_ms();
    let mut routes = Vec::new();
    for route in queued_routes(gw) {
        let name = &route.config.name;
        match gw.store.counts(name, now).await {
            Ok(counts) => routes.push(describe(name, &counts, now)),
            Err(e) => return store_error(e),
        }
    }
    reply(StatusCode::OK, json!({ "routes": routes }))
}

fn queued_routes(gw: &Gateway) -> Vec<Arc<Route>> {
    let routes = gw.routes.load();
    let mut queued: Vec<Arc<Route>> = routes
        .all()
        .filter(|r| r.config.policy.delivery.queue().is_some())
        .cloned()
        .collect();
    queued.sort_by(|a, b| a.config.name.cmp(&b.config.name));
    queued
}

fn describe(route: &str, c: &QueueCounts, now: u64) -> Value {
    json!({
        "route": route,
        "ready": c.ready,
        "scheduled": c.scheduled,
        "delivering": c.delivering,
        "dead": c.dead,
        "oldest_age_ms": c.oldest_queued_at_ms.map(|at| now.saturating_sub(at)),
    })
}

async fn dead(gw: &Gateway, route: Arc<Route>, query: Option<&str>) -> Reply {
    let limit = query
        .into_iter()
        .flat_map(|q| form_urlencoded::parse(q.as_bytes()))
        .find(|(k, _)| k == "limit")
        .map(|(_, v)| v.parse::<usize>());
    let limit = match limit {
        None => DEFAULT_LIMIT,
        Some(Ok(n)) if n > 0 => n,
        Some(_) => return bad("limit must be a positive integer".into()),
    };
    let name = &route.config.name;
    match gw.store.dead_letters(name, limit).await {
        Ok(letters) => reply(
            StatusCode::OK,
            json!({ "route": name, "dead": letters.iter().map(letter).collect::<Vec<_>>() }),
        ),
        Err(e) => store_error(e),
    }
}

fn letter(d: &DeadLetter) -> Value {
    json!({
        "id": d.id,
        "key": d.key,
        "attempts": d.attempts,
        "last_error": d.last_error,
        "queued_at": rfc3339(d.queued_at_ms),
        "dead_at": rfc3339(d.dead_at_ms),
        "queued_at_ms": d.queued_at_ms,
        "dead_at_ms": d.dead_at_ms,
    })
}

async fn retry(gw: &Gateway, route: Arc<Route>, id: Option<String>) -> Reply {
    let name = &route.config.name;
    let id = id.map(|id| stored_id(gw, name, &id));
    match gw.store.retry_dead(name, id.as_deref(), unix_ms()).await {
        Ok(0) if id.is_some() => reply(
            StatusCode::NOT_FOUND,
            json!({ "route": name, "id": id, "retried": 0, "error": "no dead letter with this id" }),
        ),
        Ok(n) => {
            tracing::info!(route = %name, id = id.as_deref().unwrap_or("all"), retried = n, "admin: dead letters back to the queue");
            gw.deliveries.wake(name);
            reply(StatusCode::OK, json!({ "route": name, "id": id, "retried": n }))
        }
        Err(e) => store_error(e),
    }
}

async fn drop_dead(gw: &Gateway, route: Arc<Route>, id: String) -> Reply {
    let name = &route.config.name;
    let id = stored_id(gw, name, &id);
    match gw.store.drop_dead(name, &id).await {
        Ok(true) => {
            tracing::info!(route = %name, %id, "admin: dead letter dropped, its marker released");
            reply(StatusCode::OK, json!({ "route": name, "id": id, "dropped": true }))
        }
        Ok(false) => reply(
            StatusCode::NOT_FOUND,
            json!({ "route": name, "id": id, "dropped": false, "error": "no dead letter with this id" }),
        ),
        Err(e) => store_error(e),
    }
}

/// Reads every queued route's counts into the queue gauges (before `/metrics` renders
/// them). A store that does not answer leaves the last values.
pub async fn refresh_metrics(gw: &Gateway) {
    let now = unix_ms();
    for route in queued_routes(gw) {
        let name = &route.config.name;
        if let Ok(c) = gw.store.counts(name, now).await {
            let oldest = c
                .oldest_queued_at_ms
                .map_or(Duration::ZERO, |at| Duration::from_millis(now.saturating_sub(at)));
            let states = [
                ("ready", c.ready),
                ("scheduled", c.scheduled),
                ("delivering", c.delivering),
                ("dead", c.dead),
            ];
            gw.metrics.set_queue(name, states, oldest);
        }
    }
}
