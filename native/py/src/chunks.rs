//! `body_chunks`: the streams stage's hot loop for one streamed (SSE or
//! NDJSON) response body, in one call per body event. It is
//! `StreamAssembler._response_body`'s SSE and NDJSON branches with `_deltas`,
//! `_capped` and `_after_done` (`sniffer/core/streams.py`, the reference): the
//! native decoder's items go to the exchange's
//! dialect — to the native OpenAI extraction first when the dialect says it
//! may (`native_chunks`), else to its Python `event` — and the deltas update
//! the exchange's state and become `ChunkEvent`s (and `PipelineError`s for
//! unparseable items) appended to the stage's output list.
//!
//! The exchange's Python attributes stay the one state: they are read at the
//! start of a call and the changed ones written back at its end (also when a
//! dialect raises), so the Python stage can take over the exchange at any
//! point (resync, close, checkpoint) with nothing to copy.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyList, PyString, PyTuple, PyType};
use pyo3::IntoPyObjectExt;

use sparseety_core::openai::{extract, ChunkDelta, Endpoint, Kind, STREAM_LEVEL};
use sparseety_core::sse::SseEvent;

use crate::http::{PyNdjsonDecoder, PySseDecoder};
use crate::slots::{SlotClass, Slots};

/// The Python values the loop makes, imported once.
/// `ChunkEvent`'s fields (`sniffer.core.events`).
const CHUNK_FIELDS: usize = 14;

struct Types {
    /// `ChunkEvent`, made without its Python `__init__` (`crate::slots`)
    chunk: SlotClass,
    pipeline_error: Py<PyAny>,
    flag_after_done: Py<PyAny>,
    flag_clock_backwards: Py<PyAny>,
    /// the slots of the streams stage's `_Exchange` the loops read and write
    ex: ExSlots,
}

static TYPES: PyOnceLock<Types> = PyOnceLock::new();

/// The field values of a `ChunkEvent`, in field order.
macro_rules! fields {
    ($py:expr; $($v:expr),+ $(,)?) => {
        [$(($v).into_bound_py_any($py)?),+]
    };
}

/// A `ChunkEvent` with these field values, made without its Python
/// `__init__` (a frame and 14 descriptor calls: ~10k instructions, the most
/// of this loop's cost per chunk): `SlotClass::make` (`crate::slots`).
fn chunk_event<'py>(
    py: Python<'py>,
    t: &Types,
    values: [Bound<'py, PyAny>; CHUNK_FIELDS],
) -> PyResult<Bound<'py, PyAny>> {
    t.chunk.make(py, &values)
}

/// The slots of `_Exchange` (`sniffer.core.streams`, a `__slots__` class)
/// the loops read and write, in `SLOT_NAMES` order.
#[derive(Clone, Copy)]
enum Slot {
    ChunkCount,
    ChunkIdx,
    Conn,
    Decoder,
    Dialect,
    DoneSeen,
    Error,
    EventCount,
    Finish,
    Flags,
    Invalid,
    ItemSync,
    Ndjson,
    Quiet,
    RespBytes,
    Seq,
    Sniff,
    Stream,
    TFirst,
    TLast,
    TextLen,
    Unguessed,
    Usage,
}

/// The attribute name of each `Slot`, in its order.
const SLOT_NAMES: [&str; 23] = [
    "chunk_count",
    "chunk_idx",
    "conn",
    "decoder",
    "dialect",
    "done_seen",
    "error",
    "event_count",
    "finish",
    "flags",
    "invalid",
    "item_sync",
    "ndjson",
    "quiet",
    "resp_bytes",
    "seq",
    "sniff",
    "stream",
    "t_first",
    "t_last",
    "text_len",
    "unguessed",
    "usage",
];

/// `_Exchange`'s slots (`SLOT_NAMES`), read and written as
/// `crate::slots::Slots` does: where their member descriptors keep them.
struct ExSlots(Slots);

impl ExSlots {
    fn new(py: Python<'_>) -> PyResult<Self> {
        let cls = py
            .import("sniffer.core.streams")?
            .getattr("_Exchange")?
            .cast_into::<PyType>()?;
        Ok(ExSlots(Slots::new(py, &cls, &SLOT_NAMES)?))
    }

