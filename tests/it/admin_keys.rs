//! The admin API for keys, on both stores: inspect a message's marker, forget it so the
//! same id is forwarded again, forget a PROCESSING one only with `force`, ids hashed as
//! requests are; the bearer token on the endpoints that change something; and the
//! `dedup-gateway key --inspect | --forget` client.

use std::process::Command;

use dedup_gateway::secret::Secret;
use http::Method;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::process::GatewayProcess;
use crate::servers::RedisServer;
use crate::support::TempFile;
use crate::support::{Cfg, Client, Gate, Reply, Resp, TestGateway, Upstream, msg};

fn json(r: &Resp) -> Value {
    serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("{e}: {} {}", r.status, r.body))
}

/// A gateway on this store config whose upstream waits at `gate` for ids starting with
/// "slow", and answers at once otherwise.
async fn gateway(store: &Cfg, gate: &Gate) -> (TestGateway, Upstream) {
    let g = gate.clone();
    let upstream = Upstream::with(move |r| {
        let g = g.clone();
        async move {
            if r.msg_id().is_some_and(|id| id.starts_with("slow")) {
                g.pass().await;
            }
            Reply::new(200, "done")
        }
    })
    .await;
    let mut cfg = Cfg::new().route("replay = true").route("in_flight_wait = \"100ms\"");
    cfg.store = store.store.clone();
    let gw = TestGateway::start(&cfg, &upstream).await;
    (gw, upstream)
}

async fn inspect_forget_force_and_hashing(store: Cfg) {
    let gate = Gate::new();
    let (gw, upstream) = gateway(&store, &gate).await;
    let client = gw.client();
    let admin = Client::http1(gw.admin.expect("admin"));

    // COMPLETED, with the reply stored (replay).
    assert_eq!(client.post("/hook", &msg("m1")).await.dedup(), "forwarded");
    let r = admin.send(Method::GET, "/keys/bot/m1", &[], "").await;
    assert_eq!(r.status, 200, "{}", r.body);
    let info = json(&r);
    assert_eq!(info["state"], "COMPLETED");
    assert_eq!(info["key"], "dedup:bot:m1");
    assert_eq!(info["reply_stored"], true);
    let ttl = info["ttl_ms"].as_u64().expect("ttl_ms");
    assert!(
        ttl > 23 * 3600 * 1000 && ttl <= 24 * 3600 * 1000,
        "completed_ttl 24h: {ttl}"
    );
    assert!(info["age_ms"].as_u64().expect("age_ms") < 60_000);

    // Absent ids and unknown routes are 404.
    let r = admin.send(Method::GET, "/keys/bot/never-seen", &[], "").await;
    assert_eq!((r.status.as_u16(), json(&r)["state"].as_str()), (404, Some("absent")));
    let r = admin.send(Method::GET, "/keys/nope/m1", &[], "").await;
    assert_eq!(r.status, 404);
    assert!(r.body.contains("no route named \\\"nope\\\""), "{}", r.body);

    // Forget: the same id is forwarded again, once.
    assert_eq!(client.post("/hook", &msg("m1")).await.dedup(), "replayed");
    let r = admin.send(Method::DELETE, "/keys/bot/m1", &[], "").await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        (json(&r)["forgotten"].as_bool(), json(&r)["state"].as_str()),
        (Some(true), Some("COMPLETED"))
    );
    assert_eq!(admin.send(Method::GET, "/keys/bot/m1", &[], "").await.status, 404);
    assert_eq!(client.post("/hook", &msg("m1")).await.dedup(), "forwarded");
    assert_eq!(client.post("/hook", &msg("m1")).await.dedup(), "replayed");
    let m1 = upstream
        .received()
        .iter()
        .filter(|r| r.msg_id().as_deref() == Some("m1"))
        .count();
    assert_eq!(m1, 2, "delivered again after the forget, and only once");
    let r = admin.send(Method::DELETE, "/keys/bot/never-seen", &[], "").await;
    assert_eq!((r.status.as_u16(), json(&r)["forgotten"].as_bool()), (404, Some(false)));

    // PROCESSING: shown, not forgotten without force, forgotten with it.
    let c = client.clone();
    let first = tokio::spawn(async move { c.post("/hook", &msg("slow1")).await });
    upstream.wait_for(3).await;
    let r = admin.send(Method::GET, "/keys/bot/slow1", &[], "").await;
    let info = json(&r);
    assert_eq!(
        (info["state"].as_str(), info["reply_stored"].as_bool()),
        (Some("PROCESSING"), Some(false))
    );
    assert!(
        info["ttl_ms"].as_u64().expect("ttl_ms") <= 30_000,
        "processing_ttl: {info}"
    );
    let r = admin.send(Method::DELETE, "/keys/bot/slow1", &[], "").await;
    assert_eq!(r.status, 409, "{}", r.body);
    assert!(r.body.contains("force=true"), "{}", r.body);
    assert_eq!(
        client.post("/hook", &msg("slow1")).await.dedup(),
        "in-flight",
        "still held"
    );
    let r = admin.send(Method::DELETE, "/keys/bot/slow1?force=true", &[], "").await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(json(&r)["state"], "PROCESSING");
    // The retry is forwarded now, while the first is still running.
    let c = client.clone();
    let retry = tokio::spawn(async move { c.post("/hook", &msg("slow1")).await });
    upstream.wait_for(4).await;
    gate.open(2);
    assert_eq!(first.await.expect("first").dedup(), "forwarded");
    assert_eq!(retry.await.expect("retry").dedup(), "forwarded");

    // Ids are stored under the request path's rule: this one is hashed.
    let id = "order 42 {eu}";
    assert_eq!(client.post("/hook", &msg(id)).await.dedup(), "forwarded");
    let r = admin
        .send(Method::GET, "/keys/bot/order%2042%20%7Beu%7D", &[], "")
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let hashed = format!("dedup:bot:sha256:{}", hex::encode(Sha256::digest(id.as_bytes())));
    assert_eq!(json(&r)["key"], hashed);
    assert_eq!(json(&r)["id"], id);
    assert_eq!(
        admin
            .send(Method::DELETE, "/keys/bot/order%2042%20%7Beu%7D", &[], "")
            .await
            .status,
        200
    );
    assert_eq!(client.post("/hook", &msg(id)).await.dedup(), "forwarded");
}

