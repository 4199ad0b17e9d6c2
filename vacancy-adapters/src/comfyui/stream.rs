//! Bounded streaming reads of ComfyUI's `GET /queue` and `GET /history/<id>`
//! replies (COMFY-30..35).
//!
//! A `/queue` reply carries every queued workflow and can be hundreds of MiB,
//! so vacancyd never collects it: the bytes are pushed, chunk by chunk as they
//! arrive, into a [`Scanner`] that keeps only prompt IDs, statuses and (for
//! one history entry) at most [`MAX_OUTPUT_FILES`] output file names
//! (COMFY-30), while [`read_body`] enforces the size and time limits of
//! [`ReadLimits`] (COMFY-31..35).
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

use std::collections::HashSet;
use std::time::Duration;

use bytes::{Buf, Bytes};
use http_body_util::BodyExt;
use hyper::body::Body;
use tokio::time::Instant;

use super::OutputFile;
use crate::common::{FetchError, ObservationClient};

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
enum Event<'a> {
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
    fn is_value(&self) -> bool {
        !matches!(self, Event::End | Event::Key(_))
    }
}

/// A sink's complaint about the reply's shape.
type ShapeResult = Result<Flow, String>;

trait Sink {
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

    fn feed_inner(&mut self, chunk: &[u8], sink: &mut impl Sink) -> Result<Flow, ScanError> {
        let mut i = 0;
        while i < chunk.len() {
            match self.token {
                Token::Str {
                    key,
                    esc: Esc::None,
                } => {
                    // The hot loop: skip to the next quote, backslash or
                    // control byte.
                    let rest = &chunk[i..];
                    let n = plain_prefix(rest);
                    if n > 0 {
                        self.flush_high();
                        self.keep_bytes(&rest[..n]);
                        i += n;
                        continue;
                    }
                    let b = rest[0];
                    if b == b'\\' {
                        self.token = Token::Str {
                            key,
                            esc: Esc::Backslash,
                        };
                        i += 1;
                        continue;
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
                    i += 1;
                    if flow == Flow::Stop {
                        return Ok(Flow::Stop);
                    }
                }
                Token::Str {
                    key,
                    esc: Esc::Backslash,
                } => {
                    let b = chunk[i];
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
                    i += 1;
                }
                Token::Str {
                    key,
                    esc: Esc::Hex { n, code },
                } => {
                    let b = chunk[i];
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
                    i += 1;
                }
                Token::Num(state) => {
                    let b = chunk[i];
                    if let Some(next) = state.next(b) {
                        self.token = Token::Num(next);
                        i += 1;
                        continue;
                    }
                    if state == Num::Minus && b == b'I' {
                        self.token = Token::Lit {
                            text: b"Infinity",
                            at: 1,
                        };
                        i += 1;
                        continue;
                    }
                    if !state.complete() {
                        return Err(self.syntax(i, "a malformed number"));
                    }
                    // The byte after the number is scanned again as structure.
                    self.token = Token::None;
                    let flow = self.emit(sink, i, self.stack.len(), Event::Number)?;
                    self.value_done();
                    if flow == Flow::Stop {
                        return Ok(Flow::Stop);
                    }
                }
                Token::Lit { text, at } => {
                    if chunk[i] != text[at] {
                        return Err(self.syntax(i, "a malformed literal"));
                    }
                    i += 1;
                    if at + 1 < text.len() {
                        self.token = Token::Lit { text, at: at + 1 };
                        continue;
                    }
                    self.token = Token::None;
                    let event = match text {
                        b"true" => Event::Bool(true),
                        b"false" => Event::Bool(false),
                        b"null" => Event::Null,
                        _ => Event::Number,
                    };
                    let flow = self.emit(sink, i - 1, self.stack.len(), event)?;
                    self.value_done();
                    if flow == Flow::Stop {
                        return Ok(Flow::Stop);
                    }
                }
                Token::None => {
                    let b = chunk[i];
                    if is_ws(b) {
                        i += 1;
                        continue;
                    }
                    if self.structure(b, i, sink)? == Flow::Stop {
                        return Ok(Flow::Stop);
                    }
                    i += 1;
                }
            }
        }
        Ok(Flow::Continue)
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
struct Driver<S> {
    lexer: Lexer,
    sink: S,
    state: DriverState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DriverState {
    Reading,
    Stopped,
    Failed,
}

impl<S: Sink> Driver<S> {
    fn new(keep: usize, sink: S) -> Self {
        Driver {
            lexer: Lexer::new(keep),
            sink,
            state: DriverState::Reading,
        }
    }

    fn feed(&mut self, chunk: &[u8]) -> Result<Flow, ScanError> {
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
    fn finish(&mut self) -> Result<bool, ScanError> {
        match self.state {
            DriverState::Stopped => Ok(true),
            DriverState::Failed => Err(ScanError::Ended),
            DriverState::Reading => self.lexer.finish(&mut self.sink).map(|()| false),
        }
    }

    fn shape(&self, what: impl Into<String>) -> ScanError {
        ScanError::Shape {
            at: self.lexer.offset,
            what: what.into(),
        }
    }
}

// ---------------------------------------------------------------------------
// Queue scans.
// ---------------------------------------------------------------------------

/// Which list of `GET /queue` an item is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QueuePlace {
    /// `queue_running`: executing now.
    Running,
    /// `queue_pending`: waiting.
    Pending,
}

/// Told every queue item as the scan meets it.
///
/// # Behavior
///
/// [`QueueVisitor::item`] is called once per item of `queue_running` and
/// `queue_pending`, in reply order, with the item's prompt ID (index 1);
/// returning [`Flow::Stop`] ends the read there. [`QueueVisitor::finish`]
/// gets `stopped = true` after such a stop, and `false` after a complete,
/// well-formed reply.
pub trait QueueVisitor {
    /// What the scan finds.
    type Output;
    /// One queue item's prompt ID.
    fn item(&mut self, place: QueuePlace, id: JsonStr<'_>) -> Flow;
    /// The answer.
    fn finish(self, stopped: bool) -> Self::Output;
}

#[derive(Debug)]
struct QueueSink<V> {
    visitor: V,
    /// The queue list the current depth-1 key names, if any.
    key: Option<QueuePlace>,
    /// The queue list being read (depth >= 2).
    section: Option<QueuePlace>,
    /// The index of the next element of the current item.
    index: usize,
    running_seen: bool,
    pending_seen: bool,
}

fn place_name(place: QueuePlace) -> &'static str {
    match place {
        QueuePlace::Running => "queue_running",
        QueuePlace::Pending => "queue_pending",
    }
}

impl<V: QueueVisitor> Sink for QueueSink<V> {
    fn event(&mut self, depth: usize, event: Event<'_>) -> ShapeResult {
        match depth {
            0 => match event {
                Event::BeginObject | Event::End => Ok(Flow::Continue),
                _ => Err("the queue reply is not a JSON object".into()),
            },
            1 => match event {
                Event::Key(k) => {
                    self.key = match k.as_str() {
                        Some("queue_running") => Some(QueuePlace::Running),
                        Some("queue_pending") => Some(QueuePlace::Pending),
                        _ => None,
                    };
                    Ok(Flow::Continue)
                }
                Event::End => {
                    self.section = None;
                    Ok(Flow::Continue)
                }
                Event::BeginArray if self.key.is_some() => {
                    self.section = self.key;
                    match self.key {
                        Some(QueuePlace::Running) => self.running_seen = true,
                        Some(QueuePlace::Pending) => self.pending_seen = true,
                        None => {}
                    }
                    Ok(Flow::Continue)
                }
                _ => match self.key {
                    Some(place) => Err(format!("{} is not an array", place_name(place))),
                    None => Ok(Flow::Continue),
                },
            },
            2 => match (self.section, event) {
                (None, _) => Ok(Flow::Continue),
                (Some(_), Event::BeginArray) => {
                    self.index = 0;
                    Ok(Flow::Continue)
                }
                (Some(place), Event::End) => {
                    if self.index < 2 {
                        Err(format!("an item of {} has no prompt ID", place_name(place)))
                    } else {
                        Ok(Flow::Continue)
                    }
                }
                (Some(place), _) => {
                    Err(format!("an item of {} is not an array", place_name(place)))
                }
            },
            3 => {
                let Some(place) = self.section else {
                    return Ok(Flow::Continue);
                };
                if !event.is_value() {
                    return Ok(Flow::Continue);
                }
                let index = self.index;
                self.index += 1;
                if index != 1 {
                    return Ok(Flow::Continue);
                }
                match event {
                    Event::String(id) => Ok(self.visitor.item(place, id)),
                    _ => Err(format!(
                        "the prompt ID of an item of {} is not a string",
                        place_name(place)
                    )),
                }
            }
            _ => Ok(Flow::Continue),
        }
    }
}

/// A [`Scanner`] of a `GET /queue` reply, telling a [`QueueVisitor`] each item.
///
/// # Behavior
///
/// - The reply must be an object with the arrays `queue_running` and
///   `queue_pending` (in either order; other keys are skipped); each item an
///   array whose element 1 is the prompt ID string. Anything else, or a reply
///   that ends early, is a [`ScanError`], never an empty queue.
/// - Only the current short string and the nesting stack are held: memory
///   does not grow with the reply (COMFY-30).
#[derive(Debug)]
pub struct QueueScan<V> {
    driver: Driver<QueueSink<V>>,
}

impl<V: QueueVisitor> QueueScan<V> {
    /// A scan reporting to `visitor`.
    pub fn new(visitor: V) -> Self {
        QueueScan {
            driver: Driver::new(
                MAX_KEPT_BYTES,
                QueueSink {
                    visitor,
                    key: None,
                    section: None,
                    index: 0,
                    running_seen: false,
                    pending_seen: false,
                },
            ),
        }
    }
}

impl<V: QueueVisitor> Scanner for QueueScan<V> {
    type Output = V::Output;

    fn feed(&mut self, chunk: &[u8]) -> Result<Flow, ScanError> {
        self.driver.feed(chunk)
    }

    fn finish(mut self) -> Result<V::Output, ScanError> {
        let stopped = self.driver.finish()?;
        let sink = &self.driver.sink;
        let complete = sink.running_seen && sink.pending_seen;
        if !stopped && !complete {
            return Err(self
                .driver
                .shape("the queue reply lacks queue_running or queue_pending"));
        }
        Ok(self.driver.sink.visitor.finish(stopped))
    }
}

/// Where one prompt is in ComfyUI's queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptPlace {
    /// In `queue_running`.
    Running,
    /// In `queue_pending`.
    Pending,
    /// In neither list of a complete, well-formed reply.
    Absent,
}

/// Finds one prompt ID in the queue, stopping the read there (COMFY-22).
#[derive(Debug, Clone)]
pub struct FindPrompt {
    id: String,
    found: Option<QueuePlace>,
}

impl FindPrompt {
    /// Looks for `id`.
    pub fn new(id: impl Into<String>) -> Self {
        FindPrompt {
            id: id.into(),
            found: None,
        }
    }
}

impl QueueVisitor for FindPrompt {
    type Output = PromptPlace;

    fn item(&mut self, place: QueuePlace, id: JsonStr<'_>) -> Flow {
        if id.as_str() == Some(self.id.as_str()) {
            self.found = Some(place);
            Flow::Stop
        } else {
            Flow::Continue
        }
    }

    fn finish(self, _stopped: bool) -> PromptPlace {
        match self.found {
            Some(QueuePlace::Running) => PromptPlace::Running,
            Some(QueuePlace::Pending) => PromptPlace::Pending,
            None => PromptPlace::Absent,
        }
    }
}

/// A queue item whose prompt is not one of ours.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForeignPrompt {
    /// The list it is in.
    pub place: QueuePlace,
    /// Its prompt ID; `None` when longer than [`MAX_KEPT_BYTES`].
    pub id: Option<String>,
}

/// Stops at the first queue item whose prompt ID is not in a set of our own
/// (the unload check: is anyone else's work queued?).
///
/// The answer is `Some(first foreign item)`, or `None` when a complete reply
/// held only our prompts (or none).
#[derive(Debug, Clone)]
pub struct FirstForeign {
    own: HashSet<String>,
    found: Option<ForeignPrompt>,
}

impl FirstForeign {
    /// Foreign means: not in `own`.
    pub fn new(own: HashSet<String>) -> Self {
        FirstForeign { own, found: None }
    }
}

impl QueueVisitor for FirstForeign {
    type Output = Option<ForeignPrompt>;

    fn item(&mut self, place: QueuePlace, id: JsonStr<'_>) -> Flow {
        match id.as_str() {
            Some(id) if self.own.contains(id) => Flow::Continue,
            id => {
                self.found = Some(ForeignPrompt {
                    place,
                    id: id.map(str::to_owned),
                });
                Flow::Stop
            }
        }
    }

    fn finish(self, _stopped: bool) -> Option<ForeignPrompt> {
        self.found
    }
}

/// Every prompt ID in the queue, by list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueListing {
    /// The IDs in `queue_running`, in reply order.
    pub running: Vec<String>,
    /// The IDs in `queue_pending`, in reply order.
    pub pending: Vec<String>,
    /// How many items had an ID longer than [`MAX_KEPT_BYTES`] (not ours).
    pub overlong: usize,
}

/// Lists every prompt ID (to cancel our own pending prompts, say).
#[derive(Debug, Clone, Default)]
pub struct ListPrompts {
    listing: QueueListing,
}

impl ListPrompts {
    /// An empty listing.
    pub fn new() -> Self {
        ListPrompts::default()
    }
}

impl QueueVisitor for ListPrompts {
    type Output = QueueListing;

