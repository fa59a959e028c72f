//! Frozen-tower features, computed once and cached on disk.
//!
//! `store` holds the on-disk format (content keys, shards, f16 encoding),
//! `side` the per-tower bookkeeping of one run (which row uses which
//! vector, what must still be encoded) and `extract` the driver
//! ([`Extraction`]) that the input's rows stream through, batch by batch,
//! into the towers and the store.
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

mod extract;
mod side;
mod store;

pub use extract::Extraction;
pub use side::{SideFeatures, NONE};
pub use store::{CacheOptions, CacheRequest};
