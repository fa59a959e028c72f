//! Threshold rules end to end (issue #14): every rule on fit, score and
//! filter, `>=` at the cut, one cut for every shard, and the no-signal /
//! no-noise warnings.

mod common;

use std::path::{Path, PathBuf};

use common::{ncclean, ok, p};
use ncclean::curation::threshold::{Record, Rule, RECORD_FILE};
use ncclean::data::read_labels;

/// 2,000 embedding demo pairs (fast to train) in `dir`, with `rate` of
/// them mismatched (`ncclean corrupt`, seed 1) when `rate` > 0.
fn data(dir: &Path, name: &str, rate: f64) -> PathBuf {
    data_of(dir, name, rate, 2000)
}

/// [`data`] with `pairs` pairs.
fn data_of(dir: &Path, name: &str, rate: f64, pairs: usize) -> PathBuf {
    let raw = dir.join(name);
    ok(&[
        "demo",
        "--out",
        p(&raw),
        "--pairs",
        &pairs.to_string(),
        "--embedding-dim",
        "32",
        "--seed",
        "0",
    ]);
    let clean = raw.join("demo.parquet");
    if rate == 0.0 {
        return clean;
    }
    let noisy = dir.join(format!("{name}.parquet"));
    ok(&[
        "corrupt",
        p(&clean),
        "--rate",
        &rate.to_string(),
        "--seed",
        "1",
        "--out",
        p(&noisy),
    ]);
    noisy
}

/// `fit --method vanilla` (seed 0) plus `extra`; returns stderr.
fn fit(data: &Path, run: &Path, extra: &[&str]) -> String {
    let mut args = vec![
        "fit",
        p(data),
        "--out-dir",
        p(run),
        "--method",
        "vanilla",
        "--seed",
        "0",
    ];
    args.extend_from_slice(extra);
    let out = ncclean(&args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "fit {extra:?} failed:\n{err}");
    err
}

fn stats(run: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(run.join("stats.json")).unwrap()).unwrap()
}

/// Every usable row's (clean_prob, is_clean).
fn decisions(labels: &Path) -> Vec<(f32, bool)> {
    read_labels(labels)
        .unwrap()
        .0
        .iter()
        .filter_map(|l| l.clean_prob.map(|c| (c, l.is_clean)))
        .collect()
}

