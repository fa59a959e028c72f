//! The [`Engine`]: a trained pipeline rebuilt from its checkpoint. It
//! prepares data the way the checkpoint's towers expect, embeds it for
//! retrieval and scores it; `fit` scores its own training pairs through it
//! too, so `fit` and `score` share one scoring path.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use candle_core::Device;
use ncclean_models::ImageTowerConfig;
use ncclean_pipelines::division::Division;
use ncclean_pipelines::{PairScores, Pipeline};

use super::labels::{config_hash, label_rows};
use super::prepare::{prepare_for, Prepared, PreparedRun};
use crate::checkpoint::{self, CheckpointState};
use crate::data::{ImageKind, InputSet, LabelRow};
use crate::encoders::ImageEncoder;
use crate::error::{invalid, pipeline_at, Error, Result};
use crate::features::CacheOptions;
use crate::progress::Reporter;

/// A trained pipeline rebuilt from a checkpoint.
pub struct Engine {
    /// The checkpoint's state.
    pub state: CheckpointState,
    /// Directory the checkpoint was read from.
    pub dir: PathBuf,
    pipeline: Box<dyn Pipeline>,
    device: Device,
}

/// Per-pair labels and what produced them.
#[derive(Debug, Clone)]
pub struct Scored {
    /// One label row per input row.
    pub labels: Vec<LabelRow>,
    /// Parquet metadata for the labels file.
    pub metadata: BTreeMap<String, String>,
    /// Pairs scored (usable rows).
    pub pairs: usize,
    /// Seconds spent scoring (model passes and mixture).
    pub seconds: f64,
    /// Fraction of usable pairs called noisy.
    pub estimated_noise_rate: f64,
}

impl Engine {
    /// Load the checkpoint in `path` (a run directory or its `checkpoint/`).
    pub fn load(path: &Path, device: &Device) -> Result<Engine> {
        let dir = checkpoint::locate(path)?;
        let state = checkpoint::read_state(&dir)?;
        let mut pipeline = ncclean_pipelines::build(
            &state.method,
            state.config.clone(),
            &state.model,
            state.seed,
            device,
        )
        .map_err(|e| pipeline_at(&dir, e))?;
        checkpoint::load_into(&dir, &state, pipeline.as_mut())?;
        Ok(Engine {
            state,
            dir,
            pipeline,
            device: device.clone(),
        })
    }

    /// The trained pipeline.
    pub(super) fn pipeline(&self) -> &dyn Pipeline {
        self.pipeline.as_ref()
    }

    /// The device the pipeline runs on.
    pub(super) fn device(&self) -> &Device {
        &self.device
    }

    /// Refuse `input` when it is laid out unlike the training data.
    pub(super) fn check_input(&self, input: &InputSet) -> Result<()> {
        check_compatible(input, &self.state)
    }

    /// A scoring failure in words: the model's runtime error, or what is
    /// wrong with the checkpoint.
    pub(super) fn scoring_error(&self, e: ncclean_pipelines::Error) -> Error {
        match e {
            ncclean_pipelines::Error::Runtime(e) => {
                Error::Other(anyhow::Error::new(e).context("scoring failed"))
            }
            other => pipeline_at(&self.dir, other),
        }
    }

    /// Read and decode `input` the way this checkpoint's towers expect.
    pub fn prepare(
        &self,
        input: &InputSet,
        cache: &CacheOptions,
        rep: &Reporter,
    ) -> Result<Prepared> {
        check_compatible(input, &self.state)?;
        let run = prepare_for(
            input,
            &self.state.encoders,
            &self.state.config,
            self.state.model.head.local,
            self.state.vocab.as_ref(),
            cache,
            &self.device,
            rep,
        )?;
        self.check_features(input, &run)?;
        Ok(run.prepared)
    }

    /// Refuse prepared inputs whose image features are not the checkpoint's.
    pub(super) fn check_features(&self, input: &InputSet, run: &PreparedRun) -> Result<()> {
        if run.image != self.state.model.image {
            return Err(invalid(format!(
                "{}: the image features ({:?}) do not match the checkpoint's ({:?})",
                input.display_name(0),
                run.image,
                self.state.model.image
            )));
        }
        Ok(())
    }

    /// Joint-space similarity matrix `images × captions` of the usable pairs
    /// (co-taught networks averaged), for retrieval.
    pub fn similarity_matrix(
        &self,
        prepared: &Prepared,
        images: &[usize],
        captions: &[usize],
    ) -> Result<Vec<f32>> {
        let per_net = self
            .pipeline
            .embed(&prepared.inputs)
            .context("embedding pairs")?;
        let mut acc: Option<candle_core::Tensor> = None;
        let to_ids = |v: &[usize]| {
            candle_core::Tensor::from_vec(
                v.iter().map(|&i| i as u32).collect::<Vec<_>>(),
                v.len(),
                &self.device,
            )
        };
        let (ii, cc) = (
            to_ids(images).context("index")?,
            to_ids(captions).context("index")?,
        );
        for (vi, vt) in &per_net {
            let s = vi
                .index_select(&ii, 0)
                .and_then(|a| a.matmul(&vt.index_select(&cc, 0)?.t()?))
                .context("similarity")?;
            acc = Some(match acc {
                Some(a) => (a + s).context("similarity")?,
                None => s,
            });
        }
        let s = acc.ok_or_else(|| anyhow::anyhow!("pipeline returned no embeddings"))?;
        let s = (s / per_net.len() as f64).context("similarity")?;
        Ok(s.flatten_all()
            .and_then(|t| t.to_vec1())
            .context("similarity")?)
    }

