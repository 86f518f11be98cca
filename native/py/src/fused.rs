//! TCP reassembly and HTTP/1.1 fused: segments in, the HTTP events of
//! `sniffer.core.events` out, in one call per batch. The reassembler's flow
//! events go straight from the Rust reassembler to the Rust HTTP parser; no
//! Python `FlowEvent` is made but a `ConnectionOpened` per connection, those
//! the HTTP stage hands on (FlowEnd, ConnectionClosed) and those of HTTP/2
//! connections (parsed by the Python stage, see `http.rs`).
//!
//! Every call returns `(outputs, errors)`: `errors` holds `(position in the
//! outputs, ts, message, conn)` for each segment the reassembler dropped
//! (`conn` None: no connection id could be had) and each flow event whose
//! HTTP stage raised (`conn`: the connection, abandoned; its outputs of that
//! event left out), so that the pipeline records them where the Python
//! stages would. `origin(i)` tells which flow event made output `i`, for the
//! pipeline's last-resort handler.
//!
//! Response bodies of HTTP/1.1 exchanges are not made into `HttpBody` values:
//! `None` stands in the outputs where each would be, the bytes are kept
//! (`HeldBody`) until the next call, and the pipeline hands every run of them
//! to `feed_bodies` (the streams stage's item loop, `chunks.rs`) in one call,
//! or asks for one's `HttpBody` (`body`) where the Python stage must take it.

use std::collections::hash_map::Entry;

use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PySet};
use pyo3::{intern, IntoPyObjectExt};

use sparseety_core::ids::IdMap;
use sparseety_core::reassembly::Event;

use crate::chunks;
use crate::flow::{self, Reassembler, SegmentBatch};
use crate::http::{self, HeldBody, Input, PyHttpParser, Types};

/// One error of a call: (position in the outputs, ts, message, conn or None).
type Error = (usize, f64, String, Option<i64>);

/// The native reassembler and HTTP parser (shared with their Python faces).
#[pyclass(module = "sniffer._native")]
pub struct Core {
    reassembler: Py<Reassembler>,
    http: Py<PyHttpParser>,
    /// (end of its outputs, conn, ts) of each flow event of the last call
    /// that gave outputs
    origins: Vec<(usize, i64, f64)>,
    /// the flow events of one segment (reused)
    events: Vec<Event>,
    /// the response bodies of the last call, by position in its outputs
    held: Vec<HeldBody>,
}

fn exc_message(py: Python<'_>, e: &PyErr) -> String {
    format!(
        "{}: {}",
        e.get_type(py)
            .name()
            .map(|n| n.to_string())
            .unwrap_or_default(),
        e.value(py).str().map(|s| s.to_string()).unwrap_or_default()
    )
}

fn event_key(ev: &Event) -> (i64, f64) {
    match *ev {
        Event::Opened { conn, ts, .. }
        | Event::Data { conn, ts, .. }
        | Event::Gap { conn, ts, .. }
        | Event::End { conn, ts, .. }
        | Event::Closed { conn, ts, .. }
        | Event::Anomaly { conn, ts, .. } => (conn, ts),
    }
}

/// The state of one call: its outputs, errors and origins.
struct Call<'py, 'a> {
    py: Python<'py>,
    t: &'static Types,
    out: Bound<'py, PyList>,
    errors: Vec<Error>,
    origins: &'a mut Vec<(usize, i64, f64)>,
    held: &'a mut Vec<HeldBody>,
}

