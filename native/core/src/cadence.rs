//! The split of one output's gaps in two classes (`sniffer.llm.cadence._classes`,
//! the reference): what the live metrics classify every streamed output by at
//! its close (`cadence_class`). The class itself (the thresholds) stays in
//! Python; this is the arithmetic, ~50 µs per 100-chunk output there (a
//! `math.log` and a loop iteration per gap).
//!
//! Float for float the reference's values: the same operations in the same
//! order on IEEE doubles, the logarithm and the power from the C library
//! CPython's `math.log` and `**` call (`ln` and `powf` with an exponent the
//! compiler cannot see, so that `x ** 2` is not rewritten as `x * x`).

use std::hint::black_box;

/// `(k, short_p50, long_p50)` of the gaps between consecutive `times` (a
/// negative gap counts as 0), or None when there are fewer than two gaps or
/// a gap is not finite (the reference's path for an infinite gap compares
/// NaN widths as tuples; it stays the only one). `k` is how many sorted gaps
/// fall in the short class (Otsu's split of their logarithms, gaps below
/// `floor` counted as `floor`, moved to the widest stretch between the two
/// classes' medians, the one nearest the Otsu split among equals, then the
/// first); the medians are of the gaps as they are.
pub fn split(times: &[f64], floor: f64) -> Option<(usize, f64, f64)> {
    let gaps = sorted_gaps(times)?;
    let logs: Vec<f64> = gaps
        .iter()
        .map(|&g| if floor > g { floor } else { g }.ln())
        .collect();
    let best_k = otsu(&logs)?;
    let k = widest(&logs, best_k)?;
    let short = gaps.get(..k)?;
    let long = gaps.get(k..)?;
    Some((k, median(short)?, median(long)?))
}

/// The gaps between consecutive `times` (a negative one counts as 0),
/// sorted; None with fewer than two or one that is not finite.
///
/// Sorted as their bits: every gap is +0.0 or above (never -0.0 nor NaN),
/// where the order of the bits as integers is the order of the values and
/// equal bits are equal values: the reference's sorted gaps, ~3x fewer
/// instructions than `sort_by(f64::total_cmp)`.
fn sorted_gaps(times: &[f64]) -> Option<Vec<f64>> {
    let mut bits: Vec<u64> = times
        .windows(2)
        .map(|w| {
            let d = w[1] - w[0];
            if d > 0.0 {
                d.to_bits()
            } else {
                0.0f64.to_bits()
            }
        })
        .collect();
    if bits.len() < 2 || bits.iter().any(|&g| !f64::from_bits(g).is_finite()) {
        return None;
    }
    bits.sort_unstable();
    Some(bits.into_iter().map(f64::from_bits).collect())
}

/// `sum(logs)`: left to right from the first (Python's `sum` of floats).
fn total(logs: &[f64]) -> f64 {
    let mut it = logs.iter();
    let mut acc = it.next().copied().unwrap_or(0.0);
    for &l in it {
        acc += l;
    }
    acc
}

