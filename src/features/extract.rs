//! The extraction driver: stream the input once, decode and encode each
//! distinct image and caption that the cache does not hold yet, and return
//! every row's features.

use std::time::Instant;

use anyhow::Context;
use candle_core::{DType, Device, Tensor};

use super::side::{Side, SideFeatures};
use super::store::{key_of, CacheOptions, Key};
use ncclean_pipelines::Observer;

use crate::data::{ImageValue, InputSet};
use crate::encoders::{ImageTower, TextTower};
use crate::error::Result;
use crate::parallel::parallel_map;
use crate::progress::Reporter;

const IMAGE_BATCH: usize = 32;
const TEXT_BATCH: usize = 64;
const READ_ROWS: usize = 256;

/// Features of both sides (either may be absent when that side's tower is
/// trainable or precomputed).
pub struct Extracted {
    /// Image side.
    pub image: Option<SideFeatures>,
    /// Text side.
    pub text: Option<SideFeatures>,
}

fn image_bytes(v: &ImageValue) -> std::result::Result<Vec<u8>, String> {
    match v {
        ImageValue::Bytes(b) => Ok(b.clone()),
        ImageValue::Path(p) => {
            std::fs::read(p).map_err(|e| format!("cannot read image file {}: {e}", p.display()))
        }
        ImageValue::Embedding(_) => {
            Err("row holds an embedding but the image tower needs an image".into())
        }
    }
}

/// Extract (or load from the cache) features of every row of `input`; with
/// `want_local`, also the local features (grid cells / patches, tokens).
pub fn extract(
    input: &InputSet,
    image: Option<&ImageTower>,
    text: Option<&TextTower>,
    want_local: bool,
    cache: &CacheOptions,
    device: &Device,
    rep: &Reporter,
) -> Result<Extracted> {
    let rows = input.num_rows();
    let root = cache.dir.as_ref();
    let mut img = match image {
        Some(t) => Some(Side::new(
            root,
            &format!("image|{}", t.cache_tag()),
            rows,
            false,
            want_local.then(|| t.local_dim()),
        )?),
        None => None,
    };
    let mut txt = match text {
        Some(t) => Some(Side::new(
            root,
            &format!("text|{}", t.cache_tag()),
            rows,
            true,
            want_local.then(|| t.local_dim()),
        )?),
        None => None,
    };
    let preprocess = image.map(|t| t.preprocess());
    let mut pending_img: Vec<(Key, Vec<f32>)> = Vec::new();
    let mut pending_txt: Vec<(Key, String)> = Vec::new();
    let mut obs = rep.observer();
    obs.start("encoding", rows as u64);
    let mut base = 0usize;
    for batch in input.pairs(READ_ROWS) {
        let batch = batch?;
        if let (Some(tower), Some(pre), Some(side)) = (image, preprocess.as_ref(), img.as_mut()) {
            let mut todo: Vec<(Key, Vec<u8>)> = Vec::new();
            for (k, r) in batch.iter().enumerate() {
                let Some(v) = r.image.as_ref().filter(|_| r.problem.is_none()) else {
                    continue;
                };
                match image_bytes(v) {
                    Err(e) => side.errors[base + k] = Some(e),
                    Ok(bytes) => {
                        let key = key_of(&bytes);
                        if side.assign(base + k, key) {
                            todo.push((key, bytes));
                        }
                    }
                }
            }
            let decoded = parallel_map(&todo, |(_, b)| {
                // A decoder bug on one malformed image must not end the whole run.
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pre.apply(b)))
                    .unwrap_or_else(|_| Err("the image decoder crashed on this image".to_string()))
            });
            for ((key, _), d) in todo.into_iter().zip(decoded) {
                match d {
                    Ok(px) => pending_img.push((key, px)),
                    Err(e) => side.fail(key, e),
                }
            }
            while pending_img.len() >= IMAGE_BATCH {
                let chunk: Vec<_> = pending_img.drain(..IMAGE_BATCH).collect();
                encode_images(tower, pre.size as usize, &chunk, side, device)?;
            }
        }
        if let (Some(tower), Some(side)) = (text, txt.as_mut()) {
            for (k, r) in batch.iter().enumerate() {
                if r.problem.is_none() {
                    let key = key_of(r.caption.as_bytes());
                    if side.assign(base + k, key) {
                        pending_txt.push((key, r.caption.clone()));
                    }
                }
            }
            while pending_txt.len() >= TEXT_BATCH {
                let chunk: Vec<_> = pending_txt.drain(..TEXT_BATCH).collect();
                encode_texts(tower, &chunk, side)?;
            }
        }
        base += batch.len();
        obs.advance(batch.len() as u64);
    }
    if let (Some(tower), Some(pre), Some(side)) = (image, preprocess.as_ref(), img.as_mut()) {
        if !pending_img.is_empty() {
            encode_images(tower, pre.size as usize, &pending_img, side, device)?;
        }
    }
    if let (Some(tower), Some(side)) = (text, txt.as_mut()) {
        if !pending_txt.is_empty() {
            encode_texts(tower, &pending_txt, side)?;
        }
    }
    obs.finish();
    Ok(Extracted {
        image: img.map(|s| s.finish(rep, "images")).transpose()?,
        text: txt.map(|s| s.finish(rep, "captions")).transpose()?,
    })
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
