//! `ncclean gpu-check` (hidden): parity, decode and tower throughput, and
//! training speed on a GPU, as JSON. `scripts/gpu_check.sh` drives it.

use std::path::PathBuf;

use clap::Args;

use crate::error::{Error, Result};
use crate::runtime::progress::Reporter;

/// Measure a GPU machine (issue #13); writes one JSON document.
#[derive(Debug, Args)]
pub struct GpuCheckArgs {
    /// Where the JSON report is written.
    #[arg(long, value_name = "FILE")]
    pub json: PathBuf,
    /// Measure the CPU instead of a CUDA device (exercises the logic without a GPU).
    #[arg(long)]
    pub cpu_only: bool,
    /// Small sizes everywhere: seconds instead of minutes (CI).
    #[arg(long)]
    pub quick: bool,
    /// The CUDA device under test (ignored with --cpu-only).
    #[arg(long, default_value = "cuda:0")]
    pub device: String,
    /// MobileNetV2 model.safetensors for parity (default: ../shared/models/mobilenet_v2/model.safetensors).
    #[arg(long, value_name = "FILE")]
    pub mobilenet: Option<PathBuf>,
    /// MiniLM directory for parity (default: scripts/fetch_minilm.sh's cache).
    #[arg(long, value_name = "DIR")]
    pub minilm: Option<PathBuf>,
}

/// Run `ncclean gpu-check`.
pub fn run(a: GpuCheckArgs, rep: &Reporter) -> Result<()> {
    let chosen = crate::runtime::device::choose(if a.cpu_only { "cpu" } else { &a.device })?;
    if !a.cpu_only && !chosen.device.is_cuda() {
        return Err(Error::Usage(format!(
            "gpu-check needs a CUDA device ({}); pass --cpu-only to check the logic on the CPU",
            chosen.line
        )));
    }
    rep.info(&chosen.line);
    crate::runtime::gpu_check::check_to_file(
        chosen,
        a.quick,
        (a.mobilenet, a.minilm),
        &a.json,
        &|m| rep.info(m),
    )
}
