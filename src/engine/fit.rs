//! `ncclean fit`: train a method on prepared inputs and write the run
//! directory (`checkpoint/`, `labels.parquet`, `filtered.parquet`,
//! `stats.json`, `run.json`), committed as a whole (see [`crate::run::dir`]).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use candle_core::Device;
use ncclean_pipelines::config::CleanProbSource;
use ncclean_pipelines::{EpochStats, Observer, TrainConfig};
use serde::Serialize;

use super::keep::join_by_position;
use super::labels::config_hash;
use super::prepare::{Prepared, PreparedRun, Preparer};
use super::trained::Engine;
use crate::curation::division_check::{MixtureSummary, SignalCheck};
use crate::curation::threshold::{Cut, Ranked, Record, Rule};
use crate::data::sample::{Sample, SampleInfo};
use crate::data::{self, InputSet, READ_BATCH_ROWS};
use crate::error::{invalid, Error, Result};
use crate::run::checkpoint::{self, CheckpointState};
use crate::run::dir::{self, RunDir};
use crate::run::run_json::{self, RunJson};
use crate::runtime::progress::Reporter;
use crate::towers::encoders::EncoderSpec;
use crate::towers::features::CacheOptions;

/// What `fit` was asked to do.
#[derive(Debug, Clone)]
pub struct FitOptions {
    /// Method name.
    pub method: String,
    /// Resolved configuration.
    pub config: TrainConfig,
    /// Seed for initialisation, batch order and shuffles.
    pub seed: u64,
    /// Run directory.
    pub out_dir: PathBuf,
    /// Towers.
    pub encoders: EncoderSpec,
    /// Feature cache.
    pub cache: CacheOptions,
    /// Continue from the epoch checkpoint of `out_dir` if there is one
    /// ([`dir::resume_dir`]).
    pub resume: bool,
    /// Replace an `out_dir` that is not an ncclean run, or that lies inside
    /// an input directory.
    pub force: bool,
    /// The DATA arguments as given, for the out-dir checks.
    pub data_args: Vec<PathBuf>,
    /// Where the data lives and how it was read, for run.json (`score`
    /// without DATA, `report`'s pictures).
    pub run_inputs: crate::run::inputs::RunInputs,
    /// The rule for the clean set (`None`: `clean_prob >=` the
    /// configuration's `threshold`).
    pub rule: Option<Rule>,
    /// Train on this many rows drawn from the input ([`Sample`]) instead
    /// of all of them.
    pub sample: Option<usize>,
}

/// What `fit` did.
#[derive(Debug, Clone, Serialize)]
pub struct FitSummary {
    /// Input rows.
    pub rows: usize,
    /// Usable pairs trained on.
    pub pairs: usize,
    /// Rows skipped, with their reasons in labels.parquet.
    pub skipped: usize,
    /// Pairs called clean.
    pub clean: usize,
    /// Mean of `1 - clean_prob` over the usable pairs: the mixture's
    /// estimate of the noisy share, the same as `cut.estimated_noise_rate`.
    pub estimated_noise_rate: f64,
    /// The rule for the clean set, its cut and what it keeps.
    pub cut: Cut,
    /// The cut in one sentence, as the log says it.
    pub threshold_summary: String,
    /// The final division's mixture, summarised (means, weights,
    /// separation; `division` below holds it whole for the report).
    pub mixture: MixtureSummary,
    /// The trained model's pairs against random pairings (`None`: fewer
    /// than 2 pairs).
    pub signal: Option<SignalCheck>,
    /// "no signal" / "no noise found" warnings, as printed.
    pub warnings: Vec<String>,
    /// Seconds reading and decoding.
    pub read_seconds: f64,
    /// Seconds training: the epochs, their resume checkpoints, the final
    /// division and the clean-probability model.
    pub train_seconds: f64,
    /// Seconds in the epochs alone (those this process ran): what a
    /// training loop without checkpoints or a final model would take, the
    /// part of `train_seconds` that examples/bench_train_speed.sh compares
    /// with the numpy reference's training time.
    pub epoch_seconds: f64,
    /// Seconds of the final scoring pass.
    pub score_seconds: f64,
    /// Scoring throughput.
    pub score_pairs_per_second: f64,
    /// Per-epoch statistics.
    pub epochs: Vec<EpochStats>,
    /// Rows written to filtered.parquet.
    pub filtered_rows: usize,
    /// Clean rows missing from filtered.parquet because they could not be
    /// read back from the input (damaged row groups, invalid UTF-8 in a
    /// column only the copy reads); a partial result when not 0.
    pub filtered_dropped: usize,
    /// CPU threads of candle's matmuls and other ops (timings depend on it).
    pub threads: crate::runtime::threads::ThreadSettings,
    /// The final division's mixture and a histogram of the statistic it was
    /// fitted on, for `ncclean report`; absent when the checkpoint holds no
    /// division.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub division: Option<crate::curation::division_record::DivisionRecord>,
    /// The rows trained on when `--sample` drew some (labels.parquet and
    /// filtered.parquet cover those rows only).
    pub sample: Option<SampleInfo>,
}

