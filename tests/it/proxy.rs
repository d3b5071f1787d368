//! The HTTP side: routing, pass-through, proxy headers, body limits, RFC 9112 framing,
//! header timeout, and HTTP/2 (h2c) behaving as HTTP/1.1 does.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::Method;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{Cfg, Client, TestGateway, Upstream, chunked, msg, raw_listener, read_raw_request, within};

/// Writes raw bytes, sends nothing more, and reads everything the gateway answers
/// until it closes the connection (which it must, for the test to finish).
async fn raw(addr: std::net::SocketAddr, request: &[u8]) -> String {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.write_all(request).await.expect("write");
    let mut out = Vec::new();
    within("the gateway to close the connection", stream.read_to_end(&mut out))
        .await
        .expect("read");
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn unknown_paths_get_404_without_a_dedup_status() {
    let upstream = Upstream::ok().await;
    let gw = TestGateway::start(&Cfg::new(), &upstream).await;
    let r = gw.client().post("/nope", &msg("x")).await;
    assert_eq!(r.status, 404);
    assert!(r.headers.get("x-dedup-status").is_none());
    assert_eq!(upstream.count(), 0);
}

#[tokio::test]
async fn other_methods_stream_through_untouched_and_undeduped() {
    let upstream = Upstream::ok().await;
    let gw = TestGateway::start(&Cfg::new(), &upstream).await;
    let client = gw.client();
    for _ in 0..2 {
        let r = client.send(Method::GET, "/hook?signature=s&echostr=e1", &[], "").await;
        assert_eq!((r.status.as_u16(), r.dedup()), (200, "bypass"));
    }
    let r = client.send(Method::DELETE, "/hook", &[], &msg("d")).await;
    assert_eq!(r.dedup(), "bypass");
    let got = upstream.received();
    assert_eq!(got.len(), 3);
    assert_eq!(got[0].uri, "/hook?signature=s&echostr=e1");
    assert_eq!(got[2].method, Method::DELETE);
    assert_eq!(got[2].body, msg("d").as_bytes());
}

#[tokio::test]
async fn prefix_routes_forward_path_and_query_unchanged() {
    let upstream = Upstream::ok().await;
    let cfg = Cfg::new().extra(
        "[[routes]]\nname = \"gh\"\npath = \"/gh/*\"\nupstream = \"{upstream}\"\nkey = [\"header:X-GitHub-Delivery\"]\n",
    );
    let gw = TestGateway::start(&cfg, &upstream).await;
    let client = gw.client();
    let h = [("x-github-delivery", "d-1")];
    assert_eq!(
        client.send(Method::POST, "/gh/repo/events?x=1", &h, "{}").await.dedup(),
        "forwarded"
    );
    assert_eq!(
        client.send(Method::POST, "/gh/other", &h, "{}").await.dedup(),
        "duplicate"
    );
    assert_eq!(upstream.received()[0].uri, "/gh/repo/events?x=1");
}

#[tokio::test]
async fn forwarded_requests_carry_proxy_headers_and_the_exact_body() {
    let upstream = Upstream::ok().await;
    let gw = TestGateway::start(&Cfg::new(), &upstream).await;
    let body = "{\"msgId\":\"hdr\",\"text\":\"caf\u{e9} \u{1F600}\",\"pad\":\"  \\n\"}";
    let r = gw
        .client()
        .send(
            Method::POST,
            "/hook?q=1",
            &[
                ("host", "bot.example"),
                ("connection", "x-hop"),
                ("x-hop", "secret"),
                ("x-forwarded-for", "192.0.2.7"),
                ("x-custom", "kept"),
            ],
            body,
        )
        .await;
    assert_eq!(r.dedup(), "forwarded");
    let got = &upstream.received()[0];
    assert_eq!(got.body, body.as_bytes());
    assert_eq!(got.uri, "/hook?q=1");
    assert_eq!(got.headers["x-forwarded-for"], "192.0.2.7, 127.0.0.1");
    assert_eq!(got.headers["x-forwarded-proto"], "http");
    assert_eq!(got.headers["x-forwarded-host"], "bot.example");
    assert_eq!(got.headers["host"], "bot.example");
    assert_eq!(got.headers["x-custom"], "kept");
    assert!(
        got.headers.get("x-hop").is_none(),
        "fields named in Connection are hop-by-hop"
    );
}

#[tokio::test]
async fn bodies_over_max_body_get_413_whether_sized_or_chunked() {
    let upstream = Upstream::ok().await;
    let gw = TestGateway::start(&Cfg::new().server("max_body = \"1KiB\""), &upstream).await;
    let big = format!("{{\"msgId\":\"big\",\"pad\":\"{}\"}}", "x".repeat(2000));

    let r = gw.client().post("/hook", &big).await;
    assert_eq!((r.status.as_u16(), r.dedup()), (413, "too-large"));
    assert_eq!(r.headers["connection"], "close");

    let head = b"POST /hook HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    let chunked = chunked(head, big.as_bytes(), 300);
    let answer = raw(gw.addr, &chunked).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("x-dedup-status: too-large"), "{answer}");

    assert_eq!(upstream.count(), 0, "nothing forwarded");
    // Nothing stored either: the same id under the limit is a first sighting.
    assert_eq!(gw.client().post("/hook", &msg("big")).await.dedup(), "forwarded");
    assert_eq!(
        gw.metric(r#"dedup_requests_total{route="bot",outcome="too_large"}"#),
        2.0
    );
}

#[tokio::test]
async fn ambiguous_framing_gets_400_and_a_closed_connection() {
    let upstream = Upstream::ok().await;
    let gw = TestGateway::start(&Cfg::new(), &upstream).await;
    let body = msg("smuggle");
    for head in [
        format!("Content-Length: {}\r\nTransfer-Encoding: chunked", body.len()),
        format!("Transfer-Encoding: chunked\r\nContent-Length: {}", body.len()),
        format!("Content-Length: {}\r\nContent-Length: {}", body.len(), body.len() + 1),
    ] {
        let request = format!(
            "POST /hook HTTP/1.1\r\nHost: gw\r\n{head}\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\nGET /hook HTTP/1.1\r\nHost: gw\r\n\r\n",
            body.len()
        );
        let answer = raw(gw.addr, request.as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{head:?}: {answer}");
        assert_eq!(answer.matches("HTTP/1.1").count(), 1, "closed after the 400: {answer}");
    }
    assert_eq!(upstream.count(), 0);
}

/// A Content-Length line longer than 1 KiB (leading zeros are valid digits) must not
/// throw the framing guard off: the guard skips exactly the body hyper reads, so the
/// pipelined request after it, framed by both fields, still gets its 400. (The guard
/// before it truncated header lines at 1 KiB, read this length as 0, took the body for
/// the next head and skipped the smuggled one: the upstream got both requests.)
#[tokio::test]
async fn a_long_content_length_line_does_not_let_a_smuggled_request_through() {
    let upstream = Upstream::ok().await;
    let gw = TestGateway::start(&Cfg::new(), &upstream).await;
    let smuggled = msg("smuggled");
    let chunked = format!("{:x}\r\n{smuggled}\r\n0\r\n\r\n", smuggled.len());
    let second = format!(
        "POST /hook HTTP/1.1\r\nHost: gw\r\nContent-Length: {}\r\nTransfer-Encoding: chunked\r\n\r\n{chunked}",
        smuggled.len()
    );
    // A body that reads as a request head whose length covers the second request.
    let decoy = format!(
        "GET /decoy HTTP/1.1\r\nHost: gw\r\nContent-Length: {}\r\n\r\n",
        second.len()
    );
    let length = format!("{}{}", "0".repeat(1100), decoy.len());
    let request = format!("POST /hook HTTP/1.1\r\nHost: gw\r\nContent-Length: {length}\r\n\r\n{decoy}{second}");
    let answer = raw(gw.addr, request.as_bytes()).await;
    let statuses: Vec<&str> = answer
        .match_indices("HTTP/1.1 ")
        .map(|(i, _)| &answer[i + 9..i + 12])
        .collect();
    assert_eq!(statuses, ["200", "400"], "{answer}");
    let received = upstream.received();
    assert_eq!(received.len(), 1, "only the first request reaches the upstream");
    assert_eq!(received[0].body, decoy.as_bytes());
}

#[tokio::test]
async fn header_timeout_cuts_off_slow_silent_and_idle_clients() {
    let upstream = Upstream::ok().await;
    let cfg = Cfg::new()
        .server("header_timeout = \"300ms\"")
        .server("idle_timeout = \"300ms\""); // a connection that sends nothing is idle
    let gw = TestGateway::start(&cfg, &upstream).await;
    // Half a head.
    let text = raw(gw.addr, b"POST /hook HTTP/1.1\r\nHost: gw\r\n").await;
    assert!(text.is_empty() || text.starts_with("HTTP/1.1 408"), "{text}");
    // Nothing at all, and a prefix of the HTTP/2 preface.
    assert_eq!(raw(gw.addr, b"").await, "");
    assert_eq!(raw(gw.addr, b"PRI * HT").await, "");
    // A kept-alive connection idle after its first request.
    let body = msg("ka");
    let request = format!(
        "POST /hook HTTP/1.1\r\nHost: gw\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let text = raw(gw.addr, request.as_bytes()).await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert_eq!(text.matches("HTTP/1.1").count(), 1, "{text}");
    assert_eq!(upstream.count(), 1);
}

/// The header timer restarts with each request: a kept-alive connection whose client
/// sends a request every half `header_timeout` is served for many times that long.
#[tokio::test]
async fn a_busy_kept_alive_connection_outlives_header_timeout() {
    let upstream = Upstream::ok().await;
    let cfg = Cfg::new().server("header_timeout = \"300ms\"");
    let gw = TestGateway::start(&cfg, &upstream).await;
    let mut stream = TcpStream::connect(gw.addr).await.expect("connect");
    let started = std::time::Instant::now();
    for i in 0..8 {
        let body = msg(&format!("busy-{i}"));
        let request = format!(
            "POST /hook HTTP/1.1\r\nHost: gw\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(request.as_bytes()).await.expect("write");
        let head = within("a response", read_response(&mut stream)).await;
        assert!(head.starts_with("HTTP/1.1 200"), "request {i}: {head}");
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert!(started.elapsed() > Duration::from_millis(900));
    assert_eq!(upstream.count(), 8);
}

/// Reads one response (with a `Content-Length` body) and returns its head.
async fn read_response(stream: &mut TcpStream) -> String {
    let mut buf = Vec::new();
    loop {
        let mut chunk = [0u8; 1024];
        let n = stream.read(&mut chunk).await.expect("read");
        assert!(n > 0, "closed after {:?}", String::from_utf8_lossy(&buf));
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf).into_owned();
        let Some(end) = text.find("\r\n\r\n") else { continue };
        let length: usize = text[..end]
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length:")
                    .map(|v| v.trim().parse().expect("length"))
            })
            .expect("content-length");
        if buf.len() >= end + 4 + length {
            return text[..end].to_owned();
        }
    }
}

#[tokio::test]
async fn h2c_behaves_like_http1() {
    let upstream = Upstream::ok().await;
    let gw = TestGateway::start(&Cfg::new().server("max_body = \"1KiB\""), &upstream).await;
    let h2 = Client::h2c(gw.addr);
    let first = h2.post("/hook", &msg("h2")).await;
    assert_eq!(
        (first.status.as_u16(), first.dedup(), first.body.as_str()),
        (200, "forwarded", r#"{"reply":"ok h2"}"#)
    );
    let dup = h2.post("/hook", &msg("h2")).await;
    assert_eq!(
        (dup.status.as_u16(), dup.dedup(), dup.body.as_str()),
        (200, "duplicate", "success")
    );
    // Across protocols it is the same message.
    assert_eq!(gw.client().post("/hook", &msg("h2")).await.dedup(), "duplicate");
    let big = h2.post("/hook", &"x".repeat(2000)).await;
    assert_eq!((big.status.as_u16(), big.dedup()), (413, "too-large"));
    let get = h2.send(Method::GET, "/hook?echostr=1", &[], "").await;
    assert_eq!(get.dedup(), "bypass");
    assert_eq!(h2.post("/nope", "{}").await.status, 404);
    let got = upstream.received();
    assert_eq!(got.len(), 2);
    assert!(
        got[0].headers.get("host").is_some(),
        "h2 requests reach the upstream with a Host"
    );
}

#[tokio::test]
async fn a_body_cut_off_midway_is_a_bad_request_not_a_rejection() {
    let upstream = Upstream::ok().await;
    let gw = TestGateway::start(&Cfg::new(), &upstream).await;
    let mut stream = TcpStream::connect(gw.addr).await.expect("connect");
    stream
        .write_all(b"POST /hook HTTP/1.1\r\nHost: gw\r\nContent-Length: 100\r\n\r\n{\"msgId\":\"cut\"")
        .await
        .expect("write");
    stream.shutdown().await.expect("half-close");
    let mut out = Vec::new();
    within("the answer to a cut-off body", stream.read_to_end(&mut out))
        .await
        .expect("read");
    let text = String::from_utf8_lossy(&out);
    // hyper may close without an answer once the peer is gone; if it answers, it says why.
    if !text.is_empty() {
        assert!(text.starts_with("HTTP/1.1 400"), "{text}");
        assert!(text.contains("x-dedup-status: bad-request"), "{text}");
    }
    let series = |o: &str| format!("dedup_requests_total{{route=\"bot\",outcome=\"{o}\"}}");
    crate::support::eventually("the cut-off body to be counted", || {
        gw.metric(&series("bad_request")) == 1.0
    })
    .await;
    assert_eq!(gw.metric(&series("rejected")), 0.0);
    assert_eq!(upstream.count(), 0);
    assert_eq!(gw.metric(r#"dedup_store_duration_seconds_count{op="claim"}"#), 0.0);
}

/// A raw HTTP/1.1 upstream: on each connection it reads requests (heads with a
/// Content-Length body), records each body, and answers `answers_per_connection` of
/// them with a keep-alive `200 success` (no `Connection: close`, so the gateway keeps
/// the connection); then it closes the socket, after reading one more request if
/// `read_then_close` (a request that was written and may have been acted on).
/// `closed` lists the connections it has closed: (the gateway's end, its own end).
fn closing_upstream(answers_per_connection: usize, read_then_close: bool) -> ClosingUpstream {
    let (listener, authority) = raw_listener();
    let upstream = ClosingUpstream {
        url: format!("http://{authority}"),
        seen: Arc::default(),
        closed: Arc::default(),
    };
    let (log, closed) = (Arc::clone(&upstream.seen), Arc::clone(&upstream.closed));
    std::thread::spawn(move || {
        while let Ok((stream, gateway_end)) = listener.accept() {
            let (log, closed) = (Arc::clone(&log), Arc::clone(&closed));
            std::thread::spawn(move || {
                let own_end = stream.local_addr().expect("addr");
                serve_then_close(stream, &log, answers_per_connection, read_then_close);
                closed.lock().expect("closed").push((gateway_end, own_end));
            });
        }
    });
    upstream
}

struct ClosingUpstream {
    url: String,
    seen: Arc<Mutex<Vec<String>>>,
    closed: Arc<Mutex<Vec<(std::net::SocketAddr, std::net::SocketAddr)>>>,
}

/// One connection of [`closing_upstream`]; the socket closes when it returns.
fn serve_then_close(mut stream: std::net::TcpStream, log: &Mutex<Vec<String>>, answers: usize, read_then_close: bool) {
    for n in 0.. {
        let Some(body) = read_raw_request(&mut stream) else {
            return;
        };
        log.lock().expect("log").push(body);
        if n == answers {
            return; // read_then_close: the request is in, and no answer comes
        }
        let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 7\r\n\r\nsuccess";
        if std::io::Write::write_all(&mut stream, answer).is_err() {
            return;
        }
        if n + 1 == answers && !read_then_close {
            return;
        }
    }
}

#[tokio::test]
async fn an_upstream_closing_kept_alive_connections_loses_and_doubles_nothing() {
    let upstream = closing_upstream(1, false);
    let toml = Cfg::new().server("workers = 1").toml(&upstream.url);
    let gw = TestGateway::start_toml(&toml).await;
    let client = gw.client();
    for i in 0..30 {
        let r = client.post("/hook", &msg(&format!("kept-{i}"))).await;
        assert_eq!(
            (r.status.as_u16(), r.dedup()),
            (200, "forwarded"),
            "request {i}: {}",
            r.body
        );
        // The next request goes out once the upstream's close of this connection has
        // reached the gateway's socket, which the gateway may not have read yet. (A
        // close that arrives after the next request was written is a race no client
        // wins: the upstream may have read it.)
        crate::support::eventually("the upstream to close the connection", || {
            upstream.closed.lock().expect("closed").len() == i + 1
        })
        .await;
        let (gateway_end, own_end) = upstream.closed.lock().expect("closed")[i];
        crate::support::await_close_delivered(gateway_end, own_end);
    }
    let seen = upstream.seen.lock().expect("log").clone();
    let expected: Vec<String> = (0..30).map(|i| msg(&format!("kept-{i}"))).collect();
    assert_eq!(seen, expected, "each message reached the upstream once, in order");
}

#[tokio::test]
async fn a_request_the_upstream_read_before_closing_is_never_sent_again() {
    // The first request on each connection is answered; the second is read, then the
    // connection closes without an answer. It may have been acted on: 502, not a resend.
    let ClosingUpstream { url, seen, .. } = closing_upstream(1, true);
    let toml = Cfg::new().server("workers = 1").toml(&url);
    let gw = TestGateway::start_toml(&toml).await;
    let client = gw.client();
    let first = client.post("/hook", &msg("answered")).await;
    assert_eq!((first.status.as_u16(), first.dedup()), (200, "forwarded"));
    let second = client.post("/hook", &msg("read-then-closed")).await;
    assert_eq!(second.status.as_u16(), 502, "{}", second.body);
    assert_eq!(
        seen.lock().expect("log").clone(),
        vec![msg("answered"), msg("read-then-closed")]
    );
    assert_eq!(
        gw.metric(r#"dedup_upstream_responses_total{route="bot",class="error"}"#),
        1.0
    );
    // The claim was released: the sender's retry is forwarded (on a fresh connection).
    let retry = client.post("/hook", &msg("read-then-closed")).await;
    assert_eq!((retry.status.as_u16(), retry.dedup()), (200, "forwarded"));
    let seen = seen.lock().expect("log").clone();
    assert_eq!(
        seen,
        vec![msg("answered"), msg("read-then-closed"), msg("read-then-closed")]
    );
}
