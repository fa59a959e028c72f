//! `labels.parquet`: one row per input pair with its clean probability and
//! decision (see DESIGN.md, "Data contracts").

use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use arrow_array::cast::AsArray;
use arrow_array::types::{Float16Type, Float32Type, Float64Type};
use arrow_array::{
    Array, ArrayRef, BooleanArray, Float32Array, RecordBatch, StringArray, UInt64Array,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use super::rows::{integer_at, plain, string_at};
use super::write::AtomicParquetWriter;
use crate::error::{invalid, Result};

/// Rows converted to arrow at a time, so writing needs one chunk of arrow
/// memory on top of the rows themselves.
const CHUNK_ROWS: usize = 64 * 1024;

/// Whether a pair was scored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RowStatus {
    /// Scored; the float columns are set.
    Ok,
    /// Unusable (see `error`); the float columns are null.
    Skipped,
}

impl RowStatus {
    /// The string stored in the `status` column.
    pub fn as_str(self) -> &'static str {
        match self {
            RowStatus::Ok => "ok",
            RowStatus::Skipped => "skipped",
        }
    }

    fn parse(s: &str) -> Option<RowStatus> {
        match s {
            "ok" => Some(RowStatus::Ok),
            "skipped" => Some(RowStatus::Skipped),
            _ => None,
        }
    }
}

/// One row of `labels.parquet`.
#[derive(Debug, Clone, PartialEq)]
pub struct LabelRow {
    /// The input row's key, carried through untouched.
    pub key: String,
    /// The input file's display name.
    pub source_file: String,
    /// Row index inside that file.
    pub source_row: u64,
    /// P(pair is matched); higher is cleaner. `None` when skipped.
    pub clean_prob: Option<f32>,
    /// The method's rectified correspondence in [0, 1]. `None` when skipped.
    pub soft_label: Option<f32>,
    /// Image–caption similarity. `None` when skipped.
    pub similarity: Option<f32>,
    /// Decision at the chosen threshold (false for skipped rows).
    pub is_clean: bool,
    /// Scored or skipped.
    pub status: RowStatus,
    /// Why the row was skipped.
    pub error: Option<String>,
}

/// The labels' columns, in file order. Every column but the join column
/// `key` carries the `ncclean_` prefix, so joining labels to the source
/// metadata (img2dataset's `status`/`error_message`, LAION's `similarity`)
/// never collides with a source column.
pub const COLUMNS: [&str; 9] = [
    "key",
    "ncclean_source_file",
    "ncclean_source_row",
    "ncclean_clean_prob",
    "ncclean_soft_label",
    "ncclean_similarity",
    "ncclean_is_clean",
    "ncclean_status",
    "ncclean_error",
];

/// The prefix of every label column but `key`; files written before it
/// (plain `status`, `clean_prob`, ...) are still read.
pub const LABEL_PREFIX: &str = "ncclean_";

fn labels_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new(COLUMNS[0], DataType::Utf8, false),
        Field::new(COLUMNS[1], DataType::Utf8, false),
        Field::new(COLUMNS[2], DataType::UInt64, false),
        Field::new(COLUMNS[3], DataType::Float32, true),
        Field::new(COLUMNS[4], DataType::Float32, true),
        Field::new(COLUMNS[5], DataType::Float32, true),
        Field::new(COLUMNS[6], DataType::Boolean, false),
        Field::new(COLUMNS[7], DataType::Utf8, false),
        Field::new(COLUMNS[8], DataType::Utf8, true),
    ]))
}

fn to_batch(schema: &SchemaRef, rows: &[LabelRow]) -> Result<RecordBatch> {
    let floats = |f: fn(&LabelRow) -> Option<f32>| -> ArrayRef {
        Arc::new(rows.iter().map(f).collect::<Float32Array>())
    };
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values(rows.iter().map(|r| &r.key))),
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|r| &r.source_file),
        )),
        Arc::new(UInt64Array::from_iter_values(
            rows.iter().map(|r| r.source_row),
        )),
        floats(|r| r.clean_prob),
        floats(|r| r.soft_label),
        floats(|r| r.similarity),
        Arc::new(BooleanArray::from_iter(
            rows.iter().map(|r| Some(r.is_clean)),
        )),
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|r| r.status.as_str()),
        )),
        Arc::new(
            rows.iter()
                .map(|r| r.error.as_deref())
                .collect::<StringArray>(),
        ),
    ];
    Ok(RecordBatch::try_new(schema.clone(), columns).context("building a labels batch")?)
}

