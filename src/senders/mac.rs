//! HMAC-SHA256 keyed once at config load: each delivery clones the keyed state (the
//! inner and outer pads are already hashed) instead of re-keying.

use std::fmt;

use hmac::{KeyInit, Mac as _};

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

#[derive(Clone)]
pub(crate) struct Mac(HmacSha256);

impl Mac {
    pub fn new(key: &[u8]) -> Self {
        // HMAC takes keys of any length; the fallback is unreachable.
        Mac(HmacSha256::new_from_slice(key).unwrap_or_else(|_| HmacSha256::new(&Default::default())))
    }

    /// HMAC-SHA256 over the concatenation of `parts`.
    pub fn tag(&self, parts: &[&[u8]]) -> [u8; 32] {
        let mut mac = self.0.clone();
        for part in parts {
            mac.update(part);
        }
        mac.finalize().into_bytes().into()
    }
}

impl fmt::Debug for Mac {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("Mac(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 4231 test case 2 (a key shorter than the block) and 6 (longer).
    #[test]
    fn rfc4231() {
        assert_eq!(
            hex::encode(Mac::new(b"Jefe").tag(&[b"what do ya want ", b"for nothing?"])),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert_eq!(
            hex::encode(Mac::new(&[0xaa; 131]).tag(&[b"Test Using Larger Than Block-Size Key - Hash Key First"])),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }
}
