//! Where a `vanilla` training step's time goes (issue #35 item 3), on
//! Flickr8k-shaped synthetic features: MobileNetV2-wide (1,280) image
//! vectors, MiniLM-wide (384) caption vectors, the vanilla preset's head
//! (hidden 256, joint 128) and batches of 128. Times, per step, alternating
//! in rounds so that a shared machine's load falls on all of them alike:
//!
//! - `autograd`: the loss tensor, `loss.backward()`, the clip and Adam as
//!   tensor ops (`Net::step`, the path before the fused step);
//! - `fused`: the fused CPU step (`Net::fused_step`);
//! - the matrix products of the fused step alone (`host::matmul`,
//!   same shapes, on the pool's threads as there), the floor of `fused`,
//!   and the same on one thread (what the second core adds).
//!
//! Prints milliseconds per step (median over the rounds). A profiling aid, not a test: the speed target is measured on
//! real runs by examples/bench_train_speed.sh.
//!
//! `cargo build --release -p ncclean-pipelines --example head_step &&
//! $CARGO_TARGET_DIR/release/examples/head_step [--steps N] [--rounds R] [--soft]`
//! (default 50 steps, 5 rounds, the warm-up loss; `--soft` the training loss).

use std::time::Instant;

use candle_core::{Device, Tensor};
use ncclean_models::rng::Rng;
use ncclean_models::{
    ImageInputs, ImageTowerConfig, LocalOptions, ModelConfig, PairInputs, TextInputs,
    TextTowerConfig,
};
use ncclean_pipelines::fused_head::HeadLoss;
use ncclean_pipelines::host::{matmul, View};
use ncclean_pipelines::losses::{ncr_soft_margin_hinge, per_sample_hinge};
use ncclean_pipelines::net::Net;

