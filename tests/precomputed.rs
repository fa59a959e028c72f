//! Precomputed text embeddings (`--text-encoder precomputed`): the
//! embedding-only workflow of LAION / DataComp data (`img_emb` + `text_emb`),
//! from fit through score, and the refusals around it.

mod common;

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use arrow_array::builder::{Float32Builder, ListBuilder};
use arrow_array::{Array, ArrayRef, BooleanArray, RecordBatch, StringArray};
use arrow_schema::{Field, Schema};
use common::{eval_json, ncclean, ok, p};
use ncclean::data::{read_labels, RowStatus};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;

/// Pairs in the synthetic set, and the share whose text is unrelated.
const PAIRS: usize = 400;
const NOISY_EVERY: usize = 3;

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

/// A small deterministic generator (xorshift), uniform in [-1, 1).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next()).collect()
    }
}

fn list(rows: &[Option<Vec<f32>>]) -> ArrayRef {
    let mut b = ListBuilder::new(Float32Builder::new());
    for r in rows {
        match r {
            Some(v) => {
                b.values().append_slice(v);
                b.append(true);
            }
            None => b.append(false),
        }
    }
    Arc::new(b.finish())
}

/// `PAIRS` pairs: a clean pair's image and text embeddings are two noisy
/// views of one latent vector (the text one through a fixed linear map),
/// every `NOISY_EVERY`th pair's text embedding is drawn independently
/// (`noisy` = true). Row 5's text embedding is null. Returns the path.
fn embedding_pairs(dir: &Path, img_dim: usize, txt_dim: usize) -> std::path::PathBuf {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let map: Vec<Vec<f32>> = (0..txt_dim).map(|_| rng.vec(img_dim)).collect();
    let (mut img, mut txt, mut noisy) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..PAIRS {
        let z = rng.vec(img_dim);
        let view: Vec<f32> = z.iter().map(|x| x + 0.1 * rng.next()).collect();
        let is_noisy = i % NOISY_EVERY == 1;
        let t: Vec<f32> = if is_noisy {
            rng.vec(txt_dim)
        } else {
            map.iter()
                .map(|row| row.iter().zip(&z).map(|(a, b)| a * b).sum::<f32>() + 0.1 * rng.next())
                .collect()
        };
        img.push(Some(view));
        txt.push((i != 5).then_some(t));
        noisy.push(is_noisy);
    }
    write_pairs(&dir.join("emb.parquet"), &img, &txt, noisy)
}

/// Pairs `img[i]`, `txt[i]` with keys `k{i}`, captions `caption {i}` and
/// the `noisy` flags, written to `path`, which is returned.
fn write_pairs(
    path: &Path,
    img: &[Option<Vec<f32>>],
    txt: &[Option<Vec<f32>>],
    noisy: Vec<bool>,
) -> std::path::PathBuf {
    let keys: Vec<String> = (0..img.len()).map(|i| format!("k{i}")).collect();
    let caps: Vec<String> = (0..img.len()).map(|i| format!("caption {i}")).collect();
    write_parquet(
        path,
        vec![
            ("key", Arc::new(StringArray::from(keys)) as ArrayRef),
            ("img_emb", list(img)),
            ("text_emb", list(txt)),
            ("caption", Arc::new(StringArray::from(caps)) as ArrayRef),
            ("noisy", Arc::new(BooleanArray::from(noisy)) as ArrayRef),
        ],
    );
    path.to_path_buf()
}

fn fit(data: &Path, run: &Path, extra: &[&str]) -> std::process::Output {
    let mut towers = vec![
        "--image-encoder",
        "precomputed",
        "--text-encoder",
        "precomputed",
    ];
    towers.extend_from_slice(extra);
    fit_quick(data, run, &towers)
}

/// A short vanilla fit with only `extra` (towers included) beyond it.
fn fit_quick(data: &Path, run: &Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "fit",
        p(data),
        "--out-dir",
        p(run),
        "--method",
        "vanilla",
        "--epochs",
        "8",
        "--warmup-epochs",
        "2",
        "--batch-size",
        "32",
    ];
    args.extend_from_slice(extra);
    ncclean(&args)
}

/// The run's checkpoint state.
fn state(run: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(run.join("checkpoint/state.json")).unwrap()).unwrap()
}

