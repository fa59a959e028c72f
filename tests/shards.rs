//! Many shards, many workers: `score --out-dir` with `--num-shards`, a
//! worker killed mid-way and resumed, and the union of per-shard labels
//! against one process scoring everything; `filter --out-dir`; the Ray
//! driver (skipped with a message when `ray` cannot be imported).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{ncclean, ok, p, quick_fit};
use ncclean::data::{read_labels, LabelRow};

const SHARDS: usize = 8;
const ROWS_PER_SHARD: usize = 2500;

/// 8 embedding shards and a one-epoch checkpoint trained on them.
fn shards_and_run(dir: &Path) -> (PathBuf, PathBuf) {
    let data = dir.join("data");
    ok(&[
        "demo",
        "--out",
        p(&data),
        "--pairs",
        &(SHARDS * ROWS_PER_SHARD).to_string(),
        "--embedding-dim",
        "16",
        "--shards",
        &SHARDS.to_string(),
        "--seed",
        "4",
    ]);
    let run = dir.join("run");
    let out = quick_fit(&data, &run, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (data, run)
}

/// A label row with its floats as bits: key, file, row, clean_prob,
/// soft_label, is_clean.
type LabelBits = (String, String, u64, Option<u32>, Option<u32>, bool);

/// Labels as comparable values: floats by their bits.
fn rows(labels: &[LabelRow]) -> Vec<LabelBits> {
    labels
        .iter()
        .map(|l| {
            (
                l.key.clone(),
                l.source_file.clone(),
                l.source_row,
                l.clean_prob.map(f32::to_bits),
                l.soft_label.map(f32::to_bits),
                l.is_clean,
            )
        })
        .collect()
}

/// Every per-shard labels file in `dir`, in shard order, concatenated.
fn union(dir: &Path) -> Vec<LabelRow> {
    let mut all = Vec::new();
    for k in 0..SHARDS {
        let f = dir.join(format!("demo-{k:05}.parquet"));
        assert!(dir.join(format!("demo-{k:05}.done.json")).is_file(), "{k}");
        all.extend(read_labels(&f).unwrap().0);
    }
    all
}

fn worker(data: &Path, run: &Path, labels: &Path, index: usize) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ncclean"));
    c.args([
        "score",
        p(data),
        "--checkpoint",
        p(run),
        "--out-dir",
        p(labels),
        "--num-shards",
        "2",
        "--shard-index",
        &index.to_string(),
    ]);
    c
}

fn summary(out: &std::process::Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON summary on stdout")
}

