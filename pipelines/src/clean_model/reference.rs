//! The neighbourhood score: how well a caption agrees with the captions of
//! the reference images that look most like the pair's image (LEMoN,
//! ICML 2025, scores a pair by its caption against its image's nearest
//! neighbours' captions in the same spirit).
//!
//! The reference is a fixed set of the training images (pooled frozen
//! image features) with the mean of their captions' pooled features, each
//! caption weighted by the method's clean probability at the end of
//! training, so captions the method called mismatched barely count. It is
//! kept in the checkpoint: a pair's score depends on the pair and the
//! reference alone, never on the other pairs scored with it.
//!
//! An image that is the query image itself (pooled cosine at least
//! [`SAME_IMAGE`]) is never its own neighbour: a training pair would
//! otherwise be compared with its image's other captions, which a new
//! image does not have, and its score would not transfer.

use candle_core::{DType, Device, Tensor};

use super::ridge::Ridge;
use crate::error::Result;
use ncclean_models::inputs::distinct_rows;
use ncclean_models::packed_linear::PackedLinear;

use crate::scoring::par_map;

/// Pooled image cosine from which two images count as the same image.
pub const SAME_IMAGE: f32 = 0.9999;

/// Weight every reference image keeps whatever its captions' clean
/// probabilities: with all neighbours' captions called noisy, their mean
/// still counts.
const WEIGHT_FLOOR: f32 = 1e-3;

/// Queries scored per matrix product (rows of a `[chunk, images]` block).
const CHUNK: usize = 1024;

/// The reference images and their captions.
#[derive(Debug, Clone, PartialEq)]
pub struct Reference {
    /// Unit image features, `images × image_dim`, row-major.
    pub images: Vec<f32>,
    /// Weighted mean of each image's unit caption features, `images ×
    /// text_dim` (not renormalised: its dot product with a unit caption is
    /// the weighted mean cosine).
    pub captions: Vec<f32>,
    /// Clean weight of each image: the sum of its captions' weights.
    pub weights: Vec<f32>,
    /// Width of the image features.
    pub image_dim: usize,
    /// Width of the caption features.
    pub text_dim: usize,
    /// `image_dim × width` map onto the reference images' principal
    /// subspace ([`Reference::compress`]); empty: `images` are the features
    /// themselves. Rows of `images` are then projected and unit again.
    pub projection: Vec<f32>,
}

/// Width the image features are compressed to for the neighbour search:
/// finding look-alikes is one product of every query with every reference
/// image, 1,280 wide for MobileNetV2, which made scoring 15× slower.
pub const SEARCH_DIM: usize = 128;

/// Subspace iterations of [`principal_subspace`].
const SUBSPACE_ITERATIONS: usize = 8;

impl Reference {
    /// Build from pairs: `images[i]`/`texts[i]` are pair i's unit features
    /// (rows of `image_dim`/`text_dim`), `image_of[i]` its distinct image,
    /// `weight[i]` its caption's weight; `keep` lists the distinct images
    /// to keep, in order.
    pub fn build(
        images: &[f32],
        texts: &[f32],
        image_of: &[u32],
        weight: &[f32],
        keep: &[u32],
        dims: (usize, usize),
    ) -> Reference {
        let (di, dt) = dims;
        let distinct = image_of.iter().map(|&g| g as usize + 1).max().unwrap_or(0);
        let mut slot = vec![usize::MAX; distinct];
        for (s, &g) in keep.iter().enumerate() {
            slot[g as usize] = s;
        }
        let r = keep.len();
        let mut out = Reference {
            images: vec![0.0; r * di],
            captions: vec![0.0; r * dt],
            weights: vec![0.0; r],
            image_dim: di,
            text_dim: dt,
            projection: Vec::new(),
        };
        let mut seen = vec![false; r];
        let mut mass = vec![0.0f32; r];
        for (i, &g) in image_of.iter().enumerate() {
            let s = slot[g as usize];
            if s == usize::MAX {
                continue;
            }
            if !seen[s] {
                out.images[s * di..(s + 1) * di].copy_from_slice(&images[i * di..(i + 1) * di]);
                seen[s] = true;
            }
            let w = if weight[i].is_finite() {
                weight[i].clamp(0.0, 1.0)
            } else {
                0.0
            };
            out.weights[s] += w;
            // The floor keeps a mean for an image whose captions all
            // weigh 0.
            let cw = w + WEIGHT_FLOOR;
            mass[s] += cw;
            for (c, t) in out.captions[s * dt..(s + 1) * dt]
                .iter_mut()
                .zip(&texts[i * dt..(i + 1) * dt])
            {
                *c += cw * t;
            }
        }
        for (row, &m) in out.captions.chunks_mut(dt.max(1)).zip(&mass) {
            if m > 0.0 {
                row.iter_mut().for_each(|c| *c /= m);
            }
        }
        out
    }

