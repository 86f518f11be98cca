//! The redaction step's usual look-behind window, decided in one pass
//! (`sniffer.record.redact._clean_cut`, the reference): whether the built-in
//! patterns' pre-checks find nothing in a choice's new text and, then, which
//! held chunks the window decides. The recording chain runs it every ~64
//! characters of every streamed choice; the reference costs a join, a dozen
//! substring tests, a translation and the chunks' running lengths in Python.
//!
//! Only a sure "nothing" is answered here: text that is not ASCII, or in
//! which a pre-check finds something, gets None and the caller takes the
//! reference (its own pre-checks, then the regexes). So this pass may find
//! more than the reference's pre-checks (a dotted run the reference's regex
//! then rejects), never less.

/// Whether `Redactor._builtins_may_edit` may say yes for the ASCII text `s`
/// (false: it surely says no). `enabled`: personal-data redaction on (the
/// "@", digit and dotted tests); the secret prefixes are looked for always.
///
/// The reference's tests, each as a look at the bytes from one position:
/// "@"; six digits in a row, or three, a space or dash, three (`_digit_run`'s
/// `000000` and `000 000` on the text with digits made "0" and dashes
/// spaces); "+" and a digit; "." then one to three digits then "." (the
/// dotted quad's first group, before the reference's regex); and the
/// secret prefixes of `_maybe_secret`: `sk-`, `xox`, `eyJ`, `A[GIKNRS]`,
/// `gh[pousr]_`, `github_pat_`, `bearer` in any ASCII case.
pub fn may_edit_ascii(s: &[u8], enabled: bool) -> bool {
    let mut run = 0usize; // digits in a row ending just before the current byte
    for (i, &b) in s.iter().enumerate() {
        match MARKS[usize::from(b)] {
            DIGIT => {
                run = run.saturating_add(1);
                if enabled && run >= 6 {
                    return true;
                }
            }
            LOOK => {
                if look(s, i, b, run, enabled) {
                    return true;
                }
                run = 0;
            }
            _ => run = 0, // (most bytes of prose)
        }
    }
    false
}

const PLAIN: u8 = 0;
const DIGIT: u8 = 1;
const LOOK: u8 = 2;

/// Per byte: a digit, a byte where a pre-check's find may start ([`look`]),
/// or neither.
static MARKS: [u8; 256] = {
    let mut m = [PLAIN; 256];
    let mut d = b'0';
    while d <= b'9' {
        m[d as usize] = DIGIT;
        d += 1;
    }
    let looks = b"@ -+.sxeAgbB";
    let mut i = 0;
    while i < looks.len() {
        m[looks[i] as usize] = LOOK;
        i += 1;
    }
    m
};

/// Whether a pre-check finds something starting at `s[i]` (`b`, a [`LOOK`]
/// byte), `run` digits before it.
#[inline]
fn look(s: &[u8], i: usize, b: u8, run: usize, enabled: bool) -> bool {
    let next = i.saturating_add(1);
    match b {
        b'@' => enabled,
        b' ' | b'-' => enabled && run >= 3 && digits_at(s, next) >= 3,
        b'+' => enabled && digits_at(s, next) >= 1,
        b'.' => enabled && dotted(s, next),
        b's' => at(s, i, b"sk-"),
        b'x' => at(s, i, b"xox"),
        b'e' => at(s, i, b"eyJ"),
        b'A' => matches!(s.get(next), Some(b'G' | b'I' | b'K' | b'N' | b'R' | b'S')),
        b'g' => {
            at(s, i, b"github_pat_")
                || (at(s, i, b"gh")
                    && matches!(
                        s.get(i.saturating_add(2)),
                        Some(b'p' | b'o' | b'u' | b's' | b'r')
                    )
                    && s.get(i.saturating_add(3)) == Some(&b'_'))
        }
        b'b' | b'B' => s
            .get(i..i.saturating_add(6))
            .is_some_and(|w| w.eq_ignore_ascii_case(b"bearer")),
        _ => false,
    }
}

