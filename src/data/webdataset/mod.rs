//! Webdataset tar shards, as img2dataset (`--output_format webdataset`) and
//! webdataset's `TarWriter` write them: per sample `KEY.jpg` (or `.jpeg`,
//! `.png`, `.webp`), `KEY.txt` with the caption and optionally `KEY.json`
//! with its metadata (`key`, `url`, sizes...).
//!
//! Shards are read straight from the tar, never extracted: a header scan
//! counts the samples when the input is opened, and [`SampleStream`] reads
//! the members a sample needs as the tar comes, a window of samples at a
//! time (see [`group`]). Every sample becomes one row; a sample that cannot
//! be used (an image member over `--max-image-bytes`, no caption, a member
//! cut short by a truncated tar, a name with `..` or a leading `/`, a key
//! that repeats) becomes a row with a problem, never an error. A damaged
//! stretch of a tar is passed over to the next valid header, as GNU tar
//! does, and becomes a row of its own keyed `<shard file name>@<byte>`.
//!
//! Seen as a table, a shard has the columns of [`schema`]: that is what
//! `ncclean filter --format parquet` writes and what `corrupt` reads.

mod group;
mod tar;
mod write;

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{ArrayRef, BinaryArray, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};

use self::group::{climbs_out, split_name, Grouper, Lost, Sample, WINDOW};
use self::tar::{Entry, Member, TarReader};
use super::PairRow;
use super::{ColumnMap, ColumnOptions, FileFormat, ImageKind, ImageValue, InputFile, InputSet};
use crate::data::images::human_bytes;
use crate::error::{invalid, Error, Result};

pub(crate) use write::write_filtered_parquet;
pub use write::{write_filtered_tar, write_filtered_tar_shard};

/// Largest caption (`.txt`) or metadata (`.json`) member read: captions are
/// sentences and metadata a few fields, so anything larger is not one.
pub const MAX_TEXT_MEMBER_BYTES: u64 = 1 << 20;
/// Image member extensions, in the order webdataset tools name them.
const IMAGE_EXTENSIONS: &[&str] = &["jpg", "jpeg", "png", "webp"];

/// Where a sample's caption comes from (`--caption-from`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CaptionFrom {
    /// The `KEY.txt` member.
    #[default]
    Txt,
    /// A string field of the `KEY.json` member.
    Json(String),
}

/// Where a sample's key comes from (`--key-from`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyFrom {
    /// The member name up to the first dot of its file name.
    #[default]
    Name,
    /// A string or number field of the `KEY.json` member; samples without it
    /// keep their member name.
    Json(String),
}

/// `txt` or `json:FIELD`.
impl std::str::FromStr for CaptionFrom {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match json_field(s) {
            Some(f) => Ok(CaptionFrom::Json(f)),
            None if s == "txt" => Ok(CaptionFrom::Txt),
            None => Err(format!(
                "expected txt or json:FIELD (e.g. json:caption), got {s:?}"
            )),
        }
    }
}

/// `name` or `json:FIELD`.
impl std::str::FromStr for KeyFrom {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match json_field(s) {
            Some(f) => Ok(KeyFrom::Json(f)),
            None if s == "name" => Ok(KeyFrom::Name),
            None => Err(format!(
                "expected name or json:FIELD (e.g. json:key), got {s:?}"
            )),
        }
    }
}

fn json_field(s: &str) -> Option<String> {
    s.strip_prefix("json:")
        .filter(|f| !f.is_empty())
        .map(str::to_string)
}

impl std::fmt::Display for CaptionFrom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CaptionFrom::Txt => write!(f, "the KEY.txt member"),
            CaptionFrom::Json(field) => write!(f, "field \"{field}\" of the KEY.json member"),
        }
    }
}

impl std::fmt::Display for KeyFrom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyFrom::Name => write!(f, "the member name (KEY of KEY.jpg)"),
            KeyFrom::Json(field) => write!(
                f,
                "field \"{field}\" of the KEY.json member, else the member name"
            ),
        }
    }
}

/// How the members of a shard's samples map to an image–caption pair.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TarLayout {
    /// Where the caption comes from.
    pub caption: CaptionFrom,
    /// Where the key comes from.
    pub key: KeyFrom,
}

/// Whether `path` names a tar shard (by its `.tar` extension).
pub(crate) fn is_tar(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("tar"))
}

/// The columns a shard has when seen as a table: the sample key, the image
/// member's bytes, the caption and the raw `.json` metadata.
pub fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("key", DataType::Utf8, false),
        Field::new("image", DataType::Binary, true),
        Field::new("caption", DataType::Utf8, true),
        Field::new("json", DataType::Utf8, true),
    ]))
}

