//! `[server]`: the listeners, the bounds on slow and idle clients, the drain.

use std::net::SocketAddr;
use std::time::Duration;

use super::cidr;
use super::read::{self, Problems, Section};
use crate::secret::Secret;
use crate::tls::{self, File, TlsFiles};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerConfig {
    /// Proxy listener: HTTP/1.1 and h2c, or with `tls`, HTTPS (HTTP/1.1 and HTTP/2).
    pub listen: SocketAddr,
    /// `tls_cert` and `tls_key`: the listener speaks HTTPS with this pair (checked
    /// when the config is read; new files are picked up without a restart).
    pub tls: Option<TlsFiles>,
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
    pub admin_token: Option<Secret>,
}

pub(super) fn parse(section: Option<Section>, problems: &mut Problems) -> Option<ServerConfig> {
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
        admin_token: read::from_env(&mut s, "admin_token_env", problems).map(|(_, token)| token),
        tls: tls_files(&mut s, problems),
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

/// `tls_cert` and `tls_key`, both or neither; the pair must be usable now (it is read
/// here, so `check` and a reload refuse what the listener could not serve), and one
/// that expires within 14 days is warned about.
fn tls_files(s: &mut Section, problems: &mut Problems) -> Option<TlsFiles> {
    let cert = s.string("tls_cert", problems).map(std::path::PathBuf::from);
    let key = s.string("tls_key", problems).map(std::path::PathBuf::from);
    let files = match (cert, key) {
        (None, None) => return None,
        (Some(cert), Some(key)) => TlsFiles { cert, key },
        (Some(_), None) => {
            problems.push(
                s.path_of("tls_key"),
                "required with tls_cert (the certificate's private key, PEM)",
            );
            return None;
        }
        (None, Some(_)) => {
            problems.push(
                s.path_of("tls_cert"),
                "required with tls_key (the certificate chain, PEM)",
            );
            return None;
        }
    };
    match tls::load(&files) {
        Ok(pair) if pair.valid_for() < tls::EXPIRY_WARNING => {
            let days = pair.valid_for().as_secs() / 86_400;
            problems.warn(
                s.path_of("tls_cert"),
                format!(
                    "the certificate expires in {days} day(s): renew it (the gateway takes new files without a restart)"
                ),
            );
        }
        Ok(_) => {}
        Err(error) => {
            let key = match error.file() {
                File::Certificate => "tls_cert",
                File::Key => "tls_key",
            };
            problems.push(s.path_of(key), error.to_string());
        }
    }
    Some(files)
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