#[test]
fn two_workers_one_killed_and_resumed_label_every_row_once_as_one_process_does() {
    let tmp = tempfile::tempdir().unwrap();
    let (data, run) = shards_and_run(tmp.path());
    let labels = tmp.path().join("labels");

    // Worker 0 is killed (SIGKILL) as soon as its first shard is complete.
    let mut w0 = worker(&data, &run, &labels, 0)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let first = labels.join("demo-00000.done.json");
    let started = Instant::now();
    while !first.exists() && started.elapsed() < Duration::from_secs(300) {
        if w0.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = w0.kill();
    w0.wait().unwrap();
    let done_before = (0..SHARDS)
        .step_by(2)
        .filter(|k| labels.join(format!("demo-{k:05}.done.json")).exists())
        .count();
    assert!(
        done_before >= 1,
        "worker 0 finished no shard before the kill"
    );
    // Worker 1 runs to the end; then worker 0 is started again.
    let s1 = summary(&worker(&data, &run, &labels, 1).output().unwrap());
    assert_eq!(
        (s1["done"].as_u64(), s1["shards"].as_u64()),
        (Some(4), Some(4))
    );
    let s0 = summary(&worker(&data, &run, &labels, 0).output().unwrap());
    println!("worker 0 had {done_before} of 4 shards done when killed");
    assert_eq!(s0["already_done"].as_u64(), Some(done_before as u64));
    assert_eq!(s0["done"].as_u64(), Some(4 - done_before as u64));
    // Nothing but outputs and markers is left (no temporaries of the kill).
    let mut names: Vec<String> = std::fs::read_dir(&labels)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names.len(), 2 * SHARDS, "{names:?}");

    // Every row labelled exactly once, identical to one process over all
    // shards, and to fit's own labels.
    let union = union(&labels);
    let mut keys: Vec<(&str, u64)> = union
        .iter()
        .map(|l| (l.source_file.as_str(), l.source_row))
        .collect();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), SHARDS * ROWS_PER_SHARD);
    let one = tmp.path().join("one.parquet");
    ok(&["score", p(&data), "--checkpoint", p(&run), "--out", p(&one)]);
    let (single, meta) = read_labels(&one).unwrap();
    assert_eq!(rows(&union), rows(&single));
    assert_eq!(union, single);
    let (fitted, fit_meta) = read_labels(&run.join("labels.parquet")).unwrap();
    assert_eq!(fitted, single, "score reproduces fit's labels");
    for k in ["ncclean.estimated_noise_rate", "ncclean.input_fingerprint"] {
        assert_eq!(meta.get(k), fit_meta.get(k), "{k}");
    }

    // A rerun skips everything; a changed shard is redone, alone.
    let s = summary(&ncclean(&[
        "score",
        p(&data),
        "--checkpoint",
        p(&run),
        "--out-dir",
        p(&labels),
    ]));
    assert_eq!(
        (s["done"].as_u64(), s["already_done"].as_u64()),
        (Some(0), Some(8))
    );
    assert_eq!(s["rows"].as_u64(), Some((SHARDS * ROWS_PER_SHARD) as u64));
    std::fs::copy(
        data.join("demo-00001.parquet"),
        data.join("demo-00000.parquet"),
    )
    .unwrap();
    let s = summary(&ncclean(&[
        "score",
        p(&data),
        "--checkpoint",
        p(&run),
        "--out-dir",
        p(&labels),
    ]));
    assert_eq!(
        (s["done"].as_u64(), s["already_done"].as_u64()),
        (Some(1), Some(7))
    );
}

#[test]
fn filter_out_dir_writes_one_filtered_shard_per_input_and_the_same_rows_as_one_file() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    ok(&[
        "demo",
        "--out",
        p(&data),
        "--pairs",
        "900",
        "--embedding-dim",
        "8",
        "--shards",
        "3",
    ]);
    let run = tmp.path().join("run");
    assert!(quick_fit(&data, &run, &[]).status.success());
    let labels = tmp.path().join("labels");
    let clean = tmp.path().join("clean");
    summary(&ncclean(&[
        "score",
        p(&data),
        "--checkpoint",
        p(&run),
        "--out-dir",
        p(&labels),
    ]));
    let filter = |labels: &Path, out: &[&str]| {
        let mut args = vec![
            "filter",
            p(&data),
            "--labels",
            p(labels),
            "--keep-fraction",
            "0.6",
        ];
        args.extend_from_slice(out);
        summary(&ncclean(&args))
    };
    let s = filter(&labels, &["--out-dir", p(&clean)]);
    assert_eq!(s["done"].as_u64(), Some(3));
    let one = tmp.path().join("one.parquet");
    let s1 = filter(&run.join("labels.parquet"), &["--out", p(&one)]);
    assert_eq!(s["rows_out"], s1["rows_out"]);
    // The per-shard files hold as many rows as the one file.
    let rows_of = |f: &Path| -> i64 {
        use parquet::file::reader::{FileReader, SerializedFileReader};
        let r = SerializedFileReader::new(std::fs::File::open(f).unwrap()).unwrap();
        r.metadata().file_metadata().num_rows()
    };
    let per_shard: i64 = (0..3)
        .map(|k| rows_of(&clean.join(format!("demo-{k:05}.parquet"))))
        .sum();
    assert_eq!(per_shard, rows_of(&one));
    assert_eq!(Some(per_shard as u64), s1["rows_out"].as_u64());
    // Same labels and rule: skipped; another rule: redone.
    assert_eq!(
        filter(&labels, &["--out-dir", p(&clean)])["already_done"].as_u64(),
        Some(3)
    );
    let mut args = vec![
        "filter",
        p(&data),
        "--labels",
        p(&labels),
        "--min-prob",
        "0.2",
    ];
    args.extend_from_slice(&["--out-dir", p(&clean)]);
    assert_eq!(summary(&ncclean(&args))["done"].as_u64(), Some(3));
}

