//! Message heads (RFC 9112 §2–§5) and body framing (§6.3): pure functions.
//!
//! A port of the head parser of `sniffer/core/http1.py` (grammar and error
//! texts those of h11 0.16 for received messages). The regular expressions
//! there are written out here as scanners with the same result on every input.

use super::text::{latin1, lower_latin1, quoted, strip_ascii_ws};

/// `(lower-case name, value)` in wire order (bytes; latin-1 when shown).
pub type Headers = Vec<(Vec<u8>, Vec<u8>)>;

/// A Content-Length or chunk size above this is malformed framing.
pub const MAX_BODY_LENGTH: u64 = (1u64 << 62) - 1;
const MAX_LENGTH_DIGITS: usize = 20;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    pub method: Vec<u8>,
    pub target: Vec<u8>,
    pub version: Vec<u8>,
    pub headers: Headers,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHead {
    pub version: Vec<u8>,
    pub status: u16,
    pub reason: Vec<u8>,
    pub headers: Headers,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Head {
    Request(RequestHead),
    Response(ResponseHead),
}

/// A head that is not HTTP/1.x; the text is the reference's, scrubbed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeadError(pub String);

fn err<T>(msg: impl Into<String>) -> Result<T, HeadError> {
    Err(HeadError(msg.into()))
}

pub(crate) fn is_token(b: u8) -> bool {
    b.is_ascii_alphanumeric()
        || matches!(
            b,
            b'-' | b'!'
                | b'#'
                | b'$'
                | b'%'
                | b'&'
                | b'\''
                | b'*'
                | b'+'
                | b'.'
                | b'^'
                | b'_'
                | b'`'
                | b'|'
                | b'~'
        )
}

/// Python's bytes-regex `\s`.
pub(crate) fn is_re_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c)
}

/// A byte of a field value or reason phrase: VCHAR, obs-text, space or tab.
fn is_value_byte(b: u8) -> bool {
    !matches!(b, 0 | b'\n' | b'\r' | 0x0b | 0x0c)
}

/// The end of the first blank line (`\n\r?\n`), if any.
fn blank_line_end(buf: &[u8]) -> Option<usize> {
    let mut from = 0usize;
    while let Some(off) = buf
        .get(from..)
        .and_then(|s| s.iter().position(|&b| b == b'\n'))
    {
        let i = from.saturating_add(off);
        match (buf.get(i.saturating_add(1)), buf.get(i.saturating_add(2))) {
            (Some(b'\n'), _) => return Some(i.saturating_add(2)),
            (Some(b'\r'), Some(b'\n')) => return Some(i.saturating_add(3)),
            _ => {}
        }
        from = i.saturating_add(1);
    }
    None
}

/// Remove one head from `buf`; its lines without line ends, or `None`.
pub fn take_head_lines(buf: &mut Vec<u8>) -> Option<Vec<Vec<u8>>> {
    if buf.first() == Some(&b'\n') {
        buf.drain(..1);
        return Some(Vec::new());
    }
    if buf.starts_with(b"\r\n") {
        buf.drain(..2);
        return Some(Vec::new());
    }
    let end = blank_line_end(buf)?;
    let head: Vec<u8> = buf.drain(..end).collect();
    let mut lines: Vec<Vec<u8>> = head.split(|&b| b == b'\n').map(<[u8]>::to_vec).collect();
    lines.truncate(lines.len().saturating_sub(2));
    for line in &mut lines {
        if line.last() == Some(&b'\r') {
            line.pop();
        }
    }
    Some(lines)
}

fn parse_field_line(line: &[u8]) -> Option<(Vec<u8>, Vec<u8>)> {
    let colon = line.iter().position(|&b| !is_token(b))?;
    if colon == 0 || line.get(colon) != Some(&b':') {
        return None;
    }
    let rest = line.get(colon.saturating_add(1)..)?;
    let sp = |b: &u8| *b == b' ' || *b == b'\t';
    let start = rest.iter().position(|b| !sp(b)).unwrap_or(rest.len());
    let end = rest
        .iter()
        .rposition(|b| !sp(b))
        .map_or(start, |e| e.saturating_add(1));
    let value = rest.get(start..end)?;
    if !value.iter().all(|&b| is_value_byte(b)) {
        return None;
    }
    Some((line.get(..colon)?.to_vec(), value.to_vec()))
}

fn field_lines(lines: &[Vec<u8>]) -> Result<Headers, HeadError> {
    let mut folded: Vec<Vec<u8>> = Vec::with_capacity(lines.len());
    for line in lines {
        let ws = line
            .iter()
            .take_while(|&&b| b == b' ' || b == b'\t')
            .count();
        if ws == 0 {
            folded.push(line.clone());
        } else if let Some(last) = folded.last_mut() {
            last.push(b' ');
            last.extend_from_slice(line.get(ws..).unwrap_or(&[]));
        } else {
            return err("continuation line at start of headers");
        }
    }
    let mut fields = Vec::with_capacity(folded.len());
    for line in &folded {
        match parse_field_line(line) {
            Some(f) => fields.push(f),
            None => return err(format!("illegal header line: {}", quoted(line))),
        }
    }
    Ok(fields)
}

