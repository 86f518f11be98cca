//! The recording chain's per-batch work: the metrics' histogram
//! observations of a batch (`sniffer.record.metrics`; the arithmetic in
//! `sparseety_core::hist`), the token collector's packing of a block of an
//! open stream's chunks and its pass over a batch's chunks
//! (`sniffer.record.token_collector`), the metrics' pass over a batch's
//! chunks, the tracker's
//! output times (`sniffer.record.tracker`) and the writer's chunk rows
//! (`sniffer.store.writer`). Conversions only: the passes read the
//! `ChunkEvent`s' slots where they are kept (`crate::slots`), one call per
//! batch (a call per chunk that read them through `getattr` cost more than
//! Python's own specialised slot reads).

use std::os::raw::c_long;

use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{
    PyBool, PyByteArray, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple, PyType,
};

use crate::slots::Slots;

/// `_HistogramChild.observe_all` (the reference) of float `values`: each
/// counted in its bucket of `bounds` (`counts`, a list of ints, one per
/// bound, updated in place) and added to `total` in order; the new total.
#[pyfunction]
fn hist_observe_all(
    bounds: Vec<f64>,
    counts: &Bound<'_, PyList>,
    total: f64,
    values: Vec<f64>,
) -> PyResult<f64> {
    if counts.len() != bounds.len() {
        return Err(PyValueError::new_err("a count per bucket bound"));
    }
    let mut added = vec![0u64; bounds.len()];
    let total = sparseety_core::hist::observe_all(&bounds, &mut added, total, &values);
    for (i, n) in added.into_iter().enumerate() {
        if n > 0 {
            let c = counts.get_item(i)?.add(n)?;
            counts.set_item(i, c)?;
        }
    }
    Ok(total)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(hist_observe_all, m)?)?;
    m.add_function(wrap_pyfunction!(pack_chunk_block, m)?)?;
    m.add_class::<ChunkRows>()?;
    m.add_class::<TrackOutputs>()?;
    m.add_class::<CollectChunks>()?;
    m.add_class::<MetricsChunks>()?;
    Ok(())
}

/// `token_collector._pack_block` (the reference) of one block of an open
/// stream's chunks, a list of `(seq, choice, text)`: their seqs, choices and
/// text lengths (in code points) as the bytes of `array('q')`, `array('l')`
/// and `array('l')`, and their texts joined (the string `"".join` makes
/// there: their UTF-8 concatenated and decoded, or `"".join` itself for a
/// text that has none, a lone surrogate).
#[pyfunction]
#[allow(clippy::type_complexity)]
fn pack_chunk_block<'py>(
    py: Python<'py>,
    tail: &Bound<'py, PyList>,
) -> PyResult<(
    Bound<'py, PyBytes>,
    Bound<'py, PyBytes>,
    Bound<'py, PyBytes>,
    Bound<'py, PyAny>,
)> {
    let mut block = Block::with_capacity(tail.len());
    for item in tail.iter() {
        block.push_item(&item)?;
    }
    let joined = block.joined(py)?;
    Ok((
        PyBytes::new(py, &block.seqs),
        PyBytes::new(py, &block.choices),
        PyBytes::new(py, &block.lens),
        joined,
    ))
}

/// A block of chunks being packed (`pack_chunk_block`, and `CollectChunks`
/// when a chunk fills its stream's block): the columns' bytes and the texts.
struct Block<'py> {
    seqs: Vec<u8>,
    choices: Vec<u8>,
    lens: Vec<u8>,
    texts: Vec<Bound<'py, PyString>>,
}

impl<'py> Block<'py> {
    fn with_capacity(n: usize) -> Self {
        let long = std::mem::size_of::<c_long>();
        Block {
            seqs: Vec::with_capacity(n.saturating_mul(8)),
            choices: Vec::with_capacity(n.saturating_mul(long)),
            lens: Vec::with_capacity(n.saturating_mul(long)),
            texts: Vec::with_capacity(n),
        }
    }

    /// A chunk of a tail, `(seq, choice, text)`.
    fn push_item(&mut self, item: &Bound<'py, PyAny>) -> PyResult<()> {
        let t = item.cast::<PyTuple>()?;
        if t.len() != 3 {
            return Err(PyValueError::new_err("a chunk is (seq, choice, text)"));
        }
        self.push(&t.get_item(0)?, &t.get_item(1)?, t.get_item(2)?)
    }

