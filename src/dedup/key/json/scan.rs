//! The fast path of [`super::Pointer::lookup`]: one pass over the bytes, no serde
//! machinery. It answers only where it is sure serde_json's walk would answer the same,
//! and gives up (`None`) everywhere else: any syntax error, escapes in an object key or
//! a scalar along the path, a number along the path, nesting deeper than
//! [`MAX_DEPTH`]. The serde walk then decides, so every error and every rare case keeps
//! serde_json's behaviour.
//!
//! What serde_json checks, and so what this checks before it answers (serde_json 1.0,
//! `Deserializer::ignore_value` and `SliceRead::ignore_str`): values skipped whole,
//! and the target, follow JSON's grammar; their strings have no control characters and
//! valid escapes (`\u` with four hex digits, surrogates unchecked), but their bytes are
//! not checked as UTF-8; object keys along the path, and strings met where the path
//! wants an object, are UTF-8; after the document only whitespace.

use std::borrow::Cow;

use super::{Miss, key_text};

/// Deeper nesting of skipped values gives up (serde_json has no bound there, and a
/// webhook is never this deep), and so does a longer pointer.
const MAX_DEPTH: u32 = 64;

/// The key text `path` designates in `body`, as serde_json's walk would find it; `None`
/// where the fast path cannot tell.
pub(super) fn lookup<'a>(body: &'a [u8], path: &[String]) -> Option<Result<Cow<'a, str>, Miss>> {
    // serde_json counts the containers it enters along the path against its recursion
    // limit (128); a pointer this long is serde_json's to judge.
    if path.len() > MAX_DEPTH as usize {
        return None;
    }
    let mut scan = Scan {
        b: body,
        i: 0,
        escaped: false,
    };
    let found = scan.seek(path)?;
    scan.ws();
    if scan.i != body.len() {
        return None;
    }
    let Some(target) = found else {
        return Some(Err(Miss::NotFound));
    };
    match key_text(target.text, target.escaped) {
        // An escape that does not decode: serde_json reports it.
        Err(Miss::NotJson) => None,
        other => Some(other),
    }
}

/// The value a path designates: its text, and whether it has a backslash escape.
#[derive(Clone, Copy)]
struct Target<'a> {
    text: &'a str,
    escaped: bool,
}

struct Scan<'a> {
    b: &'a [u8],
    i: usize,
    /// Set when a skipped string has an escape.
    escaped: bool,
}

