//! `filter` joins labels to data by key (issue #14 items 1, 2, 6, 9, 10):
//! reordered and resharded copies filter to the same rows, labels re-saved
//! by other tools are read, outputs carry namespaced label columns, and
//! duplicate or missing keys are refused with what to do.
//!
//! Labels are written by hand here (the library's writer), so no model is
//! trained: what is tested is the join, not the scores.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Float32Type;
use arrow_array::{
    Array, ArrayRef, BinaryArray, DictionaryArray, Float64Array, Int64Array, LargeStringArray,
    RecordBatch, StringArray,
};
use arrow_schema::{Field, Schema};
use common::{ncclean, ok, p};
use ncclean::data::{read_labels, write_labels, ColumnOptions, InputSet, LabelRow, RowStatus};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;

const ROWS: usize = 60;

fn write_parquet(path: &Path, columns: Vec<(&str, ArrayRef)>) {
    let fields: Vec<Field> = columns
        .iter()
        .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
        .collect();
    let batch = RecordBatch::try_new(
        Arc::new(Schema::new(fields)),
        columns.into_iter().map(|(_, a)| a).collect(),
    )
    .unwrap();
    let mut w = ArrowWriter::try_new(File::create(path).unwrap(), batch.schema(), None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

fn key_of(i: usize) -> String {
    format!("s{i:03}")
}

/// Rows `ids` as a parquet shard: jpg bytes (not decoded by filter),
/// caption, key (or none with `keyed = false`). Row 7 has no image.
fn shard(path: &Path, ids: &[usize], keyed: bool) {
    let jpg: BinaryArray = ids
        .iter()
        .map(|&i| (i != 7).then(|| format!("img{i}").into_bytes()))
        .collect();
    let caption = StringArray::from_iter_values(ids.iter().map(|i| format!("caption {i}")));
    let mut cols: Vec<(&str, ArrayRef)> =
        vec![("jpg", Arc::new(jpg)), ("caption", Arc::new(caption))];
    if keyed {
        let key = StringArray::from_iter_values(ids.iter().map(|&i| key_of(i)));
        cols.push(("key", Arc::new(key)));
    }
    write_parquet(path, cols);
}

/// The label of row `i`: every third row noisy, row 7 skipped.
fn label(i: usize, key: String, file: &str, row: usize) -> LabelRow {
    let skipped = i == 7;
    LabelRow {
        key,
        source_file: file.into(),
        source_row: row as u64,
        clean_prob: (!skipped).then_some(i as f32 / 100.0),
        soft_label: (!skipped).then_some(1.0 - i as f32 / 100.0),
        similarity: (!skipped).then_some(0.5),
        is_clean: !skipped && !i.is_multiple_of(3),
        status: if skipped {
            RowStatus::Skipped
        } else {
            RowStatus::Ok
        },
        error: skipped.then(|| "image is null".to_string()),
    }
}

fn clean_keys() -> BTreeSet<String> {
    (0..ROWS)
        .filter(|&i| i != 7 && i % 3 != 0)
        .map(key_of)
        .collect()
}

/// Data as `score` saw it: a.parquet rows 0..30, b.parquet rows 30..60, and
/// its labels with the input fingerprint; returns (data files, labels).
fn original(dir: &Path, keyed: bool) -> (Vec<PathBuf>, PathBuf) {
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let a = data.join("a.parquet");
    let b = data.join("b.parquet");
    shard(&a, &(0..30).collect::<Vec<_>>(), keyed);
    shard(&b, &(30..ROWS).collect::<Vec<_>>(), keyed);
    let labels: Vec<LabelRow> = (0..ROWS)
        .map(|i| {
            let (file, stem, row) = if i < 30 {
                (&a, "a", i)
            } else {
                (&b, "b", i - 30)
            };
            let key = if keyed {
                key_of(i)
            } else {
                format!("{stem}:{row}")
            };
            label(i, key, &file.display().to_string(), row)
        })
        .collect();
    let set = InputSet::open(&[a.clone(), b.clone()], &ColumnOptions::default()).unwrap();
    let meta = BTreeMap::from([(
        "ncclean.input_fingerprint".to_string(),
        set.fingerprint().unwrap(),
    )]);
    let path = dir.join("labels.parquet");
    write_labels(&path, &labels, &meta).unwrap();
    (vec![a, b], path)
}

/// Every row of a parquet file: (column name → array) of the concatenation.
fn read_all(path: &Path) -> (RecordBatch, BTreeMap<String, String>) {
    let b = ParquetRecordBatchReaderBuilder::try_new(File::open(path).unwrap()).unwrap();
    let meta = b
        .metadata()
        .file_metadata()
        .key_value_metadata()
        .map(|kv| {
            kv.iter()
                .map(|k| (k.key.clone(), k.value.clone().unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default();
    let schema = b.schema().clone();
    let batches: Vec<RecordBatch> = b.build().unwrap().map(|b| b.unwrap()).collect();
    (
        arrow_select::concat::concat_batches(&schema, &batches).unwrap(),
        meta,
    )
}

fn strings(batch: &RecordBatch, name: &str) -> Vec<String> {
    let c = batch
        .column_by_name(name)
        .unwrap_or_else(|| panic!("no column {name}"));
    let c = c.as_string::<i32>();
    (0..c.len()).map(|i| c.value(i).to_string()).collect()
}

fn filter(data: &[&str], labels: &Path, out: &Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["filter"];
    args.extend_from_slice(data);
    args.extend_from_slice(&["--labels", p(labels), "--out", p(out)]);
    args.extend_from_slice(extra);
    ncclean(&args)
}

/// The stderr of a run that must have exited with `code`.
fn failed(out: &std::process::Output, code: i32) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(code), "{err}");
    err
}

fn succeeded(out: &std::process::Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Issue #14 item 1: the same file names with the rows reversed. Matching
/// by file and row kept the rows the labels call noisy and the row without
/// an image; by key, exactly the clean rows are kept, each with its own
/// clean_prob.
#[test]
fn reversed_rows_under_the_same_names_keep_exactly_the_clean_keys() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, labels) = original(tmp.path(), true);
    let copy = tmp.path().join("copy");
    std::fs::create_dir_all(&copy).unwrap();
    shard(
        &copy.join("a.parquet"),
        &(0..30).rev().collect::<Vec<_>>(),
        true,
    );
    shard(
        &copy.join("b.parquet"),
        &(30..ROWS).rev().collect::<Vec<_>>(),
        true,
    );
    let out = tmp.path().join("filtered.parquet");
    let log = succeeded(&filter(&[p(&copy)], &labels, &out, &[]));
    assert!(log.contains("fingerprint differs"), "{log}");
    let (batch, meta) = read_all(&out);
    let keys = strings(&batch, "key");
    assert_eq!(keys.iter().cloned().collect::<BTreeSet<_>>(), clean_keys());
    assert_eq!(keys.len(), clean_keys().len());
    // Each row carries its own label's clean_prob and soft_label.
    let prob = batch
        .column_by_name("ncclean_clean_prob")
        .unwrap()
        .as_primitive::<Float32Type>();
    let soft = batch
        .column_by_name("ncclean_soft_label")
        .unwrap()
        .as_primitive::<Float32Type>();
    for (r, k) in keys.iter().enumerate() {
        let i: usize = k[1..].parse().unwrap();
        assert_eq!(prob.value(r), i as f32 / 100.0, "{k}");
        assert_eq!(soft.value(r), 1.0 - i as f32 / 100.0, "{k}");
    }
    assert_eq!(
        meta.get("ncclean.filter.fingerprint").map(String::as_str),
        Some("differs")
    );
}

/// Resharded: other names, other row counts, shuffled order.
#[test]
fn resharded_copy_filters_to_the_same_rows() {
    let tmp = tempfile::tempdir().unwrap();
    let (files, labels) = original(tmp.path(), true);
    let one = tmp.path().join("one.parquet");
    let log = succeeded(&filter(&[p(&files[0]), p(&files[1])], &labels, &one, &[]));
    assert!(log.contains("fingerprint verified"), "{log}");
    let re = tmp.path().join("re");
    std::fs::create_dir_all(&re).unwrap();
    let order: Vec<usize> = (0..ROWS).map(|i| (i * 37) % ROWS).collect();
    shard(&re.join("part-0.parquet"), &order[..17], true);
    shard(&re.join("part-1.parquet"), &order[17..41], true);
    shard(&re.join("part-2.parquet"), &order[41..], true);
    let two = tmp.path().join("two.parquet");
    succeeded(&filter(&[p(&re)], &labels, &two, &[]));
    let sorted = |path: &Path| {
        let mut k = strings(&read_all(path).0, "key");
        k.sort();
        k
    };
    assert_eq!(sorted(&one), clean_keys().into_iter().collect::<Vec<_>>());
    assert_eq!(sorted(&two), sorted(&one));
}

/// Without a key column rows are keyed by position, which only the same
/// bytes make safe.
#[test]
fn positional_keys_need_the_same_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let (files, labels) = original(tmp.path(), false);
    let out = tmp.path().join("f.parquet");
    succeeded(&filter(&[p(&files[0]), p(&files[1])], &labels, &out, &[]));
    assert_eq!(read_all(&out).0.num_rows(), clean_keys().len());
    let copy = tmp.path().join("copy");
    std::fs::create_dir_all(&copy).unwrap();
    shard(
        &copy.join("a.parquet"),
        &(0..30).rev().collect::<Vec<_>>(),
        false,
    );
    shard(
        &copy.join("b.parquet"),
        &(30..ROWS).collect::<Vec<_>>(),
        false,
    );
    let res = filter(&[p(&copy)], &labels, &tmp.path().join("g.parquet"), &[]);
    let err = failed(&res, 3);
    assert!(err.contains("60 rows have no key of their own"), "{err}");
    assert!(err.contains("--key-col"), "{err}");
    assert!(!tmp.path().join("g.parquet").exists());
}

/// Issue #14 item 2: labels re-saved by pandas/polars (large strings,
/// dictionaries, doubles, signed rows) under the names before the prefix.
#[test]
fn labels_resaved_by_other_tools_are_read() {
    let tmp = tempfile::tempdir().unwrap();
    let (files, labels) = original(tmp.path(), true);
    let (rows, _) = read_labels(&labels).unwrap();
    let resaved = tmp.path().join("resaved.parquet");
    let src: DictionaryArray<arrow_array::types::Int32Type> =
        rows.iter().map(|r| r.source_file.as_str()).collect();
    write_parquet(
        &resaved,
        vec![
            (
                "key",
                Arc::new(LargeStringArray::from_iter_values(
                    rows.iter().map(|r| &r.key),
                )),
            ),
            ("source_file", Arc::new(src)),
            (
                "source_row",
                Arc::new(Int64Array::from_iter_values(
                    rows.iter().map(|r| r.source_row as i64),
                )),
            ),
            (
                "clean_prob",
                Arc::new(Float64Array::from_iter(
                    rows.iter().map(|r| r.clean_prob.map(f64::from)),
                )),
            ),
            (
                "soft_label",
                Arc::new(Float64Array::from_iter(
                    rows.iter().map(|r| r.soft_label.map(f64::from)),
                )),
            ),
            (
                "similarity",
                Arc::new(Float64Array::from_iter(
                    rows.iter().map(|r| r.similarity.map(f64::from)),
                )),
            ),
            (
                "is_clean",
                Arc::new(arrow_array::BooleanArray::from_iter(
                    rows.iter().map(|r| Some(r.is_clean)),
                )),
            ),
            (
                "status",
                Arc::new(LargeStringArray::from_iter_values(
                    rows.iter().map(|r| r.status.as_str()),
                )),
            ),
            (
                "error",
                Arc::new(LargeStringArray::from_iter(
                    rows.iter().map(|r| r.error.as_deref()),
                )),
            ),
        ],
    );
    let (back, _) = read_labels(&resaved).unwrap();
    assert_eq!(back, rows);
    let out = tmp.path().join("f.parquet");
    succeeded(&filter(&[p(&files[0]), p(&files[1])], &resaved, &out, &[]));
    assert_eq!(read_all(&out).0.num_rows(), clean_keys().len());
}

/// Issue #14 item 6: label columns are namespaced, `--all-rows` writes
/// every row with the decision and the reason.
#[test]
fn all_rows_carry_namespaced_labels_and_the_decision() {
    let tmp = tempfile::tempdir().unwrap();
    let (files, labels) = original(tmp.path(), true);
    let (lb, _) = read_all(&labels);
    let names: Vec<String> = lb
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    assert_eq!(
        names,
        [
            "key",
            "ncclean_source_file",
            "ncclean_source_row",
            "ncclean_clean_prob",
            "ncclean_soft_label",
            "ncclean_similarity",
            "ncclean_is_clean",
            "ncclean_status",
            "ncclean_error"
        ]
    );
    let out = tmp.path().join("all.parquet");
    succeeded(&filter(
        &[p(&files[0]), p(&files[1])],
        &labels,
        &out,
        &["--all-rows"],
    ));
    let (batch, _) = read_all(&out);
    assert_eq!(batch.num_rows(), ROWS);
    let keys = strings(&batch, "key");
    let keep = batch.column_by_name("ncclean_keep").unwrap().as_boolean();
    for (r, k) in keys.iter().enumerate() {
        assert_eq!(keep.value(r), clean_keys().contains(k), "{k}");
    }
    let r7 = keys.iter().position(|k| k == "s007").unwrap();
    assert_eq!(strings(&batch, "ncclean_status")[r7], "skipped");
    let err = batch
        .column_by_name("ncclean_error")
        .unwrap()
        .as_string::<i32>();
    assert_eq!(err.value(r7), "image is null");
    assert!(batch
        .column_by_name("ncclean_clean_prob")
        .unwrap()
        .is_null(r7));
    // A tar has no place for the label columns.
    let res = filter(
        &[p(&files[0]), p(&files[1])],
        &labels,
        &tmp.path().join("all.tar"),
        &["--all-rows", "--format", "tar"],
    );
    assert!(failed(&res, 2).contains("--all-rows writes parquet"));
}

/// Issue #14 items 1 and 9: duplicate keys in labels or data, and rows
/// without a label, are refused with counts, examples and what to do.
#[test]
fn duplicate_and_missing_keys_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let (files, labels) = original(tmp.path(), true);
    let (rows, meta) = read_labels(&labels).unwrap();
    let dup: Vec<LabelRow> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| LabelRow {
            key: key_of(i % 10),
            ..r.clone()
        })
        .collect();
    let dup_path = tmp.path().join("dup.parquet");
    write_labels(&dup_path, &dup, &meta).unwrap();
    let out = tmp.path().join("f.parquet");
    let res = filter(&[p(&files[0]), p(&files[1])], &dup_path, &out, &[]);
    let err = failed(&res, 3);
    assert!(
        err.contains("the labels hold 60 rows but only 10 distinct keys"),
        "{err}"
    );

    let part = tmp.path().join("part.parquet");
    write_labels(&part, &rows[..50], &meta).unwrap();
    let res = filter(&[p(&files[0]), p(&files[1])], &part, &out, &[]);
    let err = failed(&res, 3);
    assert!(
        err.contains("10 of the 60 input rows have no label (e.g. keys \"s050\""),
        "{err}"
    );
    assert!(err.contains("Score this data first"), "{err}");

    let twice = tmp.path().join("twice");
    std::fs::create_dir_all(&twice).unwrap();
    shard(
        &twice.join("x.parquet"),
        &(0..ROWS).collect::<Vec<_>>(),
        true,
    );
    shard(&twice.join("y.parquet"), &[3, 4], true);
    let res = filter(&[p(&twice)], &labels, &out, &[]);
    let err = failed(&res, 3);
    assert!(
        err.contains("2 input rows repeat a key another row has (e.g. \"s003\", \"s004\")"),
        "{err}"
    );
    assert!(!out.exists());
}

