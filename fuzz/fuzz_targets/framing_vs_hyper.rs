//! Differential: the framing guard against hyper itself.
//!
//! The same byte stream, arriving in reads split where the fuzzer says, is served by
//! hyper's HTTP/1 server alone and by hyper behind `FramingGuard` (the prefix handed
//! over as the listener does: the first read). A service records each request's
//! method, target, version, headers and body. Both must see the same requests, except
//! that where the guard breaks a head framed by both Content-Length and
//! Transfer-Encoding, guarded hyper stops before that request and answers 400.
//!
//! The guard's own verdicts are checked against what hyper did: each request hyper
//! delivered is the head the guard followed at that place (same method and target,
//! same framing), and a request that hyper handled with both framings (it then keeps
//! Transfer-Encoding and closes the connection after answering) is one the guard broke.
//!
//! Input: byte 0 = n (mod 16), then n read sizes (each byte + 1, used in turn); the
//! rest is the stream. n = 0: the stream in one read.
//!
//! Everything runs on the calling thread: the connection future is polled by hand until
//! it waits for bytes that will not come (the stream is scripted: a read takes the next
//! piece, and after the last one waits), then the stream ends and it is polled to
//! completion. No runtime, no timers, no scheduling: a run is deterministic.

#![no_main]

use std::cell::RefCell;
use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

use bytes::Bytes;
use dedup_gateway::inbound::guard::{FramingGuard, Verdict};
use http::{HeaderMap, Request, Response};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The scripted connection: reads take the next piece; writes are kept.
#[derive(Default)]
struct Wire {
    pieces: VecDeque<Vec<u8>>,
    ended: bool,
    written: Vec<u8>,
}

#[derive(Clone, Default)]
struct Conn(Rc<RefCell<Wire>>);

impl AsyncRead for Conn {
    fn poll_read(self: Pin<&mut Self>, _: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let mut wire = self.0.borrow_mut();
        match wire.pieces.pop_front() {
            Some(mut piece) => {
                let n = piece.len().min(buf.remaining());
                buf.put_slice(&piece[..n]);
                if n < piece.len() {
                    wire.pieces.push_front(piece.split_off(n));
                }
                Poll::Ready(Ok(()))
            }
            None if wire.ended => Poll::Ready(Ok(())),
            None => Poll::Pending, // nobody wakes us: the driver notices the stall
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        self.0.borrow_mut().written.extend_from_slice(data);
        Poll::Ready(Ok(data.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// What the service saw of one request.
#[derive(Debug, PartialEq)]
struct Seen {
    method: String,
    target: String,
    version: http::Version,
    headers: HeaderMap,
    /// The body, or that reading it failed.
    body: Option<Bytes>,
}

#[derive(Debug, PartialEq)]
struct Answer {
    status: u16,
    closes: bool,
}

struct Run {
    seen: Vec<Seen>,
    answers: Vec<Answer>,
}

struct Flag(AtomicBool);

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Polls `fut` until it completes (true) or waits without having been woken (false).
fn drive<F: Future>(mut fut: Pin<&mut F>) -> bool {
    let flag = Arc::new(Flag(AtomicBool::new(false)));
    let waker = Waker::from(Arc::clone(&flag));
    let mut cx = Context::from_waker(&waker);
    for _ in 0..1_000_000 {
        flag.0.store(false, Ordering::SeqCst);
        if fut.as_mut().poll(&mut cx).is_ready() {
            return true;
        }
        if !flag.0.load(Ordering::SeqCst) {
            return false;
        }
    }
    panic!("the connection keeps waking itself without progress");
}

fn serve<T: AsyncRead + AsyncWrite + Unpin>(io: T, wire: &Conn) -> Run {
    let seen = Rc::new(RefCell::new(Vec::new()));
    let log = Rc::clone(&seen);
    let service = service_fn(move |req: Request<Incoming>| {
        let log = Rc::clone(&log);
        async move {
            let (parts, body) = req.into_parts();
            let body = body.collect().await.ok().map(|b| b.to_bytes());
            log.borrow_mut().push(Seen {
                method: parts.method.to_string(),
                target: parts.uri.to_string(),
                version: parts.version,
                headers: parts.headers,
                body,
            });
            Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
        }
    });
    let mut conn = Box::pin(http1::Builder::new().serve_connection(TokioIo::new(io), service));
    if !drive(conn.as_mut()) {
        wire.0.borrow_mut().ended = true;
        assert!(drive(conn.as_mut()), "the connection ends with the stream");
    }
    drop(conn);
    let answers = answers(&wire.0.borrow().written);
    let seen = Rc::try_unwrap(seen).expect("service dropped").into_inner();
    Run { seen, answers }
}

/// The responses in `bytes` (all with `Content-Length`; 1xx skipped).
fn answers(mut bytes: &[u8]) -> Vec<Answer> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let mut fields = [httparse::EMPTY_HEADER; 32];
        let mut resp = httparse::Response::new(&mut fields);
        let httparse::Status::Complete(n) = resp.parse(bytes).expect("hyper writes valid responses") else {
            panic!("a partial response: {:?}", String::from_utf8_lossy(bytes));
        };
        let field = |name: &str| {
            resp.headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case(name))
                .map(|h| String::from_utf8_lossy(h.value).to_ascii_lowercase())
        };
        let length: usize = field("content-length").map_or(0, |v| v.parse().expect("length"));
        let status = resp.code.expect("status");
        let closes = field("connection").is_some_and(|v| v.contains("close"));
        bytes = &bytes[(n + length).min(bytes.len())..];
        if status >= 200 {
            out.push(Answer { status, closes });
        }
    }
    out
}

fn pieces(stream: &[u8], sizes: &[u8]) -> VecDeque<Vec<u8>> {
    if sizes.is_empty() {
        return VecDeque::from([stream.to_vec()]);
    }
    let mut out = VecDeque::new();
    let mut rest = stream;
    for &size in sizes.iter().cycle() {
        if rest.is_empty() {
            break;
        }
        let n = (usize::from(size) + 1).min(rest.len());
        out.push_back(rest[..n].to_vec());
        rest = &rest[n..];
    }
    out
}

type Verdicts = Arc<Mutex<Vec<(Verdict, Option<(String, String)>)>>>;

fn stats() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("FRAMING_STATS").is_some())
}