#[tokio::test]
async fn memory_store_keys_can_be_inspected_and_forgotten() {
    inspect_forget_force_and_hashing(Cfg::new()).await;
}

#[tokio::test]
async fn redis_store_keys_can_be_inspected_and_forgotten() {
    let server = RedisServer::start().await;
    let store = Cfg::new()
        .store("backend = \"redis\"")
        .store(&format!("url = \"{}\"", server.url()));
    inspect_forget_force_and_hashing(store).await;
    // What the admin API forgot is gone from Redis itself.
    assert_eq!(server.cli(&["EXISTS", "dedup:bot:m1"]).trim(), "1");
    let hashed = format!("dedup:bot:sha256:{}", hex::encode(Sha256::digest(b"order 42 {eu}")));
    assert_eq!(
        server.cli(&["EXISTS", &hashed]).trim(),
        "1",
        "delivered again, stored again"
    );
}

#[tokio::test]
async fn with_a_token_changing_endpoints_need_it_and_probes_stay_open() {
    let upstream = Upstream::ok().await;
    let mut config = dedup_gateway::Config::parse(&Cfg::new().toml(&upstream.url())).expect("config");
    config.server.admin_token = Some(Secret::new("t0ken-of-the-admin"));
    let store = crate::support::store_for(&config).await;
    let gw = TestGateway::start_with(config, store).await;
    let admin = Client::http1(gw.admin.expect("admin"));
    assert_eq!(gw.client().post("/hook", &msg("a1")).await.dedup(), "forwarded");

    for (method, path) in [(Method::DELETE, "/keys/bot/a1"), (Method::POST, "/reload")] {
        for headers in [
            vec![],
            vec![("authorization", "Bearer wrong")],
            vec![("authorization", "t0ken-of-the-admin")],
            vec![("authorization", "Bearer t0ken-of-the-admin-and-more")],
        ] {
            let r = admin.send(method.clone(), path, &headers, "").await;
            assert_eq!(r.status, 401, "{method} {path} with {headers:?}: {}", r.body);
            assert_eq!(r.headers["www-authenticate"], "Bearer");
        }
    }
    assert_eq!(
        admin.send(Method::GET, "/keys/bot/a1", &[], "").await.status,
        200,
        "not forgotten"
    );
    for open in ["/healthz", "/livez", "/readyz", "/metrics", "/keys/bot/a1"] {
        assert_eq!(admin.send(Method::GET, open, &[], "").await.status, 200, "{open}");
    }
    let auth = [("authorization", "Bearer t0ken-of-the-admin")];
    assert_eq!(admin.send(Method::DELETE, "/keys/bot/a1", &auth, "").await.status, 200);
    assert_eq!(gw.client().post("/hook", &msg("a1")).await.dedup(), "forwarded");
    // The scheme is case-insensitive (RFC 9110, 11.1).
    let lower = [("authorization", "bearer t0ken-of-the-admin")];
    assert_eq!(admin.send(Method::DELETE, "/keys/bot/a1", &lower, "").await.status, 200);
    assert_eq!(gw.client().post("/hook", &msg("a1")).await.dedup(), "forwarded");
    // Not started from a file: reload is authorised but has nothing to re-read.
    assert_eq!(admin.send(Method::POST, "/reload", &auth, "").await.status, 404);
}