#[test]
fn every_rule_cuts_at_or_above_and_reports_its_numbers() {
    let tmp = tempfile::tempdir().unwrap();
    let noisy = data(tmp.path(), "noisy", 0.3);
    let base = tmp.path().join("base");
    fit(&noisy, &base, &[]);
    let probs: Vec<f32> = decisions(&base.join("labels.parquet"))
        .iter()
        .map(|d| d.0)
        .collect();
    // A clean_prob that pairs hold (ties included) and that is not 0 or 1:
    // `>=` keeps them, the strict `>` of earlier versions dropped them.
    let mut inner: Vec<f32> = probs
        .iter()
        .copied()
        .filter(|&x| x > 0.01 && x < 0.99)
        .collect();
    inner.sort_by(f32::total_cmp);
    let at = inner[inner.len() / 2];
    let at_text = f64::from(at).to_string();

    let runs = [
        ("min", vec!["--min-prob", at_text.as_str()]),
        ("keep", vec!["--keep-fraction", "0.6"]),
        ("prec", vec!["--target-precision", "0.97"]),
        ("noise", vec!["--remove-noise-rate"]),
    ];
    for (name, flags) in runs {
        let run = tmp.path().join(name);
        let err = fit(&noisy, &run, &flags);
        let s = stats(&run);
        let cut = &s["cut"];
        let min_prob = cut["min_prob"].as_f64().unwrap();
        let rows = decisions(&run.join("labels.parquet"));
        // Training is the same for every rule (same seed): only the cut moves.
        assert_eq!(rows.iter().map(|r| r.0).collect::<Vec<_>>(), probs);
        // A cut inside a tie splits the pairs on it by similarity
        // (`min_similarity`); every other pair is kept exactly when at or
        // above the cut.
        let split = cut.get("min_similarity").is_some();
        for &(c, clean) in &rows {
            if split && f64::from(c) == min_prob {
                continue;
            }
            assert_eq!(clean, f64::from(c) >= min_prob, "{name}: {c} vs {min_prob}");
        }
        let kept: Vec<f64> = rows
            .iter()
            .filter(|r| r.1)
            .map(|r| f64::from(r.0))
            .collect();
        assert_eq!(s["clean"], kept.len(), "{name}");
        let precision = kept.iter().sum::<f64>() / kept.len() as f64;
        assert!((cut["expected_precision"].as_f64().unwrap() - precision).abs() < 1e-9);
        let noise = probs.iter().map(|&x| 1.0 - f64::from(x)).sum::<f64>() / 2000.0;
        assert!((s["estimated_noise_rate"].as_f64().unwrap() - noise).abs() < 1e-9);
        let said = if split {
            "-> keeping clean_prob > "
        } else {
            "-> keeping clean_prob >= "
        };
        assert!(err.contains(said), "{name}: {err}");
        assert!(!err.contains("Cut("), "{err}");
        let meta = read_labels(&run.join("labels.parquet")).unwrap().1;
        assert_eq!(meta["ncclean.threshold"], min_prob.to_string());
        match name {
            "min" => {
                assert_eq!(min_prob, f64::from(at));
                assert!(rows.iter().any(|&(c, clean)| c == at && clean));
            }
            "keep" => {
                // 60% of 2,000, more only when ties straddle the cut.
                assert!(kept.len() >= 1200);
                let above = rows.iter().filter(|r| f64::from(r.0) > min_prob).count();
                assert!(above < 1200, "{above}");
            }
            "prec" => {
                assert!(precision >= 0.97);
                // The largest such set: one more tie group drops below.
                let next = rows
                    .iter()
                    .map(|r| f64::from(r.0))
                    .filter(|&c| c < min_prob)
                    .fold(f64::NEG_INFINITY, f64::max);
                let wider: Vec<f64> = rows
                    .iter()
                    .map(|r| f64::from(r.0))
                    .filter(|&c| c >= next)
                    .collect();
                assert!(wider.iter().sum::<f64>() / (wider.len() as f64) < 0.97);
            }
            _ => {
                // Removes round(estimated rate × pairs), ties kept whole.
                let removed = 2000 - kept.len();
                assert!(removed <= (noise * 2000.0).round() as usize);
                assert!(
                    removed + 20 >= (noise * 2000.0).round() as usize,
                    "{removed}"
                );
            }
        }
    }
}

#[test]
fn score_applies_the_training_cut_on_every_shard() {
    let tmp = tempfile::tempdir().unwrap();
    let noisy = data(tmp.path(), "noisy", 0.3);
    let run = tmp.path().join("run");
    fit(&noisy, &run, &["--keep-fraction", "0.7"]);
    let record: Record =
        serde_json::from_slice(&std::fs::read(run.join("checkpoint").join(RECORD_FILE)).unwrap())
            .unwrap();
    assert_eq!(record.cut.rule, Rule::KeepFraction(0.7));
    // Scoring the training data again reproduces fit's labels: the stored
    // cut, not a fraction of what is scored.
    let again = tmp.path().join("again.parquet");
    ok(&[
        "score",
        p(&noisy),
        "--checkpoint",
        p(&run),
        "--out",
        p(&again),
    ]);
    assert_eq!(
        read_labels(&again).unwrap().0,
        read_labels(&run.join("labels.parquet")).unwrap().0
    );
    // Two slices of the data scored apart with a fraction rule get the
    // cut resolved on the training distribution, not each its own.
    let out = ok(&[
        "score",
        p(&noisy),
        "--checkpoint",
        p(&run),
        "--out",
        p(&tmp.path().join("half.parquet")),
        "--keep-fraction",
        "0.5",
    ]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let want = record.cut_for(Rule::KeepFraction(0.5)).min_prob;
    assert_eq!(v["min_prob"].as_f64().unwrap(), want);
    let kept = v["clean"].as_u64().unwrap();
    assert!((990..=1010).contains(&kept), "{kept}");
    let meta = read_labels(&tmp.path().join("half.parquet")).unwrap().1;
    assert_eq!(meta["ncclean.threshold"], want.to_string());
    assert_eq!(meta["ncclean.threshold_rule"], "keep the top 50%");
    // An invalid value is a usage error naming the flag.
    let bad = ncclean(&[
        "score",
        p(&noisy),
        "--checkpoint",
        p(&run),
        "--out",
        p(&tmp.path().join("bad.parquet")),
        "--target-precision",
        "2",
    ]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr)
        .contains("--target-precision must be between 0 and 1, got 2"));
}

