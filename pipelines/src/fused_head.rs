//! The training step of the projection head on cached features, on the CPU,
//! as a few matrix products and fused loops instead of candle's autograd
//! (issue #35: `vanilla` at least as fast as a numpy peer).
//!
//! Through candle a step of `vanilla` on a batch of 128 is a few hundred
//! tensor ops (forward, backward, the gradient clip, Adam), each allocating
//! its result, most of them on `[128, 256]` or smaller: 12–14 ms a step on
//! the 2-core machine, of which the matrix products are 3–4 ms
//! (`pipelines/examples/head_step.rs`). The head is small enough to write
//! its gradients out by hand. Per tower (input `X`, frozen: no gradient):
//!
//! ```text
//! A = X·W1ᵀ + b1     H = relu(A)     Z = (X·Wlᵀ + bl) + (H·W2ᵀ + b2)     V = Z / √(|Z|² + 1e-12)
//! ```
//!
//! and `S = Vi·Vtᵀ`. Backward from `G = ∂L/∂S` (the loss below): `∂Vi = G·Vt`,
//! `∂Vt = Gᵀ·Vi`; through the normalisation per row; `∂Wl = ∂Zᵀ·X`,
//! `∂bl = ∂b2 = Σ_rows ∂Z`, `∂W2 = ∂Zᵀ·H`, `∂A = (∂Z·W2) ⊙ [A ≥ 0]`,
//! `∂W1 = ∂Aᵀ·X`, `∂b1 = Σ_rows ∂A`. That is 15 `gemm` products a step
//! (the kernel candle's matmul calls, with the strides and threads of
//! candle's own calls; `X·W1ᵀ` and `X·Wlᵀ` as one product where that keeps
//! the bits, `stacks_first_layer`) and loops over `[128, ≤384]` buffers
//! allocated once. Then the gradient norm, the clip and Adam in one pass
//! per parameter, in place ([`crate::adam::Adam::step_host`]). The step
//! runs on rayon's pool, whose threads run the products
//! ([`crate::net::Net::fused_step`]).
//!
//! **Bit for bit what autograd computes.** Every loop repeats, element for
//! element, the f32 operations candle's forward and backward ops perform
//! for this graph, in their order: biases added after the product, `x·1`
//! and `+0` where an affine op computes them, the backward formulas of
//! division, square root and square as candle writes them, sums over a row
//! in the lane order of candle's AVX2 sum ([`candle_sum`]) and sums over
//! rows one row after the other, as candle's reduction does. Where autograd
//! adds several contributions into one gradient the order does not matter
//! (at most two terms, or exact multiples of `1/n`). A product whose
//! result candle transposes (`Xᵀ·∂Z` for `∂Wlᵀ`) is computed here as the
//! transposed product (`∂Zᵀ·X`): each element is the same sequence of fused
//! multiply-adds over the batch ([`crate::host::matmul_as_transposed`]
//! takes candle's route where gemm's special paths might not be). Tests
//! compare every gradient, loss and weight with autograd's bit for bit
//! (a zero's sign aside, which no weight sees), and `fit` gives identical
//! labels with either path. So this is a faster route to the same numbers,
//! not another rounding of them.
//!
//! The losses are those of [`crate::losses`], with their gradient as
//! candle's backward pass defines it where it has a choice: a hinge at
//! exactly 0 is active (`relu`'s gradient is `x ≥ 0`), and every entry
//! equal to a row's or column's maximum gets the maximum's gradient (two
//! captions of the same image in a batch tie exactly).
//!
//! Used when the network runs on an x86-64 CPU (where the sums above are
//! candle's; other CPUs sum in other lane orders), both towers are
//! precomputed vectors with the plain projection head (no local heads, no
//! GPO), and the method names its loss as a [`HeadLoss`]
//! ([`crate::Method::fused_loss`]); everything else, and every GPU, trains
//! through candle's autograd, which stays the reference.

use candle_core::{Device, Result};
use ncclean_models::{
    ImageInputs, ImageTowerConfig, ModelConfig, PairInputs, TextInputs, TextTowerConfig,
};

use crate::adam::Adam;
use crate::host::{matmul, matmul_as_transposed, multiversion, values, Values, View};

/// A batch loss the fused step implements: the mean over the batch of one
/// of [`crate::losses`]' per-pair losses on the batch similarity matrix.
#[derive(Debug, Clone, PartialEq)]
pub enum HeadLoss {
    /// [`crate::losses::per_sample_hinge`] with margin α (the warm-up loss).
    PerSampleHinge {
        /// The margin α.
        margin: f64,
    },
    /// [`crate::losses::ncr_soft_margin_hinge`] (vanilla's training loss).
    NcrSoftMarginHinge {
        /// The batch's labels ŷ, in batch order.
        labels: Vec<f32>,
        /// The margin α.
        alpha: f64,
        /// The soft-margin base m.
        m: f64,
    },
}

/// The parameters of one tower's projection, by name under the tower's
/// scope, in the order of the `P_*` indices below.
const PARAMS: [&str; 6] = [
    "proj.linear.weight",
    "proj.linear.bias",
    "proj.fc1.weight",
    "proj.fc1.bias",
    "proj.fc2.weight",
    "proj.fc2.bias",
];
const P_WL: usize = 0;
const P_BL: usize = 1;
const P_W1: usize = 2;
const P_B1: usize = 3;
const P_W2: usize = 4;
const P_B2: usize = 5;
const TOWERS: [&str; 2] = ["image", "text"];

