//! Deliveries as each sender builds them, signed (and encrypted) with test secrets.
//! Written from the senders' documented formats, independently of the gateway's own
//! checks (which the published vectors pin in the unit tests).

use std::time::{SystemTime, UNIX_EPOCH};

use aes::Aes256;
use aes::cipher::block_padding::{NoPadding, Pkcs7};
use aes::cipher::{BlockModeEncrypt, KeyIvInit};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use hmac::{KeyInit, Mac};
use http::Method;
use sha1::Sha1;
use sha2::{Digest, Sha256};

/// One request as a sender would send it.
#[derive(Clone, Debug)]
pub struct Req {
    pub method: Method,
    /// Path and query.
    pub target: String,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Req {
    pub fn post(target: impl Into<String>, body: impl Into<String>) -> Self {
        Req {
            method: Method::POST,
            target: target.into(),
            headers: vec![("content-type".into(), "application/json".into())],
            body: body.into(),
        }
    }

    pub fn get(target: impl Into<String>) -> Self {
        Req {
            method: Method::GET,
            target: target.into(),
            headers: vec![],
            body: String::new(),
        }
    }

    pub fn header(mut self, name: &str, value: impl Into<String>) -> Self {
        self.headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        self.headers.push((name.to_owned(), value.into()));
        self
    }

    pub fn without(mut self, name: &str) -> Self {
        self.headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        self
    }

    pub fn header_pairs(&self) -> Vec<(&str, &str)> {
        self.headers.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect()
    }
}

pub fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("clock").as_secs()
}

pub fn random_hex(n: usize) -> String {
    let mut bytes = vec![0u8; n.div_ceil(2)];
    getrandom::fill(&mut bytes).expect("random");
    hex::encode(bytes)[..n].to_owned()
}

pub fn random_digits(n: usize) -> String {
    let mut bytes = vec![0u8; n];
    getrandom::fill(&mut bytes).expect("random");
    bytes.iter().map(|b| char::from(b'0' + b % 10)).collect()
}

pub fn hmac256(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut mac = hmac::Hmac::<Sha256>::new_from_slice(key).expect("hmac key");
    for p in parts {
        mac.update(p);
    }
    mac.finalize().into_bytes().into()
}

// ---------------------------------------------------------------- WeChat and WeCom

pub const WX_TOKEN: &str = "test-wechat-token";
/// A 43-character EncodingAESKey.
pub const WX_AES_KEY: &str = "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG";
pub const WX_APP_ID: &str = "wx0123456789abcdef";
pub const WECOM_CORP_ID: &str = "ww0123456789abcdef";

pub fn sha1_sorted(parts: &[&str]) -> String {
    let mut parts = parts.to_vec();
    parts.sort_unstable();
    let mut sha = Sha1::new();
    for p in parts {
        sha.update(p.as_bytes());
    }
    hex::encode(sha.finalize())
}

/// WeChat / WeCom message encryption with a fresh random prefix.
pub fn wx_encrypt(msg: &str, receive_id: &str) -> String {
    let key = B64.decode(format!("{WX_AES_KEY}=")).or_else(|_| {
        base64::engine::GeneralPurpose::new(
            &base64::alphabet::STANDARD,
            base64::engine::GeneralPurposeConfig::new().with_decode_allow_trailing_bits(true),
        )
        .decode(format!("{WX_AES_KEY}="))
    });
    let key = key.expect("EncodingAESKey");
    let mut plain = random_hex(16).into_bytes();
    plain.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    plain.extend_from_slice(msg.as_bytes());
    plain.extend_from_slice(receive_id.as_bytes());
    let pad = 32 - plain.len() % 32;
    plain.extend(std::iter::repeat_n(pad as u8, pad));
    let len = plain.len();
    let enc = cbc::Encryptor::<Aes256>::new_from_slices(&key, &key[..16]).expect("key/iv");
    let out = enc
        .encrypt_padded::<NoPadding>(&mut plain, len)
        .expect("encrypt")
        .to_vec();
    B64.encode(out)
}

