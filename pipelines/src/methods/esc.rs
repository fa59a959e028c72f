//! ESC — Equivariant Similarity Consistency (METHODS.md section 1; Ma et al.,
//! CVPR 2024, with its supplementary Algorithm 1).
//!
//! For two clean pairs, swapping the image changes the similarity as much as
//! swapping the caption, so `S(I_a, T_i) = S(I_i, T_a)`. ESC uses this twice:
//!
//! * **Division.** In every batch the pair with the largest `S_ii` is the
//!   anchor `a`; each pair gets `l_div = l_hard + β [(S_ai − S_ia)² − α1]+`
//!   (the anchor's regulariser is 0). The normalised `l_div` of all pairs is
//!   fitted with a two-component mixture (BMM by default); `w_i` is the
//!   posterior of the low-loss component. Clean set = anchors ∪ {w_i > δ}.
//! * **Training.** Two networks co-teach: each one is trained with the
//!   division and soft labels computed by the other. Clean pairs train with
//!   `L_soft` (label 1) plus `L_ESC = [(s_pi − s_ip)² − α2]+` against their
//!   pseudo-negative `p = argmax_{j≠i, j clean} S(I_j, T_i)`; noisy pairs train
//!   with `L_soft` and their BiCro soft label ŷ.
//!
//! Schedule: warm-up on all pairs with the per-sample hinge, then
//! `clean_only_epochs` epochs on the clean set only, then the remaining epochs
//! on clean and noisy sets together.
//!
//! Scoring (`fit`'s labels and `ncclean score`): `l_div` of every pair is
//! computed per network in fixed shuffled batches (`division_shuffles`
//! shuffles from the stream `score-shuffles`, the same batches for both
//! networks), averaged over shuffles and over the two networks, and mapped
//! through the mixture fitted in `finalize` to `clean_prob`. `soft_label` is 1
//! for the clean set (an anchor in some scoring batch, or `clean_prob > δ`)
//! and the rectified BiCro label otherwise; it is computed once from the
//! scored data (there is no label history for new data).
//!
//! # Departures from the paper
//!
//! * **Matching model.** The paper uses SGRAF on Faster-RCNN regions and a
//!   Bi-GRU; ncclean uses its own towers and a cosine similarity of joint
//!   embeddings.
//! * **`l_hard` in the division** is the NCR per-sample form (mean over all
//!   in-batch negatives, METHODS.md section 0), not the paper's hardest-negative
//!   Eq. (1), because the spec prescribes it for every division; warm-up uses
//!   the same loss.
//! * **BiCro features.** The cosines `C^v`, `C^t` are those of the pooled
//!   tower features before the matching head
//!   ([`ncclean_models::MatchingModel::pooled_images`]): a frozen backbone's
//!   pooled vector (MobileNetV2, CLIP, MiniLM), or the demo towers' pooled
//!   grid / mean word vector. The paper's SGRAF has pooled encoder features
//!   of its own; a cosine head has only the joint space, and labels from the
//!   joint space do not separate anything: on Flickr8k at 50% noise they put
//!   the noisy set's truly mismatched pairs at a median ŷ of 0.68 (98% above
//!   the 0.5 floor), where the paper expects "close to 0"; from the pooled
//!   backbone features 98% of them get 0.
//! * **BiCro ratio with non-positive cosines.** `min(C^v/C^t, C^t/C^v)` is
//!   only a degree of agreement when both cosines are positive; when either is
//!   ≤ 1e-6 the ratio is taken as 0 (BiCro leaves this case undefined).
//! * **Where soft labels come from.** They are computed in the division pass
//!   (the other network's embeddings, shuffled batches of the training batch
//!   size, the `⌊B·anchor_fraction⌋+1` lowest-hinge pairs of each batch as
//!   BiCro anchors), not inside each training batch; the raw ratio label is
//!   averaged over the `division_shuffles` shuffles before clamping and the
//!   `≤ label_floor → 0` rule. Anchors of the ESC division are clean in any
//!   shuffle in which they were the anchor.
//! * **Monotone clean posterior.** `w_i` (training) and `clean_prob`
//!   (scoring) are the BMM posterior of the low-loss component made
//!   non-increasing in `l_div` ([`crate::division::Division::clean_prob`], shared by every
//!   method). The paper takes the raw posterior; on the demo data the fitted
//!   clean Beta is much narrower than the noisy one, so the raw posterior
//!   drops again for the lowest losses (AUROC 0.95 for `l_div`, 0.88 for the
//!   raw posterior), and at 50% noise on Flickr8k the clean Beta was the
//!   broad one and called every pair clean after warm-up.
//! * **Loss reduction.** Per-pair losses are averaged over the batch (not
//!   summed as in the released NCR-family code), matching the other ncclean
//!   pipelines' learning-rate scale.
//! * **Frozen features.** Two things the paper's schedule does on SGRAF hurt
//!   a cosine head over frozen features, so `examples/configs/flickr8k.toml`
//!   changes them (the preset keeps the paper's): the BMM's moment fit calls
//!   86–95% of the pairs clean at 50% noise (a GMM: 56–63%), and the
//!   all-pairs phase, which trains mismatched pairs as positives with a zero
//!   margin, turns their captions into hubs (image→text R@1 collapses).
//!   BENCHMARKS.md measures both.
//! * **Scoring metadata.** The engine's `division_statistic` metadata line
//!   describes the per-sample hinge generically; for ESC the statistic is
//!   `l_div` as above.

use candle_core::Tensor;
use ncclean_models::{ImageInputs, ModelConfig, PairInputs, TextInputs};
use serde::{Deserialize, Serialize};

