//! Byte-level BPE of a `tokenizer.json` (DeepSeek's tokenizer), without the
//! tokenizers library: its vocabulary, merges and added tokens read here,
//! and a piece's ids found as the library's `BPE` model finds them.
//!
//! The library's `Word::merge_all` keeps a heap of candidate merges ordered
//! by (rank, position of the left symbol) and applies the least one that is
//! still valid, pushing the merges it makes possible; with no dropout that
//! is "merge the adjacent pair of lowest rank, leftmost on ties" until none
//! is left, which [`Bpe::encode`] does the same way (linked symbols and a
//! heap). A piece's symbols start as its bytes spelled in the byte-level
//! alphabet (GPT-2's: printable Latin-1 bytes stand for themselves, the
//! others get code points from U+0100 on, in byte order).
//!
//! [`Bpe::from_json`] refuses (an error, the caller loads the library which
//! reports its own) anything it does not read as the library does: unknown
//! keys, merges whose parts or result are not in the vocabulary, two
//! tokens with one id. The configuration it does not interpret (normalizer,
//! pre-tokenizer, decoder, …) is handed back as JSON ([`Bpe::config`]) for
//! the caller to check against what its fast path implements.

use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};

use serde::de::{Deserializer, MapAccess, Visitor};

use serde::Deserialize;
use serde_json::Value;

/// A multiply-rotate hasher (rustc's Fx): the tables hash the file's own
/// tokens and id pairs, ~5x cheaper than SipHash at load; lookups of
/// attacker-chosen keys cannot grow a table that is never written after load.
#[derive(Default, Clone, Copy)]
pub struct Fx(u64);

const FX_K: u64 = 0x517c_c1b7_2722_0a95;

impl Hasher for Fx {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
        for &b in chunks.remainder() {
            self.add(u64::from(b));
        }
    }
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

impl Fx {
    fn add(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(FX_K);
    }
}

type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<Fx>>;

/// A JSON object read as its entries in order (no table while parsing).
struct Entries<'a>(Vec<(Cow<'a, str>, u32)>);

impl<'de: 'a, 'a> Deserialize<'de> for Entries<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Entries<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of token to id")
            }
            fn visit_map<M: MapAccess<'de>>(self, mut m: M) -> Result<Self::Value, M::Error> {
                let mut out = Vec::with_capacity(m.size_hint().unwrap_or(0));
                while let Some((k, v)) = m.next_entry::<Cow<'de, str>, u32>()? {
                    out.push((k, v));
                }
                Ok(Entries(out))
            }
        }
        d.deserialize_map(V(std::marker::PhantomData))
    }
}

/// The character byte `b` is spelled with in a byte-level vocabulary.
pub fn byte_char(b: u8) -> char {
    let keep = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    if keep(b) {
        return char::from(b);
    }
    let extra = (0..b).filter(|&x| !keep(x)).count();
    char::from_u32(256u32.saturating_add(u32::try_from(extra).unwrap_or(0))).unwrap_or('\0')
}

/// The byte-level alphabet: code point → byte (its code points are < 324).
fn byte_of() -> [Option<u8>; 324] {
    let mut out = [None; 324];
    for b in 0..=255u8 {
        if let Some(slot) = out.get_mut(byte_char(b) as usize) {
            *slot = Some(b);
        }
    }
    out
}

/// Appends the bytes a token string spells to `out`; false (and a part
/// appended) when one of its characters is not in the byte-level alphabet.
fn spelled(token: &str, alphabet: &[Option<u8>; 324], out: &mut Vec<u8>) -> bool {
    for c in token.chars() {
        match alphabet.get(c as usize).copied().flatten() {
            Some(b) => out.push(b),
            None => return false,
        }
    }
    true
}

/// A merge: `"a b"` (the old format) or `["a", "b"]`. Read by hand:
/// serde's untagged enums buffer every value first (~2x the load).
enum Merge<'a> {
    Line(Cow<'a, str>),
    Pair((Cow<'a, str>, Cow<'a, str>)),
}