impl FitSummary {
    /// The run in one line, as `fit` says it on stderr.
    pub fn log_line(&self) -> String {
        format!(
            "{} rows: {} usable ({} skipped), {} clean, estimated noise {:.1}%; trained in {:.1}s, scored {:.0} pairs/s",
            self.rows,
            self.pairs,
            self.skipped,
            self.clean,
            100.0 * self.estimated_noise_rate,
            self.train_seconds,
            self.score_pairs_per_second
        )
    }

    /// What `fit` prints on stdout for the run in `out_dir`.
    pub fn printed(&self, out_dir: &Path) -> FitPrinted<'_> {
        FitPrinted {
            out_dir: out_dir.display().to_string(),
            rows: self.rows,
            usable: self.pairs,
            skipped: self.skipped,
            clean: self.clean,
            estimated_noise_rate: self.estimated_noise_rate,
            min_prob: self.cut.min_prob,
            min_similarity: self.cut.min_similarity,
            expected_precision: self.cut.expected_precision,
            warnings: &self.warnings,
            train_seconds: self.train_seconds,
            score_pairs_per_second: self.score_pairs_per_second,
        }
    }

    /// A partial result (exit 4) when clean rows are missing from
    /// `out_dir`'s filtered.parquet.
    pub fn check_filtered(&self, out_dir: &Path) -> Result<()> {
        data::FilterSummary {
            rows_in: self.rows,
            rows_out: self.filtered_rows,
            dropped: self.filtered_dropped,
        }
        .check(&out_dir.join("filtered.parquet"))
    }
}

/// What `fit` prints on stdout ([`FitSummary::printed`]).
#[derive(Debug, Serialize)]
pub struct FitPrinted<'a> {
    out_dir: String,
    rows: usize,
    usable: usize,
    skipped: usize,
    clean: usize,
    estimated_noise_rate: f64,
    min_prob: f64,
    min_similarity: Option<f64>,
    expected_precision: f64,
    warnings: &'a [String],
    train_seconds: f64,
    score_pairs_per_second: f64,
}

/// Train `opts.method` on `input`, write the run directory and return a summary.
///
/// The phases, in order: [`begin`] the run directory, [`prepare`] the
/// rows, [`train`] (or resume) and save the checkpoint, [`score_and_cut`]
/// the training pairs through the reloaded checkpoint, and [`write`] the
/// outputs and commit the run.
pub fn fit(
    input: &InputSet,
    opts: &FitOptions,
    device: &Device,
    rep: &Reporter,
) -> Result<FitSummary> {
    // filtered.parquet holds every input column: shards that differ would
    // fail only after training, so their footers are compared first.
    data::check_same_schema(input)?;
    let t0 = Instant::now();
    let run_dir = begin(input, opts)?;
    let sample = opts.sample.and_then(|n| Sample::draw(input, n, opts.seed));
    let run = prepare(input, opts, &run_dir, sample.as_ref(), device, rep)?;
    let read_seconds = t0.elapsed().as_secs_f64();
    rep.info(&format!(
        "read {} rows: {} usable, {} skipped ({read_seconds:.1}s)",
        run.prepared.rows.len(),
        run.prepared.ok.len(),
        run.prepared.skipped()
    ));
    let trained = train(input, opts, &run_dir, &run, sample.as_ref(), device, rep)?;
    let labelled = score_and_cut(input, opts, &trained.checkpoint, &run.prepared, device, rep)?;
    write(
        input,
        opts,
        device,
        run_dir,
        &run.prepared,
        sample.as_ref(),
        trained,
        labelled,
        read_seconds,
    )
}