    fn item(&mut self, place: QueuePlace, id: JsonStr<'_>) -> Flow {
        match (id, place) {
            (JsonStr::Kept(id), QueuePlace::Running) => self.listing.running.push(id.to_owned()),
            (JsonStr::Kept(id), QueuePlace::Pending) => self.listing.pending.push(id.to_owned()),
            (JsonStr::Overlong, _) => self.listing.overlong += 1,
        }
        Flow::Continue
    }

    fn finish(self, _stopped: bool) -> QueueListing {
        self.listing
    }
}

// ---------------------------------------------------------------------------
// History scan.
// ---------------------------------------------------------------------------

/// A history entry's `status`, as far as vacancy reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HistoryStatus {
    /// The entry has no `status` key.
    Missing,
    /// `"status": null`.
    Null,
    /// `"status": {...}`.
    Present {
        /// `status_str` (`"success"` or `"error"`); `None` when absent or null.
        status_str: Option<String>,
        /// `completed`; `None` when absent or null.
        completed: Option<bool>,
    },
}

/// What `GET /history/<id>` says about one prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HistoryLookup {
    /// A complete reply without that key (`{}`): not finished, or unknown.
    Absent,
    /// The key is there.
    Found {
        /// Its `status`.
        status: HistoryStatus,
        /// The files its `outputs` list, in reply order: at most
        /// [`MAX_OUTPUT_FILES`] (see [`HistoryScan`]).
        outputs: Vec<OutputFile>,
        /// How many listed files were left out of `outputs`: past
        /// [`MAX_OUTPUT_FILES`], or with a name longer than
        /// [`MAX_KEPT_BYTES`].
        outputs_dropped: usize,
    },
}

