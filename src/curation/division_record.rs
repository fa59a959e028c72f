//! What `fit` records about its final division (in `stats.json`, for the
//! report): the fitted mixture and a histogram of the statistic it was
//! fitted on, both on the mixture's normalised scale.

use ncclean_pipelines::division::Division;
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
}

/// Test states: a GMM division from 2..4, and the record of a pipeline
/// state as `fit` reads it (`CheckpointState::division` and
/// `division_statistic`).
#[cfg(test)]
pub(crate) mod test_states {
    use super::*;

    /// The record of a pipeline state, as `fit` reads it
    /// (`CheckpointState::division` and `division_statistic`).
    pub(crate) fn record(state: &serde_json::Value, scores: &[f32]) -> Option<DivisionRecord> {
        let division = state
            .get("division")
            .and_then(|d| serde_json::from_value(d.clone()).ok());
        let statistic = state
            .pointer("/method/division_statistic")
            .and_then(serde_json::Value::as_str);
        DivisionRecord::of(division, statistic, scores)
    }

    pub(crate) fn gmm_state() -> serde_json::Value {
        serde_json::json!({"division": {
            "kind": "gmm", "side": "high_mean",
            "normaliser": {"min": 2.0, "max": 4.0},
            "mixture": {"kind": "gmm", "weights": [0.5, 0.5], "means": [0.2, 0.8],
                        "variances": [0.01, 0.04]},
            "clean_component": 1, "fallback": null, "iterations": 3, "converged": true
        }})
    }
}

#[cfg(test)]
mod tests {
    use super::test_states::{gmm_state, record};
    use super::*;

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
}
