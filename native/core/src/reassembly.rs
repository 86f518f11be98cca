//! TCP reassembly: captured segments in, ordered bytes per direction out.
//!
//! The mirror of `sniffer/core/reassembly.py`, whose module docstring is the
//! specification (the loss rules, roles, opening, closing, caps); this file
//! follows it step by step, call for call, so that both produce the same flow
//! events in the same order with the same timestamps. Names match the Python
//! methods (`data`, `insert`, `drain`, `skip_to`, …) to make the two easy to
//! read side by side.
//!
//! Offsets are `i64` (Python's are unbounded; a stream would need 2^63 bytes
//! to tell); sequence numbers are `i64` holding a `u32`, or -1 while unknown.
//! Sizes off the wire are at most a frame long, so sums of offsets and
//! lengths cannot overflow.

// Offsets start at 0 and move by at most a frame's length (or a window,
// 2^30) per segment; sequence numbers are masked to 32 bits after every step:
// no sum or difference here comes near i64's range, so the arithmetic lint
// (for sizes read off the wire, which link.rs checks) is off in this module.
#![allow(clippy::arithmetic_side_effects)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{Hash, Hasher};

use crate::ids::IdMap;
use crate::link::{Addr, Seg};

pub const FIN: u8 = 0x01;
pub const SYN: u8 = 0x02;
pub const RST: u8 = 0x04;
pub const ACK: u8 = 0x10;

const MASK: i64 = 0xFFFF_FFFF;
const WRAP: i64 = 1 << 32;
const HALF_WRAP: i64 = 1 << 31;
const MAX_WINDOW: i64 = 1 << 30;
/// Seconds an adopted connection may stay silent and still be handed over again.
pub const RESUME_SILENCE: f64 = 60.0;
const CLOSED_LINGER: f64 = 10.0;
const PREV_MAX: usize = 1024;

/// An endpoint: address and port.
pub type Endpoint = (Addr, u16);
/// (src, sport, dst, dport) of one direction.
pub type Key = (Addr, u16, Addr, u16);

/// A gap's reason: one of the fixed ones, or a capture source's name.
pub type Reason = std::borrow::Cow<'static, str>;

/// The flow events of `sniffer/core/events.py`, field for field.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    Opened {
        conn: i64,
        ts: f64,
        client: Endpoint,
        server: Endpoint,
        syn_seen: bool,
    },
    Data {
        conn: i64,
        ts: f64,
        from_client: bool,
        data: Vec<u8>,
    },
    Gap {
        conn: i64,
        ts: f64,
        from_client: bool,
        nbytes: Option<i64>,
        reason: Reason,
    },
    End {
        conn: i64,
        ts: f64,
        from_client: bool,
        reason: &'static str,
    },
    Closed {
        conn: i64,
        ts: f64,
        reason: &'static str,
    },
    Anomaly {
        conn: i64,
        ts: f64,
        from_client: bool,
        kind: &'static str,
        detail: String,
        /// "overlap-mismatch": the first differing overlap, as an offset in this
        /// direction's byte stream and a length; -1 and 0 for the other kinds
        offset: i64,
        length: i64,
    },
}

/// `ReassemblyStats`: counters, all monotonically increasing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub segments: i64,
    pub bytes_delivered: i64,
    pub retransmissions: i64,
    pub overlaps_inconsistent: i64,
    pub out_of_order: i64,
    pub gaps: i64,
    pub gap_bytes: i64,
    pub connections: i64,
    pub midstream: i64,
    pub buffer_cap_hits: i64,
    pub port_reuse: i64,
}

/// The settings of a `Reassembler`.
#[derive(Clone, Debug)]
pub struct Config {
    pub conn_id_base: i64,
    pub server_ports: HashSet<u16>,
    pub max_buffer: i64,
    pub idle_timeout: f64,
    pub hole_timeout: f64,
    pub max_connections: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            conn_id_base: 1,
            server_ports: HashSet::new(),
            max_buffer: 4 << 20,
            idle_timeout: 300.0,
            hole_timeout: 1.0,
            max_connections: 100_000,
        }
    }
}

/// Where connection ids come from: an id source (the store's id blocks), or
/// sequential from `conn_id_base`. An error is the source's message; the segment
/// that needed the id is dropped (and its events), as in the Python.
pub type IdSource<'a> = &'a mut dyn FnMut() -> Result<i64, String>;

/// One buffered piece; empty `data` is an ACK marker.
#[derive(Clone, Debug)]
struct Piece {
    off: i64,
    data: Vec<u8>,
    ts: f64,
}

#[derive(Clone, Debug)]
struct Half {
    from_client: bool,
    last_ts: f64,
    live: bool,
    isn: i64,
    next_seq: i64,
    next_off: i64,
    fin_off: Option<i64>,
    ended: bool,
    fast: bool,
    pend: Vec<Piece>,
    pend_bytes: i64,
    pend_oldest: f64,
    acc: Vec<u8>,
    ack_target: i64,
    prev_off: i64,
    prev_data: Vec<u8>,
    resume: bool,
}

impl Half {
    fn new(from_client: bool, ts: f64) -> Half {
        Half {
            from_client,
            last_ts: ts,
            live: true,
            isn: -1,
            next_seq: -1,
            next_off: 0,
            fin_off: None,
            ended: false,
            fast: false,
            pend: Vec::new(),
            pend_bytes: 0,
            pend_oldest: 0.0,
            acc: Vec::new(),
            ack_target: 0,
            prev_off: 0,
            prev_data: Vec::new(),
            resume: false,
        }
    }

