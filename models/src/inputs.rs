//! Encoder-ready inputs for a set of pairs, held in memory.
//!
//! Built once by the engine from decoded rows; batches are gathered from it
//! by index. Pixels are stored as bytes (3·S·S per image) and embeddings as
//! f32, so memory per pair stays small and independent of the source files.
//! Local features (grid cells, patches, tokens of frozen towers) are large, so
//! they are kept in f16, once per distinct image or caption.

use candle_core::{DType, Device, Result, Tensor};
use half::f16;

use crate::multiversion;

/// Sets of local feature vectors of frozen towers (image grid cells or
/// patches, caption tokens), one set per distinct item, shared by the pairs
/// that use the item. Stored in f16 (as the feature cache holds them): a
/// 7×7×1280 MobileNetV2 grid is 125 KB per image.
#[derive(Debug, Clone)]
pub struct LocalFeatures {
    /// Width of every vector.
    pub dim: usize,
    /// Concatenated vectors of all items, `offsets.last() × dim` values.
    pub data: Vec<f16>,
    /// Item `k` owns vectors `offsets[k]..offsets[k + 1]` (at least one).
    pub offsets: Vec<usize>,
    /// Per pair: the item it uses.
    pub index: Vec<u32>,
}

/// Local features of a batch, padded to the longest set.
#[derive(Debug, Clone)]
pub struct LocalBatch {
    /// `[B, K, dim]` f32, zero on padding.
    pub feats: Tensor,
    /// `[B, K]` f32, 1 on real vectors (real vectors come first).
    pub mask: Tensor,
}

impl LocalFeatures {
    /// Number of pairs.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// True when there are no pairs.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Check that offsets, data and index agree, so that gathering cannot
    /// go out of bounds; the message says what is inconsistent.
    pub fn check(&self) -> std::result::Result<(), String> {
        let items = self.offsets.len().saturating_sub(1);
        if self.offsets.first() != Some(&0) || self.offsets.windows(2).any(|w| w[1] <= w[0]) {
            return Err("local feature offsets must start at 0 and grow by at least one".into());
        }
        if self.offsets[items] * self.dim != self.data.len() {
            return Err(format!(
                "local features hold {} values, offsets say {} vectors of {}",
                self.data.len(),
                self.offsets[items],
                self.dim
            ));
        }
        if let Some(bad) = self.index.iter().find(|&&i| i as usize >= items) {
            return Err(format!("pair refers to local item {bad} of {items}"));
        }
        Ok(())
    }

    /// The local features of pairs `idx` alone, in that order: only the
    /// items they use are kept (still once each).
    pub fn select(&self, idx: &[usize]) -> LocalFeatures {
        let mut renumber = vec![u32::MAX; self.offsets.len().saturating_sub(1)];
        let mut out = LocalFeatures {
            dim: self.dim,
            data: Vec::new(),
            offsets: vec![0],
            index: Vec::with_capacity(idx.len()),
        };
        for &i in idx {
            let k = self.index[i] as usize;
            if renumber[k] == u32::MAX {
                renumber[k] = (out.offsets.len() - 1) as u32;
                let (a, b) = (self.offsets[k], self.offsets[k + 1]);
                out.data
                    .extend_from_slice(&self.data[a * self.dim..b * self.dim]);
                out.offsets
                    .push(out.offsets[out.offsets.len() - 1] + (b - a));
            }
            out.index.push(renumber[k]);
        }
        out
    }

    /// Gather the sets of pairs `idx`, padded to the longest.
    pub fn batch(&self, idx: &[usize], device: &Device) -> Result<LocalBatch> {
        let span = |i: usize| {
            let k = self.index[i] as usize;
            (self.offsets[k], self.offsets[k + 1])
        };
        let k = idx
            .iter()
            .map(|&i| {
                let (a, b) = span(i);
                b - a
            })
            .max()
            .unwrap_or(1)
            .max(1);
        let d = self.dim;
        let mut feats = vec![0f32; idx.len() * k * d];
        let mut mask = vec![0f32; idx.len() * k];
        for (r, &i) in idx.iter().enumerate() {
            let (a, b) = span(i);
            let dst = &mut feats[r * k * d..(r * k + (b - a)) * d];
            for (o, v) in dst.iter_mut().zip(&self.data[a * d..b * d]) {
                *o = v.to_f32();
            }
            mask[r * k..r * k + (b - a)]
                .iter_mut()
                .for_each(|m| *m = 1.0);
        }
        Ok(LocalBatch {
            feats: Tensor::from_vec(feats, (idx.len(), k, d), device)?,
            mask: Tensor::from_vec(mask, (idx.len(), k), device)?,
        })
    }
}

