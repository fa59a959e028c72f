//! The clean model's signals of pairs, from the trained networks: the
//! similarity (the networks' mean of `S_ii`), the neighbourhood score
//! against the reference ([`super::Reference`]) and the ridge signal
//! ([`super::ridge`]); and the model fitted on a training set.

use std::ops::Range;

use candle_core::{DType, Device, Tensor};
use ncclean_models::rng::Rng;
use ncclean_models::PairInputs;

use super::null::{CaptionNull, NullMoments, BANK};
use super::ridge::Ridge;
use super::trained::{pair_hash, OwnRatio, TrainedPairs};
use super::{Calibration, Reference, Signals, Weights, MAX_NEGATIVES, MIN_PAIRS};
use crate::error::Result;
use crate::net::Net;

/// Pairs embedded per chunk.
const CHUNK: usize = 512;

/// Most trained pairs whose embeddings are held at once while random
/// pairings are drawn among them: the trained pairs are split into pools
/// of at most this many, and each pool's images are paired with its own
/// captions.
const PAIRING_POOL: usize = 5_000;

/// Most pools of trained pairs drawn from (a seeded sample of the trained
/// pairs beyond `PAIRING_POOL · MAX_POOLS`). One pool of 5,000 was too
/// few: the map of the trained pairs' scores onto the pairings'
/// ([`super::trained::memorisation_map`]) moved with the pool drawn. On
/// Flickr8k (27,000 trained pairs) its scale's standard deviation over
/// reseeded draws was 0.007–0.010 with one pool, 0.003–0.004 in pools, and
/// at 70% noise one fit's 0.95 cut realised 0.937 with one pool, 0.948 in
/// pools.
const MAX_POOLS: usize = 16;

/// Random pairings drawn among the trained pairs in all (at most 20 per
/// trained pair), spread evenly over the pools.
const TRAINED_PAIRINGS: usize = 4 * MAX_NEGATIVES;

/// Tries at drawing a caption of another image for a random pairing.
const DRAWS: usize = 16;

/// The fitted model with its reference, as kept in a checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct CleanModel {
    /// The map from signals to clean probability.
    pub calibration: Calibration,
    /// The reference images of the neighbourhood score.
    pub reference: Reference,
    /// The map behind the ridge signal ([`super::ridge`]); None in
    /// checkpoints from before it (the signal then counts as 0).
    pub ridge: Option<Ridge>,
    /// The bank each caption's similarity is scored against
    /// ([`super::null`]); None in checkpoints from before it, whose
    /// similarity signal is the plain similarity.
    pub null: Option<CaptionNull>,
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

/// The similarity signal of pairs whose similarities are `similarity`:
/// their z-scores against their captions' null ([`CaptionNull`]) where
/// there is one (`captions[k]`: the pairs' caption embeddings under
/// network k), else the similarities themselves.
fn similarity_signal(
    null: Option<&CaptionNull>,
    similarity: Vec<f32>,
    captions: &[Tensor],
) -> Result<Vec<f32>> {
    match null {
        Some(null) => null.z_scores(&similarity, captions),
        None => Ok(similarity),
    }
}

/// The caption embeddings of `emb` (one `(images, captions)` per network).
fn captions_of(emb: &[(Tensor, Tensor)]) -> Vec<Tensor> {
    emb.iter().map(|(_, t)| t.clone()).collect()
}

/// The image embeddings of `emb` (one `(images, captions)` per network).
fn images_of(emb: &[(Tensor, Tensor)]) -> Vec<Tensor> {
    emb.iter().map(|(i, _)| i.clone()).collect()
}

/// The bank of the caption null: the joint image embeddings, under every
/// network, of at most [`BANK`] distinct images of the pairs outside
/// `held_out`, evenly spaced in their order (no random draw, so the rest
/// of the fit draws as before). `image_of[i]`: pair i's distinct image.
fn caption_null(
    nets: &[Net],
    data: &PairInputs,
    image_of: &[u32],
    held_out: &[usize],
) -> Result<Option<CaptionNull>> {
    let pool = trained_images(image_of, held_out);
    bank_of(nets, data, &pool, |(images, _)| images)
}

