//! Configuration: `gateway.toml` read into validated types holding parsed addresses,
//! matchers and policies. Every problem is reported with its key path, all at once.
//!
//! Precedence per route setting: the route's own value, then `[defaults]`, then the
//! built-in default (README: Configuration). One file per section: `server.rs`,
//! `store.rs`, `route.rs` (and `[defaults]`), with the typed reads they share in
//! [`read`].

pub mod cidr;
pub mod policy;
pub mod queue;
pub mod read;
mod route;
mod server;
mod store;
mod target;

use std::path::Path;

use read::{Problems, Section};
pub use route::{DuplicateAnswer, PathPattern, RouteConfig, RoutePolicy, processing_ttl_floor, ttl_problems};
pub use server::ServerConfig;
pub use store::{Backend, DEFAULT_POOL_SIZE, Fsync, RedisTarget, StoreConfig};
pub use target::Target;

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
        let server = server::parse(root.section("server", &mut problems), &mut problems);
        let store = store::parse(root.section("store", &mut problems), &mut problems);
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
