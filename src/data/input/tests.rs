use std::sync::Arc;

use arrow_array::{ArrayRef, Int64Array, RecordBatch};

use super::*;
use crate::data::images::ImageLimits;
use crate::data::testutil::{binaries, float_lists, hf_images, strings, write_parquet};
use crate::data::{ImageValue, Preset};

fn all_pairs(set: &InputSet, batch_rows: usize) -> Vec<PairRow> {
    let mut out = Vec::new();
    for b in set.pairs(batch_rows) {
        let b = b.unwrap();
        assert!(b.len() <= batch_rows);
        out.extend(b);
    }
    out
}

fn open(paths: &[PathBuf]) -> Result<InputSet> {
    InputSet::open(paths, &ColumnOptions::default())
}

/// img2dataset's own reason for a failed download reaches the skipped
/// row's problem (issue #14 item 6); its status column does not matter.
#[test]
fn img2dataset_error_message_is_quoted_for_a_missing_image() {
    let dir = tempfile::tempdir().unwrap();
    let p = write_parquet(
        dir.path(),
        "00000.parquet",
        vec![
            (
                "key",
                strings(&[Some("000000000"), Some("000000001"), Some("000000002")]),
            ),
            ("jpg", binaries(&[Some(b"img0"), None, None])),
            (
                "caption",
                strings(&[Some("a dog"), Some("a cat"), Some("a cow")]),
            ),
            (
                "status",
                strings(&[
                    Some("success"),
                    Some("failed_to_download"),
                    Some("failed_to_download"),
                ]),
            ),
            (
                "error_message",
                strings(&[None, Some("HTTP Error 404: Not Found"), Some("  ")]),
            ),
        ],
    );
    let set = open(&[p]).unwrap();
    let rows = all_pairs(&set, 8);
    assert_eq!(rows[0].problem, None);
    assert_eq!(
        rows[1].problem.as_deref(),
        Some("image is null (source error_message: HTTP Error 404: Not Found)")
    );
    // A blank message adds nothing.
    assert_eq!(rows[2].problem.as_deref(), Some("image is null"));
}

#[test]
fn bytes_images_stream_with_keys_and_problems() {
    let dir = tempfile::tempdir().unwrap();
    let p = write_parquet(
        dir.path(),
        "a.parquet",
        vec![
            (
                "key",
                strings(&[Some("k0"), Some("k1"), Some("k2"), Some("k3"), Some("k4")]),
            ),
            (
                "jpg",
                binaries(&[Some(b"img0"), None, Some(b"img2"), Some(b"img3"), Some(b"")]),
            ),
            (
                "caption",
                strings(&[Some("a dog"), Some("a cat"), None, Some("  \t"), Some("ok")]),
            ),
        ],
    );
    let set = open(&[p]).unwrap();
    assert_eq!(set.columns.image_kind, ImageKind::Bytes);
    assert_eq!(set.num_rows(), 5);
    let rows = all_pairs(&set, 2);
    let keys: Vec<&str> = rows.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(keys, ["k0", "k1", "k2", "k3", "k4"]);
    assert_eq!(rows[0].image, Some(ImageValue::Bytes(b"img0".to_vec())));
    assert_eq!(rows[0].caption, "a dog");
    assert_eq!(rows[0].problem, None);
    assert_eq!(rows[1].problem.as_deref(), Some("image is null"));
    assert_eq!(rows[1].image, None);
    assert_eq!(rows[2].problem.as_deref(), Some("caption is null"));
    assert_eq!(rows[3].problem.as_deref(), Some("caption is empty"));
    assert_eq!(rows[4].problem.as_deref(), Some("image bytes are empty"));
}

