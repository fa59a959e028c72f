//! Parquet and webdataset tar in, parquet and tar out: finding the image,
//! caption and key columns (or members) of a user's shards, streaming
//! image–caption pairs, and writing labels and filtered datasets atomically.
//!
//! Nothing here knows about models: images leave this module as raw bytes,
//! paths or precomputed embeddings, and decoding them is the encoders' job.

mod columns;
mod discover;
mod filter;
pub mod images;
mod input;
mod keys;
mod labels;
mod metadata;
mod npy;
mod read;
mod rows;
pub(crate) mod sample;
mod webdataset;
mod window;
mod write;

#[cfg(test)]
pub(crate) mod testutil;

use std::path::PathBuf;

use crate::data::images::ImageLimits;

pub use columns::{image_columns, resolve_columns};
pub use discover::Discovery;
pub(crate) use discover::{expand_inputs, regular_file_len, skip_empty, EmptyShard};
pub(crate) use filter::check_same_schema;
pub use filter::{
    write_filtered, write_filtered_annotated, write_filtered_as, Annotations, FilterSummary,
    OutputFormat,
};
pub use input::MAX_EMBEDDING_DIM;
pub(crate) use input::{fingerprint_files, is_empty_shard};
pub use keys::{for_each_key, positional_key, DuplicateKeys};
pub use labels::{
    read_labels, write_labels, LabelRow, LabelsWriter, RowStatus, COLUMNS as LABEL_COLUMNS,
    LABEL_PREFIX,
};
pub use metadata::Metadata;
pub use npy::write_uids_npy;
pub(crate) use rows::{bytes_at, plain, string_at};
pub(crate) use webdataset::is_tar;
pub use webdataset::{
    schema as tar_schema, write_filtered_tar, write_filtered_tar_shard, CaptionFrom, KeyFrom,
    TarLayout, MAX_TEXT_MEMBER_BYTES,
};
pub use window::RowWindows;
pub use write::{write_atomic, AtomicParquetWriter};

/// Rows read per batch from the input: bounds the memory of raw image bytes.
pub const READ_BATCH_ROWS: usize = 256;

/// Column-layout presets for common dataset formats.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Preset {
    /// LAION shards after img2dataset: image bytes in `jpg` (or an
    /// `image_embedding`/`img_emb`), caption in `caption` (or the metadata's
    /// `TEXT`), key `SAMPLE_ID` or `key`. URL-only metadata is refused with
    /// the img2dataset command that downloads it.
    Laion,
    /// DataComp shards after img2dataset: image in `jpg`/`image`/`webp`/`png`
    /// or an `image_embedding`, caption in `caption` (or `text`), key `uid`
    /// or `key`.
    Datacomp,
    /// img2dataset parquet output: `jpg` (or `webp`/`png`), `caption`, `key`.
    Img2dataset,
    /// Hugging Face `datasets` export: an `image` struct `{bytes, path}`,
    /// `text` or `caption`, optional `id`/`image_id`.
    Hf,
}

/// What the user said about columns and images (CLI flags `--image-col`,
/// `--caption-col`, `--key-col`, `--preset`, `--image-root`, and the image
/// limits).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct ColumnOptions {
    /// Explicit image column; wins over preset and detection.
    pub image_col: Option<String>,
    /// Explicit caption column; wins over preset and detection.
    pub caption_col: Option<String>,
    /// Explicit key column; wins over preset and detection.
    pub key_col: Option<String>,
    /// Column-name preset, used where no explicit column is given.
    pub preset: Option<Preset>,
    /// Directory that relative image paths are resolved against (default:
    /// the directory of the parquet file that holds the path).
    pub image_root: Option<PathBuf>,
    /// Which image paths are read, and how large an image may be (for tar
    /// shards: how large an image member may be).
    pub image_limits: ImageLimits,
    /// Where a tar sample's caption comes from (`--caption-from`; tar
    /// shards only, default `txt`).
    #[serde(default)]
    pub caption_from: Option<CaptionFrom>,
    /// Where a tar sample's key comes from (`--key-from`; tar shards only,
    /// default the member name).
    #[serde(default)]
    pub key_from: Option<KeyFrom>,
    /// Search directories' subdirectories for input files too
    /// (`--recursive`).
    #[serde(default)]
    pub recursive: bool,
    /// Explicit text-embedding column (`--text-emb-col`); wins over preset
    /// and detection. Not serialised when absent, so the options' hash
    /// (`score --out-dir` markers) stays what it was before the flag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text_emb_col: Option<String>,
    /// Whether a text-embedding column is resolved and read at all.
    #[serde(default, skip_serializing_if = "TextEmbeddings::is_ignore")]
    pub text_embeddings: TextEmbeddings,
}

/// Whether the input's text-embedding column is looked for. It is read
/// only when the text side uses it (`--text-encoder precomputed`): a
/// defective value in a column nobody uses must not skip its row.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TextEmbeddings {
    /// Not looked for (captions are encoded by a text tower).
    #[default]
    Ignore,
    /// Used when present (`inspect` shows what is there).
    IfPresent,
    /// Must be present: the text side reads it.
    Require,
}

