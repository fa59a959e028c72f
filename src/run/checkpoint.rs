//! Checkpoints: safetensors weights plus one JSON state file.
//!
//! Layout of `RUN/checkpoint/`:
//! - `state.json`: [`CheckpointState`] (config, model, vocabulary, input
//!   layout, the pipeline's method state such as mixture parameters);
//! - `<net>.safetensors`: one file per network;
//! - `pairs.safetensors`: per-pair label state of the training pairs.
//!
//! - `manifest.json`: every other file's size and sha256 ([`verify`]).
//!
//! The directory is written under a temporary name and renamed into place.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use anyhow::Context;
use candle_core::{Device, Tensor};
use ncclean_models::vocab::Vocab;
use ncclean_models::ModelConfig;
use ncclean_pipelines::division::Division;
use ncclean_pipelines::{EpochStats, Pipeline, TrainConfig};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::curation::threshold::{Record, KEEP_NONE, RECORD_FILE};
use crate::data::ColumnMap;
use crate::error::{invalid, pipeline_at, Result};
use crate::runtime::hex::{hex, FileDigest};
use crate::runtime::small_file;
use crate::runtime::temp;

/// Version of the checkpoint layout; bumped on incompatible changes.
/// 2: the method state is the runner's (`division`, `net_seeds`,
/// `epochs_done`, `method`).
pub const FORMAT_VERSION: u32 = 2;

/// Everything besides weights that `score` needs to rebuild a trained engine.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CheckpointState {
    /// Layout version.
    pub format_version: u32,
    /// ncclean version that wrote it.
    pub ncclean_version: String,
    /// Method name.
    pub method: String,
    /// Seed of the run.
    pub seed: u64,
    /// Resolved training configuration.
    pub config: TrainConfig,
    /// Model architecture.
    pub model: ModelConfig,
    /// Vocabulary of the demo text tower, if used.
    pub vocab: Option<Vocab>,
    /// Towers that produce the head's inputs.
    pub encoders: crate::towers::encoders::EncoderSpec,
    /// Input columns the model was trained on (for messages on mismatch).
    pub columns: ColumnMap,
    /// Number of training pairs (per-pair state is aligned with them).
    pub train_pairs: usize,
    /// Pipeline method state.
    pub pipeline: serde_json::Value,
}

impl CheckpointState {
    /// The final division the pipeline's state holds; `None` when it holds
    /// none (a method without one) or one of another shape.
    pub fn division(&self) -> Option<Division> {
        serde_json::from_value(self.pipeline.get("division")?.clone()).ok()
    }

    /// Whether `clean_prob` comes from a fitted final clean-probability
    /// model (`ncclean_pipelines::clean_model`) rather than the division.
    pub fn has_clean_model(&self) -> bool {
        self.pipeline
            .get("clean_model")
            .is_some_and(|m| !m.is_null())
    }

    /// How the method computes its division statistic, in its own words,
    /// where its state says.
    pub fn division_statistic(&self) -> Option<&str> {
        ["/method/division_statistic", "/division_statistic"]
            .iter()
            .find_map(|p| self.pipeline.pointer(p)?.as_str())
    }
}

/// What an epoch checkpoint must match to be continued, and what the
/// finished epochs reported (so `stats.json` of a resumed run is complete).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ResumeInfo {
    /// sha256 of the input files' content.
    pub input_fingerprint: String,
    /// Hash of the resolved configuration.
    pub config_hash: String,
    /// One entry per finished epoch.
    pub epochs: Vec<EpochStats>,
}

/// File name of the checkpoint's [`Manifest`].
pub const MANIFEST_FILE: &str = "manifest.json";

/// What a checkpoint directory held when it was written: each file's size
/// and sha256, so a changed weight, an edited state or threshold, a cut
/// vocabulary or a truncated file is refused naming the file, instead of
/// giving other labels without a word.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// File name → its digest.
    pub files: BTreeMap<String, FileDigest>,
}

/// The digest of the file `p`.
fn digest(p: &Path) -> Result<FileDigest> {
    Ok(FileDigest::of(p).with_context(|| format!("cannot read {}", p.display()))?)
}

/// The files of a checkpoint directory the manifest covers: regular files,
/// not temporaries (dot names), not the manifest itself; sorted.
fn covered(dir: &Path) -> Result<Vec<String>> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot list {}", dir.display()))?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.') && n != MANIFEST_FILE)
        .collect();
    names.sort();
    Ok(names)
}

