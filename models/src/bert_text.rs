//! A frozen pretrained BERT text tower (e.g. sentence-transformers'
//! all-MiniLM-L6-v2), loaded from a Hugging Face model directory.
//!
//! The tower runs a BERT encoder on token ids from the `tokenizers` crate
//! and returns the last hidden states, the attention mask and their
//! attention-masked mean (the sentence-transformers pooling, before its L2
//! normalisation). On the CPU the encoder is the fused inference kernels
//! of `bert_cpu.rs` (issue #35: 1.7–2.2× candle's captions/s, same outputs
//! within float rounding); on other devices, or for a config those kernels
//! do not cover, it is candle-transformers' [`BertModel`] ([`BertBackend`]).
//!
//! **Frozen only.** Neither backend can be trained through: the fused one
//! has no autograd at all, and candle-transformers' BERT normalises with
//! `candle_nn::LayerNorm`, whose forward pass on contiguous input is candle's
//! fused `layer-norm` op, applied with `apply_op3_no_bwd`: in candle 0.11 its
//! output is not connected to its inputs in the autograd graph, so a backward
//! pass silently produces no gradient for the layer-norm parameters or for
//! anything before it. The forward values are exact, so feature extraction is
//! correct, but this tower must not be fine-tuned through candle's autograd.
//! (Its attention softmax is the unfused, differentiable
//! `candle_nn::ops::softmax`.) Treat its outputs as constants.

use std::path::Path;

use candle_core::{DType, Device, Result, Tensor, D};
use candle_transformers::models::bert::{BertModel, Config as BertConfig};
use tokenizers::Tokenizer;

use crate::bert_cpu::CpuBert;
use crate::hf_dir;

/// Default maximum number of tokens per text, special tokens included
/// (sentence-transformers' all-MiniLM-L6-v2 tokenizer.json truncates at 128).
pub const DEFAULT_MAX_LEN: usize = 128;

const TOWER: &str = "BERT text tower";

/// Output of [`BertTextTower::forward`].
#[derive(Debug, Clone)]
pub struct TextFeatures {
    /// `[B, L, H]` last hidden states; rows beyond a text's length are padding
    /// (zeros from the fused CPU encoder, candle's values otherwise).
    pub tokens: Tensor,
    /// `[B, L]` f32 attention mask, 1 on real tokens (special tokens included).
    pub mask: Tensor,
    /// `[B, H]` attention-masked mean of `tokens` (not normalised).
    pub pooled: Tensor,
}

/// Which implementation runs the encoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BertBackend {
    /// The fused CPU kernels of `bert_cpu.rs` when the device is the CPU
    /// and the config is covered (absolute positions, erf GELU), otherwise
    /// candle's model. The default.
    Auto,
    /// candle-transformers' `BertModel` (any device; the reference the fused
    /// kernels are measured against).
    Candle,
}

enum Encoder {
    Fused(Box<CpuBert>),
    Candle(Box<BertModel>),
}

/// A frozen BERT encoder with its tokenizer.
pub struct BertTextTower {
    model: Encoder,
    tokenizer: Tokenizer,
    hidden_size: usize,
    max_len: usize,
    pad_id: u32,
    device: Device,
    fingerprint: String,
}

impl std::fmt::Debug for BertTextTower {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BertTextTower")
            .field("hidden_size", &self.hidden_size)
            .field("max_len", &self.max_len)
            .field("backend", &self.backend())
            .field("fingerprint", &self.fingerprint)
            .finish_non_exhaustive()
    }
}

impl BertTextTower {
    /// Load config.json, model.safetensors and tokenizer.json from `dir`
    /// with [`DEFAULT_MAX_LEN`]. Errors name the missing or broken file.
    pub fn load(dir: &Path, device: &Device) -> Result<Self> {
        Self::load_with_max_len(dir, device, DEFAULT_MAX_LEN)
    }

