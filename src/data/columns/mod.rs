//! Which columns hold the image, the caption and the key.
//!
//! Order of authority: explicit flags, then the preset's names, then
//! detection by name and type. Detection walks fixed candidate lists in order
//! and takes the first usable column, so the same schema always resolves the
//! same way.

use std::path::Path;

use arrow_schema::{DataType, Field, Schema};

use super::{ColumnMap, ColumnOptions, ImageKind, Preset, TextEmbeddings};
use crate::error::{invalid, Result};

/// Encoded-image column names, in order of preference.
const IMAGE_BYTES_NAMES: &[&str] = &["image", "jpg", "jpeg", "png", "img", "image_bytes", "bytes"];
/// Image-path column names, in order of preference.
const IMAGE_PATH_NAMES: &[&str] = &["image_path", "path", "file_name", "filepath", "image_file"];
/// Image-embedding column names, in order of preference.
const IMAGE_EMBEDDING_NAMES: &[&str] = &[
    "image_embedding",
    "img_emb",
    "clip_image_embedding",
    "embedding",
    "image_features",
];
/// Text-embedding column names, in order of preference (clip-retrieval
/// writes `text_emb`; DataComp's npz files hold `l14_txt` / `b32_txt`).
const TEXT_EMBEDDING_NAMES: &[&str] = &[
    "text_embedding",
    "text_emb",
    "txt_emb",
    "text_embeddings",
    "caption_embedding",
    "clip_text_embedding",
    "text_features",
];
/// Caption column names, matched case-insensitively.
const CAPTION_NAMES: &[&str] = &["caption", "text", "txt", "sentence", "prompt"];
/// Key column names.
const KEY_NAMES: &[&str] = &["key", "uid", "SAMPLE_ID", "id", "image_id", "sample_id"];
/// Columns that describe the image rather than the pair; `corrupt` moves them
/// with the image so the noisy file stays self-consistent.
const IMAGE_COMPANION_NAMES: &[&str] = &[
    "url",
    "width",
    "height",
    "original_width",
    "original_height",
    "sha256",
];

const IMAGE_EXPECTED: &str =
    "binary image bytes, a {bytes, path} struct, a path string or a list<float> embedding";
const CAPTION_EXPECTED: &str = "a string caption";
const KEY_EXPECTED: &str = "a string or integer key";
const TEXT_EMBEDDING_EXPECTED: &str = "a list<float> text embedding";

/// The roles a column can play; carries the wording of messages.
#[derive(Clone, Copy)]
enum Role {
    Image,
    Caption,
    Key,
    TextEmbedding,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::Image => "image",
            Role::Caption => "caption",
            Role::Key => "key",
            Role::TextEmbedding => "text-embedding",
        }
    }
    fn flag(self) -> &'static str {
        match self {
            Role::Image => "--image-col",
            Role::Caption => "--caption-col",
            Role::Key => "--key-col",
            Role::TextEmbedding => "--text-emb-col",
        }
    }
    fn expected(self) -> &'static str {
        match self {
            Role::Image => IMAGE_EXPECTED,
            Role::Caption => CAPTION_EXPECTED,
            Role::Key => KEY_EXPECTED,
            Role::TextEmbedding => TEXT_EMBEDDING_EXPECTED,
        }
    }
    fn accepts(self, dt: &DataType) -> bool {
        match self {
            Role::Image => image_kind(dt).is_some(),
            Role::Caption => is_string(dt),
            Role::Key => is_string(dt) || is_integer(dt),
            Role::TextEmbedding => is_float_list(dt),
        }
    }
}

/// Column names a preset looks for, per role, in order.
struct PresetNames {
    image: &'static [&'static str],
    caption: &'static [&'static str],
    key: &'static [&'static str],
    /// Looked at before the generic text-embedding names.
    text_embedding: &'static [&'static str],
}

