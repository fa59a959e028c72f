use std::sync::Arc;

use super::*;

fn schema(fields: Vec<(&str, DataType)>) -> Schema {
    Schema::new(
        fields
            .into_iter()
            .map(|(n, t)| Field::new(n, t, true))
            .collect::<Vec<_>>(),
    )
}

fn float_list() -> DataType {
    DataType::List(Arc::new(Field::new("item", DataType::Float32, true)))
}

fn hf_image() -> DataType {
    DataType::Struct(
        vec![
            Field::new("bytes", DataType::Binary, true),
            Field::new("path", DataType::Utf8, true),
        ]
        .into(),
    )
}

fn resolve(s: &Schema, opts: &ColumnOptions) -> Result<ColumnMap> {
    resolve_columns(Path::new("data/x.parquet"), s, opts)
}

#[test]
fn detects_each_image_kind() {
    let cases = [
        ("jpg", DataType::Binary, ImageKind::Bytes),
        ("image", hf_image(), ImageKind::BytesPathStruct),
        ("image_path", DataType::Utf8, ImageKind::Path),
        ("img_emb", float_list(), ImageKind::Embedding),
    ];
    for (name, dt, kind) in cases {
        let s = schema(vec![("caption", DataType::Utf8), (name, dt)]);
        let m = resolve(&s, &ColumnOptions::default()).unwrap();
        assert_eq!((m.image.as_str(), m.image_kind), (name, kind));
        assert_eq!(m.caption, "caption");
        assert_eq!(m.key, None);
    }
}

#[test]
fn detection_is_ordered_and_case_insensitive() {
    let s = schema(vec![
        ("image_embedding", float_list()),
        ("png", DataType::Binary),
        ("jpg", DataType::Binary),
        ("TEXT", DataType::Utf8),
        ("id", DataType::Int64),
        ("uid", DataType::Utf8),
    ]);
    let m = resolve(&s, &ColumnOptions::default()).unwrap();
    assert_eq!(m.image, "jpg");
    assert_eq!(m.caption, "TEXT");
    assert_eq!(m.key.as_deref(), Some("uid"));
}

#[test]
fn presets_pick_their_names() {
    let s = schema(vec![
        ("jpg", DataType::Binary),
        ("caption", DataType::Utf8),
        ("TEXT", DataType::Utf8),
        ("SAMPLE_ID", DataType::Int64),
        ("key", DataType::Utf8),
    ]);
    let laion = ColumnOptions {
        preset: Some(Preset::Laion),
        ..Default::default()
    };
    // After img2dataset the caption is `caption`; LAION's own id wins as key.
    let m = resolve(&s, &laion).unwrap();
    assert_eq!(
        (m.caption.as_str(), m.key.as_deref()),
        ("caption", Some("SAMPLE_ID"))
    );
    let i2d = ColumnOptions {
        preset: Some(Preset::Img2dataset),
        ..Default::default()
    };
    let m = resolve(&s, &i2d).unwrap();
    assert_eq!(
        (m.caption.as_str(), m.key.as_deref()),
        ("caption", Some("key"))
    );

    let hf = ColumnOptions {
        preset: Some(Preset::Hf),
        ..Default::default()
    };
    let h = schema(vec![("image", hf_image()), ("text", DataType::Utf8)]);
    let m = resolve(&h, &hf).unwrap();
    assert_eq!(m.image_kind, ImageKind::BytesPathStruct);
    assert_eq!(m.key, None);
    let e = resolve(&s, &hf).unwrap_err();
    assert_eq!(e.exit_code(), 3);
    assert!(e.to_string().contains("preset hf"), "{e}");
}

