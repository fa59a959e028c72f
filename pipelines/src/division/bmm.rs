//! Two-component Beta mixture by EM with a method-of-moments M-step, the
//! division DivideMix and BiCro use (their `BetaMixture1D`). ESC divides with
//! it, so its quirks are kept: the fixed start α=(1,2), β=(2,1), exactly ten
//! iterations, and moments instead of a maximum-likelihood M-step.
//!
//! Unlike `BetaMixture1D`, posteriors are computed in log space (its floor of
//! 1e-12 on the weighted densities only matters where both densities
//! underflow, and there log-sum-exp gives the true ratio instead of ½).

use super::{responsibilities, Bmm, EmFit, Mixture};

/// Beta log-densities diverge at 0 and 1; scores are clipped into
/// [CLIP, 1−CLIP] before they reach them.
const CLIP: f64 = 1e-4;
/// EM always runs this many iterations; there is no early stop.
const ITERATIONS: usize = 10;
/// Threshold for the reported `converged` flag only.
const TOL: f64 = 1e-2;
/// Concentration α+β is clamped into this range. Below it the shape would be
/// non-positive (impossible in exact arithmetic for clipped data); above it a
/// component has collapsed onto repeated values (s² ≈ 0) and the log-gamma
/// terms would cancel catastrophically.
const MIN_CONCENTRATION: f64 = 1e-6;
/// See [`MIN_CONCENTRATION`].
const MAX_CONCENTRATION: f64 = 1e6;

/// Clip a normalised score into the open interval the Beta densities accept.
fn clip(x: f64) -> f64 {
    x.clamp(CLIP, 1.0 - CLIP)
}

/// Fit on normalised scores in [0, 1].
pub(super) fn fit(x: &[f64]) -> EmFit {
    let x: Vec<f64> = x.iter().copied().map(clip).collect();
    let mut bmm = Bmm {
        weights: [0.5, 0.5],
        alphas: [1.0, 2.0],
        betas: [2.0, 1.0],
        floor_hits: 0,
    };
    let mut resp = vec![[0.0; 2]; x.len()];
    let mut log_lik = f64::NEG_INFINITY;
    let mut change = f64::INFINITY;
    for _ in 0..ITERATIONS {
        let previous = log_lik;
        log_lik = e_step(&bmm, &x, &mut resp);
        change = log_lik - previous;
        bmm = m_step(&x, &resp, bmm);
    }
    EmFit {
        mixture: Mixture::Bmm(bmm),
        iterations: ITERATIONS,
        converged: change.abs() < TOL,
    }
}

impl Bmm {
    /// Component means α/(α+β).
    pub(super) fn means(&self) -> [f64; 2] {
        std::array::from_fn(|k| self.alphas[k] / (self.alphas[k] + self.betas[k]))
    }

    /// The densities with their x-free terms worked out once: they cost six
    /// log-gamma calls, and EM and `clean_prob` evaluate every score.
    pub(super) fn density(&self) -> BetaDensity {
        BetaDensity {
            offset: std::array::from_fn(|k| {
                self.weights[k].ln() - ln_beta_fn(self.alphas[k], self.betas[k])
            }),
            alpha_minus_1: self.alphas.map(|a| a - 1.0),
            beta_minus_1: self.betas.map(|b| b - 1.0),
        }
    }
}

/// log(w_k) + log Beta(x; α_k, β_k) for both components, ready to evaluate.
pub(super) struct BetaDensity {
    /// log(w_k) − ln B(α_k, β_k).
    offset: [f64; 2],
    alpha_minus_1: [f64; 2],
    beta_minus_1: [f64; 2],
}

impl BetaDensity {
    /// Weighted log densities at x, after clipping x into the open interval.
    pub(super) fn weighted_log_probs(&self, x: f64) -> [f64; 2] {
        let x = clip(x);
        let (ln_x, ln_1mx) = (x.ln(), (-x).ln_1p());
        std::array::from_fn(|k| {
            self.offset[k] + self.alpha_minus_1[k] * ln_x + self.beta_minus_1[k] * ln_1mx
        })
    }
}

