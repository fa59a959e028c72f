//! Build the graded benchmark (issue #31, METHODS.md section 6 "Graded
//! agreement") from one Flickr8k split that no method trains on.
//!
//! Every image of the split is paired with captions across the range of
//! correctness:
//! - `own`: its own first caption;
//! - `near-R`: a caption of its R-th nearest other image, for R in
//!   [`NEAR_RANKS`], neighbours picked as `ncclean corrupt --mode hard`
//!   picks them (TF-IDF over the images' caption words), so the benchmark
//!   does not favour the towers a method is trained on;
//! - `random`: captions of [`RANDOM`] random other images.
//!
//! The graded relevance of (image, caption) is the mean cosine between the
//! caption's MiniLM embedding and those of the image's *other* reference
//! captions (its captions 2..5; the candidate `own` caption is never its own
//! reference). On held-out human ratings of Flickr8k pairs this relevance
//! agrees with the experts at Kendall tau-c 55 and orders the methods' scores
//! as the experts do, so it is the development measure of how well labels
//! rank partly-right captions.
//!
//! Output columns: `key`, `image` (JPEG bytes), `caption`, `relevance`
//! (f64), `kind` (own / near-R / random), `image_key`.
//!
//! Usage: cargo run --example graded_build -- SPLIT.parquet OUT.parquet [MINILM_DIR]
//! (MiniLM: `bash scripts/fetch_minilm.sh`; default its install directory).
//! Research data: never commit the output.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

use arrow_array::{Array, ArrayRef, BinaryArray, Float64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use candle_core::Device;
use ncclean::data::AtomicParquetWriter;
use ncclean::synth::corrupt::neighbours::WordIndex;
use ncclean_models::bert_text::BertTextTower;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

/// Ranks of the neighbour images whose captions an image is paired with.
const NEAR_RANKS: &[usize] = &[1, 3, 10, 30];
/// Random other images whose captions an image is paired with.
const RANDOM: usize = 2;
/// Captions embedded per MiniLM batch.
const BATCH: usize = 64;

type Error = Box<dyn std::error::Error>;

/// (image, caption's image, caption's index, kind).
type Candidate = (usize, usize, usize, String);

struct Split {
    /// Per image: key prefix, JPEG bytes, captions in order.
    images: Vec<(String, Vec<u8>, Vec<String>)>,
}

fn read_split(path: &std::path::Path) -> Result<Split, Error> {
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let reader = ParquetRecordBatchReaderBuilder::try_new(file)?.build()?;
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut images: Vec<(String, Vec<u8>, Vec<String>)> = Vec::new();
    for batch in reader {
        let batch = batch?;
        let col = |name: &str| {
            batch
                .column_by_name(name)
                .ok_or_else(|| format!("{}: no column {name:?}", path.display()))
        };
        let keys = col("key")?
            .as_any()
            .downcast_ref::<StringArray>()
            .ok_or("key: not a string")?
            .clone();
        let bytes = col("image")?
            .as_any()
            .downcast_ref::<BinaryArray>()
            .ok_or("image: not binary")?
            .clone();
        let caps = col("caption")?
            .as_any()
            .downcast_ref::<StringArray>()
            .ok_or("caption: not a string")?
            .clone();
        for i in 0..batch.num_rows() {
            // Flickr8k keys are `<image file>#<caption index>`.
            let image = keys
                .value(i)
                .split('#')
                .next()
                .unwrap_or_default()
                .to_string();
            let g = *index.entry(image.clone()).or_insert_with(|| {
                images.push((image, bytes.value(i).to_vec(), Vec::new()));
                images.len() - 1
            });
            images[g].2.push(caps.value(i).to_string());
        }
    }
    Ok(Split { images })
}

/// Unit-length MiniLM embeddings of `texts`.
fn embed(tower: &BertTextTower, texts: &[&str]) -> Result<Vec<Vec<f32>>, Error> {
    let mut out = Vec::with_capacity(texts.len());
    for chunk in texts.chunks(BATCH) {
        let pooled: Vec<Vec<f32>> = tower.forward(chunk)?.pooled.to_vec2()?;
        for v in pooled {
            let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
            out.push(v.into_iter().map(|x| x / norm).collect());
        }
    }
    Ok(out)
}

fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| f64::from(*x) * f64::from(*y))
        .sum()
}