use crate::batch_stats::{self, Square};
use crate::clean_model::null::NullSink;
use crate::config::TrainConfig;
use crate::division::CleanSide;
use crate::error::{Error, Result};
use crate::frozen_rows::{to_anchors, FrozenRows};
use crate::losses::soft_margin_hinge;
use crate::method::{Batch, EpochCtx, Method, PairArray, Plan, ScoreCtx};
use crate::net::Net;
use crate::params::{non_negative, unit_interval};
use crate::pipeline::PairScores;
use crate::scoring::{
    batch_of, divide, mean_of, pair_similarity, par_map, shuffled_batch_list, Shuffles, Ticks,
    PAR_WINDOW,
};
use crate::streams::EMBED_CHUNK;
/// Cosines at or below this carry no usable ratio (see the departures).
const RATIO_EPS: f32 = 1e-6;

/// ESC's method parameters (the `[params]` table of the preset).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EscParams {
    /// β: weight of the division regulariser in `l_div = l_hard + β l_ESC`.
    pub beta: f64,
    /// α1: division margin of `l_ESC`.
    pub alpha1: f64,
    /// α2: matching margin of the training term `L_ESC`.
    pub alpha2: f64,
    /// Epochs after warm-up that train on the clean set only; the rest train
    /// on clean and noisy sets.
    pub clean_only_epochs: usize,
    /// BiCro anchors per division batch: `⌊B · anchor_fraction⌋ + 1`.
    pub anchor_fraction: f64,
    /// Rectified labels at or below this become 0.
    pub label_floor: f64,
}

impl EscParams {
    fn validate(&self) -> Result<()> {
        non_negative("beta", self.beta)?;
        non_negative("alpha1", self.alpha1)?;
        non_negative("alpha2", self.alpha2)?;
        unit_interval("anchor_fraction", self.anchor_fraction)?;
        unit_interval("label_floor", self.label_floor)
    }

    /// Number of BiCro anchors in a batch of `b` pairs: `⌊b·f⌋ + 1`, at most `b`.
    pub fn bicro_anchors(&self, b: usize) -> usize {
        ((b as f64 * self.anchor_fraction).floor() as usize + 1).min(b)
    }
}

/// Index of the ESC anchor of a batch, `argmax_i S_ii` (first on ties);
/// `None` for an empty batch.
pub fn esc_anchor(s: &[Vec<f32>]) -> Option<usize> {
    let mut best: Option<(usize, f32)> = None;
    for (i, row) in s.iter().enumerate() {
        let d = row[i];
        if best.is_none_or(|(_, v)| d > v) {
            best = Some((i, d));
        }
    }
    best.map(|(i, _)| i)
}

/// Division regulariser `l_ESC(i) = [(S_ai − S_ia)² − α1]+` against the
/// batch anchor `a`; the anchor's own value is 0. Returns it with the anchor.
pub fn division_regulariser(s: &[Vec<f32>], alpha1: f64) -> (Vec<f32>, Option<usize>) {
    let Some(a) = esc_anchor(s) else {
        return (Vec::new(), None);
    };
    let l = (0..s.len())
        .map(|i| {
            if i == a {
                0.0
            } else {
                let d = (s[a][i] - s[i][a]) as f64;
                (d * d - alpha1).max(0.0) as f32
            }
        })
        .collect();
    (l, Some(a))
}

/// `l_div = l_hard + β l_ESC` of every pair of one batch, with the per-sample
/// hinge `l_hard` and the anchor.
pub struct BatchDivision {
    /// `l_hard + β l_ESC` per pair.
    pub l_div: Vec<f32>,
    /// The NCR per-sample hinge per pair.
    pub hinge: Vec<f32>,
    /// The ESC anchor (`argmax S_ii`).
    pub anchor: Option<usize>,
}

/// The division loss of one batch similarity matrix.
pub fn division_loss(s: &Square, margin: f64, beta: f64, alpha1: f64) -> BatchDivision {
    let hinge = batch_stats::hinge(s, margin);
    let (reg, anchor) = division_regulariser(&s.rows(), alpha1);
    let l_div = hinge
        .iter()
        .zip(&reg)
        .map(|(h, r)| h + (beta as f32) * r)
        .collect();
    BatchDivision {
        l_div,
        hinge,
        anchor,
    }
}

/// BiCro's ratio `min(a/b, b/a)`; 0 when either cosine is not positive.
pub fn similarity_ratio(a: f32, b: f32) -> f32 {
    if a <= RATIO_EPS || b <= RATIO_EPS {
        0.0
    } else {
        (a / b).min(b / a)
    }
}

/// The BiCro anchors of a batch: the `n_anchors` pairs with the lowest
/// hinge, lowest first (a stable sort: ties keep batch order, so the choice
/// is deterministic).
pub fn bicro_anchor_set(hinge: &[f32], n_anchors: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..hinge.len()).collect();
    order.sort_by(|&x, &y| hinge[x].total_cmp(&hinge[y]));
    order.truncate(n_anchors.min(hinge.len()));
    order
}

