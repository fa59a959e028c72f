//! Which towers turn images and captions into features, and loading them.
//!
//! The choice is made once at `fit` (flags, or defaults from the data) and
//! recorded in the checkpoint, so `score` rebuilds the same towers.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use ncclean_models::bert_text::BertTextTower;
use ncclean_models::clip_tower::ClipTower;
use ncclean_models::mobilenet_v2::MobileNetV2;
use ncclean_models::preprocess::ImagePreprocess;
use serde::{Deserialize, Serialize};

use crate::data::{ImageKind, InputSet};
use crate::error::{invalid, Error, Result};

/// Image tower choices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum ImageEncoder {
    /// torchvision MobileNetV2 (ImageNet), frozen: 1280-d pooled + 7×7 grid. Needs --image-model PATH/model.safetensors.
    #[value(name = "mobilenet_v2")]
    MobilenetV2,
    /// CLIP vision tower, frozen. Needs --image-model DIR or hub id.
    Clip,
    /// Embeddings already in the image column (`list<float>`).
    Precomputed,
    /// A compact CNN trained from scratch on small pixels (demo data).
    #[value(name = "demo-cnn")]
    #[serde(rename = "demo-cnn")]
    DemoCnn,
}

/// Text tower choices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TextEncoder {
    /// all-MiniLM-L6-v2 (BERT), frozen: 384-d masked mean pool + tokens. --text-model DIR or hub id
    /// (default: scripts/fetch_minilm.sh's cache, then the Hugging Face cache).
    Minilm,
    /// CLIP text tower, frozen. Needs --text-model (defaults to --image-model).
    Clip,
    /// A bag of word embeddings trained from scratch over the captions' vocabulary (demo data).
    #[value(name = "demo-bow")]
    #[serde(rename = "demo-bow")]
    DemoBow,
    /// Embeddings already in a `list<float>` text-embedding column (--text-emb-col, or detected:
    /// text_embedding, text_emb, txt_emb, ...); the caption column is still shown in the outputs.
    Precomputed,
}

/// The resolved tower choice, stored in checkpoints and run.json.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EncoderSpec {
    /// Image tower.
    pub image: ImageEncoder,
    /// Text tower.
    pub text: TextEncoder,
    /// Weights of the image tower (file or directory or hub id), if pretrained.
    pub image_model: Option<String>,
    /// Weights of the text tower (directory or hub id), if pretrained.
    pub text_model: Option<String>,
    /// Precision the frozen towers compute in. Recorded so `score` encodes
    /// as `fit` did; `auto` (the default, not written) resolves on the
    /// device that runs.
    #[serde(default, skip_serializing_if = "TowerDtype::is_auto")]
    pub tower_dtype: TowerDtype,
}

/// Precision of the frozen pretrained towers (MobileNetV2, CLIP).
///
/// Half precision roughly doubles tower throughput on a GPU. Measured on
/// CPU against f32 (tests/towers.rs, `ncclean gpu-check`): pooled features
/// keep a cosine of at least 0.999 to f32's in f16 and 0.99 in bf16 (7
/// mantissa bits). MiniLM always runs in f32: candle-transformers' BERT
/// turns its attention mask into `0 * f32::MIN`, which is NaN once f32::MIN
/// rounds to -inf in f16/bf16.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TowerDtype {
    /// f16 on CUDA, f32 on the CPU (where half precision is slower).
    #[default]
    Auto,
    /// Full precision.
    F32,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    Bf16,
}

impl TowerDtype {
    /// The dtype this means on `device`.
    pub fn resolve(self, device: &Device) -> DType {
        match self {
            TowerDtype::Auto if device.is_cuda() => DType::F16,
            TowerDtype::Auto | TowerDtype::F32 => DType::F32,
            TowerDtype::F16 => DType::F16,
            TowerDtype::Bf16 => DType::BF16,
        }
    }

    fn is_auto(&self) -> bool {
        *self == TowerDtype::Auto
    }
}

/// The suffix a tower's cache tag gets for `dtype`: none for f32, so
/// features cached before precision was a choice stay valid.
fn dtype_tag(dtype: DType) -> String {
    match dtype {
        DType::F32 => String::new(),
        other => format!("|{}", other.as_str()),
    }
}

