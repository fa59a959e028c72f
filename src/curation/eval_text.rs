//! `ncclean eval`: the truth read and judged ([`evaluate`]), and the
//! metrics as the command says them without `--json`.

use std::fmt::Write;
use std::path::Path;

use serde::Serialize;

use super::eval::{agreement, detection, read_truth, Agreement, Detection, Truth};
use super::retrieval::Retrieval;
use crate::error::Result;

/// What `eval` measured: detection metrics against boolean truth, or the
/// agreement with graded truth. Serialised as the metrics themselves.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum Evaluation {
    /// Boolean truth: the noisy class found.
    Detection(Detection),
    /// Graded truth: how the labels rank the pairs against it.
    Graded(Agreement),
}

/// Judge the labels at `labels` against the `truth_col` of the truth file
/// at `truth`, joined by key (`key_col`, else detected).
pub fn evaluate(
    labels: &Path,
    truth: &Path,
    truth_col: &str,
    key_col: Option<&str>,
) -> Result<Evaluation> {
    let (labels, _) = crate::data::read_labels(labels)?;
    Ok(match read_truth(truth, truth_col, key_col)? {
        Truth::Noisy(t) => Evaluation::Detection(detection(&labels, &t)?),
        Truth::Graded(t) => Evaluation::Graded(agreement(&labels, &t)?),
    })
}

impl Evaluation {
    /// The metrics as lines of text (`truth_col` names graded truth).
    pub fn text(&self, truth_col: &str) -> String {
        match self {
            Evaluation::Detection(d) => d.text(),
            Evaluation::Graded(g) => g.text(truth_col),
        }
    }
}

impl Detection {
    /// The metrics as lines of text.
    pub fn text(&self) -> String {
        let d = self;
        let f = |v: Option<f64>| {
            v.map(|v| format!("{v:.4}"))
                .unwrap_or_else(|| "n/a (one class only)".into())
        };
        let mut out = String::new();
        let _ = writeln!(
            out,
            "pairs evaluated: {} ({} noisy, {} skipped rows not evaluated)",
            d.n, d.noisy, d.skipped
        );
        let _ = writeln!(out, "AUROC (1 - clean_prob, noisy class): {}", f(d.auroc));
        let _ = writeln!(out, "average precision:                   {}", f(d.ap));
        let _ = writeln!(
            out,
            "AUROC of the rules' order:           {} (clean_prob, ties by similarity)",
            f(d.auroc_ranked)
        );
        let _ = writeln!(
            out,
            "AUROC of 1 - soft_label:             {}",
            f(d.auroc_soft_label)
        );
        let _ = writeln!(
            out,
            "AUROC of -similarity:                {}",
            f(d.auroc_similarity)
        );
        let _ = writeln!(
            out,
            "clean_prob as P(clean): mean {:.4} (truth: {:.4} clean), calibration error {} (ECE, 10 bins)",
            d.mean_clean_prob,
            d.clean_share,
            f(d.calibration_error)
        );
        let _ = writeln!(
            out,
            "is_clean = false  precision {:.4}  recall {:.4}  F1 {:.4}",
            d.precision, d.recall, d.f1
        );
        out
    }
}

impl Agreement {
    /// The agreement as lines of text, a table of the three scores.
    pub fn text(&self, truth_col: &str) -> String {
        let g = self;
        let f = |v: Option<f64>| {
            v.map(|v| format!("{v:>7.4}"))
                .unwrap_or_else(|| "    n/a".into())
        };
        let mut out = String::new();
        let _ = writeln!(
            out,
            "pairs evaluated: {} against graded truth {truth_col:?} ({} skipped rows not evaluated)",
            g.n, g.skipped
        );
        let _ = writeln!(
            out,
            "             Kendall tau-b  Spearman  AUC top {} vs bottom {}",
            g.top, g.bottom
        );
        let rows = [
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
        ];
        for (name, k, r, auc) in rows {
            let _ = writeln!(out, "{name:<12} {}        {}   {}", f(k), f(r), f(auc));
        }
        let _ = writeln!(out, "mean clean_prob: {:.4}", g.mean_clean_prob);
        out
    }
}

impl Retrieval {
    /// The recalls as lines of text; `skipped` rows were not evaluated.
    pub fn text(&self, skipped: usize) -> String {
        let r = self;
        format!(
            "{} images, {} captions ({skipped} rows skipped)\n\
             image->text  R@1 {:.1}  R@5 {:.1}  R@10 {:.1}\n\
             text->image  R@1 {:.1}  R@5 {:.1}  R@10 {:.1}\n\
             rSum {:.1}\n",
            r.images,
            r.captions,
            r.i2t_r1,
            r.i2t_r5,
            r.i2t_r10,
            r.t2i_r1,
            r.t2i_r5,
            r.t2i_r10,
            r.rsum
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retrieval_text_has_one_line_per_direction() {
        let r = Retrieval {
            i2t_r1: 50.0,
            i2t_r5: 100.0,
            i2t_r10: 100.0,
            t2i_r1: 25.0,
            t2i_r5: 75.0,
            t2i_r10: 100.0,
            rsum: 450.0,
            images: 2,
            captions: 4,
        };
        assert_eq!(
            r.text(1),
            "2 images, 4 captions (1 rows skipped)\n\
             image->text  R@1 50.0  R@5 100.0  R@10 100.0\n\
             text->image  R@1 25.0  R@5 75.0  R@10 100.0\n\
             rSum 450.0\n"
        );
    }
}
