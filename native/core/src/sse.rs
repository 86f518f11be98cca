//! WHATWG `text/event-stream` decoding (sans-IO): a port, exactly, of
//! `SseDecoder` in `sniffer/core/sse.py`, which stays the reference.
//!
//! Bytes are UTF-8 decoded incrementally (invalid sequences become U+FFFD);
//! a BOM is stripped at the very start only; lines end with CR, LF or CRLF
//! (a CR ending one feed and an LF opening the next are one line end); `:`
//! starts a comment; one space after the colon is dropped; `data` lines are
//! joined with `\n`; a blank line dispatches; an event cut off by `close()` is
//! not dispatched (`truncated_event`). A line longer than `max_line`
//! characters (line end excluded) is dropped and counted, and so is the event
//! it belonged to. The states are explicit: at a line start or inside a
//! partial line (`pieces`), optionally after a CR (`cr`), or discarding an
//! over-long line (`discard`). Lengths are counted in characters, as Python
//! counts them.

use std::borrow::Cow;

/// Longest line (in decoded characters, line end excluded) a decoder keeps.
pub const DEFAULT_MAX_LINE: usize = 8 * 1024 * 1024;

/// A `retry:` value of more digits than this is ignored, as the reference
/// ignores it (`MAX_RETRY_DIGITS` in `core/sse.py`: past 31 years of ms).
pub const MAX_RETRY_DIGITS: usize = 12;
const BOM: char = '\u{feff}';

/// One dispatched server-sent event. `retry` is the field's digits as sent
/// (the reference turns them into a Python int; see [`SseEvent::retry_ms`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// the event type: "message" (most events) is not allocated
    pub event: Cow<'static, str>,
    pub data: String,
    pub id: Option<String>,
    pub retry: Option<String>,
}

impl SseEvent {
    /// The reconnection time, when it fits a u64.
    pub fn retry_ms(&self) -> Option<u64> {
        self.retry.as_deref().and_then(|r| r.parse().ok())
    }
}

/// Number of characters (what Python's `len` counts) when it may exceed `cap`.
pub(crate) fn chars_over(s: &str, cap: usize) -> Option<usize> {
    if s.len() <= cap {
        return None; // bytes >= characters
    }
    let n = s.chars().count();
    (n > cap).then_some(n)
}

/// The start of an encoded surrogate (`ED` then `A0`–`BF`) ending the input:
/// invalid UTF-8, but CPython's incremental decoder holds it as an
/// unfinished character instead of replacing it at once (for error handlers
/// such as `surrogatepass`). The text comes out the same either way; when it
/// comes out does not (a line's length at a cap, whether the decoder is idle).
fn truncated_surrogate(bad: &[u8]) -> bool {
    matches!(bad, [0xED, 0xA0..=0xBF])
}

/// Incremental UTF-8 with `errors="replace"` (CPython's incremental decoder).
#[derive(Debug, Default, Clone)]
pub(crate) struct Utf8Stream {
    held: Vec<u8>,
}

impl Utf8Stream {
    pub fn pending(&self) -> bool {
        !self.held.is_empty()
    }

    pub fn decode(&mut self, data: &[u8], fin: bool) -> String {
        let joined;
        let buf: &[u8] = if self.held.is_empty() {
            data
        } else {
            let mut b = std::mem::take(&mut self.held);
            b.extend_from_slice(data);
            joined = b;
            &joined
        };
        if let Ok(s) = std::str::from_utf8(buf) {
            return s.to_owned();
        }
        let mut out = String::with_capacity(buf.len().saturating_add(8));
        let mut rest = buf;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    break;
                }
                Err(e) => {
                    let (good, bad) = rest.split_at(e.valid_up_to());
                    out.push_str(std::str::from_utf8(good).unwrap_or_default());
                    if !fin && truncated_surrogate(bad) {
                        // CPython's incremental decoder keeps these two bytes
                        // for the next feed (they are replaced then, as here)
                        self.held = bad.to_vec();
                        break;
                    }
                    match e.error_len() {
                        Some(n) => {
                            out.push('\u{fffd}');
                            rest = bad.get(n..).unwrap_or(&[]);
                        }
                        None => {
                            if fin {
                                out.push('\u{fffd}');
                            } else {
                                self.held = bad.to_vec();
                            }
                            break;
                        }
                    }
                }
            }
        }
        out
    }
}

