//! The Redis store: shared by every replica, on standalone Redis (>= 7) or Redis
//! Cluster. One round trip per operation: a claim is `SET key v NX PX ttl GET`; complete
//! and release are Lua compare-and-set / compare-and-delete on the owner token.
//!
//! Values are JSON, readable with `redis-cli GET`:
//! `{"state":"processing","token":"<32 hex>","first_seen_ms":<unix ms>}` and
//! `{"state":"completed","first_seen_ms":..,"completed_ms":..,"response":{..}}`.
//!
//! Connections come from a deadpool pool of redis-rs connections with a manager that
//! does not PING on checkout (deadpool-redis's does: a second round trip per call).
//! A connection whose call timed out or failed at the transport is discarded instead:
//! if a reply never arrives (a broken middlebox), that connection's reply queue would
//! stay one behind and every later call on it would read its predecessor's answer.

use std::sync::Arc;
use std::sync::LazyLock;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use deadpool::managed::{self, Metrics, Object, RecycleResult};
use deadpool_redis::redis::{self, AsyncConnectionConfig, Cmd, FromRedisValue, RedisError, Script, ScriptInvocation};
use http::{HeaderValue, StatusCode};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::{Claim, Completion, Marker, Store, StoreError, StoredResponse, Token};
use crate::config::RedisTarget;

/// PROCESSING(token) -> COMPLETED, only while the marker holds the caller's token.
/// ARGV[1] is the PROCESSING value's prefix up to and including the token.
const COMPLETE_LUA: &str = r"local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, #ARGV[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0";

/// Deletes PROCESSING(token), only while the marker holds the caller's token.
const RELEASE_LUA: &str = r"local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, #ARGV[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0";

static COMPLETE: LazyLock<Script> = LazyLock::new(|| Script::new(COMPLETE_LUA));
static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_LUA));

pub struct RedisStore {
    pool: Pool,
    health: Pool,
    timeout: Duration,
}

enum Pool {
    Standalone(managed::Pool<Standalone>),
    Cluster(managed::Pool<Cluster>),
}

/// A checked-out connection of either kind.
enum Conn {
    Standalone(Object<Standalone>),
    Cluster(Object<Cluster>),
}

struct Standalone {
    client: redis::Client,
    config: AsyncConnectionConfig,
}

struct Cluster {
    client: redis::cluster::ClusterClient,
}

impl managed::Manager for Standalone {
    type Type = redis::aio::MultiplexedConnection;
    type Error = RedisError;

    async fn create(&self) -> Result<Self::Type, RedisError> {
        self.client
            .get_multiplexed_async_connection_with_config(&self.config)
            .await
    }

    async fn recycle(&self, _: &mut Self::Type, _: &Metrics) -> RecycleResult<RedisError> {
        Ok(()) // broken connections are discarded when a call fails on them
    }
}

impl managed::Manager for Cluster {
    type Type = redis::cluster_async::ClusterConnection;
    type Error = RedisError;

    async fn create(&self) -> Result<Self::Type, RedisError> {
        self.client.get_async_connection().await
    }

    async fn recycle(&self, _: &mut Self::Type, _: &Metrics) -> RecycleResult<RedisError> {
        Ok(())
    }
}