    /// Score prepared pairs: the one scoring path of `fit` and `score`.
    pub fn score(
        &self,
        input: &InputSet,
        prepared: &Prepared,
        refit: bool,
        rep: &Reporter,
    ) -> Result<Scored> {
        let rows = self.score_rows(input, prepared, refit, rep)?;
        let metadata = self.metadata(&LabelsSummary {
            refit,
            input_fingerprint: input.fingerprint()?,
            rows: rows.labels.len(),
            skipped: prepared.skipped(),
            estimated_noise_rate: rows.estimated_noise_rate,
        })?;
        Ok(Scored { metadata, ..rows })
    }

    /// [`Engine::score`] without the labels' metadata (which reads every
    /// input byte for the fingerprint): for callers that score an input in
    /// pieces and describe the whole once ([`Engine::metadata`]).
    pub fn score_rows(
        &self,
        input: &InputSet,
        prepared: &Prepared,
        refit: bool,
        rep: &Reporter,
    ) -> Result<Scored> {
        let started = Instant::now();
        let scores = if prepared.ok.is_empty() {
            PairScores::default()
        } else {
            let mut obs = rep.observer();
            self.pipeline
                .score(
                    &prepared.inputs,
                    &prepared.shard_sizes(input.files.len()),
                    refit,
                    &mut obs,
                )
                .map_err(|e| self.scoring_error(e))?
        };
        let seconds = started.elapsed().as_secs_f64();
        let labels = label_rows(input, prepared, &scores, self.state.config.threshold);
        Ok(Scored {
            labels,
            metadata: BTreeMap::new(),
            pairs: prepared.ok.len(),
            seconds,
            estimated_noise_rate: Division::estimated_noise_rate(&scores.clean_prob),
        })
    }

    /// Parquet key–value metadata of a labels file this engine scored.
    pub fn metadata(&self, s: &LabelsSummary) -> Result<BTreeMap<String, String>> {
        let threshold = self.state.config.threshold;
        let mut metadata = BTreeMap::new();
        let put = |m: &mut BTreeMap<String, String>, k: &str, v: String| {
            m.insert(format!("ncclean.{k}"), v);
        };
        put(
            &mut metadata,
            "version",
            env!("CARGO_PKG_VERSION").to_string(),
        );
        put(&mut metadata, "method", self.state.method.clone());
        put(&mut metadata, "preset", self.state.method.clone());
        put(
            &mut metadata,
            "config_hash",
            config_hash(&self.state.config),
        );
        put(
            &mut metadata,
            "checkpoint_sha256",
            checkpoint::sha256(&self.dir)?,
        );
        put(&mut metadata, "seed", self.state.seed.to_string());
        put(&mut metadata, "threshold", threshold.to_string());
        put(
            &mut metadata,
            "threshold_rule",
            format!("is_clean = clean_prob > {threshold} (the method's own division)"),
        );
        put(
            &mut metadata,
            "division",
            if s.refit {
                "refitted on the scored data"
            } else {
                "mixture from the checkpoint"
            }
            .to_string(),
        );
        let statistic = self.state.pipeline["division_statistic"]
            .as_str()
            .unwrap_or("see the method's documentation")
            .to_string();
        put(&mut metadata, "division_statistic", statistic);
        put(
            &mut metadata,
            "score_blocks",
            format!(
                "in-batch statistics within blocks of at most {} pairs of each input file",
                ncclean_pipelines::scoring::SCORE_BLOCK_PAIRS.max(self.state.config.batch_size)
            ),
        );
        if let Some(f) = self
            .state
            .pipeline
            .pointer("/division/fallback")
            .filter(|f| !f.is_null())
        {
            put(&mut metadata, "division_fallback", f.to_string());
        }
        put(
            &mut metadata,
            "estimated_noise_rate",
            format!("{:.6}", s.estimated_noise_rate),
        );
        put(
            &mut metadata,
            "input_fingerprint",
            s.input_fingerprint.clone(),
        );
        put(&mut metadata, "rows", s.rows.to_string());
        put(&mut metadata, "skipped", s.skipped.to_string());
        Ok(metadata)
    }
}

/// What a labels file's metadata says about the scored input as a whole.
#[derive(Debug, Clone)]
pub struct LabelsSummary {
    /// The mixture was refitted on the scored data.
    pub refit: bool,
    /// [`InputSet::fingerprint`] of the whole input.
    pub input_fingerprint: String,
    /// Input rows.
    pub rows: usize,
    /// Rows that could not be used.
    pub skipped: usize,
    /// Fraction of usable pairs called noisy.
    pub estimated_noise_rate: f64,
}

fn check_compatible(input: &InputSet, state: &CheckpointState) -> Result<()> {
    let want_embedding = state.encoders.image == ImageEncoder::Precomputed;
    let have_embedding = input.columns.image_kind == ImageKind::Embedding;
    if want_embedding != have_embedding {
        return Err(invalid(format!(
            "{}: image column {:?} holds {}, but the checkpoint was trained on {}; score data laid out like the training data",
            input.display_name(0),
            input.columns.image,
            if have_embedding { "embeddings" } else { "images" },
            if want_embedding { "precomputed embeddings" } else { "images" },
        )));
    }
    if let (ImageTowerConfig::Precomputed { dim, .. }, Some(have), true) =
        (&state.model.image, input.embedding_dim, want_embedding)
    {
        if *dim != have {
            return Err(invalid(format!(
                "{}: embeddings in column {:?} have {have} values, the checkpoint expects {dim}",
                input.display_name(0),
                input.columns.image
            )));
        }
    }
    Ok(())
}
