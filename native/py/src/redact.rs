//! The redaction step's chunk loop: `redact_clean_cut`, the usual look-behind
//! window decided in one pass (`sparseety_core::redact::clean_cut`; the
//! reference is `sniffer.record.redact._clean_cut`), and `RedactChunks`,
//! `StreamRedactor.events`' loop over a batch (the reference is its Python
//! loop) for the chunks of a stream's hot choice, with that window's usual
//! scan. `tests/test_redact.py` and `tests/test_native_passes.py` compare
//! them with their references.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyInt, PyList, PyString, PyType};

use crate::slots::Slots;

/// `(k, limit)` of [`redact_clean_cut`] for a list of chunk texts (str
/// only, else TypeError); None where the reference must answer.
fn clean_cut_of(
    texts: &Bound<'_, PyList>,
    start: i64,
    cut: i64,
    max_held: usize,
    enabled: bool,
) -> PyResult<Option<(usize, usize)>> {
    let mut scan = sparseety_core::redact::CutScan::new(texts.len(), start, cut, max_held);
    for t in texts.iter() {
        let t = t.cast_into::<PyString>()?;
        let len = t.code_point_len()?;
        if !scan.reaches(len) {
            scan.push_len(len); // looked at by an earlier scan: its length is all
            continue;
        }
        // a lone surrogate has no UTF-8 (nor is it ASCII): the reference's
        let pushed = t.to_str().is_ok_and(|s| scan.push(s));
        if !pushed {
            return Ok(None);
        }
    }
    Ok(scan.finish(enabled))
}

/// `(k, limit)`: how many of a choice's held chunk `texts` its look-behind
/// window decides (those ending at most `cut` characters in, at least
/// `len(texts) - max_held`) and where the last ends, when the built-in
/// patterns' pre-checks find nothing in the window from character `start`
/// on; None when they may (or a text from `start` on is not ASCII): the caller takes the
/// reference. `texts` must hold str only (else TypeError).
#[pyfunction]
fn redact_clean_cut(
    texts: &Bound<'_, PyList>,
    start: i64,
    cut: i64,
    max_held: usize,
    enabled: bool,
) -> PyResult<Option<(usize, usize)>> {
    clean_cut_of(texts, start, cut, max_held, enabled)
}

// `ChunkEvent`'s slots read here
const EV_STREAM: usize = 0;
const EV_CHOICE: usize = 1;
const EV_TEXT: usize = 2;
const EV_REASONING: usize = 3;
/// tool_calls, logprobs, raw
const EV_JSON: [usize; 3] = [4, 5, 6];
// `_Stream`'s
const S_HOT: usize = 0;
const S_RUNS: usize = 1;
const S_LAST: usize = 2;
// `_Choice`'s
const C_CHOICE: usize = 0;
const C_EVENTS: usize = 1;
const C_LIMIT: usize = 2;
const C_TEXT: usize = 3;
const C_READY: usize = 4;
const C_GIVEN: usize = 5;
const C_REASONING: usize = 6;
// `TextWindow`'s
const W_PENDING: usize = 0;
const W_PENDING_LEN: usize = 1;
const W_DECIDED: usize = 2;
const W_CLEAR: usize = 3;
const W_BASE: usize = 4;
const W_SCAN_AT: usize = 5;
const W_LOOKBEHIND: usize = 6;
const W_MAX_HELD: usize = 7;

/// `StreamRedactor.events`' loop over a batch (`sniffer.record.redact`, the
/// reference: its Python loop), for a redactor without user patterns. A
/// chunk event of a stream's hot choice (`_Stream.hot`: the choice whose run
/// is the stream's last, without reasoning), with text and no reasoning, is
/// taken in here as the loop's hot path takes it: onto the choice's held
/// events and its text window's pending texts. When that reaches the
/// choice's `limit`, the window's usual scan is done here too, as `_scan`
/// does it: the window due, nothing decided in it, the new text clean by
/// `redact_clean_cut`, one chunk or more decided, none of them with a JSON
/// field to look at, the choice's run the stream's only one and nothing of
/// it ready: the decided events go out as they came, the window and the
/// choice's counts moved on, its `limit` set again. Everything else goes
/// to the reference's steps, unchanged: `chunk(ev, s, out)` for any other
/// chunk event (`s` None when its stream holds nothing), `scan(c, s, out)`
/// for any other scan, `other(ev, out)` for an event not exactly a
/// `ChunkEvent` whose type `Redactor.event` may rewrite (any other goes out
/// as it is, as `other` would give it). Each step checks everything it reads before it changes
/// anything.
#[pyclass(frozen, module = "sniffer._native")]
pub struct RedactChunks {
    chunk: Slots,
    stream: Slots,
    choice: Slots,
    window: Slots,
    /// `_COLD`: a stream's `hot` when no choice's run is its last
    cold: Py<PyAny>,
    /// `_WINDOW_PRE_MAX`: the scan starts this many characters, less one,
    /// before the window's `clear`
    pre_max: i64,
    /// `_REWRITTEN`: the event types `Redactor.event` may rewrite (exactly
    /// these); an event of any other type goes out as it is, without a call
    rewritten: Vec<Py<PyType>>,
}

