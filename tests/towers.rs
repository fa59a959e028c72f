//! Pretrained towers through the CLI, with the feature cache. These need
//! `../shared` (MobileNetV2 weights, Flickr8k photos) and MiniLM
//! (`bash scripts/fetch_minilm.sh`); each test skips with a message when
//! they are absent.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use arrow_array::{ArrayRef, BinaryArray, RecordBatch, StringArray};
use arrow_schema::{Field, Schema};
use ncclean::data::read_labels;
use parquet::arrow::ArrowWriter;

fn shared() -> Option<PathBuf> {
    let p = std::env::var_os("NCCLEAN_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared"));
    let ok = p.join("models/mobilenet_v2/model.safetensors").is_file()
        && p.join("data/flickr8k/images").is_dir();
    if !ok {
        eprintln!(
            "skipped: {} lacks the MobileNetV2 weights or Flickr8k photos",
            p.display()
        );
    }
    ok.then_some(p)
}

fn minilm() -> Option<PathBuf> {
    let dir = ncclean_models::hf_dir::default_minilm_dir();
    if dir.is_none() {
        eprintln!("skipped: MiniLM not found (run bash scripts/fetch_minilm.sh)");
    }
    dir
}

/// A path as a command-line argument.
fn p(x: &Path) -> String {
    x.to_str().unwrap().to_string()
}

fn run(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_ncclean"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ncclean {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// 12 pairs over 6 Flickr8k photos (two captions each), one undecodable image.
fn small_flickr(shared: &Path, dir: &Path) -> PathBuf {
    let tsv = std::fs::read_to_string(shared.join("data/flickr8k/captions.tsv")).unwrap();
    let mut keys = Vec::new();
    let mut images: Vec<Vec<u8>> = Vec::new();
    let mut caps = Vec::new();
    let mut photos: Vec<&str> = Vec::new();
    for line in tsv.lines().skip(1) {
        let mut p = line.splitn(3, '\t');
        let (img, idx, cap) = (p.next().unwrap(), p.next().unwrap(), p.next().unwrap());
        if idx != "0" && idx != "1" {
            continue;
        }
        if !photos.contains(&img) {
            if photos.len() == 6 {
                break;
            }
            photos.push(img);
        }
        keys.push(format!("{img}#{idx}"));
        images.push(std::fs::read(shared.join("data/flickr8k/images").join(img)).unwrap());
        caps.push(cap.to_string());
    }
    images[11] = b"not a jpeg".to_vec();
    let cols: Vec<(&str, ArrayRef)> = vec![
        ("key", Arc::new(StringArray::from(keys))),
        (
            "image",
            Arc::new(BinaryArray::from_iter_values(images.iter())),
        ),
        ("caption", Arc::new(StringArray::from(caps))),
    ];
    let schema = Arc::new(Schema::new(
        cols.iter()
            .map(|(n, a)| Field::new(*n, a.data_type().clone(), false))
            .collect::<Vec<_>>(),
    ));
    let batch =
        RecordBatch::try_new(schema.clone(), cols.into_iter().map(|c| c.1).collect()).unwrap();
    let path = dir.join("small.parquet");
    let mut w = ArrowWriter::try_new(File::create(&path).unwrap(), schema, None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    path
}

#[test]
fn mobilenet_features_are_cached_and_reused_by_score() {
    let Some(shared) = shared() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let data = small_flickr(&shared, tmp.path());
    let weights = shared.join("models/mobilenet_v2/model.safetensors");
    let cache = tmp.path().join("cache");
    let run_dir = tmp.path().join("run");
    let log = run(&[
        "fit",
        &p(&data),
        "--out-dir",
        &p(&run_dir),
        "--image-encoder",
        "mobilenet_v2",
        "--image-model",
        &p(&weights),
        "--cache-dir",
        &p(&cache),
        "--epochs",
        "2",
        "--warmup-epochs",
        "1",
        "--batch-size",
        "4",
    ]);
    assert!(
        log.contains("images: encoded 6"),
        "6 photos plus one undecodable image: {log}"
    );
    let (labels, _) = read_labels(&run_dir.join("labels.parquet")).unwrap();
    assert_eq!(labels.len(), 12);
    assert!(
        labels[11].error.as_deref().unwrap_or("").contains("decode"),
        "{:?}",
        labels[11]
    );
    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run_dir.join("checkpoint/state.json")).unwrap())
            .unwrap();
    assert_eq!(state["encoders"]["image"], "mobilenet_v2");
    assert_eq!(state["model"]["image"]["dim"], 1280);

    // score rebuilds the same tower from the checkpoint and hits the cache.
    let scored = tmp.path().join("scored.parquet");
    let log = run(&[
        "score",
        &p(&data),
        "--checkpoint",
        &p(&run_dir),
        "--out",
        &p(&scored),
        "--cache-dir",
        &p(&cache),
    ]);
    assert!(log.contains("images: all 6 from the cache"), "{log}");
    assert_eq!(read_labels(&scored).unwrap().0, labels);
    // --no-cache recomputes and still agrees (cached values are f16-rounded both ways).
    let log = run(&[
        "score",
        &p(&data),
        "--checkpoint",
        &p(&run_dir),
        "--out",
        &p(&scored),
        "--no-cache",
    ]);
    assert!(log.contains("images: encoded 6"), "{log}");
    assert_eq!(read_labels(&scored).unwrap().0, labels);
}

