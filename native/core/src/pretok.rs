//! The token pass's fast path for DeepSeek's tokenizer on ASCII text: its
//! pre-tokenizer written out by hand, and a bounded cache of what the
//! tokenizers library made of each piece.
//!
//! The library encodes a text by cutting it into pre-tokens (pieces) and
//! running BPE on each piece on its own, so a text's ids are its pieces' ids
//! joined. Its pre-tokenizer (three `Split`s applied in sequence, each to
//! every piece the previous one produced, then `ByteLevel` which only maps
//! bytes) goes through Oniguruma regexes and offset bookkeeping that cost
//! several microseconds per short text; streamed LLM text repeats its pieces
//! heavily, so the fast path cuts the text itself ([`split_ascii`]) and asks
//! the library only for pieces it has not seen ([`PieceCache`]).
//!
//! The patterns, as the library applies them (`Isolated`: matches and the
//! gaps between them are both pieces; leftmost-first alternation):
//!
//! 1. `\p{N}{1,3}`
//! 2. `[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+` (never matches ASCII)
//! 3. `[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
//!
//! On ASCII the Unicode classes are: `\p{N}` the digits, `\p{L}` the
//! letters, `\p{P}` and `\p{S}` together the 32 punctuation characters,
//! `\p{M}` nothing, `\s` tab, LF, VT, FF, CR and space (White_Space: not the
//! separators 0x1c-0x1f). Pure: bytes in, offsets out.

use std::collections::HashMap;
use std::sync::Arc;

/// What an ASCII byte is to the patterns.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    Digit,
    Letter,
    /// `\p{P}` or `\p{S}`: the 32 ASCII punctuation characters
    Punct,
    /// `\r` or `\n` (also `\s`)
    Newline,
    /// `\s` other than `\r` and `\n`, space included
    Space,
    /// anything else: the control characters that are not `\s`
    Other,
}

/// Every byte's class ([`class_of`] ahead of time: the splitter asks it
/// of each byte, most more than once).
static CLASSES: [Class; 256] = {
    let mut table = [Class::Other; 256];
    let mut b = 0usize;
    while b < 256 {
        table[b] = class_of(b as u8);
        b += 1;
    }
    table
};

#[inline]
fn class(b: u8) -> Class {
    CLASSES[b as usize]
}

const fn class_of(b: u8) -> Class {
    match b {
        b'0'..=b'9' => Class::Digit,
        b'A'..=b'Z' | b'a'..=b'z' => Class::Letter,
        b'\r' | b'\n' => Class::Newline,
        b'\t' | 0x0b | 0x0c | b' ' => Class::Space,
        b'!'..=b'/' | b':'..=b'@' | b'['..=b'`' | b'{'..=b'~' => Class::Punct,
        _ => Class::Other,
    }
}

fn is_space(c: Class) -> bool {
    matches!(c, Class::Space | Class::Newline)
}

/// The end of the run of bytes from `i` whose class passes `keep`.
fn run(s: &[u8], i: usize, keep: impl Fn(Class) -> bool) -> usize {
    let tail = s.get(i..).unwrap_or_default();
    let n = tail
        .iter()
        .position(|&b| !keep(class(b)))
        .unwrap_or(tail.len());
    i.saturating_add(n)
}

fn class_at(s: &[u8], i: usize) -> Option<Class> {
    s.get(i).map(|&b| class(b))
}

