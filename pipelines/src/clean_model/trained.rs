//! Pairs the networks trained on, and how their scores are read.
//!
//! The calibration describes pairs the networks never saw: it is fitted on
//! pairs held out of training. A pair the networks trained on scores
//! higher than it would have unseen, mismatched ones most of all (they
//! were memorised), so read through that calibration its clean
//! probability is optimistic: on Flickr8k at 70% random noise (GSC) the
//! training pairs' mean `clean_prob` was 0.384 where 30% are clean, and a
//! `--target-precision` of 0.95 kept 0.927 at 20% noise.
//!
//! The held-out pairs and the trained ones are two samples of the same
//! pairs; training only moved the trained ones' scores. So a trained
//! pair's score `u` is read at the quantile it holds among the trained
//! pairs: it is replaced by the held-out pairs' score at that quantile
//! before the calibration applies. That keeps the order of the trained
//! pairs and gives them the held-out pairs' distribution of
//! `clean_prob`, whose mean is the estimated clean share.
//!
//! Training also sharpens the trained similarity more than the
//! neighbourhood score (which never compares a pair with its own image), so
//! the two signals are weighed afresh for the trained pairs: each by how
//! well it alone separates the trained pairs from random pairings among
//! them ([`super::signal_weight`]), as the calibration weighs them for
//! held-out pairs. With the held-out weights the trained pairs ranked
//! random swaps worse than their similarity alone (Flickr8k, GSC, random
//! 20%: AUROC 0.9830 against 0.9867; hard 20%: 0.652 against 0.693).
//!
//! Trained pairs are recognised by a hash of their pooled features (image
//! and caption): a property of the pair, whatever file it is scored in.
//! Features computed differently (another device, another tower build)
//! do not match, and such a pair is read as a new one.

use serde::{Deserialize, Serialize};

/// Quantiles kept of each score distribution.
pub const QUANTILES: usize = 1001;

/// Bits of a pair's hash: stored as two 24-bit integers, which `f32`
/// (the checkpoint's per-pair arrays) holds exactly.
const HASH_BITS: u32 = 48;

/// The hash of one pair from the bits of its unit pooled image and caption
/// features (FNV-1a over the 32-bit words, then a SplitMix64 finaliser),
/// cut to `HASH_BITS`.
pub fn pair_hash(image: &[f32], caption: &[f32]) -> u64 {
    let mut h = ncclean_models::hash::Fnv::default();
    h.word(image.len() as u32);
    image.iter().for_each(|v| h.word(v.to_bits()));
    h.word(caption.len() as u32);
    caption.iter().for_each(|v| h.word(v.to_bits()));
    ncclean_models::hash::mix64(h.finish()) >> (64 - HASH_BITS)
}

/// The trained pairs and the two score distributions.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainedPairs {
    /// Hashes of the trained pairs ([`pair_hash`]), sorted, distinct.
    pub hashes: Vec<u64>,
    /// The trained pairs' scores `u` at [`QUANTILES`] evenly spaced
    /// probabilities.
    pub trained: Vec<f64>,
    /// The held-out pairs' scores at the same probabilities.
    pub held_out: Vec<f64>,
    /// Weights of (similarity, neighbourhood) in a trained pair's score
    /// (about the calibration's origin); None: the calibration's own
    /// weights (checkpoints from before they were fitted apart).
    pub weights: Option<[f64; 2]>,
}

/// The scores at `k` evenly spaced probabilities 0, 1/(k−1), …, 1
/// (linear interpolation between order statistics); empty for no finite
/// score.
pub fn quantiles(scores: &[f64], k: usize) -> Vec<f64> {
    let mut v: Vec<f64> = scores.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() || k == 0 {
        return Vec::new();
    }
    v.sort_by(f64::total_cmp);
    let last = (v.len() - 1) as f64;
    (0..k)
        .map(|j| {
            let pos = if k == 1 {
                0.0
            } else {
                last * j as f64 / (k - 1) as f64
            };
            let lo = pos.floor() as usize;
            let hi = pos.ceil() as usize;
            v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
        })
        .collect()
}

impl TrainedPairs {
    /// From the trained pairs' hashes and scores and the held-out pairs'
    /// scores; None with too few finite scores of either to describe a
    /// distribution.
    pub fn new(
        mut hashes: Vec<u64>,
        trained: &[f64],
        held_out: &[f64],
        weights: Option<[f64; 2]>,
        min_pairs: usize,
    ) -> Option<TrainedPairs> {
        let finite = |v: &[f64]| v.iter().filter(|x| x.is_finite()).count();
        if finite(trained) < min_pairs || finite(held_out) < min_pairs {
            return None;
        }
        hashes.sort_unstable();
        hashes.dedup();
        Some(TrainedPairs {
            hashes,
            trained: quantiles(trained, QUANTILES),
            held_out: quantiles(held_out, QUANTILES),
            weights,
        })
    }

    /// Whether the pair with this hash was trained on.
    pub fn contains(&self, hash: u64) -> bool {
        self.hashes.binary_search(&hash).is_ok()
    }

    /// A trained pair's score read as a held-out pair's: its quantile
    /// among the trained pairs (interpolated between the kept quantiles),
    /// then the held-out score there. Beyond the trained range the score
    /// moves by its distance from the nearest end, so order is kept.
    pub fn held_out_score(&self, u: f64) -> f64 {
        let (t, h) = (&self.trained, &self.held_out);
        let (Some(&t0), Some(&tn)) = (t.first(), t.last()) else {
            return u;
        };
        if !u.is_finite() {
            return u;
        }
        if u < t0 {
            return h[0] - (t0 - u);
        }
        if u > tn {
            return h[h.len() - 1] + (u - tn);
        }
        // First kept quantile above u; ties among the trained quantiles
        // (many equal scores) are passed over to the middle of the run.
        let hi = t.partition_point(|&x| x <= u);
        let lo_run = t.partition_point(|&x| x < u);
        if lo_run < hi {
            // u equals the quantiles lo_run..hi: the middle of their
            // held-out values.
            return (h[lo_run] + h[hi - 1]) / 2.0;
        }
        let lo = hi - 1;
        let w = (u - t[lo]) / (t[hi] - t[lo]);
        h[lo] + (h[hi] - h[lo]) * w
    }

