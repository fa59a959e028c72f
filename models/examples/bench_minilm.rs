//! MiniLM captions/s, the fused CPU encoder against candle-transformers'
//! BERT, interleaved in one process (issue #35), and how far apart their
//! pooled embeddings are.
//!
//! Batches as `fit` and `bench_towers` make them: windows of 512 captions
//! sorted by byte length, cut into batches of 64. Each repetition times one
//! pass over every caption with each backend in turn (A B A B ...), so a
//! load that comes and goes on the machine moves both alike.
//!
//! ```text
//! cargo run --release -p ncclean-models --example bench_minilm -- \
//!     MINILM_DIR CAPTIONS.txt [--captions 2000] [--reps 3] [--backends fused,candle]
//! ```
//!
//! CAPTIONS is one caption per line, or a `captions.tsv` (third column).
//! Threads as the ncclean binary sets them (`CANDLE_NUM_THREADS=1`,
//! `RAYON_NUM_THREADS` = candle's count) unless the environment names them.

use std::path::PathBuf;
use std::time::Instant;

use candle_core::{Device, Result};
use ncclean_models::bert_text::{BertBackend, BertTextTower, DEFAULT_MAX_LEN};

const BATCH: usize = 64;
const WINDOW: usize = 8 * BATCH;

fn main() -> Result<()> {
    if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
        std::env::set_var("CANDLE_NUM_THREADS", "1");
    }
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        let n = candle_core::utils::get_num_threads();
        std::env::set_var("RAYON_NUM_THREADS", n.to_string());
    }
    let mut pos = Vec::new();
    let (mut n_caps, mut reps, mut backends) = (2000usize, 3usize, "fused,candle".to_string());
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut val = || it.next().unwrap_or_default();
        match a.as_str() {
            "--captions" => n_caps = val().parse().expect("--captions N"),
            "--reps" => reps = val().parse().expect("--reps N"),
            "--backends" => backends = val(),
            _ => pos.push(PathBuf::from(a)),
        }
    }
    let [dir, caps_path]: [PathBuf; 2] = pos.try_into().map_err(|_| {
        candle_core::Error::Msg(
            "usage: bench_minilm MINILM_DIR CAPTIONS [--captions N] [--reps N] [--backends fused,candle]"
                .into(),
        )
    })?;
    let text = std::fs::read_to_string(&caps_path)?;
    let tsv = caps_path.extension().is_some_and(|e| e == "tsv");
    let captions: Vec<&str> = if tsv {
        text.lines()
            .skip(1)
            .filter_map(|l| l.splitn(3, '\t').nth(2))
            .take(n_caps)
            .collect()
    } else {
        text.lines()
            .filter(|l| !l.is_empty())
            .take(n_caps)
            .collect()
    };
    let mut batches: Vec<Vec<&str>> = Vec::new();
    for window in captions.chunks(WINDOW) {
        let mut w = window.to_vec();
        w.sort_by_key(|c| c.len());
        batches.extend(w.chunks(BATCH).map(<[&str]>::to_vec));
    }

    let dev = Device::Cpu;
    let mut towers = Vec::new();
    for name in backends.split(',') {
        let backend = match name {
            "fused" => BertBackend::Auto,
            "candle" => BertBackend::Candle,
            other => candle_core::bail!("unknown backend {other} (fused or candle)"),
        };
        let t = BertTextTower::load_with_backend(&dir, &dev, DEFAULT_MAX_LEN, backend)?;
        t.forward(&batches[0])?; // warm-up
        towers.push((name, t));
    }
    println!(
        "{} captions, {} batches of <= {BATCH}, threads: RAYON_NUM_THREADS={} CANDLE_NUM_THREADS={}",
        captions.len(),
        batches.len(),
        std::env::var("RAYON_NUM_THREADS").unwrap_or_default(),
        std::env::var("CANDLE_NUM_THREADS").unwrap_or_default()
    );
    let mut pooled: Vec<Vec<Vec<f32>>> = vec![Vec::new(); towers.len()];
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); towers.len()];
    for rep in 0..reps {
        for (k, (name, tower)) in towers.iter().enumerate() {
            let t = Instant::now();
            let mut out = Vec::new();
            for b in &batches {
                out.extend(tower.forward(b)?.pooled.to_vec2::<f32>()?);
            }
            let r = captions.len() as f64 / t.elapsed().as_secs_f64();
            println!("rep {rep} {name:<7} {r:7.1} captions/s");
            rates[k].push(r);
            pooled[k] = out;
        }
    }
    for (k, (name, _)) in towers.iter().enumerate() {
        let r: Vec<String> = rates[k].iter().map(|r| format!("{r:.0}")).collect();
        println!("{name:<7} captions/s: {}", r.join(" "));
    }
    // Pooled embeddings against the first backend's: 1 - cosine.
    for k in 1..towers.len() {
        let mut worst = 0f64;
        for (a, b) in pooled[0].iter().zip(&pooled[k]) {
            let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
            let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
            let nb: f64 = b.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
            worst = worst.max(1.0 - dot / (na * nb));
        }
        println!(
            "max (1 - cosine) of pooled embeddings, {} vs {}: {worst:.2e}",
            towers[k].0, towers[0].0
        );
    }
    Ok(())
}
