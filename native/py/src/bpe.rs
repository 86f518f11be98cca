//! `BpeModel`: DeepSeek's byte-level BPE read from `tokenizer.json` without
//! the tokenizers library (`sparseety_core::bpe`), so that the token pass's
//! fast path (`PieceEncoder`) and the lookups the pass makes need not load
//! it (`sniffer.llm.tokens.LoadedTokenizer`, the library stays the
//! reference and the fallback).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyString};

use sparseety_core::bpe::Bpe;

/// A byte-level BPE model (vocabulary, merges, added tokens) read from a
/// `tokenizer.json`.
#[pyclass(frozen, module = "sniffer._native")]
pub struct BpeModel {
    bpe: Bpe,
}

#[pymethods]
impl BpeModel {
    /// Reads and parses `path` (the GIL is released meanwhile); ValueError
    /// (OSError for the read) for anything not read as the library would.
    #[staticmethod]
    fn from_file(py: Python<'_>, path: std::path::PathBuf) -> PyResult<BpeModel> {
        let bpe = py.detach(|| -> PyResult<Bpe> {
            let data = std::fs::read(&path)?;
            Bpe::from_json(&data).map_err(PyValueError::new_err)
        })?;
        Ok(BpeModel { bpe })
    }

    /// The top-level components and the model's flags, as JSON.
    #[getter]
    fn config(&self) -> &str {
        self.bpe.config()
    }

    /// The added tokens, `(id, content)` in file order.
    #[getter]
    fn added(&self) -> Vec<(u32, String)> {
        self.bpe
            .added()
            .iter()
            .map(|(i, c)| (*i, c.to_string()))
            .collect()
    }

    /// `get_vocab_size(with_added_tokens=True)` of the library.
    #[getter]
    fn vocab_size(&self) -> usize {
        self.bpe.vocab_size()
    }

    /// (an id outside u32 raises OverflowError, as the library's does)
    fn id_to_token(&self, id: u32) -> Option<&str> {
        self.bpe.id_to_token(id)
    }

    fn token_to_id(&self, token: &str) -> Option<u32> {
        self.bpe.token_to_id(token)
    }

    /// The text of `ids` when each is a plain model token (ByteLevel
    /// decoder), else None (the library decodes).
    fn decode(&self, ids: Vec<i64>) -> Option<String> {
        let ids: Vec<u32> = ids
            .into_iter()
            .map(u32::try_from)
            .collect::<Result<_, _>>()
            .ok()?;
        self.bpe.decode(&ids)
    }

    /// Ids of one pre-token (the model alone, no pre-tokenizer), or None.
    fn encode_piece(&self, piece: &str) -> Option<Vec<u32>> {
        self.bpe.encode(piece.as_bytes())
    }

    /// `PieceEncoder.encode`'s `learn`: per piece, `(ids, ends)` (ends in
    /// bytes, which are characters for the ASCII pieces it asks about) when
    /// its tokens are plain model tokens spelling it, else None.
    fn encode_pieces<'py>(
        &self,
        py: Python<'py>,
        pieces: &Bound<'py, PyList>,
    ) -> PyResult<Bound<'py, PyList>> {
        let out = PyList::empty(py);
        for item in pieces.iter() {
            let piece = item.cast::<PyString>()?;
            match piece
                .to_str()
                .ok()
                .and_then(|p| self.bpe.encode_tiled(p.as_bytes()))
            {
                Some(pair) => out.append(pair)?,
                None => out.append(py.None())?,
            }
        }
        Ok(out)
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<BpeModel>()?;
    Ok(())
}