impl<'de: 'a, 'a> Deserialize<'de> for Merge<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Merge<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a merge: \"a b\" or [\"a\", \"b\"]")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Merge::Line(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Merge::Line(Cow::Owned(v.to_owned())))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Self::Value, A::Error> {
                use serde::de::Error;
                let a: Cow<'de, str> = seq
                    .next_element()?
                    .ok_or_else(|| A::Error::invalid_length(0, &self))?;
                let b: Cow<'de, str> = seq
                    .next_element()?
                    .ok_or_else(|| A::Error::invalid_length(1, &self))?;
                if seq.next_element::<serde::de::IgnoredAny>()?.is_some() {
                    return Err(A::Error::invalid_length(3, &self));
                }
                Ok(Merge::Pair((a, b)))
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Model<'a> {
    #[serde(rename = "type")]
    kind: Option<String>,
    dropout: Option<f64>,
    unk_token: Option<String>,
    continuing_subword_prefix: Option<String>,
    end_of_word_suffix: Option<String>,
    fuse_unk: Option<bool>,
    byte_fallback: Option<bool>,
    ignore_merges: Option<bool>,
    #[serde(borrow)]
    vocab: Entries<'a>,
    #[serde(borrow)]
    merges: Vec<Merge<'a>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // the flags are read to refuse a malformed entry, as the library does
struct Added {
    id: u32,
    content: String,
    single_word: bool,
    lstrip: bool,
    rstrip: bool,
    normalized: bool,
    special: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Doc<'a> {
    version: Option<Value>,
    truncation: Option<Value>,
    padding: Option<Value>,
    #[serde(default)]
    added_tokens: Vec<Added>,
    normalizer: Option<Value>,
    pre_tokenizer: Option<Value>,
    post_processor: Option<Value>,
    decoder: Option<Value>,
    #[serde(borrow)]
    model: Model<'a>,
}

/// A byte-level BPE model read from `tokenizer.json`.
pub struct Bpe {
    /// token string → id (the model's vocabulary)
    vocab: FxMap<Box<str>, u32>,
    /// id → its token string in `token_text` (the model's vocabulary; one
    /// buffer, not one allocation per token: the load's cost)
    tokens: Vec<Option<(u32, u32)>>,
    token_text: String,
    /// id → the bytes it spells in `byte_text` (None: not in the alphabet,
    /// or no such id)
    bytes: Vec<Option<(u32, u32)>>,
    byte_text: Vec<u8>,
    /// (left, right) → (rank, merged id)
    merges: FxMap<(u32, u32), (u32, u32)>,
    /// byte → id of its one-character token
    byte_ids: [Option<u32>; 256],
    /// added tokens: content → id, and id → content
    added: HashMap<Box<str>, u32>,
    added_ids: HashMap<u32, Box<str>>,
    /// the contents in file order
    added_list: Vec<(u32, Box<str>)>,
    config: String,
}

impl Bpe {
    /// Reads a `tokenizer.json` document; an error for anything this module
    /// does not read as the tokenizers library does.
    pub fn from_json(data: &[u8]) -> Result<Bpe, String> {
        let doc: Doc<'_> = serde_json::from_slice(data).map_err(|e| e.to_string())?;
        let m = doc.model;
        let config = serde_json::json!({
            "version": doc.version,
            "truncation": doc.truncation,
            "padding": doc.padding,
            "normalizer": doc.normalizer,
            "pre_tokenizer": doc.pre_tokenizer,
            "post_processor": doc.post_processor,
            "decoder": doc.decoder,
            "model": {
                "type": m.kind,
                "dropout": m.dropout,
                "unk_token": m.unk_token,
                "continuing_subword_prefix": m.continuing_subword_prefix,
                "end_of_word_suffix": m.end_of_word_suffix,
                "fuse_unk": m.fuse_unk,
                "byte_fallback": m.byte_fallback,
                "ignore_merges": m.ignore_merges,
            },
        })
        .to_string();
        let alphabet = byte_of();
        let entries = m.vocab.0;
        let size = entries.iter().map(|e| e.1).max().map_or(0, |i| {
            usize::try_from(i).unwrap_or(usize::MAX).saturating_add(1)
        });
        if size > entries.len().saturating_mul(2).saturating_add(1024) {
            return Err("vocabulary ids too sparse".into());
        }
        let mut tokens: Vec<Option<(u32, u32)>> = vec![None; size];
        let mut bytes: Vec<Option<(u32, u32)>> = vec![None; size];
        let mut token_text = String::with_capacity(data.len() / 4);
        let mut byte_text: Vec<u8> = Vec::with_capacity(data.len() / 8);
        let span = |start: usize, end: usize| -> Result<(u32, u32), String> {
            let s = u32::try_from(start).map_err(|e| e.to_string())?;
            let e = u32::try_from(end).map_err(|e| e.to_string())?;
            Ok((s, e))
        };
        let mut vocab: FxMap<Box<str>, u32> = FxMap::default();
        vocab.reserve(entries.len());
        for (token, id) in entries {
            let at = usize::try_from(id).map_err(|e| e.to_string())?;
            let slot = tokens.get_mut(at).ok_or("id out of range")?;
            if slot.is_some() {
                return Err(format!("two tokens with id {id}"));
            }
            let start = token_text.len();
            token_text.push_str(&token);
            *slot = Some(span(start, token_text.len())?);
            let start = byte_text.len();
            if spelled(&token, &alphabet, &mut byte_text) {
                if let Some(b) = bytes.get_mut(at) {
                    *b = Some(span(start, byte_text.len())?);
                }
            } else {
                byte_text.truncate(start);
            }
            if vocab.insert(Box::<str>::from(token.as_ref()), id).is_some() {
                return Err(format!("token {token:?} twice"));
            }
        }
        let mut merges: FxMap<(u32, u32), (u32, u32)> = FxMap::default();
        merges.reserve(m.merges.len());
        let mut joined = String::new();
        for (rank, merge) in m.merges.iter().enumerate() {
            let (a, b): (&str, &str) = match merge {
                Merge::Line(line) => {
                    let mut parts = line.split(' ');
                    match (parts.next(), parts.next(), parts.next()) {
                        (Some(a), Some(b), None) => (a, b),
                        _ => return Err(format!("merge {line:?} is not two tokens")),
                    }
                }
                Merge::Pair((a, b)) => (a.as_ref(), b.as_ref()),
            };
            let id = |t: &str| {
                vocab
                    .get(t)
                    .copied()
                    .ok_or_else(|| format!("{t:?} not in vocab"))
            };
            let (ia, ib) = (id(a)?, id(b)?);
            joined.clear();
            joined.push_str(a);
            joined.push_str(b);
            let new = id(&joined)?;
            let rank = u32::try_from(rank).map_err(|e| e.to_string())?;
            merges.insert((ia, ib), (rank, new)); // a repeated pair keeps its last rank
        }
        let mut byte_ids = [None; 256];
        for (b, slot) in (0..=255u8).zip(byte_ids.iter_mut()) {
            *slot = vocab.get(byte_char(b).to_string().as_str()).copied();
        }
        let mut added = HashMap::new();
        let mut added_ids = HashMap::new();
        let mut added_list = Vec::new();
        for t in doc.added_tokens {
            let content: Box<str> = t.content.into();
            added.insert(content.clone(), t.id);
            added_ids.insert(t.id, content.clone());
            added_list.push((t.id, content));
        }
        token_text.shrink_to_fit();
        byte_text.shrink_to_fit();
        Ok(Bpe {
            vocab,
            tokens,
            token_text,
            bytes,
            byte_text,
            merges,
            byte_ids,
            added,
            added_ids,
            added_list,
            config,
        })
    }

