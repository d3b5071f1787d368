//! Reading an HTTP/1 response out of a connection's read buffer, without I/O: the head
//! parsed by `httparse` (interim 1xx answers skipped, hop-by-hop fields left out), and
//! the body framed as RFC 9112 section 6.3 says. The upstream client fills the buffer
//! and calls these; the `client_vs_hyper` fuzz target feeds them the same byte streams
//! as hyper's own client and requires the same responses.

use std::mem::MaybeUninit;

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Response, StatusCode, Version};
use http_body::SizeHint;

use super::chunked::{Chunked, Piece};
use super::hop_by_hop::{is_hop_by_hop, other_names};
use super::{Invalid, MAX_CONTENT_LENGTH, MAX_HEADERS, from_digits, is_chunked};

/// A response head, ready to be answered with.
#[derive(Debug)]
pub struct Head {
    /// Status, version, the end-to-end fields, and a reason phrase other than the
    /// status's own (as hyper's `ReasonPhrase` extension).
    pub response: Response<()>,
    pub framing: BodyFraming,
    /// Whether the connection can carry another request once the body is read to its
    /// end: HTTP/1.1, a body whose end is known, and no `Connection: close`.
    pub reusable: bool,
}

/// Parses a complete head from the front of `buf` (skipping interim 1xx responses)
/// and takes it out, or `None` if it is not all in yet. `head_request`: the request
/// was a HEAD, so no body follows whatever the head says.
pub fn parse_head(buf: &mut BytesMut, head_request: bool) -> Result<Option<Head>, Invalid> {
    loop {
        if buf.is_empty() {
            return Ok(None); // nothing read yet: the usual first look
        }
        // Uninitialised: httparse fills what it uses (100 headers written up front
        // cost more than the parse of a short head).
        let mut headers = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
        let mut parsed = httparse::Response::new(&mut []);
        let len = match httparse::ParserConfig::default().parse_response_with_uninit_headers(
            &mut parsed,
            buf,
            &mut headers,
        ) {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(httparse::Error::TooManyHeaders) => return Err(Invalid("too many headers")),
            Err(_) => return Err(Invalid("malformed response head")),
        };
        let code = parsed.code.unwrap_or(0);
        let version = if parsed.version == Some(0) {
            Version::HTTP_10
        } else {
            Version::HTTP_11
        };
        if (100..200).contains(&code) {
            if code == 101 {
                return Err(Invalid("101 Switching Protocols was not asked for"));
            }
            let _ = buf.split_to(len); // an interim answer: the final one follows
            continue;
        }
        let status = StatusCode::from_u16(code).map_err(|_| Invalid("bad status code"))?;
        // Offsets into the buffer: the values become slices of it once it is frozen.
        let mut lines = [(0u32, 0u32, 0u32, 0u32); MAX_HEADERS];
        let base = buf.as_ptr() as usize;
        let count = parsed.headers.len();
        // httparse's slices lie within the buffer (an empty value too); checked
        // anyway, since a slice from elsewhere would be read as this one's bytes.
        let offset = |s: &[u8]| {
            (s.as_ptr() as usize)
                .checked_sub(base)
                .filter(|at| at + s.len() <= len)
                .and_then(|at| u32::try_from(at).ok())
                .ok_or(Invalid("header outside the head"))
        };
        for (line, h) in lines.iter_mut().zip(parsed.headers.iter()) {
            *line = (
                offset(h.name.as_bytes())?,
                h.name.len() as u32,
                offset(h.value)?,
                h.value.len() as u32,
            );
        }
        // A reason the sender would not get from the status alone (an empty one too) is
        // kept, as hyper's client keeps it; hyper's server writes it back.
        let reason = parsed
            .reason
            .filter(|r| Some(*r) != status.canonical_reason())
            .and_then(|r| hyper::ext::ReasonPhrase::try_from(r.as_bytes()).ok());
        let head = buf.split_to(len).freeze();
        let mut map = HeaderMap::with_capacity(count);
        let mut hop = HopByHop::default();
        for &(name_at, name_len, value_at, value_len) in &lines[..count] {
            let name = &head[name_at as usize..(name_at + name_len) as usize];
            let name = HeaderName::from_bytes(name).map_err(|_| Invalid("bad header name"))?;
            let value = head.slice(value_at as usize..(value_at + value_len) as usize);
            let value = HeaderValue::from_maybe_shared(value).map_err(|_| Invalid("bad header value"))?;
            if is_hop_by_hop(&name) {
                hop.note(&name, value);
            } else {
                map.append(name, value);
            }
        }
        for line in &hop.naming {
            for name in other_names(line) {
                map.remove(name);
            }
        }
        let codings = hop.codings.as_ref().map(HeaderValue::as_bytes);
        let (framing, length_known) = body_framing(&map, codings, version, status, head_request)?;
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
        return Ok(Some(Head {
            response,
            framing,
            reusable,
        }));
    }
}