/// A DataComp-style uid: 32 hex digits.
fn uid_of(i: usize) -> String {
    format!("{:032x}", (i as u128 * 0x9e3779b97f4a7c15) << 3)
}

/// Rows `ids` (images `i<id>`, captions `c<id>`) keyed by column
/// `key_col` holding `key`.
fn pool_shard(path: &Path, ids: &[usize], key_col: &str, key: ArrayRef) {
    let jpg = BinaryArray::from_iter_values(ids.iter().map(|i| format!("i{i}")));
    let caption = StringArray::from_iter_values(ids.iter().map(|i| format!("c{i}")));
    write_parquet(
        path,
        vec![
            ("jpg", Arc::new(jpg)),
            ("caption", Arc::new(caption)),
            (key_col, key),
        ],
    );
}

/// Rows `ids` as a DataComp-like shard keyed by `uid`.
fn uid_shard(path: &Path, ids: &[usize]) {
    let uids = StringArray::from_iter_values(ids.iter().map(|&i| uid_of(i)));
    pool_shard(path, ids, "uid", Arc::new(uids));
}

/// Labels of rows `ids` keyed by uid, the even ones clean; returns their path.
fn uid_labels(dir: &Path, ids: &[usize]) -> PathBuf {
    let labels: Vec<LabelRow> = ids
        .iter()
        .map(|&i| LabelRow {
            is_clean: i % 2 == 0,
            ..label(i, uid_of(i), "pool.parquet", i)
        })
        .collect();
    let lp = dir.join("labels.parquet");
    write_labels(&lp, &labels, &BTreeMap::new()).unwrap();
    lp
}

