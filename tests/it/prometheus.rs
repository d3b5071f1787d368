//! A real Prometheus (Debian's `prometheus` package) scraping a real gateway: the
//! exposition must be accepted as served (`up == 1`), the counters must equal the
//! traffic sent, the shipped alert rules must load and evaluate, and every query of
//! the shipped Grafana dashboard must return data. A missing `prometheus` binary fails
//! with the install command; it never skips.

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::Method;
use serde_json::Value;

use crate::queued::{queued, sqlite_store};
use crate::servers::free_port;
use crate::support::TempFile;
use crate::support::{Cfg, Client, PATIENCE, Reply, TestGateway, Upstream, eventually, msg};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// One `prometheus` server on a free port, scraping `targets` every 250 ms.
pub struct Prometheus {
    child: Child,
    pub client: Client,
    _dir: TempFile,
}

impl Prometheus {
    pub async fn start(targets: &[SocketAddr]) -> Self {
        let found = Command::new("prometheus").arg("--version").output().is_ok();
        assert!(
            found,
            "prometheus not found: the scrape tests need a real Prometheus. Install it with \
             `sudo apt-get install -y --no-install-recommends prometheus` (or run .ci/test, which does)"
        );
        let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
        let config = format!(
            "global:\n  scrape_interval: 250ms\n  scrape_timeout: 250ms\n  evaluation_interval: 250ms\n\
             rule_files:\n  - {ROOT}/deploy/prometheus/alerts.yml\n\
             scrape_configs:\n  - job_name: dedup-gateway\n    static_configs:\n      - targets: [{}]\n",
            targets.join(", ")
        );
        let dir = TempFile::new("prometheus.yml", &config);
        for _ in 0..5 {
            let port = free_port();
            let mut child = Command::new("prometheus")
                .arg(format!("--config.file={}", dir.0.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.0.with_file_name("data").display()
                ))
                .arg(format!("--web.listen-address=127.0.0.1:{port}"))
                .arg("--log.level=warn")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn prometheus");
            let client = Client::http1(SocketAddr::from(([127, 0, 0, 1], port)));
            if ready(&mut child, &client).await {
                return Prometheus {
                    child,
                    client,
                    _dir: dir,
                };
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("prometheus did not start");
    }

    /// An instant query through the HTTP API: each series' labels and value.
    pub async fn query(&self, promql: &str) -> Vec<(BTreeMap<String, String>, f64)> {
        let path = format!(
            "/api/v1/query?{}",
            form_urlencoded::Serializer::new(String::new())
                .append_pair("query", promql)
                .finish()
        );
        let r = self.client.send(Method::GET, &path, &[], "").await;
        let body: Value = serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("{e}: {}", r.body));
        assert_eq!(body["status"], "success", "query {promql} failed: {}", r.body);
        body["data"]["result"]
            .as_array()
            .unwrap_or_else(|| panic!("{promql}: not a vector: {}", r.body))
            .iter()
            .map(|s| {
                let labels = s["metric"]
                    .as_object()
                    .expect("labels")
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                    .collect();
                let value = s["value"][1].as_str().expect("value").parse().expect("number");
                (labels, value)
            })
            .collect()
    }

    /// Polls `promql` until `done` accepts its result (bounded by [`PATIENCE`]); on
    /// timeout, fails with the last result seen.
    pub async fn until(
        &self,
        promql: &str,
        mut done: impl FnMut(&[(BTreeMap<String, String>, f64)]) -> bool,
    ) -> Vec<(BTreeMap<String, String>, f64)> {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let result = self.query(promql).await;
            if done(&result) {
                return result;
            }
            if tokio::time::Instant::now() >= deadline {
                let targets = self.client.send(Method::GET, "/api/v1/targets", &[], "").await;
                panic!(
                    "{promql}: still {result:?} after {PATIENCE:?}\nscrape targets: {}",
                    targets.body
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Aborts a background task when the test ends, however it ends.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Waits for `/-/ready`; false if the process exited first (its port was taken).
async fn ready(child: &mut Child, client: &Client) -> bool {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while tokio::time::Instant::now() < deadline {
        if child.try_wait().expect("try_wait").is_some() {
            return false;
        }
        let probe = tokio::time::timeout(Duration::from_millis(500), client.try_send(Method::GET, "/-/ready"));
        if let Ok(Some(r)) = probe.await
            && r.status == 200
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A gateway that has served known traffic: 3 forwarded, 2 duplicates, 1 without a
/// key, 1 bypass (a GET). Returns the expected `dedup_requests_total` by outcome.
async fn gateway_with_traffic(upstream: &Upstream) -> (TestGateway, BTreeMap<String, f64>) {
    let gw = TestGateway::start(&Cfg::new(), upstream).await;
    let client = gw.client();
    for id in ["p1", "p2", "p3"] {
        assert_eq!(client.post("/hook", &msg(id)).await.dedup(), "forwarded");
    }
    for id in ["p1", "p2"] {
        assert_eq!(client.post("/hook", &msg(id)).await.dedup(), "duplicate");
    }
    assert_eq!(client.post("/hook", "{}").await.dedup(), "no-key");
    assert_eq!(client.send(Method::GET, "/hook", &[], "").await.dedup(), "bypass");
    let mut expected: BTreeMap<String, f64> = dedup_gateway::outcome::Outcome::ALL
        .iter()
        .map(|o| (o.label().to_owned(), 0.0))
        .collect();
    for (outcome, n) in [("forwarded", 3.0), ("duplicate", 2.0), ("no_key", 1.0), ("bypass", 1.0)] {
        expected.insert(outcome.to_owned(), n);
    }
    (gw, expected)
}

fn by_outcome(result: &[(BTreeMap<String, String>, f64)]) -> BTreeMap<String, f64> {
    result.iter().map(|(l, v)| (l["outcome"].clone(), *v)).collect()
}

/// A client that does not ask for OpenMetrics (curl, promtool) gets the classic text
/// format, which `promtool check metrics` (Debian's, 2.42) accepts without a lint
/// remark, with the same counts; Prometheus's own `Accept` still gets OpenMetrics.
#[tokio::test]
async fn promtool_checks_what_a_plain_client_gets_and_prometheus_is_offered_openmetrics() {
    use std::io::Write;
    let upstream = Upstream::ok().await;
    let (gw, expected) = gateway_with_traffic(&upstream).await;
    let admin = Client::http1(gw.admin.expect("admin"));
    let plain = admin.send(Method::GET, "/metrics", &[], "").await;
    assert_eq!(
        plain.headers["content-type"],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    let counted: BTreeMap<String, f64> = plain
        .body
        .lines()
        .filter_map(|l| l.strip_prefix("dedup_requests_total{route=\"bot\",outcome=\""))
        .filter_map(|l| l.split_once("\"} "))
        .map(|(outcome, v)| (outcome.to_owned(), v.parse().expect("a number")))
        .collect();
    assert_eq!(counted, expected);
    let promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let Ok(mut promtool) = promtool else {
        panic!(
            "promtool not found: install it with `sudo apt-get install -y --no-install-recommends prometheus` \
             (or run .ci/test, which does)"
        );
    };
    promtool
        .stdin
        .take()
        .expect("stdin")
        .write_all(plain.body.as_bytes())
        .expect("write to promtool");
    let out = promtool.wait_with_output().expect("promtool");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success() && said.trim().is_empty(), "promtool: {said}");

    let accept = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,\
                  text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
    let om = admin.send(Method::GET, "/metrics", &[("accept", accept)], "").await;
    assert_eq!(
        om.headers["content-type"],
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    assert!(om.body.ends_with("# EOF\n") && om.body.contains("# TYPE dedup_build info"));
}

#[tokio::test]
async fn a_real_prometheus_scrapes_the_gateway_and_counts_what_was_sent() {
    let upstream = Upstream::ok().await;
    let (gw, expected) = gateway_with_traffic(&upstream).await;
    let prometheus = Prometheus::start(&[gw.admin.expect("admin")]).await;

    // The scrape is accepted: a target whose exposition Prometheus cannot parse is up == 0.
    prometheus
        .until(r#"up{job="dedup-gateway"}"#, |r| r.len() == 1 && r[0].1 == 1.0)
        .await;
    let counted = prometheus
        .until(r#"dedup_requests_total{route="bot"}"#, |r| by_outcome(r) == expected)
        .await;
    assert_eq!(by_outcome(&counted), expected);

    // More traffic shows up in the next scrapes, exactly.
    let client = gw.client();
    assert_eq!(client.post("/hook", &msg("p4")).await.dedup(), "forwarded");
    assert_eq!(client.post("/hook", &msg("p4")).await.dedup(), "duplicate");
    prometheus
        .until(
            r#"dedup_requests_total{route="bot",outcome=~"forwarded|duplicate"}"#,
            |r| by_outcome(r) == BTreeMap::from([("duplicate".to_owned(), 3.0), ("forwarded".to_owned(), 4.0)]),
        )
        .await;
    let upstream_2xx = prometheus
        .until(r#"dedup_upstream_responses_total{route="bot",class="2xx"}"#, |r| {
            r.first().is_some_and(|s| s.1 == 6.0)
        })
        .await;
    assert_eq!(
        upstream_2xx.len(),
        1,
        "4 forwarded + 1 no-key + 1 bypass reached the bot"
    );
    let info = prometheus.query("dedup_build_info").await;
    assert_eq!(info.len(), 1);
    assert_eq!(info[0].0["version"], env!("CARGO_PKG_VERSION"));
    let ready = prometheus.until("dedup_ready", |r| r.len() == 1).await;
    assert_eq!(ready[0].1, 1.0);
}

/// A second gateway, its route `bot` queued on SQLite with one retry 100 ms later: its
/// bot refuses ids starting with "bad" (400: a dead letter at once) and fails those
/// starting with "flaky" once (500, then 200: a retry, then delivered). Returns it once
/// it has delivered, retried and dead-lettered at least once, with its bot and store.
async fn queued_gateway_with_traffic() -> (TestGateway, Upstream, TempFile) {
    let failed_once = Arc::new(Mutex::new(HashSet::new()));
    let bot = Upstream::with(move |r| {
        let id = r.msg_id().unwrap_or_default();
        let code = if id.starts_with("bad") {
            400
        } else if id.starts_with("flaky") && failed_once.lock().expect("lock").insert(id) {
            500
        } else {
            200
        };
        async move { Reply::new(code, "bot") }
    })
    .await;
    let dir = TempFile::new("q.marker", "");
    let cfg = Cfg::new().store(&sqlite_store(&dir)).route(&queued("[\"100ms\"]"));
    let gw = TestGateway::start(&cfg, &bot).await;
    let client = gw.client();
    for id in ["q1", "flaky1", "bad1"] {
        assert_eq!(client.post("/hook", &msg(id)).await.dedup(), "queued");
    }
    let deliveries = |result: &str| gw.metric(&format!("dedup_deliveries_total{{route=\"bot\",result=\"{result}\"}}"));
    eventually("2 delivered, 1 retry, 1 dead letter", || {
        deliveries("delivered") == 2.0 && deliveries("retry") == 1.0 && deliveries("dead") == 1.0
    })
    .await;
    (gw, bot, dir)
}

#[tokio::test]
async fn every_dashboard_query_returns_data_and_the_alert_rules_evaluate() {
    let upstream = Upstream::ok().await;
    let (gw, _) = gateway_with_traffic(&upstream).await;
    // The queue panels read a queued route: a second target, whose route is also named
    // "bot" (the dashboard's route variable sees one route).
    let (queued_gw, _bot, _store) = queued_gateway_with_traffic().await;
    let (sync_admin, queued_admin) = (gw.admin.expect("admin"), queued_gw.admin.expect("admin"));
    let prometheus = Prometheus::start(&[sync_admin, queued_admin]).await;
    prometheus
        .until(
            &format!(r#"dedup_requests_total{{instance="{sync_admin}",route="bot",outcome="duplicate"}}"#),
            |r| r.first().is_some_and(|s| s.1 == 2.0),
        )
        .await;
    prometheus
        .until(
            &format!(r#"dedup_deliveries_total{{instance="{queued_admin}",route="bot",result="dead"}}"#),
            |r| r.first().is_some_and(|s| s.1 == 1.0),
        )
        .await;
    // Traffic all along (bounded: at most 600 rounds, 10 a second), so every rate
    // window holds some; stopped when the test ends. On the queued gateway, every
    // tenth message fails once (a retry) and every fiftieth is refused (a dead letter).
    let client = gw.client();
    let traffic = tokio::spawn(async move {
        for i in 0..600 {
            let id = format!("late{i}");
            assert_eq!(client.post("/hook", &msg(&id)).await.dedup(), "forwarded");
            assert_eq!(client.post("/hook", &msg(&id)).await.dedup(), "duplicate");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let _stop = AbortOnDrop(traffic);
    let queued_client = queued_gw.client();
    let queued_traffic = tokio::spawn(async move {
        for i in 0..600 {
            let id = if i % 50 == 0 {
                format!("bad-late{i}")
            } else if i % 10 == 0 {
                format!("flaky-late{i}")
            } else {
                format!("late{i}")
            };
            assert_eq!(queued_client.post("/hook", &msg(&id)).await.dedup(), "queued");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let _stop_queued = AbortOnDrop(queued_traffic);

    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(format!("{ROOT}/deploy/grafana/dedup-gateway.json")).expect("dashboard"),
    )
    .expect("dashboard JSON");
    let mut checked = 0;
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            let expr = target["expr"].as_str().expect("expr");
            // Grafana's variables: every route, and a rate window that spans scrapes.
            let promql = expr.replace("$__rate_interval", "10s").replace("$route", ".*");
            assert!(!promql.contains('$'), "unsubstituted variable in {expr}");
            let title = panel["title"].as_str().unwrap_or_default();
            // A quantile of an operation that had no calls in the window is NaN (a gap
            // in the panel); at least one series must carry a number.
            let result = prometheus
                .until(&promql, |r| r.iter().any(|(_, v)| v.is_finite()))
                .await;
            assert!(!result.is_empty(), "panel {title:?}: {promql}");
            checked += 1;
        }
    }
    assert!(checked >= 21, "only {checked} queries in the dashboard");

    // The route variable's own query: both gateways name their route "bot".
    let routes = prometheus.query("group by (route) (dedup_requests_total)").await;
    assert_eq!(routes.len(), 1);

    // The shipped alert rules load into a real Prometheus and evaluate without errors:
    // every one of them.
    let shipped = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/prometheus/alerts.yml"))
        .expect("alerts.yml")
        .lines()
        .filter(|l| l.trim_start().starts_with("- alert:"))
        .count();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let r = prometheus.client.send(Method::GET, "/api/v1/rules", &[], "").await;
        let body: Value = serde_json::from_str(&r.body).expect("rules JSON");
        let rules: Vec<&Value> = body["data"]["groups"]
            .as_array()
            .expect("groups")
            .iter()
            .flat_map(|g| g["rules"].as_array().expect("rules"))
            .collect();
        assert_eq!(rules.len(), shipped, "{}", r.body);
        let evaluated = rules.iter().all(|r| r["health"] == "ok");
        if evaluated {
            break;
        }
        assert!(
            rules.iter().all(|r| r["health"] != "err"),
            "a rule failed to evaluate: {}",
            r.body
        );
        assert!(
            tokio::time::Instant::now() < deadline,
            "rules not evaluated: {}",
            r.body
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // With ready gateways scraped, neither of these fires.
    let firing = prometheus
        .query("ALERTS{alertname=~\"DedupGatewayAbsent|DedupGatewayNotReady\"}")
        .await;
    assert!(firing.is_empty(), "{firing:?}");
    // The queued gateway holds dead letters: that alert (no `for`) fires, on its route.
    let dead = prometheus
        .until(
            r#"ALERTS{alertname="DedupGatewayDeadLetters",alertstate="firing"}"#,
            |r| !r.is_empty(),
        )
        .await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(
        (dead[0].0["route"].as_str(), dead[0].0["severity"].as_str()),
        ("bot", "warning")
    );
}
