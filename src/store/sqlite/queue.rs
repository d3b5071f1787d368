//! The queue calls ([`crate::store::QueueStore`]) as statements on the `queue` table,
//! run by the writer thread: an append and its marker in one transaction.

use std::time::Duration;

use bytes::Bytes;
use rusqlite::{OptionalExtension, Row, params};

use super::markers::{self, int, token_text, uint};
use super::writer::Writer;
use crate::store::queue::{DeadLetter, Enqueued, Lease, Leased, Message, QueueCounts, Settled};
use crate::store::{StoreError, Token, unix_ms};

/// The claim and the append in one transaction: a key already held is found, and
/// nothing else happens.
pub(super) fn enqueue(w: &mut Writer, route: &str, m: &Message, max_queued: u64) -> Result<Enqueued, StoreError> {
    if let Some(key) = &m.key
        && let Some(marker) = markers::get(w, key, unix_ms())?
    {
        return Ok(Enqueued::Found(marker));
    }
    let held = w.held(route)?;
    let exists = w
        .conn
        .prepare_cached("SELECT 1 FROM queue WHERE route = ?1 AND id = ?2")?
        .query_row(params![route, m.id], |_| Ok(()))
        .optional()?
        .is_some();
    if !exists {
        if held >= max_queued {
            return Ok(Enqueued::Full);
        }
        if w.full() {
            return Err(StoreError::Unavailable("sqlite store over max_bytes".into()));
        }
        w.conn
            .prepare_cached(
                "INSERT INTO queue (route, id, key, token, first_seen_ms, queued_at_ms, attempts, state, due_ms, \
                 method, target, headers, body) VALUES (?1, ?2, ?3, ?4, ?5, ?6, 0, 'ready', ?6, ?7, ?8, ?9, ?10)",
            )?
            .execute(params![
                route,
                m.id,
                m.key,
                token_text(m.token),
                int(m.first_seen_ms),
                int(m.queued_at_ms),
                m.method,
                m.target,
                m.headers.as_ref(),
                m.body.as_ref(),
            ])?;
    }
    if let Some(key) = &m.key {
        markers::queued(w, key, m.first_seen_ms)?;
    }
    if !exists {
        w.adjust_held(route, 1);
    }
    Ok(Enqueued::Queued)
}

/// The columns [`message`] reads, in its order.
const MESSAGE: &str =
    "id, key, token, first_seen_ms, queued_at_ms, attempts, method, target, headers, body, last_error, rowid";

fn message(row: &Row) -> rusqlite::Result<(Message, i64)> {
    let token: String = row.get(2)?;
    Ok((
        Message {
            id: row.get(0)?,
            key: row.get(1)?,
            token: Token::from_u128(u128::from_str_radix(&token, 16).unwrap_or(0)),
            first_seen_ms: uint(row.get(3)?),
            queued_at_ms: uint(row.get(4)?),
            attempts: u32::try_from(row.get::<_, i64>(5)?).unwrap_or(u32::MAX),
            method: row.get(6)?,
            target: row.get(7)?,
            headers: Bytes::from(row.get::<_, Vec<u8>>(8)?),
            body: Bytes::from(row.get::<_, Vec<u8>>(9)?),
            last_error: row.get(10)?,
        },
        row.get(11)?,
    ))
}

