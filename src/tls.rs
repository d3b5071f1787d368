//! HTTPS on the proxy listener: the certificate and key (PEM files named by
//! `[server] tls_cert` and `tls_key`), read and checked, and served to new connections
//! from [`Certificates`], which takes a new pair when the files change (checked every
//! [`WATCH_EVERY`], and on `POST /reload`) without dropping open connections.
//!
//! A pair is usable when both files read, the key is one rustls can sign with, it
//! matches the certificate's public key, and the certificate is valid now. A pair that
//! is not is a config error at start (`check` and `serve` exit 1), and refused on a
//! reload (the old pair stays). TLS 1.2 and 1.3 (rustls with ring), ALPN `h2` and
//! `http/1.1`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use sha2::{Digest, Sha256};

/// How often the files are looked at for a new pair.
pub const WATCH_EVERY: Duration = Duration::from_secs(2);

/// How long before it expires a certificate is warned about.
pub const EXPIRY_WARNING: Duration = Duration::from_secs(14 * 24 * 3600);

/// Where the pair is read from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Why a pair cannot be served. Never holds key material.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {error}")]
    Read {
        file: File,
        path: String,
        error: std::io::Error,
    },
    #[error("{0}: no PEM certificate in it")]
    NoCertificate(String),
    #[error("{0}: not a certificate this gateway can read ({1})")]
    BadCertificate(String, String),
    #[error("{0}: no PEM private key in it (PKCS#8, PKCS#1 or SEC1)")]
    NoKey(String),
    #[error("{0}: a private key rustls cannot sign with ({1})")]
    BadKey(String, String),
    #[error("the key in {key} does not match the certificate in {cert}")]
    Mismatch { cert: String, key: String },
    #[error("{path}: the certificate expired at {at}")]
    Expired { path: String, at: String },
    #[error("{path}: the certificate is not valid before {at}")]
    NotYetValid { path: String, at: String },
}

/// One of the two files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum File {
    Certificate,
    Key,
}

impl TlsError {
    /// Which file the problem is in (for the key path a config error names).
    pub fn file(&self) -> File {
        match self {
            TlsError::Read { file, .. } => *file,
            TlsError::NoKey(_) | TlsError::BadKey(..) => File::Key,
            _ => File::Certificate,
        }
    }
}

/// A pair that can be served.
pub struct Pair {
    pub key: Arc<CertifiedKey>,
    /// When the certificate expires (Unix seconds).
    pub not_after: i64,
    /// A digest of both files as read: tells a new pair from the one served.
    digest: [u8; 32],
}

impl Pair {
    /// How long the certificate is still valid from now (zero if it is not).
    pub fn valid_for(&self) -> Duration {
        let left = self.not_after - unix_now();
        Duration::from_secs(u64::try_from(left).unwrap_or(0))
    }
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

fn read(path: &Path, file: File) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|error| TlsError::Read {
        file,
        path: path.display().to_string(),
        error,
    })
}

/// Reads and checks the pair `files` names.
pub fn load(files: &TlsFiles) -> Result<Pair, TlsError> {
    let (cert_pem, key_pem) = (read(&files.cert, File::Certificate)?, read(&files.key, File::Key)?);
    let shown = |p: &Path| p.display().to_string();
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::BadCertificate(shown(&files.cert), e.to_string()))?;
    let Some(leaf) = chain.first() else {
        return Err(TlsError::NoCertificate(shown(&files.cert)));
    };
    let (_, parsed) = x509_parser::parse_x509_certificate(leaf)
        .map_err(|e| TlsError::BadCertificate(shown(&files.cert), e.to_string()))?;
    let validity = parsed.validity();
    let (not_before, not_after) = (validity.not_before.timestamp(), validity.not_after.timestamp());
    let now = unix_now();
    if now > not_after {
        let at = validity.not_after.to_string();
        return Err(TlsError::Expired {
            path: shown(&files.cert),
            at,
        });
    }
    if now < not_before {
        let at = validity.not_before.to_string();
        return Err(TlsError::NotYetValid {
            path: shown(&files.cert),
            at,
        });
    }
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|_| TlsError::NoKey(shown(&files.key)))?;
    let signing = provider()
        .key_provider
        .load_private_key(key)
        .map_err(|e| TlsError::BadKey(shown(&files.key), e.to_string()))?;
    let certified = CertifiedKey::new(chain, signing);
    if certified.keys_match().is_err() {
        return Err(TlsError::Mismatch {
            cert: shown(&files.cert),
            key: shown(&files.key),
        });
    }
    Ok(Pair {
        key: Arc::new(certified),
        not_after,
        digest: digest(&cert_pem, &key_pem),
    })
}