/// `--uids-out` with `--out-dir` writes the uids of every filtered shard,
/// those an earlier run finished included: the same file as one `--out`
/// over the same rows. Split between workers it is refused with what to do.
#[test]
fn uids_out_with_out_dir_covers_every_shard() {
    let tmp = tempfile::tempdir().unwrap();
    let ids: Vec<usize> = (0..20).collect();
    let shards = tmp.path().join("shards");
    std::fs::create_dir_all(&shards).unwrap();
    uid_shard(&shards.join("a.parquet"), &ids[..12]);
    uid_shard(&shards.join("b.parquet"), &ids[12..]);
    let lp = uid_labels(tmp.path(), &ids);
    let one = tmp.path().join("one.npy");
    let key = ["--key-col", "uid", "--uids-out"];
    let mut args = key.to_vec();
    args.push(p(&one));
    succeeded(&filter(
        &[p(&shards)],
        &lp,
        &tmp.path().join("f.parquet"),
        &args,
    ));
    let dir = tmp.path().join("out");
    let many = tmp.path().join("many.npy");
    let run = |extra: &[&str]| {
        let mut a = vec![
            "filter",
            p(&shards),
            "--labels",
            p(&lp),
            "--out-dir",
            p(&dir),
        ];
        a.extend_from_slice(&key);
        a.push(p(&many));
        a.extend_from_slice(extra);
        ncclean(&a)
    };
    // Worker 0 of 2 filters a.parquet only, and may not write uids.
    let res = run(&["--num-shards", "2", "--shard-index", "0"]);
    let err = failed(&res, 2);
    assert!(err.contains("without --num-shards"), "{err}");
    let mut worker = vec![
        "filter",
        p(&shards),
        "--labels",
        p(&lp),
        "--out-dir",
        p(&dir),
    ];
    worker.extend_from_slice(&[
        "--key-col",
        "uid",
        "--num-shards",
        "2",
        "--shard-index",
        "0",
    ]);
    succeeded(&ncclean(&worker));
    assert!(!dir.join("b.parquet").exists());
    // The run without workers finishes b.parquet and writes every shard's uids.
    let log = succeeded(&run(&[]));
    assert!(log.contains("1 filtered now, 1 already done"), "{log}");
    assert!(log.contains("wrote 10 uids"), "{log}");
    let (a, b) = (std::fs::read(&one).unwrap(), std::fs::read(&many).unwrap());
    assert_eq!(a, b);
    // Ten 16-byte uids after the header.
    assert_eq!(b.len() % 16, 0);
}