#[test]
fn hf_struct_uses_bytes_then_path() {
    let dir = tempfile::tempdir().unwrap();
    let p = write_parquet(
        dir.path(),
        "hf.parquet",
        vec![
            (
                "image",
                hf_images(
                    &[Some(b"png!"), None, None],
                    &[Some("x.png"), Some("y.png"), None],
                ),
            ),
            ("text", strings(&[Some("a"), Some("b"), Some("c")])),
            (
                "id",
                Arc::new(Int64Array::from(vec![10, 11, 12])) as ArrayRef,
            ),
        ],
    );
    let opts = ColumnOptions {
        preset: Some(Preset::Hf),
        ..Default::default()
    };
    let set = InputSet::open(&[p], &opts).unwrap();
    assert_eq!(set.columns.image_kind, ImageKind::BytesPathStruct);
    let rows = all_pairs(&set, 10);
    assert_eq!(rows[0].image, Some(ImageValue::Bytes(b"png!".to_vec())));
    assert_eq!(
        rows[1].image,
        Some(ImageValue::Path(dir.path().join("y.png")))
    );
    assert!(rows[2]
        .problem
        .as_deref()
        .unwrap()
        .contains("neither bytes nor a path"));
    let keys: Vec<&str> = rows.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(keys, ["10", "11", "12"], "integer keys become strings");
}

#[test]
fn path_images_resolve_next_to_file_or_under_image_root() {
    let dir = tempfile::tempdir().unwrap();
    let p = write_parquet(
        dir.path(),
        "p.parquet",
        vec![
            (
                "image_path",
                strings(&[Some("imgs/a.jpg"), Some("/abs/b.jpg"), Some(""), None]),
            ),
            (
                "caption",
                strings(&[Some("a"), Some("b"), Some("c"), Some("d")]),
            ),
        ],
    );
    let set = open(std::slice::from_ref(&p)).unwrap();
    assert_eq!(set.columns.image_kind, ImageKind::Path);
    let rows = all_pairs(&set, 3);
    assert_eq!(
        rows[0].image,
        Some(ImageValue::Path(dir.path().join("imgs/a.jpg")))
    );
    // Absolute paths are refused unless asked for (see crate::data::images).
    assert_eq!(rows[1].image, None);
    assert!(rows[1].problem.as_deref().unwrap().contains("is absolute"));
    assert_eq!(rows[2].problem.as_deref(), Some("image path is empty"));
    assert_eq!(rows[3].problem.as_deref(), Some("image path is null"));

    let opts = ColumnOptions {
        image_root: Some(PathBuf::from("/data/root")),
        image_limits: ImageLimits {
            allow_absolute_paths: true,
            ..Default::default()
        },
        ..Default::default()
    };
    let set = InputSet::open(&[p], &opts).unwrap();
    let rows = all_pairs(&set, 3);
    assert_eq!(
        rows[0].image,
        Some(ImageValue::Path(PathBuf::from("/data/root/imgs/a.jpg")))
    );
    assert_eq!(
        rows[1].image,
        Some(ImageValue::Path(PathBuf::from("/abs/b.jpg")))
    );
}

#[test]
fn embeddings_check_length_and_finiteness() {
    let dir = tempfile::tempdir().unwrap();
    let p = write_parquet(
        dir.path(),
        "e.parquet",
        vec![
            (
                "image_embedding",
                float_lists(&[
                    Some(vec![1.0, 2.0, 3.0]),
                    Some(vec![0.0, f32::NAN, 1.0]),
                    Some(vec![1.0, 2.0]),
                    None,
                    Some(vec![4.0, 5.0, f32::INFINITY]),
                    Some(vec![7.0, 8.0, 9.0]),
                ]),
            ),
            (
                "caption",
                strings(&[
                    Some("a"),
                    Some("b"),
                    Some("c"),
                    Some("d"),
                    Some("e"),
                    Some("f"),
                ]),
            ),
        ],
    );
    let set = open(&[p]).unwrap();
    assert_eq!(set.columns.image_kind, ImageKind::Embedding);
    assert_eq!(set.embedding_dim, Some(3));
    let rows = all_pairs(&set, 4);
    assert_eq!(
        rows[0].image,
        Some(ImageValue::Embedding(vec![1.0, 2.0, 3.0]))
    );
    assert_eq!(rows[0].problem, None);
    assert!(rows[1].problem.as_deref().unwrap().contains("NaN"));
    assert_eq!(
        rows[2].problem.as_deref(),
        Some("image embedding has length 2, expected 3")
    );
    assert_eq!(rows[3].problem.as_deref(), Some("image embedding is null"));
    assert!(rows[4].problem.as_deref().unwrap().contains("inf"));
    assert_eq!(rows[5].problem, None);
}

