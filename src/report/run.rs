//! Reading a run directory back for the report: `run.json`, `stats.json`
//! and the labels, each within a size limit.

use std::path::{Path, PathBuf};

use ncclean_pipelines::EpochStats;

use super::thumbs::Source;
use crate::curation::division_record::DivisionRecord;
use crate::data::LabelRow;
use crate::error::{invalid, Result};
use crate::run::dir::{self, json_field};
use crate::run::run_json::{self, RunJson};

/// What the report needs from a run directory.
#[derive(Debug, Clone)]
pub struct RunRecord {
    /// The run directory.
    pub dir: PathBuf,
    /// Method name.
    pub method: String,
    /// Seed of the fit.
    pub seed: Option<u64>,
    /// The run's decision threshold (`is_clean = clean_prob >= threshold`).
    pub threshold: f64,
    /// Where the pairs came from.
    pub source: Source,
    /// Per-epoch statistics (empty when `stats.json` is missing).
    pub epochs: Vec<EpochStats>,
    /// The final division, when `fit` recorded it.
    pub division: Option<DivisionRecord>,
    /// What `fit` warned about the division (`stats.json` `warnings`).
    pub warnings: Vec<String>,
    /// `fit`'s check of the trained model against random pairings.
    pub signal: Option<crate::curation::division_check::SignalCheck>,
    /// One row per input row.
    pub labels: Vec<LabelRow>,
}

/// Read the run in `dir` (a directory `ncclean fit --out-dir` wrote).
pub fn load(dir: &Path) -> Result<RunRecord> {
    let run_json = dir.join(run_json::FILE);
    if !run_json.is_file() {
        return Err(invalid(format!(
            "{}: not an ncclean run directory (it has no run.json); give the --out-dir of `ncclean fit`",
            dir.display()
        )));
    }
    let run = RunJson::read(&run_json)?;
    if !run.complete {
        return Err(invalid(format!(
            "{}: the run is not marked complete; run `ncclean fit` to the end first",
            run_json.display()
        )));
    }
    let method = run.method.unwrap_or_else(|| "unknown".to_string());
    // The output cut (run.json's `threshold`, since threshold rules); runs
    // from before it labelled at the training threshold.
    let threshold = run
        .threshold
        .map(|cut| cut.min_prob)
        .or(run.config.map(|c| c.threshold))
        .filter(|t| *t <= 1.0)
        .unwrap_or(crate::curation::threshold::DEFAULT_MIN_PROB);
    let inputs: Vec<String> = run.inputs.ok_or_else(|| {
        invalid(format!(
            "{}: \"inputs\" is not a list of paths",
            run_json.display()
        ))
    })?;
    let recorded = run.input_files.filter(|r| r.files.len() == inputs.len());
    let source = Source {
        inputs,
        columns: run.columns,
        image_root: run.image_root,
        image_limits: run.image_limits.unwrap_or_default(),
        recorded,
    };
    let stats_path = dir.join("stats.json");
    let (epochs, division, warnings, signal) = if stats_path.is_file() {
        let stats: serde_json::Value = dir::read_json(&stats_path)?;
        let epochs = serde_json::from_value(stats.get("epochs").cloned().unwrap_or_default())
            .map_err(|e| {
                invalid(format!(
                    "{}: \"epochs\" is not a list of epoch statistics ({e})",
                    stats_path.display()
                ))
            })?;
        // These are informative only: a run without them (older, or hand
        // made) still has a report.
        (
            epochs,
            json_field(&stats, "division"),
            json_field(&stats, "warnings").unwrap_or_default(),
            json_field(&stats, "signal"),
        )
    } else {
        (Vec::new(), None, Vec::new(), None)
    };
    let (labels, _) = crate::data::read_labels(&dir.join("labels.parquet"))?;
    Ok(RunRecord {
        dir: dir.to_path_buf(),
        method,
        seed: run.seed,
        threshold,
        source,
        epochs,
        division,
        warnings,
        signal,
        labels,
    })
}
