//! Frames in, flow events out: the link layer and TCP reassembly of
//! `sparseety-core` behind one call per batch of frames.
//!
//! - `parse_frames(linktype, data, ts, bounds)`, `read_pcap(...)` and
//!   `read_pcapng(...)` turn a batch of captured frames into a `SegmentBatch`
//!   (the TCP segments, their payloads copied into one buffer), never one
//!   call per packet;
//! - `Reassembler.feed_batch(batch, start, stop)` returns the flow events of
//!   `sniffer.core.events` (the very classes the Python `Reassembler` makes),
//!   with the same timestamps (the capture's floats, passed through);
//!   `Core.feed_batch` (`fused.rs`, what the pipeline calls) gives its events
//!   to the native HTTP parser instead, no Python flow event made.
//!
//! Conversions only: the parsing and the loss rules live in `sparseety-core`.

use std::collections::HashSet;

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyList, PyTuple, PyType};
use pyo3::{intern, IntoPyObjectExt};

use crate::slots::{values, SlotClass};
use sparseety_core::link::{self, addr_text, parse_addr, Addr, Seg};
use sparseety_core::pcapng;
use sparseety_core::reassembly::{self as core_r, Event};

/// One parsed segment; its payload is `arena[start..start + len]`.
#[derive(Clone, Copy)]
pub(crate) struct Rec {
    pub(crate) ts: f64,
    src: Addr,
    pub(crate) sport: u16,
    dst: Addr,
    pub(crate) dport: u16,
    seq: u32,
    ack: u32,
    flags: u8,
    start: usize,
    len: usize,
}

/// The TCP segments of a batch of frames (what `parse_frames`/`read_pcap` return).
#[pyclass(module = "sniffer._native", frozen)]
pub struct SegmentBatch {
    pub(crate) recs: Vec<Rec>,
    arena: Vec<u8>,
    /// frames looked at (TCP or not)
    #[pyo3(get)]
    pub(crate) frames: usize,
}

impl SegmentBatch {
    pub(crate) fn new() -> SegmentBatch {
        SegmentBatch {
            recs: Vec::new(),
            arena: Vec::new(),
            frames: 0,
        }
    }

    pub(crate) fn push(&mut self, ts: f64, s: &Seg<'_>) {
        let start = self.arena.len();
        self.arena.extend_from_slice(s.payload);
        self.recs.push(Rec {
            ts,
            src: s.src,
            sport: s.sport,
            dst: s.dst,
            dport: s.dport,
            seq: s.seq,
            ack: s.ack,
            flags: s.flags,
            start,
            len: s.payload.len(),
        });
    }

    pub(crate) fn seg(&self, r: &Rec) -> Seg<'_> {
        let payload = self
            .arena
            .get(r.start..r.start.saturating_add(r.len))
            .unwrap_or(&[]);
        Seg {
            src: r.src,
            sport: r.sport,
            dst: r.dst,
            dport: r.dport,
            seq: r.seq,
            ack: r.ack,
            flags: r.flags,
            payload,
        }
    }
}

#[pymethods]
impl SegmentBatch {
    fn __len__(&self) -> usize {
        self.recs.len()
    }

    /// Capture time of the last segment, or None for an empty batch.
    #[getter]
    fn last_ts(&self) -> Option<f64> {
        self.recs.last().map(|r| r.ts)
    }

    /// Capture time of segment `i` (negative counts from the end).
    fn ts(&self, i: isize) -> PyResult<f64> {
        let n = self.recs.len() as isize;
        let j = if i < 0 { i.saturating_add(n) } else { i };
        usize::try_from(j)
            .ok()
            .and_then(|j| self.recs.get(j))
            .map(|r| r.ts)
            .ok_or_else(|| pyo3::exceptions::PyIndexError::new_err("segment index out of range"))
    }

