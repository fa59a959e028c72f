//! `ncclean filter`: write the rows that labels call clean.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap::Args;

use crate::curation::threshold::{Keep, Ranked};
use crate::data;
use crate::engine::{FingerprintCheck, LabelIndex};
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

/// `filter --engine`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FilterEngine {
    /// ncclean's arrow-rs writer.
    Native,
    /// A polars lazy query (optional `polars` feature).
    Polars,
}

/// Why a build without the `polars` feature cannot run `--engine polars`.
const NO_POLARS: &str = "this ncclean was built without polars: rebuild it with \
    `cargo install --path . --features polars` (several minutes more of build), or leave out --engine polars";

/// Whether this build can run `engine`, and if not how to get one.
fn check_engine(engine: FilterEngine) -> Result<()> {
    if engine == FilterEngine::Polars && !cfg!(feature = "polars") {
        return Err(Error::Usage(NO_POLARS.into()));
    }
    Ok(())
}

pub fn run(a: FilterArgs, rep: &Reporter) -> Result<()> {
    a.threshold.rule()?;
    check_engine(a.engine)?;
    match (&a.out_dir, &a.out) {
        (Some(dir), _) => run_shards(&a, dir, rep),
        (None, Some(out)) => run_one(&a, out, rep),
        (None, None) => Err(Error::Usage("give --out FILE or --out-dir DIR".into())),
    }
}

/// The rule of the flags, resolved on `pairs` (every scored row's
/// clean_prob and similarity), which are read only when a rule is given.
fn rule_of(a: &FilterArgs, pairs: impl FnOnce() -> Result<Vec<Ranked>>) -> Result<Keep> {
    Ok(match a.threshold.rule()? {
        Some(rule) => Keep::Cut(rule.resolve(&pairs()?)),
        None => Keep::IsClean,
    })
}

fn filter_metadata(labels: &Path, rule: Keep) -> BTreeMap<String, String> {
    let mut meta = crate::data::Metadata::of_build();
    meta.put("filter.labels", labels.display().to_string());
    meta.put("filter.rule", rule.to_string());
    meta.into_map()
}

