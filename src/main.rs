//! The `dedup-gateway` binary: command line, logging, and the three commands.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand, ValueEnum};
use dedup_gateway::admin::client::{KeyAction, QueueAction, admin_url, key_request, queue_request};
use dedup_gateway::admin::reload::Reloader;
use dedup_gateway::config::{Backend, Config, RouteConfig, processing_ttl_floor};
use dedup_gateway::key::{Input, Refused, stored_key};
use dedup_gateway::senders::{self, Failure, Verdict};
use dedup_gateway::shutdown::Stop;
use dedup_gateway::{Gateway, Listeners};
use tracing_subscriber::EnvFilter;

/// With the `jemalloc` feature (see Cargo.toml).
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(
    name = "dedup-gateway",
    version,
    about = "Makes at-least-once webhook delivery look exactly-once"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Configuration file.
    #[arg(long, global = true, env = "DEDUP_GATEWAY_CONFIG", default_value = "gateway.toml")]
    config: PathBuf,
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Log level or filter (e.g. "debug", "dedup_gateway=debug"); default info, or RUST_LOG.
    #[arg(long, global = true)]
    log_level: Option<String>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the proxy (the default).
    Serve,
    /// Validate the configuration and print the effective routes.
    Check,
    /// Print the dedup key a route derives from a request body, or why there is none.
    Key {
        #[arg(long)]
        route: String,
        /// A request header, 'Name: value' (repeatable).
        #[arg(long = "header", value_name = "'Name: value'")]
        headers: Vec<String>,
        /// The request's query string, e.g. 'a=b&c=d'.
        #[arg(long)]
        query: Option<String>,
        /// Ask a running gateway what it holds for this message id (GET /keys/ROUTE/ID).
        #[arg(long, value_name = "ID", conflicts_with_all = ["forget", "file", "headers", "query"])]
        inspect: Option<String>,
        /// Make a running gateway forget this message id, so its next delivery is
        /// forwarded again (DELETE /keys/ROUTE/ID).
        #[arg(long, value_name = "ID", conflicts_with_all = ["file", "headers", "query"])]
        forget: Option<String>,
        /// With --forget: forget it even while PROCESSING (a retry may then run alongside).
        #[arg(long, requires = "forget")]
        force: bool,
        /// The admin listener (default: server.admin_listen of --config, on loopback
        /// when it listens on every address). The bearer token, if the config sets
        /// admin_token_env, is read from that variable.
        #[arg(long, value_name = "URL")]
        admin: Option<String>,
        /// The body; '-' or absent reads standard input.
        file: Option<PathBuf>,
    },
    /// Queued delivery: what waits, what died; retry or drop dead letters (asks a
    /// running gateway's admin listener).
    Queue {
        #[command(subcommand)]
        action: QueueCommand,
        /// The admin listener (default: server.admin_listen of --config, on loopback
        /// when it listens on every address). The bearer token, if the config sets
        /// admin_token_env, is read from that variable.
        #[arg(long, value_name = "URL", global = true)]
        admin: Option<String>,
    },
}

#[derive(Subcommand)]
enum QueueCommand {
    /// Per queued route: ready, scheduled, delivering, dead, age of the oldest.
    Status,
    /// A route's dead letters, the oldest first.
    Dead {
        route: String,
        /// At most this many (default 100).
        #[arg(long)]
        limit: Option<usize>,
    },
    /// Puts dead letters back in the queue (attempts reset): one by id, or --all.
    Retry {
        route: String,
        /// The message id (as listed by `queue dead`, or as the route's key yields it).
        #[arg(required_unless_present = "all")]
        id: Option<String>,
        #[arg(long, conflicts_with = "id")]
        all: bool,
    },
    /// Drops a dead letter for good; its marker is released.
    Drop { route: String, id: String },
}

