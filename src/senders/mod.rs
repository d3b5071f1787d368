//! Sender presets: what each webhook sender needs from a route (key sources, the answer
//! a duplicate gets, TTLs), and how its deliveries are verified and, for the encrypted
//! senders, decrypted to read the id. The table of senders is [`presets`].
//!
//! A preset is one entry of [`PRESETS`] ([`presets`]). Its [`Scheme`] says how deliveries are signed;
//! each scheme is one file here with a `Keys` type (everything derivable from the
//! secrets, computed once at config load) and a `verify` function. Adding a sender that
//! signs like an existing one (Lark international is Feishu) is one entry; a new
//! signature is one entry, one [`Scheme`] variant and one file.
//!
//! The check runs before any store call: a delivery that fails it is answered 401 and
//! neither forwarded nor recorded, so a forged callback cannot poison a genuine id.

mod dingtalk;
mod feishu;
mod github;
mod mac;
pub mod presets;
mod shopify;
mod slack;
mod standard_webhooks;
mod stripe;
mod telegram;
mod wechat;

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;
use std::time::Duration;

use crate::secret::Secret;

use crate::key::{Pointer, Refused};
pub use presets::{Ack, Handshake, PRESETS, Preset, preset, preset_names};

/// How a sender signs (and, for some, encrypts) its deliveries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    /// Signs nothing: no secret can be checked (wkteam).
    None,
    /// Query `signature` = sha1(sort(token, timestamp, nonce)); safe mode: `msg_signature`
    /// over the `Encrypt` element too, AES-256-CBC body, appid after the message.
    WechatMp,
    /// Always encrypted; `msg_signature` as WeChat safe mode; corpid after the message.
    Wecom,
    /// `X-Lark-Signature` = sha256(timestamp + nonce + Encrypt Key + body); body
    /// `{"encrypt"}` with AES-256-CBC; or, without an Encrypt Key, the body's `token`.
    Feishu,
    /// `X-Slack-Signature: v0=hex(HMAC-SHA256(secret, "v0:" + ts + ":" + body))`, ±300 s.
    Slack,
    /// `X-Hub-Signature-256: sha256=hex(HMAC-SHA256(secret, body))`.
    GitHub,
    /// `Stripe-Signature: t=..,v1=..`; HMAC-SHA256(secret, t + "." + body); t >= now - 300 s.
    Stripe,
    /// `X-Shopify-Hmac-Sha256: base64(HMAC-SHA256(secret, body))`.
    Shopify,
    /// `X-Telegram-Bot-Api-Secret-Token` equals the secret.
    Telegram,
    /// `webhook-signature: v1,base64(HMAC-SHA256(base64dec(whsec), id.ts.body))`, ±300 s;
    /// or the same as `svix-*` (senders that deliver through Svix).
    StandardWebhooks,
    /// Headers `timestamp` (ms) and `sign` = base64(HMAC-SHA256(secret, ts + "\n" + secret)), ±1 h.
    DingTalk,
}

impl Scheme {
    /// A short description for `check` and the README.
    pub fn describe(self) -> &'static str {
        match self {
            Scheme::None => "none (the sender signs nothing)",
            Scheme::WechatMp => "query signature / msg_signature (SHA-1), safe mode AES-256-CBC",
            Scheme::Wecom => "query msg_signature (SHA-1), AES-256-CBC",
            Scheme::Feishu => "X-Lark-Signature (SHA-256, with the Encrypt Key) or body token; AES-256-CBC",
            Scheme::Slack => "X-Slack-Signature (HMAC-SHA256), timestamp within 300 s",
            Scheme::GitHub => "X-Hub-Signature-256 (HMAC-SHA256)",
            Scheme::Stripe => "Stripe-Signature (HMAC-SHA256), timestamp at most 300 s old",
            Scheme::Shopify => "X-Shopify-Hmac-Sha256 (HMAC-SHA256, base64)",
            Scheme::Telegram => "X-Telegram-Bot-Api-Secret-Token (shared token)",
            Scheme::StandardWebhooks => "webhook-signature or svix-signature (HMAC-SHA256), timestamp within 300 s",
            Scheme::DingTalk => "timestamp + sign headers (HMAC-SHA256), within 1 h; the body is not signed",
        }
    }

    /// Which credentials this scheme takes.
    fn takes(self) -> Takes {
        match self {
            Scheme::None => Takes::NOTHING,
            Scheme::WechatMp | Scheme::Wecom => Takes {
                secret: true,
                aes_key: true,
                app_id: true,
            },
            Scheme::Feishu => Takes {
                secret: true,
                aes_key: true,
                app_id: false,
            },
            _ => Takes {
                secret: true,
                aes_key: false,
                app_id: false,
            },
        }
    }
}

