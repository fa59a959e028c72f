//! Encoder-ready inputs for a set of pairs, held in memory.
//!
//! Built once by the engine from decoded rows; batches are gathered from it
//! by index. Pixels are stored as bytes (3·S·S per image) and embeddings as
//! f32, so memory per pair stays small and independent of the source files.

use candle_core::{DType, Device, Result, Tensor};

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
    /// Embeddings `[B, dim]`.
    Embeddings(Tensor),
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
            ImageInputs::Embeddings { data, dim } => data.len() / (*dim).max(1),
        }
    }

    /// True when there are no images.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Gather images `idx` into a tensor: pixels as f32 `[B, 3, S, S]` scaled
    /// to [-1, 1], embeddings as `[B, dim]`.
    pub fn batch(&self, idx: &[usize], device: &Device) -> Result<Tensor> {
        match self {
            ImageInputs::Pixels { data, size } => {
                let per = 3 * size * size;
                let mut out = Vec::with_capacity(idx.len() * per);
                for &i in idx {
                    out.extend_from_slice(&data[i * per..(i + 1) * per]);
                }
                let t = Tensor::from_vec(out, (idx.len(), 3, *size, *size), device)?;
                (t.to_dtype(DType::F32)? * (2.0 / 255.0))? - 1.0
            }
            ImageInputs::Embeddings { data, dim } => gather_rows(data, *dim, idx, device),
        }
    }
}

impl TextInputs {
    /// Number of captions.
    pub fn len(&self) -> usize {
        match self {
            TextInputs::Tokens(t) => t.len(),
            TextInputs::Embeddings { data, dim } => data.len() / (*dim).max(1),
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
            TextInputs::Embeddings { data, dim } => {
                Ok(TextBatch::Embeddings(gather_rows(data, *dim, idx, device)?))
            }
        }
    }
}

impl PairInputs {
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

    #[test]
    fn gathers_pixels_scaled_and_tokens_padded() -> Result<()> {
        let dev = Device::Cpu;
        // two 1×1 images: (0, 255, 51) and (255, 0, 0)
        let imgs = ImageInputs::Pixels {
            data: vec![0, 255, 51, 255, 0, 0],
            size: 1,
        };
        assert_eq!(imgs.len(), 2);
        let b: Vec<f32> = imgs.batch(&[1, 0], &dev)?.flatten_all()?.to_vec1()?;
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
            TextBatch::Embeddings(_) => panic!("expected tokens"),
        }
        Ok(())
    }
}
