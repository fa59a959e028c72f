//! Per-pair statistics of one batch similarity matrix, computed on the host
//! from its values: the division and scoring passes' side of the functions
//! in [`crate::losses`], which stay the training side (they carry
//! gradients).
//!
//! Why a second form: a scoring pass evaluates these statistics on
//! thousands of 128×128 batches (every pair in `division_shuffles`
//! shuffles, per network). As tensor expressions each is a dozen candle ops
//! (identity masks, broadcasts, reductions), each allocating a fresh
//! matrix; the ops' dispatch and allocation cost several times the
//! arithmetic, and made ESC and GSC score 3× slower than vanilla
//! (issue #10). Here each statistic is one or two sweeps over the matrix.
//! The formulas are the tensor versions', operation for operation; only the
//! order of the sums differs, so results agree to float rounding (tested
//! against them below).

use candle_core::{Result, Tensor};

/// A square batch matrix on the host, row-major: `S[i, j]` = image i
/// against caption j (or a Gram matrix of one side).
#[derive(Debug, Clone, PartialEq)]
pub struct Square {
    n: usize,
    values: Vec<f32>,
}

impl Square {
    /// Copy a `[n, n]` f32 tensor to the host.
    pub fn from_tensor(s: &Tensor) -> Result<Square> {
        let (n, m) = s.dims2()?;
        if n != m {
            candle_core::bail!("batch matrix is {n}×{m}, not square");
        }
        Ok(Square {
            n,
            values: s.flatten_all()?.to_vec1()?,
        })
    }

    /// Side length (pairs in the batch).
    pub fn n(&self) -> usize {
        self.n
    }

    /// Row `i`.
    pub fn row(&self, i: usize) -> &[f32] {
        &self.values[i * self.n..(i + 1) * self.n]
    }

    /// Entry `[i, j]`.
    pub fn at(&self, i: usize, j: usize) -> f32 {
        self.values[i * self.n + j]
    }

    /// The rows as vectors (for the selection rules that index rows).
    pub fn rows(&self) -> Vec<Vec<f32>> {
        (0..self.n).map(|i| self.row(i).to_vec()).collect()
    }
}

/// NCR per-sample hinge ([`crate::losses::per_sample_hinge`]):
/// `l(i) = (Σ_{j≠i} [α − S_ii + S_ij]+ + Σ_{j≠i} [α − S_ii + S_ji]+) / (n − 1)`;
/// 0 for a batch of one pair.
pub fn hinge(s: &Square, margin: f64) -> Vec<f32> {
    let n = s.n;
    if n < 2 {
        return vec![0.0; n];
    }
    let m = margin as f32;
    let inv = 1.0 / (n - 1) as f32;
    (0..n)
        .map(|i| {
            let d = s.at(i, i);
            let mut cost = 0f32;
            for j in (0..n).filter(|&j| j != i) {
                cost += (s.at(i, j) - d + m).max(0.0);
                cost += (s.at(j, i) - d + m).max(0.0);
            }
            cost * inv
        })
        .collect()
}

/// `(log P¹_ii, log P²_ii)` at temperature τ
/// ([`crate::losses::match_log_diagonals`]): the diagonals of the row and of
/// the column log-softmax of `S/τ`.
pub fn match_log_diagonals(s: &Tensor, tau: f64) -> Result<(Vec<f32>, Vec<f32>)> {
    Ok(match_log_diagonals_of(&Square::from_tensor(s)?, tau))
}

/// [`match_log_diagonals`] of a host matrix.
pub fn match_log_diagonals_of(s: &Square, tau: f64) -> (Vec<f32>, Vec<f32>) {
    let n = s.n;
    let inv_tau = (1.0 / tau) as f32;
    // log-softmax diagonal of a line: z_ii − max − ln Σ exp(z − max), with
    // z = S/τ. Columns are swept row by row (contiguous reads).
    let mut col_max = vec![f32::NEG_INFINITY; n];
    let mut row_max = vec![f32::NEG_INFINITY; n];
    for (i, rm) in row_max.iter_mut().enumerate() {
        for (cm, &x) in col_max.iter_mut().zip(s.row(i)) {
            let z = x * inv_tau;
            *rm = rm.max(z);
            *cm = cm.max(z);
        }
    }
    let mut col_sum = vec![0f32; n];
    let mut rows = Vec::with_capacity(n);
    for (i, &rm) in row_max.iter().enumerate() {
        let mut row_sum = 0f32;
        for ((cs, &cm), &x) in col_sum.iter_mut().zip(&col_max).zip(s.row(i)) {
            let z = x * inv_tau;
            row_sum += (z - rm).exp();
            *cs += (z - cm).exp();
        }
        rows.push((s.at(i, i) * inv_tau - rm) - row_sum.ln());
    }
    let cols = (0..n)
        .map(|j| (s.at(j, j) * inv_tau - col_max[j]) - col_sum[j].ln())
        .collect();
    (rows, cols)
}

