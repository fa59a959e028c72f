//! `crcl`: Active Complementary Learning with Self-refining Correspondence
//! Correction (Hu et al., NeurIPS 2023; METHODS.md section 3).
//!
//! One network. Each batch of B pairs gives the similarity matrix S and the
//! bidirectional matching probabilities `P¹ = row_softmax(S/τ)` (image→text)
//! and `P² = column_softmax(S/τ)` (text→image); `p_i = (P¹_ii + P²_ii)/2` is
//! the network's belief that pair i matches. Training minimises the active
//! complementary loss
//!
//! ```text
//! L = mean_i [ L_d(i) + λ L_r(i, 1 − ŷ_i) ]
//! L_d(i)    = −ŷ_i (log P¹_ii + log P²_ii)
//! L_r(i, q) = Σ_{j≠i} tan(P¹_ij) / (Σ_k tan(P¹_ik))^q + Σ_{j≠i} tan(P²_ji) / (Σ_k tan(P²_ki))^q
//! ```
//!
//! where ŷ is the corrected label. Labels start at 1 and are corrected per
//! batch, before the loss, from the batch's own (detached) `p` (the paper's
//! Algorithm 1): frozen during the first `freeze_epochs` of every piece, set
//! to `p` on the first epoch after the first piece's freeze, and otherwise
//! `y ← β y + (1 − β) p`. The confident-noise filter sets `ŷ = 0` where
//! `y < ε`. Training is cut into self-refining pieces: at the start of every
//! piece after the first the network (and its optimiser) is re-initialised
//! from a seed derived from the piece index, and only the labels carry over.
//!
//! Epoch mapping: `total_epochs()` is `Σ (pieces[j] + freeze_epochs)` and
//! must equal the common `epochs` key; [`piece_of`] maps a global epoch to
//! its piece and the epoch within it. The learning rate is constant in every
//! piece but the last, where it is multiplied by `lr_decay` at each entry of
//! `lr_decay_epochs`, counted from the start of the last piece (freeze
//! epochs included).
//!
//! Scoring. The paper does not divide pairs with a mixture. ncclean's
//! `clean_prob` for CRCL is the posterior of the high-mean component of a
//! mixture (the common `mixture` key, GMM by default) fitted in `finalize` on
//! `p_i`, computed in shuffled batches of `batch_size` from a fixed stream and
//! averaged over `division_shuffles` shuffles (p depends on the batch). The
//! `soft_label` is the label rule applied once to the scored data: `p_i`,
//! with the confident-noise filter (0 where `p_i < ε`). Scored data has no
//! momentum history, so this is not the training label `y` (that one is kept
//! in the checkpoint's per-pair state as `labels`).
//!
//! Departures from the paper
//! - No SGRAF/VSE∞ head: the shared ncclean matching model (global unit-norm
//!   embeddings, cosine similarity) supplies S; the paper's numbers are for
//!   an SAF+SGR ensemble, which is a single network here.
//! - The optimiser is ncclean's `Net` (AdamW with weight decay 0, i.e. Adam,
//!   with global gradient-norm clipping from `grad_clip`); the paper's AdamW
//!   weight decay is not exposed there.
//! - `clean_prob` comes from a two-component mixture on `p_i` (the paper has
//!   no division; see Scoring above), and `p_i` for scoring is averaged over
//!   several batch shuffles.
//! - The common `warmup_epochs`, `margin` and `soft_margin_m` keys are not
//!   used: CRCL has no warm-up (the label freeze plays that role) and no hinge.
//! - Label bookkeeping follows the paper's equations 11–12 and Algorithm 1,
//!   not the released `train_self`, which differs in two ways: it stores the
//!   label *after* the confident-noise filter (a filtered pair restarts its
//!   momentum from 0), and it sets the labels to `p` during the last freeze
//!   epoch of the first piece, so momentum already runs in the first epoch
//!   after the freeze (here that epoch resets to `p`). Measured on Flickr8k
//!   train at 50% noise (examples/configs/flickr8k.toml, seeds 0–2, issue
//!   #16): ncclean's bookkeeping 0.9700 / 0.9704 / 0.9705 AUROC, filtered
//!   storage alone 0.9704 / 0.9703 / 0.9703, the earlier momentum alone
//!   0.9702 / 0.9699 / 0.9689, both of `train_self`'s choices 0.9702 /
//!   0.9699 / 0.9694; the numpy reference with `train_self`'s bookkeeping
//!   0.9714 / 0.9719, with ncclean's 0.9721 / 0.9720 (seeds 0, 1). No
//!   change beyond seed noise, and none in ncclean's favour to give up, so
//!   the paper's form stays. `examples/reference/crcl_numpy.py`
//!   is the reference (`--ncclean-labels` switches it to this bookkeeping).

use candle_core::{Tensor, D};
use ncclean_models::layers::log_softmax_last;
use ncclean_models::ModelConfig;
use serde::{Deserialize, Serialize};

