//! `X-Forwarded-*` as the bot sees them through a real gateway: every incoming
//! `X-Forwarded-For` line kept, `-Proto` / `-Host` believed only from `trusted_proxies`.

use http::Method;

use crate::support::{Cfg, TestGateway, Upstream, msg};

async fn forwarded_headers(trusted: &str) -> (String, String, String) {
    let upstream = Upstream::ok().await;
    let cfg = Cfg::new().server(&format!("trusted_proxies = [{trusted}]"));
    let gw = TestGateway::start(&cfg, &upstream).await;
    let headers = [
        ("x-forwarded-for", "203.0.113.1"),
        ("x-forwarded-for", "203.0.113.2, 198.51.100.3"),
        ("x-forwarded-proto", "https"),
        ("x-forwarded-host", "hooks.example.com"),
    ];
    let r = gw.client().send(Method::POST, "/hook", &headers, &msg("xf")).await;
    assert_eq!(r.dedup(), "forwarded");
    let got = &upstream.received()[0].headers;
    let get = |name: &str| {
        let all: Vec<&str> = got.get_all(name).iter().map(|v| v.to_str().expect("ascii")).collect();
        all.join(" | ")
    };
    (
        get("x-forwarded-for"),
        get("x-forwarded-proto"),
        get("x-forwarded-host"),
    )
}

#[tokio::test]
async fn forwarded_headers_from_an_untrusted_peer_are_replaced_but_for_is_appended() {
    let (xff, proto, host) = forwarded_headers(r#""10.0.0.0/8""#).await;
    assert_eq!(xff, "203.0.113.1, 203.0.113.2, 198.51.100.3, 127.0.0.1");
    assert_eq!(proto, "http");
    assert!(host.starts_with("127.0.0.1:"), "the Host the client used: {host}");
}

#[tokio::test]
async fn a_trusted_front_proxy_keeps_its_proto_and_host() {
    let (xff, proto, host) = forwarded_headers(r#""127.0.0.0/8", "::1""#).await;
    assert_eq!(xff, "203.0.113.1, 203.0.113.2, 198.51.100.3, 127.0.0.1");
    assert_eq!(proto, "https");
    assert_eq!(host, "hooks.example.com");
}

#[test]
fn a_bad_trusted_proxies_entry_names_its_key_path() {
    let toml = Cfg::new()
        .server(r#"trusted_proxies = ["10.0.0.0/8", "10.1.2.3/8"]"#)
        .toml("http://127.0.0.1:9");
    let err = dedup_gateway::Config::parse(&toml)
        .expect_err("host bits set")
        .to_string();
    assert!(
        err.contains("server.trusted_proxies[1]: \"10.1.2.3/8\" has host bits set (did you mean 10.0.0.0/8?)"),
        "{err}"
    );
}
