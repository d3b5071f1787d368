//! Configuration: `gateway.toml` read into validated types holding parsed addresses,
//! matchers and policies. Every problem is reported with its key path, all at once.
//!
//! Precedence per route setting: the route's own value, then `[defaults]`, then the
//! built-in default (SPEC.md).

pub mod cidr;
pub mod read;
mod route;
pub mod secret;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use read::{Problems, Section};
pub use route::{DuplicateAnswer, PathPattern, RouteConfig, RoutePolicy, processing_ttl_floor, ttl_problems};

use crate::dedup::policy::OnStoreError;

/// The whole validated configuration.
#[derive(Clone, Debug)]
pub struct Config {
    pub server: ServerConfig,
    pub store: StoreConfig,
    pub routes: Vec<RouteConfig>,
    /// Settings read but not used, each as `key.path: why`: `check` prints them and
    /// the gateway logs them at start and on reload.
    pub warnings: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerConfig {
    /// Proxy listener (HTTP/1.1 and h2c).
    pub listen: SocketAddr,
    /// Worker threads, each with its own runtime and its own socket on `listen`.
    pub workers: usize,
    /// `/healthz`, `/livez`, `/readyz`, `/metrics`; `None` disables them.
    pub admin_listen: Option<SocketAddr>,
    /// Larger request bodies get 413; nothing is stored or forwarded.
    pub max_body: u64,
    /// From a request's first byte (or the end of the previous one on a kept-alive
    /// connection) to the end of its head; slower clients are cut off.
    pub header_timeout: Duration,
    /// The whole body must arrive within this after the head (per request, or per h2
    /// stream), else 400 and the connection is closed.
    pub body_timeout: Duration,
    /// A connection that carries no request for this long is closed (before its first
    /// byte; an h2c connection between streams).
    pub idle_timeout: Duration,
    /// On SIGTERM: keep accepting (while reporting not-ready) for this long, so load
    /// balancers stop sending before the listener closes.
    pub shutdown_delay: Duration,
    /// On SIGTERM: how long in-flight requests may still finish.
    pub shutdown_grace: Duration,
    /// Peers whose `X-Forwarded-Proto` / `-Host` are kept (front proxies that set them).
    pub trusted_proxies: Vec<cidr::Cidr>,
    /// Bearer token `POST /reload` and `DELETE /keys/...` require (from `admin_token_env`).
    pub admin_token: Option<secret::Secret>,
}

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
    Memory { max_entries: usize, max_bytes: u64 },
    Redis { target: RedisTarget, pool_size: usize },
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
        let shown: Vec<String> = self.all().iter().map(|u| secret::redact_url(u)).collect();
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

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The I/O error is in the message, and not a `source` too: an error chain
    /// printed whole (`main`'s) would say it twice.
    #[error("cannot read {path}: {error}")]
    Read { path: String, error: std::io::Error },
    #[error("{path}: invalid TOML: {message}")]
    Syntax { path: String, message: String },
    #[error("{} problem(s) in {path}:\n  {}", problems.len(), problems.join("\n  "))]
    Invalid { path: String, problems: Vec<String> },
}

impl Config {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
            path: path.display().to_string(),
            error,
        })?;
        Self::parse(&text).map_err(|e| e.at(path))
    }

    /// Parses a config from TOML text.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let table: toml::Table = toml::from_str(text).map_err(|e| ConfigError::Syntax {
            path: String::new(),
            message: syntax_message(text, &e),
        })?;
        let mut problems = Problems::default();
        let mut root = Section::new("", &table);
        let server = parse_server(root.section("server", &mut problems), &mut problems);
        let store = parse_store(root.section("store", &mut problems), &mut problems);
        let defaults = root
            .section("defaults", &mut problems)
            .map(|s| route::Settings::parse_defaults(s, &mut problems))
            .unwrap_or_default();
        let sections = root.sections("routes", &mut problems);
        root.finish(&mut problems);
        let routes = route::build_routes(sections, &defaults, store.as_ref(), &mut problems);
        if routes.is_empty() && problems.is_empty() {
            // Loads (the admin port alone is a valid thing to run), but a file cut short
            // or mounted empty is the likelier cause.
            problems.warn("routes", "none: every request gets 404");
        }
        let warnings = problems.take_warnings();
        match (server, store) {
            (Some(server), Some(store)) if problems.is_empty() => Ok(Config {
                server,
                store,
                routes,
                warnings,
            }),
            _ => Err(ConfigError::Invalid {
                path: String::new(),
                problems: problems.into_vec(),
            }),
        }
    }
}

