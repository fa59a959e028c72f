//! The clean model's signals of pairs, from the trained networks: the
//! similarity (the networks' mean of `S_ii`) and the neighbourhood score
//! against the reference ([`super::Reference`]); and the model fitted on a
//! training set.

use candle_core::{DType, Device, Tensor};
use ncclean_models::rng::Rng;
use ncclean_models::PairInputs;

use super::trained::{pair_hash, OwnRatio, TrainedPairs};
use super::{Calibration, Reference, Signals, MAX_NEGATIVES, MIN_PAIRS};
use crate::error::Result;
use crate::net::Net;

/// Pairs embedded per chunk.
const CHUNK: usize = 512;

/// Most trained pairs whose images and captions are paired at random to
/// weigh the trained pairs' signals (a seeded sample beyond): as many as
/// the held-out pairs of a large file.
const PAIRING_POOL: usize = 5_000;

/// Tries at drawing a caption of another image for a random pairing.
const DRAWS: usize = 16;

/// The fitted model with its reference, as kept in a checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct CleanModel {
    /// The map from signals to clean probability.
    pub calibration: Calibration,
    /// The reference images of the neighbourhood score.
    pub reference: Reference,
    /// Reference images each pair is compared with.
    pub neighbours: usize,
    /// The pairs the networks trained on, whose scores are read as
    /// held-out pairs' ([`super::trained`]); None after `score --refit`
    /// or without held-out pairs.
    pub trained: Option<TrainedPairs>,
}

/// Unit pooled tower features (image, caption) of pairs `idx` under the
/// first network: the frozen towers' vectors where the towers are frozen.
fn pooled(nets: &[Net], data: &PairInputs, idx: &[usize]) -> Result<(Tensor, Tensor)> {
    let net = &nets[0];
    let (mut is, mut ts) = (Vec::new(), Vec::new());
    for chunk in idx.chunks(CHUNK) {
        let (i, t) = net.batch_pooled(data, chunk)?;
        is.push(i);
        ts.push(t);
    }
    Ok((Tensor::cat(&is, 0)?, Tensor::cat(&ts, 0)?))
}

/// The hash of each pair from its pooled features (rows of `images` and
/// `captions`): [`pair_hash`].
fn hashes(images: &Tensor, captions: &Tensor) -> Result<Vec<u64>> {
    let host = |t: &Tensor| -> Result<Vec<Vec<f32>>> {
        Ok(t.to_device(&Device::Cpu)?.to_dtype(DType::F32)?.to_vec2()?)
    };
    let (i, t) = (host(images)?, host(captions)?);
    Ok(i.iter().zip(&t).map(|(a, b)| pair_hash(a, b)).collect())
}

/// Joint-space embeddings of pairs `idx`, one `(images, captions)` per
/// network.
fn joint(nets: &[Net], data: &PairInputs, idx: &[usize]) -> Result<Vec<(Tensor, Tensor)>> {
    nets.iter()
        .map(|net| {
            let (mut is, mut ts) = (Vec::new(), Vec::new());
            for chunk in idx.chunks(CHUNK) {
                let (i, t) = net.batch_embeddings(data, chunk)?;
                is.push(i.detach());
                ts.push(t.detach());
            }
            Ok((Tensor::cat(&is, 0)?, Tensor::cat(&ts, 0)?))
        })
        .collect()
}

/// Mean over networks of image `a[k]`'s similarity with caption `b[k]`
/// (rows of the embeddings).
fn similarity_of(joint: &[(Tensor, Tensor)], a: &[u32], b: &[u32]) -> Result<Vec<f32>> {
    let dev = joint[0].0.device();
    let ia = Tensor::from_slice(a, a.len(), dev)?;
    let ib = Tensor::from_slice(b, b.len(), dev)?;
    let mut sum: Option<Tensor> = None;
    for (vi, vt) in joint {
        let s = (vi.index_select(&ia, 0)? * vt.index_select(&ib, 0)?)?.sum(1)?;
        sum = Some(match sum {
            Some(acc) => (acc + s)?,
            None => s,
        });
    }
    let n = joint.len() as f64;
    match sum {
        Some(s) => Ok((s / n)?.to_device(&Device::Cpu)?.to_vec1()?),
        None => Ok(vec![f32::NAN; a.len()]),
    }
}

