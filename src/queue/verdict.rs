//! How a delivery attempt ended, and what follows: 2xx is delivered; a connect error,
//! a timeout, 408, 429 and 5xx are tried again after the schedule's next wait (with up
//! to 20% jitter, raised by a 429's or 503's `Retry-After` up to the schedule's longest
//! wait); other statuses (3xx is not followed, 4xx will not get better), and a failure
//! once the schedule is used up, make a dead letter.

use std::time::{Duration, SystemTime};

use http::{HeaderMap, StatusCode, header};

use crate::config::queue::QueuePolicy;
use crate::store::queue::Settled;
use crate::upstream::UpstreamError;

/// An attempt's end, before the schedule is consulted.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Attempt {
    Delivered,
    /// Worth another attempt; the upstream may have said when.
    Failed {
        error: String,
        retry_after: Option<Duration>,
    },
    /// Will not get better by trying again.
    Refused {
        error: String,
    },
}

/// Judges an upstream's answer (its status and headers) or failure.
pub(super) fn judge(answer: Result<(StatusCode, &HeaderMap), &UpstreamError>) -> Attempt {
    let (status, headers) = match answer {
        Ok(answer) => answer,
        Err(error @ (UpstreamError::Connect(_) | UpstreamError::Timeout(_) | UpstreamError::Body(_))) => {
            return Attempt::Failed {
                error: error.to_string(),
                retry_after: None,
            };
        }
        Err(error @ UpstreamError::Request(_)) => {
            return Attempt::Refused {
                error: error.to_string(),
            };
        }
    };
    let error = format!("status {}", status.as_u16());
    match status.as_u16() {
        200..=299 => Attempt::Delivered,
        429 | 503 => Attempt::Failed {
            error,
            retry_after: retry_after(headers, SystemTime::now()),
        },
        408 | 500..=599 => Attempt::Failed {
            error,
            retry_after: None,
        },
        _ => Attempt::Refused { error },
    }
}

/// `Retry-After` as seconds or an HTTP date (RFC 9110, 10.2.3); none if neither.
fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = headers.get(header::RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or_default())
}

/// What the store records after attempt number `attempts` ended as `attempt`, at
/// `now_ms`. `jitter` is a random number (its low bits pick the jitter).
pub(super) fn settle(
    attempt: Attempt,
    attempts: u32,
    policy: &QueuePolicy,
    now_ms: u64,
    completed_ttl: Duration,
    jitter: u64,
) -> Settled {
    match attempt {
        Attempt::Delivered => Settled::Delivered { completed_ttl },
        Attempt::Refused { error } => Settled::Dead { error },
        Attempt::Failed { error, retry_after } => match policy.wait_after(attempts) {
            None => Settled::Dead {
                error: format!("{error} (retry schedule used up after {attempts} attempts)"),
            },
            Some(wait) => {
                let wait = retry_after.map_or(wait, |asked| wait.max(asked.min(policy.longest_wait())));
                let fifth = u64::try_from(wait.as_millis() / 5).unwrap_or(u64::MAX);
                let jitter = if fifth == 0 {
                    0
                } else {
                    jitter % fifth.saturating_add(1)
                };
                let wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
                Settled::Retry {
                    due_ms: now_ms.saturating_add(wait_ms).saturating_add(jitter),
                    error,
                }
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> QueuePolicy {
        QueuePolicy {
            retry_schedule: vec![Duration::from_secs(5), Duration::from_secs(30)],
            concurrency: 1,
            max_queued: 10,
        }
    }

    fn status(code: u16, headers: &[(&'static str, &str)]) -> Attempt {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.insert(*name, value.parse().expect("value"));
        }
        judge(Ok((StatusCode::from_u16(code).expect("status"), &map)))
    }

    #[test]
    fn statuses_are_judged_as_the_queue_promises() {
        assert_eq!(status(200, &[]), Attempt::Delivered);
        assert_eq!(status(204, &[]), Attempt::Delivered);
        for code in [408, 429, 500, 502, 503, 504] {
            assert!(matches!(status(code, &[]), Attempt::Failed { .. }), "{code}");
        }
        for code in [301, 302, 400, 401, 404, 410, 422] {
            assert!(matches!(status(code, &[]), Attempt::Refused { .. }), "{code}");
        }
        let timeout = UpstreamError::Timeout(Duration::from_secs(1));
        assert!(matches!(judge(Err(&timeout)), Attempt::Failed { .. }));
    }

    #[test]
    fn retry_after_is_read_as_seconds_or_a_date_and_only_on_429_and_503() {
        let asked = |code, value| match status(code, &[("retry-after", value)]) {
            Attempt::Failed { retry_after, .. } => retry_after,
            other => panic!("{other:?}"),
        };
        assert_eq!(asked(429, "120"), Some(Duration::from_secs(120)));
        assert_eq!(asked(503, " 7 "), Some(Duration::from_secs(7)));
        assert_eq!(asked(500, "120"), None);
        assert_eq!(asked(429, "soon"), None);
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        let later = httpdate::fmt_http_date(now + Duration::from_secs(90));
        let mut headers = HeaderMap::new();
        headers.insert(header::RETRY_AFTER, later.parse().expect("date"));
        assert_eq!(retry_after(&headers, now), Some(Duration::from_secs(90)));
    }

    #[test]
    fn waits_follow_the_schedule_with_jitter_and_end_in_a_dead_letter() {
        let p = policy();
        let failed = |retry_after| Attempt::Failed {
            error: "status 500".into(),
            retry_after,
        };
        let due = |attempts, retry_after, jitter| match settle(
            failed(retry_after),
            attempts,
            &p,
            1000,
            Duration::ZERO,
            jitter,
        ) {
            Settled::Retry { due_ms, .. } => Some(due_ms - 1000),
            _ => None,
        };
        assert_eq!(due(1, None, 0), Some(5_000));
        assert_eq!(
            due(1, None, u64::MAX),
            Some(5_000 + u64::MAX % 1_001),
            "at most a fifth more"
        );
        assert!(
            (0..1000)
                .map(|j| due(1, None, j).expect("due"))
                .all(|d| (5_000..=6_000).contains(&d))
        );
        assert_eq!(due(2, None, 0), Some(30_000));
        assert_eq!(
            due(1, Some(Duration::from_secs(20)), 0),
            Some(20_000),
            "Retry-After raises the wait"
        );
        assert_eq!(
            due(1, Some(Duration::from_secs(3600)), 0),
            Some(30_000),
            "up to the longest wait"
        );
        assert_eq!(due(1, Some(Duration::from_secs(1)), 0), Some(5_000), "never lowers it");
        assert!(matches!(
            settle(failed(None), 3, &p, 1000, Duration::ZERO, 0),
            Settled::Dead { error } if error.contains("used up after 3 attempts")
        ));
        assert!(matches!(
            settle(
                Attempt::Refused {
                    error: "status 400".into()
                },
                1,
                &p,
                1000,
                Duration::ZERO,
                0
            ),
            Settled::Dead { .. }
        ));
    }
}
