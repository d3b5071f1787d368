//! The stored value: JSON, readable with `redis-cli GET`, written and read by
//! serde_json.
//!
//! - PROCESSING: `{"state":"processing","token":"<32 hex>","first_seen_ms":<unix ms>}`
//! - QUEUED (a queued route's message is in its queue; no TTL):
//!   `{"state":"queued","first_seen_ms":..}`
//! - COMPLETED: `{"state":"completed","first_seen_ms":..,"completed_ms":..}`, with
//!   `"response":{"status":..,"content_type":..,"content_encoding":..,"body":..}` for
//!   `replay` (`body_base64` instead of `body` when the body is not UTF-8).
//!
//! Complete and release compare a PROCESSING value: byte for byte with `IFEQ`, or by
//! its prefix up to the token in the Lua scripts ([`token_prefix`]), so the fields
//! are written in this order.

use std::borrow::Cow;
use std::sync::Arc;

use base64::Engine as _;
use bytes::Bytes;
use http::{HeaderValue, StatusCode};
use serde::{Deserialize, Serialize};

use crate::store::{Completion, Marker, StoreError, StoredResponse, Token};

/// A stored value as it is on the wire. Its strings borrow: written from the
/// completion's own bytes, read from the reply without a copy where no escape needs
/// undoing. One flat struct, not an enum tagged by `state`: serde reads a tagged enum
/// by buffering the whole value first.
#[derive(Serialize, Deserialize)]
pub(super) struct Value<'a> {
    state: State,
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    token: Option<Cow<'a, str>>,
    /// Always written; missing (a value written by hand) reads as 0.
    #[serde(default)]
    first_seen_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    completed_ms: Option<u64>,
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    response: Option<ResponseValue<'a>>,
}

#[derive(Clone, Copy, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum State {
    Processing,
    Completed,
    Queued,
}

/// A stored response: the body as text when it is UTF-8, else base64.
#[derive(Serialize, Deserialize)]
pub(super) struct ResponseValue<'a> {
    status: u16,
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    content_type: Option<Cow<'a, str>>,
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    content_encoding: Option<Cow<'a, str>>,
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    body: Option<Cow<'a, str>>,
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    body_base64: Option<Cow<'a, str>>,
}

/// The PROCESSING value a claim by `token` writes.
pub(super) fn processing(token: Token, first_seen_ms: u64) -> Vec<u8> {
    let hex = token.hex();
    let value = Value {
        state: State::Processing,
        token: std::str::from_utf8(&hex).ok().map(Cow::Borrowed),
        first_seen_ms,
        completed_ms: None,
        response: None,
    };
    to_vec(&value)
}

/// The QUEUED value of a message first seen at `first_seen_ms`.
pub(super) fn queued(first_seen_ms: u64) -> Vec<u8> {
    to_vec(&Value {
        state: State::Queued,
        token: None,
        first_seen_ms,
        completed_ms: None,
        response: None,
    })
}

/// `{"state":"processing","token":"<hex>"`: how every PROCESSING value held by
/// `token` starts, whatever its `first_seen_ms` (what the Lua scripts compare).
pub(super) fn token_prefix(token: Token) -> Vec<u8> {
    let mut prefix = br#"{"state":"processing","token":""#.to_vec();
    prefix.extend_from_slice(&token.hex());
    prefix.push(b'"');
    prefix
}

/// The COMPLETED value for `c`, completed at `completed_ms`.
pub(super) fn completed(c: &Completion, completed_ms: u64) -> Vec<u8> {
    let response = c.response.as_ref().map(|r| {
        let (body, body_base64) = match std::str::from_utf8(&r.body) {
            Ok(text) => (Some(Cow::Borrowed(text)), None),
            Err(_) => (
                None,
                Some(Cow::Owned(base64::engine::general_purpose::STANDARD.encode(&r.body))),
            ),
        };
        fn text(v: &Option<HeaderValue>) -> Option<Cow<'_, str>> {
            v.as_ref().and_then(|v| v.to_str().ok()).map(Cow::Borrowed)
        }
        ResponseValue {
            status: r.status.as_u16(),
            content_type: text(&r.content_type),
            content_encoding: text(&r.content_encoding),
            body,
            body_base64,
        }
    });
    to_vec(&Value {
        state: State::Completed,
        token: None,
        first_seen_ms: c.first_seen_ms,
        completed_ms: Some(completed_ms),
        response,
    })
}

