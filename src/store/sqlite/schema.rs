//! The database's tables, as `sqlite3 gateway.db '.schema'` shows them. Times are Unix
//! milliseconds; tokens are the 32 hex digits logs show.
//!
//! `markers`: one row per stored key (`<key_prefix><route>:<id>`).
//! - `state`: `processing` (claimed, being forwarded; `token` names the owner),
//!   `completed` (`completed_ms` set; `response_*` hold the reply for `replay`) or
//!   `queued` (the message is in `queue`).
//! - `expires_ms`: when it ends; NULL for `queued` (it never expires while its message
//!   is held). An expired row is gone for every call, and swept in the background.
//!
//! `queue`: the messages of queued routes, one row per message.
//! - `route`, `id` (the message id as stored keys write it, or `nokey-<token>`), `key`
//!   (its marker's stored key; NULL without one).
//! - `state`: `ready` (due at `due_ms`: now, or a retry's time), `delivering` (a worker
//!   has it until `due_ms`, `upstream_timeout` + 5 s after it took it; unsettled by
//!   then, it is taken again) or `dead` (`dead_at_ms` set; kept until an operator acts).
//! - `attempts` (started so far), `last_error`, `queued_at_ms`, `first_seen_ms`,
//!   `token`; the request as it will be delivered: `method`, `target` (path and
//!   query), `headers` (`name: value` lines, CR LF each), `body`.
//!
//! `health`: one row, written by each readiness check (a write that must commit).
//!
//! A few queries an operator may want:
//! ```sql
//! SELECT state, count(*) FROM markers GROUP BY state;
//! SELECT route, state, count(*) FROM queue GROUP BY route, state;
//! SELECT id, attempts, last_error FROM queue WHERE state = 'dead';
//! ```

/// Creates what is missing; an existing database is used as it is.
pub(super) const CREATE: &str = "
CREATE TABLE IF NOT EXISTS markers (
    key TEXT PRIMARY KEY NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('processing', 'completed', 'queued')),
    token TEXT,
    first_seen_ms INTEGER NOT NULL,
    expires_ms INTEGER,
    completed_ms INTEGER,
    response_status INTEGER,
    response_content_type TEXT,
    response_content_encoding TEXT,
    response_body BLOB
);
CREATE INDEX IF NOT EXISTS markers_by_expiry ON markers (expires_ms) WHERE expires_ms IS NOT NULL;
CREATE INDEX IF NOT EXISTS markers_by_completion ON markers (completed_ms) WHERE state = 'completed';
CREATE TABLE IF NOT EXISTS queue (
    route TEXT NOT NULL,
    id TEXT NOT NULL,
    key TEXT,
    token TEXT NOT NULL,
    first_seen_ms INTEGER NOT NULL,
    queued_at_ms INTEGER NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    state TEXT NOT NULL CHECK (state IN ('ready', 'delivering', 'dead')),
    due_ms INTEGER NOT NULL,
    method TEXT NOT NULL,
    target TEXT NOT NULL,
    headers BLOB NOT NULL,
    body BLOB NOT NULL,
    last_error TEXT,
    dead_at_ms INTEGER,
    PRIMARY KEY (route, id)
);
CREATE INDEX IF NOT EXISTS queue_by_due ON queue (route, state, due_ms);
CREATE TABLE IF NOT EXISTS health (id INTEGER PRIMARY KEY, checked_ms INTEGER NOT NULL);
";