    /// The segments as `sniffer.core.events.Segment` values (tests, the pure path).
    fn segments<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let cls = classes(py)?;
        let out = PyList::empty(py);
        for r in &self.recs {
            let s = self.seg(r);
            let fields = PyTuple::new(
                py,
                [
                    r.ts.into_bound_py_any(py)?,
                    addr_text(&s.src).into_bound_py_any(py)?,
                    s.sport.into_bound_py_any(py)?,
                    addr_text(&s.dst).into_bound_py_any(py)?,
                    s.dport.into_bound_py_any(py)?,
                    s.seq.into_bound_py_any(py)?,
                    s.ack.into_bound_py_any(py)?,
                    s.flags.into_bound_py_any(py)?,
                    PyBytes::new(py, s.payload).into_any(),
                ],
            )?;
            out.append(
                cls.tuple_new
                    .bind(py)
                    .call1((cls.segment.bind(py), fields))?,
            )?;
        }
        Ok(out)
    }
}

/// The bytes of a buffer (bytes, mmap, memoryview) for the duration of a call.
pub(crate) fn with_bytes<R>(
    _py: Python<'_>,
    obj: &Bound<'_, PyAny>,
    f: impl FnOnce(&[u8]) -> R,
) -> PyResult<R> {
    let buf = PyBuffer::<u8>::get(obj)?;
    if !buf.is_c_contiguous() {
        return Err(PyValueError::new_err("the frame buffer must be contiguous"));
    }
    let n = buf.len_bytes();
    let ptr = buf.buf_ptr() as *const u8;
    let data: &[u8] = if n == 0 || ptr.is_null() {
        &[]
    } else {
        // SAFETY: the buffer is C-contiguous, `n` bytes long and exported to
        // us (held by `buf`) until the end of this function; the GIL is held
        // throughout, so no Python code can write to or release it meanwhile
        // (an mmap with an exported buffer refuses to close or resize).
        unsafe { std::slice::from_raw_parts(ptr, n) }
    };
    let r = f(data);
    drop(buf); // released here, the GIL held
    Ok(r)
}

/// Parse frames `data[bounds[2i]:bounds[2i+1]]` captured at `ts[i]`.
#[pyfunction]
fn parse_frames(
    py: Python<'_>,
    linktype: u32,
    data: &Bound<'_, PyAny>,
    ts: Vec<f64>,
    bounds: Vec<usize>,
) -> PyResult<SegmentBatch> {
    if bounds.len() != ts.len().saturating_mul(2) {
        return Err(PyValueError::new_err(
            "bounds must hold two offsets per timestamp",
        ));
    }
    with_bytes(py, data, |buf| {
        let mut batch = SegmentBatch::new();
        for (i, &t) in ts.iter().enumerate() {
            let (a, b) = (bounds[2 * i], bounds[2 * i + 1]);
            batch.frames += 1;
            if let Some(frame) = buf.get(a..b) {
                if let Some(s) = link::parse_frame(linktype, frame) {
                    batch.push(t, &s);
                }
            }
        }
        batch
    })
}

/// Walk classic pcap records from `off`: at most `max_packets` records, or
/// until the end or a bad record. Returns (batch, next offset, packets, bytes,
/// first ts or None, last ts or None, error) where error is None or (kind, offset, value):
/// "header" (fewer than 16 bytes left), "caplen" (captured length over
/// `limit`), "record" (the record runs past the end). The timestamps are
/// `sec + frac / scale` in floats, as the Python reader computes them.
#[pyfunction]
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
fn read_pcap(
    py: Python<'_>,
    linktype: u32,
    data: &Bound<'_, PyAny>,
    off: usize,
    big_endian: bool,
    scale: u32,
    limit: u64,
    max_packets: usize,
) -> PyResult<PcapChunk> {
    with_bytes(py, data, |buf| {
        let size = buf.len();
        let mut batch = SegmentBatch::new();
        let mut off = off;
        let mut packets = 0usize;
        let mut nbytes = 0u64;
        let mut first = None;
        let mut last = None;
        let mut error = None;
        let u32_at = |at: usize| -> u32 {
            let b: [u8; 4] = buf[at..at + 4].try_into().unwrap_or([0; 4]);
            if big_endian {
                u32::from_be_bytes(b)
            } else {
                u32::from_le_bytes(b)
            }
        };
        while off < size && packets < max_packets {
            let left = size - off;
            if left < 16 {
                error = Some(("header", off, left as u64));
                break;
            }
            let (sec, frac, caplen) = (u32_at(off), u32_at(off + 4), u32_at(off + 8));
            if u64::from(caplen) > limit {
                error = Some(("caplen", off, u64::from(caplen)));
                break;
            }
            let start = off + 16;
            let end = start + caplen as usize;
            if end > size {
                error = Some(("record", off, u64::from(caplen)));
                break;
            }
            let ts = f64::from(sec) + f64::from(frac) / f64::from(scale);
            if first.is_none() {
                first = Some(ts);
            }
            last = Some(ts);
            packets += 1;
            nbytes += u64::from(caplen);
            off = end;
            batch.frames += 1;
            if let Some(s) = link::parse_frame(linktype, &buf[start..end]) {
                batch.push(ts, &s);
            }
        }
        (batch, off, packets, nbytes, first, last, error)
    })
}