/// A small deterministic generator (SplitMix64) for the random captions.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        (ncclean_models::hash::mix64(self.0) % n as u64) as usize
    }
}

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(split_path), Some(out)) = (args.first(), args.get(1)) else {
        return Err("usage: graded_build SPLIT.parquet OUT.parquet [MINILM_DIR]".into());
    };
    let minilm = args.get(2).map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var("HOME").unwrap_or_default())
            .join(".cache/ncclean/all-MiniLM-L6-v2")
    });
    let split = read_split(std::path::Path::new(split_path))?;
    let n = split.images.len();
    if n < NEAR_RANKS[NEAR_RANKS.len() - 1] + 2 {
        return Err(format!("{split_path}: {n} images, too few for the neighbour ranks").into());
    }
    if let Some((key, _, caps)) = split.images.iter().find(|im| im.2.len() < 2) {
        return Err(format!(
            "{key}: {} caption(s); every image needs two or more",
            caps.len()
        )
        .into());
    }
    let tower = BertTextTower::load(&minilm, &Device::Cpu).map_err(|e| {
        format!(
            "MiniLM from {}: {e} (run scripts/fetch_minilm.sh)",
            minilm.display()
        )
    })?;
    // Every caption of the split, embedded once.
    let mut offsets = Vec::with_capacity(n);
    let mut all: Vec<&str> = Vec::new();
    for (_, _, caps) in &split.images {
        offsets.push(all.len());
        all.extend(caps.iter().map(String::as_str));
    }
    eprintln!("embedding {} captions of {n} images with MiniLM", all.len());
    let emb = embed(&tower, &all)?;
    let pairs = candidates(&split);
    let relevance: Vec<f64> = pairs
        .iter()
        .map(|&(g, h, c, _)| {
            let cand = &emb[offsets[h] + c];
            let refs = 1..split.images[g].2.len();
            let k = refs.len() as f64;
            refs.map(|j| dot(cand, &emb[offsets[g] + j])).sum::<f64>() / k
        })
        .collect();
    write_pairs(
        std::path::Path::new(out),
        split_path,
        &split,
        &pairs,
        &relevance,
    )?;
    let mut by_kind: BTreeMap<&str, (usize, f64)> = BTreeMap::new();
    for (p, r) in pairs.iter().zip(&relevance) {
        let e = by_kind.entry(p.3.as_str()).or_default();
        e.0 += 1;
        e.1 += r;
    }
    println!("{out}: {} pairs of {n} images", pairs.len());
    for (kind, (count, sum)) in by_kind {
        println!(
            "  {kind:<8} {count:>6} pairs, mean relevance {:.3}",
            sum / count as f64
        );
    }
    Ok(())
}

/// Every image's candidate captions: its own, those of its neighbours at
/// [`NEAR_RANKS`], and [`RANDOM`] of random other images.
fn candidates(split: &Split) -> Vec<Candidate> {
    let n = split.images.len();
    let docs: Vec<Vec<&str>> = split
        .images
        .iter()
        .map(|im| im.2.iter().map(String::as_str).collect())
        .collect();
    let words = WordIndex::new(&docs);
    let deepest = NEAR_RANKS[NEAR_RANKS.len() - 1];
    let mut rng = Rng(8);
    let mut pairs: Vec<Candidate> = Vec::new();
    for g in 0..n {
        pairs.push((g, g, 0, "own".into()));
        let near = words.nearest(g, deepest);
        for &r in NEAR_RANKS {
            if let Some(&h) = near.get(r - 1) {
                let c = (g + r) % split.images[h].2.len();
                pairs.push((g, h, c, format!("near-{r}")));
            }
        }
        // Random captions of other images, none already paired with g.
        let mut drawn = 0;
        while drawn < RANDOM {
            let h = rng.below(n);
            let c = rng.below(split.images[h].2.len());
            if h == g
                || pairs
                    .iter()
                    .rev()
                    .take(NEAR_RANKS.len() + RANDOM)
                    .any(|p| p.0 == g && p.1 == h && p.2 == c)
            {
                continue;
            }
            pairs.push((g, h, c, "random".into()));
            drawn += 1;
        }
    }
    pairs
}

/// The benchmark file: one row per candidate pair with its relevance.
fn write_pairs(
    out: &std::path::Path,
    split_path: &str,
    split: &Split,
    pairs: &[Candidate],
    relevance: &[f64],
) -> Result<(), Error> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("key", DataType::Utf8, false),
        Field::new("image", DataType::Binary, false),
        Field::new("caption", DataType::Utf8, false),
        Field::new("relevance", DataType::Float64, false),
        Field::new("kind", DataType::Utf8, false),
        Field::new("image_key", DataType::Utf8, false),
    ]));
    let mut meta = BTreeMap::new();
    meta.insert(
        "source".to_string(),
        format!("graded pairs from {split_path} (Flickr8k, research use only): own caption, neighbours at ranks {NEAR_RANKS:?}, {RANDOM} random; relevance = mean MiniLM cosine to the image's other captions"),
    );
    let mut w = AtomicParquetWriter::create(out, schema.clone(), &meta)?;
    for chunk in pairs.chunks(2000).zip(relevance.chunks(2000)) {
        let (ps, rel) = chunk;
        let col = |f: &dyn Fn(&Candidate) -> String| -> ArrayRef {
            Arc::new(StringArray::from(ps.iter().map(f).collect::<Vec<_>>()))
        };
        let keys = col(&|p| format!("{}|{}#{}", split.images[p.0].0, split.images[p.1].0, p.2));
        let images: ArrayRef = Arc::new(BinaryArray::from_iter_values(
            ps.iter().map(|p| split.images[p.0].1.as_slice()),
        ));
        let captions = col(&|p| split.images[p.1].2[p.2].clone());
        let rel: ArrayRef = Arc::new(Float64Array::from(rel.to_vec()));
        let kinds = col(&|p| p.3.clone());
        let image_keys = col(&|p| split.images[p.0].0.clone());
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![keys, images, captions, rel, kinds, image_keys],
        )?;
        debug_assert_eq!(batch.column(0).len(), ps.len());
        w.write(&batch)?;
    }
    w.finish()?;
    Ok(())
}
