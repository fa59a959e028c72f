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
    /// Method-specific parameters (the `[params]` table of a preset); each
    /// pipeline parses them into its own struct and rejects unknown keys.
    #[serde(default)]
    pub params: toml::Table,
}

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
        if self.batch_size < 2 {
            return bad(
                "batch_size",
                &self.batch_size,
                "at least 2 (in-batch negatives)",
            );
        }
        let positive = [("lr", self.lr), ("lr_decay", self.lr_decay)];
        for (key, v) in positive {
            if !(v.is_finite() && v > 0.0) {
                return bad(key, &v, "a finite number > 0");
            }
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
            ("division_shuffles", self.division_shuffles),
            ("joint_dim", self.joint_dim),
            ("hidden", self.hidden),
            ("cnn_width", self.cnn_width),
            ("word_dim", self.word_dim),
        ];
        for (key, v) in widths {
            if v == 0 {
                return bad(key, &v, "at least 1");
            }
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
    let preset = registry::find(method).map_err(|e| e.to_string())?.preset;
    let mut table: toml::Table = preset
        .parse()
        .map_err(|e| format!("built-in preset for {method} is invalid: {e}"))?;
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
        merge(&mut table, &t);
    }
    merge(&mut table, overrides);
    toml::Value::Table(table)
        .try_into()
        .map_err(|e: toml::de::Error| format!("invalid configuration: {e}"))
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
        let cases: [(&str, TrainConfig); 7] = [
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