fn preset_names(preset: Preset) -> PresetNames {
    // Names as the data looks after img2dataset downloaded it (the
    // metadata-only shards hold URLs, which `url_only` refuses with the
    // download command): img2dataset writes the caption as `caption`
    // whatever the source column was, and keeps `key`; LAION's and
    // DataComp's own ids come along when passed as additional columns.
    match preset {
        Preset::Laion => PresetNames {
            image: &["jpg", "image_embedding", "img_emb"],
            caption: &["caption", "TEXT"],
            key: &["SAMPLE_ID", "key"],
            text_embedding: &["text_emb", "text_embedding"],
        },
        Preset::Datacomp => PresetNames {
            image: &["jpg", "image", "webp", "png", "image_embedding"],
            caption: &["caption", "text"],
            key: &["uid", "key"],
            text_embedding: &["l14_txt", "b32_txt", "text_embedding"],
        },
        Preset::Img2dataset => PresetNames {
            image: &["jpg", "webp", "png"],
            caption: &["caption"],
            key: &["key"],
            text_embedding: &[],
        },
        Preset::Hf => PresetNames {
            image: &["image", "img"],
            caption: &["text", "caption"],
            key: &["id", "image_id"],
            text_embedding: &[],
        },
    }
}

/// URL column names of web-scale metadata (LAION `URL`, DataComp and
/// img2dataset `url`).
const URL_NAMES: &[&str] = &["url", "image_url", "img_url"];

/// The download command a user with URL-only metadata needs, for messages.
fn download_hint(file: &Path, url_col: &str, caption_col: Option<&str>) -> String {
    format!(
        "ncclean reads images, not URLs: download them first, e.g. with img2dataset \
         (pip install img2dataset):\n  img2dataset --url_list {} --input_format parquet \
         --url_col {url_col} --caption_col {} --output_format parquet --output_folder shards/\n\
         then run ncclean on shards/ with --preset img2dataset",
        file.display(),
        caption_col.unwrap_or("TEXT"),
    )
}

/// A path column that holds URLs (by name, or by the first values, which
/// the caller samples) is not something ncclean can read.
pub(crate) fn url_only(
    file: &Path,
    image_col: &str,
    caption_col: Option<&str>,
    samples: &[&str],
) -> Option<crate::Error> {
    let by_name = URL_NAMES.iter().any(|n| n.eq_ignore_ascii_case(image_col));
    let by_value = samples.iter().any(|v| {
        let v = v.trim_start().to_ascii_lowercase();
        v.starts_with("http://") || v.starts_with("https://")
    });
    (by_name || by_value).then(|| {
        invalid(format!(
            "{}: the image column \"{image_col}\" holds URLs. {}",
            file.display(),
            download_hint(file, image_col, caption_col)
        ))
    })
}

/// A schema with a URL column and no image column: metadata to download.
fn url_metadata_error(file: &Path, schema: &Schema) -> Option<crate::Error> {
    let url = schema.fields().iter().find(|f| {
        URL_NAMES.iter().any(|n| n.eq_ignore_ascii_case(f.name())) && is_string(f.data_type())
    })?;
    let caption = detect_caption(schema).map(|f| f.name().as_str());
    Some(invalid(format!(
        "{}: no image column, but \"{}\" holds URLs. {}",
        file.display(),
        url.name(),
        download_hint(file, url.name(), caption)
    )))
}

/// A `list<Image>` column (several images per row, as some Hugging Face
/// datasets store them) needs exploding first; say how.
fn image_list_error(file: &Path, schema: &Schema) -> Option<crate::Error> {
    let f = schema.fields().iter().find(|f| match f.data_type() {
        DataType::List(inner) | DataType::LargeList(inner) => {
            is_bytes_struct(inner.data_type()) || is_binary(inner.data_type())
        }
        _ => false,
    })?;
    Some(invalid(format!(
        "{}: column \"{}\" holds a list of images per row; ncclean needs one image per row. \
         Explode it first, e.g. in Python: pl.read_parquet(f).explode(\"{}\").write_parquet(out) \
         (polars) or dataset.map(...) to one image per row (Hugging Face datasets), then pass --image-col {}",
        file.display(),
        f.name(),
        f.name(),
        f.name()
    )))
}

