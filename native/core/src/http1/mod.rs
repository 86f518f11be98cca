//! HTTP/1.1 over reassembled TCP flows (sans-IO): a port, exactly, of
//! `sniffer/core/http1.py` (`HttpParser`), which stays the reference.
//!
//! Each captured direction is parsed on its own: heads by [`head`], bodies by
//! Content-Length, the chunked decoder or until close, framing per RFC 9112
//! §6.3 with the request-dependent response rules (HEAD, 1xx, 204/304,
//! CONNECT); pipelining; recovery by hunting for the next start line; mid-body
//! resynchronisation ([`resync`]); Content-Encoding undone ([`coding`]).
//!
//! **HTTP/2 is not parsed here.** When a connection turns to HTTP/2 (the
//! client preface, frames seen on a connection caught mid-way, or a
//! `101 Switching Protocols` to `Upgrade: h2c`, at any position on a
//! keep-alive connection), [`HttpEvent::H2Handover`] says exactly where: the
//! exchange of stream 1, the direction, and the connection's orientation. The
//! switch itself is the reference's state machine (`Upgrade`, `Step`, the
//! events held meanwhile up to [`MAX_UPGRADE_HELD`] bytes); the flow events
//! held until the switch, and any bytes after it in the same call, follow as
//! [`HttpEvent::H2Feed`]. The connection is then forgotten at the end of that
//! `feed` call: its later flow events belong to whoever took it over.
//!
//! A `FlowAnomaly` becomes [`HttpEvent::Anomaly`], naming the exchange whose
//! bytes it touched by the reference's rule (`exchange_touched`).

mod chunked;
pub mod coding;
pub mod head;
pub mod resync;
pub mod text;

use std::collections::VecDeque;

use crate::ids::IdMap;

use chunked::{ChunkState, ChunkedBody};
use coding::{decoder_for, BodyDecoder, MAX_DECODED_BYTES, MAX_EXPANSION_RATIO};
use head::{body_framing, is_re_space, is_token, read_head, upgrades_to_h2c, BodyKind, Head};
pub use head::{Headers, MAX_BODY_LENGTH};
use resync::{FramingSync, SyncFraming, SyncPoint};

pub type ConnId = u64;

/// What the HTTP stage takes in: the reassembler's flow events (borrowed).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FlowEvent<'a> {
    Opened {
        conn: ConnId,
        ts: f64,
        syn_seen: bool,
    },
    Data {
        conn: ConnId,
        ts: f64,
        from_client: bool,
        data: &'a [u8],
    },
    Gap {
        conn: ConnId,
        ts: f64,
        from_client: bool,
        nbytes: Option<u64>,
        reason: &'a str,
    },
    End {
        conn: ConnId,
        ts: f64,
        from_client: bool,
        reason: &'a str,
    },
    Closed {
        conn: ConnId,
        ts: f64,
        reason: &'a str,
    },
    /// `FlowAnomaly`: attributed to an exchange ([`HttpEvent::Anomaly`]).
    Anomaly { conn: ConnId, from_client: bool },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndReason {
    Complete,
    Gap,
    Eof,
    Rst,
    Error,
}

impl EndReason {
    pub fn name(self) -> &'static str {
        match self {
            EndReason::Complete => "complete",
            EndReason::Gap => "gap",
            EndReason::Eof => "eof",
            EndReason::Rst => "rst",
            EndReason::Error => "error",
        }
    }
}

/// How a connection turns to HTTP/2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum H2Mode {
    /// The client's connection preface (prior knowledge); `data` starts with it.
    Preface,
    /// Frames on a connection caught mid-way (no preface, roles maybe unknown).
    Midstream,
    /// `101 Switching Protocols` to `Upgrade: h2c`: the server's HTTP/2 bytes
    /// from `data` on; exchange 0 goes on as stream 1.
    Upgrade,
}

/// A flow event held while an h2c switch is in flight (as received: not
/// reoriented), replayed through `feed` once the switch is decided.
#[derive(Debug, Clone, PartialEq)]
pub enum HeldEvent {
    Data {
        ts: f64,
        from_client: bool,
        data: Vec<u8>,
    },
    Gap {
        ts: f64,
        from_client: bool,
        nbytes: Option<u64>,
        reason: String,
    },
    End {
        ts: f64,
        from_client: bool,
        reason: String,
    },
    Closed {
        ts: f64,
        reason: String,
    },
}

impl HeldEvent {
    fn flow(&self, conn: ConnId) -> FlowEvent<'_> {
        match self {
            HeldEvent::Data {
                ts,
                from_client,
                data,
            } => FlowEvent::Data {
                conn,
                ts: *ts,
                from_client: *from_client,
                data,
            },
            HeldEvent::Gap {
                ts,
                from_client,
                nbytes,
                reason,
            } => FlowEvent::Gap {
                conn,
                ts: *ts,
                from_client: *from_client,
                nbytes: *nbytes,
                reason,
            },
            HeldEvent::End {
                ts,
                from_client,
                reason,
            } => FlowEvent::End {
                conn,
                ts: *ts,
                from_client: *from_client,
                reason,
            },
            HeldEvent::Closed { ts, reason } => FlowEvent::Closed {
                conn,
                ts: *ts,
                reason,
            },
        }
    }

    fn of(ev: &FlowEvent<'_>) -> Option<Self> {
        match *ev {
            FlowEvent::Data {
                ts,
                from_client,
                data,
                ..
            } => Some(HeldEvent::Data {
                ts,
                from_client,
                data: data.to_vec(),
            }),
            FlowEvent::Gap {
                ts,
                from_client,
                nbytes,
                reason,
                ..
            } => Some(HeldEvent::Gap {
                ts,
                from_client,
                nbytes,
                reason: reason.into(),
            }),
            FlowEvent::End {
                ts,
                from_client,
                reason,
                ..
            } => Some(HeldEvent::End {
                ts,
                from_client,
                reason: reason.into(),
            }),
            FlowEvent::Closed { ts, reason, .. } => Some(HeldEvent::Closed {
                ts,
                reason: reason.into(),
            }),
            _ => None,
        }
    }
}

/// Bytes held while an `Upgrade: h2c` offer waits for its answer (then taken as
/// refused): the reference's `MAX_UPGRADE_HELD`.
pub const MAX_UPGRADE_HELD: usize = 1 << 20;

/// Where a connection's switch to HTTP/2 stands (the reference's `Upgrade`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Upgrade {
    /// no switch in flight
    None,
    /// the request carrying the offer is being sent; not answered yet
    Offered,
    /// that request is whole, its answer not seen: client bytes held
    Awaiting,
    /// 101 before the request was whole: server bytes held until it is
    Early,
    /// a preface with HTTP/1.1 answers still due: client bytes held till then
    Prior,
}

/// What moves an [`Upgrade`] on (the reference's `_Step`).
enum Step {
    Offer(i64),
    RequestEnd,
    Switch(i64, Vec<u8>),
    Refuse,
    Preface(Vec<u8>),
    Answered,
    Close,
    Overflow,
}

