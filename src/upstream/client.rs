//! HTTP/1.1 to the upstream on one kept-alive connection: the request written with one
//! system call where it fits, the response head parsed straight out of the read buffer,
//! and the response body framed as RFC 9112 section 6 says ([`crate::h1::response`]
//! reads it; this file does the I/O). The pool ([`super::pool`]) lends connections
//! out and takes them back.
//!
//! The gateway's own rather than hyper's client connection: hyper drives each
//! connection from a task of its own, behind channels and a dispatcher, and parses the
//! response into a second buffer's worth of bookkeeping. Here the request's own task
//! writes and reads, and a small response (the common webhook answer) is read whole
//! with its head, so its connection is back in the pool before the answer is written.
//! On `bench/bare-proxy.rs` (the leanest hyper proxy) that cut the instructions per
//! forwarded request from 28,168 to 19,569 (callgrind, one worker, c=1) and its CPU per
//! request by 11%.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Bytes, BytesMut};
use http::header;
use http::uri::Authority;
use http::{Method, Request, Response};
use http_body::{Body as _, Frame, SizeHint};
use http_body_util::BodyExt as _;
use tokio::io::AsyncWriteExt as _;
use tokio::net::TcpStream;

use crate::body::{Body, BodyError};
use crate::h1::response::{self, BodyFraming, Head, Step};
use crate::h1::{Invalid, MAX_HEAD};
/// Free room kept in the read buffer before each read.
const READ_ROOM: usize = 8 * 1024;
/// A request body up to this size is copied behind its head and written with it.
const COALESCE: usize = 16 * 1024;
/// The most room for the request kept by a connection between requests.
const KEPT_OUT: usize = 4 * 1024;

