//! The command line: one module per subcommand, each a thin layer over the
//! library.

use std::path::PathBuf;

use clap::{Args, CommandFactory, Parser, Subcommand};

use crate::data::images::ImageLimits;
use crate::data::{ColumnOptions, Preset, TextEmbeddings};
use crate::error::{Error, Result};
use crate::runtime::parse;
use crate::runtime::progress::{LogFormat, Reporter};
use crate::towers::features::{CacheOptions, CacheRequest};

mod completions;
mod corrupt;
mod cuda_libs;
mod demo;
mod eval;
mod filter;
mod fit;
mod gpu_check;
mod inspect;
mod man;
mod report;
mod score;
mod threshold;
mod towers;

/// Find and clean mismatched image–caption pairs.
///
/// ncclean trains a noise-robust image–text matching model on your own
/// parquet shards, then writes for every pair a clean probability and a soft
/// correspondence label, and a filtered dataset.
///
/// Quick start:
///   ncclean demo --out demo
///   ncclean corrupt demo/demo.parquet --rate 0.3 --seed 1 --out demo/noisy.parquet
///   ncclean fit demo/noisy.parquet --out-dir demo/run
///   ncclean eval --labels demo/run/labels.parquet --truth demo/noisy.parquet
#[derive(Debug, Parser)]
#[command(
    name = "ncclean",
    version,
    about,
    long_about,
    verbatim_doc_comment,
    disable_version_flag = true
)]
pub struct Cli {
    /// Print the version, git commit, enabled features, target and profile
    /// (what identifies this build in a bug report), then exit.
    #[arg(short = 'V', long)]
    pub version: bool,
    /// With --version: print it as one JSON object.
    #[arg(long, requires = "version")]
    pub json: bool,

    /// Log format on stderr: text (bars on a terminal, lines otherwise) or
    /// json (one object per line). stdout only carries the final summary.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,

    #[command(subcommand)]
    command: Option<Command>,
}

impl Cli {
    /// Parse the command line, exiting 2 with clap's usage message when it
    /// names no subcommand (`--version` is the one flag that needs none).
    pub fn parse_args() -> Cli {
        let cli = Cli::parse();
        if cli.command.is_none() && !cli.version {
            Cli::command()
                .error(
                    clap::error::ErrorKind::MissingSubcommand,
                    "name a subcommand; `ncclean --help` lists them",
                )
                .exit();
        }
        cli
    }
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Write a synthetic image–caption dataset (drawn shapes and captions that describe them).
    Demo(demo::DemoArgs),
    /// Inject synthetic noise: permute the images of a fraction of the pairs, add a `noisy` column.
    Corrupt(corrupt::CorruptArgs),
    /// Show the schema, the detected columns, row counts and unusable rows.
    Inspect(inspect::InspectArgs),
    /// Train a noise-robust matcher and write labels, a filtered dataset and a checkpoint.
    Fit(fit::FitArgs),
    /// Score pairs with a trained checkpoint (the same code path as fit's final scoring).
    ///
    /// Each input file is also checked against random pairings of its own images and
    /// captions (up to 1,024 pairs): a file the model has no signal on, or whose cut keeps
    /// clearly more or fewer pairs than that check says match, is warned about by name
    /// (on stderr, and under "warnings" in the summary on stdout).
    Score(score::ScoreArgs),
    /// Keep the rows that labels call clean (or above a probability, or a top fraction).
    Filter(filter::FilterArgs),
    /// Detection metrics against ground truth (AUROC, AP, P/R/F1, calibration of clean_prob), or retrieval R@K of a checkpoint (--retrieval).
    Eval(eval::EvalArgs),
    /// Write a self-contained HTML report of a run: distributions, the fitted mixture, training curves, thresholds, example pairs.
    Report(report::ReportArgs),
    /// List the pretrained towers installed here (MobileNetV2, MiniLM, CLIP) and the flags that use them.
    Towers(towers::TowersArgs),
    /// Measure a GPU machine: CPU/CUDA parity, decode and tower throughput, training speed (JSON).
    #[command(hide = true)]
    GpuCheck(gpu_check::GpuCheckArgs),
    /// Say where the NVIDIA driver and the CUDA libraries are found, and whether they load.
    #[command(hide = true)]
    CudaLibs(cuda_libs::CudaLibsArgs),
    /// Print a shell completion script (bash, zsh, fish, powershell, elvish).
    Completions(completions::CompletionsArgs),
    /// Print the man page, ncclean(1), or a subcommand's (`ncclean man fit`).
    Man(man::ManArgs),
}

