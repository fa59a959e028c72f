//! The engine: one code path from parquet rows to trained pipelines and
//! per-pair labels, shared by `fit` and `score`.
//!
//! - [`prepare`](prepare_for): rows → head inputs, in one pass over the data
//!   and one image path for every tower;
//! - [`Engine`]: a trained pipeline rebuilt from its checkpoint, which
//!   prepares, embeds and scores data, a large file a block at a time
//!   ([`Engine::score_file`]);
//! - [`fit`]: train a method and write the run directory;
//! - [`join_by_position`]: which input rows `filtered.parquet` keeps.
//!
//! `fit` prepares inputs, trains, writes a checkpoint, reloads it as an
//! [`Engine`] and scores its own training pairs with [`Engine::score_rows`],
//! the same function `ncclean score` calls; it then resolves its threshold
//! rule on them and stores the cut with the checkpoint
//! ([`crate::curation::threshold::Record`]), so both agree exactly.

#[cfg(test)]
use crate::data::InputSet;

mod fit;
mod join;
mod keep;
mod labels;
#[cfg(feature = "polars")]
mod polars_filter;
mod prepare;
mod stream;
mod trained;

pub use fit::{fit, FitOptions};
pub use join::{FingerprintCheck, Joined, LabelIndex, NO_LABEL};
pub use keep::join_by_position;
#[cfg(feature = "polars")]
pub use polars_filter::PolarsFilter;
pub use prepare::{scan, READ_BATCH_ROWS};
pub use trained::{Engine, LabelsSummary};

/// An input set of files `data/train.parquet`, `data/part-1.parquet`, … with
/// `rows[i]` rows each, for tests that need names and row counts only.
#[cfg(test)]
pub(crate) fn test_input(rows: &[usize]) -> InputSet {
    use crate::data::{ColumnMap, ImageKind, InputFile};
    let files = rows
        .iter()
        .enumerate()
        .map(|(i, &n)| InputFile {
            path: if i == 0 {
                "data/train.parquet".into()
            } else {
                format!("data/part-{i}.parquet").into()
            },
            num_rows: n,
            schema: std::sync::Arc::new(arrow_schema::Schema::empty()),
            format: crate::data::FileFormat::Parquet,
        })
        .collect();
    InputSet {
        files,
        columns: ColumnMap {
            image: "image".into(),
            image_kind: ImageKind::Bytes,
            caption: "caption".into(),
            key: None,
            text_embedding: None,
        },
        image_root: None,
        image_limits: Default::default(),
        embedding_dim: None,
        text_embedding_dim: None,
        fingerprint: Default::default(),
    }
}
