//! Checkpoint integrity (issue #34, item 4): `score` refuses a checkpoint
//! whose files differ from what `fit` wrote (a changed weight, a zeroed
//! network, a cut vocabulary, an edited cut), exit 3 naming the file,
//! instead of labelling with it; a vocabulary larger than the model and a
//! cut outside [0, 1] are refused even when recorded as written; and
//! `fit --resume` checks its epoch checkpoint the same way.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::{noisy_demo_of, ok, p, reseal};

/// `fit` (vanilla, 3 epochs) of `data` into `run`.
fn fit(data: &Path, run: &Path) {
    ok(&[
        "fit",
        p(data),
        "--out-dir",
        p(run),
        "--method",
        "vanilla",
        "--epochs",
        "3",
        "--warmup-epochs",
        "1",
    ]);
}

fn score(data: &Path, run: &Path, out: &Path) -> Output {
    common::ncclean(&["score", p(data), "--checkpoint", p(run), "--out", p(out)])
}

/// Assert that `out` is a refusal (exit 3) naming `file`, with `says`.
fn refused(out: &Output, file: &Path, says: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains(p(file)), "names {}: {err}", file.display());
    assert!(err.contains(says), "says {says:?}: {err}");
    assert!(
        !err.contains("panicked") && !err.contains("index-select"),
        "{err}"
    );
}

/// The weights files of a checkpoint.
fn weights(ckpt: &Path) -> Vec<PathBuf> {
    let mut w: Vec<PathBuf> = std::fs::read_dir(ckpt)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.extension().is_some_and(|e| e == "safetensors")
                && p.file_name().is_some_and(|n| n != "pairs.safetensors")
        })
        .collect();
    w.sort();
    w
}

/// Flip the low bit of the byte `from_end` bytes before the end of `path`
/// (safetensors keep their header first: the end is tensor data).
fn flip(path: &Path, from_end: usize) {
    let mut bytes = std::fs::read(path).unwrap();
    let at = bytes.len() - from_end;
    bytes[at] ^= 1;
    std::fs::write(path, bytes).unwrap();
}

/// Edit the JSON file `path` with `edit`.
fn edit_json(path: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(path, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
}

#[test]
fn score_refuses_a_checkpoint_changed_after_fit_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let data = noisy_demo_of(tmp.path(), 300);
    let run = tmp.path().join("run");
    fit(&data, &run);
    let ckpt = run.join("checkpoint");
    let saved = tmp.path().join("saved");
    copy_dir(&ckpt, &saved);
    let restore = || {
        std::fs::remove_dir_all(&ckpt).unwrap();
        copy_dir(&saved, &ckpt);
    };
    let out = tmp.path().join("labels.parquet");
    assert_eq!(score(&data, &run, &out).status.code(), Some(0));
    std::fs::remove_file(&out).unwrap();

    // One changed weight.
    let net = weights(&ckpt).remove(0);
    flip(&net, 5);
    refused(
        &score(&data, &run, &out),
        &net,
        "its content differs from when it was written",
    );
    restore();

    // A zeroed network: every tensor byte 0, same size.
    let bytes = std::fs::read(&net).unwrap();
    let header = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut zeroed = bytes.clone();
    zeroed[header..].fill(0);
    std::fs::write(&net, &zeroed).unwrap();
    refused(&score(&data, &run, &out), &net, "differs");
    restore();

    // A cut vocabulary.
    let state = ckpt.join("state.json");
    edit_json(&state, |s| {
        let words = s["vocab"]["words"].as_array_mut().expect("a vocabulary");
        words.truncate(words.len() / 2);
    });
    refused(&score(&data, &run, &out), &state, "bytes");
    restore();

    // A cut that keeps everything.
    let threshold = ckpt.join("threshold.json");
    edit_json(&threshold, |t| t["cut"]["min_prob"] = (-5.0).into());
    refused(&score(&data, &run, &out), &threshold, "changed or damaged");
    // Recorded as if fit had written it, it is still no cut.
    reseal(&run);
    refused(
        &score(&data, &run, &out),
        &threshold,
        "min_prob -5 is not a cut",
    );
    restore();
    reseal(&run);

    // A vocabulary larger than the model, recorded as written: refused
    // before scoring, not with the model's raw index error.
    edit_json(&state, |s| {
        let words = s["vocab"]["words"].as_array_mut().expect("a vocabulary");
        for i in 0..50 {
            words.push(format!("extra{i}").into());
        }
    });
    reseal(&run);
    refused(&score(&data, &run, &out), &state, "vocabulary holds");
    restore();
    reseal(&run);

    // Without its manifest, run.json's checkpoint_sha256 still tells.
    std::fs::remove_file(ckpt.join(ncclean::run::checkpoint::MANIFEST_FILE)).unwrap();
    flip(&net, 5);
    refused(
        &score(&data, &run, &out),
        &ckpt,
        "differs from the checkpoint_sha256",
    );
    restore();
    reseal(&run);

    // A file added to the checkpoint.
    std::fs::write(ckpt.join("extra.safetensors"), b"x").unwrap();
    refused(
        &score(&data, &run, &out),
        &ckpt.join("extra.safetensors"),
        "is not one of the files",
    );
    assert!(!out.exists(), "no labels from a refused checkpoint");
    restore();
    reseal(&run);
    assert_eq!(score(&data, &run, &out).status.code(), Some(0));
}

#[cfg(unix)]
#[test]
fn fit_resume_refuses_a_damaged_epoch_checkpoint() {
    use std::time::{Duration, Instant};
    let tmp = tempfile::tempdir().unwrap();
    let data = noisy_demo_of(tmp.path(), 300);
    let run = tmp.path().join("run");
    let args = [
        "fit",
        p(&data),
        "--out-dir",
        p(&run),
        "--method",
        "vanilla",
        "--epochs",
        "400",
        "--warmup-epochs",
        "1",
    ];
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ncclean"))
        .args(args)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let resume = ncclean::run::dir::resume_dir(&run);
    let started = Instant::now();
    while !resume.join("resume.json").exists() {
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "no epoch checkpoint"
        );
        assert!(child.try_wait().unwrap().is_none(), "fit ended early");
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    // One bit of the optimiser's moments: resumed, the run would differ
    // from an uninterrupted one without a word.
    let optimizer = resume.join("optimizer.safetensors");
    assert!(optimizer.is_file());
    flip(&optimizer, 3);
    let mut again = args.to_vec();
    again.push("--resume");
    refused(
        &common::ncclean(&again),
        &optimizer,
        "drop --resume to train from the first epoch",
    );
    assert!(!run.exists(), "no run from a damaged epoch checkpoint");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}
