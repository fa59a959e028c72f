//! End-to-end test of `--method recon` on demo data: fit, eval, score.

mod common;

use common::{eval_json, noisy_demo, ok, p};
use ncclean::data::read_labels;

#[test]
fn recon_detects_injected_noise_and_score_reproduces_fit() {
    let tmp = tempfile::tempdir().unwrap();
    let noisy = noisy_demo(tmp.path());
    let run = tmp.path().join("run");
    // An affordable schedule for the from-scratch demo CNN (local heads + GPO):
    // 3 warm-up epochs and 3 ReCon epochs at lr 3e-3, dropped ×0.1 after the
    // warm-up, one shuffle for the batch-dependent L_CM. The paper's schedule
    // (NCR's 40 epochs at 2e-4) is the preset.
    ok(&[
        "fit",
        p(&noisy),
        "--method",
        "recon",
        "--out-dir",
        p(&run),
        "--seed",
        "0",
        "--epochs",
        "6",
        "--warmup-epochs",
        "3",
        "--lr",
        "3e-3",
        "--set",
        "lr_decay_epochs=[3]",
        "--set",
        "division_shuffles=1",
    ]);

    let m = eval_json(&run.join("labels.parquet"), &noisy);
    assert_eq!(m["n"], 2000);
    let auroc = m["auroc"].as_f64().unwrap();
    assert!(auroc >= 0.90, "AUROC {auroc} < 0.90: {m}");

    // `score` on the same data and checkpoint reproduces fit's labels exactly.
    let (fit_labels, _) = read_labels(&run.join("labels.parquet")).unwrap();
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
    // soft labels: 1 for the pairs kept as matched, a matching probability otherwise
    assert!(fit_labels
        .iter()
        .all(|l| l.soft_label.is_some_and(|y| (0.0..=1.0).contains(&y))));
}
