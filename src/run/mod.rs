//! The run directory and the files in it: the commit protocol of the
//! directory `fit` writes, where a run's inputs were recorded, checkpoints,
//! per-shard outputs and their completion markers, temporary names, and the
//! size-limited reading of small files.

pub mod checkpoint;
pub mod dir;
pub(crate) mod inputs;
pub(crate) mod run_json;
pub(crate) mod shards;
pub mod small_file;
pub mod temp;
