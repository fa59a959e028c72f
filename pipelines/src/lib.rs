//! Noisy-correspondence learning methods for ncclean.
//!
//! A [`method::Method`] holds one paper's math (parameters, label state,
//! losses, division statistic); the [`runner::Runner`] runs any method
//! (networks and co-teaching, learning-rate schedule, seed streams,
//! batching, progress, final division, scoring, checkpoint state) and is the
//! [`Pipeline`] the engine drives. The [`registry`] is the one table of
//! methods. Pipelines know nothing of files: the engine in the `ncclean`
//! crate hands them in-memory inputs.
//!
//! # Adding a method
//!
//! 1. **One file with its math**, `src/<name>.rs`: the paper's losses and
//!    label rules as free functions over batch similarity matrices (with
//!    hand-computed unit tests), a params struct parsed from `[params]`
//!    (`TrainConfig::method_params`, `deny_unknown_fields`, a `validate`
//!    built from [`params`]' range checks), and `impl Method`:
//!    `new` (parse and validate), `plan` (the epoch's division: which pairs
//!    each network trains on, keeping the labels the loss needs),
//!    `batch_loss`, `clean_side`, `score_pass` (the division statistic of a
//!    whole dataset in the block-local shuffles of `ScoreCtx::shuffles`), `statistic` and
//!    `scores`. Override the hooks only where the paper differs: `networks`
//!    (co-teaching), `has_warmup` / `warmup_loss`, `lr_at`, `init_seed`
//!    (re-initialisation), `start_net` / `end_net` / `finish_epoch` (label
//!    updates from the training pass), `keep_fitted`, and `state` /
//!    `load_state` / `pair_arrays` for label state. Shared math is in
//!    [`losses`] (hinge, soft margin, `p_i`, InfoNCE) and [`scoring`]
//!    (shuffled-batch statistics, `divide`). The module doc lists where the
//!    method departs from its paper.
//! 2. **One registry row** in [`registry::METHODS`]: name, one-line summary
//!    (shown by `ncclean fit --help`), preset, whether its losses need local
//!    features, and `build: runner::build::<YourMethod>`. The CLI's
//!    `--method` choices, config resolution and checkpoint loading read it.
//! 3. **One preset file**, `presets/<name>.toml`: every [`TrainConfig`] key
//!    with the paper's defaults and where each comes from.
//! 4. **One test file**, `tests/method_<name>.rs` at the workspace root: the
//!    CLI fits the method on the demo data, checks detection, and checks
//!    that `score` reproduces `fit`'s labels.
//!
//! `pipelines/tests/custom_method.rs` writes a small method through this
//! recipe (a per-sample hinge + mixture without co-teaching) and runs it.

pub mod adam;
pub mod batch_stats;
pub mod batches;
pub mod clean_model;
pub mod config;
pub mod crcl;
pub mod division;
pub mod error;
pub mod esc;
pub mod frozen_rows;
pub mod gsc;
pub mod losses;
pub mod method;
pub mod net;
pub mod params;
pub mod pipeline;
pub mod recon;
pub mod registry;
pub mod runner;
pub mod scoring;
#[cfg(test)]
mod test_support;
pub mod vanilla;

use candle_core::Device;
use ncclean_models::ModelConfig;

pub use config::{CleanProbSource, TrainConfig};
pub use error::{Error, Result};
pub use method::Method;
pub use pipeline::{EpochStats, Observer, PairScores, Pipeline, Silent};
pub use runner::Runner;

/// Build the pipeline for `method` (looked up in the [`registry`]).
pub fn build(
    method: &str,
    cfg: TrainConfig,
    model: &ModelConfig,
    seed: u64,
    device: &Device,
) -> Result<Box<dyn Pipeline>> {
    (registry::find(method)?.build)(cfg, model, seed, device)
}
