//! Pipeline configuration: the [`TrainConfig`] type, its range checks and
//! the `--set` parser. Which preset a method starts from, and how a user
//! file and flags override it, is [`crate::presets`].

use serde::{Deserialize, Serialize};

use ncclean_models::Pooling;

use crate::division::MixtureKind;

/// Settings shared by every pipeline. Fields a method does not use are ignored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainConfig {
    /// Total epochs, warm-up included.
    pub epochs: usize,
    /// Warm-up epochs on all pairs with the per-sample hinge.
    pub warmup_epochs: usize,
    /// Pairs per batch.
    pub batch_size: usize,
    /// Learning rate.
    pub lr: f64,
    /// Multiply the learning rate by `lr_decay` at each epoch in `lr_decay_epochs`.
    pub lr_decay: f64,
    /// Epochs (0-based) at which the learning rate decays.
    pub lr_decay_epochs: Vec<usize>,
    /// Hinge margin α.
    pub margin: f64,
    /// Soft-margin base m.
    pub soft_margin_m: f64,
    /// Global gradient-norm clip (0 disables).
    pub grad_clip: f64,
    /// Mixture model used for division.
    pub mixture: MixtureKind,
    /// Shuffles averaged for the per-sample hinge when scoring.
    pub division_shuffles: usize,
    /// Decision threshold on the clean probability.
    pub threshold: f64,
    /// Width of the joint space.
    pub joint_dim: usize,
    /// Hidden width of projection heads.
    pub hidden: usize,
    /// Width of the demo CNN's first layer.
    pub cnn_width: usize,
    /// Side length images are resized to for the demo CNN.
    pub image_size: usize,
    /// Word embedding width of the demo text tower.
    pub word_dim: usize,
    /// Matching head: `mean` (projection of each tower's global vector) or
    /// `gpo` (VSE∞ pooling over projected local features: grid cells /
    /// patches and tokens). Any method runs on either head.
    #[serde(default)]
    pub head: Pooling,
    /// Scale each frozen tower's cached global feature to unit length before
    /// the head ([`ncclean_models::LocalOptions::unit_inputs`]); no effect on
    /// the demo towers, which are trained.
    #[serde(default)]
    pub unit_inputs: bool,
    /// Where `clean_prob` comes from: `reference` (the default: the final
    /// clean-probability model of [`crate::clean_model`], from the trained
    /// similarity, the neighbourhood score and the ridge signal, calibrated
    /// against random pairings) or `division` (the method's own mixture posterior over its
    /// division statistic, as the papers define it).
    #[serde(default)]
    pub clean_prob: CleanProbSource,
    /// Score each pair's similarity against its caption's similarities
    /// with a fixed bank of training images (a z-score,
    /// [`crate::clean_model::null`]) before the final model reads it, so
    /// that captions which describe no image (file names, shop templates)
    /// are counted as noise. On by default: on Flickr8k it changed no
    /// figure beyond noise at random 0–70% and hard 20% noise, and found
    /// 20% boilerplate captions that without it are all called clean.
    /// Always written, so that a configuration from before it (which
    /// reads as on) hashes apart from one fitted with it.
    #[serde(default = "default_caption_null")]
    pub caption_null: bool,
    /// Reference images each pair's caption is compared with (the
    /// neighbourhood score's k).
    #[serde(default = "default_reference_neighbours")]
    pub reference_neighbours: usize,
    /// Most training images kept in the checkpoint as the reference (a
    /// seeded sample beyond that).
    #[serde(default = "default_reference_images")]
    pub reference_images: usize,
    /// Method-specific parameters (the `[params]` table of a preset); each
    /// pipeline parses them into its own struct and rejects unknown keys.
    #[serde(default)]
    pub params: toml::Table,
}

/// What `clean_prob` is ([`TrainConfig::clean_prob`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CleanProbSource {
    /// The final clean-probability model ([`crate::clean_model`]).
    #[default]
    Reference,
    /// The method's mixture posterior over its division statistic.
    Division,
}

fn default_caption_null() -> bool {
    true
}

fn default_reference_neighbours() -> usize {
    20
}

fn default_reference_images() -> usize {
    8192
}

/// Most epochs a run may ask for: far beyond any paper's schedule (GSC's 60,
/// CRCL's 45), low enough that per-epoch bookkeeping stays small.
pub const MAX_EPOCHS: usize = 10_000;

/// Largest batch: its similarity matrix and gradients hold a few
/// batch_size² floats (16,384² is 1 GiB each).
pub const MAX_BATCH: usize = 16_384;

/// Widest head layer (`joint_dim`, `hidden`, `word_dim`): the heads' weights
/// and Adam's moments grow with its square.
pub const MAX_WIDTH: usize = 16_384;
/// Smallest learning rate that changes a weight ([`TrainConfig::validate`]).
pub const MIN_LR: f64 = 1e-10;

