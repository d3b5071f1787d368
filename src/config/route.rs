//! `[[routes]]` and `[defaults]`: per-route settings, merged route > preset > defaults >
//! built-in. A preset (`preset = "slack"`) fills in what the route does not set itself.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, StatusCode};

use super::queue::{Delivery, QueueSettings};
use super::read::{Problems, Section};
use super::{Backend, StoreConfig, Target};
use crate::config::policy::OnStoreError;
use crate::config::policy::{InFlight, Mode, OnMissingKey, OnUpstreamTimeout};
use crate::key::{Alternative, KeySpec};
use crate::secret::Secret;
use crate::senders::{self, Credentials, Field, Preset, Sender};

/// Which request paths a route serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathPattern {
    /// `/api/v1/webhook`: this path only.
    Exact(String),
    /// `/hooks/*`: every path starting with `/hooks/`.
    Prefix(String),
}

impl PathPattern {
    fn parse(text: &str) -> Result<Self, String> {
        if !text.starts_with('/') {
            return Err(format!("{text:?} must start with \"/\""));
        }
        match text.strip_suffix('*') {
            Some(prefix) if prefix.ends_with('/') && !prefix.contains('*') => {
                Ok(PathPattern::Prefix(prefix.to_owned()))
            }
            Some(_) => Err(format!(
                "{text:?}: \"*\" may only end a path, after \"/\" (e.g. \"/hooks/*\")"
            )),
            None if text.contains('*') => Err(format!("{text:?}: \"*\" may only end a path")),
            None => Ok(PathPattern::Exact(text.to_owned())),
        }
    }
}

impl std::fmt::Display for PathPattern {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            PathPattern::Exact(p) => f.write_str(p),
            PathPattern::Prefix(p) => write!(f, "{p}*"),
        }
    }
}

/// The answer a duplicate gets (WeChat expects a plain `success`).
#[derive(Clone, Debug)]
pub struct DuplicateAnswer {
    pub status: StatusCode,
    pub body: Bytes,
    pub content_type: HeaderValue,
}

/// One validated route: where it listens and forwards, what it keys on, and how it behaves.
#[derive(Clone, Debug)]
pub struct RouteConfig {
    pub name: String,
    pub path: PathPattern,
    pub upstream: Target,
    pub key: KeySpec,
    pub policy: RoutePolicy,
    /// The sender preset, its signature check and decryption keys.
    pub sender: Option<Sender>,
}

/// The settings `[defaults]` may also provide.
#[derive(Clone, Debug)]
pub struct RoutePolicy {
    pub upstream_timeout: Duration,
    pub processing_ttl: Duration,
    pub completed_ttl: Duration,
    pub on_in_flight: InFlight,
    pub in_flight_wait: Duration,
    pub on_upstream_timeout: OnUpstreamTimeout,
    pub mode: Mode,
    pub on_missing_key: OnMissingKey,
    pub replay: bool,
    pub duplicate: DuplicateAnswer,
    /// `delivery`: sync, or queued with its queue's settings.
    pub delivery: Delivery,
}

/// Settings as written in one table; `None` means "not set here".
#[derive(Default)]
pub(super) struct Settings {
    upstream_timeout: Option<Duration>,
    key: Option<KeySpec>,
    processing_ttl: Option<Duration>,
    completed_ttl: Option<Duration>,
    on_in_flight: Option<InFlight>,
    in_flight_wait: Option<Duration>,
    on_upstream_timeout: Option<OnUpstreamTimeout>,
    mode: Option<Mode>,
    on_missing_key: Option<OnMissingKey>,
    replay: Option<bool>,
    duplicate_status: Option<StatusCode>,
    duplicate_body: Option<String>,
    duplicate_content_type: Option<HeaderValue>,
    preset: Option<&'static Preset>,
    secret: Option<Configured<Secret>>,
    aes_key: Option<Configured<Secret>>,
    app_id: Option<Configured<String>>,
    require_encryption: Option<Configured<bool>>,
    queue: QueueSettings,
}

/// A credential and the key path it came from (for problems; never the value).
#[derive(Clone)]
struct Configured<T> {
    value: T,
    path: String,
}

