//! The [`Engine`]: a trained pipeline rebuilt from its checkpoint. It
//! prepares data the way the checkpoint's towers expect, embeds it for
//! retrieval and scores it; `fit` scores its own training pairs through it
//! too, so `fit` and `score` share one scoring path.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use candle_core::{Device, Tensor};
use ncclean_models::{ImageTowerConfig, PairInputs, TextTowerConfig};
use ncclean_pipelines::{PairScores, Pipeline};

use super::labels::{config_hash, label_rows};
use super::prepare::{prepare_for, Prepared, PreparedRun};
use crate::curation::division_check::{self, SignalCheck};
use crate::curation::threshold::{self, Bound, Cut, Ranked, Record, Rule, Tally};
use crate::data::{ColumnOptions, ImageKind, InputSet, LabelRow, TextEmbeddings};
use crate::error::{invalid, pipeline_at, Error, Result};
use crate::run::checkpoint::{self, CheckpointState};
use crate::runtime::progress::Reporter;
use crate::towers::encoders::{ImageEncoder, TextEncoder};
use crate::towers::features::CacheOptions;

/// Refuse a state whose vocabulary does not fit its text tower: ids past
/// the tower's embedding table would fail in the middle of scoring, and a
/// smaller vocabulary (cut) would map words to other embeddings.
fn check_vocab(dir: &Path, state: &CheckpointState) -> Result<()> {
    let tower = match state.model.text {
        TextTowerConfig::DemoBow { vocab_size, .. } => Some(vocab_size),
        _ => None,
    };
    let words = state.vocab.as_ref().map(|v| v.size());
    let wrong = match (words, tower) {
        (Some(w), Some(t)) if w != t => Some(format!(
            "its vocabulary holds {w} ids but the text tower was built for {t}"
        )),
        (None, Some(_)) => Some("the demo text tower has no vocabulary".into()),
        _ => None,
    };
    match wrong {
        Some(w) => Err(invalid(format!(
            "{}: {w}; the checkpoint was changed or damaged: restore it, or run `ncclean fit` again",
            dir.join("state.json").display()
        ))),
        None => Ok(()),
    }
}

/// Pairs of a signal check's sample embedded at a time.
const SIGNAL_PIECE: usize = 128;

/// A trained pipeline rebuilt from a checkpoint.
pub struct Engine {
    /// The checkpoint's state.
    pub state: CheckpointState,
    /// Directory the checkpoint was read from.
    pub dir: PathBuf,
    /// The rule and cut `fit` resolved on the training pairs, with their
    /// distribution (`None`: a checkpoint from before threshold records).
    pub record: Option<Record>,
    /// The rule and cut that label pairs: the record's unless
    /// [`Engine::use_rule`] chose another.
    cut: Cut,
    pipeline: Box<dyn Pipeline>,
    device: Device,
}

/// Per-pair labels and what produced them.
#[derive(Debug, Clone)]
pub struct Scored {
    /// One label row per input row.
    pub labels: Vec<LabelRow>,
    /// Pairs scored (usable rows).
    pub pairs: usize,
    /// Seconds spent scoring (model passes and mixture).
    pub seconds: f64,
    /// Mean of `1 - clean_prob` over the usable pairs.
    pub estimated_noise_rate: f64,
    /// The raw division statistic of every scored pair (in the order of
    /// the usable rows): what `fit` summarises for the report's mixture
    /// plot.
    pub statistic: Vec<f32>,
    /// The engine's cut over the usable pairs.
    pub tally: Tally,
}

impl Engine {
    /// Load the checkpoint in `path` (a run directory or its `checkpoint/`).
    pub fn load(path: &Path, device: &Device) -> Result<Engine> {
        let dir = checkpoint::locate(path)?;
        checkpoint::verify(&dir, "run `ncclean fit` again")?;
        let state = checkpoint::read_state(&dir)?;
        // The checks `fit` makes before training: a damaged or edited state
        // fails here, naming the key, instead of aborting on allocation.
        ncclean_pipelines::registry::validate(&state.method, &state.config)
            .map_err(|e| pipeline_at(&dir, e))?;
        state.model.check_sizes().map_err(|e| {
            invalid(format!(
                "{}: the checkpoint's model is not one ncclean builds ({e}); run `ncclean fit` again",
                dir.display()
            ))
        })?;
        check_vocab(&dir, &state)?;
        let mut pipeline = ncclean_pipelines::build(
            &state.method,
            state.config.clone(),
            &state.model,
            state.seed,
            device,
        )
        .map_err(|e| pipeline_at(&dir, e))?;
        checkpoint::load_into(&dir, &state, pipeline.as_mut())?;
        let record = Record::load(&dir)?;
        let cut = match &record {
            Some(r) => r.cut,
            None => {
                let p = state.config.threshold;
                Cut::of(Rule::MinProb(p), Bound::at(p), &[])
            }
        };
        Ok(Engine {
            state,
            dir,
            record,
            cut,
            pipeline,
            device: device.clone(),
        })
    }