fn cli(args: &[&str], config: &TempFile, env: &[(&str, &str)]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_dedup-gateway"))
        .args(["key", "--config"])
        .arg(&config.0)
        .args(args)
        .env_remove("DEDUP_TEST_ADMIN_TOKEN")
        .envs(env.iter().copied())
        .output()
        .expect("run");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn the_key_command_inspects_and_forgets_through_the_admin_listener() {
    let upstream = Upstream::ok().await;
    let toml = Cfg::new()
        .server("admin_token_env = \"DEDUP_TEST_ADMIN_TOKEN\"")
        .toml(&upstream.url());
    let token = [("DEDUP_TEST_ADMIN_TOKEN", "cli-t0ken")];
    let gw = GatewayProcess::start_with(&toml, &[], &token).await;
    let client = Client::http1(gw.addr);
    assert_eq!(client.post("/hook", &msg("c1")).await.dedup(), "forwarded");
    let admin = format!("http://{}", gw.admin.expect("admin"));
    let config = TempFile::new("gateway.toml", &toml);

    let (code, stdout, stderr) = cli(
        &["--route", "bot", "--inspect", "c1", "--admin", &admin],
        &config,
        &token,
    );
    assert_eq!(code, 0, "{stderr}");
    let info: Value = serde_json::from_str(&stdout).expect("JSON on stdout");
    assert_eq!(
        (info["state"].as_str(), info["key"].as_str()),
        (Some("COMPLETED"), Some("dedup:bot:c1"))
    );

    // The token comes from the variable the config names; without it the gateway refuses.
    let open = TempFile::new("open.toml", &Cfg::new().toml(&upstream.url()));
    let (code, _, stderr) = cli(&["--route", "bot", "--forget", "c1", "--admin", &admin], &open, &[]);
    assert_eq!(code, 1);
    assert!(stderr.contains("401"), "{stderr}");

    let (code, stdout, stderr) = cli(
        &["--route", "bot", "--forget", "c1", "--admin", &admin],
        &config,
        &token,
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("\"forgotten\": true"), "{stdout}");
    assert_eq!(client.post("/hook", &msg("c1")).await.dedup(), "forwarded");
    let (code, stdout, _) = cli(
        &["--route", "bot", "--inspect", "gone", "--admin", &admin],
        &config,
        &token,
    );
    assert_eq!(code, 1);
    assert!(stdout.contains("\"state\": \"absent\""), "{stdout}");
    let logs = gw.logs.lock().expect("logs").join("\n");
    assert!(
        logs.contains("admin: key forgotten") && logs.contains("admin: refused"),
        "{logs}"
    );
    assert!(!logs.contains("cli-t0ken"), "the token leaked into the logs");
}