use crate::batch_stats;
use crate::config::{TrainConfig, MAX_EPOCHS};
use crate::division::CleanSide;
use crate::error::{Error, Result};
use crate::losses::{diagonal, match_log_diagonals, match_prob};
use crate::method::{Batch, EpochCtx, Method, PairArray, Plan, ScoreCtx};
use crate::params::{non_negative, positive, unit_interval};
use crate::pipeline::PairScores;
use crate::scoring::{pair_similarity, shuffled_statistic, Shuffles, StatPass};
use crate::streams::{Streams, EMBED_CHUNK};

/// Lower bound on `Σ_k tan(P_ik)` before its q-th power is taken. The sum is
/// at least 1 in exact arithmetic (tan x ≥ x and the row sums to 1), so the
/// guard only protects the logarithm against rounding.
const TAN_SUM_FLOOR: f64 = 1e-6;

/// CRCL's method parameters (the `[params]` table of the preset).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CrclParams {
    /// Softmax temperature τ of the matching probabilities.
    pub tau: f64,
    /// Weight λ of the robust complementary loss.
    pub lambda: f64,
    /// Momentum β: weight on the old label in `y ← β y + (1 − β) p`.
    pub beta: f64,
    /// Confident-noise threshold ε: labels below it are set to 0.
    pub epsilon: f64,
    /// Epochs e_f at the start of every piece during which labels are frozen.
    pub freeze_epochs: usize,
    /// Training epochs of each self-refining piece, without the freeze.
    pub pieces: Vec<usize>,
}

impl CrclParams {
    fn validate(&self) -> Result<()> {
        positive("tau", self.tau)?;
        non_negative("lambda", self.lambda)?;
        unit_interval("beta", self.beta)?;
        unit_interval("epsilon", self.epsilon)?;
        if self.pieces.is_empty() {
            return Err(Error::Config(
                "params.pieces must list at least one piece".into(),
            ));
        }
        // Bounded first so that the sums below cannot overflow: together
        // they must equal `epochs`, itself at most MAX_EPOCHS.
        if self.freeze_epochs > MAX_EPOCHS || self.pieces.iter().any(|&e| e > MAX_EPOCHS) {
            return Err(Error::Config(format!(
                "params.pieces and params.freeze_epochs must each be at most {MAX_EPOCHS} epochs"
            )));
        }
        if self.pieces.len() > MAX_EPOCHS {
            return Err(Error::Config(format!(
                "params.pieces lists {} pieces; at most {MAX_EPOCHS}",
                self.pieces.len()
            )));
        }
        if self.pieces.iter().any(|&e| e + self.freeze_epochs == 0) {
            return Err(Error::Config(
                "params.pieces: every piece needs at least one epoch (pieces[j] + freeze_epochs > 0)".into(),
            ));
        }
        Ok(())
    }

    /// Epochs of each piece, freeze included.
    fn piece_lengths(&self) -> Vec<usize> {
        self.pieces
            .iter()
            .map(|&e| e + self.freeze_epochs)
            .collect()
    }
}

/// The piece a global epoch falls in and the epoch within that piece. Epochs
/// past the end belong to the last piece.
pub fn piece_of(lengths: &[usize], epoch: usize) -> (usize, usize) {
    let mut start = 0;
    for (j, &len) in lengths.iter().enumerate() {
        if epoch < start + len || j + 1 == lengths.len() {
            return (j, epoch - start);
        }
        start += len;
    }
    (0, epoch)
}

/// How the label of a pair in a batch is updated this epoch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LabelRule {
    /// Keep the stored label (the first `freeze_epochs` of a piece).
    Frozen,
    /// Replace it by the current prediction (first epoch after the first
    /// piece's freeze, when the labels are still the initial ones).
    Reset,
    /// Momentum update `y ← β y + (1 − β) p`.
    Momentum(f32),
}

impl LabelRule {
    /// The rule for epoch `t` of piece `piece`.
    pub fn at(piece: usize, t: usize, freeze: usize, beta: f64) -> LabelRule {
        if t < freeze {
            LabelRule::Frozen
        } else if piece == 0 && t == freeze {
            LabelRule::Reset
        } else {
            LabelRule::Momentum(beta as f32)
        }
    }

    /// The updated label from the old one and the prediction `p`.
    pub fn apply(self, old: f32, p: f32) -> f32 {
        match self {
            LabelRule::Frozen => old,
            LabelRule::Reset => p,
            LabelRule::Momentum(b) => b * old + (1.0 - b) * p,
        }
    }
}

/// Confident-noise filter: `ŷ = 0` where `y < ε`, else `y`.
pub fn filter_label(y: f32, epsilon: f64) -> f32 {
    if f64::from(y) < epsilon {
        0.0
    } else {
        y
    }
}

