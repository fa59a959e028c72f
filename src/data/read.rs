//! Reading a parquet file row group by row group, so that damage stays where
//! it is.
//!
//! A corrupt data page (or anything else the decoder rejects) costs the rows
//! of its row group from the failing batch on, never the whole file: the
//! stream reports those rows as a [`Damage`] naming the file, the row group
//! and the column, and goes on with the next row group. Users curate
//! thousands of shards, and one bad row group must not end a run of hours.
//!
//! Strings are read as bytes where the file allows it ([`FileReader`]'s
//! byte-reading metadata) and checked per value by [`restore_strings`], so
//! invalid UTF-8 in one caption costs that row only.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use arrow_array::cast::AsArray;
use arrow_array::types::{
    ArrowDictionaryKeyType, Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type, UInt32Type,
    UInt64Type, UInt8Type,
};
use arrow_array::{
    Array, ArrayRef, DictionaryArray, FixedSizeListArray, GenericBinaryArray, GenericListArray,
    GenericStringArray, OffsetSizeTrait, RecordBatch, StringViewArray, StructArray,
};
use arrow_buffer::ArrowNativeType;
use arrow_schema::{DataType, Field, FieldRef, Fields, Schema, SchemaRef};
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReader,
    ParquetRecordBatchReaderBuilder,
};
use parquet::arrow::ProjectionMask;
use parquet::basic::{ConvertedType, LogicalType, Type as PhysicalType};
use parquet::file::metadata::{FileMetaData, ParquetMetaData};
use parquet::schema::types::{SchemaDescriptor, Type, TypePtr};

use crate::error::Result;

/// Rows of a row group that could not be decoded.
#[derive(Debug, Clone, PartialEq)]
pub struct Damage {
    /// The file, as the user named it.
    pub path: PathBuf,
    /// Index of the row group in the file (0-based, as parquet tools count).
    pub row_group: usize,
    /// File row of the first lost row.
    pub first_row: usize,
    /// Number of rows lost (to the end of the row group).
    pub rows: usize,
    /// The top-level column that fails to decode on its own, when one does.
    pub column: Option<String>,
    /// The decoder's error.
    pub detail: String,
}

impl Damage {
    /// `row group 3 of shards/0001.parquet could not be read (column
    /// "caption": <error>)`: what labels and warnings say about these rows.
    pub fn reason(&self) -> String {
        match &self.column {
            Some(c) => format!(
                "row group {} of {} could not be read (column \"{c}\": {})",
                self.row_group,
                self.path.display(),
                self.detail
            ),
            None => format!(
                "row group {} of {} could not be read ({})",
                self.row_group,
                self.path.display(),
                self.detail
            ),
        }
    }
}

/// What a row-group stream yields.
pub(crate) enum Piece {
    /// Decoded rows; `first_row` is the file row of the batch's first row.
    Rows {
        batch: RecordBatch,
        first_row: usize,
    },
    /// Rows that could not be decoded.
    Damaged(Damage),
}

/// One open parquet file, its footer parsed once.
pub(crate) struct FileReader {
    path: PathBuf,
    file: File,
    /// The file as written: strings are validated by the decoder.
    strict: ArrowReaderMetadata,
    /// The same file with every string leaf read as bytes, `None` when it
    /// has no strings or the reader refuses the substitution.
    bytes: Option<ArrowReaderMetadata>,
}

impl FileReader {
    /// Open `path` and parse its footer; a footer that does not parse is
    /// [`crate::Error::InvalidInput`].
    pub fn open(path: &Path) -> Result<FileReader> {
        let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let strict = guarded(|| ArrowReaderMetadata::load(&file, ArrowReaderOptions::new()))
            .map_err(|e| {
                crate::error::invalid(format!(
                    "{}: not a readable parquet file ({e}); expected a parquet file with image and caption columns",
                    path.display()
                ))
            })?;
        let bytes = bytes_metadata(&strict);
        Ok(FileReader {
            path: path.to_path_buf(),
            file,
            strict,
            bytes,
        })
    }