/// The first `k` (1 <= k < n) of largest `k * (n - k) * (mean_a - mean_b) ** 2`
/// (the reference's loop; its sum is finite here).
///
/// CPython's `** 2` is the C library's `pow`, ~125 instructions a call (a third
/// of the split of a 100-chunk output): it is called only for the `k` whose
/// value, with the square taken as `d * d`, comes within `NEAR` of the largest
/// such value. The two squares differ by a few ulps (relative, or absolute
/// below the normal range), far less than `NEAR`: every other `k`'s exact value
/// is below the largest one's, and among the candidates, in order, the
/// reference's test picks the same first largest.
fn otsu(logs: &[f64]) -> Option<usize> {
    let n = logs.len();
    let total = total(logs);
    if !total.is_finite() {
        return None;
    }
    // every k's weight k * (n - k) and |mean_a - mean_b|, as the reference has them
    let mut terms: Vec<(f64, f64)> = Vec::with_capacity(n);
    let mut top = 0.0f64;
    let mut prefix = 0.0f64;
    for k in 1..n {
        prefix += *logs.get(k.checked_sub(1)?)?;
        let rest = n.checked_sub(k)?;
        let mean_a = prefix / k as f64;
        let mean_b = (total - prefix) / rest as f64;
        let d = (mean_a - mean_b).abs();
        let weight = k.checked_mul(rest)? as f64;
        let near = weight * (d * d);
        if near > top {
            top = near;
        }
        terms.push((weight, d));
    }
    let floor = if top.is_finite() {
        top - (top * NEAR + TINY)
    } else {
        f64::NEG_INFINITY // (not with finite logs; then every k is exact)
    };
    let two = black_box(2.0f64);
    let mut best_k = 1usize;
    let mut best = -1.0f64;
    for (i, &(weight, d)) in terms.iter().enumerate() {
        if weight * (d * d) < floor {
            continue;
        }
        // CPython's float ** 2: pow(|d|, 2.0), 0.0 for d == 0
        let square = if d == 0.0 { 0.0 } else { d.powf(two) };
        let between = weight * square;
        if between > best {
            best_k = i.checked_add(1)?;
            best = between;
        }
    }
    Some(best_k)
}

/// How far below the largest approximate value (relative, then absolute) a
/// `k` is still computed exactly in `otsu`: ~4,500 times the ulps the
/// approximation may be off by (relative 2^-52 a product), and far above the
/// absolute error of products below the normal range (2^-1074 times weights
/// of at most ~10^12).
const NEAR: f64 = 1e-12;
const TINY: f64 = 1e-300;

/// The split moved to the widest stretch between the two classes' medians
/// (the reference's `widths`, `max`, `index` and its tie rule).
fn widest(logs: &[f64], best_k: usize) -> Option<usize> {
    let n = logs.len();
    let lo = best_k.checked_sub(1)? / 2;
    let hi = best_k.checked_add(n.checked_sub(best_k)? / 2)?;
    let upper = logs.get(lo.checked_add(1)?..hi.checked_add(1)?)?;
    let lower = logs.get(lo..hi)?;
    let widths: Vec<f64> = upper.iter().zip(lower).map(|(a, b)| a - b).collect();
    let mut widest = *widths.first()?;
    for &w in &widths {
        if w > widest {
            widest = w;
        }
    }
    let first = lo.checked_add(1)?;
    let mut k: Option<usize> = None;
    let mut nearest = usize::MAX;
    for (i, &w) in widths.iter().enumerate() {
        if w == widest {
            let at = first.checked_add(i)?;
            let distance = at.abs_diff(best_k);
            if distance < nearest {
                nearest = distance;
                k = Some(at);
            }
        }
    }
    k
}

