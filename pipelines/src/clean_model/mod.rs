//! The final clean-probability model: what `clean_prob` means by default.
//!
//! A method's division statistic ranks pairs by how they behaved in
//! training (small losses, consistent structure within a batch). That
//! separates random swaps, but it is relative to the batch a pair is
//! scored in, it leans on memorisation (training pairs have small losses,
//! new ones do not), and a two-component mixture over it is badly
//! calibrated. Measured on Flickr8k (issue #31), it also ranks partly-right
//! captions worse than the trained similarity alone.
//!
//! This model scores each pair from three signals of the pair alone:
//! - the trained **similarity** of image and caption (the networks' mean),
//!   read against the same caption's similarities with a bank of training
//!   images ([`null`]; `caption_null = false` reads it as it is);
//! - the **neighbourhood** score ([`mod@reference`]): the caption against the
//!   captions of the training images that look most like the pair's image;
//! - the **ridge** signal ([`ridge`]): the caption against a linear map's
//!   prediction from the image's frozen features, fitted on the trained
//!   pairs, read against the caption's null as the similarity is.
//!
//! and turns them into a probability with the one thing known for sure
//! about noise: a caption paired with a random other image is mismatched.
//! Random pairings of held-out training pairs give the distribution of
//! mismatched pairs, `f_neg`. The model tells the observed
//! pairs from those pairings: each signal, weighted by how well it alone
//! separates them ([`signal_weight`]), adds to a score `u`; an isotonic
//! fit ([`isotonic`]) of P(observed | u) gives the density ratio
//! `r(u) = f_neg(u) / f_data(u)`. If the data are a share π of matched
//! pairs and `1 − π` of pairs like random pairings, then
//!
//! ```text
//! clean_prob(u) = 1 − (1 − π) · r(u)          (clipped to [0, 1])
//! ```
//!
//! and `1 − π` is at most `F_data(t) / F_neg(t)` for every threshold `t`:
//! its smallest value over the lower half of the pairings' scores is the
//! estimate ([`estimate_noise`]), read on the similarity and the
//! neighbourhood score alone ([`Calibration::fit`] says why), taken with the similarity read against
//! each caption's null and again against each image's null, the larger
//! kept ([`null`]: each reading counts one kind of pair that fits nothing). The mean of `clean_prob` over the data is
//! then π itself, so the labels are calibrated where noise looks like
//! random pairings. Noise that looks better than a random pairing (a
//! caption of a similar image) is partly counted as clean: on such data
//! the noise rate is underestimated.
//!
//! The calibration is fitted on pairs held out of training (whole images,
//! `runner::calibration_pairs`), which behave as new pairs do. Pairs the
//! networks trained on are told from random pairings among themselves,
//! moved up by what memorisation adds to a mismatched pair, or else read
//! at their quantile among the trained pairs ([`trained`]), so
//! memorisation does not make them look cleaner. Among themselves they
//! are ordered by their signals and, with a third of the weight, by the
//! method's own division of them, which read how each pair behaved in
//! training ([`trained::DivisionOrder`]); that changes which trained pair
//! holds which score, not the scores they hold.
//!
//! Everything is fitted once at the end of `fit` and kept in the
//! checkpoint, so a pair's `clean_prob` depends on the pair and the
//! checkpoint only: not on the file's other rows, their order or their
//! number.

pub mod isotonic;
pub mod null;
pub mod reference;
pub mod ridge;
pub mod signals;
pub mod trained;

use serde::{Deserialize, Serialize};

use isotonic::Isotonic;
pub use reference::Reference;

/// Random pairings drawn at most to describe mismatched pairs.
pub const MAX_NEGATIVES: usize = 20_000;

/// Fewest usable pairs (and pairings) the model is fitted on; below it the
/// method's division gives `clean_prob`.
pub const MIN_PAIRS: usize = 20;

/// The logistic function, without overflow for large |z|.
fn sigmoid(z: f64) -> f64 {
    if z >= 0.0 {
        1.0 / (1.0 + (-z).exp())
    } else {
        let e = z.exp();
        e / (1.0 + e)
    }
}

/// Quantile bins of the isotonic fit.
const BINS: usize = 200;

