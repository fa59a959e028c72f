//! Frozen pretrained CLIP image and text towers, loaded from a Hugging Face
//! `CLIPModel` directory (config.json, model.safetensors, tokenizer.json).
//!
//! Built from candle-transformers' [`ClipVisionTransformer`] and
//! [`ClipTextTransformer`] plus the two projections, loaded under the
//! checkpoint's own key names (`vision_model.*`, `text_model.*`,
//! `visual_projection.weight`, `text_projection.weight`). candle's
//! `ClipConfig` has no serde support, so the HF config.json is parsed here.
//!
//! What the towers return:
//!
//! * **image** — patch tokens `[B, P, D_vision]` are the last encoder layer's
//!   outputs without the class token, *before* `post_layernorm`: exactly
//!   Hugging Face's `last_hidden_state[:, 1:]` (candle exposes them through
//!   `ClipVisionTransformer::output_hidden_states`). The global embedding
//!   `[B, E]` is `visual_projection(post_layernorm(CLS))`, i.e. HF's
//!   `get_image_features`. [`ClipTower::project_patch_tokens`] maps patch
//!   tokens into the joint space the same way (post-layernorm, then the
//!   projection) for methods that compare local features across modalities.
//! * **text** — token features `[B, L, D_text]` are the last layer after
//!   `final_layer_norm` (HF's `last_hidden_state`; CLIP's text encoder is
//!   causal, so padding never affects real tokens). The global embedding is
//!   `text_projection` of the end-of-text token's feature, chosen as HF does:
//!   the first `eos_token_id` of each text, or for legacy configs with
//!   `eos_token_id == 2` the position of the largest token id.
//!
//! **Frozen only.** candle's CLIP layers normalise with `candle_nn::LayerNorm`,
//! whose fused forward op is applied without a backward (`apply_op3_no_bwd`):
//! gradients silently stop there in candle 0.11. Do not fine-tune through it.
//!
//! Limitations of candle-transformers 0.11's CLIP: only the `quick_gelu`
//! activation (OpenAI checkpoints; configs asking for another activation are
//! rejected) and a fixed layer-norm epsilon of 1e-5 (the HF default).

use std::path::Path;

use candle_core::{DType, Device, Module, Result, Tensor};
use candle_nn::{LayerNorm, Linear};
use candle_transformers::models::clip::text_model::{
    Activation, ClipTextConfig, ClipTextTransformer,
};
use candle_transformers::models::clip::vision_model::{ClipVisionConfig, ClipVisionTransformer};
use serde_json::{Map, Value};
use tokenizers::Tokenizer;

use crate::hf_dir;

const TOWER: &str = "CLIP tower";

/// The parts of a Hugging Face `CLIPConfig` that candle's CLIP needs.
#[derive(Debug, Clone)]
pub struct HfClipConfig {
    pub text: ClipTextConfig,
    pub vision: ClipVisionConfig,
    /// Joint embedding width `E` (top-level `projection_dim`).
    pub projection_dim: usize,
    /// `text_config.eos_token_id` (HF default 2, which selects the legacy
    /// argmax pooling).
    pub eos_token_id: u32,
    /// `text_config.pad_token_id` (HF default 1).
    pub pad_token_id: u32,
}

fn sub_config(root: &Value, key: &str) -> Map<String, Value> {
    let mut out = root
        .get(key)
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    // Old transformers configs also carry `{key}_dict`, which takes
    // precedence over `{key}` in HF's own loader.
    if let Some(overrides) = root.get(format!("{key}_dict")).and_then(Value::as_object) {
        for (k, v) in overrides {
            out.insert(k.clone(), v.clone());
        }
    }
    out
}

fn get_usize(
    section: &Map<String, Value>,
    name: &str,
    key: &str,
    default: usize,
) -> std::result::Result<usize, String> {
    match section.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => v
            .as_u64()
            .map(|x| x as usize)
            .ok_or_else(|| format!("{name}.{key} must be a non-negative integer, got {v}")),
    }
}