    /// Resolve `spec` (a directory or a hub id, see
    /// [`hf_dir::resolve_model_dir`]) and load it.
    pub fn from_spec(spec: &str, device: &Device) -> Result<Self> {
        let dir = hf_dir::resolve_model_dir(spec).map_err(candle_core::Error::Msg)?;
        Self::load(&dir, device)
    }

    /// [`BertTextTower::load`] truncating texts to `max_len` tokens (capped
    /// at the model's `max_position_embeddings`).
    pub fn load_with_max_len(dir: &Path, device: &Device, max_len: usize) -> Result<Self> {
        Self::load_with_backend(dir, device, max_len, BertBackend::Auto)
    }

    /// [`BertTextTower::load_with_max_len`] with a chosen [`BertBackend`].
    pub fn load_with_backend(
        dir: &Path,
        device: &Device,
        max_len: usize,
        backend: BertBackend,
    ) -> Result<Self> {
        hf_dir::require_files(dir, &hf_dir::REQUIRED_FILES, TOWER)?;
        let config_json = hf_dir::read_json(dir, "config.json")?;
        let config: BertConfig = serde_json::from_value(config_json).map_err(|e| {
            candle_core::Error::Msg(format!(
                "{TOWER}: {} is not a BERT config: {e}",
                dir.join("config.json").display()
            ))
        })?;
        if max_len < 2 {
            candle_core::bail!("{TOWER}: max_len must be at least 2 (got {max_len})");
        }
        let max_len = max_len.min(config.max_position_embeddings);
        let (tokenizer, tokenizer_pad) = hf_dir::load_tokenizer(dir, max_len)?;
        let pad_id = tokenizer_pad.unwrap_or(config.pad_token_id as u32);
        // Always f32: candle-transformers' BERT builds its attention mask as
        // (1 - mask) * f32::MIN in the model dtype, and f32::MIN is -inf in
        // f16 and bf16, so every real token's score becomes 0 * -inf = NaN.
        let vb = hf_dir::safetensors_var_builder(dir, device, DType::F32)?;
        let fused = backend == BertBackend::Auto && device.is_cpu() && CpuBert::supports(&config);
        let model = if fused {
            CpuBert::load(vb, &config).map(|m| Encoder::Fused(Box::new(m)))
        } else {
            BertModel::load(vb, &config).map(|m| Encoder::Candle(Box::new(m)))
        }
        .map_err(|e| {
            candle_core::Error::Msg(format!(
                "{TOWER}: loading weights from {}: {e}",
                dir.join("model.safetensors").display()
            ))
        })?;
        let fingerprint = hf_dir::fingerprint_files(dir, &hf_dir::REQUIRED_FILES)
            .map_err(|e| candle_core::Error::Msg(format!("{TOWER}: fingerprinting: {e}")))?;
        Ok(BertTextTower {
            model,
            tokenizer,
            hidden_size: config.hidden_size,
            max_len,
            pad_id,
            device: device.clone(),
            fingerprint,
        })
    }

    /// Tokenise (special tokens added, truncated to the maximum length,
    /// padding disabled in the tokenizer) and right-pad to the longest text:
    /// (ids `[B, L]` u32, attention mask `[B, L]` f32).
    pub fn tokenize(&self, texts: &[&str]) -> Result<(Tensor, Tensor)> {
        let ids = hf_dir::encode_texts(&self.tokenizer, texts)?;
        hf_dir::pad_batch(&ids, self.pad_id, &self.device)
    }

    /// Encode `texts`: last hidden states, mask and masked mean pool.
    pub fn forward(&self, texts: &[&str]) -> Result<TextFeatures> {
        let (ids, mask) = self.tokenize(texts)?;
        self.forward_ids(&ids, &mask)
    }