/// What the HTTP stage gives out. `exchange` is the Python reference's
/// (0, 1, 2 … per connection; -1 never appears on a well-formed path).
#[derive(Debug, Clone, PartialEq)]
pub enum HttpEvent {
    /// Release the connection's held `ConnectionOpened`, client and server
    /// swapped when `swapped` (the bytes showed the reassembler's guess wrong).
    Opened { conn: ConnId, swapped: bool },
    Request {
        conn: ConnId,
        exchange: i64,
        ts: f64,
        method: Vec<u8>,
        target: Vec<u8>,
        version: Vec<u8>,
        headers: Headers,
    },
    Response {
        conn: ConnId,
        exchange: i64,
        ts: f64,
        status: u16,
        reason: Vec<u8>,
        version: Vec<u8>,
        headers: Headers,
        informational: bool,
    },
    Body {
        conn: ConnId,
        exchange: i64,
        ts: f64,
        from_client: bool,
        data: Vec<u8>,
    },
    End {
        conn: ConnId,
        exchange: i64,
        ts: f64,
        from_client: bool,
        reason: EndReason,
    },
    Error {
        conn: ConnId,
        exchange: Option<i64>,
        ts: f64,
        from_client: bool,
        kind: &'static str,
        message: String,
    },
    Resync {
        conn: ConnId,
        exchange: i64,
        ts: f64,
        framing: SyncFraming,
        skipped: u64,
        recovered: bool,
        lost: Option<u64>,
        gaps: u64,
    },
    /// A `FlowGap` passed through (capture loss not attributable to a direction's bytes).
    FlowGap {
        conn: ConnId,
        ts: f64,
        from_client: bool,
        nbytes: Option<u64>,
        reason: String,
    },
    FlowEnd {
        conn: ConnId,
        ts: f64,
        from_client: bool,
        reason: String,
    },
    Closed {
        conn: ConnId,
        ts: f64,
        reason: String,
    },
    /// A `FlowAnomaly` becomes an `HttpAnomaly` naming the exchange whose bytes
    /// it touched (the reference's rule, `_exchange_touched`); its kind, detail,
    /// offset and length are the flow event's.
    Anomaly {
        conn: ConnId,
        exchange: Option<i64>,
        /// oriented as the HTTP stage settled the roles
        from_client: bool,
    },
    /// A flow event of a connection already handed over to HTTP/2 (a held
    /// one replayed, or the bytes after the switch): feed it to whoever took
    /// the connection over.
    H2Feed { conn: ConnId, event: HeldEvent },
    /// The client's held bytes do not begin with the preface (recorded in the
    /// `Error` before): the HTTP/2 parser looks for frame boundaries instead.
    H2NoPreface { conn: ConnId },
    /// The connection turns to HTTP/2 here (see the module text).
    H2Handover {
        conn: ConnId,
        ts: f64,
        mode: H2Mode,
        /// the exchange of HTTP/2 stream 1
        base: i64,
        /// the direction `data` belongs to (already oriented)
        from_client: bool,
        data: Vec<u8>,
        swapped: bool,
        /// the `ConnectionOpened` has not been released yet
        opened_held: bool,
        roles_known: bool,
    },
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HttpStats {
    pub requests: u64,
    pub responses: u64,
    pub errors: u64,
    pub gaps: u64,
    pub hunted_bytes: u64,
    pub desyncs: u64,
    pub dead_connections: u64,
    pub resyncs: u64,
    pub resync_skipped: u64,
    pub upgrades: u64,
}

#[derive(Debug, Clone, Copy)]
pub struct HttpConfig {
    pub max_header_bytes: usize,
    pub max_decoded_bytes: u64,
    pub max_expansion_ratio: f64,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            max_header_bytes: 64 * 1024,
            max_decoded_bytes: MAX_DECODED_BYTES,
            max_expansion_ratio: MAX_EXPANSION_RATIO,
        }
    }
}

/// Where a connection stands (`HttpParser::checkpoint`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    pub exchange: i64,
    pub next_exchange: i64,
    pub method: Vec<u8>,
    pub clean: bool,
    pub gaps: u64,
    pub lost: Option<u64>,
}

const HUNT_KEEP: usize = 8192;
const DEAD_AFTER: u64 = 1 << 20;
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

#[derive(Debug)]
struct Pending {
    exchange: i64,
    method: Vec<u8>,
    h2c: bool,
}

#[derive(Debug)]
struct Direction {
    from_client: bool,
    head: Option<Vec<u8>>,
    method: Vec<u8>,
    h2c: bool,
    requests: bool,
    hunt: Option<Vec<u8>>,
    hunted: u64,
    hunt_sol: bool,
    raw: Option<Vec<u8>>,
    /// Some(remaining): a Content-Length body (None inside: until close)
    body: Option<Option<u64>>,
    chunked: Option<ChunkedBody>,
    exchange: i64,
    /// exchange of the last message that ended here (-1: none yet)
    last_exchange: i64,
    in_message: bool,
    decoder: Option<BodyDecoder>,
    decode_failed: bool,
    resync: Option<FramingSync>,
    resync_exchange: i64,
    resync_lost: Option<u64>,
    resync_gaps: u64,
}

impl Direction {
    fn new(from_client: bool) -> Self {
        Direction {
            from_client,
            head: None,
            method: Vec::new(),
            h2c: false,
            requests: from_client,
            hunt: None,
            hunted: 0,
            hunt_sol: true,
            raw: None,
            body: None,
            chunked: None,
            exchange: -1,
            last_exchange: -1,
            in_message: false,
            decoder: None,
            decode_failed: false,
            resync: None,
            resync_exchange: -1,
            resync_lost: None,
            resync_gaps: 0,
        }
    }
}

#[derive(Debug)]
struct Conn {
    id: ConnId,
    opened_held: bool,
    roles_known: bool,
    swapped: bool,
    dirs: [Direction; 2], // index by from_client
    next_exchange: i64,
    pending: VecDeque<Pending>,
    dead: bool,
    h2: bool,
    midstart: bool,
    upgrade: Upgrade,
    /// the exchange of the request carrying the offer
    upgrade_exchange: i64,
    /// flow events of the direction held while the offer waits
    held: Vec<HeldEvent>,
    held_bytes: usize,
}

impl Conn {
    fn new(id: ConnId, syn_seen: bool) -> Self {
        Conn {
            id,
            opened_held: true,
            roles_known: syn_seen,
            swapped: false,
            dirs: [Direction::new(false), Direction::new(true)],
            next_exchange: 0,
            pending: VecDeque::new(),
            dead: false,
            h2: false,
            midstart: !syn_seen,
            upgrade: Upgrade::None,
            upgrade_exchange: -1,
            held: Vec::new(),
            held_bytes: 0,
        }
    }

    fn swap_dirs(&mut self) {
        self.swapped = !self.swapped;
        self.dirs.swap(0, 1);
        self.dirs[0].from_client = false;
        self.dirs[1].from_client = true;
    }

    fn take_exchange(&mut self) -> i64 {
        let ex = self.next_exchange;
        self.next_exchange = self.next_exchange.saturating_add(1);
        ex
    }
}

/// The exchange a TCP anomaly on direction `i` is attributed to (the
/// reference's `_exchange_touched`, the rule in its module docstring).
fn exchange_touched(c: &Conn, i: usize) -> Option<i64> {
    let d = &c.dirs[i];
    if d.exchange >= 0 {
        return Some(d.exchange);
    }
    if d.from_client && d.head.is_some() {
        return Some(c.next_exchange);
    }
    if d.last_exchange >= 0 {
        return Some(d.last_exchange);
    }
    if d.from_client {
        return Some(c.next_exchange);
    }
    c.pending.front().map(|p| p.exchange)
}

/// The first bytes held (up to 64) before any loss, or None if none.
fn held_start(held: &[HeldEvent]) -> Option<Vec<u8>> {
    let mut start = Vec::new();
    for ev in held {
        let HeldEvent::Data { data, .. } = ev else {
            break;
        };
        let room = 64usize.saturating_sub(start.len());
        start.extend_from_slice(&data[..data.len().min(room)]);
        if start.len() >= 64 {
            break;
        }
    }
    (!start.is_empty()).then_some(start)
}

/// The client's first bytes are (a prefix of, at least 4 bytes of) the preface.
pub fn looks_like_preface(data: &[u8]) -> bool {
    let n = data.len().min(PREFACE.len());
    n >= 4 && data[..n] == PREFACE[..n]
}

/// Length of a plausible HTTP/2 frame header at `at` (`core/h2.py` `_plausible`).
fn plausible_frame(buf: &[u8], at: usize) -> Option<usize> {
    let h = buf.get(at..at.checked_add(9)?)?;
    let length = (usize::from(h[0]) << 16) | (usize::from(h[1]) << 8) | usize::from(h[2]);
    let ftype = h[3];
    if length > (1 << 14) || ftype >= 10 || h[5] & 0x80 != 0 {
        return None;
    }
    let sid = u32::from_be_bytes([h[5], h[6], h[7], h[8]]);
    if matches!(ftype, 4 | 6 | 7) && sid != 0 {
        return None;
    }
    if matches!(ftype, 0 | 1 | 2 | 3 | 5 | 9) && sid == 0 {
        return None;
    }
    if ftype == 4 && length % 6 != 0 {
        return None;
    }
    if ftype == 6 && length != 8 {
        return None;
    }
    if matches!(ftype, 3 | 8) && length != 4 {
        return None;
    }
    Some(length)
}

