//! The promise at the edges (issue 9): a sender hanging up while its claim is on the
//! way, a waiting duplicate meeting a store failure, and the other ways a real
//! deployment could lose or double a message.

use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::process::GatewayProcess;
use crate::servers::{RedisServer, SwallowingProxy};
use crate::support::{Cfg, Client, Gate, Reply, Resp, TestGateway, Upstream, eventually, metric_value, msg};

fn redis_cfg(url: &str) -> Cfg {
    Cfg::new()
        .store("backend = \"redis\"")
        .store(&format!("url = \"{url}\""))
        .store("timeout = \"1s\"")
}

/// How a sender gives up on a request.
enum HangUp {
    /// Closes its HTTP/1 connection. The gateway serves HTTP/1 with half-close allowed,
    /// so hyper keeps the handler and notices only when it writes the answer.
    Http1Close,
    /// Resets its h2 stream (RST_STREAM): hyper drops the handler at once, and the
    /// claim's work carries on in a task of its own (`dedup::Detached`).
    H2Reset,
}

/// A sender mid-request: its connection, or the task holding its h2 stream.
enum Sender {
    Connection(TcpStream),
    Stream(tokio::task::JoinHandle<Resp>),
}

impl Sender {
    fn hang_up(self) {
        match self {
            Sender::Connection(connection) => drop(connection),
            Sender::Stream(request) => request.abort(), // drops the stream: RST_STREAM
        }
    }
}

/// The claim has landed in Redis but its reply is late; the sender hangs up in that
/// window. The request's own task must still own the claim: forward, complete.
#[tokio::test]
async fn a_sender_hanging_up_while_the_claim_is_on_its_way_leaves_no_orphan() {
    hanging_up_while_the_claim_is_on_its_way(HangUp::Http1Close, "late-reply").await;
}

#[tokio::test]
async fn an_h2_sender_resetting_its_stream_while_the_claim_is_on_its_way_leaves_no_orphan() {
    hanging_up_while_the_claim_is_on_its_way(HangUp::H2Reset, "late-reply-h2").await;
}