/// The settings a preset fills in, in the order `check` lists them.
const PRESET_FILLS: [&str; 6] = [
    "key",
    "completed_ttl",
    "in_flight_wait",
    "duplicate_status",
    "duplicate_body",
    "duplicate_content_type",
];

impl Settings {
    /// Reads every shared setting of a table and, for a route, leaves name/path/upstream
    /// to the caller; `finish` is the caller's too (it may read more keys).
    fn read(s: &mut Section, problems: &mut Problems) -> Self {
        let duplicate_status =
            s.integer("duplicate_status", 999, problems)
                .and_then(|n| match StatusCode::from_u16(n as u16) {
                    Ok(code) if (200..=599).contains(&n) => Some(code),
                    _ => {
                        problems.push(
                            s.path_of("duplicate_status"),
                            format!("{n} is not a final HTTP status (200..=599)"),
                        );
                        None
                    }
                });
        let duplicate_content_type = s.string("duplicate_content_type", problems).and_then(|ct| {
            HeaderValue::from_str(ct).ok().or_else(|| {
                problems.push(
                    s.path_of("duplicate_content_type"),
                    format!("{ct:?} is not a valid header value"),
                );
                None
            })
        });
        let preset = s.string("preset", problems).and_then(|name| {
            senders::preset(name).or_else(|| {
                problems.push(
                    s.path_of("preset"),
                    format!("unknown preset {name:?} (expected {})", senders::preset_names()),
                );
                None
            })
        });
        Settings {
            preset,
            secret: secret(s, "secret", "secret_env", problems),
            aes_key: secret(s, "aes_key", "aes_key_env", problems),
            app_id: s.string("app_id", problems).map(|id| Configured {
                value: id.to_owned(),
                path: s.path_of("app_id"),
            }),
            require_encryption: s.boolean("require_encryption", problems).map(|on| Configured {
                value: on,
                path: s.path_of("require_encryption"),
            }),
            queue: QueueSettings::read(s, problems),
            upstream_timeout: positive(s, "upstream_timeout", problems),
            key: key_spec(s, problems),
            processing_ttl: positive(s, "processing_ttl", problems),
            completed_ttl: positive(s, "completed_ttl", problems),
            on_in_flight: s.choice("on_in_flight", problems),
            in_flight_wait: s.duration("in_flight_wait", problems),
            on_upstream_timeout: s.choice("on_upstream_timeout", problems),
            mode: s.choice("mode", problems),
            on_missing_key: s.choice("on_missing_key", problems),
            replay: s.boolean("replay", problems),
            duplicate_status,
            duplicate_body: s.string("duplicate_body", problems).map(str::to_owned),
            duplicate_content_type,
        }
    }

    /// Parses `[defaults]`, where per-route identity is not allowed.
    pub(super) fn parse_defaults(mut s: Section, problems: &mut Problems) -> Self {
        for key in ["name", "path", "upstream"] {
            s.refuse(key, "only allowed in [[routes]]", problems);
        }
        let settings = Self::read(&mut s, problems);
        s.finish(problems);
        settings
    }
}

impl Settings {
    /// What a preset fills in, as if the route had written it.
    fn from_preset(p: &Preset) -> Self {
        let alternatives = p.key.iter().filter_map(|text| Alternative::parse(text).ok()).collect();
        Settings {
            key: Some(KeySpec::new(alternatives)),
            completed_ttl: Some(p.completed_ttl),
            in_flight_wait: Some(p.in_flight_wait),
            duplicate_status: StatusCode::from_u16(p.ack.status).ok(),
            duplicate_body: Some(p.ack.body.to_owned()),
            duplicate_content_type: HeaderValue::from_str(p.ack.content_type).ok(),
            ..Settings::default()
        }
    }

    /// Whether this table sets the named preset-filled setting.
    fn sets(&self, name: &str) -> bool {
        match name {
            "key" => self.key.is_some(),
            "completed_ttl" => self.completed_ttl.is_some(),
            "in_flight_wait" => self.in_flight_wait.is_some(),
            "duplicate_status" => self.duplicate_status.is_some(),
            "duplicate_body" => self.duplicate_body.is_some(),
            "duplicate_content_type" => self.duplicate_content_type.is_some(),
            _ => false,
        }
    }
}