fn all_digits(b: &[u8]) -> bool {
    !b.is_empty() && b.iter().all(u8::is_ascii_digit)
}

/// Lower-case names; one Content-Length value and one Transfer-Encoding
/// (`chunked`), or the head is malformed framing.
fn normalise(fields: Headers) -> Result<Headers, HeadError> {
    let mut out: Headers = Vec::with_capacity(fields.len());
    let mut length: Option<Vec<u8>> = None;
    let mut chunked = false;
    for (raw_name, value) in fields {
        let name = raw_name.to_ascii_lowercase();
        let mut value = value;
        if name == b"content-length" {
            let mut distinct: Vec<&[u8]> = Vec::new();
            for v in value.split(|&b| b == b',') {
                let v = strip_ascii_ws(v);
                if !distinct.contains(&v) {
                    distinct.push(v);
                }
            }
            if distinct.len() != 1 {
                return err("conflicting Content-Length headers");
            }
            let one = distinct.first().map(|v| v.to_vec()).unwrap_or_default();
            if !all_digits(&one) || one.len() > MAX_LENGTH_DIGITS {
                return err("bad Content-Length");
            }
            if let Some(seen) = &length {
                if *seen != one {
                    return err("conflicting Content-Length headers");
                }
                continue;
            }
            length = Some(one.clone());
            value = one;
        } else if name == b"transfer-encoding" {
            if chunked {
                return err("multiple Transfer-Encoding headers");
            }
            let lower = value.to_ascii_lowercase();
            if lower != b"chunked" {
                return err("Only Transfer-Encoding: chunked is supported");
            }
            chunked = true;
            value = lower;
        }
        out.push((name, value));
    }
    Ok(out)
}

fn request_line(line: &[u8]) -> Option<(Vec<u8>, Vec<u8>, Vec<u8>)> {
    let sp = line.iter().position(|&b| !is_token(b))?;
    if sp == 0 || line.get(sp) != Some(&b' ') {
        return None;
    }
    let after = line.get(sp.saturating_add(1)..)?;
    let tlen = after
        .iter()
        .take_while(|&&b| (0x21..=0x7e).contains(&b))
        .count();
    if tlen == 0 {
        return None;
    }
    let v = after.get(tlen..)?;
    if v.len() != 9
        || !v.starts_with(b" HTTP/")
        || !v[6].is_ascii_digit()
        || v[7] != b'.'
        || !v[8].is_ascii_digit()
    {
        return None;
    }
    Some((
        line.get(..sp)?.to_vec(),
        after.get(..tlen)?.to_vec(),
        v.get(6..)?.to_vec(),
    ))
}

fn status_line(line: &[u8]) -> Option<(Vec<u8>, u16, Vec<u8>)> {
    if line.len() < 12
        || !line.starts_with(b"HTTP/")
        || !line[5].is_ascii_digit()
        || line[6] != b'.'
        || !line[7].is_ascii_digit()
        || line[8] != b' '
        || !line[9..12].iter().all(u8::is_ascii_digit)
    {
        return None;
    }
    let status = line[9..12].iter().fold(0u16, |a, &d| {
        a.saturating_mul(10)
            .saturating_add(u16::from(d.wrapping_sub(b'0')))
    });
    let reason = match line.get(12..) {
        Some([]) | None => Vec::new(),
        Some([b' ', rest @ ..]) if rest.iter().all(|&b| is_value_byte(b)) => rest.to_vec(),
        Some(_) => return None,
    };
    Some((line[5..8].to_vec(), status, reason))
}

pub fn parse_request_head(lines: &[Vec<u8>]) -> Result<RequestHead, HeadError> {
    let Some(first) = lines.first() else {
        return err("no request line received");
    };
    let Some((method, target, version)) = request_line(first) else {
        return err(format!("illegal request line: {}", quoted(first)));
    };
    let headers = normalise(field_lines(lines.get(1..).unwrap_or(&[]))?)?;
    let hosts = headers.iter().filter(|(n, _)| n == b"host").count();
    if version == b"1.1" && hosts == 0 {
        return err("Missing mandatory Host: header");
    }
    if hosts > 1 {
        return err("Found multiple Host: headers");
    }
    Ok(RequestHead {
        method,
        target,
        version,
        headers,
    })
}

pub fn parse_response_head(
    lines: &[Vec<u8>],
    upgrade_proposed: bool,
) -> Result<ResponseHead, HeadError> {
    let Some(first) = lines.first() else {
        return err("no response line received");
    };
    let Some((version, status, reason)) = status_line(first) else {
        return err(format!("illegal status line: {}", quoted(first)));
    };
    let headers = normalise(field_lines(lines.get(1..).unwrap_or(&[]))?)?;
    if status < 100 {
        return err(format!(
            "InformationalResponse status_code should be in range [100, 200), not {status}"
        ));
    }
    if status == 101 && !upgrade_proposed {
        return err("Received server _SWITCH_UPGRADE event without a pending proposal");
    }
    Ok(ResponseHead {
        version,
        status,
        reason,
        headers,
    })
}