    /// `getattr(x, slot) is None`.
    fn is_none(&self, x: &Bound<'_, PyAny>, slot: Slot) -> PyResult<bool> {
        self.0.is_none(x, slot as usize)
    }

    /// `getattr(x, slot)`.
    fn get<'py>(&self, x: &Bound<'py, PyAny>, slot: Slot) -> PyResult<Bound<'py, PyAny>> {
        self.0.get(x, slot as usize)
    }

    /// `setattr(x, slot, value)`.
    fn set<'py, V: IntoPyObject<'py>>(
        &self,
        x: &Bound<'py, PyAny>,
        slot: Slot,
        value: V,
    ) -> PyResult<()> {
        self.0.set(x, slot as usize, value)
    }
}

fn types(py: Python<'_>) -> PyResult<&'static Types> {
    TYPES.get_or_try_init(py, || {
        let events = py.import("sniffer.core.events")?;
        let flag = events.getattr("StreamFlag")?;
        let cls = events.getattr("ChunkEvent")?.cast_into::<PyType>()?;
        let chunk = SlotClass::new(py, &cls)?;
        if chunk.len() != CHUNK_FIELDS {
            return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                "ChunkEvent has {} fields, the native loop makes {CHUNK_FIELDS}",
                chunk.len()
            )));
        }
        Ok(Types {
            chunk,
            pipeline_error: events.getattr("PipelineError")?.unbind(),
            flag_after_done: flag.getattr("AFTER_DONE")?.unbind(),
            flag_clock_backwards: flag.getattr("CLOCK_BACKWARDS")?.unbind(),
            ex: ExSlots::new(py)?,
        })
    })
}

fn kind_str<'py>(py: Python<'py>, k: Kind) -> &'py Bound<'py, PyString> {
    match k {
        Kind::Content => intern!(py, "content"),
        Kind::Reasoning => intern!(py, "reasoning"),
        Kind::ToolCall => intern!(py, "tool_call"),
        Kind::Finish => intern!(py, "finish"),
        Kind::Role => intern!(py, "role"),
        Kind::Other => intern!(py, "other"),
    }
}

fn py_str<'py>(py: Python<'py>, s: &str) -> Bound<'py, PyString> {
    if s.is_empty() {
        intern!(py, "").clone()
    } else {
        PyString::new(py, s)
    }
}

/// The exchange's state the loop reads and writes (`_Exchange`'s slots).
struct State<'py> {
    /// how to read and write `x`'s slots
    ex: &'static ExSlots,
    x: Bound<'py, PyAny>,
    stream: Bound<'py, PyAny>,
    seq: i64,
    seq0: i64,
    done_seen: bool,
    done0: bool,
    quiet: Lazy,
    invalid: Lazy,
    chunk_count: i64,
    chunk_count0: i64,
    text_len: i64,
    text_len0: i64,
    event_count: i64,
    event_count0: i64,
    /// whether the exchange has its first output's time (`t_first` not
    /// None: its value is not needed, only set once)
    has_t_first: bool,
    /// the first output's time, set in this call (written back)
    t_first: Option<f64>,
    t_last: Option<f64>,
    t_last_set: bool,
    usage: Option<Bound<'py, PyAny>>,
    error: Option<Bound<'py, PyAny>>,
    chunk_idx: Option<Bound<'py, PyDict>>,
    finish: Option<Bound<'py, PyDict>>,
    /// chunk events appended (the stage's `stats.chunk_events`)
    added: u64,
    /// dialect errors counted (the stage's `stats.errors["dialect"]`)
    errors: u64,
}

/// An int attribute of the exchange read when first changed (most items
/// leave `quiet` and `invalid` alone), written back if it was.
#[derive(Default)]
struct Lazy {
    /// (value read, value now)
    v: Option<(i64, i64)>,
}

impl Lazy {
    /// Adds one; the new value.
    fn bump(&mut self, ex: &ExSlots, x: &Bound<'_, PyAny>, slot: Slot) -> PyResult<i64> {
        let (v0, v) = match self.v {
            Some(got) => got,
            None => {
                let v: i64 = ex.get(x, slot)?.extract()?;
                (v, v)
            }
        };
        let v = v.saturating_add(1);
        self.v = Some((v0, v));
        Ok(v)
    }

