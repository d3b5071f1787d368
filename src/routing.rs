//! Routing: which configured route serves a request path. Exact paths win over
//! prefixes; among prefixes the longest wins.

use std::collections::HashMap;
use std::sync::Arc;

use crate::config::{PathPattern, RouteConfig};
use crate::metrics::{Metrics, RouteMetrics};

/// A route as the request path uses it: its config and its metric handles.
pub struct Route {
    pub config: RouteConfig,
    pub metrics: RouteMetrics,
}

/// The routing table of one config generation (swapped whole on reload).
pub struct Routes {
    exact: HashMap<String, Arc<Route>>,
    /// Longest prefix first.
    prefixes: Vec<(String, Arc<Route>)>,
}

impl Routes {
    pub fn new(configs: &[RouteConfig], metrics: &Metrics) -> Self {
        let mut routes = Routes {
            exact: HashMap::new(),
            prefixes: Vec::new(),
        };
        for config in configs {
            let route = Arc::new(Route {
                metrics: metrics.route(&config.name),
                config: config.clone(),
            });
            match &config.path {
                PathPattern::Exact(path) => drop(routes.exact.insert(path.clone(), route)),
                PathPattern::Prefix(prefix) => routes.prefixes.push((prefix.clone(), route)),
            }
        }
        routes
            .prefixes
            .sort_by_key(|(prefix, _)| std::cmp::Reverse(prefix.len()));
        routes
    }

    /// The route called `name` (for the admin API; a scan, never on the request path).
    pub fn named(&self, name: &str) -> Option<&Arc<Route>> {
        self.all().find(|route| route.config.name == name)
    }

    /// Requests being handled on these routes now (`dedup_in_flight`, summed).
    pub fn in_flight(&self) -> i64 {
        self.all().map(|route| route.metrics.in_flight_now()).sum()
    }

    /// Every route, in no particular order.
    pub fn all(&self) -> impl Iterator<Item = &Arc<Route>> {
        self.exact.values().chain(self.prefixes.iter().map(|(_, route)| route))
    }

    /// How many routes this table has.
    pub fn len(&self) -> usize {
        self.exact.len() + self.prefixes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn find(&self, path: &str) -> Option<&Arc<Route>> {
        self.exact.get(path).or_else(|| {
            self.prefixes
                .iter()
                .find(|(prefix, _)| path.starts_with(prefix.as_str()))
                .map(|(_, route)| route)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn exact_beats_prefix_and_longest_prefix_wins() {
        let cfg = Config::parse(
            r#"
            [defaults]
            key = ["body"]
            [[routes]]
            name = "a"
            path = "/hooks/*"
            upstream = "http://127.0.0.1:1"
            [[routes]]
            name = "b"
            path = "/hooks/github/*"
            upstream = "http://127.0.0.1:1"
            [[routes]]
            name = "c"
            path = "/hooks/exact"
            upstream = "http://127.0.0.1:1"
            "#,
        )
        .expect("config");
        let routes = Routes::new(&cfg.routes, &Metrics::new());
        let name = |p: &str| routes.find(p).map(|r| r.config.name.clone());
        assert_eq!(name("/hooks/exact").as_deref(), Some("c"));
        assert_eq!(name("/hooks/github/x").as_deref(), Some("b"));
        assert_eq!(name("/hooks/other").as_deref(), Some("a"));
        assert_eq!(name("/hooks"), None);
        assert_eq!(name("/elsewhere"), None);
    }
}
