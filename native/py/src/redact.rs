//! `redact_clean_cut`: the redaction step's usual window decided in one pass
//! (`sparseety_core::redact::clean_cut`; the reference is
//! `sniffer.record.redact._clean_cut`, `tests/test_redact.py` compares them).

use pyo3::prelude::*;
use pyo3::types::{PyList, PyString};

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
    let mut scan = sparseety_core::redact::CutScan::new(texts.len(), start, cut, max_held);
    for t in texts.iter() {
        let t = t.cast_into::<PyString>()?;
        let len = t.len()?; // characters
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

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(redact_clean_cut, m)?)?;
    Ok(())
}
