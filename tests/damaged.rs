//! Damaged parquet data end to end: a corrupt data page costs the rows of
//! its row group (labelled skipped with the file, row group and column), and
//! invalid UTF-8 costs only the rows that hold it. The hostile files are made
//! in each test from `ncclean demo` data, never committed.

mod common;

use std::fs::File;
use std::path::{Path, PathBuf};

use arrow_array::{Array, RecordBatch, StringArray};
use common::hostile::{corrupt_page, replace_bytes, rewrite, INVALID, MARKER};
use common::snapshot::assert_snapshot;
use common::{demo, ncclean, p, quick_fit as fit};
use ncclean::data::{read_labels, RowStatus};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

/// 120 demo pairs in row groups of 40 rows, with a `url` column.
fn shards(dir: &Path, edit: impl Fn(&str, usize, &str) -> String) -> PathBuf {
    let src = demo(&dir.join("src"), 120);
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let out = data.join("part-0.parquet");
    rewrite(&src, &out, 40, true, edit);
    out
}

fn keys_of(path: &Path) -> Vec<String> {
    let f = File::open(path).unwrap();
    let batches: Vec<RecordBatch> = ParquetRecordBatchReaderBuilder::try_new(f)
        .unwrap()
        .build()
        .unwrap()
        .map(|b| b.unwrap())
        .collect();
    let mut out = Vec::new();
    for b in batches {
        let c = b.column_by_name("key").unwrap();
        let s = c.as_any().downcast_ref::<StringArray>().unwrap();
        out.extend((0..s.len()).map(|i| s.value(i).to_string()));
    }
    out
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_corrupt_caption_page_skips_its_row_group_and_names_it() {
    let tmp = tempfile::tempdir().unwrap();
    let data = shards(tmp.path(), |_, _, v| v.to_string());
    corrupt_page(&data, 1, "caption");

    // inspect sees every row, the row group's 40 unusable, and warns once.
    let out = ncclean(&["inspect", p(&data)]);
    assert_snapshot("inspect_corrupt_caption_page", &out, tmp.path());
    let out = ncclean(&["inspect", p(&data), "--json", "--no-decode"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (v["rows"].as_u64(), v["unusable"].as_u64()),
        (Some(120), Some(40))
    );

    // fit labels every row: rows 40-79 skipped with the reason, the rest scored.
    let run = tmp.path().join("run");
    let out = fit(&data, &run, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let err = stderr(&out);
    assert_eq!(err.matches("warning: row group 1 of").count(), 1, "{err}");
    let (labels, meta) = read_labels(&run.join("labels.parquet")).unwrap();
    assert_eq!(labels.len(), 120);
    assert_eq!(meta.get("ncclean.skipped").map(String::as_str), Some("40"));
    for (i, l) in labels.iter().enumerate() {
        assert_eq!(l.source_row, i as u64);
        if (40..80).contains(&i) {
            assert_eq!(l.status, RowStatus::Skipped, "{l:?}");
            let e = l.error.as_deref().unwrap_or("");
            assert!(
                e.starts_with("row group 1 of ")
                    && e.contains("part-0.parquet could not be read (column \"caption\": "),
                "{e}"
            );
            assert_eq!(l.key, format!("part-0:{i}"));
        } else {
            assert_eq!(l.status, RowStatus::Ok, "{l:?}");
        }
    }
    // The filtered copy holds the clean rows; the damaged row group has none.
    let clean: Vec<String> = labels
        .iter()
        .filter(|l| l.is_clean)
        .map(|l| l.key.clone())
        .collect();
    assert_eq!(keys_of(&run.join("filtered.parquet")), clean);

    // 40 of 120 is over --max-skipped 0.2: a partial result, outputs written.
    let out = fit(&data, &tmp.path().join("run2"), &["--max-skipped", "0.2"]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(tmp.path().join("run2/labels.parquet").exists());

    // `score` reads the same way.
    let scored = tmp.path().join("scored.parquet");
    let out = ncclean(&[
        "score",
        p(&data),
        "--checkpoint",
        p(&run),
        "--out",
        p(&scored),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(read_labels(&scored).unwrap().0, labels);

    // `corrupt` needs every row: exit 3 naming file, row group and column.
    let out = ncclean(&[
        "corrupt",
        p(&data),
        "--rate",
        "0.2",
        "--out",
        p(&tmp.path().join("noisy.parquet")),
    ]);
    assert_snapshot("corrupt_corrupt_caption_page", &out, tmp.path());
}

#[test]
fn invalid_utf8_captions_skip_only_their_rows() {
    let tmp = tempfile::tempdir().unwrap();
    let data = shards(tmp.path(), |col, row, v| {
        if col == "caption" && (row == 3 || row == 50) {
            format!("{v} {MARKER}")
        } else {
            v.to_string()
        }
    });
    assert_eq!(replace_bytes(&data, MARKER.as_bytes(), INVALID), 2);

    let out = ncclean(&["inspect", p(&data), "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (v["rows"].as_u64(), v["unusable"].as_u64()),
        (Some(120), Some(2))
    );
    assert_eq!(
        v["unusable_reasons"]["caption is not valid UTF-8"], 2,
        "{v}"
    );

    let run = tmp.path().join("run");
    let out = fit(&data, &run, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let (labels, _) = read_labels(&run.join("labels.parquet")).unwrap();
    assert_eq!(labels.len(), 120);
    for (i, l) in labels.iter().enumerate() {
        if i == 3 || i == 50 {
            assert_eq!(l.status, RowStatus::Skipped);
            assert_eq!(l.error.as_deref(), Some("caption is not valid UTF-8"));
        } else {
            assert_eq!(l.status, RowStatus::Ok, "{l:?}");
        }
    }
    // The filtered copy keeps the clean rows of the row groups that hold the
    // bad captions: they are read back around them.
    let clean: Vec<String> = labels
        .iter()
        .filter(|l| l.is_clean)
        .map(|l| l.key.clone())
        .collect();
    assert_eq!(keys_of(&run.join("filtered.parquet")), clean);
    // Every usable row, including those beside the bad captions.
    let all = tmp.path().join("all.parquet");
    let out = ncclean(&[
        "filter",
        p(&data),
        "--labels",
        p(&run.join("labels.parquet")),
        "--min-prob",
        "0",
        "--out",
        p(&all),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let usable: Vec<String> = labels
        .iter()
        .filter(|l| l.status == RowStatus::Ok)
        .map(|l| l.key.clone())
        .collect();
    assert_eq!(keys_of(&all), usable);
}

/// Damage in a column that only the filtered copy reads: the labels are
/// complete, the copy lacks the rows it cannot read back, and the run is a
/// partial result (exit 4) that says so.
#[test]
fn damage_outside_the_pair_columns_costs_only_the_filtered_copy() {
    let tmp = tempfile::tempdir().unwrap();
    let data = shards(tmp.path(), |col, row, v| {
        if col == "url" && row == 100 {
            format!("{v}{MARKER}")
        } else {
            v.to_string()
        }
    });
    assert_eq!(replace_bytes(&data, MARKER.as_bytes(), INVALID), 1);
    corrupt_page(&data, 0, "url");

    let run = tmp.path().join("run");
    let out = fit(&data, &run, &[]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let (labels, meta) = read_labels(&run.join("labels.parquet")).unwrap();
    assert_eq!(labels.len(), 120);
    assert_eq!(meta.get("ncclean.skipped").map(String::as_str), Some("0"));
    let kept: Vec<String> = labels
        .iter()
        .filter(|l| l.is_clean && l.source_row >= 40 && l.source_row != 100)
        .map(|l| l.key.clone())
        .collect();
    assert_eq!(keys_of(&run.join("filtered.parquet")), kept);
    let stats: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("stats.json")).unwrap()).unwrap();
    let clean = labels.iter().filter(|l| l.is_clean).count();
    assert_eq!(stats["filtered_dropped"], clean - kept.len());

    // `filter` behaves the same, and says which row groups and columns.
    let out = ncclean(&[
        "filter",
        p(&data),
        "--labels",
        p(&run.join("labels.parquet")),
        "--min-prob",
        "0",
        "--out",
        p(&tmp.path().join("all.parquet")),
    ]);
    assert_snapshot("filter_damage_outside_pair_columns", &out, tmp.path());
    assert_eq!(keys_of(&tmp.path().join("all.parquet")).len(), 79);
}