/// Join `index` to `input` by key under `check`, and write the filtered
/// output (kept rows, or every row with `--all-rows`) with the label
/// columns added.
#[allow(clippy::too_many_arguments)]
fn write_joined(
    a: &FilterArgs,
    input: &data::InputSet,
    index: &LabelIndex<'_>,
    check: &FingerprintCheck,
    rule: Keep,
    out: &Path,
    format: data::OutputFormat,
    labels_path: &Path,
    one_output: bool,
) -> Result<(data::FilterSummary, crate::engine::Joined)> {
    let joined = index.join(input, check.positional(), |l| rule.keeps(l))?;
    // One labels file serves many shards in --out-dir mode: there, keys of
    // other shards are expected.
    if joined.unmatched > 0 && one_output {
        crate::runtime::progress::warn_once(&format!(
            "{} labelled keys are not in this input (e.g. {}); the labels cover more data than was given",
            joined.unmatched,
            joined
                .unmatched_examples
                .iter()
                .map(|k| format!("\"{k}\""))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let mut meta = filter_metadata(labels_path, rule);
    meta.insert(
        "ncclean.filter.fingerprint".to_string(),
        check.tag().to_string(),
    );
    if a.engine == FilterEngine::Polars {
        let s = write_polars(a, input, index, &joined, rule, out, format, &meta)?;
        return Ok((s, joined));
    }
    let all: Vec<Vec<bool>>;
    let (mask, decision) = if a.all_rows {
        all = joined.keep.iter().map(|k| vec![true; k.len()]).collect();
        (&all, Some(joined.keep.as_slice()))
    } else {
        (&joined.keep, None)
    };
    let ann = data::Annotations {
        labels: index.labels(),
        label_of: &joined.label_of,
        decision,
    };
    let s = data::write_filtered_as(input, mask, out, &meta, format, Some(ann))?;
    Ok((s, joined))
}

/// The filtered output written by the polars engine (refused with how to
/// get it in a build without the `polars` feature).
#[allow(clippy::too_many_arguments)]
fn write_polars(
    a: &FilterArgs,
    input: &data::InputSet,
    index: &LabelIndex<'_>,
    joined: &crate::engine::Joined,
    rule: Keep,
    out: &Path,
    format: data::OutputFormat,
    meta: &BTreeMap<String, String>,
) -> Result<data::FilterSummary> {
    if format != data::OutputFormat::Parquet {
        return Err(Error::Usage(format!(
            "{}: --engine polars writes parquet; leave out --engine polars for tar output",
            out.display()
        )));
    }
    let keep_label: Vec<bool> = index.labels().iter().map(|l| rule.keeps(l)).collect();
    #[cfg(feature = "polars")]
    return crate::engine::PolarsFilter {
        input,
        labels: index.labels(),
        keep_label: &keep_label,
        joined,
        all_rows: a.all_rows,
    }
    .write(out, meta);
    #[cfg(not(feature = "polars"))]
    {
        let _ = (a, input, joined, keep_label, meta);
        Err(Error::Usage(NO_POLARS.into()))
    }
}

/// `--all-rows` needs parquet output: a tar has no place for the label
/// columns.
fn check_all_rows(a: &FilterArgs, format: data::OutputFormat, out: &Path) -> Result<()> {
    if a.all_rows && format == data::OutputFormat::Tar {
        return Err(Error::Usage(format!(
            "{}: --all-rows writes parquet (a tar has no place for the label columns); add --format parquet",
            out.display()
        )));
    }
    Ok(())
}

/// The kept rows' keys as a DataComp subset file.
fn write_uids(
    path: &Path,
    index: &LabelIndex<'_>,
    joined: &crate::engine::Joined,
) -> Result<usize> {
    let labels = index.labels();
    let uids: Vec<String> = joined
        .keep
        .iter()
        .zip(&joined.label_of)
        .flat_map(|(k, of)| k.iter().zip(of))
        .filter(|(k, _)| **k)
        .filter_map(|(_, &i)| labels.get(i as usize).map(|l| l.key.clone()))
        .collect();
    data::write_uids_npy(path, &uids)
}

fn run_one(a: &FilterArgs, out: &Path, rep: &Reporter) -> Result<()> {
    a.shards.check_unused()?;
    let input = a.data.open()?;
    // Written atomically, an output on an input would replace the data (or
    // the labels) with the filtered subset: nothing to filter again from.
    let mut read: Vec<PathBuf> = input.files.iter().map(|f| f.path.clone()).collect();
    read.push(a.labels.clone());
    crate::run::dir::check_not_an_input(out, &read, "--out")?;
    crate::run::dir::check_not_in_input_dir(out, &a.data.data, "--out")?;
    if let Some(path) = &a.uids_out {
        crate::run::dir::check_not_an_input(path, &read, "--uids-out")?;
    }
    let format = data::OutputFormat::choose(&input, out, a.format);
    check_all_rows(a, format, out)?;
    let (labels, labels_meta) = data::read_labels(&a.labels)?;
    let rule = rule_of(a, || Ok(Ranked::labelled(&labels)))?;
    let index = LabelIndex::new(&labels)?;
    let check = FingerprintCheck::of(&input, &labels_meta)?;
    rep.info(&check.to_string());
    let (s, joined) = write_joined(
        a, &input, &index, &check, rule, out, format, &a.labels, true,
    )?;
    if let Some(path) = &a.uids_out {
        let n = write_uids(path, &index, &joined)?;
        rep.info(&format!("wrote {n} uids to {}", path.display()));
    }
    rep.info(&format!(
        "kept {} of {} rows ({rule})",
        s.rows_out, s.rows_in
    ));
    super::print_summary(&FilterPrinted {
        out: out.display().to_string(),
        rows_in: s.rows_in,
        rows_out: s.rows_out,
        dropped: s.dropped,
    })?;
    s.check(out)
}

/// sha256 of a labels file's bytes (what a filtered shard was made from),
/// read a MiB at a time.
fn labels_file_sha256(path: &Path) -> Result<String> {
    let f = std::fs::File::open(path)
        .map_err(|e| Error::InvalidInput(format!("{}: cannot open it ({e})", path.display())))?;
    Ok(crate::runtime::hex::sha256_hex_of(f)
        .map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?)
}

/// `--out-dir`: one filtered shard and marker per input shard. `--labels`
/// is one file for all shards, or a directory of per-shard labels.
fn run_shards(a: &FilterArgs, dir: &Path, rep: &Reporter) -> Result<()> {
    if a.uids_out.is_some() && a.shards.num_shards.is_some_and(|n| n > 1) {
        return Err(Error::Usage(
            "--uids-out with --num-shards: each worker filters only its own shards. When every worker is done, \
             run the same filter once more without --num-shards and --shard-index: it skips the finished shards \
             and writes the uids of all of them"
                .into(),
        ));
    }
    let shards = a.shards.select(&a.data.data, a.data.discovery())?;
    crate::run::shards::prepare_out_dir(dir, &shards)?;
    let per_shard = a.labels.is_dir();
    let labels_of = |stem: &str| -> PathBuf {
        if per_shard {
            crate::run::shards::output_path(&a.labels, stem)
        } else {
            a.labels.clone()
        }
    };
    if let Some(f) = a.format {
        check_all_rows(a, f, dir)?;
    }
    // One labels file is read and indexed once; per-shard labels as each
    // shard comes.
    let single = if per_shard {
        None
    } else {
        Some(data::read_labels(&a.labels)?.0)
    };
    let single_index = single.as_deref().map(LabelIndex::new).transpose()?;
    // A rule's cut is over every shard's labels (not only this worker's),
    // so all workers apply the same cut.
    let rule = rule_of(a, || match &single {
        Some(l) => Ok(Ranked::labelled(l)),
        None => {
            let mut pairs = Vec::new();
            for s in a.shards.select_all(&a.data.data, a.data.discovery())? {
                // An empty shard has no labels (score passed over it).
                let path = labels_of(&s.stem);
                if !path.exists() && data::is_empty_shard(&s.path) {
                    continue;
                }
                let (l, _) = data::read_labels(&labels_of(&s.stem))?;
                pairs.extend(Ranked::labelled(&l));
            }
            Ok(pairs)
        }
    })?;
    let single_sha = match &single {
        Some(_) => Some(labels_file_sha256(&a.labels)?),
        None => None,
    };
    let summary = crate::run::shards::run(
        dir,
        &shards,
        "filter",
        |s| match shard_format(a.format, &s.path) {
            data::OutputFormat::Tar => "tar",
            data::OutputFormat::Parquet => "parquet",
        },
        // The rule and the labels' content are the source: another cut or
        // rescored labels redo the shards.
        |s| {
            let sha = match &single_sha {
                Some(sha) => sha.clone(),
                None => labels_file_sha256(&labels_of(&s.stem))?,
            };
            Ok(format!("{rule}; labels sha256 {sha}"))
        },
        |p| {
            let opts = a.data.column_options();
            crate::data::InputSet::open(&[p.to_path_buf()], &opts)
        },
        rep,
        |shard| {
            filter_shard(
                a,
                shard,
                single_index.as_ref(),
                rule,
                &labels_of(&shard.shard.stem),
            )
        },
    )?;
    if let Some(path) = &a.uids_out {
        let n = write_shard_uids(a, dir, &shards, path)?;
        rep.info(&format!("wrote {n} uids to {}", path.display()));
    }
    let c = summary.counts;
    rep.info(&format!(
        "{} shards: {} filtered now, {} already done; kept {} of {} rows ({rule})",
        summary.shards, summary.done, summary.already_done, c.kept, c.rows
    ));
    super::print_summary(&FilterShardsPrinted {
        out_dir: dir.display().to_string(),
        shards: summary.shards,
        done: summary.done,
        already_done: summary.already_done,
        rows_in: c.rows,
        rows_out: c.kept,
        dropped: c.skipped,
    })?;
    if c.skipped > 0 {
        return Err(Error::Partial(format!(
            "{} rows that the labels keep could not be read back from the input and are missing from the shards in {} (the warnings above say which row groups and columns)",
            c.skipped,
            dir.display()
        )));
    }
    Ok(())
}

/// `--out-dir`: filter one shard with `rule`, joined by key to the one
/// labels file's `single` index, or else to its own labels at
/// `labels_path`.
fn filter_shard(
    a: &FilterArgs,
    shard: &crate::run::shards::ShardOutput,
    single: Option<&LabelIndex<'_>>,
    rule: Keep,
    labels_path: &Path,
) -> Result<crate::run::shards::Counts> {
    let format = shard_format(a.format, &shard.shard.path);
    check_all_rows(a, format, &shard.path)?;
    let (s, _) = match single {
        Some(index) => {
            // The labels' fingerprint covers every shard together.
            let check = FingerprintCheck::Unknown(
                "one labels file for many shards carries the fingerprint of them all together, not of one shard".into(),
            );
            write_joined(
                a,
                shard.input,
                index,
                &check,
                rule,
                &shard.path,
                format,
                labels_path,
                false,
            )?
        }
        None => {
            let (labels, meta) = data::read_labels(labels_path)?;
            let index = LabelIndex::new(&labels)?;
            let check = FingerprintCheck::of(shard.input, &meta)?;
            if check != FingerprintCheck::Same {
                crate::runtime::progress::warn_once(&format!(
                    "{}: {check}",
                    shard.shard.path.display()
                ));
            }
            write_joined(
                a,
                shard.input,
                &index,
                &check,
                rule,
                &shard.path,
                format,
                labels_path,
                true,
            )?
        }
    };
    Ok(crate::run::shards::Counts {
        rows: s.rows_in,
        usable: s.rows_in,
        skipped: s.dropped,
        kept: s.rows_out,
        noisy: 0,
    })
}

/// What `filter --out FILE` prints on stdout.
#[derive(serde::Serialize)]
struct FilterPrinted {
    out: String,
    rows_in: usize,
    rows_out: usize,
    dropped: usize,
}

/// What `filter --out-dir DIR` prints on stdout.
#[derive(serde::Serialize)]
struct FilterShardsPrinted {
    out_dir: String,
    shards: usize,
    done: usize,
    already_done: usize,
    rows_in: usize,
    rows_out: usize,
    dropped: usize,
}

/// `--uids-out` with `--out-dir`: the keys of every filtered shard in
/// `dir` (those finished by an earlier run included), read back from the
/// outputs, which hold exactly the kept rows.
fn write_shard_uids(
    a: &FilterArgs,
    dir: &Path,
    shards: &[crate::run::shards::Shard],
    path: &Path,
) -> Result<usize> {
    let outputs: Vec<PathBuf> = shards
        .iter()
        .map(|s| {
            let ext = match shard_format(a.format, &s.path) {
                data::OutputFormat::Tar => "tar",
                data::OutputFormat::Parquet => "parquet",
            };
            crate::run::shards::output_path_as(dir, &s.stem, ext)
        })
        .collect();
    let out = data::InputSet::open(&outputs, &a.data.column_options())?;
    let mut uids = Vec::new();
    for (f, file) in out.files.iter().enumerate() {
        data::for_each_key(&out, f, |first, keys| {
            for (i, k) in keys.into_iter().enumerate() {
                let Some(k) = k else {
                    return Err(Error::InvalidInput(format!(
                        "{}: row {} has no key; --uids-out needs data keyed by DataComp's uid column (--key-col uid)",
                        file.path.display(),
                        first + i
                    )));
                };
                uids.push(k);
            }
            Ok(())
        })?;
    }
    data::write_uids_npy(path, &uids)
}

/// A per-shard output's format: `--format`, else the shard's own (a tar
/// shard filters to a tar shard).
fn shard_format(explicit: Option<data::OutputFormat>, shard: &Path) -> data::OutputFormat {
    explicit.unwrap_or_else(|| {
        let tar = shard
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("tar"));
        if tar {
            data::OutputFormat::Tar
        } else {
            data::OutputFormat::Parquet
        }
    })
}
