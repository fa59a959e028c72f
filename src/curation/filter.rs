//! `ncclean filter`: labels joined back to the data by key, and the rows a
//! rule keeps written out with their label columns, into one file
//! ([`filter_file`]) or one file per input shard
//! ([`super::filter_shards::filter_shards`]).
//!
//! The join itself ([`crate::engine::LabelIndex`]) decides which rows are
//! kept, whichever engine then copies them, so both engines keep the same
//! rows and refuse the same inputs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::curation::threshold::{Keep, Ranked, Rule};
use crate::data::{self, ColumnOptions, InputSet, OutputFormat};
use crate::engine::{FingerprintCheck, Joined, LabelIndex};
use crate::error::{Error, Result};
use crate::runtime::progress::Reporter;

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

/// Whether this build can run `engine`, and if not how to get one
/// (a usage error, before any input is read).
pub fn check_engine(engine: FilterEngine) -> Result<()> {
    if engine == FilterEngine::Polars && !cfg!(feature = "polars") {
        return Err(Error::Usage(NO_POLARS.into()));
    }
    Ok(())
}

/// What `filter` was asked to do, resolved from its flags.
#[derive(Debug, Clone)]
pub struct FilterOptions {
    /// The DATA arguments as given: outputs may not replace them, nor lie
    /// in their directories, and per-shard labels are looked up for every
    /// shard among them.
    pub data: Vec<PathBuf>,
    /// `--files-from`: more input paths, one per line.
    pub files_from: Option<PathBuf>,
    /// How the input's columns are found (each shard, and the filtered
    /// shards read back for `--uids-out`, are opened with them).
    pub columns: ColumnOptions,
    /// The labels file, or with per-shard output a directory of per-shard
    /// labels.
    pub labels: PathBuf,
    /// The output format (`None`: by the output's name, else the input's).
    pub format: Option<OutputFormat>,
    /// The rule for the kept rows (`None`: the labels' `is_clean`).
    pub rule: Option<Rule>,
    /// Write every row with the rule's decision instead of the kept ones.
    pub all_rows: bool,
    /// Also write the kept rows' keys as a DataComp subset file.
    pub uids_out: Option<PathBuf>,
    /// What copies the kept rows.
    pub engine: FilterEngine,
}

/// What `filter --out FILE` did, as it prints it on stdout.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FileFiltered {
    /// The output file.
    pub out: String,
    /// Rows over all input files.
    pub rows_in: usize,
    /// Rows written.
    pub rows_out: usize,
    /// Kept rows that could not be read back from the input.
    pub dropped: usize,
    /// The output's path, for [`FileFiltered::check`].
    #[serde(skip)]
    out_path: PathBuf,
}

impl FileFiltered {
    /// A partial result (exit 4) when kept rows are missing from the output.
    pub fn check(&self) -> Result<()> {
        data::FilterSummary {
            rows_in: self.rows_in,
            rows_out: self.rows_out,
            dropped: self.dropped,
        }
        .check(&self.out_path)
    }
}

/// The rule of `opts`, resolved on `pairs` (every label's clean_prob and
/// similarity), which are read only when a rule is given.
pub(super) fn keep_rule(
    opts: &FilterOptions,
    pairs: impl FnOnce() -> Result<Vec<Ranked>>,
) -> Result<Keep> {
    Ok(match opts.rule {
        Some(rule) => Keep::Cut(rule.resolve(&pairs()?)),
        None => Keep::IsClean,
    })
}

/// `--all-rows` needs parquet output: a tar has no place for the label
/// columns.
pub(super) fn check_all_rows(opts: &FilterOptions, format: OutputFormat, out: &Path) -> Result<()> {
    if opts.all_rows && format == OutputFormat::Tar {
        return Err(Error::Usage(format!(
            "{}: --all-rows writes parquet (a tar has no place for the label columns); add --format parquet",
            out.display()
        )));
    }
    Ok(())
}

