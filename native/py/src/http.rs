//! Bindings of the HTTP/1.1, SSE and NDJSON parsers: the same interface as
//! the Python classes (`sniffer.core.http1.HttpParser`,
//! `sniffer.core.sse.SseDecoder` / `NdjsonDecoder`), taking and returning the
//! Python event values of `sniffer.core.events`. Conversions only.
//!
//! HTTP/2 connections are parsed by the Python stage: when the core reports a
//! handover, `sniffer.core.native._h2_takeover` gives the connection to a
//! Python `HttpParser` kept here, and that connection's later events go to it.

use pyo3::exceptions::{PyOverflowError, PyTypeError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple, PyType};
use pyo3::IntoPyObjectExt;

use crate::flow;
use crate::slots::{values, SlotClass};

use sparseety_core::http1::text::latin1;
use sparseety_core::http1::{
    Checkpoint, EndReason, FlowEvent, H2Mode, Headers, HeldEvent, HttpConfig, HttpEvent, HttpParser,
};
use sparseety_core::ids::{IdMap, IdSet};
use sparseety_core::ndjson::NdjsonDecoder;
use sparseety_core::reassembly::Event;
use sparseety_core::sse::{SseDecoder, SseEvent, DEFAULT_MAX_LINE};

/// The Python classes the bindings take and make, imported once.
pub(crate) struct Types {
    flow_data: Py<PyAny>,
    opened: Py<PyAny>,
    flow_gap: Py<PyAny>,
    flow_end: Py<PyAny>,
    closed: Py<PyAny>,
    body: Py<PyAny>,
    reasons: [Py<PyAny>; 5],
    sse_event: Py<PyAny>,
    tuple_new: Py<PyAny>,
    int: Py<PyAny>,
    stats: Py<PyAny>,
    takeover: Py<PyAny>,
    py_parser: Py<PyAny>,
    /// the event classes made here, without their Python `__init__`
    make: Makers,
}

/// The event classes `HttpParser` makes (`crate::slots`): one `HttpRequest`,
/// `HttpResponse` and two `HttpEnd` per exchange, a `FlowEnd` per direction.
pub(crate) struct Makers {
    opened: SlotClass,
    request: SlotClass,
    response: SlotClass,
    end: SlotClass,
    error: SlotClass,
    resync: SlotClass,
    anomaly: SlotClass,
    flow_gap: SlotClass,
    flow_end: SlotClass,
}

static TYPES: PyOnceLock<Types> = PyOnceLock::new();

pub(crate) fn types(py: Python<'_>) -> PyResult<&'static Types> {
    TYPES.get_or_try_init(py, || {
        let ev = py.import("sniffer.core.events")?;
        let get = |name: &str| -> PyResult<Py<PyAny>> { Ok(ev.getattr(name)?.unbind()) };
        let er = ev.getattr("EndReason")?;
        let reason = |name: &str| -> PyResult<Py<PyAny>> { Ok(er.getattr(name)?.unbind()) };
        let builtins = py.import("builtins")?;
        let http1 = py.import("sniffer.core.http1")?;
        let slots = |name: &str| -> PyResult<SlotClass> {
            SlotClass::new(py, &ev.getattr(name)?.cast_into::<PyType>()?)
        };
        let make = Makers {
            opened: slots("ConnectionOpened")?,
            request: slots("HttpRequest")?,
            response: slots("HttpResponse")?,
            end: slots("HttpEnd")?,
            error: slots("HttpError")?,
            resync: slots("HttpResync")?,
            anomaly: slots("HttpAnomaly")?,
            flow_gap: slots("FlowGap")?,
            flow_end: slots("FlowEnd")?,
        };
        Ok(Types {
            make,
            flow_data: get("FlowData")?,
            opened: get("ConnectionOpened")?,
            flow_gap: get("FlowGap")?,
            flow_end: get("FlowEnd")?,
            closed: get("ConnectionClosed")?,
            body: get("HttpBody")?,
            reasons: [
                reason("COMPLETE")?,
                reason("GAP")?,
                reason("EOF")?,
                reason("RST")?,
                reason("ERROR")?,
            ],
            sse_event: py.import("sniffer.core.sse")?.getattr("SseEvent")?.unbind(),
            tuple_new: builtins.getattr("tuple")?.getattr("__new__")?.unbind(),
            int: builtins.getattr("int")?.unbind(),
            stats: http1.getattr("HttpStats")?.unbind(),
            takeover: py
                .import("sniffer.core.native")?
                .getattr("_h2_takeover")?
                .unbind(),
            py_parser: http1.getattr("HttpParser")?.unbind(),
        })
    })
}

fn reason_obj<'py>(py: Python<'py>, t: &Types, r: EndReason) -> Bound<'py, PyAny> {
    let i = match r {
        EndReason::Complete => 0,
        EndReason::Gap => 1,
        EndReason::Eof => 2,
        EndReason::Rst => 3,
        EndReason::Error => 4,
    };
    t.reasons[i].bind(py).clone()
}