/// What `read_pcap` returns.
type PcapChunk = (
    SegmentBatch,
    usize,
    usize,
    u64,
    Option<f64>,
    Option<f64>,
    Option<(&'static str, usize, u64)>,
);

/// Walk pcapng blocks from `off` (`sparseety_core::pcapng::walk`): runs of
/// packet and skippable blocks of a section of byte order `big_endian` with
/// `interfaces` ((linktype, divisor, tsoffset, snaplen) each: linktype
/// 0xFFFFFFFF for one the core does not parse, divisor 0 for packets Python
/// must time), at most `max_packets` packets; `ts` is the running timestamp.
/// Returns (batch, next offset, packets, bytes, first ts or None, ts, refused):
/// refused means it stopped at a block for the Python walk to handle.
#[pyfunction]
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
fn read_pcapng(
    py: Python<'_>,
    data: &Bound<'_, PyAny>,
    off: usize,
    big_endian: bool,
    interfaces: Vec<(u32, u64, i64, u32)>,
    ts: f64,
    max_packets: usize,
) -> PyResult<(SegmentBatch, usize, usize, u64, Option<f64>, f64, bool)> {
    let ifaces: Vec<pcapng::Iface> = interfaces
        .into_iter()
        .map(|(linktype, divisor, tsoffset, snaplen)| pcapng::Iface {
            linktype,
            divisor,
            tsoffset,
            snaplen,
        })
        .collect();
    with_bytes(py, data, |buf| {
        let mut batch = SegmentBatch::new();
        let w = pcapng::walk(
            buf,
            off,
            big_endian,
            &ifaces,
            ts,
            max_packets,
            |t, lt, frame| {
                batch.frames += 1;
                if let Some(s) = link::parse_frame(lt, frame) {
                    batch.push(t, &s);
                }
            },
        );
        (batch, w.off, w.packets, w.bytes, w.first, w.ts, w.refused)
    })
}

/// A `SegmentBatch` of `Segment` values (a pcapng block the Python walk handled; tests).
#[pyfunction]
fn segment_batch(segments: &Bound<'_, PyAny>) -> PyResult<SegmentBatch> {
    let mut batch = SegmentBatch::new();
    for item in segments.try_iter()? {
        let (ts, fields, payload) = extract_segment(&item?)?;
        batch.frames += 1;
        batch.push(ts, &fields.seg(&payload));
    }
    Ok(batch)
}

/// A segment's fields, its payload owned (see `OwnedSeg::seg`).
pub(crate) struct OwnedSeg {
    src: Addr,
    sport: u16,
    dst: Addr,
    dport: u16,
    seq: u32,
    ack: u32,
    flags: u8,
}

impl OwnedSeg {
    pub(crate) fn seg<'a>(&self, payload: &'a [u8]) -> Seg<'a> {
        Seg {
            src: self.src,
            sport: self.sport,
            dst: self.dst,
            dport: self.dport,
            seq: self.seq,
            ack: self.ack,
            flags: self.flags,
            payload,
        }
    }
}

/// (ts, fields, payload) of a `sniffer.core.events.Segment`.
pub(crate) fn extract_segment(item: &Bound<'_, PyAny>) -> PyResult<(f64, OwnedSeg, Vec<u8>)> {
    let (ts, src, sport, dst, dport, seq, ack, flags, payload): (
        f64,
        String,
        u16,
        String,
        u16,
        u32,
        u32,
        u8,
        Vec<u8>,
    ) = item.extract()?;
    let fields = OwnedSeg {
        src: parse_addr(&src),
        sport,
        dst: parse_addr(&dst),
        dport,
        seq,
        ack,
        flags,
    };
    Ok((ts, fields, payload))
}

