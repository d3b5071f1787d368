//! The admin listener: `/healthz` and `/livez` (the process runs), `/readyz` (config
//! loaded, store answering, not draining), `/metrics` (Prometheus text) and
//! `POST /reload` (re-read the config file, as SIGHUP does).

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
use crate::reload::Reloader;
use crate::store::Store;

/// Serves the admin endpoints until the process exits (so `/readyz` can report the drain).
pub fn spawn(gw: Arc<Gateway>, listener: TcpListener) {
    tokio::spawn(async move {
        loop {
            let (stream, _) = match listener.accept().await {
                Ok(conn) => conn,
                Err(e) => {
                    tracing::warn!(error = %e, "admin accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            let gw = Arc::clone(&gw);
            tokio::spawn(async move {
                let service = service_fn(move |req| {
                    let gw = Arc::clone(&gw);
                    async move { Ok::<_, Infallible>(respond(gw, req).await) }
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

async fn respond(gw: Arc<Gateway>, req: Request<Incoming>) -> Response<Body> {
    let read = req.method() == Method::GET || req.method() == Method::HEAD;
    match (req.uri().path(), read) {
        ("/healthz" | "/livez", true) => text(StatusCode::OK, "ok\n"),
        ("/readyz", true) if gw.is_ready() => text(StatusCode::OK, "ready\n"),
        ("/readyz", true) => text(StatusCode::SERVICE_UNAVAILABLE, "not ready\n"),
        ("/metrics", true) => {
            gw.metrics.set_ready(gw.is_ready());
            let mut response = Response::new(Body::full(gw.metrics.render(gw.store.entries(), gw.store.bytes())));
            // The body is OpenMetrics text; labelled as the classic format, Prometheus
            // would parse it with the wrong parser and reject the whole scrape.
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static(crate::metrics::CONTENT_TYPE),
            );
            response
        }
        ("/reload", false) if req.method() == Method::POST => reload(gw).await,
        ("/healthz" | "/livez" | "/readyz" | "/metrics", false) => text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n"),
        ("/reload", _) => text(StatusCode::METHOD_NOT_ALLOWED, "POST only\n"),
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    }
}

async fn reload(gw: Arc<Gateway>) -> Response<Body> {
    let Some(reloader) = gw.reloader.get().map(Arc::clone) else {
        return text(StatusCode::NOT_FOUND, "not started from a config file\n");
    };
    match Reloader::reload_blocking(reloader, gw).await {
        Ok(done) if done.needs_restart.is_empty() => {
            text(StatusCode::OK, format!("reloaded {} route(s)\n", done.routes))
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

fn text(status: StatusCode, body: impl Into<bytes::Bytes>) -> Response<Body> {
    let mut response = Response::new(Body::full(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}