/// Share of the probability given to a strictly increasing function of
/// `u`, so that pairs the fit puts on one plateau (clipped to 0 or 1, or
/// between two equal knots) keep their order: `clean_prob` moves by at
/// most this much.
const ORDER_SHARE: f64 = 1e-3;

/// Quantiles of the random pairings' scores at which the noise share is
/// bounded ([`estimate_noise`]).
pub const NOISE_QUANTILES: &[f64] = &[0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5];

/// Signals a pair is scored by: similarity, neighbourhood, ridge.
pub const SIGNALS: usize = 3;

/// One weight (or origin) per signal, in [`SIGNALS`] order.
pub type Weights = [f64; SIGNALS];

/// Reads [`Weights`] from a checkpoint: three values, or two from before
/// the ridge signal (its weight and origin then 0: the score as it was).
fn padded<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Weights, D::Error> {
    let v: Vec<f64> = Deserialize::deserialize(d)?;
    pad(v).map_err(serde::de::Error::custom)
}

/// [`padded`] for an optional value.
fn padded_option<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Weights>, D::Error> {
    let v: Option<Vec<f64>> = Deserialize::deserialize(d)?;
    v.map(pad).transpose().map_err(serde::de::Error::custom)
}

fn pad(v: Vec<f64>) -> Result<Weights, String> {
    match v.len() {
        2 | SIGNALS => {
            let mut w = [0.0; SIGNALS];
            w[..v.len()].copy_from_slice(&v);
            Ok(w)
        }
        n => Err(format!("{n} values for {SIGNALS} signals")),
    }
}

/// The signals of some pairs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Signals {
    /// The similarity signal of each pair: its trained similarity, or
    /// that as a z-score against its caption's null where the model has
    /// one ([`null`]).
    pub similarity: Vec<f32>,
    /// Neighbourhood score of each pair ([`Reference::score`]).
    pub neighbourhood: Vec<f32>,
    /// Ridge signal of each pair ([`ridge`]); empty where the model has
    /// none (checkpoints from before it: the signal counts as 0).
    pub ridge: Vec<f32>,
    /// Hash of each pair's features ([`trained::pair_hash`]); empty where
    /// not computed.
    pub hashes: Vec<u64>,
}

impl Signals {
    /// Pair i's signals; the ridge signal 0 where there is none.
    pub fn row(&self, i: usize) -> [f32; SIGNALS] {
        [
            self.similarity[i],
            self.neighbourhood[i],
            self.ridge.get(i).copied().unwrap_or(0.0),
        ]
    }

    /// Number of pairs.
    pub fn len(&self) -> usize {
        self.similarity.len()
    }

    /// True without pairs.
    pub fn is_empty(&self) -> bool {
        self.similarity.is_empty()
    }

    /// Append another set's pairs (both with a ridge signal or both
    /// without).
    pub fn extend(&mut self, other: Signals) {
        self.similarity.extend(other.similarity);
        self.neighbourhood.extend(other.neighbourhood);
        self.ridge.extend(other.ridge);
        self.hashes.extend(other.hashes);
    }

    fn rows(&self) -> impl Iterator<Item = Row> + '_ {
        (0..self.len().min(self.neighbourhood.len()))
            .map(|i| self.row(i).map(f64::from))
            .filter(|x| x.iter().all(|v| v.is_finite()))
    }
}

/// The fitted map from a pair's signals to its clean probability.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// Mean of each signal over the random pairings: the origin of the
    /// score `u`.
    #[serde(deserialize_with = "padded")]
    pub origin: Weights,
    /// Weight of each signal in `u` ([`signal_weight`]).
    #[serde(deserialize_with = "padded")]
    pub weights: Weights,
    /// P(observed pair | u) with both kinds weighted equally.
    pub isotonic: Isotonic,
    /// The estimated share of pairs like random pairings, `1 − π`, read
    /// on the similarity and the neighbourhood score alone
    /// ([`Calibration::fit`]).
    pub noise: f64,
    /// Pairs the calibration was fitted on.
    pub pairs: usize,
    /// Random pairings it was fitted on.
    pub negatives: usize,
}