/// A WeChat Official Account message in plaintext XML (CDATA as WeChat writes it).
pub fn wx_text_message(msg_id: &str) -> String {
    format!(
        "<xml><ToUserName><![CDATA[gh_0123456789ab]]></ToUserName><FromUserName><![CDATA[o_user_1]]></FromUserName>\
         <CreateTime>1700000000</CreateTime><MsgType><![CDATA[text]]></MsgType><Content><![CDATA[hello]]></Content>\
         <MsgId>{msg_id}</MsgId></xml>"
    )
}

/// A safe-mode WeChat delivery: encrypted afresh, new nonce, new signatures.
pub fn wechat_safe(plaintext_xml: &str) -> Req {
    wechat_safe_with(plaintext_xml, WX_TOKEN, WX_APP_ID)
}

pub fn wechat_safe_with(plaintext_xml: &str, token: &str, app_id: &str) -> Req {
    let encrypt = wx_encrypt(plaintext_xml, app_id);
    let ts = now().to_string();
    let nonce = random_digits(9);
    let signature = sha1_sorted(&[token, &ts, &nonce]);
    let msg_signature = sha1_sorted(&[token, &ts, &nonce, &encrypt]);
    let body = format!(
        "<xml><ToUserName><![CDATA[gh_0123456789ab]]></ToUserName><Encrypt><![CDATA[{encrypt}]]></Encrypt></xml>"
    );
    Req::post(
        format!(
            "/hook?signature={signature}&timestamp={ts}&nonce={nonce}&openid=o_user_1&encrypt_type=aes&msg_signature={msg_signature}"
        ),
        body,
    )
    .header("content-type", "text/xml")
}

/// A plain-mode WeChat delivery: `signature` over token, timestamp, nonce.
pub fn wechat_plain(xml: &str) -> Req {
    let ts = now().to_string();
    let nonce = random_digits(9);
    let signature = sha1_sorted(&[WX_TOKEN, &ts, &nonce]);
    Req::post(
        format!("/hook?signature={signature}&timestamp={ts}&nonce={nonce}&openid=o_user_1"),
        xml,
    )
    .header("content-type", "text/xml")
}

/// WeChat's GET URL verification: `signature` over token, timestamp and nonce.
pub fn wechat_echostr() -> Req {
    let (ts, nonce) = (now().to_string(), random_digits(10));
    let signature = sha1_sorted(&[WX_TOKEN, &ts, &nonce]);
    Req::get(format!(
        "/hook?signature={signature}&echostr={}&timestamp={ts}&nonce={nonce}",
        random_digits(19)
    ))
}

/// WeCom's GET URL verification: `msg_signature` over the encrypted echostr too.
pub fn wecom_echostr() -> Req {
    let (ts, nonce) = (now().to_string(), random_digits(10));
    let echostr = wx_encrypt(&random_digits(19), WECOM_CORP_ID);
    let msg_signature = sha1_sorted(&[WX_TOKEN, &ts, &nonce, &echostr]);
    let echostr: String = form_urlencoded::byte_serialize(echostr.as_bytes()).collect();
    Req::get(format!(
        "/hook?msg_signature={msg_signature}&timestamp={ts}&nonce={nonce}&echostr={echostr}"
    ))
}

/// A WeCom delivery of a plaintext XML message, encrypted afresh.
pub fn wecom(plaintext_xml: &str) -> Req {
    let encrypt = wx_encrypt(plaintext_xml, WECOM_CORP_ID);
    let ts = now().to_string();
    let nonce = random_digits(10);
    let msg_signature = sha1_sorted(&[WX_TOKEN, &ts, &nonce, &encrypt]);
    let body = format!(
        "<xml><ToUserName><![CDATA[{WECOM_CORP_ID}]]></ToUserName><Encrypt><![CDATA[{encrypt}]]></Encrypt><AgentID><![CDATA[1000002]]></AgentID></xml>"
    );
    Req::post(
        format!("/hook?msg_signature={msg_signature}&timestamp={ts}&nonce={nonce}"),
        body,
    )
    .header("content-type", "text/xml")
}

