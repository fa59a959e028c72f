//! Rows → head inputs, in one pass over the data.
//!
//! Every tower takes its images through one path ([`ImagePath`]): the pass
//! streams the input once, and for each batch hands the rows to the frozen
//! towers' feature extraction (which decodes, encodes and caches each
//! distinct image and caption) and decodes the rows' images for the demo
//! CNN or checks the embedding column. Once the pass is done, the rows that
//! every side could use become the pairs, in input order.

use ncclean_models::preprocess::{rgb_square, rgb_square_working_bytes};
use ncclean_models::vocab::Vocab;
use ncclean_models::{
    ImageInputs, ImageTowerConfig, LocalFeatures, PairInputs, TextInputs, TextTowerConfig,
};
use ncclean_pipelines::{Observer, TrainConfig};

use candle_core::Device;

use crate::data::images::{self, ImageLimits};
use crate::data::READ_BATCH_ROWS;
use crate::data::{ImageKind, ImageValue, InputSet, PairRow};
use crate::error::{invalid, Error, Result};
use crate::runtime::parallel::parallel_map;
use crate::runtime::progress::Reporter;
use crate::towers::encoders::{EncoderSpec, ImageEncoder, ImageTower, TextEncoder, TextTower};
use crate::towers::features::{self, CacheOptions, Extraction, SideFeatures};

/// Vocabulary limits of the demo text tower.
const VOCAB_MIN_COUNT: usize = 1;
const VOCAB_MAX_SIZE: usize = 30_000;
const VOCAB_MAX_LEN: usize = 48;
/// Marks a row without a decoded image.
const NO_SLOT: u32 = u32::MAX;

/// Where a prepared pair came from, and why it is unusable if it is.
#[derive(Debug, Clone)]
pub struct RowRecord {
    /// Key as carried through from the input.
    pub key: String,
    /// Index of the input file.
    pub file: usize,
    /// Row inside that file.
    pub row: usize,
    /// Why the row was skipped; `None` for usable rows.
    pub error: Option<String>,
}

/// Every input row, and encoder inputs for the usable ones.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// One record per input row, in input order.
    pub rows: Vec<RowRecord>,
    /// Indices into `rows` of the usable pairs, aligned with `inputs`.
    pub ok: Vec<usize>,
    /// Encoder inputs of the usable pairs.
    pub inputs: PairInputs,
    /// Identity of each usable pair's image (a hash of its bytes), aligned
    /// with `ok`: retrieval groups the captions of one image by it.
    pub image_ids: Vec<u64>,
}

impl Prepared {
    /// Number of skipped rows.
    pub fn skipped(&self) -> usize {
        self.rows.len() - self.ok.len()
    }

    /// Usable pairs of each of the `files` input files (the shards scoring
    /// statistics stay within; usable pairs come in file order).
    pub fn shard_sizes(&self, files: usize) -> Vec<usize> {
        let mut sizes = vec![0; files];
        for &i in &self.ok {
            if let Some(s) = sizes.get_mut(self.rows[i].file) {
                *s += 1;
            }
        }
        sizes
    }
}

/// Inputs for the matching head and the tower shapes they imply.
pub struct PreparedRun {
    /// Rows and head inputs.
    pub prepared: Prepared,
    /// Image side of the model config.
    pub image: ImageTowerConfig,
    /// Text side of the model config.
    pub text: TextTowerConfig,
    /// Vocabulary of the demo text tower, when it is used.
    pub vocab: Option<Vocab>,
}

/// How the images of rows become head inputs.
#[derive(Debug, Clone, Copy, PartialEq)]
enum ImagePath {
    /// The demo CNN trains on square RGB pixels of this side, decoded here.
    Pixels { size: usize },
    /// An embedding column of this width, used as it is.
    Column { dim: usize },
    /// A frozen tower: the feature extraction decodes, encodes and caches.
    Tower,
}

