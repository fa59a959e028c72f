//! One trainable matching network with its optimiser.

use candle_core::{DType, Device, Result, Tensor};
use candle_nn::VarMap;
use ncclean_models::{similarity, MatchingModel, ModelConfig, PairInputs, ParamStore};

use crate::adam::Adam;
use crate::fused_head::{FusedHead, HeadLoss};

/// A matching model, its parameters and an Adam optimiser with gradient-norm
/// clipping.
pub struct Net {
    /// The model.
    pub model: MatchingModel,
    varmap: VarMap,
    opt: Adam,
    clip: f64,
    device: Device,
    /// The fused CPU training step, where it applies to this network
    /// ([`FusedHead::new`]) and is switched on.
    fused: Option<FusedHead>,
    config: ModelConfig,
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
        let fused = FusedHead::new(config, device, &opt);
        Ok(Net {
            model,
            varmap,
            opt,
            clip,
            device: device.clone(),
            fused,
            config: config.clone(),
        })
    }

    /// Switch the fused CPU training step ([`crate::fused_head`]) on (the
    /// default, where it applies) or off (every step through candle's
    /// autograd, the reference path). Returns whether it is on.
    pub fn set_fused(&mut self, on: bool) -> bool {
        self.fused = if on {
            self.fused
                .take()
                .or_else(|| FusedHead::new(&self.config, &self.device, &self.opt))
        } else {
            None
        };
        self.fused.is_some()
    }

    /// Whether [`Net::fused_step`] can train on `data`: the fused step is on
    /// and `data` holds precomputed vectors of the head's widths.
    pub fn fuses(&self, data: &PairInputs) -> bool {
        self.fused.as_ref().is_some_and(|f| f.accepts(data))
    }

    /// One training step on the pairs `idx` with `loss`, fused
    /// ([`crate::fused_head`]): the same forward, backward, clip and Adam
    /// update as [`Net::step`] on that loss's tensor, without autograd.
    /// Returns the batch loss. Fails unless [`Net::fuses`] holds.
    pub fn fused_step(&mut self, data: &PairInputs, idx: &[usize], loss: &HeadLoss) -> Result<f32> {
        let (opt, clip) = (&mut self.opt, self.clip);
        match self.fused.as_mut() {
            // On a thread of rayon's pool, whose threads also run the
            // step's products: the calling thread sleeps meanwhile, where
            // it would otherwise wake the pool for each product and compete
            // for the cores with its spinning threads in the loops between
            // (head_step: 5.0 instead of 5.3 ms a step).
            Some(f) => rayon::join(|| f.step(data, idx, loss, opt, clip), || ()).0,
            None => candle_core::bail!("this network has no fused training step"),
        }
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
        self.embed_ranges(data, std::slice::from_ref(&(0..data.len())), chunk)
    }

    /// [`Net::embed_all`] with the pairs cut into `ranges` (consecutive,
    /// covering every pair), each embedded on its own: its chunks start at
    /// its first pair and its distinct images are those it shows, so a range
    /// gets the bits it gets embedded alone.
    pub fn embed_ranges(
        &self,
        data: &PairInputs,
        ranges: &[std::ops::Range<usize>],
        chunk: usize,
    ) -> Result<(Tensor, Tensor)> {
        self.embed_ranges_with(data, ranges, chunk, &data.images.distinct().1)
    }

    /// [`Net::embed_ranges`] with each pair's distinct image `of` given (the
    /// second half of [`ImageInputs::distinct`]): finding them compares
    /// every image vector (about as long as embedding them), so co-taught
    /// networks scoring the same data find them once.
    ///
    /// [`ImageInputs::distinct`]: ncclean_models::ImageInputs::distinct
    pub fn embed_ranges_with(
        &self,
        data: &PairInputs,
        ranges: &[std::ops::Range<usize>],
        chunk: usize,
        of: &[u32],
    ) -> Result<(Tensor, Tensor)> {
        let n = data.len();
        if n == 0 {
            candle_core::bail!("no pairs to embed");
        }
        if ranges.iter().map(|r| r.len()).sum::<usize>() != n {
            candle_core::bail!("the embedding ranges do not cover the {n} pairs");
        }
        let chunked = |idx: &[usize], embed: &dyn Fn(&[usize]) -> Result<Tensor>| {
            let parts = idx
                .chunks(chunk.max(1))
                .map(|c| Ok(embed(c)?.detach()))
                .collect::<Result<Vec<_>>>()?;
            Tensor::cat(&parts, 0)
        };
        if of.len() != n {
            candle_core::bail!(
                "distinct images cover {} pairs, the data holds {n}",
                of.len()
            );
        }
        let (mut vis, mut vts) = (Vec::new(), Vec::new());
        for r in ranges.iter().filter(|r| !r.is_empty()) {
            // The range's distinct images in order of appearance, and each
            // pair's among them: what `distinct` gives the range alone.
            let mut slot: std::collections::HashMap<u32, u32> = Default::default();
            let mut first = Vec::new();
            let local: Vec<u32> = r
                .clone()
                .map(|i| {
                    *slot.entry(of[i]).or_insert_with(|| {
                        first.push(i);
                        first.len() as u32 - 1
                    })
                })
                .collect();
            let vi = chunked(&first, &|c| {
                self.model
                    .embed_images(&data.images.batch(c, &self.device)?)
            })?;
            vis.push(if first.len() < r.len() {
                vi.index_select(&Tensor::from_vec(local, r.len(), &self.device)?, 0)?
            } else {
                vi
            });
            let all: Vec<usize> = r.clone().collect();
            vts.push(chunked(&all, &|c| {
                self.model.embed_texts(&data.texts.batch(c, &self.device)?)
            })?);
        }
        let cat = |mut parts: Vec<Tensor>| -> Result<Tensor> {
            match parts.len() {
                1 => Ok(parts.remove(0)),
                _ => Tensor::cat(&parts, 0),
            }
        };
        Ok((cat(vis)?, cat(vts)?))
    }

    /// Backward pass, global gradient-norm clipping, optimiser step.
    /// Returns the gradient norm before clipping: a scalar f64 tensor on
    /// the device (reading it is a host round trip; training never does).
    ///
    /// Everything stays on the device, so a GPU step needs no
    /// synchronisation. The arithmetic is the host version's, operation for
    /// operation, so CPU results are bit-identical to it: the squared norms
    /// are summed in f64 in the same order; a clipped gradient is
    /// `g * scale + 0.0` (what `Tensor * f64`, an affine op, computed), and an
    /// unclipped one `g * 1.0 + (-0.0)`, which is `g` exactly.
    pub fn step(&mut self, loss: &Tensor) -> Result<Tensor> {
        let mut grads = loss.backward()?;
        let vars = self.varmap.all_vars();
        let mut sq: Option<Tensor> = None;
        for v in &vars {
            if let Some(g) = grads.get(v.as_tensor()) {
                let s = g.sqr()?.sum_all()?.to_dtype(DType::F64)?;
                sq = Some(match sq {
                    None => s,
                    Some(acc) => (acc + s)?,
                });
            }
        }
        let norm = match sq {
            Some(sq) => sq.sqrt()?,
            None => Tensor::zeros((), DType::F64, &self.device)?,
        };
        if self.clip > 0.0 {
            let clipped = norm.gt(self.clip)?;
            let scale = (norm.ones_like()? * self.clip)?.div(&(&norm + 1e-6)?)?;
            let factor = clipped.where_cond(&scale, &norm.ones_like()?)?;
            let zero = Tensor::zeros((), DType::F64, &self.device)?;
            let offset = clipped.where_cond(&zero, &zero.neg()?)?;
            for v in &vars {
                if let Some(g) = grads.remove(v.as_tensor()) {
                    let f = factor.to_dtype(g.dtype())?;
                    let o = offset.to_dtype(g.dtype())?;
                    grads.insert(v.as_tensor(), g.broadcast_mul(&f)?.broadcast_add(&o)?);
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

    /// The step as it was before it moved onto the device: the squared
    /// gradient norm read back per parameter, the clip decided on the host.
    fn host_step(net: &mut Net, loss: &Tensor) -> Result<f64> {
        let mut grads = loss.backward()?;
        let vars = net.varmap.all_vars();
        let mut sq = 0f64;
        for v in &vars {
            if let Some(g) = grads.get(v.as_tensor()) {
                sq += g
                    .sqr()?
                    .sum_all()?
                    .to_dtype(DType::F64)?
                    .to_scalar::<f64>()?;
            }
        }
        let norm = sq.sqrt();
        if net.clip > 0.0 && norm > net.clip {
            let scale = net.clip / (norm + 1e-6);
            for v in &vars {
                if let Some(g) = grads.remove(v.as_tensor()) {
                    grads.insert(v.as_tensor(), (g * scale)?);
                }
            }
        }
        net.opt.step(&grads)?;
        Ok(norm)
    }

    fn weights(net: &Net) -> Result<Vec<(String, Vec<u32>)>> {
        let vars = net.varmap.data().lock().expect("unpoisoned");
        let mut out = Vec::new();
        for (name, v) in vars.iter() {
            let bits = v
                .as_tensor()
                .flatten_all()?
                .to_vec1::<f32>()?
                .into_iter()
                .map(f32::to_bits)
                .collect();
            out.push((name.clone(), bits));
        }
        out.sort();
        Ok(out)
    }

    #[test]
    fn the_device_step_is_bit_identical_to_the_host_step() -> Result<()> {
        let dev = Device::Cpu;
        let cfg = crate::test_support::precomputed_model(6, 8, 16);
        let mut rng = ncclean_models::rng::Rng::new(3);
        let mut v = |n: usize| (0..n).map(|_| rng.normal() as f32).collect::<Vec<_>>();
        let data = crate::test_support::embedding_pairs(v(8 * 6), v(8 * 6), 6);
        // A clip of 0.5 is hit by some steps and not others at lr 0.05.
        for clip in [0.5, 0.0, 1e9] {
            let mut device = Net::new(&cfg, 9, &dev, 5e-2, clip)?;
            let mut host = Net::new(&cfg, 9, &dev, 5e-2, clip)?;
            let (mut clipped, mut unclipped) = (0, 0);
            for step in 0..12 {
                let idx: Vec<usize> = (0..8).filter(|i| (i + step) % 3 != 0).collect();
                let loss = |net: &Net| -> Result<Tensor> {
                    let s = net.batch_similarity(&data, &idx)?;
                    crate::losses::per_sample_hinge(&s, 0.2)?.mean_all()
                };
                let la = loss(&device)?;
                let a = device.step(&la)?.to_scalar::<f64>()?;
                let lb = loss(&host)?;
                let b = host_step(&mut host, &lb)?;
                assert_eq!(a.to_bits(), b.to_bits(), "clip {clip}, step {step}: norm");
                if clip > 0.0 && b > clip {
                    clipped += 1;
                } else {
                    unclipped += 1;
                }
                assert_eq!(
                    weights(&device)?,
                    weights(&host)?,
                    "clip {clip}, step {step}"
                );
            }
            if clip == 0.5 {
                assert!(
                    clipped > 0 && unclipped > 0,
                    "{clipped} clipped, {unclipped} not"
                );
            }
        }
        Ok(())
    }

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
