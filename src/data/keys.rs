//! The keys of an input's rows, read on their own: labels are joined back
//! to the data by them (`ncclean filter`), and duplicates are found before
//! any work (`fit`, `inspect`).

use std::path::Path;
use std::sync::Arc;

use super::read::{restore_batch, FileReader, Piece};
use super::rows::key_at;
use super::webdataset::PairBatches;
use super::{FileFormat, InputSet};
use crate::error::Result;

/// Rows of keys read at a time: keys only, so batches can be large.
const KEY_BATCH_ROWS: usize = 8192;

/// The key `score` gives a row that has none of its own (no key column, a
/// null or unreadable key): `<file stem>:<row>`. Such a key names a
/// position, not a sample, so it only matches the same bytes.
pub fn positional_key(path: &Path, row: usize) -> String {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    format!("{stem}:{row}")
}

/// Call `f(first_row, keys)` for the rows of file `file` in order, a batch
/// at a time; a key is `None` where the row has no key of its own (see
/// [`positional_key`]). Parquet files are read in the key column alone;
/// a tar shard is read sample by sample (its members pass through memory
/// a batch at a time, as in `score`). Keys the reader cannot decode (a
/// damaged row group, invalid UTF-8) come out as `None`, as `score` labels
/// those rows.
pub fn for_each_key(
    input: &InputSet,
    file: usize,
    mut f: impl FnMut(usize, Vec<Option<String>>) -> Result<()>,
) -> Result<()> {
    let Some(info) = input.files.get(file) else {
        return Err(anyhow::anyhow!("input file index {file} out of range").into());
    };
    if let FileFormat::Webdataset(layout) = &info.format {
        let mut batches = PairBatches::open(input, file, layout)?;
        let mut first = 0;
        while let Some(rows) = batches.next_batch(super::READ_BATCH_ROWS)? {
            let n = rows.len();
            f(first, rows.into_iter().map(|r| Some(r.key)).collect())?;
            first += n;
        }
        return Ok(());
    }
    let Some(key) = &input.columns.key else {
        let mut first = 0;
        while first < info.num_rows {
            let n = KEY_BATCH_ROWS.min(info.num_rows - first);
            f(first, vec![None; n])?;
            first += n;
        }
        return Ok(());
    };
    let reader = Arc::new(FileReader::open(&info.path)?);
    for piece in reader.stream(Some(&[key.as_str()]), KEY_BATCH_ROWS, true) {
        crate::runtime::interrupt::check()?;
        match piece {
            Piece::Rows { batch, first_row } => {
                let restored = restore_batch(&batch, reader.schema())
                    .map_err(|e| anyhow::anyhow!("reading {}: {e}", info.path.display()))?;
                let column = super::rows::plain(restored.batch.column(0))?;
                let bad = restored.bad.unwrap_or_default();
                let keys = (0..batch.num_rows())
                    .map(|i| {
                        if bad.get(i).copied().unwrap_or(false) {
                            None
                        } else {
                            key_at(column.as_ref(), i)
                        }
                    })
                    .collect();
                f(first_row, keys)?;
            }
            Piece::Damaged(d) => f(d.first_row, vec![None; d.rows])?,
        }
    }
    Ok(())
}

/// Keys that more than one row has.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct DuplicateKeys {
    /// Rows in all.
    pub rows: usize,
    /// Distinct keys among them.
    pub distinct: usize,
    /// Rows whose key an earlier row already had.
    pub repeats: usize,
    /// Some repeated keys, for messages.
    pub examples: Vec<String>,
}

impl DuplicateKeys {
    /// Count the repeats among `keys` (memory: one reference per distinct
    /// key).
    pub fn of<'a>(keys: impl IntoIterator<Item = &'a str>) -> DuplicateKeys {
        let mut seen: std::collections::HashSet<&str> = std::collections::HashSet::new();
        let mut d = DuplicateKeys::default();
        for k in keys {
            d.rows += 1;
            if !seen.insert(k) {
                d.repeats += 1;
                if d.examples.len() < 5 && !d.examples.iter().any(|e| e == k) {
                    d.examples.push(k.to_string());
                }
            }
        }
        d.distinct = seen.len();
        d
    }

    /// `1000 rows have only 100 distinct keys (e.g. "a", "b")`.
    pub fn sentence(&self) -> String {
        format!(
            "{} rows have only {} distinct keys (e.g. {})",
            self.rows,
            self.distinct,
            self.examples
                .iter()
                .map(|k| format!("\"{k}\""))
                .collect::<Vec<_>>()
                .join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::testutil::{binaries, strings, write_parquet};
    use crate::data::ColumnOptions;

    fn collect(input: &InputSet, file: usize) -> Vec<Option<String>> {
        let mut out = Vec::new();
        for_each_key(input, file, |first, keys| {
            assert_eq!(first, out.len());
            out.extend(keys);
            Ok(())
        })
        .unwrap();
        out
    }

    #[test]
    fn duplicates_are_counted_once_per_repeat() {
        let keys: Vec<String> = (0..1000).map(|i| format!("k{}", i % 100)).collect();
        let d = DuplicateKeys::of(keys.iter().map(String::as_str));
        assert_eq!((d.rows, d.distinct, d.repeats), (1000, 100, 900));
        assert_eq!(d.examples, ["k0", "k1", "k2", "k3", "k4"]);
        assert!(d
            .sentence()
            .starts_with("1000 rows have only 100 distinct keys (e.g. \"k0\""));
        let none = DuplicateKeys::of(["a", "b"]);
        assert_eq!((none.repeats, none.distinct), (0, 2));
    }

    #[test]
    fn string_keys_in_order_nulls_as_none() {
        let dir = tempfile::tempdir().unwrap();
        let p = write_parquet(
            dir.path(),
            "x.parquet",
            vec![
                ("jpg", binaries(&[Some(b"a"), Some(b"b"), Some(b"c")])),
                ("caption", strings(&[Some("a"), Some("b"), Some("c")])),
                ("key", strings(&[Some("k0"), None, Some("k2")])),
            ],
        );
        let set = InputSet::open(&[p], &ColumnOptions::default()).unwrap();
        assert_eq!(
            collect(&set, 0),
            vec![Some("k0".to_string()), None, Some("k2".to_string())]
        );
    }

    #[test]
    fn integer_keys_in_decimal_and_no_key_column_positional() {
        let dir = tempfile::tempdir().unwrap();
        let p = write_parquet(
            dir.path(),
            "x.parquet",
            vec![
                ("jpg", binaries(&[Some(b"a"), Some(b"b")])),
                ("caption", strings(&[Some("a"), Some("b")])),
                (
                    "uid",
                    std::sync::Arc::new(arrow_array::Int64Array::from(vec![-7, 12])),
                ),
            ],
        );
        let set = InputSet::open(std::slice::from_ref(&p), &ColumnOptions::default()).unwrap();
        assert_eq!(
            collect(&set, 0),
            vec![Some("-7".to_string()), Some("12".to_string())]
        );
        let q = write_parquet(
            dir.path(),
            "y.parquet",
            vec![
                ("jpg", binaries(&[Some(b"a")])),
                ("caption", strings(&[Some("a")])),
            ],
        );
        let set = InputSet::open(std::slice::from_ref(&q), &ColumnOptions::default()).unwrap();
        assert_eq!(collect(&set, 0), vec![None]);
        assert_eq!(positional_key(&q, 3), "y:3");
    }
}