    /// The configuration besides the vocabulary, merges and added tokens, as
    /// JSON: the top-level components and the model's flags.
    pub fn config(&self) -> &str {
        &self.config
    }

    /// The added tokens (id, content) in file order.
    pub fn added(&self) -> &[(u32, Box<str>)] {
        &self.added_list
    }

    /// Whether `id` is an added token's.
    pub fn is_added(&self, id: u32) -> bool {
        self.added_ids.contains_key(&id)
    }

    /// How many distinct token strings the model's vocabulary and the added
    /// tokens hold (`get_vocab_size(with_added_tokens=True)`).
    pub fn vocab_size(&self) -> usize {
        let extra = self
            .added
            .keys()
            .filter(|c| !self.vocab.contains_key(*c))
            .count();
        self.vocab.len().saturating_add(extra)
    }

    /// The token string of `id`: an added token's content first, then the
    /// model's vocabulary (the library's order).
    pub fn id_to_token(&self, id: u32) -> Option<&str> {
        if let Some(c) = self.added_ids.get(&id) {
            return Some(c);
        }
        let (s, e) = (*self.tokens.get(usize::try_from(id).ok()?)?)?;
        self.token_text
            .get(usize::try_from(s).ok()?..usize::try_from(e).ok()?)
    }

    /// The id of a token string: an added token's first, then the model's.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.added
            .get(token)
            .or_else(|| self.vocab.get(token))
            .copied()
    }

