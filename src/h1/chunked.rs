//! The chunked transfer coding (RFC 9112 section 7.1), decoded as hyper's decoder
//! decodes it (`proto/h1/decode.rs`, `ChunkedState::step`): the same states, the same
//! limits on extensions and trailers, the same bytes refused. The inbound guard uses it
//! to follow a request body as hyper will read it; the upstream client uses it to read
//! a response body. It only frames: the caller takes the data bytes it points at.

use super::{CHUNK_EXTENSIONS_LIMIT, Invalid, MAX_HEADERS, TRAILER_LIMIT};

/// Where a chunked body's decoder stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunked {
    state: State,
    /// The chunk size being read, then the chunk bytes left.
    size: u64,
    /// Extension bytes seen in this body.
    extensions: u64,
    /// The trailer section as hyper buffers it (`None` until its first byte), to be
    /// parsed at the end of the body as hyper parses it: rare, and at most
    /// [`TRAILER_LIMIT`] bytes.
    trailer: Option<Vec<u8>>,
    trailers: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Start,
    Size,
    SizeLws,
    Extension,
    SizeLf,
    Body,
    BodyCr,
    BodyLf,
    Trailer,
    TrailerLf,
    EndCr,
    EndLf,
}

/// What the bytes at the front of the input are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Piece {
    /// This many bytes of chunk data (at least one).
    Data(usize),
    /// This many bytes of framing, all consumed (0 only for empty input).
    Framing(usize),
    /// This many bytes of framing, and the body ended with the last of them.
    End(usize),
}

impl Default for Chunked {
    fn default() -> Self {
        Self::new()
    }
}

impl Chunked {
    pub fn new() -> Self {
        Chunked {
            state: State::Start,
            size: 0,
            extensions: 0,
            trailer: None,
            trailers: 0,
        }
    }

    /// Reads the front of `input`: the chunk data there (which the caller takes), or
    /// the framing up to the next data, the end of the body, or the end of `input`.
    pub fn advance(&mut self, input: &[u8]) -> Result<Piece, Invalid> {
        if self.state == State::Body {
            if input.is_empty() {
                return Ok(Piece::Framing(0));
            }
            let n = usize::try_from(self.size).unwrap_or(usize::MAX).min(input.len());
            self.size -= n as u64;
            if self.size == 0 {
                self.state = State::BodyCr;
            }
            return Ok(Piece::Data(n));
        }
        for (i, &b) in input.iter().enumerate() {
            if self.step(b)? {
                self.check_trailers()?;
                return Ok(Piece::End(i + 1));
            }
            if self.state == State::Body {
                return Ok(Piece::Framing(i + 1));
            }
        }
        Ok(Piece::Framing(input.len()))
    }

    /// Whether the decoder is inside a chunk's data (where the guard skips by length).
    pub fn in_data(&self) -> bool {
        self.state == State::Body
    }

    /// One byte outside chunk data, as hyper's `ChunkedState::step`: `true` at the end
    /// of the body.
    fn step(&mut self, b: u8) -> Result<bool, Invalid> {
        use State::*;
        self.state = match (self.state, b) {
            (Start | Size, _) if hex(b).is_some() => {
                let digit = u64::from(hex(b).unwrap_or_default());
                self.size = self
                    .size
                    .checked_mul(16)
                    .and_then(|n| n.checked_add(digit))
                    .ok_or(Invalid("chunk size overflows"))?;
                Size
            }
            (Size | SizeLws, b'\t' | b' ') => SizeLws,
            (Size | SizeLws, b';') => Extension,
            (Size | SizeLws | Extension, b'\r') => SizeLf,
            (Extension, b'\n') => return Err(Invalid("chunk extension ends without CR")),
            (Extension, _) => {
                self.extensions += 1;
                if self.extensions >= CHUNK_EXTENSIONS_LIMIT {
                    return Err(Invalid("chunk extensions too long"));
                }
                Extension
            }
            (SizeLf, b'\n') if self.size == 0 => EndCr,
            (SizeLf, b'\n') => Body,
            (BodyCr, b'\r') => BodyLf,
            (BodyLf, b'\n') => Start,
            (Trailer, _) => {
                self.trailer_byte(b)?;
                if b == b'\r' { TrailerLf } else { Trailer }
            }
            (TrailerLf, b'\n') => {
                if self.trailers >= MAX_HEADERS {
                    return Err(Invalid("too many trailer fields"));
                }
                self.trailers += 1;
                self.trailer_byte(b)?;
                EndCr
            }
            (EndCr, b'\r') => {
                if self.trailer.is_some() {
                    self.trailer_byte(b)?;
                }
                EndLf
            }
            (EndCr, _) => {
                match &mut self.trailer {
                    None => self.trailer = Some(vec![b]),
                    Some(_) => self.trailer_byte(b)?,
                }
                Trailer
            }
            (EndLf, b'\n') => {
                if self.trailer.is_some() {
                    self.trailer_byte(b)?;
                }
                return Ok(true);
            }
            (Start, _) => return Err(Invalid("bad chunk size")),
            (Size | SizeLws, _) => return Err(Invalid("bad chunk size line")),
            (SizeLf, _) => return Err(Invalid("chunk size line not ended by CRLF")),
            (BodyCr | BodyLf, _) => return Err(Invalid("chunk data not followed by CRLF")),
            (TrailerLf | EndLf, _) => return Err(Invalid("trailer line not ended by CRLF")),
            (Body, _) => return Err(Invalid("chunk data read as framing")),
        };
        Ok(false)
    }

