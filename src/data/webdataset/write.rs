//! Filtered outputs of tar input: tar shards holding the kept samples'
//! members byte for byte, or a parquet file of [`super::schema`].

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use anyhow::Context;
use arrow_array::{BooleanArray, RecordBatch};

use super::group::{climbs_out, split_name, Grouper, Lost};
use super::tar::{Entry, TarReader};
use super::{record_batches, FileFormat};
use crate::data::write::AtomicParquetWriter;
use crate::data::{FilterSummary, InputSet};
use crate::error::Result;

/// Samples per parquet batch; small because rows carry images.
const BATCH_ROWS: usize = 256;

/// Write the samples of tar shard `shard` whose `keep[sample]` is true to the
/// tar `out`: each kept member's raw blocks (extension headers, header,
/// data) copied unchanged, in shard order. Written under a temporary name
/// and renamed, so an interrupt leaves the old `out` or the new one.
///
/// `keep` is indexed like the shard's rows (its sample order) and must
/// cover every sample. Kept samples with a member cut short by a truncated
/// shard lose that member and are counted in [`FilterSummary::dropped`].
pub fn write_filtered_tar_shard(shard: &Path, keep: &[bool], out: &Path) -> Result<FilterSummary> {
    let (pending, mut w) = create(out)?;
    let s = copy_kept(shard, keep, &mut w)?;
    finish_tar(w, out)?;
    pending.commit()?;
    Ok(s)
}

/// [`write_filtered_tar_shard`] over every shard of `input` into the one tar
/// `out`, shard after shard; `keep[file][sample]` as the keep masks of
/// `filter` and `score` give it.
pub fn write_filtered_tar(
    input: &InputSet,
    keep: &[Vec<bool>],
    out: &Path,
) -> Result<FilterSummary> {
    if let Some(f) = input
        .files
        .iter()
        .find(|f| !matches!(f.format, FileFormat::Webdataset(_)))
    {
        return Err(crate::error::invalid(format!(
            "{}: is not a tar shard; tar output needs tar input (use --format parquet)",
            f.path.display()
        )));
    }
    let (pending, mut w) = create(out)?;
    let mut total = FilterSummary {
        rows_in: 0,
        rows_out: 0,
        dropped: 0,
    };
    for (f, mask) in input.files.iter().zip(keep) {
        let s = copy_kept(&f.path, mask, &mut w)?;
        total.rows_in += s.rows_in;
        total.rows_out += s.rows_out;
        total.dropped += s.dropped;
    }
    finish_tar(w, out)?;
    pending.commit()?;
    Ok(total)
}

/// A pending output for `out` (its directory created) and a writer of its
/// temporary.
fn create(out: &Path) -> Result<(crate::runtime::temp::Pending, BufWriter<File>)> {
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let pending = crate::runtime::temp::Pending::new(out)?;
    let file = File::create(pending.tmp_path())
        .with_context(|| format!("creating {}", pending.tmp_path().display()))?;
    Ok((pending, BufWriter::with_capacity(1 << 20, file)))
}

/// The end-of-archive marker (two zero blocks), then flush and sync.
fn finish_tar(mut w: BufWriter<File>, out: &Path) -> Result<()> {
    w.write_all(&[0u8; 1024])
        .with_context(|| format!("writing {}", out.display()))?;
    let file = w
        .into_inner()
        .map_err(|e| anyhow::anyhow!("writing {}: {}", out.display(), e.error()))?;
    file.sync_all()
        .with_context(|| format!("syncing {}", out.display()))?;
    Ok(())
}