/// `filter --out FILE`: join the labels to `input` (opened from
/// `opts.data`) by key and write the rows `opts.rule` keeps to `out`, and
/// their uids with `--uids-out`.
pub fn filter_file(
    input: &InputSet,
    out: &Path,
    opts: &FilterOptions,
    rep: &Reporter,
) -> Result<FileFiltered> {
    // Written atomically, an output on an input would replace the data (or
    // the labels) with the filtered subset: nothing to filter again from.
    let mut read: Vec<PathBuf> = input.files.iter().map(|f| f.path.clone()).collect();
    read.push(opts.labels.clone());
    crate::run::dir::check_not_an_input(out, &read, "--out")?;
    crate::run::dir::check_not_in_input_dir(out, &opts.data, "--out")?;
    if let Some(path) = &opts.uids_out {
        crate::run::dir::check_not_an_input(path, &read, "--uids-out")?;
    }
    let format = OutputFormat::choose(input, out, opts.format);
    check_all_rows(opts, format, out)?;
    let (labels, labels_meta) = data::read_labels(&opts.labels)?;
    let rule = keep_rule(opts, || Ok(Ranked::labelled(&labels)))?;
    let index = LabelIndex::new(&labels)?;
    let check = FingerprintCheck::of(input, &labels_meta)?;
    rep.info(&check.to_string());
    let target = Target {
        out,
        format,
        labels: &opts.labels,
        one_output: true,
    };
    let (s, joined) = write_joined(opts, input, &index, &check, rule, &target)?;
    if let Some(path) = &opts.uids_out {
        let n = write_uids(path, &index, &joined)?;
        rep.info(&format!("wrote {n} uids to {}", path.display()));
    }
    rep.info(&format!(
        "kept {} of {} rows ({rule})",
        s.rows_out, s.rows_in
    ));
    Ok(FileFiltered {
        out: out.display().to_string(),
        rows_in: s.rows_in,
        rows_out: s.rows_out,
        dropped: s.dropped,
        out_path: out.to_path_buf(),
    })
}

/// Where one filtered output goes and what it is made from.
pub(super) struct Target<'a> {
    /// The output file.
    pub(super) out: &'a Path,
    /// Its format.
    pub(super) format: OutputFormat,
    /// The labels file joined, recorded in the output's metadata.
    pub(super) labels: &'a Path,
    /// Whether this output is the only one the labels serve: only then are
    /// labelled keys missing from the input worth a warning.
    pub(super) one_output: bool,
}

/// The output's metadata: this build, the labels and the rule.
fn filter_metadata(labels: &Path, rule: Keep) -> BTreeMap<String, String> {
    let mut meta = data::Metadata::of_build();
    meta.put("filter.labels", labels.display().to_string());
    meta.put("filter.rule", rule.to_string());
    meta.into_map()
}

/// Join `index` to `input` by key under `check`, and write the filtered
/// output (kept rows, or every row with `--all-rows`) with the label
/// columns added.
pub(super) fn write_joined(
    opts: &FilterOptions,
    input: &InputSet,
    index: &LabelIndex<'_>,
    check: &FingerprintCheck,
    rule: Keep,
    target: &Target<'_>,
) -> Result<(data::FilterSummary, Joined)> {
    let joined = index.join(input, check.positional(), |l| rule.keeps(l))?;
    // One labels file serves many shards in --out-dir mode: there, keys of
    // other shards are expected.
    if joined.unmatched > 0 && target.one_output {
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
    let mut meta = filter_metadata(target.labels, rule);
    meta.insert(
        "ncclean.filter.fingerprint".to_string(),
        check.tag().to_string(),
    );
    if opts.engine == FilterEngine::Polars {
        let s = write_polars(opts, input, index, &joined, rule, target, &meta)?;
        return Ok((s, joined));
    }
    let all: Vec<Vec<bool>>;
    let (mask, decision) = if opts.all_rows {
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
    let s = data::write_filtered_as(input, mask, target.out, &meta, target.format, Some(ann))?;
    Ok((s, joined))
}

/// The filtered output written by the polars engine (refused with how to
/// get it in a build without the `polars` feature).
fn write_polars(
    opts: &FilterOptions,
    input: &InputSet,
    index: &LabelIndex<'_>,
    joined: &Joined,
    rule: Keep,
    target: &Target<'_>,
    meta: &BTreeMap<String, String>,
) -> Result<data::FilterSummary> {
    if target.format != OutputFormat::Parquet {
        return Err(Error::Usage(format!(
            "{}: --engine polars writes parquet; leave out --engine polars for tar output",
            target.out.display()
        )));
    }
    let keep_label: Vec<bool> = index.labels().iter().map(|l| rule.keeps(l)).collect();
    #[cfg(feature = "polars")]
    return crate::engine::PolarsFilter {
        input,
        labels: index.labels(),
        keep_label: &keep_label,
        joined,
        all_rows: opts.all_rows,
    }
    .write(target.out, meta);
    #[cfg(not(feature = "polars"))]
    {
        let _ = (opts, input, joined, keep_label, meta);
        Err(Error::Usage(NO_POLARS.into()))
    }
}

/// The kept rows' keys as a DataComp subset file.
fn write_uids(path: &Path, index: &LabelIndex<'_>, joined: &Joined) -> Result<usize> {
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