    fn store(&self, ex: &ExSlots, x: &Bound<'_, PyAny>, slot: Slot) -> PyResult<()> {
        match self.v {
            Some((v0, v)) if v != v0 => ex.set(x, slot, v),
            _ => Ok(()),
        }
    }
}

fn opt_f64(v: Bound<'_, PyAny>) -> PyResult<Option<f64>> {
    if v.is_none() {
        Ok(None)
    } else {
        Ok(Some(v.extract()?))
    }
}

impl<'py> State<'py> {
    fn load(t: &'static Types, x: Bound<'py, PyAny>) -> PyResult<Self> {
        let ex = &t.ex;
        let int = |slot: Slot| -> PyResult<i64> { ex.get(&x, slot)?.extract() };
        let seq = int(Slot::Seq)?;
        let done_seen = ex.get(&x, Slot::DoneSeen)?.is_truthy()?;
        let chunk_count = int(Slot::ChunkCount)?;
        let text_len = int(Slot::TextLen)?;
        let event_count = int(Slot::EventCount)?;
        let stream = ex.get(&x, Slot::Stream)?;
        let has_t_first = !ex.is_none(&x, Slot::TFirst)?;
        let t_last = opt_f64(ex.get(&x, Slot::TLast)?)?;
        Ok(State {
            ex,
            x,
            stream,
            seq,
            seq0: seq,
            done_seen,
            done0: done_seen,
            quiet: Lazy::default(),
            invalid: Lazy::default(),
            chunk_count,
            chunk_count0: chunk_count,
            text_len,
            text_len0: text_len,
            event_count,
            event_count0: event_count,
            has_t_first,
            t_first: None,
            t_last,
            t_last_set: false,
            usage: None,
            error: None,
            chunk_idx: None,
            finish: None,
            added: 0,
            errors: 0,
        })
    }

    /// Writes the changed attributes back to the exchange.
    fn store(&self) -> PyResult<()> {
        let (ex, x) = (self.ex, &self.x);
        let set_int = |slot: Slot, v: i64, v0: i64| -> PyResult<()> {
            if v != v0 {
                ex.set(x, slot, v)?;
            }
            Ok(())
        };
        set_int(Slot::Seq, self.seq, self.seq0)?;
        self.quiet.store(ex, x, Slot::Quiet)?;
        self.invalid.store(ex, x, Slot::Invalid)?;
        set_int(Slot::ChunkCount, self.chunk_count, self.chunk_count0)?;
        set_int(Slot::TextLen, self.text_len, self.text_len0)?;
        set_int(Slot::EventCount, self.event_count, self.event_count0)?;
        if self.done_seen != self.done0 {
            ex.set(x, Slot::DoneSeen, self.done_seen)?;
        }
        if let Some(t) = self.t_first {
            ex.set(x, Slot::TFirst, t)?;
        }
        if self.t_last_set {
            ex.set(x, Slot::TLast, self.t_last)?;
        }
        if let Some(u) = &self.usage {
            ex.set(x, Slot::Usage, u)?;
        }
        if let Some(e) = &self.error {
            ex.set(x, Slot::Error, e)?;
        }
        Ok(())
    }

