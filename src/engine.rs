//! The engine: one code path from parquet rows to trained pipelines and
//! per-pair labels, shared by `fit` and `score`.
//!
//! `fit` prepares inputs, trains, writes a checkpoint, reloads it as an
//! [`Engine`] and scores its own training pairs with [`Engine::score`], the
//! same function `ncclean score` calls, so both agree exactly.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use candle_core::Device;
use ncclean_models::preprocess::decode_rgb_square;
use ncclean_models::vocab::Vocab;
use ncclean_models::{
    ImageInputs, ImageTowerConfig, LocalFeatures, PairInputs, TextInputs, TextTowerConfig,
};
use ncclean_pipelines::division::Division;
use ncclean_pipelines::{EpochStats, Observer, PairScores, Pipeline, TrainConfig};
use serde::Serialize;

use crate::checkpoint::{self, CheckpointState};
use crate::data::{self, ImageKind, ImageValue, InputSet, LabelRow, RowStatus};
use crate::encoders::{EncoderSpec, ImageEncoder, ImageTower, TextTower};
use crate::error::{invalid, Error, Result};
use crate::features::{self, CacheOptions};
use crate::progress::Reporter;

/// Rows read per batch from parquet: bounds the memory of raw image bytes.
pub const READ_BATCH_ROWS: usize = 256;
/// Vocabulary limits of the demo text tower.
const VOCAB_MIN_COUNT: usize = 1;
const VOCAB_MAX_SIZE: usize = 30_000;
const VOCAB_MAX_LEN: usize = 48;

/// Where a prepared pair came from, and why it is unusable if it is.
#[derive(Debug, Clone)]
pub struct RowRecord {
    /// Key as carried through from the input.
    pub key: String,
    /// Index of the input file.
    pub file: usize,
    /// Row inside that file.
    pub row: usize,
    /// Why the row was skipped; `None` for usable rows.
    pub error: Option<String>,
}

/// Every input row, and encoder inputs for the usable ones.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// One record per input row, in input order.
    pub rows: Vec<RowRecord>,
    /// Indices into `rows` of the usable pairs, aligned with `inputs`.
    pub ok: Vec<usize>,
    /// Encoder inputs of the usable pairs.
    pub inputs: PairInputs,
    /// Identity of each usable pair's image (a hash of its bytes), aligned
    /// with `ok`: retrieval groups the captions of one image by it.
    pub image_ids: Vec<u64>,
}

impl Prepared {
    /// Number of skipped rows.
    pub fn skipped(&self) -> usize {
        self.rows.len() - self.ok.len()
    }
}

/// How images must be turned into tower inputs.
#[derive(Debug, Clone, Copy)]
enum ImageSpec {
    Pixels { size: usize },
    Embedding { dim: usize },
}

fn image_spec(tower: &ImageTowerConfig) -> ImageSpec {
    match tower {
        ImageTowerConfig::DemoCnn { image_size, .. } => ImageSpec::Pixels { size: *image_size },
        ImageTowerConfig::Precomputed { dim, .. } => ImageSpec::Embedding { dim: *dim },
    }
}

/// Decode one image value into tower input, or say why it cannot be used.
fn decode_image(value: &ImageValue, spec: ImageSpec) -> std::result::Result<ImageOut, String> {
    match (value, spec) {
        (ImageValue::Bytes(b), ImageSpec::Pixels { size }) => {
            decode_rgb_square(b, size as u32).map(ImageOut::Pixels)
        }
        (ImageValue::Path(p), ImageSpec::Pixels { size }) => {
            let bytes = std::fs::read(p)
                .map_err(|e| format!("cannot read image file {}: {e}", p.display()))?;
            decode_rgb_square(&bytes, size as u32)
                .map(ImageOut::Pixels)
                .map_err(|e| format!("{}: {e}", p.display()))
        }
        (ImageValue::Embedding(v), ImageSpec::Embedding { dim }) => {
            if v.len() != dim {
                Err(format!(
                    "embedding has {} values, the model expects {dim}",
                    v.len()
                ))
            } else {
                Ok(ImageOut::Embedding(v.clone()))
            }
        }
        (ImageValue::Embedding(_), ImageSpec::Pixels { .. }) => {
            Err("row holds an embedding but the model expects image pixels".into())
        }
        (_, ImageSpec::Embedding { .. }) => {
            Err("row holds an image but the model expects a precomputed embedding".into())
        }
    }
}

