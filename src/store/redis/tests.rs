//! Unit tests of the Redis store's parts that need no server: waits, the value
//! format, failure classification, version rules, cluster slots.

use std::time::Duration;

use bytes::Bytes;
use deadpool_redis::redis::{self, ErrorKind, RedisError};
use http::{HeaderValue, StatusCode};

use super::connection::{Drops, Failure};
use super::probe::{del_if_eq, health_keys, key_slot, set_if_eq};
use super::value::{self, parse_marker};
use crate::config::RedisTarget;
use crate::store::{Completion, Marker, StoreError, StoredResponse, Token};

fn processing_value(token: Token, first_seen_ms: u64) -> String {
    String::from_utf8(value::processing(token, first_seen_ms)).expect("utf-8")
}

fn completed_value(c: &Completion) -> String {
    String::from_utf8(value::completed(c, 9)).expect("utf-8")
}

#[test]
fn processing_values_start_with_the_token_prefix_and_parse_back() {
    let token = Token::generate();
    let value = processing_value(token, 1_700_000_000_123);
    assert!(value.as_bytes().starts_with(&value::token_prefix(token)));
    assert_eq!(
        parse_marker("k", value.as_bytes()),
        Marker::Processing {
            token,
            first_seen_ms: 1_700_000_000_123
        }
    );
    let other = Token::generate();
    assert!(!value.as_bytes().starts_with(&value::token_prefix(other)));
}

#[test]
fn tokens_are_32_lowercase_hex_digits_most_significant_first() {
    let mixed = 0x0123_4567_89ab_cdef_fedc_ba98_7654_3210;
    for value in [
        0,
        1,
        0xabc,
        u128::from(u64::MAX),
        u128::from(u64::MAX) + 1,
        mixed,
        u128::MAX,
    ] {
        let token = Token::from_u128(value);
        assert_eq!(token.to_string(), format!("{value:032x}"));
        assert!(value::token_prefix(token).ends_with(format!(",\"token\":\"{value:032x}\"").as_bytes()));
    }
}

/// Values are shared by every replica, so a rolling upgrade reads what the older
/// build wrote: these literals are that format, byte for byte.
#[test]
fn values_in_the_stored_format_parse_and_broken_shapes_are_refused() {
    let processing = br#"{"state":"processing","token":"0123456789abcdef0000000000000007","first_seen_ms":5}"#;
    assert_eq!(
        parse_marker("k", processing),
        Marker::Processing {
            token: Token::from_u128(0x0123_4567_89ab_cdef_0000_0000_0000_0007),
            first_seen_ms: 5
        }
    );
    let token = Token::from_u128(0x0123_4567_89ab_cdef_0000_0000_0000_0007);
    assert_eq!(processing_value(token, 5).as_bytes(), processing); // and written so
    let completed = br#"{"state":"completed","first_seen_ms":6,"completed_ms":9,"response":{"status":200,"content_type":"text/plain","body":"say \"hi\"\n"}}"#;
    let Marker::Completed {
        first_seen_ms: 6,
        response: Some(response),
    } = parse_marker("k", completed)
    else {
        panic!("not the completed marker")
    };
    assert_eq!(response.body, Bytes::from_static(b"say \"hi\"\n")); // escapes undone
    assert_eq!(response.content_type, Some(HeaderValue::from_static("text/plain")));
    let bare = br#"{"state":"completed","first_seen_ms":6,"completed_ms":9}"#;
    assert!(matches!(
        parse_marker("k", bare),
        Marker::Completed { response: None, .. }
    ));
    // Written by hand or by another tool: read as leniently as they can be.
    let completed = [
        &br#"{"state":"completed"}"#[..],
        br#"{ "first_seen_ms": 6, "state": "completed" }"#,
        br#"{"state":"completed","first_seen_ms":6,"response":{"status":99}}"#,
        b"COMPLETED",
    ];
    for done in completed {
        let marker = parse_marker("k", done);
        assert!(
            matches!(marker, Marker::Completed { response: None, .. }),
            "{}: {marker:?}",
            String::from_utf8_lossy(done)
        );
    }
    // Anything else is held by someone who is none of this gateway's requests.
    let ours = Token::generate();
    for held in [
        &br#"{"state":"processing","first_seen_ms":5}"#[..],
        br#"{"state":"processing","token":"someone-else","first_seen_ms":5}"#,
        br#"{"first_seen_ms":1,"token":"00000000000000000000000000000001","state":"processing"}"#,
        br#"{"state":"done","first_seen_ms":5}"#,
        b"1",
        b"PROCESSING",
        b"\xff\x00",
    ] {
        let marker = parse_marker("k", held);
        assert!(
            matches!(marker, Marker::Processing { token, .. } if token != ours),
            "{}: {marker:?}",
            String::from_utf8_lossy(held)
        );
    }
}

