//! Unit tests of [`crate::senders`].

use super::*;
use crate::key::Alternative;
use presets::{HOUR, secs};

/// A request head with these headers, for the checks' unit tests.
pub fn delivery(headers: &[(&str, &str)], uri: &str) -> http::request::Parts {
    let mut req = http::Request::post(uri);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.body(()).expect("request").into_parts().0
}

#[test]
fn every_preset_parses_and_has_a_unique_name() {
    for (i, p) in PRESETS.iter().enumerate() {
        for source in p.key {
            assert!(Alternative::parse(source).is_ok(), "{}: {source}", p.name);
        }
        assert!(http::StatusCode::from_u16(p.ack.status).is_ok());
        assert!(http::HeaderValue::from_str(p.ack.content_type).is_ok());
        assert!(p.in_flight_wait <= secs(10), "{}", p.name);
        assert!(p.completed_ttl >= secs(HOUR), "{}", p.name);
        assert!(PRESETS[..i].iter().all(|q| q.name != p.name));
    }
    for name in [
        "wechat-mp",
        "wecom",
        "wkteam",
        "feishu",
        "slack",
        "github",
        "stripe",
        "shopify",
        "telegram",
        "standard-webhooks",
        "dingtalk",
    ] {
        assert!(preset(name).is_some(), "{name}");
    }
}

#[test]
fn route_settings_win_over_the_preset_which_wins_over_defaults() {
    let cfg = crate::Config::parse(
        r#"
        [defaults]
        completed_ttl = "2h"
        duplicate_body = "from defaults"
        key = ["json:/msgId"]
        [[routes]]
        name = "a"
        path = "/a"
        upstream = "http://127.0.0.1:1"
        preset = "slack"
        in_flight_wait = "1s"
        "#,
    )
    .expect("config");
    let r = &cfg.routes[0];
    let sender = r.sender.as_ref().expect("sender");
    assert_eq!(r.policy.in_flight_wait, secs(1), "the route's own value");
    assert_eq!(r.policy.completed_ttl, secs(HOUR), "the preset's, over [defaults]");
    assert_eq!(&r.policy.duplicate.body[..], b"");
    let keys: Vec<&str> = r.key.alternatives().iter().map(|a| a.text()).collect();
    assert_eq!(keys, vec!["json:/event_id"]);
    assert!(!sender.filled.contains(&"in_flight_wait"));
    assert!(sender.filled.contains(&"completed_ttl"));
    assert!(!sender.is_verified());
    assert!(format!("{cfg:?}").contains("preset: \"slack\""));
    let with_secret = crate::Config::parse(
        r#"
        [[routes]]
        name = "gh"
        path = "/gh"
        upstream = "http://127.0.0.1:1"
        preset = "github"
        secret = "hunter2-never-printed"
        "#,
    )
    .expect("config");
    assert!(!format!("{with_secret:?}").contains("hunter2"));
    assert!(with_secret.routes[0].sender.as_ref().is_some_and(Sender::is_verified));
}

#[test]
fn windows_are_inclusive_at_the_edge() {
    assert_eq!(within(1000, 1300, 300, 300, "w"), Ok(()));
    assert_eq!(within(1000, 700, 300, 300, "w"), Ok(()));
    assert!(within(1000, 1301, 300, 300, "w").is_err());
    assert!(within(1000, 699, 300, 300, "w").is_err());
    assert!(within(i64::MIN, i64::MAX, 300, 300, "w").is_err());
}

#[test]
fn secrets_that_cannot_be_checked_are_refused() {
    let wkteam = preset("wkteam").expect("wkteam");
    let problems = Sender::new(
        wkteam,
        Credentials {
            secret: Some(Secret::new("s3cr3t-value")),
            ..Credentials::default()
        },
    )
    .expect_err("wkteam has no signature");
    assert_eq!(problems.len(), 1);
    assert_eq!(problems[0].field, Field::Secret);
    assert!(!problems[0].problem.contains("s3cr3t"));
    let slack = preset("slack").expect("slack");
    let problems = Sender::new(
        slack,
        Credentials {
            aes_key: Some(Secret::new("k")),
            app_id: Some("wx1".into()),
            ..Credentials::default()
        },
    )
    .expect_err("slack does not encrypt");
    assert_eq!(
        problems.iter().map(|p| p.field).collect::<Vec<_>>(),
        vec![Field::AesKey, Field::AppId]
    );
}