/// A TOML syntax error as its line, column and problem, without the source line toml
/// quotes with it: that line may hold a secret (`secret = "..." junk`).
fn syntax_message(text: &str, e: &toml::de::Error) -> String {
    let message = e.message().trim_end();
    match e.span().and_then(|span| text.get(..span.start)) {
        Some(before) => {
            let line = before.matches('\n').count() + 1;
            let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
            format!("line {line}, column {column}: {message}")
        }
        None => message.to_owned(),
    }
}

impl ConfigError {
    fn at(self, file: &Path) -> Self {
        let file = file.display().to_string();
        match self {
            ConfigError::Syntax { message, .. } => ConfigError::Syntax { path: file, message },
            ConfigError::Invalid { problems, .. } => ConfigError::Invalid { path: file, problems },
            other => other,
        }
    }
}

fn parse_server(section: Option<Section>, problems: &mut Problems) -> Option<ServerConfig> {
    let empty = toml::Table::new();
    let mut s = section.unwrap_or_else(|| Section::new("server", &empty));
    let listen = socket_addr(&mut s, "listen", problems);
    let admin_listen = socket_addr(&mut s, "admin_listen", problems);
    let workers = s.integer("workers", 1024, problems).map(|n| n as usize);
    let server = ServerConfig {
        listen: listen.unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 8080))),
        workers: workers.unwrap_or_else(default_workers),
        admin_listen,
        max_body: s.size("max_body", problems).unwrap_or(1 << 20),
        header_timeout: s
            .duration("header_timeout", problems)
            .unwrap_or(Duration::from_secs(10)),
        body_timeout: s.duration("body_timeout", problems).unwrap_or(Duration::from_secs(30)),
        idle_timeout: s.duration("idle_timeout", problems).unwrap_or(Duration::from_secs(120)),
        shutdown_delay: s.duration("shutdown_delay", problems).unwrap_or(Duration::ZERO),
        shutdown_grace: s
            .duration("shutdown_grace", problems)
            .unwrap_or(Duration::from_secs(30)),
        trusted_proxies: trusted_proxies(&mut s, problems),
        admin_token: secret::from_env(&mut s, "admin_token_env", problems).map(|(_, token)| token),
    };
    if server.workers == 0 {
        problems.push(s.path_of("workers"), "must be at least 1");
    }
    // A wildcard takes its own family's addresses, and IPv6's (dual-stack on Linux)
    // IPv4's too.
    let covers = |w: std::net::IpAddr, other: std::net::IpAddr| w.is_unspecified() && (w.is_ipv6() || other.is_ipv4());
    if let (proxy, Some(admin)) = (server.listen, server.admin_listen)
        && proxy.port() != 0
        && proxy.port() == admin.port()
        && (proxy.ip() == admin.ip() || covers(proxy.ip(), admin.ip()) || covers(admin.ip(), proxy.ip()))
    {
        problems.push(
            s.path_of("admin_listen"),
            format!("{admin} overlaps server.listen ({proxy}): they need ports of their own"),
        );
    }
    for (key, value) in [
        ("header_timeout", server.header_timeout),
        ("body_timeout", server.body_timeout),
        ("idle_timeout", server.idle_timeout),
    ] {
        if value.is_zero() {
            problems.push(s.path_of(key), "must be greater than 0");
        }
    }
    s.finish(problems);
    Some(server)
}

fn trusted_proxies(s: &mut Section, problems: &mut Problems) -> Vec<cidr::Cidr> {
    let blocks = s.strings("trusted_proxies", problems).unwrap_or_default();
    blocks
        .into_iter()
        .filter_map(|(path, text)| cidr::Cidr::parse(text).map_err(|e| problems.push(path, e)).ok())
        .collect()
}

/// One worker per core the process may use.
fn default_workers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn socket_addr(s: &mut Section, key: &'static str, problems: &mut Problems) -> Option<SocketAddr> {
    let text = s.string(key, problems)?;
    match text.parse() {
        Ok(addr) => Some(addr),
        Err(_) => {
            problems.push(
                s.path_of(key),
                format!("invalid address {text:?} (expected e.g. \"127.0.0.1:8080\")"),
            );
            None
        }
    }
}

fn parse_store(section: Option<Section>, problems: &mut Problems) -> Option<StoreConfig> {
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
            ] {
                if set {
                    ignored(key, "redis", problems);
                }
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
        "redis" => {
            for (key, set) in [
                ("max_entries", max_entries.is_some()),
                ("max_bytes", max_bytes.is_some()),
            ] {
                if set {
                    ignored(key, "memory", problems);
                }
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
            target.map(|target| Backend::Redis { target, pool_size })
        }
        other => {
            problems.push(
                s.path_of("backend"),
                format!("unknown backend {other:?} (expected \"memory\" or \"redis\")"),
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
    match (given, secret::from_env(s, env_key, problems)) {
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
    let shown = secret::redact_url(url);
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