/// A Python str of latin-1 bytes: ASCII (nearly every head) straight from
/// the bytes, no `String` made first.
fn latin1_str<'py>(py: Python<'py>, b: &[u8]) -> Bound<'py, PyString> {
    match std::str::from_utf8(b) {
        Ok(s) if b.is_ascii() => PyString::new(py, s),
        _ => PyString::new(py, &latin1(b)),
    }
}

/// The texts of heads that come again and again (header names, methods,
/// versions, reasons), each made once as a Python str: no allocation per
/// head, and the str keeps its hash, so the Python stages' look-ups by
/// header name (credential checks, the store's JSON) hash nothing. Bounded:
/// texts up to `MAX_LEN` bytes, `MAX` of them (past it, new texts are made
/// each time, as before).
#[derive(Default)]
struct Texts {
    known: std::collections::HashMap<Vec<u8>, Py<PyString>>,
}

impl Texts {
    const MAX: usize = 512;
    const MAX_LEN: usize = 64;

    fn get<'py>(&mut self, py: Python<'py>, b: &[u8]) -> Bound<'py, PyString> {
        if let Some(s) = self.known.get(b) {
            return s.bind(py).clone();
        }
        let s = latin1_str(py, b);
        if b.len() <= Self::MAX_LEN && self.known.len() < Self::MAX {
            self.known.insert(b.to_vec(), s.clone().unbind());
        }
        s
    }
}

/// A head's headers as the tuple of (name, value) str pairs the events carry.
fn headers_obj<'py>(
    py: Python<'py>,
    texts: &mut Texts,
    h: &Headers,
) -> PyResult<Bound<'py, PyTuple>> {
    let items: Vec<Bound<'py, PyTuple>> = h
        .iter()
        .map(|(n, v)| PyTuple::new(py, [texts.get(py, n), latin1_str(py, v)]))
        .collect::<PyResult<_>>()?;
    PyTuple::new(py, items)
}

/// A response body the fused core (`fused.rs`) keeps in place of its
/// `HttpBody`: `None` stands at `pos` in the call's outputs, and the streams
/// stage takes the bodies of a run of them in one call (`Core.feed_bodies`).
pub(crate) struct HeldBody {
    /// its position in the outputs of the call
    pub pos: usize,
    pub conn: u64,
    pub exchange: i64,
    pub ts: f64,
    pub data: Vec<u8>,
}

impl HeldBody {
    /// The `HttpBody` it stands for.
    pub(crate) fn obj<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let t = types(py)?;
        let args = (
            self.conn,
            self.exchange,
            self.ts,
            false,
            PyBytes::new(py, &self.data),
        )
            .into_pyobject(py)?;
        t.tuple_new.bind(py).call1((t.body.bind(py), args))
    }
}

/// `sniffer.core.http1.HttpParser`, natively.
#[pyclass(module = "sniffer._native", name = "HttpParser")]
pub struct PyHttpParser {
    core: HttpParser,
    /// every open connection's ConnectionOpened (released as the core says)
    opened: IdMap<u64, Py<PyAny>>,
    /// connections handed over to the Python parser (HTTP/2)
    h2: IdSet<u64>,
    py_parser: Py<PyAny>,
    out: Vec<HttpEvent>,
    /// insertion order of the connections, as the reference's dict keeps it
    order: IdMap<u64, u64>,
    next_order: u64,
    /// header names, methods, versions and reasons made once
    texts: Texts,
}

fn int_attr(o: &Bound<'_, PyAny>, name: &str) -> PyResult<u64> {
    o.getattr(name)?.extract()
}

#[pymethods]
impl PyHttpParser {
    #[new]
    #[pyo3(signature = (*, max_header_bytes = 65536, max_decoded_bytes = 33554432, max_expansion_ratio = 100.0))]
    fn new(
        py: Python<'_>,
        max_header_bytes: usize,
        max_decoded_bytes: u64,
        max_expansion_ratio: f64,
    ) -> PyResult<Self> {
        let t = types(py)?;
        let kw = PyDict::new(py);
        kw.set_item("max_header_bytes", max_header_bytes)?;
        kw.set_item("max_decoded_bytes", max_decoded_bytes)?;
        kw.set_item("max_expansion_ratio", max_expansion_ratio)?;
        let py_parser = t.py_parser.bind(py).call((), Some(&kw))?.unbind();
        Ok(PyHttpParser {
            core: HttpParser::new(HttpConfig {
                max_header_bytes,
                max_decoded_bytes,
                max_expansion_ratio,
            }),
            opened: IdMap::default(),
            h2: IdSet::default(),
            py_parser,
            out: Vec::new(),
            order: IdMap::default(),
            next_order: 0,
            texts: Texts::default(),
        })
    }

