//! Resolving a method's configuration: its built-in preset (a TOML file
//! under `presets/`, named by its [`crate::registry`] row), overridden by a
//! user file and then by flags, and the matching head the method needs.

use ncclean_models::{LocalOptions, ModelConfig};

use crate::config::TrainConfig;
use crate::registry;

/// The matching head `method` gets under `cfg`: the one place that decides
/// whether local features are loaded and local heads built (the registry
/// says which methods' losses need local features whatever the pooling).
pub fn head_for(method: &str, cfg: &TrainConfig) -> LocalOptions {
    let needs_local = registry::find(method).is_ok_and(|m| m.needs_local_features);
    LocalOptions::for_pooling(cfg.head, needs_local).with_unit_inputs(cfg.unit_inputs)
}

/// Whether a run's towers train with the matching head or are frozen: the
/// one fact about the run, besides the method, that picks the schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Towers {
    /// Towers trained from scratch with the head (the demo's toy towers):
    /// the paper's schedule, the preset's top level.
    #[default]
    Trained,
    /// Frozen pretrained or precomputed features, only the head trains: the
    /// preset's `[frozen]` table over its top level. A head on fixed
    /// features memorises noisy pairs within a few epochs, so the papers'
    /// 40–60 epochs (written for towers that train) cost ten times the time
    /// and rank real pairs worse (BENCHMARKS.md).
    Frozen,
}

/// Resolve a configuration for trained towers: the method's preset, then
/// `user` TOML (a partial table), then `overrides` (also a partial table,
/// from flags). [`resolve_with_notes`] takes the towers.
pub fn resolve(
    method: &str,
    user: Option<&str>,
    overrides: &toml::Table,
) -> Result<TrainConfig, String> {
    resolve_with_notes(method, Towers::Trained, user, overrides).map(|(cfg, _)| cfg)
}

/// The configuration of `method` on `towers`: its preset (with its
/// `[frozen]` table on frozen towers), then `user`, then `overrides`; with a
/// note for each value it derived rather than took: the frozen-tower
/// schedule, and a preset's warm-up longer than the `epochs` the user asked
/// for (and no warm-up given) shortened to the same share of the run, where
/// it used to be refused (`--method esc --epochs 5` against ESC's 10
/// warm-up epochs).
pub fn resolve_with_notes(
    method: &str,
    towers: Towers,
    user: Option<&str>,
    overrides: &toml::Table,
) -> Result<(TrainConfig, Vec<String>), String> {
    let preset = registry::find(method).map_err(|e| e.to_string())?.preset;
    let mut table: toml::Table = preset
        .parse()
        .map_err(|e| format!("built-in preset for {method} is invalid: {e}"))?;
    let mut notes = Vec::new();
    // (the frozen schedule, the paper's), said once the user's values are on top.
    let mut frozen_note: Option<(String, String)> = None;
    let frozen = match table.remove("frozen") {
        Some(toml::Value::Table(t)) => Some(t),
        Some(_) => {
            return Err(format!(
                "built-in preset for {method}: [frozen] is not a table"
            ))
        }
        None => None,
    };
    if let (Towers::Frozen, Some(frozen)) = (towers, frozen) {
        let value = |t: &toml::Table, k: &str| t.get(k).map(ToString::to_string);
        let schedule = |t: &toml::Table| {
            format!(
                "{} epochs, lr {}",
                value(t, "epochs").unwrap_or_default(),
                value(t, "lr").unwrap_or_default()
            )
        };
        let paper = schedule(&table);
        merge(&mut table, &frozen);
        frozen_note = Some((schedule(&table), paper));
    }
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
    if let Some((short, paper)) = frozen_note {
        // A flag or a file that changed the schedule is named, so the note
        // does not promise epochs the run will not train.
        let run = format!("{} epochs, lr {}", cfg.epochs, toml::Value::Float(cfg.lr));
        let yours = if run == short {
            String::new()
        } else {
            format!(", with your settings on top: {run}")
        };
        notes.push(format!(
            "schedule: the towers are frozen, so {method} trains its head on the preset's \
             frozen-feature schedule ({short}) rather than the paper's ({paper}), which \
             memorises noisy pairs on fixed features{yours}; --epochs, --lr or --config set it"
        ));
    }
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
    use crate::config::{parse_sets, MAX_BATCH, MAX_EPOCHS};
    use ncclean_models::Pooling;

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
        let (c, notes) = resolve_with_notes("esc", Towers::Trained, None, &epochs(5)).unwrap();
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
        let (c, notes) = resolve_with_notes("vanilla", Towers::Trained, None, &epochs(3)).unwrap();
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
    fn frozen_towers_take_the_presets_short_schedule_and_flags_still_win() {
        let none = toml::Table::new();
        let frozen = |m: &str, over: &toml::Table| {
            resolve_with_notes(m, Towers::Frozen, None, over).unwrap()
        };
        // Trained towers keep the paper's schedule, frozen ones the short one.
        let paper = resolve("gsc", None, &none).unwrap();
        let (short, notes) = frozen("gsc", &none);
        assert_eq!((paper.epochs, paper.lr), (60, 2e-4));
        assert_eq!((short.epochs, short.lr), (5, 1e-3));
        assert!(short.lr_decay_epochs.is_empty());
        assert_eq!(short.batch_size, paper.batch_size);
        assert_eq!(
            notes,
            [
                "schedule: the towers are frozen, so gsc trains its head on the preset's \
              frozen-feature schedule (5 epochs, lr 0.001) rather than the paper's \
              (60 epochs, lr 0.0002), which memorises noisy pairs on fixed features; \
              --epochs, --lr or --config set it"
            ]
        );
        // A flag or a file overrides the frozen schedule key by key.
        let over = toml::Table::from_iter([("epochs".to_string(), 9.into())]);
        let (c, notes) = frozen("gsc", &over);
        assert_eq!((c.epochs, c.lr), (9, 1e-3));
        assert!(
            notes[0].contains("on fixed features, with your settings on top: 9 epochs, lr 0.001;"),
            "{notes:?}"
        );
        let (c, _) = resolve_with_notes(
            "crcl",
            Towers::Frozen,
            Some("[params]\nfreeze_epochs = 2\n"),
            &none,
        )
        .unwrap();
        let (base, _) = frozen("crcl", &none);
        assert_eq!(c.epochs, base.epochs);
        assert_eq!(c.params["freeze_epochs"].as_integer(), Some(2));
        assert_ne!(c.params, base.params);
        // Every method's frozen schedule is a valid configuration.
        for m in registry::METHODS {
            let (c, notes) = frozen(m.name, &none);
            registry::validate(m.name, &c).unwrap();
            assert_eq!(notes.len(), 1, "{}", m.name);
        }
    }

    #[test]
    fn the_benchmark_config_is_the_frozen_schedule() {
        // examples/configs/flickr8k.toml predates the frozen schedules and
        // holds the same values: on frozen towers "as shipped" and "with the
        // config" are the same run (BENCHMARKS.md's rows of both).
        let file = include_str!("../../examples/configs/flickr8k.toml");
        let none = toml::Table::new();
        for m in registry::METHODS {
            let (shipped, _) = resolve_with_notes(m.name, Towers::Frozen, None, &none).unwrap();
            let (config, _) =
                resolve_with_notes(m.name, Towers::Frozen, Some(file), &none).unwrap();
            assert_eq!(shipped, config, "{}", m.name);
            assert_eq!(
                shipped,
                resolve(m.name, Some(file), &none).unwrap(),
                "{}",
                m.name
            );
        }
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
