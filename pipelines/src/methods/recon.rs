//! `recon`: ReCon — Relation Consistency (CVPR 2025; METHODS.md section 4).
//!
//! One network with local heads (image regions = grid cells / patches,
//! caption tokens, each projected into the joint space) and, by default, GPO
//! pooling for the global embeddings. After η warm-up epochs with the triplet loss summed over
//! in-batch negatives, every epoch:
//! 1. computes per pair the cross-modal relation loss `L_CM` (symmetric
//!    InfoNCE, τ = 0.1, in shuffled batches), the intra-modal relation
//!    discrepancy `L_IM` (eqs. 3–4) and the matching probability `p_i`;
//! 2. fits a GMM on `L_CM` (small mean clean) → `y_CM`; the rough clean set is
//!    `y_CM > ω1`; within it `y_IM = log(1+L_IM)/(1+log(1+L_IM))` separates
//!    clean (`y_IM < ω2`) from locally-associated pairs; the rest is noisy;
//! 3. trains on all pairs: `ξ L_CM + L_IM` (clean), `ξ L_CM + L_IM/λ` with
//!    `λ = exp(y_IM/α)` (locally associated), `ŷ L_CM` with momentum pseudo
//!    labels `ỹ ← β ỹ + (1−β) p_i` (noisy).
//!
//! Scoring: `clean_prob` is the posterior of the GMM fitted in `finalize` on
//! `L_CM` (averaged over `division_shuffles` fixed shuffles); `soft_label` is 1
//! for pairs with `clean_prob > ω1` and `p_i` otherwise — the label rule
//! applied once, since new data has no momentum history.
//!
//! # Departures from the paper
//! - Backbone: the paper uses SGRAF (Faster R-CNN regions, GRU text encoder,
//!   a learned similarity head). Here the similarity is the cosine of global
//!   embeddings pooled with GPO (the preset's `head = "gpo"`) over local
//!   features: the demo towers' grid cells and word embeddings, or the frozen
//!   towers' cached grid cells / patches and token features (MobileNetV2:
//!   7×7 cells of 1280; MiniLM: tokens of 384) instead of Faster R-CNN
//!   regions; the local relation matrices use the cosine `g(v, l) = vᵀl` of
//!   unit local features. Embedding columns (global only) are rejected.
//! - The relation rows are softmax-normalised with a temperature
//!   (`relation_tau`, default 1 = plain softmax, which the paper implies).
//! - `L_CM` averages the two directions of the InfoNCE (the paper does not
//!   say whether they are summed or averaged).
//! - The pseudo label ỹ of a pair entering the noisy set for the first time
//!   starts from its current `p_i` (the paper does not give ỹ⁰).
//! - The paper does not co-teach; neither does this pipeline (one network).

use candle_core::{Tensor, D};
use ncclean_models::layers::log_softmax_last;
use ncclean_models::{ImageTowerConfig, ModelConfig, PairInputs, TextTowerConfig};
use serde::{Deserialize, Serialize};

use crate::batch_stats::infonce_and_match_prob;
use crate::clean_model::null::NullSink;
use crate::config::TrainConfig;
use crate::division::CleanSide;
use crate::error::{Error, Result};
use crate::losses::{per_sample_hinge, symmetric_infonce};
use crate::method::{Batch, EpochCtx, Method, PairArray, Plan, ScoreCtx};
use crate::net::Net;
use crate::params::{non_negative, positive, unit_interval};
use crate::pipeline::PairScores;
use crate::scoring::{
    divide, for_each_shuffled_batch, pair_similarity, par_map, Shuffles, PAR_WINDOW,
};

/// Added to masked logits so padded tokens never win an argmax or a softmax.
const MASK_OFFSET: f64 = 1e4;
/// Pseudo-label value of a pair with no momentum history.
const NO_HISTORY: f32 = -1.0;