impl EncoderSpec {
    /// Resolve flags against the data: an embedding column means
    /// `precomputed`, other images `demo-cnn`; captions `demo-bow`.
    pub fn resolve(
        input: &InputSet,
        image: Option<ImageEncoder>,
        text: Option<TextEncoder>,
        image_model: Option<String>,
        text_model: Option<String>,
    ) -> Result<EncoderSpec> {
        let is_embedding = input.columns.image_kind == ImageKind::Embedding;
        let image = image.unwrap_or(if is_embedding {
            ImageEncoder::Precomputed
        } else {
            ImageEncoder::DemoCnn
        });
        match (image, is_embedding) {
            (ImageEncoder::Precomputed, false) => {
                return Err(Error::Usage(format!(
                    "--image-encoder precomputed needs a list<float> image column, but {:?} holds images; \
                     choose mobilenet_v2, clip or demo-cnn",
                    input.columns.image
                )))
            }
            (ImageEncoder::Precomputed, true) => {}
            (_, true) => {
                return Err(Error::Usage(format!(
                    "the image column {:?} holds embeddings; use --image-encoder precomputed",
                    input.columns.image
                )))
            }
            _ => {}
        }
        let has_text_column = input.columns.text_embedding.is_some();
        let text = text.unwrap_or(if has_text_column {
            TextEncoder::Precomputed
        } else {
            TextEncoder::DemoBow
        });
        match (text, &input.columns.text_embedding) {
            (TextEncoder::Precomputed, None) => {
                return Err(Error::Usage(
                    "--text-encoder precomputed needs a list<float> text-embedding column; \
                     name it with --text-emb-col"
                        .into(),
                ))
            }
            (TextEncoder::Precomputed, Some(_)) | (_, None) => {}
            (other, Some(col)) => {
                return Err(Error::Usage(format!(
                    "--text-emb-col {col:?} is read only by --text-encoder precomputed, not {}; \
                     drop one of the two",
                    other.name()
                )))
            }
        }
        let image_model = match image {
            ImageEncoder::MobilenetV2 | ImageEncoder::Clip => {
                let fallback = (image == ImageEncoder::MobilenetV2)
                    .then(crate::towers::installed::default_mobilenet)
                    .flatten()
                    .map(|p| p.display().to_string());
                Some(image_model.or(fallback).ok_or_else(|| {
                    Error::Usage(format!(
                        "--image-encoder {} needs --image-model (a {}){}; `ncclean towers` lists the towers installed here",
                        image.name(),
                        if image == ImageEncoder::Clip {
                            "model directory or hub id"
                        } else {
                            "model.safetensors path"
                        },
                        if image == ImageEncoder::Clip {
                            String::new()
                        } else {
                            format!(
                                ", or ${} / ~/.cache/ncclean/mobilenet_v2/model.safetensors",
                                crate::towers::installed::MOBILENET_ENV
                            )
                        }
                    ))
                })?)
            }
            _ => None,
        };
        let text_model = match text {
            TextEncoder::Minilm => Some(match text_model {
                Some(m) => m,
                None => ncclean_models::hf_dir::default_minilm_dir()
                    .map(|p| p.display().to_string())
                    .unwrap_or_else(|| ncclean_models::hf_dir::MINILM_HUB_ID.to_string()),
            }),
            TextEncoder::Clip => {
                Some(text_model.or_else(|| image_model.clone()).ok_or_else(|| {
                    Error::Usage(
                        "--text-encoder clip needs --text-model (a CLIP model directory or hub id)"
                            .into(),
                    )
                })?)
            }
            TextEncoder::DemoBow | TextEncoder::Precomputed => None,
        };
        Ok(EncoderSpec {
            image,
            text,
            image_model: image_model.map(absolute_if_local),
            text_model: text_model.map(absolute_if_local),
            tower_dtype: TowerDtype::Auto,
        })
    }

