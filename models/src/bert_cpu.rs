//! An inference-only BERT encoder for the CPU, over plain `f32` slices
//! (issue #35: MiniLM at PyTorch's speed).
//!
//! candle-transformers' `BertModel` runs each layer as ~25 tensor ops, each
//! allocating its output; its attention builds a `[B, 1, L, L]` mask and
//! broadcasts it over the heads, its softmax makes three passes over the
//! scores, its erf GELU calls a scalar f64 `erf` per element and its
//! layer norm is a separate op after a separate residual add. On MiniLM
//! that put the non-matmul work above half the forward time. Here a layer is
//! four matrix products (through [`crate::packed_linear`]: weights packed
//! once at load, AVX-512 where the CPU has it, the same bits on every
//! x86-64 CPU with AVX2 and FMA) and three fused passes:
//!
//! - query, key and value in **one product** against the concatenated
//!   weights, the biases written into the output first (the product
//!   accumulates into it), so nothing is transposed or made contiguous;
//! - **attention** per (sequence, head) straight from that product's
//!   output: scaled scores over the real keys only (masked keys are skipped,
//!   which is what adding `f32::MIN` and exponentiating does exactly), a
//!   max-subtracted softmax with a vectorisable `exp`, and the weighted sum
//!   of values written into the context rows;
//! - the output projections accumulate onto the residual stream in place
//!   (bias added first), then **layer norm** row by row while the row is in
//!   L1;
//! - the feed-forward **GELU** uses a rational erf approximation (max abs
//!   error of erf under 1e-6, tested) instead of a scalar libm call.
//!
//! Frozen use only: there is no autograd here (the tower never trains).
//! The kernels are plain loops that LLVM vectorises; on x86-64 they are
//! compiled a second time for AVX2+FMA and picked at run time.

use candle_core::{DType, Result};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{Config as BertConfig, HiddenAct, PositionEmbeddingType};
use rayon::prelude::*;

use crate::multiversion;
use crate::packed_linear::PackedLinear;

/// Weights of one encoder layer, as Hugging Face stores them (`[out, in]`
/// row-major linear weights).
struct Layer {
    /// `[3H, H]`: query, key and value weights stacked.
    qkv_w: PackedLinear,
    qkv_b: Vec<f32>,
    /// `[H, H]` attention output projection.
    attn_out_w: PackedLinear,
    attn_out_b: Vec<f32>,
    ln1_g: Vec<f32>,
    ln1_b: Vec<f32>,
    /// `[I, H]` feed-forward up projection.
    up_w: PackedLinear,
    up_b: Vec<f32>,
    /// `[H, I]` feed-forward down projection.
    down_w: PackedLinear,
    down_b: Vec<f32>,
    ln2_g: Vec<f32>,
    ln2_b: Vec<f32>,
}

/// A BERT encoder (absolute positions, erf GELU) held as `f32` vectors.
pub(crate) struct CpuBert {
    word: Vec<f32>,
    pos: Vec<f32>,
    /// Token type 0's embedding (the tower never passes other types).
    type0: Vec<f32>,
    emb_ln_g: Vec<f32>,
    emb_ln_b: Vec<f32>,
    layers: Vec<Layer>,
    hidden: usize,
    heads: usize,
    inter: usize,
    vocab: usize,
    max_pos: usize,
    eps: f32,
}

fn vec_of(vb: &VarBuilder, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
    vb.get(shape, name)?
        .to_dtype(DType::F32)?
        .flatten_all()?
        .to_vec1()
}

/// Layer-norm weight and bias; older checkpoints call them gamma and beta.
fn ln_of(vb: &VarBuilder, h: usize) -> Result<(Vec<f32>, Vec<f32>)> {
    if vb.contains_tensor("weight") {
        Ok((vec_of(vb, "weight", &[h])?, vec_of(vb, "bias", &[h])?))
    } else {
        Ok((vec_of(vb, "gamma", &[h])?, vec_of(vb, "beta", &[h])?))
    }
}

impl CpuBert {
    /// Whether this encoder computes what candle-transformers' BERT does
    /// for `config`; otherwise the tower keeps candle's model.
    pub(crate) fn supports(config: &BertConfig) -> bool {
        config.hidden_act == HiddenAct::Gelu
            && config.position_embedding_type == PositionEmbeddingType::Absolute
            && config.num_attention_heads > 0
            && config
                .hidden_size
                .is_multiple_of(config.num_attention_heads)
            && config.type_vocab_size > 0
    }