    /// Encode already tokenised input (ids `[B, L]` u32, mask `[B, L]`).
    pub fn forward_ids(&self, ids: &Tensor, mask: &Tensor) -> Result<TextFeatures> {
        let mask = mask.to_dtype(DType::F32)?;
        let (tokens, pooled) = match &self.model {
            Encoder::Fused(m) => {
                let (b, l) = ids.dims2()?;
                let ids_v = ids.to_dtype(DType::U32)?.flatten_all()?.to_vec1::<u32>()?;
                let mask_v = mask.flatten_all()?.to_vec1::<f32>()?;
                let (t, p) = m.forward(&ids_v, &mask_v, b, l)?;
                (
                    Tensor::from_vec(t, (b, l, self.hidden_size), &self.device)?,
                    Tensor::from_vec(p, (b, self.hidden_size), &self.device)?,
                )
            }
            Encoder::Candle(m) => {
                let tokens = m.forward(ids, &ids.zeros_like()?, Some(&mask))?;
                let pooled = masked_mean(&tokens, &mask)?;
                (tokens, pooled)
            }
        };
        Ok(TextFeatures {
            tokens,
            mask,
            pooled,
        })
    }

    /// The implementation this tower runs ([`BertBackend::Auto`] when it
    /// took the fused CPU kernels).
    pub fn backend(&self) -> BertBackend {
        match self.model {
            Encoder::Fused(_) => BertBackend::Auto,
            Encoder::Candle(_) => BertBackend::Candle,
        }
    }

    /// Width `H` of the hidden states (384 for MiniLM-L6).
    pub fn hidden_size(&self) -> usize {
        self.hidden_size
    }

    /// Maximum tokens per text, special tokens included.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// Stable id of the weights, config, tokenizer and maximum length, for
    /// keying a feature cache: `bert-h{H}-{16 hex digits}-len{max_len}`, the
    /// hex digits from SHA-256 over the three files' sizes and (sampled)
    /// content, so the tag does not depend on where the directory lives.
    pub fn cache_tag(&self) -> String {
        format!(
            "bert-h{}-{}-len{}",
            self.hidden_size, self.fingerprint, self.max_len
        )
    }
}

