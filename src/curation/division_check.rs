//! Whether a run's division means anything: the checks behind the "no
//! signal", "no noise found", "noise understated" and "noise overstated"
//! warnings of `fit` (on a sample of the training pairs) and `score` (on
//! each file's first block).
//!
//! A two-component mixture always finds two components, even in data that
//! holds one population: on pairs the model cannot match (no signal) it
//! splits them about in half, on noise-free data it cuts off a tail and
//! calls it noise. The mixture alone cannot tell (its separation on
//! noise-free demo data is within the range of real noisy data), so the
//! trained model is asked directly: mismatched pairs should look like
//! random pairs, so the similarity of each pair is compared with the
//! similarities of random pairings of the same images and captions.
//!
//! - signal: the share of pairs more similar than 99% of the random
//!   pairings. Chance gives 1%; matched pairs the model recognises lie
//!   above, however many mismatched pairs there are (the AUROC against the
//!   random pairings, also reported, falls with the noise rate itself).
//! - random-like share: twice the share of pairs below the random
//!   pairings' median similarity. Mismatched pairs are random pairings, so
//!   half of them fall below it, and matched pairs seldom do: it estimates
//!   the noise rate from below, independent of the mixture. It says when
//!   data look noise-free, and when a cut removes clearly fewer pairs than
//!   already look mismatched (a mixture that failed to separate them).
//! - the signal share again, from the other side: random pairings land
//!   above their own 99th percentile 1% of the time, so all but about 1
//!   point of the pairs there are matched; a cut that keeps clearly fewer
//!   removes pairs that plainly match (a model scoring data unlike its
//!   training data, or a mixture fitted to another noise rate).

use ncclean_pipelines::division::{Division, Fallback, Mixture};
use serde::{Deserialize, Serialize};

use crate::curation::threshold::percent;

/// Most pairs the check compares (its similarity matrix is this squared).
pub const SAMPLE_PAIRS: usize = 1024;
/// Fewest sampled pairs the check judges a division on: below, one pair
/// moves a share by over 1 point and chance alone crosses the margins.
pub const MIN_PAIRS: usize = 100;
/// Below this share of pairs above the random pairings' 99th percentile
/// (chance: 0.01) the model tells pairs from random pairings too poorly for
/// any division.
pub const MIN_MATCHED_SHARE: f64 = 0.05;
/// At most this AUROC of the pairs against random pairings (chance's 0.5,
/// and float rounding of a tie) marks a model that ranks its pairs no higher
/// than random pairings ([`SignalCheck::no_signal`]).
pub const COLLAPSED_AUROC: f64 = 0.5 + 1e-9;
/// At most this random-like share counts as noise-free data.
pub const NOISE_FREE_SHARE: f64 = 0.02;
/// The mixture's noise estimate must exceed the random-like share by this
/// much before the cut is said to remove clean pairs.
pub const OVERSTATED_BY: f64 = 0.05;
/// The random-like share must exceed the share a cut removes by this much
/// before the cut is said to keep mismatched pairs. The share is a lower
/// bound of the noise rate, but a sampled one: on [`SAMPLE_PAIRS`] pairs its
/// standard error is at most 0.03, so 0.10 is over three of them.
pub const UNDERSTATED_BY: f64 = 0.10;
/// The kept share must fall short of the signal share (less chance's 1
/// point) by this much before the cut is said to remove matched pairs.
pub const OVERSTATED_CUT_BY: f64 = 0.10;

/// The model's similarity of pairs against random pairings, on a sample.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SignalCheck {
    /// Pairs in the sample.
    pub pairs: usize,
    /// AUROC of the pairs' similarities against the random pairings'.
    pub auroc: f64,
    /// Share of pairs above the random pairings' 99th percentile.
    pub matched_share: f64,
    /// Twice the share of pairs below the random pairings' median, at most 1.
    pub random_like_share: f64,
}

/// Evenly spaced positions of at most [`SAMPLE_PAIRS`] of `n` pairs.
pub fn sample(n: usize) -> Vec<usize> {
    let m = n.min(SAMPLE_PAIRS);
    (0..m).map(|i| i * n / m).collect()
}