pub fn wecom_text(msg_id: &str) -> String {
    format!(
        "<xml><ToUserName><![CDATA[{WECOM_CORP_ID}]]></ToUserName><FromUserName><![CDATA[zhangsan]]></FromUserName>\
         <CreateTime>1700000000</CreateTime><MsgType><![CDATA[text]]></MsgType><Content><![CDATA[hi]]></Content>\
         <MsgId>{msg_id}</MsgId><AgentID>1000002</AgentID></xml>"
    )
}

/// A `change_contact` event from `sys`, as WeCom sends them (no MsgId).
pub fn wecom_change_contact(user: &str, create_time: u64) -> String {
    format!(
        "<xml><ToUserName><![CDATA[{WECOM_CORP_ID}]]></ToUserName><FromUserName><![CDATA[sys]]></FromUserName>\
         <CreateTime>{create_time}</CreateTime><MsgType><![CDATA[event]]></MsgType><Event><![CDATA[change_contact]]></Event>\
         <ChangeType>update_user</ChangeType><UserID><![CDATA[{user}]]></UserID><Position><![CDATA[engineer]]></Position></xml>"
    )
}

// ---------------------------------------------------------------- Feishu

pub const FEISHU_TOKEN: &str = "test-verification-token";
pub const FEISHU_ENCRYPT_KEY: &str = "test-encrypt-key";

pub fn feishu_encrypt(plaintext: &str) -> String {
    let key: [u8; 32] = Sha256::digest(FEISHU_ENCRYPT_KEY.as_bytes()).into();
    let mut iv = [0u8; 16];
    getrandom::fill(&mut iv).expect("random");
    let enc = cbc::Encryptor::<Aes256>::new_from_slices(&key, &iv).expect("key/iv");
    let mut buf = plaintext.as_bytes().to_vec();
    let len = buf.len();
    buf.resize(len + 16, 0);
    let ct = enc.encrypt_padded::<Pkcs7>(&mut buf, len).expect("encrypt").to_vec();
    let mut out = iv.to_vec();
    out.extend_from_slice(&ct);
    B64.encode(out)
}

pub fn feishu_event(event_id: &str, token: &str) -> String {
    format!(
        r#"{{"schema":"2.0","header":{{"event_id":"{event_id}","token":"{token}","create_time":"1700000000000","event_type":"im.message.receive_v1","tenant_key":"t1","app_id":"cli_test"}},"event":{{"message":{{"content":"{{\"text\":\"hi\"}}"}}}}}}"#
    )
}

