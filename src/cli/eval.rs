//! `ncclean eval`: detection metrics of labels against ground truth.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::Context;
use arrow_array::{
    Array, BooleanArray, Int32Array, Int64Array, LargeStringArray, StringArray, UInt64Array,
};
use clap::Args;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ProjectionMask;
use serde::Serialize;

use crate::data::{self, LabelRow, RowStatus};
use crate::error::{invalid, Result};
use crate::metrics::{auroc, average_precision, calibration_error, precision_recall_f1};
use crate::progress::Reporter;
use crate::threshold::Ranked;

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
    /// Boolean ground-truth column: true for a mismatched (noisy) pair.
    #[arg(long, default_value = "noisy")]
    pub truth_col: String,
    /// Key column of the truth file (default: detected; else `<file stem>:<row>`).
    #[arg(long, value_name = "NAME")]
    pub truth_key_col: Option<String>,
    /// Print one JSON object: auroc, ap, auroc_ranked, auroc_soft_label, auroc_similarity, mean_clean_prob, clean_share, calibration_error, precision, recall, f1, n, noisy, skipped.
    #[arg(long)]
    pub json: bool,
}

/// Detection metrics for the noisy class.
#[derive(Debug, Clone, Serialize)]
pub struct Detection {
    /// AUROC of 1 − clean_prob for noisy pairs.
    pub auroc: Option<f64>,
    /// Average precision of 1 − clean_prob for noisy pairs.
    pub ap: Option<f64>,
    /// AUROC of the order the share rules cut by (`--keep-fraction`,
    /// `--target-precision`, `--remove-noise-rate`): clean_prob, then the
    /// similarity among pairs of equal clean_prob.
    pub auroc_ranked: Option<f64>,
    /// AUROC of 1 − soft_label: how the method's soft label ranks.
    pub auroc_soft_label: Option<f64>,
    /// AUROC of −similarity: how the trained model's similarity ranks. A
    /// confident mixture gives many pairs the same clean_prob (exactly 1.0
    /// in f32), which ties them; the similarity still orders them.
    pub auroc_similarity: Option<f64>,
    /// Mean clean_prob over the pairs: the estimated clean share.
    pub mean_clean_prob: f64,
    /// Share of the pairs the truth calls clean.
    pub clean_share: f64,
    /// Expected calibration error of clean_prob as P(clean), over ten
    /// equal-width bins ([`crate::metrics::calibration_error`]); None
    /// without pairs.
    pub calibration_error: Option<f64>,
    /// Precision of is_clean = false.
    pub precision: f64,
    /// Recall of is_clean = false.
    pub recall: f64,
    /// F1 of is_clean = false.
    pub f1: f64,
    /// Pairs evaluated (scored rows with ground truth).
    pub n: usize,
    /// Noisy pairs among them.
    pub noisy: usize,
    /// Label rows not evaluated because they were skipped.
    pub skipped: usize,
}

const KEY_CANDIDATES: &[&str] = &["key", "uid", "SAMPLE_ID", "id", "image_id", "sample_id"];

