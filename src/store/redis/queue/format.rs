//! The JSON a route's queue keeps in Redis, readable with `redis-cli HGET`: a message
//! in `:m`, a dead letter in `:d` (see the module above for the keys).

use std::borrow::Cow;

use base64::Engine as _;
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::store::queue::Message;
use crate::store::{StoreError, Token};

/// A message as `:m` holds it.
#[derive(Serialize, Deserialize)]
struct StoredMessage<'a> {
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    key: Option<Cow<'a, str>>,
    #[serde(borrow)]
    token: Cow<'a, str>,
    first_seen_ms: u64,
    queued_at_ms: u64,
    #[serde(borrow)]
    method: Cow<'a, str>,
    #[serde(borrow)]
    target: Cow<'a, str>,
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    headers: Option<Cow<'a, str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    headers_base64: Option<String>,
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    body: Option<Cow<'a, str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    body_base64: Option<String>,
}

/// A dead letter as `:d` holds it.
#[derive(Serialize, Deserialize)]
pub(super) struct StoredDead {
    #[serde(default)]
    pub(super) key: Option<String>,
    pub(super) attempts: u32,
    #[serde(default)]
    pub(super) last_error: Option<String>,
    pub(super) queued_at_ms: u64,
    pub(super) dead_at_ms: u64,
}

/// Text as it is when it is UTF-8, else base64 beside it.
fn text_or_base64(bytes: &[u8]) -> (Option<Cow<'_, str>>, Option<String>) {
    match std::str::from_utf8(bytes) {
        Ok(text) => (Some(Cow::Borrowed(text)), None),
        Err(_) => (None, Some(base64::engine::general_purpose::STANDARD.encode(bytes))),
    }
}

fn bytes_of(text: Option<Cow<str>>, b64: Option<String>) -> Result<Bytes, StoreError> {
    match (text, b64) {
        (Some(text), _) => Ok(Bytes::from(text.into_owned())),
        (None, Some(b64)) => base64::engine::general_purpose::STANDARD
            .decode(b64.as_bytes())
            .map(Bytes::from)
            .map_err(|e| StoreError::Corrupt(format!("queued message: {e}"))),
        (None, None) => Ok(Bytes::new()),
    }
}

pub(super) fn encode(m: &Message) -> Vec<u8> {
    let token = m.token.hex();
    let (headers, headers_base64) = text_or_base64(&m.headers);
    let (body, body_base64) = text_or_base64(&m.body);
    let stored = StoredMessage {
        key: m.key.as_deref().map(Cow::Borrowed),
        token: Cow::Borrowed(std::str::from_utf8(&token).unwrap_or_default()),
        first_seen_ms: m.first_seen_ms,
        queued_at_ms: m.queued_at_ms,
        method: Cow::Borrowed(&m.method),
        target: Cow::Borrowed(&m.target),
        headers,
        headers_base64,
        body,
        body_base64,
    };
    // Cannot fail: a Vec takes every write, and every map key is a string.
    serde_json::to_vec(&stored).unwrap_or_default()
}

pub(super) fn decode(id: String, raw: &[u8], attempts: u32, last_error: Option<String>) -> Result<Message, StoreError> {
    let m: StoredMessage =
        serde_json::from_slice(raw).map_err(|e| StoreError::Corrupt(format!("queued message {id}: {e}")))?;
    Ok(Message {
        key: m.key.map(Cow::into_owned),
        token: Token::from_u128(u128::from_str_radix(&m.token, 16).unwrap_or(0)),
        first_seen_ms: m.first_seen_ms,
        queued_at_ms: m.queued_at_ms,
        attempts,
        method: m.method.into_owned(),
        target: m.target.into_owned(),
        headers: bytes_of(m.headers, m.headers_base64)?,
        body: bytes_of(m.body, m.body_base64)?,
        last_error,
        id,
    })
}

/// What stands for a message whose stored value does not read, to make it a dead letter.
pub(super) fn unreadable_message(id: String, attempts: u32) -> Message {
    Message {
        id,
        key: None,
        token: Token::from_u128(0),
        first_seen_ms: 0,
        queued_at_ms: 0,
        attempts,
        method: String::new(),
        target: String::new(),
        headers: Bytes::new(),
        body: Bytes::new(),
        last_error: None,
    }
}