/// A secret set directly (`secret = "..."`) or by naming an environment variable
/// (`secret_env = "VAR"`); an unset variable is a problem at the `_env` key's path.
fn secret(
    s: &mut Section,
    key: &'static str,
    env_key: &'static str,
    problems: &mut Problems,
) -> Option<Configured<Secret>> {
    let direct = s.string(key, problems);
    let var = s.string(env_key, problems);
    let (value, path) = match (direct, var) {
        (None, None) => return None,
        (Some(_), Some(_)) => {
            problems.push(s.path_of(env_key), format!("set either {key} or {env_key}, not both"));
            return None;
        }
        (Some(value), None) => (value.to_owned(), s.path_of(key)),
        (None, Some(var)) => match std::env::var(var) {
            Ok(value) => (value, s.path_of(env_key)),
            Err(std::env::VarError::NotPresent) => {
                problems.push(s.path_of(env_key), format!("environment variable {var:?} is not set"));
                return None;
            }
            Err(std::env::VarError::NotUnicode(_)) => {
                problems.push(s.path_of(env_key), format!("environment variable {var:?} is not UTF-8"));
                return None;
            }
        },
    };
    if value.is_empty() {
        problems.push(path, "must not be empty");
        return None;
    }
    Some(Configured {
        value: Secret::new(value),
        path,
    })
}

/// Builds a route's sender from its preset and credentials (route over `[defaults]`).
fn sender(
    s: &Section,
    preset: Option<&'static Preset>,
    own: &Settings,
    defaults: &Settings,
    problems: &mut Problems,
) -> Option<Sender> {
    let secret = own.secret.clone().or_else(|| defaults.secret.clone());
    let aes_key = own.aes_key.clone().or_else(|| defaults.aes_key.clone());
    let app_id = own.app_id.clone().or_else(|| defaults.app_id.clone());
    let require_encryption = own
        .require_encryption
        .clone()
        .or_else(|| defaults.require_encryption.clone());
    let Some(preset) = preset else {
        let paths = [&secret, &aes_key].into_iter().flatten().map(|c| &c.path);
        let others = app_id.as_ref().map(|c| &c.path).into_iter();
        let others = others.chain(require_encryption.as_ref().filter(|c| c.value).map(|c| &c.path));
        for path in paths.chain(others) {
            problems.push(path, "needs a preset (the preset says how the sender signs)");
        }
        return None;
    };
    let path_of = |field: Field| {
        let configured = match field {
            Field::Secret => secret.as_ref().map(|c| c.path.clone()),
            Field::AesKey => aes_key.as_ref().map(|c| c.path.clone()),
            Field::AppId => app_id.as_ref().map(|c| c.path.clone()),
            Field::RequireEncryption => require_encryption.as_ref().map(|c| c.path.clone()),
        };
        configured.unwrap_or_else(|| {
            s.path_of(match field {
                Field::Secret => "secret",
                Field::AesKey => "aes_key",
                Field::AppId => "app_id",
                Field::RequireEncryption => "require_encryption",
            })
        })
    };
    let creds = Credentials {
        secret: secret.as_ref().map(|c| c.value.clone()),
        aes_key: aes_key.as_ref().map(|c| c.value.clone()),
        app_id: app_id.as_ref().map(|c| c.value.clone()),
        require_encryption: require_encryption.as_ref().is_some_and(|c| c.value),
    };
    match Sender::new(preset, creds) {
        Ok(mut sender) => {
            sender.filled = PRESET_FILLS.into_iter().filter(|name| !own.sets(name)).collect();
            Some(sender)
        }
        Err(all) => {
            for p in all {
                problems.push(path_of(p.field), p.problem);
            }
            None
        }
    }
}

fn positive(s: &mut Section, key: &'static str, problems: &mut Problems) -> Option<Duration> {
    let d = s.duration(key, problems)?;
    if d.is_zero() {
        problems.push(s.path_of(key), "must be greater than 0");
        return None;
    }
    Some(d)
}