#[test]
fn work_splitting_flags_say_what_is_wrong() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    ok(&[
        "demo",
        "--out",
        p(&data),
        "--pairs",
        "40",
        "--embedding-dim",
        "4",
        "--shards",
        "2",
    ]);
    let run = tmp.path().join("run");
    assert!(quick_fit(&data, &run, &[]).status.success());
    let out_dir = tmp.path().join("labels");
    let run_score = |extra: &[&str]| {
        let mut args = vec!["score", "--checkpoint", p(&run)];
        args.extend_from_slice(extra);
        let o = ncclean(&args);
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (code, err) = run_score(&[
        p(&data),
        "--out-dir",
        p(&out_dir),
        "--num-shards",
        "2",
        "--shard-index",
        "2",
    ]);
    assert_eq!(code, Some(2));
    assert!(err.contains("--shard-index 2 is out of range"), "{err}");
    let (code, err) = run_score(&[
        p(&data),
        "--out",
        p(&tmp.path().join("x.parquet")),
        "--num-shards",
        "2",
    ]);
    assert_eq!(code, Some(2));
    assert!(err.contains("need --out-dir"), "{err}");
    let (code, err) = run_score(&[
        "--out-dir",
        p(&out_dir),
        "--files-from",
        p(&tmp.path().join("none.txt")),
    ]);
    assert_eq!(code, Some(3));
    assert!(err.contains("cannot open it"), "{err}");
    // --files-from alone (no DATA) names the shards.
    let list = tmp.path().join("list.txt");
    std::fs::write(
        &list,
        format!("{}\n", data.join("demo-00001.parquet").display()),
    )
    .unwrap();
    let (code, err) = run_score(&["--out-dir", p(&out_dir), "--files-from", p(&list)]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out_dir.join("demo-00001.done.json").is_file());
    assert!(!out_dir.join("demo-00000.parquet").exists());
    // The output directory may not be where the shards are.
    let (code, err) = run_score(&[p(&data), "--out-dir", p(&data)]);
    assert_eq!(code, Some(2));
    assert!(err.contains("would be read as inputs"), "{err}");
}