impl From<QueueCommand> for QueueAction {
    fn from(command: QueueCommand) -> Self {
        match command {
            QueueCommand::Status => QueueAction::Status,
            QueueCommand::Dead { route, limit } => QueueAction::Dead { route, limit },
            QueueCommand::Retry { route, id, .. } => QueueAction::Retry { route, id },
            QueueCommand::Drop { route, id } => QueueAction::Drop { route, id },
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format, cli.log_level.as_deref());
    let command = cli.command.unwrap_or(Command::Serve);
    // A collector reading `serve`'s JSON lines gets the reason it did not start as
    // one of them; `check` and `key` answer a person in text.
    let json_errors = matches!(command, Command::Serve) && matches!(cli.log_format, LogFormat::Json);
    let result = match command {
        Command::Serve => serve(&cli.config),
        Command::Check => check(&cli.config),
        Command::Queue { action, admin } => ask_admin(&cli.config, admin, |url, token| async move {
            queue_request(&url, &QueueAction::from(action), token.as_deref()).await
        }),
        Command::Key {
            route,
            inspect: Some(id),
            admin,
            ..
        } => admin_key(&cli.config, &route, &id, KeyAction::Inspect, admin),
        Command::Key {
            route,
            forget: Some(id),
            force,
            admin,
            ..
        } => admin_key(&cli.config, &route, &id, KeyAction::Forget { force }, admin),
        Command::Key {
            route,
            headers,
            query,
            file,
            ..
        } => key(&cli.config, &route, &headers, query.as_deref(), file.as_deref()),
    };
    match result {
        Ok(code) => code,
        Err(e) if json_errors => {
            tracing::error!(error = format!("{e:#}"), "cannot start");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(format: LogFormat, level: Option<&str>) {
    let spec = match level {
        Some(level) => level.to_owned(),
        None => std::env::var(EnvFilter::DEFAULT_ENV).unwrap_or_else(|_| "info".to_owned()),
    };
    // redis-rs warns of every failed attempt to reach a cluster node (thousands of
    // lines while one is down); the gateway logs each store failure itself, once,
    // with route and key. A filter that names `redis` decides for itself.
    let spec = if spec.contains("redis") {
        spec
    } else {
        format!("{spec},redis=error")
    };
    let filter = EnvFilter::try_new(&spec).unwrap_or_else(|_| EnvFilter::new("info,redis=error"));
    // Colours only for a terminal: a log file or collector gets plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.with_target(false).init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

fn load(path: &Path) -> anyhow::Result<Config> {
    Ok(Config::load(path)?)
}

fn serve(path: &Path) -> anyhow::Result<ExitCode> {
    let config = load(path)?;
    for warning in &config.warnings {
        tracing::warn!("config: {warning}");
    }
    raise_open_file_limit();
    for route in &config.routes {
        if let Some(sender) = &route.sender {
            for warning in senders::warnings(sender, route.policy.completed_ttl) {
                tracing::warn!(route = %route.name, "{warning}");
            }
        }
    }
    // The coordinator: the admin listener, store checks and the drain. The proxy runs on
    // worker threads of its own (`server::run`).
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let stop = Stop::listen().context("cannot listen for SIGTERM/SIGINT")?;
        if let Backend::Redis { target, .. } = &config.store.backend
            && target.skips_tls_verification()
        {
            tracing::warn!(
                store = %target,
                "store.tls_skip_verify = true: TLS CERTIFICATE CHECKS ARE OFF for the store; anyone on the \
                 network path can read and forge markers. For tests only."
            );
        }
        let store = dedup_gateway::store::connect(&config.store).await.context("store")?;
        let listeners = Listeners::bind(&config.server).await?;
        let gw = Gateway::new(&config, store);
        let reloader = Arc::new(Reloader::new(path.to_path_buf(), config.clone()));
        Arc::clone(&reloader).reload_on_sighup(Arc::clone(&gw));
        // `run` logs "dedup-gateway serving" once every worker is up.
        let server = config.server.clone();
        dedup_gateway::run(gw, server, listeners, Some(reloader), stop.signalled()).await;
        Ok(ExitCode::SUCCESS)
    })
}

/// Every connection holds a descriptor on each side (sender, upstream), and the soft
/// limit is often 1,024 (systemd, Docker) where the hard one allows far more: out of
/// descriptors, accepts fail, the admin port's probes included. So, as Go's runtime
/// does, the soft limit is raised to the hard one.
fn raise_open_file_limit() {
    let before = rlimit::Resource::NOFILE.get().ok().map(|(soft, _)| soft);
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(now) if before.is_some_and(|before| now > before) => {
            tracing::info!(from = before, to = now, "open-file limit raised to the hard limit");
        }
        Ok(_) => {}
        Err(error) => tracing::warn!(%error, soft = before, "cannot raise the open-file limit"),
    }
}

/// `println!` into a `String` (which cannot fail), printed whole by [`print_all`].
macro_rules! say {
    ($out:expr, $($arg:tt)*) => {{
        use std::fmt::Write as _;
        let _ = writeln!($out, $($arg)*);
    }};
}

/// Writes `text` to stdout. A reader that has gone (`check | head -1`) ends the
/// output; `println!` would panic there.
fn print_all(text: &str) {
    use std::io::Write as _;
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}

fn check(path: &Path) -> anyhow::Result<ExitCode> {
    let config = load(path)?;
    let mut out = String::new();
    let s = &config.server;
    let d = |d: std::time::Duration| humantime::format_duration(d).to_string();
    say!(out, "{}: OK", path.display());
    for warning in &config.warnings {
        say!(out, "warning: {warning}");
    }
    say!(
        out,
        "server: listen {}, admin {}, max_body {} bytes, header_timeout {}, shutdown_delay {}, shutdown_grace {}",
        s.listen,
        s.admin_listen.map_or("off".to_owned(), |a| a.to_string()),
        s.max_body,
        d(s.header_timeout),
        d(s.shutdown_delay),
        d(s.shutdown_grace),
    );
    if let Some(files) = &s.tls {
        // The config's check read the pair already; this says when it expires.
        let expires = dedup_gateway::tls::load(files).map_or_else(
            |e| format!("cannot be read now: {e}"),
            |pair| format!("valid for {} more day(s)", pair.valid_for().as_secs() / 86_400),
        );
        say!(
            out,
            "  https: tls_cert {} ({expires}), tls_key {}; HTTP/2 and HTTP/1.1 by ALPN",
            files.cert.display(),
            files.key.display()
        );
    }
    let trusted: Vec<String> = s.trusted_proxies.iter().map(ToString::to_string).collect();
    say!(
        out,
        "  trusted_proxies [{}], admin token {}",
        trusted.join(", "),
        if s.admin_token.is_some() {
            "required for POST /reload and DELETE /keys"
        } else {
            "off"
        }
    );
    let st = &config.store;
    let backend = match &st.backend {
        Backend::Memory { max_entries, max_bytes } => {
            format!("memory (max_entries {max_entries}, max_bytes {max_bytes})")
        }
        Backend::Sqlite { path, fsync, max_bytes } => {
            format!(
                "sqlite {} (fsync {}, max_bytes {max_bytes})",
                path.display(),
                name_of(*fsync)
            )
        }
        Backend::Redis {
            target,
            pool_size,
            wait_replicas,
        } => {
            let tls = if target.skips_tls_verification() {
                ", TLS CERTIFICATE CHECKS OFF (tls_skip_verify)"
            } else {
                ""
            };
            format!("redis {target} (pool_size {pool_size}, wait_replicas {wait_replicas}){tls}")
        }
    };
    say!(
        out,
        "store: {backend}, timeout {}, key_prefix {:?}, on_error {}",
        d(st.timeout),
        st.key_prefix,
        name_of(st.on_error)
    );
    if let Backend::Redis { target, .. } = &st.backend
        && config.routes.iter().any(|r| r.policy.delivery.queue().is_some())
    {
        // The queue lives in this Redis: say if it may lose what it holds.
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        for warning in runtime.block_on(dedup_gateway::store::redis::durability(target, st.timeout)) {
            say!(out, "warning: store: {warning}");
        }
    }
    for route in &config.routes {
        print_route(&mut out, route, st.timeout);
    }
    print_all(&out);
    Ok(ExitCode::SUCCESS)
}

fn name_of<T: dedup_gateway::config::read::Choice + PartialEq>(value: T) -> &'static str {
    T::NAMES.iter().find(|(_, v)| *v == value).map_or("?", |(n, _)| n)
}

fn print_route(out: &mut String, r: &RouteConfig, store_timeout: std::time::Duration) {
    let p = &r.policy;
    let d = |d: std::time::Duration| humantime::format_duration(d).to_string();
    let keys: Vec<&str> = r.key.alternatives().iter().map(|a| a.text()).collect();
    say!(out, "route {:?}: {} -> {}", r.name, r.path, r.upstream);
    say!(out, "  key = [{}]", keys.join(", "));
    say!(
        out,
        "  upstream_timeout {}, processing_ttl {} (> {} = upstream_timeout + 4 x store.timeout), completed_ttl {}",
        d(p.upstream_timeout),
        d(p.processing_ttl),
        d(processing_ttl_floor(p.upstream_timeout, store_timeout)),
        d(p.completed_ttl)
    );
    say!(
        out,
        "  on_in_flight {} (in_flight_wait {}), on_upstream_timeout {}, mode {}, on_missing_key {}, replay {}",
        name_of(p.on_in_flight),
        d(p.in_flight_wait),
        name_of(p.on_upstream_timeout),
        name_of(p.mode),
        name_of(p.on_missing_key),
        p.replay
    );
    match p.delivery.queue() {
        None => say!(out, "  delivery sync"),
        Some(q) => {
            let waits: Vec<String> = q.retry_schedule.iter().map(|w| d(*w)).collect();
            say!(
                out,
                "  delivery queued: retry_schedule [{}], delivery_concurrency {}, max_queued {}",
                waits.join(", "),
                q.concurrency,
                q.max_queued
            );
        }
    }
    say!(
        out,
        "  duplicate answer: {} {:?} ({})",
        p.duplicate.status.as_u16(),
        String::from_utf8_lossy(&p.duplicate.body),
        p.duplicate.content_type.to_str().unwrap_or("?")
    );
    if let Some(s) = &r.sender {
        let set = |set: bool| if set { "set" } else { "not set" };
        let filled = if s.filled.is_empty() {
            "nothing".to_owned()
        } else {
            s.filled.join(", ")
        };
        say!(out, "  preset {} (filled in: {filled})", s.preset.name);
        say!(
            out,
            "  signature: {}; secret {}, aes_key {}, app_id {}",
            s.preset.scheme.describe(),
            set(s.has_secret),
            set(s.has_aes_key),
            set(s.has_app_id)
        );
        if let Some(modes) = s.modes() {
            say!(out, "  accepts: {modes}");
        }
        for warning in senders::warnings(s, p.completed_ttl) {
            say!(out, "  warning: {warning}");
        }
    }
}

/// `key --inspect ID` / `key --forget ID`: asks the running gateway's admin listener.
fn admin_key(path: &Path, route: &str, id: &str, action: KeyAction, admin: Option<String>) -> anyhow::Result<ExitCode> {
    ask_admin(path, admin, |url, token| async move {
        key_request(&url, route, id, action, token.as_deref()).await
    })
}

/// Sends one request to the admin listener (`admin`, else the config's) with the
/// config's admin token, and prints the answer (JSON pretty-printed); fails unless 2xx.
fn ask_admin<F, Fut>(path: &Path, admin: Option<String>, ask: F) -> anyhow::Result<ExitCode>
where
    F: FnOnce(String, Option<String>) -> Fut,
    Fut: Future<Output = Result<(http::StatusCode, String), dedup_gateway::admin::client::ClientError>>,
{
    let config = load(path)?;
    let admin = match admin {
        Some(url) => url,
        None => match config.server.admin_listen {
            Some(addr) => admin_url(addr),
            None => bail!("{}: no server.admin_listen; pass --admin URL", path.display()),
        },
    };
    let token = config.server.admin_token.as_ref().map(|t| t.expose().to_owned());
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let (status, body) = runtime.block_on(ask(admin.clone(), token))?;
    match serde_json::from_str::<serde_json::Value>(&body) {
        Ok(json) => println!("{}", serde_json::to_string_pretty(&json)?),
        Err(_) => print!("{body}"),
    }
    if status.is_success() {
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("{admin}: {status}");
        Ok(ExitCode::FAILURE)
    }
}

fn key(
    path: &Path,
    route_name: &str,
    headers: &[String],
    query: Option<&str>,
    file: Option<&Path>,
) -> anyhow::Result<ExitCode> {
    let config = load(path)?;
    let Some(route) = config.routes.iter().find(|r| r.name == route_name) else {
        let names: Vec<&str> = config.routes.iter().map(|r| r.name.as_str()).collect();
        bail!("no route named {route_name:?} (routes: {})", names.join(", "));
    };
    let mut body = Vec::new();
    match file {
        Some(f) if f != Path::new("-") => {
            body = std::fs::read(f).with_context(|| format!("cannot read {}", f.display()))?;
        }
        _ => {
            std::io::stdin()
                .read_to_end(&mut body)
                .context("cannot read standard input")?;
        }
    }
    let path_part = route.path.to_string().trim_end_matches('*').to_owned();
    let uri = match query {
        Some(q) => format!("{path_part}?{}", q.trim_start_matches('?')),
        None => path_part,
    };
    let mut request = http::Request::post(uri);
    for header in headers {
        let (name, value) = header
            .split_once(':')
            .with_context(|| format!("--header {header:?}: expected 'Name: value'"))?;
        request = request.header(name.trim(), value.trim());
    }
    let head = request.body(()).context("invalid --header or --query")?.into_parts().0;
    let verdict = match &route.sender {
        None => Verdict::Plain,
        Some(sender) => {
            if let Some(mode) = sender.mode_of(&head) {
                eprintln!("sent in {mode}");
            }
            let now_ms = dedup_gateway::store::unix_ms();
            match sender.inspect(&head, &body, now_ms) {
                Ok(verdict) if sender.is_verified() => {
                    eprintln!("signature ok ({})", sender.preset.name);
                    verdict
                }
                Ok(verdict) => {
                    let why = match sender.preset.scheme {
                        senders::Scheme::None => "the sender signs nothing",
                        _ => "the route has no secret",
                    };
                    eprintln!("signature not checked ({}: {why})", sender.preset.name);
                    verdict
                }
                Err(Failure::Rejected(why)) => {
                    eprintln!("signature bad: {why} (the gateway answers 401)");
                    return Ok(ExitCode::FAILURE);
                }
                Err(Failure::Refused(why)) => {
                    eprintln!("refused: {why} (the gateway answers 400)");
                    return Ok(ExitCode::FAILURE);
                }
            }
        }
    };
    if verdict == Verdict::Handshake {
        eprintln!("handshake: forwarded to the upstream without a key");
        return Ok(ExitCode::SUCCESS);
    }
    if let Verdict::Decrypted(plain) = &verdict {
        eprintln!(
            "decrypted: {} bytes; keys read from the plaintext",
            plain.as_bytes().len()
        );
    }
    let (found, misses) = route.key.explain(Input {
        head: &head,
        body: verdict.key_body(&body),
    });
    for miss in &misses {
        eprintln!("  {miss}");
    }
    match found {
        Ok(Some((source, value))) => {
            eprintln!("from {source}");
            println!("{}", stored_key(&config.store.key_prefix, &route.name, &value));
            Ok(ExitCode::SUCCESS)
        }
        Err(Refused) => {
            eprintln!("refused: the body must not be parsed (the gateway answers 400)");
            Ok(ExitCode::FAILURE)
        }
        Ok(None) => {
            eprintln!(
                "no key: no source yielded a value (on_missing_key = {})",
                name_of(route.policy.on_missing_key)
            );
            Ok(ExitCode::FAILURE)
        }
    }
}