/// ReCon's method parameters (`[params]` of the preset).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReconParams {
    /// InfoNCE temperature τ of `L_CM` and of the matching probability `p_i`.
    pub tau: f64,
    /// Rough-division threshold ω1 on `y_CM`.
    pub omega1: f64,
    /// Refined-division threshold ω2 on `y_IM`.
    pub omega2: f64,
    /// Scale α of the penalty `λ = exp(y_IM/α)`.
    pub alpha: f64,
    /// Momentum β of the pseudo labels.
    pub beta: f64,
    /// Balance factor ξ of `L_CM`.
    pub xi: f64,
    /// Temperature of the row softmax of the relation matrices.
    pub relation_tau: f64,
}

impl ReconParams {
    fn validate(&self) -> Result<()> {
        positive("tau", self.tau)?;
        unit_interval("omega1", self.omega1)?;
        unit_interval("omega2", self.omega2)?;
        positive("alpha", self.alpha)?;
        unit_interval("beta", self.beta)?;
        non_negative("xi", self.xi)?;
        positive("relation_tau", self.relation_tau)
    }
}

/// Which part of the division a pair is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// `D_c`: rough clean and consistent intra-modal relations.
    Clean,
    /// `D_l`: rough clean but inconsistent relations (locally associated).
    Local,
    /// `D_n`: noisy.
    Noisy,
}

/// The warm-up triplet loss, summed over the in-batch negatives (paper eq. 12):
/// `Σ_j≠i [γ − S_ii + S_ij]+ + Σ_j≠i [γ − S_ii + S_ji]+`.
pub fn triplet_sum(s: &Tensor, margin: f64) -> candle_core::Result<Tensor> {
    let n = s.dim(0)?;
    per_sample_hinge(s, margin)? * (n.max(2) - 1) as f64
}

/// Row-wise KL divergence `Σ_j P_j (log P_j − log Q_j)` between the row
/// softmaxes of logits `p` and `q` (`[…, n]` → `[…]`).
fn row_kl(p: &Tensor, q: &Tensor) -> candle_core::Result<Tensor> {
    let lp = log_softmax_last(p)?;
    let lq = log_softmax_last(q)?;
    (lp.exp()? * (&lp - lq)?)?.sum(D::Minus1)
}

/// Intra-modal relation discrepancy `L_IM` of every pair (eqs. 3–4):
/// `KL(C_VV ‖ C^p_VV) + KL(C_LL ‖ C^p_LL)`, each averaged over rows (real
/// tokens only on the word side). `v [B, P, D]` and `l [B, T, D]` are unit
/// local features, `mask [B, T]` marks real tokens. The argmax matchings are
/// treated as constants; the gathered relation values carry gradients.
pub fn intra_modal_loss(
    v: &Tensor,
    l: &Tensor,
    mask: &Tensor,
    relation_tau: f64,
) -> candle_core::Result<Tensor> {
    let (b, p, _) = v.dims3()?;
    let t = l.dim(1)?;
    let lt = l.transpose(1, 2)?.contiguous()?;
    let c_vl = v.matmul(&lt)?; // [B, P, T]
    let c_vv = v.matmul(&v.transpose(1, 2)?.contiguous()?)?; // [B, P, P]
    let c_ll = l.matmul(&lt)?; // [B, T, T]
    let pad = ((mask - 1.0)? * MASK_OFFSET)?; // 0 real, −1e4 padding
                                              // i* = the most relevant real word of every region; k* = the most relevant region of every word
    let i_star = c_vl
        .detach()
        .broadcast_add(&pad.unsqueeze(1)?)?
        .argmax(D::Minus1)?; // [B, P]
    let k_star = c_vl.detach().argmax(1)?; // [B, T]

    // C^p_VV[i, j] = C_LL[i*, j*]
    let rows = c_ll.gather(
        &i_star.unsqueeze(2)?.broadcast_as((b, p, t))?.contiguous()?,
        1,
    )?;
    let cp_vv = rows.gather(
        &i_star.unsqueeze(1)?.broadcast_as((b, p, p))?.contiguous()?,
        2,
    )?;
    let kl_v = row_kl(&(c_vv.clone() / relation_tau)?, &(cp_vv / relation_tau)?)?.mean(1)?; // [B]

    // C^p_LL[k, l] = C_VV[k*, l*]
    let rows = c_vv.gather(
        &k_star.unsqueeze(2)?.broadcast_as((b, t, p))?.contiguous()?,
        1,
    )?;
    let cp_ll = rows.gather(
        &k_star.unsqueeze(1)?.broadcast_as((b, t, t))?.contiguous()?,
        2,
    )?;
    let col_pad = pad.unsqueeze(1)?;
    let kl_rows = row_kl(
        &(c_ll / relation_tau)?.broadcast_add(&col_pad)?,
        &(cp_ll / relation_tau)?.broadcast_add(&col_pad)?,
    )?; // [B, T]
    let count = mask.sum(1)?.clamp(1.0, f64::MAX)?;
    let kl_l = (kl_rows * mask)?.sum(1)?.div(&count)?;
    kl_v + kl_l
}

