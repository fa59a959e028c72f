//! What `fit` records about its final division for the report: the fitted
//! mixture and a histogram of the statistic it was fitted on, both on the
//! mixture's normalised scale, small enough for `stats.json`.

use ncclean_pipelines::division::{CleanSide, Division};
use serde::{Deserialize, Serialize};

use super::histogram::Histogram;

/// Bins of the recorded statistic histogram over the normalised [0, 1].
pub const STATISTIC_BINS: usize = 40;

/// The final division and the statistic it divided.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DivisionRecord {
    /// How the method computes the statistic, in its own words.
    pub statistic: Option<String>,
    /// The division as fitted: mixture family, clean side, the min–max
    /// normaliser, the parameters, and any fallback.
    pub division: Division,
    /// The scored pairs' statistic, normalised by the division's
    /// normaliser (so on the scale the mixture lives on), in
    /// [`STATISTIC_BINS`] bins over [0, 1].
    pub histogram: Histogram,
}

/// The mixture's two components as expected pair counts per histogram bin,
/// at points across [0, 1].
#[derive(Debug, Clone, PartialEq)]
pub struct Overlay {
    /// Normalised statistic values.
    pub x: Vec<f64>,
    /// Expected pairs per bin from the clean component at each `x`.
    pub clean: Vec<f64>,
    /// Expected pairs per bin from the noisy component at each `x`.
    pub noisy: Vec<f64>,
}

impl DivisionRecord {
    /// The record of a run's final division (`None`: the run has none),
    /// with the method's own description of its statistic where it gives
    /// one, and the raw statistic of the scored pairs.
    pub fn of(
        division: Option<Division>,
        statistic: Option<&str>,
        scores: &[f32],
    ) -> Option<DivisionRecord> {
        let division = division?;
        let histogram = Histogram::of(
            scores
                .iter()
                .filter(|s| s.is_finite())
                .map(|&s| division.normaliser.apply(f64::from(s))),
            0.0,
            1.0,
            STATISTIC_BINS,
        );
        Some(DivisionRecord {
            statistic: statistic.map(str::to_string),
            division,
            histogram,
        })
    }

    /// The fitted components scaled to the histogram (pairs × bin width ×
    /// weighted density, so the curves sum to the bars' heights where the
    /// mixture fits), at `points` evenly spaced values; `None` when no
    /// mixture was fitted (a fallback) or its clean component is not 0 or 1.
    pub fn overlay(&self, points: usize) -> Option<Overlay> {
        let mixture = self.division.mixture.as_ref()?;
        let clean = self.division.clean_component;
        if clean > 1 {
            return None;
        }
        let scale = self.histogram.total() as f64 * self.histogram.bin_width();
        let points = points.max(2);
        let x: Vec<f64> = (0..points)
            .map(|i| i as f64 / (points - 1) as f64)
            .collect();
        let dens: Vec<[f64; 2]> = x.iter().map(|&x| mixture.weighted_densities(x)).collect();
        Some(Overlay {
            clean: dens.iter().map(|d| scale * d[clean]).collect(),
            noisy: dens.iter().map(|d| scale * d[1 - clean]).collect(),
            x,
        })
    }

    /// Which end of the normalised scale is clean, in words for a plot.
    pub fn clean_end(&self) -> &'static str {
        match self.division.side {
            CleanSide::LowMean => "low values are clean (a loss)",
            CleanSide::HighMean => "high values are clean (a similarity or consistency)",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The record of a pipeline state, as `fit` reads it
    /// (`CheckpointState::division` and `division_statistic`).
    fn record(state: &serde_json::Value, scores: &[f32]) -> Option<DivisionRecord> {
        let division = state
            .get("division")
            .and_then(|d| serde_json::from_value(d.clone()).ok());
        let statistic = state
            .pointer("/method/division_statistic")
            .and_then(serde_json::Value::as_str);
        DivisionRecord::of(division, statistic, scores)
    }

    fn gmm_state() -> serde_json::Value {
        serde_json::json!({"division": {
            "kind": "gmm", "side": "high_mean",
            "normaliser": {"min": 2.0, "max": 4.0},
            "mixture": {"kind": "gmm", "weights": [0.5, 0.5], "means": [0.2, 0.8],
                        "variances": [0.01, 0.04]},
            "clean_component": 1, "fallback": null, "iterations": 3, "converged": true
        }})
    }

    #[test]
    fn records_the_normalised_statistic_and_the_mixture() {
        // Raw 2..4 normalise to 0..1: 2 -> 0, 3 -> 0.5, 4 -> 1 (last bin),
        // 9 clamps to 1; NaN is passed over.
        let mut state = gmm_state();
        state["method"] = serde_json::json!({"division_statistic": "loss"});
        let r = record(&state, &[2.0, 3.0, 4.0, 9.0, f32::NAN]).unwrap();
        assert_eq!(r.histogram.total(), 4);
        assert_eq!(r.histogram.counts[0], 1);
        assert_eq!(r.histogram.counts[STATISTIC_BINS / 2], 1);
        assert_eq!(r.histogram.counts[STATISTIC_BINS - 1], 2);
        assert_eq!(r.statistic.as_deref(), Some("loss"));
        assert!(record(&serde_json::json!({}), &[1.0]).is_none());
        assert_eq!(record(&gmm_state(), &[1.0]).unwrap().statistic, None);
    }

    #[test]
    fn overlay_scales_the_weighted_densities_to_bar_heights() {
        let scores: Vec<f32> = (0..100).map(|i| 2.0 + 2.0 * i as f32 / 99.0).collect();
        let r = record(&gmm_state(), &scores).unwrap();
        let o = r.overlay(11).unwrap();
        // x = 0.2 is point 2. Noisy is component 0 (the clean one is 1):
        // 100 pairs × 0.025 bin width × 0.5 × 1/sqrt(2π·0.01) = 4.986779.
        assert!((o.x[2] - 0.2).abs() < 1e-12);
        assert!((o.noisy[2] - 4.986_779).abs() < 1e-5, "{}", o.noisy[2]);
        // x = 0.6, one sd below the clean mean 0.8: 100 × 0.025 × 0.5 ×
        // exp(-0.5)/sqrt(2π·0.04) = 1.512318.
        assert!((o.clean[6] - 1.512_318).abs() < 1e-5, "{}", o.clean[6]);
        assert_eq!(
            r.clean_end(),
            "high values are clean (a similarity or consistency)"
        );
    }

    #[test]
    fn no_overlay_without_a_mixture() {
        let mut state = gmm_state();
        state["division"]["mixture"] = serde_json::Value::Null;
        state["division"]["fallback"] = serde_json::json!("constant");
        let r = record(&state, &[1.0, 2.0]).unwrap();
        assert!(r.overlay(10).is_none());
    }
}
