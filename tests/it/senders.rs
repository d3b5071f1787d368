//! Every preset through a running gateway: the first delivery is forwarded, a retry gets
//! the sender's ack as a duplicate, a bad, missing or stale signature gets 401 without a
//! single store call, and the sender's handshake reaches the upstream. Then the
//! encrypted senders (byte-identical forwarding, keys from the plaintext), WeCom `sys`
//! events, XML keys, and the same rejections against a real Redis.

use std::collections::BTreeMap;

use http::Method;

use crate::redis::store_commands;
use crate::servers::RedisServer;
use crate::signing::{self as s, Req};
use crate::support::{Cfg, Client, Resp, TestGateway, Upstream};

/// Store calls the gateway has made (every operation but the readiness ping).
fn store_calls(gw: &TestGateway) -> f64 {
    ["claim", "complete", "release", "get"]
        .iter()
        .map(|op| gw.metric(&format!("dedup_store_duration_seconds_count{{op=\"{op}\"}}")))
        .sum()
}

async fn send(client: &Client, req: &Req) -> Resp {
    client
        .send(req.method.clone(), &req.target, &req.header_pairs(), &req.body)
        .await
}

/// One preset under test: how to build its deliveries and what it must answer.
struct Case {
    preset: &'static str,
    /// Route lines besides `preset` (credentials).
    config: &'static [&'static str],
    /// A genuine delivery of message `n`, built afresh on every call.
    deliver: fn(u32) -> Req,
    /// The same delivery with a wrong signature, and without one (None: unsigned sender).
    forged: Option<fn(u32) -> Req>,
    unsigned: Option<fn(u32) -> Req>,
    /// Correctly signed, but outside the sender's timestamp window.
    stale: Option<fn(u32) -> Req>,
    /// (status, body, content type) a duplicate gets.
    ack: (u16, &'static str, &'static str),
    /// The sender's handshake, if it has one.
    handshake: Option<fn() -> Req>,
}

