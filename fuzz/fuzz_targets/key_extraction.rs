//! Key extraction on arbitrary bodies and arbitrary source specs.
//!
//! Input: four lines, then the body:
//!
//! ```text
//! json:/msgId xml:FromUserName+xml:CreateTime form:id     <- the route's key list
//! msg_id=7&x=y                                            <- the query string
//! application/x-www-form-urlencoded                       <- Content-Type
//! d3b07384                                                <- X-Id header (for header:x-id)
//! {"msgId":"m1"}                                          <- the body, to the end
//! ```
//!
//! Never panics, and what it finds holds: a value is non-empty; `derive` and `explain`
//! agree; a composite is its parts joined by `+`; a `json:` string or number is what
//! serde_json's own pointer lookup finds; an `xml:` value is trimmed; `form:` and
//! `query:` are the first pair form_urlencoded yields; `body` is the SHA-256; a refused
//! body has a DOCTYPE; the stored key is plain printable ASCII of bounded length.

#![no_main]

use dedup_gateway::key::{Alternative, Input, KeySpec, stored_key};
use libfuzzer_sys::fuzz_target;
use sha2::{Digest, Sha256};

const PREFIX: &str = "dedup:";
const ROUTE: &str = "bot";

fn lines(data: &[u8]) -> Option<([&str; 4], &[u8])> {
    let mut rest = data;
    let mut out = [""; 4];
    for slot in &mut out {
        let end = rest.iter().position(|&b| b == b'\n')?;
        *slot = std::str::from_utf8(&rest[..end]).ok()?;
        rest = &rest[end + 1..];
    }
    Some((out, rest))
}

fn head(query: &str, content_type: &str, x_id: &str) -> http::request::Parts {
    let mut builder = http::Request::builder().method("POST");
    let uri = format!("/hook?{query}");
    builder = if http::Uri::try_from(uri.as_str()).is_ok() {
        builder.uri(uri)
    } else {
        builder.uri("/hook")
    };
    if http::HeaderValue::from_str(content_type).is_ok() {
        builder = builder.header("content-type", content_type);
    }
    if http::HeaderValue::from_str(x_id).is_ok() {
        builder = builder.header("x-id", x_id);
    }
    builder.body(()).expect("valid request").into_parts().0
}

/// The value one key-list entry yields alone.
fn alone(text: &str, input: Input<'_>) -> Option<Option<String>> {
    let alt = Alternative::parse(text).ok()?;
    match KeySpec::new(vec![alt]).derive(input) {
        Ok(v) => Some(v.map(|v| v.into_owned())),
        Err(_) => Some(None),
    }
}

fn check_stored_key(value: &str) {
    let key = stored_key(PREFIX, ROUTE, value);
    let rest = key
        .strip_prefix("dedup:bot:")
        .expect("the stored key starts with prefix and route");
    assert!(key.bytes().all(|b| (0x21..=0x7e).contains(&b)), "{key:?}");
    if rest == value {
        assert!(value.len() <= 128 && !value.contains(['{', '}']), "{value:?}");
    } else {
        let hex = rest.strip_prefix("sha256:").expect("hashed form");
        assert_eq!(hex, hex::encode(Sha256::digest(value.as_bytes())));
    }
    assert!(key.len() <= PREFIX.len() + ROUTE.len() + 1 + 128);
}

fn check_json(pointer: &str, body: &[u8], got: &Option<String>) {
    let Ok(doc) = serde_json::from_slice::<serde_json::Value>(body) else {
        return;
    };
    match doc.pointer(pointer) {
        Some(serde_json::Value::String(s)) if !s.is_empty() => {
            assert_eq!(got.as_deref(), Some(s.as_str()), "json:{pointer}");
        }
        Some(serde_json::Value::Number(n)) => {
            let token = got.as_deref().expect("a number is a key");
            let reparsed: serde_json::Value = serde_json::from_str(token).expect("the token is JSON");
            assert_eq!(reparsed, serde_json::Value::Number(n.clone()), "json:{pointer}");
        }
        _ => assert_eq!(got, &None, "json:{pointer}"),
    }
}

fn has_doctype(body: &[u8]) -> bool {
    body.windows(9).any(|w| w.eq_ignore_ascii_case(b"<!DOCTYPE"))
}

fuzz_target!(|data: &[u8]| {
    let Some(([specs, query, content_type, x_id], body)) = lines(data) else {
        return;
    };
    let texts: Vec<&str> = specs.split(' ').filter(|t| !t.is_empty()).collect();
    let alternatives: Vec<Alternative> = texts.iter().filter_map(|t| Alternative::parse(t).ok()).collect();
    let parsed: Vec<&str> = alternatives.iter().map(Alternative::text).collect();
    let spec = KeySpec::new(alternatives.clone());
    let head = head(query, content_type, x_id);
    let input = Input { head: &head, body };

    let derived = spec.derive(input);
    let (explained, _misses) = spec.explain(input);
    match &derived {
        Ok(Some(value)) => {
            assert!(!value.is_empty());
            let (_, same) = explained
                .expect("explain does not refuse what derive takes")
                .expect("explain finds what derive finds");
            assert_eq!(&same, value);
            check_stored_key(value);
        }
        Ok(None) => assert!(matches!(explained, Ok(None))),
        Err(_) => {
            assert!(explained.is_err(), "explain refuses what derive refuses");
            assert!(has_doctype(body), "only a DOCTYPE refuses a body");
        }
    }

    // Each entry alone, and what it says about its sources.
    for text in parsed {
        let Some(value) = alone(text, input) else { continue };
        if let Some(v) = &value {
            assert!(!v.is_empty(), "{text}");
            check_stored_key(v);
        }
        let parts: Vec<&str> = text.split('+').collect();
        if parts.len() > 1 {
            let each: Vec<Option<String>> = parts.iter().map(|p| alone(p, input).flatten()).collect();
            let joined = each
                .iter()
                .map(|v| v.clone())
                .collect::<Option<Vec<String>>>()
                .map(|v| v.join("+"));
            assert_eq!(value, joined, "{text}: a composite is its parts joined by +");
            continue;
        }
        if let Some(pointer) = text.strip_prefix("json:") {
            check_json(pointer, body, &value);
        } else if text.starts_with("xml:") {
            if let Some(v) = &value {
                let ws = |c: char| matches!(c, ' ' | '\t' | '\r' | '\n');
                assert!(!v.starts_with(ws) && !v.ends_with(ws), "{text}: {v:?} is trimmed");
            }
        } else if let Some(name) = text.strip_prefix("form:") {
            let is_form = content_type
                .split(';')
                .next()
                .is_some_and(|m| m.trim_ascii().eq_ignore_ascii_case("application/x-www-form-urlencoded"));
            let expected = form_urlencoded::parse(body)
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.into_owned())
                // head() sets the header only if it is a valid value (obs-text included).
                .filter(|v| !v.is_empty() && is_form && http::HeaderValue::from_str(content_type).is_ok());
            assert_eq!(value, expected, "{text}");
        } else if let Some(name) = text.strip_prefix("query:") {
            let expected = head.uri.query().and_then(|q| {
                form_urlencoded::parse(q.as_bytes())
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.into_owned())
                    .filter(|v| !v.is_empty())
            });
            assert_eq!(value, expected, "{text}");
        } else if text == "body" {
            let expected = (!body.is_empty()).then(|| hex::encode(Sha256::digest(body)));
            assert_eq!(value, expected);
        }
    }
});
