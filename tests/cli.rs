//! End-to-end tests of the `ncclean` binary on generated data.

mod common;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::builder::{Float32Builder, ListBuilder};
use arrow_array::{Array, ArrayRef, BinaryArray, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use common::snapshot::assert_snapshot;
use common::{demo, eval_json, ncclean, noisy_demo_of, ok, p, quick_fit};
use ncclean::data::{read_labels, LabelRow, RowStatus};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;

fn read_rows(path: &Path) -> Vec<RecordBatch> {
    let f = File::open(path).unwrap();
    ParquetRecordBatchReaderBuilder::try_new(f)
        .unwrap()
        .build()
        .unwrap()
        .map(|b| b.unwrap())
        .collect()
}

fn count_rows(path: &Path) -> usize {
    read_rows(path).iter().map(|b| b.num_rows()).sum()
}

fn string_column(path: &Path, name: &str) -> Vec<String> {
    let mut out = Vec::new();
    for b in read_rows(path) {
        let c = b.column_by_name(name).unwrap();
        let s = c.as_any().downcast_ref::<StringArray>().unwrap();
        out.extend((0..s.len()).map(|i| s.value(i).to_string()));
    }
    out
}

fn write_parquet(path: &Path, columns: Vec<(&str, ArrayRef)>) {
    let fields: Vec<Field> = columns
        .iter()
        .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
        .collect();
    let schema = Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new(
        schema.clone(),
        columns.into_iter().map(|(_, a)| a).collect(),
    )
    .unwrap();
    let mut w = ArrowWriter::try_new(File::create(path).unwrap(), schema, None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

#[test]
fn demo_corrupt_fit_eval_score_filter_end_to_end() {
    let tmp = tempfile::tempdir().unwrap();
    let data = demo(tmp.path(), 2000);
    let noisy = tmp.path().join("noisy.parquet");
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
    let run = tmp.path().join("run");
    ok(&[
        "fit",
        p(&noisy),
        "--method",
        "vanilla",
        "--out-dir",
        p(&run),
        "--seed",
        "0",
    ]);
    for f in [
        "run.json",
        "checkpoint/state.json",
        "labels.parquet",
        "filtered.parquet",
        "stats.json",
    ] {
        assert!(run.join(f).exists(), "missing {f}");
    }

    // Detection quality on 30% injected noise.
    let m = eval_json(&run.join("labels.parquet"), &noisy);
    for k in ["auroc", "ap", "precision", "recall", "f1", "n"] {
        assert!(m.get(k).is_some(), "eval --json lacks {k}: {m}");
    }
    assert_eq!(m["n"], 2000);
    let auroc = m["auroc"].as_f64().unwrap();
    assert!(auroc >= 0.90, "AUROC {auroc} < 0.90: {m}");

    // `score` on the same data and checkpoint reproduces fit's labels exactly.
    let (fit_labels, fit_meta) = read_labels(&run.join("labels.parquet")).unwrap();
    let scored = tmp.path().join("scored.parquet");
    ok(&[
        "score",
        p(&noisy),
        "--checkpoint",
        p(&run),
        "--out",
        p(&scored),
    ]);
    let (score_labels, score_meta) = read_labels(&scored).unwrap();
    assert_eq!(fit_labels, score_labels);
    for k in [
        "ncclean.checkpoint_sha256",
        "ncclean.method",
        "ncclean.seed",
        "ncclean.input_fingerprint",
        "ncclean.threshold",
    ] {
        assert!(fit_meta.contains_key(k), "labels metadata lacks {k}");
        assert_eq!(
            fit_meta.get(k),
            score_meta.get(k),
            "{k} differs between fit and score"
        );
    }

    // Filtered output: exactly the is_clean rows, all original columns,
    // then each row's clean_prob and soft_label.
    let clean: Vec<&LabelRow> = fit_labels.iter().filter(|l| l.is_clean).collect();
    assert_eq!(count_rows(&run.join("filtered.parquet")), clean.len());
    let kept_keys = string_column(&run.join("filtered.parquet"), "key");
    assert_eq!(
        kept_keys,
        clean.iter().map(|l| l.key.clone()).collect::<Vec<_>>()
    );
    let schema_in = read_rows(&noisy)[0].schema();
    let filtered = read_rows(&run.join("filtered.parquet"));
    let fields = filtered[0].schema().fields().clone();
    let n = schema_in.fields().len();
    assert_eq!(fields[..n], schema_in.fields()[..]);
    let extra: Vec<&str> = fields[n..].iter().map(|f| f.name().as_str()).collect();
    assert_eq!(extra, ["ncclean_clean_prob", "ncclean_soft_label"]);
    let probs: Vec<Option<f32>> = filtered
        .iter()
        .flat_map(|b| {
            let c = b
                .column_by_name("ncclean_clean_prob")
                .unwrap()
                .as_any()
                .downcast_ref::<arrow_array::Float32Array>()
                .unwrap()
                .clone();
            c.iter().collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(
        probs,
        clean.iter().map(|l| l.clean_prob).collect::<Vec<_>>()
    );

    // `filter` with a keep fraction keeps that fraction of the rows.
    let half = tmp.path().join("half.parquet");
    ok(&[
        "filter",
        p(&noisy),
        "--labels",
        p(&run.join("labels.parquet")),
        "--keep-fraction",
        "0.5",
        "--out",
        p(&half),
    ]);
    assert_eq!(count_rows(&half), 1000);

    // stats.json carries the numbers the summary reports.
    let stats: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("stats.json")).unwrap()).unwrap();
    assert_eq!(stats["pairs"], 2000);
    assert_eq!(stats["clean"], clean.len());
}

#[test]
fn fit_is_deterministic_for_a_seed() {
    let tmp = tempfile::tempdir().unwrap();
    let data = demo(tmp.path(), 300);
    let args = |run: &Path, seed: &str| {
        ok(&[
            "fit",
            p(&data),
            "--out-dir",
            p(run),
            "--epochs",
            "2",
            "--warmup-epochs",
            "1",
            "--seed",
            seed,
        ]);
        read_labels(&run.join("labels.parquet")).unwrap().0
    };
    let a = args(&tmp.path().join("a"), "3");
    let b = args(&tmp.path().join("b"), "3");
    let c = args(&tmp.path().join("c"), "4");
    assert_eq!(a, b, "same seed, different labels");
    assert_ne!(
        a.iter().map(|l| l.similarity).collect::<Vec<_>>(),
        c.iter().map(|l| l.similarity).collect::<Vec<_>>(),
        "different seeds gave identical similarities"
    );
}

/// The binary runs candle's element-wise ops on one thread unless
/// `CANDLE_NUM_THREADS` says otherwise (src/runtime/threads.rs), records the setting
/// in stats.json, and the thread count never changes a label.
#[test]
fn candle_thread_count_defaults_to_one_and_changes_no_label() {
    let tmp = tempfile::tempdir().unwrap();
    let data = demo(tmp.path(), 300);
    let fit = |name: &str, threads: Option<&str>| {
        let run = tmp.path().join(name);
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_ncclean"));
        cmd.args([
            "fit",
            p(&data),
            "--method",
            "gsc",
            "--out-dir",
            p(&run),
            "--epochs",
            "2",
        ])
        .env_remove("CANDLE_NUM_THREADS");
        if let Some(t) = threads {
            cmd.env("CANDLE_NUM_THREADS", t);
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stats: serde_json::Value =
            serde_json::from_slice(&std::fs::read(run.join("stats.json")).unwrap()).unwrap();
        (read_labels(&run.join("labels.parquet")).unwrap().0, stats)
    };
    let (one, stats_one) = fit("default", None);
    let (two, stats_two) = fit("two", Some("2"));
    assert_eq!(stats_one["threads"]["elementwise"], 1, "{stats_one}");
    assert_eq!(stats_two["threads"]["elementwise"], 2, "{stats_two}");
    assert!(stats_one["threads"]["matmul"].as_u64().unwrap() >= 1);
    assert_eq!(one, two, "labels depend on the element-wise thread count");
}

#[test]
fn any_method_runs_on_the_gpo_head_and_score_rebuilds_it() {
    let tmp = tempfile::tempdir().unwrap();
    let data = demo(tmp.path(), 200);
    let run = tmp.path().join("gsc-gpo");
    ok(&[
        "fit",
        p(&data),
        "--method",
        "gsc",
        "--head",
        "gpo",
        "--out-dir",
        p(&run),
        "--epochs",
        "2",
        "--batch-size",
        "32",
    ]);
    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("checkpoint/state.json")).unwrap()).unwrap();
    assert_eq!(state["model"]["head"]["pooling"], "gpo");
    assert_eq!(state["model"]["head"]["local"], true);
    let (labels, _) = read_labels(&run.join("labels.parquet")).unwrap();
    assert_eq!(labels.len(), 200);
    // score rebuilds the GPO head from the checkpoint and reproduces fit
    let scored = tmp.path().join("scored.parquet");
    ok(&[
        "score",
        p(&data),
        "--checkpoint",
        p(&run),
        "--out",
        p(&scored),
    ]);
    assert_eq!(read_labels(&scored).unwrap().0, labels);
    // an unknown head is a usage error that lists the choices
    let out = ncclean(&["fit", p(&data), "--out-dir", p(&run), "--head", "max"]);
    assert_snapshot("fit_unknown_head", &out, tmp.path());
}

/// The demo data with row 5's image replaced by garbage bytes and row 7's
/// caption emptied.
fn damaged_demo(dir: &Path) -> PathBuf {
    let data = demo(dir, 120);
    let batches = read_rows(&data);
    let batch = arrow_select::concat::concat_batches(&batches[0].schema(), &batches).unwrap();
    let images = batch
        .column_by_name("image")
        .unwrap()
        .as_any()
        .downcast_ref::<BinaryArray>()
        .unwrap();
    let images: Vec<&[u8]> = (0..images.len())
        .map(|i| {
            if i == 5 {
                b"\x89PNG garbage".as_slice()
            } else {
                images.value(i)
            }
        })
        .collect();
    let caps = string_column(&data, "caption");
    let caps: Vec<&str> = caps
        .iter()
        .enumerate()
        .map(|(i, c)| if i == 7 { "  " } else { c.as_str() })
        .collect();
    let keys = string_column(&data, "key");
    let out = dir.join("damaged.parquet");
    write_parquet(
        &out,
        vec![
            ("key", Arc::new(StringArray::from(keys)) as ArrayRef),
            ("image", Arc::new(BinaryArray::from(images)) as ArrayRef),
            ("caption", Arc::new(StringArray::from(caps)) as ArrayRef),
        ],
    );
    out
}

#[test]
fn undecodable_image_and_empty_caption_are_skipped_and_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let data = damaged_demo(tmp.path());

    let out = ok(&["inspect", p(&data), "--json"]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["rows"], 120);
    assert_eq!(v["unusable"], 2, "{v}");

    let run = tmp.path().join("run");
    ok(&[
        "fit",
        p(&data),
        "--out-dir",
        p(&run),
        "--epochs",
        "1",
        "--warmup-epochs",
        "1",
    ]);
    let (labels, meta) = read_labels(&run.join("labels.parquet")).unwrap();
    assert_eq!(labels.len(), 120, "every input row has a label row");
    assert_eq!(meta.get("ncclean.skipped").map(String::as_str), Some("2"));
    let l5 = &labels[5];
    assert_eq!(l5.status, RowStatus::Skipped);
    assert!(
        l5.error.as_deref().unwrap_or("").contains("decode"),
        "{l5:?}"
    );
    assert!(!l5.is_clean && l5.clean_prob.is_none());
    let l7 = &labels[7];
    assert_eq!(l7.status, RowStatus::Skipped);
    assert!(
        l7.error.as_deref().unwrap_or("").contains("caption"),
        "{l7:?}"
    );
    assert!(labels
        .iter()
        .enumerate()
        .all(|(i, l)| (i == 5 || i == 7) == (l.status == RowStatus::Skipped)));
    let kept = string_column(&run.join("filtered.parquet"), "key");
    assert!(!kept.contains(&labels[5].key) && !kept.contains(&labels[7].key));
    let stats: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("stats.json")).unwrap()).unwrap();
    assert_eq!(stats["skipped"], 2);
}

