//! The Lua scripts of a route's queue, and the keys every one of them takes, in one
//! order: `KEYS[1..6]` = `:q :m :e :o :r :d` (all with the route's hash tag), and on a
//! standalone Redis `KEYS[7]`, the message's marker (another slot in a cluster, where
//! the marker is written by a call of its own).
//!
//! A stream entry carries the message id, the attempts started before it (`a`) and the
//! last error (`e`); a message waiting for a retry has them in `:e` (`<attempts>|<error>`)
//! until it is due and goes back to the stream.

use std::sync::LazyLock;

use deadpool_redis::redis::Script;

use super::super::command::Arg;

/// A route's queue keys (see the module above).
pub(super) struct Keys {
    all: [String; 6],
    /// `<key_prefix><route>:`: a message's marker is this and its id.
    marker_prefix: String,
}

impl Keys {
    pub(super) fn new(prefix: &str, route: &str) -> Self {
        let key = |suffix: &str| format!("{prefix}{{{route}}}:{suffix}");
        Keys {
            all: ["q", "m", "e", "o", "r", "d"].map(key),
            marker_prefix: format!("{prefix}{route}:"),
        }
    }

    /// The stream.
    pub(super) fn stream(&self) -> &str {
        &self.all[0]
    }

    /// The dead letters' hash.
    pub(super) fn dead(&self) -> &str {
        &self.all[5]
    }

    /// The marker of message `id` (a message's id is its stored key's last part).
    pub(super) fn marker(&self, id: &str) -> String {
        format!("{}{id}", self.marker_prefix)
    }

    /// A script's arguments: the six keys, `markers` after them (standalone Redis),
    /// then `argv`. How many keys, too.
    pub(super) fn args<'a>(&'a self, markers: &[&'a str], argv: &[Arg<'a>]) -> (usize, Vec<Arg<'a>>) {
        let mut args: Vec<Arg<'a>> = self.all.iter().map(|k| Arg::from(k.as_str())).collect();
        args.extend(markers.iter().map(|m| Arg::from(*m)));
        let keys = args.len();
        args.extend_from_slice(argv);
        (keys, args)
    }
}

/// The consumer group every replica reads a route's stream in.
pub(super) const GROUP: &str = "deliver";

/// ARGV: id, message, max_queued, queued_at_ms, QUEUED value. With the marker: a held
/// key is found (`{'found', value}`) and nothing else happens. A message whose id is
/// held already is not stored twice (`{'queued'}`); a full route stores nothing
/// (`{'full'}`); else the message is stored, queued and its marker made QUEUED. (The
/// stream may have no group yet: a lease creates it, from the stream's start.)
const ENQUEUE_LUA: &str = r"local marker = KEYS[7]
if marker then
  local found = redis.call('GET', marker)
  if found then return {'found', found} end
end
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 0 then
  if redis.call('HLEN', KEYS[2]) >= tonumber(ARGV[3]) then return {'full'} end
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
  redis.call('ZADD', KEYS[4], ARGV[4], ARGV[1])
  redis.call('XADD', KEYS[1], '*', 'id', ARGV[1], 'a', 0)
end
if marker then redis.call('SET', marker, ARGV[5]) end
return {'queued'}";