/// The first pair of each distinct image outside `held_out`, in image
/// order: where the nulls' banks of images are drawn from.
fn trained_images(image_of: &[u32], held_out: &[usize]) -> Vec<usize> {
    let distinct = image_of.iter().map(|&g| g as usize + 1).max().unwrap_or(0);
    let mut first = vec![usize::MAX; distinct];
    for (i, &g) in image_of.iter().enumerate().rev() {
        first[g as usize] = i;
    }
    let mut held = vec![false; distinct];
    for &i in held_out {
        held[image_of[i] as usize] = true;
    }
    (0..distinct)
        .filter(|&g| !held[g] && first[g] != usize::MAX)
        .map(|g| first[g])
        .collect()
}

/// At most `m` of `pool`, evenly spaced in its order (no random draw).
fn evenly_spaced(pool: &[usize], m: usize) -> Vec<usize> {
    let m = pool.len().min(m);
    (0..m).map(|j| pool[j * pool.len() / m]).collect()
}

/// The ridge map ([`super::ridge`]) fitted on the pairs outside
/// `held_out` (each weighted by `weights[i]`, the method's clean
/// probability), their pooled image features `images` projected into the
/// reference's search space and their pooled caption features `texts`
/// (host rows, as the reference was built from);
/// its bank the first pairs of at most [`BANK`] distinct
/// images outside `held_out`, evenly spaced. None where it cannot be
/// fitted.
fn ridge_of(
    reference: &Reference,
    (images, texts): (&Tensor, &[f32]),
    weights: &[f32],
    image_of: &[u32],
    held_out: &[usize],
) -> Result<Option<Ridge>> {
    if reference.is_empty() {
        return Ok(None);
    }
    let rows = reference.search_rows(images)?;
    let (w, dt) = (reference.width(), reference.text_dim);
    let mut fit_weights: Vec<f32> = weights.to_vec();
    fit_weights.resize(image_of.len(), 0.0);
    for &i in held_out {
        fit_weights[i] = 0.0;
    }
    let bank: Vec<f32> = evenly_spaced(&trained_images(image_of, held_out), BANK)
        .iter()
        .flat_map(|&i| &rows[i * w..(i + 1) * w])
        .copied()
        .collect();
    Ok(Ridge::fit(&rows, texts, &fit_weights, &bank, (w, dt)))
}

/// A null's bank: at most [`BANK`] of the pairs `pool`, evenly spaced in
/// their order, as the joint embeddings `side` picks (images or captions)
/// under every network; None with fewer than two.
fn bank_of(
    nets: &[Net],
    data: &PairInputs,
    pool: &[usize],
    side: impl Fn(&(Tensor, Tensor)) -> &Tensor,
) -> Result<Option<CaptionNull>> {
    if pool.len() < 2 {
        return Ok(None);
    }
    let bank = evenly_spaced(pool, BANK);
    let emb = joint(nets, data, &bank)?;
    let dim = side(&emb[0]).dim(1)?;
    let rows = emb
        .iter()
        .map(|e| -> Result<Vec<f32>> {
            Ok(side(e)
                .to_device(&Device::Cpu)?
                .to_dtype(DType::F32)?
                .flatten_all()?
                .to_vec1()?)
        })
        .collect::<Result<Vec<Vec<f32>>>>()?;
    Ok(CaptionNull::new(rows, dim))
}

/// The image null's bank ([`super::null`], the roles of images and
/// captions swapped): the joint caption embeddings, under every network,
/// of at most [`BANK`] pairs outside `held_out`, evenly spaced in their
/// order. A pair's similarity read against its image's similarities with
/// these captions is how the noise share of images that fit no caption
/// (placeholders shown with many captions) is read ([`calibrate_on`]).
fn image_null(nets: &[Net], data: &PairInputs, held_out: &[usize]) -> Result<Option<CaptionNull>> {
    let mut held = vec![false; data.len()];
    for &i in held_out {
        held[i] = true;
    }
    let pool: Vec<usize> = (0..data.len()).filter(|&i| !held[i]).collect();
    bank_of(nets, data, &pool, |(_, captions)| captions)
}

