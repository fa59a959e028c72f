//! Which pairs count as clean: one place that turns a rule (`--min-prob`,
//! `--keep-fraction`, `--target-precision`, `--remove-noise-rate`) and the
//! scored `clean_prob`s into a cut, for `fit`, `score` and `filter` alike.
//!
//! Every rule ends as "keep `clean_prob >= cut`" (ties at the cut are kept
//! together, so two rows with the same probability never get different
//! labels). Read as a calibrated probability, `clean_prob` gives the
//! expected precision of a kept set (the mean `clean_prob` over it) and the
//! estimated noise rate of the data (the mean of `1 - clean_prob`, which is
//! the mixture's noisy weight at its fixed point), so every cut comes with
//! those two numbers rather than a count at a fixed 0.5.

use std::fmt;

/// The user's rule for the clean set.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rule {
    /// Keep `clean_prob >= p` (the default, 0.5, is the method's own
    /// division).
    MinProb(f64),
    /// Keep this fraction of the scored pairs, highest `clean_prob` first.
    KeepFraction(f64),
    /// Keep the largest set, highest `clean_prob` first, whose expected
    /// precision (mean `clean_prob`) is at least this.
    TargetPrecision(f64),
    /// Remove this fraction of the scored pairs, lowest `clean_prob` first;
    /// `None` removes the estimated noise rate.
    RemoveNoise(Option<f64>),
}

impl Default for Rule {
    fn default() -> Self {
        Rule::MinProb(DEFAULT_MIN_PROB)
    }
}

/// The method's own division: a pair is clean when its clean posterior is
/// at least even.
pub const DEFAULT_MIN_PROB: f64 = 0.5;

impl Rule {
    /// The flag a user writes for this rule (used in messages).
    pub fn flag(&self) -> &'static str {
        match self {
            Rule::MinProb(_) => "--min-prob",
            Rule::KeepFraction(_) => "--keep-fraction",
            Rule::TargetPrecision(_) => "--target-precision",
            Rule::RemoveNoise(_) => "--remove-noise-rate",
        }
    }

    /// Check the rule's value: every value is a probability or a fraction.
    pub fn validate(&self) -> Result<(), String> {
        let v = match *self {
            Rule::MinProb(v) | Rule::KeepFraction(v) | Rule::TargetPrecision(v) => v,
            Rule::RemoveNoise(Some(v)) => v,
            Rule::RemoveNoise(None) => return Ok(()),
        };
        if (0.0..=1.0).contains(&v) {
            Ok(())
        } else {
            Err(format!("{} must be between 0 and 1, got {v}", self.flag()))
        }
    }

    /// Resolve the rule on the scored pairs' `clean_prob`s.
    pub fn resolve(&self, probs: &[f32]) -> Cut {
        let mut sorted: Vec<f32> = probs.iter().copied().filter(|p| p.is_finite()).collect();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let noise = estimated_noise_rate(&sorted);
        let keep_top = |k: usize| -> f64 {
            if k == 0 {
                f64::INFINITY
            } else {
                f64::from(sorted[k.min(sorted.len()) - 1])
            }
        };
        let fraction = |f: f64| (f * sorted.len() as f64).round() as usize;
        let cut = match *self {
            Rule::MinProb(p) => p,
            Rule::KeepFraction(f) => keep_top(fraction(f)),
            Rule::RemoveNoise(r) => {
                keep_top(sorted.len() - fraction(r.unwrap_or(noise)).min(sorted.len()))
            }
            Rule::TargetPrecision(p) => {
                // The running mean of a descending list never rises, so the
                // largest prefix meeting the target is the last one that does.
                // Prefix ends are tie-group ends: a cut keeps a whole group.
                let mut best = 0;
                let mut sum = 0.0f64;
                for (i, &x) in sorted.iter().enumerate() {
                    sum += f64::from(x);
                    let group_end = sorted.get(i + 1).is_none_or(|&next| next < x);
                    if group_end && sum / (i + 1) as f64 >= p {
                        best = i + 1;
                    }
                }
                keep_top(best)
            }
        };
        Cut::at(*self, cut, &sorted, noise)
    }
}

/// How the rule reads in logs and file metadata (never a `Debug` value).
impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rule::MinProb(p) => write!(f, "clean_prob >= {p}"),
            Rule::KeepFraction(k) => write!(f, "keep the top {}", percent(*k)),
            Rule::TargetPrecision(p) => {
                write!(f, "largest set with expected precision >= {}", percent(*p))
            }
            Rule::RemoveNoise(Some(r)) => write!(f, "remove the lowest {}", percent(*r)),
            Rule::RemoveNoise(None) => write!(f, "remove the estimated noise rate"),
        }
    }
}

