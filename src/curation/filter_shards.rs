//! `ncclean filter --out-dir`: one filtered shard and completion marker per
//! input shard ([`crate::run::shards`]), from one labels file for all
//! shards or a directory of per-shard labels.

use std::path::{Path, PathBuf};

use super::filter::{check_all_rows, keep_rule, write_joined, FilterOptions, Target};
use crate::curation::threshold::{Keep, Ranked};
use crate::data::{self, LabelRow, OutputFormat};
use crate::engine::{FingerprintCheck, LabelIndex};
use crate::error::{Error, Result};
use crate::run::shards::{self, Counts, Shard, ShardOutput};
use crate::runtime::progress::Reporter;

/// What `filter --out-dir DIR` did, as it prints it on stdout.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ShardsFiltered {
    /// The output directory.
    pub out_dir: String,
    /// Shards this worker was given.
    pub shards: usize,
    /// Of those, filtered in this run.
    pub done: usize,
    /// Of those, complete from an earlier run and skipped.
    pub already_done: usize,
    /// Rows over the shards.
    pub rows_in: usize,
    /// Rows written.
    pub rows_out: usize,
    /// Kept rows that could not be read back from the input.
    pub dropped: usize,
}

impl ShardsFiltered {
    /// A partial result (exit 4) when kept rows are missing from the shards.
    pub fn check(&self) -> Result<()> {
        if self.dropped > 0 {
            return Err(Error::Partial(format!(
                "{} rows that the labels keep could not be read back from the input and are missing from the shards in {} (the warnings above say which row groups and columns)",
                self.dropped,
                self.out_dir
            )));
        }
        Ok(())
    }
}

/// The labels of a per-shard filter: one file read and indexed once, or a
/// directory holding `<shard stem>.parquet` for each shard, read as each
/// shard comes.
struct ShardLabels<'o> {
    opts: &'o FilterOptions,
    /// The one labels file's rows (`None`: per-shard labels).
    single: Option<Vec<LabelRow>>,
    /// The one labels file's sha256.
    single_sha: Option<String>,
}

