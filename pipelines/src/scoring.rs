//! Per-pair statistics computed over a whole dataset without gradients; the
//! same functions serve the per-epoch division and final scoring.
//!
//! Statistics that depend on the other pairs of a batch (hinge, InfoNCE,
//! `p_i`, in-batch structure) are computed in shuffled batches. During
//! training the shuffles run over all pairs ([`Shuffles::Global`]). Scoring
//! (fit's final division, its labels and `ncclean score`) is block-local
//! ([`Shuffles::Blocks`]): each shard's pairs are cut into [`ScoreBlocks`] of
//! about [`SCORE_BLOCK_PAIRS`], and each block is shuffled on its own, from a
//! stream named by its index inside its shard. A pair's score then depends on
//! its shard only, so shards scored by separate processes give exactly the
//! labels of one process scoring them all.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use candle_core::{Result, Tensor};
use ncclean_models::rng::Rng;
use ncclean_models::PairInputs;

use crate::batch_stats::{hinge, Square};
use crate::batches::shuffled_batches;
use crate::clean_model::null::NullSink;
use crate::config::TrainConfig;
use crate::division::{CleanSide, Division};
use crate::net::Net;
use crate::streams::{Streams, EMBED_CHUNK};

/// Most pairs in one scoring block (or one batch, if larger). A file of up
/// to this many pairs is one block, shuffled as a whole (as before blocks
/// existed); a larger file is cut into balanced blocks of at least half
/// this. Large, because batches drawn from a small block meet related pairs
/// more often: Flickr8k's five captions per image sit in consecutive rows,
/// and blocks of 4,096 cost vanilla 0.0008 detection AUROC (BENCHMARKS.md);
/// bounded, so a very large file need not be one unit.
pub const SCORE_BLOCK_PAIRS: usize = 65_536;

/// One block: consecutive pairs `start..start + len`, the `index`-th block of
/// its shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScoreBlock {
    /// First pair of the block.
    pub start: usize,
    /// Number of pairs.
    pub len: usize,
    /// Position of the block inside its shard (names its shuffle stream).
    pub index: usize,
}

/// How scoring cuts pairs into blocks: every shard (a run of consecutive
/// pairs) separately into `ceil(n / block)` blocks of balanced size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScoreBlocks {
    blocks: Vec<ScoreBlock>,
}

impl ScoreBlocks {
    /// Blocks of shards holding `shards[i]` consecutive pairs each, at most
    /// `max(SCORE_BLOCK_PAIRS, batch)` pairs a block.
    pub fn new(shards: &[usize], batch: usize) -> ScoreBlocks {
        let size = SCORE_BLOCK_PAIRS.max(batch);
        let mut blocks = Vec::new();
        let mut start = 0;
        for &n in shards {
            // Balanced like the batches, so no block is left with a handful
            // of pairs whose in-batch statistic would mean little.
            let k = n.div_ceil(size);
            for index in 0..k {
                let len = n / k + usize::from(index < n % k);
                blocks.push(ScoreBlock { start, len, index });
                start += len;
            }
        }
        ScoreBlocks { blocks }
    }

    /// Block `block` of a shard scored on its own: the shard's other blocks
    /// are elsewhere (a caller streaming a large file scores it a block at
    /// a time), so the one block starts at pair 0 and keeps its `index`,
    /// which names its shuffle stream.
    pub fn part(block: ScoreBlock) -> ScoreBlocks {
        ScoreBlocks {
            blocks: vec![ScoreBlock { start: 0, ..block }],
        }
    }

    /// The blocks in order.
    pub fn blocks(&self) -> &[ScoreBlock] {
        &self.blocks
    }

    /// Pairs covered.
    pub fn pairs(&self) -> usize {
        self.blocks.iter().map(|b| b.len).sum()
    }
}

/// Where the shuffled batchings of a statistic come from.
pub enum Shuffles<'a> {
    /// Training: each shuffle batches all pairs, drawn from this stream.
    Global(&'a mut Rng),
    /// Scoring: each block is batched on its own, from
    /// [`Streams::score_block`] of its index; progress goes to the ticks.
    Blocks(&'a ScoreBlocks, &'a Streams, Ticks<'a>),
}

/// Progress of a scoring pass, in pairs through one of its passes (an
/// embedding pass or one shuffled batching), reported on the thread that
/// runs the pass. Each method declares how many passes a score makes
/// ([`crate::method::Method::score_passes`]).
#[derive(Clone, Copy)]
pub struct Ticks<'a>(Option<&'a dyn Fn(usize)>);