/// How a column of this type stores an image, if it can.
pub(crate) fn image_kind(dt: &DataType) -> Option<ImageKind> {
    if is_binary(dt) {
        Some(ImageKind::Bytes)
    } else if is_bytes_struct(dt) {
        Some(ImageKind::BytesPathStruct)
    } else if is_string(dt) {
        Some(ImageKind::Path)
    } else if is_float_list(dt) {
        Some(ImageKind::Embedding)
    } else {
        None
    }
}

pub(crate) fn is_string(dt: &DataType) -> bool {
    match dt {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => true,
        DataType::Dictionary(_, v) => is_string(v),
        _ => false,
    }
}

pub(crate) fn is_binary(dt: &DataType) -> bool {
    match dt {
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => true,
        DataType::Dictionary(_, v) => is_binary(v),
        _ => false,
    }
}

fn is_integer(dt: &DataType) -> bool {
    dt.is_integer()
}

fn is_float(dt: &DataType) -> bool {
    matches!(dt, DataType::Float32 | DataType::Float64)
}

fn is_float_list(dt: &DataType) -> bool {
    match dt {
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => {
            is_float(f.data_type())
        }
        _ => false,
    }
}

/// A Hugging Face `Image` feature: a struct whose `bytes` child is binary.
fn is_bytes_struct(dt: &DataType) -> bool {
    match dt {
        DataType::Struct(fields) => fields
            .iter()
            .any(|f| f.name() == "bytes" && is_binary(f.data_type())),
        _ => false,
    }
}

/// The column named `name`: an exact match first, else the first
/// case-insensitive match in schema order (so `TEXT` finds `text`).
fn find<'a>(schema: &'a Schema, name: &str) -> Option<&'a Field> {
    let fields = schema.fields();
    fields
        .iter()
        .find(|f| f.name() == name)
        .or_else(|| fields.iter().find(|f| f.name().eq_ignore_ascii_case(name)))
        .map(|f| f.as_ref())
}

fn column_list(schema: &Schema) -> String {
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    format!("[{}]", names.join(", "))
}

fn not_found(file: &Path, schema: &Schema, name: &str, role: Role) -> crate::Error {
    invalid(format!(
        "{}: column \"{name}\" not found; columns are: {}. Use {} to name the {} column.",
        file.display(),
        column_list(schema),
        role.flag(),
        role.name()
    ))
}

fn wrong_type(file: &Path, field: &Field, role: Role) -> crate::Error {
    invalid(format!(
        "{}: column \"{}\" has type {}, expected {}. Use {} to name the {} column.",
        file.display(),
        field.name(),
        field.data_type(),
        role.expected(),
        role.flag(),
        role.name()
    ))
}

/// An explicitly named column: must exist under exactly that name and have a
/// type the role accepts.
fn explicit<'a>(file: &Path, schema: &'a Schema, name: &str, role: Role) -> Result<&'a Field> {
    let field = schema
        .fields()
        .iter()
        .find(|f| f.name() == name)
        .ok_or_else(|| not_found(file, schema, name, role))?;
    if !role.accepts(field.data_type()) {
        return Err(wrong_type(file, field, role));
    }
    Ok(field)
}

/// The first of a preset's names that exists; it must have a usable type.
fn from_preset<'a>(
    file: &Path,
    schema: &'a Schema,
    preset: Preset,
    names: &[&str],
    role: Role,
) -> Result<&'a Field> {
    let field = names
        .iter()
        .find_map(|n| find(schema, n))
        .ok_or_else(|| {
            invalid(format!(
                "{}: preset {} expects a {} column named {}; columns are: {}. Use {} to name the {} column.",
                file.display(),
                preset_label(preset),
                role.name(),
                names.join(" or "),
                column_list(schema),
                role.flag(),
                role.name()
            ))
        })?;
    if !role.accepts(field.data_type()) {
        return Err(wrong_type(file, field, role));
    }
    Ok(field)
}

