//! Mid-body resynchronisation of the transfer framing (`FramingSync` of
//! `sniffer/core/resync.py`): where can a response body seen from an unknown
//! offset be decoded again? Nothing before a proven point is ever decoded.

pub const DEFAULT_MAX_SCAN: usize = 256 * 1024;
pub const DEFAULT_MAX_CHUNK: u64 = 1 << 20;
/// Bytes without any chunk-size line before an unchunked body is believed.
pub const IDENTITY_EVIDENCE: usize = 8192;
const MAX_SIZE_LINE: usize = 1100;
const MAX_EXT: usize = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncFraming {
    Chunked,
    Identity,
}

impl SyncFraming {
    pub fn name(self) -> &'static str {
        match self {
            SyncFraming::Chunked => "chunked",
            SyncFraming::Identity => "identity",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncPoint {
    pub framing: Option<SyncFraming>,
    pub skipped: u64,
    pub rest: Vec<u8>,
}

/// `([0-9A-Fa-f]{1,16})(?:;[^\r\n]{0,1024})?[ \t]*\r\n` at `pos`: (size, end).
fn size_line(buf: &[u8], pos: usize) -> Option<(u64, usize)> {
    let s = buf.get(pos..)?;
    let n = s.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if n == 0 || n > 16 {
        return None;
    }
    let size = s[..n].iter().fold(0u64, |a, &d| {
        a.wrapping_mul(16)
            .wrapping_add(u64::from(char::from(d).to_digit(16).unwrap_or(0)))
    });
    let mut i = n;
    if s.get(i) == Some(&b';') {
        let ext_start = i.saturating_add(1);
        let e = s
            .get(ext_start..)?
            .iter()
            .take_while(|&&b| b != b'\r' && b != b'\n')
            .count();
        let ext = s.get(ext_start..ext_start.saturating_add(e))?;
        let trailing = ext
            .iter()
            .rev()
            .take_while(|&&b| b == b' ' || b == b'\t')
            .count();
        if e.saturating_sub(trailing) > MAX_EXT {
            return None;
        }
        i = ext_start.saturating_add(e);
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

/// The bytes from `pos` to the end could still become a size line.
fn could_be_size(buf: &[u8], pos: usize) -> bool {
    let tail = buf.get(pos..).unwrap_or(&[]);
    if tail.is_empty() {
        return true;
    }
    let n = tail.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if n == 0 || n > 16 {
        return false;
    }
    let rest = &tail[n..];
    if rest.first() == Some(&b';') {
        let ext = &rest[1..];
        match ext.iter().position(|&b| b == b'\r' || b == b'\n') {
            None => true,
            Some(p) => ext[p] == b'\r' && p.saturating_add(1) == ext.len(),
        }
    } else {
        let ws = rest
            .iter()
            .take_while(|&&b| b == b' ' || b == b'\t')
            .count();
        let r = &rest[ws..];
        r.is_empty() || r == b"\r"
    }
}

enum Link {
    Next,
    Need,
    Bad,
}

fn find_nl(buf: &[u8], from: usize, to: usize) -> bool {
    buf.get(from..to.min(buf.len()))
        .is_some_and(|s| s.contains(&b'\n'))
}

/// Prove the chunk-size line at `pos`.
fn link(buf: &[u8], pos: usize, max_chunk: u64) -> Link {
    let Some((size, mend)) = size_line(buf, pos) else {
        let nl = find_nl(buf, pos, pos.saturating_add(MAX_SIZE_LINE));
        if !nl && buf.len().saturating_sub(pos) < MAX_SIZE_LINE && could_be_size(buf, pos) {
            return Link::Need;
        }
        return Link::Bad;
    };
    if size > max_chunk {
        return Link::Bad;
    }
    let end = mend.saturating_add(usize::try_from(size).unwrap_or(usize::MAX));
    if size == 0 {
        return Link::Bad;
    }
    if buf.len() < end.saturating_add(2) {
        return Link::Need;
    }
    if buf.get(end..end.saturating_add(2)) != Some(b"\r\n") {
        return Link::Bad;
    }
    let nxt = end.saturating_add(2);
    if size_line(buf, nxt).is_some() {
        return Link::Next;
    }
    if buf.len().saturating_sub(nxt) < MAX_SIZE_LINE
        && !find_nl(buf, nxt, nxt.saturating_add(MAX_SIZE_LINE))
    {
        return if could_be_size(buf, nxt) {
            Link::Need
        } else {
            Link::Bad
        };
    }
    Link::Bad
}

/// Offsets a chunk-size line may start at.
fn candidates(buf: &[u8], start: usize) -> Vec<usize> {
    let mut out = Vec::new();
    if start == 0 {
        out.push(0);
    }
    let from = start.saturating_sub(1);
    for (off, &b) in buf.get(from..).unwrap_or(&[]).iter().enumerate() {
        if b == b'\n' {
            let c = from.saturating_add(off).saturating_add(1);
            if c >= start && c > 0 {
                out.push(c);
            }
        }
    }
    out
}

/// `\n(data:|event:|\{)` somewhere (`sniff_item_format(.., at_start=False)` is not None).
fn items_present(buf: &[u8]) -> bool {
    buf.iter().enumerate().any(|(i, &b)| {
        b == b'\n' && {
            let t = buf.get(i.saturating_add(1)..).unwrap_or(&[]);
            t.starts_with(b"data:") || t.starts_with(b"event:") || t.first() == Some(&b'{')
        }
    })
}

/// `\r\n[0-9A-Fa-f]{1,16}(?:;[^\r\n]*)?\r\n` somewhere.
fn looks_chunked(buf: &[u8]) -> bool {
    let mut i = 0usize;
    while let Some(off) = buf
        .get(i..)
        .and_then(|s| s.windows(2).position(|w| w == b"\r\n"))
    {
        let p = i.saturating_add(off).saturating_add(2);
        let s = buf.get(p..).unwrap_or(&[]);
        let n = s.iter().take_while(|b| b.is_ascii_hexdigit()).count();
        if (1..=16).contains(&n) {
            let mut j = n;
            if s.get(j) == Some(&b';') {
                j = j.saturating_add(1);
                j = j.saturating_add(
                    s.get(j..)
                        .unwrap_or(&[])
                        .iter()
                        .take_while(|&&b| b != b'\r' && b != b'\n')
                        .count(),
                );
            }
            if s.get(j..j.saturating_add(2)) == Some(b"\r\n") {
                return true;
            }
        }
        i = i.saturating_add(off).saturating_add(1);
    }
    false
}

/// Incremental search for the transfer framing of a body seen mid-way.
#[derive(Debug, Clone)]
pub struct FramingSync {
    buf: Vec<u8>,
    checked: usize,
    hint: Option<bool>,
    max_scan: usize,
    max_chunk: u64,
    skipped: u64,
}

impl FramingSync {
    pub fn new(chunked_hint: Option<bool>) -> Self {
        FramingSync {
            buf: Vec::new(),
            checked: 0,
            hint: chunked_hint,
            max_scan: DEFAULT_MAX_SCAN,
            max_chunk: DEFAULT_MAX_CHUNK,
            skipped: 0,
        }
    }

    /// Bytes fed and not yet handed on.
    pub fn held(&self) -> u64 {
        (self.buf.len() as u64).saturating_add(self.skipped)
    }

    pub fn feed(&mut self, data: &[u8]) -> Option<SyncPoint> {
        self.buf.extend_from_slice(data);
        self.decide(false)
    }

    pub fn finish(&mut self) -> SyncPoint {
        self.decide(true).unwrap_or(SyncPoint {
            framing: None,
            skipped: self.skipped,
            rest: Vec::new(),
        })
    }

    fn decide(&mut self, fin: bool) -> Option<SyncPoint> {
        let full = fin || self.buf.len() >= self.max_scan;
        if self.hint != Some(false) {
            for pos in candidates(&self.buf, self.checked) {
                match link(&self.buf, pos, self.max_chunk) {
                    Link::Next => return Some(self.done(SyncFraming::Chunked, pos)),
                    Link::Need => {
                        if !full {
                            return None;
                        }
                    }
                    Link::Bad => self.checked = pos.saturating_add(1),
                }
            }
        }
        if self.hint != Some(true) && self.identity_evident(full) {
            return Some(self.done(SyncFraming::Identity, 0));
        }
        if full {
            self.skipped = self.skipped.saturating_add(self.buf.len() as u64);
            self.buf.clear();
            return Some(SyncPoint {
                framing: None,
                skipped: self.skipped,
                rest: Vec::new(),
            });
        }
        None
    }

    fn identity_evident(&self, fin: bool) -> bool {
        if !items_present(&self.buf) || looks_chunked(&self.buf) {
            return false;
        }
        fin || self.buf.len() >= IDENTITY_EVIDENCE
    }

    fn done(&mut self, framing: SyncFraming, pos: usize) -> SyncPoint {
        let rest = self.buf.get(pos..).unwrap_or(&[]).to_vec();
        let skipped = self.skipped.saturating_add(pos as u64);
        self.buf.clear();
        SyncPoint {
            framing: Some(framing),
            skipped,
            rest,
        }
    }
}
