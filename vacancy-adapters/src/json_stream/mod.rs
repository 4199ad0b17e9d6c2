//! A streaming JSON scanner: bytes pushed chunk by chunk as they arrive,
//! structure events handed to a sink that keeps only the few values it wants,
//! in O(nesting depth + longest kept string) memory; and the bounded read
//! ([`read_body_since`], [`get_scanned`]) that feeds a reply into it within size
//! and time limits ([`ReadLimits`]).
//!
//! ComfyUI's `/queue` and `/history/<id>` scans (`comfyui::stream`) are
//! built on it: a `/queue` reply can be hundreds of MiB, so vacancyd never
//! collects it (COMFY-30..35).
//!
//! # Why a hand-written scanner
//!
//! The push-style incremental JSON parsers on crates.io do not fit the memory
//! rule. `actson` (the closest: a push feeder plus events) accumulates every
//! string and number of the document in full before it reports it, so a
//! multi-MiB prompt text inside a workflow would be buffered although we never
//! keep it; `struson` and `serde_json`'s `StreamDeserializer` pull from a
//! blocking `std::io::Read`, which a chunk that arrives on an async body cannot
//! feed without buffering the rest of the reply or blocking a thread. The
//! scanner below understands just enough JSON (strings with all escapes,
//! nesting, numbers, literals) to find the few values it keeps, in
//! O(nesting depth + longest kept string) memory; a string it does not keep is
//! validated (escapes, control characters) and dropped as it passes.

mod read;

pub use read::{ReadError, ReadLimits, StreamFetchError, get_scanned, read_body_since};

/// What a scan does next, as a visitor or the scanner answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Read on.
    Continue,
    /// The answer is known: stop reading the reply now.
    Stop,
}

/// Why a reply could not be scanned: it is not the JSON it should be.
///
/// # Behavior
///
/// Every variant is a failed read, never "absent" or "not found": a
/// malformed or truncated reply never counts as a prompt that left the queue
/// or completed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScanError {
    /// A byte that cannot appear there in JSON.
    #[error("not JSON at byte {at}: {what}")]
    Syntax {
        /// The offset of the byte in the reply.
        at: u64,
        /// What was wrong.
        what: &'static str,
    },
    /// The reply ended before its JSON value did.
    #[error("the reply ended at byte {at} inside its JSON value")]
    Truncated {
        /// The reply's length.
        at: u64,
    },
    /// Containers nested deeper than [`MAX_DEPTH`].
    #[error("JSON nested deeper than {MAX_DEPTH} levels at byte {at}")]
    TooDeep {
        /// The offset of the opening bracket.
        at: u64,
    },
    /// Valid JSON, but not shaped as ComfyUI answers.
    #[error("unexpected reply at byte {at}: {what}")]
    Shape {
        /// The offset where the scanner noticed.
        at: u64,
        /// What was expected.
        what: String,
    },
    /// Bytes were fed after the scan had stopped or failed.
    #[error("the scan already ended")]
    Ended,
}

/// The deepest nesting of objects and arrays a reply may have.
///
/// # Behavior
///
/// ComfyUI's replies nest about 8 levels (queue, item, workflow, node,
/// inputs, link); a deeper reply is [`ScanError::TooDeep`], which bounds the
/// scanner's stack.
pub const MAX_DEPTH: usize = 256;

/// The longest string (in bytes, after unescaping) the scanner keeps.
///
/// # Behavior
///
/// Keys, prompt IDs and `status_str` are far shorter. A longer string is
/// reported as [`JsonStr::Overlong`], and its bytes are never buffered. A
/// history scan for a longer ID keeps strings up to that ID's length.
pub const MAX_KEPT_BYTES: usize = 1024;

/// A string the scanner met: its text when short enough to keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JsonStr<'a> {
    /// The unescaped text.
    Kept(&'a str),
    /// Longer than the scanner keeps (see [`MAX_KEPT_BYTES`]); never equal to
    /// an ID vacancy issued.
    Overlong,
}

