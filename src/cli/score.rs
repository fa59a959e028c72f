//! `ncclean score`: label pairs with a trained checkpoint, streaming (see
//! [`crate::engine::score_out`]).

use std::path::PathBuf;

use clap::Args;

use crate::engine::score_out::{self, ScoreOptions};
use crate::error::{Error, Result};
use crate::run::inputs;
use crate::runtime::progress::Reporter;

use super::threshold::ThresholdArgs;
use super::{CacheArgs, DataArgs, ImageArgs, OutcomeArgs, ShardArgs};

/// Arguments of `ncclean score`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("output").required(true).args(["out", "out_dir"])))]
pub struct ScoreArgs {
    #[command(flatten)]
    pub data: DataArgs,
    #[command(flatten)]
    pub images: ImageArgs,
    #[command(flatten)]
    pub cache: CacheArgs,
    #[command(flatten)]
    pub outcome: OutcomeArgs,
    #[command(flatten)]
    pub shards: ShardArgs,
    /// Run directory written by `ncclean fit --out-dir` (or its
    /// checkpoint/). Default: ./ncclean-run, where `fit` writes when not
    /// told otherwise. Without DATA (and --files-from), the run's own
    /// training data is scored, read as `fit` read it (run.json records
    /// its files and columns), every row of it even after `fit --sample`.
    #[arg(long, value_name = "RUN")]
    pub checkpoint: Option<PathBuf>,
    /// Labels parquet to write (one file for all inputs).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Write one labels file per input shard, DIR/<shard stem>.parquet, each
    /// followed by a completion marker DIR/<shard stem>.done.json. A rerun
    /// skips shards whose marker matches the checkpoint and the shard's
    /// content, so a killed worker resumes where it stopped.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["out", "filtered", "refit"])]
    pub out_dir: Option<PathBuf>,
    /// Also write the rows labelled clean to this file (with --out): parquet,
    /// or for tar input a tar of the clean samples' members when FILE ends
    /// in .tar.
    #[arg(long, value_name = "FILE")]
    pub filtered: Option<PathBuf>,
    /// Refit the mixture on the scored data instead of reusing the trained
    /// one. Reads the whole input into memory (the mixture needs every
    /// pair's statistic); not with --out-dir, whose shards are scored apart.
    #[arg(long)]
    pub refit: bool,
    /// Device: auto (CUDA when this build has it and a GPU answers, else the
    /// CPU), cpu, cuda or cuda:N. The choice is said on stderr.
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// The rule for is_clean. Default: the cut `fit` resolved on the
    /// training pairs. A fraction or precision rule is resolved on the
    /// training pairs' clean_prob distribution stored with the checkpoint,
    /// never on the scored data, so every shard gets the same cut.
    #[command(flatten)]
    pub threshold: ThresholdArgs,
}

/// Run `ncclean score`.
pub fn run(mut a: ScoreArgs, rep: &Reporter) -> Result<()> {
    let rule = a.threshold.rule()?;
    let chosen = crate::runtime::device::choose(&a.device)?;
    let run = inputs::run_dir_or_default(a.checkpoint.as_deref(), "--checkpoint DIR")?;
    let mut engine = score_out::load(&run, &chosen.device)?;
    let mut recorded = None;
    if a.data.data.is_empty() && a.shards.files_from.is_none() {
        let files = a.data.fill_from(inputs::recorded(&run)?);
        rep.info(&format!(
            "no DATA given: scoring the training data of {} ({files} file(s), read as fit read them)",
            run.display()
        ));
        recorded = inputs::recorded_fingerprint(&run);
    }
    score_out::use_rule(&mut engine, rule, &chosen.line, rep)?;
    let opts = ScoreOptions {
        data: a.data.data.clone(),
        columns: a.data.options_with(&a.images),
        cache: a.cache.request(),
        filtered: a.filtered.clone(),
        refit: a.refit,
    };
    match (&a.out_dir, &a.out) {
        (Some(dir), _) => {
            let shards = a.shards.select(&a.data.data, opts.columns.discovery())?;
            let s = score_out::score_shards(&engine, dir, &shards, &opts, rep)?;
            super::print_summary(&s)?;
            a.outcome.check(s.rows, s.skipped)
        }
        (None, Some(out)) => {
            a.shards.check_unused()?;
            let input = a
                .data
                .open_options(&engine.input_options(opts.columns.clone()))?;
            let s = score_out::score_file(&engine, &input, out, &opts, recorded.as_deref(), rep)?;
            super::print_summary(&s)?;
            a.outcome.check(s.rows, s.skipped)?;
            s.check_filtered()
        }
        (None, None) => Err(Error::Usage("give --out FILE or --out-dir DIR".into())),
    }
}
