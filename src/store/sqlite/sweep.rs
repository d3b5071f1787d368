//! The writer's housekeeping, between batches: expired markers deleted, and the
//! database held under `max_bytes` by the memory store's rule (COMPLETED markers go,
//! the longest completed first; PROCESSING and QUEUED markers and queued messages
//! never do: when only they are left, new claims and appends are refused).

use std::sync::atomic::Ordering;

use rusqlite::Connection;

use super::writer::Writer;
use crate::store::unix_ms;

/// Rows deleted per statement: one sweep never holds the writer for long.
const CHUNK: i64 = 2000;

/// Statements per sweep at most, for the same reason; the next sweep goes on.
const ROUNDS: usize = 16;

pub(super) fn run(w: &mut Writer) {
    if let Err(error) = sweep(w) {
        tracing::warn!(%error, "sqlite sweep failed");
    }
}

fn sweep(w: &mut Writer) -> rusqlite::Result<()> {
    let now = i64::try_from(unix_ms()).unwrap_or(i64::MAX);
    let mut expired = w
        .conn
        .prepare_cached("DELETE FROM markers WHERE key IN (SELECT key FROM markers WHERE expires_ms <= ?1 LIMIT ?2)")?;
    for _ in 0..ROUNDS {
        if expired.execute((now, CHUNK))? < CHUNK as usize {
            break;
        }
    }
    drop(expired);
    let limits = &w.limits;
    let mut used = used_bytes(&w.conn)?;
    let mut evict = w.conn.prepare_cached(
        "DELETE FROM markers WHERE key IN \
         (SELECT key FROM markers WHERE state = 'completed' ORDER BY completed_ms LIMIT ?1)",
    )?;
    let (mut rounds, mut nothing_left) = (0, false);
    while used > limits.max_bytes && rounds < ROUNDS {
        rounds += 1;
        if evict.execute([CHUNK])? == 0 {
            nothing_left = true;
            break;
        }
        used = used_bytes(&w.conn)?;
    }
    let full = used > limits.max_bytes && nothing_left;
    if full != limits.full.swap(full, Ordering::Relaxed) {
        if full {
            tracing::warn!(
                used,
                max_bytes = limits.max_bytes,
                "sqlite store over max_bytes with nothing left to evict: claims and appends refused"
            );
        } else {
            tracing::info!(used, "sqlite store back under max_bytes");
        }
    }
    Ok(())
}

/// Bytes the database's pages in use take (free pages, which new rows reuse, aside).
pub(super) fn used_bytes(conn: &Connection) -> rusqlite::Result<u64> {
    let pragma = |name: &str| conn.query_row(&format!("PRAGMA {name}"), [], |row| row.get::<_, i64>(0));
    let pages = pragma("page_count")? - pragma("freelist_count")?;
    Ok(u64::try_from(pages.max(0) * pragma("page_size")?).unwrap_or(0))
}