    fn push(
        &mut self,
        seq: &Bound<'py, PyAny>,
        choice: &Bound<'py, PyAny>,
        text: Bound<'py, PyAny>,
    ) -> PyResult<()> {
        let seq: i64 = seq.extract()?;
        let choice: c_long = choice.extract()?;
        let text = text.cast_into::<PyString>()?;
        let len = c_long::try_from(text.len()?)
            .map_err(|_| PyValueError::new_err("a chunk text longer than a C long"))?;
        self.seqs.extend_from_slice(&seq.to_ne_bytes());
        self.choices.extend_from_slice(&choice.to_ne_bytes());
        self.lens.extend_from_slice(&len.to_ne_bytes());
        self.texts.push(text);
        Ok(())
    }

    /// The texts joined: their UTF-8 concatenated (an ASCII text's is its
    /// own buffer), or, when a text has none (a lone surrogate), `"".join`.
    fn joined(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let utf8: Option<Vec<&str>> = self.texts.iter().map(|t| t.to_str().ok()).collect();
        Ok(if let Some(parts) = utf8 {
            PyString::new(py, &parts.concat()).into_any()
        } else {
            PyString::new(py, "")
                .call_method1(intern!(py, "join"), (PyList::new(py, &self.texts)?,))?
        })
    }
}

/// `bytes` appended to the bytearray `to`.
fn extend_bytearray(to: &Bound<'_, PyByteArray>, bytes: &[u8]) -> PyResult<()> {
    let at = to.len();
    to.resize(at.saturating_add(bytes.len()))?;
    // SAFETY: `to` is a bytearray just resized to hold `at` + `bytes.len()`
    // bytes and the GIL is held; no Python code runs (nothing else can read
    // or resize it) until the slice is dropped at the end of this statement.
    #[allow(unsafe_code)]
    let buf = unsafe { to.as_bytes_mut() };
    buf[at..].copy_from_slice(bytes);
    Ok(())
}

/// Where a pass hands the events of a batch that are not chunk events: the
/// callable of their exact type in `handlers` (the observer's), the events
/// of any other type skipped (no Python call for what the observer does not
/// read: a stream's connection open and close).
fn hand(handlers: &Bound<'_, PyDict>, ev: Bound<'_, PyAny>) -> PyResult<()> {
    if let Some(handle) = handlers.get_item(ev.get_type())? {
        handle.call1((ev,))?;
    }
    Ok(())
}

/// The index of `name` in `names`, added when missing.
fn index_of(names: &mut Vec<String>, name: &str) -> usize {
    match names.iter().position(|n| n == name) {
        Some(i) => i,
        None => {
            names.push(name.to_owned());
            names.len().saturating_sub(1)
        }
    }
}

/// The borrowed value of slot `i` of `ev`, exactly a `cls` instance, as a
/// `Bound` (None: unset).
fn slot<'py>(slots: &Slots, ev: &Bound<'py, PyAny>, i: usize) -> Option<Bound<'py, PyAny>> {
    slots
        .peek(ev, i)
        .map(|_| slots.get(ev, i))
        .and_then(Result::ok)
}

/// `StoreWriter.write_many`'s inlined chunk rows (`sniffer.store.writer`,
/// the reference: its Python loop), for a run of a batch's events: each
/// event exactly a `ChunkEvent` whose `optional` fields are all None gets
/// its row appended to `rows`, the tuple of its `content` fields when its
/// kind is `content_kind` and its reasoning `""`, else of its `plain`
/// fields (what `operator.attrgetter` of those names makes), and counts one
/// more pending row. The run stops before any other event (the writer's
/// `write` takes it: usage, tool calls, not a chunk, a subclass, an unset
/// field) and after the row that makes `pending` reach `batch_size` (the
/// writer flushes).
#[pyclass(frozen, module = "sniffer._native")]
pub struct ChunkRows {
    slots: Slots,
    optional: Vec<usize>,
    kind: usize,
    reasoning: usize,
    content: Vec<usize>,
    plain: Vec<usize>,
    content_kind: Py<PyString>,
}

