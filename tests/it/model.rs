//! A model test of the store protocol (proptest): random interleavings of claim,
//! complete, release, get, expiry and lost claim replies from several owners (tokens)
//! on a few keys, run against a store and, step by step, against a reference model
//! that is just a map from key to marker and a clock.
//!
//! After every step each key must look as the model says (state, owner, first
//! sighting, stored reply), and every call must answer as the model says. So:
//! a claim succeeds only on a free key (at most one PROCESSING holder at a time); a
//! stale owner (its marker expired, or was released and claimed by another) can
//! neither complete nor release; a COMPLETED marker stays until its TTL; a claim that
//! finds a marker changes nothing, its TTL included (Redis: `PTTL` checked after every
//! step; memory: expiry observed at the exact millisecond on a paused clock); a claim
//! whose reply is lost, repeated with the same token as the gateway does, shows the
//! marker as the owner's own.
//!
//! The memory store may also evict under `max_entries` / `max_bytes`: the model allows
//! exactly that, only while a step adds an entry or a stored reply, only the oldest
//! live COMPLETED marker(s), a reply dropped only under `max_bytes`, and "full" only
//! when every live marker is PROCESSING.
//!
//! Time: the memory store runs on tokio's paused clock (`advance`). Redis keeps its
//! own clock, so its TTLs are long (virtual units of 10 s) and an "advance" is applied
//! to the server: each key's `PTTL` shortened by the step, or the key deleted when the
//! step reaches it (what expiry does). Lost replies are real: `SwallowingProxy` drops
//! the reply to the claim, the store's call times out, and the claim is repeated.

use std::cell::Cell;
use std::time::{Duration, Instant as StdInstant};

use bytes::Bytes;
use dedup_gateway::config::RedisTarget;
use dedup_gateway::store::memory::ENTRY_BYTES;
use dedup_gateway::store::{
    Claim, Completion, Marker, MemoryStore, RedisStore, Store, StoreError, StoredResponse, Token,
};
use http::{HeaderValue, StatusCode};
use proptest::prelude::*;
use proptest::test_runner::{Config as RunnerConfig, TestCaseError, TestRunner};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::servers::{RedisServer, SwallowingProxy};

const OWNERS: usize = 4;
const KEYS: usize = 3;
/// One unit of virtual time, in milliseconds.
const UNIT: u64 = 10_000;
/// How far behind ours the server's clock may be when it sets a TTL: it stamps a command
/// with the time its event loop last read the wall clock, so a server descheduled on a
/// loaded 2-core CI machine, or a wall-clock step, sets a TTL from an older clock (seen
/// once in CI: a PTTL 130 ms short in a case that had run under 80 ms). Far below what
/// a wrong TTL would show: the TTLs here differ in `UNIT`s.
const SERVER_CLOCK_SLACK_MS: i64 = 500;
const PROCESSING_TTL: [u64; 2] = [2 * UNIT, 5 * UNIT];
const COMPLETED_TTL: [u64; 2] = [3 * UNIT, 50 * UNIT];

