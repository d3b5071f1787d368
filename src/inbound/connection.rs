//! One client connection: tells HTTP/1.1 from h2c, serves it, and bounds slow and idle
//! clients (`[server]`): a connection that says nothing is closed after
//! `idle_timeout`; once its first byte is in, a request head must be complete within
//! `header_timeout` (hyper's header timer on HTTP/1; on h2c, a header block left open
//! that long closes the connection); a connection carrying no request is closed after
//! `idle_timeout` (on HTTP/1 hyper's header timer, which runs from the end of the last
//! response, does it unless `idle_timeout` is the shorter). Bodies are bounded by
//! `body_timeout` where they are read (`handler`), the same way on both protocols.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use http::{Request, Response};
use hyper::body::Incoming;
use hyper::server::conn::{http1, http2};
use hyper::service::{Service, service_fn};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::graceful::GracefulConnection;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;

use super::guard::FramingGuard;
use crate::body::Body;
use crate::gateway::Gateway;
use crate::handler;
use crate::upstream::Peer;

/// How connections are served, shared by every connection task.
pub struct Protocols {
    pub h1: http1::Builder,
    pub h2: http2::Builder<TokioExecutor>,
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
    /// Raised when the listener closes: connections that have not said a word yet
    /// are dropped rather than served (or waited for) during the drain.
    pub closing: CancellationToken,
    /// Raised when the drain starts: every connection finishes what it is doing and
    /// closes (HTTP/1: after the current response; h2c: GOAWAY).
    pub draining: CancellationToken,
    /// HTTPS (`[server] tls_cert`): every connection is TLS, HTTP/2 or HTTP/1.1 as ALPN
    /// says.
    pub tls: Option<TlsAcceptor>,
}

/// Serves one connection: over TLS where the listener has a certificate (the protocol
/// by ALPN), else HTTP/2 if it opens with the h2c preface, else HTTP/1.1.
pub async fn serve(gw: Arc<Gateway>, protocols: Arc<Protocols>, stream: TcpStream, addr: SocketAddr) {
    let _ = stream.set_nodelay(true);
    let trusted = crate::config::cidr::trusted(&gw.trusted_proxies, addr.ip());
    let peer = |tls| Peer { addr, trusted, tls };
    if let Some(acceptor) = &protocols.tls {
        let accepted = tokio::select! {
            biased;
            () = protocols.closing.cancelled() => return,
            accepted = handshake(acceptor, stream, &protocols) => accepted,
        };
        // Plain HTTP, a failed or too slow handshake: the connection is closed, unanswered.
        let Some(stream) = accepted else { return };
        let is_h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2");
        let peer = peer(true);
        return serve_on(gw, &protocols, stream, Bytes::new(), is_h2, None, peer).await;
    }
    serve_plain(gw, &protocols, stream, peer(false)).await;
}

/// A TLS handshake: its first byte within `idle_timeout` (a connection that says
/// nothing is idle), then the rest within `header_timeout`.
async fn handshake(acceptor: &TlsAcceptor, stream: TcpStream, protocols: &Protocols) -> Option<TlsStream<TcpStream>> {
    match tokio::time::timeout(protocols.idle_timeout, stream.peek(&mut [0u8; 1])).await {
        Ok(Ok(1..)) => {}
        _ => return None,
    }
    match tokio::time::timeout(protocols.header_timeout, acceptor.accept(stream)).await {
        Ok(Ok(stream)) => Some(stream),
        Ok(Err(error)) => {
            tracing::debug!(%error, "TLS handshake failed: connection closed");
            None
        }
        Err(_) => None,
    }
}

/// Serves a plain connection: HTTP/2 if it opens with the h2c preface, else HTTP/1.1.
async fn serve_plain(gw: Arc<Gateway>, protocols: &Protocols, mut stream: TcpStream, peer: Peer) {
    let sniffed = tokio::select! {
        biased;
        () = protocols.closing.cancelled() => return,
        sniffed = sniff(&mut stream, protocols.idle_timeout, protocols.header_timeout) => sniffed,
    };
    let Some(Sniffed {
        prefix,
        is_h2,
        first_head_by,
    }) = sniffed
    else {
        return; // silent, closed, or too slow to say which protocol: cut off
    };
    serve_on(gw, protocols, stream, prefix, is_h2, first_head_by, peer).await;
}

