//! The admin API's calls on one marker: inspect (value and TTL, read at one instant)
//! and forget (a PROCESSING marker only when forced).

use std::sync::LazyLock;
use std::time::Duration;

use deadpool_redis::redis::Script;

use super::RedisStore;
use super::connection::Call;
use super::value::parse_marker;
use crate::store::{Forgotten, KeyInfo, KeyState, Marker, StoreError};

/// The value and its TTL in one round trip, read at the same instant.
pub(super) const INSPECT_LUA: &str = r"return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])}";

/// Deletes the marker; one that is not COMPLETED only with ARGV[1] = '1'. Returns 0
/// absent, 1 COMPLETED deleted, 2 refused, 3 PROCESSING deleted, 4 QUEUED deleted.
/// PROCESSING is whatever is neither COMPLETED nor QUEUED, as [`parse_marker`] reads
/// it: a value written by hand in another field order, or not a marker at all, is not
/// forgotten without force.
pub(super) const FORGET_LUA: &str = r"local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local ok, m = pcall(cjson.decode, v)
local state = ok and type(m) == 'table' and m.state
local completed = state == 'completed' or string.lower(v) == 'completed'
if not completed and ARGV[1] ~= '1' then return 2 end
redis.call('DEL', KEYS[1])
if completed then return 1 end
if state == 'queued' then return 4 end
return 3";

pub(super) static INSPECT: LazyLock<Script> = LazyLock::new(|| Script::new(INSPECT_LUA));
pub(super) static FORGET: LazyLock<Script> = LazyLock::new(|| Script::new(FORGET_LUA));

impl RedisStore {
    pub(super) async fn inspect_key(&self, key: &str) -> Result<Option<KeyInfo>, StoreError> {
        let (raw, pttl): (Option<Vec<u8>>, i64) = self
            .call(&self.conns(), Call::Script(&INSPECT, 1, &[key.into()]))
            .await?;
        let Some(raw) = raw else { return Ok(None) };
        let ttl = u64::try_from(pttl).ok().map(Duration::from_millis);
        Ok(Some(match parse_marker(key, &raw) {
            Marker::Processing { first_seen_ms, .. } => KeyInfo {
                state: KeyState::Processing,
                first_seen_ms,
                ttl,
                reply_stored: false,
            },
            Marker::Completed {
                first_seen_ms,
                response,
            } => KeyInfo {
                state: KeyState::Completed,
                first_seen_ms,
                ttl,
                reply_stored: response.is_some(),
            },
            Marker::Queued { first_seen_ms } => KeyInfo {
                state: KeyState::Queued,
                first_seen_ms,
                ttl,
                reply_stored: false,
            },
        }))
    }

    pub(super) async fn forget_key(&self, key: &str, force: bool) -> Result<Forgotten, StoreError> {
        let args = [key.into(), if force { "1" } else { "0" }.into()];
        let outcome: i64 = self.call(&self.conns(), Call::Script(&FORGET, 1, &args)).await?;
        Ok(match outcome {
            1 => Forgotten::Deleted(KeyState::Completed),
            2 => Forgotten::Refused,
            3 => Forgotten::Deleted(KeyState::Processing),
            4 => Forgotten::Deleted(KeyState::Queued),
            _ => Forgotten::Absent,
        })
    }
}
