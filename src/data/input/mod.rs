//! Opening the user's parquet inputs: expanding paths, validating footers and
//! columns up front, then streaming pairs or whole batches.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use arrow_array::{Array, RecordBatch};
use arrow_schema::DataType;
use sha2::{Digest, Sha256};

use super::columns::{check_same_columns, resolve_columns, url_only};
use super::read::{restore_strings, FileReader, Piece, RowGroupStream};
use super::rows::{batch_to_pairs, list_values, plain, source_error_column, string_at, RowContext};
use super::webdataset::{self, PairBatches};
use super::{
    ColumnMap, ColumnOptions, FileFormat, ImageKind, InputFile, InputSet, PairRow, TextEmbeddings,
};
use crate::data::images::ImageBase;
use crate::error::{invalid, Result};
use crate::runtime::hex::hex;

/// Rows sampled from the first file to settle a variable-length embedding's
/// dimension; small enough to keep `open` footer-cheap.
const EMBEDDING_SAMPLE_ROWS: usize = 1024;

impl InputSet {
    /// [`InputSet::open`] the inputs named on the command line, refusing
    /// none at all (a usage error): DATA is optional to the parser, since
    /// `--files-from` can replace it.
    pub fn open_given(inputs: &[PathBuf], opts: &ColumnOptions) -> Result<InputSet> {
        if inputs.is_empty() {
            return Err(crate::error::Error::Usage(
                "no input given: name parquet files, directories of them or globs (DATA)".into(),
            ));
        }
        InputSet::open(inputs, opts)
    }

