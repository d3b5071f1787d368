//! `Config::parse` on arbitrary text: never panics, and a config it accepts holds what
//! the start-up checks promise.

#![no_main]

use std::collections::HashSet;

use dedup_gateway::Config;
use dedup_gateway::config::processing_ttl_floor;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Config::parse(text) {
        Err(e) => {
            // Every error renders (the CLI prints it).
            let shown = e.to_string();
            assert!(!shown.is_empty());
        }
        Ok(config) => {
            let _ = format!("{config:?}");
            let mut names = HashSet::new();
            for route in &config.routes {
                assert!(names.insert(route.name.clone()), "route names are unique");
                assert!(
                    !route.name.is_empty()
                        && route.name.len() <= 64
                        && route
                            .name
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b)),
                    "route name {:?}",
                    route.name
                );
                let p = &route.policy;
                let floor = processing_ttl_floor(p.upstream_timeout, config.store.timeout);
                assert!(p.processing_ttl > floor, "processing_ttl checked at start");
                assert!(!route.key.alternatives().is_empty(), "a route has key sources");
            }
        }
    }
});