fn simple(dir: &Path, name: &str, captions: &[&str]) -> PathBuf {
    let caps: Vec<Option<&str>> = captions.iter().map(|c| Some(*c)).collect();
    let imgs: Vec<Option<&[u8]>> = captions.iter().map(|c| Some(c.as_bytes())).collect();
    write_parquet(
        dir,
        name,
        vec![("jpg", binaries(&imgs)), ("caption", strings(&caps))],
    )
}

#[test]
fn files_stream_in_order_with_stem_keys() {
    let dir = tempfile::tempdir().unwrap();
    simple(dir.path(), "part-1.parquet", &["c", "d", "e"]);
    simple(dir.path(), "part-0.parquet", &["a", "b"]);
    std::fs::write(dir.path().join("notes.txt"), "not data").unwrap();
    let set = open(&[dir.path().to_path_buf()]).unwrap();
    assert_eq!(set.files.len(), 2);
    assert_eq!(set.columns.key, None);
    assert_eq!(set.num_rows(), 5);
    assert!(set.display_name(0).ends_with("part-0.parquet"));
    let rows = all_pairs(&set, 2);
    let got: Vec<(usize, usize, &str, &str)> = rows
        .iter()
        .map(|r| {
            (
                r.source_file,
                r.source_row,
                r.key.as_str(),
                r.caption.as_str(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (0, 0, "part-0:0", "a"),
            (0, 1, "part-0:1", "b"),
            (1, 0, "part-1:0", "c"),
            (1, 1, "part-1:1", "d"),
            (1, 2, "part-1:2", "e"),
        ]
    );

    let glob = open(&[dir.path().join("part-*.parquet")]).unwrap();
    assert_eq!(glob.files.len(), 2);
    assert_eq!(glob.display_name(1), set.display_name(1));
    let e = open(&[dir.path().join("nothing-*.parquet")]).unwrap_err();
    assert_eq!(e.exit_code(), 3);

    let batches: Vec<RecordBatch> = set
        .record_batches(1, 2)
        .unwrap()
        .map(|b| b.unwrap())
        .collect();
    assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 3);
    assert_eq!(batches[0].num_columns(), 2);
}

#[test]
fn fingerprint_depends_on_content_not_names() {
    let dir = tempfile::tempdir().unwrap();
    let a = simple(dir.path(), "a.parquet", &["x", "y"]);
    let b = dir.path().join("renamed.parquet");
    std::fs::copy(&a, &b).unwrap();
    let c = simple(dir.path(), "c.parquet", &["x", "z"]);
    let fa = open(&[a]).unwrap().fingerprint().unwrap();
    let fb = open(&[b]).unwrap().fingerprint().unwrap();
    let fc = open(&[c]).unwrap().fingerprint().unwrap();
    assert_eq!(fa, fb);
    assert_ne!(fa, fc);
    assert_eq!(fa.len(), 64);
}

#[test]
fn fingerprint_read_beside_other_work_is_the_same_or_gives_up() {
    use std::sync::atomic::AtomicBool;
    let dir = tempfile::tempdir().unwrap();
    let a = simple(dir.path(), "a.parquet", &["x", "y"]);
    let want = open(std::slice::from_ref(&a))
        .unwrap()
        .fingerprint()
        .unwrap();
    let go = AtomicBool::new(false);
    assert_eq!(
        open(std::slice::from_ref(&a))
            .unwrap()
            .fingerprint_unless(&go)
            .unwrap(),
        want
    );
    // Stopped before its first MiB: an error, and nothing remembered.
    let set = open(&[a]).unwrap();
    assert!(set.fingerprint_unless(&AtomicBool::new(true)).is_err());
    assert_eq!(set.fingerprint().unwrap(), want);
}

fn assert_invalid(result: Result<InputSet>, needles: &[&str]) {
    let e = result.expect_err("expected an error");
    assert_eq!(e.exit_code(), 3, "{e}");
    let msg = e.to_string();
    for n in needles {
        assert!(msg.contains(n), "{msg:?} lacks {n:?}");
    }
}

#[test]
fn bad_files_are_invalid_input_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.parquet");
    std::fs::write(&empty, b"").unwrap();
    assert_invalid(
        open(&[empty]),
        &["empty.parquet", "0 bytes", "expected a parquet file"],
    );

    let text = dir.path().join("text.parquet");
    std::fs::write(&text, b"key,caption\n1,hello\n").unwrap();
    assert_invalid(
        open(&[text]),
        &["text.parquet", "not a readable parquet file"],
    );

    let zero = write_parquet(
        dir.path(),
        "zero.parquet",
        vec![("jpg", binaries(&[])), ("caption", strings(&[]))],
    );
    assert_invalid(open(&[zero]), &["zero.parquet", "no rows"]);

    assert_invalid(
        open(&[dir.path().join("missing.parquet")]),
        &["missing.parquet", "no such file"],
    );
}

