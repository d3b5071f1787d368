//! RFC 9112 request framing guard for HTTP/1 connections.
//!
//! hyper resolves a request carrying both `Content-Length` and `Transfer-Encoding` by
//! dropping the length (and closing afterwards); RFC 9112 section 6.3 wants the
//! request refused, so the gateway answers 400. The parsed
//! request keeps no trace of it, so this wrapper reads the byte stream the way hyper
//! does and, when a head carries both fields, turns its first byte into a NUL before
//! hyper sees any of it. hyper's parser then rejects the head with 400 and closes the
//! connection, before any handler, store or upstream sees the request.
//!
//! # Following hyper, not approximating it
//!
//! The guard is only worth something if it finds every head hyper parses, at the same
//! offset. So it uses hyper's own means (hyper 1.12, `proto/h1/{role,decode,io}.rs`):
//!
//! - a head is parsed by `httparse` (the version hyper uses, default parser config, at
//!   most [`MAX_HEADERS`] fields), from the byte where hyper's read buffer starts
//!   (the byte after the previous body);
//! - the body framing is hyper's `Server::parse`: the fields in order, `Transfer-Encoding`
//!   only in HTTP/1.1 and with `chunked` last in each field, `Content-Length` parsed by
//!   hyper's `from_digits` (digits only, leading zeros allowed, no overflow, at most
//!   `u64::MAX - 2`), equal repeats allowed, a length after a `Transfer-Encoding` not
//!   parsed at all;
//! - a body of known length is skipped by length, a chunked body is followed by the
//!   state machine of hyper's chunked decoder (size line, whitespace, extensions up to
//!   16 KiB per body, trailers up to 16 KiB and 100 fields);
//! - a head not complete within [`MAX_HEAD`] bytes is one hyper refuses (its read buffer
//!   limit).
//!
//! Wherever the guard cannot say how hyper frames what follows (a head hyper rejects,
//! both framings, a head too large, a head httparse refuses), it breaks the head so
//! that hyper surely stops there, and then stops looking. A chunked body that hyper's
//! decoder rejects ends the connection's reading in hyper, so the guard stops there
//! too. `fuzz/` holds a differential target that serves the same byte streams to
//! hyper alone and to hyper behind the guard and requires the same requests from both.
//!
//! A head is parsed once, in place in the caller's buffer, when it arrives in one read.
//! Only a head split across reads is held back (copied into a buffer the guard keeps,
//! not handed to hyper yet) until it is complete, and re-parsed only when its end may
//! have arrived (hyper's own `is_complete_fast` test). Bodies are skipped, not scanned;
//! chunk-size lines and trailers are read byte by byte. HTTP/2 connections pass through.
//!
//! The limits and the chunked decoder are [`crate::h1`]'s, shared with the upstream
//! client: hyper's defaults, which the listener leaves as they are.

use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::h1::chunked::{Chunked, Piece};
use crate::h1::{MAX_CONTENT_LENGTH, MAX_HEAD, MAX_HEADERS, from_digits, is_chunked};

/// A held-back buffer larger than this is freed once empty.
const KEEP_CAPACITY: usize = 16 * 1024;

/// What the guard made of one request head (reported to an observer, for tests and the
/// fuzz target; the gateway itself sets none).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// A body of this many bytes follows (0: none).
    Length(u64),
    /// A chunked body follows.
    Chunked,
    /// Both `Content-Length` and `Transfer-Encoding`: broken so hyper answers 400.
    Ambiguous,
    /// A head hyper rejects by its framing rules: broken so hyper surely does.
    Rejected,
    /// Not a head `httparse` accepts (no method or path to report): broken likewise.
    Unparsable,
    /// Still incomplete at [`MAX_HEAD`] bytes: broken likewise.
    TooLarge,
}

/// Called with each verdict and, for a parsed head, its method and path.
#[doc(hidden)]
pub type Observer = Box<dyn FnMut(Verdict, Option<(&str, &str)>) + Send>;

pub struct FramingGuard<S> {
    inner: S,
    /// Bytes already read from `inner` (protocol detection), handed out first.
    prefix: Bytes,
    framer: Framer,
    /// Bytes read but not handed out yet: `held[out..ready]` are decided and wait for
    /// room in the caller's buffer; `held[ready..]` is the start of a request head that
    /// is not complete yet.
    held: Vec<u8>,
    out: usize,
    ready: usize,
}

impl<S> FramingGuard<S> {
    /// Wraps a connection whose first bytes, `prefix`, were already read from it.
    /// `http1 = false` (HTTP/2) passes everything through unexamined.
    pub fn new(inner: S, prefix: Bytes, http1: bool) -> Self {
        FramingGuard {
            inner,
            prefix,
            framer: Framer::new(http1, None),
            held: Vec::new(),
            out: 0,
            ready: 0,
        }
    }

