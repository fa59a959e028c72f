//! `ncclean gpu-check`: the measurements a GPU machine owes (issue #13),
//! written as one JSON document.
//!
//! 1. Parity: the real MobileNetV2 and MiniLM (when found) and a CLIP
//!    ViT-B/32-shaped tower with random weights, on 64 inputs, on the target
//!    device in f32/f16/bf16 against the CPU in f32. Per-item cosine of the
//!    pooled features and the largest absolute difference relative to the
//!    reference's largest value; each compared with [`Tolerance`].
//! 2. Decoding: JPEG and PNG images decoded, resized and normalised on all
//!    cores (the path `fit` takes), in images/s, apart from the towers.
//! 3. Tower throughput at batch 256 in f32 and f16: images/s and captions/s.
//! 4. Training: vanilla and gsc on a generated 30k-pair embedding dataset,
//!    seconds per epoch.
//!
//! `--cpu-only` runs everything on the CPU (so CI exercises the logic), and
//! `--quick` shrinks every size so that takes seconds.

use std::path::{Path, PathBuf};
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use ncclean_models::bert_text::BertTextTower;
use ncclean_models::clip_tower::ClipTower;
use ncclean_models::mobilenet_v2::MobileNetV2;
use ncclean_models::preprocess::ImagePreprocess;
use ncclean_models::synthetic::{self, ClipShape};
use ncclean_models::{
    ImageInputs, ImageTowerConfig, ModelConfig, PairInputs, TextInputs, TextTowerConfig,
};
use serde_json::{json, Value};

use anyhow::{anyhow, Result};

/// What to measure, and how big.
#[derive(Debug, Clone)]
pub struct CheckOptions {
    /// The device under test (the CPU with `--cpu-only`).
    pub device: Device,
    /// Its description for the report (`cuda:0 (NVIDIA H100 …)`).
    pub device_name: String,
    /// Small sizes everywhere (CI).
    pub quick: bool,
    /// MobileNetV2 `model.safetensors`, if available.
    pub mobilenet: Option<PathBuf>,
    /// MiniLM directory, if available.
    pub minilm: Option<PathBuf>,
    /// Scratch directory (the synthetic CLIP is written there).
    pub scratch: PathBuf,
}

/// `ncclean gpu-check`: measure `device` (described by `device_line`,
/// `device: …`) with the MobileNetV2 weights at `mobilenet` (default:
/// `../shared/models/mobilenet_v2/model.safetensors`) and the MiniLM
/// directory `minilm` (default: `scripts/fetch_minilm.sh`'s cache), and
/// write the document to `json` after each stage (whole documents only: a
/// run stopped mid-write leaves the last stage's). A tower outside its
/// tolerance is a partial result (exit 4).
pub fn check_to_file(
    device: crate::runtime::device::Selected,
    quick: bool,
    (mobilenet, minilm): (Option<PathBuf>, Option<PathBuf>),
    json: &Path,
    log: &dyn Fn(&str),
) -> crate::Result<()> {
    use crate::error::{invalid, Error};
    let scratch = Scratch::new()?;
    let opts = CheckOptions {
        device_name: device
            .line
            .strip_prefix("device: ")
            .unwrap_or(&device.line)
            .to_string(),
        device: device.device,
        quick,
        mobilenet: mobilenet.or_else(|| {
            Some(Path::new("../shared/models/mobilenet_v2/model.safetensors").to_path_buf())
        }),
        minilm: minilm.or_else(ncclean_models::hf_dir::default_minilm_dir),
        scratch: scratch.0.clone(),
    };
    let write = |doc: &Value| -> crate::Result<()> {
        let text = serde_json::to_string_pretty(doc).map_err(anyhow::Error::from)?;
        crate::data::write_atomic(json, (text + "\n").as_bytes())
            .map_err(|e| invalid(format!("cannot write {}: {e}", json.display())))
    };
    let report = run(&opts, log, &write)?;
    log(&format!("wrote {}", json.display()));
    if report["parity_pass"] != Value::Bool(true) {
        return Err(Error::Partial(format!(
            "a tower is outside its tolerance; see \"parity\" in {}",
            json.display()
        )));
    }
    Ok(())
}

