//! The matching model: an image tower, a text tower and a shared joint space
//! in which similarity is the cosine (VSE style).

use candle_core::{DType, Module, Result, Tensor, D};
use serde::{Deserialize, Serialize};

use crate::gpo::Gpo;
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

/// How the global embedding is pooled from local features.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pooling {
    /// Today's heads: the flattened CNN grid and the mean word embedding go
    /// through the tower's projection.
    #[default]
    Mean,
    /// VSE∞'s generalized pooling over the projected local features
    /// ([`crate::gpo`]); the towers' flat projections are then not built.
    Gpo,
}

/// Optional local-feature heads. The default builds exactly the parameter set
/// of [`MatchingModel::new`], so existing checkpoints and pipelines are
/// unaffected; only pipelines that ask for local features get new parameters.
///
/// Kept apart from [`ModelConfig`] (rather than as new fields on it) because
/// `ModelConfig` is built with struct literals across the workspace.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalOptions {
    /// Build per-region / per-token projections into the joint space.
    #[serde(default)]
    pub local: bool,
    /// Global pooling when `local` is set (ignored otherwise).
    #[serde(default)]
    pub pooling: Pooling,
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
    pub fn new(
        p: &mut ParamStore,
        name: &str,
        fan_in: usize,
        hidden: usize,
        joint: usize,
    ) -> Result<Self> {
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
    /// `proj` is `None` only when GPO pooling replaces it.
    Cnn {
        convs: Vec<Conv2d>,
        proj: Option<Projection>,
    },
    Precomputed {
        proj: Projection,
    },
}

#[derive(Debug, Clone)]
enum TextTower {
    /// `proj` is `None` only when GPO pooling replaces it.
    Bow {
        emb: Embedding,
        proj: Option<Projection>,
    },
    Precomputed {
        proj: Projection,
    },
}

/// Per-region / per-token heads of a tower that provides local features.
#[derive(Debug, Clone)]
struct LocalHead {
    proj: Projection,
    gpo: Option<Gpo>,
}

/// Image and text towers mapping into one L2-normalised joint space.
#[derive(Debug, Clone)]
pub struct MatchingModel {
    config: ModelConfig,
    options: LocalOptions,
    image: ImageTower,
    text: TextTower,
    image_local: Option<LocalHead>,
    text_local: Option<LocalHead>,
}

impl MatchingModel {
    /// Build the model, creating its parameters in `p`.
    pub fn new(config: &ModelConfig, p: &mut ParamStore) -> Result<Self> {
        Self::with_options(config, LocalOptions::default(), p)
    }

    /// Build the model with optional local heads. With the default options
    /// this is [`MatchingModel::new`], parameter for parameter. Local heads
    /// exist only for towers that see regions/tokens (demo CNN, demo BoW);
    /// their parameters are created after the towers' so the towers' initial
    /// values do not depend on the options.
    pub fn with_options(
        config: &ModelConfig,
        options: LocalOptions,
        p: &mut ParamStore,
    ) -> Result<Self> {
        let (joint, hidden) = (config.joint_dim, config.hidden);
        let gpo = options.local && options.pooling == Pooling::Gpo;
        let image = p.scoped("image", |p| -> Result<ImageTower> {
            Ok(match config.image {
                ImageTowerConfig::DemoCnn { image_size, width } => {
                    // Three stride-2 convolutions; the final grid is flattened
                    // (not pooled) so the head sees where things are.
                    let chans = [3, width, 2 * width, 4 * width];
                    let mut convs = Vec::new();
                    let mut side = image_size;
                    for i in 0..3 {
                        convs.push(Conv2d::new(
                            p,
                            &format!("conv{i}"),
                            chans[i],
                            chans[i + 1],
                            3,
                            2,
                            1,
                        )?);
                        side = side.div_ceil(2);
                    }
                    let flat = chans[3] * side * side;
                    let proj = if gpo {
                        None
                    } else {
                        Some(Projection::new(p, "proj", flat, hidden, joint)?)
                    };
                    ImageTower::Cnn { convs, proj }
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
                    proj: if gpo {
                        None
                    } else {
                        Some(Projection::new(p, "proj", dim, hidden, joint)?)
                    },
                },
                TextTowerConfig::Precomputed { dim } => TextTower::Precomputed {
                    proj: Projection::new(p, "proj", dim, hidden, joint)?,
                },
            })
        })?;
        let local_head = |p: &mut ParamStore, fan_in: usize| -> Result<LocalHead> {
            Ok(LocalHead {
                proj: Projection::new(p, "local_proj", fan_in, hidden, joint)?,
                gpo: if gpo { Some(Gpo::new(p, "gpo")?) } else { None },
            })
        };
        let image_local = match (&image, &config.image) {
            (ImageTower::Cnn { .. }, ImageTowerConfig::DemoCnn { width, .. }) if options.local => {
                Some(p.scoped("image", |p| local_head(p, 4 * width))?)
            }
            _ => None,
        };
        let text_local = match (&text, &config.text) {
            (TextTower::Bow { .. }, TextTowerConfig::DemoBow { dim, .. }) if options.local => {
                Some(p.scoped("text", |p| local_head(p, *dim))?)
            }
            _ => None,
        };
        Ok(MatchingModel {
            config: config.clone(),
            options,
            image,
            text,
            image_local,
            text_local,
        })
    }

