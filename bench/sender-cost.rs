//! What a sender check costs per request, measured outside the network path:
//!
//! ```sh
//! cargo run --release --features bench-tools --bin sender-cost   # print µs per request
//! cargo run --release --features bench-tools --bin sender-cost -- --wrk slack 10000 > slack.lua
//! cargo run --release --features bench-tools --bin sender-cost -- --wrk wechat 10000 > wechat.lua
//! ```
//!
//! The measurement runs the exact code the handler runs before the store: the preset's
//! check (and decryption) and the key derivation, on requests built as the senders
//! build them, against the plain JSON route's key derivation alone.
//!
//! `--wrk` writes a wrk script that sends N distinct pre-signed deliveries in turn
//! (see shared-notes/bench-senders.md): a wrk script cannot compute an HMAC or AES.

use std::hint::black_box;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use aes::Aes256;
use aes::cipher::BlockModeEncrypt;
use aes::cipher::KeyIvInit;
use aes::cipher::block_padding::NoPadding;
use base64::Engine;
use dedup_gateway::Config;
use dedup_gateway::config::RouteConfig;
use dedup_gateway::key::Input;
use hmac::{KeyInit, Mac};
use sha1::{Digest, Sha1};

const SLACK_SECRET: &str = "bench-signing-secret";
const WX_TOKEN: &str = "bench-token";
const WX_AES_KEY: &str = "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG";
const WX_APP_ID: &str = "wx0123456789abcdef";

const CONFIG: &str = r#"
[[routes]]
name = "json"
path = "/json"
upstream = "http://127.0.0.1:5000"
key = ["json:/msgId"]

[[routes]]
name = "slack"
path = "/slack"
upstream = "http://127.0.0.1:5000"
preset = "slack"
secret = "bench-signing-secret"

[[routes]]
name = "wechat"
path = "/wechat"
upstream = "http://127.0.0.1:5000"
preset = "wechat-mp"
secret = "bench-token"
aes_key = "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG"
app_id = "wx0123456789abcdef"
"#;