#[test]
fn filter_resolves_rules_on_the_labels_and_says_the_cut() {
    let tmp = tempfile::tempdir().unwrap();
    let noisy = data(tmp.path(), "noisy", 0.3);
    let run = tmp.path().join("run");
    fit(&noisy, &run, &[]);
    let labels = run.join("labels.parquet");
    let rows = decisions(&labels);
    for (flags, check) in [
        (
            vec!["--target-precision", "0.95"],
            "largest set with expected precision >= 95%",
        ),
        (vec!["--remove-noise-rate", "0.25"], "remove the lowest 25%"),
    ] {
        let out_file = tmp.path().join("kept.parquet");
        let mut args = vec![
            "filter",
            p(&noisy),
            "--labels",
            p(&labels),
            "--out",
            p(&out_file),
        ];
        args.extend_from_slice(&flags);
        let out = ncclean(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{err}");
        assert!(err.contains("keeping clean_prob >= "), "{err}");
        assert!(err.contains(check), "{err}");
        assert!(!err.contains("Cut("), "{err}");
        let v: serde_json::Value =
            serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
        let kept = v["rows_out"].as_u64().unwrap() as usize;
        let mut top: Vec<f64> = rows.iter().map(|r| f64::from(r.0)).collect();
        top.sort_by(|a, b| b.total_cmp(a));
        let at_or_above = |c: f64| top.iter().filter(|&&x| x >= c).count();
        if flags[0] == "--remove-noise-rate" {
            // Removing 500 of 2,000 cuts at the 1,500th highest, its ties kept.
            assert_eq!(kept, at_or_above(top[1499]));
        } else {
            let mean = |k: usize| top[..k].iter().sum::<f64>() / k as f64;
            assert!(kept > 0 && mean(kept) >= 0.95);
            // The largest such set: the next tie group brings it below.
            assert!(kept == 2000 || mean(at_or_above(top[kept])) < 0.95);
        }
    }
}

#[test]
fn fit_warns_on_noise_free_data_and_on_data_without_signal() {
    let tmp = tempfile::tempdir().unwrap();
    let clean = data(tmp.path(), "clean", 0.0);
    // The final clean-probability model finds no noise in noise-free data
    // and keeps every pair: nothing to warn about.
    let run = tmp.path().join("clean-run-default");
    let err = fit(&clean, &run, &[]);
    assert!(!err.contains("warning:"), "{err}");
    let s = stats(&run);
    assert!(s["estimated_noise_rate"].as_f64().unwrap() <= 0.02, "{s}");
    // The division's mixture still splits one population in two: the
    // warning says so.
    let run = tmp.path().join("clean-run");
    let err = fit(&clean, &run, &["--set", "clean_prob=division"]);
    assert!(
        err.contains("warning: no noise found: only 0% of 1024 pairs"),
        "{err}"
    );
    // The division gives clean_prob here: the warning names its mixture.
    assert!(
        err.contains("yet the mixture (gmm clean component at "),
        "{err}"
    );
    let s = stats(&run);
    assert!(s["warnings"][0]
        .as_str()
        .unwrap()
        .starts_with("no noise found"));
    assert!(s["signal"]["random_like_share"].as_f64().unwrap() <= 0.02);
    // The labels keep the run's warnings.
    let (_, meta) = read_labels(&run.join("labels.parquet")).unwrap();
    let kept: serde_json::Value = serde_json::from_str(&meta["ncclean.warnings"]).unwrap();
    assert_eq!(kept, s["warnings"]);
    assert!(s["mixture"]["separation"].as_f64().is_some());

    // Every caption on another image: nothing to learn but the pairs
    // themselves (AUROC about 0.6 on the training pairs), so a warning.
    let shuffled = data(tmp.path(), "shuffled", 1.0);
    let run = tmp.path().join("shuffled-run");
    let err = fit(&shuffled, &run, &[]);
    assert!(err.contains("warning: no signal: "), "{err}");
    assert!(stats(&run)["signal"]["matched_share"].as_f64().unwrap() < 0.05);

    // Noisy data with signal: neither warning.
    let noisy = data(tmp.path(), "noisy", 0.3);
    let run = tmp.path().join("noisy-run");
    let err = fit(&noisy, &run, &[]);
    assert!(
        !err.contains("no signal") && !err.contains("no noise"),
        "{err}"
    );
    assert_eq!(stats(&run)["warnings"], serde_json::json!([]));
    let (_, meta) = read_labels(&run.join("labels.parquet")).unwrap();
    assert!(!meta.contains_key("ncclean.warnings"), "{meta:?}");

    // The same data with a cut that keeps 99% (all 2,000 here: the lowest
    // clean_prob are tied at 0, and a cut keeps a whole tie group): the
    // pairs that score like random pairings are kept, and the warning
    // names the share to remove.
    let run = tmp.path().join("noisy-keep-most");
    let err = fit(&noisy, &run, &["--keep-fraction", "0.99"]);
    let s = stats(&run);
    let share = s["signal"]["random_like_share"].as_f64().unwrap();
    let removed = 1.0 - s["clean"].as_f64().unwrap() / s["pairs"].as_f64().unwrap();
    assert!(share >= removed + 0.10, "{s}");
    assert!(
        err.contains("warning: noise understated: ")
            && err.contains(&format!(
                "and the cut removes {}:",
                ncclean::curation::threshold::percent(removed)
            ))
            && err.contains(&format!("--remove-noise-rate {share:.2}")),
        "{err}"
    );
    // The labels' estimate is the final model's, and the warning says so.
    assert!(
        err.contains(
            "yet the clean model (calibrated on held-out pairs against random pairings) estimates"
        ),
        "{err}"
    );
    assert_eq!(s["warnings"].as_array().unwrap().len(), 1, "{s}");
}

/// A fit on too few pairs to hold any out for calibration says that its
/// noise estimate and clean_prob's values are rough, on stderr and in
/// stats.json; one on enough pairs holds pairs out and says nothing.
#[test]
fn a_fit_too_small_to_hold_out_calibration_pairs_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    for (pairs, warned) in [(300, true), (600, false)] {
        let noisy = data_of(tmp.path(), &format!("noisy-{pairs}"), 0.3, pairs);
        let run = tmp.path().join(format!("run-{pairs}"));
        let err = fit(&noisy, &run, &["--epochs", "4"]);
        let said = format!("warning: few pairs to calibrate on: {pairs} pairs are too few");
        assert_eq!(err.contains(&said), warned, "{err}");
        let kept = stats(&run)["warnings"].to_string();
        assert_eq!(kept.contains("few pairs to calibrate on"), warned, "{kept}");
    }
}