/// Phase 1: start the run directory (outputs go to its staging directory
/// until the commit).
fn begin(input: &InputSet, opts: &FitOptions) -> Result<RunDir> {
    let files: Vec<PathBuf> = input.files.iter().map(|f| f.path.clone()).collect();
    RunDir::begin(
        &opts.out_dir,
        dir::Inputs {
            args: &opts.data_args,
            files: &files,
        },
        opts.force,
    )
}

/// Phase 2: read the rows (all, or the sample) into head inputs, and
/// refuse data that labels could not be joined back to or too few pairs.
fn prepare(
    input: &InputSet,
    opts: &FitOptions,
    run_dir: &RunDir,
    sample: Option<&Sample>,
    device: &Device,
    rep: &Reporter,
) -> Result<PreparedRun> {
    let cfg = &opts.config;
    let want_local = ncclean_pipelines::presets::head_for(&opts.method, cfg).local;
    let preparer = Preparer::new(input, &opts.encoders, cfg, want_local, &opts.cache, device)?;
    if let Some(earlier) = crate::run::inputs::earlier_run(run_dir.out()) {
        // With a default --out-dir, a second dataset's fit would otherwise
        // replace the first one's run without a word (said once the inputs
        // and towers are accepted, not before an error).
        rep.info(&format!(
            "{} holds a run fitted on {earlier}: it is replaced when this run completes \
             (--out-dir DIR keeps runs apart)",
            opts.out_dir.display()
        ));
    }
    let run = match sample {
        None => {
            if let Some(n) = opts.sample {
                rep.info(&format!(
                    "--sample {n} covers all {} input rows: training on all of them",
                    input.num_rows()
                ));
            }
            preparer.prepare(input.pairs(READ_BATCH_ROWS), input.num_rows(), None, rep)?
        }
        Some(s) => {
            rep.info(&format!(
                "training on a sample of {} of the {} input rows (seed {}); \
                 label every row with `ncclean score`",
                s.len(),
                input.num_rows(),
                opts.seed
            ));
            preparer.prepare(s.filter(input.pairs(READ_BATCH_ROWS)), s.len(), None, rep)?
        }
    };
    let prepared = &run.prepared;
    // Labels are joined back to the data by key (`filter`): a run on keys
    // that repeat would write labels nothing can use.
    let dups = data::DuplicateKeys::of(prepared.rows.iter().map(|r| r.key.as_str()));
    if dups.repeats > 0 {
        return Err(invalid(format!(
            "{}: labels could not be joined back to these rows by key. Name a column with a unique value per row \
             (--key-col), or leave the data without a key column so rows are keyed <file stem>:<row>; \
             `ncclean inspect` reports duplicates",
            dups.sentence()
        )));
    }
    if prepared.ok.len() < 2 {
        return Err(invalid(format!(
            "{}: only {} usable pair(s) out of {} rows; fit needs at least 2 (see the reasons with `ncclean inspect`)",
            input.display_name(0),
            prepared.ok.len(),
            prepared.rows.len()
        )));
    }
    Ok(run)
}

/// What training left: the saved checkpoint and the epochs' statistics.
struct Trained {
    /// `checkpoint/` in the staging directory.
    checkpoint: PathBuf,
    /// The epoch checkpoint, removed once the run is committed.
    resume_dir: PathBuf,
    /// Per-epoch statistics (those of resumed epochs included).
    epochs: Vec<EpochStats>,
    /// Seconds training (all epochs and the final division).
    seconds: f64,
    /// Seconds in the epochs this process ran.
    epoch_seconds: f64,
}

