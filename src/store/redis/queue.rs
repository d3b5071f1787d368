//! A queued route's queue in Redis, shared by every replica. All of a route's keys
//! carry the route as one hash tag (`<key_prefix>{<route>}:...`), so one Lua script
//! can act on them together, in a cluster too:
//!
//! - `:q`, a stream with the consumer group `deliver`: one entry (`id <message id>`)
//!   per message due for delivery. A replica reads entries with `XREADGROUP`; one
//!   left pending longer than `upstream_timeout` + 5 s (its replica died mid-delivery)
//!   is taken over with `XAUTOCLAIM`.
//! - `:m`, a hash: message id -> the message (JSON, below). What `max_queued` counts.
//! - `:a`, a hash: message id -> attempts started. `:e`: message id -> last error.
//! - `:r`, a sorted set: message ids waiting for a retry, scored by when (Unix ms).
//! - `:d`, a hash: message id -> dead letter (JSON: `key`, `attempts`, `last_error`,
//!   `queued_at_ms`, `dead_at_ms`).
//! - `:o`, a sorted set: message ids not yet delivered nor dead, scored by when they
//!   were queued (the age of the oldest).
//!
//! A message: `{"key":..,"token":..,"first_seen_ms":..,"queued_at_ms":..,
//! "method":"POST","target":"/path?query","headers":"name: value\r\n...","body":".."}`,
//! with `headers_base64` / `body_base64` instead when they are not UTF-8.
//!
//! The marker is another key (another slot): an append stores the message, then marks
//! QUEUED; a delivery marks COMPLETED, then removes the message. A crash between the
//! two steps leaves the message held and is healed by the next step: an append finds
//! the id held and stores nothing twice; a lease finds the marker COMPLETED and
//! removes the message without delivering it.

use std::borrow::Cow;
use std::sync::LazyLock;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use deadpool_redis::redis::{self, Script};
use serde::{Deserialize, Serialize};

use super::RedisStore;
use super::command::Arg;
use super::connection::Call;
use super::value::{self, parse_marker};
use crate::store::queue::{Appended, DeadLetter, Lease, Leased, Message, QueueCounts, QueueStore, Settled};
use crate::store::{Completion, Marker, StoreError, Token, unix_ms};

/// The consumer group every replica reads a route's stream in.
const GROUP: &str = "deliver";

/// KEYS: q m o. ARGV: id, message, max_queued, queued_at_ms, group. Returns 1 stored,
/// 2 held already, 0 full.
const APPEND_LUA: &str = r"if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then return 2 end
if redis.call('HLEN', KEYS[2]) >= tonumber(ARGV[3]) then return 0 end
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('XGROUP', 'CREATE', KEYS[1], ARGV[5], '0', 'MKSTREAM')
end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[1])
redis.call('XADD', KEYS[1], '*', 'id', ARGV[1])
return 1";

/// KEYS: q m r a e. ARGV: group, consumer, reclaim after (ms), now (ms). Moves due
/// retries to the stream, then takes one entry (an abandoned one first) whose message
/// is still held, counting the attempt: {entry id, message id, message, attempts, last
/// error}, or {'', '', '', 0, next retry's time or ''} when nothing is due.
const LEASE_LUA: &str = r"pcall(redis.call, 'XGROUP', 'CREATE', KEYS[1], ARGV[1], '0', 'MKSTREAM')
local due = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', ARGV[4], 'LIMIT', 0, 100)
for _, id in ipairs(due) do
  redis.call('ZREM', KEYS[3], id)
  redis.call('XADD', KEYS[1], '*', 'id', id)
end
local function pick(entries)
  for _, e in ipairs(entries) do
    local id = e[2] and e[2][2]
    local msg = id and redis.call('HGET', KEYS[2], id)
    if msg then
      local attempts = redis.call('HINCRBY', KEYS[4], id, 1)
      return {e[1], id, msg, attempts, redis.call('HGET', KEYS[5], id) or ''}
    end
    redis.call('XACK', KEYS[1], ARGV[1], e[1])
    redis.call('XDEL', KEYS[1], e[1])
  end
