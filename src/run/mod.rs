//! The run directory and the files in it: the commit protocol of the
//! directory `fit` writes, run.json and where a run's inputs were recorded,
//! checkpoints (with the threshold record), and per-shard outputs with their
//! completion markers.

pub mod checkpoint;
pub mod dir;
pub(crate) mod inputs;
pub(crate) mod run_json;
pub(crate) mod shards;