/// Skipped rows above `--max-skipped` make a partial result: outputs in
/// full, exit 4, and a message that says how many and where the reasons are.
#[test]
fn too_many_skipped_rows_exit_4_with_every_output_written() {
    let tmp = tempfile::tempdir().unwrap();
    let data = damaged_demo(tmp.path());
    let run = tmp.path().join("run");
    let fit = ncclean(&[
        "fit",
        p(&data),
        "--out-dir",
        p(&run),
        "--epochs",
        "1",
        "--warmup-epochs",
        "1",
        "--max-skipped",
        "0.01",
    ]);
    let stderr = String::from_utf8_lossy(&fit.stderr);
    assert_eq!(fit.status.code(), Some(4), "{stderr}");
    assert!(stderr.contains("2 of 120 rows (1.7%)"), "{stderr}");
    let summary: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&fit.stdout).trim()).unwrap();
    assert_eq!(summary["skipped"], 2);
    let (labels, _) = read_labels(&run.join("labels.parquet")).unwrap();
    assert_eq!(labels.len(), 120);
    assert!(run.join("filtered.parquet").exists() && run.join("run.json").exists());

    let score = |extra: &[&str]| {
        let out = tmp.path().join("s.parquet");
        let mut args = vec!["score", p(&data), "--checkpoint", p(&run), "--out", p(&out)];
        args.extend_from_slice(extra);
        let o = ncclean(&args);
        (o.status.code(), out.exists())
    };
    assert_eq!(score(&["--max-skipped", "0"]), (Some(4), true));
    assert_eq!(score(&[]), (Some(0), true), "2/120 is under the default");
    assert_eq!(score(&["--max-skipped", "1.5"]).0, Some(2));
}

