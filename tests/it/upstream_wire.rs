//! The upstream client (src/client.rs) through the gateway, against raw upstreams that
//! answer in each framing RFC 9112 allows: what the sender gets, whether the upstream
//! connection is used again, and what a malformed answer costs (502, claim released).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};

use http::Method;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::{Cfg, TestGateway, chunked, msg, raw_listener, within};

/// One request as a raw upstream read it: (connection number from 1, head, body with
/// any chunked framing undone).
type Seen = Arc<Mutex<Vec<(usize, String, Vec<u8>)>>>;

/// Reads one request (Content-Length or chunked body); `None` at EOF.
fn read_request(reader: &mut BufReader<TcpStream>) -> Option<(String, Vec<u8>)> {
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        head.push_str(&line);
        if line == "\r\n" {
            break;
        }
    }
    let lower = head.to_ascii_lowercase();
    let header = |name: &str| {
        lower
            .lines()
            .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_owned()))
    };
    let mut body = Vec::new();
    if header("transfer-encoding:").as_deref() == Some("chunked") {
        loop {
            let mut size = String::new();
            reader.read_line(&mut size).ok()?;
            let size = usize::from_str_radix(size.trim(), 16).expect("chunk size");
            let mut chunk = vec![0u8; size + 2];
            reader.read_exact(&mut chunk).ok()?;
            if size == 0 {
                break; // no trailers: the last chunk's CRLF was the end
            }
            body.extend_from_slice(&chunk[..size]);
        }
    } else if let Some(length) = header("content-length:") {
        body.resize(length.parse().expect("content-length"), 0);
        reader.read_exact(&mut body).ok()?;
    }
    Some((head, body))
}

/// An upstream that answers every request with `answer`'s pieces (written apart, with
/// a flush between, so the gateway reads them in several reads), then closes the
/// connection if `close`, else reads the next request on it.
fn scripted(answer: Vec<Vec<u8>>, close: bool) -> (String, Seen) {
    let (listener, authority) = raw_listener();
    let seen: Seen = Arc::default();
    let log = Arc::clone(&seen);
    std::thread::spawn(move || {
        for (n, stream) in listener.incoming().enumerate() {
            let Ok(stream) = stream else { return };
            let (log, answer) = (Arc::clone(&log), answer.clone());
            std::thread::spawn(move || {
                let mut writer = stream.try_clone().expect("clone");
                let mut reader = BufReader::new(stream);
                while let Some((head, body)) = read_request(&mut reader) {
                    log.lock().expect("log").push((n + 1, head, body));
                    for piece in &answer {
                        if writer.write_all(piece).and_then(|()| writer.flush()).is_err() {
                            return;
                        }
                        std::thread::sleep(std::time::Duration::from_millis(2));
                    }
                    if close {
                        return;
                    }
                }
            });
        }
    });
    (format!("http://{authority}"), seen)
}

fn pieces(parts: &[&str]) -> Vec<Vec<u8>> {
    parts.iter().map(|p| p.as_bytes().to_vec()).collect()
}

async fn one_worker_gateway(url: &str, route: &str) -> TestGateway {
    TestGateway::start_toml(&Cfg::new().server("workers = 1").route(route).toml(url)).await
}

#[tokio::test]
async fn every_framing_reaches_the_sender_whole_and_only_delimited_ones_keep_the_connection() {
    // (what, the answer's pieces, the upstream closes after it, connection reused)
    let cases: [(&str, Vec<Vec<u8>>, bool, bool); 8] = [
        (
            "content-length, head and body apart",
            pieces(&["HTTP/1.1 200 OK\r\ncontent-length: 11\r\n\r\n", "hello", " world"]),
            false,
            true,
        ),
        (
            "chunked, with an extension and a trailer",
            pieces(&[
                "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5;x=1\r\nhel",
                "lo\r\n6\r\n world\r\n",
                "0\r\nx-trailer: t\r\n\r\n",
            ]),
            false,
            true,
        ),
        (
            "interim 100 and 103 before the answer",
            pieces(&[
                "HTTP/1.1 100 Continue\r\n\r\n",
                "HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 11\r\n\r\nhello world",
            ]),
            false,
            true,
        ),
        (
            "chunked, with a content-length beside it (not passed on)",
            pieces(&[
                "HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n",
                "b\r\nhello world\r\n0\r\n\r\n",
            ]),
            false,
            false,
        ),
        (
            "bytes after the answer (not reused: they are nobody's)",
            pieces(&["HTTP/1.1 200 OK\r\ncontent-length: 11\r\n\r\nhello worldEXTRA"]),
            false,
            false,
        ),
        (
            "delimited by the close",
            pieces(&["HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nhello", " world"]),
            true,
            false,
        ),
        (
            "connection: close",
            pieces(&["HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 11\r\n\r\nhello world"]),
            true,
            false,
        ),
        (
            "HTTP/1.0",
            pieces(&["HTTP/1.0 200 OK\r\ncontent-length: 11\r\n\r\nhello world"]),
            true,
            false,
        ),
    ];
    for (what, answer, close, reused) in cases {
        let (url, seen) = scripted(answer, close);
        let gw = one_worker_gateway(&url, "").await;
        let client = gw.client();
        for id in ["a", "b"] {
            let r = client.post("/hook", &msg(&format!("{what}-{id}"))).await;
            assert_eq!((r.status.as_u16(), r.dedup()), (200, "forwarded"), "{what}");
            assert_eq!(r.body, "hello world", "{what}");
            assert!(
                r.headers.get("transfer-encoding").is_none_or(|v| v == "chunked"),
                "{what}"
            );
            assert!(
                r.headers.get("x-trailer").is_none(),
                "{what}: trailers are not forwarded"
            );
        }
        let connections: Vec<usize> = seen.lock().expect("log").iter().map(|(n, _, _)| *n).collect();
        let expected = if reused { vec![1, 1] } else { vec![1, 2] };
        assert_eq!(connections, expected, "{what}: connection of each request");
    }
}