#[test]
fn completed_values_keep_the_response_text_or_binary() {
    for body in [
        Bytes::from_static(b"{\"reply\":\"hi\"}"),
        Bytes::from_static(&[0xff, 0x00, 0x7f]),
    ] {
        let c = Completion {
            first_seen_ms: 7,
            ttl: Duration::from_secs(1),
            response: Some(StoredResponse {
                status: StatusCode::CREATED,
                content_type: Some(HeaderValue::from_static("application/json")),
                content_encoding: Some(HeaderValue::from_static("gzip")),
                body: body.clone(),
            }),
        };
        let value = completed_value(&c);
        assert!(
            value.starts_with("{\"state\":\"completed\",\"first_seen_ms\":7,"),
            "{value}"
        );
        let Marker::Completed {
            first_seen_ms,
            response,
        } = parse_marker("k", value.as_bytes())
        else {
            panic!("not completed")
        };
        assert_eq!(first_seen_ms, 7);
        assert_eq!(response.as_deref(), c.response.as_ref());
    }
}

/// A reply as Redis sends it, as redis-rs turns it into an error.
fn reply(wire: &str) -> RedisError {
    match redis::parse_redis_value(wire.as_bytes()).expect("a RESP reply") {
        redis::Value::ServerError(e) => RedisError::from(e),
        other => panic!("not an error reply: {other:?}"),
    }
}

#[test]
fn every_kind_of_failure_is_classified_in_one_place() {
    let io = |kind| RedisError::from(std::io::Error::new(kind, "x"));
    let cases = [
        (
            reply("-READONLY You can't write against a read only replica.\r\n"),
            Failure::CannotWrite,
        ),
        (
            reply("-LOADING Redis is loading the dataset in memory\r\n"),
            Failure::CannotWrite,
        ),
        (reply("-MASTERDOWN Link with MASTER is down\r\n"), Failure::CannotWrite),
        (reply("-CLUSTERDOWN The cluster is down\r\n"), Failure::CannotWrite),
        (
            reply("-OOM command not allowed when used memory > 'maxmemory'.\r\n"),
            Failure::Refused,
        ),
        (reply("-NOSCRIPT No matching script.\r\n"), Failure::Refused),
        (reply("-MOVED 3999 127.0.0.1:6381\r\n"), Failure::Refused),
        (reply("-ASK 3999 127.0.0.1:6381\r\n"), Failure::Refused),
        (
            reply("-ERR wrong number of arguments for 'get' command\r\n"),
            Failure::Refused,
        ),
        // Redis 7's answers to `SET ... IFEQ` and to `DELEX`.
        (reply("-ERR syntax error\r\n"), Failure::Unsupported),
        (
            reply("-ERR unknown command 'delex', with args beginning with: 'k' 'IFEQ' 'v' \r\n"),
            Failure::Unsupported,
        ),
        (io(std::io::ErrorKind::ConnectionReset), Failure::Lost),
        (io(std::io::ErrorKind::UnexpectedEof), Failure::Lost),
        (io(std::io::ErrorKind::TimedOut), Failure::Lost),
        (
            RedisError::from((ErrorKind::UnexpectedReturnType, "not a string")),
            Failure::Unreadable,
        ),
    ];
    for (error, expected) in cases {
        assert_eq!(Failure::of(&error), expected, "{error}");
        let drops = match expected {
            Failure::Lost => Drops::This,
            Failure::CannotWrite => Drops::All,
            Failure::Refused | Failure::Unreadable | Failure::Unsupported => Drops::None,
        };
        assert_eq!(Failure::of(&error).drops(), drops, "{error}");
        let ambiguous = Failure::of(&error).error(&error).is_ambiguous();
        assert_eq!(ambiguous, expected == Failure::Lost, "{error}: may it have landed?");
    }
    // A timeout is the caller's own deadline: ambiguous, and it drops the connection
    // too (`RedisStore::call`).
    assert!(StoreError::Timeout.is_ambiguous());
}

#[test]
fn set_if_eq_is_used_from_valkey_8_1_and_redis_8_4_and_delex_from_redis_8_4() {
    // (redis_version, valkey_version) as INFO server gives them; then SET IFEQ, DELEX.
    let cases = [
        ("7.0.15", None, false, false),
        ("8.2.1", None, false, false),
        ("8.4.0", None, true, true),
        ("10.0.0", None, true, true),
        ("7.2.4", Some("8.0.1"), false, false),
        ("7.2.4", Some("8.1.1"), true, false),
        ("7.2.4", Some("9.0.0"), true, false),
        ("unknown", None, false, false),
    ];
    for (redis, valkey, set, del) in cases {
        let found = (set_if_eq(redis, valkey), del_if_eq(redis, valkey));
        assert_eq!(found, (set, del), "{redis} {valkey:?}");
    }
}

#[test]
fn key_slots_are_the_cluster_specs() {
    // CRC16/XMODEM's check value, and the cluster spec's example.
    assert_eq!(key_slot("123456789"), 0x31C3);
    assert_eq!(key_slot("foo"), 12182);
}

#[test]
fn a_cluster_has_a_health_key_in_each_sixteenth_of_the_slots() {
    let standalone = RedisTarget::Standalone("redis://h:6379".into());
    assert_eq!(health_keys(&standalone, "dedup:"), ["dedup:__readyz"]);
    let keys = health_keys(&RedisTarget::Cluster(vec!["redis://h:7000".into()]), "dedup:");
    assert_eq!(keys.len(), 16);
    for (part, key) in keys.iter().enumerate() {
        let tag = key.strip_prefix("dedup:__readyz{").and_then(|k| k.strip_suffix('}'));
        let slot = key_slot(tag.expect("a hash tag"));
        assert_eq!(usize::from(slot / 1024), part, "{key}");
    }
}