end
local claimed = redis.call('XAUTOCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[3], '0-0', 'COUNT', 1)
local got = pick(claimed[2])
if got then return got end
for _ = 1, 16 do
  local read = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', 1, 'STREAMS', KEYS[1], '>')
  if not read then break end
  got = pick(read[1][2])
  if got then return got end
end
local nxt = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
return {'', '', '', 0, nxt[2] or ''}";

/// KEYS: q m a e o r d. ARGV: how (done, retry, dead, return), group, entry id,
/// message id, due (retry), error (retry, dead), dead letter (dead).
const SETTLE_LUA: &str = r"redis.call('XACK', KEYS[1], ARGV[2], ARGV[3])
redis.call('XDEL', KEYS[1], ARGV[3])
local id = ARGV[4]
if ARGV[1] == 'done' then
  redis.call('HDEL', KEYS[2], id)
  redis.call('HDEL', KEYS[3], id)
  redis.call('HDEL', KEYS[4], id)
  redis.call('ZREM', KEYS[5], id)
elseif ARGV[1] == 'retry' then
  redis.call('HSET', KEYS[4], id, ARGV[6])
  redis.call('ZADD', KEYS[6], ARGV[5], id)
elseif ARGV[1] == 'dead' then
  redis.call('HSET', KEYS[4], id, ARGV[6])
  redis.call('HSET', KEYS[7], id, ARGV[7])
  redis.call('ZREM', KEYS[5], id)
else
  redis.call('XADD', KEYS[1], '*', 'id', id)
end
return 1";

/// KEYS: q r d o. ARGV: group, now. {ready, scheduled, delivering, dead, oldest
/// queued_at_ms or ''}.
const COUNTS_LUA: &str = r"local len = redis.call('XLEN', KEYS[1])
local pending = 0
if len > 0 then
  local ok, p = pcall(redis.call, 'XPENDING', KEYS[1], ARGV[1])
  if ok then pending = p[1] end
end
local due = redis.call('ZCOUNT', KEYS[2], '-inf', ARGV[2])
local later = redis.call('ZCARD', KEYS[2]) - due
local oldest = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')
return {len - pending + due, later, pending, redis.call('HLEN', KEYS[3]), oldest[2] or ''}";

/// KEYS: q d a e o m. ARGV: group, id ('' for every one). Dead letters back to the
/// stream, attempts reset. Returns how many.
const RETRY_DEAD_LUA: &str = r"local ids = {ARGV[2]}
if ARGV[2] == '' then ids = redis.call('HKEYS', KEYS[2]) end
local n = 0
for _, id in ipairs(ids) do
  local dead = redis.call('HGET', KEYS[2], id)
  if dead and redis.call('HEXISTS', KEYS[6], id) == 1 then
    redis.call('HDEL', KEYS[2], id)
    redis.call('HDEL', KEYS[3], id)
    local ok, d = pcall(cjson.decode, dead)
    redis.call('ZADD', KEYS[5], (ok and type(d) == 'table' and d.queued_at_ms) or 0, id)
    pcall(redis.call, 'XGROUP', 'CREATE', KEYS[1], ARGV[1], '0', 'MKSTREAM')
    redis.call('XADD', KEYS[1], '*', 'id', id)
    n = n + 1
  end
end
return n";

/// KEYS: d m a e. ARGV: id. Drops a dead letter; returns it (for its key), or nil.
const DROP_DEAD_LUA: &str = r"local dead = redis.call('HGET', KEYS[1], ARGV[1])
if not dead then return false end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
return dead";

static APPEND: LazyLock<Script> = LazyLock::new(|| Script::new(APPEND_LUA));
static LEASE: LazyLock<Script> = LazyLock::new(|| Script::new(LEASE_LUA));
static SETTLE: LazyLock<Script> = LazyLock::new(|| Script::new(SETTLE_LUA));
static COUNTS: LazyLock<Script> = LazyLock::new(|| Script::new(COUNTS_LUA));
static RETRY_DEAD: LazyLock<Script> = LazyLock::new(|| Script::new(RETRY_DEAD_LUA));
static DROP_DEAD: LazyLock<Script> = LazyLock::new(|| Script::new(DROP_DEAD_LUA));

/// A route's keys (see the module doc).
struct Keys {
    q: String,
    m: String,
    a: String,
    e: String,
    o: String,
    r: String,
    d: String,
}

impl Keys {
    fn new(prefix: &str, route: &str) -> Self {
        let key = |suffix: &str| format!("{prefix}{{{route}}}:{suffix}");
        Keys {
            q: key("q"),
            m: key("m"),
            a: key("a"),
            e: key("e"),
            o: key("o"),
            r: key("r"),
            d: key("d"),
        }
    }
}

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
struct StoredDead {
    #[serde(default)]
    key: Option<String>,
    attempts: u32,
    #[serde(default)]
    last_error: Option<String>,
    queued_at_ms: u64,
    dead_at_ms: u64,
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

fn encode(m: &Message) -> Vec<u8> {
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

fn decode(id: String, raw: &[u8], attempts: u32, last_error: Option<String>) -> Result<Message, StoreError> {
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

/// A consumer name for a store, unique across replicas and restarts: each store
/// reads a route's stream as its own consumer of the route's group.
pub(super) fn consumer_name() -> String {
    format!("gw-{}", Token::generate())
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl RedisStore {
    /// The append script, followed by `WAIT` on the same connection when
    /// `wait_replicas` asks for it (WAIT counts the writes of its own connection).
    async fn append_message(&self, k: &Keys, m: &Message, max_queued: u64) -> Result<i64, StoreError> {
        let blob = encode(m);
        let queued_at = m.queued_at_ms;
        let replicas = self.wait_replicas;
        if replicas == 0 {
            let args = [
                Arg::from(k.q.as_str()),
                k.m.as_str().into(),
                k.o.as_str().into(),
                m.id.as_str().into(),
                Arg::Bytes(&blob),
                Arg::Int(max_queued),
                Arg::Int(queued_at),
                GROUP.into(),
            ];
            return self.call(&self.conns(), Call::Script(&APPEND, 3, &args)).await;
        }
        let mut pipe = redis::pipe();
        pipe.cmd("EVAL")
            .arg(APPEND_LUA)
            .arg(3)
            .arg(&k.q)
            .arg(&k.m)
            .arg(&k.o)
            .arg(&m.id)
            .arg(&blob)
            .arg(max_queued)
            .arg(queued_at)
            .arg(GROUP)
            .cmd("WAIT")
            .arg(replicas)
            .arg(millis(self.timeout).max(1));
        let (stored, confirmed): (i64, u64) = self.call(&self.conns(), Call::Pipe(&pipe)).await?;
        if confirmed < u64::from(replicas) && stored != 0 {
            // Stored on the primary all the same: the sender's retry finds it held.
            return Err(StoreError::Unavailable(format!(
                "{confirmed} of {replicas} replicas confirmed the append within store.timeout"
            )));
        }
        Ok(stored)
    }

    /// Runs the settle script for `how`.
    async fn settle_script(
        &self,
        k: &Keys,
        leased: &Leased,
        how: &str,
        due_ms: u64,
        error: &str,
        dead: &[u8],
    ) -> Result<(), StoreError> {
        let args = [
            Arg::from(k.q.as_str()),
            k.m.as_str().into(),
            k.a.as_str().into(),
            k.e.as_str().into(),
            k.o.as_str().into(),
            k.r.as_str().into(),
            k.d.as_str().into(),
            how.into(),
            GROUP.into(),
            leased.lease.as_str().into(),
            leased.message.id.as_str().into(),
            Arg::Int(due_ms),
            error.into(),
            Arg::Bytes(dead),
        ];
        self.call::<redis::Value>(&self.conns(), Call::Script(&SETTLE, 7, &args))
            .await
            .map(drop)
    }

    /// COMPLETED for `ttl`, whatever the marker held (while the message is held, only
    /// its own append wrote it).
    async fn mark_delivered(&self, m: &Message, ttl: Duration) -> Result<(), StoreError> {
        let Some(key) = &m.key else { return Ok(()) };
        let completion = Completion {
            first_seen_ms: m.first_seen_ms,
            ttl,
            response: None,
        };
        let completed = value::completed(&completion, unix_ms());
        let args = [
            key.as_str().into(),
            Arg::Bytes(&completed),
            "PX".into(),
            Arg::Int(millis(ttl).max(1)),
        ];
        self.call::<redis::Value>(&self.conns(), Call::Cmd("SET", &args))
            .await
            .map(drop)
    }

    /// One run of the lease script.
    async fn lease_once(&self, k: &Keys, now_ms: u64, reclaim_after: Duration) -> Result<Lease, StoreError> {
        let args = [
            Arg::from(k.q.as_str()),
            k.m.as_str().into(),
            k.r.as_str().into(),
            k.a.as_str().into(),
            k.e.as_str().into(),
            GROUP.into(),
            self.consumer.as_str().into(),
            Arg::Int(millis(reclaim_after)),
            Arg::Int(now_ms),
        ];
        let (entry, id, raw, attempts, extra): (String, String, Vec<u8>, u32, String) =
            self.call(&self.conns(), Call::Script(&LEASE, 5, &args)).await?;
        if entry.is_empty() {
            return Ok(Lease::Idle {
                // A score comes back as Redis writes a double.
                next_due_ms: extra.parse::<f64>().ok().map(|ms| ms as u64),
            });
        }
        let last_error = Some(extra).filter(|e| !e.is_empty());
        let message = decode(id, &raw, attempts, last_error)?;
        Ok(Lease::Leased(Box::new(Leased { message, lease: entry })))
    }
}

impl QueueStore for RedisStore {
    async fn append(&self, route: &str, message: &Message, max_queued: u64) -> Result<Appended, StoreError> {
        let k = Keys::new(&self.key_prefix, route);
        if self.append_message(&k, message, max_queued).await? == 0 {
            return Ok(Appended::Full);
        }
        if let Some(key) = &message.key {
            let queued = value::queued(message.first_seen_ms);
            let args = [key.as_str().into(), Arg::Bytes(&queued)];
            self.call::<redis::Value>(&self.conns(), Call::Cmd("SET", &args))
                .await?;
        }
        Ok(Appended::Queued)
    }

    async fn lease(&self, route: &str, now_ms: u64, reclaim_after: Duration) -> Result<Lease, StoreError> {
        let k = Keys::new(&self.key_prefix, route);
        loop {
            let lease = self.lease_once(&k, now_ms, reclaim_after).await?;
            let Lease::Leased(leased) = &lease else {
                return Ok(lease);
            };
            // Taken again after a failure or a crash: a crash after the marker was
            // marked COMPLETED left the message behind, and it is not delivered twice.
            let m = &leased.message;
            if m.attempts > 1
                && let Some(key) = &m.key
            {
                let raw: Option<Vec<u8>> = self
                    .call(&self.conns(), Call::Cmd("GET", &[key.as_str().into()]))
                    .await?;
                if let Some(Marker::Completed { .. }) = raw.map(|raw| parse_marker(key, &raw)) {
                    self.settle_script(&k, leased, "done", 0, "", b"").await?;
                    continue;
                }
            }
            return Ok(lease);
        }
    }

    async fn settle(&self, route: &str, leased: &Leased, settled: Settled) -> Result<(), StoreError> {
        let k = Keys::new(&self.key_prefix, route);
        match settled {
            Settled::Delivered { completed_ttl } => {
                self.mark_delivered(&leased.message, completed_ttl).await?;
                self.settle_script(&k, leased, "done", 0, "", b"").await
            }
            Settled::Retry { due_ms, error } => self.settle_script(&k, leased, "retry", due_ms, &error, b"").await,
            Settled::Dead { error } => {
                let m = &leased.message;
                let dead = StoredDead {
                    key: m.key.clone(),
                    attempts: m.attempts,
                    last_error: Some(error.clone()),
                    queued_at_ms: m.queued_at_ms,
                    dead_at_ms: unix_ms(),
                };
                let dead = serde_json::to_vec(&dead).unwrap_or_default();
                self.settle_script(&k, leased, "dead", 0, &error, &dead).await
            }
            Settled::Returned => self.settle_script(&k, leased, "return", 0, "", b"").await,
        }
    }

    async fn counts(&self, route: &str, now_ms: u64) -> Result<QueueCounts, StoreError> {
        let k = Keys::new(&self.key_prefix, route);
        let args = [
            Arg::from(k.q.as_str()),
            k.r.as_str().into(),
            k.d.as_str().into(),
            k.o.as_str().into(),
            GROUP.into(),
            Arg::Int(now_ms),
        ];
        let (ready, scheduled, delivering, dead, oldest): (u64, u64, u64, u64, String) =
            self.call(&self.conns(), Call::Script(&COUNTS, 4, &args)).await?;
        Ok(QueueCounts {
            ready,
            scheduled,
            delivering,
            dead,
            oldest_queued_at_ms: oldest.parse::<f64>().ok().map(|ms| ms as u64),
        })
    }

    async fn dead_letters(&self, route: &str, limit: usize) -> Result<Vec<DeadLetter>, StoreError> {
        let k = Keys::new(&self.key_prefix, route);
        let all: Vec<(String, Vec<u8>)> = self
            .call(&self.conns(), Call::Cmd("HGETALL", &[k.d.as_str().into()]))
            .await?;
        let mut letters: Vec<DeadLetter> = all
            .into_iter()
            .filter_map(|(id, raw)| {
                let d: StoredDead = serde_json::from_slice(&raw).ok()?;
                Some(DeadLetter {
                    id,
                    key: d.key,
                    attempts: d.attempts,
                    last_error: d.last_error,
                    queued_at_ms: d.queued_at_ms,
                    dead_at_ms: d.dead_at_ms,
                })
            })
            .collect();
        letters.sort_by(|a, b| (a.dead_at_ms, &a.id).cmp(&(b.dead_at_ms, &b.id)));
        letters.truncate(limit);
        Ok(letters)
    }

    async fn retry_dead(&self, route: &str, id: Option<&str>, _now_ms: u64) -> Result<u64, StoreError> {
        let k = Keys::new(&self.key_prefix, route);
        let args = [
            Arg::from(k.q.as_str()),
            k.d.as_str().into(),
            k.a.as_str().into(),
            k.e.as_str().into(),
            k.o.as_str().into(),
            k.m.as_str().into(),
            GROUP.into(),
            id.unwrap_or("").into(),
        ];
        self.call(&self.conns(), Call::Script(&RETRY_DEAD, 6, &args)).await
    }

    async fn drop_dead(&self, route: &str, id: &str) -> Result<bool, StoreError> {
        let k = Keys::new(&self.key_prefix, route);
        let args = [
            Arg::from(k.d.as_str()),
            k.m.as_str().into(),
            k.a.as_str().into(),
            k.e.as_str().into(),
            id.into(),
        ];
        let dead: Option<Vec<u8>> = self.call(&self.conns(), Call::Script(&DROP_DEAD, 4, &args)).await?;
        let Some(dead) = dead else { return Ok(false) };
        let key = serde_json::from_slice::<StoredDead>(&dead).ok().and_then(|d| d.key);
        if let Some(key) = key {
            self.call::<redis::Value>(&self.conns(), Call::Cmd("DEL", &[key.as_str().into()]))
                .await?;
        }
        Ok(true)
    }
}
