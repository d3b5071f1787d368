//! `rediss://` against a Redis whose certificate comes from a private CA: verified
//! through `SSL_CERT_FILE`, refused without it, and certificate checks are never off
//! unless a build with the `insecure-tls` feature is told so by `store.tls_skip_verify`.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::process::GatewayProcess;
use crate::servers::{RedisServer, free_port};
use crate::support::{BIN, Cfg, Client, TempFile, Upstream, assert_contains_each, check_refuses, msg};

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("openssl (Debian package openssl)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A private CA and a server certificate it signed for 127.0.0.1.
struct Pki {
    _dir: TempFile,
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

fn private_ca() -> Pki {
    let tmp = TempFile::new("pki.marker", "");
    let dir = tmp.0.parent().expect("dir").to_path_buf();
    openssl(
        &dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=dedup test CA",
        ]
        .iter()
        .copied()
        .chain(["-keyout", "ca.key", "-out", "ca.pem"])
        .collect::<Vec<_>>(),
    );
    openssl(
        &dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
        ],
    );
    std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n").expect("write");
    openssl(
        &dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            "san.ext",
            "-out",
            "server.pem",
        ],
    );
    Pki {
        ca: dir.join("ca.pem"),
        cert: dir.join("server.pem"),
        key: dir.join("server.key"),
        _dir: tmp,
    }
}

/// A redis-server with a TLS port (and its plain port, for redis-cli).
async fn tls_redis(pki: &Pki) -> (RedisServer, u16) {
    let tls_port = free_port();
    let server = RedisServer::start_with(&[
        "--tls-port",
        &tls_port.to_string(),
        "--tls-cert-file",
        pki.cert.to_str().expect("path"),
        "--tls-key-file",
        pki.key.to_str().expect("path"),
        "--tls-ca-cert-file",
        pki.ca.to_str().expect("path"),
        "--tls-auth-clients",
        "no",
    ])
    .await;
    (server, tls_port)
}

fn tls_cfg(tls_port: u16) -> Cfg {
    Cfg::new()
        .store("backend = \"redis\"")
        .store(&format!("url = \"rediss://127.0.0.1:{tls_port}/0\""))
        // A TLS connect (handshake in a debug build) on a loaded test machine can
        // take more than the default 250 ms; these tests are about certificates.
        .store("timeout = \"1s\"")
}

#[tokio::test]
async fn rediss_verifies_a_private_ca_through_ssl_cert_file_and_refuses_without_it() {
    let pki = private_ca();
    let (server, tls_port) = tls_redis(&pki).await;
    let upstream = Upstream::ok().await;
    let toml = tls_cfg(tls_port).toml(&upstream.url());

    let ca = pki.ca.to_str().expect("path");
    let gw = GatewayProcess::start_with(&toml, &[], &[("SSL_CERT_FILE", ca)]).await;
    let client = Client::http1(gw.addr);
    assert_eq!(client.post("/hook", &msg("tls")).await.dedup(), "forwarded");
    assert_eq!(client.post("/hook", &msg("tls")).await.dedup(), "duplicate");
    assert!(
        server
            .cli(&["GET", "dedup:bot:tls"])
            .contains("\"state\":\"completed\"")
    );
    let logs = gw.logs.lock().expect("logs").join("\n");
    assert!(!logs.contains("CERTIFICATE CHECKS ARE OFF"), "{logs}");
    drop(gw);

    // Without the CA the server's certificate is not trusted: the gateway does not start.
    let config = TempFile::new("gateway.toml", &toml);
    let out = Command::new(BIN)
        .arg("--config")
        .arg(&config.0)
        .env_remove("SSL_CERT_FILE")
        .env_remove("SSL_CERT_DIR")
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.to_lowercase().contains("certificate"), "{stderr}");
}

#[test]
fn certificate_checks_are_never_skipped_by_a_url_fragment() {
    let toml = tls_cfg(6380)
        .toml("http://127.0.0.1:9")
        .replace("/0\"", "/0#insecure\"");
    assert_contains_each(
        &check_refuses(&toml),
        &["store.url: \"rediss://127.0.0.1:6380/0#insecure\": no #fragment"],
    );
}

/// The default build refuses `tls_skip_verify`, naming the key and the feature.
#[cfg(not(feature = "insecure-tls"))]
#[test]
fn the_default_build_cannot_skip_certificate_checks() {
    let toml = tls_cfg(6380).store("tls_skip_verify = true").toml("http://127.0.0.1:9");
    assert_contains_each(
        &check_refuses(&toml),
        &["store.tls_skip_verify: this build cannot skip TLS certificate checks (build with `--features insecure-tls`"],
    );
}

/// Built with `--features insecure-tls`: `tls_skip_verify` connects to an untrusted
/// server, and says so loudly at start and in `check`.
#[cfg(feature = "insecure-tls")]
#[tokio::test]
async fn tls_skip_verify_connects_without_the_ca_and_warns_loudly() {
    let pki = private_ca();
    let (_server, tls_port) = tls_redis(&pki).await;
    let upstream = Upstream::ok().await;
    let toml = tls_cfg(tls_port).store("tls_skip_verify = true").toml(&upstream.url());
    let gw = GatewayProcess::start(&toml).await;
    assert_eq!(
        Client::http1(gw.addr).post("/hook", &msg("x")).await.dedup(),
        "forwarded"
    );
    let logs = gw.logs.lock().expect("logs").join("\n");
    assert!(
        logs.contains("TLS CERTIFICATE CHECKS ARE OFF") && logs.contains("\"level\":\"WARN\""),
        "{logs}"
    );
    assert_contains_each(&crate::support::check_accepts(&toml), &["TLS CERTIFICATE CHECKS OFF"]);
}
