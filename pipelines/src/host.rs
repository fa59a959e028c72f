//! The values of contiguous `f32` CPU tensors as plain slices, and a
//! matrix product over slices: what the fused head step
//! ([`crate::fused_head`]) reads its weights from, computes with and
//! writes its updates into, without building tensors for each small op.

use std::cell::RefCell;
use std::ops::Range;

use candle_core::{CpuStorage, InplaceOp1, Layout, Result, Storage, StorageRef, Tensor};

/// The AVX2+FMA dispatch of the host loops: the models crate's
/// [`ncclean_models::multiversion`], shared with MiniLM's CPU encoder.
pub(crate) use ncclean_models::multiversion;

/// Read access to the values of a contiguous `f32` CPU tensor; the tensor's
/// storage stays read-locked while this lives.
pub struct Values<'a> {
    guard: StorageRef<'a>,
    range: Range<usize>,
}

impl Values<'_> {
    /// The values, in row-major order.
    pub fn get(&self) -> &[f32] {
        match &*self.guard {
            Storage::Cpu(CpuStorage::F32(v)) => &v[self.range.clone()],
            // `values` only builds a `Values` over f32 CPU storage.
            _ => &[],
        }
    }
}

/// The values of `t`, which must be a contiguous `f32` tensor on the CPU.
pub fn values(t: &Tensor) -> Result<Values<'_>> {
    let (guard, layout) = t.storage_and_layout();
    let Some((a, b)) = layout.contiguous_offsets() else {
        candle_core::bail!("host values: the tensor is not contiguous");
    };
    if !matches!(&*guard, Storage::Cpu(CpuStorage::F32(_))) {
        candle_core::bail!("host values: not an f32 CPU tensor");
    }
    Ok(Values { guard, range: a..b })
}

/// Runs a closure on the storage of a tensor, in place.
struct InPlace<F, R> {
    f: RefCell<Option<F>>,
    out: RefCell<Option<R>>,
}

impl<F: FnOnce(&mut [f32]) -> R, R> InplaceOp1 for InPlace<F, R> {
    fn name(&self) -> &'static str {
        "host-values-mut"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> Result<()> {
        let CpuStorage::F32(v) = storage else {
            candle_core::bail!("host values: not an f32 tensor");
        };
        let Some((a, b)) = layout.contiguous_offsets() else {
            candle_core::bail!("host values: the tensor is not contiguous");
        };
        let f = self.f.borrow_mut().take();
        if let Some(f) = f {
            *self.out.borrow_mut() = Some(f(&mut v[a..b]));
        }
        Ok(())
    }
}

/// `f` on the values of `t` (a contiguous `f32` CPU tensor), writable in
/// place: every tensor that shares `t`'s storage (a `Var` and the model's
/// handle on it) sees the new values, as after [`candle_core::Var::set`].
pub fn with_values_mut<R>(t: &Tensor, f: impl FnOnce(&mut [f32]) -> R) -> Result<R> {
    let op = InPlace {
        f: RefCell::new(Some(f)),
        out: RefCell::new(None),
    };
    t.inplace_op1(&op)?;
    op.out
        .into_inner()
        .ok_or_else(|| candle_core::Error::Msg("host values: not a CPU tensor".into()))
}

/// A `rows × cols` matrix inside a slice: element `(r, c)` is
/// `data[r·rs + c·cs]`, so a transpose is a swap of the strides.
#[derive(Debug, Clone, Copy)]
pub struct View<'a> {
    data: &'a [f32],
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
}

impl<'a> View<'a> {
    /// `data` as a row-major `rows × cols` matrix.
    pub fn rows(data: &'a [f32], rows: usize, cols: usize) -> View<'a> {
        View {
            data,
            rows,
            cols,
            rs: cols,
            cs: 1,
        }
    }

    /// The transpose (no copy).
    pub fn t(self) -> View<'a> {
        View {
            rows: self.cols,
            cols: self.rows,
            rs: self.cs,
            cs: self.rs,
            ..self
        }
    }

    /// Panics unless every element lies inside `data` (what makes the
    /// pointer arithmetic of [`matmul`] sound).
    fn check(&self) {
        if self.rows > 0 && self.cols > 0 {
            let last = (self.rows - 1) * self.rs + (self.cols - 1) * self.cs;
            assert!(last < self.data.len(), "matrix view outside its slice");
        }
    }
}