/// `y_IM = log(1 + L_IM) / (1 + log(1 + L_IM))` (paper eq. 7).
pub fn y_im(l_im: f32) -> f32 {
    let g = l_im.max(0.0).ln_1p();
    g / (1.0 + g)
}

/// Penalty `λ = exp(y_IM / α)` for locally-associated pairs (eq. 9).
pub fn penalty(y_im: f32, alpha: f64) -> f32 {
    (y_im as f64 / alpha).exp() as f32
}

/// Division (eqs. 5–8): rough clean `y_CM > ω1`; within it clean when
/// `y_IM < ω2`, locally associated otherwise; the rest noisy.
pub fn partition(y_cm: &[f32], y_im: &[f32], omega1: f64, omega2: f64) -> Vec<Part> {
    y_cm.iter()
        .zip(y_im)
        .map(|(&c, &m)| {
            if (c as f64) <= omega1 {
                Part::Noisy
            } else if (m as f64) < omega2 {
                Part::Clean
            } else {
                Part::Local
            }
        })
        .collect()
}

/// Labels (eqs. 10–11): 1 on `D_c ∪ D_l`; on `D_n`
/// `ỹ ← β ỹ(old) + (1−β) p_i`, where a pair without history (`old` < 0)
/// starts from `p_i`. Returns the new label of every pair.
pub fn update_labels(parts: &[Part], old: &[f32], p: &[f32], beta: f64) -> Vec<f32> {
    parts
        .iter()
        .zip(old.iter().zip(p))
        .map(|(part, (&o, &pi))| match part {
            Part::Noisy if o >= 0.0 => (beta * o as f64 + (1.0 - beta) * pi as f64) as f32,
            Part::Noisy => pi,
            _ => 1.0,
        })
        .collect()
}

/// Per-sample training loss of one batch: `ξ L_CM + L_IM` (clean),
/// `ξ L_CM + L_IM/λ` (local), `ŷ L_CM` (noisy). `weights_im` holds 1, 1/λ or
/// 0 and `weights_cm` holds ξ, ξ or ŷ per pair.
pub fn recon_loss(
    l_cm: &Tensor,
    l_im: &Tensor,
    weights_cm: &Tensor,
    weights_im: &Tensor,
) -> candle_core::Result<Tensor> {
    (l_cm * weights_cm)? + (l_im * weights_im)?
}

/// Per-pair statistics of a whole data set: a scoring pass.
pub struct Stats {
    l_cm: Vec<f32>,
    l_im: Vec<f32>,
    p: Vec<f32>,
    /// `S_ii`, from the same pass (a second pass over the local features
    /// would double the cost of scoring).
    similarity: Vec<f32>,
}

/// `(image embeddings [B, D], caption embeddings [B, D], L_IM [B])` of the
/// pairs `idx` under `net` (built with local heads), with gradients. None of
/// them depends on the other pairs of the batch.
fn local_embed(
    net: &Net,
    data: &PairInputs,
    idx: &[usize],
    relation_tau: f64,
) -> candle_core::Result<(Tensor, Tensor, Tensor)> {
    let dev = net.device();
    let (gi, li, _) = net
        .model
        .embed_images_local(&data.images.batch(idx, dev)?)?;
    let (gt, lt, mask) = net.model.embed_texts_local(&data.texts.batch(idx, dev)?)?;
    Ok((gi, gt, intra_modal_loss(&li, &lt, &mask, relation_tau)?))
}