impl JsonStr<'_> {
    /// The text, `None` when the string was too long to keep.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            JsonStr::Kept(s) => Some(s),
            JsonStr::Overlong => None,
        }
    }
}

/// An incremental scanner: fed each chunk of a reply as it arrives.
///
/// # Behavior
///
/// - [`Scanner::feed`] takes the next bytes; [`Flow::Stop`] means the answer
///   is known and the rest of the reply need not be read.
/// - [`Scanner::finish`] gives the answer. After a stop it is the answer
///   found; otherwise it checks that the reply was one complete JSON value
///   (else [`ScanError::Truncated`]) of the expected shape.
pub trait Scanner {
    /// What the scan finds.
    type Output;
    /// Scans the next bytes of the reply.
    fn feed(&mut self, chunk: &[u8]) -> Result<Flow, ScanError>;
    /// The answer, after the last chunk or a [`Flow::Stop`].
    fn finish(self) -> Result<Self::Output, ScanError>;
}

// ---------------------------------------------------------------------------
// The JSON lexer: structure events, nothing kept but the current short string.
// ---------------------------------------------------------------------------

/// One structural event. `depth` (passed beside it) is the number of
/// containers open around the token: the top-level value is at depth 0, a key
/// or value of the top-level object at depth 1; an `End` has the depth of its
/// `Begin`.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Event<'a> {
    BeginObject,
    BeginArray,
    End,
    Key(JsonStr<'a>),
    String(JsonStr<'a>),
    /// A number (including Python's `NaN`, `Infinity`, `-Infinity`).
    Number,
    Bool(bool),
    Null,
}

impl Event<'_> {
    pub(crate) fn is_value(&self) -> bool {
        !matches!(self, Event::End | Event::Key(_))
    }
}

/// A sink's complaint about the reply's shape.
pub(crate) type ShapeResult = Result<Flow, String>;

