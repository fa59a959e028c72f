//! `ncclean score`: label pairs with a trained checkpoint.
//!
//! Scoring statistics are local to each input file (see
//! `ncclean_pipelines::scoring`), so `score` works one file at a time and
//! holds one file's pairs in memory: into one labels file (`--out`), or into
//! one labels file per input shard with completion markers (`--out-dir`,
//! see [`crate::shards`]). Only `--refit`, whose mixture is fitted on every
//! scored pair, reads the whole input at once.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;

use crate::data::{self, InputSet, LabelsWriter};
use crate::engine::{keep_mask, Engine, LabelsSummary, Scored};
use crate::error::{Error, Result};
use crate::features::CacheOptions;
use crate::progress::Reporter;
use crate::shards::{self, Counts};

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
    /// Run directory written by `ncclean fit --out-dir` (or its checkpoint/).
    #[arg(long, value_name = "RUN")]
    pub checkpoint: PathBuf,
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
}

pub fn run(a: ScoreArgs, rep: &Reporter) -> Result<()> {
    let chosen = crate::device::choose(&a.device)?;
    let engine = Engine::load(&a.checkpoint, &chosen.device)?;
    rep.info(&chosen.line);
    match (&a.out_dir, &a.out) {
        (Some(dir), _) => run_shards(&a, dir, &engine, rep),
        (None, Some(out)) => run_one(&a, out, &engine, rep),
        (None, None) => Err(Error::Usage("give --out FILE or --out-dir DIR".into())),
    }
}

/// Prepare and score one input (one file, or all of them for `--refit`).
fn score_input(
    engine: &Engine,
    input: &InputSet,
    cache: &CacheOptions,
    refit: bool,
    rep: &Reporter,
) -> Result<(Scored, usize)> {
    let prepared = engine.prepare(input, cache, rep)?;
    let scored = engine.score_rows(input, &prepared, refit, rep)?;
    Ok((scored, prepared.skipped()))
}

/// Counts of one scored input.
fn counts(scored: &Scored, skipped: usize) -> Counts {
    Counts {
        rows: scored.labels.len(),
        usable: scored.pairs,
        skipped,
        kept: scored.labels.iter().filter(|l| l.is_clean).count(),
        // The rate is a count over `pairs`: rounding gives the count back.
        noisy: (scored.estimated_noise_rate * scored.pairs as f64).round() as usize,
    }
}

/// The input as a set of its file `i` alone (same columns and limits).
fn file_of(input: &InputSet, i: usize) -> InputSet {
    InputSet {
        files: vec![input.files[i].clone()],
        fingerprint: Default::default(),
        ..input.clone()
    }
}