pub(super) fn to_vec(value: &Value) -> Vec<u8> {
    // Cannot fail: a Vec takes every write, and every map key is a string.
    serde_json::to_vec(value).unwrap_or_default()
}

/// Reads the value stored at `key`. What a gateway writes is read exactly; a value
/// written by hand or by another tool as leniently as it can be. One that cannot be
/// read at all is still a key someone holds: PROCESSING by a holder that is no request
/// of this gateway, so it is neither forwarded past (not even with `on_error =
/// "forward"`, which is for a store that does not answer) nor answered as a duplicate,
/// and it ends with its TTL or an operator's `DELETE /keys/...?force=true`.
pub(super) fn parse_marker(key: &str, raw: &[u8]) -> Marker {
    parse(raw).unwrap_or_else(|| {
        let shown = String::from_utf8_lossy(raw.get(..80).unwrap_or(raw)).into_owned();
        tracing::warn!(key, value = %shown, "unreadable marker: taken as PROCESSING by another holder");
        Marker::Processing {
            token: foreign_token(raw),
            first_seen_ms: 0,
        }
    })
}

/// Any stored value: `None` when it is no marker at all. A token that is not one of
/// ours (not hex) names a foreign holder; a stored response that does not read leaves
/// the duplicate answer to the route.
pub(super) fn parse(raw: &[u8]) -> Option<Marker> {
    let Ok(value) = serde_json::from_slice::<Value>(raw) else {
        // The plain word some hand-rolled dedup writes for done.
        return raw
            .trim_ascii()
            .eq_ignore_ascii_case(b"completed")
            .then_some(Marker::Completed {
                first_seen_ms: 0,
                response: None,
            });
    };
    let first_seen_ms = value.first_seen_ms;
    Some(match value.state {
        State::Processing => Marker::Processing {
            token: value
                .token
                .as_deref()
                .and_then(|t| u128::from_str_radix(t, 16).ok())
                .map_or_else(|| foreign_token(raw), Token::from_u128),
            first_seen_ms,
        },
        State::Completed => Marker::Completed {
            first_seen_ms,
            response: value.response.and_then(|r| stored_response(r).ok()).map(Arc::new),
        },
        State::Queued => Marker::Queued { first_seen_ms },
    })
}

/// The holder of a PROCESSING value whose token is not one a gateway writes: derived
/// from the value, so it is no request's of this gateway (a 128-bit collision aside).
pub(super) fn foreign_token(raw: &[u8]) -> Token {
    let digest = <sha2::Sha256 as sha2::Digest>::digest(raw);
    let mut first = [0u8; 16];
    first.copy_from_slice(&digest[..16]);
    Token::from_u128(u128::from_be_bytes(first))
}

pub(super) fn stored_response(r: ResponseValue) -> Result<StoredResponse, StoreError> {
    let status = StatusCode::from_u16(r.status).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let body = match (r.body, r.body_base64) {
        (Some(text), _) => Bytes::from(text.into_owned()),
        (None, Some(b64)) => base64::engine::general_purpose::STANDARD
            .decode(b64.as_bytes())
            .map(Bytes::from)
            .map_err(|e| StoreError::Corrupt(e.to_string()))?,
        (None, None) => Bytes::new(),
    };
    let header = |v: Option<Cow<str>>| v.and_then(|v| HeaderValue::from_str(&v).ok());
    Ok(StoredResponse {
        status,
        content_type: header(r.content_type),
        content_encoding: header(r.content_encoding),
        body,
    })
}