/// The column map of [`schema`].
fn column_map() -> ColumnMap {
    ColumnMap {
        image: "image".into(),
        image_kind: ImageKind::Bytes,
        caption: "caption".into(),
        key: Some("key".into()),
        text_embedding: None,
    }
}

/// Open tar shards as an [`InputSet`]: one header scan per shard counts its
/// samples. Column flags meant for parquet are refused, so that a user who
/// passes them learns they do nothing here.
pub(crate) fn open_set(paths: Vec<PathBuf>, opts: &ColumnOptions) -> Result<InputSet> {
    for (flag, given) in [
        ("--image-col", opts.image_col.is_some()),
        ("--caption-col", opts.caption_col.is_some()),
        ("--key-col", opts.key_col.is_some()),
        ("--preset", opts.preset.is_some()),
        ("--image-root", opts.image_root.is_some()),
        ("--text-emb-col", opts.text_emb_col.is_some()),
    ] {
        if given {
            return Err(Error::Usage(format!(
                "{flag} applies to parquet inputs; for tar shards use --caption-from txt|json:FIELD and --key-from name|json:FIELD"
            )));
        }
    }
    if opts.text_embeddings == super::TextEmbeddings::Require {
        return Err(Error::Usage(
            "--text-encoder precomputed reads a text-embedding column, which tar shards do not have; \
             use parquet inputs with a list<float> column (e.g. text_emb) or another text encoder"
                .into(),
        ));
    }
    let layout = TarLayout {
        caption: opts.caption_from.clone().unwrap_or_default(),
        key: opts.key_from.clone().unwrap_or_default(),
    };
    let mut files = Vec::with_capacity(paths.len());
    for path in paths {
        let num_rows = count_samples(&path)?;
        files.push(InputFile {
            path,
            num_rows,
            schema: schema(),
            format: FileFormat::Webdataset(layout.clone()),
        });
    }
    let files = super::skip_empty(files, |f| f.num_rows, |f| &f.path).map_err(|p| {
        invalid(format!(
            "{}: holds no samples (an empty tar); expected a webdataset tar with KEY.jpg and KEY.txt members",
            p.display()
        ))
    })?;
    Ok(InputSet {
        files,
        columns: column_map(),
        image_root: None,
        image_limits: opts.image_limits,
        embedding_dim: None,
        text_embedding_dim: None,
        fingerprint: Default::default(),
    })
}

/// Samples in the shard at `path`, from its headers alone, stretches lost
/// to damage included (each is a row). A shard with no entries at all (an
/// empty tar, as img2dataset writes when every download of a shard fails)
/// has 0; one with entries but no sample (not a tar, or no member named
/// like a sample) is invalid input.
pub(crate) fn count_samples(path: &Path) -> Result<usize> {
    let mut reader = TarReader::open(path)?;
    let mut grouper: Grouper<()> = Grouper::default();
    let (mut entries, mut lost) = (0usize, 0usize);
    let mut damage = None;
    while let Some(entry) = reader.next_entry()? {
        entries += 1;
        match entry {
            Entry::File(m) => {
                if let Some((key, ext)) = split_name(&m.name) {
                    grouper.push(key, ext, &m.name, ());
                }
            }
            Entry::Other { .. } => {}
            Entry::Damaged { start, end, why } => {
                lost += 1;
                grouper.push_lost(
                    lost_key(path, start),
                    Lost {
                        start,
                        end,
                        why: why.clone(),
                    },
                );
                damage.get_or_insert(why);
            }
        }
    }
    if entries == 0 {
        return Ok(0);
    }
    if grouper.samples() == lost {
        return Err(invalid(match damage {
            Some(why) => format!(
                "{}: not a readable tar shard ({why}); expected a webdataset tar with KEY.jpg and KEY.txt members",
                path.display()
            ),
            None => format!(
                "{}: holds no samples; expected a webdataset tar with KEY.jpg and KEY.txt members",
                path.display()
            ),
        }));
    }
    Ok(grouper.samples())
}

/// The key of the row for bytes of `path` from `start` on that could not be
/// read: `<shard file name>@<byte offset>`. A member's key never has a dot
/// in its last path component, so this one cannot collide with one.
fn lost_key(path: &Path, start: u64) -> String {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    format!("{name}@{start}")
}

/// A member's data as read for a sample: `None` for members the layout
/// does not need (not read), else the bytes or why they could not be used.
type Payload = Option<std::result::Result<Vec<u8>, String>>;