/// Phase 3: build the pipeline, continue an interrupted run with
/// `--resume`, train the remaining epochs (saving an epoch checkpoint after
/// each), fit the final division and save the checkpoint.
fn train(
    input: &InputSet,
    opts: &FitOptions,
    run_dir: &RunDir,
    run: &PreparedRun,
    sample: Option<&Sample>,
    device: &Device,
    rep: &Reporter,
) -> Result<Trained> {
    let cfg = &opts.config;
    let prepared = &run.prepared;
    let model = ncclean_pipelines::presets::model_config(
        &opts.method,
        cfg,
        run.image.clone(),
        run.text.clone(),
    );
    let mut pipeline =
        ncclean_pipelines::build(&opts.method, cfg.clone(), &model, opts.seed, device)?;
    let t1 = Instant::now();
    let total = pipeline.total_epochs();
    let make_state = |pipeline: &dyn ncclean_pipelines::Pipeline| CheckpointState {
        format_version: checkpoint::FORMAT_VERSION,
        ncclean_version: env!("CARGO_PKG_VERSION").to_string(),
        method: opts.method.clone(),
        seed: opts.seed,
        config: cfg.clone(),
        model: model.clone(),
        vocab: run.vocab.clone(),
        encoders: opts.encoders.clone(),
        columns: input.columns.clone(),
        train_pairs: prepared.ok.len(),
        pipeline: pipeline.state(),
    };
    check_state_size(&make_state(pipeline.as_ref()))?;
    let resume_dir = dir::resume_dir(run_dir.out());
    // A sample is the training data: another sample is other data.
    let training_data = match sample {
        None => input.fingerprint()?,
        Some(s) => format!(
            "{}; sample of {} rows, seed {}",
            input.fingerprint()?,
            s.len(),
            opts.seed
        ),
    };
    let mut info = checkpoint::ResumeInfo {
        input_fingerprint: training_data,
        config_hash: config_hash(cfg),
        epochs: Vec::with_capacity(total),
    };
    if opts.resume {
        let fresh = make_state(pipeline.as_ref());
        resume(
            &resume_dir,
            &fresh,
            &mut info,
            total,
            pipeline.as_mut(),
            rep,
        )?;
    } else if resume_dir.exists() {
        rep.info(&format!(
            "{} holds an interrupted run; it is replaced (pass --resume to continue it instead)",
            resume_dir.display()
        ));
    }
    let mut obs = rep.observer();
    let mut epoch_seconds = 0.0;
    for e in info.epochs.len()..total {
        let te = Instant::now();
        let stats = match pipeline.run_epoch(e, &prepared.inputs, &mut obs) {
            Ok(s) => s,
            Err(ncclean_pipelines::Error::Interrupted) => {
                return Err(interrupted(run_dir.out(), &resume_dir, e, total))
            }
            Err(err) => return Err(Error::from(err).context(format!("training epoch {}", e + 1))),
        };
        obs.finish();
        let seconds = te.elapsed().as_secs_f64();
        epoch_seconds += seconds;
        rep.epoch(&stats, total, seconds);
        info.epochs.push(stats);
        checkpoint::save_resume(
            &resume_dir,
            &make_state(pipeline.as_ref()),
            pipeline.as_mut(),
            &info,
        )?;
    }
    pipeline
        .finalize(
            &prepared.inputs,
            &prepared.shard_sizes(input.files.len()),
            &mut obs,
        )
        .map_err(|e| Error::from(e).context("final division"))?;
    obs.finish();
    let seconds = t1.elapsed().as_secs_f64();

    let state = make_state(pipeline.as_ref());
    let ckpt_dir = run_dir.staging().join("checkpoint");
    checkpoint::save(&ckpt_dir, &state, pipeline.as_mut())?;
    Ok(Trained {
        checkpoint: ckpt_dir,
        resume_dir,
        epochs: info.epochs,
        seconds,
        epoch_seconds,
    })
}