/// How the clean model is fitted ([`CleanModel::fit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FitOptions {
    /// Reference images each pair's caption is compared with.
    pub neighbours: usize,
    /// Most distinct training images kept as the reference.
    pub max_images: usize,
    /// Score the similarity against each caption's null
    /// ([`super::null`]).
    pub caption_null: bool,
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
        options: FitOptions,
        rng: &mut Rng,
    ) -> Result<Option<CleanModel>> {
        let FitOptions {
            neighbours,
            max_images,
            caption_null: with_null,
        } = options;
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
        let host = |t: &Tensor| -> Result<Vec<f32>> {
            Ok(t.to_device(&Device::Cpu)?.flatten_all()?.to_vec1()?)
        };
        let texts = host(&pt)?;
        let reference = Reference::build(&host(&pi)?, &texts, &of, weights, &keep, dims)
            .compress(super::reference::SEARCH_DIM)?;
        let ridge = ridge_of(&reference, (&pi, &texts), weights, &of, calibration_pairs)?;
        let (null, image_null) = if with_null {
            (
                caption_null(nets, data, &of, calibration_pairs)?,
                image_null(nets, data, calibration_pairs)?,
            )
        } else {
            (None, None)
        };
        let Some((calibration, held)) = calibrate_on(
            (
                &reference,
                ridge.as_ref(),
                null.as_ref(),
                image_null.as_ref(),
            ),
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
            ridge,
            null,
            neighbours,
            trained: None,
        };
        model.trained =
            model.trained_pairs(nets, data, (calibration_pairs, &held), weights, &of, rng)?;
        Ok(Some(model))
    }

    /// The pairs of `data` outside `held_out` (the ones the networks
    /// trained on) with their own weights of the signals (each
    /// signal's separation of the trained pairs from random pairings among
    /// them, [`super::signal_weight`]) and their scores' distribution under
    /// those weights against that of the held-out pairs, whose signals are
    /// `held`; None when either is too small. `division[i]`: the method's
    /// clean probability of pair i, read beside the trained pairs' scores
    /// ([`super::trained::DivisionOrder`]). `image_of[i]`: pair i's
    /// distinct image.
    fn trained_pairs(
        &self,
        nets: &[Net],
        data: &PairInputs,
        (held_out, held): (&[usize], &Signals),
        division: &[f32],
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
        let pairings = self.pairings_in_pools(nets, data, &trained, image_of, rng)?;
        let cal = &self.calibration;
        let mut weights = own_weights(&t, &pairings).unwrap_or(cal.weights);
        // Trained pairs are weighed on the similarity and the
        // neighbourhood score alone. Training sharpens their similarity,
        // and the ridge signal weighed beside it by its own separation
        // diluted it: their graded order fell (Flickr8k GSC, trained
        // pairs' τb: random 20% 50.0 → 48.4, hard 20% 35.3 → 31.3). Not
        // because the map recalls their captions: with each image's pairs
        // left out of the map (prototyped) it fell the same, to 48.4 and
        // 31.5 (BENCHMARKS.md "The ridge signal").
        weights[2] = 0.0;
        let scores = cal.scores_weighted(&t, weights);
        let held_scores = cal.scores(held);
        let own = OwnRatio::fit(
            &scores,
            &cal.scores_weighted(&pairings, weights),
            cal,
            &held_scores,
        );
        // Empty (no division order) when the division does not cover
        // every trained pair.
        let division: Vec<f64> = trained
            .iter()
            .map(|&i| division.get(i).map(|&p| f64::from(p)))
            .collect::<Option<_>>()
            .unwrap_or_default();
        Ok(TrainedPairs::new(
            t.hashes.clone(),
            &scores,
            &held_scores,
            Some(weights),
            own,
            MIN_PAIRS,
        )
        .map(|p| p.with_division(&t.hashes, &scores, &division)))
    }

    /// Random pairings among pairs `idx` (the trained pairs), drawn within
    /// pools of at most [`PAIRING_POOL`] of them, a pool at a time: a pool's
    /// embeddings are held while its pairings are drawn, which for every
    /// trained pair of a large file at once would be hundreds of MB.
    /// `image_of[i]`: pair i's distinct image.
    fn pairings_in_pools(
        &self,
        nets: &[Net],
        data: &PairInputs,
        idx: &[usize],
        image_of: &[u32],
        rng: &mut Rng,
    ) -> Result<Signals> {
        let mut order = idx.to_vec();
        // One pool holds them all (and is sorted below): no draw needed.
        if order.len() > PAIRING_POOL {
            rng.shuffle(&mut order);
        }
        let (reference, k) = (&self.reference, self.neighbours);
        let mut all = Signals::default();
        for (range, count) in pairing_pools(order.len()) {
            let mut pool = order[range].to_vec();
            pool.sort_unstable();
            let emb = joint(nets, data, &pool)?;
            let (pi, pt) = pooled(nets, data, &pool)?;
            let images: Vec<u32> = pool.iter().map(|&i| image_of[i]).collect();
            // No ridge signal: trained pairs are weighed without it
            // ([`CleanModel::trained_pairs`]).
            let (s, _) = pairings_with(
                (reference, None, self.null.as_ref()),
                k,
                &emb,
                (&pi, &pt),
                &images,
                count,
                rng,
            )?;
            all.extend(s);
        }
        Ok(all)
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
        // Refitted on these pairs, so its image null's bank is theirs.
        let image_null = match &self.null {
            Some(_) => image_null(nets, data, &[])?,
            None => None,
        };
        let fitted = calibrate_on(
            (
                &self.reference,
                self.ridge.as_ref(),
                self.null.as_ref(),
                image_null.as_ref(),
            ),
            self.neighbours,
            nets,
            data,
            &all,
            &of,
            rng,
        )?;
        Ok(fitted.map(|(calibration, _)| CleanModel {
            calibration,
            reference: self.reference.clone(),
            ridge: self.ridge.clone(),
            null: self.null.clone(),
            neighbours: self.neighbours,
            // Fitted on these pairs themselves: nothing to read apart.
            trained: None,
        }))
    }

    /// The signals of every pair of `data`, a chunk at a time.
    pub fn signals(&self, nets: &[Net], data: &PairInputs) -> Result<Signals> {
        let all: Vec<usize> = (0..data.len()).collect();
        self.signals_of(nets, data, &all)
    }

    /// The signals of pairs `idx` of `data`, a chunk at a time.
    pub fn signals_of(&self, nets: &[Net], data: &PairInputs, idx: &[usize]) -> Result<Signals> {
        let n = idx.len();
        let mut similarity = Vec::with_capacity(n);
        for chunk in idx.chunks(CHUNK * 8) {
            let emb = joint(nets, data, chunk)?;
            let local: Vec<u32> = (0..chunk.len() as u32).collect();
            let s = similarity_of(&emb, &local, &local)?;
            similarity.extend(similarity_signal(
                self.null.as_ref(),
                s,
                &captions_of(&emb),
            )?);
        }
        let mut signals = self.pooled_signals_of(nets, data, idx, true)?;
        signals.similarity = similarity;
        Ok(signals)
    }

    /// The signals of pairs `idx` of `data` that come from the pooled
    /// features, a chunk at a time: the neighbourhood score
    /// ([`Reference::score`]), the ridge signal where the model has a map,
    /// and with `hash` the hash ([`pair_hash`]). Without `hash` the hashes
    /// are empty (a model without trained pairs reads none); the
    /// similarity is left empty.
    pub fn pooled_signals_of(
        &self,
        nets: &[Net],
        data: &PairInputs,
        idx: &[usize],
        hash: bool,
    ) -> Result<Signals> {
        let mut out = Signals::default();
        for chunk in idx.chunks(CHUNK * 8) {
            let (pi, pt) = pooled(nets, data, chunk)?;
            let (nb, ridge) =
                self.reference
                    .signals(&pi, &pt, self.neighbours, self.ridge.as_ref())?;
            out.neighbourhood.extend(nb);
            out.ridge.extend(ridge);
            if hash {
                out.hashes.extend(hashes(&pi, &pt)?);
            }
        }
        Ok(out)
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
        let w = trained.weights.unwrap_or(cal.weights);
        (0..s.len())
            .map(|i| {
                let row = s.row(i);
                // Looked up once; a new pair's trained-pair score is never
                // computed.
                let at = s.hashes.get(i).and_then(|&h| trained.index_of(h));
                let u = at.map(|at| (at, cal.score_with(w, row)));
                match u {
                    Some((at, u)) if u.is_finite() => {
                        let u = trained.ordered_score_at(at, u);
                        match &trained.own {
                            Some(own) => cal.clean_prob_through(&own.isotonic, u),
                            None => cal.clean_prob_at(trained.held_out_score(u)),
                        }
                    }
                    _ => cal.clean_prob(row),
                }
            })
            .collect()
    }

    /// Clean probabilities of every pair of `data` whose similarity (the
    /// networks' mean `S_ii`) is already known: `similarity[i]` must be
    /// what [`CleanModel::signals`] computes for pair i (a method's score
    /// pass computes the same number: `Runner::score_in`), and `moments`,
    /// where given, the caption null's moments of every pair gathered in
    /// that pass ([`NullMoments`]). Only the neighbourhood score is
    /// computed here (and with a caption null but no moments, the
    /// captions' embeddings).
    pub fn clean_probs_given(
        &self,
        nets: &[Net],
        data: &PairInputs,
        similarity: &[f32],
        moments: Option<&NullMoments>,
    ) -> Result<Vec<f32>> {
        if similarity.len() != data.len() {
            return Err(crate::error::Error::State(format!(
                "{} similarities for {} pairs",
                similarity.len(),
                data.len()
            )));
        }
        let all: Vec<usize> = (0..data.len()).collect();
        let pooled = self.pooled_signals_of(nets, data, &all, self.trained.is_some())?;
        let similarity = match (&self.null, moments) {
            (None, _) => similarity.to_vec(),
            (Some(null), Some(m)) => m.z_scores(null, similarity)?,
            (Some(null), None) => {
                let mut z = Vec::with_capacity(all.len());
                for chunk in all.chunks(CHUNK * 8) {
                    let captions = caption_embeddings(nets, data, chunk)?;
                    let given = similarity[chunk[0]..chunk[0] + chunk.len()].to_vec();
                    z.extend(null.z_scores(&given, &captions)?);
                }
                z
            }
        };
        let signals = Signals {
            similarity,
            ..pooled
        };
        Ok(self.clean_probs_of(&signals))
    }
}