/// Row-wise log-softmax of `S/τ` (log P¹) and of `Sᵀ/τ` (row i of the latter
/// is log P²_{·i}, the text→image distribution of caption i).
fn log_probs(s: &Tensor, tau: f64) -> candle_core::Result<(Tensor, Tensor)> {
    let z = (s / tau)?;
    Ok((
        log_softmax_last(&z)?,
        log_softmax_last(&z.t()?.contiguous()?)?,
    ))
}

/// One direction of the robust complementary loss on row-stochastic `p`:
/// `(Σ_k tan p_ik − tan p_ii) / (Σ_k tan p_ik)^q_i`. The entries lie in
/// [0, 1], where tan is finite (tan 1 ≈ 1.557); tan = sin/cos because candle
/// has no tan op.
fn complementary_one_way(p: &Tensor, q: &Tensor) -> candle_core::Result<Tensor> {
    let t = (p.sin()? / p.cos()?)?;
    let total = t.sum(D::Minus1)?;
    let negatives = (&total - diagonal(&t)?)?;
    // A^q = exp(q ln A), with A floored so the logarithm stays finite.
    let pow = (total.maximum(TAN_SUM_FLOOR)?.log()? * q)?.exp()?;
    negatives / pow
}

/// Per-pair active loss `L_d(i) = −ŷ_i (log P¹_ii + log P²_ii)`.
pub fn active_loss(s: &Tensor, labels: &Tensor, tau: f64) -> candle_core::Result<Tensor> {
    let (a, b) = match_log_diagonals(s, tau)?;
    ((a + b)? * labels)?.neg()
}

/// Per-pair robust complementary loss `L_r(i, q_i)` for per-pair `q`.
pub fn complementary_loss(s: &Tensor, q: &Tensor, tau: f64) -> candle_core::Result<Tensor> {
    let (l1, l2) = log_probs(s, tau)?;
    complementary_one_way(&l1.exp()?, q)? + complementary_one_way(&l2.exp()?, q)?
}

/// Per-pair active complementary loss `L_d(i) + λ L_r(i, 1 − ŷ_i)`; the
/// training loss is its mean.
pub fn acl_loss(s: &Tensor, labels: &Tensor, tau: f64, lambda: f64) -> candle_core::Result<Tensor> {
    let q = labels.affine(-1.0, 1.0)?;
    active_loss(s, labels, tau)? + (complementary_loss(s, &q, tau)? * lambda)?
}

/// `p_i` of every pair from full-dataset embeddings, computed in shuffled
/// batches of `batch` (it depends on the other pairs in the batch) and
/// averaged over `shuffles` shuffles drawn from `rng`.
pub fn match_prob_statistic(
    vi: &Tensor,
    vt: &Tensor,
    batch: usize,
    shuffles: usize,
    tau: f64,
    order: Shuffles,
) -> candle_core::Result<Vec<f32>> {
    shuffled_statistic(vi, vt, batch, shuffles, order, |s| {
        batch_stats::match_prob(s, tau)
    })
}

/// The CRCL method: its parameters, the momentum labels and the label rule
/// of the current epoch.
pub struct Crcl {
    params: CrclParams,
    /// Momentum labels y (before the confident-noise filter), one per pair.
    labels: Vec<f32>,
    /// How this epoch's batches update the labels.
    rule: LabelRule,
}

impl Crcl {
    /// The momentum labels y of the training pairs.
    pub fn labels(&self) -> &[f32] {
        &self.labels
    }
}

/// Initialisation seed of the network of piece `piece`.
fn piece_seed(streams: &Streams, piece: usize) -> u64 {
    streams.named(&format!("piece-{piece}")).next_u64()
}

impl Method for Crcl {
    const NAME: &'static str = "crcl";
    type Pass = StatPass;

    /// Fails on invalid `[params]` or when `epochs` does not match the pieces.
    fn new(cfg: &TrainConfig, _model: &ModelConfig) -> Result<Self> {
        let params: CrclParams = cfg.method_params("crcl").map_err(Error::Config)?;
        params.validate()?;
        let total: usize = params.piece_lengths().iter().sum();
        if cfg.epochs != total {
            return Err(Error::Config(format!(
                "crcl: epochs = {} but the self-refining pieces {:?} plus {} freeze epoch(s) each make {total}; \
                 set epochs to {total} or change params.pieces / params.freeze_epochs",
                cfg.epochs, params.pieces, params.freeze_epochs
            )));
        }
        Ok(Crcl {
            params,
            labels: Vec::new(),
            rule: LabelRule::Frozen,
        })
    }

    fn total_epochs(&self, _cfg: &TrainConfig) -> usize {
        self.params.piece_lengths().iter().sum()
    }

    /// Constant in every piece but the last, which decays at
    /// `lr_decay_epochs` (counted within it).
    fn lr_at(&self, cfg: &TrainConfig, epoch: usize) -> f64 {
        let (piece, t) = piece_of(&self.params.piece_lengths(), epoch);
        if piece + 1 < self.params.pieces.len() {
            cfg.lr
        } else {
            cfg.lr_at(t)
        }
    }

