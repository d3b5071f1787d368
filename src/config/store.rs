//! `[store]`: the backend (memory, SQLite or Redis) and how store failures are answered.

use std::path::PathBuf;
use std::time::Duration;

use super::policy::OnStoreError;
use super::read::{self, Problems, Section};
use crate::secret::redact_url;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreConfig {
    pub backend: Backend,
    /// Bound on every store call.
    pub timeout: Duration,
    /// Prepended to every stored key (`<prefix><route>:<value>`).
    pub key_prefix: String,
    pub on_error: OnStoreError,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Backend {
    Memory {
        max_entries: usize,
        max_bytes: u64,
    },
    /// One SQLite file: markers and queues, durable across restarts.
    Sqlite {
        path: PathBuf,
        fsync: Fsync,
        max_bytes: u64,
    },
    Redis {
        target: RedisTarget,
        pool_size: usize,
        /// Replicas an append waits for (`WAIT`) before the ack; 0: none.
        wait_replicas: u32,
    },
}

/// When the SQLite store makes a commit durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fsync {
    /// Every commit reaches the disk before it is answered (concurrent ones share a
    /// commit): an acknowledged message survives power loss.
    Always,
    /// Commits are left to the OS: survives a crash of the process, not of the machine.
    Never,
}

impl read::Choice for Fsync {
    const NAMES: &'static [(&'static str, Self)] = &[("always", Self::Always), ("never", Self::Never)];
}

/// Where the Redis store is. The URLs may hold a password: `Debug` and `Display`
/// show them redacted.
#[derive(Clone, PartialEq, Eq)]
pub enum RedisTarget {
    Standalone(String),
    Cluster(Vec<String>),
}

impl RedisTarget {
    fn all(&self) -> &[String] {
        match self {
            RedisTarget::Standalone(url) => std::slice::from_ref(url),
            RedisTarget::Cluster(seeds) => seeds,
        }
    }

    /// Whether TLS certificates go unchecked (`store.tls_skip_verify`).
    pub fn skips_tls_verification(&self) -> bool {
        self.all().iter().any(|u| u.ends_with(INSECURE))
    }
}

impl std::fmt::Display for RedisTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        let shown: Vec<String> = self.all().iter().map(|u| redact_url(u)).collect();
        match self {
            RedisTarget::Standalone(_) => f.write_str(&shown.join("")),
            RedisTarget::Cluster(_) => write!(f, "cluster [{}]", shown.join(", ")),
        }
    }
}

impl std::fmt::Debug for RedisTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "RedisTarget({self})")
    }
}

/// What redis-rs reads from a `rediss://` URL as "skip certificate checks".
const INSECURE: &str = "#insecure";