/// How the captions of rows become head inputs.
#[derive(Debug, Clone, Copy, PartialEq)]
enum TextPath {
    /// The demo bag of words trains on the captions' tokens.
    Tokens,
    /// A text-embedding column of this width, used as it is.
    Column { dim: usize },
    /// A frozen tower: the feature extraction encodes and caches.
    Tower,
}

/// One decoded image: demo CNN pixels or an embedding.
#[derive(Debug, Clone, PartialEq)]
enum ImageOut {
    Pixels(Vec<u8>),
    Embedding(Vec<f32>),
}

/// Decode `bytes` to the demo CNN's `size × size` pixels within `limits`.
fn demo_pixels(
    bytes: &[u8],
    size: usize,
    limits: &ImageLimits,
) -> std::result::Result<ImageOut, String> {
    let size = size as u32;
    images::decode(
        bytes,
        limits,
        |w, h| rgb_square_working_bytes(w, h, size),
        |img| ImageOut::Pixels(rgb_square(img, size)),
    )
}

/// Decode one image value for `path` (pixels or a checked embedding), or
/// say why it cannot be used. Frozen towers decode in the extraction.
fn decode_image(
    value: &ImageValue,
    path: ImagePath,
    limits: &ImageLimits,
) -> std::result::Result<ImageOut, String> {
    match (value, path) {
        (ImageValue::Bytes(b), ImagePath::Pixels { size }) => demo_pixels(b, size, limits),
        (ImageValue::Path(p), ImagePath::Pixels { size }) => {
            let bytes = images::read_file(p, limits.max_bytes)?;
            demo_pixels(&bytes, size, limits).map_err(|e| format!("{}: {e}", p.display()))
        }
        (ImageValue::Embedding(v), ImagePath::Column { dim }) => {
            if v.len() != dim {
                Err(format!(
                    "embedding has {} values, the model expects {dim}",
                    v.len()
                ))
            } else {
                Ok(ImageOut::Embedding(v.clone()))
            }
        }
        (ImageValue::Embedding(_), ImagePath::Pixels { .. }) => {
            Err("row holds an embedding but the model expects image pixels".into())
        }
        (_, ImagePath::Column { .. }) => {
            Err("row holds an image but the model expects a precomputed embedding".into())
        }
        (_, ImagePath::Tower) => Err("frozen towers decode in the feature extraction".into()),
    }
}

/// Decode the images of a batch on all cores, preserving order; rows
/// already known to be unusable are not decoded. Memory stays within
/// `limits`' decode budget whatever the number of cores (see
/// [`crate::data::images`]).
fn decode_batch(
    batch: &[PairRow],
    path: ImagePath,
    limits: &ImageLimits,
) -> Vec<std::result::Result<ImageOut, String>> {
    let values: Vec<Option<&ImageValue>> = batch
        .iter()
        .map(|r| r.image.as_ref().filter(|_| r.problem.is_none()))
        .collect();
    parallel_map(&values, |v| match v {
        // A decoder bug on one malformed image must not end the whole run.
        Some(v) => std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            decode_image(v, path, limits)
        }))
        .unwrap_or_else(|_| Err("the image decoder crashed on this image".to_string())),
        None => Err("no image".to_string()),
    })
}

/// A 64-bit identity of an image value (FNV-1a over its bytes or path;
/// an embedding's bits through [`ncclean_models::inputs::row_hash`], whose
/// lanes vectorise where one FNV chain a byte took 0.7 s on one core for
/// 200,000 512-d rows), so identical images share an id. Ids live only as
/// long as the run (they group the captions of one image for
/// `eval --retrieval`).
pub fn image_identity(v: &ImageValue) -> u64 {
    let fnv = |bytes: &[u8]| {
        let mut h = ncclean_models::hash::Fnv::default();
        h.bytes(bytes);
        h.finish()
    };
    match v {
        ImageValue::Bytes(b) => fnv(b),
        ImageValue::Path(p) => fnv(p.to_string_lossy().as_bytes()),
        ImageValue::Embedding(e) => ncclean_models::inputs::row_hash(e),
    }
}