/// Image side of the inputs.
#[derive(Debug, Clone)]
pub enum ImageInputs {
    /// Channel-major RGB bytes, `3 × size × size` per image.
    Pixels {
        /// Concatenated images.
        data: Vec<u8>,
        /// Side length in pixels.
        size: usize,
    },
    /// Precomputed embedding vectors of width `dim`.
    Embeddings {
        /// Concatenated vectors.
        data: Vec<f32>,
        /// Vector width.
        dim: usize,
        /// Grid cells / patches, for heads and methods that use them.
        local: Option<LocalFeatures>,
    },
}

/// A batch of images ready for an image tower.
#[derive(Debug, Clone)]
pub enum ImageBatch {
    /// Pixels `[B, 3, S, S]` scaled to [-1, 1].
    Pixels(Tensor),
    /// Embeddings `[B, dim]`, with their local features when loaded.
    Embeddings {
        /// Global vectors.
        global: Tensor,
        /// Grid cells / patches.
        local: Option<LocalBatch>,
    },
}

/// Text side of the inputs.
#[derive(Debug, Clone)]
pub enum TextInputs {
    /// Token ids per caption (variable length, at least one token each).
    Tokens(Vec<Vec<u32>>),
    /// Precomputed embedding vectors of width `dim`.
    Embeddings {
        /// Concatenated vectors.
        data: Vec<f32>,
        /// Vector width.
        dim: usize,
        /// Token features, for heads and methods that use them.
        local: Option<LocalFeatures>,
    },
}

/// A batch of text ready for a text tower.
#[derive(Debug, Clone)]
pub enum TextBatch {
    /// Padded ids `[B, L]` (u32) and mask `[B, L]` (f32, 1 for real tokens).
    Tokens {
        /// Token ids.
        ids: Tensor,
        /// Attention mask.
        mask: Tensor,
    },
    /// Embeddings `[B, dim]`, with their token features when loaded.
    Embeddings {
        /// Global vectors.
        global: Tensor,
        /// Token features.
        local: Option<LocalBatch>,
    },
}

/// Images and captions of N pairs, aligned by index.
#[derive(Debug, Clone)]
pub struct PairInputs {
    /// Image side.
    pub images: ImageInputs,
    /// Text side.
    pub texts: TextInputs,
}

impl ImageInputs {
    /// Number of images.
    pub fn len(&self) -> usize {
        match self {
            ImageInputs::Pixels { data, size } => data.len() / (3 * size * size).max(1),
            ImageInputs::Embeddings { data, dim, .. } => data.len() / (*dim).max(1),
        }
    }

    /// True when there are no images.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The distinct images: `(first, of)`, where `first` holds the first
    /// pair of each distinct image, in order of appearance, and pair `i`
    /// shows image `first[of[i]]`. Caption datasets and web shards repeat
    /// images (Flickr8k: five captions each), so whole-dataset passes embed
    /// each image once. Precomputed features are compared exactly (global
    /// vector bits and local item); pixels count every pair as distinct,
    /// since a trainable tower's output is cheap next to its bookkeeping.
    pub fn distinct(&self) -> (Vec<usize>, Vec<u32>) {
        let n = self.len();
        let identity = || ((0..n).collect(), (0..n as u32).collect());
        let ImageInputs::Embeddings { data, dim, local } = self else {
            return identity();
        };
        let item = |i: usize| local.as_ref().map(|l| l.index[i]);
        distinct_rows(data, *dim, item)
    }