/// DataComp subset export: numpy loads the kept uids, sorted.
#[test]
fn uids_out_writes_the_datacomp_subset() {
    let have_numpy = std::process::Command::new("python3")
        .args(["-c", "import numpy"])
        .status()
        .is_ok_and(|s| s.success());
    if !have_numpy {
        println!("skipped: python3 with numpy is not available");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("pool.parquet");
    let ids: Vec<usize> = (0..20).collect();
    uid_shard(&data, &ids);
    let lp = uid_labels(tmp.path(), &ids);
    let npy = tmp.path().join("subset.npy");
    let log = succeeded(&filter(
        &[p(&data)],
        &lp,
        &tmp.path().join("f.parquet"),
        &["--uids-out", p(&npy)],
    ));
    assert!(log.contains("fingerprint not checked"), "{log}");
    let script = "import sys, numpy as np\n\
                  a = np.load(sys.argv[1], allow_pickle=False)\n\
                  assert a.dtype == np.dtype('u8,u8')\n\
                  print(' '.join('%016x%016x' % (int(x), int(y)) for x, y in a))";
    let out = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(&npy)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut want: Vec<String> = ids
        .iter()
        .filter(|&&i| i % 2 == 0)
        .map(|&i| uid_of(i))
        .collect();
    want.sort();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), want.join(" "));
}