    /// Width of the rows of `images`: the search space's.
    pub fn width(&self) -> usize {
        if self.projection.is_empty() {
            self.image_dim
        } else {
            self.projection.len() / self.image_dim.max(1)
        }
    }

    /// The same reference searched in the `dim`-wide principal subspace
    /// of its images (uncentred, so dot products are what it keeps best),
    /// each image projected and made unit again; unchanged when the
    /// features are no wider than `dim`.
    pub fn compress(mut self, dim: usize) -> Result<Reference> {
        let (r, di) = (self.len(), self.image_dim);
        if di <= dim || r == 0 || !self.projection.is_empty() {
            return Ok(self);
        }
        let x = Tensor::from_slice(&self.images, (r, di), &Device::Cpu)?;
        let q = principal_subspace(&x, dim)?;
        self.images = unit_rows(&x.matmul(&q)?)?.flatten_all()?.to_vec1()?;
        self.projection = q.flatten_all()?.to_vec1()?;
        Ok(self)
    }

    /// Queries `[n, image_dim]` in the search space: projected and unit.
    fn search_space(&self, images: &Tensor) -> Result<Tensor> {
        let images = images.to_dtype(DType::F32)?;
        if self.projection.is_empty() {
            return Ok(images);
        }
        let q = Tensor::from_slice(
            &self.projection,
            (self.image_dim, self.width()),
            images.device(),
        )?;
        unit_rows(&images.matmul(&q)?)
    }

    /// Number of reference images.
    pub fn len(&self) -> usize {
        self.weights.len()
    }

    /// True without reference images.
    pub fn is_empty(&self) -> bool {
        self.weights.is_empty()
    }

    /// The neighbourhood score of each query pair: over the `k` reference
    /// images most like its image (the image itself excluded), the mean
    /// cosine of its caption with their captions, weighted by their clean
    /// weights. `images` `[n, image_dim]` and `texts` `[n, text_dim]` are
    /// unit features on any device; NaN when no reference image is left.
    ///
    /// On the CPU the queries are cut into `PIECE`-row pieces of the
    /// `CHUNK`-row chunks, each searched and scored on its own on the
    /// thread pool ([`par_map`]); each cosine is one chain of fused
    /// multiply-adds ([`PackedLinear`]), the same bits whatever the rows
    /// around it and on any x86-64 CPU with AVX2 and FMA, so a pair's
    /// score does not depend on the other pairs scored with it.
    pub fn score(&self, images: &Tensor, texts: &Tensor, k: usize) -> Result<Vec<f32>> {
        Ok(self.signals(images, texts, k, None)?.0)
    }

    /// The neighbourhood score ([`Reference::score`]) and, with a ridge
    /// map, the ridge signal ([`Ridge::scores`]) of each query pair, the
    /// images projected into the search space once for both; the ridge
    /// signals are empty without a map, NaN without reference images.
    pub fn signals(
        &self,
        images: &Tensor,
        texts: &Tensor,
        k: usize,
        ridge: Option<&Ridge>,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let n = images.dim(0)?;
        let r = self.len();
        if r == 0 || n == 0 {
            let ridge = ridge.map(|_| vec![f32::NAN; n]).unwrap_or_default();
            return Ok((vec![f32::NAN; n], ridge));
        }
        let images = self.search_space(images)?;
        let captions: Vec<f32> = texts
            .to_dtype(DType::F32)?
            .to_device(&Device::Cpu)?
            .flatten_all()?
            .to_vec1()?;
        // The projected queries as host rows, once for both signals (the
        // search on an accelerator reads them from the device).
        let queries: Vec<f32> = images.to_device(&Device::Cpu)?.flatten_all()?.to_vec1()?;
        let ridge = match ridge {
            Some(m) => m.scores(&queries, &captions)?,
            None => Vec::new(),
        };
        Ok((self.neighbourhood(&images, &queries, &captions, k)?, ridge))
    }

    /// Unit image features `[n, image_dim]` (any device) in the search
    /// space, as host rows `[n, width]`.
    pub fn search_rows(&self, images: &Tensor) -> Result<Vec<f32>> {
        Ok(self
            .search_space(images)?
            .to_device(&Device::Cpu)?
            .flatten_all()?
            .to_vec1()?)
    }

