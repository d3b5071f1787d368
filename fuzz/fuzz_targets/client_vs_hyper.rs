//! Differential: the upstream client's response reading against hyper's own client.
//!
//! The gateway reads the bot's answers with its own HTTP/1.1 client
//! (`dedup_gateway::h1::response`: the head parsed out of the read buffer, the body
//! framed by RFC 9112 section 6.3; `upstream::client` fills the buffer as it does here).
//! A framing slip there would hand one request's answer to another on a kept-alive
//! connection, or store a wrong reply for `replay`. So the same byte stream, arriving
//! in reads split where the fuzzer says, is read by that code and by hyper's client
//! (`hyper::client::conn::http1`) after one request, and both must agree on:
//! - whether there is an answer at all, and its status, version, reason phrase and
//!   end-to-end header fields (the gateway leaves hop-by-hop fields out, and a
//!   Content-Length beside Transfer-Encoding, as RFC 9110 and 9112 say; they are
//!   taken out of hyper's answer before comparing);
//! - the body's bytes, and whether it ended well or broke;
//! - whether the connection could carry the next request.
//!
//! Where the two differ by design, the difference is named below (`allowed`).
//!
//! Input: byte 0: bit 0 = the request was a HEAD; bits 4..8 = n, then n read sizes
//! (each byte + 1, used in turn); the rest is the stream. n = 0: one read.
//!
//! Everything runs on the calling thread; hyper's connection is polled by hand until it
//! waits for bytes that will not come, then the stream ends.

#![no_main]

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use bytes::{Bytes, BytesMut};
use dedup_gateway::h1::response::{self, BodyFraming, Step};
use dedup_gateway::h1::{MAX_HEAD, hop_by_hop};
use http::header::{self, HeaderMap};
use http::{Method, Request, StatusCode, Version};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// How one side read the stream.
#[derive(Debug, PartialEq)]
enum Read {
    /// No answer: the head was refused, or the stream ended before it.
    NoAnswer,
    Answer {
        status: StatusCode,
        version: Version,
        reason: Option<Vec<u8>>,
        headers: Vec<(String, Vec<u8>)>,
        /// The body, or `None` if it broke.
        body: Option<Bytes>,
        /// Whether the connection could carry the next request.
        reusable: bool,
    },
}

// ---------------------------------------------------------------- the gateway's client

/// What `upstream::client::Conn` does with its read buffer, over scripted reads.
fn ours(mut reads: VecDeque<Vec<u8>>, head_request: bool) -> Read {
    let mut buf = BytesMut::new();
    let head = loop {
        match response::parse_head(&mut buf, head_request) {
            Err(_) => return Read::NoAnswer,
            Ok(Some(head)) => break head,
            Ok(None) if buf.len() >= MAX_HEAD => return Read::NoAnswer,
            Ok(None) => match reads.pop_front() {
                Some(piece) => buf.extend_from_slice(&piece),
                None => return Read::NoAnswer,
            },
        }
    };
    let mut framing = head.framing;
    let mut body = BytesMut::new();
    let ended_well = loop {
        match framing.step(&mut buf) {
            Err(_) => break false,
            Ok(Step::Data(data)) => body.extend_from_slice(&data),
            Ok(Step::End) => break true,
            Ok(Step::NeedMore) => match reads.pop_front() {
                Some(piece) => buf.extend_from_slice(&piece),
                // The end of the stream ends a body that runs to it, and breaks any other.
                None => break matches!(framing, BodyFraming::Close),
            },
        }
    };
    // `Conn::finish`: reused only if nothing came after the answer (and, here, nothing
    // more is on its way: hyper would read that too, and close).
    let reusable = ended_well
        && !matches!(framing, BodyFraming::Close)
        && head.reusable
        && buf.is_empty()
        && reads.is_empty();
    let (parts, ()) = head.response.into_parts();
    Read::Answer {
        status: parts.status,
        version: parts.version,
        reason: parts.extensions.get::<hyper::ext::ReasonPhrase>().map(|r| r.as_bytes().to_vec()),
        headers: fields(&parts.headers),
        body: ended_well.then(|| body.freeze()),
        reusable,
    }
}

