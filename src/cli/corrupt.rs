//! `ncclean corrupt`: inject synthetic noise with ground truth.

use std::path::PathBuf;

use clap::Args;

use crate::error::{Error, Result};
use crate::progress::Reporter;

use super::DataArgs;

/// Arguments of `ncclean corrupt`.
#[derive(Debug, Args)]
pub struct CorruptArgs {
    #[command(flatten)]
    pub data: DataArgs,
    /// Fraction of pairs whose images are permuted among themselves (0..=1).
    #[arg(long)]
    pub rate: f64,
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
    let input = a.data.open()?;
    let s = crate::corrupt::corrupt(&input, a.rate, a.seed, &a.out)?;
    rep.info(&format!(
        "permuted the images of {} of {} rows; {} pairs are now mismatched",
        s.chosen, s.rows, s.noisy
    ));
    println!(
        "{}",
        serde_json::json!({ "out": a.out.display().to_string(), "rows": s.rows, "chosen": s.chosen, "noisy": s.noisy })
    );
    Ok(())
}
