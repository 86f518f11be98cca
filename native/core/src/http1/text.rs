//! The texts of the errors, exactly as the Python stages word them.
//!
//! Python parsers quote rejected bytes with `repr()`, and the HTTP stage
//! replaces every quoted run by its length (`core/credentials.py`,
//! `scrub_error_text`): `illegal header line: <31 bytes>`. The native parser
//! never puts the bytes in a message; it writes the scrubbed text directly,
//! counting the way `scrub_error_text` counts (including its quirks at a
//! trailing quote or parenthesis), so both cores give the same text.

/// `repr(bytes)` (or `repr(bytearray)`) as Python 3 writes it.
pub(crate) fn py_bytes_repr(b: &[u8], bytearray: bool) -> String {
    let quote = if b.contains(&b'\'') && !b.contains(&b'"') {
        '"'
    } else {
        '\''
    };
    let mut s = String::with_capacity(b.len().saturating_add(16));
    if bytearray {
        s.push_str("bytearray(");
    }
    s.push('b');
    s.push(quote);
    for &c in b {
        match c {
            b'\\' => s.push_str("\\\\"),
            b'\t' => s.push_str("\\t"),
            b'\n' => s.push_str("\\n"),
            b'\r' => s.push_str("\\r"),
            _ if char::from(c) == quote => {
                s.push('\\');
                s.push(quote);
            }
            0x20..=0x7e => s.push(char::from(c)),
            _ => s.push_str(&format!("\\x{c:02x}")),
        }
    }
    s.push(quote);
    if bytearray {
        s.push(')');
    }
    s
}

/// What `scrub_error_text` puts in place of one quoted run: `<N bytes>`,
/// with N counted as its `_bytes_len` counts.
pub(crate) fn quoted(b: &[u8], bytearray: bool) -> String {
    let text = py_bytes_repr(b, bytearray);
    // start: the first "b'" unless a 'b"' comes before it
    let sq = text.find("b'");
    let dq = text.find("b\"");
    let start = match (sq, dq) {
        (Some(s), Some(d)) if d < s => d,
        (Some(s), _) => s,
        (None, Some(d)) => d,
        (None, None) => 0,
    };
    let body = text.get(start.saturating_add(2)..).unwrap_or("");
    let body = body.trim_end_matches(')').trim_end_matches(['\'', '"']);
    let bytes = body.as_bytes();
    let mut n: usize = 0;
    let mut i: usize = 0;
    while i < bytes.len() {
        let step = if bytes[i] == b'\\' {
            match bytes.get(i.saturating_add(1)) {
                Some(b'x')
                    if bytes
                        .get(i.saturating_add(2)..i.saturating_add(4))
                        .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) =>
                {
                    4
                }
                Some(_) => 2,
                None => 1,
            }
        } else {
            1
        };
        n = n.saturating_add(1);
        i = i.saturating_add(step);
    }
    format!("<{n} bytes>")
}

/// Python's `str.isspace()` for a character decoded from latin-1 or UTF-8.
pub(crate) fn py_isspace(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python's `str.isprintable()` for one character of the latin-1 range.
fn latin1_printable(c: char) -> bool {
    !matches!(c, '\0'..='\u{1f}' | '\u{7f}'..='\u{a0}' | '\u{ad}')
}

/// `repr(str)` for a text of latin-1 characters (decoded header values).
pub(crate) fn py_str_repr_latin1(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len().saturating_add(2));
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            _ if c == quote => {
                out.push('\\');
                out.push(c);
            }
            _ if (c as u32) < 0x100 && !latin1_printable(c) => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            _ => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// latin-1 bytes → text (what `bytes.decode("latin-1")` gives).
pub fn latin1(b: &[u8]) -> String {
    b.iter().map(|&c| char::from(c)).collect()
}

/// Python's `f"{v:g}"` for a float.
pub(crate) fn format_g(v: f64) -> String {
    if v.is_nan() {
        return "nan".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if v == 0.0 {
        return if v.is_sign_negative() {
            "-0".into()
        } else {
            "0".into()
        };
    }
    let sci = format!("{v:.5e}"); // d.ddddde[-]x
    let (mant, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-4..6).contains(&exp) {
        let decimals = usize::try_from(5i32.saturating_sub(exp)).unwrap_or(0);
        let fixed = format!("{v:.decimals$}");
        if fixed.contains('.') {
            fixed
                .trim_end_matches('0')
                .trim_end_matches('.')
                .to_string()
        } else {
            fixed
        }
    } else {
        let m = if mant.contains('.') {
            mant.trim_end_matches('0').trim_end_matches('.')
        } else {
            mant
        };
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{m}e{sign}{:02}", exp.unsigned_abs())
    }
}

/// Python's `bytes.strip()` (ASCII whitespace).
pub(crate) fn strip_ascii_ws(b: &[u8]) -> &[u8] {
    let ws = |c: &u8| matches!(c, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c);
    let start = b.iter().position(|c| !ws(c)).unwrap_or(b.len());
    let end = b
        .iter()
        .rposition(|c| !ws(c))
        .map_or(start, |e| e.saturating_add(1));
    b.get(start..end).unwrap_or(&[])
}

/// Python's `str.strip()` of a latin-1 text (as bytes): ASCII whitespace,
/// `\x1c`–`\x1f`, `\x85` and `\xa0` count.
pub(crate) fn strip_latin1_ws(b: &[u8]) -> &[u8] {
    let ws = |c: &u8| py_isspace(char::from(*c));
    let start = b.iter().position(|c| !ws(c)).unwrap_or(b.len());
    let end = b
        .iter()
        .rposition(|c| !ws(c))
        .map_or(start, |e| e.saturating_add(1));
    b.get(start..end).unwrap_or(&[])
}

/// Python's `str.lower()` of a latin-1 text (as bytes).
pub(crate) fn lower_latin1(b: &[u8]) -> Vec<u8> {
    b.iter()
        .map(|&c| match c {
            b'A'..=b'Z' => c.saturating_add(32),
            0xc0..=0xde if c != 0xd7 => c.saturating_add(32),
            _ => c,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repr_and_count() {
        assert_eq!(py_bytes_repr(b"a'b", false), "b\"a'b\"");
        assert_eq!(py_bytes_repr(b"a'\"", false), "b'a\\'\"'");
        assert_eq!(
            py_bytes_repr(b"\x00\r\n", true),
            "bytearray(b'\\x00\\r\\n')"
        );
        assert_eq!(quoted(b"Authorization: x", true), "<16 bytes>");
        assert_eq!(quoted(b"a\"", false), "<1 bytes>"); // the reference's rstrip quirk
        assert_eq!(quoted(b"", false), "<0 bytes>");
    }

    #[test]
    fn g_format() {
        assert_eq!(format_g(100.0), "100");
        assert_eq!(format_g(2.5), "2.5");
        assert_eq!(format_g(1e6), "1e+06");
        assert_eq!(format_g(123456.0), "123456");
        assert_eq!(format_g(0.0001), "0.0001");
        assert_eq!(format_g(0.00001), "1e-05");
        assert_eq!(format_g(1.0 / 3.0), "0.333333");
    }
}
