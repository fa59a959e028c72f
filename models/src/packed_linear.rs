//! `dst += src · wᵀ` for a frozen linear layer whose weights are packed
//! once, with the same bits on every x86-64 CPU with AVX2 and FMA (issue
//! #35: MiniLM at PyTorch's speed).
//!
//! MiniLM's encoder spends three quarters of its time in four matrix
//! products per layer. `gemm` 0.19, which candle calls, runs its AVX2
//! kernel on AVX-512 machines unless its `x86-v4` feature is on, and that
//! feature would change the bits of every candle product in the workspace
//! between AVX-512 and AVX2 machines (its two kernels sum in different
//! orders), so a checkpoint's trained pairs (recognised by the bits of their
//! features) would not be recognised on the other kind of CPU. Here every
//! output element is one chain of fused multiply-adds, `dst[i][j]` first,
//! then `src[i][k] · w[j][k]` for k = 0, 1, … in order, whatever the vector
//! width: the AVX-512 kernel (32 columns × 12 rows a tile) and the AVX2
//! one (16 × 6) give identical results, which a test checks bit for bit
//! against that chain computed one element at a time. Only the speed
//! depends on the CPU. Older x86-64 CPUs and other architectures go
//! through `gemm` (its own order, so their bits differ, as before).
//!
//! The weights are packed at load into panels of [`PANEL`] output columns,
//! each `inp × PANEL` (one row of `PANEL` weights per input feature), so the
//! kernel reads them with unit stride and nothing is packed per call.

/// Output columns per packed panel (two 16-lane AVX-512 vectors).
pub const PANEL: usize = 32;

/// Rows of `src` whose tiles run over every panel before the next rows:
/// their `96 × inp` inputs stay in the core's cache while all the weights
/// stream past them.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const ROW_BLOCK: usize = 96;

/// Input features a tile sums over before the next panel: the panel's
/// `KC × PANEL` weights (32 KiB) stay in the first-level cache across the
/// row block's tiles. Each tile goes on from the partial sums in `dst`, so
/// every element's chain is the same as without blocks.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const KC: usize = 256;

/// A frozen `[out, in]` weight matrix packed for [`PackedLinear::accumulate`].
#[derive(Debug, Clone, PartialEq)]
pub struct PackedLinear {
    out: usize,
    inp: usize,
    /// `ceil(out / PANEL)` panels of `inp × PANEL` values; columns past
    /// `out` are zero.
    panels: Vec<f32>,
}

impl PackedLinear {
    /// Pack `w [out, inp]` (row-major, as Hugging Face stores linear
    /// weights).
    pub fn new(w: &[f32], out: usize, inp: usize) -> PackedLinear {
        assert_eq!(w.len(), out * inp, "packed linear: weight size");
        let n_panels = out.div_ceil(PANEL);
        let mut panels = vec![0f32; n_panels * inp * PANEL];
        for (p, panel) in panels.chunks_exact_mut(inp * PANEL).enumerate() {
            for (k, row) in panel.chunks_exact_mut(PANEL).enumerate() {
                for (c, v) in row.iter_mut().enumerate() {
                    let j = p * PANEL + c;
                    if j < out {
                        *v = w[j * inp + k];
                    }
                }
            }
        }
        PackedLinear { out, inp, panels }
    }

    /// Output width.
    pub fn out(&self) -> usize {
        self.out
    }

    /// Input width.
    pub fn inp(&self) -> usize {
        self.inp
    }