enum ImageOut {
    Pixels(Vec<u8>),
    Embedding(Vec<f32>),
}

/// Decode a batch of images on all cores, preserving order.
fn decode_parallel(
    values: &[Option<&ImageValue>],
    spec: ImageSpec,
) -> Vec<std::result::Result<ImageOut, String>> {
    crate::parallel::parallel_map(values, |v| match v {
        // A decoder bug on one malformed image must not end the whole run.
        Some(v) => std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| decode_image(v, spec)))
            .unwrap_or_else(|_| Err("the image decoder crashed on this image".to_string())),
        None => Err("no image".to_string()),
    })
}

/// A 64-bit identity of an image value (FNV-1a over its bytes, path or
/// embedding bits), so identical images share an id.
pub fn image_identity(v: &ImageValue) -> u64 {
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    let mut eat = |b: &[u8]| {
        for &x in b {
            h ^= x as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01B3);
        }
    };
    match v {
        ImageValue::Bytes(b) => eat(b),
        ImageValue::Path(p) => eat(p.to_string_lossy().as_bytes()),
        ImageValue::Embedding(e) => {
            for x in e {
                eat(&x.to_bits().to_le_bytes());
            }
        }
    }
    h
}

/// Stream every row of `input`, decode usable images for `spec` on all
/// cores, and hand each usable (row, caption, image) to `sink`. Returns one
/// record per input row; memory is bounded by one read batch plus what the
/// sink keeps.
fn read_rows(
    input: &InputSet,
    spec: ImageSpec,
    rep: &Reporter,
    mut sink: impl FnMut(&str, ImageOut, u64),
) -> Result<Vec<RowRecord>> {
    let mut rows = Vec::with_capacity(input.num_rows());
    let mut obs = rep.observer();
    obs.start("reading", input.num_rows() as u64);
    for batch in input.pairs(READ_BATCH_ROWS) {
        let batch = batch?;
        let values: Vec<Option<&ImageValue>> = batch
            .iter()
            .map(|r| {
                if r.problem.is_none() {
                    r.image.as_ref()
                } else {
                    None
                }
            })
            .collect();
        let decoded = decode_parallel(&values, spec);
        for (r, d) in batch.iter().zip(decoded) {
            let error = match (&r.problem, d) {
                (Some(p), _) => Some(p.clone()),
                (None, Err(e)) => Some(e),
                (None, Ok(img)) => {
                    sink(
                        &r.caption,
                        img,
                        r.image.as_ref().map(image_identity).unwrap_or(0),
                    );
                    None
                }
            };
            rows.push(RowRecord {
                key: r.key.clone(),
                file: r.source_file,
                row: r.source_row,
                error,
            });
        }
        obs.advance(batch.len() as u64);
    }
    obs.finish();
    Ok(rows)
}

/// The image tower `fit` uses for `input` under `cfg`.
fn default_image_tower(input: &InputSet, cfg: &TrainConfig) -> Result<ImageTowerConfig> {
    Ok(match input.columns.image_kind {
        ImageKind::Embedding => ImageTowerConfig::Precomputed {
            dim: input
                .embedding_dim
                .ok_or_else(|| invalid("cannot tell the embedding length of the image column"))?,
            local_dim: None,
        },
        _ => ImageTowerConfig::DemoCnn {
            image_size: cfg.image_size,
            width: cfg.cnn_width,
        },
    })
}

/// Check every row the way `fit` would (decoding every image) without
/// keeping anything: the per-row usability report of `ncclean inspect`.
pub fn scan(input: &InputSet, rep: &Reporter) -> Result<Vec<RowRecord>> {
    let spec = match input.columns.image_kind {
        ImageKind::Embedding => ImageSpec::Embedding {
            dim: input.embedding_dim.unwrap_or(0),
        },
        _ => ImageSpec::Pixels { size: 8 },
    };
    read_rows(input, spec, rep, |_, _, _| {})
}

