//! The token pass's per-chunk attribution of one choice
//! (`sniffer.llm.tokens._attribute_counts`, the reference, and its
//! `_attribute_counts_walk`): which tokens of the full text's encoding go to
//! each chunk (piece), and which straddle a piece boundary. Each token goes
//! to the piece holding its first character; a token whose end lies past the
//! end of that piece straddles. Pure: integers in, integers out.

/// A straddling token: (token index, chunk it starts in, chunk it ends in).
pub type Straddle = (i64, i64, i64);

/// The first index `i >= lo` with `values[i] >= x` (Python's
/// `bisect_left(values, x, lo)`).
fn bisect_left(values: &[i64], x: i64, lo: usize) -> usize {
    let tail = values.get(lo..).unwrap_or_default();
    lo.saturating_add(tail.partition_point(|&v| v < x))
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
    // the cut after piece j < last: the first token starting at or past its end
    let his: Vec<usize> = ends
        .iter()
        .take(last)
        .map(|&e| bisect_left(&starts, e, 0))
        .collect();
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
            let end_piece = bisect_left(&ends, tail, j).min(last);
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
}