    /// `opts` (the user's column flags) completed with what this checkpoint
    /// reads: a model trained on precomputed text embeddings needs the text-
    /// embedding column, under the name it was trained on unless
    /// `--text-emb-col` names another.
    pub fn input_options(&self, mut opts: ColumnOptions) -> ColumnOptions {
        if self.state.encoders.text == TextEncoder::Precomputed {
            opts.text_embeddings = TextEmbeddings::Require;
            if opts.text_emb_col.is_none() {
                opts.text_emb_col = self.state.columns.text_embedding.clone();
            }
        }
        opts
    }

    /// The cut that labels pairs (its counts are the training pairs').
    pub fn cut(&self) -> &Cut {
        &self.cut
    }

    /// Label with `rule` instead of the stored cut. A rule that depends on
    /// the distribution is resolved on the training pairs' (the record's
    /// sketch), so every shard scored with it gets the same cut.
    pub fn use_rule(&mut self, rule: Rule) -> Result<()> {
        self.cut = match (&self.record, rule) {
            (Some(r), _) => r.cut_for(rule),
            (None, Rule::MinProb(p)) => Cut::of(rule, Bound::at(p), &[]),
            (None, _) => {
                return Err(Error::Usage(format!(
                    "{}: this checkpoint has no {} (it predates threshold records), so {} has no \
                     training distribution to be resolved on; use --min-prob, or fit again",
                    self.dir.display(),
                    threshold::RECORD_FILE,
                    rule.flag()
                )))
            }
        };
        Ok(())
    }