#[test]
fn explicit_flags_win() {
    let s = schema(vec![
        ("jpg", DataType::Binary),
        ("other_img", DataType::LargeBinary),
        ("caption", DataType::Utf8),
        ("alt", DataType::LargeUtf8),
        ("row", DataType::UInt32),
    ]);
    let opts = ColumnOptions {
        image_col: Some("other_img".into()),
        caption_col: Some("alt".into()),
        key_col: Some("row".into()),
        preset: Some(Preset::Img2dataset),
        ..Default::default()
    };
    let m = resolve(&s, &opts).unwrap();
    assert_eq!(m.image, "other_img");
    assert_eq!(m.caption, "alt");
    assert_eq!(m.key.as_deref(), Some("row"));
}

#[test]
fn missing_and_mistyped_columns_are_invalid_input() {
    let s = schema(vec![("a", DataType::Binary), ("b", DataType::Utf8)]);
    let opts = ColumnOptions {
        caption_col: Some("caption".into()),
        image_col: Some("a".into()),
        ..Default::default()
    };
    let e = resolve(&s, &opts).unwrap_err();
    assert_eq!(e.exit_code(), 3);
    assert_eq!(
        e.to_string(),
        "data/x.parquet: column \"caption\" not found; columns are: [a, b]. \
         Use --caption-col to name the caption column."
    );

    let s = schema(vec![("jpg", DataType::Int64), ("caption", DataType::Utf8)]);
    let opts = ColumnOptions {
        image_col: Some("jpg".into()),
        ..Default::default()
    };
    let e = resolve(&s, &opts).unwrap_err();
    assert_eq!(e.exit_code(), 3);
    let msg = e.to_string();
    assert!(
        msg.starts_with("data/x.parquet: column \"jpg\" has type Int64"),
        "{msg}"
    );
    assert!(msg.contains(IMAGE_EXPECTED), "{msg}");

    let e = resolve(&s, &ColumnOptions::default()).unwrap_err();
    assert_eq!(e.exit_code(), 3);
    assert!(e.to_string().contains("no image column found"), "{e}");
}

#[test]
fn image_columns_include_companions_not_caption_or_key() {
    let s = schema(vec![
        ("key", DataType::Utf8),
        ("jpg", DataType::Binary),
        ("caption", DataType::Utf8),
        ("url", DataType::Utf8),
        ("image_embedding", float_list()),
        ("score", DataType::Float32),
    ]);
    let m = resolve(&s, &ColumnOptions::default()).unwrap();
    assert_eq!(image_columns(&s, &m), vec!["jpg", "url", "image_embedding"]);
}

#[test]
fn presets_match_real_layouts() {
    let opts = |p| ColumnOptions {
        preset: Some(p),
        ..Default::default()
    };
    // img2dataset parquet output (from LAION or DataComp metadata).
    let i2d = schema(vec![
        ("key", DataType::Utf8),
        ("caption", DataType::Utf8),
        ("url", DataType::Utf8),
        ("jpg", DataType::Binary),
        ("status", DataType::Utf8),
        ("uid", DataType::Utf8),
    ]);
    for (p, key) in [
        (Preset::Img2dataset, "key"),
        (Preset::Laion, "key"),
        (Preset::Datacomp, "uid"),
    ] {
        let m = resolve(&i2d, &opts(p)).unwrap();
        assert_eq!(
            (m.image.as_str(), m.caption.as_str(), m.key.as_deref()),
            ("jpg", "caption", Some(key)),
            "{p:?}"
        );
    }
    // DataComp metadata with precomputed embeddings.
    let dc = schema(vec![
        ("uid", DataType::Utf8),
        ("text", DataType::Utf8),
        ("image_embedding", float_list()),
    ]);
    let m = resolve(&dc, &opts(Preset::Datacomp)).unwrap();
    assert_eq!(m.image_kind, ImageKind::Embedding);
    assert_eq!(m.caption, "text");
}