    /// Load from the same tensor names candle-transformers' BERT reads
    /// (with or without a `bert.` prefix).
    pub(crate) fn load(vb: VarBuilder, config: &BertConfig) -> Result<Self> {
        let vb = if vb.contains_tensor("embeddings.word_embeddings.weight") {
            vb
        } else {
            vb.pp("bert")
        };
        let (h, i) = (config.hidden_size, config.intermediate_size);
        let emb = vb.pp("embeddings");
        let word = vec_of(&emb, "word_embeddings.weight", &[config.vocab_size, h])?;
        let pos = vec_of(
            &emb,
            "position_embeddings.weight",
            &[config.max_position_embeddings, h],
        )?;
        let types = vec_of(
            &emb,
            "token_type_embeddings.weight",
            &[config.type_vocab_size, h],
        )?;
        let (emb_ln_g, emb_ln_b) = ln_of(&emb.pp("LayerNorm"), h)?;
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for n in 0..config.num_hidden_layers {
            let l = vb.pp(format!("encoder.layer.{n}"));
            let att = l.pp("attention");
            let (mut qkv_w, mut qkv_b) = (Vec::with_capacity(3 * h * h), Vec::new());
            for part in ["query", "key", "value"] {
                let p = att.pp("self").pp(part);
                qkv_w.extend(vec_of(&p, "weight", &[h, h])?);
                qkv_b.extend(vec_of(&p, "bias", &[h])?);
            }
            let (ln1_g, ln1_b) = ln_of(&att.pp("output.LayerNorm"), h)?;
            let (ln2_g, ln2_b) = ln_of(&l.pp("output.LayerNorm"), h)?;
            layers.push(Layer {
                qkv_w: PackedLinear::new(&qkv_w, 3 * h, h),
                qkv_b,
                attn_out_w: PackedLinear::new(&vec_of(&att, "output.dense.weight", &[h, h])?, h, h),
                attn_out_b: vec_of(&att, "output.dense.bias", &[h])?,
                ln1_g,
                ln1_b,
                up_w: PackedLinear::new(&vec_of(&l, "intermediate.dense.weight", &[i, h])?, i, h),
                up_b: vec_of(&l, "intermediate.dense.bias", &[i])?,
                down_w: PackedLinear::new(&vec_of(&l, "output.dense.weight", &[h, i])?, h, i),
                down_b: vec_of(&l, "output.dense.bias", &[h])?,
                ln2_g,
                ln2_b,
            });
        }
        Ok(CpuBert {
            word,
            pos,
            type0: types[..h].to_vec(),
            emb_ln_g,
            emb_ln_b,
            layers,
            hidden: h,
            heads: config.num_attention_heads,
            inter: i,
            vocab: config.vocab_size,
            max_pos: config.max_position_embeddings,
            eps: config.layer_norm_eps as f32,
        })
    }

    /// Last hidden states `[B·L·H]` (zeros on padding) and their masked
    /// mean `[B·H]` of token ids `[B·L]` (row-major) under a 0/1 mask
    /// `[B·L]` (any nonzero counts as a real token).
    ///
    /// Only real tokens are computed: every op but attention is per token,
    /// and attention sees only real keys, so dropping the padded rows
    /// changes no real token's value (candle and PyTorch compute them and
    /// mask them out after) and saves their share of every product.
    /// Sequences are split into one group per thread of rayon's pool, equal
    /// in tokens, and each group runs the whole stack on its thread: no
    /// synchronisation between ops, which on a shared 2-core machine cost
    /// more than the products themselves when one core was busy elsewhere.
    pub(crate) fn forward(
        &self,
        ids: &[u32],
        mask: &[f32],
        b: usize,
        l: usize,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let (h, n) = (self.hidden, b * l);
        if ids.len() != n || mask.len() != n {
            candle_core::bail!(
                "BERT: {} ids and {} mask values for [{b}, {l}]",
                ids.len(),
                mask.len()
            );
        }
        if l > self.max_pos {
            candle_core::bail!("BERT: {l} tokens exceed {} positions", self.max_pos);
        }
        if let Some(&bad) = ids.iter().find(|&&t| t as usize >= self.vocab) {
            candle_core::bail!(
                "BERT: token id {bad} outside the vocabulary of {}",
                self.vocab
            );
        }
        // The real positions of each sequence, in order.
        let seqs: Vec<Vec<usize>> = (0..b)
            .map(|s| (0..l).filter(|&i| mask[s * l + i] != 0.0).collect())
            .collect();
        let total: usize = seqs.iter().map(Vec::len).sum();
        let groups = rayon::current_num_threads().clamp(1, b.max(1));
        let mut bounds = vec![0];
        let mut acc = 0;
        for (s, seq) in seqs.iter().enumerate() {
            acc += seq.len();
            if acc * groups >= total * bounds.len() && bounds.len() < groups {
                bounds.push(s + 1);
            }
        }
        bounds.push(b);
        bounds.dedup();
        let outs: Vec<Vec<f32>> = bounds
            .par_windows(2)
            .map(|w| self.encode_group(ids, l, w[0], &seqs[w[0]..w[1]]))
            .collect();
        // Scatter into the padded layout and pool.
        let mut tokens = vec![0f32; n * h];
        let mut pooled = vec![0f32; b * h];
        let mut rows = outs.iter().flat_map(|o| o.chunks_exact(h));
        for (s, seq) in seqs.iter().enumerate() {
            let pool = &mut pooled[s * h..][..h];
            for &i in seq {
                let row = rows.next().expect("one output row per real token");
                tokens[(s * l + i) * h..][..h].copy_from_slice(row);
                pool.iter_mut().zip(row).for_each(|(p, v)| *p += v);
            }
            let inv = 1.0 / (seq.len().max(1) as f32);
            pool.iter_mut().for_each(|p| *p *= inv);
        }
        Ok((tokens, pooled))
    }