/// `find_frame_start(buf, chain=2, max_offset=0) == 0`.
fn frames_at_start(buf: &[u8]) -> bool {
    let n = buf.len();
    if n < 9 {
        return false;
    }
    let mut pos = 0usize;
    let mut count = 0u32;
    while let Some(length) = plausible_frame(buf, pos) {
        count = count.saturating_add(1);
        pos = pos.saturating_add(9).saturating_add(length);
        if count >= 2 || pos == n {
            return true;
        }
        if pos > n {
            break;
        }
    }
    count > 0 && pos > n
}

/// `^[A-Z][A-Z_-]{1,23} `
fn method_prefix(data: &[u8]) -> bool {
    let Some(&first) = data.first() else {
        return false;
    };
    if !first.is_ascii_uppercase() {
        return false;
    }
    let run = data[1..]
        .iter()
        .take_while(|&&b| b.is_ascii_uppercase() || b == b'_' || b == b'-')
        .count();
    (1..=23).contains(&run) && data.get(run.saturating_add(1)) == Some(&b' ')
}

/// Bytes of a connection caught mid-way that read as HTTP/2 frames.
fn h2_frames(data: &[u8]) -> bool {
    let head = &data[..data.len().min(32)];
    if method_prefix(head) || data.starts_with(b"HTTP/1.") {
        return false;
    }
    frames_at_start(&data[..data.len().min(65536)])
}

/// A request line at `p`: `[token]{1,24} [^\s]{1,8192} HTTP/1\.[01]\r?\n`.
fn request_start_at(buf: &[u8], p: usize) -> bool {
    let s = buf.get(p..).unwrap_or(&[]);
    let m = s.iter().take_while(|&&b| is_token(b)).count();
    if !(1..=24).contains(&m) || s.get(m) != Some(&b' ') {
        return false;
    }
    let t0 = m.saturating_add(1);
    let t = s
        .get(t0..)
        .unwrap_or(&[])
        .iter()
        .take_while(|&&b| !is_re_space(b))
        .count();
    if !(1..=8192).contains(&t) {
        return false;
    }
    let v = s.get(t0.saturating_add(t)..).unwrap_or(&[]);
    if !(v.starts_with(b" HTTP/1.0") || v.starts_with(b" HTTP/1.1")) {
        return false;
    }
    let e = &v[9..];
    e.starts_with(b"\n") || e.starts_with(b"\r\n")
}

/// A status line at `p`: `HTTP/1\.[01] [0-9]{3}[ \r\n]`.
fn response_start_at(buf: &[u8], p: usize) -> bool {
    let s = buf.get(p..).unwrap_or(&[]);
    s.len() >= 13
        && (s.starts_with(b"HTTP/1.0 ") || s.starts_with(b"HTTP/1.1 "))
        && s[9..12].iter().all(u8::is_ascii_digit)
        && matches!(s[12], b' ' | b'\r' | b'\n')
}

fn start_at(buf: &[u8], p: usize, request: bool) -> bool {
    if request {
        request_start_at(buf, p)
    } else {
        response_start_at(buf, p)
    }
}

/// `pattern.search(buf, from)`: the first line start at or after `from` where
/// a start line matches.
fn search_start(buf: &[u8], from: usize, request: bool) -> Option<usize> {
    if from == 0 && start_at(buf, 0, request) {
        return Some(0);
    }
    let lo = from.saturating_sub(1);
    for (off, &b) in buf.get(lo..).unwrap_or(&[]).iter().enumerate() {
        if b == b'\n' {
            let p = lo.saturating_add(off).saturating_add(1);
            if p >= from && p < buf.len().saturating_add(1) && start_at(buf, p, request) {
                return Some(p);
            }
        }
    }
    None
}

type Loose = (Vec<u8>, Option<Vec<u8>>, Option<Vec<u8>>);

/// `_LOOSE_REQUEST_LINE.match`: what is left of a rejected request line.
fn loose_request_line(s: &[u8]) -> Option<Loose> {
    let sp = |b: &u8| *b == b' ' || *b == b'\t';
    let m = s.iter().take_while(|&&b| is_token(b)).count();
    if !(1..=24).contains(&m) {
        return None;
    }
    let tail = |p: usize| -> bool {
        let r = s.get(p..).unwrap_or(&[]);
        let w = r.iter().take_while(|b| sp(b)).count();
        let r = &r[w..];
        r.starts_with(b"\n") || r.starts_with(b"\r\n")
    };
    let group3 = |p: usize| -> Option<(Vec<u8>, usize)> {
        let r = s.get(p..)?;
        let w = r.iter().take_while(|b| sp(b)).count();
        if w == 0 || !r[w..].starts_with(b"HTTP/") {
            return None;
        }
        let v0 = w.saturating_add(5);
        let vl = r
            .get(v0..)?
            .iter()
            .take_while(|&&b| b.is_ascii_digit() || b == b'.')
            .count();
        if vl > 8 {
            return None;
        }
        Some((
            r.get(v0..v0.saturating_add(vl))?.to_vec(),
            p.saturating_add(v0).saturating_add(vl),
        ))
    };
    let method = s[..m].to_vec();
    // group 2 present: whitespace, then a target
    let w = s
        .get(m..)
        .unwrap_or(&[])
        .iter()
        .take_while(|b| sp(b))
        .count();
    if w > 0 {
        let t0 = m.saturating_add(w);
        let t = s
            .get(t0..)
            .unwrap_or(&[])
            .iter()
            .take_while(|&&b| !is_re_space(b))
            .count();
        if (1..=8192).contains(&t) {
            let q = t0.saturating_add(t);
            let target = s[t0..q].to_vec();
            if let Some((v, r)) = group3(q) {
                if tail(r) {
                    return Some((method, Some(target), Some(v)));
                }
            }
            if tail(q) {
                return Some((method, Some(target), None));
            }
        }
    }
    if let Some((v, r)) = group3(m) {
        if tail(r) {
            return Some((method, None, Some(v)));
        }
    }
    if tail(m) {
        return Some((method, None, None));
    }
    None
}

struct Ctx {
    stats: HttpStats,
    cfg: HttpConfig,
}

/// Turns reassembled flows into HTTP messages; see the module text.
pub struct HttpParser {
    /// by connection id (`crate::ids`: ids are ours, not the wire's)
    conns: IdMap<ConnId, Conn>,
    ctx: Ctx,
}

impl Default for HttpParser {
    fn default() -> Self {
        Self::new(HttpConfig::default())
    }
}

impl HttpParser {
    pub fn new(cfg: HttpConfig) -> Self {
        HttpParser {
            conns: IdMap::default(),
            ctx: Ctx {
                stats: HttpStats::default(),
                cfg,
            },
        }
    }

    pub fn stats(&self) -> &HttpStats {
        &self.ctx.stats
    }

    pub fn open_connections(&self) -> usize {
        self.conns.len()
    }

    pub fn connection_ids(&self) -> Vec<ConnId> {
        self.conns.keys().copied().collect()
    }

    pub fn has_connection(&self, conn: ConnId) -> bool {
        self.conns.contains_key(&conn)
    }

