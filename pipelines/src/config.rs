//! Pipeline configuration: built-in presets (TOML files under `presets/`),
//! overridden by a user file and then by flags.

use serde::{Deserialize, Serialize};

use ncclean_models::{LocalOptions, ModelConfig, Pooling};

use crate::division::MixtureKind;
use crate::registry;

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
    /// similarity and the neighbourhood score, calibrated against random
    /// pairings) or `division` (the method's own mixture posterior over its
    /// division statistic, as the papers define it).
    #[serde(default)]
    pub clean_prob: CleanProbSource,
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

/// The matching head `method` gets under `cfg`: the one place that decides
/// whether local features are loaded and local heads built (the registry
/// says which methods' losses need local features whatever the pooling).
pub fn head_for(method: &str, cfg: &TrainConfig) -> LocalOptions {
    let needs_local = registry::find(method).is_ok_and(|m| m.needs_local_features);
    LocalOptions::for_pooling(cfg.head, needs_local).with_unit_inputs(cfg.unit_inputs)
}

/// Resolve a configuration: the method's preset, then `user` TOML (a partial
/// table), then `overrides` (also a partial table, from flags).
pub fn resolve(
    method: &str,
    user: Option<&str>,
    overrides: &toml::Table,
) -> Result<TrainConfig, String> {
    resolve_with_notes(method, user, overrides).map(|(cfg, _)| cfg)
}

/// [`resolve`], with a note for each value it derived rather than took:
/// a preset's warm-up longer than the `epochs` the user asked for (and no
/// warm-up given) is shortened to the same share of the run, where it used
/// to be refused (`--method esc --epochs 5` against ESC's 10 warm-up epochs).
pub fn resolve_with_notes(
    method: &str,
    user: Option<&str>,
    overrides: &toml::Table,
) -> Result<(TrainConfig, Vec<String>), String> {
    let preset = registry::find(method).map_err(|e| e.to_string())?.preset;
    let mut table: toml::Table = preset
        .parse()
        .map_err(|e| format!("built-in preset for {method} is invalid: {e}"))?;
    let preset_schedule = (
        table.get("warmup_epochs").and_then(toml::Value::as_integer),
        table.get("epochs").and_then(toml::Value::as_integer),
    );
    let mut warmup_given = overrides.contains_key("warmup_epochs");
    if let Some(u) = user {
        let t: toml::Table = u
            .parse()
            .map_err(|e| format!("config file is not valid TOML: {e}"))?;
        // A config file may hold one table per method; take ours, else the top level.
        let t = match t.get(method) {
            Some(toml::Value::Table(inner)) => inner.clone(),
            // Tables for other methods are not ours to apply.
            _ => t
                .into_iter()
                .filter(|(k, _)| registry::find(k).is_err())
                .collect(),
        };
        warmup_given |= t.contains_key("warmup_epochs");
        merge(&mut table, &t);
    }
    merge(&mut table, overrides);
    let mut cfg: TrainConfig = toml::Value::Table(table)
        .try_into()
        .map_err(|e: toml::de::Error| format!("invalid configuration: {e}"))?;
    let mut notes = Vec::new();
    if let (false, (Some(w), Some(e))) = (warmup_given, preset_schedule) {
        let (w, e) = (w.max(0) as usize, e.max(1) as usize);
        if w > cfg.epochs {
            cfg.warmup_epochs = shortened_warmup(w, e, cfg.epochs);
            notes.push(format!(
                "warm-up: {} of the {} epochs (the {method} preset warms up {w} of {e}; \
                 --warmup-epochs sets it)",
                cfg.warmup_epochs, cfg.epochs
            ));
        }
    }
    Ok((cfg, notes))
}

/// A preset's warm-up of `warmup` of `epochs` epochs, fitted to a run of
/// `run` epochs: the same share, rounded, but at least one warm-up epoch
/// (the division needs a model trained on something) and at least one
/// epoch after it when the run has two (or it would never divide).
fn shortened_warmup(warmup: usize, epochs: usize, run: usize) -> usize {
    let share = (run as f64 * warmup as f64 / epochs as f64).round() as usize;
    share.clamp(1, run.saturating_sub(1).max(1))
}

