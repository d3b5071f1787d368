//! What the gateway checks of a Redis before and while it uses it: the version and
//! the commands it has, the eviction policy, and the keys readiness writes to.

use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::redis::{self, ErrorKind, RedisError};

use super::connection::unavailable;
use crate::config::RedisTarget;
use crate::secret::redact_url;
use crate::store::StoreError;

/// What the start-up check learnt about one server.
pub(super) struct Server {
    /// It has `SET ... IFEQ`.
    pub(super) set_if_eq: bool,
    /// It has `DELEX ... IFEQ`.
    pub(super) del_if_eq: bool,
}

/// Why the start-up check of a server failed.
pub(super) enum Check {
    /// No answer: the gateway starts all the same (a store outage at start is one
    /// like any other), and checks again in the background.
    Unreachable(StoreError),
    /// It answered, and cannot be the store (too old, or it refuses the credentials: a
    /// config mistake): the gateway does not start.
    Unusable(StoreError),
}

impl Check {
    /// A failed connection or first command. Unreachable for now: the network (refused,
    /// reset, timed out, a name not resolvable yet) or a server that says "not now"
    /// (`LOADING`, ...). Anything else is a config mistake or a server that will not do:
    /// refused credentials, a database it will not select, a TLS certificate not
    /// trusted, a command the ACL denies.
    pub(super) fn of(shown: &str, e: &RedisError) -> Check {
        let error = StoreError::Unavailable(format!("{shown}: {e}"));
        // redis-rs keeps an I/O error as an `Arc<dyn Error>`; TLS failures are
        // `InvalidData` in it (tokio-rustls).
        let io_kind = std::error::Error::source(e)
            .and_then(|s| s.downcast_ref::<Arc<dyn std::error::Error + Send + Sync>>())
            .and_then(|inner| inner.downcast_ref::<std::io::Error>())
            .map(std::io::Error::kind);
        let not_now = matches!(
            e.code(),
            Some("LOADING" | "MASTERDOWN" | "CLUSTERDOWN" | "TRYAGAIN" | "BUSY")
        );
        if not_now || (e.kind() == ErrorKind::Io && io_kind != Some(std::io::ErrorKind::InvalidData)) {
            Check::Unreachable(error)
        } else {
            Check::Unusable(error)
        }
    }
}

/// Start-up checks on one server: version and eviction policy.
/// The readiness check's keys: `<prefix>__readyz`, and in a cluster sixteen of them,
/// `<prefix>__readyz{N}`, the hash tag `N` putting each in another sixteenth of the
/// slots, so that every node of a cluster split evenly (up to 16 primaries) holds one.
pub(super) fn health_keys(target: &RedisTarget, key_prefix: &str) -> Vec<String> {
    let key = format!("{key_prefix}__readyz");
    let RedisTarget::Cluster(_) = target else {
        return vec![key];
    };
    let mut tags = 0u32..;
    (0..16u16)
        .map(|part| {
            let tag = tags
                .find(|n| key_slot(&n.to_string()) / 1024 == part)
                .expect("every part has tags");
            format!("{key}{{{tag}}}")
        })
        .collect()
}

/// The Redis Cluster hash slot of a key without a `{hash tag}`: CRC16 (XMODEM) of the
/// key, mod 16384.
pub fn key_slot(key: &str) -> u16 {
    let crc = key.bytes().fold(0u16, |crc, byte| {
        (0..8).fold(crc ^ (u16::from(byte) << 8), |crc, _| {
            if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            }
        })
    });
    crc % 16384
}

pub(super) async fn check_server(url: &str, timeout: Duration) -> Result<Server, Check> {
    let shown = redact_url(url);
    // The whole check, not only the connect: a stopped server's kernel still accepts.
    tokio::time::timeout(timeout * 4, check_answers(url, &shown))
        .await
        .unwrap_or_else(|_| {
            let why = format!("{shown}: no answer within {:?}", timeout * 4);
            Err(Check::Unreachable(StoreError::Unavailable(why)))
        })
}

pub(super) async fn check_answers(url: &str, shown: &str) -> Result<Server, Check> {
    let client = redis::Client::open(url).map_err(|e| Check::Unusable(unavailable("invalid url", &e)))?;
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| Check::of(shown, &e))?;
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut conn)
        .await
        .map_err(|e| Check::of(shown, &e))?;
    let field = |name: &str| info.lines().find_map(|l| l.strip_prefix(name)).map(str::trim);
    let version = field("redis_version:").unwrap_or("unknown");
    if major_minor(version) < (7, 0) {
        return Err(Check::Unusable(StoreError::Unavailable(format!(
            "{shown}: Redis {version} is too old; dedup-gateway needs Redis >= 7 (SET NX GET)"
        ))));
    }
    for warning in durability_warnings(&mut conn).await {
        tracing::warn!(server = %shown, "{warning}");
    }
    let valkey = field("valkey_version:");
    let (set_if_eq, del_if_eq) = (set_if_eq(version, valkey), del_if_eq(version, valkey));
    tracing::info!(server = %shown, %version, set_if_eq, del_if_eq, "redis store checked");
    Ok(Server { set_if_eq, del_if_eq })
}