#[pymethods]
impl ChunkRows {
    #[new]
    fn new(
        py: Python<'_>,
        cls: &Bound<'_, PyType>,
        content: Vec<String>,
        plain: Vec<String>,
        optional: Vec<String>,
        content_kind: Bound<'_, PyString>,
    ) -> PyResult<Self> {
        let mut names = Vec::new();
        let content: Vec<usize> = content.iter().map(|n| index_of(&mut names, n)).collect();
        let plain: Vec<usize> = plain.iter().map(|n| index_of(&mut names, n)).collect();
        let optional: Vec<usize> = optional.iter().map(|n| index_of(&mut names, n)).collect();
        let kind = index_of(&mut names, "kind");
        let reasoning = index_of(&mut names, "reasoning");
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        Ok(ChunkRows {
            slots: Slots::new(py, cls, &refs)?,
            optional,
            kind,
            reasoning,
            content,
            plain,
            content_kind: content_kind.unbind(),
        })
    }

    /// The rows of the run of `events` from `start`: (where it stopped,
    /// the pending count).
    fn __call__(
        &self,
        events: &Bound<'_, PyList>,
        start: usize,
        rows: &Bound<'_, PyList>,
        mut pending: i64,
        batch_size: i64,
    ) -> PyResult<(usize, i64)> {
        let py = events.py();
        let none = py.None();
        let content_kind = self.content_kind.bind(py);
        let empty = intern!(py, "");
        let slots = &self.slots;
        let mut i = start;
        while i < events.len() {
            let ev = events.get_item(i)?;
            if !slots.exact(&ev) {
                break;
            }
            let plain = self.optional.iter().all(|&j| {
                slots
                    .peek(&ev, j)
                    .is_some_and(|p| std::ptr::eq(p, none.as_ptr()))
            });
            if !plain {
                break;
            }
            let (Some(kind), Some(reasoning)) = (
                slot(slots, &ev, self.kind),
                slot(slots, &ev, self.reasoning),
            ) else {
                break;
            };
            // `kind == "content" and reasoning == ""` (the same objects
            // nearly always: the interned strings)
            let is_content = (kind.is(content_kind) || kind.eq(content_kind)?)
                && (reasoning.is(empty) || reasoning.eq(empty)?);
            let fields = if is_content {
                &self.content
            } else {
                &self.plain
            };
            let mut values = Vec::with_capacity(fields.len());
            for &j in fields {
                match slot(slots, &ev, j) {
                    Some(v) => values.push(v),
                    None => return Ok((i, pending)), // `write` raises AttributeError
                }
            }
            rows.append(PyTuple::new(py, values)?)?;
            i = i.saturating_add(1);
            pending = pending.saturating_add(1);
            if pending >= batch_size {
                break;
            }
        }
        Ok((i, pending))
    }
}

/// `StreamTracker.observe`'s pass with output times (`sniffer.record.tracker`,
/// the reference): for each event exactly a `ChunkEvent` of a kind in
/// `output_kinds`, its stream's entry in `entries` (exactly a `Tracked`,
/// or anything with those attributes) gets its capture time as
/// `t_last_output`, and as `t_first_output` when that is None; an event
/// exactly a `StreamResponse` gives its stream's entry its `status` and
/// `streaming` (`StreamTracker.response`); one exactly a `StreamClosed`
/// becomes its stream's entry's `closed`, the entry added to `closing`,
/// unless it was closed already (`StreamTracker.closed`); every other event
/// goes to its handler (see [`hand`]), in order (the tracker's opens).
#[pyclass(frozen, module = "sniffer._native")]
pub struct TrackOutputs {
    chunk: Slots,
    tracked: Slots,
    response: Slots,
    closed: Slots,
    /// `output_kinds`' members: a kind that is one of them is in it
    kinds: Vec<Py<PyAny>>,
    output_kinds: Py<PyAny>,
}

const CHUNK_KIND: usize = 0;
const CHUNK_STREAM: usize = 1;
const CHUNK_TS: usize = 2;
const T_FIRST: usize = 0;
const T_LAST: usize = 1;
const T_STATUS: usize = 2;
const T_STREAMING: usize = 3;
const T_CLOSED: usize = 4;
const R_STREAM: usize = 0;
const R_STATUS: usize = 1;
const R_STREAMING: usize = 2;

