//! The token pass's per-chunk attribution of one choice
//! (`sniffer.llm.tokens._attribute_counts`, the reference, and its
//! `_attribute_counts_walk`): which tokens of the full text's encoding go to
//! each chunk (piece), and which straddle a piece boundary. Each token goes
//! to the piece holding its first character; a token whose end lies past the
//! end of that piece straddles. Pure: integers in, integers out.

use std::collections::BTreeMap;

/// A straddling token: (token index, chunk it starts in, chunk it ends in).
pub type Straddle = (i64, i64, i64);

/// The first index `i >= lo` with `values[i] >= x` (Python's
/// `bisect_left(values, x, lo)`).
fn bisect_left(values: &[i64], x: i64, lo: usize) -> usize {
    let tail = values.get(lo..).unwrap_or_default();
    lo.saturating_add(tail.partition_point(|&v| v < x))
}

/// `bisect_left(values, x, lo)` searched outwards from `lo` (1, 2, 4, ...
/// places on, then bisected): a few steps when the answer is near `lo`, as
/// the next cut of a choice's pieces and tokens is.
fn gallop(values: &[i64], x: i64, lo: usize) -> usize {
    let tail = values.get(lo..).unwrap_or_default();
    let mut step = 1usize;
    let mut below = 0usize; // tail[..below] are all < x
    while let Some(&v) = tail.get(step.saturating_sub(1)) {
        if v >= x {
            break;
        }
        below = step;
        step = step.saturating_mul(2);
    }
    let upto = step.min(tail.len());
    let window = tail.get(below..upto).unwrap_or_default();
    lo.saturating_add(below)
        .saturating_add(window.partition_point(|&v| v < x))
}

/// An index or count as the `i64` Python sees (slices are far below `i64::MAX`).
fn int(i: usize) -> i64 {
    i64::try_from(i).unwrap_or(i64::MAX)
}

/// Tokens attributed to each piece (given by its length) of a text whose
/// encoding has `n_ids` tokens at `offsets` ((start, end) character offsets),
/// and the straddling tokens (token index, piece it starts in, piece it ends
/// in). Token starts in order: the tokens of a piece are a slice, cut where
/// the starts reach the piece's end; otherwise token by token, as the
/// reference does. Sums saturate (character offsets are far below `i64::MAX`).
pub fn attribute(lens: &[i64], n_ids: i64, offsets: &[(i64, i64)]) -> (Vec<i64>, Vec<Straddle>) {
    let Some(last) = lens.len().checked_sub(1) else {
        return (Vec::new(), Vec::new());
    };
    let ends: Vec<i64> = lens
        .iter()
        .scan(0i64, |acc, &l| {
            *acc = acc.saturating_add(l);
            Some(*acc)
        })
        .collect();
    let starts: Vec<i64> = offsets.iter().map(|o| o.0).collect();
    if starts.windows(2).any(|w| w[0] > w[1]) {
        return walk(offsets, &ends, last);
    }
    // the cut after piece j < last: the first token starting at or past its
    // end; both run forward, so each is searched from the one before it
    let mut his: Vec<usize> = Vec::with_capacity(last);
    let mut from = 0usize;
    let mut before = i64::MIN;
    for &e in ends.iter().take(last) {
        // (lengths are never negative: the ends never go back)
        from = gallop(&starts, e, if e >= before { from } else { 0 });
        before = e;
        his.push(from);
    }
    let mut counts = Vec::with_capacity(lens.len());
    let mut prev = 0i64;
    for &h in &his {
        counts.push(int(h).saturating_sub(prev));
        prev = int(h);
    }
    counts.push(n_ids.saturating_sub(prev));
    let mut straddles = Vec::new();
    if last == 0 || n_ids == 0 {
        return (counts, straddles);
    }
    for (j, (&h, (&count, &end))) in his.iter().zip(counts.iter().zip(&ends)).enumerate() {
        // piece j's last token (k) ends past the piece
        let Some(k) = h.checked_sub(1) else { continue };
        let Some(&(_, tail)) = offsets.get(k) else {
            continue;
        };
        if count != 0 && tail > end {
            let end_piece = gallop(&ends, tail, j).min(last);
            straddles.push((int(k), int(j), int(end_piece)));
        }
    }
    (counts, straddles)
}

/// `attribute` of tokens that tile the text in order, given by their ends
/// (token k spans `ends[k - 1]..ends[k]`, the first from 0): what the token
/// pass knows of an ASCII text's tokens from their bytes
/// (`sniffer.llm.tokens._attribute_tiled`).
pub fn attribute_tiled(lens: &[i64], ends: &[i64]) -> (Vec<i64>, Vec<Straddle>) {
    let mut start = 0i64;
    let offsets: Vec<(i64, i64)> = ends
        .iter()
        .map(|&end| {
            let token = (start, end);
            start = end;
            token
        })
        .collect();
    attribute(lens, int(ends.len()), &offsets)
}