/// Write `dir`'s manifest for the files it holds now (after a file was
/// added: `threshold.json`).
pub fn write_manifest(dir: &Path) -> Result<()> {
    let mut m = Manifest::default();
    for name in covered(dir)? {
        let d = digest(&dir.join(&name))?;
        m.files.insert(name, d);
    }
    let json = serde_json::to_vec_pretty(&m).context("serialising the checkpoint manifest")?;
    crate::data::write_atomic(&dir.join(MANIFEST_FILE), &json)
}

/// Refuse (exit 3, naming the file) a checkpoint directory whose files
/// differ from its manifest: one changed, missing, added or cut; and, for a
/// run's `checkpoint/`, one whose [`sha256`] differs from the
/// `checkpoint_sha256` the run's `run.json` records. A checkpoint with
/// neither (written before manifests) is not judged. `again` says what to
/// do about it ("run `ncclean fit` again").
pub fn verify(dir: &Path, again: &str) -> Result<()> {
    let manifest_path = dir.join(MANIFEST_FILE);
    let changed = |name: &str, what: String| {
        invalid(format!(
            "{}: {what}; the checkpoint was changed or damaged after it was written, so its \
             labels would differ without a word: restore the checkpoint, or {again}",
            dir.join(name).display()
        ))
    };
    if manifest_path.is_file() {
        let bytes = small_file::read(
            &manifest_path,
            small_file::RUN_FILE_LIMIT,
            "checkpoint manifest",
        )?;
        let m: Manifest = serde_json::from_slice(&bytes).map_err(|e| {
            changed(
                MANIFEST_FILE,
                format!("not a valid checkpoint manifest ({e})"),
            )
        })?;
        let present = covered(dir)?;
        if let Some(extra) = present.iter().find(|n| !m.files.contains_key(*n)) {
            return Err(changed(
                extra,
                "is not one of the files the checkpoint was written with".into(),
            ));
        }
        for (name, want) in &m.files {
            let p = dir.join(name);
            if !present.contains(name) {
                return Err(changed(name, "is missing".into()));
            }
            let got = digest(&p)?;
            if got.bytes != want.bytes {
                return Err(changed(
                    name,
                    format!("holds {} bytes, {} when written", got.bytes, want.bytes),
                ));
            }
            if got.sha256 != want.sha256 {
                return Err(changed(
                    name,
                    format!(
                        "its content differs from when it was written (sha256 {}, {} then)",
                        &got.sha256[..16],
                        &want.sha256[..16.min(want.sha256.len())]
                    ),
                ));
            }
        }
    }
    verify_against_run(dir, again)
}

/// For `RUN/checkpoint`: compare its [`sha256`] with `RUN/run.json`'s
/// `checkpoint_sha256`, where there is one.
fn verify_against_run(dir: &Path, again: &str) -> Result<()> {
    let Some(run) = dir
        .parent()
        .filter(|_| dir.file_name() == Some(std::ffi::OsStr::new("checkpoint")))
    else {
        return Ok(());
    };
    let run_json = run.join("run.json");
    if !run_json.is_file() {
        return Ok(());
    }
    let bytes = small_file::read(&run_json, small_file::RUN_FILE_LIMIT, "run file")?;
    let recorded = serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .and_then(|v| v["checkpoint_sha256"].as_str().map(str::to_string));
    let Some(recorded) = recorded else {
        return Ok(());
    };
    let now = sha256(dir)?;
    if now != recorded {
        return Err(invalid(format!(
            "{}: its content (sha256 {}) differs from the checkpoint_sha256 that {} records \
             ({}): the checkpoint was changed or damaged after fit, so its labels would differ \
             without a word; restore it, or {again}",
            dir.display(),
            &now[..16],
            run_json.display(),
            &recorded[..16.min(recorded.len())]
        )));
    }
    Ok(())
}

/// Write a checkpoint for `pipeline` into `dir` (replacing it atomically).
pub fn save(dir: &Path, state: &CheckpointState, pipeline: &mut dyn Pipeline) -> Result<()> {
    save_with(dir, state, pipeline, None)
}