    /// One flow event in; what it completed appended to `out`.
    pub fn feed(&mut self, ev: &FlowEvent<'_>, out: &mut Vec<HttpEvent>) {
        let ctx = &mut self.ctx;
        match *ev {
            FlowEvent::Data { conn, .. }
            | FlowEvent::Gap { conn, .. }
            | FlowEvent::End { conn, .. } => {
                let Some(c) = self.conns.get_mut(&conn) else {
                    return;
                };
                ctx.feed_conn(c, ev, out);
                if c.h2 {
                    self.conns.remove(&conn);
                }
            }
            FlowEvent::Opened { conn, syn_seen, .. } => {
                let mut c = Conn::new(conn, syn_seen);
                if c.roles_known {
                    ctx.release(&mut c, out);
                }
                self.conns.insert(conn, c);
            }
            FlowEvent::Closed { conn, ts, reason } => {
                if let Some(c) = self.conns.get_mut(&conn) {
                    if c.upgrade == Upgrade::Prior && !c.dead {
                        // The HTTP/1.1 answers still due end here, then the held HTTP/2.
                        ctx.release(c, out);
                        for i in 0..2 {
                            ctx.end(c, i, ts, reason, out);
                        }
                        for p in &c.pending {
                            out.push(HttpEvent::End {
                                conn,
                                exchange: p.exchange,
                                ts,
                                from_client: false,
                                reason: EndReason::Eof,
                            });
                        }
                        c.pending.clear();
                    }
                    if c.upgrade != Upgrade::None {
                        ctx.upgrade(c, Step::Close, ts, out);
                    }
                }
                if let Some(mut c) = self.conns.remove(&conn) {
                    if c.h2 {
                        // switched while closing: the close is the HTTP/2 parser's
                        out.push(HttpEvent::H2Feed {
                            conn,
                            event: HeldEvent::Closed {
                                ts,
                                reason: reason.into(),
                            },
                        });
                        return;
                    }
                    ctx.release(&mut c, out);
                    if !c.dead {
                        for i in 0..2 {
                            ctx.end(&mut c, i, ts, reason, out);
                        }
                        for p in &c.pending {
                            out.push(HttpEvent::End {
                                conn,
                                exchange: p.exchange,
                                ts,
                                from_client: false,
                                reason: EndReason::Eof,
                            });
                        }
                    }
                }
                out.push(HttpEvent::Closed {
                    conn,
                    ts,
                    reason: reason.into(),
                });
            }
            FlowEvent::Anomaly { conn, from_client } => {
                let (fc, exchange) = match self.conns.get(&conn) {
                    None => (from_client, None),
                    Some(c) => {
                        let fc = from_client != c.swapped;
                        let ex = if c.h2 || c.dead {
                            None
                        } else {
                            exchange_touched(c, usize::from(fc))
                        };
                        (fc, ex)
                    }
                };
                out.push(HttpEvent::Anomaly {
                    conn,
                    exchange,
                    from_client: fc,
                });
            }
        }
    }

    /// Where a connection stands, for a restarted instance to go on (see the
    /// reference's `checkpoint`).
    pub fn checkpoint(&self, conn: ConnId) -> Option<Checkpoint> {
        let c = self.conns.get(&conn)?;
        if c.dead || !c.roles_known || !c.pending.is_empty() || c.upgrade != Upgrade::None {
            return None;
        }
        let (srv, cli) = (&c.dirs[0], &c.dirs[1]);
        if cli.in_message || cli.head.as_ref().is_some_and(|h| !h.is_empty()) || cli.hunt.is_some()
        {
            return None;
        }
        if !srv.in_message || srv.decoder.is_some() || srv.decode_failed {
            return None;
        }
        let resuming = srv.resync.is_some() && srv.resync_exchange == srv.exchange;
        if srv.chunked.is_none() && !resuming {
            return None;
        }
        let clean = srv
            .chunked
            .as_ref()
            .is_some_and(|ch| ch.state == ChunkState::Size && ch.buf.is_empty());
        let lost = if resuming && srv.resync_lost.is_none() {
            None
        } else if resuming {
            let held = srv.resync.as_ref().map_or(0, FramingSync::held);
            Some(srv.resync_lost.unwrap_or(0).saturating_add(held))
        } else {
            Some(0)
        };
        Some(Checkpoint {
            exchange: srv.exchange,
            next_exchange: c.next_exchange,
            method: srv.method.clone(),
            clean,
            gaps: if resuming { srv.resync_gaps } else { 0 },
            lost,
        })
    }

    /// Drop a connection without ending anything (it was checkpointed).
    pub fn forget(&mut self, conn: ConnId) {
        self.conns.remove(&conn);
    }

    /// Take over a connection another instance checkpointed inside a chunked response.
    pub fn adopt(&mut self, conn: ConnId, syn_seen: bool, cp: &Checkpoint) {
        let mut c = Conn::new(conn, syn_seen);
        c.opened_held = false;
        c.roles_known = true;
        c.next_exchange = cp.next_exchange;
        let d = &mut c.dirs[0];
        d.in_message = true;
        d.exchange = cp.exchange;
        d.method = cp.method.clone();
        d.raw = None;
        if cp.clean {
            d.chunked = Some(ChunkedBody::new());
        } else {
            d.hunt = Some(Vec::new());
            d.resync = Some(FramingSync::new(Some(true)));
            d.resync_exchange = cp.exchange;
            d.resync_lost = cp.lost;
            d.resync_gaps = cp.gaps;
        }
        self.conns.insert(conn, c);
    }

    /// Stop parsing a connection: its bytes are ignored from now on.
    pub fn abandon(&mut self, conn: ConnId) {
        if let Some(c) = self.conns.get_mut(&conn) {
            c.dead = true;
        }
    }
}

impl Ctx {
    /// `feed` for a flow event of a known connection (`Data`, `Gap`, `End`);
    /// held events are replayed through it.
    fn feed_conn(&mut self, c: &mut Conn, ev: &FlowEvent<'_>, out: &mut Vec<HttpEvent>) {
        if c.h2 {
            if let Some(event) = HeldEvent::of(ev) {
                let skip = matches!(&event, HeldEvent::Data { data, .. } if data.is_empty());
                if !skip && !c.dead {
                    out.push(HttpEvent::H2Feed { conn: c.id, event });
                }
            }
            return;
        }
        match *ev {
            FlowEvent::Data {
                conn,
                ts,
                from_client,
                data,
            } => {
                if c.dead || data.is_empty() {
                    return;
                }
                let mut fc = from_client != c.swapped;
                if !c.roles_known {
                    fc = self.settle_roles(c, fc, data, out);
                }
                let i = usize::from(fc);
                if c.upgrade != Upgrade::None && self.hold(c, fc, ev, out) {
                    return; // an Upgrade: h2c offer waits for its answer
                }
                let d = &c.dirs[i];
                let preface = fc && !d.in_message && d.body.is_none() && {
                    match &d.head {
                        Some(h) if !h.is_empty() => {
                            let mut j = h.clone();
                            j.extend_from_slice(data);
                            looks_like_preface(&j)
                        }
                        _ => looks_like_preface(data),
                    }
                };
                if preface {
                    let d = &mut c.dirs[i];
                    let mut joined = match d.head.take() {
                        Some(h) if !h.is_empty() => h,
                        _ => Vec::new(),
                    };
                    joined.extend_from_slice(data);
                    d.raw = None;
                    self.release(c, out);
                    self.upgrade(c, Step::Preface(joined), ts, out);
                } else if c.midstart && c.next_exchange == 0 && h2_frames(data) {
                    c.h2 = true;
                    out.push(HttpEvent::H2Handover {
                        conn,
                        ts,
                        mode: H2Mode::Midstream,
                        base: 0,
                        from_client: fc,
                        data: data.to_vec(),
                        swapped: c.swapped,
                        opened_held: c.opened_held,
                        roles_known: c.roles_known,
                    });
                } else if c.dirs[i].chunked.is_some() {
                    let rest = self.chunked_data(c, i, ts, data, out);
                    if !rest.is_empty() {
                        self.data(c, i, ts, rest, out);
                    }
                } else {
                    self.data(c, i, ts, data.to_vec(), out);
                }
            }
            FlowEvent::Gap {
                ts,
                from_client,
                nbytes,
                reason,
                ..
            } => {
                if c.dead {
                    return;
                }
                let fc = from_client != c.swapped;
                if c.upgrade != Upgrade::None && self.hold(c, fc, ev, out) {
                    return;
                }
                self.gap(c, usize::from(fc), ts, nbytes, reason, out);
            }
            FlowEvent::End {
                conn,
                ts,
                from_client,
                reason,
            } => {
                self.release(c, out);
                let fc = from_client != c.swapped;
                if c.upgrade != Upgrade::None && self.hold(c, fc, ev, out) {
                    return; // passed on when the held events are
                }
                if c.h2 {
                    // switched on the way (an overflow): the end is HTTP/2's
                    out.push(HttpEvent::H2Feed {
                        conn,
                        event: HeldEvent::End {
                            ts,
                            from_client,
                            reason: reason.into(),
                        },
                    });
                    return;
                }
                if !c.dead {
                    self.end(c, usize::from(fc), ts, reason, out);
                }
                out.push(HttpEvent::FlowEnd {
                    conn,
                    ts,
                    from_client: fc,
                    reason: reason.into(),
                });
            }
            _ => {}
        }
    }

    // ------------------------------------------------------------ h2c upgrade