    /// As [`FramingGuard::new`] for HTTP/1, reporting every head's verdict.
    #[doc(hidden)]
    pub fn with_observer(inner: S, prefix: Bytes, observer: Observer) -> Self {
        FramingGuard {
            framer: Framer::new(true, Some(observer)),
            ..FramingGuard::new(inner, prefix, true)
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for FramingGuard<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        loop {
            // Decided bytes first.
            if this.out < this.ready {
                let n = (this.ready - this.out).min(buf.remaining());
                buf.put_slice(&this.held[this.out..this.out + n]);
                this.out += n;
                if this.out == this.ready {
                    this.held.drain(..this.ready);
                    this.out = 0;
                    this.ready = 0;
                    if this.held.is_empty() && this.held.capacity() > KEEP_CAPACITY {
                        this.held = Vec::new();
                    }
                }
                return Poll::Ready(Ok(()));
            }
            // Then new bytes, read straight into the caller's buffer.
            let start = buf.filled().len();
            if this.prefix.has_remaining() {
                let n = this.prefix.len().min(buf.remaining());
                buf.put_slice(&this.prefix[..n]);
                this.prefix.advance(n);
            } else {
                ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
            }
            let read = buf.filled().len() - start;
            if this.held.is_empty() {
                if read == 0 {
                    return Poll::Ready(Ok(())); // end of stream
                }
                let data = &mut buf.filled_mut()[start..];
                let done = this.framer.process(data);
                if done < read {
                    // An incomplete head: hold it back until it is complete.
                    this.held.extend_from_slice(&data[done..]);
                    buf.set_filled(start + done);
                }
                if done > 0 {
                    return Poll::Ready(Ok(()));
                }
            } else {
                if read == 0 {
                    // The peer stopped mid-head: hyper gets what there is and fails it.
                    this.framer.phase = Phase::Off;
                    this.ready = this.held.len();
                    continue;
                }
                this.held.extend_from_slice(&buf.filled()[start..]);
                buf.set_filled(start);
                this.ready = this.framer.process(&mut this.held);
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for FramingGuard<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// Where in the stream the next byte is, in hyper's terms.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    /// At (or inside) a request head.
    Head,
    /// Skipping this many body bytes.
    Length(u64),
    /// Inside a chunked body.
    Chunked(Chunked),
    /// Not following: HTTP/2, or hyper reads no further request on this connection.
    Off,
}

/// The stream follower, without I/O: fed the bytes in order, it says how many of them
/// may go to hyper now (the rest is an incomplete head, presented again, extended, at
/// the start of the next call) and breaks heads hyper must not accept.
struct Framer {
    phase: Phase,
    /// Length of the incomplete head at the last attempt (as hyper's `partial_len`).
    partial: Option<usize>,
    observer: Option<Observer>,
}

impl Framer {
    fn new(http1: bool, observer: Option<Observer>) -> Self {
        Framer {
            phase: if http1 { Phase::Head } else { Phase::Off },
            partial: None,
            observer,
        }
    }

    /// Follows `data`; returns how many leading bytes are decided.
    fn process(&mut self, data: &mut [u8]) -> usize {
        let mut i = 0;
        while i < data.len() {
            match &mut self.phase {
                Phase::Off => return data.len(),
                Phase::Head => match self.head(&mut data[i..]) {
                    Some(n) => i += n,
                    None => return i,
                },
                Phase::Length(left) => {
                    let n = skip(left, data.len() - i);
                    i += n;
                    if *left == 0 {
                        self.phase = Phase::Head;
                    }
                }
                // Chunk data is skipped, the framing between followed byte by byte.
                Phase::Chunked(c) => match c.advance(&data[i..]) {
                    Ok(Piece::Data(n) | Piece::Framing(n)) => i += n,
                    Ok(Piece::End(n)) => {
                        i += n;
                        self.phase = Phase::Head;
                    }
                    // hyper fails the body and reads nothing more.
                    Err(_) => self.phase = Phase::Off,
                },
            }
        }
        data.len()
    }

    /// At a head starting at `data[0]`: its length once complete (the whole of `data`
    /// if the guard stops here), `None` while incomplete.
    fn head(&mut self, data: &mut [u8]) -> Option<usize> {
        if let Some(prev) = self.partial
            && !is_complete_fast(data, prev)
        {
            return self.incomplete(data);
        }
        let mut fields = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut []);
        let (len, verdict) = match req.parse_with_uninit_headers(data, &mut fields) {
            Ok(httparse::Status::Complete(len)) => (len, framing(&req)),
            Ok(httparse::Status::Partial) => return self.incomplete(data),
            Err(_) => (data.len(), Verdict::Unparsable),
        };
        if let Some(observer) = &mut self.observer {
            let line = req.method.zip(req.path);
            observer(verdict, line);
        }
        Some(self.follow(data, len, verdict))
    }

    /// Goes on after a head of `len` bytes (at `data[0]`) that got `verdict`; returns
    /// how many bytes are decided.
    fn follow(&mut self, data: &mut [u8], len: usize, verdict: Verdict) -> usize {
        self.partial = None;
        self.phase = match verdict {
            Verdict::Length(0) => Phase::Head,
            Verdict::Length(n) => Phase::Length(n),
            Verdict::Chunked => Phase::Chunked(Chunked::new()),
            Verdict::Ambiguous | Verdict::Rejected | Verdict::Unparsable | Verdict::TooLarge => {
                return self.stop(data);
            }
        };
        len
    }

    fn incomplete(&mut self, data: &mut [u8]) -> Option<usize> {
        if data.len() >= MAX_HEAD {
            if let Some(observer) = &mut self.observer {
                observer(Verdict::TooLarge, None);
            }
            return Some(self.stop(data));
        }
        self.partial = Some(data.len());
        None
    }

    /// Breaks the head at `data[0]` so hyper refuses it (with 400: a NUL where the
    /// method starts, or in an empty line before it, is an invalid token for every
    /// parser configuration), and stops following.
    fn stop(&mut self, data: &mut [u8]) -> usize {
        data[0] = 0;
        self.phase = Phase::Off;
        self.partial = None;
        data.len()
    }
}

/// Skips up to `available` of `left` bytes; returns how many.
fn skip(left: &mut u64, available: usize) -> usize {
    let n = usize::try_from(*left).unwrap_or(usize::MAX).min(available);
    *left -= n as u64;
    n
}

/// The two fields a request body is framed by.
#[derive(Clone, Copy)]
enum Field {
    TransferEncoding,
    ContentLength,
}

impl Field {
    fn name(self) -> &'static str {
        match self {
            Field::TransferEncoding => "transfer-encoding",
            Field::ContentLength => "content-length",
        }
    }

    /// The field a parsed name is, if it is one of the two.
    fn named(name: &str) -> Option<Field> {
        [Field::TransferEncoding, Field::ContentLength]
            .into_iter()
            .find(|f| name.eq_ignore_ascii_case(f.name()))
    }
}

/// hyper's body framing for a head httparse parsed.
fn framing(req: &httparse::Request<'_, '_>) -> Verdict {
    let mut framing = Framing::new(req.version == Some(1));
    for field in req.headers.iter() {
        if let Some(name) = Field::named(field.name) {
            framing.add(name, field.value);
        }
    }
    framing.verdict()
}

/// hyper's body framing for a request head (`role.rs`, `Server::parse`), fed its
/// framing fields in order.
struct Framing {
    http11: bool,
    te: bool,
    chunked: bool,
    cl: bool,
    length: Option<u64>,
    /// hyper refuses the head, whatever fields follow.
    rejected: bool,
}

impl Framing {
    fn new(http11: bool) -> Self {
        Framing {
            http11,
            te: false,
            chunked: false,
            cl: false,
            length: None,
            rejected: false,
        }
    }

    fn add(&mut self, field: Field, value: &[u8]) {
        if self.rejected {
            return;
        }
        match field {
            Field::TransferEncoding => {
                self.rejected = !self.http11;
                self.te = true;
                self.chunked = is_chunked(value);
            }
            Field::ContentLength => {
                self.cl = true;
                if self.te {
                    return; // hyper neither parses nor keeps it
                }
                match (from_digits(value), self.length) {
                    (None, _) => self.rejected = true,
                    (Some(n), Some(prev)) => self.rejected = n != prev,
                    (Some(n), None) => {
                        self.rejected = n > MAX_CONTENT_LENGTH;
                        self.length = Some(n);
                    }
                }
            }
        }
    }

    fn verdict(&self) -> Verdict {
        match (self.rejected, self.te, self.chunked, self.cl) {
            (true, ..) | (false, true, false, _) => Verdict::Rejected,
            (false, true, true, true) => Verdict::Ambiguous,
            (false, true, true, false) => Verdict::Chunked,
            (false, false, _, _) => Verdict::Length(self.length.unwrap_or(0)),
        }
    }
}

/// hyper's `is_complete_fast`: could a head end in `bytes` after `prev_len`?
fn is_complete_fast(bytes: &[u8], prev_len: usize) -> bool {
    let start = prev_len.saturating_sub(3);
    let bytes = &bytes[start.min(bytes.len())..];
    for (i, &b) in bytes.iter().enumerate() {
        if b == b'\r' {
            if bytes[i + 1..].chunks(3).next() == Some(&b"\n\r\n"[..]) {
                return true;
            }
        } else if b == b'\n'
            && (bytes.get(i + 1) == Some(&b'\n') || bytes[i + 1..].chunks(2).next() == Some(&b"\r\n"[..]))
        {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests;