/// `--resume`: load the epoch checkpoint in `resume_dir` into `pipeline`
/// and its finished epochs into `info`, refusing one that another command
/// (method, seed, configuration, data, towers) wrote.
fn resume(
    resume_dir: &Path,
    fresh: &CheckpointState,
    info: &mut checkpoint::ResumeInfo,
    total: usize,
    pipeline: &mut dyn ncclean_pipelines::Pipeline,
    rep: &Reporter,
) -> Result<()> {
    let Some((state, saved)) = checkpoint::read_resume(resume_dir)? else {
        rep.info(&format!(
            "nothing to resume in {}: training from the first epoch",
            resume_dir.display()
        ));
        return Ok(());
    };
    let differs = [
        ("method", state.method != fresh.method),
        ("seed", state.seed != fresh.seed),
        ("configuration", saved.config_hash != info.config_hash),
        (
            "input data",
            saved.input_fingerprint != info.input_fingerprint,
        ),
        (
            "towers",
            state.model != fresh.model || state.encoders != fresh.encoders,
        ),
    ];
    let what: Vec<&str> = differs.iter().filter(|d| d.1).map(|d| d.0).collect();
    if !what.is_empty() || saved.epochs.len() > total {
        return Err(Error::Usage(format!(
            "{}: the interrupted run differs from this command ({}); run the same command \
             with --resume to continue it, or drop --resume to start over",
            resume_dir.display(),
            what.join(", ")
        )));
    }
    checkpoint::load_resume(resume_dir, &state, pipeline)?;
    info.epochs = saved.epochs;
    rep.info(&format!(
        "resuming after epoch {} of {total} from {}",
        info.epochs.len(),
        resume_dir.display()
    ));
    Ok(())
}

/// The training pairs labelled through the reloaded checkpoint, with the
/// cut and what the division check said.
struct Labelled {
    engine: Engine,
    scored: super::trained::Scored,
    cut: Cut,
    division: MixtureSummary,
    signal: Option<SignalCheck>,
    warnings: Vec<String>,
    metadata: std::collections::BTreeMap<String, String>,
}

/// Phase 4: score the training pairs through the reloaded checkpoint
/// (exactly what `ncclean score` does), resolve the rule on them and store
/// the cut in the checkpoint (so `score` applies the same one on every
/// shard), and check that the division means something.
fn score_and_cut(
    input: &InputSet,
    opts: &FitOptions,
    ckpt_dir: &Path,
    prepared: &Prepared,
    device: &Device,
    rep: &Reporter,
) -> Result<Labelled> {
    let cfg = &opts.config;
    let mut engine = Engine::load(ckpt_dir, device)?;
    let mut scored = engine.score_rows(input, prepared, false, rep)?;
    let pairs = Ranked::labelled(&scored.labels);
    let rule = opts.rule.unwrap_or(Rule::MinProb(cfg.threshold));
    let record = Record::fit(rule, &pairs);
    record.save(ckpt_dir)?;
    let cut = record.cut;
    engine.set_record(record);
    for l in &mut scored.labels {
        l.is_clean = cut.keeps(l.clean_prob, l.similarity);
    }
    rep.info(&cut.summary());
    let division = division_summary(&engine.state)?;
    let all: Vec<usize> = (0..prepared.ok.len()).collect();
    let signal = engine.signal_check(&prepared.inputs, &all)?;
    // A model that cannot tell its pairs from random pairings (collapsed by
    // a learning rate far too high, or given columns that do not belong
    // together) calls pairs clean at random, often every one of them: no
    // run, no filter, whatever the division made of it.
    if let Some(s) = signal.filter(SignalCheck::no_signal) {
        return Err(invalid(format!(
            "no signal: {}; no run was written to {}. Check that the image and caption columns \
             belong together and that the towers suit the data; a learning rate too high \
             collapses the model (every similarity the same): lower --lr, or keep the \
             method's default",
            s.no_signal_reason(),
            opts.out_dir.display()
        )));
    }
    let mut warnings: Vec<String> = division.warning().into_iter().collect();
    if division.fallback.is_none() {
        if let Some(s) = &signal {
            // The estimate is the final model's where one gives clean_prob
            // (the division's mixture is then not what the labels read).
            let estimator = if engine.state.has_clean_model() {
                "the clean model (calibrated on held-out pairs against random pairings)".to_string()
            } else {
                format!("the mixture ({})", division.describe())
            };
            warnings.extend(s.warnings(
                cut.estimated_noise_rate,
                1.0 - cut.kept_fraction(),
                rule.follows_division(cfg.threshold),
                &estimator,
            ));
        }
    }
    warnings.extend(uncalibrated_warning(
        cfg,
        prepared.ok.len(),
        cut.estimated_noise_rate,
    ));
    for w in &warnings {
        crate::runtime::progress::warn_once(w);
    }
    let metadata = engine.metadata(&super::LabelsSummary {
        refit: false,
        input_fingerprint: input.fingerprint()?,
        rows: scored.labels.len(),
        skipped: prepared.skipped(),
        cut,
        warnings: warnings.clone(),
    })?;
    Ok(Labelled {
        engine,
        scored,
        cut,
        division,
        signal,
        warnings,
        metadata,
    })
}