    /// One flow event in; the HTTP events it completed out (a list).
    fn feed<'py>(
        &mut self,
        py: Python<'py>,
        ev: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let t = types(py)?;
        let out = PyList::empty(py);
        self.feed_input(py, t, &Input::Py(ev), &out, None)?;
        Ok(out)
    }

    #[getter]
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let s = self.core.stats();
        types(py)?.stats.bind(py).call1((
            s.requests,
            s.responses,
            s.errors,
            s.gaps,
            s.hunted_bytes,
            s.desyncs,
            s.dead_connections,
            s.resyncs,
            s.resync_skipped,
            s.upgrades,
        ))
    }

    #[getter]
    fn h2_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.py_parser.bind(py).getattr("h2_stats")
    }

    #[getter]
    fn open_connections(&self) -> usize {
        self.core.open_connections().saturating_add(self.h2.len())
    }

    fn connection_ids(&self) -> Vec<u64> {
        let mut ids = self.core.connection_ids();
        ids.extend(self.h2.iter().copied());
        ids.sort_by_key(|c| self.order.get(c).copied().unwrap_or(u64::MAX));
        ids
    }

    fn checkpoint<'py>(&self, py: Python<'py>, conn: u64) -> PyResult<Option<Bound<'py, PyDict>>> {
        if self.h2.contains(&conn) {
            return Ok(self
                .py_parser
                .bind(py)
                .call_method1("checkpoint", (conn,))?
                .cast_into::<PyDict>()
                .ok());
        }
        let Some(cp) = self.core.checkpoint(conn) else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        d.set_item("exchange", cp.exchange)?;
        d.set_item("next_exchange", cp.next_exchange)?;
        d.set_item("method", latin1(&cp.method))?;
        d.set_item("clean", cp.clean)?;
        d.set_item("gaps", cp.gaps)?;
        d.set_item("lost", cp.lost)?;
        Ok(Some(d))
    }

    fn forget(&mut self, py: Python<'_>, conn: u64) -> PyResult<()> {
        self.core.forget(conn);
        self.opened.remove(&conn);
        self.order.remove(&conn);
        if self.h2.remove(&conn) {
            self.py_parser.bind(py).call_method1("forget", (conn,))?;
        }
        Ok(())
    }

    #[pyo3(signature = (opened, exchange, next_exchange, method, clean, lost = Some(0), gaps = 0))]
    #[allow(clippy::too_many_arguments)]
    fn adopt(
        &mut self,
        opened: &Bound<'_, PyAny>,
        exchange: i64,
        next_exchange: i64,
        method: &str,
        clean: bool,
        lost: Option<u64>,
        gaps: u64,
    ) -> PyResult<()> {
        let conn = int_attr(opened, "conn")?;
        let syn_seen: bool = opened.getattr("syn_seen")?.extract()?;
        let mut m = Vec::with_capacity(method.len());
        for ch in method.chars() {
            let b = u8::try_from(u32::from(ch))
                .map_err(|_| PyTypeError::new_err("method is not latin-1"))?;
            m.push(b);
        }
        self.opened.insert(conn, opened.clone().unbind());
        self.remember(conn);
        let cp = Checkpoint {
            exchange,
            next_exchange,
            method: m,
            clean,
            gaps,
            lost,
        };
        self.core.adopt(conn, syn_seen, &cp);
        Ok(())
    }

    pub(crate) fn abandon(&mut self, py: Python<'_>, conn: u64) -> PyResult<()> {
        if self.h2.contains(&conn) {
            self.py_parser.bind(py).call_method1("abandon", (conn,))?;
        }
        self.core.abandon(conn);
        Ok(())
    }
}

/// A flow event fed to the parser: a Python one (``feed``, the eBPF path) or
/// one of the native reassembler (the fused path, no Python object made
/// unless the event must be handed on as one).
pub(crate) enum Input<'a, 'py> {
    Py(&'a Bound<'py, PyAny>),
    Native(&'a Event),
}

impl<'py> Input<'_, 'py> {
    /// The event as the Python value of `sniffer.core.events`.
    fn obj(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        match self {
            Input::Py(ev) => Ok((*ev).clone()),
            Input::Native(ev) => flow::event_to_py(py, flow::classes(py)?, ev),
        }
    }

