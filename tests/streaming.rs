//! `score` streams a file larger than one scoring block (two passes, one
//! block in memory) and labels it bit for bit as `fit`, which scores the
//! file whole; shards whose columns differ are refused before training.

mod common;

use std::path::{Path, PathBuf};

use common::hostile::rewrite;
use common::{ncclean, ok, p, quick_fit};
use ncclean::data::{read_labels, LabelRow};

/// Rows of the one big file: two scoring blocks of 65,536-pair blocks.
const ROWS: usize = 70_000;

/// Every field of a label row, floats by their bits.
type Bits = (
    String,
    String,
    u64,
    Option<u32>,
    Option<u32>,
    Option<u32>,
    bool,
    Option<String>,
);

fn bits(labels: &[LabelRow]) -> Vec<Bits> {
    labels
        .iter()
        .map(|l| {
            (
                l.key.clone(),
                l.source_file.clone(),
                l.source_row,
                l.clean_prob.map(f32::to_bits),
                l.soft_label.map(f32::to_bits),
                l.similarity.map(f32::to_bits),
                l.is_clean,
                l.error.clone(),
            )
        })
        .collect()
}

/// `pairs` demo pairs of 8-float embeddings in two shards under `out`.
fn embedding_shards(out: &Path, pairs: usize) {
    ok(&[
        "demo",
        "--out",
        p(out),
        "--pairs",
        &pairs.to_string(),
        "--embedding-dim",
        "8",
        "--shards",
        "2",
        "--seed",
        "0",
    ]);
}

/// One file of [`ROWS`] embedding pairs, every 997th caption emptied (an
/// unusable row, so blocks and stretches of rows differ).
fn big_file(dir: &Path) -> PathBuf {
    let demo = dir.join("demo");
    ok(&[
        "demo",
        "--out",
        p(&demo),
        "--pairs",
        &ROWS.to_string(),
        "--embedding-dim",
        "8",
        "--seed",
        "2",
    ]);
    let src = std::fs::read_dir(&demo)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "parquet"))
        .expect("demo wrote a parquet file");
    let data = dir.join("data");
    std::fs::create_dir(&data).unwrap();
    let big = data.join("big.parquet");
    rewrite(&src, &big, 10_000, false, |col, row, v| {
        if col == "caption" && row % 997 == 5 {
            String::new()
        } else {
            v.to_string()
        }
    });
    std::fs::remove_dir_all(&demo).unwrap();
    big
}

