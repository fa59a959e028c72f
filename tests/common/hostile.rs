//! Damaged parquet files for tests, made on the fly from valid ones: a
//! corrupt data page in one column chunk, invalid UTF-8 in string values.
//! Nothing hostile is committed.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;
use parquet::file::reader::{FileReader, SerializedFileReader};

/// Invalid UTF-8 of the same length as [`MARKER`].
pub const INVALID: &[u8] = b"\xC3\x28\xFF\xFE\x80";
/// What [`rewrite`]'s `edit` writes where [`INVALID`] is wanted: replace it
/// with `replace_bytes(path, MARKER, INVALID)` once the file is written.
pub const MARKER: &str = "~BAD~";

/// Copy `src` to `dst` in row groups of `group_rows` rows, without
/// dictionaries or compression (so values sit as plain bytes in the data
/// pages), with a `url` string column added when `with_url`
/// (`https://example.org/<row>`), and each string of column `column` in row
/// `row` replaced by `edit(column, row, value)`.
pub fn rewrite(
    src: &Path,
    dst: &Path,
    group_rows: usize,
    with_url: bool,
    edit: impl Fn(&str, usize, &str) -> String,
) {
    let reader = ParquetRecordBatchReaderBuilder::try_new(File::open(src).unwrap())
        .unwrap()
        .build()
        .unwrap();
    let batches: Vec<RecordBatch> = reader.map(|b| b.unwrap()).collect();
    let mut batch = arrow_select::concat::concat_batches(&batches[0].schema(), &batches).unwrap();
    if with_url {
        let urls: Vec<String> = (0..batch.num_rows())
            .map(|i| format!("https://example.org/{i:04}"))
            .collect();
        let mut fields: Vec<Field> = batch
            .schema()
            .fields()
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        fields.push(Field::new("url", DataType::Utf8, true));
        let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
        columns.push(Arc::new(StringArray::from(urls)));
        batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap();
    }
    let columns: Vec<ArrayRef> = batch
        .schema()
        .fields()
        .iter()
        .zip(batch.columns())
        .map(|(f, a)| match a.as_any().downcast_ref::<StringArray>() {
            Some(s) => Arc::new(StringArray::from_iter(
                s.iter()
                    .enumerate()
                    .map(|(i, v)| v.map(|v| edit(f.name(), i, v))),
            )) as ArrayRef,
            None => a.clone(),
        })
        .collect();
    let batch = RecordBatch::try_new(batch.schema(), columns).unwrap();
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(group_rows))
        .set_dictionary_enabled(false)
        .build();
    let mut w =
        ArrowWriter::try_new(File::create(dst).unwrap(), batch.schema(), Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

/// Overwrite the header of the first data page of `column` in row group
/// `group` with 0xFF bytes: the page can no longer be decoded, the footer
/// and every other column chunk stay intact.
pub fn corrupt_page(path: &Path, group: usize, column: &str) {
    let reader = SerializedFileReader::new(File::open(path).unwrap()).unwrap();
    let rg = reader.metadata().row_group(group);
    let chunk = rg
        .columns()
        .iter()
        .find(|c| c.column_path().string() == column)
        .unwrap_or_else(|| panic!("no column {column}"));
    let offset = chunk.data_page_offset() as usize;
    let len = (chunk.compressed_size() as usize).min(16);
    let mut bytes = std::fs::read(path).unwrap();
    bytes[offset..offset + len].fill(0xFF);
    std::fs::write(path, bytes).unwrap();
}

/// Replace every occurrence of `marker` in the file's bytes with `with` (of
/// the same length); returns how many were replaced. Strings written with a
/// marker become invalid UTF-8 this way, everything else stays as written.
pub fn replace_bytes(path: &Path, marker: &[u8], with: &[u8]) -> usize {
    assert_eq!(marker.len(), with.len());
    let mut bytes = std::fs::read(path).unwrap();
    let mut n = 0;
    let mut i = 0;
    while i + marker.len() <= bytes.len() {
        if &bytes[i..i + marker.len()] == marker {
            bytes[i..i + marker.len()].copy_from_slice(with);
            n += 1;
            i += marker.len();
        } else {
            i += 1;
        }
    }
    std::fs::write(path, bytes).unwrap();
    n
}