#[tokio::test]
async fn a_malformed_answer_is_502_and_the_senders_retry_is_forwarded() {
    let cases: [(&str, &str); 5] = [
        ("not HTTP", "HELLO THERE\r\n\r\n"),
        ("cut off within the head", "HTTP/1.1 200 OK\r\ncontent-len"),
        (
            "conflicting lengths",
            "HTTP/1.1 200 OK\r\ncontent-length: 3\r\ncontent-length: 4\r\n\r\nabcd",
        ),
        ("a negative length", "HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n"),
        (
            "an upgrade nobody asked for",
            "HTTP/1.1 101 Switching Protocols\r\nupgrade: x\r\n\r\n",
        ),
    ];
    for (what, answer) in cases {
        let (url, seen) = scripted(pieces(&[answer]), true);
        let gw = one_worker_gateway(&url, "").await;
        let client = gw.client();
        let body = msg(&format!("bad-{what}"));
        for attempt in 1..=2 {
            let r = client.post("/hook", &body).await;
            assert_eq!(r.status.as_u16(), 502, "{what}, attempt {attempt}: {}", r.body);
        }
        // Released each time: the retry was delivered again, not answered as a duplicate.
        assert_eq!(seen.lock().expect("log").len(), 2, "{what}");
        assert_eq!(
            gw.metric(r#"dedup_upstream_responses_total{route="bot",class="error"}"#),
            2.0,
            "{what}"
        );
    }
}

#[tokio::test]
async fn replay_stores_a_chunked_reply_and_passes_a_larger_one_through_unstored() {
    // 200 KiB in chunks of 10,000 bytes, over the 64 KiB a stored reply may have.
    let large: String = (0..200 * 1024).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
    let head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
    let chunked = chunked(head, large.as_bytes(), 10_000);
    let small = pieces(&[
        "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
        "7\r\nstored!\r\n0\r\n\r\n",
    ]);
    for (answer, body, stored) in [(small, "stored!".to_owned(), true), (vec![chunked], large, false)] {
        let (url, seen) = scripted(answer, false);
        let gw = one_worker_gateway(&url, "replay = true").await;
        let client = gw.client();
        let first = client.post("/hook", &msg("replayed")).await;
        assert_eq!((first.status.as_u16(), first.dedup()), (200, "forwarded"));
        assert!(first.body == body, "the reply came whole ({} bytes)", first.body.len());
        let again = client.post("/hook", &msg("replayed")).await;
        if stored {
            assert_eq!((again.dedup(), again.body.as_str()), ("replayed", body.as_str()));
        } else {
            assert_eq!(again.dedup(), "duplicate", "too large to store: the duplicate answer");
        }
        assert_eq!(seen.lock().expect("log").len(), 1);
        // The connection was read to the end, so the next message reuses it.
        let next = client.post("/hook", &msg("next")).await;
        assert_eq!(next.status.as_u16(), 200);
        let connections: Vec<usize> = seen.lock().expect("log").iter().map(|(n, _, _)| *n).collect();
        assert_eq!(connections, vec![1, 1]);
    }
}

#[tokio::test]
async fn a_bypassed_chunked_body_streams_to_the_upstream_chunked_and_whole() {
    let (url, log) = scripted(pieces(&["HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"]), false);
    let gw = one_worker_gateway(&url, "").await;
    let mut stream = tokio::net::TcpStream::connect(gw.addr).await.expect("connect");
    let request = "DELETE /hook HTTP/1.1\r\nhost: bot\r\ntransfer-encoding: chunked\r\n\r\n\
                   4\r\nabcd\r\n3\r\nefg\r\n0\r\n\r\n";
    stream.write_all(request.as_bytes()).await.expect("write");
    let answer = read_until(&mut stream, "\r\n\r\nok").await.to_ascii_lowercase();
    assert!(answer.starts_with("http/1.1 200"), "{answer}");
    assert!(answer.contains("x-dedup-status: bypass"), "{answer}");
    let seen = log.lock().expect("log").clone();
    assert_eq!(seen.len(), 1);
    let (_, head, body) = &seen[0];
    assert!(head.starts_with("DELETE /hook HTTP/1.1\r\n"), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("transfer-encoding: chunked"),
        "no length known: sent chunked\n{head}"
    );
    assert_eq!(body, b"abcdefg");
    // And a GET without a body announces none.
    let r = gw.client().send(Method::GET, "/hook?x=1", &[], "").await;
    assert_eq!(r.body, "ok");
    let (_, head, body) = log.lock().expect("log")[1].clone();
    assert!(head.starts_with("GET /hook?x=1 HTTP/1.1\r\n"), "{head}");
    let lower = head.to_ascii_lowercase();
    assert!(
        !lower.contains("content-length") && !lower.contains("transfer-encoding"),
        "{head}"
    );
    assert!(body.is_empty());
}

/// Reads what the gateway answers until it ends with `until`.
async fn read_until(stream: &mut (impl tokio::io::AsyncRead + Unpin), until: &str) -> String {
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&answer).ends_with(until) {
        let n = within("the answer", stream.read(&mut buf)).await.expect("read");
        assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&answer));
        answer.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&answer).into_owned()
}

