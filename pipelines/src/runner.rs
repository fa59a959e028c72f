//! The training and scoring loop every method runs in.
//!
//! [`Runner`] owns the networks (co-taught ones in order), the learning-rate
//! schedule, the seed streams, batching and progress, the final division,
//! scoring with the stored or a refitted division, and checkpoint state; a
//! [`Method`] supplies only its paper's math. `Runner<M>` is the
//! [`Pipeline`] the engine drives.

use std::cell::RefCell;
use std::collections::HashMap;

use candle_core::{Device, Tensor};
use candle_nn::VarMap;
use ncclean_models::rng::Rng;
use ncclean_models::{ModelConfig, PairInputs};

use crate::batches::shuffled_batches;
use crate::clean_model::null::{CaptionNull, NullSink};
use crate::clean_model::ridge::Ridge;
use crate::clean_model::signals::{CleanModel, FitOptions};
use crate::clean_model::trained::{sorted_and_finite, DivisionOrder, SavedQuantiles, TrainedPairs};
use crate::clean_model::Reference;
use crate::config::{CleanProbSource, TrainConfig};
use crate::division::Division;
use crate::error::{not_fitted, Error, Result};
use crate::method::{Batch, EpochCtx, Method, Plan, ScoreCtx};
use crate::net::Net;
use crate::pipeline::{EpochStats, Observer, PairScores, Pipeline};
use crate::scoring::{ScoreBlocks, Ticks};
use crate::streams::{Streams, EMBED_CHUNK};

/// Names of the clean model's reference arrays in the per-pair state.
const REFERENCE_IMAGES: &str = "clean_model.reference.images";
const REFERENCE_CAPTIONS: &str = "clean_model.reference.captions";
const REFERENCE_WEIGHTS: &str = "clean_model.reference.weights";
const REFERENCE_PROJECTION: &str = "clean_model.reference.projection";
/// Names of the ridge map's arrays ([`crate::clean_model::ridge::Ridge`]);
/// absent in checkpoints from before it.
const RIDGE_MAP: &str = "clean_model.ridge.map";
const RIDGE_BIAS: &str = "clean_model.ridge.bias";
const RIDGE_BANK: &str = "clean_model.ridge.bank";
/// Name of the trained pairs' hashes ([`TrainedPairs::hash_array`]).
const TRAINED_HASHES: &str = "clean_model.trained.hashes";
/// Name of the trained pairs' division quantiles
/// ([`crate::clean_model::trained::DivisionOrder::quantile`]), in the
/// hashes' order.
const TRAINED_DIVISION: &str = "clean_model.trained.division";

/// Name of network k's bank of the caption null
/// ([`crate::clean_model::null::CaptionNull`]).
fn null_bank_name(k: usize) -> String {
    format!("clean_model.null.net{k}")
}

/// The clean model from its JSON state and its reference arrays, checked
/// for consistent sizes.
fn load_clean_model(
    v: &serde_json::Value,
    pairs: &mut HashMap<String, Vec<f32>>,
) -> Result<CleanModel> {
    #[derive(serde::Deserialize)]
    struct Saved {
        calibration: crate::clean_model::Calibration,
        neighbours: usize,
        image_dim: usize,
        text_dim: usize,
        /// Absent in checkpoints from before trained pairs were read
        /// apart: every pair is then read as a new one.
        #[serde(default)]
        trained_quantiles: Option<SavedQuantiles>,
        /// Width of the caption null's bank; absent in checkpoints from
        /// before it (their similarity signal is the plain similarity).
        #[serde(default)]
        null_dim: Option<usize>,
    }
    let bad = |what: String| Error::State(format!("checkpoint's clean model: {what}"));
    let saved: Saved = serde_json::from_value(v.clone()).map_err(|e| bad(e.to_string()))?;
    let mut take = |name: &str| {
        pairs
            .remove(name)
            .ok_or_else(|| bad(format!("no array {name}")))
    };
    let reference = Reference {
        images: take(REFERENCE_IMAGES)?,
        captions: take(REFERENCE_CAPTIONS)?,
        weights: take(REFERENCE_WEIGHTS)?,
        image_dim: saved.image_dim,
        text_dim: saved.text_dim,
        projection: pairs.remove(REFERENCE_PROJECTION).unwrap_or_default(),
    };
    let r = reference.weights.len();
    if saved.image_dim == 0
        || !reference.projection.len().is_multiple_of(saved.image_dim)
        || reference.images.len() != r * reference.width()
        || reference.captions.len() != r * saved.text_dim
    {
        return Err(bad(format!(
            "{r} reference images do not fit arrays of {} and {} values",
            reference.images.len(),
            reference.captions.len()
        )));
    }
    let trained = match (saved.trained_quantiles, pairs.remove(TRAINED_HASHES)) {
        (Some(q), Some(a)) => {
            let hashes = TrainedPairs::hashes_from_array(&a)
                .ok_or_else(|| bad(format!("{TRAINED_HASHES} holds values that are not hashes")))?;
            if !(sorted_and_finite(&q.trained) && sorted_and_finite(&q.held_out)) {
                return Err(bad(
                    "the trained pairs' quantiles are not sorted finite numbers".into(),
                ));
            }
            if q.trained.len() != q.held_out.len() || q.trained.is_empty() {
                return Err(bad(format!(
                    "{} trained and {} held-out quantiles",
                    q.trained.len(),
                    q.held_out.len()
                )));
            }
            let division = match (q.division_order, pairs.remove(TRAINED_DIVISION)) {
                (Some(order), Some(quantile))
                    if quantile.len() == hashes.len()
                        && order.len() == q.trained.len()
                        && sorted_and_finite(&order)
                        && quantile.iter().all(|p| (0.0..=1.0).contains(p)) =>
                {
                    Some(DivisionOrder { quantile, order })
                }
                (None, None) => None,
                _ => {
                    return Err(bad(format!(
                        "the trained pairs' division order does not fit their {} hashes \
                         (missing, of another length, or not sorted quantiles)",
                        hashes.len()
                    )))
                }
            };
            Some(TrainedPairs {
                hashes,
                trained: q.trained,
                held_out: q.held_out,
                weights: q.weights,
                own: q.own,
                division,
            })
        }
        (None, None) => None,
        _ => return Err(bad("trained pairs without their quantiles or hashes".into())),
    };
    let null = match saved.null_dim {
        None => None,
        Some(dim) => {
            let mut banks = Vec::new();
            while let Some(a) = pairs.remove(&null_bank_name(banks.len())) {
                banks.push(a);
            }
            let count = banks.len();
            Some(CaptionNull::new(banks, dim).ok_or_else(|| {
                bad(format!(
                    "the caption null's {count} bank(s) do not fit a width of {dim}"
                ))
            })?)
        }
    };
    let ridge = match (
        pairs.remove(RIDGE_MAP),
        pairs.remove(RIDGE_BIAS),
        pairs.remove(RIDGE_BANK),
    ) {
        (None, None, None) => None,
        (Some(map), Some(bias), Some(bank)) => {
            let r = Ridge {
                map,
                bias,
                bank,
                width: reference.width(),
                text_dim: saved.text_dim,
            };
            if !r.is_consistent() {
                return Err(bad(format!(
                    "the ridge map's arrays ({}, {} and {} values) do not fit widths {} and {}",
                    r.map.len(),
                    r.bias.len(),
                    r.bank.len(),
                    r.width,
                    r.text_dim
                )));
            }
            Some(r)
        }
        _ => return Err(bad("part of the ridge map's arrays is missing".into())),
    };
    Ok(CleanModel {
        calibration: saved.calibration,
        reference,
        ridge,
        null,
        neighbours: saved.neighbours,
        trained,
    })
}

/// A method with its networks: the loop around the method's math.
pub struct Runner<M: Method> {
    cfg: TrainConfig,
    model: ModelConfig,
    device: Device,
    streams: Streams,
    nets: Vec<Net>,
    /// Seed each network was last initialised with.
    net_seeds: Vec<u64>,
    /// The mixture fitted on the final pass's statistic.
    division: Option<Division>,
    /// The final clean-probability model (None: `clean_prob` is the
    /// division's posterior).
    clean_model: Option<CleanModel>,
    /// Epochs trained so far.
    epochs_done: usize,
    method: M,
    /// Whether networks train with the fused CPU step where it applies
    /// ([`Net::set_fused`]).
    fused: bool,
}

