//! Each caption judged against its own null: how it matches images it
//! does not describe.
//!
//! The calibration models mismatched pairs by random pairings of the
//! data's own pairs. That holds where noise is spread over the captions as
//! the pairings are. A caption that describes no image (a file name, a
//! shop's template) matches its own image no better than any other, so its
//! pair looks like its own random pairings, not like the pairings' lower
//! tail (real captions with the wrong photo), where the noise share is
//! read: such pairs came out clean (Flickr8k with 20% boilerplate
//! captions: noise estimate 0, BENCHMARKS.md "Boilerplate captions").
//!
//! So by default (`caption_null`, [`crate::config::TrainConfig`]) the
//! similarity signal is the pair's similarity as a z-score against the
//! same caption's similarities with a fixed bank of training images:
//! `(S(x, c) − mean_k μ_k(c)) / sqrt(mean_k σ²_k(c))`, where `μ_k(c)` and
//! `σ²_k(c)` are the mean and variance of caption c's similarities with
//! the bank under network k. Under the null (a caption paired with an
//! image it does not describe) it is centred and scaled alike for every
//! caption, boilerplate or not. The bank's joint embeddings travel in the
//! checkpoint, so a pair's z-score depends on the pair and the checkpoint
//! alone. Each network's moments depend on its caption embeddings alone,
//! so a method's score pass, which embeds every caption anyway, gathers
//! them as it goes ([`NullSink`]); an earlier form, the z-score against
//! the networks' mean similarities, needed every network's embeddings of
//! a caption at once, and score embedded the captions a second time for
//! it (16% slower on 200,000 pairs).
//!
//! The same arithmetic with the roles swapped is the *image* null: a
//! [`CaptionNull`] whose bank holds 256 training captions' joint
//! embeddings, read against the images' embeddings. An image that fits no
//! caption (a placeholder shown with many captions) sits at its own null
//! that way, where against the captions' nulls its bunched similarities
//! hide it. `fit` reads the noise share both ways and keeps the larger
//! (`signals::calibrate_on`); the image null is not kept in the
//! checkpoint, since only that share, which is, depends on it.

use candle_core::{DType, Device, Tensor};

use crate::error::Result;

/// Images in the bank: with 32 random images per caption the null's
/// sampling noise cost 0.3–0.6 graded τb on Flickr8k; with 256 nothing.
pub const BANK: usize = 256;

/// Smallest standard deviation a caption's null is divided by (a caption
/// whose similarities with the bank are all equal).
pub(super) const MIN_SD: f32 = 1e-4;

/// Rows of pairs whose null similarities are held at once.
const ROWS: usize = 4096;

/// The bank: per network, the joint embeddings of [`BANK`] (or fewer)
/// training images, `bank × dim` row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct CaptionNull {
    /// Width of the joint embeddings.
    pub dim: usize,
    /// One `bank × dim` array per network.
    pub images: Vec<Vec<f32>>,
}

impl CaptionNull {
    /// From per-network arrays of `bank × dim` values; None when they do
    /// not fit (no network, a width of 0, sizes that differ or are not a
    /// whole number of rows, fewer than two images).
    pub fn new(images: Vec<Vec<f32>>, dim: usize) -> Option<CaptionNull> {
        let len = images.first()?.len();
        let ok = dim > 0
            && len.is_multiple_of(dim)
            && len / dim >= 2
            && images.iter().all(|a| a.len() == len);
        ok.then_some(CaptionNull { dim, images })
    }

    /// Images in the bank.
    pub fn bank(&self) -> usize {
        self.images[0].len() / self.dim
    }

    /// The z-score of each pair's similarity (the networks' mean `S_ii`)
    /// against its caption's null ([`NullMoments::z_scores`]):
    /// `captions[k]` are the pairs' caption embeddings under network k
    /// (`[n, dim]`). NaN stays NaN.
    pub fn z_scores(&self, similarity: &[f32], captions: &[Tensor]) -> Result<Vec<f32>> {
        // A count of networks other than the bank's is refused by
        // `moments` (too many) or `NullMoments::z_scores` (too few).
        let mut moments = NullMoments::new(similarity.len());
        for (k, c) in captions.iter().enumerate() {
            moments.add(self.moments(k, c)?)?;
        }
        moments.z_scores(self, similarity)
    }

