//! HTTP/1 wire rules both sides of the gateway follow: the inbound framing guard
//! ([`crate::inbound::guard`]), which must frame requests exactly as hyper's server
//! does, and the upstream client ([`crate::upstream::client`]), which frames the bot's
//! responses. One set of limits, one chunked decoder ([`chunked`]), one list of
//! hop-by-hop fields ([`hop_by_hop`]); the response side is [`response`].
//!
//! The limits are hyper 1.x's defaults (`proto/h1/{role,decode,io}.rs`); the inbound
//! listener changes none of them on hyper's builder. Setting `max_headers`,
//! `max_buf_size` or a parser configuration there needs the same change here.

pub mod chunked;
pub mod hop_by_hop;
pub mod response;

/// hyper's default bound on header fields per head (and trailer fields per body).
pub const MAX_HEADERS: usize = 100;
/// hyper's default read buffer limit: a head still incomplete at this size is refused.
pub const MAX_HEAD: usize = 8192 + 4096 * 100;
/// hyper's bound on chunk-extension bytes, counted over a whole body.
pub const CHUNK_EXTENSIONS_LIMIT: u64 = 16 * 1024;
/// hyper's bound on trailer bytes.
pub const TRAILER_LIMIT: usize = 16 * 1024;
/// The largest `Content-Length` hyper accepts.
pub const MAX_CONTENT_LENGTH: u64 = u64::MAX - 2;

/// Bytes that break the HTTP/1 framing of a message (a bad chunk, a head that is not
/// one): what is wrong, in a few words.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Invalid(pub &'static str);

/// hyper's `headers::from_digits`: one or more ASCII digits, no sign, no overflow.
pub fn from_digits(bytes: &[u8]) -> Option<u64> {
    if bytes.is_empty() {
        return None;
    }
    bytes.iter().try_fold(0u64, |n, &b| match b {
        b'0'..=b'9' => n.checked_mul(10)?.checked_add(u64::from(b - b'0')),
        _ => None,
    })
}

/// hyper's `headers::is_chunked_`: the value is visible ASCII and its last
/// comma-separated coding is `chunked`.
pub fn is_chunked(value: &[u8]) -> bool {
    if !value.iter().all(|&b| b == b'\t' || (b' '..0x7f).contains(&b)) {
        return false;
    }
    let last = value.rsplit(|&b| b == b',').next().unwrap_or_default();
    trim(last).eq_ignore_ascii_case(b"chunked")
}

/// Without the spaces and tabs around it.
pub fn trim(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}