    fn start(&mut self, seq: i64) {
        self.next_seq = seq & MASK;
        self.next_off = 0;
        self.fast = self.live && self.fin_off.is_none() && !self.ended;
    }

    fn open_fast(&self) -> bool {
        self.live && self.fin_off.is_none() && !self.ended
    }
}

#[derive(Clone, Debug)]
struct Conn {
    id: i64,
    order: u64,
    closed: bool,
    keys: [Key; 2],
    /// [c2s, s2c]
    h: [Half; 2],
}

impl Conn {
    fn new(id: i64, ts: f64, client: Endpoint, server: Endpoint) -> Conn {
        Conn {
            id,
            order: 0,
            closed: false,
            keys: [
                (client.0, client.1, server.0, server.1),
                (server.0, server.1, client.0, client.1),
            ],
            h: [Half::new(true, ts), Half::new(false, ts)],
        }
    }

    fn last_ts(&self) -> f64 {
        let (a, b) = (self.h[0].last_ts, self.h[1].last_ts);
        if b > a {
            b
        } else {
            a
        }
    }
}

/// What the per-connection steps need besides the connection.
struct Ctx<'a> {
    stats: &'a mut Stats,
    open: &'a mut i64,
    max_buffer: i64,
    hole_timeout: f64,
}

/// A direction's `Key` as the `halves` table hashes it: its bytes in ONE
/// write to the hasher. The tuple's derived `Hash` makes eight (each
/// address's variant, length and bytes, each port), and the table's
/// SipHash pays mostly per write: ~680 instructions per look-up, one per
/// captured segment, against ~250. The same keys are equal (the `Key`'s
/// equality); the bytes tell the variants apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct HalfKey(Key);

impl Hash for HalfKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        fn put(buf: &mut [u8], addr: &Addr, port: u16) {
            let (tag, rest) = buf.split_at_mut(1);
            let (bytes, tail) = rest.split_at_mut(16);
            match addr {
                Addr::V4(a) => {
                    tag[0] = 4;
                    bytes[..4].copy_from_slice(a);
                }
                Addr::V6(a) => {
                    tag[0] = 6;
                    bytes.copy_from_slice(a);
                }
                Addr::Invalid => {}
            }
            tail.copy_from_slice(&port.to_le_bytes());
        }
        let (src, sport, dst, dport) = &self.0;
        let mut buf = [0u8; 38];
        let (a, b) = buf.split_at_mut(19);
        put(a, src, *sport);
        put(b, dst, *dport);
        state.write(&buf);
    }
}

/// Per-connection, per-direction TCP stream reassembly.
pub struct Reassembler {
    pub cfg: Config,
    pub stats: Stats,
    next_id: i64,
    halves: HashMap<HalfKey, (i64, usize)>,
    /// by connection id (`ids`: ids are ours, not the wire's)
    conns: IdMap<i64, Conn>,
    /// insertion order of `conns` (a Python dict's iteration order)
    order: BTreeMap<u64, i64>,
    order_next: u64,
    open: i64,
}

fn seq_delta(a: i64, b: i64) -> i64 {
    let mut d = (a - b) & MASK;
    if d >= HALF_WRAP {
        d -= WRAP;
    }
    d
}

fn len64(b: &[u8]) -> i64 {
    i64::try_from(b.len()).unwrap_or(i64::MAX)
}

/// `i` in `0..=len` for an offset difference known to be in range.
fn ix(v: i64) -> usize {
    usize::try_from(v).unwrap_or(0)
}

impl Reassembler {
    pub fn new(cfg: Config) -> Reassembler {
        let mut cfg = cfg;
        cfg.max_connections = cfg.max_connections.max(1);
        Reassembler {
            next_id: cfg.conn_id_base,
            cfg,
            stats: Stats::default(),
            halves: HashMap::new(),
            conns: IdMap::default(),
            order: BTreeMap::new(),
            order_next: 0,
            open: 0,
        }
    }

    /// Connections opened and not yet closed.
    pub fn open_connections(&self) -> i64 {
        self.open
    }

    /// Connections tracked (open ones and closed tombstones).
    pub fn tracked(&self) -> usize {
        self.conns.len()
    }

    fn ctx(&mut self) -> (Ctx<'_>, &mut IdMap<i64, Conn>) {
        (
            Ctx {
                stats: &mut self.stats,
                open: &mut self.open,
                max_buffer: self.cfg.max_buffer,
                hole_timeout: self.cfg.hole_timeout,
            },
            &mut self.conns,
        )
    }

    fn ids_in_order(&self) -> Vec<i64> {
        self.order.values().copied().collect()
    }

    // ------------------------------------------------------------------ feed

    /// Process one captured segment, appending the flow events it caused to
    /// `out`. On an id source error nothing is appended (the Python's feed
    /// raises and its events are lost) and the message is returned.
    pub fn feed(
        &mut self,
        ts: f64,
        seg: &Seg<'_>,
        ids: Option<IdSource<'_>>,
        out: &mut Vec<Event>,
    ) -> Result<(), String> {
        let mark = out.len();
        let r = self.feed_inner(ts, seg, ids, out);
        if r.is_err() {
            out.truncate(mark);
        }
        r
    }

