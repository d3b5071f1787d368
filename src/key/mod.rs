//! Key extraction: which sources a route reads its message id from, how a request
//! yields one (or why it does not), and the stored key built from it.
//!
//! A new source is one variant of [`Source`] and, if it parses the body, one file here.

mod json;
pub mod xml;

use std::borrow::Cow;
use std::cell::Cell;
use std::fmt;
use std::sync::Arc;

use http::HeaderName;
use sha2::{Digest, Sha256};

pub use json::Pointer;
pub use xml::{XmlError, XmlPath};

/// What a key is derived from: the request head and its whole body.
#[derive(Clone, Copy)]
pub struct Input<'a> {
    pub head: &'a http::request::Parts,
    pub body: &'a [u8],
}

/// Why a source yielded no value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Miss {
    NotFound,
    Empty,
    NotJson,
    NotForm,
    NotUtf8,
    WrongType(&'static str),
    /// The body is XML that must not be parsed (a DOCTYPE): the request is refused.
    Xml(XmlError),
}

impl Miss {
    /// Whether this miss refuses the request instead of trying the next source.
    pub fn refuses(self) -> bool {
        matches!(self, Miss::Xml(XmlError::Doctype))
    }
}

impl fmt::Display for Miss {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            Miss::NotFound => f.write_str("not present"),
            Miss::Empty => f.write_str("empty"),
            Miss::NotJson => f.write_str("body is not valid JSON"),
            Miss::NotForm => f.write_str("body is not application/x-www-form-urlencoded"),
            Miss::NotUtf8 => f.write_str("not valid UTF-8"),
            Miss::WrongType(t) => write!(f, "is {t}, not a string or number"),
            Miss::Xml(e) => e.fmt(f),
        }
    }
}

/// One place a message id can be read from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    Json(Pointer),
    /// An element's text; `slot` is its place in the route's one-pass XML lookup.
    Xml {
        path: XmlPath,
        slot: usize,
    },
    Header(HeaderName),
    Query(String),
    Form(String),
    /// SHA-256 of the raw body, for senders without ids.
    Body,
}

impl Source {
    /// Parses one source, e.g. `json:/msgId` or `header:X-GitHub-Delivery`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let named = |rest: &str, what: &str| {
            if rest.is_empty() {
                Err(format!("{text:?}: missing the {what} name"))
            } else {
                Ok(rest.to_owned())
            }
        };
        if text == "body" {
            Ok(Source::Body)
        } else if let Some(pointer) = text.strip_prefix("json:") {
            Pointer::parse(pointer).map(Source::Json)
        } else if let Some(name) = text.strip_prefix("header:") {
            HeaderName::try_from(named(name, "header")?)
                .map(Source::Header)
                .map_err(|_| format!("{text:?}: invalid header name"))
        } else if let Some(name) = text.strip_prefix("query:") {
            named(name, "query parameter").map(Source::Query)
        } else if let Some(name) = text.strip_prefix("form:") {
            named(name, "form field").map(Source::Form)
        } else if let Some(path) = text.strip_prefix("xml:") {
            XmlPath::parse(path).map(|path| Source::Xml { path, slot: 0 })
        } else {
            Err(format!(
                "unknown source {text:?} (expected json:, xml:, header:, query:, form:, body)"
            ))
        }
    }

    fn extract<'a>(&self, doc: &mut Doc<'a, '_>) -> Result<Cow<'a, str>, Miss> {
        let input = doc.input;
        match self {
            Source::Json(pointer) => pointer.lookup(input.body),
            Source::Xml { slot, .. } => match doc.xml()?.get(*slot) {
                Some(xml::Found::Text(text)) => non_empty(text.clone()),
                Some(xml::Found::Children) => Err(Miss::WrongType("an element with child elements")),
                Some(xml::Found::Missing) | None => Err(Miss::NotFound),
            },
            Source::Header(name) => {
                let value = input.head.headers.get(name).ok_or(Miss::NotFound)?;
                non_empty(Cow::Borrowed(
                    std::str::from_utf8(value.as_bytes()).map_err(|_| Miss::NotUtf8)?,
                ))
            }
            Source::Query(name) => {
                let query = input.head.uri.query().ok_or(Miss::NotFound)?;
                field(query.as_bytes(), name)
            }
            Source::Form(name) => {
                if !is_form(input.head) {
                    return Err(Miss::NotForm);
                }
                field(input.body, name)
            }
            Source::Body if input.body.is_empty() => Err(Miss::Empty),
            Source::Body => Ok(Cow::Owned(hex::encode(Sha256::digest(input.body)))),
        }
    }
}