    /// The arrow schema of the file as written.
    pub fn schema(&self) -> &SchemaRef {
        self.strict.schema()
    }

    /// The parsed footer.
    pub fn metadata(&self) -> &Arc<ParquetMetaData> {
        self.strict.metadata()
    }

    /// Rows of each row group according to the footer (negative counts, which
    /// only a damaged footer has, read as 0).
    pub fn row_group_rows(&self) -> Vec<usize> {
        self.metadata()
            .row_groups()
            .iter()
            .map(|g| g.num_rows().max(0) as usize)
            .collect()
    }

    /// Stream `columns` (all when `None`) row group by row group, damage
    /// reported in place. With `strings_as_bytes`, string columns come back
    /// as binary where the file allows it (see [`restore_strings`]); check
    /// each batch's types against [`FileReader::schema`].
    pub fn stream(
        self: &Arc<Self>,
        columns: Option<&[&str]>,
        batch_rows: usize,
        strings_as_bytes: bool,
    ) -> RowGroupStream {
        self.stream_groups(
            columns,
            batch_rows,
            strings_as_bytes,
            (0..self.metadata().num_row_groups()).collect(),
        )
    }

    /// [`FileReader::stream`] over the given row groups only, in order.
    pub fn stream_groups(
        self: &Arc<Self>,
        columns: Option<&[&str]>,
        batch_rows: usize,
        strings_as_bytes: bool,
        groups: Vec<usize>,
    ) -> RowGroupStream {
        let rows = self.row_group_rows();
        let mut starts = Vec::with_capacity(rows.len());
        let mut at = 0usize;
        for n in &rows {
            starts.push(at);
            at = at.saturating_add(*n);
        }
        RowGroupStream {
            reader: self.clone(),
            columns: columns.map(|c| c.iter().map(|s| s.to_string()).collect()),
            batch_rows: batch_rows.max(1),
            bytes: strings_as_bytes && self.bytes.is_some(),
            groups: groups.into_iter().filter(|&g| g < rows.len()).collect(),
            next_group: 0,
            rows,
            starts,
            current: None,
            done: 0,
        }
    }

    fn meta(&self, bytes: bool) -> &ArrowReaderMetadata {
        match (&self.bytes, bytes) {
            (Some(b), true) => b,
            _ => &self.strict,
        }
    }

    /// A reader of row group `group`, limited to `columns`.
    fn group_reader(
        &self,
        group: usize,
        columns: Option<&[String]>,
        batch_rows: usize,
        bytes: bool,
    ) -> std::result::Result<ParquetRecordBatchReader, String> {
        let file = self
            .file
            .try_clone()
            .map_err(|e| format!("cannot reopen the file: {e}"))?;
        let meta = self.meta(bytes).clone();
        guarded(move || {
            let mut builder = ParquetRecordBatchReaderBuilder::new_with_metadata(file, meta)
                .with_batch_size(batch_rows)
                .with_row_groups(vec![group]);
            if let Some(names) = columns {
                let mut roots = Vec::with_capacity(names.len());
                for n in names {
                    let i = builder.schema().index_of(n).map_err(|_| {
                        parquet::errors::ParquetError::General(format!("no column \"{n}\""))
                    })?;
                    roots.push(i);
                }
                let mask = ProjectionMask::roots(builder.parquet_schema(), roots);
                builder = builder.with_projection(mask);
            }
            builder.build()
        })
    }

    /// The first of `columns` (all top-level columns when `None`) that fails
    /// to decode on its own in row group `group`, with its error.
    fn damaged_column(
        &self,
        group: usize,
        columns: Option<&[String]>,
        bytes: bool,
    ) -> Option<(String, String)> {
        let all: Vec<String>;
        let names = match columns {
            Some(c) => c,
            None => {
                all = self
                    .schema()
                    .fields()
                    .iter()
                    .map(|f| f.name().clone())
                    .collect();
                &all
            }
        };
        for name in names {
            let one = std::slice::from_ref(name);
            let failure = match self.group_reader(group, Some(one), 4096, bytes) {
                Err(e) => Some(e),
                Ok(mut reader) => loop {
                    match guarded(|| reader.next().transpose()) {
                        Ok(Some(_)) => {}
                        Ok(None) => break None,
                        Err(e) => break Some(e),
                    }
                },
            };
            if let Some(e) = failure {
                return Some((name.clone(), e));
            }
        }
        None
    }
}