    /// Keeps a trailer byte hyper buffers, failing at its limit as hyper does.
    fn trailer_byte(&mut self, b: u8) -> Result<(), Invalid> {
        let trailer = self.trailer.get_or_insert_with(Vec::new);
        trailer.push(b);
        if trailer.len() >= TRAILER_LIMIT {
            Err(Invalid("trailers too large"))
        } else {
            Ok(())
        }
    }

    /// At the end of the body: the trailer section must parse as hyper's
    /// `decode_trailers` parses it (httparse, then every name and value), or hyper fails
    /// the body. The fields themselves are dropped: trailers are not passed on.
    fn check_trailers(&mut self) -> Result<(), Invalid> {
        let Some(trailer) = self.trailer.take() else {
            return Ok(());
        };
        let mut fields = vec![httparse::EMPTY_HEADER; self.trailers];
        match httparse::parse_headers(&trailer, &mut fields) {
            Ok(httparse::Status::Complete((_, fields)))
                if fields.iter().all(|f| {
                    http::HeaderName::from_bytes(f.name.as_bytes()).is_ok()
                        && http::HeaderValue::from_bytes(f.value).is_ok()
                }) =>
            {
                Ok(())
            }
            _ => Err(Invalid("bad trailer field")),
        }
    }
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes `input` fed in pieces of `step` bytes: the data, and whether it ended.
    fn decode(input: &[u8], step: usize) -> Result<(Vec<u8>, bool), Invalid> {
        let (mut chunked, mut out) = (Chunked::new(), Vec::new());
        for piece in input.chunks(step.max(1)) {
            let mut at = 0;
            while at < piece.len() {
                match chunked.advance(&piece[at..])? {
                    Piece::Data(n) => {
                        out.extend_from_slice(&piece[at..at + n]);
                        at += n;
                    }
                    Piece::Framing(n) => at += n,
                    Piece::End(n) => {
                        assert_eq!(at + n, piece.len(), "nothing after the end here");
                        return Ok((out, true));
                    }
                }
            }
        }
        Ok((out, false))
    }

    #[test]
    fn bodies_decode_whatever_the_split() {
        let wire = b"5;ext=1\r\nhello\r\n01A\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nx-trailer: t\r\n\r\n";
        for step in 1..=wire.len() {
            let (out, ended) = decode(wire, step).expect("valid");
            assert!(ended, "step {step}");
            assert_eq!(out, b"helloabcdefghijklmnopqrstuvwxyz", "step {step}");
        }
        assert_eq!(decode(b"3\r\nab", 64), Ok((b"ab".to_vec(), false)));
    }

    #[test]
    fn malformed_chunks_are_refused_not_read_as_data() {
        for wire in [
            &b"zz\r\nhi\r\n"[..],
            b"2\r\nhiX\r\n",
            b"2\nhi",
            b"fffffffffffffffff\r\n",
            b"1;a\n",
        ] {
            assert!(decode(wire, 64).is_err(), "{:?}", String::from_utf8_lossy(wire));
        }
    }

    #[test]
    fn trailers_are_parsed_as_hyper_parses_them() {
        assert_eq!(decode(b"0\r\nX-T: 1\r\nY: 2\r\n\r\n", 3).map(|(_, end)| end), Ok(true));
        for bad in [
            &b"0\r\nX(T: 1\r\n\r\n"[..],
            b"0\r\nno colon\r\n\r\n",
            b"0\r\nX: a\x7fb\r\n\r\n",
        ] {
            assert_eq!(
                decode(bad, 64),
                Err(Invalid("bad trailer field")),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn hypers_limits_hold() {
        let extensions = format!("1;{}\r\na\r\n0\r\n\r\n", "e".repeat(CHUNK_EXTENSIONS_LIMIT as usize));
        assert_eq!(
            decode(extensions.as_bytes(), 4096),
            Err(Invalid("chunk extensions too long"))
        );
        let trailers = format!("0\r\nx: {}\r\n\r\n", "t".repeat(TRAILER_LIMIT));
        assert_eq!(decode(trailers.as_bytes(), 4096), Err(Invalid("trailers too large")));
        let many = format!("0\r\n{}\r\n", "a: b\r\n".repeat(MAX_HEADERS + 1));
        assert_eq!(decode(many.as_bytes(), 4096), Err(Invalid("too many trailer fields")));
    }
}