struct Takes {
    secret: bool,
    aes_key: bool,
    app_id: bool,
}

impl Takes {
    const NOTHING: Takes = Takes {
        secret: false,
        aes_key: false,
        app_id: false,
    };
}

/// The credentials a route configures for its preset.
#[derive(Clone, Debug, Default)]
pub struct Credentials {
    /// Token / signing secret / Verification Token.
    pub secret: Option<Secret>,
    /// EncodingAESKey (WeChat, WeCom) or Encrypt Key (Feishu).
    pub aes_key: Option<Secret>,
    /// WeChat appid / WeCom corpid, checked after decryption.
    pub app_id: Option<String>,
    /// `wechat-mp` with an aes_key: refuse plaintext pushes (401).
    pub require_encryption: bool,
}

/// Which configured credential a problem is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    Secret,
    AesKey,
    AppId,
    RequireEncryption,
}

/// A credential the preset cannot use. The text never holds the credential.
#[derive(Debug, PartialEq, Eq)]
pub struct CredentialProblem {
    pub field: Field,
    pub problem: String,
}

impl CredentialProblem {
    fn new(field: Field, problem: impl Into<String>) -> Self {
        CredentialProblem {
            field,
            problem: problem.into(),
        }
    }
}

/// A route's sender: its preset and the keys computed from its credentials.
#[derive(Clone)]
pub struct Sender {
    pub preset: &'static Preset,
    verifier: Verifier,
    /// The route setting names the preset filled in (for `check`).
    pub filled: Vec<&'static str>,
    /// Which credentials are configured (never their values).
    pub has_secret: bool,
    pub has_aes_key: bool,
    pub has_app_id: bool,
}

impl fmt::Debug for Sender {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.debug_struct("Sender")
            .field("preset", &self.preset.name)
            .field("verified", &self.is_verified())
            .field("filled", &self.filled)
            .finish_non_exhaustive()
    }
}

/// The keys of a route's scheme; `Unchecked` when no secret is configured.
#[derive(Clone)]
enum Verifier {
    Unchecked,
    Wechat(wechat::Keys),
    Feishu(feishu::Keys),
    Slack(mac::Mac),
    GitHub(mac::Mac),
    Stripe(mac::Mac),
    Shopify(mac::Mac),
    Telegram(Secret),
    StandardWebhooks(mac::Mac),
    DingTalk(dingtalk::Keys),
}

