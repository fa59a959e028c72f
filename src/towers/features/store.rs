//! The on-disk feature store: content keys, shards of f16 vectors, and
//! the writer that adds a shard atomically. See the module documentation of
//! [`crate::towers::features`] for the layout.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;
use candle_core::{DType, Tensor};
use half::f16;
use sha2::{Digest, Sha256};

use crate::error::Result;

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

/// The feature cache as asked for (`--cache-dir`, `--no-cache`), resolved
/// and checked when the work needs it.
#[derive(Debug, Clone, Default)]
pub struct CacheRequest {
    /// The cache directory (`None`: [`CacheOptions::default_dir`]).
    pub dir: Option<PathBuf>,
    /// No cache at all.
    pub no_cache: bool,
}

impl CacheRequest {
    /// The cache asked for. A cache path that exists as something other
    /// than a directory is refused (exit 2) before any work, instead of
    /// failing once the first feature is stored.
    pub fn resolve(&self) -> Result<CacheOptions> {
        let dir = if self.no_cache {
            None
        } else {
            self.dir.clone().or_else(CacheOptions::default_dir)
        };
        if let Some(d) = dir.as_deref().filter(|d| d.exists() && !d.is_dir()) {
            return Err(crate::error::Error::Usage(format!(
                "the feature cache {} exists and is not a directory; name a directory with \
                 --cache-dir (it is created when missing), or pass --no-cache",
                d.display()
            )));
        }
        Ok(CacheOptions { dir })
    }
}

/// The content key of `bytes` (an image file's bytes or a caption's text).
pub(super) fn key_of(bytes: &[u8]) -> Key {
    let mut k = [0u8; 16];
    k.copy_from_slice(&Sha256::digest(bytes)[..16]);
    k
}

/// One tower's store.
pub(super) struct Store {
    pub(super) dir: PathBuf,
    /// key → (shard file stem, position in shard)
    pub(super) index: HashMap<Key, (String, usize)>,
    /// Width of the global vectors, once any shard holds some.
    pub(super) dim: Option<usize>,
}

impl Store {
    /// Open (creating it if needed) the store of the tower `tag` under `root`.
    pub(super) fn open(root: &Path, tag: &str) -> Result<Store> {
        let dir = root.join(&crate::runtime::hex::sha256_hex(tag.as_bytes())[..24]);
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
            if n == 0 || !global_len.is_multiple_of(2 * n) {
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
    pub(super) fn read(&self, keys: &[Key], dim: usize) -> Result<Vec<f32>> {
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
        } else if n > 0 && bytes.is_multiple_of(n * dim * 2) {
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
    pub(super) fn read_local(&self, keys: &[Key], dim: usize) -> Result<Vec<Vec<f16>>> {
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
pub(super) struct ShardWriter {
    dir: PathBuf,
    stem: String,
    keys: BufWriter<File>,
    global: BufWriter<File>,
    local: BufWriter<File>,
    lens: Option<BufWriter<File>>,
    count: usize,
}

/// All values of `t`, flattened and rounded to f16 (the cache's precision).
pub(super) fn f16_values(t: &Tensor) -> Result<Vec<f16>> {
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
    /// Start a shard in the store directory `dir`; `text` stores also
    /// write the tokens per caption.
    pub(super) fn create(dir: &Path, text: bool) -> Result<ShardWriter> {
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
    pub(super) fn push(
        &mut self,
        keys: &[Key],
        global: &[f16],
        local: &[f16],
        lens: &[u16],
    ) -> Result<()> {
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

    /// Flush and rename the shard into place (nothing when it is empty).
    pub(super) fn finish(mut self) -> Result<()> {
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

#[cfg(test)]
mod tests {
    use candle_core::Device;

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
}
