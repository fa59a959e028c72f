//! `ncclean fit`: train, then label and filter the training data.

use std::path::PathBuf;

use clap::Args;

use crate::data::TextEmbeddings;
use crate::engine::{self, FitOptions};
use crate::error::{invalid, Error, Result};
use crate::runtime::progress::Reporter;
use crate::towers::choice::TowerFlags;
use crate::towers::encoders::TextEncoder;

use super::threshold::ThresholdArgs;
use super::{CacheArgs, DataArgs, EncoderArgs, ImageArgs, OutcomeArgs};

/// Arguments of `ncclean fit`.
#[derive(Debug, Args)]
pub struct FitArgs {
    #[command(flatten)]
    pub data: DataArgs,
    #[command(flatten)]
    pub images: ImageArgs,
    #[command(flatten)]
    pub encoders: EncoderArgs,
    #[command(flatten)]
    pub cache: CacheArgs,
    #[command(flatten)]
    pub outcome: OutcomeArgs,
    /// Noisy-correspondence method. Each one's defaults are its paper's, in
    /// pipelines/presets/<method>.toml; recon needs local features (demo or
    /// frozen towers, not embedding columns). The default, gsc, is the one
    /// that held on Flickr8k at every measured noise rate and kind (random
    /// 20-70%, hard 20-50%; BENCHMARKS.md), where vanilla degrades above 50%.
    #[arg(long, default_value = "gsc", value_parser = method_names())]
    pub method: String,
    /// Run directory: run.json, checkpoint/, labels.parquet, filtered.parquet, stats.json.
    /// It is replaced as a whole when the new run is complete (until then the
    /// previous run stays readable); it must be new, empty or an earlier run.
    /// `score` and `report` read ./ncclean-run when not told otherwise.
    #[arg(long, value_name = "DIR", default_value = crate::run::inputs::DEFAULT_RUN_DIR)]
    pub out_dir: PathBuf,
    /// Replace --out-dir even if it holds files that are not an ncclean run
    /// (they are deleted) or lies inside an input directory.
    #[arg(long)]
    pub force: bool,
    /// Seed for initialisation, batch order and shuffles (same seed, same result on CPU).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Total epochs, warm-up included (default: the method's preset).
    #[arg(long)]
    pub epochs: Option<usize>,
    /// Warm-up epochs (default: the method's preset).
    #[arg(long)]
    pub warmup_epochs: Option<usize>,
    /// Pairs per batch (default: the method's preset).
    #[arg(long)]
    pub batch_size: Option<usize>,
    /// Learning rate (default: the method's preset).
    #[arg(long)]
    pub lr: Option<f64>,
    /// Matching head: mean (a projection of each tower's global vector) or gpo (VSE∞ pooling over projected
    /// grid cells / patches and tokens; loads the frozen towers' local features, ~50× the global ones).
    /// Default: the method's preset (gpo for recon, mean otherwise).
    #[arg(long, value_parser = ["mean", "gpo"])]
    pub head: Option<String>,
    /// The rule for is_clean and filtered.parquet, resolved on the training
    /// pairs and stored with the checkpoint, so that `score` applies the
    /// same cut to every shard. It does not change training (the
    /// division's own threshold during training is `--set threshold=P`).
    #[command(flatten)]
    pub threshold: ThresholdArgs,
    /// TOML file overriding the preset (a [<method>] table or top-level keys); flags override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Override any configuration key, as TOML: `--set params.beta=0.3 --set mixture=\"bmm\"`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub sets: Vec<String>,
    /// Continue an interrupted fit from its last finished epoch (kept beside
    /// the run in .<OUT_DIR name>.resume/, written after every epoch and
    /// removed when the run completes). The same data,
    /// method, seed and configuration are required; on CPU the result is
    /// identical to a run that was never interrupted. Without it, an
    /// interrupted run's epoch checkpoint is replaced.
    #[arg(long)]
    pub resume: bool,
    /// Train on N rows drawn at random from all input files instead of every
    /// row, for inputs too large to train on whole. The draw is uniform
    /// without replacement over the rows in input order, seeded by --seed
    /// (same input, N and seed: same sample); run.json and stats.json record
    /// it. labels.parquet and filtered.parquet then cover the drawn rows
    /// only: label every row with `ncclean score --checkpoint DIR --out FILE`
    /// (without DATA it reads the run's inputs).
    #[arg(long, value_name = "N")]
    pub sample: Option<usize>,
    /// Device: auto (CUDA when this build has it and a GPU answers, else the
    /// CPU), cpu, cuda or cuda:N. The choice is said on stderr.
    #[arg(long, default_value = "auto")]
    pub device: String,
}

/// The `--method` choices with their one-line summaries, from the registry.
fn method_names() -> clap::builder::PossibleValuesParser {
    clap::builder::PossibleValuesParser::new(
        ncclean_pipelines::registry::METHODS
            .iter()
            .map(|m| clap::builder::PossibleValue::new(m.name).help(m.summary)),
    )
}

