//! The ridge signal: a closed-form linear map from a pair's image to its
//! caption, fitted on the pairs the networks trained on.
//!
//! The map takes an image's pooled features in the reference's search
//! space ([`super::Reference`]: the 128-wide principal subspace, unit rows)
//! to the pooled caption features, by weighted ridge regression on the
//! trained pairs, each weighted by the method's clean probability (the
//! weights the reference's captions carry), so pairs the method called
//! mismatched barely pull the map. A pair's signal is the cosine of its
//! caption with the map's prediction for its image, read as a z-score
//! against the same caption's cosines with the predictions for a bank of
//! training images, as the caption null reads the similarity
//! ([`super::null`]): a caption that fits no image (boilerplate) sits at
//! its own null.
//!
//! Why a third signal: the trained similarity is sharpened on the pairs
//! the networks saw and the neighbourhood score never compares a pair
//! with its own image; a linear map on frozen features is neither. On
//! Flickr8k (GSC as shipped, the 7,000 graded test pairs and the dev
//! split) it raised the graded τb of new pairs by 0.2–1.2 at random
//! 0–70%, hard, boilerplate and placeholder noise, and their random-swap
//! AUROC by 0.003–0.006 (BENCHMARKS.md, "The ridge signal"). Held-out
//! human ratings point the same way: a ridge map beat every trained
//! similarity there (issue #31).
//!
//! Held-out calibration pairs are not in the fit (they stand for new
//! pairs), and the pairs the networks trained on are weighed without this
//! signal ([`super::signals`]: beside their sharpened similarity it cost
//! them graded order). Every
//! prediction and dot product is a fixed chain of multiply-adds per row
//! ([`PackedLinear`]), so a pair's signal does not depend on the rows
//! scored with it.

use ncclean_models::packed_linear::PackedLinear;

use candle_core::Result;

use super::null::MIN_SD;
use crate::scoring::par_map;

/// Ridge strength relative to the mean eigenvalue of the weighted, centred
/// Gram matrix of the images (its trace over its width), so that it does
/// not depend on the number of pairs. Graded τb of the signal alone on
/// Flickr8k: 57.8 / 59.1 / 59.6 / 59.3 at 0.03 / 0.1 / 0.3 / 1 (raw
/// cosine, full features); the three-signal score moved by at most 0.2
/// over that range.
pub const STRENGTH: f64 = 0.3;

/// Query rows per task on the thread pool.
const PIECE: usize = 256;

/// The fitted map and the bank's predictions, as kept in a checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct Ridge {
    /// `[text_dim, width]`, row-major: each caption feature's weights over
    /// the search space.
    pub map: Vec<f32>,
    /// `text_dim`: the prediction at the origin of the search space
    /// (`mean_caption − mean_image · W`).
    pub bias: Vec<f32>,
    /// `[bank, text_dim]`: the bank images' predictions, unit rows.
    pub bank: Vec<f32>,
    /// Width of the search space (the map's input).
    pub width: usize,
    /// Width of the caption features (the map's output).
    pub text_dim: usize,
}

