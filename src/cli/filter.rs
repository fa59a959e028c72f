//! `ncclean filter`: write the rows that labels call clean.

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::Args;

use crate::data;
use crate::engine::keep_mask_by;
use crate::error::{Error, Result};
use crate::progress::Reporter;

use super::DataArgs;

/// Arguments of `ncclean filter`.
#[derive(Debug, Args)]
pub struct FilterArgs {
    #[command(flatten)]
    pub data: DataArgs,
    /// Labels parquet from `fit` or `score` on this data.
    #[arg(long, value_name = "FILE")]
    pub labels: PathBuf,
    /// Output file: the kept rows, all original columns unchanged (for tar
    /// input, a tar of the kept samples' members; see --format).
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
    /// Output format: parquet, or tar (tar input only: the kept samples'
    /// members byte for byte). Default: by the --out extension (.tar,
    /// .parquet), else the input's format.
    #[arg(long, value_enum)]
    pub format: Option<data::OutputFormat>,
    /// Keep rows with clean_prob >= P instead of the labels' is_clean.
    #[arg(long, value_name = "P", conflicts_with = "keep_fraction")]
    pub min_prob: Option<f64>,
    /// Keep this fraction of the usable rows, highest clean_prob first.
    #[arg(long, value_name = "K")]
    pub keep_fraction: Option<f64>,
}

/// The rule that decides which rows are kept.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rule {
    /// The labels' own is_clean.
    IsClean,
    /// clean_prob at or above a value.
    MinProb(f64),
    /// clean_prob at or above the cut that keeps a fraction.
    Cut(f64),
}

/// How users read a rule: in the log line and the filtered file's metadata.
impl std::fmt::Display for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rule::IsClean => write!(f, "is_clean from the labels"),
            Rule::MinProb(p) => write!(f, "clean_prob >= {p}"),
            Rule::Cut(p) if p.is_finite() => {
                write!(f, "the kept fraction's cut: clean_prob >= {p}")
            }
            Rule::Cut(_) => write!(f, "keep fraction 0: no row kept"),
        }
    }
}

/// The clean-probability cut that keeps `fraction` of the scored rows
/// (ties at the cut are all kept).
pub fn fraction_cut(probs: &[f32], fraction: f64) -> f64 {
    let mut p: Vec<f32> = probs.to_vec();
    p.sort_by(|a, b| b.total_cmp(a));
    let k = ((fraction * p.len() as f64).round() as usize).min(p.len());
    if k == 0 {
        f64::INFINITY
    } else {
        p[k - 1] as f64
    }
}

pub fn run(a: FilterArgs, rep: &Reporter) -> Result<()> {
    for (name, v) in [
        ("--min-prob", a.min_prob),
        ("--keep-fraction", a.keep_fraction),
    ] {
        if let Some(v) = v {
            if !(0.0..=1.0).contains(&v) {
                return Err(Error::Usage(format!(
                    "{name} must be between 0 and 1, got {v}"
                )));
            }
        }
    }
    let input = a.data.open()?;
    let (labels, _) = data::read_labels(&a.labels)?;
    let rule = match (a.min_prob, a.keep_fraction) {
        (Some(p), _) => Rule::MinProb(p),
        (None, Some(k)) => {
            let probs: Vec<f32> = labels.iter().filter_map(|l| l.clean_prob).collect();
            Rule::Cut(fraction_cut(&probs, k))
        }
        (None, None) => Rule::IsClean,
    };
    let keep = keep_mask_by(&input, &labels, |l| match rule {
        Rule::IsClean => l.is_clean,
        Rule::MinProb(p) | Rule::Cut(p) => l.clean_prob.is_some_and(|c| c as f64 >= p),
    })?;
    let mut meta = BTreeMap::new();
    meta.insert(
        "ncclean.version".to_string(),
        env!("CARGO_PKG_VERSION").to_string(),
    );
    meta.insert(
        "ncclean.filter.labels".to_string(),
        a.labels.display().to_string(),
    );
    meta.insert("ncclean.filter.rule".to_string(), rule.to_string());
    let format = data::OutputFormat::choose(&input, &a.out, a.format);
    let s = data::write_filtered_as(&input, &keep, &a.out, &meta, format)?;
    rep.info(&format!(
        "kept {} of {} rows ({rule})",
        s.rows_out, s.rows_in
    ));
    println!(
        "{}",
        serde_json::json!({ "out": a.out.display().to_string(), "rows_in": s.rows_in, "rows_out": s.rows_out, "dropped": s.dropped })
    );
    s.check(&a.out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fraction_cut_keeps_the_top_fraction() {
        let p = [0.9, 0.1, 0.5, 0.7];
        assert_eq!(fraction_cut(&p, 0.5), 0.7f32 as f64);
        assert_eq!(fraction_cut(&p, 1.0), 0.1f32 as f64);
        assert!(fraction_cut(&p, 0.0).is_infinite());
    }

    #[test]
    fn rules_read_as_sentences_not_debug_values() {
        assert_eq!(Rule::MinProb(0.8).to_string(), "clean_prob >= 0.8");
        assert_eq!(
            Rule::Cut(fraction_cut(&[0.9, 0.1], 0.0)).to_string(),
            "keep fraction 0: no row kept"
        );
        assert_eq!(
            Rule::Cut(0.5).to_string(),
            "the kept fraction's cut: clean_prob >= 0.5"
        );
        assert_eq!(Rule::IsClean.to_string(), "is_clean from the labels");
    }
}
