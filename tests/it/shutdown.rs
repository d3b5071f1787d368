//! Draining in-process: readiness flips at once, finished requests complete, and an
//! owner still running when the grace ends releases its claim.

use dedup_gateway::store::Store;
use http::Method;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::edges::h2_frame;
use crate::support::{Cfg, Client, Gate, TestGateway, Upstream, msg, within};

#[tokio::test]
async fn an_owner_abandoned_at_the_end_of_the_grace_releases_its_claim() {
    let gate = Gate::new();
    let upstream = Upstream::gated(&gate, "never").await;
    let cfg = Cfg::new().server("shutdown_grace = \"300ms\"");
    let gw = TestGateway::start(&cfg, &upstream).await;
    let admin = Client::http1(gw.admin.expect("admin"));
    let client = gw.client();
    let c = client.clone();
    let stuck = tokio::spawn(async move { c.post("/hook", &msg("stuck")).await });
    upstream.wait_for(1).await;
    let key = "dedup:bot:stuck";
    assert!(
        gw.gw.store.get(key).await.expect("get").is_some(),
        "PROCESSING while in flight"
    );

    let store = gw.gw.clone();
    let ready_before = admin.send(Method::GET, "/readyz", &[], "").await.status;
    assert_eq!(ready_before, 200);
    gw.stop().await;
    let answer = within("the abandoned request", stuck).await.expect("task");
    assert_eq!(
        (
            answer.status.as_u16(),
            answer.headers["retry-after"].to_str().ok(),
            answer.dedup()
        ),
        (503, Some("1"), "aborted")
    );
    assert_eq!(
        store.store.get(key).await.expect("get"),
        None,
        "no PROCESSING marker left behind"
    );
    assert_eq!(upstream.count(), 1);
}

#[tokio::test]
async fn readiness_turns_503_as_soon_as_draining_starts() {
    let upstream = Upstream::ok().await;
    let cfg = Cfg::new().server("shutdown_delay = \"30s\"");
    let gw = TestGateway::start(&cfg, &upstream).await;
    let admin = Client::http1(gw.admin.expect("admin"));
    assert_eq!(admin.send(Method::GET, "/readyz", &[], "").await.status, 200);
    gw.gw.start_draining();
    assert_eq!(admin.send(Method::GET, "/readyz", &[], "").await.status, 503);
    assert_eq!(admin.send(Method::GET, "/healthz", &[], "").await.status, 200);
    assert_eq!(admin.send(Method::GET, "/livez", &[], "").await.status, 200);
    // During shutdown_delay the proxy still serves.
    assert_eq!(gw.client().post("/hook", &msg("late")).await.dedup(), "forwarded");
}

/// An h2c client that never acknowledges the GOAWAY's PING, with no request open, does
/// not hold the drain to the end of its grace (60 s here; the test waits 20 at most).
#[tokio::test]
async fn a_drain_does_not_wait_for_an_idle_h2_client_that_never_answers() {
    let upstream = Upstream::ok().await;
    let gw = TestGateway::start(&Cfg::new().server("shutdown_grace = \"60s\""), &upstream).await;
    let mut stream = TcpStream::connect(gw.addr).await.expect("connect");
    let mut preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    preface.extend(h2_frame(0x4, 0, 0, &[])); // SETTINGS; then it acknowledges nothing
    stream.write_all(&preface).await.expect("preface");
    let mut first = [0u8; 9];
    stream.read_exact(&mut first).await.expect("the server's SETTINGS"); // connection served
    // Reads what comes (GOAWAY, PING) and never answers, until the gateway closes.
    let client = tokio::spawn(async move { while stream.read(&mut [0u8; 256]).await.is_ok_and(|n| n > 0) {} });
    gw.stop().await;
    within("the connection to be closed", client).await.expect("client");
}
