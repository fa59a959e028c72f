//! The fitted mixture drawn over the statistic it was fitted on: the
//! report's part of the [`DivisionRecord`] that `fit` writes.

use ncclean_pipelines::division::CleanSide;

use crate::curation::division_record::DivisionRecord;

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

/// Drawing the record: the report's part of it.
impl DivisionRecord {
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
    use crate::curation::division_record::test_states::{gmm_state, record};

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
