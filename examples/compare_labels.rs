//! Compare the per-pair outputs of two sets of `labels.parquet` files.
//!
//! Usage: cargo run --example compare_labels -- DIR_A DIR_B [NAME...]
//!
//! For every `NAME` (default: every `*.parquet` under DIR_A) reads
//! `DIR_A/NAME` and `DIR_B/NAME` and prints, per file, the largest absolute
//! difference of `clean_prob`, `soft_label` and `similarity` over all rows,
//! and whether keys, statuses and `is_clean` agree. Exits 1 when any file
//! differs (any |Δ| > 0 or any disagreement), 0 when all are identical.
//! `scripts/compare_runs.sh` produces such directories.
//!
//! A second `clean_prob` column covers only the rows whose DIR_A value lies
//! in [1e-30, 0.999], where the written value is the mixture's posterior
//! itself (beyond, `Division::exported_clean_prob` writes order-kept
//! tails): a change to the tails alone reads 0 there.

use std::path::{Path, PathBuf};

use ncclean::data::{read_labels, LabelRow};

/// Largest |f(x) − f(y)| over row pairs.
fn max_abs<'a>(
    pairs: impl Iterator<Item = (&'a LabelRow, &'a LabelRow)>,
    f: impl Fn(&LabelRow) -> Option<f32>,
) -> f64 {
    pairs
        .map(|(x, y)| match (f(x), f(y)) {
            (Some(p), Some(q)) if p.is_nan() && q.is_nan() => 0.0,
            (Some(p), Some(q)) => (f64::from(p) - f64::from(q)).abs(),
            (None, None) => 0.0,
            _ => f64::INFINITY,
        })
        .fold(0.0, f64::max)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 2 {
        eprintln!("usage: compare_labels DIR_A DIR_B [NAME...]");
        std::process::exit(2);
    }
    let (a_dir, b_dir) = (PathBuf::from(&args[0]), PathBuf::from(&args[1]));
    let mut names: Vec<String> = args[2..].to_vec();
    if names.is_empty() {
        let mut found: Vec<String> = std::fs::read_dir(&a_dir)
            .unwrap_or_else(|e| {
                eprintln!("cannot list {}: {e}", a_dir.display());
                std::process::exit(2)
            })
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".parquet"))
            .collect();
        found.sort();
        names = found;
    }
    let read = |p: &Path| {
        read_labels(p).unwrap_or_else(|e| {
            eprintln!("cannot read {}: {e}", p.display());
            std::process::exit(2)
        })
    };
    let mut differs = false;
    println!("| file | rows | max |Δ| clean_prob | … in [1e-30, 0.999] | max |Δ| soft_label | max |Δ| similarity | keys, status, is_clean |");
    println!("|---|---|---|---|---|---|---|");
    for n in &names {
        let (a, _) = read(&a_dir.join(n));
        let (b, _) = read(&b_dir.join(n));
        let same_rows = a.len() == b.len()
            && a.iter()
                .zip(&b)
                .all(|(x, y)| x.key == y.key && x.status == y.status && x.is_clean == y.is_clean);
        let rows = || a.iter().zip(&b);
        let in_band = |x: &LabelRow| x.clean_prob.is_some_and(|p| (1e-30..=0.999).contains(&p));
        let dc = max_abs(rows(), |r| r.clean_prob);
        let dc_band = max_abs(rows().filter(|(x, _)| in_band(x)), |r| r.clean_prob);
        let ds = max_abs(rows(), |r| r.soft_label);
        let dm = max_abs(rows(), |r| r.similarity);
        differs |= !same_rows || dc > 0.0 || ds > 0.0 || dm > 0.0;
        println!(
            "| {n} | {} | {dc:e} | {dc_band:e} | {ds:e} | {dm:e} | {} |",
            a.len(),
            if same_rows { "same" } else { "DIFFER" }
        );
    }
    if differs {
        println!("result: outputs differ");
        std::process::exit(1);
    }
    println!("result: identical (max |Δ| = 0)");
}