#[pymethods]
impl TrackOutputs {
    #[new]
    fn new(
        py: Python<'_>,
        chunk_cls: &Bound<'_, PyType>,
        tracked_cls: &Bound<'_, PyType>,
        output_kinds: &Bound<'_, PyAny>,
        response_cls: &Bound<'_, PyType>,
        closed_cls: &Bound<'_, PyType>,
    ) -> PyResult<Self> {
        let kinds = output_kinds
            .try_iter()?
            .map(|k| k.map(Bound::unbind))
            .collect::<PyResult<Vec<_>>>()?;
        Ok(TrackOutputs {
            chunk: Slots::new(py, chunk_cls, &["kind", "stream", "ts"])?,
            tracked: Slots::new(
                py,
                tracked_cls,
                &[
                    "t_first_output",
                    "t_last_output",
                    "status",
                    "streaming",
                    "closed",
                ],
            )?,
            response: Slots::new(py, response_cls, &["stream", "status", "streaming"])?,
            closed: Slots::new(py, closed_cls, &["stream"])?,
            kinds,
            output_kinds: output_kinds.clone().unbind(),
        })
    }

    /// One batch of store events (in pipeline order).
    fn __call__(
        &self,
        events: &Bound<'_, PyList>,
        entries: &Bound<'_, PyDict>,
        handlers: &Bound<'_, PyDict>,
        closing: &Bound<'_, PyList>,
    ) -> PyResult<()> {
        let py = events.py();
        let chunk = &self.chunk;
        let output_kinds = self.output_kinds.bind(py);
        let mut i = 0;
        while i < events.len() {
            let ev = events.get_item(i)?;
            i = i.saturating_add(1);
            if !chunk.exact(&ev) {
                if self.response.exact(&ev) {
                    if let Some(e) = entries.get_item(self.response.get(&ev, R_STREAM)?)? {
                        self.tracked
                            .set(&e, T_STATUS, self.response.get(&ev, R_STATUS)?)?;
                        self.tracked
                            .set(&e, T_STREAMING, self.response.get(&ev, R_STREAMING)?)?;
                    }
                } else if self.closed.exact(&ev) {
                    if let Some(e) = entries.get_item(self.closed.get(&ev, 0)?)? {
                        if self.tracked.is_none(&e, T_CLOSED)? {
                            self.tracked.set(&e, T_CLOSED, &ev)?;
                            closing.append(e)?;
                        }
                    }
                } else {
                    hand(handlers, ev)?;
                }
                continue;
            }
            let kind = chunk.get(&ev, CHUNK_KIND)?;
            let output = self.kinds.iter().any(|k| kind.is(k)) || output_kinds.contains(&kind)?;
            if !output {
                continue;
            }
            let Some(e) = entries.get_item(chunk.get(&ev, CHUNK_STREAM)?)? else {
                continue;
            };
            let ts = chunk.get(&ev, CHUNK_TS)?;
            if self.tracked.is_none(&e, T_FIRST)? {
                self.tracked.set(&e, T_FIRST, &ts)?;
            }
            self.tracked.set(&e, T_LAST, ts)?;
        }
        Ok(())
    }
}

/// `TokenCollector.observe`'s pass over a batch (`sniffer.record.token_collector`,
/// the reference): each event exactly a `ChunkEvent` whose stream's entry in
/// `entries` has a collector state (its `tokens`, exactly the collector's
/// `_Open`) is kept here when that is all `TokenCollector._chunk` would do
/// (the tail shorter than its `room`, no finish reason nor logprobs):
/// `(seq, choice, text)` appended to that state's `tail` while the tail is
/// shorter than `join_at`; the chunk that fills the block (the tail holds
/// `join_at`) packed with the tail's as `_Open.join_tail` packs them
/// (`pack_chunk_block`): their columns' bytes added to the state's
/// `seqs`, `choices` and `lens` (bytearrays, made at the first block: until
/// then the empty `bytes`), their texts joined to its `blocks`, the tail
/// emptied and its `room` less a block. Any other chunk of a stream with a
/// state goes to `chunk(ev, state)` (`_chunk`, the reference); every event
/// not exactly a `ChunkEvent` to its handler (see [`hand`]), in order.
#[pyclass(frozen, module = "sniffer._native")]
pub struct CollectChunks {
    chunk: Slots,
    tracked: Slots,
    open: Slots,
    join_at: usize,
}

