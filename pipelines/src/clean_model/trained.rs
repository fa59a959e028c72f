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
//! Trained pairs are told from mismatched ones of their own kind instead
//! ([`OwnRatio`]): random pairings among them (a trained image with a
//! trained caption of another image), moved up by how much more a
//! memorised mismatched pair scores than such a pairing
//! and spread a little ([`memorisation_map`], measured on the lowest
//! trained scores, which are mismatched pairs), give the density of
//! mismatched trained pairs;
//! with the held-out noise share, `clean_prob = 1 − noise · ratio` as for
//! new pairs. On Flickr8k (GSC) that took the training pairs' ECE from
//! 0.026 to 0.008 at random 20% noise and 0.024 to 0.008 at 50%, and
//! `--target-precision 0.95` from 0.969 / 0.971 realised to 0.955 / 0.945.
//! The pairings as drawn, unmoved, overshot (0.937 / 0.929): memorised
//! mismatched pairs looked cleaner than they are.
//!
//! Where that model does not fit (it disagrees with the clean share the
//! held-out pairs read, [`OwnRatio::fit`]) or no shift can be measured, a trained pair's
//! score `u` is read at the quantile it holds among the trained pairs: it
//! is replaced by the held-out pairs' score at that quantile before the
//! calibration applies. That keeps the order of the trained pairs and gives
//! them the held-out pairs' distribution of `clean_prob`, whose mean is the
//! estimated clean share; but the trained pairs rank better than the
//! held-out ones, so the cut is conservative on them (0.969 for 0.95).
//!
//! Training also sharpens the trained similarity more than the
//! neighbourhood score (which never compares a pair with its own image), so
//! the signals are weighed afresh for the trained pairs: each by how
//! well it alone separates the trained pairs from random pairings among
//! them ([`super::signal_weight`]), as the calibration weighs them for
//! held-out pairs. With the held-out weights the trained pairs ranked
//! random swaps worse than their similarity alone (Flickr8k, GSC, random
//! 20%: AUROC 0.9830 against 0.9867; hard 20%: 0.652 against 0.693).
//!
//! The method's division of the trained pairs, from the final pass of
//! `fit`, is read beside their signals ([`DivisionOrder`]): it saw how
//! each pair behaved in training, and the two together rank the trained
//! pairs better than either (Flickr8k GSC, random 20%: AUROC 0.9854 →
//! 0.9880, graded τb 50.0 → 51.7). It moves pairs between the trained
//! scores, not the scores, so the calibration above holds as it was.
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
    /// Weights of the signals ([`super::Signals::row`]) in a trained pair's score
    /// (about the calibration's origin); None: the calibration's own
    /// weights (checkpoints from before they were fitted apart).
    pub weights: Option<super::Weights>,
    /// The trained pairs' own density ratio ([`OwnRatio`]); None: they are
    /// read at their quantile ([`TrainedPairs::held_out_score`]), as in
    /// checkpoints from before it, or when no shift could be measured.
    pub own: Option<OwnRatio>,
    /// The method's division read beside the score ([`DivisionOrder`]);
    /// None in checkpoints from before it, or where the division told the
    /// trained pairs nothing apart.
    pub division: Option<DivisionOrder>,
}

/// Share of the method's division in a trained pair's order
/// ([`DivisionOrder`]): the score `u` weighs two signals (similarity and
/// neighbourhood score), the division is a third reading with the same
/// share.
pub const DIVISION_SHARE: f64 = 1.0 / 3.0;

/// How the method's division of the pairs it trained on reorders them.
///
/// The final model's signals are the state of the networks at the end of
/// training; the method's division (its clean probability of each pair it
/// trained on, from the final pass of `fit`) also reads how the pair
/// behaved in training, which none of the signals sees. Beside the
/// signals it ranks the trained pairs better than either alone (Flickr8k,
/// GSC, trained pairs' AUROC of the noise flag and graded τb, score alone
/// / division alone / both: random 20% 0.9854, 50.0 / 0.9878, 48.5 /
/// 0.9881, 51.5; hard 20% 0.666, 35.1 / 0.714, 32.4 / 0.688, 36.4;
/// BENCHMARKS.md "The method's division for trained pairs").
///
/// A trained pair's order is `(1 − s) · F(u) + s · q`: `F(u)` the
/// quantile of its score among the trained pairs, `q` its division's
/// quantile among them (kept per pair, beside its hash), `s` the
/// [`DIVISION_SHARE`]. That order is read back as the trained score at
/// the same quantile, so the trained pairs' scores keep their
/// distribution, and with it what the own ratio or the held-out quantiles
/// make of them (their mean clean probability); only which pair holds
/// which score changes. Stored at `fit`, it is a property of the pair and
/// the checkpoint, as every other part of its label.
#[derive(Debug, Clone, PartialEq)]
pub struct DivisionOrder {
    /// Each trained pair's division quantile in `(0, 1)` (mid-ranks;
    /// the mean over pairs with the same hash), in the order of
    /// [`TrainedPairs::hashes`].
    pub quantile: Vec<f32>,
    /// The trained pairs' orders at [`QUANTILES`] evenly spaced
    /// probabilities.
    pub order: Vec<f64>,
}

