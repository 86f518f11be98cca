//! Chunked transfer coding (RFC 9112 §7.1), incremental: the hot path of every
//! SSE stream. A port of `_ChunkedBody` in `sniffer/core/http1.py`.

use super::head::MAX_BODY_LENGTH;
use super::text::quoted;

const MAX_CHUNK_LINE: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChunkState {
    Size,
    Data,
    Crlf,
    Trailer,
}

/// Malformed chunked framing: the message, and the bytes from the bad spot on.
#[derive(Debug)]
pub(crate) struct ChunkError {
    pub message: String,
    pub rest: Vec<u8>,
}

#[derive(Debug, Clone)]
pub(crate) struct ChunkedBody {
    pub buf: Vec<u8>,
    remaining: u64,
    pub state: ChunkState,
}

/// `([0-9A-Fa-f]{1,N})(?:;[^\r\n]*)?[ \t]*\r\n` at `pos`: (size, match end).
/// The size is read into a u128 (at most 20 hex digits: no overflow).
pub(crate) fn chunk_header(buf: &[u8], pos: usize, max_digits: usize) -> Option<(u128, usize)> {
    let s = buf.get(pos..)?;
    let n = s.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if n == 0 || n > max_digits {
        return None;
    }
    let size = s[..n].iter().fold(0u128, |a, &d| {
        let v = char::from(d).to_digit(16).unwrap_or(0);
        a.wrapping_mul(16).wrapping_add(u128::from(v))
    });
    let mut i = n;
    if s.get(i) == Some(&b';') {
        i = i.saturating_add(1);
        i = i.saturating_add(
            s.get(i..)?
                .iter()
                .take_while(|&&b| b != b'\r' && b != b'\n')
                .count(),
        );
    } else {
        i = i.saturating_add(
            s.get(i..)?
                .iter()
                .take_while(|&&b| b == b' ' || b == b'\t')
                .count(),
        );
    }
    if s.get(i..i.saturating_add(2)) == Some(b"\r\n") {
        Some((size, pos.saturating_add(i).saturating_add(2)))
    } else {
        None
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || hay.len() < needle.len() {
        return None;
    }
    hay.windows(needle.len()).position(|w| w == needle)
}

/// What one `feed` gave: body pieces and, at the message's end, what follows.
pub(crate) type Fed = (Vec<Vec<u8>>, Option<Vec<u8>>);

impl ChunkedBody {
    pub fn new() -> Self {
        ChunkedBody {
            buf: Vec::new(),
            remaining: 0,
            state: ChunkState::Size,
        }
    }

    pub fn feed(&mut self, data: &[u8]) -> Result<Fed, ChunkError> {
        if self.state == ChunkState::Size && self.buf.is_empty() {
            // Fast path: exactly one whole chunk.
            if let Some((size, start)) = chunk_header(data, 0, 20) {
                let stop = (start as u128).saturating_add(size);
                let want = data.len().saturating_sub(2) as u128;
                if (start as u128) < stop && stop == want && data.ends_with(b"\r\n") {
                    let stop = usize::try_from(stop).unwrap_or(0);
                    return Ok((vec![data.get(start..stop).unwrap_or(&[]).to_vec()], None));
                }
            }
        }
        let owned;
        let buf: &[u8] = if self.buf.is_empty() {
            data
        } else {
            let mut b = std::mem::take(&mut self.buf);
            b.extend_from_slice(data);
            owned = b;
            &owned
        };
        self.buf = Vec::new();
        let mut pieces = Vec::new();
        let mut pos = 0usize;
        let end = buf.len();
        let rest_from = |p: usize| buf.get(p..).unwrap_or(&[]).to_vec();
        while pos < end {
            match self.state {
                ChunkState::Data => {
                    let avail = end.saturating_sub(pos);
                    let take = usize::try_from(self.remaining.min(avail as u64)).unwrap_or(avail);
                    let stop = pos.saturating_add(take);
                    pieces.push(buf.get(pos..stop).unwrap_or(&[]).to_vec());
                    pos = stop;
                    self.remaining = self.remaining.saturating_sub(take as u64);
                    if self.remaining == 0 {
                        self.state = ChunkState::Crlf;
                    }
                }
                ChunkState::Size => match chunk_header(buf, pos, 20) {
                    None => {
                        let tail = buf.get(pos..).unwrap_or(&[]);
                        if !tail.contains(&b'\n') && tail.len() < MAX_CHUNK_LINE {
                            break; // need more bytes
                        }
                        let shown = buf.get(pos..pos.saturating_add(40).min(end)).unwrap_or(&[]);
                        return Err(ChunkError {
                            message: format!("illegal chunk header: {}", quoted(shown)),
                            rest: rest_from(pos),
                        });
                    }
                    Some((size, mend)) => {
                        if size > u128::from(MAX_BODY_LENGTH) {
                            return Err(ChunkError {
                                message: "chunk size out of range".into(),
                                rest: rest_from(mend),
                            });
                        }
                        pos = mend;
                        if size == 0 {
                            self.state = ChunkState::Trailer;
                        } else {
                            self.remaining = u64::try_from(size).unwrap_or(MAX_BODY_LENGTH);
                            self.state = ChunkState::Data;
                        }
                    }
                },
                ChunkState::Crlf => {
                    let tail = buf.get(pos..).unwrap_or(&[]);
                    if tail.len() < 2 {
                        if tail != &b"\r"[..tail.len()] {
                            return Err(ChunkError {
                                message: "malformed chunk footer".into(),
                                rest: tail.to_vec(),
                            });
                        }
                        break;
                    }
                    if &tail[..2] != b"\r\n" {
                        return Err(ChunkError {
                            message: format!("malformed chunk footer: {}", quoted(&tail[..2])),
                            rest: tail.to_vec(),
                        });
                    }
                    pos = pos.saturating_add(2);
                    self.state = ChunkState::Size;
                }
                ChunkState::Trailer => {
                    let tail = buf.get(pos..).unwrap_or(&[]);
                    if tail.starts_with(b"\r\n") {
                        return Ok((pieces, Some(tail[2..].to_vec())));
                    }
                    if let Some(stop) = find(tail, b"\r\n\r\n") {
                        return Ok((
                            pieces,
                            Some(tail.get(stop.saturating_add(4)..).unwrap_or(&[]).to_vec()),
                        ));
                    }
                    if tail.len() > MAX_CHUNK_LINE * 16 {
                        return Err(ChunkError {
                            message: "trailer section too long".into(),
                            rest: tail.to_vec(),
                        });
                    }
                    break;
                }
            }
        }
        self.buf = buf.get(pos..).unwrap_or(&[]).to_vec();
        Ok((pieces, None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_errors() {
        let mut c = ChunkedBody::new();
        let (p, after) = c
            .feed(b"5;ext=1\r\nhello\r\n0\r\nX-T: 1\r\n\r\nNEXT")
            .unwrap();
        assert_eq!(p, vec![b"hello".to_vec()]);
        assert_eq!(after.as_deref(), Some(&b"NEXT"[..]));
        let mut c = ChunkedBody::new();
        let e = c.feed(b"10000000000000000\r\n").unwrap_err(); // 2^64
        assert_eq!(e.message, "chunk size out of range");
        let mut c = ChunkedBody::new();
        let e = c
            .feed(
                &[b'f'; 40]
                    .iter()
                    .chain(b"\r\n")
                    .copied()
                    .collect::<Vec<u8>>(),
            )
            .unwrap_err();
        assert_eq!(e.message, "illegal chunk header: <40 bytes>");
    }
}
