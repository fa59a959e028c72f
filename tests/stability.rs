//! A pair's `clean_prob` is a property of the pair and the checkpoint
//! (issue #32): scoring a file, a shuffled copy of it and a 10% subset
//! gives every shared pair the same `clean_prob` (within 1e-3), for every
//! method. Curation users re-shard, filter and re-score their data: a pair
//! must not flip from clean to noisy because its neighbours in the file
//! changed.

mod common;

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;

use arrow_array::{RecordBatch, UInt32Array};
use common::{noisy_demo_of, ok, p};
use ncclean::data::read_labels;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;

/// Copy rows `rows` of `src` (in that order) to `dst`, in row groups of 97.
fn take_rows(src: &Path, dst: &Path, rows: &[u32]) {
    let reader = ParquetRecordBatchReaderBuilder::try_new(File::open(src).unwrap())
        .unwrap()
        .build()
        .unwrap();
    let batches: Vec<RecordBatch> = reader.map(|b| b.unwrap()).collect();
    let all = arrow_select::concat::concat_batches(&batches[0].schema(), &batches).unwrap();
    let idx = UInt32Array::from(rows.to_vec());
    let columns = all
        .columns()
        .iter()
        .map(|c| arrow_select::take::take(c.as_ref(), &idx, None).unwrap())
        .collect();
    let out = RecordBatch::try_new(all.schema(), columns).unwrap();
    let mut w = ArrowWriter::try_new(File::create(dst).unwrap(), out.schema(), None).unwrap();
    let mut start = 0;
    while start < out.num_rows() {
        let len = 97.min(out.num_rows() - start);
        w.write(&out.slice(start, len)).unwrap();
        start += len;
    }
    w.close().unwrap();
}

fn clean_probs(labels: &Path) -> HashMap<String, f32> {
    let (rows, _) = read_labels(labels).unwrap();
    rows.into_iter()
        .map(|l| (l.key, l.clean_prob.expect("scored")))
        .collect()
}

/// Fit `method` briefly, then score the file, a shuffled copy and a 10%
/// subset, and compare every shared pair.
fn check(method: &str, extra: &[&str]) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let data = noisy_demo_of(dir, 600);
    let run = dir.join("run");
    let mut args = vec![
        "fit",
        p(&data),
        "--method",
        method,
        "--out-dir",
        p(&run),
        "--seed",
        "0",
        "--epochs",
        "3",
        "--warmup-epochs",
        "1",
        "--lr",
        "3e-3",
        "--set",
        "lr_decay_epochs=[]",
    ];
    args.extend_from_slice(extra);
    ok(&args);
    // A fixed permutation (multiplier coprime with 600) and every tenth row
    // of it.
    let n = 600u32;
    let shuffled: Vec<u32> = (0..n).map(|i| (i * 7 + 13) % n).collect();
    let subset: Vec<u32> = shuffled.iter().step_by(10).copied().collect();
    let copies = [("shuffled", shuffled), ("subset", subset)];
    let score = |file: &Path, name: &str| {
        let out = dir.join(format!("{name}-labels.parquet"));
        ok(&["score", p(file), "--checkpoint", p(&run), "--out", p(&out)]);
        clean_probs(&out)
    };
    let whole = score(&data, "whole");
    for (name, rows) in copies {
        let file = dir.join(format!("{name}.parquet"));
        take_rows(&data, &file, &rows);
        let other = score(&file, name);
        assert_eq!(
            other.len(),
            rows.len(),
            "{method} {name}: one label per row"
        );
        let (mut worst, mut worst_key) = (0.0f32, String::new());
        for (key, q) in &other {
            let d = (whole[key] - q).abs();
            if d > worst {
                (worst, worst_key) = (d, key.clone());
            }
        }
        assert!(
            worst <= 1e-3,
            "{method}: pair {worst_key} moves by {worst} between the whole file and its {name} copy"
        );
    }
}

#[test]
fn vanilla_labels_do_not_depend_on_the_other_rows() {
    check("vanilla", &[]);
}

#[test]
fn esc_labels_do_not_depend_on_the_other_rows() {
    check("esc", &[]);
}

#[test]
fn gsc_labels_do_not_depend_on_the_other_rows() {
    check("gsc", &[]);
}

#[test]
fn crcl_labels_do_not_depend_on_the_other_rows() {
    check(
        "crcl",
        &[
            "--set",
            "params.pieces=[1, 2]",
            "--set",
            "params.freeze_epochs=0",
        ],
    );
}

#[test]
fn recon_labels_do_not_depend_on_the_other_rows() {
    check("recon", &["--set", "division_shuffles=1"]);
}