impl SignalCheck {
    /// The check on an `m × m` similarity matrix (row-major) of `m` pairs'
    /// images against their captions: the diagonal holds the pairs, the
    /// rest random pairings. `None` with fewer than 2 pairs.
    pub fn of(sim: &[f32], m: usize) -> Option<SignalCheck> {
        if m < 2 || sim.len() != m * m {
            return None;
        }
        let mut scores = Vec::with_capacity(m * m);
        let mut is_pair = Vec::with_capacity(m * m);
        let mut others = Vec::with_capacity(m * (m - 1));
        for i in 0..m {
            for j in 0..m {
                let s = f64::from(sim[i * m + j]);
                scores.push(s);
                is_pair.push(i == j);
                if i != j {
                    others.push(s);
                }
            }
        }
        let auroc = crate::curation::metrics::auroc(&scores, &is_pair)?;
        others.sort_by(f64::total_cmp);
        let median = others[others.len() / 2];
        let p99 = others[(others.len() * 99 / 100).min(others.len() - 1)];
        let above = (0..m).filter(|&i| f64::from(sim[i * m + i]) > p99).count();
        let below = (0..m)
            .filter(|&i| f64::from(sim[i * m + i]) < median)
            .count();
        Some(SignalCheck {
            pairs: m,
            auroc,
            matched_share: above as f64 / m as f64,
            random_like_share: (2.0 * below as f64 / m as f64).min(1.0),
        })
    }

    /// How far the random-like share must exceed the removed share before
    /// the cut is said to keep mismatched pairs: [`UNDERSTATED_BY`], or
    /// three standard errors of the sampled share where that is more (the
    /// share is twice a sampled proportion: its standard error is at most
    /// `1 / sqrt(pairs)`, 0.031 on [`SAMPLE_PAIRS`], 0.1 on 100).
    pub fn understated_margin(&self) -> f64 {
        UNDERSTATED_BY.max(3.0 / (self.pairs as f64).sqrt())
    }

    /// How far the kept share must fall short of the matched share (less
    /// chance's 1 point) before the cut is said to remove matched pairs:
    /// [`OVERSTATED_CUT_BY`], or three standard errors of the sampled share
    /// where that is more (at most `0.5 / sqrt(pairs)` each).
    pub fn overstated_margin(&self) -> f64 {
        OVERSTATED_CUT_BY.max(1.5 / (self.pairs as f64).sqrt())
    }

    /// What these numbers say is wrong with a division that estimates
    /// `estimated_noise_rate` noise and whose cut removes `removed_share` of
    /// the pairs, if anything; nothing on fewer than [`MIN_PAIRS`] pairs.
    /// A cut that removes plainly matched pairs is wrong only when it
    /// `follows_division` ([`Rule::follows_division`]); a share or precision
    /// the user chose may cost matched pairs on purpose.
    ///
    /// [`Rule::follows_division`]: crate::curation::threshold::Rule::follows_division
    pub fn verdict(
        &self,
        estimated_noise_rate: f64,
        removed_share: f64,
        follows_division: bool,
    ) -> Option<Verdict> {
        if self.pairs < MIN_PAIRS {
            None
        } else if self.matched_share < MIN_MATCHED_SHARE {
            Some(Verdict::NoSignal)
        } else if self.random_like_share <= NOISE_FREE_SHARE
            && estimated_noise_rate >= self.random_like_share + OVERSTATED_BY
        {
            Some(Verdict::NoNoise)
        } else if self.random_like_share >= removed_share + self.understated_margin() {
            Some(Verdict::Understated)
        } else if follows_division
            && 1.0 - removed_share <= self.matched_share - 0.01 - self.overstated_margin()
        {
            Some(Verdict::Overstated)
        } else {
            None
        }
    }

    /// Whether the model cannot tell its pairs from random pairings at all:
    /// too few pairs above the random pairings' 99th percentile for any
    /// division ([`Verdict::NoSignal`], on at least [`MIN_PAIRS`] pairs),
    /// and its pairs ranked no higher than the random pairings (AUROC at
    /// most [`COLLAPSED_AUROC`]). Its clean_prob would sort pairs at random,
    /// so no filter may be made of it. A collapsed model (every similarity
    /// the same, as after a learning rate far too high: AUROC exactly 0.5)
    /// is the plainest case. A model barely above chance (one short epoch on
    /// a few hundred pairs: AUROC 0.52 to 0.6) is only warned of: within
    /// sampling error of chance, it may still have learnt a little.
    pub fn no_signal(&self) -> bool {
        self.verdict(0.0, 0.0, false) == Some(Verdict::NoSignal) && self.auroc <= COLLAPSED_AUROC
    }