impl<'py> Call<'py, '_> {
    /// The HTTP events of one flow event. An `Exception` raised on the way
    /// (the Python HTTP/2 stage, a conversion) costs the connection: its
    /// outputs of this event are left out, it is abandoned, the error kept.
    fn http(
        &mut self,
        http: &mut PyHttpParser,
        input: &Input<'_, 'py>,
        conn: i64,
        ts: f64,
    ) -> PyResult<()> {
        let before = self.out.len();
        if let Err(e) = http.feed_input(self.py, self.t, input, &self.out, Some(self.held)) {
            if !e.is_instance_of::<PyException>(self.py) {
                return Err(e);
            }
            let n = self.out.len();
            if n > before {
                self.out.del_slice(before, n)?;
            }
            while self.held.last().is_some_and(|b| b.pos >= before) {
                self.held.pop();
            }
            if let Ok(c) = u64::try_from(conn) {
                http.abandon(self.py, c)?;
            }
            self.errors
                .push((before, ts, exc_message(self.py, &e), Some(conn)));
            return Ok(());
        }
        let n = self.out.len();
        if n > before {
            self.origins.push((n, conn, ts));
        }
        Ok(())
    }

    fn native(&mut self, http: &mut PyHttpParser, events: &mut Vec<Event>) -> PyResult<()> {
        for ev in events.drain(..) {
            let (conn, ts) = event_key(&ev);
            self.http(http, &Input::Native(&ev), conn, ts)?;
        }
        Ok(())
    }

    fn finish(self) -> PyResult<(Bound<'py, PyList>, Bound<'py, PyList>)> {
        let errs = PyList::empty(self.py);
        for e in self.errors {
            errs.append(e.into_bound_py_any(self.py)?)?;
        }
        Ok((self.out, errs))
    }
}

type Outputs<'py> = (Bound<'py, PyList>, Bound<'py, PyList>);

impl Core {
    fn call<'py, R>(
        &mut self,
        py: Python<'py>,
        f: impl FnOnce(
            &mut Call<'py, '_>,
            &mut Reassembler,
            &mut PyHttpParser,
            &mut Vec<Event>,
        ) -> PyResult<R>,
    ) -> PyResult<(Outputs<'py>, R)> {
        self.origins.clear();
        self.held.clear();
        let mut call = Call {
            py,
            t: http::types(py)?,
            out: PyList::empty(py),
            errors: Vec::new(),
            origins: &mut self.origins,
            held: &mut self.held,
        };
        let mut r = self.reassembler.bind(py).borrow_mut();
        let mut h = self.http.bind(py).borrow_mut();
        let got = f(&mut call, &mut r, &mut h, &mut self.events)?;
        Ok((call.finish()?, got))
    }
}

#[pymethods]
impl Core {
    #[new]
    fn new(reassembler: Py<Reassembler>, http: Py<PyHttpParser>) -> Self {
        Core {
            reassembler,
            http,
            origins: Vec::new(),
            events: Vec::new(),
            held: Vec::new(),
        }
    }