fn activation(section: &Map<String, Value>, name: &str) -> std::result::Result<Activation, String> {
    match section.get("hidden_act").and_then(Value::as_str) {
        None | Some("quick_gelu") => Ok(Activation::QuickGelu),
        Some(other) => Err(format!(
            "{name}.hidden_act is {other:?}, but candle-transformers 0.11's CLIP implements \
             only \"quick_gelu\" (the OpenAI checkpoints)"
        )),
    }
}

impl HfClipConfig {
    /// Parse a Hugging Face `CLIPModel` config.json; missing keys take HF's
    /// `CLIPTextConfig` / `CLIPVisionConfig` defaults (ViT-B/32).
    pub fn from_json(root: &Value) -> std::result::Result<Self, String> {
        if let Some(mt) = root.get("model_type").and_then(Value::as_str) {
            if mt != "clip" {
                return Err(format!(
                    "model_type is {mt:?}; expected a Hugging Face CLIPModel config (\"clip\")"
                ));
            }
        }
        let t = sub_config(root, "text_config");
        let v = sub_config(root, "vision_config");
        if root.get("vision_config").is_none() && root.get("text_config").is_none() {
            return Err("no text_config / vision_config: not a CLIPModel config".into());
        }
        let projection_dim = match root.get("projection_dim") {
            None | Some(Value::Null) => 512,
            Some(p) => p
                .as_u64()
                .ok_or_else(|| format!("projection_dim must be an integer, got {p}"))?
                as usize,
        };
        let text = ClipTextConfig {
            vocab_size: get_usize(&t, "text_config", "vocab_size", 49408)?,
            embed_dim: get_usize(&t, "text_config", "hidden_size", 512)?,
            activation: activation(&t, "text_config")?,
            intermediate_size: get_usize(&t, "text_config", "intermediate_size", 2048)?,
            max_position_embeddings: get_usize(&t, "text_config", "max_position_embeddings", 77)?,
            pad_with: None,
            num_hidden_layers: get_usize(&t, "text_config", "num_hidden_layers", 12)?,
            num_attention_heads: get_usize(&t, "text_config", "num_attention_heads", 8)?,
            projection_dim,
        };
        let vision = ClipVisionConfig {
            embed_dim: get_usize(&v, "vision_config", "hidden_size", 768)?,
            activation: activation(&v, "vision_config")?,
            intermediate_size: get_usize(&v, "vision_config", "intermediate_size", 3072)?,
            num_hidden_layers: get_usize(&v, "vision_config", "num_hidden_layers", 12)?,
            num_attention_heads: get_usize(&v, "vision_config", "num_attention_heads", 12)?,
            projection_dim,
            num_channels: get_usize(&v, "vision_config", "num_channels", 3)?,
            image_size: get_usize(&v, "vision_config", "image_size", 224)?,
            patch_size: get_usize(&v, "vision_config", "patch_size", 32)?,
        };
        let eos_token_id = get_usize(&t, "text_config", "eos_token_id", 2)? as u32;
        let pad_token_id = get_usize(&t, "text_config", "pad_token_id", 1)? as u32;
        for (name, dim, heads, layers) in [
            (
                "text_config",
                text.embed_dim,
                text.num_attention_heads,
                text.num_hidden_layers,
            ),
            (
                "vision_config",
                vision.embed_dim,
                vision.num_attention_heads,
                vision.num_hidden_layers,
            ),
        ] {
            if dim == 0 || dim.checked_rem(heads) != Some(0) {
                return Err(format!(
                    "{name}: hidden_size {dim} is not a positive multiple of num_attention_heads {heads}"
                ));
            }
            if layers == 0 {
                return Err(format!("{name}: num_hidden_layers must be positive"));
            }
        }
        if vision.image_size.checked_rem(vision.patch_size) != Some(0) {
            return Err(format!(
                "vision_config: image_size {} is not a multiple of patch_size {}",
                vision.image_size, vision.patch_size
            ));
        }
        if text.max_position_embeddings < 2 || projection_dim == 0 {
            return Err("text max_position_embeddings < 2 or projection_dim 0".into());
        }
        Ok(HfClipConfig {
            text,
            vision,
            projection_dim,
            eos_token_id,
            pad_token_id,
        })
    }
}