/// Write an epoch checkpoint that training can resume from: a checkpoint
/// plus the optimiser moments (`optimizer.safetensors`) and `resume.json`.
pub fn save_resume(
    dir: &Path,
    state: &CheckpointState,
    pipeline: &mut dyn Pipeline,
    info: &ResumeInfo,
) -> Result<()> {
    save_with(dir, state, pipeline, Some(info))
}

/// The epoch checkpoint in `dir`, if one is there.
pub fn read_resume(dir: &Path) -> Result<Option<(CheckpointState, ResumeInfo)>> {
    let p = dir.join("resume.json");
    if !p.is_file() {
        return Ok(None);
    }
    verify(
        dir,
        "drop --resume to train from the first epoch (it is replaced)",
    )?;
    let bytes = small_file::read(&p, small_file::RUN_FILE_LIMIT, "epoch checkpoint")?;
    let info: ResumeInfo = serde_json::from_slice(&bytes).map_err(|e| {
        invalid(format!(
            "{}: not a valid ncclean epoch checkpoint: {e}",
            p.display()
        ))
    })?;
    Ok(Some((read_state(dir)?, info)))
}

/// Load weights, per-pair state and optimiser moments of the epoch
/// checkpoint in `dir` into a freshly built pipeline.
pub fn load_resume(dir: &Path, state: &CheckpointState, pipeline: &mut dyn Pipeline) -> Result<()> {
    load_into(dir, state, pipeline)?;
    let p = dir.join("optimizer.safetensors");
    let tensors = candle_core::safetensors::load(&p, &Device::Cpu)
        .map_err(|e| invalid(format!("{}: cannot load optimiser state: {e}", p.display())))?;
    pipeline
        .load_optimizer_state(&tensors)
        .map_err(|e| pipeline_at(dir, e))
}