/// How trained pairs are told from mismatched ones of their own: P(trained
/// pair | u) against random pairings among them mapped onto the
/// mismatched trained pairs' scores, `offset + scale · u`
/// ([`memorisation_map`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OwnRatio {
    /// Where a random pairing's score 0 lands among mismatched trained
    /// pairs' scores.
    pub offset: f64,
    /// How much wider mismatched trained pairs' scores spread than the
    /// pairings'.
    pub scale: f64,
    /// P(trained pair | u) against the mapped pairings.
    pub isotonic: super::isotonic::Isotonic,
}

/// The most the mismatched trained pairs' spread may differ from the
/// pairings' (a factor either way) for [`OwnRatio`] to read them: on
/// Flickr8k memorisation widened it 1.01–1.05 times. Wider says some
/// mismatched pairs were memorised far more than others, which the lowest
/// trained scores (where the map is measured) cannot see: in a simulation
/// with half of them memorised by 2.5 spreads and half not at all, the map
/// measured 1.38, and a cut asked for 0.95 precision kept 0.909.
pub const MAX_WIDENING: f64 = 1.2;

/// The finite values of `v`, sorted.
fn sorted_finite(v: &[f64]) -> Vec<f64> {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    s.sort_by(f64::total_cmp);
    s
}

/// The value of sorted `v` at fractional index `pos` in `[0, len − 1]`:
/// linear interpolation between the order statistics either side.
fn at_position(v: &[f64], pos: f64) -> f64 {
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
}

/// The value at probability `p` of sorted `v` (as [`quantiles`]); `v`
/// non-empty.
fn quantile_at(v: &[f64], p: f64) -> f64 {
    at_position(v, (v.len() - 1) as f64 * p.clamp(0.0, 1.0))
}

/// Where `x` falls among sorted kept quantiles `q` within their range.
enum Place {
    /// `x` equals the kept quantiles `first..=last` (a run of ties, or one).
    Tie(usize, usize),
    /// `x` lies strictly between `q[lo]` and `q[lo + 1]`, this fraction of
    /// the way.
    Between(usize, f64),
}

/// [`Place`] of `x` in `q[0]..=q[last]`; None outside that range, for
/// NaN, or where `q` is not sorted (loading refuses such quantiles:
/// [`sorted_and_finite`]).
fn place(q: &[f64], x: f64) -> Option<Place> {
    let (&first, &last) = (q.first()?, q.last()?);
    if x.is_nan() || x < first || x > last {
        return None;
    }
    // First kept quantile above x; ties (many equal scores) are a run.
    let hi = q.partition_point(|&v| v <= x);
    let lo_run = q.partition_point(|&v| v < x);
    if lo_run < hi {
        return Some(Place::Tie(lo_run, hi - 1));
    }
    if hi == 0 || hi >= q.len() {
        return None;
    }
    let lo = hi - 1;
    Some(Place::Between(lo, (x - q[lo]) / (q[hi] - q[lo])))
}

/// The probability at which kept quantiles `q` (sorted, as
/// [`quantiles`]) reach `x`: the inverse of [`quantile_at`], linear
/// between kept quantiles, the middle of a run of equal ones, 0 below and
/// 1 above them.
fn probability_of(q: &[f64], x: f64) -> f64 {
    let (Some(&first), Some(&last)) = (q.first(), q.last()) else {
        return 0.5;
    };
    if q.len() == 1 || x.is_nan() {
        return 0.5;
    }
    let last_pos = (q.len() - 1) as f64;
    if x < first {
        return 0.0;
    }
    if x > last {
        return 1.0;
    }
    match place(q, x) {
        Some(Place::Tie(a, b)) => (a + b) as f64 / 2.0 / last_pos,
        Some(Place::Between(lo, w)) => (lo as f64 + w) / last_pos,
        None => 0.5,
    }
}

/// Whether `v` is sorted and finite, as kept quantiles are.
pub fn sorted_and_finite(v: &[f64]) -> bool {
    v.iter().all(|x| x.is_finite()) && v.windows(2).all(|w| w[0] <= w[1])
}

/// Mid-rank quantiles of `v` in `(0, 1)`: `(rank − ½) / n`, ties at the
/// mean of their ranks. `v` finite.
fn mid_rank_quantiles(v: &[f64]) -> Vec<f64> {
    let n = v.len();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| v[a].total_cmp(&v[b]));
    let mut out = vec![0.0; n];
    let mut start = 0;
    while start < n {
        let mut end = start + 1;
        while end < n && v[order[end]] == v[order[start]] {
            end += 1;
        }
        // Ranks start + 1 ..= end share their mean, (start + end + 1) / 2.
        let q = ((start + end) as f64 / 2.0) / n as f64;
        for &i in &order[start..end] {
            out[i] = q;
        }
        start = end;
    }
    out
}