    /// Keep `ev` back if its direction waits on a switch in flight (the
    /// server's in EARLY, the client's in AWAITING and PRIOR); false if it is
    /// to be parsed now.
    fn hold(
        &mut self,
        c: &mut Conn,
        fc: bool,
        ev: &FlowEvent<'_>,
        out: &mut Vec<HttpEvent>,
    ) -> bool {
        let state = c.upgrade;
        if state == Upgrade::Offered || fc != (state != Upgrade::Early) {
            return false;
        }
        let Some(held) = HeldEvent::of(ev) else {
            return false;
        };
        let (n, ts) = match &held {
            HeldEvent::Data { data, ts, .. } => (Some(data.len()), *ts),
            _ => (None, 0.0),
        };
        c.held.push(held);
        if let Some(n) = n {
            c.held_bytes = c.held_bytes.saturating_add(n);
            if c.held_bytes > MAX_UPGRADE_HELD {
                self.upgrade(c, Step::Overflow, ts, out);
            }
        }
        true
    }

    fn hold_data(
        &mut self,
        c: &mut Conn,
        from_client: bool,
        ts: f64,
        data: &[u8],
        out: &mut Vec<HttpEvent>,
    ) -> bool {
        let ev = FlowEvent::Data {
            conn: c.id,
            ts,
            from_client: from_client != c.swapped,
            data,
        };
        self.hold(c, from_client, &ev, out)
    }

    /// Every transition of a switch to HTTP/2 (the reference's `_upgrade`).
    fn upgrade(&mut self, c: &mut Conn, step: Step, ts: f64, out: &mut Vec<HttpEvent>) {
        let state = c.upgrade;
        match step {
            Step::Offer(ex) => {
                c.upgrade = Upgrade::Offered;
                c.upgrade_exchange = ex;
            }
            Step::RequestEnd => {
                if state == Upgrade::Offered {
                    c.upgrade = Upgrade::Awaiting;
                } else if state == Upgrade::Early {
                    self.switch(c, ts, out);
                }
            }
            Step::Switch(ex, rest) => {
                if state == Upgrade::Offered {
                    c.upgrade = Upgrade::Early;
                    if !rest.is_empty() {
                        self.hold_data(c, false, ts, &rest, out);
                    }
                } else {
                    c.upgrade = Upgrade::Awaiting;
                    c.upgrade_exchange = ex;
                    self.switch(c, ts, out);
                    if !rest.is_empty() {
                        let ev = FlowEvent::Data {
                            conn: c.id,
                            ts,
                            from_client: c.swapped,
                            data: &rest,
                        };
                        self.feed_conn(c, &ev, out);
                    }
                }
            }
            Step::Refuse => {
                if state != Upgrade::None {
                    c.upgrade = Upgrade::None;
                    self.release_held(c, ts, out, Some("the server refused the upgrade"));
                }
            }
            Step::Preface(rest) => {
                c.upgrade = Upgrade::Prior;
                c.upgrade_exchange = c.next_exchange;
                self.hold_data(c, true, ts, &rest, out);
                self.upgrade(c, Step::Answered, ts, out);
            }
            Step::Answered => {
                if state == Upgrade::Prior && c.pending.is_empty() && !c.dirs[0].in_message {
                    self.switch(c, ts, out);
                }
            }
            Step::Close => {
                if matches!(state, Upgrade::Early | Upgrade::Prior) {
                    self.switch(c, ts, out);
                } else if state != Upgrade::None {
                    c.upgrade = Upgrade::None;
                    self.release_held(c, ts, out, None);
                }
            }
            Step::Overflow => {
                if state == Upgrade::Awaiting {
                    c.upgrade = Upgrade::None;
                    let msg = format!(
                        "over {MAX_UPGRADE_HELD} bytes from the client before the answer to \
                         its Upgrade: h2c request: read as HTTP/1.1"
                    );
                    self.error_conn(c, ts, true, "h2c", msg, out);
                    self.release_held(c, ts, out, None);
                } else if state != Upgrade::None {
                    let what = if state == Upgrade::Early {
                        "upgraded request was not whole"
                    } else {
                        "server"
                    };
                    let msg = format!(
                        "over {MAX_UPGRADE_HELD} bytes held while the {what} still answered \
                         HTTP/1.1 requests: switched to HTTP/2"
                    );
                    self.error_conn(c, ts, state == Upgrade::Early, "h2c", msg, out);
                    self.switch(c, ts, out);
                }
            }
        }
    }

    /// The connection speaks HTTP/2 from here on (the reference's `_switch`):
    /// handed over, then the held events replayed to whoever took it.
    fn switch(&mut self, c: &mut Conn, ts: f64, out: &mut Vec<HttpEvent>) {
        let state = c.upgrade;
        let upgraded = state != Upgrade::Prior;
        c.upgrade = Upgrade::None;
        c.h2 = true;
        out.push(HttpEvent::H2Handover {
            conn: c.id,
            ts,
            mode: if upgraded {
                H2Mode::Upgrade
            } else {
                H2Mode::Preface
            },
            base: c.upgrade_exchange,
            from_client: !upgraded,
            data: Vec::new(),
            swapped: c.swapped,
            opened_held: c.opened_held,
            roles_known: c.roles_known,
        });
        if upgraded {
            self.stats.upgrades = self.stats.upgrades.saturating_add(1);
        }
        let held = std::mem::take(&mut c.held);
        c.held_bytes = 0;
        if state == Upgrade::Awaiting {
            if let Some(first) = held_start(&held) {
                if !looks_like_preface(&first) && method_prefix(&first) {
                    let msg = "HTTP/1.1 request pipelined after an Upgrade: h2c request; the \
                               server switched to HTTP/2 and reads it as such";
                    self.error_conn(c, ts, true, "h2c", msg.into(), out);
                    out.push(HttpEvent::H2NoPreface { conn: c.id });
                }
            }
        }
        for ev in &held {
            self.feed_conn(c, &ev.flow(c.id), out);
        }
    }

    /// No switch: the held client bytes are parsed as they come.
    fn release_held(
        &mut self,
        c: &mut Conn,
        ts: f64,
        out: &mut Vec<HttpEvent>,
        refused: Option<&str>,
    ) {
        let held = std::mem::take(&mut c.held);
        c.held_bytes = 0;
        if let (Some(refused), Some(first)) = (refused, held_start(&held)) {
            let what = if looks_like_preface(&first) {
                "HTTP/2 connection preface"
            } else if method_prefix(&first) {
                "HTTP/1.1 request pipelined"
            } else {
                "bytes"
            };
            let msg =
                format!("{what} sent before the answer to an Upgrade: h2c request ({refused})");
            self.error_conn(c, ts, true, "h2c", msg, out);
        }
        for ev in &held {
            self.feed_conn(c, &ev.flow(c.id), out);
        }
    }

    /// An error of the connection, not of one exchange.
    fn error_conn(
        &mut self,
        c: &Conn,
        ts: f64,
        from_client: bool,
        kind: &'static str,
        message: String,
        out: &mut Vec<HttpEvent>,
    ) {
        self.stats.errors = self.stats.errors.saturating_add(1);
        out.push(HttpEvent::Error {
            conn: c.id,
            exchange: None,
            ts,
            from_client,
            kind,
            message,
        });
    }

    fn release(&mut self, c: &mut Conn, out: &mut Vec<HttpEvent>) {
        if c.opened_held {
            out.push(HttpEvent::Opened {
                conn: c.id,
                swapped: c.swapped,
            });
            c.opened_held = false;
        }
        c.roles_known = true;
    }

    fn settle_roles(
        &mut self,
        c: &mut Conn,
        fc: bool,
        data: &[u8],
        out: &mut Vec<HttpEvent>,
    ) -> bool {
        let head = &data[..data.len().min(32)];
        let looks_response = head.starts_with(b"HTTP/1.");
        let looks_request = method_prefix(head);
        let mut fc = fc;
        if (fc && looks_response) || (!fc && looks_request) {
            c.swap_dirs();
            fc = !fc;
        }
        if looks_request || looks_response {
            self.release(c, out);
        }
        fc
    }