/// A resolved cut and what it is expected to do.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Cut {
    /// The rule it came from.
    #[serde(serialize_with = "as_text")]
    pub rule: Rule,
    /// Keep `clean_prob >= min_prob` (infinite: keep nothing).
    pub min_prob: f64,
    /// Scored pairs.
    pub scored: usize,
    /// Pairs kept.
    pub kept: usize,
    /// Mean `clean_prob` over the kept pairs (1 when none is kept).
    pub expected_precision: f64,
    /// Share of the estimated noise (the sum of `1 - clean_prob`) that the
    /// removed pairs hold (0 when the data holds no estimated noise).
    pub expected_noise_removed: f64,
    /// Mean of `1 - clean_prob` over every scored pair.
    pub estimated_noise_rate: f64,
}

fn as_text<S: serde::Serializer>(r: &Rule, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&r.to_string())
}

impl Cut {
    fn at(rule: Rule, min_prob: f64, sorted_desc: &[f32], noise: f64) -> Cut {
        let kept = sorted_desc.partition_point(|&p| f64::from(p) >= min_prob);
        let kept_sum: f64 = sorted_desc[..kept].iter().map(|&p| f64::from(p)).sum();
        let removed_noise: f64 = sorted_desc[kept..]
            .iter()
            .map(|&p| 1.0 - f64::from(p))
            .sum();
        let total_noise = noise * sorted_desc.len() as f64;
        Cut {
            rule,
            min_prob,
            scored: sorted_desc.len(),
            kept,
            expected_precision: if kept == 0 {
                1.0
            } else {
                kept_sum / kept as f64
            },
            expected_noise_removed: if total_noise > 0.0 {
                (removed_noise / total_noise).min(1.0)
            } else {
                0.0
            },
            estimated_noise_rate: noise,
        }
    }

    /// Whether a pair with this `clean_prob` is kept (`None`: not scored).
    pub fn keeps(&self, clean_prob: Option<f32>) -> bool {
        clean_prob.is_some_and(|p| f64::from(p) >= self.min_prob)
    }

    /// Kept share of the scored pairs.
    pub fn kept_fraction(&self) -> f64 {
        if self.scored == 0 {
            0.0
        } else {
            self.kept as f64 / self.scored as f64
        }
    }

    /// One sentence for the log: the rule, the cut and its expected effect.
    pub fn summary(&self) -> String {
        let cut = if self.min_prob.is_finite() {
            format!("clean_prob >= {:.4}", self.min_prob)
        } else {
            "no pair".to_string()
        };
        format!(
            "{} -> keeps {cut}: {} of {} pairs ({}), expected precision {}, \
             removing {} of the estimated noise (estimated noise rate {})",
            self.rule,
            self.kept,
            self.scored,
            percent(self.kept_fraction()),
            percent(self.expected_precision),
            percent(self.expected_noise_removed),
            percent(self.estimated_noise_rate),
        )
    }
}

/// The mixture's estimate of the noisy share: the mean of `1 - clean_prob`
/// (non-finite values are not scores and are passed over).
pub fn estimated_noise_rate(probs: &[f32]) -> f64 {
    let (sum, n) = probs
        .iter()
        .filter(|p| p.is_finite())
        .fold((0.0f64, 0usize), |(s, n), &p| {
            (s + 1.0 - f64::from(p), n + 1)
        });
    if n == 0 {
        0.0
    } else {
        sum / n as f64
    }
}

/// The cuts at a range of kept fractions, for the report's threshold table.
pub fn table(probs: &[f32], fractions: &[f64]) -> Vec<Cut> {
    fractions
        .iter()
        .map(|&f| Rule::KeepFraction(f).resolve(probs))
        .collect()
}

