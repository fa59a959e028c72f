//! Frozen-tower features, computed once and cached on disk.
//!
//! The cache is content-addressed: one store per tower (weights and
//! preprocessing), holding a feature vector per distinct image (keyed by a
//! hash of its bytes) or distinct caption (keyed by a hash of its text). A
//! clean dataset, its corrupted copy, a re-sharded copy and new data that
//! shares images all reuse the same vectors, and a photo with five captions
//! is encoded once.
//!
//! Store layout (`<cache-dir>/<hash of tower tag>/`):
//! - `tower.txt`: the tower tag, checked on open;
//! - `NNNNNN.keys`: 16-byte keys, one per vector, in order;
//! - `NNNNNN.global.f16`: global vectors (little-endian f16);
//! - `NNNNNN.local.f16`: local features (image grid cells / patches, or the
//!   real tokens of each caption), for methods that need them;
//! - `NNNNNN.lens`: tokens per caption (u16), text stores only.
//!
//! A shard is written under a temporary name and renamed, so an interrupted
//! run never leaves a half-written shard. Only the vectors a run needs are
//! read (by seeking), so memory is bounded by the data, not the cache; local
//! features are read only when the head or method uses them (they are ~50×
//! the size of the global vectors) and stay f16 in memory.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use candle_core::{DType, Device, Tensor};
use half::f16;
use ncclean_pipelines::Observer;
use sha2::{Digest, Sha256};

use crate::data::{ImageValue, InputSet};
use crate::encoders::{ImageTower, TextTower};
use crate::error::Result;
use crate::progress::Reporter;

/// Marks a row without a vector.
pub const NONE: u32 = u32::MAX;
const IMAGE_BATCH: usize = 32;
const TEXT_BATCH: usize = 64;
const READ_ROWS: usize = 256;

/// A content key: the first 16 bytes of a sha256.
pub type Key = [u8; 16];

/// Where features are cached, if anywhere.
#[derive(Debug, Clone)]
pub struct CacheOptions {
    /// Cache directory; `None` disables caching.
    pub dir: Option<PathBuf>,
}

impl CacheOptions {
    /// `$NCCLEAN_CACHE_DIR`, else `~/.cache/ncclean/features`.
    pub fn default_dir() -> Option<PathBuf> {
        if let Some(d) = std::env::var_os("NCCLEAN_CACHE_DIR") {
            return Some(PathBuf::from(d));
        }
        std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/ncclean/features"))
    }
}

/// Global features of one side, aligned with input rows.
#[derive(Debug, Clone, Default)]
pub struct SideFeatures {
    /// Width of the vectors.
    pub dim: usize,
    /// Distinct vectors, `n × dim`.
    pub vectors: Vec<f32>,
    /// Per input row: index into `vectors`, or [`NONE`].
    pub index: Vec<u32>,
    /// Per input row: why it has no vector (None for rows that were
    /// unusable before encoding, which the reader reports itself).
    pub errors: Vec<Option<String>>,
    /// Vectors found in the cache.
    pub hits: usize,
    /// Vectors computed in this run.
    pub computed: usize,
    /// Seconds spent in the tower.
    pub seconds: f64,
    /// Local features per distinct vector, when they were asked for.
    pub local: Option<SideLocal>,
}

/// Local features of one side: one set per entry of
/// [`SideFeatures::vectors`], in the same order (an item that failed gets one
/// zero vector, so every set is non-empty).
#[derive(Debug, Clone, Default)]
pub struct SideLocal {
    /// Width of every local vector.
    pub dim: usize,
    /// Concatenated sets, `offsets.last() × dim` values.
    pub data: Vec<f16>,
    /// Set `k` is vectors `offsets[k]..offsets[k + 1]`.
    pub offsets: Vec<usize>,
}

impl SideFeatures {
    /// The vector of input row `row`, if it has one.
    pub fn row(&self, row: usize) -> Option<&[f32]> {
        let i = *self.index.get(row)?;
        if i == NONE {
            return None;
        }
        let d = self.dim;
        self.vectors.get(i as usize * d..(i as usize + 1) * d)
    }
}

/// Features of both sides (either may be absent when that side's tower is
/// trainable or precomputed).
pub struct Extracted {
    /// Image side.
    pub image: Option<SideFeatures>,
    /// Text side.
    pub text: Option<SideFeatures>,
}