/// One request: method POST, path with query, headers, body.
struct Req {
    target: String,
    headers: Vec<(&'static str, String)>,
    body: String,
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn slack(event_id: &str, ts: u64) -> Req {
    let body = format!(
        r#"{{"token":"XXYYZZ","team_id":"T123ABC456","api_app_id":"A123ABC456","event":{{"type":"message","channel":"C1","user":"U1","text":"hello","ts":"1700000000.000100"}},"type":"event_callback","event_id":"{event_id}","event_time":1700000000}}"#
    );
    let ts = ts.to_string();
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(SLACK_SECRET.as_bytes()).expect("key");
    for part in [b"v0:".as_slice(), ts.as_bytes(), b":", body.as_bytes()] {
        mac.update(part);
    }
    let sig = format!("v0={}", hex::encode(mac.finalize().into_bytes()));
    Req {
        target: "/slack".into(),
        headers: vec![
            ("Content-Type", "application/json".into()),
            ("X-Slack-Request-Timestamp", ts),
            ("X-Slack-Signature", sig),
        ],
        body,
    }
}

fn sha1_sorted(parts: &mut [&str]) -> String {
    parts.sort_unstable();
    let mut sha = Sha1::new();
    for p in parts.iter() {
        sha.update(p.as_bytes());
    }
    hex::encode(sha.finalize())
}

fn wechat(msg_id: u64, n: u64) -> Req {
    let lenient = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new().with_decode_allow_trailing_bits(true),
    );
    let key = lenient.decode(format!("{WX_AES_KEY}=")).expect("EncodingAESKey");
    let msg = format!(
        "<xml><ToUserName><![CDATA[gh_0123456789ab]]></ToUserName><FromUserName><![CDATA[o_user_1]]></FromUserName><CreateTime>1700000000</CreateTime><MsgType><![CDATA[text]]></MsgType><Content><![CDATA[hello]]></Content><MsgId>{msg_id}</MsgId></xml>"
    );
    let mut plain = format!("{:016x}", n.wrapping_mul(0x9e37_79b9_7f4a_7c15)).into_bytes();
    plain.extend_from_slice(&u32::try_from(msg.len()).expect("len").to_be_bytes());
    plain.extend_from_slice(msg.as_bytes());
    plain.extend_from_slice(WX_APP_ID.as_bytes());
    let pad = 32 - plain.len() % 32;
    plain.extend(std::iter::repeat_n(u8::try_from(pad).expect("pad"), pad));
    let len = plain.len();
    let enc = cbc::Encryptor::<Aes256>::new_from_slices(&key, &key[..16]).expect("key/iv");
    let encrypt = base64::engine::general_purpose::STANDARD
        .encode(enc.encrypt_padded::<NoPadding>(&mut plain, len).expect("encrypt"));
    let ts = "1700000000";
    let nonce = format!("{}", 100_000_000 + n);
    let signature = sha1_sorted(&mut [WX_TOKEN, ts, &nonce]);
    let msg_signature = sha1_sorted(&mut [WX_TOKEN, ts, &nonce, &encrypt]);
    Req {
        target: format!(
            "/wechat?signature={signature}&timestamp={ts}&nonce={nonce}&openid=o_user_1&encrypt_type=aes&msg_signature={msg_signature}"
        ),
        headers: vec![("Content-Type", "text/xml".into())],
        body: format!(
            "<xml><ToUserName><![CDATA[gh_0123456789ab]]></ToUserName><Encrypt><![CDATA[{encrypt}]]></Encrypt></xml>"
        ),
    }
}

fn head(req: &Req) -> http::request::Parts {
    let mut b = http::Request::post(req.target.as_str());
    for (k, v) in &req.headers {
        b = b.header(*k, v.as_str());
    }
    b.body(()).expect("request").into_parts().0
}

/// µs per request of what the handler does before the store call: the best of 10
/// batches (the machine is shared; the best batch is the least disturbed).
fn measure(route: &RouteConfig, req: &Req, iterations: u32) -> f64 {
    let head = head(req);
    let body = req.body.as_bytes();
    let run = || {
        let now_ms = now() * 1000;
        let verdict = match &route.sender {
            Some(s) => s.inspect(&head, body, now_ms).expect("a genuine request passes"),
            None => dedup_gateway::senders::Verdict::Plain,
        };
        let key = route
            .key
            .derive(Input {
                head: &head,
                body: verdict.key_body(body),
            })
            .expect("not refused")
            .map(|k| k.len());
        assert!(key.is_some(), "{}: a key", route.name);
        black_box(key);
    };
    for _ in 0..iterations / 10 {
        run(); // warm up
    }
    let batch = iterations / 10;
    (0..10)
        .map(|_| {
            let started = Instant::now();
            for _ in 0..batch {
                run();
            }
            started.elapsed().as_secs_f64() * 1e6 / f64::from(batch)
        })
        .fold(f64::INFINITY, f64::min)
}

/// A wrk script sending `n` pre-built deliveries in turn.
fn wrk_script(reqs: &[Req]) -> String {
    let lua = |s: &str| format!("{s:?}"); // Rust's escapes are valid Lua for this ASCII text
    let mut out = String::from(
        "-- generated by `cargo run --release --features bench-tools --bin sender-cost -- --wrk`\nlocal reqs = {\n",
    );
    for r in reqs {
        let headers: Vec<String> = r
            .headers
            .iter()
            .map(|(k, v)| format!("[{}]={}", lua(k), lua(v)))
            .collect();
        out.push_str(&format!(
            "  wrk.format(\"POST\", {}, {{{}}}, {}),\n",
            lua(&r.target),
            headers.join(", "),
            lua(&r.body)
        ));
    }
    out.push_str("}\nlocal i = 0\nrequest = function()\n  i = i % #reqs + 1\n  return reqs[i]\nend\n");
    out
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, kind, n] = args.as_slice()
        && flag == "--wrk"
    {
        let n: u64 = n.parse().expect("a count");
        let ts = now();
        let run_id = ts % 1_000_000;
        let reqs: Vec<Req> = match kind.as_str() {
            "slack" => (0..n).map(|i| slack(&format!("Ev{run_id}x{i}"), ts)).collect(),
            "wechat" => (0..n)
                .map(|i| wechat(7_300_000_000_000_000_000 + run_id * 1_000_000 + i, i))
                .collect(),
            other => panic!("unknown kind {other:?} (slack or wechat)"),
        };
        print!("{}", wrk_script(&reqs));
        return;
    }
    let config = Config::parse(CONFIG).expect("config");
    let route = |name: &str| config.routes.iter().find(|r| r.name == name).expect("route");
    let iterations = 200_000;
    let json_body = Req {
        target: "/json".into(),
        headers: vec![("Content-Type", "application/json".into())],
        body: r#"{"msgId":"7891234567890123457","content":"hello"}"#.into(),
    };
    let json = measure(route("json"), &json_body, iterations);
    let slack_us = measure(route("slack"), &slack("Ev0123ABC", now()), iterations);
    let wechat_us = measure(route("wechat"), &wechat(7_300_000_000_000_000_001, 1), iterations);
    println!(
        "per request, before the store call (best of 10 batches of {}):",
        iterations / 10
    );
    println!("  plain JSON route, key derivation:            {json:.2} µs");
    println!(
        "  slack: signature check + key:                {slack_us:.2} µs  (+{:.2} µs)",
        slack_us - json
    );
    println!(
        "  wechat-mp safe mode: verify + decrypt + key:  {wechat_us:.2} µs  (+{:.2} µs)",
        wechat_us - json
    );
}