/// The most output files a history scan keeps for one prompt.
///
/// # Behavior
///
/// With each of a file's three strings at most [`MAX_KEPT_BYTES`], this
/// bounds what a scan holds (about 768 KiB at worst); the files past it are
/// counted in `outputs_dropped`.
pub const MAX_OUTPUT_FILES: usize = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StatusKey {
    StatusStr,
    Completed,
    Other,
}

/// Which key of our history entry the current depth-2 value belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EntryKey {
    Status,
    Outputs,
    Other,
}

/// Which key of an output file object the current depth-6 value belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FileKey {
    Filename,
    Subfolder,
    Type,
    Other,
}

/// One field of an output file object, as far as read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
enum FileField {
    /// Not (yet) in the object.
    #[default]
    Absent,
    /// A string of at most [`MAX_KEPT_BYTES`].
    Kept(String),
    /// A string longer than that: the file is dropped, and counted.
    Overlong,
    /// Not a string: the object is no file.
    Invalid,
}

impl FileField {
    fn of(event: &Event<'_>) -> FileField {
        match event {
            Event::String(JsonStr::Kept(s)) if s.len() <= MAX_KEPT_BYTES => {
                FileField::Kept((*s).to_owned())
            }
            Event::String(_) => FileField::Overlong,
            _ => FileField::Invalid,
        }
    }
}

