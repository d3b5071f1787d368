//! The owner of a claim: forwards the request and then completes or releases the
//! marker. Runs in its own task so a sender that hangs up never cancels the upstream
//! call or leaves a stale marker behind.

use std::sync::Arc;

use bytes::Bytes;
use http::Response;
use http::header;

use super::{Answer, Request, answer, send, storable, timed};
use crate::body::{self, Body};
use crate::error::GatewayError;
use crate::gateway::Gateway;
use crate::metrics::StoreOp;
use crate::outcome::Outcome;
use crate::proxy::{self, UpstreamError};
use crate::routing::Route;
use crate::store::{Completion, MAX_STORED_BODY, Store, StoredResponse, Token};

use super::policy::OnUpstreamTimeout;

/// Runs the owner task and waits for its answer.
pub(super) async fn run(
    gw: &Arc<Gateway>,
    route: &Arc<Route>,
    key: String,
    token: Token,
    first_seen_ms: u64,
    req: Request,
) -> Result<Answer, GatewayError> {
    let owner = Owner {
        gw: Arc::clone(gw),
        route: Arc::clone(route),
        key,
        token,
        first_seen_ms,
    };
    gw.tasks
        .spawn(owner.forward(req))
        .await
        .unwrap_or_else(|e| Err(GatewayError::Internal(format!("owner task failed: {e}"))))
}

struct Owner {
    gw: Arc<Gateway>,
    route: Arc<Route>,
    key: String,
    token: Token,
    first_seen_ms: u64,
}

impl Owner {
    async fn forward(self, req: Request) -> Result<Answer, GatewayError> {
        let request = match proxy::upstream_request(
            req.head,
            Body::full(req.body),
            &self.route.config.upstream,
            req.peer,
        ) {
            Ok(request) => request,
            Err(e) => {
                self.release().await;
                return Err(GatewayError::Internal(e.to_string()));
            }
        };
        let result = tokio::select! {
            result = send(&self.gw, &self.route, request) => result,
            () = self.gw.abandon.cancelled() => {
                tracing::warn!(route = %self.route.config.name, key = %self.key, "shutdown grace over: releasing the claim");
                self.release().await;
                return Err(GatewayError::Abandoned);
            }
        };
        match result {
            Ok(response) if response.status().is_success() => Ok(self.succeeded(response).await),
            Ok(response) => {
                self.release().await;
                Ok(answer(
                    Outcome::Forwarded,
                    proxy::downstream_response(response),
                ))
            }
            Err(error) => {
                let keep = matches!(error, UpstreamError::Timeout(_))
                    && self.route.config.policy.on_upstream_timeout == OnUpstreamTimeout::Keep;
                if !keep {
                    self.release().await;
                }
                Err(GatewayError::Upstream {
                    error,
                    outcome: Outcome::Forwarded,
                })
            }
        }
    }

    /// The upstream did the work: mark COMPLETED (with the response for `replay`), then
    /// hand the response back. If marking fails the sender still gets the answer; the
    /// PROCESSING marker expires after `processing_ttl`.
    async fn succeeded(&self, response: Response<hyper::body::Incoming>) -> Answer {
        let response = proxy::downstream_response(response);
        let (response, stored) = if self.route.config.policy.replay {
            self.capture(response).await
        } else {
            (response, None)
        };
        let completion = Completion {
            first_seen_ms: self.first_seen_ms,
            ttl: self.route.config.policy.completed_ttl,
            response: stored,
        };
        self.store_call(StoreOp::Complete, || {
            self.gw
                .store
                .complete(&self.key, self.token, completion.clone())
        })
        .await;
        answer(Outcome::Forwarded, response)
    }

    /// Reads up to [`MAX_STORED_BODY`] of a 2xx response to store it; a larger body is
    /// passed through whole and not stored (duplicates then get the duplicate answer).
    async fn capture(&self, response: Response<Body>) -> (Response<Body>, Option<StoredResponse>) {
        let (head, body) = response.into_parts();
        let Body::Incoming(incoming) = body else {
            return (Response::from_parts(head, body), None);
        };
        match body::read_up_to(incoming, MAX_STORED_BODY).await {
            Ok(Ok(bytes)) => {
                let stored = storable(head.status, head.headers.get(header::CONTENT_TYPE), &bytes);
                (Response::from_parts(head, Body::full(bytes)), stored)
            }
            Ok(Err(whole)) => (Response::from_parts(head, whole), None),
            Err(e) => {
                // The upstream answered 2xx and then broke its body: the work is done, so
                // complete, and tell the sender what we have.
                tracing::warn!(route = %self.route.config.name, key = %self.key, error = %e, "upstream body broke after 2xx");
                (Response::from_parts(head, Body::full(Bytes::new())), None)
            }
        }
    }

    async fn release(&self) {
        self.store_call(StoreOp::Release, || {
            self.gw.store.release(&self.key, self.token)
        })
        .await;
    }

    /// Runs a complete or release, once more if the first reply is lost (both are
    /// compare-and-set on the token, so a repeat cannot undo anything). Failures are
    /// logged here, once: the request itself still ends well.
    async fn store_call<F, Fut>(&self, op: StoreOp, call: F)
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<bool, crate::store::StoreError>>,
    {
        let result = match timed(&self.gw, op, call()).await {
            Err(_) => timed(&self.gw, op, call()).await,
            ok => ok,
        };
        let (route, key) = (&self.route.config.name, &self.key);
        match result {
            Ok(true) => {}
            Ok(false) => tracing::warn!(
                %route, %key, ?op,
                "marker no longer held by this request (expired: processing_ttl shorter than the upstream took?)"
            ),
            Err(error) => tracing::warn!(
                %route, %key, ?op, %error,
                "store call failed; the PROCESSING marker expires after processing_ttl"
            ),
        }
    }
}