/// What may make this server lose what the gateway stores: an eviction policy other
/// than `noeviction` (markers dropped: duplicates let through; queued messages lost),
/// and no persistence at all (a restart loses everything).
async fn durability_warnings(conn: &mut impl redis::aio::ConnectionLike) -> Vec<String> {
    let mut warnings = Vec::new();
    let config = |name: &'static str| {
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("GET").arg(name);
        cmd
    };
    let policy: Result<Vec<String>, _> = config("maxmemory-policy").query_async(conn).await;
    match policy.as_deref() {
        Ok([_, policy]) if policy == "noeviction" => {}
        Ok([_, policy]) => warnings.push(format!(
            "maxmemory-policy is {policy}, not noeviction: under memory pressure Redis may drop markers (letting \
             duplicates through) and queued messages (losing them)"
        )),
        _ => warnings.push("cannot read maxmemory-policy (CONFIG disabled?); make sure it is noeviction".into()),
    }
    let aof: Result<Vec<String>, _> = config("appendonly").query_async(conn).await;
    let save: Result<Vec<String>, _> = config("save").query_async(conn).await;
    match (aof.as_deref(), save.as_deref()) {
        (Ok([_, aof]), Ok([_, save])) if aof == "no" && save.trim().is_empty() => warnings.push(
            "no persistence (appendonly no, no save points): a Redis restart loses every marker and every queued \
             message"
                .into(),
        ),
        (Ok(_), Ok(_)) => {}
        _ => warnings.push("cannot read appendonly and save (CONFIG disabled?); make sure Redis persists".into()),
    }
    warnings
}

/// For `check`: connects to each server of `target` and says what may make it lose
/// data ([`durability_warnings`]), or why it could not ask.
pub async fn durability(target: &RedisTarget, timeout: Duration) -> Vec<String> {
    let mut out = Vec::new();
    for url in target.urls() {
        let shown = redact_url(url);
        let asked = tokio::time::timeout(timeout * 4, async {
            let client = redis::Client::open(url.as_str())?;
            let mut conn = client.get_multiplexed_async_connection().await?;
            Ok::<_, RedisError>(durability_warnings(&mut conn).await)
        });
        match asked.await {
            Ok(Ok(warnings)) => out.extend(warnings.into_iter().map(|w| format!("{shown}: {w}"))),
            Ok(Err(e)) => out.push(format!("{shown}: cannot ask about persistence and eviction: {e}")),
            Err(_) => out.push(format!(
                "{shown}: no answer within {:?}; persistence and eviction not checked",
                timeout * 4
            )),
        }
    }
    out
}

/// Checks each of `urls`, not reachable at start, once a second until it answers: for
/// the log (its version and eviction policy), and, for a server that cannot be the
/// store, an error there and `unusable` set (readiness fails from then on).
pub(super) fn check_later(urls: Vec<String>, timeout: Duration, unusable: &Arc<std::sync::OnceLock<String>>) {
    for url in urls {
        let unusable = Arc::clone(unusable);
        tokio::spawn(async move {
            loop {
                match check_server(&url, timeout).await {
                    Ok(_) => return,
                    Err(Check::Unusable(error)) => {
                        tracing::error!(%error, "redis store cannot serve: not ready, every store call fails");
                        let _ = unusable.set(error.to_string());
                        return;
                    }
                    Err(Check::Unreachable(_)) => tokio::time::sleep(Duration::from_secs(1)).await,
                }
            }
        });
    }
}

/// Whether a server has `SET ... IFEQ`: Valkey from 8.1 (which reports itself as
/// Redis 7.2 in `redis_version`), Redis from 8.4.
pub(super) fn set_if_eq(redis_version: &str, valkey_version: Option<&str>) -> bool {
    match valkey_version {
        Some(valkey) => major_minor(valkey) >= (8, 1),
        None => major_minor(redis_version) >= (8, 4),
    }
}

/// Whether a server has `DELEX ... IFEQ`: Redis from 8.4. (Valkey's conditional delete
/// is `DELIFEQ`, from 9.0: not used, so Valkey releases with the script.)
pub(super) fn del_if_eq(redis_version: &str, valkey_version: Option<&str>) -> bool {
    valkey_version.is_none() && major_minor(redis_version) >= (8, 4)
}

/// `major.minor` of a version string; (0, 0) for one that does not parse.
pub(super) fn major_minor(version: &str) -> (u32, u32) {
    let mut parts = version.split('.').map(|p| p.parse::<u32>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(major), Some(minor)) => (major, minor),
        _ => (0, 0),
    }
}

impl RedisTarget {
    pub(super) fn urls(&self) -> &[String] {
        match self {
            RedisTarget::Standalone(url) => std::slice::from_ref(url),
            RedisTarget::Cluster(seeds) => seeds,
        }
    }
}
