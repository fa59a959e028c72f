//! `ncclean fit`: train, then label and filter the training data.

use std::path::PathBuf;

use clap::Args;

use crate::data::TextEmbeddings;
use crate::engine::configure::{self, ConfigFlags};
use crate::engine::{self, FitOptions};
use crate::error::{Error, Result};
use crate::runtime::progress::Reporter;
use crate::towers::choice::{self, TowerFlags};
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
    /// Noisy-correspondence method. Each one's defaults are in
    /// pipelines/presets/<method>.toml: its paper's schedule where the toy
    /// towers train, a short one where the towers are frozen (pretrained or
    /// embedding columns: a head on fixed features memorises noisy pairs
    /// within a few epochs); recon needs local features (demo or frozen
    /// towers, not embedding columns). The default, gsc, is the one
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

/// Run `ncclean fit`.
pub fn run(a: FitArgs, rep: &Reporter) -> Result<()> {
    let rule = a.threshold.rule()?;
    let chosen = crate::runtime::device::choose(&a.device)?;
    let config_flags = ConfigFlags {
        method: a.method.clone(),
        config: a.config.clone(),
        sets: a.sets.clone(),
        epochs: a.epochs,
        warmup_epochs: a.warmup_epochs,
        batch_size: a.batch_size,
        lr: a.lr,
        head: a.head.clone(),
    };
    configure::check(&config_flags)?;
    if a.sample.is_some_and(|n| n < 2) {
        return Err(Error::Usage(
            "--sample must be at least 2 (the number of rows to train on)".into(),
        ));
    }
    let mut columns = a.data.options_with(&a.images);
    if a.encoders.text_encoder == Some(TextEncoder::Precomputed) {
        columns.text_embeddings = TextEmbeddings::Require;
    }
    let mut input = a.data.open_options(&columns)?;
    let e = &a.encoders;
    let flags = TowerFlags {
        image_encoder: e.image_encoder,
        text_encoder: e.text_encoder,
        image_model: e.image_model.clone(),
        text_model: e.text_model.clone(),
        tower_dtype: e.tower_dtype,
    };
    if let Some(lookup) = choice::text_embedding_lookup(&input, &columns, &flags) {
        let again = a.data.open_options(&lookup)?;
        if let Some(column) = &again.columns.text_embedding {
            rep.info(&choice::text_embedding_line(column));
            input = again;
        }
    }
    let encoders = choice::choose(&input, &flags, rep)?;
    let config = configure::resolve(&config_flags, encoders.towers(), rep)?;
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
    rep.info(&s.log_line());
    super::print_summary(&s.printed(&a.out_dir))?;
    a.outcome.check(s.rows, s.skipped)?;
    s.check_filtered(&a.out_dir)
}