fn save_with(
    dir: &Path,
    state: &CheckpointState,
    pipeline: &mut dyn Pipeline,
    resume: Option<&ResumeInfo>,
) -> Result<()> {
    let parent = dir.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent)
        .with_context(|| format!("cannot create {}", parent.display()))?;
    temp::sweep(dir)?;
    let tmp = temp::name(dir, temp::Kind::Tmp);
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp)
            .with_context(|| format!("cannot remove {}", tmp.display()))?;
    }
    std::fs::create_dir_all(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    let written = (|| -> Result<()> {
        for (name, vm) in pipeline.weights() {
            let p = tmp.join(format!("{name}.safetensors"));
            vm.save(&p)
                .with_context(|| format!("cannot write {}", p.display()))?;
        }
        let mut pairs: HashMap<String, Tensor> = HashMap::new();
        for (name, v) in pipeline.pair_state() {
            let n = v.len();
            let t = Tensor::from_vec(v, n, &Device::Cpu).context("per-pair state")?;
            pairs.insert(name, t);
        }
        if !pairs.is_empty() {
            let p = tmp.join("pairs.safetensors");
            candle_core::safetensors::save(&pairs, &p)
                .with_context(|| format!("cannot write {}", p.display()))?;
        }
        if let Some(info) = resume {
            let tensors: HashMap<String, Tensor> = pipeline.optimizer_state().into_iter().collect();
            let p = tmp.join("optimizer.safetensors");
            candle_core::safetensors::save(&tensors, &p)
                .with_context(|| format!("cannot write {}", p.display()))?;
            let json = serde_json::to_vec_pretty(info).context("serialising resume.json")?;
            std::fs::write(tmp.join("resume.json"), json).context("writing resume.json")?;
        }
        let json = serde_json::to_vec_pretty(state).context("serialising checkpoint state")?;
        std::fs::write(tmp.join("state.json"), json).context("writing state.json")?;
        write_manifest(&tmp)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    temp::replace_dir(&tmp, dir)
}

/// Accept either a run directory or its `checkpoint/` directory.
pub fn locate(path: &Path) -> Result<PathBuf> {
    let candidates = [path.join("checkpoint"), path.to_path_buf()];
    for c in candidates {
        if c.join("state.json").is_file() {
            return Ok(c);
        }
    }
    Err(invalid(format!(
        "{}: no checkpoint found (expected {}/checkpoint/state.json); pass the --out-dir of `ncclean fit`",
        path.display(),
        path.display()
    )))
}

/// Read the state of the checkpoint in `dir`.
pub fn read_state(dir: &Path) -> Result<CheckpointState> {
    let p = dir.join("state.json");
    let bytes = small_file::read(&p, small_file::RUN_FILE_LIMIT, "checkpoint state")?;
    let mut state: CheckpointState = serde_json::from_slice(&bytes).map_err(|e| {
        invalid(format!(
            "{}: not a valid ncclean checkpoint state: {e}",
            p.display()
        ))
    })?;
    if state.format_version != FORMAT_VERSION {
        return Err(invalid(format!(
            "{}: checkpoint format {} is not supported by this ncclean (format {FORMAT_VERSION}); run `ncclean fit` again to make a checkpoint this version reads",
            p.display(),
            state.format_version
        )));
    }
    if let Some(v) = state.vocab.as_mut() {
        v.reindex();
    }
    Ok(state)
}

/// Load weights and per-pair state from `dir` into a freshly built pipeline.
pub fn load_into(dir: &Path, state: &CheckpointState, pipeline: &mut dyn Pipeline) -> Result<()> {
    for (name, vm) in pipeline.weights_mut() {
        let p = dir.join(format!("{name}.safetensors"));
        vm.load(&p)
            .map_err(|e| invalid(format!("{}: cannot load weights: {e}", p.display())))?;
    }
    let mut pairs = Vec::new();
    let p = dir.join("pairs.safetensors");
    if p.is_file() {
        let tensors = candle_core::safetensors::load(&p, &Device::Cpu)
            .map_err(|e| invalid(format!("{}: cannot load per-pair state: {e}", p.display())))?;
        let mut names: Vec<_> = tensors.keys().cloned().collect();
        names.sort();
        for name in names {
            let v: Vec<f32> = tensors[&name].to_vec1().context("per-pair state")?;
            pairs.push((name, v));
        }
    }
    pipeline
        .load_state(&state.pipeline, pairs)
        .map_err(|e| pipeline_at(dir, e))?;
    Ok(())
}

/// sha256 over every file of the checkpoint, in name order.
pub fn sha256(dir: &Path) -> Result<String> {
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot list {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    names.sort();
    let mut h = Sha256::new();
    for p in names {
        h.update(
            p.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
                .as_bytes(),
        );
        // Streamed: weights are hashed without holding them.
        std::fs::File::open(&p)
            .and_then(|mut f| std::io::copy(&mut f, &mut h))
            .with_context(|| format!("cannot read {}", p.display()))?;
    }
    Ok(hex(&h.finalize()))
}

/// The threshold record's file in a checkpoint directory, covered by the
/// manifest like every other checkpoint file.
impl Record {
    /// Write into the checkpoint directory `dir` (atomically).
    pub fn save(&self, dir: &Path) -> Result<()> {
        let json = serde_json::to_vec_pretty(self).context("serialising the threshold record")?;
        crate::data::write_atomic(&dir.join(RECORD_FILE), &json)?;
        // The manifest covers the record too: an edited cut is refused.
        write_manifest(dir)
    }

    /// The record in the checkpoint directory `dir`; `None` for a
    /// checkpoint written before records existed.
    pub fn load(dir: &Path) -> Result<Option<Record>> {
        let p = dir.join(RECORD_FILE);
        if !p.is_file() {
            return Ok(None);
        }
        let bytes = small_file::read(&p, small_file::RUN_FILE_LIMIT, "threshold record")?;
        let r: Record = serde_json::from_slice(&bytes).map_err(|e| {
            invalid(format!(
                "{}: not a valid ncclean threshold record ({e}); run `ncclean fit` again",
                p.display()
            ))
        })?;
        r.cut
            .rule
            .validate()
            .map_err(|e| invalid(format!("{}: {e}; run `ncclean fit` again", p.display())))?;
        // A cut outside [0, 1] keeps every pair or none whatever the model
        // says (KEEP_NONE is the one deliberate value above 1).
        let m = r.cut.min_prob;
        if !(m.is_finite() && ((0.0..=1.0).contains(&m) || m == KEEP_NONE)) {
            return Err(invalid(format!(
                "{}: min_prob {m} is not a cut (clean_prob lies in [0, 1]); run `ncclean fit` again",
                p.display()
            )));
        }
        if let Some(s) = r.cut.min_similarity.filter(|s| !s.is_finite()) {
            return Err(invalid(format!(
                "{}: min_similarity {s} is not a number a similarity can reach; run `ncclean fit` again",
                p.display()
            )));
        }
        Ok(Some(r))
    }
}