/// Issue #14 item 9: `fit` refuses data whose keys repeat before training,
/// and `inspect` reports them.
#[test]
fn fit_refuses_and_inspect_reports_duplicate_keys() {
    let tmp = tempfile::tempdir().unwrap();
    let demo = common::demo(&tmp.path().join("demo"), 200);
    let (batch, _) = read_all(&demo);
    let key_at = batch.schema().index_of("key").unwrap();
    let mut cols: Vec<ArrayRef> = batch.columns().to_vec();
    cols[key_at] = Arc::new(StringArray::from_iter_values(
        (0..batch.num_rows()).map(|i| format!("k{}", i % 20)),
    ));
    let dup = tmp.path().join("dup.parquet");
    let batch = RecordBatch::try_new(batch.schema(), cols).unwrap();
    let mut w = ArrowWriter::try_new(File::create(&dup).unwrap(), batch.schema(), None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();

    let v: serde_json::Value =
        serde_json::from_str(ok(&["inspect", p(&dup), "--no-decode", "--json"]).trim()).unwrap();
    assert_eq!(v["duplicate_keys"], 180);
    assert_eq!(v["distinct_keys"], 20);

    let run = tmp.path().join("run");
    let res = common::quick_fit(&dup, &run, &[]);
    let err = failed(&res, 3);
    assert!(
        err.contains("200 rows have only 20 distinct keys (e.g. \"k0\""),
        "{err}"
    );
    assert!(err.contains("--key-col"), "{err}");
    assert!(!run.join("labels.parquet").exists());
}

/// Every cell of column `name` as text, whatever arrow type the writer
/// chose for it (polars writes large strings and binaries where arrow-rs
/// writes small ones), so two engines' outputs compare by value.
#[cfg(feature = "polars")]
fn cells(batch: &RecordBatch, name: &str) -> Vec<Option<String>> {
    use arrow_schema::DataType;
    let c = batch
        .column_by_name(name)
        .unwrap_or_else(|| panic!("no column {name}"));
    (0..c.len())
        .map(|i| {
            (!c.is_null(i)).then(|| match c.data_type() {
                DataType::Utf8 => c.as_string::<i32>().value(i).to_string(),
                DataType::LargeUtf8 => c.as_string::<i64>().value(i).to_string(),
                DataType::Utf8View => c.as_string_view().value(i).to_string(),
                DataType::Binary => format!("{:?}", c.as_binary::<i32>().value(i)),
                DataType::LargeBinary => format!("{:?}", c.as_binary::<i64>().value(i)),
                DataType::BinaryView => format!("{:?}", c.as_binary_view().value(i)),
                DataType::Float32 => c.as_primitive::<Float32Type>().value(i).to_string(),
                DataType::Int64 => c
                    .as_primitive::<arrow_array::types::Int64Type>()
                    .value(i)
                    .to_string(),
                DataType::Boolean => c.as_boolean().value(i).to_string(),
                other => panic!("column {name}: no comparison for {other}"),
            })
        })
        .collect()
}

/// The two outputs hold the same columns in the same order, and the same
/// values row by row.
#[cfg(feature = "polars")]
fn assert_same_table(native: &Path, polars: &Path) {
    let (a, meta_a) = read_all(native);
    let (b, meta_b) = read_all(polars);
    let names = |r: &RecordBatch| -> Vec<String> {
        r.schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect()
    };
    assert_eq!(names(&a), names(&b));
    assert_eq!(a.num_rows(), b.num_rows());
    for n in names(&a) {
        assert_eq!(cells(&a, &n), cells(&b, &n), "column {n}");
    }
    for k in ["ncclean.filter.rule", "ncclean.filter.fingerprint"] {
        assert_eq!(meta_a.get(k), meta_b.get(k), "{k}");
        assert!(meta_b.contains_key(k), "{k}");
    }
}

/// `--engine polars` (a polars scan, key join and streaming sink) writes
/// the table the default engine writes: for a resharded, shuffled copy,
/// under the labels' is_clean, a cut rule and --all-rows, and when a file
/// filtered before (which carries the label columns) is filtered again.
#[cfg(feature = "polars")]
#[test]
fn polars_engine_writes_what_the_native_engine_writes() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, labels) = original(tmp.path(), true);
    let re = tmp.path().join("re");
    std::fs::create_dir_all(&re).unwrap();
    let order: Vec<usize> = (0..ROWS).map(|i| (i * 37) % ROWS).collect();
    shard(&re.join("part-0.parquet"), &order[..17], true);
    shard(&re.join("part-1.parquet"), &order[17..41], true);
    shard(&re.join("part-2.parquet"), &order[41..], true);
    for (case, extra) in [
        ("is_clean", &[][..]),
        ("cut", &["--min-prob", "0.3"][..]),
        ("all", &["--all-rows"][..]),
    ] {
        let native = tmp.path().join(format!("{case}-native.parquet"));
        let polars = tmp.path().join(format!("{case}-polars.parquet"));
        succeeded(&filter(&[p(&re)], &labels, &native, extra));
        let mut with_engine = extra.to_vec();
        with_engine.extend_from_slice(&["--engine", "polars"]);
        succeeded(&filter(&[p(&re)], &labels, &polars, &with_engine));
        assert_same_table(&native, &polars);
    }
    // One output per shard (--out-dir) from one labels file.
    for engine in ["native", "polars"] {
        let dir = tmp.path().join(format!("dir-{engine}"));
        let out = ncclean(&[
            "filter",
            p(&re),
            "--labels",
            p(&labels),
            "--out-dir",
            p(&dir),
            "--engine",
            engine,
        ]);
        succeeded(&out);
    }
    for part in ["part-0", "part-1", "part-2"] {
        let file = format!("{part}.parquet");
        assert_same_table(
            &tmp.path().join("dir-native").join(&file),
            &tmp.path().join("dir-polars").join(&file),
        );
    }
    let kept = read_all(&tmp.path().join("cut-polars.parquet")).0;
    let mut want: Vec<Option<String>> = (30..ROWS).map(|i| Some(key_of(i))).collect();
    let mut got = cells(&kept, "key");
    want.sort();
    got.sort();
    assert_eq!(got, want);

    // Filtered again: the label columns it carries are replaced, not doubled.
    let once = tmp.path().join("is_clean-native.parquet");
    let native = tmp.path().join("again-native.parquet");
    let polars = tmp.path().join("again-polars.parquet");
    succeeded(&filter(
        &[p(&once)],
        &labels,
        &native,
        &["--min-prob", "0.5"],
    ));
    succeeded(&filter(
        &[p(&once)],
        &labels,
        &polars,
        &["--min-prob", "0.5", "--engine", "polars"],
    ));
    assert_same_table(&native, &polars);
    assert!(read_all(&polars).0.num_rows() > 0);
}

