//! A histogram's observations of a batch (`sniffer.record.metrics`
//! `_HistogramChild.observe_all`, the reference): the live metrics hand each
//! label set the inter-chunk gaps of a batch at once instead of a call per
//! chunk, and this is their arithmetic: the bucket of each value as
//! `bisect.bisect_left` finds it in the bounds, and their sum, added in
//! order (float for float the reference's `total += value`).

/// The index of the first of `bounds` (sorted, ending with +Inf) that is not
/// below `value`: `bisect.bisect_left(bounds, value)` (the length of the
/// prefix of bounds below `value`, by the same `<`; a NaN value is above
/// no bound: index 0, as there).
pub fn bucket(bounds: &[f64], value: f64) -> usize {
    bounds.partition_point(|&b| b < value)
}

/// Count each of `values` in `counts` (one per bucket of `bounds`; a value
/// past the last bound is counted in the last, as a +Inf bound would) and
/// add them to `total` in order; the new total.
pub fn observe_all(bounds: &[f64], counts: &mut [u64], mut total: f64, values: &[f64]) -> f64 {
    let last = counts.len().saturating_sub(1);
    for &v in values {
        let i = bucket(bounds, v).min(last);
        if let Some(c) = counts.get_mut(i) {
            *c = c.saturating_add(1);
        }
        total += v;
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: [f64; 4] = [0.5, 1.0, 2.5, f64::INFINITY];

    #[test]
    fn bucket_is_bisect_left() {
        assert_eq!(bucket(&B, 0.0), 0);
        assert_eq!(bucket(&B, 0.5), 0); // on a bound: that bucket
        assert_eq!(bucket(&B, 0.500_000_1), 1);
        assert_eq!(bucket(&B, 1.0), 1);
        assert_eq!(bucket(&B, 2.6), 3);
        assert_eq!(bucket(&B, f64::INFINITY), 3);
        assert_eq!(bucket(&B, f64::NAN), 0);
        assert_eq!(bucket(&B, -1.0), 0);
    }

    #[test]
    fn sums_in_order() {
        let mut counts = [0u64; 4];
        // 0.1 + 0.2 + 0.3 in this order differs from other orders
        let total = observe_all(&B, &mut counts, 0.0, &[0.1, 0.2, 0.3, 7.0]);
        assert_eq!(total, ((0.1 + 0.2) + 0.3) + 7.0);
        assert_eq!(counts, [3, 0, 0, 1]);
        let total = observe_all(&B, &mut counts, total, &[]);
        assert_eq!(total, ((0.1 + 0.2) + 0.3) + 7.0);
    }
}