/// The end of pattern 3's match starting at `i` of `s`, if one starts there
/// (`s` holds no digit: pattern 1 cut them out).
fn match_at(s: &[u8], i: usize) -> Option<usize> {
    let c = class_at(s, i)?;
    let next = class_at(s, i.saturating_add(1));
    let letters_after = |j: usize| run(s, j, |c| c == Class::Letter);
    // [punct][A-Za-z]+
    if c == Class::Punct && next == Some(Class::Letter) {
        return Some(letters_after(i.saturating_add(1)));
    }
    // [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+
    if matches!(c, Class::Space | Class::Other | Class::Digit) && next == Some(Class::Letter) {
        return Some(letters_after(i.saturating_add(1)));
    }
    if c == Class::Letter {
        return Some(letters_after(i));
    }
    // ' '?[\p{P}\p{S}]+[\r\n]*
    let punct_from = if c == Class::Punct {
        Some(i)
    } else if s.get(i) == Some(&b' ') && next == Some(Class::Punct) {
        Some(i.saturating_add(1))
    } else {
        None
    };
    if let Some(p) = punct_from {
        let e = run(s, p, |c| c == Class::Punct);
        return Some(run(s, e, |c| c == Class::Newline));
    }
    if !is_space(c) {
        return None;
    }
    // the whitespace run [i, j), j > i
    let j = run(s, i, is_space);
    // \s*[\r\n]+: \s* gives back down to the last newline of the run, and
    // [\r\n]+ takes that one (the next byte, if any, is not a newline)
    if let Some(k) = s
        .get(i..j)
        .and_then(|r| r.iter().rposition(|&b| class(b) == Class::Newline))
    {
        return Some(i.saturating_add(k).saturating_add(1));
    }
    // \s+(?!\S): the whole run at the end of the text, else all but its last
    if j == s.len() {
        return Some(j);
    }
    if j.saturating_sub(i) > 1 {
        return Some(j.saturating_sub(1));
    }
    // \s+
    Some(j)
}

/// Pattern 3's pieces of `s` (matches and the gaps between them, in order),
/// offset by `base`, appended to `ends` as their end offsets.
fn split_words(s: &[u8], base: usize, ends: &mut Vec<usize>) {
    let mut gap = 0usize; // start of the bytes no match took yet
    let mut i = 0usize;
    while i < s.len() {
        match match_at(s, i) {
            Some(e) => {
                if gap < i {
                    ends.push(base.saturating_add(i));
                }
                ends.push(base.saturating_add(e));
                i = e;
                gap = e;
            }
            None => i = i.saturating_add(1),
        }
    }
    if gap < s.len() {
        ends.push(base.saturating_add(s.len()));
    }
}

/// The end offsets of the pre-tokens of an ASCII text, in order (the last is
/// `text.len()`; none for an empty text): pattern 1 cuts digit runs into
/// threes, pattern 3 cuts each other piece.
pub fn split_ascii(text: &[u8], ends: &mut Vec<usize>) {
    let mut i = 0usize;
    while i < text.len() {
        if class_at(text, i) == Some(Class::Digit) {
            let e = run(text, i, |c| c == Class::Digit).min(i.saturating_add(3));
            ends.push(e);
            i = e;
        } else {
            let e = run(text, i, |c| c != Class::Digit);
            split_words(text.get(i..e).unwrap_or_default(), i, ends);
            i = e;
        }
    }
}

/// Whether `piece` pre-tokenizes to itself: then the library's encoding of
/// the piece alone is the BPE of the piece, its ids inside any text.
pub fn is_one_piece(piece: &[u8]) -> bool {
    let mut ends = Vec::new();
    split_ascii(piece, &mut ends);
    ends.len() == 1
}

/// Finds the added tokens' contents in a text (the library cuts them out
/// before pre-tokenizing: a text holding one is not for the fast path).
#[derive(Debug)]
pub struct AddedTokens {
    contents: std::collections::HashSet<Box<[u8]>>,
    lens: Vec<usize>,
    firsts: [bool; 256],
    /// the distinct first bytes, in order of first content
    starts: Vec<u8>,
}