    /// The exchange's dict attribute `slot`, read once per call into `got`.
    fn dict_attr<'a>(
        ex: &ExSlots,
        x: &Bound<'py, PyAny>,
        got: &'a mut Option<Bound<'py, PyDict>>,
        slot: Slot,
    ) -> PyResult<&'a Bound<'py, PyDict>> {
        if got.is_none() {
            *got = Some(ex.get(x, slot)?.cast_into::<PyDict>()?);
        }
        Ok(got.as_ref().expect("set above"))
    }

    fn chunk_idx(&mut self) -> PyResult<&Bound<'py, PyDict>> {
        Self::dict_attr(self.ex, &self.x, &mut self.chunk_idx, Slot::ChunkIdx)
    }

    fn finish(&mut self) -> PyResult<&Bound<'py, PyDict>> {
        Self::dict_attr(self.ex, &self.x, &mut self.finish, Slot::Finish)
    }

    /// `StreamAssembler._flag`.
    fn flag(&self, py: Python<'py>, flag: &Py<PyAny>) -> PyResult<()> {
        let flags = self.ex.get(&self.x, Slot::Flags)?.cast_into::<PyList>()?;
        let flag = flag.bind(py);
        if !flags.contains(flag)? {
            flags.append(flag)?;
        }
        Ok(())
    }

    /// The next chunk index of a choice whose delta carries text.
    fn next_index(&mut self, choice: &Bound<'py, PyAny>) -> PyResult<i64> {
        let d = self.chunk_idx()?;
        let index = match d.get_item(choice)? {
            Some(v) => v.extract::<i64>()? + 1,
            None => 1,
        };
        d.set_item(choice, index)?;
        Ok(index)
    }

    /// What `_deltas` does after an item's deltas, when it stored any.
    fn after_item(&mut self, py: Python<'py>, t: &Types, ts: f64, seq_before: i64) -> PyResult<()> {
        let n = self.seq - seq_before;
        if n != 0 {
            if matches!(self.t_last, Some(last) if ts < last) {
                self.flag(py, &t.flag_clock_backwards)?;
            }
            self.t_last = Some(ts);
            self.t_last_set = true;
            self.event_count += n;
            self.added += n as u64;
        }
        Ok(())
    }

    /// `StreamAssembler._after_done`.
    fn after_done(
        &mut self,
        py: Python<'py>,
        t: &Types,
        ts: f64,
        item: &str,
        out: &Bound<'py, PyList>,
        max_quiet: i64,
    ) -> PyResult<()> {
        self.flag(py, &t.flag_after_done)?;
        if self.quiet.bump(self.ex, &self.x, Slot::Quiet)? > max_quiet {
            return Ok(());
        }
        let args = fields!(py;
                    &self.stream,
                    ts,
                    self.seq,
                    STREAM_LEVEL,
                    0,
                    intern!(py, "after_done"),
                    intern!(py, ""),
                    intern!(py, ""),
                    py.None(),
                    py.None(),
                    py.None(),
                    py.None(),
                    PyString::new(py, item),
                    py.None(),
        );
        out.append(chunk_event(py, t, args)?)?;
        self.seq += 1;
        self.event_count += 1;
        self.added += 1;
        Ok(())
    }

    /// `_deltas` for one native delta (its usage, error, server tokens are None).
    #[allow(clippy::too_many_arguments)]
    fn native_delta(
        &mut self,
        py: Python<'py>,
        t: &Types,
        ts: f64,
        d: &ChunkDelta<'_>,
        item: &mut Option<Bound<'py, PyString>>,
        data: &str,
        out: &Bound<'py, PyList>,
        max_quiet: i64,
    ) -> PyResult<()> {
        if matches!(d.kind, Kind::Role | Kind::Other) {
            let carries = !d.text.is_empty()
                || !d.reasoning.is_empty()
                || d.tool_calls.is_some()
                || d.finish_reason.is_some()
                || d.logprobs.is_some();
            if !carries && self.quiet.bump(self.ex, &self.x, Slot::Quiet)? > max_quiet {
                return Ok(()); // capped (never INVALID here)
            }
        }
        let choice = d.choice.into_pyobject(py)?.into_any();
        let mut index = 0;
        if !d.text.is_empty() {
            index = self.next_index(&choice)?;
            self.chunk_count += 1;
            self.text_len += d.text.chars().count() as i64;
        }
        if !self.has_t_first && matches!(d.kind, Kind::Content | Kind::Reasoning | Kind::ToolCall) {
            self.has_t_first = true;
            self.t_first = Some(ts);
        }
        let finish = d.finish_reason.as_deref().map(|f| PyString::new(py, f));
        if let Some(f) = &finish {
            self.finish()?.set_item(&choice, f)?;
        }
        let raw = if d.raw {
            if item.is_none() {
                *item = Some(PyString::new(py, data));
            }
            item.clone().map(Bound::into_any)
        } else {
            None
        };
        let args = fields!(py;
                    &self.stream,
                    ts,
                    self.seq,
                    choice,
                    index,
                    kind_str(py, d.kind),
                    py_str(py, &d.text),
                    py_str(py, &d.reasoning),
                    d.tool_calls.as_deref(),
                    finish,
                    d.logprobs.as_deref(),
                    py.None(),
                    raw,
                    py.None(),
        );
        out.append(chunk_event(py, t, args)?)?;
        self.seq += 1;
        Ok(())
    }

    /// `_deltas` for one `Delta` a Python dialect made.
    fn py_delta(
        &mut self,
        py: Python<'py>,
        t: &Types,
        ts: f64,
        d: &Bound<'py, PyAny>,
        out: &Bound<'py, PyList>,
        max_quiet: i64,
    ) -> PyResult<()> {
        let d = d.cast::<PyTuple>()?;
        if d.len() != 11 {
            return Err(pyo3::exceptions::PyTypeError::new_err(
                "a Delta has 11 fields",
            ));
        }
        let f = |i: usize| d.get_item(i);
        let (choice, kind, text, reasoning) = (f(0)?, f(1)?, f(2)?, f(3)?);
        let (tool_calls, finish_reason, logprobs, usage) = (f(4)?, f(5)?, f(6)?, f(7)?);
        let (raw, error, server_tokens) = (f(8)?, f(9)?, f(10)?);
        let kind_s = kind.cast::<PyString>()?.to_str()?.to_owned();
        let has_text = text.is_truthy()?;
        if matches!(kind_s.as_str(), "role" | "other" | "invalid") {
            let carries = has_text
                || reasoning.is_truthy()?
                || !tool_calls.is_none()
                || !finish_reason.is_none()
                || !logprobs.is_none()
                || !usage.is_none()
                || !server_tokens.is_none();
            if !carries && self.quiet.bump(self.ex, &self.x, Slot::Quiet)? > max_quiet {
                if kind_s == "invalid" {
                    self.invalid.bump(self.ex, &self.x, Slot::Invalid)?;
                    self.errors += 1;
                }
                return Ok(());
            }
        }
        let mut index = 0;
        if has_text {
            index = self.next_index(&choice)?;
            self.chunk_count += 1;
            self.text_len += text.len()? as i64;
        }
        if !self.has_t_first && matches!(kind_s.as_str(), "content" | "reasoning" | "tool_call") {
            self.has_t_first = true;
            self.t_first = Some(ts);
        }
        if !finish_reason.is_none() {
            self.finish()?.set_item(&choice, &finish_reason)?;
        }
        if !usage.is_none() {
            self.usage = Some(usage.clone());
        }
        match kind_s.as_str() {
            "done" => self.done_seen = true,
            "error" => {
                self.error = Some(if error.is_truthy()? {
                    error.clone()
                } else {
                    intern!(py, "error object in stream").clone().into_any()
                });
            }
            "invalid" => {
                self.invalid.bump(self.ex, &self.x, Slot::Invalid)?;
                self.errors += 1;
                let message = if error.is_truthy()? {
                    error.clone()
                } else {
                    intern!(py, "unparseable item").clone().into_any()
                };
                let conn = self.ex.get(&self.x, Slot::Conn)?;
                let args = (
                    ts,
                    intern!(py, "dialect"),
                    intern!(py, "invalid"),
                    message,
                    conn,
                    &self.stream,
                );
                out.append(t.pipeline_error.bind(py).call1(args)?)?;
            }
            _ => {}
        }
        let args = fields!(py;
                    &self.stream,
                    ts,
                    self.seq,
                    choice,
                    index,
                    kind,
                    text,
                    reasoning,
                    tool_calls,
                    finish_reason,
                    logprobs,
                    usage,
                    raw,
                    server_tokens,
        );
        out.append(chunk_event(py, t, args)?)?;
        self.seq += 1;
        Ok(())
    }
}