/// The run directory is replaced as a whole, so it must not hold anything
/// else, lie in a directory the inputs are listed from, or be an input.
#[test]
fn out_dirs_that_would_lose_or_reread_data_exit_2() {
    let tmp = tempfile::tempdir().unwrap();
    let data = demo(tmp.path(), 20);
    let fit = quick_fit;
    let inside = tmp.path().join("run");
    assert_snapshot(
        "fit_out_dir_inside_input_dir",
        &fit(tmp.path(), &inside, &[]),
        tmp.path(),
    );
    let photos = tmp.path().join("photos");
    std::fs::create_dir(&photos).unwrap();
    std::fs::write(photos.join("holiday.jpg"), b"x").unwrap();
    assert_snapshot(
        "fit_out_dir_not_a_run",
        &fit(&data, &photos, &[]),
        tmp.path(),
    );
    assert!(photos.join("holiday.jpg").exists(), "nothing was touched");
    // A run can be replaced by the next one; --force replaces anything.
    let run = tmp.path().join("ok");
    assert_eq!(fit(&data, &run, &[]).status.code(), Some(0));
    assert_eq!(fit(&data, &run, &[]).status.code(), Some(0));
    assert_eq!(fit(&data, &photos, &["--force"]).status.code(), Some(0));
    assert!(!photos.join("holiday.jpg").exists());
    // score may not write over its own input.
    let out = ncclean(&[
        "score",
        p(&data),
        "--checkpoint",
        p(&run),
        "--out",
        p(&data),
    ]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(count_rows(&data), 20, "the input is intact");
}

#[test]
fn nan_embedding_row_is_skipped_and_embeddings_train() {
    let tmp = tempfile::tempdir().unwrap();
    // 80 pairs whose 8-d "image embedding" encodes the caption's word index.
    let words = [
        "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel",
    ];
    let mut emb = ListBuilder::new(Float32Builder::new());
    let mut caps = Vec::new();
    for i in 0..80 {
        let w = i % 8;
        for d in 0..8 {
            let v = if i == 3 && d == 0 {
                f32::NAN
            } else if d == w {
                1.0
            } else {
                0.05 * ((i * 7 + d) % 5) as f32
            };
            emb.values().append_value(v);
        }
        emb.append(true);
        caps.push(format!("a picture of {}", words[w]));
    }
    let path = tmp.path().join("emb.parquet");
    write_parquet(
        &path,
        vec![
            ("image_embedding", Arc::new(emb.finish()) as ArrayRef),
            ("caption", Arc::new(StringArray::from(caps)) as ArrayRef),
        ],
    );
    let run = tmp.path().join("run");
    ok(&[
        "fit",
        p(&path),
        "--out-dir",
        p(&run),
        "--epochs",
        "2",
        "--warmup-epochs",
        "1",
        "--batch-size",
        "16",
    ]);
    let (labels, _) = read_labels(&run.join("labels.parquet")).unwrap();
    assert_eq!(labels.len(), 80);
    assert_eq!(labels[3].status, RowStatus::Skipped);
    assert!(
        labels[3]
            .error
            .as_deref()
            .unwrap_or("")
            .to_lowercase()
            .contains("nan"),
        "{:?}",
        labels[3]
    );
    assert_eq!(
        labels[3].key, "emb:3",
        "keys fall back to <file stem>:<row>"
    );
    assert_eq!(
        labels.iter().filter(|l| l.status == RowStatus::Ok).count(),
        79
    );
    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("checkpoint/state.json")).unwrap()).unwrap();
    assert_eq!(state["model"]["image"]["kind"], "precomputed");
    assert_eq!(state["model"]["image"]["dim"], 8);

    // Embedding columns have no regions: recon and the GPO head refuse them
    // up front (usage error, exit 2) and say what would work.
    for (name, extra) in [
        ("fit_recon_on_embeddings", &["--method", "recon"][..]),
        ("fit_gpo_head_on_embeddings", &["--head", "gpo"][..]),
    ] {
        let mut args = vec!["fit", p(&path), "--out-dir", p(&run)];
        args.extend_from_slice(extra);
        assert_snapshot(name, &ncclean(&args), tmp.path());
    }
}

#[test]
fn missing_caption_column_exits_3_with_a_useful_message() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("nocap.parquet");
    write_parquet(
        &path,
        vec![
            (
                "key",
                Arc::new(StringArray::from(vec!["a", "b"])) as ArrayRef,
            ),
            (
                "image",
                Arc::new(BinaryArray::from(vec![b"x".as_slice(), b"y".as_slice()])) as ArrayRef,
            ),
        ],
    );
    let out = ncclean(&["fit", p(&path), "--out-dir", p(&tmp.path().join("run"))]);
    assert_snapshot("fit_missing_caption_column", &out, tmp.path());
    assert!(!tmp.path().join("run").join("labels.parquet").exists());
}

#[test]
fn empty_and_non_parquet_files_exit_3() {
    let tmp = tempfile::tempdir().unwrap();
    let empty = tmp.path().join("empty.parquet");
    File::create(&empty).unwrap();
    let run = tmp.path().join("run");
    assert_snapshot(
        "inspect_empty_file",
        &ncclean(&["inspect", p(&empty)]),
        tmp.path(),
    );
    assert_snapshot(
        "fit_empty_file",
        &ncclean(&["fit", p(&empty), "--out-dir", p(&run)]),
        tmp.path(),
    );
    let text = tmp.path().join("notes.parquet");
    std::fs::write(&text, "hello, not parquet").unwrap();
    assert_snapshot(
        "inspect_not_parquet",
        &ncclean(&["inspect", p(&text)]),
        tmp.path(),
    );
    let missing = tmp.path().join("missing.parquet");
    assert_snapshot(
        "inspect_missing_file",
        &ncclean(&["inspect", p(&missing)]),
        tmp.path(),
    );
    assert_snapshot(
        "fit_missing_file",
        &ncclean(&["fit", p(&missing), "--out-dir", p(&run)]),
        tmp.path(),
    );
    assert!(!run.join("labels.parquet").exists());
}

#[test]
fn usage_errors_exit_2() {
    let tmp = tempfile::tempdir().unwrap();
    let data = demo(tmp.path(), 20);
    let run = tmp.path().join("r");
    let fit = |extra: &[&str]| {
        let mut args = vec!["fit", p(&data), "--out-dir", p(&run)];
        args.extend_from_slice(extra);
        ncclean(&args)
    };
    if cfg!(not(feature = "cuda")) {
        assert_snapshot(
            "fit_cuda_on_cpu_build",
            &fit(&["--device", "cuda"]),
            tmp.path(),
        );
    }
    assert_snapshot(
        "fit_unknown_method",
        &fit(&["--method", "nope"]),
        tmp.path(),
    );
    assert_snapshot(
        "fit_unknown_config_key",
        &fit(&["--set", "epochz=3"]),
        tmp.path(),
    );
    assert!(!run.join("labels.parquet").exists());
    let out = ncclean(&[
        "corrupt",
        p(&data),
        "--rate",
        "1.5",
        "--out",
        p(&tmp.path().join("x.parquet")),
    ]);
    assert_snapshot("corrupt_rate_out_of_range", &out, tmp.path());
    assert_snapshot("unknown_subcommand", &ncclean(&["frobnicate"]), tmp.path());
    let huge = ncclean(&["demo", "--out", p(tmp.path()), "--image-size", "100000"]);
    assert_snapshot("demo_image_size_too_large", &huge, tmp.path());
    // The demo's other sizes are bounded too: a billion-float embedding or
    // a million files used to run until memory or the disk gave out.
    let wide = ncclean(&[
        "demo",
        "--out",
        p(tmp.path()),
        "--embedding-dim",
        "1000000000",
    ]);
    assert_snapshot("demo_embedding_dim_too_large", &wide, tmp.path());
    let many = ncclean(&[
        "demo",
        "--out",
        p(tmp.path()),
        "--embedding-dim",
        "4",
        "--pairs",
        "1000000",
        "--shards",
        "1000000",
    ]);
    assert_snapshot("demo_shards_too_many", &many, tmp.path());
    // A directory without a checkpoint: say so, and what to pass instead.
    let empty_run = tmp.path().join("not-a-run");
    std::fs::create_dir_all(&empty_run).unwrap();
    let out = ncclean(&[
        "score",
        p(&data),
        "--checkpoint",
        p(&empty_run),
        "--out",
        p(&tmp.path().join("s.parquet")),
    ]);
    assert_snapshot("score_without_checkpoint", &out, tmp.path());
}

