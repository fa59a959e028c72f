//! Fixtures shared by the pipelines' unit tests.

use ncclean_models::{ImageTowerConfig, ModelConfig, TextTowerConfig};

/// A mean-pooling head over precomputed global vectors of width `dim` on
/// both sides, without local features.
pub(crate) fn precomputed_model(dim: usize, joint_dim: usize, hidden: usize) -> ModelConfig {
    ModelConfig {
        image: ImageTowerConfig::Precomputed {
            dim,
            local_dim: None,
        },
        text: TextTowerConfig::Precomputed {
            dim,
            local_dim: None,
        },
        joint_dim,
        hidden,
        head: Default::default(),
    }
}