    /// `dst [rows, out] += src [rows, inp] · wᵀ`. On x86-64 with AVX2 and
    /// FMA each element is one chain of fused multiply-adds in input order
    /// starting from its value in `dst`, the same bits with AVX-512 or
    /// without; elsewhere `gemm` computes it (its own order).
    pub fn accumulate(&self, dst: &mut [f32], src: &[f32]) {
        let rows = src.len() / self.inp.max(1);
        assert_eq!(src.len(), rows * self.inp, "packed linear: input size");
        assert_eq!(dst.len(), rows * self.out, "packed linear: output size");
        if rows == 0 || self.out == 0 || self.inp == 0 {
            return;
        }
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("fma")
            {
                // SAFETY: the CPU has the features the kernel is built for;
                // the sizes were checked above.
                unsafe { x86::blocks::<{ x86::MR_WIDE }, PANEL>(self, dst, src) };
                return;
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                // SAFETY: as above.
                unsafe { x86::blocks::<{ x86::MR_NARROW }, { PANEL / 2 }>(self, dst, src) };
                return;
            }
        }
        self.accumulate_gemm(dst, src, rows);
    }

    /// The same product through `gemm` from the unpacked layout the panels
    /// hold (row `k` of panel `p` is input feature k's weights for outputs
    /// `p·PANEL..`): CPUs without the kernels above.
    fn accumulate_gemm(&self, dst: &mut [f32], src: &[f32], rows: usize) {
        let (out, inp) = (self.out, self.inp);
        for (p, panel) in self.panels.chunks_exact(inp * PANEL).enumerate() {
            let col = p * PANEL;
            let width = (out - col).min(PANEL);
            // SAFETY: dst holds rows·out values, of which this writes the
            // columns col..col + width of each row (stride out); src holds
            // rows·inp (stride inp); the panel holds inp·PANEL (stride
            // PANEL), of which the first `width` columns are read; dst does
            // not alias the inputs.
            unsafe {
                gemm::gemm(
                    rows,
                    width,
                    inp,
                    dst.as_mut_ptr().add(col),
                    1,
                    out as isize,
                    true,
                    src.as_ptr(),
                    1,
                    inp as isize,
                    panel.as_ptr(),
                    1,
                    PANEL as isize,
                    1.0,
                    1.0,
                    false,
                    false,
                    false,
                    gemm::Parallelism::None,
                );
            }
        }
    }
}