/// Input files and how to find their columns.
#[derive(Debug, Clone, Args)]
pub struct DataArgs {
    /// Parquet files or webdataset tar shards (`*.tar`, as img2dataset
    /// writes them), directories of them, or globs (`shards/*.parquet`,
    /// `shards/*.tar`). One run reads one of the two formats. Required,
    /// except by `score` and `filter` given `--files-from`.
    #[arg(value_name = "DATA")]
    pub data: Vec<PathBuf>,
    /// Image column: bytes, a {bytes, path} struct, a path string or an embedding (a list of floats).
    #[arg(long, value_name = "NAME")]
    pub image_col: Option<String>,
    /// Caption column (a string).
    #[arg(long, value_name = "NAME")]
    pub caption_col: Option<String>,
    /// Key column carried through to the labels (default: detected, else `<file stem>:<row>`).
    #[arg(long, value_name = "NAME")]
    pub key_col: Option<String>,
    /// Column-name preset for common layouts.
    #[arg(long, value_enum)]
    pub preset: Option<Preset>,
    /// Directory that relative image paths are resolved against (default: next to each parquet file).
    #[arg(long, value_name = "DIR")]
    pub image_root: Option<PathBuf>,
    /// Tar shards: where a sample's caption comes from, the KEY.txt member
    /// (txt, the default) or a string field of KEY.json (json:FIELD, e.g.
    /// json:caption).
    #[arg(long, value_name = "txt|json:FIELD")]
    pub caption_from: Option<crate::data::CaptionFrom>,
    /// Tar shards: where a sample's key comes from, the member name (name,
    /// the default: KEY of KEY.jpg) or a field of KEY.json (json:FIELD, e.g.
    /// json:key; samples without it keep the member name).
    #[arg(long, value_name = "name|json:FIELD")]
    pub key_from: Option<crate::data::KeyFrom>,
    /// Search directories given as DATA (and directories a glob matches)
    /// through all their subdirectories, not only their top level. Hidden
    /// files and directories (names starting with `.`) are skipped either
    /// way; name one explicitly to read it.
    #[arg(long, short = 'r')]
    pub recursive: bool,
    /// Precomputed text-embedding column (a list of floats per row, e.g. LAION's text_emb), read by
    /// --text-encoder precomputed instead of encoding the captions (default: detected among
    /// text_embedding, text_emb, txt_emb, ...; --preset laion/datacomp name theirs). The caption
    /// column stays and is shown in the outputs.
    #[arg(long, value_name = "NAME")]
    pub text_emb_col: Option<String>,
}

impl DataArgs {
    /// The column options these flags describe, with the default image
    /// limits.
    pub fn column_options(&self) -> ColumnOptions {
        ColumnOptions {
            image_col: self.image_col.clone(),
            caption_col: self.caption_col.clone(),
            key_col: self.key_col.clone(),
            preset: self.preset,
            image_root: self.image_root.clone(),
            image_limits: ImageLimits::default(),
            caption_from: self.caption_from.clone(),
            key_from: self.key_from.clone(),
            recursive: self.recursive,
            text_emb_col: self.text_emb_col.clone(),
            text_embeddings: if self.text_emb_col.is_some() {
                TextEmbeddings::Require
            } else {
                TextEmbeddings::Ignore
            },
        }
    }

    /// Open and validate the inputs, for commands that do not read images.
    pub fn open(&self) -> Result<crate::data::InputSet> {
        self.open_options(&self.column_options())
    }

    /// Open and validate the inputs with `opts` (these flags' options,
    /// completed by the caller). DATA is optional to clap (`--files-from`
    /// can replace it), so its absence is refused here.
    pub fn open_options(&self, opts: &ColumnOptions) -> Result<crate::data::InputSet> {
        crate::data::InputSet::open_given(&self.data, opts)
    }

    /// The column options with the image limits of `images`.
    pub fn options_with(&self, images: &ImageArgs) -> ColumnOptions {
        ColumnOptions {
            image_limits: images.limits(),
            ..self.column_options()
        }
    }

