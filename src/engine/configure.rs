//! The method's configuration for `fit`: its preset (on frozen towers,
//! with its short schedule for a head on fixed features), then a
//! `--config` file, then the flags and `--set` overrides on top; the flags
//! are checked before any input is read.

use std::path::PathBuf;

use ncclean_pipelines::presets::Towers;
use ncclean_pipelines::TrainConfig;

use crate::error::{invalid, Error, Result};
use crate::runtime::progress::Reporter;

/// The configuration flags of `fit`, as given.
#[derive(Debug, Clone, Default)]
pub struct ConfigFlags {
    /// Method name (its preset is the base).
    pub method: String,
    /// `--config`: a TOML file overriding the preset.
    pub config: Option<PathBuf>,
    /// `--set KEY=VALUE` overrides, as TOML.
    pub sets: Vec<String>,
    /// `--epochs`.
    pub epochs: Option<usize>,
    /// `--warmup-epochs`.
    pub warmup_epochs: Option<usize>,
    /// `--batch-size`.
    pub batch_size: Option<usize>,
    /// `--lr`.
    pub lr: Option<f64>,
    /// `--head`.
    pub head: Option<String>,
}

/// Flags that override the configuration, as a partial TOML table; a key
/// both a flag and `--set` give is refused.
fn overrides(f: &ConfigFlags) -> Result<toml::Table> {
    let mut t = ncclean_pipelines::config::parse_sets(&f.sets).map_err(Error::Usage)?;
    // Saturated: a count past i64 is refused by validate as out of range,
    // naming the key (a wrapped -1 was not).
    let int = |v: usize| toml::Value::Integer(i64::try_from(v).unwrap_or(i64::MAX));
    let flags = [
        ("epochs", "--epochs", f.epochs.map(int)),
        ("warmup_epochs", "--warmup-epochs", f.warmup_epochs.map(int)),
        ("batch_size", "--batch-size", f.batch_size.map(int)),
        ("lr", "--lr", f.lr.map(toml::Value::Float)),
        ("head", "--head", f.head.clone().map(toml::Value::String)),
    ];
    for (key, flag, value) in flags {
        let Some(value) = value else { continue };
        // One of the two would be dropped without a word.
        if let Some(set) = t.get(key) {
            return Err(Error::Usage(format!(
                "--set {key}={set} and {flag} {value} both set {key}; give one of them"
            )));
        }
        t.insert(key.into(), value);
    }
    Ok(t)
}

/// Check `flags` before any input is read (exit 2 or 3 naming the key, the
/// value and the allowed range): the configuration they give on towers that
/// train. [`resolve`] gives the run's own once its towers are chosen.
pub fn check(flags: &ConfigFlags) -> Result<()> {
    resolve_on(flags, Towers::Trained).map(|_| ())
}

/// The configuration `flags` resolve to on `towers` (the preset's frozen
/// schedule where the towers are frozen), every key's range and the
/// method's own parameters checked (exit 2 naming the key, the value and
/// the allowed range); the resolution's notes are said on stderr.
pub fn resolve(flags: &ConfigFlags, towers: Towers, rep: &Reporter) -> Result<TrainConfig> {
    let (config, notes) = resolve_on(flags, towers)?;
    for note in &notes {
        rep.info(note);
    }
    Ok(config)
}

/// [`resolve`] without saying its notes.
fn resolve_on(flags: &ConfigFlags, towers: Towers) -> Result<(TrainConfig, Vec<String>)> {
    let user = match &flags.config {
        Some(p) => Some(crate::runtime::small_file::read_text(
            p,
            crate::runtime::small_file::CONFIG_LIMIT,
            "config file",
        )?),
        None => None,
    };
    let (config, notes) = ncclean_pipelines::presets::resolve_with_notes(
        &flags.method,
        towers,
        user.as_deref(),
        &overrides(flags)?,
    )
    .map_err(|e| match &flags.config {
        Some(p) => invalid(format!("{}: {e}", p.display())),
        None => Error::Usage(e),
    })?;
    ncclean_pipelines::registry::validate(&flags.method, &config)?;
    Ok((config, notes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flag_and_a_set_of_the_same_key_are_refused() {
        let flags = ConfigFlags {
            sets: vec!["epochs=3".into()],
            epochs: Some(4),
            ..ConfigFlags::default()
        };
        assert_eq!(
            overrides(&flags).unwrap_err().to_string(),
            "--set epochs=3 and --epochs 4 both set epochs; give one of them"
        );
        let flags = ConfigFlags {
            lr: Some(0.5),
            batch_size: Some(usize::MAX),
            ..ConfigFlags::default()
        };
        let t = overrides(&flags).unwrap();
        assert_eq!(t["lr"], toml::Value::Float(0.5));
        assert_eq!(t["batch_size"], toml::Value::Integer(i64::MAX));
    }
}
