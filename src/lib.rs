//! ncclean: find and clean mismatched image–caption pairs.
//!
//! The binary is a thin layer over this library: [`data`] reads and writes
//! parquet, [`engine`] trains and scores through one code path, and the
//! method math lives in the `ncclean-pipelines` crate.

pub mod build_info;
pub mod checkpoint;
pub mod cli;
pub mod corrupt;
pub mod cuda_libs;
pub mod data;
pub mod demo;
pub mod device;
pub mod encoders;
pub mod engine;
pub mod error;
pub mod features;
pub mod gpu_check;
pub mod hex;
pub mod images;
pub mod interrupt;
pub mod metrics;
pub(crate) mod parallel;
pub mod progress;
pub mod report;
pub mod retrieval;
pub mod run_inputs;
pub mod rundir;
pub mod sample;
pub mod shards;
pub mod signal;
pub mod small_file;
pub mod temp;
pub mod threads;
pub mod threshold;
pub mod towers;

pub use error::{Error, Result};
