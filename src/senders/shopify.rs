//! Shopify: `X-Shopify-Hmac-Sha256` = base64 HMAC-SHA256(client secret, raw body).

use base64::Engine;

use super::mac::Mac;
use super::{Delivery, Rejection, ct_eq};

const HEADER: &str = "X-Shopify-Hmac-Sha256";

pub(crate) fn verify(mac: &Mac, d: &Delivery<'_>) -> Result<(), Rejection> {
    let signature = d.header("x-shopify-hmac-sha256")?;
    let mut expected = [0u8; 32];
    match base64::engine::general_purpose::STANDARD.decode_slice(signature.trim(), &mut expected) {
        Ok(32) => {}
        _ => return Err(Rejection::Malformed(HEADER)),
    }
    if ct_eq(&mac.tag(&[d.body]), &expected) {
        Ok(())
    } else {
        Err(Rejection::Mismatch(HEADER))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::senders::tests::delivery;

    #[test]
    fn base64_hmac_of_the_body() {
        let mac = Mac::new(b"shpss_secret");
        let body = br#"{"id":1}"#;
        let sig = base64::engine::general_purpose::STANDARD.encode(mac.tag(&[body]));
        let head = delivery(&[("x-shopify-hmac-sha256", &sig)], "/");
        assert_eq!(
            verify(
                &mac,
                &Delivery {
                    head: &head,
                    body,
                    now_ms: 0
                }
            ),
            Ok(())
        );
        assert_eq!(
            verify(
                &mac,
                &Delivery {
                    head: &head,
                    body: b"{}",
                    now_ms: 0
                }
            ),
            Err(Rejection::Mismatch(HEADER))
        );
        let hexed = delivery(&[("x-shopify-hmac-sha256", &hex::encode(mac.tag(&[body])))], "/");
        assert_eq!(
            verify(
                &mac,
                &Delivery {
                    head: &hexed,
                    body,
                    now_ms: 0
                }
            ),
            Err(Rejection::Malformed(HEADER))
        );
    }
}
