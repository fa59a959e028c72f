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

/// The demo towers (a 16-pixel CNN of width 4, a bag of 12 words) with
/// local heads and GPO pooling: the smallest model ReCon trains.
pub(crate) fn demo_local_model() -> ModelConfig {
    ModelConfig {
        image: ImageTowerConfig::DemoCnn {
            image_size: 16,
            width: 4,
        },
        text: TextTowerConfig::DemoBow {
            vocab_size: 12,
            dim: 6,
        },
        joint_dim: 5,
        hidden: 7,
        head: ncclean_models::LocalOptions {
            local: true,
            pooling: ncclean_models::Pooling::Gpo,
            unit_inputs: false,
        },
    }
}

/// `captions.len()` pairs of 16-pixel images (fixed pseudo-random bytes)
/// and the given token captions, for [`demo_local_model`].
pub(crate) fn pixel_pairs(captions: Vec<Vec<u32>>) -> PairInputs {
    PairInputs {
        images: ImageInputs::Pixels {
            data: (0..captions.len() * 3 * 256)
                .map(|i| (i * 13 % 251) as u8)
                .collect(),
            size: 16,
        },
        texts: TextInputs::Tokens(captions),
    }
}