impl TextEmbeddings {
    fn is_ignore(&self) -> bool {
        *self == TextEmbeddings::Ignore
    }
}

impl ColumnOptions {
    /// How directories and globs among the inputs are searched.
    pub fn discovery(&self) -> Discovery {
        Discovery {
            recursive: self.recursive,
        }
    }
}

/// How an input file stores its pairs.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileFormat {
    /// A parquet file; its columns are the set's [`ColumnMap`].
    Parquet,
    /// A webdataset tar shard (`KEY.jpg` + `KEY.txt` [+ `KEY.json`] per
    /// sample), seen as a table of key, image, caption and json, its
    /// members mapped by the layout.
    Webdataset(TarLayout),
}

/// How the image is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ImageKind {
    /// Encoded image bytes (Binary / LargeBinary / BinaryView).
    Bytes,
    /// A Hugging Face `Image` struct `{bytes, path}`.
    BytesPathStruct,
    /// A string path, relative to the parquet file's directory or
    /// `image_root`.
    Path,
    /// A precomputed embedding: List / LargeList / FixedSizeList of
    /// Float32 or Float64.
    Embedding,
}

/// The resolved columns.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ColumnMap {
    /// Name of the image column.
    pub image: String,
    /// How that column stores the image.
    pub image_kind: ImageKind,
    /// Name of the caption column.
    pub caption: String,
    /// Name of the key column; `None` means keys are `<file stem>:<row>`.
    pub key: Option<String>,
    /// Name of the precomputed text-embedding column (`list<float>`), when
    /// the text side reads one (`--text-encoder precomputed`). The caption
    /// column stays: labels, filters and reports show it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text_embedding: Option<String>,
}

/// One validated input file.
#[derive(Debug, Clone)]
pub struct InputFile {
    /// The path as expanded from the user's input (not canonicalised, so
    /// labels show what the user typed).
    pub path: PathBuf,
    /// Rows according to the footer (parquet), or samples according to a
    /// scan of the headers (tar).
    pub num_rows: usize,
    /// Arrow schema of the whole file (of a tar shard seen as a table).
    pub schema: arrow_schema::SchemaRef,
    /// How the file stores its pairs.
    pub format: FileFormat,
}

/// A validated set of input files sharing one column map.
#[derive(Debug, Clone)]
pub struct InputSet {
    /// The files, in the order their rows are streamed.
    pub files: Vec<InputFile>,
    /// Columns shared by every file.
    pub columns: ColumnMap,
    /// Where relative image paths are resolved, if not next to the file.
    pub image_root: Option<PathBuf>,
    /// Which image paths are read and how large an image may be; the
    /// readers of image files and the decoders apply them.
    pub image_limits: ImageLimits,
    /// Expected embedding length for [`ImageKind::Embedding`] inputs: the
    /// fixed size of a FixedSizeList column, otherwise the most common length
    /// among the first rows of the first file. Rows of another length are
    /// reported as problems, so one truncated row cannot redefine the
    /// dimension for the rest. `None` for other image kinds.
    pub embedding_dim: Option<usize>,
    /// Expected length of the text embeddings in
    /// [`ColumnMap::text_embedding`], settled like `embedding_dim`; `None`
    /// when no text-embedding column is read.
    pub text_embedding_dim: Option<usize>,
    /// [`InputSet::fingerprint`], once computed: `fit` needs it for its
    /// epoch checkpoints and again for the labels' metadata, and it reads
    /// every input byte.
    pub(crate) fingerprint: std::sync::OnceLock<String>,
}

/// An image value as read, before decoding (decoding is the encoders'
/// business).
#[derive(Debug, Clone, PartialEq)]
pub enum ImageValue {
    /// Encoded image bytes.
    Bytes(Vec<u8>),
    /// A resolved path, inside the image base unless
    /// `--allow-absolute-paths`; it may not exist (reading it reports that).
    Path(PathBuf),
    /// A precomputed embedding, all values finite, of `embedding_dim` length.
    Embedding(Vec<f32>),
}

/// One image–caption pair as read.
///
/// `problem` is set when the row is unusable (null/empty caption, null image,
/// NaN/inf or wrong-length embedding, ...): such rows are reported, never
/// dropped silently.
#[derive(Debug, Clone)]
pub struct PairRow {
    /// Index into [`InputSet::files`].
    pub source_file: usize,
    /// Row index inside that file.
    pub source_row: usize,
    /// The key column's value as a string (integers in decimal), or
    /// `<file stem>:<row>` when there is no key column or the key is null.
    pub key: String,
    /// The image, when the row has a usable one.
    pub image: Option<ImageValue>,
    /// The caption as stored (empty when null).
    pub caption: String,
    /// The precomputed text embedding, when the set reads a text-embedding
    /// column and this row's is usable (finite, of the set's length).
    pub text_embedding: Option<Vec<f32>>,
    /// Why the row cannot be used, in words for the user.
    pub problem: Option<String>,
}