/// What both decoders share: incremental UTF-8, capped lines, error counters.
#[derive(Debug, Clone)]
pub(crate) struct LineDecoder {
    pub max_line: usize,
    pub errors: u64,
    /// lines dropped for being longer than `max_line` (each also an error)
    pub overlong: u64,
    pub last_error: Option<String>,
    pub closed: bool,
    pub utf8: Utf8Stream,
    pub started: bool,
    pub discard: bool,
    pub pieces: String,
    /// the reference's `_pieces` list is non-empty (it may hold one empty text)
    pub has_pieces: bool,
    pub plen: usize,
}

impl LineDecoder {
    pub fn new(max_line: usize) -> Self {
        LineDecoder {
            max_line,
            errors: 0,
            overlong: 0,
            last_error: None,
            closed: false,
            utf8: Utf8Stream::default(),
            started: false,
            discard: false,
            pieces: String::new(),
            has_pieces: false,
            plen: 0,
        }
    }

    pub fn idle(&self) -> bool {
        !self.has_pieces && !self.discard && !self.utf8.pending()
    }

    pub fn error(&mut self, message: String) {
        self.errors = self.errors.saturating_add(1);
        self.last_error = Some(message);
    }

    pub fn overflow_message(&mut self, length: usize) {
        self.overlong = self.overlong.saturating_add(1);
        let m = format!(
            "line longer than {} characters ({length}+) dropped",
            self.max_line
        );
        self.error(m);
    }

    /// Keep the start of a line that has not ended yet; true when it overflowed.
    pub fn hold(&mut self, text: &str) -> Option<usize> {
        self.pieces.push_str(text);
        self.has_pieces = true;
        self.plen = self.plen.saturating_add(text.chars().count());
        if self.plen > self.max_line {
            let n = self.plen;
            self.pieces.clear();
            self.has_pieces = false;
            self.plen = 0;
            self.discard = true;
            return Some(n);
        }
        None
    }

    pub fn joined(&mut self, text: &str) -> String {
        let mut s = std::mem::take(&mut self.pieces);
        s.push_str(text);
        self.has_pieces = false;
        self.plen = 0;
        s
    }

    pub fn keep_partial(&mut self, partial: &str) {
        self.pieces.push_str(partial);
        self.has_pieces = true;
        self.plen = partial.chars().count();
    }
}

/// Incremental WHATWG event-stream decoder.
#[derive(Debug, Clone)]
pub struct SseDecoder {
    base: LineDecoder,
    pub events: u64,
    pub comments: u64,
    pub truncated_event: bool,
    pub last_event_id: Option<String>,
    pub retry: Option<String>,
    cr: bool,
    data: Vec<String>,
    etype: String,
    eretry: Option<String>,
    pending: bool,
    poisoned: bool,
}

impl Default for SseDecoder {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_LINE)
    }
}

impl SseDecoder {
    pub fn new(max_line: usize) -> Self {
        SseDecoder {
            base: LineDecoder::new(max_line),
            events: 0,
            comments: 0,
            truncated_event: false,
            last_event_id: None,
            retry: None,
            cr: false,
            data: Vec::new(),
            etype: String::new(),
            eretry: None,
            pending: false,
            poisoned: false,
        }
    }

    pub fn max_line(&self) -> usize {
        self.base.max_line
    }
    pub fn errors(&self) -> u64 {
        self.base.errors
    }
    /// lines dropped for being longer than `max_line`
    pub fn overlong(&self) -> u64 {
        self.base.overlong
    }
    pub fn last_error(&self) -> Option<&str> {
        self.base.last_error.as_deref()
    }
    pub fn closed(&self) -> bool {
        self.base.closed
    }

    /// At an event boundary: nothing held, no undispatched field, no CR waiting.
    pub fn idle(&self) -> bool {
        self.base.idle() && !self.pending && !self.cr
    }

    /// Decode more body bytes; the events they complete are appended to `out`.
    pub fn feed(&mut self, data: &[u8], out: &mut Vec<SseEvent>) {
        if self.base.closed {
            self.base.error("data fed after close()".into());
            return;
        }
        if !self.base.utf8.pending() {
            // what `decode` gives with nothing held and valid UTF-8 (the
            // text itself, nothing held after): read in place, a whole
            // event copied once
            if let Ok(text) = std::str::from_utf8(data) {
                if !text.is_empty() && !self.whole(text, out) {
                    self.lines(text.to_owned(), out);
                }
                return;
            }
        }
        let text = self.base.utf8.decode(data, false);
        if text.is_empty() {
            return;
        }
        self.text(text, out);
    }

    /// End of body: a partial event is never dispatched (`truncated_event`).
    pub fn close(&mut self) {
        if self.base.closed {
            return;
        }
        let tail = self.base.utf8.decode(&[], true);
        if !tail.is_empty() {
            let mut sink = Vec::new();
            self.text(tail, &mut sink);
        }
        self.base.closed = true;
        let partial_field = !self.base.pieces.is_empty() && !self.base.pieces.starts_with(':');
        self.truncated_event = self.pending || partial_field || self.base.discard;
        self.base.pieces.clear();
        self.base.has_pieces = false;
        self.base.plen = 0;
        self.reset_event();
    }