fn key_spec(s: &mut Section, problems: &mut Problems) -> Option<KeySpec> {
    let entries = s.strings("key", problems)?;
    if entries.is_empty() {
        problems.push(s.path_of("key"), "needs at least one source");
        return None;
    }
    let mut alternatives = Vec::with_capacity(entries.len());
    let mut all_valid = true;
    for (path, text) in entries {
        match Alternative::parse(text) {
            Ok(alt) => alternatives.push(alt),
            Err(why) => {
                problems.push(path, why);
                all_valid = false;
            }
        }
    }
    all_valid.then(|| KeySpec::new(alternatives))
}

/// Builds every route, checking names and paths are unique and TTLs are consistent.
pub(super) fn build_routes(
    sections: Vec<Section>,
    defaults: &Settings,
    store: Option<&StoreConfig>,
    problems: &mut Problems,
) -> Vec<RouteConfig> {
    let mut routes: Vec<RouteConfig> = Vec::with_capacity(sections.len());
    for mut s in sections {
        let name = s.string("name", problems);
        let path = s.string("path", problems);
        let upstream = s.string("upstream", problems);
        let own = Settings::read(&mut s, problems);
        for (key, set) in [
            ("name", name.is_some()),
            ("path", path.is_some()),
            ("upstream", upstream.is_some()),
        ] {
            if !set && !s.has(key) {
                problems.push(s.path_of(key), "required");
            }
        }
        let name = name.and_then(|n| checked(&s, "name", valid_name(n).map(|()| n.to_owned()), problems));
        if let Some(n) = &name
            && routes.iter().any(|r| &r.name == n)
        {
            problems.push(s.path_of("name"), format!("route name {n:?} is used twice"));
        }
        let path = path.and_then(|p| checked(&s, "path", PathPattern::parse(p), problems));
        if let Some(p) = &path
            && routes.iter().any(|r| &r.path == p)
        {
            problems.push(s.path_of("path"), format!("path {p} is used by another route"));
        }
        let upstream = upstream.and_then(|u| checked(&s, "upstream", Target::parse(u), problems));
        let preset = own.preset.or(defaults.preset);
        let filled = preset.map(Settings::from_preset).unwrap_or_default();
        let key = own
            .key
            .clone()
            .or_else(|| filled.key.clone())
            .or_else(|| defaults.key.clone());
        if key.is_none() && !s.has("key") {
            problems.push(s.path_of("key"), "required (here, under [defaults], or from a preset)");
        }
        let sender = sender(&s, preset, &own, defaults, problems);
        let policy = merge(&own, &filled, defaults);
        if let Some(store) = store {
            check_ttls(&s, &policy, store.timeout, problems);
            check_delivery(&s, &policy, store, problems);
        }
        if policy.delivery == Delivery::Sync && own.queue.sets_queue_settings() {
            problems.warn(
                s.path_of("delivery"),
                "sync: retry_schedule, delivery_concurrency and max_queued are ignored",
            );
        }
        if let (Delivery::Queued(_), Some(sender)) = (&policy.delivery, &sender) {
            for warning in senders::queued_warnings(sender) {
                problems.warn(s.path_of("delivery"), warning);
            }
        }
        s.finish(problems);
        if let (Some(name), Some(path), Some(upstream), Some(key)) = (name, path, upstream, key) {
            routes.push(RouteConfig {
                name,
                path,
                upstream,
                key,
                policy,
                sender,
            });
        }
    }
    routes
}

/// A route's own settings over its preset's over `[defaults]` over the built-in defaults.
fn merge(own: &Settings, preset: &Settings, defaults: &Settings) -> RoutePolicy {
    macro_rules! pick {
        ($field:ident, $default:expr) => {
            own.$field
                .clone()
                .or_else(|| preset.$field.clone())
                .or_else(|| defaults.$field.clone())
                .unwrap_or($default)
        };
    }
    RoutePolicy {
        upstream_timeout: pick!(upstream_timeout, Duration::from_secs(25)),
        processing_ttl: pick!(processing_ttl, Duration::from_secs(30)),
        completed_ttl: pick!(completed_ttl, Duration::from_secs(24 * 3600)),
        on_in_flight: pick!(on_in_flight, InFlight::Wait),
        in_flight_wait: pick!(in_flight_wait, Duration::from_secs(4)),
        on_upstream_timeout: pick!(on_upstream_timeout, OnUpstreamTimeout::Release),
        mode: pick!(mode, Mode::Enforce),
        on_missing_key: pick!(on_missing_key, OnMissingKey::Forward),
        replay: pick!(replay, false),
        duplicate: DuplicateAnswer {
            status: pick!(duplicate_status, StatusCode::OK),
            body: Bytes::from(pick!(duplicate_body, "success".to_owned())),
            content_type: pick!(
                duplicate_content_type,
                HeaderValue::from_static("text/plain; charset=utf-8")
            ),
        },
        delivery: QueueSettings::merge(&own.queue, &defaults.queue),
    }
}

