//! `filter --engine polars`: the filtered rows moved by one polars lazy
//! query (parquet scan, key join, streaming parquet sink) instead of the
//! arrow-rs writer.
//!
//! The labels are read, resolved to a rule and joined to the data's keys by
//! [`super::LabelIndex::join`] first, so both engines refuse the same inputs
//! with the same messages (duplicate, missing or unlabelled keys) and agree
//! on every decision; polars then moves the rows. It joins on the key
//! column, so every row must carry its own key: rows matched by position
//! (`<file stem>:<row>`) and tar shards are left to the default engine,
//! which also reads around damaged row groups where polars stops.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use polars::prelude::*;

use super::Joined;
use crate::data::{FileFormat, FilterSummary, InputSet, LabelRow};
use crate::error::{Error, Result};

/// The join key while the query runs (the key column cast to a string, so
/// integer, large-string and dictionary keys join like the labels' strings).
const JOIN_KEY: &str = "__ncclean_join_key";

/// Rows per row group of the output. Polars bounds row groups by rows
/// only; at ~100 KB an image this is ~100 MB a group, the arrow-rs
/// writer's byte bound.
const ROW_GROUP_ROWS: usize = 1024;

/// What the polars engine writes.
pub struct PolarsFilter<'a> {
    /// The input, validated and joined already.
    pub input: &'a InputSet,
    /// Every label read.
    pub labels: &'a [LabelRow],
    /// The rule's decision for each label (parallel to `labels`).
    pub keep_label: &'a [bool],
    /// The native join of `labels` to `input`'s rows.
    pub joined: &'a Joined,
    /// Write every row with `ncclean_keep`, `ncclean_status` and
    /// `ncclean_error` (`--all-rows`) instead of the kept rows.
    pub all_rows: bool,
}