#[test]
fn url_only_metadata_is_refused_with_the_download_command() {
    let laion_meta = schema(vec![
        ("SAMPLE_ID", DataType::Int64),
        ("URL", DataType::Utf8),
        ("TEXT", DataType::Utf8),
    ]);
    for opts in [
        ColumnOptions::default(),
        ColumnOptions {
            preset: Some(Preset::Laion),
            ..Default::default()
        },
        ColumnOptions {
            image_col: Some("URL".into()),
            ..Default::default()
        },
    ] {
        let e = resolve(&laion_meta, &opts).unwrap_err();
        let msg = e.to_string();
        assert_eq!(e.exit_code(), 3, "{msg}");
        for needle in [
            "holds URLs",
            "img2dataset --url_list data/x.parquet",
            "--url_col URL",
            "--caption_col TEXT",
            "--preset img2dataset",
        ] {
            assert!(msg.contains(needle), "{msg:?} lacks {needle:?}");
        }
    }
}

#[test]
fn a_list_of_images_per_row_is_explained() {
    let s = schema(vec![
        (
            "images",
            DataType::List(Arc::new(Field::new("item", hf_image(), true))),
        ),
        ("text", DataType::Utf8),
    ]);
    let msg = resolve(&s, &ColumnOptions::default())
        .unwrap_err()
        .to_string();
    assert!(msg.contains("list of images per row"), "{msg}");
    assert!(msg.contains("explode(\"images\")"), "{msg}");
}

fn wanting_text(mode: TextEmbeddings) -> ColumnOptions {
    ColumnOptions {
        text_embeddings: mode,
        ..ColumnOptions::default()
    }
}

#[test]
fn text_embedding_column_is_resolved_only_when_asked_for() {
    let s = schema(vec![
        ("img_emb", float_list()),
        ("caption", DataType::Utf8),
        ("txt_emb", float_list()),
        ("TEXT_EMB", float_list()),
    ]);
    // Not read unless the text side uses it.
    let m = resolve(&s, &ColumnOptions::default()).unwrap();
    assert_eq!(m.text_embedding, None);
    // Detection walks its list in order: text_emb (any case) before txt_emb.
    for mode in [TextEmbeddings::IfPresent, TextEmbeddings::Require] {
        let m = resolve(&s, &wanting_text(mode)).unwrap();
        assert_eq!(m.text_embedding.as_deref(), Some("TEXT_EMB"));
        assert_eq!(m.image, "img_emb", "the image side is unchanged");
    }
    // An explicit name wins, and implies the column is read.
    let opts = ColumnOptions {
        text_emb_col: Some("txt_emb".into()),
        ..ColumnOptions::default()
    };
    assert_eq!(
        resolve(&s, &opts).unwrap().text_embedding.as_deref(),
        Some("txt_emb")
    );
    // Presets look at their own names first.
    let s = schema(vec![
        ("jpg", DataType::Binary),
        ("caption", DataType::Utf8),
        ("text_embedding", float_list()),
        ("l14_txt", float_list()),
    ]);
    let opts = ColumnOptions {
        preset: Some(Preset::Datacomp),
        ..wanting_text(TextEmbeddings::Require)
    };
    assert_eq!(
        resolve(&s, &opts).unwrap().text_embedding.as_deref(),
        Some("l14_txt")
    );
}

#[test]
fn text_embedding_column_must_exist_and_hold_floats_when_required() {
    let s = schema(vec![
        ("jpg", DataType::Binary),
        ("caption", DataType::Utf8),
        ("text_emb", DataType::Utf8),
    ]);
    // A string column of a text-embedding name is not one; absent is fine
    // when merely looked for, an error naming the flag when required.
    let m = resolve(&s, &wanting_text(TextEmbeddings::IfPresent)).unwrap();
    assert_eq!(m.text_embedding, None);
    let e = resolve(&s, &wanting_text(TextEmbeddings::Require))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("no text-embedding column found")
            && e.contains("text_embedding/text_emb/txt_emb")
            && e.contains("--text-emb-col"),
        "{e}"
    );
    let opts = ColumnOptions {
        text_emb_col: Some("text_emb".into()),
        ..ColumnOptions::default()
    };
    let e = resolve(&s, &opts).unwrap_err().to_string();
    assert!(
        e.contains("\"text_emb\" has type Utf8, expected a list<float> text embedding"),
        "{e}"
    );
    // One column cannot be both the image and the text embedding.
    let s = schema(vec![("caption", DataType::Utf8), ("img_emb", float_list())]);
    let opts = ColumnOptions {
        text_emb_col: Some("img_emb".into()),
        ..ColumnOptions::default()
    };
    let e = resolve(&s, &opts).unwrap_err().to_string();
    assert!(
        e.contains("cannot be both the text embedding and the image"),
        "{e}"
    );
}