/// What one pass over the rows keeps.
#[derive(Default)]
struct Pass {
    /// One record per row; `error` holds what the pass already knows (the
    /// reader's problem, or why [`decode_image`] failed).
    rows: Vec<RowRecord>,
    /// Per row: which entry of `pixels` / `embeddings` is its image, or
    /// [`NO_SLOT`] (always for frozen towers).
    slots: Vec<u32>,
    /// Decoded demo-CNN images in row order.
    pixels: Vec<u8>,
    /// Checked column embeddings in row order.
    embeddings: Vec<f32>,
    /// Number of entries in `pixels` / `embeddings`.
    decoded: usize,
    /// Per row: [`image_identity`] of its decoded image, else 0.
    ids: Vec<u64>,
    /// Per row: the caption, when the demo vocabulary needs it (else empty).
    captions: Vec<String>,
    /// Per row: which entry of `text_embeddings` is its text embedding, or
    /// [`NO_SLOT`].
    text_slots: Vec<u32>,
    /// Text embeddings of the rows usable so far, in row order (only for
    /// [`TextPath::Column`]): the only per-pair text memory, 4 × dim bytes.
    text_embeddings: Vec<f32>,
    /// Number of entries in `text_embeddings`.
    text_count: usize,
}

/// Stream every row of `input` once: frozen towers see each batch through
/// `extraction`, other images are decoded for `path`, and with `keep` the
/// images, and the captions or text embeddings that `text` reads, are
/// kept. Memory is bounded by one read batch plus what is kept.
// Each argument is one part of the pass (what to read, how many rows, where
// images and captions go, what to keep, how to report).
#[allow(clippy::too_many_arguments)]
fn read_pass(
    input: &InputSet,
    batches: impl Iterator<Item = Result<Vec<PairRow>>>,
    n: usize,
    path: ImagePath,
    text: TextPath,
    mut extraction: Option<&mut Extraction>,
    keep: bool,
    rep: &Reporter,
) -> Result<Pass> {
    let keep_captions = keep && text == TextPath::Tokens;
    let keep_text_embeddings = keep && matches!(text, TextPath::Column { .. });
    let mut pass = Pass {
        rows: Vec::with_capacity(n),
        slots: Vec::with_capacity(n),
        ids: Vec::with_capacity(n),
        captions: Vec::with_capacity(n),
        text_slots: Vec::with_capacity(n),
        ..Pass::default()
    };
    let mut obs = rep.observer();
    obs.start("reading", n as u64);
    for batch in batches {
        let batch = batch?;
        crate::runtime::interrupt::check()?;
        if let Some(ex) = extraction.as_deref_mut() {
            ex.push(&batch)?;
        }
        let decoded = match path {
            ImagePath::Tower => Vec::new(),
            _ => decode_batch(&batch, path, &input.image_limits),
        };
        let mut decoded = decoded.into_iter();
        for r in &batch {
            let mut error = r.problem.clone();
            let (mut slot, mut id) = (NO_SLOT, 0);
            match decoded.next() {
                Some(Err(e)) if error.is_none() => error = Some(e),
                Some(Ok(img)) if error.is_none() => {
                    id = r.image.as_ref().map(image_identity).unwrap_or(0);
                    slot = pass.decoded as u32;
                    pass.decoded += 1;
                    if keep {
                        match img {
                            ImageOut::Pixels(p) => pass.pixels.extend_from_slice(&p),
                            ImageOut::Embedding(e) => pass.embeddings.extend_from_slice(&e),
                        }
                    }
                }
                _ => {}
            }
            pass.captions.push(if keep_captions && error.is_none() {
                r.caption.clone()
            } else {
                String::new()
            });
            let mut text_slot = NO_SLOT;
            if let (true, None, Some(t)) = (keep_text_embeddings, &error, &r.text_embedding) {
                text_slot = pass.text_count as u32;
                pass.text_count += 1;
                pass.text_embeddings.extend_from_slice(t);
            }
            pass.text_slots.push(text_slot);
            pass.slots.push(slot);
            pass.ids.push(id);
            pass.rows.push(RowRecord {
                key: r.key.clone(),
                file: r.source_file,
                row: r.source_row,
                error,
            });
        }
        obs.advance(batch.len() as u64);
    }
    obs.finish();
    Ok(pass)
}