/// Share of the training pairs held out of training to calibrate the
/// final clean-probability model on ([`crate::clean_model`]): pairs the
/// networks never trained on behave as new pairs do, where memorised ones
/// would make mismatched pairs look matched.
pub const CALIBRATION_SHARE: f64 = 0.1;
/// Pairs held out at least while they are at most [`MAX_SMALL_SHARE`] of
/// the data: the noise estimate's standard error is about
/// `0.03 · sqrt(3000 / held-out pairs)` (simulated, 20–70% noise), and on
/// Flickr8k a fit on 15,000 pairs calibrated on 1,500 estimated 12.9%
/// noise for 20% (the same fit with another seed: 19.6%).
pub const TARGET_CALIBRATION_PAIRS: usize = 3_000;
/// Most of the data held out to reach [`TARGET_CALIBRATION_PAIRS`].
pub const MAX_SMALL_SHARE: f64 = 0.2;
/// Most pairs held out for calibration.
pub const MAX_CALIBRATION_PAIRS: usize = 5_000;
/// Fewest pairs worth holding out: below it the model is calibrated on
/// the training pairs themselves.
pub const MIN_CALIBRATION_PAIRS: usize = 100;

/// How many of `n` training pairs are held out for calibration (at least:
/// whole images are drawn until as many are held out); 0 where too few
/// would be ([`MIN_CALIBRATION_PAIRS`]) and the clean model is calibrated
/// on the training pairs themselves.
pub fn calibration_size(n: usize) -> usize {
    let share = |f: f64| (n as f64 * f).round() as usize;
    let k = share(CALIBRATION_SHARE)
        .max(share(MAX_SMALL_SHARE).min(TARGET_CALIBRATION_PAIRS))
        .min(MAX_CALIBRATION_PAIRS);
    if k < MIN_CALIBRATION_PAIRS {
        0
    } else {
        k
    }
}

/// Images shown with more pairs than this are drawn pair by pair for
/// calibration ([`calibration_pairs`]): caption datasets give a photo 5–7
/// captions (Flickr, COCO), while a web placeholder (an "image not
/// available" thumbnail, a shop logo) can carry thousands of unrelated ones.
pub const HUB_PAIRS: usize = 10;

/// The pairs held out of training for calibration (sorted), drawn with
/// `rng`: every pair of whole images, `image_of[i]` being pair i's
/// distinct image, images drawn until a [`CALIBRATION_SHARE`] of the pairs
/// (at most [`MAX_CALIBRATION_PAIRS`]; on smaller data up to
/// [`MAX_SMALL_SHARE`] of them to reach [`TARGET_CALIBRATION_PAIRS`]) is
/// held out. None when the clean model is off or too few pairs would be.
///
/// Whole images, because a new pair in `score` is usually a new image: a
/// held-out caption whose image trained with its other captions (Flickr8k
/// has five per image) scores higher than a pair of a new image, and
/// calibrated on such pairs `clean_prob` on new images came out 0.04 low
/// (GSC, 20% random noise, dev split: mean 0.763 for 0.80).
///
/// An image with more than [`HUB_PAIRS`] pairs is the exception: the same
/// share of its pairs is held out, drawn at random. Drawn whole, such an
/// image is all or nothing: 20% of Flickr8k's pairs put on five placeholder
/// images were held out in no draw of seed 0, so the calibration saw none
/// of that noise, estimated 0 and called every pair clean (mean
/// `clean_prob` 1.000 for 0.80), and in a draw that took one, a fifth of
/// the held-out pairs would have been one image's. New data shows such an
/// image again, so its held-out pairs, whose image trained with its other
/// captions, are what `score` meets.
pub fn calibration_pairs(image_of: &[u32], cfg: &TrainConfig, rng: &mut Rng) -> Vec<usize> {
    let n = image_of.len();
    if cfg.clean_prob != CleanProbSource::Reference {
        return Vec::new();
    }
    let k = calibration_size(n);
    if k == 0 {
        return Vec::new();
    }
    let images = image_of.iter().map(|&g| g as usize + 1).max().unwrap_or(0);
    let mut pairs_of: Vec<Vec<usize>> = vec![Vec::new(); images];
    for (i, &g) in image_of.iter().enumerate() {
        pairs_of[g as usize].push(i);
    }
    let share = k as f64 / n as f64;
    let hub_take = |pairs: &[usize]| (pairs.len() as f64 * share).round() as usize;
    let from_hubs: usize = pairs_of
        .iter()
        .filter(|p| p.len() > HUB_PAIRS)
        .map(|p| hub_take(p))
        .sum();
    let mut held = Vec::with_capacity(k);
    // Without hub images the draw is the one from before them, to the bit.
    for g in rng.permutation(images) {
        if held.len() + from_hubs >= k {
            break;
        }
        if pairs_of[g].len() <= HUB_PAIRS {
            held.extend_from_slice(&pairs_of[g]);
        }
    }
    for pairs in pairs_of.iter_mut().filter(|p| p.len() > HUB_PAIRS) {
        let take = hub_take(pairs);
        rng.shuffle(pairs);
        held.extend_from_slice(&pairs[..take]);
    }
    held.sort_unstable();
    held
}

/// Build `M` as a boxed [`Pipeline`] (a registry row's constructor).
pub fn build<M: Method + 'static>(
    cfg: TrainConfig,
    model: &ModelConfig,
    seed: u64,
    device: &Device,
) -> Result<Box<dyn Pipeline>> {
    Ok(Box::new(Runner::<M>::new(cfg, model, seed, device)?))
}

/// Check `M`'s parameters and schedule in `cfg` without building networks
/// (a registry row's validator): `M::new` against a model that offers every
/// feature, so only the configuration can fail.
pub fn validate_params<M: Method>(cfg: &TrainConfig) -> Result<()> {
    use ncclean_models::{ImageTowerConfig, LocalOptions, Pooling, TextTowerConfig};
    let everything = ModelConfig {
        image: ImageTowerConfig::DemoCnn {
            image_size: cfg.image_size,
            width: cfg.cnn_width,
        },
        text: TextTowerConfig::DemoBow {
            vocab_size: 2,
            dim: cfg.word_dim,
        },
        joint_dim: cfg.joint_dim,
        hidden: cfg.hidden,
        head: LocalOptions {
            local: true,
            pooling: Pooling::Gpo,
            unit_inputs: false,
        },
    };
    M::new(cfg, &everything).map(|_| ())
}

impl<M: Method> Runner<M> {
    /// A fresh run: the method validated, its networks initialised.
    pub fn new(cfg: TrainConfig, model: &ModelConfig, seed: u64, device: &Device) -> Result<Self> {
        let method = M::new(&cfg, model)?;
        let streams = Streams::new(seed, M::NAME);
        let mut nets = Vec::new();
        let mut net_seeds = Vec::new();
        for k in 0..method.networks() {
            let s = method.init_seed(&streams, k, 0);
            nets.push(Net::new(model, s, device, cfg.lr, cfg.grad_clip)?);
            net_seeds.push(s);
        }
        Ok(Runner {
            cfg,
            model: model.clone(),
            device: device.clone(),
            streams,
            nets,
            net_seeds,
            division: None,
            clean_model: None,
            epochs_done: 0,
            method,
            fused: true,
        })
    }

    /// Train with the fused CPU step where it applies (`true`, the
    /// default) or every step through candle's autograd (the reference
    /// path), for every network now and re-initialised later.
    pub fn set_fused(&mut self, on: bool) {
        self.fused = on;
        for net in &mut self.nets {
            net.set_fused(on);
        }
    }

    /// The method (its label state, for tests and reports).
    pub fn method_ref(&self) -> &M {
        &self.method
    }

    /// The networks, in order.
    pub fn networks(&self) -> &[Net] {
        &self.nets
    }

    /// The run's seed streams.
    pub fn streams(&self) -> &Streams {
        &self.streams
    }

    /// Re-initialise every network whose initialisation seed for `epoch`
    /// differs from the one it was built with.
    fn reinit(&mut self, epoch: usize) -> Result<()> {
        for k in 0..self.nets.len() {
            let s = self.method.init_seed(&self.streams, k, epoch);
            if s != self.net_seeds[k] {
                self.nets[k] = Net::new(
                    &self.model,
                    s,
                    &self.device,
                    self.cfg.lr,
                    self.cfg.grad_clip,
                )?;
                self.nets[k].set_fused(self.fused);
                self.net_seeds[k] = s;
            }
        }
        Ok(())
    }

    /// The error that ends a diverged epoch: what went non-finite, and the
    /// likely cause.
    fn diverged(&self, epoch: usize, lr: f64, what: &str) -> Error {
        Error::Diverged(format!(
            "training diverged in epoch {} of {}: {what}; the learning rate (lr = {lr}) is \
             probably too high: try a tenth of it (--lr {})",
            epoch + 1,
            self.total_epochs(),
            lr / 10.0
        ))
    }