/// A model collapsed by a learning rate far too high scores every pair
/// alike (every similarity 0.0, every clean_prob 1.0): `fit` makes no run
/// of it, and `score` refuses a run whose stats.json records no signal (as
/// earlier versions wrote them) instead of calling every pair clean (issue
/// #34, item 1).
#[test]
fn a_collapsed_model_makes_no_filter_in_fit_or_score() {
    let tmp = tempfile::tempdir().unwrap();
    // The demo's images through the demo towers, as the audit ran it.
    let pictures = common::noisy_demo_of(&tmp.path().join("pictures"), 1000);
    // The margin collapses the division to one population (every
    // posterior 1.0), which the division's own clean_prob shows; the final
    // model, fitted on pairs held out of that training, does not call every
    // pair clean (a case of its own below).
    for (name, flags) in [
        ("lr", &["--lr", "100"][..]),
        (
            "margin",
            &["--set", "margin=1e30", "--set", "clean_prob=division"][..],
        ),
    ] {
        let run = tmp.path().join(name);
        let mut args = vec![
            "fit",
            p(&pictures),
            "--epochs",
            "2",
            "--warmup-epochs",
            "1",
            "--out-dir",
            p(&run),
            "--method",
            "vanilla",
        ];
        args.extend_from_slice(flags);
        let out = ncclean(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{name}: {err}");
        assert!(
            err.contains("no signal: the trained model cannot tell its pairs from random pairings")
                && err.contains("no run was written"),
            "{name}: {err}"
        );
        assert!(!run.exists(), "{name}");
    }

    // With the default clean_prob, the collapsed division does not make
    // every pair clean: the final model still tells some apart, or the run
    // is refused.
    let run = tmp.path().join("margin-default");
    let out = ncclean(&[
        "fit",
        p(&pictures),
        "--epochs",
        "2",
        "--warmup-epochs",
        "1",
        "--out-dir",
        p(&run),
        "--method",
        "vanilla",
        "--set",
        "margin=1e30",
    ]);
    if out.status.success() {
        let (rows, _) = read_labels(&run.join("labels.parquet")).unwrap();
        assert!(rows.iter().any(|l| !l.is_clean), "every pair called clean");
    } else {
        assert_eq!(out.status.code(), Some(3));
    }

    // A good model passes; its run, recorded as a collapsed one was before
    // this check, is refused by score.
    let noisy = data(tmp.path(), "noisy", 0.3);
    let run = tmp.path().join("run");
    fit(&noisy, &run, &[]);
    let labels = tmp.path().join("labels.parquet");
    let score = || {
        ncclean(&[
            "score",
            p(&noisy),
            "--checkpoint",
            p(&run),
            "--out",
            p(&labels),
        ])
    };
    assert_eq!(score().status.code(), Some(0));
    std::fs::remove_file(&labels).unwrap();
    let mut s = stats(&run);
    s["signal"]["matched_share"] = 0.0.into();
    s["signal"]["auroc"] = 0.5.into();
    std::fs::write(run.join("stats.json"), s.to_string()).unwrap();
    let out = score();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(
        err.contains("no signal: the trained model cannot tell its pairs")
            && err.contains("(0% of 1024 pairs above 99% of the random pairings")
            && err.contains("stats.json"),
        "{err}"
    );
    assert!(!labels.exists());
}

#[test]
fn score_warns_about_each_file_whose_pairs_look_random() {
    let tmp = tempfile::tempdir().unwrap();
    let noisy = data(tmp.path(), "noisy", 0.3);
    let run = tmp.path().join("run");
    fit(&noisy, &run, &[]);
    let score = |args: &[&str]| {
        let out = ncclean(args);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "score {args:?} failed:\n{err}");
        let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        (err, summary)
    };
    // Data like the training data: nothing to say.
    let labels = tmp.path().join("labels.parquet");
    let (err, summary) = score(&[
        "score",
        p(&noisy),
        "--checkpoint",
        p(&run),
        "--out",
        p(&labels),
    ]);
    assert!(!err.contains("warning"), "{err}");
    assert_eq!(summary["warnings"], serde_json::json!([]));

    // Six shards of 200 pairs each, every caption on another image: each
    // file is said to have no signal, five on stderr, all six on stdout.
    let shards = tmp.path().join("shards");
    std::fs::create_dir(&shards).unwrap();
    for k in 0..6 {
        let raw = tmp.path().join(format!("raw{k}"));
        let seed = k.to_string();
        ok(&[
            "demo",
            "--out",
            p(&raw),
            "--pairs",
            "200",
            "--embedding-dim",
            "32",
            "--seed",
            &seed,
        ]);
        let shard = shards.join(format!("s{k}.parquet"));
        let demo = raw.join("demo.parquet");
        ok(&[
            "corrupt",
            p(&demo),
            "--rate",
            "1",
            "--seed",
            "1",
            "--out",
            p(&shard),
        ]);
    }
    let out_dir = tmp.path().join("labels");
    let (err, summary) = score(&[
        "score",
        p(&shards),
        "--checkpoint",
        p(&run),
        "--out-dir",
        p(&out_dir),
    ]);
    let said: Vec<&str> = err
        .lines()
        .filter(|l| l.contains(": no signal: "))
        .collect();
    assert_eq!(said.len(), 5, "{err}");
    // Named as the file was found: the directory's path joined to its name.
    let first = format!(
        "warning: {}: no signal: the model scores",
        p(&shards.join("s0.parquet"))
    );
    assert!(said[0].starts_with(&first), "{err}");
    assert!(
        err.contains("warning: 1 more file warned as above; the summary on stdout lists"),
        "{err}"
    );
    let all = summary["warnings"].as_array().unwrap();
    assert_eq!(all.len(), 6, "{summary}");
    // Each shard's labels keep its own warning.
    let (_, kept) = read_labels(&out_dir.join("s5.parquet")).unwrap();
    let kept: Vec<String> = serde_json::from_str(&kept["ncclean.warnings"]).unwrap();
    assert_eq!(kept, [all[5].as_str().unwrap()]);
    let last = format!("{}: no signal: ", p(&shards.join("s5.parquet")));
    assert!(all[5].as_str().unwrap().starts_with(&last), "{summary}");
    // The same shards in one labels file: one warning a file.
    let (_, summary) = score(&[
        "score",
        p(&shards),
        "--checkpoint",
        p(&run),
        "--out",
        p(&labels),
    ]);
    assert_eq!(
        summary["warnings"].as_array().unwrap().len(),
        6,
        "{summary}"
    );
    // And with the mixture refitted on them, read whole.
    let (_, refit) = score(&[
        "score",
        p(&shards),
        "--checkpoint",
        p(&run),
        "--out",
        p(&labels),
        "--refit",
    ]);
    assert_eq!(refit["warnings"], summary["warnings"]);
}