/// Frozen CLIP image and text towers with their projections and tokenizer.
pub struct ClipTower {
    vision: ClipVisionTransformer,
    text: ClipTextTransformer,
    post_layernorm: LayerNorm,
    visual_projection: Linear,
    text_projection: Linear,
    tokenizer: Tokenizer,
    config: HfClipConfig,
    max_len: usize,
    pad_id: u32,
    device: Device,
    fingerprint: String,
    /// Dtype of the weights and the computation (outputs are f32).
    dtype: DType,
}

impl std::fmt::Debug for ClipTower {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClipTower")
            .field("config", &self.config)
            .field("fingerprint", &self.fingerprint)
            .finish_non_exhaustive()
    }
}

fn load_err(dir: &Path, what: &str, e: impl std::fmt::Display) -> candle_core::Error {
    candle_core::Error::Msg(format!(
        "{TOWER}: loading {what} from {}: {e}",
        dir.join("model.safetensors").display()
    ))
}

impl ClipTower {
    /// Load a Hugging Face CLIPModel directory. Errors name the missing or
    /// broken file.
    pub fn load(dir: &Path, device: &Device) -> Result<Self> {
        Self::load_with_dtype(dir, device, DType::F32)
    }

    /// [`ClipTower::load`] computing in `dtype` (f32, f16 or bf16). The
    /// outputs are f32 either way; attention scores and softmax run in f32
    /// inside candle's CLIP whatever the dtype.
    pub fn load_with_dtype(dir: &Path, device: &Device, dtype: DType) -> Result<Self> {
        if !matches!(dtype, DType::F32 | DType::F16 | DType::BF16) {
            candle_core::bail!("{TOWER}: computes in f32, f16 or bf16, not {dtype:?}");
        }
        hf_dir::require_files(dir, &hf_dir::REQUIRED_FILES, TOWER)?;
        let config_path = dir.join("config.json");
        let config =
            HfClipConfig::from_json(&hf_dir::read_json(dir, "config.json")?).map_err(|e| {
                candle_core::Error::Msg(format!("{TOWER}: {}: {e}", config_path.display()))
            })?;
        let max_len = config.text.max_position_embeddings;
        let (tokenizer, tokenizer_pad) = hf_dir::load_tokenizer(dir, max_len)?;
        // Padding sits after each text's end token and the text encoder is
        // causal, so the pad id never affects real tokens; it only has to be
        // a valid row of the embedding table.
        let vocab = config.text.vocab_size as u32;
        let pad_id = [tokenizer_pad, Some(config.pad_token_id)]
            .into_iter()
            .flatten()
            .find(|&id| id < vocab)
            .unwrap_or(0);

        let vb = hf_dir::safetensors_var_builder(dir, device, dtype)?;
        // candle substitutes random values for a missing class embedding;
        // insist on the real one.
        let class_key = "vision_model.embeddings.class_embedding";
        if !vb.contains_tensor(class_key) {
            return Err(load_err(
                dir,
                "the vision tower",
                format!("tensor {class_key} is missing"),
            ));
        }
        let vision = ClipVisionTransformer::new(vb.pp("vision_model"), &config.vision)
            .map_err(|e| load_err(dir, "the vision tower", e))?;
        let text = ClipTextTransformer::new(vb.pp("text_model"), &config.text)
            .map_err(|e| load_err(dir, "the text tower", e))?;
        let post_layernorm = candle_nn::layer_norm(
            config.vision.embed_dim,
            1e-5,
            vb.pp("vision_model").pp("post_layernorm"),
        )
        .map_err(|e| load_err(dir, "vision post_layernorm", e))?;
        let visual_projection = candle_nn::linear_no_bias(
            config.vision.embed_dim,
            config.projection_dim,
            vb.pp("visual_projection"),
        )
        .map_err(|e| load_err(dir, "visual_projection", e))?;
        let text_projection = candle_nn::linear_no_bias(
            config.text.embed_dim,
            config.projection_dim,
            vb.pp("text_projection"),
        )
        .map_err(|e| load_err(dir, "text_projection", e))?;
        let fingerprint = hf_dir::fingerprint_files(dir, &hf_dir::REQUIRED_FILES)
            .map_err(|e| candle_core::Error::Msg(format!("{TOWER}: fingerprinting: {e}")))?;
        Ok(ClipTower {
            vision,
            text,
            post_layernorm,
            visual_projection,
            text_projection,
            tokenizer,
            config,
            max_len,
            pad_id,
            device: device.clone(),
            fingerprint,
            dtype,
        })
    }

