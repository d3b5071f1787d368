//! HTTP/1.1 to the upstream on one kept-alive connection: the request written with one
//! system call where it fits, the response head parsed straight out of the read buffer,
//! and the response body framed as RFC 9112 section 6 says. The pool ([`crate::pool`])
//! lends connections out and takes them back.
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
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::uri::Authority;
use http::{Method, Request, Response, StatusCode, Version};
use http_body::{Body as _, Frame, SizeHint};
use http_body_util::BodyExt as _;
use tokio::io::AsyncWriteExt as _;
use tokio::net::TcpStream;

use crate::body::{Body, BodyError};
use crate::proxy;

/// The most a response head may take: hyper's client's read buffer limit.
const MAX_HEAD: usize = 8192 + 4096 * 100;
/// The most header lines a response may have (hyper's limit).
const MAX_HEADERS: usize = 100;
/// A chunk-size or trailer line still without its end after this many bytes is
/// refused (one that arrives whole is taken: the read buffer bounds it).
const MAX_LINE: usize = 4096;
/// The most trailer bytes read (and dropped: trailers are not forwarded).
const MAX_TRAILERS: usize = 16 * 1024;
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
    Invalid(&'static str),
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
        let (response, framing, reusable) = loop {
            if let Some(head) = self.parse_head(head_request)? {
                break head;
            }
            if self.buf.len() >= MAX_HEAD {
                return Err(Error::Invalid("response head too large"));
            }
            let mut read = std::pin::pin!(std::future::poll_fn(|cx| self.poll_fill(cx)));
            match read.as_mut().await {
                Ok(0) if self.buf.is_empty() => return Err(failed.take().unwrap_or(Error::Closed)),
                Ok(0) => return Err(Error::Invalid("closed within the response head")),
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
            framing => Body::Upstream(Box::new(Streaming {
                conn: Some(self),
                framing,
                reusable,
                reuse,
            })),
        };
        let (head, ()) = response.into_parts();
        Ok(Response::from_parts(head, body))
    }

    /// Parses a complete head from the buffer (skipping interim 1xx responses), or
    /// `None` if it is not all in yet.
    fn parse_head(&mut self, head_request: bool) -> Result<Option<(Response<()>, BodyFraming, bool)>, Error> {
        loop {
            if self.buf.is_empty() {
                return Ok(None); // nothing read yet: the usual first look
            }
            // Uninitialised: httparse fills what it uses (100 headers written up front
            // cost more than the parse of a short head).
            let mut headers = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
            let mut parsed = httparse::Response::new(&mut []);
            let len = match httparse::ParserConfig::default().parse_response_with_uninit_headers(
                &mut parsed,
                &self.buf,
                &mut headers,
            ) {
                Ok(httparse::Status::Complete(len)) => len,
                Ok(httparse::Status::Partial) => return Ok(None),
                Err(httparse::Error::TooManyHeaders) => return Err(Error::Invalid("too many headers")),
                Err(_) => return Err(Error::Invalid("malformed response head")),
            };
            let code = parsed.code.unwrap_or(0);
            let version = if parsed.version == Some(0) {
                Version::HTTP_10
            } else {
                Version::HTTP_11
            };
            if (100..200).contains(&code) {
                if code == 101 {
                    return Err(Error::Invalid("101 Switching Protocols was not asked for"));
                }
                let _ = self.buf.split_to(len); // an interim answer: the final one follows
                continue;
            }
            let status = StatusCode::from_u16(code).map_err(|_| Error::Invalid("bad status code"))?;
            // Offsets into the buffer: the values become slices of it once it is frozen.
            let mut lines = [(0u32, 0u32, 0u32, 0u32); MAX_HEADERS];
            let base = self.buf.as_ptr() as usize;
            let count = parsed.headers.len();
            // httparse's slices lie within the buffer (an empty value too); checked
            // anyway, since a slice from elsewhere would be read as this one's bytes.
            let offset = |s: &[u8]| {
                (s.as_ptr() as usize)
                    .checked_sub(base)
                    .filter(|at| at + s.len() <= len)
                    .and_then(|at| u32::try_from(at).ok())
                    .ok_or(Error::Invalid("header outside the head"))
            };
            for (line, h) in lines.iter_mut().zip(parsed.headers.iter()) {
                *line = (
                    offset(h.name.as_bytes())?,
                    h.name.len() as u32,
                    offset(h.value)?,
                    h.value.len() as u32,
                );
            }
            // A reason the sender would not get from the status alone is kept (hyper's
            // server writes it back).
            let reason = parsed
                .reason
                .filter(|r| !r.is_empty() && Some(*r) != status.canonical_reason())
                .and_then(|r| hyper::ext::ReasonPhrase::try_from(r.as_bytes()).ok());
            let head = self.buf.split_to(len).freeze();
            let mut map = HeaderMap::with_capacity(count);
            let mut hop = HopByHop::default();
            for &(name_at, name_len, value_at, value_len) in &lines[..count] {
                let name = &head[name_at as usize..(name_at + name_len) as usize];
                let name = HeaderName::from_bytes(name).map_err(|_| Error::Invalid("bad header name"))?;
                let value = head.slice(value_at as usize..(value_at + value_len) as usize);
                let value = HeaderValue::from_maybe_shared(value).map_err(|_| Error::Invalid("bad header value"))?;
                if proxy::is_hop_by_hop(&name) {
                    hop.note(&name, value);
                } else {
                    map.append(name, value);
                }
            }
            for line in &hop.naming {
                for name in proxy::other_names(line) {
                    map.remove(name);
                }
            }
            let codings = hop.codings.as_ref().map(HeaderValue::as_bytes);
            if version == Version::HTTP_10 && codings.is_some() {
                return Err(Error::Invalid("transfer-encoding in an HTTP/1.0 response"));
            }
            let (framing, length_known) = body_framing(&map, codings, status, head_request)?;
            let reusable = version == Version::HTTP_11 && length_known && !hop.close;
            if codings.is_some() {
                // RFC 9112 section 6.3: the length is not what the sender will get.
                map.remove(header::CONTENT_LENGTH);
            }
            let mut response = Response::new(());
            *response.status_mut() = status;
            *response.version_mut() = version;
            *response.headers_mut() = map;
            if let Some(reason) = reason {
                response.extensions_mut().insert(reason);
            }
            return Ok(Some((response, framing, reusable)));
        }
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
        if buf.len() >= MAX_HEAD || final_answer_begun(buf) || read.readable().await.is_err() {
            return;
        }
        match read.try_read_buf(buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Ok(0) | Err(_) => return, // what came is read as the answer, or its absence
            Ok(_) => {}
        }
    }
}

