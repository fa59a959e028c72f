//! Synthetic noisy correspondence with ground truth (METHODS.md §6, the NCR
//! convention): a chosen fraction of pairs get their images permuted among
//! themselves, and a `noisy` column records which pairs no longer point at
//! their own image.
//!
//! The whole table is held in memory: this is a benchmark tool for datasets
//! that a method is then trained on, and a global permutation needs random
//! access to every row anyway.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use arrow_array::{ArrayRef, BooleanArray, RecordBatch, UInt64Array};
use arrow_schema::{DataType, Field, Schema};
use ncclean_models::rng::Rng;

use crate::data::{check_same_schema, image_columns, AtomicParquetWriter, InputSet};
use crate::error::{invalid, Error, Result};

/// Name of the ground-truth column added to the output.
pub const NOISY_COLUMN: &str = "noisy";

/// Rows read and written per batch; the table is assembled in memory anyway,
/// this only keeps row groups a reasonable size.
const BATCH_ROWS: usize = 8192;

/// What `corrupt` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CorruptSummary {
    /// Rows written.
    pub rows: usize,
    /// Rows whose image now comes from another row (`noisy = true`).
    pub noisy: usize,
    /// Positions chosen for permutation, ⌊rate·N⌋; at least `noisy`, since a
    /// chosen position may draw its own image back.
    pub chosen: usize,
}

/// ⌊rate·N⌋; the epsilon keeps 0.29·100 at 29 despite binary floating point.
fn chosen_count(n: usize, rate: f64) -> usize {
    (((rate * n as f64) + 1e-9).floor() as usize).min(n)
}

/// `perm[i]` is the row whose image row `i` gets. ⌊rate·N⌋ positions are
/// chosen at random (stream `Rng::derive(seed, "corrupt")`) and their images
/// shuffled among themselves, exactly as NCR does, so a chosen position may
/// keep its own image; every other position maps to itself. `rate` is
/// clamped to [0, 1].
pub fn noise_permutation(n: usize, rate: f64, seed: u64) -> Vec<usize> {
    let rate = if rate.is_nan() {
        0.0
    } else {
        rate.clamp(0.0, 1.0)
    };
    let k = chosen_count(n, rate);
    let mut rng = Rng::derive(seed, "corrupt");
    let order = rng.permutation(n);
    let chosen = &order[..k];
    let mut sources = chosen.to_vec();
    rng.shuffle(&mut sources);
    let mut perm: Vec<usize> = (0..n).collect();
    for (&target, &source) in chosen.iter().zip(&sources) {
        perm[target] = source;
    }
    perm
}

