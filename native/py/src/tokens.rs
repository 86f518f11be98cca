//! `attribute_counts`: the token pass's per-chunk attribution
//! (`sparseety_core::tokens::attribute`; `sniffer.llm.tokens._attribute_counts`
//! is the reference). In Python it is a dozen passes over the chunks and the
//! tokens (~200k instructions for a stream of 60 chunks); here the offsets are
//! read once and the rest is integers.

use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

use sparseety_core::tokens::{
    attribute, attribute_tiled, summary, summary_tiled_by, Straddle, Summary,
};

/// Integers of a list item by item, of an `array('q')` (the fast path's
/// token ends, `PieceEncoder.encode`) from its buffer, of any other sequence
/// through the generic conversion.
fn ints(values: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
    if let Ok(list) = values.cast::<PyList>() {
        let mut out = Vec::with_capacity(list.len());
        for x in list.iter() {
            out.push(x.extract()?);
        }
        return Ok(out);
    }
    if let Ok(buf) = PyBuffer::<i64>::get(values) {
        return buf.to_vec(values.py());
    }
    values.extract()
}

/// Tokens attributed to each piece (given by its length) of a text whose
/// encoding has `n_ids` tokens at `offsets` ((start, end) character offsets),
/// and the straddling tokens (token index, piece it starts in, piece it ends
/// in): `_attribute_counts`. A list of lengths and a list of 2-tuples are read
/// item by item (the tokenizer's offsets, the analysis's lists); any other
/// sequences through the generic conversion.
#[pyfunction]
fn attribute_counts(
    lens: &Bound<'_, PyAny>,
    n_ids: i64,
    offsets: &Bound<'_, PyAny>,
) -> PyResult<(Vec<i64>, Vec<Straddle>)> {
    Ok(attribute(&ints(lens)?, n_ids, &pairs(offsets)?))
}

/// A list of 2-tuples item by item, any other sequence through the generic
/// conversion.
fn pairs(offsets: &Bound<'_, PyAny>) -> PyResult<Vec<(i64, i64)>> {
    Ok(match offsets.cast::<PyList>() {
        Ok(list) => {
            let mut out = Vec::with_capacity(list.len());
            for o in list.iter() {
                out.push(match o.cast::<PyTuple>() {
                    Ok(t) if t.len() == 2 => (
                        t.get_borrowed_item(0)?.extract()?,
                        t.get_borrowed_item(1)?.extract()?,
                    ),
                    _ => o.extract()?,
                });
            }
            out
        }
        Err(_) => offsets.extract()?,
    })
}

/// `attribute_counts` of tokens that tile the text in order, given by their
/// ends (`_attribute_tiled`): the token pass's ASCII texts, whose offsets it
/// knows from the tokens' bytes without making a tuple per token.
#[pyfunction]
#[pyo3(name = "attribute_tiled")]
fn attribute_tiled_py(
    lens: &Bound<'_, PyAny>,
    ends: &Bound<'_, PyAny>,
) -> PyResult<(Vec<i64>, Vec<Straddle>)> {
    Ok(attribute_tiled(&ints(lens)?, &ints(ends)?))
}

/// `_choice_summary` as Python has it: (counts, straddles per chunk, straddle
/// count, listed straddles' token indices, their anomaly details, tokens per
/// chunk → chunks: a dict in increasing order of tokens).
type SummaryPy<'py> = (
    Vec<i64>,
    Vec<i64>,
    i64,
    Vec<i64>,
    Vec<String>,
    Bound<'py, PyDict>,
);

fn summary_py(py: Python<'_>, s: Summary) -> PyResult<SummaryPy<'_>> {
    let histogram = PyDict::new(py);
    for (n, m) in s.histogram {
        histogram.set_item(n, m)?;
    }
    Ok((
        s.counts,
        s.straddle_counts,
        s.straddles,
        s.listed,
        s.details,
        histogram,
    ))
}

/// `_choice_summary` of a choice whose chunks have lengths `lens` and seqs
/// `seqs`, encoded as `n_ids` tokens at `offsets`, listing at most `limit`
/// straddles: the attribution and everything the analysis makes of it per
/// chunk, in one call (the Python reference loops over the straddles and
/// formats each listed one).
#[pyfunction]
fn choice_summary<'py>(
    py: Python<'py>,
    lens: &Bound<'py, PyAny>,
    seqs: &Bound<'py, PyAny>,
    n_ids: i64,
    offsets: &Bound<'py, PyAny>,
    limit: usize,
) -> PyResult<SummaryPy<'py>> {
    let s = summary(&ints(lens)?, &ints(seqs)?, n_ids, &pairs(offsets)?, limit);
    summary_py(py, s)
}

/// `choice_summary` of tokens that tile the text in order, given by their
/// ends. Only the seqs the listed straddles' details name are read (`seqs[j]`:
/// a choice's chunks are read twice over otherwise, their lengths and seqs).
#[pyfunction]
fn choice_summary_tiled<'py>(
    py: Python<'py>,
    lens: &Bound<'py, PyAny>,
    seqs: &Bound<'py, PyAny>,
    ends: &Bound<'py, PyAny>,
    limit: usize,
) -> PyResult<SummaryPy<'py>> {
    let mut failed: Option<PyErr> = None;
    let seq_at = |j: usize| match seqs.get_item(j).and_then(|v| v.extract::<i64>()) {
        Ok(v) => v,
        Err(e) => {
            failed.get_or_insert(e);
            0
        }
    };
    let s = summary_tiled_by(&ints(lens)?, &ints(ends)?, limit, seq_at);
    if let Some(e) = failed {
        return Err(e);
    }
    summary_py(py, s)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(attribute_counts, m)?)?;
    m.add_function(wrap_pyfunction!(attribute_tiled_py, m)?)?;
    m.add_function(wrap_pyfunction!(choice_summary, m)?)?;
    m.add_function(wrap_pyfunction!(choice_summary_tiled, m)?)?;
    Ok(())
}
