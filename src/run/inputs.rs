//! Where a run's training data lives and how `fit` read it, recorded in
//! `run.json` (`input_files`) so that `ncclean score` without DATA scores
//! the same rows, and `ncclean report` finds its pictures, from any
//! directory: run.json's `inputs` are the paths as typed, relative to where
//! `fit` ran.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::data::{CaptionFrom, ColumnMap, InputSet, KeyFrom};
use crate::error::{Error, Result};
use crate::run::dir::absolute;
use crate::run::run_json::{self, RunJson};

/// The run directory `fit` writes and `score` and `report` read when no
/// other is named.
pub const DEFAULT_RUN_DIR: &str = "ncclean-run";

/// run.json's record of the training data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunInputs {
    /// Every input file, absolute, in input order (run.json's `inputs`
    /// names the same files as they were typed).
    pub files: Vec<PathBuf>,
    /// `--image-root`, absolute.
    pub image_root: Option<PathBuf>,
    /// Tar shards: `--caption-from`.
    pub caption_from: Option<CaptionFrom>,
    /// Tar shards: `--key-from`.
    pub key_from: Option<KeyFrom>,
}

impl RunInputs {
    /// The record of `input`, read with the tar shards' `caption_from` and
    /// `key_from` (as given).
    pub fn of(
        input: &InputSet,
        caption_from: Option<CaptionFrom>,
        key_from: Option<KeyFrom>,
    ) -> Result<RunInputs> {
        Ok(RunInputs {
            files: input
                .files
                .iter()
                .map(|f| absolute(&f.path))
                .collect::<Result<_>>()?,
            image_root: input.image_root.as_deref().map(absolute).transpose()?,
            caption_from,
            key_from,
        })
    }

    /// Whether the recorded files are webdataset tar shards.
    pub fn is_tar(&self) -> bool {
        self.files.iter().any(|f| crate::data::is_tar(f))
    }
}

/// What `fit` recorded about its training data: where it lives and the
/// columns it resolved; the command fills the flags it was not given from
/// it (`score` and `report` without DATA).
#[derive(Debug, Clone, PartialEq)]
pub struct Recorded {
    /// The files and how they were read.
    pub inputs: RunInputs,
    /// The columns `fit` resolved.
    pub columns: ColumnMap,
}

/// The content fingerprint of the training data that run.json records
/// (`input_fingerprint`), for the run at `run` (a run directory or its
/// `checkpoint/`); `None` for a run that records none.
pub fn recorded_fingerprint(run: &Path) -> Option<String> {
    let checkpoint = crate::run::checkpoint::locate(run).ok()?;
    RunJson::of_dir(checkpoint.parent()?)?.input_fingerprint
}

/// Whether the training files run.json names for the run at `run` changed
/// since `fit` (their content no longer gives the recorded
/// `input_fingerprint`, or one cannot be read); `None` for a run that
/// records no fingerprint or no files.
pub fn recorded_inputs_changed(run: &Path) -> Option<bool> {
    let want = recorded_fingerprint(run)?;
    let record = recorded(run).ok()?.inputs;
    Some(
        crate::data::fingerprint_files(record.files.iter().map(PathBuf::as_path))
            .map_or(true, |got| got != want),
    )
}

/// The recorded inputs and resolved columns of the run at `run` (a run
/// directory or its `checkpoint/`, as [`crate::run::checkpoint::locate`] takes it:
/// run.json sits beside the checkpoint).
pub fn recorded(run: &Path) -> Result<Recorded> {
    let checkpoint = crate::run::checkpoint::locate(run)?;
    let path = checkpoint
        .parent()
        .unwrap_or(Path::new("."))
        .join(run_json::FILE);
    if !path.is_file() {
        return Err(Error::Usage(format!(
            "no DATA given, and {} has no run.json to take the training data from: \
             name the files to score (DATA)",
            run.display()
        )));
    }
    let run = RunJson::read(&path)?;
    match (run.input_files, run.columns) {
        (Some(inputs), Some(columns)) if !inputs.files.is_empty() => {
            Ok(Recorded { inputs, columns })
        }
        _ => Err(Error::Usage(format!(
            "no DATA given, and {} does not record where its training data lives \
             (a run from an older ncclean): name the files to score (DATA)",
            path.display()
        ))),
    }
}

/// The run directory a command reads: `given`, or [`DEFAULT_RUN_DIR`] with
/// an error that says how to get one when it does not exist; `how` says
/// how the command names a run (`--checkpoint DIR`).
pub fn run_dir_or_default(given: Option<&Path>, how: &str) -> Result<PathBuf> {
    if let Some(p) = given {
        return Ok(p.to_path_buf());
    }
    let default = PathBuf::from(DEFAULT_RUN_DIR);
    if default.exists() {
        Ok(default)
    } else {
        Err(Error::Usage(format!(
            "no run named, and ./{DEFAULT_RUN_DIR} does not exist here. Fit one first \
             (`ncclean fit DATA` writes ./{DEFAULT_RUN_DIR}), or name the run directory \
             ({how})"
        )))
    }
}

/// What the complete run in `dir` was fitted on ("a.parquet", "a.parquet
/// and 3 more files"), when `dir` holds one.
pub fn earlier_run(dir: &Path) -> Option<String> {
    let inputs = RunJson::of_dir(dir)?.inputs?;
    let first = inputs.first()?;
    Some(match inputs.len() {
        1 => first.clone(),
        n => format!("{first} and {} more file(s)", n - 1),
    })
}
