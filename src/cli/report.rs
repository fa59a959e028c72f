//! `ncclean report`: write the HTML report of a finished run.

use std::path::PathBuf;

use clap::Args;

use crate::error::{Error, Result};
use crate::report;
use crate::runtime::progress::Reporter;

/// Arguments of `ncclean report`.
#[derive(Debug, Args)]
pub struct ReportArgs {
    /// Run directory written by `ncclean fit --out-dir` (default:
    /// ./ncclean-run, where `fit` writes when not told otherwise).
    #[arg(value_name = "RUN")]
    pub run: Option<PathBuf>,
    /// Output HTML file: one self-contained page (charts as inline SVG,
    /// pictures as data URIs), written atomically. Default: RUN/report.html
    /// (a later `fit` into RUN replaces the whole directory, report
    /// included).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Pairs shown in each group (most suspicious, borderline, most
    /// confident), 1 to 100; their pictures are read back from the run's
    /// inputs.
    #[arg(long, value_name = "N", default_value_t = report::DEFAULT_PER_GROUP)]
    pub per_group: usize,
}

/// Run `ncclean report`.
pub fn run(a: ReportArgs, rep: &Reporter) -> Result<()> {
    let opts = report::Options {
        per_group: a.per_group,
    };
    opts.check()?;
    let run = crate::run::inputs::run_dir_or_default(a.run.as_deref(), "`ncclean report DIR`")?;
    let s = report::write_run(&run, a.out, &opts, rep)?;
    println!(
        "{}",
        serde_json::to_string(&s).map_err(|e| Error::Other(e.into()))?
    );
    Ok(())
}
