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
///
/// The tokens' starts are their ends shifted by one, so when they run
/// forward (as tiling tokens' do) and no piece is of negative length, the
/// pieces and the tokens are merged in one pass, no offsets built; else
/// `attribute` of the offsets, the same values.
pub fn attribute_tiled(lens: &[i64], ends: &[i64]) -> (Vec<i64>, Vec<Straddle>) {
    let backwards = ends.first().is_some_and(|&e| e < 0) || ends.windows(2).any(|w| w[0] > w[1]);
    if backwards || lens.iter().any(|&l| l < 0) {
        let mut start = 0i64;
        let offsets: Vec<(i64, i64)> = ends
            .iter()
            .map(|&end| {
                let token = (start, end);
                start = end;
                token
            })
            .collect();
        return attribute(lens, int(ends.len()), &offsets);
    }
    merge_tiled(lens, ends)
}

/// `attribute_tiled` of tokens whose ends run forward, pieces of lengths
/// `>= 0`: piece j's cut (`his[j]` in `attribute`) is the count of tokens
/// starting before the piece's end, found by walking the tokens forward
/// once for all the pieces.
fn merge_tiled(lens: &[i64], ends: &[i64]) -> (Vec<i64>, Vec<Straddle>) {
    let Some(last) = lens.len().checked_sub(1) else {
        return (Vec::new(), Vec::new());
    };
    let mut piece_ends: Vec<i64> = Vec::with_capacity(lens.len());
    let mut acc = 0i64;
    for &l in lens {
        acc = acc.saturating_add(l);
        piece_ends.push(acc);
    }
    let mut counts = Vec::with_capacity(lens.len());
    // (at most one per piece but the last: sized once, no regrowth)
    let mut straddles = Vec::with_capacity(last);
    let mut tokens = ends.iter();
    let mut k = 0usize; // tokens starting before the current piece's end
    let mut next_start = 0i64; // where token k starts: ends[k - 1], 0 for the first
    let mut prev = 0usize;
    for (j, &e) in piece_ends.iter().enumerate().take(last) {
        while next_start < e {
            let Some(&end) = tokens.next() else { break };
            next_start = end;
            k = k.saturating_add(1);
        }
        let count = k.saturating_sub(prev);
        counts.push(int(count));
        prev = k;
        // piece j's last token (k - 1, which ends where token k starts) ends past the piece
        if count != 0 && next_start > e {
            let end_piece = gallop(&piece_ends, next_start, j).min(last);
            straddles.push((int(k.saturating_sub(1)), int(j), int(end_piece)));
        }
    }
    counts.push(int(ends.len().saturating_sub(prev)));
    (counts, straddles)
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
/// many, by tokens: (tokens, pieces) in increasing order of tokens).
#[derive(Debug, PartialEq, Eq)]
pub struct Summary {
    pub counts: Vec<i64>,
    pub straddle_counts: Vec<i64>,
    pub straddles: i64,
    pub listed: Vec<i64>,
    pub details: Vec<String>,
    pub histogram: Vec<(i64, i64)>,
}

/// Counts of at most this many tokens are tallied in an array
/// ([`histogram`]): a chunk carries a few tokens.
const FEW_TOKENS: usize = 16;

/// `counts`' values → how many times each comes, in increasing order of
/// value: the usual small values tallied in an array, any other in a map.
fn histogram(counts: &[i64]) -> Vec<(i64, i64)> {
    let mut few = [0i64; FEW_TOKENS];
    let mut other: BTreeMap<i64, i64> = BTreeMap::new();
    for &n in counts {
        match usize::try_from(n).ok().and_then(|i| few.get_mut(i)) {
            Some(m) => *m = m.saturating_add(1),
            None => {
                let m = other.entry(n).or_default();
                *m = m.saturating_add(1);
            }
        }
    }
    let mut out: Vec<(i64, i64)> = other.range(..0).map(|(&n, &m)| (n, m)).collect();
    out.extend(
        few.iter()
            .enumerate()
            .filter(|&(_, &m)| m != 0)
            .map(|(n, &m)| (int(n), m)),
    );
    out.extend(other.range(int(FEW_TOKENS)..).map(|(&n, &m)| (n, m)));
    out
}

/// `n` in decimal at the end of `out` (what `format!` writes; `itoa`: two
/// digits a step, a detail holds six numbers and a choice up to 32 details).
fn push_int(out: &mut String, n: i64) {
    out.push_str(itoa::Buffer::new().format(n));
}

/// `Summary` of an attribution (`counts`, `straddles`) of pieces whose seqs
/// are given by `seq_at` (asked only of the listed straddles' pieces), the
/// tokens' character offsets by `offset_of`.
fn summarize(
    counts: Vec<i64>,
    straddles: &[Straddle],
    mut seq_at: impl FnMut(usize) -> i64,
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
    let mut seq_of = |j: i64| usize::try_from(j).map(&mut seq_at).unwrap_or_default();
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
        push_int(&mut d, seq_of(first));
        d.push_str("..");
        push_int(&mut d, seq_of(end_piece));
        d.push(')');
        details.push(d);
    }
    let histogram = histogram(&counts);
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
    summarize(counts, &straddles, seq_in(seqs), offset_of, limit)
}

