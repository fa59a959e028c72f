//! Division of per-pair scores into clean and noisy pairs with a two-component
//! mixture model (METHODS.md section 0).
//!
//! Every method in ncclean reduces a pair to one score (a loss or a
//! consistency) and asks "how likely is this pair clean?". The answer is the
//! posterior of the clean component of a 1-D mixture fitted to all scores.
//! The fitted [`Division`] keeps everything needed to answer that question
//! again later, so it is what checkpoints store.
//!
//! Degenerate inputs never produce NaN: they produce a recorded [`Fallback`]
//! and a clean probability of 1.0 for every pair, because a mixture that
//! could not be fitted is no evidence that any pair is noisy, and dropping
//! data on no evidence is the worse mistake.

mod bmm;
mod gmm;

use serde::{Deserialize, Serialize};

/// Fewer finite scores than this cannot support two components.
const MIN_SCORES: usize = 10;
/// Below this max−min span the scores carry no ranking to divide.
const CONSTANT_SPAN: f64 = 1e-12;
/// A component lighter than this after EM explains almost no pairs, so its
/// posterior is noise rather than a division.
const COLLAPSE_WEIGHT: f64 = 1e-3;
/// Clean probability on every fallback: no fitted model, no evidence of noise.
const FALLBACK_CLEAN_PROB: f32 = 1.0;
/// Clean probability of a score the model cannot place (NaN or ±inf): exactly
/// undecided. Scoring replaces it with 0 (`Runner::score`), so such a pair is
/// never called clean, whatever the cut.
const UNDECIDED_CLEAN_PROB: f32 = 0.5;
/// Cells of the grid on which [`Division::clean_prob`] makes the posterior monotone.
const MONOTONE_GRID: usize = 1000;

/// Which family of component densities to fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MixtureKind {
    /// Two Gaussians, as scikit-learn's `GaussianMixture` fits them.
    Gmm,
    /// Two Beta densities on the clipped unit interval, as DivideMix/BiCro fit them.
    Bmm,
}

/// Which component is clean: the low-mean one (scores are losses) or the
/// high-mean one (scores are consistencies/similarities).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CleanSide {
    /// Small scores are clean: the score is a loss.
    LowMean,
    /// Large scores are clean: the score is a similarity or consistency.
    HighMean,
}

impl CleanSide {
    /// Index of the clean component given the two component means; a tie
    /// picks component 0 so the choice is deterministic.
    fn pick(self, means: [f64; 2]) -> usize {
        let second_is_cleaner = match self {
            CleanSide::LowMean => means[1] < means[0],
            CleanSide::HighMean => means[1] > means[0],
        };
        usize::from(second_is_cleaner)
    }
}

/// Min–max normaliser fitted on training scores; applying it to new scores
/// clamps to \[0, 1\].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Normaliser {
    /// Smallest finite training score.
    pub min: f64,
    /// Largest finite training score.
    pub max: f64,
}

impl Normaliser {
    /// Fit on finite scores; non-finite ones are skipped so that one NaN cannot
    /// poison the range. With no finite score the range is the empty [0, 0].
    pub fn from_scores(scores: &[f64]) -> Normaliser {
        let finite = scores.iter().copied().filter(|s| s.is_finite());
        let (min, max) = finite.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), s| {
            (lo.min(s), hi.max(s))
        });
        if min > max {
            Normaliser { min: 0.0, max: 0.0 }
        } else {
            Normaliser { min, max }
        }
    }

    /// Map a raw score onto the training range. Scores outside that range are
    /// clamped, because the mixture was only ever fitted on [0, 1]; an empty
    /// range maps everything to 0. ±inf clamp to 1 and 0; NaN stays NaN, so
    /// callers must screen it (see [`Division::clean_prob`]).
    pub fn apply(&self, score: f64) -> f64 {
        let span = self.span();
        if span > 0.0 {
            ((score - self.min) / span).clamp(0.0, 1.0)
        } else if score.is_nan() {
            score
        } else {
            0.0
        }
    }

    fn span(&self) -> f64 {
        self.max - self.min
    }
}

/// A two-component 1-D Gaussian mixture on the normalised scale.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Gmm {
    /// Mixing weights; they sum to 1.
    pub weights: [f64; 2],
    /// Component means.
    pub means: [f64; 2],
    /// Component variances, each already including the 5e-4 floor.
    pub variances: [f64; 2],
}

/// A two-component Beta mixture on the normalised, clipped scale.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Bmm {
    /// Mixing weights; they sum to 1.
    pub weights: [f64; 2],
    /// First Beta shape parameter of each component.
    pub alphas: [f64; 2],
    /// Second Beta shape parameter of each component.
    pub betas: [f64; 2],
    /// How many method-of-moments estimates (one per component per EM
    /// iteration) had to be guarded: a component with no responsibility kept
    /// its old shape, or a concentration α+β outside [1e-6, 1e6] was clamped.
    /// Nonzero means some iteration saw a degenerate component, which is worth
    /// reporting even when the final fit looks fine.
    #[serde(default)]
    pub floor_hits: usize,
}

/// The fitted mixture of either family.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Mixture {
    /// Gaussian components.
    Gmm(Gmm),
    /// Beta components.
    Bmm(Bmm),
}

impl Mixture {
    /// Component means on the normalised scale (Beta mean is α/(α+β)).
    pub fn means(&self) -> [f64; 2] {
        match self {
            Mixture::Gmm(g) => g.means,
            Mixture::Bmm(b) => b.means(),
        }
    }

    /// Mixing weights.
    pub fn weights(&self) -> [f64; 2] {
        match self {
            Mixture::Gmm(g) => g.weights,
            Mixture::Bmm(b) => b.weights,
        }
    }

    /// Weighted densities `w_k · f_k(x)` of both components at the
    /// normalised score `x` (a BMM clips `x` into the open interval, as its
    /// fit did): the curves a report draws over a histogram of the
    /// normalised scores, from the same formulas EM used.
    pub fn weighted_densities(&self, x: f64) -> [f64; 2] {
        self.density().weighted_log_probs(x).map(f64::exp)
    }