/// ARGV: group, consumer, reclaim after (ms; 0: not now), now (ms), at most how many.
/// Moves due retries to the stream, then takes entries (abandoned ones first, when
/// asked, trimming the stream then) whose messages are still held: six values each
/// (entry id, message id, message, attempts with this one, last error, the entry's
/// deliveries); or, when nothing is due, one: the next retry's time, or ''. An entry
/// taken over counts the deliveries it had.
const LEASE_LUA: &str = r"local due = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', ARGV[4], 'LIMIT', 0, 100)
for _, id in ipairs(due) do
  local last = redis.call('HGET', KEYS[3], id) or '0|'
  local sep = string.find(last, '|', 1, true) or (#last + 1)
  redis.call('ZREM', KEYS[5], id)
  redis.call('HDEL', KEYS[3], id)
  redis.call('XADD', KEYS[1], '*', 'id', id, 'a', string.sub(last, 1, sep - 1), 'e', string.sub(last, sep + 1))
end
local max = tonumber(ARGV[5])
local out = {}
local function field(fields, name)
  for i = 1, #fields - 1, 2 do
    if fields[i] == name then return fields[i + 1] end
  end
end
local function pick(entries, taken_over)
  for _, e in ipairs(entries) do
    local fields = e[2] or {}
    local id = field(fields, 'id')
    local msg = id and redis.call('HGET', KEYS[2], id)
    if msg then
      local deliveries = 1
      if taken_over then
        deliveries = redis.call('XPENDING', KEYS[1], ARGV[1], e[1], e[1], 1)[1][4]
      end
      local attempts = (tonumber(field(fields, 'a')) or 0) + deliveries
      for _, v in ipairs({e[1], id, msg, attempts, field(fields, 'e') or '', deliveries}) do
        out[#out + 1] = v
      end
    else
      redis.call('XACK', KEYS[1], ARGV[1], e[1])
    end
  end
end
local function before(a, b)
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  am, as, bm, bs = tonumber(am) or 0, tonumber(as) or 0, tonumber(bm) or 0, tonumber(bs) or 0
  return am < bm or (am == bm and as < bs)
end
local function trim()
  local last
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
    local name, id
    for i = 1, #g - 1, 2 do
      if g[i] == 'name' then name = g[i + 1] elseif g[i] == 'last-delivered-id' then id = g[i + 1] end
    end
    if name == ARGV[1] then last = id end
  end
  if not last then return end
  local pending = redis.call('XPENDING', KEYS[1], ARGV[1])
  if pending[1] > 0 and before(pending[2], last) then last = pending[2] end
  redis.call('XTRIM', KEYS[1], 'MINID', last)
end
if ARGV[3] ~= '0' then
  local claimed = redis.call('XAUTOCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[3], '0-0', 'COUNT', max)
  trim()
  pick(claimed[2], true)
end
for _ = 1, 16 do
  local want = max - #out / 6
  if want <= 0 then break end
  local read = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', want, 'STREAMS', KEYS[1], '>')
  if not read then break end
  pick(read[1][2], false)
end
if #out > 0 then return out end
local nxt = redis.call('ZRANGE', KEYS[5], 0, 0, 'WITHSCORES')
return {nxt[2] or ''}";

/// ARGV: group, consumer, then ten values per delivery: how (done, retry, dead,
/// return), entry id, message id, due (retry), `<attempts>|<error>` (retry), dead
/// letter (dead), COMPLETED value ('' to leave the marker) and its TTL in ms (done),
/// attempts so far (return), the entry's deliveries when it was taken. On a
/// standalone Redis, `KEYS[7..]` are the deliveries' markers, in order; a `done`
/// writes its marker here. A `done` is recorded whoever holds the entry now (the
/// message was delivered); the others only while this delivery still holds it (this
/// consumer, as many deliveries as when it was taken: else it was taken over, or this
/// repeats a settle that landed), so a late record never re-queues what another
/// delivery has.
const SETTLE_LUA: &str = r"local markers = #KEYS > 6
for i = 0, (#ARGV - 2) / 10 - 1 do
  local a = 2 + i * 10
  local how, entry, id = ARGV[a + 1], ARGV[a + 2], ARGV[a + 3]
  local ours = how == 'done'
  if not ours then
    local held = redis.call('XPENDING', KEYS[1], ARGV[1], entry, entry, 1)[1]
    ours = held ~= nil and held[2] == ARGV[2] and held[4] == tonumber(ARGV[a + 10])
  end
  if ours then
    redis.call('XACK', KEYS[1], ARGV[1], entry)
    if how == 'done' then
      if markers and ARGV[a + 7] ~= '' then redis.call('SET', KEYS[7 + i], ARGV[a + 7], 'PX', ARGV[a + 8]) end
      redis.call('HDEL', KEYS[2], id)
      redis.call('ZREM', KEYS[4], id)
    elseif how == 'retry' then
      redis.call('HSET', KEYS[3], id, ARGV[a + 5])
      redis.call('ZADD', KEYS[5], ARGV[a + 4], id)
    elseif how == 'dead' then
      redis.call('HSET', KEYS[6], id, ARGV[a + 6])
      redis.call('ZREM', KEYS[4], id)
    else
      redis.call('XADD', KEYS[1], '*', 'id', id, 'a', ARGV[a + 9])
    end
  end
end
return 1";

/// ARGV: group, now. {ready, scheduled, delivering, dead, oldest queued_at_ms or ''}.
/// Ready is the group's lag (entries not yet read); a stream whose group a lease has
/// not made yet is all ready.
const COUNTS_LUA: &str = r"local ready, pending = 0, 0
if redis.call('EXISTS', KEYS[1]) == 1 then
  local found = false
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
    local f = {}
    for i = 1, #g - 1, 2 do f[g[i]] = g[i + 1] end
    if f['name'] == ARGV[1] then
      found = true
      pending = f['pending'] or 0
      ready = f['lag']
      if type(ready) ~= 'number' then
        ready = math.max(0, redis.call('XLEN', KEYS[1]) - pending)
      end
    end
  end
  if not found then ready = redis.call('XLEN', KEYS[1]) end
end
local due = redis.call('ZCOUNT', KEYS[5], '-inf', ARGV[2])
local later = redis.call('ZCARD', KEYS[5]) - due
local oldest = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')
return {ready + due, later, pending, redis.call('HLEN', KEYS[6]), oldest[2] or ''}";

/// ARGV: id ('' for every one). Dead letters back to the stream, attempts reset.
/// Returns how many.
const RETRY_DEAD_LUA: &str = r"local ids = {ARGV[1]}
if ARGV[1] == '' then ids = redis.call('HKEYS', KEYS[6]) end
local n = 0
for _, id in ipairs(ids) do
  local dead = redis.call('HGET', KEYS[6], id)
  if dead and redis.call('HEXISTS', KEYS[2], id) == 1 then
    redis.call('HDEL', KEYS[6], id)
    local ok, d = pcall(cjson.decode, dead)
    redis.call('ZADD', KEYS[4], (ok and type(d) == 'table' and d.queued_at_ms) or 0, id)
    redis.call('XADD', KEYS[1], '*', 'id', id, 'a', 0)
    n = n + 1
  end
end
return n";

/// KEYS: a marker. ARGV: the PROCESSING value's prefix up to the token, the QUEUED
/// value. QUEUED only while the marker is still the claim's (in a cluster, the marker
/// is written after the message, and a delivery may have completed it meanwhile).
const MARK_QUEUED_LUA: &str = r"local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, #ARGV[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2])
  return 1
end
return 0";

/// ARGV: id. Drops a dead letter (and, with the marker key, its marker); returns
/// whether there was one.
const DROP_DEAD_LUA: &str = r"if redis.call('HDEL', KEYS[6], ARGV[1]) == 0 then return 0 end
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
if KEYS[7] then redis.call('DEL', KEYS[7]) end
return 1";

pub(super) static ENQUEUE: LazyLock<Script> = LazyLock::new(|| Script::new(ENQUEUE_LUA));
pub(super) static LEASE: LazyLock<Script> = LazyLock::new(|| Script::new(LEASE_LUA));
pub(super) static SETTLE: LazyLock<Script> = LazyLock::new(|| Script::new(SETTLE_LUA));
pub(super) static COUNTS: LazyLock<Script> = LazyLock::new(|| Script::new(COUNTS_LUA));
pub(super) static RETRY_DEAD: LazyLock<Script> = LazyLock::new(|| Script::new(RETRY_DEAD_LUA));
pub(super) static DROP_DEAD: LazyLock<Script> = LazyLock::new(|| Script::new(DROP_DEAD_LUA));
pub(super) static MARK_QUEUED: LazyLock<Script> = LazyLock::new(|| Script::new(MARK_QUEUED_LUA));

/// The enqueue script's source, for `EVAL` in a pipeline with `WAIT`.
pub(super) const ENQUEUE_SOURCE: &str = ENQUEUE_LUA;