/// Serves HTTP/2 or HTTP/1.1 on `stream`, whose first bytes (`prefix`) were read
/// already.
async fn serve_on<S>(
    gw: Arc<Gateway>,
    protocols: &Protocols,
    stream: S,
    prefix: Bytes,
    is_h2: bool,
    first_head_by: Option<Instant>,
    peer: Peer,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let addr = peer.addr;
    let result = if is_h2 {
        let activity = Arc::new(Activity::default());
        let service = service(gw, peer, Some(Arc::clone(&activity)));
        let io = TokioIo::new(Watched::new(stream, prefix, Frames::new(Arc::clone(&activity))));
        let conn = protocols.h2.serve_connection(io, service);
        let watchdog = watchdog(&activity, protocols, None);
        drive(conn, &protocols.draining, watchdog, Some(&activity)).await
    } else {
        // hyper's own header timer bounds heads and idle keep-alive on HTTP/1. A watch
        // is added only where that is not enough: `idle_timeout` shorter than
        // `header_timeout`, or a sniff that used part of the first head's time.
        let activity =
            (protocols.idle_timeout < protocols.header_timeout || first_head_by.is_some()).then(Activity::http1);
        let service = service(gw, peer, activity.clone());
        let io = Watched::new(stream, Bytes::new(), Reads(activity.clone()));
        let io = TokioIo::new(FramingGuard::new(io, prefix, true));
        let conn = protocols.h1.serve_connection(io, service);
        let watchdog = async {
            match &activity {
                Some(activity) => watchdog(activity, protocols, first_head_by).await,
                None => std::future::pending().await,
            }
        };
        drive(conn, &protocols.draining, watchdog, activity.as_deref()).await
    };
    if let Err(e) = result {
        match answer_body_error(&e) {
            // The one error here that is not the sender's doing: a flaky upstream. The
            // sender sees its connection closed mid-answer and retries.
            Some(error) => tracing::warn!(client = %addr, %error,
                "the answer broke off mid-body (the upstream's?): connection closed"),
            None => tracing::debug!(client = %addr, error = %e, "connection ended with an error"),
        }
    }
}

/// The error of an answer's body (an upstream's response cut off mid-body) that ended
/// the connection `error` reports, if that is what ended it.
fn answer_body_error(error: &hyper::Error) -> Option<&crate::body::BodyError> {
    std::error::Error::source(error)?.downcast_ref()
}

/// Handles each request of a connection, counted in `activity` where the connection has
/// a watchdog.
fn service(
    gw: Arc<Gateway>,
    peer: Peer,
    activity: Option<Arc<Activity>>,
) -> impl Service<Request<Incoming>, Response = Response<Body>, Error = Infallible, Future: Send + 'static> {
    service_fn(move |req| handler::handle(Arc::clone(&gw), peer, req, activity.as_ref().map(Busy::new)))
}

/// Why a connection is closed by the gateway rather than by its client.
enum Stop {
    /// No request for `idle_timeout`: finish politely (h2c: GOAWAY).
    Idle,
    /// A request head left half-sent for `header_timeout`: drop the connection.
    Stalled,
}

/// How long a connection told to close, with no request in flight, may go without
/// writing a byte before it is dropped: an h2c client that never acknowledges the
/// GOAWAY's PING would otherwise hold it open for good (and a drain until its grace
/// ends), while a response still streaming out keeps writing.
const IDLE_CLOSE_GRACE: Duration = Duration::from_secs(1);