    /// Each caption's null under network `k`: the mean and variance (with
    /// `n − 1`) of its similarities with the bank's images, from the
    /// captions' joint embeddings under that network (`[n, dim]`).
    pub fn moments(&self, k: usize, captions: &Tensor) -> Result<CaptionMoments> {
        let Some(images) = self.images.get(k) else {
            return Err(crate::error::Error::State(format!(
                "caption null: network {k} of a bank of {}",
                self.images.len()
            )));
        };
        let m = self.bank();
        let bank = Tensor::from_slice(images, (m, self.dim), &Device::Cpu)?.t()?;
        let host = captions.to_device(&Device::Cpu)?.to_dtype(DType::F32)?;
        let n = host.dim(0)?;
        let mut out = CaptionMoments {
            mean: Vec::with_capacity(n),
            var: Vec::with_capacity(n),
        };
        let mut start = 0;
        while start < n {
            let rows = ROWS.min(n - start);
            let null: Vec<f32> = host
                .narrow(0, start, rows)?
                .matmul(&bank)?
                .flatten_all()?
                .to_vec1()?;
            for row in null.chunks(m) {
                let (mean, var) = mean_var(row);
                out.mean.push(mean);
                out.var.push(var);
            }
            start += rows;
        }
        Ok(out)
    }
}

/// Each caption's null under one network ([`CaptionNull::moments`]).
#[derive(Debug, Clone, PartialEq)]
pub struct CaptionMoments {
    /// Mean similarity with the bank's images, per caption.
    pub mean: Vec<f32>,
    /// Variance of those similarities, per caption.
    pub var: Vec<f32>,
}

/// Each pair's caption null summed over the networks seen so far, network
/// 0 first. Every network's moments depend on that network's caption
/// embeddings alone, so a method's score pass, which embeds every caption
/// once per network, gathers them as it goes ([`NullSink`]) and the
/// captions are not embedded a second time.
#[derive(Debug, Clone, PartialEq)]
pub struct NullMoments {
    mean: Vec<f32>,
    var: Vec<f32>,
    nets: usize,
}

impl NullMoments {
    /// No network yet, for `n` pairs.
    pub fn new(n: usize) -> NullMoments {
        NullMoments {
            mean: vec![0.0; n],
            var: vec![0.0; n],
            nets: 0,
        }
    }

    /// Add the next network's moments (of the same pairs).
    pub fn add(&mut self, m: CaptionMoments) -> Result<()> {
        if m.mean.len() != self.mean.len() || m.var.len() != self.var.len() {
            return Err(crate::error::Error::State(format!(
                "caption null: moments of {} captions for {} pairs",
                m.mean.len(),
                self.mean.len()
            )));
        }
        for (acc, v) in self.mean.iter_mut().zip(&m.mean) {
            *acc += v;
        }
        for (acc, v) in self.var.iter_mut().zip(&m.var) {
            *acc += v;
        }
        self.nets += 1;
        Ok(())
    }

    /// Networks added.
    pub fn nets(&self) -> usize {
        self.nets
    }

    /// The z-score of each pair's similarity (the networks' mean `S_ii`)
    /// against its caption's null: `(s − mean_k μ_k) / sqrt(mean_k σ²_k)`,
    /// the mean over the networks of the caption's mean similarity with
    /// the bank and of its variance (at least `MIN_SD` as a standard
    /// deviation). Refused unless every network of `null` was added.
    pub fn z_scores(&self, null: &CaptionNull, similarity: &[f32]) -> Result<Vec<f32>> {
        if self.nets != null.images.len() || similarity.len() != self.mean.len() {
            return Err(crate::error::Error::State(format!(
                "caption null: moments of {} networks and {} pairs for a bank of {} networks \
                 and {} similarities",
                self.nets,
                self.mean.len(),
                null.images.len(),
                similarity.len()
            )));
        }
        let k = self.nets as f32;
        Ok(similarity
            .iter()
            .zip(self.mean.iter().zip(&self.var))
            .map(|(&s, (&mean, &var))| (s - mean / k) / (var / k).sqrt().max(MIN_SD))
            .collect())
    }
}

