//! Losses shared by the pipelines (METHODS.md section 0), on a batch
//! similarity matrix `S` (`S[i, j]` = image i against caption j).

use candle_core::{DType, Result, Tensor, D};
use ncclean_models::layers::log_softmax_last;

/// Diagonal of a square matrix as a vector.
pub fn diagonal(s: &Tensor) -> Result<Tensor> {
    let n = s.dim(0)?;
    let eye = Tensor::eye(n, s.dtype(), s.device())?;
    (s * eye)?.sum(1)
}

/// NCR per-sample hinge used for division and warm-up:
/// `l(i) = mean_{j≠i} [α − S_ii + S_ij]+ + mean_{j≠i} [α − S_ii + S_ji]+`.
/// A batch of one pair has no negatives and gets 0.
pub fn per_sample_hinge(s: &Tensor, margin: f64) -> Result<Tensor> {
    let n = s.dim(0)?;
    if n < 2 {
        return Tensor::zeros(n, s.dtype(), s.device());
    }
    let d = diagonal(s)?;
    let off =
        (Tensor::ones((n, n), s.dtype(), s.device())? - Tensor::eye(n, s.dtype(), s.device())?)?;
    // row i: caption j against image i; column i: image j against caption i
    let cost_t = ((s.broadcast_sub(&d.unsqueeze(1)?)? + margin)?.relu()? * &off)?.sum(1)?;
    let cost_i = ((s.broadcast_sub(&d.unsqueeze(0)?)? + margin)?.relu()? * &off)?.sum(0)?;
    (cost_t + cost_i)? / (n - 1) as f64
}

/// Soft margin `α̂ = α (m^ŷ − 1)/(m − 1)` for labels `ŷ` in [0, 1].
pub fn soft_margin(labels: &Tensor, alpha: f64, m: f64) -> Result<Tensor> {
    // m^ŷ = exp(ŷ ln m)
    ((labels * m.ln())?.exp()? - 1.0)? * (alpha / (m - 1.0))
}

/// What both soft-margin hinges start from: `S_ii`, the margins `α̂`, and
/// `S` with its diagonal pushed far down so that it never is the hardest
/// negative. None for a batch of fewer than two pairs (no negatives).
struct HingeParts {
    d: Tensor,
    margin: Tensor,
    masked: Tensor,
}

fn hinge_parts(s: &Tensor, labels: &Tensor, alpha: f64, m: f64) -> Result<Option<HingeParts>> {
    let n = s.dim(0)?;
    if n < 2 {
        return Ok(None);
    }
    Ok(Some(HingeParts {
        d: diagonal(s)?,
        margin: soft_margin(labels, alpha, m)?,
        masked: (s - (Tensor::eye(n, s.dtype(), s.device())? * 1e4)?)?,
    }))
}

/// VSE++ hardest-negative hinge with a per-pair soft margin:
/// `L(i) = [α̂_i − S_ii + max_{j≠i} S_ij]+ + [α̂_i − S_ii + max_{j≠i} S_ji]+`.
/// The query's own margin is used in both directions.
pub fn soft_margin_hinge(s: &Tensor, labels: &Tensor, alpha: f64, m: f64) -> Result<Tensor> {
    let Some(HingeParts { d, margin, masked }) = hinge_parts(s, labels, alpha, m)? else {
        return Tensor::zeros(s.dim(0)?, s.dtype(), s.device());
    };
    let hardest_t = masked.max(D::Minus1)?;
    let hardest_i = masked.max(0)?;
    let base = (margin - d)?;
    (&base + hardest_t)?.relu()? + (&base + hardest_i)?.relu()?
}

/// NCR's hardest-negative hinge with the soft margin as its released
/// `ContrastiveLoss` computes it: the per-pair margin vector is broadcast over
/// the columns of `S`, so a margin belongs to a *caption*. Image i against
/// caption j uses caption j's margin, and the hardest caption is the one with
/// the largest `α̂_j + S_ij`; caption i against image j uses caption i's own:
/// `L(i) = max_{j≠i} [α̂_j − S_ii + S_ij]+ + [α̂_i − S_ii + max_{j≠i} S_ji]+`.
///
/// `vanilla` trains with this form rather than [`soft_margin_hinge`]: on
/// Flickr8k with 50% noise it detects noisy pairs with AUROC 0.9685 against
/// 0.9550 (seeds 0–2; issue #16, BENCHMARKS.md "Parity with the reference").
/// The image→text hinge of a pair then no longer shrinks with the pair's own
/// uncertain label, only the text→image one does.
pub fn ncr_soft_margin_hinge(s: &Tensor, labels: &Tensor, alpha: f64, m: f64) -> Result<Tensor> {
    let Some(HingeParts { d, margin, masked }) = hinge_parts(s, labels, alpha, m)? else {
        return Tensor::zeros(s.dim(0)?, s.dtype(), s.device());
    };
    // cost[i, j] = α̂_j + S_ij: the margin travels with the caption (column).
    let cost = masked.broadcast_add(&margin.unsqueeze(0)?)?;
    let image_to_text = (cost.max(D::Minus1)? - &d)?.relu()?;
    let text_to_image = ((margin - &d)? + masked.max(0)?)?.relu()?;
    image_to_text + text_to_image
}

