//! Encoders and matching heads for ncclean.
//!
//! Everything trainable is built on [`params::ParamStore`], which initialises
//! parameters from a seed so that runs are reproducible on CPU.

mod bert_cpu;
pub mod bert_text;
pub mod clip_tower;
#[cfg(feature = "cuda")]
mod depthwise_cuda;
pub mod frozen_matmul;
pub mod gpo;
pub mod hash;
pub mod hf_dir;
pub mod inputs;
pub mod layers;
pub mod mobilenet_v2;
pub mod model;
pub mod packed_linear;
pub mod params;
pub mod preprocess;
pub mod rng;
pub mod simd;
pub mod synthetic;
pub mod vocab;

pub use inputs::{
    ImageBatch, ImageInputs, LocalBatch, LocalFeatures, PairInputs, TextBatch, TextInputs,
};
pub use model::{
    similarity, ImageTowerConfig, LocalOptions, MatchingModel, ModelConfig, Pooling,
    TextTowerConfig,
};
pub use params::ParamStore;
