//! Webdataset tar shards end to end: `fit`, `score`, `filter` and `inspect`
//! read them exactly as the same pairs in parquet, unusable members become
//! skipped rows with their reason, and filtered shards hold the clean
//! samples' members byte for byte. The shards are written in each test with
//! the `tar` crate from `ncclean demo` pairs, as img2dataset lays them out.

mod common;

use std::io::Read;
use std::path::{Path, PathBuf};

use common::{demo, ncclean, ok, p, quick_fit};
use ncclean::data::{read_labels, LabelRow, RowStatus};
use ncclean::synth::demo::{generate, DemoOptions};

/// A member: its name and bytes.
type Member = (String, Vec<u8>);

/// Samples of the demo pairs `range` as img2dataset writes them: image,
/// caption, metadata; `edit` may change or drop members.
fn demo_members(
    range: std::ops::Range<usize>,
    edit: impl Fn(usize, Member) -> Option<Member>,
) -> Vec<Member> {
    let pairs = generate(&DemoOptions {
        pairs: range.end,
        ..Default::default()
    });
    let mut out = Vec::new();
    for (i, pair) in pairs.into_iter().enumerate().skip(range.start) {
        let json =
            serde_json::json!({ "key": pair.key, "url": format!("https://example.com/{i}.png") });
        for m in [
            (format!("{}.png", pair.key), pair.image),
            (format!("{}.txt", pair.key), pair.caption.into_bytes()),
            (format!("{}.json", pair.key), json.to_string().into_bytes()),
        ] {
            out.extend(edit(i, m));
        }
    }
    out
}

fn write_tar(path: &Path, members: &[Member]) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut b = tar::Builder::new(std::fs::File::create(path).unwrap());
    for (name, data) in members {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_mtime(1_700_000_000);
        b.append_data(&mut h, name, data.as_slice()).unwrap();
    }
    b.into_inner().unwrap();
}

/// Every whole member of a tar, read with the `tar` crate (up to where a
/// truncated tar ends).
fn members_of(path: &Path) -> Vec<Member> {
    let mut a = tar::Archive::new(std::fs::File::open(path).unwrap());
    a.entries()
        .unwrap()
        .map_while(Result::ok)
        .filter_map(|mut e| {
            let name = e.path().unwrap().to_string_lossy().into_owned();
            let mut data = Vec::new();
            e.read_to_end(&mut data).unwrap();
            (data.len() as u64 == e.size()).then_some((name, data))
        })
        .collect()
}