const C_STREAM: usize = 0;
const C_SEQ: usize = 1;
const C_CHOICE: usize = 2;
const C_TEXT: usize = 3;
const C_FINISH: usize = 4;
const C_LOGPROBS: usize = 5;
const O_TAIL: usize = 0;
const O_ROOM: usize = 1;
const O_SEQS: usize = 2;
const O_CHOICES: usize = 3;
const O_LENS: usize = 4;
const O_BLOCKS: usize = 5;

#[pymethods]
impl CollectChunks {
    #[new]
    fn new(
        py: Python<'_>,
        chunk_cls: &Bound<'_, PyType>,
        tracked_cls: &Bound<'_, PyType>,
        open_cls: &Bound<'_, PyType>,
        join_at: usize,
    ) -> PyResult<Self> {
        Ok(CollectChunks {
            chunk: Slots::new(
                py,
                chunk_cls,
                &[
                    "stream",
                    "seq",
                    "choice",
                    "text",
                    "finish_reason",
                    "logprobs",
                ],
            )?,
            tracked: Slots::new(py, tracked_cls, &["tokens"])?,
            open: Slots::new(
                py,
                open_cls,
                &["tail", "room", "seqs", "choices", "lens", "blocks"],
            )?,
            join_at,
        })
    }

    /// One batch of store events (in pipeline order).
    fn __call__(
        &self,
        events: &Bound<'_, PyList>,
        entries: &Bound<'_, PyDict>,
        chunk: &Bound<'_, PyAny>,
        handlers: &Bound<'_, PyDict>,
    ) -> PyResult<()> {
        let py = events.py();
        let c = &self.chunk;
        let mut i = 0;
        while i < events.len() {
            let ev = events.get_item(i)?;
            i = i.saturating_add(1);
            if !c.exact(&ev) {
                hand(handlers, ev)?;
                continue;
            }
            let Some(e) = entries.get_item(c.get(&ev, C_STREAM)?)? else {
                continue;
            };
            let s = self.tracked.get(&e, 0)?;
            if s.is_none() {
                continue;
            }
            if !self.open.exact(&s) {
                chunk.call1((ev, s))?;
                continue;
            }
            let tail = self.open.get(&s, O_TAIL)?;
            let room = self.open.get(&s, O_ROOM)?;
            let kept = match (tail.cast::<PyList>(), room.extract::<isize>()) {
                (Ok(tail), Ok(room)) => {
                    let k = tail.len();
                    let plain = isize::try_from(k).is_ok_and(|k| k < room)
                        && c.is_none(&ev, C_FINISH)?
                        && c.is_none(&ev, C_LOGPROBS)?;
                    if !plain {
                        false
                    } else if k < self.join_at {
                        let item = PyTuple::new(
                            py,
                            [
                                c.get(&ev, C_SEQ)?,
                                c.get(&ev, C_CHOICE)?,
                                c.get(&ev, C_TEXT)?,
                            ],
                        )?;
                        tail.append(item)?;
                        true
                    } else {
                        k == self.join_at && self.fill_block(py, &ev, &s, tail, room)?
                    }
                }
                _ => false,
            };
            if !kept {
                chunk.call1((ev, s))?;
            }
        }
        Ok(())
    }
}

