//! The errors that end a request, and the one mapping from each to its answer
//! (status, `x-dedup-status` outcome, short reason). Tests pin every row.

use http::header::{self, HeaderValue};
use http::{Response, StatusCode};

use crate::body::Body;
use crate::outcome::Outcome;
use crate::senders::{Failure, Rejection};
use crate::store::StoreError;
use crate::upstream::UpstreamError;

impl From<Failure> for GatewayError {
    fn from(failure: Failure) -> Self {
        match failure {
            Failure::Rejected(why) => GatewayError::Rejected(why),
            Failure::Refused(_) => GatewayError::ForbiddenXml,
        }
    }
}

/// The answer for a path no route serves (no `x-dedup-status`: it is on no route).
pub fn not_found() -> Response<Body> {
    let mut response = Response::new(Body::full("no route for this path\n"));
    *response.status_mut() = StatusCode::NOT_FOUND;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// Why a request on a route ended without a regular answer.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("request body exceeds {limit} bytes")]
    TooLarge { limit: u64 },
    #[error("reading the request body failed: {0}")]
    BadBody(#[source] hyper::Error),
    /// The body did not arrive within `body_timeout` (a slow client, or a slowloris).
    #[error("request body not received within {0:?}")]
    SlowBody(std::time::Duration),
    #[error("no dedup key in the request")]
    MissingKey,
    /// The sender's signature is missing or wrong (checked before any store call).
    #[error("{0}")]
    Rejected(Rejection),
    /// An XML body with a DOCTYPE or entity declaration: never parsed further.
    #[error("XML body with a DOCTYPE or entity declaration")]
    ForbiddenXml,
    #[error("message is still being processed")]
    InFlight,
    #[error("dedup store unavailable: {0}")]
    StoreUnavailable(#[source] StoreError),
    /// A queued route holds `max_queued` messages; nothing was stored.
    #[error("the route's queue is full")]
    QueueFull,
    #[error("{error}")]
    Upstream {
        #[source]
        error: UpstreamError,
        /// The outcome the request had when the upstream failed (forwarded, bypass, ...).
        outcome: Outcome,
    },
    /// The gateway stopped waiting for the upstream at the end of its shutdown grace
    /// (the claim was released, or completed if the upstream had already answered 2xx).
    #[error("gateway shutting down")]
    Abandoned,
    #[error("internal error: {0}")]
    Internal(String),
}

impl GatewayError {
    pub fn status(&self) -> StatusCode {
        match self {
            GatewayError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            GatewayError::BadBody(_)
            | GatewayError::SlowBody(_)
            | GatewayError::MissingKey
            | GatewayError::ForbiddenXml => StatusCode::BAD_REQUEST,
            GatewayError::Rejected(_) => StatusCode::UNAUTHORIZED,
            GatewayError::InFlight => StatusCode::CONFLICT,
            GatewayError::StoreUnavailable(_) | GatewayError::QueueFull | GatewayError::Abandoned => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            GatewayError::Upstream {
                error: UpstreamError::Timeout(_),
                ..
            } => StatusCode::GATEWAY_TIMEOUT,
            GatewayError::Upstream { .. } | GatewayError::Internal(_) => StatusCode::BAD_GATEWAY,
        }
    }

    /// The outcome counted and sent in `x-dedup-status`.
    pub fn outcome(&self) -> Outcome {
        match self {
            GatewayError::TooLarge { .. } => Outcome::TooLarge,
            GatewayError::BadBody(_) | GatewayError::SlowBody(_) | GatewayError::ForbiddenXml => Outcome::BadRequest,
            GatewayError::Rejected(_) => Outcome::Rejected,
            GatewayError::MissingKey => Outcome::NoKey,
            GatewayError::InFlight => Outcome::InFlight,
            GatewayError::StoreUnavailable(_) => Outcome::StoreUnavailable,
            GatewayError::QueueFull => Outcome::QueueFull,
            GatewayError::Upstream { outcome, .. } => *outcome,
            GatewayError::Abandoned => Outcome::Aborted,
            GatewayError::Internal(_) => Outcome::Forwarded,
        }
    }

    /// Whether the sender should simply try again (and is told when).
    fn retry_after(&self) -> bool {
        matches!(
            self,
            GatewayError::InFlight
                | GatewayError::StoreUnavailable(_)
                | GatewayError::QueueFull
                | GatewayError::Abandoned
        )
    }

    /// Whether the connection must close after this answer (the rest of an oversized
    /// or too slow body is never read).
    pub fn closes_connection(&self) -> bool {
        matches!(self, GatewayError::TooLarge { .. } | GatewayError::SlowBody(_))
    }

    fn reason(&self) -> &'static str {
        match self {
            GatewayError::TooLarge { .. } => "request body too large\n",
            GatewayError::BadBody(_) => "could not read the request body\n",
            GatewayError::SlowBody(_) => "request body too slow\n",
            GatewayError::MissingKey => "no message id in the request\n",
            GatewayError::Rejected(_) => "signature check failed\n",
            GatewayError::ForbiddenXml => "XML with a DOCTYPE is not accepted\n",
            GatewayError::InFlight => "message is being processed; retry later\n",
            GatewayError::StoreUnavailable(_) => "dedup store unavailable; retry later\n",
            GatewayError::QueueFull => "queue full; retry later\n",
            GatewayError::Upstream {
                error: UpstreamError::Timeout(_),
                ..
            } => "upstream timed out\n",
            GatewayError::Upstream {
                error: UpstreamError::Body(_),
                ..
            } => "upstream response broke off\n",
            GatewayError::Upstream { .. } => "upstream unavailable\n",
            GatewayError::Abandoned => "gateway restarting; retry later\n",
            GatewayError::Internal(_) => "gateway error\n",
        }
    }

    /// The answer this error gets (without `x-dedup-status`, which the handler adds).
    pub fn to_response(&self) -> Response<Body> {
        let mut response = Response::new(Body::full(self.reason()));
        *response.status_mut() = self.status();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        if self.retry_after() {
            headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if self.closes_connection() {
            headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(e: GatewayError) -> (u16, &'static str, bool) {
        let r = e.to_response();
        (
            r.status().as_u16(),
            e.outcome().label(),
            r.headers().get(header::RETRY_AFTER).is_some_and(|v| v == "1"),
        )
    }

    #[test]
    fn every_error_has_its_pinned_answer() {
        let timeout = UpstreamError::Timeout(std::time::Duration::from_secs(1));
        assert_eq!(not_found().status(), 404);
        assert_eq!(row(GatewayError::TooLarge { limit: 1 }), (413, "too_large", false));
        assert_eq!(row(GatewayError::MissingKey), (400, "no_key", false));
        let slow = GatewayError::SlowBody(std::time::Duration::from_secs(1));
        assert!(slow.closes_connection());
        assert_eq!(row(slow), (400, "bad_request", false));
        assert_eq!(
            row(GatewayError::Rejected(Rejection::Missing("x-slack-signature"))),
            (401, "rejected", false)
        );
        assert_eq!(row(GatewayError::ForbiddenXml), (400, "bad_request", false));
        assert_eq!(row(GatewayError::InFlight), (409, "in_flight", true));
        assert_eq!(
            row(GatewayError::StoreUnavailable(StoreError::Timeout)),
            (503, "store_unavailable", true)
        );
        assert_eq!(
            row(GatewayError::Upstream {
                error: timeout,
                outcome: Outcome::Forwarded
            }),
            (504, "forwarded", false)
        );
        assert_eq!(row(GatewayError::Abandoned), (503, "aborted", true));
        assert_eq!(row(GatewayError::QueueFull), (503, "queue_full", true));
        assert_eq!(row(GatewayError::Internal("x".into())), (502, "forwarded", false));
        let close = GatewayError::TooLarge { limit: 1 }.to_response();
        assert_eq!(close.headers()[header::CONNECTION], "close");
    }
}
