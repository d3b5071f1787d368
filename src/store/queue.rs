//! The [`QueueStore`] contract: what a store keeps of a queued route's messages
//! (`delivery = "queued"`), the message as it will be delivered, and the answers of
//! the queue's calls. The delivery workers are [`crate::queue`]; the stores that keep
//! queues are SQLite and Redis (the memory store refuses: a queue must be durable).

use std::time::Duration;

use bytes::Bytes;

use super::{Marker, StoreError, Token};

/// A route's durable queue, in the store that holds its markers. `route` is the
/// route's name. Every call is bounded by `store.timeout`, as marker calls are.
pub trait QueueStore: Send + Sync + 'static {
    /// Claims `message.key` and stores `message` in `route`'s queue with its marker
    /// QUEUED: if the key is free, and unless the route holds `max_queued` messages
    /// already. One atomic step where the backend can (SQLite; standalone Redis);
    /// else (Redis Cluster, where the marker and the queue are on different slots) a
    /// claim (PROCESSING for `processing_ttl`), the append, then the marker, the claim
    /// released if the append fails. A message whose id the queue holds already is not
    /// stored twice: `Queued` all the same. Without a key: stored, no marker.
    fn enqueue(
        &self,
        route: &str,
        message: &Message,
        max_queued: u64,
        processing_ttl: Duration,
    ) -> impl Future<Output = Result<Enqueued, StoreError>> + Send;

    /// Takes up to `max` messages due (at `now_ms`) for delivery, the oldest first, and
    /// counts their attempts. A message taken before and not settled for
    /// `reclaim_after` is taken over: the worker (or replica) that had it died, or the
    /// call that took it lost its reply.
    fn lease(
        &self,
        route: &str,
        now_ms: u64,
        reclaim_after: Duration,
        max: usize,
    ) -> impl Future<Output = Result<Lease, StoreError>> + Send;

    /// Records how deliveries ended, in one call.
    fn settle_all(
        &self,
        route: &str,
        ended: &[(&Leased, Settled)],
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Records how one delivery ended.
    fn settle(
        &self,
        route: &str,
        leased: &Leased,
        settled: Settled,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        async move { self.settle_all(route, &[(leased, settled)]).await }
    }

    /// What `route`'s queue holds at `now_ms`.
    fn counts(&self, route: &str, now_ms: u64) -> impl Future<Output = Result<QueueCounts, StoreError>> + Send;

    /// Up to `limit` dead letters, the oldest first.
    fn dead_letters(
        &self,
        route: &str,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<DeadLetter>, StoreError>> + Send;

    /// Puts dead letters back in the queue, due now, attempts reset: the one with this
    /// id, or every one. How many went back.
    fn retry_dead(
        &self,
        route: &str,
        id: Option<&str>,
        now_ms: u64,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Drops a dead letter for good and releases its marker (the sender's next
    /// delivery of it is processed as new). False when no dead letter has this id.
    fn drop_dead(&self, route: &str, id: &str) -> impl Future<Output = Result<bool, StoreError>> + Send;
}

/// What a lease found.
#[derive(Debug)]
pub enum Lease {
    /// Messages to deliver now (at least one).
    Leased(Vec<Leased>),
    /// Nothing due; the next scheduled retry (Unix ms), if any.
    Idle { next_due_ms: Option<u64> },
}

/// A stored message: the request as the upstream will get it, and what the queue
/// knows of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// What operators address it by: the message id as stored keys hash it (the
    /// stored key without `<key_prefix><route>:`), or `nokey-<token>` for a message
    /// queued without a key.
    pub id: String,
    /// Its marker's stored key (none for a message queued without a key).
    pub key: Option<String>,
    /// The claim's owner token: delivery completes the marker only while it holds it.
    pub token: Token,
    /// The claim's `first_seen_ms`.
    pub first_seen_ms: u64,
    /// When it was stored (acknowledged), Unix ms.
    pub queued_at_ms: u64,
    /// Attempts started so far, one cut short by a crash included.
    pub attempts: u32,
    pub method: String,
    /// Path and query, as received.
    pub target: String,
    /// The header block as forwarded (hop-by-hop fields out, `X-Forwarded-*` in):
    /// `name: value` lines, each ended by CR LF.
    pub headers: Bytes,
    pub body: Bytes,
    /// Why the last attempt failed (status or error), once one has.
    pub last_error: Option<String>,
}

/// What an enqueue did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Enqueued {
    /// Stored; its marker (if it has a key) is QUEUED.
    Queued,
    /// The route holds `max_queued` messages already: nothing stored, no marker.
    Full,
    /// The key was held already (by this message or another delivery of it): nothing
    /// stored.
    Found(Marker),
}

/// A message handed to a delivery worker, marked as being delivered.
#[derive(Clone, Debug)]
pub struct Leased {
    /// `attempts` counts this attempt already.
    pub message: Message,
    /// Where the store keeps it (a row id; a stream entry id and its deliveries then).
    pub lease: String,
}

/// How a delivery ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Settled {
    /// 2xx: the marker becomes COMPLETED for `completed_ttl`; the message is gone.
    Delivered { completed_ttl: Duration },
    /// Tried again at `due_ms` (Unix ms).
    Retry { due_ms: u64, error: String },
    /// Kept as a dead letter until an operator acts; its marker stays.
    Dead { error: String },
    /// Not tried (the gateway is stopping): back to the queue, due now.
    Returned,
}