impl<'a> Scan<'a> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    /// Takes `byte` if it comes next.
    fn eat(&mut self, byte: u8) -> Option<()> {
        (self.peek()? == byte).then(|| self.i += 1)
    }

    /// JSON whitespace, as serde_json skips it.
    fn ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\t' | b'\r') = self.peek() {
            self.i += 1;
        }
    }

    /// Finds where `path` leads in the value here: `Some(None)` when it leads nowhere,
    /// `Some(Some(range))` for the target's bytes, `None` to give up.
    fn seek(&mut self, path: &[String]) -> Option<Option<Target<'a>>> {
        self.ws();
        let Some((token, rest)) = path.split_first() else {
            let start = self.i;
            self.escaped = false;
            self.skip_value()?;
            // serde_json takes each value the path designates as a `&str`, also one a
            // later repeat of its key replaces.
            let text = std::str::from_utf8(&self.b[start..self.i]).ok()?;
            return Some(Some(Target {
                text,
                escaped: self.escaped,
            }));
        };
        match self.peek()? {
            b'{' => self.seek_in_object(token, rest),
            b'[' => self.seek_in_array(token, rest),
            // A string where a container is wanted: serde_json decodes it first.
            b'"' => {
                self.i += 1;
                self.plain_str()?;
                Some(None)
            }
            b't' | b'f' | b'n' => {
                self.literal()?;
                Some(None)
            }
            // Numbers here are parsed (and range-checked) by serde_json: its call.
            _ => None,
        }
    }

    /// In an object: the last member named `token` decides, as in serde_json's walk.
    fn seek_in_object(&mut self, token: &str, rest: &[String]) -> Option<Option<Target<'a>>> {
        self.i += 1;
        self.ws();
        if self.eat(b'}').is_some() {
            return Some(None);
        }
        let mut found = None;
        loop {
            self.ws();
            self.eat(b'"')?;
            let key = self.plain_str()?;
            self.ws();
            self.eat(b':')?;
            self.member_value(key == token.as_bytes(), rest, &mut found)?;
            if !self.more_members(b'}')? {
                return Some(found);
            }
        }
    }

    /// In an array: the element at the index `token` names (RFC 6901), if any.
    fn seek_in_array(&mut self, token: &str, rest: &[String]) -> Option<Option<Target<'a>>> {
        let wanted = super::array_index(token);
        self.i += 1;
        self.ws();
        if self.eat(b']').is_some() {
            return Some(None);
        }
        let mut found = None;
        let mut index = 0usize;
        loop {
            self.member_value(Some(index) == wanted, rest, &mut found)?;
            if !self.more_members(b']')? {
                return Some(found);
            }
            index += 1;
        }
    }

    /// A member's value: followed along `rest` if it is on the path (a later one
    /// replaces what an earlier one found), else skipped.
    fn member_value(&mut self, on_path: bool, rest: &[String], found: &mut Option<Target<'a>>) -> Option<()> {
        if on_path {
            *found = self.seek(rest)?;
        } else {
            self.ws();
            self.skip_value()?;
        }
        Some(())
    }

    /// After a member: whether a `,` says another follows (false at `close`).
    fn more_members(&mut self, close: u8) -> Option<bool> {
        self.ws();
        let next = self.peek()?;
        self.i += 1;
        match next {
            b',' => Some(true),
            _ if next == close => Some(false),
            _ => None,
        }
    }

    /// Skips one value (no leading whitespace), checking it as serde_json's
    /// `ignore_value` does. Containers are followed on a stack of bits (1: object).
    fn skip_value(&mut self) -> Option<()> {
        let (mut stack, mut depth) = (0u64, 0u32);
        loop {
            // A value.
            match self.peek()? {
                b'"' => {
                    self.i += 1;
                    self.skipped_str()?;
                }
                b'-' | b'0'..=b'9' => self.number()?,
                b't' | b'f' | b'n' => self.literal()?,
                open @ (b'{' | b'[') => {
                    if depth == MAX_DEPTH {
                        return None;
                    }
                    self.i += 1;
                    stack = (stack << 1) | u64::from(open == b'{');
                    depth += 1;
                    self.ws();
                    let close = if open == b'{' { b'}' } else { b']' };
                    if self.eat(close).is_none() {
                        self.member_start(open == b'{')?;
                        continue;
                    }
                    depth -= 1;
                    stack >>= 1;
                }
                _ => return None,
            }
            // After a value: the next member, or the end of containers.
            loop {
                if depth == 0 {
                    return Some(());
                }
                self.ws();
                let in_object = stack & 1 == 1;
                match self.peek()? {
                    b',' => {
                        self.i += 1;
                        self.ws();
                        self.member_start(in_object)?;
                        break;
                    }
                    b'}' if in_object => {}
                    b']' if !in_object => {}
                    _ => return None,
                }
                self.i += 1;
                depth -= 1;
                stack >>= 1;
            }
        }
    }

    /// Before a member's value: in an object its key and colon (whitespace around
    /// skipped), in an array nothing.
    fn member_start(&mut self, in_object: bool) -> Option<()> {
        if in_object {
            self.eat(b'"')?;
            self.skipped_str()?;
            self.ws();
            self.eat(b':')?;
            self.ws();
        }
        Some(())
    }

    /// The rest of a string serde_json skips (after its opening quote): no control
    /// characters, valid escapes, bytes otherwise unchecked.
    fn skipped_str(&mut self) -> Option<()> {
        loop {
            self.i = plain_run_end(self.b, self.i);
            match *self.b.get(self.i)? {
                b'"' => {
                    self.i += 1;
                    return Some(());
                }
                b'\\' => {
                    self.i += 1;
                    self.escaped = true;
                    match *self.b.get(self.i)? {
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => self.i += 1,
                        b'u' => {
                            let hex = self.b.get(self.i + 1..self.i + 5)?;
                            if !hex.iter().all(u8::is_ascii_hexdigit) {
                                return None;
                            }
                            self.i += 5;
                        }
                        _ => return None,
                    }
                }
                _ => return None,
            }
        }
    }

    /// The rest of a string serde_json decodes (after its opening quote): its bytes,
    /// if it has no escapes and is UTF-8; else give up.
    fn plain_str(&mut self) -> Option<&'a [u8]> {
        let start = self.i;
        self.i = plain_run_end(self.b, start);
        self.eat(b'"')?;
        let text = &self.b[start..self.i - 1];
        (text.is_ascii() || std::str::from_utf8(text).is_ok()).then_some(text)
    }

    /// `true`, `false` or `null`.
    fn literal(&mut self) -> Option<()> {
        let word: &[u8] = match self.peek()? {
            b't' => b"true",
            b'f' => b"false",
            _ => b"null",
        };
        self.b.get(self.i..)?.starts_with(word).then(|| self.i += word.len())
    }

    /// A number by JSON's grammar (serde_json's `ignore_integer`): what follows it is
    /// the caller's to check.
    fn number(&mut self) -> Option<()> {
        self.eat(b'-');
        match self.peek()? {
            b'0' => self.i += 1,
            b'1'..=b'9' => self.digits(),
            _ => return None,
        }
        if self.eat(b'.').is_some() {
            self.peek().filter(u8::is_ascii_digit)?;
            self.digits();
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.i += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.i += 1;
            }
            self.peek().filter(u8::is_ascii_digit)?;
            self.digits();
        }
        Some(())
    }

    fn digits(&mut self) {
        while self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.i += 1;
        }
    }
}