/// `_attribute_counts_walk`: token by token (for starts out of order);
/// `last` is the index of the last piece.
fn walk(offsets: &[(i64, i64)], ends: &[i64], last: usize) -> (Vec<i64>, Vec<Straddle>) {
    let mut counts = vec![0i64; ends.len()];
    let mut straddles = Vec::new();
    let mut j = 0usize;
    for (k, &(start, end)) in offsets.iter().enumerate() {
        while j < last && ends.get(j).is_some_and(|&e| e <= start) {
            j = j.saturating_add(1);
        }
        if let Some(c) = counts.get_mut(j) {
            *c = c.saturating_add(1);
        }
        if j < last && ends.get(j).is_some_and(|&e| end > e) {
            let end_piece = bisect_left(ends, end, 0).min(last);
            straddles.push((int(k), int(j), int(end_piece)));
        }
    }
    (counts, straddles)
}

/// What the token pass keeps of one choice's attribution
/// (`sniffer.llm.tokens._choice_summary`, the reference): tokens per piece,
/// straddling tokens per piece (by the piece they start in), how many
/// straddle, the first `limit` of them as `straddle` anomalies (token index,
/// detail), and the distribution of the counts (tokens → pieces with that
/// many, by tokens).
#[derive(Debug, PartialEq, Eq)]
pub struct Summary {
    pub counts: Vec<i64>,
    pub straddle_counts: Vec<i64>,
    pub straddles: i64,
    pub listed: Vec<i64>,
    pub details: Vec<String>,
    pub histogram: BTreeMap<i64, i64>,
}

/// `n` in decimal at the end of `out` (what `format!` writes).
fn push_int(out: &mut String, n: i64) {
    if n < 0 {
        out.push('-');
    }
    let mut digits = [0u8; 20];
    let mut v = n.unsigned_abs();
    let mut len = 0usize;
    loop {
        if let Some(slot) = digits.get_mut(len) {
            *slot = b'0'.saturating_add(u8::try_from(v % 10).unwrap_or_default());
        }
        len = len.saturating_add(1);
        v /= 10;
        if v == 0 {
            break;
        }
    }
    for &b in digits.iter().take(len).rev() {
        out.push(char::from(b));
    }
}

/// `Summary` of an attribution (`counts`, `straddles`) of pieces whose seqs
/// are `seqs`, the tokens' character offsets given by `offset_of`.
fn summarize(
    counts: Vec<i64>,
    straddles: &[Straddle],
    seqs: &[i64],
    offset_of: impl Fn(usize) -> (i64, i64),
    limit: usize,
) -> Summary {
    let mut straddle_counts = vec![0i64; counts.len()];
    for &(_, first, _) in straddles {
        if let Some(c) = usize::try_from(first)
            .ok()
            .and_then(|j| straddle_counts.get_mut(j))
        {
            *c = c.saturating_add(1);
        }
    }
    let seq_at = |j: i64| {
        usize::try_from(j)
            .ok()
            .and_then(|j| seqs.get(j))
            .copied()
            .unwrap_or_default()
    };
    let mut listed = Vec::new();
    let mut details = Vec::new();
    for &(k, first, end_piece) in straddles.iter().take(limit) {
        let (s0, e0) = usize::try_from(k).map(&offset_of).unwrap_or_default();
        listed.push(k);
        // by hand: `format!` costs ~2k instructions a detail, 32 per choice
        let mut d = String::with_capacity(64);
        d.push_str("chars ");
        push_int(&mut d, s0);
        d.push('-');
        push_int(&mut d, e0);
        d.push_str(" span chunk_index ");
        push_int(&mut d, first.saturating_add(1));
        d.push_str("..");
        push_int(&mut d, end_piece.saturating_add(1));
        d.push_str(" (seq ");
        push_int(&mut d, seq_at(first));
        d.push_str("..");
        push_int(&mut d, seq_at(end_piece));
        d.push(')');
        details.push(d);
    }
    let mut histogram = BTreeMap::new();
    for &n in &counts {
        let m: &mut i64 = histogram.entry(n).or_default();
        *m = m.saturating_add(1);
    }
    Summary {
        counts,
        straddle_counts,
        straddles: int(straddles.len()),
        listed,
        details,
        histogram,
    }
}

/// `attribute` and its `Summary` (`sniffer.llm.tokens._choice_summary`).
pub fn summary(
    lens: &[i64],
    seqs: &[i64],
    n_ids: i64,
    offsets: &[(i64, i64)],
    limit: usize,
) -> Summary {
    let (counts, straddles) = attribute(lens, n_ids, offsets);
    let offset_of = |k: usize| offsets.get(k).copied().unwrap_or_default();
    summarize(counts, &straddles, seqs, offset_of, limit)
}

