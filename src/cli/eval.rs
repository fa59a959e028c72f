//! `ncclean eval`: detection metrics of labels against ground truth.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use crate::curation::eval_text::evaluate;
use crate::error::Result;
use crate::runtime::progress::Reporter;

/// Arguments of `ncclean eval`.
#[derive(Debug, Args)]
pub struct EvalArgs {
    /// Labels parquet from `fit` or `score` (detection mode).
    #[arg(long, value_name = "FILE", required_unless_present = "retrieval")]
    pub labels: Option<PathBuf>,
    /// Parquet file with the ground truth, e.g. the output of `ncclean corrupt` (detection mode).
    #[arg(long, value_name = "FILE", required_unless_present = "retrieval")]
    pub truth: Option<PathBuf>,
    /// Retrieval mode: R@1/5/10 both directions and rSum of a checkpoint on held-out clean DATA
    /// (captions of the same image are grouped by identical image bytes).
    #[arg(long, requires = "checkpoint", conflicts_with_all = ["labels", "truth"])]
    pub retrieval: bool,
    /// Run directory of `ncclean fit` (retrieval mode).
    #[arg(long, value_name = "RUN")]
    pub checkpoint: Option<PathBuf>,
    /// Held-out data for retrieval mode.
    #[arg(value_name = "DATA")]
    pub data: Vec<PathBuf>,
    #[command(flatten)]
    pub cache: super::CacheArgs,
    /// Image limits (retrieval mode).
    #[command(flatten)]
    pub images: super::ImageArgs,
    /// Device: auto (CUDA when this build has it and a GPU answers, else the
    /// CPU), cpu, cuda or cuda:N. The choice is said on stderr.
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// Ground-truth column. Boolean: true for a mismatched (noisy) pair;
    /// detection metrics. Numeric (a 1-5 rating, the share of raters who
    /// said yes, a relevance; higher = a better match): Kendall tau-b,
    /// Spearman and the AUC of the top vs the bottom third of the ratings,
    /// for clean_prob, similarity and soft_label.
    #[arg(long, default_value = "noisy")]
    pub truth_col: String,
    /// Key column of the truth file (default: detected; else `<file stem>:<row>`).
    #[arg(long, value_name = "NAME")]
    pub truth_key_col: Option<String>,
    /// Print one JSON object. Graded truth: kendall_*, spearman_*, auc_* (each for clean_prob,
    /// similarity, soft_label), mean_clean_prob, n, top, bottom, skipped. Boolean truth: auroc, ap, auroc_ranked, auroc_soft_label, auroc_similarity, mean_clean_prob, clean_share, calibration_error, precision, recall, f1, n, noisy, skipped.
    #[arg(long)]
    pub json: bool,
}

/// `eval --retrieval`.
fn run_retrieval(a: &EvalArgs, rep: &Reporter) -> Result<()> {
    if a.data.is_empty() {
        return Err(crate::Error::Usage(
            "eval --retrieval needs the held-out DATA to retrieve in".into(),
        ));
    }
    let chosen = crate::runtime::device::choose(&a.device)?;
    let checkpoint = a
        .checkpoint
        .as_deref()
        .ok_or_else(|| crate::Error::Usage("--retrieval needs --checkpoint".into()))?;
    let (r, skipped) = crate::curation::retrieval::of_checkpoint(
        checkpoint,
        &a.data,
        (&chosen.device, &chosen.line),
        a.images.limits(),
        &a.cache.request(),
        rep,
    )?;
    print_metrics(a.json, &r, || r.text(skipped))
}

/// Print `metrics` as one JSON object with `json`, else as `text` says them.
fn print_metrics(
    json: bool,
    metrics: &impl serde::Serialize,
    text: impl FnOnce() -> String,
) -> Result<()> {
    if json {
        let line = serde_json::to_string(metrics).context("serialising metrics")?;
        println!("{line}");
    } else {
        print!("{}", text());
    }
    Ok(())
}

/// Run `ncclean eval`.
pub fn run(a: EvalArgs, rep: &Reporter) -> Result<()> {
    if a.retrieval {
        return run_retrieval(&a, rep);
    }
    let (Some(labels), Some(truth)) = (&a.labels, &a.truth) else {
        return Err(crate::Error::Usage(
            "eval needs --labels and --truth (or --retrieval)".into(),
        ));
    };
    let e = evaluate(labels, truth, &a.truth_col, a.truth_key_col.as_deref())?;
    print_metrics(a.json, &e, || e.text(&a.truth_col))
}