/// `--epochs` below a preset's warm-up (vanilla warms up 3 of 10) and no
/// `--warmup-epochs`: the warm-up keeps its share of the run, and the run
/// says so, where it used to be refused. A warm-up the user gave is kept
/// (and refused when too long: `fit_warmup_longer_than_training`).
#[test]
fn a_short_run_shortens_the_presets_warmup_and_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let data = demo(tmp.path(), 40);
    let run = tmp.path().join("r");
    let out = ncclean(&[
        "fit",
        p(&data),
        "--out-dir",
        p(&run),
        "--method",
        "vanilla",
        "--epochs",
        "2",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("warm-up: 1 of the 2 epochs (the vanilla preset warms up 3 of 10; --warmup-epochs sets it)"),
        "{err}"
    );
    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("checkpoint/state.json")).unwrap()).unwrap();
    assert_eq!(state["config"]["warmup_epochs"], 1, "{state}");
    assert_eq!(state["config"]["epochs"], 2, "{state}");
}

/// `--device auto` is the default: the run says on stderr which device it
/// took and why (a CPU build: the CPU, "this build has no CUDA").
#[test]
fn the_default_device_is_auto_and_the_choice_is_said() {
    let tmp = tempfile::tempdir().unwrap();
    let data = demo(tmp.path(), 40);
    let run = tmp.path().join("r");
    let out = ncclean(&["fit", p(&data), "--out-dir", p(&run), "--seed", "0"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    if cfg!(not(feature = "cuda")) {
        assert!(
            err.contains("device: cpu (this build has no CUDA)"),
            "{err}"
        );
    } else {
        assert!(err.contains("device: "), "{err}");
    }
    let scored = tmp.path().join("s.parquet");
    let out = ncclean(&[
        "score",
        p(&data),
        "--checkpoint",
        p(&run),
        "--out",
        p(&scored),
        "--device",
        "cpu",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("device: cpu (--device cpu)"), "{err}");
}

/// Ranges are checked before any input is read, and a run that diverges
/// stops with the epoch and the learning rate, writes nothing, and prints no
/// backtrace even when RUST_BACKTRACE is set.
#[test]
fn bad_values_are_refused_up_front_and_divergence_stops_cleanly() {
    let tmp = tempfile::tempdir().unwrap();
    let data = demo(tmp.path(), 60);
    let run = tmp.path().join("r");
    let fit = |extra: &[&str]| {
        let mut args = vec!["fit", p(&data), "--out-dir", p(&run)];
        args.extend_from_slice(extra);
        std::process::Command::new(env!("CARGO_BIN_EXE_ncclean"))
            .args(&args)
            .env("RUST_BACKTRACE", "1")
            .output()
            .expect("ncclean runs")
    };
    assert_snapshot("fit_lr_nan", &fit(&["--lr", "NaN"]), tmp.path());
    assert_snapshot("fit_epochs_zero", &fit(&["--epochs", "0"]), tmp.path());
    // Sizes are bounded above too: a huge one used to abort on allocation.
    assert_snapshot(
        "fit_epochs_too_many",
        &fit(&["--epochs", "100000000000"]),
        tmp.path(),
    );
    assert_snapshot(
        "fit_hidden_too_wide",
        &fit(&["--set", "hidden=1000000000"]),
        tmp.path(),
    );
    assert_snapshot(
        "fit_warmup_longer_than_training",
        &fit(&["--epochs", "2", "--warmup-epochs", "3"]),
        tmp.path(),
    );
    assert_snapshot(
        "fit_joint_dim_zero",
        &fit(&["--set", "joint_dim=0"]),
        tmp.path(),
    );
    let out = fit(&["--lr", "1e30", "--set", "grad_clip=0", "--epochs", "4"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("diverged") && err.contains("--lr"), "{err}");
    assert!(!err.contains("backtrace") && !err.contains("0: "), "{err}");
    assert!(!run.join("labels.parquet").exists() && !run.join("checkpoint").exists());
}

/// A configuration the method rejects is a usage error (exit 2) whether it
/// comes from `fit`'s flags or from the checkpoint `score` loads.
#[test]
fn a_bad_method_configuration_exits_2_from_fit_and_from_score() {
    let tmp = tempfile::tempdir().unwrap();
    let data = demo(tmp.path(), 60);
    let run = tmp.path().join("r");
    // CRCL's epochs must add up to its self-refining pieces.
    let out = ncclean(&[
        "fit",
        p(&data),
        "--out-dir",
        p(&run),
        "--method",
        "crcl",
        "--epochs",
        "5",
    ]);
    assert_snapshot("fit_crcl_epochs_do_not_match_pieces", &out, tmp.path());
    assert!(!run.join("labels.parquet").exists());
    // A checkpoint whose configuration its method rejects (a vanilla run's
    // state relabelled as crcl: no CRCL parameters).
    ok(&[
        "fit",
        p(&data),
        "--method",
        "vanilla",
        "--out-dir",
        p(&run),
        "--epochs",
        "1",
        "--warmup-epochs",
        "0",
    ]);
    let state_path = run.join("checkpoint").join("state.json");
    let mut state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&state_path).unwrap()).unwrap();
    state["method"] = "crcl".into();
    std::fs::write(&state_path, serde_json::to_vec(&state).unwrap()).unwrap();
    common::reseal(&run);
    let out = ncclean(&[
        "score",
        p(&data),
        "--checkpoint",
        p(&run),
        "--out",
        p(&tmp.path().join("s.parquet")),
    ]);
    assert_snapshot("score_checkpoint_config_rejected", &out, tmp.path());
    // The shared keys' ranges and the model's sizes are checked as well: an
    // edited state asking for a huge head used to abort on allocation.
    state["method"] = "vanilla".into();
    state["config"]["hidden"] = 1_000_000_000u64.into();
    std::fs::write(&state_path, serde_json::to_vec(&state).unwrap()).unwrap();
    common::reseal(&run);
    let score = || {
        ncclean(&[
            "score",
            p(&data),
            "--checkpoint",
            p(&run),
            "--out",
            p(&tmp.path().join("s.parquet")),
        ])
    };
    assert_snapshot("score_checkpoint_hidden_too_wide", &score(), tmp.path());
    state["config"]["hidden"] = 8u64.into();
    state["model"]["hidden"] = 1_000_000_000u64.into();
    std::fs::write(&state_path, serde_json::to_vec(&state).unwrap()).unwrap();
    common::reseal(&run);
    assert_snapshot("score_checkpoint_model_too_wide", &score(), tmp.path());
    assert!(!tmp.path().join("s.parquet").exists());
}

/// An output that names a directory or a device is refused before any work
/// (exit 2): renamed into place, it failed only after scoring (a directory),
/// or replaced the device or pipe with a plain file (`report --out
/// /dev/full` as root replaced /dev/full).
#[cfg(unix)]
#[test]
fn outputs_that_are_not_files_are_refused_up_front() {
    let tmp = tempfile::tempdir().unwrap();
    let data = demo(tmp.path(), 40);
    let run = tmp.path().join("r");
    assert_eq!(quick_fit(&data, &run, &[]).status.code(), Some(0));
    let fifo = tmp.path().join("pipe");
    let c = std::ffi::CString::new(p(&fifo)).unwrap();
    // SAFETY: mkfifo reads a NUL-terminated path and creates a node.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let dir = tmp.path().join("d");
    std::fs::create_dir(&dir).unwrap();
    let labels = run.join("labels.parquet");
    for (args, what) in [
        (
            vec!["score", p(&data), "--checkpoint", p(&run), "--out", p(&dir)],
            "is a directory, not a file",
        ),
        (
            vec![
                "score",
                p(&data),
                "--checkpoint",
                p(&run),
                "--out",
                p(&fifo),
            ],
            "is a named pipe, not a file",
        ),
        (
            vec!["report", p(&run), "--out", p(&fifo)],
            "is a named pipe",
        ),
        (
            vec![
                "filter",
                p(&data),
                "--labels",
                p(&labels),
                "--out",
                p(&fifo),
            ],
            "is a named pipe",
        ),
        (
            vec!["corrupt", p(&data), "--rate", "0.5", "--out", p(&dir)],
            "is a directory",
        ),
    ] {
        let out = ncclean(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(&format!("--out {}", args[args.len() - 1])),
            "{err}"
        );
        assert!(err.contains(what), "{args:?}: {err}");
        assert!(!err.contains("scored"), "refused before scoring: {err}");
    }
    // Directories asked for where a file (or a pipe) stands: refused before
    // any work too, where they failed when first written (exit 1, "cannot
    // create /dev/null: File exists").
    for (args, want) in [
        (
            vec![
                "score",
                p(&data),
                "--checkpoint",
                p(&run),
                "--out-dir",
                p(&fifo),
            ],
            format!("--out-dir {} exists and is not a directory", p(&fifo)),
        ),
        (
            vec![
                "filter",
                p(&data),
                "--labels",
                p(&labels),
                "--out-dir",
                p(&data),
            ],
            format!("--out-dir {} exists and is not a directory", p(&data)),
        ),
        (
            vec![
                "score",
                p(&data),
                "--checkpoint",
                p(&run),
                "--out",
                p(&tmp.path().join("s.parquet")),
                "--cache-dir",
                p(&data),
            ],
            format!(
                "the feature cache {} exists and is not a directory",
                p(&data)
            ),
        ),
    ] {
        let out = ncclean(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(&want), "{args:?}: {err}");
    }
    assert!(!tmp.path().join("s.parquet").exists());
    use std::os::unix::fs::FileTypeExt;
    assert!(
        std::fs::metadata(&fifo).unwrap().file_type().is_fifo(),
        "the pipe is still a pipe"
    );
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "nothing left in the directory"
    );
}

/// `filter` and `corrupt` refuse to write over a file they read: the atomic
/// write would have replaced the data (or the labels) with its filtered or
/// corrupted copy.
#[test]
fn filter_and_corrupt_refuse_an_output_that_is_an_input() {
    let tmp = tempfile::tempdir().unwrap();
    let data = demo(tmp.path(), 60);
    let run = tmp.path().join("r");
    assert_eq!(quick_fit(&data, &run, &[]).status.code(), Some(0));
    let labels = run.join("labels.parquet");
    let before = (
        std::fs::read(&data).unwrap(),
        std::fs::read(&labels).unwrap(),
    );
    let filter = |out: &Path, extra: &[&str]| {
        let mut args = vec!["filter", p(&data), "--labels", p(&labels), "--out", p(out)];
        args.extend_from_slice(extra);
        ncclean(&args)
    };
    for (out, flag) in [
        (filter(&data, &[]), "--out"),
        (filter(&labels, &[]), "--out"),
        (
            filter(&tmp.path().join("f.parquet"), &["--uids-out", p(&data)]),
            "--uids-out",
        ),
        (
            ncclean(&["corrupt", p(&data), "--rate", "0.5", "--out", p(&data)]),
            "--out",
        ),
    ] {
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.contains(&format!("{flag} ")) && err.contains("is one of the input files"),
            "{err}"
        );
    }
    assert_eq!(std::fs::read(&data).unwrap(), before.0, "data untouched");
    assert_eq!(
        std::fs::read(&labels).unwrap(),
        before.1,
        "labels untouched"
    );
    assert!(!tmp.path().join("f.parquet").exists());
}