    /// Self-refining: a new piece trains from scratch (fresh weights and
    /// optimiser state) so that what the previous network memorised of the
    /// noise does not carry over; only the labels do.
    fn init_seed(&self, streams: &Streams, _k: usize, epoch: usize) -> u64 {
        piece_seed(streams, piece_of(&self.params.piece_lengths(), epoch).0)
    }

    fn has_warmup(&self) -> bool {
        false
    }

    fn plan(&mut self, ctx: &mut EpochCtx) -> Result<Plan> {
        let n = ctx.data.len();
        if self.labels.len() != n {
            // All pairs are assumed matched at the start (paper, section 2.3).
            self.labels = vec![1.0; n];
        }
        let (piece, t) = piece_of(&self.params.piece_lengths(), ctx.epoch);
        self.rule = LabelRule::at(piece, t, self.params.freeze_epochs, self.params.beta);
        let phase = if self.rule == LabelRule::Frozen {
            "freeze"
        } else {
            "train"
        };
        let phase = format!("piece {}/{} {phase}", piece + 1, self.params.pieces.len());
        Ok(Plan::all(n, 1, &phase))
    }

    fn batch_loss(&mut self, b: &Batch) -> Result<Tensor> {
        let (tau, lambda, eps) = (self.params.tau, self.params.lambda, self.params.epsilon);
        let s = b.net.batch_similarity(b.data, b.idx)?;
        // Labels are corrected from the batch's own predictions before the
        // loss (Algorithm 1); the prediction is a target, not trained.
        if self.rule != LabelRule::Frozen {
            let p: Vec<f32> = match_prob(&s.detach(), tau)?.to_vec1()?;
            for (&i, pi) in b.idx.iter().zip(p) {
                self.labels[i] = self.rule.apply(self.labels[i], pi);
            }
        }
        let y: Vec<f32> = b
            .idx
            .iter()
            .map(|&i| filter_label(self.labels[i], eps))
            .collect();
        let y = Tensor::from_vec(y, b.idx.len(), b.net.device())?;
        Ok(acl_loss(&s, &y, tau, lambda)?.mean_all()?)
    }

    /// "Clean" here: pairs the correction does not treat as confident noise
    /// (ŷ > 0); during a freeze the labels did not move.
    fn finish_epoch(&mut self, _cfg: &TrainConfig, n: usize) -> Option<f64> {
        let eps = self.params.epsilon;
        (self.rule != LabelRule::Frozen).then(|| {
            self.labels.iter().filter(|&&y| f64::from(y) >= eps).count() as f64 / n.max(1) as f64
        })
    }

    fn clean_side(&self) -> CleanSide {
        CleanSide::HighMean
    }

    fn score_pass(&self, ctx: &ScoreCtx) -> Result<StatPass> {
        let ranges = ctx.shuffles().ranges(ctx.data.len());
        let (vi, vt) = ctx.nets[0].embed_ranges(ctx.data, &ranges, EMBED_CHUNK)?;
        ctx.caption_null(0, &vt)?;
        ctx.ticks.add(ctx.data.len());
        let statistic = match_prob_statistic(
            &vi,
            &vt,
            ctx.cfg.batch_size,
            ctx.cfg.division_shuffles,
            self.params.tau,
            ctx.shuffles(),
        )?;
        Ok(StatPass {
            statistic,
            similarity: pair_similarity(&vi, &vt)?,
        })
    }

    fn statistic(pass: &StatPass) -> &[f32] {
        &pass.statistic
    }

    /// No momentum history exists for scored data: the label rule is applied
    /// once, to the prediction itself.
    fn scores(&self, pass: StatPass, clean_prob: Vec<f32>, _cfg: &TrainConfig) -> PairScores {
        let soft_label = pass
            .statistic
            .iter()
            .map(|&p| filter_label(p, self.params.epsilon))
            .collect();
        PairScores {
            clean_prob,
            soft_label,
            similarity: pass.similarity,
            statistic: pass.statistic,
        }
    }

    fn state(&self) -> serde_json::Value {
        serde_json::json!({
            "division_statistic": "p_i = (P1_ii + P2_ii)/2 in shuffled batches, averaged over division_shuffles",
        })
    }