#[test]
fn missing_and_mistyped_columns_name_file_column_and_flag() {
    let dir = tempfile::tempdir().unwrap();
    let p = write_parquet(
        dir.path(),
        "x.parquet",
        vec![
            ("jpg", binaries(&[Some(b"i")])),
            ("words", strings(&[Some("w")])),
        ],
    );
    assert_invalid(
        open(std::slice::from_ref(&p)),
        &[
            "x.parquet",
            "no caption column found",
            "[jpg, words]",
            "--caption-col",
        ],
    );
    let opts = ColumnOptions {
        caption_col: Some("caption".into()),
        ..Default::default()
    };
    assert_invalid(
        InputSet::open(std::slice::from_ref(&p), &opts),
        &["x.parquet: column \"caption\" not found; columns are: [jpg, words]. Use --caption-col"],
    );
    let opts = ColumnOptions {
        image_col: Some("words".into()),
        caption_col: Some("jpg".into()),
        ..Default::default()
    };
    assert_invalid(
        InputSet::open(&[p], &opts),
        &["column \"jpg\" has type Binary, expected a string caption"],
    );
}

#[test]
fn mismatched_files_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let a = simple(dir.path(), "a.parquet", &["x"]);
    let b = write_parquet(
        dir.path(),
        "b.parquet",
        vec![
            ("jpg", binaries(&[Some(b"i")])),
            ("text", strings(&[Some("w")])),
        ],
    );
    assert_invalid(
        open(&[a.clone(), b]),
        &["b.parquet", "column \"caption\" not found", "a.parquet"],
    );
    let c = write_parquet(
        dir.path(),
        "c.parquet",
        vec![
            ("jpg", strings(&[Some("path.jpg")])),
            ("caption", strings(&[Some("w")])),
        ],
    );
    assert_invalid(
        open(&[a.clone(), c]),
        &["c.parquet", "\"jpg\" has type Utf8"],
    );
    assert_invalid(open(&[a.clone(), a]), &["more than once"]);
}

#[test]
fn a_damaged_row_group_comes_out_as_problem_rows_in_small_batches() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_parquet(
        dir.path(),
        "shard.parquet",
        vec![
            (
                "key",
                strings(&[Some("k0"), Some("k1"), Some("k2"), Some("k3"), Some("k4")]),
            ),
            (
                "jpg",
                binaries(&[Some(b"a"), Some(b"b"), Some(b"c"), Some(b"d"), Some(b"e")]),
            ),
            (
                "caption",
                strings(&[Some("c0"), Some("c1"), Some("c2"), Some("c3"), Some("c4")]),
            ),
        ],
    );
    crate::data::testutil::corrupt_page(&path, 1, "caption");
    let set = InputSet::open(&[path], &ColumnOptions::default()).unwrap();
    let batches: Vec<Vec<PairRow>> = set.pairs(1).map(|b| b.unwrap()).collect();
    assert!(
        batches.iter().all(|b| b.len() == 1),
        "at most batch_rows at a time"
    );
    let rows: Vec<PairRow> = batches.into_iter().flatten().collect();
    let keys: Vec<&str> = rows.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(keys, ["k0", "k1", "shard:2", "shard:3", "k4"]);
    for r in &rows {
        let damaged = r.source_row == 2 || r.source_row == 3;
        let p = r.problem.as_deref().unwrap_or("");
        assert_eq!(damaged, p.starts_with("row group 1 of "), "{r:?}");
        assert_eq!(
            damaged,
            p.contains("could not be read (column \"caption\": "),
            "{r:?}"
        );
    }
    // Whole-file readers need every row: invalid input naming the damage.
    let e = set
        .record_batches(0, 10)
        .unwrap()
        .find_map(|b| b.err())
        .expect("an error");
    assert_eq!(e.exit_code(), 3);
    assert!(e.to_string().starts_with("row group 1 of "), "{e}");
}