/// Sends raw bytes to the gateway and reads its answer up to the end of `until`.
async fn raw_exchange(gw: &TestGateway, request: &[u8], until: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(gw.addr).await.expect("connect");
    stream.write_all(request).await.expect("write");
    read_until(&mut stream, until).await
}

#[tokio::test]
async fn an_unusual_reason_phrase_reaches_the_sender() {
    let (url, _) = scripted(
        pieces(&["HTTP/1.1 200 Fine Thanks\r\ncontent-length: 2\r\n\r\nok"]),
        false,
    );
    let gw = one_worker_gateway(&url, "").await;
    let body = msg("reason");
    let request = format!(
        "POST /hook HTTP/1.1\r\nhost: bot\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let answer = raw_exchange(&gw, request.as_bytes(), "\r\n\r\nok").await;
    assert!(answer.starts_with("HTTP/1.1 200 Fine Thanks\r\n"), "{answer}");
}

#[tokio::test]
async fn an_upstream_refusing_a_large_body_before_reading_it_is_heard() {
    // The upstream reads the head only, answers 413 and closes: the gateway's write of
    // the body then fails, and the 413 that came first is what the sender gets.
    let (listener, authority) = raw_listener();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut reader = BufReader::new(stream.try_clone().expect("clone"));
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                line.clear();
            }
            let _ = stream.write_all(b"HTTP/1.1 413 Payload Too Large\r\ncontent-length: 7\r\n\r\ntoo big");
            // Dropped with the body unread: the kernel answers the rest with a reset.
        }
    });
    let gw = one_worker_gateway(&format!("http://{authority}"), "").await;
    let body = "x".repeat(8 << 20);
    let request = format!(
        "DELETE /hook HTTP/1.1\r\nhost: bot\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    let mut stream = tokio::net::TcpStream::connect(gw.addr).await.expect("connect");
    stream.write_all(request.as_bytes()).await.expect("head");
    // The sender's body may be cut off too, once the gateway has its answer.
    let (mut read, mut write) = stream.into_split();
    let sending = tokio::spawn(async move { write.write_all(body.as_bytes()).await });
    let answer = read_until(&mut read, "too big").await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    sending.abort();
}

#[tokio::test]
async fn a_head_answer_has_no_body_whatever_its_length_says() {
    let (url, seen) = scripted(pieces(&["HTTP/1.1 200 OK\r\ncontent-length: 11\r\n\r\n"]), false);
    let gw = one_worker_gateway(&url, "").await;
    let client = gw.client();
    for _ in 0..2 {
        // Waiting for the 11 bytes a GET would get would time this out.
        let r = client.send(Method::HEAD, "/hook", &[], "").await;
        assert_eq!((r.status.as_u16(), r.dedup(), r.body.as_str()), (200, "bypass", ""));
    }
    let connections: Vec<usize> = seen.lock().expect("log").iter().map(|(n, _, _)| *n).collect();
    assert_eq!(connections, vec![1, 1], "read to its end: the connection is reused");
}