/// Joint-space caption embeddings of pairs `idx`, one `[n, dim]` tensor
/// per network.
fn caption_embeddings(nets: &[Net], data: &PairInputs, idx: &[usize]) -> Result<Vec<Tensor>> {
    nets.iter()
        .map(|net| {
            let mut ts = Vec::new();
            for chunk in idx.chunks(CHUNK) {
                let t = net
                    .model
                    .embed_texts(&data.texts.batch(chunk, net.device())?)?;
                ts.push(t.detach());
            }
            Ok(Tensor::cat(&ts, 0)?)
        })
        .collect()
}

/// The calibration of `reference` fitted on pairs `idx` of `data` against
/// random pairings among them (`image_of[i]`: pair i's distinct image),
/// with the pairs' own signals; the pairs are embedded once for both.
///
/// With an image null, the noise share is the larger of two readings of
/// the same pairs and pairings: the calibration's own (the similarity
/// against each caption's null) and one with the similarity against each
/// image's null instead. Each null reads one kind of noise: a caption
/// that fits no image sits at its own null (the caption null), and so
/// does an image that fits no caption (a placeholder shown with many
/// captions, whose similarities are bunched and never reach the pairings'
/// lower tail as read against the captions' nulls: Flickr8k with 20% of
/// the pairs on five such images gave a noise share of 0). The order and
/// the density ratio stay the caption null's: read against the image's
/// null, graded order fell 1.1–2.0 τb (BENCHMARKS.md, "Placeholder
/// images").
fn calibrate_on(
    (reference, ridge, null, image_null): (
        &Reference,
        Option<&Ridge>,
        Option<&CaptionNull>,
        Option<&CaptionNull>,
    ),
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
    let plain = similarity_of(&emb, &local, &local)?;
    let (neighbourhood, ridge_signal) = reference.signals(&pi, &pt, neighbours, ridge)?;
    let observed = Signals {
        similarity: similarity_signal(null, plain.clone(), &captions_of(&emb))?,
        neighbourhood,
        ridge: ridge_signal,
        hashes: Vec::new(),
    };
    let images: Vec<u32> = idx.iter().map(|&i| image_of[i]).collect();
    let count = (n * 20).min(MAX_NEGATIVES);
    let (pairings, (a, b)) = pairings_with(
        (reference, ridge, null),
        neighbours,
        &emb,
        (&pi, &pt),
        &images,
        count,
        rng,
    )?;
    let Some(mut calibration) = Calibration::fit(&observed, &pairings) else {
        return Ok(None);
    };
    if let (Some(inull), false) = (image_null, a.is_empty()) {
        let dev = pi.device();
        let ia = Tensor::from_slice(&a, a.len(), dev)?;
        let paired_images = emb
            .iter()
            .map(|(i, _)| i.index_select(&ia, 0))
            .collect::<candle_core::Result<Vec<Tensor>>>()?;
        // Only the noise share is read here, on the similarity and the
        // neighbourhood score ([`Calibration::fit`]).
        let by_image = |similarity: Vec<f32>, neighbourhood: &[f32], images: &[Tensor]| {
            Ok::<_, crate::error::Error>(Signals {
                similarity: inull.z_scores(&similarity, images)?,
                neighbourhood: neighbourhood.to_vec(),
                ..Default::default()
            })
        };
        let pairs_i = by_image(plain, &observed.neighbourhood, &images_of(&emb))?;
        let pairings_i = by_image(
            similarity_of(&emb, &a, &b)?,
            &pairings.neighbourhood,
            &paired_images,
        )?;
        if let Some(other) = Calibration::fit(&pairs_i, &pairings_i) {
            calibration.noise = calibration.noise.max(other.noise);
        }
    }
    Ok(Some((calibration, observed)))
}

