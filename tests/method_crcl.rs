//! End-to-end test of `--method crcl` on demo data: fit, eval, score.

mod common;

use common::{demo, eval_json, ncclean, noisy_demo, ok, p};
use ncclean::data::read_labels;

#[test]
fn crcl_detects_injected_noise_and_score_reproduces_fit() {
    let tmp = tempfile::tempdir().unwrap();
    let noisy = noisy_demo(tmp.path());
    let run = tmp.path().join("run");
    // An affordable schedule for the from-scratch demo CNN: two self-refining
    // pieces of 1 and 4 epochs, each after a 1-epoch label freeze (7 epochs),
    // lr 3e-3 dropped ×0.1 three epochs into the last piece. The paper's
    // [5, 5, 5, 30] + 2 at lr 5e-4 is the preset.
    ok(&[
        "fit",
        p(&noisy),
        "--method",
        "crcl",
        "--out-dir",
        p(&run),
        "--seed",
        "0",
        "--epochs",
        "7",
        "--set",
        "lr=3e-3",
        "--set",
        "lr_decay_epochs=[3]",
        "--set",
        "params.pieces=[1,4]",
        "--set",
        "params.freeze_epochs=1",
    ]);

    let m = eval_json(&run.join("labels.parquet"), &noisy);
    assert_eq!(m["n"], 2000);
    let auroc = m["auroc"].as_f64().expect("auroc is a number");
    assert!(auroc >= 0.90, "AUROC {auroc} < 0.90: {m}");

    // Soft labels are p_i after the confident-noise filter (ε = 0.1): in
    // [0, 1], and exactly 0 for some of the injected mismatches.
    let (fit_labels, _) = read_labels(&run.join("labels.parquet")).unwrap();
    let soft: Vec<f32> = fit_labels
        .iter()
        .map(|l| l.soft_label.expect("every pair is scored"))
        .collect();
    assert!(
        soft.iter().all(|&y| y == 0.0 || (0.1..=1.0).contains(&y)),
        "{soft:?}"
    );
    assert!(
        soft.contains(&0.0),
        "the confident-noise filter should zero some soft labels"
    );

    // `score` on the same data and checkpoint reproduces fit's labels exactly.
    let scored = tmp.path().join("scored.parquet");
    ok(&[
        "score",
        p(&noisy),
        "--checkpoint",
        p(&run),
        "--out",
        p(&scored),
    ]);
    let (score_labels, _) = read_labels(&scored).unwrap();
    assert_eq!(fit_labels, score_labels);
}

#[test]
fn crcl_rejects_epochs_that_do_not_match_the_pieces() {
    let tmp = tempfile::tempdir().unwrap();
    let data = demo(tmp.path(), 40);
    let out = ncclean(&[
        "fit",
        p(&data),
        "--method",
        "crcl",
        "--out-dir",
        p(&tmp.path().join("run")),
        "--epochs",
        "3",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("pieces"), "{err}");
}
