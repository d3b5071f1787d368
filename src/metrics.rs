//! Prometheus metrics, named as the README's metrics table names them, with bounded labels only (route,
//! outcome, class, op; never a key or a path). Per-route handles are resolved once when
//! routes are built, so counting a request is an atomic add, not a map lookup.

use std::sync::atomic::{AtomicI64, AtomicU64};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

use crate::outcome::Outcome;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    route: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClassLabels {
    route: String,
    class: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabels {
    op: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueStateLabels {
    route: String,
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeliveryLabels {
    route: String,
    result: &'static str,
}

/// How one delivery attempt of a queued message ended (`dedup_deliveries_total{result}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// 2xx: the marker is COMPLETED.
    Delivered,
    /// Failed; tried again after the schedule's next wait.
    Retry,
    /// A dead letter now (4xx, 3xx, or the schedule used up).
    Dead,
}

impl Delivery {
    const ALL: [Delivery; 3] = [Self::Delivered, Self::Retry, Self::Dead];

    fn label(self) -> &'static str {
        match self {
            Self::Delivered => "delivered",
            Self::Retry => "retry",
            Self::Dead => "dead",
        }
    }
}

/// How a background release of a claim that may have landed ended
/// (`dedup_orphan_releases_total{result}`; see `dedup::release_orphan`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OrphanRelease {
    /// The claim had landed and was deleted: the sender's retry goes through at once.
    Released,
    /// Nothing of ours was there (the claim never landed, or had expired).
    NotFound,
    /// The store did not answer before `processing_ttl` ran out; the marker expires.
    GaveUp,
    /// Too many releases were already running; the marker expires after `processing_ttl`.
    Skipped,
}

impl OrphanRelease {
    const ALL: [OrphanRelease; 4] = [Self::Released, Self::NotFound, Self::GaveUp, Self::Skipped];

    fn label(self) -> &'static str {
        match self {
            Self::Released => "released",
            Self::NotFound => "not_found",
            Self::GaveUp => "gave_up",
            Self::Skipped => "skipped",
        }
    }
}

/// How the upstream answered a forwarded request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpstreamClass {
    S2xx,
    S3xx,
    S4xx,
    S5xx,
    Error,
    Timeout,
}

impl UpstreamClass {
    const ALL: [UpstreamClass; 6] = [
        Self::S2xx,
        Self::S3xx,
        Self::S4xx,
        Self::S5xx,
        Self::Error,
        Self::Timeout,
    ];

    pub fn of_status(status: http::StatusCode) -> Self {
        match status.as_u16() {
            200..=299 => Self::S2xx,
            300..=399 => Self::S3xx,
            500..=599 => Self::S5xx,
            _ => Self::S4xx, // 1xx never reaches us as a final answer; count oddities with 4xx
        }
    }

    fn label(self) -> &'static str {
        match self {
            Self::S2xx => "2xx",
            Self::S3xx => "3xx",
            Self::S4xx => "4xx",
            Self::S5xx => "5xx",
            Self::Error => "error",
            Self::Timeout => "timeout",
        }
    }
}

/// A store operation, for `dedup_store_duration_seconds{op}` and `dedup_store_errors_total{op}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreOp {
    Claim,
    Complete,
    Release,
    Get,
    Ping,
}

impl StoreOp {
    const ALL: [StoreOp; 5] = [Self::Claim, Self::Complete, Self::Release, Self::Get, Self::Ping];

    fn label(self) -> &'static str {
        match self {
            Self::Claim => "claim",
            Self::Complete => "complete",
            Self::Release => "release",
            Self::Get => "get",
            Self::Ping => "ping",
        }
    }
}

fn upstream_histogram() -> Histogram {
    Histogram::new([0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0])
}

fn store_histogram() -> Histogram {
    // Store calls are sub-millisecond on a healthy network: resolve them.
    Histogram::new([
        0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
    ])
}

fn lag_histogram() -> Histogram {
    // From "delivered at once" to "after the default schedule's last retry".
    Histogram::new([
        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 21600.0,
        86400.0,
    ])
}