/// One request's input while its key is derived: the XML lookup runs at most once,
/// for every `xml:` path of the route together, when the first `xml:` source asks.
struct Doc<'a, 's> {
    input: Input<'a>,
    xml_paths: &'s [XmlPath],
    xml: Option<Result<Vec<xml::Found<'a>>, XmlError>>,
}

impl<'a> Doc<'a, '_> {
    fn xml(&mut self) -> Result<&[xml::Found<'a>], Miss> {
        let (body, paths) = (self.input.body, self.xml_paths);
        match self.xml.get_or_insert_with(|| xml::extract(body, paths)) {
            Ok(found) => Ok(found),
            Err(e) => Err(Miss::Xml(*e)),
        }
    }
}

fn non_empty(value: Cow<'_, str>) -> Result<Cow<'_, str>, Miss> {
    if value.is_empty() { Err(Miss::Empty) } else { Ok(value) }
}

/// The first `name=value` pair of a urlencoded string; `+` and `%xx` decoded.
fn field<'a>(encoded: &'a [u8], name: &str) -> Result<Cow<'a, str>, Miss> {
    form_urlencoded::parse(encoded)
        .find(|(k, _)| k == name)
        .map(|(_, v)| v)
        .ok_or(Miss::NotFound)
        .and_then(non_empty)
}

/// Whether the media type is a form's. Only the part before `;` counts: a parameter
/// with bytes beyond ASCII (which `to_str` refuses) does not make a form something else.
fn is_form(head: &http::request::Parts) -> bool {
    head.headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.as_bytes().split(|&b| b == b';').next())
        .is_some_and(|mime| {
            mime.trim_ascii()
                .eq_ignore_ascii_case(b"application/x-www-form-urlencoded")
        })
}

/// One entry of a route's `key` list: a source, or `a+b` parts joined by `+`. Every
/// part must yield a value, but for optional ones (`a+?b`): a `?b` that yields nothing
/// is left out, with its `+`. At least one part is required.
#[derive(Clone, Debug)]
pub struct Alternative {
    text: String,
    parts: Vec<Part>,
}

#[derive(Clone, Debug)]
struct Part {
    source: Source,
    optional: bool,
}

impl Alternative {
    pub fn parse(text: &str) -> Result<Self, String> {
        let parts = text
            .split('+')
            .map(|part| match part.strip_prefix('?') {
                Some(source) => Source::parse(source).map(|source| Part { source, optional: true }),
                None => Source::parse(part).map(|source| Part {
                    source,
                    optional: false,
                }),
            })
            .collect::<Result<Vec<_>, _>>()?;
        if parts.iter().all(|p| p.optional) {
            return Err(format!(
                "{text:?}: every part is optional (`?`); at least one must be required"
            ));
        }
        Ok(Alternative {
            text: text.to_owned(),
            parts,
        })
    }

    fn derive<'a>(&self, doc: &mut Doc<'a, '_>) -> Result<Cow<'a, str>, (usize, Miss)> {
        if let [single] = self.parts.as_slice() {
            return single.source.extract(doc).map_err(|miss| (0, miss));
        }
        let mut joined = String::new();
        for (i, part) in self.parts.iter().enumerate() {
            let value = match part.source.extract(doc) {
                Ok(value) => value,
                Err(miss) if part.optional && !miss.refuses() => continue,
                Err(miss) => return Err((i, miss)),
            };
            if !joined.is_empty() {
                joined.push('+');
            }
            joined.push_str(&value);
        }
        Ok(Cow::Owned(joined))
    }

    pub fn text(&self) -> &str {
        &self.text
    }
}

/// A body a route must not parse: XML with a DOCTYPE (answered 400, never expanded).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("XML body with a DOCTYPE or entity declaration")]
pub struct Refused;

/// A route's ordered key sources: the first one that yields a value wins.
#[derive(Clone, Debug)]
pub struct KeySpec {
    alternatives: Vec<Alternative>,
    /// Every distinct `xml:` path, looked up together in one pass.
    xml_paths: Vec<XmlPath>,
}

impl KeySpec {
    pub fn new(mut alternatives: Vec<Alternative>) -> Self {
        let mut xml_paths: Vec<XmlPath> = Vec::new();
        for part in alternatives.iter_mut().flat_map(|a| a.parts.iter_mut()) {
            if let Source::Xml { path, slot } = &mut part.source {
                *slot = match xml_paths.iter().position(|p| p == path) {
                    Some(i) => i,
                    None => {
                        xml_paths.push(path.clone());
                        xml_paths.len() - 1
                    }
                };
            }
        }
        KeySpec {
            alternatives,
            xml_paths,
        }
    }

