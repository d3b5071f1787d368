//! The senders the gateway knows, as data: one entry per sender, giving the key
//! sources, the answer a duplicate gets, the TTLs and the signature [`Scheme`]. The
//! facts behind each entry (its `source` field names where they come from) are listed
//! in the README's preset table. A sender that signs like an existing one is one
//! more entry here.

use std::time::Duration;

use super::Scheme;

/// A sender the gateway knows: everything a route with `preset = "<name>"` fills in.
#[derive(Debug)]
pub struct Preset {
    pub name: &'static str,
    /// Key sources, first that yields wins (read from the plaintext when encrypted).
    pub key: &'static [&'static str],
    /// What a duplicate is answered with: what the sender takes as "delivered".
    pub ack: Ack,
    pub completed_ttl: Duration,
    /// The longest a retry may be held: under the sender's timeout.
    pub in_flight_wait: Duration,
    /// How long after the first attempt the sender may still retry (None: not documented).
    pub retry_horizon: Option<Duration>,
    pub scheme: Scheme,
    pub handshake: Handshake,
    /// Where the facts come from.
    pub source: &'static str,
}

/// The duplicate answer.
#[derive(Debug)]
pub struct Ack {
    pub status: u16,
    pub body: &'static str,
    pub content_type: &'static str,
}

/// A handshake the sender documents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handshake {
    None,
    /// GET with `echostr`: passes through like every GET, once its signature is
    /// checked (where a token is configured).
    GetEchostr,
    /// POST JSON `{"type":"url_verification"}`: forwarded without a key, whatever
    /// `on_missing_key` says, once the scheme has let it through.
    UrlVerification,
}

pub(super) const MIN: u64 = 60;
pub(super) const HOUR: u64 = 3600;

pub(super) const fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

const fn ack(status: u16, body: &'static str, content_type: &'static str) -> Ack {
    Ack {
        status,
        body,
        content_type,
    }
}

const TEXT: &str = "text/plain; charset=utf-8";

/// The key of a WeChat or WeCom event (no message id): sender and second, then the
/// fields that tell two events of one user in one second apart, where present. Never a
/// hash of the body: a retry must not be split, nor two events merged.
const EVENT_XML: &str =
    "xml:FromUserName+xml:CreateTime+?xml:Event+?xml:EventKey+?xml:ChangeType+?xml:UserID+?xml:ExternalUserID";

