//! What a request on a route is answered with, when it is not an error: the upstream's
//! response passed on ([`forward_unowned`], for requests nobody claimed), or the
//! gateway's own (the route's duplicate answer, or the reply stored for `replay`).

use futures_util::FutureExt as _;
use http::Response;
use http::header;
use tokio::time::Instant;

use crate::body::Body;
use crate::error::GatewayError;
use crate::outcome::Outcome;
use crate::routing::Route;
use crate::store::StoredResponse;
use crate::upstream::{self, Peer};

/// How a request ended well: what to count and what to send.
pub struct Answer {
    pub outcome: Outcome,
    pub response: Response<Body>,
}

/// Forwards a request nobody claimed (no key, shadow mode, store down, or a method
/// that is not deduped). Nothing to complete or release, so it runs in the caller's task.
/// Not an `async fn`: see *Future sizes* in [`crate::dedup`].
pub fn forward_unowned<'a>(
    route: &'a Route,
    head: http::request::Parts,
    body: Body,
    peer: Peer,
    outcome: Outcome,
) -> impl Future<Output = Result<Answer, GatewayError>> + Send + 'a {
    upstream::send(route, head, body, peer, Instant::now()).map(move |sent| match sent {
        Ok(response) => Ok(answer(outcome, response)),
        Err(error) => Err(GatewayError::Upstream { error, outcome }),
    })
}

pub fn answer(outcome: Outcome, response: Response<Body>) -> Answer {
    Answer { outcome, response }
}

/// The answer for a COMPLETED marker: the stored response with `replay`, else the
/// route's duplicate answer.
pub fn duplicate(route: &Route, stored: Option<&StoredResponse>) -> Answer {
    match stored {
        Some(stored) if route.config.policy.replay => {
            let mut response = Response::new(Body::full(stored.body.clone()));
            *response.status_mut() = stored.status;
            let headers = response.headers_mut();
            if let Some(ct) = &stored.content_type {
                headers.insert(header::CONTENT_TYPE, ct.clone());
            }
            if let Some(ce) = &stored.content_encoding {
                headers.insert(header::CONTENT_ENCODING, ce.clone());
            }
            answer(Outcome::Replayed, response)
        }
        _ => answer(Outcome::Duplicate, duplicate_response(route)),
    }
}

/// The route's configured duplicate answer (`duplicate_status`, `_body`, `_content_type`).
pub fn duplicate_response(route: &Route) -> Response<Body> {
    let dup = &route.config.policy.duplicate;
    let mut response = Response::new(Body::full(dup.body.clone()));
    *response.status_mut() = dup.status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, dup.content_type.clone());
    response
}