/// Read `(key, noisy)` from the truth file.
fn read_truth(path: &Path, truth_col: &str, key_col: Option<&str>) -> Result<Vec<(String, bool)>> {
    let file = File::open(path)
        .map_err(|e| invalid(format!("cannot open truth file {}: {e}", path.display())))?;
    let builder = ParquetRecordBatchReaderBuilder::try_new(file).map_err(|e| {
        invalid(format!(
            "{}: not a readable parquet file: {e}",
            path.display()
        ))
    })?;
    let schema = builder.schema().clone();
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    let find = |n: &str| names.iter().position(|c| *c == n);
    let truth_idx = find(truth_col).ok_or_else(|| {
        invalid(format!(
            "{}: column {truth_col:?} not found; columns are: [{}]. Use --truth-col to name the boolean ground-truth column",
            path.display(),
            names.join(", ")
        ))
    })?;
    let key_idx = match key_col {
        Some(k) => Some(find(k).ok_or_else(|| {
            invalid(format!(
                "{}: key column {k:?} not found; columns are: [{}]",
                path.display(),
                names.join(", ")
            ))
        })?),
        None => KEY_CANDIDATES.iter().find_map(|k| find(k)),
    };
    let mut cols = vec![truth_idx];
    cols.extend(key_idx);
    let mask = ProjectionMask::roots(builder.parquet_schema(), cols);
    let reader = builder
        .with_projection(mask)
        .build()
        .with_context(|| format!("reading {}", path.display()))?;
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut out = Vec::new();
    for batch in reader {
        let batch = batch.with_context(|| format!("reading {}", path.display()))?;
        let truth = batch
            .column_by_name(truth_col)
            .and_then(|c| c.as_any().downcast_ref::<BooleanArray>())
            .ok_or_else(|| {
                invalid(format!(
                    "{}: column {truth_col:?} must be boolean",
                    path.display()
                ))
            })?;
        let keys: Option<Vec<String>> = match key_idx {
            Some(k) => Some(
                key_strings(
                    batch
                        .column_by_name(names[k])
                        .context("key column")?
                        .as_ref(),
                )
                .ok_or_else(|| {
                    invalid(format!(
                        "{}: key column {:?} must be a string or integer",
                        path.display(),
                        names[k]
                    ))
                })?,
            ),
            None => None,
        };
        for i in 0..batch.num_rows() {
            let key = match &keys {
                Some(k) => k[i].clone(),
                None => format!("{stem}:{}", out.len()),
            };
            if truth.is_null(i) {
                return Err(invalid(format!(
                    "{}: {truth_col:?} is null in row {}",
                    path.display(),
                    out.len()
                )));
            }
            out.push((key, truth.value(i)));
        }
    }
    Ok(out)
}

fn key_strings(a: &dyn Array) -> Option<Vec<String>> {
    let any = a.as_any();
    let n = a.len();
    let get = |f: &dyn Fn(usize) -> String| {
        (0..n)
            .map(|i| if a.is_null(i) { String::new() } else { f(i) })
            .collect()
    };
    if let Some(s) = any.downcast_ref::<StringArray>() {
        Some(get(&|i| s.value(i).to_string()))
    } else if let Some(s) = any.downcast_ref::<LargeStringArray>() {
        Some(get(&|i| s.value(i).to_string()))
    } else if let Some(s) = any.downcast_ref::<Int64Array>() {
        Some(get(&|i| s.value(i).to_string()))
    } else if let Some(s) = any.downcast_ref::<Int32Array>() {
        Some(get(&|i| s.value(i).to_string()))
    } else {
        any.downcast_ref::<UInt64Array>()
            .map(|s| get(&|i| s.value(i).to_string()))
    }
}