/// Row groups of one file, decoded batch by batch; see [`FileReader::stream`].
pub(crate) struct RowGroupStream {
    reader: Arc<FileReader>,
    columns: Option<Vec<String>>,
    batch_rows: usize,
    bytes: bool,
    /// The row groups to read, in order, and the position in that list.
    groups: Vec<usize>,
    next_group: usize,
    /// Rows of every row group of the file, and each one's first file row.
    rows: Vec<usize>,
    starts: Vec<usize>,
    current: Option<ParquetRecordBatchReader>,
    /// Rows of the current row group already yielded.
    done: usize,
}

impl RowGroupStream {
    /// The rest of the current row group as damage, and on to the next.
    fn damage(&mut self, group: usize, detail: String) -> Piece {
        let column = self
            .reader
            .damaged_column(group, self.columns.as_deref(), self.bytes);
        let (column, detail) = match column {
            Some((c, d)) => (Some(c), d),
            None => (None, detail),
        };
        let d = Damage {
            path: self.reader.path.clone(),
            row_group: group,
            first_row: self.starts[group] + self.done,
            rows: self.rows[group] - self.done,
            column,
            detail,
        };
        self.next_group_please();
        Piece::Damaged(d)
    }

    fn next_group_please(&mut self) {
        self.current = None;
        self.done = 0;
        self.next_group += 1;
    }
}

impl Iterator for RowGroupStream {
    type Item = Piece;

    fn next(&mut self) -> Option<Piece> {
        loop {
            let &group = self.groups.get(self.next_group)?;
            let expected = self.rows[group];
            if self.current.is_none() {
                if expected == 0 {
                    self.next_group_please();
                    continue;
                }
                match self.reader.group_reader(
                    group,
                    self.columns.as_deref(),
                    self.batch_rows,
                    self.bytes,
                ) {
                    Ok(r) => self.current = Some(r),
                    Err(e) => return Some(self.damage(group, e)),
                }
            }
            let next = match self.current.as_mut() {
                Some(r) => guarded(|| r.next().transpose()),
                None => Ok(None),
            };
            match next {
                Ok(None) if self.done < expected => {
                    let detail = format!(
                        "it ended after {} of the {expected} rows its footer declares",
                        self.done
                    );
                    return Some(self.damage(group, detail));
                }
                Ok(None) => self.next_group_please(),
                Ok(Some(batch)) => {
                    let left = expected - self.done;
                    let batch = if batch.num_rows() > left {
                        // More rows than the footer declares: the footer is
                        // what every count (labels, masks) is built on, so
                        // the surplus cannot be placed.
                        crate::runtime::progress::warn_once(&format!(
                            "row group {group} of {} holds more rows than its footer declares ({expected}); the surplus rows are ignored",
                            self.reader.path.display()
                        ));
                        batch.slice(0, left)
                    } else {
                        batch
                    };
                    if batch.num_rows() == 0 {
                        self.next_group_please();
                        continue;
                    }
                    let first_row = self.starts[group] + self.done;
                    self.done += batch.num_rows();
                    return Some(Piece::Rows { batch, first_row });
                }
                Err(e) => return Some(self.damage(group, e)),
            }
        }
    }
}

/// Run a parquet decoding step. Its error comes back as text, and so does a
/// panic inside the decoder (damaged bytes have crashed decoders before):
/// the caller turns either into damage of one row group, and the panic
/// message is not printed, since it would read as a crash of ncclean.
pub(crate) fn guarded<T, E: std::fmt::Display>(
    f: impl FnOnce() -> std::result::Result<T, E>,
) -> std::result::Result<T, String> {
    match quiet_panics(|| f().map_err(|e| e.to_string())) {
        Ok(r) => r,
        Err(msg) => Err(format!("the parquet decoder crashed on these bytes: {msg}")),
    }
}

