//! The matching model: an image tower, a text tower and a shared joint space
//! in which similarity is the cosine (VSE style).

use candle_core::{DType, Module, Result, Tensor, D};
use serde::{Deserialize, Serialize};

use crate::gpo::Gpo;
use crate::inputs::{ImageBatch, TextBatch};
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
    /// Precomputed embeddings of width `dim` (e.g. CLIP features in the data,
    /// or a frozen tower's cached features).
    Precomputed {
        /// Embedding width.
        dim: usize,
        /// Width of the local features (grid cells / patches) when the head
        /// uses them; `None` when only global vectors are available.
        #[serde(default)]
        local_dim: Option<usize>,
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
        /// Width of the token features when the head uses them.
        #[serde(default)]
        local_dim: Option<usize>,
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
    /// Matching head: local projections and pooling (absent in checkpoints
    /// written before heads were configurable: the mean-pooling head).
    #[serde(default)]
    pub head: LocalOptions,
}

/// How the global embedding is pooled from local features.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pooling {
    /// The projection head: the tower's global vector (the flattened CNN
    /// grid, the mean word embedding, a frozen tower's mean-pooled features)
    /// goes through the tower's projection.
    #[default]
    Mean,
    /// VSE∞'s generalized pooling over the projected local features
    /// ([`crate::gpo`]); the towers' flat projections are then not built.
    Gpo,
}

/// The matching head: whether per-region / per-token projections exist and
/// how the global embedding is pooled. The default builds the plain
/// projection head; `local` adds local heads (ReCon's relation matrices need
/// them, GPO pools over them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalOptions {
    /// Build per-region / per-token projections into the joint space.
    #[serde(default)]
    pub local: bool,
    /// Global pooling when `local` is set (ignored otherwise).
    #[serde(default)]
    pub pooling: Pooling,
    /// Scale each precomputed global input vector (a frozen tower's cached
    /// feature) to unit length before the projection. Frozen towers' raw
    /// norms vary several-fold between items (MobileNetV2 14–36, MiniLM
    /// 2.8–8.7) and carry no matching information, so without this the
    /// head's first layer sees that spread as signal. Absent in checkpoints
    /// written before the option existed: raw inputs, as they were trained.
    #[serde(default)]
    pub unit_inputs: bool,
}

impl ModelConfig {
    /// Check every size against what a head can be built from: each width
    /// at least 1 and at most 65,536 (a vocabulary at most 2²²; a demo
    /// image 8 to 1,024 pixels, its CNN at most 512 channels wide). Sizes
    /// come from the data at `fit`, but `score` reads them from a
    /// checkpoint's `state.json`, which could hold anything: a head built
    /// from a huge width would abort on allocation instead of failing.
    pub fn check_sizes(&self) -> std::result::Result<(), String> {
        const WIDTH: usize = 65_536;
        let mut sizes = vec![
            ("joint_dim", self.joint_dim, WIDTH),
            ("hidden", self.hidden, WIDTH),
        ];
        match &self.image {
            ImageTowerConfig::DemoCnn { image_size, width } => {
                sizes.push(("image.width", *width, 512));
                if !(8..=1024).contains(image_size) {
                    return Err(format!(
                        "image.image_size = {image_size}: expected 8 to 1024"
                    ));
                }
            }
            ImageTowerConfig::Precomputed { dim, local_dim } => {
                sizes.push(("image.dim", *dim, WIDTH));
                sizes.extend(local_dim.map(|d| ("image.local_dim", d, WIDTH)));
            }
        }
        match &self.text {
            TextTowerConfig::DemoBow { vocab_size, dim } => {
                sizes.push(("text.vocab_size", *vocab_size, 1 << 22));
                sizes.push(("text.dim", *dim, WIDTH));
            }
            TextTowerConfig::Precomputed { dim, local_dim } => {
                sizes.push(("text.dim", *dim, WIDTH));
                sizes.extend(local_dim.map(|d| ("text.local_dim", d, WIDTH)));
            }
        }
        match sizes
            .into_iter()
            .find(|(_, v, max)| !(1..=*max).contains(v))
        {
            Some((key, v, max)) => Err(format!("{key} = {v}: expected 1 to {max}")),
            None => Ok(()),
        }
    }
}