/// Write `input` as one parquet file at `out` with synthetic noise: the image
/// column — and every other column that belongs to the image (other image
/// or embedding columns, `url`, `width`, `height`, `sha256`...; see
/// [`crate::data::image_columns`]) — is permuted by [`noise_permutation`];
/// captions, keys and all other columns stay. A boolean `noisy` column marks
/// rows whose image now comes from another row.
///
/// Footer metadata: `ncclean.corrupt.rate`, `ncclean.corrupt.seed`,
/// `ncclean.corrupt.permutation` (JSON `[[target_row, source_row], ...]` for
/// the changed rows, global row indices), `ncclean.corrupt.image_columns`
/// and `ncclean.version`.
///
/// An input that already has a `noisy` column is refused rather than
/// overwritten, since its ground truth would be silently lost. `rate`
/// outside [0, 1] is [`Error::Usage`].
pub fn corrupt(input: &InputSet, rate: f64, seed: u64, out: &Path) -> Result<CorruptSummary> {
    if !(0.0..=1.0).contains(&rate) {
        return Err(Error::Usage(format!(
            "--rate {rate} is outside [0, 1]; it is the fraction of pairs to corrupt"
        )));
    }
    for f in &input.files {
        if f.schema.field_with_name(NOISY_COLUMN).is_ok() {
            return Err(invalid(format!(
                "{}: already has a \"{NOISY_COLUMN}\" column (was it corrupted before?); \
                 drop that column first, or corrupt the original data",
                f.path.display()
            )));
        }
    }
    check_same_schema(input)?;

    let schema = input.files[0].schema.clone();
    let table = read_all(input)?;
    let n = table.num_rows();
    let perm = noise_permutation(n, rate, seed);
    let moved = image_columns(&schema, &input.columns);

    let indices = UInt64Array::from_iter_values(perm.iter().map(|&s| s as u64));
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len() + 1);
    for (field, column) in schema.fields().iter().zip(table.columns()) {
        if moved.contains(field.name()) {
            let taken = arrow_select::take::take(column.as_ref(), &indices, None)
                .with_context(|| format!("permuting column {}", field.name()))?;
            columns.push(taken);
        } else {
            columns.push(column.clone());
        }
    }
    let noisy: BooleanArray = perm
        .iter()
        .enumerate()
        .map(|(i, &s)| Some(i != s))
        .collect();
    let noisy_count = noisy.true_count();
    columns.push(Arc::new(noisy));

    let mut fields: Vec<Arc<Field>> = schema.fields().iter().cloned().collect();
    fields.push(Arc::new(Field::new(NOISY_COLUMN, DataType::Boolean, false)));
    let out_schema = Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()));
    let batch = RecordBatch::try_new(out_schema.clone(), columns)
        .context("assembling the corrupted table")?;

    let changed: Vec<[usize; 2]> = perm
        .iter()
        .enumerate()
        .filter(|(i, s)| i != *s)
        .map(|(i, &s)| [i, s])
        .collect();
    let metadata = BTreeMap::from([
        ("ncclean.corrupt.rate".to_string(), rate.to_string()),
        ("ncclean.corrupt.seed".to_string(), seed.to_string()),
        (
            "ncclean.corrupt.permutation".to_string(),
            serde_json::to_string(&changed).context("encoding the permutation")?,
        ),
        (
            "ncclean.corrupt.image_columns".to_string(),
            serde_json::to_string(&moved).context("encoding the image columns")?,
        ),
        (
            "ncclean.version".to_string(),
            env!("CARGO_PKG_VERSION").to_string(),
        ),
    ]);

    let mut writer = AtomicParquetWriter::create(out, out_schema, &metadata)?;
    let mut start = 0;
    while start < n {
        let len = BATCH_ROWS.min(n - start);
        writer.write(&batch.slice(start, len))?;
        start += len;
    }
    writer.finish()?;
    Ok(CorruptSummary {
        rows: n,
        noisy: noisy_count,
        chosen: chosen_count(n, rate),
    })
}

/// Every row of every file as one batch, in input order.
fn read_all(input: &InputSet) -> Result<RecordBatch> {
    let schema = input.files[0].schema.clone();
    let mut batches = Vec::new();
    for f in 0..input.files.len() {
        for b in input.record_batches(f, BATCH_ROWS)? {
            // Shards may differ in schema-level metadata only; re-tag them.
            let b = b?;
            let b = RecordBatch::try_new(schema.clone(), b.columns().to_vec())
                .with_context(|| format!("reading {}", input.display_name(f)))?;
            batches.push(b);
        }
    }
    Ok(arrow_select::concat::concat_batches(&schema, &batches)
        .context("concatenating the input files")?)
}

#[cfg(test)]
mod tests {
    use std::fs::File;

    use arrow_array::cast::AsArray;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    use super::*;
    use crate::data::testutil::{binaries, strings, write_parquet};
    use crate::data::ColumnOptions;