#[test]
fn score_streams_a_file_of_two_blocks_and_labels_it_as_fit_does() {
    let dir = tempfile::tempdir().unwrap();
    let big = big_file(dir.path());
    let run = dir.path().join("run");
    let out = quick_fit(&big, &run, &["--method", "vanilla"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (fitted, _) = read_labels(&run.join("labels.parquet")).unwrap();
    assert_eq!(fitted.len(), ROWS);
    let skipped = fitted.iter().filter(|l| l.error.is_some()).count();
    assert_eq!(
        skipped,
        ROWS.div_ceil(997),
        "the emptied captions are skipped"
    );

    let labels = dir.path().join("labels.parquet");
    let printed = ok(&[
        "score",
        p(&big),
        "--checkpoint",
        p(&run),
        "--out",
        p(&labels),
    ]);
    let (scored, meta) = read_labels(&labels).unwrap();
    assert!(
        bits(&scored) == bits(&fitted),
        "score --out differs from fit's labels"
    );
    let v: serde_json::Value = serde_json::from_str(printed.trim()).unwrap();
    assert_eq!(v["rows"], ROWS);
    assert_eq!(v["skipped"], skipped);
    // The estimate is the mean of 1 - clean_prob over the usable pairs,
    // however many blocks they were scored in.
    let noise: f64 = fitted
        .iter()
        .filter_map(|l| l.clean_prob)
        .map(|p| 1.0 - f64::from(p))
        .sum::<f64>()
        / (ROWS - skipped) as f64;
    let written: f64 = meta["ncclean.estimated_noise_rate"].parse().unwrap();
    assert!((written - noise).abs() < 2e-6, "{written} vs {noise}");

    let shards = dir.path().join("shards");
    ok(&[
        "score",
        p(&big),
        "--checkpoint",
        p(&run),
        "--out-dir",
        p(&shards),
    ]);
    let (per_shard, _) = read_labels(&shards.join("big.parquet")).unwrap();
    assert!(
        bits(&per_shard) == bits(&fitted),
        "score --out-dir differs from fit's labels"
    );
}

#[test]
fn fit_refuses_shards_with_different_columns_before_training() {
    let dir = tempfile::tempdir().unwrap();
    let demo = dir.path().join("demo");
    embedding_shards(&demo, 400);
    let mut parts: Vec<PathBuf> = std::fs::read_dir(&demo)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "parquet"))
        .collect();
    parts.sort();
    assert_eq!(parts.len(), 2);
    // The second shard gains a column: its pair columns are unchanged.
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let (a, b) = (data.join("a.parquet"), data.join("b.parquet"));
    std::fs::copy(&parts[0], &a).unwrap();
    rewrite(&parts[1], &b, 1000, true, |_, _, v| v.to_string());

    let run = dir.path().join("run");
    let out = quick_fit(&data, &run, &["--method", "vanilla"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(
        err.contains(&format!(
            "{} and {} have different columns: column \"url\" of {} is missing from {}",
            a.display(),
            b.display(),
            b.display(),
            a.display()
        )),
        "{err}"
    );
    assert!(!err.contains("epoch 1"), "refused before training: {err}");
    assert!(!run.exists(), "nothing written");

    // score --filtered refuses them before scoring, too.
    let good = dir.path().join("good");
    let fitted = quick_fit(&a, &good, &["--method", "vanilla"]);
    assert!(fitted.status.success());
    let labels = dir.path().join("labels.parquet");
    let out = ncclean(&[
        "score",
        p(&data),
        "--checkpoint",
        p(&good),
        "--out",
        p(&labels),
        "--filtered",
        p(&dir.path().join("filtered.parquet")),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("have different columns"), "{err}");
    assert!(!labels.exists());
}

#[test]
fn fit_on_a_sample_trains_on_the_drawn_rows_of_every_file_and_records_them() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    embedding_shards(&data, 800);
    let fit = |name: &str, seed: &str| -> (Vec<(String, u64)>, serde_json::Value) {
        let run = dir.path().join(name);
        let out = quick_fit(
            &data,
            &run,
            &["--method", "vanilla", "--sample", "300", "--seed", seed],
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let (labels, _) = read_labels(&run.join("labels.parquet")).unwrap();
        let rows = labels
            .iter()
            .map(|l| (l.source_file.clone(), l.source_row))
            .collect();
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(run.join("run.json")).unwrap()).unwrap();
        (rows, json)
    };
    let (rows, json) = fit("a", "5");
    assert_eq!(rows.len(), 300);
    assert_eq!(json["sample"]["rows"], 300);
    assert_eq!(json["sample"]["of_rows"], 800);
    assert_eq!(json["sample"]["seed"], 5);
    let files: std::collections::BTreeSet<&String> = rows.iter().map(|r| &r.0).collect();
    assert_eq!(files.len(), 2, "drawn from both files");
    let (again, _) = fit("b", "5");
    assert_eq!(again, rows, "same seed, same sample");
    let (other, _) = fit("c", "6");
    assert_ne!(other, rows, "another seed, another sample");
    // filtered.parquet keeps drawn rows only; score labels every row.
    let clean = dir.path().join("a").join("filtered.parquet");
    let kept =
        parquet::file::reader::SerializedFileReader::new(std::fs::File::open(clean).unwrap())
            .map(|r| {
                parquet::file::reader::FileReader::metadata(&r)
                    .file_metadata()
                    .num_rows()
            })
            .unwrap();
    assert!(kept > 0 && kept <= 300, "{kept}");
    let labels = dir.path().join("all.parquet");
    ok(&[
        "score",
        p(&data),
        "--checkpoint",
        p(&dir.path().join("a")),
        "--out",
        p(&labels),
    ]);
    assert_eq!(read_labels(&labels).unwrap().0.len(), 800);
    // At least 2 rows.
    let out = quick_fit(&data, &dir.path().join("d"), &["--sample", "1"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--sample must be at least 2"));
}

/// `(key, clean_prob, soft_label)` of every row of a filtered parquet file.
fn filtered_rows(path: &Path) -> Vec<(String, Option<f32>, Option<f32>)> {
    use arrow_array::{Array, Float32Array, StringArray};
    let f = std::fs::File::open(path).unwrap();
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(f)
        .unwrap()
        .build()
        .unwrap();
    let mut out = Vec::new();
    for b in reader {
        let b = b.unwrap();
        let col = |name: &str| {
            b.column_by_name(name)
                .unwrap_or_else(|| panic!("no {name}"))
        };
        let keys = col("key")
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap()
            .clone();
        let f32s = |name: &str| {
            col(name)
                .as_any()
                .downcast_ref::<Float32Array>()
                .unwrap()
                .clone()
        };
        let (cp, sl) = (f32s("ncclean_clean_prob"), f32s("ncclean_soft_label"));
        for i in 0..b.num_rows() {
            let v = |a: &Float32Array| (!a.is_null(i)).then(|| a.value(i));
            out.push((keys.value(i).to_string(), v(&cp), v(&sl)));
        }
    }
    out
}

#[test]
fn score_filtered_carries_each_kept_rows_label_values_across_shards() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    embedding_shards(&data, 400);
    let run = dir.path().join("run");
    let fitted = quick_fit(&data, &run, &["--method", "vanilla"]);
    assert!(
        fitted.status.success(),
        "{}",
        String::from_utf8_lossy(&fitted.stderr)
    );
    for refit in [false, true] {
        let labels = dir.path().join(format!("labels-{refit}.parquet"));
        let filtered = dir.path().join(format!("filtered-{refit}.parquet"));
        let mut args = vec![
            "score",
            p(&data),
            "--checkpoint",
            p(&run),
            "--out",
            p(&labels),
            "--filtered",
            p(&filtered),
            // The demo embeddings are clean: the default cut may keep
            // every pair. Keep half, so the filtered file tells kept rows
            // from dropped ones.
            "--keep-fraction",
            "0.5",
        ];
        if refit {
            args.push("--refit");
        }
        ok(&args);
        let (rows, _) = read_labels(&labels).unwrap();
        let expected: Vec<(String, Option<f32>, Option<f32>)> = rows
            .iter()
            .filter(|l| l.is_clean)
            .map(|l| (l.key.clone(), l.clean_prob, l.soft_label))
            .collect();
        let files: std::collections::BTreeSet<&str> = rows
            .iter()
            .filter(|l| l.is_clean)
            .map(|l| l.source_file.as_str())
            .collect();
        assert_eq!(files.len(), 2, "kept rows from both shards");
        assert!(expected.len() > 100 && expected.len() < 400);
        assert_eq!(filtered_rows(&filtered), expected, "refit {refit}");
    }
}
