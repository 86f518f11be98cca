//! `attribute_counts`: the token pass's per-chunk attribution of one choice
//! (`sniffer.llm.tokens._attribute_counts`, the reference, and its
//! `_attribute_counts_walk`): which tokens of the full text's encoding go to
//! each chunk, and which straddle a chunk boundary. In Python it is a dozen
//! passes over the chunks and the tokens (~200k instructions for a stream of
//! 60 chunks); here one pass over each, after reading the offsets.

use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

/// A straddling token: (token index, chunk it starts in, chunk it ends in).
type Straddle = (i64, i64, i64);

/// The first index `i >= lo` with `values[i] >= x` (Python's
/// `bisect_left(values, x, lo)`).
fn bisect_left(values: &[i64], x: i64, lo: usize) -> usize {
    lo + values[lo..].partition_point(|&v| v < x)
}

/// Tokens attributed to each piece (given by its length) of a text whose
/// encoding has `n_ids` tokens at `offsets` ((start, end) character offsets),
/// and the straddling tokens (token index, piece it starts in, piece it ends
/// in): `_attribute_counts`. A list of lengths and a list of 2-tuples are read
/// item by item (the tokenizer's offsets, the analysis's lists); any other
/// sequences through the generic conversion.
#[pyfunction]
fn attribute_counts(
    lens: &Bound<'_, PyAny>,
    n_ids: i64,
    offsets: &Bound<'_, PyAny>,
) -> PyResult<(Vec<i64>, Vec<Straddle>)> {
    let lens: Vec<i64> = match lens.cast::<PyList>() {
        Ok(list) => {
            let mut out = Vec::with_capacity(list.len());
            for x in list.iter() {
                out.push(x.extract()?);
            }
            out
        }
        Err(_) => lens.extract()?,
    };
    let offsets: Vec<(i64, i64)> = match offsets.cast::<PyList>() {
        Ok(list) => {
            let mut out = Vec::with_capacity(list.len());
            for o in list.iter() {
                out.push(match o.cast::<PyTuple>() {
                    Ok(t) if t.len() == 2 => (
                        t.get_borrowed_item(0)?.extract()?,
                        t.get_borrowed_item(1)?.extract()?,
                    ),
                    _ => o.extract()?,
                });
            }
            out
        }
        Err(_) => offsets.extract()?,
    };
    Ok(attribute(&lens, n_ids, &offsets))
}

fn attribute(lens: &[i64], n_ids: i64, offsets: &[(i64, i64)]) -> (Vec<i64>, Vec<Straddle>) {
    let n = lens.len();
    if n == 0 {
        return (Vec::new(), Vec::new());
    }
    let ends: Vec<i64> = lens
        .iter()
        .scan(0i64, |acc, &l| {
            *acc += l;
            Some(*acc)
        })
        .collect();
    let starts: Vec<i64> = offsets.iter().map(|o| o.0).collect();
    if starts.windows(2).any(|w| w[0] > w[1]) {
        return walk(offsets, &ends);
    }
    let last = n - 1;
    // the cut after piece j < last: the first token starting at or past its end
    let his: Vec<usize> = ends[..last].iter().map(|&e| bisect_left(&starts, e, 0)).collect();
    let mut counts = Vec::with_capacity(n);
    let mut prev = 0i64;
    for &h in &his {
        counts.push(h as i64 - prev);
        prev = h as i64;
    }
    counts.push(n_ids - prev);
    let mut straddles = Vec::new();
    if last == 0 || n_ids == 0 {
        return (counts, straddles);
    }
    for (j, &h) in his.iter().enumerate() {
        // piece j's last token ends past the piece
        if counts[j] != 0 && h >= 1 {
            let k = h - 1;
            let tail = offsets[k].1;
            if tail > ends[j] {
                let end_piece = bisect_left(&ends, tail, j).min(last);
                straddles.push((k as i64, j as i64, end_piece as i64));
            }
        }
    }
    (counts, straddles)
}

/// `_attribute_counts_walk`: token by token (for starts out of order).
fn walk(offsets: &[(i64, i64)], ends: &[i64]) -> (Vec<i64>, Vec<Straddle>) {
    let n = ends.len();
    let last = n - 1;
    let mut counts = vec![0i64; n];
    let mut straddles = Vec::new();
    let mut j = 0usize;
    for (k, &(start, end)) in offsets.iter().enumerate() {
        while j < last && ends[j] <= start {
            j += 1;
        }
        counts[j] += 1;
        if end > ends[j] && j < last {
            let end_piece = bisect_left(ends, end, 0).min(last);
            straddles.push((k as i64, j as i64, end_piece as i64));
        }
    }
    (counts, straddles)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(attribute_counts, m)?)?;
    Ok(())
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