impl Sender {
    /// Computes the keys for `preset` from `creds`; every problem names its field.
    pub fn new(preset: &'static Preset, creds: Credentials) -> Result<Sender, Vec<CredentialProblem>> {
        let takes = preset.scheme.takes();
        let mut problems = Vec::new();
        let not_used = |what: &str| format!("not used by preset {:?} ({what})", preset.name);
        if creds.secret.is_some() && !takes.secret {
            problems.push(CredentialProblem::new(
                Field::Secret,
                not_used("it sends no signature, so no secret can be checked: protect the route by network instead"),
            ));
        }
        if creds.aes_key.is_some() && !takes.aes_key {
            problems.push(CredentialProblem::new(Field::AesKey, not_used("it does not encrypt")));
        }
        if creds.app_id.is_some() && !takes.app_id {
            problems.push(CredentialProblem::new(
                Field::AppId,
                not_used("only WeChat and WeCom check one"),
            ));
        }
        if creds.require_encryption && (preset.scheme != Scheme::WechatMp || creds.aes_key.is_none()) {
            problems.push(CredentialProblem::new(
                Field::RequireEncryption,
                "only applies to preset \"wechat-mp\" with aes_key (WeCom is always encrypted)",
            ));
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        let (has_secret, has_aes_key, has_app_id) =
            (creds.secret.is_some(), creds.aes_key.is_some(), creds.app_id.is_some());
        let verifier = match preset.scheme {
            Scheme::None => Ok(Verifier::Unchecked),
            Scheme::WechatMp => wechat::Keys::new(wechat::Mode::Mp, creds).map(Verifier::Wechat),
            Scheme::Wecom => wechat::Keys::new(wechat::Mode::Wecom, creds).map(Verifier::Wechat),
            Scheme::Feishu => feishu::Keys::new(creds).map(Verifier::Feishu),
            scheme => match creds.secret {
                None => Ok(Verifier::Unchecked),
                Some(secret) => match scheme {
                    Scheme::Slack => Ok(Verifier::Slack(mac::Mac::new(secret.expose().as_bytes()))),
                    Scheme::GitHub => Ok(Verifier::GitHub(mac::Mac::new(secret.expose().as_bytes()))),
                    Scheme::Stripe => Ok(Verifier::Stripe(mac::Mac::new(secret.expose().as_bytes()))),
                    Scheme::Shopify => Ok(Verifier::Shopify(mac::Mac::new(secret.expose().as_bytes()))),
                    Scheme::Telegram => telegram::check_token(&secret).map(|()| Verifier::Telegram(secret)),
                    Scheme::StandardWebhooks => standard_webhooks::key(&secret).map(Verifier::StandardWebhooks),
                    Scheme::DingTalk => Ok(Verifier::DingTalk(dingtalk::Keys::new(secret))),
                    Scheme::None | Scheme::WechatMp | Scheme::Wecom | Scheme::Feishu => Ok(Verifier::Unchecked),
                }
                .map_err(|problem| vec![CredentialProblem::new(Field::Secret, problem)]),
            },
        }?;
        Ok(Sender {
            preset,
            verifier,
            filled: Vec::new(),
            has_secret,
            has_aes_key,
            has_app_id,
        })
    }

    /// Whether deliveries are verified (a secret is configured for a signing sender).
    pub fn is_verified(&self) -> bool {
        match &self.verifier {
            Verifier::Unchecked => false,
            Verifier::Wechat(keys) => keys.is_verified(),
            Verifier::Feishu(keys) => keys.is_verified(),
            _ => true,
        }
    }

    /// Checks one delivery (before any store call) and, for encrypted senders, decrypts
    /// what the key is read from. `now_ms` is Unix time in milliseconds.
    pub fn inspect(&self, head: &http::request::Parts, body: &[u8], now_ms: u64) -> Result<Verdict, Failure> {
        let d = Delivery { head, body, now_ms };
        let verdict = match &self.verifier {
            // Without keys an encrypted body cannot be read: its id stays hidden.
            Verifier::Unchecked => Verdict::Plain,
            Verifier::Wechat(keys) => keys.verify(&d)?,
            Verifier::Feishu(keys) => keys.verify(&d)?,
            Verifier::Slack(mac) => slack::verify(mac, &d).map(|()| Verdict::Plain)?,
            Verifier::GitHub(mac) => github::verify(mac, &d).map(|()| Verdict::Plain)?,
            Verifier::Stripe(mac) => stripe::verify(mac, &d).map(|()| Verdict::Plain)?,
            Verifier::Shopify(mac) => shopify::verify(mac, &d).map(|()| Verdict::Plain)?,
            Verifier::Telegram(secret) => telegram::verify(secret, &d).map(|()| Verdict::Plain)?,
            Verifier::StandardWebhooks(mac) => standard_webhooks::verify(mac, &d).map(|()| Verdict::Plain)?,
            Verifier::DingTalk(keys) => keys.verify(&d).map(|()| Verdict::Plain)?,
        };
        if self.preset.handshake == Handshake::UrlVerification && is_url_verification(verdict.key_body(body)) {
            return Ok(Verdict::Handshake);
        }
        Ok(verdict)
    }

    /// How a request was sent, where the sender has several ways (WeChat's plaintext,
    /// compatible and safe modes on a route with aes_key): for `key` to say.
    pub fn mode_of(&self, head: &http::request::Parts) -> Option<&'static str> {
        match &self.verifier {
            Verifier::Wechat(keys) => keys.mode_of(head),
            _ => None,
        }
    }

