//! The request rewrite a reverse proxy owes its upstream: same method, path, query
//! and body; hop-by-hop fields out; `X-Forwarded-For` appended, `-Proto` and `-Host`
//! set (kept as they came only from a trusted front proxy).

use std::net::{IpAddr, SocketAddr};

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::uri::PathAndQuery;
use http::{Request, Uri, Version};

use crate::body::Body;
use crate::config::Target;
use crate::h1::hop_by_hop::strip_hop_by_hop;

/// What the proxy knows about the connection a request came on.
#[derive(Clone, Copy, Debug)]
pub struct Peer {
    pub addr: SocketAddr,
    /// In `[server] trusted_proxies`: its `X-Forwarded-Proto` / `-Host` are kept.
    pub trusted: bool,
    /// It came over TLS (the listener's HTTPS): `X-Forwarded-Proto: https`.
    pub tls: bool,
}

/// Rewrites a received request for the upstream: same method, path, query and body;
/// hop-by-hop headers removed; `X-Forwarded-For` appended, `-Proto` / `-Host` set
/// (kept as they came from a trusted front proxy).
pub fn upstream_request(mut head: http::request::Parts, body: Body, target: &Target, peer: Peer) -> Request<Body> {
    let path = head
        .uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    // An HTTP/2 request carries its host in the URI, not in a Host header; an HTTP/1
    // request's Host header is forwarded as it came (only the first, if it came twice).
    let mut lines = head.headers.get_all(header::HOST).iter();
    let host = match (lines.next(), lines.next()) {
        (Some(host), None) => Host::Kept(host.clone()),
        (Some(host), Some(_)) => Host::Written(host.clone()),
        (None, _) => match head.uri.authority().map(|a| HeaderValue::from_str(a.as_str())) {
            Some(Ok(host)) => Host::Written(host),
            _ => Host::Missing,
        },
    };
    head.uri = Uri::from(path);
    head.version = Version::HTTP_11;
    let headers = &mut head.headers;
    let connection_lines = strip_hop_by_hop(headers);
    append_forwarded_for(headers, peer.addr);
    // Anyone may send these: only a trusted front proxy's values are believed.
    if !(peer.trusted && headers.contains_key(&X_FORWARDED_PROTO)) {
        let proto = if peer.tls { "https" } else { "http" };
        headers.insert(&X_FORWARDED_PROTO, HeaderValue::from_static(proto));
    }
    let forwarded_host = match host {
        Host::Kept(host) if !connection_lines => Some(host),
        // Written, or kept but perhaps just removed: a `Connection` line may name Host.
        Host::Kept(host) | Host::Written(host) => {
            headers.insert(header::HOST, host.clone());
            Some(host)
        }
        // HTTP/1.1 requires a Host: the upstream's own, as a client would send.
        Host::Missing => {
            if let Ok(host) = HeaderValue::from_str(target.authority.as_str()) {
                headers.insert(header::HOST, host);
            }
            None
        }
    };
    match forwarded_host {
        Some(host) if !(peer.trusted && headers.contains_key(&X_FORWARDED_HOST)) => {
            headers.insert(&X_FORWARDED_HOST, host);
        }
        Some(_) => {}
        None if !peer.trusted => drop(headers.remove(&X_FORWARDED_HOST)),
        None => {}
    }
    Request::from_parts(head, body)
}

/// Where a request named its host, and whether the Host header must be (re)written.
enum Host {
    /// One Host header: forwarded as it is.
    Kept(HeaderValue),
    /// From the URI (HTTP/2), or the first of several Host lines: written.
    Written(HeaderValue),
    Missing,
}

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

fn append_forwarded_for(headers: &mut HeaderMap, addr: SocketAddr) {
    use http::header::Entry;
    use std::fmt::Write as _;
    // The longest IPv6 text is 39 bytes.
    let mut value = String::with_capacity(64);
    // One lookup both reads the lines there are and replaces them.
    let entry = headers.entry(&X_FORWARDED_FOR);
    if let Entry::Occupied(lines) = &entry {
        // Several lines are one comma-separated list (RFC 9110 5.3): keep every one, in order.
        let prior = lines
            .iter()
            .filter_map(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|p| !p.is_empty());
        for line in prior {
            value.push_str(line);
            value.push_str(", ");
        }
    }
    match addr.ip() {
        // Every request has one: digits by hand rather than through `fmt`.
        IpAddr::V4(ip) => {
            for (i, octet) in ip.octets().into_iter().enumerate() {
                if i > 0 {
                    value.push('.');
                }
                push_decimal(&mut value, octet);
            }
        }
        ip @ IpAddr::V6(_) => {
            let _ = write!(value, "{ip}");
        }
    }
    if let Ok(value) = HeaderValue::try_from(value) {
        // Several X-Forwarded-For lines are one list: replace them all with the joined one.
        match entry {
            Entry::Occupied(mut lines) => drop(lines.insert(value)),
            Entry::Vacant(slot) => drop(slot.insert(value)),
        }
    }
}

