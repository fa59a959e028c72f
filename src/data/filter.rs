//! The filtered dataset: the user's own rows and columns, minus the ones
//! judged noisy or unusable.

use std::collections::BTreeMap;
use std::path::Path;

use std::sync::Arc;

use anyhow::Context;
use arrow_array::{ArrayRef, BooleanArray, Float32Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};

use super::input::row_span;
use super::read::{restore_batch, Damage, FileReader, Piece, Restored};
use super::write::AtomicParquetWriter;
use super::{InputSet, LabelRow};
use crate::error::{invalid, Error, Result};

/// Rows read per batch; small because rows may carry full images.
const BATCH_ROWS: usize = 1024;

/// How many rows went in and came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FilterSummary {
    /// Rows over all input files.
    pub rows_in: usize,
    /// Rows written.
    pub rows_out: usize,
    /// Rows the mask keeps that could not be read back from the input
    /// (a damaged row group, invalid UTF-8 in a column) and are missing from
    /// the output; each cause was printed as a warning.
    pub dropped: usize,
}

impl FilterSummary {
    /// [`crate::Error::Partial`] (exit 4) when kept rows are missing from
    /// `out`: the output is written, but it is not all it should be.
    pub fn check(&self, out: &Path) -> Result<()> {
        if self.dropped == 0 {
            return Ok(());
        }
        Err(Error::Partial(format!(
            "{} rows that the labels keep could not be read back from the input and are missing from {} (the warnings above say which row groups and columns)",
            self.dropped,
            out.display()
        )))
    }
}

/// The format of a filtered dataset (`ncclean filter --format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// Parquet: the input's columns (for tar input: key, image, caption,
    /// json).
    Parquet,
    /// A webdataset tar of the kept samples' members, byte for byte (tar
    /// input only).
    Tar,
}

impl OutputFormat {
    /// `explicit` when given; else by the output's extension (`.tar`,
    /// `.parquet`); else the format of the input.
    pub fn choose(input: &InputSet, out: &Path, explicit: Option<OutputFormat>) -> OutputFormat {
        if let Some(f) = explicit {
            return f;
        }
        let ext = out
            .extension()
            .map(|e| e.to_string_lossy().to_ascii_lowercase());
        match ext.as_deref() {
            Some("tar") => OutputFormat::Tar,
            Some("parquet") => OutputFormat::Parquet,
            _ if input
                .files
                .iter()
                .all(|f| matches!(f.format, super::FileFormat::Webdataset(_))) =>
            {
                OutputFormat::Tar
            }
            _ => OutputFormat::Parquet,
        }
    }
}

/// Label columns added to every row a filtered parquet file holds, so the
/// output says why each row is there: `ncclean_clean_prob` and
/// `ncclean_soft_label`, and with `decision` (every row written) also
/// `ncclean_keep`, `ncclean_status` and `ncclean_error`. A source column of
/// the same name (a file filtered before) is replaced.
#[derive(Debug, Clone, Copy)]
pub struct Annotations<'a> {
    /// The labels.
    pub labels: &'a [LabelRow],
    /// `label_of[file][row]`: the index of each input row's label
    /// (`u32::MAX`: none, written as nulls).
    pub label_of: &'a [Vec<u32>],
    /// The rule's decision per input row, when every row is written.
    pub decision: Option<&'a [Vec<bool>]>,
}