/// The warning of a fit on too few pairs to hold any out for calibration
/// ([`ncclean_pipelines::runner::calibration_size`]): its clean model is
/// calibrated on the pairs the head trained on, so its noise estimate is
/// rough, and off in either direction (demo files of 200–450 pairs with 30%
/// noise, 60 epochs: 16–35%; 200 pairs after 6 epochs, barely trained:
/// 83%). Holding out a fifth of so few pairs did worse (0% on 6 of 9 of
/// those files). None where the clean model does not give `clean_prob` or
/// pairs were held out.
fn uncalibrated_warning(cfg: &TrainConfig, pairs: usize, estimated_noise: f64) -> Option<String> {
    use ncclean_pipelines::runner::{calibration_size, MAX_SMALL_SHARE, MIN_CALIBRATION_PAIRS};
    if cfg.clean_prob != CleanProbSource::Reference || calibration_size(pairs) > 0 {
        return None;
    }
    let enough = (MIN_CALIBRATION_PAIRS as f64 / MAX_SMALL_SHARE).round();
    Some(format!(
        "few pairs to calibrate on: {pairs} pairs are too few to hold any out of training to \
         calibrate clean_prob on (fit does from {enough} pairs up), so it was calibrated on the \
         pairs the head trained on, and the estimated noise rate ({:.1}%) and clean_prob's \
         values are rough (on demo files of 200-450 pairs with 30% noise they estimated \
         16-35%); rank by clean_prob (--keep-fraction F keeps the best F) rather than trust \
         its values, or fit on at least {enough} pairs",
        100.0 * estimated_noise
    ))
}