impl<'a> Ticks<'a> {
    /// Progress nobody watches.
    pub const NONE: Ticks<'static> = Ticks(None);

    /// Progress handed to `f`.
    pub fn new(f: &'a dyn Fn(usize)) -> Ticks<'a> {
        Ticks(Some(f))
    }

    /// `pairs` more pairs went through a pass.
    pub fn add(&self, pairs: usize) {
        if let Some(f) = self.0 {
            f(pairs)
        }
    }
}

impl<'a> Shuffles<'a> {
    /// The stretches of `n` pairs that are embedded apart: all of them in
    /// training, each block on its own in scoring. Matrix products can round
    /// a row differently with the shape of the chunk it is computed in, so a
    /// block embedded in chunks of its own gets the same bits whether it is
    /// scored with the rest of its file or alone ([`ScoreBlocks::part`]).
    pub fn ranges(&self, n: usize) -> Vec<std::ops::Range<usize>> {
        match self {
            Shuffles::Global(_) => std::iter::once(0..n).collect(),
            Shuffles::Blocks(blocks, _, _) => blocks
                .blocks()
                .iter()
                .map(|b| b.start..b.start + b.len)
                .collect(),
        }
    }

    /// Where this statistic's progress goes (nowhere in training).
    pub fn ticks(&self) -> Ticks<'a> {
        match self {
            Shuffles::Global(_) => Ticks::NONE,
            Shuffles::Blocks(_, _, t) => *t,
        }
    }
}

impl<'a> From<&'a mut Rng> for Shuffles<'a> {
    fn from(rng: &'a mut Rng) -> Shuffles<'a> {
        Shuffles::Global(rng)
    }
}

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
    order: Shuffles,
) -> crate::error::Result<StatPass> {
    hinge_pass_into(net, data, cfg, order, None)
}

/// [`hinge_pass`] of the first network as a method's score pass: the
/// caption embeddings also go to the clean model's caption null
/// ([`crate::method::ScoreCtx::caption_null`]).
pub fn hinge_score_pass(ctx: &crate::method::ScoreCtx) -> crate::error::Result<StatPass> {
    hinge_pass_into(&ctx.nets[0], ctx.data, ctx.cfg, ctx.shuffles(), ctx.null)
}

