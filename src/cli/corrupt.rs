//! `ncclean corrupt`: inject synthetic noise with ground truth.

use std::path::PathBuf;

use clap::Args;

use crate::error::{Error, Result};
use crate::runtime::progress::Reporter;
use crate::synth::corrupt::{Noise, NoiseMode};

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

pub fn run(a: CorruptArgs, rep: &Reporter) -> Result<()> {
    if !(0.0..=1.0).contains(&a.rate) || a.rate.is_nan() {
        return Err(Error::Usage(format!(
            "--rate must be between 0 and 1, got {}",
            a.rate
        )));
    }
    if a.mode != NoiseMode::Mixed && a.hard_fraction.is_some() {
        return Err(Error::Usage(format!(
            "--hard-fraction only applies to --mode mixed (got --mode {})",
            a.mode.name()
        )));
    }
    let input = a.data.open()?;
    let files: Vec<PathBuf> = input.files.iter().map(|f| f.path.clone()).collect();
    crate::run::dir::check_not_an_input(&a.out, &files, "--out")?;
    let noise = Noise {
        rate: a.rate,
        seed: a.seed,
        mode: a.mode,
        hard_fraction: a.hard_fraction.unwrap_or(0.5),
    };
    let s = crate::synth::corrupt::corrupt(&input, &noise, &a.out)?;
    rep.info(&format!(
        "replaced the images of {} of {} rows ({} noise); {} pairs are now mismatched",
        s.chosen,
        s.rows,
        a.mode.name(),
        s.noisy
    ));
    super::print_summary(&CorruptPrinted {
        out: a.out.display().to_string(),
        rows: s.rows,
        chosen: s.chosen,
        noisy: s.noisy,
    })
}

/// What `corrupt` prints on stdout.
#[derive(serde::Serialize)]
struct CorruptPrinted {
    out: String,
    rows: usize,
    chosen: usize,
    noisy: usize,
}