fn preset_label(preset: Preset) -> &'static str {
    match preset {
        Preset::Laion => "laion",
        Preset::Datacomp => "datacomp",
        Preset::Img2dataset => "img2dataset",
        Preset::Hf => "hf",
    }
}

/// The first candidate name present whose type passes `ok`.
fn detect<'a>(
    schema: &'a Schema,
    names: &[&str],
    ok: impl Fn(&DataType) -> bool,
) -> Option<&'a Field> {
    names
        .iter()
        .filter_map(|n| find(schema, n))
        .find(|f| ok(f.data_type()))
}

/// Raw pixels beat embeddings: an embedding ties the run to whatever model
/// produced it, so it is only chosen when no image is stored.
fn detect_image(schema: &Schema) -> Option<&Field> {
    detect(schema, IMAGE_BYTES_NAMES, |dt| {
        is_binary(dt) || is_bytes_struct(dt)
    })
    .or_else(|| {
        schema
            .fields()
            .iter()
            .find(|f| is_bytes_struct(f.data_type()))
            .map(|f| f.as_ref())
    })
    .or_else(|| detect(schema, IMAGE_PATH_NAMES, is_string))
    .or_else(|| detect(schema, IMAGE_EMBEDDING_NAMES, is_float_list))
}

fn detect_caption(schema: &Schema) -> Option<&Field> {
    detect(schema, CAPTION_NAMES, is_string)
}

fn detect_key(schema: &Schema) -> Option<&Field> {
    detect(schema, KEY_NAMES, |dt| Role::Key.accepts(dt))
}

/// No column for `role`; `names` are the names detection tried, so that a
/// column with one of them but another type (a `caption` of integers) is
/// named with its type rather than left for the user to spot.
fn none_found(
    file: &Path,
    schema: &Schema,
    role: Role,
    looked_for: &str,
    names: &[&str],
) -> crate::Error {
    let mistyped = names
        .iter()
        .find_map(|n| find(schema, n))
        .map(|f| {
            format!(
                " Column \"{}\" has type {}, expected {}.",
                f.name(),
                f.data_type(),
                role.expected()
            )
        })
        .unwrap_or_default();
    invalid(format!(
        "{}: no {} column found (looked for {looked_for}); columns are: {}.{mistyped} Use {} to name the {} column.",
        file.display(),
        role.name(),
        column_list(schema),
        role.flag(),
        role.name()
    ))
}

