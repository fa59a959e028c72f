//! The demo dataset on disk: `demo.parquet` of PNG images, or parquet
//! shards with an `image_embedding` column, drawn and written a row group at
//! a time so memory does not grow with the number of pairs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use arrow_array::builder::{Float32Builder, ListBuilder};
use arrow_array::{ArrayRef, BinaryArray, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};

use super::demo::{DemoOptions, EmbeddingDemo, Pair};
use crate::data::{AtomicParquetWriter, Metadata};
use crate::error::Result;
use crate::runtime::progress::Reporter;

/// Rows per row group (and per generated chunk).
const ROW_GROUP: usize = 1024;

/// Most files one demo may be split into.
pub const MAX_SHARDS: usize = 100_000;

/// What to write; [`DemoFiles::check`] checks the values.
#[derive(Debug, Clone)]
pub struct DemoFiles {
    /// Output directory.
    pub out: PathBuf,
    /// Number of pairs.
    pub pairs: usize,
    /// Seed of every random choice.
    pub seed: u64,
    /// Side of the square PNG images, in pixels.
    pub image_size: u32,
    /// Embeddings of this width instead of PNG images.
    pub embedding_dim: Option<usize>,
    /// Number of files (embeddings only; images are one file).
    pub shards: usize,
}

impl DemoFiles {
    /// Refuse values the demo cannot write (usage errors naming `ncclean
    /// demo`'s flags): an image side outside the drawable range, no pairs,
    /// more shards than pairs or than [`MAX_SHARDS`], an embedding width
    /// ncclean cannot read back, or shards of images.
    pub fn check(&self) -> Result<()> {
        use super::demo::{MAX_IMAGE_SIZE, MIN_IMAGE_SIZE};
        use crate::error::Error;
        if !(MIN_IMAGE_SIZE..=MAX_IMAGE_SIZE).contains(&self.image_size) {
            return Err(Error::Usage(format!(
                "--image-size must be between {MIN_IMAGE_SIZE} and {MAX_IMAGE_SIZE} pixels, got {}",
                self.image_size
            )));
        }
        if self.pairs == 0 {
            return Err(Error::Usage("--pairs must be at least 1".into()));
        }
        if self.shards == 0 || self.shards > self.pairs {
            return Err(Error::Usage(format!(
                "--shards must be between 1 and --pairs ({}), got {}",
                self.pairs, self.shards
            )));
        }
        if self.shards > MAX_SHARDS {
            return Err(Error::Usage(format!(
                "--shards must be at most {MAX_SHARDS} (one file each), got {}",
                self.shards
            )));
        }
        let widest = crate::data::MAX_EMBEDDING_DIM;
        if let Some(d) = self.embedding_dim.filter(|d| !(1..=widest).contains(d)) {
            return Err(Error::Usage(format!(
                "--embedding-dim must be between 1 and {widest} (the widest embedding \
                 ncclean reads), got {d}"
            )));
        }
        if self.embedding_dim.is_none() && self.shards > 1 {
            return Err(Error::Usage(
                "--shards needs --embedding-dim (image demo data is written as one file)".into(),
            ));
        }
        Ok(())
    }

    /// Write the files into `out` (created if missing), calling `written`
    /// with each file's path once it is complete.
    pub fn write(&self, rep: &Reporter, written: &mut dyn FnMut(&Path)) -> Result<()> {
        std::fs::create_dir_all(&self.out)
            .with_context(|| format!("cannot create {}", self.out.display()))?;
        match self.embedding_dim {
            Some(dim) => self.write_embedding_shards(dim, rep, written),
            None => self.write_images(rep, written),
        }
    }

    /// `demo.parquet` of PNG images.
    fn write_images(&self, rep: &Reporter, written: &mut dyn FnMut(&Path)) -> Result<()> {
        let path = self.out.join("demo.parquet");
        let mut pairs = super::demo::pairs(&DemoOptions {
            pairs: self.pairs,
            seed: self.seed,
            image_size: self.image_size,
        });
        let schema = demo_schema(Field::new("image", DataType::Binary, false));
        let mut w = AtomicParquetWriter::create(&path, schema.clone(), &self.metadata())?;
        loop {
            crate::runtime::interrupt::check()?;
            let chunk: Vec<_> = pairs.by_ref().take(ROW_GROUP).collect();
            if chunk.is_empty() {
                break;
            }
            let images: ArrayRef = Arc::new(BinaryArray::from_iter_values(
                chunk.iter().map(|p| p.image.as_slice()),
            ));
            w.write(&batch(&schema, &chunk, images)?)?;
        }
        w.finish()?;
        rep.info(&format!("wrote {} pairs to {}", self.pairs, path.display()));
        written(&path);
        Ok(())
    }

    /// Embedding shards, generated and written a row group at a time.
    fn write_embedding_shards(
        &self,
        dim: usize,
        rep: &Reporter,
        written: &mut dyn FnMut(&Path),
    ) -> Result<()> {
        let gen = EmbeddingDemo::new(dim, self.seed);
        let schema = demo_schema(Field::new(
            "image_embedding",
            DataType::List(Arc::new(Field::new("item", DataType::Float32, true))),
            false,
        ));
        let mut meta = self.metadata();
        meta.insert("ncclean.demo.embedding_dim".to_string(), dim.to_string());
        for k in 0..self.shards {
            let path = if self.shards == 1 {
                self.out.join("demo.parquet")
            } else {
                self.out.join(format!("demo-{k:05}.parquet"))
            };
            let mut w = AtomicParquetWriter::create(&path, schema.clone(), &meta)?;
            let range = shard_range(self.pairs, self.shards, k);
            for start in range.clone().step_by(ROW_GROUP) {
                crate::runtime::interrupt::check()?;
                let pairs: Vec<_> = (start..range.end.min(start + ROW_GROUP))
                    .map(|i| gen.pair(i))
                    .collect();
                let mut emb = ListBuilder::new(Float32Builder::with_capacity(pairs.len() * dim));
                for p in &pairs {
                    emb.values().append_slice(&p.image);
                    emb.append(true);
                }
                let emb: ArrayRef = Arc::new(emb.finish());
                w.write(&batch(&schema, &pairs, emb)?)?;
            }
            w.finish()?;
            written(&path);
        }
        rep.info(&format!(
            "wrote {} pairs with {dim}-float embeddings in {} file(s) to {}",
            self.pairs,
            self.shards,
            self.out.display()
        ));
        Ok(())
    }

    /// Footer metadata every demo file carries.
    fn metadata(&self) -> BTreeMap<String, String> {
        let mut m = Metadata::versioned();
        m.put("demo.seed", self.seed.to_string());
        m.put("demo.pairs", self.pairs.to_string());
        m.into_map()
    }
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

/// One record batch of `pairs`, their images already made into a column.
fn batch<I>(schema: &Arc<Schema>, pairs: &[Pair<I>], images: ArrayRef) -> Result<RecordBatch> {
    let col = |f: &dyn Fn(&Pair<I>) -> &str| -> ArrayRef {
        Arc::new(StringArray::from_iter_values(pairs.iter().map(f)))
    };
    Ok(RecordBatch::try_new(
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
    .context("building demo batch")?)
}

/// The rows of shard `k` of `n` over `pairs` (balanced, in order).
fn shard_range(pairs: usize, n: usize, k: usize) -> std::ops::Range<usize> {
    let start = k * (pairs / n) + k.min(pairs % n);
    start..start + pairs / n + usize::from(k < pairs % n)
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