fn age_histogram() -> Histogram {
    // From "retried at once" to "a week later": what completed_ttl must cover.
    Histogram::new([
        0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 21600.0, 86400.0, 604800.0,
    ])
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// Every metric the gateway exports, and the registry that renders them.
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    upstream_responses: Family<ClassLabels, Counter>,
    upstream_duration: HistogramFamily<RouteLabels>,
    duplicate_age: HistogramFamily<RouteLabels>,
    store_ops: [(Histogram, Counter); StoreOp::ALL.len()],
    store_entries: Gauge<i64, AtomicI64>,
    store_bytes: Gauge<i64, AtomicI64>,
    config_reloads: Family<ResultLabels, Counter>,
    in_flight: Family<RouteLabels, Gauge>,
    orphan_releases: [Counter; OrphanRelease::ALL.len()],
    ready: Gauge,
    tls_expiry: Gauge<i64, AtomicI64>,
    queue_messages: Family<QueueStateLabels, Gauge>,
    queue_oldest: Family<RouteLabels, Gauge<f64, AtomicU64>>,
    deliveries: Family<DeliveryLabels, Counter>,
    delivery_lag: HistogramFamily<RouteLabels>,
    queue_append: (Histogram, Counter),
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "dedup_requests",
            "Requests on routes, by how they ended",
            requests.clone(),
        );
        let upstream_responses = Family::<ClassLabels, Counter>::default();
        registry.register(
            "dedup_upstream_responses",
            "Upstream answers to forwarded requests, by status class",
            upstream_responses.clone(),
        );
        let upstream_duration: HistogramFamily<RouteLabels> = Family::new_with_constructor(upstream_histogram);
        registry.register(
            "dedup_upstream_duration_seconds",
            "Time from forwarding a request to the upstream's response head",
            upstream_duration.clone(),
        );
        let duplicate_age: HistogramFamily<RouteLabels> = Family::new_with_constructor(age_histogram);
        registry.register(
            "dedup_duplicate_age_seconds",
            "How long after the first sighting duplicates arrive (to size completed_ttl)",
            duplicate_age.clone(),
        );
        let store_duration: HistogramFamily<OpLabels> = Family::new_with_constructor(store_histogram);
        registry.register(
            "dedup_store_duration_seconds",
            "Store call latency, by operation",
            store_duration.clone(),
        );
        let store_errors = Family::<OpLabels, Counter>::default();
        registry.register(
            "dedup_store_errors",
            "Failed store calls, by operation",
            store_errors.clone(),
        );
        let store_ops = StoreOp::ALL.map(|op| {
            let labels = OpLabels { op: op.label() };
            (
                store_duration.get_or_create(&labels).clone(),
                store_errors.get_or_create(&labels).clone(),
            )
        });
        let store_entries = Gauge::<i64, AtomicI64>::default();
        let store_bytes = Gauge::<i64, AtomicI64>::default();
        let config_reloads = Family::<ResultLabels, Counter>::default();
        // Both series exist from the start, so a scrape before the first reload reads 0.
        for result in ["success", "failure"] {
            drop(config_reloads.get_or_create(&ResultLabels { result }));
        }
        registry.register(
            "dedup_config_reloads",
            "Configuration reloads (SIGHUP or POST /reload), by result",
            config_reloads.clone(),
        );
        let in_flight = Family::<RouteLabels, Gauge>::default();
        registry.register(
            "dedup_in_flight",
            "Requests on a route being handled right now (received, not yet answered)",
            in_flight.clone(),
        );
        let orphans = Family::<ResultLabels, Counter>::default();
        registry.register(
            "dedup_orphan_releases",
            "Background releases of claims whose replies were lost, by how they ended",
            orphans.clone(),
        );
        let orphan_releases =
            OrphanRelease::ALL.map(|r| orphans.get_or_create(&ResultLabels { result: r.label() }).clone());
        let ready = Gauge::default();
        registry.register(
            "dedup_ready",
            "1 while /readyz answers 200 (store answering, not draining), else 0",
            ready.clone(),
        );
        registry.register(
            "dedup_build",
            "Build information",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
        );
        let queue_messages = Family::<QueueStateLabels, Gauge>::default();
        registry.register(
            "dedup_queue_messages",
            "Messages a queued route holds, by state (ready, scheduled, delivering, dead); read when scraped",
            queue_messages.clone(),
        );
        let queue_oldest = Family::<RouteLabels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "dedup_queue_oldest_seconds",
            "Age of the oldest message a queued route has not delivered yet (dead letters aside); 0 when none",
            queue_oldest.clone(),
        );
        let deliveries = Family::<DeliveryLabels, Counter>::default();
        registry.register(
            "dedup_deliveries",
            "Delivery attempts of queued messages, by how they ended (delivered, retry, dead)",
            deliveries.clone(),
        );
        let delivery_lag: HistogramFamily<RouteLabels> = Family::new_with_constructor(lag_histogram);
        registry.register(
            "dedup_delivery_lag_seconds",
            "Time from a queued message's ack to its delivery's 2xx",
            delivery_lag.clone(),
        );
        let append_duration = store_histogram();
        registry.register(
            "dedup_queue_append_duration_seconds",
            "Time to store a queued message (the append and its marker), before the ack",
            append_duration.clone(),
        );
        let append_errors = Counter::default();
        registry.register(
            "dedup_queue_append_errors",
            "Appends that failed (the sender was told to retry)",
            append_errors.clone(),
        );
        Metrics {
            registry,
            requests,
            upstream_responses,
            upstream_duration,
            duplicate_age,
            store_ops,
            store_entries,
            store_bytes,
            config_reloads,
            in_flight,
            orphan_releases,
            ready,
            tls_expiry: Gauge::default(),
            queue_messages,
            queue_oldest,
            deliveries,
            delivery_lag,
            queue_append: (append_duration, append_errors),
        }
    }

    /// Times one append (`dedup_queue_append_duration_seconds`), counting a failure.
    pub fn queue_append(&self, elapsed: Duration, failed: bool) {
        self.queue_append.0.observe(elapsed.as_secs_f64());
        if failed {
            self.queue_append.1.inc();
        }
    }

    /// Sets a queued route's `dedup_queue_messages` and `dedup_queue_oldest_seconds`.
    pub fn set_queue(&self, route: &str, states: [(&'static str, u64); 4], oldest: Duration) {
        for (state, n) in states {
            let labels = QueueStateLabels {
                route: route.to_owned(),
                state,
            };
            self.queue_messages
                .get_or_create(&labels)
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        let labels = RouteLabels {
            route: route.to_owned(),
        };
        self.queue_oldest.get_or_create(&labels).set(oldest.as_secs_f64());
    }

    /// Adds `dedup_store_entries` and `dedup_store_bytes` (only the memory store, which
    /// counts both cheaply, has them).
    pub fn with_store_size(mut self) -> Self {
        self.registry.register(
            "dedup_store_entries",
            "Markers held by the memory store",
            self.store_entries.clone(),
        );
        self.registry.register(
            "dedup_store_bytes",
            "Bytes held by the memory store, as max_bytes counts them (entries and stored replies)",
            self.store_bytes.clone(),
        );
        self
    }

    /// Adds `dedup_tls_certificate_expiry_seconds` (a listener with HTTPS has it).
    pub fn with_tls(mut self) -> Self {
        self.registry.register(
            "dedup_tls_certificate_expiry_seconds",
            "When the proxy listener's TLS certificate expires (Unix time, seconds)",
            self.tls_expiry.clone(),
        );
        self
    }

    /// When the served certificate expires (Unix seconds).
    pub fn set_tls_expiry(&self, not_after: i64) {
        self.tls_expiry.set(not_after);
    }

    /// The handles one route counts with.
    pub fn route(&self, route: &str) -> RouteMetrics {
        let outcome = |o: Outcome| {
            self.requests
                .get_or_create(&RequestLabels {
                    route: route.to_owned(),
                    outcome: o.label(),
                })
                .clone()
        };
        let class = |c: UpstreamClass| {
            self.upstream_responses
                .get_or_create(&ClassLabels {
                    route: route.to_owned(),
                    class: c.label(),
                })
                .clone()
        };
        let labels = RouteLabels {
            route: route.to_owned(),
        };
        RouteMetrics {
            outcomes: Outcome::ALL.map(outcome),
            classes: UpstreamClass::ALL.map(class),
            upstream_duration: self.upstream_duration.get_or_create(&labels).clone(),
            duplicate_age: self.duplicate_age.get_or_create(&labels).clone(),
            in_flight: self.in_flight.get_or_create(&labels).clone(),
            deliveries: Delivery::ALL.map(|d| {
                self.deliveries
                    .get_or_create(&DeliveryLabels {
                        route: route.to_owned(),
                        result: d.label(),
                    })
                    .clone()
            }),
            delivery_lag: self.delivery_lag.get_or_create(&labels).clone(),
        }
    }

    pub fn store_call(&self, op: StoreOp, elapsed: Duration, failed: bool) {
        let (duration, errors) = &self.store_ops[op as usize];
        duration.observe(elapsed.as_secs_f64());
        if failed {
            errors.inc();
        }
    }

    pub fn config_reload(&self, ok: bool) {
        let result = if ok { "success" } else { "failure" };
        self.config_reloads.get_or_create(&ResultLabels { result }).inc();
    }

    /// Sets `dedup_ready` (sampled when scraped, like `dedup_store_entries`).
    pub fn set_ready(&self, ready: bool) {
        self.ready.set(i64::from(ready));
    }

    pub fn orphan_release(&self, how: OrphanRelease) {
        self.orphan_releases[how as usize].inc();
    }

    /// Renders the exposition in `format`, refreshing sampled gauges first. Serve it as
    /// [`Format::content_type`]: OpenMetrics labelled as the classic format (or the
    /// reverse) makes Prometheus reject the whole scrape.
    pub fn render(&self, format: Format, store_entries: Option<usize>, store_bytes: Option<u64>) -> String {
        if let Some(n) = store_entries {
            self.store_entries.set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        if let Some(n) = store_bytes {
            self.store_bytes.set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        let mut out = String::with_capacity(8 * 1024);
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        match format {
            Format::OpenMetrics => out,
            Format::Classic => classic(&out),
        }
    }
}

/// The two text expositions a scraper may ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics text 1.0.0: what Prometheus asks for first.
    OpenMetrics,
    /// The classic text format 0.0.4: for every other client (curl, promtool, older
    /// scrapers), which would refuse OpenMetrics' `info` type and `# EOF`.
    Classic,
}

impl Format {
    /// OpenMetrics only for a client whose `Accept` names it.
    pub fn negotiate(accept: &http::HeaderMap) -> Format {
        let names_it = |v: &http::HeaderValue| {
            v.to_str()
                .is_ok_and(|v| v.to_ascii_lowercase().contains("application/openmetrics-text"))
        };
        if accept.get_all(http::header::ACCEPT).iter().any(names_it) {
            Format::OpenMetrics
        } else {
            Format::Classic
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::Classic => "text/plain; version=0.0.4; charset=utf-8",
        }
    }
}

/// The classic text format of an OpenMetrics text exposition: a counter family is
/// named with its samples' `_total`, the info family becomes the gauge `<name>_info`,
/// and `# UNIT` and `# EOF` go. Samples, gauges and histograms read the same in both.
fn classic(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    // A family's HELP comes before its TYPE, which decides the name it goes under.
    let mut help = None;
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            help = Some(rest.split_once(' ').map_or("", |(_, text)| text));
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.rsplit_once(' ').unwrap_or((rest, "unknown"));
            let (suffix, kind) = match kind {
                "counter" => ("_total", "counter"),
                "info" => ("_info", "gauge"),
                "unknown" => ("", "untyped"),
                other => ("", other),
            };
            if let Some(text) = help.take() {
                // OpenMetrics escapes `"` in HELP; the classic format does not.
                out.push_str(&format!("# HELP {name}{suffix} {}\n", text.replace("\\\"", "\"")));
            }
            out.push_str(&format!("# TYPE {name}{suffix} {kind}\n"));
        } else if !(line.starts_with("# UNIT ") || line == "# EOF") {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// One route's counters, resolved when the route is built.
#[derive(Clone)]
pub struct RouteMetrics {
    outcomes: [Counter; Outcome::ALL.len()],
    classes: [Counter; UpstreamClass::ALL.len()],
    upstream_duration: Histogram,
    duplicate_age: Histogram,
    in_flight: Gauge,
    deliveries: [Counter; Delivery::ALL.len()],
    delivery_lag: Histogram,
}

/// Counts one request in `dedup_in_flight{route}` until dropped.
pub struct InFlight<'a>(&'a Gauge);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl RouteMetrics {
    pub fn request(&self, outcome: Outcome) {
        self.outcomes[outcome.index()].inc();
    }

    pub fn upstream(&self, class: UpstreamClass, elapsed: Duration) {
        self.classes[class as usize].inc();
        self.upstream_duration.observe(elapsed.as_secs_f64());
    }

    pub fn duplicate_age(&self, age: Duration) {
        self.duplicate_age.observe(age.as_secs_f64());
    }

    /// Counts a delivery attempt of a queued message.
    pub fn delivery(&self, how: Delivery) {
        self.deliveries[how as usize].inc();
    }

    /// A queued message delivered `lag` after its ack.
    pub fn delivery_lag(&self, lag: Duration) {
        self.delivery_lag.observe(lag.as_secs_f64());
    }

    /// Requests in flight on this route now.
    pub fn in_flight_now(&self) -> i64 {
        self.in_flight.get()
    }

    /// Counts a request as in flight on this route until the guard is dropped.
    pub fn in_flight(&self) -> InFlight<'_> {
        self.in_flight.inc();
        InFlight(&self.in_flight)
    }
}