    /// Gather images `idx`: pixels as f32 `[B, 3, S, S]` scaled to [-1, 1],
    /// embeddings as `[B, dim]` (with their local features, if loaded).
    pub fn batch(&self, idx: &[usize], device: &Device) -> Result<ImageBatch> {
        match self {
            ImageInputs::Pixels { data, size } => {
                let per = 3 * size * size;
                let mut out = Vec::with_capacity(idx.len() * per);
                for &i in idx {
                    out.extend_from_slice(&data[i * per..(i + 1) * per]);
                }
                let t = Tensor::from_vec(out, (idx.len(), 3, *size, *size), device)?;
                Ok(ImageBatch::Pixels(
                    ((t.to_dtype(DType::F32)? * (2.0 / 255.0))? - 1.0)?,
                ))
            }
            ImageInputs::Embeddings { data, dim, local } => Ok(ImageBatch::Embeddings {
                global: gather_rows(data, *dim, idx, device)?,
                local: local.as_ref().map(|l| l.batch(idx, device)).transpose()?,
            }),
        }
    }
}

/// The distinct rows of a row-major `[n, dim]` matrix, each with an
/// optional extra key (`item(i)`, e.g. a local-feature index): `(first,
/// of)`, where `first` holds the first row of each distinct value in order
/// of appearance and row `i` equals row `first[of[i]]`. Rows are compared
/// exactly (their bits: NaN equals itself, +0 is not −0); the hash only
/// picks the bucket. A zero `dim` counts every row as one value.
pub fn distinct_rows(
    data: &[f32],
    dim: usize,
    item: impl Fn(usize) -> Option<u32>,
) -> (Vec<usize>, Vec<u32>) {
    let n = data.len().checked_div(dim).unwrap_or(0);
    let row = |i: usize| &data[i * dim..(i + 1) * dim];
    let mut seen: std::collections::HashMap<u64, Vec<u32>> = Default::default();
    let mut first = Vec::new();
    let mut of = Vec::with_capacity(n);
    for i in 0..n {
        let h = item(i).map_or(0, u64::from) ^ row_hash(row(i));
        let same = |&&k: &&u32| {
            let j = first[k as usize];
            item(j) == item(i) && same_bits(row(j), row(i))
        };
        let bucket = seen.entry(h).or_default();
        match bucket.iter().find(same) {
            Some(&k) => of.push(k),
            None => {
                let k = first.len() as u32;
                bucket.push(k);
                first.push(i);
                of.push(k);
            }
        }
    }
    (first, of)
}

multiversion! {
    /// A 64-bit hash of a vector's bits, for [`ImageInputs::distinct`]'s
    /// buckets: 32 lanes of 32-bit FNV-1a over the values at their position
    /// modulo 32, folded into one. Distinct runs once per epoch and pass;
    /// one 64-bit FNV chain over the whole vector (a multiply's latency per
    /// value) took 0.1 s a call on 30,000 MobileNetV2 vectors, the lanes
    /// vectorise (0.03 s, about the time to read the vectors).
    pub fn row_hash(row: &[f32]) -> u64 => row_hash_impl
}

#[inline(always)]
fn row_hash_impl(row: &[f32]) -> u64 {
    const PRIME32: u32 = 0x0100_0193;
    let mut lanes = [0x811C_9DC5u32; 32];
    let chunks = row.chunks_exact(32);
    let tail = chunks.remainder();
    for c in chunks {
        for (h, x) in lanes.iter_mut().zip(c) {
            *h = (*h ^ x.to_bits()).wrapping_mul(PRIME32);
        }
    }
    for (h, x) in lanes.iter_mut().zip(tail) {
        *h = (*h ^ x.to_bits()).wrapping_mul(PRIME32);
    }
    let mut h = crate::hash::Fnv(crate::hash::OFFSET ^ row.len() as u64);
    lanes.iter().for_each(|&l| h.word(l));
    h.finish()
}

multiversion! {
    /// Whether two vectors hold the same bits (NaN equals itself, +0 is
    /// not −0), a block of 64 values at a time without a branch per value.
    fn same_bits(a: &[f32], b: &[f32]) -> bool => same_bits_impl
}

#[inline(always)]
fn same_bits_impl(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len()
        && a.chunks(64).zip(b.chunks(64)).all(|(x, y)| {
            x.iter()
                .zip(y)
                .fold(0u32, |d, (p, q)| d | (p.to_bits() ^ q.to_bits()))
                == 0
        })
}