/// One sample as read from a shard.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TarSample {
    /// Index of the sample in its shard.
    pub index: usize,
    /// The key, as [`TarLayout::key`] says.
    pub key: String,
    /// The image member's bytes, when usable.
    pub image: Option<Vec<u8>>,
    /// The caption, when there is one.
    pub caption: Option<String>,
    /// The `.json` member's text, when there is one in UTF-8.
    pub json: Option<String>,
    /// Why the sample cannot be used, in words for the user.
    pub problem: Option<String>,
}

impl TarSample {
    /// The sample as a row of file `file` of an input set.
    pub(crate) fn into_pair(self, file: usize) -> PairRow {
        PairRow {
            source_file: file,
            source_row: self.index,
            key: self.key,
            image: self.image.map(ImageValue::Bytes),
            caption: self.caption.unwrap_or_default(),
            text_embedding: None,
            problem: self.problem,
        }
    }
}

/// The samples of one shard, in order, read as the tar comes.
pub(crate) struct SampleStream {
    reader: TarReader,
    path: PathBuf,
    layout: TarLayout,
    max_image_bytes: u64,
    grouper: Grouper<Payload>,
    ready: VecDeque<Sample<Payload>>,
    /// Why the tar could not be read to its end, once that is known.
    damage: Option<String>,
    finished: bool,
}

impl SampleStream {
    /// Start reading the shard at `path`; image members larger than
    /// `max_image_bytes` are not read (their sample gets a problem).
    pub fn open(path: &Path, layout: &TarLayout, max_image_bytes: u64) -> Result<SampleStream> {
        Ok(SampleStream {
            reader: TarReader::open(path)?,
            path: path.to_path_buf(),
            layout: layout.clone(),
            max_image_bytes,
            grouper: Grouper::default(),
            ready: VecDeque::new(),
            damage: None,
            finished: false,
        })
    }

    /// The next sample, or `None` at the end of the shard.
    pub fn next_sample(&mut self) -> Result<Option<TarSample>> {
        loop {
            if let Some(s) = self.ready.pop_front() {
                return Ok(Some(self.finish_sample(s)));
            }
            if self.finished {
                return Ok(None);
            }
            match self.reader.next_entry()? {
                None => {
                    self.finished = true;
                    self.ready.extend(self.grouper.drain());
                }
                Some(Entry::Damaged { start, end, why }) => {
                    crate::runtime::progress::warn_once(&format!(
                        "{}: {why}; bytes {start}..{end} are passed over (the members there are lost; \
                         their row is keyed {}) and reading goes on at the next valid header",
                        self.path.display(),
                        lost_key(&self.path, start)
                    ));
                    let key = lost_key(&self.path, start);
                    let (_, closed) = self.grouper.push_lost(key, Lost { start, end, why });
                    self.ready.extend(closed);
                }
                Some(Entry::Other { .. }) => {}
                Some(Entry::File(m)) => {
                    let Some((key, ext)) = split_name(&m.name) else {
                        continue;
                    };
                    if let Some(have) = m.truncated {
                        let why = format!(
                            "the file ends inside member {} after {have} of its {} bytes (a truncated tar)",
                            m.name, m.size
                        );
                        crate::runtime::progress::warn_once(&format!(
                            "{}: {why}; the samples before it are read",
                            self.path.display()
                        ));
                        self.damage = Some(why);
                    }
                    let payload = self.payload(&m, key, &ext)?;
                    let (_, closed) = self.grouper.push(key, ext, &m.name, payload);
                    self.ready.extend(closed);
                }
            }
        }
    }

    /// Read `m` if its sample needs it and it is within bounds (members
    /// whose name climbs out of the directory are never read).
    fn payload(&mut self, m: &Member, key: &str, ext: &str) -> Result<Payload> {
        if climbs_out(key) {
            return Ok(None);
        }
        let has = |want: &dyn Fn(&str) -> bool| {
            self.grouper
                .open_sample(key, ext)
                .is_some_and(|s| s.members.iter().any(|(e, _, p)| want(e) && p.is_some()))
        };
        let is_image = |e: &str| IMAGE_EXTENSIONS.contains(&e);
        let (limit, over) = if is_image(ext) && !has(&is_image) {
            (
                self.max_image_bytes,
                format!("--max-image-bytes ({})", human_bytes(self.max_image_bytes)),
            )
        } else if (ext == "txt" && self.layout.caption == CaptionFrom::Txt && !has(&|e| e == "txt"))
            // The metadata is always read: parquet output carries it.
            || (ext == "json" && !has(&|e| e == "json"))
        {
            (
                MAX_TEXT_MEMBER_BYTES,
                format!(
                    "the {} limit for caption and metadata members",
                    human_bytes(MAX_TEXT_MEMBER_BYTES)
                ),
            )
        } else {
            return Ok(None);
        };
        if let Some(have) = m.truncated {
            return Ok(Some(Err(format!(
                "member {} is cut short: the file ends after {have} of its {} bytes (a truncated tar)",
                m.name, m.size
            ))));
        }
        if m.size > limit {
            return Ok(Some(Err(format!(
                "member {} is {}, over {over}",
                m.name,
                human_bytes(m.size)
            ))));
        }
        Ok(Some(Ok(self.reader.read_data(m)?)))
    }