/// One SSE event through the dialect and `_deltas`.
#[allow(clippy::too_many_arguments)]
fn item<'py>(
    py: Python<'py>,
    t: &Types,
    st: &mut State<'py>,
    dialect: &Bound<'py, PyAny>,
    endpoint: Option<Endpoint>,
    named: &mut bool,
    ts: f64,
    data: String,
    event: &str,
    out: &Bound<'py, PyList>,
    max_quiet: i64,
) -> PyResult<()> {
    if st.done_seen {
        return st.after_done(py, t, ts, &data, out, max_quiet);
    }
    let seq_before = st.seq;
    if let Some(endpoint) = endpoint {
        if let Some(chunk) = extract(&data, endpoint, !*named) {
            if chunk.server.is_none() {
                if let Some(model) = &chunk.model {
                    // what the dialect's `event` does with them (`_OpenAIBase.event`)
                    dialect.setattr(intern!(py, "response_model"), model.as_ref())?;
                    if let Some(rid) = &chunk.id {
                        dialect.setattr(intern!(py, "response_id"), rid.as_ref())?;
                    }
                    dialect.setattr(intern!(py, "_named"), true)?;
                    *named = true;
                }
                let mut raw_item = None;
                for d in &chunk.deltas {
                    st.native_delta(py, t, ts, d, &mut raw_item, &data, out, max_quiet)?;
                }
                return st.after_item(py, t, ts, seq_before);
            }
            // A chunk with usage/timings: the dialect's Python reads those.
        }
    }
    let event = match event {
        "message" => intern!(py, "message").clone(),
        "ndjson" => intern!(py, "ndjson").clone(),
        other => PyString::new(py, other),
    };
    let deltas = dialect.call_method1(intern!(py, "event"), (data, event))?;
    if endpoint.is_some() && !*named {
        *named = dialect.getattr(intern!(py, "_named"))?.is_truthy()?;
    }
    for d in deltas.try_iter()? {
        st.py_delta(py, t, ts, &d?, out, max_quiet)?;
    }
    st.after_item(py, t, ts, seq_before)
}