/// A percentage rounded for people: one decimal under 10%, none above.
pub fn percent(x: f64) -> String {
    let p = 100.0 * x;
    if p.abs() < 10.0 && p != 0.0 {
        format!("{p:.1}%")
    } else {
        format!("{p:.0}%")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: [f32; 6] = [0.9, 0.2, 0.6, 0.6, 1.0, 0.1];

    #[test]
    fn noise_rate_is_the_mean_noisy_posterior() {
        // 1 - p: 0.1 + 0.8 + 0.4 + 0.4 + 0 + 0.9 = 2.6 over 6.
        assert!((estimated_noise_rate(&P) - 2.6 / 6.0).abs() < 1e-6);
        assert_eq!(estimated_noise_rate(&[]), 0.0);
        assert_eq!(estimated_noise_rate(&[f32::NAN]), 0.0);
    }

    #[test]
    fn min_prob_keeps_at_or_above_the_cut() {
        let c = Rule::MinProb(0.6).resolve(&P);
        assert_eq!(c.kept, 4); // 1.0, 0.9, 0.6, 0.6
        assert!((c.expected_precision - 3.1 / 4.0).abs() < 1e-6);
        // Removed: 0.2 and 0.1 hold 0.8 + 0.9 of the 2.6 noise.
        assert!((c.expected_noise_removed - 1.7 / 2.6).abs() < 1e-6);
        assert!(c.keeps(Some(0.6)) && !c.keeps(Some(0.59)) && !c.keeps(None));
    }

    #[test]
    fn keep_fraction_keeps_ties_together() {
        // Half of 6 = 3: the third highest is 0.6, tied with the fourth.
        let c = Rule::KeepFraction(0.5).resolve(&P);
        assert_eq!(c.min_prob, f64::from(0.6f32));
        assert_eq!(c.kept, 4);
        let none = Rule::KeepFraction(0.0).resolve(&P);
        assert_eq!((none.kept, none.expected_precision), (0, 1.0));
        assert!(none.min_prob.is_infinite() && !none.keeps(Some(1.0)));
        assert_eq!(Rule::KeepFraction(1.0).resolve(&P).kept, 6);
    }

    #[test]
    fn target_precision_takes_the_largest_prefix_meeting_it() {
        // Running means by tie group: {1.0} 1.0, {0.9} 0.95, {0.6,0.6} 0.775,
        // {0.2} 0.66, {0.1} 0.5667.
        for (target, kept) in [
            (0.94, 2),
            (0.8, 2),
            (0.77, 4),
            (0.7, 4),
            (0.65, 5),
            (0.5, 6),
        ] {
            let c = Rule::TargetPrecision(target).resolve(&P);
            assert_eq!(c.kept, kept, "target {target}");
            assert!(c.expected_precision >= target - 1e-6);
        }
        assert_eq!(Rule::TargetPrecision(1.0).resolve(&P).kept, 1);
        assert_eq!(Rule::TargetPrecision(1.0).resolve(&[0.5]).kept, 0);
    }

    #[test]
    fn remove_noise_removes_the_estimated_share() {
        // Estimated rate 2.6 / 6 = 0.433 -> remove round(2.6) = 3 pairs: the
        // cut is the third highest (0.6), whose tie keeps a fourth.
        let c = Rule::RemoveNoise(None).resolve(&P);
        assert_eq!(c.min_prob, f64::from(0.6f32));
        assert_eq!(c.kept, 4);
        let c = Rule::RemoveNoise(Some(1.0 / 3.0)).resolve(&P);
        assert_eq!(c.kept, 4);
        assert_eq!(Rule::RemoveNoise(Some(1.0)).resolve(&P).kept, 0);
        assert_eq!(Rule::RemoveNoise(Some(0.0)).resolve(&P).kept, 6);
    }

    #[test]
    fn out_of_range_values_name_their_flag() {
        assert_eq!(
            Rule::TargetPrecision(1.5).validate().unwrap_err(),
            "--target-precision must be between 0 and 1, got 1.5"
        );
        assert!(Rule::RemoveNoise(None).validate().is_ok());
        assert!(Rule::MinProb(-0.1).validate().is_err());
        assert!(Rule::KeepFraction(f64::NAN).validate().is_err());
    }

    #[test]
    fn rules_and_cuts_read_as_sentences() {
        assert_eq!(Rule::MinProb(0.5).to_string(), "clean_prob >= 0.5");
        assert_eq!(Rule::KeepFraction(0.8).to_string(), "keep the top 80%");
        assert_eq!(
            Rule::TargetPrecision(0.95).to_string(),
            "largest set with expected precision >= 95%"
        );
        assert_eq!(
            Rule::RemoveNoise(None).to_string(),
            "remove the estimated noise rate"
        );
        let s = Rule::MinProb(0.6).resolve(&P).summary();
        assert!(
            s.starts_with("clean_prob >= 0.6 -> keeps clean_prob >= 0.6000: 4 of 6 pairs (67%)"),
            "{s}"
        );
        assert!(!s.contains("MinProb"), "{s}");
        assert_eq!(percent(0.0512), "5.1%");
        assert_eq!(percent(0.95), "95%");
    }

    #[test]
    fn empty_scores_keep_nothing_without_panicking() {
        for rule in [
            Rule::MinProb(0.5),
            Rule::KeepFraction(0.5),
            Rule::TargetPrecision(0.9),
            Rule::RemoveNoise(None),
        ] {
            let c = rule.resolve(&[]);
            assert_eq!((c.scored, c.kept), (0, 0), "{rule}");
            assert_eq!(c.kept_fraction(), 0.0);
        }
    }

    #[test]
    fn table_rows_follow_the_fractions() {
        let t = table(&P, &[1.0, 0.5, 0.0]);
        assert_eq!(t.iter().map(|c| c.kept).collect::<Vec<_>>(), [6, 4, 0]);
    }
}