/// Join labels with truth by key and compute the metrics.
pub fn detection(labels: &[LabelRow], truth: &[(String, bool)]) -> Result<Detection> {
    let map: HashMap<&str, bool> = truth.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    if map.len() != truth.len() {
        return Err(invalid(
            "the truth file has duplicate keys; pass --truth-key-col with a unique column",
        ));
    }
    let (mut probs, mut soft, mut sim) = (Vec::new(), Vec::new(), Vec::new());
    let mut ranked = Vec::new();
    let mut is_noisy = Vec::new();
    let mut predicted_noisy = Vec::new();
    let mut skipped = 0;
    let mut missing = 0;
    for l in labels {
        if l.status == RowStatus::Skipped {
            skipped += 1;
            continue;
        }
        let Some(&t) = map.get(l.key.as_str()) else {
            missing += 1;
            continue;
        };
        probs.push(f64::from(l.clean_prob.unwrap_or(0.0)));
        soft.push(-f64::from(l.soft_label.unwrap_or(0.0)));
        sim.push(-f64::from(l.similarity.unwrap_or(0.0)));
        ranked.push(Ranked {
            clean_prob: l.clean_prob.unwrap_or(0.0),
            similarity: l.similarity.unwrap_or(0.0),
        });
        is_noisy.push(t);
        predicted_noisy.push(!l.is_clean);
    }
    if missing > 0 {
        return Err(invalid(format!(
            "{missing} label rows have no matching key in the truth file; were the labels made from this data? (see --truth-key-col)"
        )));
    }
    let prf = precision_recall_f1(&predicted_noisy, &is_noisy);
    // Noisier first by -clean_prob, the order of 1 - clean_prob: computing
    // 1 - p itself rounds every p below 1e-16 to the same score, and a
    // confident mixture gives thousands of such pairs (GSC's preset on
    // Flickr8k: AUROC 0.9648 for what ranks at 0.9846).
    let scores: Vec<f64> = probs.iter().map(|p| -p).collect();
    let is_clean: Vec<bool> = is_noisy.iter().map(|&t| !t).collect();
    let n = probs.len();
    let noisy = is_noisy.iter().filter(|&&t| t).count();
    Ok(Detection {
        auroc: auroc(&scores, &is_noisy),
        ap: average_precision(&scores, &is_noisy),
        auroc_soft_label: auroc(&soft, &is_noisy),
        auroc_similarity: auroc(&sim, &is_noisy),
        auroc_ranked: auroc(&rule_order(&ranked), &is_noisy),
        mean_clean_prob: probs.iter().sum::<f64>() / n.max(1) as f64,
        clean_share: (n - noisy) as f64 / n.max(1) as f64,
        calibration_error: calibration_error(&probs, &is_clean),
        precision: prf.precision,
        recall: prf.recall,
        f1: prf.f1,
        n,
        noisy,
        skipped,
    })
}

/// The share rules' order ([`Ranked`]) as one noisiness score: each pair
/// gets its rank, cleanest first, so the noisiest score highest; pairs
/// equal in both scores share one.
fn rule_order(pairs: &[Ranked]) -> Vec<f64> {
    let mut idx: Vec<usize> = (0..pairs.len()).collect();
    idx.sort_by(|&a, &b| Ranked::descending(&pairs[a], &pairs[b]));
    let mut out = vec![0.0; pairs.len()];
    let mut rank = 0;
    for (pos, &i) in idx.iter().enumerate() {
        if pos > 0 && pairs[idx[pos - 1]] != pairs[i] {
            rank = pos;
        }
        out[i] = rank as f64;
    }
    out
}