/// Raw BiCro soft labels of one batch, before clamping: the `anchors` (from
/// [`bicro_anchor_set`]) get label 1; every other pair i takes its nearest
/// anchor by image cosine `k_v` and by caption cosine `k_t` and gets
/// `(r(k_v) + r(k_t)) / 2` with `r(k) = min(C^v_ik/C^t_ik, C^t_ik/C^v_ik)`.
/// `cv[i][a]`/`ct[i][a]` are the image–image and caption–caption cosines of
/// pair i with anchor `anchors[a]`: only these columns of the in-batch
/// cosine matrices are needed (B×A instead of B×B, a tenth of the work).
pub fn bicro_raw_labels(anchors: &[usize], cv: &[Vec<f32>], ct: &[Vec<f32>]) -> Vec<f32> {
    // The first maximum in anchor order, as a column of `row`.
    let argmax_over = |row: &[f32]| -> Option<usize> {
        let mut best: Option<usize> = None;
        for a in 0..anchors.len() {
            if best.is_none_or(|ba| row[a] > row[ba]) {
                best = Some(a);
            }
        }
        best
    };
    (0..cv.len())
        .map(|i| {
            if anchors.contains(&i) {
                return 1.0;
            }
            let (Some(kv), Some(kt)) = (argmax_over(&cv[i]), argmax_over(&ct[i])) else {
                // No anchors at all: no evidence either way, so the label rule
                // will send it to 0 like any unsupported pair.
                return 0.0;
            };
            let rv = similarity_ratio(cv[i][kv], ct[i][kv]);
            let rt = similarity_ratio(cv[i][kt], ct[i][kt]);
            (rv + rt) / 2.0
        })
        .collect()
}

/// The label rule: clamp to [0, 1]; at or below `floor` becomes 0.
pub fn rectify_label(raw: f32, floor: f64) -> f32 {
    let y = if raw.is_finite() {
        raw.clamp(0.0, 1.0)
    } else {
        0.0
    };
    if f64::from(y) <= floor {
        0.0
    } else {
        y
    }
}

/// Per-pair training plan from one network's division: the clean set is the
/// anchors plus pairs with `w_i > δ`; clean pairs are labelled 1, the others
/// their rectified soft label. Returns `(clean, labels)`.
pub fn plan_labels(
    w: &[f32],
    anchor: &[bool],
    raw: &[f32],
    delta: f64,
    floor: f64,
) -> (Vec<bool>, Vec<f32>) {
    let clean: Vec<bool> = w
        .iter()
        .zip(anchor)
        .map(|(&p, &a)| a || f64::from(p) > delta)
        .collect();
    let labels = clean
        .iter()
        .zip(raw)
        .map(|(&c, &r)| if c { 1.0 } else { rectify_label(r, floor) })
        .collect();
    (clean, labels)
}

/// Pseudo-negative of every clean pair i: `p = argmax_{j≠i, j clean} S(I_j, T_i)`
/// (first on ties). Noisy pairs, and clean pairs without another clean pair in
/// the batch, get `None`.
pub fn pseudo_negatives(s: &[Vec<f32>], clean: &[bool]) -> Vec<Option<usize>> {
    let b = s.len();
    (0..b)
        .map(|i| {
            if !clean[i] {
                return None;
            }
            let mut best: Option<usize> = None;
            for j in (0..b).filter(|&j| j != i && clean[j]) {
                if best.is_none_or(|bj| s[j][i] > s[bj][i]) {
                    best = Some(j);
                }
            }
            best
        })
        .collect()
}

/// Training regulariser `L_ESC(i) = [(S_pi − S_ip)² − α2]+` per pair, with
/// gradients through `s`; 0 where `pseudo[i]` is `None`.
pub fn esc_training_term(
    s: &Tensor,
    pseudo: &[Option<usize>],
    alpha2: f64,
) -> candle_core::Result<Tensor> {
    let b = s.dim(0)?;
    let mut pi = Vec::with_capacity(b);
    let mut ip = Vec::with_capacity(b);
    let mut mask = Vec::with_capacity(b);
    for (i, p) in pseudo.iter().enumerate() {
        // Pairs without a pseudo-negative read S_ii twice; the mask zeroes them.
        let p = p.unwrap_or(i);
        pi.push((p * b + i) as u32);
        ip.push((i * b + p) as u32);
        mask.push(if pseudo[i].is_some() { 1f32 } else { 0.0 });
    }
    let flat = s.flatten_all()?;
    let dev = s.device();
    let s_pi = flat.index_select(&Tensor::from_vec(pi, b, dev)?, 0)?;
    let s_ip = flat.index_select(&Tensor::from_vec(ip, b, dev)?, 0)?;
    let term = ((s_pi - s_ip)?.sqr()? - alpha2)?.relu()?;
    term * Tensor::from_vec(mask, b, dev)?.to_dtype(s.dtype())?
}

/// Per-pair training loss of one batch: `L_soft` with `labels` for every pair
/// plus `L_ESC` for the clean ones, averaged over the batch.
pub fn batch_loss(
    s: &Tensor,
    labels: &[f32],
    clean: &[bool],
    cfg: &TrainConfig,
    params: &EscParams,
) -> candle_core::Result<Tensor> {
    let y = Tensor::from_vec(labels.to_vec(), labels.len(), s.device())?.to_dtype(s.dtype())?;
    let soft = soft_margin_hinge(s, &y, cfg.margin, cfg.soft_margin_m)?;
    // Pseudo-negatives are a selection, not a quantity to differentiate.
    let rows: Vec<Vec<f32>> = s.detach().to_vec2()?;
    let pseudo = pseudo_negatives(&rows, clean);
    let esc = esc_training_term(s, &pseudo, params.alpha2)?;
    (soft + esc)?.mean_all()
}