    /// Bytes of one direction, in order: bodies, heads, the next messages.
    fn data(
        &mut self,
        c: &mut Conn,
        i: usize,
        ts: f64,
        mut data: Vec<u8>,
        out: &mut Vec<HttpEvent>,
    ) {
        while !data.is_empty() && !c.dead {
            if c.h2 {
                // a message just ended switched the connection
                out.push(HttpEvent::H2Feed {
                    conn: c.id,
                    event: HeldEvent::Data {
                        ts,
                        from_client: (i == 1) != c.swapped,
                        data,
                    },
                });
                return;
            }
            if c.upgrade != Upgrade::None && self.hold_data(c, i == 1, ts, &data, out) {
                return;
            }
            if c.dirs[i].chunked.is_some() {
                data = self.chunked_data(c, i, ts, &data, out);
            } else if c.dirs[i].body.is_some() {
                data = self.length_data(c, i, ts, data, out);
            } else {
                if c.dirs[i].head.is_none() {
                    if c.dirs[i].hunt.is_some() {
                        if c.dirs[i].resync.is_some() {
                            data = self.hunt_or_resync(c, i, ts, data, out);
                            if data.is_empty() || c.dead {
                                return;
                            }
                            let d = &c.dirs[i];
                            if d.hunt.is_none() && (d.chunked.is_some() || d.body.is_some()) {
                                continue; // resynchronised: a body goes on
                            }
                        } else {
                            data = self.hunt(c, i, ts, &data, out);
                            if data.is_empty() || c.dead {
                                return;
                            }
                        }
                    }
                    self.start_message(c, i, ts, out);
                }
                let max = self.cfg.max_header_bytes;
                let d = &mut c.dirs[i];
                if let Some(raw) = d.raw.as_mut() {
                    if raw.len() <= max {
                        raw.extend_from_slice(&data);
                    }
                }
                d.head.get_or_insert_with(Vec::new).extend_from_slice(&data);
                data = self.heads(c, i, ts, out);
            }
        }
    }

    fn start_message(&mut self, c: &mut Conn, i: usize, ts: f64, out: &mut Vec<HttpEvent>) {
        let d = &mut c.dirs[i];
        d.raw = Some(Vec::new());
        d.head = Some(Vec::new());
        d.requests = d.from_client;
        if d.from_client {
            return;
        }
        if c.pending.is_empty() {
            let ex = c.take_exchange();
            c.pending.push_back(Pending {
                exchange: ex,
                method: b"GET".to_vec(),
                h2c: false,
            });
            self.stats.desyncs = self.stats.desyncs.saturating_add(1);
            self.stats.errors = self.stats.errors.saturating_add(1);
            self.release(c, out);
            out.push(HttpEvent::Error {
                conn: c.id,
                exchange: Some(ex),
                ts,
                from_client: false,
                kind: "desync",
                message: "response without a request".into(),
            });
        }
        if let Some(p) = c.pending.pop_front() {
            let d = &mut c.dirs[i];
            d.method = p.method;
            d.h2c = p.h2c;
            d.exchange = p.exchange;
        }
    }

    /// Parse the heads in this direction's buffer; return the bytes to go on with.
    fn heads(&mut self, c: &mut Conn, i: usize, ts: f64, out: &mut Vec<HttpEvent>) -> Vec<u8> {
        loop {
            let max = self.cfg.max_header_bytes;
            let d = &mut c.dirs[i];
            let (requests, h2c) = (d.requests, d.h2c);
            let Some(buf) = d.head.as_mut() else {
                return Vec::new();
            };
            let parsed = read_head(buf, requests, max, h2c);
            let head = match parsed {
                Err(e) => {
                    let d = &c.dirs[i];
                    let rest = match &d.raw {
                        Some(r) if !r.is_empty() => r.clone(),
                        _ => d.head.clone().unwrap_or_default(),
                    };
                    self.malformed(c, i, ts, e.0, &rest, out);
                    let d = &mut c.dirs[i];
                    d.hunt = Some(Vec::new());
                    d.hunt_sol = false;
                    if rest.len() > 1 && !c.dead {
                        return rest[1..].to_vec(); // the reference recurses here
                    }
                    return Vec::new();
                }
                Ok(None) => return Vec::new(),
                Ok(Some(h)) => h,
            };
            let overflow = match &head {
                Head::Request(r) => self.request(c, i, ts, r, out),
                Head::Response(r) => {
                    let o = self.response(c, i, ts, r, out);
                    if r.status == 101 {
                        // `Upgrade: h2c` accepted: HTTP/2 from the next byte on;
                        // the request continues as stream 1.
                        let d = &mut c.dirs[i];
                        let rest = d.head.take().unwrap_or_default();
                        let ex = d.exchange;
                        d.raw = None;
                        d.exchange = -1;
                        d.h2c = false;
                        self.upgrade(c, Step::Switch(ex, rest), ts, out);
                        return Vec::new();
                    }
                    let d = &mut c.dirs[i];
                    if d.h2c && d.in_message {
                        // a final answer: the offer is refused
                        d.h2c = false;
                        self.upgrade(c, Step::Refuse, ts, out);
                    }
                    o
                }
            };
            if let Some(rest) = overflow {
                return rest; // the head ended its message (framing error)
            }
            let d = &mut c.dirs[i];
            if !d.in_message {
                continue; // a 1xx head: the final one follows
            }
            let framing = body_framing(&head, &d.method);
            let rest = d.head.take().unwrap_or_default();
            match framing {
                BodyKind::Chunked => d.chunked = Some(ChunkedBody::new()),
                BodyKind::Length(0) => self.message_end(c, i, ts, EndReason::Complete, out),
                BodyKind::Length(n) => d.body = Some(Some(n)),
                BodyKind::Close => d.body = Some(None),
                BodyKind::Tunnel => {
                    c.dead = true;
                    return Vec::new();
                }
            }
            return rest;
        }
    }

    fn length_data(
        &mut self,
        c: &mut Conn,
        i: usize,
        ts: f64,
        data: Vec<u8>,
        out: &mut Vec<HttpEvent>,
    ) -> Vec<u8> {
        let Some(body) = c.dirs[i].body else {
            return Vec::new();
        };
        let Some(remaining) = body else {
            self.body(c, i, ts, &data, out);
            return Vec::new();
        };
        let take = usize::try_from(remaining)
            .unwrap_or(usize::MAX)
            .min(data.len());
        let left = remaining.saturating_sub(take as u64);
        c.dirs[i].body = Some(Some(left));
        self.body(c, i, ts, &data[..take], out);
        if left > 0 {
            return Vec::new();
        }
        self.message_end(c, i, ts, EndReason::Complete, out);
        data[take..].to_vec()
    }

    fn chunked_data(
        &mut self,
        c: &mut Conn,
        i: usize,
        ts: f64,
        data: &[u8],
        out: &mut Vec<HttpEvent>,
    ) -> Vec<u8> {
        let Some(ch) = c.dirs[i].chunked.as_mut() else {
            return Vec::new();
        };
        let (pieces, after) = match ch.feed(data) {
            Ok(r) => r,
            Err(e) => return self.overflow(c, i, ts, e.message, e.rest, false, out),
        };
        let d = &c.dirs[i];
        if d.decoder.is_none() && !d.decode_failed {
            let (exchange, from_client) = (d.exchange, d.from_client);
            for piece in pieces {
                out.push(HttpEvent::Body {
                    conn: c.id,
                    exchange,
                    ts,
                    from_client,
                    data: piece,
                });
            }
        } else {
            for piece in pieces {
                self.body(c, i, ts, &piece, out);
            }
        }
        match after {
            None => Vec::new(),
            Some(after) => {
                self.message_end(c, i, ts, EndReason::Complete, out);
                after
            }
        }
    }

    /// Returns the bytes after the head when a Content-Length overflowed.
    fn request(
        &mut self,
        c: &mut Conn,
        i: usize,
        ts: f64,
        h: &head::RequestHead,
        out: &mut Vec<HttpEvent>,
    ) -> Option<Vec<u8>> {
        self.release(c, out);
        let ex = c.take_exchange();
        let d = &mut c.dirs[i];
        d.exchange = ex;
        d.in_message = true;
        d.raw = None;
        let h2c = upgrades_to_h2c(&h.headers);
        c.pending.push_back(Pending {
            exchange: ex,
            method: h.method.clone(),
            h2c,
        });
        if h2c {
            self.upgrade(c, Step::Offer(ex), ts, out);
        }
        self.stats.requests = self.stats.requests.saturating_add(1);
        out.push(HttpEvent::Request {
            conn: c.id,
            exchange: ex,
            ts,
            method: h.method.clone(),
            target: h.target.clone(),
            version: h.version.clone(),
            headers: h.headers.clone(),
        });
        self.set_decoder(c, i, ts, &h.headers, out);
        self.check_length(c, i, ts, &h.headers, out)
    }