impl PolarsFilter<'_> {
    /// Write the output to `out` (through a temporary renamed into place)
    /// with `meta` as the parquet file's key-value metadata.
    pub fn write(&self, out: &Path, meta: &BTreeMap<String, String>) -> Result<FilterSummary> {
        let key = self.check_supported()?;
        // The same refusal, in the same words, as the default engine.
        crate::data::check_same_schema(self.input)?;
        let rows_in: usize = self.input.files.iter().map(|f| f.num_rows).sum();
        let expected = if self.all_rows {
            rows_in
        } else {
            self.joined.keep.iter().flatten().filter(|k| **k).count()
        };
        let pending = crate::runtime::temp::Pending::new(out)?;
        self.query(key)
            .and_then(|q| sink(q, pending.tmp_path(), meta))
            .map_err(|e| polars_error(self.input, &e))?;
        let written = parquet_rows(pending.tmp_path())?;
        if written != expected {
            return Err(Error::Other(anyhow::anyhow!(
                "polars wrote {written} rows where the join keeps {expected}; {} was not written. \
                 Run the filter again with the default engine (--engine native) and report this",
                out.display()
            )));
        }
        pending.commit()?;
        Ok(FilterSummary {
            rows_in,
            rows_out: written,
            dropped: 0,
        })
    }

    /// The key column, when this input can be joined by polars; otherwise
    /// why not and what to use instead.
    fn check_supported(&self) -> Result<&str> {
        let native = "use the default engine (leave out --engine polars)";
        if let Some(f) = self
            .input
            .files
            .iter()
            .find(|f| f.format != FileFormat::Parquet)
        {
            return Err(Error::Usage(format!(
                "{}: --engine polars reads parquet shards only, this is a tar shard; {native}",
                f.path.display()
            )));
        }
        let Some(key) = self.input.columns.key.as_deref() else {
            return Err(Error::Usage(format!(
                "--engine polars joins on a key column and this input has none (its rows are keyed <file stem>:<row>); \
                 name one with --key-col, or {native}"
            )));
        };
        if self.joined.positional > 0 {
            return Err(Error::Usage(format!(
                "{} rows have a null key in column \"{key}\" and were matched by position; \
                 --engine polars joins on keys only: {native}",
                self.joined.positional
            )));
        }
        Ok(key)
    }

    /// The labels the query joins: the kept ones, or with `all_rows` every
    /// label with its decision, status and error.
    fn label_frame(&self) -> PolarsResult<DataFrame> {
        let chosen: Vec<(&LabelRow, bool)> = self
            .labels
            .iter()
            .zip(self.keep_label)
            .filter(|(_, k)| self.all_rows || **k)
            .map(|(l, k)| (l, *k))
            .collect();
        let mut cols = vec![
            Column::new(
                JOIN_KEY.into(),
                chosen
                    .iter()
                    .map(|(l, _)| l.key.as_str())
                    .collect::<Vec<_>>(),
            ),
            Column::new(
                "ncclean_clean_prob".into(),
                chosen.iter().map(|(l, _)| l.clean_prob).collect::<Vec<_>>(),
            ),
            Column::new(
                "ncclean_soft_label".into(),
                chosen.iter().map(|(l, _)| l.soft_label).collect::<Vec<_>>(),
            ),
        ];
        if self.all_rows {
            cols.push(Column::new(
                "ncclean_keep".into(),
                chosen.iter().map(|(_, k)| *k).collect::<Vec<_>>(),
            ));
            cols.push(Column::new(
                "ncclean_status".into(),
                chosen
                    .iter()
                    .map(|(l, _)| l.status.as_str())
                    .collect::<Vec<_>>(),
            ));
            cols.push(Column::new(
                "ncclean_error".into(),
                chosen
                    .iter()
                    .map(|(l, _)| l.error.as_deref())
                    .collect::<Vec<_>>(),
            ));
        }
        DataFrame::new_infer_height(cols)
    }

    /// Scan every shard, join the labels on the key, keep the source
    /// columns (less any an annotation replaces, as the default engine
    /// does) and append the annotations.
    fn query(&self, key: &str) -> PolarsResult<LazyFrame> {
        let labels = self.label_frame()?;
        let added: Vec<String> = labels
            .get_column_names()
            .iter()
            .filter(|n| n.as_str() != JOIN_KEY)
            .map(|n| n.to_string())
            .collect();
        let source: Vec<String> = match self.input.files.first() {
            Some(f) => f
                .schema
                .fields()
                .iter()
                .map(|f| f.name().clone())
                .filter(|n| !added.contains(n))
                .collect(),
            None => Vec::new(),
        };
        let paths: Vec<PlRefPath> = self
            .input
            .files
            .iter()
            .map(|f| PlRefPath::new(f.path.to_string_lossy().as_ref()))
            .collect();
        let args = ScanArgsParquet {
            // The paths are discovered already: a `[` in a file name is
            // not a pattern, and `x=1/` directories add no columns.
            glob: false,
            hive_options: HiveOptions::new_disabled(),
            ..Default::default()
        };
        let data = LazyFrame::scan_parquet_files(paths.into_iter().collect(), args)?
            .with_column(col(key).cast(DataType::String).alias(JOIN_KEY));
        let how = JoinArgs {
            maintain_order: MaintainOrderJoin::Left,
            ..JoinArgs::new(JoinType::Inner)
        };
        let mut out: Vec<Expr> = source.iter().map(|n| col(n.as_str())).collect();
        out.extend(added.iter().map(|n| col(n.as_str())));
        Ok(data
            .join(labels.lazy(), [col(JOIN_KEY)], [col(JOIN_KEY)], how)
            .select(out))
    }
}

/// Run `query` into a parquet file at `path`, in polars' streaming engine.
fn sink(query: LazyFrame, path: &Path, meta: &BTreeMap<String, String>) -> PolarsResult<()> {
    let kv = meta.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    let options = ParquetWriteOptions {
        row_group_size: Some(ROW_GROUP_ROWS),
        key_value_metadata: Some(KeyValueMetadata::from_static(kv)),
        ..Default::default()
    };
    let target = SinkTarget::Path(PlRefPath::new(path.to_string_lossy().as_ref()));
    query
        .sink(
            SinkDestination::File { target },
            FileWriteFormat::Parquet(Arc::new(options)),
            UnifiedSinkArgs::default(),
        )?
        .collect_with_engine(Engine::Streaming)?;
    Ok(())
}

/// Rows in a parquet file by its footer.
fn parquet_rows(path: &Path) -> Result<usize> {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let file = std::fs::File::open(path)
        .map_err(|e| Error::Other(anyhow::anyhow!("{}: cannot open it ({e})", path.display())))?;
    let reader = SerializedFileReader::new(file).map_err(|e| {
        Error::Other(anyhow::anyhow!(
            "{}: polars wrote a file that is not readable parquet ({e})",
            path.display()
        ))
    })?;
    Ok(reader.metadata().file_metadata().num_rows().max(0) as usize)
}

/// A polars failure as a message that names the input and the way out.
fn polars_error(input: &InputSet, e: &PolarsError) -> Error {
    let files = input.files.len();
    Error::Other(anyhow::anyhow!(
        "polars could not filter the {files} input file(s) ({e}); \
         the default engine (leave out --engine polars) reads around damaged row groups and names them"
    ))
}