    /// Whether the towers train with the head (a toy tower is in the run)
    /// or are all frozen (pretrained or precomputed features): it picks the
    /// method's schedule ([`ncclean_pipelines::presets::Towers`]).
    pub fn towers(&self) -> ncclean_pipelines::presets::Towers {
        use ncclean_pipelines::presets::Towers;
        if self.image == ImageEncoder::DemoCnn || self.text == TextEncoder::DemoBow {
            Towers::Trained
        } else {
            Towers::Frozen
        }
    }

    /// True when a frozen pretrained tower is involved (features are cached).
    pub fn uses_towers(&self) -> bool {
        matches!(self.image, ImageEncoder::MobilenetV2 | ImageEncoder::Clip)
            || matches!(self.text, TextEncoder::Minilm | TextEncoder::Clip)
    }
}

impl ImageEncoder {
    /// Name as on the command line.
    pub fn name(self) -> &'static str {
        match self {
            ImageEncoder::MobilenetV2 => "mobilenet_v2",
            ImageEncoder::Clip => "clip",
            ImageEncoder::Precomputed => "precomputed",
            ImageEncoder::DemoCnn => "demo-cnn",
        }
    }
}

impl TextEncoder {
    /// Name as on the command line.
    pub fn name(self) -> &'static str {
        match self {
            TextEncoder::Minilm => "minilm",
            TextEncoder::Clip => "clip",
            TextEncoder::DemoBow => "demo-bow",
            TextEncoder::Precomputed => "precomputed",
        }
    }
}

/// A loaded frozen image tower.
pub enum ImageTower {
    /// MobileNetV2.
    MobileNet(Box<MobileNetV2>, String),
    /// CLIP vision.
    Clip(Box<ClipTower>),
}

/// A loaded frozen text tower.
pub enum TextTower {
    /// BERT / MiniLM.
    Bert(Box<BertTextTower>),
    /// CLIP text.
    Clip(Box<ClipTower>),
}

/// Global features `[B, D]` and local features `[B, P, D]` of a batch.
pub struct TowerOutput {
    /// One vector per item.
    pub global: Tensor,
    /// Local features (grid cells / patches / tokens).
    pub local: Tensor,
    /// Token mask `[B, P]` for text (None for images: every cell is real).
    pub mask: Option<Tensor>,
}

fn load_err(what: &str, spec: &str, e: impl std::fmt::Display) -> Error {
    invalid(format!("cannot load the {what} from {spec}: {e}"))
}

impl ImageTower {
    /// Load the tower named by `spec` (None for trainable/precomputed towers).
    pub fn load(spec: &EncoderSpec, device: &Device) -> Result<Option<ImageTower>> {
        let model = spec.image_model.clone().unwrap_or_default();
        let dtype = spec.tower_dtype.resolve(device);
        Ok(match spec.image {
            ImageEncoder::MobilenetV2 => {
                let path = PathBuf::from(&model);
                let net = MobileNetV2::load_with_dtype(&path, device, dtype)
                    .map_err(|e| load_err("MobileNetV2 weights", &model, e))?;
                let tag = format!("mobilenet_v2-{}", weights_sha256_prefix(&path)?);
                Some(ImageTower::MobileNet(Box::new(net), tag))
            }
            ImageEncoder::Clip => Some(ImageTower::Clip(Box::new(
                ClipTower::from_spec_with_dtype(&model, device, dtype)
                    .map_err(|e| load_err("CLIP model", &model, e))?,
            ))),
            _ => None,
        })
    }

    /// Preprocessing the tower expects.
    pub fn preprocess(&self) -> ImagePreprocess {
        match self {
            ImageTower::MobileNet(..) => MobileNetV2::preprocess(),
            ImageTower::Clip(c) => ImagePreprocess {
                size: c.image_size() as u32,
                ..ImagePreprocess::clip()
            },
        }
    }

    /// Stable id of weights and preprocessing, for the feature cache.
    pub fn cache_tag(&self) -> String {
        let base = match self {
            ImageTower::MobileNet(_, tag) => tag.clone(),
            ImageTower::Clip(c) => c.cache_tag(),
        };
        format!(
            "{base}|{}{}",
            self.preprocess().cache_tag(),
            dtype_tag(self.dtype())
        )
    }