impl redis::aio::ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            Conn::Standalone(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            Conn::Standalone(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Standalone(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

impl Conn {
    /// Drops the connection instead of returning it to the pool.
    fn discard(self) {
        match self {
            Conn::Standalone(c) => drop(Object::take(c)),
            Conn::Cluster(c) => drop(Object::take(c)),
        }
    }
}

/// One call: a command or a script invocation.
enum Call<'a> {
    Cmd(&'a Cmd),
    Script(&'a ScriptInvocation<'a>),
}

impl RedisStore {
    /// Builds the pools and checks the server(s): Redis >= 7 (for `SET NX GET`), and a
    /// warning unless `maxmemory-policy` is `noeviction` (an evicting Redis silently
    /// drops markers).
    pub async fn connect(target: &RedisTarget, pool_size: usize, timeout: Duration) -> Result<Self, StoreError> {
        let store = RedisStore {
            pool: Pool::new(target, pool_size, timeout)?,
            // Readiness gets its own connection: a pool saturated by traffic must not
            // make every replica report not-ready at once.
            health: Pool::new(target, 1, timeout)?,
            timeout,
        };
        for url in target.urls() {
            check_server(url, timeout).await?;
        }
        store.load_scripts().await?;
        Ok(store)
    }

    /// Loads the scripts up front (on every primary of a cluster), so the first
    /// complete is one EVALSHA rather than EVALSHA, NOSCRIPT, SCRIPT LOAD, EVALSHA.
    /// After a Redis restart the scripts are reloaded on the first NOSCRIPT.
    async fn load_scripts(&self) -> Result<(), StoreError> {
        for code in [COMPLETE_LUA, RELEASE_LUA] {
            let mut cmd = redis::cmd("SCRIPT");
            cmd.arg("LOAD").arg(code);
            self.call::<redis::Value>(&self.pool, Call::Cmd(&cmd)).await?;
        }
        Ok(())
    }

    /// One command on a pooled connection, within `store.timeout` in all.
    async fn call<T: FromRedisValue>(&self, pool: &Pool, call: Call<'_>) -> Result<T, StoreError> {
        let deadline = Instant::now() + self.timeout;
        let mut conn = match tokio::time::timeout_at(deadline, pool.get()).await {
            Ok(Ok(conn)) => conn,
            // Nothing was sent: these are definite failures, not lost replies.
            Ok(Err(e)) => {
                pool.forget_idle();
                return Err(StoreError::Unavailable(e));
            }
            Err(_) => return Err(StoreError::Unavailable("no connection within store.timeout".into())),
        };
        let reply = tokio::time::timeout_at(deadline, async {
            match call {
                Call::Cmd(cmd) => cmd.query_async::<T>(&mut conn).await,
                Call::Script(script) => script.invoke_async::<T>(&mut conn).await,
            }
        })
        .await;
        match reply {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) if e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error() => {
                conn.discard();
                pool.forget_idle();
                Err(StoreError::Lost(e.to_string()))
            }
            // Redis answered with an error: a definite "no".
            Ok(Err(e)) => Err(StoreError::Unavailable(e.to_string())),
            Err(_) => {
                // A reply that never comes would leave this connection's reply queue one
                // behind, so every later call on it would read its predecessor's answer.
                conn.discard();
                Err(StoreError::Timeout)
            }
        }
    }
}

impl Pool {
    fn new(target: &RedisTarget, size: usize, timeout: Duration) -> Result<Self, StoreError> {
        Ok(match target {
            RedisTarget::Standalone(url) => {
                let client = redis::Client::open(url.as_str()).map_err(|e| unavailable("invalid url", &e))?;
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(timeout))
                    .set_response_timeout(None); // our own deadline bounds every call
                Pool::Standalone(build_pool(Standalone { client, config }, size)?)
            }
            RedisTarget::Cluster(seeds) => {
                let client = redis::cluster::ClusterClient::builder(seeds.iter().map(String::as_str))
                    .connection_timeout(timeout)
                    .response_timeout(timeout)
                    .retries(2)
                    .build()
                    .map_err(|e| unavailable("invalid cluster seeds", &e))?;
                Pool::Cluster(build_pool(Cluster { client }, size)?)
            }
        })
    }

    async fn get(&self) -> Result<Conn, String> {
        match self {
            Pool::Standalone(p) => p.get().await.map(Conn::Standalone).map_err(|e| e.to_string()),
            Pool::Cluster(p) => p.get().await.map(Conn::Cluster).map_err(|e| e.to_string()),
        }
    }

    /// After a transport failure the idle connections are probably dead too (Redis
    /// restarted): drop them so the next calls connect afresh instead of failing one by one.
    fn forget_idle(&self) {
        match self {
            Pool::Standalone(p) => drop(p.retain(|_, _| false)),
            Pool::Cluster(p) => drop(p.retain(|_, _| false)),
        }
    }
}

fn build_pool<M: managed::Manager>(manager: M, size: usize) -> Result<managed::Pool<M>, StoreError> {
    managed::Pool::builder(manager)
        .max_size(size)
        .runtime(deadpool::Runtime::Tokio1)
        .build()
        .map_err(|e| StoreError::Unavailable(format!("cannot build the connection pool: {e}")))
}

fn unavailable(what: &str, e: &RedisError) -> StoreError {
    StoreError::Unavailable(format!("{what}: {e}"))
}

/// Start-up checks on one server: version and eviction policy.
async fn check_server(url: &str, timeout: Duration) -> Result<(), StoreError> {
    let shown = redact(url);
    let client = redis::Client::open(url).map_err(|e| unavailable("invalid url", &e))?;
    let mut conn = tokio::time::timeout(timeout * 4, client.get_multiplexed_async_connection())
        .await
        .map_err(|_| StoreError::Unavailable(format!("{shown}: no connection within {:?}", timeout * 4)))?
        .map_err(|e| StoreError::Unavailable(format!("{shown}: {e}")))?;
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut conn)
        .await
        .map_err(|e| StoreError::Unavailable(format!("{shown}: INFO failed: {e}")))?;
    let version = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .map(str::trim)
        .unwrap_or("unknown");
    let major: u32 = version.split('.').next().and_then(|m| m.parse().ok()).unwrap_or(0);
    if major < 7 {
        return Err(StoreError::Unavailable(format!(
            "{shown}: Redis {version} is too old; dedup-gateway needs Redis >= 7 (SET NX GET)"
        )));
    }
    let policy: Result<Vec<String>, _> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("maxmemory-policy")
        .query_async(&mut conn)
        .await;
    match policy.as_deref() {
        Ok([_, policy]) if policy == "noeviction" => {}
        Ok([_, policy]) => tracing::warn!(
            server = %shown, %policy,
            "maxmemory-policy is not noeviction: under memory pressure Redis may drop markers and let duplicates through"
        ),
        _ => {
            tracing::warn!(server = %shown, "cannot read maxmemory-policy (CONFIG disabled?); make sure it is noeviction")
        }
    }
    tracing::info!(server = %shown, %version, "redis store checked");
    Ok(())
}