    /// Store `record` as this engine's (`fit`, once it resolved its rule on
    /// the training pairs it just scored) and label with its cut.
    pub fn set_record(&mut self, record: Record) {
        self.cut = record.cut;
        self.record = Some(record);
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

    /// Cross-modal retrieval over the usable pairs of `prepared`: one image
    /// per distinct image identity, every usable pair a caption of its
    /// image (`eval --retrieval`).
    pub fn retrieval(&self, prepared: &Prepared) -> Result<crate::curation::retrieval::Retrieval> {
        let mut first: std::collections::HashMap<u64, usize> = Default::default();
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
        let sim = self.similarity_matrix(prepared, &images, &captions)?;
        Ok(crate::curation::retrieval::retrieval(
            &sim,
            images.len(),
            &owner,
        ))
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
        self.similarities(&per_net, images, captions)
    }

    /// [`SignalCheck`] of this model on at most [`division_check::SAMPLE_PAIRS`]
    /// evenly spaced pairs of `pairs` (positions in `inputs`): only those
    /// are embedded. `None` with fewer than 2.
    pub fn signal_check(
        &self,
        inputs: &PairInputs,
        pairs: &[usize],
    ) -> Result<Option<SignalCheck>> {
        let picked: Vec<usize> = division_check::sample(pairs.len())
            .into_iter()
            .map(|k| pairs[k])
            .collect();
        if picked.len() < 2 {
            return Ok(None);
        }
        // A few pairs at a time: the sample's local features (a frozen
        // tower's grid per image, 125 KB each) would otherwise be copied
        // and widened to f32 all at once, beside the block being scored.
        let (mut images, mut captions): (Vec<Vec<Tensor>>, Vec<Vec<Tensor>>) = Default::default();
        for piece in picked.chunks(SIGNAL_PIECE) {
            let per_net = self.pipeline.embed(&inputs.select(piece));
            for (k, (vi, vt)) in per_net.context("embedding pairs")?.into_iter().enumerate() {
                images.resize_with(images.len().max(k + 1), Vec::new);
                captions.resize_with(captions.len().max(k + 1), Vec::new);
                images[k].push(vi);
                captions[k].push(vt);
            }
        }
        let per_net = images
            .iter()
            .zip(&captions)
            .map(|(vi, vt)| Ok((Tensor::cat(vi, 0)?, Tensor::cat(vt, 0)?)))
            .collect::<candle_core::Result<Vec<_>>>()
            .context("embedding pairs")?;
        let all: Vec<usize> = (0..picked.len()).collect();
        let sim = self.similarities(&per_net, &all, &all)?;
        Ok(SignalCheck::of(&sim, picked.len()))
    }

    /// `score`'s warning about the file `name`, whose usable pairs are
    /// `pairs` (positions in `inputs`), with `tally` this engine's cut over
    /// them: what a [`SignalCheck`] on them says of the cut, if anything.
    /// Files of fewer than [`division_check::MIN_PAIRS`] pairs are not judged (nor
    /// embedded).
    pub fn signal_warning(
        &self,
        name: &str,
        inputs: &PairInputs,
        pairs: &[usize],
        tally: &Tally,
    ) -> Result<Option<String>> {
        if pairs.len() < division_check::MIN_PAIRS {
            return Ok(None);
        }
        let Some(check) = self.signal_check(inputs, pairs)? else {
            return Ok(None);
        };
        let cut = self.cut_over(tally);
        Ok(check.score_warning(
            name,
            cut.estimated_noise_rate,
            1.0 - cut.kept_fraction(),
            cut.rule.follows_division(self.state.config.threshold),
        ))
    }

    /// The similarity matrix `images × captions` of embedded pairs (each
    /// network's image and caption embeddings), the networks averaged.
    fn similarities(
        &self,
        per_net: &[(Tensor, Tensor)],
        images: &[usize],
        captions: &[usize],
    ) -> Result<Vec<f32>> {
        let mut acc: Option<Tensor> = None;
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
        for (vi, vt) in per_net {
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
    /// Without the labels' metadata (which reads every input byte for the
    /// fingerprint): callers that score an input in pieces describe the
    /// whole once ([`Engine::metadata`]).
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
        let bound = self.cut.bound();
        let labels = label_rows(input, prepared, &scores, bound);
        let mut tally = Tally::default();
        tally.add(
            &Ranked::pairs(&scores.clean_prob, &scores.similarity),
            bound,
        );
        Ok(Scored {
            labels,
            pairs: prepared.ok.len(),
            seconds,
            estimated_noise_rate: threshold::estimated_noise_rate(&scores.clean_prob),
            statistic: scores.statistic,
            tally,
        })
    }

    /// This engine's cut over the pairs of `tally` (scored with it).
    pub fn cut_over(&self, tally: &Tally) -> Cut {
        Cut::from_tally(self.cut.rule, self.cut.bound(), tally)
    }

    /// Parquet key–value metadata of a labels file this engine scored.
    pub fn metadata(&self, s: &LabelsSummary) -> Result<BTreeMap<String, String>> {
        let mut metadata = crate::data::Metadata::of_build();
        let put = |m: &mut crate::data::Metadata, k: &str, v: String| m.put(k, v);
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
        put(&mut metadata, "threshold", s.cut.min_prob.to_string());
        if let Some(sim) = s.cut.min_similarity {
            put(&mut metadata, "threshold_min_similarity", sim.to_string());
        }
        put(&mut metadata, "threshold_rule", s.cut.rule.to_string());
        put(&mut metadata, "threshold_summary", s.cut.summary());
        put(
            &mut metadata,
            "expected_precision",
            format!("{:.6}", s.cut.expected_precision),
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
        // Methods describe their statistic in their own state.
        let statistic = self
            .state
            .division_statistic()
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
        if let Some(f) = self.state.division().and_then(|d| d.fallback) {
            let f = serde_json::to_string(&f).context("serialising the division's fallback")?;
            put(&mut metadata, "division_fallback", f);
        }
        put(
            &mut metadata,
            "estimated_noise_rate",
            format!("{:.6}", s.cut.estimated_noise_rate),
        );
        put(
            &mut metadata,
            "input_fingerprint",
            s.input_fingerprint.clone(),
        );
        put(&mut metadata, "rows", s.rows.to_string());
        put(&mut metadata, "skipped", s.skipped.to_string());
        if !s.warnings.is_empty() {
            let warnings = serde_json::to_string(&s.warnings).context("serialising warnings")?;
            put(&mut metadata, "warnings", warnings);
        }
        Ok(metadata.into_map())
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
    /// The cut over the scored pairs: its rule, precision and the
    /// estimated noise rate.
    pub cut: Cut,
    /// Warnings about the run or the scored files (the check against
    /// random pairings), kept with the labels they concern.
    pub warnings: Vec<String>,
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
    check_text_compatible(input, state)
}

/// The text side of [`check_compatible`]: precomputed text embeddings of
/// the trained width exactly when the checkpoint was trained on them.
fn check_text_compatible(input: &InputSet, state: &CheckpointState) -> Result<()> {
    let trained = state.encoders.text == TextEncoder::Precomputed;
    match (trained, &input.columns.text_embedding) {
        (true, None) => Err(invalid(format!(
            "{}: the checkpoint was trained on precomputed text embeddings (column {:?}), \
             but the input has no text-embedding column; name it with --text-emb-col",
            input.display_name(0),
            state.columns.text_embedding.as_deref().unwrap_or("")
        ))),
        (true, Some(col)) => match (&state.model.text, input.text_embedding_dim) {
            (TextTowerConfig::Precomputed { dim, .. }, Some(have)) if *dim != have => {
                Err(invalid(format!(
                    "{}: text embeddings in column {col:?} have {have} values, the checkpoint expects {dim}; \
                     score embeddings from the model the training data's came from",
                    input.display_name(0)
                )))
            }
            _ => Ok(()),
        },
        (false, Some(col)) => Err(Error::Usage(format!(
            "--text-emb-col {col:?}: the checkpoint encodes captions with {}, not precomputed text embeddings; \
             drop --text-emb-col",
            state.encoders.text.name()
        ))),
        (false, None) => Ok(()),
    }
}
