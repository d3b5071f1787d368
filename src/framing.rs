//! RFC 9112 request framing guard for HTTP/1 connections.
//!
//! hyper resolves a request carrying both `Content-Length` and `Transfer-Encoding` by
//! ignoring the length (and closing afterwards); SPEC.md asks for a 400. hyper removes
//! the evidence before the handler runs, so this wrapper follows the byte stream's
//! message framing and, when a head carries both fields, overwrites the line end of the
//! second one with a NUL. hyper's parser then rejects the head with 400 and closes the
//! connection, before any handler, store or upstream sees the request.
//!
//! It tracks heads byte by byte but skips bodies by their declared length or chunk
//! sizes, so the cost is proportional to header bytes. HTTP/2 connections are ignored.
//!
//! It also replays the bytes the server read to tell HTTP/1 from HTTP/2.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The longest header line kept for inspection; only names and short values matter.
const LINE_CAP: usize = 1024;

pub struct FramingGuard<S> {
    inner: S,
    /// Bytes already read from `inner` (protocol detection), handed out first.
    prefix: Bytes,
    tracker: Tracker,
}

impl<S> FramingGuard<S> {
    /// Wraps a connection whose first bytes, `prefix`, were already read from it.
    /// `http1 = false` (HTTP/2) passes everything through unexamined.
    pub fn new(inner: S, prefix: Bytes, http1: bool) -> Self {
        let mut tracker = Tracker::default();
        if !http1 {
            tracker.phase = Phase::Off;
        }
        FramingGuard { inner, prefix, tracker }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for FramingGuard<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let start = buf.filled().len();
        let this = &mut *self;
        let poll = if this.prefix.has_remaining() {
            let n = this.prefix.len().min(buf.remaining());
            buf.put_slice(&this.prefix[..n]);
            this.prefix.advance(n);
            Poll::Ready(Ok(()))
        } else {
            Pin::new(&mut this.inner).poll_read(cx, buf)
        };
        if let Poll::Ready(Ok(())) = poll {
            this.tracker.feed(&mut buf.filled_mut()[start..]);
        }
        poll
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

#[derive(Debug, PartialEq, Eq)]
enum Phase {
    /// Reading a request head; `first` until the request line has been seen.
    Head {
        first: bool,
    },
    /// Skipping this many body bytes.
    Body(u64),
    /// Chunked body: reading a chunk-size line.
    ChunkSize {
        size: u64,
        digits: bool,
        ext: bool,
    },
    /// Chunked body: skipping chunk data, then its CRLF.
    ChunkData(u64),
    ChunkEnd,
    /// Chunked body: trailer lines until an empty one.
    Trailers,
    /// Not HTTP/1 framing we follow (HTTP/2, or a head hyper will reject anyway).
    Off,
}

#[derive(Debug)]
struct Tracker {
    phase: Phase,
    line: Vec<u8>,
    line_len: usize,
    content_length: Option<u64>,
    has_length: bool,
    has_te: bool,
    chunked: bool,
}

impl Default for Tracker {
    fn default() -> Self {
        Tracker {
            phase: Phase::Head { first: true },
            line: Vec::new(),
            line_len: 0,
            content_length: None,
            has_length: false,
            has_te: false,
            chunked: false,
        }
    }
}

impl Tracker {
    fn feed(&mut self, bytes: &mut [u8]) {
        let mut i = 0;
        while i < bytes.len() {
            match self.phase {
                Phase::Off => return,
                Phase::Body(n) | Phase::ChunkData(n) => {
                    let skip = n.min((bytes.len() - i) as u64);
                    i += skip as usize;
                    let left = n - skip;
                    self.phase = match (&self.phase, left) {
                        (Phase::Body(_), 0) => Phase::Head { first: true },
                        (Phase::Body(_), left) => Phase::Body(left),
                        (_, 0) => Phase::ChunkEnd,
                        (_, left) => Phase::ChunkData(left),
                    };
                }
                _ => {
                    self.byte(bytes, i);
                    i += 1;
                }
            }
        }
    }

    fn byte(&mut self, bytes: &mut [u8], i: usize) {
        let b = bytes[i];
        match &mut self.phase {
            Phase::ChunkSize { size, digits, ext } => match b {
                b'\n' => {
                    self.phase = match (*digits, *size) {
                        (false, _) => Phase::Off,
                        (true, 0) => Phase::Trailers,
                        (true, n) => Phase::ChunkData(n),
                    }
                }
                _ if *ext => {}
                b';' | b'\r' | b' ' | b'\t' => *ext = true,
                _ => match (b as char)
                    .to_digit(16)
                    .and_then(|d| size.checked_mul(16)?.checked_add(u64::from(d)))
                {
                    Some(n) => {
                        *size = n;
                        *digits = true;
                    }
                    None => self.phase = Phase::Off,
                },
            },
            Phase::ChunkEnd => {
                if b == b'\n' {
                    self.phase = Phase::ChunkSize {
                        size: 0,
                        digits: false,
                        ext: false,
                    };
                }
            }
            _ if b == b'\n' => self.line_end(bytes, i),
            _ => {
                if self.line.len() < LINE_CAP {
                    self.line.push(b);
                }
                self.line_len += 1;
            }
        }
    }

    fn line_end(&mut self, bytes: &mut [u8], i: usize) {
        if self.line.last() == Some(&b'\r') {
            self.line.pop();
        }
        let empty = self.line_len == 0 || (self.line_len == 1 && self.line.is_empty());
        let line = std::mem::take(&mut self.line);
        self.line_len = 0;
        match self.phase {
            Phase::Trailers if empty => self.phase = Phase::Head { first: true },
            Phase::Trailers => {}
            // Empty lines before a request line are allowed (RFC 9112 section 2.2).
            Phase::Head { first: true } if empty => {}
            Phase::Head { first: true } => {
                if line.starts_with(b"PRI * HTTP/2") {
                    self.phase = Phase::Off;
                } else {
                    self.phase = Phase::Head { first: false };
                }
            }
            Phase::Head { first: false } if empty => self.end_of_head(),
            Phase::Head { first: false } => self.header_line(&line, &mut bytes[i]),
            _ => {}
        }
        self.line = line;
        self.line.clear();
    }

    /// Records a header line; when the head now carries both framing fields, breaks
    /// the line's end so hyper answers 400.
    fn header_line(&mut self, line: &[u8], line_end: &mut u8) {
        if self.framing_field(line) && self.has_length && self.has_te {
            *line_end = 0;
            self.phase = Phase::Off;
        }
    }

    /// Records Content-Length / Transfer-Encoding; true if the line was one of them.
    fn framing_field(&mut self, line: &[u8]) -> bool {
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            return false;
        };
        let (name, value) = (&line[..colon], trim(&line[colon + 1..]));
        if name.eq_ignore_ascii_case(b"content-length") {
            self.has_length = true;
            self.content_length = content_length(value);
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            self.has_te = true;
            let last = value.rsplit(|&b| b == b',').next().map(trim).unwrap_or_default();
            self.chunked = last.eq_ignore_ascii_case(b"chunked");
        } else {
            return false;
        }
        true
    }

    fn end_of_head(&mut self) {
        self.phase = if self.has_te {
            if self.chunked {
                Phase::ChunkSize {
                    size: 0,
                    digits: false,
                    ext: false,
                }
            } else {
                Phase::Off
            }
        } else {
            match (self.has_length, self.content_length) {
                (false, _) | (true, Some(0)) => Phase::Head { first: true },
                (true, Some(n)) => Phase::Body(n),
                (true, None) => Phase::Off, // an invalid length: hyper rejects the head
            }
        };
        self.content_length = None;
        self.has_length = false;
        self.has_te = false;
        self.chunked = false;
    }
}

/// A Content-Length value; `5, 5` (repeated equal values) is valid, as hyper holds.
fn content_length(value: &[u8]) -> Option<u64> {
    let mut lengths = value
        .split(|&b| b == b',')
        .map(|v| std::str::from_utf8(trim(v)).ok()?.parse::<u64>().ok());
    let first = lengths.next()??;
    lengths.all(|n| n == Some(first)).then_some(first)
}

fn trim(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `input` split into pieces of `step` bytes and returns what hyper would read.
    fn run(input: &str, step: usize) -> (Vec<u8>, Phase) {
        let mut t = Tracker::default();
        let mut bytes = input.as_bytes().to_vec();
        for chunk in bytes.chunks_mut(step) {
            t.feed(chunk);
        }
        (bytes, t.phase)
    }

    #[test]
    fn both_framings_break_the_head_in_any_split() {
        for step in [1, 3, 7, 1000] {
            for req in [
                "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
                "POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\ncontent-length: 5\r\n\r\n0\r\n\r\n",
            ] {
                let (out, phase) = run(req, step);
                assert_eq!(phase, Phase::Off, "step {step}");
                assert_eq!(out.iter().filter(|&&b| b == 0).count(), 1, "step {step}: {req:?}");
                assert!(
                    httparse::Request::new(&mut [httparse::EMPTY_HEADER; 8])
                        .parse(&out)
                        .is_err()
                );
            }
        }
    }

    #[test]
    fn ordinary_keep_alive_traffic_is_untouched() {
        let reqs = concat!(
            "POST /a HTTP/1.1\r\nContent-Length: 30\r\n\r\nContent-Length: 1\r\nTransfer-E",
            "POST /b HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            "5;ext=1\r\nhello\r\n11\r\nTransfer-Encoding\r\n0\r\nX-Trailer: 1\r\n\r\n",
            "GET /c HTTP/1.1\r\nHost: x\r\n\r\n",
            "POST /d HTTP/1.1\r\nContent-Length: 4\r\n\r\nabcd",
        );
        for step in [1, 2, 5, 64, 4096] {
            let (out, phase) = run(reqs, step);
            assert_eq!(out, reqs.as_bytes(), "step {step}");
            assert_eq!(phase, Phase::Head { first: true }, "step {step}");
        }
    }

    #[test]
    fn repeated_equal_lengths_keep_tracking_on() {
        let reqs = "POST /a HTTP/1.1\r\nContent-Length: 3, 3\r\n\r\nabcPOST /b HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n";
        let (out, phase) = run(reqs, 5);
        assert_eq!(phase, Phase::Off);
        assert_eq!(
            out.iter().filter(|&&b| b == 0).count(),
            1,
            "the second request is still caught"
        );
        assert_eq!(content_length(b"7"), Some(7));
        assert_eq!(content_length(b"7, 8"), None);
    }

    #[test]
    fn http2_prior_knowledge_turns_tracking_off() {
        let (out, phase) = run("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0", 4);
        assert_eq!(phase, Phase::Off);
        assert!(out.starts_with(b"PRI"));
    }
}