impl<'o> ShardLabels<'o> {
    /// Read the one labels file (a directory is read shard by shard).
    fn read(opts: &'o FilterOptions) -> Result<ShardLabels<'o>> {
        let single = if opts.labels.is_dir() {
            None
        } else {
            Some(data::read_labels(&opts.labels)?.0)
        };
        Ok(ShardLabels {
            opts,
            single,
            single_sha: None,
        })
    }

    /// The labels file of the shard `stem`.
    fn path_of(&self, stem: &str) -> PathBuf {
        if self.single.is_some() {
            self.opts.labels.clone()
        } else {
            shards::output_path(&self.opts.labels, stem)
        }
    }

    /// Every label's pairs for a rule's cut: the one file's, or those of
    /// every shard (not only this worker's), so all workers apply the same
    /// cut.
    fn ranked(&self) -> Result<Vec<Ranked>> {
        if let Some(l) = &self.single {
            return Ok(Ranked::labelled(l));
        }
        let opts = self.opts;
        let all = shards::select(
            &opts.data,
            opts.columns.discovery(),
            opts.files_from.as_deref(),
            &shards::Split::all(),
        )?;
        let mut pairs = Vec::new();
        for s in all {
            // An empty shard has no labels (score passed over it).
            let path = self.path_of(&s.stem);
            if !path.exists() && data::is_empty_shard(&s.path) {
                continue;
            }
            let (l, _) = data::read_labels(&path)?;
            pairs.extend(Ranked::labelled(&l));
        }
        Ok(pairs)
    }

    /// The marker's source for the shard `stem`: the rule and the labels'
    /// content, so another cut or rescored labels redo the shards.
    fn source(&self, stem: &str, rule: Keep) -> Result<String> {
        let sha = match &self.single_sha {
            Some(sha) => sha.clone(),
            None => labels_file_sha256(&self.path_of(stem))?,
        };
        Ok(format!("{rule}; labels sha256 {sha}"))
    }
}

/// `filter --out-dir DIR`: filter each of `shards` (this worker's) into
/// `DIR/<shard stem>.parquet` (or `.tar`) with its completion marker,
/// skipping the shards already filtered from the same labels and rule; then
/// the uids of every filtered shard in `dir` with `--uids-out`.
pub fn filter_shards(
    dir: &Path,
    shards: &[Shard],
    opts: &FilterOptions,
    rep: &Reporter,
) -> Result<ShardsFiltered> {
    shards::prepare_out_dir(dir, shards)?;
    if let Some(f) = opts.format {
        check_all_rows(opts, f, dir)?;
    }
    let mut labels = ShardLabels::read(opts)?;
    let single_index = labels.single.as_deref().map(LabelIndex::new).transpose()?;
    let rule = keep_rule(opts, || labels.ranked())?;
    if labels.single.is_some() {
        labels.single_sha = Some(labels_file_sha256(&opts.labels)?);
    }
    let summary = shards::run(
        dir,
        shards,
        "filter",
        |s| extension(shard_format(opts.format, &s.path)),
        |s| labels.source(&s.stem, rule),
        |p| data::InputSet::open(&[p.to_path_buf()], &opts.columns),
        rep,
        |shard| {
            let labels_path = labels.path_of(&shard.shard.stem);
            filter_shard(opts, shard, single_index.as_ref(), rule, &labels_path)
        },
    )?;
    if let Some(path) = &opts.uids_out {
        let n = write_shard_uids(opts, dir, shards, path)?;
        rep.info(&format!("wrote {n} uids to {}", path.display()));
    }
    let c = summary.counts;
    rep.info(&format!(
        "{} shards: {} filtered now, {} already done; kept {} of {} rows ({rule})",
        summary.shards, summary.done, summary.already_done, c.kept, c.rows
    ));
    Ok(ShardsFiltered {
        out_dir: dir.display().to_string(),
        shards: summary.shards,
        done: summary.done,
        already_done: summary.already_done,
        rows_in: c.rows,
        rows_out: c.kept,
        dropped: c.skipped,
    })
}

/// sha256 of a labels file's bytes (what a filtered shard was made from),
/// read a MiB at a time.
fn labels_file_sha256(path: &Path) -> Result<String> {
    let f = std::fs::File::open(path)
        .map_err(|e| Error::InvalidInput(format!("{}: cannot open it ({e})", path.display())))?;
    Ok(crate::runtime::hex::sha256_hex_of(f)
        .map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?)
}

/// Filter one shard with `rule`, joined by key to the one labels file's
/// `single` index, or else to its own labels at `labels_path`.
fn filter_shard(
    opts: &FilterOptions,
    shard: &ShardOutput,
    single: Option<&LabelIndex<'_>>,
    rule: Keep,
    labels_path: &Path,
) -> Result<Counts> {
    let format = shard_format(opts.format, &shard.shard.path);
    check_all_rows(opts, format, &shard.path)?;
    let target = |one_output| Target {
        out: &shard.path,
        format,
        labels: labels_path,
        one_output,
    };
    let (s, _) = match single {
        Some(index) => {
            // The labels' fingerprint covers every shard together.
            let check = FingerprintCheck::Unknown(
                "one labels file for many shards carries the fingerprint of them all together, not of one shard".into(),
            );
            write_joined(opts, shard.input, index, &check, rule, &target(false))?
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
            write_joined(opts, shard.input, &index, &check, rule, &target(true))?
        }
    };
    Ok(Counts {
        rows: s.rows_in,
        usable: s.rows_in,
        skipped: s.dropped,
        kept: s.rows_out,
        noisy: 0,
    })
}

/// `--uids-out` with `--out-dir`: the keys of every filtered shard in
/// `dir` (those finished by an earlier run included), read back from the
/// outputs, which hold exactly the kept rows.
fn write_shard_uids(
    opts: &FilterOptions,
    dir: &Path,
    shards: &[Shard],
    path: &Path,
) -> Result<usize> {
    let outputs: Vec<PathBuf> = shards
        .iter()
        .map(|s| {
            let ext = extension(shard_format(opts.format, &s.path));
            shards::output_path_as(dir, &s.stem, ext)
        })
        .collect();
    let out = data::InputSet::open(&outputs, &opts.columns)?;
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
fn shard_format(explicit: Option<OutputFormat>, shard: &Path) -> OutputFormat {
    explicit.unwrap_or_else(|| {
        let tar = shard
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("tar"));
        if tar {
            OutputFormat::Tar
        } else {
            OutputFormat::Parquet
        }
    })
}

/// The file extension of an output format.
fn extension(format: OutputFormat) -> &'static str {
    match format {
        OutputFormat::Tar => "tar",
        OutputFormat::Parquet => "parquet",
    }
}