    fn is_flow_end(&self, py: Python<'py>, t: &Types) -> bool {
        match self {
            Input::Py(ev) => ev.get_type().is(t.flow_end.bind(py)),
            Input::Native(ev) => matches!(ev, Event::End { .. }),
        }
    }

    fn is_closed(&self, py: Python<'py>, t: &Types) -> bool {
        match self {
            Input::Py(ev) => ev.get_type().is(t.closed.bind(py)),
            Input::Native(ev) => matches!(ev, Event::Closed { .. }),
        }
    }
}

fn conn_id(conn: i64) -> PyResult<u64> {
    u64::try_from(conn)
        .map_err(|_| PyOverflowError::new_err("can't convert negative int to unsigned"))
}

impl PyHttpParser {
    /// `feed`: the HTTP events of one flow event appended to `out`; with
    /// `held`, its response bodies kept there (`None` in `out`, see `HeldBody`).
    pub(crate) fn feed_input<'py>(
        &mut self,
        py: Python<'py>,
        t: &Types,
        input: &Input<'_, 'py>,
        out: &Bound<'py, PyList>,
        mut held: Option<&mut Vec<HeldBody>>,
    ) -> PyResult<()> {
        let conn = match input {
            Input::Py(ev) => self.feed_py(py, t, ev, out)?,
            Input::Native(ev) => self.feed_native(py, ev, out)?,
        };
        let Some(conn) = conn else {
            return Ok(()); // handed to the HTTP/2 parser
        };
        let mut events = std::mem::take(&mut self.out);
        let mut result = Ok(());
        for e in events.drain(..) {
            if result.is_ok() {
                result = self.convert(py, t, input, e, out, held.as_deref_mut());
            }
        }
        if self.out.is_empty() {
            // its room kept for the next flow event (one allocation per
            // packet less)
            self.out = events;
        }
        if input.is_closed(py, t) {
            self.opened.remove(&conn);
            self.order.remove(&conn);
            if self.h2.remove(&conn) {
                // handed over while closing: nothing more comes for it
                self.py_parser.bind(py).call_method1("forget", (conn,))?;
            }
        }
        result
    }

    /// An event of a connection handed over to the Python HTTP/2 parser.
    fn feed_h2<'py>(
        &mut self,
        py: Python<'py>,
        t: &Types,
        conn: u64,
        ev: &Bound<'py, PyAny>,
        out: &Bound<'py, PyList>,
    ) -> PyResult<()> {
        let got = self.py_parser.bind(py).call_method1("feed", (ev,))?;
        if ev.get_type().is(t.closed.bind(py)) {
            self.h2.remove(&conn);
            self.opened.remove(&conn);
            self.order.remove(&conn);
        }
        for item in got.try_iter()? {
            out.append(item?)?;
        }
        Ok(())
    }

    /// A Python flow event into the core; its connection, or None when it
    /// went to the HTTP/2 parser.
    fn feed_py<'py>(
        &mut self,
        py: Python<'py>,
        t: &Types,
        ev: &Bound<'py, PyAny>,
        out: &Bound<'py, PyList>,
    ) -> PyResult<Option<u64>> {
        let ty = ev.get_type();
        if ty.is(t.flow_data.bind(py)) {
            let tup = ev.cast::<PyTuple>()?;
            let conn: u64 = tup.get_item(0)?.extract()?;
            if self.h2.contains(&conn) {
                self.feed_h2(py, t, conn, ev, out)?;
                return Ok(None);
            }
            let ts: f64 = tup.get_item(1)?.extract()?;
            let from_client: bool = tup.get_item(2)?.extract()?;
            let data_obj = tup.get_item(3)?;
            let owned: Vec<u8>;
            let data: &[u8] = match data_obj.cast::<PyBytes>() {
                Ok(b) => b.as_bytes(),
                Err(_) => {
                    owned = data_obj.extract()?; // a bytearray or another buffer
                    &owned
                }
            };
            self.core.feed(
                &FlowEvent::Data {
                    conn,
                    ts,
                    from_client,
                    data,
                },
                &mut self.out,
            );
            return Ok(Some(conn));
        }
        let conn = int_attr(ev, "conn")?;
        if ty.is(t.opened.bind(py)) {
            let syn_seen: bool = ev.getattr("syn_seen")?.extract()?;
            let ts: f64 = ev.getattr("ts")?.extract()?;
            self.open(py, conn, ts, syn_seen, ev.clone().unbind())?;
        } else if self.h2.contains(&conn) {
            self.feed_h2(py, t, conn, ev, out)?;
            return Ok(None);
        } else if ty.is(t.flow_gap.bind(py)) {
            let ts: f64 = ev.getattr("ts")?.extract()?;
            let from_client: bool = ev.getattr("from_client")?.extract()?;
            let nbytes: Option<u64> = ev.getattr("nbytes")?.extract()?;
            let reason: String = ev.getattr("reason")?.extract()?;
            self.core.feed(
                &FlowEvent::Gap {
                    conn,
                    ts,
                    from_client,
                    nbytes,
                    reason: &reason,
                },
                &mut self.out,
            );
        } else if ty.is(t.flow_end.bind(py)) {
            let ts: f64 = ev.getattr("ts")?.extract()?;
            let from_client: bool = ev.getattr("from_client")?.extract()?;
            let reason: String = ev.getattr("reason")?.extract()?;
            self.core.feed(
                &FlowEvent::End {
                    conn,
                    ts,
                    from_client,
                    reason: &reason,
                },
                &mut self.out,
            );
        } else if ty.is(t.closed.bind(py)) {
            let ts: f64 = ev.getattr("ts")?.extract()?;
            let reason: String = ev.getattr("reason")?.extract()?;
            self.core.feed(
                &FlowEvent::Closed {
                    conn,
                    ts,
                    reason: &reason,
                },
                &mut self.out,
            );
        } else {
            let from_client: bool = ev.getattr("from_client")?.extract()?;
            self.core
                .feed(&FlowEvent::Anomaly { conn, from_client }, &mut self.out);
        }
        Ok(Some(conn))
    }

    /// A ConnectionOpened (its Python value kept, released as the core says).
    fn open(
        &mut self,
        py: Python<'_>,
        conn: u64,
        ts: f64,
        syn_seen: bool,
        opened: Py<PyAny>,
    ) -> PyResult<()> {
        if self.h2.remove(&conn) {
            self.py_parser.bind(py).call_method1("forget", (conn,))?;
        }
        self.opened.insert(conn, opened);
        self.remember(conn);
        self.core
            .feed(&FlowEvent::Opened { conn, ts, syn_seen }, &mut self.out);
        Ok(())
    }

    /// A native reassembler's event into the core, no Python value made but
    /// the ConnectionOpened and what goes to the HTTP/2 parser.
    fn feed_native<'py>(
        &mut self,
        py: Python<'py>,
        ev: &Event,
        out: &Bound<'py, PyList>,
    ) -> PyResult<Option<u64>> {
        match *ev {
            Event::Data {
                conn,
                ts,
                from_client,
                ref data,
            } => {
                let conn = conn_id(conn)?;
                if self.h2.contains(&conn) {
                    let t = types(py)?;
                    let obj = Input::Native(ev).obj(py)?;
                    self.feed_h2(py, t, conn, &obj, out)?;
                    return Ok(None);
                }
                self.core.feed(
                    &FlowEvent::Data {
                        conn,
                        ts,
                        from_client,
                        data,
                    },
                    &mut self.out,
                );
                Ok(Some(conn))
            }
            Event::Opened {
                conn, ts, syn_seen, ..
            } => {
                let id = conn_id(conn)?;
                let obj = flow::event_to_py(py, flow::classes(py)?, ev)?;
                self.open(py, id, ts, syn_seen, obj.unbind())?;
                Ok(Some(id))
            }
            Event::Gap { conn, .. }
            | Event::End { conn, .. }
            | Event::Closed { conn, .. }
            | Event::Anomaly { conn, .. } => {
                let conn = conn_id(conn)?;
                if self.h2.contains(&conn) {
                    let t = types(py)?;
                    let obj = Input::Native(ev).obj(py)?;
                    self.feed_h2(py, t, conn, &obj, out)?;
                    return Ok(None);
                }
                let fe = match *ev {
                    Event::Gap {
                        ts,
                        from_client,
                        nbytes,
                        ref reason,
                        ..
                    } => FlowEvent::Gap {
                        conn,
                        ts,
                        from_client,
                        nbytes: match nbytes {
                            Some(n) => Some(
                                u64::try_from(n)
                                    .map_err(|_| PyOverflowError::new_err("negative gap size"))?,
                            ),
                            None => None,
                        },
                        reason,
                    },
                    Event::End {
                        ts,
                        from_client,
                        reason,
                        ..
                    } => FlowEvent::End {
                        conn,
                        ts,
                        from_client,
                        reason,
                    },
                    Event::Closed { ts, reason, .. } => FlowEvent::Closed { conn, ts, reason },
                    Event::Anomaly { from_client, .. } => FlowEvent::Anomaly { conn, from_client },
                    Event::Data { .. } | Event::Opened { .. } => return Ok(Some(conn)),
                };
                self.core.feed(&fe, &mut self.out);
                Ok(Some(conn))
            }
        }
    }
}