/// The fields by name (stably: the lines of one name keep their order), since removing
/// a field reorders a `HeaderMap`.
fn fields(headers: &HeaderMap) -> Vec<(String, Vec<u8>)> {
    let mut fields: Vec<_> = headers
        .iter()
        .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
        .collect();
    fields.sort_by(|a, b| a.0.cmp(&b.0));
    fields
}

// ---------------------------------------------------------------- hyper's client

/// The scripted connection: reads take the next piece; after the last one they wait,
/// or (`ended`) see the end of the stream; writes (the request) are dropped. Nothing is
/// read before the request is written: an upstream does not answer before it is asked
/// (and hyper refuses bytes that come first as a message nobody asked for).
#[derive(Default)]
struct Wire {
    pieces: VecDeque<Vec<u8>>,
    ended: bool,
    asked: bool,
}

#[derive(Clone, Default)]
struct Conn(Rc<RefCell<Wire>>);

impl AsyncRead for Conn {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let mut wire = self.0.borrow_mut();
        if !wire.asked {
            cx.waker().wake_by_ref(); // polled again once the request is written
            return Poll::Pending;
        }
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
            None => Poll::Pending,
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        self.0.borrow_mut().asked = true;
        Poll::Ready(Ok(data.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

struct Flag(AtomicBool);

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Polls the connection and `fut` by turns until `fut` is done, or neither can go on.
fn drive<C: Future, F: Future>(conn: &mut Pin<Box<C>>, conn_done: &mut bool, mut fut: Pin<&mut F>) -> Option<F::Output> {
    let flag = Arc::new(Flag(AtomicBool::new(false)));
    let waker = Waker::from(Arc::clone(&flag));
    let mut cx = Context::from_waker(&waker);
    for _ in 0..100_000 {
        flag.0.store(false, Ordering::SeqCst);
        if !*conn_done && conn.as_mut().poll(&mut cx).is_ready() {
            *conn_done = true;
        }
        if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
            return Some(out);
        }
        if !flag.0.load(Ordering::SeqCst) {
            return None;
        }
    }
    panic!("hyper keeps waking itself without progress");
}

fn hypers(reads: VecDeque<Vec<u8>>, head_request: bool) -> Read {
    let wire = Conn::default();
    wire.0.borrow_mut().pieces = reads;
    let mut handshake = Box::pin(hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(TokioIo::new(
        wire.clone(),
    )));
    let Some(Ok((mut sender, conn))) = drive(&mut Box::pin(std::future::pending::<()>()), &mut true, handshake.as_mut())
    else {
        panic!("the handshake needs no I/O");
    };
    let mut conn = Box::pin(conn);
    let mut conn_done = false;
    let method = if head_request { Method::HEAD } else { Method::GET };
    let request = Request::builder()
        .method(method)
        .uri("/hook")
        .header(header::HOST, "bot")
        .body(Empty::new())
        .expect("request");
    let mut sent = Box::pin(sender.send_request(request));
    // A stream that waits before the answer is complete: then it ends.
    let answer = match drive(&mut conn, &mut conn_done, sent.as_mut()) {
        Some(answer) => answer,
        None => {
            wire.0.borrow_mut().ended = true;
            drive(&mut conn, &mut conn_done, sent.as_mut()).expect("the end of the stream ends the exchange")
        }
    };
    let answer = match answer {
        Ok(answer) => answer,
        Err(e) => {
            if std::env::var_os("CLIENT_DEBUG").is_some() {
                eprintln!("hyper: {e:?}");
            }
            return Read::NoAnswer;
        }
    };
    let (parts, mut incoming) = answer.into_parts();
    let mut body = BytesMut::new();
    let mut ended_well = true;
    loop {
        let mut frame = Box::pin(incoming.frame());
        let next = match drive(&mut conn, &mut conn_done, frame.as_mut()) {
            Some(next) => next,
            None => {
                wire.0.borrow_mut().ended = true;
                drive(&mut conn, &mut conn_done, frame.as_mut()).expect("the end of the stream ends the body")
            }
        };
        match next {
            None => break,
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    body.extend_from_slice(&data);
                }
            }
            Some(Err(_)) => {
                ended_well = false;
                break;
            }
        }
    }
    // Whether hyper keeps the connection for another request: let it run on what is
    // left of the stream (it reads ahead when idle), without ending the stream.
    let mut idle = Box::pin(std::future::pending::<()>());
    let _ = drive(&mut conn, &mut conn_done, idle.as_mut());
    let reusable = ended_well && !conn_done && !sender.is_closed() && sender.is_ready();
    let mut headers = parts.headers;
    normalise(&mut headers);
    Read::Answer {
        status: parts.status,
        version: parts.version,
        reason: parts.extensions.get::<hyper::ext::ReasonPhrase>().map(|r| r.as_bytes().to_vec()),
        headers: fields(&headers),
        body: ended_well.then(|| body.freeze()),
        reusable,
    }
}

