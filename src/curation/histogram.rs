//! Equal-width histograms: the one binning rule of every histogram the
//! report draws and of the statistic histogram `fit` records.

use serde::{Deserialize, Serialize};

/// Counts of values in `bins` equal-width bins over `[lo, hi]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Histogram {
    /// Left edge of the first bin.
    pub lo: f64,
    /// Right edge of the last bin.
    pub hi: f64,
    /// Values per bin.
    pub counts: Vec<u64>,
}

impl Histogram {
    /// Bin `values` into `bins` bins over `[lo, hi]`: bin `i` holds
    /// `[lo + i·w, lo + (i+1)·w)`, the last bin also its right edge. Values
    /// outside the range go to the end bins (so every finite value is
    /// counted once); non-finite values are passed over.
    pub fn of(values: impl IntoIterator<Item = f64>, lo: f64, hi: f64, bins: usize) -> Histogram {
        let bins = bins.max(1);
        let mut counts = vec![0u64; bins];
        let width = (hi - lo) / bins as f64;
        for v in values.into_iter().filter(|v| v.is_finite()) {
            let i = if width > 0.0 {
                ((v - lo) / width).floor().clamp(0.0, (bins - 1) as f64) as usize
            } else {
                0
            };
            counts[i] += 1;
        }
        Histogram { lo, hi, counts }
    }

    /// Bin `values` over their own finite range (a range of one value is
    /// widened by 0.5 either side, so its bar has a width).
    pub fn spanning(values: &[f64], bins: usize) -> Histogram {
        let (lo, hi) = values
            .iter()
            .filter(|v| v.is_finite())
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &v| {
                (lo.min(v), hi.max(v))
            });
        let (lo, hi) = if lo > hi {
            (0.0, 1.0)
        } else if lo == hi {
            (lo - 0.5, hi + 0.5)
        } else {
            (lo, hi)
        };
        Histogram::of(values.iter().copied(), lo, hi, bins)
    }

    /// Width of one bin.
    pub fn bin_width(&self) -> f64 {
        (self.hi - self.lo) / self.counts.len().max(1) as f64
    }

    /// Values counted.
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Left and right edge of bin `i`.
    pub fn edges(&self, i: usize) -> (f64, f64) {
        let w = self.bin_width();
        (self.lo + i as f64 * w, self.lo + (i + 1) as f64 * w)
    }

    /// The largest count (0 when empty).
    pub fn max_count(&self) -> u64 {
        self.counts.iter().copied().max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_fall_in_half_open_bins_and_the_ends_take_the_rest() {
        // Bins of 0.25 over [0, 1]: 0 and 0.1 -> 0; 0.25 -> 1; 0.5 -> 2;
        // 0.99, 1.0 and 7 -> 3; -2 -> 0; NaN passed over.
        let h = Histogram::of(
            [0.0, 0.1, 0.25, 0.5, 0.99, 1.0, 7.0, -2.0, f64::NAN],
            0.0,
            1.0,
            4,
        );
        assert_eq!(h.counts, [3, 1, 1, 3]);
        assert_eq!(h.total(), 8);
        assert_eq!(h.bin_width(), 0.25);
        assert_eq!(h.edges(2), (0.5, 0.75));
        assert_eq!(h.max_count(), 3);
    }

    #[test]
    fn spanning_uses_the_finite_range() {
        let h = Histogram::spanning(&[2.0, 4.0, f64::INFINITY, 3.0], 2);
        assert_eq!((h.lo, h.hi), (2.0, 4.0));
        assert_eq!(h.counts, [1, 2]);
        let one = Histogram::spanning(&[5.0, 5.0], 3);
        assert_eq!(
            (one.lo, one.hi, one.counts.clone()),
            (4.5, 5.5, vec![0, 2, 0])
        );
        let none = Histogram::spanning(&[], 2);
        assert_eq!((none.lo, none.hi, none.total()), (0.0, 1.0, 0));
    }
}