impl Ridge {
    /// Fit on pairs: `images` `[n, width]` (search-space rows), `captions`
    /// `[n, text_dim]` (unit pooled features), `weights[i]` pair i's weight
    /// (clamped to [0, 1], not finite: 0); `bank` `[m, width]` the bank's
    /// images. None without two bank images or any weight, or when the
    /// system cannot be solved (features with no spread).
    pub fn fit(
        images: &[f32],
        captions: &[f32],
        weights: &[f32],
        bank: &[f32],
        (width, text_dim): (usize, usize),
    ) -> Option<Ridge> {
        let n = weights.len();
        if width == 0
            || text_dim == 0
            || images.len() != n * width
            || captions.len() != n * text_dim
            || bank.len() < 2 * width
        {
            return None;
        }
        let w: Vec<f64> = weights
            .iter()
            .map(|&v| {
                if v.is_finite() {
                    f64::from(v.clamp(0.0, 1.0))
                } else {
                    0.0
                }
            })
            .collect();
        let total: f64 = w.iter().sum();
        if total <= 0.0 {
            return None;
        }
        let mut mx = vec![0.0f64; width];
        let mut my = vec![0.0f64; text_dim];
        for (i, &wi) in w.iter().enumerate() {
            if wi == 0.0 {
                continue;
            }
            for (m, &x) in mx.iter_mut().zip(row(images, i, width)) {
                *m += wi * f64::from(x);
            }
            for (m, &y) in my.iter_mut().zip(row(captions, i, text_dim)) {
                *m += wi * f64::from(y);
            }
        }
        mx.iter_mut().for_each(|m| *m /= total);
        my.iter_mut().for_each(|m| *m /= total);
        // G = Σ w (x − mx)(x − mx)ᵀ and B = Σ w (x − mx)(y − my)ᵀ.
        let mut g = vec![0.0f64; width * width];
        let mut b = vec![0.0f64; width * text_dim];
        let mut xc = vec![0.0f64; width];
        let mut yc = vec![0.0f64; text_dim];
        for (i, &wi) in w.iter().enumerate() {
            if wi == 0.0 {
                continue;
            }
            for ((c, &x), m) in xc.iter_mut().zip(row(images, i, width)).zip(&mx) {
                *c = f64::from(x) - m;
            }
            for ((c, &y), m) in yc.iter_mut().zip(row(captions, i, text_dim)).zip(&my) {
                *c = wi * (f64::from(y) - m);
            }
            for a in 0..width {
                let wa = wi * xc[a];
                for (gv, &xb) in g[a * width..(a + 1) * width].iter_mut().zip(&xc) {
                    *gv += wa * xb;
                }
                let xa = xc[a];
                for (bv, &y) in b[a * text_dim..(a + 1) * text_dim].iter_mut().zip(&yc) {
                    *bv += xa * y;
                }
            }
        }
        let trace: f64 = (0..width).map(|a| g[a * width + a]).sum();
        let lambda = STRENGTH * trace / width as f64;
        if !lambda.is_finite() || lambda <= 0.0 {
            return None;
        }
        for a in 0..width {
            g[a * width + a] += lambda;
        }
        let solved = cholesky_solve(&mut g, &mut b, width, text_dim)?;
        // W is `[width, text_dim]` in `solved`; the map keeps its transpose.
        let mut map = vec![0f32; text_dim * width];
        for a in 0..width {
            for k in 0..text_dim {
                map[k * width + a] = solved[a * text_dim + k] as f32;
            }
        }
        let bias: Vec<f32> = (0..text_dim)
            .map(|k| {
                let shift: f64 = (0..width).map(|a| mx[a] * solved[a * text_dim + k]).sum();
                (my[k] - shift) as f32
            })
            .collect();
        let mut ridge = Ridge {
            map,
            bias,
            bank: Vec::new(),
            width,
            text_dim,
        };
        let m = bank.len() / width;
        let mut predicted = ridge.predict(&bank[..m * width]);
        for p in predicted.chunks_mut(text_dim) {
            let norm = p.iter().map(|v| v * v).sum::<f32>().sqrt();
            if norm > 0.0 {
                p.iter_mut().for_each(|v| *v /= norm);
            }
        }
        ridge.bank = predicted;
        Some(ridge)
    }

    /// Images in the bank.
    pub fn bank_len(&self) -> usize {
        self.bank.len() / self.text_dim.max(1)
    }

    /// Whether the arrays fit the widths (a checkpoint's, before use).
    pub fn is_consistent(&self) -> bool {
        self.width > 0
            && self.text_dim > 0
            && self.map.len() == self.width * self.text_dim
            && self.bias.len() == self.text_dim
            && self.bank.len().is_multiple_of(self.text_dim)
            && self.bank_len() >= 2
    }

    /// The map's predictions `[n, text_dim]` for `images` `[n, width]`:
    /// each entry the bias, then one chain of multiply-adds.
    fn predict(&self, images: &[f32]) -> Vec<f32> {
        let n = images.len() / self.width;
        let packed = PackedLinear::new(&self.map, self.text_dim, self.width);
        let mut out: Vec<f32> = Vec::with_capacity(n * self.text_dim);
        for _ in 0..n {
            out.extend_from_slice(&self.bias);
        }
        packed.accumulate(&mut out, &images[..n * self.width]);
        out
    }

