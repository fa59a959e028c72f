//! `ncclean cuda-libs` (hidden): where this binary finds the NVIDIA driver
//! and the CUDA libraries, and whether they load. Any build can run it (the
//! search is plain Rust), so the search is testable without a GPU, and
//! `scripts/device_check.sh` records it on the GPU machine.

use clap::Args;

use crate::error::Result;
use crate::runtime::cuda_libs::{self, Inputs};
use crate::runtime::device::{self, DRIVER};
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
    let driver = device::load_any(&DRIVER);
    let search = cuda_libs::search(&Inputs::current());
    let loaded = cuda_libs::load_search(&search, &device::dlopen);
    let files: Vec<String> = search
        .found
        .iter()
        .flat_map(|f| f.files.iter().map(|p| p.display().to_string()))
        .collect();
    if a.json {
        let outcome = |r: std::result::Result<(), &String>| Load {
            loaded: r.is_ok(),
            error: r.err().cloned(),
            from: None,
            files: None,
        };
        return super::print_summary(&CudaLibsPrinted {
            built_with_cuda: cfg!(feature = "cuda"),
            driver: outcome(driver.as_ref().map(|_| ())),
            libraries: match &loaded {
                Ok(from) => Load {
                    from: Some(from.clone()),
                    files: Some(files),
                    ..outcome(Ok(()))
                },
                Err(e) => outcome(Err(e)),
            },
            looked: &search.looked,
        });
    }
    let mut out = String::new();
    out.push_str(&format!(
        "build: {}\n",
        if cfg!(feature = "cuda") {
            "CUDA"
        } else {
            "CPU only (the search below is what a CUDA build would do)"
        }
    ));
    out.push_str(&match &driver {
        Ok(()) => "driver: loaded\n".to_string(),
        Err(e) => format!("driver: {e}\n"),
    });
    match &loaded {
        Ok(from) => {
            out.push_str(&format!("libraries: loaded from {from}\n"));
            for f in &files {
                out.push_str(&format!("  {f}\n"));
            }
        }
        Err(e) => out.push_str(&format!("libraries: {e}\n")),
    }
    for l in &search.looked {
        out.push_str(&format!("passed over: {l}\n"));
    }
    print!("{out}");
    Ok(())
}

/// What `cuda-libs --json` prints on stdout.
#[derive(serde::Serialize)]
struct CudaLibsPrinted<'a> {
    built_with_cuda: bool,
    driver: Load,
    libraries: Load,
    looked: &'a [String],
}

/// Whether a library loaded, and from where or why not.
#[derive(serde::Serialize)]
struct Load {
    loaded: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    from: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    files: Option<Vec<String>>,
}