/// Runs a connection until it ends, shutting it down gracefully when the drain starts
/// or it sits idle, and dropping it when it stalls. With `activity` (every h2c
/// connection; HTTP/1 ones with a watchdog), a goodbye that stalls is cut short.
async fn drive<C>(
    conn: C,
    draining: &CancellationToken,
    watchdog: impl Future<Output = Stop>,
    activity: Option<&Activity>,
) -> Result<(), C::Error>
where
    C: GracefulConnection,
{
    tokio::pin!(conn);
    tokio::pin!(watchdog);
    let mut drained = std::pin::pin!(draining.cancelled());
    let mut closing = false;
    loop {
        tokio::select! {
            result = conn.as_mut() => return result,
            () = &mut drained, if !closing => {
                conn.as_mut().graceful_shutdown();
                match activity {
                    Some(activity) => return goodbye(conn.as_mut(), activity).await,
                    None => closing = true,
                }
            }
            stop = &mut watchdog, if !closing => match (stop, activity) {
                (Stop::Idle, Some(activity)) => {
                    conn.as_mut().graceful_shutdown();
                    return goodbye(conn.as_mut(), activity).await;
                }
                (Stop::Idle, None) | (Stop::Stalled, _) => return Ok(()),
            },
        }
    }
}

/// Lets a connection told to close finish, while it has requests in flight or writes
/// bytes; silent and idle for [`IDLE_CLOSE_GRACE`], it is dropped: no request is lost
/// by cutting a slow goodbye short.
async fn goodbye<C: GracefulConnection>(mut conn: Pin<&mut C>, activity: &Activity) -> Result<(), C::Error> {
    loop {
        let before = activity.writes.load(Ordering::Relaxed);
        match tokio::time::timeout(IDLE_CLOSE_GRACE, conn.as_mut()).await {
            Ok(result) => return result,
            Err(_) if activity.writes.load(Ordering::Relaxed) != before => {}
            Err(_) if activity.streams.load(Ordering::Relaxed) > 0 => {}
            Err(_) => return Ok(()),
        }
    }
}

const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// What the first bytes of a connection said.
struct Sniffed {
    /// The bytes read.
    prefix: Bytes,
    is_h2: bool,
    /// When the first head's `header_timeout` runs out, if the sniff waited for more
    /// than the first read (say a lone `P`, which may open `POST` or the h2 preface):
    /// hyper's header timer starts only once it has the connection.
    first_head_by: Option<Instant>,
}

/// Reads until the first bytes tell HTTP/2 prior knowledge from HTTP/1 (usually the
/// second byte). The first byte may take `idle` (a connection that says nothing is
/// idle); from there, the rest takes at most `header` (it is part of a request head).
/// `None` if the peer closed or was too slow.
async fn sniff(stream: &mut TcpStream, idle: Duration, header: Duration) -> Option<Sniffed> {
    let mut buf = [0u8; H2_PREFACE.len()];
    let mut n = match tokio::time::timeout(idle, stream.read(&mut buf)).await {
        Ok(Ok(read)) if read > 0 => read,
        _ => return None,
    };
    let deadline = Instant::now() + header;
    let mut first_head_by = None;
    loop {
        if buf[..n] != H2_PREFACE[..n] || n == H2_PREFACE.len() {
            return Some(Sniffed {
                prefix: Bytes::copy_from_slice(&buf[..n]),
                is_h2: n == H2_PREFACE.len() && buf == *H2_PREFACE,
                first_head_by,
            });
        }
        match tokio::time::timeout_at(deadline, stream.read(&mut buf[n..])).await {
            Ok(Ok(read)) if read > 0 => n += read,
            _ => return None,
        }
        first_head_by = Some(deadline);
    }
}

/// What a connection is doing, for its watchdog.
#[derive(Default)]
pub(crate) struct Activity {
    /// Requests being handled now.
    streams: AtomicUsize,
    /// h2c: when a header block was opened and not yet ended (ms since `since`), or 0.
    open_header_block: AtomicU64,
    /// Requests handled so far (to tell a busy connection from an idle one).
    handled: AtomicU64,
    /// HTTP/1: reads that brought bytes, and their count when the last request was
    /// answered: bytes read since then are a head on its way, not idleness.
    reads: AtomicU64,
    reads_at_answer: AtomicU64,
    /// Writes that carried bytes (a response on its way out).
    writes: AtomicU64,
}

impl Activity {
    /// An HTTP/1 connection's: the bytes the sniff read are the start of its first
    /// head, counted as one read.
    fn http1() -> Arc<Activity> {
        Arc::new(Activity {
            reads: AtomicU64::new(1),
            ..Activity::default()
        })
    }
}