/// The entries `slots` (increasing) of a table of `count` entries of equal
/// width, in order. When every entry is taken the table is returned as it
/// is, without a copy.
fn take_slots<T: Copy>(table: Vec<T>, count: usize, slots: &[u32]) -> Vec<T> {
    if slots.len() == count {
        return table;
    }
    let width = table.len() / count.max(1);
    let mut out = Vec::with_capacity(slots.len() * width);
    for &s in slots {
        let s = s as usize;
        out.extend_from_slice(&table[s * width..(s + 1) * width]);
    }
    out
}

/// Check every row the way `fit` would (decoding every image) without
/// keeping anything: the per-row usability report of `ncclean inspect`.
pub fn scan(input: &InputSet, rep: &Reporter) -> Result<Vec<RowRecord>> {
    let path = match input.columns.image_kind {
        ImageKind::Embedding => ImagePath::Column {
            dim: input.embedding_dim.unwrap_or(0),
        },
        _ => ImagePath::Pixels { size: 8 },
    };
    let rows = input.pairs(READ_BATCH_ROWS);
    Ok(read_pass(
        input,
        rows,
        input.num_rows(),
        path,
        TextPath::Tower,
        None,
        false,
        rep,
    )?
    .rows)
}

fn embedding_dim(input: &InputSet) -> Result<usize> {
    input
        .embedding_dim
        .ok_or_else(|| invalid("cannot tell the embedding length of the image column"))
}

/// Read `input` and turn it into head inputs for the towers in `enc`:
/// pixels / tokens for the trainable demo towers, cached frozen features for
/// pretrained towers, embedding columns as they are. With `want_local` the
/// frozen towers' local features are loaded too (the head or the method
/// needs them); an embedding column has none, which is an error then.
/// `vocab` is the demo text tower's vocabulary (built from the usable
/// captions when `None`).
#[allow(clippy::too_many_arguments)]
pub fn prepare_for(
    input: &InputSet,
    enc: &EncoderSpec,
    cfg: &TrainConfig,
    want_local: bool,
    vocab: Option<&Vocab>,
    cache: &CacheOptions,
    device: &Device,
    rep: &Reporter,
) -> Result<PreparedRun> {
    let p = Preparer::new(input, enc, cfg, want_local, cache, device)?;
    p.prepare(input.pairs(READ_BATCH_ROWS), input.num_rows(), vocab, rep)
}

/// How the rows of one input become head inputs for one set of towers
/// (loaded once): [`prepare_for`] prepares all rows in one pass; a caller
/// that streams a large file prepares it a stretch of rows at a time.
pub struct Preparer<'a> {
    input: &'a InputSet,
    cfg: &'a TrainConfig,
    want_local: bool,
    cache: &'a CacheOptions,
    device: Device,
    itower: Option<ImageTower>,
    ttower: Option<TextTower>,
    path: ImagePath,
    text: TextPath,
}