/// The items of one body event: the SSE decoder's events, or the NDJSON
/// decoder's lines (event type "ndjson", as the Python loop passes them).
enum Items {
    Sse(Vec<SseEvent>),
    Lines(Vec<String>),
}

/// `body_chunks(x, ts, data, out, max_quiet)`: the body bytes `data` of the
/// exchange `x` through its item decoder (`decoder`, a native `SseDecoder`,
/// or else `ndjson`, a native `NdjsonDecoder`), the dialect and `_deltas`;
/// chunk events appended to `out`. Returns `(chunk events appended, dialect
/// errors counted, exception or None)`: an exception of the dialect is
/// returned after the state is written back, for the stage to count what was
/// done and raise it.
#[pyfunction]
fn body_chunks<'py>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
    ts: f64,
    data: &[u8],
    out: &Bound<'py, PyList>,
    max_quiet: i64,
) -> PyResult<Chunks> {
    let t = types(py)?;
    let dec = t.ex.get(x, Slot::Decoder)?;
    items(py, t, x, dec, None, ts, data, out, max_quiet)
}

/// Whether the dialect class `cls` lets the native OpenAI extraction take
/// its items (its class attribute `native_chunks`: 2 chat, 1 completions,
/// else not).
fn endpoint(py: Python<'_>, cls: &Bound<'_, PyType>) -> Option<Endpoint> {
    match cls
        .getattr(intern!(py, "native_chunks"))
        .ok()
        .and_then(|v| v.extract::<i64>().ok())
    {
        Some(2) => Some(Endpoint::Chat),
        Some(1) => Some(Endpoint::Completions),
        _ => None,
    }
}

/// `endpoint` of the dialect classes met in one call of the native core's
/// `feed_bodies`, each read once (a class attribute look-up through the
/// instance per exchange was ~260 instructions per body live, where each
/// exchange has about one body per call): the classes hold
/// `native_chunks` fixed (`_OpenAIBase.native_chunks`) and no Python code
/// that runs inside the call (the dialects' `event`) changes them.
#[derive(Default)]
pub(crate) struct Endpoints<'py>(Vec<(Bound<'py, PyType>, Option<Endpoint>)>);

impl<'py> Endpoints<'py> {
    fn of(&mut self, dialect: &Bound<'py, PyAny>) -> Option<Endpoint> {
        let tp = dialect.get_type_ptr();
        if let Some((_, e)) = self
            .0
            .iter()
            .find(|(c, _)| std::ptr::eq(c.as_type_ptr(), tp))
        {
            return *e;
        }
        let cls = dialect.get_type();
        let e = endpoint(dialect.py(), &cls);
        self.0.push((cls, e));
        e
    }
}

