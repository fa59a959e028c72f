//! One trainable matching network with its optimiser.

use candle_core::{Device, Result, Tensor};
use candle_nn::VarMap;
use ncclean_models::{similarity, MatchingModel, ModelConfig, PairInputs, ParamStore};

use crate::adam::Adam;

/// A matching model, its parameters and an Adam optimiser with gradient-norm
/// clipping.
pub struct Net {
    /// The model.
    pub model: MatchingModel,
    varmap: VarMap,
    opt: Adam,
    clip: f64,
    device: Device,
}

impl Net {
    /// A freshly initialised network (towers and head as `config` says);
    /// `seed` fixes its initial weights.
    pub fn new(
        config: &ModelConfig,
        seed: u64,
        device: &Device,
        lr: f64,
        clip: f64,
    ) -> Result<Net> {
        let mut store = ParamStore::new(seed, device);
        let model = MatchingModel::new(config, &mut store)?;
        let varmap = store.into_varmap();
        // Adam, as the papers use it: no decoupled weight decay.
        let opt = Adam::new(&varmap, lr)?;
        Ok(Net {
            model,
            varmap,
            opt,
            clip,
            device: device.clone(),
        })
    }

    /// The parameters (for checkpoints).
    pub fn varmap(&self) -> &VarMap {
        &self.varmap
    }

    /// Mutable parameters (to load a checkpoint into).
    pub fn varmap_mut(&mut self) -> &mut VarMap {
        &mut self.varmap
    }

    /// The optimiser (its moments go into resumable checkpoints).
    pub fn optimizer(&self) -> &Adam {
        &self.opt
    }

    /// Mutable optimiser, to restore its moments.
    pub fn optimizer_mut(&mut self) -> &mut Adam {
        &mut self.opt
    }

    /// The device the network runs on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Set the learning rate (schedules).
    pub fn set_lr(&mut self, lr: f64) {
        self.opt.set_lr(lr);
    }

    /// Similarity matrix of the pairs `idx` (with gradients).
    pub fn batch_similarity(&self, data: &PairInputs, idx: &[usize]) -> Result<Tensor> {
        let (vi, vt) = self.batch_embeddings(data, idx)?;
        similarity(&vi, &vt)
    }

    /// Joint-space embeddings of images and captions `idx` (with gradients).
    pub fn batch_embeddings(&self, data: &PairInputs, idx: &[usize]) -> Result<(Tensor, Tensor)> {
        let vi = self
            .model
            .embed_images(&data.images.batch(idx, &self.device)?)?;
        let vt = self
            .model
            .embed_texts(&data.texts.batch(idx, &self.device)?)?;
        Ok((vi, vt))
    }

    /// Pooled tower features (before the head) of images and captions
    /// `idx`, unit vectors, without gradients
    /// ([`ncclean_models::MatchingModel::pooled_images`]).
    pub fn batch_pooled(&self, data: &PairInputs, idx: &[usize]) -> Result<(Tensor, Tensor)> {
        let pi = self
            .model
            .pooled_images(&data.images.batch(idx, &self.device)?)?;
        let pt = self
            .model
            .pooled_texts(&data.texts.batch(idx, &self.device)?)?;
        Ok((pi.detach(), pt.detach()))
    }

    /// Embeddings of every pair, computed in chunks without gradients. Each
    /// distinct image is embedded once ([`ImageInputs::distinct`]) and
    /// shared by the pairs that show it.
    ///
    /// [`ImageInputs::distinct`]: ncclean_models::ImageInputs::distinct
    pub fn embed_all(&self, data: &PairInputs, chunk: usize) -> Result<(Tensor, Tensor)> {
        let n = data.len();
        if n == 0 {
            candle_core::bail!("no pairs to embed");
        }
        let chunked = |idx: &[usize], embed: &dyn Fn(&[usize]) -> Result<Tensor>| {
            let parts = idx
                .chunks(chunk.max(1))
                .map(|c| Ok(embed(c)?.detach()))
                .collect::<Result<Vec<_>>>()?;
            Tensor::cat(&parts, 0)
        };
        let (first, of) = data.images.distinct();
        let vi = chunked(&first, &|c| {
            self.model
                .embed_images(&data.images.batch(c, &self.device)?)
        })?;
        let vi = if first.len() < n {
            vi.index_select(&Tensor::from_vec(of, n, &self.device)?, 0)?
        } else {
            vi
        };
        let all: Vec<usize> = (0..n).collect();
        let vt = chunked(&all, &|c| {
            self.model.embed_texts(&data.texts.batch(c, &self.device)?)
        })?;
        Ok((vi, vt))
    }

    /// Backward pass, global gradient-norm clipping, optimiser step.
    /// Returns the gradient norm before clipping.
    pub fn step(&mut self, loss: &Tensor) -> Result<f64> {
        let mut grads = loss.backward()?;
        let vars = self.varmap.all_vars();
        let mut sq = 0f64;
        for v in &vars {
            if let Some(g) = grads.get(v.as_tensor()) {
                sq += g
                    .sqr()?
                    .sum_all()?
                    .to_dtype(candle_core::DType::F64)?
                    .to_scalar::<f64>()?;
            }
        }
        let norm = sq.sqrt();
        if self.clip > 0.0 && norm > self.clip {
            let scale = self.clip / (norm + 1e-6);
            for v in &vars {
                if let Some(g) = grads.remove(v.as_tensor()) {
                    grads.insert(v.as_tensor(), (g * scale)?);
                }
            }
        }
        self.opt.step(&grads)?;
        Ok(norm)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clipping_bounds_the_update_and_training_lowers_the_loss() -> Result<()> {
        let dev = Device::Cpu;
        let cfg = crate::test_support::precomputed_model(3, 4, 8);
        let data = crate::test_support::embedding_pairs(
            vec![1., 0., 0., 0., 1., 0., 0., 0., 1.],
            vec![0., 1., 0., 0., 0., 1., 1., 0., 0.],
            3,
        );
        let mut net = Net::new(&cfg, 1, &dev, 1e-2, 2.0)?;
        let idx = [0, 1, 2];
        let loss_of = |net: &Net| -> Result<Tensor> {
            let s = net.batch_similarity(&data, &idx)?;
            crate::losses::per_sample_hinge(&s, 0.2)?.mean_all()
        };
        let first: f32 = loss_of(&net)?.to_scalar()?;
        for _ in 0..100 {
            let l = loss_of(&net)?;
            net.step(&l)?;
        }
        let last: f32 = loss_of(&net)?.to_scalar()?;
        assert!(last < first * 0.5, "loss {first} -> {last}");
        Ok(())
    }
}
