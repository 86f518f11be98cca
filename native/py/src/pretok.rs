//! `PieceEncoder`: the token pass's fast path for DeepSeek's tokenizer on
//! ASCII text (`sparseety_core::pretok`; the tokenizers library is the
//! reference, `sniffer.llm.tokens.LoadedTokenizer._encode_checked` the
//! caller). The text is cut into pre-tokens here; the ids of pieces not seen
//! yet come from the library through a Python callable, one batch per call.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};

use sparseety_core::pretok::{is_one_piece, split_ascii, AddedTokens, Encoded, PieceCache};

/// Where a piece's encoding is: kept, or the n-th piece asked of the library.
enum Slot {
    Kept(Arc<Encoded>),
    Asked(usize),
}

/// A text's pieces: (start, encoding), or None when the text is not for the
/// fast path.
type Plan = Option<Vec<(usize, Slot)>>;

/// DeepSeek's tokenizer's encode of ASCII texts that hold no added token,
/// from its pieces' encodings (kept in a bounded cache). The cache sits
/// behind a lock that is not held while the library encodes (it may let
/// another thread in).
#[pyclass(frozen, module = "sniffer._native")]
pub struct PieceEncoder {
    added: AddedTokens,
    cache: Mutex<PieceCache>,
}

impl PieceEncoder {
    fn cache(&self) -> MutexGuard<'_, PieceCache> {
        // the cache is whole between statements: a panic elsewhere leaves it usable
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The plan of one text; the pieces not kept are added to `asked`.
    fn plan(
        &self,
        text: &[u8],
        cache: &PieceCache,
        asked: &mut Vec<Box<[u8]>>,
        index: &mut HashMap<Box<[u8]>, usize>,
        ends: &mut Vec<usize>,
    ) -> Plan {
        if !text.is_ascii() || self.added.found_in(text) {
            return None;
        }
        ends.clear();
        split_ascii(text, ends);
        let mut slots = Vec::with_capacity(ends.len());
        let mut start = 0usize;
        for &end in ends.iter() {
            let piece = text.get(start..end)?;
            let slot = match cache.get(piece) {
                Some(enc) => Slot::Kept(Arc::clone(enc)),
                None => Slot::Asked(*index.entry(piece.into()).or_insert_with(|| {
                    asked.push(piece.into());
                    asked.len().saturating_sub(1)
                })),
            };
            slots.push((start, slot));
            start = end;
        }
        Some(slots)
    }
}

/// The library's answer for one piece, when it is usable: ids and token
/// ends that tile the piece, and the piece pre-tokenizes to itself (so its
/// ids alone are its ids in any text).
fn learned(piece: &[u8], got: &Bound<'_, PyAny>) -> PyResult<Option<Arc<Encoded>>> {
    if got.is_none() || !is_one_piece(piece) {
        return Ok(None);
    }
    let (ids, ends): (Vec<u32>, Vec<u32>) = got.extract()?;
    let tiles = ids.len() == ends.len()
        && ends.windows(2).all(|w| w[0] < w[1])
        && ends.first().is_some_and(|&e| e > 0)
        && ends
            .last()
            .is_some_and(|&e| usize::try_from(e).is_ok_and(|e| e == piece.len()));
    Ok(tiles.then(|| {
        Arc::new(Encoded {
            ids: ids.into(),
            ends: ends.into(),
        })
    }))
}

#[pymethods]
impl PieceEncoder {
    /// `added`: the contents of the tokenizer's added tokens.
    #[new]
    fn new(added: Vec<String>) -> Self {
        PieceEncoder {
            added: AddedTokens::new(added.iter().map(|s| s.as_bytes())),
            cache: Mutex::new(PieceCache::default()),
        }
    }

