//! `ncclean eval`: detection metrics of labels against ground truth.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use crate::curation::eval::{agreement, detection, read_truth, Agreement, Truth};
use crate::data;
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
    let engine = crate::engine::Engine::load(checkpoint, &chosen.device)?;
    rep.info(&chosen.line);
    let opts = engine.input_options(crate::data::ColumnOptions {
        image_limits: a.images.limits(),
        ..Default::default()
    });
    let input = crate::data::InputSet::open(&a.data, &opts)?;
    let prepared = engine.prepare(&input, &a.cache.options()?, rep)?;
    let r = engine.retrieval(&prepared)?;
    if a.json {
        println!(
            "{}",
            serde_json::to_string(&r).context("serialising metrics")?
        );
    } else {
        println!(
            "{} images, {} captions ({} rows skipped)",
            r.images,
            r.captions,
            prepared.skipped()
        );
        println!(
            "image->text  R@1 {:.1}  R@5 {:.1}  R@10 {:.1}",
            r.i2t_r1, r.i2t_r5, r.i2t_r10
        );
        println!(
            "text->image  R@1 {:.1}  R@5 {:.1}  R@10 {:.1}",
            r.t2i_r1, r.t2i_r5, r.t2i_r10
        );
        println!("rSum {:.1}", r.rsum);
    }
    Ok(())
}

fn print_agreement(g: &Agreement, a: &EvalArgs) -> Result<()> {
    if a.json {
        println!(
            "{}",
            serde_json::to_string(g).context("serialising metrics")?
        );
        return Ok(());
    }
    let f = |v: Option<f64>| {
        v.map(|v| format!("{v:>7.4}"))
            .unwrap_or_else(|| "    n/a".into())
    };
    println!(
        "pairs evaluated: {} against graded truth {:?} ({} skipped rows not evaluated)",
        g.n, a.truth_col, g.skipped
    );
    println!(
        "             Kendall tau-b  Spearman  AUC top {} vs bottom {}",
        g.top, g.bottom
    );
    for (name, k, r, auc) in [
        (
            "clean_prob",
            g.kendall_clean_prob,
            g.spearman_clean_prob,
            g.auc_clean_prob,
        ),
        (
            "similarity",
            g.kendall_similarity,
            g.spearman_similarity,
            g.auc_similarity,
        ),
        (
            "soft_label",
            g.kendall_soft_label,
            g.spearman_soft_label,
            g.auc_soft_label,
        ),
    ] {
        println!("{name:<12} {}        {}   {}", f(k), f(r), f(auc));
    }
    println!("mean clean_prob: {:.4}", g.mean_clean_prob);
    Ok(())
}

pub fn run(a: EvalArgs, rep: &Reporter) -> Result<()> {
    if a.retrieval {
        return run_retrieval(&a, rep);
    }
    let (Some(labels_path), Some(truth_path)) = (&a.labels, &a.truth) else {
        return Err(crate::Error::Usage(
            "eval needs --labels and --truth (or --retrieval)".into(),
        ));
    };
    let (labels, _) = data::read_labels(labels_path)?;
    let truth = match read_truth(truth_path, &a.truth_col, a.truth_key_col.as_deref())? {
        Truth::Noisy(t) => t,
        Truth::Graded(t) => return print_agreement(&agreement(&labels, &t)?, &a),
    };
    let d = detection(&labels, &truth)?;
    if a.json {
        println!(
            "{}",
            serde_json::to_string(&d).context("serialising metrics")?
        );
    } else {
        let f = |v: Option<f64>| {
            v.map(|v| format!("{v:.4}"))
                .unwrap_or_else(|| "n/a (one class only)".into())
        };
        println!(
            "pairs evaluated: {} ({} noisy, {} skipped rows not evaluated)",
            d.n, d.noisy, d.skipped
        );
        println!("AUROC (1 - clean_prob, noisy class): {}", f(d.auroc));
        println!("average precision:                   {}", f(d.ap));
        println!(
            "AUROC of the rules' order:           {} (clean_prob, ties by similarity)",
            f(d.auroc_ranked)
        );
        println!(
            "AUROC of 1 - soft_label:             {}",
            f(d.auroc_soft_label)
        );
        println!(
            "AUROC of -similarity:                {}",
            f(d.auroc_similarity)
        );
        println!(
            "clean_prob as P(clean): mean {:.4} (truth: {:.4} clean), calibration error {} (ECE, 10 bins)",
            d.mean_clean_prob,
            d.clean_share,
            f(d.calibration_error)
        );
        println!(
            "is_clean = false  precision {:.4}  recall {:.4}  F1 {:.4}",
            d.precision, d.recall, d.f1
        );
    }
    Ok(())
}