/// One tower's activations and gradients for a batch, reused across steps.
#[derive(Default)]
struct TowerBuffers {
    /// Input width.
    dim: usize,
    /// `[B, dim]` inputs (unit rows when the head normalises its inputs).
    x: Vec<f32>,
    /// `[hidden + joint, dim]` `fc1.weight` over `linear.weight`, and
    /// `[B, hidden + joint]` the input times its transpose (see
    /// [`stacks_first_layer`]).
    stacked_w: Vec<f32>,
    stacked: Vec<f32>,
    /// `[B, hidden]` pre-activation `A`, and `relu(A)`.
    a: Vec<f32>,
    h: Vec<f32>,
    /// `[B, joint]` `H·W2ᵀ + b2`, then `Z`.
    mlp: Vec<f32>,
    z: Vec<f32>,
    /// `[B]` row lengths `√(|Z|² + 1e-12)`.
    norm: Vec<f32>,
    /// `[B, joint]` `V`.
    v: Vec<f32>,
    /// `[B, joint]` `∂V`, then `∂Z` in place.
    dv: Vec<f32>,
    /// `[B, hidden]` `∂H`, then `∂A` in place.
    da: Vec<f32>,
    /// `[joint]` scratch row.
    row: Vec<f32>,
    /// Scratch of [`matmul_as_transposed`].
    scratch: Vec<f32>,
}

/// The fused training step of one network's head; see the module docs.
pub struct FusedHead {
    joint: usize,
    hidden: usize,
    unit_inputs: bool,
    /// `slots[tower][P_*]`: the parameter's index in the optimiser's order.
    slots: [[usize; 6]; 2],
    towers: [TowerBuffers; 2],
    /// `[B, B]` similarities and `∂L/∂S`, and `2B²` of scratch.
    s: Vec<f32>,
    g: Vec<f32>,
    scratch: Vec<f32>,
    /// Gradients, in the optimiser's parameter order.
    grads: Vec<Vec<f32>>,
    /// Threads of the products (candle's matmul count).
    threads: usize,
}

impl FusedHead {
    /// The fused step for a network built from `config` on `device` whose
    /// parameters `opt` holds, or None when the step does not apply (not
    /// the CPU, a tower that is not precomputed, local heads, or parameters
    /// other than exactly the two projections'), so that every trainable
    /// variable gets its gradient here or the network trains through
    /// autograd.
    pub fn new(config: &ModelConfig, device: &Device, opt: &Adam) -> Option<FusedHead> {
        let (
            ImageTowerConfig::Precomputed { dim: di, .. },
            TextTowerConfig::Precomputed { dim: dt, .. },
        ) = (&config.image, &config.text)
        else {
            return None;
        };
        // Elsewhere candle sums in other lane orders than `candle_sum`.
        if !cfg!(target_arch = "x86_64") || !device.is_cpu() || config.head.local {
            return None;
        }
        let (joint, hidden) = (config.joint_dim, config.hidden);
        let names: Vec<(&str, Vec<usize>)> =
            opt.params().map(|(n, v)| (n, v.dims().to_vec())).collect();
        if names.len() != 12 {
            return None;
        }
        let mut slots = [[usize::MAX; 6]; 2];
        for (t, (tower, dim)) in TOWERS.iter().zip([*di, *dt]).enumerate() {
            let shapes: [Vec<usize>; 6] = [
                vec![joint, dim],
                vec![joint],
                vec![hidden, dim],
                vec![hidden],
                vec![joint, hidden],
                vec![joint],
            ];
            for (p, name) in PARAMS.iter().enumerate() {
                let full = format!("{tower}.{name}");
                let i = names.iter().position(|(n, _)| *n == full)?;
                if names[i].1 != shapes[p] {
                    return None;
                }
                slots[t][p] = i;
            }
        }
        let grads = names
            .iter()
            .map(|(_, d)| vec![0f32; d.iter().product()])
            .collect();
        let tower = |dim| TowerBuffers {
            dim,
            ..Default::default()
        };
        Some(FusedHead {
            joint,
            hidden,
            unit_inputs: config.head.unit_inputs,
            slots,
            towers: [tower(*di), tower(*dt)],
            s: Vec::new(),
            g: Vec::new(),
            scratch: Vec::new(),
            grads,
            threads: candle_core::utils::get_num_threads(),
        })
    }

    /// Whether `data` holds the inputs this head takes: precomputed vectors
    /// of its widths on both sides.
    pub fn accepts(&self, data: &PairInputs) -> bool {
        matches!(&data.images, ImageInputs::Embeddings { dim, .. } if *dim == self.towers[0].dim)
            && matches!(&data.texts, TextInputs::Embeddings { dim, .. } if *dim == self.towers[1].dim)
    }

    /// One training step on the pairs `idx` of `data`: forward, `loss`,
    /// backward, the gradient-norm clip at `clip` (0: none) and Adam, as
    /// [`crate::net::Net::step`] does after autograd. Returns the batch
    /// loss. A batch of fewer than two pairs has no negatives: its loss is
    /// 0 with no gradient, and (as through autograd) the optimiser counts
    /// the step without moving anything.
    pub fn step(
        &mut self,
        data: &PairInputs,
        idx: &[usize],
        loss: &HeadLoss,
        opt: &mut Adam,
        clip: f64,
    ) -> Result<f32> {
        let Some(value) = self.gradients(data, idx, loss, opt)? else {
            opt.step_host_without_gradients();
            return Ok(0.0);
        };
        // Net::step's norm: each parameter's `g.sqr().sum_all()` in f32,
        // summed in f64.
        // The parameters' sums are independent: rayon's threads take whole
        // parameters, so each sum keeps candle's order.
        use rayon::prelude::*;
        let sums: Vec<f32> = self
            .grads
            .par_iter()
            .map(|g| candle_sum_of_squares(g))
            .collect();
        let mut sq = 0f64;
        for s in sums {
            sq += f64::from(s);
        }
        let norm = sq.sqrt();
        // As Net::step: clip / (norm + 1e-6) in f64, applied in f32.
        let scale = (clip > 0.0 && norm > clip).then(|| (clip / (norm + 1e-6)) as f32);
        opt.step_host(&self.grads, scale)?;
        Ok(value)
    }