/// What the item loop did: (chunk events appended, dialect errors counted,
/// the dialect's exception or None), see `body_chunks`.
pub(crate) type Chunks = (u64, u64, Option<PyErr>);

/// The items of one body event through the exchange's item decoder `dec`
/// (a native `SseDecoder`; None: its `ndjson`, a native `NdjsonDecoder`);
/// None when it completed none.
fn decode<'py>(
    ex: &ExSlots,
    x: &Bound<'py, PyAny>,
    dec: &Bound<'py, PyAny>,
    data: &[u8],
) -> PyResult<Option<Items>> {
    let items = if dec.is_none() {
        let dec = ex.get(x, Slot::Ndjson)?;
        let dec = dec.cast::<PyNdjsonDecoder>()?;
        let lines = dec.borrow_mut().feed_lines(data);
        if lines.is_empty() {
            return Ok(None);
        }
        Items::Lines(lines)
    } else {
        let dec = dec.cast::<PySseDecoder>()?;
        let events = dec.borrow_mut().feed_events(data);
        if events.is_empty() {
            return Ok(None);
        }
        Items::Sse(events)
    };
    Ok(Some(items))
}

/// Each item through the dialect and `_deltas` (`item`), up to the first
/// that raises: its exception.
#[allow(clippy::too_many_arguments)]
fn run<'py>(
    py: Python<'py>,
    t: &Types,
    st: &mut State<'py>,
    dialect: &Bound<'py, PyAny>,
    endpoint: Option<Endpoint>,
    named: &mut bool,
    ts: f64,
    items: Items,
    out: &Bound<'py, PyList>,
    max_quiet: i64,
) -> Option<PyErr> {
    let mut step = |data: String, event: &str| {
        item(
            py, t, st, dialect, endpoint, named, ts, data, event, out, max_quiet,
        )
    };
    match items {
        Items::Sse(events) => {
            for e in events {
                if let Err(err) = step(e.data, &e.event) {
                    return Some(err);
                }
            }
        }
        Items::Lines(lines) => {
            for line in lines {
                if let Err(err) = step(line, "ndjson") {
                    return Some(err);
                }
            }
        }
    }
    None
}

/// The item loop of `body_chunks`, the exchange's `decoder` (`dec`) and
/// `dialect` (when already read) given.
#[allow(clippy::too_many_arguments)]
fn items<'py>(
    py: Python<'py>,
    t: &'static Types,
    x: &Bound<'py, PyAny>,
    dec: Bound<'py, PyAny>,
    dialect: Option<Bound<'py, PyAny>>,
    ts: f64,
    data: &[u8],
    out: &Bound<'py, PyList>,
    max_quiet: i64,
) -> PyResult<Chunks> {
    let Some(items) = decode(&t.ex, x, &dec, data)? else {
        return Ok((0, 0, None));
    };
    let dialect = match dialect {
        Some(d) => d,
        None => t.ex.get(x, Slot::Dialect)?,
    };
    let endpoint = endpoint(py, &dialect.get_type());
    let mut named = match endpoint {
        Some(_) => dialect.getattr(intern!(py, "_named"))?.is_truthy()?,
        None => true,
    };
    let mut st = State::load(t, x.clone())?;
    let failed = run(
        py, t, &mut st, &dialect, endpoint, &mut named, ts, items, out, max_quiet,
    );
    st.store()?;
    Ok((st.added, st.errors, failed))
}

/// The streamed body of an exchange `Fed` decodes: its decoder and dialect,
/// and its state once an item came.
struct Streamed<'py> {
    /// its `decoder` (None: its `ndjson` is read at each body, as `items` does)
    dec: Bound<'py, PyAny>,
    dialect: Bound<'py, PyAny>,
    endpoint: Option<Endpoint>,
    named: bool,
    /// read at its first body with items in the call
    st: Option<State<'py>>,
}