/// What a route's queue holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueCounts {
    /// Due now.
    pub ready: u64,
    /// Waiting for their retry.
    pub scheduled: u64,
    /// Being delivered.
    pub delivering: u64,
    pub dead: u64,
    /// When the oldest message not yet delivered (dead letters aside) was queued.
    pub oldest_queued_at_ms: Option<u64>,
}

impl QueueCounts {
    /// Everything the route holds, as `max_queued` counts it.
    pub fn total(&self) -> u64 {
        self.ready + self.scheduled + self.delivering + self.dead
    }
}

/// A dead letter, for operators.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadLetter {
    pub id: String,
    pub key: Option<String>,
    pub attempts: u32,
    pub last_error: Option<String>,
    pub queued_at_ms: u64,
    pub dead_at_ms: u64,
}

/// Unix ms as RFC 3339 (UTC, milliseconds): `X-Dedup-Queued-At`, and the admin API's
/// times.
pub fn rfc3339(ms: u64) -> String {
    // humantime writes years up to 9999 (a later time would be an error, not a string).
    const LAST_MS: u64 = 253_402_300_799_999;
    humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + Duration::from_millis(ms.min(LAST_MS))).to_string()
}

/// The header block a message stores: `name: value` lines, CR LF each.
pub fn header_block(headers: &http::HeaderMap) -> Bytes {
    let mut out = Vec::with_capacity(headers.len() * 32);
    for (name, value) in headers {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    Bytes::from(out)
}

/// The header fields of a stored block (a block that does not parse gives none of
/// them: it was written by [`header_block`], so that does not happen).
pub fn parse_header_block(block: &[u8]) -> http::HeaderMap {
    let mut map = http::HeaderMap::new();
    let mut block = block.to_vec();
    block.extend_from_slice(b"\r\n");
    let mut fields = vec![httparse::EMPTY_HEADER; block.iter().filter(|&&b| b == b'\n').count() + 1];
    if let Ok(httparse::Status::Complete((_, fields))) = httparse::parse_headers(&block, &mut fields) {
        for field in fields.iter() {
            if let (Ok(name), Ok(value)) = (
                http::HeaderName::from_bytes(field.name.as_bytes()),
                http::HeaderValue::from_bytes(field.value),
            ) {
                map.append(name, value);
            }
        }
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_blocks_read_back_every_line_in_order() {
        let mut headers = http::HeaderMap::new();
        headers.append("x-a", http::HeaderValue::from_static("1"));
        headers.append("x-a", http::HeaderValue::from_static("2"));
        headers.append(
            "content-type",
            http::HeaderValue::from_static("text/xml; charset=utf-8"),
        );
        headers.append("x-bytes", http::HeaderValue::from_bytes(b"caf\xe9").expect("obs-text"));
        let block = header_block(&headers);
        assert_eq!(parse_header_block(&block), headers);
        assert_eq!(parse_header_block(b""), http::HeaderMap::new());
    }
}