    /// The batch loss, with the gradient of every parameter of `opt` in
    /// `self.grads` (optimiser order); None for a batch of fewer than two
    /// pairs, which has no gradient.
    fn gradients(
        &mut self,
        data: &PairInputs,
        idx: &[usize],
        loss: &HeadLoss,
        opt: &Adam,
    ) -> Result<Option<f32>> {
        let (ImageInputs::Embeddings { data: xi, .. }, TextInputs::Embeddings { data: xt, .. }) =
            (&data.images, &data.texts)
        else {
            candle_core::bail!("fused head step: the pairs are not precomputed vectors");
        };
        if !self.accepts(data) {
            candle_core::bail!("fused head step: the vectors' widths are not the head's");
        }
        let n = idx.len();
        if let HeadLoss::NcrSoftMarginHinge { labels, .. } = loss {
            if labels.len() != n {
                candle_core::bail!("fused head step: {} labels for {n} pairs", labels.len());
            }
        }
        if n < 2 {
            return Ok(None);
        }
        for (t, src) in [xi, xt].into_iter().enumerate() {
            gather(&mut self.towers[t], src, idx, self.unit_inputs);
        }
        // Read locks on the weights, held through forward and backward.
        let params: Vec<Values> = opt
            .params()
            .map(|(_, v)| values(v.as_tensor()))
            .collect::<Result<_>>()?;
        let w: Vec<&[f32]> = params.iter().map(Values::get).collect();
        Ok(Some(self.forward_backward(&w, n, loss)))
    }

    /// Forward and backward through both towers and the loss, weights `w`
    /// in the optimiser's order; fills `self.grads`, returns the loss.
    fn forward_backward(&mut self, w: &[&[f32]], n: usize, loss: &HeadLoss) -> f32 {
        let (joint, hidden, threads) = (self.joint, self.hidden, self.threads);
        for t in 0..2 {
            let p = |k: usize| w[self.slots[t][k]];
            tower_forward(
                &mut self.towers[t],
                n,
                joint,
                hidden,
                [p(P_WL), p(P_BL), p(P_W1), p(P_B1), p(P_W2), p(P_B2)],
                threads,
            );
        }
        self.s.resize(n * n, 0.0);
        self.g.resize(n * n, 0.0);
        let [img, txt] = &mut self.towers;
        matmul(
            &mut self.s,
            View::rows(&img.v, n, joint),
            View::rows(&txt.v, n, joint).t(),
            false,
            threads,
        );
        let mut value = match loss {
            HeadLoss::PerSampleHinge { margin } => {
                per_sample_hinge_grad(&self.s, n, *margin, &mut self.g, &mut self.scratch)
            }
            HeadLoss::NcrSoftMarginHinge { labels, alpha, m } => {
                ncr_soft_margin_hinge_grad(&self.s, n, labels, *alpha, *m, &mut self.g)
            }
        };
        // A non-finite similarity is a diverged run: report it in the loss
        // as autograd's would (the comparisons above skip NaN).
        if !self.s.iter().all(|x| x.is_finite()) {
            value = f32::NAN;
        }
        // ∂Vi = G·Vt, ∂Vt = Gᵀ·Vi.
        img.dv.resize(n * joint, 0.0);
        txt.dv.resize(n * joint, 0.0);
        matmul(
            &mut img.dv,
            View::rows(&self.g, n, n),
            View::rows(&txt.v, n, joint),
            false,
            threads,
        );
        matmul_as_transposed(
            &mut txt.dv,
            View::rows(&self.g, n, n).t(),
            View::rows(&img.v, n, joint),
            threads,
            &mut self.scratch,
        );
        for t in 0..2 {
            let slot = self.slots[t];
            let mut take = |k: usize| std::mem::take(&mut self.grads[slot[k]]);
            let mut g = [
                take(P_WL),
                take(P_BL),
                take(P_W1),
                take(P_B1),
                take(P_W2),
                take(P_B2),
            ];
            let w2 = w[slot[P_W2]];
            tower_backward(&mut self.towers[t], n, joint, hidden, w2, &mut g, threads);
            for (k, g) in g.into_iter().enumerate() {
                self.grads[slot[k]] = g;
            }
        }
        value
    }
}

/// Copies rows `idx` of `src` into the tower's input buffer, as unit rows
/// when `unit` (the head's input normalisation, candle's `l2_normalize`).
fn gather(t: &mut TowerBuffers, src: &[f32], idx: &[usize], unit: bool) {
    let d = t.dim;
    t.x.clear();
    for &i in idx {
        let row = &src[i * d..(i + 1) * d];
        if unit {
            let norm = l2_norm(row);
            t.x.extend(row.iter().map(|x| x / norm));
        } else {
            t.x.extend_from_slice(row);
        }
    }
}

/// `√(Σ x² + 1e-12)` of a row as `layers::l2_normalize` computes it:
/// `sqr`, candle's sum, the affine `· 1 + 1e-12`, `sqrt`.
#[allow(clippy::identity_op)]
fn l2_norm(row: &[f32]) -> f32 {
    (candle_sum_of_squares(row) * 1.0 + 1e-12).sqrt()
}

/// `dst[r, c] += bias[c]` for every row (candle's `broadcast_add` of a bias
/// onto a product).
fn add_rows(dst: &mut [f32], bias: &[f32]) {
    for row in dst.chunks_exact_mut(bias.len()) {
        for (d, b) in row.iter_mut().zip(bias) {
            *d += b;
        }
    }
}

/// Whether `n` rows' `X·W1ᵀ` (`hidden` columns) and `X·Wlᵀ` (`joint`) over
/// `d` inputs may run as one product of `hidden + joint` columns with the
/// same bits as candle's two. gemm sums each element over `d` in order in
/// blocks whose size depends on `d` alone, except in two special paths
/// that depend on the shape: outputs of at most 256 elements (a kernel of
/// horizontal dot products) and, for `d > 512`, outputs of at most 64 × 64
/// (blocks of 512). The products are stacked only where neither of
/// candle's products nor the stacked one takes either.
fn stacks_first_layer(n: usize, d: usize, hidden: usize, joint: usize) -> bool {
    let narrow = hidden.min(joint);
    n * narrow > 256 && (d <= 512 || n > 64 || narrow > 64)
}

