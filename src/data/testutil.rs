//! Small parquet files for tests, written with plain `ArrowWriter` so the
//! readers are not tested against our own writer only.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::builder::{BinaryBuilder, Float32Builder, ListBuilder, StringBuilder};
use arrow_array::{Array, ArrayRef, RecordBatch, StructArray};
use arrow_schema::{Field, Schema};
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;

/// Write `columns` (all nullable) to `dir/name`, in row groups of 2 rows so
/// streaming crosses row-group boundaries.
pub(crate) fn write_parquet(dir: &Path, name: &str, columns: Vec<(&str, ArrayRef)>) -> PathBuf {
    let fields: Vec<Field> = columns
        .iter()
        .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
        .collect();
    let schema = Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new(schema.clone(), columns.into_iter().map(|c| c.1).collect())
        .expect("test batch");
    let path = dir.join(name);
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(2))
        .build();
    let mut w = ArrowWriter::try_new(File::create(&path).expect("create"), schema, Some(props))
        .expect("writer");
    w.write(&batch).expect("write");
    w.close().expect("close");
    path
}

pub(crate) fn strings(v: &[Option<&str>]) -> ArrayRef {
    let mut b = StringBuilder::new();
    for s in v {
        b.append_option(*s);
    }
    Arc::new(b.finish())
}

pub(crate) fn binaries(v: &[Option<&[u8]>]) -> ArrayRef {
    let mut b = BinaryBuilder::new();
    for s in v {
        b.append_option(*s);
    }
    Arc::new(b.finish())
}

pub(crate) fn float_lists(v: &[Option<Vec<f32>>]) -> ArrayRef {
    let mut b = ListBuilder::new(Float32Builder::new());
    for row in v {
        match row {
            Some(xs) => {
                for &x in xs {
                    b.values().append_value(x);
                }
                b.append(true);
            }
            None => b.append(false),
        }
    }
    Arc::new(b.finish())
}

/// A Hugging Face `Image` column: `{bytes: binary, path: string}`.
pub(crate) fn hf_images(bytes: &[Option<&[u8]>], paths: &[Option<&str>]) -> ArrayRef {
    let b = binaries(bytes);
    let p = strings(paths);
    let s = StructArray::from(vec![
        (
            Arc::new(Field::new("bytes", b.data_type().clone(), true)),
            b,
        ),
        (Arc::new(Field::new("path", p.data_type().clone(), true)), p),
    ]);
    Arc::new(s)
}

/// The damaged-parquet helpers the integration tests use (one copy for
/// both: `tests/common/hostile.rs`).
#[allow(dead_code)]
#[path = "../../tests/common/hostile.rs"]
mod hostile;
pub(crate) use hostile::corrupt_page;

/// An input set of files `data/train.parquet`, `data/part-1.parquet`, … with
/// `rows[i]` rows each, for tests that need names and row counts only.
pub(crate) fn test_input(rows: &[usize]) -> crate::data::InputSet {
    use crate::data::{ColumnMap, ImageKind, InputFile};
    let files = rows
        .iter()
        .enumerate()
        .map(|(i, &n)| InputFile {
            path: if i == 0 {
                "data/train.parquet".into()
            } else {
                format!("data/part-{i}.parquet").into()
            },
            num_rows: n,
            schema: std::sync::Arc::new(arrow_schema::Schema::empty()),
            format: crate::data::FileFormat::Parquet,
        })
        .collect();
    crate::data::InputSet {
        files,
        columns: ColumnMap {
            image: "image".into(),
            image_kind: ImageKind::Bytes,
            caption: "caption".into(),
            key: None,
            text_embedding: None,
        },
        image_root: None,
        image_limits: Default::default(),
        embedding_dim: None,
        text_embedding_dim: None,
        fingerprint: Default::default(),
    }
}
