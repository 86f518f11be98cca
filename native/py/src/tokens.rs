//! `attribute_counts`: the token pass's per-chunk attribution
//! (`sparseety_core::tokens::attribute`; `sniffer.llm.tokens._attribute_counts`
//! is the reference). In Python it is a dozen passes over the chunks and the
//! tokens (~200k instructions for a stream of 60 chunks); here the offsets are
//! read once and the rest is integers.

use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use sparseety_core::tokens::{attribute, attribute_tiled, Straddle};

/// Integers of a list item by item, of any other sequence through the
/// generic conversion.
fn ints(values: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
    match values.cast::<PyList>() {
        Ok(list) => {
            let mut out = Vec::with_capacity(list.len());
            for x in list.iter() {
                out.push(x.extract()?);
            }
            Ok(out)
        }
        Err(_) => values.extract(),
    }
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
    let lens = ints(lens)?;
    let offsets: Vec<(i64, i64)> = match offsets.cast::<PyList>() {
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
    };
    Ok(attribute(&lens, n_ids, &offsets))
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

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(attribute_counts, m)?)?;
    m.add_function(wrap_pyfunction!(attribute_tiled_py, m)?)?;
    Ok(())
}
