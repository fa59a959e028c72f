//! The extraction driver: stream the input once, decode and encode each
//! distinct image and caption that the cache does not hold yet, and return
//! every row's features.

use std::time::Instant;

use anyhow::Context;
use candle_core::{DType, Device, Tensor};
use ncclean_models::preprocess::ImagePreprocess;

use super::side::{Side, SideFeatures};
use super::store::{key_of, CacheOptions, Key};

use crate::data::images::{self, ImageLimits};
use crate::data::{ImageValue, InputSet, PairRow};
use crate::error::Result;
use crate::runtime::parallel::parallel_map;
use crate::runtime::progress::Reporter;
use crate::towers::encoders::{ImageTower, TextTower};

const IMAGE_BATCH: usize = 32;
const TEXT_BATCH: usize = 64;
/// Captions gathered before batching: each window is sorted by length and
/// cut into `TEXT_BATCH`es, so a batch pads to a length close to its own
/// captions' instead of the longest of 64 arbitrary ones (attention and
/// the feed-forward layers cost per padded token). Features are keyed by
/// content, so the encoding order changes no row's vector.
const TEXT_WINDOW: usize = 8 * TEXT_BATCH;

/// Features of both sides (either may be absent when that side's tower is
/// trainable or precomputed).
pub struct Extracted {
    /// Image side.
    pub image: Option<SideFeatures>,
    /// Text side.
    pub text: Option<SideFeatures>,
}

fn image_bytes(v: &ImageValue, limits: &ImageLimits) -> std::result::Result<Vec<u8>, String> {
    match v {
        ImageValue::Bytes(b) => Ok(b.clone()),
        ImageValue::Path(p) => images::read_file(p, limits.max_bytes),
        ImageValue::Embedding(_) => {
            Err("row holds an embedding but the image tower needs an image".into())
        }
    }
}

/// The cache key of an image: its content hash, plus the EXIF orientation
/// when the photo is stored rotated (decoding applies it), so features of
/// such a photo computed before orientation was applied are never reused.
fn image_key(bytes: &[u8], limits: &ImageLimits) -> Key {
    let key = key_of(bytes);
    match images::exif_orientation(bytes, limits) {
        None => key,
        Some(code) => key_of(&[&key[..], b"|exif-orientation=", &[code]].concat()),
    }
}

/// Feature extraction fed batch by batch with the rows of an input, in
/// order: distinct images and captions are decoded and encoded as the rows
/// arrive (or found in the cache), and [`Extraction::finish`] returns every
/// row's features.
pub struct Extraction<'a> {
    image: Option<(&'a ImageTower, ImagePreprocess)>,
    text: Option<&'a TextTower>,
    img: Option<Side>,
    txt: Option<Side>,
    pending_img: Vec<(Key, Vec<f32>)>,
    pending_txt: Vec<(Key, String)>,
    device: Device,
    /// Input row of the next batch's first row.
    base: usize,
    /// The input's limits on reading and decoding images.
    limits: ImageLimits,
}

