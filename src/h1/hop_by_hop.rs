//! Hop-by-hop fields (RFC 9110 section 7.6.1): they describe one connection, not the
//! message, so a proxy drops them both ways, with every field a `Connection` line
//! names. The request rewrite strips them from what goes to the bot; the upstream
//! client leaves them out of the bot's answer as it parses it.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

/// RFC 9110 section 7.6.1: fields that describe one connection, not the message.
/// `Upgrade` too: it is only meaningful with `Connection: upgrade`, which the gateway
/// does not support. `Connection` comes first (see [`strip_hop_by_hop`]).
pub const HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// The lengths of the [`HOP_BY_HOP`] names, a bit each (a test holds them together).
const HOP_BY_HOP_LENGTHS: u32 = 1 << 2 | 1 << 7 | 1 << 10 | 1 << 16 | 1 << 17 | 1 << 18 | 1 << 19;

/// Whether `name` is one of the fixed hop-by-hop fields (RFC 9110 section 7.6.1, and
/// `Upgrade`).
pub fn is_hop_by_hop(name: &HeaderName) -> bool {
    hop_by_hop_index(name).is_some()
}

/// Where `name` is in [`HOP_BY_HOP`], if it is there.
fn hop_by_hop_index(name: &HeaderName) -> Option<usize> {
    // A name of a length no hop-by-hop field has is none of them: one bit test instead
    // of nine comparisons for most fields.
    let len = name.as_str().len();
    if len >= 32 || HOP_BY_HOP_LENGTHS & (1 << len) == 0 {
        return None;
    }
    HOP_BY_HOP.iter().position(|fixed| fixed == name)
}

/// Removes hop-by-hop fields, including every field the `Connection` header names.
/// Returns whether there were `Connection` lines (so fields they named are gone, too).
pub fn strip_hop_by_hop(headers: &mut HeaderMap) -> bool {
    // Most messages carry none of them, or only `Connection: keep-alive`: one pass over
    // the names present (compared, not hashed) says which to remove, so a message
    // costs a removal per field it has rather than a lookup per field there could be.
    let mut present = 0u16;
    for name in headers.keys() {
        if let Some(i) = hop_by_hop_index(name) {
            present |= 1 << i;
        }
    }
    if present & 1 != 0 {
        strip_connection_named(headers);
    }
    for (i, name) in HOP_BY_HOP.iter().enumerate() {
        if present & (1 << i) != 0 {
            headers.remove(name);
        }
    }
    present & 1 != 0
}

/// Removes the fields that the `Connection` lines name, other than the fixed ones
/// (left to the caller, `Connection` with them: removing it here would shift the lines).
fn strip_connection_named(headers: &mut HeaderMap) {
    // Nearly always the lines name only fixed fields (`Connection: keep-alive` from
    // every kept-alive upstream): one look at them, and nothing more to do.
    if !headers
        .get_all(header::CONNECTION)
        .iter()
        .any(|line| other_names(line).next().is_some())
    {
        return;
    }
    // Each line is read once and its names removed by `&str`, so no list and no
    // `HeaderName` is allocated per message. (Cloning a line is a reference count: it
    // shares hyper's buffer.)
    let mut line_index = 0;
    while let Some(line) = headers.get_all(header::CONNECTION).iter().nth(line_index).cloned() {
        line_index += 1;
        for name in other_names(&line) {
            headers.remove(name);
        }
    }
}

/// The fields a `Connection` line names, besides the fixed hop-by-hop ones.
pub fn other_names(line: &HeaderValue) -> impl Iterator<Item = &str> {
    line.to_str()
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|name| !name.is_empty() && !HOP_BY_HOP.iter().any(|fixed| name.eq_ignore_ascii_case(fixed.as_str())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_length_filter_lets_every_hop_by_hop_name_through() {
        let lengths = HOP_BY_HOP.iter().fold(0u32, |m, name| m | 1 << name.as_str().len());
        assert_eq!(lengths, HOP_BY_HOP_LENGTHS);
    }

    #[test]
    fn every_connection_line_names_fields_to_strip_in_any_case() {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("connection", "Keep-Alive, X-Hop-A"),
            ("connection", " connection ,, x-hop-b , not a name"),
            ("x-hop-a", "1"),
            ("X-Hop-B", "2"),
            ("keep-alive", "timeout=5"),
            ("x-end-to-end", "3"),
        ] {
            headers.append(
                HeaderName::try_from(name).expect("name"),
                HeaderValue::from_static(value),
            );
        }
        strip_hop_by_hop(&mut headers);
        let left: Vec<&str> = headers.keys().map(HeaderName::as_str).collect();
        assert_eq!(left, ["x-end-to-end"]);
    }

    #[test]
    fn each_hop_by_hop_field_is_stripped_alone_and_a_second_host_line_is_dropped() {
        for fixed in &HOP_BY_HOP {
            let mut headers = HeaderMap::new();
            headers.insert(fixed, HeaderValue::from_static("x"));
            headers.insert("x-end-to-end", HeaderValue::from_static("1"));
            strip_hop_by_hop(&mut headers);
            let left: Vec<&str> = headers.keys().map(HeaderName::as_str).collect();
            assert_eq!(left, ["x-end-to-end"], "{fixed}");
        }
    }
}
