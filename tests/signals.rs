//! SIGINT and SIGTERM during `fit`: the process stops at a batch boundary,
//! says what was interrupted, exits 130, leaves the previous run directory
//! byte for byte as it was and no temporaries; `--resume` then finishes.
#![cfg(unix)]

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{noisy_demo_of, ok, p};

const CONFIG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/configs/demo.toml");

fn fit_args<'a>(data: &'a Path, run: &'a Path, epochs: &'a str) -> Vec<&'a str> {
    vec![
        "fit",
        p(data),
        "--out-dir",
        p(run),
        "--method",
        "esc",
        "--config",
        CONFIG,
        "--epochs",
        epochs,
    ]
}

/// Every file under `dir` with its bytes, sorted by path.
fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let path = e.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let name = path.strip_prefix(dir).unwrap().display().to_string();
                out.push((name, std::fs::read(&path).unwrap()));
            }
        }
    }
    out.sort();
    out
}

fn temporaries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp-") || n.contains(".old-"))
        .collect()
}

#[test]
fn a_signal_stops_fit_cleanly_and_keeps_the_previous_run() {
    let tmp = tempfile::tempdir().unwrap();
    let data = noisy_demo_of(tmp.path(), 300);
    let run = tmp.path().join("run");
    ok(&fit_args(&data, &run, "2"));
    let before = snapshot(&run);
    let resume = ncclean::run::dir::resume_dir(&run);

    for (sig, name) in [(libc::SIGINT, "SIGINT"), (libc::SIGTERM, "SIGTERM")] {
        // The previous round's epoch checkpoint would look like this round's.
        if resume.exists() {
            std::fs::remove_dir_all(&resume).unwrap();
        }
        let child = Command::new(env!("CARGO_BIN_EXE_ncclean"))
            .args(fit_args(&data, &run, "40"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("ncclean starts");
        // Signal once the first epoch is saved: training is under way.
        let started = Instant::now();
        while !resume.join("resume.json").exists() {
            assert!(
                started.elapsed() < Duration::from_secs(300),
                "{name}: no epoch checkpoint"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        // SAFETY: sending a signal to our own child.
        assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, sig) }, 0);
        let out = child.wait_with_output().expect("reaped");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(130), "{name}: {stderr}");
        assert!(
            stderr.contains("interrupted during epoch") && stderr.contains("--resume"),
            "{name}: {stderr}"
        );
        assert!(
            !stderr.contains("panicked") && !stderr.contains("backtrace"),
            "{name}: {stderr}"
        );
        assert!(snapshot(&run) == before, "{name}: the previous run changed");
        assert!(
            temporaries(tmp.path()).is_empty(),
            "{name}: {:?}",
            temporaries(tmp.path())
        );
        assert!(resume.join("resume.json").exists(), "{name}: epochs lost");
    }

    // The interrupted run continues and is committed whole.
    let mut args = fit_args(&data, &run, "40");
    args.push("--resume");
    ok(&args);
    let run_json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("run.json")).unwrap()).unwrap();
    assert_eq!(run_json["complete"], true);
    assert!(snapshot(&run) != before);
    assert!(!resume.exists(), "the epoch checkpoint has served");
}

/// `score --out` killed with SIGKILL leaves its temporary beside the output
/// (nothing can remove it then); the next `score --out` to the same path
/// sweeps it. It used to be named after a temporary of its own
/// (`..OUT.tmp-PID.tmp-PID`), which no sweep ever looked for (issue #34,
/// item 5).
#[test]
fn a_killed_score_leaves_a_temporary_the_next_score_removes() {
    let tmp = tempfile::tempdir().unwrap();
    // Embeddings: fast to fit, and enough of them that scoring takes a
    // while to catch it in.
    let raw = tmp.path().join("raw");
    ok(&[
        "demo",
        "--out",
        p(&raw),
        "--pairs",
        "40000",
        "--embedding-dim",
        "64",
    ]);
    let data = raw.join("demo.parquet");
    let run = tmp.path().join("run");
    let fitted = common::quick_fit(&data, &run, &["--method", "vanilla"]);
    assert!(
        fitted.status.success(),
        "{}",
        String::from_utf8_lossy(&fitted.stderr)
    );
    let outs = tmp.path().join("outs");
    std::fs::create_dir(&outs).unwrap();
    let labels = outs.join("labels.parquet");
    let args = [
        "score",
        p(&data),
        "--checkpoint",
        p(&run),
        "--out",
        p(&labels),
    ];
    let mut child = Command::new(env!("CARGO_BIN_EXE_ncclean"))
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("ncclean starts");
    let started = Instant::now();
    while temporaries(&outs).is_empty() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "score ended before its labels were started"
        );
        assert!(started.elapsed() < Duration::from_secs(300), "no temporary");
        std::thread::sleep(Duration::from_millis(1));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let left = temporaries(&outs);
    assert!(!left.is_empty() && !labels.exists(), "{left:?}");
    assert!(
        left.iter().all(|n| !n.starts_with("..")),
        "a temporary of a temporary: {left:?}"
    );
    ok(&args);
    assert!(labels.is_file());
    assert_eq!(temporaries(&outs), Vec::<String>::new());
}

/// `corrupt` stops at the first SIGINT (exit 130, no output, no temporary);
/// it used to carry on and write its output (issue #34, item 10).
#[test]
fn corrupt_stops_at_the_first_sigint() {
    let tmp = tempfile::tempdir().unwrap();
    let raw = tmp.path().join("raw");
    ok(&[
        "demo",
        "--out",
        p(&raw),
        "--pairs",
        "100000",
        "--embedding-dim",
        "128",
    ]);
    let outs = tmp.path().join("outs");
    std::fs::create_dir(&outs).unwrap();
    let out = outs.join("noisy.parquet");
    let mut child = Command::new(env!("CARGO_BIN_EXE_ncclean"))
        .args([
            "corrupt",
            p(&raw.join("demo.parquet")),
            "--rate",
            "0.3",
            "--out",
            p(&out),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ncclean starts");
    // Signalled once it writes: the whole table is read by then.
    let started = Instant::now();
    while temporaries(&outs).is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "no output started"
        );
        assert!(child.try_wait().unwrap().is_none(), "corrupt ended first");
        std::thread::sleep(Duration::from_millis(1));
    }
    // SAFETY: sending a signal to our own child.
    assert_eq!(
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) },
        0
    );
    let done = child.wait_with_output().expect("reaped");
    let stderr = String::from_utf8_lossy(&done.stderr);
    assert_eq!(done.status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");
    assert!(!out.exists());
    assert_eq!(temporaries(&outs), Vec::<String>::new());
}
