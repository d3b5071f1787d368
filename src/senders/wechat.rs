//! WeChat Official Account (`wechat-mp`) and WeCom (`wecom`) callbacks: the SHA-1
//! query signatures and the AES-256-CBC message encryption they share.
//!
//! - `signature` = hex sha1(concat(sort([token, timestamp, nonce]))) (plain mode).
//! - `msg_signature` = hex sha1(concat(sort([token, timestamp, nonce, Encrypt]))).
//! - AES key = base64(EncodingAESKey + "="), 32 bytes; IV = key[0..16]; PKCS#7 padding
//!   to 32-byte blocks; plaintext = random(16) + msg_len (u32, big endian) + msg +
//!   appid (WeChat) / corpid (WeCom).
//! - A WeChat account chooses XML or JSON as its data format: the outer body is
//!   `<xml>..<Encrypt>..</Encrypt></xml>` or `{"ToUserName":..,"Encrypt":..}`, and the
//!   plaintext is in the same format.
//!
//! No timestamp window: neither sender documents one and their SDKs check none.

use std::borrow::Cow;
use std::ops::Range;

use aes::Aes256;
use aes::cipher::block_padding::NoPadding;
use aes::cipher::{BlockModeDecrypt, InnerIvInit, KeyInit};
use base64::Engine;
use sha1::{Digest, Sha1};

use super::{CredentialProblem, Credentials, Delivery, Failure, Field, LENIENT_B64, Plaintext, Rejection, Verdict};
use super::{ct_eq, unhex};
use crate::key::xml::{self, Found, XmlError, XmlPath};
use crate::key::{Pointer, Refused};
use crate::secret::Secret;

/// How a push was sent (see [`Keys::verify`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sent {
    Plaintext,
    Encrypted,
}

/// Which of the two senders a route serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Plain, compatible or safe mode; encrypted only when the route has an aes_key.
    Mp,
    /// Always encrypted.
    Wecom,
}

#[derive(Clone)]
pub(crate) struct Keys {
    mode: Mode,
    token: Option<Secret>,
    aes: Option<MessageCipher>,
    app_id: Option<Box<str>>,
    /// `require_encryption`: plaintext pushes are refused.
    require_encryption: bool,
    /// `Encrypt`, the element of an outer XML body that holds the ciphertext.
    encrypt: [XmlPath; 1],
    /// `/Encrypt`, the same member of an outer JSON body.
    encrypt_json: Pointer,
}

impl Keys {
    pub fn new(mode: Mode, creds: Credentials) -> Result<Keys, Vec<CredentialProblem>> {
        let aes = match &creds.aes_key {
            Some(key) => Some(
                MessageCipher::from_encoding_aes_key(key.expose())
                    .map_err(|problem| vec![CredentialProblem::new(Field::AesKey, problem)])?,
            ),
            None if mode == Mode::Wecom => {
                return Err(vec![CredentialProblem::new(
                    Field::AesKey,
                    "required: WeCom callbacks are always encrypted, and the message id is inside \
                     (set aes_key or aes_key_env to the EncodingAESKey)",
                )]);
            }
            None => None,
        };
        if creds.app_id.is_some() && aes.is_none() {
            return Err(vec![CredentialProblem::new(
                Field::AppId,
                "only checked inside decrypted messages: set aes_key too",
            )]);
        }
        let problem = |e| vec![CredentialProblem::new(Field::AesKey, e)];
        Ok(Keys {
            mode,
            token: creds.secret,
            aes,
            app_id: creds.app_id.map(Into::into),
            require_encryption: creds.require_encryption,
            encrypt: [XmlPath::parse("Encrypt").map_err(problem)?],
            encrypt_json: Pointer::parse("/Encrypt").map_err(problem)?,
        })
    }

    pub fn is_verified(&self) -> bool {
        self.token.is_some()
    }

    pub fn verify(&self, d: &Delivery<'_>) -> Result<Verdict, Failure> {
        let [signature, timestamp, nonce, msg_signature, encrypt_type] =
            d.query(["signature", "timestamp", "nonce", "msg_signature", "encrypt_type"]);
        let (ts, nonce) = (timestamp.as_deref(), nonce.as_deref());
        let aes = match (&self.aes, self.sent(encrypt_type.as_deref())?) {
            (Some(aes), Sent::Encrypted) => aes,
            (_, Sent::Plaintext) if self.require_encryption => return Err(Rejection::Plaintext.into()),
            // Plaintext (WeChat only; or the route cannot decrypt): the signature covers
            // no body.
            _ => {
                if let Some(token) = &self.token {
                    check(token, SIGNATURE, signature.as_deref(), ts, nonce, "")?;
                }
                return Ok(Verdict::Plain);
            }
        };
        let encrypt = self.ciphertext(d.body)?;
        if let Some(token) = &self.token {
            check(token, MSG_SIGNATURE, msg_signature.as_deref(), ts, nonce, &encrypt)?;
        }
        let message = aes.decrypt(&encrypt).ok_or(Rejection::Undecryptable)?;
        if let Some(app_id) = &self.app_id
            && message.receive_id() != app_id.as_bytes()
        {
            return Err(Rejection::WrongAppId.into());
        }
        Ok(Verdict::Decrypted(message.into_plaintext()))
    }

