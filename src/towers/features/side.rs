//! Per-tower bookkeeping of one extraction run: which input row uses which
//! distinct vector, which vectors are cached and which must be encoded, and
//! the result aligned with the input rows ([`SideFeatures`]).

use std::collections::HashMap;
use std::path::PathBuf;

use candle_core::Tensor;
use half::f16;

use super::store::{f16_values, Key, ShardWriter, Store};
use crate::error::Result;
use crate::runtime::progress::Reporter;

/// Marks a row without a vector.
pub const NONE: u32 = u32::MAX;

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

/// Per-side bookkeeping while streaming.
pub(super) struct Side {
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
    pub(super) errors: Vec<Option<String>>,
    dim: usize,
    /// Seconds spent in the tower.
    pub(super) seconds: f64,
    /// Width of the local features when they are wanted.
    local_dim: Option<usize>,
    /// Local sets computed in this run, by slot.
    fresh_local: HashMap<u32, Vec<f16>>,
}

impl Side {
    /// A side for `rows` input rows of the tower `tag`, cached under `root`
    /// when given; `text` sides record tokens per caption, and `local_dim`
    /// asks for local features of that width.
    pub(super) fn new(
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
    pub(super) fn assign(&mut self, row: usize, key: Key) -> bool {
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

    /// Keep the tower output `out` (with `local` features, `lens` real
    /// tokens per caption) for `keys`, and append it to the new shard.
    pub(super) fn record(
        &mut self,
        keys: &[Key],
        out: &crate::towers::encoders::TowerOutput,
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

    /// Remember that `key` cannot be encoded, and why.
    pub(super) fn fail(&mut self, key: Key, why: String) {
        self.failed.insert(key, why);
    }

    /// Close the shard and assemble the per-row result, reading cached
    /// vectors (and local sets) from the store.
    pub(super) fn finish(mut self, rep: &Reporter, what: &str) -> Result<SideFeatures> {
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
            local,
        })
    }
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::super::store::key_of;
    use super::*;

    fn tensor(v: &[f32], rows: usize) -> Tensor {
        Tensor::from_vec(v.to_vec(), (rows, v.len() / rows), &Device::Cpu).unwrap()
    }

    #[test]
    fn local_sets_come_fresh_in_slot_order_or_from_the_cache() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, b) = (key_of(b"a"), key_of(b"b"));
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
        let f = |v: &[f16]| v.iter().map(|x| x.to_f32()).collect::<Vec<_>>();

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
        let out = crate::towers::encoders::TowerOutput {
            global: tensor(&[1.0, 1.0], 1),
            local: tensor(&[7.0, 8.0], 1),
            mask: None,
        };
        side.record(&[c], &out, &out.local, &[1]).unwrap();
        let feats = side
            .finish(
                &Reporter::plain(crate::runtime::progress::LogFormat::Json),
                "captions",
            )
            .unwrap();
        let local = feats.local.unwrap();
        assert_eq!(local.offsets, vec![0, 2, 3, 4]);
        assert_eq!(f(&local.data), vec![3., 4., 5., 6., 7., 8., 0., 0.]);
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
        let out = crate::towers::encoders::TowerOutput {
            global: tensor(&[3.0, 4.0], 1),
            local: tensor(&[0.0; 2], 1),
            mask: None,
        };
        side.record(&[a], &out, &out.local, &[]).unwrap();
        let f = side
            .finish(
                &Reporter::plain(crate::runtime::progress::LogFormat::Json),
                "images",
            )
            .unwrap();
        assert_eq!(f.row(0), Some(&[3.0f32, 4.0][..]));
        assert_eq!(f.row(1), Some(&[3.0f32, 4.0][..]));
        assert_eq!(f.row(2), None);
        assert_eq!(f.errors[2].as_deref(), Some("cannot decode image"));
        assert_eq!(f.errors[3].as_deref(), Some("cannot decode image"));
        assert_eq!(f.index[0], f.index[1], "the duplicate shares its vector");
    }
}