impl LocalOptions {
    /// The head for `pooling`, with local heads when a method needs them
    /// anyway or the pooling works on local features.
    pub fn for_pooling(pooling: Pooling, method_needs_local: bool) -> LocalOptions {
        LocalOptions {
            local: method_needs_local || pooling == Pooling::Gpo,
            pooling,
            unit_inputs: false,
        }
    }

    /// The same head with [`LocalOptions::unit_inputs`] set to `on`.
    pub fn with_unit_inputs(self, on: bool) -> LocalOptions {
        LocalOptions {
            unit_inputs: on,
            ..self
        }
    }

    /// True when the global embedding is GPO over local features.
    pub fn gpo(&self) -> bool {
        self.local && self.pooling == Pooling::Gpo
    }
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

/// `proj` is `None` exactly when GPO pooling replaces the flat projection.
#[derive(Debug, Clone)]
enum ImageTower {
    Cnn {
        convs: Vec<Conv2d>,
        proj: Option<Projection>,
    },
    Precomputed {
        proj: Option<Projection>,
    },
}

/// `proj` is `None` exactly when GPO pooling replaces the flat projection.
#[derive(Debug, Clone)]
enum TextTower {
    Bow {
        emb: Embedding,
        proj: Option<Projection>,
    },
    Precomputed {
        proj: Option<Projection>,
    },
}

/// Per-region / per-token heads of a tower that provides local features.
#[derive(Debug, Clone)]
struct LocalHead {
    proj: Projection,
    gpo: Option<Gpo>,
}

impl LocalHead {
    /// `(global, local)` before normalisation: local features through the
    /// per-item projection; global by GPO over them, else `flat` (the
    /// tower's global input) through the tower's projection.
    fn forward(
        &self,
        cells: &Tensor,
        mask: &Tensor,
        flat: impl FnOnce() -> Result<Tensor>,
        proj: Option<&Projection>,
    ) -> Result<(Tensor, Tensor)> {
        let local = self.proj.forward(cells)?;
        let global = match (&self.gpo, proj) {
            (Some(gpo), _) => gpo.forward(&local, mask)?,
            (None, Some(proj)) => proj.forward(&flat()?)?,
            (None, None) => candle_core::bail!("tower has neither a projection nor a pooling head"),
        };
        Ok((global, local))
    }
}

/// Image and text towers mapping into one L2-normalised joint space.
#[derive(Debug, Clone)]
pub struct MatchingModel {
    config: ModelConfig,
    image: ImageTower,
    text: TextTower,
    image_local: Option<LocalHead>,
    text_local: Option<LocalHead>,
}

impl MatchingModel {
    /// Build the model described by `config` (towers, then the head it
    /// names), creating its parameters in `p`. Local heads' parameters are
    /// created after the towers', so the towers' initial values do not
    /// depend on the head. Fails when the head needs local features that a
    /// precomputed tower does not have.
    pub fn new(config: &ModelConfig, p: &mut ParamStore) -> Result<Self> {
        let (joint, hidden) = (config.joint_dim, config.hidden);
        let head = config.head;
        let flat_proj = |p: &mut ParamStore, fan_in: usize| -> Result<Option<Projection>> {
            if head.gpo() {
                Ok(None)
            } else {
                Projection::new(p, "proj", fan_in, hidden, joint).map(Some)
            }
        };
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
                    let proj = flat_proj(p, chans[3] * side * side)?;
                    ImageTower::Cnn { convs, proj }
                }
                ImageTowerConfig::Precomputed { dim, .. } => ImageTower::Precomputed {
                    proj: flat_proj(p, dim)?,
                },
            })
        })?;
        let text = p.scoped("text", |p| -> Result<TextTower> {
            Ok(match config.text {
                TextTowerConfig::DemoBow { vocab_size, dim } => TextTower::Bow {
                    emb: Embedding::new(p, "emb", vocab_size, dim)?,
                    proj: flat_proj(p, dim)?,
                },
                TextTowerConfig::Precomputed { dim, .. } => TextTower::Precomputed {
                    proj: flat_proj(p, dim)?,
                },
            })
        })?;
        let local_head = |p: &mut ParamStore, fan_in: usize| -> Result<LocalHead> {
            Ok(LocalHead {
                proj: Projection::new(p, "local_proj", fan_in, hidden, joint)?,
                gpo: if head.gpo() {
                    Some(Gpo::new(p, "gpo")?)
                } else {
                    None
                },
            })
        };
        let missing = |side: &str| {
            candle_core::Error::Msg(format!(
                "the {} head needs local {side} features, but the {side} tower is precomputed without them \
                 (an embedding column has none; frozen towers provide them)",
                if head.gpo() { "GPO" } else { "local" }
            ))
        };
        let (image_local, text_local) = if head.local {
            let image_fan_in = match config.image {
                ImageTowerConfig::DemoCnn { width, .. } => 4 * width,
                ImageTowerConfig::Precomputed { local_dim, .. } => {
                    local_dim.ok_or_else(|| missing("image"))?
                }
            };
            let text_fan_in = match config.text {
                TextTowerConfig::DemoBow { dim, .. } => dim,
                TextTowerConfig::Precomputed { local_dim, .. } => {
                    local_dim.ok_or_else(|| missing("text"))?
                }
            };
            (
                Some(p.scoped("image", |p| local_head(p, image_fan_in))?),
                Some(p.scoped("text", |p| local_head(p, text_fan_in))?),
            )
        } else {
            (None, None)
        };
        Ok(MatchingModel {
            config: config.clone(),
            image,
            text,
            image_local,
            text_local,
        })
    }

    /// The head this model was built with.
    pub fn options(&self) -> LocalOptions {
        self.config.head
    }

    /// A precomputed global input as the projection sees it: unit length
    /// when the head says [`LocalOptions::unit_inputs`], else as given.
    fn head_input(&self, global: &Tensor) -> Result<Tensor> {
        if self.config.head.unit_inputs {
            l2_normalize(global)
        } else {
            Ok(global.clone())
        }
    }

    /// The configuration this model was built from.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Image batch (as [`crate::inputs::ImageInputs::batch`] makes it) →
    /// unit vectors `[B, joint]`.
    pub fn embed_images(&self, x: &ImageBatch) -> Result<Tensor> {
        let z = match (&self.image, x) {
            (
                ImageTower::Cnn {
                    convs,
                    proj: Some(proj),
                },
                ImageBatch::Pixels(px),
            ) => proj.forward(&cnn_grid(convs, px)?.flatten_from(1)?)?,
            (
                ImageTower::Precomputed { proj: Some(proj) },
                ImageBatch::Embeddings { global, .. },
            ) => proj.forward(&self.head_input(global)?)?,
            (ImageTower::Cnn { proj: None, .. }, ImageBatch::Pixels(_))
            | (ImageTower::Precomputed { proj: None }, ImageBatch::Embeddings { .. }) => {
                return Ok(self.embed_images_local(x)?.0)
            }
            _ => candle_core::bail!("image batch does not match the image tower of this model"),
        };
        l2_normalize(&z)
    }

    /// Image batch → `(global [B, joint], local [B, P, joint], mask [B, P])`,
    /// global and local rows unit vectors. Local features are the cells of
    /// the demo CNN's last grid, or a frozen tower's cached grid cells /
    /// patches, through a per-cell projection; the global embedding is
    /// [`MatchingModel::embed_images`]'s, or GPO over the local features.
    pub fn embed_images_local(&self, x: &ImageBatch) -> Result<(Tensor, Tensor, Tensor)> {
        let Some(head) = &self.image_local else {
            candle_core::bail!(
                "this model has no local image head (build it with a local head: --head gpo, or a method that needs one)"
            );
        };
        let (global, local, mask) = match (&self.image, x) {
            (ImageTower::Cnn { convs, proj }, ImageBatch::Pixels(px)) => {
                let h = cnn_grid(convs, px)?; // [B, C, s, s]
                let cells = h.flatten_from(2)?.transpose(1, 2)?.contiguous()?; // [B, P, C]
                let (b, n, _) = cells.dims3()?;
                let mask = Tensor::ones((b, n), DType::F32, px.device())?;
                let (g, l) = head.forward(&cells, &mask, || h.flatten_from(1), proj.as_ref())?;
                (g, l, mask)
            }
            (ImageTower::Precomputed { proj }, ImageBatch::Embeddings { global, local }) => {
                let Some(lb) = local else {
                    candle_core::bail!(
                        "local image features were not loaded for this batch (the engine loads them when the head or method needs them)"
                    );
                };
                let (g, l) = head.forward(
                    &lb.feats,
                    &lb.mask,
                    || self.head_input(global),
                    proj.as_ref(),
                )?;
                (g, l, lb.mask.clone())
            }
            _ => candle_core::bail!("image batch does not match the image tower of this model"),
        };
        Ok((l2_normalize(&global)?, l2_normalize(&local)?, mask))
    }

    /// Text batch → `(global [B, joint], local [B, L, joint], mask [B, L])`;
    /// local rows are unit vectors (padding rows too; use the mask). Local
    /// features are the word embeddings of the demo tower, or a frozen
    /// tower's cached token features, through a per-token projection.
    pub fn embed_texts_local(&self, t: &TextBatch) -> Result<(Tensor, Tensor, Tensor)> {
        let Some(head) = &self.text_local else {
            candle_core::bail!(
                "this model has no local text head (build it with a local head: --head gpo, or a method that needs one)"
            );
        };
        let (global, local, mask) = match (&self.text, t) {
            (TextTower::Bow { emb, proj }, TextBatch::Tokens { ids, mask }) => {
                let e = emb.forward(ids)?; // [B, L, E]
                let (g, l) = head.forward(&e, mask, || masked_mean(&e, mask), proj.as_ref())?;
                (g, l, mask.clone())
            }
            (TextTower::Precomputed { proj }, TextBatch::Embeddings { global, local }) => {
                let Some(lb) = local else {
                    candle_core::bail!(
                        "token features were not loaded for this batch (the engine loads them when the head or method needs them)"
                    );
                };
                let (g, l) = head.forward(
                    &lb.feats,
                    &lb.mask,
                    || self.head_input(global),
                    proj.as_ref(),
                )?;
                (g, l, lb.mask.clone())
            }
            _ => candle_core::bail!("text batch does not match the text tower of this model"),
        };
        Ok((l2_normalize(&global)?, l2_normalize(&local)?, mask))
    }

    /// Pooled image features before the head, as unit vectors `[B, F]`: a
    /// frozen tower's global vector (the backbone's pooled output), or the
    /// demo CNN's last grid averaged over its cells. They place a pair's
    /// image among the others by the tower alone, not by the joint space the
    /// noisy pairs are shaping (ESC's BiCro soft labels compare pairs by them).
    pub fn pooled_images(&self, x: &ImageBatch) -> Result<Tensor> {
        let pooled = match (&self.image, x) {
            (ImageTower::Cnn { convs, .. }, ImageBatch::Pixels(px)) => {
                cnn_grid(convs, px)?.flatten_from(2)?.mean(2)?
            }
            (ImageTower::Precomputed { .. }, ImageBatch::Embeddings { global, .. }) => {
                global.clone()
            }
            _ => candle_core::bail!("image batch does not match the image tower of this model"),
        };
        l2_normalize(&pooled)
    }

    /// Pooled caption features before the head, as unit vectors `[B, F]`: a
    /// frozen tower's global vector, or the demo tower's mean word embedding
    /// (see [`MatchingModel::pooled_images`]).
    pub fn pooled_texts(&self, t: &TextBatch) -> Result<Tensor> {
        let pooled = match (&self.text, t) {
            (TextTower::Bow { emb, .. }, TextBatch::Tokens { ids, mask }) => {
                masked_mean(&emb.forward(ids)?, mask)?
            }
            (TextTower::Precomputed { .. }, TextBatch::Embeddings { global, .. }) => global.clone(),
            _ => candle_core::bail!("text batch does not match the text tower of this model"),
        };
        l2_normalize(&pooled)
    }

    /// Text batch → unit vectors `[B, joint]`.
    pub fn embed_texts(&self, t: &TextBatch) -> Result<Tensor> {
        let z = match (&self.text, t) {
            (
                TextTower::Bow {
                    emb,
                    proj: Some(proj),
                },
                TextBatch::Tokens { ids, mask },
            ) => proj.forward(&masked_mean(&emb.forward(ids)?, mask)?)?,
            (TextTower::Precomputed { proj: Some(proj) }, TextBatch::Embeddings { global, .. }) => {
                proj.forward(&self.head_input(global)?)?
            }
            (TextTower::Bow { proj: None, .. }, TextBatch::Tokens { .. })
            | (TextTower::Precomputed { proj: None }, TextBatch::Embeddings { .. }) => {
                return Ok(self.embed_texts_local(t)?.0)
            }
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
    use crate::inputs::{ImageInputs, LocalFeatures, TextInputs};
    use candle_core::Device;
    use half::f16;

    #[test]
    fn sizes_are_checked_on_both_towers_and_the_head() {
        assert_eq!(demo_config().check_sizes(), Ok(()));
        let emb = |dim, local_dim| ModelConfig {
            image: ImageTowerConfig::Precomputed { dim, local_dim },
            text: TextTowerConfig::Precomputed {
                dim: 4,
                local_dim: None,
            },
            ..demo_config()
        };
        assert_eq!(emb(65_536, Some(1)).check_sizes(), Ok(()));
        for (config, want) in [
            (emb(65_537, None), "image.dim = 65537: expected 1 to 65536"),
            (emb(8, Some(0)), "image.local_dim = 0: expected 1 to 65536"),
            (
                ModelConfig {
                    hidden: 0,
                    ..demo_config()
                },
                "hidden = 0",
            ),
            (
                ModelConfig {
                    image: ImageTowerConfig::DemoCnn {
                        image_size: 4,
                        width: 4,
                    },
                    ..demo_config()
                },
                "image.image_size = 4: expected 8 to 1024",
            ),
            (
                ModelConfig {
                    text: TextTowerConfig::DemoBow {
                        vocab_size: 1 << 23,
                        dim: 4,
                    },
                    ..demo_config()
                },
                "text.vocab_size = 8388608: expected 1 to 4194304",
            ),
        ] {
            let e = config.check_sizes().unwrap_err();
            assert!(e.starts_with(want), "{e}");
        }
    }

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
            head: LocalOptions::default(),
        }
    }

    fn with_head(cfg: &ModelConfig, local: bool, pooling: Pooling) -> ModelConfig {
        ModelConfig {
            head: LocalOptions {
                local,
                pooling,
                unit_inputs: false,
            },
            ..cfg.clone()
        }
    }

    fn var_names(p: &ParamStore) -> Vec<String> {
        let mut v: Vec<String> = p.varmap().data().lock().unwrap().keys().cloned().collect();
        v.sort();
        v
    }

    /// Every variable of `p` has a gradient in `grads`, non-zero except
    /// embedding tables (rows of unused words get none).
    fn assert_all_grads(p: &ParamStore, grads: &candle_core::backprop::GradStore, what: &str) {
        let vars = p.varmap().data().lock().unwrap();
        assert!(!vars.is_empty());
        for (name, var) in vars.iter() {
            let g = grads.get(var.as_tensor());
            assert!(g.is_some(), "no gradient for {name} ({what})");
            if !name.contains("emb") {
                let total: f32 = g
                    .unwrap()
                    .abs()
                    .unwrap()
                    .sum_all()
                    .unwrap()
                    .to_scalar()
                    .unwrap();
                assert!(total > 0.0, "zero gradient for {name} ({what})");
            }
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
        assert_all_grads(&p, &loss.backward()?, "mean head");
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
        let names = |c: &ModelConfig| -> Result<Vec<String>> {
            let mut p = ParamStore::new(3, &dev);
            MatchingModel::new(c, &mut p)?;
            Ok(var_names(&p))
        };
        // a config from before heads existed parses to the mean head
        let json = r#"{"image":{"kind":"demo_cnn","image_size":16,"width":4},
            "text":{"kind":"demo_bow","vocab_size":10,"dim":6},"joint_dim":5,"hidden":7}"#;
        let old: ModelConfig =
            serde_json::from_str(json).map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        assert_eq!(old, cfg);
        let base = names(&cfg)?;
        assert!(names(&with_head(&cfg, true, Pooling::Mean))?.len() > base.len());
        // the towers' first parameters do not depend on the head
        assert!(names(&with_head(&cfg, true, Pooling::Gpo))?
            .contains(&"image.conv0.weight".to_string()));

        let imgs = ImageInputs::Pixels {
            data: (0..2 * 3 * 256).map(|i| (i * 7 % 256) as u8).collect(),
            size: 16,
        };
        let texts = TextInputs::Tokens(vec![vec![2, 3], vec![4, 5, 6]]);
        for pooling in [Pooling::Mean, Pooling::Gpo] {
            let mut p = ParamStore::new(3, &dev);
            let model = MatchingModel::new(&with_head(&cfg, true, pooling), &mut p)?;
            let (gi, li, imask) = model.embed_images_local(&imgs.batch(&[0, 1], &dev)?)?;
            let (gt, lt, mask) = model.embed_texts_local(&texts.batch(&[0, 1], &dev)?)?;
            // 16 → 8 → 4 → 2: four grid cells; 3 tokens at most
            assert_eq!(li.dims(), &[2, 4, 5]);
            assert_eq!(imask.to_vec2::<f32>()?, vec![vec![1.0; 4]; 2]);
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
            assert_all_grads(&p, &loss.backward()?, &format!("{pooling:?}"));
        }
        Ok(())
    }

    /// Two pairs of precomputed features: global vectors of width 4 / 3 and
    /// local sets of width 3 (images: 3 cells each) / 2 (texts: 2 and 1 tokens).
    fn precomputed_inputs(with_local: bool) -> (ImageInputs, TextInputs) {
        let f = |v: Vec<f32>| v.into_iter().map(f16::from_f32).collect::<Vec<_>>();
        let image_local = LocalFeatures {
            dim: 3,
            data: f((0..18).map(|i| ((i * 5 % 7) as f32 - 3.0) / 3.0).collect()),
            offsets: vec![0, 3, 6],
            index: vec![0, 1],
        };
        let text_local = LocalFeatures {
            dim: 2,
            data: f(vec![0.5, -1.0, 1.0, 0.25, -0.5, 0.75]),
            offsets: vec![0, 2, 3],
            index: vec![0, 1],
        };
        (
            ImageInputs::Embeddings {
                data: vec![0.1, 0.2, -0.3, 0.4, 0.5, -0.6, 0.7, 0.8],
                dim: 4,
                local: with_local.then_some(image_local),
            },
            TextInputs::Embeddings {
                data: vec![0.3, -0.1, 0.2, 0.6, 0.4, -0.2],
                dim: 3,
                local: with_local.then_some(text_local),
            },
        )
    }

    fn precomputed_config(local_dims: bool) -> ModelConfig {
        ModelConfig {
            image: ImageTowerConfig::Precomputed {
                dim: 4,
                local_dim: local_dims.then_some(3),
            },
            text: TextTowerConfig::Precomputed {
                dim: 3,
                local_dim: local_dims.then_some(2),
            },
            joint_dim: 2,
            hidden: 4,
            head: LocalOptions::default(),
        }
    }

    #[test]
    fn unit_inputs_make_the_head_blind_to_input_norms() -> Result<()> {
        let dev = Device::Cpu;
        // Row 1 of each tower is row 0 times 3: same direction, other norm.
        let imgs = ImageInputs::Embeddings {
            data: vec![0.1, 0.2, -0.3, 0.4, 0.3, 0.6, -0.9, 1.2],
            dim: 4,
            local: None,
        };
        let texts = TextInputs::Embeddings {
            data: vec![0.3, -0.1, 0.2, 0.9, -0.3, 0.6],
            dim: 3,
            local: None,
        };
        let rows = |t: Tensor| -> Result<(Vec<f32>, Vec<f32>)> {
            let v: Vec<Vec<f32>> = t.to_vec2()?;
            Ok((v[0].clone(), v[1].clone()))
        };
        let max_diff = |(a, b): (Vec<f32>, Vec<f32>)| {
            a.iter()
                .zip(&b)
                .map(|(x, y)| (x - y).abs())
                .fold(0f32, f32::max)
        };
        for unit in [false, true] {
            let mut cfg = precomputed_config(false);
            cfg.head = cfg.head.with_unit_inputs(unit);
            let m = MatchingModel::new(&cfg, &mut ParamStore::new(3, &dev))?;
            let di = max_diff(rows(m.embed_images(&imgs.batch(&[0, 1], &dev)?)?)?);
            let dt = max_diff(rows(m.embed_texts(&texts.batch(&[0, 1], &dev)?)?)?);
            if unit {
                assert!(di < 1e-6 && dt < 1e-6, "{di} {dt}");
            } else {
                // Biases and the ReLU make the raw head depend on the norm.
                assert!(di > 1e-3 && dt > 1e-3, "{di} {dt}");
            }
        }
        // Checkpoints written before the option: raw inputs.
        let old: LocalOptions = serde_json::from_str(r#"{"local":false,"pooling":"mean"}"#)
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        assert!(!old.unit_inputs);
        Ok(())
    }

    #[test]
    fn precomputed_towers_and_mismatch_error() -> Result<()> {
        let dev = Device::Cpu;
        let cfg = precomputed_config(false);
        let mut p = ParamStore::new(0, &dev);
        let m = MatchingModel::new(&cfg, &mut p)?;
        let (imgs, texts) = precomputed_inputs(false);
        let x = imgs.batch(&[0, 1], &dev)?;
        let t = texts.batch(&[0, 1], &dev)?;
        assert_eq!(m.embed_images(&x)?.dims(), &[2, 2]);
        assert_eq!(m.embed_texts(&t)?.dims(), &[2, 2]);
        let wrong = TextInputs::Tokens(vec![vec![1]]).batch(&[0], &dev)?;
        assert!(m.embed_texts(&wrong).is_err());
        assert!(m
            .embed_images_local(&x)
            .unwrap_err()
            .to_string()
            .contains("no local image head"));
        // a GPO head on towers without local features fails at build time
        let mut p = ParamStore::new(0, &dev);
        let e = MatchingModel::new(&with_head(&cfg, true, Pooling::Gpo), &mut p)
            .unwrap_err()
            .to_string();
        assert!(e.contains("GPO head needs local image features"), "{e}");
        Ok(())
    }

    #[test]
    fn pooled_features_are_the_towers_own_and_ignore_the_head() -> Result<()> {
        let dev = Device::Cpu;
        let close = |got: Vec<f32>, want: &[f32]| {
            assert_eq!(got.len(), want.len());
            for (g, w) in got.iter().zip(want) {
                assert!((g - w).abs() < 1e-5, "{got:?} vs {want:?}");
            }
        };
        // Precomputed towers: the input vector, unit-normalised, whatever the head.
        // image 0 = [0.1, 0.2, −0.3, 0.4], |·| = √0.30 = 0.547723
        //   → [0.182574, 0.365148, −0.547723, 0.730297]
        // caption 1 = [0.6, 0.4, −0.2], |·| = √0.56 = 0.748331
        //   → [0.801784, 0.534522, −0.267261]
        let (imgs, texts) = precomputed_inputs(true);
        for head in [(false, Pooling::Mean), (true, Pooling::Gpo)] {
            let cfg = with_head(&precomputed_config(true), head.0, head.1);
            let m = MatchingModel::new(&cfg, &mut ParamStore::new(5, &dev))?;
            let pi = m.pooled_images(&imgs.batch(&[0], &dev)?)?;
            close(
                pi.flatten_all()?.to_vec1()?,
                &[0.182574, 0.365148, -0.547723, 0.730297],
            );
            let pt = m.pooled_texts(&texts.batch(&[1], &dev)?)?;
            close(
                pt.flatten_all()?.to_vec1()?,
                &[0.801784, 0.534522, -0.267261],
            );
        }
        // Demo text tower: the mean of the caption's word vectors, normalised.
        let mut p = ParamStore::new(3, &dev);
        let m = MatchingModel::new(&demo_config(), &mut p)?;
        let table: Vec<Vec<f32>> = {
            let vars = p.varmap().data().lock().unwrap();
            vars["text.emb.weight"].as_tensor().to_vec2()?
        };
        let mean: Vec<f32> = (0..6).map(|d| (table[2][d] + table[3][d]) / 2.0).collect();
        let norm = mean.iter().map(|v| v * v).sum::<f32>().sqrt();
        let want: Vec<f32> = mean.iter().map(|v| v / norm).collect();
        let texts = TextInputs::Tokens(vec![vec![2, 3]]);
        close(
            m.pooled_texts(&texts.batch(&[0], &dev)?)?
                .flatten_all()?
                .to_vec1()?,
            &want,
        );
        // Demo CNN: the last grid averaged over cells, one value per channel.
        let imgs = ImageInputs::Pixels {
            data: (0..2 * 3 * 64).map(|i| (i * 7 % 256) as u8).collect(),
            size: 8,
        };
        let pi = m.pooled_images(&imgs.batch(&[0, 1], &dev)?)?;
        assert_eq!(pi.dims(), &[2, 16]);
        let norms: Vec<f32> = pi.sqr()?.sum(1)?.to_vec1()?;
        assert!(norms.iter().all(|n| (n - 1.0).abs() < 1e-5), "{norms:?}");
        Ok(())
    }

    #[test]
    fn precomputed_local_features_feed_both_heads_and_train_every_parameter() -> Result<()> {
        let dev = Device::Cpu;
        let (imgs, texts) = precomputed_inputs(true);
        for pooling in [Pooling::Mean, Pooling::Gpo] {
            let mut p = ParamStore::new(5, &dev);
            let m =
                MatchingModel::new(&with_head(&precomputed_config(true), true, pooling), &mut p)?;
            let x = imgs.batch(&[0, 1], &dev)?;
            let t = texts.batch(&[1, 0], &dev)?;
            let (gi, li, imask) = m.embed_images_local(&x)?;
            let (gt, lt, tmask) = m.embed_texts_local(&t)?;
            assert_eq!(li.dims(), &[2, 3, 2]);
            assert_eq!(imask.to_vec2::<f32>()?, vec![vec![1.0; 3]; 2]);
            assert_eq!(lt.dims(), &[2, 2, 2]);
            assert_eq!(
                tmask.to_vec2::<f32>()?,
                vec![vec![1.0, 0.0], vec![1.0, 1.0]]
            );
            // the plain path is the global output of the local path
            assert_eq!(m.embed_images(&x)?.to_vec2::<f32>()?, gi.to_vec2::<f32>()?);
            assert_eq!(m.embed_texts(&t)?.to_vec2::<f32>()?, gt.to_vec2::<f32>()?);
            let s = similarity(&gi, &gt)?;
            let cross = li.broadcast_matmul(&lt.transpose(1, 2)?)?;
            let loss = ((s.sum_all()? - s.sqr()?.sum_all()?)? + cross.sqr()?.sum_all()?)?;
            assert_all_grads(&p, &loss.backward()?, &format!("precomputed {pooling:?}"));
            // without the flat projections, GPO global vectors ignore the global input
            if pooling == Pooling::Gpo {
                assert!(!var_names(&p).iter().any(|n| n.starts_with("image.proj")));
            }
        }
        // local features missing from a batch: a clear error, not a panic
        let mut p = ParamStore::new(5, &dev);
        let m = MatchingModel::new(
            &with_head(&precomputed_config(true), true, Pooling::Gpo),
            &mut p,
        )?;
        let (bare, _) = precomputed_inputs(false);
        let e = m
            .embed_images(&bare.batch(&[0], &dev)?)
            .unwrap_err()
            .to_string();
        assert!(e.contains("were not loaded"), "{e}");
        Ok(())
    }
}