/// Copy the kept samples' members of `shard` to `w`; pax global headers are
/// copied too, since they apply to every member after them.
fn copy_kept(shard: &Path, keep: &[bool], w: &mut impl Write) -> Result<FilterSummary> {
    let mut reader = TarReader::open(shard)?;
    let mut grouper: Grouper<()> = Grouper::default();
    let mut kept = vec![false; keep.len()];
    let mut dropped = vec![false; keep.len()];
    let mut entries = 0usize;
    while let Some(entry) = reader.next_entry()? {
        entries += 1;
        if entries.is_multiple_of(1024) {
            crate::runtime::interrupt::check()?;
        }
        match entry {
            Entry::File(m) => {
                let Some((key, ext)) = split_name(&m.name) else {
                    continue;
                };
                let (index, _) = grouper.push(key, ext, &m.name, ());
                let Some(&want) = keep.get(index) else {
                    return Err(mask_mismatch(shard, keep.len(), index + 1));
                };
                if !want {
                    continue;
                }
                // Never written, whatever the mask says: extracting it
                // would write outside the output's directory.
                if m.truncated.is_some() || climbs_out(key) {
                    dropped[index] = true;
                    continue;
                }
                reader.copy_raw(m.start, m.end, w)?;
                kept[index] = true;
            }
            Entry::Other {
                start,
                end,
                global: true,
            } => reader.copy_raw(start, end, w)?,
            // A damaged stretch is a row of its own, without members.
            Entry::Damaged { start, end, why } => {
                let key = super::lost_key(shard, start);
                let (index, _) = grouper.push_lost(key, Lost { start, end, why });
                if index >= keep.len() {
                    return Err(mask_mismatch(shard, keep.len(), index + 1));
                }
            }
            Entry::Other { .. } => {}
        }
    }
    if grouper.samples() != keep.len() {
        return Err(mask_mismatch(shard, keep.len(), grouper.samples()));
    }
    let lost = dropped.iter().filter(|&&d| d).count();
    if lost > 0 {
        crate::runtime::progress::warn_once(&format!(
            "{}: {lost} kept samples lost a member cut short by the end of the file or named with '..' or a leading '/'; the rest of their members are written",
            shard.display()
        ));
    }
    Ok(FilterSummary {
        rows_in: keep.len(),
        rows_out: kept.iter().filter(|&&k| k).count(),
        dropped: lost,
    })
}

/// A keep mask that does not match the shard: a caller's bug or a shard
/// that changed since it was scored.
fn mask_mismatch(shard: &Path, mask: usize, samples: usize) -> crate::Error {
    crate::error::invalid(format!(
        "{}: the keep mask covers {mask} samples but the shard has {}{samples}; was it changed since it was scored?",
        shard.display(),
        if samples > mask { "at least " } else { "" }
    ))
}

/// Turns kept rows into the output's batch (see [`write_filtered_parquet`]).
pub(crate) type Shape<'a> = dyn Fn(&RecordBatch, usize, &[usize]) -> Result<RecordBatch> + 'a;

/// Write the kept samples of tar input as parquet rows of
/// [`super::schema`]: key, image bytes, caption and the `.json` text, shaped
/// by `shape(batch, file, rows)` (the kept rows `rows` of input file `file`)
/// into `out_schema` (label columns added).
/// Kept samples whose image or caption cannot be read (they were usable
/// when scored, so the shard changed) are left out and counted as dropped.
pub(crate) fn write_filtered_parquet(
    input: &InputSet,
    keep: &[Vec<bool>],
    out: &Path,
    metadata: &BTreeMap<String, String>,
    shape: &Shape<'_>,
    out_schema: arrow_schema::SchemaRef,
) -> Result<FilterSummary> {
    let mut writer = AtomicParquetWriter::create(out, out_schema, metadata)?;
    let (mut rows_out, mut dropped) = (0, 0);
    for (file, (f, mask)) in input.files.iter().zip(keep).enumerate() {
        let FileFormat::Webdataset(layout) = &f.format else {
            return Err(crate::error::invalid(format!(
                "{}: is not a tar shard; inputs of one run must all be tar shards or all parquet",
                f.path.display()
            )));
        };
        if mask.iter().all(|&k| !k) {
            continue;
        }
        for item in record_batches(&f.path, layout, input.image_limits.max_bytes, BATCH_ROWS)? {
            crate::runtime::interrupt::check()?;
            let (batch, index) = item?;
            let want: Vec<bool> = index
                .iter()
                .map(|&i| mask.get(i).copied().unwrap_or(false))
                .collect();
            let readable: Vec<bool> = (0..batch.num_rows())
                .map(|r| {
                    use arrow_array::Array;
                    batch.column(1).is_valid(r) && batch.column(2).is_valid(r)
                })
                .collect();
            let chosen: Vec<bool> = want.iter().zip(&readable).map(|(w, r)| *w && *r).collect();
            dropped += want
                .iter()
                .zip(&readable)
                .filter(|(w, r)| **w && !**r)
                .count();
            let rows: Vec<usize> = index
                .iter()
                .zip(&chosen)
                .filter(|(_, &c)| c)
                .map(|(&i, _)| i)
                .collect();
            let n = rows.len();
            if n == 0 {
                continue;
            }
            let batch: RecordBatch =
                arrow_select::filter::filter_record_batch(&batch, &BooleanArray::from(chosen))
                    .with_context(|| format!("filtering {}", f.path.display()))?;
            writer.write(&shape(&batch, file, &rows)?)?;
            rows_out += n;
        }
    }
    writer.finish()?;
    Ok(FilterSummary {
        rows_in: input.num_rows(),
        rows_out,
        dropped,
    })
}