impl CollectChunks {
    /// `_chunk(ev, s)` for the chunk that fills `s`'s block (its `tail`
    /// holds `join_at` chunks, `room` more may come): true when packed here,
    /// false (nothing changed) when anything is not as `_Open` makes it or
    /// `pack_chunk_block` would raise (`_chunk` then does it, or raises).
    fn fill_block<'py>(
        &self,
        py: Python<'py>,
        ev: &Bound<'py, PyAny>,
        s: &Bound<'py, PyAny>,
        tail: &Bound<'py, PyList>,
        room: isize,
    ) -> PyResult<bool> {
        let c = &self.chunk;
        // the columns: bytearrays, or the empty bytes before the first block
        let mut columns = Vec::with_capacity(3);
        for slot in [O_SEQS, O_CHOICES, O_LENS] {
            let col = self.open.get(s, slot)?;
            let col = match col.cast_into_exact::<PyByteArray>() {
                Ok(ba) => Some(ba),
                Err(e) => {
                    let col = e.into_inner();
                    match col.cast_exact::<PyBytes>() {
                        Ok(b) if b.as_bytes().is_empty() => None,
                        _ => return Ok(false),
                    }
                }
            };
            columns.push(col);
        }
        let Ok(blocks) = self.open.get(s, O_BLOCKS)?.cast_into_exact::<PyList>() else {
            return Ok(false);
        };
        let mut block = Block::with_capacity(tail.len().saturating_add(1));
        let packed = tail
            .iter()
            .try_for_each(|item| block.push_item(&item))
            .and_then(|()| {
                block.push(
                    &c.get(ev, C_SEQ)?,
                    &c.get(ev, C_CHOICE)?,
                    c.get(ev, C_TEXT)?,
                )
            })
            .and_then(|()| block.joined(py));
        let Ok(joined) = packed else {
            return Ok(false);
        };
        let Some(room) = room.checked_sub(isize::try_from(tail.len().saturating_add(1))?) else {
            return Ok(false);
        };
        // what `join_tail` does from here, and `_chunk` after it
        for ((slot, col), bytes) in [O_SEQS, O_CHOICES, O_LENS].into_iter().zip(columns).zip([
            &block.seqs,
            &block.choices,
            &block.lens,
        ]) {
            match col {
                Some(ba) => extend_bytearray(&ba, bytes)?,
                None => self.open.set(s, slot, PyByteArray::new(py, bytes))?,
            }
        }
        blocks.append(joined)?;
        tail.del_slice(0, tail.len())?;
        self.open.set(s, O_ROOM, room)?;
        Ok(true)
    }
}

/// `Metrics._observe`'s pass over a batch (`sniffer.record.metrics`, the
/// reference: `Metrics._chunk` per chunk event, its handlers per other event):
/// a chunk event whose figures are only counts, a gap and a cadence time of
/// a stream already seen — its entry (in `entries`) with the metrics'
/// state (`_Open`), which has its label set's `_Pending`; when the chunk is
/// a streamed output, its first output seen (`ttft_done`) and its choice's
/// `_Choice` made, the times floats, the text a str, the cadence times a
/// bytearray — is counted here, as `_chunk` does: the pending chunk count,
/// the gap since the choice's last output chunk (when not negative), the
/// choice's last time, the cadence time of a chunk with text (its 8 bytes,
/// native order, added to the choice's `times` while that is shorter than
/// `max_time_bytes`). Any other chunk event goes to `chunk(ev, entry)`
/// (entry None when its stream is not tracked), every event not exactly a
/// `ChunkEvent` to its handler (see [`hand`]), in order.
#[pyclass(frozen, module = "sniffer._native")]
pub struct MetricsChunks {
    chunk: Slots,
    tracked: Slots,
    open: Slots,
    pending: Slots,
    choice: Slots,
    kinds: Vec<Py<PyAny>>,
    output_kinds: Py<PyAny>,
    max_time_bytes: usize,
}

const M_STREAM: usize = 0;
const M_KIND: usize = 1;
const M_TS: usize = 2;
const M_CHOICE: usize = 3;
const M_TEXT: usize = 4;
const E_METRICS: usize = 0;
const E_STREAMING: usize = 1;
const S_PENDING: usize = 0;
const S_TTFT_DONE: usize = 1;
const S_CHOICES: usize = 2;
const P_N: usize = 0;
const P_GAPS: usize = 1;
const CH_LAST: usize = 0;
const CH_TIMES: usize = 1;

#[pymethods]
impl MetricsChunks {
    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        chunk_cls: &Bound<'_, PyType>,
        tracked_cls: &Bound<'_, PyType>,
        open_cls: &Bound<'_, PyType>,
        pending_cls: &Bound<'_, PyType>,
        choice_cls: &Bound<'_, PyType>,
        output_kinds: &Bound<'_, PyAny>,
        max_time_bytes: usize,
    ) -> PyResult<Self> {
        let kinds = output_kinds
            .try_iter()?
            .map(|k| k.map(Bound::unbind))
            .collect::<PyResult<Vec<_>>>()?;
        Ok(MetricsChunks {
            chunk: Slots::new(py, chunk_cls, &["stream", "kind", "ts", "choice", "text"])?,
            tracked: Slots::new(py, tracked_cls, &["metrics", "streaming"])?,
            open: Slots::new(py, open_cls, &["pending", "ttft_done", "choices"])?,
            pending: Slots::new(py, pending_cls, &["n", "gaps"])?,
            choice: Slots::new(py, choice_cls, &["last", "times"])?,
            kinds,
            output_kinds: output_kinds.clone().unbind(),
            max_time_bytes,
        })
    }

    /// One batch of store events (in pipeline order).
    fn __call__(
        &self,
        events: &Bound<'_, PyList>,
        entries: &Bound<'_, PyDict>,
        chunk: &Bound<'_, PyAny>,
        handlers: &Bound<'_, PyDict>,
    ) -> PyResult<()> {
        let py = events.py();
        let c = &self.chunk;
        let none = py.None().into_bound(py);
        let mut i = 0;
        while i < events.len() {
            let ev = events.get_item(i)?;
            i = i.saturating_add(1);
            if !c.exact(&ev) {
                hand(handlers, ev)?;
                continue;
            }
            let Some(e) = entries.get_item(c.get(&ev, M_STREAM)?)? else {
                chunk.call1((ev, &none))?;
                continue;
            };
            if !self.count(py, &ev, &e)? {
                chunk.call1((ev, e))?;
            }
        }
        Ok(())
    }
}