    /// Fill the flags that were not given with what `fit` recorded: the
    /// files, and for parquet the columns it resolved and the image root,
    /// for tar shards the caption and key sources (each format refuses the
    /// other's flags). Returns the number of files.
    pub fn fill_from(&mut self, recorded: crate::run::inputs::Recorded) -> usize {
        let (record, columns) = (recorded.inputs, recorded.columns);
        let tar = record.is_tar();
        self.data = record.files;
        if tar {
            self.caption_from = self.caption_from.take().or(record.caption_from);
            self.key_from = self.key_from.take().or(record.key_from);
        } else {
            self.image_col.get_or_insert(columns.image);
            self.caption_col.get_or_insert(columns.caption);
            self.key_col = self.key_col.take().or(columns.key);
            self.text_emb_col = self.text_emb_col.take().or(columns.text_embedding);
            self.image_root = self.image_root.take().or(record.image_root);
        }
        self.data.len()
    }
}

/// Shard-at-a-time work (`score`, `filter`): which input files this worker
/// takes and where it lists them from. Only with `--out-dir`.
#[derive(Debug, Clone, Args)]
pub struct ShardArgs {
    /// Also read input paths from FILE, one per line (blank lines and lines
    /// starting with # are ignored; relative paths are relative to the
    /// current directory). Only with --out-dir.
    #[arg(long, value_name = "FILE")]
    pub files_from: Option<PathBuf>,
    /// Split the input files between N workers: the files, sorted by path,
    /// go to worker (position modulo N), so every worker agrees on the split
    /// without talking to the others. Only with --out-dir (default 1).
    #[arg(long, value_name = "N")]
    pub num_shards: Option<usize>,
    /// This worker's index, 0 to N-1 (see --num-shards; default 0).
    #[arg(long, value_name = "I")]
    pub shard_index: Option<usize>,
}

impl ShardArgs {
    /// Refuse the flags where there is one output for all inputs.
    pub fn check_unused(&self) -> Result<()> {
        if self.files_from.is_some() || self.num_shards.is_some() || self.shard_index.is_some() {
            return Err(crate::error::Error::Usage(
                "--files-from, --num-shards and --shard-index need --out-dir \
                 (one output per input shard)"
                    .into(),
            ));
        }
        Ok(())
    }

    /// This worker's shards of `data` and `--files-from`.
    pub fn select(
        &self,
        data: &[PathBuf],
        how: crate::data::Discovery,
    ) -> Result<Vec<crate::run::shards::Shard>> {
        let split = crate::run::shards::Split::new(
            self.num_shards.unwrap_or(1),
            self.shard_index.unwrap_or(0),
        )?;
        crate::run::shards::select(data, how, self.files_from.as_deref(), &split)
    }
}

/// Limits on reading and decoding images, for the commands that decode
/// them (see `crate::data::images`).
#[derive(Debug, Clone, Args)]
pub struct ImageArgs {
    /// Largest image file read from a path column (or image member of a tar
    /// shard); larger ones are skipped with their size. Bytes, or with a K,
    /// M or G suffix (powers of 1024).
    #[arg(long, value_name = "BYTES", default_value = "64M", value_parser = parse::byte_size)]
    pub max_image_bytes: u64,
    /// Images with more pixels than this (width × height, read from the
    /// header) are skipped without being decoded. All decode threads
    /// together hold at most 32 bytes × this of decoded images, however many
    /// cores there are.
    #[arg(long, value_name = "PIXELS", default_value_t = crate::data::images::DEFAULT_MAX_IMAGE_PIXELS,
          value_parser = parse::pixel_count)]
    pub max_image_pixels: u64,
    /// Read image paths that are absolute or lead outside the parquet
    /// file's directory (or --image-root), through `..` or a symbolic link.
    /// Without it such rows are skipped with the reason.
    #[arg(long)]
    pub allow_absolute_paths: bool,
}

impl ImageArgs {
    /// The limits these flags describe.
    pub fn limits(&self) -> ImageLimits {
        ImageLimits {
            max_bytes: self.max_image_bytes,
            max_pixels: self.max_image_pixels,
            allow_absolute_paths: self.allow_absolute_paths,
        }
    }
}