/// A URL without its password, for logs.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => format!("{}://***@{}", &url[..scheme], &url[at + 1..]),
        _ => url.to_owned(),
    }
}

impl RedisTarget {
    fn urls(&self) -> &[String] {
        match self {
            RedisTarget::Standalone(url) => std::slice::from_ref(url),
            RedisTarget::Cluster(seeds) => seeds,
        }
    }
}

// ---------------------------------------------------------------- value format

/// The PROCESSING value. Built by hand so it always starts with the prefix the Lua
/// scripts compare.
fn processing_value(token: Token, first_seen_ms: u64) -> String {
    format!("{},\"first_seen_ms\":{first_seen_ms}}}", token_prefix(token))
}

/// `{"state":"processing","token":"<hex>"`: what identifies the owner in a value.
fn token_prefix(token: Token) -> String {
    format!("{{\"state\":\"processing\",\"token\":\"{token}\"")
}

#[derive(Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "lowercase")]
enum Value {
    Processing {
        token: String,
        first_seen_ms: u64,
    },
    Completed {
        first_seen_ms: u64,
        completed_ms: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        response: Option<ResponseValue>,
    },
}

/// A stored response: the body as text when it is UTF-8, else base64.
#[derive(Serialize, Deserialize)]
struct ResponseValue {
    status: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    content_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    content_encoding: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    body: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    body_base64: Option<String>,
}

fn completed_value(c: &Completion) -> String {
    let response = c.response.as_ref().map(|r| {
        let (body, body_base64) = match std::str::from_utf8(&r.body) {
            Ok(text) => (Some(text.to_owned()), None),
            Err(_) => (None, Some(base64::engine::general_purpose::STANDARD.encode(&r.body))),
        };
        let text = |v: &Option<HeaderValue>| v.as_ref().and_then(|v| v.to_str().ok()).map(str::to_owned);
        ResponseValue {
            status: r.status.as_u16(),
            content_type: text(&r.content_type),
            content_encoding: text(&r.content_encoding),
            body,
            body_base64,
        }
    });
    let value = Value::Completed {
        first_seen_ms: c.first_seen_ms,
        completed_ms: super::unix_ms(),
        response,
    };
    serde_json::to_string(&value).unwrap_or_default()
}

fn parse_marker(raw: &[u8]) -> Result<Marker, StoreError> {
    let corrupt = |why: String| StoreError::Corrupt(why);
    match serde_json::from_slice::<Value>(raw).map_err(|e| corrupt(e.to_string()))? {
        Value::Processing { token, first_seen_ms } => {
            let token = u128::from_str_radix(&token, 16).map_err(|e| corrupt(format!("token: {e}")))?;
            Ok(Marker::Processing {
                token: Token::from_u128(token),
                first_seen_ms,
            })
        }
        Value::Completed {
            first_seen_ms,
            response,
            ..
        } => {
            let response = response.map(stored_response).transpose()?.map(Arc::new);
            Ok(Marker::Completed {
                first_seen_ms,
                response,
            })
        }
    }
}

