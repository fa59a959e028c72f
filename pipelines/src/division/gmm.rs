//! Two-component 1-D Gaussian mixture by EM, following scikit-learn's
//! `GaussianMixture(n_components=2, max_iter=10, tol=1e-2, reg_covar=5e-4)`
//! step for step, because the published methods (NCR and its descendants)
//! divide with exactly that call and their thresholds were tuned on it.
//!
//! The one intended difference is the k-means start: sklearn runs k-means++
//! with a random seed, ncclean runs Lloyd's algorithm from the minimum and the
//! maximum, which is deterministic and, in 1-D, reaches the same partition
//! whenever the data have one clear two-way split.
//!
//! sklearn ends `fit` with one more E-step under the final parameters; that
//! only labels the training points, and `Division::clean_prob` does the same
//! thing from the stored parameters, so `fit` here stops at the last M-step.

use super::{responsibilities, EmFit, Gmm, Mixture};

/// Added to every variance, as sklearn's `reg_covar`, so that a component
/// sitting on repeated values cannot reach zero variance.
const REG_COVAR: f64 = 5e-4;
/// EM iterations at most.
const MAX_ITER: usize = 10;
/// Stop once the mean log-likelihood moves less than this.
const TOL: f64 = 1e-2;
/// sklearn adds 10 machine epsilons to each component mass to avoid 0/0.
const MASS_EPS: f64 = 10.0 * f64::EPSILON;
/// Lloyd's algorithm in 1-D settles in a handful of steps; this only bounds
/// the loop should floating point ever make it oscillate.
const MAX_LLOYD_STEPS: usize = 1000;

/// Hard or soft responsibilities of the two components for one point.
type Resp = [f64; 2];

/// Fit on normalised scores (at least two distinct values).
pub(super) fn fit(x: &[f64]) -> EmFit {
    let mut resp: Vec<Resp> = two_means(x)
        .into_iter()
        .map(|upper| if upper { [0.0, 1.0] } else { [1.0, 0.0] })
        .collect();
    // sklearn's initial M-step divides the masses by n; later ones by their sum.
    let mut gmm = m_step(x, &resp, WeightScale::SampleCount);
    let mut lower_bound = f64::NEG_INFINITY;
    let mut iterations = 0;
    let mut converged = false;
    while iterations < MAX_ITER {
        iterations += 1;
        let previous = lower_bound;
        lower_bound = e_step(&gmm, x, &mut resp);
        gmm = m_step(x, &resp, WeightScale::MassSum);
        if (lower_bound - previous).abs() < TOL {
            converged = true;
            break;
        }
    }
    EmFit {
        mixture: Mixture::Gmm(gmm),
        iterations,
        converged,
    }
}

impl Gmm {
    /// log(w_k) + log N(x; μ_k, σ²_k) for both components, written the way
    /// sklearn writes it (through the precision's Cholesky factor) so the
    /// rounding matches as closely as it cheaply can.
    pub(super) fn weighted_log_probs(&self, x: f64) -> [f64; 2] {
        let half_log_two_pi = 0.5 * (2.0 * std::f64::consts::PI).ln();
        std::array::from_fn(|k| {
            let precision_chol = 1.0 / self.variances[k].sqrt();
            let y = x * precision_chol - self.means[k] * precision_chol;
            self.weights[k].ln() - half_log_two_pi - 0.5 * y * y + precision_chol.ln()
        })
    }
}

/// How the component masses become weights.
#[derive(Clone, Copy)]
enum WeightScale {
    /// Divide by the number of points (sklearn's `_initialize`).
    SampleCount,
    /// Divide by the sum of the masses (sklearn's `_m_step`).
    MassSum,
}

/// Weighted means and variances (plus the floor) from responsibilities.
fn m_step(x: &[f64], resp: &[Resp], scale: WeightScale) -> Gmm {
    let mut mass = [MASS_EPS; 2];
    let mut sum = [0.0; 2];
    for (&xi, r) in x.iter().zip(resp) {
        for k in 0..2 {
            mass[k] += r[k];
            sum[k] += r[k] * xi;
        }
    }
    let means = [sum[0] / mass[0], sum[1] / mass[1]];
    let mut sq = [0.0; 2];
    for (&xi, r) in x.iter().zip(resp) {
        for k in 0..2 {
            let d = xi - means[k];
            sq[k] += r[k] * d * d;
        }
    }
    let variances = [sq[0] / mass[0] + REG_COVAR, sq[1] / mass[1] + REG_COVAR];
    let denom = match scale {
        WeightScale::SampleCount => x.len() as f64,
        WeightScale::MassSum => mass[0] + mass[1],
    };
    Gmm {
        weights: [mass[0] / denom, mass[1] / denom],
        means,
        variances,
    }
}

/// Posterior responsibilities into `resp`; returns the mean log-likelihood,
/// which is what sklearn calls the lower bound for a GMM.
fn e_step(gmm: &Gmm, x: &[f64], resp: &mut [Resp]) -> f64 {
    let mut total = 0.0;
    for (&xi, r) in x.iter().zip(resp.iter_mut()) {
        let (post, log_norm) = responsibilities(gmm.weighted_log_probs(xi));
        *r = post;
        total += log_norm;
    }
    total / x.len() as f64
}

