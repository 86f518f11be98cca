//! `cadence_split`: the arithmetic of `sniffer.llm.cadence._classes` (the
//! reference) for the live metrics' class of every output at its close
//! (`sparseety_core::cadence::split`).

use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;

/// `(k, short_p50, long_p50)` of the gaps between consecutive `times` (an
/// `array('d')` or any sequence of floats), gaps below `floor` counted as
/// `floor` in the split; None with fewer than two gaps or a gap that is not
/// finite (the caller then takes the reference).
#[pyfunction]
fn cadence_split(
    py: Python<'_>,
    times: &Bound<'_, PyAny>,
    floor: f64,
) -> PyResult<Option<(usize, f64, f64)>> {
    let values: Vec<f64> = match PyBuffer::<f64>::get(times) {
        Ok(buf) => buf.to_vec(py)?,
        Err(_) => times.extract()?,
    };
    Ok(sparseety_core::cadence::split(&values, floor))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(cadence_split, m)?)?;
    Ok(())
}