fn run_retrieval(a: &EvalArgs, rep: &Reporter) -> Result<()> {
    if a.data.is_empty() {
        return Err(crate::Error::Usage(
            "eval --retrieval needs the held-out DATA to retrieve in".into(),
        ));
    }
    let chosen = crate::device::choose(&a.device)?;
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
    // One image per distinct image identity; every usable pair is a caption.
    let mut first: HashMap<u64, usize> = HashMap::new();
    let mut images = Vec::new();
    let mut owner = Vec::with_capacity(prepared.ok.len());
    for (k, id) in prepared.image_ids.iter().enumerate() {
        let idx = *first.entry(*id).or_insert_with(|| {
            images.push(k);
            images.len() - 1
        });
        owner.push(idx);
    }
    let captions: Vec<usize> = (0..prepared.ok.len()).collect();
    let sim = engine.similarity_matrix(&prepared, &images, &captions)?;
    let r = crate::retrieval::retrieval(&sim, images.len(), &owner);
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
    let truth = read_truth(truth_path, &a.truth_col, a.truth_key_col.as_deref())?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn row(key: &str, clean_prob: f32) -> LabelRow {
        LabelRow {
            key: key.to_string(),
            source_file: "f.parquet".to_string(),
            source_row: 0,
            clean_prob: Some(clean_prob),
            soft_label: Some(clean_prob),
            similarity: Some(clean_prob * 2.0 - 1.0),
            is_clean: clean_prob >= 0.5,
            status: RowStatus::Ok,
            error: None,
        }
    }

    fn truth(pairs: &[(&str, bool)]) -> Vec<(String, bool)> {
        pairs.iter().map(|&(k, t)| (k.to_string(), t)).collect()
    }

    #[test]
    fn tiny_clean_probs_keep_their_order() {
        // Four pairs the mixture is sure are noisy, with clean_prob far
        // below f64's epsilon: 1 - p is exactly 1.0 for all of them. The
        // two noisy ones rank lowest, so every noisy pair outranks every
        // clean one (AUROC 1; 1 - p ties them all: AUROC 0.5), and the two
        // noisy pairs come first at the top (AP 1; tied: 2/4 = 0.5).
        let labels = [
            row("a", 1e-30),
            row("b", 1e-25),
            row("c", 1e-20),
            row("d", 1e-18),
        ];
        let d = detection(
            &labels,
            &truth(&[("a", true), ("b", true), ("c", false), ("d", false)]),
        )
        .expect("detection");
        assert_eq!(d.auroc, Some(1.0));
        assert_eq!(d.ap, Some(1.0));
        assert_eq!((d.n, d.noisy), (4, 2));
    }

    #[test]
    fn pairs_tied_in_clean_prob_are_ranked_by_similarity_apart() {
        // Three pairs at clean_prob 1.0 (a saturated mixture), the noisy
        // one least similar: clean_prob ties it with both clean ones (each
        // (noisy, clean) pair counts half: AUROC 0.5), the similarity
        // ranks it below both (AUROC 1).
        let mut labels = [row("a", 1.0), row("b", 1.0), row("c", 1.0)];
        for (l, s) in labels.iter_mut().zip([0.8, 0.7, 0.1]) {
            l.similarity = Some(s);
        }
        let d = detection(&labels, &truth(&[("a", false), ("b", false), ("c", true)]))
            .expect("detection");
        assert_eq!(d.auroc, Some(0.5));
        assert_eq!(d.auroc_similarity, Some(1.0));
        // The rules cut the tie by similarity too.
        assert_eq!(d.auroc_ranked, Some(1.0));
        // Equal in both scores: still a tie (each pair counts half), and
        // clean_prob comes before the similarity.
        labels[1].similarity = Some(0.1);
        labels[0].clean_prob = Some(0.5);
        let d = detection(&labels, &truth(&[("a", false), ("b", false), ("c", true)]))
            .expect("detection");
        assert_eq!(d.auroc_ranked, Some(0.25));
    }

    #[test]
    fn detection_matches_hand_computed_metrics() {
        // clean_prob 0.9 (clean), 0.6 (noisy), 0.4 (clean), 0.1 (noisy):
        // of the 4 (noisy, clean) pairs, the noisy one ranks lower in 3
        // (0.6 > 0.4 is the miss): AUROC 3/4. Descending noisiness: 0.1
        // (noisy, P 1/1), 0.4 (clean), 0.6 (noisy, P 2/3): AP (1 + 2/3)/2.
        // is_clean = p >= 0.5 calls 0.4 and 0.1 noisy: one of two right,
        // one of two noisy found.
        let labels = [row("a", 0.9), row("b", 0.6), row("c", 0.4), row("d", 0.1)];
        let d = detection(
            &labels,
            &truth(&[("a", false), ("b", true), ("c", false), ("d", true)]),
        )
        .expect("detection");
        assert_eq!(d.auroc, Some(0.75));
        assert_eq!(d.auroc_soft_label, Some(0.75));
        assert_eq!(d.auroc_similarity, Some(0.75));
        assert_eq!(d.auroc_ranked, Some(0.75));
        // Bins: 0.9 (clean) gap 0.1; 0.6 (noisy) gap 0.6; 0.4 (clean) gap
        // 0.6; 0.1 (noisy) gap 0.1; a quarter each.
        assert!(
            (d.mean_clean_prob - 0.5).abs() < 1e-6,
            "{}",
            d.mean_clean_prob
        );
        assert_eq!(d.clean_share, 0.5);
        let ece = d.calibration_error.expect("ece");
        assert!((ece - 0.35).abs() < 1e-6, "{ece}");
        let ap = d.ap.expect("ap");
        assert!((ap - (1.0 + 2.0 / 3.0) / 2.0).abs() < 1e-12, "{ap}");
        assert_eq!((d.precision, d.recall), (0.5, 0.5));
    }
}