    fn feed_inner(
        &mut self,
        ts: f64,
        seg: &Seg<'_>,
        ids: Option<IdSource<'_>>,
        out: &mut Vec<Event>,
    ) -> Result<(), String> {
        self.stats.segments += 1;
        let key = (seg.src, seg.sport, seg.dst, seg.dport);
        let found = self.halves.get(&HalfKey(key)).copied();
        let Some((cid, d)) = found else {
            return self.feed_slow(ts, seg, None, ids, out);
        };
        let live = self.conns.get(&cid).is_some_and(|c| c.h[d].live);
        if seg.flags & (SYN | FIN | RST) != 0 || !live {
            return self.feed_slow(ts, seg, Some((cid, d)), ids, out);
        }
        // Fast path: an established connection, no SYN/FIN/RST.
        let (mut cx, conns) = self.ctx();
        let Some(c) = conns.get_mut(&cid) else {
            return Ok(());
        };
        let p = 1 - d;
        c.h[d].last_ts = ts;
        let seq = i64::from(seg.seq);
        let ack = i64::from(seg.ack);
        let payload = seg.payload;
        if seg.flags & ACK != 0 && ack != c.h[p].next_seq && c.h[p].next_seq >= 0 {
            let dd = (ack - c.h[p].next_seq) & MASK;
            if dd <= MAX_WINDOW {
                ack_ahead(&mut c.h[p], dd, ts);
            }
        }
        if payload.is_empty() {
            if !c.h[d].pend.is_empty() || !c.h[p].pend.is_empty() {
                check_holes(&mut cx, c, d, ts, out);
                check_holes(&mut cx, c, p, ts, out);
            }
            return Ok(());
        }
        let h = &mut c.h[d];
        if h.fast && seq == h.next_seq {
            let n = len64(payload);
            let off = h.next_off;
            h.next_seq = (seq + n) & MASK;
            h.next_off = off + n;
            h.prev_data.clear();
            if payload.len() <= PREV_MAX {
                h.prev_off = off;
                h.prev_data.extend_from_slice(payload);
            } else {
                h.prev_off = off + n - PREV_MAX as i64;
                h.prev_data
                    .extend_from_slice(&payload[payload.len() - PREV_MAX..]);
            }
            cx.stats.bytes_delivered += n;
            out.push(Event::Data {
                conn: c.id,
                ts,
                from_client: h.from_client,
                data: payload.to_vec(),
            });
        } else {
            data(&mut cx, c, d, seq, payload, ts, out);
            if c.h[d].ack_target > c.h[d].next_off {
                resolve_acked(&mut cx, c, d, ts, out);
            }
            flush_acc(&mut cx, c, d, ts, out);
        }
        if !c.h[d].pend.is_empty() || !c.h[p].pend.is_empty() {
            check_holes(&mut cx, c, d, ts, out);
            check_holes(&mut cx, c, p, ts, out);
        }
        Ok(())
    }

    fn feed_slow(
        &mut self,
        ts: f64,
        seg: &Seg<'_>,
        found: Option<(i64, usize)>,
        ids: Option<IdSource<'_>>,
        out: &mut Vec<Event>,
    ) -> Result<(), String> {
        let flags = seg.flags;
        let mut seq = i64::from(seg.seq);
        let ack = i64::from(seg.ack);
        let payload = seg.payload;
        let (cid, d) = if flags & SYN != 0 {
            if flags & RST != 0 {
                return Ok(()); // nonsense flag combination
            }
            let Some(h) = self.on_syn(ts, seg, found, ids, out)? else {
                return Ok(());
            };
            seq = (seq + 1) & MASK; // the SYN occupies one sequence number
            h
        } else if let Some(h) = found {
            h
        } else {
            if payload.is_empty() || flags & RST != 0 {
                return Ok(()); // no connection worth opening for a bare ACK/FIN/RST
            }
            self.open_midstream(ts, seg, ids, out)?
        };
        let (mut cx, conns) = self.ctx();
        let Some(c) = conns.get_mut(&cid) else {
            return Ok(());
        };
        let p = 1 - d;
        c.h[d].last_ts = ts;
        if c.closed {
            if !payload.is_empty() {
                cx.stats.retransmissions += 1; // late data after the close
            }
            return Ok(());
        }
        if flags & ACK != 0 {
            let pn = c.h[p].next_seq;
            if ack != pn && pn >= 0 && !c.h[p].ended {
                let dd = (ack - pn) & MASK;
                if dd <= MAX_WINDOW {
                    ack_ahead(&mut c.h[p], dd, ts);
                }
            }
        }
        if flags & RST != 0 {
            if !c.closed {
                close(&mut cx, c, "rst", ts, out);
            }
            return Ok(());
        }
        if !payload.is_empty() {
            data(&mut cx, c, d, seq, payload, ts, out);
        }
        if c.h[d].ack_target > c.h[d].next_off {
            resolve_acked(&mut cx, c, d, ts, out);
        }
        if flags & FIN != 0 {
            fin(&mut cx, c, d, (seq + len64(payload)) & MASK, ts, out);
        }
        if !c.closed {
            check_holes(&mut cx, c, d, ts, out);
            check_holes(&mut cx, c, p, ts, out);
            flush_acc(&mut cx, c, d, ts, out);
        }
        Ok(())
    }