#[test]
fn other_files_must_have_the_text_embedding_column_too() {
    let first = schema(vec![
        ("jpg", DataType::Binary),
        ("caption", DataType::Utf8),
        ("text_emb", float_list()),
    ]);
    let map = resolve(&first, &wanting_text(TextEmbeddings::Require)).unwrap();
    let other = schema(vec![("jpg", DataType::Binary), ("caption", DataType::Utf8)]);
    let e = check_same_columns(Path::new("b.parquet"), &other, &map, Path::new("a.parquet"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("column \"text_emb\" not found"), "{e}");
    // The text embedding travels with its caption, not with the image.
    assert_eq!(image_columns(&first, &map), vec!["jpg".to_string()]);
}

#[test]
fn options_without_text_embeddings_serialise_as_before_the_flag() {
    // `score --out-dir` hashes the serialised options into its markers:
    // runs that do not use the flag keep their markers valid.
    let json = serde_json::to_value(ColumnOptions::default()).unwrap();
    assert!(json.get("text_emb_col").is_none(), "{json}");
    assert!(json.get("text_embeddings").is_none(), "{json}");
    let opts = ColumnOptions {
        text_emb_col: Some("t".into()),
        text_embeddings: TextEmbeddings::Require,
        ..ColumnOptions::default()
    };
    let json = serde_json::to_value(&opts).unwrap();
    assert_eq!(json["text_emb_col"], "t");
    assert_eq!(json["text_embeddings"], "require");
}

#[test]
fn a_detected_name_of_the_wrong_type_is_named_with_its_type() {
    let s = schema(vec![
        ("image", DataType::Binary),
        ("caption", DataType::Int64),
    ]);
    let e = resolve(&s, &ColumnOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&format!(
            "columns are: [image, caption]. Column \"caption\" has type Int64, expected {CAPTION_EXPECTED}. Use --caption-col"
        )),
        "{e}"
    );
    let ints = DataType::List(Arc::new(Field::new("item", DataType::Int64, true)));
    let s = schema(vec![("img_emb", ints), ("caption", DataType::Utf8)]);
    let e = resolve(&s, &ColumnOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("Column \"img_emb\" has type List("), "{e}");
    // No such name at all: the message stays as it was.
    let s = schema(vec![("image", DataType::Binary), ("words", DataType::Utf8)]);
    let e = resolve(&s, &ColumnOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("columns are: [image, words]. Use --caption-col"),
        "{e}"
    );
}

#[test]
fn a_file_of_embeddings_without_captions_is_told_why_a_caption_is_needed() {
    let emb = DataType::List(Arc::new(Field::new("item", DataType::Float32, true)));
    let schema = Schema::new(vec![
        Field::new("key", DataType::Utf8, true),
        Field::new("img_emb", emb.clone(), true),
        Field::new("text_emb", emb, true),
    ]);
    let e = resolve_columns(Path::new("x.parquet"), &schema, &ColumnOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("no caption column found"), "{e}");
    assert!(
        e.contains("The text embeddings in \"text_emb\" do not replace it"),
        "{e}"
    );
    assert!(e.contains("--caption-col"), "{e}");
    // Without text embeddings the message is the plain one.
    let schema = Schema::new(vec![Field::new(
        "img_emb",
        DataType::List(Arc::new(Field::new("item", DataType::Float32, true))),
        true,
    )]);
    let e = resolve_columns(Path::new("x.parquet"), &schema, &ColumnOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("no caption column found") && !e.contains("do not replace it"),
        "{e}"
    );
}
