//! `ncclean gpu-check` (hidden): parity, decode and tower throughput, and
//! training speed on a GPU, as JSON. `scripts/gpu_check.sh` drives it.

use std::path::{Path, PathBuf};

use clap::Args;

use crate::error::{invalid, Error, Result};
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

pub fn run(a: GpuCheckArgs, rep: &Reporter) -> Result<()> {
    let chosen = crate::runtime::device::choose(if a.cpu_only { "cpu" } else { &a.device })?;
    if !a.cpu_only && !chosen.device.is_cuda() {
        return Err(Error::Usage(format!(
            "gpu-check needs a CUDA device ({}); pass --cpu-only to check the logic on the CPU",
            chosen.line
        )));
    }
    rep.info(&chosen.line);
    let scratch = Scratch::new()?;
    let opts = crate::runtime::gpu_check::CheckOptions {
        device_name: chosen
            .line
            .strip_prefix("device: ")
            .unwrap_or(&chosen.line)
            .to_string(),
        device: chosen.device,
        quick: a.quick,
        mobilenet: a.mobilenet.clone().or_else(|| {
            Some(Path::new("../shared/models/mobilenet_v2/model.safetensors").to_path_buf())
        }),
        minilm: a
            .minilm
            .clone()
            .or_else(ncclean_models::hf_dir::default_minilm_dir),
        scratch: scratch.0.clone(),
    };
    let write = |doc: &serde_json::Value| -> Result<()> {
        let text = serde_json::to_string_pretty(doc).map_err(anyhow::Error::from)?;
        // Whole documents only: a run stopped mid-write leaves the last stage's.
        crate::data::write_atomic(&a.json, (text + "\n").as_bytes())
            .map_err(|e| invalid(format!("cannot write {}: {e}", a.json.display())))
    };
    let report = crate::runtime::gpu_check::run(&opts, &|m| rep.info(m), &write)?;
    rep.info(&format!("wrote {}", a.json.display()));
    if report["parity_pass"] != serde_json::Value::Bool(true) {
        return Err(Error::Partial(format!(
            "a tower is outside its tolerance; see \"parity\" in {}",
            a.json.display()
        )));
    }
    Ok(())
}

/// A directory under the system temp dir, removed when dropped (the
/// synthetic CLIP written there is 600 MB at ViT-B/32 size).
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Result<Scratch> {
        let dir = std::env::temp_dir().join(format!("ncclean-gpu-check-{}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .map_err(|e| invalid(format!("cannot create {}: {e}", dir.display())))?;
        Ok(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