impl AddedTokens {
    pub fn new<'a>(contents: impl IntoIterator<Item = &'a [u8]>) -> Self {
        let mut out = AddedTokens {
            contents: std::collections::HashSet::new(),
            lens: Vec::new(),
            firsts: [false; 256],
            starts: Vec::new(),
        };
        for c in contents {
            let Some(&first) = c.first() else { continue };
            if let Some(f) = out.firsts.get_mut(usize::from(first)) {
                if !*f {
                    out.starts.push(first);
                }
                *f = true;
            }
            if !out.lens.contains(&c.len()) {
                out.lens.push(c.len());
            }
            out.contents.insert(c.into());
        }
        out
    }

    /// Whether `text` holds one of the contents. With up to three distinct
    /// first bytes (DeepSeek's 1,283 added tokens start with `<` or 0xEF)
    /// the places to try are found by `memchr`, a few bytes a step.
    pub fn found_in(&self, text: &[u8]) -> bool {
        let at = |i: usize| {
            self.lens.iter().any(|&n| {
                i.checked_add(n)
                    .and_then(|e| text.get(i..e))
                    .is_some_and(|w| self.contents.contains(w))
            })
        };
        match *self.starts.as_slice() {
            [] => false,
            [a] => memchr::memchr_iter(a, text).any(at),
            [a, b] => memchr::memchr2_iter(a, b, text).any(at),
            [a, b, c] => memchr::memchr3_iter(a, b, c, text).any(at),
            _ => text
                .iter()
                .enumerate()
                .any(|(i, &b)| self.firsts.get(usize::from(b)).copied().unwrap_or(false) && at(i)),
        }
    }
}

/// A piece's encoding: its token ids and each token's end in the piece (in
/// bytes: ASCII, one character each).
#[derive(Debug, PartialEq, Eq)]
pub struct Encoded {
    pub ids: Box<[u32]>,
    pub ends: Box<[u32]>,
}

/// Pieces longer than this are not kept (encoded by the library each time).
pub const MAX_PIECE: usize = 64;
/// Pieces kept at most; the cache is emptied when full.
pub const MAX_ENTRIES: usize = 65_536;
/// Bytes kept at most, counted as the piece, 8 per id and 64 per entry (the
/// entry limit comes first for pieces of ordinary length).
pub const MAX_BYTES: usize = 8 << 20;

/// Piece → its encoding, bounded ([`MAX_ENTRIES`], [`MAX_BYTES`],
/// [`MAX_PIECE`]): a hostile stream of ever new pieces empties it now and then.
/// Pieces of one or two bytes (single punctuation, digits, letters, a space
/// and a letter: on digit-heavy text most of its pieces) sit in a table
/// indexed by their bytes ([`small_slot`]); the others in a hash map, whose
/// SipHash of every piece looked up was a third of the encode's
/// instructions on the live benchmark's text (attacker-chosen keys: a
/// cheaper hash would let a stream of colliding pieces slow every look-up).
#[derive(Debug, Default)]
pub struct PieceCache {
    map: HashMap<Box<[u8]>, Arc<Encoded>>,
    /// by [`small_slot`]; empty until the first small piece is kept
    small: Vec<Option<Arc<Encoded>>>,
    small_len: usize,
    bytes: usize,
    /// times the cache was emptied because it was full
    pub clears: u64,
}

/// Slots of [`PieceCache`]'s table: one per ASCII byte, one per pair.
const SMALL_SLOTS: usize = 128 + 128 * 128;

/// The table slot of a piece of one or two ASCII bytes (the fast path's
/// pieces are ASCII), None for any other piece.
fn small_slot(piece: &[u8]) -> Option<usize> {
    match *piece {
        [a] if a < 128 => Some(usize::from(a)),
        [a, b] if a < 128 && b < 128 => Some(
            usize::from(a)
                .saturating_mul(128)
                .saturating_add(usize::from(b))
                .saturating_add(128),
        ),
        _ => None,
    }
}

impl PieceCache {
    pub fn get(&self, piece: &[u8]) -> Option<&Arc<Encoded>> {
        match small_slot(piece) {
            Some(i) => self.small.get(i).and_then(Option::as_ref),
            None => self.map.get(piece),
        }
    }

