//! Unit tests of [`crate::store::redis::resp`].

use super::*;

/// A reply as Redis writes it, for `value`.
fn encode(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Nil => out.extend_from_slice(b"$-1\r\n"),
        Value::Okay => out.extend_from_slice(b"+OK\r\n"),
        Value::SimpleString(s) => out.extend_from_slice(format!("+{s}\r\n").as_bytes()),
        Value::Int(n) => out.extend_from_slice(format!(":{n}\r\n").as_bytes()),
        Value::BulkString(b) => {
            out.extend_from_slice(format!("${}\r\n", b.len()).as_bytes());
            out.extend_from_slice(b);
            out.extend_from_slice(b"\r\n");
        }
        Value::Array(items) => {
            out.extend_from_slice(format!("*{}\r\n", items.len()).as_bytes());
            for item in items {
                encode(item, out);
            }
        }
        other => unreachable!("not a RESP2 reply: {other:?}"),
    }
}

fn random_value(next: &mut impl FnMut() -> u64, depth: u8) -> Value {
    match next() % if depth < 3 { 7 } else { 6 } {
        0 => Value::Nil,
        1 => Value::Okay,
        2 => Value::SimpleString(["QUEUED", "PONG", ""][(next() % 3) as usize].to_owned()),
        3 => Value::Int(next() as i64 >> (next() % 64)),
        4 | 5 => {
            let len = (next() % 40) as usize;
            // Bytes of every kind, CR and LF among them: bulk strings are binary.
            Value::BulkString((0..len).map(|_| b"a\r\n{\"0\xff"[(next() % 7) as usize]).collect())
        }
        _ => Value::Array((0..next() % 4).map(|_| random_value(next, depth + 1)).collect()),
    }
}

#[test]
fn replies_read_as_redis_rs_reads_them_and_wait_for_their_last_byte() {
    let mut next = crate::test_rng(0x5eed_1e55);
    for _ in 0..2_000 {
        let value = random_value(&mut next, 0);
        let mut wire = Vec::new();
        encode(&value, &mut wire);
        let theirs = redis::parse_redis_value(&wire).expect("redis-rs reads it");
        assert_eq!(parse(&wire).expect("reads"), Some((theirs, wire.len())), "{wire:?}");
        for cut in 0..wire.len() {
            assert_eq!(
                parse(&wire[..cut]).expect("a prefix is not an error"),
                None,
                "{:?}",
                &wire[..cut]
            );
        }
    }
}

#[test]
fn error_replies_become_the_server_errors_redis_rs_makes() {
    for wire in [
        &b"-READONLY You can't write against a read only replica.\r\n"[..],
        b"-NOSCRIPT No matching script. Please use EVAL.\r\n",
        b"-ERR unknown command 'DELEX', with args beginning with: \r\n",
        b"-OOM command not allowed when used memory > 'maxmemory'.\r\n",
    ] {
        let ours = parse(wire).expect("reads").expect("whole");
        assert_eq!(
            ours,
            (redis::parse_redis_value(wire).expect("redis-rs reads it"), wire.len())
        );
        assert!(matches!(ours.0, Value::ServerError(_)), "{ours:?}");
    }
}

#[test]
fn replies_out_of_step_are_errors_not_waits() {
    for wire in [
        &b"$3\r\nabcd\r\n"[..], // longer than its length
        b":12x\r\n",
        b"$-2\r\n",
        b"*-5\r\n",
        b"~1\r\n:1\r\n", // RESP3
        b"\r\n",
    ] {
        assert!(parse(wire).is_err(), "{wire:?}");
    }
    let deep = "*1\r\n".repeat(usize::from(MAX_DEPTH) + 1) + ":1\r\n";
    assert!(parse(deep.as_bytes()).is_err());
    // A lone LF or CR is part of the line, as redis-rs reads it: the line ends at CR LF.
    assert_eq!(parse(b"+OK\n").expect("a prefix"), None);
    assert_eq!(
        parse(b"+a\nb\rc\r\n").expect("reads"),
        Some((Value::SimpleString("a\nb\rc".to_owned()), 8))
    );
}

#[test]
fn an_array_length_is_not_trusted_for_its_allocation() {
    assert_eq!(parse(b"*4000000000\r\n:1\r\n").expect("a prefix"), None);
}