/// Write `labels.parquet` (the [`COLUMNS`] in order: key, then
/// source_file, source_row, clean_prob, soft_label, similarity, is_clean,
/// status, error, each prefixed `ncclean_`; the floats are null for skipped
/// rows) with key–value metadata,
/// atomically, a chunk of rows at a time.
pub fn write_labels(
    path: &Path,
    rows: &[LabelRow],
    metadata: &BTreeMap<String, String>,
) -> Result<()> {
    let schema = labels_schema();
    let mut writer = AtomicParquetWriter::create(path, schema.clone(), metadata)?;
    for chunk in rows.chunks(CHUNK_ROWS) {
        writer.write(&to_batch(&schema, chunk)?)?;
    }
    writer.finish()
}

/// A labels file written a piece at a time (same layout as
/// [`write_labels`]): rows go to disk as they come, the metadata, which
/// describes all of them, is added at the end. Atomic like
/// [`AtomicParquetWriter`].
pub struct LabelsWriter {
    writer: AtomicParquetWriter,
    schema: SchemaRef,
}

impl LabelsWriter {
    /// Start writing `path`.
    pub fn create(path: &Path) -> Result<LabelsWriter> {
        let schema = labels_schema();
        Ok(LabelsWriter {
            writer: AtomicParquetWriter::create(path, schema.clone(), &BTreeMap::new())?,
            schema,
        })
    }

    /// Append rows.
    pub fn write(&mut self, rows: &[LabelRow]) -> Result<()> {
        for chunk in rows.chunks(CHUNK_ROWS) {
            self.writer.write(&to_batch(&self.schema, chunk)?)?;
        }
        Ok(())
    }

    /// Write into `tmp`, a temporary the caller renames into place
    /// ([`crate::runtime::temp::Pending`]); `finish` leaves it there.
    pub fn create_in(tmp: &Path) -> Result<LabelsWriter> {
        let schema = labels_schema();
        Ok(LabelsWriter {
            writer: AtomicParquetWriter::create_in(tmp, schema.clone(), &BTreeMap::new())?,
            schema,
        })
    }

    /// Add `metadata`, write the footer and rename into place.
    pub fn finish(mut self, metadata: &BTreeMap<String, String>) -> Result<()> {
        self.writer.append_metadata(metadata)?;
        self.writer.finish()
    }
}

/// What a labels column may hold as read back: pandas, polars and duckdb
/// re-save strings as large strings, views or dictionaries, floats as
/// doubles and counters as signed integers.
#[derive(Clone, Copy)]
enum Kind {
    Text,
    Float,
    Count,
    Flag,
}

impl Kind {
    fn accepts(self, dt: &DataType) -> bool {
        match (self, dt) {
            (_, DataType::Dictionary(_, v)) => self.accepts(v),
            (Kind::Text, t) => {
                matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
            }
            (Kind::Float, t) => {
                matches!(t, DataType::Float16 | DataType::Float32 | DataType::Float64)
            }
            (Kind::Count, t) => t.is_integer(),
            (Kind::Flag, t) => matches!(t, DataType::Boolean),
        }
    }

    fn expected(self) -> &'static str {
        match self {
            Kind::Text => "a string (utf8, large utf8, string view or a dictionary of them)",
            Kind::Float => "a float (float16, float32 or float64)",
            Kind::Count => "an integer",
            Kind::Flag => "a boolean",
        }
    }
}

const KINDS: [Kind; 9] = [
    Kind::Text,
    Kind::Text,
    Kind::Count,
    Kind::Float,
    Kind::Float,
    Kind::Float,
    Kind::Flag,
    Kind::Text,
    Kind::Text,
];