    /// Turn a closed sample into its row's values and problems.
    fn finish_sample(&self, s: Sample<Payload>) -> TarSample {
        if let Some(lost) = &s.lost {
            return TarSample {
                index: s.index,
                key: s.key.clone(),
                image: None,
                caption: None,
                json: None,
                problem: Some(format!(
                    "bytes {}..{} of the shard could not be read: {}; the members there are lost",
                    lost.start, lost.end, lost.why
                )),
            };
        }
        if climbs_out(&s.key) {
            let name = s
                .members
                .first()
                .map_or(s.key.as_str(), |(_, n, _)| n.as_str());
            return TarSample {
                index: s.index,
                key: s.key.clone(),
                image: None,
                caption: None,
                json: None,
                problem: Some(format!(
                    "member {name} has a name with '..' or a leading '/', which would be \
                     extracted outside the directory it is unpacked in; ncclean neither reads nor copies it \
                     (rename the members)"
                )),
            };
        }
        let member = |want: &dyn Fn(&str) -> bool| {
            s.members
                .iter()
                .find(|(e, _, p)| want(e) && p.is_some())
                .and_then(|(_, name, p)| p.as_ref().map(|p| (name.as_str(), p)))
        };
        let mut problems: Vec<String> = Vec::new();

        let image = match member(&|e| IMAGE_EXTENSIONS.contains(&e)) {
            None => {
                problems.push(format!(
                    "no image member ({}.jpg, .jpeg, .png or .webp)",
                    s.key
                ));
                None
            }
            Some((_, Err(e))) => {
                problems.push(e.clone());
                None
            }
            Some((name, Ok(b))) if b.is_empty() => {
                problems.push(format!("image member {name} is empty"));
                None
            }
            Some((_, Ok(b))) => Some(b.clone()),
        };

        let json_member = member(&|e| e == "json");
        let json_text = match json_member {
            Some((_, Ok(b))) => std::str::from_utf8(b).ok().map(str::to_string),
            _ => None,
        };
        let parsed: Option<std::result::Result<serde_json::Value, String>> =
            json_member.map(|(name, p)| match p {
                Err(e) => Err(e.clone()),
                Ok(b) => serde_json::from_slice(b)
                    .map_err(|e| format!("metadata member {name} is not valid JSON ({e})")),
            });

        let caption = match &self.layout.caption {
            CaptionFrom::Txt => caption_of_txt(member(&|e| e == "txt"), &s.key, &mut problems),
            CaptionFrom::Json(field) => {
                caption_of_json(parsed.as_ref(), field, &s.key, &mut problems)
            }
        };
        if caption.as_deref().is_some_and(|c| c.trim().is_empty()) {
            problems.push("caption is empty".into());
        }

        let key = match (&self.layout.key, &parsed) {
            (KeyFrom::Json(field), Some(Ok(v))) => match v.get(field) {
                Some(serde_json::Value::String(k)) => k.clone(),
                Some(serde_json::Value::Number(n)) => n.to_string(),
                _ => s.key.clone(),
            },
            _ => s.key.clone(),
        };

        if let Some(first) = s.repeats {
            problems.push(format!(
                "the key {} repeats: sample {first} of this shard already has a member {}.{}; \
                 each sample needs its own key (two samples are not merged)",
                s.key,
                s.key,
                s.members.first().map_or("", |(e, _, _)| e.as_str())
            ));
        }
        if !problems.is_empty() {
            if s.scattered {
                problems.push(format!(
                    "members keyed {} appear again more than {WINDOW} samples after the first ones; ncclean reads samples whose members lie together, as img2dataset and webdataset write them",
                    s.key
                ));
            }
            if let Some(d) = &self.damage {
                problems.push(format!("the shard is damaged after this sample: {d}"));
            }
        }
        TarSample {
            index: s.index,
            key,
            image,
            caption,
            json: json_text,
            problem: (!problems.is_empty()).then(|| problems.join("; ")),
        }
    }
}