    /// [`Reference::score`] of queries already in the search space
    /// (`images`, and the same as host rows `queries`), with their unit
    /// caption features as host rows.
    fn neighbourhood(
        &self,
        images: &Tensor,
        queries: &[f32],
        captions: &[f32],
        k: usize,
    ) -> Result<Vec<f32>> {
        let n = images.dim(0)?;
        let device = images.device().clone();
        let r = self.len();
        let dt = self.text_dim;
        // The queries of rows `p` against every reference image, then each
        // query's look-alikes and caption agreement.
        let finish = |p: &std::ops::Range<usize>, look: &[f32]| -> Vec<f32> {
            let mut search = Search::new(k);
            look.chunks(r)
                .enumerate()
                .map(|(row, look)| {
                    let q = p.start + row;
                    self.one(&mut search, look, &captions[q * dt..(q + 1) * dt])
                })
                .collect()
        };
        if device.is_cpu() {
            // The reference images packed once for this call; each piece's
            // cosines are one chain of multiply-adds per entry
            // ([`PackedLinear`]), the same bits whatever rows surround it.
            let w = self.width();
            let packed = PackedLinear::new(&self.images, r, w);
            // A query's look-alikes depend on its image alone: where images
            // repeat (five captions an image, or the random pairings `fit`
            // draws among a few hundred held-out images) each distinct one
            // is searched once and its list shared by its captions. The
            // search gives a row the same list whatever rows are searched
            // with it, so the scores are those of searching every row.
            let (first, of) = distinct_rows(queries, w, |_| None);
            if first.len() == n {
                let parts = par_map(&pieces(n, r), |p| {
                    let mut look = vec![0f32; p.len() * r];
                    packed.accumulate(&mut look, &queries[p.start * w..p.end * w]);
                    Ok(finish(p, &look))
                })?;
                return Ok(parts.concat());
            }
            let distinct: Vec<f32> = first
                .iter()
                .flat_map(|&i| &queries[i * w..(i + 1) * w])
                .copied()
                .collect();
            let lists = par_map(&pieces(first.len(), r), |p| {
                let mut look = vec![0f32; p.len() * r];
                packed.accumulate(&mut look, &distinct[p.start * w..p.end * w]);
                let mut search = Search::new(k);
                Ok(look
                    .chunks(r)
                    .map(|look| {
                        search.nearest(look);
                        search.best.clone()
                    })
                    .collect::<Vec<_>>())
            })?
            .concat();
            let parts = par_map(&pieces(n, 0), |p| {
                let mut agree = Vec::with_capacity(k);
                Ok(p.clone()
                    .map(|q| {
                        let best = &lists[of[q] as usize];
                        self.agreement(best, &mut agree, &captions[q * dt..(q + 1) * dt])
                    })
                    .collect::<Vec<f32>>())
            })?;
            return Ok(parts.concat());
        }
        // One product per chunk on an accelerator, read back whole.
        let ref_t = Tensor::from_slice(&self.images, (r, self.width()), &device)?
            .t()?
            .contiguous()?;
        let mut out = Vec::with_capacity(n);
        for start in (0..n).step_by(CHUNK) {
            let p = start..(start + CHUNK).min(n);
            let look = images.narrow(0, p.start, p.len())?.matmul(&ref_t)?;
            let look = look.to_device(&Device::Cpu)?;
            with_host_rows(&look, |look| out.extend(finish(&p, look)))?;
        }
        Ok(out)
    }

    /// One query: `look[r]` its image's cosine with reference image r,
    /// `caption` its unit caption feature.
    fn one(&self, search: &mut Search, look: &[f32], caption: &[f32]) -> f32 {
        search.nearest(look);
        let Search { best, agree, .. } = search;
        self.agreement(best, agree, caption)
    }

    /// The weighted mean agreement of `caption` with the captions of the
    /// reference images `best` (`agree` a buffer); NaN with none.
    fn agreement(&self, best: &[(f32, usize)], agree: &mut Vec<f32>, caption: &[f32]) -> f32 {
        let dt = self.text_dim;
        // Each neighbour's agreement is the plain f32 sum of `a * b` in
        // order (what `Iterator::sum` computes). The neighbours go in
        // groups of `AGREE_GROUP`, whose sums are interleaved so that they
        // do not wait on each other and stay in registers, each group's
        // rows read front to back (all the neighbours at once left the
        // sums in memory and read 20 rows in step: 17% of a default score).
        let rows: Vec<&[f32]> = best
            .iter()
            .map(|&(_, r)| &self.captions[r * dt..(r + 1) * dt])
            .collect();
        agree.clear();
        for group in rows.chunks(AGREE_GROUP) {
            // A short last group is filled with the caption itself (its
            // sums are dropped).
            let block: [&[f32]; AGREE_GROUP] =
                std::array::from_fn(|g| group.get(g).copied().unwrap_or(caption));
            agree.extend_from_slice(&agreements(caption, block)[..group.len()]);
        }
        let (mut sum, mut total) = (0.0f64, 0.0f64);
        for (&(_, r), &agree) in best.iter().zip(agree.iter()) {
            let w = f64::from(self.weights[r].max(0.0) + WEIGHT_FLOOR);
            sum += w * f64::from(agree);
            total += w;
        }
        if total > 0.0 {
            (sum / total) as f32
        } else {
            f32::NAN
        }
    }
}