    /// Final hidden states `[tokens, H]` of the real tokens of sequences
    /// `first..first + seqs.len()`, packed one after another.
    fn encode_group(&self, ids: &[u32], l: usize, first: usize, seqs: &[Vec<usize>]) -> Vec<f32> {
        let h = self.hidden;
        let n: usize = seqs.iter().map(Vec::len).sum();
        let lens: Vec<usize> = seqs.iter().map(Vec::len).collect();
        // Embeddings: word + position + token type 0, then layer norm.
        let mut x = Vec::with_capacity(n * h);
        for (s, seq) in seqs.iter().enumerate() {
            for &i in seq {
                let t = ids[(first + s) * l + i] as usize;
                let (w, pe) = (&self.word[t * h..][..h], &self.pos[i * h..][..h]);
                x.extend((0..h).map(|k| w[k] + pe[k] + self.type0[k]));
            }
        }
        layer_norm_rows(&mut x, &self.emb_ln_g, &self.emb_ln_b, self.eps);
        let mut qkv = vec![0f32; n * 3 * h];
        let mut ctx = vec![0f32; n * h];
        let mut up = vec![0f32; n * self.inter];
        for layer in &self.layers {
            linear_into(&mut qkv, &x, &layer.qkv_w, &layer.qkv_b, false);
            attention(&qkv, &lens, &mut ctx, h, self.heads);
            // x ← LN(x + ctx·Woᵀ + bo): the product accumulates onto x.
            linear_into(&mut x, &ctx, &layer.attn_out_w, &layer.attn_out_b, true);
            layer_norm_rows(&mut x, &layer.ln1_g, &layer.ln1_b, self.eps);
            linear_into(&mut up, &x, &layer.up_w, &layer.up_b, false);
            gelu_block(&mut up);
            linear_into(&mut x, &up, &layer.down_w, &layer.down_b, true);
            layer_norm_rows(&mut x, &layer.ln2_g, &layer.ln2_b, self.eps);
        }
        x
    }
}

/// `dst [rows, out] (+)= src [rows, in] · wᵀ + bias`: the bias is added
/// into `dst` (kept, when `accumulate`, as the residual stream) and the
/// product accumulates onto it, so the bias, the residual and the product
/// need no separate pass or buffer. On this thread (the caller runs one
/// group of sequences per thread).
fn linear_into(dst: &mut [f32], src: &[f32], w: &PackedLinear, bias: &[f32], accumulate: bool) {
    let out = bias.len();
    assert_eq!(w.out(), out, "linear: bias size");
    for row in dst.chunks_exact_mut(out) {
        if accumulate {
            row.iter_mut().zip(bias).for_each(|(d, b)| *d += b);
        } else {
            row.copy_from_slice(bias);
        }
    }
    w.accumulate(dst, src);
}

/// Self-attention from the fused projection `qkv [tokens, 3H]` (query,
/// key, value side by side, heads of `H / heads` columns in each) into
/// `ctx [tokens, H]`, for packed sequences of lengths `lens`.
fn attention(qkv: &[f32], lens: &[usize], ctx: &mut [f32], h: usize, heads: usize) {
    let mut start = 0;
    for &n in lens {
        let end = start + n;
        attend_sequence(
            &qkv[start * 3 * h..end * 3 * h],
            &mut ctx[start * h..end * h],
            h,
            heads,
        );
        start = end;
    }
}

