//! Where a run's training data lives and how `fit` read it, recorded in
//! `run.json` (`input_files`) so that `ncclean score` without DATA scores
//! the same rows, and `ncclean report` finds its pictures, from any
//! directory: run.json's `inputs` are the paths as typed, relative to where
//! `fit` ran.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::cli::DataArgs;
use crate::data::{CaptionFrom, ColumnMap, InputSet, KeyFrom};
use crate::error::{Error, Result};
use crate::run::dir::{absolute, json_field, read_json};

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
    /// The record of `input`, opened from the flags `data`.
    pub fn of(input: &InputSet, data: &DataArgs) -> Result<RunInputs> {
        Ok(RunInputs {
            files: input
                .files
                .iter()
                .map(|f| absolute(&f.path))
                .collect::<Result<_>>()?,
            image_root: input.image_root.as_deref().map(absolute).transpose()?,
            caption_from: data.caption_from.clone(),
            key_from: data.key_from.clone(),
        })
    }

    /// Fill the flags `data` that were not given with what `fit` used:
    /// the files, and for parquet the columns it resolved and the image
    /// root, for tar shards the caption and key sources (each format
    /// refuses the other's flags). `run` is the run directory or its
    /// `checkpoint/`.
    pub fn fill(data: &mut DataArgs, run: &Path) -> Result<usize> {
        let (record, columns) = read(run)?;
        let tar = record.files.iter().any(|f| crate::data::is_tar(f));
        data.data = record.files;
        if tar {
            data.caption_from = data.caption_from.take().or(record.caption_from);
            data.key_from = data.key_from.take().or(record.key_from);
        } else {
            data.image_col.get_or_insert(columns.image);
            data.caption_col.get_or_insert(columns.caption);
            data.key_col = data.key_col.take().or(columns.key);
            data.text_emb_col = data.text_emb_col.take().or(columns.text_embedding);
            data.image_root = data.image_root.take().or(record.image_root);
        }
        Ok(data.data.len())
    }
}

/// The content fingerprint of the training data that run.json records
/// (`input_fingerprint`), for the run at `run` (a run directory or its
/// `checkpoint/`); `None` for a run that records none.
pub fn recorded_fingerprint(run: &Path) -> Option<String> {
    let checkpoint = crate::run::checkpoint::locate(run).ok()?;
    let path = checkpoint.parent()?.join("run.json");
    let run = read_json(&path).ok()?;
    json_field::<String>(&run, "input_fingerprint")
}

/// Whether the training files run.json names for the run at `run` changed
/// since `fit` (their content no longer gives the recorded
/// `input_fingerprint`, or one cannot be read); `None` for a run that
/// records no fingerprint or no files.
pub fn recorded_inputs_changed(run: &Path) -> Option<bool> {
    let want = recorded_fingerprint(run)?;
    let (record, _) = read(run).ok()?;
    Some(
        crate::data::fingerprint_files(record.files.iter().map(PathBuf::as_path))
            .map_or(true, |got| got != want),
    )
}

/// The recorded inputs and resolved columns of the run at `run` (a run
/// directory or its `checkpoint/`, as [`crate::run::checkpoint::locate`] takes it:
/// run.json sits beside the checkpoint).
fn read(run: &Path) -> Result<(RunInputs, ColumnMap)> {
    let checkpoint = crate::run::checkpoint::locate(run)?;
    let path = checkpoint
        .parent()
        .unwrap_or(Path::new("."))
        .join("run.json");
    if !path.is_file() {
        return Err(Error::Usage(format!(
            "no DATA given, and {} has no run.json to take the training data from: \
             name the files to score (DATA)",
            run.display()
        )));
    }
    let run = read_json(&path)?;
    match (
        json_field::<RunInputs>(&run, "input_files"),
        json_field::<ColumnMap>(&run, "columns"),
    ) {
        (Some(r), Some(c)) if !r.files.is_empty() => Ok((r, c)),
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
    let run = read_json(&dir.join("run.json")).ok()?;
    let inputs: Vec<String> = json_field(&run, "inputs")?;
    let first = inputs.first()?;
    Some(match inputs.len() {
        1 => first.clone(),
        n => format!("{first} and {} more file(s)", n - 1),
    })
}