impl PyHttpParser {
    fn remember(&mut self, conn: u64) {
        let next = self.next_order;
        if let std::collections::hash_map::Entry::Vacant(e) = self.order.entry(conn) {
            e.insert(next);
            self.next_order = next.saturating_add(1);
        }
    }

    fn convert<'py>(
        &mut self,
        py: Python<'py>,
        t: &Types,
        input: &Input<'_, 'py>,
        e: HttpEvent,
        out: &Bound<'py, PyList>,
        held: Option<&mut Vec<HeldBody>>,
    ) -> PyResult<()> {
        match e {
            HttpEvent::Body {
                conn,
                exchange,
                ts,
                from_client: false,
                data,
            } if held.is_some() => {
                if let Some(held) = held {
                    held.push(HeldBody {
                        pos: out.len(),
                        conn,
                        exchange,
                        ts,
                        data,
                    });
                    out.append(py.None())?;
                }
            }
            HttpEvent::Body {
                conn,
                exchange,
                ts,
                from_client,
                data,
            } => {
                let args =
                    (conn, exchange, ts, from_client, PyBytes::new(py, &data)).into_pyobject(py)?;
                out.append(t.tuple_new.bind(py).call1((t.body.bind(py), args))?)?;
            }
            HttpEvent::Opened { conn, swapped } => {
                let Some(o) = self.opened.get(&conn) else {
                    return Ok(());
                };
                let o = o.bind(py);
                if swapped {
                    let s = t.make.opened.make(
                        py,
                        &[
                            o.getattr("conn")?,
                            o.getattr("ts")?,
                            o.getattr("server")?,
                            o.getattr("client")?,
                            o.getattr("syn_seen")?,
                            o.getattr("capture")?,
                            o.getattr("pid")?,
                            o.getattr("comm")?,
                        ],
                    )?;
                    out.append(s)?;
                } else {
                    out.append(o)?;
                }
            }
            HttpEvent::Request {
                conn,
                exchange,
                ts,
                method,
                target,
                version,
                headers,
            } => {
                out.append(t.make.request.make(
                    py,
                    &values![py;
                        conn,
                        exchange,
                        ts,
                        self.texts.get(py, &method),
                        latin1_str(py, &target),
                        self.texts.get(py, &version),
                        headers_obj(py, &mut self.texts, &headers)?,
                    ],
                )?)?;
            }
            HttpEvent::Response {
                conn,
                exchange,
                ts,
                status,
                reason,
                version,
                headers,
                informational,
            } => {
                out.append(t.make.response.make(
                    py,
                    &values![py;
                        conn,
                        exchange,
                        ts,
                        status,
                        self.texts.get(py, &reason),
                        self.texts.get(py, &version),
                        headers_obj(py, &mut self.texts, &headers)?,
                        informational,
                    ],
                )?)?;
            }
            HttpEvent::End {
                conn,
                exchange,
                ts,
                from_client,
                reason,
            } => {
                out.append(t.make.end.make(
                    py,
                    &values![py; conn, exchange, ts, from_client, reason_obj(py, t, reason)],
                )?)?;
            }
            HttpEvent::Error {
                conn,
                exchange,
                ts,
                from_client,
                kind,
                message,
            } => {
                out.append(t.make.error.make(
                    py,
                    &values![py; conn, exchange, ts, from_client, kind, message],
                )?)?;
            }
            HttpEvent::Resync {
                conn,
                exchange,
                ts,
                framing,
                skipped,
                recovered,
                lost,
                gaps,
            } => {
                out.append(t.make.resync.make(
                    py,
                    &values![py;
                        conn,
                        exchange,
                        ts,
                        framing.name(),
                        skipped,
                        recovered,
                        lost,
                        gaps,
                    ],
                )?)?;
            }
            HttpEvent::FlowGap {
                conn,
                ts,
                from_client,
                nbytes,
                reason,
            } => {
                out.append(
                    t.make
                        .flow_gap
                        .make(py, &values![py; conn, ts, from_client, nbytes, reason])?,
                )?;
            }
            HttpEvent::FlowEnd {
                conn,
                ts,
                from_client,
                reason,
            } => {
                // a held FlowEnd replayed while another event is fed is a new one
                let same = match input {
                    Input::Py(ev) => {
                        input.is_flow_end(py, t)
                            && ev.getattr("from_client")?.extract::<bool>().ok()
                                == Some(from_client)
                            && ev.getattr("ts")?.extract::<f64>().ok() == Some(ts)
                    }
                    Input::Native(_) => false,
                };
                if same {
                    out.append(input.obj(py)?)?;
                } else {
                    out.append(
                        t.make
                            .flow_end
                            .make(py, &values![py; conn, ts, from_client, reason])?,
                    )?;
                }
            }
            HttpEvent::Closed { .. } => out.append(input.obj(py)?)?,
            HttpEvent::Anomaly {
                conn,
                exchange,
                from_client,
            } => {
                let a = match input {
                    Input::Py(ev) => t.make.anomaly.make(
                        py,
                        &values![py;
                            conn,
                            exchange,
                            ev.getattr("ts")?,
                            from_client,
                            ev.getattr("kind")?,
                            ev.getattr("detail")?,
                            ev.getattr("offset")?,
                            ev.getattr("length")?,
                        ],
                    )?,
                    Input::Native(ev) => {
                        let Event::Anomaly {
                            ts,
                            kind,
                            ref detail,
                            offset,
                            length,
                            ..
                        } = **ev
                        else {
                            return Err(PyTypeError::new_err("an anomaly without its flow event"));
                        };
                        t.make.anomaly.make(
                            py,
                            &values![py; conn, exchange, ts, from_client, kind, detail, offset,
                                length],
                        )?
                    }
                };
                out.append(a)?;
            }
            HttpEvent::H2Feed { conn, event } => {
                let ev = match event {
                    HeldEvent::Data {
                        ts,
                        from_client,
                        data,
                    } => t.flow_data.bind(py).call1((
                        conn,
                        ts,
                        from_client,
                        PyBytes::new(py, &data),
                    ))?,
                    HeldEvent::Gap {
                        ts,
                        from_client,
                        nbytes,
                        reason,
                    } => t
                        .flow_gap
                        .bind(py)
                        .call1((conn, ts, from_client, nbytes, reason))?,
                    HeldEvent::End {
                        ts,
                        from_client,
                        reason,
                    } => t.flow_end.bind(py).call1((conn, ts, from_client, reason))?,
                    HeldEvent::Closed { .. } => input.obj(py)?,
                };
                let got = self.py_parser.bind(py).call_method1("feed", (ev,))?;
                for item in got.try_iter()? {
                    out.append(item?)?;
                }
            }
            HttpEvent::H2NoPreface { conn } => {
                self.py_parser
                    .bind(py)
                    .getattr("_conns")?
                    .get_item(conn)?
                    .getattr("h2")?
                    .call_method0("no_preface")?;
            }
            HttpEvent::H2Handover {
                conn,
                ts,
                mode,
                base,
                from_client,
                data,
                swapped,
                opened_held,
                roles_known,
            } => {
                let mode = match mode {
                    H2Mode::Preface => "preface",
                    H2Mode::Midstream => "midstream",
                    H2Mode::Upgrade => "upgrade",
                };
                let opened = match self.opened.get(&conn) {
                    Some(o) => o.bind(py).clone(),
                    None => py.None().into_bound(py),
                };
                let got = t.takeover.bind(py).call1((
                    self.py_parser.bind(py),
                    opened,
                    opened_held,
                    mode,
                    from_client,
                    ts,
                    PyBytes::new(py, &data),
                    swapped,
                    roles_known,
                    base,
                ))?;
                self.h2.insert(conn);
                for item in got.try_iter()? {
                    out.append(item?)?;
                }
            }
        }
        Ok(())
    }
}