fn labels(path: &Path) -> Vec<LabelRow> {
    read_labels(path).unwrap().0
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The members of the samples whose labels are clean, in shard order.
fn clean_members(shards: &[PathBuf], labels: &[LabelRow]) -> Vec<Member> {
    let mut want = Vec::new();
    for shard in shards {
        let name = shard.display().to_string();
        for m in members_of(shard) {
            let key = m.0.split('.').next().unwrap().to_string();
            if labels
                .iter()
                .any(|l| l.source_file == name && l.key == key && l.is_clean)
            {
                want.push(m);
            }
        }
    }
    want
}

#[test]
fn tar_shards_are_labelled_and_filtered_like_the_same_pairs_in_parquet() {
    let tmp = tempfile::tempdir().unwrap();
    let parquet = demo(&tmp.path().join("pq"), 120);
    let shards = [
        tmp.path().join("shards/00000.tar"),
        tmp.path().join("shards/00001.tar"),
    ];
    write_tar(&shards[0], &demo_members(0..70, |_, m| Some(m)));
    write_tar(&shards[1], &demo_members(70..120, |_, m| Some(m)));
    let glob = tmp.path().join("shards/*.tar");

    let v: serde_json::Value = serde_json::from_str(&ok(&["inspect", p(&glob), "--json"])).unwrap();
    assert_eq!(
        (v["rows"].clone(), v["unusable"].clone()),
        (120.into(), 0.into()),
        "{v}"
    );
    assert_eq!(v["files"][1]["rows"], 50);

    let run_pq = tmp.path().join("run-pq");
    let run_tar = tmp.path().join("run-tar");
    let out = quick_fit(&parquet, &run_pq, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = quick_fit(&glob, &run_tar, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let from_pq = labels(&run_pq.join("labels.parquet"));
    let from_tar = labels(&run_tar.join("labels.parquet"));
    // Division statistics are computed within each input file, so the same
    // pairs in one tar shard (not two) must label exactly as one parquet.
    let one_tar = tmp.path().join("one/all.tar");
    write_tar(&one_tar, &demo_members(0..120, |_, m| Some(m)));
    let run_one = tmp.path().join("run-one");
    let out = quick_fit(&one_tar, &run_one, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let from_one = labels(&run_one.join("labels.parquet"));

    // Same pairs, same labels; keys are the member keys, rows the samples.
    assert_eq!(from_tar.len(), 120);
    for (i, ((a, b), c)) in from_pq.iter().zip(&from_tar).zip(&from_one).enumerate() {
        assert_eq!(a.key, b.key);
        assert_eq!(a.key, c.key);
        assert_eq!(
            (a.clean_prob, a.is_clean),
            (c.clean_prob, c.is_clean),
            "row {i}"
        );
        let (shard, row) = if i < 70 { (0, i) } else { (1, i - 70) };
        assert_eq!(b.source_file, shards[shard].display().to_string());
        assert_eq!(b.source_row, row as u64);
    }
    assert!(from_tar.iter().any(|l| l.is_clean) && from_tar.iter().any(|l| !l.is_clean));

    // score reproduces fit's labels; --filtered FILE.tar holds the clean
    // samples' members, byte for byte.
    let scored = tmp.path().join("scored.parquet");
    let kept = tmp.path().join("kept.tar");
    ok(&[
        "score",
        p(&glob),
        "--checkpoint",
        p(&run_tar),
        "--out",
        p(&scored),
        "--filtered",
        p(&kept),
    ]);
    assert_eq!(labels(&scored), from_tar);
    let want = clean_members(&shards, &from_tar);
    assert_eq!(
        want.len(),
        3 * from_tar.iter().filter(|l| l.is_clean).count()
    );
    assert_eq!(members_of(&kept), want);

    // filter: tar by default for tar input, parquet when asked.
    let filtered = tmp.path().join("filtered");
    ok(&[
        "filter",
        p(&glob),
        "--labels",
        p(&scored),
        "--out",
        p(&filtered),
    ]);
    assert_eq!(members_of(&filtered), want);
    let as_parquet = tmp.path().join("filtered-pq");
    let out = ok(&[
        "filter",
        p(&glob),
        "--labels",
        p(&scored),
        "--out",
        p(&as_parquet),
        "--format",
        "parquet",
    ]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["rows_out"], want.len() / 3);
    let v: serde_json::Value =
        serde_json::from_str(&ok(&["inspect", p(&as_parquet), "--json", "--no-decode"])).unwrap();
    assert_eq!(v["rows"], want.len() / 3);
    assert_eq!(v["columns"]["image"], "image");

    // corrupt reads the shards as the table of key, image, caption, json.
    let noisy = tmp.path().join("noisy.parquet");
    ok(&[
        "corrupt",
        p(&glob),
        "--rate",
        "0.3",
        "--seed",
        "1",
        "--out",
        p(&noisy),
    ]);
    let v: serde_json::Value =
        serde_json::from_str(&ok(&["inspect", p(&noisy), "--json", "--no-decode"])).unwrap();
    assert_eq!(
        (v["rows"].clone(), v["unusable"].clone()),
        (120.into(), 0.into()),
        "{v}"
    );
    assert!(v["schema"].to_string().contains("noisy: Boolean"), "{v}");

    // A parquet input cannot be filtered to tar.
    let out = ncclean(&[
        "filter",
        p(&parquet),
        "--labels",
        p(&run_pq.join("labels.parquet")),
        "--out",
        p(&tmp.path().join("x.tar")),
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("tar output needs tar input"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn corrupt_members_and_a_truncated_shard_are_skipped_rows_with_reasons() {
    let tmp = tempfile::tempdir().unwrap();
    let shards = [
        tmp.path().join("shards/00000.tar"),
        tmp.path().join("shards/00001.tar"),
    ];
    // Shard 0: sample 5's image does not decode, sample 9 has no caption.
    write_tar(
        &shards[0],
        &demo_members(0..60, |i, (name, data)| match i {
            5 if name.ends_with(".png") => Some((name, b"not an image".to_vec())),
            9 if name.ends_with(".txt") => None,
            _ => Some((name, data)),
        }),
    );
    // Shard 1: cut inside the image of its 41st sample.
    write_tar(&shards[1], &demo_members(60..120, |_, m| Some(m)));
    let bytes = std::fs::read(&shards[1]).unwrap();
    let at = bytes
        .windows(15)
        .position(|w| w == b"demo-000100.png")
        .unwrap();
    std::fs::write(&shards[1], &bytes[..at + 512 + 100]).unwrap();

    let run = tmp.path().join("run");
    let out = quick_fit(&tmp.path().join("shards"), &run, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("the file ends inside member demo-000100.png after 100 of its"),
        "{}",
        stderr(&out)
    );
    let got = labels(&run.join("labels.parquet"));
    assert_eq!(
        got.len(),
        60 + 41,
        "every sample before the cut, and the cut one"
    );
    let skipped: Vec<(usize, &str)> = got
        .iter()
        .enumerate()
        .filter(|(_, l)| l.status == RowStatus::Skipped)
        .map(|(i, l)| (i, l.error.as_deref().unwrap_or("")))
        .collect();
    assert_eq!(skipped.len(), 3, "{skipped:?}");
    assert_eq!(skipped[0].0, 5);
    assert!(skipped[0].1.contains("decode"), "{skipped:?}");
    assert_eq!(skipped[1], (9, "no caption member (demo-000009.txt)"));
    assert_eq!(skipped[2].0, 100);
    assert!(
        skipped[2]
            .1
            .starts_with("member demo-000100.png is cut short: the file ends after 100 of its"),
        "{skipped:?}"
    );
    assert_eq!(got[100].key, "demo-000100");
    assert_eq!(
        (got[100].source_row, got[99].key.as_str()),
        (40, "demo-000099")
    );

    // The filtered shard holds the clean samples only, skipped ones never.
    let out_tar = tmp.path().join("clean.tar");
    ok(&[
        "filter",
        p(&tmp.path().join("shards")),
        "--labels",
        p(&run.join("labels.parquet")),
        "--out",
        p(&out_tar),
        "--format",
        "tar",
    ]);
    let kept = members_of(&out_tar);
    assert_eq!(kept, clean_members(&shards, &got));
    assert!(!kept
        .iter()
        .any(|(n, _)| n.starts_with("demo-000005.") || n.starts_with("demo-000100.")));
}

/// Issue #11's worker test on tar shards: 8 shards scored by 2 workers with
/// `--num-shards`, worker 0 killed (SIGKILL) once its first shard is done,
/// then rerun; every sample is labelled once and the union equals one
/// process scoring every shard, bit for bit. `filter --out-dir` keeps tar
/// shards as tar shards of the clean samples' members.
#[test]
fn tar_shards_split_over_killed_and_resumed_workers_as_one_process() {
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};
    const SHARDS: usize = 8;
    const SAMPLES: usize = 30;
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("tars");
    let shards: Vec<PathBuf> = (0..SHARDS)
        .map(|k| {
            let path = data.join(format!("shard-{k}.tar"));
            write_tar(
                &path,
                &demo_members(k * SAMPLES..(k + 1) * SAMPLES, |_, m| Some(m)),
            );
            path
        })
        .collect();
    let run = tmp.path().join("run");
    let out = quick_fit(&data, &run, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out_dir = tmp.path().join("labels");
    let worker = |index: usize| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_ncclean"));
        c.args(["score", p(&data), "--checkpoint", p(&run), "--out-dir"])
            .arg(&out_dir)
            .args(["--num-shards", "2", "--shard-index", &index.to_string()]);
        c
    };
    let marker = |k: usize| out_dir.join(format!("shard-{k}.done.json"));

    let mut w0 = worker(0)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while !marker(0).exists() && started.elapsed() < Duration::from_secs(300) {
        if w0.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let _ = w0.kill();
    w0.wait().unwrap();
    let done_before = (0..SHARDS)
        .step_by(2)
        .filter(|&k| marker(k).exists())
        .count();
    assert!(
        done_before >= 1,
        "worker 0 finished no shard before the kill"
    );
    for index in [1, 0] {
        let out = worker(index).output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let mut union = Vec::new();
    for k in 0..SHARDS {
        assert!(marker(k).is_file(), "shard {k} has no marker");
        union.extend(labels(&out_dir.join(format!("shard-{k}.parquet"))));
    }
    let mut seen: Vec<(String, u64)> = union
        .iter()
        .map(|l| (l.source_file.clone(), l.source_row))
        .collect();
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), SHARDS * SAMPLES, "every sample labelled once");
    let one = tmp.path().join("one.parquet");
    ok(&["score", p(&data), "--checkpoint", p(&run), "--out", p(&one)]);
    let single = labels(&one);
    type Bits = (String, u64, Option<u32>, Option<u32>, bool);
    let bits = |v: &[LabelRow]| -> Vec<Bits> {
        v.iter()
            .map(|l| {
                (
                    l.key.clone(),
                    l.source_row,
                    l.clean_prob.map(f32::to_bits),
                    l.soft_label.map(f32::to_bits),
                    l.is_clean,
                )
            })
            .collect()
    };
    assert_eq!(bits(&union), bits(&single));

    // Filtering per shard writes tar shards holding the clean samples.
    let filtered = tmp.path().join("filtered");
    ok(&[
        "filter",
        p(&data),
        "--labels",
        p(&out_dir),
        "--out-dir",
        p(&filtered),
    ]);
    for (k, shard) in shards.iter().enumerate() {
        let out = filtered.join(format!("shard-{k}.tar"));
        assert!(out.is_file(), "{} missing", out.display());
        let shard_labels = labels(&out_dir.join(format!("shard-{k}.parquet")));
        assert_eq!(
            members_of(&out),
            clean_members(std::slice::from_ref(shard), &shard_labels)
        );
    }
}

/// `score` without DATA on a run fitted on tar shards: the shards are read
/// again with the fit's `--caption-from` and `--key-from` (and no parquet
/// column flags, which tar input refuses), so the labels are fit's.
#[test]
fn score_without_data_reads_a_tar_run_as_fit_read_it() {
    let tmp = tempfile::tempdir().unwrap();
    // Captions only in KEY.json, keys from its `key` field.
    let with_json_captions = |_: usize, (name, data): Member| {
        if name.ends_with(".txt") {
            return None;
        }
        if name.ends_with(".json") {
            let key = name.trim_end_matches(".json");
            let caption = format!("a picture of sample {key}");
            let v = serde_json::json!({ "key": format!("k-{key}"), "caption": caption });
            return Some((name, v.to_string().into_bytes()));
        }
        Some((name, data))
    };
    write_tar(
        &tmp.path().join("shards/00000.tar"),
        &demo_members(0..60, with_json_captions),
    );
    let run = tmp.path().join("run");
    let out = quick_fit(
        &tmp.path().join("shards/00000.tar"),
        &run,
        &["--caption-from", "json:caption", "--key-from", "json:key"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let scored = tmp.path().join("scored.parquet");
    let out = ncclean(&["score", "--checkpoint", p(&run), "--out", p(&scored)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let (fitted, again) = (labels(&run.join("labels.parquet")), labels(&scored));
    assert_eq!(fitted.len(), 60);
    assert!(
        fitted.iter().all(|l| l.key.starts_with("k-")),
        "{:?}",
        fitted[0]
    );
    let view = |ls: &[LabelRow]| {
        ls.iter()
            .map(|l| (l.key.clone(), l.clean_prob, l.status))
            .collect::<Vec<_>>()
    };
    assert_eq!(view(&again), view(&fitted));
}

/// A ustar header block: `name` (under 100 bytes), `size` data bytes, type
/// `kind`, with its checksum.
fn raw_header(name: &str, size: u64, kind: u8) -> [u8; 512] {
    let mut h = [0u8; 512];
    h[..name.len()].copy_from_slice(name.as_bytes());
    h[100..107].copy_from_slice(b"0000644");
    h[124..135].copy_from_slice(format!("{size:011o}").as_bytes());
    h[136..147].copy_from_slice(b"00000000000");
    h[156] = kind;
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].fill(b' ');
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    h
}

/// Append an entry (header, data, padding) to a tar being built.
fn raw_entry(tar: &mut Vec<u8>, name: &str, data: &[u8], kind: u8) {
    tar.extend_from_slice(&raw_header(name, data.len() as u64, kind));
    tar.extend_from_slice(data);
    tar.resize(tar.len().div_ceil(512) * 512, 0);
}

/// Issue #34 item 2: a header with a bad checksum, a GNU long name and a
/// pax header over 1 MiB each cost only the members they hold; reading goes
/// on at the next valid header, and each lost stretch is a skipped row, so
/// `--max-skipped 0` fails.
#[test]
fn tar_damage_costs_only_its_members_each_lost_stretch_a_skipped_row() {
    let tmp = tempfile::tempdir().unwrap();
    let shard = tmp.path().join("shards/00000.tar");
    std::fs::create_dir_all(shard.parent().unwrap()).unwrap();
    let big = 1_100_000;
    let mut tar = Vec::new();
    for (name, data) in demo_members(0..20, |_, m| Some(m)) {
        if name == "demo-000012.png" {
            let mut long = "x/".repeat(big / 2).into_bytes();
            long.extend_from_slice(name.as_bytes());
            raw_entry(&mut tar, "././@LongLink", &long, b'L');
        }
        if name == "demo-000016.json" {
            let value = "v".repeat(big);
            let record = format!("comment={value}\n");
            // The length counts its own digits.
            let n = (1..20)
                .map(|d| record.len() + 1 + d)
                .find(|n| format!("{n} {record}").len() == *n)
                .unwrap();
            raw_entry(&mut tar, "pax", format!("{n} {record}").as_bytes(), b'x');
        }
        let at = tar.len();
        raw_entry(&mut tar, &name, &data, b'0');
        if name == "demo-000005.txt" {
            tar[at + 3] ^= 0x20;
        }
    }
    tar.extend_from_slice(&[0u8; 1024]);
    std::fs::write(&shard, &tar).unwrap();

    let run = tmp.path().join("run");
    let out = quick_fit(&shard, &run, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("checksum mismatch"),
        "{}",
        stderr(&out)
    );
    let got = labels(&run.join("labels.parquet"));
    // Every sample has its row, and each of the three stretches one more.
    assert_eq!(got.len(), 23, "{got:?}");
    for i in 0..20 {
        let key = format!("demo-{i:06}");
        let l = got.iter().find(|l| l.key == key).unwrap();
        let usable = !matches!(i, 5 | 12);
        assert_eq!(l.status == RowStatus::Ok, usable, "{l:?}");
    }
    let lost: Vec<&LabelRow> = got
        .iter()
        .filter(|l| l.key.starts_with("00000.tar@"))
        .collect();
    assert_eq!(lost.len(), 3, "{got:?}");
    for (l, why) in lost
        .iter()
        .zip(["checksum mismatch", "GNU long name", "pax header"])
    {
        assert_eq!(l.status, RowStatus::Skipped);
        let e = l.error.as_deref().unwrap();
        assert!(e.starts_with("bytes ") && e.contains(why), "{e}");
    }

    // Every lost member is a skipped row: --max-skipped 0 fails (exit 4).
    let out = quick_fit(&shard, &tmp.path().join("run0"), &["--max-skipped", "0"]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));

    // The filtered shard holds the clean samples' members only.
    let clean = tmp.path().join("clean.tar");
    ok(&[
        "filter",
        p(&shard),
        "--labels",
        p(&run.join("labels.parquet")),
        "--out",
        p(&clean),
    ]);
    let kept = members_of(&clean);
    let clean_keys: Vec<&str> = got
        .iter()
        .filter(|l| l.is_clean)
        .map(|l| l.key.as_str())
        .collect();
    assert!(!clean_keys.is_empty());
    for (name, _) in &kept {
        assert!(
            clean_keys.contains(&name.split('.').next().unwrap()),
            "{name}"
        );
    }
    assert!(kept.len() >= 2 * clean_keys.len(), "{kept:?}");
}

/// Issue #34 item 3: a key that repeats within a few samples makes two
/// samples, never one merged row: `fit` refuses the repeated key, and
/// `filter` writes no member of a pair that has no label of its own.
#[test]
fn a_key_repeated_within_the_window_is_two_samples_never_merged() {
    let tmp = tempfile::tempdir().unwrap();
    let clean = tmp.path().join("clean/00000.tar");
    write_tar(&clean, &demo_members(0..30, |_, m| Some(m)));
    let run = tmp.path().join("run");
    let out = quick_fit(&clean, &run, &[]);
    assert!(out.status.success(), "{}", stderr(&out));

    // Sample 3's members carry sample 1's key.
    let dup = tmp.path().join("dup/00000.tar");
    write_tar(
        &dup,
        &demo_members(0..30, |i, (name, data)| {
            Some(match i {
                3 => (name.replace("demo-000003", "demo-000001"), data),
                _ => (name, data),
            })
        }),
    );
    let v: serde_json::Value =
        serde_json::from_str(&ok(&["inspect", p(&dup), "--json", "--no-decode"])).unwrap();
    assert_eq!(
        (v["rows"].as_u64(), v["duplicate_keys"].as_u64()),
        (Some(30), Some(1)),
        "{v}"
    );
    let out = quick_fit(&dup, &tmp.path().join("run-dup"), &[]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("demo-000001"), "{}", stderr(&out));

    // Scored with a checkpoint, the repeat is its own row with the reason;
    // filter refuses labels that cannot be told apart, writing nothing.
    let scored = tmp.path().join("scored.parquet");
    ok(&[
        "score",
        p(&dup),
        "--checkpoint",
        p(&run),
        "--out",
        p(&scored),
    ]);
    let got = labels(&scored);
    assert_eq!(got.len(), 30);
    assert_eq!(got[3].key, "demo-000001");
    assert!(
        got[3]
            .error
            .as_deref()
            .unwrap_or("")
            .contains("the key demo-000001 repeats"),
        "{:?}",
        got[3]
    );
    let out_tar = tmp.path().join("kept.tar");
    let out = ncclean(&[
        "filter",
        p(&dup),
        "--labels",
        p(&scored),
        "--out",
        p(&out_tar),
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(!out_tar.exists());
}

/// Issue #34 item 10: member names with `..` or a leading `/` are skipped
/// rows saying why, and never copied into a filtered tar.
#[test]
fn member_names_that_climb_out_are_skipped_and_never_copied() {
    let tmp = tempfile::tempdir().unwrap();
    let shard = tmp.path().join("shards/00000.tar");
    std::fs::create_dir_all(shard.parent().unwrap()).unwrap();
    let mut tar = Vec::new();
    for (name, data) in demo_members(0..30, |_, m| Some(m)) {
        let name = match &name[..11] {
            "demo-000002" => format!("../{name}"),
            "demo-000004" => format!("/tmp/{name}"),
            _ => name,
        };
        raw_entry(&mut tar, &name, &data, b'0');
    }
    tar.extend_from_slice(&[0u8; 1024]);
    std::fs::write(&shard, &tar).unwrap();
    let run = tmp.path().join("run");
    let out = quick_fit(&shard, &run, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let got = labels(&run.join("labels.parquet"));
    assert_eq!(got.len(), 30);
    for (i, key) in [(2, "../demo-000002"), (4, "/tmp/demo-000004")] {
        assert_eq!(got[i].key, key);
        assert_eq!(got[i].status, RowStatus::Skipped);
        assert!(
            got[i]
                .error
                .as_deref()
                .unwrap()
                .contains("'..' or a leading '/'"),
            "{:?}",
            got[i]
        );
    }
    let clean = tmp.path().join("clean.tar");
    ok(&[
        "filter",
        p(&shard),
        "--labels",
        p(&run.join("labels.parquet")),
        "--out",
        p(&clean),
    ]);
    let kept = members_of(&clean);
    assert!(!kept.is_empty());
    assert!(
        kept.iter()
            .all(|(n, _)| !n.starts_with('/') && !n.contains("..")),
        "{kept:?}"
    );
}