/// How `n` trained pairs, in a shuffled order, are split for their random
/// pairings: consecutive ranges of that order, pools of near-equal size of
/// at most [`PAIRING_POOL`] pairs and [`MAX_POOLS`] in all (pairs beyond
/// them are left out), each with the number of pairings to draw in it:
/// [`TRAINED_PAIRINGS`] in all spread evenly, at most 20 per pair of the
/// pool and [`MAX_NEGATIVES`] per pool (a pool's pairings' features are
/// gathered at once).
fn pairing_pools(n: usize) -> Vec<(Range<usize>, usize)> {
    let used = n.min(PAIRING_POOL * MAX_POOLS);
    let pools = used.div_ceil(PAIRING_POOL).max(1);
    let per_pool = (used * 20).min(TRAINED_PAIRINGS).div_ceil(pools);
    // The first `used % pools` pools take one pair more.
    let (base, extra) = (used / pools, used % pools);
    let mut start = 0;
    (0..pools)
        .map(|p| {
            let len = base + usize::from(p < extra);
            let range = start..start + len;
            start += len;
            (range, per_pool.min(len * 20).min(MAX_NEGATIVES))
        })
        .filter(|(range, _)| !range.is_empty())
        .collect()
}

/// Each random pairing's image pair and caption pair (rows of the pairs).
type Drawn = (Vec<u32>, Vec<u32>);