impl CleanModel {
    /// Fit on the training pairs: the reference from at most `max_images`
    /// of their distinct images (a seeded sample beyond that), each caption
    /// weighted by `weights` (the method's clean probability); then the
    /// calibration on `calibration_pairs` against random pairings of them
    /// (pairs the networks did not train on, so that the calibration
    /// describes new pairs, not memorised ones). None when too few pairs
    /// are usable ([`Calibration::fit`]).
    pub fn fit(
        nets: &[Net],
        data: &PairInputs,
        weights: &[f32],
        calibration_pairs: &[usize],
        neighbours: usize,
        max_images: usize,
        rng: &mut Rng,
    ) -> Result<Option<CleanModel>> {
        let n = data.len();
        if n == 0 || nets.is_empty() {
            return Ok(None);
        }
        let all: Vec<usize> = (0..n).collect();
        let (pi, pt) = pooled(nets, data, &all)?;
        let (_, of) = data.images.distinct();
        let distinct = of.iter().map(|&g| g as usize + 1).max().unwrap_or(0);
        let mut keep: Vec<u32> = (0..distinct as u32).collect();
        if keep.len() > max_images {
            rng.shuffle(&mut keep);
            keep.truncate(max_images);
            keep.sort_unstable();
        }
        let dims = (pi.dim(1)?, pt.dim(1)?);
        let reference = {
            let host = |t: &Tensor| -> Result<Vec<f32>> {
                Ok(t.to_device(&Device::Cpu)?.flatten_all()?.to_vec1()?)
            };
            Reference::build(&host(&pi)?, &host(&pt)?, &of, weights, &keep, dims)
                .compress(super::reference::SEARCH_DIM)?
        };
        let Some((calibration, held)) = calibrate_on(
            &reference,
            neighbours,
            nets,
            data,
            calibration_pairs,
            &of,
            rng,
        )?
        else {
            return Ok(None);
        };
        let mut model = CleanModel {
            calibration,
            reference,
            neighbours,
            trained: None,
        };
        model.trained = model.trained_pairs(nets, data, (calibration_pairs, &held), &of, rng)?;
        Ok(Some(model))
    }

    /// The pairs of `data` outside `held_out` (the ones the networks
    /// trained on) with their own weights of the two signals (each
    /// signal's separation of the trained pairs from random pairings among
    /// them, [`super::signal_weight`]) and their scores' distribution under
    /// those weights against that of the held-out pairs, whose signals are
    /// `held`; None when either is too small. `image_of[i]`: pair i's
    /// distinct image.
    fn trained_pairs(
        &self,
        nets: &[Net],
        data: &PairInputs,
        (held_out, held): (&[usize], &Signals),
        image_of: &[u32],
        rng: &mut Rng,
    ) -> Result<Option<TrainedPairs>> {
        let mut is_held = vec![false; data.len()];
        for &i in held_out {
            is_held[i] = true;
        }
        let trained: Vec<usize> = (0..data.len()).filter(|&i| !is_held[i]).collect();
        if trained.is_empty() || held_out.is_empty() {
            return Ok(None);
        }
        let t = self.signals_of(nets, data, &trained)?;
        // The pairings are drawn among a sample of the trained pairs: their
        // embeddings are held whole while the pairings are drawn, which for
        // every trained pair of a large file is hundreds of MB.
        let mut pool = trained.clone();
        if pool.len() > PAIRING_POOL {
            rng.shuffle(&mut pool);
            pool.truncate(PAIRING_POOL);
            pool.sort_unstable();
        }
        let emb = joint(nets, data, &pool)?;
        let (pi, pt) = pooled(nets, data, &pool)?;
        let (reference, k) = (&self.reference, self.neighbours);
        let pairings = pairings_with(reference, k, &emb, (&pi, &pt), &pool, image_of, rng)?;
        let cal = &self.calibration;
        let weights = own_weights(&t, &pairings).unwrap_or(cal.weights);
        let scores = cal.scores_weighted(&t, weights);
        let held_scores = cal.scores(held);
        let own = OwnRatio::fit(
            &scores,
            &cal.scores_weighted(&pairings, weights),
            cal,
            &held_scores,
        );
        Ok(TrainedPairs::new(
            t.hashes.clone(),
            &scores,
            &held_scores,
            Some(weights),
            own,
            MIN_PAIRS,
        ))
    }