impl<'a> Preparer<'a> {
    /// Load the towers of `enc` and choose the image path for `input`
    /// (see [`prepare_for`] for the arguments).
    pub fn new(
        input: &'a InputSet,
        enc: &EncoderSpec,
        cfg: &'a TrainConfig,
        want_local: bool,
        cache: &'a CacheOptions,
        device: &Device,
    ) -> Result<Preparer<'a>> {
        let (itower, ttower) = if enc.uses_towers() {
            if enc.image == ImageEncoder::DemoCnn {
                return Err(Error::Usage(
                    "--image-encoder demo-cnn trains from pixels and cannot be combined with a pretrained text tower; \
                     use mobilenet_v2, clip or precomputed"
                        .into(),
                ));
            }
            (
                ImageTower::load(enc, device)?,
                TextTower::load(enc, device)?,
            )
        } else {
            (None, None)
        };
        // Without towers the demo CNN trains on pixels unless the data holds
        // embeddings; with pretrained towers an image side without a tower
        // must be an embedding column.
        let column = match (&itower, input.columns.image_kind) {
            (Some(_), _) => false,
            (None, ImageKind::Embedding) => true,
            (None, _) => enc.uses_towers(),
        };
        if want_local && column {
            return Err(no_local_features(input));
        }
        let text = if enc.text == TextEncoder::Precomputed {
            if want_local {
                return Err(no_local_text_features(input));
            }
            TextPath::Column {
                dim: text_embedding_dim(input)?,
            }
        } else if ttower.is_some() {
            TextPath::Tower
        } else {
            TextPath::Tokens
        };
        let path = if itower.is_some() {
            ImagePath::Tower
        } else if column {
            ImagePath::Column {
                dim: embedding_dim(input)?,
            }
        } else {
            ImagePath::Pixels {
                size: cfg.image_size,
            }
        };
        Ok(Preparer {
            input,
            cfg,
            want_local,
            cache,
            device: device.clone(),
            itower,
            ttower,
            path,
            text,
        })
    }

    fn extraction(&self, rows: usize) -> Result<Option<Extraction<'_>>> {
        if self.itower.is_none() && self.ttower.is_none() {
            return Ok(None);
        }
        Ok(Some(Extraction::new(
            self.input,
            rows,
            self.itower.as_ref(),
            self.ttower.as_ref(),
            self.want_local,
            self.cache,
            &self.device,
        )?))
    }

    /// Read `batches` (the next `rows` rows) once through the frozen
    /// towers' extraction, keeping head inputs with `keep`: the pass and the
    /// towers' features of the rows.
    fn pass(
        &self,
        batches: impl Iterator<Item = Result<Vec<PairRow>>>,
        rows: usize,
        keep: bool,
        rep: &Reporter,
    ) -> Result<(Pass, Option<SideFeatures>, Option<SideFeatures>)> {
        let mut extraction = self.extraction(rows)?;
        let pass = read_pass(
            self.input,
            batches,
            rows,
            self.path,
            self.text,
            extraction.as_mut(),
            keep,
            rep,
        )?;
        Ok(match extraction {
            Some(ex) => {
                let done = ex.finish(rep)?;
                (pass, done.image, done.text)
            }
            None => (pass, None, None),
        })
    }

    /// One pass over `batches` (the next `rows` rows of the input, in
    /// order): frozen towers encode into the feature cache or find their
    /// features there, and the rows become head inputs.
    pub fn prepare(
        &self,
        batches: impl Iterator<Item = Result<Vec<PairRow>>>,
        rows: usize,
        vocab: Option<&Vocab>,
        rep: &Reporter,
    ) -> Result<PreparedRun> {
        let (pass, image_features, text_features) = self.pass(batches, rows, true, rep)?;
        assemble(
            pass,
            self.path,
            self.text,
            image_features,
            text_features,
            vocab,
            self.cfg,
        )
    }

    /// Which of the `rows` rows of `batches` are usable pairs, as
    /// [`Preparer::prepare`] would decide, keeping no head inputs: frozen
    /// towers still encode into the feature cache, so a second pass over
    /// the same rows finds its features there.
    pub fn usable(
        &self,
        batches: impl Iterator<Item = Result<Vec<PairRow>>>,
        rows: usize,
        rep: &Reporter,
    ) -> Result<Vec<bool>> {
        let (pass, image, text) = self.pass(batches, rows, false, rep)?;
        Ok(pass
            .rows
            .iter()
            .enumerate()
            .map(|(row, rec)| row_error(rec, row, image.as_ref(), text.as_ref()).is_none())
            .collect())
    }
}

