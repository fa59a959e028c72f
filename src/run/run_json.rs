//! `run.json`: what `fit` records about a complete run, written last (its
//! presence and `complete: true` say every other output is in place), and
//! read back by `report`, by `score` and `report` without DATA (the
//! recorded inputs), and by `fit` to say which run an `--out-dir` holds.
//!
//! Every field is optional when read: a run of an older ncclean, or one
//! edited by hand, lacks some or holds them in another shape, and such a
//! field reads as `None` (or `false`, or empty) instead of failing the file.
//! Written, the keys come out sorted, as they always have.

use std::path::{Path, PathBuf};

use ncclean_models::ModelConfig;
use ncclean_pipelines::TrainConfig;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};

use crate::curation::threshold::Cut;
use crate::data::images::ImageLimits;
use crate::data::sample::SampleInfo;
use crate::data::ColumnMap;
use crate::error::Result;
use crate::run::inputs::RunInputs;
use crate::towers::encoders::EncoderSpec;

/// The file name of run.json in a run directory.
pub const FILE: &str = "run.json";

/// run.json, field by field (see the module documentation).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunJson {
    /// The ncclean version that fitted the run.
    #[serde(default, deserialize_with = "lenient")]
    pub ncclean_version: Option<String>,
    /// What identifies that build ([`crate::runtime::build_info`]).
    #[serde(default, deserialize_with = "lenient")]
    pub ncclean_build: Option<serde_json::Value>,
    /// Method name.
    #[serde(default, deserialize_with = "lenient")]
    pub method: Option<String>,
    /// Seed of the fit.
    #[serde(default, deserialize_with = "lenient")]
    pub seed: Option<u64>,
    /// The resolved training configuration.
    #[serde(default, deserialize_with = "lenient")]
    pub config: Option<TrainConfig>,
    /// Hash of the configuration (`engine::labels::config_hash`).
    #[serde(default, deserialize_with = "lenient")]
    pub config_hash: Option<String>,
    /// The model's shapes.
    #[serde(default, deserialize_with = "lenient")]
    pub model: Option<ModelConfig>,
    /// The towers.
    #[serde(default, deserialize_with = "lenient")]
    pub encoders: Option<EncoderSpec>,
    /// The columns the input was read with.
    #[serde(default, deserialize_with = "lenient")]
    pub columns: Option<ColumnMap>,
    /// `--image-root`, as given.
    #[serde(default, deserialize_with = "lenient")]
    pub image_root: Option<PathBuf>,
    /// The limits images were read within.
    #[serde(default, deserialize_with = "lenient")]
    pub image_limits: Option<ImageLimits>,
    /// The input files as typed, relative to where `fit` ran.
    #[serde(default, deserialize_with = "lenient")]
    pub inputs: Option<Vec<String>>,
    /// Where the training data lives and how it was read (absolute).
    #[serde(default, deserialize_with = "lenient")]
    pub input_files: Option<RunInputs>,
    /// The content fingerprint of the training data.
    #[serde(default, deserialize_with = "lenient")]
    pub input_fingerprint: Option<String>,
    /// sha256 of the checkpoint's manifest.
    #[serde(default, deserialize_with = "lenient")]
    pub checkpoint_sha256: Option<String>,
    /// The output cut (since threshold rules; older runs labelled at the
    /// configuration's `threshold`).
    #[serde(default, deserialize_with = "lenient")]
    pub threshold: Option<Cut>,
    /// The rows trained on when `--sample` drew some.
    #[serde(default, deserialize_with = "lenient")]
    pub sample: Option<SampleInfo>,
    /// The device, as candle names it.
    #[serde(default, deserialize_with = "lenient")]
    pub device: Option<String>,
    /// The command line of the fit.
    #[serde(default, deserialize_with = "lenient")]
    pub command: Option<Vec<String>>,
    /// The run was committed whole.
    #[serde(default, deserialize_with = "lenient_bool")]
    pub complete: bool,
}

impl RunJson {
    /// Read `path` (at most [`crate::runtime::small_file::RUN_FILE_LIMIT`]
    /// bytes); errors only when it cannot be read or is not JSON.
    pub fn read(path: &Path) -> Result<RunJson> {
        let value = crate::run::dir::read_json(path)?;
        // Only an object has fields (serde would read an array's items in
        // field order).
        if !value.is_object() {
            return Ok(RunJson::default());
        }
        Ok(serde_json::from_value(value).unwrap_or_default())
    }

    /// The run.json of the run directory `dir`, when it has a readable one.
    pub fn of_dir(dir: &Path) -> Option<RunJson> {
        RunJson::read(&dir.join(FILE)).ok()
    }

    /// The file's bytes: pretty JSON with sorted keys.
    pub fn to_vec_pretty(&self) -> Result<Vec<u8>> {
        // Through a `Value`, whose maps sort their keys: the order run.json
        // has always had.
        let value = serde_json::to_value(self).map_err(anyhow::Error::from)?;
        Ok(serde_json::to_vec_pretty(&value).map_err(anyhow::Error::from)?)
    }
}

/// A field of another shape reads as `None`.
fn lenient<'de, D, T>(d: D) -> std::result::Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned,
{
    let v = serde_json::Value::deserialize(d)?;
    Ok(serde_json::from_value(v).ok())
}