thread_local! {
    static QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// `f()`, or the panic's message when it panicked; the panic hook stays
/// silent meanwhile on this thread (other threads' panics print as usual).
fn quiet_panics<T>(f: impl FnOnce() -> T) -> std::result::Result<T, String> {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.with(|q| q.get()) {
                previous(info);
            }
        }));
    });
    let was = QUIET.with(|q| q.replace(true));
    let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    QUIET.with(|q| q.set(was));
    out.map_err(|payload| {
        payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "no message".to_string())
    })
}

/// The file's metadata with every string leaf turned into plain bytes, and an
/// arrow schema asking for binary where the file has strings. The decoder
/// validates UTF-8 per page for string leaves, and one bad value would fail
/// the row group; as bytes, [`restore_strings`] checks each value.
fn bytes_metadata(strict: &ArrowReaderMetadata) -> Option<ArrowReaderMetadata> {
    let md = strict.metadata();
    let fm = md.file_metadata();
    let root = fm.schema_descr().root_schema();
    let (root, changed) = strip_strings(root)?;
    if !changed {
        return None;
    }
    let descr = Arc::new(SchemaDescriptor::new(Arc::new(root)));
    let file_meta = FileMetaData::new(
        fm.version(),
        fm.num_rows(),
        fm.created_by().map(str::to_owned),
        fm.key_value_metadata().cloned(),
        descr,
        fm.column_orders().cloned(),
    );
    let md = ParquetMetaData::new(file_meta, md.row_groups().to_vec());
    let fields: Vec<FieldRef> = strict
        .schema()
        .fields()
        .iter()
        .map(|f| Arc::new(bytes_field(f)))
        .collect();
    let schema = Schema::new_with_metadata(fields, strict.schema().metadata().clone());
    let options = ArrowReaderOptions::new().with_schema(Arc::new(schema));
    guarded(|| ArrowReaderMetadata::try_new(Arc::new(md), options)).ok()
}

/// `t` with its string leaves (BYTE_ARRAY annotated UTF8/String) as plain
/// BYTE_ARRAY, and whether anything changed; `None` if a type cannot be
/// rebuilt.
fn strip_strings(t: &Type) -> Option<(Type, bool)> {
    match t {
        Type::GroupType { basic_info, fields } => {
            let mut changed = false;
            let mut out: Vec<TypePtr> = Vec::with_capacity(fields.len());
            for f in fields {
                let (n, c) = strip_strings(f)?;
                changed |= c;
                out.push(if c { Arc::new(n) } else { f.clone() });
            }
            Some((
                Type::GroupType {
                    basic_info: basic_info.clone(),
                    fields: out,
                },
                changed,
            ))
        }
        Type::PrimitiveType { basic_info, .. } => {
            let is_string = t.get_physical_type() == PhysicalType::BYTE_ARRAY
                && (basic_info.converted_type() == ConvertedType::UTF8
                    || matches!(basic_info.logical_type_ref(), Some(LogicalType::String)));
            if !is_string {
                return Some((t.clone(), false));
            }
            let mut b = Type::primitive_type_builder(basic_info.name(), PhysicalType::BYTE_ARRAY);
            if basic_info.has_repetition() {
                b = b.with_repetition(basic_info.repetition());
            }
            if basic_info.has_id() {
                b = b.with_id(Some(basic_info.id()));
            }
            Some((b.build().ok()?, true))
        }
    }
}

fn bytes_field(f: &Field) -> Field {
    f.clone().with_data_type(bytes_type(f.data_type()))
}

