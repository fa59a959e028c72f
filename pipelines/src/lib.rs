//! Noisy-correspondence learning pipelines for ncclean.
//!
//! A [`pipeline::Pipeline`] trains one or more matching networks on pairs
//! that may be mismatched and scores every pair. Pipelines know nothing of
//! files: the engine in the `ncclean` crate hands them in-memory inputs.

pub mod batches;
pub mod config;
pub mod crcl;
pub mod division;
pub mod esc;
pub mod gsc;
pub mod losses;
pub mod net;
pub mod pipeline;
pub mod recon;
pub mod scoring;
#[cfg(test)]
mod test_support;
pub mod vanilla;

use candle_core::{Device, Result};
use ncclean_models::ModelConfig;

pub use config::{TrainConfig, METHODS};
pub use pipeline::{EpochStats, Observer, PairScores, Pipeline, Silent};

/// Build the pipeline for `method`.
pub fn build(
    method: &str,
    cfg: TrainConfig,
    model: &ModelConfig,
    seed: u64,
    device: &Device,
) -> Result<Box<dyn Pipeline>> {
    match method {
        "vanilla" => Ok(Box::new(vanilla::Vanilla::new(cfg, model, seed, device)?)),
        "esc" => esc::build(cfg, model, seed, device),
        "gsc" => gsc::build(cfg, model, seed, device),
        "crcl" => crcl::build(cfg, model, seed, device),
        "recon" => recon::build(cfg, model, seed, device),
        other => candle_core::bail!(
            "unknown method {other:?}; available: {}",
            METHODS.join(", ")
        ),
    }
}