/// The output file object being read (depth 5 of the reply).
#[derive(Debug, Default)]
struct FileDraft {
    key: Option<FileKey>,
    filename: FileField,
    subfolder: FileField,
    kind: FileField,
}

/// The output files of our entry: where the scan is inside `outputs`, and
/// what it kept.
#[derive(Debug, Default)]
struct OutputsSink {
    /// Inside our entry's `outputs` object (depth >= 3).
    in_outputs: bool,
    /// Inside one node's output object (depth >= 4).
    in_node: bool,
    /// Inside one of that node's lists (depth >= 5).
    in_list: bool,
    /// The list item being read, when it is an object (depth >= 6).
    draft: Option<FileDraft>,
    files: Vec<OutputFile>,
    dropped: usize,
}

impl OutputsSink {
    /// Restart at an `outputs` object (a repeated key replaces the first).
    fn begin(&mut self) {
        *self = OutputsSink {
            in_outputs: true,
            ..OutputsSink::default()
        };
    }

    /// An event at `depth` >= 3 inside our entry's `outputs`.
    fn event(&mut self, depth: usize, event: &Event<'_>) {
        match depth {
            3 => match event {
                Event::BeginObject => self.in_node = true,
                Event::End => self.in_node = false,
                _ => {}
            },
            4 if self.in_node => match event {
                Event::BeginArray => self.in_list = true,
                Event::End => self.in_list = false,
                _ => {}
            },
            5 if self.in_list => match event {
                Event::BeginObject => self.draft = Some(FileDraft::default()),
                Event::End => {
                    if let Some(draft) = self.draft.take() {
                        self.file_done(draft);
                    }
                }
                _ => {}
            },
            6 => {
                let Some(draft) = &mut self.draft else {
                    return;
                };
                if let Event::Key(k) = event {
                    draft.key = Some(match k.as_str() {
                        Some("filename") => FileKey::Filename,
                        Some("subfolder") => FileKey::Subfolder,
                        Some("type") => FileKey::Type,
                        _ => FileKey::Other,
                    });
                    return;
                }
                if !event.is_value() {
                    return;
                }
                let field = FileField::of(event);
                match draft.key.take() {
                    Some(FileKey::Filename) => draft.filename = field,
                    Some(FileKey::Subfolder) => draft.subfolder = field,
                    Some(FileKey::Type) => draft.kind = field,
                    Some(FileKey::Other) | None => {}
                }
            }
            _ => {}
        }
    }