    /// Resolve `spec` and load it computing in `dtype`
    /// ([`ClipTower::load_with_dtype`]).
    pub fn from_spec_with_dtype(spec: &str, device: &Device, dtype: DType) -> Result<Self> {
        let dir = hf_dir::resolve_model_dir(spec).map_err(candle_core::Error::Msg)?;
        Self::load_with_dtype(&dir, device, dtype)
    }

    /// The dtype the tower computes in.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Resolve `spec` (a directory or a hub id such as
    /// `openai/clip-vit-base-patch32`, see [`hf_dir::resolve_model_dir`]) and
    /// load it.
    pub fn from_spec(spec: &str, device: &Device) -> Result<Self> {
        let dir = hf_dir::resolve_model_dir(spec).map_err(candle_core::Error::Msg)?;
        Self::load(&dir, device)
    }

    /// `[B, 3, S, S]` normalised pixels (CLIP preprocessing,
    /// `ImagePreprocess::clip()` at [`ClipTower::image_size`]) → (patch
    /// tokens `[B, P, D_vision]` from the last encoder layer, before
    /// post-layernorm, P = (S / patch)²; projected global image embedding
    /// `[B, E]`, not normalised).
    pub fn image_features(&self, pixels: &Tensor) -> Result<(Tensor, Tensor)> {
        let v = &self.config.vision;
        let dims = pixels.dims();
        if dims.len() != 4
            || dims[1] != v.num_channels
            || dims[2] != v.image_size
            || dims[3] != v.image_size
        {
            candle_core::bail!(
                "{TOWER}: image_features expects [B, {}, {}, {}] pixels, got {:?}",
                v.num_channels,
                v.image_size,
                v.image_size,
                dims
            );
        }
        let pixels = pixels.to_dtype(self.dtype)?.to_device(&self.device)?;
        // One entry per encoder layer, then the post-layernormed CLS token.
        let mut states = self.vision.output_hidden_states(&pixels)?;
        let pooled = states
            .pop()
            .ok_or_else(|| candle_core::Error::Msg("CLIP vision: no outputs".into()))?;
        let last = states
            .pop()
            .ok_or_else(|| candle_core::Error::Msg("CLIP vision: no layers".into()))?;
        let num_patches = self.num_patches();
        let patches = last
            .narrow(1, 1, num_patches)?
            .contiguous()?
            .to_dtype(DType::F32)?;
        let embedding = self
            .visual_projection
            .forward(&pooled)?
            .to_dtype(DType::F32)?;
        Ok((patches, embedding))
    }

    /// Map patch tokens from [`ClipTower::image_features`] into the joint
    /// space as CLIP does for the class token: post-layernorm, then the
    /// visual projection. `[B, P, D_vision]` → `[B, P, E]`.
    pub fn project_patch_tokens(&self, patches: &Tensor) -> Result<Tensor> {
        let patches = patches.to_dtype(self.dtype)?;
        self.visual_projection
            .forward(&self.post_layernorm.forward(&patches)?)?
            .to_dtype(DType::F32)
    }

    /// Tokenise (special tokens added, truncated to the text model's maximum
    /// positions) and right-pad: (ids `[B, L]` u32, mask `[B, L]` f32).
    pub fn tokenize(&self, texts: &[&str]) -> Result<(Tensor, Tensor)> {
        let ids = hf_dir::encode_texts(&self.tokenizer, texts)?;
        hf_dir::pad_batch(&ids, self.pad_id, &self.device)
    }