    /// The bytes of a model token that is not an added token's id, or None.
    pub fn plain_bytes(&self, id: u32) -> Option<&[u8]> {
        if self.is_added(id) {
            return None;
        }
        let (s, e) = (*self.bytes.get(usize::try_from(id).ok()?)?)?;
        self.byte_text
            .get(usize::try_from(s).ok()?..usize::try_from(e).ok()?)
    }

    /// What the ByteLevel decoder gives for `ids` when each is a plain model
    /// token (its bytes joined, invalid UTF-8 replaced by U+FFFD); None when
    /// one is an added token, unknown, or not spelled in the alphabet.
    pub fn decode(&self, ids: &[u32]) -> Option<String> {
        let mut out = Vec::new();
        for &id in ids {
            out.extend_from_slice(self.plain_bytes(id)?);
        }
        Some(String::from_utf8_lossy(&out).into_owned())
    }

    /// The ids of one pre-token `piece` (its bytes), merged as the library's
    /// BPE model does; None when a byte has no token (the library would drop
    /// it or use UNK).
    pub fn encode(&self, piece: &[u8]) -> Option<Vec<u32>> {
        let mut ids: Vec<u32> = Vec::with_capacity(piece.len());
        for &b in piece {
            ids.push(self.byte_ids.get(usize::from(b)).copied().flatten()?);
        }
        let n = ids.len();
        if n < 2 {
            return Some(ids);
        }
        // linked symbols: prev/next indices (usize::MAX: none), len 0 = merged away
        let none = usize::MAX;
        let mut prev: Vec<usize> = (0..n).map(|i| i.checked_sub(1).unwrap_or(none)).collect();
        let mut next: Vec<usize> = (1..=n).map(|i| if i < n { i } else { none }).collect();
        let mut alive = vec![true; n];
        let mut heap: BinaryHeap<Reverse<(u32, usize, u32)>> = BinaryHeap::new();
        for (i, w) in ids.windows(2).enumerate() {
            if let Some(&(rank, new)) = self.merges.get(&(w[0], w[1])) {
                heap.push(Reverse((rank, i, new)));
            }
        }
        while let Some(Reverse((_, pos, new))) = heap.pop() {
            if !alive.get(pos).copied().unwrap_or(false) {
                continue;
            }
            let right = *next.get(pos)?;
            if right == none {
                continue;
            }
            let pair = (*ids.get(pos)?, *ids.get(right)?);
            if self.merges.get(&pair).is_none_or(|&(_, id)| id != new) {
                continue; // stale: a symbol changed since this was pushed
            }
            *ids.get_mut(pos)? = new;
            *alive.get_mut(right)? = false;
            let after = *next.get(right)?;
            *next.get_mut(pos)? = after;
            if after != none {
                *prev.get_mut(after)? = pos;
            }
            let before = *prev.get(pos)?;
            if before != none {
                if let Some(&(rank, id)) = self.merges.get(&(*ids.get(before)?, new)) {
                    heap.push(Reverse((rank, before, id)));
                }
            }
            if after != none {
                if let Some(&(rank, id)) = self.merges.get(&(new, *ids.get(after)?)) {
                    heap.push(Reverse((rank, pos, id)));
                }
            }
        }
        Some(
            ids.iter()
                .zip(&alive)
                .filter_map(|(&id, &a)| a.then_some(id))
                .collect(),
        )
    }