    /// The local-head options this model was built with.
    pub fn options(&self) -> LocalOptions {
        self.options
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
                let h = cnn_grid(convs, x)?;
                match proj {
                    Some(proj) => proj.forward(&h.flatten_from(1)?)?,
                    None => return Ok(self.embed_images_local(x)?.0),
                }
            }
            ImageTower::Precomputed { proj } => proj.forward(x)?,
        };
        l2_normalize(&z)
    }

    /// Image batch → `(global [B, joint], local [B, P, joint])`, both with
    /// unit rows. Local features are the cells of the CNN's last grid
    /// (P = side²) through a per-cell projection; the global embedding is
    /// [`MatchingModel::embed_images`]'s, or GPO over the local features.
    pub fn embed_images_local(&self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        let (ImageTower::Cnn { convs, proj }, Some(head)) = (&self.image, &self.image_local) else {
            candle_core::bail!(
                "local image features need a tower that provides them (the demo CNN built with local heads); \
                 precomputed global embeddings have no regions"
            );
        };
        let h = cnn_grid(convs, x)?; // [B, C, s, s]
        let cells = h.flatten_from(2)?.transpose(1, 2)?.contiguous()?; // [B, P, C]
        let local = head.proj.forward(&cells)?;
        let global = match (&head.gpo, proj) {
            (Some(gpo), _) => {
                let (b, n, _) = local.dims3()?;
                let mask = Tensor::ones((b, n), DType::F32, x.device())?;
                gpo.forward(&local, &mask)?
            }
            (None, Some(proj)) => proj.forward(&h.flatten_from(1)?)?,
            (None, None) => {
                candle_core::bail!("image tower has neither a projection nor a pooling head")
            }
        };
        Ok((l2_normalize(&global)?, l2_normalize(&local)?))
    }

    /// Text batch → `(global [B, joint], local [B, L, joint], mask [B, L])`;
    /// local rows are unit vectors (padding rows too; use the mask). Local
    /// features are the word embeddings through a per-token projection.
    pub fn embed_texts_local(&self, t: &TextBatch) -> Result<(Tensor, Tensor, Tensor)> {
        let (TextTower::Bow { emb, proj }, Some(head), TextBatch::Tokens { ids, mask }) =
            (&self.text, &self.text_local, t)
        else {
            candle_core::bail!(
                "local text features need a tower that provides them (the demo bag-of-words tower built with \
                 local heads and a token batch); precomputed global embeddings have no tokens"
            );
        };
        let e = emb.forward(ids)?; // [B, L, E]
        let local = head.proj.forward(&e)?;
        let global = match (&head.gpo, proj) {
            (Some(gpo), _) => gpo.forward(&local, mask)?,
            (None, Some(proj)) => proj.forward(&masked_mean(&e, mask)?)?,
            (None, None) => {
                candle_core::bail!("text tower has neither a projection nor a pooling head")
            }
        };
        Ok((l2_normalize(&global)?, l2_normalize(&local)?, mask.clone()))
    }

    /// Text batch → unit vectors `[B, joint]`.
    pub fn embed_texts(&self, t: &TextBatch) -> Result<Tensor> {
        let z = match (&self.text, t) {
            (TextTower::Bow { emb, proj }, TextBatch::Tokens { ids, mask }) => match proj {
                Some(proj) => proj.forward(&masked_mean(&emb.forward(ids)?, mask)?)?,
                None => return Ok(self.embed_texts_local(t)?.0),
            },
            (TextTower::Precomputed { proj }, TextBatch::Embeddings(x)) => proj.forward(x)?,
            _ => candle_core::bail!("text batch does not match the text tower of this model"),
        };
        l2_normalize(&z)
    }
}