/// Whether `buf` holds the start of a final answer (or of something that is no
/// answer at all, which the response's reader refuses), past any complete 1xx ones.
fn final_answer_begun(buf: &[u8]) -> bool {
    let mut at = 0;
    loop {
        let mut headers = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
        let mut parsed = httparse::Response::new(&mut []);
        let status =
            httparse::ParserConfig::default().parse_response_with_uninit_headers(&mut parsed, &buf[at..], &mut headers);
        match (status, parsed.code) {
            (Err(_), _) => return true,
            (_, Some(code)) if !(100..200).contains(&code) || code == 101 => return true,
            (Ok(httparse::Status::Complete(len)), Some(_)) => at += len,
            _ => return false, // not all in yet
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

/// How a response body is delimited (RFC 9112 section 6.3).
#[derive(Debug)]
enum BodyFraming {
    Length(u64),
    Chunked(Chunked),
    /// To the end of the connection.
    Close,
}

/// The response body's framing (`codings`: the last Transfer-Encoding line), and
/// whether its end is known without the connection closing (so the connection can
/// carry another request).
fn body_framing(
    headers: &HeaderMap,
    codings: Option<&[u8]>,
    status: StatusCode,
    head_request: bool,
) -> Result<(BodyFraming, bool), Error> {
    if head_request || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
        return Ok((BodyFraming::Length(0), true));
    }
    if let Some(codings) = codings {
        let last = codings.rsplit(|&b| b == b',').next().unwrap_or_default().trim_ascii();
        // A Content-Length beside it is ignored, and the connection not reused.
        let alone = !headers.contains_key(header::CONTENT_LENGTH);
        return Ok(if last.eq_ignore_ascii_case(b"chunked") {
            (BodyFraming::Chunked(Chunked::Size), alone)
        } else {
            (BodyFraming::Close, false)
        });
    }
    let mut length = None;
    for value in headers.get_all(header::CONTENT_LENGTH) {
        for part in value.as_bytes().split(|&b| b == b',') {
            let n = parse_decimal(part.trim_ascii()).ok_or(Error::Invalid("bad content-length"))?;
            if length.is_some_and(|l| l != n) {
                return Err(Error::Invalid("conflicting content-length"));
            }
            length = Some(n);
        }
    }
    Ok(match length {
        Some(n) => (BodyFraming::Length(n), true),
        None => (BodyFraming::Close, false),
    })
}

/// What a response's hop-by-hop fields say; they are read here and not passed on
/// (RFC 9110 section 7.6.1), nor are the fields `Connection` names.
#[derive(Default)]
struct HopByHop {
    /// `Connection: close`.
    close: bool,
    /// The last `Transfer-Encoding` line.
    codings: Option<HeaderValue>,
    /// `Connection` lines naming other fields (nearly always none).
    naming: Vec<HeaderValue>,
}

impl HopByHop {
    fn note(&mut self, name: &HeaderName, value: HeaderValue) {
        if name == header::TRANSFER_ENCODING {
            self.codings = Some(value);
        } else if name == header::CONNECTION {
            let mut tokens = value.as_bytes().split(|&b| b == b',').map(<[u8]>::trim_ascii);
            self.close |= tokens.any(|token| token.eq_ignore_ascii_case(b"close"));
            if proxy::other_names(&value).next().is_some() {
                self.naming.push(value);
            }
        }
    }
}

/// A response's Content-Length: the request guard's digit rule, at most 19 digits.
fn parse_decimal(digits: &[u8]) -> Option<u64> {
    (digits.len() <= 19)
        .then(|| crate::framing::from_digits(digits))
        .flatten()
}

/// Where a chunked body's decoder stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunked {
    /// At a chunk-size line.
    Size,
    /// Within a chunk's data: bytes left.
    Data(u64),
    /// At the CRLF after a chunk's data.
    DataEnd,
    /// In the trailer section: bytes read so far.
    Trailers(usize),
}

/// What the buffer yields next for a body.
enum Step {
    Data(Bytes),
    End,
    NeedMore,
}

impl BodyFraming {
    /// Takes the next piece of the body out of `buf`.
    fn step(&mut self, buf: &mut BytesMut) -> Result<Step, io::Error> {
        match self {
            BodyFraming::Length(0) => Ok(Step::End),
            BodyFraming::Length(left) => Ok(take(buf, left)),
            BodyFraming::Close if buf.is_empty() => Ok(Step::NeedMore),
            BodyFraming::Close => Ok(Step::Data(buf.split().freeze())),
            BodyFraming::Chunked(state) => loop {
                match *state {
                    Chunked::Size => {
                        let Some(line) = take_line(buf)? else {
                            return Ok(Step::NeedMore);
                        };
                        let size = chunk_size(&line).ok_or_else(|| invalid("bad chunk size"))?;
                        *state = if size == 0 {
                            Chunked::Trailers(0)
                        } else {
                            Chunked::Data(size)
                        };
                    }
                    Chunked::Data(mut left) => {
                        let step = take(buf, &mut left);
                        *state = if left == 0 {
                            Chunked::DataEnd
                        } else {
                            Chunked::Data(left)
                        };
                        return Ok(step);
                    }
                    Chunked::DataEnd => {
                        if buf.len() < 2 {
                            return Ok(Step::NeedMore);
                        }
                        if &buf[..2] != b"\r\n" {
                            return Err(invalid("chunk data not followed by CRLF"));
                        }
                        let _ = buf.split_to(2);
                        *state = Chunked::Size;
                    }
                    Chunked::Trailers(read) => {
                        let Some(line) = take_line(buf)? else {
                            return Ok(Step::NeedMore);
                        };
                        if line.is_empty() {
                            return Ok(Step::End);
                        }
                        let read = read + line.len() + 2;
                        if read > MAX_TRAILERS {
                            return Err(invalid("trailers too large"));
                        }
                        *state = Chunked::Trailers(read);
                    }
                }
            },
        }
    }

    /// What is known of the body's length from here.
    fn size_hint(&self) -> SizeHint {
        match self {
            BodyFraming::Length(left) => SizeHint::with_exact(*left),
            _ => SizeHint::default(),
        }
    }
}

/// Up to `left` bytes of data from the buffer.
fn take(buf: &mut BytesMut, left: &mut u64) -> Step {
    if buf.is_empty() {
        return Step::NeedMore;
    }
    let n = buf.len().min(usize::try_from(*left).unwrap_or(usize::MAX));
    *left -= n as u64;
    Step::Data(buf.split_to(n).freeze())
}

/// A CRLF-ended line (without its CRLF), or `None` if it is not all in yet.
fn take_line(buf: &mut BytesMut) -> Result<Option<BytesMut>, io::Error> {
    match memchr::memchr(b'\n', buf) {
        Some(at) => {
            let mut line = buf.split_to(at + 1);
            line.truncate(at);
            if line.last() != Some(&b'\r') {
                return Err(invalid("line not ended by CRLF"));
            }
            line.truncate(at - 1);
            Ok(Some(line))
        }
        None if buf.len() > MAX_LINE => Err(invalid("line too long")),
        None => Ok(None),
    }
}

/// A chunk-size line's size (hex digits, then optional `;` extensions, which are
/// ignored).
fn chunk_size(line: &[u8]) -> Option<u64> {
    let digits = line.split(|&b| b == b';').next()?.trim_ascii();
    if digits.is_empty() {
        return None;
    }
    // Leading zeros are allowed; more than 15 digits after them could overflow.
    let significant = digits
        .iter()
        .position(|&d| d != b'0')
        .map_or(&digits[..0], |at| &digits[at..]);
    if significant.len() > 15 {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &d| {
        let v = match d {
            b'0'..=b'9' => d - b'0',
            b'a'..=b'f' => d - b'a' + 10,
            b'A'..=b'F' => d - b'A' + 10,
            _ => return None,
        };
        Some(n * 16 + u64::from(v))
    })
}

fn invalid(what: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// A response body still arriving on its connection, which goes back to the pool when
/// the end was read (and is closed if the body is dropped before).
pub struct Streaming {
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
                    if matches!(this.framing, BodyFraming::Length(0)) {
                        this.end();
                    }
                    return Poll::Ready(Some(Ok(Frame::data(bytes))));
                }
                Ok(Step::End) => {
                    this.end();
                    return Poll::Ready(None);
                }
                Ok(Step::NeedMore) => {}
                Err(e) => {
                    this.conn = None;
                    return Poll::Ready(Some(Err(e)));
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
        self.conn.is_none() || matches!(self.framing, BodyFraming::Length(0))
    }

    fn size_hint(&self) -> SizeHint {
        if self.conn.is_none() {
            return SizeHint::with_exact(0);
        }
        self.framing.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `input` to the decoder after what `buf` holds: the data it yields, and
    /// whether the body ended.
    fn feed(framing: &mut BodyFraming, buf: &mut BytesMut, input: &[u8]) -> Result<(Vec<u8>, bool), io::Error> {
        buf.extend_from_slice(input);
        let mut out = Vec::new();
        loop {
            match framing.step(buf)? {
                Step::Data(bytes) => out.extend_from_slice(&bytes),
                Step::End => return Ok((out, true)),
                Step::NeedMore => return Ok((out, false)),
            }
        }
    }

    fn decode(framing: &mut BodyFraming, input: &[u8]) -> Result<(Vec<u8>, bool), io::Error> {
        feed(framing, &mut BytesMut::new(), input)
    }

    #[test]
    fn chunked_bodies_decode_whatever_the_split() {
        let wire = b"5;ext=1\r\nhello\r\n01A\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nx-trailer: t\r\n\r\n";
        for split in 0..wire.len() {
            let mut framing = BodyFraming::Chunked(Chunked::Size);
            let mut buf = BytesMut::new();
            let (mut out, ended) = feed(&mut framing, &mut buf, &wire[..split]).expect("valid");
            assert!(!ended, "split at {split}");
            let (rest, ended) = feed(&mut framing, &mut buf, &wire[split..]).expect("valid");
            out.extend_from_slice(&rest);
            assert!(ended, "split at {split}");
            assert_eq!(out, b"helloabcdefghijklmnopqrstuvwxyz", "split at {split}");
            assert!(buf.is_empty());
        }
    }

    #[test]
    fn malformed_chunks_are_errors_not_data() {
        for wire in [
            &b"zz\r\nhi\r\n"[..],
            b"2\r\nhiX\r\n",
            b"2\nhi",
            b"fffffffffffffffff\r\n",
        ] {
            let mut framing = BodyFraming::Chunked(Chunked::Size);
            assert!(
                decode(&mut framing, wire).is_err(),
                "{:?}",
                String::from_utf8_lossy(wire)
            );
        }
    }

    #[test]
    fn length_bodies_end_at_their_length() {
        let mut framing = BodyFraming::Length(5);
        let (out, ended) = decode(&mut framing, b"hel").expect("ok");
        assert_eq!((out.as_slice(), ended), (&b"hel"[..], false));
        let (out, ended) = decode(&mut framing, b"lo").expect("ok");
        assert_eq!((out.as_slice(), ended), (&b"lo"[..], true));
    }

    #[test]
    fn framing_follows_rfc_9112() {
        let (ok, none) = (StatusCode::OK, StatusCode::NO_CONTENT);
        // (fields, status, answer to HEAD, framing and reusable; None: refused)
        type Case = (
            &'static [(&'static str, &'static str)],
            StatusCode,
            bool,
            Option<(&'static str, bool)>,
        );
        let cases: [Case; 10] = [
            (&[("content-length", "7")], ok, false, Some(("Length(7)", true))),
            (&[("content-length", "7")], ok, true, Some(("Length(0)", true))),
            (&[], none, false, Some(("Length(0)", true))),
            (&[], ok, false, Some(("Close", false))),
            (
                &[("transfer-encoding", "gzip, chunked")],
                ok,
                false,
                Some(("Chunked(Size)", true)),
            ),
            (
                &[("transfer-encoding", "chunked"), ("content-length", "3")],
                ok,
                false,
                Some(("Chunked(Size)", false)),
            ),
            (&[("transfer-encoding", "gzip")], ok, false, Some(("Close", false))),
            (&[("content-length", "7, 7")], ok, false, Some(("Length(7)", true))),
            (&[("content-length", "7"), ("content-length", "8")], ok, false, None),
            (&[("content-length", "-1")], ok, false, None),
        ];
        for (fields, status, head, expected) in cases {
            let mut map = HeaderMap::new();
            for (name, value) in fields {
                map.append(*name, HeaderValue::from_static(value));
            }
            let codings = map.get_all(header::TRANSFER_ENCODING).iter().next_back();
            let got = body_framing(&map, codings.map(HeaderValue::as_bytes), status, head)
                .ok()
                .map(|(f, reuse)| (format!("{f:?}"), reuse));
            assert_eq!(
                got,
                expected.map(|(f, reuse)| (f.to_owned(), reuse)),
                "{fields:?} {status}"
            );
        }
    }
}
