//! What a curation engineer meets first (issue #14): which towers are
//! installed, a warning when the toy towers meet real photos, URL-only
//! metadata refused with the download command, and machine-readable logs.

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use arrow_array::{ArrayRef, BinaryArray, RecordBatch, StringArray};
use arrow_schema::{Field, Schema};
use common::{noisy_demo_of, p, quick_fit};
use parquet::arrow::ArrowWriter;

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
    let mut w =
        ArrowWriter::try_new(std::fs::File::create(path).unwrap(), batch.schema(), None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

fn jpeg(w: u32, h: u32, shade: u8) -> Vec<u8> {
    let img = image::RgbImage::from_pixel(w, h, image::Rgb([shade, 255 - shade, 128]));
    let mut out = Vec::new();
    image::codecs::jpeg::JpegEncoder::new(&mut out)
        .encode_image(&img)
        .unwrap();
    out
}

#[test]
fn towers_lists_what_is_installed_and_where_it_looked() {
    let home = tempfile::tempdir().unwrap();
    let hub = home.path().join("hub");
    let snap = hub.join("models--openai--clip-vit-base-patch32/snapshots/abc");
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::write(snap.join("config.json"), br#"{"model_type": "clip"}"#).unwrap();
    std::fs::write(snap.join("model.safetensors"), b"x").unwrap();
    std::fs::write(snap.join("tokenizer.json"), b"{}").unwrap();
    let run = |json: bool| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_ncclean"));
        c.arg("towers")
            .env("HOME", home.path())
            .env("HF_HUB_CACHE", &hub)
            .env_remove("NCCLEAN_MINILM_DIR")
            .env_remove("NCCLEAN_MOBILENET_V2")
            .env_remove("HF_HOME");
        if json {
            c.arg("--json");
        }
        let out = c.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let v: serde_json::Value = serde_json::from_str(&run(true)).unwrap();
    let found = v["found"].as_array().unwrap();
    assert_eq!(found.len(), 1, "{v}");
    assert_eq!(found[0]["kind"], "clip");
    assert_eq!(found[0]["name"], "openai/clip-vit-base-patch32");
    let looked: Vec<String> = v["looked_in"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x[0].as_str().unwrap().to_string())
        .collect();
    assert!(
        looked
            .iter()
            .any(|l| l.ends_with("mobilenet_v2/model.safetensors")),
        "{looked:?}"
    );
    assert!(
        looked.iter().any(|l| l.ends_with("all-MiniLM-L6-v2")),
        "{looked:?}"
    );
    assert!(looked.contains(&hub.display().to_string()), "{looked:?}");
    let text = run(false);
    assert!(
        text.contains("--image-encoder clip --image-model openai/clip-vit-base-patch32"),
        "{text}"
    );
    assert!(text.contains("(absent)"), "{text}");
}

#[test]
fn toy_towers_on_photos_warn_with_the_way_out() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("photos.parquet");
    let images: Vec<Vec<u8>> = (0..8).map(|i| jpeg(160, 120, i * 30)).collect();
    write_parquet(
        &data,
        vec![
            (
                "jpg",
                Arc::new(BinaryArray::from_iter_values(images.iter())) as ArrayRef,
            ),
            (
                "caption",
                Arc::new(StringArray::from_iter_values(
                    (0..8).map(|i| format!("a photo number {i}")),
                )),
            ),
        ],
    );
    // No pretrained tower installed (an empty home and hub cache): the toy
    // towers train, with the warning. Installed ones would be taken instead
    // (tests/towers.rs).
    let bare = dir.path().join("home");
    let out = Command::new(env!("CARGO_BIN_EXE_ncclean"))
        .args(["fit", p(&data), "--out-dir", p(&dir.path().join("run"))])
        .args(["--epochs", "1", "--warmup-epochs", "1"])
        .env("HOME", &bare)
        .env("HF_HUB_CACHE", bare.join("hub"))
        .env_remove("HF_HOME")
        .env_remove("NCCLEAN_MINILM_DIR")
        .env_remove("NCCLEAN_MOBILENET_V2")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("warning: the default towers"), "{err}");
    assert!(err.contains("160×120"), "{err}");
    assert!(err.contains("ncclean towers"), "{err}");
    // Chosen on purpose: no warning.
    let out = quick_fit(
        &data,
        &dir.path().join("run2"),
        &["--image-encoder", "demo-cnn"],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("the default towers"), "{err}");
    // The synthetic demo's small PNGs: no warning either.
    let demo = noisy_demo_of(dir.path(), 40);
    let out = quick_fit(&demo, &dir.path().join("run3"), &[]);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("the default towers"));
}