fn key_of(bytes: &[u8]) -> Key {
    let mut k = [0u8; 16];
    k.copy_from_slice(&Sha256::digest(bytes)[..16]);
    k
}

/// One tower's store.
struct Store {
    dir: PathBuf,
    /// key → (shard file stem, position in shard)
    index: HashMap<Key, (String, usize)>,
    dim: Option<usize>,
}

impl Store {
    fn open(root: &Path, tag: &str) -> Result<Store> {
        let dir = root.join(&crate::hex::sha256_hex(tag.as_bytes())[..24]);
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create feature cache {}", dir.display()))?;
        let tag_file = dir.join("tower.txt");
        match std::fs::read_to_string(&tag_file) {
            Ok(t) if t != tag => {
                return Err(anyhow::anyhow!(
                    "{}: holds features of another tower ({t})",
                    dir.display()
                )
                .into())
            }
            Ok(_) => {}
            Err(_) => std::fs::write(&tag_file, tag)
                .with_context(|| format!("writing {}", tag_file.display()))?,
        }
        let mut index = HashMap::new();
        let mut dim = None;
        let mut stems: Vec<String> = std::fs::read_dir(&dir)
            .with_context(|| format!("listing {}", dir.display()))?
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                e.file_name()
                    .to_str()
                    .and_then(|n| n.strip_suffix(".keys"))
                    .map(str::to_string)
            })
            .collect();
        stems.sort();
        for stem in stems {
            let keys = std::fs::read(dir.join(format!("{stem}.keys")))
                .with_context(|| format!("reading cache shard {stem}"))?;
            let n = keys.len() / 16;
            let global_len = std::fs::metadata(dir.join(format!("{stem}.global.f16")))
                .map(|m| m.len() as usize)
                .unwrap_or(0);
            if n == 0 || global_len % (2 * n) != 0 {
                continue; // a damaged shard is ignored; its vectors are recomputed
            }
            dim.get_or_insert(global_len / (2 * n));
            for (i, k) in keys.chunks_exact(16).enumerate() {
                let mut key = [0u8; 16];
                key.copy_from_slice(k);
                index.entry(key).or_insert_with(|| (stem.clone(), i));
            }
        }
        Ok(Store { dir, index, dim })
    }

    /// Read the global vectors of `keys` (all present in the index).
    fn read(&self, keys: &[Key], dim: usize) -> Result<Vec<f32>> {
        let mut out = Vec::with_capacity(keys.len() * dim);
        let mut files: HashMap<&str, File> = HashMap::new();
        let mut buf = vec![0u8; dim * 2];
        for k in keys {
            let (stem, pos) = &self.index[k];
            let f = match files.get_mut(stem.as_str()) {
                Some(f) => f,
                None => {
                    let p = self.dir.join(format!("{stem}.global.f16"));
                    let f = File::open(&p).with_context(|| format!("opening {}", p.display()))?;
                    files.entry(stem.as_str()).or_insert(f)
                }
            };
            f.seek(SeekFrom::Start((pos * dim * 2) as u64))
                .context("reading cached features")?;
            f.read_exact(&mut buf).context("reading cached features")?;
            out.extend(
                buf.chunks_exact(2)
                    .map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32()),
            );
        }
        Ok(out)
    }
}