/// hyper's answer as the gateway passes it on: without hop-by-hop fields (and those
/// `Connection` names), and without a Content-Length beside Transfer-Encoding.
fn normalise(headers: &mut HeaderMap) {
    let te = headers.contains_key(header::TRANSFER_ENCODING);
    let named: Vec<String> = headers
        .get_all(header::CONNECTION)
        .iter()
        .flat_map(|line| hop_by_hop::other_names(line).map(str::to_ascii_lowercase).collect::<Vec<_>>())
        .collect();
    hop_by_hop::strip_hop_by_hop(headers);
    for name in named {
        headers.remove(name.as_str());
    }
    if te {
        headers.remove(header::CONTENT_LENGTH);
    }
}

// ---------------------------------------------------------------- the comparison

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

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let head_request = flags & 1 == 1;
    let n = usize::from(flags >> 4).min(rest.len());
    let (sizes, stream) = rest.split_at(n);
    if stream.is_empty() {
        return;
    }
    let script = pieces(stream, sizes);
    let (ours, hypers) = (ours(script.clone(), head_request), hypers(script, head_request));
    if ours != hypers && !allowed(&ours, &hypers) {
        panic!(
            "the client and hyper read {:?} differently:\n ours:  {ours:?}\n hyper: {hypers:?}",
            String::from_utf8_lossy(stream)
        );
    }
});

/// Differences by design.
fn allowed(ours: &Read, hypers: &Read) -> bool {
    match (ours, hypers) {
        // The gateway asks for no upgrade, so a 101 is no answer it can pass on (hyper
        // hands the connection over to the caller).
        (Read::NoAnswer, Read::Answer { status, .. }) if *status == StatusCode::SWITCHING_PROTOCOLS => true,
        // The gateway may close a connection that hyper would keep: after an HTTP/1.0
        // answer, one with both Transfer-Encoding and Content-Length (RFC 9112 section
        // 6.3: "ought to be handled as an error"), or one whose `Connection` field says
        // `close` among bytes that are not text. That costs a new connection, never a
        // wrong answer. The reverse (reusing what hyper would not) is never allowed.
        (Read::Answer { reusable: false, .. }, Read::Answer { reusable: true, .. }) => same_but_reuse(ours, hypers),
        _ => false,
    }
}

/// Equal in everything but `reusable`.
fn same_but_reuse(a: &Read, b: &Read) -> bool {
    match (a, b) {
        (
            Read::Answer { status, version, reason, headers, body, .. },
            Read::Answer {
                status: s2,
                version: v2,
                reason: r2,
                headers: h2,
                body: b2,
                ..
            },
        ) => status == s2 && version == v2 && reason == r2 && headers == h2 && body == b2,
        _ => false,
    }
}
