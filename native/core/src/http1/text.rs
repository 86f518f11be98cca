//! The texts of the errors, exactly as the Python stages word them.
//!
//! Python parsers quote rejected bytes with `repr()`, and the HTTP stage
//! replaces every quoted run by its length (`core/credentials.py`,
//! `scrub_error_text`): `illegal header line: <31 bytes>`. The native parser
//! never puts the bytes in a message; it writes the scrubbed text directly
//! (`quoted`), so both cores give the same text.

/// What `scrub_error_text` puts in place of one quoted run of bytes:
/// `<N bytes>`, N the number of bytes (it counts those between the repr's
/// quotes, an escape as one).
pub(crate) fn quoted(b: &[u8]) -> String {
    format!("<{} bytes>", b.len())
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
    fn count() {
        assert_eq!(quoted(b"Authorization: x"), "<16 bytes>");
        assert_eq!(quoted(b"a\""), "<2 bytes>");
        assert_eq!(quoted(b"X-Any: \x00'"), "<9 bytes>");
        assert_eq!(quoted(b""), "<0 bytes>");
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