/// Why an exchange on a connection failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("writing the request failed: {0}")]
    Write(#[source] io::Error),
    #[error("reading the response failed: {0}")]
    Read(#[source] io::Error),
    #[error("the upstream closed the connection without an answer")]
    Closed,
    #[error("invalid response from the upstream: {0}")]
    Invalid(#[from] Invalid),
    #[error("the request body broke: {0}")]
    RequestBody(#[source] BodyError),
}

/// How far a request got when writing it failed.
pub enum WriteFailure {
    /// Not a byte was written: the request may be sent on another connection.
    Unsent(Error),
    /// Some of it may have reached the upstream: it must not be sent again.
    Partial(Error),
    /// The upstream began its final answer before the body was all written (a 413 for
    /// a body it will not read): writing stopped, the answer is the one to pass on, and
    /// the connection is not reused.
    Answered,
}

/// One open connection to an upstream, between exchanges: its read buffer is empty.
pub struct Conn {
    /// The upstream it goes to (the pool's key).
    authority: Authority,
    stream: TcpStream,
    /// A second handle on the socket, to look for the upstream's close without taking
    /// bytes (see [`Conn::still_open`]).
    probe: std::net::TcpStream,
    buf: BytesMut,
    /// The request head being written (kept for its capacity).
    out: Vec<u8>,
}

impl Conn {
    pub fn new(authority: Authority, stream: TcpStream, probe: std::net::TcpStream) -> Self {
        Conn {
            authority,
            stream,
            probe,
            buf: BytesMut::new(),
            out: Vec::new(),
        }
    }

    pub fn authority(&self) -> &Authority {
        &self.authority
    }

    /// False if the upstream closed the connection (or sent something unasked, which
    /// only a server about to close does): a peek at the socket, a system call.
    pub fn still_open(&self) -> bool {
        match self.probe.peek(&mut [0u8; 1]) {
            Err(e) => e.kind() == io::ErrorKind::WouldBlock,
            Ok(_) => false,
        }
    }

    /// False if the runtime already saw the socket readable and a read finds it closed
    /// (or finds bytes nobody asked for). No system call unless the runtime saw an
    /// event since the last read, or that read filled the buffer.
    pub fn not_seen_closed(&mut self) -> bool {
        match self.stream.try_read_buf(&mut self.buf) {
            Err(e) => e.kind() == io::ErrorKind::WouldBlock,
            Ok(_) => false,
        }
    }

    /// Writes `request` (origin-form URI, Host set). Its body is read from as it is
    /// written; a body with no announced length goes out chunked.
    pub async fn write_request(&mut self, request: &mut Request<Body>) -> Result<(), WriteFailure> {
        let framing = request_framing(request);
        encode_head(&mut self.out, request, framing);
        let written = if let Body::Full(Some(bytes)) = request.body()
            && bytes.len() <= COALESCE
        {
            self.out.extend_from_slice(bytes);
            write_first(&mut self.stream, &self.out).await
        } else {
            match write_first(&mut self.stream, &self.out).await {
                Ok(()) => self.write_body_unless_answered(request.body_mut(), framing).await,
                unsent => unsent,
            }
        };
        if self.out.capacity() > KEPT_OUT {
            self.out = Vec::new(); // a large body's room is not kept by an idle connection
        }
        written
    }

    /// Writes the body, unless the upstream's final answer begins to arrive first:
    /// then writing stops, as an upstream that answered may never read the rest.
    async fn write_body_unless_answered(&mut self, body: &mut Body, framing: Framing) -> Result<(), WriteFailure> {
        let (mut read, mut write) = self.stream.split();
        tokio::select! {
            // The write first: a body all written is a request whose answer may
            // already be in.
            biased;
            written = write_body(&mut write, &mut self.out, body, framing) => written.map_err(WriteFailure::Partial),
            () = answer_begins(&mut read, &mut self.buf) => Err(WriteFailure::Answered),
        }
    }

    /// Reads the response to a request just written. A body that was read with the
    /// head (or has none) comes whole, and the connection goes back through `reuse` at
    /// once if it can carry another request; a longer one streams, and the connection
    /// goes back when its end was read.
    pub async fn read_response(self, head_request: bool, reuse: Reuse) -> Result<Response<Body>, Error> {
        self.read_response_or(head_request, reuse, None).await
    }

    /// After writing the request broke off: the upstream may have answered before it
    /// stopped reading (a 413 for a body it did not want). That answer, if it came, is
    /// the one to pass on; else the write's failure. The connection is not reused.
    pub async fn read_response_after(self, head_request: bool, failed: Error) -> Result<Response<Body>, Error> {
        // A connection whose request broke off is closed, never reused: it is dropped here.
        self.read_response_or(head_request, |_closed| {}, Some(failed)).await
    }

    async fn read_response_or(
        mut self,
        head_request: bool,
        reuse: Reuse,
        mut failed: Option<Error>,
    ) -> Result<Response<Body>, Error> {
        let Head {
            response,
            framing,
            reusable,
        } = loop {
            if let Some(head) = response::parse_head(&mut self.buf, head_request)? {
                break head;
            }
            if self.buf.len() >= MAX_HEAD {
                return Err(Error::Invalid(Invalid("response head too large")));
            }
            let mut read = std::pin::pin!(std::future::poll_fn(|cx| self.poll_fill(cx)));
            match read.as_mut().await {
                Ok(0) if self.buf.is_empty() => return Err(failed.take().unwrap_or(Error::Closed)),
                Ok(0) => return Err(Error::Invalid(Invalid("closed within the response head"))),
                Ok(_) => {}
                Err(e) => return Err(failed.take().unwrap_or(Error::Read(e))),
            }
        };
        let body = match framing {
            BodyFraming::Length(n) if self.buf.len() as u64 >= n => {
                // `n` fits: it is at most the buffer's length.
                let bytes = self.buf.split_to(n as usize).freeze();
                self.finish(reusable, reuse);
                Body::full(bytes)
            }
            framing => Body::upstream(Streaming {
                conn: Some(self),
                framing,
                reusable,
                reuse,
            }),
        };
        let (head, ()) = response.into_parts();
        Ok(Response::from_parts(head, body))
    }

    /// Reads more into the buffer: the byte count, 0 at the end of the stream.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.buf.capacity() - self.buf.len() < READ_ROOM / 8 {
            self.buf.reserve(READ_ROOM);
        }
        tokio_util::io::poll_read_buf(Pin::new(&mut self.stream), cx, &mut self.buf)
    }

    /// The response was read to its end: back to the pool if it can carry another.
    fn finish(self, reusable: bool, reuse: Reuse) {
        // Bytes after the response: the upstream answered something not asked.
        if reusable && self.buf.is_empty() {
            reuse(self);
        }
    }
}

/// Where a connection goes when its response was read to the end.
pub type Reuse = fn(Conn);

/// Writes a request body; a body with no announced length goes out chunked.
async fn write_body(
    stream: &mut tokio::net::tcp::WriteHalf<'_>,
    out: &mut Vec<u8>,
    body: &mut Body,
    framing: Framing,
) -> Result<(), Error> {
    let chunked = matches!(framing, Framing::Chunked);
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(Error::RequestBody)?.into_data() else {
            continue; // trailers are not forwarded
        };
        if data.is_empty() {
            continue;
        }
        if chunked {
            // One write per chunk: its size line, data and CRLF together.
            out.clear();
            out.extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
            out.extend_from_slice(&data);
            out.extend_from_slice(b"\r\n");
            stream.write_all(out).await.map_err(Error::Write)?;
        } else {
            stream.write_all(&data).await.map_err(Error::Write)?;
        }
    }
    if chunked {
        stream.write_all(b"0\r\n\r\n").await.map_err(Error::Write)?;
    }
    Ok(())
}

