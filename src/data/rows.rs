//! Turning a record batch of the mapped columns into [`PairRow`]s.
//!
//! Every per-row defect becomes a `problem` text rather than an error, so one
//! bad row never stops a run and is still reported in the labels.

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type, UInt32Type, UInt64Type, UInt8Type,
};
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::DataType;

use super::{ColumnMap, ImageKind, ImageValue, PairRow};
use crate::data::images::ImageBase;
use crate::error::Result;

/// What a batch needs to know about the file it came from.
pub(crate) struct RowContext<'a> {
    pub file_index: usize,
    pub file_stem: &'a str,
    /// Relative image paths are resolved (and confined) here.
    pub image_base: &'a ImageBase,
    pub columns: &'a ColumnMap,
    pub embedding_dim: Option<usize>,
    pub text_embedding_dim: Option<usize>,
    /// The source's own reason for a missing image (see
    /// [`source_error_column`]), when the file has one.
    pub source_error: Option<&'a str>,
}

/// img2dataset's column saying why a sample failed to download.
const SOURCE_ERROR_COLUMN: &str = "error_message";

/// Longest source reason quoted in a row's problem: labels hold one per
/// skipped row.
const SOURCE_ERROR_CHARS: usize = 200;

/// The column of `schema` whose text explains a missing image (img2dataset's
/// `error_message`), when it is a string column other than the mapped ones:
/// a row skipped for its image then says why the download failed.
pub(crate) fn source_error_column(
    schema: &arrow_schema::Schema,
    map: &ColumnMap,
) -> Option<&'static str> {
    let f = schema.field_with_name(SOURCE_ERROR_COLUMN).ok()?;
    let mapped = [
        Some(map.image.as_str()),
        Some(map.caption.as_str()),
        map.key.as_deref(),
    ];
    let string = matches!(
        f.data_type(),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
    );
    (string && !mapped.contains(&Some(SOURCE_ERROR_COLUMN))).then_some(SOURCE_ERROR_COLUMN)
}

/// Dictionary-encoded columns are expanded so the readers below only deal
/// with plain arrays.
pub(crate) fn plain(array: &ArrayRef) -> Result<ArrayRef> {
    match array.as_any_dictionary_opt() {
        Some(dict) => {
            let taken = arrow_select::take::take(dict.values().as_ref(), dict.keys(), None)
                .map_err(|e| anyhow::anyhow!("expanding a dictionary column: {e}"))?;
            Ok(taken)
        }
        None => Ok(array.clone()),
    }
}

fn column(batch: &RecordBatch, name: &str) -> Result<ArrayRef> {
    let array = batch
        .column_by_name(name)
        .ok_or_else(|| anyhow::anyhow!("column {name:?} missing from a projected batch"))?;
    plain(array)
}

pub(crate) fn string_at(array: &dyn Array, row: usize) -> Option<String> {
    if array.is_null(row) {
        return None;
    }
    match array.data_type() {
        DataType::Utf8 => Some(array.as_string::<i32>().value(row).to_owned()),
        DataType::LargeUtf8 => Some(array.as_string::<i64>().value(row).to_owned()),
        DataType::Utf8View => Some(array.as_string_view().value(row).to_owned()),
        _ => None,
    }
}

pub(crate) fn bytes_at(array: &dyn Array, row: usize) -> Option<&[u8]> {
    if array.is_null(row) {
        return None;
    }
    match array.data_type() {
        DataType::Binary => Some(array.as_binary::<i32>().value(row)),
        DataType::LargeBinary => Some(array.as_binary::<i64>().value(row)),
        DataType::BinaryView => Some(array.as_binary_view().value(row)),
        _ => None,
    }
}

/// The value of any integer column, widened so every width fits; `None`
/// when null or not an integer.
pub(crate) fn integer_at(array: &dyn Array, row: usize) -> Option<i128> {
    if array.is_null(row) {
        return None;
    }
    macro_rules! int {
        ($t:ty) => {
            Some(i128::from(array.as_primitive::<$t>().value(row)))
        };
    }
    match array.data_type() {
        DataType::Int8 => int!(Int8Type),
        DataType::Int16 => int!(Int16Type),
        DataType::Int32 => int!(Int32Type),
        DataType::Int64 => int!(Int64Type),
        DataType::UInt8 => int!(UInt8Type),
        DataType::UInt16 => int!(UInt16Type),
        DataType::UInt32 => int!(UInt32Type),
        DataType::UInt64 => int!(UInt64Type),
        _ => None,
    }
}

/// A key as ncclean writes it: integer keys in decimal, so they survive as
/// strings; `None` when null. The one rule for every reader of keys (labels
/// are joined back to data by it).
pub(crate) fn key_at(array: &dyn Array, row: usize) -> Option<String> {
    integer_at(array, row)
        .map(|v| v.to_string())
        .or_else(|| string_at(array, row))
}

/// The values of one list entry, whatever list type holds them.
pub(crate) fn list_values(array: &dyn Array, row: usize) -> Option<ArrayRef> {
    if array.is_null(row) {
        return None;
    }
    if let Some(l) = array.as_list_opt::<i32>() {
        Some(l.value(row))
    } else if let Some(l) = array.as_list_opt::<i64>() {
        Some(l.value(row))
    } else {
        array.as_fixed_size_list_opt().map(|l| l.value(row))
    }
}