/// Phase 5: write labels.parquet, filtered.parquet, stats.json and, last,
/// run.json; commit the run directory and remove the epoch checkpoint.
#[allow(clippy::too_many_arguments)]
fn write(
    input: &InputSet,
    opts: &FitOptions,
    device: &Device,
    run_dir: RunDir,
    prepared: &Prepared,
    sample: Option<&Sample>,
    trained: Trained,
    labelled: Labelled,
    read_seconds: f64,
) -> Result<FitSummary> {
    let cfg = &opts.config;
    let out = run_dir.staging().to_path_buf();
    let Labelled {
        engine,
        scored,
        cut,
        division,
        signal,
        warnings,
        metadata,
    } = labelled;
    let labels_path = out.join("labels.parquet");
    data::write_labels(&labels_path, &scored.labels, &metadata)?;
    let joined = join_by_position(input, &scored.labels, |l| l.is_clean, sample.is_none())?;
    let filtered = data::write_filtered_annotated(
        input,
        &joined.keep,
        &out.join("filtered.parquet"),
        &metadata,
        Some(data::Annotations {
            labels: &scored.labels,
            label_of: &joined.label_of,
            decision: None,
        }),
    )?;

    let summary = FitSummary {
        rows: prepared.rows.len(),
        pairs: prepared.ok.len(),
        skipped: prepared.skipped(),
        clean: cut.kept,
        estimated_noise_rate: cut.estimated_noise_rate,
        cut,
        threshold_summary: cut.summary(),
        mixture: division,
        signal,
        warnings,
        read_seconds,
        train_seconds: trained.seconds,
        epoch_seconds: trained.epoch_seconds,
        score_seconds: scored.seconds,
        score_pairs_per_second: scored.pairs as f64 / scored.seconds.max(1e-9),
        epochs: trained.epochs,
        filtered_rows: filtered.rows_out,
        filtered_dropped: filtered.dropped,
        threads: crate::runtime::threads::current(),
        division: crate::curation::division_record::DivisionRecord::of(
            engine.state.division(),
            engine.state.division_statistic(),
            &scored.statistic,
        ),
        sample: sample.map(Sample::info),
    };
    let stats_json = serde_json::to_vec_pretty(&summary).context("serialising stats")?;
    data::write_atomic(&out.join("stats.json"), &stats_json)?;
    let run = RunJson {
        ncclean_version: Some(env!("CARGO_PKG_VERSION").to_string()),
        ncclean_build: Some(crate::runtime::build_info::current().json()),
        method: Some(opts.method.clone()),
        seed: Some(opts.seed),
        config: Some(cfg.clone()),
        config_hash: Some(config_hash(cfg)),
        model: Some(engine.state.model.clone()),
        encoders: Some(opts.encoders.clone()),
        columns: Some(input.columns.clone()),
        image_root: input.image_root.clone(),
        image_limits: Some(input.image_limits),
        inputs: Some(
            (0..input.files.len())
                .map(|f| input.display_name(f))
                .collect(),
        ),
        input_files: Some(opts.run_inputs.clone()),
        input_fingerprint: metadata.get("ncclean.input_fingerprint").cloned(),
        checkpoint_sha256: metadata.get("ncclean.checkpoint_sha256").cloned(),
        threshold: Some(cut),
        sample: summary.sample.clone(),
        device: Some(format!("{device:?}")),
        command: Some(std::env::args().collect()),
        complete: true,
    };
    let run_json = run.to_vec_pretty().context("serialising run.json")?;
    // Written last: its presence says every other output is in place.
    data::write_atomic(&out.join(run_json::FILE), &run_json)?;
    crate::runtime::interrupt::check()?;
    run_dir.commit()?;
    // The run is complete: its epoch checkpoint has served.
    let resume_dir = trained.resume_dir;
    if resume_dir.exists() {
        std::fs::remove_dir_all(&resume_dir)
            .with_context(|| format!("cannot remove {}", resume_dir.display()))?;
    }
    Ok(summary)
}

/// Refuse, before any epoch, a checkpoint state that would be too large to
/// be read back (`score`, and `fit` itself after training, read state.json
/// bounded by [`crate::runtime::small_file::RUN_FILE_LIMIT`]): half of it, as
/// training adds the division and its statistics.
fn check_state_size(state: &CheckpointState) -> Result<()> {
    let bytes = serde_json::to_vec(state)
        .context("serialising checkpoint state")?
        .len() as u64;
    let limit = crate::runtime::small_file::RUN_FILE_LIMIT / 2;
    if bytes > limit {
        let vocab = state.vocab.as_ref().map_or(0, |v| v.words.len());
        return Err(invalid(format!(
            "the checkpoint state would take {} MiB (vocabulary of {vocab} words), more than the \
             {} MiB a checkpoint may hold; nothing was trained. Check the caption column (is it \
             text?), or give precomputed text embeddings",
            bytes >> 20,
            limit >> 20
        )));
    }
    Ok(())
}

/// The final division of a checkpoint, summarised.
fn division_summary(state: &CheckpointState) -> Result<MixtureSummary> {
    let division = state
        .division()
        .context("reading the final division from the checkpoint state")?;
    Ok(MixtureSummary::of(&division))
}

/// The error for a stop during epoch `e` (0-based) of `total`, saying what
/// is kept and how to continue.
fn interrupted(
    out: &std::path::Path,
    resume_dir: &std::path::Path,
    e: usize,
    total: usize,
) -> Error {
    let kept = if e == 0 {
        "no epoch had finished".to_string()
    } else {
        format!(
            "epochs 1-{e} are saved in {}; run the same command with --resume to continue",
            resume_dir.display()
        )
    };
    Error::Interrupted(format!(
        "interrupted during epoch {} of {total}: {} was left as it was; {kept}",
        e + 1,
        out.display()
    ))
}
