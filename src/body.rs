//! The one body type that flows through the gateway, in both directions, and the
//! limited read of a request body.
//!
//! An enum instead of a boxed body: the proxy sits on every webhook, so the hot path
//! avoids a heap allocation per message just to erase a type. Only an upstream answer
//! longer than what came with its head is boxed ([`Streaming`]).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body as _, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;

/// An upstream response body still arriving on its connection (the upstream client's,
/// [`crate::upstream::client`]). Boxed behind this trait, so that this type does not
/// depend on the client that makes it.
pub type Streaming = Pin<Box<dyn http_body::Body<Data = Bytes, Error = std::io::Error> + Send + Sync>>;

/// A request or response body: buffered bytes, a stream from a sender, an upstream
/// response still arriving, or one whose first chunks were already read (a `replay`
/// response too large to store).
pub enum Body {
    Full(Option<Bytes>),
    Incoming(Incoming),
    /// Only responses longer than what came with their head stream.
    Upstream(Streaming),
    Prefixed {
        head: std::vec::IntoIter<Bytes>,
        rest: Streaming,
    },
}

impl std::fmt::Debug for Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Body::Full(bytes) => f.debug_tuple("Full").field(bytes).finish(),
            Body::Incoming(incoming) => f.debug_tuple("Incoming").field(incoming).finish(),
            Body::Upstream(_) => f.write_str("Upstream(..)"),
            Body::Prefixed { head, .. } => f.debug_struct("Prefixed").field("head", head).finish_non_exhaustive(),
        }
    }
}

/// Why a body broke: on the sender's side (hyper) or the upstream's ([`crate::upstream`]).
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error(transparent)]
    Sender(#[from] hyper::Error),
    #[error("upstream body: {0}")]
    Upstream(#[from] std::io::Error),
}

impl Body {
    pub fn empty() -> Self {
        Body::Full(None)
    }

    /// An upstream answer still arriving (see [`Streaming`]).
    pub fn upstream(body: impl http_body::Body<Data = Bytes, Error = std::io::Error> + Send + Sync + 'static) -> Self {
        Body::Upstream(Box::pin(body))
    }

    pub fn full(bytes: impl Into<Bytes>) -> Self {
        let bytes = bytes.into();
        Body::Full((!bytes.is_empty()).then_some(bytes))
    }
}

impl From<Incoming> for Body {
    fn from(incoming: Incoming) -> Self {
        Body::Incoming(incoming)
    }
}

impl http_body::Body for Body {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match self.get_mut() {
            Body::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            Body::Incoming(incoming) => from(Pin::new(incoming).poll_frame(cx)),
            Body::Upstream(streaming) => from(streaming.as_mut().poll_frame(cx)),
            Body::Prefixed { head, rest } => match head.next() {
                Some(chunk) => Poll::Ready(Some(Ok(Frame::data(chunk)))),
                None => from(rest.as_mut().poll_frame(cx)),
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Body::Full(bytes) => bytes.is_none(),
            Body::Incoming(incoming) => incoming.is_end_stream(),
            Body::Upstream(streaming) => streaming.is_end_stream(),
            Body::Prefixed { head, rest } => head.len() == 0 && rest.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Body::Full(bytes) => SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64)),
            Body::Incoming(incoming) => incoming.size_hint(),
            Body::Upstream(streaming) => streaming.size_hint(),
            Body::Prefixed { head, rest } => {
                let buffered: u64 = head.as_slice().iter().map(|b| b.len() as u64).sum();
                let rest = rest.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(buffered + rest.lower());
                if let Some(upper) = rest.upper() {
                    hint.set_upper(buffered + upper);
                }
                hint
            }
        }
    }
}

/// A polled frame with its error made a [`BodyError`].
fn from<E: Into<BodyError>>(
    polled: Poll<Option<Result<Frame<Bytes>, E>>>,
) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
    polled.map(|frame| frame.map(|frame| frame.map_err(Into::into)))
}

/// Why a limited read ended without a body.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("body exceeds {limit} bytes")]
    TooLarge { limit: u64 },
    #[error("reading the body failed: {0}")]
    Broken(#[source] hyper::Error),
}

/// Reads a whole body, refusing one longer than `limit` bytes whether it announces its
/// length or arrives chunked (a `size_hint` check alone would miss chunked bodies).
pub async fn read_limited(mut body: Incoming, limit: u64) -> Result<Bytes, ReadError> {
    if body.size_hint().lower() > limit {
        return Err(ReadError::TooLarge { limit });
    }
    let mut first: Option<Bytes> = None;
    let mut rest: Vec<u8> = Vec::new();
    let mut total: u64 = 0;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(ReadError::Broken)?.into_data() else {
            continue; // trailers carry nothing we forward or key on
        };
        total += data.len() as u64;
        if total > limit {
            return Err(ReadError::TooLarge { limit });
        }
        // The common case is one chunk: keep it without copying.
        match &first {
            None if rest.is_empty() => first = Some(data),
            _ => {
                if let Some(chunk) = first.take() {
                    // Several chunks: size the buffer once for the announced length.
                    rest.reserve(body.size_hint().lower().min(limit) as usize + chunk.len());
                    rest.extend_from_slice(&chunk);
                }
                rest.extend_from_slice(&data);
            }
        }
    }
    Ok(first.unwrap_or_else(|| Bytes::from(rest)))
}

/// Reads at most `limit` bytes of a body. `Ok(Ok(bytes))` when the whole body fit, in
/// one allocation of its own sized exactly (so it may be stored: nothing of the
/// connection's read buffer stays pinned by it); `Ok(Err(body))` when it did not, with a
/// body that still yields every byte.
pub async fn read_up_to(body: Body, limit: usize) -> Result<Result<Bytes, Body>, std::io::Error> {
    let mut body = match body {
        // Read with its head: copied, so the stored bytes do not pin the read buffer.
        Body::Full(Some(bytes)) if bytes.len() <= limit => return Ok(Ok(Bytes::copy_from_slice(&bytes))),
        Body::Full(None) => return Ok(Ok(Bytes::new())),
        Body::Upstream(streaming) => streaming,
        other => return Ok(Err(other)),
    };
    // Copied chunk by chunk as it arrives, so the chunks (slices of the connection's
    // read buffer) are let go at once and the buffer is reused.
    let mut bytes = Vec::with_capacity(usize::try_from(body.size_hint().lower()).unwrap_or(limit).min(limit));
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        if bytes.len() + data.len() > limit {
            return Ok(Err(Body::Prefixed {
                head: vec![Bytes::from(bytes), data].into_iter(),
                rest: body,
            }));
        }
        bytes.extend_from_slice(&data);
    }
    bytes.shrink_to_fit();
    Ok(Ok(Bytes::from(bytes)))
}
