//! Which pairs count as clean, and how well a run found them: the threshold
//! rules and the cut they resolve to, the check that a division carries a
//! statistical signal, detection metrics against ground truth and
//! cross-modal retrieval metrics, and `filter`: labels joined back to the
//! data and the kept rows written out.

pub mod division_check;
pub mod division_record;
pub(crate) mod eval;
pub(crate) mod eval_text;
pub(crate) mod filter;
pub(crate) mod filter_shards;
pub mod histogram;
pub(crate) mod metrics;
pub(crate) mod retrieval;
pub mod threshold;