/// The seq of piece `j` in `seqs` (0 past its end).
fn seq_in(seqs: &[i64]) -> impl FnMut(usize) -> i64 + '_ {
    |j| seqs.get(j).copied().unwrap_or_default()
}

/// `attribute_tiled` and its `Summary`.
pub fn summary_tiled(lens: &[i64], seqs: &[i64], ends: &[i64], limit: usize) -> Summary {
    summary_tiled_by(lens, ends, limit, seq_in(seqs))
}

/// `summary_tiled` with the pieces' seqs given by `seq_at` (the bindings
/// read only the few the listed straddles name).
pub fn summary_tiled_by(
    lens: &[i64],
    ends: &[i64],
    limit: usize,
    seq_at: impl FnMut(usize) -> i64,
) -> Summary {
    let (counts, straddles) = attribute_tiled(lens, ends);
    let offset_of = |k: usize| {
        let start = k
            .checked_sub(1)
            .and_then(|i| ends.get(i))
            .copied()
            .unwrap_or(0);
        (start, ends.get(k).copied().unwrap_or_default())
    };
    summarize(counts, &straddles, seq_at, offset_of, limit)
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
        assert_eq!(s.histogram, vec![(0, 1), (1, 2)]);
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

    #[test]
    fn histogram_is_sorted_tally() {
        assert_eq!(histogram(&[]), vec![]);
        assert_eq!(
            histogram(&[3, 0, 3, 1, 40, -2, 15, 16, 40, 0]),
            vec![(-2, 1), (0, 2), (1, 1), (3, 2), (15, 1), (16, 1), (40, 2)]
        );
    }

    /// `attribute` of the tiling tokens' offsets: the reference of the merge.
    fn tiled_by_offsets(lens: &[i64], ends: &[i64]) -> (Vec<i64>, Vec<Straddle>) {
        let starts = std::iter::once(0).chain(ends.iter().copied());
        let offsets: Vec<(i64, i64)> = starts.zip(ends.iter().copied()).collect();
        attribute(lens, int(ends.len()), &offsets)
    }

    #[test]
    fn merge_edges() {
        for (lens, ends) in [
            (vec![0, 0, 3], vec![1, 3]),
            (vec![3, 0, 0], vec![1, 3]),
            (vec![1, 1, 1], vec![]),
            (vec![2, 2], vec![4]),
            (vec![2, 2], vec![1, 9]),
            (vec![1, 2], vec![-1, 3]),
            (vec![1, -1, 2], vec![1, 2]),
            (vec![2, 2], vec![3, 1]),
            (vec![5], vec![1, 2, 5]),
        ] {
            assert_eq!(
                attribute_tiled(&lens, &ends),
                tiled_by_offsets(&lens, &ends),
                "{lens:?} {ends:?}"
            );
        }
    }

    proptest::proptest! {
        #[test]
        fn merge_is_attribute(
            lens in proptest::collection::vec(0i64..6, 0..30),
            steps in proptest::collection::vec(0i64..7, 0..40),
        ) {
            // tiling tokens: their ends run forward (a step of 0: an empty token)
            let ends: Vec<i64> = steps
                .iter()
                .scan(0i64, |acc, &d| {
                    *acc = acc.saturating_add(d);
                    Some(*acc)
                })
                .collect();
            proptest::prop_assert_eq!(attribute_tiled(&lens, &ends), tiled_by_offsets(&lens, &ends));
        }
    }
}