/// `A`, `H`, `Z`, the row lengths and `V` of a tower for `n` rows; `w` is
/// the tower's parameters in `P_*` order. Op for op `Projection::forward`
/// and `l2_normalize`.
fn tower_forward(
    t: &mut TowerBuffers,
    n: usize,
    joint: usize,
    hidden: usize,
    w: [&[f32]; 6],
    threads: usize,
) {
    let d = t.dim;
    let x = View::rows(&t.x, n, d);
    t.a.resize(n * hidden, 0.0);
    t.z.resize(n * joint, 0.0);
    if stacks_first_layer(n, d, hidden, joint) {
        // X·W1ᵀ and X·Wlᵀ as one product X·[W1; Wl]ᵀ, the two weights
        // copied under each other: on two threads that ran in 0.74 instead
        // of 1.05 ms for the image tower (gemm splits 384 columns better
        // than 256 and 128), the copy costs a tenth of that. Each element
        // is the same sum as in its own product (see stacks_first_layer).
        t.stacked_w.clear();
        t.stacked_w.extend_from_slice(w[P_W1]);
        t.stacked_w.extend_from_slice(w[P_WL]);
        t.stacked.resize(n * (hidden + joint), 0.0);
        matmul(
            &mut t.stacked,
            x,
            View::rows(&t.stacked_w, hidden + joint, d).t(),
            false,
            threads,
        );
        for ((row, a), z) in t
            .stacked
            .chunks_exact(hidden + joint)
            .zip(t.a.chunks_exact_mut(hidden))
            .zip(t.z.chunks_exact_mut(joint))
        {
            a.copy_from_slice(&row[..hidden]);
            z.copy_from_slice(&row[hidden..]);
        }
    } else {
        matmul(
            &mut t.a,
            x,
            View::rows(w[P_W1], hidden, d).t(),
            false,
            threads,
        );
        matmul(
            &mut t.z,
            x,
            View::rows(w[P_WL], joint, d).t(),
            false,
            threads,
        );
    }
    add_rows(&mut t.a, w[P_B1]);
    t.h.clear();
    t.h.extend(t.a.iter().map(|&a| a.max(0.0)));
    t.mlp.resize(n * joint, 0.0);
    matmul(
        &mut t.mlp,
        View::rows(&t.h, n, hidden),
        View::rows(w[P_W2], joint, hidden).t(),
        false,
        threads,
    );
    add_rows(&mut t.mlp, w[P_B2]);
    add_rows(&mut t.z, w[P_BL]);
    for (z, m) in t.z.iter_mut().zip(&t.mlp) {
        *z += m;
    }
    t.norm.clear();
    t.v.clear();
    for row in t.z.chunks_exact(joint) {
        let norm = l2_norm(row);
        t.norm.push(norm);
        t.v.extend(row.iter().map(|z| z / norm));
    }
}

/// The tower's parameter gradients (`g` in `P_*` order, resized to fit)
/// from `∂V` in `t.dv`; `w2` is the tower's `fc2.weight`. Op for op
/// candle's backward of [`tower_forward`]'s graph.
#[allow(clippy::identity_op)]
fn tower_backward(
    t: &mut TowerBuffers,
    n: usize,
    joint: usize,
    hidden: usize,
    w2: &[f32],
    g: &mut [Vec<f32>; 6],
    threads: usize,
) {
    let d = t.dim;
    // V = Z / N (N broadcast over the row). Division's backward gives Z
    // `∂V / N` and N `0 − Σ_row (∂V·Z) / (N·N)`; square root's gives the
    // sum of squares `(∂N / N) · 0.5`, the affine `+ 1e-12` passes it on
    // (`· 1 + 0`), and square's gives Z `(Z · ∂s) · 2`. Z's two
    // contributions are added (in either order: two terms).
    t.row.resize(joint, 0.0);
    for ((dv, z), &norm) in
        t.dv.chunks_exact_mut(joint)
            .zip(t.z.chunks_exact(joint))
            .zip(&t.norm)
    {
        for ((r, &dv), &z) in t.row.iter_mut().zip(dv.iter()).zip(z) {
            *r = 0.0 - (dv * z) / (norm * norm);
        }
        let d_norm = candle_sum(&t.row);
        let d_sum = ((d_norm / norm) * 0.5 + 0.0) * 1.0 + 0.0;
        for (dv, &z) in dv.iter_mut().zip(z) {
            *dv = *dv / norm + ((z * d_sum) * 2.0 + 0.0);
        }
    }
    let dz = &t.dv;
    // Z = (X·Wlᵀ + bl) + (H·W2ᵀ + b2): both biases get the column sums of
    // ∂Z (candle's broadcast backward, rows summed in order).
    column_sums(&mut g[P_BL], dz, joint);
    let (before, from_b2) = g.split_at_mut(P_B2);
    from_b2[0].clone_from(&before[P_BL]);
    g[P_W2].resize(joint * hidden, 0.0);
    matmul_as_transposed(
        &mut g[P_W2],
        View::rows(dz, n, joint).t(),
        View::rows(&t.h, n, hidden),
        threads,
        &mut t.scratch,
    );
    // ∂A = (∂Z·W2) ⊙ [A ≥ 0], as `grad * a.ge(0)`.
    t.da.resize(n * hidden, 0.0);
    matmul(
        &mut t.da,
        View::rows(dz, n, joint),
        View::rows(w2, joint, hidden),
        false,
        threads,
    );
    for (da, a) in t.da.iter_mut().zip(&t.a) {
        *da *= if *a >= 0.0 { 1.0 } else { 0.0 };
    }
    column_sums(&mut g[P_B1], &t.da, hidden);
    let x = View::rows(&t.x, n, d);
    g[P_WL].resize(joint * d, 0.0);
    matmul_as_transposed(
        &mut g[P_WL],
        View::rows(dz, n, joint).t(),
        x,
        threads,
        &mut t.scratch,
    );
    g[P_W1].resize(hidden * d, 0.0);
    matmul_as_transposed(
        &mut g[P_W1],
        View::rows(&t.da, n, hidden).t(),
        x,
        threads,
        &mut t.scratch,
    );
}

/// `out[c] = Σ_r m[r, c]` of a row-major matrix `cols` wide.
fn column_sums(out: &mut Vec<f32>, m: &[f32], cols: usize) {
    out.clear();
    out.resize(cols, 0.0);
    for row in m.chunks_exact(cols) {
        for (o, x) in out.iter_mut().zip(row) {
            *o += x;
        }
    }
}