    /// The hashes as per-pair arrays of the checkpoint: two `f32` per
    /// pair, the high and the low 24 bits, each an integer `f32` holds
    /// exactly.
    pub fn hash_array(&self) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.hashes.len() * 2);
        for &h in &self.hashes {
            out.push((h >> 24) as f32);
            out.push((h & 0xff_ffff) as f32);
        }
        out
    }

    /// Hashes back from [`TrainedPairs::hash_array`]; None when the array
    /// is not a sequence of such integer pairs.
    pub fn hashes_from_array(a: &[f32]) -> Option<Vec<u64>> {
        if !a.len().is_multiple_of(2) {
            return None;
        }
        let word = |v: f32| -> Option<u64> {
            ((0.0..16_777_216.0).contains(&v) && v.fract() == 0.0).then_some(v as u64)
        };
        a.chunks(2)
            .map(|c| Some((word(c[0])? << 24) | word(c[1])?))
            .collect()
    }
}

/// What is kept of [`TrainedPairs`] in the checkpoint's state (the hashes
/// travel with the per-pair arrays).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SavedQuantiles {
    /// [`TrainedPairs::trained`].
    pub trained: Vec<f64>,
    /// [`TrainedPairs::held_out`].
    pub held_out: Vec<f64>,
    /// [`TrainedPairs::weights`]; absent in checkpoints from before the
    /// trained pairs' signals were weighed apart.
    #[serde(default)]
    pub weights: Option<[f64; 2]>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_order_statistics() {
        // 0, 1, 2, 3 at probabilities 0, 1/3, 2/3, 1 (k = 4) are the
        // order statistics; k = 3 takes 0, the midpoint 1.5, and 3.
        let v = [3.0, 0.0, 2.0, 1.0, f64::NAN];
        assert_eq!(quantiles(&v, 4), vec![0.0, 1.0, 2.0, 3.0]);
        assert_eq!(quantiles(&v, 3), vec![0.0, 1.5, 3.0]);
        assert!(quantiles(&[f64::NAN], 3).is_empty());
    }

    #[test]
    fn a_trained_score_is_read_at_its_quantile() {
        // Trained scores 10..=20 (11 values), held-out 0..=10: every
        // trained score maps to the held-out one 10 lower, interpolated
        // between the kept quantiles.
        let trained: Vec<f64> = (10..=20).map(f64::from).collect();
        let held: Vec<f64> = (0..=10).map(f64::from).collect();
        let t = TrainedPairs::new(vec![5, 3, 5], &trained, &held, None, 5).expect("built");
        assert_eq!(t.hashes, vec![3, 5]);
        assert!(t.contains(5) && !t.contains(4));
        for u in [10.0, 12.5, 17.25, 20.0] {
            assert!((t.held_out_score(u) - (u - 10.0)).abs() < 1e-9, "{u}");
        }
        // Beyond the ends: shifted by the distance, so order is kept.
        assert!((t.held_out_score(8.0) - -2.0).abs() < 1e-12);
        assert!((t.held_out_score(23.0) - 13.0).abs() < 1e-12);
        // Too few scores: no map.
        assert!(TrainedPairs::new(vec![], &trained, &held[..3], None, 5).is_none());
    }

    #[test]
    fn the_map_is_monotone_with_ties() {
        // Half the trained scores equal 1.0: scores at the tie map to the
        // middle of its held-out values, and the map never decreases.
        let mut trained = vec![1.0; 50];
        trained.extend((0..50).map(|i| 1.0 + f64::from(i + 1) / 50.0));
        let held: Vec<f64> = (0..100).map(|i| f64::from(i) / 100.0).collect();
        let t = TrainedPairs::new(vec![], &trained, &held, None, 10).expect("built");
        let mut last = f64::NEG_INFINITY;
        for i in 0..=300 {
            let u = 0.5 + f64::from(i) / 200.0;
            let m = t.held_out_score(u);
            assert!(m >= last - 1e-12, "{u}: {m} < {last}");
            last = m;
        }
        let at_tie = t.held_out_score(1.0);
        assert!((at_tie - 0.2475).abs() < 0.01, "{at_tie}");
    }

    #[test]
    fn hashes_survive_the_checkpoint_array() {
        let a = pair_hash(&[0.6, 0.8], &[1.0, 0.0, 0.0]);
        let b = pair_hash(&[0.6, 0.8], &[0.0, 1.0, 0.0]);
        let c = pair_hash(&[0.8, 0.6], &[1.0, 0.0, 0.0]);
        assert!(a != b && a != c && b != c);
        assert!(a < 1 << HASH_BITS);
        assert_eq!(a, pair_hash(&[0.6, 0.8], &[1.0, 0.0, 0.0]));
        let t = TrainedPairs::new(
            vec![a, b, c, (1 << 48) - 1, 0],
            &[0.0; 5],
            &[0.0; 5],
            None,
            5,
        )
        .expect("built");
        let back = TrainedPairs::hashes_from_array(&t.hash_array()).expect("integers");
        assert_eq!(back, t.hashes);
        assert!(TrainedPairs::hashes_from_array(&[1.5, 2.0]).is_none());
        assert!(TrainedPairs::hashes_from_array(&[1.0]).is_none());
    }
}