/// The demo CNN's last feature grid `[B, C, s, s]`.
fn cnn_grid(convs: &[Conv2d], x: &Tensor) -> Result<Tensor> {
    let mut h = x.clone();
    for c in convs {
        h = c.forward(&h)?.relu()?;
    }
    Ok(h)
}

/// Mean of `e [B, L, E]` over the real tokens of `mask [B, L]`.
fn masked_mean(e: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let m = mask.unsqueeze(D::Minus1)?; // [B, L, 1]
    let summed = e.broadcast_mul(&m)?.sum(1)?;
    let count = m.sum(1)?.clamp(1.0, f64::MAX)?;
    summed.broadcast_div(&count)
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
    fn local_heads_are_opt_in_and_every_parameter_receives_a_gradient() -> Result<()> {
        let dev = Device::Cpu;
        // 16 px → a 2×2 grid: GPO needs more than one cell to have a gradient
        let cfg = ModelConfig {
            image: ImageTowerConfig::DemoCnn {
                image_size: 16,
                width: 4,
            },
            ..demo_config()
        };
        let names = |o: LocalOptions| -> Result<Vec<String>> {
            let mut p = ParamStore::new(3, &dev);
            MatchingModel::with_options(&cfg.clone(), o, &mut p)?;
            let mut v: Vec<String> = p.varmap().data().lock().unwrap().keys().cloned().collect();
            v.sort();
            Ok(v)
        };
        // default options = today's parameter set
        let mut p = ParamStore::new(3, &dev);
        MatchingModel::new(&cfg.clone(), &mut p)?;
        let mut base: Vec<String> = p.varmap().data().lock().unwrap().keys().cloned().collect();
        base.sort();
        assert_eq!(names(LocalOptions::default())?, base);
        assert!(
            names(LocalOptions {
                local: true,
                pooling: Pooling::Mean
            })?
            .len()
                > base.len()
        );

        let imgs = ImageInputs::Pixels {
            data: (0..2 * 3 * 256).map(|i| (i * 7 % 256) as u8).collect(),
            size: 16,
        };
        let texts = TextInputs::Tokens(vec![vec![2, 3], vec![4, 5, 6]]);
        for pooling in [Pooling::Mean, Pooling::Gpo] {
            let mut p = ParamStore::new(3, &dev);
            let model = MatchingModel::with_options(
                &cfg.clone(),
                LocalOptions {
                    local: true,
                    pooling,
                },
                &mut p,
            )?;
            let (gi, li) = model.embed_images_local(&imgs.batch(&[0, 1], &dev)?)?;
            let (gt, lt, mask) = model.embed_texts_local(&texts.batch(&[0, 1], &dev)?)?;
            // 16 → 8 → 4 → 2: four grid cells; 3 tokens at most
            assert_eq!(li.dims(), &[2, 4, 5]);
            assert_eq!(lt.dims(), &[2, 3, 5]);
            assert_eq!(
                mask.to_vec2::<f32>()?,
                vec![vec![1.0, 1.0, 0.0], vec![1.0, 1.0, 1.0]]
            );
            let norms: Vec<f32> = gi.sqr()?.sum(1)?.to_vec1()?;
            assert!(norms.iter().all(|n| (n - 1.0).abs() < 1e-5));
            // the plain embedding agrees with the global output of the local path
            let plain: Vec<Vec<f32>> =
                model.embed_texts(&texts.batch(&[0, 1], &dev)?)?.to_vec2()?;
            assert_eq!(plain, gt.to_vec2::<f32>()?);
            let s = similarity(&gi, &gt)?;
            let cross = li.broadcast_matmul(&lt.transpose(1, 2)?)?; // [B, P, L]
            let loss = ((s.sum_all()? - s.sqr()?.sum_all()?)? + cross.sqr()?.sum_all()?)?;
            let grads = loss.backward()?;
            for (name, var) in p.varmap().data().lock().unwrap().iter() {
                let g = grads.get(var.as_tensor());
                assert!(g.is_some(), "no gradient for {name} ({pooling:?})");
                if !name.contains("emb") {
                    let total: f32 = g.unwrap().abs()?.sum_all()?.to_scalar()?;
                    assert!(total > 0.0, "zero gradient for {name} ({pooling:?})");
                }
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
        let mut p = ParamStore::new(0, &dev);
        let local = LocalOptions {
            local: true,
            pooling: Pooling::Gpo,
        };
        let m = MatchingModel::with_options(&cfg, local, &mut p)?;
        let e = m.embed_images_local(&x).unwrap_err().to_string();
        assert!(e.contains("need a tower that provides them"), "{e}");
        assert!(m.embed_texts_local(&t).is_err());
        Ok(())
    }
}