    /// The densities, ready to evaluate many scores.
    fn density(&self) -> Density<'_> {
        match self {
            Mixture::Gmm(g) => Density::Gmm(g),
            Mixture::Bmm(b) => Density::Bmm(b.density()),
        }
    }
}

/// Weighted log densities of a mixture, with any per-component constants
/// computed once.
enum Density<'a> {
    Gmm(&'a Gmm),
    Bmm(bmm::BetaDensity),
}

impl Density<'_> {
    fn weighted_log_probs(&self, x: f64) -> [f64; 2] {
        match self {
            Density::Gmm(g) => g.weighted_log_probs(x),
            Density::Bmm(b) => b.weighted_log_probs(x),
        }
    }

    /// Posterior of component `k` at the normalised score `x`.
    fn posterior(&self, x: f64, k: usize) -> f64 {
        let (resp, _) = responsibilities(self.weighted_log_probs(x));
        resp.get(k).copied().unwrap_or(f64::NAN)
    }

    /// log P(k | x) − log P(other | x) at the normalised score `x`, in f64,
    /// where it does not saturate as the posterior does; 0 (undecided)
    /// where neither component explains x.
    fn log_odds(&self, x: f64, k: usize) -> f64 {
        let lp = self.weighted_log_probs(x);
        let l = if k == 0 { lp[0] - lp[1] } else { lp[1] - lp[0] };
        if l.is_nan() {
            0.0
        } else {
            l
        }
    }
}

/// Why a division fell back instead of using a fitted mixture.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fallback {
    /// Fewer than 10 finite scores; `n` is how many there were.
    TooFew {
        /// Number of finite scores seen.
        n: usize,
    },
    /// All finite scores are equal (max − min < 1e-12).
    Constant,
    /// `count` scores were NaN or infinite and were left out of the fit. The
    /// only partial fallback: the mixture fitted on the finite scores is used,
    /// and only those pairs get the undecided probability 0.5.
    NonFinite {
        /// Number of non-finite scores left out.
        count: usize,
    },
    /// After EM one component's weight fell below 1e-3; `weight` is it.
    Collapsed {
        /// The lighter component's weight.
        weight: f64,
    },
}

/// A fitted division: everything needed to turn a raw score into a clean
/// probability later (it is stored in checkpoints as JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Division {
    /// Family that was (or would have been) fitted.
    pub kind: MixtureKind,
    /// Which component counts as clean.
    pub side: CleanSide,
    /// Raw-score range of the training scores.
    pub normaliser: Normaliser,
    /// The fitted mixture; `None` exactly when every pair falls back to 1.0.
    pub mixture: Option<Mixture>,
    /// Index (0 or 1) of the clean component in `mixture`. Any other value can
    /// only come from a hand-edited checkpoint and is treated as no mixture.
    pub clean_component: usize,
    /// Set when the division did not, or not fully, use a fitted mixture.
    /// [`Fallback::NonFinite`] is the one variant that comes with a mixture.
    pub fallback: Option<Fallback>,
    /// EM iterations run (0 when no EM ran).
    pub iterations: usize,
    /// GMM: the mean log-likelihood moved less than 1e-2 within the 10
    /// iterations, as sklearn's `converged_`. BMM always runs 10 iterations; this reports
    /// whether its last one moved the mean log-likelihood less than 1e-2.
    pub converged: bool,
}

/// What either EM routine hands back.
struct EmFit {
    mixture: Mixture,
    iterations: usize,
    converged: bool,
}

impl Division {
    /// Fit on raw per-pair scores (not normalised; this normalises min–max
    /// itself). Deterministic: the same scores give the same division.
    /// Non-finite scores are left out of the fit; see [`Fallback`] for what
    /// each degenerate input records.
    pub fn fit(scores: &[f32], kind: MixtureKind, side: CleanSide) -> Division {
        let finite: Vec<f64> = scores
            .iter()
            .filter(|s| s.is_finite())
            .map(|&s| f64::from(s))
            .collect();
        let non_finite = scores.len() - finite.len();
        let normaliser = Normaliser::from_scores(&finite);
        let mut division = Division {
            kind,
            side,
            normaliser,
            mixture: None,
            clean_component: 0,
            fallback: None,
            iterations: 0,
            converged: false,
        };
        if finite.len() < MIN_SCORES {
            division.fallback = Some(Fallback::TooFew { n: finite.len() });
            return division;
        }
        if division.normaliser.span() < CONSTANT_SPAN {
            division.fallback = Some(Fallback::Constant);
            return division;
        }
        let x: Vec<f64> = finite
            .iter()
            .map(|&s| division.normaliser.apply(s))
            .collect();
        let fit = match kind {
            MixtureKind::Gmm => gmm::fit(&x),
            MixtureKind::Bmm => bmm::fit(&x),
        };
        division.iterations = fit.iterations;
        division.converged = fit.converged;
        if let Some(weight) = collapsed_weight(&fit.mixture) {
            // The collapsed parameters are not kept: with `mixture: None` no
            // consumer can accidentally use them.
            division.fallback = Some(Fallback::Collapsed { weight });
            return division;
        }
        division.clean_component = side.pick(fit.mixture.means());
        division.mixture = Some(fit.mixture);
        if non_finite > 0 {
            division.fallback = Some(Fallback::NonFinite { count: non_finite });
        }
        division
    }

    /// Raw posterior of the clean component for each raw score: normalised
    /// with the stored min/max and clamped to \[0, 1\] (BMM also clips to
    /// [1e-4, 1−1e-4]). This is what scikit-learn's `predict_proba` gives;
    /// methods use [`Division::clean_prob`], which repairs its tails.
    ///
    /// Never NaN. A non-finite score gets 0.5 (undecided), and on a fallback
    /// without a mixture every score gets 1.0 (keep the data).
    pub fn posterior(&self, scores: &[f32]) -> Vec<f32> {
        let Some(mixture) = self.usable_mixture() else {
            return vec![FALLBACK_CLEAN_PROB; scores.len()];
        };
        let density = mixture.density();
        scores
            .iter()
            .map(|&s| self.one_clean_prob(&density, s))
            .collect()
    }

