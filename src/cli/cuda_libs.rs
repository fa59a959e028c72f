//! `ncclean cuda-libs` (hidden): where this binary finds the NVIDIA driver
//! and the CUDA libraries, and whether they load. Any build can run it (the
//! search is plain Rust), so the search is testable without a GPU, and
//! `scripts/device_check.sh` records it on the GPU machine.

use clap::Args;

use crate::error::Result;
use crate::runtime::progress::Reporter;

/// Say where the CUDA libraries would be loaded from, and load them.
#[derive(Debug, Args)]
pub struct CudaLibsArgs {
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Search, load, and print what was found on stdout. Exit 0 either way:
/// this reports; `--device cuda` is what refuses.
pub fn run(a: CudaLibsArgs, _rep: &Reporter) -> Result<()> {
    let report = crate::runtime::cuda_libs::report();
    if a.json {
        return super::print_summary(&report.printed());
    }
    print!("{}", report.text());
    Ok(())
}
