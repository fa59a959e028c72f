//! Fixtures shared by the pipelines' unit tests.

use ncclean_models::{
    ImageInputs, ImageTowerConfig, ModelConfig, PairInputs, TextInputs, TextTowerConfig,
};

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

/// The 3×3 batch similarity matrix the hand-computed loss tests share:
/// `S = [[0.9, 0.5, 0.1], [0.2, 0.3, 0.6], [0.4, 0.0, 0.8]]` (at τ = 0.1 the
/// logits are `[[9, 5, 1], [2, 3, 6], [4, 0, 8]]`).
pub(crate) fn s3() -> candle_core::Tensor {
    candle_core::Tensor::new(
        &[[0.9f32, 0.5, 0.1], [0.2, 0.3, 0.6], [0.4, 0.0, 0.8]],
        &candle_core::Device::Cpu,
    )
    .expect("a constant 3×3 tensor")
}

/// Asserts equal lengths and element-wise agreement within 1e-5.
pub(crate) fn close(a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() < 1e-5, "{a:?} vs {b:?}");
    }
}

/// Pairs given as precomputed global vectors of width `dim` on both sides.
pub(crate) fn embedding_pairs(images: Vec<f32>, texts: Vec<f32>, dim: usize) -> PairInputs {
    PairInputs {
        images: ImageInputs::Embeddings {
            data: images,
            dim,
            local: None,
        },
        texts: TextInputs::Embeddings {
            data: texts,
            dim,
            local: None,
        },
    }
}