/// Counts one request in [`Activity::streams`] while it is handled (dropped with the
/// handler, also when the client resets the stream).
pub(crate) struct Busy(Arc<Activity>);

impl Busy {
    fn new(activity: &Arc<Activity>) -> Self {
        activity.streams.fetch_add(1, Ordering::Relaxed);
        activity.handled.fetch_add(1, Ordering::Relaxed);
        Busy(Arc::clone(activity))
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let reads = self.0.reads.load(Ordering::Relaxed);
        self.0.reads_at_answer.store(reads, Ordering::Relaxed);
        self.0.streams.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Ends when a connection should be closed: a header block open for longer than
/// `header_timeout` (a slowloris on HEADERS/CONTINUATION frames: hyper sees no request
/// until the block ends), no first request by `first_head_by`, or no request for
/// `idle_timeout`. On HTTP/1 a byte read since the last answer is the start of a
/// request: hyper's header timer bounds it, not this.
async fn watchdog(activity: &Activity, protocols: &Protocols, first_head_by: Option<Instant>) -> Stop {
    let (header, idle) = (protocols.header_timeout, protocols.idle_timeout);
    let started = Instant::now();
    let tick = (header.min(idle) / 4).max(Duration::from_millis(10));
    let (mut idle_since, mut seen) = (started, 0);
    loop {
        tokio::time::sleep(tick).await;
        let now = Instant::now();
        let opened = activity.open_header_block.load(Ordering::Relaxed);
        if opened != 0 && now.duration_since(started) > Duration::from_millis(opened) + header {
            return Stop::Stalled;
        }
        let handled = activity.handled.load(Ordering::Relaxed);
        if handled == 0 && first_head_by.is_some_and(|by| now >= by) {
            return Stop::Stalled;
        }
        let head_on_its_way =
            activity.reads.load(Ordering::Relaxed) != activity.reads_at_answer.load(Ordering::Relaxed);
        if activity.streams.load(Ordering::Relaxed) > 0 || head_on_its_way || handled != seen {
            (idle_since, seen) = (now, handled);
        } else if now.duration_since(idle_since) >= idle {
            return Stop::Idle;
        }
    }
}

/// A connection's byte stream with every read shown to a tracker: h2c's [`Frames`] or
/// HTTP/1's [`Reads`]. Also hands out the bytes the sniff already read.
struct Watched<S, T> {
    inner: S,
    prefix: Bytes,
    tracker: T,
}

/// Sees the bytes of each read, and each write that carried bytes.
trait Tracker {
    fn feed(&mut self, bytes: &[u8]);
    fn activity(&self) -> Option<&Activity>;
}

/// HTTP/1: counts reads into [`Activity::reads`] where the connection has a watchdog.
struct Reads(Option<Arc<Activity>>);

impl Tracker for Reads {
    fn feed(&mut self, bytes: &[u8]) {
        if let Some(activity) = &self.0
            && !bytes.is_empty()
        {
            activity.reads.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn activity(&self) -> Option<&Activity> {
        self.0.as_deref()
    }
}

/// Follows an h2c byte stream frame by frame (frame headers only: payloads are skipped
/// by their length) to see header blocks open and close.
struct Frames {
    activity: Arc<Activity>,
    since: Instant,
    /// Client preface bytes still to pass, then frame parsing.
    preface_left: usize,
    /// The frame header being read (9 bytes) and how much of it is in.
    frame: [u8; 9],
    have: usize,
    /// Payload bytes of the current frame still to skip.
    skip: u64,
}

const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_HEADERS: u8 = 0x4;

impl<S, T> Watched<S, T> {
    fn new(inner: S, prefix: Bytes, tracker: T) -> Self {
        Watched { inner, prefix, tracker }
    }
}

impl Frames {
    fn new(activity: Arc<Activity>) -> Self {
        Frames {
            activity,
            since: Instant::now(),
            preface_left: H2_PREFACE.len(),
            frame: [0; 9],
            have: 0,
            skip: 0,
        }
    }

    fn frame_header(&mut self) {
        let [l0, l1, l2, kind, flags, ..] = self.frame;
        self.skip = u64::from(u32::from_be_bytes([0, l0, l1, l2]));
        let block = &self.activity.open_header_block;
        match kind {
            HEADERS | CONTINUATION if flags & END_HEADERS != 0 => block.store(0, Ordering::Relaxed),
            HEADERS if block.load(Ordering::Relaxed) == 0 => {
                let ms = u64::try_from(self.since.elapsed().as_millis()).unwrap_or(u64::MAX);
                block.store(ms.max(1), Ordering::Relaxed);
            }
            _ => {}
        }
    }
}

impl Tracker for Frames {
    fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.preface_left > 0 {
                let n = self.preface_left.min(bytes.len());
                (self.preface_left, bytes) = (self.preface_left - n, &bytes[n..]);
            } else if self.skip > 0 {
                let n = usize::try_from(self.skip).unwrap_or(usize::MAX).min(bytes.len());
                (self.skip, bytes) = (self.skip - n as u64, &bytes[n..]);
            } else {
                let n = (9 - self.have).min(bytes.len());
                self.frame[self.have..self.have + n].copy_from_slice(&bytes[..n]);
                (self.have, bytes) = (self.have + n, &bytes[n..]);
                if self.have == 9 {
                    self.have = 0;
                    self.frame_header();
                }
            }
        }
    }

    fn activity(&self) -> Option<&Activity> {
        Some(&self.activity)
    }
}

impl<S: AsyncRead + Unpin, T: Tracker + Unpin> AsyncRead for Watched<S, T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.prefix.has_remaining() {
            let n = this.prefix.len().min(buf.remaining());
            buf.put_slice(&this.prefix[..n]);
            let prefix = this.prefix.split_to(n);
            this.tracker.feed(&prefix);
            return Poll::Ready(Ok(()));
        }
        let start = buf.filled().len();
        let poll = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = poll {
            this.tracker.feed(&buf.filled()[start..]);
        }
        poll
    }
}

