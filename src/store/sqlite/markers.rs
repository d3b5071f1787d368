//! The marker calls ([`crate::store::Store`]) as statements on the `markers` table,
//! run by the writer thread inside its transaction.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, StatusCode};
use rusqlite::{OptionalExtension, Row, params};

use super::writer::Writer;
use crate::store::{Claim, Completion, Forgotten, KeyInfo, KeyState, Marker, StoreError, StoredResponse, Token};

/// The columns [`marker`] reads, in its order.
const COLUMNS: &str = "state, token, first_seen_ms, expires_ms, response_status, response_content_type, \
                       response_content_encoding, response_body";

/// SQLite's integers are signed; Unix ms and TTLs fit with room to spare.
pub(super) fn int(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

pub(super) fn uint(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

pub(super) fn token_text(token: Token) -> String {
    token.to_string()
}

/// The live marker at `key` (expired rows are gone for every call), with its expiry.
fn read(w: &Writer, key: &str, now: u64) -> Result<Option<(Marker, Option<u64>)>, StoreError> {
    let sql = format!("SELECT {COLUMNS} FROM markers WHERE key = ?1 AND (expires_ms IS NULL OR expires_ms > ?2)");
    let found = w
        .conn
        .prepare_cached(&sql)?
        .query_row(params![key, int(now)], |row| {
            Ok((marker(row), row.get::<_, Option<i64>>(3)?))
        })
        .optional()?;
    Ok(match found {
        Some((marker, expires)) => Some((marker?, expires.map(uint))),
        None => None,
    })
}

/// A row as a marker; an unreadable one is an error that names it.
fn marker(row: &Row) -> Result<Marker, StoreError> {
    let corrupt = |e: rusqlite::Error| StoreError::Corrupt(e.to_string());
    let state: String = row.get(0).map_err(corrupt)?;
    let first_seen_ms = uint(row.get(2).map_err(corrupt)?);
    Ok(match state.as_str() {
        "processing" => {
            let token: Option<String> = row.get(1).map_err(corrupt)?;
            let token = token
                .and_then(|t| u128::from_str_radix(&t, 16).ok())
                .ok_or_else(|| StoreError::Corrupt("a processing marker without a token".into()))?;
            Marker::Processing {
                token: Token::from_u128(token),
                first_seen_ms,
            }
        }
        "completed" => Marker::Completed {
            first_seen_ms,
            response: response(row).map_err(corrupt)?.map(Arc::new),
        },
        "queued" => Marker::Queued { first_seen_ms },
        other => return Err(StoreError::Corrupt(format!("unknown marker state {other:?}"))),
    })
}

fn response(row: &Row) -> rusqlite::Result<Option<StoredResponse>> {
    let Some(status) = row.get::<_, Option<u16>>(4)? else {
        return Ok(None);
    };
    let Ok(status) = StatusCode::from_u16(status) else {
        return Ok(None);
    };
    let header = |i| -> rusqlite::Result<Option<HeaderValue>> {
        Ok(row
            .get::<_, Option<String>>(i)?
            .and_then(|v| HeaderValue::from_str(&v).ok()))
    };
    Ok(Some(StoredResponse {
        status,
        content_type: header(5)?,
        content_encoding: header(6)?,
        body: Bytes::from(row.get::<_, Option<Vec<u8>>>(7)?.unwrap_or_default()),
    }))
}

pub(super) fn claim(
    w: &mut Writer,
    key: &str,
    token: Token,
    first_seen_ms: u64,
    ttl: Duration,
    now: u64,
) -> Result<Claim, StoreError> {
    if let Some((marker, _)) = read(w, key, now)? {
        return Ok(Claim::Found(marker));
    }
    if w.full() {
        return Err(StoreError::Unavailable(
            "sqlite store over max_bytes with only PROCESSING and QUEUED markers and queued messages".into(),
        ));
    }
    w.conn
        .prepare_cached(
            "INSERT OR REPLACE INTO markers (key, state, token, first_seen_ms, expires_ms) \
             VALUES (?1, 'processing', ?2, ?3, ?4)",
        )?
        .execute(params![key, token_text(token), int(first_seen_ms), int(now) + ms(ttl)])?;
    Ok(Claim::Claimed)
}

pub(super) fn complete(w: &mut Writer, key: &str, token: Token, c: &Completion, now: u64) -> Result<bool, StoreError> {
    let r = c.response.as_ref();
    let text = |v: Option<&HeaderValue>| v.and_then(|v| v.to_str().ok()).map(str::to_owned);
    let changed = w
        .conn
        .prepare_cached(
            "UPDATE markers SET state = 'completed', token = NULL, expires_ms = ?3, completed_ms = ?4, \
             response_status = ?5, response_content_type = ?6, response_content_encoding = ?7, response_body = ?8 \
             WHERE key = ?1 AND state = 'processing' AND token = ?2 AND expires_ms > ?4",
        )?
        .execute(params![
            key,
            token_text(token),
            int(now) + ms(c.ttl),
            int(now),
            r.map(|r| r.status.as_u16()),
            text(r.and_then(|r| r.content_type.as_ref())),
            text(r.and_then(|r| r.content_encoding.as_ref())),
            r.map(|r| r.body.as_ref()),
        ])?;
    Ok(changed == 1)
}

pub(super) fn release(w: &mut Writer, key: &str, token: Token, now: u64) -> Result<bool, StoreError> {
    let changed = w
        .conn
        .prepare_cached(
            "DELETE FROM markers WHERE key = ?1 AND state = 'processing' AND token = ?2 AND expires_ms > ?3",
        )?
        .execute(params![key, token_text(token), int(now)])?;
    Ok(changed == 1)
}

pub(super) fn get(w: &Writer, key: &str, now: u64) -> Result<Option<Marker>, StoreError> {
    Ok(read(w, key, now)?.map(|(marker, _)| marker))
}

pub(super) fn inspect(w: &Writer, key: &str, now: u64) -> Result<Option<KeyInfo>, StoreError> {
    Ok(read(w, key, now)?.map(|(marker, expires)| {
        let (state, reply_stored) = match &marker {
            Marker::Processing { .. } => (KeyState::Processing, false),
            Marker::Completed { response, .. } => (KeyState::Completed, response.is_some()),
            Marker::Queued { .. } => (KeyState::Queued, false),
        };
        KeyInfo {
            state,
            first_seen_ms: marker.first_seen_ms(),
            ttl: expires.map(|e| Duration::from_millis(e.saturating_sub(now))),
            reply_stored,
        }
    }))
}

/// Deletes the marker; one that is not COMPLETED only with `force` (a PROCESSING
/// one's owner may still be forwarding; a QUEUED one's message is still held, and a
/// retry of it would be acknowledged again by the append, not queued twice).
pub(super) fn forget(w: &mut Writer, key: &str, force: bool, now: u64) -> Result<Forgotten, StoreError> {
    let Some((marker, _)) = read(w, key, now)? else {
        return Ok(Forgotten::Absent);
    };
    let state = match marker {
        Marker::Completed { .. } => KeyState::Completed,
        Marker::Processing { .. } if force => KeyState::Processing,
        Marker::Queued { .. } if force => KeyState::Queued,
        _ => return Ok(Forgotten::Refused),
    };
    w.conn
        .prepare_cached("DELETE FROM markers WHERE key = ?1")?
        .execute([key])?;
    Ok(Forgotten::Deleted(state))
}

/// Marks a delivered message's marker COMPLETED for `ttl` (whatever holds it: while
/// its message is held, only the message's own append wrote it).
pub(super) fn delivered(
    w: &mut Writer,
    key: &str,
    first_seen_ms: u64,
    ttl: Duration,
    now: u64,
) -> Result<(), StoreError> {
    w.conn
        .prepare_cached(
            "INSERT INTO markers (key, state, first_seen_ms, expires_ms, completed_ms) \
             VALUES (?1, 'completed', ?2, ?3, ?4) \
             ON CONFLICT (key) DO UPDATE SET state = 'completed', token = NULL, expires_ms = ?3, completed_ms = ?4, \
             response_status = NULL, response_content_type = NULL, response_content_encoding = NULL, \
             response_body = NULL",
        )?
        .execute(params![key, int(first_seen_ms), int(now) + ms(ttl), int(now)])?;
    Ok(())
}

/// Marks a message's marker QUEUED, without expiry.
pub(super) fn queued(w: &mut Writer, key: &str, first_seen_ms: u64) -> Result<(), StoreError> {
    w.conn
        .prepare_cached(
            "INSERT INTO markers (key, state, first_seen_ms) VALUES (?1, 'queued', ?2) \
             ON CONFLICT (key) DO UPDATE SET state = 'queued', token = NULL, expires_ms = NULL",
        )?
        .execute(params![key, int(first_seen_ms)])?;
    Ok(())
}

/// Deletes a dropped dead letter's marker, whatever it holds.
pub(super) fn remove(w: &mut Writer, key: &str) -> Result<(), StoreError> {
    w.conn
        .prepare_cached("DELETE FROM markers WHERE key = ?1")?
        .execute([key])?;
    Ok(())
}
