//! Standard Webhooks: `webhook-signature` holds space-separated
//! `v1,<base64 HMAC-SHA256(key, webhook-id + "." + webhook-timestamp + "." + body)>`
//! entries, any of which may match; key = base64-decoded secret without `whsec_`;
//! the timestamp must be within 300 s of now either way.
//!
//! Senders that deliver through Svix (Clerk, Resend, ...) send the same three fields
//! as `svix-id`, `svix-timestamp` and `svix-signature`. Both families are accepted,
//! as Svix's own libraries do: `webhook-*` when `webhook-id` is there, else `svix-*`;
//! one family is checked, never a mix.

use base64::Engine;

use super::mac::Mac;
use super::{Delivery, Rejection, ct_eq, timestamp, within};
use crate::secret::Secret;

/// The names of one family of headers: id, timestamp, signature.
struct Family {
    id: &'static str,
    timestamp: &'static str,
    signature: &'static str,
    /// A signature field with no `v1,` entry lacks this.
    v1: &'static str,
}

const STANDARD: Family = Family {
    id: "webhook-id",
    timestamp: "webhook-timestamp",
    signature: "webhook-signature",
    v1: "webhook-signature v1,",
};

const SVIX: Family = Family {
    id: "svix-id",
    timestamp: "svix-timestamp",
    signature: "svix-signature",
    v1: "svix-signature v1,",
};

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
    let family = if d.has_header(STANDARD.id) || !d.has_header(SVIX.id) {
        STANDARD
    } else {
        SVIX
    };
    let id = d.header(family.id)?;
    let ts_text = d.header(family.timestamp)?;
    let signatures = d.header(family.signature)?;
    let ts = timestamp(ts_text, family.timestamp)?;
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
        Rejection::Mismatch(family.signature)
    } else {
        Rejection::Missing(family.v1)
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
        assert_eq!(verify(&mac, &d), Err(Rejection::Mismatch(STANDARD.signature)));
        assert_eq!(
            key(&Secret::new("whsec_!!!")).err().map(|e| e.contains("whsec_")),
            Some(true)
        );
    }

    /// Svix's names for the same fields (Clerk, Resend, ...): the published vector sent
    /// as `svix-*` passes; one family is checked, never a mix of the two.
    #[test]
    fn svix_headers_carry_the_same_signature() {
        let mac = key(&Secret::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")).expect("key");
        let body = br#"{"test": 2432232314}"#;
        let sig = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";
        let check = |headers: &[(&str, &str)], body: &[u8]| {
            let head = delivery(headers, "/");
            verify(
                &mac,
                &Delivery {
                    head: &head,
                    body,
                    now_ms: 1614265330 * 1000,
                },
            )
        };
        let svix = [
            ("svix-id", "msg_p5jXN8AQM9LWM0D4loKWxJek"),
            ("svix-timestamp", "1614265330"),
            ("svix-signature", sig),
        ];
        assert_eq!(check(&svix, body), Ok(()));
        assert_eq!(
            check(&svix, br#"{"test": 2432232315}"#),
            Err(Rejection::Mismatch("svix-signature"))
        );
        let mixed = [("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek"), svix[1], svix[2]];
        assert_eq!(check(&mixed, body), Err(Rejection::Missing("webhook-timestamp")));
        assert_eq!(check(&svix[..2], body), Err(Rejection::Missing("svix-signature")));
    }
}