impl TextInputs {
    /// Number of captions.
    pub fn len(&self) -> usize {
        match self {
            TextInputs::Tokens(t) => t.len(),
            TextInputs::Embeddings { data, dim, .. } => data.len() / (*dim).max(1),
        }
    }

    /// True when there are no captions.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Gather captions `idx` into a padded batch.
    pub fn batch(&self, idx: &[usize], device: &Device) -> Result<TextBatch> {
        match self {
            TextInputs::Tokens(tokens) => {
                let l = idx
                    .iter()
                    .map(|&i| tokens[i].len())
                    .max()
                    .unwrap_or(1)
                    .max(1);
                let mut ids = vec![0u32; idx.len() * l];
                let mut mask = vec![0f32; idx.len() * l];
                for (r, &i) in idx.iter().enumerate() {
                    for (c, &id) in tokens[i].iter().enumerate() {
                        ids[r * l + c] = id;
                        mask[r * l + c] = 1.0;
                    }
                }
                Ok(TextBatch::Tokens {
                    ids: Tensor::from_vec(ids, (idx.len(), l), device)?,
                    mask: Tensor::from_vec(mask, (idx.len(), l), device)?,
                })
            }
            TextInputs::Embeddings { data, dim, local } => Ok(TextBatch::Embeddings {
                global: gather_rows(data, *dim, idx, device)?,
                local: local.as_ref().map(|l| l.batch(idx, device)).transpose()?,
            }),
        }
    }
}

impl ImageInputs {
    /// The local features, when loaded.
    pub fn local(&self) -> Option<&LocalFeatures> {
        match self {
            ImageInputs::Embeddings { local, .. } => local.as_ref(),
            ImageInputs::Pixels { .. } => None,
        }
    }
}

impl TextInputs {
    /// The local features, when loaded.
    pub fn local(&self) -> Option<&LocalFeatures> {
        match self {
            TextInputs::Embeddings { local, .. } => local.as_ref(),
            TextInputs::Tokens(_) => None,
        }
    }
}

impl PairInputs {
    /// Pairs `idx` alone, in that order (a copy): a sample to embed
    /// without embedding every pair.
    pub fn select(&self, idx: &[usize]) -> PairInputs {
        let rows = |data: &[f32], dim: usize| {
            let mut out = Vec::with_capacity(idx.len() * dim);
            for &i in idx {
                out.extend_from_slice(&data[i * dim..(i + 1) * dim]);
            }
            out
        };
        let images = match &self.images {
            ImageInputs::Pixels { data, size } => {
                let per = 3 * size * size;
                let mut out = Vec::with_capacity(idx.len() * per);
                for &i in idx {
                    out.extend_from_slice(&data[i * per..(i + 1) * per]);
                }
                ImageInputs::Pixels {
                    data: out,
                    size: *size,
                }
            }
            ImageInputs::Embeddings { data, dim, local } => ImageInputs::Embeddings {
                data: rows(data, *dim),
                dim: *dim,
                local: local.as_ref().map(|l| l.select(idx)),
            },
        };
        let texts = match &self.texts {
            TextInputs::Tokens(t) => {
                TextInputs::Tokens(idx.iter().map(|&i| t[i].clone()).collect())
            }
            TextInputs::Embeddings { data, dim, local } => TextInputs::Embeddings {
                data: rows(data, *dim),
                dim: *dim,
                local: local.as_ref().map(|l| l.select(idx)),
            },
        };
        PairInputs { images, texts }
    }

    /// Number of pairs.
    pub fn len(&self) -> usize {
        self.images.len()
    }