#[test]
fn corrupt_records_ground_truth_and_permutation() {
    let tmp = tempfile::tempdir().unwrap();
    let data = demo(tmp.path(), 100);
    let noisy = tmp.path().join("noisy.parquet");
    ok(&[
        "corrupt",
        p(&data),
        "--rate",
        "0.2",
        "--seed",
        "5",
        "--out",
        p(&noisy),
    ]);
    let f = File::open(&noisy).unwrap();
    let builder = ParquetRecordBatchReaderBuilder::try_new(f).unwrap();
    let kv = builder
        .metadata()
        .file_metadata()
        .key_value_metadata()
        .cloned()
        .unwrap_or_default();
    let get = |k: &str| kv.iter().find(|e| e.key == k).and_then(|e| e.value.clone());
    assert_eq!(get("ncclean.corrupt.seed").as_deref(), Some("5"));
    assert!(get("ncclean.corrupt.permutation").is_some());
    assert_eq!(
        string_column(&noisy, "caption"),
        string_column(&data, "caption"),
        "captions stay"
    );
    let batches: Vec<RecordBatch> = builder.build().unwrap().map(|b| b.unwrap()).collect();
    let noisy_count: usize = batches
        .iter()
        .map(|b| {
            let c = b.column_by_name("noisy").unwrap();
            let c = c
                .as_any()
                .downcast_ref::<arrow_array::BooleanArray>()
                .unwrap();
            c.true_count()
        })
        .sum();
    assert!(noisy_count > 10 && noisy_count <= 20, "{noisy_count}");
    assert_eq!(
        batches[0]
            .schema()
            .field_with_name("noisy")
            .unwrap()
            .data_type(),
        &DataType::Boolean
    );
}

/// CRC-32 (IEEE) for hand-written PNG chunks.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = 0xFFFF_FFFFu32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// A ~70-byte PNG whose header declares `w × h` RGB pixels (its pixel data
/// is a zlib stream of nothing): decoding it would allocate w·h·3 bytes.
fn png_declaring(w: u32, h: u32) -> Vec<u8> {
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut chunk = |kind: &[u8; 4], data: &[u8]| {
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        let mut body = kind.to_vec();
        body.extend_from_slice(data);
        out.extend_from_slice(&body);
        out.extend_from_slice(&crc32(&body).to_be_bytes());
    };
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&w.to_be_bytes());
    ihdr.extend_from_slice(&h.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    chunk(b"IHDR", &ihdr);
    chunk(b"IDAT", &[0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01]);
    chunk(b"IEND", &[]);
    out
}

/// A `side × side` PNG filled by `px`.
fn png_file(path: &Path, side: u32, px: impl Fn(u32, u32) -> [u8; 3]) {
    image::RgbImage::from_fn(side, side, |x, y| image::Rgb(px(x, y)))
        .save_with_format(path, image::ImageFormat::Png)
        .unwrap();
}