pub(super) fn parse(section: Option<Section>, problems: &mut Problems) -> Option<StoreConfig> {
    let empty = toml::Table::new();
    let mut s = section.unwrap_or_else(|| Section::new("store", &empty));
    let backend_name = s.string("backend", problems).unwrap_or("memory");
    let max_entries = s.integer("max_entries", u64::from(u32::MAX), problems);
    let max_bytes = s.size("max_bytes", problems);
    let url = url_setting(&mut s, problems);
    let tls_skip_verify = s.boolean("tls_skip_verify", problems).unwrap_or(false);
    if tls_skip_verify && !cfg!(feature = "insecure-tls") {
        problems.push(
            s.path_of("tls_skip_verify"),
            "this build cannot skip TLS certificate checks (build with `--features insecure-tls`; tests only)",
        );
    }
    let cluster = cluster_setting(&mut s, problems);
    let pool_size = s.integer("pool_size", 4096, problems);
    let wait_replicas = s.integer("wait_replicas", 16, problems);
    let path = s.string("path", problems).map(PathBuf::from);
    let fsync = s.choice::<Fsync>("fsync", problems);
    let timeout = s.duration("timeout", problems).unwrap_or(Duration::from_millis(250));
    let key_prefix = s.string("key_prefix", problems).unwrap_or("dedup:").to_owned();
    let on_error = s.choice("on_error", problems).unwrap_or(OnStoreError::Reject);
    if timeout.is_zero() {
        problems.push(s.path_of("timeout"), "must be greater than 0");
    }
    let only_for = |key: &'static str, backend: &str, problems: &mut Problems| {
        problems.push(s.path_of(key), format!("only applies to backend = {backend:?}"))
    };
    // A sizing setting of the other backend is left from a template: ignored. A Redis
    // address is not: with the memory store, replicas would not dedupe together.
    let ignored = |key: &'static str, backend: &str, problems: &mut Problems| {
        problems.warn(
            s.path_of(key),
            format!("ignored: only applies to backend = {backend:?}"),
        )
    };
    let backend = match backend_name {
        "memory" => {
            for (key, set) in [
                ("url", s.has("url")),
                ("url_env", s.has("url_env")),
                ("cluster", s.has("cluster")),
                ("cluster_env", s.has("cluster_env")),
            ] {
                if set {
                    only_for(key, "redis", problems);
                }
            }
            for (key, set) in [
                ("tls_skip_verify", s.has("tls_skip_verify")),
                ("pool_size", pool_size.is_some()),
                ("wait_replicas", wait_replicas.is_some()),
            ] {
                if set {
                    ignored(key, "redis", problems);
                }
            }
            if path.is_some() {
                only_for("path", "sqlite", problems);
            }
            if fsync.is_some() {
                ignored("fsync", "sqlite", problems);
            }
            let max_bytes = max_bytes.unwrap_or(256 << 20);
            if max_bytes < MIN_MAX_BYTES {
                problems.push(
                    s.path_of("max_bytes"),
                    format!("must be at least {MIN_MAX_BYTES} bytes (room for a few thousand ids)"),
                );
            }
            match max_entries.unwrap_or(1_000_000) {
                0 => {
                    problems.push(s.path_of("max_entries"), "must be at least 1");
                    None
                }
                n => Some(Backend::Memory {
                    max_entries: n as usize,
                    max_bytes,
                }),
            }
        }
        "sqlite" => {
            for key in ["url", "url_env", "cluster", "cluster_env"] {
                if s.has(key) {
                    only_for(key, "redis", problems);
                }
            }
            for (key, set) in [
                ("tls_skip_verify", s.has("tls_skip_verify")),
                ("pool_size", pool_size.is_some()),
                ("wait_replicas", wait_replicas.is_some()),
                ("max_entries", max_entries.is_some()),
            ] {
                if set {
                    ignored(key, if key == "max_entries" { "memory" } else { "redis" }, problems);
                }
            }
            let max_bytes = max_bytes.unwrap_or(1 << 30);
            if max_bytes < MIN_SQLITE_BYTES {
                problems.push(
                    s.path_of("max_bytes"),
                    format!("must be at least {MIN_SQLITE_BYTES} bytes (the file's size: room for its tables)"),
                );
            }
            match path {
                Some(path) if !path.as_os_str().is_empty() => Some(Backend::Sqlite {
                    path,
                    fsync: fsync.unwrap_or(Fsync::Always),
                    max_bytes,
                }),
                _ => {
                    if !s.has("path") {
                        problems.push(
                            s.path_of("path"),
                            "backend = \"sqlite\" needs path, the database file (created if missing, with its folder)",
                        );
                    } else {
                        problems.push(s.path_of("path"), "must not be empty");
                    }
                    None
                }
            }
        }
        "redis" => {
            for (key, set) in [
                ("max_entries", max_entries.is_some()),
                ("max_bytes", max_bytes.is_some()),
            ] {
                if set {
                    ignored(key, "memory", problems);
                }
            }
            if path.is_some() {
                only_for("path", "sqlite", problems);
            }
            if fsync.is_some() {
                ignored("fsync", "sqlite", problems);
            }
            let target = match (url, cluster) {
                (Some((path, url)), None) => {
                    redis_url(&path, &url, tls_skip_verify, problems).map(RedisTarget::Standalone)
                }
                (None, Some(seeds)) => seeds
                    .into_iter()
                    .map(|(path, url)| redis_url(&path, &url, tls_skip_verify, problems))
                    .collect::<Option<Vec<_>>>()
                    .map(RedisTarget::Cluster),
                (None, None) => {
                    // Set but unusable (an unset variable, both forms) is reported already.
                    if !["url", "url_env", "cluster", "cluster_env"].iter().any(|k| s.has(k)) {
                        problems.push(
                            s.path_of("url"),
                            "backend = \"redis\" needs url or url_env (or cluster / cluster_env: seed urls)",
                        );
                    }
                    None
                }
                (Some(_), Some(_)) => {
                    let key = if s.has("cluster") { "cluster" } else { "cluster_env" };
                    problems.push(s.path_of(key), "set either a url or a cluster, not both");
                    None
                }
            };
            let pool_size = pool_size.unwrap_or(DEFAULT_POOL_SIZE) as usize;
            if pool_size == 0 {
                problems.push(s.path_of("pool_size"), "must be at least 1");
            }
            let wait_replicas = wait_replicas.map_or(0, |n| n as u32);
            target.map(|target| Backend::Redis {
                target,
                pool_size,
                wait_replicas,
            })
        }
        other => {
            problems.push(
                s.path_of("backend"),
                format!("unknown backend {other:?} (expected \"memory\", \"sqlite\" or \"redis\")"),
            );
            None
        }
    };
    s.finish(problems);
    Some(StoreConfig {
        backend: backend?,
        timeout,
        key_prefix,
        on_error,
    })
}

