//! The matching model: an image tower, a text tower and a shared joint space
//! in which similarity is the cosine (VSE style).

use candle_core::{Module, Result, Tensor, D};
use serde::{Deserialize, Serialize};

use crate::inputs::TextBatch;
use crate::layers::{l2_normalize, Conv2d, Embedding, Linear};
use crate::params::ParamStore;

/// Which image tower to build.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ImageTowerConfig {
    /// A compact CNN trained from scratch on `image_size²` RGB pixels.
    DemoCnn {
        /// Input side length (images are resized to it).
        image_size: usize,
        /// Channels of the first convolution (doubled twice).
        width: usize,
    },
    /// Precomputed embeddings of width `dim` (e.g. CLIP features in the data).
    Precomputed {
        /// Embedding width.
        dim: usize,
    },
}

/// Which text tower to build.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TextTowerConfig {
    /// Bag of word embeddings over a vocabulary built from the captions.
    DemoBow {
        /// Vocabulary size including padding and unknown.
        vocab_size: usize,
        /// Word embedding width.
        dim: usize,
    },
    /// Precomputed embeddings of width `dim`.
    Precomputed {
        /// Embedding width.
        dim: usize,
    },
}

/// Everything needed to rebuild a [`MatchingModel`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    /// Image tower.
    pub image: ImageTowerConfig,
    /// Text tower.
    pub text: TextTowerConfig,
    /// Width of the joint embedding space.
    pub joint_dim: usize,
    /// Hidden width of the projection MLPs.
    pub hidden: usize,
}

/// Projection into the joint space: a linear map plus a residual two-layer
/// MLP, so the head starts close to linear and can bend where it helps.
#[derive(Debug, Clone)]
pub struct Projection {
    linear: Linear,
    fc1: Linear,
    fc2: Linear,
}

impl Projection {
    /// `fan_in → joint` projection named `name`.
    pub fn new(p: &mut ParamStore, name: &str, fan_in: usize, hidden: usize, joint: usize) -> Result<Self> {
        p.scoped(name, |p| {
            Ok(Projection {
                linear: Linear::new(p, "linear", fan_in, joint)?,
                fc1: Linear::new(p, "fc1", fan_in, hidden)?,
                fc2: Linear::new(p, "fc2", hidden, joint)?,
            })
        })
    }
}

impl Module for Projection {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mlp = self.fc2.forward(&self.fc1.forward(x)?.relu()?)?;
        self.linear.forward(x)? + mlp
    }
}

#[derive(Debug, Clone)]
enum ImageTower {
    Cnn { convs: Vec<Conv2d>, proj: Projection },
    Precomputed { proj: Projection },
}

#[derive(Debug, Clone)]
enum TextTower {
    Bow { emb: Embedding, proj: Projection },
    Precomputed { proj: Projection },
}

/// Image and text towers mapping into one L2-normalised joint space.
#[derive(Debug, Clone)]
pub struct MatchingModel {
    config: ModelConfig,
    image: ImageTower,
    text: TextTower,
}

impl MatchingModel {
    /// Build the model, creating its parameters in `p`.
    pub fn new(config: &ModelConfig, p: &mut ParamStore) -> Result<Self> {
        let (joint, hidden) = (config.joint_dim, config.hidden);
        let image = p.scoped("image", |p| -> Result<ImageTower> {
            Ok(match config.image {
                ImageTowerConfig::DemoCnn { image_size, width } => {
                    // Three stride-2 convolutions; the final grid is flattened
                    // (not pooled) so the head sees where things are.
                    let chans = [3, width, 2 * width, 4 * width];
                    let mut convs = Vec::new();
                    let mut side = image_size;
                    for i in 0..3 {
                        convs.push(Conv2d::new(p, &format!("conv{i}"), chans[i], chans[i + 1], 3, 2, 1)?);
                        side = side.div_ceil(2);
                    }
                    let flat = chans[3] * side * side;
                    ImageTower::Cnn {
                        convs,
                        proj: Projection::new(p, "proj", flat, hidden, joint)?,
                    }
                }
                ImageTowerConfig::Precomputed { dim } => ImageTower::Precomputed {
                    proj: Projection::new(p, "proj", dim, hidden, joint)?,
                },
            })
        })?;
        let text = p.scoped("text", |p| -> Result<TextTower> {
            Ok(match config.text {
                TextTowerConfig::DemoBow { vocab_size, dim } => TextTower::Bow {
                    emb: Embedding::new(p, "emb", vocab_size, dim)?,
                    proj: Projection::new(p, "proj", dim, hidden, joint)?,
                },
                TextTowerConfig::Precomputed { dim } => TextTower::Precomputed {
                    proj: Projection::new(p, "proj", dim, hidden, joint)?,
                },
            })
        })?;
        Ok(MatchingModel {
            config: config.clone(),
            image,
            text,
        })
    }

