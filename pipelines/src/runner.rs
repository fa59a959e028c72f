//! The training and scoring loop every method runs in.
//!
//! [`Runner`] owns the networks (co-taught ones in order), the learning-rate
//! schedule, the seed streams, batching and progress, the final division,
//! scoring with the stored or a refitted division, and checkpoint state; a
//! [`Method`] supplies only its paper's math. `Runner<M>` is the
//! [`Pipeline`] the engine drives.

use candle_core::{Device, Tensor};
use candle_nn::VarMap;
use ncclean_models::rng::Rng;
use ncclean_models::{ModelConfig, PairInputs};

use crate::batches::shuffled_batches;
use crate::config::TrainConfig;
use crate::division::Division;
use crate::error::{Error, Result};
use crate::method::{Batch, EpochCtx, Method, Plan, ScoreCtx};
use crate::net::Net;
use crate::pipeline::{EpochStats, Observer, PairScores, Pipeline};

/// Pairs embedded per forward pass when a whole dataset is embedded without
/// gradients (scoring, division passes, retrieval).
pub const EMBED_CHUNK: usize = 512;

/// The named random streams of a run, all derived from its seed.
///
/// Every random choice has its own stream, so adding a draw somewhere does
/// not shift the others and a seed fixes the whole run. The names are part
/// of the output: changing one changes every label the run writes.
///
/// - `{method}-net{k}-init` (k ≥ 1): initial weights of network k; network 0
///   uses the run seed itself ([`Streams::init`]);
/// - `epoch-{e}`: the division shuffles and then the batch order of a
///   single-network method ([`Streams::epoch`]);
/// - `epoch-{e}-division-net{k}` and `epoch-{e}-batches-net{k}`: the same
///   for network k of co-taught methods ([`Streams::division`],
///   [`Streams::batches`]);
/// - `score-shuffles`: the shuffles of every scoring pass, identical for all
///   networks so `fit`'s labels and `ncclean score` see the same batches
///   ([`Streams::score`]).
///
/// Two methods keep names from before this scheme, so that their outputs
/// did not move: CRCL's piece initialisation `piece-{p}` and GSC's batch
/// order `gsc-epoch-{e}-net{k}` (through [`Streams::named`]).
#[derive(Debug, Clone)]
pub struct Streams {
    seed: u64,
    method: &'static str,
}

impl Streams {
    /// The streams of a run of `method` with `seed`.
    pub fn new(seed: u64, method: &'static str) -> Streams {
        Streams { seed, method }
    }

    /// The run seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Initialisation seed of network `k`.
    pub fn init(&self, k: usize) -> u64 {
        if k == 0 {
            self.seed
        } else {
            self.named(&format!("{}-net{k}-init", self.method))
                .next_u64()
        }
    }

    /// The stream of epoch `e`.
    pub fn epoch(&self, e: usize) -> Rng {
        self.named(&format!("epoch-{e}"))
    }

    /// Division shuffles of network `k` in epoch `e`.
    pub fn division(&self, e: usize, k: usize) -> Rng {
        self.named(&format!("epoch-{e}-division-net{k}"))
    }

    /// Batch order of network `k` in epoch `e`.
    pub fn batches(&self, e: usize, k: usize) -> Rng {
        self.named(&format!("epoch-{e}-batches-net{k}"))
    }

    /// The scoring shuffles (fresh for every network and every pass).
    pub fn score(&self) -> Rng {
        self.named("score-shuffles")
    }

    /// Any other stream, by name.
    pub fn named(&self, name: &str) -> Rng {
        Rng::derive(self.seed, name)
    }
}

/// The error of scoring before any division was fitted.
pub fn not_fitted() -> Error {
    Error::State("this pipeline has no fitted division; run fit first".into())
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
    /// Epochs trained so far.
    epochs_done: usize,
    method: M,
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
            epochs_done: 0,
            method,
        })
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
                self.net_seeds[k] = s;
            }
        }
        Ok(())
    }

    fn pass(&self, data: &PairInputs, refit: bool) -> Result<M::Pass> {
        self.method.score_pass(&ScoreCtx {
            nets: &self.nets,
            data,
            cfg: &self.cfg,
            streams: &self.streams,
            refit,
        })
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
            let mut total = 0f64;
            for idx in &batches {
                let b = Batch {
                    epoch,
                    k,
                    net: &self.nets[k],
                    data,
                    idx,
                    cfg: &self.cfg,
                };
                let l = if warmup {
                    self.method.warmup_loss(&b)?
                } else {
                    self.method.batch_loss(&b)?
                };
                total += f64::from(l.to_scalar::<f32>()?);
                self.nets[k].step(&l)?;
                obs.advance(1);
            }
            if !warmup {
                self.method.end_net(k, &self.cfg)?;
            }
            loss += total / batches.len().max(1) as f64;
        }
        obs.finish();
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

    fn finalize(&mut self, data: &PairInputs, obs: &mut dyn Observer) -> Result<()> {
        obs.start("final division", 1);
        let pass = self.pass(data, true)?;
        self.division = Some(Division::fit(
            M::statistic(&pass),
            self.cfg.mixture,
            self.method.clean_side(),
        ));
        self.method.keep_fitted(&pass);
        obs.advance(1);
        obs.finish();
        Ok(())
    }

    fn score(&self, data: &PairInputs, refit: bool, obs: &mut dyn Observer) -> Result<PairScores> {
        obs.start("scoring", 1);
        let stored = match (&self.division, refit) {
            (_, true) => None,
            (Some(d), false) => Some(d),
            (None, false) => return Err(not_fitted()),
        };
        let pass = self.pass(data, refit)?;
        let stat = M::statistic(&pass);
        let clean_prob = match stored {
            Some(d) => d.clean_prob(stat),
            None => {
                Division::fit(stat, self.cfg.mixture, self.method.clean_side()).clean_prob(stat)
            }
        };
        let scores = self.method.scores(pass, clean_prob, &self.cfg);
        obs.advance(1);
        obs.finish();
        Ok(scores)
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

    fn state(&self) -> serde_json::Value {
        serde_json::json!({
            "division": self.division,
            "net_seeds": self.net_seeds,
            "epochs_done": self.epochs_done,
            "method": self.method.state(),
        })
    }

    fn pair_state(&self) -> Vec<(String, Vec<f32>)> {
        self.method.pair_state()
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
        self.method.load_state(&state["method"], &pairs)
    }
}