/// Run `ncclean args`, killing it and failing the test if it has not
/// finished within `limit` (a FIFO used to hang the process forever).
/// Output goes to files, so a full pipe cannot stall the child.
fn ncclean_within(args: &[&str], dir: &Path, limit: std::time::Duration) -> std::process::Output {
    let out_path = dir.join("child.stdout");
    let err_path = dir.join("child.stderr");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ncclean"))
        .args(args)
        .stdout(File::create(&out_path).unwrap())
        .stderr(File::create(&err_path).unwrap())
        .spawn()
        .expect("failed to start ncclean");
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > limit {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!(
                "ncclean {args:?} still ran after {limit:?} (hung on an image?); stderr:\n{}",
                std::fs::read_to_string(&err_path).unwrap_or_default()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    std::process::Output {
        status,
        stdout: std::fs::read(&out_path).unwrap(),
        stderr: std::fs::read(&err_path).unwrap(),
    }
}

/// Image paths come from the data and may be hostile: devices, FIFOs,
/// directories, paths out of the dataset, oversized files and images whose
/// header declares a huge size. Each such row is skipped with its reason
/// (nothing hangs, nothing is decoded that should not be), the other rows
/// train, and the flags lift or tighten the rules.
#[cfg(unix)]
#[test]
fn hostile_image_paths_are_skipped_with_reasons() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    std::fs::create_dir_all(data.join("imgs")).unwrap();
    let colours = [[220, 30, 30], [30, 200, 40], [40, 60, 210], [230, 220, 40]];
    let words = ["red", "green", "blue", "yellow"];
    let mut rows: Vec<(String, String)> = Vec::new();
    for i in 0..16 {
        let name = format!("imgs/ok{i}.png");
        let c = colours[i % 4];
        png_file(&data.join(&name), 16, |x, y| {
            [
                c[0],
                c[1],
                c[2].wrapping_add(((x + y) as u8).wrapping_mul(i as u8)),
            ]
        });
        rows.push((name, format!("a {} square", words[i % 4])));
    }
    // Hostile files, all made here.
    let fifo = data.join("imgs/fifo.png");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    std::fs::create_dir_all(data.join("imgs/dir.png")).unwrap();
    // 64 × 64 noise compresses badly: a valid PNG of over 4 KiB.
    png_file(&data.join("imgs/big.png"), 64, |x, y| {
        let v =
            (x.wrapping_mul(2_654_435_761) ^ y.wrapping_mul(40_503)).wrapping_mul(2_246_822_519);
        [(v >> 24) as u8, (v >> 16) as u8, (v >> 8) as u8]
    });
    assert!(std::fs::metadata(data.join("imgs/big.png")).unwrap().len() > 4096);
    std::fs::write(data.join("imgs/huge.png"), png_declaring(12_000, 12_000)).unwrap();
    let outside = tmp.path().join("outside.png");
    png_file(&outside, 16, |_, _| [220, 30, 30]);
    std::os::unix::fs::symlink(&outside, data.join("imgs/link.png")).unwrap();
    // Enough `..` to reach / from any temporary directory.
    let passwd = format!("{}etc/passwd", "../".repeat(30));
    let hostile = [
        ("imgs/fifo.png", "fifo"),
        ("imgs/dir.png", "dir"),
        (passwd.as_str(), "passwd"),
        ("/dev/zero", "zero"),
        (outside.to_str().unwrap(), "absolute"),
        ("imgs/big.png", "big"),
        ("imgs/huge.png", "huge"),
        ("imgs/link.png", "link"),
    ];
    for (path, _) in hostile {
        rows.push((path.to_string(), "a red square".to_string()));
    }
    let keys: Vec<String> = (0..16)
        .map(|i| format!("ok{i}"))
        .chain(hostile.iter().map(|(_, k)| k.to_string()))
        .collect();
    let parquet = data.join("paths.parquet");
    write_parquet(
        &parquet,
        vec![
            ("key", Arc::new(StringArray::from(keys)) as ArrayRef),
            (
                "image_path",
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| &r.0))) as ArrayRef,
            ),
            (
                "caption",
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| &r.1))) as ArrayRef,
            ),
        ],
    );
    let limit = std::time::Duration::from_secs(120);
    let errors = |run: &Path| -> std::collections::HashMap<String, Option<String>> {
        let (labels, _) = read_labels(&run.join("labels.parquet")).unwrap();
        assert_eq!(labels.len(), 24, "every row has a label");
        labels
            .into_iter()
            .map(|l| {
                assert_eq!(l.error.is_some(), l.status == RowStatus::Skipped, "{l:?}");
                (l.key, l.error)
            })
            .collect()
    };
    let fit = |run: &Path, extra: &[&str]| {
        let mut args = vec![
            "fit",
            p(&parquet),
            "--out-dir",
            p(run),
            "--epochs",
            "1",
            "--warmup-epochs",
            "1",
            "--batch-size",
            "8",
            "--max-image-bytes",
            "4K",
            "--max-skipped",
            "1",
        ];
        args.extend_from_slice(extra);
        let out = ncclean_within(&args, tmp.path(), limit);
        assert!(
            out.status.success(),
            "{:?}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        errors(run)
    };

    let confined = fit(&tmp.path().join("run"), &[]);
    let why = |errors: &std::collections::HashMap<String, Option<String>>, key: &str| {
        errors[key].clone().unwrap_or_default()
    };
    for i in 0..16 {
        assert_eq!(confined[&format!("ok{i}")], None, "ok{i} is a normal image");
    }
    let expect = [
        ("fifo", "is a FIFO (named pipe), not a regular file"),
        ("dir", "is a directory, not a regular file"),
        ("passwd", "leads outside"),
        ("zero", "image path /dev/zero is absolute"),
        ("absolute", "is absolute"),
        ("big", "over the 4 KiB limit (--max-image-bytes)"),
        (
            "huge",
            "image is 12000×12000 pixels (144 megapixels), over the 50 megapixel limit",
        ),
        ("link", "through a symbolic link"),
    ];
    for (key, reason) in expect {
        let e = why(&confined, key);
        assert!(e.contains(reason), "{key}: {e:?} should contain {reason:?}");
    }
    for key in ["passwd", "zero", "absolute", "link"] {
        assert!(
            why(&confined, key).contains("--allow-absolute-paths"),
            "{key}"
        );
    }

    // --allow-absolute-paths reads outside the dataset, but a device is
    // still not a regular file and /etc/passwd still not an image.
    let open = fit(&tmp.path().join("run2"), &["--allow-absolute-paths"]);
    assert_eq!(open["absolute"], None);
    assert_eq!(open["link"], None);
    let e = why(&open, "zero");
    assert!(
        e.contains("/dev/zero is a character device, not a regular file"),
        "{e}"
    );
    let e = why(&open, "passwd");
    assert!(e.contains("cannot decode image"), "{e}");
    for key in ["fifo", "dir", "big", "huge"] {
        assert!(open[key].is_some(), "{key}");
    }

    // inspect decodes the same way and has the same flags.
    let out = ncclean_within(
        &[
            "inspect",
            p(&parquet),
            "--json",
            "--max-image-pixels",
            "200",
        ],
        tmp.path(),
        limit,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // 16 × 16 = 256 pixels is over 200: every row is unusable now.
    assert_eq!(v["unusable"], 24, "{v}");

    // The limits are recorded with the run.
    let run_json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(tmp.path().join("run/run.json")).unwrap()).unwrap();
    assert_eq!(run_json["image_limits"]["max_bytes"], 4096);
    assert_eq!(run_json["image_limits"]["max_pixels"], 50_000_000);
    assert_eq!(run_json["image_limits"]["allow_absolute_paths"], false);
}