impl TrainConfig {
    /// Check every shared key's range before any input is read; the error
    /// names the key, the value and what is allowed. Method parameters are
    /// checked by the method ([`crate::registry::validate`]).
    pub fn validate(&self) -> Result<(), String> {
        let bad = |key: &str, v: &dyn std::fmt::Display, allowed: &str| {
            Err(format!("{key} = {v} is out of range: {allowed}"))
        };
        if self.epochs == 0 {
            return bad("epochs", &self.epochs, "train at least 1 epoch");
        }
        if self.epochs > MAX_EPOCHS {
            return bad("epochs", &self.epochs, &format!("at most {MAX_EPOCHS}"));
        }
        if self.warmup_epochs > self.epochs {
            return bad(
                "warmup_epochs",
                &self.warmup_epochs,
                &format!(
                    "at most epochs ({}); lower --warmup-epochs too",
                    self.epochs
                ),
            );
        }
        if !(2..=MAX_BATCH).contains(&self.batch_size) {
            return bad(
                "batch_size",
                &self.batch_size,
                &format!("2 (in-batch negatives) to {MAX_BATCH} (a batch's similarity matrix is batch_size² floats)"),
            );
        }
        let positive = [("lr", self.lr), ("lr_decay", self.lr_decay)];
        for (key, v) in positive {
            if !(v.is_finite() && v > 0.0) {
                return bad(key, &v, "a finite number > 0");
            }
        }
        // Below this an f32 weight does not move at all (its spacing near
        // 0.1 is ~7e-9): training would run every epoch and learn nothing.
        if self.lr < MIN_LR {
            return bad(
                "lr",
                &format!("{:e}", self.lr),
                &format!("at least {MIN_LR:e}"),
            );
        }
        // An epoch past any run's last is never reached: a typo, not a schedule.
        if let Some(e) = self.lr_decay_epochs.iter().find(|&&e| e > MAX_EPOCHS) {
            return bad(
                "lr_decay_epochs",
                &format!("[.., {e}, ..]"),
                &format!("epochs up to {MAX_EPOCHS}"),
            );
        }
        for (key, v) in [("margin", self.margin), ("grad_clip", self.grad_clip)] {
            if !(v.is_finite() && v >= 0.0) {
                return bad(key, &v, "a finite number ≥ 0");
            }
        }
        // α̂ = α (m^ŷ − 1)/(m − 1): m = 1 divides by zero.
        if !(self.soft_margin_m.is_finite() && self.soft_margin_m > 1.0) {
            return bad("soft_margin_m", &self.soft_margin_m, "a finite number > 1");
        }
        if !(0.0..=1.0).contains(&self.threshold) {
            return bad("threshold", &self.threshold, "in [0, 1]");
        }
        let widths = [
            ("division_shuffles", self.division_shuffles, 100),
            ("joint_dim", self.joint_dim, MAX_WIDTH),
            ("hidden", self.hidden, MAX_WIDTH),
            ("cnn_width", self.cnn_width, 512),
            ("word_dim", self.word_dim, MAX_WIDTH),
        ];
        for (key, v, max) in widths {
            if !(1..=max).contains(&v) {
                return bad(key, &v, &format!("1 to {max}"));
            }
        }
        if !(1..=1000).contains(&self.reference_neighbours) {
            return bad(
                "reference_neighbours",
                &self.reference_neighbours,
                "1 to 1000",
            );
        }
        if !(1..=65_536).contains(&self.reference_images) {
            return bad("reference_images", &self.reference_images, "1 to 65536");
        }
        if self.image_size < 8 || self.image_size > 1024 {
            return bad("image_size", &self.image_size, "8 to 1024 pixels");
        }
        Ok(())
    }

    /// Learning rate at `epoch` (0-based): `lr`, times `lr_decay` for every
    /// entry of `lr_decay_epochs` at or before it.
    pub fn lr_at(&self, epoch: usize) -> f64 {
        let decays = self.lr_decay_epochs.iter().filter(|&&e| epoch >= e).count();
        self.lr * self.lr_decay.powi(decays as i32)
    }

    /// Parse the method-specific `[params]` table into `T`; errors name the
    /// offending key.
    pub fn method_params<T: serde::de::DeserializeOwned>(&self, method: &str) -> Result<T, String> {
        toml::Value::Table(self.params.clone())
            .try_into()
            .map_err(|e: toml::de::Error| format!("invalid [params] for {method}: {e}"))
    }
}

/// Parse `--set key=value` overrides (TOML values; `params.x=1` sets a
/// method parameter) into a partial table.
pub fn parse_sets(sets: &[String]) -> Result<toml::Table, String> {
    let mut out = toml::Table::new();
    for s in sets {
        let (key, value) = s.split_once('=').ok_or_else(|| {
            format!("--set {s:?}: expected KEY=VALUE, e.g. --set params.beta=0.3")
        })?;
        let parsed: toml::Table = format!("v = {}", value.trim())
            .parse()
            .or_else(|_| format!("v = {:?}", value.trim()).parse())
            .map_err(|e| format!("--set {s:?}: {e}"))?;
        let v = parsed
            .get("v")
            .cloned()
            .unwrap_or(toml::Value::String(value.to_string()));
        let parts: Vec<&str> = key.trim().split('.').collect();
        let mut t = &mut out;
        for p in &parts[..parts.len() - 1] {
            t = t
                .entry(p.to_string())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()))
                .as_table_mut()
                .ok_or_else(|| format!("--set {s:?}: {p} is not a table"))?;
        }
        t.insert(parts[parts.len() - 1].to_string(), v);
    }
    Ok(out)
}
