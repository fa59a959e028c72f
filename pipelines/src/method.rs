//! What differs between noisy-correspondence papers, as one trait.
//!
//! A [`Method`] holds a paper's parameters, label state and math; the
//! [`crate::runner::Runner`] owns everything around it (networks and
//! co-teaching, learning-rate schedule, seed streams, batching, progress,
//! the final division, scoring and checkpoint state). Each epoch the runner
//!
//! 1. re-initialises a network whose [`Method::init_seed`] changed (CRCL's
//!    self-refining pieces) and sets the learning rate ([`Method::lr_at`]);
//! 2. during warm-up trains every network on every pair with
//!    [`Method::warmup_loss`]; otherwise asks [`Method::plan`] which pairs each
//!    network trains on (the division, labels for the losses);
//! 3. for each network `k`: [`Method::start_net`], one optimiser step per
//!    shuffled batch on [`Method::batch_loss`], [`Method::end_net`];
//! 4. reports [`crate::EpochStats`].
//!
//! Scoring is one [`Method::score_pass`] over the data with the fixed scoring
//! stream, a mixture on [`Method::statistic`] of the pass (fitted by the
//! runner after training, or refitted on request), and [`Method::scores`].

use candle_core::Tensor;
use ncclean_models::rng::Rng;
use ncclean_models::{ModelConfig, PairInputs};

use crate::clean_model::null::NullSink;
use crate::config::TrainConfig;
use crate::division::CleanSide;
use crate::error::Result;
use crate::fused_head::HeadLoss;
use crate::losses::per_sample_hinge;
use crate::net::Net;
use crate::pipeline::PairScores;
use crate::scoring::{ScoreBlocks, Shuffles, Ticks};
use crate::streams::Streams;

/// The pairs each network trains on in one epoch, and what the epoch log says.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Training pairs of every network, one list per network.
    pub train: Vec<Vec<usize>>,
    /// Phase name for logs and progress ("warmup", "train", ...).
    pub phase: String,
    /// Fraction of pairs the division called clean, if known before training
    /// (else [`Method::finish_epoch`] may report it).
    pub clean_fraction: Option<f64>,
}

impl Plan {
    /// Every network trains on all `n` pairs.
    pub fn all(n: usize, networks: usize, phase: &str) -> Plan {
        Plan {
            train: vec![(0..n).collect(); networks],
            phase: phase.to_string(),
            clean_fraction: None,
        }
    }
}

/// What a method sees when it plans an epoch.
pub struct EpochCtx<'a> {
    /// 0-based epoch.
    pub epoch: usize,
    /// The run's configuration.
    pub cfg: &'a TrainConfig,
    /// The networks, as trained so far.
    pub nets: &'a [Net],
    /// The training pairs.
    pub data: &'a PairInputs,
    /// The epoch's own stream ([`Streams::epoch`]). A single-network
    /// method draws its division shuffles from it; the runner then draws the
    /// batch order from what is left of it.
    pub rng: &'a mut Rng,
    /// Named seed streams of the run.
    pub streams: &'a Streams,
}

/// One training batch of one network.
pub struct Batch<'a> {
    /// 0-based epoch.
    pub epoch: usize,
    /// Which network trains (index into the runner's networks).
    pub k: usize,
    /// That network.
    pub net: &'a Net,
    /// The training pairs.
    pub data: &'a PairInputs,
    /// The pairs of this batch.
    pub idx: &'a [usize],
    /// The run's configuration.
    pub cfg: &'a TrainConfig,
}