/// Whether `s` holds one to three digits then "." from `i` on.
fn dotted(s: &[u8], i: usize) -> bool {
    for (k, &c) in s.get(i..).unwrap_or_default().iter().take(4).enumerate() {
        if c == b'.' {
            return k > 0;
        }
        if !c.is_ascii_digit() {
            return false;
        }
    }
    false
}

/// Whether `s` holds `needle` at `i`.
fn at(s: &[u8], i: usize, needle: &[u8]) -> bool {
    s.get(i..).is_some_and(|rest| rest.starts_with(needle))
}

/// How many ASCII digits `s` holds from `i` on (up to 4: all a caller needs).
fn digits_at(s: &[u8], i: usize) -> usize {
    s.get(i..)
        .unwrap_or_default()
        .iter()
        .take(4)
        .take_while(|c| c.is_ascii_digit())
        .count()
}

/// The look at one window ([`clean_cut`]), its chunk texts given one by one
/// ([`CutScan::push`], in order) so that a caller need not keep them.
pub struct CutScan {
    start: usize,
    /// None: a negative cut (no chunk ends by it)
    cut: Option<usize>,
    /// chunks decided whatever their end (`len - max_held`)
    forced: usize,
    /// chunks pushed so far
    n: usize,
    /// every chunk pushed so far is decided
    deciding: bool,
    k: usize,
    limit: usize,
    end: usize,
    /// the window's text from `start` on (ASCII: characters are bytes)
    tail: Vec<u8>,
}

impl CutScan {
    /// A window of `len` chunk texts; `start`, `cut` and `max_held` as in
    /// [`clean_cut`].
    pub fn new(len: usize, start: i64, cut: i64, max_held: usize) -> Self {
        CutScan {
            start: usize::try_from(start).unwrap_or(0),
            cut: usize::try_from(cut).ok(),
            forced: len.saturating_sub(max_held),
            n: 0,
            deciding: true,
            k: 0,
            limit: 0,
            end: 0,
            tail: Vec::with_capacity(256),
        }
    }

    /// Whether a chunk text of `len` characters, the next, reaches into the
    /// window from `start` (else [`CutScan::push_len`] is all it needs).
    pub fn reaches(&self, len: usize) -> bool {
        self.end.saturating_add(len) > self.start
    }

    /// The next chunk text; false when it is not ASCII (the answer is None).
    pub fn push(&mut self, t: &str) -> bool {
        if !t.is_ascii() {
            return false;
        }
        if self.reaches(t.len()) {
            let skip = self.start.saturating_sub(self.end);
            self.tail
                .extend_from_slice(t.as_bytes().get(skip..).unwrap_or_default());
        }
        self.push_len(t.len());
        true
    }

    /// The next chunk text by its length in characters alone, one that does
    /// not reach into the window from `start` ([`CutScan::reaches`]).
    pub fn push_len(&mut self, len: usize) {
        self.end = self.end.saturating_add(len);
        // Decided: the chunks forced out, and those ending by the cut (each
        // a prefix of the chunks: the ends only grow).
        if self.deciding {
            if self.n < self.forced || self.cut.is_some_and(|c| self.end <= c) {
                self.k = self.n.saturating_add(1);
                self.limit = self.end;
            } else {
                self.deciding = false;
            }
        }
        self.n = self.n.saturating_add(1);
    }

    /// `(k, limit)`, or None when the window from `start` may hold an edit.
    pub fn finish(&self, enabled: bool) -> Option<(usize, usize)> {
        (!may_edit_ascii(&self.tail, enabled)).then_some((self.k, self.limit))
    }
}