#[test]
fn the_ray_driver_scores_every_shard_and_writes_a_summary() {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let has_ray = Command::new(&python)
        .args(["-c", "import ray"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_ray {
        eprintln!(
            "################################################################\n\
             SKIPPED the_ray_driver_scores_every_shard_and_writes_a_summary: \
             `{python} -c 'import ray'` failed (install it with `python3 -m pip install ray`)\n\
             ################################################################"
        );
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    ok(&[
        "demo",
        "--out",
        p(&data),
        "--pairs",
        "1600",
        "--embedding-dim",
        "8",
        "--shards",
        "8",
    ]);
    let out = tmp.path().join("out");
    let driver = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/ray_score.py");
    let run_driver = || {
        let o = Command::new(&python)
            .arg(&driver)
            .args([
                "--ncclean",
                env!("CARGO_BIN_EXE_ncclean"),
                "--num-cpus",
                "2",
            ])
            .args([
                "--fit-shards",
                "4",
                "--fit-sample",
                "300",
                "--fit-args=--epochs 1 --warmup-epochs 1",
            ])
            .arg("--out")
            .arg(&out)
            .arg(&data)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let s: serde_json::Value =
            serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap();
        s
    };
    let s = run_driver();
    assert_eq!(s["shards"].as_u64(), Some(8));
    assert_eq!(s["rows"].as_u64(), Some(1600));
    assert_eq!(s["skipped_shards"].as_u64(), Some(0));
    assert_eq!(s["per_shard"].as_array().map(Vec::len), Some(8));
    // The fit trained on 300 rows drawn from its 4 shards (800 rows).
    assert_eq!(s["fit_sample"].as_u64(), Some(300));
    let run: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("run/run.json")).unwrap()).unwrap();
    assert_eq!(run["sample"]["rows"].as_u64(), Some(300));
    assert_eq!(run["sample"]["of_rows"].as_u64(), Some(800));
    // The union of the driver's labels is what one process writes.
    let mut union = Vec::new();
    for k in 0..8 {
        union.extend(
            read_labels(&out.join(format!("labels/demo-{k:05}.parquet")))
                .unwrap()
                .0,
        );
    }
    let one = tmp.path().join("one.parquet");
    ok(&[
        "score",
        p(&data),
        "--checkpoint",
        p(&out.join("run")),
        "--out",
        p(&one),
    ]);
    assert_eq!(union, read_labels(&one).unwrap().0);
    // Relaunched, it skips every completed shard.
    let s = run_driver();
    assert_eq!(s["skipped_shards"].as_u64(), Some(8));
}

/// 3 embedding shards `demo-0000{0,1,2}.parquet` plus an empty one (the
/// same columns, 0 rows) that sorts between them, and a checkpoint trained
/// on the three.
fn shards_with_an_empty_one(dir: &Path) -> (PathBuf, PathBuf) {
    let data = dir.join("data");
    ok(&[
        "demo",
        "--out",
        p(&data),
        "--pairs",
        "300",
        "--embedding-dim",
        "16",
        "--shards",
        "3",
    ]);
    let run = dir.join("run");
    let out = quick_fit(&data, &run, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let first = std::fs::File::open(data.join("demo-00000.parquet")).unwrap();
    let schema = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(first)
        .unwrap()
        .schema()
        .clone();
    let empty = std::fs::File::create(data.join("demo-00001-empty.parquet")).unwrap();
    parquet::arrow::ArrowWriter::try_new(empty, schema, None)
        .unwrap()
        .close()
        .unwrap();
    (data, run)
}

/// Issue #34 item 6: an empty shard (img2dataset writes one when every
/// download of a shard fails) is passed over with a warning by every
/// command, never the end of a multi-shard run.
#[test]
fn an_empty_shard_is_passed_over_with_a_warning_by_every_command() {
    let tmp = tempfile::tempdir().unwrap();
    let (data, run) = shards_with_an_empty_one(tmp.path());
    let warned = |out: &std::process::Output| {
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(0), "{err}");
        assert!(
            err.contains("demo-00001-empty.parquet: holds no rows (an empty shard"),
            "{err}"
        );
    };
    let out = ncclean(&["inspect", p(&data), "--json"]);
    warned(&out);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["rows"], 300);
    warned(&quick_fit(&data, &tmp.path().join("run2"), &[]));
    let scored = tmp.path().join("scored.parquet");
    warned(&ncclean(&[
        "score",
        p(&data),
        "--checkpoint",
        p(&run),
        "--out",
        p(&scored),
    ]));
    assert_eq!(read_labels(&scored).unwrap().0.len(), 300);
    let labels_dir = tmp.path().join("labels");
    let out = ncclean(&[
        "score",
        p(&data),
        "--checkpoint",
        p(&run),
        "--out-dir",
        p(&labels_dir),
    ]);
    warned(&out);
    for name in ["demo-00000", "demo-00001", "demo-00002"] {
        assert!(
            labels_dir.join(format!("{name}.parquet")).exists(),
            "{name}"
        );
    }
    assert!(!labels_dir.join("demo-00001-empty.parquet").exists());
    warned(&ncclean(&[
        "filter",
        p(&data),
        "--labels",
        p(&labels_dir),
        "--out-dir",
        p(&tmp.path().join("f")),
        "--min-prob",
        "0.5",
    ]));
    warned(&ncclean(&[
        "filter",
        p(&data),
        "--labels",
        p(&scored),
        "--out",
        p(&tmp.path().join("f.parquet")),
    ]));

    // Every shard empty: invalid input naming one.
    let only = tmp.path().join("only");
    std::fs::create_dir_all(&only).unwrap();
    std::fs::copy(
        data.join("demo-00001-empty.parquet"),
        only.join("e.parquet"),
    )
    .unwrap();
    let out = ncclean(&["inspect", p(&only)]);
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stderr).contains("e.parquet: has no rows"));
}

