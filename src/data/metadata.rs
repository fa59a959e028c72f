//! The parquet key–value metadata of the files ncclean writes: every key
//! under `ncclean.`, and one base that says which ncclean wrote the file.

use std::collections::BTreeMap;

/// Parquet key–value metadata, keys under `ncclean.`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metadata(BTreeMap<String, String>);

impl Metadata {
    /// `ncclean.version` alone: the data ncclean makes (demo, corrupt).
    pub fn versioned() -> Metadata {
        let mut m = Metadata::default();
        m.put("version", env!("CARGO_PKG_VERSION"));
        m
    }

    /// `ncclean.version` and `ncclean.build` (the commit, features and
    /// target): what labels and filtered outputs carry, so that a file
    /// found later says exactly which build wrote it.
    pub fn of_build() -> Metadata {
        let mut m = Metadata::versioned();
        m.put(
            "build",
            crate::runtime::build_info::current().json().to_string(),
        );
        m
    }

    /// Set `ncclean.<key>`.
    pub fn put(&mut self, key: &str, value: impl Into<String>) {
        self.0.insert(format!("ncclean.{key}"), value.into());
    }

    /// The map to write.
    pub fn into_map(self) -> BTreeMap<String, String> {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_prefixed_and_the_build_extends_the_version() {
        let mut m = Metadata::versioned();
        m.put("demo.seed", "3");
        let map = m.into_map();
        assert_eq!(map["ncclean.version"], env!("CARGO_PKG_VERSION"));
        assert_eq!(map["ncclean.demo.seed"], "3");
        let b = Metadata::of_build().into_map();
        assert!(b.contains_key("ncclean.build"));
        assert_eq!(b.len(), 2);
    }
}