/// Redis connections per worker thread. Each carries any number of concurrent calls
/// (pipelined): one per worker batches best (measured, 2 workers, new ids: 1 -> 40-50
/// us CPU per request, 4 -> 64-70).
pub const DEFAULT_POOL_SIZE: u64 = 1;

/// The smallest `max_bytes` accepted: a bound that holds almost nothing is a mistake.
const MIN_MAX_BYTES: u64 = 64 << 10;

/// The smallest SQLite `max_bytes`: the file's pages for its schema and a few thousand
/// markers.
const MIN_SQLITE_BYTES: u64 = 1 << 20;

/// `store.url`, or the environment variable `store.url_env` names (so the password
/// can come from a Secret), with the key path to report problems at.
fn url_setting(s: &mut Section, problems: &mut Problems) -> Option<(String, String)> {
    let url = s.string("url", problems).map(|url| (s.path_of("url"), url.to_owned()));
    either_or_env(s, url, "url_env", problems, |path, value| {
        Some((path, value.to_owned()))
    })
}

/// `store.cluster`, or the seed URLs (separated by commas or white space) in the
/// environment variable `store.cluster_env` names, each with its key path.
fn cluster_setting(s: &mut Section, problems: &mut Problems) -> Option<Vec<(String, String)>> {
    let listed: Option<Vec<_>> = s
        .strings("cluster", problems)
        .map(|seeds| seeds.into_iter().map(|(path, url)| (path, url.to_owned())).collect());
    let seeds = either_or_env(s, listed, "cluster_env", problems, |path, value| {
        let seeds = value.split([',', ' ', '\t', '\n']).filter(|seed| !seed.is_empty());
        Some(
            seeds
                .enumerate()
                .map(|(i, url)| (format!("{path}[{i}]"), url.to_owned()))
                .collect(),
        )
    })?;
    if seeds.is_empty() {
        let key = if s.has("cluster") { "cluster" } else { "cluster_env" };
        problems.push(s.path_of(key), "needs at least one seed url");
        return None;
    }
    Some(seeds)
}

/// A setting given in the file (`given`), or read from the environment variable that
/// `env_key` names; both is a problem. `from_env` gets the path to report problems at,
/// naming the variable: `store.url_env ($REDIS_URL)`.
fn either_or_env<T>(
    s: &mut Section,
    given: Option<T>,
    env_key: &'static str,
    problems: &mut Problems,
    from_env: impl FnOnce(String, &str) -> Option<T>,
) -> Option<T> {
    match (given, read::from_env(s, env_key, problems)) {
        (Some(_), Some(_)) => {
            let key = env_key.trim_end_matches("_env");
            problems.push(s.path_of(env_key), format!("set either {key} or {env_key}, not both"));
            None
        }
        (Some(given), None) => Some(given),
        (None, Some((name, value))) => from_env(format!("{} (${name})", s.path_of(env_key)), value.expose()),
        (None, None) => None,
    }
}

/// Checks a Redis URL. Problems show it redacted: it may hold the password.
fn redis_url(path: &str, url: &str, tls_skip_verify: bool, problems: &mut Problems) -> Option<String> {
    let shown = redact_url(url);
    if !(url.starts_with("redis://") || url.starts_with("rediss://")) {
        problems.push(path, format!("{shown:?} must start with redis:// or rediss://"));
        return None;
    }
    // Past the user info (a password may hold a `#` without percent-encoding: the
    // parse below refuses that).
    let after_userinfo = &url[url.rfind('@').map_or(0, |at| at + 1)..];
    if after_userinfo.contains('#') {
        problems.push(
            path,
            format!(
                "{shown:?}: no #fragment; to skip TLS certificate checks (tests only) set store.tls_skip_verify = true"
            ),
        );
        return None;
    }
    // What the store will parse: a URL it cannot read is refused here, not at start.
    if let Err(e) = deadpool_redis::redis::IntoConnectionInfo::into_connection_info(url) {
        // redis-rs's reason ("Invalid port", ...), unless it could quote the password.
        let userinfo = url
            .split_once("://")
            .and_then(|(_, rest)| rest.rsplit_once('@'))
            .map(|(u, _)| u);
        let why = e.to_string();
        let why = match userinfo {
            Some(secret) if why.contains(secret) => "it does not parse".to_owned(),
            _ => why,
        };
        problems.push(
            path,
            format!(
                "{shown:?} is not a valid Redis URL ({why}; percent-encode / ? # @ in a password: %2F %3F %23 %40)"
            ),
        );
        return None;
    }
    if !tls_skip_verify {
        return Some(url.to_owned());
    }
    if url.starts_with("rediss://") {
        Some(format!("{url}{INSECURE}"))
    } else {
        problems.push(
            path,
            format!("{shown:?}: store.tls_skip_verify only applies to rediss:// URLs"),
        );
        None
    }
}