fn target_of(path: &str) -> Option<String> {
    http::Uri::try_from(path).ok().map(|u| u.to_string())
}

fuzz_target!(|data: &[u8]| {
    let Some((&n, rest)) = data.split_first() else {
        return;
    };
    let n = usize::from(n % 16).min(rest.len());
    let (sizes, stream) = rest.split_at(n);
    if stream.is_empty() {
        return;
    }
    let script = pieces(stream, sizes);

    // hyper alone.
    let wire = Conn::default();
    wire.0.borrow_mut().pieces = script.clone();
    let alone = serve(wire.clone(), &wire);

    // hyper behind the guard; the first read is the prefix, as the listener sniffs it.
    let wire = Conn::default();
    let mut rest = script;
    let prefix = Bytes::from(rest.pop_front().unwrap_or_default());
    wire.0.borrow_mut().pieces = rest;
    let verdicts: Verdicts = Arc::default();
    let log = Arc::clone(&verdicts);
    let guard = FramingGuard::with_observer(
        wire.clone(),
        prefix,
        Box::new(move |v, line| {
            let line = line.map(|(m, p)| (m.to_owned(), p.to_owned()));
            log.lock().expect("log").push((v, line));
        }),
    );
    let guarded = serve(guard, &wire);
    let verdicts = verdicts.lock().expect("log").clone();

    let (u, g) = (&alone.seen, &guarded.seen);
    if stats() {
        // FRAMING_STATS=1 with -runs=0: what a corpus exercises, one line per input.
        let kinds: Vec<String> = verdicts
            .iter()
            .map(|(v, _)| format!("{v:?}").chars().take_while(|c| c.is_alphabetic()).collect())
            .collect();
        eprintln!(
            "stats: verdicts={} alone={} guarded={}",
            kinds.join(","),
            u.len(),
            g.len()
        );
    }
    assert!(
        g.len() <= u.len(),
        "the guard let through a request hyper alone did not see"
    );
    assert_eq!(g[..], u[..g.len()], "the same requests, in order");

    // Each delivered request is the head the guard followed there.
    for (i, seen) in u.iter().enumerate() {
        let Some((verdict, line)) = verdicts.get(i) else {
            panic!("hyper read request {i} where the guard saw no head");
        };
        let (method, path) = line.as_ref().expect("a parsed head");
        assert_eq!(
            (method, target_of(path)),
            (&seen.method, Some(seen.target.clone())),
            "request {i}"
        );
        let te = seen.headers.contains_key(http::header::TRANSFER_ENCODING);
        match verdict {
            Verdict::Length(n) => {
                assert!(!te, "request {i}: hyper read a chunked body");
                if let Some(body) = &seen.body {
                    assert_eq!(body.len() as u64, *n, "request {i}: body length");
                }
            }
            Verdict::Chunked => assert!(te, "request {i}: the guard followed chunks"),
            Verdict::Ambiguous => {
                assert_eq!(i, g.len(), "request {i}: broken by the guard, yet delivered");
                assert!(te, "request {i}: both framings, as hyper saw it");
                assert_eq!(u.len(), i + 1, "hyper closes after a request with both framings");
            }
            other => panic!("request {i}: the guard said {other:?}, hyper accepted it"),
        }
    }

    // A request hyper took with both framings (it kept Transfer-Encoding and closed the
    // connection after it, though nothing else asked for that) is one the guard broke.
    for (i, seen) in u.iter().enumerate() {
        let closed = alone.answers.get(i).is_some_and(|a| a.closes);
        let other_reason = seen.version != http::Version::HTTP_11
            || seen.headers.contains_key(http::header::CONNECTION)
            || seen.headers.contains_key(http::header::UPGRADE)
            || seen.method == "CONNECT"
            || seen.body.is_none();
        if seen.headers.contains_key(http::header::TRANSFER_ENCODING) && closed && !other_reason {
            assert_eq!(
                verdicts[i].0,
                Verdict::Ambiguous,
                "request {i}: hyper saw both framings"
            );
        }
    }

    // Answers: the same for the requests both saw; then the guard's 400.
    for i in 0..g.len() {
        assert_eq!(
            guarded.answers.get(i).map(|a| a.status),
            alone.answers.get(i).map(|a| a.status)
        );
    }
    if g.len() < u.len() {
        let next = guarded.answers.get(g.len()).map(|a| a.status);
        assert_eq!(next, Some(400), "the broken head gets 400");
    }
});
