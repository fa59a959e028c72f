//! Which pairs count as clean: one place that turns a rule (`--min-prob`,
//! `--keep-fraction`, `--target-precision`, `--remove-noise-rate`) and the
//! scored `clean_prob`s into a cut, for `fit`, `score` and `filter` alike.
//!
//! The share rules rank pairs by `clean_prob`, and among equal
//! `clean_prob`s by `similarity` ([`Ranked`]): a confident mixture gives
//! most clean pairs exactly 1.0 in f32 (GSC's and CRCL's presets on frozen
//! Flickr8k features: 70% and 79%), and a share asked of them
//! (`--keep-fraction 0.5`) must still be cut among them, by the model's own
//! score of each pair. Every rule ends as a [`Bound`]: keep
//! `clean_prob >= cut`, or, when a share rule's cut falls inside a tie,
//! `clean_prob > cut` and the tied pairs with `similarity >= s`. Pairs equal
//! in both scores are kept together, so two rows with the same scores never
//! get different labels; the absolute rule (`--min-prob`) never splits a
//! tie.
//!
//! Read as a calibrated probability, `clean_prob` gives the expected
//! precision of a kept set (the mean `clean_prob` over it) and the
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

use serde::{Deserialize, Serialize};

/// The user's rule for the clean set.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "rule", content = "value", rename_all = "snake_case")]
pub enum Rule {
    /// Keep `clean_prob >= p` (the default, 0.5, is the method's own
    /// division).
    MinProb(f64),
    /// Keep this fraction of the scored pairs, highest first ([`Ranked`]:
    /// `clean_prob`, then `similarity`).
    KeepFraction(f64),
    /// Keep the largest set, highest first, whose expected precision (mean
    /// `clean_prob`) is at least this.
    TargetPrecision(f64),
    /// Remove this fraction of the scored pairs, lowest first; `None`
    /// removes the estimated noise rate.
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

/// A scored pair as the rules rank it: by `clean_prob`, then by
/// `similarity` among equal `clean_prob`s.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ranked {
    /// The clean posterior.
    pub clean_prob: f32,
    /// The model's similarity of the pair; `-inf` when not known (labels
    /// or records of older versions): it ranks last and splits no tie.
    pub similarity: f32,
}

impl Ranked {
    /// A pair from its scores (`similarity` `None` or NaN: not known).
    pub fn new(clean_prob: f32, similarity: Option<f32>) -> Ranked {
        Ranked {
            clean_prob,
            similarity: similarity
                .filter(|s| !s.is_nan())
                .unwrap_or(f32::NEG_INFINITY),
        }
    }

    /// Pairs from parallel score vectors (pairs past the end of
    /// `similarities` have none known).
    pub fn pairs(probs: &[f32], similarities: &[f32]) -> Vec<Ranked> {
        probs
            .iter()
            .enumerate()
            .map(|(i, &p)| Ranked::new(p, similarities.get(i).copied()))
            .collect()
    }

    /// The scored rows of labels (those with a `clean_prob`).
    pub fn labelled(labels: &[crate::data::LabelRow]) -> Vec<Ranked> {
        labels
            .iter()
            .filter_map(|l| l.clean_prob.map(|p| Ranked::new(p, l.similarity)))
            .collect()
    }

    /// Highest first: by `clean_prob`, then `similarity`.
    pub(crate) fn descending(a: &Ranked, b: &Ranked) -> std::cmp::Ordering {
        b.clean_prob
            .total_cmp(&a.clean_prob)
            .then(b.similarity.total_cmp(&a.similarity))
    }
}

/// The scored pairs (finite `clean_prob`), highest first.
fn sorted(pairs: &[Ranked]) -> Vec<Ranked> {
    let mut v: Vec<Ranked> = pairs
        .iter()
        .copied()
        .filter(|r| r.clean_prob.is_finite())
        .collect();
    v.sort_by(Ranked::descending);
    v
}

/// Where a cut falls: keep `clean_prob > min_prob`, and of the pairs at
/// exactly `min_prob` those with `similarity >= min_similarity` (all of
/// them when `None`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bound {
    /// The lowest `clean_prob` kept ([`KEEP_NONE`]: none).
    pub min_prob: f64,
    /// Within the tie at `min_prob`, the lowest similarity kept.
    pub min_similarity: Option<f64>,
}

