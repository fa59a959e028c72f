//! Labels judged against ground truth (`ncclean eval`): reading the truth
//! column (a boolean noisy flag, or a graded rating) and the keys it is
//! joined on, detection metrics of the noisy class for boolean truth, and
//! the agreement of the ranking with graded truth.

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;

use anyhow::Context;
use arrow_array::{
    Array, BooleanArray, Int32Array, Int64Array, LargeStringArray, StringArray, UInt64Array,
};
use arrow_schema::DataType;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ProjectionMask;
use serde::Serialize;

use crate::curation::metrics::{
    auroc, average_precision, calibration_error, kendall_tau_b, precision_recall_f1, spearman,
};
use crate::curation::threshold::Ranked;
use crate::data::{LabelRow, RowStatus};
use crate::error::{invalid, Result};

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
    /// equal-width bins ([`crate::curation::metrics::calibration_error`]); None
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

/// Ground truth per key, as the truth column's type says.
#[derive(Debug, Clone, PartialEq)]
pub enum Truth {
    /// A boolean column: true for a mismatched (noisy) pair.
    Noisy(Vec<(String, bool)>),
    /// A numeric column: a graded rating, higher for a better match (a 1–5
    /// score, the share of raters who said yes, a relevance).
    Graded(Vec<(String, f64)>),
}

/// Read the truth column and the keys from the truth file.
pub fn read_truth(path: &Path, truth_col: &str, key_col: Option<&str>) -> Result<Truth> {
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
    let graded = match schema.field(truth_idx).data_type() {
        DataType::Boolean => false,
        t if t.is_numeric() => true,
        t => {
            return Err(invalid(format!(
            "{}: truth column {truth_col:?} is {t}; it must be boolean (true = a mismatched pair) \
                 or numeric (a graded rating, higher = a better match)",
            path.display()
        )))
        }
    };
    let mut noisy = Vec::new();
    let mut grades = Vec::new();
    let mut rows = 0usize;
    for batch in reader {
        let batch = batch.with_context(|| format!("reading {}", path.display()))?;
        let key_name = key_idx.map(|k| names[k]);
        let (keys, values) = batch_truth(&batch, path, truth_col, key_name, graded)?;
        for (i, v) in values.into_iter().enumerate() {
            let key = match &keys {
                Some(k) => k[i].clone(),
                None => format!("{stem}:{rows}"),
            };
            let v = match v {
                Some(v) if v.is_finite() => v,
                _ => {
                    return Err(invalid(format!(
                        "{}: {truth_col:?} is {} in row {rows}; every pair needs a truth value",
                        path.display(),
                        if v.is_some() {
                            "not a finite number"
                        } else {
                            "null"
                        }
                    )))
                }
            };
            if graded {
                grades.push((key, v));
            } else {
                noisy.push((key, v != 0.0));
            }
            rows += 1;
        }
    }
    if !graded {
        return Ok(Truth::Noisy(noisy));
    }
    if grades.windows(2).all(|w| w[0].1 == w[1].1) {
        return Err(invalid(format!(
            "{}: the graded truth column {truth_col:?} holds one value for every row; \
             ratings that do not vary cannot rank the labels",
            path.display()
        )));
    }
    Ok(Truth::Graded(grades))
}

/// One batch of the truth file: its keys (when the file has a key column)
/// and its truth values (a boolean as 0/1; None per null).
type BatchTruth = (Option<Vec<String>>, Vec<Option<f64>>);

/// The keys and truth values of one batch of the truth file.
fn batch_truth(
    batch: &arrow_array::RecordBatch,
    path: &Path,
    truth_col: &str,
    key_name: Option<&str>,
    graded: bool,
) -> Result<BatchTruth> {
    let column = batch
        .column_by_name(truth_col)
        .context("truth column")?
        .clone();
    let keys: Option<Vec<String>> = match key_name {
        Some(name) => Some(
            key_strings(batch.column_by_name(name).context("key column")?.as_ref()).ok_or_else(
                || {
                    invalid(format!(
                        "{}: key column {:?} must be a string or integer",
                        path.display(),
                        name
                    ))
                },
            )?,
        ),
        None => None,
    };
    let values: Vec<Option<f64>> = if graded {
        numeric_values(column.as_ref()).ok_or_else(|| {
            invalid(format!(
                "{}: truth column {truth_col:?} is {}, which eval cannot read as a number",
                path.display(),
                column.data_type()
            ))
        })?
    } else {
        let b = column
            .as_any()
            .downcast_ref::<BooleanArray>()
            .context("truth column as boolean")?;
        (0..b.len())
            .map(|i| (!b.is_null(i)).then(|| f64::from(u8::from(b.value(i)))))
            .collect()
    };
    Ok((keys, values))
}