/// Which towers encode images and captions (recorded in the checkpoint).
#[derive(Debug, Clone, Args)]
pub struct EncoderArgs {
    /// Image tower (default: precomputed for an embedding column; for photos
    /// with no tower named, the pretrained towers installed here, CLIP or
    /// MobileNetV2 + MiniLM (`ncclean towers`); else demo-cnn).
    #[arg(long, value_enum)]
    pub image_encoder: Option<crate::towers::encoders::ImageEncoder>,
    /// Text tower (default: precomputed when --text-emb-col is given, or when
    /// the images are embeddings and a text-embedding column is found beside
    /// them; the installed pretrained one with the image tower's, as above;
    /// else demo-bow).
    #[arg(long, value_enum)]
    pub text_encoder: Option<crate::towers::encoders::TextEncoder>,
    /// Image tower weights: MobileNetV2 model.safetensors, or a CLIP model directory / hub id.
    #[arg(long, value_name = "PATH|ID")]
    pub image_model: Option<String>,
    /// Text tower weights: a MiniLM/BERT or CLIP model directory / hub id.
    #[arg(long, value_name = "PATH|ID")]
    pub text_model: Option<String>,
    /// Precision of the frozen MobileNetV2/CLIP towers: auto (f16 on CUDA,
    /// f32 on the CPU), f32, f16 or bf16. MiniLM always runs in f32.
    #[arg(long, value_enum, default_value_t = crate::towers::encoders::TowerDtype::Auto)]
    pub tower_dtype: crate::towers::encoders::TowerDtype,
}

/// When a finished run counts as a partial result.
#[derive(Debug, Clone, Args)]
pub struct OutcomeArgs {
    /// Exit 4 (partial result) when more than this fraction of the rows could
    /// not be used (unreadable image, missing caption, ...). Outputs are
    /// written in full either way, each skipped row with its reason. 0 makes
    /// any skipped row a partial result; 1 never does.
    #[arg(long, value_name = "FRACTION", default_value_t = 0.5, value_parser = parse::fraction)]
    pub max_skipped: f64,
}

impl OutcomeArgs {
    /// Exit 4 when `skipped` of `rows` is more than the flag allows.
    pub fn check(&self, rows: usize, skipped: usize) -> Result<()> {
        crate::error::partial_if_skipped(rows, skipped, self.max_skipped)
    }
}

/// Where frozen-tower features are cached.
#[derive(Debug, Clone, Args)]
pub struct CacheArgs {
    /// Feature cache directory (default: $NCCLEAN_CACHE_DIR, else ~/.cache/ncclean/features).
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Do not read or write the feature cache (features are recomputed).
    #[arg(long)]
    pub no_cache: bool,
}

impl CacheArgs {
    /// The cache these flags ask for, unresolved.
    pub fn request(&self) -> CacheRequest {
        CacheRequest {
            dir: self.cache_dir.clone(),
            no_cache: self.no_cache,
        }
    }

    /// The cache these flags ask for, resolved and checked.
    pub fn options(&self) -> Result<CacheOptions> {
        self.request().resolve()
    }
}

/// Parse the command line and run it; the error carries the exit code.
pub fn run(cli: Cli) -> Result<()> {
    let rep = Reporter::new(cli.log_format);
    if cli.version {
        return print_version(cli.json);
    }
    let Some(command) = cli.command else {
        return Err(Error::Usage(
            "name a subcommand; `ncclean --help` lists them".into(),
        ));
    };
    match command {
        Command::Demo(a) => demo::run(a, &rep),
        Command::Corrupt(a) => corrupt::run(a, &rep),
        Command::Inspect(a) => inspect::run(a, &rep),
        Command::Fit(a) => fit::run(a, &rep),
        Command::Score(a) => score::run(a, &rep),
        Command::Filter(a) => filter::run(a, &rep),
        Command::Eval(a) => eval::run(a, &rep),
        Command::Report(a) => report::run(a, &rep),
        Command::Towers(a) => towers::run(a, &rep),
        Command::GpuCheck(a) => gpu_check::run(a, &rep),
        Command::CudaLibs(a) => cuda_libs::run(a, &rep),
        Command::Completions(a) => completions::run(a, &rep),
        Command::Man(a) => man::run(a, &rep),
    }
}

/// Print a command's summary on stdout: one line of JSON with its keys
/// sorted (through a `Value`, whose maps sort them), as every summary has
/// always been printed.
fn print_summary(summary: &impl serde::Serialize) -> Result<()> {
    let v = serde_json::to_value(summary).map_err(anyhow::Error::from)?;
    println!("{v}");
    Ok(())
}

/// `ncclean --version [--json]`.
fn print_version(json: bool) -> Result<()> {
    let build = crate::runtime::build_info::current();
    let text = if json {
        format!("{}\n", build.json())
    } else {
        build.text()
    };
    crate::runtime::progress::write_stdout(text.as_bytes())
}