/// Ends once the upstream's final answer has begun to arrive in `buf`, or the
/// connection ended. Interim 1xx answers (a `100 Continue`) do not count; they stay in
/// `buf` for the response's reader to skip.
async fn answer_begins(read: &mut tokio::net::tcp::ReadHalf<'_>, buf: &mut BytesMut) {
    loop {
        // Unbounded interim answers would fill memory: the reader refuses what is over.
        if buf.len() >= MAX_HEAD || response::final_answer_begun(buf) || read.readable().await.is_err() {
            return;
        }
        match read.try_read_buf(buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Ok(0) | Err(_) => return, // what came is read as the answer, or its absence
            Ok(_) => {}
        }
    }
}

/// Writes `bytes`, telling a failure before any byte went out from one after.
async fn write_first(stream: &mut TcpStream, bytes: &[u8]) -> Result<(), WriteFailure> {
    let written = match stream.write(bytes).await {
        Ok(0) => return Err(WriteFailure::Unsent(Error::Write(io::ErrorKind::WriteZero.into()))),
        Ok(n) => n,
        Err(e) => return Err(WriteFailure::Unsent(Error::Write(e))),
    };
    stream
        .write_all(&bytes[written..])
        .await
        .map_err(|e| WriteFailure::Partial(Error::Write(e)))
}

/// How a request body is delimited on the wire.
#[derive(Clone, Copy)]
enum Framing {
    None,
    Length(u64),
    Chunked,
}

fn request_framing(request: &Request<Body>) -> Framing {
    let body = request.body();
    if body.is_end_stream() {
        // An empty body: announced as such where one is expected or was announced.
        let expected = matches!(*request.method(), Method::POST | Method::PUT | Method::PATCH);
        return if expected || request.headers().contains_key(header::CONTENT_LENGTH) {
            Framing::Length(0)
        } else {
            Framing::None
        };
    }
    match body.size_hint().exact() {
        Some(n) => Framing::Length(n),
        None => Framing::Chunked,
    }
}

fn encode_head(out: &mut Vec<u8>, request: &Request<Body>, framing: Framing) {
    out.clear();
    out.extend_from_slice(request.method().as_str().as_bytes());
    out.push(b' ');
    let target = request.uri().path_and_query().map_or("/", |p| p.as_str());
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in request.headers() {
        // The body's framing is written below, from the body itself.
        if name == header::CONTENT_LENGTH || name == header::TRANSFER_ENCODING {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    match framing {
        Framing::None => {}
        Framing::Length(n) => {
            out.extend_from_slice(b"content-length: ");
            out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        Framing::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
    }
    out.extend_from_slice(b"\r\n");
}

/// A response body still arriving on its connection, which goes back to the pool when
/// the end was read (and is closed if the body is dropped before).
struct Streaming {
    conn: Option<Conn>,
    framing: BodyFraming,
    reusable: bool,
    reuse: Reuse,
}

impl std::fmt::Debug for Streaming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Streaming")
            .field("framing", &self.framing)
            .finish_non_exhaustive()
    }
}

impl Streaming {
    /// The body was read to its end.
    fn end(&mut self) {
        if let Some(conn) = self.conn.take() {
            conn.finish(self.reusable, self.reuse);
        }
    }
}

impl http_body::Body for Streaming {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let this = self.get_mut();
        loop {
            let Some(conn) = this.conn.as_mut() else {
                return Poll::Ready(None);
            };
            match this.framing.step(&mut conn.buf) {
                Ok(Step::Data(bytes)) => {
                    // The last bytes of a sized body: the connection goes back now, as
                    // hyper need not poll a body again once it says it has ended.
                    if this.framing.ended() {
                        this.end();
                    }
                    return Poll::Ready(Some(Ok(Frame::data(bytes))));
                }
                Ok(Step::End) => {
                    this.end();
                    return Poll::Ready(None);
                }
                Ok(Step::NeedMore) => {}
                Err(Invalid(what)) => {
                    this.conn = None;
                    return Poll::Ready(Some(Err(io::Error::new(io::ErrorKind::InvalidData, what))));
                }
            }
            match ready!(conn.poll_fill(cx)) {
                Ok(0) if matches!(this.framing, BodyFraming::Close) => {
                    this.conn = None; // the end of the body; the connection cannot carry another
                    return Poll::Ready(None);
                }
                Ok(0) => {
                    this.conn = None;
                    return Poll::Ready(Some(Err(io::ErrorKind::UnexpectedEof.into())));
                }
                Ok(_) => {}
                Err(e) => {
                    this.conn = None;
                    return Poll::Ready(Some(Err(e)));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.conn.is_none() || self.framing.ended()
    }

    fn size_hint(&self) -> SizeHint {
        if self.conn.is_none() {
            return SizeHint::with_exact(0);
        }
        self.framing.size_hint()
    }
}
