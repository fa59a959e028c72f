//! Opening the user's parquet inputs: expanding paths, validating footers and
//! columns up front, then streaming pairs or whole batches.

use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::Context;
use arrow_array::{Array, RecordBatch};
use arrow_schema::DataType;
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use parquet::arrow::ProjectionMask;
use sha2::{Digest, Sha256};

use super::columns::{check_same_columns, resolve_columns};
use super::rows::{batch_to_pairs, list_values, plain, RowContext};
use super::{ColumnMap, ColumnOptions, ImageKind, InputFile, InputSet, PairRow};
use crate::error::{invalid, Result};
use crate::hex::hex;
use crate::images::ImageBase;

/// Rows sampled from the first file to settle a variable-length embedding's
/// dimension; small enough to keep `open` footer-cheap.
const EMBEDDING_SAMPLE_ROWS: usize = 1024;

impl InputSet {
    /// Expand `inputs` (files, directories of `*.parquet` sorted by name, or
    /// simple globs with `*`/`?` in the file name), read every footer, and
    /// detect and validate the columns.
    ///
    /// Every file must be a readable parquet file with at least one row, and
    /// every file must have the columns resolved on the first one with
    /// compatible types; anything else is [`crate::Error::InvalidInput`]
    /// naming the file. Only footers are read (plus, for variable-length
    /// embeddings, the first rows of one column).
    pub fn open(inputs: &[PathBuf], opts: &ColumnOptions) -> Result<InputSet> {
        let paths = expand_inputs(inputs)?;
        let mut files = Vec::with_capacity(paths.len());
        for path in paths {
            files.push(read_footer(&path)?);
        }
        let first = files.first().ok_or_else(|| {
            invalid("no input files given; expected parquet files or a directory")
        })?;
        let columns = resolve_columns(&first.path, &first.schema, opts)?;
        for f in &files[1..] {
            check_same_columns(&f.path, &f.schema, &columns, &first.path)?;
        }
        let embedding_dim = if columns.image_kind == ImageKind::Embedding {
            embedding_dim(first, &columns.image)?
        } else {
            None
        };
        Ok(InputSet {
            files,
            columns,
            image_root: opts.image_root.clone(),
            image_limits: opts.image_limits,
            embedding_dim,
            fingerprint: Default::default(),
        })
    }

    /// Total rows over all files.
    pub fn num_rows(&self) -> usize {
        self.files.iter().map(|f| f.num_rows).sum()
    }

    /// Stream pairs in input order, at most `batch_rows` at a time (a batch
    /// never spans two files). Only the image, caption and key columns are
    /// read, so memory is bounded by one batch of those.
    pub fn pairs(&self, batch_rows: usize) -> impl Iterator<Item = Result<Vec<PairRow>>> + '_ {
        PairIter {
            set: self,
            batch_rows: batch_rows.max(1),
            file: 0,
            reader: None,
            next_row: 0,
            done: false,
        }
    }

    /// Stream the full record batches (all columns) of one file, in order.
    pub fn record_batches(
        &self,
        file: usize,
        batch_rows: usize,
    ) -> Result<Box<dyn Iterator<Item = Result<RecordBatch>>>> {
        let f = self
            .files
            .get(file)
            .ok_or_else(|| anyhow::anyhow!("input file index {file} out of range"))?;
        let path = f.path.clone();
        let reader = open_reader(&path, batch_rows, None)?;
        Ok(Box::new(reader.map(move |b| {
            b.with_context(|| format!("reading {}", path.display()))
                .map_err(Into::into)
        })))
    }

    /// sha256 (hex) over every file's content in order, independent of the
    /// file names, so renaming or moving shards keeps the fingerprint.
    pub fn fingerprint(&self) -> Result<String> {
        if let Some(f) = self.fingerprint.get() {
            return Ok(f.clone());
        }
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        for f in &self.files {
            let mut file =
                File::open(&f.path).with_context(|| format!("opening {}", f.path.display()))?;
            let len = file
                .metadata()
                .with_context(|| format!("reading {}", f.path.display()))?
                .len();
            // The length prefix keeps [ab][c] and [a][bc] apart.
            hasher.update(len.to_le_bytes());
            loop {
                let n = file
                    .read(&mut buf)
                    .with_context(|| format!("reading {}", f.path.display()))?;
                if n == 0 {
                    break;
                }
                hasher.update(&buf[..n]);
            }
        }
        Ok(self
            .fingerprint
            .get_or_init(|| hex(&hasher.finalize()))
            .clone())
    }

    /// Display name of a file as given (used in labels' `source_file`).
    pub fn display_name(&self, file: usize) -> String {
        self.files
            .get(file)
            .map(|f| f.path.display().to_string())
            .unwrap_or_default()
    }

    /// Where relative image paths of `file` are resolved, and whether they
    /// must stay there.
    fn image_base(&self, file: usize) -> ImageBase {
        let dir = match &self.image_root {
            Some(root) => root.clone(),
            None => self.files[file]
                .path
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_default(),
        };
        ImageBase::new(dir, self.image_limits.allow_absolute_paths)
    }
}