/// Flags that override the configuration, as a partial TOML table.
fn overrides(a: &FitArgs) -> Result<toml::Table> {
    let mut t = ncclean_pipelines::config::parse_sets(&a.sets).map_err(Error::Usage)?;
    // Saturated: a count past i64 is refused by validate as out of range,
    // naming the key (a wrapped -1 was not).
    let int = |v: usize| toml::Value::Integer(i64::try_from(v).unwrap_or(i64::MAX));
    let flags = [
        ("epochs", "--epochs", a.epochs.map(int)),
        ("warmup_epochs", "--warmup-epochs", a.warmup_epochs.map(int)),
        ("batch_size", "--batch-size", a.batch_size.map(int)),
        ("lr", "--lr", a.lr.map(toml::Value::Float)),
        ("head", "--head", a.head.clone().map(toml::Value::String)),
    ];
    for (key, flag, value) in flags {
        let Some(value) = value else { continue };
        // One of the two would be dropped without a word.
        if let Some(set) = t.get(key) {
            return Err(Error::Usage(format!(
                "--set {key}={set} and {flag} {value} both set {key}; give one of them"
            )));
        }
        t.insert(key.into(), value);
    }
    Ok(t)
}

pub fn run(a: FitArgs, rep: &Reporter) -> Result<()> {
    let rule = a.threshold.rule()?;
    let chosen = crate::runtime::device::choose(&a.device)?;
    let user = match &a.config {
        Some(p) => Some(crate::runtime::small_file::read_text(
            p,
            crate::runtime::small_file::CONFIG_LIMIT,
            "config file",
        )?),
        None => None,
    };
    let (config, notes) =
        ncclean_pipelines::presets::resolve_with_notes(&a.method, user.as_deref(), &overrides(&a)?)
            .map_err(|e| match &a.config {
                Some(p) => invalid(format!("{}: {e}", p.display())),
                None => Error::Usage(e),
            })?;
    // Every key's range and the method's own parameters, before any input
    // is read (exit 2 naming the key, the value and the allowed range).
    ncclean_pipelines::registry::validate(&a.method, &config)?;
    for note in &notes {
        rep.info(note);
    }
    if a.sample.is_some_and(|n| n < 2) {
        return Err(Error::Usage(
            "--sample must be at least 2 (the number of rows to train on)".into(),
        ));
    }
    let mut columns = a.data.options_with(&a.images);
    if a.encoders.text_encoder == Some(TextEncoder::Precomputed) {
        columns.text_embeddings = TextEmbeddings::Require;
    }
    let input = a.data.open_options(&columns)?;
    let e = &a.encoders;
    let encoders = crate::towers::choice::choose(
        &input,
        &TowerFlags {
            image_encoder: e.image_encoder,
            text_encoder: e.text_encoder,
            image_model: e.image_model.clone(),
            text_model: e.text_model.clone(),
            tower_dtype: e.tower_dtype,
        },
        rep,
    )?;
    let opts = FitOptions {
        encoders,
        cache: a.cache.options()?,
        method: a.method.clone(),
        config,
        seed: a.seed,
        out_dir: a.out_dir.clone(),
        resume: a.resume,
        force: a.force,
        data_args: a.data.data.clone(),
        run_inputs: crate::run::inputs::RunInputs::of(
            &input,
            a.data.caption_from.clone(),
            a.data.key_from.clone(),
        )?,
        rule,
        sample: a.sample,
    };
    rep.info(&chosen.line);
    let s = engine::fit(&input, &opts, &chosen.device, rep)?;
    rep.info(&format!(
        "{} rows: {} usable ({} skipped), {} clean, estimated noise {:.1}%; trained in {:.1}s, scored {:.0} pairs/s",
        s.rows,
        s.pairs,
        s.skipped,
        s.clean,
        100.0 * s.estimated_noise_rate,
        s.train_seconds,
        s.score_pairs_per_second
    ));
    super::print_summary(&FitPrinted {
        out_dir: a.out_dir.display().to_string(),
        rows: s.rows,
        usable: s.pairs,
        skipped: s.skipped,
        clean: s.clean,
        estimated_noise_rate: s.estimated_noise_rate,
        min_prob: s.cut.min_prob,
        min_similarity: s.cut.min_similarity,
        expected_precision: s.cut.expected_precision,
        warnings: &s.warnings,
        train_seconds: s.train_seconds,
        score_pairs_per_second: s.score_pairs_per_second,
    })?;
    a.outcome.check(s.rows, s.skipped)?;
    crate::data::FilterSummary {
        rows_in: s.rows,
        rows_out: s.filtered_rows,
        dropped: s.filtered_dropped,
    }
    .check(&a.out_dir.join("filtered.parquet"))
}

/// What `fit` prints on stdout.
#[derive(serde::Serialize)]
struct FitPrinted<'a> {
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
