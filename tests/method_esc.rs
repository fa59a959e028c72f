//! End-to-end test of `ncclean fit --method esc` on the demo data.

mod common;

use common::{noisy_demo, ok, p};
use ncclean::data::read_labels;

#[test]
fn esc_detects_injected_noise_and_score_reproduces_fit() {
    let tmp = tempfile::tempdir().unwrap();
    let noisy = noisy_demo(tmp.path());

    // The preset is the paper's schedule for pretrained features (50 epochs,
    // lr 2e-4); the demo CNN trains from scratch, so: a larger lr, 2 warm-up
    // epochs, 2 clean-only epochs, 2 epochs on everything, lr ×0.1 after warm-up.
    let run = tmp.path().join("run");
    ok(&[
        "fit",
        p(&noisy),
        "--method",
        "esc",
        "--out-dir",
        p(&run),
        "--seed",
        "0",
        "--lr",
        "3e-3",
        "--epochs",
        "6",
        "--warmup-epochs",
        "2",
        "--set",
        "lr_decay_epochs=[2]",
        "--set",
        "params.clean_only_epochs=2",
        // This test checks ESC's own division (its statistic and mixture),
        // so it reads the method's posterior; the final clean-probability
        // model that is the default has tests of its own
        // (pipelines/src/clean_model, tests/stability.rs). On this tiny
        // from-scratch demo the final model ranks at AUROC 0.894, below
        // the 0.90 asked here: its towers are trained on 1,800 pairs, so
        // the neighbourhood score adds little.
        "--set",
        "clean_prob=division",
    ]);

    let out = ok(&[
        "eval",
        "--labels",
        p(&run.join("labels.parquet")),
        "--truth",
        p(&noisy),
        "--json",
    ]);
    let m: serde_json::Value =
        serde_json::from_str(out.trim()).expect("eval --json prints one JSON object");
    assert_eq!(m["n"], 2000);
    eprintln!("esc eval: {m}");
    let auroc = m["auroc"].as_f64().expect("auroc is a number");
    assert!(auroc >= 0.90, "ESC AUROC {auroc} < 0.90: {m}");

    // `score` with the checkpoint reproduces fit's labels exactly (fixed
    // scoring shuffles, the mixture from the checkpoint).
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

    // Soft labels follow the label rule: 1 for the clean set, 0 or above 0.5 otherwise.
    for l in &fit_labels {
        let y = l.soft_label.expect("every demo row is scored");
        assert!(
            y == 0.0 || (y > 0.5 && y <= 1.0),
            "soft label {y} breaks the rule"
        );
        if l.is_clean {
            assert_eq!(y, 1.0, "clean pairs keep label 1");
        }
    }
}
