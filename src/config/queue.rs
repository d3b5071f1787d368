//! A route's delivery: `delivery = "sync"` (the sender waits for the bot's answer) or
//! `"queued"` (the sender gets its ack once the message is stored; delivery workers
//! deliver it with retries), with the queue's settings: `retry_schedule`,
//! `delivery_concurrency`, `max_queued`.

use std::time::Duration;

use super::read::{Choice, Problems, Section};

/// How a route delivers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// The sender waits for the bot's answer.
    Sync,
    /// The sender is acknowledged once the message is stored; workers deliver it.
    Queued(QueuePolicy),
}

impl Delivery {
    pub fn queue(&self) -> Option<&QueuePolicy> {
        match self {
            Delivery::Sync => None,
            Delivery::Queued(q) => Some(q),
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Delivery::Sync => "sync",
            Delivery::Queued(_) => "queued",
        }
    }
}

/// A queued route's delivery settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueuePolicy {
    /// The waits between attempts; once they are used up, the next failure is a dead
    /// letter. Its largest wait bounds a `Retry-After` too.
    pub retry_schedule: Vec<Duration>,
    /// Deliveries to the upstream at once, per replica.
    pub concurrency: usize,
    /// Messages the route holds (ready, scheduled, delivering, dead); above, 503.
    pub max_queued: u64,
}

impl QueuePolicy {
    /// The wait after attempt `attempts` (1 = the first) failed, or `None` when the
    /// schedule is used up.
    pub fn wait_after(&self, attempts: u32) -> Option<Duration> {
        let index = usize::try_from(attempts).ok()?.checked_sub(1)?;
        self.retry_schedule.get(index).copied()
    }

    /// The longest wait of the schedule.
    pub fn longest_wait(&self) -> Duration {
        self.retry_schedule.iter().copied().max().unwrap_or_default()
    }
}

/// `delivery`'s two names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum DeliveryMode {
    Sync,
    Queued,
}

impl Choice for DeliveryMode {
    const NAMES: &'static [(&'static str, Self)] = &[("sync", Self::Sync), ("queued", Self::Queued)];
}

/// The default schedule: about 15 hours of retries (Hookdeck's and Svix's are similar).
pub const DEFAULT_SCHEDULE: [Duration; 9] = [
    Duration::from_secs(5),
    Duration::from_secs(30),
    Duration::from_secs(2 * 60),
    Duration::from_secs(10 * 60),
    Duration::from_secs(30 * 60),
    Duration::from_secs(3600),
    Duration::from_secs(2 * 3600),
    Duration::from_secs(4 * 3600),
    Duration::from_secs(8 * 3600),
];

pub const DEFAULT_CONCURRENCY: usize = 4;
pub const DEFAULT_MAX_QUEUED: u64 = 100_000;

/// The queue settings as written in one table (`None`: not set here).
#[derive(Clone, Default)]
pub(super) struct QueueSettings {
    delivery: Option<DeliveryMode>,
    retry_schedule: Option<Vec<Duration>>,
    concurrency: Option<usize>,
    max_queued: Option<u64>,
}

impl QueueSettings {
    pub(super) fn read(s: &mut Section, problems: &mut Problems) -> Self {
        let retry_schedule = s.strings("retry_schedule", problems).and_then(|waits| {
            if waits.is_empty() {
                problems.push(s.path_of("retry_schedule"), "needs at least one wait");
                return None;
            }
            let parsed: Vec<Option<Duration>> = waits
                .iter()
                .map(|(path, text)| match humantime::parse_duration(text) {
                    Ok(d) if !d.is_zero() => Some(d),
                    Ok(_) => {
                        problems.push(path, "must be greater than 0");
                        None
                    }
                    Err(e) => {
                        problems.push(path, format!("invalid duration {text:?} ({e})"));
                        None
                    }
                })
                .collect();
            parsed.into_iter().collect()
        });
        let concurrency = s.integer("delivery_concurrency", 1024, problems).and_then(|n| {
            if n == 0 {
                problems.push(s.path_of("delivery_concurrency"), "must be at least 1");
                return None;
            }
            usize::try_from(n).ok()
        });
        let max_queued = s.integer("max_queued", u64::from(u32::MAX), problems).and_then(|n| {
            if n == 0 {
                problems.push(s.path_of("max_queued"), "must be at least 1");
                return None;
            }
            Some(n)
        });
        QueueSettings {
            delivery: s.choice("delivery", problems),
            retry_schedule,
            concurrency,
            max_queued,
        }
    }

    /// The route's delivery: its own settings over `[defaults]` over the built-in ones.
    pub(super) fn merge(own: &Self, defaults: &Self) -> Delivery {
        macro_rules! pick {
            ($field:ident) => {
                own.$field.clone().or_else(|| defaults.$field.clone())
            };
        }
        match pick!(delivery).unwrap_or(DeliveryMode::Sync) {
            DeliveryMode::Sync => Delivery::Sync,
            DeliveryMode::Queued => Delivery::Queued(QueuePolicy {
                retry_schedule: pick!(retry_schedule).unwrap_or_else(|| DEFAULT_SCHEDULE.to_vec()),
                concurrency: pick!(concurrency).unwrap_or(DEFAULT_CONCURRENCY),
                max_queued: pick!(max_queued).unwrap_or(DEFAULT_MAX_QUEUED),
            }),
        }
    }

    /// Whether this table sets any queue setting (a sync route that does is warned).
    pub(super) fn sets_queue_settings(&self) -> bool {
        self.retry_schedule.is_some() || self.concurrency.is_some() || self.max_queued.is_some()
    }
}
