//! Bindings of `sparseety_core::openai`: one streamed OpenAI chat/completions
//! item → the `Delta` values of `sniffer.llm.dialects.base`, or None when the
//! Python dialect must handle it. Conversions only.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyList, PyString, PyTuple};
use pyo3::IntoPyObjectExt;

use sparseety_core::openai::{extract, Endpoint, Kind};

/// `Delta` and `tuple.__new__`, imported once.
struct Types {
    delta: Py<PyAny>,
    tuple_new: Py<PyAny>,
}

static TYPES: PyOnceLock<Types> = PyOnceLock::new();

fn types(py: Python<'_>) -> PyResult<&'static Types> {
    TYPES.get_or_try_init(py, || {
        Ok(Types {
            delta: py
                .import("sniffer.llm.dialects.base")?
                .getattr("Delta")?
                .unbind(),
            tuple_new: py
                .import("builtins")?
                .getattr("tuple")?
                .getattr("__new__")?
                .unbind(),
        })
    })
}

fn kind<'py>(py: Python<'py>, k: Kind) -> &'py Bound<'py, PyString> {
    match k {
        Kind::Content => pyo3::intern!(py, "content"),
        Kind::Reasoning => pyo3::intern!(py, "reasoning"),
        Kind::ToolCall => pyo3::intern!(py, "tool_call"),
        Kind::Finish => pyo3::intern!(py, "finish"),
        Kind::Role => pyo3::intern!(py, "role"),
        Kind::Other => pyo3::intern!(py, "other"),
    }
}

fn text<'py>(py: Python<'py>, s: &str) -> Bound<'py, PyString> {
    if s.is_empty() {
        pyo3::intern!(py, "").clone()
    } else {
        PyString::new(py, s)
    }
}

/// `openai_chunk(data, chat, want_name)`: None (not mine), or
/// `(deltas, model, id)`; `model` and `id` are None unless `want_name`.
#[pyfunction]
fn openai_chunk<'py>(
    py: Python<'py>,
    data: &Bound<'py, PyString>,
    chat: bool,
    want_name: bool,
) -> PyResult<Option<Bound<'py, PyTuple>>> {
    let Ok(s) = data.to_str() else {
        return Ok(None); // lone surrogates: not UTF-8
    };
    let endpoint = if chat {
        Endpoint::Chat
    } else {
        Endpoint::Completions
    };
    let Some(chunk) = extract(s, endpoint, want_name) else {
        return Ok(None);
    };
    let t = types(py)?;
    let out = PyList::empty(py);
    for d in chunk.deltas {
        let fields = (
            d.choice,
            kind(py, d.kind),
            text(py, &d.text),
            text(py, &d.reasoning),
            d.tool_calls.as_deref(),
            d.finish_reason.as_deref(),
            d.logprobs.as_deref(),
            py.None(),
            if d.raw {
                data.clone().into_any()
            } else {
                py.None().into_bound(py)
            },
            py.None(),
            py.None(),
        )
            .into_pyobject(py)?;
        out.append(t.tuple_new.bind(py).call1((t.delta.bind(py), fields))?)?;
    }
    let name = |v: Option<std::borrow::Cow<'_, str>>| -> PyResult<Bound<'py, PyAny>> {
        v.as_deref().into_bound_py_any(py)
    };
    Ok(Some(PyTuple::new(
        py,
        [out.into_any(), name(chunk.model)?, name(chunk.id)?],
    )?))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(openai_chunk, m)?)?;
    Ok(())
}
