//! The recording chain's observers' per-batch arithmetic
//! (`sniffer.record.metrics`): conversions only, the arithmetic in
//! `sparseety_core::hist`.

use pyo3::prelude::*;
use pyo3::types::PyList;

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
        return Err(pyo3::exceptions::PyValueError::new_err(
            "a count per bucket bound",
        ));
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
    Ok(())
}