/// `statistics.median` of sorted values (None when empty).
fn median(ordered: &[f64]) -> Option<f64> {
    let n = ordered.len();
    let mid = n / 2;
    if n % 2 == 1 {
        return ordered.get(mid).copied();
    }
    let a = *ordered.get(mid.checked_sub(1)?)?;
    let b = *ordered.get(mid)?;
    Some((a + b) / 2.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn too_few_or_infinite_gaps_have_no_split() {
        assert_eq!(split(&[], 1e-5), None);
        assert_eq!(split(&[1.0, 2.0], 1e-5), None);
        assert_eq!(split(&[1.0, 2.0, f64::INFINITY], 1e-5), None);
    }

    #[test]
    fn two_modes_split_between_them() {
        // bursts of three 1 ms gaps, 500 ms apart
        let mut times = vec![0.0f64];
        for i in 0..30 {
            let gap = if i % 4 == 3 { 0.5 } else { 0.001 };
            let last = *times.last().unwrap_or(&0.0);
            times.push(last + gap);
        }
        let (k, short, long) = split(&times, 1e-5).unwrap_or((0, 0.0, 0.0));
        assert_eq!(k, 23);
        assert!((short - 0.001).abs() < 1e-9, "{short}");
        assert!((long - 0.5).abs() < 1e-9, "{long}");
    }

    #[test]
    fn equal_widths_take_the_nearest_to_the_otsu_split() {
        // sorted logs 0, 1, 2, 3 (equal widths): the reference picks k = 2
        let logs = [0.0, 1.0, 2.0, 3.0];
        assert_eq!(otsu(&logs), Some(2));
        assert_eq!(widest(&logs, 2), Some(2));
    }

    /// The reference's loop, `pow` for every k (what `otsu` must give).
    fn otsu_every_pow(logs: &[f64]) -> Option<usize> {
        let n = logs.len();
        let total = total(logs);
        if !total.is_finite() {
            return None;
        }
        let mut best_k = 1usize;
        let mut best = -1.0f64;
        let mut prefix = 0.0f64;
        for k in 1..n {
            prefix += *logs.get(k.checked_sub(1)?)?;
            let rest = n.checked_sub(k)?;
            let d = (prefix / k as f64 - (total - prefix) / rest as f64).abs();
            let square = if d == 0.0 {
                0.0
            } else {
                d.powf(black_box(2.0))
            };
            let between = k.checked_mul(rest)? as f64 * square;
            if between > best {
                best_k = k;
                best = between;
            }
        }
        Some(best_k)
    }

    #[test]
    fn otsu_is_the_loop_that_squares_every_k_with_pow() {
        let mut cases: Vec<Vec<f64>> = vec![
            vec![0.0, 0.0, 0.0],
            vec![-5.0, -5.0, -5.0, -5.0],
            vec![0.0, 1.0, 2.0, 3.0],
            vec![-700.0, -700.0, 700.0, 700.0],
            vec![-1e-160, 0.0, 1e-160, 2e-160],
            vec![-11.5, -11.5, -6.9, -6.9, -6.9, -1.6, -1.6],
        ];
        // symmetric sequences (equal values at mirrored k) and a pseudo-random walk
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for n in 2..120usize {
            let mut v: Vec<f64> = (0..n)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    -11.5 + (x % 10_000) as f64 / 1000.0
                })
                .collect();
            v.sort_by(f64::total_cmp);
            cases.push(v);
            let half: Vec<f64> = (0..n).map(|i| if i < n / 2 { -3.0 } else { 1.0 }).collect();
            cases.push(half);
        }
        for logs in &cases {
            assert_eq!(otsu(logs), otsu_every_pow(logs), "{logs:?}");
        }
    }

    #[test]
    fn gaps_sorted_by_their_bits_are_sorted_by_value() {
        let mut times = vec![
            5.0f64,
            4.0,
            4.0,
            4.5,
            7.25,
            7.25 + 1e-9,
            100.0,
            99.0,
            99.5,
            1e300,
        ];
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..500 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let last = times.last().copied().unwrap_or(0.0);
            let step = f64::from_bits(x >> 2) % 2.0 - 0.5; // any double (NaN too), then cut
            times.push(last + if step.is_finite() { step } else { 0.0 });
        }
        let mut want: Vec<f64> = times
            .windows(2)
            .map(|w| {
                let d = w[1] - w[0];
                if d > 0.0 {
                    d
                } else {
                    0.0
                }
            })
            .collect();
        want.sort_by(f64::total_cmp);
        let got = sorted_gaps(&times).unwrap_or_default();
        assert_eq!(got.len(), want.len());
        assert!(got
            .iter()
            .zip(&want)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
        assert_eq!(sorted_gaps(&[1.0, f64::INFINITY, 2.0]), None);
    }

    #[test]
    fn negative_gaps_count_as_zero() {
        let times = [3.0, 2.0, 2.5, 1.0, 1.5];
        let (k, short, long) = split(&times, 1e-5).unwrap_or((0, 9.0, 9.0));
        assert_eq!((k, short, long), (2, 0.0, 0.5));
    }
}