/// Merge `over` into `base`; nested tables merge key by key, so a file can
/// override one method parameter without restating the others.
fn merge(base: &mut toml::Table, over: &toml::Table) {
    for (k, v) in over {
        match (base.get_mut(k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            _ => {
                base.insert(k.clone(), v.clone());
            }
        }
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

/// The model configuration of a run of `method`, from the train config and
/// the shape of the inputs.
pub fn model_config(
    method: &str,
    cfg: &TrainConfig,
    image: ncclean_models::ImageTowerConfig,
    text: ncclean_models::TextTowerConfig,
) -> ModelConfig {
    ModelConfig {
        image,
        text,
        joint_dim: cfg.joint_dim,
        hidden: cfg.hidden,
        head: head_for(method, cfg),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preset_then_file_then_flags() {
        let base = resolve("vanilla", None, &toml::Table::new()).unwrap();
        let file = "[vanilla]\nepochs = 7\nlr = 0.5\n";
        let mut flags = toml::Table::new();
        flags.insert("epochs".into(), toml::Value::Integer(3));
        let c = resolve("vanilla", Some(file), &flags).unwrap();
        assert_eq!(c.epochs, 3);
        assert_eq!(c.lr, 0.5);
        assert_eq!(c.batch_size, base.batch_size);
    }

    #[test]
    fn a_preset_warmup_longer_than_the_run_keeps_its_share() {
        let epochs = |n: i64| toml::Table::from_iter([("epochs".to_string(), n.into())]);
        // ESC's preset warms up 10 of 50 epochs: a 5-epoch run warms up 1.
        let (c, notes) = resolve_with_notes("esc", None, &epochs(5)).unwrap();
        assert_eq!((c.epochs, c.warmup_epochs), (5, 1));
        assert_eq!(
            notes,
            [
                "warm-up: 1 of the 5 epochs (the esc preset warms up 10 of 50; \
              --warmup-epochs sets it)"
            ]
        );
        // Vanilla's 3 of 10: 2 epochs keep one after the warm-up, 1 is all warm-up.
        assert_eq!(
            resolve("vanilla", None, &epochs(2)).unwrap().warmup_epochs,
            1
        );
        assert_eq!(
            resolve("vanilla", None, &epochs(1)).unwrap().warmup_epochs,
            1
        );
        // A run at least as long as the preset's warm-up keeps it as it is.
        let (c, notes) = resolve_with_notes("vanilla", None, &epochs(3)).unwrap();
        assert_eq!((c.warmup_epochs, notes.len()), (3, 0));
        // A warm-up the user gave (flag or file) is never changed: too long,
        // it is refused by validate as before.
        let mut flags = epochs(2);
        flags.insert("warmup_epochs".into(), 3.into());
        assert_eq!(resolve("vanilla", None, &flags).unwrap().warmup_epochs, 3);
        let file = "warmup_epochs = 4\n";
        let c = resolve("vanilla", Some(file), &epochs(2)).unwrap();
        assert_eq!(c.warmup_epochs, 4);
        assert!(c.validate().is_err());
        assert_eq!(shortened_warmup(10, 50, 30), 6);
        assert_eq!(shortened_warmup(5, 40, 4), 1);
        assert_eq!(shortened_warmup(9, 10, 8), 7);
    }

    #[test]
    fn nested_params_merge_and_sets_parse() {
        let mut base: toml::Table = "a = 1\n[params]\nx = 1\ny = 2\n".parse().unwrap();
        let over = parse_sets(&["params.y=3".into(), "a=0.5".into(), "name=gmm".into()]).unwrap();
        merge(&mut base, &over);
        assert_eq!(base["a"].as_float(), Some(0.5));
        assert_eq!(base["params"]["x"].as_integer(), Some(1));
        assert_eq!(base["params"]["y"].as_integer(), Some(3));
        assert_eq!(base["name"].as_str(), Some("gmm"));
        assert!(parse_sets(&["novalue".into()]).is_err());
    }

    #[test]
    fn a_file_with_tables_for_other_methods_does_not_leak_into_ours() {
        let file = "[vanilla]\nepochs = 7\n";
        let c = resolve("vanilla", Some(file), &toml::Table::new()).unwrap();
        assert_eq!(c.epochs, 7);
        let base = resolve("esc", None, &toml::Table::new()).unwrap();
        assert_eq!(
            resolve("esc", Some(file), &toml::Table::new()).unwrap(),
            base
        );
    }

    #[test]
    fn the_head_is_mean_unless_set_and_recon_always_gets_local_heads() {
        let c = resolve("vanilla", None, &toml::Table::new()).unwrap();
        assert_eq!(c.head, Pooling::Mean);
        assert!(!head_for("vanilla", &c).local);
        let gpo = parse_sets(&["head=gpo".into()]).unwrap();
        let c = resolve("esc", None, &gpo).unwrap();
        assert_eq!(
            head_for("esc", &c),
            LocalOptions {
                local: true,
                pooling: Pooling::Gpo,
                unit_inputs: c.unit_inputs,
            }
        );
        let mean = parse_sets(&["head=mean".into()]).unwrap();
        let c = resolve("recon", None, &mean).unwrap();
        assert_eq!(
            head_for("recon", &c),
            LocalOptions {
                local: true,
                pooling: Pooling::Mean,
                unit_inputs: c.unit_inputs,
            }
        );
        let c = resolve("recon", None, &toml::Table::new()).unwrap();
        assert_eq!(head_for("recon", &c).pooling, Pooling::Gpo);
        // unit_inputs: off unless set, then carried into the model's head.
        assert!(!head_for("gsc", &resolve("gsc", None, &toml::Table::new()).unwrap()).unit_inputs);
        let unit = parse_sets(&["unit_inputs=true".into()]).unwrap();
        assert!(head_for("gsc", &resolve("gsc", None, &unit).unwrap()).unit_inputs);
        let bad = parse_sets(&["head=max".into()]).unwrap();
        let e = resolve("vanilla", None, &bad).unwrap_err();
        assert!(e.contains("max") && e.contains("gpo"), "{e}");
    }

    #[test]
    fn every_preset_is_valid_and_bad_values_name_key_value_and_range() {
        for m in crate::registry::names() {
            let c = resolve(m, None, &toml::Table::new()).unwrap();
            assert_eq!(c.validate(), Ok(()), "{m}");
        }
        let base = resolve("vanilla", None, &toml::Table::new()).unwrap();
        let cases: [(&str, TrainConfig); 12] = [
            (
                "epochs = 0",
                TrainConfig {
                    epochs: 0,
                    ..base.clone()
                },
            ),
            (
                "warmup_epochs = 11",
                TrainConfig {
                    warmup_epochs: 11,
                    ..base.clone()
                },
            ),
            (
                "lr = NaN",
                TrainConfig {
                    lr: f64::NAN,
                    ..base.clone()
                },
            ),
            (
                "lr = -0.1",
                TrainConfig {
                    lr: -0.1,
                    ..base.clone()
                },
            ),
            (
                "joint_dim = 0",
                TrainConfig {
                    joint_dim: 0,
                    ..base.clone()
                },
            ),
            (
                "epochs = 10001",
                TrainConfig {
                    epochs: MAX_EPOCHS + 1,
                    ..base.clone()
                },
            ),
            (
                "batch_size = 16385",
                TrainConfig {
                    batch_size: MAX_BATCH + 1,
                    ..base.clone()
                },
            ),
            (
                "hidden = 1000000000",
                TrainConfig {
                    hidden: 1_000_000_000,
                    ..base.clone()
                },
            ),
            (
                "cnn_width = 513",
                TrainConfig {
                    cnn_width: 513,
                    ..base.clone()
                },
            ),
            (
                "division_shuffles = 101",
                TrainConfig {
                    division_shuffles: 101,
                    ..base.clone()
                },
            ),
            (
                "soft_margin_m = 1",
                TrainConfig {
                    soft_margin_m: 1.0,
                    ..base.clone()
                },
            ),
            (
                "threshold = 2",
                TrainConfig {
                    threshold: 2.0,
                    ..base.clone()
                },
            ),
        ];
        for (want, c) in cases {
            let e = c.validate().unwrap_err();
            assert!(
                e.starts_with(want) && e.contains("out of range"),
                "{want}: {e}"
            );
        }
    }

    #[test]
    fn errors_name_the_problem() {
        assert!(resolve("nope", None, &toml::Table::new())
            .unwrap_err()
            .contains("unknown method"));
        let e = resolve("vanilla", Some("epochz = 3"), &toml::Table::new()).unwrap_err();
        assert!(e.contains("epochz"), "{e}");
    }
}
