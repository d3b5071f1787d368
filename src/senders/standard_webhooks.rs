//! Standard Webhooks (Svix-compatible): `webhook-signature` holds space-separated
//! `v1,<base64 HMAC-SHA256(key, webhook-id + "." + webhook-timestamp + "." + body)>`
//! entries, any of which may match; key = base64-decoded secret without `whsec_`;
//! the timestamp must be within 300 s of now either way.

use base64::Engine;

use super::mac::Mac;
use super::{Delivery, Rejection, ct_eq, timestamp, within};
use crate::secret::Secret;

const HEADER: &str = "webhook-signature";

/// The HMAC key of a `whsec_...` secret.
pub(crate) fn key(secret: &Secret) -> Result<Mac, String> {
    let s = secret.expose();
    let b64 = s.strip_prefix("whsec_").unwrap_or(s);
    base64::engine::general_purpose::STANDARD
        .decode(b64)
        .ok()
        .filter(|k| !k.is_empty())
        .map(|k| Mac::new(&k))
        .ok_or_else(|| "must be a Standard Webhooks secret: \"whsec_\" followed by base64".to_owned())
}

pub(crate) fn verify(mac: &Mac, d: &Delivery<'_>) -> Result<(), Rejection> {
    let id = d.header("webhook-id")?;
    let ts_text = d.header("webhook-timestamp")?;
    let signatures = d.header(HEADER)?;
    let ts = timestamp(ts_text, "webhook-timestamp")?;
    within(ts, d.now_secs(), 300, 300, "±300 s")?;
    let tag = mac.tag(&[id.as_bytes(), b".", ts_text.as_bytes(), b".", d.body]);
    let mut any_v1 = false;
    for entry in signatures.split(' ') {
        if let Some(b64) = entry.strip_prefix("v1,") {
            any_v1 = true;
            let mut expected = [0u8; 32];
            if let Ok(32) = base64::engine::general_purpose::STANDARD.decode_slice(b64, &mut expected)
                && ct_eq(&tag, &expected)
            {
                return Ok(());
            }
        }
    }
    Err(if any_v1 {
        Rejection::Mismatch(HEADER)
    } else {
        Rejection::Missing("webhook-signature v1,")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::senders::tests::delivery;

    /// SW-1: the library test vector.
    #[test]
    fn sw_1_published_vector() {
        let mac = key(&Secret::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")).expect("key");
        let body = br#"{"test": 2432232314}"#;
        let head = delivery(
            &[
                ("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek"),
                ("webhook-timestamp", "1614265330"),
                (
                    "webhook-signature",
                    "v1,bogus v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
                ),
            ],
            "/",
        );
        let at = |secs: u64| Delivery {
            head: &head,
            body,
            now_ms: secs * 1000,
        };
        assert_eq!(verify(&mac, &at(1614265330)), Ok(()));
        assert!(matches!(
            verify(&mac, &at(1614265330 + 301)),
            Err(Rejection::Stale { .. })
        ));
        assert!(matches!(
            verify(&mac, &at(1614265330 - 301)),
            Err(Rejection::Stale { .. })
        ));
        let tampered = delivery(
            &[
                ("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek"),
                ("webhook-timestamp", "1614265330"),
                ("webhook-signature", "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OA="),
            ],
            "/",
        );
        let d = Delivery {
            head: &tampered,
            body,
            now_ms: 1_614_265_330_000,
        };
        assert_eq!(verify(&mac, &d), Err(Rejection::Mismatch(HEADER)));
        assert_eq!(
            key(&Secret::new("whsec_!!!")).err().map(|e| e.contains("whsec_")),
            Some(true)
        );
    }
}