    /// Expand `inputs` (files, directories of `*.parquet` or `*.tar`, or
    /// globs; see [`super::Discovery`]), read every footer, and detect and
    /// validate the columns.
    ///
    /// Files named `*.tar` are webdataset shards (see `--caption-from`):
    /// each one's headers are scanned to count its samples. One set is all
    /// parquet or all tar; a mix is [`crate::Error::Usage`].
    ///
    /// Every file must be a readable parquet file with at least one row, and
    /// every file must have the columns resolved on the first one with
    /// compatible types; anything else is [`crate::Error::InvalidInput`]
    /// naming the file. Only footers are read (plus, for variable-length
    /// embeddings, the first rows of one column).
    pub fn open(inputs: &[PathBuf], opts: &ColumnOptions) -> Result<InputSet> {
        let paths = super::expand_inputs(inputs, opts.discovery())?;
        let tars = paths.iter().filter(|p| webdataset::is_tar(p)).count();
        if tars > 0 {
            if let Some(p) = paths.iter().find(|p| !webdataset::is_tar(p)) {
                return Err(crate::Error::Usage(format!(
                    "{} is not a tar shard, but other inputs are: one run reads either parquet files or webdataset tar shards; run them separately",
                    p.display()
                )));
            }
            return webdataset::open_set(paths, opts);
        }
        for (flag, given) in [
            ("--caption-from", opts.caption_from.is_some()),
            ("--key-from", opts.key_from.is_some()),
        ] {
            if given {
                return Err(crate::Error::Usage(format!(
                    "{flag} applies to webdataset tar shards; for parquet inputs use --caption-col and --key-col"
                )));
            }
        }
        let mut files = Vec::with_capacity(paths.len());
        for path in paths {
            files.push(read_footer(&path)?);
        }
        if files.is_empty() {
            return Err(invalid(
                "no input files given; expected parquet files or a directory",
            ));
        }
        let files = super::skip_empty(files, |f| f.num_rows, |f| &f.path).map_err(|p| {
            invalid(format!(
                "{}: has no rows; expected at least one image–caption pair",
                p.display()
            ))
        })?;
        let first = &files[0];
        let mut columns = resolve_columns(&first.path, &first.schema, opts)?;
        for f in &files[1..] {
            check_same_columns(&f.path, &f.schema, &columns, &first.path)?;
        }
        if columns.image_kind == ImageKind::Path {
            refuse_urls(first, &columns)?;
        }
        let text_embedding_dim = match &columns.text_embedding {
            Some(t) => checked_embedding_dim(first, t)?,
            None => None,
        };
        // A column without one readable value has no width to check rows
        // against: the text side cannot use it, and `inspect` just omits it.
        if let (Some(t), None) = (&columns.text_embedding, text_embedding_dim) {
            if opts.text_embeddings == TextEmbeddings::Require || opts.text_emb_col.is_some() {
                return Err(invalid(format!(
                    "{}: the text-embedding column \"{t}\" holds no readable embedding in its first rows; \
                     expected a list<float> per row",
                    first.path.display()
                )));
            }
            columns.text_embedding = None;
        }
        let embedding_dim = if columns.image_kind == ImageKind::Embedding {
            checked_embedding_dim(first, &columns.image)?
        } else {
            None
        };
        Ok(InputSet {
            files,
            columns,
            image_root: opts.image_root.clone(),
            image_limits: opts.image_limits,
            embedding_dim,
            text_embedding_dim,
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
    ///
    /// Every row of every file comes out. The rows of a row group that
    /// cannot be decoded (from the failing batch on) come out with a problem
    /// naming the file, the row group and the column, keyed
    /// `<file stem>:<row>`, and a warning is printed once; a string that is
    /// not valid UTF-8 makes a problem of its row alone. Only a file that
    /// can no longer be opened is an error.
    pub fn pairs(&self, batch_rows: usize) -> impl Iterator<Item = Result<Vec<PairRow>>> + '_ {
        PairIter {
            set: self,
            batch_rows: batch_rows.max(1),
            file: 0,
            stream: None,
            tar: None,
            lost: None,
            done: false,
        }
    }

    /// Stream the full record batches (all columns) of one file, in order
    /// (a tar shard's as the table of key, image, caption and json, with
    /// nulls where a sample has no usable image or caption).
    ///
    /// A row group that cannot be decoded ends the stream with
    /// [`crate::Error::InvalidInput`] naming the file, the row group and the
    /// column: callers of this function need every row. (`write_filtered`,
    /// which needs only some, reads around damage instead.)
    pub fn record_batches(
        &self,
        file: usize,
        batch_rows: usize,
    ) -> Result<Box<dyn Iterator<Item = Result<RecordBatch>>>> {
        let f = self
            .files
            .get(file)
            .ok_or_else(|| anyhow::anyhow!("input file index {file} out of range"))?;
        if let FileFormat::Webdataset(layout) = &f.format {
            let batches = webdataset::record_batches(
                &f.path,
                layout,
                self.image_limits.max_bytes,
                batch_rows,
            )?;
            return Ok(Box::new(batches.map(|b| b.map(|(batch, _)| batch))));
        }
        let reader = Arc::new(FileReader::open(&f.path)?);
        let mut failed = false;
        Ok(Box::new(reader.stream(None, batch_rows, false).map_while(
            move |piece| {
                if failed {
                    return None;
                }
                Some(match piece {
                    Piece::Rows { batch, .. } => Ok(batch),
                    Piece::Damaged(d) => {
                        failed = true;
                        Err(invalid(format!(
                            "{}; this command needs every row of its input",
                            d.reason()
                        )))
                    }
                })
            },
        )))
    }

    /// sha256 (hex) over every file's content in order, independent of the
    /// file names, so renaming or moving shards keeps the fingerprint.
    pub fn fingerprint(&self) -> Result<String> {
        self.fingerprint_until(None)
    }

    /// [`InputSet::fingerprint`] read on another thread beside other
    /// work: it gives up (an error nobody reads) as soon as `stop` is set,
    /// so work that failed does not wait for every byte to be hashed.
    pub fn fingerprint_unless(&self, stop: &std::sync::atomic::AtomicBool) -> Result<String> {
        self.fingerprint_until(Some(stop))
    }

    /// The fingerprint, computed once (until `stop` is set, if given) and
    /// kept.
    fn fingerprint_until(&self, stop: Option<&std::sync::atomic::AtomicBool>) -> Result<String> {
        if let Some(f) = self.fingerprint.get() {
            return Ok(f.clone());
        }
        let f = fingerprint_files_unless(self.files.iter().map(|f| f.path.as_path()), stop)?;
        Ok(self.fingerprint.get_or_init(|| f).clone())
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

/// Whether the data file `path` is a readable shard with no rows (an empty
/// tar, or a parquet file of 0 rows): what `score --out-dir` and `filter
/// --out-dir` pass over with a warning when opening it on its own fails.
pub(crate) fn is_empty_shard(path: &Path) -> bool {
    if webdataset::is_tar(path) {
        matches!(webdataset::count_samples(path), Ok(0))
    } else {
        read_footer(path).is_ok_and(|f| f.num_rows == 0)
    }
}

/// Validate one file from its footer alone.
fn read_footer(path: &Path) -> Result<InputFile> {
    let len = super::regular_file_len(path)?;
    if len == 0 {
        return Err(invalid(format!(
            "{}: file is empty (0 bytes); expected a parquet file with at least one row",
            path.display()
        )));
    }
    let reader = FileReader::open(path)?;
    let num_rows = reader.metadata().file_metadata().num_rows();
    if num_rows < 0 {
        return Err(invalid(format!(
            "{}: has no rows; expected at least one image–caption pair",
            path.display()
        )));
    }
    // Every count downstream (labels, keep masks, feature slots) is built on
    // the footer's rows; row groups that disagree could not be placed.
    let groups = reader
        .metadata()
        .row_groups()
        .iter()
        .map(|g| g.num_rows())
        .try_fold(0i64, |acc, n| if n < 0 { None } else { acc.checked_add(n) });
    if groups != Some(num_rows) {
        return Err(invalid(format!(
            "{}: damaged footer: the file declares {num_rows} rows but its row groups hold {}; expected a parquet file written in full",
            path.display(),
            groups.map_or_else(|| "an invalid number of them".to_string(), |g| g.to_string())
        )));
    }
    Ok(InputFile {
        path: path.to_path_buf(),
        num_rows: num_rows as usize,
        schema: reader.schema().clone(),
        format: FileFormat::Parquet,
    })
}

fn pair_columns(map: &ColumnMap) -> Vec<&str> {
    let mut cols = vec![map.image.as_str(), map.caption.as_str()];
    cols.extend(map.key.as_deref());
    cols.extend(map.text_embedding.as_deref());
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
    // Damaged row groups are passed over: their rows are reported when the
    // pairs are read, and the sample only needs some readable rows.
    let reader = Arc::new(FileReader::open(&first.path)?);
    let Some(batch) = reader
        .stream(Some(&[column]), EMBEDDING_SAMPLE_ROWS, false)
        .find_map(|p| match p {
            Piece::Rows { batch, .. } => Some(batch),
            Piece::Damaged(_) => None,
        })
    else {
        return Ok(None);
    };
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

/// Widest embedding accepted (CLIP ViT-bigG's is 1,280, LLM-sized text
/// embeddings reach 8,192): a wider one is more likely a mislabelled column,
/// and the heads' weights grow with it.
pub const MAX_EMBEDDING_DIM: usize = 65_536;

/// [`embedding_dim`] checked: an embedding column whose rows hold no values,
/// or more than [`MAX_EMBEDDING_DIM`], cannot feed a head.
fn checked_embedding_dim(first: &InputFile, column: &str) -> Result<Option<usize>> {
    let dim = embedding_dim(first, column)?;
    match dim {
        Some(0) => Err(invalid(format!(
            "{}: the embedding column \"{column}\" holds empty lists (0 values per row); \
             expected one list of floats per row, e.g. 512 for CLIP ViT-B/32",
            first.path.display()
        ))),
        Some(d) if d > MAX_EMBEDDING_DIM => Err(invalid(format!(
            "{}: the embedding column \"{column}\" holds {d} values per row, more than the \
             {MAX_EMBEDDING_DIM} ncclean accepts; is it the right column? Name the embedding \
             column with --image-col or --text-emb-col",
            first.path.display()
        ))),
        _ => Ok(dim),
    }
}

/// Rows sampled from the first file to tell a URL column from a path column.
const URL_SAMPLE_ROWS: usize = 16;

/// A path column whose first values are URLs would fail row by row with a
/// confusing "cannot read image file" each; refuse it up front with the
/// download command instead.
fn refuse_urls(first: &InputFile, columns: &ColumnMap) -> Result<()> {
    let reader = Arc::new(FileReader::open(&first.path)?);
    let Some(batch) = reader
        .stream(Some(&[columns.image.as_str()]), URL_SAMPLE_ROWS, false)
        .find_map(|p| match p {
            Piece::Rows { batch, .. } => Some(batch),
            Piece::Damaged(_) => None,
        })
    else {
        return Ok(());
    };
    let array = plain(batch.column(0))?;
    let values: Vec<String> = (0..array.len().min(URL_SAMPLE_ROWS))
        .filter_map(|i| string_at(array.as_ref(), i))
        .collect();
    let refs: Vec<&str> = values.iter().map(String::as_str).collect();
    match url_only(&first.path, &columns.image, Some(&columns.caption), &refs) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Streams [`PairRow`] batches file after file; stops after the first error.
struct PairIter<'a> {
    set: &'a InputSet,
    batch_rows: usize,
    file: usize,
    stream: Option<(Arc<FileReader>, RowGroupStream)>,
    /// The samples of the current file when it is a tar shard.
    tar: Option<PairBatches>,
    lost: Option<Lost>,
    done: bool,
}

impl PairIter<'_> {
    fn step(&mut self) -> Result<Option<Vec<PairRow>>> {
        loop {
            if let Some(rows) = self.lost_rows() {
                return Ok(Some(rows));
            }
            if self.file >= self.set.files.len() {
                return Ok(None);
            }
            let path = &self.set.files[self.file].path;
            if let FileFormat::Webdataset(layout) = &self.set.files[self.file].format {
                if self.tar.is_none() {
                    self.tar = Some(PairBatches::open(self.set, self.file, layout)?);
                }
                match self.tar.as_mut().map(|t| t.next_batch(self.batch_rows)) {
                    Some(Ok(Some(rows))) => return Ok(Some(rows)),
                    Some(Err(e)) => return Err(e),
                    Some(Ok(None)) | None => {
                        self.tar = None;
                        self.file += 1;
                    }
                }
                continue;
            }
            if self.stream.is_none() {
                let reader = Arc::new(FileReader::open(path)?);
                let mut cols = pair_columns(&self.set.columns);
                cols.extend(source_error_column(reader.schema(), &self.set.columns));
                let stream = reader.stream(Some(&cols), self.batch_rows, true);
                self.stream = Some((reader, stream));
            }
            let Some((reader, stream)) = self.stream.as_mut() else {
                continue;
            };
            let stem = path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            match stream.next() {
                None => {
                    self.stream = None;
                    self.file += 1;
                }
                Some(Piece::Rows { batch, first_row }) => {
                    let (batch, bad) = restore_pair_columns(&batch, reader.schema(), path)?;
                    let source_error = source_error_column(reader.schema(), &self.set.columns);
                    let base = self.set.image_base(self.file);
                    let ctx = RowContext {
                        file_index: self.file,
                        file_stem: &stem,
                        image_base: &base,
                        columns: &self.set.columns,
                        embedding_dim: self.set.embedding_dim,
                        text_embedding_dim: self.set.text_embedding_dim,
                        source_error,
                    };
                    let mut rows = batch_to_pairs(&batch, &ctx, first_row)?;
                    // The source's reason is only quoted: its bytes do not
                    // make a pair unusable.
                    for (column, mask) in bad
                        .into_iter()
                        .filter(|(c, _)| Some(c.as_str()) != source_error)
                    {
                        let msg =
                            format!("{} is not valid UTF-8", role(&self.set.columns, &column));
                        for (row, _) in rows.iter_mut().zip(mask).filter(|(_, b)| *b) {
                            row.problem = Some(match row.problem.take() {
                                Some(p) => format!("{msg}; {p}"),
                                None => msg.clone(),
                            });
                        }
                    }
                    if !rows.is_empty() {
                        return Ok(Some(rows));
                    }
                }
                Some(Piece::Damaged(d)) => {
                    let reason = d.reason();
                    crate::runtime::progress::warn_once(&format!(
                        "{reason}; labelled skipped: {}",
                        row_span(d.first_row, d.rows)
                    ));
                    self.lost = Some(Lost {
                        reason,
                        next: d.first_row,
                        end: d.first_row + d.rows,
                    });
                }
            }
        }
    }

    /// The next at most `batch_rows` rows of a damaged stretch, which keeps
    /// the memory bound of [`InputSet::pairs`] whatever the row group's size.
    fn lost_rows(&mut self) -> Option<Vec<PairRow>> {
        let lost = self.lost.as_mut()?;
        let path = &self.set.files.get(self.file)?.path;
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let end = lost.end.min(lost.next + self.batch_rows);
        let rows: Vec<PairRow> = (lost.next..end)
            .map(|row| PairRow {
                source_file: self.file,
                source_row: row,
                // The key column may be what is damaged.
                key: format!("{stem}:{row}"),
                image: None,
                caption: String::new(),
                text_embedding: None,
                problem: Some(lost.reason.clone()),
            })
            .collect();
        lost.next = end;
        if lost.next >= lost.end {
            self.lost = None;
        }
        (!rows.is_empty()).then_some(rows)
    }
}

/// Rows of a damaged row group still to be handed out.
struct Lost {
    reason: String,
    next: usize,
    end: usize,
}

/// `rows 40-79 of the file` (or `row 40 of the file`).
pub(crate) fn row_span(first: usize, n: usize) -> String {
    if n == 1 {
        format!("row {first} of the file")
    } else {
        format!("rows {first}-{} of the file", first + n.saturating_sub(1))
    }
}

/// How a problem names a pair column: by its role.
fn role(map: &ColumnMap, column: &str) -> &'static str {
    if column == map.caption {
        "caption"
    } else if map.key.as_deref() == Some(column) {
        "key"
    } else {
        "image path"
    }
}

/// Per column name, which rows hold invalid UTF-8.
type BadRows = Vec<(String, Vec<bool>)>;

/// The pair columns of a batch read with strings as bytes, back in their
/// written types, with a mask of the rows whose value was not valid UTF-8
/// for each column that had any.
fn restore_pair_columns(
    batch: &RecordBatch,
    schema: &arrow_schema::SchemaRef,
    path: &Path,
) -> Result<(RecordBatch, BadRows)> {
    let mut columns = Vec::with_capacity(batch.num_columns());
    let mut fields = Vec::with_capacity(batch.num_columns());
    let mut bad = Vec::new();
    for (array, field) in batch.columns().iter().zip(batch.schema().fields()) {
        let want = schema.field_with_name(field.name()).map_err(|_| {
            anyhow::anyhow!("column {:?} vanished from {}", field.name(), path.display())
        })?;
        let (a, mask) = restore_strings(array, want.data_type()).map_err(|e| {
            anyhow::anyhow!(
                "reading column {:?} of {}: {e}",
                field.name(),
                path.display()
            )
        })?;
        if let Some(mask) = mask {
            bad.push((field.name().clone(), mask));
        }
        columns.push(a);
        fields.push(Arc::new(want.clone()));
    }
    let schema = Arc::new(arrow_schema::Schema::new(fields));
    let batch = RecordBatch::try_new(schema, columns)
        .with_context(|| format!("reading {}", path.display()))?;
    Ok((batch, bad))
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

/// sha256 (hex) over the content of `paths` in order, each prefixed with
/// its length ([`InputSet::fingerprint`]; run.json's `input_fingerprint`).
pub fn fingerprint_files<'a>(paths: impl Iterator<Item = &'a Path>) -> Result<String> {
    fingerprint_files_unless(paths, None)
}

/// [`fingerprint_files`], giving up between MiBs once `stop` is set.
fn fingerprint_files_unless<'a>(
    paths: impl Iterator<Item = &'a Path>,
    stop: Option<&std::sync::atomic::AtomicBool>,
) -> Result<String> {
    let stopped = || stop.is_some_and(|s| s.load(std::sync::atomic::Ordering::Relaxed));
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    for path in paths {
        let mut file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let len = file
            .metadata()
            .with_context(|| format!("reading {}", path.display()))?
            .len();
        // The length prefix keeps [ab][c] and [a][bc] apart.
        hasher.update(len.to_le_bytes());
        loop {
            let n = file
                .read(&mut buf)
                .with_context(|| format!("reading {}", path.display()))?;
            if n == 0 {
                break;
            }
            if stopped() {
                return Err(anyhow::anyhow!("fingerprinting the input stopped").into());
            }
            hasher.update(&buf[..n]);
        }
    }
    Ok(hex(&hasher.finalize()))
}

#[cfg(test)]
mod tests;