/// `(S [B, B], L_IM [B])` of the pairs `idx` under `net`, with gradients.
fn local_forward(
    net: &Net,
    data: &PairInputs,
    idx: &[usize],
    relation_tau: f64,
) -> candle_core::Result<(Tensor, Tensor)> {
    let (gi, gt, im) = local_embed(net, data, idx, relation_tau)?;
    Ok((gi.matmul(&gt.t()?)?, im))
}

/// The ReCon method (one network with local heads).
pub struct Recon {
    params: ReconParams,
    /// Momentum pseudo labels ỹ of the pairs currently noisy (−1 = no history).
    labels: Vec<f32>,
    /// This epoch's per-pair weights of `L_CM` and of `L_IM`.
    w_cm: Vec<f32>,
    w_im: Vec<f32>,
}

impl Recon {
    /// `L_CM`, `p_i` (averaged over `division_shuffles` shuffled batchings
    /// from `rng`, as both depend on the batch) and `L_IM` of every pair,
    /// without training; the caption embeddings go to `null` (scoring
    /// with a caption null, [`ScoreCtx::caption_null`]).
    fn stats(
        &self,
        net: &Net,
        data: &PairInputs,
        cfg: &TrainConfig,
        (order, null): (Shuffles, Option<&NullSink>),
    ) -> Result<Stats> {
        let n = data.len();
        let ticks = order.ticks();
        // Chunks never span two scoring blocks: a block embeds exactly as
        // it does scored alone.
        let chunks: Vec<Vec<usize>> = order
            .ranges(n)
            .into_iter()
            .flat_map(|r| {
                r.collect::<Vec<usize>>()
                    .chunks(cfg.batch_size.max(1))
                    .map(<[usize]>::to_vec)
                    .collect::<Vec<_>>()
            })
            .collect();
        let dev = net.device();
        // Embeddings and L_IM belong to one pair each: one pass over the
        // local features; only L_CM and p_i need the shuffled batches. The
        // image side (projecting every grid cell, ~90% of the work) runs once
        // per distinct image of a chunk and is shared by its captions; chunks
        // bound the memory of the projected cells.
        let (_, image_of) = data.images.distinct();
        let (mut vis, mut vts, mut l_im) = (Vec::new(), Vec::new(), Vec::with_capacity(n));
        let chunk_stats = |chunk: &&[usize]| -> candle_core::Result<(Tensor, Tensor, Vec<f32>)> {
            let mut firsts: Vec<usize> = Vec::new();
            let mut slot: std::collections::HashMap<u32, u32> = Default::default();
            let rows: Vec<u32> = chunk
                .iter()
                .map(|&i| {
                    *slot.entry(image_of[i]).or_insert_with(|| {
                        firsts.push(i);
                        firsts.len() as u32 - 1
                    })
                })
                .collect();
            let (gi, li, _) = net
                .model
                .embed_images_local(&data.images.batch(&firsts, dev)?)?;
            let (gi, li) = if firsts.len() < chunk.len() {
                let rows = Tensor::from_vec(rows, chunk.len(), dev)?;
                (gi.index_select(&rows, 0)?, li.index_select(&rows, 0)?)
            } else {
                (gi, li)
            };
            let (gt, lt, mask) = net
                .model
                .embed_texts_local(&data.texts.batch(chunk, dev)?)?;
            let im = intra_modal_loss(&li, &lt, &mask, self.params.relation_tau)?;
            Ok((gi.detach(), gt.detach(), im.detach().to_vec1::<f32>()?))
        };
        // Chunks are independent: computed on the thread pool, kept in order.
        let chunks: Vec<&[usize]> = chunks.iter().map(Vec::as_slice).collect();
        for window in chunks.chunks(PAR_WINDOW) {
            for (gi, gt, im) in par_map(window, chunk_stats)? {
                vis.push(gi);
                vts.push(gt);
                l_im.extend(im);
            }
            ticks.add(window.iter().map(|c| c.len()).sum());
        }
        let (vi, vt) = (Tensor::cat(&vis, 0)?, Tensor::cat(&vts, 0)?);
        if let Some(sink) = null {
            sink.add(0, &vt)?;
        }
        let similarity = pair_similarity(&vi, &vt)?;
        let shuffles = cfg.division_shuffles.max(1);
        let (mut l_cm, mut p) = (vec![0f32; n], vec![0f32; n]);
        for_each_shuffled_batch(
            &vi,
            &vt,
            cfg.batch_size,
            shuffles,
            order,
            |b| Ok(infonce_and_match_prob(&b.s, self.params.tau)),
            |idx, (cm, pb)| {
                for (j, &i) in idx.iter().enumerate() {
                    l_cm[i] += cm[j] / shuffles as f32;
                    p[i] += pb[j] / shuffles as f32;
                }
            },
        )?;
        Ok(Stats {
            l_cm,
            l_im,
            p,
            similarity,
        })
    }
}

