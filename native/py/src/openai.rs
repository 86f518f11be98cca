//! Bindings of `sparseety_core::openai`: one streamed OpenAI chat/completions
//! item → the `Delta` values of `sniffer.llm.dialects.base`, or None when the
//! Python dialect must handle it. Conversions only.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};
use pyo3::IntoPyObjectExt;

use sparseety_core::openai::{extract, Endpoint, Kind};
use sparseety_core::pyjson::Value;

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

/// A parsed JSON value as the Python object `json.loads` makes of it.
fn to_py<'py>(py: Python<'py>, v: &Value<'_>) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => b.into_bound_py_any(py)?,
        Value::Int(i) => i.into_bound_py_any(py)?,
        Value::Float(f) => f.into_bound_py_any(py)?,
        Value::Str(s) => PyString::new(py, s).into_any(),
        Value::Array(items) => {
            let out = PyList::empty(py);
            for item in items {
                out.append(to_py(py, item)?)?;
            }
            out.into_any()
        }
        Value::Object(members) => {
            let out = PyDict::new(py);
            for (k, item) in members {
                out.set_item(PyString::new(py, k), to_py(py, item)?)?;
            }
            out.into_any()
        }
    })
}

/// `openai_chunk(data, chat, want_name)`: None (not mine), or
/// `(deltas, model, id, server)`; `model` and `id` are None unless
/// `want_name`; `server`: None, or the chunk's `(usage, timings, metrics,
/// meta_info)` values.
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
    let server = match &chunk.server {
        None => py.None().into_bound(py),
        Some(values) => {
            let items = values
                .iter()
                .map(|v| to_py(py, v))
                .collect::<PyResult<Vec<_>>>()?;
            PyTuple::new(py, items)?.into_any()
        }
    };
    Ok(Some(PyTuple::new(
        py,
        [out.into_any(), name(chunk.model)?, name(chunk.id)?, server],
    )?))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(openai_chunk, m)?)?;
    Ok(())
}