    /// The dtype the tower computes in (its outputs are f32).
    pub fn dtype(&self) -> DType {
        match self {
            ImageTower::MobileNet(m, _) => m.dtype(),
            ImageTower::Clip(c) => c.dtype(),
        }
    }

    /// Width of the local features (grid cells / patches) in `forward`'s output.
    pub fn local_dim(&self) -> usize {
        match self {
            ImageTower::MobileNet(..) => MobileNetV2::FEATURE_DIM,
            ImageTower::Clip(c) => c.vision_width(),
        }
    }

    /// Forward a batch of preprocessed pixels `[B, 3, S, S]`.
    pub fn forward(&self, pixels: &Tensor) -> candle_core::Result<TowerOutput> {
        match self {
            ImageTower::MobileNet(m, _) => {
                let out = m.forward(pixels)?;
                Ok(TowerOutput {
                    global: out.pooled,
                    local: out.grid,
                    mask: None,
                })
            }
            ImageTower::Clip(c) => {
                let (patches, global) = c.image_features(pixels)?;
                Ok(TowerOutput {
                    global,
                    local: patches,
                    mask: None,
                })
            }
        }
    }
}

impl TextTower {
    /// Load the tower named by `spec` (None for the trainable demo tower).
    pub fn load(spec: &EncoderSpec, device: &Device) -> Result<Option<TextTower>> {
        let model = spec.text_model.clone().unwrap_or_default();
        Ok(match spec.text {
            TextEncoder::Minilm => Some(TextTower::Bert(Box::new(BertTextTower::from_spec(&model, device).map_err(
                |e| {
                    invalid(format!(
                        "cannot load MiniLM from {model}: {e}. Run `bash scripts/fetch_minilm.sh` or pass --text-model DIR"
                    ))
                },
            )?))),
            TextEncoder::Clip => Some(TextTower::Clip(Box::new(
                ClipTower::from_spec_with_dtype(&model, device, spec.tower_dtype.resolve(device))
                    .map_err(|e| load_err("CLIP model", &model, e))?,
            ))),
            TextEncoder::DemoBow | TextEncoder::Precomputed => None,
        })
    }

    /// Stable id of weights and tokenizer, for the feature cache.
    pub fn cache_tag(&self) -> String {
        match self {
            TextTower::Bert(b) => b.cache_tag(),
            TextTower::Clip(c) => format!("clip-text-{}{}", c.cache_tag(), dtype_tag(c.dtype())),
        }
    }

    /// Width of the token features in `forward`'s output.
    pub fn local_dim(&self) -> usize {
        match self {
            TextTower::Bert(b) => b.hidden_size(),
            TextTower::Clip(c) => c.text_width(),
        }
    }

    /// Forward a batch of captions.
    pub fn forward(&self, texts: &[&str]) -> candle_core::Result<TowerOutput> {
        match self {
            TextTower::Bert(b) => {
                let f = b.forward(texts)?;
                Ok(TowerOutput {
                    global: f.pooled,
                    local: f.tokens,
                    mask: Some(f.mask),
                })
            }
            TextTower::Clip(c) => {
                let (tokens, mask, global) = c.text_features(texts)?;
                Ok(TowerOutput {
                    global,
                    local: tokens,
                    mask: Some(mask),
                })
            }
        }
    }
}

/// A model named by a relative path that exists here, made absolute: the
/// run records it, and `score` must find it from any directory. Hub ids
/// (and paths that do not exist, which fail later with their own message)
/// stay as given.
fn absolute_if_local(model: String) -> String {
    let path = Path::new(&model);
    if path.is_relative() && path.exists() {
        if let Ok(abs) = std::path::absolute(path) {
            return abs.display().to_string();
        }
    }
    model
}

