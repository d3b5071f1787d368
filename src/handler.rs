//! The request path. The outer function routes, counts, stamps `x-dedup-status` and
//! logs the one line per request; the inner one reads the body, derives the key and
//! hands over to the state machine, using `?` for every way it can end early.

use std::convert::Infallible;
use std::sync::Arc;

use http::{Method, Request, Response};
use hyper::body::Incoming;
use tokio::time::Instant;

use crate::body::{self, Body, ReadError};
use crate::dedup::key::{Input, stored_key};
use crate::dedup::policy::OnMissingKey;
use crate::dedup::{self, Answer};
use crate::error::GatewayError;
use crate::gateway::Gateway;
use crate::outcome::{Outcome, STATUS_HEADER};
use crate::proxy::{self, Peer};
use crate::routing::Route;

/// Serves one request on the proxy listener.
pub async fn handle(
    gw: Arc<Gateway>,
    peer: Peer,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let Some(route) = gw.routes.load().find(req.uri().path()).cloned() else {
        return Ok(GatewayError::NoRoute.to_response());
    };
    let started = Instant::now();
    let method = req.method().clone();
    let mut key = None;
    let result = if is_deduped(&method) {
        inner(&gw, &route, peer, req, &mut key).await
    } else {
        bypass(&gw, &route, peer, req).await
    };
    let (outcome, mut response) = match result {
        Ok(Answer { outcome, response }) => (outcome, response),
        Err(error) => {
            // Store failures were logged where they were handled; log the rest once here.
            if matches!(
                error,
                GatewayError::Upstream { .. } | GatewayError::Internal(_)
            ) {
                tracing::warn!(route = %route.config.name, key = key.as_deref().unwrap_or("-"), %error, "request failed");
            }
            let outcome = error.outcome().unwrap_or(Outcome::Rejected);
            (outcome, error.to_response())
        }
    };
    route.metrics.request(outcome);
    response
        .headers_mut()
        .insert(STATUS_HEADER, outcome.header());
    tracing::debug!(
        route = %route.config.name,
        key = key.as_deref().unwrap_or("-"),
        %method,
        outcome = outcome.label(),
        status = response.status().as_u16(),
        latency_ms = started.elapsed().as_secs_f64() * 1e3,
        "request"
    );
    Ok(response)
}

/// Only these carry webhook deliveries; everything else (WeChat's GET verification,
/// health checks) passes straight through.
fn is_deduped(method: &Method) -> bool {
    matches!(*method, Method::POST | Method::PUT | Method::PATCH)
}

async fn inner(
    gw: &Arc<Gateway>,
    route: &Arc<Route>,
    peer: Peer,
    req: Request<Incoming>,
    key_out: &mut Option<String>,
) -> Result<Answer, GatewayError> {
    let (head, body) = req.into_parts();
    let body = body::read_limited(body, gw.max_body)
        .await
        .map_err(|e| match e {
            ReadError::TooLarge { limit } => GatewayError::TooLarge { limit },
            ReadError::Broken(e) => GatewayError::BadBody(e),
        })?;
    let config = &route.config;
    let key = config
        .key
        .derive(Input {
            head: &head,
            body: &body,
        })
        .map(|value| stored_key(&gw.key_prefix, &config.name, &value));
    let req = dedup::Request { head, body, peer };
    let Some(key) = key else {
        return match config.policy.on_missing_key {
            OnMissingKey::Forward => dedup::forward_unowned(gw, route, req, Outcome::NoKey).await,
            OnMissingKey::Reject => Err(GatewayError::MissingKey),
            OnMissingKey::Ack => Ok(Answer {
                outcome: Outcome::NoKey,
                response: dedup::duplicate_response(route),
            }),
        };
    };
    *key_out = Some(key.clone());
    dedup::process(gw, route, key, req).await
}

/// Streams a request the gateway does not dedupe to the upstream, untouched.
async fn bypass(
    gw: &Gateway,
    route: &Route,
    peer: Peer,
    req: Request<Incoming>,
) -> Result<Answer, GatewayError> {
    let (head, body) = req.into_parts();
    let request = proxy::upstream_request(head, Body::Incoming(body), &route.config.upstream, peer)
        .map_err(|e| GatewayError::Internal(e.to_string()))?;
    let response =
        dedup::send(gw, route, request)
            .await
            .map_err(|error| GatewayError::Upstream {
                error,
                outcome: Outcome::Bypass,
            })?;
    Ok(Answer {
        outcome: Outcome::Bypass,
        response: proxy::downstream_response(response),
    })
}
