//! `fit --resume` after a SIGKILL: for every method, a run killed at an
//! arbitrary batch of an arbitrary epoch (after its first epoch checkpoint)
//! and resumed gives the same labels as a run that was never interrupted.

mod common;

use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{demo, noisy_demo_of, ok, p};
use ncclean::data::read_labels;

fn fit_args<'a>(data: &'a Path, run: &'a Path, method: &'a str, config: &'a str) -> Vec<&'a str> {
    vec![
        "fit",
        p(data),
        "--out-dir",
        p(run),
        "--method",
        method,
        "--seed",
        "3",
        "--config",
        config,
    ]
}

/// Start `ncclean ARGS` and return once it has written the first epoch
/// checkpoint under `run` (or has exited).
fn spawn_until_checkpoint(args: &[&str], run: &Path) -> Child {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ncclean"))
        .args(args)
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("ncclean starts");
    let marker = ncclean::run::dir::resume_dir(run).join("resume.json");
    let started = Instant::now();
    while !marker.exists() && started.elapsed() < Duration::from_secs(300) {
        if child.try_wait().expect("poll").is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    child
}

fn labels(run: &Path) -> Vec<(Option<f32>, Option<f32>, Option<f32>)> {
    let (rows, _) = read_labels(&run.join("labels.parquet")).expect("labels written");
    rows.iter()
        .map(|r| (r.clean_prob, r.soft_label, r.similarity))
        .collect()
}

#[test]
fn a_killed_fit_resumes_to_the_same_labels_for_every_method() {
    let tmp = tempfile::tempdir().unwrap();
    let noisy = noisy_demo_of(tmp.path(), 400);
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/configs/demo.toml");
    let entropy = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    for (i, method) in ["vanilla", "esc", "gsc", "crcl", "recon"]
        .into_iter()
        .enumerate()
    {
        let whole = tmp.path().join(format!("{method}-whole"));
        ok(&fit_args(&noisy, &whole, method, config));

        let run = tmp.path().join(format!("{method}-killed"));
        // Kill at an arbitrary moment of a later epoch (up to ~0.3 s after
        // the first epoch checkpoint).
        let mut child = spawn_until_checkpoint(&fit_args(&noisy, &run, method, config), &run);
        let delay = u64::from(entropy.rotate_left(7 * i as u32) % 300);
        std::thread::sleep(Duration::from_millis(delay));
        let finished = child.try_wait().expect("poll").is_some();
        child.kill().ok(); // SIGKILL on Unix
        child.wait().expect("reaped");
        eprintln!("{method}: killed {delay} ms after the first epoch checkpoint (finished first: {finished})");
        let mut args = fit_args(&noisy, &run, method, config);
        args.push("--resume");
        ok(&args);
        assert_eq!(
            labels(&run),
            labels(&whole),
            "{method}: resumed labels differ"
        );
        // The killed process's staging directory is swept, the epoch
        // checkpoint removed: only the two runs and the data remain.
        let mut left: Vec<String> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(&format!(".{method}-")))
            .collect();
        left.sort();
        assert!(left.is_empty(), "{method}: left behind {left:?}");
    }
}

#[test]
fn resume_refuses_a_different_command() {
    let tmp = tempfile::tempdir().unwrap();
    let data = demo(tmp.path(), 60);
    let run = tmp.path().join("r");
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/configs/demo.toml");
    // Leave an epoch checkpoint behind, as a killed run does.
    let mut args = fit_args(&data, &run, "vanilla", config);
    args.extend(["--epochs", "40"]);
    let mut child = spawn_until_checkpoint(&args, &run);
    child.kill().ok();
    child.wait().expect("reaped");
    let args = [
        "fit",
        p(&data),
        "--out-dir",
        p(&run),
        "--method",
        "vanilla",
        "--config",
        config,
        "--epochs",
        "40",
        "--seed",
        "4",
        "--resume",
    ];
    let out = common::ncclean(&args);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("differs from this command (seed)"), "{err}");
}