/// Whether `buf` holds the start of a final answer (or of something that is no
/// answer at all, which [`parse_head`] refuses), past any complete 1xx ones.
pub fn final_answer_begun(buf: &[u8]) -> bool {
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

/// How a response body is delimited (RFC 9112 section 6.3).
#[derive(Debug)]
pub enum BodyFraming {
    Length(u64),
    Chunked(Chunked),
    /// To the end of the connection.
    Close,
}

/// The response body's framing (`codings`: the last Transfer-Encoding line), and
/// whether its end is known without the connection closing (so the connection can
/// carry another request). An answer that has no body is not looked at further, as
/// hyper's client does not.
fn body_framing(
    headers: &HeaderMap,
    codings: Option<&[u8]>,
    version: Version,
    status: StatusCode,
    head_request: bool,
) -> Result<(BodyFraming, bool), Invalid> {
    if head_request || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
        return Ok((BodyFraming::Length(0), true));
    }
    if version == Version::HTTP_10 && codings.is_some() {
        return Err(Invalid("transfer-encoding in an HTTP/1.0 response"));
    }
    if let Some(codings) = codings {
        // A Content-Length beside it is ignored, and the connection not reused.
        let alone = !headers.contains_key(header::CONTENT_LENGTH);
        return Ok(if is_chunked(codings) {
            (BodyFraming::Chunked(Chunked::new()), alone)
        } else {
            (BodyFraming::Close, false)
        });
    }
    let mut length = None;
    for value in headers.get_all(header::CONTENT_LENGTH) {
        for part in value.as_bytes().split(|&b| b == b',') {
            let n = content_length(part.trim_ascii()).ok_or(Invalid("bad content-length"))?;
            if length.is_some_and(|l| l != n) {
                return Err(Invalid("conflicting content-length"));
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
            if other_names(&value).next().is_some() {
                self.naming.push(value);
            }
        }
    }
}

/// A response's Content-Length, as hyper's client reads it: digits (leading zeros
/// allowed) without overflow, and at most hyper's largest length.
fn content_length(digits: &[u8]) -> Option<u64> {
    from_digits(digits).filter(|n| *n <= MAX_CONTENT_LENGTH)
}

/// What the buffer yields next for a body.
#[derive(Debug)]
pub enum Step {
    Data(Bytes),
    End,
    NeedMore,
}

impl BodyFraming {
    /// Takes the next piece of the body out of `buf`.
    pub fn step(&mut self, buf: &mut BytesMut) -> Result<Step, Invalid> {
        match self {
            BodyFraming::Length(0) => Ok(Step::End),
            BodyFraming::Length(left) => Ok(take(buf, left)),
            BodyFraming::Close if buf.is_empty() => Ok(Step::NeedMore),
            BodyFraming::Close => Ok(Step::Data(buf.split().freeze())),
            BodyFraming::Chunked(chunked) => loop {
                match chunked.advance(buf)? {
                    Piece::Data(n) => return Ok(Step::Data(buf.split_to(n).freeze())),
                    Piece::Framing(0) => return Ok(Step::NeedMore),
                    Piece::Framing(n) => drop(buf.split_to(n)),
                    Piece::End(n) => {
                        let _ = buf.split_to(n);
                        *self = BodyFraming::Length(0);
                        return Ok(Step::End);
                    }
                }
            },
        }
    }

    /// Whether the body was read to its end.
    pub fn ended(&self) -> bool {
        matches!(self, BodyFraming::Length(0))
    }

    /// What is known of the body's length from here.
    pub fn size_hint(&self) -> SizeHint {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `input` to the decoder after what `buf` holds: the data it yields, and
    /// whether the body ended.
    fn feed(framing: &mut BodyFraming, buf: &mut BytesMut, input: &[u8]) -> Result<(Vec<u8>, bool), Invalid> {
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

    fn decode(framing: &mut BodyFraming, input: &[u8]) -> Result<(Vec<u8>, bool), Invalid> {
        feed(framing, &mut BytesMut::new(), input)
    }

    #[test]
    fn chunked_bodies_decode_whatever_the_split_and_leave_what_follows() {
        let wire = b"5;ext=1\r\nhello\r\n01A\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nx-trailer: t\r\n\r\nNEXT";
        for split in 0..wire.len() - 4 {
            let mut framing = BodyFraming::Chunked(Chunked::new());
            let mut buf = BytesMut::new();
            let (mut out, ended) = feed(&mut framing, &mut buf, &wire[..split]).expect("valid");
            assert!(!ended, "split at {split}");
            let (rest, ended) = feed(&mut framing, &mut buf, &wire[split..]).expect("valid");
            out.extend_from_slice(&rest);
            assert!(ended && framing.ended(), "split at {split}");
            assert_eq!(out, b"helloabcdefghijklmnopqrstuvwxyz", "split at {split}");
            assert_eq!(&buf[..], b"NEXT", "split at {split}");
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
            let mut framing = BodyFraming::Chunked(Chunked::new());
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
                Some(("Chunked", true)),
            ),
            (
                &[("transfer-encoding", "chunked"), ("content-length", "3")],
                ok,
                false,
                Some(("Chunked", false)),
            ),
            (&[("transfer-encoding", "gzip")], ok, false, Some(("Close", false))),
            (&[("content-length", "7, 7")], ok, false, Some(("Length(7)", true))),
            (&[("content-length", "7"), ("content-length", "8")], ok, false, None),
            (&[("content-length", "-1")], ok, false, None),
        ];
        let kind = |f: &BodyFraming| match f {
            BodyFraming::Length(n) => format!("Length({n})"),
            BodyFraming::Chunked(_) => "Chunked".to_owned(),
            BodyFraming::Close => "Close".to_owned(),
        };
        for (fields, status, head, expected) in cases {
            let mut map = HeaderMap::new();
            for (name, value) in fields {
                map.append(*name, HeaderValue::from_static(value));
            }
            let codings = map.get_all(header::TRANSFER_ENCODING).iter().next_back();
            let got = body_framing(&map, codings.map(HeaderValue::as_bytes), Version::HTTP_11, status, head)
                .ok()
                .map(|(f, reuse)| (kind(&f), reuse));
            assert_eq!(
                got,
                expected.map(|(f, reuse)| (f.to_owned(), reuse)),
                "{fields:?} {status}"
            );
        }
    }

    #[test]
    fn content_lengths_are_read_as_hyper_reads_them() {
        assert_eq!(
            content_length(b"000000000000000007605150745292293916"),
            Some(7_605_150_745_292_293_916)
        );
        assert_eq!(content_length(b"18446744073709551613"), Some(u64::MAX - 2));
        assert_eq!(content_length(b"18446744073709551614"), None);
        assert_eq!(content_length(b"184467440737095516150"), None);
        assert_eq!(content_length(b"+5"), None);
    }

    #[test]
    fn transfer_encoding_in_http_1_0_is_refused_only_where_a_body_follows() {
        let mut map = HeaderMap::new();
        map.insert(header::TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
        let framing = |status, head| body_framing(&map, Some(b"chunked"), Version::HTTP_10, status, head);
        assert!(framing(StatusCode::OK, false).is_err());
        assert!(matches!(
            framing(StatusCode::OK, true),
            Ok((BodyFraming::Length(0), true))
        ));
        assert!(matches!(
            framing(StatusCode::NO_CONTENT, false),
            Ok((BodyFraming::Length(0), true))
        ));
    }

    #[test]
    fn heads_skip_interim_answers_and_leave_out_hop_by_hop_fields() {
        let mut buf = BytesMut::from(
            &b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 Fine\r\nConnection: x-hop\r\nx-hop: 1\r\nkeep-alive: 5\r\nx-end: 2\r\ncontent-length: 2\r\n\r\nok"[..],
        );
        let head = parse_head(&mut buf, false).expect("valid").expect("complete");
        assert_eq!(head.response.status(), 200);
        let mut names: Vec<&str> = head.response.headers().keys().map(HeaderName::as_str).collect();
        names.sort_unstable();
        assert_eq!(names, ["content-length", "x-end"]);
        assert!(head.reusable);
        assert_eq!(&buf[..], b"ok");
        let reason = head
            .response
            .extensions()
            .get::<hyper::ext::ReasonPhrase>()
            .expect("reason");
        assert_eq!(reason.as_bytes(), b"Fine");
        assert!(
            parse_head(&mut BytesMut::from(&b"HTTP/1.1 200 OK\r\n"[..]), false)
                .expect("valid")
                .is_none()
        );
        assert!(!final_answer_begun(b"HTTP/1.1 100 Continue\r\n\r\nHTT"));
        assert!(final_answer_begun(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 413"));
    }
}