    /// True when there are no pairs.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn gather_rows(data: &[f32], dim: usize, idx: &[usize], device: &Device) -> Result<Tensor> {
    let mut out = Vec::with_capacity(idx.len() * dim);
    for &i in idx {
        out.extend_from_slice(&data[i * dim..(i + 1) * dim]);
    }
    Tensor::from_vec(out, (idx.len(), dim), device)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Distinct images are equal vectors (and local items), numbered in
    /// order of first appearance, whatever the hash does: vectors of 6
    /// values (a tail after the hash's four lanes), one that is another's
    /// values in another order, +0 against −0, and one vector under two
    /// local items.
    #[test]
    fn distinct_images_are_equal_vectors_in_order_of_appearance() {
        let a = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        let b = [2.0f32, 1.0, 3.0, 4.0, 5.0, 6.0];
        let c = [0.0f32, 0.0, 0.0, 0.0, 0.0, 0.0];
        let d = [-0.0f32, 0.0, 0.0, 0.0, 0.0, 0.0];
        let rows = [a, b, a, c, d, b, c];
        let images = |local: Option<LocalFeatures>| ImageInputs::Embeddings {
            data: rows.concat(),
            dim: 6,
            local,
        };
        let (first, of) = images(None).distinct();
        assert_eq!(first, vec![0, 1, 3, 4]);
        assert_eq!(of, vec![0, 1, 0, 2, 3, 1, 2]);
        // Pair 2 (vector a again) shows another grid: a distinct image.
        let local = LocalFeatures {
            dim: 1,
            data: vec![f16::from_f32(0.0); 2],
            offsets: vec![0, 1, 2],
            index: vec![0, 0, 1, 0, 0, 0, 0],
        };
        let (first, of) = images(Some(local)).distinct();
        assert_eq!(first, vec![0, 1, 2, 3, 4]);
        assert_eq!(of, vec![0, 1, 2, 3, 4, 1, 3]);
        // Pixels: every pair is its own image.
        let px = ImageInputs::Pixels {
            data: vec![7; 3 * 2],
            size: 1,
        };
        assert_eq!(px.distinct(), (vec![0, 1], vec![0, 1]));
    }