    /// The same reference with the calibration fitted anew on `data` (its
    /// pairs against random pairings of them): `score --refit`.
    pub fn calibrate(
        &self,
        nets: &[Net],
        data: &PairInputs,
        rng: &mut Rng,
    ) -> Result<Option<CleanModel>> {
        let all: Vec<usize> = (0..data.len()).collect();
        let (_, of) = data.images.distinct();
        let fitted = calibrate_on(&self.reference, self.neighbours, nets, data, &all, &of, rng)?;
        Ok(fitted.map(|(calibration, _)| CleanModel {
            calibration,
            reference: self.reference.clone(),
            neighbours: self.neighbours,
            // Fitted on these pairs themselves: nothing to read apart.
            trained: None,
        }))
    }

    /// Both signals of every pair of `data`, a chunk at a time.
    pub fn signals(&self, nets: &[Net], data: &PairInputs) -> Result<Signals> {
        let all: Vec<usize> = (0..data.len()).collect();
        self.signals_of(nets, data, &all)
    }

    /// Both signals of pairs `idx` of `data`, a chunk at a time.
    pub fn signals_of(&self, nets: &[Net], data: &PairInputs, idx: &[usize]) -> Result<Signals> {
        let n = idx.len();
        let mut similarity = Vec::with_capacity(n);
        for chunk in idx.chunks(CHUNK * 8) {
            let emb = joint(nets, data, chunk)?;
            let local: Vec<u32> = (0..chunk.len() as u32).collect();
            similarity.extend(similarity_of(&emb, &local, &local)?);
        }
        let (neighbourhood, hashes) = self.neighbourhood_of(nets, data, idx, true)?;
        Ok(Signals {
            similarity,
            neighbourhood,
            hashes,
        })
    }

    /// The neighbourhood score ([`Reference::score`]) and, with `hash`,
    /// the hash ([`pair_hash`]) of pairs `idx` of `data`, a chunk at a
    /// time: both from the pooled features. Without `hash` the hashes are
    /// empty (a model without trained pairs reads none).
    pub fn neighbourhood_of(
        &self,
        nets: &[Net],
        data: &PairInputs,
        idx: &[usize],
        hash: bool,
    ) -> Result<(Vec<f32>, Vec<u64>)> {
        let mut scores = Vec::with_capacity(idx.len());
        let mut hashed = Vec::with_capacity(idx.len());
        for chunk in idx.chunks(CHUNK * 8) {
            let (pi, pt) = pooled(nets, data, chunk)?;
            scores.extend(self.reference.score(&pi, &pt, self.neighbours)?);
            if hash {
                hashed.extend(hashes(&pi, &pt)?);
            }
        }
        Ok((scores, hashed))
    }

    /// Clean probabilities of every pair of `data`.
    pub fn clean_probs(&self, nets: &[Net], data: &PairInputs) -> Result<Vec<f32>> {
        Ok(self.clean_probs_of(&self.signals(nets, data)?))
    }

    /// Clean probabilities from pairs' signals: a pair the networks
    /// trained on is read through the trained pairs' own density ratio, or
    /// else at its quantile among the trained pairs ([`super::trained`]);
    /// any other through the calibration directly.
    pub fn clean_probs_of(&self, s: &Signals) -> Vec<f32> {
        let cal = &self.calibration;
        let Some(trained) = &self.trained else {
            return cal.clean_probs(s);
        };
        (0..s.similarity.len())
            .map(|i| {
                let (a, b) = (s.similarity[i], s.neighbourhood[i]);
                match s.hashes.get(i) {
                    Some(&h) if trained.contains(h) && a.is_finite() && b.is_finite() => {
                        let w = trained.weights.unwrap_or(cal.weights);
                        let u = cal.score_with(w, a, b);
                        match &trained.own {
                            Some(own) => cal.clean_prob_through(&own.isotonic, u),
                            None => cal.clean_prob_at(trained.held_out_score(u)),
                        }
                    }
                    _ => cal.clean_prob(a, b),
                }
            })
            .collect()
    }