/// Every preset, by name.
pub static PRESETS: &[Preset] = &[
    Preset {
        name: "wechat-mp",
        // The account's data format is XML or JSON; the same fields either way. Events
        // have no message id: the documented sender and second, with what tells two
        // events of one user in one second apart (a subscribe and a menu CLICK).
        key: &[
            "xml:MsgId",
            "xml:MsgID",
            EVENT_XML,
            "json:/MsgId",
            "json:/MsgID",
            "json:/FromUserName+json:/CreateTime+?json:/Event+?json:/EventKey+?json:/ChangeType+?json:/UserID+?json:/ExternalUserID",
        ],
        ack: ack(200, "success", TEXT),
        completed_ttl: secs(HOUR),
        in_flight_wait: secs(4),
        retry_horizon: Some(secs(20)),
        scheme: Scheme::WechatMp,
        handshake: Handshake::GetEchostr,
        source: "https://developers.weixin.qq.com/doc/service/guide/dev/push/index.html",
    },
    Preset {
        name: "wecom",
        // As wechat-mp's events; the fields besides FromUserName+CreateTime (the
        // documented rule) tell `sys` contact changes for different users apart.
        key: &["xml:MsgId", EVENT_XML],
        ack: ack(200, "", TEXT),
        completed_ttl: secs(HOUR),
        in_flight_wait: secs(4),
        retry_horizon: Some(secs(20)),
        scheme: Scheme::Wecom,
        handshake: Handshake::GetEchostr,
        source: "https://developer.work.weixin.qq.com/document/path/90238",
    },
    Preset {
        name: "wkteam",
        key: &["json:/data/newMsgId"],
        ack: ack(200, "success", TEXT),
        completed_ttl: secs(48 * HOUR),
        in_flight_wait: secs(4),
        retry_horizon: None,
        scheme: Scheme::None,
        handshake: Handshake::None,
        source: "https://wkteam.cn/docs/api-wen-dang2/xiao-xi-jie-shou/shou-xiao-xi/normalmsgInterpretation.html",
    },
    Preset {
        name: "feishu",
        key: &["json:/header/event_id", "json:/uuid"],
        ack: ack(200, r#"{"msg":"success"}"#, "application/json"),
        completed_ttl: secs(24 * HOUR),
        in_flight_wait: secs(2),
        // Retries at +15 s, +5 min, +1 h, +6 h.
        retry_horizon: Some(secs(15 + 5 * MIN + HOUR + 6 * HOUR)),
        scheme: Scheme::Feishu,
        handshake: Handshake::UrlVerification,
        source: "https://open.feishu.cn/document/server-docs/event-subscription-guide/overview",
    },
    Preset {
        name: "slack",
        key: &["json:/event_id"],
        ack: ack(200, "", TEXT),
        completed_ttl: secs(HOUR),
        in_flight_wait: secs(2),
        retry_horizon: Some(secs(6 * MIN)),
        scheme: Scheme::Slack,
        handshake: Handshake::UrlVerification,
        source: "https://api.slack.com/authentication/verifying-requests-from-slack",
    },
    Preset {
        name: "github",
        key: &["header:X-GitHub-Delivery"],
        ack: ack(200, "", TEXT),
        completed_ttl: secs(72 * HOUR),
        in_flight_wait: secs(8),
        // No automatic retries; manual or API redelivery for 3 days, same GUID.
        retry_horizon: Some(secs(72 * HOUR)),
        scheme: Scheme::GitHub,
        handshake: Handshake::None,
        source: "https://docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries",
    },
    Preset {
        name: "stripe",
        key: &["json:/id"],
        ack: ack(200, "", TEXT),
        completed_ttl: secs(96 * HOUR),
        in_flight_wait: secs(4),
        retry_horizon: Some(secs(72 * HOUR)),
        scheme: Scheme::Stripe,
        handshake: Handshake::None,
        source: "https://docs.stripe.com/webhooks",
    },
    Preset {
        name: "shopify",
        // The event id is shared by every subscription to a topic: only a fallback.
        key: &["header:X-Shopify-Webhook-Id", "header:X-Shopify-Event-Id"],
        ack: ack(200, "", TEXT),
        completed_ttl: secs(12 * HOUR),
        in_flight_wait: secs(4),
        retry_horizon: Some(secs(4 * HOUR)),
        scheme: Scheme::Shopify,
        handshake: Handshake::None,
        source: "https://shopify.dev/docs/apps/build/webhooks/verify-deliveries",
    },
    Preset {
        name: "telegram",
        key: &["json:/update_id"],
        // Must be empty: a JSON answer with "method" is executed as a Bot API call.
        ack: ack(200, "", TEXT),
        completed_ttl: secs(24 * HOUR),
        in_flight_wait: secs(4),
        retry_horizon: Some(secs(24 * HOUR)),
        scheme: Scheme::Telegram,
        handshake: Handshake::None,
        source: "https://core.telegram.org/bots/api#setwebhook",
    },
    Preset {
        name: "standard-webhooks",
        // The id of the family checked: `webhook-*`, or Svix's `svix-*`.
        key: &["header:webhook-id", "header:svix-id"],
        ack: ack(200, "", TEXT),
        completed_ttl: secs(96 * HOUR),
        in_flight_wait: secs(10),
        retry_horizon: Some(secs(75 * HOUR + 35 * MIN)),
        scheme: Scheme::StandardWebhooks,
        handshake: Handshake::None,
        source: "https://github.com/standard-webhooks/standard-webhooks/blob/main/spec/standard-webhooks.md",
    },
    Preset {
        name: "dingtalk",
        key: &["json:/msgId"],
        ack: ack(200, "", TEXT),
        completed_ttl: secs(24 * HOUR),
        in_flight_wait: secs(4),
        retry_horizon: None,
        scheme: Scheme::DingTalk,
        handshake: Handshake::None,
        source: "https://open.dingtalk.com/document/isvapp/receive-message",
    },
];

/// The preset called `name`.
pub fn preset(name: &str) -> Option<&'static Preset> {
    PRESETS.iter().find(|p| p.name == name)
}

/// The names of every preset, for error messages.
pub fn preset_names() -> String {
    let names: Vec<String> = PRESETS.iter().map(|p| format!("{:?}", p.name)).collect();
    names.join(", ")
}