    /// A list item object ended: keep it, count it as dropped, or skip it.
    fn file_done(&mut self, draft: FileDraft) {
        let fields = [&draft.filename, &draft.subfolder, &draft.kind];
        if matches!(draft.filename, FileField::Absent)
            || fields.iter().any(|f| matches!(f, FileField::Invalid))
        {
            // No string filename (or a non-string subfolder or type): not a
            // file `/view` could name.
            return;
        }
        if fields.iter().any(|f| matches!(f, FileField::Overlong))
            || self.files.len() >= MAX_OUTPUT_FILES
        {
            self.dropped += 1;
            return;
        }
        let text = |f: FileField, default: &str| match f {
            FileField::Kept(s) => s,
            _ => default.to_owned(),
        };
        self.files.push(OutputFile {
            filename: text(draft.filename, ""),
            subfolder: text(draft.subfolder, ""),
            kind: text(draft.kind, "output"),
        });
    }
}

#[derive(Debug)]
struct HistorySink {
    id: String,
    /// The current depth-1 key is our ID.
    ours: bool,
    /// Inside our entry (depth >= 2).
    in_entry: bool,
    /// What the current depth-2 key of our entry is.
    entry_key: EntryKey,
    /// Inside our entry's `status` object (depth >= 3).
    in_status: bool,
    field: StatusKey,
    found: Option<HistoryStatus>,
    /// Our entry's output files.
    outputs: OutputsSink,
}

impl HistorySink {
    fn status_mut(&mut self) -> Option<(&mut Option<String>, &mut Option<bool>)> {
        match &mut self.found {
            Some(HistoryStatus::Present {
                status_str,
                completed,
            }) => Some((status_str, completed)),
            _ => None,
        }
    }
}

impl Sink for HistorySink {
    fn event(&mut self, depth: usize, event: Event<'_>) -> ShapeResult {
        match depth {
            0 => match event {
                Event::BeginObject | Event::End => {}
                _ => return Err("the history reply is not a JSON object".into()),
            },
            1 => match event {
                Event::Key(k) => self.ours = k.as_str() == Some(self.id.as_str()),
                Event::End => self.in_entry = false,
                Event::BeginObject if self.ours => {
                    self.in_entry = true;
                    self.found = Some(HistoryStatus::Missing);
                    self.outputs = OutputsSink::default();
                }
                _ if self.ours => return Err("the prompt's history entry is not an object".into()),
                _ => {}
            },
            2 if self.in_entry => match event {
                Event::Key(k) => {
                    self.entry_key = match k.as_str() {
                        Some("status") => EntryKey::Status,
                        Some("outputs") => EntryKey::Outputs,
                        _ => EntryKey::Other,
                    };
                }
                Event::End => {
                    self.in_status = false;
                    self.outputs.in_outputs = false;
                }
                Event::BeginObject if self.entry_key == EntryKey::Status => {
                    self.in_status = true;
                    self.found = Some(HistoryStatus::Present {
                        status_str: None,
                        completed: None,
                    });
                }
                Event::Null if self.entry_key == EntryKey::Status => {
                    self.found = Some(HistoryStatus::Null);
                }
                _ if self.entry_key == EntryKey::Status => {
                    return Err("the entry's status is not an object".into());
                }
                // Outputs of another shape list no files; the status decides.
                Event::BeginObject if self.entry_key == EntryKey::Outputs => self.outputs.begin(),
                _ => {}
            },
            3.. if self.outputs.in_outputs => self.outputs.event(depth, &event),
            3 if self.in_status => {
                if let Event::Key(k) = event {
                    self.field = match k.as_str() {
                        Some("status_str") => StatusKey::StatusStr,
                        Some("completed") => StatusKey::Completed,
                        _ => StatusKey::Other,
                    };
                    return Ok(Flow::Continue);
                }
                if !event.is_value() {
                    return Ok(Flow::Continue);
                }
                let field = self.field;
                let Some((status_str, completed)) = self.status_mut() else {
                    return Ok(Flow::Continue);
                };
                match (field, event) {
                    (StatusKey::StatusStr, Event::String(JsonStr::Kept(s))) => {
                        *status_str = Some(s.to_owned());
                    }
                    (StatusKey::StatusStr, Event::Null) => *status_str = None,
                    (StatusKey::StatusStr, _) => {
                        return Err("status.status_str is not a short string".into());
                    }
                    (StatusKey::Completed, Event::Bool(b)) => *completed = Some(b),
                    (StatusKey::Completed, Event::Null) => *completed = None,
                    (StatusKey::Completed, _) => {
                        return Err("status.completed is not a boolean".into());
                    }
                    (StatusKey::Other, _) => {}
                }
            }
            _ => {}
        }
        Ok(Flow::Continue)
    }
}

