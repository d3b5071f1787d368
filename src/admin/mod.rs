//! The admin listener: `/healthz` and `/livez` (the process runs), `/readyz` (config
//! loaded, store answering, not draining), `/metrics` (OpenMetrics text),
//! `POST /reload` (re-read the config file, as SIGHUP does) and `/keys/<route>/<id>`
//! (inspect or forget one message's marker, [`keys`]), `/queue...` (queued routes'
//! queues and dead letters, [`queue`]). With `admin_token_env` set, the endpoints that
//! change something (`POST /reload`, `DELETE /keys/...`, `POST` and `DELETE
//! /queue/...`) need `Authorization: Bearer <token>`; probes, `/metrics` and the reads
//! stay open.

pub mod client;
pub mod keys;
pub mod queue;
pub mod reload;

use std::convert::Infallible;
use std::sync::Arc;

use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use crate::body::Body;
use crate::gateway::Gateway;
use crate::inbound::accept::AcceptFailures;
use reload::Reloader;

/// Serves the admin endpoints until the process exits (so `/readyz` can report the drain).
pub fn spawn(gw: Arc<Gateway>, listener: TcpListener, reloader: Option<Arc<Reloader>>) {
    tokio::spawn(async move {
        let mut failures = AcceptFailures::new("admin", &listener);
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    failures.failed(&e).await;
                    continue;
                }
            };
            failures.accepted();
            let (gw, reloader) = (Arc::clone(&gw), reloader.clone());
            tokio::spawn(async move {
                let service = service_fn(move |req| {
                    let (gw, reloader) = (Arc::clone(&gw), reloader.clone());
                    async move { Ok::<_, Infallible>(respond(gw, reloader, req).await) }
                });
                let _ = http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(std::time::Duration::from_secs(10))
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
}

async fn respond(gw: Arc<Gateway>, reloader: Option<Arc<Reloader>>, req: Request<Incoming>) -> Response<Body> {
    let read = req.method() == Method::GET || req.method() == Method::HEAD;
    let path = req.uri().path();
    if path.starts_with("/keys/") {
        return match *req.method() {
            _ if read => json(keys::serve(&gw, req.method(), path, req.uri().query()).await),
            Method::DELETE => match authorize(&gw, &req) {
                None => json(keys::serve(&gw, req.method(), path, req.uri().query()).await),
                Some(denied) => denied,
            },
            _ => text(StatusCode::METHOD_NOT_ALLOWED, "GET or DELETE only\n"),
        };
    }
    if path == "/queue" || path.starts_with("/queue/") {
        let (method, query) = (req.method().clone(), req.uri().query());
        return match method {
            _ if read => json(queue::serve(&gw, &method, path, query).await),
            Method::POST | Method::DELETE => match authorize(&gw, &req) {
                None => json(queue::serve(&gw, &method, path, query).await),
                Some(denied) => denied,
            },
            _ => text(StatusCode::METHOD_NOT_ALLOWED, "GET, POST or DELETE only\n"),
        };
    }
    match (path, read) {
        ("/healthz" | "/livez", true) => text(StatusCode::OK, "ok\n"),
        ("/readyz", true) if gw.is_ready() => text(StatusCode::OK, "ready\n"),
        ("/readyz", true) => text(StatusCode::SERVICE_UNAVAILABLE, "not ready\n"),
        ("/metrics", true) => {
            let format = crate::metrics::Format::negotiate(req.headers());
            queue::refresh_metrics(&gw).await;
            let body = gw.render_metrics(format);
            let mut response = Response::new(Body::full(body));
            response
                .headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static(format.content_type()));
            response
        }
        ("/reload", false) if req.method() == Method::POST => match authorize(&gw, &req) {
            None => {
                tracing::info!("admin: POST /reload");
                reload(gw, reloader).await
            }
            Some(denied) => denied,
        },
        ("/healthz" | "/livez" | "/readyz" | "/metrics", false) => text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n"),
        ("/reload", _) => text(StatusCode::METHOD_NOT_ALLOWED, "POST only\n"),
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    }
}

async fn reload(gw: Arc<Gateway>, reloader: Option<Arc<Reloader>>) -> Response<Body> {
    let Some(reloader) = reloader else {
        return text(StatusCode::NOT_FOUND, "not started from a config file\n");
    };
    match Reloader::reload_blocking(reloader, gw).await {
        Ok(done) if done.needs_restart.is_empty() => {
            let tls = if done.new_certificate {
                "; a new TLS certificate is served"
            } else {
                ""
            };
            text(StatusCode::OK, format!("reloaded {} route(s){tls}\n", done.routes))
        }
        Ok(done) => text(
            StatusCode::OK,
            format!(
                "reloaded {} route(s); changes to [{}] take effect after a restart\n",
                done.routes,
                done.needs_restart.join("], [")
            ),
        ),
        Err(problems) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("reload failed, nothing changed: {problems}\n"),
        ),
    }
}

/// With `admin_token_env` set: the request must carry `Authorization: Bearer <token>`.
/// The comparison takes the same time wherever the tokens differ (both are hashed
/// first, then every byte is compared), so timing tells nothing about the token.
/// `None` when authorised, else the 401 to send.
fn authorize(gw: &Gateway, req: &Request<Incoming>) -> Option<Response<Body>> {
    let Some(expected) = &gw.admin_token else {
        return None;
    };
    let offered = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim_start().split_once(' '))
        // The scheme is case-insensitive (RFC 9110, 11.1).
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim());
    if offered.is_some_and(|token| same_secret(token, expected.expose())) {
        return None;
    }
    tracing::warn!(
        method = %req.method(),
        path = req.uri().path(),
        token_sent = offered.is_some(),
        "admin: refused, no valid bearer token"
    );
    let mut denied = text(
        StatusCode::UNAUTHORIZED,
        "this endpoint needs Authorization: Bearer <token> (server.admin_token_env)\n",
    );
    denied
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    Some(denied)
}

fn same_secret(a: &str, b: &str) -> bool {
    use sha2::{Digest, Sha256};
    let (a, b) = (Sha256::digest(a.as_bytes()), Sha256::digest(b.as_bytes()));
    a.iter().zip(b.iter()).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

fn json(reply: keys::Reply) -> Response<Body> {
    let mut body = reply.body.to_string();
    body.push('\n');
    let mut response = Response::new(Body::full(body));
    *response.status_mut() = reply.status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn text(status: StatusCode, body: impl Into<bytes::Bytes>) -> Response<Body> {
    let mut response = Response::new(Body::full(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}
