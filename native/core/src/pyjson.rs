//! JSON as the Python dialects read and write it, for a strict subset.
//!
//! The Python reference parses an item with `orjson.loads` (`json.loads` as
//! the fallback) and re-serialises nested values with
//! `json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode`.
//! [`parse`] accepts only documents on which those agree and whose values
//! this module reproduces exactly; anything else is `None` ("not mine"), and
//! the caller lets the Python reference handle the item:
//!
//! * RFC 8259 syntax only (the four JSON whitespace characters; no NaN, no
//!   BOM, no raw control characters in strings, no trailing data);
//! * integers that fit an `i64`, and not `-0` (wider ones become Python big
//!   integers, or floats from orjson past 64 bits);
//! * finite floats only (`1e400` is infinity in Python);
//! * no lone surrogate escapes (Python keeps them in a `str`, Rust cannot);
//! * no duplicate key in an object (a Python dict keeps the last one, and a
//!   re-serialised object would lose the first);
//! * nesting at most [`MAX_DEPTH`] deep, objects of at most [`MAX_KEYS`] keys.
//!
//! [`dump`] writes a value as that encoder does: compact separators, non-ASCII
//! kept, `"`, `\`, and control characters escaped (`\n`-style where Python has
//! a short escape, `\u00xx` otherwise), floats in Python's `repr`.

use std::borrow::Cow;
use std::fmt::Write as _;

/// Deepest nesting accepted (the top-level value is depth 1).
pub const MAX_DEPTH: usize = 64;
/// Most keys accepted in one object (the duplicate check is quadratic).
pub const MAX_KEYS: usize = 256;
/// Most digits an integer can have (`i64::MAX` has 19); the parse checks the rest.
pub const MAX_INT_DIGITS: usize = 19;

/// A parsed JSON value; strings borrow from the input unless they had escapes.
#[derive(Debug, Clone, PartialEq)]
pub enum Value<'a> {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(Cow<'a, str>),
    Array(Vec<Value<'a>>),
    /// Keys in document order, none twice.
    Object(Vec<(Cow<'a, str>, Value<'a>)>),
}

impl<'a> Value<'a> {
    /// The member `key` of an object (`None`: absent, or not an object).
    pub fn get(&self, key: &str) -> Option<&Value<'a>> {
        match self {
            Value::Object(members) => members.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// `obj.get(key)` in Python terms: absent and `null` are both `None`.
    pub fn get_some(&self, key: &str) -> Option<&Value<'a>> {
        self.get(key).filter(|v| !matches!(v, Value::Null))
    }

    /// Whether the object has the member `key` (whatever its value).
    pub fn has(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// The value as a string, when it is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }
}

/// Parses `text` as one JSON document of the accepted subset (see the module).
pub fn parse(text: &str) -> Option<Value<'_>> {
    let mut p = Parser::new(text);
    p.ws();
    let v = p.value::<true>(1)?;
    p.end().then_some(v)
}

/// The bytes that end a run of plain string characters: a quote, a
/// backslash, a control character.
static STOPS: [bool; 256] = {
    let mut t = [false; 256];
    let mut c = 0;
    while c < 0x20 {
        t[c] = true;
        c += 1;
    }
    t[b'"' as usize] = true;
    t[b'\\' as usize] = true;
    t
};

/// `0x0101…01`: one in every byte of a word (for the 8-byte string scan).
const ONES: u64 = u64::from_le_bytes([1; 8]);
/// `0x8080…80`: the high bit of every byte.
const HIGHS: u64 = u64::from_le_bytes([0x80; 8]);

/// The first byte of the 8 of `w` (little-endian) that is a quote, a
/// backslash or a control character (`STOPS`), if any: the classic "has a byte
/// less than n" word tricks, whose lowest flagged byte is exact (a false flag
/// can only follow a true one).
fn word_stop(w: u64) -> Option<usize> {
    let below = |x: u64, n: u8| x.wrapping_sub(ONES.wrapping_mul(u64::from(n))) & !x & HIGHS;
    let quote = w ^ ONES.wrapping_mul(u64::from(b'"'));
    let backslash = w ^ ONES.wrapping_mul(u64::from(b'\\'));
    let m = below(w, 0x20) | below(quote, 1) | below(backslash, 1);
    (m != 0).then(|| (m.trailing_zeros() / 8) as usize)
}