/// A [`Scanner`] of a `GET /history/<id>` reply for one prompt ID.
///
/// # Behavior
///
/// - The reply must be a JSON object; the entry under `id`, when present,
///   an object whose `status` is an object or null, with `status_str` a
///   string or null and `completed` a boolean or null.
/// - The entry's `outputs` (`{"<node id>": {"images": [{"filename",
///   "subfolder", "type"}, ...], "gifs": [...], ...}}`) give its files:
///   every object in a node's lists with a string `filename` (`subfolder`
///   `""` and `type` `"output"` when absent; an object whose `subfolder` or
///   `type` is not a string is no file). At most [`MAX_OUTPUT_FILES`] are
///   kept, each string at most [`MAX_KEPT_BYTES`]; further files and files
///   with a longer string are counted in `outputs_dropped`, never an error.
///   `outputs` of another shape lists no files.
/// - `prompt`, `status.messages` and other keys are skipped without being
///   kept (COMFY-30).
/// - The whole reply is read and checked: a malformed or truncated reply is
///   a [`ScanError`], never [`HistoryLookup::Absent`].
#[derive(Debug)]
pub struct HistoryScan {
    driver: Driver<HistorySink>,
}

impl HistoryScan {
    /// A scan for the history entry of prompt `id`.
    pub fn new(id: impl Into<String>) -> Self {
        let id = id.into();
        HistoryScan {
            driver: Driver::new(
                MAX_KEPT_BYTES.max(id.len()),
                HistorySink {
                    id,
                    ours: false,
                    in_entry: false,
                    entry_key: EntryKey::Other,
                    in_status: false,
                    field: StatusKey::Other,
                    found: None,
                    outputs: OutputsSink::default(),
                },
            ),
        }
    }
}

impl Scanner for HistoryScan {
    type Output = HistoryLookup;

    fn feed(&mut self, chunk: &[u8]) -> Result<Flow, ScanError> {
        self.driver.feed(chunk)
    }

    fn finish(mut self) -> Result<HistoryLookup, ScanError> {
        self.driver.finish()?;
        let sink = self.driver.sink;
        Ok(match sink.found {
            Some(status) => HistoryLookup::Found {
                status,
                outputs: sink.outputs.files,
                outputs_dropped: sink.outputs.dropped,
            },
            None => HistoryLookup::Absent,
        })
    }
}

// ---------------------------------------------------------------------------
// The bounded read (COMFY-31..35).
// ---------------------------------------------------------------------------

/// The limits on one streamed read of a ComfyUI reply.
///
/// # Behavior
///
/// The defaults are the rules: at most 256 MiB (COMFY-31), the first byte
/// within 60 s (COMFY-32), never silent for more than 10 s (COMFY-33), and
/// the whole read, parsing included, within 5 minutes (COMFY-34). A use that
/// reads less (the unload check: 16 MiB) lowers `max_bytes`; tests shrink
/// the times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadLimits {
    /// The most bytes read from the body (COMFY-31).
    pub max_bytes: u64,
    /// From the request to the first body byte (COMFY-32).
    pub first_byte: Duration,
    /// The longest wait for the next bytes once the body has started (COMFY-33).
    pub silence: Duration,
    /// From the request to the end of the scan (COMFY-34).
    pub total: Duration,
}

impl ReadLimits {
    /// COMFY-31: 256 MiB.
    pub const MAX_BYTES: u64 = 256 * 1024 * 1024;
    /// COMFY-32: 60 s.
    pub const FIRST_BYTE: Duration = Duration::from_secs(60);
    /// COMFY-33: 10 s.
    pub const SILENCE: Duration = Duration::from_secs(10);
    /// COMFY-34: 5 minutes.
    pub const TOTAL: Duration = Duration::from_secs(300);

    /// The same limits with another byte cap.
    pub fn with_max_bytes(mut self, max_bytes: u64) -> Self {
        self.max_bytes = max_bytes;
        self
    }
}