/// The first 16 hex digits of the sha256 of a weights file, streamed
/// (CLIP's weights are 600 MB): what names its features in the cache.
fn weights_sha256_prefix(path: &Path) -> Result<String> {
    let hash = std::fs::File::open(path)
        .and_then(crate::runtime::hex::sha256_hex_of)
        .map_err(|e| invalid(format!("cannot read {}: {e}", path.display())))?;
    Ok(hash[..16].to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tower_dtype_auto_is_f32_on_the_cpu_and_keys_the_cache_only_off_f32() {
        assert_eq!(TowerDtype::Auto.resolve(&Device::Cpu), DType::F32);
        assert_eq!(TowerDtype::F16.resolve(&Device::Cpu), DType::F16);
        assert_eq!(TowerDtype::Bf16.resolve(&Device::Cpu), DType::BF16);
        // f32 features keep the tags they were cached under before.
        assert_eq!(dtype_tag(DType::F32), "");
        assert_eq!(dtype_tag(DType::F16), "|f16");
        assert_eq!(dtype_tag(DType::BF16), "|bf16");
    }

    #[test]
    fn a_text_embedding_column_goes_with_the_precomputed_text_encoder_only() {
        let mut input = crate::data::testutil::test_input(&[4]);
        let resolve = |input: &InputSet, text| {
            EncoderSpec::resolve(input, None, text, None, None).map(|s| s.text)
        };
        let usage = |r: Result<TextEncoder>| match r {
            Err(Error::Usage(m)) => m,
            other => panic!("expected a usage error, got {other:?}"),
        };
        assert_eq!(resolve(&input, None).unwrap(), TextEncoder::DemoBow);
        let m = usage(resolve(&input, Some(TextEncoder::Precomputed)));
        assert!(m.contains("--text-emb-col"), "{m}");

        input.columns.text_embedding = Some("text_emb".into());
        assert_eq!(resolve(&input, None).unwrap(), TextEncoder::Precomputed);
        let spec = EncoderSpec::resolve(&input, None, None, None, None).unwrap();
        assert_eq!((spec.uses_towers(), spec.text_model), (false, None));
        let m = usage(resolve(&input, Some(TextEncoder::DemoBow)));
        assert!(
            m.contains("--text-emb-col \"text_emb\"") && m.contains("not demo-bow"),
            "{m}"
        );
    }

    #[test]
    fn local_model_paths_are_recorded_absolute_and_hub_ids_as_given() {
        let input = crate::data::testutil::test_input(&[4]);
        // Tests run in the package root, where Cargo.toml is a relative path
        // that exists (resolve only records the path; nothing is loaded).
        let spec = EncoderSpec::resolve(
            &input,
            Some(ImageEncoder::MobilenetV2),
            Some(TextEncoder::Minilm),
            Some("Cargo.toml".into()),
            Some("no/such-model-dir".into()),
        )
        .unwrap();
        let image = spec.image_model.unwrap();
        assert!(Path::new(&image).is_absolute(), "{image}");
        assert_eq!(
            Path::new(&image),
            std::env::current_dir().unwrap().join("Cargo.toml")
        );
        assert_eq!(spec.text_model.as_deref(), Some("no/such-model-dir"));
        let clip = EncoderSpec::resolve(
            &input,
            Some(ImageEncoder::Clip),
            Some(TextEncoder::Clip),
            Some("openai/clip-vit-base-patch32".into()),
            None,
        )
        .unwrap();
        assert_eq!(
            (clip.image_model.as_deref(), clip.text_model.as_deref()),
            (
                Some("openai/clip-vit-base-patch32"),
                Some("openai/clip-vit-base-patch32")
            )
        );
    }

    #[test]
    fn auto_is_not_written_into_checkpoints_and_old_ones_read_as_auto() {
        let spec = EncoderSpec {
            image: ImageEncoder::MobilenetV2,
            text: TextEncoder::Minilm,
            image_model: Some("m.safetensors".into()),
            text_model: None,
            tower_dtype: TowerDtype::Auto,
        };
        let json = serde_json::to_value(&spec).unwrap();
        assert!(json.get("tower_dtype").is_none(), "{json}");
        let back: EncoderSpec = serde_json::from_value(json).unwrap();
        assert_eq!(back, spec);
        let f16 = EncoderSpec {
            tower_dtype: TowerDtype::F16,
            ..spec
        };
        let json = serde_json::to_value(&f16).unwrap();
        assert_eq!(json["tower_dtype"], "f16");
        assert_eq!(serde_json::from_value::<EncoderSpec>(json).unwrap(), f16);
    }
}
