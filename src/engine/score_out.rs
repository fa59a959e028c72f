//! Where `ncclean score` writes its labels: one labels file for all inputs
//! ([`score_file`], with `--filtered` beside it), or one labels file and
//! completion marker per input shard ([`score_shards`]).
//!
//! Scoring statistics are local to blocks of each input file (see
//! `ncclean_pipelines::scoring`), so both stream: one file at a time, one
//! scoring block of it at a time ([`Engine::score_file`]), each block's
//! labels appended to the output as it is scored. Memory follows the block
//! (at most 65,536 pairs), not the file or the input. Only `--refit`, whose
//! mixture is fitted on every scored pair, reads the whole input at once.

use std::path::{Path, PathBuf};

use anyhow::Context;
use candle_core::Device;

use super::score::{
    refuse_without_signal, score_refit, score_streaming, stream_file, FileWarnings, Scoring,
};
use super::{Engine, LabelsSummary};
use crate::curation::threshold::Rule;
use crate::data::{self, ColumnOptions, InputSet, LabelsWriter};
use crate::error::Result;
use crate::run::shards::{self, Shard};
use crate::runtime::progress::Reporter;
use crate::towers::features::CacheRequest;

/// What `score` was asked to do besides the checkpoint, resolved from its
/// flags.
#[derive(Debug, Clone)]
pub struct ScoreOptions {
    /// The DATA arguments as given: outputs may not lie in their
    /// directories.
    pub data: Vec<PathBuf>,
    /// How the input's columns are found, before the checkpoint completes
    /// them ([`Engine::input_options`]).
    pub columns: ColumnOptions,
    /// The feature cache, resolved once the outputs are checked.
    pub cache: CacheRequest,
    /// Also write the rows labelled clean to this file (one labels file
    /// only).
    pub filtered: Option<PathBuf>,
    /// Refit the mixture on the scored data (one labels file only).
    pub refit: bool,
}

/// Load the checkpoint of `run` on `device` for scoring; a run that
/// recorded no signal is refused.
pub fn load(run: &Path, device: &Device) -> Result<Engine> {
    let engine = Engine::load(run, device)?;
    refuse_without_signal(&engine)?;
    Ok(engine)
}

/// Label with `rule` instead of fit's cut when given, and say the device
/// (`device_line`) and the cut on stderr.
pub fn use_rule(
    engine: &mut Engine,
    rule: Option<Rule>,
    device_line: &str,
    rep: &Reporter,
) -> Result<()> {
    if let Some(rule) = rule {
        engine.use_rule(rule)?;
    }
    rep.info(device_line);
    let cut = engine.cut();
    rep.info(&format!(
        "is_clean: {} -> {} (resolved on the training pairs)",
        cut.rule,
        cut.condition()
    ));
    Ok(())
}

/// What `score --out FILE` did, as it prints it on stdout.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FileScored {
    /// The labels file.
    pub out: String,
    /// Input rows.
    pub rows: usize,
    /// Usable pairs.
    pub usable: usize,
    /// Rows that could not be used.
    pub skipped: usize,
    /// Pairs called clean.
    pub clean: usize,
    /// The cut's estimate of the noisy share.
    pub estimated_noise_rate: f64,
    /// The cut's clean_prob.
    pub min_prob: f64,
    /// The cut's similarity inside a tie at `min_prob`.
    pub min_similarity: Option<f64>,
    /// Mean clean_prob of the kept pairs.
    pub expected_precision: f64,
    /// Scoring throughput.
    pub pairs_per_second: f64,
    /// Rows written to `--filtered`.
    pub filtered_rows: Option<usize>,
    /// Files whose check against random pairings warned.
    pub warnings: Vec<String>,
    /// `--filtered`'s path and what was written to it.
    #[serde(skip)]
    filtered: Option<(PathBuf, data::FilterSummary)>,
}

impl FileScored {
    /// A partial result (exit 4) when clean rows are missing from
    /// `--filtered`.
    pub fn check_filtered(&self) -> Result<()> {
        match &self.filtered {
            Some((path, written)) => written.check(path),
            None => Ok(()),
        }
    }
}

