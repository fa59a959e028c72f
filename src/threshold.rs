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
//!
//! A rule that depends on the distribution (a fraction, a precision) must
//! give one cut on every shard that `score` labels apart, so `fit` resolves
//! it once on the training pairs and stores the cut with a [`Sketch`] of
//! their distribution ([`Record`], `checkpoint/threshold.json`); `score`
//! applies that cut, or resolves a new rule on the sketch, never per shard.

use std::fmt;
use std::path::Path;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::error::{invalid, Result};

/// The user's rule for the clean set.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "rule", content = "value", rename_all = "snake_case")]
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

/// The cut of a rule that keeps no pair: above every probability, and
/// finite so that it survives JSON.
pub const KEEP_NONE: f64 = 2.0;

/// Most points a [`Sketch`] holds: a cut resolved on it lands within one
/// point (0.1% of the pairs) of the cut on the full distribution.
pub const SKETCH_POINTS: usize = 1001;

impl Rule {
    /// Whether the rule keeps what the method's division calls clean (its
    /// own cut at `threshold`, or removing its estimated noise) rather than
    /// a share or precision the user chose.
    pub fn follows_division(&self, threshold: f64) -> bool {
        matches!(self, Rule::RemoveNoise(None)) || *self == Rule::MinProb(threshold)
    }

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
    pub fn validate(&self) -> std::result::Result<(), String> {
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

    /// The absolute cut of the rule on these `clean_prob`s (non-finite
    /// values are not scores and are passed over).
    pub fn min_prob(&self, probs: &[f32]) -> f64 {
        let mut sorted: Vec<f32> = probs.iter().copied().filter(|p| p.is_finite()).collect();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let keep_top = |k: usize| -> f64 {
            if k == 0 {
                KEEP_NONE
            } else {
                f64::from(sorted[k.min(sorted.len()) - 1])
            }
        };
        let fraction = |f: f64| (f * sorted.len() as f64).round() as usize;
        match *self {
            Rule::MinProb(p) => p,
            Rule::KeepFraction(f) => keep_top(fraction(f)),
            Rule::RemoveNoise(r) => {
                let rate = r.unwrap_or_else(|| estimated_noise_rate(&sorted));
                keep_top(sorted.len() - fraction(rate).min(sorted.len()))
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
        }
    }

    /// Resolve the rule on the scored pairs' `clean_prob`s: the cut and
    /// what it does to them.
    pub fn resolve(&self, probs: &[f32]) -> Cut {
        Cut::of(*self, self.min_prob(probs), probs)
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

/// Running sums of a cut over scored pairs, added a file at a time (so
/// `score` need not hold every file's probabilities to report the whole).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Tally {
    scored: usize,
    kept: usize,
    at_cut: usize,
    kept_sum: f64,
    noise_sum: f64,
    removed_noise: f64,
}

impl Tally {
    /// Add the pairs `probs` under the cut `min_prob` (non-finite values
    /// are not scores and are passed over).
    pub fn add(&mut self, probs: &[f32], min_prob: f64) {
        for p in probs
            .iter()
            .filter(|p| p.is_finite())
            .map(|&p| f64::from(p))
        {
            self.scored += 1;
            self.noise_sum += 1.0 - p;
            if p >= min_prob {
                self.kept += 1;
                self.kept_sum += p;
                if p == min_prob {
                    self.at_cut += 1;
                }
            } else {
                self.removed_noise += 1.0 - p;
            }
        }
    }

    /// Add another tally's pairs.
    pub fn merge(&mut self, o: &Tally) {
        self.scored += o.scored;
        self.kept += o.kept;
        self.at_cut += o.at_cut;
        self.kept_sum += o.kept_sum;
        self.noise_sum += o.noise_sum;
        self.removed_noise += o.removed_noise;
    }
}

/// A resolved cut and what it is expected to do.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Cut {
    /// The rule it came from.
    pub rule: Rule,
    /// Keep `clean_prob >= min_prob` ([`KEEP_NONE`]: keep nothing).
    pub min_prob: f64,
    /// Scored pairs.
    pub scored: usize,
    /// Pairs kept.
    pub kept: usize,
    /// Kept pairs whose `clean_prob` is the cut itself: a tie the cut
    /// cannot fall inside (0 in records written before it was counted).
    #[serde(default)]
    pub tied_at_cut: usize,
    /// Mean `clean_prob` over the kept pairs (1 when none is kept).
    pub expected_precision: f64,
    /// Share of the estimated noise (the sum of `1 - clean_prob`) that the
    /// removed pairs hold (0 when the data holds no estimated noise).
    pub expected_noise_removed: f64,
    /// Mean of `1 - clean_prob` over every scored pair.
    pub estimated_noise_rate: f64,
}

impl Cut {
    /// The cut `min_prob` (from `rule`) applied to `probs`.
    pub fn of(rule: Rule, min_prob: f64, probs: &[f32]) -> Cut {
        let mut t = Tally::default();
        t.add(probs, min_prob);
        Cut::from_tally(rule, min_prob, &t)
    }

    /// The cut `min_prob` (from `rule`) over the pairs of a tally.
    pub fn from_tally(rule: Rule, min_prob: f64, t: &Tally) -> Cut {
        Cut {
            rule,
            min_prob,
            scored: t.scored,
            kept: t.kept,
            tied_at_cut: t.at_cut,
            expected_precision: if t.kept == 0 {
                1.0
            } else {
                t.kept_sum / t.kept as f64
            },
            expected_noise_removed: if t.noise_sum > 0.0 {
                (t.removed_noise / t.noise_sum).min(1.0)
            } else {
                0.0
            },
            estimated_noise_rate: if t.scored == 0 {
                0.0
            } else {
                t.noise_sum / t.scored as f64
            },
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

    /// The cut for people: `clean_prob >= 0.9340`, or `no pair`.
    pub fn condition(&self) -> String {
        if self.min_prob <= 1.0 {
            format!("clean_prob >= {:.4}", self.min_prob)
        } else {
            "no pair".to_string()
        }
    }

    /// One sentence for the log: the rule, the cut and its expected effect.
    pub fn summary(&self) -> String {
        format!(
            "{} -> keeping {}: {} of {} pairs ({}), expected precision {}, \
             removing {} of the estimated noise (estimated noise rate {}){}",
            self.rule,
            self.condition(),
            self.kept,
            self.scored,
            percent(self.kept_fraction()),
            percent3(self.expected_precision),
            percent(self.expected_noise_removed),
            percent(self.estimated_noise_rate),
            self.tie_note()
                .map(|n| format!("; {n}"))
                .unwrap_or_default(),
        )
    }

    /// The share of the pairs the rule asked to keep, for a rule that
    /// names one (a fraction, or removing a share or the estimated noise).
    pub fn asked_share(&self) -> Option<f64> {
        match self.rule {
            Rule::KeepFraction(f) => Some(f),
            Rule::RemoveNoise(Some(r)) => Some(1.0 - r),
            Rule::RemoveNoise(None) => Some(1.0 - self.estimated_noise_rate),
            Rule::MinProb(_) | Rule::TargetPrecision(_) => None,
        }
    }

    /// Why a rule that asked for a share keeps clearly more: the pairs at
    /// the cut share one `clean_prob` and ties are kept together. A
    /// confident mixture gives most clean pairs exactly 1.0 in f32 (GSC's
    /// and CRCL's presets on frozen Flickr8k features: 70% and 79%), so
    /// no share below theirs can be cut by `clean_prob` alone.
    pub fn tie_note(&self) -> Option<String> {
        let asked = self.asked_share()?;
        let n = self.scored.max(1) as f64;
        let excess = self.kept_fraction() - asked;
        let slack = (1.0 / n).max(0.01);
        let untied = self.kept.saturating_sub(self.tied_at_cut) as f64 / n;
        // Said only when the tie is what tips it: without the tied pairs
        // the cut would keep at most what was asked.
        if self.tied_at_cut < 2 || excess <= slack || untied > asked + slack {
            return None;
        }
        Some(format!(
            "{} pairs ({}) share clean_prob {:.4} at the cut and are kept together, so it \
             keeps {} where {} was asked (the mixture is that sure of them: rank them by \
             ncclean_similarity to cut among them)",
            self.tied_at_cut,
            percent(self.tied_at_cut as f64 / n),
            self.min_prob,
            percent(self.kept_fraction()),
            percent(asked),
        ))
    }
}

/// The cuts at a range of kept fractions, for the report's threshold table.
pub fn table(probs: &[f32], fractions: &[f64]) -> Vec<Cut> {
    fractions
        .iter()
        .map(|&f| Rule::KeepFraction(f).resolve(probs))
        .collect()
}

/// A bounded summary of a `clean_prob` distribution: the values at
/// [`SKETCH_POINTS`] evenly spaced ranks, highest first (all of them when
/// there are fewer). A rule resolved on it reads each point as an equal
/// share of the pairs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sketch {
    /// Pairs summarised.
    pub pairs: usize,
    /// The values at evenly spaced ranks, descending.
    pub points: Vec<f32>,
}

impl Sketch {
    /// Summarise `probs` (non-finite values are passed over).
    pub fn of(probs: &[f32]) -> Sketch {
        let mut sorted: Vec<f32> = probs.iter().copied().filter(|p| p.is_finite()).collect();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let n = sorted.len();
        let points = if n <= SKETCH_POINTS {
            sorted
        } else {
            let m = SKETCH_POINTS - 1;
            (0..=m).map(|i| sorted[(i * (n - 1) + m / 2) / m]).collect()
        };
        Sketch { pairs: n, points }
    }
}

/// What `fit` decided about the clean set, stored beside the checkpoint
/// (`checkpoint/threshold.json`) so that `score` applies the same cut on
/// every shard.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// The rule and its cut, resolved on the training pairs.
    pub cut: Cut,
    /// The training pairs' `clean_prob` distribution, for rules given to
    /// `score`.
    pub sketch: Sketch,
}

/// File name of the [`Record`] in a checkpoint directory.
pub const RECORD_FILE: &str = "threshold.json";

impl Record {
    /// Resolve `rule` on the training pairs' `probs`.
    pub fn fit(rule: Rule, probs: &[f32]) -> Record {
        Record {
            cut: rule.resolve(probs),
            sketch: Sketch::of(probs),
        }
    }

    /// The cut of another rule, resolved on the training distribution:
    /// the same on every shard it is applied to. Its counts are the
    /// sketch's, so only `min_prob` and the rule are meant to be used.
    pub fn cut_for(&self, rule: Rule) -> Cut {
        rule.resolve(&self.sketch.points)
    }

    /// Write into the checkpoint directory `dir` (atomically).
    pub fn save(&self, dir: &Path) -> Result<()> {
        let json = serde_json::to_vec_pretty(self).context("serialising the threshold record")?;
        crate::data::write_atomic(&dir.join(RECORD_FILE), &json)
    }

    /// The record in the checkpoint directory `dir`; `None` for a
    /// checkpoint written before records existed.
    pub fn load(dir: &Path) -> Result<Option<Record>> {
        let p = dir.join(RECORD_FILE);
        if !p.is_file() {
            return Ok(None);
        }
        let bytes = std::fs::read(&p).with_context(|| format!("cannot read {}", p.display()))?;
        let r: Record = serde_json::from_slice(&bytes).map_err(|e| {
            invalid(format!(
                "{}: not a valid ncclean threshold record ({e}); run `ncclean fit` again",
                p.display()
            ))
        })?;
        r.cut
            .rule
            .validate()
            .map_err(|e| invalid(format!("{}: {e}; run `ncclean fit` again", p.display())))?;
        Ok(Some(r))
    }
}

/// The mixture's estimate of the noisy share: the mean of `1 - clean_prob`
/// (non-finite values are not scores and are passed over).
pub fn estimated_noise_rate(probs: &[f32]) -> f64 {
    Cut::of(Rule::default(), DEFAULT_MIN_PROB, probs).estimated_noise_rate
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

/// A percentage with one decimal: precisions differ in the last percent.
pub fn percent3(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
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
        assert!(none.min_prob == KEEP_NONE && !none.keeps(Some(1.0)));
        assert_eq!(none.condition(), "no pair");
        assert_eq!(Rule::KeepFraction(1.0).resolve(&P).kept, 6);
    }

    #[test]
    fn a_tie_that_keeps_more_than_asked_is_said() {
        // Seven of ten pairs at exactly 1.0: keeping half keeps all seven.
        let probs = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.3, 0.2, 1e-20];
        let c = Rule::KeepFraction(0.5).resolve(&probs);
        assert_eq!((c.kept, c.tied_at_cut), (7, 7));
        assert_eq!(c.asked_share(), Some(0.5));
        let s = c.summary();
        assert!(
            s.ends_with(
                "; 7 pairs (70%) share clean_prob 1.0000 at the cut and are kept together, so it \
                 keeps 70% where 50% was asked (the mixture is that sure of them: rank them by \
                 ncclean_similarity to cut among them)"
            ),
            "{s}"
        );
        // Removing 10% asks to keep 90%: the 3 below 1.0 are distinct, so
        // the cut falls between them and nothing is said.
        let c = Rule::RemoveNoise(Some(0.1)).resolve(&probs);
        assert_eq!((c.kept, c.tied_at_cut), (9, 1));
        assert_eq!(c.tie_note(), None);
        // A tie that keeps exactly what was asked, and rules that ask for
        // no share, say nothing.
        assert_eq!(Rule::KeepFraction(0.7).resolve(&probs).tie_note(), None);
        assert_eq!(Rule::MinProb(0.5).resolve(&probs).tie_note(), None);
        assert_eq!(Rule::TargetPrecision(0.9).resolve(&probs).tie_note(), None);
        // A cut resolved elsewhere (score's, on the training distribution)
        // that keeps more of other data without the tie: not the tie's doing.
        let shifted = [0.9, 0.8, 0.7, 0.6, 0.2, 0.2, 0.1, 0.1, 0.1, 0.1];
        let c = Cut::of(Rule::KeepFraction(0.2), f64::from(0.2f32), &shifted);
        assert_eq!((c.kept, c.tied_at_cut), (6, 2));
        assert_eq!(c.tie_note(), None);
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
    fn only_the_divisions_own_cut_follows_it() {
        assert!(Rule::MinProb(0.5).follows_division(0.5));
        assert!(Rule::RemoveNoise(None).follows_division(0.5));
        assert!(!Rule::MinProb(0.5).follows_division(0.6));
        assert!(!Rule::RemoveNoise(Some(0.3)).follows_division(0.5));
        assert!(!Rule::KeepFraction(0.7).follows_division(0.5));
        assert!(!Rule::TargetPrecision(0.95).follows_division(0.5));
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
            s.starts_with(
                "clean_prob >= 0.6 -> keeping clean_prob >= 0.6000: 4 of 6 pairs (67%), \
                 expected precision 77.5%"
            ),
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
    fn tallies_added_per_file_equal_one_cut_over_all() {
        let (a, b) = P.split_at(2);
        let mut t = Tally::default();
        t.add(a, 0.6);
        let mut u = Tally::default();
        u.add(b, 0.6);
        t.merge(&u);
        let whole = Cut::of(Rule::MinProb(0.6), 0.6, &P);
        let merged = Cut::from_tally(Rule::MinProb(0.6), 0.6, &t);
        assert_eq!(merged.kept, whole.kept);
        assert!((merged.expected_precision - whole.expected_precision).abs() < 1e-12);
        assert!((merged.estimated_noise_rate - 2.6 / 6.0).abs() < 1e-6);
    }

    #[test]
    fn the_sketch_keeps_evenly_spaced_ranks_and_resolves_like_the_data() {
        // Fewer pairs than points: all of them, highest first.
        assert_eq!(Sketch::of(&P).points, [1.0, 0.9, 0.6, 0.6, 0.2, 0.1]);
        // 10,001 distinct values k / 10,000: point i is rank 10 i.
        let probs: Vec<f32> = (0..=10_000).map(|k| k as f32 / 10_000.0).collect();
        let s = Sketch::of(&probs);
        assert_eq!((s.pairs, s.points.len()), (10_001, SKETCH_POINTS));
        assert_eq!(s.points[0], 1.0);
        assert_eq!(s.points[1], 0.999);
        assert_eq!(s.points[SKETCH_POINTS - 1], 0.0);
        // Keeping 80% of uniform values cuts at 0.2, on the data and on the
        // sketch alike; the expected precision of the top half is 0.75.
        let r = Record::fit(Rule::KeepFraction(0.8), &probs);
        assert!((r.cut.min_prob - 0.2).abs() < 1e-4);
        assert!((r.cut_for(Rule::KeepFraction(0.8)).min_prob - 0.2).abs() < 1e-3);
        let half = r.cut_for(Rule::TargetPrecision(0.75));
        assert!((half.min_prob - 0.5).abs() < 2e-3, "{}", half.min_prob);
    }

    #[test]
    fn records_round_trip_through_json() {
        let dir = tempfile::tempdir().unwrap();
        for rule in [Rule::RemoveNoise(None), Rule::KeepFraction(0.0)] {
            let r = Record::fit(rule, &P);
            r.save(dir.path()).unwrap();
            assert_eq!(Record::load(dir.path()).unwrap(), Some(r));
        }
        std::fs::write(dir.path().join(RECORD_FILE), r#"{"cut": 1}"#).unwrap();
        let e = Record::load(dir.path()).unwrap_err().to_string();
        assert!(e.contains("not a valid ncclean threshold record"), "{e}");
        assert_eq!(Record::load(&dir.path().join("none")).unwrap(), None);
    }
}