    fn response(
        &mut self,
        c: &mut Conn,
        i: usize,
        ts: f64,
        h: &head::ResponseHead,
        out: &mut Vec<HttpEvent>,
    ) -> Option<Vec<u8>> {
        self.release(c, out);
        let info = h.status < 200;
        let d = &mut c.dirs[i];
        d.in_message = !info;
        if !info {
            d.raw = None;
        }
        self.stats.responses = self.stats.responses.saturating_add(1);
        out.push(HttpEvent::Response {
            conn: c.id,
            exchange: d.exchange,
            ts,
            status: h.status,
            reason: h.reason.clone(),
            version: h.version.clone(),
            headers: h.headers.clone(),
            informational: info,
        });
        if info {
            return None;
        }
        self.set_decoder(c, i, ts, &h.headers, out);
        self.check_length(c, i, ts, &h.headers, out)
    }

    fn check_length(
        &mut self,
        c: &mut Conn,
        i: usize,
        ts: f64,
        headers: &Headers,
        out: &mut Vec<HttpEvent>,
    ) -> Option<Vec<u8>> {
        let n = head::content_length(headers)?;
        if n > u128::from(MAX_BODY_LENGTH) {
            let rest = c.dirs[i].head.clone().unwrap_or_default();
            return Some(self.overflow(
                c,
                i,
                ts,
                "Content-Length out of range".into(),
                rest,
                true,
                out,
            ));
        }
        None
    }

    /// Framing that cannot be honoured: end the message as an error; the
    /// bytes to look for the next message in are returned.
    #[allow(clippy::too_many_arguments)]
    fn overflow(
        &mut self,
        c: &mut Conn,
        i: usize,
        ts: f64,
        msg: String,
        rest: Vec<u8>,
        at_line_start: bool,
        out: &mut Vec<HttpEvent>,
    ) -> Vec<u8> {
        self.error(c, i, ts, "framing", msg, out);
        let d = &mut c.dirs[i];
        d.hunt = Some(Vec::new());
        d.hunt_sol = at_line_start;
        rest
    }

    fn set_decoder(
        &mut self,
        c: &mut Conn,
        i: usize,
        ts: f64,
        headers: &Headers,
        out: &mut Vec<HttpEvent>,
    ) {
        let (dec, err) = decoder_for(
            headers,
            self.cfg.max_decoded_bytes,
            self.cfg.max_expansion_ratio,
        );
        let d = &mut c.dirs[i];
        d.decoder = dec;
        d.decode_failed = err.is_some();
        if let Some(message) = err {
            self.stats.errors = self.stats.errors.saturating_add(1);
            out.push(HttpEvent::Error {
                conn: c.id,
                exchange: Some(d.exchange),
                ts,
                from_client: d.from_client,
                kind: "decode",
                message,
            });
        }
    }

    fn body(&mut self, c: &mut Conn, i: usize, ts: f64, data: &[u8], out: &mut Vec<HttpEvent>) {
        let conn = c.id;
        let d = &mut c.dirs[i];
        if d.decode_failed {
            return;
        }
        let data = match d.decoder.as_mut() {
            None => data.to_vec(),
            Some(dec) => match dec.feed(data) {
                Err(e) => {
                    let message = format!("{}: {}", dec.coding.name(), e.message);
                    d.decode_failed = true;
                    self.stats.errors = self.stats.errors.saturating_add(1);
                    out.push(HttpEvent::Error {
                        conn,
                        exchange: Some(d.exchange),
                        ts,
                        from_client: d.from_client,
                        kind: "decode",
                        message,
                    });
                    return;
                }
                Ok(v) if v.is_empty() => return,
                Ok(v) => v,
            },
        };
        out.push(HttpEvent::Body {
            conn,
            exchange: d.exchange,
            ts,
            from_client: d.from_client,
            data,
        });
    }

    fn message_end(
        &mut self,
        c: &mut Conn,
        i: usize,
        ts: f64,
        reason: EndReason,
        out: &mut Vec<HttpEvent>,
    ) {
        let conn = c.id;
        let d = &mut c.dirs[i];
        let mut reason = reason;
        if !d.decode_failed && reason == EndReason::Complete {
            if let Some(dec) = d.decoder.as_mut() {
                let tail = dec.flush();
                if !tail.is_empty() {
                    out.push(HttpEvent::Body {
                        conn,
                        exchange: d.exchange,
                        ts,
                        from_client: d.from_client,
                        data: tail,
                    });
                }
            }
        }
        if d.decode_failed && reason == EndReason::Complete {
            reason = EndReason::Error;
        }
        out.push(HttpEvent::End {
            conn,
            exchange: d.exchange,
            ts,
            from_client: d.from_client,
            reason,
        });
        d.decoder = None;
        d.decode_failed = false;
        d.in_message = false;
        d.head = None;
        d.body = None;
        d.chunked = None;
        d.last_exchange = d.exchange;
        d.exchange = -1;
        let (fc, ex) = (d.from_client, d.last_exchange);
        if c.upgrade != Upgrade::None {
            if !fc {
                self.upgrade(c, Step::Answered, ts, out);
            } else if ex == c.upgrade_exchange {
                self.upgrade(c, Step::RequestEnd, ts, out);
            }
        }
    }

    // ------------------------------------------------------------ recovery

    fn error(
        &mut self,
        c: &mut Conn,
        i: usize,
        ts: f64,
        kind: &'static str,
        message: String,
        out: &mut Vec<HttpEvent>,
    ) {
        self.release(c, out);
        self.stats.errors = self.stats.errors.saturating_add(1);
        let d = &c.dirs[i];
        let ex = (d.exchange >= 0).then_some(d.exchange);
        out.push(HttpEvent::Error {
            conn: c.id,
            exchange: ex,
            ts,
            from_client: d.from_client,
            kind,
            message,
        });
        if d.in_message {
            self.message_end(c, i, ts, EndReason::Error, out);
        } else if !d.from_client && d.exchange >= 0 {
            out.push(HttpEvent::End {
                conn: c.id,
                exchange: d.exchange,
                ts,
                from_client: false,
                reason: EndReason::Error,
            });
            c.dirs[i].exchange = -1;
            if c.upgrade != Upgrade::None {
                self.upgrade(c, Step::Answered, ts, out);
            }
        }
        c.dirs[i].head = None;
    }

    fn malformed(
        &mut self,
        c: &mut Conn,
        i: usize,
        ts: f64,
        msg: String,
        rest: &[u8],
        out: &mut Vec<HttpEvent>,
    ) {
        let d = &c.dirs[i];
        if d.from_client && !d.in_message {
            if let Some((method, target, version)) = loose_request_line(rest) {
                let version = version.unwrap_or_else(|| b"0.9".to_vec());
                self.release(c, out);
                let ex = c.take_exchange();
                c.pending.push_back(Pending {
                    exchange: ex,
                    method: method.clone(),
                    h2c: false,
                });
                self.stats.requests = self.stats.requests.saturating_add(1);
                let d = &mut c.dirs[i];
                d.exchange = ex;
                d.in_message = true;
                out.push(HttpEvent::Request {
                    conn: c.id,
                    exchange: ex,
                    ts,
                    method,
                    target: target.unwrap_or_default(),
                    version,
                    headers: Vec::new(),
                });
                self.error(
                    c,
                    i,
                    ts,
                    "framing",
                    format!("bad request line ({msg})"),
                    out,
                );
                return;
            }
        }
        let d = &c.dirs[i];
        let looks_http = d.in_message || start_at(rest, 0, d.from_client);
        self.error(
            c,
            i,
            ts,
            if looks_http { "framing" } else { "not-http" },
            msg,
            out,
        );
    }