#[test]
fn shards_scored_apart_get_one_cut_for_a_fraction_rule() {
    let tmp = tempfile::tempdir().unwrap();
    let shards = tmp.path().join("shards");
    ok(&[
        "demo",
        "--out",
        p(&shards),
        "--pairs",
        "1200",
        "--embedding-dim",
        "32",
        "--shards",
        "2",
        "--seed",
        "0",
    ]);
    let run = tmp.path().join("run");
    fit(&shards, &run, &[]);
    let labels = tmp.path().join("labels");
    // One worker per shard, each resolving --keep-fraction: on the
    // training distribution, so both write the same cut.
    for i in ["0", "1"] {
        ok(&[
            "score",
            p(&shards),
            "--checkpoint",
            p(&run),
            "--out-dir",
            p(&labels),
            "--num-shards",
            "2",
            "--shard-index",
            i,
            "--keep-fraction",
            "0.4",
        ]);
    }
    let record = Record::load(&run.join("checkpoint")).unwrap().unwrap();
    let cut = record.cut_for(Rule::KeepFraction(0.4));
    let want = cut.min_prob;
    for stem in ["demo-00000", "demo-00001"] {
        let (rows, meta) = read_labels(&labels.join(format!("{stem}.parquet"))).unwrap();
        assert_eq!(meta["ncclean.threshold"], want.to_string(), "{stem}");
        // The cut as stored, its similarity bound included (a cut inside a
        // tie of clean_prob splits it by similarity).
        for l in &rows {
            assert_eq!(l.is_clean, cut.keeps(l.clean_prob, l.similarity));
        }
    }
}