/// Integer keys join the labels' decimal strings in both engines, and the
/// polars engine refuses, with the way out, what it cannot join: rows
/// without a key column.
#[cfg(feature = "polars")]
#[test]
fn polars_engine_casts_integer_keys_and_refuses_positional_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("ints.parquet");
    let ids: Vec<usize> = (0..ROWS).rev().collect();
    let keys = Int64Array::from_iter_values(ids.iter().map(|&i| i as i64));
    pool_shard(&data, &ids, "key", Arc::new(keys));
    let labels: Vec<LabelRow> = (0..ROWS)
        .map(|i| label(i, i.to_string(), "ints.parquet", ROWS - 1 - i))
        .collect();
    let lp = tmp.path().join("labels.parquet");
    write_labels(&lp, &labels, &BTreeMap::new()).unwrap();
    let native = tmp.path().join("native.parquet");
    let polars = tmp.path().join("polars.parquet");
    succeeded(&filter(&[p(&data)], &lp, &native, &[]));
    succeeded(&filter(&[p(&data)], &lp, &polars, &["--engine", "polars"]));
    assert_same_table(&native, &polars);
    assert_eq!(read_all(&polars).0.num_rows(), clean_keys().len());

    let (files, positional) = original(&tmp.path().join("nokey"), false);
    let out = tmp.path().join("none.parquet");
    let res = filter(
        &[p(&files[0]), p(&files[1])],
        &positional,
        &out,
        &["--engine", "polars"],
    );
    let err = failed(&res, 2);
    assert!(err.contains("joins on a key column"), "{err}");
    assert!(err.contains("leave out --engine polars"), "{err}");
    assert!(!out.exists());
}