/// The value of an exact int (None: not one, or not an i64).
fn int_of(x: &Bound<'_, PyAny>) -> Option<i64> {
    x.cast_exact::<PyInt>().ok()?.extract::<i64>().ok()
}

#[pymethods]
impl RedactChunks {
    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        chunk_cls: &Bound<'_, PyType>,
        stream_cls: &Bound<'_, PyType>,
        choice_cls: &Bound<'_, PyType>,
        window_cls: &Bound<'_, PyType>,
        cold: &Bound<'_, PyAny>,
        pre_max: i64,
        rewritten: Vec<Bound<'_, PyType>>,
    ) -> PyResult<Self> {
        Ok(RedactChunks {
            chunk: Slots::new(
                py,
                chunk_cls,
                &[
                    "stream",
                    "choice",
                    "text",
                    "reasoning",
                    "tool_calls",
                    "logprobs",
                    "raw",
                ],
            )?,
            stream: Slots::new(py, stream_cls, &["hot", "runs", "last"])?,
            choice: Slots::new(
                py,
                choice_cls,
                &[
                    "choice",
                    "events",
                    "limit",
                    "text",
                    "ready",
                    "given",
                    "reasoning",
                ],
            )?,
            window: Slots::new(
                py,
                window_cls,
                &[
                    "pending",
                    "pending_len",
                    "decided",
                    "clear",
                    "base",
                    "scan_at",
                    "lookbehind",
                    "max_held",
                ],
            )?,
            cold: cold.clone().unbind(),
            pre_max,
            rewritten: rewritten.into_iter().map(Bound::unbind).collect(),
        })
    }

    /// One batch of store events (in pipeline order); what is given out is
    /// appended to `out`. `enabled`: the redactor's personal-data patterns
    /// are on.
    #[allow(clippy::too_many_arguments)]
    fn __call__(
        &self,
        events: &Bound<'_, PyList>,
        streams: &Bound<'_, PyDict>,
        out: &Bound<'_, PyList>,
        enabled: bool,
        chunk: &Bound<'_, PyAny>,
        other: &Bound<'_, PyAny>,
        scan: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let py = events.py();
        let empty = intern!(py, "");
        let mut i = 0;
        while i < events.len() {
            let ev = events.get_item(i)?;
            i = i.saturating_add(1);
            if !self.chunk.exact(&ev) {
                let t = ev.get_type();
                if self.rewritten.iter().any(|r| t.is(r.bind(py))) {
                    other.call1((ev, out))?;
                } else {
                    out.append(ev)?; // (`_other`: `Redactor.event` gives it back)
                }
                continue;
            }
            let Some(s) = streams.get_item(self.chunk.get(&ev, EV_STREAM)?)? else {
                chunk.call1((ev, py.None(), out))?;
                continue;
            };
            match self.take(&ev, &s, empty)? {
                None => {
                    chunk.call1((ev, s, out))?;
                }
                Some(None) => {} // below the choice's limit: nothing to decide
                Some(Some((c, w))) => {
                    if !self.scan(&c, &w, &s, out, enabled)? {
                        scan.call1((c, s, out))?;
                    }
                }
            }
        }
        Ok(())
    }

    /// `StreamRedactor._final_clean(c)` (the reference) when none of the
    /// held events has a JSON field to look at: `c` (exactly a `_Choice`)
    /// without a reasoning window, nothing decided, its window's new text
    /// clean by `redact_clean_cut`: every held event handed on to `c.ready`
    /// as it came, the window emptied and moved on; true. False when it is
    /// not that choice (nothing changed: the reference takes it).
    fn final_clean(&self, c: &Bound<'_, PyAny>, enabled: bool) -> PyResult<bool> {
        let (ch, win) = (&self.choice, &self.window);
        if !ch.exact(c) || !ch.is_none(c, C_REASONING)? {
            return Ok(false);
        }
        let w = ch.get(c, C_TEXT)?;
        if !win.exact(&w) {
            return Ok(false);
        }
        let (Ok(pending), Ok(decided), Ok(held), Ok(ready)) = (
            win.get(&w, W_PENDING)?.cast_into_exact::<PyList>(),
            win.get(&w, W_DECIDED)?.cast_into_exact::<PyList>(),
            ch.get(c, C_EVENTS)?.cast_into_exact::<PyList>(),
            ch.get(c, C_READY)?.cast_into_exact::<PyList>(),
        ) else {
            return Ok(false);
        };
        let k = pending.len();
        if !decided.is_empty() || held.len() != k {
            return Ok(false);
        }
        let int = |j: usize| win.get(&w, j).map(|v| int_of(&v));
        let (Some(n), Some(max_held), Some(clear), Some(base)) = (
            int(W_PENDING_LEN)?,
            int(W_MAX_HELD)?,
            int(W_CLEAR)?,
            int(W_BASE)?,
        ) else {
            return Ok(false);
        };
        // (no text: only empty texts, or none, decided without a look)
        let mut moved = None;
        if n != 0 {
            let (Ok(max_held), Some(start)) = (
                usize::try_from(max_held),
                clear
                    .checked_sub(self.pre_max)
                    .and_then(|x| x.checked_add(1)),
            ) else {
                return Ok(false);
            };
            let Some((decided_k, limit)) = clean_cut_of(&pending, start, n, max_held, enabled)?
            else {
                return Ok(false);
            };
            let Ok(limit) = i64::try_from(limit) else {
                return Ok(false);
            };
            let (Some(base), Some(rest)) = (base.checked_add(limit), n.checked_sub(limit)) else {
                return Ok(false);
            };
            if decided_k != k {
                return Ok(false);
            }
            moved = Some((base, rest));
        }
        if self.json_in(&held, k)? {
            return Ok(false);
        }
        // what `_final_clean` does from here
        if let Some((base, rest)) = moved {
            win.set(&w, W_BASE, base)?;
            win.set(&w, W_PENDING_LEN, rest)?;
            win.set(&w, W_CLEAR, rest.max(0))?;
        }
        pending.del_slice(0, k)?;
        for j in 0..k {
            ready.append(held.get_item(j)?)?;
        }
        held.del_slice(0, k)?;
        Ok(true)
    }
}

