//! End-to-end run of `ncclean fit --method gsc` on the demo data: detection
//! quality on injected noise, and `score` reproducing fit's labels.

mod common;

use common::{noisy_demo, ok, p};
use ncclean::data::read_labels;

#[test]
fn gsc_detects_injected_noise_and_score_matches_fit() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let noisy = noisy_demo(dir);

    // The preset's 60 epochs at lr 2e-4 are the paper's schedule for
    // Flickr30K-sized data; the from-scratch demo CNN needs a larger step and
    // far fewer epochs to stay affordable, with one ×0.2 decay near the end.
    let run = dir.join("run");
    ok(&[
        "fit",
        p(&noisy),
        "--method",
        "gsc",
        "--out-dir",
        p(&run),
        "--seed",
        "0",
        "--epochs",
        "6",
        "--lr",
        "3e-3",
        "--set",
        "lr_decay_epochs=[4]",
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
    let auroc = m["auroc"].as_f64().expect("auroc");
    assert!(auroc >= 0.90, "GSC AUROC {auroc} < 0.90: {m}");

    let (fit_labels, _) = read_labels(&run.join("labels.parquet")).unwrap();
    let scored = dir.join("scored.parquet");
    ok(&[
        "score",
        p(&noisy),
        "--checkpoint",
        p(&run),
        "--out",
        p(&scored),
    ]);
    let (score_labels, _) = read_labels(&scored).unwrap();
    assert_eq!(
        fit_labels, score_labels,
        "score must reproduce fit's labels"
    );
}