    /// Clean probability of each raw score: the [`Division::posterior`] made
    /// monotone in the score (non-increasing in a loss, non-decreasing in a
    /// consistency), up to the resolution of a 1,000-cell grid.
    ///
    /// Why: two components of unequal width cross twice, so the raw posterior
    /// of the narrower one turns back in the far tail. When the clean
    /// component is the narrow one, the cleanest pairs are called noisy (ESC
    /// on the demo data: AUROC 0.95 for the loss, 0.88 for its posterior);
    /// when it is the wide one, the noisiest pairs are called clean (ESC at
    /// 50% noise on Flickr8k: every pair got 1.0). The repair mirrors the
    /// BMM lookup table of Arazo et al. (2019): on the clean side of the
    /// posterior's peak the probability is the peak value, and beyond it the
    /// running minimum, so it can only fall as pairs look noisier.
    ///
    /// Fallbacks and non-finite scores behave as in [`Division::posterior`].
    pub fn clean_prob(&self, scores: &[f32]) -> Vec<f32> {
        let raw = self.posterior(scores);
        let Some(mixture) = self.usable_mixture() else {
            return raw;
        };
        let density = mixture.density();
        let at = |x: f64| {
            let p = density.posterior(x, self.clean_component);
            if p.is_finite() {
                p
            } else {
                f64::from(UNDECIDED_CLEAN_PROB)
            }
        };
        let raw = raw.into_iter().map(f64::from).collect();
        self.monotone(scores, raw, at)
            .into_iter()
            .map(|p| p as f32)
            .collect()
    }

    /// The `clean_prob` written to the output: [`Division::clean_prob`]
    /// worked out in log-odds, so that pairs the mixture is all but certain
    /// of keep their order in f32. Between 1e-30 and 0.999 it is the
    /// logistic of the log-odds; beyond, tails that approach 1 and 0 as
    /// 1 / (1 + ln(1 + t)), t the log-odds past the edge, off the posterior
    /// by less than 1e-3.
    ///
    /// Why: a confident mixture puts most pairs past log-odds 17, where the
    /// logistic rounds to exactly 1.0 in f32 (70% of the pairs of GSC's
    /// preset at 20% noise on Flickr8k): a tie that no ranking or share
    /// rule can split, and that costs the AUROC of `clean_prob` what the
    /// statistic had. The training divisions keep [`Division::clean_prob`].
    pub fn exported_clean_prob(&self, scores: &[f32]) -> Vec<f32> {
        let Some(mixture) = self.usable_mixture() else {
            return vec![FALLBACK_CLEAN_PROB; scores.len()];
        };
        let density = mixture.density();
        let at = |x: f64| density.log_odds(x, self.clean_component);
        let raw = scores
            .iter()
            .map(|&s| {
                if s.is_finite() {
                    at(self.normaliser.apply(f64::from(s)))
                } else {
                    // Undecided: log-odds 0 is probability 0.5.
                    0.0
                }
            })
            .collect();
        self.monotone(scores, raw, at)
            .into_iter()
            .map(tail_kept_prob)
            .collect()
    }

    /// `raw` (one value per score, increasing with the clean posterior)
    /// made monotone in the score on a [`MONOTONE_GRID`]-cell grid of
    /// `at(normalised score)`: on the clean side of the grid's peak every
    /// value is at least the peak's, beyond it at most the running minimum
    /// (see [`Division::clean_prob`]). Non-finite scores keep their `raw`.
    fn monotone(&self, scores: &[f32], raw: Vec<f64>, at: impl Fn(f64) -> f64) -> Vec<f64> {
        // u: 0 = cleanest end of the normalised scale, 1 = noisiest.
        let flip = self.side == CleanSide::HighMean;
        let u_of = |x: f64| if flip { 1.0 - x } else { x };
        let g = MONOTONE_GRID;
        let grid: Vec<f64> = (0..=g).map(|k| at(u_of(k as f64 / g as f64))).collect();
        let peak = (0..=g).fold(0, |best, k| if grid[k] > grid[best] { k } else { best });
        let mut envelope = grid.clone();
        for k in 0..=g {
            envelope[k] = if k <= peak {
                grid[peak]
            } else {
                envelope[k - 1].min(grid[k])
            };
        }
        scores
            .iter()
            .zip(raw)
            .map(|(&s, p)| {
                if !s.is_finite() {
                    return p;
                }
                let u = u_of(self.normaliser.apply(f64::from(s)));
                let cell = ((u * g as f64).floor().max(0.0) as usize).min(g);
                if cell < peak {
                    p.max(grid[peak])
                } else {
                    p.min(envelope[cell])
                }
            })
            .collect()
    }

    /// Mean of the clean component on the normalised scale (for reports);
    /// None on fallback.
    pub fn clean_mean(&self) -> Option<f64> {
        let mixture = self.usable_mixture()?;
        mixture.means().get(self.clean_component).copied()
    }

    fn usable_mixture(&self) -> Option<&Mixture> {
        self.mixture.as_ref().filter(|_| self.clean_component < 2)
    }

    fn one_clean_prob(&self, density: &Density<'_>, score: f32) -> f32 {
        if !score.is_finite() {
            return UNDECIDED_CLEAN_PROB;
        }
        let x = self.normaliser.apply(f64::from(score));
        let p = density.posterior(x, self.clean_component);
        // Only reachable with parameters edited by hand (say a negative
        // variance); the promise of no NaN still holds.
        if p.is_finite() {
            p as f32
        } else {
            UNDECIDED_CLEAN_PROB
        }
    }
}

/// The lighter weight when it is below the collapse threshold (or not a
/// number, recorded as 0 so the record stays valid JSON).
fn collapsed_weight(mixture: &Mixture) -> Option<f64> {
    let w = mixture.weights();
    let lightest = w[0].min(w[1]);
    if lightest >= COLLAPSE_WEIGHT {
        None
    } else if lightest.is_nan() {
        Some(0.0)
    } else {
        Some(lightest)
    }
}