// ------------------------------------------------------------------ SSE

fn sse_event<'py>(py: Python<'py>, t: &Types, e: SseEvent) -> PyResult<Bound<'py, PyAny>> {
    let retry = match e.retry {
        None => py.None().into_bound(py),
        Some(r) if r.len() <= 18 => r.parse::<u64>().unwrap_or(0).into_bound_py_any(py)?,
        Some(r) => t.int.bind(py).call1((r,))?,
    };
    let args = (e.event, e.data, e.id, retry).into_pyobject(py)?;
    t.tuple_new.bind(py).call1((t.sse_event.bind(py), args))
}

fn retry_obj<'py>(py: Python<'py>, t: &Types, r: Option<&str>) -> PyResult<Bound<'py, PyAny>> {
    match r {
        None => Ok(py.None().into_bound(py)),
        Some(r) if r.len() <= 18 => r.parse::<u64>().unwrap_or(0).into_bound_py_any(py),
        Some(r) => t.int.bind(py).call1((r,)),
    }
}

/// `sniffer.core.sse.SseDecoder`, natively.
#[pyclass(module = "sniffer._native", name = "SseDecoder")]
pub struct PySseDecoder {
    core: SseDecoder,
    out: Vec<SseEvent>,
}

#[pymethods]
impl PySseDecoder {
    #[new]
    #[pyo3(signature = (max_line = DEFAULT_MAX_LINE))]
    fn new(max_line: usize) -> Self {
        PySseDecoder {
            core: SseDecoder::new(max_line),
            out: Vec::new(),
        }
    }