/// `dt` with strings as the matching binary type.
fn bytes_type(dt: &DataType) -> DataType {
    match dt {
        DataType::Utf8 => DataType::Binary,
        DataType::LargeUtf8 => DataType::LargeBinary,
        DataType::Utf8View => DataType::BinaryView,
        DataType::Struct(fields) => {
            DataType::Struct(fields.iter().map(|f| Arc::new(bytes_field(f))).collect())
        }
        DataType::List(f) => DataType::List(Arc::new(bytes_field(f))),
        DataType::LargeList(f) => DataType::LargeList(Arc::new(bytes_field(f))),
        DataType::FixedSizeList(f, n) => DataType::FixedSizeList(Arc::new(bytes_field(f)), *n),
        DataType::Map(f, sorted) => DataType::Map(Arc::new(bytes_field(f)), *sorted),
        DataType::Dictionary(k, v) => DataType::Dictionary(k.clone(), Box::new(bytes_type(v))),
        other => other.clone(),
    }
}

/// Turn `array`, read with strings as bytes, back into `want` (the column's
/// type as written). Invalid UTF-8 becomes U+FFFD in the returned array and
/// marks its row in the returned mask (`None`: every row is valid), so the
/// caller can skip or drop exactly those rows. An array already of type
/// `want` is returned as it is.
pub(crate) fn restore_strings(
    array: &ArrayRef,
    want: &DataType,
) -> std::result::Result<(ArrayRef, Option<Vec<bool>>), String> {
    if array.data_type() == want {
        return Ok((array.clone(), None));
    }
    let n = array.len();
    match (array.data_type(), want) {
        (DataType::Binary, DataType::Utf8) => Ok(strings::<i32>(array.as_binary::<i32>())),
        (DataType::LargeBinary, DataType::LargeUtf8) => {
            Ok(strings::<i64>(array.as_binary::<i64>()))
        }
        (DataType::BinaryView, DataType::Utf8View) => {
            let a = array.as_binary_view();
            match a.clone().to_string_view() {
                Ok(s) => Ok((Arc::new(s), None)),
                Err(_) => {
                    let mut bad = vec![false; n];
                    let s: StringViewArray = a
                        .iter()
                        .enumerate()
                        .map(|(i, v)| v.map(|v| lossy(v, &mut bad[i])))
                        .collect();
                    Ok((Arc::new(s), Some(bad)))
                }
            }
        }
        (DataType::Struct(_), DataType::Struct(want_fields)) => {
            let s = array.as_struct();
            let mut bad: Option<Vec<bool>> = None;
            let mut children = Vec::with_capacity(want_fields.len());
            for (child, f) in s.columns().iter().zip(want_fields.iter()) {
                let (c, b) = restore_strings(child, f.data_type())?;
                merge(&mut bad, b);
                children.push(c);
            }
            let out = StructArray::try_new(want_fields.clone(), children, s.nulls().cloned())
                .map_err(|e| e.to_string())?;
            Ok((Arc::new(out), bad))
        }
        (DataType::List(_), DataType::List(f)) => list::<i32>(array.as_list::<i32>(), f),
        (DataType::LargeList(_), DataType::LargeList(f)) => list::<i64>(array.as_list::<i64>(), f),
        (DataType::FixedSizeList(_, size), DataType::FixedSizeList(f, _)) => {
            let l = array.as_fixed_size_list();
            let (values, vbad) = restore_strings(l.values(), f.data_type())?;
            let bad = vbad.map(|vb| {
                let size = (*size).max(0) as usize;
                (0..n)
                    .map(|i| vb.iter().skip(i * size).take(size).any(|&b| b))
                    .collect()
            });
            let out = FixedSizeListArray::try_new(f.clone(), *size, values, l.nulls().cloned())
                .map_err(|e| e.to_string())?;
            Ok((Arc::new(out), bad))
        }
        (DataType::Dictionary(k, _), DataType::Dictionary(_, v)) => match k.as_ref() {
            DataType::Int8 => dictionary::<Int8Type>(array, v),
            DataType::Int16 => dictionary::<Int16Type>(array, v),
            DataType::Int32 => dictionary::<Int32Type>(array, v),
            DataType::Int64 => dictionary::<Int64Type>(array, v),
            DataType::UInt8 => dictionary::<UInt8Type>(array, v),
            DataType::UInt16 => dictionary::<UInt16Type>(array, v),
            DataType::UInt32 => dictionary::<UInt32Type>(array, v),
            DataType::UInt64 => dictionary::<UInt64Type>(array, v),
            other => Err(format!("dictionary keys of type {other}")),
        },
        (have, want) => Err(format!("cannot read {have} back as {want}")),
    }
}