    fn overflow(&mut self, length: usize) {
        self.base.overflow_message(length);
        self.pending = true;
        self.poisoned = true;
    }

    fn hold(&mut self, text: &str) {
        if let Some(n) = self.base.hold(text) {
            self.overflow(n);
        }
    }

    fn text(&mut self, text: String, out: &mut Vec<SseEvent>) {
        if !self.whole(&text, out) {
            self.lines(text, out);
        }
    }

    /// The common case read at once: `text` is one whole `data:` event
    /// (one line, then a blank one) met at an event boundary, after the
    /// start of the stream; true when it was (the event dispatched).
    fn whole(&mut self, text: &str, out: &mut Vec<SseEvent>) -> bool {
        let cap = self.base.max_line;
        if text.ends_with("\n\n")
            && text.starts_with("data:")
            && self.base.started
            && !(self.cr || self.base.discard || self.base.has_pieces || self.pending)
            && !text.contains('\r')
            && chars_over(text, cap).is_none()
        {
            let value = &text[5..text.len().saturating_sub(2)];
            if !value.contains('\n') {
                let value = value.strip_prefix(' ').unwrap_or(value);
                self.events = self.events.saturating_add(1);
                out.push(SseEvent {
                    event: Cow::Borrowed("message"),
                    data: value.to_owned(),
                    id: self.last_event_id.clone(),
                    retry: None,
                });
                return true;
            }
        }
        false
    }

    /// Decoded text that is not one whole event (`whole`), line by line.
    fn lines(&mut self, mut text: String, out: &mut Vec<SseEvent>) {
        let cap = self.base.max_line;
        if !self.base.started {
            self.base.started = true;
            if text.starts_with(BOM) {
                text.drain(..BOM.len_utf8());
                if text.is_empty() {
                    return;
                }
            }
        }
        if self.cr {
            self.cr = false;
            if text.starts_with('\n') {
                text.remove(0);
                if text.is_empty() {
                    return;
                }
            }
        }
        if text.contains('\r') {
            self.cr = text.ends_with('\r');
            text = text.replace("\r\n", "\n").replace('\r', "\n");
        }
        if self.base.discard {
            let Some(i) = text.find('\n') else { return };
            self.base.discard = false;
            text.drain(..=i);
            if text.is_empty() {
                return;
            }
        }
        if !text.contains('\n') {
            self.hold(&text);
            return;
        }
        if self.base.has_pieces {
            text = self.base.joined(&text);
        }
        if chars_over(&text, cap).is_some() {
            self.checked_lines(&text, out);
            return;
        }
        let mut blocks: Vec<&str> = text.split("\n\n").collect();
        let tail = blocks.pop().unwrap_or("");
        let mut last_id = self.last_event_id.clone();
        let mut fast: u64 = 0;
        for block in blocks {
            if !self.pending && block.starts_with("data:") && !block.contains('\n') {
                let value = &block[5..];
                let value = value.strip_prefix(' ').unwrap_or(value);
                out.push(SseEvent {
                    event: Cow::Borrowed("message"),
                    data: value.to_owned(),
                    id: last_id.clone(),
                    retry: None,
                });
                fast = fast.saturating_add(1);
            } else {
                for line in block.split('\n') {
                    self.line(line, out);
                }
                self.dispatch(out);
                last_id = self.last_event_id.clone();
            }
        }
        self.events = self.events.saturating_add(fast);
        if !tail.is_empty() {
            let mut lines: Vec<&str> = tail.split('\n').collect();
            let partial = lines.pop().unwrap_or("");
            for line in lines {
                self.line(line, out);
            }
            if !partial.is_empty() {
                self.base.keep_partial(partial);
            }
        }
    }

    /// Slow path for text longer than the line cap: check every line.
    fn checked_lines(&mut self, text: &str, out: &mut Vec<SseEvent>) {
        let cap = self.base.max_line;
        let mut lines: Vec<&str> = text.split('\n').collect();
        let partial = lines.pop().unwrap_or("");
        for line in lines {
            match chars_over(line, cap) {
                Some(n) => self.overflow(n),
                None => self.line(line, out),
            }
        }
        if let Some(n) = chars_over(partial, cap) {
            self.overflow(n);
            self.base.discard = true;
        } else if !partial.is_empty() {
            self.base.keep_partial(partial);
        }
    }