    /// Per text, `(ids, ends)` (a tuple of ids, an `array('q')` of token end
    /// offsets: no int object per token, `choice_summary_tiled` reads its
    /// buffer) or None when the text is not for the fast path (not ASCII, holds an
    /// added token, or a piece the library's answer does not fit). `learn`
    /// takes a list of pieces and returns, per piece, `(ids, ends)` of its
    /// encoding or None. With `ends` false, per text a list of its ids (or
    /// None): the prompts' ids, whose ends nothing reads.
    #[pyo3(signature = (texts, learn, ends = true))]
    fn encode<'py>(
        &self,
        py: Python<'py>,
        texts: &Bound<'py, PyList>,
        learn: &Bound<'py, PyAny>,
        ends: bool,
    ) -> PyResult<Bound<'py, PyList>> {
        let with_ends = ends;
        let mut asked: Vec<Box<[u8]>> = Vec::new();
        let mut plans: Vec<Plan> = Vec::with_capacity(texts.len());
        {
            let cache = self.cache();
            let mut index = HashMap::new();
            let mut ends = Vec::new();
            for item in texts.iter() {
                let text = item.cast::<PyString>()?;
                plans.push(match text.to_str() {
                    Ok(s) => self.plan(s.as_bytes(), &cache, &mut asked, &mut index, &mut ends),
                    Err(_) => None, // a lone surrogate: the library's way
                });
            }
        }
        let mut answers: Vec<Option<Arc<Encoded>>> = Vec::with_capacity(asked.len());
        if !asked.is_empty() {
            let pieces = asked
                .iter()
                .map(|p| std::str::from_utf8(p).map(|s| PyString::new(py, s)))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?;
            let got = learn.call1((PyList::new(py, pieces)?,))?;
            for (piece, g) in asked.iter().zip(got.try_iter()?) {
                answers.push(learned(piece, &g?)?);
            }
            if answers.len() != asked.len() {
                return Err(pyo3::exceptions::PyValueError::new_err(
                    "learn returned fewer answers than pieces",
                ));
            }
            let mut cache = self.cache();
            for (piece, enc) in asked.iter().zip(&answers) {
                if let Some(enc) = enc {
                    cache.insert(piece, Arc::clone(enc));
                }
            }
        }
        let out = PyList::empty(py);
        let array = if with_ends {
            Some(py.import("array")?.getattr("array")?)
        } else {
            None
        };
        let mut ids: Vec<u32> = Vec::new();
        let mut ends: Vec<u8> = Vec::new(); // the ends as `array('q')` holds them
        for plan in plans {
            ids.clear();
            ends.clear();
            let whole = plan.is_some_and(|slots| {
                slots.iter().all(|(start, slot)| {
                    let enc = match slot {
                        Slot::Kept(enc) => Some(enc),
                        Slot::Asked(n) => answers.get(*n).and_then(Option::as_ref),
                    };
                    enc.is_some_and(|enc| {
                        ids.extend_from_slice(&enc.ids);
                        if !with_ends {
                            return true;
                        }
                        let start = i64::try_from(*start).unwrap_or(i64::MAX);
                        for &e in enc.ends.iter() {
                            let end = start.saturating_add(i64::from(e));
                            ends.extend_from_slice(&end.to_ne_bytes());
                        }
                        true
                    })
                })
            });
            if !whole {
                out.append(py.None())?;
            } else if let Some(array) = &array {
                let ends = array.call1(("q", PyBytes::new(py, &ends)))?;
                out.append((PyTuple::new(py, &ids)?, ends))?;
            } else {
                out.append(PyList::new(py, &ids)?)?;
            }
        }
        Ok(out)
    }

    /// Pieces kept now.
    #[getter]
    fn size(&self) -> usize {
        self.cache().len()
    }

    /// Times the cache was emptied because it was full.
    #[getter]
    fn clears(&self) -> u64 {
        self.cache().clears
    }
}

/// The end offsets of an ASCII text's pre-tokens (`split_ascii`), for the
/// tests that hold the matcher against the library's pre-tokenizer; None
/// for a text that is not ASCII.
#[pyfunction]
#[pyo3(name = "split_ascii")]
fn split_ascii_py(text: &str) -> Option<Vec<usize>> {
    if !text.is_ascii() {
        return None;
    }
    let mut ends = Vec::new();
    split_ascii(text.as_bytes(), &mut ends);
    Some(ends)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PieceEncoder>()?;
    m.add_function(wrap_pyfunction!(split_ascii_py, m)?)?;
    Ok(())
}
