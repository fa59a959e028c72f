//! Per-pair statistics computed over a whole dataset without gradients; the
//! same functions serve the per-epoch division and final scoring.

use candle_core::{Result, Tensor};
use ncclean_models::rng::Rng;
use ncclean_models::PairInputs;

use crate::batches::shuffled_batches;
use crate::config::TrainConfig;
use crate::division::{CleanSide, Division};
use crate::losses::per_sample_hinge;
use crate::net::Net;
use crate::runner::EMBED_CHUNK;

/// A division statistic and the similarity `S_ii` of every pair, from one
/// pass over a dataset.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StatPass {
    /// The statistic the mixture is fitted on.
    pub statistic: Vec<f32>,
    /// `S_ii`.
    pub similarity: Vec<f32>,
}

/// Fit the configured mixture on `stat` and return every pair's clean
/// posterior (the per-epoch division of vanilla, ESC and ReCon).
pub fn divide(stat: &[f32], cfg: &TrainConfig, side: CleanSide) -> Vec<f32> {
    Division::fit(stat, cfg.mixture, side).clean_prob(stat)
}

/// The NCR per-sample hinge of every pair under `net` ([`hinge_statistic`]
/// with the configured batch size, shuffles and margin), with `S_ii`.
pub fn hinge_pass(
    net: &Net,
    data: &PairInputs,
    cfg: &TrainConfig,
    rng: &mut Rng,
) -> Result<StatPass> {
    let (vi, vt) = net.embed_all(data, EMBED_CHUNK)?;
    Ok(StatPass {
        statistic: hinge_statistic(
            &vi,
            &vt,
            cfg.batch_size,
            cfg.division_shuffles,
            cfg.margin,
            rng,
        )?,
        similarity: pair_similarity(&vi, &vt)?,
    })
}

/// Similarity of each pair with itself, `S_ii`, from full-dataset embeddings.
pub fn pair_similarity(vi: &Tensor, vt: &Tensor) -> Result<Vec<f32>> {
    (vi * vt)?.sum(1)?.to_vec1()
}

/// One batch of a shuffled batching over full-dataset embeddings.
pub struct ShuffledBatch<'a> {
    /// The pairs of the batch, in batch order.
    pub idx: &'a [usize],
    /// Their image embeddings `[B, D]`.
    pub images: Tensor,
    /// Their caption embeddings `[B, D]`.
    pub texts: Tensor,
    /// The batch similarity matrix `S[i, j]` = image i against caption j.
    pub s: Tensor,
}

/// Calls `f` on every batch of `shuffles` independent shuffled batchings of
/// all pairs (drawn from `rng`), sliced from the full-dataset embeddings
/// `vi`, `vt`. Statistics that depend on the other pairs of a batch (hinge,
/// InfoNCE, `p_i`, in-batch structure) are computed this way.
pub fn for_each_shuffled_batch(
    vi: &Tensor,
    vt: &Tensor,
    batch: usize,
    shuffles: usize,
    rng: &mut Rng,
    mut f: impl FnMut(&ShuffledBatch) -> Result<()>,
) -> Result<()> {
    let all: Vec<usize> = (0..vi.dim(0)?).collect();
    for _ in 0..shuffles.max(1) {
        for b in shuffled_batches(&all, batch, rng) {
            let ids = Tensor::from_vec(
                b.iter().map(|&i| i as u32).collect::<Vec<_>>(),
                b.len(),
                vi.device(),
            )?;
            let images = vi.index_select(&ids, 0)?;
            let texts = vt.index_select(&ids, 0)?;
            let s = images.matmul(&texts.t()?)?;
            f(&ShuffledBatch {
                idx: &b,
                images,
                texts,
                s,
            })?;
        }
    }
    Ok(())
}

/// Element-wise mean of equally long vectors (statistics of co-taught
/// networks).
pub fn mean_of(vs: &[Vec<f32>]) -> Vec<f32> {
    let Some(first) = vs.first() else {
        return Vec::new();
    };
    let mut out = vec![0f32; first.len()];
    for v in vs {
        for (o, x) in out.iter_mut().zip(v) {
            *o += x;
        }
    }
    out.into_iter().map(|x| x / vs.len() as f32).collect()
}

/// A per-pair statistic of the batch similarity matrix (`stat(S)` → `[B]`),
/// computed in shuffled batches ([`for_each_shuffled_batch`]) and averaged
/// over the shuffles.
pub fn shuffled_statistic(
    vi: &Tensor,
    vt: &Tensor,
    batch: usize,
    shuffles: usize,
    rng: &mut Rng,
    stat: impl Fn(&Tensor) -> Result<Tensor>,
) -> Result<Vec<f32>> {
    let mut acc = vec![0f32; vi.dim(0)?];
    for_each_shuffled_batch(vi, vt, batch, shuffles, rng, |b| {
        for (&i, v) in b.idx.iter().zip(stat(&b.s)?.to_vec1::<f32>()?) {
            acc[i] += v;
        }
        Ok(())
    })?;
    let shuffles = shuffles.max(1) as f32;
    Ok(acc.into_iter().map(|v| v / shuffles).collect())
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
    shuffled_statistic(vi, vt, batch, shuffles, rng, |s| {
        per_sample_hinge(s, margin)
    })
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