    fn line(&mut self, line: &str, out: &mut Vec<SseEvent>) {
        if line.is_empty() {
            self.dispatch(out);
            return;
        }
        if line.starts_with(':') {
            self.comments = self.comments.saturating_add(1);
            return;
        }
        self.pending = true;
        let (name, value) = match line.find(':') {
            None => (line, ""),
            Some(c) => {
                let v = &line[c.saturating_add(1)..];
                (&line[..c], v.strip_prefix(' ').unwrap_or(v))
            }
        };
        match name {
            "data" => self.data.push(value.to_owned()),
            "event" => value.clone_into(&mut self.etype),
            "id" if !value.contains('\0') => self.last_event_id = Some(value.to_owned()),
            "retry"
                if !value.is_empty()
                    && value.len() <= MAX_RETRY_DIGITS
                    && value.bytes().all(|b| b.is_ascii_digit()) =>
            {
                self.eretry = Some(value.to_owned());
                self.retry = Some(value.to_owned());
            }
            _ => {}
        }
    }

    fn dispatch(&mut self, out: &mut Vec<SseEvent>) {
        if self.poisoned || self.data.is_empty() {
            self.reset_event();
            return;
        }
        let data = self.data.join("\n");
        let event = if self.etype.is_empty() {
            Cow::Borrowed("message")
        } else {
            Cow::Owned(self.etype.clone())
        };
        out.push(SseEvent {
            event,
            data,
            id: self.last_event_id.clone(),
            retry: self.eretry.clone(),
        });
        self.events = self.events.saturating_add(1);
        self.reset_event();
    }

    fn reset_event(&mut self) {
        self.data.clear();
        self.etype.clear();
        self.eretry = None;
        self.pending = false;
        self.poisoned = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(chunks: &[&[u8]]) -> (Vec<SseEvent>, SseDecoder) {
        let mut d = SseDecoder::default();
        let mut out = Vec::new();
        for c in chunks {
            d.feed(c, &mut out);
        }
        d.close();
        (out, d)
    }

    #[test]
    fn truncated_surrogate_is_held_like_cpython() {
        let mut u = Utf8Stream::default();
        assert_eq!(u.decode(b"data:\xed\xa0", false), "data:");
        assert!(u.pending());
        assert_eq!(u.decode(b"\x80x", false), "\u{fffd}\u{fffd}\u{fffd}x");
        assert!(!u.pending());
        assert_eq!(u.decode(b"\xed\xbf", false), "");
        assert_eq!(u.decode(b"", true), "\u{fffd}\u{fffd}");
        // not a surrogate's start, or not at the end: replaced at once
        assert_eq!(u.decode(b"\xed\xa0y", false), "\u{fffd}\u{fffd}y");
        assert_eq!(u.decode(b"\xee\xa0", false), "");
        assert!(u.pending());
    }

    #[test]
    fn line_ends_bom_and_cut() {
        let (ev, d) = all(&[
            b"\xef\xbb\xbfdata: a\r",
            b"\ndata:b\r\rid: 7\revent: x\ndata: c\n\ndata: cut",
        ]);
        assert_eq!(ev.len(), 2);
        assert_eq!(ev[0].data, "a\nb");
        assert_eq!(ev[1].event, "x");
        assert_eq!(ev[1].id.as_deref(), Some("7"));
        assert!(d.truncated_event);
    }

    #[test]
    fn over_long_line_drops_its_event() {
        let mut d = SseDecoder::new(8);
        let mut out = Vec::new();
        d.feed(b"data: 0123456789\ndata: x\n\ndata: ok\n\n", &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].data, "ok");
        assert_eq!(d.errors(), 1);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 500, ..Default::default() })]

        /// Random and mutated bytes, split anywhere, small caps: no panic, and
        /// the events do not depend on where the bytes were split.
        #[test]
        fn any_bytes_any_split(
            parts in proptest::collection::vec(proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64), 0..12),
            cap in 1usize..40,
        ) {
            let whole: Vec<u8> = parts.concat();
            let mut a = SseDecoder::new(cap);
            let mut b = SseDecoder::new(cap);
            let (mut ea, mut eb) = (Vec::new(), Vec::new());
            a.feed(&whole, &mut ea);
            for p in &parts {
                b.feed(p, &mut eb);
            }
            a.close();
            b.close();
            proptest::prop_assert_eq!(ea, eb);
            proptest::prop_assert_eq!(a.truncated_event, b.truncated_event);
            let mut n = crate::ndjson::NdjsonDecoder::new(cap);
            let mut lines = Vec::new();
            for p in &parts {
                n.feed(p, &mut lines);
            }
            n.close(&mut lines);
        }
    }
}