    /// The ways of sending this route accepts, where the sender has several: for
    /// `check` to say.
    pub fn modes(&self) -> Option<&'static str> {
        match &self.verifier {
            Verifier::Wechat(keys) => keys.modes(),
            _ => None,
        }
    }

    /// Checks a request that passes through undeduped: only the sender's signed GET
    /// handshake (WeChat's and WeCom's `echostr`) has a signature to check.
    pub fn inspect_passthrough(&self, head: &http::request::Parts) -> Result<(), Failure> {
        match &self.verifier {
            Verifier::Wechat(keys) if head.method == http::Method::GET => {
                let d = Delivery {
                    head,
                    body: &[],
                    now_ms: 0,
                };
                Ok(keys.verify_echostr(&d)?)
            }
            _ => Ok(()),
        }
    }
}

/// What the key is read from, once a delivery passed its check.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The body as received.
    Plain,
    /// The decrypted message (the upstream still gets the original bytes).
    Decrypted(Plaintext),
    /// A documented handshake: forwarded without a key, never deduped.
    Handshake,
}

impl Verdict {
    /// The bytes key sources read: the plaintext, or the body itself.
    pub fn key_body<'a>(&'a self, body: &'a [u8]) -> &'a [u8] {
        match self {
            Verdict::Decrypted(p) => p.as_bytes(),
            Verdict::Plain | Verdict::Handshake => body,
        }
    }
}

/// A decrypted message inside its decryption buffer (one allocation per delivery).
#[derive(PartialEq, Eq)]
pub struct Plaintext {
    buf: Vec<u8>,
    range: Range<usize>,
}

impl Plaintext {
    pub fn as_bytes(&self) -> &[u8] {
        self.buf.get(self.range.clone()).unwrap_or_default()
    }
}

impl fmt::Debug for Plaintext {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "Plaintext({:?})", String::from_utf8_lossy(self.as_bytes()))
    }
}