/// Files named by the user, in the order given; directories and globs expand
/// to their matches sorted by name, so the row order is reproducible.
fn expand_inputs(inputs: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for input in inputs {
        let name = input
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if name.contains('*') || name.contains('?') {
            let dir = input
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            let matches = list_dir(dir, |n| wildcard_match(&name, n))?;
            if matches.is_empty() {
                return Err(invalid(format!(
                    "{}: no files match; expected parquet files",
                    input.display()
                )));
            }
            out.extend(matches);
        } else if input.is_dir() {
            let matches = list_dir(input, |n| {
                !n.starts_with('.') && n.to_ascii_lowercase().ends_with(".parquet")
            })?;
            if matches.is_empty() {
                return Err(invalid(format!(
                    "{}: directory has no *.parquet files",
                    input.display()
                )));
            }
            out.extend(matches);
        } else if input.exists() {
            out.push(input.clone());
        } else {
            return Err(invalid(format!(
                "{}: no such file or directory; expected a parquet file, a directory of them or a glob",
                input.display()
            )));
        }
    }
    // A file listed twice would count its rows twice.
    let mut seen = HashSet::new();
    for p in &out {
        let id = std::fs::canonicalize(p).unwrap_or_else(|_| p.clone());
        if !seen.insert(id) {
            return Err(invalid(format!(
                "{}: given more than once; each input file may appear only once",
                p.display()
            )));
        }
    }
    Ok(out)
}