/// `StreamAssembler._response_body` for the response bodies of one exchange
/// `x` in one call of the native core's `feed_bodies` (`fused.rs`, the held
/// bodies of a batch), when the native item loop does all of it: `x` decodes
/// a streamed body with a native decoder and nothing is sniffed, synced or
/// guessed; or `x` has no dialect (its byte count only). What the loop reads
/// of the exchange is read at its first body in the call, and what it
/// changes is written back once, by `close`, before the call returns (nothing
/// but the loop touches the exchange in between: the Python stage runs after
/// the call), not read and written again at each body (some 20 attribute
/// look-ups and stores of a Python object each: ~4k instructions per body,
/// when a busy capture interleaves the bodies of dozens of streams).
pub(crate) struct Fed<'py> {
    t: &'static Types,
    x: Bound<'py, PyAny>,
    /// None: no dialect (the bytes are counted, no more)
    streamed: Option<Streamed<'py>>,
    resp_bytes: i64,
    resp_bytes0: i64,
}

impl<'py> Fed<'py> {
    /// None, with nothing read but the exchange's decoding state, when the
    /// Python stage must take its bodies (a recovered body not yet synced or
    /// guessed, a whole JSON document). The decoders are the native ones (a
    /// native pipeline's stage makes no other).
    pub(crate) fn open(
        py: Python<'py>,
        x: Bound<'py, PyAny>,
        endpoints: &mut Endpoints<'py>,
    ) -> PyResult<Option<Self>> {
        let t = types(py)?;
        let ex = &t.ex;
        for slot in [Slot::Sniff, Slot::ItemSync, Slot::Unguessed] {
            if !ex.is_none(&x, slot)? {
                return Ok(None);
            }
        }
        let dialect = ex.get(&x, Slot::Dialect)?;
        let streamed = if dialect.is_none() {
            None
        } else {
            let dec = ex.get(&x, Slot::Decoder)?;
            if dec.is_none() && ex.is_none(&x, Slot::Ndjson)? {
                return Ok(None); // a whole document (or nothing): Python's
            }
            let endpoint = endpoints.of(&dialect);
            let named = match endpoint {
                Some(_) => dialect.getattr(intern!(py, "_named"))?.is_truthy()?,
                None => true,
            };
            Some(Streamed {
                dec,
                dialect,
                endpoint,
                named,
                st: None,
            })
        };
        let resp_bytes = ex.get(&x, Slot::RespBytes)?.extract::<i64>()?;
        Ok(Some(Fed {
            t,
            x,
            streamed,
            resp_bytes,
            resp_bytes0: resp_bytes,
        }))
    }

    /// The body bytes `data` (captured at `ts`): counted, and decoded into
    /// chunk events appended to `out`. The dialect's exception, if it raised
    /// (the items after it dropped, as `body_chunks` does).
    pub(crate) fn body(
        &mut self,
        py: Python<'py>,
        ts: f64,
        data: &[u8],
        out: &Bound<'py, PyList>,
        max_quiet: i64,
    ) -> PyResult<Option<PyErr>> {
        let len = i64::try_from(data.len()).unwrap_or(i64::MAX);
        self.resp_bytes = self.resp_bytes.saturating_add(len);
        let Some(s) = &mut self.streamed else {
            return Ok(None);
        };
        let t = self.t;
        let Some(items) = decode(&t.ex, &self.x, &s.dec, data)? else {
            return Ok(None);
        };
        let st = match &mut s.st {
            Some(st) => st,
            None => s.st.insert(State::load(t, self.x.clone())?),
        };
        Ok(run(
            py,
            t,
            st,
            &s.dialect,
            s.endpoint,
            &mut s.named,
            ts,
            items,
            out,
            max_quiet,
        ))
    }

    /// Writes what changed back to the exchange; (chunk events appended,
    /// dialect errors counted).
    pub(crate) fn close(&self) -> PyResult<(u64, u64)> {
        if self.resp_bytes != self.resp_bytes0 {
            self.t.ex.set(&self.x, Slot::RespBytes, self.resp_bytes)?;
        }
        match self.streamed.as_ref().and_then(|s| s.st.as_ref()) {
            Some(st) => {
                st.store()?;
                Ok((st.added, st.errors))
            }
            None => Ok((0, 0)),
        }
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(body_chunks, m)?)?;
    Ok(())
}
