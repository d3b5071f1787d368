//! Stripe: `Stripe-Signature: t=<ts>,v1=<hex>[,v1=...][,v0=...]`; each v1 is hex
//! HMAC-SHA256 keyed with the whole `whsec_...` string (not decoded) over `t.` + body;
//! any v1 may match. `t` may be at most 300 s old; the future passes (stripe-python).

use super::mac::Mac;
use super::{Delivery, Rejection, ct_eq, timestamp, unhex, within};

const HEADER: &str = "Stripe-Signature";

pub(crate) fn verify(mac: &Mac, d: &Delivery<'_>) -> Result<(), Rejection> {
    let header = d.header("stripe-signature")?;
    let mut t = None;
    let mut any_v1 = false;
    let mut matched = false;
    let mut tag = None;
    // t comes first in Stripe's header; read it before the signatures either way.
    for item in header.split(',') {
        if let Some(("t", v)) = item.trim().split_once('=')
            && t.is_none()
        {
            t = Some(v);
        }
    }
    let t_text = t.ok_or(Rejection::Missing("Stripe-Signature t="))?;
    let ts = timestamp(t_text, HEADER)?;
    within(ts, d.now_secs(), 300, i64::MAX, "at most 300 s old")?;
    for item in header.split(',') {
        if let Some(("v1", hex)) = item.trim().split_once('=') {
            any_v1 = true;
            let Ok(expected) = unhex::<32>(hex, HEADER) else {
                continue;
            };
            let tag = tag.get_or_insert_with(|| mac.tag(&[t_text.as_bytes(), b".", d.body]));
            matched |= ct_eq(tag, &expected);
        }
    }
    match (any_v1, matched) {
        (_, true) => Ok(()),
        (false, _) => Err(Rejection::Missing("Stripe-Signature v1=")),
        (true, false) => Err(Rejection::Mismatch(HEADER)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::senders::tests::delivery;

    #[test]
    fn any_v1_may_match_and_only_the_past_is_bounded() {
        let secret = "whsec_test_secret";
        let mac = Mac::new(secret.as_bytes());
        let body = br#"{"id":"evt_1","object":"event"}"#;
        let good = hex::encode(mac.tag(&[b"1700000000.", body]));
        let header = format!("t=1700000000,v1={},v1={good},v0=abc", "0".repeat(64));
        let head = delivery(&[("stripe-signature", &header)], "/");
        let at = |secs: u64| Delivery {
            head: &head,
            body,
            now_ms: secs * 1000,
        };
        assert_eq!(verify(&mac, &at(1_700_000_000)), Ok(()));
        assert_eq!(verify(&mac, &at(1_700_000_300)), Ok(()));
        assert_eq!(verify(&mac, &at(1_600_000_000)), Ok(()), "a future timestamp passes");
        assert!(matches!(verify(&mac, &at(1_700_000_301)), Err(Rejection::Stale { .. })));
        let bad = delivery(&[("stripe-signature", "t=1700000000,v1=00")], "/");
        let d = Delivery {
            head: &bad,
            body,
            now_ms: 1_700_000_000_000,
        };
        assert_eq!(verify(&mac, &d), Err(Rejection::Mismatch(HEADER)));
        let none = delivery(&[("stripe-signature", "t=1700000000,v0=00")], "/");
        let d = Delivery {
            head: &none,
            body,
            now_ms: 1_700_000_000_000,
        };
        assert_eq!(verify(&mac, &d), Err(Rejection::Missing("Stripe-Signature v1=")));
    }
}