/// The Python classes the events are made of (imported once).
pub(crate) struct Classes {
    tuple_new: Py<PyAny>,
    segment: Py<PyAny>,
    flow_data: Py<PyAny>,
    // made without their Python `__init__` (`crate::slots`)
    opened: SlotClass,
    gap: SlotClass,
    end: SlotClass,
    closed: SlotClass,
    anomaly: SlotClass,
}

static CLASSES: PyOnceLock<Classes> = PyOnceLock::new();

pub(crate) fn classes(py: Python<'_>) -> PyResult<&Classes> {
    CLASSES.get_or_try_init(py, || {
        let ev = py.import("sniffer.core.events")?;
        let get = |name: &str| -> PyResult<Py<PyAny>> { Ok(ev.getattr(name)?.unbind()) };
        let slots = |name: &str| -> PyResult<SlotClass> {
            SlotClass::new(py, &ev.getattr(name)?.cast_into::<PyType>()?)
        };
        Ok(Classes {
            tuple_new: py
                .import("builtins")?
                .getattr("tuple")?
                .getattr("__new__")?
                .unbind(),
            segment: get("Segment")?,
            flow_data: get("FlowData")?,
            opened: slots("ConnectionOpened")?,
            gap: slots("FlowGap")?,
            end: slots("FlowEnd")?,
            closed: slots("ConnectionClosed")?,
            anomaly: slots("FlowAnomaly")?,
        })
    })
}

fn reason<'py>(py: Python<'py>, r: &str) -> Bound<'py, pyo3::types::PyString> {
    match r {
        "fin" => intern!(py, "fin").clone(),
        "eof" => intern!(py, "eof").clone(),
        "idle" => intern!(py, "idle").clone(),
        "rst" => intern!(py, "rst").clone(),
        "lost" => intern!(py, "lost").clone(),
        "midstream" => intern!(py, "midstream").clone(),
        _ => pyo3::types::PyString::new(py, r),
    }
}

fn endpoint<'py>(py: Python<'py>, e: &core_r::Endpoint) -> PyResult<Bound<'py, PyTuple>> {
    PyTuple::new(
        py,
        [
            addr_text(&e.0).into_bound_py_any(py)?,
            e.1.into_bound_py_any(py)?,
        ],
    )
}

pub(crate) fn event_to_py<'py>(
    py: Python<'py>,
    cls: &Classes,
    ev: &Event,
) -> PyResult<Bound<'py, PyAny>> {
    match *ev {
        Event::Data {
            conn,
            ts,
            from_client,
            ref data,
        } => {
            let fields = PyTuple::new(
                py,
                [
                    conn.into_bound_py_any(py)?,
                    ts.into_bound_py_any(py)?,
                    from_client.into_bound_py_any(py)?,
                    PyBytes::new(py, data).into_any(),
                ],
            )?;
            cls.tuple_new
                .bind(py)
                .call1((cls.flow_data.bind(py), fields))
        }
        Event::Opened {
            conn,
            ts,
            ref client,
            ref server,
            syn_seen,
        } => cls.opened.make(
            py,
            &values![py; conn, ts, endpoint(py, client)?, endpoint(py, server)?, syn_seen],
        ),
        Event::Gap {
            conn,
            ts,
            from_client,
            nbytes,
            reason: ref r,
        } => cls.gap.make(
            py,
            &values![py; conn, ts, from_client, nbytes, reason(py, r)],
        ),
        Event::End {
            conn,
            ts,
            from_client,
            reason: r,
        } => cls
            .end
            .make(py, &values![py; conn, ts, from_client, reason(py, r)]),
        Event::Closed {
            conn,
            ts,
            reason: r,
        } => cls.closed.make(py, &values![py; conn, ts, reason(py, r)]),
        Event::Anomaly {
            conn,
            ts,
            from_client,
            kind,
            ref detail,
            offset,
            length,
        } => cls.anomaly.make(
            py,
            &values![py; conn, ts, from_client, kind, detail, offset, length],
        ),
    }
}

fn events_to_py<'py>(py: Python<'py>, events: Vec<Event>) -> PyResult<Bound<'py, PyList>> {
    let cls = classes(py)?;
    let out = PyList::empty(py);
    for ev in events {
        out.append(event_to_py(py, cls, &ev)?)?;
    }
    Ok(out)
}