pub(crate) trait Sink {
    /// One structural event at `depth`.
    fn event(&mut self, depth: usize, event: Event<'_>) -> ShapeResult;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// A value (top level, after `:` or after `,` in an array).
    Value,
    /// A value or `]` (right after `[`).
    ValueOrEnd,
    /// A key or `}` (right after `{`).
    KeyOrEnd,
    /// A key (after `,` in an object).
    Key,
    Colon,
    CommaOrEnd,
    /// Only whitespace: the top-level value is complete.
    Eof,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Esc {
    None,
    Backslash,
    Hex { n: u8, code: u16 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Num {
    Minus,
    Zero,
    Int,
    Dot,
    Frac,
    E,
    ESign,
    Exp,
}

impl Num {
    fn complete(self) -> bool {
        matches!(self, Num::Zero | Num::Int | Num::Frac | Num::Exp)
    }

    fn next(self, b: u8) -> Option<Num> {
        Some(match (self, b) {
            (Num::Minus, b'0') => Num::Zero,
            (Num::Minus, b'1'..=b'9') => Num::Int,
            (Num::Int, b'0'..=b'9') => Num::Int,
            (Num::Zero | Num::Int, b'.') => Num::Dot,
            (Num::Zero | Num::Int | Num::Frac, b'e' | b'E') => Num::E,
            (Num::Dot | Num::Frac, b'0'..=b'9') => Num::Frac,
            (Num::E, b'+' | b'-') => Num::ESign,
            (Num::E | Num::ESign | Num::Exp, b'0'..=b'9') => Num::Exp,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token {
    None,
    Str { key: bool, esc: Esc },
    Num(Num),
    Lit { text: &'static [u8], at: usize },
}

const OBJECT: bool = true;
const ARRAY: bool = false;

/// The push lexer. Memory: the container stack (one byte per level, at most
/// [`MAX_DEPTH`]) and the current string while it is short enough to keep.
#[derive(Debug)]
struct Lexer {
    /// `OBJECT` or `ARRAY` per open container.
    stack: Vec<bool>,
    expect: Expect,
    token: Token,
    /// The current string, unescaped, while it is at most `keep` bytes.
    buf: Vec<u8>,
    overlong: bool,
    keep: usize,
    /// A high surrogate from `\uD8xx` waiting for its low half.
    high: Option<u16>,
    /// Bytes consumed before the current chunk.
    offset: u64,
}

/// Which literal a first byte starts, and what it reports.
fn literal(first: u8) -> Option<&'static [u8]> {
    Some(match first {
        b't' => b"true",
        b'f' => b"false",
        b'n' => b"null",
        // Python's json.dumps writes these for float NaN and infinities
        // (allow_nan defaults to true), and ComfyUI echoes workflow inputs
        // verbatim: refusing them would let one prompt break every queue read.
        b'N' => b"NaN",
        b'I' => b"Infinity",
        _ => return None,
    })
}

/// How many leading bytes of `bytes` are plain string content: neither a
/// quote, a backslash nor a control character.
///
/// # Behavior
///
/// Eight bytes at a time while no word can hold such a byte (the classic
/// "has a byte less than n / equal to v" word tests: no false negatives,
/// rare false positives), then byte by byte: most of a queue reply is
/// workflow text, so this loop is the scan's throughput.
fn plain_prefix(bytes: &[u8]) -> usize {
    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;
    const QUOTES: u64 = LO * b'"' as u64;
    const BACKSLASHES: u64 = LO * b'\\' as u64;
    const SPACES: u64 = LO * 0x20;
    let mut at = 0;
    for word in bytes.chunks_exact(8) {
        let Ok(word) = <[u8; 8]>::try_from(word) else {
            break;
        };
        let w = u64::from_le_bytes(word);
        let q = w ^ QUOTES;
        let b = w ^ BACKSLASHES;
        let hit =
            (q.wrapping_sub(LO) & !q) | (b.wrapping_sub(LO) & !b) | (w.wrapping_sub(SPACES) & !w);
        if hit & HI != 0 {
            break;
        }
        at += 8;
    }
    at + bytes[at..]
        .iter()
        .position(|&b| b == b'"' || b == b'\\' || b < 0x20)
        .unwrap_or(bytes.len() - at)
}

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

impl Lexer {
    fn new(keep: usize) -> Self {
        Lexer {
            stack: Vec::new(),
            expect: Expect::Value,
            token: Token::None,
            buf: Vec::new(),
            overlong: false,
            keep,
            high: None,
            offset: 0,
        }
    }

    fn syntax(&self, i: usize, what: &'static str) -> ScanError {
        ScanError::Syntax {
            at: self.offset + i as u64,
            what,
        }
    }

    fn emit(
        &self,
        sink: &mut impl Sink,
        i: usize,
        depth: usize,
        event: Event<'_>,
    ) -> Result<Flow, ScanError> {
        sink.event(depth, event).map_err(|what| ScanError::Shape {
            at: self.offset + i as u64,
            what,
        })
    }

    /// A scalar or a container just ended: what comes next.
    fn value_done(&mut self) {
        self.expect = if self.stack.is_empty() {
            Expect::Eof
        } else {
            Expect::CommaOrEnd
        };
    }

    fn keep_bytes(&mut self, bytes: &[u8]) {
        if self.overlong || bytes.is_empty() {
            return;
        }
        if self.buf.len() + bytes.len() > self.keep {
            self.overlong = true;
            self.buf.clear();
        } else {
            self.buf.extend_from_slice(bytes);
        }
    }

    fn keep_char(&mut self, c: char) {
        let mut tmp = [0u8; 4];
        let encoded = c.encode_utf8(&mut tmp).as_bytes();
        self.keep_bytes(encoded);
    }

    /// A lone high surrogate followed by something else becomes U+FFFD, as
    /// Python and browsers decode it (a reply never fails over one).
    fn flush_high(&mut self) {
        if self.high.take().is_some() {
            self.keep_char(char::REPLACEMENT_CHARACTER);
        }
    }

    fn unicode_escape(&mut self, code: u16) {
        if let Some(high) = self.high.take() {
            if (0xDC00..0xE000).contains(&code) {
                let c = 0x10000 + ((u32::from(high) - 0xD800) << 10) + (u32::from(code) - 0xDC00);
                self.keep_char(char::from_u32(c).unwrap_or(char::REPLACEMENT_CHARACTER));
                return;
            }
            self.keep_char(char::REPLACEMENT_CHARACTER);
        }
        if (0xD800..0xDC00).contains(&code) {
            self.high = Some(code);
        } else {
            self.keep_char(char::from_u32(u32::from(code)).unwrap_or(char::REPLACEMENT_CHARACTER));
        }
    }

    /// Scans `chunk`, reporting events to `sink`; stops at the first
    /// [`Flow::Stop`].
    fn feed(&mut self, chunk: &[u8], sink: &mut impl Sink) -> Result<Flow, ScanError> {
        let flow = self.feed_inner(chunk, sink);
        self.offset += chunk.len() as u64;
        flow
    }

    /// Scans `chunk` byte by byte (plain string bytes a word at a time),
    /// each byte handed to the step for the token it is in.
    fn feed_inner(&mut self, chunk: &[u8], sink: &mut impl Sink) -> Result<Flow, ScanError> {
        let mut i = 0;
        while i < chunk.len() {
            let b = chunk[i];
            let (used, flow) = match self.token {
                Token::Str {
                    key,
                    esc: Esc::None,
                } => self.string_bytes(key, &chunk[i..], i, sink)?,
                Token::Str {
                    key,
                    esc: Esc::Backslash,
                } => (self.escape(key, b, i)?, Flow::Continue),
                Token::Str {
                    key,
                    esc: Esc::Hex { n, code },
                } => (self.hex_digit(key, n, code, b, i)?, Flow::Continue),
                Token::Num(state) => self.number_byte(state, b, i, sink)?,
                Token::Lit { text, at } => self.literal_byte(text, at, b, i, sink)?,
                Token::None if is_ws(b) => (1, Flow::Continue),
                Token::None => (1, self.structure(b, i, sink)?),
            };
            if flow == Flow::Stop {
                return Ok(Flow::Stop);
            }
            i += used;
        }
        Ok(Flow::Continue)
    }

    /// Inside a string, no escape pending: `rest` starts at byte `i` of the
    /// chunk. Gives the bytes used and the sink's answer at the closing quote.
    fn string_bytes(
        &mut self,
        key: bool,
        rest: &[u8],
        i: usize,
        sink: &mut impl Sink,
    ) -> Result<(usize, Flow), ScanError> {
        // The hot loop: skip to the next quote, backslash or control byte.
        let n = plain_prefix(rest);
        if n > 0 {
            self.flush_high();
            self.keep_bytes(&rest[..n]);
            return Ok((n, Flow::Continue));
        }
        let b = rest[0];
        if b == b'\\' {
            self.token = Token::Str {
                key,
                esc: Esc::Backslash,
            };
            return Ok((1, Flow::Continue));
        }
        if b < 0x20 {
            return Err(self.syntax(i, "a control character inside a string"));
        }
        // The closing quote.
        self.flush_high();
        self.token = Token::None;
        let text = if self.overlong {
            JsonStr::Overlong
        } else {
            JsonStr::Kept(
                std::str::from_utf8(&self.buf)
                    .map_err(|_| self.syntax(i, "a string that is not UTF-8"))?,
            )
        };
        let depth = self.stack.len();
        let flow = if key {
            self.expect = Expect::Colon;
            self.emit(sink, i, depth, Event::Key(text))?
        } else {
            let flow = self.emit(sink, i, depth, Event::String(text))?;
            self.value_done();
            flow
        };
        self.buf.clear();
        self.overlong = false;
        Ok((1, flow))
    }

    /// The byte after a backslash in a string.
    fn escape(&mut self, key: bool, b: u8, i: usize) -> Result<usize, ScanError> {
        let simple = match b {
            b'"' | b'\\' | b'/' => Some(b),
            b'b' => Some(0x08),
            b'f' => Some(0x0c),
            b'n' => Some(b'\n'),
            b'r' => Some(b'\r'),
            b't' => Some(b'\t'),
            b'u' => None,
            _ => return Err(self.syntax(i, "an unknown escape in a string")),
        };
        let esc = match simple {
            Some(c) => {
                self.flush_high();
                self.keep_bytes(&[c]);
                Esc::None
            }
            None => Esc::Hex { n: 0, code: 0 },
        };
        self.token = Token::Str { key, esc };
        Ok(1)
    }

    /// One hex digit of a `\\u` escape, `n` digits read so far.
    fn hex_digit(
        &mut self,
        key: bool,
        n: u8,
        code: u16,
        b: u8,
        i: usize,
    ) -> Result<usize, ScanError> {
        let digit = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            b'A'..=b'F' => b - b'A' + 10,
            _ => return Err(self.syntax(i, "a \\u escape without 4 hex digits")),
        };
        let code = (code << 4) | u16::from(digit);
        let esc = if n == 3 {
            self.unicode_escape(code);
            Esc::None
        } else {
            Esc::Hex { n: n + 1, code }
        };
        self.token = Token::Str { key, esc };
        Ok(1)
    }

    /// A byte inside or just after a number; the byte after it is not used
    /// here (it is scanned again as structure).
    fn number_byte(
        &mut self,
        state: Num,
        b: u8,
        i: usize,
        sink: &mut impl Sink,
    ) -> Result<(usize, Flow), ScanError> {
        if let Some(next) = state.next(b) {
            self.token = Token::Num(next);
            return Ok((1, Flow::Continue));
        }
        if state == Num::Minus && b == b'I' {
            self.token = Token::Lit {
                text: b"Infinity",
                at: 1,
            };
            return Ok((1, Flow::Continue));
        }
        if !state.complete() {
            return Err(self.syntax(i, "a malformed number"));
        }
        self.token = Token::None;
        let flow = self.emit(sink, i, self.stack.len(), Event::Number)?;
        self.value_done();
        Ok((0, flow))
    }

    /// The byte at `at` of a literal (`true`, `false`, `null`, `NaN`, `Infinity`).
    fn literal_byte(
        &mut self,
        text: &'static [u8],
        at: usize,
        b: u8,
        i: usize,
        sink: &mut impl Sink,
    ) -> Result<(usize, Flow), ScanError> {
        if b != text[at] {
            return Err(self.syntax(i, "a malformed literal"));
        }
        if at + 1 < text.len() {
            self.token = Token::Lit { text, at: at + 1 };
            return Ok((1, Flow::Continue));
        }
        self.token = Token::None;
        let event = match text {
            b"true" => Event::Bool(true),
            b"false" => Event::Bool(false),
            b"null" => Event::Null,
            _ => Event::Number,
        };
        let flow = self.emit(sink, i, self.stack.len(), event)?;
        self.value_done();
        Ok((1, flow))
    }

    /// One non-whitespace byte outside any token.
    fn structure(&mut self, b: u8, i: usize, sink: &mut impl Sink) -> Result<Flow, ScanError> {
        let depth = self.stack.len();
        match self.expect {
            Expect::Eof => Err(self.syntax(i, "data after the JSON value")),
            Expect::Colon => {
                if b != b':' {
                    return Err(self.syntax(i, "expected ':' after an object key"));
                }
                self.expect = Expect::Value;
                Ok(Flow::Continue)
            }
            Expect::KeyOrEnd | Expect::Key => match b {
                b'"' => {
                    self.token = Token::Str {
                        key: true,
                        esc: Esc::None,
                    };
                    Ok(Flow::Continue)
                }
                b'}' if self.expect == Expect::KeyOrEnd => self.close(i, sink),
                _ => Err(self.syntax(i, "expected an object key")),
            },
            Expect::CommaOrEnd => match (b, self.stack.last()) {
                (b',', Some(&OBJECT)) => {
                    self.expect = Expect::Key;
                    Ok(Flow::Continue)
                }
                (b',', _) => {
                    self.expect = Expect::Value;
                    Ok(Flow::Continue)
                }
                (b'}', Some(&OBJECT)) | (b']', Some(&ARRAY)) => self.close(i, sink),
                _ => Err(self.syntax(i, "expected ',' or the end of the container")),
            },
            Expect::Value | Expect::ValueOrEnd => match b {
                b'{' | b'[' => {
                    if depth >= MAX_DEPTH {
                        return Err(ScanError::TooDeep {
                            at: self.offset + i as u64,
                        });
                    }
                    let (kind, event, next) = if b == b'{' {
                        (OBJECT, Event::BeginObject, Expect::KeyOrEnd)
                    } else {
                        (ARRAY, Event::BeginArray, Expect::ValueOrEnd)
                    };
                    self.stack.push(kind);
                    self.expect = next;
                    self.emit(sink, i, depth, event)
                }
                b']' if self.expect == Expect::ValueOrEnd => self.close(i, sink),
                b'"' => {
                    self.token = Token::Str {
                        key: false,
                        esc: Esc::None,
                    };
                    Ok(Flow::Continue)
                }
                b'-' => {
                    self.token = Token::Num(Num::Minus);
                    Ok(Flow::Continue)
                }
                b'0' => {
                    self.token = Token::Num(Num::Zero);
                    Ok(Flow::Continue)
                }
                b'1'..=b'9' => {
                    self.token = Token::Num(Num::Int);
                    Ok(Flow::Continue)
                }
                _ => match literal(b) {
                    Some(text) => {
                        self.token = Token::Lit { text, at: 1 };
                        Ok(Flow::Continue)
                    }
                    None => Err(self.syntax(i, "expected a JSON value")),
                },
            },
        }
    }

    fn close(&mut self, i: usize, sink: &mut impl Sink) -> Result<Flow, ScanError> {
        self.stack.pop();
        let flow = self.emit(sink, i, self.stack.len(), Event::End)?;
        self.value_done();
        Ok(flow)
    }

    /// The reply ended: it must have been one complete value.
    fn finish(&mut self, sink: &mut impl Sink) -> Result<(), ScanError> {
        if let Token::Num(state) = self.token
            && state.complete()
            && self.stack.is_empty()
        {
            self.token = Token::None;
            self.emit(sink, 0, 0, Event::Number)?;
            self.value_done();
        }
        if self.expect == Expect::Eof && self.token == Token::None {
            Ok(())
        } else {
            Err(ScanError::Truncated { at: self.offset })
        }
    }
}

/// Drives a lexer and a sink: the shared half of every scanner.
#[derive(Debug)]
pub(crate) struct Driver<S> {
    lexer: Lexer,
    pub(crate) sink: S,
    state: DriverState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DriverState {
    Reading,
    Stopped,
    Failed,
}

impl<S: Sink> Driver<S> {
    pub(crate) fn new(keep: usize, sink: S) -> Self {
        Driver {
            lexer: Lexer::new(keep),
            sink,
            state: DriverState::Reading,
        }
    }

    pub(crate) fn feed(&mut self, chunk: &[u8]) -> Result<Flow, ScanError> {
        if self.state != DriverState::Reading {
            return Err(ScanError::Ended);
        }
        match self.lexer.feed(chunk, &mut self.sink) {
            Ok(Flow::Stop) => {
                self.state = DriverState::Stopped;
                Ok(Flow::Stop)
            }
            Ok(Flow::Continue) => Ok(Flow::Continue),
            Err(e) => {
                self.state = DriverState::Failed;
                Err(e)
            }
        }
    }

    /// `Ok(true)` when the scan stopped early, `Ok(false)` when the whole
    /// reply was one complete JSON value.
    pub(crate) fn finish(&mut self) -> Result<bool, ScanError> {
        match self.state {
            DriverState::Stopped => Ok(true),
            DriverState::Failed => Err(ScanError::Ended),
            DriverState::Reading => self.lexer.finish(&mut self.sink).map(|()| false),
        }
    }

    pub(crate) fn shape(&self, what: impl Into<String>) -> ScanError {
        ScanError::Shape {
            at: self.lexer.offset,
            what: what.into(),
        }
    }
}

#[cfg(test)]
mod tests;