/// Takes up to `max` messages due, the first due first: ready ones, or ones a worker
/// took and has not settled within `reclaim_after` (their lease's `due_ms`: the call
/// that took one may have lost its reply, or its worker is gone).
pub(super) fn lease(
    w: &mut Writer,
    route: &str,
    now: u64,
    reclaim_after: Duration,
    max: usize,
) -> Result<Lease, StoreError> {
    let sql = format!(
        "UPDATE queue SET state = 'delivering', attempts = attempts + 1, due_ms = ?3 WHERE rowid IN \
         (SELECT rowid FROM queue WHERE route = ?1 AND state IN ('ready', 'delivering') AND due_ms <= ?2 \
         ORDER BY due_ms LIMIT ?4) RETURNING {MESSAGE}"
    );
    let until = now.saturating_add(u64::try_from(reclaim_after.as_millis()).unwrap_or(u64::MAX));
    let mut statement = w.conn.prepare_cached(&sql)?;
    let taken = statement
        .query_map(params![route, int(now), int(until), int(max as u64)], message)?
        .map(|row| {
            row.map(|(message, rowid)| Leased {
                message,
                lease: rowid.to_string(),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    drop(statement);
    if !taken.is_empty() {
        return Ok(Lease::Leased(taken));
    }
    let next: Option<i64> = w
        .conn
        .prepare_cached("SELECT min(due_ms) FROM queue WHERE route = ?1 AND state IN ('ready', 'delivering')")?
        .query_row([route], |row| row.get(0))?;
    Ok(Lease::Idle {
        next_due_ms: next.map(uint),
    })
}

/// Records how deliveries ended. A message taken over since (its lease ran out and
/// another attempt took it: `attempts` moved on) is left to that attempt, except that
/// a 2xx is recorded whoever holds it: the message was delivered.
pub(super) fn settle_all(w: &mut Writer, route: &str, ended: &[(Leased, Settled)]) -> Result<(), StoreError> {
    let mut gone = 0;
    for (leased, settled) in ended {
        gone += settle(w, route, leased, settled)?;
    }
    // Counted once every row is written: a failure rolls them all back.
    w.adjust_held(route, -gone);
    Ok(())
}

/// One delivery's end; how many messages left the queue.
fn settle(w: &mut Writer, route: &str, leased: &Leased, settled: &Settled) -> Result<i64, StoreError> {
    let m = &leased.message;
    let now = unix_ms();
    let attempt = i64::from(m.attempts);
    let changed = match settled {
        Settled::Delivered { completed_ttl } => {
            if let Some(key) = &m.key {
                markers::delivered(w, key, m.first_seen_ms, *completed_ttl, now)?;
            }
            let gone = w
                .conn
                .prepare_cached("DELETE FROM queue WHERE route = ?1 AND id = ?2")?
                .execute(params![route, m.id])?;
            return Ok(gone as i64);
        }
        Settled::Retry { due_ms, error } => w
            .conn
            .prepare_cached(
                "UPDATE queue SET state = 'ready', due_ms = ?4, last_error = ?5 \
                 WHERE route = ?1 AND id = ?2 AND state = 'delivering' AND attempts = ?3",
            )?
            .execute(params![route, m.id, attempt, int(*due_ms), error])?,
        Settled::Dead { error } => w
            .conn
            .prepare_cached(
                "UPDATE queue SET state = 'dead', last_error = ?4, dead_at_ms = ?5 \
                 WHERE route = ?1 AND id = ?2 AND state = 'delivering' AND attempts = ?3",
            )?
            .execute(params![route, m.id, attempt, error, int(now)])?,
        Settled::Returned => w
            .conn
            .prepare_cached(
                "UPDATE queue SET state = 'ready', due_ms = ?4 \
                 WHERE route = ?1 AND id = ?2 AND state = 'delivering' AND attempts = ?3",
            )?
            .execute(params![route, m.id, attempt, int(now)])?,
    };
    if changed == 0 {
        tracing::debug!(route, id = %m.id, "delivery taken over since: its end is left to the new attempt");
    }
    Ok(0)
}

pub(super) fn counts(w: &Writer, route: &str, now: u64) -> Result<QueueCounts, StoreError> {
    let counted = w
        .conn
        .prepare_cached(
            "SELECT count(*) FILTER (WHERE state = 'ready' AND due_ms <= ?2), \
             count(*) FILTER (WHERE state = 'ready' AND due_ms > ?2), \
             count(*) FILTER (WHERE state = 'delivering'), count(*) FILTER (WHERE state = 'dead'), \
             min(queued_at_ms) FILTER (WHERE state != 'dead') FROM queue WHERE route = ?1",
        )?
        .query_row(params![route, int(now)], |row| {
            Ok(QueueCounts {
                ready: uint(row.get(0)?),
                scheduled: uint(row.get(1)?),
                delivering: uint(row.get(2)?),
                dead: uint(row.get(3)?),
                oldest_queued_at_ms: row.get::<_, Option<i64>>(4)?.map(uint),
            })
        })?;
    Ok(counted)
}

pub(super) fn dead_letters(w: &Writer, route: &str, limit: usize) -> Result<Vec<DeadLetter>, StoreError> {
    let mut statement = w.conn.prepare_cached(
        "SELECT id, key, attempts, last_error, queued_at_ms, dead_at_ms FROM queue \
         WHERE route = ?1 AND state = 'dead' ORDER BY dead_at_ms, id LIMIT ?2",
    )?;
    let rows = statement.query_map(params![route, int(limit as u64)], |row| {
        Ok(DeadLetter {
            id: row.get(0)?,
            key: row.get(1)?,
            attempts: u32::try_from(row.get::<_, i64>(2)?).unwrap_or(u32::MAX),
            last_error: row.get(3)?,
            queued_at_ms: uint(row.get(4)?),
            dead_at_ms: uint(row.get::<_, Option<i64>>(5)?.unwrap_or(0)),
        })
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}

pub(super) fn retry_dead(w: &mut Writer, route: &str, id: Option<&str>, now: u64) -> Result<u64, StoreError> {
    let back = w
        .conn
        .prepare_cached(
            "UPDATE queue SET state = 'ready', due_ms = ?3, attempts = 0, dead_at_ms = NULL \
             WHERE route = ?1 AND state = 'dead' AND (?2 IS NULL OR id = ?2)",
        )?
        .execute(params![route, id, int(now)])?;
    Ok(back as u64)
}

pub(super) fn drop_dead(w: &mut Writer, route: &str, id: &str) -> Result<bool, StoreError> {
    let key: Option<Option<String>> = w
        .conn
        .prepare_cached("DELETE FROM queue WHERE route = ?1 AND id = ?2 AND state = 'dead' RETURNING key")?
        .query_row(params![route, id], |row| row.get(0))
        .optional()?;
    let Some(key) = key else { return Ok(false) };
    if let Some(key) = key {
        markers::remove(w, &key)?;
    }
    w.adjust_held(route, -1);
    Ok(true)
}