multiversion! {
    /// One sequence's attention (every row a real token), one head and one
    /// query at a time: scaled scores against every key, softmax, weighted
    /// sum of the values.
    fn attend_sequence(qkv: &[f32], ctx: &mut [f32], h: usize, heads: usize)
        => attend_sequence_impl
}

#[inline(always)]
fn attend_sequence_impl(qkv: &[f32], ctx: &mut [f32], h: usize, heads: usize) {
    let (l, dh) = (qkv.len() / (3 * h), h / heads);
    let scale = 1.0 / (dh as f32).sqrt();
    let mut scores = vec![0f32; l];
    for head in 0..heads {
        let (q0, k0, v0) = (head * dh, h + head * dh, 2 * h + head * dh);
        for i in 0..l {
            let q = &qkv[i * 3 * h + q0..][..dh];
            for (j, s) in scores.iter_mut().enumerate() {
                *s = dot(q, &qkv[j * 3 * h + k0..][..dh]) * scale;
            }
            softmax_in_place(&mut scores);
            let out = &mut ctx[i * h + head * dh..][..dh];
            out.fill(0.0);
            for (j, &p) in scores.iter().enumerate() {
                axpy(out, p, &qkv[j * 3 * h + v0..][..dh]);
            }
        }
    }
}

/// Dot product in eight independent lanes (so it vectorises without
/// reassociating a single running sum).
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for t in 0..8 {
            acc[t] += x[t] * y[t];
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[inline(always)]
fn axpy(out: &mut [f32], a: f32, x: &[f32]) {
    for (o, v) in out.iter_mut().zip(x) {
        *o += a * v;
    }
}

/// Sum in eight lanes (see [`dot`]).
#[inline(always)]
fn lane_sum(x: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut acc = [0f32; 8];
    let c = x.chunks_exact(8);
    let tail: f32 = c.remainder().iter().map(|&v| f(v)).sum();
    for v in c {
        for t in 0..8 {
            acc[t] += f(v[t]);
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// `exp(x)` for `x ≤ 0` (softmax after subtracting the maximum): Cephes'
/// `expf` range reduction and polynomial (relative error ~1e-7), without
/// branches so that a loop over it vectorises. Inputs below −87 give a
/// subnormal-free tiny value instead of 0, harmless in a softmax sum.
#[inline(always)]
fn exp_nonpos(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // 1.5·2²³: adding and subtracting it rounds to the nearest integer.
    const ROUND: f32 = 12_582_912.0;
    let x = x.max(-87.0);
    let n = (x * LOG2E + ROUND) - ROUND;
    let r = x - n * 0.693_359_4 - n * -2.121_944_4e-4;
    let mut p = 1.987_569_1e-4;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 0.166_666_65;
    p = p * r + 0.5;
    let e = p * r * r + r + 1.0;
    // 2ⁿ built from its exponent bits (n ∈ [−126, 0]).
    e * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

#[inline(always)]
fn softmax_in_place(s: &mut [f32]) {
    let max = s.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    for v in s.iter_mut() {
        *v = exp_nonpos(*v - max);
    }
    let inv = 1.0 / lane_sum(s, |v| v);
    for v in s.iter_mut() {
        *v *= inv;
    }
}

multiversion! {
    /// Layer norm of each `g.len()`-wide row of `block`, in place.
    fn layer_norm_rows(block: &mut [f32], g: &[f32], b: &[f32], eps: f32) => layer_norm_impl
}

/// Mean, then variance around it, then the affine map: three sweeps of a
/// 1.5 KB row that stays in L1 (a single sum-of-squares pass would lose
/// precision when the mean is large against the spread).
#[inline(always)]
fn layer_norm_impl(block: &mut [f32], g: &[f32], b: &[f32], eps: f32) {
    let h = g.len();
    for row in block.chunks_exact_mut(h) {
        let mean = lane_sum(row, |v| v) / h as f32;
        let var = lane_sum(row, |v| (v - mean) * (v - mean)) / h as f32;
        let inv = 1.0 / (var + eps).sqrt();
        for ((v, g), b) in row.iter_mut().zip(g).zip(b) {
            *v = (*v - mean) * inv * g + b;
        }
    }
}

/// `erf(x)` as a rational function of odd degree 13 over even degree 8 in
/// `x` on [−4, 4] (±1 beyond, where f32 erf is ±1): the approximation
/// Eigen and XLA use for f32. Max abs error vs the exact erf is tested
/// below 1e-6.
#[inline(always)]
pub(crate) fn erf_fast(x: f32) -> f32 {
    let x = x.clamp(-4.0, 4.0);
    let x2 = x * x;
    let mut p = -2.726_142_3e-10;
    p = p * x2 + 2.770_681_4e-8;
    p = p * x2 + -2.101_024e-6;
    p = p * x2 + -5.692_506_4e-5;
    p = p * x2 + -7.349_906_3e-4;
    p = p * x2 + -2.954_600_2e-3;
    p = p * x2 + -1.609_603_3e-2;
    let mut q = -1.456_607_2e-5;
    q = q * x2 + -2.133_740_6e-4;
    q = q * x2 + -1.682_827e-3;
    q = q * x2 + -7.373_329e-3;
    q = q * x2 + -1.426_474e-2;
    x * p / q
}

multiversion! {
    /// `x · Φ(x) = x/2 · (1 + erf(x/√2))` in place.
    fn gelu_block(x: &mut [f32]) => gelu_impl
}

#[inline(always)]
fn gelu_impl(x: &mut [f32]) {
    for v in x.iter_mut() {
        *v = 0.5 * *v * (1.0 + erf_fast(*v * std::f32::consts::FRAC_1_SQRT_2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::cpu::erf::erf_f64;

    #[test]
    fn erf_fast_is_within_1e6_of_exact() {
        let mut worst = 0f64;
        for i in -600_000..=600_000 {
            let x = i as f32 * 1e-5; // [-6, 6]
            let d = (erf_fast(x) as f64 - erf_f64(x as f64)).abs();
            worst = worst.max(d);
        }
        assert!(worst < 1e-6, "max |erf_fast - erf| = {worst:e}");
        // and the GELU built on it, through the dispatching kernel
        let xs: Vec<f32> = (-8000..=8000).map(|i| i as f32 * 1e-3).collect();
        let mut g = xs.clone();
        gelu_block(&mut g);
        for (x, g) in xs.iter().zip(&g) {
            let want = 0.5 * *x as f64 * (1.0 + erf_f64(*x as f64 / 2f64.sqrt()));
            assert!((*g as f64 - want).abs() < 1e-5, "gelu({x}) = {g} vs {want}");
        }
    }

    #[test]
    fn exp_nonpos_is_within_2e7_relative() {
        for i in 0..=870_000 {
            let x = -(i as f32) * 1e-4; // [-87, 0]
            let (got, want) = (exp_nonpos(x) as f64, (x as f64).exp());
            assert!(
                (got - want).abs() <= 2e-7 * want,
                "exp({x}) = {got} vs {want}"
            );
        }
        assert!(exp_nonpos(-1e4) < 1e-37);
    }

    #[test]
    fn softmax_and_layer_norm_match_their_definitions() {
        let mut s = vec![1.0f32, -2.0, 0.5, 3.0, 3.0, -30.0, 0.0, 2.5, 1.5];
        let want: Vec<f64> = {
            let e: Vec<f64> = s.iter().map(|&v| (v as f64 - 3.0).exp()).collect();
            let z: f64 = e.iter().sum();
            e.iter().map(|v| v / z).collect()
        };
        softmax_in_place(&mut s);
        for (g, w) in s.iter().zip(&want) {
            assert!((*g as f64 - w).abs() < 1e-7, "{g} vs {w}");
        }
        let h = 13;
        let mut x: Vec<f32> = (0..2 * h)
            .map(|i| (i as f32 * 0.7).sin() * 5.0 + 2.0)
            .collect();
        let g: Vec<f32> = (0..h).map(|i| 1.0 + i as f32 * 0.1).collect();
        let b: Vec<f32> = (0..h).map(|i| i as f32 * -0.05).collect();
        let rows: Vec<Vec<f32>> = x.chunks(h).map(<[f32]>::to_vec).collect();
        layer_norm_rows(&mut x, &g, &b, 1e-12);
        for (row, got) in rows.iter().zip(x.chunks(h)) {
            let mean = row.iter().map(|&v| v as f64).sum::<f64>() / h as f64;
            let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / h as f64;
            for k in 0..h {
                let want = (row[k] as f64 - mean) / var.sqrt() * g[k] as f64 + b[k] as f64;
                assert!((got[k] as f64 - want).abs() < 1e-5, "{} vs {want}", got[k]);
            }
        }
    }
}