    /// A piece's ids and their token ends (byte offsets) when each token is
    /// a plain model token and their bytes joined are the piece's; None
    /// otherwise.
    pub fn encode_tiled(&self, piece: &[u8]) -> Option<(Vec<u32>, Vec<u32>)> {
        let ids = self.encode(piece)?;
        let mut ends = Vec::with_capacity(ids.len());
        let mut at = 0usize;
        for &id in &ids {
            let b = self.plain_bytes(id)?;
            let end = at.checked_add(b.len())?;
            if piece.get(at..end)? != b {
                return None;
            }
            at = end;
            ends.push(u32::try_from(end).ok()?);
        }
        (at == piece.len()).then_some((ids, ends))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny(merges: &str) -> Bpe {
        // bytes a, b, c and merges over them
        let doc = format!(
            r#"{{"version":"1.0","truncation":null,"padding":null,
            "added_tokens":[{{"id":9,"content":"<x>","single_word":false,"lstrip":false,
              "rstrip":false,"normalized":false,"special":true}}],
            "normalizer":null,"pre_tokenizer":null,"post_processor":null,"decoder":null,
            "model":{{"type":"BPE","dropout":null,"unk_token":null,
              "vocab":{{"a":0,"b":1,"c":2,"ab":3,"bc":4,"abc":5,"aa":6,"aaa":7,"Ġ":8}},
              "merges":{merges}}}}}"#
        );
        Bpe::from_json(doc.as_bytes()).expect("tiny tokenizer")
    }

    #[test]
    fn alphabet() {
        assert_eq!(byte_char(b'a'), 'a');
        assert_eq!(byte_char(b' '), 'Ġ');
        assert_eq!(byte_char(0), '\u{100}');
        assert_eq!(byte_char(0xAD), '\u{143}');
        let all: std::collections::HashSet<char> = (0..=255u8).map(byte_char).collect();
        assert_eq!(all.len(), 256);
    }

    #[test]
    fn lowest_rank_first_leftmost_on_ties() {
        let t = tiny(r#"["b c","a b"]"#);
        assert_eq!(t.encode(b"abc"), Some(vec![0, 4])); // b c first, then nothing
        let t = tiny(r#"["b c","a b","a bc"]"#);
        assert_eq!(t.encode(b"abc"), Some(vec![5]));
        let t = tiny(r#"[["a","b"],["b","c"],["ab","c"]]"#);
        assert_eq!(t.encode(b"abc"), Some(vec![5]));
        let t = tiny(r#"["a a","aa a"]"#);
        assert_eq!(t.encode(b"aaaa"), Some(vec![6, 6])); // leftmost pairs first
        assert_eq!(t.encode(b"aaa"), Some(vec![7]));
        assert_eq!(t.encode(b"d"), None); // no token for the byte
        assert_eq!(t.encode(b""), Some(vec![]));
    }

    #[test]
    fn lookups_and_decode() {
        let t = tiny(r#"["a b"]"#);
        assert_eq!(t.vocab_size(), 10);
        assert_eq!(t.token_to_id("<x>"), Some(9));
        assert_eq!(t.id_to_token(3), Some("ab"));
        assert_eq!(t.id_to_token(9), Some("<x>"));
        assert_eq!(t.id_to_token(99), None);
        assert_eq!(t.decode(&[3, 8, 2]).as_deref(), Some("ab c"));
        assert_eq!(t.decode(&[9]), None);
        assert_eq!(
            t.encode_tiled(b"ab c"),
            Some((vec![3, 8, 2], vec![2, 3, 4]))
        );
        assert_eq!(t.encode_tiled(b"abd"), None);
        assert_eq!(t.encode_tiled(b"abc"), Some((vec![3, 2], vec![2, 3])));
    }

    #[test]
    fn refuses_what_it_does_not_read() {
        let bad = [
            r#"{"model":{"vocab":{"a":0},"merges":["a b"]}}"#, // b not in vocab
            r#"{"model":{"vocab":{"a":0,"b":0},"merges":[]}}"#, // two tokens, one id
            r#"{"model":{"vocab":{},"merges":[],"x":1}}"#,     // unknown key
            r#"{"model":{"vocab":{"a":0},"merges":["a a a"]}}"#,
            r#"{"model":{"vocab":{"a":0},"merges":[]}, "other": 1}"#,
            r#"{"model":"#,
        ];
        for doc in bad {
            assert!(Bpe::from_json(doc.as_bytes()).is_err(), "{doc}");
        }
    }
}