    /// The first parameter (network, name) that holds a NaN or inf, if any.
    fn non_finite_weight(&self) -> Result<Option<(usize, String)>> {
        for (k, net) in self.nets.iter().enumerate() {
            let vars = net.varmap().data().lock().map_err(|_| {
                Error::State("a network's parameters are unreadable (poisoned lock)".into())
            })?;
            for (name, v) in vars.iter() {
                // NaN and inf both survive abs-max as non-finite.
                let m = v.as_tensor().abs()?.max_all()?;
                if !m
                    .to_dtype(candle_core::DType::F32)?
                    .to_scalar::<f32>()?
                    .is_finite()
                {
                    return Ok(Some((k, name.clone())));
                }
            }
        }
        Ok(None)
    }

    /// Refuse to score with weights that are not all finite (a diverged or
    /// damaged checkpoint would call every pair clean).
    fn check_finite_weights(&self) -> Result<()> {
        match self.non_finite_weight()? {
            None => Ok(()),
            Some((k, name)) => Err(Error::State(format!(
                "network {k} has non-finite weights ({name}): the run diverged or the \
                 checkpoint is damaged; fit again (with a lower learning rate)"
            ))),
        }
    }

    /// Score `data` cut into `blocks`: the trained division, or with
    /// `refit` one fitted on these pairs.
    fn score_in(
        &self,
        data: &PairInputs,
        blocks: &ScoreBlocks,
        refit: bool,
        obs: &mut dyn Observer,
    ) -> Result<PairScores> {
        if obs.cancelled() {
            return Err(Error::Interrupted);
        }
        let stored = match (&self.division, refit) {
            (_, true) => None,
            (Some(d), false) => Some(d),
            (None, false) => return Err(not_fitted()),
        };
        self.check_finite_weights()?;
        // The caption null's moments are gathered during the method's pass
        // (which embeds every caption) rather than by embedding again.
        let sink = self
            .clean_model
            .as_ref()
            .and_then(|m| m.null.as_ref())
            .map(|null| NullSink::new(null, data.len()));
        let pass = self.watched(obs, "scoring", data.len(), |ticks| {
            self.pass_in(data, blocks, (refit, sink.as_ref()), ticks)
        })?;
        // A method that hands over no captions (one written outside this
        // crate may not) leaves the clean model to embed them itself.
        let moments = sink.map(NullSink::into_moments).filter(|m| m.nets() > 0);
        let stat = M::statistic(&pass);
        let clean_prob = match stored {
            Some(d) => d.exported_clean_prob(stat),
            None => Division::fit(stat, self.cfg.mixture, self.method.clean_side())
                .exported_clean_prob(stat),
        };
        let mut scores = self.method.scores(pass, clean_prob, &self.cfg);
        // The final clean-probability model, where one was fitted: a
        // property of each pair and the checkpoint, whatever the blocks.
        let refitted;
        let model = match (&self.clean_model, refit) {
            (Some(m), true) => {
                refitted = m.calibrate(
                    &self.nets,
                    data,
                    &mut self.streams.named("clean model refit"),
                )?;
                refitted.as_ref()
            }
            (m, _) => m.as_ref(),
        };
        if let Some(m) = model {
            // Every method's `similarity` is the networks' mean `S_ii` of
            // the same embeddings, which is the model's similarity signal
            // bit for bit (`method_similarity_is_the_clean_models_own`):
            // the pairs are not embedded a second time for it.
            scores.clean_prob =
                m.clean_probs_given(&self.nets, data, &scores.similarity, moments.as_ref())?;
        }
        // A pair the model cannot measure (NaN/inf statistic or similarity)
        // is never called clean.
        for i in 0..scores.clean_prob.len() {
            if !(scores.statistic[i].is_finite() && scores.similarity[i].is_finite()) {
                scores.clean_prob[i] = 0.0;
                scores.soft_label[i] = 0.0;
            }
        }
        Ok(scores)
    }

    fn pass(
        &self,
        data: &PairInputs,
        shards: &[usize],
        refit: bool,
        ticks: Ticks,
    ) -> Result<M::Pass> {
        let blocks = ScoreBlocks::new(shards, self.cfg.batch_size);
        self.pass_in(data, &blocks, (refit, None), ticks)
    }

    /// The method's score pass over `data` in `blocks`; with `null`, the
    /// pass hands it every network's caption embeddings.
    fn pass_in(
        &self,
        data: &PairInputs,
        blocks: &ScoreBlocks,
        (refit, null): (bool, Option<&NullSink>),
        ticks: Ticks,
    ) -> Result<M::Pass> {
        if blocks.pairs() != data.len() {
            return Err(Error::State(format!(
                "the shards hold {} pairs, the data {}",
                blocks.pairs(),
                data.len()
            )));
        }
        self.method.score_pass(&ScoreCtx {
            nets: &self.nets,
            data,
            cfg: &self.cfg,
            streams: &self.streams,
            blocks,
            refit,
            ticks,
            null,
        })
    }

    /// The pairs of `n` held out of training for calibration (the same on
    /// every call: drawn from the run's seed).
    fn held_out(&self, data: &PairInputs) -> Vec<usize> {
        if self.cfg.clean_prob != CleanProbSource::Reference {
            return Vec::new();
        }
        let (_, image_of) = data.images.distinct();
        calibration_pairs(
            &image_of,
            &self.cfg,
            &mut self.streams.named("calibration pairs"),
        )
    }

    /// Run `pass` as the observer's stage `stage` of `n` pairs: the
    /// method's passes over the pairs ([`Method::score_passes`]) are
    /// reported as one sweep over them, so the bar moves once through the
    /// whole scoring work.
    fn watched<T>(
        &self,
        obs: &mut dyn Observer,
        stage: &str,
        n: usize,
        pass: impl FnOnce(Ticks) -> Result<T>,
    ) -> Result<T> {
        let passes = self.method.score_passes(&self.cfg, self.nets.len()).max(1);
        obs.start(stage, n as u64);
        // (observer, pair-passes reported, pairs shown)
        let state = RefCell::new((obs, 0usize, 0u64));
        let tick = |units: usize| {
            let mut st = state.borrow_mut();
            st.1 += units;
            let now = ((st.1 / passes) as u64).min(n as u64);
            if now > st.2 {
                let step = now - st.2;
                st.2 = now;
                st.0.advance(step);
            }
        };
        let out = pass(Ticks::new(&tick));
        let (obs, units, shown) = state.into_inner();
        if out.is_ok() {
            debug_assert_eq!(
                units,
                passes * n,
                "{}: score_passes does not match the passes the score reports",
                M::NAME
            );
            if shown < n as u64 {
                obs.advance(n as u64 - shown);
            }
        }
        obs.finish();
        out
    }
}