    fn feed<'py>(&mut self, py: Python<'py>, data: &[u8]) -> PyResult<Bound<'py, PyList>> {
        let t = types(py)?;
        self.core.feed(data, &mut self.out);
        let list = PyList::empty(py);
        for e in self.out.drain(..) {
            list.append(sse_event(py, t, e)?)?;
        }
        Ok(list)
    }

    fn close<'py>(&mut self, py: Python<'py>) -> Bound<'py, PyList> {
        self.core.close();
        PyList::empty(py)
    }

    #[getter]
    fn idle(&self) -> bool {
        self.core.idle()
    }
    #[getter]
    fn events(&self) -> u64 {
        self.core.events
    }
    #[getter]
    fn comments(&self) -> u64 {
        self.core.comments
    }
    #[getter]
    fn truncated_event(&self) -> bool {
        self.core.truncated_event
    }
    #[getter]
    fn last_event_id(&self) -> Option<String> {
        self.core.last_event_id.clone()
    }
    #[getter]
    fn retry<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        retry_obj(py, types(py)?, self.core.retry.as_deref())
    }
    #[getter]
    fn errors(&self) -> u64 {
        self.core.errors()
    }
    #[getter]
    fn overlong(&self) -> u64 {
        self.core.overlong()
    }
    #[getter]
    fn last_error(&self) -> Option<String> {
        self.core.last_error().map(str::to_owned)
    }
    #[getter]
    fn closed(&self) -> bool {
        self.core.closed()
    }
    #[getter]
    fn max_line(&self) -> usize {
        self.core.max_line()
    }
}

