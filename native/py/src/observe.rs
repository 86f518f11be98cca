//! The recording chain's observers' per-batch work: the metrics' histogram
//! observations of a batch (`sniffer.record.metrics`; the arithmetic in
//! `sparseety_core::hist`) and the token collector's packing of a block of
//! an open stream's chunks (`sniffer.record.token_collector`). Conversions
//! only.

use std::os::raw::c_long;

use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};

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
    let n = tail.len();
    let long = std::mem::size_of::<c_long>();
    let mut seqs = Vec::with_capacity(n * 8);
    let mut choices = Vec::with_capacity(n * long);
    let mut lens = Vec::with_capacity(n * long);
    let mut texts = Vec::with_capacity(n);
    for item in tail.iter() {
        let t = item.cast::<PyTuple>()?;
        if t.len() != 3 {
            return Err(PyValueError::new_err("a chunk is (seq, choice, text)"));
        }
        let seq: i64 = t.get_item(0)?.extract()?;
        let choice: c_long = t.get_item(1)?.extract()?;
        let text = t.get_item(2)?.cast_into::<PyString>()?;
        let len = c_long::try_from(text.len()?)
            .map_err(|_| PyValueError::new_err("a chunk text longer than a C long"))?;
        seqs.extend_from_slice(&seq.to_ne_bytes());
        choices.extend_from_slice(&choice.to_ne_bytes());
        lens.extend_from_slice(&len.to_ne_bytes());
        texts.push(text);
    }
    // their UTF-8 concatenated (an ASCII text's is its own buffer), or, when
    // a text has none (a lone surrogate), `"".join`
    let utf8: Option<Vec<&str>> = texts.iter().map(|t| t.to_str().ok()).collect();
    let joined = if let Some(parts) = utf8 {
        PyString::new(py, &parts.concat()).into_any()
    } else {
        PyString::new(py, "").call_method1(intern!(py, "join"), (PyList::new(py, texts)?,))?
    };
    Ok((
        PyBytes::new(py, &seqs),
        PyBytes::new(py, &choices),
        PyBytes::new(py, &lens),
        joined,
    ))
}