    /// How a push says it was sent. WeCom always encrypts. A WeChat account chooses
    /// plaintext, compatible or safe mode in its console (which shows an EncodingAESKey
    /// whatever the mode), and each push says which by `encrypt_type`, as WeChat's SDKs
    /// read it: absent or `raw`, plaintext (checked by `signature`); `aes`, encrypted
    /// (compatible mode sends the plaintext fields too; checked by `msg_signature`).
    fn sent(&self, encrypt_type: Option<&str>) -> Result<Sent, Rejection> {
        match (self.mode, encrypt_type) {
            (Mode::Wecom, _) | (Mode::Mp, Some("aes")) => Ok(Sent::Encrypted),
            (Mode::Mp, None | Some("raw")) => Ok(Sent::Plaintext),
            (Mode::Mp, Some(_)) => Err(Rejection::Malformed("encrypt_type")),
        }
    }

    /// How a push was sent, for `key`: only where the route accepts more than one way.
    pub fn mode_of(&self, head: &http::request::Parts) -> Option<&'static str> {
        if self.mode != Mode::Mp || self.aes.is_none() {
            return None;
        }
        let d = Delivery {
            head,
            body: &[],
            now_ms: 0,
        };
        let [encrypt_type] = d.query(["encrypt_type"]);
        Some(match self.sent(encrypt_type.as_deref()) {
            Ok(Sent::Plaintext) => "plaintext mode (no encrypt_type): checked by signature",
            Ok(Sent::Encrypted) => "compatible or safe mode (encrypt_type=aes): checked by msg_signature, decrypted",
            Err(_) => "an encrypt_type WeChat does not send",
        })
    }

    /// The ways of sending this route accepts, for `check`: where there are several.
    pub fn modes(&self) -> Option<&'static str> {
        match (self.mode, &self.aes, self.require_encryption) {
            (Mode::Mp, Some(_), false) => Some(
                "plaintext (signature), compatible and safe (msg_signature, decrypted), as each push's encrypt_type says",
            ),
            (Mode::Mp, Some(_), true) => Some(
                "compatible and safe only (msg_signature, decrypted); plaintext pushes refused (require_encryption)",
            ),
            _ => None,
        }
    }

    /// The GET `echostr` handshake (URL verification), where a token is configured:
    /// WeChat signs it with `signature`, WeCom with `msg_signature` over the (encrypted)
    /// echostr. A GET without `echostr` is not the handshake, and passes.
    pub fn verify_echostr(&self, d: &Delivery<'_>) -> Result<(), Rejection> {
        let [echostr, signature, timestamp, nonce, msg_signature] =
            d.query(["echostr", "signature", "timestamp", "nonce", "msg_signature"]);
        let (Some(token), Some(echostr)) = (&self.token, echostr) else {
            return Ok(());
        };
        let (ts, nonce) = (timestamp.as_deref(), nonce.as_deref());
        match self.mode {
            Mode::Mp => check(token, SIGNATURE, signature.as_deref(), ts, nonce, ""),
            Mode::Wecom => check(token, MSG_SIGNATURE, msg_signature.as_deref(), ts, nonce, &echostr),
        }
    }

    /// The non-empty `Encrypt` value of the outer body, in the body's data format: a
    /// body that opens with `{` is JSON, anything else is read as XML.
    fn ciphertext<'a>(&self, body: &'a [u8]) -> Result<Cow<'a, str>, Failure> {
        if body.trim_ascii_start().starts_with(b"{") {
            return self
                .encrypt_json
                .lookup(body)
                .map_err(|_| Rejection::NotEncrypted.into());
        }
        match xml::extract(body, &self.encrypt).map(|mut found| found.pop()) {
            Ok(Some(Found::Text(text))) if !text.is_empty() => Ok(text),
            Err(XmlError::Doctype) => Err(Refused.into()),
            _ => Err(Rejection::NotEncrypted.into()),
        }
    }
}