/// Zero or malformed limits are usage errors.
#[test]
fn image_limit_flags_are_validated() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("none.parquet");
    let run = tmp.path().join("run");
    for (name, flag, value) in [
        ("fit_max_image_bytes_zero", "--max-image-bytes", "0"),
        ("fit_max_image_bytes_bad_unit", "--max-image-bytes", "64X"),
        ("fit_max_image_pixels_zero", "--max-image-pixels", "0"),
    ] {
        let out = ncclean(&["fit", p(&data), "--out-dir", p(&run), flag, value]);
        assert_snapshot(name, &out, tmp.path());
    }
}

#[test]
fn corrupt_hard_mode_is_deterministic_and_never_keeps_the_own_image() {
    let tmp = tempfile::tempdir().unwrap();
    let data = demo(tmp.path(), 300);
    let run = |name: &str, extra: &[&str]| {
        let out = tmp.path().join(name);
        let mut args = vec!["corrupt", p(&data), "--rate", "0.4", "--seed", "2"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--out", p(&out)]);
        let summary: serde_json::Value = serde_json::from_str(ok(&args).trim()).unwrap();
        (out, summary)
    };
    let (hard, s) = run("hard.parquet", &["--mode", "hard"]);
    // Every chosen pair gets another image: noisy = chosen = ⌊0.4 · 300⌋.
    assert_eq!(
        (s["chosen"].as_u64(), s["noisy"].as_u64()),
        (Some(120), Some(120))
    );
    let (again, _) = run("again.parquet", &["--mode", "hard"]);
    let images = |path: &Path| -> Vec<Vec<u8>> {
        read_rows(path)
            .iter()
            .flat_map(|b| {
                let col = b.column_by_name("image").unwrap();
                let col = col.as_any().downcast_ref::<BinaryArray>().unwrap();
                (0..col.len())
                    .map(|i| col.value(i).to_vec())
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let noisy = |path: &Path| -> Vec<bool> {
        read_rows(path)
            .iter()
            .flat_map(|b| {
                let col = b.column_by_name("noisy").unwrap();
                let col = col
                    .as_any()
                    .downcast_ref::<arrow_array::BooleanArray>()
                    .unwrap();
                (0..col.len()).map(|i| col.value(i)).collect::<Vec<_>>()
            })
            .collect()
    };
    assert_eq!(images(&hard), images(&again), "same seed, same output");
    let (orig, got, flags) = (images(&data), images(&hard), noisy(&hard));
    for i in 0..orig.len() {
        assert_eq!(
            flags[i],
            orig[i] != got[i],
            "row {i}: noisy iff the image changed"
        );
    }
    // Mixed: the same chosen count; the mode and fraction are in the footer.
    let (mixed, s) = run(
        "mixed.parquet",
        &["--mode", "mixed", "--hard-fraction", "0.25"],
    );
    assert_eq!(s["chosen"].as_u64(), Some(120));
    let meta = ParquetRecordBatchReaderBuilder::try_new(File::open(&mixed).unwrap())
        .unwrap()
        .metadata()
        .file_metadata()
        .key_value_metadata()
        .cloned()
        .unwrap();
    let get = |k: &str| {
        meta.iter()
            .find(|kv| kv.key == k)
            .and_then(|kv| kv.value.clone())
    };
    assert_eq!(get("ncclean.corrupt.mode").as_deref(), Some("mixed"));
    assert_eq!(
        get("ncclean.corrupt.hard_fraction").as_deref(),
        Some("0.25")
    );
    // --hard-fraction belongs to --mode mixed only.
    let out = ncclean(&[
        "corrupt",
        p(&data),
        "--rate",
        "0.4",
        "--hard-fraction",
        "0.3",
        "--out",
        p(&tmp.path().join("x.parquet")),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--mode mixed"));
}

/// `scripts/ensure_rust.sh`, which `.ci/run` and the quickstart source on a
/// fresh machine: this toolchain passes; a cargo older than the workspace's
/// rust-version is refused (with installing turned off) in words that say
/// what to install, and so is a machine without cargo.
#[test]
fn ensure_rust_accepts_this_toolchain_and_refuses_an_old_one() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let home = tempfile::tempdir().expect("temp dir");
    let old = home.path().join("old-bin");
    std::fs::create_dir_all(&old).expect("bin dir");
    let fake = old.join("cargo");
    std::fs::write(
        &fake,
        "#!/bin/sh\necho 'cargo 1.63.0 (fd9c4297c 2022-07-01)'\n",
    )
    .expect("fake cargo");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    // Found on this PATH: the child's PATH is the one under test.
    let bash = std::env::split_paths(&std::env::var_os("PATH").expect("PATH"))
        .map(|d| d.join("bash"))
        .find(|b| b.is_file())
        .expect("bash on PATH");
    let run = |path: String| {
        std::process::Command::new(&bash)
            .args(["-c", "set -e; . scripts/ensure_rust.sh; cargo --version"])
            .current_dir(root)
            .env_clear()
            .env("HOME", home.path())
            .env("PATH", path)
            .env("NCCLEAN_NO_RUST_INSTALL", "1")
            .output()
            .expect("bash runs")
    };
    // The toolchain's own cargo (not rustup's proxy, which needs the real HOME).
    let toolchain = Path::new(env!("CARGO"))
        .parent()
        .expect("cargo's directory");
    let ok_run = run(format!("{}:/usr/bin:/bin", toolchain.display()));
    assert!(ok_run.status.success(), "{ok_run:?}");
    for (path, found) in [
        (format!("{}:/usr/bin:/bin", old.display()), "cargo 1.63.0"),
        ("/nonexistent".to_string(), "no cargo"),
    ] {
        let out = run(path);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(
            err.contains(&format!(
                "needs Rust 1.89 or newer, and this machine has {found}"
            )),
            "{err}"
        );
        assert!(err.contains("https://rustup.rs"), "{err}");
        assert!(out.stdout.is_empty(), "went on past the check");
    }
}

/// The loop as the brief types it, with no paths: `fit DATA` writes
/// ./ncclean-run, `score --out FILE` scores that run's training data through
/// it, `report` reads it. run.json records the inputs' absolute paths, so
/// `score` without DATA and `report` also work from another directory,
/// although `fit` was given a relative path.
#[test]
fn fit_score_and_report_default_to_the_run_in_the_current_directory() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let work = tmp.path().join("work");
    let empty = tmp.path().join("empty");
    std::fs::create_dir_all(&work).expect("work dir");
    std::fs::create_dir_all(&empty).expect("empty dir");
    noisy_demo_of(&work, 300);
    let in_dir = |dir: &Path, args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_ncclean"))
            .args(args)
            .current_dir(dir)
            .output()
            .expect("ncclean starts")
    };
    let succeeded = |out: &std::process::Output| {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };

    // Nothing fitted here yet: both say how to get a run.
    let out = in_dir(&empty, &["score", "--out", "l.parquet"]);
    assert_snapshot("score_without_a_run", &out, tmp.path());
    let out = in_dir(&empty, &["report"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("`ncclean report DIR`"));

    succeeded(&in_dir(
        &work,
        &[
            "fit",
            "noisy.parquet",
            "--epochs",
            "2",
            "--warmup-epochs",
            "1",
        ],
    ));
    let run = work.join("ncclean-run");
    let (fitted, _) = read_labels(&run.join("labels.parquet")).expect("fit's labels");
    let prob = |rows: &[LabelRow]| rows.iter().map(|r| r.clean_prob).collect::<Vec<_>>();

    let out = in_dir(&work, &["score", "--out", "scored.parquet"]);
    succeeded(&out);
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("no DATA given: scoring the training data of ncclean-run (1 file(s)"));
    let (scored, _) = read_labels(&work.join("scored.parquet")).expect("scored labels");
    assert_eq!(prob(&scored), prob(&fitted));

    // From elsewhere, through the checkpoint/ path: the recorded absolute
    // path is read, and named in source_file.
    let elsewhere = tmp.path().join("elsewhere.parquet");
    let ckpt = run.join("checkpoint");
    succeeded(&in_dir(
        &empty,
        &["score", "--checkpoint", p(&ckpt), "--out", p(&elsewhere)],
    ));
    let (again, _) = read_labels(&elsewhere).expect("labels");
    assert_eq!(prob(&again), prob(&fitted));
    let abs = std::path::absolute(work.join("noisy.parquet")).expect("absolute");
    assert!(again.iter().all(|r| Path::new(&r.source_file) == abs));

    let out = in_dir(&empty, &["report", p(&run)]);
    succeeded(&out);
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).expect("report summary");
    assert!(summary["shown"].as_u64().expect("shown") > 0, "{summary}");
    assert_eq!(summary["pictures_missing"], 0, "{summary}");

    // A run whose run.json predates the record cannot supply DATA.
    let run_json = run.join("run.json");
    let mut record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&run_json).expect("run.json")).expect("json");
    record
        .as_object_mut()
        .expect("object")
        .remove("input_files");
    std::fs::write(&run_json, record.to_string()).expect("rewrite run.json");
    let out = in_dir(&work, &["score", "--out", "old.parquet"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("a run from an older ncclean"));

    // Fitting other data into the default directory says what it replaces.
    let out = in_dir(&work, &["fit", "demo.parquet", "--epochs", "1"]);
    succeeded(&out);
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("ncclean-run holds a run fitted on noisy.parquet: it is replaced"));
}