/// Read every row of `input`, decode images for `tower` (demo CNN pixels or
/// embedding columns), and tokenise
/// captions with `vocab` (built from the usable captions when `None`).
fn prepare(
    input: &InputSet,
    tower: &ImageTowerConfig,
    vocab: Option<&Vocab>,
    rep: &Reporter,
) -> Result<(Prepared, Vocab)> {
    let spec = image_spec(tower);
    let mut pixels: Vec<u8> = Vec::new();
    let mut embeddings: Vec<f32> = Vec::new();
    let mut captions: Vec<String> = Vec::new();
    let mut image_ids: Vec<u64> = Vec::new();
    let rows = read_rows(input, spec, rep, |caption, img, id| {
        captions.push(caption.to_string());
        image_ids.push(id);
        match img {
            ImageOut::Pixels(p) => pixels.extend_from_slice(&p),
            ImageOut::Embedding(e) => embeddings.extend_from_slice(&e),
        }
    })?;
    let ok: Vec<usize> = rows
        .iter()
        .enumerate()
        .filter(|(_, r)| r.error.is_none())
        .map(|(i, _)| i)
        .collect();
    let vocab = match vocab {
        Some(v) => v.clone(),
        None => Vocab::build(
            captions.iter().map(String::as_str),
            VOCAB_MIN_COUNT,
            VOCAB_MAX_SIZE,
            VOCAB_MAX_LEN,
        ),
    };
    let tokens: Vec<Vec<u32>> = captions.iter().map(|c| vocab.encode(c)).collect();
    let images = match spec {
        ImageSpec::Pixels { size } => ImageInputs::Pixels { data: pixels, size },
        ImageSpec::Embedding { dim } => ImageInputs::Embeddings {
            data: embeddings,
            dim,
            local: None,
        },
    };
    let inputs = PairInputs {
        images,
        texts: TextInputs::Tokens(tokens),
    };
    Ok((
        Prepared {
            rows,
            ok,
            inputs,
            image_ids,
        },
        vocab,
    ))
}

/// Inputs for the matching head and the tower shapes they imply.
pub struct PreparedRun {
    /// Rows and head inputs.
    pub prepared: Prepared,
    /// Image side of the model config.
    pub image: ImageTowerConfig,
    /// Text side of the model config.
    pub text: TextTowerConfig,
    /// Vocabulary of the demo text tower, when it is used.
    pub vocab: Option<Vocab>,
}

