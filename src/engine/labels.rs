//! Label rows of a scored input, and the hash that names a configuration.

use ncclean_pipelines::{PairScores, TrainConfig};

use super::prepare::Prepared;
use crate::curation::threshold::{Bound, Ranked};
use crate::data::{InputSet, LabelRow, RowStatus};

/// Label rows for every input row: scores for usable pairs, `skipped` with
/// the reason for the rest; `is_clean` is whether `bound` keeps the pair
/// (the cut of [`crate::curation::threshold`]).
pub(super) fn label_rows(
    input: &InputSet,
    prepared: &Prepared,
    scores: &PairScores,
    bound: Bound,
) -> Vec<LabelRow> {
    let mut out: Vec<LabelRow> = prepared
        .rows
        .iter()
        .map(|r| LabelRow {
            key: r.key.clone(),
            source_file: input.display_name(r.file),
            source_row: r.row as u64,
            clean_prob: None,
            soft_label: None,
            similarity: None,
            is_clean: false,
            status: RowStatus::Skipped,
            error: r.error.clone(),
        })
        .collect();
    for (k, &i) in prepared.ok.iter().enumerate() {
        let row = &mut out[i];
        let p = scores.clean_prob.get(k).copied();
        let sim = scores.similarity.get(k).copied();
        row.clean_prob = p;
        row.soft_label = scores.soft_label.get(k).copied();
        row.similarity = sim;
        row.is_clean = p.is_some_and(|p| bound.keeps(&Ranked::new(p, sim)));
        row.status = RowStatus::Ok;
    }
    out
}

/// Short hash of the resolved configuration.
pub fn config_hash(cfg: &TrainConfig) -> String {
    let s = serde_json::to_string(cfg).unwrap_or_default();
    crate::runtime::hex::sha256_hex(s.as_bytes())[..16].to_string()
}

#[cfg(test)]
mod tests {
    use ncclean_models::{ImageInputs, PairInputs, TextInputs};

    use super::*;
    use crate::data::testutil::test_input;
    use crate::engine::prepare::RowRecord;

    fn record(key: &str, row: usize, error: Option<&str>) -> RowRecord {
        RowRecord {
            key: key.into(),
            file: 0,
            row,
            error: error.map(str::to_string),
        }
    }

    #[test]
    fn usable_rows_get_scores_and_the_rest_their_reason() {
        let input = test_input(&[3]);
        let prepared = Prepared {
            rows: vec![
                record("a", 0, None),
                record("b", 1, Some("cannot decode image")),
                record("c", 2, None),
            ],
            ok: vec![0, 2],
            inputs: PairInputs {
                images: ImageInputs::Embeddings {
                    data: vec![0.0; 2],
                    dim: 1,
                    local: None,
                },
                texts: TextInputs::Tokens(vec![vec![1], vec![2]]),
            },
            image_ids: vec![7, 8],
        };
        let scores = PairScores {
            clean_prob: vec![0.9, 0.5],
            soft_label: vec![0.8, 0.4],
            similarity: vec![0.3, -0.1],
            ..PairScores::default()
        };
        let rows = label_rows(&input, &prepared, &scores, Bound::at(0.5));
        assert_eq!(rows.len(), 3);
        let keys: Vec<&str> = rows.iter().map(|r| r.key.as_str()).collect();
        assert_eq!(keys, ["a", "b", "c"]);
        assert_eq!(rows[0].status, RowStatus::Ok);
        assert_eq!(rows[0].clean_prob, Some(0.9));
        assert_eq!(rows[0].soft_label, Some(0.8));
        assert_eq!(rows[0].similarity, Some(0.3));
        assert!(rows[0].is_clean);
        assert_eq!(rows[1].status, RowStatus::Skipped);
        assert_eq!(rows[1].clean_prob, None);
        assert_eq!(rows[1].error.as_deref(), Some("cannot decode image"));
        assert!(!rows[1].is_clean);
        // The cut keeps its own value: exactly 0.5 is clean at 0.5 (the
        // strict `>` of earlier versions called it noisy) and not above.
        assert_eq!(rows[2].clean_prob, Some(0.5));
        assert!(rows[2].is_clean);
        assert!(!label_rows(&input, &prepared, &scores, Bound::at(0.50001))[2].is_clean);
        // Inside a tie, the similarity decides: c (-0.1) is below -0.05.
        let split = Bound {
            min_prob: 0.5,
            min_similarity: Some(-0.05),
        };
        let rows = label_rows(&input, &prepared, &scores, split);
        assert!(rows[0].is_clean && !rows[2].is_clean);
        assert!(rows.iter().all(|r| r.source_file == "data/train.parquet"));
        assert_eq!(rows[2].source_row, 2);
    }

    #[test]
    fn config_hash_is_short_stable_and_follows_the_config() {
        let none = toml::Table::new();
        let cfg = ncclean_pipelines::presets::resolve("vanilla", None, &none).unwrap();
        let h = config_hash(&cfg);
        assert_eq!(h.len(), 16);
        assert!(h.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(h, config_hash(&cfg.clone()));
        let mut other = cfg.clone();
        other.threshold += 0.1;
        assert_ne!(h, config_hash(&other));
    }
}