/// One 20 MB caption without a space is no vocabulary word: `fit` trains
/// and writes its run. The demo text tower's vocabulary used to take it
/// whole, and fit failed after training ("state.json is larger than 16
/// MiB") (issue #34, item 9).
#[test]
fn a_huge_word_stays_out_of_the_vocabulary() {
    let tmp = tempfile::tempdir().unwrap();
    let data = demo(tmp.path(), 60);
    let huge = tmp.path().join("huge.parquet");
    common::hostile::rewrite(&data, &huge, 1000, false, |col, row, v| {
        if col == "caption" && row == 0 {
            "x".repeat(20 << 20)
        } else {
            v.to_string()
        }
    });
    let run = tmp.path().join("run");
    let out = quick_fit(&huge, &run, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let state = std::fs::metadata(run.join("checkpoint/state.json")).unwrap();
    assert!(state.len() < 1 << 20, "state.json: {} bytes", state.len());
}

/// Settings that cannot be meant are refused before any work (exit 2), and
/// a named pipe given as a file to read is refused at once (exit 3) instead
/// of waiting for a writer forever (issue #34, item 10).
#[cfg(unix)]
#[test]
fn nonsense_settings_and_blocking_files_are_refused_up_front() {
    let tmp = tempfile::tempdir().unwrap();
    let data = demo(tmp.path(), 40);
    let run = tmp.path().join("r");
    let fit = |extra: &[&str]| {
        let mut args = vec!["fit", p(&data), "--out-dir", p(&run)];
        args.extend_from_slice(extra);
        ncclean(&args)
    };
    for (extra, says) in [
        (
            &["--lr", "1e-300"][..],
            "lr = 1e-300 is out of range: at least 1e-10",
        ),
        (
            &["--set", "lr_decay_epochs=[1000000000000]"][..],
            "lr_decay_epochs = [.., 1000000000000, ..] is out of range",
        ),
        (
            &["--set", "epochs=5", "--epochs", "2"][..],
            "--set epochs=5 and --epochs 2 both set epochs; give one of them",
        ),
    ] {
        let out = fit(extra);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {err}");
        assert!(err.contains(says), "{extra:?}: {err}");
    }
    assert!(!run.exists());

    let fifo = tmp.path().join("pipe");
    let c = std::ffi::CString::new(p(&fifo)).unwrap();
    // SAFETY: mkfifo reads a NUL-terminated path and creates a node.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let filtered = tmp.path().join("f.parquet");
    for args in [
        vec!["fit", p(&data), "--out-dir", p(&run), "--config", p(&fifo)],
        vec![
            "filter",
            p(&data),
            "--labels",
            p(&fifo),
            "--out",
            p(&filtered),
        ],
    ] {
        // Run with a deadline: the defect was a wait without end.
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ncclean"))
            .args(&args)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let started = std::time::Instant::now();
        while child.try_wait().unwrap().is_none() {
            if started.elapsed() > std::time::Duration::from_secs(60) {
                child.kill().unwrap();
                panic!("{args:?} still waits on the pipe");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{args:?}: {err}");
        assert!(
            err.contains(&format!("{} is a named pipe, not a regular file", p(&fifo))),
            "{args:?}: {err}"
        );
    }
}

/// `score` without DATA scores the files run.json names; when their content
/// changed since `fit` it says so instead of scoring other data as if it
/// were the training data (issue #34, item 10).
#[test]
fn score_without_data_says_when_the_training_files_changed() {
    let tmp = tempfile::tempdir().unwrap();
    let data = demo(tmp.path(), 40);
    let run = tmp.path().join("run");
    assert_eq!(quick_fit(&data, &run, &[]).status.code(), Some(0));
    let labels = tmp.path().join("labels.parquet");
    let score = || ncclean(&["score", "--checkpoint", p(&run), "--out", p(&labels)]);
    let said = "changed since fit";
    let out = score();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && !err.contains(said), "{err}");
    let other = tmp.path().join("other");
    ok(&["demo", "--out", p(&other), "--pairs", "40", "--seed", "1"]);
    std::fs::copy(other.join("demo.parquet"), &data).unwrap();
    let out = score();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && err.contains(said), "{err}");
}

/// `report` reads its pictures back from the training files by row: when
/// those files changed since `fit`, it says so (issue #34, item 10).
#[test]
fn report_says_when_the_training_files_changed() {
    let tmp = tempfile::tempdir().unwrap();
    let data = demo(tmp.path(), 40);
    let run = tmp.path().join("run");
    assert_eq!(quick_fit(&data, &run, &[]).status.code(), Some(0));
    let report = || ncclean(&["report", p(&run)]);
    let said = "changed since fit";
    let out = report();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && !err.contains(said), "{err}");
    let other = tmp.path().join("other");
    ok(&["demo", "--out", p(&other), "--pairs", "40", "--seed", "1"]);
    std::fs::copy(other.join("demo.parquet"), &data).unwrap();
    let out = report();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && err.contains(said), "{err}");
}
