//! A queued route's queue in Redis, shared by every replica. All of a route's keys
//! carry the route as one hash tag (`<key_prefix>{<route>}:...`), so one Lua script
//! can act on them together, in a cluster too:
//!
//! - `:q`, a stream with the consumer group `deliver`: one entry (`id <message id>
//!   a <attempts before> [e <last error>]`) per message due for delivery. A replica
//!   reads entries with `XREADGROUP`; one left pending for `upstream_timeout` and 5 s
//!   more (its replica died mid-delivery) is taken over with `XAUTOCLAIM`, its
//!   deliveries counted as attempts. A settled entry is acknowledged, not deleted (an
//!   `XDEL` was the costliest command of a delivery): entries older than the oldest
//!   pending or unread one are trimmed (`XTRIM MINID`) once a second.
//! - `:m`, a hash: message id -> the message (JSON, below). What `max_queued` counts.
//! - `:r`, a sorted set: message ids waiting for a retry, scored by when (Unix ms);
//!   `:e`, a hash: their attempts and last error (`<attempts>|<error>`).
//! - `:d`, a hash: message id -> dead letter (JSON: `key`, `attempts`, `last_error`,
//!   `queued_at_ms`, `dead_at_ms`).
//! - `:o`, a sorted set: message ids not yet delivered nor dead, scored by when they
//!   were queued (the age of the oldest).
//!
//! A message: `{"key":..,"token":..,"first_seen_ms":..,"queued_at_ms":..,
//! "method":"POST","target":"/path?query","headers":"name: value\r\n...","body":".."}`,
//! with `headers_base64` / `body_base64` instead when they are not UTF-8.
//!
//! On a standalone Redis a script takes the message's marker too: an enqueue (claim,
//! message, QUEUED) and a delivery's end (COMPLETED, message removed) are each one
//! atomic call. In a cluster the marker is on another slot, so it takes calls of its
//! own: a claim, the message, then QUEUED; COMPLETED, then the message removed. A crash
//! between two of those steps leaves the message held and is healed by the next step:
//! an enqueue finds the id held and stores nothing twice; a lease finds the marker
//! COMPLETED and removes the message without delivering it.
//!
//! Files: [`scripts`] (the Lua and the keys they take), [`format`] (the JSON values).

mod format;
mod scripts;

use std::time::Duration;

use deadpool_redis::redis;

use super::RedisStore;
use super::command::Arg;
use super::connection::Call;
use super::value::{self, parse_marker};
use crate::store::queue::{DeadLetter, Enqueued, Lease, Leased, Message, QueueCounts, QueueStore, Settled};
use crate::store::{Claim, Completion, Marker, Store, StoreError, Token, unix_ms};
use format::{StoredDead, decode, encode};
use scripts::{COUNTS, DROP_DEAD, ENQUEUE, ENQUEUE_SOURCE, GROUP, Keys, LEASE, RETRY_DEAD, SETTLE};

