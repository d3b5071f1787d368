//! Secrets stay secret: a Redis URL with a password, read from the environment
//! (`url_env`, or `cluster_env` for a cluster's seeds), never shows up in `check` output, in the logs (at debug level), or in
//! the message of a start-up that fails. (The Helm chart's NOTES.txt is grepped the
//! same way by .ci/validate-deploy, which has helm.)

use std::process::{Command, Output};

use crate::process::GatewayProcess;
use crate::servers::{RedisCluster, RedisServer};
use crate::support::{BIN, TempFile};
use crate::support::{Cfg, Client, Upstream, msg};

const PASSWORD: &str = "s3cr3t-Pa55w0rd";
const ENV: &str = "DEDUP_TEST_REDIS_URL";

fn url_env_cfg() -> Cfg {
    Cfg::new()
        .store("backend = \"redis\"")
        .store(&format!("url_env = \"{ENV}\""))
}

/// Runs the binary with `args`, the config file and `REDIS_URL`-like `url` in the environment.
fn run(args: &[&str], config: &TempFile, url: Option<&str>) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args).arg("--config").arg(&config.0).env_remove(ENV);
    if let Some(url) = url {
        cmd.env(ENV, url);
    }
    cmd.output().expect("run dedup-gateway")
}

fn all_output(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn assert_no_password(what: &str, text: &str) {
    assert!(!text.contains(PASSWORD), "the password leaked into {what}:\n{text}");
}

#[tokio::test]
async fn a_redis_password_never_shows_in_check_logs_or_errors() {
    let server = RedisServer::start().await;
    server.cli(&["CONFIG", "SET", "requirepass", PASSWORD]);
    let url = format!("redis://:{PASSWORD}@127.0.0.1:{}/0", server.port);
    let upstream = Upstream::ok().await;
    let toml = url_env_cfg().toml(&upstream.url());
    let config = TempFile::new("gateway.toml", &toml);

    // check: validates and prints the store, redacted.
    let out = run(&["check"], &config, Some(&url));
    let text = all_output(&out);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains(&format!("store: redis redis://***@127.0.0.1:{}/0", server.port)),
        "{text}"
    );
    assert_no_password("check", &text);

    // The variable unset: a config error naming the key, exit 1 before anything listens.
    let out = run(&["check"], &config, None);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        all_output(&out).contains(&format!("store.url_env: environment variable {ENV} is not set")),
        "{}",
        all_output(&out)
    );

    // A URL with the wrong scheme is reported redacted.
    let out = run(&["check"], &config, Some(&format!("http://:{PASSWORD}@127.0.0.1:1/0")));
    let text = all_output(&out);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text.contains("\"http://***@127.0.0.1:1/0\" must start with redis://"),
        "{text}"
    );
    assert_no_password("a config error", &text);

    // Serving, with every debug line of every crate logged.
    let gw = GatewayProcess::start_with(&toml, &["--log-level", "debug"], &[(ENV, url.as_str())]).await;
    let client = Client::http1(gw.addr);
    assert_eq!(client.post("/hook", &msg("s1")).await.dedup(), "forwarded");
    assert_eq!(client.post("/hook", &msg("s1")).await.dedup(), "duplicate");
    assert!(
        server
            .cli(&["-a", PASSWORD, "--no-auth-warning", "GET", "dedup:bot:s1"])
            .contains("completed")
    );
    gw.signal("TERM");
    let logs = std::sync::Arc::clone(&gw.logs);
    assert_eq!(gw.wait().await, Some(0));
    let logs = logs.lock().expect("logs").join("\n");
    assert!(logs.contains("\"level\":\"DEBUG\""), "debug logging was on:\n{logs}");
    assert!(logs.contains("redis://***@127.0.0.1"), "{logs}");
    assert_no_password("the debug logs", &logs);

    // Start-up failures: a wrong password, and a Redis that is not there.
    let wrong = format!("redis://:{PASSWORD}-wrong@127.0.0.1:{}/0", server.port);
    let out = run(&["--log-level", "debug"], &config, Some(&wrong));
    let text = all_output(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("redis://***@127.0.0.1"), "{text}");
    assert_no_password("the failure message (wrong password)", &text);

    // Not there: the gateway starts, not ready, and says so (redacted).
    let dead = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = dead.local_addr().expect("addr").port();
    drop(dead);
    let absent = format!("redis://:{PASSWORD}@127.0.0.1:{port}/0");
    let gw = GatewayProcess::start_with(&toml, &["--log-level", "debug"], &[(ENV, absent.as_str())]).await;
    let r = Client::http1(gw.addr).post("/hook", &msg("s2")).await;
    assert_eq!(r.dedup(), "store-unavailable");
    let logs = gw.logs.lock().expect("logs").join("\n");
    assert!(logs.contains(&format!("redis://***@127.0.0.1:{port}/0")), "{logs}");
    assert_no_password("the logs (no Redis)", &logs);
}