/// Issue #34 item 8: `score --out` and `filter --out` inside an input
/// directory are refused before any work (the next run would read the
/// output as one more shard); hidden names and other extensions are fine.
#[test]
fn outputs_inside_an_input_directory_are_refused_up_front() {
    let tmp = tempfile::tempdir().unwrap();
    let (data, run) = shards_with_an_empty_one(tmp.path());
    let glob = data.join("demo-*.parquet");
    for (args, flag) in [
        (
            vec!["score", p(&data), "--checkpoint", p(&run), "--out"],
            "--out",
        ),
        (
            vec!["score", p(&glob), "--checkpoint", p(&run), "--out"],
            "--out",
        ),
        (
            vec![
                "filter",
                p(&data),
                "--labels",
                p(&run.join("labels.parquet")),
                "--out",
            ],
            "--out",
        ),
    ] {
        let out_path = data.join("labels.parquet");
        let mut args = args.clone();
        args.push(p(&out_path));
        let out = ncclean(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(&format!(
                "{flag} {} is inside the input directory",
                out_path.display()
            )) && err.contains("write it outside that directory"),
            "{err}"
        );
        assert!(!out_path.exists());
    }
    // A hidden file is not read as a shard: accepted.
    ok(&[
        "score",
        p(&data),
        "--checkpoint",
        p(&run),
        "--out",
        p(&data.join(".labels.parquet")),
    ]);
}

/// Issue #34 item 10: a FIFO or a device given as DATA is named for what it
/// is (not "file is empty"), without waiting on it.
#[test]
fn a_fifo_or_device_as_data_is_named_for_what_it_is() {
    let tmp = tempfile::tempdir().unwrap();
    let fifo = tmp.path().join("pipe.parquet");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let fifo_tar = tmp.path().join("pipe.tar");
    assert!(Command::new("mkfifo")
        .arg(&fifo_tar)
        .status()
        .unwrap()
        .success());
    for (path, what) in [
        (
            Path::new("/dev/zero"),
            "is a character device, not a regular file",
        ),
        (fifo.as_path(), "is a named pipe (FIFO), not a regular file"),
        (
            fifo_tar.as_path(),
            "is a named pipe (FIFO), not a regular file",
        ),
    ] {
        let out = ncclean(&["inspect", p(path)]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{err}");
        assert!(err.contains(what) && !err.contains("empty"), "{err}");
    }
}

/// A completion marker carries its output's size and sha256: a truncated
/// labels file, or one shard's labels copied over another's, is scored
/// again on rerun instead of reported "already done" (issue #34, item 7).
#[test]
fn a_rerun_redoes_shards_whose_output_differs_from_its_marker() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    ok(&[
        "demo",
        "--out",
        p(&data),
        "--pairs",
        "1200",
        "--embedding-dim",
        "16",
        "--shards",
        "4",
        "--seed",
        "4",
    ]);
    let run = tmp.path().join("run");
    let fitted = quick_fit(&data, &run, &[]);
    assert!(
        fitted.status.success(),
        "{}",
        String::from_utf8_lossy(&fitted.stderr)
    );
    let labels = tmp.path().join("labels");
    let score = || {
        summary(&ncclean(&[
            "score",
            p(&data),
            "--checkpoint",
            p(&run),
            "--out-dir",
            p(&labels),
        ]))
    };
    assert_eq!(score()["done"], 4);
    let file = |k: usize| labels.join(format!("demo-{k:05}.parquet"));
    let before: Vec<Vec<LabelRow>> = (0..4).map(|k| read_labels(&file(k)).unwrap().0).collect();
    let bytes = std::fs::read(file(1)).unwrap();
    std::fs::write(file(1), &bytes[..bytes.len() / 2]).unwrap();
    std::fs::copy(file(3), file(2)).unwrap();
    let s = score();
    assert_eq!(
        (s["done"].as_u64(), s["already_done"].as_u64()),
        (Some(2), Some(2)),
        "{s}"
    );
    for (k, rows) in before.iter().enumerate() {
        assert_eq!(&read_labels(&file(k)).unwrap().0, rows, "shard {k}");
    }
    // Intact outputs are trusted: a third run redoes nothing.
    assert_eq!(score()["already_done"], 4);
}
