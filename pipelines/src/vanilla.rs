//! `vanilla`: the spine's reference pipeline (NCR-like, one network).
//!
//! Warm-up with the per-sample hinge on all pairs; then each epoch computes
//! the per-sample hinge of every pair, fits a mixture, and trains on the pairs
//! called clean with the soft-margin hinge, their clean probability as label.

use candle_core::{Device, Result, Tensor};
use ncclean_models::rng::Rng;
use ncclean_models::{ModelConfig, PairInputs};

use crate::batches::shuffled_batches;
use crate::config::TrainConfig;
use crate::division::{CleanSide, Division};
use crate::losses::{per_sample_hinge, soft_margin_hinge};
use crate::net::Net;
use crate::pipeline::{EpochStats, Observer, PairScores, Pipeline};
use crate::scoring::{hinge_statistic, pair_similarity, score_rng};

const SCORE_CHUNK: usize = 512;

/// The vanilla pipeline.
pub struct Vanilla {
    cfg: TrainConfig,
    seed: u64,
    net: Net,
    division: Option<Division>,
    labels: Vec<f32>,
}

impl Vanilla {
    /// A fresh pipeline.
    pub fn new(cfg: TrainConfig, model: &ModelConfig, seed: u64, device: &Device) -> Result<Self> {
        let net = Net::new(model, seed, device, cfg.lr, cfg.grad_clip)?;
        Ok(Vanilla {
            cfg,
            seed,
            net,
            division: None,
            labels: Vec::new(),
        })
    }

    /// The division statistic of every pair (per-sample hinge over shuffled
    /// batches) and the similarity S_ii, with a fixed shuffle stream.
    fn statistic(&self, data: &PairInputs, rng: &mut Rng) -> Result<(Vec<f32>, Vec<f32>)> {
        let (vi, vt) = self.net.embed_all(data, SCORE_CHUNK)?;
        let stat = hinge_statistic(
            &vi,
            &vt,
            self.cfg.batch_size,
            self.cfg.division_shuffles,
            self.cfg.margin,
            rng,
        )?;
        Ok((stat, pair_similarity(&vi, &vt)?))
    }
}

impl Pipeline for Vanilla {
    fn method(&self) -> &'static str {
        "vanilla"
    }

    fn total_epochs(&self) -> usize {
        self.cfg.epochs
    }

    fn nets(&self) -> Vec<&Net> {
        vec![&self.net]
    }

    fn nets_mut(&mut self) -> Vec<&mut Net> {
        vec![&mut self.net]
    }

    fn run_epoch(
        &mut self,
        epoch: usize,
        data: &PairInputs,
        obs: &mut dyn Observer,
    ) -> Result<EpochStats> {
        self.net.set_lr(self.cfg.lr_at(epoch));
        let n = data.len();
        let mut rng = Rng::derive(self.seed, &format!("epoch-{epoch}"));
        let warmup = epoch < self.cfg.warmup_epochs;
        let (train, labels, clean_fraction) = if warmup {
            ((0..n).collect::<Vec<_>>(), vec![1f32; n], None)
        } else {
            let (stat, _) = self.statistic(data, &mut rng)?;
            let div = Division::fit(&stat, self.cfg.mixture, CleanSide::LowMean);
            let prob = div.clean_prob(&stat);
            let train: Vec<usize> = (0..n)
                .filter(|&i| prob[i] as f64 > self.cfg.threshold)
                .collect();
            let frac = train.len() as f64 / n.max(1) as f64;
            self.labels = prob.clone();
            (train, prob, Some(frac))
        };
        let batches = shuffled_batches(&train, self.cfg.batch_size, &mut rng);
        obs.start(
            if warmup { "warm-up" } else { "train" },
            batches.len() as u64,
        );
        let mut total = 0f64;
        for b in &batches {
            let s = self.net.batch_similarity(data, b)?;
            let loss = if warmup {
                per_sample_hinge(&s, self.cfg.margin)?.mean_all()?
            } else {
                let y: Vec<f32> = b.iter().map(|&i| labels[i]).collect();
                let y = Tensor::from_vec(y, b.len(), self.net.device())?;
                soft_margin_hinge(&s, &y, self.cfg.margin, self.cfg.soft_margin_m)?.mean_all()?
            };
            total += loss.to_scalar::<f32>()? as f64;
            self.net.step(&loss)?;
            obs.advance(1);
        }
        obs.finish();
        Ok(EpochStats {
            epoch,
            phase: if warmup { "warmup" } else { "train" }.to_string(),
            loss: total / batches.len().max(1) as f64,
            clean_fraction,
            pairs: train.len(),
        })
    }

    fn finalize(&mut self, data: &PairInputs, obs: &mut dyn Observer) -> Result<()> {
        obs.start("final division", 1);
        let (stat, _) = self.statistic(data, &mut score_rng(self.seed))?;
        let div = Division::fit(&stat, self.cfg.mixture, CleanSide::LowMean);
        self.labels = div.clean_prob(&stat);
        self.division = Some(div);
        obs.advance(1);
        obs.finish();
        Ok(())
    }

    fn score(&self, data: &PairInputs, refit: bool, obs: &mut dyn Observer) -> Result<PairScores> {
        obs.start("scoring", 1);
        let (stat, similarity) = self.statistic(data, &mut score_rng(self.seed))?;
        let refitted;
        let div = if refit {
            refitted = Division::fit(&stat, self.cfg.mixture, CleanSide::LowMean);
            &refitted
        } else {
            self.division.as_ref().ok_or_else(|| {
                candle_core::Error::Msg(
                    "this pipeline has no fitted division; run fit first".into(),
                )
            })?
        };
        let clean_prob = div.clean_prob(&stat);
        obs.advance(1);
        obs.finish();
        Ok(PairScores {
            soft_label: clean_prob.clone(),
            clean_prob,
            similarity,
            statistic: stat,
        })
    }

    fn state(&self) -> serde_json::Value {
        serde_json::json!({
            "division": self.division,
            "division_statistic": format!(
                "per-sample hinge (margin {}) averaged over {} shuffles of batch {}",
                self.cfg.margin, self.cfg.division_shuffles, self.cfg.batch_size
            ),
        })
    }

    fn pair_state(&self) -> Vec<(String, Vec<f32>)> {
        vec![("labels".to_string(), self.labels.clone())]
    }

    fn load_state(
        &mut self,
        state: &serde_json::Value,
        pairs: Vec<(String, Vec<f32>)>,
    ) -> Result<()> {
        self.division = serde_json::from_value(state["division"].clone()).map_err(|e| {
            candle_core::Error::Msg(format!("checkpoint state has no valid division: {e}"))
        })?;
        for (name, v) in pairs {
            if name == "labels" {
                self.labels = v;
            }
        }
        Ok(())
    }
}
