//! Tower throughput on CPU, each stage against the machine's own matrix
//! product speed measured in the same run (issue #10): a slow stage reads as
//! "x% of what the hardware allows", not as an absolute number that depends
//! on how loaded the machine was.
//!
//! Stages (the tool's own code paths: `ncclean::data::images::decode` with the
//! default limits, `ncclean::towers::encoders::{ImageTower, TextTower}`):
//!
//! - matmul: candle f32 `[1024, 1024]` products, measured again right
//!   before each stage (each ratio is against its own, so a load that comes
//!   and goes moves both alike), and the MiniLM feed-forward shape;
//! - JPEG decode + resize to MobileNetV2's 224² input, on every core;
//! - MobileNetV2 forward on decoded batches of 32, and end to end from JPEG
//!   bytes (decode, then forward, as `fit` runs it);
//! - MiniLM on Flickr8k captions, in the length-sorted windows `fit` uses;
//! - a CLIP ViT-B/32-shaped vision transformer with random weights.
//!
//! Usage (release build; `examples/bench_towers.sh` runs it and the
//! end-to-end read-rows fit):
//!
//! ```text
//! cargo run --release --example bench_towers -- FLICKR8K_DIR MOBILENET.safetensors MINILM_DIR \
//!     [--images N] [--captions N] [--clip-images N] [--markdown]
//! ```

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};
use candle_transformers::models::clip::vision_model::{ClipVisionConfig, ClipVisionTransformer};
use ncclean::data::images::{self, ImageLimits};
use ncclean::towers::encoders::{
    EncoderSpec, ImageEncoder, ImageTower, TextEncoder, TextTower, TowerDtype,
};

/// Multiply-adds of one 224² MobileNetV2 (width 1.0) forward, as published
/// (Sandler et al. 2018, table 3: 300M).
const MOBILENET_MADDS: f64 = 300e6;
/// The tool's batch sizes (src/towers/features/extract.rs).
const IMAGE_BATCH: usize = 32;
const TEXT_BATCH: usize = 64;
const TEXT_WINDOW: usize = 8 * TEXT_BATCH;

struct Args {
    flickr: PathBuf,
    mobilenet: PathBuf,
    minilm: PathBuf,
    images: usize,
    captions: usize,
    clip_images: usize,
    markdown: bool,
}

fn parse_args() -> Result<Args> {
    let mut pos = Vec::new();
    let (mut images, mut captions, mut clip_images, mut markdown) = (256, 2048, 32, false);
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut num = |name: &str| -> Result<usize> {
            it.next()
                .with_context(|| format!("{name} needs a number"))?
                .parse()
                .with_context(|| format!("{name} needs a number"))
        };
        match a.as_str() {
            "--images" => images = num("--images")?,
            "--captions" => captions = num("--captions")?,
            "--clip-images" => clip_images = num("--clip-images")?,
            "--markdown" => markdown = true,
            _ => pos.push(PathBuf::from(a)),
        }
    }
    let [flickr, mobilenet, minilm]: [PathBuf; 3] = pos.try_into().map_err(|_| {
        anyhow::anyhow!(
            "usage: bench_towers FLICKR8K_DIR MOBILENET.safetensors MINILM_DIR \
             [--images N] [--captions N] [--clip-images N] [--markdown]"
        )
    })?;
    Ok(Args {
        flickr,
        mobilenet,
        minilm,
        images: images.max(IMAGE_BATCH),
        captions: captions.max(TEXT_BATCH),
        clip_images: clip_images.max(1),
        markdown,
    })
}

/// Run `f` until at least `min_secs` have passed (after one warm-up call);
/// returns calls per second.
fn rate(min_secs: f64, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    let t = Instant::now();
    let mut n = 0u32;
    while n == 0 || t.elapsed().as_secs_f64() < min_secs {
        f()?;
        n += 1;
    }
    Ok(f64::from(n) / t.elapsed().as_secs_f64())
}

