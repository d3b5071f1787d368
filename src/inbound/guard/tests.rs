//! Unit tests of [`crate::inbound::guard`].

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
    let input = format!("POST /a HTTP/1.1\r\nContent-Length: {zeros}5\r\n\r\nhelloGET /b HTTP/1.1\r\n\r\n{smuggled}");
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
    let chunked =
        |body: &str| format!("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n{body}GET /next HTTP/1.1\r\n\r\n");
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
    // A trailer line ends at CR LF only; a bare LF is part of it. hyper parses the
    // trailer section at the end of the body, fails these trailers and reads no further
    // request; neither does the guard.
    let body = "0\r\nA: b\nPOST /x HTTP/1.1\r\n\r\n";
    assert_eq!(verdicts(&whole(&chunked(body)).1), [Verdict::Chunked]);
    assert!(!next("0\r\nA(: b\r\n\r\n")); // a name that is no token
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
