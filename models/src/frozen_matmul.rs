//! A matrix product whose left operand is a constant: `x · w` where no
//! gradient can flow into `x` (cached frozen-tower features).
//!
//! candle 0.11's backward of a matrix product always computes both
//! operands' gradients, so `x · Wᵀ` with a frozen `x` of `[6272, 1280]`
//! (ReCon's 128 images × 49 grid cells) spends a third of its training
//! products, and a `[6272, 1280]` zero-fill and add, on a gradient nobody
//! reads. This op runs the same backend product forward and returns only
//! the right operand's gradient, computed exactly as candle computes it
//! (`xᵀ · grad`), so the trained weights are the same.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};

/// `x [m, k] · w [k, n]` without a gradient for `x`.
struct FrozenLhsMatmul;

/// `(batch, m, n, k)` of a 2-D product, checked.
fn dims(l1: &Layout, l2: &Layout) -> Result<(usize, usize, usize, usize)> {
    let (m, k) = l1.shape().dims2()?;
    let (k2, n) = l2.shape().dims2()?;
    if k != k2 {
        candle_core::bail!("frozen matmul: inner dimensions differ ({k} vs {k2})");
    }
    Ok((1, m, n, k))
}

impl CustomOp2 for FrozenLhsMatmul {
    fn name(&self) -> &'static str {
        "frozen-lhs-matmul"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let bmnk = dims(l1, l2)?;
        Ok((s1.matmul(s2, bmnk, l1, l2)?, Shape::from((bmnk.1, bmnk.2))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let bmnk = dims(l1, l2)?;
        Ok((s1.matmul(s2, bmnk, l1, l2)?, Shape::from((bmnk.1, bmnk.2))))
    }

    fn bwd(
        &self,
        x: &Tensor,
        _w: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        Ok((None, Some(x.t()?.matmul(grad)?)))
    }
}

/// `x · w` for 2-D `x [m, k]` and `w [k, n]`. When `x` carries no gradient
/// (it is not a variable and no variable reaches it) and `w` does, the
/// backward pass skips `x`'s gradient; otherwise this is `x.matmul(w)`.
/// Both give the same values forward and the same gradient for `w`.
pub fn matmul_frozen_lhs(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    if x.track_op() || !w.track_op() || x.device().is_metal() {
        return x.matmul(w);
    }
    x.apply_op2(w, FrozenLhsMatmul)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    #[test]
    fn same_values_and_weight_gradient_as_matmul() -> Result<()> {
        let dev = Device::Cpu;
        let x = Tensor::new(&[[1f32, 2.0, 3.0], [-1.0, 0.5, 4.0]], &dev)?;
        let w = Var::new(&[[0.5f32, -1.0], [2.0, 0.0], [1.0, 3.0]], &dev)?;
        // hand-computed: x·w = [[0.5+4+3, -1+0+9], [-0.5+1+4, 1+0+12]]
        let y = matmul_frozen_lhs(&x, &w.t()?.t()?)?;
        assert_eq!(y.to_vec2::<f32>()?, vec![vec![7.5, 8.0], vec![4.5, 13.0]]);
        // d(sum(y ⊙ c))/dw = xᵀ c, against candle's own product
        let c = Tensor::new(&[[1f32, -2.0], [0.5, 3.0]], &dev)?;
        let g_frozen = (y * &c)?.sum_all()?.backward()?;
        let g_plain = (x.matmul(w.as_tensor())? * &c)?.sum_all()?.backward()?;
        let a = g_frozen.get(&w).expect("w grad").to_vec2::<f32>()?;
        let b = g_plain.get(&w).expect("w grad").to_vec2::<f32>()?;
        assert_eq!(a, b);
        // xᵀc by hand: row 0 = [1·1 + −1·0.5, 1·−2 + −1·3] = [0.5, −5]
        assert_eq!(a[0], vec![0.5, -5.0]);
        // and no gradient was made for the constant input
        assert!(g_frozen.get(&x).is_none());
        assert!(g_plain.get(&x).is_some());
        Ok(())
    }

    #[test]
    fn a_tracked_input_still_gets_its_gradient() -> Result<()> {
        let dev = Device::Cpu;
        let x = Var::new(&[[1f32, 2.0]], &dev)?;
        let w = Var::new(&[[3f32], [4.0]], &dev)?;
        let g = matmul_frozen_lhs(x.as_tensor(), w.as_tensor())?
            .sum_all()?
            .backward()?;
        assert_eq!(
            g.get(&x).expect("x grad").to_vec2::<f32>()?,
            vec![vec![3.0, 4.0]]
        );
        Ok(())
    }
}
