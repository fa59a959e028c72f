//! A non-decreasing curve fitted to weighted binary outcomes: pool
//! adjacent violators (PAV) over quantile bins of the score, read back by
//! linear interpolation between the pooled blocks' centres.

use serde::{Deserialize, Serialize};

/// `(score, value)` knots, scores strictly increasing and values
/// non-decreasing; between knots the curve is linear, beyond them flat.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Isotonic {
    /// The knots.
    pub knots: Vec<(f64, f64)>,
}

impl Isotonic {
    /// Fit P(outcome | score) as a non-decreasing function of the score.
    /// The items are cut into at most `bins` bins of equal count by score
    /// (ties never split), each bin's weighted outcome share is pooled with
    /// its neighbours wherever the shares would decrease, and every pooled
    /// block becomes a knot at its weighted mean score.
    ///
    /// # Panics
    /// If the slices differ in length (a caller bug).
    pub fn fit(score: &[f64], outcome: &[bool], weight: &[f64], bins: usize) -> Isotonic {
        assert!(
            score.len() == outcome.len() && outcome.len() == weight.len(),
            "isotonic: lengths"
        );
        let mut idx: Vec<usize> = (0..score.len()).filter(|&i| score[i].is_finite()).collect();
        idx.sort_by(|&a, &b| score[a].total_cmp(&score[b]));
        let n = idx.len();
        if n == 0 {
            return Isotonic { knots: Vec::new() };
        }
        let per_bin = n.div_ceil(bins.max(1));
        // (weight, weighted score sum, weighted outcome sum) per block.
        let mut blocks: Vec<(f64, f64, f64)> = Vec::new();
        let mut start = 0;
        while start < n {
            let mut end = (start + per_bin).min(n);
            while end < n && score[idx[end]] == score[idx[end - 1]] {
                end += 1;
            }
            let mut b = (0.0, 0.0, 0.0);
            for &i in &idx[start..end] {
                b.0 += weight[i];
                b.1 += weight[i] * score[i];
                b.2 += weight[i] * f64::from(u8::from(outcome[i]));
            }
            if b.0 > 0.0 {
                blocks.push(b);
                // Pool while the last block's share falls below the one
                // before it.
                while blocks.len() >= 2 {
                    let k = blocks.len();
                    let (last, prev) = (blocks[k - 1], blocks[k - 2]);
                    if last.2 / last.0 >= prev.2 / prev.0 {
                        break;
                    }
                    blocks.pop();
                    blocks[k - 2] = (prev.0 + last.0, prev.1 + last.1, prev.2 + last.2);
                }
            }
            start = end;
        }
        Isotonic {
            knots: blocks.iter().map(|b| (b.1 / b.0, b.2 / b.0)).collect(),
        }
    }

    /// The curve at `x`: linear between knots, flat beyond; 0.5 without
    /// knots.
    pub fn at(&self, x: f64) -> f64 {
        let k = &self.knots;
        let (Some(first), Some(last)) = (k.first(), k.last()) else {
            return 0.5;
        };
        if x <= first.0 {
            return first.1;
        }
        if x >= last.0 {
            return last.1;
        }
        let hi = k.partition_point(|p| p.0 < x);
        let (a, b) = (k[hi - 1], k[hi]);
        let t = (x - a.0) / (b.0 - a.0);
        a.1 + t * (b.1 - a.1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn violators_are_pooled_by_weight() {
        // One item per bin: outcomes 0, 1, 0, 1 at scores 1..4. The pair
        // (1 at 2, 0 at 3) violates the order and pools to 0.5 at 2.5.
        let iso = Isotonic::fit(
            &[1.0, 2.0, 3.0, 4.0],
            &[false, true, false, true],
            &[1.0; 4],
            4,
        );
        assert_eq!(iso.knots, vec![(1.0, 0.0), (2.5, 0.5), (4.0, 1.0)]);
        // Linear between knots, flat beyond.
        assert_eq!(iso.at(0.0), 0.0);
        assert!((iso.at(1.75) - 0.25).abs() < 1e-12);
        assert_eq!(iso.at(3.25), 0.75);
        assert_eq!(iso.at(9.0), 1.0);
        // Weight 3 on the 0 at score 3: pooled share 1/4 at (2 + 9) / 4.
        let iso = Isotonic::fit(
            &[1.0, 2.0, 3.0, 4.0],
            &[false, true, false, true],
            &[1.0, 1.0, 3.0, 1.0],
            4,
        );
        assert_eq!(iso.knots[1], (11.0 / 4.0, 0.25));
    }

    #[test]
    fn bins_never_split_a_tie_and_the_curve_never_decreases() {
        let score: Vec<f64> = (0..100).map(|i| f64::from(i / 10)).collect();
        let outcome: Vec<bool> = (0..100).map(|i| (i * 7919) % 10 < i / 10).collect();
        let iso = Isotonic::fit(&score, &outcome, &[1.0; 100], 7);
        for w in iso.knots.windows(2) {
            assert!(w[0].0 < w[1].0 && w[0].1 <= w[1].1, "{:?}", iso.knots);
        }
        // Every knot sits at a mean of whole tie groups: 10 equal scores
        // per value, so no knot falls strictly inside one bin's value.
        assert!(iso.knots.len() <= 10);
        assert_eq!(Isotonic::fit(&[], &[], &[], 4).at(1.0), 0.5);
    }
}