/// Regular files of `dir` whose names pass `keep`, sorted by name.
fn list_dir(dir: &Path, keep: impl Fn(&str) -> bool) -> Result<Vec<PathBuf>> {
    let entries = std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))?;
    let mut names = BTreeMap::new();
    for entry in entries {
        let entry = entry.with_context(|| format!("listing {}", dir.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if keep(&name) && entry.path().is_file() {
            names.insert(name, entry.path());
        }
    }
    Ok(names.into_values().collect())
}

/// `*` matches any run of characters, `?` exactly one.
fn wildcard_match(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    let (mut pi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ni));
            pi += 1;
        } else if let Some((sp, sn)) = star {
            pi = sp + 1;
            ni = sn + 1;
            star = Some((sp, sn + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// Validate one file from its footer alone.
fn read_footer(path: &Path) -> Result<InputFile> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let len = file
        .metadata()
        .with_context(|| format!("reading {}", path.display()))?
        .len();
    if len == 0 {
        return Err(invalid(format!(
            "{}: file is empty (0 bytes); expected a parquet file with at least one row",
            path.display()
        )));
    }
    let builder = ParquetRecordBatchReaderBuilder::try_new(file).map_err(|e| {
        invalid(format!(
            "{}: not a readable parquet file ({e}); expected a parquet file with image and caption columns",
            path.display()
        ))
    })?;
    let num_rows = builder.metadata().file_metadata().num_rows();
    if num_rows <= 0 {
        return Err(invalid(format!(
            "{}: has no rows; expected at least one image–caption pair",
            path.display()
        )));
    }
    Ok(InputFile {
        path: path.to_path_buf(),
        num_rows: num_rows as usize,
        schema: builder.schema().clone(),
    })
}

/// A batch reader over `path`, limited to the named top-level columns.
fn open_reader(
    path: &Path,
    batch_rows: usize,
    columns: Option<&[&str]>,
) -> Result<ParquetRecordBatchReader> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut builder = ParquetRecordBatchReaderBuilder::try_new(file)
        .with_context(|| format!("reading the footer of {}", path.display()))?
        .with_batch_size(batch_rows.max(1));
    if let Some(names) = columns {
        // Arrow's top-level fields are the parquet schema's roots, in order.
        let roots: Vec<usize> = names
            .iter()
            .map(|n| builder.schema().index_of(n))
            .collect::<std::result::Result<_, _>>()
            .with_context(|| format!("projecting columns of {}", path.display()))?;
        let mask = ProjectionMask::roots(builder.parquet_schema(), roots);
        builder = builder.with_projection(mask);
    }
    Ok(builder
        .build()
        .with_context(|| format!("reading {}", path.display()))?)
}

fn pair_columns(map: &ColumnMap) -> Vec<&str> {
    let mut cols = vec![map.image.as_str(), map.caption.as_str()];
    cols.extend(map.key.as_deref());
    cols
}

/// The fixed size of a FixedSizeList column, else the most common length
/// (first seen on ties) among the first rows of the first file.
fn embedding_dim(first: &InputFile, column: &str) -> Result<Option<usize>> {
    if let Ok(field) = first.schema.field_with_name(column) {
        if let DataType::FixedSizeList(_, n) = field.data_type() {
            return Ok(Some(*n as usize));
        }
    }
    let mut reader = open_reader(&first.path, EMBEDDING_SAMPLE_ROWS, Some(&[column]))?;
    let Some(batch) = reader.next() else {
        return Ok(None);
    };
    let batch = batch.with_context(|| format!("reading {}", first.path.display()))?;
    let array = plain(batch.column(0))?;
    let mut counts: Vec<(usize, usize)> = Vec::new();
    for row in 0..array.len() {
        if let Some(v) = list_values(array.as_ref(), row) {
            match counts.iter_mut().find(|(len, _)| *len == v.len()) {
                Some((_, c)) => *c += 1,
                None => counts.push((v.len(), 1)),
            }
        }
    }
    let mut best: Option<(usize, usize)> = None;
    for (len, c) in counts {
        if best.is_none_or(|(_, bc)| c > bc) {
            best = Some((len, c));
        }
    }
    Ok(best.map(|(len, _)| len))
}

/// Streams [`PairRow`] batches file after file; stops after the first error.
struct PairIter<'a> {
    set: &'a InputSet,
    batch_rows: usize,
    file: usize,
    reader: Option<ParquetRecordBatchReader>,
    next_row: usize,
    done: bool,
}

impl PairIter<'_> {
    fn step(&mut self) -> Result<Option<Vec<PairRow>>> {
        loop {
            if self.file >= self.set.files.len() {
                return Ok(None);
            }
            let path = &self.set.files[self.file].path;
            if self.reader.is_none() {
                let cols = pair_columns(&self.set.columns);
                self.reader = Some(open_reader(path, self.batch_rows, Some(&cols))?);
                self.next_row = 0;
            }
            let next = self.reader.as_mut().and_then(|r| r.next());
            match next {
                None => {
                    self.reader = None;
                    self.file += 1;
                }
                Some(batch) => {
                    let batch = batch.with_context(|| format!("reading {}", path.display()))?;
                    let stem = path
                        .file_stem()
                        .map(|s| s.to_string_lossy().into_owned())
                        .unwrap_or_default();
                    let base = self.set.image_base(self.file);
                    let ctx = RowContext {
                        file_index: self.file,
                        file_stem: &stem,
                        image_base: &base,
                        columns: &self.set.columns,
                        embedding_dim: self.set.embedding_dim,
                    };
                    let rows = batch_to_pairs(&batch, &ctx, self.next_row)?;
                    self.next_row += batch.num_rows();
                    if !rows.is_empty() {
                        return Ok(Some(rows));
                    }
                }
            }
        }
    }
}

impl Iterator for PairIter<'_> {
    type Item = Result<Vec<PairRow>>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        match self.step() {
            Ok(Some(rows)) => Some(Ok(rows)),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

#[cfg(test)]
mod tests;