    // ------------------------------------------------------- connection setup

    fn on_syn(
        &mut self,
        ts: f64,
        seg: &Seg<'_>,
        found: Option<(i64, usize)>,
        ids: Option<IdSource<'_>>,
        out: &mut Vec<Event>,
    ) -> Result<Option<(i64, usize)>, String> {
        let seq = i64::from(seg.seq);
        let ack = i64::from(seg.ack);
        let synack = seg.flags & ACK != 0;
        if let Some((cid, d)) = found {
            let (mut cx, conns) = self.ctx();
            if let Some(c) = conns.get_mut(&cid) {
                let p = 1 - d;
                let closing = c.closed
                    || c.h[d].ended
                    || c.h[p].ended
                    || c.h[d].fin_off.is_some()
                    || c.h[p].fin_off.is_some();
                if !closing {
                    let h = &mut c.h[d];
                    if !synack {
                        if h.from_client && h.isn == seq {
                            return Ok(Some((cid, d))); // retransmitted SYN
                        }
                    } else if !h.from_client {
                        if h.isn == seq {
                            return Ok(Some((cid, d))); // retransmitted SYN+ACK
                        }
                        if h.next_seq < 0 {
                            // the answer to the SYN we saw
                            h.isn = seq;
                            h.start(seq + 1);
                            return Ok(Some((cid, d)));
                        }
                    }
                }
                // Port reuse: the old connection is gone, unseen.
                cx.stats.port_reuse += 1;
                if !c.closed {
                    close(&mut cx, c, "idle", ts, out);
                }
                self.forget_conn(cid);
            }
        }
        let src = (seg.src, seg.sport);
        let dst = (seg.dst, seg.dport);
        let (cid, d) = if !synack {
            (self.new_conn(ts, src, dst, true, ids, out)?, 0)
        } else {
            let cid = self.new_conn(ts, dst, src, true, ids, out)?;
            if let Some(c) = self.conns.get_mut(&cid) {
                // The SYN+ACK acknowledges the client's ISN + 1.
                c.h[0].isn = (ack - 1) & MASK;
                c.h[0].start(ack);
            }
            (cid, 1)
        };
        if let Some(c) = self.conns.get_mut(&cid) {
            c.h[d].isn = seq;
            c.h[d].start(seq + 1);
        }
        Ok(Some((cid, d)))
    }

    fn open_midstream(
        &mut self,
        ts: f64,
        seg: &Seg<'_>,
        ids: Option<IdSource<'_>>,
        out: &mut Vec<Event>,
    ) -> Result<(i64, usize), String> {
        let ports = &self.cfg.server_ports;
        let src_is_server = if ports.contains(&seg.dport) {
            false
        } else if ports.contains(&seg.sport) {
            true
        } else {
            seg.sport < seg.dport
        };
        let src = (seg.src, seg.sport);
        let dst = (seg.dst, seg.dport);
        if src_is_server {
            Ok((self.new_conn(ts, dst, src, false, ids, out)?, 1))
        } else {
            Ok((self.new_conn(ts, src, dst, false, ids, out)?, 0))
        }
    }

    fn insert_conn(&mut self, mut conn: Conn) {
        let id = conn.id;
        if let Some(old) = self.conns.get(&id) {
            conn.order = old.order; // a dict keeps the position of a key set again
        } else {
            conn.order = self.order_next;
            self.order_next += 1;
            self.order.insert(conn.order, id);
        }
        self.halves.insert(HalfKey(conn.keys[0]), (id, 0));
        self.halves.insert(HalfKey(conn.keys[1]), (id, 1));
        self.conns.insert(id, conn);
        self.open += 1;
    }

    fn new_conn(
        &mut self,
        ts: f64,
        client: Endpoint,
        server: Endpoint,
        syn_seen: bool,
        ids: Option<IdSource<'_>>,
        out: &mut Vec<Event>,
    ) -> Result<i64, String> {
        if self.conns.len() >= self.cfg.max_connections {
            self.evict(ts, out);
        }
        let id = match ids {
            Some(f) => f()?,
            None => {
                let id = self.next_id;
                self.next_id = self.next_id.wrapping_add(1);
                id
            }
        };
        self.insert_conn(Conn::new(id, ts, client, server));
        self.stats.connections += 1;
        out.push(Event::Opened {
            conn: id,
            ts,
            client,
            server,
            syn_seen,
        });
        Ok(id)
    }

    /// Make room for one connection: drop closed ones, else the least recently active.
    fn evict(&mut self, ts: f64, out: &mut Vec<Event>) {
        let closed: Vec<i64> = self
            .ids_in_order()
            .into_iter()
            .filter(|id| self.conns[id].closed)
            .collect();
        for id in closed {
            self.forget_conn(id);
        }
        if self.conns.len() < self.cfg.max_connections {
            return;
        }
        let mut oldest: Option<(f64, i64)> = None;
        for id in self.ids_in_order() {
            let t = self.conns[&id].last_ts();
            if oldest.is_none_or(|(best, _)| t < best) {
                oldest = Some((t, id));
            }
        }
        if let Some((_, id)) = oldest {
            let (mut cx, conns) = self.ctx();
            if let Some(c) = conns.get_mut(&id) {
                close(&mut cx, c, "idle", ts, out);
            }
            self.forget_conn(id);
        }
    }

