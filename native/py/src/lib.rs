//! `sniffer._native`: the PyO3 boundary of the native core. Conversions only;
//! the parsing lives in `sparseety-core`.

use pyo3::prelude::*;

mod bpe;
mod cadence;
mod chunks;
mod flow;
mod fused;
mod http;
mod observe;
mod openai;
mod pretok;
mod redact;
mod ring;
mod slots;
mod tokens;

/// The private extension module `sniffer._native`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", sparseety_core::VERSION)?;
    flow::register(m)?;
    http::register(m)?;
    ring::register(m)?;
    fused::register(m)?;
    openai::register(m)?;
    chunks::register(m)?;
    tokens::register(m)?;
    pretok::register(m)?;
    bpe::register(m)?;
    cadence::register(m)?;
    observe::register(m)?;
    slots::register(m)?;
    redact::register(m)?;
    Ok(())
}