/// How much one signal counts in the score `u`, per unit of the signal:
/// its own separation of the observed pairs from the random pairings
/// (the difference of their means over the pooled standard deviation,
/// Cohen's d), divided by that deviation; 0 for a signal that does not
/// rank observed pairs above random ones. Each signal is weighted by what
/// it alone says, as a naive-Bayes sum of two Gaussian log-likelihood
/// ratios would: a joint fit (a logistic regression on both) gave the
/// neighbourhood score almost no weight on Flickr8k (0.13 against the
/// similarity's 1.77 in standard units), since on random swaps it repeats
/// what the similarity says, and ranked partly-right captions worse
/// (BENCHMARKS.md, "Graded agreement").
pub fn signal_weight(pos: &[f64], neg: &[f64]) -> f64 {
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let var =
        |v: &[f64], m: f64| v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / v.len().max(1) as f64;
    let (mp, mn) = (mean(pos), mean(neg));
    let pooled = ((var(pos, mp) + var(neg, mn)) / 2.0).sqrt();
    if pooled.is_nan() || pooled <= 1e-12 || mp <= mn {
        return 0.0;
    }
    (mp - mn) / pooled / pooled
}

/// One pair's (similarity, neighbourhood, ridge).
type Row = [f64; SIGNALS];

/// Usable rows (every signal finite) of pairs and of pairings, with each
/// signal's weight ([`signal_weight`]) from how it separates them; None
/// with fewer than [`MIN_PAIRS`] rows on either side or when neither the
/// similarity nor the neighbourhood score ranks the pairs above the
/// pairings. The one rule both the calibration
/// (held-out pairs) and the trained pairs ([`trained`]) are weighed by.
fn separation(pairs: &Signals, pairings: &Signals) -> Option<(Vec<Row>, Vec<Row>, Weights)> {
    let pos: Vec<Row> = pairs.rows().collect();
    let neg: Vec<Row> = pairings.rows().collect();
    if pos.len() < MIN_PAIRS || neg.len() < MIN_PAIRS {
        return None;
    }
    let column = |rows: &[Row], k: usize| rows.iter().map(|x| x[k]).collect::<Vec<f64>>();
    let weights: Weights =
        std::array::from_fn(|k| signal_weight(&column(&pos, k), &column(&neg, k)));
    (weights[..2] != [0.0, 0.0]).then_some((pos, neg, weights))
}

impl Calibration {
    /// Fit on the signals of the observed pairs and of random pairings;
    /// None with fewer than [`MIN_PAIRS`] usable ones of either, or when
    /// neither the similarity nor the neighbourhood score ranks the
    /// observed pairs above the random pairings.
    ///
    /// The noise share is read on the score of the similarity and the
    /// neighbourhood alone; the ridge signal joins the order and the
    /// density ratio only. With it in the reading, 20% boilerplate
    /// captions on Flickr8k read 0.155 noise where the two signals read
    /// 0.209: a boilerplate caption fits no image, so its pairs sit at the
    /// ridge null as random pairings of it do, but real captions paired at
    /// random fall further below it, and the pairings' lower tail holds
    /// only those (BENCHMARKS.md, "The ridge signal").
    pub fn fit(data: &Signals, pairings: &Signals) -> Option<Calibration> {
        let (pos, neg, weights) = separation(data, pairings)?;
        let mut origin = [0.0; SIGNALS];
        for (k, o) in origin.iter_mut().enumerate() {
            *o = neg.iter().map(|x| x[k]).sum::<f64>() / neg.len() as f64;
        }
        let mut cal = Calibration {
            origin,
            weights,
            isotonic: Isotonic { knots: Vec::new() },
            noise: 0.0,
            pairs: pos.len(),
            negatives: neg.len(),
        };
        let u_pos: Vec<f64> = pos.iter().map(|x| cal.score_row(x)).collect();
        let u_neg: Vec<f64> = neg.iter().map(|x| cal.score_row(x)).collect();
        // Both kinds weigh one half in all: the fit estimates the density
        // ratio, whatever the numbers drawn.
        cal.isotonic = Calibration::density_ratio_fit(&u_pos, &u_neg);
        let mut two = weights;
        two[2] = 0.0;
        let u2 = |rows: &[Row]| -> Vec<f64> {
            rows.iter().map(|x| cal.score_row_with(two, x)).collect()
        };
        cal.noise = estimate_noise(&u2(&pos), &u2(&neg));
        Some(cal)
    }

    fn score_row(&self, x: &Row) -> f64 {
        self.score_row_with(self.weights, x)
    }