/// `true` only for a JSON `true`.
fn lenient_bool<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<bool, D::Error> {
    Ok(serde_json::Value::deserialize(d)? == serde_json::Value::Bool(true))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run.json as `fit` writes it today (the demo, vanilla), less the
    /// long `command`.
    const CURRENT: &str = r#"{
  "checkpoint_sha256": "8616f878bb7ce1b5508eded60fe9053fcf006e490330b82448ea023ba907b06d",
  "columns": {
    "caption": "caption",
    "image": "image",
    "image_kind": "bytes",
    "key": "key"
  },
  "command": [
    "ncclean",
    "fit"
  ],
  "complete": true,
  "config": {
    "batch_size": 128,
    "caption_null": true,
    "clean_prob": "reference",
    "cnn_width": 16,
    "division_shuffles": 3,
    "epochs": 10,
    "grad_clip": 2.0,
    "head": "mean",
    "hidden": 256,
    "image_size": 32,
    "joint_dim": 128,
    "lr": 0.003,
    "lr_decay": 0.1,
    "lr_decay_epochs": [
      3
    ],
    "margin": 0.2,
    "mixture": "gmm",
    "params": {},
    "reference_images": 8192,
    "reference_neighbours": 20,
    "soft_margin_m": 10.0,
    "threshold": 0.5,
    "unit_inputs": false,
    "warmup_epochs": 3,
    "word_dim": 64
  },
  "config_hash": "6f35a8d902066b0f",
  "device": "Cpu",
  "encoders": {
    "image": "demo-cnn",
    "image_model": null,
    "text": "demo-bow",
    "text_model": null
  },
  "image_limits": {
    "allow_absolute_paths": false,
    "max_bytes": 67108864,
    "max_pixels": 50000000
  },
  "image_root": null,
  "input_files": {
    "caption_from": null,
    "files": [
      "/tmp/work/noisy.parquet"
    ],
    "image_root": null,
    "key_from": null
  },
  "input_fingerprint": "a78b0039bba4936e8df2661471e3f577d7456cec8bfb3faf4f1fd1fa37c67751",
  "inputs": [
    "/tmp/work/noisy.parquet"
  ],
  "method": "vanilla",
  "model": {
    "head": {
      "local": false,
      "pooling": "mean",
      "unit_inputs": false
    },
    "hidden": 256,
    "image": {
      "image_size": 32,
      "kind": "demo_cnn",
      "width": 16
    },
    "joint_dim": 128,
    "text": {
      "dim": 64,
      "kind": "demo_bow",
      "vocab_size": 32
    }
  },
  "ncclean_build": {
    "commit": "4231a4380447",
    "features": [],
    "profile": "debug",
    "target": "x86_64-unknown-linux-gnu",
    "version": "0.1.0"
  },
  "ncclean_version": "0.1.0",
  "sample": null,
  "seed": 3,
  "threshold": {
    "estimated_noise_rate": 0.2911064157639655,
    "expected_noise_removed": 0.8488037429086424,
    "expected_precision": 0.9384846953476,
    "kept": 1431,
    "min_prob": 0.5,
    "rule": {
      "rule": "min_prob",
      "value": 0.5
    },
    "scored": 2000,
    "tied_at_cut": 0
  }
}"#;

    #[test]
    fn a_current_run_json_round_trips_byte_for_byte() {
        let run: RunJson = serde_json::from_str(CURRENT).unwrap();
        assert!(run.complete);
        assert_eq!(run.method.as_deref(), Some("vanilla"));
        assert_eq!(run.seed, Some(3));
        assert_eq!(run.threshold.unwrap().min_prob, 0.5);
        assert_eq!(run.config.as_ref().unwrap().threshold, 0.5);
        assert!(run.model.is_some() && run.encoders.is_some() && run.columns.is_some());
        assert_eq!(run.input_files.as_ref().unwrap().files.len(), 1);
        assert_eq!(
            String::from_utf8(run.to_vec_pretty().unwrap()).unwrap(),
            CURRENT
        );
    }

    #[test]
    fn an_old_minimal_run_json_loads_with_what_it_has() {
        let run: RunJson = serde_json::from_str(
            r#"{"method": "esc", "seed": "not a number", "inputs": ["a.parquet"],
                "config": {"threshold": 0.4}, "complete": true, "extra": 1}"#,
        )
        .unwrap();
        assert_eq!(run.method.as_deref(), Some("esc"));
        assert_eq!(run.seed, None, "a misshapen field reads as None");
        assert_eq!(run.inputs, Some(vec!["a.parquet".to_string()]));
        assert!(run.complete);
        assert_eq!(run.threshold, None);
        assert_eq!(run.input_files, None);
        let empty: RunJson = serde_json::from_str("{}").unwrap();
        assert_eq!(empty, RunJson::default());
        assert!(!empty.complete);
    }

    #[test]
    fn a_file_that_is_not_an_object_reads_as_empty() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join(FILE);
        std::fs::write(&path, "[1, 2]").unwrap();
        assert_eq!(RunJson::read(&path).unwrap(), RunJson::default());
        std::fs::write(&path, "{").unwrap();
        assert!(RunJson::read(&path).is_err());
        assert_eq!(RunJson::of_dir(tmp.path().join("absent").as_path()), None);
    }
}
