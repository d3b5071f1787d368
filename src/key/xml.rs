//! `xml:` key source: element text read in one streaming pass over the body (quick-xml,
//! no document tree). Every `xml:` path of a route is looked up in the same pass, so a
//! route keyed on `xml:MsgId` then `xml:FromUserName+xml:CreateTime` parses once.
//!
//! - `xml:Name` is the element `Name` directly under the root, whatever the root is
//!   called; `xml:/xml/A/B` is a full path from the root.
//! - Text and CDATA read alike and concatenate; `&lt;`, `&#x41;` etc. are decoded;
//!   surrounding whitespace is trimmed. The first matching element wins.
//! - An element with child elements has no text value.
//! - The whole body must be well-formed (one root, matching tags, known entities), or
//!   no `xml:` source yields anything.
//! - A body with a DOCTYPE (which is where entity declarations live) is refused: it is
//!   never expanded, and the request gets 400.

use std::borrow::Cow;
use std::fmt;

use quick_xml::Reader;
use quick_xml::escape::resolve_predefined_entity;
use quick_xml::events::Event;

/// One step of a path: the root of `xml:Name` matches any name.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Segment {
    AnyRoot,
    Name(Box<str>),
}

/// A parsed `xml:` path, root first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XmlPath(Vec<Segment>);

impl XmlPath {
    /// Parses what follows `xml:`: `Name` or `/root/.../Name`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let names: Vec<&str> = match text.strip_prefix('/') {
            Some(full) => full.split('/').collect(),
            None => vec![text],
        };
        for name in &names {
            let bad = name.is_empty()
                || name
                    .chars()
                    .any(|c| c.is_whitespace() || matches!(c, '<' | '>' | '&' | '"' | '\'' | '=' | '/' | '+'));
            if bad {
                return Err(format!(
                    "xml:{text}: expected an element name (\"xml:MsgId\") or a full path (\"xml:/xml/MsgId\")"
                ));
            }
        }
        let mut segments: Vec<Segment> = names.iter().map(|n| Segment::Name((*n).into())).collect();
        if !text.starts_with('/') {
            segments.insert(0, Segment::AnyRoot);
        }
        Ok(XmlPath(segments))
    }

    fn matches(&self, depth: usize, name: &[u8]) -> bool {
        match self.0.get(depth) {
            Some(Segment::AnyRoot) => true,
            Some(Segment::Name(n)) => n.as_bytes() == name,
            None => false,
        }
    }
}

/// What one path found in a well-formed body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found<'a> {
    Missing,
    /// The element's text, trimmed (possibly empty).
    Text(Cow<'a, str>),
    /// The element has child elements.
    Children,
}

/// Why a body gave no `xml:` values at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XmlError {
    /// A DOCTYPE (with or without entity declarations): refused, never expanded.
    Doctype,
    Malformed,
    NotUtf8,
}

impl fmt::Display for XmlError {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(match self {
            XmlError::Doctype => "body has a DOCTYPE or entity declaration (refused)",
            XmlError::Malformed => "body is not well-formed XML",
            XmlError::NotUtf8 => "body is not UTF-8",
        })
    }
}

/// Per path while reading: how deep the open elements match it, and its result.
enum State<'a> {
    Pending {
        matched: usize,
    },
    /// Inside the target element (opened at `depth`), collecting its text.
    Collecting {
        depth: usize,
        text: Option<Cow<'a, str>>,
    },
    Done(Found<'a>),
}

/// Looks up every path in one pass; the result has one entry per path, in order.
pub fn extract<'a>(body: &'a [u8], paths: &[XmlPath]) -> Result<Vec<Found<'a>>, XmlError> {
    let text = std::str::from_utf8(body).map_err(|_| XmlError::NotUtf8)?;
    let mut states: Vec<State<'a>> = paths.iter().map(|_| State::Pending { matched: 0 }).collect();
    let mut reader = Reader::from_str(text);
    let mut depth = 0usize;
    let mut root_seen = false;
    loop {
        let event = reader.read_event().map_err(|_| XmlError::Malformed)?;
        match event {
            Event::DocType(_) => return Err(XmlError::Doctype),
            Event::Start(e) | Event::Empty(e) if depth == 0 && root_seen => {
                let _ = e;
                return Err(XmlError::Malformed); // a second root
            }
            Event::Start(e) => {
                root_seen = true;
                open(&mut states, paths, depth, e.name().as_ref());
                depth += 1;
            }
            Event::Empty(e) => {
                root_seen = true;
                open(&mut states, paths, depth, e.name().as_ref());
                close(&mut states, depth);
            }
            Event::End(_) => {
                depth = depth.checked_sub(1).ok_or(XmlError::Malformed)?;
                close(&mut states, depth);
            }
            Event::Text(t) => {
                let t = t.xml10_content().map_err(|_| XmlError::Malformed)?;
                if depth == 0 {
                    if !t.trim_matches(is_xml_space).is_empty() {
                        return Err(XmlError::Malformed);
                    }
                } else {
                    append(&mut states, t);
                }
            }
            Event::CData(c) => {
                if depth == 0 {
                    return Err(XmlError::Malformed);
                }
                append(&mut states, c.xml10_content().map_err(|_| XmlError::Malformed)?);
            }
            Event::GeneralRef(r) => {
                if depth == 0 {
                    return Err(XmlError::Malformed);
                }
                let resolved: Cow<'a, str> = match r.resolve_char_ref() {
                    Ok(Some(c)) => Cow::Owned(c.to_string()),
                    Ok(None) => {
                        let name = r.decode().map_err(|_| XmlError::Malformed)?;
                        // Only the five predefined entities exist without a DTD.
                        Cow::Borrowed(resolve_predefined_entity(&name).ok_or(XmlError::Malformed)?)
                    }
                    Err(_) => return Err(XmlError::Malformed),
                };
                append(&mut states, resolved);
            }
            Event::Comment(_) | Event::PI(_) | Event::Decl(_) => {}
            Event::Eof => {
                if depth != 0 || !root_seen {
                    return Err(XmlError::Malformed);
                }
                break;
            }
        }
    }
    Ok(states
        .into_iter()
        .map(|s| match s {
            State::Done(found) => found,
            State::Pending { .. } | State::Collecting { .. } => Found::Missing,
        })
        .collect())
}