/// A build without the `polars` feature says how to get one.
#[cfg(not(feature = "polars"))]
#[test]
fn polars_engine_needs_the_polars_build() {
    let tmp = tempfile::tempdir().unwrap();
    let (files, labels) = original(tmp.path(), true);
    let out = tmp.path().join("f.parquet");
    let res = filter(
        &[p(&files[0]), p(&files[1])],
        &labels,
        &out,
        &["--engine", "polars"],
    );
    common::snapshot::assert_snapshot("filter_engine_polars_without_feature", &res, tmp.path());
    assert!(!out.exists());
}

/// What the polars engine cannot read is refused, and nothing is left
/// behind: shards with other columns (in the default engine's words) and a
/// damaged page, which the default engine reads around (exit 4, the rows
/// of that row group missing) and polars cannot (exit 1, pointing to it).
#[cfg(feature = "polars")]
#[test]
fn polars_engine_refuses_mixed_and_damaged_shards_without_output() {
    let tmp = tempfile::tempdir().unwrap();
    let (files, labels) = original(tmp.path(), true);
    let odd = tmp.path().join("odd");
    std::fs::create_dir_all(&odd).unwrap();
    shard(&odd.join("a.parquet"), &(0..30).collect::<Vec<_>>(), true);
    let ids: Vec<usize> = (30..ROWS).collect();
    let column = |f: &dyn Fn(usize) -> String| -> ArrayRef {
        Arc::new(StringArray::from_iter_values(ids.iter().map(|&i| f(i))))
    };
    write_parquet(
        &odd.join("b.parquet"),
        vec![
            (
                "jpg",
                Arc::new(BinaryArray::from_iter_values(
                    ids.iter().map(|i| format!("img{i}")),
                )),
            ),
            ("caption", column(&|i| format!("caption {i}"))),
            ("key", column(&key_of)),
            ("extra", column(&|i| i.to_string())),
        ],
    );
    let out = tmp.path().join("f.parquet");
    let native = filter(&[p(&odd)], &labels, &out, &[]);
    let polars = filter(&[p(&odd)], &labels, &out, &["--engine", "polars"]);
    let last = |e: String| e.lines().last().unwrap_or_default().to_string();
    let (native, polars) = (last(failed(&native, 3)), last(failed(&polars, 3)));
    assert!(polars.contains("have different columns"), "{polars}");
    assert_eq!(polars, native);

    common::hostile::corrupt_page(&files[1], 0, "jpg");
    let res = filter(
        &[p(&files[0]), p(&files[1])],
        &labels,
        &out,
        &["--engine", "polars"],
    );
    let err = failed(&res, 1);
    assert!(
        err.contains("polars could not filter the 2 input file(s)"),
        "{err}"
    );
    assert!(err.contains("leave out --engine polars"), "{err}");
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.') || n.starts_with("f."))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    failed(
        &filter(&[p(&files[0]), p(&files[1])], &labels, &out, &[]),
        4,
    );
}
