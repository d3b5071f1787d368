//! How a request on a route ended: the `x-dedup-status` header value and the
//! `outcome` metric label, one enum so the two never disagree.

use http::HeaderValue;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    Forwarded,
    Duplicate,
    Replayed,
    InFlight,
    NoKey,
    StoreUnavailable,
    Rejected,
    BadRequest,
    TooLarge,
    Bypass,
    ShadowDuplicate,
    ShadowInFlight,
    Aborted,
    /// A queued route stored the message: the route's ack.
    Queued,
    /// A queued route holds `max_queued` messages: 503, nothing stored.
    QueueFull,
}

impl Outcome {
    pub const ALL: [Outcome; 15] = [
        Outcome::Forwarded,
        Outcome::Duplicate,
        Outcome::Replayed,
        Outcome::InFlight,
        Outcome::NoKey,
        Outcome::StoreUnavailable,
        Outcome::Rejected,
        Outcome::BadRequest,
        Outcome::TooLarge,
        Outcome::Bypass,
        Outcome::ShadowDuplicate,
        Outcome::ShadowInFlight,
        Outcome::Aborted,
        Outcome::Queued,
        Outcome::QueueFull,
    ];

    /// The `outcome` label of `dedup_requests_total`.
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Forwarded => "forwarded",
            Outcome::Duplicate => "duplicate",
            Outcome::Replayed => "replayed",
            Outcome::InFlight => "in_flight",
            Outcome::NoKey => "no_key",
            Outcome::StoreUnavailable => "store_unavailable",
            Outcome::Rejected => "rejected",
            Outcome::BadRequest => "bad_request",
            Outcome::TooLarge => "too_large",
            Outcome::Bypass => "bypass",
            Outcome::ShadowDuplicate => "shadow_duplicate",
            Outcome::ShadowInFlight => "shadow_in_flight",
            Outcome::Aborted => "aborted",
            Outcome::Queued => "queued",
            Outcome::QueueFull => "queue_full",
        }
    }

    /// The `x-dedup-status` value: the label with dashes, as HTTP headers usually are.
    pub fn header(self) -> HeaderValue {
        HeaderValue::from_static(match self {
            Outcome::Forwarded => "forwarded",
            Outcome::Duplicate => "duplicate",
            Outcome::Replayed => "replayed",
            Outcome::InFlight => "in-flight",
            Outcome::NoKey => "no-key",
            Outcome::StoreUnavailable => "store-unavailable",
            Outcome::Rejected => "rejected",
            Outcome::BadRequest => "bad-request",
            Outcome::TooLarge => "too-large",
            Outcome::Bypass => "bypass",
            Outcome::ShadowDuplicate => "shadow-duplicate",
            Outcome::ShadowInFlight => "shadow-in-flight",
            Outcome::Aborted => "aborted",
            Outcome::Queued => "queued",
            Outcome::QueueFull => "queue-full",
        })
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// The name of the status header every answer on a route carries.
pub static STATUS_HEADER: http::HeaderName = http::HeaderName::from_static("x-dedup-status");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_is_label_with_dashes_and_index_matches_all() {
        for (i, o) in Outcome::ALL.iter().enumerate() {
            assert_eq!(o.header().to_str().expect("ascii"), o.label().replace('_', "-"));
            assert_eq!(o.index(), i);
        }
    }
}
