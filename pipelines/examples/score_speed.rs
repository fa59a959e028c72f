//! Scoring throughput of each method on Flickr8k-shaped
//! synthetic features (issue #10): 6,000 images with five captions each,
//! MobileNetV2-wide (1,280) image vectors, MiniLM-wide (384) caption
//! vectors (and, for ReCon, 7×7 grids of 1,280 and 10–20 tokens of 384 as
//! local features), the methods' presets with freshly initialised networks. Times
//! `Pipeline::score` (the pass fit ends with), without reading any files,
//! so a profiler sees the scoring code alone. Prints wall time and the
//! process's CPU seconds per pass (steadier than wall time on a shared
//! machine).
//!
//! `cargo build --release --workspace --example score_speed &&
//! target/release/examples/score_speed [METHOD...] [--pairs N] [--repeat R]`
//! (default: vanilla esc gsc crcl, 30,000 pairs, 3 repeats).

use std::time::Instant;

use candle_core::Device;
use candle_core::{DType, Tensor};
use ncclean_models::rng::Rng;
use ncclean_models::{
    ImageInputs, ImageTowerConfig, LocalFeatures, PairInputs, TextInputs, TextTowerConfig,
};
use ncclean_pipelines::presets::{model_config, resolve};
use ncclean_pipelines::Silent;

/// User + system CPU seconds of this process so far (Linux; 0 elsewhere):
/// on a shared machine a steadier measure of the work than wall time.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which may hold spaces) start at state.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = rest
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    // utime and stime are fields 14 and 15 of the whole line, in clock ticks.
    f.get(10)
        .zip(f.get(11))
        .map_or(0.0, |(u, s)| (u + s) / 100.0)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The thread settings of the ncclean binary (src/runtime/threads.rs), unless
    // the environment names its own.
    if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
        std::env::set_var("CANDLE_NUM_THREADS", "1");
    }
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        let n = candle_core::utils::get_num_threads();
        std::env::set_var("RAYON_NUM_THREADS", n.to_string());
    }
    let mut methods = Vec::new();
    let (mut pairs, mut repeat) = (30_000usize, 3usize);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--pairs" => pairs = args.next().ok_or("--pairs needs a number")?.parse()?,
            "--repeat" => repeat = args.next().ok_or("--repeat needs a number")?.parse()?,
            m => methods.push(m.to_string()),
        }
    }
    if methods.is_empty() {
        methods = ["vanilla", "esc", "gsc", "crcl"].map(String::from).into();
    }
    let (di, dt, captions) = (1280, 384, 5);
    let mut rng = Rng::new(0);
    let images = pairs.div_ceil(captions);
    let distinct: Vec<f32> = (0..images * di)
        .map(|_| rng.normal().abs() as f32)
        .collect();
    // Consecutive captions share an image, as in Flickr8k.
    let image_data: Vec<f32> = (0..pairs)
        .flat_map(|i| distinct[(i / captions) * di..(i / captions + 1) * di].to_vec())
        .collect();
    let text_data: Vec<f32> = (0..pairs * dt).map(|_| rng.normal() as f32).collect();
    // ReCon reads local features: a 7×7 grid per image, 10–20 tokens per
    // caption (f16, as the feature cache stores them).
    let mut local = |sets: usize, len: &dyn Fn(usize) -> usize, dim: usize, index: Vec<u32>| {
        let mut offsets = vec![0];
        for k in 0..sets {
            offsets.push(offsets[k] + len(k));
        }
        let values: Vec<f32> = (0..offsets[sets] * dim)
            .map(|_| rng.normal().abs() as f32)
            .collect();
        let n = values.len();
        let data = Tensor::from_vec(values, n, &Device::Cpu)?
            .to_dtype(DType::F16)?
            .to_vec1()?;
        Ok::<_, candle_core::Error>(LocalFeatures {
            dim,
            data,
            offsets,
            index,
        })
    };
    let wants_local = methods.iter().any(|m| m == "recon");
    let (image_local, text_local) = if wants_local {
        let of_image = (0..pairs).map(|i| (i / captions) as u32).collect();
        (
            Some(local(images, &|_| 49, di, of_image)?),
            Some(local(
                pairs,
                &|k| 10 + k % 11,
                dt,
                (0..pairs as u32).collect(),
            )?),
        )
    } else {
        (None, None)
    };
    let data = PairInputs {
        images: ImageInputs::Embeddings {
            data: image_data,
            dim: di,
            local: image_local,
        },
        texts: TextInputs::Embeddings {
            data: text_data,
            dim: dt,
            local: text_local,
        },
    };
    let local_dim = |d: usize| wants_local.then_some(d);
    for m in &methods {
        let cfg = resolve(m, None, &toml::Table::new())?;
        let model = model_config(
            m,
            &cfg,
            ImageTowerConfig::Precomputed {
                dim: di,
                local_dim: local_dim(di),
            },
            TextTowerConfig::Precomputed {
                dim: dt,
                local_dim: local_dim(dt),
            },
        );
        let p = ncclean_pipelines::build(m, cfg, &model, 0, &Device::Cpu)?;
        for _ in 0..repeat {
            let (t, cpu) = (Instant::now(), cpu_seconds());
            let s = p.score(&data, &[pairs], true, &mut Silent)?;
            let secs = t.elapsed().as_secs_f64();
            println!(
                "{m}: {pairs} pairs in {secs:.3} s = {:.0} pairs/s, {:.3} CPU s (clean_prob[0] {:.6})",
                pairs as f64 / secs,
                cpu_seconds() - cpu,
                s.clean_prob[0]
            );
        }
    }
    Ok(())
}