impl Annotations<'_> {
    fn fields(&self) -> Vec<Field> {
        let mut f = vec![
            Field::new("ncclean_clean_prob", DataType::Float32, true),
            Field::new("ncclean_soft_label", DataType::Float32, true),
        ];
        if self.decision.is_some() {
            f.push(Field::new("ncclean_keep", DataType::Boolean, false));
            f.push(Field::new("ncclean_status", DataType::Utf8, true));
            f.push(Field::new("ncclean_error", DataType::Utf8, true));
        }
        f
    }

    /// The annotation columns for rows `rows` of input file `file`.
    fn columns(&self, file: usize, rows: &[usize]) -> Vec<ArrayRef> {
        let of = self.label_of.get(file);
        let label = |r: usize| {
            of.and_then(|o| o.get(r))
                .and_then(|&i| self.labels.get(i as usize))
        };
        let mut c: Vec<ArrayRef> = vec![
            Arc::new(Float32Array::from_iter(
                rows.iter().map(|&r| label(r).and_then(|l| l.clean_prob)),
            )),
            Arc::new(Float32Array::from_iter(
                rows.iter().map(|&r| label(r).and_then(|l| l.soft_label)),
            )),
        ];
        if let Some(d) = self.decision {
            let d = d.get(file);
            c.push(Arc::new(BooleanArray::from_iter(rows.iter().map(|&r| {
                Some(d.and_then(|d| d.get(r)).copied().unwrap_or(false))
            }))));
            c.push(Arc::new(StringArray::from_iter(
                rows.iter().map(|&r| label(r).map(|l| l.status.as_str())),
            )));
            c.push(Arc::new(StringArray::from_iter(
                rows.iter()
                    .map(|&r| label(r).and_then(|l| l.error.as_deref())),
            )));
        }
        c
    }
}

/// The output's shape: which source columns go through, and the schema.
struct Layout<'a> {
    schema: SchemaRef,
    /// Indices of the source columns written (all but those an annotation
    /// replaces).
    source: Vec<usize>,
    ann: Option<Annotations<'a>>,
}

