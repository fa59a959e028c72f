//! The engine: one code path from parquet rows to trained pipelines and
//! per-pair labels, shared by `fit` and `score`.
//!
//! - [`prepare`](prepare_for): rows → head inputs, in one pass over the data
//!   and one image path for every tower;
//! - [`Engine`]: a trained pipeline rebuilt from its checkpoint, which
//!   prepares, embeds and scores data, a large file a block at a time
//!   ([`Engine::score_file`]);
//! - [`fit`]: train a method and write the run directory;
//! - [`score_out`]: `score`'s outputs, one labels file or one per shard;
//! - [`join_by_position`]: which input rows `filtered.parquet` keeps.
//!
//! `fit` prepares inputs, trains, writes a checkpoint, reloads it as an
//! [`Engine`] and scores its own training pairs with [`Engine::score_rows`],
//! the same function `ncclean score` calls; it then resolves its threshold
//! rule on them and stores the cut with the checkpoint
//! ([`crate::curation::threshold::Record`]), so both agree exactly.

pub(crate) mod configure;
mod fit;
pub(crate) mod inspect;
mod join;
mod keep;
mod labels;
#[cfg(feature = "polars")]
mod polars_filter;
mod prepare;
mod score;
pub(crate) mod score_out;
mod stream;
mod trained;

pub use fit::{fit, FitOptions};
pub use join::{FingerprintCheck, Joined, LabelIndex, NO_LABEL};
pub use keep::join_by_position;
#[cfg(feature = "polars")]
pub use polars_filter::PolarsFilter;
pub use prepare::scan;
pub use trained::{Engine, LabelsSummary};