/// `attribute_tiled` and its `Summary`.
pub fn summary_tiled(lens: &[i64], seqs: &[i64], ends: &[i64], limit: usize) -> Summary {
    let (counts, straddles) = attribute_tiled(lens, ends);
    let offset_of = |k: usize| {
        let start = k
            .checked_sub(1)
            .and_then(|i| ends.get(i))
            .copied()
            .unwrap_or(0);
        (start, ends.get(k).copied().unwrap_or_default())
    };
    summarize(counts, &straddles, seqs, offset_of, limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_token_per_piece() {
        let (counts, straddles) = attribute(&[2, 3], 2, &[(0, 2), (2, 5)]);
        assert_eq!(counts, vec![1, 1]);
        assert!(straddles.is_empty());
    }

    #[test]
    fn a_token_over_three_pieces() {
        // "ab" "c" "de": one token over the first four characters
        let (counts, straddles) = attribute(&[2, 1, 2], 2, &[(0, 4), (4, 5)]);
        assert_eq!(counts, vec![1, 0, 1]);
        assert_eq!(straddles, vec![(0, 0, 2)]);
    }

    #[test]
    fn no_tokens() {
        let (counts, straddles) = attribute(&[1, 2], 0, &[]);
        assert_eq!(counts, vec![0, 0]);
        assert!(straddles.is_empty());
        assert_eq!(attribute(&[], 0, &[]), (vec![], vec![]));
    }

    #[test]
    fn tiled_tokens_are_their_offsets() {
        // "ab" "c" "de" as tokens "abcd" (0..4) and "e" (4..5)
        assert_eq!(
            attribute_tiled(&[2, 1, 2], &[4, 5]),
            attribute(&[2, 1, 2], 2, &[(0, 4), (4, 5)])
        );
        assert_eq!(attribute_tiled(&[2, 2], &[1, 2, 4]), (vec![2, 1], vec![]));
        assert_eq!(attribute_tiled(&[], &[]), (vec![], vec![]));
    }

    #[test]
    fn starts_out_of_order_walk() {
        // the walk never goes back: the second token counts in the second piece
        let (counts, straddles) = attribute(&[2, 2], 2, &[(2, 4), (0, 3)]);
        assert_eq!(counts, vec![0, 2]);
        assert!(straddles.is_empty());
        let (counts, straddles) = attribute(&[2, 2, 2], 2, &[(1, 5), (0, 1)]);
        assert_eq!(counts, vec![2, 0, 0]);
        assert_eq!(straddles, vec![(0, 0, 2)]);
    }

    #[test]
    fn push_int_is_format() {
        for n in [
            0,
            1,
            9,
            10,
            99,
            100,
            12_345,
            -1,
            -10,
            i64::MAX,
            i64::MIN,
            i64::MIN + 1,
        ] {
            let mut out = String::from("x");
            push_int(&mut out, n);
            assert_eq!(out, format!("x{n}"));
        }
    }

    #[test]
    fn gallop_is_bisect_left() {
        let values = [0, 1, 1, 3, 3, 3, 7, 8, 8, 20];
        for lo in 0..=values.len() {
            for x in -1..22 {
                assert_eq!(
                    gallop(&values, x, lo),
                    bisect_left(&values, x, lo),
                    "{x} {lo}"
                );
            }
        }
        assert_eq!(gallop(&[], 3, 0), 0);
        assert_eq!(gallop(&[1], 3, 5), 5);
    }

    #[test]
    fn summary_lists_the_first_straddles() {
        // "ab" "c" "de" (seqs 5, 6, 9): "abcd" straddles 0..2, "e" does not
        let s = summary(&[2, 1, 2], &[5, 6, 9], 2, &[(0, 4), (4, 5)], 32);
        assert_eq!(s.counts, vec![1, 0, 1]);
        assert_eq!(s.straddle_counts, vec![1, 0, 0]);
        assert_eq!(s.straddles, 1);
        assert_eq!(s.listed, vec![0]);
        assert_eq!(
            s.details,
            vec!["chars 0-4 span chunk_index 1..3 (seq 5..9)"]
        );
        assert_eq!(s.histogram, BTreeMap::from([(0, 1), (1, 2)]));
        assert_eq!(summary_tiled(&[2, 1, 2], &[5, 6, 9], &[4, 5], 32), s);
        // none listed past the limit, all counted
        let s = summary_tiled(&[1, 1, 1], &[1, 2, 3], &[2, 3], 0);
        assert_eq!((s.straddles, s.listed.len(), s.details.len()), (1, 0, 0));
        let s = summary_tiled(&[1, 1, 1], &[1, 2, 3], &[2, 3], 1);
        assert_eq!(
            s.details,
            vec!["chars 0-2 span chunk_index 1..2 (seq 1..2)"]
        );
        let s = summary_tiled(&[1, 1, 1, 1], &[1, 2, 3, 4], &[2, 4], 1);
        assert_eq!((s.straddles, s.listed.clone()), (2, vec![0]));
        assert_eq!(s.straddle_counts, vec![1, 0, 1, 0]);
    }
}
