//! What identifies this build in a bug report: `ncclean --version` prints
//! it, and run.json and the labels' metadata record it. The commit, target
//! and profile come from build.rs; the features from `cfg!`.

use serde::Serialize;

/// The version, git commit, enabled cargo features, target and profile of
/// this binary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BuildInfo {
    /// The crate version (`Cargo.toml`).
    pub version: &'static str,
    /// The git commit built (12 hex digits), or "unknown" when built outside
    /// a git checkout (a tarball, a crate download).
    pub commit: &'static str,
    /// The optional cargo features compiled in, of cuda, hub and polars.
    pub features: Vec<&'static str>,
    /// The target triple, e.g. `x86_64-unknown-linux-gnu`.
    pub target: &'static str,
    /// The cargo profile's optimisation: `release` or `debug`.
    pub profile: &'static str,
}

/// This binary's build.
pub fn current() -> BuildInfo {
    let features = [
        ("cuda", cfg!(feature = "cuda")),
        ("hub", cfg!(feature = "hub")),
        ("polars", cfg!(feature = "polars")),
    ]
    .into_iter()
    .filter_map(|(name, on)| on.then_some(name))
    .collect();
    BuildInfo {
        version: env!("CARGO_PKG_VERSION"),
        commit: env!("NCCLEAN_GIT_COMMIT"),
        features,
        target: env!("NCCLEAN_TARGET"),
        profile: env!("NCCLEAN_PROFILE"),
    }
}

impl BuildInfo {
    /// The lines `ncclean --version` prints.
    pub fn text(&self) -> String {
        let features = if self.features.is_empty() {
            "none".to_string()
        } else {
            self.features.join(", ")
        };
        format!(
            "ncclean {}\ncommit: {}\nfeatures: {features}\ntarget: {}\nprofile: {}\n",
            self.version, self.commit, self.target, self.profile
        )
    }

    /// The same as one JSON object (`--version --json`, run.json's
    /// `ncclean_build`, the labels' `ncclean.build`).
    pub fn json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_and_json_say_the_same() {
        let b = current();
        let j = b.json();
        assert_eq!(j["version"], b.version);
        assert_eq!(j["commit"], b.commit);
        assert_eq!(j["target"], b.target);
        assert!(b.text().starts_with(&format!("ncclean {}\n", b.version)));
        assert!(b.text().contains(&format!("commit: {}\n", b.commit)));
        assert_eq!(
            j["features"].as_array().map(Vec::len),
            Some(b.features.len())
        );
    }
}
