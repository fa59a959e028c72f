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
//! So with `caption_null = true` ([`crate::config::TrainConfig`]) the
//! similarity signal is the pair's similarity as a z-score against
//! the same caption's similarities with a fixed bank of training images:
//! `(S(x, c) − mean_b S(b, c)) / sd_b S(b, c)`. Under the null (a caption
//! paired with an image it does not describe) it is centred and scaled
//! alike for every caption, boilerplate or not. The bank's joint
//! embeddings travel in the checkpoint, so a pair's z-score depends on the
//! pair and the checkpoint alone.

use candle_core::{DType, Device, Tensor};

use crate::error::Result;

/// Images in the bank: with 32 random images per caption the null's
/// sampling noise cost 0.3–0.6 graded τb on Flickr8k; with 256 nothing.
pub const BANK: usize = 256;

/// Smallest standard deviation a caption's null is divided by (a caption
/// whose similarities with the bank are all equal).
const MIN_SD: f32 = 1e-4;

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
    /// against its caption's similarities with the bank: `captions[k]` are
    /// the pairs' caption embeddings under network k (`[n, dim]`). NaN
    /// stays NaN.
    pub fn z_scores(&self, similarity: &[f32], captions: &[Tensor]) -> Result<Vec<f32>> {
        let n = similarity.len();
        if captions.len() != self.images.len() {
            return Err(crate::error::Error::State(format!(
                "caption null: {} networks' captions for a bank of {}",
                captions.len(),
                self.images.len()
            )));
        }
        let m = self.bank();
        let banks = self
            .images
            .iter()
            .map(|a| Tensor::from_slice(a, (m, self.dim), &Device::Cpu)?.t())
            .collect::<candle_core::Result<Vec<Tensor>>>()?;
        let host = captions
            .iter()
            .map(|c| c.to_device(&Device::Cpu)?.to_dtype(DType::F32))
            .collect::<candle_core::Result<Vec<Tensor>>>()?;
        let nets = self.images.len() as f32;
        let mut out = Vec::with_capacity(n);
        let mut start = 0;
        while start < n {
            let rows = ROWS.min(n - start);
            let mut sum: Option<Tensor> = None;
            for (c, b) in host.iter().zip(&banks) {
                let s = c.narrow(0, start, rows)?.matmul(b)?;
                sum = Some(match sum {
                    Some(acc) => (acc + s)?,
                    None => s,
                });
            }
            let null: Vec<Vec<f32>> = match sum {
                Some(s) => (s / f64::from(nets))?.to_vec2()?,
                None => Vec::new(),
            };
            for (row, &s) in null.iter().zip(&similarity[start..start + rows]) {
                out.push(z_score(s, row));
            }
            start += rows;
        }
        Ok(out)
    }
}

/// `(s − mean) / sd` of `s` against `null` (sd with `n − 1`, at least
/// [`MIN_SD`]).
fn z_score(s: f32, null: &[f32]) -> f32 {
    let k = null.len() as f32;
    let mean = null.iter().sum::<f32>() / k;
    let var = null.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / (k - 1.0).max(1.0);
    (s - mean) / var.sqrt().max(MIN_SD)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_similarity_is_scored_against_its_captions_bank() {
        // Two networks, width 2, a bank of three images; one caption per
        // network. Net 0: bank rows (1, 0), (0, 1), (1, 1), caption
        // (1, 2): similarities 1, 2, 3. Net 1: bank (2, 0), (0, 0), (0, 2),
        // caption (1, 1): 2, 0, 2. Mean over the networks: 1.5, 1, 2.5;
        // their mean 5/3, deviations -1/6, -2/3, 5/6, sum of squares
        // (1 + 16 + 25) / 36 = 7/6, variance 7/12. Similarity 3:
        // z = (3 - 5/3) / sqrt(7/12).
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
        let want = (3.0 - 5.0 / 3.0) / (7.0f64 / 12.0).sqrt();
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
    fn banks_that_do_not_fit_are_refused() {
        assert!(CaptionNull::new(Vec::new(), 2).is_none());
        assert!(CaptionNull::new(vec![vec![1.0; 6]], 0).is_none());
        assert!(CaptionNull::new(vec![vec![1.0; 5]], 2).is_none());
        assert!(CaptionNull::new(vec![vec![1.0; 2]], 2).is_none());
        assert!(CaptionNull::new(vec![vec![1.0; 6], vec![1.0; 4]], 2).is_none());
    }
}