/// The mean per-sample hinge ([`crate::losses::per_sample_hinge`]) of the
/// `n × n` similarities `s` and its gradient `g = ∂L/∂S`, as autograd
/// computes both. Entry `(i, j)`, `j ≠ i`, enters row i's hinge as
/// `α − S_ii + S_ij` and column j's as `α − S_jj + S_ij`; each active one
/// adds `c = (1/n)·(1/(n−1))` to `g_ij` and takes it from the diagonal
/// entry it is measured against. The diagonal's sums run as candle's do
/// (a row with [`candle_sum`], a column row after row), since sums of `c`
/// round. `scratch` holds `2n²` values.
#[allow(clippy::identity_op)]
pub fn per_sample_hinge_grad(
    s: &[f32],
    n: usize,
    margin: f64,
    g: &mut [f32],
    scratch: &mut Vec<f32>,
) -> f32 {
    g.fill(0.0);
    if n < 2 {
        return 0.0;
    }
    let alpha = margin as f32;
    // The mean's 1/n and the hinge's affine 1/(n − 1), as candle's
    // backward multiplies them into each hinge's gradient.
    let inv_n = (1.0 / n as f64) as f32;
    let inv_n1 = (1.0 / (n - 1) as f64) as f32;
    let c = inv_n * inv_n1 + 0.0;
    scratch.clear();
    scratch.resize(2 * n * n, 0.0);
    let (rows, cols) = scratch.split_at_mut(n * n);
    // rows[i, j] = row i's hinge on caption j (relu(·) · off), cols[i, j]
    // column j's hinge on image i; their gradients go straight into g.
    for i in 0..n {
        let di = s[i * n + i];
        for j in 0..n {
            let off = if i == j { 0.0 } else { 1.0 };
            let sij = s[i * n + j];
            let q_row = (sij - di) * 1.0 + alpha;
            let q_col = (sij - s[j * n + j]) * 1.0 + alpha;
            rows[i * n + j] = q_row.max(0.0) * off;
            cols[i * n + j] = q_col.max(0.0) * off;
            let g_row = if q_row >= 0.0 { c * off } else { 0.0 };
            let g_col = if q_col >= 0.0 { c * off } else { 0.0 };
            g[i * n + j] = g_row + g_col;
        }
    }
    // The loss: ℓ_i = (Σ_j rows[i, j] + Σ_r cols[r, i]) · 1/(n − 1), its mean.
    let mut col_sums = Vec::new();
    column_sums(&mut col_sums, cols, n);
    let per_pair: Vec<f32> = (0..n)
        .map(|i| (candle_sum(&rows[i * n..(i + 1) * n]) + col_sums[i]) * inv_n1 + 0.0)
        .collect();
    let value = candle_sum(&per_pair) * inv_n + 0.0;
    // S_ii's gradient: `0 − g` of every active hinge measured against it,
    // row i's summed as candle sums a row, column i's row after row.
    for i in 0..n {
        for j in 0..n {
            let sij = s[i * n + j];
            let off = if i == j { 0.0 } else { 1.0 };
            let q_row = (sij - s[i * n + i]) * 1.0 + alpha;
            let q_col = (sij - s[j * n + j]) * 1.0 + alpha;
            rows[i * n + j] = 0.0 - if q_row >= 0.0 { c * off } else { 0.0 };
            cols[i * n + j] = 0.0 - if q_col >= 0.0 { c * off } else { 0.0 };
        }
    }
    column_sums(&mut col_sums, cols, n);
    for i in 0..n {
        g[i * n + i] = candle_sum(&rows[i * n..(i + 1) * n]) + col_sums[i];
    }
    value
}

/// The mean NCR soft-margin hinge ([`crate::losses::ncr_soft_margin_hinge`])
/// of the `n × n` similarities `s` with labels `y`, and its gradient
/// `g = ∂L/∂S`, as autograd computes both. Pair i's image→text hinge is
/// `max_j (α̂_j + S_ij) − S_ii` over `j ≠ i` (the diagonal is pushed down by
/// 1e4, as there), its text→image hinge `α̂_i − S_ii + max_{j≠i} S_ji`; an
/// active hinge adds `1/n` at every entry equal to its maximum and takes
/// `1/n` from `S_ii` (sums of at most two such terms: exact).
#[allow(clippy::identity_op)]
pub fn ncr_soft_margin_hinge_grad(
    s: &[f32],
    n: usize,
    y: &[f32],
    alpha: f64,
    m: f64,
    g: &mut [f32],
) -> f32 {
    g.fill(0.0);
    if n < 2 {
        return 0.0;
    }
    // α̂ = α (m^ŷ − 1)/(m − 1), op for op as losses::soft_margin computes
    // it with candle's affine ops (`t · c + a`).
    let (ln_m, k) = (m.ln() as f32, (alpha / (m - 1.0)) as f32);
    let margin: Vec<f32> = y
        .iter()
        .map(|&y| (((y * ln_m + 0.0).exp() * 1.0 + -1.0) * k) + 0.0)
        .collect();
    let masked = |i: usize, j: usize| {
        let v = s[i * n + j];
        v - if i == j { 1e4 } else { 0.0 }
    };
    let inv_n = (1.0 / n as f64) as f32;
    let mut per_pair = Vec::with_capacity(n);
    for i in 0..n {
        let d = s[i * n + i];
        // Image i against every caption, with the caption's margin.
        let cost = |j: usize| masked(i, j) + margin[j];
        let top = (0..n).map(cost).fold(f32::NEG_INFINITY, f32::max);
        let i2t = top - d;
        let mut diag = 0.0;
        if i2t >= 0.0 {
            for j in (0..n).filter(|&j| cost(j) == top) {
                g[i * n + j] += inv_n;
            }
            diag -= inv_n;
        }
        // Caption i against every image, with its own margin.
        let top = (0..n)
            .map(|j| masked(j, i))
            .fold(f32::NEG_INFINITY, f32::max);
        let t2i = (margin[i] - d) + top;
        if t2i >= 0.0 {
            for j in (0..n).filter(|&j| masked(j, i) == top) {
                g[j * n + i] += inv_n;
            }
            diag -= inv_n;
        }
        g[i * n + i] += diag;
        per_pair.push(i2t.max(0.0) + t2i.max(0.0));
    }
    candle_sum(&per_pair) * inv_n + 0.0
}

