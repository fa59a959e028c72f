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
//! # Module order
//!
//! Each layer imports only the ones before it, so no module cycle remains
//! (test modules may reach higher, to run a method end to end):
//!
//! 1. leaves: [`error`], [`params`], [`streams`] (the named seed streams and
//!    `EMBED_CHUNK`), [`batches`], [`adam`], [`division`], [`losses`],
//!    [`batch_stats`], [`frozen_rows`], then [`config`] (the [`TrainConfig`]
//!    type and `--set` parsing) and [`net`];
//! 2. [`scoring`], [`pipeline`], [`clean_model`], then the
//!    [`method::Method`] trait;
//! 3. [`methods`]: one file per method, over the layers above;
//! 4. [`runner`]: the loop any method runs in;
//! 5. [`registry`]: the table of methods (each row names its file's type
//!    and `runner::build`);
//! 6. [`presets`]: a method's configuration resolved from its registry row
//!    (preset, user file, flags) and the matching head it needs.
//!
//! # Adding a method
//!
//! A new method touches exactly four places (never [`runner`], [`config`]
//! or [`presets`]):
//!
//! 1. **One file with its math**, `src/methods/<name>.rs` (and its
//!    `pub mod` line in `src/methods/mod.rs`): the paper's losses and
//!    label rules as free functions over batch similarity matrices (with
//!    hand-computed unit tests), a params struct parsed from `[params]`
//!    (`TrainConfig::method_params`, `deny_unknown_fields`, a `validate`
//!    built from [`params`]' range checks), and `impl Method`:
//!    `new` (parse and validate), `plan` (the epoch's division: which pairs
//!    each network trains on, keeping the labels the loss needs),
//!    `batch_loss`, `clean_side`, `score_pass` (the division statistic of a
//!    whole dataset in the block-local shuffles of `ScoreCtx::shuffles`; hand
//!    each network's caption embeddings to `ScoreCtx::caption_null`, or the
//!    clean model embeds the captions a second time), `statistic` and
//!    `scores`. Override the hooks only where the paper differs: `networks`
//!    (co-teaching), `has_warmup` / `warmup_loss`, `lr_at`, `init_seed`
//!    (re-initialisation), `start_net` / `end_net` / `finish_epoch` (label
//!    updates from the training pass), `keep_fitted`, and `state` /
//!    `load_state` / `pair_arrays` for label state. Shared math is in
//!    [`losses`] (hinge, soft margin, `p_i`, InfoNCE) and [`scoring`]
//!    (shuffled-batch statistics, `divide`), seed streams in [`streams`]
//!    (never new names for existing draws: they fix every label). The file
//!    imports only those leaf modules, never the runner or the registry. The
//!    module doc lists where the method departs from its paper.
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
pub mod division;
pub mod error;
pub mod frozen_rows;
pub mod fused_head;
pub mod host;
pub mod losses;
pub mod method;
pub mod methods;
pub mod net;
pub mod params;
pub mod pipeline;
pub mod presets;
pub mod registry;
pub mod runner;
pub mod scoring;
pub mod streams;
#[cfg(test)]
mod test_support;

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
