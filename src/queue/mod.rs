//! Delivery of queued routes (`delivery = "queued"`): workers per queued route in this
//! process, `delivery_concurrency` deliveries in all, each taking a few messages at a
//! time from the route's queue in the store and delivering them ([`worker`]); how an
//! attempt's end is judged and when the next one is due ([`verdict`]).
//!
//! The workers run on the coordinator's runtime, tracked with the owners' tasks, so
//! shutdown waits for running deliveries for `shutdown_grace`. A supervisor starts the
//! workers a (re)loaded config asks for; a worker whose route is gone or no longer
//! queued, or whose share of the route's concurrency is gone, stops by itself.

mod verdict;
mod worker;

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::gateway::Gateway;

/// How often the supervisor looks for routes a reload made queued.
const SUPERVISE_EVERY: Duration = Duration::from_secs(1);

/// Workers running, by route and index.
type Running = Arc<Mutex<HashSet<(String, usize)>>>;

/// Starts the delivery workers, and keeps them matching the routes until shutdown.
pub fn start(gw: &Arc<Gateway>) {
    let gw = Arc::clone(gw);
    let tasks = gw.tasks.clone();
    tasks.spawn(async move {
        let running: Running = Arc::default();
        loop {
            spawn_missing(&gw, &running);
            tokio::select! {
                () = gw.stopping() => return,
                () = tokio::time::sleep(SUPERVISE_EVERY) => {}
            }
        }
    });
}

fn spawn_missing(gw: &Arc<Gateway>, running: &Running) {
    let routes = gw.routes.load();
    for route in routes.all() {
        let Some(queue) = route.config.policy.delivery.queue() else {
            continue;
        };
        for index in 0..queue.concurrency.div_ceil(worker::BATCH) {
            let slot = (route.config.name.clone(), index);
            if !running
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(slot.clone())
            {
                continue;
            }
            let (gw, running) = (Arc::clone(gw), Arc::clone(running));
            gw.tasks.clone().spawn(async move {
                // Dropped however the worker ends (a panic too): the supervisor starts
                // a new one.
                let _slot = Slot(running, slot.clone());
                worker::run(&gw, &slot.0, slot.1).await;
            });
        }
    }
}

/// A running worker's entry in [`Running`], removed when dropped.
struct Slot(Running, (String, usize));

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).remove(&self.1);
    }
}
