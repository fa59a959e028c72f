//! ncclean: find and clean mismatched image–caption pairs.
//!
//! The binary is a thin layer over this library, and the method math lives
//! in the `ncclean-pipelines` crate. Rows flow through the folders in this
//! order (ARCHITECTURE.md walks the whole flow):
//!
//! - [`cli`]: the command line, one module per subcommand;
//! - [`data`]: parquet and webdataset in and out: columns, rows, images,
//!   sampling, keys, labels and filtered output;
//! - [`towers`]: the frozen towers: which to use, which are installed, and
//!   their cached features;
//! - `engine` (private to the crate): rows to trained pipelines and per-pair labels: prepare,
//!   fit, the checkpoint-backed engine, streaming, filter joins;
//! - [`curation`]: which pairs count as clean: threshold rules and cuts, the
//!   division check, detection and retrieval metrics;
//! - [`run`]: the run directory: its commit protocol, run.json and the
//!   recorded inputs, checkpoints, shard markers;
//! - [`report`]: the HTML report of a run;
//! - [`synth`]: synthetic data: the demo dataset and noise injection with
//!   ground truth;
//! - [`runtime`]: the process around the work: device, threads, progress,
//!   interrupts, build info, CUDA libraries, the GPU check, and leaf helpers
//!   (temporaries for atomic outputs, small-file reads, hex digests);
//! - [`error`]: errors and the exit codes they map to.

pub mod cli;
pub mod curation;
pub mod data;
pub(crate) mod engine;
pub mod error;
pub mod report;
pub mod run;
pub mod runtime;
pub mod synth;
pub mod towers;

pub use error::{Error, Result};