    /// Why a model without signal ([`SignalCheck::no_signal`]) gives no
    /// labels: the numbers, and what to try.
    pub fn no_signal_reason(&self) -> String {
        format!(
            "the trained model cannot tell its pairs from random pairings of the same images and \
             captions ({} of {} pairs above 99% of the random pairings, chance is 1%; AUROC \
             {:.3}), so its clean_prob would call pairs clean or noisy at random",
            percent(self.matched_share),
            self.pairs,
            self.auroc
        )
    }

    /// `fit`'s warnings: those the [`SignalCheck::verdict`] calls for, given
    /// the labels' estimated noise rate, the share of the pairs the cut
    /// removes, whether the cut follows the division, and what estimated
    /// the noise (`estimator`: the mixture with its component means and
    /// separation, or the final clean-probability model).
    pub fn warnings(
        &self,
        estimated_noise_rate: f64,
        removed_share: f64,
        follows_division: bool,
        estimator: &str,
    ) -> Vec<String> {
        let Some(verdict) = self.verdict(estimated_noise_rate, removed_share, follows_division)
        else {
            return Vec::new();
        };
        vec![match verdict {
            Verdict::NoSignal => format!(
                "no signal: the trained model scores pairs barely above random pairings of the same \
                 images and captions ({} of {} pairs above 99% of the random pairings, chance is 1%; \
                 AUROC {:.3}), so clean_prob and the noise rate {estimator} estimates ({}) \
                 mean little; check that the image and caption columns belong together and that \
                 the towers suit the data",
                percent(self.matched_share),
                self.pairs,
                self.auroc,
                percent(estimated_noise_rate)
            ),
            Verdict::NoNoise => format!(
                "no noise found: only {} of {} pairs score like random pairings (twice the share \
                 below their median similarity), yet {estimator} estimates {} noise; \
                 the data look noise-free and the division cuts off clean pairs: keep more with \
                 --min-prob or --remove-noise-rate R",
                percent(self.random_like_share),
                self.pairs,
                percent(estimated_noise_rate)
            ),
            Verdict::Understated => format!(
                "noise understated: {} of {} pairs score like random pairings (twice the share \
                 below their median similarity, a lower bound of the noise rate), yet \
                 {estimator} estimates {} noise and the cut removes {}: the kept pairs \
                 include many that look mismatched; remove at least that share with \
                 --remove-noise-rate {:.2}, or try another --method",
                percent(self.random_like_share),
                self.pairs,
                percent(estimated_noise_rate),
                percent(removed_share),
                self.random_like_share
            ),
            Verdict::Overstated => format!(
                "noise overstated: {} of {} pairs score above 99% of random pairings (nearly all \
                 matched pairs: chance puts 1% of random ones there), yet {estimator} \
                 estimates {} noise and the cut keeps only {}: it removes pairs that plainly \
                 match; remove at most {:.2} with --remove-noise-rate, or keep more with \
                 --min-prob",
                percent(self.matched_share),
                self.pairs,
                percent(estimated_noise_rate),
                percent(1.0 - removed_share),
                (1.01 - self.matched_share).min(1.0)
            ),
        }]
    }