#[derive(Clone, Copy, Debug)]
enum Op {
    Claim {
        owner: usize,
        key: usize,
        long: bool,
    },
    /// The claim lands but its reply is lost; the owner repeats it (same token).
    LostClaim {
        owner: usize,
        key: usize,
        long: bool,
    },
    Complete {
        owner: usize,
        key: usize,
        long: bool,
        reply: bool,
    },
    Release {
        owner: usize,
        key: usize,
    },
    Get {
        key: usize,
    },
    Advance {
        units: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let (owner, key) = (0..OWNERS, 0..KEYS);
    prop_oneof![
        5 => (owner.clone(), key.clone(), any::<bool>()).prop_map(|(owner, key, long)| Op::Claim { owner, key, long }),
        1 => (owner.clone(), key.clone(), any::<bool>()).prop_map(|(owner, key, long)| Op::LostClaim { owner, key, long }),
        4 => (owner.clone(), key.clone(), any::<bool>(), any::<bool>())
            .prop_map(|(owner, key, long, reply)| Op::Complete { owner, key, long, reply }),
        2 => (owner, key.clone()).prop_map(|(owner, key)| Op::Release { owner, key }),
        1 => key.prop_map(|key| Op::Get { key }),
        3 => (1..=4u64).prop_map(|units| Op::Advance { units }),
    ]
}

fn ops(max: usize) -> impl Strategy<Value = Vec<Op>> {
    proptest::collection::vec(op(), 1..max)
}

// ---------------------------------------------------------------- the model

#[derive(Clone, Debug, PartialEq, Eq)]
enum State {
    Processing(usize),
    Completed { reply: bool },
}

/// A key as a store shows it: state and first sighting.
type View = Option<(State, u64)>;

#[derive(Clone, Debug)]
struct Slot {
    state: State,
    first_seen: u64,
    deadline: u64,
    /// Completion order (for "oldest COMPLETED").
    order: u64,
}

#[derive(Default)]
struct Model {
    now: u64,
    slots: [Option<Slot>; KEYS],
    completions: u64,
}

impl Model {
    fn live(&self, key: usize) -> Option<&Slot> {
        self.slots[key].as_ref().filter(|s| s.deadline > self.now)
    }

    fn view(&self, key: usize) -> View {
        self.live(key).map(|s| (s.state.clone(), s.first_seen))
    }

    /// The claim's answer: `None` = claimed, else what was found.
    fn claim(&mut self, owner: usize, key: usize, first_seen: u64, ttl: u64) -> View {
        if let Some(view) = self.view(key) {
            return Some(view);
        }
        self.slots[key] = Some(Slot {
            state: State::Processing(owner),
            first_seen,
            deadline: self.now + ttl,
            order: 0,
        });
        None
    }

    fn holds(&self, owner: usize, key: usize) -> bool {
        self.live(key).is_some_and(|s| s.state == State::Processing(owner))
    }

    fn complete(&mut self, owner: usize, key: usize, ttl: u64, reply: bool) -> bool {
        if !self.holds(owner, key) {
            return false;
        }
        self.completions += 1;
        let slot = self.slots[key].as_mut().expect("held");
        slot.state = State::Completed { reply };
        slot.deadline = self.now + ttl;
        slot.order = self.completions;
        true
    }

    fn release(&mut self, owner: usize, key: usize) -> bool {
        let held = self.holds(owner, key);
        if held {
            self.slots[key] = None;
        }
        held
    }

    /// Live COMPLETED keys, oldest completion first.
    fn completed_by_age(&self) -> Vec<usize> {
        let mut keys: Vec<usize> = (0..KEYS)
            .filter(|&k| {
                matches!(
                    self.live(k),
                    Some(Slot {
                        state: State::Completed { .. },
                        ..
                    })
                )
            })
            .collect();
        keys.sort_by_key(|&k| self.live(k).map(|s| s.order));
        keys
    }
}

// ---------------------------------------------------------------- the store side

/// What the cases exercised, summed over a run: a test whose cases never lost a reply,
/// evicted or expired anything would prove little, so each test checks its counts.
#[derive(Default, Debug)]
struct Stats {
    lost_replies: Cell<usize>,
    /// A complete or release refused because the caller does not hold the marker.
    refused: Cell<usize>,
    /// A claim that found a marker and left it as it was.
    found: Cell<usize>,
    expired: Cell<usize>,
    evicted: Cell<usize>,
    dropped_replies: Cell<usize>,
    full: Cell<usize>,
}

fn bump(c: &Cell<usize>) {
    c.set(c.get() + 1);
}

/// A store under test, with what the model needs to know about it.
struct Subject<'a, S> {
    store: &'a S,
    /// Keys of this case.
    keys: Vec<String>,
    tokens: [Token; OWNERS],
    /// The memory store's bounds apply (eviction, dropped replies, "full").
    bounded: bool,
    /// Dropped replies are allowed (the bound is `max_bytes`).
    bytes_bound: bool,
    redis: Option<&'a RedisSide>,
    started: StdInstant,
    stats: &'a Stats,
}