/// Resolve the column map of one file's schema; `file` only names the file
/// in messages.
pub fn resolve_columns(file: &Path, schema: &Schema, opts: &ColumnOptions) -> Result<ColumnMap> {
    let preset = opts.preset.map(|p| (p, preset_names(p)));

    let image = match (&opts.image_col, &preset) {
        (Some(name), _) => explicit(file, schema, name, Role::Image)?,
        (None, Some((p, names))) => from_preset(file, schema, *p, names.image, Role::Image)
            .map_err(|e| url_metadata_error(file, schema).unwrap_or(e))?,
        (None, None) => detect_image(schema).ok_or_else(|| {
            if let Some(e) = url_metadata_error(file, schema).or_else(|| image_list_error(file, schema)) {
                return e;
            }
            none_found(
                file,
                schema,
                Role::Image,
                &format!(
                    "binary columns {}, a {{bytes, path}} struct, path columns {}, embedding columns {}",
                    IMAGE_BYTES_NAMES.join("/"),
                    IMAGE_PATH_NAMES.join("/"),
                    IMAGE_EMBEDDING_NAMES.join("/")
                ),
                &[IMAGE_BYTES_NAMES, IMAGE_PATH_NAMES, IMAGE_EMBEDDING_NAMES].concat(),
            )
        })?,
    };
    let caption = match (&opts.caption_col, &preset) {
        (Some(name), _) => explicit(file, schema, name, Role::Caption)?,
        (None, Some((p, names))) => from_preset(file, schema, *p, names.caption, Role::Caption)?,
        (None, None) => detect_caption(schema).ok_or_else(|| {
            let e = none_found(
                file,
                schema,
                Role::Caption,
                &format!("string columns {}", CAPTION_NAMES.join("/")),
                CAPTION_NAMES,
            );
            // Embedding-only files (img_emb + text_emb) have the text side
            // already, so say why a caption is still asked for.
            match detect(schema, TEXT_EMBEDDING_NAMES, is_float_list) {
                Some(t) => invalid(format!(
                    "{e} The text embeddings in \"{}\" do not replace it: labels, filters and \
                     the report show each pair's caption. A file without captions can name any \
                     string column (its key, say) with --caption-col.",
                    t.name()
                )),
                None => e,
            }
        })?,
    };
    // A key is optional: a preset's key name that is absent falls back to
    // detection and then to `<file stem>:<row>` instead of failing.
    let key = match (&opts.key_col, &preset) {
        (Some(name), _) => Some(explicit(file, schema, name, Role::Key)?),
        (None, Some((_, names))) => match names.key.iter().find_map(|n| find(schema, n)) {
            Some(f) if Role::Key.accepts(f.data_type()) => Some(f),
            Some(f) => return Err(wrong_type(file, f, Role::Key)),
            None => detect_key(schema),
        },
        (None, None) => detect_key(schema),
    };

    if image.name() == caption.name() {
        return Err(invalid(format!(
            "{}: column \"{}\" cannot be both the image and the caption. Use --image-col and --caption-col to name them.",
            file.display(),
            image.name()
        )));
    }
    let text_embedding = resolve_text_embedding(file, schema, opts, &preset)?;
    if let Some(t) = text_embedding {
        if t.name() == image.name() || t.name() == caption.name() {
            return Err(invalid(format!(
                "{}: column \"{}\" cannot be both the text embedding and the {}. Use --text-emb-col to name the text-embedding column.",
                file.display(),
                t.name(),
                if t.name() == image.name() { "image" } else { "caption" }
            )));
        }
    }
    let image_kind =
        image_kind(image.data_type()).ok_or_else(|| wrong_type(file, image, Role::Image))?;
    if image_kind == ImageKind::Path {
        if let Some(e) = url_only(file, image.name(), Some(caption.name()), &[]) {
            return Err(e);
        }
    }
    Ok(ColumnMap {
        image: image.name().clone(),
        image_kind,
        caption: caption.name().clone(),
        key: key.map(|f| f.name().clone()),
        text_embedding: text_embedding.map(|f| f.name().clone()),
    })
}

/// The text-embedding column, when [`ColumnOptions::text_embeddings`] asks
/// for one: the explicit name, else the preset's names, else detection.
fn resolve_text_embedding<'a>(
    file: &Path,
    schema: &'a Schema,
    opts: &ColumnOptions,
    preset: &Option<(Preset, PresetNames)>,
) -> Result<Option<&'a Field>> {
    if let Some(name) = &opts.text_emb_col {
        return explicit(file, schema, name, Role::TextEmbedding).map(Some);
    }
    if opts.text_embeddings == TextEmbeddings::Ignore {
        return Ok(None);
    }
    let preset_names = preset.as_ref().map_or(&[][..], |(_, n)| n.text_embedding);
    let found = detect(schema, preset_names, is_float_list)
        .or_else(|| detect(schema, TEXT_EMBEDDING_NAMES, is_float_list));
    match (found, opts.text_embeddings) {
        (None, TextEmbeddings::Require) => Err(none_found(
            file,
            schema,
            Role::TextEmbedding,
            &format!(
                "list<float> columns {}",
                preset_names
                    .iter()
                    .chain(TEXT_EMBEDDING_NAMES)
                    .copied()
                    .collect::<Vec<_>>()
                    .join("/")
            ),
            &[preset_names, TEXT_EMBEDDING_NAMES].concat(),
        )),
        (found, _) => Ok(found),
    }
}