    fn forget_conn(&mut self, id: i64) {
        if let Some(c) = self.conns.remove(&id) {
            self.order.remove(&c.order);
            for (d, key) in c.keys.iter().enumerate() {
                if self.halves.get(&HalfKey(*key)) == Some(&(id, d)) {
                    self.halves.remove(&HalfKey(*key));
                }
            }
        }
    }

    // ------------------------------------------------------------ checkpoints

    /// (next c2s sequence number, next s2c one) of an open connection, or None.
    pub fn checkpoint(&self, conn_id: i64, now: Option<f64>) -> Option<(i64, i64)> {
        let c = self.conns.get(&conn_id)?;
        if c.closed {
            return None;
        }
        if c.h[1].next_seq < 0 || c.h.iter().any(|h| h.ended || h.fin_off.is_some()) {
            return None;
        }
        if c.h[1].resume && now.is_none_or(|now| now - c.last_ts() > RESUME_SILENCE) {
            return None;
        }
        Some((c.h[0].next_seq, c.h[1].next_seq))
    }

    /// Drop a connection without closing it (it was checkpointed).
    pub fn forget(&mut self, conn_id: i64) {
        if let Some(c) = self.conns.get(&conn_id) {
            if !c.closed {
                self.open -= 1;
            }
            self.forget_conn(conn_id);
        }
    }

    /// Take over a connection another instance checkpointed (see the Python).
    /// `c2s`/`s2c` are sequence numbers, or negative for "never seen".
    pub fn adopt(
        &mut self,
        conn_id: i64,
        ts: f64,
        client: Endpoint,
        server: Endpoint,
        c2s: i64,
        s2c: i64,
    ) {
        if self.conns.len() >= self.cfg.max_connections {
            self.evict(ts, &mut Vec::new());
        }
        let mut conn = Conn::new(conn_id, ts, client, server);
        for (h, seq) in conn.h.iter_mut().zip([c2s, s2c]) {
            if seq < 0 {
                continue; // never seen: it starts mid-way when it shows up
            }
            h.start(seq);
            h.fast = false; // the first segment goes through data (see resume)
            h.resume = true;
        }
        let keys = conn.keys;
        self.insert_conn(conn);
        // Keys with an address no segment has are never looked up.
        for key in keys {
            if key.0 == Addr::Invalid || key.2 == Addr::Invalid {
                self.halves.remove(&HalfKey(key));
            }
        }
    }

    // ------------------------------------------------------ time and capture

    /// Close connections idle for idle_timeout and declare holes older than hole_timeout.
    pub fn expire(&mut self, now: f64, out: &mut Vec<Event>) {
        let linger = CLOSED_LINGER.min(self.cfg.idle_timeout);
        let idle_timeout = self.cfg.idle_timeout;
        for id in self.ids_in_order() {
            let (mut cx, conns) = self.ctx();
            let Some(c) = conns.get_mut(&id) else {
                continue;
            };
            let idle = now - c.last_ts();
            if c.closed {
                if idle >= linger {
                    self.forget_conn(id);
                }
            } else if idle >= idle_timeout {
                close(&mut cx, c, "idle", now, out);
                self.forget_conn(id);
            } else {
                for d in 0..2 {
                    if !c.h[d].pend.is_empty() {
                        check_holes(&mut cx, c, d, now, out);
                    }
                }
            }
        }
    }

    /// End of capture: deliver what can be delivered and close every connection.
    pub fn flush(&mut self, ts: f64, out: &mut Vec<Event>) {
        for id in self.ids_in_order() {
            let (mut cx, conns) = self.ctx();
            if let Some(c) = conns.get_mut(&id) {
                if !c.closed {
                    close(&mut cx, c, "eof", ts, out);
                }
            }
        }
        self.conns.clear();
        self.order.clear();
        self.halves.clear();
    }

    /// The capture lost packets it cannot attribute: every open direction may have a gap.
    pub fn capture_gap(&mut self, ts: f64, source: &str, out: &mut Vec<Event>) {
        let reason: Reason = if source == "kernel" {
            Reason::Borrowed("kernel-drop")
        } else {
            Reason::Owned(source.to_owned())
        };
        for id in self.ids_in_order() {
            let c = &self.conns[&id];
            if c.closed {
                continue;
            }
            for h in &c.h {
                if !h.ended {
                    out.push(Event::Gap {
                        conn: c.id,
                        ts,
                        from_client: h.from_client,
                        nbytes: None,
                        reason: reason.clone(),
                    });
                    self.stats.gaps += 1;
                }
            }
        }
    }
}

// ------------------------------------------------------------ data path

fn start_midstream(
    cx: &mut Ctx<'_>,
    c: &mut Conn,
    d: usize,
    seq: i64,
    ts: f64,
    out: &mut Vec<Event>,
) {
    c.h[d].start(seq);
    cx.stats.midstream += 1;
    out.push(Event::Gap {
        conn: c.id,
        ts,
        from_client: c.h[d].from_client,
        nbytes: None,
        reason: Reason::Borrowed("midstream"),
    });
}