multiversion! {
    /// candle 0.11's f32 sum of a contiguous slice on this CPU (what
    /// `sum_keepdim` over the last dimension and `sum_all` compute): with
    /// AVX2 four 8-lane accumulators over blocks of 32, folded pairwise and
    /// then across the lanes, the tail added in order; without AVX2, in
    /// order.
    pub fn candle_sum(x: &[f32]) -> f32 => candle_sum_impl
}

multiversion! {
    /// [`candle_sum`] of the squares of `x` (`x.sqr()?.sum_all()`).
    pub fn candle_sum_of_squares(x: &[f32]) -> f32 => candle_sum_of_squares_impl
}

#[inline(always)]
fn candle_sum_impl(x: &[f32]) -> f32 {
    lane_sum(x, |v| v)
}

#[inline(always)]
fn candle_sum_of_squares_impl(x: &[f32]) -> f32 {
    lane_sum(x, |v| v * v)
}

/// The lane order of candle's `vec_sum` over `f(x)` (see [`candle_sum`]).
#[inline(always)]
fn lane_sum(x: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    if !avx2() {
        return x.iter().fold(0.0, |acc, &v| acc + f(v));
    }
    let blocks = x.chunks_exact(32);
    let tail = blocks.remainder();
    let mut acc = [[0f32; 8]; 4];
    for block in blocks {
        for (a, part) in acc.iter_mut().zip(block.chunks_exact(8)) {
            for (l, &v) in a.iter_mut().zip(part) {
                *l += f(v);
            }
        }
    }
    // _mm256_add_ps of accumulators 0+1 and 2+3, then of the two.
    let mut x0 = [0f32; 8];
    for l in 0..8 {
        x0[l] = (acc[0][l] + acc[1][l]) + (acc[2][l] + acc[3][l]);
    }
    // Low half + high half, then two horizontal adds.
    let t: [f32; 4] = std::array::from_fn(|l| x0[l] + x0[l + 4]);
    let mut sum = (t[0] + t[1]) + (t[2] + t[3]);
    for &v in tail {
        sum += f(v);
    }
    sum
}

