//! A stand-in for a legacy webhook bot: listens where `gateway.toml`'s example route
//! points (127.0.0.1:5000, or the address given as the first argument), logs every
//! request it receives, and answers `{"reply":"got <n> bytes"}`.
//!
//! `cargo run --example echo-bot`, then POST to the gateway on :8080 and watch this
//! log: each message appears once, however often the sender retries.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

static RECEIVED: AtomicU64 = AtomicU64::new(0);

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:5000".to_owned());
    let listener = TcpListener::bind(&addr).await?;
    println!("echo-bot listening on http://{addr}");
    loop {
        let (stream, _) = listener.accept().await?;
        tokio::spawn(async move {
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service_fn(answer))
                .await;
        });
    }
}

async fn answer(req: Request<hyper::body::Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let (head, body) = req.into_parts();
    let body = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let n = RECEIVED.fetch_add(1, Ordering::Relaxed) + 1;
    println!(
        "#{n} {} {} ({} bytes): {}",
        head.method,
        head.uri,
        body.len(),
        String::from_utf8_lossy(&body)
    );
    let reply = format!("{{\"reply\":\"got {} bytes\"}}\n", body.len());
    let mut response = Response::new(Full::new(Bytes::from(reply)));
    response
        .headers_mut()
        .insert("content-type", "application/json".parse().expect("static header"));
    Ok(response)
}
