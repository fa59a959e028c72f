//! `ncclean score`: label pairs with a trained checkpoint.
//!
//! Scoring statistics are local to blocks of each input file (see
//! `ncclean_pipelines::scoring`), so `score` streams: one file at a time,
//! one scoring block of it at a time ([`Engine::score_file`]), each block's
//! labels appended to the output as it is scored. Memory follows the block
//! (at most 65,536 pairs), not the file or the input. The output is one
//! labels file (`--out`), or one labels file per input shard with
//! completion markers (`--out-dir`, see [`crate::run::shards`]). Only `--refit`,
//! whose mixture is fitted on every scored pair, reads the whole input at
//! once.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;

use crate::data::{self, InputSet, LabelsWriter};
use crate::engine::score::{
    refuse_without_signal, score_refit, score_streaming, stream_file, FileWarnings, Scoring,
};
use crate::engine::{Engine, LabelsSummary};
use crate::error::{Error, Result};
use crate::run::inputs;
use crate::run::shards;
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

pub fn run(mut a: ScoreArgs, rep: &Reporter) -> Result<()> {
    let rule = a.threshold.rule()?;
    let chosen = crate::runtime::device::choose(&a.device)?;
    let run = inputs::run_dir_or_default(a.checkpoint.as_deref(), "--checkpoint DIR")?;
    let mut engine = Engine::load(&run, &chosen.device)?;
    refuse_without_signal(&engine)?;
    let mut recorded = None;
    if a.data.data.is_empty() && a.shards.files_from.is_none() {
        let files = a.data.fill_from(inputs::recorded(&run)?);
        rep.info(&format!(
            "no DATA given: scoring the training data of {} ({files} file(s), read as fit read them)",
            run.display()
        ));
        recorded = inputs::recorded_fingerprint(&run);
    }
    if let Some(rule) = rule {
        engine.use_rule(rule)?;
    }
    rep.info(&chosen.line);
    let cut = engine.cut();
    rep.info(&format!(
        "is_clean: {} -> {} (resolved on the training pairs)",
        cut.rule,
        cut.condition()
    ));
    match (&a.out_dir, &a.out) {
        (Some(dir), _) => run_shards(&a, dir, &engine, rep),
        (None, Some(out)) => run_one(&a, out, &engine, recorded.as_deref(), rep),
        (None, None) => Err(Error::Usage("give --out FILE or --out-dir DIR".into())),
    }
}

/// Warn when the training data run.json names (scored without DATA) no
/// longer gives the fingerprint `want` that fit recorded.
fn warn_if_changed(input: &InputSet, want: &str, engine: &Engine) -> Result<()> {
    if input.fingerprint()? != want {
        crate::runtime::progress::warn_once(&format!(
            "the files run.json names as the training data changed since fit (their \
             content differs from the input_fingerprint it records): scoring them as they \
             are now, which is not the data {} was trained on; name the data to score \
             (DATA) to make that choice explicit",
            engine.dir.display()
        ));
    }
    Ok(())
}

/// `--out`: one labels file (and `--filtered`), written a file at a time.
/// `recorded`: the training data's fingerprint when DATA was taken from
/// run.json, to say when those files changed since `fit`.
fn run_one(
    a: &ScoreArgs,
    out: &Path,
    engine: &Engine,
    recorded: Option<&str>,
    rep: &Reporter,
) -> Result<()> {
    a.shards.check_unused()?;
    let input = a
        .data
        .open_options(&engine.input_options(a.data.options_with(&a.images)))?;
    if let Some(want) = recorded {
        warn_if_changed(&input, want, engine)?;
    }
    let files: Vec<PathBuf> = input.files.iter().map(|f| f.path.clone()).collect();
    crate::run::dir::check_not_an_input(out, &files, "--out")?;
    crate::run::dir::check_not_in_input_dir(out, &a.data.data, "--out")?;
    if let Some(f) = &a.filtered {
        crate::run::dir::check_not_an_input(f, &files, "--filtered")?;
        crate::run::dir::check_not_in_input_dir(f, &a.data.data, "--filtered")?;
        // The filtered file holds every input column: differing shards are
        // refused before anything is scored.
        data::check_same_schema(&input)?;
    }
    let cache = a.cache.options()?;
    // Both outputs are finished under temporary names, then renamed in
    // together: an interrupt never leaves new labels beside an old filter.
    let labels_out = crate::runtime::temp::Pending::new(out)?;
    let mut writer = LabelsWriter::create_in(labels_out.tmp_path())?;
    let mut warnings = FileWarnings::default();
    let score = if a.refit {
        score_refit
    } else {
        score_streaming
    };
    let Scoring {
        total,
        tally,
        seconds,
        kept,
    } = score(
        engine,
        &input,
        &cache,
        rep,
        &mut writer,
        a.filtered.is_some(),
        &mut warnings,
    )?;
    let cut = engine.cut_over(&tally);
    let noise = cut.estimated_noise_rate;
    let metadata = engine.metadata(&LabelsSummary {
        refit: a.refit,
        input_fingerprint: input.fingerprint()?,
        rows: total.rows,
        skipped: total.skipped,
        cut,
        warnings: warnings.all.clone(),
    })?;
    writer.finish(&metadata)?;
    let mut filtered_rows = None;
    let mut filtered_out = None;
    let mut filtered_check = Ok(());
    if let Some(f) = &a.filtered {
        let pending = crate::runtime::temp::Pending::new(f)?;
        let format = data::OutputFormat::choose(&input, f, None);
        let ann = data::Annotations {
            labels: &kept.labels,
            label_of: &kept.label_of,
            decision: None,
        };
        let written = data::write_filtered_as(
            &input,
            &kept.keep,
            pending.tmp_path(),
            &metadata,
            format,
            Some(ann),
        )?;
        filtered_rows = Some(written.rows_out);
        filtered_check = written.check(f);
        filtered_out = Some(pending);
    }
    crate::runtime::interrupt::check()?;
    labels_out.commit()?;
    if let Some(p) = filtered_out {
        p.commit()?;
    }
    warnings.finish();
    let pps = total.usable as f64 / f64::max(seconds, 1e-9);
    rep.info(&format!(
        "scored {} pairs ({} skipped) in {seconds:.2}s ({pps:.0} pairs/s): {}",
        total.usable,
        total.skipped,
        cut.summary()
    ));
    super::print_summary(&ScorePrinted {
        out: out.display().to_string(),
        rows: total.rows,
        usable: total.usable,
        skipped: total.skipped,
        clean: total.kept,
        estimated_noise_rate: noise,
        min_prob: cut.min_prob,
        min_similarity: cut.min_similarity,
        expected_precision: cut.expected_precision,
        pairs_per_second: pps,
        filtered_rows,
        warnings: &warnings.all,
    })?;
    a.outcome.check(total.rows, total.skipped)?;
    filtered_check
}

