//! `ncclean inspect`: the files, their schema and detected columns, and a
//! pass over the rows: which are unusable and why, and whether the keys
//! repeat (labels are joined back by key).

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::data::{DuplicateKeys, InputSet, READ_BATCH_ROWS};
use crate::error::Result;
use crate::runtime::progress::Reporter;

/// What one pass over the rows found.
#[derive(Debug, Clone)]
pub struct Survey {
    /// Rows that cannot be used.
    pub unusable: usize,
    /// Unusable rows per reason (its first clause).
    pub reasons: BTreeMap<String, usize>,
    /// The first few unusable rows: key and reason.
    pub examples: Vec<(String, String)>,
    /// Repeated keys.
    pub dups: DuplicateKeys,
}

/// Read every row of `input`, decoding its images the way `fit` would
/// (`decode`), or only reading them.
pub fn survey(input: &InputSet, decode: bool, rep: &Reporter) -> Result<Survey> {
    let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
    let mut unusable = 0usize;
    let mut examples: Vec<(String, String)> = Vec::new();
    // Every key, to find duplicates: labels are joined back by key.
    let mut keys: Vec<String> = Vec::with_capacity(input.num_rows());
    let mut note = |key: &str, why: &str| {
        unusable += 1;
        // Group reasons by their first clause so counts stay readable (a
        // damaged row group's reason also loses its parenthesised error).
        let clause = why.split(':').next().unwrap_or(why);
        let group = clause
            .split(" (")
            .next()
            .unwrap_or(clause)
            .trim()
            .to_string();
        *reasons.entry(group).or_default() += 1;
        if examples.len() < 5 {
            examples.push((key.to_string(), why.to_string()));
        }
    };
    if !decode {
        for batch in input.pairs(READ_BATCH_ROWS) {
            for r in batch? {
                if let Some(p) = &r.problem {
                    note(&r.key, p);
                }
                keys.push(r.key);
            }
        }
    } else {
        for r in super::scan(input, rep)? {
            if let Some(e) = &r.error {
                note(&r.key, e);
            }
            keys.push(r.key);
        }
    }
    let dups = DuplicateKeys::of(keys.iter().map(String::as_str));
    Ok(Survey {
        unusable,
        reasons,
        examples,
        dups,
    })
}

/// One input file in `inspect --json`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FileRows {
    /// The file as the user named it.
    pub path: String,
    /// Its rows.
    pub rows: usize,
}

/// What `inspect` found: the files, their schema and detected columns, and
/// one pass over the rows ([`survey`]). Serialised as `inspect --json`
/// prints it; [`Inspection::text`] is the plain form.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Inspection {
    /// Every input file with its rows.
    pub files: Vec<FileRows>,
    /// The first file's schema, a `name: type` per field.
    pub schema: Vec<String>,
    /// The detected columns.
    pub columns: crate::data::ColumnMap,
    /// The first file's format.
    pub format: crate::data::FileFormat,
    /// Length of the image embeddings, for an embedding column.
    pub embedding_dim: Option<usize>,
    /// Length of the text embeddings, when a column of them is read.
    pub text_embedding_dim: Option<usize>,
    /// Rows over all files.
    pub rows: usize,
    /// Rows that can be used.
    pub usable: usize,
    /// Rows that cannot.
    pub unusable: usize,
    /// Unusable rows per reason.
    pub unusable_reasons: BTreeMap<String, usize>,
    /// Whether the images were decoded (else only read).
    pub images_decoded: bool,
    /// Rows whose key an earlier row already had.
    pub duplicate_keys: usize,
    /// Distinct keys.
    pub distinct_keys: usize,
    /// Some repeated keys.
    pub duplicate_key_examples: Vec<String>,
    /// The first few unusable rows: key and reason.
    #[serde(skip)]
    pub examples: Vec<(String, String)>,
    /// The repeated keys in one sentence.
    #[serde(skip)]
    pub duplicates: String,
}