    /// The configuration this model was built from.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Image batch (as [`crate::inputs::ImageInputs::batch`] makes it) →
    /// unit vectors `[B, joint]`.
    pub fn embed_images(&self, x: &Tensor) -> Result<Tensor> {
        let z = match &self.image {
            ImageTower::Cnn { convs, proj } => {
                let mut h = x.clone();
                for c in convs {
                    h = c.forward(&h)?.relu()?;
                }
                proj.forward(&h.flatten_from(1)?)?
            }
            ImageTower::Precomputed { proj } => proj.forward(x)?,
        };
        l2_normalize(&z)
    }

    /// Text batch → unit vectors `[B, joint]`.
    pub fn embed_texts(&self, t: &TextBatch) -> Result<Tensor> {
        let z = match (&self.text, t) {
            (TextTower::Bow { emb, proj }, TextBatch::Tokens { ids, mask }) => {
                let e = emb.forward(ids)?; // [B, L, E]
                let m = mask.unsqueeze(D::Minus1)?; // [B, L, 1]
                let summed = e.broadcast_mul(&m)?.sum(1)?;
                let count = m.sum(1)?.clamp(1.0, f64::MAX)?;
                proj.forward(&summed.broadcast_div(&count)?)?
            }
            (TextTower::Precomputed { proj }, TextBatch::Embeddings(x)) => proj.forward(x)?,
            _ => candle_core::bail!("text batch does not match the text tower of this model"),
        };
        l2_normalize(&z)
    }
}

/// Cosine similarity matrix `S[i, j] = s(image i, caption j)` of unit vectors.
pub fn similarity(images: &Tensor, texts: &Tensor) -> Result<Tensor> {
    images.matmul(&texts.t()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inputs::{ImageInputs, TextInputs};
    use candle_core::Device;

    fn demo_config() -> ModelConfig {
        ModelConfig {
            image: ImageTowerConfig::DemoCnn {
                image_size: 8,
                width: 4,
            },
            text: TextTowerConfig::DemoBow {
                vocab_size: 10,
                dim: 6,
            },
            joint_dim: 5,
            hidden: 7,
        }
    }

    #[test]
    fn every_parameter_receives_a_gradient() -> Result<()> {
        // Guards against candle ops without a backward pass (fused norms,
        // softmax) sneaking into a trained path: such a model trains nothing.
        let dev = Device::Cpu;
        let mut p = ParamStore::new(3, &dev);
        let model = MatchingModel::new(&demo_config(), &mut p)?;
        let imgs = ImageInputs::Pixels {
            data: (0..2 * 3 * 64).map(|i| (i * 7 % 256) as u8).collect(),
            size: 8,
        };
        let texts = TextInputs::Tokens(vec![vec![2, 3], vec![4, 5, 6]]);
        let vi = model.embed_images(&imgs.batch(&[0, 1], &dev)?)?;
        let vt = model.embed_texts(&texts.batch(&[0, 1], &dev)?)?;
        let s = similarity(&vi, &vt)?;
        let norms: Vec<f32> = vi.sqr()?.sum(1)?.to_vec1()?;
        assert!(norms.iter().all(|n| (n - 1.0).abs() < 1e-5));
        let loss = (s.sum_all()? - s.sqr()?.sum_all()?)?;
        let grads = loss.backward()?;
        let vars = p.varmap().data().lock().unwrap();
        assert!(!vars.is_empty());
        for (name, var) in vars.iter() {
            // the unused embedding rows (ids 0, 1, 7..9) get zero gradient, but the tensor must be present
            let g = grads.get(var.as_tensor());
            assert!(g.is_some(), "no gradient for {name}");
            if !name.contains("emb") {
                let total: f32 = g.unwrap().abs()?.sum_all()?.to_scalar()?;
                assert!(total > 0.0, "zero gradient for {name}");
            }
        }
        Ok(())
    }

    #[test]
    fn precomputed_towers_and_mismatch_error() -> Result<()> {
        let dev = Device::Cpu;
        let cfg = ModelConfig {
            image: ImageTowerConfig::Precomputed { dim: 4 },
            text: TextTowerConfig::Precomputed { dim: 3 },
            joint_dim: 2,
            hidden: 4,
        };
        let mut p = ParamStore::new(0, &dev);
        let m = MatchingModel::new(&cfg, &mut p)?;
        let x = Tensor::ones((3, 4), candle_core::DType::F32, &dev)?;
        assert_eq!(m.embed_images(&x)?.dims(), &[3, 2]);
        let t = TextBatch::Embeddings(Tensor::ones((3, 3), candle_core::DType::F32, &dev)?);
        assert_eq!(m.embed_texts(&t)?.dims(), &[3, 2]);
        let wrong = TextInputs::Tokens(vec![vec![1]]).batch(&[0], &dev)?;
        assert!(m.embed_texts(&wrong).is_err());
        Ok(())
    }
}
