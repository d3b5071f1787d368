//! GitHub: `X-Hub-Signature-256: sha256=` + hex HMAC-SHA256(secret, raw body). The legacy
//! SHA-1 `X-Hub-Signature` alone is not accepted. No timestamp is signed.

use super::mac::Mac;
use super::{Delivery, Rejection, ct_eq, unhex};

pub(crate) fn verify(mac: &Mac, d: &Delivery<'_>) -> Result<(), Rejection> {
    let signature = d.header("x-hub-signature-256")?;
    let hex = signature
        .strip_prefix("sha256=")
        .ok_or(Rejection::Malformed("X-Hub-Signature-256"))?;
    let expected = unhex::<32>(hex, "X-Hub-Signature-256")?;
    if ct_eq(&mac.tag(&[d.body]), &expected) {
        Ok(())
    } else {
        Err(Rejection::Mismatch("X-Hub-Signature-256"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::senders::tests::delivery;

    /// GH-1: "Validating webhook deliveries", test values.
    #[test]
    fn gh_1_published_test_values() {
        let mac = Mac::new(b"It's a Secret to Everybody");
        let sig = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
        let head = delivery(&[("x-hub-signature-256", sig)], "/");
        let d = |body: &'static [u8]| Delivery {
            head: &head,
            body,
            now_ms: 0,
        };
        assert_eq!(verify(&mac, &d(b"Hello, World!")), Ok(()));
        assert_eq!(
            verify(&mac, &d(b"Hello, World?")),
            Err(Rejection::Mismatch("X-Hub-Signature-256"))
        );
        let legacy = delivery(&[("x-hub-signature", "sha1=0123")], "/");
        let d = Delivery {
            head: &legacy,
            body: b"Hello, World!",
            now_ms: 0,
        };
        assert_eq!(verify(&mac, &d), Err(Rejection::Missing("x-hub-signature-256")));
    }
}