#[test]
fn laion_metadata_is_refused_with_the_download_command() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("laion.parquet");
    write_parquet(
        &data,
        vec![
            (
                "URL",
                Arc::new(StringArray::from(vec![
                    "https://a/1.jpg",
                    "https://a/2.jpg",
                ])) as ArrayRef,
            ),
            ("TEXT", Arc::new(StringArray::from(vec!["one", "two"]))),
        ],
    );
    for extra in [
        &[][..],
        &["--preset", "laion"][..],
        &["--image-col", "URL"][..],
    ] {
        let out = quick_fit(&data, &dir.path().join("run"), extra);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{err}");
        assert!(err.contains("holds URLs"), "{err}");
        assert!(err.contains("img2dataset --url_list"), "{err}");
        assert!(!err.contains("cannot read image file"), "{err}");
    }
}

#[test]
fn json_logs_have_time_level_and_one_based_epochs() {
    let dir = tempfile::tempdir().unwrap();
    let data = noisy_demo_of(dir.path(), 40);
    let run = dir.path().join("run");
    let out = quick_fit(&data, &run, &["--log-format", "json"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let lines: Vec<serde_json::Value> = err
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?} is not JSON: {e}")))
        .collect();
    assert!(!lines.is_empty());
    for l in &lines {
        assert!(l["ts"].as_str().is_some_and(|t| t.ends_with('Z')), "{l}");
        assert!(l["level"].is_string(), "{l}");
    }
    let epochs: Vec<_> = lines.iter().filter(|l| l["event"] == "epoch").collect();
    assert_eq!(epochs.len(), 1);
    assert_eq!(epochs[0]["epoch"], 1);
    let stats: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("stats.json")).unwrap()).unwrap();
    assert_eq!(stats["epochs"][0]["epoch"], 1, "{stats}");

    // The error that ends a command is an event too.
    let out = quick_fit(
        &dir.path().join("absent.parquet"),
        &dir.path().join("r2"),
        &["--log-format", "json"],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    let last: serde_json::Value = serde_json::from_str(err.lines().last().unwrap()).unwrap();
    assert_eq!(last["level"], "error", "{err}");
    assert_eq!(last["exit_code"], out.status.code().unwrap(), "{err}");
    assert!(
        last["message"].as_str().unwrap().contains("absent.parquet"),
        "{err}"
    );
}

/// Issue #14 item 9: `dir*/0000?.parquet` exited 1 (wildcards were only
/// read in the file name), directories were never searched below their top
/// level, and hidden files were read by globs but not by directories.
#[test]
fn globs_in_any_component_recursive_directories_and_hidden_files() {
    let tmp = tempfile::tempdir().unwrap();
    let demo = common::demo(&tmp.path().join("demo"), 60);
    for rel in [
        "shards/dir1/00000.parquet",
        "shards/dir1/.00001.parquet",
        "shards/dir2/00000.parquet",
        "shards/dir2/deeper/00002.parquet",
    ] {
        let to = tmp.path().join(rel);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(&demo, &to).unwrap();
    }
    let files = |args: &[&str]| -> Vec<String> {
        let mut all = vec!["inspect", "--json"];
        all.extend_from_slice(args);
        let v: serde_json::Value = serde_json::from_str(&common::ok(&all)).unwrap();
        v["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                let name = f["path"]
                    .as_str()
                    .or(f["file"].as_str())
                    .unwrap_or_default();
                name.rsplit("shards/").next().unwrap().to_string()
            })
            .collect()
    };
    let root = tmp.path().join("shards");
    let glob = root.join("dir*/0000?.parquet");
    assert_eq!(
        files(&[common::p(&glob)]),
        ["dir1/00000.parquet", "dir2/00000.parquet"]
    );
    assert_eq!(
        files(&[common::p(&root.join("dir2"))]),
        ["dir2/00000.parquet"]
    );
    assert_eq!(
        files(&[common::p(&root), "--recursive"]),
        [
            "dir1/00000.parquet",
            "dir2/00000.parquet",
            "dir2/deeper/00002.parquet"
        ]
    );
    let out = common::ncclean(&["inspect", common::p(&root)]);
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("add --recursive"), "{err}");
}