    fn pair_arrays(&mut self) -> Vec<(String, PairArray<'_>)> {
        vec![("labels".into(), PairArray::Values(&mut self.labels))]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::Net;
    use crate::test_support::{close, s3};
    use candle_core::Device;
    use candle_core::Var;
    use ncclean_models::rng::Rng;
    use ncclean_models::PairInputs;

    /// Hand-computed probabilities of `s3()` at τ = 0.1, in f64:
    /// rows:  r0 = e^9+e^5+e^1, r1 = e^2+e^3+e^6, r2 = e^4+e^0+e^8;
    /// cols:  c0 = e^9+e^2+e^4, c1 = e^5+e^3+e^0, c2 = e^1+e^6+e^8.
    /// P¹_ij = e^{z_ij}/r_i, P²_ij = e^{z_ij}/c_j.
    fn hand_probs() -> ([[f64; 3]; 3], [[f64; 3]; 3]) {
        let z = [[9f64, 5., 1.], [2., 3., 6.], [4., 0., 8.]];
        let mut p1 = [[0f64; 3]; 3];
        let mut p2 = [[0f64; 3]; 3];
        for i in 0..3 {
            let r: f64 = (0..3).map(|k| z[i][k].exp()).sum();
            for j in 0..3 {
                let c: f64 = (0..3).map(|k| z[k][j].exp()).sum();
                p1[i][j] = z[i][j].exp() / r;
                p2[i][j] = z[i][j].exp() / c;
            }
        }
        (p1, p2)
    }

    #[test]
    fn match_prob_hand_computed() -> Result<()> {
        // Worked out: r0 = 8103.084+148.413+2.718 = 8254.215, P¹_00 = 8103.084/8254.215 = 0.981690;
        // c0 = 8103.084+7.389+54.598 = 8165.071, P²_00 = 0.992408; p_0 = 0.987049.
        // r1 = 7.389+20.086+403.429 = 430.903, P¹_11 = 20.086/430.903 = 0.046613;
        // c1 = 148.413+20.086+1 = 169.499, P²_11 = 0.118500; p_1 = 0.082556.
        // r2 = 54.598+1+2980.958 = 3036.556, P¹_22 = 0.981690;
        // c2 = 2.718+403.429+2980.958 = 3387.105, P²_22 = 0.880090; p_2 = 0.930890.
        let p: Vec<f32> = match_prob(&s3(), 0.1)?.to_vec1()?;
        close(&p, &[0.987049, 0.082556, 0.930890]);
        let (p1, p2) = hand_probs();
        let want: Vec<f32> = (0..3)
            .map(|i| ((p1[i][i] + p2[i][i]) / 2.0) as f32)
            .collect();
        close(&p, &want);
        Ok(())
    }

    #[test]
    fn active_loss_hand_computed() -> Result<()> {
        // L_d(i) = −ŷ_i (ln P¹_ii + ln P²_ii), ŷ = [1, 0.5, 0]:
        // i=0: −(ln 0.981690 + ln 0.992408) = 0.018479 + 0.007621 = 0.026100
        // i=1: −0.5 (ln 0.046613 + ln 0.118500) = 0.5 (3.065884 + 2.132845) = 2.599365
        // i=2: 0 (ŷ = 0 switches the active term off)
        let y = Tensor::new(&[1f32, 0.5, 0.0], &Device::Cpu)?;
        let l: Vec<f32> = active_loss(&s3(), &y, 0.1)?.to_vec1()?;
        let (p1, p2) = hand_probs();
        let want = [
            -(p1[0][0].ln() + p2[0][0].ln()),
            -0.5 * (p1[1][1].ln() + p2[1][1].ln()),
            0.0,
        ];
        close(&l, &want.map(|v| v as f32));
        close(&l, &[0.026100, 2.599365, 0.0]);
        Ok(())
    }

    #[test]
    fn complementary_loss_hand_computed() -> Result<()> {
        // L_r(i, q) = Σ_{j≠i} tan P¹_ij / (Σ_k tan P¹_ik)^q + Σ_{j≠i} tan P²_ji / (Σ_k tan P²_ki)^q.
        // q = 0 → plain sums of tan over the negatives; q = 1 → normalised.
        // Row 1 of P¹: [7.389, 20.086, 403.429]/430.903 = [0.017148, 0.046613, 0.936240];
        //   negatives' tan: tan 0.017148 = 0.017150, tan 0.936240 = 1.358479.
        // Column 1 of P²: [148.413, 20.086, 1]/169.499 = [0.875601, 0.118500, 0.005900];
        //   negatives' tan: tan 0.875601 = 1.198884, tan 0.005900 = 0.005900.
        let (p1, p2) = hand_probs();
        for (qv, name) in [(0f64, "q=0"), (1.0, "q=1"), (0.3, "q=0.3")] {
            let q = Tensor::new(&[qv as f32; 3], &Device::Cpu)?;
            let l: Vec<f32> = complementary_loss(&s3(), &q, 0.1)?.to_vec1()?;
            let want: Vec<f32> = (0..3)
                .map(|i| {
                    let a1: f64 = (0..3).map(|k| p1[i][k].tan()).sum();
                    let a2: f64 = (0..3).map(|k| p2[k][i].tan()).sum();
                    let n1 = a1 - p1[i][i].tan();
                    let n2 = a2 - p2[i][i].tan();
                    (n1 / a1.powf(qv) + n2 / a2.powf(qv)) as f32
                })
                .collect();
            for (x, y) in l.iter().zip(&want) {
                assert!((x - y).abs() < 1e-5, "{name}: {l:?} vs {want:?}");
            }
        }
        // Spot value, q = 0, pair 1: 0.017150 + 1.358479 + 1.198884 + 0.005900 = 2.580413.
        let q0 = Tensor::new(&[0f32; 3], &Device::Cpu)?;
        let l: Vec<f32> = complementary_loss(&s3(), &q0, 0.1)?.to_vec1()?;
        assert!((l[1] - 2.580413).abs() < 1e-5, "{}", l[1]);
        Ok(())
    }

    #[test]
    fn acl_combines_with_q_from_the_label() -> Result<()> {
        // ACL(i) = L_d(i; ŷ_i) + λ L_r(i; q = 1 − ŷ_i), λ = 5, ŷ = [1, 0.5, 0].
        let y = Tensor::new(&[1f32, 0.5, 0.0], &Device::Cpu)?;
        let l: Vec<f32> = acl_loss(&s3(), &y, 0.1, 5.0)?.to_vec1()?;
        let d: Vec<f32> = active_loss(&s3(), &y, 0.1)?.to_vec1()?;
        let q = Tensor::new(&[0f32, 0.5, 1.0], &Device::Cpu)?;
        let r: Vec<f32> = complementary_loss(&s3(), &q, 0.1)?.to_vec1()?;
        let want: Vec<f32> = (0..3).map(|i| d[i] + 5.0 * r[i]).collect();
        close(&l, &want);
        Ok(())
    }

    #[test]
    fn a_single_pair_batch_has_zero_loss() -> Result<()> {
        // P¹ = P² = [[1]]: no negatives, ln 1 = 0.
        let s = Tensor::new(&[[0.3f32]], &Device::Cpu)?;
        let y = Tensor::new(&[1f32], &Device::Cpu)?;
        close(&acl_loss(&s, &y, 0.05, 5.0)?.to_vec1()?, &[0.0]);
        close(&match_prob(&s, 0.05)?.to_vec1()?, &[1.0]);
        Ok(())
    }

    #[test]
    fn loss_gradient_reaches_the_similarity_and_lowers_the_loss() -> Result<()> {
        let v = Var::from_tensor(&s3())?;
        let y = Tensor::new(&[1f32, 0.5, 0.0], &Device::Cpu)?;
        let loss = acl_loss(v.as_tensor(), &y, 0.1, 5.0)?.mean_all()?;
        let g = loss.backward()?;
        let gs = g.get(v.as_tensor()).expect("gradient on S");
        let gv: Vec<Vec<f32>> = gs.to_vec2()?;
        assert!(gv.iter().flatten().all(|x| x.is_finite()));
        // The active term pulls the diagonal of the confident pair up.
        assert!(gv[0][0] < 0.0, "{gv:?}");
        let stepped = (v.as_tensor() - (gs * 0.01)?)?;
        let after: f32 = acl_loss(&stepped, &y, 0.1, 5.0)?.mean_all()?.to_scalar()?;
        assert!(after < loss.to_scalar::<f32>()?);
        Ok(())
    }

    #[test]
    fn label_rules_hand_computed() {
        // β = 0.8: momentum 0.8·0.5 + 0.2·0.9 = 0.58; reset → p; frozen → old.
        assert_eq!(LabelRule::at(0, 0, 2, 0.8), LabelRule::Frozen);
        assert_eq!(LabelRule::at(0, 1, 2, 0.8), LabelRule::Frozen);
        assert_eq!(LabelRule::at(0, 2, 2, 0.8), LabelRule::Reset);
        assert_eq!(LabelRule::at(0, 3, 2, 0.8), LabelRule::Momentum(0.8));
        assert_eq!(LabelRule::at(1, 1, 2, 0.8), LabelRule::Frozen);
        assert_eq!(LabelRule::at(1, 2, 2, 0.8), LabelRule::Momentum(0.8));
        assert!((LabelRule::Momentum(0.8).apply(0.5, 0.9) - 0.58).abs() < 1e-6);
        assert_eq!(LabelRule::Reset.apply(1.0, 0.3), 0.3);
        assert_eq!(LabelRule::Frozen.apply(0.7, 0.3), 0.7);
        // Confident-noise filter, ε = 0.1.
        assert_eq!(filter_label(0.09, 0.1), 0.0);
        assert_eq!(filter_label(0.1, 0.1), 0.1);
        assert_eq!(filter_label(0.58, 0.1), 0.58);
    }

    #[test]
    fn pieces_map_onto_epochs() {
        // pieces [5, 5, 5, 30] + 2 freeze epochs = [7, 7, 7, 32], 53 epochs.
        let p = CrclParams {
            tau: 0.05,
            lambda: 5.0,
            beta: 0.8,
            epsilon: 0.1,
            freeze_epochs: 2,
            pieces: vec![5, 5, 5, 30],
        };
        let l = p.piece_lengths();
        assert_eq!(l, vec![7, 7, 7, 32]);
        assert_eq!(piece_of(&l, 0), (0, 0));
        assert_eq!(piece_of(&l, 6), (0, 6));
        assert_eq!(piece_of(&l, 7), (1, 0));
        assert_eq!(piece_of(&l, 20), (2, 6));
        assert_eq!(piece_of(&l, 21), (3, 0));
        assert_eq!(piece_of(&l, 52), (3, 31));
        assert!(p.validate().is_ok());
        assert!(CrclParams {
            pieces: vec![],
            ..p.clone()
        }
        .validate()
        .is_err());
        // Sums that would overflow usize are refused before they are taken.
        for huge in [
            CrclParams {
                pieces: vec![usize::MAX, 1],
                ..p.clone()
            },
            CrclParams {
                freeze_epochs: usize::MAX,
                ..p.clone()
            },
        ] {
            let e = huge.validate().unwrap_err().to_string();
            assert!(e.contains("at most 10000"), "{e}");
        }
        assert!(CrclParams { beta: 1.5, ..p }.validate().is_err());
    }

    #[test]
    fn statistic_ranks_the_mismatched_pair_lowest() -> Result<()> {
        let dev = Device::Cpu;
        let vi = Tensor::new(&[[1f32, 0.], [0., 1.], [-1., 0.], [0., -1.]], &dev)?;
        let vt = Tensor::new(&[[1f32, 0.], [0., 1.], [-1., 0.], [1., 0.]], &dev)?;
        let p = match_prob_statistic(&vi, &vt, 4, 2, 0.05, (&mut Rng::new(0)).into())?;
        let lowest = p.iter().cloned().fold(f32::MAX, f32::min);
        assert_eq!(lowest, p[3], "{p:?}");
        Ok(())
    }

    fn tiny_data(n: usize) -> PairInputs {
        // Captions are noisy copies of their images, except the last quarter,
        // whose captions are rotated (mismatched).
        let mut rng = Rng::new(7);
        let dim = 6;
        let img: Vec<f32> = (0..n * dim).map(|_| rng.normal() as f32).collect();
        let mut txt = img.clone();
        let noisy = n / 4;
        for k in 0..noisy {
            let (a, b) = (n - noisy + k, n - noisy + (k + 1) % noisy);
            txt[a * dim..(a + 1) * dim].copy_from_slice(&img[b * dim..(b + 1) * dim]);
        }
        for v in txt.iter_mut() {
            *v += 0.1 * rng.normal() as f32;
        }
        crate::test_support::embedding_pairs(img, txt, dim)
    }

    fn tiny_model() -> ModelConfig {
        crate::test_support::precomputed_model(6, 8, 16)
    }

    fn tiny_config(epochs: i64, pieces: &[i64]) -> TrainConfig {
        let sets: Vec<String> = vec![
            format!("epochs={epochs}"),
            "batch_size=8".into(),
            "lr=1e-2".into(),
            "lr_decay_epochs=[1]".into(),
            "params.freeze_epochs=1".into(),
            format!("params.pieces={pieces:?}"),
        ];
        let over = crate::config::parse_sets(&sets).unwrap();
        crate::presets::resolve("crcl", None, &over).unwrap()
    }

    #[test]
    fn every_parameter_gets_a_gradient() -> Result<()> {
        let data = tiny_data(16);
        let net = Net::new(&tiny_model(), 3, &Device::Cpu, 1e-3, 2.0)?;
        let idx: Vec<usize> = (0..8).collect();
        let s = net.batch_similarity(&data, &idx)?;
        let y = Tensor::new(&[1f32, 0.9, 0.5, 0.0, 1.0, 0.2, 0.7, 0.05], &Device::Cpu)?;
        let g = acl_loss(&s, &y, 0.05, 5.0)?.mean_all()?.backward()?;
        let vars = net.varmap().all_vars();
        assert!(!vars.is_empty());
        for v in &vars {
            let gv = g
                .get(v.as_tensor())
                .expect("every parameter has a gradient");
            let norm: f32 = gv.sqr()?.sum_all()?.to_scalar()?;
            assert!(
                norm.is_finite() && norm > 0.0,
                "zero gradient for a {:?} parameter",
                v.shape()
            );
        }
        Ok(())
    }

    #[test]
    fn epochs_must_match_the_pieces() {
        let cfg = tiny_config(5, &[1, 1]);
        let e = Crcl::new(&cfg, &tiny_model())
            .err()
            .expect("mismatch is an error");
        assert!(matches!(e, Error::Config(_)), "{e}");
        assert!(e.to_string().contains("pieces"), "{e}");
        let mut bad = tiny_config(4, &[1, 1]);
        bad.params.insert("gamma".into(), toml::Value::Float(1.0));
        assert!(Crcl::new(&bad, &tiny_model()).is_err());
    }

    /// All parameters by name, in name order (`all_vars` has no fixed order).
    fn named_weights(v: &candle_nn::VarMap) -> Result<Vec<(String, Vec<f32>)>> {
        let data = v.data().lock().expect("varmap lock");
        let mut out = Vec::new();
        for (k, var) in data.iter() {
            out.push((k.clone(), var.as_tensor().flatten_all()?.to_vec1::<f32>()?));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    #[test]
    fn pieces_reinitialise_the_network_and_keep_the_labels() -> Result<()> {
        use crate::pipeline::Pipeline;
        use crate::runner::Runner;
        let n = 32;
        let data = tiny_data(n);
        let cfg = tiny_config(4, &[1, 1]);
        let mut p = Runner::<Crcl>::new(cfg.clone(), &tiny_model(), 0, &Device::Cpu)?;
        assert_eq!(p.total_epochs(), 4);
        let snapshot = |p: &Runner<Crcl>| named_weights(p.networks()[0].varmap());
        let mut obs = crate::pipeline::Silent;
        let s0 = p.run_epoch(0, &data, &mut obs)?;
        // Freeze epoch: labels stay at their initial 1.
        assert!(s0.phase.contains("freeze") && s0.clean_fraction.is_none());
        assert!(p.method_ref().labels().iter().all(|&y| y == 1.0));
        p.run_epoch(1, &data, &mut obs)?;
        // First epoch after the first freeze: labels were reset to p.
        assert!(p.method_ref().labels().iter().any(|&y| y < 1.0));
        let labels_after_piece0 = p.method_ref().labels().to_vec();
        let trained = snapshot(&p)?;
        // Piece 2's freeze epoch starts from a fresh initialisation from the
        // piece's own seed, trains it, and leaves the labels alone.
        let fresh_seed = piece_seed(p.streams(), 1);
        assert_ne!(piece_seed(p.streams(), 0), fresh_seed);
        let fresh = Net::new(&tiny_model(), fresh_seed, &Device::Cpu, 1e-2, 2.0)?;
        let fresh_w = named_weights(fresh.varmap())?;
        assert_ne!(fresh_w, trained);
        p.run_epoch(2, &data, &mut obs)?;
        assert_eq!(p.method_ref().labels(), &labels_after_piece0[..]);
        let after = snapshot(&p)?;
        assert_ne!(after, trained);
        assert_ne!(after, fresh_w);
        // The same piece-2 epoch run from the fresh network by hand gives the
        // same weights: the runner re-initialised it, not continued piece 1.
        let method = Crcl::new(&cfg, &tiny_model())?;
        assert_eq!(method.init_seed(p.streams(), 0, 2), fresh_seed);
        assert_eq!(
            method.init_seed(p.streams(), 0, 1),
            piece_seed(p.streams(), 0)
        );
        p.run_epoch(3, &data, &mut obs)?;
        // Last piece: epoch 1 within it decays the lr (lr_decay_epochs = [1]).
        assert!((method.lr_at(&cfg, 3) - 1e-3).abs() < 1e-12);
        assert!((method.lr_at(&cfg, 1) - 1e-2).abs() < 1e-12);

        p.finalize(&data, &[data.len()], &mut obs)?;
        let a = p.score(&data, &[data.len()], false, &mut obs)?;
        let b = p.score(&data, &[data.len()], false, &mut obs)?;
        assert_eq!(a, b, "scoring is deterministic");
        assert_eq!(a.clean_prob.len(), n);
        for (&s, &p_i) in a.soft_label.iter().zip(&a.statistic) {
            assert!((s == 0.0 && p_i < 0.1) || s == p_i, "{s} vs {p_i}");
        }
        assert!(a
            .clean_prob
            .iter()
            .all(|v| v.is_finite() && (0.0..=1.0).contains(v)));

        // A rebuilt pipeline with the saved weights and state scores the same
        // and does not re-initialise the last piece's network.
        let mut q = Runner::<Crcl>::new(cfg, &tiny_model(), 0, &Device::Cpu)?;
        q.load_state(&p.state(), p.pair_state())?;
        for ((_, dst), (_, src)) in q.weights_mut().into_iter().zip(p.weights()) {
            let src_vars = src.data().lock().unwrap();
            let dst_vars = dst.data().lock().unwrap();
            for (k, v) in dst_vars.iter() {
                v.set(src_vars[k].as_tensor())?;
            }
        }
        assert_eq!(q.method_ref().labels(), p.method_ref().labels());
        assert_eq!(q.score(&data, &[data.len()], false, &mut obs)?, a);
        assert_eq!(q.state()["net_seeds"], p.state()["net_seeds"]);
        Ok(())
    }
}