impl Method for Recon {
    const NAME: &'static str = "recon";
    type Pass = Stats;

    /// Fails unless both towers give local features and the model has local
    /// heads (the registry marks recon as needing them, so
    /// [`crate::presets::model_config`] builds them).
    fn new(cfg: &TrainConfig, model: &ModelConfig) -> Result<Self> {
        let params: ReconParams = cfg.method_params("recon").map_err(Error::Config)?;
        params.validate()?;
        let image_local = match model.image {
            ImageTowerConfig::DemoCnn { .. } => true,
            ImageTowerConfig::Precomputed { local_dim, .. } => local_dim.is_some(),
        };
        let text_local = match model.text {
            TextTowerConfig::DemoBow { .. } => true,
            TextTowerConfig::Precomputed { local_dim, .. } => local_dim.is_some(),
        };
        if !(image_local && text_local) {
            return Err(Error::Config(
                "recon needs local features (image regions and caption tokens): the demo towers and the frozen \
                 towers (mobilenet_v2, clip, minilm) provide them; precomputed embedding columns do not"
                    .into(),
            ));
        }
        if !model.head.local {
            return Err(Error::Config(
                "recon needs a model with local heads; build its model with presets::model_config"
                    .into(),
            ));
        }
        Ok(Recon {
            params,
            labels: Vec::new(),
            w_cm: Vec::new(),
            w_im: Vec::new(),
        })
    }

    /// The warm-up triplet loss summed over the in-batch negatives (eq. 12).
    fn warmup_loss(&mut self, b: &Batch) -> Result<Tensor> {
        let s = local_forward(b.net, b.data, b.idx, self.params.relation_tau)?.0;
        Ok(triplet_sum(&s, b.cfg.margin)?.mean_all()?)
    }

    fn plan(&mut self, ctx: &mut EpochCtx) -> Result<Plan> {
        let n = ctx.data.len();
        let prm = self.params.clone();
        let st = self.stats(
            &ctx.nets[0],
            ctx.data,
            ctx.cfg,
            ((&mut *ctx.rng).into(), None),
        )?;
        let y_cm = divide(&st.l_cm, ctx.cfg, CleanSide::LowMean);
        let y_ims: Vec<f32> = st.l_im.iter().map(|&v| y_im(v)).collect();
        let parts = partition(&y_cm, &y_ims, prm.omega1, prm.omega2);
        if self.labels.len() != n {
            self.labels = vec![NO_HISTORY; n];
        }
        let labels = update_labels(&parts, &self.labels, &st.p, prm.beta);
        // keep momentum history only for pairs currently noisy
        self.labels = parts
            .iter()
            .zip(&labels)
            .map(|(part, &y)| if *part == Part::Noisy { y } else { NO_HISTORY })
            .collect();
        self.w_cm = vec![0f32; n];
        self.w_im = vec![0f32; n];
        for i in 0..n {
            (self.w_cm[i], self.w_im[i]) = match parts[i] {
                Part::Clean => (prm.xi as f32, 1.0),
                Part::Local => (prm.xi as f32, 1.0 / penalty(y_ims[i], prm.alpha)),
                Part::Noisy => (labels[i], 0.0),
            };
        }
        let count = |k: Part| parts.iter().filter(|p| **p == k).count();
        let (c, l) = (count(Part::Clean), count(Part::Local));
        // The split between D_c and D_l has no field in EpochStats; the
        // phase name carries it into the logs.
        Ok(Plan {
            train: vec![(0..n).collect()],
            phase: format!(
                "train ({c} clean, {l} locally associated, {} noisy)",
                n - c - l
            ),
            clean_fraction: Some((c + l) as f64 / n.max(1) as f64),
        })
    }