/// Read `input` and turn it into head inputs for the towers in `enc`:
/// pixels / tokens for the trainable demo towers, cached frozen features for
/// pretrained towers, embedding columns as they are. With `want_local` the
/// frozen towers' local features are loaded too (the head or the method
/// needs them); an embedding column has none, which is an error then.
#[allow(clippy::too_many_arguments)]
pub fn prepare_for(
    input: &InputSet,
    enc: &EncoderSpec,
    cfg: &TrainConfig,
    want_local: bool,
    vocab: Option<&Vocab>,
    cache: &CacheOptions,
    device: &Device,
    rep: &Reporter,
) -> Result<PreparedRun> {
    if !enc.uses_towers() {
        let image = default_image_tower(input, cfg)?;
        if want_local && matches!(image, ImageTowerConfig::Precomputed { .. }) {
            return Err(no_local_features(input));
        }
        let (prepared, vocab) = prepare(input, &image, vocab, rep)?;
        let text = TextTowerConfig::DemoBow {
            vocab_size: vocab.size(),
            dim: cfg.word_dim,
        };
        return Ok(PreparedRun {
            prepared,
            image,
            text,
            vocab: Some(vocab),
        });
    }
    if enc.image == ImageEncoder::DemoCnn {
        return Err(Error::Usage(
            "--image-encoder demo-cnn trains from pixels and cannot be combined with a pretrained text tower; \
             use mobilenet_v2, clip or precomputed"
                .into(),
        ));
    }
    let itower = ImageTower::load(enc, device)?;
    let ttower = TextTower::load(enc, device)?;
    if want_local && itower.is_none() {
        return Err(no_local_features(input));
    }
    let mut ex = features::extract(
        input,
        itower.as_ref(),
        ttower.as_ref(),
        want_local,
        cache,
        device,
        rep,
    )?;
    let image_dim = match &ex.image {
        Some(f) => f.dim,
        None => input
            .embedding_dim
            .ok_or_else(|| invalid("cannot tell the embedding length of the image column"))?,
    };
    let mut rows = Vec::with_capacity(input.num_rows());
    let mut ok = Vec::new();
    let mut image_ids = Vec::new();
    let mut images: Vec<f32> = Vec::new();
    let mut texts: Vec<f32> = Vec::new();
    let mut captions: Vec<String> = Vec::new();
    let mut obs = rep.observer();
    obs.start("reading", input.num_rows() as u64);
    let mut global_row = 0usize;
    for batch in input.pairs(READ_BATCH_ROWS) {
        let batch = batch?;
        for (k, r) in batch.iter().enumerate() {
            let row = global_row + k;
            let mut error = r.problem.clone();
            let img: Option<&[f32]> = match (&ex.image, &r.image) {
                (Some(f), _) => f.row(row),
                (None, Some(ImageValue::Embedding(e))) if e.len() == image_dim => {
                    Some(e.as_slice())
                }
                _ => None,
            };
            if error.is_none() && img.is_none() {
                error = Some(
                    ex.image
                        .as_ref()
                        .and_then(|f| f.errors.get(row).cloned().flatten())
                        .unwrap_or_else(|| "image could not be encoded".to_string()),
                );
            }
            let txt: Option<&[f32]> = ex.text.as_ref().and_then(|f| f.row(row));
            if error.is_none() && ex.text.is_some() && txt.is_none() {
                error = Some("caption could not be encoded".to_string());
            }
            if error.is_none() {
                ok.push(rows.len());
                images.extend_from_slice(img.unwrap_or_default());
                match txt {
                    Some(t) => texts.extend_from_slice(t),
                    None => captions.push(r.caption.clone()),
                }
                // The feature cache already identified the image by content.
                let id = match &ex.image {
                    Some(f) => f.index.get(row).map(|&i| u64::from(i)),
                    None => r.image.as_ref().map(image_identity),
                };
                image_ids.push(id.unwrap_or(0));
            }
            rows.push(RowRecord {
                key: r.key.clone(),
                file: r.source_file,
                row: r.source_row,
                error,
            });
        }
        global_row += batch.len();
        obs.advance(batch.len() as u64);
    }
    obs.finish();
    // `ok` holds input row numbers (one record per row). The local tables
    // are moved, not copied: they are the bulk of the memory.
    let image_local = match ex.image.as_mut() {
        Some(f) => pair_local(f, &ok)?,
        None => None,
    };
    let text_local = match ex.text.as_mut() {
        Some(f) => pair_local(f, &ok)?,
        None => None,
    };
    let image_local_dim = image_local.as_ref().map(|l| l.dim);
    let text_local_dim = text_local.as_ref().map(|l| l.dim);
    let (text_inputs, text_cfg, vocab) = match &ex.text {
        Some(f) => (
            TextInputs::Embeddings {
                data: texts,
                dim: f.dim,
                local: text_local,
            },
            TextTowerConfig::Precomputed {
                dim: f.dim,
                local_dim: text_local_dim,
            },
            None,
        ),
        None => {
            let v = match vocab {
                Some(v) => v.clone(),
                None => Vocab::build(
                    captions.iter().map(String::as_str),
                    VOCAB_MIN_COUNT,
                    VOCAB_MAX_SIZE,
                    VOCAB_MAX_LEN,
                ),
            };
            let tokens = captions.iter().map(|c| v.encode(c)).collect();
            let cfg = TextTowerConfig::DemoBow {
                vocab_size: v.size(),
                dim: cfg.word_dim,
            };
            (TextInputs::Tokens(tokens), cfg, Some(v))
        }
    };
    Ok(PreparedRun {
        prepared: Prepared {
            rows,
            ok,
            inputs: PairInputs {
                images: ImageInputs::Embeddings {
                    data: images,
                    dim: image_dim,
                    local: image_local,
                },
                texts: text_inputs,
            },
            image_ids,
        },
        image: ImageTowerConfig::Precomputed {
            dim: image_dim,
            local_dim: image_local_dim,
        },
        text: text_cfg,
        vocab,
    })
}