/// Where the plain run of string bytes from `from` ends: the index of the first quote,
/// backslash or control character (or the end). Eight bytes at a time, as serde_json
/// does: a test per byte is most of a short body's cost.
fn plain_run_end(b: &[u8], from: usize) -> usize {
    const ONES: u64 = u64::MAX / 255;
    const HIGH: u64 = ONES << 7;
    let has = |x: u64| x.wrapping_sub(ONES) & !x;
    let mut i = from;
    while let Some(chunk) = b.get(i..i + 8) {
        let x = u64::from_le_bytes(chunk.try_into().unwrap_or_default());
        // A byte below 0x20, equal to '"', equal to '\\' (only the lowest flag is exact:
        // a borrow can flag a later byte, never an earlier one).
        let control = x.wrapping_sub(ONES * 0x20) & !x;
        let hits = (control | has(x ^ (ONES * 0x22)) | has(x ^ (ONES * 0x5c))) & HIGH;
        if hits != 0 {
            return i + (hits.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while b.get(i).is_some_and(|&c| !matches!(c, b'"' | b'\\' | 0..=0x1f)) {
        i += 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::super::Pointer;
    use super::*;
    use proptest::prelude::*;

    fn fast(pointer: &str, body: &[u8]) -> Option<Result<Cow<'static, str>, Miss>> {
        let pointer = Pointer::parse(pointer).expect("pointer");
        lookup(body, &pointer.0).map(|r| r.map(|c| Cow::Owned(c.into_owned())))
    }

    #[test]
    fn plain_runs_end_at_the_first_quote_backslash_or_control() {
        for text in [
            "",
            "a",
            "abcdefgh",
            "abcdefghijklmnop",
            "caf\u{e9} \u{4e2d}\u{6587} text",
        ] {
            for end in ["\"", "\\", "\u{0}", "\u{1f}", "\n"] {
                for tail in ["", "\"", "xx\\yy\u{1}", "abcdefgh\""] {
                    let s = format!("{text}{end}{tail}");
                    assert_eq!(plain_run_end(s.as_bytes(), 0), text.len(), "{s:?}");
                }
            }
            assert_eq!(plain_run_end(text.as_bytes(), 0), text.len());
        }
        // A byte after the first hit in the same word must not move it.
        assert_eq!(plain_run_end(b"ab\x01\"xyzw", 0), 2);
        assert_eq!(plain_run_end(b"0123456789\"", 3), 10);
    }

    #[test]
    fn answers_for_the_usual_bodies() {
        let body = r#" {"type":"message","text":"h\u00e9llo \"x\" \\ \/ caf\u00c3","n":[1,-2.5e-3,{"a":null,"b":[true,false]}],
            "msgId" : "m1", "empty":{}, "list":[], "ts": 1700000000123 } "#;
        assert_eq!(fast("/msgId", body.as_bytes()), Some(Ok("m1".into())));
        assert_eq!(fast("/ts", body.as_bytes()), Some(Ok("1700000000123".into())));
        assert_eq!(fast("/n/2/b", body.as_bytes()), Some(Err(Miss::WrongType("an array"))));
        assert_eq!(fast("/n/5", body.as_bytes()), Some(Err(Miss::NotFound)));
        assert_eq!(
            fast("/text", body.as_bytes()),
            Some(Ok("h\u{e9}llo \"x\" \\ / caf\u{c3}".into()))
        );
        // Unchecked bytes in a skipped string are serde_json's behaviour too.
        assert_eq!(fast("/id", b"{\"x\":\"\xff\",\"id\":7}"), Some(Ok("7".into())));
    }

    #[test]
    fn gives_up_where_serde_json_must_decide() {
        for (pointer, body) in [
            ("/id", r#"{"id":"1"} x"#),     // trailing characters
            ("/id", r#"{"id":"1",}"#),      // trailing comma
            ("/id", r#"{"i\u0064":"1"}"#),  // an escape in a key along the path
            ("/id/x", r#"{"id":1e999}"#),   // a number along the path
            ("/id", r#"{"id":"\ud800"}"#),  // a lone surrogate in the target
            ("/id", "{\"id\":\"a\u{1}\"}"), // a control character
            ("/id", r#"{"id":01}"#),        // a leading zero
        ] {
            assert_eq!(fast(pointer, body.as_bytes()), None, "{body}");
        }
        // serde_json refuses a path through 128 containers (its recursion limit).
        let long = "/a".repeat(128);
        let body = format!("{}1{}", "{\"a\":".repeat(128), "}".repeat(128));
        assert_eq!(fast(&long, body.as_bytes()), None);
        assert_eq!(
            Pointer::parse(&long).expect("pointer").lookup(body.as_bytes()),
            Err(Miss::NotJson)
        );
        let deep = format!("{{\"x\":{}1{},\"id\":1}}", "[".repeat(65), "]".repeat(65));
        assert_eq!(fast("/id", deep.as_bytes()), None);
        assert_eq!(
            Pointer::parse("/id").expect("pointer").lookup(deep.as_bytes()),
            Ok("1".into())
        );
    }

    /// JSON-ish text: mostly valid, with the odd token serde_json refuses or treats
    /// specially, then sometimes cut or changed at a random byte.
    fn value() -> impl Strategy<Value = Vec<u8>> {
        let string = prop::collection::vec(
            prop_oneof![
                Just(&b"a"[..]),
                Just(&b"msgId"[..]),
                Just(&b"0"[..]),
                Just(&b" "[..]),
                Just("\u{e9}\u{4e2d}".as_bytes()),
                Just(&b"\\n"[..]),
                Just(&b"\\\""[..]),
                Just(&b"\\u00e9"[..]),
                Just(&b"\\ud800"[..]),
                Just(&b"\\uZZ"[..]),
                Just(&b"\\x"[..]),
                Just(&b"\x01"[..]),
                Just(&b"\xff"[..]),
            ],
            0..4,
        )
        .prop_map(|parts| [&b"\""[..], &parts.concat(), b"\""].concat());
        let leaf = prop_oneof![
            string.clone(),
            prop::sample::select(vec![
                "0", "-0", "12", "-1.5e3", "1E+2", "0.5", "01", "1.", "-", "1e", "1e999", "true", "false", "null",
                "nul", "tru",
            ])
            .prop_map(|s| s.as_bytes().to_vec()),
            prop::sample::select(vec!["\"m-1\"", "\"\"", "7", "\"caf\\u00e9\""]).prop_map(|s| s.as_bytes().to_vec()),
        ];
        let ws = prop::sample::select(vec!["", "", " ", "\n\t", "\r "]);
        leaf.prop_recursive(4, 40, 5, move |inner| {
            let key = prop_oneof![
                3 => prop::sample::select(vec!["\"a\"", "\"msgId\"", "\"0\"", "\"\""]).prop_map(|k| k.as_bytes().to_vec()),
                1 => string.clone(),
            ];
            let member = (key, ws.clone(), inner.clone())
                .prop_map(|(k, w, v)| [k, w.as_bytes().to_vec(), b":".to_vec(), v].concat());
            prop_oneof![
                prop::collection::vec(member, 0..5).prop_map(|m| [&b"{"[..], &m.join(&b","[..]), b"}"].concat()),
                prop::collection::vec(inner, 0..5).prop_map(|e| [&b"["[..], &e.join(&b", "[..]), b"]"].concat()),
            ]
        })
    }

    fn body() -> impl Strategy<Value = Vec<u8>> {
        (value(), 0..8u8, any::<prop::sample::Index>(), any::<u8>()).prop_map(|(mut v, how, at, byte)| {
            if !v.is_empty() {
                let i = at.index(v.len());
                match how {
                    0 => v.truncate(i),
                    1 => v[i] = byte,
                    2 => v.insert(i, byte),
                    _ => {}
                }
            }
            v
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(20_000))]

        /// Wherever the fast path answers, serde_json's walk answers the same.
        #[test]
        fn agrees_with_serde_json(
            body in body(),
            pointer in prop::sample::select(vec!["/msgId", "/a", "/0", "/", "/a/0", "/msgId/a", "/0/msgId", "/a/a/a"]),
        ) {
            let pointer = Pointer::parse(pointer).expect("pointer");
            if let Some(fast) = lookup(&body, &pointer.0) {
                prop_assert_eq!(fast, pointer.walk(&body), "{:?}", String::from_utf8_lossy(&body));
            }
        }
    }
}