/// Posterior responsibilities into `resp`; returns the mean log-likelihood.
fn e_step(bmm: &Bmm, x: &[f64], resp: &mut [[f64; 2]]) -> f64 {
    let density = bmm.density();
    let mut total = 0.0;
    for (&xi, r) in x.iter().zip(resp.iter_mut()) {
        let (post, log_norm) = responsibilities(density.weighted_log_probs(xi));
        *r = post;
        total += log_norm;
    }
    total / x.len() as f64
}

/// New shapes by weighted moments, weights by mean responsibility.
fn m_step(x: &[f64], resp: &[[f64; 2]], previous: Bmm) -> Bmm {
    let mut next = previous;
    for k in 0..2 {
        let weights = resp.iter().map(|r| r[k]);
        match moment_shapes(x, weights) {
            Some(shapes) => {
                next.alphas[k] = shapes.alpha;
                next.betas[k] = shapes.beta;
                next.floor_hits += usize::from(shapes.guarded);
            }
            // No responsibility at all: nothing to estimate from.
            None => next.floor_hits += 1,
        }
        let mass: f64 = resp.iter().map(|r| r[k]).sum();
        next.weights[k] = mass / x.len() as f64;
    }
    next
}

/// Beta shapes from weighted moments.
#[derive(Debug, PartialEq)]
struct Shapes {
    alpha: f64,
    beta: f64,
    /// The concentration had to be clamped.
    guarded: bool,
}

/// Method of moments: x̄ and s² weighted by `w`, then
/// α = x̄(x̄(1−x̄)/s² − 1) and β = α(1−x̄)/x̄. `None` when the weights sum to
/// nothing, since x̄ is then 0/0.
fn moment_shapes(x: &[f64], w: impl Iterator<Item = f64> + Clone) -> Option<Shapes> {
    let mass: f64 = w.clone().sum();
    if mass.is_nan() || mass <= 0.0 {
        return None;
    }
    let mean = x.iter().zip(w.clone()).map(|(xi, wi)| wi * xi).sum::<f64>() / mass;
    let var = x
        .iter()
        .zip(w)
        .map(|(xi, wi)| wi * (xi - mean) * (xi - mean))
        .sum::<f64>()
        / mass;
    // α+β; s² = 0 gives +∞, which the clamp below catches.
    let concentration = mean * (1.0 - mean) / var - 1.0;
    let clamped = concentration.clamp(MIN_CONCENTRATION, MAX_CONCENTRATION);
    // NaN needs NaN responsibilities, which the E-step never produces; it is
    // still mapped to a collapse so no NaN can reach the shapes.
    let (concentration, guarded) = if concentration.is_nan() {
        (MAX_CONCENTRATION, true)
    } else {
        (clamped, clamped != concentration)
    };
    let alpha = mean * concentration;
    Some(Shapes {
        alpha,
        beta: alpha * (1.0 - mean) / mean,
        guarded,
    })
}

/// ln B(α, β) = ln Γ(α) + ln Γ(β) − ln Γ(α+β), the Beta normaliser.
fn ln_beta_fn(alpha: f64, beta: f64) -> f64 {
    ln_gamma(alpha) + ln_gamma(beta) - ln_gamma(alpha + beta)
}

/// Lanczos parameter g and the partial-fraction coefficients for it. They
/// were derived for ncclean by solving, in 60-digit arithmetic, the linear
/// system that makes the approximation exact at z = 0, 1, …, 8 (Godfrey's
/// construction); over x in [0.5, 1e6] the result is within 3e-15 of the true
/// log-gamma (relative, or absolute where |lnΓ| < 1).
const LANCZOS_G: f64 = 7.0;
const LANCZOS_COEFFS: [f64; 9] = [
    0.999_999_999_999_809_9,
    676.520_368_121_885_1,
    -1_259.139_216_722_402_8,
    771.323_428_777_653_1,
    -176.615_029_162_140_6,
    12.507_343_278_686_905,
    -0.138_571_095_265_720_12,
    9.984_369_578_019_572e-6,
    1.505_632_735_149_311_6e-7,
];