fn ports(obj: Option<&Bound<'_, PyAny>>) -> PyResult<HashSet<u16>> {
    let mut set = HashSet::new();
    if let Some(obj) = obj {
        for p in obj.try_iter()? {
            // a port no segment can have is never matched: leave it out
            if let Ok(p) = p?.extract::<u16>() {
                set.insert(p);
            }
        }
    }
    Ok(set)
}

/// `Shares` of runtime/replay.py: which of `n` workers takes each record.
/// Every worker reads every record of the file in the same order and runs
/// the same rule, so all of them agree without talking: a port pair (keyed by
/// `sport ^ dport`, the same for both directions) is given, when first seen,
/// to the worker with the fewest records so far (then the fewest port pairs,
/// then the lowest number), and keeps it.
pub(crate) struct Shares {
    n: u32,
    /// share + 1 of each key seen (0: not seen yet)
    of: Vec<u16>,
    records: Vec<u64>,
    keys: Vec<u64>,
}

impl Shares {
    fn new(n: u32) -> Shares {
        let n = n.clamp(1, u32::from(u16::MAX - 1));
        let slots = n as usize;
        Shares {
            n,
            of: vec![0; 1 << 16],
            records: vec![0; slots],
            keys: vec![0; slots],
        }
    }

    /// The share of one record (counted).
    pub(crate) fn take(&mut self, sport: u16, dport: u16) -> u32 {
        let key = usize::from(sport ^ dport);
        let mut s = self.of.get(key).copied().unwrap_or(0);
        if s == 0 {
            let mut best = 0usize;
            for i in 1..self.records.len() {
                if (self.records[i], self.keys[i]) < (self.records[best], self.keys[best]) {
                    best = i;
                }
            }
            self.keys[best] = self.keys[best].saturating_add(1);
            s = u16::try_from(best + 1).unwrap_or(u16::MAX);
            if let Some(slot) = self.of.get_mut(key) {
                *slot = s;
            }
        }
        let idx = usize::from(s - 1);
        if let Some(c) = self.records.get_mut(idx) {
            *c = c.saturating_add(1);
        }
        u32::from(s - 1)
    }
}

/// The native TCP reassembler: `sniffer.core.reassembly.Reassembler`'s
/// interface, fed batches.
#[pyclass(module = "sniffer._native")]
pub struct Reassembler {
    pub(crate) inner: core_r::Reassembler,
    conn_ids: Option<Py<PyAny>>,
    pub(crate) only: HashSet<u16>,
    /// replay's split of the file between workers (made at the first batch with `share_n > 1`)
    shares: Option<Shares>,
}

/// How a batch record is taken: not at all (another worker's share), skipped
/// by the port filter, or fed.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Take {
    OtherShare,
    Skipped,
    Fed,
}

impl Reassembler {
    /// Whether worker `share_k` of `share_n` (by port pair, as replay splits
    /// a file: [`Shares`]; every record of the file goes through here, in
    /// order) feeds record `r`, given the `only_ports` filter.
    pub(crate) fn take(&mut self, r: &Rec, share_k: u32, share_n: u32) -> Take {
        if share_n > 1 && self.share(r, share_n) != share_k {
            Take::OtherShare
        } else if !self.only.is_empty()
            && !self.only.contains(&r.sport)
            && !self.only.contains(&r.dport)
        {
            Take::Skipped
        } else {
            Take::Fed
        }
    }

    fn share(&mut self, r: &Rec, share_n: u32) -> u32 {
        let shares = match &mut self.shares {
            Some(sh) if sh.n == share_n => sh,
            slot => slot.insert(Shares::new(share_n)),
        };
        shares.take(r.sport, r.dport)
    }

