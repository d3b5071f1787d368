//! HTTPS on the proxy listener (`[server] tls_cert`, `tls_key`): curl over HTTP/1.1 and
//! HTTP/2 with the CA as a client has it; a pair swapped on disk (as a Kubernetes Secret
//! volume swaps it) served to new connections within seconds while an open connection
//! goes on; bad pairs refused by `check` and on reload; plain HTTP refused by a closed
//! connection.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tokio_rustls::rustls;

use crate::pki::{Ca, ServerPair};
use crate::support::{
    Cfg, Client, TempFile, TestGateway, Upstream, assert_contains_each, check_accepts, check_refuses, eventually, msg,
};

/// A folder laid out as a Kubernetes Secret volume: `tls.crt` and `tls.key` are
/// symlinks into `..data`, itself a symlink to a timestamped folder; an update writes a
/// new folder and swaps `..data` in one rename.
struct SecretVolume {
    _tmp: TempFile,
    dir: PathBuf,
    generation: u32,
}

impl SecretVolume {
    fn new(pair: &ServerPair) -> Self {
        let tmp = TempFile::new("volume.marker", "");
        let dir = tmp.0.parent().expect("dir").to_path_buf();
        let mut volume = SecretVolume {
            _tmp: tmp,
            dir,
            generation: 0,
        };
        volume.update(pair);
        for name in ["tls.crt", "tls.key"] {
            std::os::unix::fs::symlink(format!("..data/{name}"), volume.dir.join(name)).expect("symlink");
        }
        volume
    }

    fn update(&mut self, pair: &ServerPair) {
        self.generation += 1;
        let generation = format!("..2026_12_07_{}", self.generation);
        std::fs::create_dir(self.dir.join(&generation)).expect("generation dir");
        pair.write(&self.dir.join(&generation));
        let staged = self.dir.join("..data_tmp");
        std::os::unix::fs::symlink(&generation, &staged).expect("symlink");
        std::fs::rename(&staged, self.dir.join("..data")).expect("swap ..data");
    }

    fn cert(&self) -> PathBuf {
        self.dir.join("tls.crt")
    }

    fn key(&self) -> PathBuf {
        self.dir.join("tls.key")
    }
}

fn https_cfg(cert: &Path, key: &Path) -> Cfg {
    Cfg::new()
        .server(&format!("tls_cert = \"{}\"", cert.display()))
        .server(&format!("tls_key = \"{}\"", key.display()))
}

/// `curl --cacert` to the gateway: the status line's version, status and body.
fn curl(ca: &Path, url: &str, http: &str, body: &str) -> (String, u16, String) {
    let out = Command::new("curl")
        .args(["-sS", "--cacert"])
        .arg(ca)
        .args([
            http,
            "-X",
            "POST",
            "--data-binary",
            body,
            "-w",
            "\n%{http_version} %{http_code}",
            url,
        ])
        .output()
        .expect("curl (Debian package curl)");
    assert!(out.status.success(), "curl: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (answer, status) = text.rsplit_once('\n').expect("the -w line");
    let (version, code) = status.split_once(' ').expect("version and status");
    (version.to_owned(), code.parse().expect("status"), answer.to_owned())
}

fn ca_file(ca: &Ca) -> TempFile {
    TempFile::new("ca.pem", &ca.pem())
}

#[tokio::test]
async fn curl_speaks_http1_and_http2_to_the_gateway_over_tls() {
    let ca = Ca::new();
    let pair = ca.server((-1, 30));
    let files = TempFile::new("pair.marker", "");
    let (cert, key) = pair.write(files.0.parent().expect("dir"));
    let upstream = Upstream::ok().await;
    let gw = TestGateway::start(&https_cfg(&cert, &key), &upstream).await;
    let ca_pem = ca_file(&ca);
    let url = format!("https://127.0.0.1:{}/hook", gw.addr.port());
    let first = tokio::task::spawn_blocking({
        let (ca, url) = (ca_pem.0.clone(), url.clone());
        move || {
            [
                curl(&ca, &url, "--http1.1", &msg("tls-1")),
                curl(&ca, &url, "--http2", &msg("tls-2")),
                curl(&ca, &url, "--http2", &msg("tls-1")),
            ]
        }
    })
    .await
    .expect("curl");
    assert_eq!((first[0].0.as_str(), first[0].1), ("1.1", 200));
    assert_eq!((first[1].0.as_str(), first[1].1), ("2", 200));
    assert_eq!(
        (first[2].0.as_str(), first[2].1, first[2].2.as_str()),
        ("2", 200, "success"),
        "a duplicate"
    );
    assert_eq!(upstream.count(), 2);
    for received in upstream.received() {
        assert_eq!(received.headers["x-forwarded-proto"], "https");
    }
    let expiry = gw.metric("dedup_tls_certificate_expiry_seconds");
    let in_30_days = time::OffsetDateTime::now_utc() + time::Duration::days(30);
    assert!((expiry - in_30_days.unix_timestamp() as f64).abs() < 120.0, "{expiry}");
}

/// A TLS connection to the gateway that trusts `ca`.
async fn connect(ca: &Ca, port: u16) -> TlsStream<TcpStream> {
    let mut roots = rustls::RootCertStore::empty();
    let der = rustls::pki_types::CertificateDer::from(pem_der(&ca.pem()));
    roots.add(der).expect("root");
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.expect("connect");
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name");
    TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("handshake")
}

fn pem_der(pem: &str) -> Vec<u8> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::from_pem_slice(pem.as_bytes())
        .expect("pem")
        .to_vec()
}

