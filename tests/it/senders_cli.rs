//! Presets as operators meet them: `check` shows what a preset filled in and warns,
//! config mistakes name the key (never the secret), and `key` verifies and decrypts
//! offline.

use crate::signing as s;
use crate::support::{TempFile, assert_contains_each, run, text};

const GITHUB_SECRET: &str = "gh-secret-never-printed-7f3a";

fn config(routes: &str) -> TempFile {
    TempFile::new("gateway.toml", &format!("[server]\nlisten = \"127.0.0.1:0\"\n{routes}"))
}

#[test]
fn check_shows_the_preset_what_it_filled_in_and_warns() {
    let file = config(&format!(
        r#"
[[routes]]
name = "slack"
path = "/slack"
upstream = "http://127.0.0.1:5000"
preset = "slack"
completed_ttl = "5m"

[[routes]]
name = "gh"
path = "/gh"
upstream = "http://127.0.0.1:5000"
preset = "github"
secret = "{GITHUB_SECRET}"
"#
    ));
    let out = run(&["check", "--config", file.0.to_str().expect("path")], "");
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert_contains_each(
        &stdout,
        &[
            "preset slack (filled in: key, in_flight_wait, duplicate_status, duplicate_body, duplicate_content_type)",
            "key = [json:/event_id]",
            "warning: completed_ttl 5m is shorter than slack's retry horizon (6m)",
            "warning: unverified: slack signs its deliveries but no secret is configured",
            "preset github (filled in: key, completed_ttl, in_flight_wait, duplicate_status, duplicate_body, duplicate_content_type)",
            "signature: X-Hub-Signature-256 (HMAC-SHA256); secret set, aes_key not set, app_id not set",
            "duplicate answer: 200 \"\"",
        ],
    );
    assert!(!stdout.contains("warning: unverified: github"), "{stdout}");
    assert!(!stdout.contains(GITHUB_SECRET) && !stderr.contains(GITHUB_SECRET));
}

#[test]
fn credential_mistakes_name_the_key_and_never_the_secret() {
    let file = config(
        r#"
[[routes]]
name = "a"
path = "/a"
upstream = "http://127.0.0.1:5000"
preset = "slack"
secret_env = "DEDUP_GATEWAY_TEST_NEVER_SET"

[[routes]]
name = "b"
path = "/b"
upstream = "http://127.0.0.1:5000"
preset = "wkteam"
secret = "wk-secret-never-printed"

[[routes]]
name = "c"
path = "/c"
upstream = "http://127.0.0.1:5000"
preset = "wechat-mp"
aes_key = "too-short-key-never-printed"

[[routes]]
name = "d"
path = "/d"
upstream = "http://127.0.0.1:5000"
key = ["json:/id"]
secret = "orphan-secret-never-printed"

[[routes]]
name = "e"
path = "/e"
upstream = "http://127.0.0.1:5000"
preset = "wecom"
secret = "token"

[[routes]]
name = "f"
path = "/f"
upstream = "http://127.0.0.1:5000"
preset = "slak"
"#,
    );
    let out = run(&["check", "--config", file.0.to_str().expect("path")], "");
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert_contains_each(
        &stderr,
        &[
            "routes[0].secret_env: environment variable \"DEDUP_GATEWAY_TEST_NEVER_SET\" is not set",
            "routes[1].secret: not used by preset \"wkteam\" (it sends no signature",
            "routes[2].aes_key: must be the 43-character EncodingAESKey",
            "routes[3].secret: needs a preset",
            "routes[4].aes_key: required: WeCom callbacks are always encrypted",
            "routes[5].preset: unknown preset \"slak\" (expected \"wechat-mp\", \"wecom\"",
        ],
    );
    assert!(!stderr.contains("never-printed"), "{stderr}");
}

fn key_args<'a>(file: &'a TempFile, route: &'a str, req: &'a s::Req, headers: &'a [String]) -> Vec<&'a str> {
    let mut args = vec!["key", "--config", file.0.to_str().expect("path"), "--route", route];
    for h in headers {
        args.push("--header");
        args.push(h);
    }
    if let Some((_, query)) = req.target.split_once('?') {
        args.push("--query");
        args.push(query);
    }
    args
}

#[test]
fn key_verifies_signatures_and_decrypts_offline() {
    let file = config(
        r#"
[[routes]]
name = "slack"
path = "/slack"
upstream = "http://127.0.0.1:5000"
preset = "slack"
secret = "test-signing-secret"

[[routes]]
name = "open"
path = "/open"
upstream = "http://127.0.0.1:5000"
preset = "slack"

[[routes]]
name = "wx"
path = "/wx"
upstream = "http://127.0.0.1:5000"
preset = "wechat-mp"
secret = "test-wechat-token"
aes_key = "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG"
app_id = "wx0123456789abcdef"
"#,
    );
    let req = s::slack(&s::slack_event("EvKEY1"), s::now(), s::SECRET);
    let headers: Vec<String> = req.headers.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    let out = run(&key_args(&file, "slack", &req, &headers), &req.body);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("signature ok"), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "dedup:slack:EvKEY1");

    let forged = s::slack(&s::slack_event("EvKEY1"), s::now(), "wrong");
    let headers: Vec<String> = forged.headers.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    let out = run(&key_args(&file, "slack", &forged, &headers), &forged.body);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("signature bad: X-Slack-Signature does not match"),
        "{}",
        text(&out.stderr)
    );

    let out = run(&key_args(&file, "open", &forged, &headers), &forged.body);
    assert!(
        text(&out.stderr).contains("signature not checked"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(text(&out.stdout).trim(), "dedup:open:EvKEY1");

    let wx = s::wechat_safe(&s::wx_text_message("7300000000000000123"));
    let out = run(&key_args(&file, "wx", &wx, &[]), &wx.body);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("signature ok") && stderr.contains("decrypted"),
        "{stderr}"
    );
    assert_eq!(text(&out.stdout).trim(), "dedup:wx:7300000000000000123");
}