/// Why a delivery is not accepted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Failure {
    /// 401: it does not carry the sender's valid signature.
    #[error("signature check failed: {0}")]
    Rejected(#[from] Rejection),
    /// 400: its XML must not be parsed.
    #[error(transparent)]
    Refused(#[from] Refused),
}

/// Why a signature check failed. Never holds a secret.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum Rejection {
    #[error("{0} is missing")]
    Missing(&'static str),
    #[error("{0} is malformed")]
    Malformed(&'static str),
    #[error("{0} does not match")]
    Mismatch(&'static str),
    #[error("timestamp is {skew_secs} s off, outside the sender's window ({window})")]
    Stale { skew_secs: i64, window: &'static str },
    #[error("encrypt_type=aes, but the body has no Encrypt")]
    NotEncrypted,
    #[error("a plaintext push (no encrypt_type), but the route has require_encryption")]
    Plaintext,
    #[error("the body does not decrypt with aes_key")]
    Undecryptable,
    #[error("the decrypted message is for another app_id")]
    WrongAppId,
}

/// One delivery as the checks see it.
pub(crate) struct Delivery<'a> {
    head: &'a http::request::Parts,
    body: &'a [u8],
    now_ms: u64,
}

impl<'a> Delivery<'a> {
    /// A header as text; missing or not text is a rejection naming it.
    fn header(&self, name: &'static str) -> Result<&'a str, Rejection> {
        let value = self.head.headers.get(name).ok_or(Rejection::Missing(name))?;
        value.to_str().map_err(|_| Rejection::Malformed(name))
    }

    fn has_header(&self, name: &'static str) -> bool {
        self.head.headers.contains_key(name)
    }

    fn now_secs(&self) -> i64 {
        i64::try_from(self.now_ms / 1000).unwrap_or(i64::MAX)
    }

    /// The first value of each named query parameter.
    fn query<const N: usize>(&self, names: [&str; N]) -> [Option<Cow<'a, str>>; N] {
        let mut found: [Option<Cow<'a, str>>; N] = std::array::from_fn(|_| None);
        if let Some(query) = self.head.uri.query() {
            for (k, v) in form_urlencoded::parse(query.as_bytes()) {
                if let Some(i) = names.iter().position(|n| *n == k)
                    && let Some(slot) = found.get_mut(i)
                    && slot.is_none()
                {
                    *slot = Some(v);
                }
            }
        }
        found
    }
}

/// Parses a decimal timestamp header or parameter.
fn timestamp(text: &str, name: &'static str) -> Result<i64, Rejection> {
    text.trim().parse().map_err(|_| Rejection::Malformed(name))
}

/// Rejects `ts` outside `[now - past, now + future]`.
fn within(ts: i64, now: i64, past: i64, future: i64, window: &'static str) -> Result<(), Rejection> {
    let skew = now.saturating_sub(ts);
    if skew > past || skew < -future {
        Err(Rejection::Stale {
            skew_secs: skew,
            window,
        })
    } else {
        Ok(())
    }
}

/// Constant-time equality (length differences return at once: lengths are public).
fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    a.ct_eq(b).into()
}

/// Decodes `N` bytes of hex.
fn unhex<const N: usize>(text: &str, name: &'static str) -> Result<[u8; N], Rejection> {
    let mut out = [0u8; N];
    hex::decode_to_slice(text.trim(), &mut out).map_err(|_| Rejection::Malformed(name))?;
    Ok(out)
}

/// Whether a JSON body is a `url_verification` handshake.
fn is_url_verification(body: &[u8]) -> bool {
    static TYPE: std::sync::LazyLock<Option<Pointer>> = std::sync::LazyLock::new(|| Pointer::parse("/type").ok());
    TYPE.as_ref()
        .and_then(|p| p.lookup(body).ok())
        .is_some_and(|t| t == "url_verification")
}

/// Base64 that accepts what senders' SDKs accept: padding optional, stray low bits
/// in the last character (a WeChat EncodingAESKey has them) ignored.
pub(crate) const LENIENT_B64: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    base64::engine::GeneralPurposeConfig::new()
        .with_decode_allow_trailing_bits(true)
        .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
);

/// What `check` should warn about for a route with this sender.
pub fn warnings(sender: &Sender, completed_ttl: Duration) -> Vec<String> {
    let p = sender.preset;
    let mut out = Vec::new();
    if let Some(horizon) = p.retry_horizon
        && completed_ttl < horizon
    {
        out.push(format!(
            "completed_ttl {} is shorter than {}'s retry horizon ({}): late retries would be delivered again",
            humantime::format_duration(completed_ttl),
            p.name,
            humantime::format_duration(horizon)
        ));
    }
    if p.scheme != Scheme::None && !sender.is_verified() {
        out.push(format!(
            "unverified: {} signs its deliveries but no secret is configured, so forged callbacks are accepted \
             (set secret or secret_env)",
            p.name
        ));
    }
    match p.scheme {
        Scheme::WechatMp if !sender.has_aes_key => out.push(
            "no aes_key: safe-mode (encrypted) bodies have no readable id and are forwarded without dedup".to_owned(),
        ),
        Scheme::Feishu if !sender.has_aes_key => out.push(
            "no aes_key: encrypted events (an Encrypt Key set in the console) have no readable id and are not signed-checked"
                .to_owned(),
        ),
        Scheme::WechatMp | Scheme::Wecom if sender.has_aes_key && !sender.has_app_id => {
            out.push("no app_id: the appid / corpid inside decrypted messages is not checked".to_owned())
        }
        _ => {}
    }
    out
}

/// What a queued route of this sender should know: the bot answers after the sender
/// was answered, and a late attempt is older than what some bots accept.
pub fn queued_warnings(sender: &Sender) -> Vec<String> {
    let p = sender.preset;
    match p.scheme {
        Scheme::WechatMp | Scheme::Wecom => vec![format!(
            "queued {}: the sender gets the ack, so a passive reply in the bot's answer is lost; the bot must \
             reply through the API (customer service messages)",
            p.name
        )],
        Scheme::Slack | Scheme::Stripe | Scheme::StandardWebhooks => vec![format!(
            "queued {}: the signature's timestamp goes with the message, and an attempt after a retry wait is \
             older than the 5 minutes the sender's SDKs accept: a bot that checks signatures must allow it",
            p.name
        )],
        _ => Vec::new(),
    }
}

#[cfg(test)]
pub(crate) mod tests;