/// An encrypted, signed Feishu delivery (fresh IV and nonce).
pub fn feishu_signed(plaintext: &str) -> Req {
    let body = format!(r#"{{"encrypt":"{}"}}"#, feishu_encrypt(plaintext));
    let ts = now().to_string();
    let nonce = random_hex(16);
    let mut sha = Sha256::new();
    for p in [
        ts.as_bytes(),
        nonce.as_bytes(),
        FEISHU_ENCRYPT_KEY.as_bytes(),
        body.as_bytes(),
    ] {
        sha.update(p);
    }
    Req::post("/hook", body)
        .header("x-lark-request-timestamp", ts)
        .header("x-lark-request-nonce", nonce)
        .header("x-lark-signature", hex::encode(sha.finalize()))
}

// ---------------------------------------------------------------- HMAC senders

pub const SECRET: &str = "test-signing-secret";

pub fn slack(body: &str, ts: u64, secret: &str) -> Req {
    let ts = ts.to_string();
    let sig = hmac256(secret.as_bytes(), &[b"v0:", ts.as_bytes(), b":", body.as_bytes()]);
    Req::post("/hook", body)
        .header("x-slack-request-timestamp", ts)
        .header("x-slack-signature", format!("v0={}", hex::encode(sig)))
}

pub fn slack_event(event_id: &str) -> String {
    format!(
        r#"{{"token":"XXYYZZ","team_id":"T123ABC456","api_app_id":"A123ABC456","event":{{"type":"message","channel":"C1","user":"U1","text":"hi","ts":"1700000000.000100"}},"type":"event_callback","event_id":"{event_id}","event_time":1700000000}}"#
    )
}

pub fn github(delivery: &str, body: &str, secret: &str) -> Req {
    let sig = hmac256(secret.as_bytes(), &[body.as_bytes()]);
    Req::post("/hook", body)
        .header("x-github-event", "issues")
        .header("x-github-delivery", delivery)
        .header("x-hub-signature-256", format!("sha256={}", hex::encode(sig)))
}

pub const STRIPE_SECRET: &str = "whsec_test_stripe_secret";

pub fn stripe(event_id: &str, ts: u64, secret: &str) -> Req {
    let body = format!(r#"{{"id":"{event_id}","object":"event","type":"charge.succeeded","data":{{"object":{{}}}}}}"#);
    let t = ts.to_string();
    let sig = hmac256(secret.as_bytes(), &[t.as_bytes(), b".", body.as_bytes()]);
    Req::post("/hook", body.clone()).header("stripe-signature", format!("t={t},v1={}", hex::encode(sig)))
}

pub fn shopify(webhook_id: &str, secret: &str) -> Req {
    let body = r#"{"id":820982911946154508,"email":"jon@example.com"}"#;
    let sig = hmac256(secret.as_bytes(), &[body.as_bytes()]);
    Req::post("/hook", body)
        .header("x-shopify-topic", "orders/create")
        .header("x-shopify-webhook-id", webhook_id)
        .header("x-shopify-event-id", "shared-event-id")
        .header("x-shopify-hmac-sha256", B64.encode(sig))
}

pub const TELEGRAM_TOKEN: &str = "test_secret-Token1";

pub fn telegram(update_id: &str, token: Option<&str>) -> Req {
    let body = format!(
        r#"{{"update_id":{update_id},"message":{{"message_id":1,"date":1700000000,"chat":{{"id":1,"type":"private"}},"text":"hi"}}}}"#
    );
    let req = Req::post("/hook", body);
    match token {
        Some(t) => req.header("x-telegram-bot-api-secret-token", t),
        None => req,
    }
}

/// `whsec_` + base64 of a 24-byte key.
pub const STD_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

pub fn standard_webhook(id: &str, ts: u64, secret: &str) -> Req {
    let body = r#"{"type":"invoice.paid","data":{"amount":100}}"#;
    let key = B64.decode(secret.trim_start_matches("whsec_")).expect("secret");
    let t = ts.to_string();
    let sig = hmac256(&key, &[id.as_bytes(), b".", t.as_bytes(), b".", body.as_bytes()]);
    Req::post("/hook", body)
        .header("webhook-id", id)
        .header("webhook-timestamp", t)
        .header("webhook-signature", format!("v1,{}", B64.encode(sig)))
}

pub fn dingtalk(msg_id: &str, ts_ms: u64, secret: &str) -> Req {
    let body = format!(
        r#"{{"msgtype":"text","text":{{"content":"hi"}},"msgId":"{msg_id}","conversationId":"cid1","senderId":"s1","createAt":1700000000000}}"#
    );
    let t = ts_ms.to_string();
    let sign = hmac256(secret.as_bytes(), &[t.as_bytes(), b"\n", secret.as_bytes()]);
    Req::post("/hook", body)
        .header("timestamp", t)
        .header("sign", B64.encode(sign))
}