/// One network's (or both networks' averaged) division statistics over a
/// whole dataset: a scoring pass.
#[derive(Debug, Clone, Default)]
pub struct EscPass {
    /// `l_div`, averaged over shuffles.
    l_div: Vec<f32>,
    /// Whether the pair was the ESC anchor of some batch.
    anchor: Vec<bool>,
    /// BiCro raw labels, averaged over shuffles.
    raw_label: Vec<f32>,
    /// `S_ii`.
    similarity: Vec<f32>,
}

/// The division one network hands to the other for an epoch.
#[derive(Debug, Clone, Default)]
struct NetPlan {
    clean: Vec<bool>,
    labels: Vec<f32>,
}

/// The ESC method: two co-taught networks.
pub struct Esc {
    params: EscParams,
    /// The division each network trains with this epoch (computed by the
    /// other network).
    plans: [NetPlan; 2],
}

/// `l_div`, ESC anchors and BiCro raw labels of every pair under each of
/// `nets`, in the same shuffled batches of the training batch size (drawn
/// once from `order`).
///
/// Phases: each network's embeddings and [`division_pass`], then the
/// BiCro labels of every batch under every network ([`add_raw_labels`]),
/// then the average over shuffles. Each network's caption embeddings go
/// to `null` (scoring with a caption null, [`ScoreCtx::caption_null`]).
fn nets_stats(
    nets: &[&Net],
    data: &PairInputs,
    cfg: &TrainConfig,
    params: &EscParams,
    (order, null): (Shuffles, Option<&NullSink>),
) -> Result<Vec<EscPass>> {
    let n = data.len();
    let ranges = order.ranges(n);
    let ticks = order.ticks();
    let shuffles = cfg.division_shuffles.max(1);
    let batches = shuffled_batch_list(n, cfg.batch_size, shuffles, order)?;
    let (_, image_of) = data.images.distinct();
    let mut passes = Vec::with_capacity(nets.len());
    // Per network, per batch: its BiCro anchors, lowest hinge first.
    let mut anchor_sets: Vec<Vec<Vec<usize>>> = Vec::with_capacity(nets.len());
    for (k, net) in nets.iter().enumerate() {
        let (vi, vt) = net.embed_ranges_with(data, &ranges, EMBED_CHUNK, &image_of)?;
        if let Some(sink) = null {
            sink.add(k, &vt)?;
        }
        ticks.add(n);
        let (st, sets) = division_pass(n, (&vi, &vt), &batches, cfg, params, ticks)?;
        passes.push(st);
        anchor_sets.push(sets);
    }
    add_raw_labels(&mut passes, nets, data, &batches, &anchor_sets, ticks)?;
    let inv = 1.0 / shuffles as f32;
    for st in &mut passes {
        st.l_div.iter_mut().for_each(|v| *v *= inv);
        st.raw_label.iter_mut().for_each(|v| *v *= inv);
    }
    Ok(passes)
}

/// One network's division statistics over `batches` of its embeddings of
/// the `n` pairs, `(vi, vt)`: `l_div` summed over shuffles, the ESC anchors
/// and the similarity (raw labels still 0), and each batch's BiCro anchors.
fn division_pass(
    n: usize,
    (vi, vt): (&Tensor, &Tensor),
    batches: &[Vec<usize>],
    cfg: &TrainConfig,
    params: &EscParams,
    ticks: Ticks<'_>,
) -> Result<(EscPass, Vec<Vec<usize>>)> {
    let mut st = EscPass {
        l_div: vec![0.0; n],
        anchor: vec![false; n],
        raw_label: vec![0.0; n],
        similarity: pair_similarity(vi, vt)?,
    };
    let mut sets = Vec::with_capacity(batches.len());
    for window in batches.chunks(PAR_WINDOW) {
        let divs = par_map(window, |b| {
            let batch = batch_of(vi, vt, b)?;
            Ok(division_loss(
                &batch.s,
                cfg.margin,
                params.beta,
                params.alpha1,
            ))
        })?;
        for (b, div) in window.iter().zip(divs) {
            for (j, &i) in b.iter().enumerate() {
                st.l_div[i] += div.l_div[j];
            }
            if let Some(a) = div.anchor {
                st.anchor[b[a]] = true;
            }
            sets.push(bicro_anchor_set(&div.hinge, params.bicro_anchors(b.len())));
        }
        ticks.add(window.iter().map(Vec::len).sum());
    }
    Ok((st, sets))
}

