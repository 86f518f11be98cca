//! Line-delimited JSON (`application/x-ndjson`, JSON Lines) framing: a port,
//! exactly, of `NdjsonDecoder` in `sniffer/core/sse.py`. Complete lines out
//! (line end removed, CRLF tolerated); blank or whitespace-only lines skipped;
//! a final line without a newline is returned by `close()`.

use crate::http1::text::py_isspace;
use crate::sse::{chars_over, LineDecoder, DEFAULT_MAX_LINE};

#[derive(Debug, Clone)]
pub struct NdjsonDecoder {
    base: LineDecoder,
    pub lines: u64,
}

impl Default for NdjsonDecoder {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_LINE)
    }
}

impl NdjsonDecoder {
    pub fn new(max_line: usize) -> Self {
        NdjsonDecoder {
            base: LineDecoder::new(max_line),
            lines: 0,
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
    pub fn idle(&self) -> bool {
        self.base.idle()
    }

    /// Decode more body bytes; the complete lines they finish go to `out`.
    pub fn feed(&mut self, data: &[u8], out: &mut Vec<String>) {
        if self.base.closed {
            self.base.error("data fed after close()".into());
            return;
        }
        let text = self.base.utf8.decode(data, false);
        if text.is_empty() {
            return;
        }
        self.text(text, false, out);
    }

    /// End of body: the final line if it had no newline.
    pub fn close(&mut self, out: &mut Vec<String>) {
        if self.base.closed {
            return;
        }
        let tail = self.base.utf8.decode(&[], true);
        self.text(tail, true, out);
        self.base.closed = true;
    }

    fn text(&mut self, mut text: String, fin: bool, out: &mut Vec<String>) {
        if !text.is_empty() && !self.base.started {
            self.base.started = true;
            if text.starts_with('\u{feff}') {
                text.drain(..'\u{feff}'.len_utf8());
            }
        }
        if self.base.discard && !text.is_empty() {
            let Some(i) = text.find('\n') else { return };
            self.base.discard = false;
            text.drain(..=i);
        }
        if !fin && !text.contains('\n') {
            if let Some(n) = self.base.hold(&text) {
                self.base.overflow_message(n);
            }
            return;
        }
        if self.base.has_pieces {
            text = self.base.joined(&text);
        }
        let cap = self.base.max_line;
        let mut lines: Vec<&str> = text.split('\n').collect();
        let partial = if fin { "" } else { lines.pop().unwrap_or("") };
        let before = out.len();
        for line in lines {
            if let Some(n) = chars_over(line, cap) {
                self.base.overflow_message(n);
                continue;
            }
            let line = line.strip_suffix('\r').unwrap_or(line);
            if !line.is_empty() && !line.chars().all(py_isspace) {
                out.push(line.to_owned());
            }
        }
        if !partial.is_empty() {
            if let Some(n) = chars_over(partial, cap) {
                self.base.overflow_message(n);
                self.base.discard = true;
            } else {
                self.base.keep_partial(partial);
            }
        }
        self.lines = self
            .lines
            .saturating_add(out.len().saturating_sub(before) as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_and_final() {
        let mut d = NdjsonDecoder::default();
        let mut out = Vec::new();
        d.feed(b"{\"a\":1}\r\n  \n{\"b\"", &mut out);
        d.feed(b":2}", &mut out);
        d.close(&mut out);
        assert_eq!(out, vec!["{\"a\":1}".to_string(), "{\"b\":2}".to_string()]);
        assert_eq!(d.lines, 2);
    }
}
