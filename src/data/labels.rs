//! `labels.parquet`: one row per input pair with its clean probability and
//! decision (see DESIGN.md, "Data contracts").

use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, UInt64Type};
use arrow_array::{
    Array, ArrayRef, BooleanArray, Float32Array, RecordBatch, StringArray, UInt64Array,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

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

const COLUMNS: [&str; 9] = [
    "key",
    "source_file",
    "source_row",
    "clean_prob",
    "soft_label",
    "similarity",
    "is_clean",
    "status",
    "error",
];

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

/// Write `labels.parquet` (columns in this order: key, source_file,
/// source_row, clean_prob, soft_label, similarity, is_clean, status, error;
/// the floats are null for skipped rows) with key–value metadata,
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

    /// Add `metadata`, write the footer and rename into place.
    pub fn finish(mut self, metadata: &BTreeMap<String, String>) -> Result<()> {
        self.writer.append_metadata(metadata)?;
        self.writer.finish()
    }
}

/// Read a labels file back with its key–value metadata. A file that lacks a
/// labels column, or has it with another type, is
/// [`crate::Error::InvalidInput`] naming the column.
pub fn read_labels(path: &Path) -> Result<(Vec<LabelRow>, BTreeMap<String, String>)> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
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
    let expected = labels_schema();
    for want in expected.fields() {
        let found = builder.schema().field_with_name(want.name()).map_err(|_| {
            invalid(format!(
                "{}: not a labels file: column \"{}\" is missing",
                path.display(),
                want.name()
            ))
        })?;
        if found.data_type() != want.data_type() {
            return Err(invalid(format!(
                "{}: not a labels file: column \"{}\" has type {}, expected {}",
                path.display(),
                want.name(),
                found.data_type(),
                want.data_type()
            )));
        }
    }
    let reader = builder
        .build()
        .with_context(|| format!("reading {}", path.display()))?;
    let mut rows = Vec::new();
    for batch in reader {
        let batch = batch.with_context(|| format!("reading {}", path.display()))?;
        append_rows(path, &batch, &mut rows)?;
    }
    Ok((rows, metadata))
}

fn append_rows(path: &Path, batch: &RecordBatch, rows: &mut Vec<LabelRow>) -> Result<()> {
    // Types were checked against the schema, so these casts cannot fail.
    let col = |name: &str| -> Result<&ArrayRef> {
        Ok(batch
            .column_by_name(name)
            .ok_or_else(|| anyhow::anyhow!("{}: column {name} vanished", path.display()))?)
    };
    let key = col("key")?.as_string::<i32>();
    let source_file = col("source_file")?.as_string::<i32>();
    let source_row = col("source_row")?.as_primitive::<UInt64Type>();
    let clean_prob = col("clean_prob")?.as_primitive::<Float32Type>();
    let soft_label = col("soft_label")?.as_primitive::<Float32Type>();
    let similarity = col("similarity")?.as_primitive::<Float32Type>();
    let is_clean = col("is_clean")?.as_boolean();
    let status = col("status")?.as_string::<i32>();
    let error = col("error")?.as_string::<i32>();
    let opt = |a: &arrow_array::Float32Array, i: usize| (!a.is_null(i)).then(|| a.value(i));
    for i in 0..batch.num_rows() {
        let st = status.value(i);
        let status = RowStatus::parse(st).ok_or_else(|| {
            invalid(format!(
                "{}: row {}: status \"{st}\" is neither \"ok\" nor \"skipped\"",
                path.display(),
                rows.len()
            ))
        })?;
        rows.push(LabelRow {
            key: key.value(i).to_owned(),
            source_file: source_file.value(i).to_owned(),
            source_row: source_row.value(i),
            clean_prob: opt(clean_prob, i),
            soft_label: opt(soft_label, i),
            similarity: opt(similarity, i),
            is_clean: is_clean.value(i),
            status,
            error: (!error.is_null(i)).then(|| error.value(i).to_owned()),
        });
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
            e.to_string().contains("column \"source_file\" is missing"),
            "{e}"
        );
    }
}
