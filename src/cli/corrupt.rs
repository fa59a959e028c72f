//! `ncclean corrupt`: inject synthetic noise with ground truth.

use std::path::PathBuf;

use clap::Args;

use crate::error::Result;
use crate::runtime::progress::Reporter;
use crate::synth::corrupt::{corrupt_file, Noise, NoiseMode};

use super::DataArgs;

/// Arguments of `ncclean corrupt`.
#[derive(Debug, Args)]
pub struct CorruptArgs {
    #[command(flatten)]
    pub data: DataArgs,
    /// Fraction of pairs to corrupt (0..=1): their images are replaced as
    /// --mode says.
    #[arg(long)]
    pub rate: f64,
    /// Which image replaces a corrupted pair's image. For hard, similarity
    /// is the TF-IDF cosine of the content words of all captions of each
    /// image: no features needed, and independent of the towers that are
    /// then trained.
    #[arg(long, value_enum, default_value_t = NoiseMode::Random)]
    pub mode: NoiseMode,
    /// With --mode mixed: fraction of the corrupted pairs that get hard noise
    /// (0..=1; default 0.5); the rest get random noise.
    #[arg(long)]
    pub hard_fraction: Option<f64>,
    /// Seed of the permutation (recorded in the output's metadata).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Output parquet file: all input columns plus a boolean `noisy` column.
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
}

/// Run `ncclean corrupt`.
pub fn run(a: CorruptArgs, rep: &Reporter) -> Result<()> {
    let noise = Noise::from_flags(a.rate, a.seed, a.mode, a.hard_fraction)?;
    let input = a.data.open()?;
    super::print_summary(&corrupt_file(&input, &noise, &a.out, rep)?)
}