/// A queued route needs a durable store (the queue is in it) that is the queue's
/// only road: what cannot be stored is refused, never forwarded past the queue.
fn check_delivery(s: &Section, r: &RoutePolicy, store: &StoreConfig, problems: &mut Problems) {
    if r.delivery == Delivery::Sync {
        return;
    }
    if matches!(store.backend, Backend::Memory { .. }) {
        problems.push(
            s.path_of("delivery"),
            "\"queued\" needs a durable store for its queue: set store.backend = \"sqlite\" (one instance, \
             path = \"...\") or \"redis\" (shared by replicas)",
        );
    }
    if store.on_error == OnStoreError::Forward {
        problems.push(
            s.path_of("delivery"),
            "\"queued\" with store.on_error = \"forward\": on a queued route the store is the queue, so a \
             message it cannot store is refused (503), never forwarded; set on_error = \"reject\"",
        );
    }
    if r.replay {
        problems.push(
            s.path_of("replay"),
            "not with delivery = \"queued\": the sender is answered before the bot is asked",
        );
    }
    if r.mode == Mode::Shadow {
        problems.push(
            s.path_of("mode"),
            "\"shadow\" forwards every request as it comes; with delivery = \"queued\" it would queue nothing: \
             try the route in shadow mode with delivery = \"sync\" first",
        );
    }
}

/// The shortest `processing_ttl` that is safe: a PROCESSING marker must outlive the
/// longest an owner can hold it, a claim and its re-read (the first reply lost), the
/// upstream call, then a complete and its retry.
pub fn processing_ttl_floor(upstream_timeout: Duration, store_timeout: Duration) -> Duration {
    upstream_timeout + 4 * store_timeout
}

fn check_ttls(s: &Section, r: &RoutePolicy, store_timeout: Duration, problems: &mut Problems) {
    if let Some(problem) = ttl_problem(r, store_timeout) {
        problems.push(s.path_of("processing_ttl"), problem);
    }
}

/// Why `r.processing_ttl` is too short with this store timeout, if it is.
fn ttl_problem(r: &RoutePolicy, store_timeout: Duration) -> Option<String> {
    let floor = processing_ttl_floor(r.upstream_timeout, store_timeout);
    (r.processing_ttl <= floor).then(|| {
        format!(
            "{} must exceed upstream_timeout ({}) + 4 x store.timeout ({}) = {}",
            humantime::format_duration(r.processing_ttl),
            humantime::format_duration(r.upstream_timeout),
            humantime::format_duration(store_timeout),
            humantime::format_duration(floor),
        )
    })
}

/// The routes' `processing_ttl` problems with another store timeout than their file's:
/// a reload keeps the running `[store]`, so the new routes must be safe with it.
pub fn ttl_problems(routes: &[RouteConfig], store_timeout: Duration) -> Vec<String> {
    let problems = routes.iter().enumerate().filter_map(|(i, route)| {
        let problem = ttl_problem(&route.policy, store_timeout)?;
        Some(format!(
            "routes[{i}].processing_ttl: {problem} (the running one: [store] changes need a restart)"
        ))
    });
    problems.collect()
}

fn checked<T>(s: &Section, key: &str, parsed: Result<T, String>, problems: &mut Problems) -> Option<T> {
    parsed.map_err(|why| problems.push(s.path_of(key), why)).ok()
}

/// Route names appear in keys, metric labels and logs: keep them plain.
fn valid_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(format!("{name:?}: use 1-64 letters, digits, '_', '-' or '.'"))
    }
}