impl Store {
    /// Vector offsets of the local sets in shard `stem` (`n + 1` entries):
    /// from the `.lens` file for text stores, else an equal share per item.
    fn local_layout(&self, stem: &str, dim: usize) -> Result<Vec<usize>> {
        let size = |ext: &str| -> Result<u64> {
            let p = self.dir.join(format!("{stem}.{ext}"));
            Ok(std::fs::metadata(&p)
                .with_context(|| format!("reading {}", p.display()))?
                .len())
        };
        let n = (size("keys")? / 16) as usize;
        let bytes = size("local.f16")? as usize;
        let lens_path = self.dir.join(format!("{stem}.lens"));
        let counts: Vec<usize> = if lens_path.exists() {
            std::fs::read(&lens_path)
                .with_context(|| format!("reading {}", lens_path.display()))?
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]) as usize)
                .collect()
        } else if n > 0 && bytes % (n * dim * 2) == 0 {
            vec![bytes / (n * dim * 2); n]
        } else {
            Vec::new()
        };
        let total: usize = counts.iter().sum();
        if counts.len() != n || total * dim * 2 != bytes || counts.contains(&0) {
            return Err(anyhow::anyhow!(
                "feature cache shard {}/{stem}: its local features do not fit {n} items of width {dim}; \
                 delete that shard's files ({stem}.*) and they will be encoded again",
                self.dir.display()
            )
            .into());
        }
        let mut offsets = Vec::with_capacity(n + 1);
        offsets.push(0);
        for c in counts {
            offsets.push(offsets.last().copied().unwrap_or(0) + c);
        }
        Ok(offsets)
    }

    /// Read the local sets of `keys` (all present in the index), as f16.
    fn read_local(&self, keys: &[Key], dim: usize) -> Result<Vec<Vec<f16>>> {
        let mut layouts: HashMap<&str, Vec<usize>> = HashMap::new();
        let mut files: HashMap<&str, File> = HashMap::new();
        let mut out = Vec::with_capacity(keys.len());
        let mut buf = Vec::new();
        for k in keys {
            let (stem, pos) = &self.index[k];
            if !layouts.contains_key(stem.as_str()) {
                layouts.insert(stem.as_str(), self.local_layout(stem, dim)?);
                let p = self.dir.join(format!("{stem}.local.f16"));
                let f = File::open(&p).with_context(|| format!("opening {}", p.display()))?;
                files.insert(stem.as_str(), f);
            }
            let (a, b) = {
                let l = &layouts[stem.as_str()];
                (l[*pos], l[pos + 1])
            };
            let f = files
                .get_mut(stem.as_str())
                .context("cache shard file went missing")?;
            buf.resize((b - a) * dim * 2, 0);
            f.seek(SeekFrom::Start((a * dim * 2) as u64))
                .context("reading cached local features")?;
            f.read_exact(&mut buf)
                .context("reading cached local features")?;
            out.push(
                buf.chunks_exact(2)
                    .map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]])))
                    .collect(),
            );
        }
        Ok(out)
    }
}

/// Writes one new shard; renamed into place on `finish`, removed on drop.
struct ShardWriter {
    dir: PathBuf,
    stem: String,
    keys: BufWriter<File>,
    global: BufWriter<File>,
    local: BufWriter<File>,
    lens: Option<BufWriter<File>>,
    count: usize,
}

/// All values of `t`, flattened and rounded to f16 (the cache's precision).
fn f16_values(t: &Tensor) -> Result<Vec<f16>> {
    let v: Vec<f32> = t
        .to_dtype(DType::F32)
        .and_then(|t| t.flatten_all())
        .and_then(|t| t.to_vec1())
        .context("reading features")?;
    Ok(v.into_iter().map(f16::from_f32).collect())
}