    #[test]
    fn gathers_pixels_scaled_and_tokens_padded() -> Result<()> {
        let dev = Device::Cpu;
        // two 1×1 images: (0, 255, 51) and (255, 0, 0)
        let imgs = ImageInputs::Pixels {
            data: vec![0, 255, 51, 255, 0, 0],
            size: 1,
        };
        assert_eq!(imgs.len(), 2);
        let ImageBatch::Pixels(b) = imgs.batch(&[1, 0], &dev)? else {
            panic!("expected pixels");
        };
        let b: Vec<f32> = b.flatten_all()?.to_vec1()?;
        let want = [1.0, -1.0, -1.0, -1.0, 1.0, 51.0 * 2.0 / 255.0 - 1.0];
        for (g, w) in b.iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{b:?}");
        }
        let texts = TextInputs::Tokens(vec![vec![5], vec![2, 3, 4]]);
        match texts.batch(&[0, 1], &dev)? {
            TextBatch::Tokens { ids, mask } => {
                assert_eq!(ids.to_vec2::<u32>()?, vec![vec![5, 0, 0], vec![2, 3, 4]]);
                assert_eq!(
                    mask.to_vec2::<f32>()?,
                    vec![vec![1., 0., 0.], vec![1., 1., 1.]]
                );
            }
            TextBatch::Embeddings { .. } => panic!("expected tokens"),
        }
        Ok(())
    }

    /// Item 0: two vectors (1, 2), (3, 4); item 1: one vector (5, 6);
    /// pairs 0 and 2 share item 1.
    fn two_items() -> LocalFeatures {
        LocalFeatures {
            dim: 2,
            data: [1., 2., 3., 4., 5., 6.].map(f16::from_f32).to_vec(),
            offsets: vec![0, 2, 3],
            index: vec![1, 0, 1],
        }
    }

    #[test]
    fn local_features_are_shared_per_item_and_padded_per_batch() -> Result<()> {
        let dev = Device::Cpu;
        let local = two_items();
        local.check().map_err(candle_core::Error::Msg)?;
        let texts = TextInputs::Embeddings {
            data: vec![0.0; 6],
            dim: 2,
            local: Some(local.clone()),
        };
        let TextBatch::Embeddings {
            local: Some(b),
            global,
        } = texts.batch(&[2, 1], &dev)?
        else {
            panic!("expected embeddings with local features");
        };
        assert_eq!(global.dims(), &[2, 2]);
        assert_eq!(
            b.feats.to_vec3::<f32>()?,
            vec![
                vec![vec![5., 6.], vec![0., 0.]],
                vec![vec![1., 2.], vec![3., 4.]]
            ]
        );
        assert_eq!(b.mask.to_vec2::<f32>()?, vec![vec![1., 0.], vec![1., 1.]]);
        // inconsistent tables are caught before any gather
        let short = LocalFeatures {
            data: local.data[..4].to_vec(),
            ..local.clone()
        };
        assert!(short.check().unwrap_err().contains("offsets say 3 vectors"));
        let stray = LocalFeatures {
            index: vec![2],
            ..local
        };
        assert!(stray.check().unwrap_err().contains("item 2 of 2"));
        Ok(())
    }

    /// Every value of a tensor, as f32.
    fn flat(t: &Tensor) -> Result<Vec<f32>> {
        t.to_dtype(DType::F32)?.flatten_all()?.to_vec1()
    }

    /// Local vectors and mask of a batch, when loaded.
    fn local_parts(local: Option<LocalBatch>) -> Result<Vec<Vec<f32>>> {
        local.map_or(Ok(Vec::new()), |l| {
            Ok(vec![flat(&l.feats)?, flat(&l.mask)?])
        })
    }

    /// An image batch's kind and every tensor's values.
    fn image_parts(b: ImageBatch) -> Result<(&'static str, Vec<Vec<f32>>)> {
        Ok(match b {
            ImageBatch::Pixels(t) => ("pixels", vec![flat(&t)?]),
            ImageBatch::Embeddings { global, local } => {
                let mut parts = vec![flat(&global)?];
                parts.extend(local_parts(local)?);
                ("embeddings", parts)
            }
        })
    }

    /// A text batch's kind and every tensor's values.
    fn text_parts(b: TextBatch) -> Result<(&'static str, Vec<Vec<f32>>)> {
        Ok(match b {
            TextBatch::Tokens { ids, mask } => ("tokens", vec![flat(&ids)?, flat(&mask)?]),
            TextBatch::Embeddings { global, local } => {
                let mut parts = vec![flat(&global)?];
                parts.extend(local_parts(local)?);
                ("embeddings", parts)
            }
        })
    }

    #[test]
    fn a_selection_gathers_what_the_whole_gathers() -> Result<()> {
        let dev = Device::Cpu;
        let local = two_items();
        // Only the items used are kept, once each, numbered in order of use.
        let one = local.select(&[2, 0]);
        assert_eq!(one.offsets, [0, 1]);
        assert_eq!(one.index, [0, 0]);
        assert_eq!(one.data, [5., 6.].map(f16::from_f32));
        let both = local.select(&[1, 2]);
        assert_eq!(both.offsets, [0, 2, 3]);
        assert_eq!(both.index, [0, 1]);
        both.check().map_err(candle_core::Error::Msg)?;
        let pairs = [
            PairInputs {
                images: ImageInputs::Pixels {
                    data: (0..18).collect(),
                    size: 1,
                },
                texts: TextInputs::Tokens(vec![vec![1], vec![2, 3], vec![4, 5, 6]]),
            },
            PairInputs {
                images: ImageInputs::Embeddings {
                    data: (0..6).map(|v| v as f32).collect(),
                    dim: 2,
                    local: Some(local.clone()),
                },
                texts: TextInputs::Embeddings {
                    data: (0..9).map(|v| v as f32 * 0.5).collect(),
                    dim: 3,
                    local: Some(local),
                },
            },
        ];
        for whole in &pairs {
            let picked = whole.select(&[2, 0]);
            assert_eq!(picked.len(), 2);
            let (a, b) = (
                image_parts(whole.images.batch(&[2, 0], &dev)?)?,
                image_parts(picked.images.batch(&[0, 1], &dev)?)?,
            );
            assert_eq!(a, b);
            let (a, b) = (
                text_parts(whole.texts.batch(&[2, 0], &dev)?)?,
                text_parts(picked.texts.batch(&[0, 1], &dev)?)?,
            );
            assert_eq!(a, b);
            // Embeddings come with their local features (vectors and mask).
            assert_eq!(a.1.len(), if a.0 == "tokens" { 2 } else { 3 });
        }
        Ok(())
    }
}