/// Runs the whole contract for one preset on the memory store.
async fn run(case: Case) {
    let upstream = Upstream::ok().await;
    // on_missing_key = reject: a handshake must still reach the bot.
    let mut cfg = Cfg::new()
        .route(&format!("preset = \"{}\"", case.preset))
        .route("on_missing_key = \"reject\"");
    for line in case.config {
        cfg = cfg.route(line);
    }
    let gw = TestGateway::start(&cfg, &upstream).await;
    let client = gw.client();
    let p = case.preset;

    let first = (case.deliver)(1);
    let r = send(&client, &first).await;
    assert_eq!(
        (r.status.as_u16(), r.dedup()),
        (200, "forwarded"),
        "{p}: first delivery {r:?}"
    );
    assert_eq!(upstream.count(), 1, "{p}");
    assert_eq!(
        upstream.received()[0].body,
        first.body.as_bytes(),
        "{p}: forwarded unchanged"
    );

    let r = send(&client, &(case.deliver)(1)).await;
    assert_eq!(r.dedup(), "duplicate", "{p}: retry {r:?}");
    let (status, body, content_type) = case.ack;
    assert_eq!(
        (
            r.status.as_u16(),
            r.body.as_str(),
            r.headers["content-type"].to_str().expect("ascii")
        ),
        (status, body, content_type),
        "{p}: the sender's ack"
    );
    assert_eq!(upstream.count(), 1, "{p}: a duplicate never reaches the upstream");

    let calls = store_calls(&gw);
    assert!(calls >= 3.0, "{p}: the deliveries above did use the store ({calls})");
    let mut rejected = 0.0;
    for (what, build) in [
        ("forged", case.forged),
        ("unsigned", case.unsigned),
        ("stale", case.stale),
    ] {
        let Some(build) = build else { continue };
        let r = send(&client, &build(2)).await;
        assert_eq!((r.status.as_u16(), r.dedup()), (401, "rejected"), "{p}: {what} {r:?}");
        rejected += 1.0;
    }
    assert_eq!(store_calls(&gw), calls, "{p}: a rejected delivery makes no store call");
    assert_eq!(upstream.count(), 1, "{p}: nor is it forwarded");
    assert_eq!(
        gw.metric(r#"dedup_requests_total{route="bot",outcome="rejected"}"#),
        rejected
    );
    // The forgeries did not poison message 2: the genuine one goes through.
    let r = send(&client, &(case.deliver)(2)).await;
    assert_eq!(r.dedup(), "forwarded", "{p}: genuine message after forgeries {r:?}");
    assert_eq!(upstream.count(), 2);

    if let Some(handshake) = case.handshake {
        let req = handshake();
        if req.method == Method::GET {
            // The sender signs its GET handshake: a forged one is not passed on.
            let forged = tamper_query(tamper_query(req.clone(), "signature"), "msg_signature");
            let r = send(&client, &forged).await;
            assert_eq!(
                (r.status.as_u16(), r.dedup()),
                (401, "rejected"),
                "{p}: forged handshake {r:?}"
            );
            assert_eq!(upstream.count(), 2, "{p}: a forged handshake is not forwarded");
        }
        let r = send(&client, &req).await;
        let expected = if req.method == Method::GET { "bypass" } else { "no-key" };
        assert_eq!((r.status.as_u16(), r.dedup()), (200, expected), "{p}: handshake {r:?}");
        assert_eq!(upstream.count(), 3, "{p}: the handshake reached the upstream");
        assert_eq!(upstream.received()[2].body, req.body.as_bytes());
    }
}

const WECHAT: &[&str] = &[
    "secret = \"test-wechat-token\"",
    "aes_key = \"abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG\"",
    "app_id = \"wx0123456789abcdef\"",
];

/// 19-digit ids, as WeChat and WeCom use.
fn wx_id(n: u32) -> String {
    format!("{}", 7_300_000_000_000_000_000u64 + u64::from(n))
}

fn tamper_query(req: Req, param: &str) -> Req {
    let target = req
        .target
        .split('&')
        .map(|kv| match kv.split_once('=') {
            Some((k, _)) if k == param || k.ends_with(&format!("?{param}")) => format!("{k}={}", "0".repeat(40)),
            _ => kv.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("&");
    Req { target, ..req }
}

fn drop_query(req: Req, param: &str) -> Req {
    let (path, query) = req.target.split_once('?').unwrap_or((&req.target, ""));
    let kept: Vec<&str> = query
        .split('&')
        .filter(|kv| !kv.starts_with(&format!("{param}=")))
        .collect();
    Req {
        target: format!("{path}?{}", kept.join("&")),
        ..req
    }
}

fn wechat_mp_safe_mode_case() -> Case {
    Case {
        preset: "wechat-mp",
        config: WECHAT,
        deliver: |n| s::wechat_safe(&s::wx_text_message(&wx_id(n))),
        forged: Some(|n| tamper_query(s::wechat_safe(&s::wx_text_message(&wx_id(n))), "msg_signature")),
        unsigned: Some(|n| drop_query(s::wechat_safe(&s::wx_text_message(&wx_id(n))), "msg_signature")),
        stale: None, // WeChat documents no window
        ack: (200, "success", "text/plain; charset=utf-8"),
        handshake: Some(s::wechat_echostr),
    }
}

#[tokio::test]
async fn wechat_mp_safe_mode() {
    run(wechat_mp_safe_mode_case()).await;
}

fn wecom_case() -> Case {
    Case {
        preset: "wecom",
        config: &[
            "secret = \"test-wechat-token\"",
            "aes_key = \"abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG\"",
            "app_id = \"ww0123456789abcdef\"",
        ],
        deliver: |n| s::wecom(&s::wecom_text(&wx_id(n))),
        forged: Some(|n| tamper_query(s::wecom(&s::wecom_text(&wx_id(n))), "msg_signature")),
        unsigned: Some(|n| drop_query(s::wecom(&s::wecom_text(&wx_id(n))), "msg_signature")),
        stale: None,
        ack: (200, "", "text/plain; charset=utf-8"),
        handshake: Some(s::wecom_echostr),
    }
}

#[tokio::test]
async fn wecom() {
    run(wecom_case()).await;
}

fn wkteam_has_no_signature_and_keeps_every_digit_case() -> Case {
    Case {
        preset: "wkteam",
        config: &[],
        deliver: |n| {
            Req::post(
                "/hook",
                format!(
                    r#"{{"wcId":"wxid_bot","account":"a","messageType":"60001","data":{{"fromUser":"wxid_u","msgId":1,"newMsgId":{},"msgType":1,"timestamp":1700000000,"content":"hi","self":false}}}}"#,
                    9_007_199_254_740_994u64 - u64::from(n) // 2^53+1, then 2^53: f64 would merge them
                ),
            )
        },
        forged: None,
        unsigned: None,
        stale: None,
        ack: (200, "success", "text/plain; charset=utf-8"),
        handshake: None,
    }
}

#[tokio::test]
async fn wkteam_has_no_signature_and_keeps_every_digit() {
    run(wkteam_has_no_signature_and_keeps_every_digit_case()).await;
}

fn feishu_encrypted_and_signed_case() -> Case {
    Case {
        preset: "feishu",
        config: &["secret = \"test-verification-token\"", "aes_key = \"test-encrypt-key\""],
        deliver: |n| s::feishu_signed(&s::feishu_event(&format!("ev-{n}"), s::FEISHU_TOKEN)),
        forged: Some(|n| {
            s::feishu_signed(&s::feishu_event(&format!("ev-{n}"), s::FEISHU_TOKEN))
                .header("x-lark-signature", "0".repeat(64))
        }),
        unsigned: Some(|n| {
            s::feishu_signed(&s::feishu_event(&format!("ev-{n}"), s::FEISHU_TOKEN)).without("x-lark-signature")
        }),
        stale: None, // Feishu documents no window
        ack: (200, r#"{"msg":"success"}"#, "application/json"),
        // The handshake is encrypted but never signed.
        handshake: Some(|| {
            let plain = format!(
                r#"{{"challenge":"ch-1","token":"{}","type":"url_verification"}}"#,
                s::FEISHU_TOKEN
            );
            Req::post("/hook", format!(r#"{{"encrypt":"{}"}}"#, s::feishu_encrypt(&plain)))
        }),
    }
}

#[tokio::test]
async fn feishu_encrypted_and_signed() {
    run(feishu_encrypted_and_signed_case()).await;
}

fn slack_case() -> Case {
    Case {
        preset: "slack",
        config: &["secret = \"test-signing-secret\""],
        deliver: |n| s::slack(&s::slack_event(&format!("Ev{n}")), s::now(), s::SECRET),
        forged: Some(|n| s::slack(&s::slack_event(&format!("Ev{n}")), s::now(), "not-the-secret")),
        unsigned: Some(|n| {
            s::slack(&s::slack_event(&format!("Ev{n}")), s::now(), s::SECRET).without("x-slack-signature")
        }),
        stale: Some(|n| s::slack(&s::slack_event(&format!("Ev{n}")), s::now() - 301, s::SECRET)),
        ack: (200, "", "text/plain; charset=utf-8"),
        handshake: Some(|| {
            s::slack(
                r#"{"token":"Jhj5dZrVaK7ZwHHjRyZWjbDl","challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P","type":"url_verification"}"#,
                s::now(),
                s::SECRET,
            )
        }),
    }
}

#[tokio::test]
async fn slack() {
    run(slack_case()).await;
}

fn github_case() -> Case {
    Case {
        preset: "github",
        config: &["secret = \"test-signing-secret\""],
        deliver: |n| {
            s::github(
                &format!("72d3162e-cc78-11e3-81ab-4c9367dc095{n}"),
                r#"{"action":"opened"}"#,
                s::SECRET,
            )
        },
        forged: Some(|n| {
            s::github(
                &format!("72d3162e-cc78-11e3-81ab-4c9367dc095{n}"),
                r#"{"action":"opened"}"#,
                "x",
            )
        }),
        unsigned: Some(|n| {
            s::github(
                &format!("72d3162e-cc78-11e3-81ab-4c9367dc095{n}"),
                r#"{"action":"opened"}"#,
                s::SECRET,
            )
            .without("x-hub-signature-256")
            .header("x-hub-signature", "sha1=0000000000000000000000000000000000000000")
        }),
        stale: None,
        ack: (200, "", "text/plain; charset=utf-8"),
        handshake: None,
    }
}

#[tokio::test]
async fn github() {
    run(github_case()).await;
}

fn stripe_case() -> Case {
    Case {
        preset: "stripe",
        config: &["secret = \"whsec_test_stripe_secret\""],
        deliver: |n| s::stripe(&format!("evt_{n}"), s::now(), s::STRIPE_SECRET),
        forged: Some(|n| s::stripe(&format!("evt_{n}"), s::now(), "whsec_other")),
        unsigned: Some(|n| s::stripe(&format!("evt_{n}"), s::now(), s::STRIPE_SECRET).without("stripe-signature")),
        stale: Some(|n| s::stripe(&format!("evt_{n}"), s::now() - 301, s::STRIPE_SECRET)),
        ack: (200, "", "text/plain; charset=utf-8"),
        handshake: None,
    }
}

#[tokio::test]
async fn stripe() {
    run(stripe_case()).await;
}

fn shopify_case() -> Case {
    Case {
        preset: "shopify",
        config: &["secret = \"test-signing-secret\""],
        deliver: |n| s::shopify(&format!("b54557e4-bdd9-4b37-8a5f-bf7d70bcd04{n}"), s::SECRET),
        forged: Some(|n| s::shopify(&format!("b54557e4-bdd9-4b37-8a5f-bf7d70bcd04{n}"), "wrong")),
        unsigned: Some(|n| {
            s::shopify(&format!("b54557e4-bdd9-4b37-8a5f-bf7d70bcd04{n}"), s::SECRET).without("x-shopify-hmac-sha256")
        }),
        stale: None,
        ack: (200, "", "text/plain; charset=utf-8"),
        handshake: None,
    }
}

#[tokio::test]
async fn shopify() {
    run(shopify_case()).await;
}

fn telegram_case() -> Case {
    Case {
        preset: "telegram",
        config: &["secret = \"test_secret-Token1\""],
        deliver: |n| s::telegram(&format!("{}", 500_000_000 + n), Some(s::TELEGRAM_TOKEN)),
        forged: Some(|n| s::telegram(&format!("{}", 500_000_000 + n), Some("test_secret-Token2"))),
        unsigned: Some(|n| s::telegram(&format!("{}", 500_000_000 + n), None)),
        stale: None,
        // Empty: a JSON body would be executed as a Bot API call.
        ack: (200, "", "text/plain; charset=utf-8"),
        handshake: None,
    }
}

#[tokio::test]
async fn telegram() {
    run(telegram_case()).await;
}

fn standard_webhooks_case() -> Case {
    Case {
        preset: "standard-webhooks",
        config: &["secret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\""],
        deliver: |n| s::standard_webhook(&format!("msg_{n}"), s::now(), s::STD_SECRET),
        forged: Some(|n| s::standard_webhook(&format!("msg_{n}"), s::now(), "whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")),
        unsigned: Some(|n| {
            s::standard_webhook(&format!("msg_{n}"), s::now(), s::STD_SECRET).without("webhook-signature")
        }),
        stale: Some(|n| s::standard_webhook(&format!("msg_{n}"), s::now() + 301, s::STD_SECRET)),
        ack: (200, "", "text/plain; charset=utf-8"),
        handshake: None,
    }
}

#[tokio::test]
async fn standard_webhooks() {
    run(standard_webhooks_case()).await;
}

fn dingtalk_case() -> Case {
    Case {
        preset: "dingtalk",
        config: &["secret = \"test-signing-secret\""],
        deliver: |n| s::dingtalk(&format!("msg{n}"), s::now() * 1000, s::SECRET),
        forged: Some(|n| s::dingtalk(&format!("msg{n}"), s::now() * 1000, "other")),
        unsigned: Some(|n| s::dingtalk(&format!("msg{n}"), s::now() * 1000, s::SECRET).without("sign")),
        stale: Some(|n| s::dingtalk(&format!("msg{n}"), (s::now() - 3601) * 1000, s::SECRET)),
        ack: (200, "", "text/plain; charset=utf-8"),
        handshake: None,
    }
}

#[tokio::test]
async fn dingtalk() {
    run(dingtalk_case()).await;
}

#[tokio::test]
async fn wkteam_new_msg_id_keeps_all_19_digits() {
    let upstream = Upstream::ok().await;
    let gw = TestGateway::start(&Cfg::new().route("preset = \"wkteam\""), &upstream).await;
    let client = gw.client();
    for id in ["9007199254740993", "1234567890123456789"] {
        let body = format!(r#"{{"messageType":"60001","data":{{"msgId":1,"newMsgId":{id},"content":"hi"}}}}"#);
        assert_eq!(client.post("/hook", &body).await.dedup(), "forwarded");
        let key = format!("dedup:bot:{id}");
        assert!(
            dedup_gateway::store::Store::get(&gw.gw.store, &key)
                .await
                .expect("store")
                .is_some(),
            "{key}"
        );
    }
    let rounded = r#"{"data":{"newMsgId":9007199254740992}}"#;
    assert_eq!(
        client.post("/hook", rounded).await.dedup(),
        "forwarded",
        "2^53 is another message"
    );
}

// ---------------------------------------------------------------- encrypted senders

fn wechat_cfg() -> Cfg {
    WECHAT
        .iter()
        .fold(Cfg::new().route("preset = \"wechat-mp\""), |c, l| c.route(l))
}

#[tokio::test]
async fn wechat_retries_encrypted_afresh_dedup_on_the_msg_id_and_reach_the_bot_unchanged() {
    let upstream = Upstream::ok().await;
    let gw = TestGateway::start(&wechat_cfg(), &upstream).await;
    let client = gw.client();
    let id = "7301234567890123457"; // 19 digits, above 2^63 / 2
    let first = s::wechat_safe(&s::wx_text_message(id));
    let retry = s::wechat_safe(&s::wx_text_message(id));
    assert_ne!(first.body, retry.body, "the retry is encrypted afresh");
    assert_ne!(first.target, retry.target, "with a new nonce and signature");
    assert_eq!(send(&client, &first).await.dedup(), "forwarded");
    assert_eq!(send(&client, &retry).await.dedup(), "duplicate");
    let received = upstream.received();
    assert_eq!(received.len(), 1);
    assert_eq!(
        received[0].body,
        first.body.as_bytes(),
        "the original bytes, not the plaintext"
    );
    assert_eq!(received[0].uri, first.target, "the signature query too");
    // The key holds every digit of the decrypted MsgId.
    let stored = dedup_gateway::store::Store::get(&gw.gw.store, &format!("dedup:bot:{id}")).await;
    assert!(stored.expect("store").is_some(), "keyed on the full 19-digit MsgId");
    // One digit away is another message.
    let other = s::wechat_safe(&s::wx_text_message("7301234567890123456"));
    assert_eq!(send(&client, &other).await.dedup(), "forwarded");
    // Events (no MsgId) key on FromUserName+CreateTime and the event fields, from the
    // plaintext.
    let event = "<xml><ToUserName><![CDATA[gh_0123456789ab]]></ToUserName><FromUserName><![CDATA[o_user_1]]></FromUserName><CreateTime>1700000001</CreateTime><MsgType><![CDATA[event]]></MsgType><Event><![CDATA[subscribe]]></Event></xml>";
    assert_eq!(send(&client, &s::wechat_safe(event)).await.dedup(), "forwarded");
    assert_eq!(send(&client, &s::wechat_safe(event)).await.dedup(), "duplicate");
    let stored = dedup_gateway::store::Store::get(&gw.gw.store, "dedup:bot:o_user_1+1700000001+subscribe").await;
    assert!(stored.expect("store").is_some());
}

#[tokio::test]
async fn wechat_rejects_another_app_an_encrypt_type_without_encrypt_and_refuses_a_doctype() {
    let upstream = Upstream::ok().await;
    let gw = TestGateway::start(&wechat_cfg(), &upstream).await;
    let client = gw.client();
    let msg = s::wx_text_message("7300000000000000099");
    let other_app = s::wechat_safe_with(&msg, s::WX_TOKEN, "wxffffffffffffffff");
    let r = send(&client, &other_app).await;
    assert_eq!((r.status.as_u16(), r.dedup()), (401, "rejected"), "{r:?}");
    // Says it is encrypted, and is not.
    let plain = s::wechat_plain(&msg);
    let claims_aes = Req {
        target: format!("{}&encrypt_type=aes&msg_signature=00", plain.target),
        ..plain
    };
    let r = send(&client, &claims_aes).await;
    assert_eq!((r.status.as_u16(), r.dedup()), (401, "rejected"), "{r:?}");
    let bomb = Req {
        body: format!(
            "<!DOCTYPE xml [<!ENTITY a \"aaaaaaaaaa\">]>{}",
            s::wechat_safe(&msg).body
        ),
        ..s::wechat_safe(&msg)
    };
    let r = send(&client, &bomb).await;
    assert_eq!((r.status.as_u16(), r.dedup()), (400, "bad-request"), "{r:?}");
    assert_eq!(store_calls(&gw), 0.0);
    assert_eq!(upstream.count(), 0);
    assert_eq!(
        gw.metric(r#"dedup_requests_total{route="bot",outcome="bad_request"}"#),
        1.0
    );
}

#[tokio::test]
async fn wechat_plain_mode_checks_the_query_signature() {
    let upstream = Upstream::ok().await;
    let cfg = Cfg::new()
        .route("preset = \"wechat-mp\"")
        .route("secret = \"test-wechat-token\"");
    let gw = TestGateway::start(&cfg, &upstream).await;
    let client = gw.client();
    let msg = s::wx_text_message("7300000000000000001");
    assert_eq!(send(&client, &s::wechat_plain(&msg)).await.dedup(), "forwarded");
    assert_eq!(send(&client, &s::wechat_plain(&msg)).await.dedup(), "duplicate");
    let forged = tamper_query(s::wechat_plain(&s::wx_text_message("7300000000000000002")), "signature");
    assert_eq!(send(&client, &forged).await.status, 401);
    assert_eq!(upstream.count(), 1);
}

/// The official message-push page's worked examples, for an account whose data format
/// is JSON: Token `AAAAA`, EncodingAESKey `A` x 43, appid `wxba5fad812f8e6fb9`. Its
/// events have no `MsgId`, so they key on `FromUserName+CreateTime`.
#[tokio::test]
async fn wechat_json_data_format_with_the_official_examples() {
    const USER: &str = "o9AgO5Kd5ggOC-bXrbNODIiE3bGY";
    const ENCRYPT: &str = "+qdx1OKCy+5JPCBFWw70tm0fJGb2Jmeia4FCB7kao+/Q5c/ohsOzQHi8khUOb05JCpj0JB4RvQMkUyus8TPxLKJGQqcvZqzDpVzazhZv6JsXUnnR8XGT740XgXZUXQ7vJVnAG+tE8NUd4yFyjPy7GgiaviNrlCTj+l5kdfMuFUPpRSrfMZuMcp3Fn2Pede2IuQrKEYwKSqFIZoNqJ4M8EajAsjLY2km32IIjdf8YL/P50F7mStwntrA2cPDrM1kb6mOcfBgRtWygb3VIYnSeOBrebufAlr7F9mFUPAJGj04=";
    let upstream = Upstream::ok().await;
    let safe_cfg = Cfg::new()
        .route("preset = \"wechat-mp\"")
        .route("secret = \"AAAAA\"")
        .route(&format!("aes_key = \"{}\"", "A".repeat(43)))
        .route("app_id = \"wxba5fad812f8e6fb9\"");
    let gw = TestGateway::start(&safe_cfg, &upstream).await;
    let client = gw.client();
    let safe = Req::post(
        format!(
            "/hook?signature=6c5c811b55cc85e0e1b54100749188c20beb3f5d&timestamp=1714112445&nonce=415670741\
             &openid={USER}&encrypt_type=aes&msg_signature=046e02f8204d34f8ba5fa3b1db94908f3df2e9b3"
        ),
        format!("{{\n    \"ToUserName\": \"gh_97417a04a28d\",\n    \"Encrypt\": \"{ENCRYPT}\"\n}}"),
    )
    .header("content-type", "application/json");
    let r = send(&client, &safe).await;
    assert_eq!((r.status.as_u16(), r.dedup()), (200, "forwarded"), "{r:?}");
    let r = send(&client, &safe).await;
    assert_eq!((r.dedup(), r.body.as_str()), ("duplicate", "success"), "{r:?}");
    assert_eq!(upstream.received()[0].body, safe.body.as_bytes(), "the original bytes");
    let key = format!("dedup:bot:{USER}+1714112445+debug_demo");
    let stored = dedup_gateway::store::Store::get(&gw.gw.store, &key).await;
    assert!(stored.expect("store").is_some(), "keyed from the decrypted JSON");
    let forged = tamper_query(safe.clone(), "msg_signature");
    assert_eq!(send(&client, &forged).await.status, 401);
    assert_eq!(upstream.count(), 1);

    let plain_cfg = Cfg::new().route("preset = \"wechat-mp\"").route("secret = \"AAAAA\"");
    let gw = TestGateway::start(&plain_cfg, &upstream).await;
    let client = gw.client();
    let plain = Req::post(
        "/hook?signature=899cf89e464efb63f54ddac96b0a0a235f53aa78&timestamp=1714037059&nonce=486452656",
        format!(
            "{{\n    \"ToUserName\": \"gh_97417a04a28d\",\n    \"FromUserName\": \"{USER}\",\n    \
             \"CreateTime\": 1714037059,\n    \"MsgType\": \"event\",\n    \"Event\": \"debug_demo\",\n    \
             \"debug_str\": \"hello world\"\n}}"
        ),
    )
    .header("content-type", "application/json");
    assert_eq!(send(&client, &plain).await.dedup(), "forwarded");
    assert_eq!(send(&client, &plain).await.dedup(), "duplicate");
    let key = format!("dedup:bot:{USER}+1714037059+debug_demo");
    let stored = dedup_gateway::store::Store::get(&gw.gw.store, &key).await;
    assert!(stored.expect("store").is_some(), "keyed from the JSON body");
    assert_eq!(upstream.count(), 2);
}

#[tokio::test]
async fn wecom_sys_events_for_different_users_in_the_same_second_are_both_forwarded() {
    let upstream = Upstream::ok().await;
    let cfg = Cfg::new()
        .route("preset = \"wecom\"")
        .route("secret = \"test-wechat-token\"")
        .route("aes_key = \"abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG\"");
    let gw = TestGateway::start(&cfg, &upstream).await;
    let client = gw.client();
    let second = 1_700_000_123;
    let zhang = s::wecom_change_contact("zhangsan", second);
    let li = s::wecom_change_contact("lisi", second);
    assert_eq!(send(&client, &s::wecom(&zhang)).await.dedup(), "forwarded");
    assert_eq!(
        send(&client, &s::wecom(&li)).await.dedup(),
        "forwarded",
        "another user, same second"
    );
    assert_eq!(
        send(&client, &s::wecom(&zhang)).await.dedup(),
        "duplicate",
        "a retry, re-encrypted"
    );
    assert_eq!(upstream.count(), 2);
    let key = "dedup:bot:sys+1700000123+change_contact+update_user+zhangsan";
    assert!(
        dedup_gateway::store::Store::get(&gw.gw.store, key)
            .await
            .expect("store")
            .is_some()
    );
}

#[tokio::test]
async fn feishu_with_a_token_only_checks_the_token_and_its_plain_handshake() {
    let upstream = Upstream::ok().await;
    let cfg = Cfg::new()
        .route("preset = \"feishu\"")
        .route("secret = \"test-verification-token\"");
    let gw = TestGateway::start(&cfg, &upstream).await;
    let client = gw.client();
    let event = s::feishu_event("ev-plain", s::FEISHU_TOKEN);
    assert_eq!(client.post("/hook", &event).await.dedup(), "forwarded");
    assert_eq!(client.post("/hook", &event).await.dedup(), "duplicate");
    let forged = s::feishu_event("ev-forged", "guessed-token");
    assert_eq!(client.post("/hook", &forged).await.status, 401);
    let handshake = format!(
        r#"{{"challenge":"c1","token":"{}","type":"url_verification"}}"#,
        s::FEISHU_TOKEN
    );
    assert_eq!(client.post("/hook", &handshake).await.dedup(), "no-key");
    let bad_handshake = r#"{"challenge":"c1","token":"nope","type":"url_verification"}"#;
    assert_eq!(client.post("/hook", bad_handshake).await.status, 401);
    assert_eq!(upstream.count(), 2);
}

// ---------------------------------------------------------------- xml keys

#[tokio::test]
async fn xml_cdata_and_plain_text_are_one_message_and_a_doctype_is_refused() {
    let upstream = Upstream::ok().await;
    let cfg = Cfg::new().route("key = [\"xml:MsgId\", \"xml:FromUserName+xml:CreateTime\"]");
    let gw = TestGateway::start(&cfg, &upstream).await;
    let client = gw.client();
    let cdata = "<xml><MsgId><![CDATA[1234567890123456789]]></MsgId></xml>";
    let plain = "<xml>\n  <MsgId>1234567890123456789</MsgId>\n</xml>";
    assert_eq!(client.post("/hook", cdata).await.dedup(), "forwarded");
    assert_eq!(client.post("/hook", plain).await.dedup(), "duplicate");
    let event = "<xml><FromUserName>o_a&amp;b</FromUserName><CreateTime>1700000000</CreateTime></xml>";
    assert_eq!(client.post("/hook", event).await.dedup(), "forwarded");
    assert!(
        dedup_gateway::store::Store::get(&gw.gw.store, "dedup:bot:o_a&b+1700000000")
            .await
            .expect("store")
            .is_some()
    );
    let calls = store_calls(&gw);
    let forwarded = upstream.count();
    for bomb in [
        "<?xml version=\"1.0\"?><!DOCTYPE lolz [<!ENTITY lol \"lol\"><!ENTITY lol2 \"&lol;&lol;&lol;&lol;\">]><xml><MsgId>&lol2;</MsgId></xml>",
        "<!DOCTYPE xml SYSTEM \"http://127.0.0.1:1/evil.dtd\"><xml><MsgId>1</MsgId></xml>",
    ] {
        let r = client.post("/hook", bomb).await;
        assert_eq!((r.status.as_u16(), r.dedup()), (400, "bad-request"), "{r:?}");
    }
    assert_eq!(store_calls(&gw), calls, "no store call for a refused body");
    assert_eq!(upstream.count(), forwarded, "and no forward");
    // Malformed XML: no key, then on_missing_key (forward).
    let r = client.post("/hook", "<xml><MsgId>1</MsgId>").await;
    assert_eq!(r.dedup(), "no-key");
}

// ---------------------------------------------------------------- against Redis

/// For every signed preset: forged, unsigned and stale deliveries leave Redis's command
/// counters untouched, while a genuine one does move them.
#[tokio::test]
async fn rejected_deliveries_send_no_command_to_redis() {
    let server = RedisServer::start().await;
    let cases = [
        wechat_mp_safe_mode_case(),
        wecom_case(),
        feishu_encrypted_and_signed_case(),
        slack_case(),
        github_case(),
        stripe_case(),
        shopify_case(),
        telegram_case(),
        standard_webhooks_case(),
        dingtalk_case(),
    ];
    for case in cases {
        let preset = case.preset;
        let upstream = Upstream::ok().await;
        let mut cfg = Cfg::new()
            .store("backend = \"redis\"")
            .store(&format!("url = \"{}\"", server.url()))
            .store(&format!("key_prefix = \"{preset}:\""))
            .route(&format!("preset = \"{preset}\""));
        for line in case.config {
            cfg = cfg.route(line);
        }
        let gw = TestGateway::start(&cfg, &upstream).await;
        let client = gw.client();
        let before = server.command_calls();
        let mut sent = 0;
        for build in [case.forged, case.unsigned, case.stale].into_iter().flatten() {
            let r = send(&client, &build(9)).await;
            assert_eq!((r.status.as_u16(), r.dedup()), (401, "rejected"), "{preset}: {r:?}");
            sent += 1;
        }
        assert!(sent >= 2, "{preset}: forged and unsigned at least");
        let after = server.command_calls();
        assert_eq!(
            store_commands(&before, &after),
            BTreeMap::new(),
            "{preset}: no Redis command"
        );
        assert_eq!(upstream.count(), 0, "{preset}");
        assert_eq!(send(&client, &(case.deliver)(1)).await.dedup(), "forwarded", "{preset}");
        assert!(
            !store_commands(&after, &server.command_calls()).is_empty(),
            "{preset}: a genuine delivery does reach Redis (the measure can fail)"
        );
        gw.stop().await;
    }
}

/// A user who subscribes and clicks a menu within one second sends two events with the
/// same FromUserName+CreateTime: both reach the bot, each retry is a duplicate, and the
/// stored keys are the readable fields (WeChat; WeCom contact changes are above).
#[tokio::test]
async fn two_wechat_events_of_one_user_in_one_second_are_both_forwarded() {
    let upstream = Upstream::ok().await;
    let gw = TestGateway::start(&wechat_cfg(), &upstream).await;
    let client = gw.client();
    let event = |inner: &str| {
        format!(
            "<xml><ToUserName><![CDATA[gh_0123456789ab]]></ToUserName><FromUserName><![CDATA[o_user_7]]></FromUserName>\
             <CreateTime>1700000777</CreateTime><MsgType><![CDATA[event]]></MsgType>{inner}</xml>"
        )
    };
    let subscribe = event("<Event><![CDATA[subscribe]]></Event>");
    let click = event("<Event><![CDATA[CLICK]]></Event><EventKey><![CDATA[V1001_TODAY_MUSIC]]></EventKey>");
    for (xml, status) in [
        (&subscribe, "forwarded"),
        (&click, "forwarded"),
        (&click, "duplicate"),
        (&subscribe, "duplicate"),
    ] {
        assert_eq!(send(&client, &s::wechat_safe(xml)).await.dedup(), status);
    }
    assert_eq!(upstream.count(), 2);
    for key in [
        "dedup:bot:o_user_7+1700000777+subscribe",
        "dedup:bot:o_user_7+1700000777+CLICK+V1001_TODAY_MUSIC",
    ] {
        let stored = dedup_gateway::store::Store::get(&gw.gw.store, key).await;
        assert!(stored.expect("store").is_some(), "{key}");
    }
}

/// The console shows an EncodingAESKey whatever the mode, so a route has it while the
/// account pushes plaintext: those pushes are checked by `signature` and forwarded.
/// `require_encryption` refuses them (401, nothing stored), encrypted ones still pass.
#[tokio::test]
async fn a_route_with_aes_key_takes_plaintext_pushes_unless_it_requires_encryption() {
    let upstream = Upstream::ok().await;
    let gw = TestGateway::start(&wechat_cfg(), &upstream).await;
    let client = gw.client();
    let msg = s::wx_text_message("7300000000000000101");
    assert_eq!(send(&client, &s::wechat_plain(&msg)).await.dedup(), "forwarded");
    assert_eq!(
        send(&client, &s::wechat_safe(&msg)).await.dedup(),
        "duplicate",
        "one message, either mode"
    );
    let forged = tamper_query(s::wechat_plain(&s::wx_text_message("7300000000000000102")), "signature");
    assert_eq!(send(&client, &forged).await.status, 401);

    let strict = TestGateway::start(&wechat_cfg().route("require_encryption = true"), &upstream).await;
    let client = strict.client();
    let msg = s::wx_text_message("7300000000000000103");
    let r = send(&client, &s::wechat_plain(&msg)).await;
    assert_eq!((r.status.as_u16(), r.dedup()), (401, "rejected"), "{r:?}");
    assert_eq!(store_calls(&strict), 0.0);
    assert_eq!(send(&client, &s::wechat_safe(&msg)).await.dedup(), "forwarded");
    assert_eq!(upstream.count(), 2);
}
