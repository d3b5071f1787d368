//! The shared state of a running gateway: routes (swappable on reload), store,
//! metrics, and the bookkeeping shutdown needs.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::Notify;
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};
use tokio_util::task::TaskTracker;

use crate::config::Config;
use crate::config::cidr::Cidr;
use crate::config::policy::OnStoreError;
use crate::metrics::{Format, Metrics, StoreOp};
use crate::routing::Routes;
use crate::secret::Secret;
use crate::store::{AnyStore, Store, unix_ms};
use crate::tls::Certificates;

pub struct Gateway {
    pub routes: ArcSwap<Routes>,
    pub store: AnyStore,
    pub metrics: Metrics,
    pub max_body: u64,
    /// Bound on reading a request body (`server.body_timeout`).
    pub body_timeout: std::time::Duration,
    pub key_prefix: String,
    pub on_store_error: OnStoreError,
    /// `[server] trusted_proxies`: peers whose `X-Forwarded-Proto` / `-Host` are kept.
    pub trusted_proxies: Vec<Cidr>,
    /// `[server] admin_token_env`: what `POST /reload` and `DELETE /keys/...` require.
    pub admin_token: Option<Secret>,
    /// Owner tasks (forward + complete/release); shutdown waits for them.
    pub tasks: TaskTracker,
    /// Raised when the shutdown grace ends ([`Gateway::abandon_owners`]): owners still
    /// running release and stop. Every owner waits on it ([`Gateway::abandoned`]).
    abandon: CancellationToken,
    /// Raised when shutdown starts ([`Gateway::start_draining`]): delivery workers take
    /// no new message ([`Gateway::stopping`]).
    stopping: CancellationToken,
    /// Background releases of claims that may have landed (see `dedup::release_orphan`).
    pub orphan_releases: AtomicUsize,
    draining: AtomicBool,
    /// Worker threads still starting (opening their store connections): not ready
    /// until every one serves.
    pub workers_starting: AtomicUsize,
    /// When the store last answered a ping (Unix ms); 0 = never.
    store_ok_ms: AtomicU64,
    /// The proxy listener's certificate, with HTTPS: what it serves, what `POST
    /// /reload` reloads and what `/metrics` reports the expiry of.
    pub tls: OnceLock<Arc<Certificates>>,
    /// Wakes queued routes' delivery workers in this process.
    pub deliveries: Deliveries,
    /// When the last append failed (Unix ms), 0 once one succeeds: not ready meanwhile.
    append_failed_ms: AtomicU64,
}

/// Wakes the delivery workers of a queued route in this process when a message is
/// appended (workers of other replicas find it when they next look).
#[derive(Default)]
pub struct Deliveries {
    wakers: Mutex<HashMap<String, Arc<Notify>>>,
}

impl Deliveries {
    /// What `route`'s workers wait on.
    pub fn waker(&self, route: &str) -> Arc<Notify> {
        let mut wakers = self.wakers.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(wakers.entry(route.to_owned()).or_default())
    }

    /// A message was appended to `route`'s queue: one idle worker takes it.
    pub fn wake(&self, route: &str) {
        let wakers = self.wakers.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(waker) = wakers.get(route) {
            waker.notify_one();
        }
    }
}

/// How fresh the last successful store ping must be for `/readyz`.
const READY_WINDOW: Duration = Duration::from_millis(1500);