fn stored_response(r: ResponseValue) -> Result<StoredResponse, StoreError> {
    let status = StatusCode::from_u16(r.status).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let body = match (r.body, r.body_base64) {
        (Some(text), _) => Bytes::from(text),
        (None, Some(b64)) => base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map(Bytes::from)
            .map_err(|e| StoreError::Corrupt(e.to_string()))?,
        (None, None) => Bytes::new(),
    };
    let header = |v: Option<String>| v.and_then(|v| HeaderValue::from_str(&v).ok());
    Ok(StoredResponse {
        status,
        content_type: header(r.content_type),
        content_encoding: header(r.content_encoding),
        body,
    })
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

impl Store for RedisStore {
    async fn claim(&self, key: &str, token: Token, first_seen_ms: u64, ttl: Duration) -> Result<Claim, StoreError> {
        let mut cmd = redis::cmd("SET");
        cmd.arg(key)
            .arg(processing_value(token, first_seen_ms))
            .arg("NX")
            .arg("PX")
            .arg(millis(ttl))
            .arg("GET");
        let previous: Option<Vec<u8>> = self.call(&self.pool, Call::Cmd(&cmd)).await?;
        match previous {
            None => Ok(Claim::Claimed),
            Some(raw) => parse_marker(&raw).map(Claim::Found),
        }
    }

    async fn complete(&self, key: &str, token: Token, completion: Completion) -> Result<bool, StoreError> {
        let mut invocation = COMPLETE.prepare_invoke();
        invocation
            .key(key)
            .arg(token_prefix(token))
            .arg(completed_value(&completion))
            .arg(millis(completion.ttl));
        let done: i64 = self.call(&self.pool, Call::Script(&invocation)).await?;
        Ok(done == 1)
    }

    async fn release(&self, key: &str, token: Token) -> Result<bool, StoreError> {
        let mut invocation = RELEASE.prepare_invoke();
        invocation.key(key).arg(token_prefix(token));
        let deleted: i64 = self.call(&self.pool, Call::Script(&invocation)).await?;
        Ok(deleted == 1)
    }

    async fn get(&self, key: &str) -> Result<Option<Marker>, StoreError> {
        let mut cmd = redis::cmd("GET");
        cmd.arg(key);
        let raw: Option<Vec<u8>> = self.call(&self.pool, Call::Cmd(&cmd)).await?;
        raw.map(|raw| parse_marker(&raw)).transpose()
    }

    /// Another replica may hold the marker, so there is nothing to be woken by: poll,
    /// starting fast (most first attempts finish within milliseconds) and backing off
    /// to 200 ms so a long wait costs a few round trips a second.
    async fn wait(&self, _key: &str, _holder: Token, attempt: u32, max: Duration) {
        let backoff = Duration::from_millis(5u64 << attempt.min(6)).min(Duration::from_millis(200));
        tokio::time::sleep(backoff.min(max)).await;
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let cmd = redis::cmd("PING");
        self.call::<String>(&self.health, Call::Cmd(&cmd)).await.map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn processing_values_start_with_the_token_prefix_and_parse_back() {
        let token = Token::generate();
        let value = processing_value(token, 1_700_000_000_123);
        assert!(value.starts_with(&token_prefix(token)));
        assert_eq!(
            parse_marker(value.as_bytes()).expect("parse"),
            Marker::Processing {
                token,
                first_seen_ms: 1_700_000_000_123
            }
        );
        let other = Token::generate();
        assert!(!value.starts_with(&token_prefix(other)));
    }

    #[test]
    fn completed_values_keep_the_response_text_or_binary() {
        for body in [
            Bytes::from_static(b"{\"reply\":\"hi\"}"),
            Bytes::from_static(&[0xff, 0x00, 0x7f]),
        ] {
            let c = Completion {
                first_seen_ms: 7,
                ttl: Duration::from_secs(1),
                response: Some(StoredResponse {
                    status: StatusCode::CREATED,
                    content_type: Some(HeaderValue::from_static("application/json")),
                    content_encoding: Some(HeaderValue::from_static("gzip")),
                    body: body.clone(),
                }),
            };
            let value = completed_value(&c);
            assert!(
                value.starts_with("{\"state\":\"completed\",\"first_seen_ms\":7,"),
                "{value}"
            );
            let Marker::Completed {
                first_seen_ms,
                response,
            } = parse_marker(value.as_bytes()).expect("parse")
            else {
                panic!("not completed")
            };
            assert_eq!(first_seen_ms, 7);
            assert_eq!(response.as_deref(), c.response.as_ref());
        }
    }

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(redact("redis://user:secret@host:6379/0"), "redis://***@host:6379/0");
        assert_eq!(redact("redis://host:6379"), "redis://host:6379");
    }
}
