//! Summaries of interleaved rounds, one way for every tool: the median
//! round and the range of the rounds, as the tables print them.

/// The median of `v` (the upper one of an even count); NaN when empty.
pub fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The median of `f` over `v`.
pub fn median_by<T>(v: &[T], f: impl Fn(&T) -> f64) -> f64 {
    median(&v.iter().map(f).collect::<Vec<_>>())
}

/// The least and the greatest of `f` over `v`; (∞, -∞) when empty.
pub fn range_by<T>(v: &[T], f: impl Fn(&T) -> f64) -> (f64, f64) {
    v.iter()
        .map(f)
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
            (lo.min(x), hi.max(x))
        })
}

/// `median (min-max)` of `v`, with `digits` decimals: a table cell.
pub fn spread(v: &[f64], digits: usize) -> String {
    let (lo, hi) = range_by(v, |x| *x);
    format!("{:.digits$} ({lo:.digits$}-{hi:.digits$})", median(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_ranges_and_spreads() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 3.0);
        assert!(median(&[]).is_nan());
        assert_eq!(range_by(&[2.0, 5.0, 1.0], |x| *x), (1.0, 5.0));
        assert_eq!(median_by(&[(1, 9.0), (2, 7.0), (3, 8.0)], |p| p.1), 8.0);
        assert_eq!(spread(&[1.04, 0.98, 1.2], 2), "1.04 (0.98-1.20)");
    }
}