    /// `Σ w_k (x_k − origin_k)`; a signal of weight 0 adds nothing, even
    /// where it is not a number (a model without the ridge signal).
    fn score_row_with(&self, w: Weights, x: &Row) -> f64 {
        (0..SIGNALS)
            .filter(|&k| w[k] != 0.0)
            .map(|k| w[k] * (x[k] - self.origin[k]))
            .sum()
    }

    /// The score of one pair's signals ([`Signals::row`]) with other
    /// weights about the same origin (the trained pairs' own:
    /// [`trained`]); NaN where a weighed signal is not a finite number.
    pub fn score_with(&self, weights: Weights, row: [f32; SIGNALS]) -> f64 {
        let x = row.map(f64::from);
        if (0..SIGNALS).any(|k| (k < 2 || weights[k] != 0.0) && !x[k].is_finite()) {
            return f64::NAN;
        }
        self.score_row_with(weights, &x)
    }

    /// [`Calibration::scores`] with other weights of the signals.
    pub fn scores_weighted(&self, s: &Signals, weights: Weights) -> Vec<f64> {
        (0..s.len())
            .map(|i| self.score_with(weights, s.row(i)))
            .collect()
    }

    /// The score `u` of every pair of `s`; NaN where a signal is not a
    /// finite number.
    pub fn scores(&self, s: &Signals) -> Vec<f64> {
        self.scores_weighted(s, self.weights)
    }

    /// The score `u` of one pair's signals ([`Signals::row`]).
    pub fn score(&self, row: [f32; SIGNALS]) -> f64 {
        self.score_with(self.weights, row)
    }

    /// The clean probability of one pair; 0 when a signal it weighs is not
    /// a finite number (a pair the model cannot measure is never clean).
    pub fn clean_prob(&self, row: [f32; SIGNALS]) -> f32 {
        let u = self.score(row);
        if !u.is_finite() {
            return 0.0;
        }
        self.clean_prob_at(u)
    }

    /// The clean probability at score `u` ([`Calibration::score`]).
    pub fn clean_prob_at(&self, u: f64) -> f32 {
        self.clean_prob_through(&self.isotonic, u)
    }

    /// The clean probability at score `u` with another fit of
    /// P(observed | u) (the trained pairs' own: [`trained`]) and this
    /// calibration's noise share.
    pub fn clean_prob_through(&self, isotonic: &Isotonic, u: f64) -> f32 {
        if !u.is_finite() {
            return 0.0;
        }
        let g = isotonic.at(u);
        let ratio = (1.0 - g) / g.max(1e-12);
        let p = (1.0 - self.noise * ratio).clamp(0.0, 1.0);
        ((1.0 - ORDER_SHARE) * p + ORDER_SHARE * sigmoid(u)) as f32
    }

    /// P(observed | u) fitted on pairs' scores against random pairings'
    /// (NaN scores left out), both kinds weighing one half in all: the
    /// density ratio behind [`Calibration::clean_prob_at`].
    pub fn density_ratio_fit(pairs: &[f64], pairings: &[f64]) -> Isotonic {
        let finite = |v: &[f64]| {
            v.iter()
                .copied()
                .filter(|x| x.is_finite())
                .collect::<Vec<_>>()
        };
        let (pos, neg) = (finite(pairs), finite(pairings));
        let u: Vec<f64> = pos.iter().chain(&neg).copied().collect();
        let label: Vec<bool> = (0..u.len()).map(|i| i < pos.len()).collect();
        let (np, nn) = (pos.len() as f64, neg.len() as f64);
        let weight: Vec<f64> = label
            .iter()
            .map(|&l| if l { 0.5 / np } else { 0.5 / nn })
            .collect();
        Isotonic::fit(&u, &label, &weight, BINS)
    }

    /// Clean probabilities of many pairs.
    pub fn clean_probs(&self, s: &Signals) -> Vec<f32> {
        (0..s.len()).map(|i| self.clean_prob(s.row(i))).collect()
    }
}