/// ln Γ(x) for x > 0 by the Lanczos approximation; NaN for x ≤ 0 (only ever
/// called with positive Beta shapes).
///
/// Γ(z+1) = √(2π) t^{z+½} e^{−t} A(z), with t = z + g + ½ and
/// A(z) = c₀ + Σ_{k=1}^{8} c_k/(z+k). Below ½ the series loses accuracy, so
/// Γ(x) = Γ(x+1)/x shifts the argument up first.
pub(super) fn ln_gamma(x: f64) -> f64 {
    if x.is_nan() || x <= 0.0 {
        return f64::NAN;
    }
    if x < 0.5 {
        return ln_gamma(x + 1.0) - x.ln();
    }
    let z = x - 1.0;
    let t = z + LANCZOS_G + 0.5;
    let series = LANCZOS_COEFFS[1..]
        .iter()
        .zip(1u32..)
        .fold(LANCZOS_COEFFS[0], |acc, (c, k)| {
            acc + c / (z + f64::from(k))
        });
    0.5 * (2.0 * std::f64::consts::PI).ln() + (z + 0.5) * t.ln() - t + series.ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(got: f64, want: f64, tol: f64) -> bool {
        (got - want).abs() <= tol * want.abs().max(1.0)
    }

    #[test]
    fn ln_gamma_at_known_values() {
        let pi = std::f64::consts::PI;
        let cases = [
            (0.5, 0.5 * pi.ln()),            // Γ(½) = √π
            (1.0, 0.0),                      // Γ(1) = 0! = 1
            (1.5, (pi.sqrt() / 2.0).ln()),   // Γ(3/2) = ½Γ(½)
            (2.0, 0.0),                      // Γ(2) = 1! = 1
            (5.0, 24f64.ln()),               // Γ(5) = 4! = 24
            (10.0, 362_880f64.ln()),         // Γ(10) = 9!
            (0.25, 1.288_022_524_698_077_5), // Γ(¼) = 3.6256099082...
        ];
        for (x, want) in cases {
            let got = ln_gamma(x);
            assert!(
                close(got, want, 1e-14),
                "ln_gamma({x}) = {got}, want {want}"
            );
        }
        assert!(ln_gamma(0.0).is_nan() && ln_gamma(-1.0).is_nan());
        assert!(ln_gamma(f64::NAN).is_nan());
    }

    #[test]
    fn ln_gamma_satisfies_the_recurrence() {
        // ln Γ(x+1) = ln Γ(x) + ln x, across the x < ½ switch and far out.
        for x in [1e-6, 0.3, 0.49, 0.51, 0.9, 3.3, 47.0, 1e5] {
            let lhs = ln_gamma(x + 1.0);
            let rhs = ln_gamma(x) + x.ln();
            assert!(close(lhs, rhs, 1e-13), "x = {x}: {lhs} vs {rhs}");
        }
    }

    #[test]
    fn beta_densities_of_simple_shapes() {
        // Unit weights, so these are plain log densities. Beta(1,1) is
        // uniform: density 1. Beta(2,1) = 2x. Beta(2,2) = 6x(1−x).
        let shapes = |alphas, betas| Bmm {
            weights: [1.0, 1.0],
            alphas,
            betas,
            floor_hits: 0,
        };
        let first = shapes([1.0, 2.0], [1.0, 1.0]).density();
        let second = shapes([2.0, 2.0], [2.0, 2.0]).density();
        for x in [0.1, 0.5, 0.9] {
            let [uniform, linear] = first.weighted_log_probs(x);
            assert!(close(uniform, 0.0, 1e-14));
            assert!(close(linear, (2.0 * x).ln(), 1e-14));
            let [parabola, _] = second.weighted_log_probs(x);
            assert!(close(parabola, (6.0 * x * (1.0 - x)).ln(), 1e-14));
        }
        // Outside (0, 1) the score is clipped first: 0 is read as 1e-4.
        let [_, at_zero] = first.weighted_log_probs(0.0);
        assert!(close(at_zero, (2.0 * CLIP).ln(), 1e-14));
    }

    #[test]
    fn e_step_from_the_initial_shapes() {
        // Start: w = (½, ½), Beta(1,2) = 2(1−x) and Beta(2,1) = 2x, so the
        // posterior of component 0 is (1−x). At x = ¼ that is ¾, at ½ it is ½.
        // Log-likelihood: ln(½·2(1−x) + ½·2x) = ln 1 = 0 everywhere.
        let bmm = Bmm {
            weights: [0.5, 0.5],
            alphas: [1.0, 2.0],
            betas: [2.0, 1.0],
            floor_hits: 0,
        };
        let mut resp = vec![[0.0; 2]; 3];
        let ll = e_step(&bmm, &[0.25, 0.5, 0.9], &mut resp);
        assert!(ll.abs() < 1e-14);
        for (r, want) in resp.iter().zip([0.75, 0.5, 0.1]) {
            assert!((r[0] - want).abs() < 1e-14, "{r:?}");
        }
    }

    #[test]
    fn moment_shapes_on_a_small_weighted_sample() {
        // x = (0.2, 0.4, 0.6) with weights (1, 2, 1): mass 4,
        // x̄ = (0.2 + 0.8 + 0.6)/4 = 0.4,
        // s² = (0.04 + 0 + 0.04)/4 = 0.02,
        // α+β = 0.4·0.6/0.02 − 1 = 11, α = 0.4·11 = 4.4, β = 4.4·0.6/0.4 = 6.6.
        let shapes =
            moment_shapes(&[0.2, 0.4, 0.6], [1.0, 2.0, 1.0].into_iter()).expect("positive mass");
        assert!((shapes.alpha - 4.4).abs() < 1e-12, "{shapes:?}");
        assert!((shapes.beta - 6.6).abs() < 1e-12, "{shapes:?}");
        assert!(!shapes.guarded);
    }

    #[test]
    fn moment_shapes_guard_degenerate_components() {
        // All weight on one repeated value: s² = 0, concentration clamped.
        let shapes =
            moment_shapes(&[0.3, 0.3, 0.9], [1.0, 1.0, 0.0].into_iter()).expect("positive mass");
        assert!(shapes.guarded);
        assert!((shapes.alpha + shapes.beta - MAX_CONCENTRATION).abs() < 1e-6);
        assert!((shapes.alpha / (shapes.alpha + shapes.beta) - 0.3).abs() < 1e-12);
        // No weight at all: nothing to estimate.
        assert_eq!(moment_shapes(&[0.3, 0.9], [0.0, 0.0].into_iter()), None);
    }

    #[test]
    fn m_step_counts_guard_hits_and_keeps_shapes_it_cannot_estimate() {
        let start = Bmm {
            weights: [0.5, 0.5],
            alphas: [1.0, 2.0],
            betas: [2.0, 1.0],
            floor_hits: 0,
        };
        // Component 1 owns nothing; component 0 owns two equal points.
        let resp = [[1.0, 0.0], [1.0, 0.0]];
        let next = m_step(&[0.4, 0.4], &resp, start);
        assert_eq!(next.floor_hits, 2);
        assert_eq!((next.alphas[1], next.betas[1]), (2.0, 1.0));
        assert_eq!(next.weights, [1.0, 0.0]);
    }

    #[test]
    fn fit_separates_two_groups() {
        let x: Vec<f64> = (0..40)
            .map(|i| if i < 30 { 0.05 } else { 0.9 } + (i % 5) as f64 * 0.02)
            .collect();
        let fit = fit(&x);
        let Mixture::Bmm(b) = fit.mixture else {
            panic!("not a BMM");
        };
        let means = b.means();
        assert!(means[0] < 0.3 && means[1] > 0.7, "{b:?}");
        assert!((b.weights[0] - 0.75).abs() < 1e-3, "{b:?}");
        assert_eq!(fit.iterations, ITERATIONS);
    }
}