/// The kernels: one tile of `MR` rows × `NC` columns keeps its sums in
/// vector registers over the whole input (AVX-512: 12 × 32, 24 of the 32
/// registers; AVX2: 6 × 16, 12 of the 16).
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{PackedLinear, KC, PANEL, ROW_BLOCK};

    /// Rows of an AVX-512 tile.
    pub const MR_WIDE: usize = 12;
    /// Rows of an AVX2 tile (over half a panel).
    pub const MR_NARROW: usize = 6;

    /// Every tile, row blocks of [`ROW_BLOCK`] outermost, then panels,
    /// then tiles; `NC` is [`PANEL`] (AVX-512) or half of it (AVX2).
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA, and AVX-512F when `NC` is
    /// [`PANEL`]; `src` and `dst` must hold whole rows of `w`'s input and
    /// output width.
    #[inline(always)]
    pub unsafe fn blocks<const MR: usize, const NC: usize>(
        w: &PackedLinear,
        dst: &mut [f32],
        src: &[f32],
    ) {
        let (out, inp) = (w.out, w.inp);
        let rows = src.len() / inp;
        let mut c_edge = [0f32; MR_WIDE * PANEL];
        // The row block's inputs, tile by tile, k-major: `MR` values (one
        // per row) per input feature, so a tile reads them from one moving
        // pointer. Missing rows of the last tile repeat its first row.
        let mut a_pack = vec![0f32; ROW_BLOCK.div_ceil(MR) * MR * inp];
        for r0 in (0..rows).step_by(ROW_BLOCK) {
            let r1 = (r0 + ROW_BLOCK).min(rows);
            for (t, i0) in (r0..r1).step_by(MR).enumerate() {
                let height = (r1 - i0).min(MR);
                let tile_a = &mut a_pack[t * MR * inp..][..MR * inp];
                for i in 0..MR {
                    let row = &src[(i0 + if i < height { i } else { 0 }) * inp..][..inp];
                    for (k, &v) in row.iter().enumerate() {
                        tile_a[k * MR + i] = v;
                    }
                }
            }
            for k0 in (0..inp).step_by(KC) {
                let kc = (inp - k0).min(KC);
                for (p, panel) in w.panels.chunks_exact(inp * PANEL).enumerate() {
                    for c0 in (0..PANEL).step_by(NC) {
                        let col = p * PANEL + c0;
                        if col >= out {
                            break;
                        }
                        let width = (out - col).min(NC);
                        let b = panel.as_ptr().add(k0 * PANEL + c0);
                        for (t, i0) in (r0..r1).step_by(MR).enumerate() {
                            let height = (r1 - i0).min(MR);
                            let a = a_pack.as_ptr().add(t * MR * inp + k0 * MR);
                            if height == MR && width == NC {
                                let c = dst.as_mut_ptr().add(i0 * out + col);
                                tile::<MR, NC>(c, out, a, b, kc);
                                continue;
                            }
                            // A tile cut by the last rows or columns: its valid
                            // part is copied into a whole one (missing columns
                            // read the panel's zero padding), computed the same
                            // way and copied back: every element gets the same
                            // chain.
                            for i in 0..height {
                                c_edge[i * NC..][..width]
                                    .copy_from_slice(&dst[(i0 + i) * out + col..][..width]);
                            }
                            tile::<MR, NC>(c_edge.as_mut_ptr(), NC, a, b, kc);
                            for i in 0..height {
                                dst[(i0 + i) * out + col..][..width]
                                    .copy_from_slice(&c_edge[i * NC..][..width]);
                            }
                        }
                    }
                }
            }
        }
    }

    /// `c[i][j] = fma(a[k][i], b[k][j], …)` for k = 0..kc in order,
    /// starting from `c[i][j]`: `MR` rows of `c` (stride `ldc`), the
    /// k-major packed inputs `a` (`MR` per k), `NC` columns of `b` (stride
    /// [`PANEL`]).
    ///
    /// # Safety
    /// As [`blocks`]; the pointers must cover those rows and columns.
    #[inline(always)]
    unsafe fn tile<const MR: usize, const NC: usize>(
        c: *mut f32,
        ldc: usize,
        a: *const f32,
        b: *const f32,
        kc: usize,
    ) {
        if NC == PANEL {
            tile_avx512::<MR>(c, ldc, a, b, kc);
        } else {
            tile_avx2::<MR>(c, ldc, a, b, kc);
        }
    }

    #[target_feature(enable = "avx512f,fma")]
    unsafe fn tile_avx512<const MR: usize>(
        c: *mut f32,
        ldc: usize,
        a: *const f32,
        b: *const f32,
        kc: usize,
    ) {
        let mut acc = [[_mm512_setzero_ps(); 2]; MR];
        for (i, row) in acc.iter_mut().enumerate() {
            row[0] = _mm512_loadu_ps(c.add(i * ldc));
            row[1] = _mm512_loadu_ps(c.add(i * ldc + 16));
        }
        for k in 0..kc {
            let b0 = _mm512_loadu_ps(b.add(k * PANEL));
            let b1 = _mm512_loadu_ps(b.add(k * PANEL + 16));
            for (i, row) in acc.iter_mut().enumerate() {
                let x = _mm512_set1_ps(*a.add(k * MR + i));
                row[0] = _mm512_fmadd_ps(x, b0, row[0]);
                row[1] = _mm512_fmadd_ps(x, b1, row[1]);
            }
        }
        for (i, row) in acc.iter().enumerate() {
            _mm512_storeu_ps(c.add(i * ldc), row[0]);
            _mm512_storeu_ps(c.add(i * ldc + 16), row[1]);
        }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile_avx2<const MR: usize>(
        c: *mut f32,
        ldc: usize,
        a: *const f32,
        b: *const f32,
        kc: usize,
    ) {
        let mut acc = [[_mm256_setzero_ps(); 2]; MR];
        for (i, row) in acc.iter_mut().enumerate() {
            row[0] = _mm256_loadu_ps(c.add(i * ldc));
            row[1] = _mm256_loadu_ps(c.add(i * ldc + 8));
        }
        for k in 0..kc {
            let b0 = _mm256_loadu_ps(b.add(k * PANEL));
            let b1 = _mm256_loadu_ps(b.add(k * PANEL + 8));
            for (i, row) in acc.iter_mut().enumerate() {
                let x = _mm256_set1_ps(*a.add(k * MR + i));
                row[0] = _mm256_fmadd_ps(x, b0, row[0]);
                row[1] = _mm256_fmadd_ps(x, b1, row[1]);
            }
        }
        for (i, row) in acc.iter().enumerate() {
            _mm256_storeu_ps(c.add(i * ldc), row[0]);
            _mm256_storeu_ps(c.add(i * ldc + 8), row[1]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    fn random(n: usize, seed: u64) -> Vec<f32> {
        let mut rng = Rng::new(seed);
        (0..n).map(|_| rng.normal() as f32).collect()
    }

    /// The reference: each element's chain of fused multiply-adds, one
    /// element at a time.
    fn naive(dst: &mut [f32], src: &[f32], w: &[f32], out: usize, inp: usize) {
        let rows = src.len() / inp;
        for i in 0..rows {
            for j in 0..out {
                let mut acc = dst[i * out + j];
                for k in 0..inp {
                    acc = src[i * inp + k].mul_add(w[j * inp + k], acc);
                }
                dst[i * out + j] = acc;
            }
        }
    }

    #[test]
    fn every_kernel_gives_the_chain_of_each_element_bit_for_bit() {
        // Shapes with and without whole tiles and panels, one row, a
        // width under a panel.
        for (rows, out, inp) in [
            (37, 70, 19),
            (96, 64, 32),
            (1, 5, 3),
            (150, 33, 48),
            (13, 32, 1),
        ] {
            let w = random(out * inp, 1);
            let src = random(rows * inp, 2);
            let start = random(rows * out, 3);
            let mut want = start.clone();
            naive(&mut want, &src, &w, out, inp);
            let packed = PackedLinear::new(&w, out, inp);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
            let shape = format!("{rows}x{out}x{inp}");
            #[cfg(target_arch = "x86_64")]
            {
                let has = |f: &str| match f {
                    "avx2" => std::arch::is_x86_feature_detected!("avx2"),
                    "avx512f" => std::arch::is_x86_feature_detected!("avx512f"),
                    _ => std::arch::is_x86_feature_detected!("fma"),
                };
                if has("avx2") && has("fma") {
                    let mut v = start.clone();
                    // SAFETY: the CPU has AVX2 and FMA; whole rows.
                    unsafe {
                        x86::blocks::<{ x86::MR_NARROW }, { PANEL / 2 }>(&packed, &mut v, &src)
                    };
                    assert_eq!(bits(&v), bits(&want), "AVX2 kernel, {shape}");
                    let mut got = start.clone();
                    packed.accumulate(&mut got, &src);
                    assert_eq!(bits(&got), bits(&want), "dispatched kernel, {shape}");
                }
                if has("avx2") && has("fma") && has("avx512f") {
                    let mut v = start.clone();
                    // SAFETY: the CPU has AVX-512F, AVX2 and FMA; whole rows.
                    unsafe { x86::blocks::<{ x86::MR_WIDE }, PANEL>(&packed, &mut v, &src) };
                    assert_eq!(bits(&v), bits(&want), "AVX-512 kernel, {shape}");
                }
            }
            // Elsewhere gemm sums in its own order: the same product to
            // rounding.
            let mut g = start.clone();
            packed.accumulate_gemm(&mut g, &src, rows);
            for (x, y) in g.iter().zip(&want) {
                assert!(
                    (x - y).abs() <= 1e-4 * (1.0 + y.abs()),
                    "gemm, {shape}: {x} vs {y}"
                );
            }
        }
    }

    #[test]
    fn the_product_is_the_matrix_product() {
        // [[1, 2], [3, 4]] · [[5, 6], [7, 8]]ᵀ + 1 = [[18, 24], [40, 54]].
        let packed = PackedLinear::new(&[5.0, 6.0, 7.0, 8.0], 2, 2);
        let mut dst = vec![1.0; 4];
        packed.accumulate(&mut dst, &[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(dst, vec![18.0, 24.0, 40.0, 54.0]);
        assert_eq!((packed.out(), packed.inp()), (2, 2));
    }
}
