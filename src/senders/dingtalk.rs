//! DingTalk robot HTTP callback: headers `timestamp` (Unix ms) and `sign` =
//! base64 HMAC-SHA256(appSecret, timestamp + "\n" + appSecret), valid within 1 h of
//! now. The body is not covered: a captured (timestamp, sign) pair can carry any body
//! for an hour (senders.md, finding 7).

use base64::Engine;

use super::mac::Mac;
use super::{Delivery, Rejection, ct_eq, timestamp};
use crate::secret::Secret;

#[derive(Clone)]
pub(crate) struct Keys {
    mac: Mac,
    secret: Secret,
}

const WINDOW_MS: i64 = 3_600_000;

impl Keys {
    pub fn new(secret: Secret) -> Self {
        Keys {
            mac: Mac::new(secret.expose().as_bytes()),
            secret,
        }
    }

    pub fn verify(&self, d: &Delivery<'_>) -> Result<(), Rejection> {
        let ts_text = d.header("timestamp")?;
        let sign = d.header("sign")?;
        let ts = timestamp(ts_text, "timestamp")?;
        let now = i64::try_from(d.now_ms).unwrap_or(i64::MAX);
        let skew = now.saturating_sub(ts);
        if !(-WINDOW_MS..=WINDOW_MS).contains(&skew) {
            return Err(Rejection::Stale {
                skew_secs: skew / 1000,
                window: "±1 h",
            });
        }
        let mut expected = [0u8; 32];
        match base64::engine::general_purpose::STANDARD.decode_slice(sign.trim(), &mut expected) {
            Ok(32) => {}
            _ => return Err(Rejection::Malformed("sign")),
        }
        let tag = self
            .mac
            .tag(&[ts_text.as_bytes(), b"\n", self.secret.expose().as_bytes()]);
        if ct_eq(&tag, &expected) {
            Ok(())
        } else {
            Err(Rejection::Mismatch("sign"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::senders::tests::delivery;

    #[test]
    fn sign_covers_timestamp_and_secret_within_an_hour() {
        let keys = Keys::new(Secret::new("app-secret"));
        let ts = "1700000000000";
        let sign = base64::engine::general_purpose::STANDARD.encode(Mac::new(b"app-secret").tag(&[
            ts.as_bytes(),
            b"\n",
            b"app-secret",
        ]));
        let head = delivery(&[("timestamp", ts), ("sign", &sign)], "/");
        let at = |ms: u64| Delivery {
            head: &head,
            body: b"{}",
            now_ms: ms,
        };
        assert_eq!(keys.verify(&at(1_700_000_000_000 + 3_600_000)), Ok(()));
        assert_eq!(keys.verify(&at(1_700_000_000_000 - 3_600_000)), Ok(()));
        assert!(matches!(
            keys.verify(&at(1_700_000_000_000 + 3_600_001)),
            Err(Rejection::Stale { .. })
        ));
        let other = Keys::new(Secret::new("other"));
        assert_eq!(other.verify(&at(1_700_000_000_000)), Err(Rejection::Mismatch("sign")));
    }
}
