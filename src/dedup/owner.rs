//! The owner of a claim: forwards the request and then completes or releases the
//! marker. Runs in the request's own task (see [`super::process`]) so a sender that
//! hangs up never cancels the upstream call or leaves a stale marker behind.

use http::Response;
use tokio::time::Instant;

use super::{Request, Task, timed};
use crate::answer::{Answer, answer};
use crate::body::{self, Body, BodyError};
use crate::config::policy::OnUpstreamTimeout;
use crate::error::GatewayError;
use crate::metrics::StoreOp;
use crate::outcome::Outcome;
use crate::store::{Completion, MAX_STORED_BODY, Store, StoreError, StoredResponse};
use crate::upstream::{self, UpstreamError};

/// Forwards a claimed request and completes or releases its marker. Runs inside the
/// request's [`Task`], so nothing here is cancelled when the sender hangs up.
/// Not an `async fn`: see *Future sizes* in [`super`].
#[allow(clippy::manual_async_fn, reason = "an async fn holds its arguments twice")]
pub(super) fn forward(task: &Task, req: Request) -> impl Future<Output = Result<Answer, GatewayError>> + Send {
    async move {
        let owner = Owner(task);
        let started = Instant::now();
        let deadline = started + owner.route.config.policy.upstream_timeout;
        let result = tokio::select! {
            // Looked at first: a waiter promoted after the grace ended must not start a
            // delivery it would abandon at once.
            biased;
            () = owner.gw.abandoned() => return owner.abandon().await,
            result = upstream::send(&owner.route, req.head, Body::full(req.body), req.peer, started) => result,
        };
        match result {
            Ok(response) if response.status().is_success() => owner.succeeded(response, deadline).await,
            Ok(response) => {
                owner.release().await;
                Ok(answer(Outcome::Forwarded, response))
            }
            Err(error) => {
                let keep = matches!(error, UpstreamError::Timeout(_))
                    && owner.route.config.policy.on_upstream_timeout == OnUpstreamTimeout::Keep;
                if !keep {
                    owner.release().await;
                }
                Err(forwarded(error))
            }
        }
    }
}

/// The claim's holder: what completes or releases it.
struct Owner<'a>(&'a Task);

impl std::ops::Deref for Owner<'_> {
    type Target = Task;

    fn deref(&self) -> &Task {
        self.0
    }
}

impl Owner<'_> {
    async fn abandon(&self) -> Result<Answer, GatewayError> {
        tracing::warn!(route = %self.route.config.name, key = %self.key, "shutdown grace over: releasing the claim");
        self.release().await;
        Err(GatewayError::Abandoned)
    }

    /// The upstream did the work: mark COMPLETED (with the response for `replay`), then
    /// hand the response back. If marking fails the sender still gets the answer; the
    /// PROCESSING marker expires after `processing_ttl`.
    async fn succeeded(&self, response: Response<Body>, deadline: Instant) -> Result<Answer, GatewayError> {
        if self.route.config.policy.replay {
            // Boxed: reading the body to store it makes a future three times the size
            // of the rest of this one, and only `replay` routes need it.
            return Box::pin(self.replayed(response, deadline)).await;
        }
        self.complete(None).await;
        Ok(answer(Outcome::Forwarded, response))
    }

    /// [`Self::succeeded`] on a `replay` route: reads the body, within the upstream
    /// deadline, to store it with the marker.
    async fn replayed(&self, response: Response<Body>, deadline: Instant) -> Result<Answer, GatewayError> {
        let captured = tokio::select! {
            biased;
            // Shutting down mid-body: the work is done, so complete rather than leave
            // PROCESSING for a later retry to deliver again.
            () = self.gw.abandoned() => return self.complete_then(Err(GatewayError::Abandoned)).await,
            captured = tokio::time::timeout_at(deadline, capture(response)) => captured,
        };
        let (response, stored) = match captured {
            Ok(Ok(captured)) => captured,
            Ok(Err(e)) => return self.complete_then(Err(forwarded(UpstreamError::Body(e)))).await,
            Err(_) => {
                let timeout = self.route.config.policy.upstream_timeout;
                return self
                    .complete_then(Err(forwarded(UpstreamError::Timeout(timeout))))
                    .await;
            }
        };
        self.complete(stored).await;
        Ok(answer(Outcome::Forwarded, response))
    }

    /// A 2xx whose body then broke or stalled: the work is done, so complete (the
    /// retry is answered as a duplicate, not delivered again), and report the failure.
    async fn complete_then(&self, result: Result<Answer, GatewayError>) -> Result<Answer, GatewayError> {
        self.complete(None).await;
        result
    }

    async fn complete(&self, response: Option<StoredResponse>) {
        let completion = Completion {
            first_seen_ms: self.first_seen_ms,
            ttl: self.route.config.policy.completed_ttl,
            response,
        };
        self.store_call(StoreOp::Complete, || {
            self.gw.store.complete(&self.key, self.token, completion.clone())
        })
        .await;
    }

    async fn release(&self) {
        self.store_call(StoreOp::Release, || {
            self.gw.store.release(&self.key, self.token, self.first_seen_ms)
        })
        .await;
    }

    /// Runs a complete or release, once more if the first reply is lost (both are
    /// compare-and-set on the token, so a repeat cannot undo anything). Failures are
    /// logged here, once: the request itself still ends well.
    async fn store_call<F, Fut>(&self, op: StoreOp, call: F)
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<bool, StoreError>>,
    {
        let (route, key) = (&self.route.config.name, &self.key);
        let (result, repeated) = match timed(&self.gw, op, &call).await {
            Err(e) if e.is_ambiguous() => (timed(&self.gw, op, &call).await, true),
            other => (other, false),
        };
        match result {
            Ok(true) => {}
            // The first attempt landed; its reply was what got lost.
            Ok(false) if repeated => tracing::debug!(%route, %key, ?op, "store call landed before its reply was lost"),
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

fn forwarded(error: UpstreamError) -> GatewayError {
    GatewayError::Upstream {
        error,
        outcome: Outcome::Forwarded,
    }
}

/// Reads up to [`MAX_STORED_BODY`] of a 2xx response to store it; a larger body is
/// passed through whole and not stored (duplicates then get the duplicate answer).
async fn capture(response: Response<Body>) -> Result<(Response<Body>, Option<StoredResponse>), BodyError> {
    let (head, body) = response.into_parts();
    Ok(match body::read_up_to(body, MAX_STORED_BODY).await? {
        Ok(bytes) => {
            // One allocation, shared by the sender's answer and the store.
            let stored = StoredResponse::capture(&head, bytes);
            (
                Response::from_parts(head, Body::full(stored.body.clone())),
                Some(stored),
            )
        }
        Err(whole) => (Response::from_parts(head, whole), None),
    })
}
