//! `ncclean demo`: write a synthetic dataset to try everything on.

use std::path::PathBuf;

use clap::Args;

use crate::error::{Error, Result};
use crate::runtime::progress::Reporter;
use crate::synth::demo::{MAX_IMAGE_SIZE, MIN_IMAGE_SIZE};
use crate::synth::demo_files::{DemoFiles, MAX_SHARDS};

/// Arguments of `ncclean demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Output directory; `demo.parquet` is written inside it.
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Number of image–caption pairs.
    #[arg(long, default_value_t = 2000)]
    pub pairs: usize,
    /// Seed; the same seed gives byte-identical data.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Side of the square PNG images, in pixels.
    #[arg(long, default_value_t = 64)]
    pub image_size: u32,
    /// Write an `image_embedding` column of this many floats instead of PNG
    /// images (each attribute adds a fixed random vector, plus noise): data
    /// for scale tests, generated quickly and streamed to disk.
    #[arg(long, value_name = "DIM")]
    pub embedding_dim: Option<usize>,
    /// Split the pairs into this many shards, `demo-00000.parquet`, … (in
    /// order, sizes within one row of each other) instead of `demo.parquet`.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub shards: usize,
}

pub fn run(a: DemoArgs, rep: &Reporter) -> Result<()> {
    if !(MIN_IMAGE_SIZE..=MAX_IMAGE_SIZE).contains(&a.image_size) {
        return Err(Error::Usage(format!(
            "--image-size must be between {MIN_IMAGE_SIZE} and {MAX_IMAGE_SIZE} pixels, got {}",
            a.image_size
        )));
    }
    if a.pairs == 0 {
        return Err(Error::Usage("--pairs must be at least 1".into()));
    }
    if a.shards == 0 || a.shards > a.pairs {
        return Err(Error::Usage(format!(
            "--shards must be between 1 and --pairs ({}), got {}",
            a.pairs, a.shards
        )));
    }
    if a.shards > MAX_SHARDS {
        return Err(Error::Usage(format!(
            "--shards must be at most {MAX_SHARDS} (one file each), got {}",
            a.shards
        )));
    }
    let widest = crate::data::MAX_EMBEDDING_DIM;
    if let Some(d) = a.embedding_dim.filter(|d| !(1..=widest).contains(d)) {
        return Err(Error::Usage(format!(
            "--embedding-dim must be between 1 and {widest} (the widest embedding \
             ncclean reads), got {d}"
        )));
    }
    if a.embedding_dim.is_none() && a.shards > 1 {
        return Err(Error::Usage(
            "--shards needs --embedding-dim (image demo data is written as one file)".into(),
        ));
    }
    let files = DemoFiles {
        out: a.out,
        pairs: a.pairs,
        seed: a.seed,
        image_size: a.image_size,
        embedding_dim: a.embedding_dim,
        shards: a.shards,
    };
    files.write(rep, &mut |path| println!("{}", path.display()))
}