/// The two query signatures, as rejections name them.
const SIGNATURE: &str = "query signature";
const MSG_SIGNATURE: &str = "query msg_signature";

/// Checks the query signature `given` (`what`, in rejections) against
/// sha1(sort([token, timestamp, nonce, signed])); an empty `signed` adds nothing to the
/// concatenation.
fn check(
    token: &Secret,
    what: &'static str,
    given: Option<&str>,
    timestamp: Option<&str>,
    nonce: Option<&str>,
    signed: &str,
) -> Result<(), Rejection> {
    let expected = unhex::<20>(given.ok_or(Rejection::Missing(what))?, what)?;
    let ts = timestamp.ok_or(Rejection::Missing("query timestamp"))?;
    let nonce = nonce.ok_or(Rejection::Missing("query nonce"))?;
    if ct_eq(&sha1_sorted(&mut [token.expose(), ts, nonce, signed]), &expected) {
        Ok(())
    } else {
        Err(Rejection::Mismatch(what))
    }
}

/// sha1 of the parts sorted and concatenated (WeChat's signature).
pub(crate) fn sha1_sorted(parts: &mut [&str]) -> [u8; 20] {
    parts.sort_unstable();
    let mut sha = Sha1::new();
    for part in parts.iter() {
        sha.update(part.as_bytes());
    }
    sha.finalize().into()
}

/// The AES key schedule of an EncodingAESKey, expanded once.
#[derive(Clone)]
pub(crate) struct MessageCipher {
    cipher: Aes256,
    iv: [u8; 16],
}

/// A decrypted message: its buffer, the message and the trailing app / corp id.
pub(crate) struct Message {
    buf: Vec<u8>,
    msg: Range<usize>,
    receive_id: Range<usize>,
}

impl Message {
    #[cfg(test)]
    fn msg(&self) -> &[u8] {
        self.buf.get(self.msg.clone()).unwrap_or_default()
    }

    pub fn receive_id(&self) -> &[u8] {
        self.buf.get(self.receive_id.clone()).unwrap_or_default()
    }

    fn into_plaintext(self) -> Plaintext {
        Plaintext {
            buf: self.buf,
            range: self.msg,
        }
    }
}

/// WeChat pads to 32-byte blocks (PKCS#7 with K = 32).
const PAD_BLOCK: usize = 32;

impl MessageCipher {
    /// From the 43-character EncodingAESKey shown in the WeChat / WeCom console.
    pub fn from_encoding_aes_key(eak: &str) -> Result<Self, String> {
        const HINT: &str = "must be the 43-character EncodingAESKey (base64 of 32 bytes, without the final \"=\")";
        if eak.len() != 43 {
            return Err(format!("{HINT}; this one has {} characters", eak.chars().count()));
        }
        let mut key = [0u8; 32];
        let mut padded = [0u8; 44];
        padded[..43].copy_from_slice(eak.as_bytes());
        padded[43] = b'=';
        match LENIENT_B64.decode_slice(padded, &mut key) {
            Ok(32) => {}
            _ => return Err(HINT.to_owned()),
        }
        let mut iv = [0u8; 16];
        iv.copy_from_slice(&key[..16]);
        Ok(MessageCipher {
            cipher: Aes256::new(&key.into()),
            iv,
        })
    }

    /// Decrypts a base64 `Encrypt` value; None when it is not a valid message.
    pub fn decrypt(&self, encrypt: &str) -> Option<Message> {
        let mut buf = LENIENT_B64.decode(encrypt.trim()).ok()?;
        if buf.is_empty() || buf.len() % 16 != 0 {
            return None;
        }
        let decryptor = cbc::Decryptor::<Aes256>::inner_iv_init(self.cipher.clone(), &self.iv.into());
        let len = decryptor.decrypt_padded::<NoPadding>(&mut buf).ok()?.len();
        let pad = usize::from(*buf.get(len.checked_sub(1)?)?);
        if !(1..=PAD_BLOCK).contains(&pad) || pad > len || buf[len - pad..len].iter().any(|b| usize::from(*b) != pad) {
            return None;
        }
        let content = len - pad;
        // random(16) | msg_len (4, big endian) | msg | receive id
        let len_bytes: [u8; 4] = buf.get(16..20)?.try_into().ok()?;
        let msg_len = usize::try_from(u32::from_be_bytes(len_bytes)).ok()?;
        let msg_end = 20usize.checked_add(msg_len).filter(|end| *end <= content)?;
        Some(Message {
            buf,
            msg: 20..msg_end,
            receive_id: msg_end..content,
        })
    }
}

#[cfg(test)]
pub(crate) mod tests;
