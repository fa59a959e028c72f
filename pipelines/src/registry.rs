//! The one table of methods: every place that needs a method's name, preset,
//! constructor or requirements (the CLI's `--method` choices and help, the
//! configuration resolution, the engine) reads it here.

use candle_core::Device;
use ncclean_models::ModelConfig;

use crate::config::TrainConfig;
use crate::error::{Error, Result};
use crate::methods::{crcl, esc, gsc, recon, vanilla};
use crate::pipeline::Pipeline;
use crate::runner::{build, validate_params};

/// Builds a fresh pipeline of one method from its configuration, model,
/// seed and device.
pub type Build = fn(TrainConfig, &ModelConfig, u64, &Device) -> Result<Box<dyn Pipeline>>;

/// One method as the rest of ncclean sees it.
pub struct MethodInfo {
    /// Name on the command line.
    pub name: &'static str,
    /// One line for `--help`.
    pub summary: &'static str,
    /// The preset TOML (`presets/<name>.toml`): the paper's defaults.
    pub preset: &'static str,
    /// Whether the losses read local features (grid cells / patches and
    /// tokens), so the model needs local heads whatever the pooling.
    pub needs_local_features: bool,
    /// Build a fresh pipeline.
    pub build: Build,
    /// Check a configuration without building anything.
    pub validate: fn(&TrainConfig) -> Result<()>,
}

/// Every method, in the order `--help` lists them.
pub const METHODS: &[MethodInfo] = &[
    MethodInfo {
        name: "vanilla",
        summary: "NCR-like reference: per-sample hinge -> GMM -> soft-margin hinge on the clean part",
        preset: include_str!("../presets/vanilla.toml"),
        needs_local_features: false,
        build: build::<vanilla::Vanilla>,
        validate: validate_params::<vanilla::Vanilla>,
    },
    MethodInfo {
        name: "esc",
        summary: "ESC (CVPR 2024): equivariant similarity consistency, BMM division, BiCro soft labels, two co-taught networks",
        preset: include_str!("../presets/esc.toml"),
        needs_local_features: false,
        build: build::<esc::Esc>,
        validate: validate_params::<esc::Esc>,
    },
    MethodInfo {
        name: "gsc",
        summary: "GSC (CVPR 2024): cross- and intra-modal geometrical structure consistency, momentum labels, two networks",
        preset: include_str!("../presets/gsc.toml"),
        needs_local_features: false,
        build: build::<gsc::Gsc>,
        validate: validate_params::<gsc::Gsc>,
    },
    MethodInfo {
        name: "crcl",
        summary: "CRCL (NeurIPS 2023): active complementary loss, momentum label correction, self-refining pieces",
        preset: include_str!("../presets/crcl.toml"),
        needs_local_features: false,
        build: build::<crcl::Crcl>,
        validate: validate_params::<crcl::Crcl>,
    },
    MethodInfo {
        name: "recon",
        summary: "ReCon (CVPR 2025): InfoNCE division, intra-modal relation consistency on local features, GPO pooling",
        preset: include_str!("../presets/recon.toml"),
        needs_local_features: true,
        build: build::<recon::Recon>,
        validate: validate_params::<recon::Recon>,
    },
];

/// Check `cfg` for `method` before any input is read: the shared keys'
/// ranges, then the method's own parameters and schedule (as the method
/// would on construction). Errors are [`Error::Config`].
pub fn validate(method: &str, cfg: &TrainConfig) -> Result<()> {
    cfg.validate().map_err(Error::Config)?;
    (find(method)?.validate)(cfg)
}

/// Names of every method, in table order.
pub fn names() -> impl Iterator<Item = &'static str> {
    METHODS.iter().map(|m| m.name)
}

/// The method called `name`, or a configuration error listing the choices.
pub fn find(name: &str) -> Result<&'static MethodInfo> {
    METHODS.iter().find(|m| m.name == name).ok_or_else(|| {
        Error::Config(format!(
            "unknown method {name:?}; available: {}",
            names().collect::<Vec<_>>().join(", ")
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_is_consistent_with_its_method() {
        use crate::method::Method;
        let consts = [
            vanilla::Vanilla::NAME,
            esc::Esc::NAME,
            gsc::Gsc::NAME,
            crcl::Crcl::NAME,
            recon::Recon::NAME,
        ];
        assert_eq!(names().collect::<Vec<_>>(), consts);
        for m in METHODS {
            assert!(find(m.name).is_ok());
            // Every preset parses into a configuration.
            let c = crate::presets::resolve(m.name, None, &toml::Table::new());
            assert!(c.is_ok(), "{}: {:?}", m.name, c.err());
        }
        let e = find("nope").err().expect("unknown method");
        assert!(matches!(e, Error::Config(_)));
        assert!(
            e.to_string().contains("vanilla, esc, gsc, crcl, recon"),
            "{e}"
        );
    }
}
