//! The promise at the edges (issue 9): a sender hanging up while its claim is on the
//! way, a waiting duplicate meeting a store failure, and the other ways a real
//! deployment could lose or double a message.

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::process::GatewayProcess;
use crate::servers::{RedisServer, SwallowingProxy};
use crate::support::{Cfg, Client, Gate, Reply, TestGateway, Upstream, eventually, metric_value, msg};

fn redis_cfg(url: &str) -> Cfg {
    Cfg::new()
        .store("backend = \"redis\"")
        .store(&format!("url = \"{url}\""))
        .store("timeout = \"1s\"")
}

/// The claim has landed in Redis but its reply is late; the sender hangs up in that
/// window. The request's own task must still own the claim: forward, complete.
#[tokio::test]
async fn a_sender_hanging_up_while_the_claim_is_on_its_way_leaves_no_orphan() {
    let server = RedisServer::start().await;
    let proxy = SwallowingProxy::start(server.addr()).await;
    let upstream = Upstream::ok().await;
    let cfg = redis_cfg(&proxy.url()).route("on_in_flight = \"conflict\"");
    let gw = TestGateway::start(&cfg, &upstream).await;

    proxy.hold();
    let body = msg("late-reply");
    let mut sender = TcpStream::connect(gw.addr).await.expect("connect");
    let request = format!(
        "POST /hook HTTP/1.1\r\nHost: gw\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    sender.write_all(request.as_bytes()).await.expect("write");
    let key = "dedup:bot:late-reply";
    eventually("the claim to land in Redis", || {
        server.cli(&["GET", key]).contains("processing")
    })
    .await;
    drop(sender); // WeChat gives up after 5 s
    // Not synchronisation: nothing observable happens when hyper drops the handler of a
    // closed connection, so the test gives it that chance before the late reply comes.
    // (Without the fix, the claim then dies with the handler and this test times out
    // waiting for the delivery below.)
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(upstream.count(), 0);
    proxy.release();

    upstream.wait_for(1).await;
    eventually("the marker to complete", || {
        server.cli(&["GET", key]).contains("completed")
    })
    .await;
    let retry = gw.client().post("/hook", &body).await;
    assert_eq!(retry.dedup(), "duplicate", "{retry:?}");
    assert_eq!(upstream.count(), 1);
}

/// With `on_error = "forward"`, a duplicate waiting on PROCESSING whose next poll
/// fails must not be forwarded: the first attempt may still be delivering it.
#[tokio::test]
async fn a_waiting_duplicate_is_never_forwarded_when_the_store_fails() {
    let mut server = RedisServer::start().await;
    let gate = Gate::new();
    let upstream = Upstream::gated(&gate, "done").await;
    let cfg = redis_cfg(&server.url())
        .store("on_error = \"forward\"")
        .route("in_flight_wait = \"10s\"");
    let gw = TestGateway::start(&cfg, &upstream).await;
    let client = gw.client();
    let c = client.clone();
    let first = tokio::spawn(async move { c.post("/hook", &msg("blip")).await });
    upstream.wait_for(1).await;
    let c = client.clone();
    let waiter = tokio::spawn(async move { c.post("/hook", &msg("blip")).await });
    eventually("the duplicate to be waiting", || {
        gw.metric(r#"dedup_duplicate_age_seconds_count{route="bot"}"#) == 1.0
    })
    .await;
    server.kill();
    let waited = waiter.await.expect("waiter");
    assert_eq!(
        (waited.status.as_u16(), waited.dedup()),
        (409, "in-flight"),
        "{waited:?}"
    );
    gate.open(1);
    assert_eq!(first.await.expect("first").dedup(), "forwarded");
    assert_eq!(upstream.count(), 1, "the waiting duplicate was never forwarded");
}

/// `replay` with 64 KiB replies: 10,000 of them would be 640 MiB. `max_bytes` keeps
/// the process within its bound plus a fixed overhead, evicting the oldest COMPLETED
/// replies, so the newest ids (the ones retries need) still dedup.
#[tokio::test]
async fn replayed_replies_stay_within_max_bytes_and_the_newest_ids_still_dedup() {
    const MIB: u64 = 1 << 20;
    let reply = bytes::Bytes::from(vec![b'r'; 64 * 1024]);
    let upstream = Upstream::with(move |_| {
        let reply = Reply::new(200, reply.clone());
        async move { reply }
    })
    .await;
    let cfg = Cfg::new().store("max_bytes = \"64MiB\"").route("replay = true");
    let gw = GatewayProcess::start(&cfg.toml(&upstream.url())).await;
    let client = Client::http1(gw.addr);
    let id = |i: usize| format!("big-{i}");
    let mut sent = 0;
    while sent < 10_000 {
        let batch: Vec<_> = (sent..sent + 16)
            .map(|i| {
                let (c, body) = (client.clone(), msg(&id(i)));
                tokio::spawn(async move { c.post("/hook", &body).await })
            })
            .collect();
        for task in batch {
            let r = task.await.expect("request");
            assert_eq!((r.status.as_u16(), r.dedup()), (200, "forwarded"));
        }
        sent += 16;
    }
    // Anonymous memory: what the heap, the store and the buffers hold. (The test runs
    // the debug binary, whose own file-backed pages are several times a release build's.)
    let rss = gw.memory("RssAnon");
    assert!(rss < 64 * MIB + 20 * MIB, "RssAnon {} MiB", rss / MIB);
    for i in sent - 100..sent {
        let again = client.post("/hook", &msg(&id(i))).await;
        assert_eq!(again.dedup(), "replayed", "newest id {i}");
        assert_eq!(again.bytes.len(), 64 * 1024);
    }
    let admin = Client::http1(gw.admin.expect("admin"));
    let text = admin.send(http::Method::GET, "/metrics", &[], "").await.body;
    let bytes = metric_value(&text, "dedup_store_bytes");
    assert!(bytes <= (64 * MIB) as f64 && bytes > (60 * MIB) as f64, "{bytes}");
    // The bound bit: the oldest replies are gone (their COMPLETED markers too, by the
    // same eviction rule), so the first id is delivered again.
    assert_eq!(client.post("/hook", &msg(&id(0))).await.dedup(), "forwarded");
    println!(
        "10,000 x 64 KiB replies, max_bytes 64 MiB: RssAnon {} MiB (VmRSS {} MiB), dedup_store_bytes {bytes}",
        rss / MIB,
        gw.memory("VmRSS") / MIB
    );
}