/// A held choice and its text window.
type Held<'py> = (Bound<'py, PyAny>, Bound<'py, PyAny>);

impl RedactChunks {
    /// Whether any of the first `k` events of `held` has a truthy JSON field
    /// (`tool_calls`, `logprobs`, `raw`): what `_release` must look at. None
    /// where the slot keeps it (the usual field) is read without a call.
    fn json_in(&self, held: &Bound<'_, PyList>, k: usize) -> PyResult<bool> {
        let none = held.py().None();
        for j in 0..k {
            let ev = held.get_item(j)?;
            for f in EV_JSON {
                let is_none = self
                    .chunk
                    .peek(&ev, f)
                    .is_some_and(|p| std::ptr::eq(p, none.as_ptr()));
                if !is_none && self.chunk.get(&ev, f)?.is_truthy()? {
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }

    /// The hot path's take of chunk event `ev` of stream `s` (its `_Stream`):
    /// None when it is not the hot path's (nothing changed: `_chunk` takes
    /// it); else taken in, with its choice and text window when they reached
    /// the choice's `limit` (a scan is due).
    #[allow(clippy::type_complexity)]
    fn take<'py>(
        &self,
        ev: &Bound<'py, PyAny>,
        s: &Bound<'py, PyAny>,
        empty: &Bound<'py, PyString>,
    ) -> PyResult<Option<Option<Held<'py>>>> {
        if !self.stream.exact(s) {
            return Ok(None);
        }
        let c = self.stream.get(s, S_HOT)?;
        if !self.choice.exact(&c) {
            return Ok(None);
        }
        // `c.choice == ev.choice and text and not ev.reasoning`
        let (ours, its) = (
            self.choice.get(&c, C_CHOICE)?,
            self.chunk.get(ev, EV_CHOICE)?,
        );
        // (the same int object: equal, without the comparison)
        let same = ours.is(&its) && ours.is_exact_instance_of::<PyInt>();
        if !same && !ours.eq(its)? {
            return Ok(None);
        }
        let Ok(text) = self.chunk.get(ev, EV_TEXT)?.cast_into_exact::<PyString>() else {
            return Ok(None);
        };
        let len = text.code_point_len()?;
        if len == 0 {
            return Ok(None);
        }
        let reasoning = self.chunk.get(ev, EV_REASONING)?;
        let no_reasoning = reasoning.is(empty)
            || reasoning.is_none()
            || reasoning
                .cast_exact::<PyString>()
                .is_ok_and(|r| r.code_point_len().is_ok_and(|n| n == 0));
        if !no_reasoning {
            return Ok(None);
        }
        let Ok(held) = self.choice.get(&c, C_EVENTS)?.cast_into_exact::<PyList>() else {
            return Ok(None);
        };
        let w = self.choice.get(&c, C_TEXT)?;
        if !self.window.exact(&w) {
            return Ok(None);
        }
        let Ok(pending) = self.window.get(&w, W_PENDING)?.cast_into_exact::<PyList>() else {
            return Ok(None);
        };
        let (Some(pending_len), Some(limit)) = (
            int_of(&self.window.get(&w, W_PENDING_LEN)?),
            int_of(&self.choice.get(&c, C_LIMIT)?),
        ) else {
            return Ok(None);
        };
        let Some(n) = i64::try_from(len)
            .ok()
            .and_then(|len| pending_len.checked_add(len))
        else {
            return Ok(None);
        };
        held.append(ev)?;
        pending.append(text)?;
        self.window.set(&w, W_PENDING_LEN, n)?;
        Ok(Some((n >= limit).then_some((c, w))))
    }

    /// `_scan(c, s, out)` (`c`: `s`'s hot choice, `w` its text window) when
    /// it is the usual one (see [`RedactChunks`]): true when done here,
    /// false when nothing changed (the reference's `_scan` takes it).
    fn scan(
        &self,
        c: &Bound<'_, PyAny>,
        w: &Bound<'_, PyAny>,
        s: &Bound<'_, PyAny>,
        out: &Bound<'_, PyList>,
        enabled: bool,
    ) -> PyResult<bool> {
        let win = &self.window;
        let Ok(pending) = win.get(w, W_PENDING)?.cast_into_exact::<PyList>() else {
            return Ok(false);
        };
        let Ok(decided) = win.get(w, W_DECIDED)?.cast_into_exact::<PyList>() else {
            return Ok(false);
        };
        let int = |j: usize| win.get(w, j).map(|v| int_of(&v));
        let (Some(n), Some(scan_at), Some(max_held), Some(lookbehind), Some(clear), Some(base)) = (
            int(W_PENDING_LEN)?,
            int(W_SCAN_AT)?,
            int(W_MAX_HELD)?,
            int(W_LOOKBEHIND)?,
            int(W_CLEAR)?,
            int(W_BASE)?,
        ) else {
            return Ok(false);
        };
        let held_now = i64::try_from(pending.len()).unwrap_or(i64::MAX);
        if !decided.is_empty() || !(n >= scan_at || held_now > max_held) {
            return Ok(false);
        }
        let (Ok(max_held_n), Some(start), Some(cut)) = (
            usize::try_from(max_held),
            clear
                .checked_sub(self.pre_max)
                .and_then(|x| x.checked_add(1)),
            n.checked_sub(lookbehind),
        ) else {
            return Ok(false);
        };
        let Some((k, limit)) = clean_cut_of(&pending, start, cut, max_held_n, enabled)? else {
            return Ok(false);
        };
        if k == 0 {
            return Ok(false); // (rare: the reference's)
        }
        let ch = &self.choice;
        let Ok(held) = ch.get(c, C_EVENTS)?.cast_into_exact::<PyList>() else {
            return Ok(false);
        };
        if held.len() < k {
            return Ok(false);
        }
        // `_release`'s look at the JSON fields: none to look at
        if self.json_in(&held, k)? {
            return Ok(false);
        }
        // `drain()`'s hand-over when the choice's run is the stream's only one
        let runs = self.stream.get(s, S_RUNS)?;
        if runs.len()? != 1 {
            return Ok(false);
        }
        let Ok(ready) = ch.get(c, C_READY)?.cast_into_exact::<PyList>() else {
            return Ok(false);
        };
        let Some(given) = int_of(&ch.get(c, C_GIVEN)?) else {
            return Ok(false);
        };
        let (Ok(k_n), Ok(limit_n)) = (i64::try_from(k), i64::try_from(limit)) else {
            return Ok(false);
        };
        let left = held_now.saturating_sub(k_n);
        let (Some(base), Some(rest), Some(given)) = (
            base.checked_add(limit_n),
            n.checked_sub(limit_n),
            given.checked_add(k_n),
        ) else {
            return Ok(false);
        };
        let Some(next) = rest
            .checked_add(max_held)
            .and_then(|x| x.checked_sub(left))
            .and_then(|x| x.checked_add(1))
        else {
            return Ok(false);
        };
        if !ready.is_empty() {
            return Ok(false);
        }
        // what `_scan` does from here
        win.set(w, W_BASE, base)?;
        win.set(w, W_PENDING_LEN, rest)?;
        win.set(w, W_CLEAR, rest)?;
        pending.del_slice(0, k)?;
        for j in 0..k {
            out.append(held.get_item(j)?)?;
        }
        held.del_slice(0, k)?;
        ch.set(c, C_GIVEN, given)?;
        if held.is_empty() {
            runs.call_method0("popleft")?;
            self.stream.set(s, S_LAST, s.py().None())?;
            self.stream.set(s, S_HOT, self.cold.bind(s.py()))?;
        }
        ch.set(c, C_LIMIT, scan_at.min(next))?;
        Ok(true)
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(redact_clean_cut, m)?)?;
    m.add_class::<RedactChunks>()?;
    Ok(())
}