    /// Look for the next start line; the bytes from it on (empty if not found yet).
    fn hunt(
        &mut self,
        c: &mut Conn,
        i: usize,
        ts: f64,
        data: &[u8],
        out: &mut Vec<HttpEvent>,
    ) -> Vec<u8> {
        let d = &mut c.dirs[i];
        let request = d.from_client;
        let Some(buf) = d.hunt.as_mut() else {
            return Vec::new();
        };
        if (!buf.is_empty() || d.hunt_sol) && start_at(data, 0, request) {
            self.stats.hunted_bytes = self.stats.hunted_bytes.saturating_add(buf.len() as u64);
            d.hunt = None;
            d.hunted = 0;
            d.hunt_sol = true;
            return data.to_vec();
        }
        buf.extend_from_slice(data);
        let mut m = search_start(buf, 0, request);
        if m == Some(0) && !d.hunt_sol {
            m = search_start(buf, 1, request);
        }
        match m {
            None => {
                self.stats.hunted_bytes = self.stats.hunted_bytes.saturating_add(data.len() as u64);
                d.hunted = d.hunted.saturating_add(data.len() as u64);
                if buf.len() > HUNT_KEEP {
                    let cut = buf.len().saturating_sub(HUNT_KEEP);
                    buf.drain(..cut);
                    d.hunt_sol = false;
                }
                if d.hunted > DEAD_AFTER && c.next_exchange == 0 {
                    let hunted = d.hunted;
                    c.dead = true;
                    self.stats.dead_connections = self.stats.dead_connections.saturating_add(1);
                    self.error(
                        c,
                        i,
                        ts,
                        "not-http",
                        format!("no HTTP found in {hunted} bytes"),
                        out,
                    );
                }
                Vec::new()
            }
            Some(s) => {
                self.stats.hunted_bytes = self.stats.hunted_bytes.saturating_add(s as u64);
                let rest = buf[s..].to_vec();
                d.hunt = None;
                d.hunted = 0;
                d.hunt_sol = true;
                rest
            }
        }
    }

    fn gap(
        &mut self,
        c: &mut Conn,
        i: usize,
        ts: f64,
        nbytes: Option<u64>,
        reason: &str,
        out: &mut Vec<HttpEvent>,
    ) {
        if nbytes.is_none() && reason != "midstream" && reason != "restart" {
            out.push(HttpEvent::FlowGap {
                conn: c.id,
                ts,
                from_client: c.dirs[i].from_client,
                nbytes: None,
                reason: reason.into(),
            });
            return;
        }
        self.stats.gaps = self.stats.gaps.saturating_add(1);
        let d = &mut c.dirs[i];
        if d.resync.is_some() && d.resync_exchange >= 0 {
            d.resync_lost = match (d.resync_lost, nbytes) {
                (Some(a), Some(b)) => Some(a.saturating_add(b)),
                _ => None,
            };
            d.resync_gaps = d.resync_gaps.saturating_add(1);
            d.resync = Some(FramingSync::new(Some(true)));
            d.hunt = Some(Vec::new());
            return;
        }
        if !d.from_client
            && d.in_message
            && d.chunked.is_some()
            && d.decoder.is_none()
            && !d.decode_failed
        {
            d.chunked = None;
            d.hunt = Some(Vec::new());
            d.resync = Some(FramingSync::new(Some(true)));
            d.resync_exchange = d.exchange;
            d.resync_lost = nbytes;
            d.resync_gaps = 1;
            return;
        }
        let mut unknown_body = !d.from_client;
        if d.in_message {
            self.message_end(c, i, ts, EndReason::Gap, out);
            unknown_body = false;
        } else if !d.from_client {
            let mut ex = d.exchange;
            if ex < 0 && reason != "midstream" {
                if let Some(p) = c.pending.pop_front() {
                    ex = p.exchange;
                }
            }
            if ex >= 0 {
                out.push(HttpEvent::End {
                    conn: c.id,
                    exchange: ex,
                    ts,
                    from_client: false,
                    reason: EndReason::Gap,
                });
                c.dirs[i].last_exchange = ex;
                unknown_body = false;
            }
        }
        let d = &mut c.dirs[i];
        if !d.from_client {
            d.exchange = -1;
        }
        d.head = None;
        d.body = None;
        d.decoder = None;
        d.chunked = None;
        d.hunt = Some(Vec::new());
        d.resync = unknown_body.then(|| FramingSync::new(None));
        d.resync_exchange = -1;
        d.resync_lost = nbytes;
        d.resync_gaps = 1;
    }

    fn resume_failed(&mut self, c: &mut Conn, i: usize, ts: f64, out: &mut Vec<HttpEvent>) {
        let d = &mut c.dirs[i];
        d.resync = None;
        if d.resync_exchange >= 0 {
            d.resync_exchange = -1;
            if d.in_message {
                self.message_end(c, i, ts, EndReason::Gap, out);
            }
        }
    }

    fn hunt_or_resync(
        &mut self,
        c: &mut Conn,
        i: usize,
        ts: f64,
        data: Vec<u8>,
        out: &mut Vec<HttpEvent>,
    ) -> Vec<u8> {
        let got = self.hunt(c, i, ts, &data, out);
        if c.dirs[i].hunt.is_none() {
            self.resume_failed(c, i, ts, out);
            return got;
        }
        if c.dead {
            c.dirs[i].resync = None;
            return Vec::new();
        }
        let Some(sp) = c.dirs[i].resync.as_mut().and_then(|rs| rs.feed(&data)) else {
            return Vec::new();
        };
        if sp.framing.is_none() {
            self.stats.resync_skipped = self.stats.resync_skipped.saturating_add(sp.skipped);
            self.resume_failed(c, i, ts, out);
            return Vec::new();
        }
        self.start_recovered(c, i, ts, &sp, out);
        sp.rest
    }

    fn start_recovered(
        &mut self,
        c: &mut Conn,
        i: usize,
        ts: f64,
        sp: &SyncPoint,
        out: &mut Vec<HttpEvent>,
    ) {
        let Some(framing) = sp.framing else { return };
        let d = &mut c.dirs[i];
        d.resync = None;
        d.hunt = None;
        d.hunted = 0;
        self.release(c, out);
        let recovered = c.dirs[i].resync_exchange < 0;
        if recovered {
            let ex = c.take_exchange();
            let d = &mut c.dirs[i];
            d.exchange = ex;
            d.in_message = true;
            d.method = Vec::new();
            d.raw = None;
            d.head = None;
            d.decoder = None;
            d.decode_failed = false;
        }
        let d = &mut c.dirs[i];
        d.resync_exchange = -1;
        self.stats.resyncs = self.stats.resyncs.saturating_add(1);
        self.stats.resync_skipped = self.stats.resync_skipped.saturating_add(sp.skipped);
        out.push(HttpEvent::Resync {
            conn: c.id,
            exchange: d.exchange,
            ts,
            framing,
            skipped: sp.skipped,
            recovered,
            lost: d.resync_lost,
            gaps: d.resync_gaps.max(1),
        });
        match framing {
            SyncFraming::Chunked => d.chunked = Some(ChunkedBody::new()),
            SyncFraming::Identity => d.body = Some(None),
        }
    }

    /// One direction ended (FIN, RST, idle, end of capture).
    fn end(&mut self, c: &mut Conn, i: usize, ts: f64, reason: &str, out: &mut Vec<HttpEvent>) {
        let mut end = if reason == "rst" {
            EndReason::Rst
        } else {
            EndReason::Eof
        };
        if c.dirs[i].resync.is_some() && c.dirs[i].hunt.is_some() && !c.dead {
            if let Some(sp) = c.dirs[i].resync.as_mut().map(FramingSync::finish) {
                if sp.framing.is_some() {
                    self.start_recovered(c, i, ts, &sp, out);
                    if !sp.rest.is_empty() {
                        self.data(c, i, ts, sp.rest, out);
                    }
                }
            }
        }
        let d = &mut c.dirs[i];
        if d.resync.is_some() {
            if d.resync_exchange >= 0 {
                end = EndReason::Gap;
            }
            d.resync = None;
            d.resync_exchange = -1;
        }
        if d.in_message {
            if reason == "fin" && d.body == Some(None) {
                end = EndReason::Complete;
            }
            self.message_end(c, i, ts, end, out);
        } else if !d.from_client && d.exchange >= 0 {
            out.push(HttpEvent::End {
                conn: c.id,
                exchange: d.exchange,
                ts,
                from_client: false,
                reason: end,
            });
            d.last_exchange = d.exchange;
            d.exchange = -1;
        }
        let d = &mut c.dirs[i];
        d.head = None;
        d.body = None;
        d.chunked = None;
        d.hunt = None;
    }
}

#[cfg(test)]
mod tests;