    /// The ridge signal of pairs: `images` `[n, width]` in the search
    /// space, `captions` `[n, text_dim]` unit pooled features. Each pair's
    /// cosine of caption and prediction as a z-score against that
    /// caption's cosines with the bank's predictions; NaN where the
    /// prediction is zero or a value is not finite.
    pub fn scores(&self, images: &[f32], captions: &[f32]) -> Result<Vec<f32>> {
        let (w, dt) = (self.width, self.text_dim);
        let n = images.len() / w.max(1);
        if n == 0 || captions.len() < n * dt {
            return Ok(vec![f32::NAN; n]);
        }
        let bank = PackedLinear::new(&self.bank, self.bank_len(), dt);
        let pieces: Vec<std::ops::Range<usize>> = (0..n)
            .step_by(PIECE)
            .map(|s| s..(s + PIECE).min(n))
            .collect();
        let parts = par_map(&pieces, |p: &std::ops::Range<usize>| -> Result<Vec<f32>> {
            let predicted = self.predict(&images[p.start * w..p.end * w]);
            let caps = &captions[p.start * dt..p.end * dt];
            let m = self.bank_len();
            let mut null = vec![0f32; p.len() * m];
            bank.accumulate(&mut null, caps);
            Ok(predicted
                .chunks(dt)
                .zip(caps.chunks(dt))
                .zip(null.chunks(m))
                .map(|((pred, cap), null)| z_score(pred, cap, null))
                .collect::<Vec<f32>>())
        })?;
        Ok(parts.concat())
    }
}

/// Row `i` of a row-major matrix of width `d`.
fn row(m: &[f32], i: usize, d: usize) -> &[f32] {
    &m[i * d..(i + 1) * d]
}

/// One pair's signal from its prediction, caption and the caption's
/// cosines with the bank's predictions: plain sums in order.
fn z_score(pred: &[f32], caption: &[f32], null: &[f32]) -> f32 {
    let norm = pred.iter().map(|v| v * v).sum::<f32>().sqrt();
    if norm.is_nan() || norm <= 0.0 {
        return f32::NAN;
    }
    let cos = pred.iter().zip(caption).map(|(a, b)| a * b).sum::<f32>() / norm;
    let m = null.len() as f64;
    let mean = null.iter().map(|&v| f64::from(v)).sum::<f64>() / m;
    let var = null
        .iter()
        .map(|&v| (f64::from(v) - mean).powi(2))
        .sum::<f64>()
        / (m - 1.0).max(1.0);
    let z = (f64::from(cos) - mean) / var.sqrt().max(f64::from(MIN_SD));
    if z.is_finite() {
        z as f32
    } else {
        f32::NAN
    }
}

