//! Atomic output: everything is written under a temporary name in the target
//! directory and renamed into place, so a crash never leaves a half-written
//! file under the real name.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context;
use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;

use crate::error::Result;
use crate::runtime::temp;

/// Rows per row group: readers can stream a file a row group at a time.
const ROW_GROUP_ROWS: usize = 64 * 1024;
/// Bytes per row group: the writer buffers a whole row group, so this bounds
/// its memory when rows carry image bytes.
const ROW_GROUP_BYTES: usize = 128 * 1024 * 1024;

/// This process's temporary for `path` (see [`crate::runtime::temp`]), after the
/// temporaries that dead processes left for it are removed.
fn temp_path(path: &Path) -> Result<PathBuf> {
    temp::check_replaceable(path, "output")?;
    temp::sweep(path)?;
    Ok(temp::name(path, temp::Kind::Tmp))
}

fn ensure_parent(path: &Path) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    Ok(())
}

fn commit(tmp: &Path, path: &Path) -> Result<()> {
    std::fs::rename(tmp, path)
        .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))?;
    Ok(())
}

/// Atomic parquet writer: writes to `.<name>.tmp-<pid>` in the same
/// directory and renames it to `path` on [`finish`](Self::finish); dropped
/// without `finish`, the temporary file is removed. Zstd compression,
/// key–value metadata in the footer.
pub struct AtomicParquetWriter {
    writer: Option<ArrowWriter<File>>,
    tmp: PathBuf,
    path: PathBuf,
    /// Rename `tmp` to `path` on finish; false when `path` is itself a
    /// temporary that the caller renames ([`AtomicParquetWriter::create_in`]).
    rename: bool,
}

impl AtomicParquetWriter {
    /// Start writing `path` with `schema`; `metadata` goes into the footer.
    pub fn create(
        path: &Path,
        schema: SchemaRef,
        metadata: &BTreeMap<String, String>,
    ) -> Result<Self> {
        ensure_parent(path)?;
        let tmp = temp_path(path)?;
        Self::start(tmp, path, true, schema, metadata)
    }

    /// Write straight into `tmp`, a temporary the caller owns and renames
    /// into place (a [`crate::runtime::temp::Pending`]): a temporary of its own
    /// would be named after the caller's (`..<name>.tmp-<pid>.tmp-<pid>`),
    /// which no sweep of the final path finds after a kill.
    pub fn create_in(
        tmp: &Path,
        schema: SchemaRef,
        metadata: &BTreeMap<String, String>,
    ) -> Result<Self> {
        ensure_parent(tmp)?;
        Self::start(tmp.to_path_buf(), tmp, false, schema, metadata)
    }

    fn start(
        tmp: PathBuf,
        path: &Path,
        rename: bool,
        schema: SchemaRef,
        metadata: &BTreeMap<String, String>,
    ) -> Result<Self> {
        let file = File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        let kv: Vec<KeyValue> = metadata
            .iter()
            .map(|(k, v)| KeyValue::new(k.clone(), v.clone()))
            .collect();
        let props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::default()))
            .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
            .set_max_row_group_bytes(Some(ROW_GROUP_BYTES))
            .set_key_value_metadata((!kv.is_empty()).then_some(kv))
            .build();
        // From here on `Drop` cleans up the temporary file on any failure.
        let mut this = AtomicParquetWriter {
            writer: None,
            tmp,
            path: path.to_path_buf(),
            rename,
        };
        let writer = ArrowWriter::try_new(file, schema, Some(props))
            .with_context(|| format!("starting parquet output {}", path.display()))?;
        this.writer = Some(writer);
        Ok(this)
    }

    /// Append a batch; its schema must be the one given to `create`.
    pub fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        let path = &self.path;
        let writer = self
            .writer
            .as_mut()
            .ok_or_else(|| anyhow::anyhow!("writing {} after an error", path.display()))?;
        writer
            .write(batch)
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(())
    }

    /// Add key–value metadata to the footer: for what is known only once
    /// every batch is written (counts, rates over the whole file).
    pub fn append_metadata(&mut self, metadata: &BTreeMap<String, String>) -> Result<()> {
        let path = &self.path;
        let writer = self
            .writer
            .as_mut()
            .ok_or_else(|| anyhow::anyhow!("writing {} after an error", path.display()))?;
        for (k, v) in metadata {
            writer.append_key_value_metadata(KeyValue::new(k.clone(), v.clone()));
        }
        Ok(())
    }

    /// Write the footer, flush to disk and rename into place.
    pub fn finish(mut self) -> Result<()> {
        let writer = self
            .writer
            .take()
            .ok_or_else(|| anyhow::anyhow!("finishing {} after an error", self.path.display()))?;
        let file = writer
            .into_inner()
            .with_context(|| format!("finishing {}", self.path.display()))?;
        file.sync_all()
            .with_context(|| format!("syncing {}", self.tmp.display()))?;
        drop(file);
        if self.rename {
            commit(&self.tmp, &self.path)?;
        }
        // Renamed: nothing left for Drop to remove.
        self.tmp = PathBuf::new();
        Ok(())
    }
}

impl Drop for AtomicParquetWriter {
    fn drop(&mut self) {
        drop(self.writer.take());
        if !self.tmp.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Write a small file (JSON, text) atomically: temporary name, sync, rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    ensure_parent(path)?;
    let tmp = temp_path(path)?;
    let result = (|| -> Result<()> {
        let mut f = File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        f.write_all(bytes)
            .and_then(|_| f.sync_all())
            .with_context(|| format!("writing {}", tmp.display()))?;
        drop(f);
        commit(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::Int32Array;
    use arrow_schema::{DataType, Field, Schema};
    use parquet::file::reader::{FileReader, SerializedFileReader};

    use super::*;

    fn batch() -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int32, false)]));
        RecordBatch::try_new(schema, vec![Arc::new(Int32Array::from(vec![1, 2, 3]))]).unwrap()
    }

    fn dir_names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn finish_renames_and_keeps_metadata() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/out.parquet");
        let b = batch();
        let meta = BTreeMap::from([("ncclean.k".to_string(), "v".to_string())]);
        let mut w = AtomicParquetWriter::create(&path, b.schema(), &meta).unwrap();
        w.write(&b).unwrap();
        w.finish().unwrap();
        assert_eq!(dir_names(&dir.path().join("sub")), vec!["out.parquet"]);
        let r = SerializedFileReader::new(File::open(&path).unwrap()).unwrap();
        let fm = r.metadata().file_metadata();
        assert_eq!(fm.num_rows(), 3);
        let kv = fm.key_value_metadata().unwrap();
        assert!(kv
            .iter()
            .any(|k| k.key == "ncclean.k" && k.value.as_deref() == Some("v")));
    }

    #[test]
    fn drop_without_finish_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.parquet");
        let b = batch();
        let mut w = AtomicParquetWriter::create(&path, b.schema(), &BTreeMap::new()).unwrap();
        w.write(&b).unwrap();
        assert_eq!(
            dir_names(dir.path()).len(),
            1,
            "temp file exists while writing"
        );
        drop(w);
        assert!(dir_names(dir.path()).is_empty());
    }

    #[test]
    fn write_atomic_replaces_content() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.json");
        write_atomic(&path, b"{\"a\":1}").unwrap();
        write_atomic(&path, b"{\"a\":2}").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"{\"a\":2}");
        assert_eq!(dir_names(dir.path()), vec!["run.json"]);
    }
}