impl Bound {
    /// Keep `clean_prob >= min_prob`, ties whole.
    pub fn at(min_prob: f64) -> Bound {
        Bound {
            min_prob,
            min_similarity: None,
        }
    }

    /// Whether the pair is kept (an unknown similarity, `-inf`, is below
    /// every similarity bound).
    pub fn keeps(&self, r: &Ranked) -> bool {
        let p = f64::from(r.clean_prob);
        p > self.min_prob
            || (p == self.min_prob
                && self
                    .min_similarity
                    .is_none_or(|s| f64::from(r.similarity) >= s))
    }

    /// Whether a kept pair sits exactly on the bound (ties there cannot
    /// be split).
    fn on(&self, r: &Ranked) -> bool {
        f64::from(r.clean_prob) == self.min_prob
            && self
                .min_similarity
                .is_none_or(|s| f64::from(r.similarity) == s)
    }
}

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

    /// Where the rule cuts these pairs (non-finite `clean_prob`s are not
    /// scores and are passed over).
    pub fn bound(&self, pairs: &[Ranked]) -> Bound {
        let sorted = sorted(pairs);
        // Keep the top k: the k-th pair is the bound; its similarity
        // matters only when the next pair ties it in clean_prob (and the
        // bound then says so even when their similarities are equal too:
        // the tie note tells duplicates from pairs with none known).
        let keep_top = |k: usize| -> Bound {
            let k = k.min(sorted.len());
            if k == 0 {
                return Bound::at(KEEP_NONE);
            }
            let last = sorted[k - 1];
            let inside_tie = sorted
                .get(k)
                .is_some_and(|next| next.clean_prob == last.clean_prob);
            Bound {
                min_prob: f64::from(last.clean_prob),
                min_similarity: (inside_tie && last.similarity.is_finite())
                    .then(|| f64::from(last.similarity)),
            }
        };
        let fraction = |f: f64| (f * sorted.len() as f64).round() as usize;
        match *self {
            Rule::MinProb(p) => Bound::at(p),
            Rule::KeepFraction(f) => keep_top(fraction(f)),
            Rule::RemoveNoise(r) => {
                let rate = r.unwrap_or_else(|| mean_noise(sorted.iter().map(|r| r.clean_prob)));
                keep_top(sorted.len() - fraction(rate).min(sorted.len()))
            }
            Rule::TargetPrecision(p) => {
                // The running mean of a descending list never rises, so the
                // largest prefix meeting the target is the last one that does.
                // Prefix ends are ends of groups equal in both scores: a cut
                // keeps a whole group.
                let mut best = 0;
                let mut sum = 0.0f64;
                for (i, x) in sorted.iter().enumerate() {
                    sum += f64::from(x.clean_prob);
                    let group_end = sorted.get(i + 1).is_none_or(|next| {
                        next.clean_prob < x.clean_prob || next.similarity < x.similarity
                    });
                    if group_end && sum / (i + 1) as f64 >= p {
                        best = i + 1;
                    }
                }
                keep_top(best)
            }
        }
    }

    /// Resolve the rule on the scored pairs: the cut and what it does to
    /// them.
    pub fn resolve(&self, pairs: &[Ranked]) -> Cut {
        Cut::of(*self, self.bound(pairs), pairs)
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
    /// Add `pairs` under the cut `bound` (non-finite `clean_prob`s are not
    /// scores and are passed over).
    pub fn add(&mut self, pairs: &[Ranked], bound: Bound) {
        for r in pairs.iter().filter(|r| r.clean_prob.is_finite()) {
            let p = f64::from(r.clean_prob);
            self.scored += 1;
            self.noise_sum += 1.0 - p;
            if bound.keeps(r) {
                self.kept += 1;
                self.kept_sum += p;
                if bound.on(r) {
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
    /// Keep `clean_prob >= min_prob` ([`KEEP_NONE`]: keep nothing)...
    pub min_prob: f64,
    /// ...but of the pairs at exactly `min_prob`, only those with
    /// `similarity >= min_similarity`: set when the cut falls inside a tie
    /// (absent in records written before ties were split).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_similarity: Option<f64>,
    /// Scored pairs.
    pub scored: usize,
    /// Pairs kept.
    pub kept: usize,
    /// Kept pairs exactly on the cut (its `clean_prob`, and its similarity
    /// when it has one): a tie the cut cannot fall inside (0 in records
    /// written before it was counted).
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
    /// The cut `bound` (from `rule`) applied to `pairs`.
    pub fn of(rule: Rule, bound: Bound, pairs: &[Ranked]) -> Cut {
        let mut t = Tally::default();
        t.add(pairs, bound);
        Cut::from_tally(rule, bound, &t)
    }

    /// The cut `bound` (from `rule`) over the pairs of a tally.
    pub fn from_tally(rule: Rule, bound: Bound, t: &Tally) -> Cut {
        Cut {
            rule,
            min_prob: bound.min_prob,
            min_similarity: bound.min_similarity,
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

    /// Where it cuts.
    pub fn bound(&self) -> Bound {
        Bound {
            min_prob: self.min_prob,
            min_similarity: self.min_similarity,
        }
    }

    /// Whether a pair with these scores is kept (`clean_prob` `None`: not
    /// scored).
    pub fn keeps(&self, clean_prob: Option<f32>, similarity: Option<f32>) -> bool {
        clean_prob.is_some_and(|p| self.bound().keeps(&Ranked::new(p, similarity)))
    }

    /// Kept share of the scored pairs.
    pub fn kept_fraction(&self) -> f64 {
        if self.scored == 0 {
            0.0
        } else {
            self.kept as f64 / self.scored as f64
        }
    }

    /// The cut for people: `clean_prob >= 0.9340`; inside a tie
    /// `clean_prob > 1, or = 1 with similarity >= 0.4123`; or `no pair`.
    pub fn condition(&self) -> String {
        let p = self.min_prob;
        if p > 1.0 {
            return "no pair".to_string();
        }
        match self.min_similarity {
            // The tie's own value, in full: rounded, `> 0.99995` and
            // `= 0.99995` would read as `> 1.0000`. Ties among clear noise
            // sit at tiny values (6.9e-44 for CRCL's preset), which plain
            // decimals spell out in 45 digits.
            Some(s) => {
                let q = p as f32;
                let q = if q != 0.0 && q.abs() < 1e-3 {
                    format!("{q:e}")
                } else {
                    q.to_string()
                };
                format!("clean_prob > {q}, or = {q} with similarity >= {s:.4}")
            }
            // Cuts among the near-zero probabilities of clear noise would
            // all read 0.0000 with four decimals.
            None if p > 0.0 && p < 1e-3 => format!("clean_prob >= {p:.2e}"),
            None => format!("clean_prob >= {p:.4}"),
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
    /// the cut are equal in both scores, or have no similarity to rank
    /// them by (labels or a checkpoint from before ties were split), and
    /// ties are kept together.
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
        let (what, why) = match self.min_similarity {
            Some(s) => (
                format!("clean_prob {:.4} and similarity {s:.4}", self.min_prob),
                "(duplicate pairs?)",
            ),
            None => (
                format!("clean_prob {:.4}", self.min_prob),
                "(no similarity ranks them: a checkpoint or labels from an older ncclean; fit \
                 again to split them)",
            ),
        };
        Some(format!(
            "{} pairs ({}) at the cut share {what} and are kept together, so it keeps {} \
             where {} was asked {why}",
            self.tied_at_cut,
            percent(self.tied_at_cut as f64 / n),
            percent(self.kept_fraction()),
            percent(asked),
        ))
    }
}

/// The cuts at a range of kept fractions, for the report's threshold table.
pub fn table(pairs: &[Ranked], fractions: &[f64]) -> Vec<Cut> {
    fractions
        .iter()
        .map(|&f| Rule::KeepFraction(f).resolve(pairs))
        .collect()
}

/// A bounded summary of a ranked distribution: the pairs at
/// [`SKETCH_POINTS`] evenly spaced ranks, highest first (all of them when
/// there are fewer). A rule resolved on it reads each point as an equal
/// share of the pairs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sketch {
    /// Pairs summarised.
    pub pairs: usize,
    /// The `clean_prob`s at evenly spaced ranks, descending.
    pub points: Vec<f32>,
    /// The similarities at the same ranks; empty when some are not known
    /// (and in records written before ties were split).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub similarities: Vec<f32>,
}

impl Sketch {
    /// Summarise `pairs` (non-finite `clean_prob`s are passed over).
    pub fn of(pairs: &[Ranked]) -> Sketch {
        let sorted = sorted(pairs);
        let n = sorted.len();
        let picked: Vec<Ranked> = if n <= SKETCH_POINTS {
            sorted
        } else {
            let m = SKETCH_POINTS - 1;
            (0..=m).map(|i| sorted[(i * (n - 1) + m / 2) / m]).collect()
        };
        // JSON has no infinity: unknown similarities are stored as none.
        let known = picked.iter().all(|r| r.similarity.is_finite());
        Sketch {
            pairs: n,
            points: picked.iter().map(|r| r.clean_prob).collect(),
            similarities: if known {
                picked.iter().map(|r| r.similarity).collect()
            } else {
                Vec::new()
            },
        }
    }

    /// The summarised pairs.
    pub fn ranked(&self) -> Vec<Ranked> {
        Ranked::pairs(&self.points, &self.similarities)
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
    /// Resolve `rule` on the training pairs.
    pub fn fit(rule: Rule, pairs: &[Ranked]) -> Record {
        Record {
            cut: rule.resolve(pairs),
            sketch: Sketch::of(pairs),
        }
    }

    /// The cut of another rule, resolved on the training distribution:
    /// the same on every shard it is applied to. Its counts are the
    /// sketch's, so only `min_prob` and the rule are meant to be used.
    pub fn cut_for(&self, rule: Rule) -> Cut {
        rule.resolve(&self.sketch.ranked())
    }

    // `save` and `load` live with the checkpoint the record belongs to
    // (crate::run::checkpoint).
}

/// The mixture's estimate of the noisy share: the mean of `1 - clean_prob`
/// (non-finite values are not scores and are passed over).
pub fn estimated_noise_rate(probs: &[f32]) -> f64 {
    mean_noise(probs.iter().copied())
}

/// The mean of `1 - p` over the finite `probs`, summed in their order (0
/// when there are none).
fn mean_noise(probs: impl Iterator<Item = f32>) -> f64 {
    let (sum, n) = probs
        .filter(|p| p.is_finite())
        .fold((0.0f64, 0usize), |(s, n), p| {
            (s + 1.0 - f64::from(p), n + 1)
        });
    if n == 0 {
        0.0
    } else {
        sum / n as f64
    }
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

/// Which labelled rows `filter` keeps: the labels' own `is_clean`, or a
/// cut of a rule resolved on the labels' `clean_prob` (ties by similarity).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Keep {
    /// The labels' own is_clean.
    IsClean,
    /// A cut resolved on the labels' clean_prob (ties by similarity).
    Cut(Cut),
}

impl Keep {
    /// Whether the row labelled `l` is kept.
    pub fn keeps(self, l: &crate::data::LabelRow) -> bool {
        match self {
            Keep::IsClean => l.is_clean,
            Keep::Cut(c) => c.keeps(l.clean_prob, l.similarity),
        }
    }
}

/// How users read it: in the log line and the filtered file's metadata.
impl std::fmt::Display for Keep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Keep::IsClean => write!(f, "is_clean from the labels"),
            Keep::Cut(c) => write!(f, "{}", c.summary()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: [f32; 6] = [0.9, 0.2, 0.6, 0.6, 1.0, 0.1];

    /// Pairs with no similarity known: ranked by clean_prob alone.
    fn ranked(probs: &[f32]) -> Vec<Ranked> {
        Ranked::pairs(probs, &[])
    }

    #[test]
    fn noise_rate_is_the_mean_noisy_posterior() {
        // 1 - p: 0.1 + 0.8 + 0.4 + 0.4 + 0 + 0.9 = 2.6 over 6.
        assert!((estimated_noise_rate(&P) - 2.6 / 6.0).abs() < 1e-6);
        assert_eq!(estimated_noise_rate(&[]), 0.0);
        assert_eq!(estimated_noise_rate(&[f32::NAN]), 0.0);
    }

    #[test]
    fn min_prob_keeps_at_or_above_the_cut() {
        let c = Rule::MinProb(0.6).resolve(&ranked(&P));
        assert_eq!(c.kept, 4); // 1.0, 0.9, 0.6, 0.6
        assert!((c.expected_precision - 3.1 / 4.0).abs() < 1e-6);
        // Removed: 0.2 and 0.1 hold 0.8 + 0.9 of the 2.6 noise.
        assert!((c.expected_noise_removed - 1.7 / 2.6).abs() < 1e-6);
        assert!(
            c.keeps(Some(0.6), None) && !c.keeps(Some(0.59), Some(1.0)) && !c.keeps(None, None)
        );
    }

    #[test]
    fn keep_fraction_keeps_ties_together() {
        // Half of 6 = 3: the third highest is 0.6, tied with the fourth.
        let c = Rule::KeepFraction(0.5).resolve(&ranked(&P));
        assert_eq!(c.min_prob, f64::from(0.6f32));
        assert_eq!(c.kept, 4);
        let none = Rule::KeepFraction(0.0).resolve(&ranked(&P));
        assert_eq!((none.kept, none.expected_precision), (0, 1.0));
        assert!(none.min_prob == KEEP_NONE && !none.keeps(Some(1.0), Some(1.0)));
        assert_eq!(none.condition(), "no pair");
        assert_eq!(Rule::KeepFraction(1.0).resolve(&ranked(&P)).kept, 6);
    }

    #[test]
    fn a_tie_that_keeps_more_than_asked_is_said() {
        // Seven of ten pairs at exactly 1.0 and no similarity to rank them:
        // keeping half keeps all seven.
        let probs = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.3, 0.2, 1e-20];
        let c = Rule::KeepFraction(0.5).resolve(&ranked(&probs));
        assert_eq!((c.kept, c.tied_at_cut), (7, 7));
        assert_eq!(c.asked_share(), Some(0.5));
        let s = c.summary();
        assert!(
            s.ends_with(
                "; 7 pairs (70%) at the cut share clean_prob 1.0000 and are kept together, so it \
                 keeps 70% where 50% was asked (no similarity ranks them: a checkpoint or labels \
                 from an older ncclean; fit again to split them)"
            ),
            "{s}"
        );
        // Removing 10% asks to keep 90%: the 3 below 1.0 are distinct, so
        // the cut falls between them and nothing is said.
        let c = Rule::RemoveNoise(Some(0.1)).resolve(&ranked(&probs));
        assert_eq!((c.kept, c.tied_at_cut), (9, 1));
        assert_eq!(c.tie_note(), None);
        // A tie that keeps exactly what was asked, and rules that ask for
        // no share, say nothing.
        assert_eq!(
            Rule::KeepFraction(0.7).resolve(&ranked(&probs)).tie_note(),
            None
        );
        assert_eq!(Rule::MinProb(0.5).resolve(&ranked(&probs)).tie_note(), None);
        assert_eq!(
            Rule::TargetPrecision(0.9)
                .resolve(&ranked(&probs))
                .tie_note(),
            None
        );
        // A cut resolved elsewhere (score's, on the training distribution)
        // that keeps more of other data without the tie: not the tie's doing.
        let shifted = [0.9, 0.8, 0.7, 0.6, 0.2, 0.2, 0.1, 0.1, 0.1, 0.1];
        let c = Cut::of(
            Rule::KeepFraction(0.2),
            Bound::at(f64::from(0.2f32)),
            &ranked(&shifted),
        );
        assert_eq!((c.kept, c.tied_at_cut), (6, 2));
        assert_eq!(c.tie_note(), None);
    }

    /// Seven of ten pairs at exactly 1.0, their similarities 0.7 down to
    /// 0.1, then three below.
    fn saturated() -> Vec<Ranked> {
        let probs = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.3, 0.2, 1e-20];
        let sims = [0.4, 0.7, 0.1, 0.5, 0.3, 0.6, 0.2, 0.0, -0.1, -0.2];
        Ranked::pairs(&probs, &sims)
    }

    #[test]
    fn a_share_cut_inside_a_tie_splits_it_by_similarity() {
        let pairs = saturated();
        // Half of ten: the five most similar of the seven at 1.0.
        let c = Rule::KeepFraction(0.5).resolve(&pairs);
        assert_eq!(c.min_prob, 1.0);
        assert_eq!(c.min_similarity, Some(f64::from(0.3f32)));
        assert_eq!((c.kept, c.tied_at_cut), (5, 1));
        assert_eq!(c.tie_note(), None);
        let kept: Vec<bool> = pairs
            .iter()
            .map(|r| c.keeps(Some(r.clean_prob), Some(r.similarity)))
            .collect();
        assert_eq!(
            kept,
            [true, true, false, true, true, true, false, false, false, false]
        );
        // Not scored, or no similarity known at a split tie: not kept;
        // above the tie, kept whatever the similarity.
        assert!(!c.keeps(None, Some(0.9)) && !c.keeps(Some(1.0), None));
        assert!(!c.keeps(Some(1.0), Some(0.29)));
        let below = Rule::KeepFraction(0.8).resolve(&pairs);
        assert!(below.keeps(Some(1.0), None) && below.keeps(Some(1.0), Some(-5.0)));
        assert_eq!(
            c.condition(),
            "clean_prob > 1, or = 1 with similarity >= 0.3000"
        );
        // A tie among clear noise reads in exponent form.
        let tiny = Ranked::pairs(&[1.0, 6.9e-44, 6.9e-44, 6.9e-44], &[0.9, 0.3, 0.2, 0.1]);
        assert_eq!(
            Rule::KeepFraction(0.5).resolve(&tiny).condition(),
            "clean_prob > 6.9e-44, or = 6.9e-44 with similarity >= 0.3000"
        );
        // A cut at the end of a tie does not need the similarity: the cut
        // of earlier versions, to the bit.
        for f in [0.7, 0.8, 0.9] {
            let c = Rule::KeepFraction(f).resolve(&pairs);
            assert_eq!(c.min_similarity, None, "{f}");
            assert_eq!(
                c,
                Rule::KeepFraction(f).resolve(&ranked(&[
                    1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.3, 0.2, 1e-20
                ]))
            );
        }
        // Removing 60% keeps the top four; the absolute rule keeps the tie.
        assert_eq!(Rule::RemoveNoise(Some(0.6)).resolve(&pairs).kept, 4);
        assert_eq!(Rule::MinProb(1.0).resolve(&pairs).kept, 7);
        // Equal in both scores (duplicates): kept together, and said.
        let dup = Ranked::pairs(&[1.0; 4], &[0.5; 4]);
        let c = Rule::KeepFraction(0.5).resolve(&dup);
        assert_eq!((c.kept, c.min_similarity), (4, Some(0.5)));
        assert!(c.tie_note().is_some());
        let two = Ranked::pairs(&[1.0; 4], &[0.6, 0.5, 0.5, 0.5]);
        let c = Rule::KeepFraction(0.5).resolve(&two);
        assert_eq!((c.kept, c.tied_at_cut), (4, 3));
        let note = c.tie_note().unwrap_or_default();
        assert!(
            note.starts_with(
                "3 pairs (75%) at the cut share clean_prob 1.0000 and similarity 0.5000"
            ),
            "{note}"
        );
    }

    #[test]
    fn target_precision_splits_a_tie_by_similarity() {
        // Ranked: 1.0 at similarities 0.9, 0.8, 0.7, then 0.0 at 0.2, 0.1.
        // Running means 1, 1, 1, 0.75, 0.6: precision 0.75 keeps four, the
        // cut falling inside the tie at 0.0; 0.8 keeps three, at its end.
        let pairs = Ranked::pairs(&[1.0, 0.0, 1.0, 0.0, 1.0], &[0.9, 0.2, 0.8, 0.1, 0.7]);
        let c = Rule::TargetPrecision(0.75).resolve(&pairs);
        assert_eq!(
            (c.kept, c.min_prob, c.min_similarity),
            (4, 0.0, Some(f64::from(0.2f32)))
        );
        let c = Rule::TargetPrecision(0.8).resolve(&pairs);
        assert_eq!((c.kept, c.min_similarity), (3, None));
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
            let c = Rule::TargetPrecision(target).resolve(&ranked(&P));
            assert_eq!(c.kept, kept, "target {target}");
            assert!(c.expected_precision >= target - 1e-6);
        }
        assert_eq!(Rule::TargetPrecision(1.0).resolve(&ranked(&P)).kept, 1);
        assert_eq!(Rule::TargetPrecision(1.0).resolve(&ranked(&[0.5])).kept, 0);
    }

    #[test]
    fn remove_noise_removes_the_estimated_share() {
        // Estimated rate 2.6 / 6 = 0.433 -> remove round(2.6) = 3 pairs: the
        // cut is the third highest (0.6), whose tie keeps a fourth.
        let c = Rule::RemoveNoise(None).resolve(&ranked(&P));
        assert_eq!(c.min_prob, f64::from(0.6f32));
        assert_eq!(c.kept, 4);
        let c = Rule::RemoveNoise(Some(1.0 / 3.0)).resolve(&ranked(&P));
        assert_eq!(c.kept, 4);
        assert_eq!(Rule::RemoveNoise(Some(1.0)).resolve(&ranked(&P)).kept, 0);
        assert_eq!(Rule::RemoveNoise(Some(0.0)).resolve(&ranked(&P)).kept, 6);
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
        let s = Rule::MinProb(0.6).resolve(&ranked(&P)).summary();
        assert!(
            s.starts_with(
                "clean_prob >= 0.6 -> keeping clean_prob >= 0.6000: 4 of 6 pairs (67%), \
                 expected precision 77.5%"
            ),
            "{s}"
        );
        assert!(!s.contains("MinProb"), "{s}");
        // A cut among clear noise keeps its digits; one keeping nothing
        // says so.
        let tiny = Rule::MinProb(2.5e-5).resolve(&ranked(&P));
        assert_eq!(tiny.condition(), "clean_prob >= 2.50e-5");
        assert_eq!(
            Rule::MinProb(0.0).resolve(&[]).condition(),
            "clean_prob >= 0.0000"
        );
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
        t.add(&ranked(a), Bound::at(0.6));
        let mut u = Tally::default();
        u.add(&ranked(b), Bound::at(0.6));
        t.merge(&u);
        let whole = Cut::of(Rule::MinProb(0.6), Bound::at(0.6), &ranked(&P));
        let merged = Cut::from_tally(Rule::MinProb(0.6), Bound::at(0.6), &t);
        assert_eq!(merged.kept, whole.kept);
        assert!((merged.expected_precision - whole.expected_precision).abs() < 1e-12);
        assert!((merged.estimated_noise_rate - 2.6 / 6.0).abs() < 1e-6);
    }

    #[test]
    fn the_sketch_keeps_evenly_spaced_ranks_and_resolves_like_the_data() {
        // Fewer pairs than points: all of them, highest first.
        assert_eq!(
            Sketch::of(&ranked(&P)).points,
            [1.0, 0.9, 0.6, 0.6, 0.2, 0.1]
        );
        // 10,001 distinct values k / 10,000: point i is rank 10 i.
        let probs: Vec<f32> = (0..=10_000).map(|k| k as f32 / 10_000.0).collect();
        let s = Sketch::of(&ranked(&probs));
        assert_eq!((s.pairs, s.points.len()), (10_001, SKETCH_POINTS));
        assert_eq!(s.points[0], 1.0);
        assert_eq!(s.points[1], 0.999);
        assert_eq!(s.points[SKETCH_POINTS - 1], 0.0);
        // Keeping 80% of uniform values cuts at 0.2, on the data and on the
        // sketch alike; the expected precision of the top half is 0.75.
        let r = Record::fit(Rule::KeepFraction(0.8), &ranked(&probs));
        assert!((r.cut.min_prob - 0.2).abs() < 1e-4);
        assert!((r.cut_for(Rule::KeepFraction(0.8)).min_prob - 0.2).abs() < 1e-3);
        let half = r.cut_for(Rule::TargetPrecision(0.75));
        assert!((half.min_prob - 0.5).abs() < 2e-3, "{}", half.min_prob);
    }

    #[test]
    fn the_sketch_splits_a_tie_like_the_data() {
        // 3,000 pairs, two thirds at 1.0 with distinct similarities: keeping
        // half cuts inside the tie, at the same similarity on the sketch
        // (1,001 points) within a point's share.
        let probs: Vec<f32> = (0..3000)
            .map(|i| {
                if i < 2000 {
                    1.0
                } else {
                    0.5 * i as f32 / 3000.0
                }
            })
            .collect();
        let sims: Vec<f32> = (0..3000).map(|i| i as f32 / 3000.0).collect();
        let pairs = Ranked::pairs(&probs, &sims);
        let r = Record::fit(Rule::KeepFraction(0.5), &pairs);
        assert_eq!(r.cut.kept, 1500);
        let s = r.cut.min_similarity.unwrap_or(f64::NAN);
        assert!((s - 500.0 / 3000.0).abs() < 1e-6, "{s}");
        let on_sketch = r.cut_for(Rule::KeepFraction(0.5));
        let kept = pairs
            .iter()
            .filter(|p| on_sketch.keeps(Some(p.clean_prob), Some(p.similarity)))
            .count();
        assert!(kept.abs_diff(1500) <= 3, "{kept}");
        assert_eq!(r.sketch.similarities.len(), SKETCH_POINTS);
        // A sketch without similarities (an older record) cuts the tie
        // whole, as the older version did.
        let old = Record {
            sketch: Sketch {
                similarities: Vec::new(),
                ..r.sketch.clone()
            },
            ..r.clone()
        };
        let c = old.cut_for(Rule::KeepFraction(0.5));
        assert_eq!((c.min_prob, c.min_similarity), (1.0, None));
    }

    #[test]
    fn records_round_trip_through_json() {
        let dir = tempfile::tempdir().unwrap();
        for rule in [Rule::RemoveNoise(None), Rule::KeepFraction(0.0)] {
            let r = Record::fit(rule, &ranked(&P));
            r.save(dir.path()).unwrap();
            assert_eq!(Record::load(dir.path()).unwrap(), Some(r));
        }
        let split = Record::fit(Rule::KeepFraction(0.5), &saturated());
        assert!(split.cut.min_similarity.is_some());
        split.save(dir.path()).unwrap();
        assert_eq!(Record::load(dir.path()).unwrap(), Some(split));
        // A record written before ties were split (no similarities, no
        // tie count) still loads.
        let old = r#"{"cut": {"rule": {"rule": "keep_fraction", "value": 0.5},
            "min_prob": 0.6, "scored": 6, "kept": 4, "expected_precision": 0.775,
            "expected_noise_removed": 0.65, "estimated_noise_rate": 0.43},
            "sketch": {"pairs": 6, "points": [1.0, 0.9, 0.6, 0.6, 0.2, 0.1]}}"#;
        std::fs::write(dir.path().join(RECORD_FILE), old).unwrap();
        let r = Record::load(dir.path()).unwrap().unwrap();
        assert_eq!((r.cut.min_similarity, r.cut.tied_at_cut), (None, 0));
        assert_eq!(r.cut_for(Rule::KeepFraction(0.5)).kept, 4);
        std::fs::write(dir.path().join(RECORD_FILE), r#"{"cut": 1}"#).unwrap();
        let e = Record::load(dir.path()).unwrap_err().to_string();
        assert!(e.contains("not a valid ncclean threshold record"), "{e}");
        assert_eq!(Record::load(&dir.path().join("none")).unwrap(), None);
    }

    #[test]
    fn rules_read_as_sentences_not_debug_values() {
        let pairs = Ranked::pairs(&[0.9, 0.1], &[]);
        let c = Rule::KeepFraction(0.5).resolve(&pairs);
        let s = Keep::Cut(c).to_string();
        assert!(
            s.starts_with("keep the top 50% -> keeping clean_prob >= 0.9000: 1 of 2 pairs"),
            "{s}"
        );
        assert!(!s.contains("Cut("), "{s}");
        let none = Rule::KeepFraction(0.0).resolve(&pairs);
        assert!(Keep::Cut(none)
            .to_string()
            .contains("keeping no pair: 0 of 2"));
        assert_eq!(Keep::IsClean.to_string(), "is_clean from the labels");
    }
}
