//! Binding of the `TPACKET_V3` ring block walk (`sparseety_core::ring`): one
//! call per ring block, frames to segments in Rust. Conversions only.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use sparseety_core::link;
use sparseety_core::ring::walk_block;

use crate::flow::{with_bytes, SegmentBatch};

/// The block of `ring[base:base + block_size]`: (segments, packets, bytes,
/// outgoing copies skipped, truncated frames, last capture time or None), as
/// `AfPacketSource._walk_block` counts them.
#[pyfunction]
#[allow(clippy::type_complexity)]
fn parse_block(
    py: Python<'_>,
    linktype: u32,
    ring: &Bound<'_, PyAny>,
    base: usize,
    block_size: usize,
    skip_outgoing: bool,
) -> PyResult<(SegmentBatch, u64, u64, u64, u64, Option<f64>)> {
    with_bytes(py, ring, |buf| {
        let end = base
            .checked_add(block_size)
            .filter(|&e| e <= buf.len())
            .ok_or_else(|| PyValueError::new_err("the block runs past the ring"))?;
        let mut batch = SegmentBatch::new();
        let c = walk_block(&buf[base..end], skip_outgoing, |ts, frame| {
            batch.frames += 1;
            if let Some(s) = link::parse_frame(linktype, frame) {
                batch.push(ts, &s);
            }
        });
        Ok((batch, c.packets, c.bytes, c.skipped, c.truncated, c.last_ts))
    })?
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(parse_block, m)?)?;
    Ok(())
}