/// The column holding label column `name` in `schema`: the current name,
/// else the name files had before the `ncclean_` prefix.
fn find_column<'a>(schema: &'a Schema, name: &'a str) -> Option<&'a str> {
    let legacy = name.strip_prefix(LABEL_PREFIX).unwrap_or(name);
    [name, legacy]
        .into_iter()
        .find(|n| schema.field_with_name(n).is_ok())
}

/// Read a labels file back with its key–value metadata. Columns are found
/// by their current or their pre-prefix names, and any string, float or
/// integer encoding of them is accepted (see [`COLUMNS`]). A file that
/// lacks a labels column, has one of another kind, or holds a null key or
/// status is [`crate::Error::InvalidInput`] naming the column.
pub fn read_labels(path: &Path) -> Result<(Vec<LabelRow>, BTreeMap<String, String>)> {
    crate::runtime::small_file::check_regular(path, "labels file")?;
    let file = File::open(path).map_err(|e| {
        invalid(format!(
            "{}: cannot open the labels file ({e}); give the labels.parquet that fit or score wrote",
            path.display()
        ))
    })?;
    let builder = ParquetRecordBatchReaderBuilder::try_new(file).map_err(|e| {
        invalid(format!(
            "{}: not a readable parquet file ({e}); expected a labels.parquet written by ncclean",
            path.display()
        ))
    })?;
    let metadata: BTreeMap<String, String> = builder
        .metadata()
        .file_metadata()
        .key_value_metadata()
        .map(|kv| {
            kv.iter()
                .filter(|k| k.key != "ARROW:schema")
                .map(|k| (k.key.clone(), k.value.clone().unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default();
    let schema = builder.schema().clone();
    let mut names: Vec<String> = Vec::with_capacity(COLUMNS.len());
    for (want, kind) in COLUMNS.iter().zip(KINDS) {
        let found = find_column(&schema, want).ok_or_else(|| {
            let legacy = want.strip_prefix(LABEL_PREFIX).unwrap_or(want);
            let also = if legacy == *want {
                String::new()
            } else {
                format!(" (or \"{legacy}\", the unprefixed name older files use)")
            };
            invalid(format!(
                "{}: not a labels file: column \"{want}\"{also} is missing",
                path.display()
            ))
        })?;
        let dt = schema
            .field_with_name(found)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
            .data_type();
        if !kind.accepts(dt) {
            return Err(invalid(format!(
                "{}: not a labels file: column \"{found}\" has type {dt}, expected {}",
                path.display(),
                kind.expected()
            )));
        }
        names.push(found.to_string());
    }
    let reader = builder
        .build()
        .with_context(|| format!("reading {}", path.display()))?;
    let mut rows = Vec::new();
    for batch in reader {
        let batch = batch.with_context(|| format!("reading {}", path.display()))?;
        append_rows(path, &batch, &names, &mut rows)?;
    }
    Ok((rows, metadata))
}

/// Column `name` of `batch` with any dictionary expanded.
fn column(path: &Path, batch: &RecordBatch, name: &str) -> Result<ArrayRef> {
    let array = batch
        .column_by_name(name)
        .ok_or_else(|| anyhow::anyhow!("{}: column {name} vanished", path.display()))?;
    plain(array)
}

fn float_at(a: &dyn Array, i: usize) -> Option<f32> {
    if a.is_null(i) {
        return None;
    }
    match a.data_type() {
        DataType::Float16 => Some(a.as_primitive::<Float16Type>().value(i).to_f32()),
        DataType::Float32 => Some(a.as_primitive::<Float32Type>().value(i)),
        DataType::Float64 => Some(a.as_primitive::<Float64Type>().value(i) as f32),
        _ => None,
    }
}

/// What every reader of labels relies on: probabilities in [0, 1], a
/// finite similarity, and a clean_prob on every scored row (a cut, an
/// expected precision or an AUROC over anything else means nothing).
/// `names` are the file's column names, in [`COLUMNS`] order.
fn check_scores(l: &LabelRow, names: &[String]) -> std::result::Result<(), String> {
    // A float rounding step past a bound is still a probability.
    const SLACK: f32 = 1e-6;
    let probs = [(l.clean_prob, &names[3]), (l.soft_label, &names[4])];
    for (v, name) in probs {
        if let Some(v) = v.filter(|v| !(-SLACK..=1.0 + SLACK).contains(v)) {
            return Err(format!(
                "column \"{name}\" is {v}, not a probability in [0, 1]"
            ));
        }
    }
    if let Some(v) = l.similarity.filter(|v| !v.is_finite()) {
        return Err(format!(
            "column \"{}\" is {v}, not a finite number",
            names[5]
        ));
    }
    if l.status == RowStatus::Ok && l.clean_prob.is_none() {
        return Err(format!(
            "the row is scored (status \"ok\") but column \"{}\" is null",
            names[3]
        ));
    }
    Ok(())
}

fn append_rows(
    path: &Path,
    batch: &RecordBatch,
    names: &[String],
    rows: &mut Vec<LabelRow>,
) -> Result<()> {
    // Kinds were checked against the schema; `names` follows COLUMNS.
    let cols: Vec<ArrayRef> = names
        .iter()
        .map(|n| column(path, batch, n))
        .collect::<Result<_>>()?;
    let [key, source_file, source_row, clean_prob, soft_label, similarity, is_clean, status, error] =
        &cols[..]
    else {
        return Err(anyhow::anyhow!("{}: labels columns vanished", path.display()).into());
    };
    let is_clean = is_clean.as_boolean();
    let null = |what: &str, row: usize| {
        invalid(format!(
            "{}: row {row}: column \"{what}\" is null; every label row needs one",
            path.display()
        ))
    };
    for i in 0..batch.num_rows() {
        let row = rows.len();
        let st = string_at(status.as_ref(), i).ok_or_else(|| null(&names[7], row))?;
        let status = RowStatus::parse(&st).ok_or_else(|| {
            invalid(format!(
                "{}: row {row}: status \"{st}\" is neither \"ok\" nor \"skipped\"",
                path.display(),
            ))
        })?;
        let source_row = integer_at(source_row.as_ref(), i)
            .and_then(|v| u64::try_from(v).ok())
            .ok_or_else(|| null(&names[2], row))?;
        let label = LabelRow {
            key: string_at(key.as_ref(), i).ok_or_else(|| null(&names[0], row))?,
            source_file: string_at(source_file.as_ref(), i).unwrap_or_default(),
            source_row,
            clean_prob: float_at(clean_prob.as_ref(), i),
            soft_label: float_at(soft_label.as_ref(), i),
            similarity: float_at(similarity.as_ref(), i),
            is_clean: !is_clean.is_null(i) && is_clean.value(i),
            status,
            error: string_at(error.as_ref(), i),
        };
        check_scores(&label, names).map_err(|e| {
            invalid(format!(
                "{}: row {row} (key \"{}\"): {e}; labels written by ncclean never hold that, \
                 so the file was edited or made by another tool",
                path.display(),
                label.key
            ))
        })?;
        rows.push(label);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<LabelRow> {
        vec![
            LabelRow {
                key: "a".into(),
                source_file: "data/x.parquet".into(),
                source_row: 0,
                clean_prob: Some(0.9),
                soft_label: Some(0.8),
                similarity: Some(0.5),
                is_clean: true,
                status: RowStatus::Ok,
                error: None,
            },
            LabelRow {
                key: "b".into(),
                source_file: "data/x.parquet".into(),
                source_row: 1,
                clean_prob: None,
                soft_label: None,
                similarity: None,
                is_clean: false,
                status: RowStatus::Skipped,
                error: Some("caption is empty".into()),
            },
        ]
    }

    #[test]
    fn round_trip_with_nulls_and_metadata() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("labels.parquet");
        let meta = BTreeMap::from([
            ("ncclean.version".to_string(), "0.1.0".to_string()),
            ("ncclean.seed".to_string(), "7".to_string()),
        ]);
        write_labels(&path, &sample(), &meta).unwrap();
        let (rows, back) = read_labels(&path).unwrap();
        assert_eq!(rows, sample());
        assert_eq!(back, meta);

        let file = File::open(&path).unwrap();
        let b = ParquetRecordBatchReaderBuilder::try_new(file).unwrap();
        let names: Vec<&str> = b
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect();
        assert_eq!(names, COLUMNS);
    }

    #[test]
    fn scores_outside_their_range_name_the_row_key_column_and_value() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("labels.parquet");
        let bad = |edit: fn(&mut LabelRow)| {
            let mut rows = sample();
            edit(&mut rows[0]);
            write_labels(&path, &rows, &BTreeMap::new()).unwrap();
            let e = read_labels(&path).unwrap_err();
            assert_eq!(e.exit_code(), 3);
            e.to_string()
        };
        let e = bad(|r| r.clean_prob = Some(1.5));
        assert!(
            e.contains("row 0 (key \"a\"): column \"ncclean_clean_prob\" is 1.5, not a probability in [0, 1]"),
            "{e}"
        );
        let e = bad(|r| r.soft_label = Some(f32::NAN));
        assert!(e.contains("\"ncclean_soft_label\" is NaN"), "{e}");
        let e = bad(|r| r.similarity = Some(f32::INFINITY));
        assert!(
            e.contains("\"ncclean_similarity\" is inf, not a finite number"),
            "{e}"
        );
        let e = bad(|r| r.clean_prob = None);
        assert!(
            e.contains("scored (status \"ok\") but column \"ncclean_clean_prob\" is null"),
            "{e}"
        );
        // The bounds themselves are fine, and so is a negative similarity.
        let mut rows = sample();
        rows[0].clean_prob = Some(1.0);
        rows[0].soft_label = Some(0.0);
        rows[0].similarity = Some(-1.0);
        write_labels(&path, &rows, &BTreeMap::new()).unwrap();
        assert_eq!(read_labels(&path).unwrap().0, rows);
    }

    #[test]
    fn status_serialises_lowercase() {
        assert_eq!(
            serde_json::to_string(&RowStatus::Skipped).unwrap(),
            "\"skipped\""
        );
        assert_eq!(RowStatus::Ok.as_str(), "ok");
    }

    #[test]
    fn not_a_labels_file_names_the_column() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("other.parquet");
        let schema = Arc::new(Schema::new(vec![Field::new("key", DataType::Utf8, false)]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(StringArray::from(vec!["a"])) as ArrayRef],
        )
        .unwrap();
        let mut w = AtomicParquetWriter::create(&path, schema, &BTreeMap::new()).unwrap();
        w.write(&batch).unwrap();
        w.finish().unwrap();
        let e = read_labels(&path).unwrap_err();
        assert_eq!(e.exit_code(), 3);
        assert!(
            e.to_string().contains(
                "column \"ncclean_source_file\" (or \"source_file\", the unprefixed name older files use) is missing"
            ),
            "{e}"
        );
    }

    #[test]
    fn a_column_of_another_kind_names_what_was_expected() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("labels.parquet");
        write_labels(&path, &sample(), &BTreeMap::new()).unwrap();
        let (batch, _) = {
            let b = ParquetRecordBatchReaderBuilder::try_new(File::open(&path).unwrap()).unwrap();
            let mut r = b.build().unwrap();
            (r.next().unwrap().unwrap(), ())
        };
        let mut fields: Vec<Field> = batch
            .schema()
            .fields()
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        let mut cols = batch.columns().to_vec();
        fields[7] = Field::new("ncclean_status", DataType::Int32, false);
        cols[7] = Arc::new(arrow_array::Int32Array::from(vec![0, 1]));
        let bad = RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).unwrap();
        let other = dir.path().join("other.parquet");
        let mut w = AtomicParquetWriter::create(&other, bad.schema(), &BTreeMap::new()).unwrap();
        w.write(&bad).unwrap();
        w.finish().unwrap();
        let e = read_labels(&other).unwrap_err();
        assert_eq!(e.exit_code(), 3);
        assert!(
            e.to_string()
                .contains("column \"ncclean_status\" has type Int32, expected a string"),
            "{e}"
        );
    }
}
