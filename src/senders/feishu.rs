//! Feishu / Lark event subscriptions.
//!
//! - With an Encrypt Key (`aes_key`): bodies are `{"encrypt": base64(iv + AES-256-CBC)}`
//!   with key sha256(Encrypt Key) and PKCS#7 (16); every event is signed:
//!   `X-Lark-Signature` = hex sha256(`X-Lark-Request-Timestamp` + `X-Lark-Request-Nonce`
//!   + Encrypt Key + raw body) (a plain hash, not an HMAC).
//! - The Verification Token (`secret`) is in every body: `header.token` (v2) or
//!   `token` (v1 and the handshake); it is the only check without an Encrypt Key.
//! - The `url_verification` handshake is never signed: it passes on its token alone.
//!
//! No timestamp window: none documented, and the SDK checks none.

use std::borrow::Cow;

use aes::Aes256;
use aes::cipher::block_padding::Pkcs7;
use aes::cipher::{BlockModeDecrypt, InnerIvInit, KeyInit};
use base64::Engine;
use sha2::{Digest, Sha256};

use super::{CredentialProblem, Credentials, Delivery, Failure, LENIENT_B64, Plaintext, Rejection, Verdict};
use super::{ct_eq, is_url_verification, unhex};
use crate::key::Pointer;
use crate::secret::Secret;

#[derive(Clone)]
pub(crate) struct Keys {
    token: Option<Secret>,
    encrypt: Option<EncryptKey>,
    pointers: Pointers,
}

#[derive(Clone)]
struct EncryptKey {
    raw: Secret,
    cipher: Aes256,
}

#[derive(Clone)]
struct Pointers {
    encrypt: Pointer,
    v2_token: Pointer,
    v1_token: Pointer,
}

impl Keys {
    pub fn new(creds: Credentials) -> Result<Keys, Vec<CredentialProblem>> {
        let pointer = |p: &str| Pointer::parse(p).map_err(|e| vec![CredentialProblem::new(super::Field::Secret, e)]);
        Ok(Keys {
            token: creds.secret,
            encrypt: creds.aes_key.map(|raw| {
                let key: [u8; 32] = Sha256::digest(raw.expose().as_bytes()).into();
                EncryptKey {
                    cipher: Aes256::new(&key.into()),
                    raw,
                }
            }),
            pointers: Pointers {
                encrypt: pointer("/encrypt")?,
                v2_token: pointer("/header/token")?,
                v1_token: pointer("/token")?,
            },
        })
    }

    pub fn is_verified(&self) -> bool {
        self.token.is_some() || self.encrypt.is_some()
    }

    pub fn verify(&self, d: &Delivery<'_>) -> Result<Verdict, Failure> {
        let plaintext = match (self.pointers.encrypt.lookup(d.body).ok(), &self.encrypt) {
            (Some(encrypted), Some(key)) => Some(key.decrypt(&encrypted).ok_or(Rejection::Undecryptable)?),
            // Without the key an encrypted body stays unread (and its id hidden).
            _ => None,
        };
        let readable = plaintext.as_ref().map_or(d.body, Plaintext::as_bytes);
        let handshake = is_url_verification(readable);
        if let Some(key) = &self.encrypt {
            match d.head.headers.get("x-lark-signature") {
                None if handshake => {} // the handshake is never signed
                _ => key.verify_signature(d)?,
            }
        }
        if let Some(token) = &self.token {
            let found: Option<Cow<'_, str>> = if handshake {
                self.pointers.v1_token.lookup(readable).ok()
            } else {
                (self.pointers.v2_token.lookup(readable).ok()).or_else(|| self.pointers.v1_token.lookup(readable).ok())
            };
            let found = found.ok_or(Rejection::Missing("body token"))?;
            if !ct_eq(found.as_bytes(), token.expose().as_bytes()) {
                return Err(Rejection::Mismatch("body token").into());
            }
        }
        Ok(plaintext.map_or(Verdict::Plain, Verdict::Decrypted))
    }
}

impl EncryptKey {
    fn verify_signature(&self, d: &Delivery<'_>) -> Result<(), Rejection> {
        let expected = unhex::<32>(d.header("x-lark-signature")?, "X-Lark-Signature")?;
        let ts = d.header("x-lark-request-timestamp")?;
        let nonce = d.header("x-lark-request-nonce")?;
        let mut sha = Sha256::new();
        for part in [ts.as_bytes(), nonce.as_bytes(), self.raw.expose().as_bytes(), d.body] {
            sha.update(part);
        }
        let got: [u8; 32] = sha.finalize().into();
        if ct_eq(&got, &expected) {
            Ok(())
        } else {
            Err(Rejection::Mismatch("X-Lark-Signature"))
        }
    }

    /// base64(iv(16) + ciphertext) -> plaintext; None if it is not one.
    fn decrypt(&self, encrypted: &str) -> Option<Plaintext> {
        let mut buf = LENIENT_B64.decode(encrypted.trim()).ok()?;
        if buf.len() < 32 || buf.len() % 16 != 0 {
            return None;
        }
        let (iv, data) = buf.split_at_mut(16);
        let iv: [u8; 16] = (&*iv).try_into().ok()?;
        let decryptor = cbc::Decryptor::<Aes256>::inner_iv_init(self.cipher.clone(), &iv.into());
        let len = decryptor.decrypt_padded::<Pkcs7>(data).ok()?.len();
        Some(Plaintext {
            buf,
            range: 16..16 + len,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// FS-1: the doc's decryption example, `"test key"` -> `hello world`.
    #[test]
    fn fs_1_test_key_decrypts_to_hello_world() {
        let keys = Keys::new(Credentials {
            aes_key: Some(Secret::new("test key")),
            ..Credentials::default()
        })
        .expect("keys");
        let key = keys.encrypt.as_ref().expect("key");
        let plain = key
            .decrypt("P37w+VZImNgPEO1RBhJ6RtKl7n6zymIbEG1pReEzghk=")
            .expect("decrypts");
        assert_eq!(plain.as_bytes(), b"hello world");
        assert_eq!(
            hex::encode(
                &LENIENT_B64
                    .decode("P37w+VZImNgPEO1RBhJ6RtKl7n6zymIbEG1pReEzghk=")
                    .expect("b64")[..16]
            ),
            "3f7ef0f9564898d80f10ed5106127a46"
        );
        assert!(
            key.decrypt("P37w+VZImNgPEO1RBhJ6RtKl7n6zymIbEG1pReEzghs=").is_none(),
            "bad padding"
        );
        assert!(key.decrypt("AAAA").is_none());
    }
}