/// A directory under the system temp dir, removed when dropped (the
/// synthetic CLIP written there is 600 MB at ViT-B/32 size).
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> crate::Result<Scratch> {
        let dir = std::env::temp_dir().join(format!("ncclean-gpu-check-{}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .map_err(|e| crate::error::invalid(format!("cannot create {}: {e}", dir.display())))?;
        Ok(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Sizes of one run.
#[derive(Debug, Clone, Copy)]
struct Sizes {
    parity_inputs: usize,
    mobilenet_side: usize,
    clip: ClipShape,
    batch: usize,
    throughput_batches: usize,
    decode_images: usize,
    decode_side: (u32, u32),
    pairs: usize,
    dim: usize,
    epochs: usize,
}

impl Sizes {
    fn of(quick: bool) -> Sizes {
        if quick {
            Sizes {
                parity_inputs: 4,
                mobilenet_side: 64,
                clip: ClipShape::small(),
                batch: 4,
                throughput_batches: 1,
                decode_images: 16,
                decode_side: (160, 120),
                pairs: 600,
                dim: 32,
                epochs: 2,
            }
        } else {
            Sizes {
                parity_inputs: 64,
                mobilenet_side: 224,
                clip: ClipShape::vit_b32(),
                batch: 256,
                throughput_batches: 3,
                decode_images: 512,
                decode_side: (500, 375),
                pairs: 30_000,
                dim: 512,
                epochs: 3,
            }
        }
    }
}

/// Agreement a precision must reach against the CPU's f32, per item:
/// cosine of the pooled vectors at least `min_cosine`, and the largest
/// absolute difference at most `max_rel_diff` times the reference's
/// largest absolute value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerance {
    /// Smallest per-item cosine accepted.
    pub min_cosine: f64,
    /// Largest |Δ| accepted, relative to max |reference|.
    pub max_rel_diff: f64,
}

impl Tolerance {
    /// The stated tolerance of `dtype` for pooled (global) features, the
    /// same numbers tests/precision.rs asserts on the CPU. f32 on a GPU
    /// differs from the CPU only by summation order and fused multiply-adds.
    pub fn of(dtype: DType) -> Tolerance {
        match dtype {
            DType::F16 => Tolerance {
                min_cosine: 0.999,
                max_rel_diff: 0.02,
            },
            DType::BF16 => Tolerance {
                min_cosine: 0.99,
                max_rel_diff: 0.08,
            },
            _ => Tolerance {
                min_cosine: 0.99999,
                max_rel_diff: 1e-3,
            },
        }
    }
}

impl Tolerance {
    /// The tolerance for local features (MobileNetV2's 7×7 grid cells, CLIP
    /// patch tokens), compared flattened per item: each cell is an average
    /// of fewer terms than the pooled vector, so rounding shows more
    /// (measured on the CPU in f16 on Flickr8k photos: grid cosine 0.99986,
    /// max |Δ| 3.0%; pooled 0.99993, 0.9%).
    pub fn local(dtype: DType) -> Tolerance {
        match dtype {
            DType::F16 => Tolerance {
                min_cosine: 0.995,
                max_rel_diff: 0.05,
            },
            DType::BF16 => Tolerance {
                min_cosine: 0.98,
                max_rel_diff: 0.15,
            },
            _ => Tolerance::of(dtype),
        }
    }
}

/// How far `candidate` is from `reference` (`[N, D]` each): the smallest
/// per-row cosine and the largest |Δ| relative to max |reference|.
pub fn agreement(reference: &Tensor, candidate: &Tensor) -> Result<(f64, f64)> {
    let r: Vec<Vec<f32>> = reference.to_dtype(DType::F32)?.to_vec2()?;
    let c: Vec<Vec<f32>> = candidate
        .to_device(&Device::Cpu)?
        .to_dtype(DType::F32)?
        .to_vec2()?;
    let mut min_cos = f64::INFINITY;
    let (mut max_diff, mut max_ref) = (0f64, 0f64);
    for (a, b) in r.iter().zip(&c) {
        let (mut dot, mut na, mut nb) = (0f64, 0f64, 0f64);
        for (&x, &y) in a.iter().zip(b) {
            let (x, y) = (f64::from(x), f64::from(y));
            dot += x * y;
            na += x * x;
            nb += y * y;
            max_diff = max_diff.max((x - y).abs());
            max_ref = max_ref.max(x.abs());
        }
        let cos = dot / (na.sqrt() * nb.sqrt()).max(1e-30);
        // NaN (an overflowed half-precision run) must fail, not vanish in min.
        min_cos = if cos.is_nan() {
            f64::NAN
        } else {
            min_cos.min(cos)
        };
        if min_cos.is_nan() {
            break;
        }
    }
    Ok((min_cos, max_diff / max_ref.max(1e-30)))
}

fn compare(reference: &Tensor, candidate: &Tensor, dtype: DType) -> Result<Value> {
    compare_with(reference, candidate, Tolerance::of(dtype))
}

/// Local features `[N, P, D]` compared per item, flattened.
fn compare_local(reference: &Tensor, candidate: &Tensor, dtype: DType) -> Result<Value> {
    compare_with(
        &reference.flatten_from(1)?,
        &candidate.flatten_from(1)?,
        Tolerance::local(dtype),
    )
}

fn compare_with(reference: &Tensor, candidate: &Tensor, tol: Tolerance) -> Result<Value> {
    let (cos, rel) = agreement(reference, candidate)?;
    let pass = cos >= tol.min_cosine && rel <= tol.max_rel_diff;
    Ok(json!({
        "min_cosine": finite_or_null(cos),
        "max_rel_diff": finite_or_null(rel),
        "tolerance": { "min_cosine": tol.min_cosine, "max_rel_diff": tol.max_rel_diff },
        "pass": pass,
    }))
}

fn finite_or_null(v: f64) -> Value {
    if v.is_finite() {
        json!(v)
    } else {
        Value::Null
    }
}

const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// Why `dtype` is not measured on `device`, if it is not: candle 0.11's CPU
/// convolution has no bf16 kernel (its im2col product rejects bf16:
/// "unsupported dtype BF16 for op matmul"), and both image towers start
/// with a convolution, so bf16 is a CUDA-only precision.
fn unsupported(dtype: DType, device: &Device) -> Option<Value> {
    (dtype == DType::BF16 && device.is_cpu())
        .then(|| json!("not run: candle's CPU backend has no bf16 convolution"))
}

fn seconds(t: Instant) -> f64 {
    t.elapsed().as_secs_f64()
}

/// Wait for the device: reading one value back ends every queued kernel.
fn sync(t: &Tensor) -> Result<()> {
    t.flatten_all()?
        .narrow(0, 0, 1)?
        .to_dtype(DType::F32)?
        .to_vec1::<f32>()?;
    Ok(())
}

/// Run every measurement and return the report.
/// Runs every measurement. `save` is handed the document after each stage
/// (parity, decoding, throughput, training), so a run cut short by a time
/// limit still leaves what it measured.
pub fn run(
    opts: &CheckOptions,
    log: &dyn Fn(&str),
    save: &dyn Fn(&Value) -> crate::Result<()>,
) -> crate::Result<Value> {
    let mut doc = json!({});
    let mut saving = |doc: &Value| save(doc);
    match run_all(opts, log, &mut doc, &mut saving) {
        Ok(()) => Ok(doc),
        Err(Stop::Check(e)) => Err(e.context("gpu-check").into()),
        Err(Stop::Save(e)) => Err(e),
    }
}

/// Why [`run_all`] stopped early.
enum Stop {
    Check(anyhow::Error),
    Save(crate::Error),
}

impl From<anyhow::Error> for Stop {
    fn from(e: anyhow::Error) -> Stop {
        Stop::Check(e)
    }
}

impl From<candle_core::Error> for Stop {
    fn from(e: candle_core::Error) -> Stop {
        Stop::Check(e.into())
    }
}

fn run_all(
    opts: &CheckOptions,
    log: &dyn Fn(&str),
    doc: &mut Value,
    save: &mut dyn FnMut(&Value) -> crate::Result<()>,
) -> std::result::Result<(), Stop> {
    let sizes = Sizes::of(opts.quick);
    let started = Instant::now();
    *doc = json!({
        "ncclean": env!("CARGO_PKG_VERSION"),
        "device": opts.device_name,
        "cuda": opts.device.is_cuda(),
        "quick": opts.quick,
        "cpu_threads": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
    });
    let clip_dir = opts.scratch.join("synthetic-clip");
    log("writing the synthetic CLIP tower");
    sizes.clip.write_dir(&clip_dir, 7)?;

    let stage = |name: &str| {
        log(&format!("{name} ({:.1}s in)", seconds(started)));
    };
    stage("parity");
    doc["parity"] = json!({
        "inputs": sizes.parity_inputs,
        "reference": "cpu f32",
        "mobilenet_v2": parity_mobilenet(opts, &sizes)?,
        "minilm": parity_minilm(opts, &sizes)?,
        "clip_vit_b32": parity_clip(opts, &sizes, &clip_dir)?,
    });
    doc["parity_pass"] = json!(all_pass(&doc["parity"]));
    save(doc).map_err(Stop::Save)?;
    stage("decoding");
    doc["decode"] = decode_rate(&sizes)?;
    save(doc).map_err(Stop::Save)?;
    stage("tower throughput");
    doc["throughput"] = throughput(opts, &sizes, &clip_dir)?;
    save(doc).map_err(Stop::Save)?;
    stage("training");
    doc["training"] = training(opts, &sizes, log)?;
    doc["seconds"] = json!(seconds(started));
    save(doc).map_err(Stop::Save)?;
    Ok(())
}

/// Every `pass` under `v` is true (skipped towers have none).
fn all_pass(v: &Value) -> bool {
    match v {
        Value::Object(m) => m.iter().all(|(k, x)| {
            if k == "pass" {
                x.as_bool().unwrap_or(false)
            } else {
                all_pass(x)
            }
        }),
        _ => true,
    }
}

fn parity_mobilenet(opts: &CheckOptions, s: &Sizes) -> Result<Value> {
    let Some(path) = opts.mobilenet.as_ref().filter(|p| p.is_file()) else {
        return Ok(json!({ "status": "skipped: not found" }));
    };
    let x = synthetic::pixels(s.parity_inputs, s.mobilenet_side, 11, &Device::Cpu)?;
    let reference = MobileNetV2::load(path, &Device::Cpu)?.forward(&x)?;
    let mut out = json!({ "status": "ok", "weights": path.display().to_string() });
    for dtype in DTYPES {
        if let Some(why) = unsupported(dtype, &opts.device) {
            out[dtype.as_str()] = why;
            continue;
        }
        let net = MobileNetV2::load_with_dtype(path, &opts.device, dtype)?;
        let got = net.forward(&x.to_device(&opts.device)?)?;
        out[dtype.as_str()] = json!({
            "pooled": compare(&reference.pooled, &got.pooled, dtype)?,
            "grid": compare_local(&reference.grid, &got.grid, dtype)?,
        });
    }
    Ok(out)
}

fn parity_minilm(opts: &CheckOptions, s: &Sizes) -> Result<Value> {
    let Some(dir) = opts
        .minilm
        .as_ref()
        .filter(|d| d.join("config.json").is_file())
    else {
        return Ok(json!({ "status": "skipped: not found" }));
    };
    let captions = synthetic::captions(s.parity_inputs, 13);
    let refs: Vec<&str> = captions.iter().map(String::as_str).collect();
    let reference = BertTextTower::load(dir, &Device::Cpu)?
        .forward(&refs)?
        .pooled;
    let got = BertTextTower::load(dir, &opts.device)?
        .forward(&refs)?
        .pooled;
    Ok(json!({
        "status": "ok",
        "weights": dir.display().to_string(),
        "f32": compare(&reference, &got, DType::F32)?,
        "f16": "not run: candle-transformers' BERT attention mask is NaN in half precision; MiniLM runs in f32",
    }))
}

fn parity_clip(opts: &CheckOptions, s: &Sizes, dir: &Path) -> Result<Value> {
    let x = synthetic::pixels(s.parity_inputs, s.clip.image_size, 17, &Device::Cpu)?;
    let captions = synthetic::captions(s.parity_inputs, 19);
    let refs: Vec<&str> = captions.iter().map(String::as_str).collect();
    let cpu = ClipTower::load(dir, &Device::Cpu)?;
    let (ref_patches, ref_img) = cpu.image_features(&x)?;
    let (_, _, ref_txt) = cpu.text_features(&refs)?;
    let mut out = json!({ "status": "ok", "weights": "random (ViT-B/32 shape)", "shape": format!("{:?}", s.clip) });
    for dtype in DTYPES {
        if let Some(why) = unsupported(dtype, &opts.device) {
            out[dtype.as_str()] = why;
            continue;
        }
        let tower = ClipTower::load_with_dtype(dir, &opts.device, dtype)?;
        let (patches, img) = tower.image_features(&x.to_device(&opts.device)?)?;
        let (_, _, txt) = tower.text_features(&refs)?;
        out[dtype.as_str()] = json!({
            "image": compare(&ref_img, &img, dtype)?,
            "patches": compare_local(&ref_patches, &patches, dtype)?,
            "text": compare(&ref_txt, &txt, dtype)?,
        });
    }
    Ok(out)
}

/// Encode synthetic photos-like images (smooth gradients and noise) as
/// JPEG and PNG, then time decoding + resizing + normalising them on all
/// cores with the preprocessing `fit` uses.
fn decode_rate(s: &Sizes) -> Result<Value> {
    let (w, h) = s.decode_side;
    let mut rng = ncclean_models::rng::Rng::new(23);
    let mut jpegs = Vec::with_capacity(s.decode_images);
    let mut pngs = Vec::with_capacity(s.decode_images);
    for i in 0..s.decode_images {
        let img = image::RgbImage::from_fn(w, h, |x, y| {
            let n = (rng.uniform() * 40.0) as u32;
            image::Rgb([
                ((x * 255 / w + n + i as u32) % 256) as u8,
                ((y * 255 / h + n) % 256) as u8,
                (((x + y) * 3 + n) % 256) as u8,
            ])
        });
        for (format, out) in [
            (image::ImageFormat::Jpeg, &mut jpegs),
            (image::ImageFormat::Png, &mut pngs),
        ] {
            let mut buf = std::io::Cursor::new(Vec::new());
            img.write_to(&mut buf, format)
                .map_err(|e| anyhow!("encoding a test image: {e}"))?;
            out.push(buf.into_inner());
        }
    }
    let pre = ImagePreprocess::imagenet();
    let mut out = json!({
        "images": s.decode_images,
        "source_size": [w, h],
        "target_size": pre.size,
        "threads": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
    });
    for (name, set) in [("jpeg", &jpegs), ("png", &pngs)] {
        let t = Instant::now();
        let decoded = crate::runtime::parallel::parallel_map(set, |b| pre.apply(b));
        let secs = seconds(t);
        if let Some(Err(e)) = decoded.iter().find(|d| d.is_err()) {
            return Err(anyhow!("decoding a test {name}: {e}"));
        }
        out[format!("{name}_img_per_s")] = json!(set.len() as f64 / secs);
    }
    Ok(out)
}

/// Items per second of `f` over `batches` timed batches after one warm-up.
fn rate(batch: usize, batches: usize, f: impl Fn() -> Result<Tensor>) -> Result<f64> {
    sync(&f()?)?;
    let t = Instant::now();
    for _ in 0..batches {
        sync(&f()?)?;
    }
    Ok((batch * batches) as f64 / seconds(t))
}

fn throughput(opts: &CheckOptions, s: &Sizes, clip_dir: &Path) -> Result<Value> {
    let dev = &opts.device;
    let b = s.batch;
    let n = s.throughput_batches;
    let mut out = json!({ "batch": b, "timed_batches": n, "weights": "random" });
    let px224 = synthetic::pixels(b, s.mobilenet_side, 29, dev)?;
    let pxclip = synthetic::pixels(b, s.clip.image_size, 31, dev)?;
    let captions = synthetic::captions(b, 37);
    let refs: Vec<&str> = captions.iter().map(String::as_str).collect();
    for dtype in [DType::F32, DType::F16] {
        let key = dtype.as_str();
        let net = MobileNetV2::synthetic(dev, dtype)?;
        out["mobilenet_v2_img_per_s"][key] = json!(rate(b, n, || Ok(net.forward(&px224)?.pooled))?);
        drop(net);
        let clip = ClipTower::load_with_dtype(clip_dir, dev, dtype)?;
        out["clip_vit_b32_img_per_s"][key] =
            json!(rate(b, n, || Ok(clip.image_features(&pxclip)?.1))?);
        out["clip_vit_b32_captions_per_s"][key] =
            json!(rate(b, n, || Ok(clip.text_features(&refs)?.2))?);
    }
    out["minilm_captions_per_s"] = match opts
        .minilm
        .as_ref()
        .filter(|d| d.join("config.json").is_file())
    {
        Some(dir) => {
            let bert = BertTextTower::load(dir, dev)?;
            // The encoder on ids, as PyTorch's side is timed; tokenising
            // (on the CPU, one thread) is its own row.
            let (ids, mask) = bert.tokenize(&refs)?;
            out["minilm_tokenize_captions_per_s"] =
                json!(rate(b, n, || Ok(bert.tokenize(&refs)?.0))?);
            json!({ "f32": rate(b, n, || Ok(bert.forward_ids(&ids, &mask)?.pooled))? })
        }
        None => json!("skipped: not found"),
    };
    Ok(out)
}

/// `n` pairs of `dim`-wide image and text embeddings that share a 32-d
/// latent per pair, 20% of the images permuted (noisy pairs).
pub fn embedding_pairs(n: usize, dim: usize, seed: u64) -> PairInputs {
    let mut rng = ncclean_models::rng::Rng::new(seed);
    let latent = 32;
    let proj = |rng: &mut ncclean_models::rng::Rng| -> Vec<f32> {
        (0..latent * dim)
            .map(|_| (rng.normal() / (latent as f64).sqrt()) as f32)
            .collect()
    };
    let (pa, pb) = (proj(&mut rng), proj(&mut rng));
    let mut images = vec![0f32; n * dim];
    let mut texts = vec![0f32; n * dim];
    for i in 0..n {
        let z: Vec<f32> = (0..latent).map(|_| rng.normal() as f32).collect();
        for d in 0..dim {
            let (mut a, mut b) = (0f32, 0f32);
            for (k, zk) in z.iter().enumerate() {
                a += zk * pa[k * dim + d];
                b += zk * pb[k * dim + d];
            }
            images[i * dim + d] = a + 0.3 * rng.normal() as f32;
            texts[i * dim + d] = b + 0.3 * rng.normal() as f32;
        }
    }
    // Permute the images of every fifth pair among themselves.
    let noisy: Vec<usize> = (0..n).filter(|i| i % 5 == 0).collect();
    let mut perm = noisy.clone();
    rng.shuffle(&mut perm);
    let orig = images.clone();
    for (&to, &from) in noisy.iter().zip(&perm) {
        images[to * dim..(to + 1) * dim].copy_from_slice(&orig[from * dim..(from + 1) * dim]);
    }
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

fn training(opts: &CheckOptions, s: &Sizes, log: &dyn Fn(&str)) -> Result<Value> {
    let data = embedding_pairs(s.pairs, s.dim, 41);
    let mut out = json!({ "pairs": s.pairs, "dim": s.dim, "noise": 0.2 });
    for method in ["vanilla", "gsc"] {
        let mut overrides = toml::Table::new();
        overrides.insert("epochs".into(), toml::Value::Integer(s.epochs as i64));
        let warmup = if method == "vanilla" { 1 } else { 0 };
        overrides.insert("warmup_epochs".into(), toml::Value::Integer(warmup));
        overrides.insert("lr_decay_epochs".into(), toml::Value::Array(Vec::new()));
        let cfg = ncclean_pipelines::presets::resolve(method, None, &overrides)
            .map_err(|e| anyhow!(e))?;
        let model = ModelConfig {
            image: ImageTowerConfig::Precomputed {
                dim: s.dim,
                local_dim: None,
            },
            text: TextTowerConfig::Precomputed {
                dim: s.dim,
                local_dim: None,
            },
            joint_dim: cfg.joint_dim,
            hidden: cfg.hidden,
            head: Default::default(),
        };
        let info = ncclean_pipelines::registry::find(method)?;
        let mut pipeline = (info.build)(cfg, &model, 0, &opts.device)?;
        let mut obs = ncclean_pipelines::pipeline::Silent;
        let mut epochs = Vec::new();
        for e in 0..pipeline.total_epochs() {
            let t = Instant::now();
            let stats = pipeline.run_epoch(e, &data, &mut obs)?;
            let secs = seconds(t);
            log(&format!("{method} epoch {}: {secs:.2}s", e + 1));
            epochs.push(json!({ "phase": stats.phase, "seconds": secs, "loss": stats.loss }));
        }
        let t = Instant::now();
        pipeline.finalize(&data, &[data.len()], &mut obs)?;
        let final_division = seconds(t);
        let secs: Vec<f64> = epochs
            .iter()
            .filter_map(|e| e["seconds"].as_f64())
            .collect();
        out[method] = json!({
            "epochs": epochs,
            "seconds_per_epoch": secs.iter().sum::<f64>() / secs.len().max(1) as f64,
            "final_division_seconds": final_division,
        });
    }
    Ok(out)
}