fn le_bytes(v: &[f16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect()
}

impl ShardWriter {
    fn create(dir: &Path, text: bool) -> Result<ShardWriter> {
        // Time, process and a per-process counter: two shards written within
        // one millisecond by one process must not share a name (the second
        // rename would replace the first shard).
        static SHARDS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let stem = format!(
            "{:013}-{}-{}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis())
                .unwrap_or(0),
            std::process::id(),
            SHARDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let open = |ext: &str| -> Result<BufWriter<File>> {
            let p = dir.join(format!(".{stem}.{ext}.tmp"));
            Ok(BufWriter::new(
                File::create(&p).with_context(|| format!("creating {}", p.display()))?,
            ))
        };
        Ok(ShardWriter {
            keys: open("keys")?,
            global: open("global.f16")?,
            local: open("local.f16")?,
            lens: if text { Some(open("lens")?) } else { None },
            dir: dir.to_path_buf(),
            stem,
            count: 0,
        })
    }

    /// Append `keys` with their global vectors and local sets (f16 values).
    fn push(&mut self, keys: &[Key], global: &[f16], local: &[f16], lens: &[u16]) -> Result<()> {
        for k in keys {
            self.keys.write_all(k).context("writing cache keys")?;
        }
        self.global
            .write_all(&le_bytes(global))
            .context("writing cached features")?;
        self.local
            .write_all(&le_bytes(local))
            .context("writing cached features")?;
        if let Some(l) = self.lens.as_mut() {
            for n in lens {
                l.write_all(&n.to_le_bytes())
                    .context("writing cache lens")?;
            }
        }
        self.count += keys.len();
        Ok(())
    }

    fn exts(&self) -> Vec<&'static str> {
        let mut e = vec!["global.f16", "local.f16", "keys"];
        if self.lens.is_some() {
            e.insert(2, "lens");
        }
        e
    }

    fn finish(mut self) -> Result<()> {
        for w in [&mut self.keys, &mut self.global, &mut self.local] {
            w.flush().context("writing feature cache")?;
        }
        if let Some(l) = self.lens.as_mut() {
            l.flush().context("writing feature cache")?;
        }
        if self.count > 0 {
            // The keys file goes last: a shard is visible only once complete.
            for ext in self.exts() {
                let from = self.dir.join(format!(".{}.{ext}.tmp", self.stem));
                let to = self.dir.join(format!("{}.{ext}", self.stem));
                std::fs::rename(&from, &to).with_context(|| format!("moving {}", to.display()))?;
            }
        }
        Ok(())
    }
}

impl Drop for ShardWriter {
    fn drop(&mut self) {
        for ext in self.exts() {
            let _ = std::fs::remove_file(self.dir.join(format!(".{}.{ext}.tmp", self.stem)));
        }
    }
}

fn image_bytes(v: &ImageValue) -> std::result::Result<Vec<u8>, String> {
    match v {
        ImageValue::Bytes(b) => Ok(b.clone()),
        ImageValue::Path(p) => {
            std::fs::read(p).map_err(|e| format!("cannot read image file {}: {e}", p.display()))
        }
        ImageValue::Embedding(_) => {
            Err("row holds an embedding but the image tower needs an image".into())
        }
    }
}

/// Per-side bookkeeping while streaming.
struct Side {
    store: Option<Store>,
    writer: Option<ShardWriter>,
    /// key → index into `vectors` of the result
    slot: HashMap<Key, u32>,
    /// keys in slot order
    order: Vec<Key>,
    /// slots computed in this run, with their vectors
    fresh: HashMap<u32, Vec<f32>>,
    failed: HashMap<Key, String>,
    index: Vec<u32>,
    errors: Vec<Option<String>>,
    dim: usize,
    seconds: f64,
    /// Width of the local features when they are wanted.
    local_dim: Option<usize>,
    /// Local sets computed in this run, by slot.
    fresh_local: HashMap<u32, Vec<f16>>,
}

impl Side {
    fn new(
        root: Option<&PathBuf>,
        tag: &str,
        rows: usize,
        text: bool,
        local_dim: Option<usize>,
    ) -> Result<Side> {
        let store = match root {
            Some(r) => Some(Store::open(r, tag)?),
            None => None,
        };
        let writer = match &store {
            Some(s) => Some(ShardWriter::create(&s.dir, text)?),
            None => None,
        };
        Ok(Side {
            dim: store.as_ref().and_then(|s| s.dim).unwrap_or(0),
            store,
            writer,
            slot: HashMap::new(),
            order: Vec::new(),
            fresh: HashMap::new(),
            failed: HashMap::new(),
            index: vec![NONE; rows],
            errors: vec![None; rows],
            seconds: 0.0,
            local_dim,
            fresh_local: HashMap::new(),
        })
    }

    fn cached(&self, k: &Key) -> bool {
        self.store.as_ref().is_some_and(|s| s.index.contains_key(k))
    }

    /// Register `row` as using `key`; true when the key still needs encoding.
    fn assign(&mut self, row: usize, key: Key) -> bool {
        if let Some(e) = self.failed.get(&key) {
            self.errors[row] = Some(e.clone());
            return false;
        }
        let next = self.order.len() as u32;
        let mut new = false;
        let slot = *self.slot.entry(key).or_insert_with(|| {
            new = true;
            next
        });
        if new {
            self.order.push(key);
        }
        self.index[row] = slot;
        new && !self.cached(&key)
    }

    fn record(
        &mut self,
        keys: &[Key],
        out: &crate::encoders::TowerOutput,
        local: &Tensor,
        lens: &[u16],
    ) -> Result<()> {
        // One rounding to f16 serves the shard and this run, so cached and
        // fresh runs see identical values.
        if keys.is_empty() {
            return Ok(());
        }
        let global = f16_values(&out.global)?;
        let local_h = f16_values(local)?;
        self.dim = global.len() / keys.len();
        let dim = self.dim.max(1);
        for (k, v) in keys.iter().zip(global.chunks_exact(dim)) {
            self.fresh
                .insert(self.slot[k], v.iter().map(|x| x.to_f32()).collect());
        }
        if let Some(ldim) = self.local_dim {
            let counts: Vec<usize> = if lens.is_empty() {
                vec![local_h.len() / (ldim * keys.len()).max(1); keys.len()]
            } else {
                lens.iter().map(|&n| n as usize).collect()
            };
            if counts.iter().sum::<usize>() * ldim != local_h.len() {
                return Err(anyhow::anyhow!(
                    "the tower returned {} local values for {} items of width {ldim}",
                    local_h.len(),
                    keys.len()
                )
                .into());
            }
            let mut at = 0;
            for (k, c) in keys.iter().zip(counts) {
                let set = local_h[at * ldim..(at + c) * ldim].to_vec();
                self.fresh_local.insert(self.slot[k], set);
                at += c;
            }
        }
        if let Some(w) = self.writer.as_mut() {
            w.push(keys, &global, &local_h, lens)?;
        }
        Ok(())
    }

    fn fail(&mut self, key: Key, why: String) {
        self.failed.insert(key, why);
    }

    fn finish(mut self, rep: &Reporter, what: &str) -> Result<SideFeatures> {
        if let Some(w) = self.writer.take() {
            w.finish()?;
        }
        // Rows whose key failed after they were assigned.
        for (row, slot) in self.index.iter_mut().enumerate() {
            if *slot != NONE {
                if let Some(e) = self.failed.get(&self.order[*slot as usize]) {
                    self.errors[row] = Some(e.clone());
                    *slot = NONE;
                }
            }
        }
        let cached_keys: Vec<Key> = self
            .order
            .iter()
            .filter(|k| !self.fresh.contains_key(&self.slot[*k]) && !self.failed.contains_key(*k))
            .copied()
            .collect();
        let dim = self.dim;
        let cached_vecs = match (&self.store, cached_keys.is_empty()) {
            (Some(s), false) => s.read(&cached_keys, dim)?,
            _ => Vec::new(),
        };
        let mut cached_iter = cached_vecs.chunks_exact(dim.max(1));
        let mut vectors = vec![0f32; self.order.len() * dim];
        for (i, k) in self.order.iter().enumerate() {
            let src: Option<&[f32]> = match self.fresh.get(&(i as u32)) {
                Some(v) => Some(v.as_slice()),
                None if self.failed.contains_key(k) => None,
                None => cached_iter.next(),
            };
            if let Some(v) = src {
                vectors[i * dim..(i + 1) * dim].copy_from_slice(v);
            }
        }
        let local = match self.local_dim {
            Some(ldim) => {
                let mut cached_sets = match (&self.store, cached_keys.is_empty()) {
                    (Some(s), false) => s.read_local(&cached_keys, ldim)?,
                    _ => Vec::new(),
                }
                .into_iter();
                let mut out = SideLocal {
                    dim: ldim,
                    data: Vec::new(),
                    offsets: vec![0],
                };
                for (i, k) in self.order.iter().enumerate() {
                    let set = match self.fresh_local.remove(&(i as u32)) {
                        Some(v) => v,
                        None if self.failed.contains_key(k) => Vec::new(),
                        None => cached_sets.next().unwrap_or_default(),
                    };
                    if set.is_empty() {
                        out.data.extend(std::iter::repeat_n(f16::ZERO, ldim));
                    } else {
                        out.data.extend_from_slice(&set);
                    }
                    out.offsets.push(out.data.len() / ldim.max(1));
                }
                Some(out)
            }
            None => None,
        };
        let computed = self.fresh.len();
        let hits = cached_keys.len();
        if computed > 0 {
            rep.info(&format!(
                "{what}: encoded {computed} in {:.1}s ({:.1}/s), {hits} from the cache",
                self.seconds,
                computed as f64 / self.seconds.max(1e-9)
            ));
        } else {
            rep.info(&format!("{what}: all {hits} from the cache"));
        }
        Ok(SideFeatures {
            dim,
            vectors,
            index: self.index,
            errors: self.errors,
            hits,
            computed,
            seconds: self.seconds,
            local,
        })
    }
}

/// Extract (or load from the cache) features of every row of `input`; with
/// `want_local`, also the local features (grid cells / patches, tokens).
pub fn extract(
    input: &InputSet,
    image: Option<&ImageTower>,
    text: Option<&TextTower>,
    want_local: bool,
    cache: &CacheOptions,
    device: &Device,
    rep: &Reporter,
) -> Result<Extracted> {
    let rows = input.num_rows();
    let root = cache.dir.as_ref();
    let mut img = match image {
        Some(t) => Some(Side::new(
            root,
            &format!("image|{}", t.cache_tag()),
            rows,
            false,
            want_local.then(|| t.local_dim()),
        )?),
        None => None,
    };
    let mut txt = match text {
        Some(t) => Some(Side::new(
            root,
            &format!("text|{}", t.cache_tag()),
            rows,
            true,
            want_local.then(|| t.local_dim()),
        )?),
        None => None,
    };
    let preprocess = image.map(|t| t.preprocess());
    let mut pending_img: Vec<(Key, Vec<f32>)> = Vec::new();
    let mut pending_txt: Vec<(Key, String)> = Vec::new();
    let mut obs = rep.observer();
    obs.start("encoding", rows as u64);
    let mut base = 0usize;
    for batch in input.pairs(READ_ROWS) {
        let batch = batch?;
        if let (Some(tower), Some(pre), Some(side)) = (image, preprocess.as_ref(), img.as_mut()) {
            let mut todo: Vec<(Key, Vec<u8>)> = Vec::new();
            for (k, r) in batch.iter().enumerate() {
                let Some(v) = r.image.as_ref().filter(|_| r.problem.is_none()) else {
                    continue;
                };
                match image_bytes(v) {
                    Err(e) => side.errors[base + k] = Some(e),
                    Ok(bytes) => {
                        let key = key_of(&bytes);
                        if side.assign(base + k, key) {
                            todo.push((key, bytes));
                        }
                    }
                }
            }
            let decoded = parallel_map(&todo, |(_, b)| {
                // A decoder bug on one malformed image must not end the whole run.
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pre.apply(b)))
                    .unwrap_or_else(|_| Err("the image decoder crashed on this image".to_string()))
            });
            for ((key, _), d) in todo.into_iter().zip(decoded) {
                match d {
                    Ok(px) => pending_img.push((key, px)),
                    Err(e) => side.fail(key, e),
                }
            }
            while pending_img.len() >= IMAGE_BATCH {
                let chunk: Vec<_> = pending_img.drain(..IMAGE_BATCH).collect();
                encode_images(tower, pre.size as usize, &chunk, side, device)?;
            }
        }
        if let (Some(tower), Some(side)) = (text, txt.as_mut()) {
            for (k, r) in batch.iter().enumerate() {
                if r.problem.is_none() {
                    let key = key_of(r.caption.as_bytes());
                    if side.assign(base + k, key) {
                        pending_txt.push((key, r.caption.clone()));
                    }
                }
            }
            while pending_txt.len() >= TEXT_BATCH {
                let chunk: Vec<_> = pending_txt.drain(..TEXT_BATCH).collect();
                encode_texts(tower, &chunk, side)?;
            }
        }
        base += batch.len();
        obs.advance(batch.len() as u64);
    }
    if let (Some(tower), Some(pre), Some(side)) = (image, preprocess.as_ref(), img.as_mut()) {
        if !pending_img.is_empty() {
            encode_images(tower, pre.size as usize, &pending_img, side, device)?;
        }
    }
    if let (Some(tower), Some(side)) = (text, txt.as_mut()) {
        if !pending_txt.is_empty() {
            encode_texts(tower, &pending_txt, side)?;
        }
    }
    obs.finish();
    Ok(Extracted {
        image: img.map(|s| s.finish(rep, "images")).transpose()?,
        text: txt.map(|s| s.finish(rep, "captions")).transpose()?,
    })
}