/// The values of a numeric column as f64 (None per null); None for a type
/// other than the integer and float types.
fn numeric_values(a: &dyn Array) -> Option<Vec<Option<f64>>> {
    use arrow_array::cast::AsArray;
    use arrow_array::types::*;
    macro_rules! read {
        ($t:ty) => {{
            let p = a.as_primitive_opt::<$t>()?;
            Some(
                (0..p.len())
                    .map(|i| (!p.is_null(i)).then(|| p.value(i) as f64))
                    .collect(),
            )
        }};
    }
    match a.data_type() {
        DataType::Float64 => read!(Float64Type),
        DataType::Float32 => read!(Float32Type),
        DataType::Float16 => {
            let p = a.as_primitive_opt::<Float16Type>()?;
            Some(
                (0..p.len())
                    .map(|i| (!p.is_null(i)).then(|| f64::from(p.value(i))))
                    .collect(),
            )
        }
        DataType::Int8 => read!(Int8Type),
        DataType::Int16 => read!(Int16Type),
        DataType::Int32 => read!(Int32Type),
        DataType::Int64 => read!(Int64Type),
        DataType::UInt8 => read!(UInt8Type),
        DataType::UInt16 => read!(UInt16Type),
        DataType::UInt32 => read!(UInt32Type),
        DataType::UInt64 => read!(UInt64Type),
        _ => None,
    }
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

/// The scored label rows with their truth, joined by key, and the number
/// of skipped rows; refuses duplicate truth keys and labels without truth.
fn join<'a, T: Copy>(
    labels: &'a [LabelRow],
    truth: &[(String, T)],
) -> Result<(Vec<(&'a LabelRow, T)>, usize)> {
    let map: HashMap<&str, T> = truth.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    if map.len() != truth.len() {
        return Err(invalid(
            "the truth file has duplicate keys; pass --truth-key-col with a unique column",
        ));
    }
    let (mut joined, mut skipped, mut missing) = (Vec::new(), 0, 0);
    for l in labels {
        if l.status == RowStatus::Skipped {
            skipped += 1;
        } else if let Some(&t) = map.get(l.key.as_str()) {
            joined.push((l, t));
        } else {
            missing += 1;
        }
    }
    if missing > 0 {
        return Err(invalid(format!(
            "{missing} label rows have no matching key in the truth file; were the labels made from this data? (see --truth-key-col)"
        )));
    }
    Ok((joined, skipped))
}

/// Join labels with truth by key and compute the metrics.
pub fn detection(labels: &[LabelRow], truth: &[(String, bool)]) -> Result<Detection> {
    let (joined, skipped) = join(labels, truth)?;
    let (mut probs, mut soft, mut sim) = (Vec::new(), Vec::new(), Vec::new());
    let mut ranked = Vec::new();
    let mut is_noisy = Vec::new();
    let mut predicted_noisy = Vec::new();
    for (l, t) in joined {
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

/// How labels rank pairs against graded truth: one rating per pair, higher
/// for a better match (METHODS.md section 6, "Graded agreement").
#[derive(Debug, Clone, Serialize)]
pub struct Agreement {
    /// Kendall τb of clean_prob with the truth.
    pub kendall_clean_prob: Option<f64>,
    /// Kendall τb of the similarity with the truth.
    pub kendall_similarity: Option<f64>,
    /// Kendall τb of the soft label with the truth.
    pub kendall_soft_label: Option<f64>,
    /// Spearman's ρ of clean_prob with the truth.
    pub spearman_clean_prob: Option<f64>,
    /// Spearman's ρ of the similarity with the truth.
    pub spearman_similarity: Option<f64>,
    /// Spearman's ρ of the soft label with the truth.
    pub spearman_soft_label: Option<f64>,
    /// AUC of clean_prob for the pairs rated in the top third against those
    /// in the bottom third.
    pub auc_clean_prob: Option<f64>,
    /// The same AUC for the similarity.
    pub auc_similarity: Option<f64>,
    /// The same AUC for the soft label.
    pub auc_soft_label: Option<f64>,
    /// Mean clean_prob over the pairs.
    pub mean_clean_prob: f64,
    /// Pairs evaluated (scored rows with a rating).
    pub n: usize,
    /// Pairs in the top third of the ratings (ties at its edge kept whole).
    pub top: usize,
    /// Pairs in the bottom third of the ratings (ties at its edge kept whole).
    pub bottom: usize,
    /// Label rows not evaluated because they were skipped.
    pub skipped: usize,
}

/// Join labels with graded truth by key and measure how the labels' scores
/// rank the pairs against it.
pub fn agreement(labels: &[LabelRow], truth: &[(String, f64)]) -> Result<Agreement> {
    let (joined, skipped) = join(labels, truth)?;
    let (mut probs, mut sim, mut soft, mut grade) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (l, t) in joined {
        probs.push(f64::from(l.clean_prob.unwrap_or(0.0)));
        sim.push(f64::from(l.similarity.unwrap_or(0.0)));
        soft.push(f64::from(l.soft_label.unwrap_or(0.0)));
        grade.push(t);
    }
    let thirds = Thirds::of(&grade);
    let n = probs.len();
    Ok(Agreement {
        kendall_clean_prob: kendall_tau_b(&probs, &grade),
        kendall_similarity: kendall_tau_b(&sim, &grade),
        kendall_soft_label: kendall_tau_b(&soft, &grade),
        spearman_clean_prob: spearman(&probs, &grade),
        spearman_similarity: spearman(&sim, &grade),
        spearman_soft_label: spearman(&soft, &grade),
        auc_clean_prob: thirds.auc(&probs),
        auc_similarity: thirds.auc(&sim),
        auc_soft_label: thirds.auc(&soft),
        mean_clean_prob: probs.iter().sum::<f64>() / n.max(1) as f64,
        n,
        top: thirds.top(),
        bottom: thirds.bottom(),
        skipped,
    })
}

/// The pairs rated in the top and in the bottom third. A rating scale has
/// few values, so a third's edge usually falls inside a tie: the tie is kept
/// whole. When both edges fall in one tie (more than a third of the pairs
/// share the middle value), the pairs above it are the top and those below
/// it the bottom.
struct Thirds {
    /// Per pair: Some(true) top, Some(false) bottom, None neither.
    side: Vec<Option<bool>>,
}

impl Thirds {
    fn of(grade: &[f64]) -> Thirds {
        let mut sorted = grade.to_vec();
        sorted.sort_unstable_by(f64::total_cmp);
        let n = sorted.len();
        let k = (n / 3).max(1);
        let side = if n < 2 {
            vec![None; n]
        } else {
            let (low, high) = (sorted[k - 1], sorted[n - k]);
            grade
                .iter()
                .map(|&g| {
                    if low < high {
                        (g >= high).then_some(true).or((g <= low).then_some(false))
                    } else {
                        (g > high).then_some(true).or((g < low).then_some(false))
                    }
                })
                .collect()
        };
        Thirds { side }
    }

    fn top(&self) -> usize {
        self.side.iter().filter(|s| **s == Some(true)).count()
    }

    fn bottom(&self) -> usize {
        self.side.iter().filter(|s| **s == Some(false)).count()
    }

    /// AUC of `score` for the top third against the bottom third.
    fn auc(&self, score: &[f64]) -> Option<f64> {
        let (s, l): (Vec<f64>, Vec<bool>) = score
            .iter()
            .zip(&self.side)
            .filter_map(|(&v, side)| side.map(|top| (v, top)))
            .unzip();
        auroc(&s, &l)
    }
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

    fn graded(pairs: &[(&str, f64)]) -> Vec<(String, f64)> {
        pairs.iter().map(|&(k, t)| (k.to_string(), t)).collect()
    }

    #[test]
    fn agreement_matches_hand_computed_ranks() {
        // Ratings 1..6; clean_prob 0.1, 0.3, 0.2, 0.6, 0.5, 0.9. Of the 15
        // pairs, (b, c) and (d, e) are discordant: tau = (13 - 2) / 15.
        // Rank differences (0, 1, -1, 1, -1, 0): rho = 1 - 6 * 4 / (6 * 35).
        // Thirds: the bottom rated 1-2 (0.1, 0.3), the top 5-6 (0.5, 0.9):
        // every top pair above every bottom one, AUC 1.
        let probs = [0.1, 0.3, 0.2, 0.6, 0.5, 0.9];
        let keys = ["a", "b", "c", "d", "e", "f"];
        let mut labels: Vec<LabelRow> = keys.iter().zip(probs).map(|(k, p)| row(k, p)).collect();
        // The similarity ranks them backwards, the soft label as clean_prob.
        for (i, l) in labels.iter_mut().enumerate() {
            l.similarity = Some(-(i as f32));
        }
        let truth: Vec<(&str, f64)> = keys
            .iter()
            .zip(1..=6)
            .map(|(k, g)| (*k, f64::from(g)))
            .collect();
        let g = agreement(&labels, &graded(&truth)).expect("agreement");
        let tau = g.kendall_clean_prob.expect("tau");
        assert!((tau - 11.0 / 15.0).abs() < 1e-12, "{tau}");
        let rho = g.spearman_clean_prob.expect("rho");
        assert!((rho - (1.0 - 24.0 / 210.0)).abs() < 1e-12, "{rho}");
        assert_eq!(g.auc_clean_prob, Some(1.0));
        assert_eq!(g.kendall_similarity, Some(-1.0));
        assert_eq!(g.auc_similarity, Some(0.0));
        assert_eq!(g.kendall_soft_label, g.kendall_clean_prob);
        assert_eq!((g.n, g.top, g.bottom, g.skipped), (6, 2, 2, 0));
    }

    #[test]
    fn thirds_keep_ties_whole() {
        // 1,1,1,2,2,3,3,3,3: the bottom third's edge is 1, the top's 3.
        let t = Thirds::of(&[1.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 3.0, 3.0]);
        assert_eq!((t.top(), t.bottom()), (4, 3));
        // Both edges in the middle tie: above it and below it.
        let t = Thirds::of(&[1.0, 2.0, 2.0, 2.0, 2.0, 3.0]);
        assert_eq!((t.top(), t.bottom()), (1, 1));
        // Two values only: each its own side.
        let t = Thirds::of(&[0.0, 1.0, 1.0, 0.0]);
        assert_eq!((t.top(), t.bottom()), (2, 2));
    }

    fn truth_file(dir: &std::path::Path, column: arrow_array::ArrayRef) -> std::path::PathBuf {
        use std::sync::Arc;
        let n = column.len();
        let keys: arrow_array::ArrayRef = Arc::new(StringArray::from(
            (0..n).map(|i| format!("k{i}")).collect::<Vec<_>>(),
        ));
        let batch = arrow_array::RecordBatch::try_from_iter([("key", keys), ("rating", column)])
            .expect("batch");
        let path = dir.join("truth.parquet");
        let file = File::create(&path).expect("create");
        let mut w =
            parquet::arrow::ArrowWriter::try_new(file, batch.schema(), None).expect("writer");
        w.write(&batch).expect("write");
        w.close().expect("close");
        path
    }

    #[test]
    fn numeric_truth_is_graded_and_bad_truth_is_refused_by_name() {
        use std::sync::Arc;
        let dir = tempfile::tempdir().expect("tempdir");
        let ints: arrow_array::ArrayRef = Arc::new(Int32Array::from(vec![1, 4, 2]));
        let p = truth_file(dir.path(), ints);
        let t = read_truth(&p, "rating", None).expect("graded truth");
        assert_eq!(
            t,
            Truth::Graded(graded(&[("k0", 1.0), ("k1", 4.0), ("k2", 2.0)]))
        );
        let message = |column: arrow_array::ArrayRef| {
            let p = truth_file(dir.path(), column);
            read_truth(&p, "rating", None)
                .expect_err("refused")
                .to_string()
        };
        let m = message(Arc::new(arrow_array::Float64Array::from(vec![
            1.0,
            f64::NAN,
            2.0,
        ])));
        assert!(m.contains("\"rating\"") && m.contains("row 1"), "{m}");
        let m = message(Arc::new(arrow_array::Float64Array::from(vec![
            Some(1.0),
            None,
        ])));
        assert!(m.contains("null in row 1"), "{m}");
        let m = message(Arc::new(arrow_array::Float32Array::from(vec![
            3.0, 3.0, 3.0,
        ])));
        assert!(m.contains("one value for every row"), "{m}");
        let m = message(Arc::new(StringArray::from(vec!["good", "bad"])));
        assert!(
            m.contains("\"rating\" is Utf8") && m.contains("numeric"),
            "{m}"
        );
        // Booleans stay detection truth.
        let p = truth_file(dir.path(), Arc::new(BooleanArray::from(vec![true, false])));
        assert_eq!(
            read_truth(&p, "rating", None).expect("boolean truth"),
            Truth::Noisy(truth(&[("k0", true), ("k1", false)]))
        );
    }
}
