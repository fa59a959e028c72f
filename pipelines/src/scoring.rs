//! Per-pair statistics computed over a whole dataset without gradients; the
//! same functions serve the per-epoch division and final scoring.

use candle_core::{Result, Tensor};
use ncclean_models::rng::Rng;

use crate::batches::shuffled_batches;
use crate::losses::per_sample_hinge;

/// The shuffle stream of final scoring: fixed per seed, so `fit`'s labels
/// and `ncclean score` on the same data see the same batches.
pub fn score_rng(seed: u64) -> Rng {
    Rng::derive(seed, "score-shuffles")
}

/// Similarity of each pair with itself, `S_ii`, from full-dataset embeddings.
pub fn pair_similarity(vi: &Tensor, vt: &Tensor) -> Result<Vec<f32>> {
    (vi * vt)?.sum(1)?.to_vec1()
}

/// The NCR per-sample hinge of every pair, computed in shuffled batches of
/// `batch` (it depends on the other pairs in the batch) and averaged over
/// `shuffles` independent shuffles drawn from `rng`.
pub fn hinge_statistic(
    vi: &Tensor,
    vt: &Tensor,
    batch: usize,
    shuffles: usize,
    margin: f64,
    rng: &mut Rng,
) -> Result<Vec<f32>> {
    let n = vi.dim(0)?;
    let all: Vec<usize> = (0..n).collect();
    let mut acc = vec![0f32; n];
    let shuffles = shuffles.max(1);
    for _ in 0..shuffles {
        for b in shuffled_batches(&all, batch, rng) {
            let ids = Tensor::from_vec(
                b.iter().map(|&i| i as u32).collect::<Vec<_>>(),
                b.len(),
                vi.device(),
            )?;
            let s = vi
                .index_select(&ids, 0)?
                .matmul(&vt.index_select(&ids, 0)?.t()?)?;
            let l: Vec<f32> = per_sample_hinge(&s, margin)?.to_vec1()?;
            for (&i, v) in b.iter().zip(l) {
                acc[i] += v;
            }
        }
    }
    Ok(acc.into_iter().map(|v| v / shuffles as f32).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn statistic_flags_the_mismatched_pair() -> Result<()> {
        // Three well-matched pairs (image = caption direction) and one whose
        // caption points elsewhere: its hinge must be the largest.
        let dev = Device::Cpu;
        let vi = Tensor::new(&[[1f32, 0.], [0., 1.], [-1., 0.], [0., -1.]], &dev)?;
        let vt = Tensor::new(&[[1f32, 0.], [0., 1.], [-1., 0.], [1., 0.]], &dev)?;
        let mut rng = Rng::new(0);
        let l = hinge_statistic(&vi, &vt, 4, 2, 0.2, &mut rng)?;
        let worst = l.iter().cloned().fold(f32::MIN, f32::max);
        assert_eq!(worst, l[3], "{l:?}");
        assert_eq!(pair_similarity(&vi, &vt)?, vec![1.0, 1.0, 1.0, 0.0]);
        Ok(())
    }
}
