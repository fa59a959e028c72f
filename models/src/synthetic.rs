//! Randomly initialised towers of real shapes, for throughput measurements
//! and precision tests that need an architecture but not its trained
//! weights (`ncclean gpu-check`, the f16/bf16 tolerance tests).
//!
//! A synthetic CLIP is written as a Hugging Face model directory
//! (`config.json`, `model.safetensors`, `tokenizer.json`) and loaded through
//! [`crate::clip_tower::ClipTower::load_with_dtype`], so the measured path
//! is the one real models take.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Result, Tensor};
use tokenizers::models::wordlevel::WordLevel;
use tokenizers::pre_tokenizers::whitespace::Whitespace;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::Tokenizer;

use crate::rng::Rng;

/// Words the synthetic tokenizer knows by name (the rest of the vocabulary
/// is filler), so generated captions tokenise to real ids.
pub const WORDS: [&str; 16] = [
    "a", "dog", "cat", "runs", "on", "grass", "the", "black", "white", "sits", "man", "beach",
    "red", "ball", "with", "child",
];

/// The geometry of a CLIP model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClipShape {
    /// Vision transformer width.
    pub vision_width: usize,
    /// Vision transformer layers.
    pub vision_layers: usize,
    /// Vision attention heads.
    pub vision_heads: usize,
    /// Input side in pixels.
    pub image_size: usize,
    /// Patch side in pixels.
    pub patch_size: usize,
    /// Text transformer width.
    pub text_width: usize,
    /// Text transformer layers.
    pub text_layers: usize,
    /// Text attention heads.
    pub text_heads: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// Text positions.
    pub max_len: usize,
    /// Joint embedding width.
    pub projection: usize,
}

impl ClipShape {
    /// openai/clip-vit-base-patch32: ViT-B/32 at 224 px, 12-layer 512-wide
    /// text transformer, 512-d joint space (151M parameters).
    pub fn vit_b32() -> ClipShape {
        ClipShape {
            vision_width: 768,
            vision_layers: 12,
            vision_heads: 12,
            image_size: 224,
            patch_size: 32,
            text_width: 512,
            text_layers: 12,
            text_heads: 8,
            vocab: 49408,
            max_len: 77,
            projection: 512,
        }
    }

    /// A small CLIP of the same structure (quick CPU runs and tests).
    pub fn small() -> ClipShape {
        ClipShape {
            vision_width: 64,
            vision_layers: 2,
            vision_heads: 4,
            image_size: 64,
            patch_size: 16,
            text_width: 64,
            text_layers: 2,
            text_heads: 4,
            vocab: 512,
            max_len: 32,
            projection: 32,
        }
    }

    /// The Hugging Face `config.json` of this shape.
    pub fn config_json(&self) -> serde_json::Value {
        serde_json::json!({
            "architectures": ["CLIPModel"],
            "model_type": "clip",
            "projection_dim": self.projection,
            "logit_scale_init_value": 2.6592,
            "text_config": {
                "hidden_size": self.text_width, "intermediate_size": 4 * self.text_width,
                "num_hidden_layers": self.text_layers, "num_attention_heads": self.text_heads,
                "max_position_embeddings": self.max_len, "vocab_size": self.vocab,
                "hidden_act": "quick_gelu", "layer_norm_eps": 1e-5,
                "bos_token_id": 2, "eos_token_id": 3, "pad_token_id": 0,
                "projection_dim": self.projection
            },
            "vision_config": {
                "hidden_size": self.vision_width, "intermediate_size": 4 * self.vision_width,
                "num_hidden_layers": self.vision_layers, "num_attention_heads": self.vision_heads,
                "image_size": self.image_size, "patch_size": self.patch_size,
                "num_channels": 3, "hidden_act": "quick_gelu", "layer_norm_eps": 1e-5,
                "projection_dim": self.projection
            }
        })
    }