#[test]
fn minilm_text_tower_trains_a_head() {
    let (Some(shared), Some(minilm)) = (shared(), minilm()) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let data = small_flickr(&shared, tmp.path());
    let weights = shared.join("models/mobilenet_v2/model.safetensors");
    let run_dir = tmp.path().join("run");
    let log = run(&[
        "fit",
        &p(&data),
        "--out-dir",
        &p(&run_dir),
        "--image-encoder",
        "mobilenet_v2",
        "--image-model",
        &p(&weights),
        "--text-encoder",
        "minilm",
        "--text-model",
        &p(&minilm),
        "--no-cache",
        "--epochs",
        "2",
        "--warmup-epochs",
        "1",
        "--batch-size",
        "4",
    ]);
    assert!(log.contains("captions: encoded 12"), "{log}");
    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run_dir.join("checkpoint/state.json")).unwrap())
            .unwrap();
    assert_eq!(state["model"]["text"]["dim"], 384);
    assert_eq!(state["encoders"]["text"], "minilm");
    let out = Command::new(env!("CARGO_BIN_EXE_ncclean"))
        .args([
            "eval",
            "--retrieval",
            "--checkpoint",
            &p(&run_dir),
            &p(&data),
            "--no-cache",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["images"], 6, "captions of one photo are grouped: {r}");
    assert_eq!(r["captions"], 11);
}