/// Why the `row`-th row of a pass is not a usable pair, if it is not: the
/// reader's or decoder's reason, else the image side's, else the text
/// side's (the order reasons are reported in).
fn row_error(
    rec: &RowRecord,
    row: usize,
    image_features: Option<&SideFeatures>,
    text_features: Option<&SideFeatures>,
) -> Option<String> {
    if rec.error.is_some() {
        return rec.error.clone();
    }
    if let Some(f) = image_features {
        if f.row(row).is_none() {
            return Some(
                f.errors
                    .get(row)
                    .cloned()
                    .flatten()
                    .unwrap_or_else(|| "image could not be encoded".to_string()),
            );
        }
    }
    if let Some(f) = text_features {
        if f.row(row).is_none() {
            return Some("caption could not be encoded".to_string());
        }
    }
    None
}

/// Turn the pass and the frozen towers' features into head inputs: a row
/// is a usable pair when the reader, the image side and the text side all
/// could use it (reasons are reported in that order). Each side's inputs
/// are then made apart ([`image_side`], [`text_side`]).
fn assemble(
    pass: Pass,
    path: ImagePath,
    text: TextPath,
    image_features: Option<SideFeatures>,
    text_features: Option<SideFeatures>,
    vocab: Option<&Vocab>,
    cfg: &TrainConfig,
) -> Result<PreparedRun> {
    let Pass {
        mut rows,
        slots,
        pixels,
        embeddings,
        decoded,
        ids,
        mut captions,
        text_slots,
        text_embeddings,
        text_count,
    } = pass;
    let mut ok = Vec::new();
    let mut image_ids = Vec::new();
    let mut img = Gathered::default();
    let mut txt = Gathered::default();
    for (row, rec) in rows.iter_mut().enumerate() {
        rec.error = row_error(rec, row, image_features.as_ref(), text_features.as_ref());
        if rec.error.is_some() {
            continue;
        }
        ok.push(row);
        match &image_features {
            Some(f) => {
                img.features
                    .extend_from_slice(f.row(row).unwrap_or_default());
                // The feature cache already identified the image by content.
                image_ids.push(f.index.get(row).map_or(0, |&i| u64::from(i)));
            }
            None => {
                img.slots.push(slots[row]);
                image_ids.push(ids[row]);
            }
        }
        match (text, &text_features) {
            (TextPath::Column { .. }, _) => txt.slots.push(text_slots[row]),
            (_, Some(f)) => txt
                .features
                .extend_from_slice(f.row(row).unwrap_or_default()),
            (_, None) => txt.captions.push(std::mem::take(&mut captions[row])),
        }
    }
    if txt.slots.contains(&NO_SLOT) {
        return Err(invalid("a usable pair has no text embedding"));
    }
    let image_table = ImageTable {
        pixels,
        embeddings,
        decoded,
    };
    let text_table = TextTable {
        embeddings: text_embeddings,
        count: text_count,
    };
    let (images, image) = image_side(path, image_features, &ok, img, image_table, cfg)?;
    let (texts, text, vocab) = text_side(text, text_features, &ok, txt, text_table, vocab, cfg)?;
    Ok(PreparedRun {
        prepared: Prepared {
            rows,
            ok,
            inputs: PairInputs { images, texts },
            image_ids,
        },
        image,
        text,
        vocab,
    })
}

/// One side's values of the usable pairs, gathered row by row.
#[derive(Default)]
struct Gathered {
    /// Slots into the pass's own table (pixels, or an embedding column).
    slots: Vec<u32>,
    /// Frozen-tower features, row after row.
    features: Vec<f32>,
    /// Captions, for the demo text tower.
    captions: Vec<String>,
}

/// The pass's image table: decoded pixels or embedding-column vectors.
struct ImageTable {
    pixels: Vec<u8>,
    embeddings: Vec<f32>,
    decoded: usize,
}

/// The pass's text-embedding column.
struct TextTable {
    embeddings: Vec<f32>,
    count: usize,
}