    /// texts → (token features `[B, L, D_text]` after the final layer norm,
    /// mask `[B, L]` f32, projected global text embedding `[B, E]`, not
    /// normalised).
    pub fn text_features(&self, texts: &[&str]) -> Result<(Tensor, Tensor, Tensor)> {
        let ids = hf_dir::encode_texts(&self.tokenizer, texts)?;
        let (ids_t, mask) = hf_dir::pad_batch(&ids, self.pad_id, &self.device)?;
        let tokens = self.text.forward_with_mask(&ids_t, usize::MAX)?;
        let (b, l, d) = tokens.dims3()?;
        let picks: Vec<u32> = ids
            .iter()
            .enumerate()
            .map(|(row, seq)| (row * l + self.eos_position(seq)) as u32)
            .collect();
        let picks = Tensor::from_vec(picks, b, &self.device)?;
        let eos = tokens.reshape((b * l, d))?.index_select(&picks, 0)?;
        let embedding = self.text_projection.forward(&eos)?.to_dtype(DType::F32)?;
        Ok((tokens.to_dtype(DType::F32)?, mask, embedding))
    }

    /// Where the pooled text feature is read, as in HF's CLIPTextTransformer.
    fn eos_position(&self, seq: &[u32]) -> usize {
        let last = seq.len().saturating_sub(1);
        if self.config.eos_token_id == 2 {
            // Legacy configs: the first position of the largest id (the
            // end-of-text token has the largest id in CLIP's vocabulary).
            let mut best = 0;
            for (i, &t) in seq.iter().enumerate() {
                if t > seq[best] {
                    best = i;
                }
            }
            best
        } else {
            seq.iter()
                .position(|&t| t == self.config.eos_token_id)
                .unwrap_or(last)
        }
    }

    /// Input side length S in pixels.
    pub fn image_size(&self) -> usize {
        self.config.vision.image_size
    }

    /// Number of patch tokens P = (S / patch)².
    pub fn num_patches(&self) -> usize {
        (self.config.vision.image_size / self.config.vision.patch_size).pow(2)
    }

    /// Joint embedding width E.
    pub fn embed_dim(&self) -> usize {
        self.config.projection_dim
    }

    /// Width of the patch tokens.
    pub fn vision_width(&self) -> usize {
        self.config.vision.embed_dim
    }

    /// Width of the text token features.
    pub fn text_width(&self) -> usize {
        self.config.text.embed_dim
    }

    /// Maximum tokens per text (the text model's position count).
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// The parsed configuration.
    pub fn config(&self) -> &HfClipConfig {
        &self.config
    }