/// `(k, limit)` for a text window whose held chunk texts are `texts`, when
/// nothing the built-in patterns need is in the window from character
/// `start` on ([`may_edit_ascii`]; a negative `start` is the window's
/// start): the number of leading chunks whose end is at most `cut`
/// characters into the window, at least `texts.len() - max_held`, and where
/// the last of them ends (0 when none). None: a text is not ASCII, or a
/// pre-check found something (the caller then takes the reference). (The
/// binding gives the texts before `start` by their length alone, and so
/// answers for them whatever their characters.)
pub fn clean_cut(
    texts: &[&str],
    start: i64,
    cut: i64,
    max_held: usize,
    enabled: bool,
) -> Option<(usize, usize)> {
    let mut scan = CutScan::new(texts.len(), start, cut, max_held);
    for t in texts {
        if !scan.push(t) {
            return None;
        }
    }
    scan.finish(enabled)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_text_needs_no_look() {
        assert!(!may_edit_ascii(
            b"w12.34 w12.35 the 2024-01-15 price 12,345",
            true
        ));
        assert!(!may_edit_ascii(b"", true));
        assert!(!may_edit_ascii(b"as k- a box of eye", true));
    }

    #[test]
    fn what_a_pattern_needs_is_found() {
        for s in [
            &b"mail a@b.cn"[..],
            b"tel 138123",
            b"x 123 456",
            b"x 123-456",
            b"+8",
            b"ip 1.22.3",
            b"w.123.",
        ] {
            assert!(may_edit_ascii(s, true), "{}", String::from_utf8_lossy(s));
            assert!(!may_edit_ascii(s, false), "{}", String::from_utf8_lossy(s));
        }
        for s in [
            &b"key sk-x"[..],
            b"xoxb",
            b"eyJhb",
            b"AKIA",
            b"AIza",
            b"ghp_",
            b"gho_",
            b"github_pat_",
            b"auth: BeArEr t",
        ] {
            assert!(may_edit_ascii(s, true), "{}", String::from_utf8_lossy(s));
            assert!(may_edit_ascii(s, false), "{}", String::from_utf8_lossy(s));
        }
        assert!(!may_edit_ascii(
            b"12 345 67.1234.5 ghx_ github_ A B bear",
            true
        ));
    }

    #[test]
    fn the_cut_decides_whole_chunks() {
        let texts = ["abcd", "efgh", "ijkl"];
        assert_eq!(clean_cut(&texts, 0, 8, 256, true), Some((2, 8)));
        assert_eq!(clean_cut(&texts, 0, 7, 256, true), Some((1, 4)));
        assert_eq!(clean_cut(&texts, 0, 3, 256, true), Some((0, 0)));
        assert_eq!(clean_cut(&texts, 0, -5, 256, true), Some((0, 0)));
        assert_eq!(clean_cut(&texts, 0, -5, 1, true), Some((2, 8)));
        assert_eq!(clean_cut(&texts, 0, 100, 256, true), Some((3, 12)));
    }

    #[test]
    fn only_the_window_from_start_is_looked_at() {
        let texts = ["a@b", "cd", "efg"];
        assert_eq!(clean_cut(&texts, 0, 0, 256, true), None);
        assert_eq!(clean_cut(&texts, 1, 0, 256, true), None);
        assert_eq!(clean_cut(&texts, 2, 0, 256, true), Some((0, 0)));
        assert_eq!(clean_cut(&texts, 3, 3, 256, true), Some((1, 3)));
        // a value straddling two chunks is seen whole
        assert_eq!(clean_cut(&["x 123", "456 y"], 0, 0, 256, true), None);
        assert_eq!(clean_cut(&["w12.34 ", "é"], 0, 0, 256, true), None);
    }

    #[test]
    fn texts_before_the_window_count_by_their_length() {
        let mut scan = CutScan::new(3, 2, 5, 256);
        assert!(!scan.reaches(2));
        scan.push_len(2); // "日本": two characters, looked at before
        assert!(scan.reaches(3));
        assert!(scan.push("abc"));
        assert!(scan.push("def"));
        assert_eq!(scan.finish(true), Some((2, 5)));
        let mut scan = CutScan::new(2, 1, 5, 256);
        assert!(scan.push("ab"));
        assert!(!scan.push("é"));
        let mut scan = CutScan::new(2, 1, 5, 256);
        assert!(scan.push("a@"));
        assert_eq!(scan.finish(true), None);
        assert_eq!(scan.finish(false), Some((1, 2)));
    }
}