/// Signals of `count` random pairings among some pairs: the image of
/// pair i with the caption of a pair j showing another image (`images[i]`:
/// pair i's distinct image; fewer pairings where draws keep finding the
/// same image), from the pairs' joint embeddings and pooled features (row
/// i for pair i); with each pairing's image pair and caption pair.
fn pairings_with(
    (reference, ridge, null): (&Reference, Option<&Ridge>, Option<&CaptionNull>),
    neighbours: usize,
    emb: &[(Tensor, Tensor)],
    pooled: (&Tensor, &Tensor),
    images: &[u32],
    count: usize,
    rng: &mut Rng,
) -> Result<(Signals, Drawn)> {
    let (pi, pt) = pooled;
    let n = images.len();
    let (mut a, mut b) = (Vec::with_capacity(count), Vec::with_capacity(count));
    for _ in 0..count {
        let i = rng.below(n);
        for _ in 0..DRAWS {
            let j = rng.below(n);
            if images[j] != images[i] {
                a.push(i as u32);
                b.push(j as u32);
                break;
            }
        }
    }
    if a.is_empty() {
        return Ok((Signals::default(), (a, b)));
    }
    let dev = pi.device();
    let ia = Tensor::from_slice(&a, a.len(), dev)?;
    let ib = Tensor::from_slice(&b, b.len(), dev)?;
    let similarity = similarity_of(emb, &a, &b)?;
    let similarity = match null {
        Some(_) => {
            let captions = emb
                .iter()
                .map(|(_, t)| t.index_select(&ib, 0))
                .collect::<candle_core::Result<Vec<Tensor>>>()?;
            similarity_signal(null, similarity, &captions)?
        }
        None => similarity,
    };
    let (neighbourhood, ridge) = reference.signals(
        &pi.index_select(&ia, 0)?,
        &pt.index_select(&ib, 0)?,
        neighbours,
        ridge,
    )?;
    let signals = Signals {
        similarity,
        neighbourhood,
        ridge,
        hashes: Vec::new(),
    };
    Ok((signals, (a, b)))
}