    /// Every parameter of a HF CLIPModel of this shape, under HF's names,
    /// drawn from `seed`: matrices N(0, 1/fan_in) so activations stay O(1)
    /// through the layers (f16 must not overflow), norms near 1, biases
    /// near 0.
    pub fn weights(&self, seed: u64) -> Result<HashMap<String, Tensor>> {
        let mut rng = Rng::new(seed);
        let mut t = HashMap::new();
        let dev = Device::Cpu;
        let mut put = |name: String, shape: &[usize], kind: Kind| -> Result<()> {
            let n: usize = shape.iter().product();
            let fan_in = shape.iter().skip(1).product::<usize>().max(1) as f64;
            let (scale, offset) = match kind {
                Kind::Matrix => (1.0 / fan_in.sqrt(), 0.0),
                Kind::Embedding => (0.5, 0.0),
                Kind::Norm => (0.05, 1.0),
                Kind::Bias => (0.02, 0.0),
            };
            let values: Vec<f32> = (0..n)
                .map(|_| (offset + scale * rng.normal()) as f32)
                .collect();
            t.insert(name, Tensor::from_vec(values, shape, &dev)?);
            Ok(())
        };
        for (tower, layers, d) in [
            ("text_model", self.text_layers, self.text_width),
            ("vision_model", self.vision_layers, self.vision_width),
        ] {
            let inter = 4 * d;
            for i in 0..layers {
                let p = format!("{tower}.encoder.layers.{i}");
                for proj in ["q_proj", "k_proj", "v_proj", "out_proj"] {
                    put(
                        format!("{p}.self_attn.{proj}.weight"),
                        &[d, d],
                        Kind::Matrix,
                    )?;
                    put(format!("{p}.self_attn.{proj}.bias"), &[d], Kind::Bias)?;
                }
                for ln in ["layer_norm1", "layer_norm2"] {
                    put(format!("{p}.{ln}.weight"), &[d], Kind::Norm)?;
                    put(format!("{p}.{ln}.bias"), &[d], Kind::Bias)?;
                }
                put(format!("{p}.mlp.fc1.weight"), &[inter, d], Kind::Matrix)?;
                put(format!("{p}.mlp.fc1.bias"), &[inter], Kind::Bias)?;
                put(format!("{p}.mlp.fc2.weight"), &[d, inter], Kind::Matrix)?;
                put(format!("{p}.mlp.fc2.bias"), &[d], Kind::Bias)?;
            }
        }
        let (dt, dv) = (self.text_width, self.vision_width);
        put(
            "text_model.embeddings.token_embedding.weight".into(),
            &[self.vocab, dt],
            Kind::Embedding,
        )?;
        put(
            "text_model.embeddings.position_embedding.weight".into(),
            &[self.max_len, dt],
            Kind::Embedding,
        )?;
        put(
            "text_model.final_layer_norm.weight".into(),
            &[dt],
            Kind::Norm,
        )?;
        put("text_model.final_layer_norm.bias".into(), &[dt], Kind::Bias)?;
        put(
            "vision_model.embeddings.class_embedding".into(),
            &[dv],
            Kind::Embedding,
        )?;
        put(
            "vision_model.embeddings.patch_embedding.weight".into(),
            &[dv, 3, self.patch_size, self.patch_size],
            Kind::Matrix,
        )?;
        let positions = (self.image_size / self.patch_size).pow(2) + 1;
        put(
            "vision_model.embeddings.position_embedding.weight".into(),
            &[positions, dv],
            Kind::Embedding,
        )?;
        for ln in ["pre_layrnorm", "post_layernorm"] {
            put(format!("vision_model.{ln}.weight"), &[dv], Kind::Norm)?;
            put(format!("vision_model.{ln}.bias"), &[dv], Kind::Bias)?;
        }
        put(
            "visual_projection.weight".into(),
            &[self.projection, dv],
            Kind::Matrix,
        )?;
        put(
            "text_projection.weight".into(),
            &[self.projection, dt],
            Kind::Matrix,
        )?;
        t.insert("logit_scale".into(), Tensor::new(2.6592f32, &dev)?);
        Ok(t)
    }

    /// Write a loadable model directory of this shape into `dir` (created
    /// if missing): `config.json`, `model.safetensors` and a word-level
    /// `tokenizer.json` over [`WORDS`] and filler tokens.
    pub fn write_dir(&self, dir: &Path, seed: u64) -> Result<()> {
        let io = |e: std::io::Error| candle_core::Error::Msg(format!("{}: {e}", dir.display()));
        std::fs::create_dir_all(dir).map_err(io)?;
        let config = serde_json::to_string_pretty(&self.config_json())
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        std::fs::write(dir.join("config.json"), config).map_err(io)?;
        candle_core::safetensors::save(&self.weights(seed)?, dir.join("model.safetensors"))?;
        word_level_tokenizer(self.vocab)
            .save(dir.join("tokenizer.json"), false)
            .map_err(|e| candle_core::Error::Msg(format!("writing the tokenizer: {e}")))?;
        Ok(())
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Matrix,
    Embedding,
    Norm,
    Bias,
}

/// A WordLevel tokenizer over `[PAD] [UNK] <s> </s>`, [`WORDS`] and filler
/// tokens up to `vocab`, wrapping texts in `<s> … </s>` like CLIP's.
fn word_level_tokenizer(vocab: usize) -> Tokenizer {
    let mut entries: Vec<(String, u32)> = ["[PAD]", "[UNK]", "<s>", "</s>"]
        .iter()
        .map(|s| s.to_string())
        .chain(WORDS.iter().map(|s| s.to_string()))
        .enumerate()
        .map(|(i, w)| (w, i as u32))
        .collect();
    let filled = entries.len();
    entries.extend((filled..vocab.max(filled)).map(|i| (format!("w{i}"), i as u32)));
    let model = WordLevel::builder()
        .vocab(entries.into_iter().collect())
        .unk_token("[UNK]".into())
        .build()
        .expect("a word-level vocabulary with its unknown token");
    let mut tok = Tokenizer::new(model);
    tok.with_pre_tokenizer(Some(Whitespace {}));
    let post = TemplateProcessing::builder()
        .try_single("<s> $A </s>")
        .expect("a valid template")
        .special_tokens(vec![("<s>", 2), ("</s>", 3)])
        .build()
        .expect("a valid post-processor");
    tok.with_post_processor(Some(post));
    tok
}

/// `n` captions of 6 to 15 words from [`WORDS`], drawn from `seed`.
pub fn captions(n: usize, seed: u64) -> Vec<String> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|_| {
            let len = 6 + (rng.uniform() * 10.0) as usize;
            (0..len)
                .map(|_| WORDS[(rng.uniform() * WORDS.len() as f64) as usize % WORDS.len()])
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

/// `[n, 3, size, size]` pixels, N(0, 1) (already "normalised"), from `seed`.
pub fn pixels(n: usize, size: usize, seed: u64, device: &Device) -> Result<Tensor> {
    let mut rng = Rng::new(seed);
    let v: Vec<f32> = (0..n * 3 * size * size)
        .map(|_| rng.normal() as f32)
        .collect();
    Tensor::from_vec(v, (n, 3, size, size), device)
}