/// A found member: its name and its bytes, or why they could not be read.
type Found<'a> = (&'a str, &'a std::result::Result<Vec<u8>, String>);

/// The caption of a sample from its `.txt` member; what is wrong goes to
/// `problems`.
fn caption_of_txt(txt: Option<Found<'_>>, key: &str, problems: &mut Vec<String>) -> Option<String> {
    match txt {
        None => {
            problems.push(format!("no caption member ({key}.txt)"));
            None
        }
        Some((_, Err(e))) => {
            problems.push(e.clone());
            None
        }
        Some((name, Ok(b))) => match std::str::from_utf8(b) {
            Ok(c) => Some(c.to_string()),
            Err(_) => {
                problems.push(format!("caption member {name} is not valid UTF-8"));
                None
            }
        },
    }
}

/// The caption of a sample from field `field` of its parsed `.json`
/// member; what is wrong goes to `problems`.
fn caption_of_json(
    parsed: Option<&std::result::Result<serde_json::Value, String>>,
    field: &str,
    key: &str,
    problems: &mut Vec<String>,
) -> Option<String> {
    match parsed {
        None => {
            problems.push(format!(
                "no metadata member ({key}.json) to take the caption from"
            ));
            None
        }
        Some(Err(e)) => {
            problems.push(e.clone());
            None
        }
        Some(Ok(v)) => match v.get(field).and_then(|c| c.as_str()) {
            Some(c) => Some(c.to_string()),
            None => {
                problems.push(format!(
                    "metadata member {key}.json has no string field \"{field}\""
                ));
                None
            }
        },
    }
}

/// Pairs of one shard, `batch_rows` at a time.
pub(crate) struct PairBatches {
    stream: SampleStream,
    file: usize,
}

impl PairBatches {
    /// Start on file `file` of `set`, which must be a tar shard.
    pub fn open(set: &InputSet, file: usize, layout: &TarLayout) -> Result<PairBatches> {
        let path = &set.files[file].path;
        Ok(PairBatches {
            stream: SampleStream::open(path, layout, set.image_limits.max_bytes)?,
            file,
        })
    }

    /// The next at most `n` pairs; `None` at the end of the shard.
    pub fn next_batch(&mut self, n: usize) -> Result<Option<Vec<PairRow>>> {
        let mut rows = Vec::new();
        while rows.len() < n.max(1) {
            crate::runtime::interrupt::check()?;
            match self.stream.next_sample()? {
                Some(s) => rows.push(s.into_pair(self.file)),
                None => break,
            }
        }
        Ok((!rows.is_empty()).then_some(rows))
    }
}

/// The samples of `shard` as record batches of [`schema`], `batch_rows` at a
/// time, with the sample index of each batch's first row. Unusable samples
/// come out with a null image or caption.
pub(crate) fn record_batches(
    path: &Path,
    layout: &TarLayout,
    max_image_bytes: u64,
    batch_rows: usize,
) -> Result<impl Iterator<Item = Result<(RecordBatch, Vec<usize>)>>> {
    let mut stream = SampleStream::open(path, layout, max_image_bytes)?;
    let mut done = false;
    Ok(std::iter::from_fn(move || {
        if done {
            return None;
        }
        let mut samples = Vec::new();
        while samples.len() < batch_rows.max(1) {
            match stream.next_sample() {
                Ok(Some(s)) => samples.push(s),
                Ok(None) => {
                    done = true;
                    break;
                }
                Err(e) => {
                    done = true;
                    return Some(Err(e));
                }
            }
        }
        if samples.is_empty() {
            return None;
        }
        let index = samples.iter().map(|s| s.index).collect();
        Some(samples_batch(&samples).map(|b| (b, index)))
    }))
}

/// Samples as one batch of [`schema`].
fn samples_batch(samples: &[TarSample]) -> Result<RecordBatch> {
    let key = StringArray::from_iter_values(samples.iter().map(|s| s.key.as_str()));
    let image: BinaryArray = samples.iter().map(|s| s.image.as_deref()).collect();
    let caption: StringArray = samples.iter().map(|s| s.caption.as_deref()).collect();
    let json: StringArray = samples.iter().map(|s| s.json.as_deref()).collect();
    let columns: Vec<ArrayRef> = vec![
        Arc::new(key),
        Arc::new(image),
        Arc::new(caption),
        Arc::new(json),
    ];
    RecordBatch::try_new(schema(), columns)
        .map_err(|e| anyhow::anyhow!("building a batch of tar samples: {e}").into())
}

#[cfg(test)]
mod tests;