fn encode_images(
    tower: &ImageTower,
    size: usize,
    chunk: &[(Key, Vec<f32>)],
    side: &mut Side,
    device: &Device,
) -> Result<()> {
    let t = Instant::now();
    let mut flat = Vec::with_capacity(chunk.len() * 3 * size * size);
    for (_, px) in chunk {
        flat.extend_from_slice(px);
    }
    let x = Tensor::from_vec(flat, (chunk.len(), 3, size, size), device).context("image batch")?;
    let out = tower.forward(&x).context("image tower forward")?;
    let keys: Vec<Key> = chunk.iter().map(|c| c.0).collect();
    side.record(&keys, &out, &out.local, &[])?;
    side.seconds += t.elapsed().as_secs_f64();
    Ok(())
}

fn encode_texts(tower: &TextTower, chunk: &[(Key, String)], side: &mut Side) -> Result<()> {
    let t = Instant::now();
    let refs: Vec<&str> = chunk.iter().map(|c| c.1.as_str()).collect();
    let out = tower.forward(&refs).context("text tower forward")?;
    let mask = out.mask.as_ref().context("text tower returned no mask")?;
    let m: Vec<Vec<f32>> = mask
        .to_dtype(DType::F32)
        .and_then(|m| m.to_vec2())
        .context("reading mask")?;
    // Keep only real tokens: local.f16 holds Σ lens × d values.
    let mut real = Vec::with_capacity(chunk.len());
    let mut lens = Vec::with_capacity(chunk.len());
    for (k, row) in m.iter().enumerate() {
        let n = row.iter().filter(|&&x| x > 0.5).count().max(1);
        lens.push(n as u16);
        real.push(
            out.local
                .get(k)
                .and_then(|t| t.narrow(0, 0, n))
                .context("token features")?,
        );
    }
    let local = Tensor::cat(&real, 0).context("token features")?;
    let keys: Vec<Key> = chunk.iter().map(|c| c.0).collect();
    side.record(&keys, &out, &local, &lens)?;
    side.seconds += t.elapsed().as_secs_f64();
    Ok(())
}

