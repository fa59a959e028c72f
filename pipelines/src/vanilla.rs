//! `vanilla`: the NCR-like reference method (one network; not a paper).
//!
//! Warm-up with the per-sample hinge on all pairs (the runner's default);
//! then every epoch: the per-sample hinge of every pair, averaged over
//! shuffled batchings → mixture → clean probability; train on the pairs
//! called clean with the soft-margin hinge, their clean probability as label.
//! Scoring: the same statistic; `soft_label` = `clean_prob`.

use candle_core::Tensor;
use ncclean_models::ModelConfig;

use crate::config::TrainConfig;
use crate::division::CleanSide;
use crate::error::Result;
use crate::losses::soft_margin_hinge;
use crate::method::{pair_array, Batch, EpochCtx, Method, Plan, ScoreCtx};
use crate::pipeline::PairScores;
use crate::scoring::{divide, hinge_pass, StatPass};

/// The vanilla method: its state is the clean probability of every pair.
pub struct Vanilla {
    labels: Vec<f32>,
}

impl Method for Vanilla {
    const NAME: &'static str = "vanilla";
    type Pass = StatPass;

    fn new(_cfg: &TrainConfig, _model: &ModelConfig) -> Result<Self> {
        Ok(Vanilla { labels: Vec::new() })
    }

    fn plan(&mut self, ctx: &mut EpochCtx) -> Result<Plan> {
        let pass = hinge_pass(&ctx.nets[0], ctx.data, ctx.cfg, (&mut *ctx.rng).into())?;
        self.labels = divide(&pass.statistic, ctx.cfg, CleanSide::LowMean);
        let train: Vec<usize> = (0..ctx.data.len())
            .filter(|&i| f64::from(self.labels[i]) > ctx.cfg.threshold)
            .collect();
        let clean_fraction = Some(train.len() as f64 / ctx.data.len().max(1) as f64);
        Ok(Plan {
            train: vec![train],
            phase: "train".into(),
            clean_fraction,
        })
    }

    fn batch_loss(&mut self, b: &Batch) -> Result<Tensor> {
        let s = b.net.batch_similarity(b.data, b.idx)?;
        let y: Vec<f32> = b.idx.iter().map(|&i| self.labels[i]).collect();
        let y = Tensor::from_vec(y, b.idx.len(), b.net.device())?;
        Ok(soft_margin_hinge(&s, &y, b.cfg.margin, b.cfg.soft_margin_m)?.mean_all()?)
    }

    fn clean_side(&self) -> CleanSide {
        CleanSide::LowMean
    }

    fn score_pass(&self, ctx: &ScoreCtx) -> Result<StatPass> {
        Ok(hinge_pass(&ctx.nets[0], ctx.data, ctx.cfg, ctx.shuffles())?)
    }

    fn statistic(pass: &StatPass) -> &[f32] {
        &pass.statistic
    }

    fn scores(&self, pass: StatPass, clean_prob: Vec<f32>, _cfg: &TrainConfig) -> PairScores {
        PairScores {
            soft_label: clean_prob.clone(),
            clean_prob,
            similarity: pass.similarity,
            statistic: pass.statistic,
        }
    }

    fn pair_state(&self) -> Vec<(String, Vec<f32>)> {
        vec![("labels".into(), self.labels.clone())]
    }

    fn load_state(
        &mut self,
        _state: &serde_json::Value,
        pairs: &[(String, Vec<f32>)],
    ) -> Result<()> {
        self.labels = pair_array(pairs, "labels");
        Ok(())
    }
}