/// The share of observed pairs distributed like the random pairings, from
/// scores `u` of both (higher = more like an observed pair).
///
/// At each threshold `t` (the [`NOISE_QUANTILES`] of the pairings' scores)
/// `F_data(t) / F_neg(t)` bounds it from above: matched pairs below `t`
/// only raise the ratio. Each ratio is an estimate with its own sampling
/// error, and the smallest of several noisy estimates is biased low: with
/// 3,000 pairs, by 0.02 at 20% noise and 0.04 at 70% (simulated with
/// normal scores; Flickr8k gave 0.173 for 0.20, 0.453 for 0.50 and 0.616
/// for 0.70). So each ratio is raised by one binomial standard error of
/// `F_data(t)` before the smallest is taken, which removes that bias in
/// the same simulations (within ±0.007 at 0–90% noise, 1,000–3,000 pairs)
/// and lowers its spread. In [0, 1].
pub fn estimate_noise(data: &[f64], pairings: &[f64]) -> f64 {
    if data.is_empty() || pairings.is_empty() {
        return 0.0;
    }
    let mut neg = pairings.to_vec();
    neg.sort_by(f64::total_cmp);
    let mut pos = data.to_vec();
    pos.sort_by(f64::total_cmp);
    let n = pos.len() as f64;
    let mut best = f64::INFINITY;
    for &q in NOISE_QUANTILES {
        let k = ((q * neg.len() as f64).ceil() as usize).clamp(1, neg.len());
        let t = neg[k - 1];
        let f_neg = neg.partition_point(|&v| v <= t) as f64 / neg.len() as f64;
        let f_data = pos.partition_point(|&v| v <= t) as f64 / n;
        let se = (f_data * (1.0 - f_data) / n).sqrt();
        best = best.min((f_data + se) / f_neg);
    }
    best.clamp(0.0, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic normal sample (Box–Muller over SplitMix64).
    fn normals(seed: u64, n: usize, mean: f64, sd: f64) -> Vec<f64> {
        let mut rng = ncclean_models::rng::Rng::new(seed);
        (0..n).map(|_| mean + sd * rng.normal()).collect()
    }

    #[test]
    fn noise_share_is_the_smallest_upper_bound() {
        // Pairings 0.0, 0.1, ..., 0.9; data 0.0, 0.25 and 0.45, then seven
        // far above (n = 10). Per quantile q, t is the ceil(10 q)-th
        // pairing, and the bound is (F_data + sqrt(F_data (1 - F_data) / 10))
        // / F_neg:
        // q 0.05, 0.1: t 0.0, (0.1 + 0.0949) / 0.1 = 1.949;
        // q 0.15, 0.2: t 0.1, (0.1 + 0.0949) / 0.2 = 0.974;
        // q 0.3: t 0.2, (0.1 + 0.0949) / 0.3 = 0.6495;
        // q 0.4: t 0.3, (0.2 + 0.1265) / 0.4 = 0.816;
        // q 0.5: t 0.4, (0.2 + 0.1265) / 0.5 = 0.653.
        // The smallest is 1/3 + sqrt(0.009) / 0.3.
        let neg: Vec<f64> = (0..10).map(|i| f64::from(i) / 10.0).collect();
        let data = [0.0, 0.25, 0.45, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0];
        let est = estimate_noise(&data, &neg);
        let want = 1.0 / 3.0 + 0.009f64.sqrt() / 0.3;
        assert!((est - want).abs() < 1e-12, "{est} against {want}");
        assert_eq!(estimate_noise(&[], &neg), 0.0);
        // Data all above every pairing: no noise.
        assert_eq!(estimate_noise(&[9.0; 5], &neg), 0.0);
        // All like the pairings: all noise (clipped to 1).
        assert_eq!(estimate_noise(&neg, &neg), 1.0);
    }

    #[test]
    fn the_noise_estimate_is_unbiased_across_rates() {
        // Data of 3,000 pairs, a share p drawn like 20,000 pairings
        // (N(0, 1)) and the rest matched (N(3, 1)); 40 draws per rate. The
        // plain smallest ratio averaged 0.02-0.05 below p here; one
        // standard error above it is within 0.01 on average and every
        // draw within 0.06.
        for (r, &p) in [0.0, 0.2, 0.5, 0.7, 0.9].iter().enumerate() {
            let mut sum = 0.0;
            let draws = 40;
            for d in 0..draws {
                let seed = 1000 * r as u64 + d;
                let n = 3000;
                let noisy = (p * n as f64).round() as usize;
                let mut data = normals(seed, noisy, 0.0, 1.0);
                data.extend(normals(seed + 500, n - noisy, 3.0, 1.0));
                let neg = normals(seed + 900, 20_000, 0.0, 1.0);
                let est = estimate_noise(&data, &neg);
                assert!((est - p).abs() < 0.12, "p {p} draw {d}: {est}");
                sum += est;
            }
            let mean = sum / draws as f64;
            assert!((mean - p).abs() < 0.01, "p {p}: mean estimate {mean}");
        }
    }

    #[test]
    fn a_signal_weighs_its_own_separation_per_unit() {
        // Means 3 and 1, both variances 1: d = 2, per unit of the signal
        // 2 / 1. Scaled by 10: d is still 2, the weight per unit 2 / 10.
        let pos = [2.0, 4.0];
        let neg = [0.0, 2.0];
        assert!((signal_weight(&pos, &neg) - 2.0).abs() < 1e-12);
        let scaled = |v: &[f64]| v.iter().map(|x| x * 10.0).collect::<Vec<_>>();
        assert!((signal_weight(&scaled(&pos), &scaled(&neg)) - 0.2).abs() < 1e-12);
        // Reversed or constant: no weight.
        assert_eq!(signal_weight(&neg, &pos), 0.0);
        assert_eq!(signal_weight(&[1.0, 1.0], &[1.0, 1.0]), 0.0);
    }

    #[test]
    fn calibrated_where_noise_looks_like_random_pairings() {
        // Matched pairs: similarity ~ N(0.6, 0.1), neighbourhood ~
        // N(0.5, 0.1); random pairings ~ N(0.1, 0.1) and N(0.2, 0.1). The
        // data are 70% matched, 30% drawn like the pairings.
        let n = 6000;
        let noisy = n * 3 / 10;
        let mut sim = normals(1, n - noisy, 0.6, 0.1);
        sim.extend(normals(2, noisy, 0.1, 0.1));
        let mut nb = normals(3, n - noisy, 0.5, 0.1);
        nb.extend(normals(4, noisy, 0.2, 0.1));
        let f = |v: Vec<f64>| v.into_iter().map(|x| x as f32).collect::<Vec<f32>>();
        let data = Signals {
            similarity: f(sim),
            neighbourhood: f(nb),
            ..Default::default()
        };
        let pairings = Signals {
            similarity: f(normals(5, n, 0.1, 0.1)),
            neighbourhood: f(normals(6, n, 0.2, 0.1)),
            ..Default::default()
        };
        let cal = Calibration::fit(&data, &pairings).expect("fitted");
        assert!((cal.noise - 0.3).abs() < 0.03, "noise {}", cal.noise);
        let p = cal.clean_probs(&data);
        let mean = p.iter().map(|&v| f64::from(v)).sum::<f64>() / n as f64;
        assert!((mean - 0.7).abs() < 0.03, "mean clean_prob {mean}");
        // Higher in both signals (no ridge signal), higher probability; and the matched half
        // outranks the noisy one.
        assert!(cal.clean_prob([0.7, 0.6, 0.0]) > cal.clean_prob([0.3, 0.3, 0.0]));
        let matched =
            p[..n - noisy].iter().filter(|&&v| v >= 0.5).count() as f64 / (n - noisy) as f64;
        let caught = p[n - noisy..].iter().filter(|&&v| v < 0.5).count() as f64 / noisy as f64;
        assert!(matched > 0.97 && caught > 0.97, "{matched} {caught}");
        // A signal that cannot be measured is never clean.
        assert_eq!(cal.clean_prob([f32::NAN, 0.5, 0.0]), 0.0);
        // Too few pairs: no model.
        let few = Signals {
            similarity: vec![0.5; 5],
            neighbourhood: vec![0.5; 5],
            ..Default::default()
        };
        assert!(Calibration::fit(&few, &pairings).is_none());
    }

    #[test]
    fn a_calibration_from_before_the_ridge_signal_reads_as_it_did() {
        // Two weights and origins (a checkpoint from before the ridge
        // signal): the third is 0, and a pair's probability does not
        // depend on its ridge signal, even one that is not a number.
        let old = serde_json::json!({
            "origin": [0.1, 0.2],
            "weights": [2.0, 1.0],
            "isotonic": {"knots": [[-1.0, 0.1], [1.0, 0.9]]},
            "noise": 0.3,
            "pairs": 100,
            "negatives": 100,
        });
        let cal: Calibration = serde_json::from_value(old.clone()).expect("two signals");
        assert_eq!(cal.origin, [0.1, 0.2, 0.0]);
        assert_eq!(cal.weights, [2.0, 1.0, 0.0]);
        // u = 2 (0.5 − 0.1) + 1 (0.3 − 0.2) = 0.9.
        assert!((cal.score([0.5, 0.3, f32::NAN]) - 0.9).abs() < 1e-6);
        let p = cal.clean_prob([0.5, 0.3, 0.0]);
        assert_eq!(p.to_bits(), cal.clean_prob([0.5, 0.3, f32::NAN]).to_bits());
        assert_eq!(p.to_bits(), cal.clean_prob([0.5, 0.3, 7.0]).to_bits());
        // With a ridge weight the signal counts, and one that is not a
        // number makes the pair unmeasurable.
        let mut with = cal.clone();
        with.weights[2] = 1.0;
        assert!((with.score([0.5, 0.3, 0.4]) - 1.3).abs() < 1e-6);
        assert_eq!(with.clean_prob([0.5, 0.3, f32::NAN]), 0.0);
        // A round trip keeps three; four values are refused.
        let back: Calibration =
            serde_json::from_value(serde_json::to_value(&with).expect("saved")).expect("read");
        assert_eq!(back, with);
        let mut four = old;
        four["weights"] = serde_json::json!([1.0, 1.0, 1.0, 1.0]);
        let err = serde_json::from_value::<Calibration>(four).expect_err("four");
        assert!(err.to_string().contains("4 values for 3 signals"), "{err}");
    }

    #[test]
    fn the_noise_share_is_read_without_the_ridge_signal() {
        // Matched pairs and random pairings as in the test above on the
        // first two signals; a third signal that puts every observed pair
        // far above every pairing would read no noise if it counted.
        let n = 4000;
        let noisy = n * 3 / 10;
        let f = |v: Vec<f64>| v.into_iter().map(|x| x as f32).collect::<Vec<f32>>();
        let mut sim = normals(21, n - noisy, 0.6, 0.1);
        sim.extend(normals(22, noisy, 0.1, 0.1));
        let mut nb = normals(23, n - noisy, 0.5, 0.1);
        nb.extend(normals(24, noisy, 0.2, 0.1));
        let data = Signals {
            similarity: f(sim),
            neighbourhood: f(nb),
            ridge: f(normals(25, n, 5.0, 0.1)),
            hashes: Vec::new(),
        };
        let pairings = Signals {
            similarity: f(normals(26, n, 0.1, 0.1)),
            neighbourhood: f(normals(27, n, 0.2, 0.1)),
            ridge: f(normals(28, n, 0.0, 0.1)),
            hashes: Vec::new(),
        };
        let cal = Calibration::fit(&data, &pairings).expect("fitted");
        assert!(cal.weights[2] > 0.0, "{:?}", cal.weights);
        assert!((cal.noise - 0.3).abs() < 0.03, "noise {}", cal.noise);
        // Without the first two signals' separation there is no model.
        let flat = |s: &Signals| Signals {
            similarity: vec![0.0; s.len()],
            neighbourhood: vec![0.0; s.len()],
            ..s.clone()
        };
        assert!(Calibration::fit(&flat(&data), &flat(&pairings)).is_none());
    }

    #[test]
    fn clean_data_is_called_clean() {
        let n = 4000;
        let f = |v: Vec<f64>| v.into_iter().map(|x| x as f32).collect::<Vec<f32>>();
        let data = Signals {
            similarity: f(normals(11, n, 0.6, 0.1)),
            neighbourhood: f(normals(12, n, 0.5, 0.1)),
            ..Default::default()
        };
        let pairings = Signals {
            similarity: f(normals(13, n, 0.1, 0.1)),
            neighbourhood: f(normals(14, n, 0.2, 0.1)),
            ..Default::default()
        };
        let cal = Calibration::fit(&data, &pairings).expect("fitted");
        let p = cal.clean_probs(&data);
        let mean = p.iter().map(|&v| f64::from(v)).sum::<f64>() / n as f64;
        assert!(
            cal.noise < 0.02 && mean > 0.97,
            "noise {} mean {mean}",
            cal.noise
        );
    }
}