impl Default for ReadLimits {
    fn default() -> Self {
        ReadLimits {
            max_bytes: Self::MAX_BYTES,
            first_byte: Self::FIRST_BYTE,
            silence: Self::SILENCE,
            total: Self::TOTAL,
        }
    }
}

/// Why a streamed read failed (COMFY-35): each variant names the limit or
/// the fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    /// No body byte within [`ReadLimits::first_byte`] of the request (COMFY-32).
    #[error("{what}: no reply within {} ms (COMFY-32)", limit.as_millis())]
    FirstByte {
        /// The request, e.g. `GET /queue`.
        what: String,
        /// The limit.
        limit: Duration,
    },
    /// The body fell silent for longer than [`ReadLimits::silence`] (COMFY-33).
    #[error("{what}: the reply fell silent for {} ms after {received} bytes (COMFY-33)", limit.as_millis())]
    Silence {
        /// The request.
        what: String,
        /// The limit.
        limit: Duration,
        /// Bytes read before the silence.
        received: u64,
    },
    /// The read and scan took longer than [`ReadLimits::total`] (COMFY-34).
    #[error("{what}: the read took longer than {} ms after {received} bytes (COMFY-34)", limit.as_millis())]
    Total {
        /// The request.
        what: String,
        /// The limit.
        limit: Duration,
        /// Bytes read by then.
        received: u64,
    },
    /// The reply went past [`ReadLimits::max_bytes`] before the scan had its
    /// answer (COMFY-31).
    #[error("{what}: the reply is larger than {limit} bytes (COMFY-31)")]
    TooLarge {
        /// The request.
        what: String,
        /// The limit.
        limit: u64,
    },
    /// The connection broke off.
    #[error("{what}: the reply broke off after {received} bytes: {detail}")]
    Broken {
        /// The request.
        what: String,
        /// Bytes read before.
        received: u64,
        /// The transport's error.
        detail: String,
    },
    /// The reply is not the JSON it should be (truncated, malformed, shaped
    /// otherwise).
    #[error("{what}: {source}")]
    Scan {
        /// The request.
        what: String,
        /// The scanner's error.
        #[source]
        source: ScanError,
    },
}

impl ReadError {
    /// The rule the failure breaks, for logs and metrics.
    pub fn rule(&self) -> &'static str {
        match self {
            ReadError::FirstByte { .. } => "COMFY-32",
            ReadError::Silence { .. } => "COMFY-33",
            ReadError::Total { .. } => "COMFY-34",
            ReadError::TooLarge { .. } => "COMFY-31",
            ReadError::Broken { .. } | ReadError::Scan { .. } => "COMFY-35",
        }
    }
}

/// Reads `body` into `scanner` within `limits`, timed from now.
///
/// See [`read_body_since`]; use that one when the request went out earlier,
/// so the wait for the response head counts towards COMFY-32 and COMFY-34.
pub async fn read_body<B, S>(
    what: &str,
    body: B,
    limits: &ReadLimits,
    scanner: S,
) -> Result<S::Output, ReadError>
where
    B: Body<Data = Bytes>,
    B::Error: std::error::Error,
    S: Scanner,
{
    read_body_since(what, Instant::now(), body, limits, scanner).await
}

/// Reads `body` into `scanner` as it arrives, within `limits` counted from
/// `started` (when the request was sent).
///
/// # Behavior
///
/// - Each chunk is scanned as it arrives and dropped (COMFY-30); the read
///   ends as soon as the scanner says [`Flow::Stop`], leaving the rest unread.
/// - At most `limits.max_bytes` are scanned: a scan that has no answer by
///   then is [`ReadError::TooLarge`] (COMFY-31). A stop inside the cap is
///   an answer, even when the chunk it came in reached past it.
/// - The first body byte must come within `limits.first_byte` of `started`
///   (COMFY-32), each further chunk within `limits.silence` of the previous
///   one (COMFY-33), and the whole read and scan must end within
///   `limits.total` of `started` (COMFY-34).
/// - Every failure is logged at `warn` with the rule it breaks, and returned
///   (COMFY-35).
pub async fn read_body_since<B, S>(
    what: &str,
    started: Instant,
    body: B,
    limits: &ReadLimits,
    scanner: S,
) -> Result<S::Output, ReadError>
where
    B: Body<Data = Bytes>,
    B::Error: std::error::Error,
    S: Scanner,
{
    let result = read_inner(what, started, body, limits, scanner).await;
    if let Err(e) = &result {
        log_failure(e, started);
    }
    result
}