#[test]
fn a_path_column_of_urls_is_refused_up_front() {
    let dir = tempfile::tempdir().unwrap();
    let f = write_parquet(
        dir.path(),
        "meta.parquet",
        vec![
            (
                "image_path",
                strings(&[Some("https://example.com/a.jpg"), Some("http://x/b.png")]),
            ),
            ("caption", strings(&[Some("a"), Some("b")])),
        ],
    );
    assert_invalid(
        open(&[f]),
        &[
            "holds URLs",
            "img2dataset --url_list",
            "--url_col image_path",
        ],
    );
    // Plain relative paths still open.
    let g = write_parquet(
        dir.path(),
        "paths.parquet",
        vec![
            ("image_path", strings(&[Some("a.jpg"), Some("http_b.png")])),
            ("caption", strings(&[Some("a"), Some("b")])),
        ],
    );
    assert!(open(&[g]).is_ok());
}

#[test]
fn text_embeddings_are_read_and_checked_like_image_ones() {
    let dir = tempfile::tempdir().unwrap();
    let p = write_parquet(
        dir.path(),
        "t.parquet",
        vec![
            (
                "jpg",
                binaries(&[
                    Some(&b"a"[..]),
                    Some(&b"b"[..]),
                    Some(&b"c"[..]),
                    Some(&b"d"[..]),
                ]),
            ),
            (
                "caption",
                strings(&[Some("a"), Some("b"), Some("c"), Some("d")]),
            ),
            (
                "text_emb",
                float_lists(&[
                    Some(vec![0.5, -1.0]),
                    None,
                    Some(vec![1.0]),
                    Some(vec![f32::NAN, 0.0]),
                ]),
            ),
        ],
    );
    // Ignored by default: its defects skip no row.
    let set = open(std::slice::from_ref(&p)).unwrap();
    assert_eq!(set.text_embedding_dim, None);
    assert!(all_pairs(&set, 3)
        .iter()
        .all(|r| r.problem.is_none() && r.text_embedding.is_none()));

    let opts = ColumnOptions {
        text_embeddings: crate::data::TextEmbeddings::Require,
        ..ColumnOptions::default()
    };
    let set = InputSet::open(&[p], &opts).unwrap();
    assert_eq!(set.columns.text_embedding.as_deref(), Some("text_emb"));
    // The most common length among the first rows.
    assert_eq!(set.text_embedding_dim, Some(2));
    let rows = all_pairs(&set, 3);
    assert_eq!(rows[0].text_embedding, Some(vec![0.5, -1.0]));
    assert_eq!(rows[0].problem, None);
    assert_eq!(rows[0].caption, "a", "the caption is still read");
    assert_eq!(rows[1].problem.as_deref(), Some("text embedding is null"));
    assert_eq!(
        rows[2].problem.as_deref(),
        Some("text embedding has length 1, expected 2")
    );
    assert_eq!(
        rows[3].problem.as_deref(),
        Some("text embedding has non-finite values (NaN or inf)")
    );
    assert!(rows[1..].iter().all(|r| r.text_embedding.is_none()));
}

#[test]
fn a_text_embedding_column_without_values_is_an_error_only_when_required() {
    let dir = tempfile::tempdir().unwrap();
    let p = write_parquet(
        dir.path(),
        "n.parquet",
        vec![
            ("jpg", binaries(&[Some(&b"a"[..]), Some(&b"b"[..])])),
            ("caption", strings(&[Some("a"), Some("b")])),
            ("text_emb", float_lists(&[None, None])),
        ],
    );
    let with = |mode| ColumnOptions {
        text_embeddings: mode,
        ..ColumnOptions::default()
    };
    let set = InputSet::open(
        std::slice::from_ref(&p),
        &with(crate::data::TextEmbeddings::IfPresent),
    )
    .unwrap();
    assert_eq!(set.columns.text_embedding, None);
    assert_invalid(
        InputSet::open(&[p], &with(crate::data::TextEmbeddings::Require)),
        &["n.parquet", "\"text_emb\" holds no readable embedding"],
    );
}