    pub fn alternatives(&self) -> &[Alternative] {
        &self.alternatives
    }

    fn doc<'a>(&self, input: Input<'a>) -> Doc<'a, '_> {
        Doc {
            input,
            xml_paths: &self.xml_paths,
            xml: None,
        }
    }

    /// The message id of a request, if any source yields one; a body that must not be
    /// parsed refuses the request.
    pub fn derive<'a>(&self, input: Input<'a>) -> Result<Option<Cow<'a, str>>, Refused> {
        let mut doc = self.doc(input);
        for alt in &self.alternatives {
            match alt.derive(&mut doc) {
                Ok(value) => return Ok(Some(value)),
                Err((_, miss)) if miss.refuses() => return Err(Refused),
                Err(_) => {}
            }
        }
        Ok(None)
    }

    /// Like [`KeySpec::derive`], naming the source that won, and saying why each one
    /// before it yielded nothing (a refused body's reason ends the list).
    pub fn explain<'a>(&self, input: Input<'a>) -> (Result<Option<Winner<'_, 'a>>, Refused>, Vec<String>) {
        let mut doc = self.doc(input);
        let mut misses = Vec::new();
        for alt in &self.alternatives {
            match alt.derive(&mut doc) {
                Ok(value) => return (Ok(Some((alt.text(), value))), misses),
                Err((_, miss)) if miss.refuses() => {
                    misses.push(format!("{}: {miss}", alt.text));
                    return (Err(Refused), misses);
                }
                Err((i, miss)) if alt.parts.len() > 1 => misses.push(format!("{}: part {} {miss}", alt.text, i + 1)),
                Err((_, miss)) => misses.push(format!("{}: {miss}", alt.text)),
            }
        }
        (Ok(None), misses)
    }
}

/// The source that yielded a message id (as written in the config), and the id.
pub type Winner<'s, 'a> = (&'s str, Cow<'a, str>);

/// The longest message id stored as written; longer ones are hashed.
const MAX_PLAIN_LEN: usize = 128;

/// What a hashed id is stored as: this prefix, then the SHA-256 digest in hex.
const HASHED_PREFIX: &str = "sha256:";
const HASHED_LEN: usize = HASHED_PREFIX.len() + 2 * 32;

/// `<prefix><route>:<value>`, with the value replaced by `sha256:<hex>` when it is long
/// or holds bytes a store key should not (space, control, non-ASCII, or `{`/`}` which
/// would let a sender choose a Redis Cluster slot).
pub fn stored_key(prefix: &str, route: &str, value: &str) -> Arc<str> {
    StoredKey::new(prefix, route, value).shared()
}

/// A [`stored_key`] on the request path, written into a per-thread buffer that it holds
/// until dropped (then the thread's next key reuses it). A request answered at once (a
/// duplicate the memory store recognises) allocates nothing for its key; the owner
/// task and a log line keep [`StoredKey::shared`], one allocation.
pub struct StoredKey(String);

thread_local! {
    /// Empty while a [`StoredKey`] holds it: a key made meanwhile gets its own.
    static BUF: Cell<String> = const { Cell::new(String::new()) };
}

impl StoredKey {
    pub fn new(prefix: &str, route: &str, value: &str) -> Self {
        let plain = value.len() <= MAX_PLAIN_LEN
            && value
                .bytes()
                .all(|b| (0x21..=0x7e).contains(&b) && b != b'{' && b != b'}');
        let mut key = BUF.take();
        key.clear();
        key.reserve(prefix.len() + route.len() + 1 + if plain { value.len() } else { HASHED_LEN });
        key.push_str(prefix);
        key.push_str(route);
        key.push(':');
        if plain {
            key.push_str(value);
        } else {
            let mut hex = [0u8; 64];
            // 32 digest bytes always fit 64 hex digits.
            let _ = hex::encode_to_slice(Sha256::digest(value.as_bytes()), &mut hex);
            key.push_str(HASHED_PREFIX);
            key.push_str(std::str::from_utf8(&hex).unwrap_or_default());
        }
        StoredKey(key)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key to keep beyond this request's own steps.
    pub fn shared(&self) -> Arc<str> {
        Arc::from(self.0.as_str())
    }
}

impl Drop for StoredKey {
    fn drop(&mut self) {
        // `try_with`: a key dropped while its thread exits finds no buffer.
        let _ = BUF.try_with(|buf| buf.set(std::mem::take(&mut self.0)));
    }
}

#[cfg(test)]
mod tests;
