//! `json:` key source: an RFC 6901 pointer walked through the body without building a
//! document tree, returning strings decoded and numbers as the exact token written (a
//! 19-digit msgId must never pass through f64).

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use super::Miss;

/// A parsed JSON pointer: the reference tokens with `~1` and `~0` decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pointer(Vec<String>);

impl Pointer {
    pub fn parse(text: &str) -> Result<Self, String> {
        let Some(rest) = text.strip_prefix('/') else {
            return Err(format!("JSON pointer {text:?} must start with \"/\""));
        };
        rest.split('/')
            .map(|token| {
                if token.replace("~0", "").replace("~1", "").contains('~') {
                    Err(format!("JSON pointer {text:?}: \"~\" must be followed by 0 or 1"))
                } else {
                    Ok(token.replace("~1", "/").replace("~0", "~"))
                }
            })
            .collect::<Result<_, _>>()
            .map(Pointer)
    }

    /// The value the pointer designates in `body`, as key text, found by serde_json's
    /// deserializer walking the path (values off the path are skipped, not built).
    pub fn lookup<'a>(&self, body: &'a [u8]) -> Result<Cow<'a, str>, Miss> {
        let mut de = serde_json::Deserializer::from_slice(body);
        let found = Seek(&self.0).deserialize(&mut de).map_err(|_| Miss::NotJson)?;
        de.end().map_err(|_| Miss::NotJson)?;
        let text = found.ok_or(Miss::NotFound)?.get();
        key_text(text, text.contains('\\'))
    }
}

/// Turns the designated value's raw text into key text: strings decoded (when
/// `escaped`, it has a backslash), numbers verbatim.
fn key_text(text: &str, escaped: bool) -> Result<Cow<'_, str>, Miss> {
    match text.as_bytes().first() {
        Some(b'"') => {
            let s: Cow<str> = if text.len() >= 2 && !escaped {
                // A string token the parser accepted, without escapes, is its own text
                // between the quotes: no second parse.
                Cow::Borrowed(&text[1..text.len() - 1])
            } else {
                // Escapes need decoding into a new string.
                Cow::Owned(serde_json::from_str::<String>(text).map_err(|_| Miss::NotJson)?)
            };
            if s.is_empty() { Err(Miss::Empty) } else { Ok(s) }
        }
        Some(b'-' | b'0'..=b'9') => Ok(Cow::Borrowed(text)),
        Some(b't' | b'f') => Err(Miss::WrongType("a boolean")),
        Some(b'n') => Err(Miss::WrongType("null")),
        Some(b'{') => Err(Miss::WrongType("an object")),
        Some(b'[') => Err(Miss::WrongType("an array")),
        _ => Err(Miss::NotJson),
    }
}

/// Walks one level of the pointer; the value is the raw target, if the path exists.
struct Seek<'p>(&'p [String]);

impl<'de> DeserializeSeed<'de> for Seek<'_> {
    type Value = Option<&'de RawValue>;

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<Self::Value, D::Error> {
        match self.0.split_first() {
            None => <&RawValue as serde::Deserialize>::deserialize(de).map(Some),
            Some((token, rest)) => de.deserialize_any(Step { token, rest }),
        }
    }
}

struct Step<'p> {
    token: &'p str,
    rest: &'p [String],
}

impl<'de> Visitor<'de> for Step<'_> {
    type Value = Option<&'de RawValue>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found = None;
        while let Some(matches) = map.next_key_seed(KeyIs(self.token))? {
            if matches {
                // A repeated key: the last one wins, as in the parsers bots use.
                found = map.next_value_seed(Seek(self.rest))?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let wanted = array_index(self.token);
        let mut found = None;
        let mut i = 0usize;
        loop {
            if Some(i) == wanted {
                match seq.next_element_seed(Seek(self.rest))? {
                    Some(v) => found = v,
                    None => break,
                }
            } else if seq.next_element::<IgnoredAny>()?.is_none() {
                break;
            }
            i += 1;
        }
        Ok(found)
    }

    // Scalars have no children: the path does not exist.
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}

/// RFC 6901 array index: digits without a leading zero (except "0" itself).
fn array_index(token: &str) -> Option<usize> {
    let valid =
        !token.is_empty() && token.bytes().all(|b| b.is_ascii_digit()) && (token == "0" || !token.starts_with('0'));
    if valid { token.parse().ok() } else { None }
}

/// Compares an object key with a pointer token without allocating when it has no escapes.
struct KeyIs<'p>(&'p str);

impl<'de> DeserializeSeed<'de> for KeyIs<'_> {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<bool, D::Error> {
        de.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeyIs<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<bool, E> {
        Ok(key == self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(pointer: &str, body: &str) -> Result<String, Miss> {
        Pointer::parse(pointer)
            .expect("pointer")
            .lookup(body.as_bytes())
            .map(Cow::into_owned)
    }

    #[test]
    fn strings_and_numbers() {
        assert_eq!(get("/msgId", r#"{"msgId":"m1"}"#), Ok("m1".into()));
        assert_eq!(
            get("/msgId", r#"{"msgId": 7891234567890123457}"#),
            Ok("7891234567890123457".into())
        );
        assert_eq!(
            get("/msgId", r#"{"msgId":"7891234567890123457"}"#),
            Ok("7891234567890123457".into())
        );
        assert_eq!(get("/a", r#"{"a":-1.50e3}"#), Ok("-1.50e3".into()));
        assert_eq!(get("/s", r#"{"s":"caf\u00e9 \"q\""}"#), Ok("café \"q\"".into()));
    }

    #[test]
    fn nested_paths_arrays_and_escapes() {
        let body = r#"{"data":{"msgId":"d1","list":[{"id":1},{"id":2}]},"a/b":{"m~n":"x"}}"#;
        assert_eq!(get("/data/msgId", body), Ok("d1".into()));
        assert_eq!(get("/data/list/1/id", body), Ok("2".into()));
        assert_eq!(get("/a~1b/m~0n", body), Ok("x".into()));
        assert_eq!(get("/data/list/01/id", body), Err(Miss::NotFound));
        assert_eq!(get("/data/list/9/id", body), Err(Miss::NotFound));
        assert_eq!(get("/data/msgId/deeper", body), Err(Miss::NotFound));
    }

    #[test]
    fn unusable_values_give_nothing() {
        assert_eq!(get("/x", r#"{"x":true}"#), Err(Miss::WrongType("a boolean")));
        assert_eq!(get("/x", r#"{"x":null}"#), Err(Miss::WrongType("null")));
        assert_eq!(get("/x", r#"{"x":{}}"#), Err(Miss::WrongType("an object")));
        assert_eq!(get("/x", r#"{"x":[1]}"#), Err(Miss::WrongType("an array")));
        assert_eq!(get("/x", r#"{"x":""}"#), Err(Miss::Empty));
        assert_eq!(get("/x", r#"{"y":"1"}"#), Err(Miss::NotFound));
        assert_eq!(get("/x", r#"{"x":"1"} trailing"#), Err(Miss::NotJson));
        assert_eq!(get("/x", "<xml/>"), Err(Miss::NotJson));
    }

    #[test]
    fn repeated_key_last_wins() {
        assert_eq!(get("/id", r#"{"id":"a","id":"b"}"#), Ok("b".into()));
    }

    #[test]
    fn pointer_syntax() {
        assert!(Pointer::parse("msgId").is_err());
        assert!(Pointer::parse("/a~2").is_err());
        assert_eq!(Pointer::parse("/a~1b").expect("ok"), Pointer(vec!["a/b".into()]));
    }
}