/// `v` as a string; invalid UTF-8 is replaced and sets `bad`.
fn lossy(v: &[u8], bad: &mut bool) -> String {
    match std::str::from_utf8(v) {
        Ok(s) => s.to_owned(),
        Err(_) => {
            *bad = true;
            String::from_utf8_lossy(v).into_owned()
        }
    }
}

fn strings<O: OffsetSizeTrait>(a: &GenericBinaryArray<O>) -> (ArrayRef, Option<Vec<bool>>) {
    // The whole array at once is the common case and copies nothing.
    if let Ok(s) = GenericStringArray::<O>::try_from_binary(a.clone()) {
        return (Arc::new(s), None);
    }
    let mut bad = vec![false; a.len()];
    let s: GenericStringArray<O> = a
        .iter()
        .enumerate()
        .map(|(i, v)| v.map(|v| lossy(v, &mut bad[i])))
        .collect();
    (Arc::new(s), Some(bad))
}

fn list<O: OffsetSizeTrait>(
    l: &GenericListArray<O>,
    f: &FieldRef,
) -> std::result::Result<(ArrayRef, Option<Vec<bool>>), String> {
    let (values, vbad) = restore_strings(l.values(), f.data_type())?;
    let bad = vbad.map(|vb| {
        l.offsets()
            .windows(2)
            .map(|w| vb[w[0].as_usize()..w[1].as_usize()].iter().any(|&b| b))
            .collect()
    });
    let out =
        GenericListArray::<O>::try_new(f.clone(), l.offsets().clone(), values, l.nulls().cloned())
            .map_err(|e| e.to_string())?;
    Ok((Arc::new(out), bad))
}

fn dictionary<K: ArrowDictionaryKeyType>(
    array: &ArrayRef,
    want_values: &DataType,
) -> std::result::Result<(ArrayRef, Option<Vec<bool>>), String> {
    let d = array
        .as_dictionary_opt::<K>()
        .ok_or_else(|| format!("expected a dictionary, found {}", array.data_type()))?;
    let (values, vbad) = restore_strings(d.values(), want_values)?;
    let bad = vbad.map(|vb| {
        (0..d.len())
            .map(|i| d.is_valid(i) && vb.get(d.keys().value(i).as_usize()) == Some(&true))
            .collect()
    });
    let out = DictionaryArray::<K>::try_new(d.keys().clone(), values).map_err(|e| e.to_string())?;
    Ok((Arc::new(out), bad))
}

fn merge(into: &mut Option<Vec<bool>>, more: Option<Vec<bool>>) {
    match (into.as_mut(), more) {
        (Some(a), Some(b)) => a.iter_mut().zip(b).for_each(|(x, y)| *x |= y),
        (None, Some(b)) => *into = Some(b),
        _ => {}
    }
}

/// A batch read with strings as bytes, back in its written types.
pub(crate) struct Restored {
    /// The batch, invalid UTF-8 replaced by U+FFFD.
    pub batch: RecordBatch,
    /// Rows with invalid UTF-8 in any column (`None`: none).
    pub bad: Option<Vec<bool>>,
    /// The columns that had some.
    pub columns: Vec<String>,
}

/// Restore every column of `batch` to `schema`'s types (see
/// [`restore_strings`]).
pub(crate) fn restore_batch(
    batch: &RecordBatch,
    schema: &SchemaRef,
) -> std::result::Result<Restored, String> {
    let mut bad: Option<Vec<bool>> = None;
    let mut columns = Vec::with_capacity(batch.num_columns());
    let mut fields: Vec<FieldRef> = Vec::with_capacity(batch.num_columns());
    let mut names = Vec::new();
    for (array, field) in batch.columns().iter().zip(batch.schema().fields()) {
        let want = schema
            .field_with_name(field.name())
            .map_err(|_| format!("no column \"{}\"", field.name()))?;
        let (a, b) = restore_strings(array, want.data_type())?;
        if b.as_ref().is_some_and(|b| b.iter().any(|&x| x)) {
            names.push(field.name().clone());
        }
        merge(&mut bad, b);
        columns.push(a);
        fields.push(Arc::new(want.clone()));
    }
    let schema = Arc::new(Schema::new_with_metadata(
        Fields::from(fields),
        schema.metadata().clone(),
    ));
    let out = RecordBatch::try_new(schema, columns).map_err(|e| e.to_string())?;
    Ok(Restored {
        batch: out,
        bad,
        columns: names,
    })
}