#[test]
fn recon_and_the_gpo_head_train_on_cached_local_features() {
    let (Some(shared), Some(minilm)) = (shared(), minilm()) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let data = small_flickr(&shared, tmp.path());
    let weights = shared.join("models/mobilenet_v2/model.safetensors");
    let cache = tmp.path().join("cache");
    let towers = [
        "--image-encoder".to_string(),
        "mobilenet_v2".into(),
        "--image-model".into(),
        p(&weights),
        "--text-encoder".into(),
        "minilm".into(),
        "--text-model".into(),
        p(&minilm),
        "--cache-dir".into(),
        p(&cache),
    ];
    let fit = |method: &str, extra: &[&str], dir: &Path| {
        let mut args: Vec<String> = ["fit", &p(&data), "--method", method, "--out-dir", &p(dir)]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.extend(towers.iter().cloned());
        args.extend(
            ["--epochs", "3", "--warmup-epochs", "1", "--batch-size", "4"]
                .iter()
                .map(|s| s.to_string()),
        );
        args.extend(extra.iter().map(|s| s.to_string()));
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        run(&refs)
    };
    let state = |dir: &Path| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(dir.join("checkpoint/state.json")).unwrap()).unwrap()
    };

    // recon: local features encoded now (7×7 cells of 1280, tokens of 384)
    let recon = tmp.path().join("recon");
    let log = fit("recon", &[], &recon);
    assert!(log.contains("images: encoded 6"), "{log}");
    let s = state(&recon);
    assert_eq!(s["model"]["image"]["local_dim"], 1280);
    assert_eq!(s["model"]["text"]["local_dim"], 384);
    assert_eq!(s["model"]["head"]["local"], true);
    assert_eq!(s["model"]["head"]["pooling"], "gpo");
    let (labels, _) = read_labels(&recon.join("labels.parquet")).unwrap();
    assert_eq!(labels.len(), 12);
    assert!(labels[..11]
        .iter()
        .all(|l| l.clean_prob.is_some_and(f32::is_finite)));

    // score reads the local features back from the cache and reproduces fit
    let scored = tmp.path().join("scored.parquet");
    let log = run(&[
        "score",
        &p(&data),
        "--checkpoint",
        &p(&recon),
        "--out",
        &p(&scored),
        "--cache-dir",
        &p(&cache),
    ]);
    assert!(log.contains("images: all 6 from the cache"), "{log}");
    assert!(log.contains("captions: all 12 from the cache"), "{log}");
    assert_eq!(read_labels(&scored).unwrap().0, labels);

    // any method on the GPO head, from the cache
    let esc = tmp.path().join("esc-gpo");
    let log = fit("esc", &["--head", "gpo"], &esc);
    assert!(log.contains("images: all 6 from the cache"), "{log}");
    let s = state(&esc);
    assert_eq!(s["model"]["head"]["pooling"], "gpo");
    assert_eq!(s["config"]["head"], "gpo");
    // the mean head does not load local features at all
    let plain = tmp.path().join("esc-mean");
    fit("esc", &[], &plain);
    let s = state(&plain);
    assert_eq!(s["model"]["head"]["local"], false);
    assert!(s["model"]["image"]["local_dim"].is_null());
}

/// Photos and no tower named, with MobileNetV2 and MiniLM installed: `fit`
/// takes them (and says so) instead of training the toy towers on photos;
/// run.json records them, so `score` rebuilds the same. Naming any tower
/// keeps the choice the user's.
#[test]
fn photos_without_named_towers_take_the_installed_pretrained_ones() {
    let (Some(shared), Some(minilm)) = (shared(), minilm()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let data = small_flickr(&shared, dir.path());
    let weights = shared.join("models/mobilenet_v2/model.safetensors");
    // Only what this test installs is found: an empty home and hub cache.
    let fit = |run: &Path, extra: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_ncclean"));
        c.args(["fit", &p(&data), "--out-dir", &p(run), "--epochs", "2"])
            .args([
                "--method",
                "vanilla",
                "--cache-dir",
                &p(&dir.path().join("cache")),
            ])
            .args(extra)
            .env("HOME", dir.path())
            .env("HF_HUB_CACHE", dir.path().join("hub"))
            .env_remove("HF_HOME")
            .env("NCCLEAN_MOBILENET_V2", &weights)
            .env("NCCLEAN_MINILM_DIR", &minilm);
        let out = c.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{err}");
        let run_json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(run.join("run.json")).unwrap()).unwrap();
        (err, run_json["encoders"].clone())
    };
    let (err, encoders) = fit(&dir.path().join("auto"), &[]);
    assert!(
        err.contains("towers: the first image is a 224×224 photo, so fit uses the pretrained towers installed here: --image-encoder mobilenet_v2 --image-model"),
        "{err}"
    );
    assert!(!err.contains("the default towers"), "{err}");
    assert_eq!(encoders["image"], "mobilenet_v2", "{encoders}");
    assert_eq!(encoders["text"], "minilm", "{encoders}");
    assert_eq!(encoders["image_model"], p(&weights), "{encoders}");
    // A tower named by hand: nothing is chosen for the user (the toy image
    // tower they asked for, with its warning gone).
    let (err, encoders) = fit(&dir.path().join("toy"), &["--image-encoder", "demo-cnn"]);
    assert!(!err.contains("towers: "), "{err}");
    assert_eq!(encoders["image"], "demo-cnn", "{encoders}");
    assert_eq!(encoders["text"], "demo-bow", "{encoders}");
}