/// What a method sees when it scores a dataset.
pub struct ScoreCtx<'a> {
    /// The trained networks.
    pub nets: &'a [Net],
    /// The pairs to score.
    pub data: &'a PairInputs,
    /// The run's configuration.
    pub cfg: &'a TrainConfig,
    /// Named seed streams; scoring shuffles come from
    /// [`Streams::score_block`] through [`ScoreCtx::shuffles`].
    pub streams: &'a Streams,
    /// The blocks `data` is scored in (see [`crate::scoring`]).
    pub blocks: &'a ScoreBlocks,
    /// Refit the method's own auxiliary mixtures on `data` instead of using
    /// the stored ones (the runner refits its division itself).
    pub refit: bool,
    /// Where the pass reports its progress.
    pub ticks: Ticks<'a>,
    /// Where the pass hands each network's caption embeddings for the
    /// clean model's caption null ([`crate::clean_model::null`]), when the
    /// checkpoint has one: the pass embeds every caption anyway, so score
    /// does not embed them a second time for it.
    pub null: Option<&'a NullSink<'a>>,
}

impl ScoreCtx<'_> {
    /// The block-local shuffles every scoring statistic is computed with.
    pub fn shuffles(&self) -> Shuffles<'_> {
        Shuffles::Blocks(self.blocks, self.streams, self.ticks)
    }

    /// Hand network `k`'s caption embeddings of every pair (`[n, dim]`,
    /// the data's order; network 0 first) to the caption null, if any.
    pub fn caption_null(&self, k: usize, captions: &Tensor) -> Result<()> {
        match self.null {
            Some(sink) => sink.add(k, captions),
            None => Ok(()),
        }
    }
}

/// A noisy-correspondence method: only what its paper defines.
///
/// See the crate documentation for the recipe to add one.
pub trait Method: Sized {
    /// Name on the command line (also the registry key).
    const NAME: &'static str;

    /// Per-pair statistics of one scoring pass: the division statistic and
    /// whatever the soft label needs.
    type Pass;

    /// Parse and validate the method's parameters (`cfg.params`); errors are
    /// [`crate::Error::Config`] and name the key.
    fn new(cfg: &TrainConfig, model: &ModelConfig) -> Result<Self>;

    /// Number of networks (co-teaching when 2).
    fn networks(&self) -> usize {
        1
    }

    /// Epochs `fit` runs, warm-up included.
    fn total_epochs(&self, cfg: &TrainConfig) -> usize {
        cfg.epochs
    }

    /// Learning rate at `epoch`.
    fn lr_at(&self, cfg: &TrainConfig, epoch: usize) -> f64 {
        cfg.lr_at(epoch)
    }

    /// Initialisation seed of network `k` at `epoch`. When it differs from
    /// the seed the network was built with, the runner re-initialises the
    /// network and its optimiser before the epoch.
    fn init_seed(&self, streams: &Streams, k: usize, _epoch: usize) -> u64 {
        streams.init(k)
    }

    /// A stream of its own for network `k`'s batch order in `epoch`; `None`
    /// takes the runner's ([`Streams`]: the epoch stream for one network,
    /// `epoch-{e}-batches-net{k}` for co-taught ones).
    fn batch_stream(&self, _streams: &Streams, _epoch: usize, _k: usize) -> Option<Rng> {
        None
    }

    /// Whether the epochs before `warmup_epochs` are a warm-up on all pairs
    /// with [`Method::warmup_loss`]; methods without one ignore the key.
    fn has_warmup(&self) -> bool {
        true
    }

    /// Loss of one warm-up batch: by default the mean NCR per-sample hinge.
    fn warmup_loss(&mut self, b: &Batch) -> Result<Tensor> {
        let s = b.net.batch_similarity(b.data, b.idx)?;
        Ok(per_sample_hinge(&s, b.cfg.margin)?.mean_all()?)
    }

    /// Which pairs every network trains on this (post-warm-up) epoch; the
    /// method keeps whatever its losses need (labels, clean sets).
    fn plan(&mut self, ctx: &mut EpochCtx) -> Result<Plan>;

    /// Before network `k`'s batches of this epoch.
    fn start_net(&mut self, _k: usize, _n: usize) {}