/// One row's embedding, checked: not null, `dim` values when given, no
/// null or non-finite element. `what` names the column's role in the
/// reason ("image embedding", "text embedding").
fn embedding_at(
    array: &dyn Array,
    row: usize,
    dim: Option<usize>,
    what: &str,
) -> std::result::Result<Vec<f32>, String> {
    let values = list_values(array, row).ok_or_else(|| format!("{what} is null"))?;
    if let Some(d) = dim {
        if values.len() != d {
            return Err(format!("{what} has length {}, expected {d}", values.len()));
        }
    }
    if values.null_count() > 0 {
        return Err(format!("{what} has null values"));
    }
    let v: Vec<f32> = match values.data_type() {
        DataType::Float32 => values
            .as_primitive::<arrow_array::types::Float32Type>()
            .values()
            .to_vec(),
        DataType::Float64 => values
            .as_primitive::<arrow_array::types::Float64Type>()
            .values()
            .iter()
            .map(|&x| x as f32)
            .collect(),
        other => return Err(format!("{what} has element type {other}")),
    };
    if v.iter().any(|x| !x.is_finite()) {
        return Err(format!("{what} has non-finite values (NaN or inf)"));
    }
    Ok(v)
}

/// A Hugging Face image: embedded bytes when present, else its path.
fn struct_image_at(
    array: &dyn Array,
    row: usize,
    base: &ImageBase,
) -> Result<std::result::Result<ImageValue, String>> {
    if array.is_null(row) {
        return Ok(Err("image is null".into()));
    }
    let s = array
        .as_struct_opt()
        .ok_or_else(|| anyhow::anyhow!("image column is not a struct"))?;
    if let Some(bytes) = s.column_by_name("bytes") {
        let bytes = plain(bytes)?;
        if let Some(b) = bytes_at(bytes.as_ref(), row).filter(|b| !b.is_empty()) {
            return Ok(Ok(ImageValue::Bytes(b.to_vec())));
        }
    }
    if let Some(path) = s.column_by_name("path") {
        let path = plain(path)?;
        if let Some(p) = string_at(path.as_ref(), row) {
            return Ok(base.resolve(&p).map(ImageValue::Path));
        }
    }
    Ok(Err("image struct has neither bytes nor a path".into()))
}

/// Convert one batch; `first_row` is the file row of the batch's first row.
pub(crate) fn batch_to_pairs(
    batch: &RecordBatch,
    ctx: &RowContext<'_>,
    first_row: usize,
) -> Result<Vec<PairRow>> {
    let image = column(batch, &ctx.columns.image)?;
    let caption = column(batch, &ctx.columns.caption)?;
    let key = match &ctx.columns.key {
        Some(k) => Some(column(batch, k)?),
        None => None,
    };
    let text_col = match &ctx.columns.text_embedding {
        Some(t) => Some(column(batch, t)?),
        None => None,
    };
    let source_error = match ctx.source_error {
        Some(c) => Some(column(batch, c)?),
        None => None,
    };
    let mut out = Vec::with_capacity(batch.num_rows());
    for i in 0..batch.num_rows() {
        let source_row = first_row + i;
        let mut problems: Vec<String> = Vec::new();

        let key = key
            .as_ref()
            .and_then(|k| key_at(k.as_ref(), i))
            .unwrap_or_else(|| format!("{}:{source_row}", ctx.file_stem));

        let caption = match string_at(caption.as_ref(), i) {
            None => {
                problems.push("caption is null".into());
                String::new()
            }
            Some(c) => {
                if c.trim().is_empty() {
                    problems.push("caption is empty".into());
                }
                c
            }
        };

        let image_value = match ctx.columns.image_kind {
            ImageKind::Bytes => match bytes_at(image.as_ref(), i) {
                None => Err("image is null".to_string()),
                Some([]) => Err("image bytes are empty".to_string()),
                Some(b) => Ok(ImageValue::Bytes(b.to_vec())),
            },
            ImageKind::BytesPathStruct => struct_image_at(image.as_ref(), i, ctx.image_base)?,
            ImageKind::Path => match string_at(image.as_ref(), i) {
                None => Err("image path is null".to_string()),
                Some(p) => ctx.image_base.resolve(&p).map(ImageValue::Path),
            },
            ImageKind::Embedding => {
                embedding_at(image.as_ref(), i, ctx.embedding_dim, "image embedding")
                    .map(ImageValue::Embedding)
            }
        };
        let image_value = match image_value {
            Ok(v) => Some(v),
            Err(p) => {
                let why = source_error
                    .as_ref()
                    .and_then(|c| string_at(c.as_ref(), i))
                    .filter(|m| !m.trim().is_empty());
                let p = match why {
                    Some(m) => format!(
                        "{p} (source error_message: {})",
                        m.trim()
                            .chars()
                            .take(SOURCE_ERROR_CHARS)
                            .collect::<String>()
                    ),
                    None => p,
                };
                problems.push(p);
                None
            }
        };

        let text_embedding = match &text_col {
            Some(t) => {
                match embedding_at(t.as_ref(), i, ctx.text_embedding_dim, "text embedding") {
                    Ok(v) => Some(v),
                    Err(p) => {
                        problems.push(p);
                        None
                    }
                }
            }
            None => None,
        };

        out.push(PairRow {
            source_file: ctx.file_index,
            source_row,
            key,
            image: image_value,
            caption,
            text_embedding,
            problem: (!problems.is_empty()).then(|| problems.join("; ")),
        });
    }
    Ok(out)
}