fn push_decimal(out: &mut String, n: u8) {
    if n >= 100 {
        out.push(char::from(b'0' + n / 100));
    }
    if n >= 10 {
        out.push(char::from(b'0' + n / 10 % 10));
    }
    out.push(char::from(b'0' + n % 10));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rewrite of `req` from `peer`, for an upstream at 127.0.0.1:5000.
    fn rewrite(req: Request<()>, peer: Peer) -> Request<Body> {
        let target = Target::parse("http://127.0.0.1:5000").expect("target");
        upstream_request(req.into_parts().0, Body::empty(), &target, peer)
    }

    fn peer() -> Peer {
        Peer {
            trusted: false,
            addr: "10.1.2.3:5555".parse().expect("addr"),
            tls: false,
        }
    }

    #[test]
    fn request_rewrite_strips_hop_by_hop_and_sets_forwarded_headers() {
        let req = Request::post("/api/v1/webhook?a=1")
            .header("host", "gw.example")
            .header("connection", "keep-alive, x-secret-hop")
            .header("x-secret-hop", "1")
            .header("keep-alive", "timeout=5")
            .header("te", "trailers")
            .header("x-forwarded-for", "192.0.2.1")
            .header("x-forwarded-proto", "https")
            .header("x-keep", "yes")
            .body(())
            .expect("request");
        let out = rewrite(req, peer());
        // Origin-form: the connection is already the upstream's.
        assert_eq!(out.uri(), "/api/v1/webhook?a=1");
        let h = out.headers();
        for gone in ["connection", "x-secret-hop", "keep-alive", "te"] {
            assert!(!h.contains_key(gone), "{gone} must be stripped");
        }
        assert_eq!(h["x-forwarded-for"], "192.0.2.1, 10.1.2.3");
        assert_eq!(h["x-forwarded-proto"], "http");
        assert_eq!(h["x-forwarded-host"], "gw.example");
        assert_eq!(h["host"], "gw.example");
        assert_eq!(h["x-keep"], "yes");
    }

    #[test]
    fn forwarded_for_writes_addresses_as_display_does() {
        for ip in [
            "0.0.0.0",
            "10.1.2.3",
            "100.20.9.255",
            "255.255.255.255",
            "::1",
            "2001:db8::7",
        ] {
            let mut headers = HeaderMap::new();
            append_forwarded_for(&mut headers, SocketAddr::new(ip.parse().expect("ip"), 4000));
            assert_eq!(headers["x-forwarded-for"], ip);
        }
    }

    #[test]
    fn a_second_host_line_is_dropped_and_a_connection_line_naming_host_is_harmless() {
        let req = Request::post("/hook")
            .header("host", "first.example")
            .header("host", "second.example")
            .body(())
            .expect("request");
        let out = rewrite(req, peer());
        let hosts: Vec<_> = out.headers().get_all("host").iter().collect();
        assert_eq!(hosts, ["first.example"]);
        assert_eq!(out.headers()["x-forwarded-host"], "first.example");
        // A Connection line naming Host itself does not cost the upstream its Host.
        let req = Request::post("/hook")
            .header("host", "gw.example")
            .header("connection", "keep-alive, Host")
            .body(())
            .expect("request");
        let out = rewrite(req, peer());
        assert_eq!(out.headers()["host"], "gw.example");
        assert!(!out.headers().contains_key("connection"));
    }

    #[test]
    fn forwarded_for_appends_to_every_line_and_proto_host_are_kept_only_from_trusted_peers() {
        let req = || {
            Request::post("/hook")
                .header("host", "gw.example")
                .header("x-forwarded-for", "192.0.2.1, 192.0.2.2")
                .header("x-forwarded-for", "198.51.100.7")
                .header("x-forwarded-proto", "https")
                .header("x-forwarded-host", "public.example")
                .body(())
                .expect("request")
        };
        for trusted in [false, true] {
            let peer = Peer { trusted, ..peer() };
            let out = rewrite(req(), peer);
            let h = out.headers();
            assert_eq!(h.get_all("x-forwarded-for").iter().count(), 1);
            assert_eq!(h["x-forwarded-for"], "192.0.2.1, 192.0.2.2, 198.51.100.7, 10.1.2.3");
            let (proto, host) = if trusted {
                ("https", "public.example")
            } else {
                ("http", "gw.example")
            };
            assert_eq!(h["x-forwarded-proto"], proto, "trusted: {trusted}");
            assert_eq!(h["x-forwarded-host"], host, "trusted: {trusted}");
            assert_eq!(h["host"], "gw.example");
        }
        // A trusted peer that did not set them gets them set as for anyone.
        let bare = Request::post("/hook")
            .header("host", "gw.example")
            .body(())
            .expect("request");
        let peer = Peer {
            trusted: true,
            ..peer()
        };
        let out = rewrite(bare.clone(), peer);
        assert_eq!(out.headers()["x-forwarded-proto"], "http");
        assert_eq!(out.headers()["x-forwarded-host"], "gw.example");
        // The gateway's own HTTPS listener: the sender used https.
        let out = rewrite(bare, Peer { tls: true, ..peer });
        assert_eq!(out.headers()["x-forwarded-proto"], "https");
    }

    #[test]
    fn http2_requests_get_a_host_header_from_the_authority() {
        let req = Request::post("http://gw.example:8080/hook")
            .version(Version::HTTP_2)
            .body(())
            .expect("request");
        let out = rewrite(req, peer());
        assert_eq!(out.version(), Version::HTTP_11);
        assert_eq!(out.headers()["host"], "gw.example:8080");
        assert_eq!(out.headers()["x-forwarded-for"], "10.1.2.3");
    }

    #[test]
    fn a_request_without_host_gets_the_upstreams() {
        let req = Request::post("/hook")
            .version(Version::HTTP_10)
            .header("x-forwarded-host", "forged.example")
            .body(())
            .expect("request");
        let out = rewrite(req, peer());
        assert_eq!(out.headers()["host"], "127.0.0.1:5000");
        assert!(!out.headers().contains_key("x-forwarded-host"));
    }
}
