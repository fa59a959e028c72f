//! The named random streams of a run and the embedding chunk size: the
//! leaf every method, the scoring passes and the runner share. It imports
//! nothing of the crate, so a method never reaches into the runner for them.

use ncclean_models::rng::Rng;

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
///   ([`Streams::score`]); it shuffles the first block of every shard, and
///   `score-shuffles-block-{b}` the block `b` ≥ 1 of a shard
///   ([`Streams::score_block`], [`crate::scoring::ScoreBlocks`]).
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

    /// The scoring shuffles of block `b` of a shard. Block 0 uses
    /// [`Streams::score`], so data of one block scores as it did before
    /// scoring was cut into blocks.
    pub fn score_block(&self, b: usize) -> Rng {
        if b == 0 {
            self.score()
        } else {
            self.named(&format!("score-shuffles-block-{b}"))
        }
    }

    /// Any other stream, by name.
    pub fn named(&self, name: &str) -> Rng {
        Rng::derive(self.seed, name)
    }
}
