//! `ncclean demo`: write a synthetic dataset to try everything on.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use arrow_array::{ArrayRef, BinaryArray, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use clap::Args;

use crate::data::AtomicParquetWriter;
use crate::error::{Error, Result};
use crate::runtime::progress::Reporter;
use crate::synth::demo::{DemoOptions, MAX_IMAGE_SIZE, MIN_IMAGE_SIZE};

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
    /// Write an `image_embedding` column of this many floats instead of PNG
    /// images (each attribute adds a fixed random vector, plus noise): data
    /// for scale tests, generated quickly and streamed to disk.
    #[arg(long, value_name = "DIM")]
    pub embedding_dim: Option<usize>,
    /// Split the pairs into this many shards, `demo-00000.parquet`, … (in
    /// order, sizes within one row of each other) instead of `demo.parquet`.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub shards: usize,
}

const ROW_GROUP: usize = 1024;

/// Most files one demo may be split into.
const MAX_SHARDS: usize = 100_000;

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
    if a.shards == 0 || a.shards > a.pairs {
        return Err(Error::Usage(format!(
            "--shards must be between 1 and --pairs ({}), got {}",
            a.pairs, a.shards
        )));
    }
    if a.shards > MAX_SHARDS {
        return Err(Error::Usage(format!(
            "--shards must be at most {MAX_SHARDS} (one file each), got {}",
            a.shards
        )));
    }
    let widest = crate::data::MAX_EMBEDDING_DIM;
    if let Some(d) = a.embedding_dim.filter(|d| !(1..=widest).contains(d)) {
        return Err(Error::Usage(format!(
            "--embedding-dim must be between 1 and {widest} (the widest embedding \
             ncclean reads), got {d}"
        )));
    }
    std::fs::create_dir_all(&a.out)
        .with_context(|| format!("cannot create {}", a.out.display()))?;
    if let Some(dim) = a.embedding_dim {
        return write_embedding_shards(&a, dim, rep);
    }
    if a.shards > 1 {
        return Err(Error::Usage(
            "--shards needs --embedding-dim (image demo data is written as one file)".into(),
        ));
    }
    let path = a.out.join("demo.parquet");
    // Drawn and written a row group at a time: memory does not grow with
    // --pairs.
    let mut pairs = crate::synth::demo::pairs(&DemoOptions {
        pairs: a.pairs,
        seed: a.seed,
        image_size: a.image_size,
    });
    let schema = demo_schema(Field::new("image", DataType::Binary, false));
    let meta = demo_metadata(&a);
    let mut w = AtomicParquetWriter::create(&path, schema.clone(), &meta)?;
    loop {
        crate::runtime::interrupt::check()?;
        let chunk: Vec<_> = pairs.by_ref().take(ROW_GROUP).collect();
        if chunk.is_empty() {
            break;
        }
        let col = |f: &dyn Fn(&crate::synth::demo::DemoPair) -> &str| -> ArrayRef {
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

/// The demo's columns around its image column (bytes or an embedding): key,
/// image, caption, then the four attributes the caption names.
fn demo_schema(image: Field) -> Arc<Schema> {
    let text = |name: &str| Field::new(name, DataType::Utf8, false);
    Arc::new(Schema::new(vec![
        text("key"),
        image,
        text("caption"),
        text("colour"),
        text("shape"),
        text("position"),
        text("size"),
    ]))
}

/// Footer metadata every demo file carries.
fn demo_metadata(a: &DemoArgs) -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            "ncclean.version".to_string(),
            env!("CARGO_PKG_VERSION").to_string(),
        ),
        ("ncclean.demo.seed".to_string(), a.seed.to_string()),
        ("ncclean.demo.pairs".to_string(), a.pairs.to_string()),
    ])
}

/// The rows of shard `k` of `n` over `pairs` (balanced, in order).
fn shard_range(pairs: usize, n: usize, k: usize) -> std::ops::Range<usize> {
    let start = k * (pairs / n) + k.min(pairs % n);
    start..start + pairs / n + usize::from(k < pairs % n)
}

/// `--embedding-dim`: embedding shards, generated and written a row group
/// at a time.
fn write_embedding_shards(a: &DemoArgs, dim: usize, rep: &Reporter) -> Result<()> {
    use arrow_array::builder::{Float32Builder, ListBuilder};
    let gen = crate::synth::demo::EmbeddingDemo::new(dim, a.seed);
    let schema = demo_schema(Field::new(
        "image_embedding",
        DataType::List(Arc::new(Field::new("item", DataType::Float32, true))),
        false,
    ));
    let mut meta = demo_metadata(a);
    meta.insert("ncclean.demo.embedding_dim".to_string(), dim.to_string());
    for k in 0..a.shards {
        let path = if a.shards == 1 {
            a.out.join("demo.parquet")
        } else {
            a.out.join(format!("demo-{k:05}.parquet"))
        };
        let mut w = AtomicParquetWriter::create(&path, schema.clone(), &meta)?;
        let range = shard_range(a.pairs, a.shards, k);
        for start in range.clone().step_by(ROW_GROUP) {
            crate::runtime::interrupt::check()?;
            let pairs: Vec<_> = (start..range.end.min(start + ROW_GROUP))
                .map(|i| gen.pair(i))
                .collect();
            let col = |f: &dyn Fn(&crate::synth::demo::EmbeddingPair) -> &str| -> ArrayRef {
                Arc::new(StringArray::from_iter_values(pairs.iter().map(f)))
            };
            let mut emb = ListBuilder::new(Float32Builder::with_capacity(pairs.len() * dim));
            for p in &pairs {
                emb.values().append_slice(&p.embedding);
                emb.append(true);
            }
            let emb: ArrayRef = Arc::new(emb.finish());
            let batch = RecordBatch::try_new(
                schema.clone(),
                vec![
                    col(&|p| p.key.as_str()),
                    emb,
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
        println!("{}", path.display());
    }
    rep.info(&format!(
        "wrote {} pairs with {dim}-float embeddings in {} file(s) to {}",
        a.pairs,
        a.shards,
        a.out.display()
    ));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::shard_range;

    #[test]
    fn shard_ranges_cover_the_pairs_in_order() {
        let r: Vec<_> = (0..3).map(|k| shard_range(10, 3, k)).collect();
        assert_eq!(r, vec![0..4, 4..7, 7..10]);
        assert_eq!(shard_range(5, 1, 0), 0..5);
    }
}