/// The next head out of `buf`: `Ok(None)` until complete.
pub fn read_head(
    buf: &mut Vec<u8>,
    from_client: bool,
    max_size: usize,
    upgrade_proposed: bool,
) -> Result<Option<Head>, HeadError> {
    let Some(lines) = take_head_lines(buf) else {
        if buf.first().is_some_and(|&b| b < 0x21) {
            return err("illegal request line");
        }
        if buf.len() > max_size {
            return err("Receive buffer too long");
        }
        return Ok(None);
    };
    if from_client {
        parse_request_head(&lines).map(|h| Some(Head::Request(h)))
    } else {
        parse_response_head(&lines, upgrade_proposed).map(|h| Some(Head::Response(h)))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyKind {
    Length(u64),
    Chunked,
    Close,
    Tunnel,
}

/// The value of the first Content-Length header (validated digits), as a number.
pub(crate) fn content_length(headers: &Headers) -> Option<u128> {
    headers
        .iter()
        .find(|(n, _)| n == b"content-length")
        .map(|(_, v)| {
            v.iter().fold(0u128, |a, &d| {
                a.saturating_mul(10)
                    .saturating_add(u128::from(d.wrapping_sub(b'0')))
            })
        })
}

/// How the body of a message is delimited (RFC 9112 §6.3).
pub fn body_framing(head: &Head, request_method: &[u8]) -> BodyKind {
    let headers = match head {
        Head::Response(r) => {
            if request_method == b"CONNECT" && (200..300).contains(&r.status) {
                return BodyKind::Tunnel;
            }
            if request_method == b"HEAD" || r.status < 200 || r.status == 204 || r.status == 304 {
                return BodyKind::Length(0);
            }
            &r.headers
        }
        Head::Request(r) => &r.headers,
    };
    let mut length: Option<u64> = None;
    for (name, value) in headers {
        if name == b"transfer-encoding" {
            return BodyKind::Chunked;
        }
        if name == b"content-length" && length.is_none() {
            let n = value.iter().fold(0u64, |a, &d| {
                a.saturating_mul(10)
                    .saturating_add(u64::from(d.wrapping_sub(b'0')))
            });
            length = Some(n);
        }
    }
    if let Some(n) = length {
        return BodyKind::Length(n);
    }
    match head {
        Head::Request(_) => BodyKind::Length(0),
        Head::Response(_) => BodyKind::Close,
    }
}

/// Headers as the Python events carry them: latin-1 text.
pub fn headers_text(h: &Headers) -> Vec<(String, String)> {
    h.iter().map(|(n, v)| (latin1(n), latin1(v))).collect()
}

/// `Upgrade: h2c` proposed (a comma-separated token, case and spaces ignored).
pub(crate) fn upgrades_to_h2c(headers: &Headers) -> bool {
    headers.iter().any(|(n, v)| {
        n == b"upgrade"
            && v.split(|&b| b == b',')
                .any(|t| lower_latin1(super::text::strip_latin1_ws(t)) == b"h2c")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(bytes: &[u8], client: bool) -> Result<Option<Head>, HeadError> {
        read_head(&mut bytes.to_vec(), client, 65536, false)
    }

    #[test]
    fn request_and_errors() {
        let h = head(
            b"GET /x HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 5\r\n\r\n",
            true,
        );
        let Ok(Some(Head::Request(r))) = h else {
            panic!("{h:?}")
        };
        assert_eq!(r.headers[1], (b"content-length".to_vec(), b"5".to_vec()));
        assert_eq!(
            head(
                b"GET /x HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 6\r\n\r\n",
                true
            ),
            Err(HeadError("conflicting Content-Length headers".into()))
        );
        assert_eq!(
            head(
                b"GET /x HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n",
                true
            ),
            Err(HeadError("bad Content-Length".into()))
        );
        assert_eq!(
            head(b"GET /x HTTP/1.1\r\nBad Line\r\n\r\n", true),
            Err(HeadError("illegal header line: <8 bytes>".into()))
        );
        assert_eq!(head(b"GET /x HTTP/1.1\r\nHost: a\r\n", true), Ok(None));
    }

    #[test]
    fn framing() {
        let Ok(Some(h)) = head(b"HTTP/1.1 200 OK\r\n\r\n", false) else {
            panic!()
        };
        assert_eq!(body_framing(&h, b"GET"), BodyKind::Close);
        assert_eq!(body_framing(&h, b"HEAD"), BodyKind::Length(0));
        assert_eq!(body_framing(&h, b"CONNECT"), BodyKind::Tunnel);
    }
}
