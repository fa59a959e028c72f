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
    if !(1..=report::MAX_PER_GROUP).contains(&a.per_group) {
        return Err(Error::Usage(format!(
            "--per-group must be between 1 and {}, got {}",
            report::MAX_PER_GROUP,
            a.per_group
        )));
    }
    let run = crate::run::inputs::run_dir_or_default(a.run.as_deref(), "`ncclean report DIR`")?;
    let out = a.out.clone().unwrap_or_else(|| run.join("report.html"));
    crate::runtime::temp::check_replaceable(&out, "--out")?;
    // The pictures are read back from the files fit was given, by row.
    if crate::run::inputs::recorded_inputs_changed(&run) == Some(true) {
        crate::runtime::progress::warn_once(&format!(
            "the files {}/run.json names as the training data changed since fit (their content \
             differs from the input_fingerprint it records, or one is gone): the report's \
             pictures are read from them by row and may not show the pairs that were scored",
            run.display()
        ));
    }
    let s = report::write(
        &run,
        &out,
        &report::Options {
            per_group: a.per_group,
        },
    )?;
    rep.info(&format!(
        "wrote {}: {} scored pairs, {} shown ({} without a picture){}",
        out.display(),
        s.scored,
        s.shown,
        s.pictures_missing,
        if s.mixture_drawn {
            ""
        } else {
            "; no fitted mixture to draw"
        }
    ));
    println!(
        "{}",
        serde_json::to_string(&s).map_err(|e| Error::Other(e.into()))?
    );
    Ok(())
}