/// Place payload at `seq` (slow path): trim, buffer or deliver into `acc`.
fn data(
    cx: &mut Ctx<'_>,
    c: &mut Conn,
    d: usize,
    seq: i64,
    payload: &[u8],
    ts: f64,
    out: &mut Vec<Event>,
) {
    if c.h[d].ended {
        cx.stats.retransmissions += 1;
        return;
    }
    if c.h[d].next_seq < 0 {
        start_midstream(cx, c, d, seq, ts, out);
    } else if c.h[d].resume {
        resume(cx, c, d, seq, ts, out);
    }
    let id = c.id;
    let h = &mut c.h[d];
    let dd = seq_delta(seq, h.next_seq);
    let nxt = h.next_off;
    let mut off = nxt + dd;
    let mut data = payload;
    let mut end = off + len64(data);
    if dd > MAX_WINDOW {
        out.push(Event::Anomaly {
            conn: id,
            ts,
            from_client: h.from_client,
            kind: "out-of-window",
            detail: format!("{dd} bytes ahead"),
            offset: -1,
            length: 0,
        });
        return;
    }
    if let Some(fin_off) = h.fin_off {
        if end > fin_off {
            if off >= fin_off {
                out.push(Event::Anomaly {
                    conn: id,
                    ts,
                    from_client: h.from_client,
                    kind: "after-fin",
                    detail: String::new(),
                    offset: -1,
                    length: 0,
                });
                return;
            }
            data = &data[..ix(fin_off - off)];
            end = fin_off;
        }
    }
    if off < nxt {
        cx.stats.retransmissions += 1;
        check_delivered(cx, id, h, off, data, ts, out);
        if end <= nxt {
            return;
        }
        data = &data[ix(nxt - off)..];
        off = nxt;
    }
    if off == nxt && h.pend.is_empty() {
        h.acc.clear(); // empty on entry: flushed at the end of every call
        h.acc.extend_from_slice(data);
        h.next_off = end;
        h.next_seq = (h.next_seq + len64(data)) & MASK;
        return;
    }
    if off > nxt {
        cx.stats.out_of_order += 1;
    }
    insert(cx, id, h, off, data, ts, out);
    drain(h);
    if h.pend_bytes > cx.max_buffer {
        cx.stats.buffer_cap_hits += 1;
        out.push(Event::Anomaly {
            conn: id,
            ts,
            from_client: h.from_client,
            kind: "buffer-cap",
            detail: format!("{} bytes buffered", h.pend_bytes),
            offset: -1,
            length: 0,
        });
        while h.pend_bytes > cx.max_buffer && !h.pend.is_empty() {
            skip_hole(cx, id, h, ts, out);
        }
    }
}

/// First segment of a direction adopted from a checkpoint: an exact gap.
fn resume(cx: &mut Ctx<'_>, c: &mut Conn, d: usize, seq: i64, ts: f64, out: &mut Vec<Event>) {
    let id = c.id;
    let h = &mut c.h[d];
    h.resume = false;
    h.fast = h.open_fast();
    let dd = (seq - h.next_seq) & MASK;
    if 0 < dd && dd <= MAX_WINDOW {
        cx.stats.gaps += 1;
        out.push(Event::Gap {
            conn: id,
            ts,
            from_client: h.from_client,
            nbytes: Some(dd),
            reason: Reason::Borrowed("restart"),
        });
        h.next_seq = seq & MASK;
        h.next_off += dd;
    }
}

/// Compare retransmitted bytes with the last delivered chunk, where they overlap.
fn check_delivered(
    cx: &mut Ctx<'_>,
    id: i64,
    h: &Half,
    off: i64,
    data: &[u8],
    ts: f64,
    out: &mut Vec<Event>,
) {
    let p_off = h.prev_off;
    let prev = &h.prev_data;
    let a = off.max(p_off);
    let b = (off + len64(data)).min(p_off + len64(prev));
    if a < b && data[ix(a - off)..ix(b - off)] != prev[ix(a - p_off)..ix(b - p_off)] {
        mismatch(cx, id, h, a, b, ts, out);
    }
}

fn mismatch(cx: &mut Ctx<'_>, id: i64, h: &Half, a: i64, b: i64, ts: f64, out: &mut Vec<Event>) {
    cx.stats.overlaps_inconsistent += 1;
    out.push(Event::Anomaly {
        conn: id,
        ts,
        from_client: h.from_client,
        kind: "overlap-mismatch",
        detail: format!("bytes {a}..{b} differ from the first copy"),
        offset: a,
        length: b - a,
    });
}