fn open(states: &mut [State<'_>], paths: &[XmlPath], depth: usize, name: &[u8]) {
    for (state, path) in states.iter_mut().zip(paths) {
        match state {
            State::Collecting { .. } => *state = State::Done(Found::Children),
            State::Pending { matched } if *matched == depth && path.matches(depth, name) => {
                *matched = depth + 1;
                if *matched == path.0.len() {
                    *state = State::Collecting { depth, text: None };
                }
            }
            State::Pending { .. } | State::Done(_) => {}
        }
    }
}

/// The element at `depth` closes.
fn close(states: &mut [State<'_>], depth: usize) {
    for state in states.iter_mut() {
        match state {
            State::Collecting { depth: d, text } if *d == depth => {
                let text = trim(text.take().unwrap_or(Cow::Borrowed("")));
                *state = State::Done(Found::Text(text));
            }
            State::Pending { matched } if *matched > depth => *matched = depth,
            _ => {}
        }
    }
}

fn append<'a>(states: &mut [State<'a>], piece: Cow<'a, str>) {
    for state in states.iter_mut() {
        if let State::Collecting { text, .. } = state {
            *text = Some(match text.take() {
                None => piece.clone(),
                Some(mut so_far) => {
                    so_far.to_mut().push_str(&piece);
                    so_far
                }
            });
        }
    }
}

fn is_xml_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\r' | '\n')
}