/// Matching probability `p_i = (P¹_ii + P²_ii)/2` ([`crate::losses::match_prob`]).
pub fn match_prob(s: &Square, tau: f64) -> Vec<f32> {
    infonce_and_match_prob(s, tau).1
}

/// Per-pair symmetric InfoNCE `−(log P¹_ii + log P²_ii)/2`
/// ([`crate::losses::symmetric_infonce`]).
pub fn symmetric_infonce(s: &Square, tau: f64) -> Vec<f32> {
    infonce_and_match_prob(s, tau).0
}

/// [`symmetric_infonce`] and [`match_prob`] from one pass over `S`.
pub fn infonce_and_match_prob(s: &Square, tau: f64) -> (Vec<f32>, Vec<f32>) {
    let (a, b) = match_log_diagonals_of(s, tau);
    a.iter()
        .zip(&b)
        .map(|(x, y)| ((x + y) * -0.5, (x.exp() + y.exp()) * 0.5))
        .unzip()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::losses;
    use crate::test_support::{close, s3};
    use candle_core::Device;
    use ncclean_models::rng::Rng;

    fn random(n: usize, seed: u64) -> Result<Tensor> {
        let mut r = Rng::new(seed);
        let v: Vec<f32> = (0..n * n).map(|_| r.normal() as f32 * 0.5).collect();
        Tensor::from_vec(v, (n, n), &Device::Cpu)
    }

    #[test]
    fn hinge_hand_computed() -> Result<()> {
        // S = [[0.9, 0.5, 0.1], [0.2, 0.3, 0.6], [0.4, 0.0, 0.8]], α = 0.2.
        // i=1 (S_11 = 0.3): row [0.2-0.3+0.2]+ = 0.1, [0.2-0.3+0.6]+ = 0.5;
        //   column [0.2-0.3+0.5]+ = 0.4, [0.2-0.3+0.0]+ = 0 → 1.0 / 2 = 0.5.
        // i=2 (S_22 = 0.8): row [0.4-0.8+0.2]+ = 0, [0.0-0.8+0.2]+ = 0;
        //   column [0.1-0.8+0.2]+ = 0, [0.6-0.8+0.2]+ = 0 → 0.
        // i=0 (S_00 = 0.9): every term is negative → 0.
        let h = hinge(&Square::from_tensor(&s3())?, 0.2);
        close(&h, &[0.0, 0.5, 0.0]);
        assert_eq!(
            hinge(
                &Square::from_tensor(&s3().narrow(0, 0, 1)?.narrow(1, 0, 1)?)?,
                0.2
            ),
            vec![0.0]
        );
        Ok(())
    }

    #[test]
    fn match_prob_hand_computed() -> Result<()> {
        // τ = 0.1, logits [[9, 5, 1], [2, 3, 6], [4, 0, 8]].
        // Pair 2: row softmax e^8/(e^4+e^0+e^8), column e^8/(e^1+e^6+e^8).
        let row = (8f64).exp() / ((4f64).exp() + 1.0 + (8f64).exp());
        let col = (8f64).exp() / ((1f64).exp() + (6f64).exp() + (8f64).exp());
        let p = match_prob(&Square::from_tensor(&s3())?, 0.1);
        assert!((f64::from(p[2]) - (row + col) / 2.0).abs() < 1e-6, "{p:?}");
        let l = symmetric_infonce(&Square::from_tensor(&s3())?, 0.1);
        assert!(
            (f64::from(l[2]) + (row.ln() + col.ln()) / 2.0).abs() < 1e-5,
            "{l:?}"
        );
        Ok(())
    }

    #[test]
    fn host_statistics_equal_the_tensor_versions() -> Result<()> {
        for (n, seed) in [(1, 0), (2, 1), (7, 2), (128, 3)] {
            let s = random(n, seed)?;
            let h = Square::from_tensor(&s)?;
            close(
                &hinge(&h, 0.2),
                &losses::per_sample_hinge(&s, 0.2)?.to_vec1()?,
            );
            close(
                &match_prob(&h, 0.05),
                &losses::match_prob(&s, 0.05)?.to_vec1()?,
            );
            close(
                &symmetric_infonce(&h, 0.1),
                &losses::symmetric_infonce(&s, 0.1)?.to_vec1()?,
            );
            let (a, b) = match_log_diagonals_of(&h, 0.1);
            let (ta, tb) = losses::match_log_diagonals(&s, 0.1)?;
            close(&a, &ta.to_vec1()?);
            close(&b, &tb.to_vec1()?);
        }
        assert!(Square::from_tensor(&Tensor::zeros(
            (2, 3),
            candle_core::DType::F32,
            &Device::Cpu
        )?)
        .is_err());
        Ok(())
    }
}
