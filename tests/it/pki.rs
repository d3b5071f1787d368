//! Certificates for the HTTPS tests, made with rcgen: a private CA, and server pairs it
//! signs for 127.0.0.1, valid when a test says.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};

/// A private CA.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A server certificate and its key, as PEM.
pub struct ServerPair {
    pub cert: String,
    pub key: String,
    /// The certificate's DER: what a client sees, to tell two pairs apart.
    pub der: Vec<u8>,
}

impl Ca {
    pub fn new() -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "dedup-gateway test CA");
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().expect("key")).expect("CA");
        Ca { issuer }
    }

    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A pair for 127.0.0.1, valid from `days_from_now.0` to `days_from_now.1` days from
    /// now (negative: in the past).
    pub fn server(&self, days_from_now: (i64, i64)) -> ServerPair {
        let mut params = CertificateParams::new(vec!["127.0.0.1".to_owned()]).expect("params");
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now + time::Duration::days(days_from_now.0);
        params.not_after = now + time::Duration::days(days_from_now.1);
        let key = KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &self.issuer).expect("signed");
        ServerPair {
            cert: cert.pem(),
            key: key.serialize_pem(),
            der: cert.der().to_vec(),
        }
    }
}

impl ServerPair {
    /// Writes `tls.crt` and `tls.key` into `dir`; their paths.
    pub fn write(&self, dir: &Path) -> (PathBuf, PathBuf) {
        let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
        std::fs::write(&cert, &self.cert).expect("write cert");
        std::fs::write(&key, &self.key).expect("write key");
        (cert, key)
    }
}