/// `dst = a · b`, or `dst += a · b` with `accumulate`, for a row-major
/// `dst` of `a.rows × b.cols`. `gemm`, the kernel candle's CPU matmul
/// calls, on `threads` threads of rayon's pool (gemm runs small products
/// on one).
pub fn matmul(dst: &mut [f32], a: View, b: View, accumulate: bool, threads: usize) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert_eq!(b.rows, k, "matmul: inner dimensions differ");
    assert_eq!(dst.len(), m * n, "matmul: output size");
    a.check();
    b.check();
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            dst.fill(0.0);
        }
        return;
    }
    let parallelism = if threads > 1 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    };
    // SAFETY: every element the strides reach lies in its slice (checked
    // above: `View::check`, and dst is m·n row-major), and dst is a unique
    // borrow, so it aliases neither input.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            a.data.as_ptr(),
            a.cs as isize,
            a.rs as isize,
            b.data.as_ptr(),
            b.cs as isize,
            b.rs as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        );
    }
}

/// `dst = a · b` for a row-major `dst`, bit for bit the transpose of
/// [`matmul`]`(bᵀ, aᵀ)`: what candle's backward computes where it takes the
/// product the other way round (`xᵀ · ∂Y` for the gradient of `Wᵀ`, then
/// transposes it). gemm's main kernel accumulates every element over `k`
/// in order with fused multiply-adds whichever operand comes first, so
/// `a · b` computed directly has the same bits; its special paths for
/// `k ≤ 2` (outer products) and for a single row or column may not, and
/// there the product is taken as candle takes it (into `scratch`) and
/// transposed.
pub fn matmul_as_transposed(
    dst: &mut [f32],
    a: View,
    b: View,
    threads: usize,
    scratch: &mut Vec<f32>,
) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    if k > 2 && m > 1 && n > 1 {
        matmul(dst, a, b, false, threads);
        return;
    }
    scratch.clear();
    scratch.resize(n * m, 0.0);
    matmul(scratch, b.t(), a.t(), false, threads);
    assert_eq!(dst.len(), m * n, "matmul: output size");
    for (i, row) in dst.chunks_exact_mut(n.max(1)).enumerate() {
        for (j, d) in row.iter_mut().enumerate() {
            *d = scratch[j * m + i];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    #[test]
    fn values_read_and_write_a_variable_in_place() -> Result<()> {
        let v = Var::new(&[[1f32, 2.0], [3.0, 4.0]], &Device::Cpu)?;
        let model_handle = v.as_tensor().clone();
        assert_eq!(values(&model_handle)?.get(), &[1.0, 2.0, 3.0, 4.0]);
        let sum = with_values_mut(v.as_tensor(), |x| {
            x.iter_mut().for_each(|e| *e *= 10.0);
            x.iter().sum::<f32>()
        })?;
        assert_eq!(sum, 100.0);
        assert_eq!(
            model_handle.to_vec2::<f32>()?,
            vec![vec![10.0, 20.0], vec![30.0, 40.0]]
        );
        // A transposed view is not contiguous: refused.
        assert!(values(&v.as_tensor().t()?).is_err());
        assert!(values(&Tensor::new(&[1f64], &Device::Cpu)?).is_err());
        Ok(())
    }

    #[test]
    fn matmul_with_transposed_views_and_accumulation() {
        // a = [[1, 2, 3], [4, 5, 6]], b = [[1, 0], [0, 1], [1, 1]]:
        // a·b = [[4, 5], [10, 11]] (by hand).
        let a = [1f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        let b = [1f32, 0.0, 0.0, 1.0, 1.0, 1.0];
        let mut d = [0f32; 4];
        matmul(&mut d, View::rows(&a, 2, 3), View::rows(&b, 3, 2), false, 1);
        assert_eq!(d, [4.0, 5.0, 10.0, 11.0]);
        // bᵀ·aᵀ = (a·b)ᵀ, added onto ones.
        let mut e = [1f32; 4];
        matmul(
            &mut e,
            View::rows(&b, 3, 2).t(),
            View::rows(&a, 2, 3).t(),
            true,
            2,
        );
        assert_eq!(e, [5.0, 11.0, 6.0, 12.0]);
        // The same product through the transposed route: k = 3 computes
        // directly, and a single-column result (n = 1) goes through the
        // scratch and a transpose.
        let mut f = [0f32; 4];
        let mut scratch = Vec::new();
        matmul_as_transposed(
            &mut f,
            View::rows(&a, 2, 3),
            View::rows(&b, 3, 2),
            1,
            &mut scratch,
        );
        assert_eq!(f, [4.0, 5.0, 10.0, 11.0]);
        let mut g = [0f32; 2];
        matmul_as_transposed(
            &mut g,
            View::rows(&a, 2, 3),
            View::rows(&b[..3], 3, 1),
            1,
            &mut scratch,
        );
        // b's first column read as 3×1 (rows of one value): [1, 0, 0]ᵀ → a's first column.
        assert_eq!(g, [1.0, 4.0]);
    }
}