    pub fn len(&self) -> usize {
        self.map.len().saturating_add(self.small_len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keeps `piece`'s encoding unless the piece is too long.
    pub fn insert(&mut self, piece: &[u8], enc: Arc<Encoded>) {
        if piece.len() > MAX_PIECE || self.get(piece).is_some() {
            return;
        }
        let size = piece
            .len()
            .saturating_add(enc.ids.len().saturating_mul(8))
            .saturating_add(64);
        if self.len() >= MAX_ENTRIES || self.bytes.saturating_add(size) > MAX_BYTES {
            self.map.clear();
            self.small = Vec::new();
            self.small_len = 0;
            self.bytes = 0;
            self.clears = self.clears.saturating_add(1);
        }
        self.bytes = self.bytes.saturating_add(size);
        match small_slot(piece) {
            Some(i) => {
                if self.small.is_empty() {
                    self.small = vec![None; SMALL_SLOTS];
                }
                if let Some(slot) = self.small.get_mut(i) {
                    *slot = Some(enc);
                    self.small_len = self.small_len.saturating_add(1);
                }
            }
            None => {
                self.map.insert(piece.into(), enc);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(text: &str) -> Vec<&str> {
        let mut ends = Vec::new();
        split_ascii(text.as_bytes(), &mut ends);
        let mut start = 0;
        ends.iter()
            .map(|&e| {
                let p = &text[start..e];
                start = e;
                p
            })
            .collect()
    }

    #[test]
    fn words_numbers_and_spaces() {
        // what the library's pre_tokenize_str gives
        assert_eq!(
            pieces("a  b\n\n x 12345"),
            ["a", " ", " b", "\n\n", " x", " ", "123", "45"]
        );
        assert_eq!(pieces("w12.34 "), ["w", "12", ".", "34", " "]);
        assert_eq!(pieces(""), Vec::<&str>::new());
    }

    #[test]
    fn punctuation() {
        assert_eq!(pieces("it's"), ["it", "'s"]);
        assert_eq!(pieces(" ...\n\nx"), [" ...\n\n", "x"]);
        assert_eq!(pieces("a, b!"), ["a", ",", " b", "!"]);
        assert_eq!(pieces(" (x)"), [" (", "x", ")"]);
    }

    #[test]
    fn whitespace_runs() {
        // \s*[\r\n]+ ends at the run's last newline
        assert_eq!(pieces(" \n \n  a"), [" \n \n", " ", " a"]);
        // \s+(?!\S): all but the last before a word; all of it at the end
        assert_eq!(pieces("a   b"), ["a", "  ", " b"]);
        assert_eq!(pieces("a   "), ["a", "   "]);
        // a single space before punctuation goes with it
        assert_eq!(pieces("a  ."), ["a", " ", " ."]);
        assert_eq!(pieces("\t."), ["\t", "."]);
    }

    #[test]
    fn control_characters() {
        // not \s: a gap, or the optional character before letters
        assert_eq!(pieces("\x01\x02"), ["\x01\x02"]);
        assert_eq!(pieces("\x01ab\x1f."), ["\x01ab", "\x1f", "."]);
        assert_eq!(pieces("1\x01a"), ["1", "\x01a"]);
    }

    #[test]
    fn one_piece() {
        assert!(is_one_piece(b" hello"));
        assert!(!is_one_piece(b"a b"));
        assert!(!is_one_piece(b""));
    }

    #[test]
    fn class_table_is_class_of() {
        for b in 0..=u8::MAX {
            assert!(class(b) == class_of(b), "{b}");
        }
    }

    #[test]
    fn added_tokens_found() {
        let added = AddedTokens::new([&b"<think>"[..], b"<|EOT|>", b""]);
        assert!(added.found_in(b"x <think> y"));
        assert!(added.found_in(b"<|EOT|>"));
        assert!(!added.found_in(b"<thin <|EOT"));
        assert!(!AddedTokens::new([]).found_in(b"<think>"));
        // one to four distinct first bytes: memchr's searches, then the byte walk
        let all: [&[u8]; 4] = [b"<a>", b"[b]", b"{c}", b"(d)"];
        for n in 1..=all.len() {
            let added = AddedTokens::new(all[..n].iter().copied());
            for (k, c) in all.iter().enumerate() {
                let text = [&b"x "[..], c, b" y"].concat();
                assert_eq!(added.found_in(&text), k < n, "{n} {k}");
                assert!(!added.found_in(&text[..text.len() - 3]));
            }
            assert!(added.found_in(b"<a<a>"));
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 2000, ..Default::default() })]

        /// The pieces tile the text, none empty, and each pre-tokenizes to
        /// itself (what lets the cache keep a piece's ids for any text).
        #[test]
        fn pieces_tile_and_stand_alone(
            text in proptest::collection::vec(proptest::sample::select(
                b"0123 \t\n\r\x0b\x0c\x00\x1f\x7fabZ.,'(<|>".to_vec()), 0..48),
        ) {
            let mut ends = Vec::new();
            split_ascii(&text, &mut ends);
            let mut start = 0usize;
            for &end in &ends {
                proptest::prop_assert!(start < end);
                proptest::prop_assert!(is_one_piece(&text[start..end]));
                start = end;
            }
            proptest::prop_assert_eq!(start, text.len());
        }
    }

    #[test]
    fn small_pieces_are_kept_like_the_others() {
        let mut cache = PieceCache::default();
        let enc = |id: u32, n: u32| {
            Arc::new(Encoded {
                ids: Box::new([id]),
                ends: Box::new([n]),
            })
        };
        // every piece of one and two ASCII bytes, and some longer ones
        let mut pieces: Vec<Vec<u8>> = (0..128u8).map(|a| vec![a]).collect();
        for a in 0..128u8 {
            pieces.extend((0..128u8).map(|b| vec![a, b]));
        }
        pieces.extend([
            b"abc".to_vec(),
            b" the".to_vec(),
            vec![0x80],
            vec![b'a', 0xff],
        ]);
        assert!(pieces.iter().all(|p| cache.get(p).is_none()));
        for (k, p) in pieces.iter().enumerate() {
            let n = u32::try_from(p.len()).unwrap();
            cache.insert(p, enc(u32::try_from(k).unwrap(), n));
        }
        assert_eq!(cache.len(), pieces.len());
        assert_eq!(cache.clears, 0);
        for (k, p) in pieces.iter().enumerate() {
            let got = cache.get(p).expect("kept");
            assert_eq!(got.ids[..], [u32::try_from(k).unwrap()], "{p:?}");
        }
        // kept once: a second insert changes nothing
        cache.insert(b"a", enc(7, 1));
        assert_eq!(cache.get(b"a").unwrap().ids[..], [u32::from(b'a')]);
        assert_eq!(cache.len(), pieces.len());
        assert!(cache.get(b"").is_none() && cache.get(b"abcd").is_none());
    }

    #[test]
    fn small_pieces_count_toward_the_bound() {
        let mut cache = PieceCache::default();
        let enc = Arc::new(Encoded {
            ids: Box::new([1]),
            ends: Box::new([1]),
        });
        for i in 0..MAX_ENTRIES {
            cache.insert(format!("x{i}").as_bytes(), enc.clone());
        }
        assert_eq!(cache.len(), MAX_ENTRIES);
        cache.insert(b"a", enc.clone()); // full: emptied first, small table too
        assert_eq!((cache.clears, cache.len()), (1, 1));
        assert!(cache.get(b"a").is_some() && cache.get(b"x1").is_none());
        cache.insert(b"b", enc.clone());
        cache.insert(b"x1", enc);
        assert_eq!(cache.len(), 3);
    }

    #[test]
    fn cache_is_bounded() {
        let mut cache = PieceCache::default();
        let enc = Arc::new(Encoded {
            ids: Box::new([1]),
            ends: Box::new([1]),
        });
        cache.insert(&[b'a'; MAX_PIECE + 1], enc.clone());
        assert!(cache.is_empty());
        for i in 0..=MAX_ENTRIES {
            cache.insert(format!("{i}").as_bytes(), enc.clone());
        }
        assert_eq!(cache.clears, 1);
        assert_eq!(cache.len(), 1);
        assert!(cache.get(format!("{MAX_ENTRIES}").as_bytes()).is_some());
    }
}
