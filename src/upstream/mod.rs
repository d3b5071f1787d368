//! The outbound side: everything that talks to the bot. [`rewrite`] turns a received
//! request into the upstream's, [`pool`] keeps connections per worker thread, and
//! [`client`] speaks HTTP/1.1 on one of them. [`call`] is one bounded exchange;
//! [`send`] is a route's: rewritten, bounded by `upstream_timeout`, counted.

pub mod client;
pub mod pool;
pub mod rewrite;

use std::time::Duration;

use futures_util::FutureExt as _;
use http::uri::Authority;
use http::{Request, Response};
use tokio::time::Instant;

use crate::body::{Body, BodyError};
use crate::metrics::UpstreamClass;
use crate::routing::Route;
pub use pool::SendError;
pub use rewrite::Peer;

#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("upstream unreachable: {0}")]
    Connect(#[source] SendError),
    #[error("upstream did not answer within {0:?}")]
    Timeout(Duration),
    #[error("invalid upstream request: {0}")]
    Request(#[from] http::Error),
    #[error("upstream response body broke: {0}")]
    Body(#[source] BodyError),
}

/// Sends a request (origin-form URI, Host set) to `authority` and waits for the
/// response head until `timeout` after `started` (the caller's clock reading, which
/// it also times the call by: one reading, not one for each). Not an `async fn`:
/// see *Future sizes* in [`crate::dedup`].
pub fn call(
    authority: &Authority,
    request: Request<Body>,
    started: Instant,
    timeout: Duration,
) -> impl Future<Output = Result<Response<Body>, UpstreamError>> + Send {
    tokio::time::timeout_at(started + timeout, pool::send(authority, request)).map(move |sent| match sent {
        Ok(Ok(response)) => Ok(response),
        Ok(Err(e)) => Err(UpstreamError::Connect(e)),
        Err(_) => Err(UpstreamError::Timeout(timeout)),
    })
}

/// Rewrites a request for the route's upstream and sends it, counting the result
/// class and latency. `upstream_timeout` and the latency run from `started`.
/// Not an `async fn`: see *Future sizes* in [`crate::dedup`].
pub fn send<'a>(
    route: &'a Route,
    head: http::request::Parts,
    body: Body,
    peer: Peer,
    started: Instant,
) -> impl Future<Output = Result<Response<Body>, UpstreamError>> + Send + 'a {
    let request = rewrite::upstream_request(head, body, &route.config.upstream, peer);
    let (authority, timeout) = (&route.config.upstream.authority, route.config.policy.upstream_timeout);
    call(authority, request, started, timeout).map(move |result| {
        let class = match &result {
            Ok(response) => UpstreamClass::of_status(response.status()),
            Err(UpstreamError::Timeout(_)) => UpstreamClass::Timeout,
            Err(_) => UpstreamClass::Error,
        };
        route.metrics.upstream(class, started.elapsed());
        result
    })
}
