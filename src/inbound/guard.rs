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
use crate::h1::{MAX_HEAD, MAX_HEADERS, from_digits, is_chunked};

/// The largest `Content-Length` hyper accepts.
const MAX_CONTENT_LENGTH: u64 = u64::MAX - 2;
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
mod tests {
    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};

    use super::*;

    /// A connection whose reads return these pieces, one per read; then the end of
    /// the stream, or (`wait`) nothing yet.
    struct Pieces {
        pieces: VecDeque<Vec<u8>>,
        wait: bool,
    }

    impl Pieces {
        fn new(pieces: impl Into<VecDeque<Vec<u8>>>) -> Self {
            Pieces {
                pieces: pieces.into(),
                wait: false,
            }
        }
    }

    impl AsyncRead for Pieces {
        fn poll_read(mut self: Pin<&mut Self>, _: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
            let Some(mut piece) = self.pieces.pop_front() else {
                return if self.wait { Poll::Pending } else { Poll::Ready(Ok(())) };
            };
            let n = piece.len().min(buf.remaining());
            buf.put_slice(&piece[..n]);
            if n < piece.len() {
                self.pieces.push_front(piece.split_off(n));
            }
            Poll::Ready(Ok(()))
        }
    }

    /// One read through `guard` into a buffer of `cap` bytes.
    fn read_once<S: AsyncRead + Unpin>(guard: &mut FramingGuard<S>, cap: usize) -> Poll<Vec<u8>> {
        let mut buf = vec![0; cap];
        let mut rb = ReadBuf::new(&mut buf);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        match Pin::new(guard).poll_read(&mut cx, &mut rb) {
            Poll::Ready(r) => {
                r.expect("read");
                Poll::Ready(rb.filled().to_vec())
            }
            Poll::Pending => Poll::Pending,
        }
    }

    /// Everything hyper would read through `guard` with a buffer of `cap` bytes.
    fn read_all<S: AsyncRead + Unpin>(guard: &mut FramingGuard<S>, cap: usize) -> Vec<u8> {
        let mut out = Vec::new();
        loop {
            match read_once(guard, cap) {
                Poll::Ready(piece) if piece.is_empty() => return out,
                Poll::Ready(piece) => out.extend_from_slice(&piece),
                Poll::Pending => panic!("the pieces never wait"),
            }
        }
    }

    type Seen = Arc<Mutex<Vec<(Verdict, String)>>>;

    /// What hyper would read through the guard when the input arrives in `pieces`,
    /// read with a buffer of `cap` bytes; and the verdicts with `METHOD path`.
    fn through(pieces: Vec<Vec<u8>>, cap: usize) -> (Vec<u8>, Vec<(Verdict, String)>) {
        let seen: Seen = Arc::default();
        let log = Arc::clone(&seen);
        let observer: Observer = Box::new(move |v, line| {
            let line = line.map(|(m, p)| format!("{m} {p}")).unwrap_or_default();
            log.lock().expect("log").push((v, line));
        });
        // An empty read is the end of the stream: no empty pieces.
        let pieces: VecDeque<Vec<u8>> = pieces.into_iter().filter(|p| !p.is_empty()).collect();
        let mut guard = FramingGuard::with_observer(Pieces::new(pieces), Bytes::new(), observer);
        let out = read_all(&mut guard, cap);
        let seen = seen.lock().expect("log").clone();
        (out, seen)
    }

    fn whole(input: &str) -> (Vec<u8>, Vec<(Verdict, String)>) {
        through(vec![input.as_bytes().to_vec()], 8192)
    }

    /// Every split of `input` into two reads, and into reads of `step` bytes, and
    /// every caller buffer size in `caps`, gives the same bytes and verdicts as one read.
    fn same_in_every_split(input: &str) -> (Vec<u8>, Vec<(Verdict, String)>) {
        let expected = whole(input);
        let bytes = input.as_bytes();
        for at in 0..=bytes.len() {
            let pieces = vec![bytes[..at].to_vec(), bytes[at..].to_vec()];
            assert_eq!(through(pieces, 8192), expected, "split at {at}");
        }
        for step in [1, 2, 3, 7, 64] {
            let pieces = bytes.chunks(step).map(<[u8]>::to_vec).collect();
            assert_eq!(through(pieces, 8192), expected, "reads of {step}");
        }
        for cap in [1, 5, 100] {
            assert_eq!(through(vec![bytes.to_vec()], cap), expected, "buffer of {cap}");
        }
        expected
    }

    fn verdicts(seen: &[(Verdict, String)]) -> Vec<Verdict> {
        seen.iter().map(|(v, _)| *v).collect()
    }

    /// The bytes of `input` with the byte at `at` made NUL.
    fn broken_at(input: &str, at: usize) -> Vec<u8> {
        let mut b = input.as_bytes().to_vec();
        b[at] = 0;
        b
    }

    #[test]
    fn both_framings_break_the_head_in_either_order_and_any_split() {
        for head in [
            "Content-Length: 5\r\nTransfer-Encoding: chunked",
            "Transfer-Encoding: chunked\r\nContent-Length: 5",
            "Transfer-Encoding: chunked\r\nContent-Length: nonsense",
            "content-length: 5\r\nTRANSFER-ENCODING: gzip, Chunked",
        ] {
            let first = "POST /a HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc";
            let input = format!("{first}POST /b HTTP/1.1\r\nHost: x\r\n{head}\r\n\r\n0\r\n\r\n");
            let (out, seen) = same_in_every_split(&input);
            assert_eq!(out, broken_at(&input, first.len()), "{head:?}");
            assert_eq!(verdicts(&seen), [Verdict::Length(3), Verdict::Ambiguous], "{head:?}");
            assert!(
                httparse::Request::new(&mut [httparse::EMPTY_HEADER; 8])
                    .parse(&out[first.len()..])
                    .is_err()
            );
        }
    }

    #[test]
    fn a_long_content_length_line_is_read_whole() {
        // 1100 leading zeros: a valid length of 5 for hyper.
        let zeros = "0".repeat(1100);
        let smuggled = "POST /s HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
        let input =
            format!("POST /a HTTP/1.1\r\nContent-Length: {zeros}5\r\n\r\nhelloGET /b HTTP/1.1\r\n\r\n{smuggled}");
        let (out, seen) = same_in_every_split(&input);
        assert_eq!(
            seen.iter().map(|(v, l)| (*v, l.as_str())).collect::<Vec<_>>(),
            [
                (Verdict::Length(5), "POST /a"),
                (Verdict::Length(0), "GET /b"),
                (Verdict::Ambiguous, "POST /s")
            ]
        );
        assert_eq!(out, broken_at(&input, input.len() - smuggled.len()));
        // A long value that is not a length makes hyper refuse the head; so does the guard.
        let input = format!("POST /a HTTP/1.1\r\nContent-Length: {zeros}5x\r\n\r\nhello");
        assert_eq!(verdicts(&whole(&input).1), [Verdict::Rejected]);
    }

    #[test]
    fn content_length_is_parsed_as_hyper_does() {
        assert_eq!(from_digits(b"0005"), Some(5));
        assert_eq!(from_digits(b"18446744073709551615"), Some(u64::MAX));
        for bad in [
            &b""[..],
            b"+5",
            b"-5",
            b"5 ",
            b" 5",
            b"5,5",
            b"0x5",
            b"18446744073709551616",
        ] {
            assert_eq!(from_digits(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
        let cases = [
            ("Content-Length: 3\r\nContent-Length: 003", Verdict::Length(3)),
            ("Content-Length: 3\r\nContent-Length: 4", Verdict::Rejected),
            ("Content-Length: 3, 3", Verdict::Rejected), // hyper's server takes no lists
            ("Content-Length: 18446744073709551613", Verdict::Length(u64::MAX - 2)),
            ("Content-Length: 18446744073709551614", Verdict::Rejected),
            ("Content-Length: -1", Verdict::Rejected),
            ("Transfer-Encoding: gzip", Verdict::Rejected),
            (
                "Transfer-Encoding: chunked\r\nTransfer-Encoding: gzip",
                Verdict::Rejected,
            ),
            (
                "Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked",
                Verdict::Chunked,
            ),
            ("Transfer-Encoding: gzip,chunked", Verdict::Chunked),
            ("Transfer-Encoding: chunked , ", Verdict::Rejected),
        ];
        for (fields, verdict) in cases {
            let input = format!("POST / HTTP/1.1\r\n{fields}\r\n\r\n");
            assert_eq!(verdicts(&whole(&input).1), [verdict], "{fields:?}");
        }
        // HTTP/1.0 knows no Transfer-Encoding: hyper refuses it.
        let input = "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
        assert_eq!(verdicts(&whole(input).1), [Verdict::Rejected]);
    }

    #[test]
    fn conflicting_lengths_break_the_head() {
        let input = "POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd";
        let (out, seen) = same_in_every_split(input);
        assert_eq!(verdicts(&seen), [Verdict::Rejected]);
        assert_eq!(out, broken_at(input, 0));
    }

    #[test]
    fn chunk_extensions_trailers_and_pipelining_are_followed() {
        let input = concat!(
            "POST /a HTTP/1.1\r\nContent-Length: 30\r\n\r\nContent-Length: 1\r\nTransfer-E",
            "\r\n\r\nPOST /b HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            "5;ext=1;q=\"a;b\"\r\nhello\r\n11 \t;x\r\nTransfer-Encoding\r\n0\r\nX-Trailer: 1\r\nContent-Length: 9\r\n\r\n",
            "GET /c HTTP/1.1\r\nHost: x\r\n\r\n",
            "POST /d HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nA\r\n0123456789\r\n0\r\n\r\n",
            "POST /e HTTP/1.1\r\nContent-Length: 4\r\n\r\nabcd",
            "POST /f HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
        );
        let (out, seen) = same_in_every_split(input);
        assert_eq!(
            seen.iter().map(|(v, l)| (*v, l.as_str())).collect::<Vec<_>>(),
            [
                (Verdict::Length(30), "POST /a"),
                (Verdict::Chunked, "POST /b"),
                (Verdict::Length(0), "GET /c"),
                (Verdict::Chunked, "POST /d"),
                (Verdict::Length(4), "POST /e"),
                (Verdict::Ambiguous, "POST /f"),
            ]
        );
        let last = input.rfind("POST /f").expect("f");
        assert_eq!(out, broken_at(input, last));
    }

    #[test]
    fn hypers_chunked_decoder_limits_hold() {
        let chunked = |body: &str| {
            format!("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n{body}GET /next HTTP/1.1\r\n\r\n")
        };
        let next = |body: &str| whole(&chunked(body)).1.len() == 2;
        assert!(next("0\r\n\r\n"));
        assert!(next("0;a=b\r\n\r\n"));
        assert!(next("000\r\nA: b\r\n\r\n"));
        assert!(next(&format!("1;{}\r\nx\r\n0\r\n\r\n", "e".repeat(16 * 1024 - 1))));
        // hyper fails these bodies and reads no further request: neither does the guard.
        assert!(!next(&format!("1;{}\r\nx\r\n0\r\n\r\n", "e".repeat(16 * 1024))));
        assert!(!next("0;a\nb\r\n\r\n")); // a bare LF in an extension
        assert!(!next("x\r\n\r\n"));
        assert!(!next("1\r\nxy\r\n0\r\n\r\n")); // no CRLF after the data
        assert!(!next("0\n\r\n")); // the size line needs CRLF
        assert!(!next("10000000000000000\r\n")); // overflow
        assert!(!next("1 1\r\nx\r\n0\r\n\r\n"));
        assert!(next(&format!("0\r\n{}\r\n", "A: b\r\n".repeat(100))));
        assert!(!next(&format!("0\r\n{}\r\n", "A: b\r\n".repeat(101))));
        assert!(!next(&format!("0\r\nA: {}\r\n\r\n", "b".repeat(16 * 1024))));
        // A trailer line ends at CR LF only; a bare LF is part of it (hyper then fails
        // these trailers and reads no further: the guard following on is harmless).
        let body = "0\r\nA: b\nPOST /x HTTP/1.1\r\n\r\n";
        assert_eq!(
            verdicts(&whole(&chunked(body)).1),
            [Verdict::Chunked, Verdict::Length(0)]
        );
    }

    #[test]
    fn heads_split_across_reads_are_held_until_complete() {
        let input = "\r\nPOST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhiPOST /b HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n0\r\n\r\n";
        let (out, _) = same_in_every_split(input);
        assert_eq!(out, broken_at(input, input.rfind("POST /b").expect("b")));
        // Hyper never gets part of a head the guard has not decided on: a partial head
        // is held while the peer is silent, and handed over at the end of the stream.
        let head = "POST /a HTTP/1.1\r\nHost: x\r\n\r\n";
        for at in 1..head.len() {
            let mut pieces = Pieces::new([head.as_bytes()[..at].to_vec()]);
            pieces.wait = true;
            let mut guard = FramingGuard::new(pieces, Bytes::new(), true);
            assert_eq!(read_once(&mut guard, 64), Poll::Pending, "split at {at}");
            guard.inner.pieces.push_back(head.as_bytes()[at..].to_vec());
            assert_eq!(read_once(&mut guard, 64), Poll::Ready(head.as_bytes().to_vec()));
            let mut guard = FramingGuard::new(Pieces::new([head.as_bytes()[..at].to_vec()]), Bytes::new(), true);
            assert_eq!(read_all(&mut guard, 64), &head.as_bytes()[..at], "split at {at}");
        }
    }

    #[test]
    fn bytes_that_are_no_head_stop_the_guard_after_breaking_them() {
        for input in [
            "GET / HTTP/1.1\nBad Header: x\n\n",
            "\rGET / HTTP/1.1\r\n\r\n",
            "PRI * HTTP/2.0\r\n\r\n",
        ] {
            let (out, seen) = same_in_every_split(input);
            assert_eq!(verdicts(&seen), [Verdict::Unparsable], "{input:?}");
            assert_eq!(out, broken_at(input, 0));
        }
    }

    #[test]
    fn a_head_httparse_refuses_is_broken_in_any_split() {
        // hyper, parsing with the same httparse, would refuse it and read nothing after
        // it; the guard breaks it, so hyper surely does.
        let refused = |bytes: &[u8]| {
            httparse::Request::new(&mut [httparse::EMPTY_HEADER; 8])
                .parse(bytes)
                .is_err()
        };
        for input in [
            "GET / HTTP/1.1\r\nBad Header: x\r\n\r\nGET /next HTTP/1.1\r\n\r\n",
            "GET /\x01 HTTP/1.1\r\n\r\n",
            "POST / HTTP/1.1\r\nX: a\x01b\r\nContent-Length: 0\r\n\r\n",
            "GET / HTTP/1.1\r\nContent-Length : 1\r\n\r\nx",
        ] {
            let bytes = input.as_bytes();
            assert!(refused(bytes), "{input:?}");
            let (out, seen) = same_in_every_split(input);
            assert_eq!(verdicts(&seen), [Verdict::Unparsable], "{input:?}");
            assert_eq!(out, broken_at(input, 0), "{input:?}");
        }
    }

    #[test]
    fn a_head_too_large_for_hyper_is_broken_and_not_held_longer() {
        let input = format!("GET / HTTP/1.1\r\nA: {}", "b".repeat(MAX_HEAD));
        let pieces: Vec<Vec<u8>> = input.as_bytes().chunks(4096).map(<[u8]>::to_vec).collect();
        let (out, seen) = through(pieces, 8192);
        assert_eq!(verdicts(&seen), [Verdict::TooLarge]);
        assert_eq!(out, broken_at(&input, 0));
        // Hundred fields are fine, the 101st is not (hyper's bound).
        let fields = |n: usize| format!("GET / HTTP/1.1\r\n{}\r\n", "A: b\r\n".repeat(n));
        assert_eq!(verdicts(&whole(&fields(100)).1), [Verdict::Length(0)]);
        assert_eq!(verdicts(&whole(&fields(101)).1), [Verdict::Unparsable]);
    }

    #[test]
    fn http2_passes_through_untouched() {
        let preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0Content-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n";
        let mut guard = FramingGuard::new(Pieces::new([preface.as_bytes().to_vec()]), Bytes::new(), false);
        assert_eq!(read_all(&mut guard, 7), preface.as_bytes());
    }

    #[test]
    fn the_prefix_is_followed_like_any_read() {
        let input = b"POST / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n";
        let (prefix, rest) = input.split_at(3);
        let mut guard = FramingGuard::new(Pieces::new([rest.to_vec()]), Bytes::copy_from_slice(prefix), true);
        let out = read_all(&mut guard, 4096);
        assert_eq!(out[0], 0);
        assert_eq!(&out[1..], &input[1..]);
    }
}
