//! The filtered dataset: the user's own rows and columns, minus the ones
//! judged noisy or unusable.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use arrow_array::BooleanArray;

use super::write::AtomicParquetWriter;
use super::InputSet;
use crate::error::{invalid, Result};

/// Rows read per batch; small because rows may carry full images.
const BATCH_ROWS: usize = 1024;

/// How many rows went in and came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FilterSummary {
    /// Rows over all input files.
    pub rows_in: usize,
    /// Rows written.
    pub rows_out: usize,
}

/// Write the rows of `input` whose `keep[file][row]` is true, all original
/// columns and the schema unchanged (`metadata` added to the footer),
/// streaming batch by batch. Several input files go into one output file,
/// so their schemas must be equal (else [`crate::Error::InvalidInput`]).
pub fn write_filtered(
    input: &InputSet,
    keep: &[Vec<bool>],
    out: &Path,
    metadata: &BTreeMap<String, String>,
) -> Result<FilterSummary> {
    check_keep_shape(input, keep)?;
    check_same_schema(input)?;
    let schema = input.files[0].schema.clone();
    let mut writer = AtomicParquetWriter::create(out, schema, metadata)?;
    let mut rows_out = 0;
    for (f, keep) in keep.iter().enumerate() {
        let mut row = 0;
        for batch in input.record_batches(f, BATCH_ROWS)? {
            let batch = batch?;
            crate::interrupt::check()?;
            let n = batch.num_rows();
            let mask = keep.get(row..row + n).ok_or_else(|| {
                anyhow::anyhow!(
                    "{} has more rows than its footer says",
                    input.display_name(f)
                )
            })?;
            row += n;
            let selected = mask.iter().filter(|&&k| k).count();
            if selected == 0 {
                continue;
            }
            let batch = if selected == n {
                batch
            } else {
                let predicate = BooleanArray::from(mask.to_vec());
                arrow_select::filter::filter_record_batch(&batch, &predicate)
                    .with_context(|| format!("filtering {}", input.display_name(f)))?
            };
            rows_out += batch.num_rows();
            writer.write(&batch)?;
        }
    }
    writer.finish()?;
    Ok(FilterSummary {
        rows_in: input.num_rows(),
        rows_out,
    })
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
/// (the first file's is kept).
pub(crate) fn check_same_schema(input: &InputSet) -> Result<()> {
    let first = &input.files[0];
    for f in &input.files[1..] {
        if f.schema.fields() != first.schema.fields() {
            return Err(invalid(format!(
                "{}: schema differs from {} ({:?} vs {:?}); files written into one output must have identical columns and types",
                f.path.display(),
                first.path.display(),
                field_summary(&f.schema),
                field_summary(&first.schema),
            )));
        }
    }
    Ok(())
}

fn field_summary(schema: &arrow_schema::Schema) -> Vec<String> {
    schema
        .fields()
        .iter()
        .map(|f| format!("{}: {}", f.name(), f.data_type()))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::fs::File;

    use arrow_array::{Array, RecordBatch};
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
                rows_out: 3
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
        assert!(e.to_string().contains("b.parquet: schema differs"), "{e}");
        assert!(!out.exists());
    }
}
