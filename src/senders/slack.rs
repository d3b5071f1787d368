//! Slack: `X-Slack-Signature: v0=` + hex HMAC-SHA256(signing secret,
//! `v0:` + `X-Slack-Request-Timestamp` + `:` + raw body); the timestamp must be within
//! 300 s of now either way (python-slack-sdk's rule).

use super::mac::Mac;
use super::{Delivery, Rejection, ct_eq, timestamp, unhex, within};

pub(crate) fn verify(mac: &Mac, d: &Delivery<'_>) -> Result<(), Rejection> {
    let ts_text = d.header("x-slack-request-timestamp")?;
    let signature = d.header("x-slack-signature")?;
    let ts = timestamp(ts_text, "X-Slack-Request-Timestamp")?;
    within(ts, d.now_secs(), 300, 300, "±300 s")?;
    let hex = signature
        .strip_prefix("v0=")
        .ok_or(Rejection::Malformed("X-Slack-Signature"))?;
    let expected = unhex::<32>(hex, "X-Slack-Signature")?;
    let tag = mac.tag(&[b"v0:", ts_text.as_bytes(), b":", d.body]);
    if ct_eq(&tag, &expected) {
        Ok(())
    } else {
        Err(Rejection::Mismatch("X-Slack-Signature"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::senders::tests::delivery;

    /// SL-1: the example on "Verifying requests from Slack".
    #[test]
    fn sl_1_published_example() {
        let body = "token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";
        assert_eq!(body.len(), 362);
        let mac = Mac::new(b"8f742231b10e8888abcd99yyyzzz85a5");
        let sig = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503";
        let head = delivery(
            &[("x-slack-request-timestamp", "1531420618"), ("x-slack-signature", sig)],
            "/",
        );
        let at = |secs: u64| Delivery {
            head: &head,
            body: body.as_bytes(),
            now_ms: secs * 1000,
        };
        assert_eq!(verify(&mac, &at(1531420618)), Ok(()));
        assert_eq!(verify(&mac, &at(1531420618 + 300)), Ok(()));
        assert!(matches!(
            verify(&mac, &at(1531420618 + 301)),
            Err(Rejection::Stale { .. })
        ));
        assert!(matches!(
            verify(&mac, &at(1531420618 - 301)),
            Err(Rejection::Stale { .. })
        ));
        let tampered = Delivery {
            body: &body.as_bytes()[1..],
            ..at(1531420618)
        };
        assert_eq!(verify(&mac, &tampered), Err(Rejection::Mismatch("X-Slack-Signature")));
        assert_eq!(
            verify(&Mac::new(b"another secret"), &at(1531420618)),
            Err(Rejection::Mismatch("X-Slack-Signature"))
        );
    }
}