impl PySseDecoder {
    /// The events of `data`, for the native streams loop (`chunks.rs`).
    pub(crate) fn feed_events(&mut self, data: &[u8]) -> Vec<SseEvent> {
        self.core.feed(data, &mut self.out);
        std::mem::take(&mut self.out)
    }
}

/// `sniffer.core.sse.NdjsonDecoder`, natively.
#[pyclass(module = "sniffer._native", name = "NdjsonDecoder")]
pub struct PyNdjsonDecoder {
    core: NdjsonDecoder,
    out: Vec<String>,
}

#[pymethods]
impl PyNdjsonDecoder {
    #[new]
    #[pyo3(signature = (max_line = DEFAULT_MAX_LINE))]
    fn new(max_line: usize) -> Self {
        PyNdjsonDecoder {
            core: NdjsonDecoder::new(max_line),
            out: Vec::new(),
        }
    }

    fn feed(&mut self, data: &[u8]) -> Vec<String> {
        self.core.feed(data, &mut self.out);
        std::mem::take(&mut self.out)
    }

    fn close(&mut self) -> Vec<String> {
        self.core.close(&mut self.out);
        std::mem::take(&mut self.out)
    }

    #[getter]
    fn idle(&self) -> bool {
        self.core.idle()
    }
    #[getter]
    fn lines(&self) -> u64 {
        self.core.lines
    }
    #[getter]
    fn errors(&self) -> u64 {
        self.core.errors()
    }
    #[getter]
    fn overlong(&self) -> u64 {
        self.core.overlong()
    }
    #[getter]
    fn last_error(&self) -> Option<String> {
        self.core.last_error().map(str::to_owned)
    }
    #[getter]
    fn closed(&self) -> bool {
        self.core.closed()
    }
    #[getter]
    fn max_line(&self) -> usize {
        self.core.max_line()
    }
}

impl PyNdjsonDecoder {
    /// The lines of `data`, for the native streams loop (`chunks.rs`).
    pub(crate) fn feed_lines(&mut self, data: &[u8]) -> Vec<String> {
        self.core.feed(data, &mut self.out);
        std::mem::take(&mut self.out)
    }
}

/// Registers the classes of this file in the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyHttpParser>()?;
    m.add_class::<PySseDecoder>()?;
    m.add_class::<PyNdjsonDecoder>()?;
    Ok(())
}