/// Warn when the training data run.json names (scored without DATA) no
/// longer gives the fingerprint `want` that fit recorded.
fn warn_if_changed(fingerprint: &str, want: &str, engine: &Engine) {
    if fingerprint != want {
        crate::runtime::progress::warn_once(&format!(
            "the files run.json names as the training data changed since fit (their \
             content differs from the input_fingerprint it records): scoring them as they \
             are now, which is not the data {} was trained on; name the data to score \
             (DATA) to make that choice explicit",
            engine.dir.display()
        ));
    }
}

/// Refuse outputs that would replace an input or lie in an input
/// directory; with `--filtered`, inputs whose schemas differ.
fn check_outputs(input: &InputSet, out: &Path, opts: &ScoreOptions) -> Result<()> {
    let files: Vec<PathBuf> = input.files.iter().map(|f| f.path.clone()).collect();
    crate::run::dir::check_not_an_input(out, &files, "--out")?;
    crate::run::dir::check_not_in_input_dir(out, &opts.data, "--out")?;
    if let Some(f) = &opts.filtered {
        crate::run::dir::check_not_an_input(f, &files, "--filtered")?;
        crate::run::dir::check_not_in_input_dir(f, &opts.data, "--filtered")?;
        // The filtered file holds every input column: differing shards are
        // refused before anything is scored.
        data::check_same_schema(input)?;
    }
    Ok(())
}

/// `score --out FILE`: label `input` into one labels file at `out` (and
/// the clean rows into `--filtered`), written a file at a time. `recorded`:
/// the training data's fingerprint when DATA was taken from run.json, to
/// say when those files changed since `fit`.
pub fn score_file(
    engine: &Engine,
    input: &InputSet,
    out: &Path,
    opts: &ScoreOptions,
    recorded: Option<&str>,
    rep: &Reporter,
) -> Result<FileScored> {
    if let Some(want) = recorded {
        warn_if_changed(&input.fingerprint()?, want, engine);
    }
    check_outputs(input, out, opts)?;
    // The input's fingerprint (a sha256 of every byte, 0.4 s for 840 MB)
    // goes into the labels' metadata: read beside the scoring on a thread
    // of its own (at once when the warning above read it: the input keeps
    // it).
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let fingerprint = s.spawn(|| input.fingerprint_unless(&stop));
        let scored = score_file_with(engine, input, out, opts, rep, fingerprint);
        // A failed or interrupted score does not wait for the hash.
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        scored
    })
}

/// [`score_file`] after its checks, with the input's fingerprint pending.
fn score_file_with(
    engine: &Engine,
    input: &InputSet,
    out: &Path,
    opts: &ScoreOptions,
    rep: &Reporter,
    fingerprint: std::thread::ScopedJoinHandle<'_, Result<String>>,
) -> Result<FileScored> {
    let cache = opts.cache.resolve()?;
    // Both outputs are finished under temporary names, then renamed in
    // together: an interrupt never leaves new labels beside an old filter.
    let labels_out = crate::runtime::temp::Pending::new(out)?;
    let mut writer = LabelsWriter::create_in(labels_out.tmp_path())?;
    let mut warnings = FileWarnings::default();
    let score = if opts.refit {
        score_refit
    } else {
        score_streaming
    };
    let scoring = score(
        engine,
        input,
        &cache,
        rep,
        &mut writer,
        opts.filtered.is_some(),
        &mut warnings,
    )?;
    let cut = engine.cut_over(&scoring.tally);
    let total = scoring.total;
    let metadata = engine.metadata(&LabelsSummary {
        refit: opts.refit,
        input_fingerprint: fingerprint.join().unwrap_or_else(|_| {
            Err(
                anyhow::anyhow!("reading the input files to fingerprint them stopped unexpectedly")
                    .into(),
            )
        })?,
        rows: total.rows,
        skipped: total.skipped,
        cut,
        warnings: warnings.all.clone(),
    })?;
    writer.finish(&metadata)?;
    let filtered = match &opts.filtered {
        Some(f) => Some(write_filtered(input, f, &scoring, &metadata)?),
        None => None,
    };
    crate::runtime::interrupt::check()?;
    labels_out.commit()?;
    let filtered = match filtered {
        Some((pending, written)) => {
            pending.commit()?;
            Some(written)
        }
        None => None,
    };
    warnings.finish();
    let pps = total.usable as f64 / f64::max(scoring.seconds, 1e-9);
    rep.info(&format!(
        "scored {} pairs ({} skipped) in {:.2}s ({pps:.0} pairs/s): {}",
        total.usable,
        total.skipped,
        scoring.seconds,
        cut.summary()
    ));
    Ok(FileScored {
        out: out.display().to_string(),
        rows: total.rows,
        usable: total.usable,
        skipped: total.skipped,
        clean: total.kept,
        estimated_noise_rate: cut.estimated_noise_rate,
        min_prob: cut.min_prob,
        min_similarity: cut.min_similarity,
        expected_precision: cut.expected_precision,
        pairs_per_second: pps,
        filtered_rows: filtered.as_ref().map(|w| w.rows_out),
        warnings: warnings.all,
        filtered: opts.filtered.clone().zip(filtered),
    })
}