    /// Feed one segment; an id source failure that is an `Exception` becomes
    /// an error message (the segment is dropped), anything else propagates.
    pub(crate) fn feed_one(
        &mut self,
        py: Python<'_>,
        ts: f64,
        seg: &Seg<'_>,
        out: &mut Vec<Event>,
    ) -> PyResult<Option<String>> {
        let Some(src) = self.conn_ids.as_ref() else {
            return Ok(self.inner.feed(ts, seg, None, out).err());
        };
        let mut raised: Option<PyErr> = None;
        let mut next = || -> Result<i64, String> {
            match src.bind(py).call0().and_then(|v| v.extract::<i64>()) {
                Ok(v) => Ok(v),
                Err(e) => {
                    let msg = format!(
                        "{}: {}",
                        e.get_type(py)
                            .name()
                            .map(|n| n.to_string())
                            .unwrap_or_default(),
                        e.value(py).str().map(|s| s.to_string()).unwrap_or_default()
                    );
                    raised = Some(e);
                    Err(msg)
                }
            }
        };
        let r = self.inner.feed(ts, seg, Some(&mut next), out);
        if let Some(e) = raised {
            if !e.is_instance_of::<PyException>(py) {
                return Err(e); // KeyboardInterrupt, SystemExit: not ours to swallow
            }
        }
        Ok(r.err())
    }
}

fn error_tuple<'py>(
    py: Python<'py>,
    pos: usize,
    ts: f64,
    msg: String,
) -> PyResult<Bound<'py, PyAny>> {
    (pos, ts, msg).into_bound_py_any(py)
}