/// 1-D two-means by Lloyd's algorithm started at the minimum and the maximum,
/// run until no point changes side. `true` marks the upper cluster.
///
/// A point exactly between the centres goes to the lower one. An empty
/// cluster (impossible unless all points are equal) keeps its centre.
fn two_means(x: &[f64]) -> Vec<bool> {
    let (lo, hi) = x
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &v| {
            (lo.min(v), hi.max(v))
        });
    let mut centres = [lo, hi];
    let mut upper: Vec<bool> = Vec::new();
    for _ in 0..MAX_LLOYD_STEPS {
        let next: Vec<bool> = x
            .iter()
            .map(|&v| (v - centres[1]).abs() < (v - centres[0]).abs())
            .collect();
        if next == upper {
            break;
        }
        upper = next;
        centres = cluster_means(x, &upper, centres);
    }
    upper
}

/// Mean of each side; a side with no points keeps its previous centre.
fn cluster_means(x: &[f64], upper: &[bool], previous: [f64; 2]) -> [f64; 2] {
    let mut sum = [0.0; 2];
    let mut count = [0usize; 2];
    for (&v, &u) in x.iter().zip(upper) {
        let k = usize::from(u);
        sum[k] += v;
        count[k] += 1;
    }
    std::array::from_fn(|k| {
        if count[k] == 0 {
            previous[k]
        } else {
            sum[k] / count[k] as f64
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e_step_on_four_points() {
        // Weights (3/4, 1/4), means (0, 1), unit variances. The Gaussian
        // normalisers cancel in the ratio, so
        //   post0(x) = 1 / (1 + (1/4)e^{-(x-1)^2/2} / ((3/4)e^{-x^2/2}))
        //            = 1 / (1 + e^{x - 1/2} / 3).
        // x = 0:   e^{-0.5}/3 = 0.20217689 -> 0.83182434
        // x = 0.5: 1/3                     -> 0.75
        // x = 1:   e^{0.5}/3  = 0.54957376 -> 0.64533876
        // x = 2.5: e^{2}/3    = 2.46301870 -> 0.28876541
        // Log-likelihood of x: -ln(2π)/2 - x²/2 + ln(3/4 + e^{x-1/2}/4):
        // x = 0: -0.91893853 + ln(0.90163267) = -1.02248662, and likewise
        // -1.04393853, -1.26864071, -3.08947994; their mean is -1.60613645.
        let gmm = Gmm {
            weights: [0.75, 0.25],
            means: [0.0, 1.0],
            variances: [1.0, 1.0],
        };
        let x = [0.0, 0.5, 1.0, 2.5];
        let mut resp = vec![[0.0; 2]; 4];
        let mean_ll = e_step(&gmm, &x, &mut resp);
        let want = [0.83182434, 0.75, 0.64533876, 0.28876541];
        for (r, w) in resp.iter().zip(want) {
            assert!((r[0] - w).abs() < 1e-8, "{r:?} vs {w}");
            assert!((r[0] + r[1] - 1.0).abs() < 1e-15);
        }
        assert!((mean_ll - -1.60613645).abs() < 1e-8, "{mean_ll}");
    }

    #[test]
    fn initial_m_step_from_hard_labels() {
        // Clusters {0, 0.2} and {0.8, 1}: means 0.1 and 0.9, population
        // variances (0.01 + 0.01)/2 = 0.01, plus the 5e-4 floor = 0.0105;
        // two of four points each -> weights 1/2 (up to sklearn's 10 eps).
        let x = [0.0, 0.2, 0.8, 1.0];
        let resp = [[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]];
        let g = m_step(&x, &resp, WeightScale::SampleCount);
        for (got, want) in [
            (g.means[0], 0.1),
            (g.means[1], 0.9),
            (g.variances[0], 0.0105),
            (g.variances[1], 0.0105),
            (g.weights[0], 0.5),
            (g.weights[1], 0.5),
        ] {
            assert!((got - want).abs() < 1e-12, "{got} vs {want}");
        }
    }

    #[test]
    fn two_means_from_the_extremes() {
        // Start (0, 1): 0.1, 0.2 go low and 0.9 goes high at once; stable.
        assert_eq!(
            two_means(&[0.9, 0.0, 0.1, 1.0, 0.2]),
            [true, false, false, true, false]
        );
        // Start (0, 1): 0.52 is past the midpoint 0.5 and goes high, giving
        // centres 0.3 (= 1.5/5) and 0.904 (= 4.52/5). The new midpoint 0.602
        // sends 0.52 back low; centres 0.3367 and 1, midpoint 0.668: stable.
        let x = [0.0, 0.3, 0.35, 0.4, 0.45, 0.52, 1.0, 1.0, 1.0, 1.0];
        let want = [
            false, false, false, false, false, false, true, true, true, true,
        ];
        assert_eq!(two_means(&x), want);
        // Exactly between the starting centres -> lower side.
        assert_eq!(two_means(&[0.0, 0.5, 1.0]), [false, false, true]);
    }

    #[test]
    fn empty_cluster_keeps_its_centre() {
        assert_eq!(
            cluster_means(&[1.0, 2.0], &[false, false], [7.0, 9.0]),
            [1.5, 9.0]
        );
    }

    #[test]
    fn fit_stops_on_small_change_and_reports_it() {
        let x: Vec<f64> = (0..40)
            .map(|i| if i < 25 { 0.1 } else { 0.9 } + (i % 4) as f64 * 0.01)
            .collect();
        let fit = fit(&x);
        assert!(fit.converged);
        assert!(fit.iterations >= 2 && fit.iterations <= MAX_ITER);
        let Mixture::Gmm(g) = fit.mixture else {
            panic!("not a GMM");
        };
        assert!((g.weights[0] - 25.0 / 40.0).abs() < 1e-6, "{g:?}");
    }
}