/// Solve `A X = B` for symmetric positive definite `A` `[n, n]` (row-major,
/// overwritten by its Cholesky factor) and `B` `[n, k]`; None when `A` is
/// not positive definite.
fn cholesky_solve(a: &mut [f64], b: &mut [f64], n: usize, k: usize) -> Option<Vec<f64>> {
    // A = L Lᵀ, L in the lower triangle.
    for j in 0..n {
        let mut d = a[j * n + j];
        for p in 0..j {
            d -= a[j * n + p] * a[j * n + p];
        }
        if d.is_nan() || d <= 0.0 {
            return None;
        }
        let d = d.sqrt();
        a[j * n + j] = d;
        for i in j + 1..n {
            let mut s = a[i * n + j];
            for p in 0..j {
                s -= a[i * n + p] * a[j * n + p];
            }
            a[i * n + j] = s / d;
        }
    }
    // L Y = B, then Lᵀ X = Y, column block by column block (rows of B).
    for i in 0..n {
        for p in 0..i {
            let l = a[i * n + p];
            for c in 0..k {
                b[i * k + c] -= l * b[p * k + c];
            }
        }
        let d = a[i * n + i];
        b[i * k..(i + 1) * k].iter_mut().for_each(|v| *v /= d);
    }
    for i in (0..n).rev() {
        for p in i + 1..n {
            let l = a[p * n + i];
            for c in 0..k {
                b[i * k + c] -= l * b[p * k + c];
            }
        }
        let d = a[i * n + i];
        b[i * k..(i + 1) * k].iter_mut().for_each(|v| *v /= d);
    }
    Some(b.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cholesky_solves_a_hand_computed_system() {
        // A = [[4, 2], [2, 3]], B = [[2, 0], [1, 4]]:
        // det 8, A⁻¹ = [[3, −2], [−2, 4]] / 8,
        // X = A⁻¹ B = [[(6 − 2) / 8, −8 / 8], [(−4 + 4) / 8, 16 / 8]]
        //   = [[0.5, −1], [0, 2]].
        let mut a = vec![4.0, 2.0, 2.0, 3.0];
        let mut b = vec![2.0, 0.0, 1.0, 4.0];
        let x = cholesky_solve(&mut a, &mut b, 2, 2).expect("positive definite");
        for (got, want) in x.iter().zip([0.5, -1.0, 0.0, 2.0]) {
            assert!((got - want).abs() < 1e-12, "{x:?}");
        }
        let mut singular = vec![1.0, 1.0, 1.0, 1.0];
        assert!(cholesky_solve(&mut singular, &mut [1.0, 1.0], 2, 1).is_none());
    }

    #[test]
    fn the_map_is_the_weighted_ridge_solution() {
        // One input feature, one output: x = 0, 1, 2 with weights 1, 1, 0
        // (the third pair does not count), y = 1, 3, 100.
        // Weighted means: mx = 0.5, my = 2. Centred: x −0.5, 0.5; y −1, 1.
        // G = 0.5, B = 1, λ = 0.3 · G / 1 = 0.15:
        // W = 1 / 0.65, bias = 2 − 0.5 W.
        let images = [0.0, 1.0, 2.0];
        let captions = [1.0, 3.0, 100.0];
        let bank = [0.0, 1.0];
        let r = Ridge::fit(&images, &captions, &[1.0, 1.0, 0.0], &bank, (1, 1)).expect("fitted");
        let w = 1.0 / 0.65;
        assert!((f64::from(r.map[0]) - w).abs() < 1e-6, "{:?}", r.map);
        assert!((f64::from(r.bias[0]) - (2.0 - 0.5 * w)).abs() < 1e-6);
        // The bank's predictions are unit rows: one feature, its sign.
        assert_eq!(r.bank, vec![1.0, 1.0]);
        assert!(r.is_consistent());
        // No weight at all, or no bank: no map.
        assert!(Ridge::fit(&images, &captions, &[0.0; 3], &bank, (1, 1)).is_none());
        assert!(Ridge::fit(&images, &captions, &[1.0; 3], &[0.0], (1, 1)).is_none());
    }

    /// Deterministic unit rows.
    fn rows(seed: u64, n: usize, d: usize) -> Vec<f32> {
        let mut rng = ncclean_models::rng::Rng::new(seed);
        let mut v: Vec<f32> = (0..n * d).map(|_| rng.normal() as f32).collect();
        for r in v.chunks_mut(d) {
            let norm = r.iter().map(|x| x * x).sum::<f32>().sqrt();
            r.iter_mut().for_each(|x| *x /= norm);
        }
        v
    }

    #[test]
    fn matched_captions_score_above_their_null_and_rows_are_independent() {
        // Captions are a fixed linear image of the images plus noise: the
        // map learns it, so a pair's own caption scores far above the
        // caption's cosines with other images' predictions, and a caption
        // shown with another image does not.
        let (n, w, dt) = (600, 8, 6);
        let images = rows(1, n, w);
        let mix = rows(2, dt, w);
        let noise = rows(3, n, dt);
        let mut captions = vec![0f32; n * dt];
        for i in 0..n {
            for k in 0..dt {
                let s: f32 = (0..w).map(|a| images[i * w + a] * mix[k * w + a]).sum();
                captions[i * dt + k] = s + 0.2 * noise[i * dt + k];
            }
            let c = &mut captions[i * dt..(i + 1) * dt];
            let norm = c.iter().map(|x| x * x).sum::<f32>().sqrt();
            c.iter_mut().for_each(|x| *x /= norm);
        }
        let r = Ridge::fit(
            &images,
            &captions,
            &vec![1.0; n],
            &images[..64 * w],
            (w, dt),
        )
        .expect("fitted");
        let own = r.scores(&images, &captions).expect("scored");
        let mut shifted = images[w..].to_vec();
        shifted.extend_from_slice(&images[..w]);
        let other = r.scores(&shifted, &captions).expect("scored");
        let mean = |v: &[f32]| v.iter().map(|&x| f64::from(x)).sum::<f64>() / v.len() as f64;
        assert!(mean(&own) > 1.2, "own captions {}", mean(&own));
        assert!(mean(&other).abs() < 0.3, "other images' {}", mean(&other));
        let above = own.iter().zip(&other).filter(|(a, b)| a > b).count();
        assert!(above as f64 > 0.9 * n as f64, "{above} of {n}");
        // A row's bits do not depend on the rows scored with it.
        for q in [0, 7, 300, n - 1] {
            let one = r
                .scores(&images[q * w..(q + 1) * w], &captions[q * dt..(q + 1) * dt])
                .expect("scored");
            assert_eq!(one[0].to_bits(), own[q].to_bits(), "row {q}");
        }
    }
}