#[pymethods]
impl Reassembler {
    #[new]
    #[pyo3(signature = (
        *, conn_id_base=1, conn_ids=None, server_ports=None,
        max_buffer=4 << 20, idle_timeout=300.0, hole_timeout=1.0, max_connections=100_000,
        only_ports=None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        conn_id_base: i64,
        conn_ids: Option<Py<PyAny>>,
        server_ports: Option<&Bound<'_, PyAny>>,
        max_buffer: i64,
        idle_timeout: f64,
        hole_timeout: f64,
        max_connections: i64,
        only_ports: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let cfg = core_r::Config {
            conn_id_base,
            server_ports: ports(server_ports)?,
            max_buffer,
            idle_timeout,
            hole_timeout,
            max_connections: usize::try_from(max_connections.max(1)).unwrap_or(usize::MAX),
        };
        Ok(Reassembler {
            inner: core_r::Reassembler::new(cfg),
            conn_ids,
            only: ports(only_ports)?,
            shares: None,
        })
    }

    /// Only segments on these ports from now on (empty: all).
    fn set_only_ports(&mut self, only_ports: &Bound<'_, PyAny>) -> PyResult<()> {
        self.only = ports(Some(only_ports))?;
        Ok(())
    }

    #[getter]
    fn idle_timeout(&self) -> f64 {
        self.inner.cfg.idle_timeout
    }

    #[setter]
    fn set_idle_timeout(&mut self, v: f64) {
        self.inner.cfg.idle_timeout = v;
    }

    #[getter]
    fn hole_timeout(&self) -> f64 {
        self.inner.cfg.hole_timeout
    }

    #[getter]
    fn max_buffer(&self) -> i64 {
        self.inner.cfg.max_buffer
    }

    #[getter]
    fn open_connections(&self) -> i64 {
        self.inner.open_connections()
    }

    /// The counters of `ReassemblyStats`, by name.
    fn stats(&self) -> Vec<(&'static str, i64)> {
        let s = &self.inner.stats;
        vec![
            ("segments", s.segments),
            ("bytes_delivered", s.bytes_delivered),
            ("retransmissions", s.retransmissions),
            ("overlaps_inconsistent", s.overlaps_inconsistent),
            ("out_of_order", s.out_of_order),
            ("gaps", s.gaps),
            ("gap_bytes", s.gap_bytes),
            ("connections", s.connections),
            ("midstream", s.midstream),
            ("buffer_cap_hits", s.buffer_cap_hits),
            ("port_reuse", s.port_reuse),
        ]
    }

    /// Segments `start..stop` of `batch`, those of worker `share_k` of
    /// `share_n` (by port pair, as replay splits a file), and of the
    /// `only_ports` given. Returns (flow events, segments fed, segments
    /// skipped by the port filter, errors): each error is (position in the
    /// events, ts, message) of a segment dropped because the id source failed.
    #[pyo3(signature = (batch, start=0, stop=None, share_k=0, share_n=1))]
    fn feed_batch<'py>(
        &mut self,
        py: Python<'py>,
        batch: &SegmentBatch,
        start: usize,
        stop: Option<usize>,
        share_k: u32,
        share_n: u32,
    ) -> PyResult<(Bound<'py, PyList>, usize, usize, Bound<'py, PyList>)> {
        let stop = stop.unwrap_or(batch.recs.len()).min(batch.recs.len());
        let mut out = Vec::new();
        let mut fed = 0usize;
        let mut skipped = 0usize;
        let mut errors: Vec<(usize, f64, String)> = Vec::new();
        for r in batch.recs.get(start..stop).unwrap_or(&[]) {
            match self.take(r, share_k, share_n) {
                Take::OtherShare => continue,
                Take::Skipped => {
                    skipped += 1;
                    continue;
                }
                Take::Fed => fed += 1,
            }
            let seg = batch.seg(r);
            if let Some(msg) = self.feed_one(py, r.ts, &seg, &mut out)? {
                errors.push((out.len(), r.ts, msg));
            }
        }
        let errs = PyList::empty(py);
        for (pos, ts, msg) in errors {
            errs.append(error_tuple(py, pos, ts, msg)?)?;
        }
        Ok((events_to_py(py, out)?, fed, skipped, errs))
    }

    /// A list of `Segment` values (the daemon's items, tests), no port filter.
    /// Returns (flow events, errors) as `feed_batch`.
    fn feed_segments<'py>(
        &mut self,
        py: Python<'py>,
        segments: &Bound<'py, PyAny>,
    ) -> PyResult<(Bound<'py, PyList>, Bound<'py, PyList>)> {
        let mut out = Vec::new();
        let errs = PyList::empty(py);
        for item in segments.try_iter()? {
            let (ts, fields, payload) = extract_segment(&item?)?;
            let seg = fields.seg(&payload);
            if let Some(msg) = self.feed_one(py, ts, &seg, &mut out)? {
                errs.append(error_tuple(py, out.len(), ts, msg)?)?;
            }
        }
        Ok((events_to_py(py, out)?, errs))
    }

    fn expire<'py>(&mut self, py: Python<'py>, now: f64) -> PyResult<Bound<'py, PyList>> {
        let mut out = Vec::new();
        self.inner.expire(now, &mut out);
        events_to_py(py, out)
    }

    fn flush<'py>(&mut self, py: Python<'py>, ts: f64) -> PyResult<Bound<'py, PyList>> {
        let mut out = Vec::new();
        self.inner.flush(ts, &mut out);
        events_to_py(py, out)
    }

    /// `CaptureGap(ts, dropped, source)`: every open direction may have a gap.
    fn capture_gap<'py>(
        &mut self,
        py: Python<'py>,
        gap: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let ts: f64 = gap.getattr(intern!(py, "ts"))?.extract()?;
        let source: String = gap.getattr(intern!(py, "source"))?.extract()?;
        let mut out = Vec::new();
        self.inner.capture_gap(ts, &source, &mut out);
        events_to_py(py, out)
    }

    #[pyo3(signature = (conn_id, now=None))]
    fn checkpoint(&self, conn_id: i64, now: Option<f64>) -> Option<(i64, i64)> {
        self.inner.checkpoint(conn_id, now)
    }

    fn forget(&mut self, conn_id: i64) {
        self.inner.forget(conn_id);
    }

    /// `client`/`server` as (address text, port); `c2s`/`s2c` sequence
    /// numbers, negative for a direction never seen.
    #[allow(clippy::too_many_arguments)]
    fn adopt(
        &mut self,
        conn_id: i64,
        ts: f64,
        client: (String, i64),
        server: (String, i64),
        c2s: i64,
        s2c: i64,
    ) {
        let ep = |(a, p): (String, i64)| match u16::try_from(p) {
            Ok(p) => (parse_addr(&a), p),
            Err(_) => (Addr::Invalid, 0),
        };
        self.inner
            .adopt(conn_id, ts, ep(client), ep(server), c2s, s2c);
    }
}

/// Register this module's functions and classes.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<SegmentBatch>()?;
    m.add_class::<Reassembler>()?;
    m.add_function(wrap_pyfunction!(parse_frames, m)?)?;
    m.add_function(wrap_pyfunction!(read_pcap, m)?)?;
    m.add_function(wrap_pyfunction!(read_pcapng, m)?)?;
    m.add_function(wrap_pyfunction!(segment_batch, m)?)?;
    Ok(())
}
