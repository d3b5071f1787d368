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
use format::{StoredDead, decode, encode, unreadable_message};
use scripts::{COUNTS, DROP_DEAD, ENQUEUE, ENQUEUE_SOURCE, GROUP, Keys, LEASE, MARK_QUEUED, RETRY_DEAD, SETTLE};

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
    /// The markers a script may take: on a standalone Redis, `markers`; in a cluster
    /// (another slot), none.
    fn scripted<'a, 'm>(&self, markers: &'m [&'a str]) -> &'m [&'a str] {
        if self.cluster { &[] } else { markers }
    }

    /// Runs a queue script with `k`'s keys, `markers` (when the script may take them)
    /// and `argv`.
    async fn script<T: redis::FromRedisValue>(
        &self,
        script: &redis::Script,
        k: &Keys,
        markers: &[&str],
        argv: &[Arg<'_>],
    ) -> Result<T, StoreError> {
        let (keys, args) = k.args(self.scripted(markers), argv);
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
        let markers: &[&str] = match &marker {
            Some(key) => std::slice::from_ref(key),
            None => &[],
        };
        let reply: Vec<Vec<u8>> = if self.wait_replicas == 0 {
            self.script(&ENQUEUE, k, markers, &argv).await?
        } else {
            let (keys, args) = k.args(self.scripted(markers), &argv);
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
        let (prefix, queued) = (value::token_prefix(m.token), value::queued(m.first_seen_ms));
        let args = [Arg::from(key), Arg::Bytes(&prefix), Arg::Bytes(&queued)];
        self.call::<redis::Value>(&self.conns(), Call::Script(&MARK_QUEUED, 1, &args))
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
        max: usize,
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
            Arg::Int(max as u64),
        ];
        let leased = match self.script(&LEASE, k, &[], &argv).await {
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
                self.script(&LEASE, k, &[], &argv).await
            }
            other => other,
        };
        let values: Vec<redis::Value> = leased?;
        if let [next] = values.as_slice() {
            let next: String = redis::from_redis_value(next.clone()).unwrap_or_default();
            return Ok(Lease::Idle {
                // A score comes back as Redis writes a double.
                next_due_ms: next.parse::<f64>().ok().map(|ms| ms as u64),
            });
        }
        let bad = |e| StoreError::Corrupt(format!("lease reply: {e}"));
        let (mut taken, mut unreadable) = (Vec::with_capacity(values.len() / 6), Vec::new());
        for six in values.chunks_exact(6) {
            let (entry, id, raw, attempts, last_error, deliveries): (String, String, Vec<u8>, u32, String, u64) =
                redis::from_redis_value(redis::Value::Array(six.to_vec())).map_err(bad)?;
            let last_error = Some(last_error).filter(|e| !e.is_empty());
            // What settles it names: the entry, and how many deliveries it had then.
            let entry = format!("{entry}/{deliveries}");
            match decode(id.clone(), &raw, attempts, last_error) {
                Ok(message) => taken.push(Leased { message, lease: entry }),
                Err(error) => unreadable.push((unreadable_message(id, attempts), entry, error.to_string())),
            }
        }
        if !unreadable.is_empty() {
            // Not delivered, and not left to stall the others taken with it: a dead
            // letter (its stored value stays in `:m` for an operator to read).
            let leased: Vec<Leased> = unreadable
                .iter()
                .map(|(message, entry, _)| Leased {
                    message: message.clone(),
                    lease: entry.clone(),
                })
                .collect();
            let ended: Vec<(&Leased, Settle)> = leased
                .iter()
                .zip(&unreadable)
                .map(|(l, (_, _, error))| {
                    tracing::warn!(route, id = %l.message.id, %error, "unreadable queued message: dead letter");
                    (l, Settle::Dead(error))
                })
                .collect();
            self.settle_script(k, &ended).await?;
        }
        if taken.is_empty() {
            return Ok(Lease::Idle { next_due_ms: None });
        }
        Ok(Lease::Leased(taken))
    }

    /// The settle script for `ended`. A `done` writes its marker COMPLETED first: in
    /// the script on a standalone Redis, with a call of its own in a cluster.
    async fn settle_script(&self, k: &Keys, ended: &[(&Leased, Settle<'_>)]) -> Result<(), StoreError> {
        let mut values: Vec<[Vec<u8>; 10]> = Vec::with_capacity(ended.len());
        for (leased, how) in ended {
            values.push(self.settle_values(leased, how).await?);
        }
        let mut argv: Vec<Arg> = vec![GROUP.into(), self.consumer.as_str().into()];
        argv.extend(values.iter().flatten().map(|v| Arg::Bytes(v)));
        let markers: Vec<String> = ended.iter().map(|(l, _)| k.marker(&l.message.id)).collect();
        let markers: Vec<&str> = markers.iter().map(String::as_str).collect();
        self.script::<redis::Value>(&SETTLE, k, &markers, &argv).await.map(drop)
    }

    /// Whether `m`'s marker is COMPLETED (read in a cluster before a message taken
    /// again is delivered).
    async fn completed_already(&self, m: &Message) -> Result<bool, StoreError> {
        let Some(key) = &m.key else { return Ok(false) };
        let raw: Option<Vec<u8>> = self
            .call(&self.conns(), Call::Cmd("GET", &[key.as_str().into()]))
            .await?;
        Ok(matches!(
            raw.map(|raw| parse_marker(key, &raw)),
            Some(Marker::Completed { .. })
        ))
    }

    /// One delivery's ten values for the settle script (see `scripts`); in a cluster,
    /// a `done` writes its marker here.
    async fn settle_values(&self, leased: &Leased, how: &Settle<'_>) -> Result<[Vec<u8>; 10], StoreError> {
        let m = &leased.message;
        let number = |n: u64| itoa::Buffer::new().format(n).as_bytes().to_vec();
        let (mut due, mut error, mut dead, mut completed, mut ttl) = (0, Vec::new(), Vec::new(), Vec::new(), 1);
        let what: &[u8] = match how {
            Settle::Gone => b"done",
            Settle::Done(completed_ttl) => {
                ttl = millis(*completed_ttl);
                if m.key.is_some() {
                    let completion = Completion {
                        first_seen_ms: m.first_seen_ms,
                        ttl: *completed_ttl,
                        response: None,
                    };
                    completed = value::completed(&completion, unix_ms());
                }
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
                b"done"
            }
            Settle::Retry(at, why) => {
                (due, error) = (*at, format!("{}|{why}", m.attempts).into_bytes());
                b"retry"
            }
            Settle::Dead(why) => {
                let letter = StoredDead {
                    key: m.key.clone(),
                    attempts: m.attempts,
                    last_error: Some((*why).to_owned()),
                    queued_at_ms: m.queued_at_ms,
                    dead_at_ms: unix_ms(),
                };
                dead = serde_json::to_vec(&letter).unwrap_or_default();
                b"dead"
            }
            Settle::Return => b"return",
        };
        let (entry, deliveries) = leased.lease.split_once('/').unwrap_or((&leased.lease, "1"));
        Ok([
            what.to_vec(),
            entry.as_bytes().to_vec(),
            m.id.clone().into_bytes(),
            number(due),
            error,
            dead,
            completed,
            number(ttl),
            number(u64::from(m.attempts)),
            deliveries.as_bytes().to_vec(),
        ])
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

    async fn lease(&self, route: &str, now_ms: u64, reclaim_after: Duration, max: usize) -> Result<Lease, StoreError> {
        let k = Keys::new(&self.key_prefix, route);
        loop {
            let taken = match self.lease_once(route, &k, now_ms, reclaim_after, max).await? {
                Lease::Leased(taken) => taken,
                idle => return Ok(idle),
            };
            if !self.cluster {
                return Ok(Lease::Leased(taken));
            }
            // In a cluster, one taken again after a failure or a crash may have its
            // marker COMPLETED already (the crash came between the marker and the
            // message's removal): removed, not delivered twice.
            let mut deliver = Vec::with_capacity(taken.len());
            let mut gone = Vec::new();
            for leased in taken {
                if leased.message.attempts > 1 && self.completed_already(&leased.message).await? {
                    gone.push(leased);
                } else {
                    deliver.push(leased);
                }
            }
            if !gone.is_empty() {
                let ended: Vec<(&Leased, Settle)> = gone.iter().map(|l| (l, Settle::Gone)).collect();
                self.settle_script(&k, &ended).await?;
            }
            if !deliver.is_empty() {
                return Ok(Lease::Leased(deliver));
            }
        }
    }

    async fn settle_all(&self, route: &str, ended: &[(&Leased, Settled)]) -> Result<(), StoreError> {
        let k = Keys::new(&self.key_prefix, route);
        let ended: Vec<(&Leased, Settle)> = ended
            .iter()
            .map(|(leased, settled)| {
                let how = match settled {
                    Settled::Delivered { completed_ttl } => Settle::Done(*completed_ttl),
                    Settled::Retry { due_ms, error } => Settle::Retry(*due_ms, error),
                    Settled::Dead { error } => Settle::Dead(error),
                    Settled::Returned => Settle::Return,
                };
                (*leased, how)
            })
            .collect();
        self.settle_script(&k, &ended).await
    }

    async fn counts(&self, route: &str, now_ms: u64) -> Result<QueueCounts, StoreError> {
        let k = Keys::new(&self.key_prefix, route);
        let argv = [GROUP.into(), Arg::Int(now_ms)];
        let (ready, scheduled, delivering, dead, oldest): (u64, u64, u64, u64, String) =
            self.script(&COUNTS, &k, &[], &argv).await?;
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
        self.script(&RETRY_DEAD, &k, &[], &[id.unwrap_or("").into()]).await
    }

    async fn drop_dead(&self, route: &str, id: &str) -> Result<bool, StoreError> {
        let k = Keys::new(&self.key_prefix, route);
        let marker = k.marker(id);
        if self.cluster {
            // The marker first: a dead letter left behind by a failure here is dropped
            // by the operator's next try, and a delivery of its id meanwhile finds the
            // message held and stores nothing twice.
            let held: Option<Vec<u8>> = self
                .call(&self.conns(), Call::Cmd("HGET", &[k.dead().into(), id.into()]))
                .await?;
            if held.is_none() {
                return Ok(false);
            }
            self.call::<redis::Value>(&self.conns(), Call::Cmd("DEL", &[marker.as_str().into()]))
                .await?;
        }
        let dropped: i64 = self.script(&DROP_DEAD, &k, &[marker.as_str()], &[id.into()]).await?;
        Ok(dropped == 1)
    }
}