impl<'a> Extraction<'a> {
    /// An extraction for `rows` rows of `input` (all of them, or the part
    /// of one file a caller streams) through the given towers, with local
    /// features when `want_local`.
    pub fn new(
        input: &InputSet,
        rows: usize,
        image: Option<&'a ImageTower>,
        text: Option<&'a TextTower>,
        want_local: bool,
        cache: &CacheOptions,
        device: &Device,
    ) -> Result<Extraction<'a>> {
        let root = cache.dir.as_ref();
        let img = match image {
            Some(t) => Some(Side::new(
                root,
                &format!("image|{}", t.cache_tag()),
                rows,
                false,
                want_local.then(|| t.local_dim()),
            )?),
            None => None,
        };
        let txt = match text {
            Some(t) => Some(Side::new(
                root,
                &format!("text|{}", t.cache_tag()),
                rows,
                true,
                want_local.then(|| t.local_dim()),
            )?),
            None => None,
        };
        Ok(Extraction {
            image: image.map(|t| (t, t.preprocess())),
            text,
            img,
            txt,
            pending_img: Vec::new(),
            pending_txt: Vec::new(),
            device: device.clone(),
            base: 0,
            limits: input.image_limits,
        })
    }

    /// Take the next batch of input rows: rows with a problem are passed
    /// over, new images and captions are queued and encoded in full batches.
    pub fn push(&mut self, batch: &[PairRow]) -> Result<()> {
        let base = self.base;
        if let (Some((tower, pre)), Some(side)) = (self.image.as_ref(), self.img.as_mut()) {
            let mut todo: Vec<(Key, Vec<u8>)> = Vec::new();
            for (k, r) in batch.iter().enumerate() {
                let Some(v) = r.image.as_ref().filter(|_| r.problem.is_none()) else {
                    continue;
                };
                match image_bytes(v, &self.limits) {
                    Err(e) => side.errors[base + k] = Some(e),
                    Ok(bytes) => {
                        let key = image_key(&bytes, &self.limits);
                        if side.assign(base + k, key) {
                            todo.push((key, bytes));
                        }
                    }
                }
            }
            let limits = &self.limits;
            // Memory stays within the decode budget whatever the number of
            // cores (see crate::data::images).
            let decoded = parallel_map(&todo, |(_, b)| {
                // A decoder bug on one malformed image must not end the whole run.
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    images::decode(
                        b,
                        limits,
                        |w, h| pre.working_bytes(w, h),
                        |img| pre.apply_image(&img),
                    )
                }))
                .unwrap_or_else(|_| Err("the image decoder crashed on this image".to_string()))
            });
            for ((key, _), d) in todo.into_iter().zip(decoded) {
                match d {
                    Ok(px) => self.pending_img.push((key, px)),
                    Err(e) => side.fail(key, e),
                }
            }
            while self.pending_img.len() >= IMAGE_BATCH {
                let chunk: Vec<_> = self.pending_img.drain(..IMAGE_BATCH).collect();
                encode_images(tower, pre.size as usize, &chunk, side, &self.device)?;
            }
        }
        if let (Some(tower), Some(side)) = (self.text, self.txt.as_mut()) {
            for (k, r) in batch.iter().enumerate() {
                if r.problem.is_none() {
                    let key = key_of(r.caption.as_bytes());
                    if side.assign(base + k, key) {
                        self.pending_txt.push((key, r.caption.clone()));
                    }
                }
            }
            while self.pending_txt.len() >= TEXT_WINDOW {
                let window: Vec<_> = self.pending_txt.drain(..TEXT_WINDOW).collect();
                encode_text_window(tower, window, side)?;
            }
        }
        self.base += batch.len();
        Ok(())
    }

    /// Encode what is still queued, close the cache shards and return every
    /// row's features.
    pub fn finish(mut self, rep: &Reporter) -> Result<Extracted> {
        if let (Some((tower, pre)), Some(side)) = (self.image.as_ref(), self.img.as_mut()) {
            if !self.pending_img.is_empty() {
                encode_images(
                    tower,
                    pre.size as usize,
                    &self.pending_img,
                    side,
                    &self.device,
                )?;
            }
        }
        if let (Some(tower), Some(side)) = (self.text, self.txt.as_mut()) {
            let window = std::mem::take(&mut self.pending_txt);
            encode_text_window(tower, window, side)?;
        }
        Ok(Extracted {
            image: self.img.map(|s| s.finish(rep, "images")).transpose()?,
            text: self.txt.map(|s| s.finish(rep, "captions")).transpose()?,
        })
    }
}

fn encode_images(
    tower: &ImageTower,
    size: usize,
    chunk: &[(Key, Vec<f32>)],
    side: &mut Side,
    device: &Device,
) -> Result<()> {
    let t = Instant::now();
    let mut flat = Vec::with_capacity(chunk.len() * 3 * size * size);
    for (_, px) in chunk {
        flat.extend_from_slice(px);
    }
    let x = Tensor::from_vec(flat, (chunk.len(), 3, size, size), device).context("image batch")?;
    let out = tower.forward(&x).context("image tower forward")?;
    let keys: Vec<Key> = chunk.iter().map(|c| c.0).collect();
    side.record(&keys, &out, &out.local, &[])?;
    side.seconds += t.elapsed().as_secs_f64();
    Ok(())
}

/// Encode a window of captions shortest first, `TEXT_BATCH` at a time.
fn encode_text_window(
    tower: &TextTower,
    mut window: Vec<(Key, String)>,
    side: &mut Side,
) -> Result<()> {
    // Byte length stands in for token count: close enough to group
    // captions of similar length without tokenising twice.
    window.sort_by_key(|(_, caption)| caption.len());
    for chunk in window.chunks(TEXT_BATCH) {
        encode_texts(tower, chunk, side)?;
    }
    Ok(())
}

fn encode_texts(tower: &TextTower, chunk: &[(Key, String)], side: &mut Side) -> Result<()> {
    let t = Instant::now();
    let refs: Vec<&str> = chunk.iter().map(|c| c.1.as_str()).collect();
    let out = tower.forward(&refs).context("text tower forward")?;
    let mask = out.mask.as_ref().context("text tower returned no mask")?;
    let m: Vec<Vec<f32>> = mask
        .to_dtype(DType::F32)
        .and_then(|m| m.to_vec2())
        .context("reading mask")?;
    // Keep only real tokens: local.f16 holds Σ lens × d values.
    let mut real = Vec::with_capacity(chunk.len());
    let mut lens = Vec::with_capacity(chunk.len());
    for (k, row) in m.iter().enumerate() {
        let n = row.iter().filter(|&&x| x > 0.5).count().max(1);
        lens.push(n as u16);
        real.push(
            out.local
                .get(k)
                .and_then(|t| t.narrow(0, 0, n))
                .context("token features")?,
        );
    }
    let local = Tensor::cat(&real, 0).context("token features")?;
    let keys: Vec<Key> = chunk.iter().map(|c| c.0).collect();
    side.record(&keys, &out, &local, &lens)?;
    side.seconds += t.elapsed().as_secs_f64();
    Ok(())
}