    fn batch_loss(&mut self, b: &Batch) -> Result<Tensor> {
        let (s, im) = local_forward(b.net, b.data, b.idx, self.params.relation_tau)?;
        let cm = symmetric_infonce(&s, self.params.tau)?;
        let dev = b.net.device();
        let pick = |w: &[f32]| {
            Tensor::from_vec(
                b.idx.iter().map(|&i| w[i]).collect::<Vec<_>>(),
                b.idx.len(),
                dev,
            )
        };
        let (wc, wi) = (pick(&self.w_cm)?, pick(&self.w_im)?);
        Ok(recon_loss(&cm, &im, &wc, &wi)?.mean_all()?)
    }

    fn clean_side(&self) -> CleanSide {
        CleanSide::LowMean
    }

    fn score_pass(&self, ctx: &ScoreCtx) -> Result<Stats> {
        self.stats(&ctx.nets[0], ctx.data, ctx.cfg, (ctx.shuffles(), ctx.null))
    }

    fn statistic(pass: &Stats) -> &[f32] {
        &pass.l_cm
    }

    /// The label rule once: D_c ∪ D_l → 1, D_n → p_i (no momentum history).
    fn scores(&self, pass: Stats, clean_prob: Vec<f32>, _cfg: &TrainConfig) -> PairScores {
        let soft_label = clean_prob
            .iter()
            .zip(&pass.p)
            .map(|(&c, &p)| {
                if f64::from(c) > self.params.omega1 {
                    1.0
                } else {
                    p
                }
            })
            .collect();
        PairScores {
            clean_prob,
            soft_label,
            similarity: pass.similarity,
            statistic: pass.l_cm,
        }
    }

    fn state(&self) -> serde_json::Value {
        serde_json::json!({
            "division_statistic": format!(
                "per-pair symmetric InfoNCE L_CM (tau {}) averaged over division_shuffles shuffles",
                self.params.tau
            ),
            "soft_label_rule": "1 if clean_prob > omega1 else p_i, applied once on the scored data",
        })
    }

