//! `ncclean inspect`: what ncclean sees in the data, before any work.

use std::collections::BTreeMap;

use clap::Args;

use crate::data::TextEmbeddings;
use crate::error::Result;
use crate::runtime::progress::Reporter;

use super::{DataArgs, ImageArgs};

/// Arguments of `ncclean inspect`.
#[derive(Debug, Args)]
pub struct InspectArgs {
    #[command(flatten)]
    pub data: DataArgs,
    #[command(flatten)]
    pub images: ImageArgs,
    /// Skip decoding images (faster; only reports missing values and bad embeddings).
    #[arg(long)]
    pub no_decode: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: InspectArgs, rep: &Reporter) -> Result<()> {
    // Shown when present; read (and checked) the way fit would read it.
    let mut opts = a.data.options_with(&a.images);
    if opts.text_embeddings == TextEmbeddings::Ignore {
        opts.text_embeddings = TextEmbeddings::IfPresent;
    }
    let input = a.data.open_options(&opts)?;
    let crate::engine::inspect::Survey {
        unusable,
        reasons,
        examples,
        dups,
    } = crate::engine::inspect::survey(&input, !a.no_decode, rep)?;
    let files: Vec<FileRows> = input
        .files
        .iter()
        .enumerate()
        .map(|(i, f)| FileRows {
            path: input.display_name(i),
            rows: f.num_rows,
        })
        .collect();
    let schema: Vec<String> = input.files[0]
        .schema
        .fields()
        .iter()
        .map(|f| format!("{}: {}", f.name(), f.data_type()))
        .collect();
    let total = input.num_rows();
    if a.json {
        return super::print_summary(&InspectPrinted {
            files: &files,
            schema: &schema,
            columns: &input.columns,
            format: &input.files[0].format,
            embedding_dim: input.embedding_dim,
            text_embedding_dim: input.text_embedding_dim,
            rows: total,
            usable: total - unusable,
            unusable,
            unusable_reasons: &reasons,
            images_decoded: !a.no_decode,
            duplicate_keys: dups.repeats,
            distinct_keys: dups.distinct,
            duplicate_key_examples: &dups.examples,
        });
    }
    println!("files:");
    for (i, f) in input.files.iter().enumerate() {
        println!("  {} ({} rows)", input.display_name(i), f.num_rows);
    }
    println!("schema:");
    for s in &schema {
        println!("  {s}");
    }
    let c = &input.columns;
    if let crate::data::FileFormat::Webdataset(layout) = &input.files[0].format {
        println!("webdataset tar shards (seen as the table above):");
        println!("  image:   the KEY.jpg, .jpeg, .png or .webp member");
        println!("  caption: {}", layout.caption);
        println!("  key:     {}", layout.key);
    }
    println!("columns:");
    println!("  image:   {} ({:?})", c.image, c.image_kind);
    println!("  caption: {}", c.caption);
    println!(
        "  key:     {}",
        c.key
            .clone()
            .unwrap_or_else(|| "(none: keys are <file stem>:<row>)".into())
    );
    if let Some(d) = input.embedding_dim {
        println!("  embedding length: {d}");
    }
    if let (Some(t), Some(d)) = (&c.text_embedding, input.text_embedding_dim) {
        println!("  text embedding: {t} (length {d}; read by --text-encoder precomputed)");
    }
    println!(
        "rows: {total}, usable: {}, unusable: {unusable}",
        total - unusable
    );
    for (why, n) in &reasons {
        println!("  {n:>8}  {why}");
    }
    if !examples.is_empty() {
        println!("examples:");
        for (k, why) in &examples {
            println!("  {k}: {why}");
        }
    }
    if dups.repeats > 0 {
        println!(
            "duplicate keys: {}; labels cannot be joined back to these rows (fit refuses them): give a unique key column with --key-col",
            dups.sentence()
        );
    } else {
        println!("keys: all {} unique", dups.distinct);
    }
    if a.no_decode {
        println!("(images were not decoded: run without --no-decode to find undecodable images)");
    }
    Ok(())
}

/// One input file in `inspect --json`.
#[derive(serde::Serialize)]
struct FileRows {
    path: String,
    rows: usize,
}

/// What `inspect --json` prints on stdout.
#[derive(serde::Serialize)]
struct InspectPrinted<'a> {
    files: &'a [FileRows],
    schema: &'a [String],
    columns: &'a crate::data::ColumnMap,
    format: &'a crate::data::FileFormat,
    embedding_dim: Option<usize>,
    text_embedding_dim: Option<usize>,
    rows: usize,
    usable: usize,
    unusable: usize,
    unusable_reasons: &'a BTreeMap<String, usize>,
    images_decoded: bool,
    duplicate_keys: usize,
    distinct_keys: usize,
    duplicate_key_examples: &'a [String],
}