fn trim(text: Cow<'_, str>) -> Cow<'_, str> {
    match text {
        Cow::Borrowed(s) => Cow::Borrowed(s.trim_matches(is_xml_space)),
        Cow::Owned(s) => {
            let t = s.trim_matches(is_xml_space);
            if t.len() == s.len() {
                Cow::Owned(s)
            } else {
                Cow::Owned(t.to_owned())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(path: &str, body: &str) -> Result<Found<'static>, XmlError> {
        let paths = [XmlPath::parse(path).expect("path")];
        extract(body.as_bytes(), &paths).map(|mut v| match v.remove(0) {
            Found::Text(t) => Found::Text(Cow::Owned(t.into_owned())),
            Found::Missing => Found::Missing,
            Found::Children => Found::Children,
        })
    }

    fn text(s: &str) -> Result<Found<'static>, XmlError> {
        Ok(Found::Text(Cow::Owned(s.to_owned())))
    }

    #[test]
    fn cdata_and_plain_text_read_alike() {
        let plain = "<xml><MsgId>1234567890123456789</MsgId></xml>";
        let cdata = "<xml><MsgId><![CDATA[1234567890123456789]]></MsgId></xml>";
        assert_eq!(get("MsgId", plain), text("1234567890123456789"));
        assert_eq!(get("MsgId", cdata), text("1234567890123456789"));
        assert_eq!(get("MsgId", "<xml>\n  <MsgId>\n 7 </MsgId>\n</xml>\n"), text("7"));
    }

    #[test]
    fn entities_are_decoded_and_pieces_concatenate() {
        assert_eq!(
            get("A", "<r><A>a&lt;b&amp;&#x41;&#66;<![CDATA[<c>]]>&quot;</A></r>"),
            text("a<b&AB<c>\"")
        );
        assert_eq!(get("A", "<r><A>&nbsp;</A></r>"), Err(XmlError::Malformed));
        assert_eq!(get("A", "<r><A>a & b</A></r>"), Err(XmlError::Malformed));
    }

    #[test]
    fn names_are_direct_children_and_paths_are_full() {
        let body = "<xml><Info><MsgId>inner</MsgId></Info><MsgId>outer</MsgId></xml>";
        assert_eq!(get("MsgId", body), text("outer"));
        assert_eq!(get("/xml/Info/MsgId", body), text("inner"));
        assert_eq!(get("/other/MsgId", body), Ok(Found::Missing));
        assert_eq!(get("Info", body), Ok(Found::Children));
        assert_eq!(get("Nope", body), Ok(Found::Missing));
        assert_eq!(get("MsgId", "<a><MsgId>1</MsgId><MsgId>2</MsgId></a>"), text("1"));
        assert_eq!(get("E", "<a><E/></a>"), text(""));
        assert_eq!(get("/a", "<a>root text</a>"), text("root text"));
    }

    #[test]
    fn one_pass_finds_every_path() {
        let paths: Vec<XmlPath> = ["MsgId", "FromUserName", "CreateTime", "/xml/Nope"]
            .iter()
            .map(|p| XmlPath::parse(p).expect("path"))
            .collect();
        let body = b"<xml><FromUserName><![CDATA[o_abc]]></FromUserName><CreateTime>1700000000</CreateTime></xml>";
        assert_eq!(
            extract(body, &paths).expect("xml"),
            vec![
                Found::Missing,
                Found::Text(Cow::Borrowed("o_abc")),
                Found::Text(Cow::Borrowed("1700000000")),
                Found::Missing
            ]
        );
    }

    #[test]
    fn doctype_and_entity_declarations_are_refused() {
        let bombs = [
            "<?xml version=\"1.0\"?><!DOCTYPE xml [<!ENTITY a \"aaaa\"><!ENTITY b \"&a;&a;\">]><xml><MsgId>&b;</MsgId></xml>",
            "<!DOCTYPE xml SYSTEM \"file:///etc/passwd\"><xml><MsgId>1</MsgId></xml>",
            "<!DOCTYPE xml><xml><MsgId>1</MsgId></xml>",
        ];
        for bomb in bombs {
            assert_eq!(get("MsgId", bomb), Err(XmlError::Doctype), "{bomb}");
        }
    }

    #[test]
    fn malformed_bodies_give_nothing() {
        for bad in [
            "",
            "   ",
            "not xml",
            "<xml><MsgId>1</MsgId>",
            "<xml><MsgId>1</xml>",
            "<xml><MsgId>1</MsgId></xml><xml/>",
            "<xml><MsgId>1</MsgId></xml>trailing",
            "</xml>",
            "<![CDATA[x]]><xml/>",
        ] {
            assert_eq!(get("MsgId", bad), Err(XmlError::Malformed), "{bad:?}");
        }
        assert_eq!(
            extract(
                b"<xml><MsgId>\xff</MsgId></xml>",
                &[XmlPath::parse("MsgId").expect("p")]
            ),
            Err(XmlError::NotUtf8)
        );
    }

    #[test]
    fn path_syntax() {
        assert!(XmlPath::parse("").is_err());
        assert!(XmlPath::parse("/").is_err());
        assert!(XmlPath::parse("/xml//A").is_err());
        assert!(XmlPath::parse("a b").is_err());
        assert!(XmlPath::parse("A/B").is_err());
        assert_eq!(
            XmlPath::parse("MsgId").expect("ok"),
            XmlPath(vec![Segment::AnyRoot, Segment::Name("MsgId".into())])
        );
    }

    /// A seeded generator: 10,000 random and mangled XML bodies never panic, and every
    /// outcome is one of the defined ones.
    #[test]
    fn ten_thousand_random_bodies_never_panic() {
        let mut next = crate::test_rng(0x9e37_79b9_7f4a_7c15);
        const PIECES: [&str; 24] = [
            "<xml>",
            "</xml>",
            "<MsgId>",
            "</MsgId>",
            "<![CDATA[",
            "]]>",
            "&lt;",
            "&amp;",
            "&#x41;",
            "&#0;",
            "&bogus;",
            "<!DOCTYPE x [<!ENTITY e \"v\">]>",
            "<?xml version=\"1.0\"?>",
            "<!-- c -->",
            "<a/>",
            "1234567890123456789",
            " ",
            "\n",
            "<",
            ">",
            "&",
            "\u{1F600}",
            "<b x='1'>",
            "</b>",
        ];
        let paths: Vec<XmlPath> = ["MsgId", "/xml/MsgId", "/xml/b/MsgId", "a"]
            .iter()
            .map(|p| XmlPath::parse(p).expect("path"))
            .collect();
        let mut outcomes = [0usize; 4];
        for _ in 0..10_000 {
            let mut body: Vec<u8> = Vec::new();
            let n = (next() % 16) as usize;
            for _ in 0..n {
                let r = next();
                if r.is_multiple_of(5) {
                    body.push((r >> 8) as u8); // an arbitrary byte, often not UTF-8
                } else {
                    body.extend_from_slice(PIECES[(r >> 8) as usize % PIECES.len()].as_bytes());
                }
            }
            match extract(&body, &paths) {
                Ok(found) => {
                    assert_eq!(found.len(), paths.len());
                    outcomes[0] += 1;
                }
                Err(XmlError::Doctype) => outcomes[1] += 1,
                Err(XmlError::Malformed) => outcomes[2] += 1,
                Err(XmlError::NotUtf8) => outcomes[3] += 1,
            }
        }
        // The generator reaches every outcome (so the test exercises more than one path).
        assert!(outcomes.iter().all(|n| *n > 0), "{outcomes:?}");
    }
}