    /// Clean probabilities of every pair of `data` whose similarity (the
    /// networks' mean `S_ii`) is already known: `similarity[i]` must be
    /// what [`CleanModel::signals`] computes for pair i (a method's score
    /// pass computes the same number: `Runner::score_in`). Only the
    /// neighbourhood score is computed here.
    pub fn clean_probs_given(
        &self,
        nets: &[Net],
        data: &PairInputs,
        similarity: &[f32],
    ) -> Result<Vec<f32>> {
        if similarity.len() != data.len() {
            return Err(crate::error::Error::State(format!(
                "{} similarities for {} pairs",
                similarity.len(),
                data.len()
            )));
        }
        let all: Vec<usize> = (0..data.len()).collect();
        let (neighbourhood, hashes) =
            self.neighbourhood_of(nets, data, &all, self.trained.is_some())?;
        let signals = Signals {
            similarity: similarity.to_vec(),
            neighbourhood,
            hashes,
        };
        Ok(self.clean_probs_of(&signals))
    }
}

/// The calibration of `reference` fitted on pairs `idx` of `data` against
/// random pairings among them (`image_of[i]`: pair i's distinct image),
/// with the pairs' own signals; the pairs are embedded once for both.
fn calibrate_on(
    reference: &Reference,
    neighbours: usize,
    nets: &[Net],
    data: &PairInputs,
    idx: &[usize],
    image_of: &[u32],
    rng: &mut Rng,
) -> Result<Option<(Calibration, Signals)>> {
    let n = idx.len();
    if n == 0 {
        return Ok(None);
    }
    let emb = joint(nets, data, idx)?;
    let (pi, pt) = pooled(nets, data, idx)?;
    let local: Vec<u32> = (0..n as u32).collect();
    let observed = Signals {
        similarity: similarity_of(&emb, &local, &local)?,
        neighbourhood: reference.score(&pi, &pt, neighbours)?,
        hashes: Vec::new(),
    };
    let pairings = pairings_with(reference, neighbours, &emb, (&pi, &pt), idx, image_of, rng)?;
    Ok(Calibration::fit(&observed, &pairings).map(|c| (c, observed)))
}

/// Signals of random pairings among pairs `idx`: the image of pair i with
/// the caption of a pair j showing another image (`image_of`), at most
/// [`MAX_NEGATIVES`] of them (20 per pair), from the pairs' joint
/// embeddings and pooled features (rows in the order of `idx`).
fn pairings_with(
    reference: &Reference,
    neighbours: usize,
    emb: &[(Tensor, Tensor)],
    pooled: (&Tensor, &Tensor),
    idx: &[usize],
    image_of: &[u32],
    rng: &mut Rng,
) -> Result<Signals> {
    let (pi, pt) = pooled;
    let n = idx.len();
    let of = image_of;
    let m = (n * 20).min(MAX_NEGATIVES);
    let (mut a, mut b) = (Vec::with_capacity(m), Vec::with_capacity(m));
    for _ in 0..m {
        let i = rng.below(n);
        for _ in 0..DRAWS {
            let j = rng.below(n);
            if of[idx[j]] != of[idx[i]] {
                a.push(i as u32);
                b.push(j as u32);
                break;
            }
        }
    }
    if a.is_empty() {
        return Ok(Signals::default());
    }
    let dev = pi.device();
    let ia = Tensor::from_slice(&a, a.len(), dev)?;
    let ib = Tensor::from_slice(&b, b.len(), dev)?;
    Ok(Signals {
        similarity: similarity_of(emb, &a, &b)?,
        neighbourhood: reference.score(
            &pi.index_select(&ia, 0)?,
            &pt.index_select(&ib, 0)?,
            neighbours,
        )?,
        hashes: Vec::new(),
    })
}