fn matmul_gflops(m: usize, k: usize, n: usize, dev: &Device) -> Result<f64> {
    let a = Tensor::randn(0f32, 1.0, (m, k), dev)?;
    let b = Tensor::randn(0f32, 1.0, (k, n), dev)?;
    let per_sec = rate(2.0, || {
        a.matmul(&b)?;
        Ok(())
    })?;
    Ok(per_sec * 2.0 * (m * k * n) as f64 / 1e9)
}

/// The first `n` distinct image files and the first `m` captions of
/// Flickr8k's `captions.tsv`.
fn flickr_sample(dir: &Path, n: usize, m: usize) -> Result<(Vec<PathBuf>, Vec<String>)> {
    let tsv = dir.join("captions.tsv");
    let text =
        std::fs::read_to_string(&tsv).with_context(|| format!("reading {}", tsv.display()))?;
    let (mut imgs, mut caps) = (Vec::new(), Vec::new());
    for line in text.lines().skip(1) {
        let mut f = line.splitn(3, '\t');
        let (Some(img), Some(_), Some(cap)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let p = dir.join("images").join(img);
        if imgs.len() < n && imgs.last() != Some(&p) {
            imgs.push(p);
        }
        if caps.len() < m {
            caps.push(cap.to_string());
        }
    }
    if imgs.len() < n || caps.len() < m {
        bail!(
            "{} holds fewer than {n} images or {m} captions",
            tsv.display()
        );
    }
    Ok((imgs, caps))
}

/// Decode every image on all cores (the tool decodes a batch's images in
/// parallel, then runs the tower).
fn decode_all(bytes: &[Vec<u8>], tower: &ImageTower) -> Result<Vec<Vec<f32>>> {
    let pre = tower.preprocess();
    let limits = ImageLimits::default();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chunk = bytes.len().div_ceil(threads).max(1);
    let out: Vec<std::result::Result<Vec<f32>, String>> = std::thread::scope(|s| {
        let hs: Vec<_> = bytes
            .chunks(chunk)
            .map(|c| {
                s.spawn(|| {
                    c.iter()
                        .map(|b| {
                            images::decode(
                                b,
                                &limits,
                                |w, h| pre.working_bytes(w, h),
                                |img| pre.apply_image(&img),
                            )
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        hs.into_iter()
            .flat_map(|h| h.join().unwrap_or_default())
            .collect()
    });
    out.into_iter()
        .map(|r| r.map_err(|e| anyhow::anyhow!("decoding: {e}")))
        .collect()
}

fn forward_images(tower: &ImageTower, px: &[Vec<f32>], size: usize, dev: &Device) -> Result<()> {
    for chunk in px.chunks(IMAGE_BATCH) {
        let flat: Vec<f32> = chunk.iter().flatten().copied().collect();
        let x = Tensor::from_vec(flat, (chunk.len(), 3, size, size), dev)?;
        tower.forward(&x)?;
    }
    Ok(())
}

/// FLOPs of one MiniLM-shaped encoder pass over `b` sequences of `l`
/// tokens: per layer 12·d² multiply-adds per token in the projections and
/// feed-forward (4d² + 2·d·4d) plus 2·l·d for attention scores and
/// weighted sums.
fn bert_flops(b: usize, l: usize, d: usize, layers: usize) -> f64 {
    let (b, l, d) = (b as f64, l as f64, d as f64);
    2.0 * layers as f64 * b * l * (12.0 * d * d + 2.0 * l * d)
}

/// FLOPs of one ViT pass over `b` images: patch embedding plus the encoder
/// layers on `t` tokens (same count as [`bert_flops`]).
fn vit_flops(b: usize, cfg: &ClipVisionConfig) -> f64 {
    let p = cfg.image_size / cfg.patch_size;
    let t = p * p + 1;
    let patch = 2.0 * (p * p) as f64 * (3 * cfg.patch_size * cfg.patch_size * cfg.embed_dim) as f64;
    b as f64 * patch + bert_flops(b, t, cfg.embed_dim, cfg.num_hidden_layers)
}

struct Row {
    stage: String,
    rate: f64,
    unit: &'static str,
    gflops: Option<f64>,
    /// The matmul GFLOP/s measured just before this stage: the ratio's
    /// yardstick, taken close in time so that a load that comes and goes
    /// (another build on the machine) moves both alike.
    matmul: f64,
}

fn main() -> Result<()> {
    ncclean::runtime::threads::configure();
    let a = parse_args()?;
    let dev = Device::Cpu;

    // The yardstick: large square products, as the towers' big layers.
    let mm = matmul_gflops(1024, 1024, 1024, &dev)?;
    let mm_ffn = matmul_gflops(64 * 16, 384, 1536, &dev)?;
    eprintln!("matmul: {mm:.1} GFLOP/s (1024³), {mm_ffn:.1} GFLOP/s (MiniLM FFN shape)");

    let (paths, captions) = flickr_sample(&a.flickr, a.images, a.captions)?;
    let bytes: Vec<Vec<u8>> = paths
        .iter()
        .map(|p| std::fs::read(p).with_context(|| format!("reading {}", p.display())))
        .collect::<Result<_>>()?;
    let spec = EncoderSpec {
        image: ImageEncoder::MobilenetV2,
        text: TextEncoder::Minilm,
        image_model: Some(a.mobilenet.display().to_string()),
        text_model: Some(a.minilm.display().to_string()),
        tower_dtype: TowerDtype::F32,
    };
    let image = ImageTower::load(&spec, &dev)?.context("MobileNetV2 did not load")?;
    let text = TextTower::load(&spec, &dev)?.context("MiniLM did not load")?;

    let mut rows = image_rows(&image, &bytes, mm, &dev)?;
    rows.push(text_row(&text, &captions, &dev)?);
    rows.push(clip_row(a.clip_images, &dev)?);
    print_rows(&rows, a.markdown, (mm, mm_ffn));
    Ok(())
}

/// MobileNetV2 on the JPEG `bytes`: decode alone, then the tower alone on
/// the decoded pixels, then both one after the other as fit does (`mm`:
/// the matmul yardstick measured before the decode).
fn image_rows(image: &ImageTower, bytes: &[Vec<u8>], mm: f64, dev: &Device) -> Result<Vec<Row>> {
    let threads = ncclean::runtime::threads::current();
    let size = image.preprocess().size as usize;
    let mut rows = Vec::new();
    let t = Instant::now();
    let px = decode_all(bytes, image)?;
    let decode_rate = px.len() as f64 / t.elapsed().as_secs_f64();
    rows.push(Row {
        matmul: mm,
        stage: format!(
            "JPEG decode + resize to {size}² ({} threads)",
            threads.matmul
        ),
        rate: decode_rate,
        unit: "img/s",
        gflops: None,
    });
    forward_images(image, &px[..IMAGE_BATCH], size, dev)?; // warm-up
    let mm_mn = matmul_gflops(1024, 1024, 1024, dev)?;
    let t = Instant::now();
    forward_images(image, &px, size, dev)?;
    let mn_rate = px.len() as f64 / t.elapsed().as_secs_f64();
    rows.push(Row {
        matmul: mm_mn,
        stage: "MobileNetV2 forward (batch 32)".into(),
        rate: mn_rate,
        unit: "img/s",
        gflops: Some(mn_rate * 2.0 * MOBILENET_MADDS / 1e9),
    });
    let mm_e2e = matmul_gflops(1024, 1024, 1024, dev)?;
    let t = Instant::now();
    for (bc, _) in bytes.chunks(IMAGE_BATCH).zip(0..) {
        let px = decode_all(bc, image)?;
        forward_images(image, &px, size, dev)?;
    }
    let e2e = bytes.len() as f64 / t.elapsed().as_secs_f64();
    rows.push(Row {
        matmul: mm_e2e,
        stage: "MobileNetV2 end to end from JPEG bytes".into(),
        rate: e2e,
        unit: "img/s",
        gflops: Some(e2e * 2.0 * MOBILENET_MADDS / 1e9),
    });
    Ok(rows)
}

/// MiniLM in fit's length-sorted windows; FLOPs from the padded shapes
/// actually run.
fn text_row(text: &TextTower, captions: &[String], dev: &Device) -> Result<Row> {
    let (d, layers) = (text.local_dim(), 6);
    let mut padded_flops = 0.0;
    let mut real_tokens = 0usize;
    let mut batches: Vec<Vec<&str>> = Vec::new();
    for window in captions.chunks(TEXT_WINDOW) {
        let mut w: Vec<&str> = window.iter().map(String::as_str).collect();
        w.sort_by_key(|c| c.len());
        batches.extend(w.chunks(TEXT_BATCH).map(<[&str]>::to_vec));
    }
    text.forward(&batches[0])?; // warm-up
    let mm_text = matmul_gflops(1024, 1024, 1024, dev)?;
    let t = Instant::now();
    for b in &batches {
        let out = text.forward(b)?;
        let mask = out.mask.context("MiniLM returned no mask")?;
        let (bn, l) = mask.dims2()?;
        padded_flops += bert_flops(bn, l, d, layers);
        real_tokens += mask.to_dtype(DType::F32)?.sum_all()?.to_scalar::<f32>()? as usize;
    }
    let secs = t.elapsed().as_secs_f64();
    Ok(Row {
        matmul: mm_text,
        stage: format!(
            "MiniLM, length-sorted batches of 64 ({:.1} real tokens/caption)",
            real_tokens as f64 / captions.len() as f64
        ),
        rate: captions.len() as f64 / secs,
        unit: "captions/s",
        gflops: Some(padded_flops / secs / 1e9),
    })
}

/// A CLIP ViT-B/32-shaped vision tower on at most 8 of `clip_images`
/// random images, with random weights (the cost does not depend on them).
fn clip_row(clip_images: usize, dev: &Device) -> Result<Row> {
    let cfg = ClipVisionConfig::vit_base_patch32();
    let vm = VarMap::new();
    let vit = ClipVisionTransformer::new(VarBuilder::from_varmap(&vm, DType::F32, dev), &cfg)?;
    let b = clip_images.min(8);
    let mm_clip = matmul_gflops(1024, 1024, 1024, dev)?;
    let x = Tensor::randn(0f32, 1.0, (b, 3, cfg.image_size, cfg.image_size), dev)?;
    let calls = rate(3.0, || {
        candle_core::Module::forward(&vit, &x)?;
        Ok(())
    })?;
    Ok(Row {
        matmul: mm_clip,
        stage: format!("CLIP ViT-B/32-shaped vision tower (random weights, batch {b})"),
        rate: calls * b as f64,
        unit: "img/s",
        gflops: Some(calls * vit_flops(b, &cfg) / 1e9),
    })
}

/// The table, as text or markdown; `(mm, mm_ffn)`: the matmul yardsticks
/// of the square and the MiniLM feed-forward shapes.
fn print_rows(rows: &[Row], markdown: bool, (mm, mm_ffn): (f64, f64)) {
    if markdown {
        println!(
            "| stage | throughput | GFLOP/s | matmul GFLOP/s just before | of matmul |\n|---|---|---|---|---|"
        );
    }
    for r in rows {
        let (g, ratio) = match r.gflops {
            Some(g) => (format!("{g:.1}"), format!("{:.0}%", 100.0 * g / r.matmul)),
            None => ("".into(), "".into()),
        };
        if markdown {
            println!(
                "| {} | {:.1} {} | {g} | {:.0} | {ratio} |",
                r.stage, r.rate, r.unit, r.matmul
            );
        } else {
            println!(
                "{:<70} {:>9.1} {:<10} {g:>7} {:>6.0} {ratio:>5}",
                r.stage, r.rate, r.unit, r.matmul
            );
        }
    }
    if markdown {
        println!(
            "| matmul, MiniLM feed-forward shape [1024×384]·[384×1536] | | {mm_ffn:.1} | {mm:.0} | {:.0}% |",
            100.0 * mm_ffn / mm
        );
    }
}