/// `--out-dir`: one labels file and marker per input shard.
fn run_shards(a: &ScoreArgs, dir: &Path, engine: &Engine, rep: &Reporter) -> Result<()> {
    let shards = a.shards.select(&a.data.data, a.data.discovery())?;
    shards::prepare_out_dir(dir, &shards)?;
    let opts = engine.input_options(a.data.options_with(&a.images));
    let cache = a.cache.options()?;
    // The column options and image limits decide which rows are usable:
    // changing them redoes the shards too.
    // So do the cut: shards labelled under another rule are redone (a cut
    // that splits no tie reads as before, so its shards are kept).
    let mut warnings = FileWarnings::default();
    let cut = engine.cut();
    let source = format!(
        "checkpoint sha256 {}; is_clean clean_prob >= {}{}; input options {}",
        crate::run::checkpoint::sha256(&engine.dir)?,
        cut.min_prob,
        cut.min_similarity
            .map(|s| format!(" (at it, similarity >= {s})"))
            .unwrap_or_default(),
        &crate::runtime::hex::sha256_hex(
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
            // Written under a temporary name, renamed in when complete.
            let mut writer = LabelsWriter::create(&shard.path)?;
            let before = warnings.all.len();
            let (c, t, _) = stream_file(
                engine,
                shard.input,
                &cache,
                rep,
                &mut writer,
                None,
                &mut warnings,
            )?;
            let metadata = engine.metadata(&LabelsSummary {
                refit: false,
                input_fingerprint: shard.input.fingerprint()?,
                rows: c.rows,
                skipped: c.skipped,
                cut: engine.cut_over(&t),
                warnings: warnings.all[before..].to_vec(),
            })?;
            writer.finish(&metadata)?;
            Ok(c)
        },
    )?;
    warnings.finish();
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
    super::print_summary(&ScoreShardsPrinted {
        out_dir: dir.display().to_string(),
        shards: summary.shards,
        done: summary.done,
        already_done: summary.already_done,
        rows: c.rows,
        usable: c.usable,
        skipped: c.skipped,
        clean: c.kept,
        estimated_noise_rate: noise,
        seconds: summary.seconds,
        warnings: &warnings.all,
    })?;
    a.outcome.check(c.rows, c.skipped)
}

/// What `score --out FILE` prints on stdout.
#[derive(serde::Serialize)]
struct ScorePrinted<'a> {
    out: String,
    rows: usize,
    usable: usize,
    skipped: usize,
    clean: usize,
    estimated_noise_rate: f64,
    min_prob: f64,
    min_similarity: Option<f64>,
    expected_precision: f64,
    pairs_per_second: f64,
    filtered_rows: Option<usize>,
    warnings: &'a [String],
}

/// What `score --out-dir DIR` prints on stdout.
#[derive(serde::Serialize)]
struct ScoreShardsPrinted<'a> {
    out_dir: String,
    shards: usize,
    done: usize,
    already_done: usize,
    rows: usize,
    usable: usize,
    skipped: usize,
    clean: usize,
    estimated_noise_rate: f64,
    seconds: f64,
    warnings: &'a [String],
}
