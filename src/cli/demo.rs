//! `ncclean demo`: write a synthetic dataset to try everything on.

use std::path::PathBuf;

use clap::Args;

use crate::error::Result;
use crate::runtime::progress::Reporter;
use crate::synth::demo_files::DemoFiles;

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

/// Run `ncclean demo`: each file's path on stdout once it is written.
pub fn run(a: DemoArgs, rep: &Reporter) -> Result<()> {
    let files = DemoFiles {
        out: a.out,
        pairs: a.pairs,
        seed: a.seed,
        image_size: a.image_size,
        embedding_dim: a.embedding_dim,
        shards: a.shards,
    };
    files.check()?;
    files.write(rep, &mut |path| println!("{}", path.display()))
}