/// Why [`get_scanned`] failed: before the body (the request) or while
/// reading it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamFetchError {
    /// The request failed or was answered with a non-2xx status.
    #[error(transparent)]
    Fetch(#[from] FetchError),
    /// The reply broke a limit or is not the JSON it should be (COMFY-31..35).
    #[error(transparent)]
    Read(#[from] ReadError),
}

/// `GET path` through `client`, its reply scanned as it arrives within
/// `limits`.
///
/// # Behavior
///
/// - The request carries vacancy's credential only (OBS-01/02).
/// - The time limits count from sending the request: no response head
///   within `limits.first_byte` is [`ReadError::FirstByte`] (COMFY-32), and
///   the body is read by [`read_body_since`] (COMFY-30..35).
/// - A failed request or a non-2xx answer is [`StreamFetchError::Fetch`].
pub async fn get_scanned<S: Scanner>(
    client: &ObservationClient,
    path: &str,
    limits: &ReadLimits,
    scanner: S,
) -> Result<S::Output, StreamFetchError> {
    let started = Instant::now();
    let head_limit = limits.first_byte.min(limits.total);
    // The client's own bound is a second later, so ours always fires first
    // and names the rule.
    let head = client.get_streaming(path, head_limit + Duration::from_secs(1));
    let response = match tokio::time::timeout_at(started + head_limit, head).await {
        Ok(response) => response?,
        Err(_) => {
            let what = format!("GET {}", client.full_path(path));
            let e = if head_limit < limits.first_byte {
                ReadError::Total {
                    what,
                    limit: limits.total,
                    received: 0,
                }
            } else {
                ReadError::FirstByte {
                    what,
                    limit: limits.first_byte,
                }
            };
            log_failure(&e, started);
            return Err(e.into());
        }
    };
    Ok(read_body_since(&response.what, started, response.body, limits, scanner).await?)
}

fn log_failure(e: &ReadError, started: Instant) {
    // COMFY-35: a read that breaks a limit fails, and says so.
    tracing::warn!(
        rule = e.rule(),
        elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        error = %e,
        "ComfyUI reply read failed"
    );
}

async fn read_inner<B, S>(
    what: &str,
    started: Instant,
    body: B,
    limits: &ReadLimits,
    mut scanner: S,
) -> Result<S::Output, ReadError>
where
    B: Body<Data = Bytes>,
    B::Error: std::error::Error,
    S: Scanner,
{
    let mut body = std::pin::pin!(body);
    let total_deadline = started + limits.total;
    let mut received: u64 = 0;
    let mut last = started;
    let scan_err = |source| ReadError::Scan {
        what: what.to_owned(),
        source,
    };
    loop {
        // COMFY-32 before the first byte, COMFY-33 after it; COMFY-34 always.
        let wait_deadline = if received == 0 {
            started + limits.first_byte
        } else {
            last + limits.silence
        };
        let deadline = wait_deadline.min(total_deadline);
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Ok(frame) => frame,
            Err(_) if deadline >= total_deadline => {
                return Err(ReadError::Total {
                    what: what.to_owned(),
                    limit: limits.total,
                    received,
                });
            }
            Err(_) if received == 0 => {
                return Err(ReadError::FirstByte {
                    what: what.to_owned(),
                    limit: limits.first_byte,
                });
            }
            Err(_) => {
                return Err(ReadError::Silence {
                    what: what.to_owned(),
                    limit: limits.silence,
                    received,
                });
            }
        };
        let Some(frame) = frame else {
            // The body ended: the scanner checks it was complete.
            return scanner.finish().map_err(scan_err);
        };
        let frame = frame.map_err(|e| ReadError::Broken {
            what: what.to_owned(),
            received,
            detail: crate::common::error_chain(&e),
        })?;
        let Ok(mut data) = frame.into_data() else {
            continue; // trailers carry no reply bytes
        };
        if !data.has_remaining() {
            continue;
        }
        last = Instant::now();
        let room = limits.max_bytes.saturating_sub(received);
        let len = data.len() as u64;
        let over = len > room;
        if over {
            // COMFY-31: scan what fits; past the cap only a stop is an answer.
            data.truncate(usize::try_from(room).unwrap_or(usize::MAX));
        }
        received += data.len() as u64;
        let flow = scanner.feed(&data).map_err(scan_err)?;
        if flow == Flow::Stop {
            return scanner.finish().map_err(scan_err);
        }
        if over {
            return Err(ReadError::TooLarge {
                what: what.to_owned(),
                limit: limits.max_bytes,
            });
        }
        if Instant::now() >= total_deadline {
            return Err(ReadError::Total {
                what: what.to_owned(),
                limit: limits.total,
                received,
            });
        }
    }
}

#[cfg(test)]
mod tests;