/// Check that another file of the set has the columns `map` resolved on the
/// first file, with compatible types. The first file's map is authoritative
/// so that one extra column in a later shard cannot change detection.
pub(crate) fn check_same_columns(
    file: &Path,
    schema: &Schema,
    map: &ColumnMap,
    first: &Path,
) -> Result<()> {
    let mismatch = |what: String| {
        invalid(format!(
            "{}: {what}; all input files must share the columns of {} (image \"{}\", caption \"{}\"{}).",
            file.display(),
            first.display(),
            map.image,
            map.caption,
            map.key
                .as_ref()
                .map(|k| format!(", key \"{k}\""))
                .unwrap_or_default()
        ))
    };
    let lookup = |name: &str| {
        schema
            .fields()
            .iter()
            .find(|f| f.name() == name)
            .ok_or_else(|| {
                mismatch(format!(
                    "column \"{name}\" not found; columns are: {}",
                    column_list(schema)
                ))
            })
    };
    let image = lookup(&map.image)?;
    if image_kind(image.data_type()) != Some(map.image_kind) {
        return Err(mismatch(format!(
            "column \"{}\" has type {}, unlike the first file",
            image.name(),
            image.data_type()
        )));
    }
    let caption = lookup(&map.caption)?;
    if !is_string(caption.data_type()) {
        return Err(mismatch(format!(
            "column \"{}\" has type {}, expected {CAPTION_EXPECTED}",
            caption.name(),
            caption.data_type()
        )));
    }
    if let Some(t) = &map.text_embedding {
        let text = lookup(t)?;
        if !is_float_list(text.data_type()) {
            return Err(mismatch(format!(
                "column \"{}\" has type {}, expected {TEXT_EMBEDDING_EXPECTED}",
                text.name(),
                text.data_type()
            )));
        }
    }
    if let Some(k) = &map.key {
        let key = lookup(k)?;
        if !Role::Key.accepts(key.data_type()) {
            return Err(mismatch(format!(
                "column \"{}\" has type {}, expected {KEY_EXPECTED}",
                key.name(),
                key.data_type()
            )));
        }
    }
    Ok(())
}

/// Every column of `schema` that belongs to the image rather than to the
/// pair: the mapped image column, other columns detection would accept as an
/// image (so noise reaches whichever image column a later run picks), and
/// known per-image metadata such as `url`, `width`, `sha256`. Schema order.
pub fn image_columns(schema: &Schema, map: &ColumnMap) -> Vec<String> {
    let is_image_like = |f: &Field| {
        let dt = f.data_type();
        let lower = f.name().to_ascii_lowercase();
        let named = |names: &[&str]| names.iter().any(|n| n.eq_ignore_ascii_case(&lower));
        f.name() == &map.image
            || is_bytes_struct(dt)
            || (named(IMAGE_BYTES_NAMES) && is_binary(dt))
            || (named(IMAGE_PATH_NAMES) && is_string(dt))
            || (named(IMAGE_EMBEDDING_NAMES) && is_float_list(dt))
            || named(IMAGE_COMPANION_NAMES)
    };
    schema
        .fields()
        .iter()
        .filter(|f| {
            f.name() != &map.caption
                && Some(f.name()) != map.key.as_ref()
                && Some(f.name()) != map.text_embedding.as_ref()
        })
        .filter(|f| is_image_like(f))
        .map(|f| f.name().clone())
        .collect()
}

#[cfg(test)]
mod tests;
