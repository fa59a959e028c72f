//! `ncclean score`: label pairs with a trained checkpoint.

use std::path::PathBuf;

use clap::Args;

use crate::data;
use crate::engine::{keep_mask, Engine};
use crate::error::Result;
use crate::progress::Reporter;

use super::{CacheArgs, DataArgs, ImageArgs, OutcomeArgs};

/// Arguments of `ncclean score`.
#[derive(Debug, Args)]
pub struct ScoreArgs {
    #[command(flatten)]
    pub data: DataArgs,
    #[command(flatten)]
    pub images: ImageArgs,
    #[command(flatten)]
    pub cache: CacheArgs,
    #[command(flatten)]
    pub outcome: OutcomeArgs,
    /// Run directory written by `ncclean fit --out-dir` (or its checkpoint/).
    #[arg(long, value_name = "RUN")]
    pub checkpoint: PathBuf,
    /// Labels parquet to write.
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
    /// Also write the rows labelled clean to this file: parquet, or for tar
    /// input a tar of the clean samples' members when FILE ends in .tar.
    #[arg(long, value_name = "FILE")]
    pub filtered: Option<PathBuf>,
    /// Refit the mixture on the scored data instead of reusing the trained one.
    #[arg(long)]
    pub refit: bool,
    /// Device: auto (CUDA when this build has it and a GPU answers, else the
    /// CPU), cpu, cuda or cuda:N. The choice is said on stderr.
    #[arg(long, default_value = "auto")]
    pub device: String,
}

pub fn run(a: ScoreArgs, rep: &Reporter) -> Result<()> {
    let chosen = crate::device::choose(&a.device)?;
    let engine = Engine::load(&a.checkpoint, &chosen.device)?;
    rep.info(&chosen.line);
    let input = a.data.open_with(&a.images)?;
    let files: Vec<PathBuf> = input.files.iter().map(|f| f.path.clone()).collect();
    crate::rundir::check_not_an_input(&a.out, &files, "--out")?;
    if let Some(f) = &a.filtered {
        crate::rundir::check_not_an_input(f, &files, "--filtered")?;
    }
    let prepared = engine.prepare(&input, &a.cache.options(), rep)?;
    let scored = engine.score(&input, &prepared, a.refit, rep)?;
    // Both outputs are finished under temporary names, then renamed in
    // together: an interrupt never leaves new labels beside an old filter.
    let labels_out = crate::temp::Pending::new(&a.out)?;
    data::write_labels(labels_out.tmp_path(), &scored.labels, &scored.metadata)?;
    let mut filtered_rows = None;
    let mut filtered_out = None;
    let mut filtered_check = Ok(());
    if let Some(f) = &a.filtered {
        let pending = crate::temp::Pending::new(f)?;
        let keep = keep_mask(&input, &scored.labels)?;
        let format = data::OutputFormat::choose(&input, f, None);
        let written =
            data::write_filtered_as(&input, &keep, pending.tmp_path(), &scored.metadata, format)?;
        filtered_rows = Some(written.rows_out);
        filtered_check = written.check(f);
        filtered_out = Some(pending);
    }
    crate::interrupt::check()?;
    labels_out.commit()?;
    if let Some(p) = filtered_out {
        p.commit()?;
    }
    let clean = scored.labels.iter().filter(|l| l.is_clean).count();
    let pps = scored.pairs as f64 / scored.seconds.max(1e-9);
    rep.info(&format!(
        "scored {} pairs ({} skipped) in {:.2}s ({pps:.0} pairs/s): {clean} clean, estimated noise {:.1}%",
        scored.pairs,
        prepared.skipped(),
        scored.seconds,
        100.0 * scored.estimated_noise_rate
    ));
    println!(
        "{}",
        serde_json::json!({
            "out": a.out.display().to_string(), "rows": scored.labels.len(), "usable": scored.pairs,
            "skipped": prepared.skipped(), "clean": clean, "estimated_noise_rate": scored.estimated_noise_rate,
            "pairs_per_second": pps, "filtered_rows": filtered_rows,
        })
    );
    a.outcome.check(scored.labels.len(), prepared.skipped())?;
    filtered_check
}