/// The kept rows' keys of a filtered parquet.
fn kept_keys(path: &Path) -> std::collections::BTreeSet<String> {
    use arrow_array::{Array, StringArray};
    let f = std::fs::File::open(path).unwrap();
    let mut out = std::collections::BTreeSet::new();
    for b in parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(f)
        .unwrap()
        .build()
        .unwrap()
    {
        let b = b.unwrap();
        let c = b.column_by_name("key").unwrap();
        let s = c.as_any().downcast_ref::<StringArray>().unwrap();
        out.extend((0..s.len()).map(|i| s.value(i).to_string()));
    }
    out
}

#[test]
fn a_share_rule_cuts_inside_a_tie_by_similarity() {
    let tmp = tempfile::tempdir().unwrap();
    let noisy = data(tmp.path(), "noisy", 0.3);
    let run = tmp.path().join("run");
    fit(&noisy, &run, &[]);
    // Saturate the labels as a confident mixture does in f32: the top 70%
    // by clean_prob all read exactly 1.0.
    let (mut rows, meta) = read_labels(&run.join("labels.parquet")).unwrap();
    let mut probs: Vec<f32> = rows.iter().filter_map(|l| l.clean_prob).collect();
    probs.sort_by(|a, b| b.total_cmp(a));
    let floor = probs[1399];
    for l in &mut rows {
        if l.clean_prob.is_some_and(|c| c >= floor) {
            l.clean_prob = Some(1.0);
        }
    }
    let mut tied: Vec<(f32, String)> = rows
        .iter()
        .filter(|l| l.clean_prob == Some(1.0))
        .map(|l| (l.similarity.unwrap(), l.key.clone()))
        .collect();
    assert!(tied.len() >= 1400);
    let saturated = tmp.path().join("saturated.parquet");
    ncclean::data::write_labels(&saturated, &rows, &meta).unwrap();

    // Half of 2,000 is cut among the tied pairs: the 1,000 most similar.
    let kept = tmp.path().join("kept.parquet");
    let out = ncclean(&[
        "filter",
        p(&noisy),
        "--labels",
        p(&saturated),
        "--out",
        p(&kept),
        "--keep-fraction",
        "0.5",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("keeping clean_prob > 1, or = 1 with similarity >= "),
        "{err}"
    );
    assert!(!err.contains("kept together"), "{err}");
    tied.sort_by(|a, b| b.0.total_cmp(&a.0));
    let want: std::collections::BTreeSet<String> =
        tied[..1000].iter().map(|t| t.1.clone()).collect();
    assert_eq!(kept_keys(&kept), want);

    // `score` applies a stored cut that splits a tie: a pair at the cut's
    // clean_prob is kept by its similarity.
    let (fitted, _) = read_labels(&run.join("labels.parquet")).unwrap();
    let mut by_prob: Vec<&ncclean::data::LabelRow> =
        fitted.iter().filter(|l| l.clean_prob.is_some()).collect();
    by_prob.sort_by(|a, b| b.clean_prob.unwrap().total_cmp(&a.clean_prob.unwrap()));
    let at = by_prob[1000];
    let ckpt = run.join("checkpoint");
    let mut record = Record::load(&ckpt).unwrap().unwrap();
    record.cut.min_prob = f64::from(at.clean_prob.unwrap());
    record.cut.min_similarity = Some(f64::from(at.similarity.unwrap()) + 1e-3);
    record.save(&ckpt).unwrap();
    common::reseal(&run);
    let again = tmp.path().join("again.parquet");
    let out = ok(&[
        "score",
        p(&noisy),
        "--checkpoint",
        p(&run),
        "--out",
        p(&again),
    ]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["min_similarity"], record.cut.min_similarity.unwrap());
    let (scored, meta) = read_labels(&again).unwrap();
    let row = scored.iter().find(|l| l.key == at.key).unwrap();
    assert_eq!(row.clean_prob, at.clean_prob);
    assert!(!row.is_clean, "below the similarity bound at the cut");
    let (c, s) = (at.clean_prob.unwrap(), record.cut.min_similarity.unwrap());
    for l in &scored {
        let want = l
            .clean_prob
            .is_some_and(|p| p > c || (p == c && f64::from(l.similarity.unwrap()) >= s));
        assert_eq!(l.is_clean, want, "{}", l.key);
    }
    let clean = scored.iter().filter(|l| l.is_clean).count();
    assert_eq!(v["clean"].as_u64().unwrap() as usize, clean);
    assert_eq!(
        meta["ncclean.threshold_min_similarity"],
        record.cut.min_similarity.unwrap().to_string()
    );
}
