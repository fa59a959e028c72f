//! GPO — Generalized Pooling Operator (VSE∞, Chen et al., CVPR 2021).
//!
//! A set of `K` local feature vectors is pooled into one vector by sorting
//! every dimension independently in descending order and taking a weighted
//! sum over the sorted positions. The weights come from a small learned
//! generator over positional encodings, so the operator can learn anything
//! between max pooling (all weight on position 0) and mean pooling (uniform
//! weights), per dataset.
//!
//! Departure from VSE∞: the paper generates the weights with a bidirectional
//! GRU over the positional encodings. Because the GRU's input is the same
//! sinusoidal sequence for every sample, it only adds length awareness at
//! the cost of a sequential loop over positions; here a two-layer MLP maps
//! the encoding of each position (and of the relative position `k / n`) to a
//! score, which keeps the length dependence cheap and fully parallel.
//! Variable lengths are handled with the mask: padded positions are sorted
//! last and receive zero weight.

use candle_core::{DType, Module, Result, Tensor, D};

use crate::layers::{softmax_last, Linear};
use crate::params::{Init, ParamStore};

/// Width of the sinusoidal positional encoding.
const PE_DIM: usize = 32;
/// Hidden width of the weight generator.
const HIDDEN: usize = 32;
/// Softmax temperature of the weights (VSE∞ uses 0.1).
const TEMPERATURE: f64 = 0.1;
/// Added to masked scores/features so they sort last and get no weight.
const MASK_OFFSET: f64 = 1e4;

/// The learned pooling head.
#[derive(Debug, Clone)]
pub struct Gpo {
    fc1: Linear,
    /// Score read-out `[1, HIDDEN]`, without bias: a bias cancels in the
    /// softmax and would never receive a gradient.
    score: Tensor,
}

impl Gpo {
    /// A GPO head named `name`.
    pub fn new(p: &mut ParamStore, name: &str) -> Result<Self> {
        p.scoped(name, |p| {
            Ok(Gpo {
                fc1: Linear::new(p, "fc1", 2 * PE_DIM, HIDDEN)?,
                score: p.var("score", (1, HIDDEN), Init::default_for_fan_in(HIDDEN))?,
            })
        })
    }

    /// Pooling weights `[B, K]` for a mask `[B, K]` (1 = real position; real
    /// positions come first). Rows sum to 1 over the real positions.
    pub fn weights(&self, mask: &Tensor) -> Result<Tensor> {
        let (b, k) = mask.dims2()?;
        let dev = mask.device();
        let lengths: Vec<f32> = mask.sum(1)?.to_vec1()?;
        // absolute position k and relative position k / n, both encoded
        let mut pe = Vec::with_capacity(b * k * 2 * PE_DIM);
        for &n in &lengths {
            let n = n.max(1.0);
            for pos in 0..k {
                pe.extend(encode(pos as f32));
                pe.extend(encode(pos as f32 / n * 100.0));
            }
        }
        let pe = Tensor::from_vec(pe, (b, k, 2 * PE_DIM), dev)?;
        let h = self.fc1.forward(&pe)?.tanh()?;
        let scores = h.broadcast_matmul(&self.score.t()?)?.squeeze(D::Minus1)?;
        let masked = ((scores / TEMPERATURE)? + ((mask - 1.0)? * MASK_OFFSET)?)?;
        softmax_last(&masked)
    }

    /// Pool `feats [B, K, D]` with mask `[B, K]` into `[B, D]`.
    pub fn forward(&self, feats: &Tensor, mask: &Tensor) -> Result<Tensor> {
        pool_with_weights(feats, mask, &self.weights(mask)?)
    }
}

/// Sinusoidal encoding of one (possibly fractional) position.
fn encode(pos: f32) -> Vec<f32> {
    (0..PE_DIM)
        .map(|i| {
            let freq = 1.0 / 10000f32.powf((2 * (i / 2)) as f32 / PE_DIM as f32);
            if i % 2 == 0 {
                (pos * freq).sin()
            } else {
                (pos * freq).cos()
            }
        })
        .collect()
}

