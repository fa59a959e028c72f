//! Build Flickr8k parquet files for ncclean from the shared copy.
//!
//! One row per image–caption pair (`key` = `image#index`, `image` = JPEG
//! bytes, `caption`), one file per official split. Rows are streamed in row
//! groups, so memory stays bounded.
//!
//! Usage: cargo run --release --example flickr8k_build -- [FLICKR8K_DIR] [OUT_DIR]
//! (defaults: ../shared/data/flickr8k and target/flickr8k). The data is for
//! research use only: never commit the output.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{ArrayRef, BinaryArray, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use ncclean::data::AtomicParquetWriter;

const ROW_GROUP: usize = 2000;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let src = PathBuf::from(
        args.first()
            .map(String::as_str)
            .unwrap_or("../shared/data/flickr8k"),
    );
    let out = PathBuf::from(args.get(1).map(String::as_str).unwrap_or("target/flickr8k"));
    if !src.join("captions.tsv").is_file() {
        return Err(format!(
            "{}: no captions.tsv; pass the Flickr8k directory as the first argument",
            src.display()
        )
        .into());
    }
    std::fs::create_dir_all(&out)?;
    let tsv = std::fs::read_to_string(src.join("captions.tsv"))?;
    let mut captions: HashMap<&str, Vec<(u32, &str)>> = HashMap::new();
    for (n, line) in tsv.lines().enumerate().skip(1) {
        let mut parts = line.splitn(3, '\t');
        let (Some(img), Some(idx), Some(cap)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(format!(
                "captions.tsv line {}: expected image<TAB>index<TAB>caption",
                n + 1
            )
            .into());
        };
        captions.entry(img).or_default().push((idx.parse()?, cap));
    }
    for caps in captions.values_mut() {
        caps.sort_by_key(|c| c.0);
    }
    for split in ["train", "dev", "test"] {
        let list = std::fs::read_to_string(src.join("splits").join(format!("{split}.txt")))?;
        let images: Vec<&str> = list
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        let path = out.join(format!("{split}.parquet"));
        let rows = write_split(&src, &images, &captions, &path)?;
        println!("{}: {} images, {rows} pairs", path.display(), images.len());
    }
    Ok(())
}

fn write_split(
    src: &Path,
    images: &[&str],
    captions: &HashMap<&str, Vec<(u32, &str)>>,
    path: &Path,
) -> Result<usize, Box<dyn std::error::Error>> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("key", DataType::Utf8, false),
        Field::new("image", DataType::Binary, false),
        Field::new("caption", DataType::Utf8, false),
    ]));
    let mut meta = BTreeMap::new();
    meta.insert(
        "source".to_string(),
        "Flickr8k (Hodosh et al. 2013), research use only".to_string(),
    );
    let mut w = AtomicParquetWriter::create(path, schema.clone(), &meta)?;
    let (mut keys, mut bytes, mut caps) = (Vec::new(), Vec::new(), Vec::new());
    let mut rows = 0;
    for img in images {
        let data = std::fs::read(src.join("images").join(img))?;
        for (idx, cap) in captions.get(img).map(Vec::as_slice).unwrap_or(&[]) {
            keys.push(format!("{img}#{idx}"));
            bytes.push(data.clone());
            caps.push(cap.to_string());
        }
        if keys.len() >= ROW_GROUP {
            rows += flush(&mut w, &schema, &mut keys, &mut bytes, &mut caps)?;
        }
    }
    rows += flush(&mut w, &schema, &mut keys, &mut bytes, &mut caps)?;
    w.finish()?;
    Ok(rows)
}

fn flush(
    w: &mut AtomicParquetWriter,
    schema: &Arc<Schema>,
    keys: &mut Vec<String>,
    bytes: &mut Vec<Vec<u8>>,
    caps: &mut Vec<String>,
) -> Result<usize, Box<dyn std::error::Error>> {
    let n = keys.len();
    if n == 0 {
        return Ok(0);
    }
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(StringArray::from(std::mem::take(keys))) as ArrayRef,
            Arc::new(BinaryArray::from_iter_values(bytes.iter())) as ArrayRef,
            Arc::new(StringArray::from(std::mem::take(caps))) as ArrayRef,
        ],
    )?;
    bytes.clear();
    w.write(&batch)?;
    Ok(n)
}