fn hinge_pass_into(
    net: &Net,
    data: &PairInputs,
    cfg: &TrainConfig,
    order: Shuffles,
    null: Option<&NullSink>,
) -> crate::error::Result<StatPass> {
    let (vi, vt) = net.embed_ranges(data, &order.ranges(data.len()), EMBED_CHUNK)?;
    if let Some(sink) = null {
        sink.add(0, &vt)?;
    }
    order.ticks().add(data.len());
    Ok(StatPass {
        statistic: hinge_statistic(
            &vi,
            &vt,
            cfg.batch_size,
            cfg.division_shuffles,
            cfg.margin,
            order,
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
    /// The batch similarity matrix `S[i, j]` = image i against caption j,
    /// on the host: every statistic of it is computed there
    /// ([`crate::batch_stats`]).
    pub s: Square,
}

/// The batches of `shuffles` independent shuffled batchings of `n` pairs
/// (of all pairs, or of each block on its own: [`Shuffles`]), in order. A
/// pair sees its shuffles in order either way, so sums over them come out
/// the same. Methods that evaluate several networks on the same batches
/// draw them once here.
pub fn shuffled_batch_list(
    n: usize,
    batch: usize,
    shuffles: usize,
    order: Shuffles,
) -> Result<Vec<Vec<usize>>> {
    let mut out = Vec::new();
    let mut add = |items: &[usize], rng: &mut Rng| {
        for _ in 0..shuffles.max(1) {
            out.extend(shuffled_batches(items, batch, rng));
        }
    };
    match order {
        Shuffles::Global(rng) => add(&(0..n).collect::<Vec<_>>(), rng),
        Shuffles::Blocks(blocks, streams, _) => {
            if blocks.pairs() != n {
                return Err(candle_core::Error::Msg(format!(
                    "scoring blocks cover {} pairs, the data holds {n}",
                    blocks.pairs()
                )));
            }
            for b in blocks.blocks() {
                let items: Vec<usize> = (b.start..b.start + b.len).collect();
                add(&items, &mut streams.score_block(b.index));
            }
        }
    }
    Ok(out)
}

/// Computes `stat` on every batch of [`shuffled_batch_list`], sliced from
/// the full-dataset embeddings `vi`, `vt`, and hands each result to `add`
/// in batch order. Statistics that depend on the other pairs of a batch
/// (hinge, InfoNCE, `p_i`, in-batch structure) are computed this way.
/// Batches are independent, so `stat` runs on candle's thread pool
/// ([`par_map`]); `add` sees them in order, so sums come out as in one
/// thread.
pub fn for_each_shuffled_batch<T: Send>(
    vi: &Tensor,
    vt: &Tensor,
    batch: usize,
    shuffles: usize,
    order: Shuffles,
    stat: impl Fn(&ShuffledBatch) -> Result<T> + Sync,
    mut add: impl FnMut(&[usize], T),
) -> Result<()> {
    let ticks = order.ticks();
    let batches = shuffled_batch_list(vi.dim(0)?, batch, shuffles, order)?;
    for window in batches.chunks(PAR_WINDOW) {
        let out = par_map(window, |b| stat(&batch_of(vi, vt, b)?))?;
        for (b, t) in window.iter().zip(out) {
            add(b, t);
        }
        ticks.add(window.iter().map(Vec::len).sum());
    }
    Ok(())
}

/// Batches handed to the thread pool at a time: enough to keep every
/// thread busy, few enough that their results stay small.
pub const PAR_WINDOW: usize = 64;

/// `f` of every item, in order, computed on candle's (rayon) thread pool
/// with as many workers as candle gives its matrix products (nested
/// products then share the same workers instead of oversubscribing the
/// cores). Deterministic: each result depends on its item only.
pub fn par_map<I: Sync, T: Send>(
    items: &[I],
    f: impl Fn(&I) -> Result<T> + Sync,
) -> Result<Vec<T>> {
    let workers = candle_core::utils::get_num_threads().clamp(1, items.len().max(1));
    if workers == 1 {
        return items.iter().map(f).collect();
    }
    let next = AtomicUsize::new(0);
    let slots: Vec<Mutex<Option<Result<T>>>> = items.iter().map(|_| Mutex::new(None)).collect();
    candle_core::cpu::kernels::par_for_each(workers, |_| loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        let Some(item) = items.get(i) else { break };
        let r = f(item);
        *slots[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
    });
    slots
        .into_iter()
        .map(|m| {
            m.into_inner()
                .unwrap_or_else(|e| e.into_inner())
                .unwrap_or_else(|| Err(candle_core::Error::Msg("a worker stopped early".into())))
        })
        .collect()
}

/// The pairs `idx` of full-dataset embeddings as one [`ShuffledBatch`].
pub fn batch_of<'a>(vi: &Tensor, vt: &Tensor, idx: &'a [usize]) -> Result<ShuffledBatch<'a>> {
    let ids = Tensor::from_vec(
        idx.iter().map(|&i| i as u32).collect::<Vec<_>>(),
        idx.len(),
        vi.device(),
    )?;
    let images = vi.index_select(&ids, 0)?;
    let texts = vt.index_select(&ids, 0)?;
    let s = Square::from_tensor(&images.matmul(&texts.t()?)?)?;
    Ok(ShuffledBatch {
        idx,
        images,
        texts,
        s,
    })
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

/// A per-pair statistic of the batch similarity matrix (`stat(S)` → `B` values),
/// computed in shuffled batches ([`for_each_shuffled_batch`]) and averaged
/// over the shuffles.
pub fn shuffled_statistic(
    vi: &Tensor,
    vt: &Tensor,
    batch: usize,
    shuffles: usize,
    order: Shuffles,
    stat: impl Fn(&Square) -> Vec<f32> + Sync,
) -> Result<Vec<f32>> {
    let mut acc = vec![0f32; vi.dim(0)?];
    for_each_shuffled_batch(
        vi,
        vt,
        batch,
        shuffles,
        order,
        |b| Ok(stat(&b.s)),
        |idx, vals| {
            for (&i, v) in idx.iter().zip(vals) {
                acc[i] += v;
            }
        },
    )?;
    let shuffles = shuffles.max(1) as f32;
    Ok(acc.into_iter().map(|v| v / shuffles).collect())
}

/// The NCR per-sample hinge of every pair, computed in shuffled batches of
/// `batch` (it depends on the other pairs in the batch) and averaged over
/// `shuffles` independent shuffles ([`Shuffles`]).
pub fn hinge_statistic(
    vi: &Tensor,
    vt: &Tensor,
    batch: usize,
    shuffles: usize,
    margin: f64,
    order: Shuffles,
) -> Result<Vec<f32>> {
    shuffled_statistic(vi, vt, batch, shuffles, order, |s| hinge(s, margin))
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
        let l = hinge_statistic(&vi, &vt, 4, 2, 0.2, (&mut rng).into())?;
        let worst = l.iter().cloned().fold(f32::MIN, f32::max);
        assert_eq!(worst, l[3], "{l:?}");
        assert_eq!(pair_similarity(&vi, &vt)?, vec![1.0, 1.0, 1.0, 0.0]);
        Ok(())
    }

    #[test]
    fn blocks_split_each_shard_in_balanced_blocks() {
        let size = SCORE_BLOCK_PAIRS;
        let b = ScoreBlocks::new(&[size + 2, 3, 0, size], 128);
        let lens: Vec<(usize, usize, usize)> = b
            .blocks()
            .iter()
            .map(|b| (b.start, b.len, b.index))
            .collect();
        let half = (size + 2) / 2;
        assert_eq!(
            lens,
            vec![
                (0, half, 0),
                (half, half, 1),
                (size + 2, 3, 0),
                (size + 5, size, 0)
            ]
        );
        assert_eq!(b.pairs(), 2 * size + 5);
        // A batch larger than the block size widens the blocks.
        assert_eq!(ScoreBlocks::new(&[size + 1], size + 1).blocks().len(), 1);
    }

    #[test]
    fn block_statistic_depends_on_the_shard_only() -> Result<()> {
        // Two shards scored together give each pair exactly the statistic
        // it gets when its shard is scored alone.
        let dev = Device::Cpu;
        let n1 = SCORE_BLOCK_PAIRS + 7;
        let n2 = 300;
        // Two blocks in the first shard.
        assert_eq!(ScoreBlocks::new(&[n1], 64).blocks().len(), 2);
        let mut r = Rng::new(3);
        let mut vals = |n: usize| -> Vec<f32> { (0..n * 4).map(|_| r.normal() as f32).collect() };
        let (a, b) = (vals(n1 + n2), vals(n1 + n2));
        let vi = Tensor::from_vec(a.clone(), (n1 + n2, 4), &dev)?;
        let vt = Tensor::from_vec(b.clone(), (n1 + n2, 4), &dev)?;
        let streams = Streams::new(11, "vanilla");
        let both = ScoreBlocks::new(&[n1, n2], 64);
        let all = hinge_statistic(
            &vi,
            &vt,
            64,
            2,
            0.2,
            Shuffles::Blocks(&both, &streams, Ticks::NONE),
        )?;
        let second = ScoreBlocks::new(&[n2], 64);
        let (vi2, vt2) = (vi.narrow(0, n1, n2)?, vt.narrow(0, n1, n2)?);
        let alone = hinge_statistic(
            &vi2,
            &vt2,
            64,
            2,
            0.2,
            Shuffles::Blocks(&second, &streams, Ticks::NONE),
        )?;
        assert_eq!(&all[n1..], &alone[..]);
        // One block is the plain scoring stream: small data scores as before.
        let one = ScoreBlocks::new(&[n2], 64);
        let blocked = hinge_statistic(
            &vi2,
            &vt2,
            64,
            2,
            0.2,
            Shuffles::Blocks(&one, &streams, Ticks::NONE),
        )?;
        let global = hinge_statistic(&vi2, &vt2, 64, 2, 0.2, (&mut streams.score()).into())?;
        assert_eq!(blocked, global);
        let wrong = ScoreBlocks::new(&[n2 - 1], 64);
        assert!(hinge_statistic(
            &vi2,
            &vt2,
            64,
            2,
            0.2,
            Shuffles::Blocks(&wrong, &streams, Ticks::NONE)
        )
        .is_err());
        Ok(())
    }
}
