//! A Redis command described once, as arguments borrowed from the caller, and written
//! in whichever form its connection takes: as RESP straight into a lean connection's
//! buffer ([`super::resp`]), or as redis-rs's `Cmd` for redis-rs's connections (TLS,
//! cluster). The lean form costs no `Cmd`: no buffers of its own to allocate and fill,
//! and no second copy to frame it (redis-rs's packing was about 950 instructions per
//! call in callgrind, the largest item of a Redis call on the gateway's side).

use deadpool_redis::redis::Cmd;

/// One argument.
#[derive(Clone, Copy)]
pub(super) enum Arg<'a> {
    Bytes(&'a [u8]),
    Int(u64),
}

impl<'a> From<&'a str> for Arg<'a> {
    fn from(s: &'a str) -> Self {
        Arg::Bytes(s.as_bytes())
    }
}

/// A command: the words that lead it (its name; `EVALSHA <sha> 1` for a script), then
/// its arguments.
#[derive(Clone, Copy)]
pub(super) struct Command<'a> {
    pub lead: &'a [&'a str],
    pub args: &'a [Arg<'a>],
}

impl Command<'_> {
    /// Appends the command as RESP (an array of bulk strings).
    pub(super) fn write_resp(self, out: &mut Vec<u8>) {
        out.reserve(self.size());
        frame(out, b'*', self.lead.len() + self.args.len());
        for word in self.lead {
            bulk(out, word.as_bytes());
        }
        for arg in self.args {
            match *arg {
                Arg::Bytes(bytes) => bulk(out, bytes),
                Arg::Int(n) => bulk(out, itoa::Buffer::new().format(n).as_bytes()),
            }
        }
    }

    /// The command as redis-rs's `Cmd`.
    pub(super) fn to_cmd(self) -> Cmd {
        let mut cmd = Cmd::with_capacity(self.lead.len() + self.args.len(), self.size());
        for word in self.lead {
            cmd.arg(*word);
        }
        for arg in self.args {
            match *arg {
                Arg::Bytes(bytes) => {
                    cmd.arg(bytes);
                }
                Arg::Int(n) => {
                    cmd.arg(n);
                }
            }
        }
        cmd
    }

    /// About the bytes of the arguments, and their framing.
    pub(super) fn size(self) -> usize {
        let words: usize = self.lead.iter().map(|w| w.len()).sum();
        let args: usize = self
            .args
            .iter()
            .map(|a| match a {
                Arg::Bytes(bytes) => bytes.len(),
                Arg::Int(_) => 20,
            })
            .sum();
        words + args + 16 * (self.lead.len() + self.args.len() + 1)
    }
}

/// `<kind><n>\r\n`: an array's or a bulk string's header. Nearly every `n` has one or
/// two digits: those are written as one small array, which the compiler copies inline
/// (the general way cost 77 instructions a header in callgrind, 16 headers a request).
#[inline]
pub(super) fn frame(out: &mut Vec<u8>, kind: u8, n: usize) {
    // The casts keep what the bounds allow: a digit.
    match n {
        0..10 => out.extend_from_slice(&[kind, b'0' + n as u8, b'\r', b'\n']),
        10..100 => out.extend_from_slice(&[kind, b'0' + (n / 10) as u8, b'0' + (n % 10) as u8, b'\r', b'\n']),
        _ => {
            out.push(kind);
            out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
            out.extend_from_slice(b"\r\n");
        }
    }
}

#[inline]
pub(super) fn bulk(out: &mut Vec<u8>, bytes: &[u8]) {
    frame(out, b'$', bytes.len());
    out.extend_from_slice(bytes);
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use deadpool_redis::redis::Value;

    /// Reads back a RESP array of bulk strings, as Redis would.
    fn read_back(wire: &[u8]) -> Vec<Vec<u8>> {
        match deadpool_redis::redis::parse_redis_value(wire).expect("RESP") {
            Value::Array(items) => items
                .into_iter()
                .map(|item| match item {
                    Value::BulkString(bytes) => bytes,
                    other => panic!("not a bulk string: {other:?}"),
                })
                .collect(),
            other => panic!("not an array: {other:?}"),
        }
    }

    #[test]
    fn headers_of_every_width_read_back() {
        for n in [0, 1, 9, 10, 42, 99, 100, 101, 999, 1_000, 65_536, usize::MAX] {
            let mut out = b"x".to_vec();
            frame(&mut out, b'$', n);
            assert_eq!(out, format!("x${n}\r\n").into_bytes());
        }
    }

    #[test]
    fn both_forms_carry_the_same_arguments() {
        let long = "x".repeat(1_234);
        for value in ["", "abc", long.as_str()] {
            let args = [
                Arg::from("key\r\n"),
                Arg::Bytes(value.as_bytes()),
                Arg::Int(u64::MAX),
                Arg::Bytes(b""),
            ];
            let command = Command {
                lead: &["EVALSHA", "0123", "1"],
                args: &args,
            };
            let mut ours = b"tail of an earlier command".to_vec();
            let earlier = ours.len();
            command.write_resp(&mut ours);
            let expected: Vec<Vec<u8>> = ["EVALSHA", "0123", "1", "key\r\n", value, "18446744073709551615", ""]
                .iter()
                .map(|s| s.as_bytes().to_vec())
                .collect();
            assert_eq!(read_back(&ours[earlier..]), expected, "{value:?}");
            let mut theirs = Vec::new();
            command.to_cmd().write_packed_command(&mut theirs);
            assert_eq!(&ours[earlier..], &theirs[..], "{value:?}");
        }
    }
}
