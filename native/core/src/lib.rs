//! SparSEEty's native core: the per-packet path (frames → reassembly →
//! HTTP/1 framing → SSE/NDJSON → OpenAI chunk extraction → event values).
//!
//! Pure Rust and sans-IO like the Python stages it mirrors (`sniffer/core`,
//! `sniffer/capture/packet.py`): bytes in, values out, no clock, no I/O.
//! The Python stages are the reference; both must produce identical stores.
//! No `unsafe` (the workspace forbids it); every buffer is capped and every
//! size that comes off the wire is checked before arithmetic.

pub mod link;
pub mod pcapng;
pub mod reassembly;
pub mod ring;

/// The version of the native core, reported by `sparseety --version`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

pub mod bpe;
pub mod cadence;
pub mod hist;
pub mod http1;
pub mod ids;
pub mod ndjson;
pub mod openai;
pub mod pretok;
pub mod pyjson;
pub mod redact;
pub mod sse;
pub mod tokens;

#[cfg(test)]
mod tests {
    #[test]
    fn version_is_set() {
        assert!(!super::VERSION.is_empty());
    }
}