/// Each signal's weight ([`super::signal_weight`]) from pairs against
/// random pairings of them; None when neither signal separates them or
/// either side has fewer than [`MIN_PAIRS`] usable rows.
fn own_weights(pairs: &Signals, pairings: &Signals) -> Option<Weights> {
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
            ridge: Vec::new(),
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
    fn pairings_are_drawn_in_pools_across_the_trained_pairs() {
        // Every trained pair up to MAX_POOLS pools is paired, in pools of
        // near-equal size no larger than PAIRING_POOL, with the pairings
        // spread evenly: 24,000 pairs make 5 pools of 4,800 with 16,000
        // pairings each, where one pool of 5,000 drew 20,000 before.
        let pools = pairing_pools(24_000);
        assert_eq!(pools.len(), 5);
        for (i, (range, count)) in pools.iter().enumerate() {
            assert_eq!(*range, i * 4_800..(i + 1) * 4_800);
            assert_eq!(*count, 16_000);
        }
        for n in [
            0, 1, 7, 4_999, 5_000, 5_001, 12_345, 80_000, 80_001, 1_000_000,
        ] {
            let pools = pairing_pools(n);
            let used = n.min(PAIRING_POOL * MAX_POOLS);
            // Consecutive, covering the first `used` pairs.
            let mut next = 0;
            for (range, count) in &pools {
                assert_eq!(range.start, next, "n {n}: {pools:?}");
                next = range.end;
                assert!(range.len() <= PAIRING_POOL && *count <= MAX_NEGATIVES);
                assert!(*count <= 20 * range.len(), "n {n}: {pools:?}");
            }
            assert_eq!(next, used, "n {n}");
            let sizes: Vec<usize> = pools.iter().map(|(r, _)| r.len()).collect();
            let (lo, hi) = (sizes.iter().min(), sizes.iter().max());
            assert!(
                hi.zip(lo).is_none_or(|(h, l)| h - l <= 1),
                "n {n}: {sizes:?}"
            );
            // As many pairings as 20 per pair allows, up to the total.
            let total: usize = pools.iter().map(|(_, c)| c).sum();
            let want = (used * 20).min(TRAINED_PAIRINGS);
            assert!(
                total >= want.min(MAX_NEGATIVES) && total <= want + pools.len(),
                "n {n}: {total}"
            );
        }
        // Small files keep the held-out pairs' count: one pool, 20 per pair
        // up to MAX_NEGATIVES.
        assert_eq!(pairing_pools(300), vec![(0..300, 6_000)]);
        assert_eq!(pairing_pools(4_000), vec![(0..4_000, MAX_NEGATIVES)]);
        assert_eq!(pairing_pools(PAIRING_POOL * MAX_POOLS).len(), MAX_POOLS);
        assert_eq!(pairing_pools(1_000_000).len(), MAX_POOLS);
    }

    #[test]
    fn trained_pairs_are_ranked_by_their_own_weights() {
        // The calibration weighs the neighbourhood 9 times the similarity;
        // the trained pairs weigh the similarity alone. Pair A (similarity
        // 1, neighbourhood 0) and pair B (0, 1): read as new pairs B ranks
        // above A, read as trained pairs (hashes 1 and 2) A above B.
        let calibration = Calibration {
            origin: [0.0; 3],
            weights: [1.0, 9.0, 0.0],
            isotonic: Isotonic {
                knots: vec![(-10.0, 0.01), (10.0, 0.99)],
            },
            noise: 0.5,
            pairs: 100,
            negatives: 100,
        };
        let grid: Vec<f64> = (0..=100).map(|i| f64::from(i) / 50.0 - 1.0).collect();
        let trained = TrainedPairs::new(vec![1, 2], &grid, &grid, Some([1.0, 0.0, 0.0]), None, 10);
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
            ridge: None,
            null: None,
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