/// Whether candle's CPU kernels take their AVX2 path here.
fn avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::losses::{ncr_soft_margin_hinge, per_sample_hinge};
    use crate::net::Net;
    use candle_core::{Tensor, Var};
    use ncclean_models::rng::Rng;

    /// Widths of a test head: image and caption inputs, hidden, joint.
    #[derive(Clone, Copy)]
    struct Dims {
        di: usize,
        dt: usize,
        hidden: usize,
        joint: usize,
    }

    const SMALL: Dims = Dims {
        di: 6,
        dt: 5,
        hidden: 7,
        joint: 4,
    };
    /// vanilla on MobileNetV2 + MiniLM features (the preset's head).
    const FLICKR: Dims = Dims {
        di: 1280,
        dt: 384,
        hidden: 256,
        joint: 128,
    };

    fn model(d: Dims, unit_inputs: bool) -> ModelConfig {
        ModelConfig {
            image: ImageTowerConfig::Precomputed {
                dim: d.di,
                local_dim: None,
            },
            text: TextTowerConfig::Precomputed {
                dim: d.dt,
                local_dim: None,
            },
            joint_dim: d.joint,
            hidden: d.hidden,
            head: ncclean_models::LocalOptions {
                unit_inputs,
                ..Default::default()
            },
        }
    }

    /// `n` pairs of normal vectors, scaled by 3 so that the raw inputs are
    /// not unit rows.
    fn pairs(d: Dims, n: usize, seed: u64) -> PairInputs {
        let mut rng = Rng::new(seed);
        let mut v = |k: usize| {
            (0..k)
                .map(|_| 3.0 * rng.normal() as f32)
                .collect::<Vec<_>>()
        };
        PairInputs {
            images: ImageInputs::Embeddings {
                data: v(n * d.di),
                dim: d.di,
                local: None,
            },
            texts: TextInputs::Embeddings {
                data: v(n * d.dt),
                dim: d.dt,
                local: None,
            },
        }
    }

    /// The loss tensor autograd trains on for `loss`.
    fn autograd_loss(s: &Tensor, loss: &HeadLoss) -> Result<Tensor> {
        match loss {
            HeadLoss::PerSampleHinge { margin } => per_sample_hinge(s, *margin)?.mean_all(),
            HeadLoss::NcrSoftMarginHinge { labels, alpha, m } => {
                let y = Tensor::new(labels.as_slice(), s.device())?;
                ncr_soft_margin_hinge(s, &y, *alpha, *m)?.mean_all()
            }
        }
    }

    fn losses(n: usize, rng: &mut Rng) -> [HeadLoss; 2] {
        [
            HeadLoss::PerSampleHinge { margin: 0.2 },
            HeadLoss::NcrSoftMarginHinge {
                labels: (0..n).map(|_| rng.uniform() as f32).collect(),
                alpha: 0.2,
                m: 10.0,
            },
        ]
    }

    /// The bits of each value, a zero's sign aside: autograd adds every
    /// variable's gradient onto zeros (which turns −0 into +0) and the fused
    /// step does not, and no weight sees the difference (Adam's first op on
    /// a gradient, `g · c + 0`, does the same; the test of steps below
    /// compares weights and moments with their signs).
    fn bits(x: &[f32]) -> Vec<u32> {
        x.iter().map(|v| (v + 0.0).to_bits()).collect()
    }

    /// The fused loss and the gradient of every parameter against candle's
    /// autograd through the model and the losses of `crate::losses`, bit
    /// for bit: random inputs and weights, raw and unit inputs, batches of
    /// 13 (neither a power of two nor a multiple of candle's 32-lane sum),
    /// 64 and 2, and one that shows a pair three times (rows that tie
    /// exactly in the maxima).
    fn gradients_equal_autograd(d: Dims, n_pairs: usize, batches: &[Vec<usize>]) -> Result<()> {
        let mut rng = Rng::new(11);
        let data = pairs(d, n_pairs, 5);
        for unit in [false, true] {
            let cfg = model(d, unit);
            let net = Net::new(&cfg, 7, &Device::Cpu, 1e-3, 2.0)?;
            let mut head = FusedHead::new(&cfg, &Device::Cpu, net.optimizer()).expect("applies");
            for idx in batches {
                for loss in losses(idx.len(), &mut rng) {
                    let what = format!("unit {unit}, batch of {}, {loss:?}", idx.len());
                    let s = net.batch_similarity(&data, idx)?;
                    let l = autograd_loss(&s, &loss)?;
                    let grads = l.backward()?;
                    let got = head
                        .gradients(&data, idx, &loss, net.optimizer())?
                        .expect("n ≥ 2");
                    assert_eq!(
                        got.to_bits(),
                        l.to_scalar::<f32>()?.to_bits(),
                        "{what}: loss"
                    );
                    for (k, (name, var)) in net.optimizer().params().enumerate() {
                        let want: Vec<f32> = grads
                            .get(var.as_tensor())
                            .expect("autograd reaches every parameter")
                            .flatten_all()?
                            .to_vec1()?;
                        assert!(
                            bits(&head.grads[k]) == bits(&want),
                            "{what}: {name} differs"
                        );
                    }
                }
            }
        }
        Ok(())
    }

    #[test]
    fn gradients_equal_autograd_bit_for_bit() -> Result<()> {
        let batches = [
            (0..13).map(|i| i * 3 % 70).collect(),
            (0..64).map(|i| (i * 7 + 1) % 70).collect(),
            vec![4, 9, 4, 17, 30, 4, 2, 21],
            vec![8, 1],
        ];
        gradients_equal_autograd(SMALL, 70, &batches)
    }

    /// Inputs wider than 512 with a narrow head: a batch of 100 takes the
    /// stacked first-layer product, one of 40 candle's two (its 40 × 32
    /// product sums the 600 inputs in blocks of 512); with inputs of 24
    /// both take the stacked one.
    #[test]
    fn gradients_equal_autograd_bit_for_bit_with_the_first_layer_stacked_or_not() -> Result<()> {
        let dims = Dims {
            di: 600,
            dt: 24,
            hidden: 48,
            joint: 32,
        };
        assert!(stacks_first_layer(100, 600, 48, 32) && !stacks_first_layer(40, 600, 48, 32));
        assert!(stacks_first_layer(40, 24, 48, 32) && !stacks_first_layer(5, 24, 48, 32));
        let batches = [(0..100).collect(), (0..40).map(|i| (i * 3) % 120).collect()];
        gradients_equal_autograd(dims, 120, &batches)
    }

    #[test]
    fn gradients_equal_autograd_bit_for_bit_at_flickr8k_widths() -> Result<()> {
        let batches = [
            (0..128).map(|i| (i * 5 + 3) % 200).collect(),
            (0..37).collect(),
        ];
        gradients_equal_autograd(FLICKR, 200, &batches)
    }

    /// `∂L/∂S` of both losses against candle's autograd on `S` itself, bit
    /// for bit: random matrices of 9 and 128 rows, and one whose rows and
    /// columns tie at their maxima (each tied entry gets the maximum's
    /// gradient, as candle's `max` gives it).
    #[test]
    fn loss_gradients_equal_autograd_on_s() -> Result<()> {
        let mut rng = Rng::new(3);
        let mut scratch = Vec::new();
        for n in [9, 128] {
            let random: Vec<f32> = (0..n * n)
                .map(|_| rng.uniform() as f32 * 2.0 - 1.0)
                .collect();
            // Rows 2 and 5 equal, columns 1 and 7 equal: ties off the diagonal.
            let mut tied = random.clone();
            for j in 0..n {
                tied[5 * n + j] = tied[2 * n + j];
            }
            for i in 0..n {
                tied[i * n + 7] = tied[i * n + 1];
            }
            for s in [random, tied] {
                for loss in losses(n, &mut rng) {
                    let var =
                        Var::from_tensor(&Tensor::from_vec(s.clone(), (n, n), &Device::Cpu)?)?;
                    let l = autograd_loss(var.as_tensor(), &loss)?;
                    let want: Vec<f32> = l
                        .backward()?
                        .get(var.as_tensor())
                        .expect("grad")
                        .flatten_all()?
                        .to_vec1()?;
                    let mut g = vec![0f32; n * n];
                    let value = match &loss {
                        HeadLoss::PerSampleHinge { margin } => {
                            per_sample_hinge_grad(&s, n, *margin, &mut g, &mut scratch)
                        }
                        HeadLoss::NcrSoftMarginHinge { labels, alpha, m } => {
                            ncr_soft_margin_hinge_grad(&s, n, labels, *alpha, *m, &mut g)
                        }
                    };
                    assert_eq!(value.to_bits(), l.to_scalar::<f32>()?.to_bits(), "{loss:?}");
                    assert!(bits(&g) == bits(&want), "n {n}, {loss:?}");
                }
            }
        }
        Ok(())
    }

    #[test]
    fn per_sample_hinge_gradient_hand_computed() {
        // α = 0.2, d = (0.9, 0.3, 0.8). Active hinges (S_ij − d + α > 0):
        // row 1: (1,0) 0.1 and (1,2) 0.55, against d_1; column 1: (0,1) 0.4
        // against d_1; column 2: (1,2) 0.05 against d_2. Every other one is
        // at most −0.1. With c = 1/(3·2): G_10 = c, G_12 = 2c, G_01 = c,
        // G_11 = −3c, G_22 = −c; L = (0.1 + 0.55 + 0.4 + 0.05)/6.
        let s = [0.9f32, 0.5, 0.1, 0.2, 0.3, 0.65, 0.4, 0.0, 0.8];
        let mut g = [0f32; 9];
        let l = per_sample_hinge_grad(&s, 3, 0.2, &mut g, &mut Vec::new());
        assert!((l - 1.1 / 6.0).abs() < 1e-6, "{l}");
        let c = 1.0 / 6.0;
        let want = [0.0, c, 0.0, c, -3.0 * c, 2.0 * c, 0.0, 0.0, -c];
        for (a, b) in g.iter().zip(want) {
            assert!((a - b).abs() < 1e-6, "{g:?}");
        }
    }

    #[test]
    fn ncr_soft_margin_hinge_gradient_hand_computed() {
        // S = [[0.5, 0.45], [0.42, 0.3]], ŷ = (1, 0) → α̂ = (0.2, 0)
        // (losses.rs' hand-computed case). Pair 0: image→text
        // 0.45 + 0 − 0.5 < 0; text→image 0.2 − 0.5 + 0.42 = 0.12 (image 1).
        // Pair 1: image→text 0.42 + 0.2 − 0.3 = 0.32 (caption 0);
        // text→image 0 − 0.3 + 0.45 = 0.15 (image 0). With 1/n = 0.5:
        // G = [[−0.5, 0.5], [0.5 + 0.5, −1]], L = (0.12 + 0.32 + 0.15)/2.
        let s = [0.5f32, 0.45, 0.42, 0.3];
        let mut g = [0f32; 4];
        let l = ncr_soft_margin_hinge_grad(&s, 2, &[1.0, 0.0], 0.2, 10.0, &mut g);
        assert!((l - 0.295).abs() < 1e-6, "{l}");
        assert_eq!(g, [-0.5, 0.5, 1.0, -1.0]);
    }

    #[test]
    fn candle_sum_is_candles_sum() -> Result<()> {
        let mut rng = Rng::new(5);
        for n in [0, 1, 7, 31, 32, 33, 128, 1000, 327_680] {
            let x: Vec<f32> = (0..n).map(|_| rng.normal() as f32 * 100.0).collect();
            let t = Tensor::from_vec(x.clone(), n, &Device::Cpu)?;
            let want: f32 = t.sum_all()?.to_scalar()?;
            assert_eq!(candle_sum(&x).to_bits(), want.to_bits(), "sum of {n}");
            let want: f32 = t.sqr()?.sum_all()?.to_scalar()?;
            let got = candle_sum_of_squares(&x);
            assert_eq!(got.to_bits(), want.to_bits(), "squares of {n}");
        }
        Ok(())
    }

    /// Twenty fused steps against twenty autograd steps (`Net::step`, the
    /// clip active in some): bit-identical weights and moments, every
    /// parameter moved (each gets a gradient); a one-pair batch counts a
    /// step and moves nothing, as through autograd.
    #[test]
    fn steps_equal_autograd_and_touch_every_parameter() -> Result<()> {
        let cfg = model(SMALL, false);
        let data = pairs(SMALL, 40, 9);
        let raw = |x: Vec<f32>| x.into_iter().map(f32::to_bits).collect::<Vec<_>>();
        let state = |net: &Net| -> Result<Vec<Vec<u32>>> {
            let mut out: Vec<Vec<u32>> = net
                .optimizer()
                .params()
                .map(|(_, v)| Ok(raw(v.flatten_all()?.to_vec1()?)))
                .collect::<Result<_>>()?;
            for (_, m) in net.optimizer().moments() {
                out.push(raw(m.flatten_all()?.to_vec1()?));
            }
            Ok(out)
        };
        let mut fused = Net::new(&cfg, 4, &Device::Cpu, 1e-2, 1.0)?;
        let mut reference = Net::new(&cfg, 4, &Device::Cpu, 1e-2, 1.0)?;
        assert!(fused.fuses(&data));
        assert!(!reference.set_fused(false) && !reference.fuses(&data));
        let start = state(&fused)?;
        let mut rng = Rng::new(1);
        let mut clipped = 0;
        for step in 0..20 {
            let idx: Vec<usize> = rng.permutation(40)[..16].to_vec();
            let [hinge, soft] = losses(16, &mut rng);
            let loss = if step % 2 == 0 { hinge } else { soft };
            let a = fused.fused_step(&data, &idx, &loss)?;
            let l = autograd_loss(&reference.batch_similarity(&data, &idx)?, &loss)?;
            let norm: f64 = reference.step(&l)?.to_scalar()?;
            clipped += usize::from(norm > 1.0);
            assert_eq!(a.to_bits(), l.to_scalar::<f32>()?.to_bits(), "step {step}");
            assert!(state(&fused)? == state(&reference)?, "step {step}");
        }
        assert!(clipped > 0 && clipped < 20, "{clipped} of 20 clipped");
        let names: Vec<&str> = fused.optimizer().params().map(|(n, _)| n).collect();
        for ((name, a), s) in names.iter().zip(state(&fused)?).zip(&start) {
            assert!(&a != s, "{name} never moved");
        }
        assert_eq!(fused.optimizer().steps(), 20);
        let before = state(&fused)?;
        let one = HeadLoss::PerSampleHinge { margin: 0.2 };
        assert_eq!(fused.fused_step(&data, &[3], &one)?, 0.0);
        assert!(state(&fused)? == before);
        assert_eq!(fused.optimizer().steps(), 21);
        Ok(())
    }

    #[test]
    fn applies_only_to_precomputed_projection_heads_on_the_cpu() -> Result<()> {
        let dev = Device::Cpu;
        let fused = |cfg: &ModelConfig| -> Result<bool> {
            let net = Net::new(cfg, 1, &dev, 1e-3, 2.0)?;
            Ok(FusedHead::new(cfg, &dev, net.optimizer()).is_some())
        };
        assert!(fused(&model(SMALL, false))?);
        assert!(fused(&model(SMALL, true))?);
        assert!(!fused(&crate::test_support::demo_local_model())?);
        let mut local = model(SMALL, false);
        local.image = ImageTowerConfig::Precomputed {
            dim: 6,
            local_dim: Some(3),
        };
        local.text = TextTowerConfig::Precomputed {
            dim: 5,
            local_dim: Some(3),
        };
        local.head = ncclean_models::LocalOptions::for_pooling(ncclean_models::Pooling::Mean, true);
        assert!(!fused(&local)?);
        // Inputs of other widths are refused, not misread.
        let net = Net::new(&model(SMALL, false), 1, &dev, 1e-3, 2.0)?;
        let other = crate::test_support::embedding_pairs(vec![0.5; 12], vec![0.5; 12], 6);
        assert!(!net.fuses(&other));
        Ok(())
    }
}