#[tokio::test]
async fn hop_by_hop_fields_of_the_answer_stay_with_the_upstream() {
    let answer = "HTTP/1.1 200 OK\r\nconnection: keep-alive, x-secret\r\nx-secret: s\r\n\
                  keep-alive: timeout=5\r\nproxy-authenticate: Basic\r\ntrailer: x-t\r\nx-kept: k\r\n\
                  content-length: 2\r\n\r\nok";
    let (url, seen) = scripted(pieces(&[answer]), false);
    let gw = one_worker_gateway(&url, "").await;
    let client = gw.client();
    for id in ["hop-1", "hop-2"] {
        let r = client.post("/hook", &msg(id)).await;
        assert_eq!((r.status.as_u16(), r.body.as_str()), (200, "ok"));
        assert_eq!(r.headers.get("x-kept").map(|v| v.as_bytes()), Some(&b"k"[..]));
        for name in ["x-secret", "keep-alive", "proxy-authenticate", "trailer"] {
            assert!(r.headers.get(name).is_none(), "{name} passed on: {:?}", r.headers);
        }
        let connection = r
            .headers
            .get_all("connection")
            .iter()
            .map(|v| v.as_bytes().to_vec())
            .collect::<Vec<_>>();
        assert!(
            connection
                .iter()
                .all(|v| !String::from_utf8_lossy(v).contains("x-secret")),
            "{connection:?}"
        );
    }
    // `keep-alive` named in Connection is the usual token, not a close: reused.
    let connections: Vec<usize> = seen.lock().expect("log").iter().map(|(n, _, _)| *n).collect();
    assert_eq!(connections, vec![1, 1]);
}

/// An upstream that reads a request's head, then answers with `answer` and, if
/// `drain`, reads the body to its end (else holds the connection open, reading
/// nothing more, until the test ends). Returns its URL and the bodies it read whole.
fn early_answering(answer: &'static str, drain: bool) -> (String, Arc<Mutex<Vec<usize>>>) {
    let (listener, authority) = raw_listener();
    let drained: Arc<Mutex<Vec<usize>>> = Arc::default();
    let log = Arc::clone(&drained);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut reader = BufReader::new(stream.try_clone().expect("clone"));
            let mut length = 0usize;
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = v.trim().parse().expect("length");
                }
                line.clear();
            }
            stream.write_all(answer.as_bytes()).expect("answer");
            if drain {
                let mut body = vec![0u8; length];
                reader.read_exact(&mut body).expect("body");
                log.lock().expect("log").push(body.len());
                stream
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\ndone")
                    .expect("final");
            }
            std::mem::forget(stream); // open, unread, to the end of the test
        }
    });
    (format!("http://{authority}"), drained)
}

/// Sends a bypassed DELETE with a body of `size` bytes (written by a task of its own)
/// and returns the gateway's answer, read up to the end of `until`.
async fn delete_with_body(gw: &TestGateway, size: usize, until: &str) -> String {
    let head = format!("DELETE /hook HTTP/1.1\r\nhost: bot\r\ncontent-length: {size}\r\n\r\n");
    let stream = tokio::net::TcpStream::connect(gw.addr).await.expect("connect");
    let (mut read, mut write) = stream.into_split();
    let sending = tokio::spawn(async move {
        write.write_all(head.as_bytes()).await?;
        write.write_all(&vec![b'x'; size]).await
    });
    let answer = read_until(&mut read, until).await;
    sending.abort();
    answer
}

#[tokio::test]
async fn an_upstream_answering_early_and_reading_no_more_is_heard_at_once() {
    // 16 MiB: more than the socket buffers take, so the gateway's write would wait on
    // an upstream that reads nothing more until upstream_timeout (25 s by default,
    // longer than the test waits).
    let (url, _) = early_answering(
        "HTTP/1.1 413 Payload Too Large\r\ncontent-length: 7\r\n\r\ntoo big",
        false,
    );
    let gw = one_worker_gateway(&url, "").await;
    let answer = delete_with_body(&gw, 16 << 20, "too big").await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
}

#[tokio::test]
async fn an_interim_100_does_not_stop_the_body() {
    let (url, drained) = early_answering("HTTP/1.1 100 Continue\r\n\r\n", true);
    let gw = one_worker_gateway(&url, "").await;
    let answer = delete_with_body(&gw, 4 << 20, "done").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert_eq!(
        drained.lock().expect("log").clone(),
        vec![4 << 20],
        "the whole body reached the upstream"
    );
}