    /// `Reassembler.feed_batch`, the flow events parsed: (outputs, segments
    /// fed, segments skipped by the port filter, errors).
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
        let ((out, errs), (fed, skipped)) = self.call(py, |call, r, h, events| {
            let mut fed = 0usize;
            let mut skipped = 0usize;
            for rec in batch.recs.get(start..stop).unwrap_or(&[]) {
                match r.take(rec, share_k, share_n) {
                    flow::Take::OtherShare => continue,
                    flow::Take::Skipped => {
                        skipped = skipped.saturating_add(1);
                        continue;
                    }
                    flow::Take::Fed => fed = fed.saturating_add(1),
                }
                let seg = batch.seg(rec);
                let dropped = r.feed_one(py, rec.ts, &seg, events)?;
                call.native(h, events)?;
                if let Some(msg) = dropped {
                    call.errors.push((call.out.len(), rec.ts, msg, None));
                }
            }
            Ok((fed, skipped))
        })?;
        Ok((out, fed, skipped, errs))
    }

    /// `Segment` values (no port filter): (outputs, errors).
    fn feed_segments<'py>(
        &mut self,
        py: Python<'py>,
        segments: &Bound<'py, PyAny>,
    ) -> PyResult<Outputs<'py>> {
        Ok(self
            .call(py, |call, r, h, events| {
                for item in segments.try_iter()? {
                    let (ts, fields, payload) = flow::extract_segment(&item?)?;
                    let seg = fields.seg(&payload);
                    let dropped = r.feed_one(py, ts, &seg, events)?;
                    call.native(h, events)?;
                    if let Some(msg) = dropped {
                        call.errors.push((call.out.len(), ts, msg, None));
                    }
                }
                Ok(())
            })?
            .0)
    }

    /// Ordered Python flow events (the eBPF path): (outputs, errors).
    fn feed_flows<'py>(
        &mut self,
        py: Python<'py>,
        flows: &Bound<'py, PyAny>,
    ) -> PyResult<Outputs<'py>> {
        Ok(self
            .call(py, |call, _, h, _| {
                for item in flows.try_iter()? {
                    let ev = item?;
                    let conn: i64 = ev.getattr(intern!(py, "conn"))?.extract()?;
                    let ts: f64 = ev.getattr(intern!(py, "ts"))?.extract()?;
                    call.http(h, &Input::Py(&ev), conn, ts)?;
                }
                Ok(())
            })?
            .0)
    }

    fn expire<'py>(&mut self, py: Python<'py>, now: f64) -> PyResult<Outputs<'py>> {
        Ok(self
            .call(py, |call, r, h, events| {
                r.inner.expire(now, events);
                call.native(h, events)
            })?
            .0)
    }

    fn flush<'py>(&mut self, py: Python<'py>, ts: f64) -> PyResult<Outputs<'py>> {
        Ok(self
            .call(py, |call, r, h, events| {
                r.inner.flush(ts, events);
                call.native(h, events)
            })?
            .0)
    }

    /// `CaptureGap(ts, dropped, source)`: every open direction may have a gap.
    fn capture_gap<'py>(
        &mut self,
        py: Python<'py>,
        gap: &Bound<'py, PyAny>,
    ) -> PyResult<Outputs<'py>> {
        let ts: f64 = gap.getattr(intern!(py, "ts"))?.extract()?;
        let source: String = gap.getattr(intern!(py, "source"))?.extract()?;
        Ok(self
            .call(py, |call, r, h, events| {
                r.inner.capture_gap(ts, &source, events);
                call.native(h, events)
            })?
            .0)
    }

    /// The `HttpBody` of output `i` of the last call when it is a held
    /// response body (`None` in the outputs), else None.
    fn body<'py>(&self, py: Python<'py>, i: usize) -> PyResult<Option<Bound<'py, PyAny>>> {
        match self.held_at(i) {
            Some(k) => self.held[k].obj(py).map(Some),
            None => Ok(None),
        }
    }

    /// The held response bodies at outputs `start`, `start + 1`, … (before
    /// `stop`) of the last call through the streams stage's native item loop
    /// (`chunks::Fed`), with `ex` its exchanges by (conn, exchange)
    /// (`StreamAssembler._ex`); their chunk events appended to `out`. What
    /// the pipeline does with each (`Pipeline._consume`): a body of a
    /// connection in `dead` is dropped, one of an exchange the gRPC splitter
    /// has (a key of `calls`) or the Python stage must take is left to them.
    /// Returns `(i, chunk events, dialect errors, exception)`: the outputs
    /// before `i` are done; with an exception, the stage raised it on body
    /// `i` (its state written back: the caller contains it as `feed_into`
    /// does); else output `i` (if before `stop`) is not a body this loop takes.
    #[allow(clippy::too_many_arguments)]
    #[allow(clippy::type_complexity)]
    fn feed_bodies<'py>(
        &self,
        py: Python<'py>,
        ex: &Bound<'py, PyDict>,
        start: usize,
        stop: usize,
        out: &Bound<'py, PyList>,
        max_quiet: i64,
        dead: &Bound<'py, PySet>,
        calls: &Bound<'py, PyDict>,
    ) -> PyResult<(usize, u64, u64, Option<PyErr>)> {
        let mut i = start;
        let Some(k) = self.held_at(start) else {
            return Ok((i, 0, 0, None));
        };
        // the exchanges fed in this call, by (conn, exchange): written back at
        // its end; room for one per body (live, each exchange has about one
        // body per call: growing the map cost ~200 instructions per body)
        let bodies = stop
            .saturating_sub(start)
            .min(self.held.len().saturating_sub(k));
        let mut fed: IdMap<(u64, i64), chunks::Fed<'py>> =
            IdMap::with_capacity_and_hasher(bodies, Default::default());
        let run = self.feed_run(
            py, ex, k, &mut i, stop, out, max_quiet, dead, calls, &mut fed,
        );
        let (mut added, mut errors) = (0u64, 0u64);
        let mut failed = None;
        for f in fed.values() {
            match f.close() {
                Ok((a, e)) => {
                    added = added.saturating_add(a);
                    errors = errors.saturating_add(e);
                }
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        match run {
            Ok(Some(e)) => Ok((i, added, errors, Some(e))),
            Ok(None) => Ok((i, added, errors, failed)),
            Err(e) => Err(e),
        }
    }

    /// (conn, ts, end) of the flow event that made output `i` of the last
    /// call: its outputs end before `end`. None if no flow event made it.
    fn origin(&self, i: usize) -> Option<(i64, f64, usize)> {
        let k = self.origins.partition_point(|&(end, _, _)| end <= i);
        self.origins.get(k).map(|&(end, conn, ts)| (conn, ts, end))
    }
}

impl Core {
    /// The loop of `feed_bodies` from body `k` of `held` (at output `*i`),
    /// each exchange's bodies through its `chunks::Fed` in `fed` (made at
    /// its first body; the caller writes them back). Leaves `*i` at the
    /// first output not done; returns the exception raised on it, if any.
    #[allow(clippy::too_many_arguments)]
    fn feed_run<'py>(
        &self,
        py: Python<'py>,
        ex: &Bound<'py, PyDict>,
        mut k: usize,
        i: &mut usize,
        stop: usize,
        out: &Bound<'py, PyList>,
        max_quiet: i64,
        dead: &Bound<'py, PySet>,
        calls: &Bound<'py, PyDict>,
        fed: &mut IdMap<(u64, i64), chunks::Fed<'py>>,
    ) -> PyResult<Option<PyErr>> {
        let mut endpoints = chunks::Endpoints::default();
        while *i < stop {
            let Some(b) = self.held.get(k).filter(|b| b.pos == *i) else {
                break;
            };
            if dead.len() > 0 && dead.contains(b.conn)? {
                k += 1;
                *i += 1;
                continue;
            }
            if calls.len() > 0 && calls.contains((b.conn, b.exchange))? {
                break;
            }
            let f = match fed.entry((b.conn, b.exchange)) {
                Entry::Occupied(e) => e.into_mut(),
                Entry::Vacant(v) => match ex.get_item((b.conn, b.exchange))? {
                    None => {
                        k += 1;
                        *i += 1;
                        continue;
                    }
                    Some(x) => match chunks::Fed::open(py, x, &mut endpoints) {
                        Ok(Some(f)) => v.insert(f),
                        Ok(None) => break, // the Python stage's
                        Err(e) => return Ok(Some(e)),
                    },
                },
            };
            match f.body(py, b.ts, &b.data, out, max_quiet) {
                Ok(None) => {}
                Ok(Some(e)) | Err(e) => return Ok(Some(e)),
            }
            k += 1;
            *i += 1;
        }
        Ok(None)
    }

    /// The index in `held` of the body at output `i` of the last call.
    fn held_at(&self, i: usize) -> Option<usize> {
        let k = self.held.partition_point(|b| b.pos < i);
        self.held.get(k).filter(|b| b.pos == i).map(|_| k)
    }
}

/// Registers the class of this file in the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Core>()?;
    Ok(())
}