/// How the mismatched pairs among `trained` score against random pairings
/// among them, given the share `noise` of mismatched pairs (estimated on
/// held-out pairs, which training did not move): `(offset, scale)` with a
/// pairing's score `u` landing at `offset + scale · u`.
///
/// The networks memorised the mismatched pairs they trained on, so these
/// score above random pairings of the same images and captions, a little
/// more spread (Flickr8k, GSC: means 0.58 / 0.33 / 0.29 higher, spreads
/// 1.01 / 1.03 / 1.05 times the pairings' at random 20 / 50 / 70% noise).
/// The lowest trained pairs are mismatched ones: the `noise · q` quantile
/// of the trained scores is the `q` quantile of the mismatched ones, to be
/// set against the `q` quantile of the pairings at each of
/// [`super::NOISE_QUANTILES`] that reaches a whole trained pair; the least
/// squares line through those points is the map (offset 0.69 / 0.33 /
/// 0.27, scale 1.03 / 1.02 / 1.04 there). None without two such points, or
/// when the line does not rise.
pub fn memorisation_map(trained: &[f64], pairings: &[f64], noise: f64) -> Option<(f64, f64)> {
    let (t, p) = (sorted_finite(trained), sorted_finite(pairings));
    if t.is_empty() || p.is_empty() || noise.is_nan() || noise <= 0.0 {
        return None;
    }
    let points: Vec<(f64, f64)> = super::NOISE_QUANTILES
        .iter()
        .filter(|&&q| noise * q * t.len() as f64 >= 1.0)
        .map(|&q| (quantile_at(&p, q), quantile_at(&t, noise * q)))
        .collect();
    if points.len() < 2 {
        return None;
    }
    let m = points.len() as f64;
    let (mx, my) = (
        points.iter().map(|x| x.0).sum::<f64>() / m,
        points.iter().map(|x| x.1).sum::<f64>() / m,
    );
    let sxx: f64 = points.iter().map(|x| (x.0 - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|x| (x.0 - mx) * (x.1 - my)).sum();
    let scale = sxy / sxx;
    (scale.is_finite() && scale > 0.0).then_some((my - scale * mx, scale))
}

impl OwnRatio {
    /// Fitted on the trained pairs' scores and the random pairings' among
    /// them, read with `cal`'s noise share, and kept only where it agrees
    /// with the held-out pairs (scores `held_out`) on what they measure
    /// best: the clean share ([`agrees_on_clean_share`]); and it must
    /// leave them at least as decided as the held-out
    /// pairs (the mean of `p (1 − p)` no higher), since training sharpens
    /// the ranking of what it saw. Memorisation that is not one shape
    /// moved and widened (networks that memorised some mismatched pairs far
    /// more than others) fails one of the two: moved up only, the pairings
    /// left mismatched pairs looking clean (a synthetic file of 1,500 pairs
    /// trained 15 epochs: mean 0.83 against the held-out 0.71, truth 0.70);
    /// widened to fit, they put mismatched density among the matched pairs
    /// (mean 0.69 but no pair above 0.89, where the top 70% were all
    /// matched). The trained pairs are then read at their quantile, as
    /// they are when the map widens the pairings by more than
    /// [`MAX_WIDENING`]. None then, or when no
    /// map can be measured ([`memorisation_map`]).
    pub fn fit(
        trained: &[f64],
        pairings: &[f64],
        cal: &super::Calibration,
        held_out: &[f64],
    ) -> Option<OwnRatio> {
        let (offset, scale) = memorisation_map(trained, pairings, cal.noise)?;
        if !(1.0 / MAX_WIDENING..=MAX_WIDENING).contains(&scale) {
            return None;
        }
        let moved: Vec<f64> = pairings.iter().map(|u| offset + scale * u).collect();
        let own = OwnRatio {
            offset,
            scale,
            isotonic: super::Calibration::density_ratio_fit(trained, &moved),
        };
        let probs = |scores: &[f64], read: &dyn Fn(f64) -> f32| -> Vec<f64> {
            scores
                .iter()
                .filter(|u| u.is_finite())
                .map(|&u| f64::from(read(u)))
                .collect()
        };
        let mine = probs(trained, &|u| cal.clean_prob_through(&own.isotonic, u));
        let theirs = probs(held_out, &|u| cal.clean_prob_at(u));
        if mine.is_empty() || theirs.len() < 2 {
            return None;
        }
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        let (m, h) = (mean(&mine), mean(&theirs));
        let var = theirs.iter().map(|p| (p - h).powi(2)).sum::<f64>() / (theirs.len() - 1) as f64;
        let se = (var / theirs.len() as f64).sqrt();
        let agrees = agrees_on_clean_share(m, h, 1.0 - cal.noise, se);
        // Training sharpens the ranking of the pairs it saw; an own ratio
        // that leaves them less decided than the held-out pairs (more
        // probability mass near one half) has put mismatched pairs'
        // density where the matched ones are.
        let spread = |v: &[f64]| mean(&v.iter().map(|p| p * (1.0 - p)).collect::<Vec<_>>());
        (agrees && spread(&mine) <= spread(&theirs)).then_some(own)
    }
}

/// Whether the trained pairs' mean clean probability under their own
/// ratio, `mine`, agrees with the clean share the held-out pairs read
/// ([`OwnRatio::fit`]): within two standard errors (`se`, of the held-out
/// pairs' mean) of the span between the two readings the held-out pairs
/// give of it, the mean of their clean probabilities (`held_out`) and one
/// minus the noise share (`clean_share`).
///
/// The two readings differ where the held-out pairs' density ratio is
/// clipped (a probability below 0 read as 0 raises their mean): on
/// Flickr8k (GSC, random noise at 10–90%, 26 fits) the held-out mean stood
/// above one minus the noise share in every fit, by up to 0.029 (0.015–0.029
/// at 60–70%). Against the held-out mean alone, the own ratio, which lay
/// between the two or next to one minus the noise share, was refused on
/// five of the eight fits at 60–70% (off by 0.014–0.024 against two standard
/// errors of 0.013–0.015), and the trained pairs read
/// at their quantile instead were far less well calibrated: ECE
/// 0.036–0.049 against 0.005–0.013 through the own ratio, a
/// `--target-precision 0.95` cut realising 0.973–0.976 against
/// 0.952–0.961 (BENCHMARKS.md, "Calibration over fit seeds; the own
/// ratio held to both readings of the clean share").
pub fn agrees_on_clean_share(mine: f64, held_out: f64, clean_share: f64, se: f64) -> bool {
    let (lo, hi) = (held_out.min(clean_share), held_out.max(clean_share));
    mine >= lo - 2.0 * se && mine <= hi + 2.0 * se
}

/// The scores at `k` evenly spaced probabilities 0, 1/(k−1), …, 1
/// (linear interpolation between order statistics); empty for no finite
/// score.
pub fn quantiles(scores: &[f64], k: usize) -> Vec<f64> {
    let v = sorted_finite(scores);
    if v.is_empty() || k == 0 {
        return Vec::new();
    }
    let last = (v.len() - 1) as f64;
    (0..k)
        .map(|j| {
            let pos = if k == 1 {
                0.0
            } else {
                last * j as f64 / (k - 1) as f64
            };
            at_position(&v, pos)
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
        weights: Option<super::Weights>,
        own: Option<OwnRatio>,
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
            own,
            division: None,
        })
    }

    /// With the method's division read beside the scores
    /// ([`DivisionOrder`]): `hashes[i]`, `scores[i]` and `division[i]`
    /// (the method's clean probability) of the trained pairs as given to
    /// [`TrainedPairs::new`]. Unchanged where the lengths differ, or where
    /// the division is constant or not finite over the pairs with a
    /// finite score (it orders nothing).
    pub fn with_division(mut self, hashes: &[u64], scores: &[f64], division: &[f64]) -> Self {
        if hashes.len() != scores.len() || division.len() != scores.len() {
            return self;
        }
        let kept: Vec<usize> = (0..scores.len())
            .filter(|&i| scores[i].is_finite())
            .collect();
        let d: Vec<f64> = kept.iter().map(|&i| division[i]).collect();
        let varies = d.iter().any(|&x| x != d[0]);
        if d.is_empty() || !varies || d.iter().any(|x| !x.is_finite()) {
            return self;
        }
        // Each distinct hash's quantile: the mean over its pairs.
        let mut by_hash: Vec<(u64, f64)> = kept
            .iter()
            .zip(mid_rank_quantiles(&d))
            .map(|(&i, q)| (hashes[i], q))
            .collect();
        by_hash.sort_by_key(|&(h, _)| h);
        let mut quantile = Vec::with_capacity(self.hashes.len());
        let mut at = 0;
        for &h in &self.hashes {
            let (mut sum, mut count) = (0.0, 0usize);
            while at < by_hash.len() && by_hash[at].0 < h {
                at += 1;
            }
            while at < by_hash.len() && by_hash[at].0 == h {
                sum += by_hash[at].1;
                count += 1;
                at += 1;
            }
            // A hash of a pair with no finite score sits in the middle.
            quantile.push(if count > 0 { sum / count as f64 } else { 0.5 } as f32);
        }
        // Every kept pair's hash is among `self.hashes` (built from them).
        let orders: Vec<f64> = kept
            .iter()
            .filter_map(|&i| {
                let at = self.index_of(hashes[i])?;
                Some(self.order_of(scores[i], quantile[at]))
            })
            .collect();
        self.division = Some(DivisionOrder {
            quantile,
            order: quantiles(&orders, QUANTILES),
        });
        self
    }

    /// A trained pair's order ([`DivisionOrder`]) from its score and its
    /// division's quantile.
    fn order_of(&self, u: f64, division_quantile: f32) -> f64 {
        (1.0 - DIVISION_SHARE) * probability_of(&self.trained, u)
            + DIVISION_SHARE * f64::from(division_quantile)
    }

    /// The score of the trained pair at `at` in [`TrainedPairs::hashes`]
    /// ([`TrainedPairs::index_of`]) once the method's division is read
    /// beside its score `u` ([`DivisionOrder`]): the trained score at the
    /// quantile its order holds. `u` itself without a division order, or
    /// for a score that is not finite.
    pub fn ordered_score_at(&self, at: usize, u: f64) -> f64 {
        let Some(d) = &self.division else {
            return u;
        };
        match d.quantile.get(at) {
            Some(&q) if u.is_finite() => {
                quantile_at(&self.trained, probability_of(&d.order, self.order_of(u, q)))
            }
            _ => u,
        }
    }

    /// Where the pair with this hash is in [`TrainedPairs::hashes`]; None
    /// when it was not trained on.
    pub fn index_of(&self, hash: u64) -> Option<usize> {
        self.hashes.binary_search(&hash).ok()
    }

    /// Whether the pair with this hash was trained on.
    pub fn contains(&self, hash: u64) -> bool {
        self.index_of(hash).is_some()
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
        match place(t, u) {
            // u equals a run of trained quantiles: the middle of their
            // held-out values.
            Some(Place::Tie(a, b)) => (h[a] + h[b]) / 2.0,
            Some(Place::Between(lo, w)) => h[lo] + (h[lo + 1] - h[lo]) * w,
            None => u,
        }
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
    /// trained pairs' signals were weighed apart; two values in those
    /// from before the ridge signal.
    #[serde(default, deserialize_with = "super::padded_option")]
    pub weights: Option<super::Weights>,
    /// [`TrainedPairs::own`]; absent in checkpoints from before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub own: Option<OwnRatio>,
    /// [`DivisionOrder::order`] (its per-pair quantiles travel with the
    /// hashes); absent in checkpoints from before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub division_order: Option<Vec<f64>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pair's score read through the division order, by its hash (`u`
    /// for a hash not trained on).
    fn ordered(t: &TrainedPairs, hash: u64, u: f64) -> f64 {
        t.index_of(hash).map_or(u, |at| t.ordered_score_at(at, u))
    }

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
        let t = TrainedPairs::new(vec![5, 3, 5], &trained, &held, None, None, 5).expect("built");
        assert_eq!(t.hashes, vec![3, 5]);
        assert!(t.contains(5) && !t.contains(4));
        for u in [10.0, 12.5, 17.25, 20.0] {
            assert!((t.held_out_score(u) - (u - 10.0)).abs() < 1e-9, "{u}");
        }
        // Beyond the ends: shifted by the distance, so order is kept.
        assert!((t.held_out_score(8.0) - -2.0).abs() < 1e-12);
        assert!((t.held_out_score(23.0) - 13.0).abs() < 1e-12);
        // Too few scores: no map.
        assert!(TrainedPairs::new(vec![], &trained, &held[..3], None, None, 5).is_none());
    }

    #[test]
    fn probabilities_invert_the_kept_quantiles() {
        let q = [0.0, 1.0, 1.0, 1.0, 4.0];
        // Positions 0..4 of 4: 0 at 0, 4 at 1; 2.5 is halfway from
        // position 3 to 4; the run of 1s holds positions 1..=3.
        assert_eq!(probability_of(&q, 0.0), 0.0);
        assert_eq!(probability_of(&q, 4.0), 1.0);
        assert!((probability_of(&q, 2.5) - 3.5 / 4.0).abs() < 1e-12);
        assert!((probability_of(&q, 0.5) - 0.5 / 4.0).abs() < 1e-12);
        assert!((probability_of(&q, 1.0) - 2.0 / 4.0).abs() < 1e-12);
        assert_eq!(
            (probability_of(&q, -1.0), probability_of(&q, 9.0)),
            (0.0, 1.0)
        );
        let v: Vec<f64> = (0..7).map(|i| f64::from(i * i)).collect();
        let kept = quantiles(&v, QUANTILES);
        for p in [0.0, 0.1, 0.37, 0.5, 0.99, 1.0] {
            let back = probability_of(&kept, quantile_at(&kept, p));
            assert!((back - p).abs() < 1e-9, "{p}: {back}");
        }
    }

    #[test]
    fn mid_rank_quantiles_share_ties() {
        // Sorted 1, 2, 2, 3: ranks 1, 2.5, 2.5, 4; (rank − ½) / 4.
        assert_eq!(
            mid_rank_quantiles(&[3.0, 1.0, 2.0, 2.0]),
            vec![0.875, 0.125, 0.5, 0.5]
        );
    }

    #[test]
    fn the_division_reorders_trained_pairs_and_keeps_their_scores() {
        // Scores 0, 0.1, 0.2, 3 (hashes 10..13): quantiles F = 0, 1/3,
        // 2/3, 1. Division 0.9, 0.1, 0.5, 0.7: mid-rank quantiles 7/8,
        // 1/8, 3/8, 5/8. Orders (2/3) F + (1/3) q: 0.2917, 0.2639,
        // 0.5694, 0.8750. Pairs 10 and 11 swap: each takes the other's
        // score; 12 and 13 keep theirs.
        let scores = [0.0, 0.1, 0.2, 3.0];
        let hashes = [10, 11, 12, 13];
        let t = TrainedPairs::new(hashes.to_vec(), &scores, &scores, None, None, 4)
            .expect("built")
            .with_division(&hashes, &scores, &[0.9, 0.1, 0.5, 0.7]);
        let d = t.division.as_ref().expect("a division order");
        assert_eq!(d.quantile, vec![0.875, 0.125, 0.375, 0.625]);
        // Within the kept quantiles' interpolation: an order statistic of
        // four falls between two of the 1,001 kept quantiles, which join
        // two of its segments by a chord (off by 0.002 here).
        let got: Vec<f64> = (0..4).map(|i| ordered(&t, hashes[i], scores[i])).collect();
        for (g, want) in got.iter().zip([0.1, 0.0, 0.2, 3.0]) {
            assert!((g - want).abs() < 0.005, "{got:?}");
        }
        // A pair not trained on, or a score that is not finite, is as it was.
        assert_eq!(ordered(&t, 99, 0.05), 0.05);
        assert!(ordered(&t, 10, f64::NAN).is_nan());
        // A division that orders nothing (constant), or does not fit the
        // pairs, leaves no order.
        let plain =
            TrainedPairs::new(hashes.to_vec(), &scores, &scores, None, None, 4).expect("built");
        assert!(plain
            .clone()
            .with_division(&hashes, &scores, &[0.5; 4])
            .division
            .is_none());
        assert!(plain
            .clone()
            .with_division(&hashes, &scores, &[0.5; 3])
            .division
            .is_none());
        assert_eq!(ordered(&plain, 10, 0.05), 0.05);
    }

    #[test]
    fn a_division_in_the_scores_order_changes_nothing_and_any_keeps_the_distribution() {
        // 500 trained pairs: the division in the scores' own order leaves
        // every score where it was; in a scrambled order it moves pairs,
        // but the scores they take are the trained scores' distribution.
        let n = 500;
        let scores: Vec<f64> = (0..n)
            .map(|i| (f64::from(i) * 0.37).sin() * 3.0 + f64::from(i) * 0.01)
            .collect();
        let hashes: Vec<u64> = (0..n as u64).map(|i| i * 7 + 1).collect();
        let base =
            TrainedPairs::new(hashes.clone(), &scores, &scores, None, None, 10).expect("built");
        let same = base.clone().with_division(&hashes, &scores, &scores);
        for i in 0..n as usize {
            let g = ordered(&same, hashes[i], scores[i]);
            assert!((g - scores[i]).abs() < 0.02, "{i}: {g} for {}", scores[i]);
        }
        let scrambled: Vec<f64> = (0..n).map(|i| f64::from((i * 37) % 101)).collect();
        let t = base.with_division(&hashes, &scores, &scrambled);
        let mut got: Vec<f64> = (0..n as usize)
            .map(|i| ordered(&t, hashes[i], scores[i]))
            .collect();
        let moved = got
            .iter()
            .zip(&scores)
            .filter(|(g, s)| (*g - *s).abs() > 0.1)
            .count();
        assert!(moved > n as usize / 4, "{moved} moved");
        let mut want = scores.clone();
        got.sort_by(f64::total_cmp);
        want.sort_by(f64::total_cmp);
        let worst = got
            .iter()
            .zip(&want)
            .map(|(g, w)| (g - w).abs())
            .fold(0.0, f64::max);
        assert!(worst < 0.05, "sorted scores differ by {worst}");
    }

    #[test]
    fn the_map_is_monotone_with_ties() {
        // Half the trained scores equal 1.0: scores at the tie map to the
        // middle of its held-out values, and the map never decreases.
        let mut trained = vec![1.0; 50];
        trained.extend((0..50).map(|i| 1.0 + f64::from(i + 1) / 50.0));
        let held: Vec<f64> = (0..100).map(|i| f64::from(i) / 100.0).collect();
        let t = TrainedPairs::new(vec![], &trained, &held, None, None, 10).expect("built");
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
    fn the_memorisation_map_is_the_line_through_the_low_quantiles() {
        // Pairings 0, 1, ..., 100: the q quantile is 100 q. Trained: 200
        // mismatched pairs at 5 + 100 k / 199 (k = 0..199, the pairings'
        // range moved up by 5) below 800 matched ones at 1000; noise 0.2.
        // The 0.2 q quantile of the 1,000 trained scores sits at position
        // 999 · 0.2 q among the mismatched ones: 5 + 100 · 199.8 q / 199,
        // a line in the pairings' 100 q: offset 5, scale 199.8 / 199.
        let pairings: Vec<f64> = (0..=100).map(f64::from).collect();
        let mut trained: Vec<f64> = (0..200)
            .map(|k| 5.0 + 100.0 * f64::from(k) / 199.0)
            .collect();
        trained.extend(std::iter::repeat_n(1000.0, 800));
        let (offset, scale) = memorisation_map(&trained, &pairings, 0.2).expect("measured");
        assert!((offset - 5.0).abs() < 1e-9, "offset {offset}");
        assert!((scale - 199.8 / 199.0).abs() < 1e-12, "scale {scale}");
        // No noise, or too few pairs to reach one in two tails: no map.
        assert_eq!(memorisation_map(&trained, &pairings, 0.0), None);
        assert_eq!(memorisation_map(&trained[..10], &pairings, 0.1), None);
        assert_eq!(memorisation_map(&[], &pairings, 0.2), None);
        // Trained scores all equal: the line does not rise, no map.
        assert_eq!(memorisation_map(&[1.0; 200], &pairings, 1.0), None);
    }

    /// A deterministic normal sample (Box–Muller over SplitMix64).
    fn normals(seed: u64, n: usize, mean: f64) -> Vec<f64> {
        let mut rng = ncclean_models::rng::Rng::new(seed);
        (0..n).map(|_| mean + rng.normal()).collect()
    }

    #[test]
    fn memorised_noise_is_read_against_pairings_moved_up() {
        // 20,000 trained pairs, 20% mismatched: memorised, they score 0.6
        // above the random pairings (N(0, 1)); matched ones at N(3, 1).
        // The held-out noise share (0.2) is given.
        let noisy = 4_000;
        let mut trained = normals(1, noisy, 0.6);
        trained.extend(normals(2, 16_000, 3.0));
        let clean: Vec<bool> = (0..trained.len()).map(|i| i >= noisy).collect();
        let pairings = normals(3, 20_000, 0.0);
        let cal = super::super::Calibration {
            origin: [0.0; 3],
            weights: [1.0, 0.0, 0.0],
            isotonic: super::super::isotonic::Isotonic { knots: Vec::new() },
            noise: 0.2,
            pairs: 0,
            negatives: 0,
        };
        // The precision a `--target-precision` cut promises (the mean of
        // the kept) against the share of matched pairs it keeps.
        let realised = |ratio: &super::super::isotonic::Isotonic, target: f64| {
            let p: Vec<f64> = trained
                .iter()
                .map(|&u| f64::from(cal.clean_prob_through(ratio, u)))
                .collect();
            let mut order: Vec<usize> = (0..p.len()).collect();
            order.sort_by(|&a, &b| p[b].total_cmp(&p[a]));
            let (mut sum, mut kept) = (0.0, 0);
            for (k, &i) in order.iter().enumerate() {
                sum += p[i];
                if sum / (k + 1) as f64 >= target {
                    kept = k + 1;
                }
            }
            let good = order[..kept].iter().filter(|&&i| clean[i]).count();
            let mean = p.iter().sum::<f64>() / p.len() as f64;
            (good as f64 / kept as f64, mean)
        };
        // Held-out pairs: the same mixture, mismatched ones not memorised
        // and matched ones less sharply told apart (2 spreads, not 2.4).
        let mut held = normals(4, 600, 0.0);
        held.extend(normals(5, 2_400, 2.0));
        let held_cal = super::super::Calibration {
            isotonic: super::super::Calibration::density_ratio_fit(&held, &pairings),
            ..cal.clone()
        };
        let own = OwnRatio::fit(&trained, &pairings, &held_cal, &held).expect("fitted");
        assert!((own.offset - 0.6).abs() < 0.15, "offset {}", own.offset);
        assert!((own.scale - 1.0).abs() < 0.1, "scale {}", own.scale);
        for target in [0.95, 0.98] {
            let (precision, mean) = realised(&own.isotonic, target);
            assert!((precision - target).abs() < 0.01, "{target}: {precision}");
            assert!((mean - 0.8).abs() < 0.02, "mean {mean}");
        }
        // Against the pairings as drawn, the memorised mismatched pairs
        // look cleaner than they are and the cut keeps too many of them.
        let plain = super::super::Calibration::density_ratio_fit(&trained, &pairings);
        let (precision, _) = realised(&plain, 0.95);
        assert!(precision < 0.94, "unshifted: {precision}");

        // Half the mismatched pairs memorised far more (N(2.5, 1)) than the
        // rest (N(0, 1)): not one shape moved. The lowest quantiles see
        // the unmemorised half and a spread 1.38 times the pairings'; read
        // with that map, a cut asked for 0.95 kept 0.909. No own ratio is
        // kept (the quantile map reads them).
        let mut uneven = normals(6, noisy / 2, 0.0);
        uneven.extend(normals(7, noisy / 2, 2.5));
        uneven.extend(normals(8, 16_000, 3.0));
        let (_, scale) = memorisation_map(&uneven, &pairings, 0.2).expect("measured");
        assert!(scale > MAX_WIDENING, "scale {scale}");
        assert_eq!(OwnRatio::fit(&uneven, &pairings, &held_cal, &held), None);
    }

    #[test]
    fn the_own_ratio_is_held_to_the_span_of_both_readings() {
        // Flickr8k GSC at 70% random noise, fit seed 1: own-ratio mean
        // 0.2932, held-out mean 0.3086, one minus the noise share 0.2886,
        // standard error 0.0067. Off the held-out mean by 0.0154, more than
        // two standard errors (0.0134), but inside [0.2886 - 0.0134,
        // 0.3086 + 0.0134] = [0.2752, 0.3220].
        assert!(agrees_on_clean_share(0.2932, 0.3086, 0.2886, 0.0067));
        assert!(agrees_on_clean_share(0.2753, 0.3086, 0.2886, 0.0067));
        assert!(!agrees_on_clean_share(0.2751, 0.3086, 0.2886, 0.0067));
        assert!(agrees_on_clean_share(0.3219, 0.3086, 0.2886, 0.0067));
        assert!(!agrees_on_clean_share(0.3221, 0.3086, 0.2886, 0.0067));
        // The readings in the other order give the same span.
        assert!(agrees_on_clean_share(0.2932, 0.2886, 0.3086, 0.0067));
        // The uneven memorisation [`OwnRatio::fit`] names (1,500 pairs
        // trained 15 epochs, the pairings moved up only): 0.83 against a
        // held-out 0.71, truth 0.70, is refused with any clean share near
        // the truth.
        assert!(!agrees_on_clean_share(0.83, 0.71, 0.70, 0.02));
        assert!(!agrees_on_clean_share(f64::NAN, 0.71, 0.70, 0.02));
    }

    #[test]
    fn clipped_held_out_pairs_do_not_refuse_the_own_ratio() {
        // 70% of 20,000 trained pairs mismatched and memorised (N(0.3, 1)
        // against pairings N(0, 1)), matched ones N(3, 1); held-out pairs
        // the same mixture unmemorised (N(0, 1), N(2, 1)). With the noise
        // share read high (0.78), the held-out pairs' clean probabilities
        // are clipped at 0 at the bottom and their mean, 0.256, stands
        // above one minus the noise share, 0.22; the own ratio's mean,
        // 0.239, lies between the two but 0.016 off the held-out mean, more
        // than two of its standard errors (0.012). It is kept.
        let mut trained = normals(11, 14_000, 0.3);
        trained.extend(normals(12, 6_000, 3.0));
        let pairings = normals(13, 20_000, 0.0);
        let mut held = normals(14, 2_100, 0.0);
        held.extend(normals(15, 900, 2.0));
        let cal = super::super::Calibration {
            origin: [0.0; 3],
            weights: [1.0, 0.0, 0.0],
            isotonic: super::super::Calibration::density_ratio_fit(&held, &pairings),
            noise: 0.78,
            pairs: 0,
            negatives: 0,
        };
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        let theirs: Vec<f64> = held
            .iter()
            .map(|&u| f64::from(cal.clean_prob_at(u)))
            .collect();
        let h = mean(&theirs);
        let var = theirs.iter().map(|p| (p - h).powi(2)).sum::<f64>() / (theirs.len() - 1) as f64;
        let se = (var / theirs.len() as f64).sqrt();
        let own = OwnRatio::fit(&trained, &pairings, &cal, &held).expect("kept");
        let mine: Vec<f64> = trained
            .iter()
            .map(|&u| f64::from(cal.clean_prob_through(&own.isotonic, u)))
            .collect();
        let m = mean(&mine);
        assert!(h > 0.22 + 0.03, "held-out mean {h}");
        assert!((m - h).abs() > 2.0 * se, "own {m}, held out {h}, se {se}");
        assert!(m > 0.22 && m < h, "own {m}, held out {h}");
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