/// Each signal's weight ([`super::signal_weight`]) from pairs against
/// random pairings of them; None when neither signal separates them or
/// either side has fewer than [`MIN_PAIRS`] usable rows.
fn own_weights(pairs: &Signals, pairings: &Signals) -> Option<[f64; 2]> {
    super::separation(pairs, pairings).map(|(_, _, w)| w)
}

#[cfg(test)]
mod tests {
    use super::super::isotonic::Isotonic;
    use super::*;

    fn signals(similarity: &[f32], neighbourhood: &[f32], hashes: &[u64]) -> Signals {
        Signals {
            similarity: similarity.to_vec(),
            neighbourhood: neighbourhood.to_vec(),
            hashes: hashes.to_vec(),
        }
    }

    #[test]
    fn own_weights_are_each_signals_separation() {
        // Similarity: pairs 2, 4 against pairings 0, 2 (d = 2 per unit 1,
        // as in `a_signal_weighs_its_own_separation_per_unit`), repeated
        // to MIN_PAIRS rows; the neighbourhood does not separate them.
        let rep = |v: &[f32]| -> Vec<f32> { v.iter().copied().cycle().take(MIN_PAIRS).collect() };
        let pairs = signals(&rep(&[2.0, 4.0]), &rep(&[1.0, 1.0]), &[]);
        let pairings = signals(&rep(&[0.0, 2.0]), &rep(&[1.0, 1.0]), &[]);
        let w = own_weights(&pairs, &pairings).expect("weights");
        assert!((w[0] - 2.0).abs() < 1e-12 && w[1] == 0.0, "{w:?}");
        // Neither separates: none; too few rows: none.
        assert!(own_weights(&pairings, &pairs).is_none());
        let few = signals(&[2.0, 4.0], &[1.0, 1.0], &[]);
        assert!(own_weights(&few, &pairings).is_none());
    }

    #[test]
    fn trained_pairs_are_ranked_by_their_own_weights() {
        // The calibration weighs the neighbourhood 9 times the similarity;
        // the trained pairs weigh the similarity alone. Pair A (similarity
        // 1, neighbourhood 0) and pair B (0, 1): read as new pairs B ranks
        // above A, read as trained pairs (hashes 1 and 2) A above B.
        let calibration = Calibration {
            origin: [0.0, 0.0],
            weights: [1.0, 9.0],
            isotonic: Isotonic {
                knots: vec![(-10.0, 0.01), (10.0, 0.99)],
            },
            noise: 0.5,
            pairs: 100,
            negatives: 100,
        };
        let grid: Vec<f64> = (0..=100).map(|i| f64::from(i) / 50.0 - 1.0).collect();
        let trained = TrainedPairs::new(vec![1, 2], &grid, &grid, Some([1.0, 0.0]), None, 10);
        let model = CleanModel {
            calibration,
            reference: Reference {
                images: Vec::new(),
                captions: Vec::new(),
                weights: Vec::new(),
                image_dim: 1,
                text_dim: 1,
                projection: Vec::new(),
            },
            neighbours: 1,
            trained,
        };
        let new = model.clean_probs_of(&signals(&[1.0, 0.0], &[0.0, 1.0], &[7, 8]));
        assert!(new[1] > new[0], "new pairs: {new:?}");
        let seen = model.clean_probs_of(&signals(&[1.0, 0.0], &[0.0, 1.0], &[1, 2]));
        assert!(seen[0] > seen[1], "trained pairs: {seen:?}");
        // Without their own weights (an older checkpoint) trained pairs are
        // weighed as new ones.
        let mut old = model.clone();
        if let Some(t) = old.trained.as_mut() {
            t.weights = None;
        }
        let seen = old.clean_probs_of(&signals(&[1.0, 0.0], &[0.0, 1.0], &[1, 2]));
        assert!(seen[1] > seen[0], "older checkpoint: {seen:?}");
    }
}