/// `--filtered`: the rows labelled clean, with their labels, written under
/// a temporary name (committed by the caller beside the labels).
fn write_filtered(
    input: &InputSet,
    path: &Path,
    scoring: &Scoring,
    metadata: &std::collections::BTreeMap<String, String>,
) -> Result<(crate::runtime::temp::Pending, data::FilterSummary)> {
    let pending = crate::runtime::temp::Pending::new(path)?;
    let format = data::OutputFormat::choose(input, path, None);
    let kept = &scoring.kept;
    let ann = data::Annotations {
        labels: &kept.labels,
        label_of: &kept.label_of,
        decision: None,
    };
    let written = data::write_filtered_as(
        input,
        &kept.keep,
        pending.tmp_path(),
        metadata,
        format,
        Some(ann),
    )?;
    Ok((pending, written))
}

/// What `score --out-dir DIR` did, as it prints it on stdout.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ShardsScored {
    /// The output directory.
    pub out_dir: String,
    /// Shards this worker was given.
    pub shards: usize,
    /// Of those, scored in this run.
    pub done: usize,
    /// Of those, complete from an earlier run and skipped.
    pub already_done: usize,
    /// Input rows over the shards.
    pub rows: usize,
    /// Usable pairs.
    pub usable: usize,
    /// Rows that could not be used.
    pub skipped: usize,
    /// Pairs called clean.
    pub clean: usize,
    /// The share of usable pairs called noisy.
    pub estimated_noise_rate: f64,
    /// Seconds spent on the shards scored in this run.
    pub seconds: f64,
    /// Files whose check against random pairings warned.
    pub warnings: Vec<String>,
}

/// What a shard's marker says its labels were made from: the checkpoint,
/// the cut (shards labelled under another rule are redone; a cut that
/// splits no tie reads as before, so its shards are kept) and the column
/// options and image limits, which decide which rows are usable.
fn shard_source(engine: &Engine, columns: &ColumnOptions) -> Result<String> {
    let cut = engine.cut();
    Ok(format!(
        "checkpoint sha256 {}; is_clean clean_prob >= {}{}; input options {}",
        crate::run::checkpoint::sha256(&engine.dir)?,
        cut.min_prob,
        cut.min_similarity
            .map(|s| format!(" (at it, similarity >= {s})"))
            .unwrap_or_default(),
        &crate::runtime::hex::sha256_hex(
            serde_json::to_string(columns)
                .context("serialising the input options")?
                .as_bytes()
        )[..16]
    ))
}

/// `score --out-dir DIR`: one labels file and marker per shard of
/// `shards` (this worker's), skipping those whose marker matches the
/// checkpoint and the shard's content.
pub fn score_shards(
    engine: &Engine,
    dir: &Path,
    shards: &[Shard],
    opts: &ScoreOptions,
    rep: &Reporter,
) -> Result<ShardsScored> {
    shards::prepare_out_dir(dir, shards)?;
    let columns = engine.input_options(opts.columns.clone());
    let cache = opts.cache.resolve()?;
    let mut warnings = FileWarnings::default();
    let source = shard_source(engine, &columns)?;
    let summary = shards::run(
        dir,
        shards,
        "score",
        |_| "parquet",
        |_| Ok(source.clone()),
        |p| InputSet::open(&[p.to_path_buf()], &columns),
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
    Ok(ShardsScored {
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
        warnings: warnings.all,
    })
}