#[cfg(test)]
mod tests {
    use arrow_array::builder::{ListBuilder, StringDictionaryBuilder};
    use arrow_array::types::Int32Type;
    use arrow_array::{BinaryArray, BinaryViewArray};

    use super::*;
    use crate::data::testutil::{binaries, corrupt_page, strings, write_parquet};

    fn bad_mask(array: ArrayRef, want: DataType) -> (ArrayRef, Option<Vec<bool>>) {
        restore_strings(&array, &want).unwrap()
    }

    #[test]
    fn invalid_utf8_marks_exactly_its_rows_in_every_string_type() {
        let values: Vec<Option<&[u8]>> = vec![Some(b"ok"), Some(b"\xFFbad"), None, Some(b"")];
        let (a, bad) = bad_mask(Arc::new(BinaryArray::from(values.clone())), DataType::Utf8);
        assert_eq!(bad, Some(vec![false, true, false, false]));
        let s = a.as_string::<i32>();
        assert_eq!(
            (s.value(0), s.value(1), s.is_null(2)),
            ("ok", "\u{FFFD}bad", true)
        );

        let (a, bad) = bad_mask(
            Arc::new(BinaryViewArray::from(values.clone())),
            DataType::Utf8View,
        );
        assert_eq!(bad, Some(vec![false, true, false, false]));
        assert_eq!(a.data_type(), &DataType::Utf8View);

        // A struct row is bad when any child is; the struct's type is restored.
        let s = StructArray::from(vec![
            (
                Arc::new(Field::new("bytes", DataType::Binary, true)),
                binaries(&[Some(b"x"), Some(b"y"), None, None]),
            ),
            (
                Arc::new(Field::new("path", DataType::Binary, true)),
                Arc::new(BinaryArray::from(values.clone())) as ArrayRef,
            ),
        ]);
        let want = DataType::Struct(Fields::from(vec![
            Field::new("bytes", DataType::Binary, true),
            Field::new("path", DataType::Utf8, true),
        ]));
        let (a, bad) = bad_mask(Arc::new(s), want.clone());
        assert_eq!(bad, Some(vec![false, true, false, false]));
        assert_eq!(a.data_type(), &want);

        // Valid data comes back unchanged and unmarked.
        let (a, bad) = bad_mask(binaries(&[Some(b"fine")]), DataType::Utf8);
        assert_eq!((bad, a.as_string::<i32>().value(0)), (None, "fine"));
        let same = strings(&[Some("x")]);
        let (a, bad) = bad_mask(same.clone(), DataType::Utf8);
        assert!(bad.is_none() && Arc::ptr_eq(&a, &same));
    }