    /// Loss of one training batch (mean over the batch).
    fn batch_loss(&mut self, b: &Batch) -> Result<Tensor>;

    /// This batch's loss ([`Method::warmup_loss`] when `warmup`, else
    /// [`Method::batch_loss`]) as one the fused CPU step implements
    /// ([`crate::fused_head`]), or None (the default) to train through
    /// autograd on the tensor those return. A method that names one must
    /// mean exactly its tensor's loss: the runner then trains a network
    /// that can ([`crate::net::Net::fuses`]) with it, without calling them.
    fn fused_loss(&self, _b: &Batch, _warmup: bool) -> Option<HeadLoss> {
        None
    }

    /// After network `k`'s batches of this epoch (label updates from the
    /// statistics collected during the pass).
    fn end_net(&mut self, _k: usize, _cfg: &TrainConfig) -> Result<()> {
        Ok(())
    }

    /// After every network trained: the clean fraction, for methods that
    /// know it only once the epoch's label updates are done.
    fn finish_epoch(&mut self, _cfg: &TrainConfig, _n: usize) -> Option<f64> {
        None
    }

    /// Which component of the division mixture is clean.
    fn clean_side(&self) -> CleanSide;

    /// One pass over `ctx.data` without gradients, reporting every pair
    /// of each of its passes to `ctx.ticks`.
    fn score_pass(&self, ctx: &ScoreCtx) -> Result<Self::Pass>;

    /// How many passes over the pairs [`Method::score_pass`] reports to
    /// its ticks, for the progress bar: by default each network's
    /// embedding pass and its `division_shuffles` shuffled batchings.
    fn score_passes(&self, cfg: &TrainConfig, networks: usize) -> usize {
        networks * (1 + cfg.division_shuffles.max(1))
    }

    /// The statistic of a pass that the division mixture is fitted on.
    fn statistic(pass: &Self::Pass) -> &[f32];

    /// Keep what the final pass fitted besides the runner's division (GSC's
    /// per-network mixtures). Called once, after training.
    fn keep_fitted(&mut self, _pass: &Self::Pass) {}

    /// Per-pair results from a pass and the clean probabilities of its
    /// statistic.
    fn scores(&self, pass: Self::Pass, clean_prob: Vec<f32>, cfg: &TrainConfig) -> PairScores;

    /// Method state for checkpoints (mixtures, counters), as JSON.
    fn state(&self) -> serde_json::Value {
        serde_json::Value::Null
    }

    /// Restore what [`Method::state`] returned.
    fn load_state(&mut self, _state: &serde_json::Value) -> Result<()> {
        Ok(())
    }

    /// The per-pair label arrays a resumed run must find again, by checkpoint
    /// name, aligned with the training pairs. They are lent mutably because
    /// the runner both saves them and, on resume, writes them back (an array
    /// the checkpoint lacks is left as it is).
    fn pair_arrays(&mut self) -> Vec<(String, PairArray<'_>)> {
        Vec::new()
    }
}

/// One per-pair array of a method's label state, as lent to the runner.
pub enum PairArray<'a> {
    /// Values (soft or momentum labels), saved as they are.
    Values(&'a mut Vec<f32>),
    /// Flags (a clean set), saved as 0 and 1 and read back as `> 0.5`.
    Flags(&'a mut Vec<bool>),
}

impl PairArray<'_> {
    /// The array as checkpoints store it.
    pub fn to_values(&self) -> Vec<f32> {
        match self {
            PairArray::Values(v) => v.to_vec(),
            PairArray::Flags(f) => f.iter().map(|&c| if c { 1.0 } else { 0.0 }).collect(),
        }
    }

    /// Replace the array with what a checkpoint stored.
    pub fn restore(self, saved: Vec<f32>) {
        match self {
            PairArray::Values(v) => *v = saved,
            PairArray::Flags(f) => *f = saved.iter().map(|&c| c > 0.5).collect(),
        }
    }
}