/// The clean probability of log-odds `l`, as f32, increasing in `l`
/// wherever f32 can tell the values apart: the logistic between 1e-30 and
/// 1 − 1e-3, and beyond them tails that approach 0 and 1 only as
/// 1 / (1 + ln(1 + t)), t the log-odds past the edge. Off the logistic by
/// less than 1e-3 near 1 and 1e-30 near 0. A GMM of unequal widths has
/// log-odds quadratic in the score, hundreds for a confident one, which the
/// logistic rounds to exactly 1.0 in f32 from 17 on; here log-odds 200 and
/// 201 still differ, and 800 and 803.
fn tail_kept_prob(l: f64) -> f32 {
    /// 1 − p where the upper tail starts, and p where the lower one does.
    const UPPER: f64 = 1e-3;
    const LOWER: f64 = 1e-30;
    let hi = (1.0 / UPPER - 1.0).ln();
    let lo = -(1.0 / LOWER - 1.0).ln();
    let p = if l > hi {
        1.0 - UPPER / (1.0 + (l - hi).ln_1p())
    } else if l < lo {
        LOWER / (1.0 + (lo - l).ln_1p())
    } else {
        1.0 / (1.0 + (-l).exp())
    };
    p as f32
}

/// Posterior responsibilities and log normaliser from weighted log densities,
/// by log-sum-exp so that far-out scores do not underflow to 0/0. Two −∞
/// inputs (no component can explain the point) give an even split.
fn responsibilities(log_probs: [f64; 2]) -> ([f64; 2], f64) {
    let top = log_probs[0].max(log_probs[1]);
    if top == f64::NEG_INFINITY {
        return ([0.5, 0.5], f64::NEG_INFINITY);
    }
    let norm = top + ((log_probs[0] - top).exp() + (log_probs[1] - top).exp()).ln();
    let resp = [(log_probs[0] - norm).exp(), (log_probs[1] - norm).exp()];
    (resp, norm)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weighted_densities_are_the_weighted_component_pdfs() {
        // N(0.2, 0.01) at its mean: 1/sqrt(2*pi*0.01) = 3.989423; N(0.8,
        // 0.04) one sd (0.2) from its mean: exp(-0.5)/sqrt(2*pi*0.04) =
        // 1.209854. Both weighted by 0.5.
        let g = Mixture::Gmm(Gmm {
            weights: [0.5, 0.5],
            means: [0.2, 0.8],
            variances: [0.01, 0.04],
        });
        let d = g.weighted_densities(0.2);
        assert!((d[0] - 0.5 * 3.989_423).abs() < 1e-5, "{d:?}");
        let d = g.weighted_densities(0.6);
        assert!((d[1] - 0.5 * 1.209_854).abs() < 1e-5, "{d:?}");
        // Beta(2, 2) at 0.5: 6 * 0.5 * 0.5 = 1.5, weight 0.3; Beta(1, 3) at
        // 0.5: 3 * 0.5^2 = 0.75, weight 0.7.
        let b = Mixture::Bmm(Bmm {
            weights: [0.3, 0.7],
            alphas: [2.0, 1.0],
            betas: [2.0, 3.0],
            floor_hits: 0,
        });
        let d = b.weighted_densities(0.5);
        assert!(
            (d[0] - 0.45).abs() < 1e-9 && (d[1] - 0.525).abs() < 1e-9,
            "{d:?}"
        );
    }

    const POSTERIOR_TOL: f64 = 1e-4;
    const PARAM_REL_TOL: f64 = 1e-4;

    #[derive(Deserialize)]
    struct Vectors {
        lgamma: Vec<[f64; 2]>,
        datasets: Vec<Dataset>,
    }

    #[derive(Deserialize)]
    struct Dataset {
        name: String,
        scores: Vec<f32>,
        gmm: GmmRef,
        bmm: BmmRef,
    }

    #[derive(Deserialize)]
    struct GmmRef {
        weights: [f64; 2],
        means: [f64; 2],
        variances: [f64; 2],
        n_iter: usize,
        converged: bool,
        post_low: Vec<f64>,
    }

    #[derive(Deserialize)]
    struct BmmRef {
        weights: [f64; 2],
        alphas: [f64; 2],
        betas: [f64; 2],
        converged: bool,
        post_low: Vec<f64>,
    }

    fn vectors() -> Vectors {
        // Written by scripts/reference/mixture_vectors.py (scikit-learn's
        // GaussianMixture and an independent numpy/scipy BMM).
        let text = include_str!("testdata/mixture_vectors.json");
        serde_json::from_str(text).expect("reference vectors parse")
    }

    fn assert_rel(got: f64, want: f64, what: &str) {
        let err = (got - want).abs();
        assert!(
            err <= PARAM_REL_TOL * want.abs(),
            "{what}: got {got}, want {want} (rel err {})",
            err / want.abs()
        );
    }

    fn assert_probs(got: &[f32], want: impl Iterator<Item = f64>, what: &str) {
        let mut count = 0;
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            let err = (f64::from(*g) - w).abs();
            assert!(err <= POSTERIOR_TOL, "{what}[{i}]: got {g}, want {w}");
            count += 1;
        }
        assert_eq!(count, got.len(), "{what}: length");
    }

    fn gaussian(d: &Division) -> &Gmm {
        match &d.mixture {
            Some(Mixture::Gmm(g)) => g,
            other => panic!("expected a GMM, got {other:?}"),
        }
    }

    fn beta(d: &Division) -> &Bmm {
        match &d.mixture {
            Some(Mixture::Bmm(b)) => b,
            other => panic!("expected a BMM, got {other:?}"),
        }
    }

    fn assert_no_nan(d: &Division, scores: &[f32]) {
        let probs = d.clean_prob(scores);
        assert_eq!(probs.len(), scores.len());
        assert!(probs.iter().all(|p| (0.0..=1.0).contains(p)), "{probs:?}");
        assert_round_trips(d);
    }

    /// Every float in a division, in a fixed order.
    fn floats(d: &Division) -> Vec<f64> {
        let mut out = vec![d.normaliser.min, d.normaliser.max];
        match &d.mixture {
            Some(Mixture::Gmm(g)) => {
                out.extend(g.weights.iter().chain(&g.means).chain(&g.variances));
            }
            Some(Mixture::Bmm(b)) => {
                out.extend(b.weights.iter().chain(&b.alphas).chain(&b.betas));
            }
            None => {}
        }
        if let Some(Fallback::Collapsed { weight }) = d.fallback {
            out.push(weight);
        }
        out
    }

    /// The division with every float zeroed, for exact comparison of the rest.
    fn skeleton(d: &Division) -> Division {
        let mut s = d.clone();
        s.normaliser = Normaliser { min: 0.0, max: 0.0 };
        match &mut s.mixture {
            Some(Mixture::Gmm(g)) => {
                *g = Gmm {
                    weights: [0.0; 2],
                    means: [0.0; 2],
                    variances: [0.0; 2],
                }
            }
            Some(Mixture::Bmm(b)) => {
                b.weights = [0.0; 2];
                b.alphas = [0.0; 2];
                b.betas = [0.0; 2];
            }
            None => {}
        }
        if let Some(Fallback::Collapsed { weight }) = &mut s.fallback {
            *weight = 0.0;
        }
        s
    }

    /// JSON round trip. serde_json's default float parser may land one ulp
    /// off (exact only with its `float_roundtrip` feature), so floats are
    /// compared to a few ulps and everything else exactly.
    fn assert_round_trips(d: &Division) {
        let json = serde_json::to_string(d).expect("serialise");
        let back: Division = serde_json::from_str(&json).expect("deserialise");
        assert_eq!(skeleton(&back), skeleton(d), "{json}");
        for (a, b) in floats(&back).into_iter().zip(floats(d)) {
            let ulps = 4.0 * f64::EPSILON * a.abs().max(b.abs());
            assert!((a - b).abs() <= ulps, "{a} vs {b} in {json}");
        }
    }

    #[test]
    fn normaliser_maps_training_range_to_unit_interval_and_clamps() {
        let n = Normaliser::from_scores(&[4.0, 2.0, f64::NAN, 6.0]);
        // NaN is skipped: range [2, 6], so 4 is half-way.
        assert_eq!(n, Normaliser { min: 2.0, max: 6.0 });
        assert_eq!(n.apply(4.0), 0.5);
        assert_eq!(n.apply(2.0), 0.0);
        assert_eq!(n.apply(6.0), 1.0);
        // Beyond the training range: clamped, not extrapolated.
        assert_eq!(n.apply(10.0), 1.0);
        assert_eq!(n.apply(-3.0), 0.0);
        assert_eq!(n.apply(f64::INFINITY), 1.0);
        assert_eq!(n.apply(f64::NEG_INFINITY), 0.0);
        // Empty and constant ranges send everything to 0.
        assert_eq!(Normaliser::from_scores(&[]).apply(5.0), 0.0);
        assert_eq!(Normaliser::from_scores(&[3.0, 3.0]).apply(5.0), 0.0);
    }

    #[test]
    fn clean_side_picks_by_mean() {
        assert_eq!(CleanSide::LowMean.pick([0.7, 0.2]), 1);
        assert_eq!(CleanSide::LowMean.pick([0.2, 0.7]), 0);
        assert_eq!(CleanSide::HighMean.pick([0.2, 0.7]), 1);
        assert_eq!(CleanSide::HighMean.pick([0.7, 0.2]), 0);
        assert_eq!(CleanSide::HighMean.pick([0.5, 0.5]), 0);
    }

    #[test]
    fn responsibilities_are_stable_far_in_the_tails() {
        // Naive exp would give 0/0 here; log-sum-exp gives 1/(1+e^-10).
        let (r, norm) = responsibilities([-1000.0, -1010.0]);
        // (The ~1e-13 error is the rounding of logs near -1000.)
        assert!((r[0] - 1.0 / (1.0 + (-10.0f64).exp())).abs() < 1e-12);
        assert!((r[0] + r[1] - 1.0).abs() < 1e-12);
        assert!((norm - (-1000.0 + (1.0 + (-10.0f64).exp()).ln())).abs() < 1e-12);
        let (r, _) = responsibilities([f64::NEG_INFINITY, f64::NEG_INFINITY]);
        assert_eq!(r, [0.5, 0.5]);
    }

    #[test]
    fn lgamma_matches_scipy() {
        for [x, want] in vectors().lgamma {
            let got = bmm::ln_gamma(x);
            let err = (got - want).abs() / want.abs().max(1.0);
            assert!(err < 1e-13, "lgamma({x}) = {got}, scipy {want}");
        }
    }

    #[test]
    fn gmm_matches_sklearn() {
        for ds in vectors().datasets {
            let d = Division::fit(&ds.scores, MixtureKind::Gmm, CleanSide::LowMean);
            let name = &ds.name;
            assert_eq!(d.fallback, None, "{name}");
            assert_eq!(d.iterations, ds.gmm.n_iter, "{name}: n_iter");
            assert_eq!(d.converged, ds.gmm.converged, "{name}: converged");
            // The reference lists components low mean first; so do we after
            // sorting, since sklearn's component order is k-means++ chance.
            let g = gaussian(&d);
            let order = if g.means[0] <= g.means[1] {
                [0, 1]
            } else {
                [1, 0]
            };
            for (slot, &k) in order.iter().enumerate() {
                assert_rel(
                    g.weights[k],
                    ds.gmm.weights[slot],
                    &format!("{name} w{slot}"),
                );
                assert_rel(g.means[k], ds.gmm.means[slot], &format!("{name} mu{slot}"));
                let var = g.variances[k];
                assert_rel(var, ds.gmm.variances[slot], &format!("{name} var{slot}"));
            }
            let low = d.posterior(&ds.scores);
            assert_probs(&low, ds.gmm.post_low.iter().copied(), name);
            let d = Division::fit(&ds.scores, MixtureKind::Gmm, CleanSide::HighMean);
            let high = d.posterior(&ds.scores);
            assert_probs(&high, ds.gmm.post_low.iter().map(|p| 1.0 - p), name);
        }
    }

    #[test]
    fn bmm_matches_independent_reference() {
        for ds in vectors().datasets {
            let d = Division::fit(&ds.scores, MixtureKind::Bmm, CleanSide::LowMean);
            let name = &ds.name;
            assert_eq!(d.fallback, None, "{name}");
            assert_eq!(d.iterations, 10, "{name}");
            assert_eq!(d.converged, ds.bmm.converged, "{name}: converged");
            let b = beta(&d);
            assert_eq!(b.floor_hits, 0, "{name}");
            // Both sides start from the same fixed init, so component order
            // is comparable directly.
            for k in 0..2 {
                assert_rel(b.weights[k], ds.bmm.weights[k], &format!("{name} w{k}"));
                assert_rel(b.alphas[k], ds.bmm.alphas[k], &format!("{name} a{k}"));
                assert_rel(b.betas[k], ds.bmm.betas[k], &format!("{name} b{k}"));
            }
            let low = d.posterior(&ds.scores);
            assert_probs(&low, ds.bmm.post_low.iter().copied(), name);
            let d = Division::fit(&ds.scores, MixtureKind::Bmm, CleanSide::HighMean);
            let high = d.posterior(&ds.scores);
            assert_probs(&high, ds.bmm.post_low.iter().map(|p| 1.0 - p), name);
        }
    }

    /// Twenty scores in two tight groups, 0.1 and 0.9, with a little spread.
    fn two_groups() -> Vec<f32> {
        (0..20)
            .map(|i| {
                let jitter = (i % 5) as f32 * 0.01;
                if i < 12 {
                    0.1 + jitter
                } else {
                    0.9 - jitter
                }
            })
            .collect()
    }

    #[test]
    fn clean_component_and_mean_follow_the_side() {
        let scores = two_groups();
        for kind in [MixtureKind::Gmm, MixtureKind::Bmm] {
            let low = Division::fit(&scores, kind, CleanSide::LowMean);
            let high = Division::fit(&scores, kind, CleanSide::HighMean);
            let low_mean = low.clean_mean().expect("fitted");
            let high_mean = high.clean_mean().expect("fitted");
            assert!(low_mean < 0.3 && high_mean > 0.7, "{kind:?}");
            let p_low = low.clean_prob(&[0.1, 0.9]);
            let p_high = high.clean_prob(&[0.1, 0.9]);
            assert!(p_low[0] > 0.99 && p_low[1] < 0.01, "{kind:?} {p_low:?}");
            assert!(p_high[0] < 0.01 && p_high[1] > 0.99, "{kind:?} {p_high:?}");
            let noisy = low.clean_prob(&scores).iter().filter(|&&p| p < 0.5).count();
            assert_eq!(noisy, 8, "{kind:?}");
        }
    }

    #[test]
    fn empty_and_too_few_fall_back_to_keep_everything() {
        for kind in [MixtureKind::Gmm, MixtureKind::Bmm] {
            let d = Division::fit(&[], kind, CleanSide::LowMean);
            assert_eq!(d.fallback, Some(Fallback::TooFew { n: 0 }));
            assert_eq!(d.mixture, None);
            assert_eq!(d.clean_mean(), None);
            assert_eq!(d.clean_prob(&[]), Vec::<f32>::new());
            assert_no_nan(&d, &[1.0, f32::NAN]);

            let d = Division::fit(&[0.1, 0.5, 0.9], kind, CleanSide::LowMean);
            assert_eq!(d.fallback, Some(Fallback::TooFew { n: 3 }));
            assert_eq!(d.clean_prob(&[0.1, 0.9, f32::NAN]), vec![1.0; 3]);
            assert_no_nan(&d, &[0.1, 0.9]);

            // Ten scores, but only nine finite: still too few.
            let mut scores = vec![0.1f32, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9];
            scores.push(f32::NAN);
            let d = Division::fit(&scores, kind, CleanSide::LowMean);
            assert_eq!(d.fallback, Some(Fallback::TooFew { n: 9 }));
        }
    }

    #[test]
    fn constant_scores_fall_back() {
        for kind in [MixtureKind::Gmm, MixtureKind::Bmm] {
            let scores = vec![0.3f32; 50];
            let d = Division::fit(&scores, kind, CleanSide::HighMean);
            assert_eq!(d.fallback, Some(Fallback::Constant));
            assert_eq!(d.clean_prob(&scores), vec![1.0; 50]);
            assert_no_nan(&d, &scores);
        }
    }

    #[test]
    fn non_finite_scores_are_left_out_and_recorded() {
        let mut scores = two_groups();
        scores.extend([f32::NAN, f32::INFINITY, f32::NEG_INFINITY]);
        for kind in [MixtureKind::Gmm, MixtureKind::Bmm] {
            let d = Division::fit(&scores, kind, CleanSide::LowMean);
            assert_eq!(d.fallback, Some(Fallback::NonFinite { count: 3 }));
            // The fit on the finite scores is the same as without them.
            let clean = Division::fit(&two_groups(), kind, CleanSide::LowMean);
            assert_eq!(d.mixture, clean.mixture);
            assert_eq!(d.normaliser, clean.normaliser);
            let probs = d.clean_prob(&scores);
            assert_eq!(&probs[20..], &[0.5, 0.5, 0.5]);
            assert_no_nan(&d, &scores);
        }
    }

    #[test]
    fn one_huge_outlier_never_gives_nan() {
        // n = 2000: the outlier alone is a 1/2000 < 1e-3 component for the GMM.
        let mut scores: Vec<f32> = (0..1999).map(|i| (i % 100) as f32 * 0.01).collect();
        scores.push(1e30);
        let d = Division::fit(&scores, MixtureKind::Gmm, CleanSide::LowMean);
        match d.fallback {
            Some(Fallback::Collapsed { weight }) => assert!(weight < COLLAPSE_WEIGHT),
            ref other => panic!("expected Collapsed, got {other:?}"),
        }
        assert_eq!(d.clean_prob(&scores), vec![1.0; 2000]);
        assert_no_nan(&d, &scores);

        // The BMM sees almost all mass at the clipped 1e-4 end; whatever it
        // decides, it must decide it without NaN.
        let d = Division::fit(&scores, MixtureKind::Bmm, CleanSide::LowMean);
        assert!(matches!(
            d.fallback,
            None | Some(Fallback::Collapsed { .. })
        ));
        assert_no_nan(&d, &scores);

        // n = 100: the outlier keeps its own component; it is the noisy one.
        let mut scores: Vec<f32> = (0..99).map(|i| (i % 10) as f32 * 0.1).collect();
        scores.push(f32::MAX);
        for kind in [MixtureKind::Gmm, MixtureKind::Bmm] {
            let d = Division::fit(&scores, kind, CleanSide::LowMean);
            assert_no_nan(&d, &scores);
        }
        let d = Division::fit(&scores, MixtureKind::Gmm, CleanSide::LowMean);
        assert_eq!(d.fallback, None);
        let probs = d.clean_prob(&scores);
        assert!(probs[99] < 1e-6 && probs[..99].iter().all(|&p| p > 0.999));
    }

    #[test]
    fn tail_kept_prob_is_the_logistic_inside_and_slow_tails_outside() {
        let hi = 999f64.ln(); // logistic(hi) = 0.999
        let lo = -(1e30f64 - 1.0).ln(); // logistic(lo) = 1e-30
        let cases = [
            (0.0, 0.5),
            (5.0, 0.993_307_15), // 1 / (1 + e^-5)
            (-5.0, 0.006_692_851),
            (hi, 0.999),
            (hi + 1.718_281_828, 1.0 - 1e-3 / 2.0), // ln(1 + (e − 1)) = 1
            (hi + 2_980.957_987, 1.0 - 1e-3 / 9.0), // ln(e^8) = 8
            (lo, 1e-30),
            (lo - 1.718_281_828, 0.5e-30),
            (f64::INFINITY, 1.0),
            (f64::NEG_INFINITY, 0.0),
        ];
        for (l, want) in cases {
            let got = f64::from(tail_kept_prob(l));
            assert!(
                (got - want).abs() <= 1e-6 * want.max(1e-30),
                "l = {l}: {got} vs {want}"
            );
        }
        // Continuous where the pieces meet.
        for edge in [hi, lo] {
            let (a, b) = (tail_kept_prob(edge - 1e-9), tail_kept_prob(edge + 1e-9));
            assert!(
                (a - b).abs() <= 2.0 * f32::EPSILON * a.max(1e-30),
                "{a} {b}"
            );
        }
        // Never further than 1e-3 from the logistic, and increasing: strictly
        // in whole log-odds units from -300 to 200 (the logistic is 1.0 from
        // 17 on), never decreasing beyond.
        let mut previous = tail_kept_prob(-1e6);
        let mut previous_whole = previous;
        for k in -2000..=40_000 {
            let l = f64::from(k) * 0.5;
            let p = tail_kept_prob(l);
            let logistic = 1.0 / (1.0 + (-l).exp());
            assert!((f64::from(p) - logistic).abs() < 1e-3, "l = {l}: {p}");
            assert!(p >= previous, "l = {l}: {p} < {previous}");
            previous = p;
            if k % 2 == 0 {
                if (-299..=200).contains(&(k / 2)) {
                    assert!(p > previous_whole, "l = {l}: tied at {p}");
                }
                previous_whole = p;
            }
        }
        assert!(tail_kept_prob(803.0) > tail_kept_prob(800.0));
        assert!(tail_kept_prob(30_000.0) < 1.0);
    }

    #[test]
    fn exported_clean_prob_keeps_the_order_clean_prob_rounds_away() {
        // A confident GMM: a narrow noisy component at 0.1, a broad clean
        // one at 0.7. Log-odds grow as x² / (2 · 0.0005) on the clean side.
        let d = Division {
            kind: MixtureKind::Gmm,
            side: CleanSide::HighMean,
            normaliser: Normaliser { min: 0.0, max: 1.0 },
            mixture: Some(Mixture::Gmm(Gmm {
                weights: [0.2, 0.8],
                means: [0.1, 0.7],
                variances: [0.0005, 0.04],
            })),
            clean_component: 1,
            fallback: None,
            iterations: 40,
            converged: true,
        };
        let xs: Vec<f32> = (0..=200).map(|k| k as f32 / 200.0).collect();
        let (plain, exported) = (d.clean_prob(&xs), d.exported_clean_prob(&xs));
        let saturated = plain.iter().filter(|&&p| p == 1.0).count();
        assert!(saturated > 100, "only {saturated} pairs at 1.0");
        for (k, (&p, &e)) in plain.iter().zip(&exported).enumerate() {
            // The same probability up to f32 rounding below 0.999, within
            // 1e-3 above it.
            let tol = if p < 0.999 { 1e-6 } else { 1e-3 };
            assert!((p - e).abs() <= tol, "x = {}: {p} vs {e}", xs[k]);
        }
        // Non-decreasing as clean_prob is, and strictly increasing from the
        // noisy component's mean up, where clean_prob ties at 1.0.
        for (k, w) in exported.windows(2).enumerate() {
            assert!(w[0] <= w[1], "x = {}: {w:?}", xs[k]);
            if xs[k] >= 0.1 {
                assert!(w[0] < w[1], "x = {}: tied at {}", xs[k], w[0]);
            }
        }
        // Non-finite scores are undecided, fallbacks keep everything.
        assert_eq!(d.exported_clean_prob(&[f32::NAN]), vec![0.5]);
        let few = Division::fit(&[0.1, 0.9], MixtureKind::Gmm, CleanSide::HighMean);
        assert_eq!(few.exported_clean_prob(&[0.1, 0.9]), vec![1.0, 1.0]);
    }

    #[test]
    fn hand_edited_clean_component_is_not_trusted() {
        let mut d = Division::fit(&two_groups(), MixtureKind::Gmm, CleanSide::LowMean);
        d.clean_component = 7;
        assert_eq!(d.clean_prob(&[0.1, 0.9]), vec![1.0, 1.0]);
        assert_eq!(d.clean_mean(), None);
    }

    #[test]
    fn division_round_trips_through_json() {
        for kind in [MixtureKind::Gmm, MixtureKind::Bmm] {
            let mut scores = two_groups();
            scores.push(f32::NAN);
            let d = Division::fit(&scores, kind, CleanSide::HighMean);
            assert_round_trips(&d);
            let json = serde_json::to_string(&d).expect("serialise");
            let back: Division = serde_json::from_str(&json).expect("deserialise");
            for (a, b) in back.clean_prob(&scores).iter().zip(d.clean_prob(&scores)) {
                assert!((a - b).abs() < 1e-6, "{a} vs {b}");
            }
        }
        let d = Division::fit(&[1.0; 3], MixtureKind::Bmm, CleanSide::LowMean);
        let json = serde_json::to_value(&d).expect("serialise");
        assert_eq!(json["kind"], "bmm");
        assert_eq!(json["side"], "low_mean");
        assert_eq!(json["fallback"]["too_few"]["n"], 3);
        let d = Division::fit(&two_groups(), MixtureKind::Gmm, CleanSide::LowMean);
        let json = serde_json::to_value(&d).expect("serialise");
        assert_eq!(json["mixture"]["kind"], "gmm");
        assert_eq!(json["fallback"], serde_json::Value::Null);
    }

    #[test]
    fn bmm_without_floor_hits_field_still_loads() {
        // The counter is diagnostics; hand-written mixtures may leave it out.
        let json = r#"{"kind":"bmm","weights":[0.5,0.5],"alphas":[1,2],"betas":[2,1]}"#;
        let m: Mixture = serde_json::from_str(json).expect("deserialise");
        assert!(matches!(m, Mixture::Bmm(Bmm { floor_hits: 0, .. })));
    }

    /// A narrow clean Beta(96, 152) (mean 0.39) beside a broad noisy
    /// Beta(5.8, 6.9) (mean 0.46), the mixture of one ESC demo run.
    fn narrow_clean(side: CleanSide, clean_component: usize) -> Division {
        Division {
            kind: MixtureKind::Bmm,
            side,
            normaliser: Normaliser { min: 0.0, max: 1.0 },
            mixture: Some(Mixture::Bmm(Bmm {
                weights: [0.58, 0.42],
                alphas: [96.0, 5.8],
                betas: [152.0, 6.9],
                floor_hits: 0,
            })),
            clean_component,
            fallback: None,
            iterations: 10,
            converged: true,
        }
    }

    #[test]
    fn clean_prob_is_the_posterior_made_monotone() {
        let xs: Vec<f32> = (0..=100).map(|k| k as f32 / 100.0).collect();
        // Clean = the narrow low-loss component. At x = 0.1 its density is
        // ~1e-12 of the noisy one, so the raw posterior calls a loss far
        // below every clean loss noisy; the repair lifts it to the peak.
        let d = narrow_clean(CleanSide::LowMean, 0);
        let (raw, fixed) = (d.posterior(&xs), d.clean_prob(&xs));
        assert!(raw[10] < 0.01, "raw posterior at 0.1: {}", raw[10]);
        let peak = raw.iter().cloned().fold(0f32, f32::max);
        assert!(peak > 0.5, "peak {peak}");
        assert!((fixed[10] - peak).abs() < 1e-3, "{} vs {peak}", fixed[10]);
        for w in fixed.windows(2) {
            assert!(w[0] + 1e-6 >= w[1], "not non-increasing: {fixed:?}");
        }
        // Past the clean peak the raw posterior falls to ~0 and then rises
        // again in the far tail (x = 1), where the broad component is also
        // thin: the running minimum keeps the noisiest pairs noisy.
        let tail_rise = raw[80..].iter().cloned().fold(0f32, f32::max);
        assert!(fixed[100] <= fixed[60] + 1e-6);
        assert!(fixed[100] <= tail_rise);
        let right = raw.iter().position(|&p| p == peak).unwrap() + 5;
        for k in right..60 {
            assert!((fixed[k] - raw[k]).abs() < 1e-6, "x = {}: changed", xs[k]);
        }

        // Clean = the broad component (high loss is noisy here because the
        // other component is labelled noisy): the broad one wins both tails,
        // so the raw posterior says "clean" at x = 1. The repair caps it.
        let d = narrow_clean(CleanSide::LowMean, 1);
        let (raw, fixed) = (d.posterior(&xs), d.clean_prob(&xs));
        assert!(raw[100] > 0.99, "raw at 1.0: {}", raw[100]);
        // capped at the posterior's minimum, where the narrow component
        // dominates (x ≈ 0.39): 0.42·2.7 / (0.58·12.6 + 0.42·2.7) ≈ 0.13
        let floor = raw.iter().cloned().fold(1f32, f32::min);
        assert!(fixed[100] < 0.2, "repaired at 1.0: {}", fixed[100]);
        assert!(
            (fixed[100] - floor).abs() < 1e-3,
            "{} vs {floor}",
            fixed[100]
        );
        for w in fixed.windows(2) {
            assert!(w[0] + 1e-6 >= w[1]);
        }

        // A consistency (high = clean): mirrored, non-decreasing.
        let d = narrow_clean(CleanSide::HighMean, 0);
        let fixed = d.clean_prob(&xs);
        for w in fixed.windows(2) {
            assert!(w[0] <= w[1] + 1e-6, "not non-decreasing: {fixed:?}");
        }
        assert!(
            fixed[100] > 0.5 && fixed[0] < 0.01,
            "{} {}",
            fixed[0],
            fixed[100]
        );

        // Fallbacks and non-finite scores are untouched.
        let none = Division {
            mixture: None,
            ..narrow_clean(CleanSide::LowMean, 0)
        };
        assert_eq!(none.clean_prob(&[0.3, f32::NAN]), vec![1.0, 1.0]);
        let d = narrow_clean(CleanSide::LowMean, 0);
        assert_eq!(d.clean_prob(&[f32::NAN]), vec![0.5]);
    }
}
