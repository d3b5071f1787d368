//! The upstream connection pool (src/pool.rs) on its own, against a blocking upstream
//! in a thread of its own, so a test decides exactly when the upstream closes a
//! connection relative to what the pool has seen.

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use dedup_gateway::body::Body;
use dedup_gateway::upstream::pool;
use http::Request;
use http::uri::Authority;
use http_body_util::BodyExt;

use crate::support::{eventually, raw_listener, read_raw_request, within};

const HEAD: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 7\r\n\r\n";

/// What the upstream saw: (connection number from 1, request body).
type Log = Arc<Mutex<Vec<(usize, String)>>>;

fn request(authority: &Authority, body: &'static str) -> Request<Body> {
    Request::post("/hook")
        .header("host", authority.as_str())
        .body(Body::full(body))
        .expect("request")
}

async fn read_body(response: http::Response<Body>) -> String {
    let bytes = within("the response body", response.into_body().collect())
        .await
        .expect("body")
        .to_bytes();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[tokio::test]
async fn an_idle_connection_the_upstream_closed_is_not_reused_even_before_the_runtime_sees_it() {
    let (listener, authority) = raw_listener();
    let log: Log = Arc::default();
    let (close, closing) = mpsc::channel::<()>();
    let (closed, has_closed) = mpsc::channel();
    let seen = Arc::clone(&log);
    std::thread::spawn(move || {
        for n in 1..=2 {
            let (mut stream, pool_end) = listener.accept().expect("accept");
            let body = read_raw_request(&mut stream).expect("a request");
            seen.lock().expect("log").push((n, body));
            stream
                .write_all(HEAD)
                .and_then(|()| stream.write_all(b"success"))
                .expect("answer");
            if n == 1 {
                let _ = closing.recv();
                let own_end = stream.local_addr().expect("addr");
                drop(stream); // the upstream's idle-keep-alive close
                let _ = closed.send((pool_end, own_end));
            } else {
                std::mem::forget(stream); // stays open to the end of the test
            }
        }
    });

    let first = pool::send(&authority, request(&authority, "one")).await.expect("first");
    assert_eq!(read_body(first).await, "success");
    eventually("the connection to be reusable", || {
        pool::ready_connections(&authority) == 1
    })
    .await;
    // Idle long enough for an upstream to close it (not a wait for an event: the pool
    // checks connections older than this before reusing them).
    tokio::time::sleep(pool::PROBE_AFTER + std::time::Duration::from_millis(50)).await;
    // The upstream closes it, and the FIN reaches our socket, but this thread does not
    // yield: the runtime has not seen it, so nothing but a look at the socket tells the
    // connection is closed. Sent on it, the request would be written into a closed
    // connection: lost to the upstream, 502 here.
    close.send(()).expect("signal");
    let (pool_end, upstream_end) = has_closed.recv().expect("closed");
    crate::support::await_close_delivered(pool_end, upstream_end);
    assert_eq!(pool::ready_connections(&authority), 1);

    let second = pool::send(&authority, request(&authority, "two"))
        .await
        .expect("second is delivered");
    assert_eq!(read_body(second).await, "success");
    let log = log.lock().expect("log").clone();
    assert_eq!(log, vec![(1, "one".to_owned()), (2, "two".to_owned())]);
}

#[tokio::test]
async fn a_connection_whose_response_body_is_still_coming_is_not_lent_out() {
    let (listener, authority) = raw_listener();
    let log: Log = Arc::default();
    let accepted = Arc::new(AtomicUsize::new(0));
    let (finish, finishing) = mpsc::channel::<()>();
    let finishing = Arc::new(Mutex::new(finishing));
    let (seen, count) = (Arc::clone(&log), Arc::clone(&accepted));
    std::thread::spawn(move || {
        while let Ok((mut stream, _)) = listener.accept() {
            let n = count.fetch_add(1, Ordering::SeqCst) + 1;
            let (seen, finishing) = (Arc::clone(&seen), Arc::clone(&finishing));
            std::thread::spawn(move || {
                while let Some(body) = read_raw_request(&mut stream) {
                    let slow = body == "slow";
                    seen.lock().expect("log").push((n, body));
                    stream.write_all(HEAD).expect("head");
                    if slow {
                        let _ = finishing.lock().expect("signal").recv();
                    }
                    stream.write_all(b"success").expect("body");
                }
            });
        }
    });

    // The head of "slow" is in, its body is not: its connection is busy.
    let slow = pool::send(&authority, request(&authority, "slow")).await.expect("slow");
    let other = pool::send(&authority, request(&authority, "other"))
        .await
        .expect("other");
    assert_eq!(read_body(other).await, "success");
    assert_eq!(accepted.load(Ordering::SeqCst), 2, "the busy connection was not used");
    finish.send(()).expect("signal");
    assert_eq!(read_body(slow).await, "success");

    // Both are reusable now: a third request opens nothing new.
    eventually("both connections to be reusable", || {
        pool::ready_connections(&authority) == 2
    })
    .await;
    let third = pool::send(&authority, request(&authority, "third"))
        .await
        .expect("third");
    assert_eq!(read_body(third).await, "success");
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
    let mut log = log.lock().expect("log").clone();
    log.sort();
    let bodies: Vec<&str> = log.iter().map(|(_, b)| b.as_str()).collect();
    assert_eq!(bodies.len(), 3, "{log:?}");
    assert_eq!(
        log.iter().filter(|(n, _)| *n == 1).count() + log.iter().filter(|(n, _)| *n == 2).count(),
        3
    );
    for body in ["slow", "other", "third"] {
        assert_eq!(bodies.iter().filter(|b| **b == body).count(), 1, "{body} once: {log:?}");
    }
}