async fn hanging_up_while_the_claim_is_on_its_way(how: HangUp, id: &str) {
    let server = RedisServer::start().await;
    let proxy = SwallowingProxy::start(server.addr()).await;
    let upstream = Upstream::ok().await;
    let cfg = redis_cfg(&proxy.url()).route("on_in_flight = \"conflict\"");
    let gw = TestGateway::start(&cfg, &upstream).await;
    // Ready: every worker has its Redis connection (replies held from here on).
    eventually_ready(&Client::http1(gw.admin.expect("admin")), 200).await;
    proxy.hold();
    let body = msg(id);
    let sender = match how {
        HangUp::Http1Close => {
            let mut sender = TcpStream::connect(gw.addr).await.expect("connect");
            let request = format!(
                "POST /hook HTTP/1.1\r\nHost: gw\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            sender.write_all(request.as_bytes()).await.expect("write");
            Sender::Connection(sender)
        }
        HangUp::H2Reset => {
            let (client, body) = (Client::h2c(gw.addr), body.clone());
            Sender::Stream(tokio::spawn(async move { client.post("/hook", &body).await }))
        }
    };
    let key = format!("dedup:bot:{id}");
    eventually("the claim to land in Redis", || {
        server.cli(&["GET", &key]).contains("processing")
    })
    .await;
    sender.hang_up(); // WeChat gives up after 5 s
    // Not synchronisation: nothing observable happens when hyper drops the handler of a
    // closed connection or a reset stream, so the test gives it that chance before the
    // late reply comes. (Without `Detached`, the claim then dies with the handler and
    // the h2 case times out waiting for the delivery below.)
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(upstream.count(), 0);
    proxy.release();

    upstream.wait_for(1).await;
    eventually("the marker to complete", || {
        server.cli(&["GET", &key]).contains("completed")
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

/// A failover behind a stable address (DNS, a managed endpoint, a proxy): the old
/// primary is demoted while the gateway's connections to it stay open, so every write
/// on them gets READONLY. The gateway must drop those connections and reach the new
/// primary by itself, within seconds, without a restart.
#[tokio::test]
async fn a_failover_behind_a_stable_address_heals_without_a_restart() {
    let old = RedisServer::start().await;
    let new = RedisServer::start().await;
    new.cli(&["REPLICAOF", "127.0.0.1", &old.port.to_string()]);
    let proxy = SwallowingProxy::start(old.addr()).await;
    let upstream = Upstream::ok().await;
    let gw = TestGateway::start(&redis_cfg(&proxy.url()), &upstream).await;
    let client = gw.client();
    assert_eq!(client.post("/hook", &msg("before")).await.dedup(), "forwarded");
    eventually("the replica to have the marker", || {
        new.cli(&["GET", "dedup:bot:before"]).contains("completed")
    })
    .await;

    // Fail over: promote the replica, demote the old primary; new connections now go to
    // the new primary, the gateway's open ones still reach the old one.
    new.cli(&["REPLICAOF", "NO", "ONE"]);
    old.cli(&["REPLICAOF", "127.0.0.1", &new.port.to_string()]);
    proxy.retarget(new.addr());
    eventually("the old primary to refuse writes", || {
        old.cli(&["SET", "probe", "1"]).contains("READONLY")
    })
    .await;

    let started = std::time::Instant::now();
    let mut refused = 0;
    for i in 0..20 {
        let r = client.post("/hook", &msg(&format!("after-{i}"))).await;
        match r.dedup() {
            "forwarded" => {}
            "store-unavailable" => refused += 1,
            other => panic!("{other}: {r:?}"),
        }
    }
    assert_eq!(refused, 0, "every READONLY claim was sent again on a fresh connection");
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    assert!(new.cli(&["GET", "dedup:bot:after-0"]).contains("completed"));
    assert_eq!(client.post("/hook", &msg("before")).await.dedup(), "duplicate");
    let admin = Client::http1(gw.admin.expect("admin"));
    eventually_ready(&admin, 200).await;
    assert_eq!(upstream.count(), 21);
}

/// Redis down when the gateway starts is an outage like any other: it starts, is not
/// ready, answers per `on_error`, and serves (deduping) once Redis answers.
#[tokio::test]
async fn a_gateway_started_while_redis_is_down_serves_once_it_comes_up() {
    let mut server = RedisServer::start().await;
    server.kill(); // the port stays reserved for the restart
    let upstream = Upstream::ok().await;
    let gw = TestGateway::start(&redis_cfg(&server.url()), &upstream).await;
    let admin = Client::http1(gw.admin.expect("admin"));
    eventually_ready(&admin, 503).await;
    let r = gw.client().post("/hook", &msg("early")).await;
    assert_eq!((r.status.as_u16(), r.dedup()), (503, "store-unavailable"), "{r:?}");
    assert_eq!(r.headers["retry-after"], "1");
    server.restart().await;
    eventually_ready(&admin, 200).await;
    assert_eq!(gw.client().post("/hook", &msg("early")).await.dedup(), "forwarded");
    assert_eq!(gw.client().post("/hook", &msg("early")).await.dedup(), "duplicate");
    assert!(server.cli(&["GET", "dedup:bot:early"]).contains("completed"));
    assert_eq!(upstream.count(), 1);
    // Not read at start, this Redis 7 was not sent SET IFEQ (it would answer ERR);
    // its scripts loaded on the first NOSCRIPT.
    let errors = server.cli(&["INFO", "errorstats"]);
    assert!(!errors.contains("errorstat_ERR"), "{errors}");
}

/// PING answers on a read-only replica; claims do not land there. Readiness must say
/// whether writes work.
#[tokio::test]
async fn readiness_reflects_writes_not_only_ping() {
    let primary = RedisServer::start().await;
    let replica = RedisServer::start().await;
    replica.cli(&["REPLICAOF", "127.0.0.1", &primary.port.to_string()]);
    let upstream = Upstream::ok().await;
    let gw = TestGateway::start(&redis_cfg(&replica.url()), &upstream).await;
    let admin = Client::http1(gw.admin.expect("admin"));
    eventually_ready(&admin, 503).await;
    let r = gw.client().post("/hook", &msg("nowhere")).await;
    assert_eq!((r.status.as_u16(), r.dedup()), (503, "store-unavailable"));
    assert_eq!(upstream.count(), 0);
    // Promoted: writable again, ready again, without a restart.
    replica.cli(&["REPLICAOF", "NO", "ONE"]);
    eventually_ready(&admin, 200).await;
    assert_eq!(gw.client().post("/hook", &msg("nowhere")).await.dedup(), "forwarded");
}

async fn eventually_ready(admin: &Client, status: u16) {
    crate::support::within(&format!("/readyz {status}"), async {
        while admin.send(http::Method::GET, "/readyz", &[], "").await.status.as_u16() != status {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
}

// ---------------------------------------------------------------- slow clients

/// Writes `bytes` one at a time, `gap` apart, until they are all out or the gateway
/// closes the connection; returns what the gateway answered and when it closed.
async fn trickle(stream: tokio::net::TcpStream, head: &[u8], bytes: &[u8], gap: Duration) -> (String, Duration) {
    use tokio::io::AsyncReadExt;
    let (mut read, mut write) = stream.into_split();
    write.write_all(head).await.expect("head");
    let started = std::time::Instant::now();
    let bytes = bytes.to_vec();
    let writer = tokio::spawn(async move {
        for b in bytes {
            if write.write_all(&[b]).await.is_err() {
                return;
            }
            tokio::time::sleep(gap).await;
        }
        std::future::pending::<()>().await; // keep the write side open
    });
    let mut answer = Vec::new();
    let _ = crate::support::within("the gateway to cut the slow client off", read.read_to_end(&mut answer)).await;
    writer.abort();
    (String::from_utf8_lossy(&answer).into_owned(), started.elapsed())
}

fn slow_cfg() -> Cfg {
    Cfg::new()
        .server("header_timeout = \"400ms\"")
        .server("body_timeout = \"600ms\"")
        .server("idle_timeout = \"800ms\"")
}

/// One byte every 100 ms of a 100-byte body would take 10 s; `body_timeout` ends it,
/// with 400 `bad-request`, while other requests are served as usual.
#[tokio::test]
async fn a_body_trickled_byte_by_byte_is_cut_off_by_body_timeout() {
    let upstream = Upstream::ok().await;
    let gw = TestGateway::start(&slow_cfg(), &upstream).await;
    let stream = TcpStream::connect(gw.addr).await.expect("connect");
    let head = b"POST /hook HTTP/1.1\r\nHost: gw\r\nContent-Length: 100\r\n\r\n";
    let slow = tokio::spawn(trickle(stream, head, &[b'x'; 100], Duration::from_millis(100)));
    for i in 0..5 {
        assert_eq!(
            gw.client().post("/hook", &msg(&format!("meanwhile-{i}"))).await.dedup(),
            "forwarded"
        );
    }
    let (answer, took) = slow.await.expect("slow client");
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("x-dedup-status: bad-request"), "{answer}");
    assert!(
        took < Duration::from_secs(5),
        "cut off after {took:?}, not at the end of the trickle"
    );
    assert_eq!(
        gw.metric(r#"dedup_requests_total{route="bot",outcome="bad_request"}"#),
        1.0
    );
    assert_eq!(upstream.count(), 5);
}

/// A head trickled byte by byte: hyper's header timer is not reset by each byte.
#[tokio::test]
async fn a_head_trickled_byte_by_byte_is_cut_off_by_header_timeout() {
    let upstream = Upstream::ok().await;
    let gw = TestGateway::start(&slow_cfg(), &upstream).await;
    let stream = TcpStream::connect(gw.addr).await.expect("connect");
    let (answer, took) = trickle(
        stream,
        b"POST /hook HTTP/1.1\r\n",
        &[b'X'; 100],
        Duration::from_millis(100),
    )
    .await;
    assert!(answer.is_empty() || answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(took < Duration::from_secs(5), "cut off after {took:?}");
    assert_eq!(upstream.count(), 0);
}

/// A lone `P` may open `POST` or the h2c preface, so the gateway waits for the next
/// byte before hyper sees the connection; that wait is part of the first head's
/// `header_timeout`: a head that would end within `header_timeout` of hyper's start,
/// but not of its first byte, is cut off.
#[tokio::test]
async fn the_wait_to_tell_http1_from_h2c_counts_against_header_timeout() {
    let upstream = Upstream::ok().await;
    let gw = TestGateway::start(&Cfg::new().server("header_timeout = \"1s\""), &upstream).await;
    let body = msg("sniffed-slowly");
    let head = format!("OST /hook HTTP/1.1\r\nHost: gw\r\nContent-Length: {}\r\n", body.len());
    let answer = in_parts(gw.addr, [("P".into(), 900), (head, 700), ("\r\n".into(), 0), (body, 0)]).await;
    assert!(answer.is_empty() || answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert_eq!(upstream.count(), 0);
}

/// Writes each part and then waits its pause (ms), keeping the write side open after
/// the last; returns what the gateway answered by the time it closed the connection.
async fn in_parts<const N: usize>(addr: std::net::SocketAddr, parts: [(String, u64); N]) -> String {
    use tokio::io::AsyncReadExt;
    let (mut read, mut write) = TcpStream::connect(addr).await.expect("connect").into_split();
    let writer = tokio::spawn(async move {
        for (part, then) in parts {
            if write.write_all(part.as_bytes()).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(then)).await;
        }
        std::future::pending::<()>().await; // keep the write side open
    });
    let mut answer = Vec::new();
    let _ = crate::support::within("the gateway to close the connection", read.read_to_end(&mut answer)).await;
    writer.abort();
    String::from_utf8_lossy(&answer).into_owned()
}

/// `idle_timeout` the shorter of the two, so that HTTP/1 connections get a watchdog.
fn idle_first_cfg() -> Cfg {
    Cfg::new()
        .server("header_timeout = \"60s\"")
        .server("idle_timeout = \"800ms\"")
}

/// `idle_timeout` shorter than `header_timeout`: a head that takes longer than
/// `idle_timeout` to arrive is served (a request on its way is not idleness), and the
/// kept-alive connection is closed once it has carried nothing for `idle_timeout`,
/// not when `header_timeout` runs out.
#[tokio::test]
async fn an_idle_http1_connection_is_closed_at_idle_timeout_when_that_is_the_shorter() {
    let upstream = Upstream::ok().await;
    let gw = TestGateway::start(&idle_first_cfg(), &upstream).await;
    let body = msg("slow-head");
    let head = format!("POST /hook HTTP/1.1\r\nHost: gw\r\nContent-Length: {}\r\n", body.len());
    let rest = format!("X-Slow: {}\r\n\r\n{body}", "s".repeat(20));
    let stream = TcpStream::connect(gw.addr).await.expect("connect");
    // The rest of the head comes over about 1.6 s: twice idle_timeout.
    let gap = Duration::from_millis(1600 / rest.len() as u64);
    let (answer, took) = trickle(stream, head.as_bytes(), rest.as_bytes(), gap).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("x-dedup-status: forwarded"), "{answer}");
    assert!(took < Duration::from_secs(10), "closed after {took:?}");
    assert_eq!(upstream.count(), 1);
}

/// An h2c connection: one stream trickles its body and is answered 400 at
/// `body_timeout`; another stream on the same connection is served meanwhile.
#[tokio::test]
async fn an_h2_stream_trickling_its_body_is_cut_off_and_the_connection_serves_on() {
    use http_body_util::BodyExt;
    let upstream = Upstream::ok().await;
    let gw = TestGateway::start(&slow_cfg(), &upstream).await;
    let io = hyper_util::rt::TokioIo::new(TcpStream::connect(gw.addr).await.expect("connect"));
    let (mut send, conn) = hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
        .await
        .expect("h2 handshake");
    tokio::spawn(conn);
    let (tx, rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(1);
    let slow = http::Request::post(format!("http://{}/hook", gw.addr))
        .body(Trickle(rx).boxed())
        .expect("request");
    let slow = tokio::spawn(send.send_request(slow));
    let trickler = tokio::spawn(async move {
        for _ in 0..100 {
            if tx.send(bytes::Bytes::from_static(b"x")).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let started = std::time::Instant::now();
    let fast = http::Request::post(format!("http://{}/hook", gw.addr))
        .body(http_body_util::Full::new(bytes::Bytes::from(msg("h2-fast"))).boxed())
        .expect("request");
    let mut fast_sender = send.clone();
    let fast = fast_sender.send_request(fast).await.expect("fast stream");
    assert_eq!(fast.headers()["x-dedup-status"], "forwarded");
    let slow = crate::support::within("the slow stream's answer", slow)
        .await
        .expect("join")
        .expect("answer");
    assert_eq!(slow.status().as_u16(), 400);
    assert_eq!(slow.headers()["x-dedup-status"], "bad-request");
    assert!(started.elapsed() < Duration::from_secs(5));
    trickler.abort();
    assert_eq!(upstream.count(), 1);
}

/// A request body whose chunks come from a channel, as slowly as the test sends them.
struct Trickle(tokio::sync::mpsc::Receiver<bytes::Bytes>);

impl http_body::Body for Trickle {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|b| Ok(http_body::Frame::data(b))))
    }
}

/// One h2 frame: length, type, flags, stream id, payload.
pub fn h2_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() as u32).to_be_bytes();
    let mut f = vec![len[1], len[2], len[3], kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// HEADERS without END_HEADERS, then CONTINUATION frames that never end the block: hyper
/// sees no request until the block ends, so only `header_timeout` on the open block
/// ends it. The connection is dropped; a normal h2c client is served meanwhile.
#[tokio::test]
async fn an_h2_header_block_left_open_is_cut_off_by_header_timeout() {
    let upstream = Upstream::ok().await;
    let gw = TestGateway::start(&slow_cfg(), &upstream).await;
    let mut head = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    head.extend(h2_frame(0x4, 0, 0, &[])); // SETTINGS
    // :method POST, :scheme http, :path / (static table), no END_HEADERS, no END_STREAM.
    head.extend(h2_frame(0x1, 0, 1, &[0x83, 0x86, 0x84]));
    // Then one empty CONTINUATION (no END_HEADERS) every 100 ms, for 10 s.
    let continuation = h2_frame(0x9, 0, 1, &[]);
    let trickled: Vec<u8> = continuation
        .iter()
        .copied()
        .cycle()
        .take(continuation.len() * 100)
        .collect();
    let stream = TcpStream::connect(gw.addr).await.expect("connect");
    let slow = tokio::spawn(async move {
        trickle(
            stream,
            &head,
            &trickled,
            Duration::from_millis(100 / continuation.len() as u64),
        )
        .await
    });
    let h2 = crate::support::Client::h2c(gw.addr);
    assert_eq!(h2.post("/hook", &msg("h2-meanwhile")).await.dedup(), "forwarded");
    let (_, took) = slow.await.expect("slow client");
    assert!(took < Duration::from_secs(5), "cut off after {took:?}");
    assert_eq!(upstream.count(), 1);
}

/// With `idle_timeout` the shorter, a head that pauses for longer than `idle_timeout`
/// (but ends within `header_timeout`) is a request on its way: served, not closed as
/// idle. The pause comes after bytes the protocol sniff took whole.
#[tokio::test]
async fn a_head_pausing_longer_than_idle_timeout_is_still_served() {
    let upstream = Upstream::ok().await;
    let gw = TestGateway::start(&idle_first_cfg(), &upstream).await;
    let body = msg("paused-head");
    let rest = format!(
        "Host: gw\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    // A pause of about twice idle_timeout, after what the protocol sniff takes whole.
    let answer = in_parts(gw.addr, [("POST /hook HTTP/1.1\r\n".into(), 1600), (rest, 0)]).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("x-dedup-status: forwarded"), "{answer}");
    assert_eq!(upstream.count(), 1);
}

/// A raw upstream answering each request with `chunks` one-byte chunks, one every
/// `gap`: a response that streams for longer than `idle_timeout`.
fn streaming_upstream(chunks: usize, gap: Duration) -> http::uri::Authority {
    let (listener, authority) = crate::support::raw_listener();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            std::thread::spawn(move || {
                use std::io::Write;
                while crate::support::read_raw_request(&mut stream).is_some() {
                    let _ = stream.write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n");
                    for _ in 0..chunks {
                        std::thread::sleep(gap);
                        if stream.write_all(b"1\r\nx\r\n").is_err() {
                            return;
                        }
                    }
                    let _ = stream.write_all(b"0\r\n\r\n");
                }
            });
        }
    });
    authority
}

/// A response still streaming out when its connection has had no new request for
/// `idle_timeout` is delivered whole: on h2c (the idle GOAWAY) and on HTTP/1 (with
/// `idle_timeout` the shorter, so that the watchdog runs).
#[tokio::test]
async fn a_response_streaming_past_idle_timeout_is_delivered_whole() {
    let upstream = format!("http://{}", streaming_upstream(8, Duration::from_millis(300)));
    for (cfg, h2) in [(slow_cfg(), true), (idle_first_cfg(), false)] {
        let gw = TestGateway::start_toml(&cfg.toml(&upstream)).await;
        let client = if h2 {
            Client::h2c(gw.addr)
        } else {
            Client::http1(gw.addr)
        };
        let r = client.send(http::Method::GET, "/hook", &[], "").await;
        assert_eq!(
            (r.status.as_u16(), r.body.as_str(), r.dedup()),
            (200, "xxxxxxxx", "bypass"),
            "h2c: {h2}"
        );
    }
}

/// An idle h2c connection whose client never answers the GOAWAY's PING is closed all
/// the same.
#[tokio::test]
async fn an_idle_h2_client_that_never_answers_the_goaway_ping_is_closed() {
    let upstream = Upstream::ok().await;
    let gw = TestGateway::start(&slow_cfg(), &upstream).await;
    let mut preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    preface.extend(h2_frame(0x4, 0, 0, &[])); // SETTINGS; then it acknowledges nothing
    let stream = TcpStream::connect(gw.addr).await.expect("connect");
    let (_, took) = trickle(stream, &preface, &[], Duration::ZERO).await;
    assert!(took < Duration::from_secs(10), "closed after {took:?}");
    assert_eq!(upstream.count(), 0);
}

/// An h2c connection with no stream is closed after `idle_timeout` (GOAWAY); one whose
/// stream outlasts `idle_timeout` (a slow bot) is not.
#[tokio::test]
async fn idle_h2_connections_are_closed_and_busy_ones_are_not() {
    let gate = Gate::new();
    let upstream = Upstream::gated(&gate, "slow").await;
    let gw = TestGateway::start(&slow_cfg(), &upstream).await;
    let connect = || async {
        let io = hyper_util::rt::TokioIo::new(TcpStream::connect(gw.addr).await.expect("connect"));
        hyper::client::conn::http2::handshake::<_, _, http_body_util::Full<bytes::Bytes>>(
            hyper_util::rt::TokioExecutor::new(),
            io,
        )
        .await
        .expect("h2 handshake")
    };
    // Busy: a request held by the bot for twice idle_timeout still gets its answer.
    let (mut send, conn) = connect().await;
    let busy_conn = tokio::spawn(conn);
    let request = http::Request::post(format!("http://{}/hook", gw.addr))
        .body(http_body_util::Full::new(bytes::Bytes::from(msg("busy"))))
        .expect("request");
    let answer = tokio::spawn(send.send_request(request));
    upstream.wait_for(1).await;
    tokio::time::sleep(Duration::from_millis(1600)).await; // the bot is slow: 2 x idle_timeout
    assert!(
        !busy_conn.is_finished(),
        "a connection with a stream in progress is not idle"
    );
    gate.open(1);
    let answer = answer.await.expect("join").expect("answer");
    assert_eq!(answer.headers()["x-dedup-status"], "forwarded");
    // Idle from then on: closed by the gateway.
    let started = std::time::Instant::now();
    crate::support::within("the idle h2 connection to be closed", busy_conn)
        .await
        .expect("join")
        .expect("a clean close (GOAWAY)");
    assert!(started.elapsed() < Duration::from_secs(5));
    // Idle from the start (the preface, no stream): closed too.
    let (_send, conn) = connect().await;
    crate::support::within("a connection without streams to be closed", conn)
        .await
        .expect("a clean close (GOAWAY)");
}
