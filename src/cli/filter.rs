//! `ncclean filter`: write the rows that labels call clean.

use std::path::PathBuf;

use clap::Args;

use crate::curation::filter::{check_engine, filter_file, FilterEngine, FilterOptions};
use crate::curation::filter_shards::filter_shards;
use crate::data;
use crate::error::{Error, Result};
use crate::runtime::progress::Reporter;

use super::threshold::ThresholdArgs;
use super::{DataArgs, ShardArgs};

/// Arguments of `ncclean filter`.
#[derive(Debug, Args)]
pub struct FilterArgs {
    #[command(flatten)]
    pub data: DataArgs,
    #[command(flatten)]
    pub shards: ShardArgs,
    /// Labels parquet from `fit` or `score` on this data, or (with
    /// --out-dir) the directory `score --out-dir` wrote, holding
    /// <shard stem>.parquet for every input shard.
    #[arg(long, value_name = "FILE|DIR")]
    pub labels: PathBuf,
    /// Output file: the kept rows, all original columns unchanged, then
    /// their ncclean_clean_prob and ncclean_soft_label (for tar input, a tar
    /// of the kept samples' members; see --format). Labels are joined to
    /// the rows by key, so reordered or resharded copies of the data filter
    /// to the same rows.
    #[arg(long, value_name = "FILE", required_unless_present = "out_dir")]
    pub out: Option<PathBuf>,
    /// Write one filtered shard per input shard, DIR/<shard stem>.parquet
    /// (or .tar, see --format), each followed by a completion marker
    /// DIR/<shard stem>.done.json; a rerun skips shards already filtered
    /// from the same labels and rule.
    #[arg(long, value_name = "DIR", conflicts_with = "out")]
    pub out_dir: Option<PathBuf>,
    /// Output format: parquet, or tar (tar input only: the kept samples'
    /// members byte for byte). Default: by the --out extension (.tar,
    /// .parquet), else the input's format.
    #[arg(long, value_enum)]
    pub format: Option<data::OutputFormat>,
    /// The rule for the kept rows instead of the labels' is_clean,
    /// resolved on every label read (all shards' with --out-dir).
    #[command(flatten)]
    pub threshold: ThresholdArgs,
    /// Write every input row, not only the kept ones, with the labels
    /// joined: ncclean_keep (the rule's decision), ncclean_status and
    /// ncclean_error beside ncclean_clean_prob and ncclean_soft_label
    /// (parquet output only).
    #[arg(long)]
    pub all_rows: bool,
    /// Also write the kept rows' keys as a DataComp subset file: a .npy
    /// array of dtype u8,u8 holding the sorted 128-bit uids, for DataComp's
    /// resharder (--subset-file). Keys must be DataComp uids (32 hex
    /// digits; --key-col uid). With --out-dir, the uids of every filtered
    /// shard in DIR (finished earlier or now); not with --num-shards.
    #[arg(long, value_name = "FILE.npy")]
    pub uids_out: Option<PathBuf>,
    /// What moves the kept rows into the output. native: ncclean's arrow-rs
    /// writer (reads around damaged row groups, writes tar). polars: one
    /// polars lazy query (parquet scan, key join, streaming sink); needs a
    /// build with `--features polars`, parquet shards and a key column.
    /// Both keep the same rows: the labels are checked and joined by key
    /// the same way first.
    #[arg(long, value_enum, default_value_t = FilterEngine::Native)]
    pub engine: FilterEngine,
}

/// Run `ncclean filter`.
pub fn run(a: FilterArgs, rep: &Reporter) -> Result<()> {
    let rule = a.threshold.rule()?;
    check_engine(a.engine)?;
    let opts = FilterOptions {
        data: a.data.data.clone(),
        files_from: a.shards.files_from.clone(),
        columns: a.data.column_options(),
        labels: a.labels.clone(),
        format: a.format,
        rule,
        all_rows: a.all_rows,
        uids_out: a.uids_out.clone(),
        engine: a.engine,
    };
    match (&a.out_dir, &a.out) {
        (Some(dir), _) => {
            if a.uids_out.is_some() && a.shards.num_shards.is_some_and(|n| n > 1) {
                return Err(Error::Usage(
                    "--uids-out with --num-shards: each worker filters only its own shards. When every worker is done, \
                     run the same filter once more without --num-shards and --shard-index: it skips the finished shards \
                     and writes the uids of all of them"
                        .into(),
                ));
            }
            let shards = a.shards.select(&a.data.data, opts.columns.discovery())?;
            let s = filter_shards(dir, &shards, &opts, rep)?;
            super::print_summary(&s)?;
            s.check()
        }
        (None, Some(out)) => {
            a.shards.check_unused()?;
            let input = a.data.open()?;
            let s = filter_file(&input, out, &opts, rep)?;
            super::print_summary(&s)?;
            s.check()
        }
        (None, None) => Err(Error::Usage("give --out FILE or --out-dir DIR".into())),
    }
}