fn digest(cert: &[u8], key: &[u8]) -> [u8; 32] {
    let mut sha = Sha256::new();
    sha.update(cert);
    sha.update(key);
    sha.finalize().into()
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The pair served to new connections; swapped by [`Certificates::reload`].
pub struct Certificates {
    files: TlsFiles,
    current: ArcSwap<CertifiedKey>,
    /// The served pair's digest.
    served: Mutex<[u8; 32]>,
    not_after: AtomicI64,
}

impl std::fmt::Debug for Certificates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Certificates")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

/// What a look at the files found.
#[derive(Debug, PartialEq, Eq)]
pub enum Reloaded {
    /// The files are the pair being served.
    Same,
    /// A new pair is served from now on.
    New,
}

impl Certificates {
    pub fn new(files: TlsFiles, pair: Pair) -> Self {
        Certificates {
            files,
            current: ArcSwap::new(pair.key),
            served: Mutex::new(pair.digest),
            not_after: AtomicI64::new(pair.not_after),
        }
    }

    /// When the served certificate expires (Unix seconds).
    pub fn not_after(&self) -> i64 {
        self.not_after.load(Ordering::Relaxed)
    }

    /// Reads the files again and serves their pair if it is new and usable; a pair
    /// that is not usable is refused (and the old one stays).
    pub fn reload(&self) -> Result<Reloaded, TlsError> {
        let pair = load(&self.files)?;
        let mut served = self.served.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if pair.digest == *served {
            return Ok(Reloaded::Same);
        }
        self.current.store(Arc::clone(&pair.key));
        self.not_after.store(pair.not_after, Ordering::Relaxed);
        *served = pair.digest;
        Ok(Reloaded::New)
    }

    /// Looks at the files every [`WATCH_EVERY`] for as long as the gateway runs (a
    /// Kubernetes Secret volume swaps a `..data` symlink: the contents tell). A new
    /// pair is logged; a pair that cannot be served is logged once while it stays.
    pub fn watch(self: Arc<Self>) {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(WATCH_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut refused: Option<String> = None;
            loop {
                tick.tick().await;
                let certificates = Arc::clone(&self);
                let looked = tokio::task::spawn_blocking(move || certificates.reload()).await;
                match looked {
                    Ok(Ok(Reloaded::New)) => {
                        refused = None;
                        tracing::info!(cert = %self.files.cert.display(), "TLS certificate changed on disk: serving the new one to new connections");
                    }
                    Ok(Ok(Reloaded::Same)) => refused = None,
                    Ok(Err(error)) => {
                        let why = error.to_string();
                        if refused.as_ref() != Some(&why) {
                            tracing::error!(%error, "TLS files changed but cannot be served: keeping the current certificate");
                            refused = Some(why);
                        }
                    }
                    Err(_) => {}
                }
            }
        });
    }
}

impl ResolvesServerCert for Certificates {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

/// The rustls configuration of the proxy listener: TLS 1.2 and 1.3, ALPN `h2` and
/// `http/1.1`, certificates from `certificates`.
pub fn server_config(certificates: Arc<Certificates>) -> Result<rustls::ServerConfig, rustls::Error> {
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_no_client_auth()
        .with_cert_resolver(certificates);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}