const DI: usize = 1280;
const DT: usize = 384;
const HIDDEN: usize = 256;
const JOINT: usize = 128;
const BATCH: usize = 128;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The products of one fused step, on buffers of its shapes.
fn products(threads: usize, bufs: &mut [Vec<f32>; 4]) {
    let [x, w, out, small] = bufs;
    for d in [DI, DT] {
        let xv = View::rows(&x[..BATCH * d], BATCH, d);
        // forward: X·[W1; Wl]ᵀ (the step stacks them at these widths), H·W2ᵀ
        let stacked = HIDDEN + JOINT;
        matmul(
            &mut out[..BATCH * stacked],
            xv,
            View::rows(&w[..stacked * d], stacked, d).t(),
            true,
            threads,
        );
        matmul(
            &mut small[..BATCH * JOINT],
            View::rows(&x[..BATCH * HIDDEN], BATCH, HIDDEN),
            View::rows(&w[..JOINT * HIDDEN], JOINT, HIDDEN).t(),
            true,
            threads,
        );
        // backward: ∂W2 = ∂Zᵀ·H, ∂A = ∂Z·W2, ∂Wl = ∂Zᵀ·X, ∂W1 = ∂Aᵀ·X
        let dz = View::rows(&x[..BATCH * JOINT], BATCH, JOINT);
        matmul(
            &mut out[..JOINT * HIDDEN],
            dz.t(),
            View::rows(&w[..BATCH * HIDDEN], BATCH, HIDDEN),
            false,
            threads,
        );
        matmul(
            &mut small[..BATCH * HIDDEN],
            dz,
            View::rows(&w[..JOINT * HIDDEN], JOINT, HIDDEN),
            false,
            threads,
        );
        matmul(&mut out[..JOINT * d], dz.t(), xv, false, threads);
        let da = View::rows(&w[..BATCH * HIDDEN], BATCH, HIDDEN);
        matmul(&mut out[..HIDDEN * d], da.t(), xv, false, threads);
    }
    // S = Vi·Vtᵀ, ∂Vi = G·Vt, ∂Vt = Gᵀ·Vi
    let v = View::rows(&x[..BATCH * JOINT], BATCH, JOINT);
    matmul(&mut small[..BATCH * BATCH], v, v.t(), false, threads);
    let g = View::rows(&w[..BATCH * BATCH], BATCH, BATCH);
    matmul(&mut out[..BATCH * JOINT], g, v, false, threads);
    matmul(&mut small[..BATCH * JOINT], g.t(), v, false, threads);
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The ncclean binary's thread settings (src/runtime/threads.rs).
    if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
        std::env::set_var("CANDLE_NUM_THREADS", "1");
    }
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        let n = candle_core::utils::get_num_threads();
        std::env::set_var("RAYON_NUM_THREADS", n.to_string());
    }
    let (mut steps, mut rounds, mut soft, mut fused_only) = (50usize, 5usize, false, false);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--steps" => steps = args.next().ok_or("--steps needs a number")?.parse()?,
            "--rounds" => rounds = args.next().ok_or("--rounds needs a number")?.parse()?,
            "--soft" => soft = true,
            "--fused-only" => fused_only = true,
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let n = 6_000;
    let mut rng = Rng::new(1);
    let mut vec = |k: usize, scale: f64| {
        (0..k)
            .map(|_| (rng.normal() * scale) as f32)
            .collect::<Vec<_>>()
    };
    let data = PairInputs {
        images: ImageInputs::Embeddings {
            data: vec(n * DI, 0.7),
            dim: DI,
            local: None,
        },
        texts: TextInputs::Embeddings {
            data: vec(n * DT, 0.3),
            dim: DT,
            local: None,
        },
    };
    let labels: Vec<f32> = vec(n, 1.0)
        .iter()
        .map(|x| 1.0 / (1.0 + (-x).exp()))
        .collect();
    let config = ModelConfig {
        image: ImageTowerConfig::Precomputed {
            dim: DI,
            local_dim: None,
        },
        text: TextTowerConfig::Precomputed {
            dim: DT,
            local_dim: None,
        },
        joint_dim: JOINT,
        hidden: HIDDEN,
        head: LocalOptions::default(),
    };
    let dev = Device::Cpu;
    let mut autograd = Net::new(&config, 0, &dev, 1e-3, 2.0)?;
    autograd.set_fused(false);
    let mut fused = Net::new(&config, 0, &dev, 1e-3, 2.0)?;
    let threads = candle_core::utils::get_num_threads();
    let mut bufs = [
        vec![0.5f32; BATCH * DI],
        vec![0.25f32; HIDDEN * DI],
        vec![0f32; HIDDEN * DI],
        vec![0f32; BATCH * HIDDEN],
    ];
    let mut order = Rng::new(2);
    let batches: Vec<Vec<usize>> = (0..steps)
        .map(|_| order.permutation(n)[..BATCH].to_vec())
        .collect();
    let loss_of = |idx: &[usize]| {
        if soft {
            HeadLoss::NcrSoftMarginHinge {
                labels: idx.iter().map(|&i| labels[i]).collect(),
                alpha: 0.2,
                m: 10.0,
            }
        } else {
            HeadLoss::PerSampleHinge { margin: 0.2 }
        }
    };
    let (mut ta, mut tf, mut tp, mut t1) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    if fused_only {
        // For a profiler: the fused step alone.
        let t = Instant::now();
        for _ in 0..rounds {
            for idx in &batches {
                fused.fused_step(&data, idx, &loss_of(idx))?;
            }
        }
        let ms = t.elapsed().as_secs_f64() * 1e3 / (rounds * steps) as f64;
        println!("fused {ms:.2} ms/step");
        return Ok(());
    }
    for _ in 0..rounds {
        let t = Instant::now();
        for idx in &batches {
            let s = autograd.batch_similarity(&data, idx)?;
            let l = match loss_of(idx) {
                HeadLoss::PerSampleHinge { margin } => per_sample_hinge(&s, margin)?.mean_all()?,
                HeadLoss::NcrSoftMarginHinge { labels, alpha, m } => {
                    let y = Tensor::new(labels.as_slice(), &dev)?;
                    ncr_soft_margin_hinge(&s, &y, alpha, m)?.mean_all()?
                }
            };
            autograd.step(&l)?;
        }
        ta.push(t.elapsed().as_secs_f64() * 1e3 / steps as f64);
        let t = Instant::now();
        for idx in &batches {
            fused.fused_step(&data, idx, &loss_of(idx))?;
        }
        tf.push(t.elapsed().as_secs_f64() * 1e3 / steps as f64);

        // On rayon's pool, as the fused step runs them.
        let t = Instant::now();
        rayon::join(
            || {
                for _ in 0..steps {
                    products(threads, &mut bufs);
                }
            },
            || (),
        );
        tp.push(t.elapsed().as_secs_f64() * 1e3 / steps as f64);
        let t = Instant::now();
        for _ in 0..steps {
            products(1, &mut bufs);
        }
        t1.push(t.elapsed().as_secs_f64() * 1e3 / steps as f64);
    }
    println!(
        "ms/step (median of {rounds} rounds of {steps}, {threads} product threads, {} loss): autograd {:.2}, fused {:.2}, its products alone {:.2} ({:.2} on one thread)",
        if soft { "training" } else { "warm-up" },
        median(ta),
        median(tf),
        median(tp),
        median(t1)
    );
    Ok(())
}