/// Buffer `data` at `off` (>= next_off), keeping the first copy of every byte.
fn insert(
    cx: &mut Ctx<'_>,
    id: i64,
    h: &mut Half,
    off: i64,
    data: &[u8],
    ts: f64,
    out: &mut Vec<Event>,
) {
    let end = off + len64(data);
    let pend = &h.pend;
    // bisect_right(offs, off) - 1
    let mut i = pend.partition_point(|p| p.off <= off) as isize - 1;
    while i > 0 && pend[i as usize].data.is_empty() {
        i -= 1; // step back over ACK markers to the last piece starting before off
    }
    if i < 0 || pend[i as usize].off + len64(&pend[i as usize].data) <= off {
        i += 1;
    }
    let mut pieces: Vec<(i64, &[u8])> = Vec::new();
    let mut cur = off;
    let mut covered = false;
    let mut mism: Option<(i64, i64)> = None;
    let mut j = i as usize;
    while j < pend.len() && pend[j].off < end {
        let eo = pend[j].off;
        let ed = &pend[j].data;
        let ee = eo + len64(ed);
        if eo > cur {
            pieces.push((cur, &data[ix(cur - off)..ix(eo - off)]));
        }
        let a = cur.max(eo);
        let b = end.min(ee);
        if a < b {
            covered = true;
            if mism.is_none() && data[ix(a - off)..ix(b - off)] != ed[ix(a - eo)..ix(b - eo)] {
                mism = Some((a, b));
            }
        }
        cur = cur.max(ee);
        j += 1;
    }
    if cur < end {
        pieces.push((cur, &data[ix(cur - off)..]));
    }
    if covered {
        cx.stats.retransmissions += 1;
    }
    if let Some((a, b)) = mism {
        mismatch(cx, id, h, a, b, ts, out);
    }
    if pieces.is_empty() {
        return;
    }
    if h.pend.is_empty() {
        h.pend_oldest = ts;
    }
    for (p_off, p_data) in pieces {
        let k = h.pend.partition_point(|p| p.off < p_off);
        h.pend_bytes += len64(p_data);
        h.pend.insert(
            k,
            Piece {
                off: p_off,
                data: p_data.to_vec(),
                ts,
            },
        );
    }
    h.fast = false;
}

/// Move buffered pieces that start at or before next_off into `acc`.
fn drain(h: &mut Half) {
    match h.pend.first() {
        None => return,
        Some(p) if p.off > h.next_off => return,
        _ => {}
    }
    let n = h.pend.len();
    let mut k = 0;
    let mut nxt = h.next_off;
    let mut freed = 0;
    while k < n && h.pend[k].off <= nxt {
        let piece = &h.pend[k];
        let len = len64(&piece.data);
        freed += len;
        let skip = nxt - piece.off;
        if skip < len {
            h.acc.extend_from_slice(&piece.data[ix(skip)..]);
            nxt = piece.off + len;
        }
        k += 1;
    }
    h.pend_bytes -= freed;
    h.next_seq = (h.next_seq + (nxt - h.next_off)) & MASK;
    h.next_off = nxt;
    if k < n {
        h.pend.drain(..k);
        h.pend_oldest = h.pend.iter().map(|p| p.ts).fold(f64::INFINITY, f64::min);
    } else {
        h.pend = Vec::new();
        h.fast = h.open_fast();
    }
}

/// Declare the next `n` bytes lost.
fn gap(cx: &mut Ctx<'_>, id: i64, h: &mut Half, n: i64, ts: f64, out: &mut Vec<Event>) {
    flush_half(cx, id, h, ts, out);
    out.push(Event::Gap {
        conn: id,
        ts,
        from_client: h.from_client,
        nbytes: Some(n),
        reason: Reason::Borrowed("lost"),
    });
    cx.stats.gaps += 1;
    cx.stats.gap_bytes += n;
    h.next_off += n;
    h.next_seq = (h.next_seq + n) & MASK;
}

/// Declare the hole before the first buffered piece lost, and deliver what follows.
fn skip_hole(cx: &mut Ctx<'_>, id: i64, h: &mut Half, ts: f64, out: &mut Vec<Event>) {
    let n = h.pend[0].off - h.next_off;
    if n > 0 {
        gap(cx, id, h, n, ts, out);
    }
    drain(h);
}

/// Every byte below `target` not buffered is lost: declare gaps, deliver the rest.
fn skip_to(cx: &mut Ctx<'_>, id: i64, h: &mut Half, target: i64, ts: f64, out: &mut Vec<Event>) {
    while h.next_off < target {
        let first = h.pend.first().map(|p| p.off);
        if let Some(f) = first {
            if f <= h.next_off {
                drain(h);
                continue;
            }
        }
        let stop = match first {
            Some(f) if f < target => f,
            _ => target,
        };
        let n = stop - h.next_off;
        gap(cx, id, h, n, ts, out);
    }
    drain(h);
}

/// The other side acknowledged `d` sequence numbers beyond `p.next_off`: an
/// ACK marker in the out-of-order buffer (see the Python).
fn ack_ahead(p: &mut Half, d: i64, ts: f64) {
    if p.ended {
        return;
    }
    let mut target = p.next_off + d;
    if let Some(fin_off) = p.fin_off {
        if target > fin_off {
            target = fin_off; // an ACK of the FIN is not data
        }
    }
    if target <= p.next_off || target <= p.ack_target {
        return;
    }
    p.ack_target = target;
    if p.pend.is_empty() {
        p.pend_oldest = ts;
    }
    let k = p.pend.partition_point(|x| x.off < target);
    p.pend.insert(
        k,
        Piece {
            off: target,
            data: Vec::new(),
            ts,
        },
    );
    p.fast = false;
}

/// `h` sent again: bytes its peer acknowledged that are still missing are lost.
fn resolve_acked(cx: &mut Ctx<'_>, c: &mut Conn, d: usize, ts: f64, out: &mut Vec<Event>) {
    if c.h[d].ended {
        return;
    }
    let target = c.h[d].ack_target;
    skip_to(cx, c.id, &mut c.h[d], target, ts, out);
    flush_acc(cx, c, d, ts, out);
    maybe_fin_end(cx, c, d, ts, out);
}