    /// Stable id of weights, config, tokenizer and geometry for keying a
    /// feature cache: `clip-p{patch}-s{S}-e{E}-{16 hex digits}-len{L}`.
    pub fn cache_tag(&self) -> String {
        format!(
            "clip-p{}-s{}-e{}-{}-len{}",
            self.config.vision.patch_size,
            self.config.vision.image_size,
            self.config.projection_dim,
            self.fingerprint,
            self.max_len
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hf_dir::test_util::TempDir;
    use crate::rng::Rng;
    use candle_core::IndexOp;
    use std::collections::HashMap;
    use tokenizers::models::wordlevel::WordLevel;
    use tokenizers::pre_tokenizers::whitespace::Whitespace;
    use tokenizers::processors::template::TemplateProcessing;

    const WORDS: [&str; 12] = [
        "a", "dog", "cat", "runs", "on", "grass", "the", "black", "white", "sits", "man", "beach",
    ];
    const VOCAB: usize = 100;

    fn tiny_config() -> Value {
        serde_json::json!({
            "architectures": ["CLIPModel"],
            "model_type": "clip",
            "projection_dim": 16,
            "logit_scale_init_value": 2.6592,
            "text_config": {
                "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                "num_attention_heads": 2, "max_position_embeddings": 16, "vocab_size": VOCAB,
                "hidden_act": "quick_gelu", "layer_norm_eps": 1e-5,
                "bos_token_id": 2, "eos_token_id": 3, "pad_token_id": 0,
                "projection_dim": 16
            },
            "vision_config": {
                "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                "num_attention_heads": 2, "image_size": 32, "patch_size": 8,
                "num_channels": 3, "hidden_act": "quick_gelu", "layer_norm_eps": 1e-5,
                "projection_dim": 16
            }
        })
    }

    /// Every parameter of a HF CLIPModel with the tiny config, under HF's
    /// key names, randomly initialised from a seed.
    fn tiny_weights(dev: &Device) -> HashMap<String, Tensor> {
        let mut rng = Rng::new(7);
        let mut t = HashMap::new();
        let mut put = |name: String, shape: &[usize], kind: &str| {
            let n: usize = shape.iter().product();
            let values: Vec<f32> = match kind {
                "ones" => (0..n).map(|_| 1.0 + 0.05 * rng.normal() as f32).collect(),
                "zeros" => (0..n).map(|_| 0.02 * rng.normal() as f32).collect(),
                _ => (0..n).map(|_| 0.2 * rng.normal() as f32).collect(),
            };
            t.insert(name, Tensor::from_vec(values, shape, dev).unwrap());
        };
        let (d, inter) = (32, 64);
        for (tower, layers) in [("text_model", 2), ("vision_model", 2)] {
            for i in 0..layers {
                let p = format!("{tower}.encoder.layers.{i}");
                for proj in ["q_proj", "k_proj", "v_proj", "out_proj"] {
                    put(format!("{p}.self_attn.{proj}.weight"), &[d, d], "w");
                    put(format!("{p}.self_attn.{proj}.bias"), &[d], "zeros");
                }
                for ln in ["layer_norm1", "layer_norm2"] {
                    put(format!("{p}.{ln}.weight"), &[d], "ones");
                    put(format!("{p}.{ln}.bias"), &[d], "zeros");
                }
                put(format!("{p}.mlp.fc1.weight"), &[inter, d], "w");
                put(format!("{p}.mlp.fc1.bias"), &[inter], "zeros");
                put(format!("{p}.mlp.fc2.weight"), &[d, inter], "w");
                put(format!("{p}.mlp.fc2.bias"), &[d], "zeros");
            }
        }
        put(
            "text_model.embeddings.token_embedding.weight".into(),
            &[VOCAB, d],
            "w",
        );
        put(
            "text_model.embeddings.position_embedding.weight".into(),
            &[16, d],
            "w",
        );
        put("text_model.final_layer_norm.weight".into(), &[d], "ones");
        put("text_model.final_layer_norm.bias".into(), &[d], "zeros");
        put("vision_model.embeddings.class_embedding".into(), &[d], "w");
        put(
            "vision_model.embeddings.patch_embedding.weight".into(),
            &[d, 3, 8, 8],
            "w",
        );
        put(
            "vision_model.embeddings.position_embedding.weight".into(),
            &[17, d],
            "w",
        );
        for ln in ["pre_layrnorm", "post_layernorm"] {
            put(format!("vision_model.{ln}.weight"), &[d], "ones");
            put(format!("vision_model.{ln}.bias"), &[d], "zeros");
        }
        put("visual_projection.weight".into(), &[16, d], "w");
        put("text_projection.weight".into(), &[16, d], "w");
        t.insert("logit_scale".into(), Tensor::new(2.6592f32, dev).unwrap());
        // HF checkpoints also carry position-id buffers; they must be ignored.
        t.insert(
            "text_model.embeddings.position_ids".into(),
            Tensor::arange(0i64, 16, dev).unwrap().unsqueeze(0).unwrap(),
        );
        t
    }

    /// A WordLevel tokenizer over [PAD] [UNK] <s> </s>, the test words and
    /// filler tokens up to VOCAB, adding <s> … </s> like CLIP's tokenizer.
    fn tiny_tokenizer(path: &Path) {
        let mut vocab: Vec<(String, u32)> = ["[PAD]", "[UNK]", "<s>", "</s>"]
            .iter()
            .map(|s| s.to_string())
            .chain(WORDS.iter().map(|s| s.to_string()))
            .enumerate()
            .map(|(i, w)| (w, i as u32))
            .collect();
        let filled = vocab.len();
        vocab.extend((filled..VOCAB).map(|i| (format!("w{i}"), i as u32)));
        let model = WordLevel::builder()
            .vocab(vocab.into_iter().collect())
            .unk_token("[UNK]".into())
            .build()
            .unwrap();
        let mut tok = Tokenizer::new(model);
        tok.with_pre_tokenizer(Some(Whitespace {}));
        let post = TemplateProcessing::builder()
            .try_single("<s> $A </s>")
            .unwrap()
            .special_tokens(vec![("<s>", 2), ("</s>", 3)])
            .build()
            .unwrap();
        tok.with_post_processor(Some(post));
        tok.save(path, false).unwrap();
    }

    fn write_tiny_clip(dir: &Path) {
        let dev = Device::Cpu;
        std::fs::write(
            dir.join("config.json"),
            serde_json::to_string_pretty(&tiny_config()).unwrap(),
        )
        .unwrap();
        candle_core::safetensors::save(&tiny_weights(&dev), dir.join("model.safetensors")).unwrap();
        tiny_tokenizer(&dir.join("tokenizer.json"));
    }

    fn pixels(seed: u64, b: usize) -> Tensor {
        let mut rng = Rng::new(seed);
        let v: Vec<f32> = (0..b * 3 * 32 * 32).map(|_| rng.normal() as f32).collect();
        Tensor::from_vec(v, (b, 3, 32, 32), &Device::Cpu).unwrap()
    }

    fn all_finite(t: &Tensor) -> bool {
        t.flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
            .iter()
            .all(|x| x.is_finite())
    }

    fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
        (a - b)
            .unwrap()
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap()
    }

    #[test]
    fn tiny_clip_loads_and_runs() -> Result<()> {
        let tmp = TempDir::new("clip-tiny");
        write_tiny_clip(&tmp.0);
        let dev = Device::Cpu;
        let tower = ClipTower::load(&tmp.0, &dev)?;
        assert_eq!(tower.image_size(), 32);
        assert_eq!(tower.embed_dim(), 16);
        assert_eq!(tower.num_patches(), 16);
        assert_eq!(
            (tower.vision_width(), tower.text_width(), tower.max_len()),
            (32, 32, 16)
        );

        // Image path.
        let px = pixels(1, 2);
        let (patches, emb) = tower.image_features(&px)?;
        assert_eq!(patches.dims(), &[2, 16, 32]);
        assert_eq!(emb.dims(), &[2, 16]);
        assert!(all_finite(&patches) && all_finite(&emb));
        // Different images → different embeddings; each row is independent
        // of the rest of the batch.
        assert!(max_abs_diff(&emb.i(0)?, &emb.i(1)?) > 1e-3);
        let (p0, e0) = tower.image_features(&px.narrow(0, 0, 1)?)?;
        assert!(max_abs_diff(&e0, &emb.narrow(0, 0, 1)?) < 1e-4);
        assert!(max_abs_diff(&p0, &patches.narrow(0, 0, 1)?) < 1e-4);
        let changed = (px.narrow(0, 0, 1)? + 0.5)?;
        let (_, e_changed) = tower.image_features(&changed)?;
        assert!(max_abs_diff(&e_changed, &e0) > 1e-3);
        let projected = tower.project_patch_tokens(&patches)?;
        assert_eq!(projected.dims(), &[2, 16, 16]);
        assert!(all_finite(&projected));
        // Wrong geometry is rejected with a clear message.
        let err = tower
            .image_features(&pixels(2, 1).narrow(3, 0, 16)?)
            .unwrap_err();
        assert!(err.to_string().contains("expects [B, 3, 32, 32]"), "{err}");

        // Text path.
        let texts = [
            "a black dog runs on the grass",
            "a cat",
            "the man sits on a beach",
        ];
        let (tokens, mask, temb) = tower.text_features(&texts)?;
        assert_eq!(tokens.dims(), &[3, 9, 32]);
        assert_eq!(temb.dims(), &[3, 16]);
        assert_eq!(
            mask.sum(1)?.to_vec1::<f32>()?,
            vec![9.0, 4.0, 8.0],
            "mask counts <s> and </s>"
        );
        assert!(all_finite(&tokens) && all_finite(&temb));
        let (ids, _) = tower.tokenize(&texts)?;
        assert_eq!(ids.to_vec2::<u32>()?[1], vec![2, 4, 6, 3, 0, 0, 0, 0, 0]);
        // Pooling reads </s>, and padding does not leak into it.
        let (_, _, alone) = tower.text_features(&texts[1..2])?;
        assert!(max_abs_diff(&alone, &temb.narrow(0, 1, 1)?) < 1e-4);
        assert!(max_abs_diff(&temb.i(0)?, &temb.i(1)?) > 1e-3);
        let (_, _, other) = tower.text_features(&["a dog"])?;
        assert!(max_abs_diff(&other, &alone) > 1e-3);
        // Truncation to max positions keeps the end token.
        let long = "dog ".repeat(40);
        let (ids, mask) = tower.tokenize(&[long.as_str()])?;
        let ids = ids.to_vec2::<u32>()?;
        assert_eq!(ids[0].len(), 16);
        assert_eq!((ids[0][0], ids[0][15]), (2, 3));
        assert_eq!(mask.sum_all()?.to_scalar::<f32>()?, 16.0);
        let (_, _, long_emb) = tower.text_features(&[long.as_str()])?;
        assert!(all_finite(&long_emb));

        // Cache tag: stable across loads, content-based.
        let again = ClipTower::load(&tmp.0, &dev)?;
        assert_eq!(again.cache_tag(), tower.cache_tag());
        assert!(
            tower.cache_tag().starts_with("clip-p8-s32-e16-"),
            "{}",
            tower.cache_tag()
        );
        assert!(tower.cache_tag().ends_with("-len16"));
        Ok(())
    }

    #[test]
    fn missing_files_are_named() {
        let dev = Device::Cpu;
        for missing in hf_dir::REQUIRED_FILES {
            let tmp = TempDir::new("clip-missing");
            write_tiny_clip(&tmp.0);
            std::fs::remove_file(tmp.0.join(missing)).unwrap();
            let err = ClipTower::load(&tmp.0, &dev).unwrap_err().to_string();
            assert!(err.contains(&format!("{missing} is missing")), "{err}");
        }
    }

    #[test]
    fn missing_tensor_is_named() {
        let tmp = TempDir::new("clip-missing-tensor");
        write_tiny_clip(&tmp.0);
        let mut w = tiny_weights(&Device::Cpu);
        w.remove("text_projection.weight");
        candle_core::safetensors::save(&w, tmp.0.join("model.safetensors")).unwrap();
        let err = ClipTower::load(&tmp.0, &Device::Cpu)
            .unwrap_err()
            .to_string();
        assert!(err.contains("text_projection"), "{err}");
        w.remove("vision_model.embeddings.class_embedding");
        candle_core::safetensors::save(&w, tmp.0.join("model.safetensors")).unwrap();
        let err = ClipTower::load(&tmp.0, &Device::Cpu)
            .unwrap_err()
            .to_string();
        assert!(err.contains("class_embedding"), "{err}");
    }

    #[test]
    fn parses_hf_configs() {
        // Defaults are ViT-B/32.
        let c = HfClipConfig::from_json(&serde_json::json!({
            "model_type": "clip", "text_config": {}, "vision_config": {}
        }))
        .unwrap();
        assert_eq!(
            (
                c.vision.embed_dim,
                c.vision.patch_size,
                c.vision.image_size,
                c.projection_dim
            ),
            (768, 32, 224, 512)
        );
        assert_eq!(
            (c.text.embed_dim, c.text.vocab_size, c.eos_token_id),
            (512, 49408, 2)
        );
        // Legacy `*_dict` sections override.
        let c = HfClipConfig::from_json(&serde_json::json!({
            "text_config": {"hidden_size": 512},
            "text_config_dict": {"hidden_size": 768, "num_attention_heads": 12},
            "vision_config": {"patch_size": null}
        }))
        .unwrap();
        assert_eq!((c.text.embed_dim, c.vision.patch_size), (768, 32));
        let err = HfClipConfig::from_json(&serde_json::json!({
            "text_config": {}, "vision_config": {"hidden_act": "gelu"}
        }))
        .unwrap_err();
        assert!(err.contains("quick_gelu"), "{err}");
        assert!(HfClipConfig::from_json(&serde_json::json!({"model_type": "siglip"})).is_err());
        assert!(HfClipConfig::from_json(&serde_json::json!({"model_type": "clip"})).is_err());
        assert!(HfClipConfig::from_json(&serde_json::json!({
            "text_config": {}, "vision_config": {"image_size": 30, "patch_size": 8}
        }))
        .is_err());
    }
}