impl Gateway {
    pub fn new(config: &Config, store: AnyStore) -> Arc<Self> {
        let mut metrics = Metrics::new();
        if store.entries().is_some() {
            metrics = metrics.with_store_size();
        }
        if config.server.tls.is_some() {
            metrics = metrics.with_tls();
        }
        Arc::new(Gateway {
            routes: ArcSwap::from_pointee(Routes::new(&config.routes, &metrics)),
            store,
            metrics,
            max_body: config.server.max_body,
            body_timeout: config.server.body_timeout,
            key_prefix: config.store.key_prefix.clone(),
            on_store_error: config.store.on_error,
            trusted_proxies: config.server.trusted_proxies.clone(),
            admin_token: config.server.admin_token.clone(),
            tasks: TaskTracker::new(),
            abandon: CancellationToken::new(),
            stopping: CancellationToken::new(),
            orphan_releases: AtomicUsize::new(0),
            draining: AtomicBool::new(false),
            workers_starting: AtomicUsize::new(config.server.workers),
            store_ok_ms: AtomicU64::new(0),
            tls: OnceLock::new(),
            deliveries: Deliveries::default(),
            append_failed_ms: AtomicU64::new(0),
        })
    }

    /// Installs the routes of a new config generation; requests already routed finish
    /// with the old ones.
    pub fn swap_routes(&self, config: &Config) {
        self.routes.store(Arc::new(Routes::new(&config.routes, &self.metrics)));
    }

    /// Completes once the shutdown grace is over ([`Gateway::abandon_owners`]).
    pub fn abandoned(&self) -> WaitForCancellationFuture<'_> {
        self.abandon.cancelled()
    }

    /// Ends the shutdown grace: every [`Gateway::abandoned`] completes.
    pub fn abandon_owners(&self) {
        self.abandon.cancel();
    }

    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
        self.stopping.cancel();
    }

    /// Completes once shutdown has started.
    pub fn stopping(&self) -> WaitForCancellationFuture<'_> {
        self.stopping.cancelled()
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping.is_cancelled()
    }

    pub fn is_ready(&self) -> bool {
        let (last, now) = (self.store_ok_ms.load(Ordering::Relaxed), unix_ms());
        let failed = self.append_failed_ms.load(Ordering::Relaxed);
        let window = READY_WINDOW.as_millis() as u64;
        !self.draining.load(Ordering::SeqCst)
            && self.workers_starting.load(Ordering::SeqCst) == 0
            && last != 0
            && now.saturating_sub(last) <= window
            && (failed == 0 || now.saturating_sub(failed) > window)
    }

    /// Records how an append went: while appends fail, `/readyz` answers 503 (until
    /// one succeeds, or none has failed for the readiness window).
    pub fn note_append(&self, ok: bool) {
        let value = if ok { 0 } else { unix_ms().max(1) };
        if self.append_failed_ms.load(Ordering::Relaxed) != value {
            self.append_failed_ms.store(value, Ordering::Relaxed);
        }
    }

    /// The metrics as `/metrics` serves them, with the gauges read now (readiness, the
    /// store's size, the certificate's expiry).
    pub fn render_metrics(&self, format: Format) -> String {
        self.metrics.set_ready(self.is_ready());
        if let Some(certificates) = self.tls.get() {
            self.metrics.set_tls_expiry(certificates.not_after());
        }
        self.metrics.render(format, self.store.entries(), self.store.bytes())
    }

    /// Pings the store now and records the result for readiness.
    pub async fn check_store(&self) -> bool {
        let started = tokio::time::Instant::now();
        let ok = self.store.ping().await.is_ok();
        self.metrics.store_call(StoreOp::Ping, started.elapsed(), !ok);
        if ok {
            self.store_ok_ms.store(unix_ms(), Ordering::Relaxed);
        }
        ok
    }

    /// Pings the store every half second, for as long as the gateway runs.
    pub fn spawn_store_checks(self: &Arc<Self>) {
        let gw = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(500));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            // Logged when it changes, by the checks alone (not by draining, and not
            // by readiness, which holds a success for READY_WINDOW).
            let mut answered: Option<bool> = None;
            loop {
                tick.tick().await;
                let Some(gw) = gw.upgrade() else { return };
                let ok = gw.check_store().await;
                match (answered, ok) {
                    (Some(true) | None, false) => tracing::warn!("store stopped answering: not ready"),
                    (Some(false), true) => tracing::info!("store answers"),
                    _ => {}
                }
                answered = Some(ok);
            }
        });
    }
}