    /// `score`'s warning about one input file, whose pairs the trained
    /// model's clean_prob estimates `estimated_noise_rate` noise in and whose
    /// cut removes `removed_share` of: the [`SignalCheck::verdict`] in terms
    /// of a file scored with a model trained elsewhere.
    pub fn score_warning(
        &self,
        file: &str,
        estimated_noise_rate: f64,
        removed_share: f64,
        follows_division: bool,
    ) -> Option<String> {
        let verdict = self.verdict(estimated_noise_rate, removed_share, follows_division)?;
        Some(match verdict {
            Verdict::NoSignal => format!(
                "{file}: no signal: the model scores this file's pairs barely above random \
                 pairings of its own images and captions ({} of {} pairs above 99% of the random \
                 pairings, chance is 1%; AUROC {:.3}), so their clean_prob and is_clean mean \
                 little; check that the file is laid out like the training data (the same \
                 columns, images and captions that belong together), or fit a model on data \
                 like it",
                percent(self.matched_share),
                self.pairs,
                self.auroc
            ),
            Verdict::NoNoise => format!(
                "{file}: no noise found: only {} of {} pairs score like random pairings (twice \
                 the share below their median similarity), yet clean_prob estimates {} noise and \
                 the cut removes {}: the file looks noise-free and the cut drops clean pairs; \
                 keep more with --min-prob",
                percent(self.random_like_share),
                self.pairs,
                percent(estimated_noise_rate),
                percent(removed_share)
            ),
            Verdict::Understated => format!(
                "{file}: noise understated: {} of {} pairs score like random pairings (twice the \
                 share below their median similarity, a lower bound of the noise rate), yet \
                 clean_prob estimates {} noise and the cut removes {}: the kept pairs include \
                 many that look mismatched, as when a file's noise or content differs from the \
                 training data's; raise the cut with --min-prob, or fit a model on data like it",
                percent(self.random_like_share),
                self.pairs,
                percent(estimated_noise_rate),
                percent(removed_share)
            ),
            Verdict::Overstated => format!(
                "{file}: noise overstated: {} of {} pairs score above 99% of random pairings \
                 (nearly all matched pairs: chance puts 1% of random ones there), yet clean_prob \
                 estimates {} noise and the cut keeps only {}: it removes pairs that plainly \
                 match, as when a file's noise or content differs from the training data's; \
                 lower the cut with --min-prob, or fit a model on data like it",
                percent(self.matched_share),
                self.pairs,
                percent(estimated_noise_rate),
                percent(1.0 - removed_share)
            ),
        })
    }
}

/// What a [`SignalCheck`] finds wrong with a division.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The model tells pairs from random pairings too poorly for any
    /// division.
    NoSignal,
    /// The data look noise-free, yet the division estimates noise.
    NoNoise,
    /// The cut removes clearly fewer pairs than already look mismatched.
    Understated,
    /// The cut keeps clearly fewer pairs than plainly match.
    Overstated,
}

/// The final division's mixture in numbers people can judge (stats.json
/// and the warnings): where the components sit on the normalised score
/// scale, how far apart, and how much the noisy one weighs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MixtureSummary {
    /// `gmm` or `bmm`; `none` when the division fell back without one.
    pub kind: &'static str,
    /// Mean of the clean component.
    pub clean_mean: Option<f64>,
    /// Mean of the noisy component.
    pub noisy_mean: Option<f64>,
    /// Weight of the noisy component.
    pub noisy_weight: Option<f64>,
    /// Ashman's D, `sqrt(2) |mean difference| / sqrt(var1 + var2)`: two
    /// components with D under 2 make one hump, not two.
    pub separation: Option<f64>,
    /// Why the division fell back to calling every pair clean, if it did.
    pub fallback: Option<String>,
}

impl MixtureSummary {
    /// Summarise a fitted division.
    pub fn of(d: &Division) -> MixtureSummary {
        let fallback = d.fallback.as_ref().and_then(|f| match f {
            Fallback::TooFew { n } => Some(format!("only {n} finite scores")),
            Fallback::Constant => Some("every score is the same".to_string()),
            Fallback::Collapsed { weight } => {
                Some(format!("a single component: the other weighs {weight:.4}"))
            }
            Fallback::NonFinite { .. } => None,
        });
        let Some(m) = d.mixture.as_ref().filter(|_| d.clean_component < 2) else {
            return MixtureSummary {
                kind: "none",
                clean_mean: None,
                noisy_mean: None,
                noisy_weight: None,
                separation: None,
                fallback,
            };
        };
        let (kind, variances) = match m {
            Mixture::Gmm(g) => ("gmm", g.variances),
            Mixture::Bmm(b) => (
                "bmm",
                [0, 1].map(|k| {
                    let (a, b) = (b.alphas[k], b.betas[k]);
                    a * b / ((a + b) * (a + b) * (a + b + 1.0))
                }),
            ),
        };
        let (c, n) = (d.clean_component, 1 - d.clean_component);
        let means = m.means();
        MixtureSummary {
            kind,
            clean_mean: Some(means[c]),
            noisy_mean: Some(means[n]),
            noisy_weight: Some(m.weights()[n]),
            separation: Some(
                std::f64::consts::SQRT_2 * (means[0] - means[1]).abs()
                    / (variances[0] + variances[1]).sqrt(),
            ),
            fallback,
        }
    }