fn no_local_features(input: &InputSet) -> Error {
    Error::Usage(format!(
        "{}: the GPO head and the recon method need local features (image regions and caption tokens), \
         but image column {:?} holds global embeddings only. Train on images with a frozen tower \
         (--image-encoder mobilenet_v2 or clip) or the demo towers, or use --head mean with another method",
        input.display_name(0),
        input.columns.image
    ))
}

/// The local sets of the usable pairs (`rows`: their input rows), sharing
/// the distinct-item table of `f`; None when `f` has no local features.
fn pair_local(f: &mut features::SideFeatures, rows: &[usize]) -> Result<Option<LocalFeatures>> {
    let Some(l) = f.local.take() else {
        return Ok(None);
    };
    let index = rows
        .iter()
        .map(|&r| f.index.get(r).copied().filter(|&i| i != features::NONE))
        .collect::<Option<Vec<u32>>>()
        .ok_or_else(|| invalid("a usable pair has no cached local features"))?;
    let local = LocalFeatures {
        dim: l.dim,
        data: l.data,
        offsets: l.offsets,
        index,
    };
    local.check().map_err(invalid)?;
    Ok(Some(local))
}

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
        .map_err(|e| invalid(format!("{}: {e}", dir.display())))?;
        checkpoint::load_into(&dir, &state, pipeline.as_mut())?;
        Ok(Engine {
            state,
            dir,
            pipeline,
            device: device.clone(),
        })
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
        if run.image != self.state.model.image {
            return Err(invalid(format!(
                "{}: the image features ({:?}) do not match the checkpoint's ({:?})",
                input.display_name(0),
                run.image,
                self.state.model.image
            )));
        }
        Ok(run.prepared)
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
        let started = Instant::now();
        let scores = if prepared.ok.is_empty() {
            PairScores::default()
        } else {
            let mut obs = rep.observer();
            self.pipeline
                .score(&prepared.inputs, refit, &mut obs)
                .context("scoring failed")?
        };
        let seconds = started.elapsed().as_secs_f64();
        let threshold = self.state.config.threshold;
        let labels = label_rows(input, prepared, &scores, threshold);
        let estimated_noise_rate = Division::estimated_noise_rate(&scores.clean_prob);
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
            if refit {
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
            format!("{estimated_noise_rate:.6}"),
        );
        put(&mut metadata, "input_fingerprint", input.fingerprint()?);
        put(&mut metadata, "rows", prepared.rows.len().to_string());
        put(&mut metadata, "skipped", prepared.skipped().to_string());
        Ok(Scored {
            labels,
            metadata,
            pairs: prepared.ok.len(),
            seconds,
            estimated_noise_rate,
        })
    }
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

/// Label rows for every input row: scores for usable pairs, `skipped` with
/// the reason for the rest.
fn label_rows(
    input: &InputSet,
    prepared: &Prepared,
    scores: &PairScores,
    threshold: f64,
) -> Vec<LabelRow> {
    let mut out: Vec<LabelRow> = prepared
        .rows
        .iter()
        .map(|r| LabelRow {
            key: r.key.clone(),
            source_file: input.display_name(r.file),
            source_row: r.row as u64,
            clean_prob: None,
            soft_label: None,
            similarity: None,
            is_clean: false,
            status: RowStatus::Skipped,
            error: r.error.clone(),
        })
        .collect();
    for (k, &i) in prepared.ok.iter().enumerate() {
        let row = &mut out[i];
        let p = scores.clean_prob.get(k).copied();
        row.clean_prob = p;
        row.soft_label = scores.soft_label.get(k).copied();
        row.similarity = scores.similarity.get(k).copied();
        row.is_clean = p.is_some_and(|p| p as f64 > threshold);
        row.status = RowStatus::Ok;
    }
    out
}

/// Short hash of the resolved configuration.
pub fn config_hash(cfg: &TrainConfig) -> String {
    let s = serde_json::to_string(cfg).unwrap_or_default();
    crate::hex::sha256_hex(s.as_bytes())[..16].to_string()
}