/// Mean of `tokens` `[B, L, H]` over positions where `mask` `[B, L]` is 1.
pub fn masked_mean(tokens: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let mask = mask.to_dtype(tokens.dtype())?;
    let summed = tokens.broadcast_mul(&mask.unsqueeze(D::Minus1)?)?.sum(1)?;
    let counts = mask.sum_keepdim(1)?.clamp(1e-9, f64::MAX)?;
    summed.broadcast_div(&counts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hf_dir::test_util::TempDir;
    use std::path::PathBuf;

    fn shared_reference() -> Option<PathBuf> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../shared/models/all-MiniLM-L6-v2.reference.json");
        path.is_file().then_some(path)
    }

    fn l2_normalise(v: &[f32]) -> Vec<f32> {
        let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        v.iter().map(|x| x / n).collect()
    }

    fn dot(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    #[test]
    fn masked_mean_ignores_padding() -> Result<()> {
        let dev = Device::Cpu;
        let tokens = Tensor::from_vec(
            vec![1f32, 2., 3., 4., 100., 100., 5., 6., 7., 8., 9., 10.],
            (2, 3, 2),
            &dev,
        )?;
        let mask = Tensor::from_vec(vec![1f32, 1., 0., 1., 1., 1.], (2, 3), &dev)?;
        let got = masked_mean(&tokens, &mask)?.to_vec2::<f32>()?;
        assert_eq!(got, vec![vec![2., 3.], vec![7., 8.]]);
        Ok(())
    }

    #[test]
    fn missing_file_is_named() {
        let tmp = TempDir::new("bert-missing");
        std::fs::write(tmp.0.join("config.json"), "{}").unwrap();
        std::fs::write(tmp.0.join("tokenizer.json"), "{}").unwrap();
        let err = BertTextTower::load(&tmp.0, &Device::Cpu)
            .unwrap_err()
            .to_string();
        assert!(err.contains("model.safetensors is missing"), "{err}");
        let err = BertTextTower::load(&tmp.0.join("nope"), &Device::Cpu)
            .unwrap_err()
            .to_string();
        assert!(err.contains("does not exist"), "{err}");
    }

    /// Reproduces shared/models/all-MiniLM-L6-v2.reference.json (an
    /// independent numpy forward pass). Skips when the model has not been
    /// fetched (scripts/fetch_minilm.sh) or shared/ is absent.
    /// Why the tower is f32-only: candle-transformers' BERT masks attention
    /// with `(1 - mask) * f32::MIN` in the model dtype; in f16 that constant
    /// is -inf and every unmasked score becomes `0 * -inf` = NaN. If a
    /// candle upgrade fixes this, this test fails: then half precision can
    /// be offered for MiniLM too.
    #[test]
    fn candle_bert_in_f16_is_nan_so_minilm_stays_f32() -> Result<()> {
        let Some(dir) = hf_dir::default_minilm_dir() else {
            eprintln!("skipped: MiniLM not found (run bash scripts/fetch_minilm.sh)");
            return Ok(());
        };
        let config: BertConfig = serde_json::from_value(hf_dir::read_json(&dir, "config.json")?)
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        let vb = hf_dir::safetensors_var_builder(&dir, &Device::Cpu, DType::F16)?;
        let model = BertModel::load(vb, &config)?;
        let ids = Tensor::new(&[[101u32, 2023, 2003, 1037, 3899, 102]], &Device::Cpu)?;
        let mask = Tensor::ones((1, 6), DType::F16, &Device::Cpu)?;
        let out = model.forward(&ids, &ids.zeros_like()?, Some(&mask))?;
        let values: Vec<f32> = out.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
        assert!(values.iter().all(|v| v.is_nan()), "f16 BERT no longer NaN");
        // The tower itself loads in f32 and is finite.
        let tower = BertTextTower::load(&dir, &Device::Cpu)?;
        let f = tower.forward(&["a dog runs on the grass"])?;
        assert_eq!(f.pooled.dtype(), DType::F32);
        Ok(())
    }

    /// The fused CPU encoder against candle's BertModel on mixed lengths:
    /// real tokens and pooled vectors agree to float rounding; padded rows
    /// are zeros.
    #[test]
    fn fused_encoder_matches_candle_backend() -> Result<()> {
        let Some(dir) = hf_dir::default_minilm_dir() else {
            eprintln!("skipped: MiniLM not found (run bash scripts/fetch_minilm.sh)");
            return Ok(());
        };
        let dev = Device::Cpu;
        let fused = BertTextTower::load(&dir, &dev)?;
        let candle =
            BertTextTower::load_with_backend(&dir, &dev, DEFAULT_MAX_LEN, BertBackend::Candle)?;
        assert_eq!(fused.backend(), BertBackend::Auto);
        assert_eq!(candle.backend(), BertBackend::Candle);
        let texts = [
            "a dog",
            "two children are playing football in a sunny park near the river",
            "a man rides a bicycle down a steep , rocky mountain trail .",
            "",
        ];
        let (a, b) = (fused.forward(&texts)?, candle.forward(&texts)?);
        let (pa, pb) = (a.pooled.to_vec2::<f32>()?, b.pooled.to_vec2::<f32>()?);
        for (ra, rb) in pa.iter().zip(&pb) {
            for (x, y) in ra.iter().zip(rb) {
                assert!((x - y).abs() < 1e-5, "pooled {x} vs {y}");
            }
        }
        let (ta, tb) = (a.tokens.to_vec3::<f32>()?, b.tokens.to_vec3::<f32>()?);
        let mask = a.mask.to_vec2::<f32>()?;
        for s in 0..texts.len() {
            for i in 0..mask[s].len() {
                for (x, y) in ta[s][i].iter().zip(&tb[s][i]) {
                    if mask[s][i] == 1.0 {
                        assert!((x - y).abs() < 1e-4, "token {s},{i}: {x} vs {y}");
                    } else {
                        assert_eq!(*x, 0.0, "padding {s},{i}");
                    }
                }
            }
        }
        Ok(())
    }

    #[test]
    fn minilm_matches_reference() -> Result<()> {
        let Some(dir) = hf_dir::default_minilm_dir() else {
            eprintln!(
                "skipping minilm_matches_reference: all-MiniLM-L6-v2 not found \
                 (run scripts/fetch_minilm.sh or set NCCLEAN_MINILM_DIR)"
            );
            return Ok(());
        };
        let Some(reference) = shared_reference() else {
            eprintln!("skipping minilm_matches_reference: ../shared is absent");
            return Ok(());
        };
        let reference: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(reference).unwrap()).unwrap();
        let refs = reference["references"].as_array().unwrap();
        let texts: Vec<&str> = refs.iter().map(|r| r["text"].as_str().unwrap()).collect();

        let dev = Device::Cpu;
        let tower = BertTextTower::load(&dir, &dev)?;
        assert_eq!(tower.hidden_size(), 384);
        assert_eq!(tower.max_len(), DEFAULT_MAX_LEN);

        // Token ids: the reference pads rows 2 and 3 with 0 to length 20,
        // which is exactly the batch maximum here.
        let (ids, mask) = tower.tokenize(&texts)?;
        let ids = ids.to_vec2::<u32>()?;
        let mask = mask.to_vec2::<f32>()?;
        for (i, r) in refs.iter().enumerate() {
            let want: Vec<u32> = r["token_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect();
            assert_eq!(ids[i], want, "token ids of reference {i}");
            let real = want.iter().filter(|&&t| t != 0).count();
            assert_eq!(mask[i].iter().sum::<f32>() as usize, real, "mask of {i}");
        }

        let feats = tower.forward(&texts)?;
        assert_eq!(feats.tokens.dims(), &[3, 20, 384]);
        assert_eq!(feats.mask.dims(), &[3, 20]);
        let pooled = feats.pooled.to_vec2::<f32>()?;
        let normed: Vec<Vec<f32>> = pooled.iter().map(|p| l2_normalise(p)).collect();
        let mut max_dev = 0f32;
        for (i, r) in refs.iter().enumerate() {
            for (j, want) in r["embedding_first8"].as_array().unwrap().iter().enumerate() {
                let d = (normed[i][j] - want.as_f64().unwrap() as f32).abs();
                max_dev = max_dev.max(d);
                assert!(d < 1e-3, "embedding {i}[{j}]: {} vs {want}", normed[i][j]);
            }
        }
        let c01 = dot(&normed[0], &normed[1]);
        let c12 = dot(&normed[1], &normed[2]);
        let d01 = (c01 - reference["cosine_0_1"].as_f64().unwrap() as f32).abs();
        let d12 = (c12 - reference["cosine_1_2"].as_f64().unwrap() as f32).abs();
        assert!(d01 < 1e-3, "cosine_0_1 {c01}");
        assert!(d12 < 1e-3, "cosine_1_2 {c12}");
        eprintln!(
            "MiniLM reference: max |Δ| first8 = {max_dev:.2e}, cos01 {c01:.5} (Δ {d01:.1e}), \
             cos12 {c12:.5} (Δ {d12:.1e}), tag {}",
            tower.cache_tag()
        );

        // Padding must not leak: a short text alone pools as in the batch.
        let alone = tower.forward(&texts[1..2])?.pooled.to_vec2::<f32>()?;
        for (a, b) in alone[0].iter().zip(&pooled[1]) {
            assert!((a - b).abs() < 1e-4, "{a} vs {b}");
        }

        // Truncation keeps [CLS] ... [SEP] within max_len.
        let long = "dog ".repeat(300);
        let (ids, _) = tower.tokenize(&[long.as_str()])?;
        let ids = ids.to_vec2::<u32>()?;
        assert_eq!(ids[0].len(), DEFAULT_MAX_LEN);
        assert_eq!((ids[0][0], ids[0][DEFAULT_MAX_LEN - 1]), (101, 102));

        // The tag is stable across loads and reflects max_len.
        let again = BertTextTower::load_with_max_len(&dir, &dev, 64)?;
        assert_eq!(
            again.cache_tag(),
            tower.cache_tag().replace("-len128", "-len64")
        );
        Ok(())
    }
}