impl<'a> Layout<'a> {
    fn new(source: &SchemaRef, ann: Option<Annotations<'a>>) -> Layout<'a> {
        let extra = ann.map(|a| a.fields()).unwrap_or_default();
        let cols: Vec<usize> = (0..source.fields().len())
            .filter(|&i| !extra.iter().any(|e| e.name() == source.field(i).name()))
            .collect();
        let mut fields: Vec<Field> = cols.iter().map(|&i| source.field(i).clone()).collect();
        fields.extend(extra);
        let schema = Arc::new(Schema::new_with_metadata(fields, source.metadata().clone()));
        Layout {
            schema,
            source: cols,
            ann,
        }
    }

    /// `batch` (the kept rows `rows` of file `file`) in the output's shape.
    fn batch(&self, batch: &RecordBatch, file: usize, rows: &[usize]) -> Result<RecordBatch> {
        let mut columns: Vec<ArrayRef> = self
            .source
            .iter()
            .map(|&i| batch.column(i).clone())
            .collect();
        if let Some(a) = &self.ann {
            columns.extend(a.columns(file, rows));
        }
        Ok(RecordBatch::try_new(self.schema.clone(), columns)
            .context("adding the label columns")?)
    }
}

/// [`write_filtered`] or [`super::write_filtered_tar`], as `format` says
/// (`metadata` and `ann` only go into parquet output).
pub fn write_filtered_as(
    input: &InputSet,
    keep: &[Vec<bool>],
    out: &Path,
    metadata: &BTreeMap<String, String>,
    format: OutputFormat,
    ann: Option<Annotations<'_>>,
) -> Result<FilterSummary> {
    match format {
        OutputFormat::Parquet => write_filtered_annotated(input, keep, out, metadata, ann),
        OutputFormat::Tar => {
            check_keep_shape(input, keep)?;
            super::write_filtered_tar(input, keep, out)
        }
    }
}

/// Write the rows of `input` whose `keep[file][row]` is true, all original
/// columns and the schema unchanged (`metadata` added to the footer),
/// streaming batch by batch. Tar shards are written as rows of key, image,
/// caption and json (for tar output see [`super::write_filtered_tar`]). Several input files go into one output file,
/// so their schemas must be equal (else [`crate::Error::InvalidInput`]).
///
/// Row groups without a kept row are not read. A kept row that cannot be
/// read back (its row group is damaged in some column, or one of its strings
/// is not valid UTF-8) is left out with a warning and counted in
/// [`FilterSummary::dropped`]: labels were already written for every row,
/// and a multi-hour run should not end on a column only the copy needs.
pub fn write_filtered(
    input: &InputSet,
    keep: &[Vec<bool>],
    out: &Path,
    metadata: &BTreeMap<String, String>,
) -> Result<FilterSummary> {
    write_filtered_annotated(input, keep, out, metadata, None)
}

/// [`write_filtered`] with the label columns of `ann` added to each row.
pub fn write_filtered_annotated(
    input: &InputSet,
    keep: &[Vec<bool>],
    out: &Path,
    metadata: &BTreeMap<String, String>,
    ann: Option<Annotations<'_>>,
) -> Result<FilterSummary> {
    check_keep_shape(input, keep)?;
    if input
        .files
        .iter()
        .any(|f| matches!(f.format, super::FileFormat::Webdataset(_)))
    {
        let layout = Layout::new(&super::webdataset::schema(), ann);
        return super::webdataset::write_filtered_parquet(
            input,
            keep,
            out,
            metadata,
            &|b, f, r| layout.batch(b, f, r),
            layout.schema.clone(),
        );
    }
    check_same_schema(input)?;
    let layout = Layout::new(&input.files[0].schema, ann);
    let schema = &layout;
    let mut writer = AtomicParquetWriter::create(out, layout.schema.clone(), metadata)?;
    let mut rows_out = 0;
    let mut dropped = 0;
    for (f, keep) in keep.iter().enumerate() {
        let reader = Arc::new(FileReader::open(&input.files[f].path)?);
        let groups = groups_with_kept_rows(&reader, keep);
        for piece in reader.stream_groups(None, BATCH_ROWS, false, groups) {
            crate::runtime::interrupt::check()?;
            match piece {
                Piece::Rows { batch, first_row } => {
                    rows_out += write_kept(&mut writer, schema, batch, first_row, keep, input, f)?;
                }
                Piece::Damaged(d) => {
                    let wanted = kept_in(keep, d.first_row, d.rows);
                    if wanted == 0 {
                        continue;
                    }
                    let (written, lost) =
                        salvage(&reader, &d, &mut writer, schema, keep, input, f)?;
                    rows_out += written;
                    dropped += lost;
                }
            }
        }
    }
    writer.finish()?;
    Ok(FilterSummary {
        rows_in: input.num_rows(),
        rows_out,
        dropped,
    })
}

/// Row groups of `reader` with at least one kept row.
fn groups_with_kept_rows(reader: &FileReader, keep: &[bool]) -> Vec<usize> {
    let mut start = 0;
    let mut out = Vec::new();
    for (g, n) in reader.row_group_rows().into_iter().enumerate() {
        if kept_in(keep, start, n) > 0 {
            out.push(g);
        }
        start += n;
    }
    out
}

/// `3 kept rows among rows 40-79 of the file`.
fn kept_rows(kept: usize, first: usize, n: usize) -> String {
    let rows = if kept == 1 { "row" } else { "rows" };
    format!("{kept} kept {rows} among {}", row_span(first, n))
}

/// Kept rows among `first..first + n`.
fn kept_in(keep: &[bool], first: usize, n: usize) -> usize {
    let end = first.saturating_add(n).min(keep.len());
    keep.get(first.min(end)..end)
        .map_or(0, |k| k.iter().filter(|&&x| x).count())
}

/// Write the kept rows of `batch` (file rows `first_row..`), retagged with
/// the output schema; returns how many.
fn write_kept(
    writer: &mut AtomicParquetWriter,
    schema: &Layout<'_>,
    batch: RecordBatch,
    first_row: usize,
    keep: &[bool],
    input: &InputSet,
    f: usize,
) -> Result<usize> {
    let n = batch.num_rows();
    let mask = keep.get(first_row..first_row + n).ok_or_else(|| {
        anyhow::anyhow!(
            "{} has more rows than its footer says",
            input.display_name(f)
        )
    })?;
    let rows: Vec<usize> = (first_row..first_row + n)
        .zip(mask)
        .filter(|(_, &k)| k)
        .map(|(r, _)| r)
        .collect();
    if rows.is_empty() {
        return Ok(0);
    }
    let batch = if rows.len() == n {
        batch
    } else {
        let predicate = BooleanArray::from(mask.to_vec());
        arrow_select::filter::filter_record_batch(&batch, &predicate)
            .with_context(|| format!("filtering {}", input.display_name(f)))?
    };
    // Shards may differ in schema-level metadata only: the layout's schema
    // retags the batch.
    let batch = schema
        .batch(&batch, f, &rows)
        .map_err(|e| e.context(format!("reading {}", input.display_name(f))))?;
    writer.write(&batch)?;
    Ok(batch.num_rows())
}

/// The kept rows of a damaged stretch, read again with strings as bytes:
/// invalid UTF-8 then costs only the rows that hold it. Returns the rows
/// written and the kept rows left out, with a warning for each cause.
fn salvage(
    reader: &Arc<FileReader>,
    d: &Damage,
    writer: &mut AtomicParquetWriter,
    schema: &Layout<'_>,
    keep: &[bool],
    input: &InputSet,
    f: usize,
) -> Result<(usize, usize)> {
    let end = d.first_row + d.rows;
    let (mut written, mut lost) = (0, 0);
    for piece in reader.stream_groups(None, BATCH_ROWS, true, vec![d.row_group]) {
        match piece {
            Piece::Rows { batch, first_row } => {
                // Rows before the damage were written by the first pass.
                let from = d.first_row.max(first_row);
                let to = end.min(first_row + batch.num_rows());
                if from >= to {
                    continue;
                }
                let batch = batch.slice(from - first_row, to - from);
                let Restored {
                    batch,
                    bad,
                    columns,
                } = restore_batch(&batch, reader.schema())
                    .map_err(|e| anyhow::anyhow!("reading {}: {e}", input.display_name(f)))?;
                let mut mask = keep[from..to].to_vec();
                let mut bad_kept = 0;
                for (m, b) in mask.iter_mut().zip(bad.unwrap_or_default()) {
                    if *m && b {
                        *m = false;
                        bad_kept += 1;
                    }
                }
                if bad_kept > 0 {
                    lost += bad_kept;
                    crate::runtime::progress::warn_once(&format!(
                        "row group {} of {}: invalid UTF-8 in {}; left out of the filtered output: {}",
                        d.row_group,
                        input.display_name(f),
                        columns
                            .iter()
                            .map(|c| format!("column \"{c}\""))
                            .collect::<Vec<_>>()
                            .join(" or "),
                        kept_rows(bad_kept, from, to - from),
                    ));
                }
                let mut full = vec![false; from];
                full.extend(mask);
                written += write_kept(writer, schema, batch, from, &full, input, f)?;
            }
            Piece::Damaged(again) => {
                let from = again.first_row.max(d.first_row);
                let n = kept_in(keep, from, end.saturating_sub(from));
                if n > 0 {
                    lost += n;
                    crate::runtime::progress::warn_once(&format!(
                        "{}; left out of the filtered output: {}",
                        again.reason(),
                        kept_rows(n, from, end - from),
                    ));
                }
            }
        }
    }
    Ok((written, lost))
}

/// A mask of the wrong shape is a caller bug, not bad user data.
fn check_keep_shape(input: &InputSet, keep: &[Vec<bool>]) -> Result<()> {
    if keep.len() != input.files.len() {
        return Err(anyhow::anyhow!(
            "keep mask covers {} files, the input has {}",
            keep.len(),
            input.files.len()
        )
        .into());
    }
    for (f, (mask, file)) in keep.iter().zip(&input.files).enumerate() {
        if mask.len() != file.num_rows {
            return Err(anyhow::anyhow!(
                "keep mask for {} has {} rows, the file has {}",
                input.display_name(f),
                mask.len(),
                file.num_rows
            )
            .into());
        }
    }
    Ok(())
}

/// Fields must match exactly; schema-level metadata may differ per shard
/// (the first file's is kept). Cheap (footers only), so commands that write
/// every input column into one output call it before any other work.
pub(crate) fn check_same_schema(input: &InputSet) -> Result<()> {
    let first = &input.files[0];
    for f in &input.files[1..] {
        let names = (
            first.path.display().to_string(),
            f.path.display().to_string(),
        );
        if let Some(what) = schema_difference(&first.schema, &f.schema, &names) {
            return Err(invalid(format!(
                "{} and {} have different columns: {what}; files written into one output must \
                 have identical columns and types (rewrite the odd shard, or run it separately)",
                names.0, names.1,
            )));
        }
    }
    Ok(())
}

/// The first difference between the fields of `a` and `b` (of the files
/// named `names`), in words.
fn schema_difference(
    a: &arrow_schema::Schema,
    b: &arrow_schema::Schema,
    names: &(String, String),
) -> Option<String> {
    let (na, nb) = names;
    for f in a.fields() {
        match b.field_with_name(f.name()) {
            Err(_) => return Some(format!("column \"{}\" is missing from {nb}", f.name())),
            Ok(o) if o.data_type() != f.data_type() || o.is_nullable() != f.is_nullable() => {
                let kind = |x: &arrow_schema::Field| {
                    let null = if x.is_nullable() { "" } else { " not null" };
                    format!("{}{null}", x.data_type())
                };
                return Some(format!(
                    "column \"{}\" is {} in {na} but {} in {nb}",
                    f.name(),
                    kind(f),
                    kind(o)
                ));
            }
            Ok(_) => {}
        }
    }
    if let Some(extra) = b
        .fields()
        .iter()
        .find(|o| a.field_with_name(o.name()).is_err())
    {
        return Some(format!(
            "column \"{}\" of {nb} is missing from {na}",
            extra.name()
        ));
    }
    (a.fields() != b.fields()).then(|| {
        let order = |s: &arrow_schema::Schema| -> String {
            s.fields()
                .iter()
                .map(|f| f.name().as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        format!(
            "their columns are in another order ({} in {na}, {} in {nb})",
            order(a),
            order(b)
        )
    })
}

#[cfg(test)]
mod tests {
    use std::fs::File;

    use arrow_array::{Array, RecordBatch};
    use arrow_schema::DataType;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    use super::*;
    use crate::data::testutil::{binaries, float_lists, strings, write_parquet};
    use crate::data::ColumnOptions;

    fn read(path: &Path) -> (RecordBatch, BTreeMap<String, String>) {
        let b = ParquetRecordBatchReaderBuilder::try_new(File::open(path).unwrap()).unwrap();
        let meta = b
            .metadata()
            .file_metadata()
            .key_value_metadata()
            .map(|kv| {
                kv.iter()
                    .map(|k| (k.key.clone(), k.value.clone().unwrap_or_default()))
                    .collect()
            })
            .unwrap_or_default();
        let schema = b.schema().clone();
        let batches: Vec<RecordBatch> = b.build().unwrap().map(|b| b.unwrap()).collect();
        let batch = arrow_select::concat::concat_batches(&schema, &batches).unwrap();
        (batch, meta)
    }

    fn shard(dir: &Path, name: &str, caps: &[&str]) -> std::path::PathBuf {
        let c: Vec<Option<&str>> = caps.iter().map(|s| Some(*s)).collect();
        let i: Vec<Option<&[u8]>> = caps.iter().map(|s| Some(s.as_bytes())).collect();
        let e: Vec<Option<Vec<f32>>> = caps.iter().map(|s| Some(vec![s.len() as f32])).collect();
        write_parquet(
            dir,
            name,
            vec![
                ("jpg", binaries(&i)),
                ("caption", strings(&c)),
                ("emb", float_lists(&e)),
            ],
        )
    }

    #[test]
    fn keeps_exactly_the_chosen_rows_across_files() {
        let dir = tempfile::tempdir().unwrap();
        let a = shard(dir.path(), "a.parquet", &["a0", "a1", "a2"]);
        let b = shard(dir.path(), "b.parquet", &["b0", "b1"]);
        let set = InputSet::open(&[a, b], &ColumnOptions::default()).unwrap();
        let out = dir.path().join("out/filtered.parquet");
        let meta = BTreeMap::from([("ncclean.threshold".to_string(), "0.5".to_string())]);
        let keep = vec![vec![true, false, true], vec![false, true]];
        let s = write_filtered(&set, &keep, &out, &meta).unwrap();
        assert_eq!(
            s,
            FilterSummary {
                rows_in: 5,
                rows_out: 3,
                dropped: 0
            }
        );
        let (batch, back) = read(&out);
        assert_eq!(batch.schema().fields(), set.files[0].schema.fields());
        assert_eq!(
            back.get("ncclean.threshold").map(String::as_str),
            Some("0.5")
        );
        let caps = batch.column_by_name("caption").unwrap();
        let caps = arrow_array::cast::AsArray::as_string::<i32>(caps.as_ref());
        let got: Vec<&str> = (0..caps.len()).map(|i| caps.value(i)).collect();
        assert_eq!(got, ["a0", "a2", "b1"]);
        let imgs = batch.column_by_name("jpg").unwrap();
        let imgs = arrow_array::cast::AsArray::as_binary::<i32>(imgs.as_ref());
        assert_eq!(imgs.value(2), b"b1");
    }

    #[test]
    fn differing_schemas_are_invalid_input() {
        let dir = tempfile::tempdir().unwrap();
        let a = shard(dir.path(), "a.parquet", &["a0"]);
        let b = write_parquet(
            dir.path(),
            "b.parquet",
            vec![
                ("jpg", binaries(&[Some(b"x")])),
                ("caption", strings(&[Some("b0")])),
            ],
        );
        let set = InputSet::open(&[a, b], &ColumnOptions::default()).unwrap();
        let out = dir.path().join("f.parquet");
        let e =
            write_filtered(&set, &[vec![true], vec![true]], &out, &BTreeMap::new()).unwrap_err();
        assert_eq!(e.exit_code(), 3);
        let e = e.to_string();
        assert!(
            e.contains("a.parquet and ")
                && e.contains("b.parquet have different columns: column \"emb\" is missing from ")
                && e.ends_with("or run it separately)"),
            "{e}"
        );
        // Each kind of difference, in words.
        let names = ("a".to_string(), "b".to_string());
        let field = |n: &str, t: DataType, null: bool| arrow_schema::Field::new(n, t, null);
        let schema = |f: Vec<arrow_schema::Field>| arrow_schema::Schema::new(f);
        let base = schema(vec![
            field("x", DataType::Utf8, true),
            field("y", DataType::Int32, true),
        ]);
        let cases = [
            (
                vec![field("x", DataType::Utf8, true)],
                "column \"y\" is missing from b",
            ),
            (
                vec![
                    field("x", DataType::Utf8, true),
                    field("y", DataType::Int64, true),
                ],
                "column \"y\" is Int32 in a but Int64 in b",
            ),
            (
                vec![
                    field("x", DataType::Utf8, false),
                    field("y", DataType::Int32, true),
                ],
                "column \"x\" is Utf8 in a but Utf8 not null in b",
            ),
            (
                vec![
                    field("x", DataType::Utf8, true),
                    field("y", DataType::Int32, true),
                    field("z", DataType::Int32, true),
                ],
                "column \"z\" of b is missing from a",
            ),
            (
                vec![
                    field("y", DataType::Int32, true),
                    field("x", DataType::Utf8, true),
                ],
                "their columns are in another order (x, y in a, y, x in b)",
            ),
        ];
        for (fields, want) in cases {
            assert_eq!(
                schema_difference(&base, &schema(fields), &names).as_deref(),
                Some(want)
            );
        }
        assert_eq!(schema_difference(&base, &base, &names), None);
        assert!(!out.exists());
    }
}
