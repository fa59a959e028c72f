//! The contract between the engine and a method.
//!
//! The engine owns data, device, checkpoints and progress; a pipeline owns its
//! method's networks, label state and math. `score` is the one function that
//! turns a trained pipeline and a set of pairs into per-pair results: `fit`
//! ends by calling it, and `ncclean score` calls it on new data.

use std::collections::HashMap;

use candle_core::Tensor;
use candle_nn::VarMap;
use ncclean_models::PairInputs;
use serde::{Deserialize, Serialize};

use crate::error::Result;

/// Per-pair results of scoring, aligned with the scored pairs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PairScores {
    /// P(pair is matched), from the method's division statistic.
    pub clean_prob: Vec<f32>,
    /// The method's rectified correspondence label in [0, 1].
    pub soft_label: Vec<f32>,
    /// Similarity S_ii of the pair under the trained model(s).
    pub similarity: Vec<f32>,
    /// The raw division statistic fed to the mixture model.
    pub statistic: Vec<f32>,
}

/// What one epoch did, for logs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EpochStats {
    /// 0-based epoch in code; written 1-based (as people count, and as the
    /// text log shows it) wherever it is serialised: JSON logs, stats.json,
    /// checkpoints.
    #[serde(with = "one_based")]
    pub epoch: usize,
    /// Phase name (e.g. "warmup", "train").
    pub phase: String,
    /// Mean training loss.
    pub loss: f64,
    /// Fraction of pairs the division called clean (None during warm-up).
    pub clean_fraction: Option<f64>,
    /// Pairs trained on.
    pub pairs: usize,
}

/// Serialises a 0-based index as 1-based and back.
mod one_based {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(i: &usize, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(*i as u64 + 1)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
        let n = u64::deserialize(d)?;
        n.checked_sub(1)
            .map(|i| i as usize)
            .ok_or_else(|| serde::de::Error::custom("epochs count from 1"))
    }
}

/// Receives progress from long-running pipeline work (batches within an epoch,
/// scoring passes). The engine turns it into bars or log lines.
pub trait Observer {
    /// A stage with `total` units starts.
    fn start(&mut self, stage: &str, total: u64);
    /// `n` units of the current stage are done.
    fn advance(&mut self, n: u64);
    /// The current stage is over.
    fn finish(&mut self);
    /// Whether the user asked to stop: checked after every batch, and a
    /// true answer ends the work with [`crate::Error::Interrupted`].
    fn cancelled(&self) -> bool {
        false
    }
}

/// An observer that ignores everything.
pub struct Silent;

impl Observer for Silent {
    fn start(&mut self, _stage: &str, _total: u64) {}
    fn advance(&mut self, _n: u64) {}
    fn finish(&mut self) {}
}

/// A trained or trainable method, as the engine drives it. The one
/// implementation is [`crate::runner::Runner`]; methods implement
/// [`crate::method::Method`].
pub trait Pipeline {
    /// Method name as on the command line.
    fn method(&self) -> &'static str;
    /// Number of epochs `fit` runs (warm-up included).
    fn total_epochs(&self) -> usize;
    /// Train one epoch.
    fn run_epoch(
        &mut self,
        epoch: usize,
        data: &PairInputs,
        obs: &mut dyn Observer,
    ) -> Result<EpochStats>;
    /// After the last epoch: fit the division that `score` reuses, on the
    /// statistic of the scoring pass (`shards` as in [`Pipeline::score`]).
    fn finalize(
        &mut self,
        data: &PairInputs,
        shards: &[usize],
        obs: &mut dyn Observer,
    ) -> Result<()>;
    /// Per-pair results. `data` is the concatenation of shards holding
    /// `shards[i]` pairs each: in-batch statistics are computed within
    /// blocks of a shard ([`crate::scoring::ScoreBlocks`]), so a pair's result
    /// does not depend on the other shards scored with it. With `refit`, the
    /// division is refitted on `data` instead of reusing the trained mixture.
    fn score(
        &self,
        data: &PairInputs,
        shards: &[usize],
        refit: bool,
        obs: &mut dyn Observer,
    ) -> Result<PairScores>;
    /// [`Pipeline::score`] of pairs cut into `blocks` by the caller, with the
    /// trained mixture (no refit): a caller streaming a large file scores
    /// one block at a time ([`crate::scoring::ScoreBlocks::part`]) and gets
    /// the results that scoring the whole file at once gives those pairs.
    fn score_blocks(
        &self,
        data: &PairInputs,
        blocks: &crate::scoring::ScoreBlocks,
        obs: &mut dyn Observer,
    ) -> Result<PairScores>;
    /// Joint-space embeddings `(images, captions)` of every pair, one entry
    /// per network (co-taught networks are averaged by the caller: at
    /// inference their similarity matrices are averaged). Used for retrieval.
    fn embed(&self, data: &PairInputs) -> Result<Vec<(Tensor, Tensor)>>;
    /// Named parameter sets (`net0`, `net1`, ...) for checkpoints.
    fn weights(&self) -> Vec<(String, &VarMap)>;
    /// Mutable parameter sets, to load a checkpoint into.
    fn weights_mut(&mut self) -> Vec<(String, &mut VarMap)>;
    /// Optimiser state of every network (`net{k}.m.<param>`,
    /// `net{k}.v.<param>`, and the step count `net{k}.steps`), for a
    /// checkpoint that training resumes from.
    fn optimizer_state(&self) -> Vec<(String, Tensor)>;
    /// Restore what [`Pipeline::optimizer_state`] returned.
    fn load_optimizer_state(&mut self, tensors: &HashMap<String, Tensor>) -> Result<()>;
    /// Method state (mixture parameters, counters) as JSON.
    fn state(&self) -> serde_json::Value;
    /// Per-pair label state (arrays aligned with the training pairs);
    /// `&mut` because the method lends the same arrays to save and restore.
    fn pair_state(&mut self) -> Vec<(String, Vec<f32>)>;
    /// Restore what [`Pipeline::state`] and [`Pipeline::pair_state`] returned.
    fn load_state(
        &mut self,
        state: &serde_json::Value,
        pairs: Vec<(String, Vec<f32>)>,
    ) -> Result<()>;
}

#[cfg(test)]
mod epoch_stats_tests {
    use super::*;

    #[test]
    fn epochs_are_written_one_based_and_read_back() {
        let s = EpochStats {
            epoch: 0,
            phase: "warmup".into(),
            loss: 0.5,
            clean_fraction: None,
            pairs: 3,
        };
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["epoch"], 1);
        let back: EpochStats = serde_json::from_value(v).unwrap();
        assert_eq!(back.epoch, 0);
        let zero = serde_json::json!({"epoch": 0, "phase": "x", "loss": 0.0, "clean_fraction": null, "pairs": 0});
        assert!(serde_json::from_value::<EpochStats>(zero).is_err());
    }
}