/// Sort every feature dimension of `feats [B, K, D]` in descending order over
/// the real positions (padded ones go last) and take the `weights [B, K]`
/// weighted sum over positions → `[B, D]`. Differentiable in `feats` (through
/// `gather`) and in `weights`.
pub fn pool_with_weights(feats: &Tensor, mask: &Tensor, weights: &Tensor) -> Result<Tensor> {
    let ft = feats.transpose(1, 2)?.contiguous()?; // [B, D, K]
                                                   // The sort order only needs values, not gradients.
    let pad = ((mask.to_dtype(DType::F32)? - 1.0)? * MASK_OFFSET)?.unsqueeze(1)?;
    let order = ft
        .detach()
        .broadcast_add(&pad)?
        .contiguous()?
        .arg_sort_last_dim(false)?;
    let sorted = ft.gather(&order.contiguous()?, 2)?; // [B, D, K]
    sorted.broadcast_mul(&weights.unsqueeze(1)?)?.sum(2)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    #[test]
    fn fixed_weights_pool_sorted_values_hand_checked() -> Result<()> {
        let dev = Device::Cpu;
        // one sample, K = 3 (last is padding), D = 2
        // dim 0 values over real positions: [1, 3] → sorted [3, 1]
        // dim 1 values: [5, 2] → sorted [5, 2]; padding (value 100) must not count
        // weights [0.75, 0.25, 0]: dim0 = 0.75·3 + 0.25·1 = 2.5, dim1 = 0.75·5 + 0.25·2 = 4.25
        let feats = Var::new(&[[[1f32, 5.0], [3.0, 2.0], [100.0, 100.0]]], &dev)?;
        let mask = Tensor::new(&[[1f32, 1.0, 0.0]], &dev)?;
        let w = Tensor::new(&[[0.75f32, 0.25, 0.0]], &dev)?;
        let pooled = pool_with_weights(feats.as_tensor(), &mask, &w)?;
        let got: Vec<Vec<f32>> = pooled.to_vec2()?;
        assert!(
            (got[0][0] - 2.5).abs() < 1e-5 && (got[0][1] - 4.25).abs() < 1e-5,
            "{got:?}"
        );
        // gradient wrt feats: the element sorted first gets 0.75, the second 0.25
        let g = pooled.sum_all()?.backward()?;
        let gf: Vec<Vec<Vec<f32>>> = g.get(&feats).expect("grad").to_vec3()?;
        assert_eq!(
            gf[0],
            vec![vec![0.25, 0.75], vec![0.75, 0.25], vec![0.0, 0.0]]
        );
        Ok(())
    }

    #[test]
    fn learned_weights_respect_the_mask_and_train() -> Result<()> {
        let dev = Device::Cpu;
        let mut p = ParamStore::new(1, &dev);
        let gpo = Gpo::new(&mut p, "gpo")?;
        let mask = Tensor::new(&[[1f32, 1.0, 1.0], [1.0, 0.0, 0.0]], &dev)?;
        let w: Vec<Vec<f32>> = gpo.weights(&mask)?.to_vec2()?;
        assert!((w[0].iter().sum::<f32>() - 1.0).abs() < 1e-5);
        assert!((w[1][0] - 1.0).abs() < 1e-5 && w[1][1] < 1e-6, "{w:?}");
        let feats = Tensor::new(
            &[
                [[1f32, 2.0], [3.0, 0.0], [2.0, 1.0]],
                [[4.0, 4.0], [0.0, 0.0], [0.0, 0.0]],
            ],
            &dev,
        )?;
        let loss = gpo.forward(&feats, &mask)?.sqr()?.sum_all()?;
        let grads = loss.backward()?;
        for (name, var) in p.varmap().data().lock().expect("lock").iter() {
            let g = grads
                .get(var.as_tensor())
                .unwrap_or_else(|| panic!("no gradient for {name}"));
            let total: f32 = g.abs()?.sum_all()?.to_scalar()?;
            assert!(total > 0.0, "zero gradient for {name}");
        }
        Ok(())
    }
}