/// What only the Redis run has: the proxy that loses replies and a raw connection for
/// `PTTL` / `PEXPIRE`.
struct RedisSide {
    proxy: SwallowingProxy,
    server: std::net::SocketAddr,
}

fn completion(first_seen: u64, ttl: u64, reply: bool) -> Completion {
    Completion {
        first_seen_ms: first_seen,
        ttl: Duration::from_millis(ttl),
        response: reply.then(|| StoredResponse {
            status: StatusCode::OK,
            content_type: Some(HeaderValue::from_static("text/plain")),
            content_encoding: None,
            body: Bytes::from_static(b"reply body"),
        }),
    }
}

fn fail(what: String) -> TestCaseError {
    TestCaseError::fail(what)
}

impl<S: Store> Subject<'_, S> {
    fn owner_of(&self, token: Token) -> Result<usize, TestCaseError> {
        self.tokens
            .iter()
            .position(|t| *t == token)
            .ok_or_else(|| fail(format!("a marker held by an unknown token {token}")))
    }

    fn view_of(&self, marker: Option<Marker>) -> Result<View, TestCaseError> {
        Ok(match marker {
            None => None,
            Some(Marker::Processing { token, first_seen_ms }) => {
                Some((State::Processing(self.owner_of(token)?), first_seen_ms))
            }
            Some(Marker::Completed {
                first_seen_ms,
                response,
            }) => Some((
                State::Completed {
                    reply: response.is_some(),
                },
                first_seen_ms,
            )),
            // The model runs marker calls only; no append makes one QUEUED.
            Some(Marker::Queued { .. }) => return Err(fail("a QUEUED marker without an append".into())),
        })
    }

    fn claim_view(&self, claim: Claim) -> Result<View, TestCaseError> {
        match claim {
            Claim::Claimed => Ok(None),
            Claim::Found(marker) => self.view_of(Some(marker)),
        }
    }

    async fn claim(&self, owner: usize, key: usize, first_seen: u64, ttl: u64) -> Result<Claim, StoreError> {
        self.store
            .claim(
                &self.keys[key],
                self.tokens[owner],
                first_seen,
                Duration::from_millis(ttl),
            )
            .await
    }

    /// Runs one step on the store and on the model; checks the answer.
    async fn step(&self, model: &mut Model, step: usize, op: Op) -> Result<(), TestCaseError> {
        let first_seen = 1_000 + step as u64;
        match op {
            Op::Claim { owner, key, long } | Op::LostClaim { owner, key, long } => {
                let ttl = PROCESSING_TTL[usize::from(long)];
                let lost = matches!(op, Op::LostClaim { .. });
                let before = model.view(key);
                let expected = model.claim(owner, key, first_seen, ttl);
                let first = match self.redis {
                    Some(redis) if lost => {
                        let swallowed = redis.proxy.swallowed.load(std::sync::atomic::Ordering::SeqCst);
                        redis.proxy.arm(1);
                        let result = self.claim(owner, key, first_seen, ttl).await;
                        redis.proxy.arm(0);
                        let now = redis.proxy.swallowed.load(std::sync::atomic::Ordering::SeqCst);
                        prop_assert_eq!(now, swallowed + 1, "the proxy lost the claim's reply");
                        bump(&self.stats.lost_replies);
                        prop_assert!(
                            matches!(&result, Err(e) if e.is_ambiguous()),
                            "a lost reply is an ambiguous error: {:?}",
                            result
                        );
                        None
                    }
                    _ => Some(self.claim(owner, key, first_seen, ttl).await),
                };
                let answer = match first {
                    Some(Err(StoreError::Full(_))) if self.bounded && expected.is_none() => {
                        // Allowed only when nothing could make room: every live marker
                        // PROCESSING. The model takes the claim back.
                        let all_processing =
                            (0..KEYS).all(|k| !matches!(model.view(k), Some((State::Completed { .. }, _))));
                        prop_assert!(all_processing, "full although a COMPLETED marker could go");
                        bump(&self.stats.full);
                        model.slots[key] = None;
                        return Ok(());
                    }
                    Some(result) if !lost => result.map_err(|e| fail(format!("claim: {e}")))?,
                    // Lost: whatever the first answer was, the owner repeats the claim
                    // with its token, as the gateway does, and a marker with its own
                    // token means "claimed".
                    _ => match self.claim(owner, key, first_seen, ttl).await {
                        Ok(Claim::Found(Marker::Processing { token, .. }))
                            if token == self.tokens[owner] && before.is_none() =>
                        {
                            Claim::Claimed
                        }
                        Ok(other) => other,
                        Err(e) => return Err(fail(format!("repeated claim: {e}"))),
                    },
                };
                let seen = self.claim_view(answer)?;
                prop_assert_eq!(&seen, &expected, "step {}: {:?}", step, op);
                if seen.is_some() {
                    bump(&self.stats.found);
                }
            }
            Op::Complete {
                owner,
                key,
                long,
                reply,
            } => {
                let ttl = COMPLETED_TTL[usize::from(long)];
                // The owner records its own first sighting, as the gateway does.
                let first_seen = model.live(key).map_or(first_seen, |s| s.first_seen);
                let done = self
                    .store
                    .complete(&self.keys[key], self.tokens[owner], completion(first_seen, ttl, reply))
                    .await
                    .map_err(|e| fail(format!("complete: {e}")))?;
                prop_assert_eq!(done, model.complete(owner, key, ttl, reply), "step {}: {:?}", step, op);
                if !done {
                    bump(&self.stats.refused);
                }
            }
            Op::Release { owner, key } => {
                let first_seen = model.live(key).map_or(first_seen, |s| s.first_seen);
                let released = self
                    .store
                    .release(&self.keys[key], self.tokens[owner], first_seen)
                    .await
                    .map_err(|e| fail(format!("release: {e}")))?;
                prop_assert_eq!(released, model.release(owner, key), "step {}: {:?}", step, op);
                if !released {
                    bump(&self.stats.refused);
                }
            }
            Op::Get { key } => {
                // (Every step reads every key afterwards, too.)
                let marker = self
                    .store
                    .get(&self.keys[key])
                    .await
                    .map_err(|e| fail(format!("get: {e}")))?;
                prop_assert_eq!(self.view_of(marker)?, model.view(key), "step {}: {:?}", step, op);
            }
            Op::Advance { units } => {
                let by = units * UNIT;
                let live = (0..KEYS).filter(|&k| model.live(k).is_some()).count();
                model.now += by;
                let after = (0..KEYS).filter(|&k| model.live(k).is_some()).count();
                self.stats.expired.set(self.stats.expired.get() + live - after);
                match self.redis {
                    None => tokio::time::advance(Duration::from_millis(by)).await,
                    Some(redis) => {
                        for key in &self.keys {
                            redis.elapse(key, by).await;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// After a step: every key as the model says, allowing the memory store's evictions.
    async fn compare(&self, model: &mut Model, step: usize, op: Op) -> Result<(), TestCaseError> {
        let adds = match op {
            Op::Claim { .. } | Op::LostClaim { .. } => true,
            Op::Complete { reply, .. } => reply,
            _ => false,
        };
        let mut evicted = Vec::new();
        for key in 0..KEYS {
            let marker = self
                .store
                .get(&self.keys[key])
                .await
                .map_err(|e| fail(format!("get: {e}")))?;
            let seen = self.view_of(marker)?;
            let expected = model.view(key);
            match (&seen, &expected) {
                (None, Some((State::Completed { .. }, _))) if self.bounded && adds => evicted.push(key),
                (Some((State::Completed { reply: false }, a)), Some((State::Completed { reply: true }, b)))
                    if self.bytes_bound && a == b && matches!(op, Op::Complete { key: k, .. } if k == key) =>
                {
                    // The reply did not fit: the marker is kept without it.
                    bump(&self.stats.dropped_replies);
                    if let Some(slot) = model.slots[key].as_mut() {
                        slot.state = State::Completed { reply: false };
                    }
                }
                _ => prop_assert_eq!(seen, expected, "key {} after step {}: {:?}", key, step, op),
            }
        }
        if !evicted.is_empty() {
            let oldest = model.completed_by_age();
            evicted.sort_by_key(|k| oldest.iter().position(|o| o == k));
            prop_assert_eq!(
                &evicted[..],
                &oldest[..evicted.len()],
                "only the oldest COMPLETED may be evicted (step {}: {:?})",
                step,
                op
            );
            for key in evicted {
                bump(&self.stats.evicted);
                model.slots[key] = None;
            }
        }
        if let Some(redis) = self.redis {
            // A TTL is the model's: real time only shortens it, by at most what passed
            // plus the server's clock slack.
            let drift = self.started.elapsed().as_millis() as i64 + SERVER_CLOCK_SLACK_MS;
            for (k, key) in self.keys.iter().enumerate() {
                let pttl = redis.cmd(&["PTTL", key]).await;
                match model.live(k) {
                    None => prop_assert_eq!(pttl, -2, "key {} after step {}: gone", k, step),
                    Some(slot) => {
                        let left = (slot.deadline - model.now) as i64;
                        prop_assert!(
                            pttl <= left && pttl >= left - drift,
                            "key {} after step {} ({:?}): PTTL {} where the model has {}",
                            k,
                            step,
                            op,
                            pttl,
                            left
                        );
                    }
                }
            }
        }
        Ok(())
    }

    async fn run(&self, ops: &[Op]) -> Result<(), TestCaseError> {
        let mut model = Model::default();
        for (step, &op) in ops.iter().enumerate() {
            self.step(&mut model, step, op).await?;
            self.compare(&mut model, step, op).await?;
        }
        Ok(())
    }
}

impl RedisSide {
    /// One command on a plain connection to the server (not through the proxy).
    async fn cmd(&self, args: &[&str]) -> i64 {
        let mut conn = TcpStream::connect(self.server).await.expect("connect to redis");
        let mut req = format!("*{}\r\n", args.len());
        for a in args {
            req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        conn.write_all(req.as_bytes()).await.expect("send");
        let mut reply = Vec::new();
        let mut byte = [0u8; 1];
        while !reply.ends_with(b"\r\n") {
            conn.read_exact(&mut byte).await.expect("reply");
            reply.push(byte[0]);
        }
        let text = String::from_utf8_lossy(&reply);
        text.trim_start_matches(':')
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("integer reply expected: {text}"))
    }

    /// Lets `ms` pass for `key`: what expiry would do, on the server's own keys.
    async fn elapse(&self, key: &str, ms: u64) {
        let pttl = self.cmd(&["PTTL", key]).await;
        assert_ne!(pttl, -1, "{key} has no TTL");
        if pttl == -2 {
            return;
        }
        if pttl <= ms as i64 {
            self.cmd(&["DEL", key]).await;
        } else {
            self.cmd(&["PEXPIRE", key, &(pttl - ms as i64).to_string()]).await;
        }
    }
}

fn runner(cases: u32) -> TestRunner {
    TestRunner::new(RunnerConfig {
        cases,
        failure_persistence: None,
        ..RunnerConfig::default()
    })
}

fn tokens() -> [Token; OWNERS] {
    std::array::from_fn(|_| Token::generate())
}

/// Runs the memory store against the model, each case on a fresh paused clock.
fn memory(cases: u32, max_entries: usize, max_bytes: u64) -> Stats {
    let stats = Stats::default();
    let bounded = max_entries < KEYS || max_bytes < u64::MAX;
    let case = Cell::new(0u32);
    runner(cases)
        .run(&ops(40), |ops| {
            case.set(case.get() + 1);
            let case = case.get();
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .expect("runtime");
            rt.block_on(async {
                let store = MemoryStore::new(max_entries, max_bytes);
                let subject = Subject {
                    store: &store,
                    keys: (0..KEYS).map(|k| format!("model:{case}:{k}")).collect(),
                    tokens: tokens(),
                    bounded,
                    bytes_bound: max_bytes < u64::MAX,
                    redis: None,
                    started: StdInstant::now(),
                    stats: &stats,
                };
                subject.run(&ops).await
            })
        })
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        stats.refused.get() > 0 && stats.found.get() > 0 && stats.expired.get() > 0,
        "{stats:?}"
    );
    stats
}

#[test]
fn memory_store_follows_the_model() {
    let stats = memory(300, 1_000, u64::MAX);
    assert_eq!(stats.evicted.get() + stats.dropped_replies.get() + stats.full.get(), 0);
}

#[test]
fn memory_store_evicts_only_the_oldest_completed_under_max_entries() {
    let stats = memory(300, 2, u64::MAX);
    assert!(stats.evicted.get() > 0 && stats.full.get() > 0, "{stats:?}");
}

#[test]
fn memory_store_evicts_only_the_oldest_completed_under_max_bytes() {
    // What a stored reply costs, measured on the store itself.
    let reply = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime")
        .block_on(async {
            let store = MemoryStore::new(10, u64::MAX);
            let token = Token::generate();
            store.claim("k", token, 1, Duration::from_secs(9)).await.expect("claim");
            store
                .complete("k", token, completion(1, 9_000, true))
                .await
                .expect("complete");
            store.bytes().expect("bytes") - ENTRY_BYTES
        });
    // A reply costs more than two bare entries (56-byte slots), so no one bound has
    // both a reply stored and "full" at three bare entries: two bounds.
    // One entry with its stored reply fills the store: a reply is dropped whenever
    // another entry is live meanwhile, and stored replies are evicted.
    let replies = memory(300, 1_000, ENTRY_BYTES + reply);
    assert!(
        replies.evicted.get() > 0 && replies.dropped_replies.get() > 0,
        "{replies:?}"
    );
    // Two bare entries fit, never three: "full" when both are PROCESSING.
    let bare = memory(300, 1_000, 3 * ENTRY_BYTES - 1);
    assert!(bare.evicted.get() > 0 && bare.full.get() > 0, "{bare:?}");
}

#[test]
fn redis_store_follows_the_model_with_lost_replies() {
    redis_follows_the_model(RedisServer::start());
}

/// The same on Valkey 8.1, where complete is `SET ... IFEQ` rather than a script.
#[test]
fn redis_store_follows_the_model_on_valkey_with_set_if_eq() {
    redis_follows_the_model(RedisServer::start_valkey());
}

/// The same on Redis 8.6, where complete is `SET ... IFEQ` and release `DELEX ... IFEQ`.
#[test]
fn redis_store_follows_the_model_on_redis_8_with_set_and_delex_if_eq() {
    redis_follows_the_model(RedisServer::start_redis8());
}

fn redis_follows_the_model(start: impl Future<Output = RedisServer>) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let (server, side, store) = rt.block_on(async {
        let server = start.await;
        let proxy = SwallowingProxy::start(server.addr()).await;
        let store = RedisStore::connect(
            &RedisTarget::Standalone(proxy.url()),
            2,
            Duration::from_millis(300),
            "model:",
        )
        .await
        .expect("connect to redis");
        let side = RedisSide {
            proxy,
            server: server.addr(),
        };
        (server, side, store)
    });
    let stats = Stats::default();
    let case = Cell::new(0u32);
    runner(24)
        .run(&ops(30), |ops| {
            case.set(case.get() + 1);
            let case = case.get();
            rt.block_on(async {
                let subject = Subject {
                    store: &store,
                    keys: (0..KEYS).map(|k| format!("model:{case}:{k}")).collect(),
                    tokens: tokens(),
                    bounded: false,
                    bytes_bound: false,
                    redis: Some(&side),
                    started: StdInstant::now(),
                    stats: &stats,
                };
                subject.run(&ops).await
            })
        })
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        stats.lost_replies.get() > 0 && stats.refused.get() > 0 && stats.found.get() > 0 && stats.expired.get() > 0,
        "{stats:?}"
    );
    drop(store);
    drop(server);
}