/// Log matching probabilities of every pair in a batch at temperature τ:
/// `(log P¹_ii, log P²_ii)` with `P¹ = row_softmax(S/τ)` (image→text) and
/// `P² = column_softmax(S/τ)` (text→image). The diagonals of the symmetric
/// InfoNCE (GSC's `L_CM`, CRCL's active loss, ReCon's `L_CM`) and of `p_i`.
pub fn match_log_diagonals(s: &Tensor, tau: f64) -> Result<(Tensor, Tensor)> {
    let z = (s / tau)?;
    Ok((
        diagonal(&log_softmax_last(&z)?)?,
        diagonal(&log_softmax_last(&z.t()?.contiguous()?)?)?,
    ))
}

/// Matching probability `p_i = (P¹_ii + P²_ii)/2` of every pair in a batch
/// (METHODS.md section 0): GSC's cross-modal indicator `y_CM`, CRCL's
/// prediction, ReCon's pseudo-label target.
pub fn match_prob(s: &Tensor, tau: f64) -> Result<Tensor> {
    let (a, b) = match_log_diagonals(s, tau)?;
    (a.exp()? + b.exp()?)? * 0.5
}

/// Per-pair symmetric InfoNCE `−(log P¹_ii + log P²_ii)/2`.
pub fn symmetric_infonce(s: &Tensor, tau: f64) -> Result<Tensor> {
    let (a, b) = match_log_diagonals(s, tau)?;
    (a + b)? * -0.5
}

