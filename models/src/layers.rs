//! Small, explicit layers built on [`ParamStore`].
//!
//! Only differentiable, composed operations are used: candle 0.11's fused
//! normalisation and softmax kernels silently drop gradients.

use candle_core::{Module, Result, Tensor, D};

use crate::frozen_matmul::matmul_frozen_lhs;
use crate::params::{Init, ParamStore};

/// y = x Wᵀ + b.
#[derive(Debug, Clone)]
pub struct Linear {
    weight: Tensor,
    bias: Tensor,
}

impl Linear {
    /// A linear layer `fan_in → fan_out` named `name`.
    pub fn new(p: &mut ParamStore, name: &str, fan_in: usize, fan_out: usize) -> Result<Self> {
        p.scoped(name, |p| {
            let init = Init::default_for_fan_in(fan_in);
            let weight = p.var("weight", (fan_out, fan_in), init)?;
            let bias = p.var("bias", fan_out, init)?;
            Ok(Linear { weight, bias })
        })
    }
}

impl Module for Linear {
    /// Any leading dimensions are flattened into rows first: one `[rows,
    /// fan_in]` product, whose weight gradient is one product too (a
    /// broadcast `[B, P, fan_in] · Wᵀ` would build a `[B, fan_in, fan_out]`
    /// gradient and sum it over `B`). A constant input (cached features)
    /// gets no gradient computed ([`matmul_frozen_lhs`]).
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let dims = x.dims();
        let Some((&fan_in, lead)) = dims.split_last() else {
            candle_core::bail!("linear layer on a scalar");
        };
        let rows: usize = lead.iter().product();
        let y = matmul_frozen_lhs(&x.reshape((rows, fan_in))?, &self.weight.t()?)?
            .broadcast_add(&self.bias)?;
        let mut out = lead.to_vec();
        out.push(y.dim(1)?);
        y.reshape(out)
    }
}

/// 2-D convolution with bias, square kernel.
#[derive(Debug, Clone)]
pub struct Conv2d {
    weight: Tensor,
    bias: Tensor,
    stride: usize,
    padding: usize,
}

impl Conv2d {
    /// A `k×k` convolution `c_in → c_out`.
    pub fn new(
        p: &mut ParamStore,
        name: &str,
        c_in: usize,
        c_out: usize,
        k: usize,
        stride: usize,
        padding: usize,
    ) -> Result<Self> {
        p.scoped(name, |p| {
            let init = Init::default_for_fan_in(c_in * k * k);
            let weight = p.var("weight", (c_out, c_in, k, k), init)?;
            let bias = p.var("bias", c_out, init)?;
            Ok(Conv2d {
                weight,
                bias,
                stride,
                padding,
            })
        })
    }
}

impl Module for Conv2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = x.conv2d(&self.weight, self.padding, self.stride, 1, 1)?;
        y.broadcast_add(&self.bias.reshape((1, (), 1, 1))?)
    }
}

/// Token embedding table.
#[derive(Debug, Clone)]
pub struct Embedding {
    table: Tensor,
}

impl Embedding {
    /// `vocab` rows of width `dim`.
    pub fn new(p: &mut ParamStore, name: &str, vocab: usize, dim: usize) -> Result<Self> {
        let table = p.scoped(name, |p| {
            p.var("weight", (vocab, dim), Init::Normal { std: 0.1 })
        })?;
        Ok(Embedding { table })
    }

    /// ids `[B, L]` (u32) → `[B, L, dim]`.
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let (b, l) = ids.dims2()?;
        let flat = self.table.index_select(&ids.flatten_all()?, 0)?;
        flat.reshape((b, l, ()))
    }
}

/// Row-wise L2 normalisation, composed from differentiable ops.
pub fn l2_normalize(x: &Tensor) -> Result<Tensor> {
    let norm = (x.sqr()?.sum_keepdim(D::Minus1)? + 1e-12)?.sqrt()?;
    x.broadcast_div(&norm)
}

/// Softmax over the last dimension, composed from differentiable ops
/// (`candle_nn::ops::softmax_last_dim` has no backward pass).
pub fn softmax_last(x: &Tensor) -> Result<Tensor> {
    let max = x.max_keepdim(D::Minus1)?.detach();
    let e = x.broadcast_sub(&max)?.exp()?;
    e.broadcast_div(&e.sum_keepdim(D::Minus1)?)
}

/// Log-softmax over the last dimension, composed from differentiable ops.
pub fn log_softmax_last(x: &Tensor) -> Result<Tensor> {
    let max = x.max_keepdim(D::Minus1)?.detach();
    let shifted = x.broadcast_sub(&max)?;
    let lse = shifted.exp()?.sum_keepdim(D::Minus1)?.log()?;
    shifted.broadcast_sub(&lse)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    #[test]
    fn softmax_matches_hand_computed_values_and_has_gradients() -> Result<()> {
        // softmax([0, ln 3]) = [1/4, 3/4]
        let v = Var::new(&[[0f32, 3f32.ln()]], &Device::Cpu)?;
        let s = softmax_last(v.as_tensor())?;
        let got: Vec<Vec<f32>> = s.to_vec2()?;
        assert!((got[0][0] - 0.25).abs() < 1e-6 && (got[0][1] - 0.75).abs() < 1e-6);
        let ls: Vec<Vec<f32>> = log_softmax_last(v.as_tensor())?.to_vec2()?;
        assert!((ls[0][0] - 0.25f32.ln()).abs() < 1e-6);
        // d/dx0 of softmax_0 = p0 (1 - p0) = 3/16
        let grads = s.narrow(1, 0, 1)?.sum_all()?.backward()?;
        let g: Vec<Vec<f32>> = grads.get(&v).expect("gradient").to_vec2()?;
        assert!((g[0][0] - 3.0 / 16.0).abs() < 1e-6, "{g:?}");
        Ok(())
    }

    #[test]
    fn l2_normalize_gives_unit_rows() -> Result<()> {
        let x = Tensor::new(&[[3f32, 4.0], [0.0, 2.0]], &Device::Cpu)?;
        let y: Vec<Vec<f32>> = l2_normalize(&x)?.to_vec2()?;
        assert_eq!(y, vec![vec![0.6, 0.8], vec![0.0, 1.0]]);
        Ok(())
    }

    #[test]
    fn linear_and_conv_shapes() -> Result<()> {
        let mut p = ParamStore::new(0, &Device::Cpu);
        let lin = Linear::new(&mut p, "lin", 3, 2)?;
        let x = Tensor::ones((4, 3), candle_core::DType::F32, &Device::Cpu)?;
        assert_eq!(lin.forward(&x)?.dims(), &[4, 2]);
        let conv = Conv2d::new(&mut p, "conv", 3, 8, 3, 2, 1)?;
        let img = Tensor::ones((2, 3, 16, 16), candle_core::DType::F32, &Device::Cpu)?;
        assert_eq!(conv.forward(&img)?.dims(), &[2, 8, 8, 8]);
        Ok(())
    }
}