impl<M: Method> Pipeline for Runner<M> {
    fn method(&self) -> &'static str {
        M::NAME
    }

    fn total_epochs(&self) -> usize {
        self.method.total_epochs(&self.cfg)
    }

    fn run_epoch(
        &mut self,
        epoch: usize,
        data: &PairInputs,
        obs: &mut dyn Observer,
    ) -> Result<EpochStats> {
        self.reinit(epoch)?;
        let lr = self.method.lr_at(&self.cfg, epoch);
        self.nets.iter_mut().for_each(|n| n.set_lr(lr));
        let n = data.len();
        let networks = self.nets.len();
        let warmup = self.method.has_warmup() && epoch < self.cfg.warmup_epochs;
        let mut rng = self.streams.epoch(epoch);
        let plan = if warmup {
            Plan::all(n, networks, "warmup")
        } else {
            self.method.plan(&mut EpochCtx {
                epoch,
                cfg: &self.cfg,
                nets: &self.nets,
                data,
                rng: &mut rng,
                streams: &self.streams,
            })?
        };
        let mut plan = plan;
        let held = self.held_out(data);
        if !held.is_empty() {
            for t in &mut plan.train {
                t.retain(|i| held.binary_search(i).is_err());
            }
        }
        if plan.train.len() != networks {
            return Err(Error::Config(format!(
                "{}: the epoch plan has {} training sets for {networks} networks",
                M::NAME,
                plan.train.len()
            )));
        }
        let batch = self.cfg.batch_size.max(1);
        let steps: u64 = plan
            .train
            .iter()
            .map(|t| t.len().div_ceil(batch) as u64)
            .sum();
        obs.start(&plan.phase, steps);
        let mut loss = 0f64;
        for k in 0..networks {
            // One network: its batches continue the epoch stream; co-taught
            // networks draw their own.
            let mut own = self
                .method
                .batch_stream(&self.streams, epoch, k)
                .or_else(|| (networks > 1).then(|| self.streams.batches(epoch, k)));
            let batches = shuffled_batches(&plan.train[k], batch, own.as_mut().unwrap_or(&mut rng));
            self.method.start_net(k, n);
            // Batch losses stay on the device and are read once, after the
            // network's last batch: reading each one would stall a GPU every
            // step. Summed on the host in batch order as before, so the
            // epoch loss is bit-identical.
            let mut losses = Vec::with_capacity(batches.len());
            for idx in &batches {
                let b = Batch {
                    epoch,
                    k,
                    net: &self.nets[k],
                    data,
                    idx,
                    cfg: &self.cfg,
                };
                let fused = if self.nets[k].fuses(data) {
                    self.method.fused_loss(&b, warmup)
                } else {
                    None
                };
                let l = match fused {
                    Some(loss) => {
                        let value = self.nets[k].fused_step(data, idx, &loss)?;
                        Tensor::new(value, &Device::Cpu)?
                    }
                    None => {
                        let l = if warmup {
                            self.method.warmup_loss(&b)?
                        } else {
                            self.method.batch_loss(&b)?
                        };
                        self.nets[k].step(&l)?;
                        l.detach()
                    }
                };
                losses.push(l);
                obs.advance(1);
                if obs.cancelled() {
                    return Err(Error::Interrupted);
                }
            }
            let mut total = 0f64;
            if !losses.is_empty() {
                let values = Tensor::stack(&losses, 0)?
                    .to_dtype(candle_core::DType::F32)?
                    .to_vec1::<f32>()?;
                // The first non-finite loss ends the epoch as it always did;
                // the steps after it only touched weights that are dropped
                // with the error.
                if let Some(value) = values.iter().find(|v| !v.is_finite()) {
                    let what = format!("network {k}'s loss is {value} ({} phase)", plan.phase);
                    return Err(self.diverged(epoch, lr, &what));
                }
                total = values.iter().fold(0f64, |t, &v| t + f64::from(v));
            }
            if !warmup {
                self.method.end_net(k, &self.cfg)?;
            }
            loss += total / batches.len().max(1) as f64;
        }
        obs.finish();
        if let Some((k, name)) = self.non_finite_weight()? {
            let what = format!("network {k}'s weights ({name}) are no longer finite");
            return Err(self.diverged(epoch, lr, &what));
        }
        let after = if warmup {
            None
        } else {
            self.method.finish_epoch(&self.cfg, n)
        };
        self.epochs_done = epoch + 1;
        Ok(EpochStats {
            epoch,
            phase: plan.phase,
            loss: loss / networks as f64,
            clean_fraction: plan.clean_fraction.or(after),
            pairs: plan.train.iter().map(Vec::len).sum::<usize>() / networks,
        })
    }

    fn finalize(
        &mut self,
        data: &PairInputs,
        shards: &[usize],
        obs: &mut dyn Observer,
    ) -> Result<()> {
        if obs.cancelled() {
            return Err(Error::Interrupted);
        }
        let pass = self.watched(obs, "final division", data.len(), |ticks| {
            self.pass(data, shards, true, ticks)
        })?;
        let division = Division::fit(
            M::statistic(&pass),
            self.cfg.mixture,
            self.method.clean_side(),
        );
        self.clean_model = match self.cfg.clean_prob {
            CleanProbSource::Division => None,
            CleanProbSource::Reference => {
                // Each training caption counts in the reference by the
                // method's final clean probability.
                let weights = division.exported_clean_prob(M::statistic(&pass));
                let mut held = self.held_out(data);
                if held.is_empty() {
                    held = (0..data.len()).collect();
                }
                CleanModel::fit(
                    &self.nets,
                    data,
                    &weights,
                    &held,
                    FitOptions {
                        neighbours: self.cfg.reference_neighbours,
                        max_images: self.cfg.reference_images,
                        caption_null: self.cfg.caption_null,
                    },
                    &mut self.streams.named("clean model"),
                )?
            }
        };
        self.division = Some(division);
        self.method.keep_fitted(&pass);
        Ok(())
    }

    fn score(
        &self,
        data: &PairInputs,
        shards: &[usize],
        refit: bool,
        obs: &mut dyn Observer,
    ) -> Result<PairScores> {
        let blocks = ScoreBlocks::new(shards, self.cfg.batch_size);
        self.score_in(data, &blocks, refit, obs)
    }

    fn score_blocks(
        &self,
        data: &PairInputs,
        blocks: &ScoreBlocks,
        obs: &mut dyn Observer,
    ) -> Result<PairScores> {
        self.score_in(data, blocks, false, obs)
    }

    fn embed(&self, data: &PairInputs) -> Result<Vec<(Tensor, Tensor)>> {
        Ok(self
            .nets
            .iter()
            .map(|n| n.embed_all(data, EMBED_CHUNK))
            .collect::<candle_core::Result<_>>()?)
    }

    fn weights(&self) -> Vec<(String, &VarMap)> {
        self.nets
            .iter()
            .enumerate()
            .map(|(k, n)| (format!("net{k}"), n.varmap()))
            .collect()
    }

    fn weights_mut(&mut self) -> Vec<(String, &mut VarMap)> {
        self.nets
            .iter_mut()
            .enumerate()
            .map(|(k, n)| (format!("net{k}"), n.varmap_mut()))
            .collect()
    }

    fn optimizer_state(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::new();
        for (k, net) in self.nets.iter().enumerate() {
            let opt = net.optimizer();
            for (name, t) in opt.moments() {
                out.push((format!("net{k}.{name}"), t));
            }
            // f64 holds any step count exactly.
            let steps = Tensor::new(&[opt.steps() as f64], &Device::Cpu);
            out.extend(steps.ok().map(|t| (format!("net{k}.steps"), t)));
        }
        out
    }

    fn load_optimizer_state(&mut self, tensors: &HashMap<String, Tensor>) -> Result<()> {
        for (k, net) in self.nets.iter_mut().enumerate() {
            let prefix = format!("net{k}.");
            let steps = tensors
                .get(&format!("{prefix}steps"))
                .ok_or_else(|| Error::State(format!("optimiser state has no {prefix}steps")))?
                .to_vec1::<f64>()?;
            let moments: HashMap<String, Tensor> = tensors
                .iter()
                .filter_map(|(n, t)| n.strip_prefix(&prefix).map(|n| (n.to_string(), t.clone())))
                .collect();
            let steps = steps.first().copied().unwrap_or(0.0) as usize;
            net.optimizer_mut()
                .restore(steps, &moments)
                .map_err(|e| Error::State(format!("network {k}: {e}")))?;
        }
        Ok(())
    }

    fn state(&self) -> serde_json::Value {
        serde_json::json!({
            "division": self.division,
            "net_seeds": self.net_seeds,
            "epochs_done": self.epochs_done,
            "method": self.method.state(),
            "clean_model": self.clean_model.as_ref().map(|m| serde_json::json!({
                "calibration": m.calibration,
                "neighbours": m.neighbours,
                "image_dim": m.reference.image_dim,
                "text_dim": m.reference.text_dim,
                "trained_quantiles": m.trained.as_ref().map(|t| SavedQuantiles {
                    trained: t.trained.clone(),
                    held_out: t.held_out.clone(),
                    weights: t.weights,
                    own: t.own.clone(),
                    division_order: t.division.as_ref().map(|d| d.order.clone()),
                }),
                "null_dim": m.null.as_ref().map(|n| n.dim),
            })),
        })
    }

    fn pair_state(&mut self) -> Vec<(String, Vec<f32>)> {
        let arrays = self.method.pair_arrays().into_iter();
        let mut out: Vec<(String, Vec<f32>)> =
            arrays.map(|(name, a)| (name, a.to_values())).collect();
        // The reference travels with the per-pair arrays (pairs.safetensors):
        // too large for state.json.
        if let Some(m) = &self.clean_model {
            let r = &m.reference;
            out.push((REFERENCE_IMAGES.into(), r.images.clone()));
            out.push((REFERENCE_CAPTIONS.into(), r.captions.clone()));
            out.push((REFERENCE_WEIGHTS.into(), r.weights.clone()));
            if !r.projection.is_empty() {
                out.push((REFERENCE_PROJECTION.into(), r.projection.clone()));
            }
            if let Some(t) = &m.trained {
                out.push((TRAINED_HASHES.into(), t.hash_array()));
                if let Some(d) = &t.division {
                    out.push((TRAINED_DIVISION.into(), d.quantile.clone()));
                }
            }
            if let Some(r) = &m.ridge {
                out.push((RIDGE_MAP.into(), r.map.clone()));
                out.push((RIDGE_BIAS.into(), r.bias.clone()));
                out.push((RIDGE_BANK.into(), r.bank.clone()));
            }
            if let Some(n) = &m.null {
                for (k, bank) in n.images.iter().enumerate() {
                    out.push((null_bank_name(k), bank.clone()));
                }
            }
        }
        out
    }

    fn load_state(
        &mut self,
        state: &serde_json::Value,
        pairs: Vec<(String, Vec<f32>)>,
    ) -> Result<()> {
        self.division = serde_json::from_value(state["division"].clone())
            .map_err(|e| Error::State(format!("checkpoint state has no valid division: {e}")))?;
        if let Some(seeds) = state.get("net_seeds") {
            let seeds: Vec<u64> = serde_json::from_value(seeds.clone()).map_err(|e| {
                Error::State(format!("checkpoint state has invalid net_seeds: {e}"))
            })?;
            if seeds.len() != self.nets.len() {
                return Err(Error::State(format!(
                    "checkpoint holds {} networks, {} builds {}",
                    seeds.len(),
                    M::NAME,
                    self.nets.len()
                )));
            }
            // The weights loaded next belong to these initialisations; a
            // later epoch must not re-initialise them again.
            self.net_seeds = seeds;
        }
        if let Some(e) = state.get("epochs_done").and_then(serde_json::Value::as_u64) {
            self.epochs_done = e as usize;
        }
        self.method.load_state(&state["method"])?;
        let mut pairs: HashMap<String, Vec<f32>> = pairs.into_iter().collect();
        self.clean_model = match state.get("clean_model") {
            Some(v) if !v.is_null() => Some(load_clean_model(v, &mut pairs)?),
            _ => None,
        };
        for (name, a) in self.method.pair_arrays() {
            if let Some(saved) = pairs.remove(&name) {
                a.restore(saved);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::Silent;
    use crate::registry;

    /// 24 pairs of 6-d vectors; the captions of the last 6 are rotated.
    fn data() -> PairInputs {
        let mut rng = Rng::new(3);
        let img: Vec<f32> = (0..24 * 6).map(|_| rng.normal() as f32).collect();
        let mut txt = img.clone();
        txt[18 * 6..].rotate_left(6);
        crate::test_support::embedding_pairs(img, txt, 6)
    }

    /// Copy every network weight of `from` into `to` (same method and
    /// model): a pipeline rebuilt from a checkpoint.
    fn copy_weights(from: &dyn Pipeline, to: &mut dyn Pipeline) -> Result<()> {
        for ((_, dst), (_, src)) in to.weights_mut().into_iter().zip(from.weights()) {
            let src = src.data().lock().expect("lock");
            for (k, v) in dst.data().lock().expect("lock").iter() {
                v.set(src[k].as_tensor())?;
            }
        }
        Ok(())
    }

    /// A short schedule of `method` that exercises its warm-up, its phases
    /// and (CRCL) a re-initialisation.
    fn config(method: &str) -> TrainConfig {
        let mut sets = vec![
            "batch_size=8",
            "lr=1e-2",
            "lr_decay_epochs=[1]",
            "division_shuffles=2",
        ];
        sets.extend(match method {
            "crcl" => vec!["epochs=4", "params.pieces=[1,1]", "params.freeze_epochs=1"],
            "gsc" => vec!["epochs=2"],
            _ => vec!["epochs=3", "warmup_epochs=1", "params.clean_only_epochs=1"],
        });
        let mut sets: Vec<String> = sets.into_iter().map(String::from).collect();
        if method != "esc" {
            sets.retain(|s| !s.starts_with("params.clean_only"));
        }
        let over = crate::config::parse_sets(&sets).expect("sets parse");
        crate::presets::resolve(method, None, &over).expect("config resolves")
    }

    /// A whole vanilla fit (warm-up, divisions, training, the final
    /// model) with the fused CPU step equals the same fit through autograd
    /// bit for bit: every epoch's loss and every pair's scores. Batches of
    /// 32 with a last one of 16, then of the clean pairs (other sizes).
    #[test]
    fn a_fused_vanilla_fit_equals_the_autograd_fit() -> Result<()> {
        let model = crate::test_support::precomputed_model(6, 8, 16);
        let mut rng = Rng::new(17);
        let n = 160;
        let img: Vec<f32> = (0..n * 6).map(|_| rng.normal() as f32).collect();
        let mut txt: Vec<f32> = img.iter().map(|x| x + 0.3 * rng.normal() as f32).collect();
        txt[n * 3 / 4 * 6..].rotate_left(6);
        let data = crate::test_support::embedding_pairs(img, txt, 6);
        let mut cfg = config("vanilla");
        cfg.batch_size = 32;
        let fit = |fused: bool| -> Result<(Vec<f64>, PairScores)> {
            let mut p = Runner::<crate::methods::vanilla::Vanilla>::new(
                cfg.clone(),
                &model,
                5,
                &Device::Cpu,
            )?;
            p.set_fused(fused);
            assert_eq!(p.networks()[0].fuses(&data), fused);
            let mut losses = Vec::new();
            for e in 0..p.total_epochs() {
                losses.push(p.run_epoch(e, &data, &mut Silent)?.loss);
            }
            p.finalize(&data, &[data.len()], &mut Silent)?;
            Ok((losses, p.score(&data, &[data.len()], false, &mut Silent)?))
        };
        let (fused_losses, fused) = fit(true)?;
        let (losses, reference) = fit(false)?;
        assert_eq!(fused_losses, losses);
        assert_eq!(fused, reference);
        Ok(())
    }

    #[test]
    fn whole_images_are_held_out_for_calibration() {
        let cfg = config("vanilla");
        let mut rng = Rng::new(1);
        let distinct = |n: u32| (0..n).collect::<Vec<u32>>();
        // A fifth of small data, up to 3,000 pairs; a tenth beyond 30,000,
        // up to 5,000; none below 100.
        let held = calibration_pairs(&distinct(2000), &cfg, &mut rng);
        assert_eq!(held.len(), 400);
        assert!(held.windows(2).all(|w| w[0] < w[1]) && held[399] < 2000);
        for (n, k) in [
            (15_000, 3000),
            (30_000, 3000),
            (40_000, 4000),
            (200_000, 5000),
        ] {
            assert_eq!(
                calibration_pairs(&distinct(n), &cfg, &mut rng).len(),
                k,
                "{n}"
            );
        }
        assert_eq!(calibration_pairs(&distinct(900), &cfg, &mut rng).len(), 180);
        assert!(calibration_pairs(&distinct(450), &cfg, &mut rng).is_empty());
        // Nothing held out when clean_prob is the division's.
        let mut division = cfg.clone();
        division.clean_prob = CleanProbSource::Division;
        assert!(calibration_pairs(&distinct(2000), &division, &mut rng).is_empty());
        // Five captions per image: whole images are held out, 80 of 400.
        let of: Vec<u32> = (0..2000).map(|i| i / 5).collect();
        let held = calibration_pairs(&of, &cfg, &mut rng);
        assert_eq!(held.len(), 400);
        for &i in &held {
            let image = of[i];
            let all = (0..2000).filter(|&j| of[j] == image);
            assert!(all.into_iter().all(|j| held.binary_search(&j).is_ok()));
        }
    }

    #[test]
    fn images_with_many_pairs_are_held_out_pair_by_pair() {
        // 10,000 pairs: 1,600 images of five captions, and two placeholder
        // images showing 1,000 pairs each (and one at exactly HUB_PAIRS,
        // drawn whole). A fifth is held out: 2,000 pairs, of which each
        // placeholder gives its share, 200, in every draw; drawn whole it
        // gave 0 or 1,000.
        let cfg = config("vanilla");
        let mut of: Vec<u32> = (0..8000).map(|i| i / 5).collect();
        of.extend(std::iter::repeat_n(1600, 1000));
        of.extend(std::iter::repeat_n(1601, 1000));
        of.truncate(10_000 - HUB_PAIRS);
        of.extend(std::iter::repeat_n(1602, HUB_PAIRS));
        assert_eq!(calibration_size(of.len()), 2000);
        for seed in 0..5 {
            let held = calibration_pairs(&of, &cfg, &mut Rng::new(seed));
            let on = |g: u32| held.iter().filter(|&&i| of[i] == g).count();
            // 990 pairs of image 1601 (a tenth of the last were cut).
            assert_eq!((on(1600), on(1601)), (200, 198), "seed {seed}");
            assert!(on(1602) == 0 || on(1602) == HUB_PAIRS, "seed {seed}");
            // Whole images overshoot by less than the largest one drawn.
            assert!(
                (2000..2000 + HUB_PAIRS).contains(&held.len()),
                "seed {seed}: {}",
                held.len()
            );
            assert!(held.windows(2).all(|w| w[0] < w[1]));
            // The images of five are still whole.
            for &i in &held {
                if of[i] < 1600 {
                    let image = of[i];
                    let all = (0..of.len()).filter(|&j| of[j] == image);
                    assert!(all.into_iter().all(|j| held.binary_search(&j).is_ok()));
                }
            }
        }
        // Without such images the draw is the whole-image one of before:
        // the same pairs as a plain draw of whole images from the same rng.
        let plain: Vec<u32> = (0..3000).map(|i| i / 5).collect();
        let held = calibration_pairs(&plain, &cfg, &mut Rng::new(7));
        let mut rng = Rng::new(7);
        let mut want = Vec::new();
        for g in rng.permutation(600) {
            if want.len() >= 600 {
                break;
            }
            want.extend((0..5).map(|c| g * 5 + c));
        }
        want.sort_unstable();
        assert_eq!(held, want);
    }

    #[test]
    fn held_out_pairs_are_never_trained_on() -> Result<()> {
        // 1,000 pairs: 200 held out, so every epoch trains 800 per network.
        let n = 1000;
        let dim = 6;
        let mut rng = Rng::new(3);
        let vecs: Vec<f32> = (0..n * dim).map(|_| rng.normal() as f32).collect();
        let data = crate::test_support::embedding_pairs(vecs.clone(), vecs, dim);
        let model = crate::test_support::precomputed_model(dim, 8, 16);
        let mut p = crate::build("vanilla", config("vanilla"), &model, 0, &Device::Cpu)?;
        for e in 0..p.total_epochs() {
            let stats = p.run_epoch(e, &data, &mut Silent)?;
            assert!(
                stats.pairs <= 800,
                "epoch {e} trained {} pairs",
                stats.pairs
            );
        }
        Ok(())
    }

    /// Trained pairs are recognised and read at their quantile among the
    /// trained pairs ([`crate::clean_model::trained`]): 1,500 pairs of
    /// 8-d vectors, 30% with a random caption, trained long enough to
    /// memorise unevenly, so that their own ratio against moved pairings
    /// is not kept. Their mean `clean_prob` is the held-out pairs' (the
    /// estimated clean share; read without the map it was 0.884 against
    /// 0.804), and the map survives the checkpoint.
    #[test]
    fn trained_pairs_are_read_as_held_out_ones() -> Result<()> {
        let (n, dim) = (1500, 32);
        let data = generated(11, n, dim, 0.3);
        let model = crate::test_support::precomputed_model(dim, 64, 256);
        let mut cfg = config("vanilla");
        cfg.epochs = 15;
        let build = || crate::build("vanilla", cfg.clone(), &model, 2, &Device::Cpu);
        let mut p = build()?;
        for e in 0..p.total_epochs() {
            p.run_epoch(e, &data, &mut Silent)?;
        }
        p.finalize(&data, &[n], &mut Silent)?;
        let scores = p.score(&data, &[n], false, &mut Silent)?;
        let state = p.state();
        let quantiles = &state["clean_model"]["trained_quantiles"];
        assert!(quantiles.is_object(), "no trained-pairs map: {state}");
        assert!(
            quantiles["weights"].is_array(),
            "trained pairs without their own weights: {quantiles}"
        );
        // Memorised this hard, mismatched pairs are not the pairings moved
        // up: their own ratio disagrees with the held-out mean and is not
        // kept (`trained::OwnRatio::fit`), so the quantile map reads them.
        assert!(quantiles["own"].is_null(), "{quantiles}");
        let (_, of) = data.images.distinct();
        let held = calibration_pairs(
            &of,
            &cfg,
            &mut Streams::new(2, "vanilla").named("calibration pairs"),
        );
        assert!(held.len() >= 100, "{} held out", held.len());
        let mean = |idx: &[usize]| {
            idx.iter()
                .map(|&i| f64::from(scores.clean_prob[i]))
                .sum::<f64>()
                / idx.len() as f64
        };
        let trained: Vec<usize> = (0..n).filter(|i| held.binary_search(i).is_err()).collect();
        let (mt, mh) = (mean(&trained), mean(&held));
        assert!((mt - mh).abs() < 0.03, "trained {mt}, held out {mh}");
        let json = serde_json::to_string(&state).expect("state serialises");
        let mut q = build()?;
        q.load_state(
            &serde_json::from_str(&json).expect("parses"),
            p.pair_state(),
        )?;
        copy_weights(p.as_ref(), q.as_mut())?;
        assert_eq!(q.score(&data, &[n], false, &mut Silent)?, scores);

        // The method's division reorders the trained pairs
        // (`trained::DivisionOrder`). A checkpoint without it (from before
        // it) loads and reads every trained pair by its score alone: other
        // trained pairs' labels, the same held-out ones, and the trained
        // pairs' labels as a whole the same.
        assert!(
            quantiles["division_order"].is_array(),
            "no division order: {quantiles}"
        );
        let mut old = state.clone();
        old["clean_model"]["trained_quantiles"]
            .as_object_mut()
            .expect("an object")
            .remove("division_order");
        let without: Vec<(String, Vec<f32>)> = p
            .pair_state()
            .into_iter()
            .filter(|(name, _)| name != TRAINED_DIVISION)
            .collect();
        let mut r = build()?;
        r.load_state(&old, without)?;
        copy_weights(p.as_ref(), r.as_mut())?;
        let plain = r.score(&data, &[n], false, &mut Silent)?;
        for &i in &held {
            assert_eq!(
                plain.clean_prob[i], scores.clean_prob[i],
                "held-out pair {i}"
            );
        }
        let moved = trained
            .iter()
            .filter(|&&i| plain.clean_prob[i] != scores.clean_prob[i])
            .count();
        assert!(moved > 0, "the division moved no trained pair");
        let mean_plain = trained
            .iter()
            .map(|&i| f64::from(plain.clean_prob[i]))
            .sum::<f64>()
            / trained.len() as f64;
        assert!((mean_plain - mt).abs() < 0.005, "{mean_plain} against {mt}");
        // Half of it (the order without the per-pair quantiles) is refused.
        let mut s = build()?;
        let without: Vec<(String, Vec<f32>)> = p
            .pair_state()
            .into_iter()
            .filter(|(name, _)| name != TRAINED_DIVISION)
            .collect();
        let err = s.load_state(&state, without).err().map(|e| e.to_string());
        assert!(
            err.as_deref().is_some_and(|e| e.contains("division order")),
            "{err:?}"
        );
        // Quantiles out of order, or not numbers (a damaged checkpoint),
        // are refused with what is wrong, not read into a panic.
        let mut reversed = state.clone();
        let order = &mut reversed["clean_model"]["trained_quantiles"]["division_order"];
        let mut values: Vec<f64> = serde_json::from_value(order.clone()).expect("numbers");
        values.reverse();
        *order = serde_json::json!(values);
        let err = build()?
            .load_state(&reversed, p.pair_state())
            .err()
            .map(|e| e.to_string());
        assert!(
            err.as_deref().is_some_and(|e| e.contains("division order")),
            "{err:?}"
        );
        let mut broken = state.clone();
        broken["clean_model"]["trained_quantiles"]["trained"][3] = serde_json::json!(null);
        let err = build()?
            .load_state(&broken, p.pair_state())
            .err()
            .map(|e| e.to_string());
        assert!(err.is_some(), "a null quantile was read");
        Ok(())
    }

    /// `n` pairs of `dim`-wide vectors from one generator: a caption is
    /// its image plus noise of standard deviation `sd`, except for every
    /// pair `i` with `i % 10 < 3`, whose caption is drawn on its own (30%
    /// mismatched).
    fn generated(seed: u64, n: usize, dim: usize, sd: f64) -> PairInputs {
        let mut rng = Rng::new(seed);
        let img: Vec<f32> = (0..n * dim).map(|_| rng.normal() as f32).collect();
        let mut txt: Vec<f32> = img
            .iter()
            .map(|&v| v + sd as f32 * rng.normal() as f32)
            .collect();
        for i in (0..n).filter(|i| i % 10 < 3) {
            for d in 0..dim {
                txt[i * dim + d] = rng.normal() as f32;
            }
        }
        crate::test_support::embedding_pairs(img, txt, dim)
    }

    /// Labels transfer (issue #32): fitted on 5,000 generated pairs, the
    /// mean `clean_prob` of 2,000 new pairs from the same generator (30%
    /// mismatched) is the true clean share within 0.05, as is the training
    /// pairs' own (0.733 and 0.744; the division posterior: 0.753 and
    /// 0.745), and mismatched new pairs rank below matched ones.
    #[test]
    fn labels_transfer_to_new_pairs_of_the_same_kind() -> Result<()> {
        let dim = 8;
        let train = generated(21, 5000, dim, 0.5);
        let fresh = generated(22, 2000, dim, 0.5);
        let model = crate::test_support::precomputed_model(dim, 16, 64);
        let mut cfg = config("vanilla");
        cfg.epochs = 6;
        let mut p = crate::build("vanilla", cfg, &model, 4, &Device::Cpu)?;
        for e in 0..p.total_epochs() {
            p.run_epoch(e, &train, &mut Silent)?;
        }
        p.finalize(&train, &[train.len()], &mut Silent)?;
        let mean = |v: &[f32]| v.iter().map(|&x| f64::from(x)).sum::<f64>() / v.len() as f64;
        let own = p.score(&train, &[train.len()], false, &mut Silent)?;
        let new = p.score(&fresh, &[fresh.len()], false, &mut Silent)?;
        let (mo, mn) = (mean(&own.clean_prob), mean(&new.clean_prob));
        assert!(
            (mo - 0.7).abs() < 0.05,
            "training pairs: mean clean_prob {mo}"
        );
        assert!((mn - 0.7).abs() < 0.05, "new pairs: mean clean_prob {mn}");
        let noisy: Vec<bool> = (0..fresh.len()).map(|i| i % 10 < 3).collect();
        let (mut below, mut pairs) = (0u64, 0u64);
        for (i, &a) in new.clean_prob.iter().enumerate().filter(|(i, _)| noisy[*i]) {
            for (j, &b) in new.clean_prob.iter().enumerate() {
                if !noisy[j] && i != j {
                    pairs += 1;
                    below += u64::from(a < b);
                }
            }
        }
        let auroc = below as f64 / pairs as f64;
        assert!(auroc > 0.9, "new pairs' AUROC {auroc}");
        Ok(())
    }

    /// Every stage an observer saw: name, total and each advance.
    #[derive(Default)]
    struct Recorder(Vec<(String, u64, Vec<u64>)>);

    impl Observer for Recorder {
        fn start(&mut self, stage: &str, total: u64) {
            self.0.push((stage.to_string(), total, Vec::new()));
        }
        fn advance(&mut self, n: u64) {
            if let Some(s) = self.0.last_mut() {
                s.2.push(n);
            }
        }
        fn finish(&mut self) {}
    }

    /// The final division and scoring count pairs and move as the passes
    /// go (the debug build also checks each method's declared passes
    /// against what its score reports), for every method.
    #[test]
    fn scoring_progress_moves_through_the_pairs() -> Result<()> {
        let global = (data(), crate::test_support::precomputed_model(6, 8, 16));
        let local = (
            crate::test_support::pixel_pairs(
                (0..24).map(|i| vec![2 + i % 9, 3, 4 + i % 5]).collect(),
            ),
            crate::test_support::demo_local_model(),
        );
        for info in registry::METHODS {
            let (data, model) = if info.needs_local_features {
                &local
            } else {
                &global
            };
            let mut p = (info.build)(config(info.name), model, 5, &Device::Cpu)?;
            let mut rec = Recorder::default();
            p.finalize(data, &[data.len()], &mut rec)?;
            p.score(data, &[data.len()], false, &mut rec)?;
            let stages: Vec<&str> = rec.0.iter().map(|s| s.0.as_str()).collect();
            assert_eq!(stages, ["final division", "scoring"], "{}", info.name);
            for (stage, total, steps) in &rec.0 {
                assert_eq!(*total, 24, "{}: {stage}", info.name);
                assert_eq!(steps.iter().sum::<u64>(), 24, "{}: {stage}", info.name);
                assert!(
                    steps.len() >= 2,
                    "{}: {stage} moved once: {steps:?}",
                    info.name
                );
            }
        }
        Ok(())
    }

    /// Every method without local features: fit, then scoring is
    /// deterministic, bounded, refuses to run unfitted, and a pipeline rebuilt
    /// from the saved state (JSON) and weights scores exactly the same.
    #[test]
    fn every_method_fits_scores_and_round_trips_its_state() -> Result<()> {
        let data = data();
        let model = crate::test_support::precomputed_model(6, 8, 16);
        for info in registry::METHODS.iter().filter(|m| !m.needs_local_features) {
            let build = || (info.build)(config(info.name), &model, 5, &Device::Cpu);
            let mut p = build()?;
            assert!(matches!(
                p.score(&data, &[data.len()], false, &mut Silent),
                Err(Error::State(_))
            ));
            for e in 0..p.total_epochs() {
                let st = p.run_epoch(e, &data, &mut Silent)?;
                assert!(st.loss.is_finite(), "{}: epoch {e}", info.name);
            }
            p.finalize(&data, &[data.len()], &mut Silent)?;
            let a = p.score(&data, &[data.len()], false, &mut Silent)?;
            assert_eq!(
                a,
                p.score(&data, &[data.len()], false, &mut Silent)?,
                "{}",
                info.name
            );
            for v in [&a.clean_prob, &a.soft_label] {
                assert!(
                    v.iter().all(|x| (0.0..=1.0).contains(x)),
                    "{}: {v:?}",
                    info.name
                );
            }
            assert_eq!(p.state()["epochs_done"], p.total_epochs());

            let json = serde_json::to_string(&p.state()).expect("state serialises");
            let mut q = build()?;
            q.load_state(
                &serde_json::from_str(&json).expect("parses"),
                p.pair_state(),
            )?;
            copy_weights(p.as_ref(), q.as_mut())?;
            assert_eq!(
                q.score(&data, &[data.len()], false, &mut Silent)?,
                a,
                "{}",
                info.name
            );
            assert_eq!(q.state(), p.state(), "{}", info.name);
        }
        Ok(())
    }

    /// The clean model's similarity signal (its own embedding pass over the
    /// pairs, [`CleanModel::signals`]) and the similarity each method's
    /// score pass returns are equal, which lets `score_in` pass the latter
    /// in. 1,100 pairs, each image shown twice: the method embeds 550
    /// distinct images in chunks of 512, the model 1,100 rows in chunks of
    /// 512, so the same rows sit in products of other shapes. (ReCon needs
    /// local features: `scripts/compare_runs.sh` covers it on demo data.)
    #[test]
    fn method_similarity_is_the_clean_models_own() -> Result<()> {
        fn check<M: Method>(name: &str, data: &PairInputs) -> Result<()> {
            let model = crate::test_support::precomputed_model(6, 8, 16);
            let mut p = Runner::<M>::new(config(name), &model, 5, &Device::Cpu)?;
            for e in 0..p.total_epochs() {
                p.run_epoch(e, data, &mut Silent)?;
            }
            p.finalize(data, &[data.len()], &mut Silent)?;
            let m = p.clean_model.as_ref().expect("a clean model is fitted");
            assert!(
                m.null.is_some(),
                "{name}: the caption null is on by default"
            );
            let scored = p.score(data, &[data.len()], false, &mut Silent)?;
            // The similarity signal is the z-score of the similarity
            // against the caption null; without the null it is the
            // similarity itself, the method's own column.
            let plain = CleanModel {
                null: None,
                ..m.clone()
            };
            let own = plain.signals(&p.nets, data)?;
            assert_eq!(scored.similarity.len(), own.similarity.len());
            for (i, (a, b)) in scored.similarity.iter().zip(&own.similarity).enumerate() {
                // Equal numbers (a zero's sign aside, which no clean
                // probability sees).
                assert!(a == b, "{name}: pair {i}: {a} vs {b}");
            }
            // The null's moments gathered in the method's pass give the
            // clean model's own labels, and those of embedding the
            // captions again, bit for bit.
            let own = m.signals(&p.nets, data)?;
            assert_eq!(scored.clean_prob, m.clean_probs_of(&own), "{name}");
            let again = m.clean_probs_given(&p.nets, data, &scored.similarity, None)?;
            assert_eq!(scored.clean_prob, again, "{name}");
            // The method's pass handed every network's captions over, so
            // score did not embed them again.
            let null = m.null.as_ref().expect("null");
            let sink = NullSink::new(null, data.len());
            let blocks = ScoreBlocks::new(&[data.len()], p.cfg.batch_size);
            p.pass_in(data, &blocks, (false, Some(&sink)), Ticks::NONE)?;
            assert_eq!(sink.into_moments().nets(), null.images.len(), "{name}");
            Ok(())
        }
        let mut rng = Rng::new(7);
        let n = 1100;
        let shown: Vec<f32> = (0..n / 2 * 6).map(|_| rng.normal() as f32).collect();
        let img: Vec<f32> = (0..n)
            .flat_map(|i| shown[i / 2 * 6..i / 2 * 6 + 6].to_vec())
            .collect();
        let mut txt: Vec<f32> = img.iter().map(|x| x + 0.1 * rng.normal() as f32).collect();
        txt[n * 4 / 5 * 6..].rotate_left(6);
        let data = crate::test_support::embedding_pairs(img, txt, 6);
        check::<crate::methods::vanilla::Vanilla>("vanilla", &data)?;
        check::<crate::methods::esc::Esc>("esc", &data)?;
        check::<crate::methods::gsc::Gsc>("gsc", &data)?;
        check::<crate::methods::crcl::Crcl>("crcl", &data)?;
        Ok(())
    }

    #[test]
    fn a_diverging_run_stops_with_the_epoch_and_the_learning_rate() -> Result<()> {
        let data = data();
        let model = crate::test_support::precomputed_model(6, 8, 16);
        let mut cfg = config("vanilla");
        cfg.lr = 1e30;
        cfg.grad_clip = 0.0;
        let mut p = Runner::<crate::methods::vanilla::Vanilla>::new(cfg, &model, 5, &Device::Cpu)?;
        let err = (0..3)
            .map(|e| p.run_epoch(e, &data, &mut Silent))
            .find_map(|r| r.err())
            .expect("lr 1e30 diverges");
        let msg = err.to_string();
        assert!(matches!(err, Error::Diverged(_)), "{msg}");
        assert!(
            msg.contains("epoch") && msg.contains("lr = 1000000000000000000000000000000"),
            "{msg}"
        );
        Ok(())
    }

    #[test]
    fn non_finite_weights_are_refused_and_unmeasurable_pairs_are_never_clean() -> Result<()> {
        let data = data();
        let model = crate::test_support::precomputed_model(6, 8, 16);
        let mut p = Runner::<crate::methods::vanilla::Vanilla>::new(
            config("vanilla"),
            &model,
            5,
            &Device::Cpu,
        )?;
        for e in 0..p.total_epochs() {
            p.run_epoch(e, &data, &mut Silent)?;
        }
        p.finalize(&data, &[data.len()], &mut Silent)?;
        // A NaN input pair: its similarity is NaN, so it is not clean.
        let mut bad = data.clone();
        if let ncclean_models::ImageInputs::Embeddings { data, .. } = &mut bad.images {
            data[0] = f32::NAN;
        }
        let s = p.score(&bad, &[bad.len()], false, &mut Silent)?;
        assert!(s.similarity[0].is_nan());
        assert_eq!((s.clean_prob[0], s.soft_label[0]), (0.0, 0.0));
        assert!(s.clean_prob[1..].iter().all(|v| v.is_finite()));
        // Overwrite one weight with NaN: scoring refuses.
        {
            let vars = p.weights()[0].1.data().lock().expect("lock");
            let (_, v) = vars.iter().next().expect("a parameter");
            let nan = (v.as_tensor().ones_like()? * f64::NAN)?;
            v.set(&nan)?;
        }
        let e = p
            .score(&data, &[data.len()], false, &mut Silent)
            .expect_err("NaN weights");
        assert!(
            matches!(e, Error::State(_)) && e.to_string().contains("non-finite"),
            "{e}"
        );
        Ok(())
    }

    /// Stopping after any epoch and continuing in a fresh runner from the
    /// saved weights, optimiser moments, state and label state gives the
    /// same result as never stopping, for every method.
    #[test]
    fn resuming_after_any_epoch_is_bit_identical() -> Result<()> {
        let data = data();
        let model = crate::test_support::precomputed_model(6, 8, 16);
        for info in registry::METHODS.iter().filter(|m| !m.needs_local_features) {
            let build = || (info.build)(config(info.name), &model, 5, &Device::Cpu);
            let finish = |p: &mut Box<dyn Pipeline>, from: usize| -> Result<PairScores> {
                for e in from..p.total_epochs() {
                    p.run_epoch(e, &data, &mut Silent)?;
                }
                p.finalize(&data, &[data.len()], &mut Silent)?;
                p.score(&data, &[data.len()], false, &mut Silent)
            };
            let whole = finish(&mut build()?, 0)?;
            for stop in 1..build()?.total_epochs() {
                let mut first = build()?;
                for e in 0..stop {
                    first.run_epoch(e, &data, &mut Silent)?;
                }
                let state: serde_json::Value =
                    serde_json::from_str(&serde_json::to_string(&first.state()).expect("json"))
                        .expect("parses");
                let optimizer: HashMap<String, Tensor> =
                    first.optimizer_state().into_iter().collect();
                let mut second = build()?;
                second.load_state(&state, first.pair_state())?;
                second.load_optimizer_state(&optimizer)?;
                for ((_, dst), (_, src)) in second.weights_mut().into_iter().zip(first.weights()) {
                    let src = src.data().lock().expect("lock");
                    for (k, v) in dst.data().lock().expect("lock").iter() {
                        v.set(src[k].as_tensor())?;
                    }
                }
                assert_eq!(state["epochs_done"], stop);
                let resumed = finish(&mut second, stop)?;
                assert_eq!(resumed, whole, "{} stopped after epoch {stop}", info.name);
            }
        }
        Ok(())
    }

    /// The stream names are part of every output: pin them.
    #[test]
    fn stream_names_are_fixed() {
        let s = Streams::new(7, "esc");
        assert_eq!(s.init(0), 7);
        assert_eq!(s.init(1), Rng::derive(7, "esc-net1-init").next_u64());
        let first = |mut r: Rng| r.next_u64();
        assert_eq!(first(s.epoch(2)), first(Rng::derive(7, "epoch-2")));
        assert_eq!(
            first(s.division(2, 1)),
            first(Rng::derive(7, "epoch-2-division-net1"))
        );
        assert_eq!(
            first(s.batches(2, 0)),
            first(Rng::derive(7, "epoch-2-batches-net0"))
        );
        assert_eq!(first(s.score()), first(Rng::derive(7, "score-shuffles")));
    }

    /// A shard scored a block at a time ([`ScoreBlocks::part`]) gets, pair
    /// for pair, the scores of the shard scored whole: what lets `ncclean
    /// score` stream a file larger than one block.
    #[test]
    fn scoring_block_by_block_equals_scoring_the_shard_whole() -> Result<()> {
        let data = data();
        let model = crate::test_support::precomputed_model(6, 8, 16);
        // Two blocks, of 32,772 and 32,771 pairs.
        let n = crate::scoring::SCORE_BLOCK_PAIRS + 7;
        let mut rng = Rng::new(11);
        let img: Vec<f32> = (0..n * 6).map(|_| rng.normal() as f32).collect();
        let txt: Vec<f32> = (0..n * 6).map(|_| rng.normal() as f32).collect();
        let big = crate::test_support::embedding_pairs(img.clone(), txt.clone(), 6);
        for name in ["vanilla", "gsc"] {
            let info = registry::METHODS
                .iter()
                .find(|m| m.name == name)
                .expect("registered");
            let mut p = (info.build)(config(name), &model, 5, &Device::Cpu)?;
            for e in 0..p.total_epochs() {
                p.run_epoch(e, &data, &mut Silent)?;
            }
            p.finalize(&data, &[data.len()], &mut Silent)?;
            let whole = p.score(&big, &[n], false, &mut Silent)?;
            let blocks = ScoreBlocks::new(&[n], 8);
            assert_eq!(blocks.blocks().len(), 2);
            let mut parts = PairScores::default();
            for b in blocks.blocks() {
                let range = b.start * 6..(b.start + b.len) * 6;
                let piece = crate::test_support::embedding_pairs(
                    img[range.clone()].to_vec(),
                    txt[range].to_vec(),
                    6,
                );
                let s = p.score_blocks(&piece, &ScoreBlocks::part(*b), &mut Silent)?;
                parts.clean_prob.extend(s.clean_prob);
                parts.soft_label.extend(s.soft_label);
                parts.statistic.extend(s.statistic);
                parts.similarity.extend(s.similarity);
            }
            for (what, a, b) in [
                ("similarity", &parts.similarity, &whole.similarity),
                ("statistic", &parts.statistic, &whole.statistic),
                ("clean_prob", &parts.clean_prob, &whole.clean_prob),
                ("soft_label", &parts.soft_label, &whole.soft_label),
                ("statistic", &parts.statistic, &whole.statistic),
                ("similarity", &parts.similarity, &whole.similarity),
            ] {
                assert_eq!(a.len(), b.len(), "{name} {what}");
                let differ: Vec<usize> = (0..a.len())
                    .filter(|&i| a[i].to_bits() != b[i].to_bits())
                    .collect();
                assert!(
                    differ.is_empty(),
                    "{name} {what}: {} differ, {:?}: {} vs {}",
                    differ.len(),
                    differ,
                    a[differ[0]],
                    b[differ[0]]
                );
            }
            // The second block alone under index 0 is shuffled differently:
            // the index is what the part keeps.
            let b = blocks.blocks()[1];
            let range = b.start * 6..(b.start + b.len) * 6;
            let piece = crate::test_support::embedding_pairs(
                img[range.clone()].to_vec(),
                txt[range].to_vec(),
                6,
            );
            let wrong = p.score_blocks(
                &piece,
                &ScoreBlocks::part(crate::scoring::ScoreBlock { index: 0, ..b }),
                &mut Silent,
            )?;
            assert_ne!(
                wrong.statistic,
                whole.statistic[b.start..].to_vec(),
                "{name}"
            );
        }
        Ok(())
    }
}