impl<S, T: Tracker> Watched<S, T> {
    /// Counts a write that carried bytes.
    fn wrote(&self, poll: Poll<io::Result<usize>>) -> Poll<io::Result<usize>> {
        if let (Poll::Ready(Ok(1..)), Some(activity)) = (&poll, self.tracker.activity()) {
            activity.writes.fetch_add(1, Ordering::Relaxed);
        }
        poll
    }
}

impl<S: AsyncWrite + Unpin, T: Tracker + Unpin> AsyncWrite for Watched<S, T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write(cx, data);
        self.wrote(poll)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.wrote(poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
        let len = (payload.len() as u32).to_be_bytes();
        let mut f = vec![len[1], len[2], len[3], kind, flags, 0, 0, 0, 1];
        f.extend_from_slice(payload);
        f
    }

    #[tokio::test]
    async fn header_blocks_open_and_close_whatever_the_read_boundaries() {
        let mut stream = H2_PREFACE.to_vec();
        stream.extend(frame(0x4, 0, &[0; 6])); // SETTINGS
        let opened_at = stream.len() + 9; // once the HEADERS frame header is in
        stream.extend(frame(HEADERS, 0, &[1, 2, 3])); // opens a block
        stream.extend(frame(CONTINUATION, 0, &[4]));
        let closed_at = stream.len() + 9;
        stream.extend(frame(CONTINUATION, END_HEADERS, &[5])); // ends it
        stream.extend(frame(0x0, 0x1, b"body")); // DATA
        stream.extend(frame(HEADERS, END_HEADERS | 0x1, &[6])); // a whole block at once
        for split in 1..=stream.len() {
            let mut frames = Frames::new(Arc::new(Activity::default()));
            for (n, chunk) in stream.chunks(split).enumerate() {
                frames.feed(chunk);
                let at = (n * split + chunk.len()).min(stream.len());
                let open = frames.activity.open_header_block.load(Ordering::Relaxed) != 0;
                assert_eq!(
                    open,
                    at >= opened_at && at < closed_at,
                    "split {split}, after {at} bytes"
                );
            }
        }
    }
}