/// Inspect `input`: its files, schema and columns, and one pass over its
/// rows, decoding the images the way `fit` would (`decode`) or only
/// reading them.
pub fn inspect(input: &InputSet, decode: bool, rep: &Reporter) -> Result<Inspection> {
    let Survey {
        unusable,
        reasons,
        examples,
        dups,
    } = survey(input, decode, rep)?;
    let files = (0..input.files.len())
        .map(|i| FileRows {
            path: input.display_name(i),
            rows: input.files[i].num_rows,
        })
        .collect();
    let schema = input.files[0]
        .schema
        .fields()
        .iter()
        .map(|f| format!("{}: {}", f.name(), f.data_type()))
        .collect();
    let rows = input.num_rows();
    Ok(Inspection {
        files,
        schema,
        columns: input.columns.clone(),
        format: input.files[0].format.clone(),
        embedding_dim: input.embedding_dim,
        text_embedding_dim: input.text_embedding_dim,
        rows,
        usable: rows - unusable,
        unusable,
        unusable_reasons: reasons,
        images_decoded: decode,
        duplicate_keys: dups.repeats,
        distinct_keys: dups.distinct,
        duplicates: dups.sentence(),
        duplicate_key_examples: dups.examples,
        examples,
    })
}

impl Inspection {
    /// What `inspect` prints without `--json`.
    pub fn text(&self) -> String {
        let mut out = String::new();
        self.write_layout(&mut out);
        self.write_rows(&mut out);
        out
    }

    /// The files, the schema and the columns read from it.
    fn write_layout(&self, out: &mut String) {
        let _ = writeln!(out, "files:");
        for f in &self.files {
            let _ = writeln!(out, "  {} ({} rows)", f.path, f.rows);
        }
        let _ = writeln!(out, "schema:");
        for s in &self.schema {
            let _ = writeln!(out, "  {s}");
        }
        let c = &self.columns;
        if let crate::data::FileFormat::Webdataset(layout) = &self.format {
            let _ = writeln!(out, "webdataset tar shards (seen as the table above):");
            let _ = writeln!(out, "  image:   the KEY.jpg, .jpeg, .png or .webp member");
            let _ = writeln!(out, "  caption: {}", layout.caption);
            let _ = writeln!(out, "  key:     {}", layout.key);
        }
        let _ = writeln!(out, "columns:");
        let _ = writeln!(out, "  image:   {} ({:?})", c.image, c.image_kind);
        let _ = writeln!(out, "  caption: {}", c.caption);
        let key = c.key.as_deref();
        let key = key.unwrap_or("(none: keys are <file stem>:<row>)");
        let _ = writeln!(out, "  key:     {key}");
        if let Some(d) = self.embedding_dim {
            let _ = writeln!(out, "  embedding length: {d}");
        }
        if let (Some(t), Some(d)) = (&c.text_embedding, self.text_embedding_dim) {
            let _ = writeln!(
                out,
                "  text embedding: {t} (length {d}; read by --text-encoder precomputed)"
            );
        }
    }

    /// The rows: how many are usable, why the others are not, the keys.
    fn write_rows(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "rows: {}, usable: {}, unusable: {}",
            self.rows, self.usable, self.unusable
        );
        for (why, n) in &self.unusable_reasons {
            let _ = writeln!(out, "  {n:>8}  {why}");
        }
        if !self.examples.is_empty() {
            let _ = writeln!(out, "examples:");
            for (k, why) in &self.examples {
                let _ = writeln!(out, "  {k}: {why}");
            }
        }
        if self.duplicate_keys > 0 {
            let _ = writeln!(
                out,
                "duplicate keys: {}; labels cannot be joined back to these rows (fit refuses them): give a unique key column with --key-col",
                self.duplicates
            );
        } else {
            let _ = writeln!(out, "keys: all {} unique", self.distinct_keys);
        }
        if !self.images_decoded {
            let _ = writeln!(
                out,
                "(images were not decoded: run without --no-decode to find undecodable images)"
            );
        }
    }
}