/// Declare holes lost whose buffered data waited longer than hole_timeout.
fn check_holes(cx: &mut Ctx<'_>, c: &mut Conn, d: usize, ts: f64, out: &mut Vec<Event>) {
    let limit = cx.hole_timeout;
    let mut changed = false;
    let id = c.id;
    while !c.h[d].pend.is_empty() && ts - c.h[d].pend_oldest > limit {
        skip_hole(cx, id, &mut c.h[d], ts, out);
        changed = true;
    }
    if changed {
        flush_acc(cx, c, d, ts, out);
        maybe_fin_end(cx, c, d, ts, out);
    }
}

fn flush_acc(cx: &mut Ctx<'_>, c: &mut Conn, d: usize, ts: f64, out: &mut Vec<Event>) {
    let id = c.id;
    flush_half(cx, id, &mut c.h[d], ts, out);
}

fn flush_half(cx: &mut Ctx<'_>, id: i64, h: &mut Half, ts: f64, out: &mut Vec<Event>) {
    if h.acc.is_empty() {
        return;
    }
    let data = std::mem::take(&mut h.acc);
    let n = data.len();
    let keep = n.min(PREV_MAX);
    h.prev_off = h.next_off - keep as i64;
    h.prev_data.clear();
    h.prev_data.extend_from_slice(&data[n - keep..]);
    cx.stats.bytes_delivered += len64(&data);
    out.push(Event::Data {
        conn: id,
        ts,
        from_client: h.from_client,
        data,
    });
}

// ------------------------------------------------------------- closing

fn fin(cx: &mut Ctx<'_>, c: &mut Conn, d: usize, fin_seq: i64, ts: f64, out: &mut Vec<Event>) {
    if c.h[d].ended {
        return;
    }
    if c.h[d].next_seq < 0 {
        start_midstream(cx, c, d, fin_seq, ts, out);
    }
    let id = c.id;
    let h = &mut c.h[d];
    if h.fin_off.is_none() {
        let dd = seq_delta(fin_seq, h.next_seq);
        if dd > MAX_WINDOW {
            out.push(Event::Anomaly {
                conn: id,
                ts,
                from_client: h.from_client,
                kind: "out-of-window",
                detail: "FIN".to_owned(),
                offset: -1,
                length: 0,
            });
            return;
        }
        h.fin_off = Some((h.next_off + dd).max(h.next_off));
        h.fast = false;
        trim_beyond_fin(h);
    }
    if let Some(fin_off) = h.fin_off {
        if h.next_off < fin_off {
            skip_to(cx, id, h, fin_off, ts, out); // a hole before the FIN is lost
        }
    }
    maybe_fin_end(cx, c, d, ts, out);
}

fn trim_beyond_fin(h: &mut Half) {
    let Some(fin) = h.fin_off else { return };
    if h.pend.is_empty() {
        return;
    }
    let k = h.pend.partition_point(|p| p.off < fin);
    for p in &h.pend[k..] {
        h.pend_bytes -= len64(&p.data);
    }
    h.pend.truncate(k);
    for p in &mut h.pend {
        let over = p.off + len64(&p.data) - fin;
        if over > 0 {
            h.pend_bytes -= over;
            let keep = p.data.len() - ix(over);
            p.data.truncate(keep);
        }
    }
    if h.ack_target > fin {
        h.ack_target = fin;
    }
}

fn maybe_fin_end(cx: &mut Ctx<'_>, c: &mut Conn, d: usize, ts: f64, out: &mut Vec<Event>) {
    {
        let h = &c.h[d];
        match h.fin_off {
            Some(fin_off) if !h.ended && h.next_off >= fin_off => {}
            _ => return,
        }
    }
    flush_acc(cx, c, d, ts, out);
    let h = &mut c.h[d];
    out.push(Event::End {
        conn: c.id,
        ts,
        from_client: h.from_client,
        reason: "fin",
    });
    h.ended = true;
    h.fast = false;
    h.next_seq = (h.next_seq + 1) & MASK; // the FIN's sequence number
    h.next_off += 1;
    if c.h[1 - d].ended && !c.closed {
        close(cx, c, "fin", ts, out);
    }
}

fn end_half(
    cx: &mut Ctx<'_>,
    c: &mut Conn,
    d: usize,
    reason: &'static str,
    ts: f64,
    out: &mut Vec<Event>,
) {
    let id = c.id;
    let h = &mut c.h[d];
    if !h.ended {
        while !h.pend.is_empty() {
            skip_hole(cx, id, h, ts, out);
        }
        flush_half(cx, id, h, ts, out);
        out.push(Event::End {
            conn: id,
            ts,
            from_client: h.from_client,
            reason,
        });
        h.ended = true;
    }
    h.fast = false;
    h.live = false;
}

fn close(cx: &mut Ctx<'_>, c: &mut Conn, reason: &'static str, ts: f64, out: &mut Vec<Event>) {
    if c.h[1].resume {
        // adopted from a checkpoint and never heard of again: whatever the
        // server sent after the checkpoint was missed (count unknown)
        c.h[1].resume = false;
        cx.stats.gaps += 1;
        out.push(Event::Gap {
            conn: c.id,
            ts,
            from_client: false,
            nbytes: None,
            reason: Reason::Borrowed("restart"),
        });
    }
    end_half(cx, c, 0, reason, ts, out);
    end_half(cx, c, 1, reason, ts, out);
    c.closed = true;
    *cx.open -= 1;
    out.push(Event::Closed {
        conn: c.id,
        ts,
        reason,
    });
}

#[cfg(test)]
mod tests;