/// What `fit` was asked to do.
#[derive(Debug, Clone)]
pub struct FitOptions {
    /// Method name.
    pub method: String,
    /// Resolved configuration.
    pub config: TrainConfig,
    /// Seed for initialisation, batch order and shuffles.
    pub seed: u64,
    /// Run directory.
    pub out_dir: PathBuf,
    /// Towers.
    pub encoders: EncoderSpec,
    /// Feature cache.
    pub cache: CacheOptions,
}

/// What `fit` did.
#[derive(Debug, Clone, Serialize)]
pub struct FitSummary {
    /// Input rows.
    pub rows: usize,
    /// Usable pairs trained on.
    pub pairs: usize,
    /// Rows skipped, with their reasons in labels.parquet.
    pub skipped: usize,
    /// Pairs called clean.
    pub clean: usize,
    /// Fraction of usable pairs called noisy.
    pub estimated_noise_rate: f64,
    /// Seconds reading and decoding.
    pub read_seconds: f64,
    /// Seconds training (all epochs).
    pub train_seconds: f64,
    /// Seconds of the final scoring pass.
    pub score_seconds: f64,
    /// Scoring throughput.
    pub score_pairs_per_second: f64,
    /// Per-epoch statistics.
    pub epochs: Vec<EpochStats>,
    /// Rows written to filtered.parquet.
    pub filtered_rows: usize,
}

/// Train `opts.method` on `input`, write the run directory and return a summary.
pub fn fit(
    input: &InputSet,
    opts: &FitOptions,
    device: &Device,
    rep: &Reporter,
) -> Result<FitSummary> {
    let cfg = &opts.config;
    let t0 = Instant::now();
    let want_local = ncclean_pipelines::config::head_for(&opts.method, cfg).local;
    let run = prepare_for(
        input,
        &opts.encoders,
        cfg,
        want_local,
        None,
        &opts.cache,
        device,
        rep,
    )?;
    let (prepared, vocab) = (run.prepared, run.vocab);
    let read_seconds = t0.elapsed().as_secs_f64();
    if prepared.ok.len() < 2 {
        return Err(invalid(format!(
            "{}: only {} usable pair(s) out of {} rows; fit needs at least 2 (see the reasons with `ncclean inspect`)",
            input.display_name(0),
            prepared.ok.len(),
            prepared.rows.len()
        )));
    }
    rep.info(&format!(
        "read {} rows: {} usable, {} skipped ({read_seconds:.1}s)",
        prepared.rows.len(),
        prepared.ok.len(),
        prepared.skipped()
    ));
    let model = ncclean_pipelines::config::model_config(&opts.method, cfg, run.image, run.text);
    let mut pipeline =
        ncclean_pipelines::build(&opts.method, cfg.clone(), &model, opts.seed, device)
            .map_err(|e| Error::Usage(e.to_string()))?;
    let t1 = Instant::now();
    let total = pipeline.total_epochs();
    let mut epochs = Vec::with_capacity(total);
    let mut obs = rep.observer();
    for e in 0..total {
        let te = Instant::now();
        let stats = pipeline
            .run_epoch(e, &prepared.inputs, &mut obs)
            .with_context(|| format!("training epoch {}", e + 1))?;
        obs.finish();
        rep.epoch(&stats, total, te.elapsed().as_secs_f64());
        epochs.push(stats);
    }
    pipeline
        .finalize(&prepared.inputs, &mut obs)
        .context("final division")?;
    obs.finish();
    let train_seconds = t1.elapsed().as_secs_f64();

    let state = CheckpointState {
        format_version: checkpoint::FORMAT_VERSION,
        ncclean_version: env!("CARGO_PKG_VERSION").to_string(),
        method: opts.method.clone(),
        seed: opts.seed,
        config: cfg.clone(),
        model,
        vocab,
        encoders: opts.encoders.clone(),
        columns: input.columns.clone(),
        train_pairs: prepared.ok.len(),
        pipeline: pipeline.state(),
    };
    let ckpt_dir = opts.out_dir.join("checkpoint");
    checkpoint::save(&ckpt_dir, &state, pipeline.as_ref())?;
    drop(pipeline);

    // Score through the reloaded checkpoint: exactly what `ncclean score` does.
    let engine = Engine::load(&ckpt_dir, device)?;
    let scored = engine.score(input, &prepared, false, rep)?;
    let labels_path = opts.out_dir.join("labels.parquet");
    data::write_labels(&labels_path, &scored.labels, &scored.metadata)?;
    let keep = keep_mask(input, &scored.labels)?;
    let filtered = data::write_filtered(
        input,
        &keep,
        &opts.out_dir.join("filtered.parquet"),
        &scored.metadata,
    )?;

    let clean = scored.labels.iter().filter(|l| l.is_clean).count();
    let summary = FitSummary {
        rows: prepared.rows.len(),
        pairs: prepared.ok.len(),
        skipped: prepared.skipped(),
        clean,
        estimated_noise_rate: scored.estimated_noise_rate,
        read_seconds,
        train_seconds,
        score_seconds: scored.seconds,
        score_pairs_per_second: scored.pairs as f64 / scored.seconds.max(1e-9),
        epochs,
        filtered_rows: filtered.rows_out,
    };
    let stats_json = serde_json::to_vec_pretty(&summary).context("serialising stats")?;
    data::write_atomic(&opts.out_dir.join("stats.json"), &stats_json)?;
    let run = serde_json::json!({
        "ncclean_version": env!("CARGO_PKG_VERSION"),
        "method": opts.method,
        "seed": opts.seed,
        "config": cfg,
        "config_hash": config_hash(cfg),
        "model": engine.state.model,
        "encoders": opts.encoders,
        "columns": input.columns,
        "inputs": (0..input.files.len()).map(|f| input.display_name(f)).collect::<Vec<_>>(),
        "input_fingerprint": scored.metadata.get("ncclean.input_fingerprint"),
        "checkpoint_sha256": scored.metadata.get("ncclean.checkpoint_sha256"),
        "device": format!("{device:?}"),
        "command": std::env::args().collect::<Vec<_>>(),
    });
    let run_json = serde_json::to_vec_pretty(&run).context("serialising run.json")?;
    data::write_atomic(&opts.out_dir.join("run.json"), &run_json)?;
    Ok(summary)
}