    #[test]
    fn permutation_moves_exactly_the_chosen_positions() {
        for (n, rate) in [
            (100, 0.2),
            (100, 0.29),
            (7, 0.5),
            (10, 1.0),
            (10, 0.0),
            (0, 0.5),
        ] {
            let p = noise_permutation(n, rate, 42);
            assert_eq!(p, noise_permutation(n, rate, 42), "deterministic");
            let mut sorted = p.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "a permutation");
            let moved = p.iter().enumerate().filter(|(i, s)| i != *s).count();
            assert!(moved <= chosen_count(n, rate));
            // Sources of moved rows are themselves moved rows: the chosen
            // set is closed under the permutation.
            assert!(p.iter().enumerate().all(|(i, &s)| s == i || p[s] != s));
        }
        assert_eq!(chosen_count(100, 0.29), 29);
        assert_eq!(chosen_count(7, 0.5), 3);
        assert_ne!(
            noise_permutation(100, 0.5, 1),
            noise_permutation(100, 0.5, 2)
        );
        // With many chosen positions, nearly all of them actually move.
        let p = noise_permutation(1000, 0.4, 3);
        let moved = p.iter().enumerate().filter(|(i, s)| i != *s).count();
        assert!((390..=400).contains(&moved), "{moved}");
    }

    fn input(dir: &Path, n: usize) -> InputSet {
        let mut paths = Vec::new();
        for (f, range) in [(0, 0..n / 2), (1, n / 2..n)] {
            let caps: Vec<String> = range.clone().map(|i| format!("cap{i}")).collect();
            let imgs: Vec<String> = range.clone().map(|i| format!("img{i}")).collect();
            let urls: Vec<String> = range.map(|i| format!("http://x/{i}")).collect();
            let c: Vec<Option<&str>> = caps.iter().map(|s| Some(s.as_str())).collect();
            let i: Vec<Option<&[u8]>> = imgs.iter().map(|s| Some(s.as_bytes())).collect();
            let u: Vec<Option<&str>> = urls.iter().map(|s| Some(s.as_str())).collect();
            paths.push(write_parquet(
                dir,
                &format!("s{f}.parquet"),
                vec![
                    ("key", strings(&c)),
                    ("jpg", binaries(&i)),
                    ("caption", strings(&c)),
                    ("url", strings(&u)),
                ],
            ));
        }
        InputSet::open(&paths, &ColumnOptions::default()).unwrap()
    }

    #[test]
    fn corrupt_permutes_images_and_records_ground_truth() {
        let dir = tempfile::tempdir().unwrap();
        let n = 40;
        let set = input(dir.path(), n);
        let out = dir.path().join("noisy.parquet");
        let s = corrupt(&set, 0.5, 9, &out).unwrap();
        let perm = noise_permutation(n, 0.5, 9);
        let moved = perm.iter().enumerate().filter(|(i, s)| i != *s).count();
        assert_eq!(
            s,
            CorruptSummary {
                rows: n,
                noisy: moved,
                chosen: 20
            }
        );
        assert!(moved > 10);

        let b = ParquetRecordBatchReaderBuilder::try_new(File::open(&out).unwrap()).unwrap();
        let kv: BTreeMap<String, String> = b
            .metadata()
            .file_metadata()
            .key_value_metadata()
            .unwrap()
            .iter()
            .map(|k| (k.key.clone(), k.value.clone().unwrap_or_default()))
            .collect();
        assert_eq!(kv["ncclean.corrupt.rate"], "0.5");
        assert_eq!(kv["ncclean.corrupt.seed"], "9");
        assert!(kv.contains_key("ncclean.version"));
        let pairs: Vec<[usize; 2]> =
            serde_json::from_str(&kv["ncclean.corrupt.permutation"]).unwrap();
        assert_eq!(pairs.len(), moved);
        assert!(pairs.iter().all(|&[t, s]| perm[t] == s && t != s));
        assert_eq!(kv["ncclean.corrupt.image_columns"], r#"["jpg","url"]"#);

        let schema = b.schema().clone();
        let batches: Vec<RecordBatch> = b.build().unwrap().map(|b| b.unwrap()).collect();
        let t = arrow_select::concat::concat_batches(&schema, &batches).unwrap();
        assert_eq!(t.num_rows(), n);
        let caps = t
            .column_by_name("caption")
            .unwrap()
            .as_string::<i32>()
            .clone();
        let keys = t.column_by_name("key").unwrap().as_string::<i32>().clone();
        let imgs = t.column_by_name("jpg").unwrap().as_binary::<i32>().clone();
        let urls = t.column_by_name("url").unwrap().as_string::<i32>().clone();
        let noisy = t.column_by_name("noisy").unwrap().as_boolean().clone();
        for (i, &src) in perm.iter().enumerate() {
            assert_eq!(caps.value(i), format!("cap{i}"));
            assert_eq!(keys.value(i), format!("cap{i}"));
            assert_eq!(imgs.value(i), format!("img{src}").as_bytes());
            assert_eq!(urls.value(i), format!("http://x/{src}"));
            assert_eq!(noisy.value(i), src != i);
        }

        let again = InputSet::open(std::slice::from_ref(&out), &ColumnOptions::default()).unwrap();
        let e = corrupt(&again, 0.2, 1, &dir.path().join("twice.parquet")).unwrap_err();
        assert_eq!(e.exit_code(), 3);
        assert!(
            e.to_string().contains("already has a \"noisy\" column"),
            "{e}"
        );
    }

    #[test]
    fn rate_outside_unit_interval_is_usage_error() {
        let dir = tempfile::tempdir().unwrap();
        let set = input(dir.path(), 4);
        for rate in [-0.1, 1.5, f64::NAN] {
            let e = corrupt(&set, rate, 0, &dir.path().join("o.parquet")).unwrap_err();
            assert_eq!(e.exit_code(), 2);
        }
    }
}
