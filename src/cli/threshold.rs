//! The threshold flags that `fit`, `score` and `filter` share: one rule for
//! the clean set (see [`crate::curation::threshold`]).

use clap::Args;

use crate::curation::threshold::Rule;
use crate::error::{Error, Result};

/// At most one rule for the clean set; every rule ends as a cut
/// `clean_prob >= P`, which a share rule may refine inside a tie at P by
/// the similarity.
#[derive(Debug, Clone, Default, Args)]
#[group(id = "rule", multiple = false)]
#[command(next_help_heading = "Clean set (at most one rule; docs/thresholds.md)")]
pub struct ThresholdArgs {
    /// Keep pairs with clean_prob >= P. Without a rule, fit keeps
    /// clean_prob >= 0.5, the method's own division (or the configuration's
    /// `threshold`), score applies fit's cut and filter the labels' is_clean.
    #[arg(long, value_name = "P", alias = "threshold")]
    pub min_prob: Option<f64>,
    /// Keep this fraction of the pairs, highest clean_prob first (0.8 keeps
    /// the top 80%); pairs of equal clean_prob (a confident mixture gives
    /// many exactly 1.0) are ranked by ncclean_similarity, so the cut can
    /// fall inside them. fit resolves it on the training pairs, score on
    /// the training distribution stored with the checkpoint (one cut for
    /// every shard), filter on every label it reads.
    #[arg(long, value_name = "K")]
    pub keep_fraction: Option<f64>,
    /// Keep the largest set, in the same order, whose expected
    /// precision (the mean clean_prob over it, read as a calibrated
    /// probability) is at least P: 0.95 aims at 5% noise among the kept
    /// pairs. Resolved like --keep-fraction.
    #[arg(long, value_name = "P")]
    pub target_precision: Option<f64>,
    /// Remove the lowest fraction R of the pairs, in the same order;
    /// without R, the estimated noise rate (the mean of 1 - clean_prob).
    /// Resolved like --keep-fraction.
    #[arg(long, value_name = "R", num_args = 0..=1)]
    pub remove_noise_rate: Option<Option<f64>>,
}

impl ThresholdArgs {
    /// The rule of the flags (`None`: none given), with its value checked.
    pub fn rule(&self) -> Result<Option<Rule>> {
        let rule = match (
            self.min_prob,
            self.keep_fraction,
            self.target_precision,
            self.remove_noise_rate,
        ) {
            (Some(p), ..) => Rule::MinProb(p),
            (_, Some(k), ..) => Rule::KeepFraction(k),
            (_, _, Some(p), _) => Rule::TargetPrecision(p),
            (.., Some(r)) => Rule::RemoveNoise(r),
            _ => return Ok(None),
        };
        rule.validate().map_err(Error::Usage)?;
        Ok(Some(rule))
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cmd {
        #[command(flatten)]
        t: ThresholdArgs,
    }

    fn rule(args: &[&str]) -> std::result::Result<Option<Rule>, String> {
        let cmd = Cmd::try_parse_from(std::iter::once("x").chain(args.iter().copied()))
            .map_err(|e| e.kind().to_string())?;
        cmd.t.rule().map_err(|e| e.to_string())
    }

    #[test]
    fn each_flag_gives_its_rule() {
        assert_eq!(rule(&[]), Ok(None));
        assert_eq!(rule(&["--min-prob", "0.7"]), Ok(Some(Rule::MinProb(0.7))));
        assert_eq!(rule(&["--threshold", "0.7"]), Ok(Some(Rule::MinProb(0.7))));
        assert_eq!(
            rule(&["--keep-fraction", "0.8"]),
            Ok(Some(Rule::KeepFraction(0.8)))
        );
        assert_eq!(
            rule(&["--target-precision", "0.95"]),
            Ok(Some(Rule::TargetPrecision(0.95)))
        );
        assert_eq!(
            rule(&["--remove-noise-rate"]),
            Ok(Some(Rule::RemoveNoise(None)))
        );
        assert_eq!(
            rule(&["--remove-noise-rate", "0.2"]),
            Ok(Some(Rule::RemoveNoise(Some(0.2))))
        );
    }

    #[test]
    fn rules_exclude_each_other_and_values_are_checked() {
        assert!(rule(&["--min-prob", "0.5", "--keep-fraction", "0.5"])
            .unwrap_err()
            .contains("cannot be used with"));
        assert_eq!(
            rule(&["--target-precision", "95"]).unwrap_err(),
            "--target-precision must be between 0 and 1, got 95"
        );
    }
}