    /// One clause for messages: `clean component at 0.72, noisy at 0.31
    /// weighing 29%, separation D 2.20`.
    pub fn describe(&self) -> String {
        match (
            self.clean_mean,
            self.noisy_mean,
            self.noisy_weight,
            self.separation,
        ) {
            (Some(c), Some(n), Some(w), Some(d)) => format!(
                "{} clean component at {c:.2}, noisy at {n:.2} weighing {}, separation D {d:.2}",
                self.kind,
                percent(w)
            ),
            _ => format!(
                "no mixture: {}",
                self.fallback.as_deref().unwrap_or("not fitted")
            ),
        }
    }

    /// The warning a fallback calls for: the division found one population.
    pub fn warning(&self) -> Option<String> {
        self.fallback.as_ref().map(|f| {
            format!(
                "no noise found: the division fell back to one population ({f}), so every pair \
                 is called clean; the data may be noise-free, or too small to divide"
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_evenly_spaced_and_bounded() {
        assert_eq!(sample(4), [0, 1, 2, 3]);
        let s = sample(10 * SAMPLE_PAIRS);
        assert_eq!(
            (s.len(), s[1], s[SAMPLE_PAIRS - 1]),
            (SAMPLE_PAIRS, 10, 10 * 1023)
        );
    }

    #[test]
    fn matched_pairs_show_signal_and_no_random_like_pairs() {
        // 3 pairs: every pair 0.9, every random pairing 0.1.
        let sim = [0.9, 0.1, 0.1, 0.1, 0.9, 0.1, 0.1, 0.1, 0.9];
        let c = SignalCheck::of(&sim, 3).unwrap();
        assert_eq!(
            (c.auroc, c.random_like_share, c.matched_share),
            (1.0, 0.0, 1.0)
        );
        // Three pairs are too few to judge a division by.
        assert!(c.warnings(0.3, 0.3, true, "").is_empty());
        // On as many as a sample holds, a mixture estimating 30% noise here
        // is cutting off clean pairs.
        let c = SignalCheck { pairs: 1024, ..c };
        let w = c.warnings(0.3, 0.3, true, "the mixture (means 0.1 and 0.5)");
        assert_eq!(w.len(), 1);
        assert!(
            w[0].starts_with("no noise found: only 0% of 1024 pairs"),
            "{}",
            w[0]
        );
        assert!(
            w[0].contains("yet the mixture (means 0.1 and 0.5) estimates 30% noise;"),
            "{}",
            w[0]
        );
        // An estimate near the random-like share is no warning.
        assert!(c.warnings(0.04, 0.0, true, "").is_empty());
    }

    #[test]
    fn a_noisy_pair_is_random_like_and_no_signal_is_said() {
        // Pair 1 (0.1) sits below the random pairings' median (0.3): 2 × 1/4.
        #[rustfmt::skip]
        let sim = [
            0.9, 0.3, 0.3, 0.3,
            0.2, 0.1, 0.5, 0.3,
            0.3, 0.4, 0.9, 0.3,
            0.3, 0.3, 0.2, 0.9,
        ];
        let c = SignalCheck::of(&sim, 4).unwrap();
        assert_eq!(c.random_like_share, 0.5);
        // 12 random pairings; pairs 0.9 beat all 12 (×3), 0.1 beats none:
        // (36 + 0) / 48.
        assert!((c.auroc - 36.0 / 48.0).abs() < 1e-12, "{}", c.auroc);
        // The 99th percentile of the 12 is the largest, 0.5: 3 of 4 above.
        assert_eq!(c.matched_share, 0.75);
        assert!(c.warnings(0.5, 0.5, true, "").is_empty());
        // Pairs no more similar than random pairings: AUROC 0.5.
        let flat = [0.5f32; 9];
        let c = SignalCheck::of(&flat, 3).unwrap();
        assert_eq!((c.auroc, c.matched_share), (0.5, 0.0));
        assert!(c.warnings(0.46, 0.5, true, "").is_empty());
        assert!(!c.no_signal(), "3 pairs are too few to judge");
        let c = SignalCheck { pairs: 1024, ..c };
        assert!(c.no_signal());
        // A weak model, above chance, is warned of only.
        assert!(!SignalCheck { auroc: 0.52, ..c }.no_signal());
        assert!(SignalCheck { auroc: 0.46, ..c }.no_signal());
        assert!(
            c.no_signal_reason().contains(
                "(0% of 1024 pairs above 99% of the random pairings, chance is 1%; AUROC 0.500)"
            ),
            "{}",
            c.no_signal_reason()
        );
        let w = c.warnings(0.46, 0.5, true, "the mixture (separation 0.8)");
        assert!(w[0].starts_with("no signal: "), "{}", w[0]);
        assert!(
            w[0].contains(
                "(0% of 1024 pairs above 99% of the random pairings, chance is 1%; AUROC 0.500)"
            ),
            "{}",
            w[0]
        );
        assert!(
            w[0].contains(
                "so clean_prob and the noise rate the mixture (separation 0.8) estimates (46%) \
                 mean little; check"
            ),
            "{}",
            w[0]
        );
        assert_eq!(SignalCheck::of(&[1.0], 1), None);
    }

    #[test]
    fn a_cut_that_keeps_random_like_pairs_is_said_to_understate_noise() {
        // Pairs 1 and 2 sit below the random pairings' median (0.3): a
        // random-like share of 2 × 2/4 = 1. Pairs 0 and 3 beat their 99th
        // percentile (0.45), so there is a signal: 2 of 4 above it.
        #[rustfmt::skip]
        let sim = [
            0.9, 0.3, 0.3, 0.3,
            0.3, 0.1, 0.45, 0.3,
            0.3, 0.3, 0.2, 0.3,
            0.3, 0.3, 0.3, 0.9,
        ];
        let c = SignalCheck::of(&sim, 4).unwrap();
        assert_eq!((c.random_like_share, c.matched_share), (1.0, 0.5));
        assert!(c.warnings(0.21, 0.25, true, "").is_empty());
        let c = SignalCheck { pairs: 1024, ..c };
        let w = c.warnings(0.21, 0.25, true, "the mixture (bmm separation D 0.25)");
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!(
            w[0],
            "noise understated: 100% of 1024 pairs score like random pairings (twice the share \
             below their median similarity, a lower bound of the noise rate), yet the mixture \
             (bmm separation D 0.25) estimates 21% noise and the cut removes 25%: the kept \
             pairs include many that look mismatched; remove at least that share with \
             --remove-noise-rate 1.00, or try another --method"
        );
        // A cut within 0.10 of the random-like share is no warning, whatever
        // the mixture estimated (the user asked to remove more).
        assert!(c.warnings(0.21, 0.92, false, "").is_empty());
        assert_eq!(c.warnings(0.21, 0.88, true, "").len(), 1);
    }

    #[test]
    fn the_understated_margin_is_three_standard_errors_on_small_samples() {
        let at = |pairs: usize| SignalCheck {
            pairs,
            auroc: 0.9,
            matched_share: 0.5,
            random_like_share: 0.6,
        };
        // 3 / sqrt(m): 0.3 on 100 pairs, 0.15 on 400; never under 0.10.
        assert!((at(100).understated_margin() - 0.3).abs() < 1e-12);
        assert!((at(400).understated_margin() - 0.15).abs() < 1e-12);
        assert_eq!(at(1024).understated_margin(), UNDERSTATED_BY);
        // A random-like share of 60%: a cut removing 49% is 11 points short
        // of it, past the margin on 1024 pairs, within chance on 400 (whose
        // margin ends at 45%); 99 pairs are not judged at all.
        assert_eq!(
            at(1024).verdict(0.4, 0.49, true),
            Some(Verdict::Understated)
        );
        assert_eq!(at(1024).verdict(0.4, 0.51, true), None);
        assert_eq!(at(400).verdict(0.4, 0.49, true), None);
        assert_eq!(at(400).verdict(0.4, 0.44, true), Some(Verdict::Understated));
        assert_eq!(at(400).verdict(0.4, 0.46, true), None);
        assert_eq!(at(99).verdict(0.4, 0.0, true), None);
    }

    #[test]
    fn a_division_keeping_fewer_than_plainly_match_is_said_to_overstate_noise() {
        // Half the pairs beat 99% of the random pairings: at least 49% are
        // matched; a cut keeping 38% is 11 points short, past the margin.
        let c = SignalCheck {
            pairs: 1024,
            auroc: 0.9,
            matched_share: 0.5,
            random_like_share: 0.3,
        };
        assert!((c.overstated_margin() - OVERSTATED_CUT_BY).abs() < 1e-12);
        assert_eq!(c.verdict(0.7, 0.62, true), Some(Verdict::Overstated));
        assert_eq!(c.verdict(0.7, 0.60, true), None);
        // A share or precision the user chose may cost matched pairs.
        assert_eq!(c.verdict(0.7, 0.62, false), None);
        // On 400 pairs the margin is 3 standard errors, 0.075 < 0.10; on
        // 100 it is 0.15.
        assert_eq!(
            SignalCheck { pairs: 400, ..c }.overstated_margin(),
            OVERSTATED_CUT_BY
        );
        let small = SignalCheck { pairs: 100, ..c };
        assert!((small.overstated_margin() - 0.15).abs() < 1e-12);
        assert_eq!(small.verdict(0.7, 0.62, true), None);
        assert_eq!(
            c.warnings(0.7, 0.62, true, "the mixture (gmm separation D 3.00)"),
            [
                "noise overstated: 50% of 1024 pairs score above 99% of random pairings (nearly \
              all matched pairs: chance puts 1% of random ones there), yet the mixture (gmm \
              separation D 3.00) estimates 70% noise and the cut keeps only 38%: it \
              removes pairs that plainly match; remove at most 0.51 with --remove-noise-rate, \
              or keep more with --min-prob"
            ]
        );
        let w = c.score_warning("a.parquet", 0.7, 0.62, true).unwrap();
        assert!(
            w.starts_with("a.parquet: noise overstated: 50% of 1024 pairs score above 99%"),
            "{w}"
        );
        assert!(w.ends_with("lower the cut with --min-prob, or fit a model on data like it"));
    }

    #[test]
    fn scoring_warnings_name_the_file_and_the_scoring_remedy() {
        let c = SignalCheck {
            pairs: 1024,
            auroc: 0.7,
            matched_share: 0.2,
            random_like_share: 0.62,
        };
        assert_eq!(
            c.score_warning("shard-3.parquet", 0.31, 0.3, true)
                .as_deref(),
            Some(
                "shard-3.parquet: noise understated: 62% of 1024 pairs score like random \
                 pairings (twice the share below their median similarity, a lower bound of the \
                 noise rate), yet clean_prob estimates 31% noise and the cut removes 30%: the \
                 kept pairs include many that look mismatched, as when a file's noise or content \
                 differs from the training data's; raise the cut with --min-prob, or fit a model \
                 on data like it"
            )
        );
        assert_eq!(c.score_warning("f", 0.6, 0.6, true), None);
        let none = SignalCheck {
            matched_share: 0.01,
            auroc: 0.51,
            ..c
        };
        let w = none.score_warning("f", 0.5, 0.5, true).unwrap();
        assert!(w.starts_with("f: no signal: "), "{w}");
        assert!(w.contains("(1.0% of 1024 pairs above 99%"), "{w}");
        let clean = SignalCheck {
            random_like_share: 0.0,
            ..c
        };
        let w = clean.score_warning("f", 0.2, 0.25, true).unwrap();
        assert!(w.starts_with("f: no noise found: only 0% of 1024"), "{w}");
        assert!(
            w.contains("estimates 20% noise and the cut removes 25%"),
            "{w}"
        );
    }

    #[test]
    fn mixtures_are_summarised_with_their_separation() {
        use ncclean_pipelines::division::{CleanSide, Gmm, MixtureKind, Normaliser};
        let mut d = Division {
            kind: MixtureKind::Gmm,
            side: CleanSide::HighMean,
            normaliser: Normaliser { min: 0.0, max: 1.0 },
            mixture: Some(Mixture::Gmm(Gmm {
                weights: [0.3, 0.7],
                means: [0.2, 0.8],
                variances: [0.01, 0.07],
            })),
            clean_component: 1,
            fallback: None,
            iterations: 3,
            converged: true,
        };
        let s = MixtureSummary::of(&d);
        // sqrt(2) * 0.6 / sqrt(0.08) = 3.0.
        assert!((s.separation.unwrap() - 3.0).abs() < 1e-12);
        assert_eq!((s.noisy_mean, s.noisy_weight), (Some(0.2), Some(0.3)));
        assert_eq!(
            s.describe(),
            "gmm clean component at 0.80, noisy at 0.20 weighing 30%, separation D 3.00"
        );
        assert_eq!(s.warning(), None);
        d.mixture = None;
        d.fallback = Some(Fallback::Collapsed { weight: 0.0004 });
        let s = MixtureSummary::of(&d);
        assert_eq!(
            s.describe(),
            "no mixture: a single component: the other weighs 0.0004"
        );
        assert!(s.warning().unwrap().starts_with("no noise found"));
    }
}