/// The labels `score` writes for `data` with the run's checkpoint.
fn rescored(data: &Path, run: &Path) -> Vec<ncclean::data::LabelRow> {
    let scored = run.with_extension("scored.parquet");
    ok(&[
        "score",
        p(data),
        "--checkpoint",
        p(run),
        "--out",
        p(&scored),
    ]);
    read_labels(&scored).unwrap().0
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn embedding_only_fit_separates_noise_and_score_reproduces_it() {
    let tmp = tempfile::tempdir().unwrap();
    let data = embedding_pairs(tmp.path(), 16, 12);
    let run = tmp.path().join("run");
    let out = fit(&data, &run, &[]);
    assert!(out.status.success(), "{}", stderr(&out));

    let (labels, _) = read_labels(&run.join("labels.parquet")).unwrap();
    assert_eq!(labels.len(), PAIRS);
    // The null text embedding skips its row, with the reason; the caption
    // column still reaches the labels' keys and rows.
    assert_eq!(labels[5].status, RowStatus::Skipped);
    assert_eq!(labels[5].error.as_deref(), Some("text embedding is null"));
    assert_eq!(
        labels.iter().filter(|l| l.status == RowStatus::Ok).count(),
        PAIRS - 1
    );
    let m = eval_json(&run.join("labels.parquet"), &data);
    let auroc = m["auroc"].as_f64().unwrap();
    eprintln!("embedding-only fit: {m}");
    assert!(auroc > 0.9, "AUROC {auroc} (chance is 0.5): {m}");

    // The checkpoint records the text side: encoder, column, width.
    let state = state(&run);
    assert_eq!(state["encoders"]["text"], "precomputed");
    assert_eq!(state["columns"]["text_embedding"], "text_emb");
    assert_eq!(state["model"]["text"]["kind"], "precomputed");
    assert_eq!(state["model"]["text"]["dim"], 12);

    // `score` finds the column by the checkpoint's name and reproduces
    // fit's labels exactly.
    assert_eq!(rescored(&data, &run), labels);

    // Data without the column: invalid input (exit 3) naming it.
    let bare = tmp.path().join("bare.parquet");
    let mut rng = Rng(7);
    write_parquet(
        &bare,
        vec![
            (
                "img_emb",
                list(&(0..4).map(|_| Some(rng.vec(16))).collect::<Vec<_>>()),
            ),
            (
                "caption",
                Arc::new(StringArray::from(vec!["a", "b", "c", "d"])) as ArrayRef,
            ),
        ],
    );
    let out_path = tmp.path().join("bare-labels.parquet");
    let out = ncclean(&[
        "score",
        p(&bare),
        "--checkpoint",
        p(&run),
        "--out",
        p(&out_path),
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("\"text_emb\" not found"),
        "{}",
        stderr(&out)
    );
    assert!(!out_path.exists());

    // Text embeddings of another width: exit 3, both widths named.
    let wide = tmp.path().join("wide");
    std::fs::create_dir(&wide).unwrap();
    let wide = embedding_pairs(&wide, 16, 20);
    let out = ncclean(&[
        "score",
        p(&wide),
        "--checkpoint",
        p(&run),
        "--out",
        p(&out_path),
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("have 20 values, the checkpoint expects 12"),
        "{}",
        stderr(&out)
    );
}

/// With image embeddings and no tower named, a text-embedding column beside
/// them is used too (LAION's `img_emb` + `text_emb`), and the run says so;
/// naming a text tower keeps the captions; pixels beside a `text_emb`
/// column still encode their captions unless asked.
#[test]
fn image_embeddings_take_the_text_embeddings_beside_them_by_default() {
    let tmp = tempfile::tempdir().unwrap();
    let data = embedding_pairs(tmp.path(), 16, 12);
    let encoders = |run: &Path| state(run)["encoders"].clone();

    let run = tmp.path().join("run");
    let out = fit_quick(&data, &run, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out)
            .contains("column \"text_emb\" holds text embeddings, so both are used as given"),
        "{}",
        stderr(&out)
    );
    assert_eq!(encoders(&run)["image"], "precomputed");
    assert_eq!(encoders(&run)["text"], "precomputed");
    let (labels, _) = read_labels(&run.join("labels.parquet")).unwrap();
    // The column is read, so its null value skips row 5 with the reason.
    assert_eq!(labels[5].error.as_deref(), Some("text embedding is null"));
    let auroc = eval_json(&run.join("labels.parquet"), &data)["auroc"]
        .as_f64()
        .unwrap();
    assert!(auroc > 0.9, "AUROC {auroc}");
    // `score` follows the checkpoint: the same labels.
    assert_eq!(rescored(&data, &run), labels);

    // A text tower named: the captions are encoded, the column ignored (its
    // null value costs no row), nothing said about it.
    let bow = tmp.path().join("bow");
    let out = fit_quick(&data, &bow, &["--text-encoder", "demo-bow"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        !stderr(&out).contains("holds text embeddings"),
        "{}",
        stderr(&out)
    );
    assert_eq!(encoders(&bow)["text"], "demo-bow");
    let (labels, _) = read_labels(&bow.join("labels.parquet")).unwrap();
    assert!(labels.iter().all(|l| l.status == RowStatus::Ok));

    // Pixels beside a text-embedding column: the captions, as before.
    let demo = demo_with_text_emb(tmp.path(), 64);
    let pixels = tmp.path().join("pixels");
    let out = common::quick_fit(&demo, &pixels, &["--method", "vanilla"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        !stderr(&out).contains("holds text embeddings"),
        "{}",
        stderr(&out)
    );
    assert_eq!(encoders(&pixels)["text"], "demo-bow");
}

/// Demo data (pixels) with a `text_emb` column added: a bag of hashed
/// caption words, so equal captions get equal embeddings.
fn demo_with_text_emb(dir: &Path, pairs: usize) -> std::path::PathBuf {
    let data = common::demo(dir, pairs);
    let reader = ParquetRecordBatchReaderBuilder::try_new(File::open(&data).unwrap())
        .unwrap()
        .build()
        .unwrap();
    let out = dir.join("demo_text_emb.parquet");
    let mut writer: Option<ArrowWriter<File>> = None;
    for batch in reader {
        let batch = batch.unwrap();
        let caps = batch
            .column_by_name("caption")
            .unwrap()
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap();
        let rows: Vec<Option<Vec<f32>>> = (0..caps.len())
            .map(|i| {
                let mut v = vec![0f32; 8];
                for w in caps.value(i).split_whitespace() {
                    let h = w.bytes().fold(7usize, |h, b| h * 31 + b as usize);
                    v[h % 8] += 1.0;
                }
                Some(v)
            })
            .collect();
        let mut fields: Vec<Field> = batch
            .schema()
            .fields()
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        let mut cols = batch.columns().to_vec();
        let emb = list(&rows);
        fields.push(Field::new("text_emb", emb.data_type().clone(), true));
        cols.push(emb);
        let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).unwrap();
        let w = writer.get_or_insert_with(|| {
            ArrowWriter::try_new(File::create(&out).unwrap(), batch.schema(), None).unwrap()
        });
        w.write(&batch).unwrap();
    }
    writer.unwrap().close().unwrap();
    out
}

#[test]
fn pixels_train_beside_precomputed_text() {
    let tmp = tempfile::tempdir().unwrap();
    let data = demo_with_text_emb(tmp.path(), 64);
    let run = tmp.path().join("run");
    let out = common::quick_fit(
        &data,
        &run,
        &["--text-encoder", "precomputed", "--method", "vanilla"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let state = state(&run);
    assert_eq!(
        state["model"]["image"]["kind"], "demo_cnn",
        "{}",
        state["model"]
    );
    assert_eq!(state["model"]["text"]["kind"], "precomputed");
    assert_eq!(state["model"]["text"]["dim"], 8);
    assert!(state["vocab"].is_null(), "no caption vocabulary is built");
    let (labels, _) = read_labels(&run.join("labels.parquet")).unwrap();
    assert_eq!(labels.len(), 64);
}

#[test]
fn methods_that_need_caption_tokens_refuse_precomputed_text() {
    let tmp = tempfile::tempdir().unwrap();
    let data = demo_with_text_emb(tmp.path(), 16);
    let run = tmp.path().join("run");
    // The images are pixels, so the refusal is the text side's: recon and
    // the GPO head need caption tokens, a text embedding has none.
    for extra in [&["--method", "recon"][..], &["--head", "gpo"][..]] {
        let mut args = vec![
            "fit",
            p(&data),
            "--out-dir",
            p(&run),
            "--text-encoder",
            "precomputed",
        ];
        args.extend_from_slice(extra);
        let out = ncclean(&args);
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        let e = stderr(&out);
        assert!(
            e.contains("local features") && e.contains("text-embedding column \"text_emb\""),
            "{e}"
        );
        assert!(!run.exists());
    }
}

#[test]
fn text_encoder_precomputed_without_a_column_says_how_to_name_it() {
    let tmp = tempfile::tempdir().unwrap();
    let data = common::demo(tmp.path(), 20);
    let out = ncclean(&[
        "fit",
        p(&data),
        "--out-dir",
        p(&tmp.path().join("run")),
        "--text-encoder",
        "precomputed",
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let e = stderr(&out);
    assert!(
        e.contains("no text-embedding column found") && e.contains("--text-emb-col"),
        "{e}"
    );
    // A named column that is not there is named back.
    let out = ncclean(&[
        "inspect",
        p(&data),
        "--text-emb-col",
        "txt_vec",
        "--no-decode",
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("\"txt_vec\" not found"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn inspect_shows_the_text_embedding_column() {
    let tmp = tempfile::tempdir().unwrap();
    let data = embedding_pairs(tmp.path(), 8, 6);
    let v: serde_json::Value =
        serde_json::from_str(ok(&["inspect", p(&data), "--json"]).trim()).unwrap();
    assert_eq!(v["columns"]["text_embedding"], "text_emb");
    assert_eq!(v["text_embedding_dim"], 6);
    assert_eq!(v["unusable"], 1, "{v}");
    let text = ok(&["inspect", p(&data), "--no-decode"]);
    assert!(
        text.contains("text embedding: text_emb (length 6"),
        "{text}"
    );
}

/// An embedding column of empty lists (or of absurdly wide ones) is refused
/// when the columns are detected, naming the column, before anything is
/// trained: a head of width 0 failed mid-training with "empty tensor for
/// reduce", one of a million columns would abort on allocation.
#[test]
fn embeddings_of_no_values_or_too_many_are_refused_up_front() {
    let tmp = tempfile::tempdir().unwrap();
    for (name, dim, want) in [
        ("empty.parquet", 0, "holds empty lists (0 values per row)"),
        (
            "wide.parquet",
            65_537,
            "holds 65537 values per row, more than the 65536",
        ),
    ] {
        let rows: Vec<Option<Vec<f32>>> = (0..4).map(|i| Some(vec![i as f32; dim])).collect();
        let texts: Vec<Option<Vec<f32>>> = (0..4).map(|i| Some(vec![i as f32; 3])).collect();
        let path = tmp.path().join(name);
        write_parquet(
            &path,
            vec![
                ("img_emb", list(&rows)),
                ("text_emb", list(&texts)),
                (
                    "caption",
                    Arc::new(StringArray::from(vec!["a", "b", "c", "d"])) as ArrayRef,
                ),
            ],
        );
        let out = fit(&path, &tmp.path().join("run"), &[]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(3), "{err}");
        assert!(err.contains(want) && err.contains("\"img_emb\""), "{err}");
        assert!(!tmp.path().join("run").exists());
    }
}

/// A real caption's embedding for image content `z`: the fixed linear
/// `map` of it plus `offset` (the cone sentence embeddings lie in) and a
/// little noise.
fn in_cone(map: &[Vec<f32>], offset: &[f32], z: &[f32], rng: &mut Rng) -> Vec<f32> {
    map.iter()
        .zip(offset)
        .map(|(row, o)| o + row.iter().zip(z).map(|(a, b)| a * b).sum::<f32>() + 0.1 * rng.next())
        .collect()
}

/// One of a few fixed vectors (a template, a placeholder) plus a little
/// noise.
fn near(v: &[f32], rng: &mut Rng) -> Vec<f32> {
    v.iter().map(|x| x + 0.02 * rng.next()).collect()
}

/// `n` pairs like [`embedding_pairs`]' clean ones (width 16 on both
/// sides), except every fifth, whose text embedding is one of five fixed
/// "boilerplate" vectors plus a little noise: a caption that describes no
/// image, the same whatever image it comes with (`noisy` = true). The real
/// captions share a common direction (an offset three times the spread of
/// the map's rows), as sentence embeddings do: they lie in a cone, and
/// unrelated text lies outside it.
fn boilerplate_pairs(dir: &Path, n: usize) -> std::path::PathBuf {
    const DIM: usize = 16;
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let map: Vec<Vec<f32>> = (0..DIM).map(|_| rng.vec(DIM)).collect();
    let offset: Vec<f32> = rng.vec(DIM).iter().map(|x| 3.0 * x).collect();
    let templates: Vec<Vec<f32>> = (0..5).map(|_| rng.vec(DIM)).collect();
    let (mut img, mut txt, mut noisy) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..n {
        let z = rng.vec(DIM);
        img.push(Some(z.iter().map(|x| x + 0.1 * rng.next()).collect()));
        let boilerplate = i % 5 == 2;
        let t = if boilerplate {
            near(&templates[i % 7 % 5], &mut rng)
        } else {
            in_cone(&map, &offset, &z, &mut rng)
        };
        txt.push(Some(t));
        noisy.push(boilerplate);
    }
    write_pairs(&dir.join("boilerplate.parquet"), &img, &txt, noisy)
}

#[test]
fn the_caption_null_counts_captions_that_fit_no_image_as_noise() {
    // Random pairings of the data's own pairs include the boilerplate
    // captions with other images, which score as their own pairs do, and
    // the noise share is read where only real captions with the wrong
    // image lie: without the caption null the final model calls the
    // boilerplate pairs clean (Flickr8k: mean clean_prob 1.00 for 0.80).
    // With it (the default) each similarity is scored against the same
    // caption's similarities with a bank of images, and they sit with the
    // noise. The mean is held loosely: 600 pairs are held out to
    // calibrate on, and the noise share's standard error is then about
    // 0.07.
    let tmp = tempfile::tempdir().unwrap();
    let data = boilerplate_pairs(tmp.path(), 3000);
    let eval = |run: &Path, extra: &[&str]| {
        let mut args = vec!["--image-col", "img_emb"];
        args.extend_from_slice(extra);
        let out = fit(&data, run, &args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        eval_json(&run.join("labels.parquet"), &data)
    };
    let plain = eval(&tmp.path().join("plain"), &["--set", "caption_null=false"]);
    let run = tmp.path().join("null");
    let null = eval(&run, &[]);
    eprintln!("boilerplate, without the caption null: {plain}\nwith it (default): {null}");
    let f = |m: &serde_json::Value, k: &str| m[k].as_f64().unwrap();
    // What the null is for: without it the boilerplate is called clean.
    assert!(f(&plain, "recall") < 0.5, "{plain}");
    assert!(f(&null, "recall") > 0.8, "{null}");
    let (ece, mean) = (f(&null, "calibration_error"), f(&null, "mean_clean_prob"));
    assert!(
        ece < 0.1 && (mean - 0.8).abs() < 0.1,
        "ECE {ece}, mean {mean}: {null}"
    );
    // Both rank them last; the bank travels in the checkpoint, and
    // `score` gives fit's labels.
    assert!(f(&plain, "auroc") > 0.99 && f(&null, "auroc") > 0.99);
    let plain_config = state(&tmp.path().join("plain"))["config"].clone();
    assert_eq!(plain_config["caption_null"], false, "{plain_config}");
    let state = state(&run);
    assert_eq!(state["config"]["caption_null"], true, "{state}");
    let (labels, _) = read_labels(&run.join("labels.parquet")).unwrap();
    assert_eq!(rescored(&data, &run), labels);
    // A bank that does not fit its recorded width is refused, naming it.
    let state_path = run.join("checkpoint").join("state.json");
    let mut edited = state.clone();
    edited["pipeline"]["clean_model"]["null_dim"] = 7u64.into();
    std::fs::write(&state_path, serde_json::to_vec(&edited).unwrap()).unwrap();
    common::reseal(&run);
    let out = ncclean(&[
        "score",
        p(&data),
        "--checkpoint",
        p(&run),
        "--out",
        p(&tmp.path().join("s.parquet")),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("caption null"),
        "{err}"
    );
}

/// `n` pairs like [`boilerplate_pairs`]' real ones, except every fifth,
/// whose image embedding is one of five fixed "placeholder" vectors (an
/// "image not available" thumbnail, a logo) plus a little noise, shown
/// with the caption of another, random image (`noisy` = true).
fn placeholder_pairs(dir: &Path, n: usize) -> std::path::PathBuf {
    const DIM: usize = 16;
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let map: Vec<Vec<f32>> = (0..DIM).map(|_| rng.vec(DIM)).collect();
    let offset: Vec<f32> = rng.vec(DIM).iter().map(|x| 3.0 * x).collect();
    let placeholders: Vec<Vec<f32>> = (0..5).map(|_| rng.vec(DIM)).collect();
    let (mut img, mut txt, mut noisy) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..n {
        let z = rng.vec(DIM);
        let placeholder = i % 5 == 2;
        let shown: Vec<f32> = if placeholder {
            near(&placeholders[i % 7 % 5], &mut rng)
        } else {
            z.iter().map(|x| x + 0.1 * rng.next()).collect()
        };
        img.push(Some(shown));
        txt.push(Some(in_cone(&map, &offset, &z, &mut rng)));
        noisy.push(placeholder);
    }
    write_pairs(&dir.join("placeholder.parquet"), &img, &txt, noisy)
}

#[test]
fn the_image_null_counts_images_that_fit_no_caption_as_noise() {
    // A placeholder image fits every caption about equally, so its pairs'
    // similarities are bunched and never reach the random pairings' lower
    // tail, where the noise share is read against the captions' nulls:
    // read that way alone the share is about 0 and its pairs are called
    // clean (Flickr8k: mean clean_prob 1.00 for 0.80). Read against each
    // image's own null as well (the default), they count as noise.
    let tmp = tempfile::tempdir().unwrap();
    let data = placeholder_pairs(tmp.path(), 3000);
    let eval = |run: &Path, extra: &[&str]| {
        let mut args = vec!["--image-col", "img_emb"];
        args.extend_from_slice(extra);
        let out = fit(&data, run, &args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        eval_json(&run.join("labels.parquet"), &data)
    };
    let plain = eval(&tmp.path().join("plain"), &["--set", "caption_null=false"]);
    let run = tmp.path().join("null");
    let null = eval(&run, &[]);
    eprintln!("placeholders, without the nulls: {plain}\nwith them (default): {null}");
    let f = |m: &serde_json::Value, k: &str| m[k].as_f64().unwrap();
    // Without the nulls (and with the caption null alone, the build before
    // the image null: recall 0.47, mean 0.887, ECE 0.089) the placeholder
    // pairs are partly called clean; with both, recall 0.955, mean 0.801.
    assert!(f(&plain, "mean_clean_prob") > 0.84, "{plain}");
    assert!(f(&null, "recall") > 0.85, "{null}");
    let (ece, mean) = (f(&null, "calibration_error"), f(&null, "mean_clean_prob"));
    assert!(
        ece < 0.05 && (mean - 0.8).abs() < 0.05,
        "ECE {ece}, mean {mean}: {null}"
    );
    assert!(f(&null, "auroc") > 0.99, "{null}");
    // The final model weighs the ridge signal (the third weight) for new
    // pairs; the trained pairs, which the ridge map was fitted on, are
    // weighed without it.
    let model = &state(&run)["pipeline"]["clean_model"];
    let weights = |v: &serde_json::Value| -> Vec<f64> {
        let a = v.as_array().expect("an array of weights");
        a.iter().map(|x| x.as_f64().expect("a number")).collect()
    };
    let held = weights(&model["calibration"]["weights"]);
    let trained = weights(&model["trained_quantiles"]["weights"]);
    assert_eq!(held.len(), 3, "{model}");
    assert!(held[2] > 0.0, "ridge weight {held:?}");
    assert_eq!(trained.len(), 3, "{model}");
    assert_eq!(trained[2], 0.0, "trained pairs' ridge weight {trained:?}");
    // The image null sets the noise share at fit; `score` reads it (and
    // the ridge map) from the checkpoint and gives fit's labels.
    let (labels, _) = read_labels(&run.join("labels.parquet")).unwrap();
    assert_eq!(rescored(&data, &run), labels);
}