/// Add to each of `passes` (one per network of `nets`) the BiCro raw
/// labels of every pair in every batch, from the network's `anchor_sets`.
fn add_raw_labels(
    passes: &mut [EscPass],
    nets: &[&Net],
    data: &PairInputs,
    batches: &[Vec<usize>],
    anchor_sets: &[Vec<Vec<usize>>],
    ticks: Ticks<'_>,
) -> Result<()> {
    // BiCro compares pairs by their pooled tower features, not by the joint
    // space the noisy pairs are shaping. A frozen tower's pooled feature is
    // its cached vector, the same for every network: gathered once per batch,
    // with one product against the union of the networks' anchors.
    let frozen = match (&data.images, &data.texts) {
        (
            ImageInputs::Embeddings {
                data: img, dim: di, ..
            },
            TextInputs::Embeddings {
                data: txt, dim: dt, ..
            },
        ) => Some((FrozenRows::new(img, *di), FrozenRows::new(txt, *dt))),
        _ => None,
    };
    let raw_labels = |t: usize| -> candle_core::Result<Vec<Vec<f32>>> {
        let b = &batches[t];
        let sets: Vec<&[usize]> = anchor_sets.iter().map(|s| s[t].as_slice()).collect();
        if let Some((img, txt)) = &frozen {
            let mut union: Vec<usize> = sets.concat();
            union.sort_unstable();
            union.dedup();
            let dev = nets[0].device();
            let (pi, pt) = (img.unit_rows(b, dev)?, txt.unit_rows(b, dev)?);
            let (cv, ct) = (to_anchors(&pi, &union)?, to_anchors(&pt, &union)?);
            Ok(sets
                .iter()
                .map(|set| {
                    let cols: Vec<usize> = set
                        .iter()
                        .map(|a| union.binary_search(a).unwrap_or_default())
                        .collect();
                    let pick = |m: &[Vec<f32>]| -> Vec<Vec<f32>> {
                        m.iter()
                            .map(|row| cols.iter().map(|&c| row[c]).collect())
                            .collect()
                    };
                    bicro_raw_labels(set, &pick(&cv), &pick(&ct))
                })
                .collect())
        } else {
            nets.iter()
                .zip(&sets)
                .map(|(net, set)| {
                    let (pi, pt) = net.batch_pooled(data, b)?;
                    Ok(bicro_raw_labels(
                        set,
                        &to_anchors(&pi, set)?,
                        &to_anchors(&pt, set)?,
                    ))
                })
                .collect()
        }
    };
    let ts: Vec<usize> = (0..batches.len()).collect();
    for window in ts.chunks(PAR_WINDOW) {
        let raws = par_map(window, |&t| raw_labels(t))?;
        for (&t, per_net) in window.iter().zip(raws) {
            for (st, raw) in passes.iter_mut().zip(per_net) {
                for (j, &i) in batches[t].iter().enumerate() {
                    st.raw_label[i] += raw[j];
                }
            }
        }
        ticks.add(window.iter().map(|&t| batches[t].len()).sum());
    }
    Ok(())
}

impl Esc {
    /// Net `k`'s division of the training data, used to train the other net.
    fn plan_from(&self, k: usize, ctx: &EpochCtx) -> Result<NetPlan> {
        let mut rng = ctx.streams.division(ctx.epoch, k);
        let st = nets_stats(
            &[&ctx.nets[k]],
            ctx.data,
            ctx.cfg,
            &self.params,
            ((&mut rng).into(), None),
        )?
        .remove(0);
        let w = divide(&st.l_div, ctx.cfg, CleanSide::LowMean);
        let (clean, labels) = plan_labels(
            &w,
            &st.anchor,
            &st.raw_label,
            ctx.cfg.threshold,
            self.params.label_floor,
        );
        Ok(NetPlan { clean, labels })
    }
}

impl Method for Esc {
    const NAME: &'static str = "esc";
    type Pass = EscPass;

    fn new(cfg: &TrainConfig, _model: &ModelConfig) -> Result<Self> {
        let params: EscParams = cfg.method_params("esc").map_err(Error::Config)?;
        params.validate()?;
        Ok(Esc {
            params,
            plans: Default::default(),
        })
    }

    fn networks(&self) -> usize {
        2
    }

    fn plan(&mut self, ctx: &mut EpochCtx) -> Result<Plan> {
        let n = ctx.data.len();
        let clean_only = ctx.epoch < ctx.cfg.warmup_epochs + self.params.clean_only_epochs;
        // Co-teaching: net k trains on the division computed by net 1−k.
        self.plans = [self.plan_from(1, ctx)?, self.plan_from(0, ctx)?];
        let train = self
            .plans
            .iter()
            .map(|p| {
                (0..n)
                    .filter(|&i| !clean_only || p.clean[i])
                    .collect::<Vec<_>>()
            })
            .collect();
        let clean_fraction = self
            .plans
            .iter()
            .map(|p| p.clean.iter().filter(|&&c| c).count() as f64 / n.max(1) as f64)
            .sum::<f64>()
            / 2.0;
        Ok(Plan {
            train,
            phase: if clean_only { "clean" } else { "all" }.into(),
            clean_fraction: Some(clean_fraction),
        })
    }

    fn batch_loss(&mut self, b: &Batch) -> Result<Tensor> {
        let p = &self.plans[b.k];
        let s = b.net.batch_similarity(b.data, b.idx)?;
        let y: Vec<f32> = b.idx.iter().map(|&i| p.labels[i]).collect();
        let c: Vec<bool> = b.idx.iter().map(|&i| p.clean[i]).collect();
        Ok(batch_loss(&s, &y, &c, b.cfg, &self.params)?)
    }

    fn clean_side(&self) -> CleanSide {
        CleanSide::LowMean
    }

    /// Each network's embedding and shuffled batchings, then BiCro's raw
    /// labels over the same batchings once for both.
    fn score_passes(&self, cfg: &TrainConfig, networks: usize) -> usize {
        let shuffles = cfg.division_shuffles.max(1);
        networks * (1 + shuffles) + shuffles
    }

    /// Both networks' statistics on the same fixed batches, averaged.
    fn score_pass(&self, ctx: &ScoreCtx) -> Result<EscPass> {
        let nets: Vec<&Net> = ctx.nets.iter().collect();
        let mut stats = nets_stats(
            &nets,
            ctx.data,
            ctx.cfg,
            &self.params,
            (ctx.shuffles(), ctx.null),
        )?;
        if stats.len() != 2 {
            return Err(Error::State(format!(
                "esc scores with 2 networks, the checkpoint holds {}",
                stats.len()
            )));
        }
        let (b, a) = (stats.remove(1), stats.remove(0));
        let anchor = a.anchor.iter().zip(&b.anchor).map(|(p, q)| *p || *q);
        Ok(EscPass {
            l_div: mean_of(&[a.l_div, b.l_div]),
            anchor: anchor.collect(),
            raw_label: mean_of(&[a.raw_label, b.raw_label]),
            similarity: mean_of(&[a.similarity, b.similarity]),
        })
    }