/// The certificate a connection was served.
fn served(stream: &TlsStream<TcpStream>) -> Vec<u8> {
    stream.get_ref().1.peer_certificates().expect("certificates")[0].to_vec()
}

/// One HTTP/1.1 request on a kept-alive TLS connection: the status.
async fn post(stream: &mut TlsStream<TcpStream>, body: &str) -> u16 {
    let request = format!(
        "POST /hook HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(stream.read(&mut byte).await.expect("read"), 1, "the connection closed");
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let length: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().to_owned())
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut rest = vec![0u8; length];
    stream.read_exact(&mut rest).await.expect("body");
    head.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("status")
}

#[tokio::test]
async fn a_pair_swapped_on_disk_is_served_to_new_connections_and_open_ones_go_on() {
    let ca = Ca::new();
    let (old, new) = (ca.server((-1, 30)), ca.server((-1, 60)));
    let mut volume = SecretVolume::new(&old);
    let upstream = Upstream::ok().await;
    let gw = TestGateway::start(&https_cfg(&volume.cert(), &volume.key()), &upstream).await;
    let port = gw.addr.port();
    let mut open = connect(&ca, port).await;
    assert_eq!(served(&open), old.der);
    assert_eq!(post(&mut open, &msg("before")).await, 200);

    volume.update(&new);
    let swapped = std::time::Instant::now();
    loop {
        let probe = connect(&ca, port).await;
        if served(&probe) == new.der {
            break;
        }
        assert!(swapped.elapsed() < Duration::from_secs(10), "the new pair within 10 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The connection opened before goes on, on the pair it began with.
    assert_eq!(post(&mut open, &msg("after")).await, 200);
    assert_eq!(served(&open), old.der);
    assert_eq!(upstream.count(), 2);
    let in_60_days = (time::OffsetDateTime::now_utc() + time::Duration::days(60)).unix_timestamp() as f64;
    eventually("the expiry metric to follow", || {
        (gw.metric("dedup_tls_certificate_expiry_seconds") - in_60_days).abs() < 120.0
    })
    .await;
}

/// A pair that cannot be served (a key from another certificate) put on disk is not
/// taken: new connections keep the old pair, and `POST /reload` says why and changes
/// nothing.
#[tokio::test]
async fn a_bad_pair_on_disk_is_refused_and_the_old_one_stays() {
    let ca = Ca::new();
    let old = ca.server((-1, 30));
    let mut volume = SecretVolume::new(&old);
    let toml = https_cfg(&volume.cert(), &volume.key())
        .server("admin_listen = \"127.0.0.1:0\"")
        .toml("http://127.0.0.1:9");
    let gw = crate::process::GatewayProcess::start(&toml).await;
    let port = gw.addr.port();
    let other = ca.server((-1, 30));
    let mismatched = ServerPair {
        cert: other.cert.clone(),
        key: old.key.clone(),
        der: other.der.clone(),
    };
    volume.update(&mismatched);
    eventually("the refusal to be logged", || {
        gw.logs
            .lock()
            .expect("logs")
            .iter()
            .any(|l| l.contains("cannot be served") && l.contains("does not match"))
    })
    .await;
    assert_eq!(served(&connect(&ca, port).await), old.der);
    let admin = Client::http1(gw.admin.expect("admin"));
    let reload = admin.send(http::Method::POST, "/reload", &[], "").await;
    assert_eq!(reload.status, 500, "{}", reload.body);
    assert!(reload.body.contains("does not match"), "{}", reload.body);
    assert!(!reload.body.contains("PRIVATE KEY"), "{}", reload.body);
    assert_eq!(served(&connect(&ca, port).await), old.der);
}

/// Plain HTTP to the HTTPS listener gets no answer: the connection is closed.
#[tokio::test]
async fn plain_http_to_the_tls_listener_is_refused_by_a_closed_connection() {
    let ca = Ca::new();
    let pair = ca.server((-1, 30));
    let files = TempFile::new("pair.marker", "");
    let (cert, key) = pair.write(files.0.parent().expect("dir"));
    let upstream = Upstream::ok().await;
    let gw = TestGateway::start(&https_cfg(&cert, &key), &upstream).await;
    let addr = gw.addr;
    let answer = tokio::task::spawn_blocking(move || {
        let mut tcp = std::net::TcpStream::connect(addr).expect("connect");
        tcp.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
        tcp.write_all(b"POST /hook HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
            .expect("write");
        let mut answer = Vec::new();
        let _ = tcp.read_to_end(&mut answer);
        answer
    })
    .await
    .expect("client");
    assert!(!answer.starts_with(b"HTTP/"), "{:?}", String::from_utf8_lossy(&answer));
    assert_eq!(upstream.count(), 0);
}

/// `check` refuses what the listener could not serve, naming the key and never printing
/// the key, and warns 14 days before the certificate expires.
#[test]
fn check_refuses_expired_mismatched_and_missing_pairs_and_warns_before_expiry() {
    let ca = Ca::new();
    let dir = TempFile::new("pairs.marker", "");
    let dir = dir.0.parent().expect("dir");
    let write = |name: &str, pair: &ServerPair| {
        let sub = dir.join(name);
        std::fs::create_dir(&sub).expect("dir");
        pair.write(&sub)
    };
    let toml = |(cert, key): &(PathBuf, PathBuf)| https_cfg(cert, key).toml("http://127.0.0.1:9");
    let expired = write("expired", &ca.server((-30, -1)));
    let out = check_refuses(&toml(&expired));
    assert_contains_each(&out, &["server.tls_cert:", "the certificate expired at"]);
    let (good, other) = (ca.server((-1, 30)), ca.server((-1, 30)));
    let mismatched = write(
        "mismatched",
        &ServerPair {
            cert: good.cert.clone(),
            key: other.key.clone(),
            der: good.der.clone(),
        },
    );
    let out = check_refuses(&toml(&mismatched));
    assert_contains_each(&out, &["server.tls_cert:", "does not match the certificate"]);
    assert!(!out.contains("PRIVATE KEY") && !out.contains(other.key.lines().nth(1).expect("key line")));
    let missing = (dir.join("none.crt"), dir.join("none.key"));
    assert_contains_each(&check_refuses(&toml(&missing)), &["server.tls_cert: cannot read"]);
    let key_only = Cfg::new()
        .server(&format!("tls_key = \"{}\"", expired.1.display()))
        .toml("http://127.0.0.1:9");
    assert_contains_each(&check_refuses(&key_only), &["server.tls_cert: required with tls_key"]);
    let soon = write("soon", &ca.server((-1, 5)));
    let out = check_accepts(&toml(&soon));
    assert_contains_each(
        &out,
        &[
            "warning: server.tls_cert: the certificate expires in ",
            "https: tls_cert",
        ],
    );
    let fine = write("fine", &ca.server((-1, 90)));
    let out = check_accepts(&toml(&fine));
    assert!(!out.contains("expires in"), "{out}");
}