    #[test]
    fn lists_and_dictionaries_mark_the_rows_that_hold_a_bad_value() {
        let mut b = ListBuilder::new(arrow_array::builder::BinaryBuilder::new());
        b.values().append_value(b"a");
        b.append(true);
        b.values().append_value(b"b");
        b.values().append_value(b"\xC3\x28");
        b.append(true);
        b.append(false);
        let want = DataType::List(Arc::new(Field::new("item", DataType::Utf8, true)));
        let (a, bad) = bad_mask(Arc::new(b.finish()), want.clone());
        assert_eq!(bad, Some(vec![false, true, false]));
        assert_eq!(a.data_type(), &want);

        let values = Arc::new(BinaryArray::from(vec![b"ok".as_slice(), b"\xFF"]));
        let keys = arrow_array::Int32Array::from(vec![Some(0), Some(1), None, Some(0)]);
        let dict = DictionaryArray::<Int32Type>::try_new(keys, values).unwrap();
        let want = DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8));
        let (a, bad) = bad_mask(Arc::new(dict), want.clone());
        assert_eq!(bad, Some(vec![false, true, false, false]));
        assert_eq!(a.data_type(), &want);
        // Already strings: untouched.
        let mut d = StringDictionaryBuilder::<Int32Type>::new();
        d.append_value("x");
        let (_, bad) = bad_mask(Arc::new(d.finish()), want);
        assert!(bad.is_none());
    }

    fn shard(dir: &Path) -> PathBuf {
        // Row groups of 2 rows: [0, 1], [2, 3], [4].
        write_parquet(
            dir,
            "s.parquet",
            vec![
                (
                    "image",
                    binaries(&[Some(b"a"), Some(b"b"), Some(b"c"), Some(b"d"), Some(b"e")]),
                ),
                (
                    "caption",
                    strings(&[Some("c0"), Some("c1"), Some("~~"), Some("c3"), Some("c4")]),
                ),
            ],
        )
    }

    /// Each piece of a stream: `(first row, rows)`, or the damage.
    type Pieces = Vec<std::result::Result<(usize, usize), Damage>>;

    fn pieces(reader: &Arc<FileReader>, bytes: bool) -> Pieces {
        reader
            .stream(Some(&["image", "caption"]), 10, bytes)
            .map(|p| match p {
                Piece::Rows { batch, first_row } => Ok((first_row, batch.num_rows())),
                Piece::Damaged(d) => Err(d),
            })
            .collect()
    }

    #[test]
    fn a_corrupt_page_costs_its_row_group_and_names_the_column() {
        let dir = tempfile::tempdir().unwrap();
        let path = shard(dir.path());
        corrupt_page(&path, 1, "caption");
        let reader = Arc::new(FileReader::open(&path).unwrap());
        for bytes in [false, true] {
            let got = pieces(&reader, bytes);
            assert_eq!(got.len(), 3, "{got:?}");
            assert_eq!(got[0], Ok((0, 2)));
            assert_eq!(got[2], Ok((4, 1)));
            let d = got[1].clone().unwrap_err();
            assert_eq!((d.row_group, d.first_row, d.rows), (1, 2, 2));
            assert_eq!(d.column.as_deref(), Some("caption"));
            let reason = d.reason();
            assert!(
                reason.starts_with("row group 1 of ")
                    && reason.contains("s.parquet could not be read (column \"caption\": "),
                "{reason}"
            );
        }
    }

    #[test]
    fn invalid_utf8_fails_a_strict_read_but_not_a_read_as_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = shard(dir.path());
        let mut bytes = std::fs::read(&path).unwrap();
        let mut n = 0;
        for i in 0..bytes.len() - 1 {
            if &bytes[i..i + 2] == b"~~" {
                bytes[i..i + 2].copy_from_slice(b"\xFF\xFE");
                n += 1;
            }
        }
        assert!(n > 0);
        std::fs::write(&path, bytes).unwrap();
        let reader = Arc::new(FileReader::open(&path).unwrap());
        let strict = pieces(&reader, false);
        let d = strict[1].clone().unwrap_err();
        assert_eq!((d.row_group, d.column.as_deref()), (1, Some("caption")));

        let mut bad_rows = Vec::new();
        for p in reader.stream(Some(&["caption"]), 10, true) {
            let Piece::Rows { batch, first_row } = p else {
                panic!("damage in a read as bytes");
            };
            let Restored {
                batch: restored,
                bad,
                columns,
            } = restore_batch(&batch, reader.schema()).unwrap();
            assert_eq!(restored.schema().field(0).data_type(), &DataType::Utf8);
            if let Some(bad) = bad {
                assert_eq!(columns, ["caption"]);
                bad_rows.extend(
                    bad.iter()
                        .enumerate()
                        .filter(|(_, b)| **b)
                        .map(|(i, _)| first_row + i),
                );
            }
        }
        assert_eq!(bad_rows, [2]);
    }
}
