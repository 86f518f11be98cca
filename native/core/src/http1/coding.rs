//! Content-Encoding (gzip, x-gzip, deflate), undone incrementally and capped.
//! A port of `sniffer/core/coding.py` (zlib through flate2's zlib-rs backend,
//! with CPython's `decompressobj.decompress(data, max_length)` loop and its
//! error texts).

use flate2::{Decompress, FlushDecompress, Status};

use super::head::Headers;
use super::text::{format_g, latin1, lower_latin1, py_str_repr_latin1, strip_latin1_ws};

pub const MAX_DECODED_BYTES: u64 = 32 << 20;
pub const MAX_EXPANSION_RATIO: f64 = 100.0;
pub const RATIO_FLOOR: u64 = 1 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    Gzip,
    XGzip,
    Deflate,
}

impl Coding {
    pub fn name(self) -> &'static str {
        match self {
            Coding::Gzip => "gzip",
            Coding::XGzip => "x-gzip",
            Coding::Deflate => "deflate",
        }
    }
}

/// Why decoding stopped: the text of Python's `zlib.error` (or `DecodeLimit`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError {
    pub message: String,
    pub limit: bool,
}

pub struct BodyDecoder {
    pub coding: Coding,
    d: Decompress,
    max_bytes: u64,
    max_ratio: f64,
    n_in: u64,
    n_out: u64,
    started: bool,
    raw_fallback: bool,
    eof: bool,
}

impl std::fmt::Debug for BodyDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BodyDecoder")
            .field("coding", &self.coding)
            .finish()
    }
}

fn zlib_message(e: &flate2::DecompressError) -> String {
    if e.needs_dictionary().is_some() {
        return "Error 2 while decompressing data".into();
    }
    match e.message() {
        Some(m) => format!("Error -3 while decompressing data: {m}"),
        None => "Error -3 while decompressing data: invalid input data".into(),
    }
}

impl BodyDecoder {
    pub fn new(coding: Coding, max_bytes: u64, max_ratio: f64) -> Self {
        let d = match coding {
            Coding::Gzip | Coding::XGzip => Decompress::new_gzip(15),
            Coding::Deflate => Decompress::new(true),
        };
        BodyDecoder {
            coding,
            d,
            max_bytes,
            max_ratio,
            n_in: 0,
            n_out: 0,
            started: false,
            raw_fallback: coding == Coding::Deflate,
            eof: false,
        }
    }

    fn allowed(&self) -> i128 {
        // int(n_in * max_ratio), as Python computes it (a float product, truncated)
        let by_ratio_f = (self.n_in as f64) * self.max_ratio;
        let by_ratio = if by_ratio_f.is_finite() {
            by_ratio_f as i128
        } else {
            i128::MAX
        };
        let by_ratio = by_ratio.max(i128::from(RATIO_FLOOR));
        by_ratio
            .min(i128::from(self.max_bytes))
            .saturating_sub(i128::from(self.n_out))
    }

    fn limit(&self) -> DecodeError {
        let message = if self.n_out >= self.max_bytes {
            format!("decoded body over the cap of {} bytes", self.max_bytes)
        } else {
            format!(
                "body expands more than {}:1 ({} encoded bytes gave {}); decoding stopped",
                format_g(self.max_ratio),
                self.n_in,
                self.n_out
            )
        };
        DecodeError {
            message,
            limit: true,
        }
    }

    /// `decompress(data, allowed)`: inflate until the input is used up, the
    /// stream ends or `allowed` bytes came out (the rest of the input is then
    /// the "unconsumed tail": a cap was hit).
    fn run(&mut self, data: &[u8]) -> Result<Vec<u8>, DecodeError> {
        let allowed = self.allowed();
        if allowed <= 0 {
            return Err(self.limit());
        }
        let allowed = usize::try_from(allowed).unwrap_or(usize::MAX);
        let mut out: Vec<u8> = Vec::new();
        let mut pos = 0usize;
        if !self.eof {
            let mut chunk = vec![0u8; allowed.min(data.len().saturating_mul(4).max(16384))];
            loop {
                let room = allowed.saturating_sub(out.len()).min(chunk.len());
                if room == 0 {
                    break;
                }
                let (before_in, before_out) = (self.d.total_in(), self.d.total_out());
                let input = data.get(pos..).unwrap_or(&[]);
                let st = self
                    .d
                    .decompress(input, &mut chunk[..room], FlushDecompress::Sync)
                    .map_err(|e| DecodeError {
                        message: zlib_message(&e),
                        limit: false,
                    })?;
                let used =
                    usize::try_from(self.d.total_in().saturating_sub(before_in)).unwrap_or(0);
                let made =
                    usize::try_from(self.d.total_out().saturating_sub(before_out)).unwrap_or(0);
                pos = pos.saturating_add(used);
                out.extend_from_slice(chunk.get(..made).unwrap_or(&[]));
                if st == Status::StreamEnd {
                    self.eof = true;
                    break;
                }
                if made < room {
                    break; // inflate stopped short of filling the output: input used up
                }
            }
        }
        self.n_out = self.n_out.saturating_add(out.len() as u64);
        if !self.eof && pos < data.len() {
            return Err(self.limit());
        }
        Ok(out)
    }

    pub fn feed(&mut self, data: &[u8]) -> Result<Vec<u8>, DecodeError> {
        self.n_in = self.n_in.saturating_add(data.len() as u64);
        if !self.started && self.raw_fallback {
            self.started = true;
            return match self.run(data) {
                Err(e) if !e.limit => {
                    // Raw deflate without the zlib header: common in the wild.
                    self.d = Decompress::new(false);
                    self.eof = false;
                    self.n_out = 0;
                    self.run(data)
                }
                r => r,
            };
        }
        self.started = true;
        self.run(data)
    }

    pub fn flush(&mut self) -> Vec<u8> {
        let allowed = self.allowed();
        if allowed <= 0 || self.eof {
            return Vec::new();
        }
        let cap = usize::try_from(allowed).unwrap_or(usize::MAX).min(1 << 16);
        let mut out = Vec::with_capacity(cap);
        match self
            .d
            .decompress_vec(&[], &mut out, FlushDecompress::Finish)
        {
            Ok(_) => out,
            Err(_) => Vec::new(),
        }
    }
}

/// The body decoder a message's Content-Encoding asks for, or an error text.
pub fn decoder_for(
    headers: &Headers,
    max_bytes: u64,
    max_ratio: f64,
) -> (Option<BodyDecoder>, Option<String>) {
    let mut codings: Vec<Vec<u8>> = Vec::new();
    for (name, value) in headers {
        if name == b"content-encoding" {
            for c in value.split(|&b| b == b',') {
                let c = strip_latin1_ws(c);
                if !c.is_empty() {
                    codings.push(lower_latin1(c));
                }
            }
        }
    }
    codings.retain(|c| c != b"identity");
    if codings.is_empty() {
        return (None, None);
    }
    if codings.len() == 1 {
        let coding = match codings[0].as_slice() {
            b"gzip" => Some(Coding::Gzip),
            b"x-gzip" => Some(Coding::XGzip),
            b"deflate" => Some(Coding::Deflate),
            _ => None,
        };
        if let Some(c) = coding {
            return (Some(BodyDecoder::new(c, max_bytes, max_ratio)), None);
        }
    }
    let joined: Vec<String> = codings.iter().map(|c| latin1(c)).collect();
    (
        None,
        Some(format!(
            "unsupported content-encoding {}",
            py_str_repr_latin1(&joined.join(", "))
        )),
    )
}
