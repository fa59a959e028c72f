//! Helpers shared by the end-to-end tests: run the binary, make demo data.
#![allow(dead_code)] // each test binary uses its own subset

pub mod hostile;
pub mod snapshot;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Run `ncclean` with `args`.
pub fn ncclean(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ncclean"))
        .args(args)
        .output()
        .expect("failed to start ncclean")
}

/// Run `ncclean` with `args`, assert success, return stdout.
pub fn ok(args: &[&str]) -> String {
    let out = ncclean(args);
    assert!(
        out.status.success(),
        "ncclean {args:?} failed ({:?}):\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `ncclean fit DATA --out-dir RUN` with the shortest schedule (one warm-up
/// epoch) plus `extra`: the end-to-end tests check what a run reads and
/// writes, not what it learns.
pub fn quick_fit(data: &Path, run: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "fit",
        p(data),
        "--out-dir",
        p(run),
        "--epochs",
        "1",
        "--warmup-epochs",
        "1",
    ];
    args.extend_from_slice(extra);
    ncclean(&args)
}

/// A temp path as a command-line argument.
pub fn p(path: &Path) -> &str {
    path.to_str().expect("utf-8 temp path")
}

/// `ncclean demo` with `pairs` pairs (seed 0) into `dir`.
pub fn demo(dir: &Path, pairs: usize) -> PathBuf {
    ok(&[
        "demo",
        "--out",
        p(dir),
        "--pairs",
        &pairs.to_string(),
        "--seed",
        "0",
    ]);
    dir.join("demo.parquet")
}

/// 2,000 demo pairs with 30% injected noise (corrupt seed 1).
pub fn noisy_demo(dir: &Path) -> PathBuf {
    noisy_demo_of(dir, 2000)
}

/// `pairs` demo pairs with 30% injected noise (corrupt seed 1).
pub fn noisy_demo_of(dir: &Path, pairs: usize) -> PathBuf {
    let data = demo(dir, pairs);
    let noisy = dir.join("noisy.parquet");
    ok(&[
        "corrupt",
        p(&data),
        "--rate",
        "0.3",
        "--seed",
        "1",
        "--out",
        p(&noisy),
    ]);
    noisy
}

/// `ncclean eval --json` of labels against ground truth.
pub fn eval_json(labels: &Path, truth: &Path) -> serde_json::Value {
    let out = ok(&["eval", "--labels", p(labels), "--truth", p(truth), "--json"]);
    serde_json::from_str(out.trim()).expect("eval --json prints one JSON object")
}

/// Record a checkpoint that a test edited on purpose (to reach the checks
/// behind its integrity check) as `fit` would have: its manifest, and
/// run.json's `checkpoint_sha256` where the run has one.
pub fn reseal(run: &Path) {
    let ckpt = run.join("checkpoint");
    ncclean::run::checkpoint::write_manifest(&ckpt).expect("manifest");
    let run_json = run.join("run.json");
    if run_json.is_file() {
        let mut v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&run_json).expect("run.json")).expect("json");
        v["checkpoint_sha256"] = ncclean::run::checkpoint::sha256(&ckpt)
            .expect("sha256")
            .into();
        std::fs::write(&run_json, v.to_string()).expect("rewrite run.json");
    }
}