/// Mean of a vector, 0 for an empty one.
pub fn mean(x: &Tensor) -> Result<Tensor> {
    if x.elem_count() == 0 {
        return Tensor::zeros((), DType::F32, x.device());
    }
    x.mean_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{close, s3};
    use candle_core::Device;

    #[test]
    fn per_sample_hinge_hand_computed() -> Result<()> {
        // α = 0.2
        // i=0: rows [0.2-0.9+0.5]+=0, [0.2-0.9+0.1]+=0; cols [0.2-0.9+0.2]+=0, [0.2-0.9+0.4]+=0 → 0
        // i=1: rows [0.2-0.3+0.2]=0.1, [0.2-0.3+0.6]=0.5 → mean 0.3;
        //      cols [0.2-0.3+0.5]=0.4, [0.2-0.3+0.0]=0 → mean 0.2 → 0.5
        // i=2: rows [0.2-0.8+0.4]+=0, [0.2-0.8+0.0]+=0; cols [0.2-0.8+0.1]+=0, [0.2-0.8+0.6]=0 → 0
        let l: Vec<f32> = per_sample_hinge(&s3(), 0.2)?.to_vec1()?;
        close(&l, &[0.0, 0.5, 0.0]);
        Ok(())
    }

    #[test]
    fn soft_margin_hinge_hand_computed() -> Result<()> {
        // labels ŷ = [1, 0.5, 0]; α = 0.2, m = 10
        // α̂ = 0.2 (10^ŷ − 1)/9 = [0.2, 0.2·(√10−1)/9 = 0.0480506, 0]
        // i=0: max row (0.5), max col (0.4): [0.2-0.9+0.5]+ + [0.2-0.9+0.4]+ = 0
        // i=1: max row 0.6, max col 0.5: [0.04805-0.3+0.6] + [0.04805-0.3+0.5] = 0.34805 + 0.24805
        // i=2: max row 0.4, max col 0.6: [0-0.8+0.4]+ + [0-0.8+0.6]+ = 0
        let labels = Tensor::new(&[1f32, 0.5, 0.0], &Device::Cpu)?;
        let l: Vec<f32> = soft_margin_hinge(&s3(), &labels, 0.2, 10.0)?.to_vec1()?;
        let a1 = 0.2 * (10f32.sqrt() - 1.0) / 9.0;
        close(&l, &[0.0, (a1 - 0.3 + 0.6) + (a1 - 0.3 + 0.5), 0.0]);
        let m: Vec<f32> = soft_margin(&labels, 0.2, 10.0)?.to_vec1()?;
        close(&m, &[0.2, a1, 0.0]);
        Ok(())
    }

    #[test]
    fn ncr_soft_margin_hinge_hand_computed() -> Result<()> {
        // labels ŷ = [1, 0.5, 0] → margins α̂ = [0.2, a1 = 0.0480506, 0] (as above).
        // Image→text uses the negative caption's margin:
        // i=0: [a1-0.9+0.5]+ = 0, [0-0.9+0.1]+ = 0; text→image (own 0.2): [0.2-0.9+0.4]+ = 0
        // i=1: [0.2-0.3+0.2] = 0.1, [0-0.3+0.6] = 0.3 → 0.3 (own margin: a1+0.3);
        //      text→image (own a1): [a1-0.3+0.5] = a1+0.2
        // i=2: [0.2-0.8+0.4]+ = 0, [a1-0.8+0.0]+ = 0; text→image (own 0): [0-0.8+0.6]+ = 0
        let labels = Tensor::new(&[1f32, 0.5, 0.0], &Device::Cpu)?;
        let l: Vec<f32> = ncr_soft_margin_hinge(&s3(), &labels, 0.2, 10.0)?.to_vec1()?;
        let a1 = 0.2 * (10f32.sqrt() - 1.0) / 9.0;
        close(&l, &[0.0, 0.3 + (a1 + 0.2), 0.0]);
        // Each image's negative brings its own margin: S = [[0.5, 0.45], [0.42, 0.3]],
        // labels (1, 0) → α̂ = (0.2, 0). Image 1 against caption 0: [0.2-0.3+0.42] = 0.32
        // (own margin 0 would give 0.12); image 0 against caption 1: [0-0.5+0.45]+ = 0
        // (own margin 0.2 would give 0.15).
        // Captions: 0 ← image 1: [0.2-0.5+0.42] = 0.12; 1 ← image 0: [0-0.3+0.45] = 0.15.
        let s = Tensor::new(&[[0.5f32, 0.45], [0.42, 0.3]], &Device::Cpu)?;
        let y = Tensor::new(&[1f32, 0.0], &Device::Cpu)?;
        let l: Vec<f32> = ncr_soft_margin_hinge(&s, &y, 0.2, 10.0)?.to_vec1()?;
        close(&l, &[0.12, 0.32 + 0.15]);
        Ok(())
    }

    #[test]
    fn match_prob_and_infonce_hand_computed() -> Result<()> {
        // S/τ with τ = 0.1: [[9, 5, 1], [2, 3, 6], [4, 0, 8]].
        // r0 = e^9+e^5+e^1 = 8254.215, P¹_00 = 8103.084/8254.215 = 0.981690;
        // c0 = e^9+e^2+e^4 = 8165.071, P²_00 = 0.992408 → p_0 = 0.987049.
        // r1 = 430.903, P¹_11 = 20.086/430.903 = 0.046613;
        // c1 = 169.499, P²_11 = 0.118500 → p_1 = 0.082556.
        // r2 = 3036.556, P¹_22 = 0.981690; c2 = 3387.105, P²_22 = 0.880090 → p_2 = 0.930890.
        let p: Vec<f32> = match_prob(&s3(), 0.1)?.to_vec1()?;
        close(&p, &[0.987049, 0.082556, 0.930890]);
        // InfoNCE: −(ln P¹_ii + ln P²_ii)/2.
        let l: Vec<f32> = symmetric_infonce(&s3(), 0.1)?.to_vec1()?;
        let want = [
            -(0.981690f64.ln() + 0.992408f64.ln()) / 2.0,
            -(0.046613f64.ln() + 0.118500f64.ln()) / 2.0,
            -(0.981690f64.ln() + 0.880090f64.ln()) / 2.0,
        ];
        for (x, y) in l.iter().zip(want) {
            assert!((f64::from(*x) - y).abs() < 1e-4, "{l:?} vs {want:?}");
        }
        Ok(())
    }

    #[test]
    fn single_pair_batches_have_zero_loss() -> Result<()> {
        let s = Tensor::new(&[[0.3f32]], &Device::Cpu)?;
        assert_eq!(per_sample_hinge(&s, 0.2)?.to_vec1::<f32>()?, vec![0.0]);
        let y = Tensor::new(&[1f32], &Device::Cpu)?;
        assert_eq!(
            soft_margin_hinge(&s, &y, 0.2, 10.0)?.to_vec1::<f32>()?,
            vec![0.0]
        );
        assert_eq!(
            ncr_soft_margin_hinge(&s, &y, 0.2, 10.0)?.to_vec1::<f32>()?,
            vec![0.0]
        );
        Ok(())
    }
}