    fn statistic(pass: &EscPass) -> &[f32] {
        &pass.l_div
    }

    fn scores(&self, pass: EscPass, clean_prob: Vec<f32>, cfg: &TrainConfig) -> PairScores {
        let (_, soft_label) = plan_labels(
            &clean_prob,
            &pass.anchor,
            &pass.raw_label,
            cfg.threshold,
            self.params.label_floor,
        );
        PairScores {
            clean_prob,
            soft_label,
            similarity: pass.similarity,
            statistic: pass.l_div,
        }
    }

    fn state(&self) -> serde_json::Value {
        serde_json::json!({
            "params": self.params,
            "division_statistic": "l_div = l_hard + beta * l_ESC in shuffled batches, averaged over division_shuffles and both networks; mixture posterior made monotone in the loss",
        })
    }

    fn pair_arrays(&mut self) -> Vec<(String, PairArray<'_>)> {
        let per_net = self.plans.iter_mut().enumerate().flat_map(|(k, p)| {
            [
                (format!("labels_net{k}"), PairArray::Values(&mut p.labels)),
                (format!("clean_net{k}"), PairArray::Flags(&mut p.clean)),
            ]
        });
        per_net.collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::losses::per_sample_hinge;
    use crate::test_support::close;
    use candle_core::Device;
    use candle_core::Var;

    // S (image i, caption j):
    //   [[0.9, 0.5, 0.1, 0.3],
    //    [0.2, 0.3, 0.6, 0.0],
    //    [0.4, 0.0, 0.8, 0.2],
    //    [0.7, 0.1, 0.5, 0.6]]
    fn s4() -> Vec<Vec<f32>> {
        vec![
            vec![0.9, 0.5, 0.1, 0.3],
            vec![0.2, 0.3, 0.6, 0.0],
            vec![0.4, 0.0, 0.8, 0.2],
            vec![0.7, 0.1, 0.5, 0.6],
        ]
    }

    fn t4() -> Tensor {
        Tensor::new(s4(), &Device::Cpu).unwrap()
    }

    fn params() -> EscParams {
        EscParams {
            beta: 0.5,
            alpha1: 0.0,
            alpha2: 0.0,
            clean_only_epochs: 1,
            anchor_fraction: 0.1,
            label_floor: 0.5,
        }
    }

    #[test]
    fn division_regulariser_hand_computed() {
        // diag = [0.9, 0.3, 0.8, 0.6] → anchor a = 0.
        // i=1: (S01 − S10)² = (0.5 − 0.2)² = 0.09
        // i=2: (S02 − S20)² = (0.1 − 0.4)² = 0.09
        // i=3: (S03 − S30)² = (0.3 − 0.7)² = 0.16
        let (l, a) = division_regulariser(&s4(), 0.0);
        assert_eq!(a, Some(0));
        close(&l, &[0.0, 0.09, 0.09, 0.16]);
        // α1 = 0.1: [0.09 − 0.1]+ = 0, [0.16 − 0.1]+ = 0.06
        let (l, _) = division_regulariser(&s4(), 0.1);
        close(&l, &[0.0, 0.0, 0.0, 0.06]);
        assert_eq!(division_regulariser(&[], 0.0).1, None);
    }

    #[test]
    fn division_loss_hand_computed() -> Result<()> {
        // l_hard (α = 0.2), rows = caption negatives, cols = image negatives:
        // i=0 (0.9): rows 0.5,0.1,0.3 → all < 0.7 → 0; cols 0.2,0.4,0.7 → [0.0]+ → 0
        // i=1 (0.3): rows 0.2,0.6,0.0 → 0.1,0.5,0 → mean 0.2;
        //            cols 0.5,0.0,0.1 → 0.4,0,0 → mean 0.133333 → 0.333333
        // i=2 (0.8): rows 0.4,0.0,0.2 → 0; cols 0.1,0.6,0.5 → 0 → 0
        // i=3 (0.6): rows 0.7,0.1,0.5 → 0.3,0,0.1 → mean 0.133333; cols 0.3,0.0,0.2 → 0
        // l_div = l_hard + 0.5·[0, 0.09, 0.09, 0.16]
        //       = [0, 0.378333, 0.045, 0.213333]
        let d = division_loss(&Square::from_tensor(&t4())?, 0.2, 0.5, 0.0);
        close(&d.hinge, &[0.0, 1.0 / 3.0, 0.0, 0.4 / 3.0]);
        close(&d.l_div, &[0.0, 1.0 / 3.0 + 0.045, 0.045, 0.4 / 3.0 + 0.08]);
        assert_eq!(d.anchor, Some(0));
        Ok(())
    }

    #[test]
    fn bicro_labels_hand_computed() {
        // hinge = [0.05, 0.4, 0.01, 0.2], two anchors → pairs 2 and 0 (lowest).
        // pair 1: C^v to anchors {0: 0.2, 2: 0.8} → k_v = 2, C^v = 0.8, C^t = 0.7
        //         → r_v = 0.7/0.8 = 0.875; C^t to anchors {0: 0.1, 2: 0.7} → k_t = 2 → r_t = 0.875
        //         → 0.875
        // pair 3: C^v {0: 0.6, 2: 0.3} → k_v = 0: C^v 0.6, C^t 0.3 → 0.5;
        //         C^t {0: 0.3, 2: 0.45} → k_t = 2: C^v 0.3, C^t 0.45 → 0.666667
        //         → (0.5 + 0.666667)/2 = 0.583333
        let hinge = [0.05f32, 0.4, 0.01, 0.2];
        let cv = vec![
            vec![1.0f32, 0.2, 0.5, 0.6],
            vec![0.2, 1.0, 0.8, 0.4],
            vec![0.5, 0.8, 1.0, 0.3],
            vec![0.6, 0.4, 0.3, 1.0],
        ];
        let ct = vec![
            vec![1.0f32, 0.1, 0.4, 0.3],
            vec![0.1, 1.0, 0.7, 0.9],
            vec![0.4, 0.7, 1.0, 0.45],
            vec![0.3, 0.9, 0.45, 1.0],
        ];
        // The cosines to the anchors: columns of the full matrices.
        let labels = |n: usize| {
            let anchors = bicro_anchor_set(&hinge, n);
            let cols = |m: &[Vec<f32>]| -> Vec<Vec<f32>> {
                m.iter()
                    .map(|row| anchors.iter().map(|&a| row[a]).collect())
                    .collect()
            };
            bicro_raw_labels(&anchors, &cols(&cv), &cols(&ct))
        };
        assert_eq!(bicro_anchor_set(&hinge, 2), vec![2, 0]);
        close(&labels(2), &[1.0, 0.875, 1.0, 0.7 / 1.2]);
        // One anchor (pair 2): pair 0 → C^v 0.5, C^t 0.4 → 0.8 both ways.
        close(&labels(1)[..1], &[0.8]);
        // No anchors: no evidence, label 0.
        assert_eq!(labels(0), vec![0.0; 4]);
        // Ratio rule with signs: a non-positive cosine gives no agreement.
        assert_eq!(similarity_ratio(0.5, -0.2), 0.0);
        assert!((similarity_ratio(0.2, 0.5) - 0.4).abs() < 1e-6);
        // ⌊B/10⌋ + 1 anchors.
        assert_eq!(params().bicro_anchors(128), 13);
        assert_eq!(params().bicro_anchors(4), 1);
    }

    #[test]
    fn label_rule_clamps_and_floors() {
        close(
            &[0.5, 0.51, 1.3, -0.2, f32::NAN].map(|r| rectify_label(r, 0.5)),
            &[0.0, 0.51, 1.0, 0.0, 0.0],
        );
        // w = [0.9, 0.2, 0.3, 0.6], pair 2 is an anchor, δ = 0.5
        // → clean = [T, F, T, T]; the noisy pair keeps its rectified raw label 0.7.
        let (clean, labels) = plan_labels(
            &[0.9, 0.2, 0.3, 0.6],
            &[false, false, true, false],
            &[0.4, 0.7, 0.1, 0.2],
            0.5,
            0.5,
        );
        assert_eq!(clean, vec![true, false, true, true]);
        close(&labels, &[1.0, 0.7, 1.0, 1.0]);
    }

    #[test]
    fn pseudo_negatives_and_training_term_hand_computed() -> Result<()> {
        // clean = [T, T, F, T]; p_i = argmax over clean j≠i of S[j][i]:
        // i=0: S10 = 0.2, S30 = 0.7 → 3;  i=1: S01 = 0.5, S31 = 0.1 → 0;
        // i=2: noisy → none;              i=3: S03 = 0.3, S13 = 0.0 → 0.
        let clean = [true, true, false, true];
        let p = pseudo_negatives(&s4(), &clean);
        assert_eq!(p, vec![Some(3), Some(0), None, Some(0)]);
        // L_ESC: i=0: (S30 − S03)² = 0.16; i=1: (S01 − S10)² = 0.09; i=3: (S03 − S30)² = 0.16
        let var = Var::from_tensor(&t4())?;
        let l = esc_training_term(var.as_tensor(), &p, 0.0)?;
        close(&l.to_vec1::<f32>()?, &[0.16, 0.09, 0.0, 0.16]);
        // Gradient of the sum: d/dS_pi = 2(S_pi − S_ip), d/dS_ip = −2(S_pi − S_ip)
        // i=0: dS30 += 0.8, dS03 −= 0.8; i=1: dS01 += 0.6, dS10 −= 0.6;
        // i=3: dS03 += −0.8, dS30 −= −0.8  → dS30 = 1.6, dS03 = −1.6
        let g = l.sum_all()?.backward()?;
        let g: Vec<Vec<f32>> = g
            .get(var.as_tensor())
            .expect("gradient reaches S")
            .to_vec2()?;
        let mut want = vec![vec![0f32; 4]; 4];
        want[3][0] = 1.6;
        want[0][3] = -1.6;
        want[0][1] = 0.6;
        want[1][0] = -0.6;
        for (gr, wr) in g.iter().zip(&want) {
            close(gr, wr);
        }
        // α2 = 0.1 → [0.06, 0, 0, 0.06]
        close(
            &esc_training_term(&t4(), &p, 0.1)?.to_vec1::<f32>()?,
            &[0.06, 0.0, 0.0, 0.06],
        );
        // A lone clean pair has no pseudo-negative.
        assert_eq!(
            pseudo_negatives(&s4(), &[true, false, false, false]),
            vec![None; 4]
        );
        Ok(())
    }

    fn tiny() -> (ModelConfig, PairInputs) {
        let cfg = crate::test_support::precomputed_model(3, 4, 8);
        let data = crate::test_support::embedding_pairs(
            vec![1., 0., 0., 0., 1., 0., 0., 0., 1., 1., 1., 0.],
            vec![0., 1., 0., 0., 0., 1., 1., 0., 0., 0., 1., 1.],
            3,
        );
        (cfg, data)
    }

    fn train_cfg() -> TrainConfig {
        let mut t =
            crate::presets::resolve("esc", None, &toml::Table::new()).expect("preset parses");
        t.batch_size = 4;
        t
    }

    #[test]
    fn training_loss_reaches_every_parameter() -> Result<()> {
        let (mcfg, data) = tiny();
        let net = Net::new(&mcfg, 3, &Device::Cpu, 1e-3, 2.0)?;
        let idx = [0, 1, 2, 3];
        let s = net.batch_similarity(&data, &idx)?;
        let loss = batch_loss(
            &s,
            &[1.0, 1.0, 0.7, 1.0],
            &[true, true, false, true],
            &train_cfg(),
            &params(),
        )?;
        let grads = loss.backward()?;
        for v in net.varmap().all_vars() {
            let g = grads
                .get(v.as_tensor())
                .expect("every parameter gets a gradient");
            let norm: f32 = g.sqr()?.sum_all()?.to_scalar()?;
            assert!(norm.is_finite(), "non-finite gradient");
        }
        Ok(())
    }

    #[test]
    fn networks_scored_together_equal_each_scored_alone() -> Result<()> {
        // The scoring pass evaluates both networks on the same batches and
        // compares BiCro cosines against the union of their anchors; each
        // network's statistics must be what it gets on its own.
        use crate::runner::Runner;
        let mut r = ncclean_models::rng::Rng::new(5);
        let mut v = |n: usize| (0..n).map(|_| r.normal() as f32).collect::<Vec<_>>();
        let data = crate::test_support::embedding_pairs(v(300 * 6), v(300 * 6), 6);
        let mcfg = crate::test_support::precomputed_model(6, 4, 8);
        let mut cfg = train_cfg();
        cfg.batch_size = 32;
        let p = Runner::<Esc>::new(cfg.clone(), &mcfg, 0, &Device::Cpu)?;
        let nets = p.networks();
        let stats = |ns: &[&Net]| {
            let mut rng = ncclean_models::rng::Rng::new(9);
            nets_stats(ns, &data, &cfg, &params(), ((&mut rng).into(), None))
        };
        let both = stats(&[&nets[0], &nets[1]])?;
        for (k, net) in nets.iter().enumerate() {
            let alone = stats(&[net])?.remove(0);
            close(&both[k].l_div, &alone.l_div);
            close(&both[k].raw_label, &alone.raw_label);
            assert_eq!(both[k].anchor, alone.anchor);
        }
        // The networks differ, so the union held anchors of both.
        assert_ne!(both[0].l_div, both[1].l_div);
        Ok(())
    }

    #[test]
    fn bicro_labels_compare_pairs_by_pooled_tower_features() -> Result<()> {
        // tiny(): images e0, e1, e2, (e0+e1)/√2; captions e1, e2, e0, (e1+e2)/√2.
        // Precomputed towers pool to these unit vectors, so the only non-zero
        // intra-modal cosines are with pair 3: C^v = C^t = 0.707107 for
        // pairs 0 and 1 (ratio 1), and 0 with pair 2 (ratio 0). With one
        // BiCro anchor a (⌊4/10⌋+1) the raw labels are, by anchor:
        //   a=0: [1, 0, 0, 1]   a=1: [0, 1, 0, 1]
        //   a=2: [0, 0, 1, 0]   a=3: [1, 1, 0, 1]
        // whatever either network's joint space looks like.
        use crate::runner::Runner;
        let (mcfg, data) = tiny();
        let cfg = train_cfg();
        let p = Runner::<Esc>::new(cfg.clone(), &mcfg, 0, &Device::Cpu)?;
        let table = [
            [1.0, 0.0, 0.0, 1.0],
            [0.0, 1.0, 0.0, 1.0],
            [0.0, 0.0, 1.0, 0.0],
            [1.0, 1.0, 0.0, 1.0],
        ];
        for k in 0..2 {
            // The anchor is the lowest per-sample hinge of the (single) batch.
            let net = &p.networks()[k];
            let s = net.batch_similarity(&data, &[0, 1, 2, 3])?;
            let hinge: Vec<f32> = per_sample_hinge(&s, cfg.margin)?.to_vec1()?;
            let a = (0..4)
                .min_by(|&x, &y| hinge[x].total_cmp(&hinge[y]))
                .expect("four pairs");
            let params: EscParams = cfg.method_params("esc").expect("preset params");
            let mut rng = p.streams().score();
            let st = nets_stats(&[net], &data, &cfg, &params, ((&mut rng).into(), None))?.remove(0);
            close(&st.raw_label, &table[a]);
        }
        Ok(())
    }

    #[test]
    fn preset_params_parse_and_unknown_keys_fail() {
        let cfg = train_cfg();
        let p: EscParams = cfg.method_params("esc").expect("preset params parse");
        assert_eq!(p.beta, 0.5);
        assert_eq!(p.alpha1, 0.0);
        assert_eq!(p.clean_only_epochs, 20);
        let mut bad = cfg.clone();
        bad.params.insert("betta".into(), toml::Value::Float(0.1));
        assert!(bad.method_params::<EscParams>("esc").is_err());
        let mut neg = cfg;
        neg.params.insert("beta".into(), toml::Value::Float(-1.0));
        let (m, _) = tiny();
        assert!(matches!(Esc::new(&neg, &m), Err(Error::Config(_))));
    }
}