/// `keep[file][row]` from label rows, matched by source file and row.
pub fn keep_mask(input: &InputSet, labels: &[LabelRow]) -> Result<Vec<Vec<bool>>> {
    keep_mask_by(input, labels, |l| l.is_clean)
}

/// `keep[file][row]` = `pred(label)` for each input row. Labels are matched to
/// input files by their `source_file` (as written, or by file name).
pub fn keep_mask_by(
    input: &InputSet,
    labels: &[LabelRow],
    pred: impl Fn(&LabelRow) -> bool,
) -> Result<Vec<Vec<bool>>> {
    let mut keep: Vec<Vec<bool>> = input
        .files
        .iter()
        .map(|f| vec![false; f.num_rows])
        .collect();
    let names: Vec<String> = (0..input.files.len())
        .map(|f| input.display_name(f))
        .collect();
    let base = |s: &str| {
        Path::new(s)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let mut seen = vec![0usize; input.files.len()];
    for l in labels {
        let f = names
            .iter()
            .position(|n| *n == l.source_file)
            .or_else(|| names.iter().position(|n| base(n) == base(&l.source_file)))
            .ok_or_else(|| {
                invalid(format!(
                    "labels refer to {:?}, which is not among the input files ({}); pass the data the labels were made from",
                    l.source_file,
                    names.join(", ")
                ))
            })?;
        let row = l.source_row as usize;
        let slot = keep[f].get_mut(row).ok_or_else(|| {
            invalid(format!(
                "labels refer to row {row} of {}, which has only {} rows; were the labels made from this data?",
                names[f],
                input.files[f].num_rows
            ))
        })?;
        *slot = pred(l);
        seen[f] += 1;
    }
    for (f, n) in seen.iter().enumerate() {
        if *n != input.files[f].num_rows {
            return Err(invalid(format!(
                "labels cover {n} of the {} rows of {}; were they made from this data?",
                input.files[f].num_rows, names[f]
            )));
        }
    }
    Ok(keep)
}