/// The parser of the subset. Every rule of the subset is checked here, once:
/// [`Parser::value`] builds a [`Value`] or, for a member nobody reads, only
/// checks it (same code, the building switched off), and the walkers
/// [`Parser::members`] / [`Parser::items`] let a caller (the OpenAI
/// extraction) read a document's shape directly, member by member.
pub struct Parser<'a> {
    s: &'a str,
    b: &'a [u8],
    i: usize,
    /// The keys of the objects being read, innermost last (the duplicate
    /// check), reused from object to object: checking an object allocates
    /// nothing.
    keys: Vec<Cow<'a, str>>,
}

impl<'a> Parser<'a> {
    /// A parser at the start of `text`.
    pub fn new(text: &'a str) -> Self {
        Parser {
            s: text,
            b: text.as_bytes(),
            i: 0,
            // made at the first object's first key (`members`)
            keys: Vec::new(),
        }
    }

    /// Whether only whitespace is left (then the document is complete).
    pub fn end(&mut self) -> bool {
        self.ws();
        self.i == self.b.len()
    }

    /// The next byte (after whitespace skipped by the caller).
    pub fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    /// Past the byte at the cursor.
    pub fn bump(&mut self) {
        self.i = self.i.saturating_add(1);
    }

    /// Past JSON whitespace.
    pub fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.bump();
        }
    }

    /// Past the byte `c` when it is the next one, else `None`.
    pub fn eat(&mut self, c: u8) -> Option<()> {
        if self.peek() == Some(c) {
            self.bump();
            Some(())
        } else {
            None
        }
    }

    fn literal(&mut self, word: &[u8], v: Value<'a>) -> Option<Value<'a>> {
        let end = self.i.checked_add(word.len())?;
        if self.b.get(self.i..end)? == word {
            self.i = end;
            Some(v)
        } else {
            None
        }
    }

    /// One value at nesting `depth` (the top level is 1). `KEEP`: build it;
    /// else only check it (the subset's rules all the same) and give `Null`
    /// for an array or object, whose items are dropped as they are read.
    pub fn value<const KEEP: bool>(&mut self, depth: usize) -> Option<Value<'a>> {
        if depth > MAX_DEPTH {
            return None;
        }
        match self.peek()? {
            b'{' => {
                let mut members = Vec::new();
                self.members(depth, |p, key, d| {
                    let v = p.value::<KEEP>(d)?;
                    if KEEP {
                        if members.capacity() == 0 {
                            members.reserve_exact(8);
                        }
                        members.push((key.clone(), v));
                    }
                    Some(())
                })?;
                Some(if KEEP {
                    Value::Object(members)
                } else {
                    Value::Null
                })
            }
            b'[' => {
                let mut items = Vec::new();
                self.items(depth, |p, _, d| {
                    let v = p.value::<KEEP>(d)?;
                    if KEEP {
                        items.push(v);
                    }
                    Some(())
                })?;
                Some(if KEEP {
                    Value::Array(items)
                } else {
                    Value::Null
                })
            }
            b'"' => self.string().map(Value::Str),
            b't' => self.literal(b"true", Value::Bool(true)),
            b'f' => self.literal(b"false", Value::Bool(false)),
            b'n' => self.literal(b"null", Value::Null),
            b'-' | b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    /// The object at the cursor (which must be at its `{`), at nesting
    /// `depth`: for each member, `member(parser, key, depth of the value)`
    /// reads the value (it must read exactly one, e.g. with [`Self::value`]).
    /// `None` when the object breaks a rule (or `member` gives `None`).
    pub fn members<F>(&mut self, depth: usize, mut member: F) -> Option<()>
    where
        F: FnMut(&mut Self, &Cow<'a, str>, usize) -> Option<()>,
    {
        if depth > MAX_DEPTH {
            return None;
        }
        self.eat(b'{')?;
        let inner = depth.checked_add(1)?;
        let base = self.keys.len();
        self.ws();
        if self.eat(b'}').is_some() {
            return Some(());
        }
        loop {
            self.ws();
            if self.peek() != Some(b'"') {
                return None;
            }
            let key = self.string()?;
            let seen = self.keys.get(base..)?;
            if seen.len() >= MAX_KEYS || seen.contains(&key) {
                return None;
            }
            self.ws();
            self.eat(b':')?;
            self.ws();
            member(self, &key, inner)?;
            if self.keys.capacity() == 0 {
                // room for a chunk's keys of all levels at once: one allocation
                self.keys.reserve(16);
            }
            self.keys.push(key);
            self.ws();
            match self.peek()? {
                b',' => self.bump(),
                b'}' => {
                    self.bump();
                    self.keys.truncate(base);
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// The array at the cursor (at its `[`), at nesting `depth`: for each
    /// item, `item(parser, position, depth of the item)` reads it.
    pub fn items<F>(&mut self, depth: usize, mut item: F) -> Option<()>
    where
        F: FnMut(&mut Self, usize, usize) -> Option<()>,
    {
        if depth > MAX_DEPTH {
            return None;
        }
        self.eat(b'[')?;
        let inner = depth.checked_add(1)?;
        self.ws();
        if self.eat(b']').is_some() {
            return Some(());
        }
        let mut position: usize = 0;
        loop {
            self.ws();
            item(self, position, inner)?;
            position = position.saturating_add(1);
            self.ws();
            match self.peek()? {
                b',' => self.bump(),
                b']' => {
                    self.bump();
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    fn digits(&mut self) -> usize {
        let rest = self.b.get(self.i..).unwrap_or_default();
        let n = rest
            .iter()
            .position(|c| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        self.i = self.i.saturating_add(n);
        n
    }

    fn number(&mut self) -> Option<Value<'a>> {
        let start = self.i;
        let negative = self.eat(b'-').is_some();
        let int_start = self.i;
        let n = self.digits();
        if n == 0 || (n > 1 && self.b.get(int_start) == Some(&b'0')) {
            return None;
        }
        let mut float = false;
        if self.eat(b'.').is_some() {
            if self.digits() == 0 {
                return None;
            }
            float = true;
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.bump();
            if let Some(b'+' | b'-') = self.peek() {
                self.bump();
            }
            if self.digits() == 0 {
                return None;
            }
            float = true;
        }
        let text = self.s.get(start..self.i)?;
        if float {
            let f: f64 = text.parse().ok()?;
            return f.is_finite().then_some(Value::Float(f));
        }
        if n > MAX_INT_DIGITS || (negative && text == "-0") {
            return None;
        }
        text.parse().ok().map(Value::Int)
    }

    fn hex4(&mut self) -> Option<u32> {
        let end = self.i.checked_add(4)?;
        let h = self.s.get(self.i..end)?;
        if !h.bytes().all(|c| c.is_ascii_hexdigit()) {
            return None;
        }
        self.i = end;
        u32::from_str_radix(h, 16).ok()
    }

    /// Past the characters that stand for themselves in a string: up to a
    /// quote, a backslash, a control character or the end.
    fn plain_run(&mut self) {
        let mut i = self.i;
        // 8 bytes at a time, then byte by byte for the last few
        while let Some(w) = self.b.get(i..i.saturating_add(8)) {
            let w = <[u8; 8]>::try_from(w).map_or(0, u64::from_le_bytes);
            if let Some(n) = word_stop(w) {
                self.i = i.saturating_add(n);
                return;
            }
            i = i.saturating_add(8);
        }
        while let Some(&c) = self.b.get(i) {
            if STOPS[usize::from(c)] {
                break;
            }
            i = i.saturating_add(1);
        }
        self.i = i;
    }

    /// A string starting at the opening quote.
    pub fn string(&mut self) -> Option<Cow<'a, str>> {
        self.bump(); // '"'
        let start = self.i;
        // the fast path: no escape (the common case), borrowed
        self.plain_run();
        if self.peek()? == b'"' {
            let s = self.s.get(start..self.i)?;
            self.bump();
            return Some(Cow::Borrowed(s));
        }
        self.escaped(start).map(Cow::Owned)
    }

    /// The object key at the cursor (its opening quote) when it is one of
    /// `keys` written plainly, byte for byte: its position in `keys`, the
    /// cursor past the key's closing quote. `None` (the cursor unmoved) for
    /// anything else: another key, or one written with an escape. The keys
    /// hold no quote, backslash nor control character, so a string whose
    /// bytes up to the first quote are one of them is exactly that key.
    pub fn plain_key(&mut self, keys: &[&[u8]]) -> Option<usize> {
        if self.peek()? != b'"' {
            return None;
        }
        let body = self.b.get(self.i.checked_add(1)?..)?;
        let n = keys
            .iter()
            .position(|k| body.get(k.len()) == Some(&b'"') && body.starts_with(k))?;
        let len = keys.get(n)?.len();
        self.i = self.i.checked_add(len)?.checked_add(2)?;
        Some(n)
    }

    /// The rest of a string that is not plain (an escape or a control
    /// character at the cursor), its text from `start`: out of line, for
    /// the plain strings' path to stay short.
    #[inline(never)]
    fn escaped(&mut self, start: usize) -> Option<String> {
        let mut out = String::from(self.s.get(start..self.i)?);
        loop {
            let run = self.i;
            self.plain_run();
            out.push_str(self.s.get(run..self.i)?);
            if self.peek()? == b'"' {
                self.bump();
                return Some(out);
            }
            if self.peek()? != b'\\' {
                return None; // a control character
            }
            self.bump();
            let c = self.peek()?;
            self.bump();
            match c {
                b'"' => out.push('"'),
                b'\\' => out.push('\\'),
                b'/' => out.push('/'),
                b'b' => out.push('\u{8}'),
                b'f' => out.push('\u{c}'),
                b'n' => out.push('\n'),
                b'r' => out.push('\r'),
                b't' => out.push('\t'),
                b'u' => {
                    let hi = self.hex4()?;
                    let code = if (0xD800..0xDC00).contains(&hi) {
                        // a high surrogate: only a following low one makes a character
                        self.eat(b'\\')?;
                        self.eat(b'u')?;
                        let lo = self.hex4()?;
                        if !(0xDC00..0xE000).contains(&lo) {
                            return None;
                        }
                        let high = hi.checked_sub(0xD800)?.checked_shl(10)?;
                        high.checked_add(lo.checked_sub(0xDC00)?)?
                            .checked_add(0x10000)?
                    } else if (0xDC00..0xE000).contains(&hi) {
                        return None;
                    } else {
                        hi
                    };
                    out.push(char::from_u32(code)?);
                }
                _ => return None,
            }
        }
    }
}

/// `value` as Python's compact, non-ASCII-keeping encoder writes it.
pub fn dump(value: &Value<'_>) -> String {
    let mut out = String::new();
    dump_into(value, &mut out);
    out
}

fn dump_into(value: &Value<'_>, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Int(i) => {
            let _ = write!(out, "{i}");
        }
        Value::Float(f) => float_repr(*f, out),
        Value::Str(s) => dump_str(s, out),
        Value::Array(items) => {
            out.push('[');
            for (n, v) in items.iter().enumerate() {
                if n > 0 {
                    out.push(',');
                }
                dump_into(v, out);
            }
            out.push(']');
        }
        Value::Object(members) => {
            out.push('{');
            for (n, (k, v)) in members.iter().enumerate() {
                if n > 0 {
                    out.push(',');
                }
                dump_str(k, out);
                out.push(':');
                dump_into(v, out);
            }
            out.push('}');
        }
    }
}

fn dump_str(s: &str, out: &mut String) {
    out.push('"');
    let mut run = 0;
    for (i, c) in s.char_indices() {
        let esc = match c {
            '"' => "\\\"",
            '\\' => "\\\\",
            '\n' => "\\n",
            '\r' => "\\r",
            '\t' => "\\t",
            '\u{8}' => "\\b",
            '\u{c}' => "\\f",
            c if (c as u32) < 0x20 => "",
            _ => continue,
        };
        out.push_str(s.get(run..i).unwrap_or_default());
        if esc.is_empty() {
            let _ = write!(out, "\\u{:04x}", c as u32);
        } else {
            out.push_str(esc);
        }
        run = i.saturating_add(c.len_utf8());
    }
    out.push_str(s.get(run..).unwrap_or_default());
    out.push('"');
}

/// A finite float as Python's `repr` writes it: the shortest digits that read
/// back to it, positional for decimal exponents -4 < e < 16 (with `.0` when
/// integral), else `d.ddde±XX`.
pub fn float_repr(f: f64, out: &mut String) {
    // Rust's `{:e}` gives the shortest round-trip digits too ("-1.2345e-5"),
    // but breaks a tie between two closest such strings away from zero where
    // Python's dtoa takes the even one: the exactly (half-even) rounded string
    // of as many digits is Python's whenever it reads back to `f`.
    let mut sci = format!("{f:e}");
    let n = sci
        .split_once('e')
        .map_or(0, |(m, _)| m.bytes().filter(u8::is_ascii_digit).count());
    if n > 1 {
        let exact = format!("{f:.*e}", n.saturating_sub(1));
        if exact != sci && exact.parse::<f64>().ok() == Some(f) {
            sci = exact;
        }
    }
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    out.push_str(sign);
    // the decimal point sits after `point` digits
    let point = exp.saturating_add(1);
    let len = i32::try_from(digits.len()).unwrap_or(i32::MAX);
    if !(-3..=16).contains(&point) {
        let (first, rest) = digits.split_at(1.min(digits.len()));
        out.push_str(first);
        if !rest.is_empty() {
            out.push('.');
            out.push_str(rest);
        }
        let _ = write!(
            out,
            "e{}{:02}",
            if exp < 0 { '-' } else { '+' },
            exp.unsigned_abs()
        );
    } else if point <= 0 {
        out.push_str("0.");
        for _ in 0..point.unsigned_abs() {
            out.push('0');
        }
        out.push_str(&digits);
    } else if point >= len {
        out.push_str(&digits);
        for _ in 0..point.saturating_sub(len) {
            out.push('0');
        }
        out.push_str(".0");
    } else {
        let (a, b) = digits.split_at(usize::try_from(point).unwrap_or(0));
        out.push_str(a);
        out.push('.');
        out.push_str(b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repr(f: f64) -> String {
        let mut s = String::new();
        float_repr(f, &mut s);
        s
    }

    #[test]
    fn floats_as_python_reprs_them() {
        for (f, want) in [
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-0.5, "-0.5"),
            (1e16, "1e+16"),
            (9999999999999998.0, "9999999999999998.0"),
            (1e15, "1000000000000000.0"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (123.456, "123.456"),
            (1e22, "1e+22"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (5e-324, "5e-324"),
            (-2.5e-300, "-2.5e-300"),
            (-1.371_284_484_863_281_2, "-1.3712844848632812"), // a tie: half-even
        ] {
            assert_eq!(repr(f), want, "{f:e}");
        }
    }

    #[test]
    fn the_subset() {
        assert_eq!(
            parse(" {\"a\": [1, -2.5, true, null, \"x\"]}\n")
                .map(|v| dump(&v))
                .as_deref(),
            Some("{\"a\":[1,-2.5,true,null,\"x\"]}")
        );
        for bad in [
            "",
            "{",
            "{}x",
            "[1,]",
            "{\"a\":1,}",
            "01",
            "-0",
            "1.",
            ".5",
            "1e",
            "NaN",
            "1e400",
            "\u{feff}{}",
            "\"\\ud800\"",
            "\"\\udc00\"",
            "\"a\u{1}\"",
            "{\"a\":1,\"a\":2}",
            "9223372036854775808",
            "-9223372036854775809",
            "12345678901234567890",
            "\"\\x\"",
            "[1 2]",
            "tru",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
        assert_eq!(parse("9223372036854775807"), Some(Value::Int(i64::MAX)));
        assert_eq!(parse("-9223372036854775808"), Some(Value::Int(i64::MIN)));
        assert_eq!(
            parse("\"\\ud83d\\ude00\\u00e9\\n\\/\""),
            Some(Value::Str(Cow::Owned("\u{1F600}\u{e9}\n/".into())))
        );
        let deep = "[".repeat(MAX_DEPTH) + &"]".repeat(MAX_DEPTH);
        assert!(parse(&deep).is_some());
        let deeper = "[".repeat(MAX_DEPTH + 1) + &"]".repeat(MAX_DEPTH + 1);
        assert_eq!(parse(&deeper), None);
    }

    #[test]
    fn strings_escaped_as_python_does() {
        let v = Value::Str(Cow::Borrowed(
            "a\"b\\c\n\r\t\u{8}\u{c}\u{1}\u{1f}\u{7f}é\u{2028}😀",
        ));
        assert_eq!(
            dump(&v),
            "\"a\\\"b\\\\c\\n\\r\\t\\b\\f\\u0001\\u001f\u{7f}é\u{2028}😀\""
        );
    }
}
