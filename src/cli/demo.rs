//! `ncclean demo`: write a synthetic dataset to try everything on.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use arrow_array::{ArrayRef, BinaryArray, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use clap::Args;

use crate::data::AtomicParquetWriter;
use crate::demo::{generate, DemoOptions, MAX_IMAGE_SIZE, MIN_IMAGE_SIZE};
use crate::error::{Error, Result};
use crate::progress::Reporter;

/// Arguments of `ncclean demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Output directory; `demo.parquet` is written inside it.
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Number of image–caption pairs.
    #[arg(long, default_value_t = 2000)]
    pub pairs: usize,
    /// Seed; the same seed gives byte-identical data.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Side of the square PNG images, in pixels.
    #[arg(long, default_value_t = 64)]
    pub image_size: u32,
}

const ROW_GROUP: usize = 1024;

pub fn run(a: DemoArgs, rep: &Reporter) -> Result<()> {
    if !(MIN_IMAGE_SIZE..=MAX_IMAGE_SIZE).contains(&a.image_size) {
        return Err(Error::Usage(format!(
            "--image-size must be between {MIN_IMAGE_SIZE} and {MAX_IMAGE_SIZE} pixels, got {}",
            a.image_size
        )));
    }
    if a.pairs == 0 {
        return Err(Error::Usage("--pairs must be at least 1".into()));
    }
    std::fs::create_dir_all(&a.out)
        .with_context(|| format!("cannot create {}", a.out.display()))?;
    let path = a.out.join("demo.parquet");
    let pairs = generate(&DemoOptions {
        pairs: a.pairs,
        seed: a.seed,
        image_size: a.image_size,
    });
    let schema = Arc::new(Schema::new(vec![
        Field::new("key", DataType::Utf8, false),
        Field::new("image", DataType::Binary, false),
        Field::new("caption", DataType::Utf8, false),
        Field::new("colour", DataType::Utf8, false),
        Field::new("shape", DataType::Utf8, false),
        Field::new("position", DataType::Utf8, false),
        Field::new("size", DataType::Utf8, false),
    ]));
    let mut meta = BTreeMap::new();
    meta.insert(
        "ncclean.version".to_string(),
        env!("CARGO_PKG_VERSION").to_string(),
    );
    meta.insert("ncclean.demo.seed".to_string(), a.seed.to_string());
    meta.insert("ncclean.demo.pairs".to_string(), a.pairs.to_string());
    let mut w = AtomicParquetWriter::create(&path, schema.clone(), &meta)?;
    for chunk in pairs.chunks(ROW_GROUP) {
        let col = |f: &dyn Fn(&crate::demo::DemoPair) -> &str| -> ArrayRef {
            Arc::new(StringArray::from_iter_values(chunk.iter().map(f)))
        };
        let images: ArrayRef = Arc::new(BinaryArray::from_iter_values(
            chunk.iter().map(|p| p.image.as_slice()),
        ));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                col(&|p| p.key.as_str()),
                images,
                col(&|p| p.caption.as_str()),
                col(&|p| p.colour),
                col(&|p| p.shape),
                col(&|p| p.position),
                col(&|p| p.size),
            ],
        )
        .context("building demo batch")?;
        w.write(&batch)?;
    }
    w.finish()?;
    rep.info(&format!("wrote {} pairs to {}", a.pairs, path.display()));
    println!("{}", path.display());
    Ok(())
}