    fn pair_arrays(&mut self) -> Vec<(String, PairArray<'_>)> {
        vec![("pseudo_labels".into(), PairArray::Values(&mut self.labels))]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::losses::match_prob;
    use crate::test_support::{close, s3};
    use candle_core::Device;
    use candle_core::Var;

    #[test]
    fn infonce_and_matching_probability_hand_computed() -> Result<()> {
        // τ = 0.1, logits S/τ. Pair 0: row [9, 5, 1] → log P¹_00 = −ln(1 + e⁻⁴ + e⁻⁸) = −0.018664;
        // column [9, 2, 4] → log P²_00 = −ln(1 + e⁻⁷ + e⁻⁵) = −0.007637; L_CM = 0.013150.
        // Pair 1: row [2, 3, 6] → −ln(e⁻¹ + 1 + e³) = −3.3490; column [5, 3, 0] → −2.1498;
        //   L_CM = 2.59936. Pair 2: row [4, 0, 8] → −0.018150; column [1, 6, 8] → −0.128060; L_CM = 0.073105.
        // p_i = (P¹_ii + P²_ii)/2 = [0.987049, 0.082556, 0.930890].
        let l: Vec<f32> = symmetric_infonce(&s3(), 0.1)?.to_vec1()?;
        close(&l, &[0.01305001, 2.5993646, 0.07310509]);
        let p: Vec<f32> = match_prob(&s3(), 0.1)?.to_vec1()?;
        close(&p, &[0.9870493, 0.08255614, 0.9308903]);
        Ok(())
    }

    #[test]
    fn warmup_triplet_sums_over_negatives() -> Result<()> {
        // margin 0.2; pair 1: rows [0.2−0.3+0.2] + [0.2−0.3+0.6] = 0.1 + 0.5,
        // columns [0.2−0.3+0.5] + [0.2−0.3+0.0]+ = 0.4 → 1.0; pairs 0 and 2 have no violation.
        let l: Vec<f32> = triplet_sum(&s3(), 0.2)?.to_vec1()?;
        close(&l, &[0.0, 1.0, 0.0]);
        Ok(())
    }

    #[test]
    fn intra_modal_loss_hand_computed_with_padding() -> Result<()> {
        let dev = Device::Cpu;
        // Pair 0: regions v0 = (1,0), v1 = (0,1); words l0 = (1,0), l1 = (0.6,0.8), and a padded
        // l2 = (0,1) that would otherwise be v1's best word (1 > 0.8).
        //   C_VL = [[1, 0.6], [0, 0.8]] → i* = [0, 1], k* = [0, 1].
        //   C_VV = I, C_LL = [[1, 0.6], [0.6, 1]]; C^p_VV = C_LL, C^p_LL = C_VV = I.
        //   row 0: KL(softmax[1,0] ‖ softmax[1,0.6]) = 0.038389 (both rows alike);
        //   KL(softmax[1,0.6] ‖ softmax[1,0]) = 0.041034 → L_IM = 0.079423.
        // Pair 1: v0 = (1,0), v1 = (0.8,0.6); l0 = (1,0), l1 = (0,1), l2 padded.
        //   C_VL = [[1, 0], [0.8, 0.6]] → i* = [0, 0] (C^p_VV all C_LL[0,0] = 1: uniform rows),
        //   k* = [0, 1] (C^p_LL = C_VV = [[1, 0.8], [0.8, 1]]); C_LL = I.
        //   KL(softmax[1,0.8] ‖ uniform) = 0.004975; KL(softmax[1,0] ‖ softmax[1,0.8]) = 0.069724
        //   → L_IM = 0.074699.
        let v = Var::new(&[[[1f32, 0.0], [0.0, 1.0]], [[1.0, 0.0], [0.8, 0.6]]], &dev)?;
        let l = Var::new(
            &[
                [[1f32, 0.0], [0.6, 0.8], [0.0, 1.0]],
                [[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]],
            ],
            &dev,
        )?;
        let mask = Tensor::new(&[[1f32, 1.0, 0.0], [1.0, 1.0, 0.0]], &dev)?;
        let im = intra_modal_loss(v.as_tensor(), l.as_tensor(), &mask, 1.0)?;
        close(&im.to_vec1::<f32>()?, &[0.07942255, 0.07469916]);
        // both modalities' local features train through it; padding gets nothing
        let grads = im.sum_all()?.backward()?;
        let gv: f32 = grads
            .get(&v)
            .expect("grad v")
            .abs()?
            .sum_all()?
            .to_scalar()?;
        let gl: Vec<Vec<Vec<f32>>> = grads.get(&l).expect("grad l").to_vec3()?;
        assert!(gv > 0.0);
        assert!(gl[0][1].iter().any(|x| x.abs() > 0.0));
        assert_eq!(gl[0][2], vec![0.0, 0.0]);
        Ok(())
    }

    #[test]
    fn division_labels_and_loss_weights() -> Result<()> {
        // y_IM(L_IM = 1) = ln 2 / (1 + ln 2) = 0.409384; λ = exp(0.409384 / 0.1) = 59.9697
        assert!((y_im(1.0) - 0.409_383_9).abs() < 1e-6);
        assert!((penalty(y_im(1.0), 0.1) - 59.969_67).abs() < 1e-3);
        assert_eq!(y_im(0.0), 0.0);
        // ω1 = ω2 = 0.5: y_CM ≤ 0.5 → noisy; else y_IM < 0.5 → clean, ≥ 0.5 → local
        let parts = partition(
            &[0.9, 0.8, 0.3, 0.6, 0.5],
            &[0.2, 0.7, 0.1, 0.5, 0.0],
            0.5,
            0.5,
        );
        assert_eq!(
            parts,
            vec![
                Part::Clean,
                Part::Local,
                Part::Noisy,
                Part::Local,
                Part::Noisy
            ]
        );
        // β = 0.6: pair 2 has history 0.5 and p = 0.2 → 0.6·0.5 + 0.4·0.2 = 0.38;
        // pair 4 has none → starts at its p = 0.3; clean and local pairs → 1
        let y = update_labels(
            &parts,
            &[-1.0, 0.5, 0.5, -1.0, -1.0],
            &[0.9, 0.9, 0.2, 0.1, 0.3],
            0.6,
        );
        close(&y, &[1.0, 1.0, 0.38, 1.0, 0.3]);
        // L_c = 5·1 + 0.5 = 5.5; L_l = 5·2 + 0.5/e⁵ = 10.003369; L_n = 0.4·3 = 1.2
        let dev = Device::Cpu;
        let l_cm = Tensor::new(&[1f32, 2.0, 3.0], &dev)?;
        let l_im = Tensor::new(&[0.5f32, 0.5, 0.5], &dev)?;
        let wc = Tensor::new(&[5f32, 5.0, 0.4], &dev)?;
        let wi = Tensor::new(&[1.0, 1.0 / penalty(0.5, 0.1), 0.0], &dev)?;
        close(
            &recon_loss(&l_cm, &l_im, &wc, &wi)?.to_vec1()?,
            &[5.5, 10.003369, 1.2],
        );
        Ok(())
    }

    #[test]
    fn precomputed_towers_are_rejected_up_front() {
        let cfg = crate::presets::resolve("recon", None, &toml::Table::new()).expect("preset");
        let model = ModelConfig {
            image: ImageTowerConfig::Precomputed {
                dim: 4,
                local_dim: None,
            },
            text: TextTowerConfig::Precomputed {
                dim: 4,
                local_dim: Some(3),
            },
            joint_dim: 4,
            hidden: 4,
            head: Default::default(),
        };
        let err = Recon::new(&cfg, &model)
            .err()
            .expect("must fail")
            .to_string();
        assert!(err.contains("needs local features"), "{err}");
    }

    #[test]
    fn every_parameter_is_trained_by_the_recon_losses() -> Result<()> {
        let dev = Device::Cpu;
        let cfg = crate::test_support::demo_local_model();
        let net = Net::new(&cfg, 2, &dev, 1e-3, 2.0)?;
        let data =
            crate::test_support::pixel_pairs(vec![vec![2, 3], vec![4, 5, 6], vec![7, 8, 9, 10]]);
        let (s, im) = local_forward(&net, &data, &[0, 1, 2], 1.0)?;
        let cm = symmetric_infonce(&s, 0.1)?;
        let wc = Tensor::new(&[5f32, 5.0, 0.5], &dev)?;
        let wi = Tensor::new(&[1f32, 0.5, 0.0], &dev)?;
        let loss = recon_loss(&cm, &im, &wc, &wi)?.mean_all()?;
        let grads = loss.backward()?;
        for (name, var) in net.varmap().data().lock().expect("lock").iter() {
            let g = grads
                .get(var.as_tensor())
                .unwrap_or_else(|| panic!("no gradient for {name}"));
            let total: f32 = g.abs()?.sum_all()?.to_scalar()?;
            assert!(total > 0.0, "zero gradient for {name}");
        }
        Ok(())
    }
}