/// Map `f` over `items` on all cores, preserving order.
pub(crate) fn parallel_map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    if items.is_empty() {
        return Vec::new();
    }
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let chunk = items.len().div_ceil(threads).max(1);
    let f = &f;
    std::thread::scope(|s| {
        let hs: Vec<_> = items
            .chunks(chunk)
            .map(|c| s.spawn(move || c.iter().map(f).collect::<Vec<_>>()))
            .collect();
        hs.into_iter()
            .flat_map(|h| h.join().expect("feature decoder thread panicked"))
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(v: &[f32], rows: usize) -> Tensor {
        Tensor::from_vec(v.to_vec(), (rows, v.len() / rows), &Device::Cpu).unwrap()
    }

    #[test]
    fn shards_round_trip_through_the_store_and_damage_is_ignored() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path(), "image|tower-a").unwrap();
        assert!(store.index.is_empty());
        let mut w = ShardWriter::create(&store.dir, false).unwrap();
        let keys = [key_of(b"one"), key_of(b"two")];
        // 0.1 is not exact in f16: reading back gives the f16-rounded value.
        w.push(
            &keys,
            &f16_values(&tensor(&[1.0, 0.1, -2.0, 0.5], 2)).unwrap(),
            &f16_values(&tensor(&[0.0; 12], 2)).unwrap(),
            &[],
        )
        .unwrap();
        w.finish().unwrap();
        let store = Store::open(tmp.path(), "image|tower-a").unwrap();
        assert_eq!(store.dim, Some(2));
        let back = store.read(&[keys[1], keys[0]], 2).unwrap();
        assert_eq!(back, vec![-2.0, 0.5, 1.0, f16::from_f32(0.1).to_f32()]);
        // No temporary files are left behind.
        let names: Vec<String> = std::fs::read_dir(&store.dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(names.iter().all(|n| !n.ends_with(".tmp")), "{names:?}");
        // A different tower must not open the same directory's content.
        let other = Store::open(tmp.path(), "image|tower-b").unwrap();
        assert!(other.index.is_empty());
        // A truncated shard is ignored rather than misread.
        let stem = names
            .iter()
            .find_map(|n| n.strip_suffix(".global.f16"))
            .unwrap()
            .to_string();
        std::fs::write(store.dir.join(format!("{stem}.global.f16")), [0u8; 3]).unwrap();
        assert!(Store::open(tmp.path(), "image|tower-a")
            .unwrap()
            .index
            .is_empty());
    }

    #[test]
    fn local_sets_round_trip_for_grids_and_token_lists() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, b) = (key_of(b"a"), key_of(b"b"));
        // images: 2 items × 3 cells × width 2
        let store = Store::open(tmp.path(), "image|grid").unwrap();
        let mut w = ShardWriter::create(&store.dir, false).unwrap();
        let cells: Vec<f32> = (0..12).map(|i| i as f32).collect();
        let grid = Tensor::from_vec(cells, (2, 3, 2), &Device::Cpu).unwrap();
        w.push(
            &[a, b],
            &f16_values(&tensor(&[0.0; 4], 2)).unwrap(),
            &f16_values(&grid).unwrap(),
            &[],
        )
        .unwrap();
        w.finish().unwrap();
        let store = Store::open(tmp.path(), "image|grid").unwrap();
        let sets = store.read_local(&[b, a], 2).unwrap();
        let f = |v: &[f16]| v.iter().map(|x| x.to_f32()).collect::<Vec<_>>();
        assert_eq!(f(&sets[0]), vec![6., 7., 8., 9., 10., 11.]);
        assert_eq!(f(&sets[1]), vec![0., 1., 2., 3., 4., 5.]);
        // a tower of another width cannot misread the shard
        let e = store.read_local(&[a], 5).unwrap_err().to_string();
        assert!(e.contains("do not fit 2 items of width 5"), "{e}");

        // captions: 1 and 2 real tokens of width 2, with a lens file
        let store = Store::open(tmp.path(), "text|tokens").unwrap();
        let mut w = ShardWriter::create(&store.dir, true).unwrap();
        let toks = tensor(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 3);
        w.push(
            &[a, b],
            &f16_values(&tensor(&[0.0; 4], 2)).unwrap(),
            &f16_values(&toks).unwrap(),
            &[1, 2],
        )
        .unwrap();
        w.finish().unwrap();
        let store = Store::open(tmp.path(), "text|tokens").unwrap();
        let sets = store.read_local(&[b, a], 2).unwrap();
        assert_eq!(f(&sets[0]), vec![3., 4., 5., 6.]);
        assert_eq!(f(&sets[1]), vec![1., 2.]);

        // a Side asked for local features keeps fresh sets in slot order and
        // reads cached ones; a failed item gets one zero vector
        let mut side = Side::new(
            Some(&tmp.path().to_path_buf()),
            "text|tokens",
            3,
            true,
            Some(2),
        )
        .unwrap();
        let c = key_of(b"c");
        assert!(!side.assign(0, b), "cached");
        assert!(side.assign(1, c));
        assert!(side.assign(2, key_of(b"bad")));
        side.fail(key_of(b"bad"), "no".into());
        let out = crate::encoders::TowerOutput {
            global: tensor(&[1.0, 1.0], 1),
            local: tensor(&[7.0, 8.0], 1),
            mask: None,
        };
        side.record(&[c], &out, &out.local, &[1]).unwrap();
        let feats = side
            .finish(
                &Reporter::plain(crate::progress::LogFormat::Json),
                "captions",
            )
            .unwrap();
        let local = feats.local.unwrap();
        assert_eq!(local.offsets, vec![0, 2, 3, 4]);
        assert_eq!(f(&local.data), vec![3., 4., 5., 6., 7., 8., 0., 0.]);
    }

    #[test]
    fn an_unfinished_shard_leaves_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(tmp.path(), "text|t").unwrap();
        {
            let mut w = ShardWriter::create(&store.dir, true).unwrap();
            w.push(
                &[key_of(b"x")],
                &f16_values(&tensor(&[1.0, 2.0], 1)).unwrap(),
                &f16_values(&tensor(&[1.0, 2.0], 1)).unwrap(),
                &[1],
            )
            .unwrap();
            // dropped without finish (e.g. an error later in the run)
        }
        let left: Vec<_> = std::fs::read_dir(&store.dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, vec![std::ffi::OsString::from("tower.txt")]);
    }

    #[test]
    fn side_deduplicates_keys_and_reports_failures_per_row() {
        let mut side = Side::new(None, "image|t", 4, false, None).unwrap();
        let (a, b) = (key_of(b"a"), key_of(b"b"));
        assert!(side.assign(0, a), "first sight needs encoding");
        assert!(!side.assign(1, a), "a duplicate does not");
        assert!(side.assign(2, b));
        side.fail(b, "cannot decode image".into());
        assert!(!side.assign(3, b), "a known failure is not retried");
        let out = crate::encoders::TowerOutput {
            global: tensor(&[3.0, 4.0], 1),
            local: tensor(&[0.0; 2], 1),
            mask: None,
        };
        side.record(&[a], &out, &out.local, &[]).unwrap();
        let f = side
            .finish(&Reporter::plain(crate::progress::LogFormat::Json), "images")
            .unwrap();
        assert_eq!(f.row(0), Some(&[3.0f32, 4.0][..]));
        assert_eq!(f.row(1), Some(&[3.0f32, 4.0][..]));
        assert_eq!(f.row(2), None);
        assert_eq!(f.errors[2].as_deref(), Some("cannot decode image"));
        assert_eq!(f.errors[3].as_deref(), Some("cannot decode image"));
        assert_eq!((f.computed, f.hits), (1, 0));
    }
}
