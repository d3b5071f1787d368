//! The leanest reverse proxy hyper 1.x makes: no dedup, no key, no metrics, no timeouts,
//! bodies streamed through. The gateway's runtime layout (a current-thread runtime per
//! worker with its own `SO_REUSEPORT` listener, upstream connections kept per thread),
//! so `bench/run --bare` can show how much of the gap to nginx is the HTTP engine's and
//! how much the gateway's own work. A measuring tool, not a product: it forwards
//! everything, keeps no limits and answers 502 on any upstream error.
//!
//!   cargo run --release --features bench-tools --bin bare-proxy -- LISTEN UPSTREAM [WORKERS]
//!   e.g. bare-proxy 127.0.0.1:18094 127.0.0.1:18080 2

use std::cell::RefCell;
use std::convert::Infallible;
use std::net::SocketAddr;

use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, combinators::UnsyncBoxBody};
use hyper::body::{Bytes, Incoming};
use hyper::client::conn::http1::SendRequest;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpSocket, TcpStream};

type Body = UnsyncBoxBody<Bytes, hyper::Error>;

thread_local! {
    static IDLE: RefCell<Vec<SendRequest<Incoming>>> = const { RefCell::new(Vec::new()) };
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: bare-proxy LISTEN UPSTREAM [WORKERS]";
    let listen: SocketAddr = args.next().ok_or_else(|| anyhow::anyhow!(usage))?.parse()?;
    let upstream: SocketAddr = args.next().ok_or_else(|| anyhow::anyhow!(usage))?.parse()?;
    let workers: usize = args.next().map_or(Ok(2), |w| w.parse())?;
    let threads: Vec<_> = (0..workers)
        .map(|_| std::thread::spawn(move || worker(listen, upstream)))
        .collect();
    for thread in threads {
        thread.join().map_err(|_| anyhow::anyhow!("a worker panicked"))??;
    }
    Ok(())
}

fn worker(listen: SocketAddr, upstream: SocketAddr) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async move {
        let socket = TcpSocket::new_v4()?;
        socket.set_reuseaddr(true)?;
        socket.set_reuseport(true)?;
        socket.bind(listen)?;
        let listener = socket.listen(1024)?;
        loop {
            let (stream, _) = listener.accept().await?;
            stream.set_nodelay(true)?;
            tokio::spawn(async move {
                let service = service_fn(move |request| forward(request, upstream));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    })
}

async fn forward(request: Request<Incoming>, upstream: SocketAddr) -> Result<Response<Body>, Infallible> {
    // A connection whose last response body is still streaming is not ready yet.
    let kept = match IDLE.with_borrow_mut(Vec::pop) {
        Some(mut sender) => sender.ready().await.is_ok().then_some(sender),
        None => None,
    };
    let mut sender = match kept {
        Some(sender) => sender,
        None => match connect(upstream).await {
            Ok(sender) => sender,
            Err(_) => return Ok(bad_gateway()),
        },
    };
    match sender.send_request(request).await {
        Ok(response) => {
            IDLE.with_borrow_mut(|idle| idle.push(sender));
            Ok(response.map(BodyExt::boxed_unsync))
        }
        Err(_) => Ok(bad_gateway()),
    }
}

async fn connect(upstream: SocketAddr) -> std::io::Result<SendRequest<Incoming>> {
    let stream = TcpStream::connect(upstream).await?;
    stream.set_nodelay(true)?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(std::io::Error::other)?;
    tokio::spawn(connection);
    Ok(sender)
}

fn bad_gateway() -> Response<Body> {
    let mut response = Response::new(Empty::new().map_err(|e| match e {}).boxed_unsync());
    *response.status_mut() = StatusCode::BAD_GATEWAY;
    response
}