/// Neighbours whose caption agreements are summed side by side
/// ([`Reference::one`]).
const AGREE_GROUP: usize = 8;

/// Each row's plain f32 sum of `caption[d] * row[d]` in order of `d`
/// (what `Iterator::sum` of the products computes), the rows' sums
/// interleaved in registers. Rows are at least as long as `caption`.
fn agreements<const G: usize>(caption: &[f32], rows: [&[f32]; G]) -> [f32; G] {
    let rows = rows.map(|r| &r[..caption.len()]);
    let mut acc = [-0.0f32; G];
    for (d, &a) in caption.iter().enumerate() {
        for g in 0..G {
            acc[g] += a * rows[g][d];
        }
    }
    acc
}

/// Query rows searched per task on the thread pool.
const PIECE: usize = 64;

/// The pieces of `n` queries against `r` reference images: the
/// [`CHUNK`]-row chunks from query 0, each cut into pieces of [`PIECE`] rows
/// (a last piece of one row joins the one before; with at most 256
/// reference images the chunks are not cut). The packed kernel gives an
/// entry the same bits whatever rows surround it, so the cut changes no
/// score; it dates from `gemm`, whose one-row and tiny-product paths sum
/// in another order, and still sets how work is shared on CPUs without
/// AVX2 and FMA, where `gemm` computes the products.
fn pieces(n: usize, r: usize) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    for start in (0..n).step_by(CHUNK) {
        let end = (start + CHUNK).min(n);
        if r <= 256 {
            out.push(start..end);
            continue;
        }
        let mut s = start;
        while s < end {
            let mut e = (s + PIECE).min(end);
            if end - e == 1 {
                e = end;
            }
            out.push(s..e);
            s = e;
        }
    }
    out
}

/// `f` of the rows of a host f32 matrix, read in place where the tensor
/// is a contiguous one (else copied once).
fn with_host_rows(t: &Tensor, f: impl FnOnce(&[f32])) -> candle_core::Result<()> {
    {
        let (storage, layout) = t.storage_and_layout();
        if let (candle_core::Storage::Cpu(candle_core::CpuStorage::F32(v)), Some((a, b))) =
            (&*storage, layout.contiguous_offsets())
        {
            f(&v[a..b]);
            return Ok(());
        }
    }
    f(&t.flatten_all()?.to_vec1::<f32>()?);
    Ok(())
}

/// The k nearest reference images of one query at a time, with the
/// buffers reused from query to query.
struct Search {
    k: usize,
    best: Vec<(f32, usize)>,
    agree: Vec<f32>,
}

/// Cosines tested at once against the k-th best before looking at each.
const LANES: usize = 16;

impl Search {
    fn new(k: usize) -> Search {
        Search {
            k,
            best: Vec::with_capacity(k + 1),
            agree: Vec::with_capacity(k),
        }
    }

    /// The k most similar images other than the query's own (cosine at
    /// least [`SAME_IMAGE`]; NaN is never a neighbour either), most similar
    /// first, ties to the lower index: one pass keeping a sorted short
    /// list. Once the list is full, a block of [`LANES`] cosines none of
    /// which beats its last is passed over whole (one vector compare);
    /// the list is the same as looking at each.
    fn nearest(&mut self, look: &[f32]) {
        let (k, best) = (self.k, &mut self.best);
        best.clear();
        let consider = |best: &mut Vec<(f32, usize)>, r: usize, c: f32| {
            if c.is_nan() || c >= SAME_IMAGE {
                return;
            }
            if best.len() == k && best.last().is_some_and(|&(w, _)| c <= w) {
                return;
            }
            let at = best.partition_point(|&(w, _)| w >= c);
            best.insert(at, (c, r));
            best.truncate(k);
        };
        let blocks = look.chunks_exact(LANES);
        let tail = blocks.remainder();
        for (b, block) in blocks.enumerate() {
            if k > 0 && best.len() == k {
                let floor = best[k - 1].0;
                // NaN compares false: never a reason to look.
                let mut any = false;
                for &c in block {
                    any |= c > floor;
                }
                if !any {
                    continue;
                }
            }
            for (j, &c) in block.iter().enumerate() {
                consider(best, b * LANES + j, c);
            }
        }
        let base = look.len() - tail.len();
        for (j, &c) in tail.iter().enumerate() {
            consider(best, base + j, c);
        }
    }
}

/// Rows of `x` scaled to unit length (zero rows stay zero).
fn unit_rows(x: &Tensor) -> Result<Tensor> {
    let norm = x.sqr()?.sum_keepdim(1)?.sqrt()?.clamp(1e-12, f64::MAX)?;
    Ok(x.broadcast_div(&norm)?)
}