/// `--out`: one labels file (and `--filtered`), written a file at a time.
fn run_one(a: &ScoreArgs, out: &Path, engine: &Engine, rep: &Reporter) -> Result<()> {
    a.shards.check_unused()?;
    let input = a.data.open_with(&a.images)?;
    let files: Vec<PathBuf> = input.files.iter().map(|f| f.path.clone()).collect();
    crate::rundir::check_not_an_input(out, &files, "--out")?;
    if let Some(f) = &a.filtered {
        crate::rundir::check_not_an_input(f, &files, "--filtered")?;
    }
    let cache = a.cache.options();
    // Both outputs are finished under temporary names, then renamed in
    // together: an interrupt never leaves new labels beside an old filter.
    let labels_out = crate::temp::Pending::new(out)?;
    let mut writer = LabelsWriter::create(labels_out.tmp_path())?;
    let mut total = Counts::default();
    let mut seconds = 0.0;
    let mut keep = Vec::with_capacity(input.files.len());
    let pieces: Vec<InputSet> = if a.refit {
        vec![input.clone()]
    } else {
        (0..input.files.len()).map(|i| file_of(&input, i)).collect()
    };
    for piece in &pieces {
        let (scored, skipped) = score_input(engine, piece, &cache, a.refit, rep)?;
        writer.write(&scored.labels)?;
        if a.filtered.is_some() {
            keep.extend(keep_mask(piece, &scored.labels)?);
        }
        let c = counts(&scored, skipped);
        total.rows += c.rows;
        total.usable += c.usable;
        total.skipped += c.skipped;
        total.kept += c.kept;
        total.noisy += c.noisy;
        seconds += scored.seconds;
    }
    let noise = total.noisy as f64 / total.usable.max(1) as f64;
    let metadata = engine.metadata(&LabelsSummary {
        refit: a.refit,
        input_fingerprint: input.fingerprint()?,
        rows: total.rows,
        skipped: total.skipped,
        estimated_noise_rate: noise,
    })?;
    writer.finish(&metadata)?;
    let mut filtered_rows = None;
    let mut filtered_out = None;
    let mut filtered_check = Ok(());
    if let Some(f) = &a.filtered {
        let pending = crate::temp::Pending::new(f)?;
        let format = data::OutputFormat::choose(&input, f, None);
        let written =
            data::write_filtered_as(&input, &keep, pending.tmp_path(), &metadata, format, None)?;
        filtered_rows = Some(written.rows_out);
        filtered_check = written.check(f);
        filtered_out = Some(pending);
    }
    crate::interrupt::check()?;
    labels_out.commit()?;
    if let Some(p) = filtered_out {
        p.commit()?;
    }
    let pps = total.usable as f64 / f64::max(seconds, 1e-9);
    rep.info(&format!(
        "scored {} pairs ({} skipped) in {seconds:.2}s ({pps:.0} pairs/s): {} clean, estimated noise {:.1}%",
        total.usable,
        total.skipped,
        total.kept,
        100.0 * noise
    ));
    println!(
        "{}",
        serde_json::json!({
            "out": out.display().to_string(), "rows": total.rows, "usable": total.usable,
            "skipped": total.skipped, "clean": total.kept, "estimated_noise_rate": noise,
            "pairs_per_second": pps, "filtered_rows": filtered_rows,
        })
    );
    a.outcome.check(total.rows, total.skipped)?;
    filtered_check
}

/// `--out-dir`: one labels file and marker per input shard.
fn run_shards(a: &ScoreArgs, dir: &Path, engine: &Engine, rep: &Reporter) -> Result<()> {
    let shards = a.shards.select(&a.data.data)?;
    shards::prepare_out_dir(dir, &shards)?;
    let opts = a.data.options_with(&a.images);
    let cache = a.cache.options();
    // The column options and image limits decide which rows are usable:
    // changing them redoes the shards too.
    let source = format!(
        "checkpoint sha256 {}; input options {}",
        crate::checkpoint::sha256(&engine.dir)?,
        &crate::hex::sha256_hex(
            serde_json::to_string(&opts)
                .context("serialising the input options")?
                .as_bytes()
        )[..16]
    );
    let summary = shards::run(
        dir,
        &shards,
        "score",
        |_| "parquet",
        |_| Ok(source.clone()),
        |p| InputSet::open(&[p.to_path_buf()], &opts),
        rep,
        |shard| {
            let (scored, skipped) = score_input(engine, shard.input, &cache, false, rep)?;
            let metadata = engine.metadata(&LabelsSummary {
                refit: false,
                input_fingerprint: shard.input.fingerprint()?,
                rows: scored.labels.len(),
                skipped,
                estimated_noise_rate: scored.estimated_noise_rate,
            })?;
            data::write_labels(&shard.path, &scored.labels, &metadata)?;
            Ok(counts(&scored, skipped))
        },
    )?;
    let c = summary.counts;
    let noise = c.noisy as f64 / c.usable.max(1) as f64;
    rep.info(&format!(
        "{} shards: {} scored now, {} already done; {} rows ({} skipped), {} clean, estimated noise {:.1}%",
        summary.shards,
        summary.done,
        summary.already_done,
        c.rows,
        c.skipped,
        c.kept,
        100.0 * noise
    ));
    println!(
        "{}",
        serde_json::json!({
            "out_dir": dir.display().to_string(), "shards": summary.shards, "done": summary.done,
            "already_done": summary.already_done, "rows": c.rows, "usable": c.usable,
            "skipped": c.skipped, "clean": c.kept, "estimated_noise_rate": noise,
            "seconds": summary.seconds,
        })
    );
    a.outcome.check(c.rows, c.skipped)
}