/// Gathers the caption null's moments during a method's score pass: the
/// pass hands each network's caption embeddings of every pair (rows in the
/// data's order) to [`NullSink::add`], network 0 first.
#[derive(Debug)]
pub struct NullSink<'a> {
    null: &'a CaptionNull,
    moments: std::cell::RefCell<NullMoments>,
}

impl<'a> NullSink<'a> {
    /// For `n` pairs against `null`.
    pub fn new(null: &'a CaptionNull, n: usize) -> NullSink<'a> {
        NullSink {
            null,
            moments: std::cell::RefCell::new(NullMoments::new(n)),
        }
    }

    /// Network `k`'s caption embeddings of every pair (`[n, dim]`); `k`
    /// must be the next network.
    pub fn add(&self, k: usize, captions: &Tensor) -> Result<()> {
        let next = self.moments.borrow().nets();
        if k != next {
            return Err(crate::error::Error::State(format!(
                "caption null: network {k}'s captions where network {next}'s were due"
            )));
        }
        let m = self.null.moments(k, captions)?;
        self.moments.borrow_mut().add(m)
    }

    /// The moments gathered.
    pub fn into_moments(self) -> NullMoments {
        self.moments.into_inner()
    }
}

/// Mean and variance (with `n − 1`) of `null`.
fn mean_var(null: &[f32]) -> (f32, f32) {
    let k = null.len() as f32;
    let mean = null.iter().sum::<f32>() / k;
    let var = null.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / (k - 1.0).max(1.0);
    (mean, var)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_similarity_is_scored_against_its_captions_bank() {
        // Two networks, width 2, a bank of three images; one caption per
        // network. Net 0: bank rows (1, 0), (0, 1), (1, 1), caption
        // (1, 2): similarities 1, 2, 3, mean 2, variance (1 + 0 + 1) / 2
        // = 1. Net 1: bank (2, 0), (0, 0), (0, 2), caption (1, 1):
        // 2, 0, 2, mean 4/3, deviations 2/3, -4/3, 2/3, variance
        // (4 + 16 + 4) / 9 / 2 = 4/3. Over the networks: mean 5/3,
        // variance 7/6. Similarity 3: z = (3 - 5/3) / sqrt(7/6).
        let null = CaptionNull::new(
            vec![
                vec![1.0, 0.0, 0.0, 1.0, 1.0, 1.0],
                vec![2.0, 0.0, 0.0, 0.0, 0.0, 2.0],
            ],
            2,
        )
        .expect("bank");
        assert_eq!(null.bank(), 3);
        let c0 = Tensor::from_slice(&[1f32, 2.0], (1, 2), &Device::Cpu).unwrap();
        let c1 = Tensor::from_slice(&[1f32, 1.0], (1, 2), &Device::Cpu).unwrap();
        let z = null.z_scores(&[3.0], &[c0, c1]).unwrap();
        let want = (3.0 - 5.0 / 3.0) / (7.0f64 / 6.0).sqrt();
        assert!(
            (f64::from(z[0]) - want).abs() < 1e-5,
            "{} against {want}",
            z[0]
        );
    }

    #[test]
    fn a_caption_that_fits_every_image_alike_sits_at_its_null() {
        // A caption whose similarity with every bank image is the same as
        // with its own image scores 0 whatever that similarity; a caption
        // far above its null scores high. Rows past one block of ROWS are
        // scored the same way.
        let null = CaptionNull::new(vec![vec![1.0, 0.0, 0.0, 1.0, 0.5, 0.5]], 2).expect("bank");
        let n = ROWS + 3;
        let mut caps = Vec::new();
        let mut sims = Vec::new();
        for i in 0..n {
            // (1, 1): similarities 1, 1, 1; its own similarity 1 gives
            // (1 - 1) / MIN_SD = 0.
            caps.extend([1f32, 1.0]);
            sims.push(if i == n - 1 { 2.0 } else { 1.0 });
        }
        let c = Tensor::from_vec(caps, (n, 2), &Device::Cpu).unwrap();
        let z = null.z_scores(&sims, &[c]).unwrap();
        assert!(z[..n - 1].iter().all(|&v| v == 0.0));
        assert!(z[n - 1] > 1e3, "{}", z[n - 1]);
        assert!(null.z_scores(&sims, &[]).is_err());
    }

    #[test]
    fn a_pass_gathers_the_moments_a_whole_embedding_gives() {
        // Two networks, five captions: the moments handed over network by
        // network, as a method's score pass does, give the z-scores of
        // z_scores on all captions at once, bit for bit; a network out of
        // turn, or a network missing, is refused.
        let null = CaptionNull::new(
            vec![
                vec![1.0, 0.0, 0.0, 1.0, 1.0, 1.0, -1.0, 0.5],
                vec![0.5, 0.5, 2.0, 0.0, 0.0, -1.0, 1.0, 1.0],
            ],
            2,
        )
        .expect("bank");
        let caps = |v: &[f32]| Tensor::from_slice(v, (5, 2), &Device::Cpu).unwrap();
        let c0 = caps(&[1.0, 2.0, 0.5, -0.5, 0.0, 1.0, 3.0, 1.0, -2.0, 0.25]);
        let c1 = caps(&[0.0, 1.0, 1.0, 1.0, 2.0, -1.0, 0.5, 0.5, 1.0, 1.5]);
        let sims = [0.5f32, 1.0, -0.25, 2.0, 0.0];
        let whole = null.z_scores(&sims, &[c0.clone(), c1.clone()]).unwrap();
        let sink = NullSink::new(&null, 5);
        assert!(sink.add(1, &c1).is_err());
        sink.add(0, &c0).unwrap();
        let half = sink.moments.borrow().clone();
        assert!(half.z_scores(&null, &sims).is_err());
        sink.add(1, &c1).unwrap();
        let moments = sink.into_moments();
        assert_eq!(moments.nets(), 2);
        assert_eq!(moments.z_scores(&null, &sims).unwrap(), whole);
        // By hand for the first caption: its similarities with the bank
        // are 1, 2, 3, 0 under net 0 and 0.5, 0, -1, 1 under net 1.
        let mv = |v: [f64; 4]| {
            let m = v.iter().sum::<f64>() / 4.0;
            (m, v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / 3.0)
        };
        let (m0, v0) = mv([1.0, 2.0, 3.0, 0.0]);
        let (m1, v1) = mv([0.5, 0.0, -1.0, 1.0]);
        let want = (0.5 - (m0 + m1) / 2.0) / ((v0 + v1) / 2.0).sqrt();
        assert!(
            (f64::from(whole[0]) - want).abs() < 1e-5,
            "{} against {want}",
            whole[0]
        );
        // Moments of another number of pairs are refused.
        let mut other = NullMoments::new(4);
        assert!(other.add(null.moments(0, &c0).unwrap()).is_err());
    }

    #[test]
    fn banks_that_do_not_fit_are_refused() {
        assert!(CaptionNull::new(Vec::new(), 2).is_none());
        assert!(CaptionNull::new(vec![vec![1.0; 6]], 0).is_none());
        assert!(CaptionNull::new(vec![vec![1.0; 5]], 2).is_none());
        assert!(CaptionNull::new(vec![vec![1.0; 2]], 2).is_none());
        assert!(CaptionNull::new(vec![vec![1.0; 6], vec![1.0; 4]], 2).is_none());
    }
}