/// The image side's head inputs and tower config for the usable pairs
/// `ok`.
fn image_side(
    path: ImagePath,
    mut features: Option<SideFeatures>,
    ok: &[usize],
    gathered: Gathered,
    table: ImageTable,
    cfg: &TrainConfig,
) -> Result<(ImageInputs, ImageTowerConfig)> {
    // The local tables are moved, not copied: they are the bulk of the memory.
    let local = match features.as_mut() {
        Some(f) => pair_local(f, ok)?,
        None => None,
    };
    Ok(match (path, &features) {
        (ImagePath::Pixels { size }, _) => (
            ImageInputs::Pixels {
                data: take_slots(table.pixels, table.decoded, &gathered.slots),
                size,
            },
            ImageTowerConfig::DemoCnn {
                image_size: size,
                width: cfg.cnn_width,
            },
        ),
        (ImagePath::Column { dim }, _) => (
            ImageInputs::Embeddings {
                data: take_slots(table.embeddings, table.decoded, &gathered.slots),
                dim,
                local: None,
            },
            ImageTowerConfig::Precomputed {
                dim,
                local_dim: None,
            },
        ),
        (ImagePath::Tower, Some(f)) => {
            let local_dim = local.as_ref().map(|l| l.dim);
            (
                ImageInputs::Embeddings {
                    data: gathered.features,
                    dim: f.dim,
                    local,
                },
                ImageTowerConfig::Precomputed {
                    dim: f.dim,
                    local_dim,
                },
            )
        }
        (ImagePath::Tower, None) => {
            return Err(invalid("the image tower returned no features"));
        }
    })
}

/// The text side's head inputs, tower config and (for the demo text tower)
/// vocabulary for the usable pairs `ok`: `vocab` when given (scoring),
/// else built over their captions (fit).
fn text_side(
    text: TextPath,
    mut features: Option<SideFeatures>,
    ok: &[usize],
    gathered: Gathered,
    table: TextTable,
    vocab: Option<&Vocab>,
    cfg: &TrainConfig,
) -> Result<(TextInputs, TextTowerConfig, Option<Vocab>)> {
    let local = match features.as_mut() {
        Some(f) => pair_local(f, ok)?,
        None => None,
    };
    Ok(match (text, &features) {
        (TextPath::Column { dim }, _) => (
            TextInputs::Embeddings {
                data: take_slots(table.embeddings, table.count, &gathered.slots),
                dim,
                local: None,
            },
            TextTowerConfig::Precomputed {
                dim,
                local_dim: None,
            },
            None,
        ),
        (_, Some(f)) => {
            let local_dim = local.as_ref().map(|l| l.dim);
            (
                TextInputs::Embeddings {
                    data: gathered.features,
                    dim: f.dim,
                    local,
                },
                TextTowerConfig::Precomputed {
                    dim: f.dim,
                    local_dim,
                },
                None,
            )
        }
        (_, None) => {
            let captions = gathered.captions;
            let v = match vocab {
                Some(v) => v.clone(),
                None => Vocab::build(
                    captions.iter().map(String::as_str),
                    VOCAB_MIN_COUNT,
                    VOCAB_MAX_SIZE,
                    VOCAB_MAX_LEN,
                ),
            };
            let tokens = captions.iter().map(|c| v.encode(c)).collect();
            let text = TextTowerConfig::DemoBow {
                vocab_size: v.size(),
                dim: cfg.word_dim,
            };
            (TextInputs::Tokens(tokens), text, Some(v))
        }
    })
}

fn text_embedding_dim(input: &InputSet) -> Result<usize> {
    input.text_embedding_dim.ok_or_else(|| {
        invalid(format!(
            "{}: --text-encoder precomputed needs a list<float> text-embedding column; name it with --text-emb-col",
            input.display_name(0)
        ))
    })
}

fn no_local_text_features(input: &InputSet) -> Error {
    Error::Usage(format!(
        "{}: the GPO head and the recon method need local features (image regions and caption tokens), \
         but the text-embedding column {:?} holds one global embedding per caption. Encode the captions \
         with a frozen tower (--text-encoder minilm or clip) or the demo tower, or use --head mean with another method",
        input.display_name(0),
        input.columns.text_embedding.as_deref().unwrap_or("")
    ))
}