/// A TOML syntax error is reported by line and column, without the line itself: the
/// line toml would quote may be the one holding the secret.
#[test]
fn a_toml_syntax_error_does_not_quote_the_line_with_the_secret() {
    for (what, line) in [
        (
            "a stray token after a URL",
            format!("url = \"redis://:{PASSWORD}@127.0.0.1:6379/0\" ,"),
        ),
        (
            "a duplicate key",
            format!("url = \"redis://127.0.0.1:6379/0\"\nurl = \"redis://:{PASSWORD}@h:1/0\""),
        ),
    ] {
        let config = TempFile::new("gateway.toml", &format!("[store]\nbackend = \"redis\"\n{line}\n"));
        let out = run(&["check"], &config, None);
        let text = all_output(&out);
        assert_eq!(out.status.code(), Some(1), "{what}: {text}");
        assert!(text.contains("invalid TOML: line "), "{what}: {text}");
        assert_no_password(what, &text);
    }
}

/// A Redis Cluster's seeds, passwords included, come from the environment too
/// (`cluster_env`: URLs separated by commas or white space), and show redacted.
#[tokio::test]
async fn a_cluster_password_comes_from_the_environment_and_never_shows() {
    let cluster = RedisCluster::start().await;
    for node in &cluster.nodes {
        node.cli(&["CONFIG", "SET", "requirepass", PASSWORD]);
    }
    let seeds: Vec<String> = cluster
        .nodes
        .iter()
        .map(|n| format!("redis://:{PASSWORD}@127.0.0.1:{}", n.port))
        .collect();
    let seeds = format!("{}, {}\n{}", seeds[0], seeds[1], seeds[2]);
    let upstream = Upstream::ok().await;
    let cfg = || {
        Cfg::new()
            .store("backend = \"redis\"")
            .store(&format!("cluster_env = \"{ENV}\""))
    };
    let toml = cfg().toml(&upstream.url());
    let config = TempFile::new("gateway.toml", &toml);

    let out = run(&["check"], &config, Some(&seeds));
    let text = all_output(&out);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains(&format!("redis://***@127.0.0.1:{}", cluster.nodes[2].port)),
        "every seed is shown, redacted: {text}"
    );
    assert_no_password("check", &text);

    // The list and the variable together: one error, at the variable's key.
    let both = TempFile::new(
        "gateway.toml",
        &cfg().store(&cluster.seeds_toml()).toml(&upstream.url()),
    );
    let out = run(&["check"], &both, Some(&seeds));
    let text = all_output(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("store.cluster_env: set either cluster or cluster_env, not both"),
        "{text}"
    );
    assert!(!text.contains("needs url"), "no second, misleading error: {text}");

    let gw = GatewayProcess::start_with(&toml, &["--log-level", "debug"], &[(ENV, seeds.as_str())]).await;
    let client = Client::http1(gw.addr);
    for id in ["c1", "c2", "c3"] {
        assert_eq!(client.post("/hook", &msg(id)).await.dedup(), "forwarded");
        assert_eq!(client.post("/hook", &msg(id)).await.dedup(), "duplicate");
    }
    assert_eq!(upstream.count(), 3);
    let logs = gw.logs.lock().expect("logs").join("\n");
    assert_no_password("the debug logs", &logs);
}

/// A password with `/`, `?` or `#` not percent-encoded (base64 passwords hold `/`)
/// makes a URL the store cannot parse: `check` refuses it, as `serve` would, and shows
/// it redacted all the same, through either key.
#[test]
fn a_password_not_percent_encoded_is_refused_and_never_shown() {
    for password in ["ab/cd-Pa55", "ab?cd-Pa55", "ab#cd-Pa55"] {
        let url = format!("redis://:{password}@127.0.0.1:6379/0");
        let by_env = TempFile::new("gateway.toml", &url_env_cfg().toml("http://127.0.0.1:9"));
        let in_file = Cfg::new()
            .store("backend = \"redis\"")
            .store(&format!("cluster = [\"{url}\"]"))
            .toml("http://127.0.0.1:9");
        let in_file = TempFile::new("gateway.toml", &in_file);
        for (config, env) in [(&by_env, Some(url.as_str())), (&in_file, None)] {
            let out = run(&["check"], config, env);
            let text = all_output(&out);
            assert_eq!(out.status.code(), Some(1), "{password}: {text}");
            assert!(text.contains("is not a valid Redis URL"), "{password}: {text}");
            assert!(text.contains("redis://***@127.0.0.1:6379/0"), "{password}: {text}");
            assert!(!text.contains(password), "the password leaked: {text}");
        }
    }
}