impl MetricsChunks {
    /// `_chunk(ev, e)` when this chunk is one counted here (true), else
    /// nothing (false): every condition is checked before anything changes.
    fn count(&self, py: Python<'_>, ev: &Bound<'_, PyAny>, e: &Bound<'_, PyAny>) -> PyResult<bool> {
        let Some(s) = self
            .tracked
            .peek(e, E_METRICS)
            .map(|_| self.tracked.get(e, E_METRICS))
        else {
            return Ok(false);
        };
        let s = s?;
        if !self.open.exact(&s) {
            return Ok(false);
        }
        let p = self.open.get(&s, S_PENDING)?;
        if !self.pending.exact(&p) {
            return Ok(false);
        }
        let n = self.pending.get(&p, P_N)?;
        let Some(n1) = n
            .cast_exact::<PyInt>()
            .ok()
            .and_then(|n| n.extract::<i64>().ok())
            .and_then(|n| n.checked_add(1))
        else {
            return Ok(false);
        };
        let streaming = self.tracked.get(e, E_STREAMING)?;
        let streaming = if streaming.is(&*PyBool::new(py, true)) {
            true
        } else if streaming.is(&*PyBool::new(py, false)) {
            false
        } else {
            return Ok(false);
        };
        let output = streaming && {
            let kind = self.chunk.get(ev, M_KIND)?;
            self.kinds.iter().any(|k| kind.is(k)) || self.output_kinds.bind(py).contains(&kind)?
        };
        if !output {
            self.pending.set(&p, P_N, n1)?;
            return Ok(true);
        }
        if !self.open.get(&s, S_TTFT_DONE)?.is(&*PyBool::new(py, true)) {
            return Ok(false);
        }
        let Ok(choices) = self.open.get(&s, S_CHOICES)?.cast_into_exact::<PyDict>() else {
            return Ok(false);
        };
        let Some(ch) = choices.get_item(self.chunk.get(ev, M_CHOICE)?)? else {
            return Ok(false);
        };
        if !self.choice.exact(&ch) {
            return Ok(false);
        }
        let (Ok(last), Ok(ts)) = (
            self.choice.get(&ch, CH_LAST)?.cast_into_exact::<PyFloat>(),
            self.chunk.get(ev, M_TS)?.cast_into_exact::<PyFloat>(),
        ) else {
            return Ok(false);
        };
        let Ok(text) = self.chunk.get(ev, M_TEXT)?.cast_into_exact::<PyString>() else {
            return Ok(false);
        };
        let Ok(gaps) = self.pending.get(&p, P_GAPS)?.cast_into_exact::<PyList>() else {
            return Ok(false);
        };
        let Ok(times) = self
            .choice
            .get(&ch, CH_TIMES)?
            .cast_into_exact::<PyByteArray>()
        else {
            return Ok(false);
        };
        // what `_chunk` does from here
        self.pending.set(&p, P_N, n1)?;
        let (t, l) = (ts.value(), last.value());
        if t >= l {
            gaps.append(PyFloat::new(py, t - l))?;
        }
        self.choice.set(&ch, CH_LAST, &ts)?;
        if !text.is_empty()? && times.len() < self.max_time_bytes {
            // `times += _TIME(ts)`: the double's bytes, native order
            extend_bytearray(&times, &t.to_ne_bytes())?;
        }
        Ok(true)
    }
}