fn no_local_features(input: &InputSet) -> Error {
    Error::Usage(format!(
        "{}: the GPO head and the recon method need local features (image regions and caption tokens), \
         but image column {:?} holds global embeddings only. Train on images with a frozen tower \
         (--image-encoder mobilenet_v2 or clip) or the demo towers, or use --head mean with another method",
        input.display_name(0),
        input.columns.image
    ))
}

/// The local sets of the usable pairs (`rows`: their input rows), sharing
/// the distinct-item table of `f`; None when `f` has no local features.
fn pair_local(f: &mut SideFeatures, rows: &[usize]) -> Result<Option<LocalFeatures>> {
    let Some(l) = f.local.take() else {
        return Ok(None);
    };
    let index = rows
        .iter()
        .map(|&r| f.index.get(r).copied().filter(|&i| i != features::NONE))
        .collect::<Option<Vec<u32>>>()
        .ok_or_else(|| invalid("a usable pair has no cached local features"))?;
    let local = LocalFeatures {
        dim: l.dim,
        data: l.data,
        offsets: l.offsets,
        index,
    };
    local.check().map_err(invalid)?;
    Ok(Some(local))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_slots_moves_a_full_table_and_gathers_a_partial_one() {
        let table = vec![1, 1, 2, 2, 3, 3];
        assert_eq!(take_slots(table.clone(), 3, &[0, 1, 2]), table);
        assert_eq!(take_slots(table.clone(), 3, &[0, 2]), vec![1, 1, 3, 3]);
        assert!(take_slots(table, 3, &[]).is_empty());
        assert!(take_slots(Vec::<u8>::new(), 0, &[]).is_empty());
    }

    #[test]
    fn embeddings_are_checked_against_the_column_width() {
        let limits = ImageLimits::default();
        let column = ImagePath::Column { dim: 2 };
        assert_eq!(
            decode_image(&ImageValue::Embedding(vec![0.5, 1.0]), column, &limits),
            Ok(ImageOut::Embedding(vec![0.5, 1.0]))
        );
        assert_eq!(
            decode_image(&ImageValue::Embedding(vec![0.5]), column, &limits),
            Err("embedding has 1 values, the model expects 2".to_string())
        );
        assert!(decode_image(&ImageValue::Bytes(vec![1]), column, &limits)
            .unwrap_err()
            .contains("expects a precomputed embedding"));
        let pixels = ImagePath::Pixels { size: 4 };
        assert!(
            decode_image(&ImageValue::Embedding(vec![0.5]), pixels, &limits)
                .unwrap_err()
                .contains("expects image pixels")
        );
    }

    #[test]
    fn undecodable_images_say_why_and_name_the_file() {
        let limits = ImageLimits::default();
        let pixels = ImagePath::Pixels { size: 4 };
        assert!(decode_image(
            &ImageValue::Bytes(b"not an image".to_vec()),
            pixels,
            &limits
        )
        .is_err());
        let missing = std::path::PathBuf::from("/no/such/image.png");
        let e = decode_image(&ImageValue::Path(missing), pixels, &limits).unwrap_err();
        assert!(
            e.starts_with("cannot read image file /no/such/image.png"),
            "{e}"
        );
    }

    #[test]
    fn image_identity_follows_the_content() {
        let a = image_identity(&ImageValue::Bytes(vec![1, 2, 3]));
        assert_eq!(a, image_identity(&ImageValue::Bytes(vec![1, 2, 3])));
        assert_ne!(a, image_identity(&ImageValue::Bytes(vec![1, 2, 4])));
        let e = image_identity(&ImageValue::Embedding(vec![0.0, 1.0]));
        assert_ne!(e, image_identity(&ImageValue::Embedding(vec![1.0, 0.0])));
        // FNV-1a of no bytes is its offset basis.
        assert_eq!(
            image_identity(&ImageValue::Bytes(Vec::new())),
            0xCBF2_9CE4_8422_2325
        );
    }
}
