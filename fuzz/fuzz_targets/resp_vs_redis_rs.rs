//! Differential: the store's own RESP reader against redis-rs's parser.
//!
//! On `redis://` URLs the gateway reads Redis's replies with its own RESP2 reader
//! (`store::redis::resp`); replies are matched to calls in order, so a reply read with
//! the wrong length would answer every later call with another call's reply. The same
//! bytes, arriving in reads split where the fuzzer says, go to that reader (as the
//! connection's driver feeds it: whatever has arrived, after each read) and to
//! redis-rs's `parse_redis_value`, and:
//! - each reply the reader takes is the value redis-rs reads from the same bytes, and
//!   takes exactly the bytes redis-rs's reading of the rest implies;
//! - a reply it waits on (incomplete) is one redis-rs cannot read yet either;
//! - it refuses only what redis-rs refuses, or what the store never asks for: RESP3
//!   types, nesting deeper than its bound, a status that is not UTF-8.
//!
//! Input: byte 0 = n (mod 16), then n read sizes (each byte + 1, used in turn); the rest
//! is the stream of replies.

#![no_main]

use deadpool_redis::redis::{self, Value};
use dedup_gateway::store::redis::read_reply;
use libfuzzer_sys::fuzz_target;

/// What redis-rs makes of the front of `buf`: a reply and the bytes it took, `None`
/// for bytes that are not a whole reply, or an error.
fn theirs(buf: &[u8]) -> Result<Option<(Value, usize)>, ()> {
    // redis-rs's parser reads one value from a reader and leaves the rest: the bytes
    // it took are what the reader moved past.
    let mut reader = buf;
    match redis::Parser::new().parse_value(&mut reader) {
        Ok(value) => Ok(Some((value, buf.len() - reader.len()))),
        Err(e) if e.kind() == redis::ErrorKind::Io => Ok(None), // ran out of bytes
        Err(_) => Err(()),
    }
}

/// Replies the store's reader refuses on purpose: its connections speak RESP2 (no
/// maps, sets, doubles, ... nor a null other than RESP2's), the store asks for nothing
/// nested 8 deep, and a status line is text.
fn refused_on_purpose(value: &Value, raw: &[u8], depth: u8) -> bool {
    match value {
        Value::Array(items) => depth + 1 >= 8 || items.iter().any(|v| refused_on_purpose(v, raw, depth + 1)),
        Value::Nil => !(raw.starts_with(b"$-1\r\n") || raw.starts_with(b"*-1\r\n")) || nil_elsewhere(raw),
        Value::SimpleString(_) | Value::Okay => std::str::from_utf8(raw).is_err(),
        // RESP3's blob error (`!`) reads as the same value as RESP2's `-` line.
        Value::ServerError(_) => raw.contains(&b'!'),
        Value::Int(_) | Value::BulkString(_) => false,
        _ => true,
    }
}

/// A RESP3 null (`_`) anywhere in the bytes (inside an array, say).
fn nil_elsewhere(raw: &[u8]) -> bool {
    raw.windows(3).any(|w| w == b"\n_\r") || raw.starts_with(b"_")
}

fuzz_target!(|data: &[u8]| {
    let Some((&n, rest)) = data.split_first() else {
        return;
    };
    let n = usize::from(n % 16).min(rest.len());
    let (sizes, stream) = rest.split_at(n);
    // The reads, as the driver gets them.
    let mut cuts = Vec::new();
    let mut at = 0;
    for &size in sizes.iter().cycle().take(if sizes.is_empty() { 0 } else { stream.len() }) {
        at = (at + usize::from(size) + 1).min(stream.len());
        cuts.push(at);
        if at == stream.len() {
            break;
        }
    }
    cuts.push(stream.len());
    let mut taken = 0; // bytes consumed by whole replies
    for &arrived in &cuts {
        loop {
            let buf = &stream[taken..arrived];
            if buf.is_empty() {
                break;
            }
            match read_reply(buf) {
                Ok(Some((value, used))) => {
                    assert!(used > 0 && used <= buf.len());
                    match theirs(&buf[..used]) {
                        Ok(Some((expected, took))) => {
                            assert_eq!(value, expected, "the reply in {:?}", &buf[..used]);
                            assert_eq!(took, used, "the reply's length in {:?}", &buf[..used]);
                        }
                        other => panic!("ours read {value:?} from {:?}; redis-rs: {other:?}", &buf[..used]),
                    }
                    taken += used;
                }
                Ok(None) => {
                    // Waiting: redis-rs cannot have a whole reply here that ours would
                    // take, unless it is one ours refuses once whole.
                    if let Ok(Some((value, took))) = theirs(buf) {
                        let whole = read_reply(&buf[..took]);
                        assert!(
                            whole.is_err() && refused_on_purpose(&value, &buf[..took], 0),
                            "redis-rs read {value:?} from {:?}, ours waits for more",
                            &buf[..took]
                        );
                    }
                    break;
                }
                Err(_) => {
                    // Out of step: the connection is dropped. Fine where redis-rs
                    // refuses too, or cannot read a whole reply yet, or on purpose.
                    if let Ok(Some((value, took))) = theirs(buf) {
                        assert!(
                            refused_on_purpose(&value, &buf[..took], 0),
                            "ours refused {:?}; redis-rs read {value:?}",
                            &buf[..took]
                        );
                    }
                    return;
                }
            }
        }
    }
});