/// An orthonormal basis `[cols, dim]` of the top-`dim` right singular
/// subspace of `x` `[rows, cols]`, by subspace iteration from a fixed
/// start (the same data gives the same basis).
fn principal_subspace(x: &Tensor, dim: usize) -> Result<Tensor> {
    let cols = x.dim(1)?;
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let start: Vec<f32> = (0..cols * dim)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect();
    let mut q = orthonormal_columns(start, cols, dim);
    for _ in 0..SUBSPACE_ITERATIONS {
        let qt = Tensor::from_slice(&q, (cols, dim), x.device())?;
        let z = x.t()?.matmul(&x.matmul(&qt)?)?;
        q = orthonormal_columns(z.flatten_all()?.to_vec1()?, cols, dim);
    }
    Ok(Tensor::from_slice(&q, (cols, dim), x.device())?)
}

/// Modified Gram–Schmidt on the columns of a row-major `[rows, cols]`
/// matrix (f64 inside); a column with nothing left becomes zero.
fn orthonormal_columns(m: Vec<f32>, rows: usize, cols: usize) -> Vec<f32> {
    let mut c: Vec<Vec<f64>> = (0..cols)
        .map(|j| (0..rows).map(|i| f64::from(m[i * cols + j])).collect())
        .collect();
    for j in 0..cols {
        for k in 0..j {
            let d: f64 = c[j].iter().zip(&c[k]).map(|(a, b)| a * b).sum();
            let (head, tail) = c.split_at_mut(j);
            tail[0]
                .iter_mut()
                .zip(&head[k])
                .for_each(|(a, b)| *a -= d * b);
        }
        let n = c[j].iter().map(|a| a * a).sum::<f64>().sqrt();
        let scale = if n > 1e-12 { 1.0 / n } else { 0.0 };
        c[j].iter_mut().for_each(|a| *a *= scale);
    }
    let mut out = vec![0.0f32; rows * cols];
    for (j, col) in c.iter().enumerate() {
        for (i, v) in col.iter().enumerate() {
            out[i * cols + j] = *v as f32;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use ncclean_models::rng::Rng;

    fn unit(v: &[f32]) -> Vec<f32> {
        let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        v.iter().map(|x| x / n).collect()
    }

    #[test]
    fn compression_keeps_images_that_lie_in_few_directions_exact() -> Result<()> {
        // Six unit images in 8 dimensions spanning only the first 3: the
        // 3-wide principal subspace holds them whole, so every cosine, and
        // so every query's neighbours and score, is as before.
        let dirs = [
            [1.0, 0.0, 0.0],
            [0.6, 0.8, 0.0],
            [0.0, 0.6, 0.8],
            [0.0, 0.0, 1.0],
            [0.8, 0.0, 0.6],
            [0.0, 1.0, 0.0],
        ];
        let images: Vec<f32> = dirs
            .iter()
            .flat_map(|d| [d[0], d[1], d[2], 0.0, 0.0, 0.0, 0.0, 0.0])
            .collect();
        let texts: Vec<f32> = dirs.iter().flat_map(|d| [d[0], d[1]]).collect();
        let of: Vec<u32> = (0..6).collect();
        let full = Reference::build(&images, &texts, &of, &[1.0; 6], &of, (8, 2));
        let small = full.clone().compress(3)?;
        assert_eq!((small.width(), small.projection.len()), (3, 24));
        let dev = Device::Cpu;
        let q: Vec<f32> = [0.7f32, 0.7, 0.14, 0.0, 0.0, 0.0, 0.0, 0.0].to_vec();
        let qi = unit_rows(&Tensor::from_slice(&q, (1, 8), &dev)?)?;
        let qt = Tensor::from_slice(&[0.6f32, 0.8], (1, 2), &dev)?;
        for k in [1, 2, 4] {
            let (a, b) = (full.score(&qi, &qt, k)?[0], small.score(&qi, &qt, k)?[0]);
            assert!((a - b).abs() < 1e-5, "k {k}: {a} vs {b}");
        }
        // The basis is orthonormal.
        let p = Tensor::from_slice(&small.projection, (8, 3), &dev)?;
        let g: Vec<Vec<f32>> = p.t()?.matmul(&p)?.to_vec2()?;
        for (i, row) in g.iter().enumerate() {
            for (j, v) in row.iter().enumerate() {
                assert!((v - f32::from(u8::from(i == j))).abs() < 1e-5, "{g:?}");
            }
        }
        // Features no wider than the search space stay as they are.
        assert_eq!(full.clone().compress(8)?, full);
        Ok(())
    }

    /// The search as it was before pieces and the thread pool: one product
    /// per chunk of 1,024 queries read back whole, a sorted short list per
    /// query, each agreement an `Iterator::sum`.
    fn score_one_chunk_at_a_time(
        r: &Reference,
        images: &Tensor,
        texts: &Tensor,
        k: usize,
    ) -> Vec<f32> {
        let n = images.dim(0).unwrap();
        let images: Vec<f32> = r
            .search_space(images)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let captions: Vec<f32> = texts.flatten_all().unwrap().to_vec1().unwrap();
        let (dt, w) = (r.text_dim, r.width());
        let mut out = Vec::new();
        for start in (0..n).step_by(CHUNK) {
            let len = CHUNK.min(n - start);
            // Each cosine as one chain of fused multiply-adds over the
            // features in order, from 0: what the CPU kernel computes.
            let mut look = Vec::with_capacity(len * r.len());
            for q in start..start + len {
                let query = &images[q * w..(q + 1) * w];
                for image in r.images.chunks(w) {
                    look.push(
                        query
                            .iter()
                            .zip(image)
                            .fold(0f32, |acc, (a, b)| a.mul_add(*b, acc)),
                    );
                }
            }
            for (row, look) in look.chunks(r.len()).enumerate() {
                let q = start + row;
                let caption = &captions[q * dt..(q + 1) * dt];
                let mut best: Vec<(f32, usize)> = Vec::new();
                for (i, &c) in look.iter().enumerate() {
                    if c.is_nan() || c >= SAME_IMAGE {
                        continue;
                    }
                    if best.len() == k && best.last().is_some_and(|&(w, _)| c <= w) {
                        continue;
                    }
                    let at = best.partition_point(|&(w, _)| w >= c);
                    best.insert(at, (c, i));
                    best.truncate(k);
                }
                let (mut sum, mut total) = (0.0f64, 0.0f64);
                for &(_, i) in &best {
                    let w = f64::from(r.weights[i].max(0.0) + WEIGHT_FLOOR);
                    let mean = &r.captions[i * dt..(i + 1) * dt];
                    let agree: f32 = caption.iter().zip(mean).map(|(a, b)| a * b).sum();
                    sum += w * f64::from(agree);
                    total += w;
                }
                out.push(if total > 0.0 {
                    (sum / total) as f32
                } else {
                    f32::NAN
                });
            }
        }
        out
    }

    #[test]
    fn pieces_on_the_thread_pool_give_the_scores_of_whole_chunks() -> Result<()> {
        // 600 reference images of 24-d features compressed to 8 (so the
        // chunks are cut into pieces), queries that include reference
        // images themselves, ties (repeated images) and a NaN row; 1,089
        // queries: a chunk of 1,024 and one of 65, whose pieces are 64 rows
        // and 1 row joined to them. Equal to the bit.
        let mut rng = ncclean_models::rng::Rng::new(5);
        let (di, dt, refs, n) = (24, 12, 600, 1089);
        let mut normal = |m: usize| -> Vec<f32> { (0..m).map(|_| rng.normal() as f32).collect() };
        let units = |v: Vec<f32>, d: usize| -> Vec<f32> { v.chunks(d).flat_map(unit).collect() };
        let mut images = units(normal(refs * di), di);
        images.copy_within(..di, di);
        let texts = units(normal(refs * dt), dt);
        let of: Vec<u32> = (0..refs as u32).collect();
        let weights: Vec<f32> = normal(refs).iter().map(|x| x.abs().min(1.0)).collect();
        let full = Reference::build(&images, &texts, &of, &weights, &of, (di, dt));
        let small = full.clone().compress(8)?;
        let mut qi = units(normal(n * di), di);
        qi[..refs * di].copy_from_slice(&images);
        qi[5 * di] = f32::NAN;
        let qt = units(normal(n * dt), dt);
        let dev = Device::Cpu;
        let qi = Tensor::from_slice(&qi, (n, di), &dev)?;
        let qt = Tensor::from_slice(&qt, (n, dt), &dev)?;
        assert_eq!(pieces(n, 600).len(), 16 + 1);
        for r in [&full, &small] {
            for k in [0, 1, 20] {
                let (a, b) = (
                    r.score(&qi, &qt, k)?,
                    score_one_chunk_at_a_time(r, &qi, &qt, k),
                );
                assert_eq!(a.len(), n);
                for (i, (x, y)) in a.iter().zip(&b).enumerate() {
                    assert!(x.to_bits() == y.to_bits(), "k {k}, query {i}: {x} vs {y}");
                }
            }
        }
        Ok(())
    }

    #[test]
    fn repeated_images_are_searched_once_with_every_rows_score() -> Result<()> {
        // 1,500 queries showing 70 distinct images (each with captions of
        // its own), one of them a reference image itself and one all NaN,
        // against 600 reference images: the shared search gives each row
        // the score of searching it alone, to the bit, in any order.
        let mut rng = ncclean_models::rng::Rng::new(9);
        let (di, dt, refs, n, shown) = (24, 12, 600, 1500, 70);
        let mut normal = |m: usize| -> Vec<f32> { (0..m).map(|_| rng.normal() as f32).collect() };
        let units = |v: Vec<f32>, d: usize| -> Vec<f32> { v.chunks(d).flat_map(unit).collect() };
        let images = units(normal(refs * di), di);
        let texts = units(normal(refs * dt), dt);
        let of: Vec<u32> = (0..refs as u32).collect();
        let weights: Vec<f32> = normal(refs).iter().map(|x| x.abs().min(1.0)).collect();
        let full = Reference::build(&images, &texts, &of, &weights, &of, (di, dt));
        let small = full.clone().compress(8)?;
        let mut distinct = units(normal(shown * di), di);
        distinct[..di].copy_from_slice(&images[3 * di..4 * di]);
        distinct[di..2 * di].fill(f32::NAN);
        let which: Vec<usize> = normal(n)
            .iter()
            .map(|x| ((x.abs() * 1000.0) as usize) % shown)
            .collect();
        let qi: Vec<f32> = which
            .iter()
            .flat_map(|&g| &distinct[g * di..(g + 1) * di])
            .copied()
            .collect();
        let qt = units(normal(n * dt), dt);
        let dev = Device::Cpu;
        let qi = Tensor::from_slice(&qi, (n, di), &dev)?;
        let qt = Tensor::from_slice(&qt, (n, dt), &dev)?;
        for r in [&full, &small] {
            for k in [0, 1, 20] {
                let (a, b) = (
                    r.score(&qi, &qt, k)?,
                    score_one_chunk_at_a_time(r, &qi, &qt, k),
                );
                assert_eq!(a.len(), n);
                for (i, (x, y)) in a.iter().zip(&b).enumerate() {
                    assert!(x.to_bits() == y.to_bits(), "k {k}, query {i}: {x} vs {y}");
                }
                // The NaN image has no neighbour; the others have k.
                let nan = which.iter().position(|&g| g == 1).expect("shown");
                assert!(a[nan].is_nan());
                // Alone, a row scores what it scored among the others.
                for q in [0, 1, nan, n - 1] {
                    let one = r.score(&qi.narrow(0, q, 1)?, &qt.narrow(0, q, 1)?, k)?;
                    assert_eq!(one[0].to_bits(), a[q].to_bits(), "k {k}, query {q}");
                }
            }
        }
        Ok(())
    }

    #[test]
    fn agreements_are_each_rows_plain_sum_bit_for_bit() {
        // Each of 8 rows' sum, side by side, is the in-order sum of the
        // products, bit for bit (rows longer than the caption are cut).
        let mut rng = Rng::new(3);
        let mut v = |n: usize| -> Vec<f32> {
            (0..n)
                .map(|_| rng.below(2001) as f32 / 1000.0 - 1.0)
                .collect()
        };
        let caption = v(37);
        let rows: Vec<Vec<f32>> = (0..8).map(|i| v(37 + i)).collect();
        let got = agreements(&caption, std::array::from_fn::<_, 8, _>(|g| &rows[g][..]));
        for (g, row) in rows.iter().enumerate() {
            let want: f32 = caption.iter().zip(row).map(|(a, b)| a * b).sum();
            assert_eq!(got[g].to_bits(), want.to_bits(), "row {g}");
        }
    }

    #[test]
    fn nearest_passes_over_blocks_without_changing_the_list() {
        // Cosines with ties (a grid of 41 values), NaNs, the query's own
        // image (at least SAME_IMAGE) and signed zeros; every k from none
        // to more than there are: passing over blocks that cannot enter
        // gives the list that looking at each in turn and inserting it
        // does (the first k eligible cosines, most similar first, ties to
        // the lower index).
        let mut rng = Rng::new(7);
        for len in [0usize, 1, 15, 16, 17, 100, 1000, 8192] {
            let look: Vec<f32> = (0..len)
                .map(|_| match rng.below(50) {
                    0 => f32::NAN,
                    1 => 1.0,
                    2 => -0.0,
                    3 => 0.0,
                    _ => (rng.below(41) as f32 - 20.0) / 20.0,
                })
                .collect();
            for k in [0usize, 1, 5, 20, 63, 64, 65, 200, 2000] {
                // Each eligible cosine in turn, inserted after those at
                // least as similar, the list cut to k.
                let mut want: Vec<(f32, usize)> = Vec::new();
                for (r, &c) in look.iter().enumerate() {
                    if c.is_nan() || c >= SAME_IMAGE {
                        continue;
                    }
                    let at = want.partition_point(|&(w, _)| w >= c);
                    want.insert(at, (c, r));
                    want.truncate(k);
                }
                let mut search = Search::new(k);
                search.nearest(&look);
                let got: Vec<(u32, usize)> =
                    search.best.iter().map(|&(c, r)| (c.to_bits(), r)).collect();
                let want: Vec<(u32, usize)> = want.iter().map(|&(c, r)| (c.to_bits(), r)).collect();
                assert_eq!(got, want, "len {len}, k {k}");
            }
        }
    }

    #[test]
    fn pieces_never_leave_one_row_alone_unless_the_chunk_is_one_row() {
        for n in [1, 2, 64, 65, 129, 1024, 1025, 1089, 3000] {
            let p = pieces(n, 1000);
            assert_eq!(p.iter().map(|r| r.len()).sum::<usize>(), n);
            assert!(p.windows(2).all(|w| w[0].end == w[1].start));
            for r in &p {
                let chunk_len = CHUNK.min(n - r.start / CHUNK * CHUNK);
                assert!(r.len() > 1 || chunk_len == 1, "n {n}: {r:?}");
                assert_eq!(r.start / CHUNK, (r.end - 1) / CHUNK, "n {n}: {r:?}");
            }
        }
        assert_eq!(pieces(3000, 256), vec![0..1024, 1024..2048, 2048..3000]);
    }

    #[test]
    fn captions_are_averaged_per_image_by_weight() {
        // Pairs 0 and 1 show image 0 (weights 1 and 0.5), pair 2 image 1.
        let images = [1.0, 0.0, 1.0, 0.0, 0.0, 1.0];
        let texts = [1.0, 0.0, 0.0, 1.0, 0.6, 0.8];
        let r = Reference::build(
            &images,
            &texts,
            &[0, 0, 1],
            &[1.0, 0.5, f32::NAN],
            &[0, 1],
            (2, 2),
        );
        assert_eq!(r.weights, vec![1.5, 0.0]);
        // ((1 + f) (1, 0) + (0.5 + f) (0, 1)) / (1.5 + 2f), f the floor.
        let f = WEIGHT_FLOOR;
        let m = 1.5 + 2.0 * f;
        assert!(
            (r.captions[0] - (1.0 + f) / m).abs() < 1e-6
                && (r.captions[1] - (0.5 + f) / m).abs() < 1e-6
        );
        // An image whose captions all weigh 0 keeps their plain mean.
        assert!((r.captions[2] - 0.6).abs() < 1e-6 && (r.captions[3] - 0.8).abs() < 1e-6);
        assert_eq!(&r.images[2..], &[0.0, 1.0]);
        // Keeping image 1 only.
        let r = Reference::build(&images, &texts, &[0, 0, 1], &[1.0, 0.5, 1.0], &[1], (2, 2));
        assert_eq!((r.len(), r.weights.clone()), (1, vec![1.0]));
    }

    #[test]
    fn score_is_the_weighted_caption_agreement_of_the_nearest_other_images() -> Result<()> {
        // Three reference images at 0°, 30° and 90°; captions along x, y
        // and x; weights 1, 1 and 0 (called noisy).
        let a = unit(&[1.0, 0.0]);
        let b = unit(&[3f32.sqrt(), 1.0]);
        let c = unit(&[0.0, 1.0]);
        let images: Vec<f32> = [a.clone(), b.clone(), c.clone()].concat();
        let texts = [1.0, 0.0, 0.0, 1.0, 1.0, 0.0];
        let r = Reference::build(
            &images,
            &texts,
            &[0, 1, 2],
            &[1.0, 1.0, 0.0],
            &[0, 1, 2],
            (2, 2),
        );
        let dev = Device::Cpu;
        // Query: image a itself (excluded as the same image), caption x.
        // k = 1: the nearest other image is b, caption y: agreement 0.
        // k = 2: b (weight 1 + floor) and c (floor only, caption x: 1).
        let qi = Tensor::from_slice(&a, (1, 2), &dev)?;
        let qt = Tensor::from_slice(&[1.0f32, 0.0], (1, 2), &dev)?;
        assert_eq!(r.score(&qi, &qt, 1)?, vec![0.0]);
        let want = WEIGHT_FLOOR / (1.0 + 2.0 * WEIGHT_FLOOR);
        let got = r.score(&qi, &qt, 2)?[0];
        assert!((got - want).abs() < 1e-6, "{got} vs {want}");
        // A query no reference image equals keeps all of them.
        let qi = Tensor::from_slice(&unit(&[1.0, 0.1]), (1, 2), &dev)?;
        assert_eq!(r.score(&qi, &qt, 1)?, vec![1.0]);
        // Nothing left: NaN, never a made-up score.
        let empty = Reference::build(&[], &[], &[], &[], &[], (2, 2));
        assert!(empty.score(&qi, &qt, 3)?[0].is_nan());
        Ok(())
    }
}