/// A consumer name for a store, unique across replicas and restarts: each store
/// reads a route's stream as its own consumer of the route's group.
pub(super) fn consumer_name() -> String {
    format!("gw-{}", Token::generate())
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// How often a store looks for deliveries a dead replica left (`XAUTOCLAIM`), per route.
const RECLAIM_EVERY_MS: u64 = 1000;

impl RedisStore {
    /// The marker a script may take: on a standalone Redis, `key`; in a cluster, none.
    fn scripted<'a>(&self, key: Option<&'a str>) -> Option<&'a str> {
        if self.cluster { None } else { key }
    }

    /// Runs a queue script with `k`'s keys, `marker` (when the script may take it) and
    /// `argv`.
    async fn script<T: redis::FromRedisValue>(
        &self,
        script: &redis::Script,
        k: &Keys,
        marker: Option<&str>,
        argv: &[Arg<'_>],
    ) -> Result<T, StoreError> {
        let (keys, args) = k.args(self.scripted(marker), argv);
        self.call(&self.conns(), Call::Script(script, keys, &args)).await
    }

    /// The enqueue script (see `scripts`), followed by `WAIT` on the same connection
    /// when `wait_replicas` asks for it (WAIT counts its own connection's writes).
    async fn enqueue_script(&self, k: &Keys, m: &Message, max_queued: u64) -> Result<Enqueued, StoreError> {
        let (blob, queued) = (encode(m), value::queued(m.first_seen_ms));
        let argv = [
            Arg::from(m.id.as_str()),
            Arg::Bytes(&blob),
            Arg::Int(max_queued),
            Arg::Int(m.queued_at_ms),
            Arg::Bytes(&queued),
        ];
        let marker = m.key.as_deref();
        let reply: Vec<Vec<u8>> = if self.wait_replicas == 0 {
            self.script(&ENQUEUE, k, marker, &argv).await?
        } else {
            let (keys, args) = k.args(self.scripted(marker), &argv);
            let mut pipe = redis::pipe();
            pipe.cmd("EVAL").arg(ENQUEUE_SOURCE).arg(keys);
            for arg in &args {
                match *arg {
                    Arg::Bytes(bytes) => pipe.arg(bytes),
                    Arg::Int(n) => pipe.arg(n),
                };
            }
            pipe.cmd("WAIT").arg(self.wait_replicas).arg(millis(self.timeout));
            let (reply, confirmed): (Vec<Vec<u8>>, u64) = self.call(&self.conns(), Call::Pipe(&pipe)).await?;
            if reply.first().map(Vec::as_slice) == Some(b"queued") && confirmed < u64::from(self.wait_replicas) {
                // Stored on the primary all the same: the sender's retry finds it held.
                return Err(StoreError::Unavailable(format!(
                    "{confirmed} of {} replicas confirmed the message within store.timeout",
                    self.wait_replicas
                )));
            }
            reply
        };
        match reply.as_slice() {
            [status] if status == b"queued" => Ok(Enqueued::Queued),
            [status] if status == b"full" => Ok(Enqueued::Full),
            [status, found] if status == b"found" => {
                Ok(Enqueued::Found(parse_marker(marker.unwrap_or_default(), found)))
            }
            _ => Err(StoreError::Corrupt("unexpected reply to the enqueue script".into())),
        }
    }

    /// In a cluster: the claim, the enqueue script, then QUEUED (the claim released if
    /// the message is not stored).
    async fn enqueue_in_steps(
        &self,
        k: &Keys,
        m: &Message,
        key: &str,
        max_queued: u64,
        processing_ttl: Duration,
    ) -> Result<Enqueued, StoreError> {
        if let Claim::Found(marker) = self.claim(key, m.token, m.first_seen_ms, processing_ttl).await? {
            return Ok(Enqueued::Found(marker));
        }
        let enqueued = self.enqueue_script(k, m, max_queued).await;
        if !matches!(enqueued, Ok(Enqueued::Queued)) {
            // Best effort: a claim left behind expires after processing_ttl.
            let _ = self.release(key, m.token, m.first_seen_ms).await;
            return enqueued;
        }
        let queued = value::queued(m.first_seen_ms);
        let args = [Arg::from(key), Arg::Bytes(&queued)];
        self.call::<redis::Value>(&self.conns(), Call::Cmd("SET", &args))
            .await?;
        Ok(Enqueued::Queued)
    }

    /// Whether this lease should look for abandoned deliveries (once a second per
    /// route and store: `XAUTOCLAIM` scans the pending entries).
    fn reclaim_now(&self, route: &str, now_ms: u64) -> bool {
        let mut last = self.reclaimed.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match last.get_mut(route) {
            Some(at) if now_ms.saturating_sub(*at) < RECLAIM_EVERY_MS => false,
            Some(at) => {
                *at = now_ms;
                true
            }
            None => {
                last.insert(route.to_owned(), now_ms);
                true
            }
        }
    }

    /// One run of the lease script.
    async fn lease_once(
        &self,
        route: &str,
        k: &Keys,
        now_ms: u64,
        reclaim_after: Duration,
    ) -> Result<Lease, StoreError> {
        let reclaim = if self.reclaim_now(route, now_ms) {
            millis(reclaim_after)
        } else {
            0
        };
        let argv = [
            GROUP.into(),
            self.consumer.as_str().into(),
            Arg::Int(reclaim),
            Arg::Int(now_ms),
        ];
        let leased = match self.script(&LEASE, k, None, &argv).await {
            // A stream with no group yet (the enqueue does not make one): made from the
            // stream's start, so it reads every entry there is.
            Err(error) if error.to_string().contains("NOGROUP") => {
                let create = [
                    "CREATE".into(),
                    k.stream().into(),
                    GROUP.into(),
                    "0".into(),
                    "MKSTREAM".into(),
                ];
                if let Err(error) = self
                    .call::<redis::Value>(&self.conns(), Call::Cmd("XGROUP", &create))
                    .await
                    && !error.to_string().contains("BUSYGROUP")
                {
                    return Err(error);
                }
                self.script(&LEASE, k, None, &argv).await
            }
            other => other,
        };
        let (entry, id, raw, attempts, extra): (String, String, Vec<u8>, u32, String) = leased?;
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

    /// The settle script for `how`. `done` writes the marker COMPLETED first: in the
    /// script on a standalone Redis, with a call of its own in a cluster.
    async fn settle_script(&self, k: &Keys, leased: &Leased, how: Settle<'_>) -> Result<(), StoreError> {
        let m = &leased.message;
        let (mut due, mut error, mut dead, mut completed, mut ttl) = (0, String::new(), Vec::new(), Vec::new(), 1);
        let mut marker = m.key.as_deref();
        let what = match how {
            Settle::Gone => {
                marker = None;
                "done"
            }
            Settle::Done(completed_ttl) => {
                let completion = Completion {
                    first_seen_ms: m.first_seen_ms,
                    ttl: completed_ttl,
                    response: None,
                };
                completed = value::completed(&completion, unix_ms());
                ttl = millis(completed_ttl);
                if let (true, Some(key)) = (self.cluster, &m.key) {
                    let args = [
                        Arg::from(key.as_str()),
                        Arg::Bytes(&completed),
                        "PX".into(),
                        Arg::Int(ttl),
                    ];
                    self.call::<redis::Value>(&self.conns(), Call::Cmd("SET", &args))
                        .await?;
                }
                "done"
            }
            Settle::Retry(at, why) => {
                (due, error) = (at, format!("{}|{why}", m.attempts));
                "retry"
            }
            Settle::Dead(why) => {
                let letter = StoredDead {
                    key: m.key.clone(),
                    attempts: m.attempts,
                    last_error: Some(why.to_owned()),
                    queued_at_ms: m.queued_at_ms,
                    dead_at_ms: unix_ms(),
                };
                dead = serde_json::to_vec(&letter).unwrap_or_default();
                "dead"
            }
            Settle::Return => "return",
        };
        let argv = [
            Arg::from(what),
            GROUP.into(),
            leased.lease.as_str().into(),
            m.id.as_str().into(),
            Arg::Int(due),
            error.as_str().into(),
            Arg::Bytes(&dead),
            Arg::Bytes(&completed),
            Arg::Int(ttl),
            Arg::Int(u64::from(m.attempts)),
        ];
        self.script::<redis::Value>(&SETTLE, k, marker, &argv).await.map(drop)
    }
}

/// A settle, borrowed from [`Settled`].
enum Settle<'a> {
    /// Delivered: COMPLETED for this long, and the message removed.
    Done(Duration),
    /// Its marker is COMPLETED already: the message removed, the marker left alone.
    Gone,
    Retry(u64, &'a str),
    Dead(&'a str),
    Return,
}

impl QueueStore for RedisStore {
    async fn enqueue(
        &self,
        route: &str,
        message: &Message,
        max_queued: u64,
        processing_ttl: Duration,
    ) -> Result<Enqueued, StoreError> {
        let k = Keys::new(&self.key_prefix, route);
        match (&message.key, self.cluster) {
            (Some(key), true) => {
                self.enqueue_in_steps(&k, message, key, max_queued, processing_ttl)
                    .await
            }
            _ => self.enqueue_script(&k, message, max_queued).await,
        }
    }

    async fn lease(&self, route: &str, now_ms: u64, reclaim_after: Duration) -> Result<Lease, StoreError> {
        let k = Keys::new(&self.key_prefix, route);
        loop {
            let lease = self.lease_once(route, &k, now_ms, reclaim_after).await?;
            let Lease::Leased(leased) = &lease else {
                return Ok(lease);
            };
            // Taken again after a failure or a crash: in a cluster, a crash after the
            // marker was made COMPLETED left the message behind; it is not delivered
            // twice.
            let m = &leased.message;
            if self.cluster
                && m.attempts > 1
                && let Some(key) = &m.key
            {
                let raw: Option<Vec<u8>> = self
                    .call(&self.conns(), Call::Cmd("GET", &[key.as_str().into()]))
                    .await?;
                if let Some(Marker::Completed { .. }) = raw.map(|raw| parse_marker(key, &raw)) {
                    self.settle_script(&k, leased, Settle::Gone).await?;
                    continue;
                }
            }
            return Ok(lease);
        }
    }

    async fn settle(&self, route: &str, leased: &Leased, settled: Settled) -> Result<(), StoreError> {
        let k = Keys::new(&self.key_prefix, route);
        let how = match &settled {
            Settled::Delivered { completed_ttl } => Settle::Done(*completed_ttl),
            Settled::Retry { due_ms, error } => Settle::Retry(*due_ms, error),
            Settled::Dead { error } => Settle::Dead(error),
            Settled::Returned => Settle::Return,
        };
        self.settle_script(&k, leased, how).await
    }

    async fn counts(&self, route: &str, now_ms: u64) -> Result<QueueCounts, StoreError> {
        let k = Keys::new(&self.key_prefix, route);
        let argv = [GROUP.into(), Arg::Int(now_ms)];
        let (ready, scheduled, delivering, dead, oldest): (u64, u64, u64, u64, String) =
            self.script(&COUNTS, &k, None, &argv).await?;
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
            .call(&self.conns(), Call::Cmd("HGETALL", &[k.dead().into()]))
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
        self.script(&RETRY_DEAD, &k, None, &[id.unwrap_or("").into()]).await
    }

    async fn drop_dead(&self, route: &str, id: &str) -> Result<bool, StoreError> {
        let k = Keys::new(&self.key_prefix, route);
        let marker = k.marker(id);
        let dropped: i64 = self.script(&DROP_DEAD, &k, Some(&marker), &[id.into()]).await?;
        if dropped == 1 && self.cluster {
            self.call::<redis::Value>(&self.conns(), Call::Cmd("DEL", &[marker.as_str().into()]))
                .await?;
        }
        Ok(dropped == 1)
    }
}
