//! Labels joined back to the data by key: which rows `filter` keeps, and
//! which label each row carries, whatever the files' names, order or
//! sharding.
//!
//! The join is a hash map of the labels' keys probed by the data's keys,
//! read on their own; the rows themselves are then streamed by the
//! arrow-rs writer that already reads around damaged row groups, invalid
//! UTF-8 and tar shards, or (`filter --engine polars`, the optional
//! `polars` feature) by a polars query, see [`super::PolarsFilter`]. Either
//! way this join decides: it checks keys and names the problems, so both
//! engines keep the same rows and refuse the same inputs.

use std::collections::HashMap;

use crate::data::{for_each_key, positional_key, InputSet, LabelRow};
use crate::error::{invalid, Result};

/// Examples a message lists.
const EXAMPLES: usize = 5;

/// No label for this row (in [`Joined::label_of`]).
pub const NO_LABEL: u32 = u32::MAX;

/// Labels matched to the rows of an input.
#[derive(Debug, Clone, PartialEq)]
pub struct Joined {
    /// `keep[file][row]`: the rule's decision for the row's label.
    pub keep: Vec<Vec<bool>>,
    /// `label_of[file][row]`: the index of the row's label, [`NO_LABEL`]
    /// for none (only when the join was told to allow rows without one).
    pub label_of: Vec<Vec<u32>>,
    /// Labelled keys not found in the input (a subset of the data, or one
    /// shard of many).
    pub unmatched: usize,
    /// Some of them, for messages.
    pub unmatched_examples: Vec<String>,
    /// Rows matched through their positional key `<file stem>:<row>` (no
    /// key column, or a null or unreadable key).
    pub positional: usize,
}

/// Whether a row may be matched by its position (`<file stem>:<row>`):
/// only when the input is known to be the bytes the labels were made from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Positional {
    /// The input's fingerprint equals the labels'.
    Allowed,
    /// The input is other bytes (resharded, rewritten or other data): a
    /// position there names another sample.
    Refused,
}

/// The labels by key, built once for any number of joins (one per shard).
/// Memory: the labels themselves plus about 32 bytes per key for the hash
/// table (a string reference and an index).
pub struct LabelIndex<'a> {
    labels: &'a [LabelRow],
    by_key: HashMap<&'a str, u32>,
}

impl<'a> LabelIndex<'a> {
    /// Index `labels` by key. Duplicate keys are
    /// [`crate::Error::InvalidInput`] with their count and examples: a row
    /// could not be told which label is its own.
    pub fn new(labels: &'a [LabelRow]) -> Result<LabelIndex<'a>> {
        if labels.len() >= NO_LABEL as usize {
            return Err(invalid(format!(
                "{} label rows: more than this version can join ({})",
                labels.len(),
                NO_LABEL - 1
            )));
        }
        let mut by_key: HashMap<&str, u32> = HashMap::with_capacity(labels.len());
        let mut dup_rows = 0usize;
        let mut examples: Vec<&str> = Vec::new();
        for (i, l) in labels.iter().enumerate() {
            if by_key.insert(l.key.as_str(), i as u32).is_some() {
                dup_rows += 1;
                if examples.len() < EXAMPLES && !examples.contains(&l.key.as_str()) {
                    examples.push(&l.key);
                }
            }
        }
        if dup_rows > 0 {
            return Err(invalid(format!(
                "the labels hold {} rows but only {} distinct keys (e.g. {}): rows cannot be matched to their labels by key. \
                 Give the data unique keys (--key-col naming a unique column, or none for <file stem>:<row>) and score it again",
                labels.len(),
                by_key.len(),
                quoted(&examples)
            )));
        }
        Ok(LabelIndex { labels, by_key })
    }

    /// The labels indexed.
    pub fn labels(&self) -> &'a [LabelRow] {
        self.labels
    }

    /// Match every row of `input` to its label by key (a row without a key
    /// of its own by `<file stem>:<row>`, as `score` keyed it, when
    /// `positional` allows), with `keep = pred(label)`. Reads only the keys
    /// (see [`for_each_key`]).
    ///
    /// A row without a label, or two rows with one key, is
    /// [`crate::Error::InvalidInput`] with the count, examples and what to
    /// do; labels without a row are counted in [`Joined::unmatched`].
    pub fn join(
        &self,
        input: &InputSet,
        positional: Positional,
        pred: impl Fn(&LabelRow) -> bool,
    ) -> Result<Joined> {
        let mut used = vec![false; self.labels.len()];
        let mut keep = Vec::with_capacity(input.files.len());
        let mut label_of = Vec::with_capacity(input.files.len());
        let (mut missing, mut missing_examples) = (0usize, Vec::new());
        let (mut refused, mut refused_examples) = (0usize, Vec::new());
        let (mut dups, mut dup_examples) = (0usize, Vec::new());
        let mut by_position = 0usize;
        for (f, file) in input.files.iter().enumerate() {
            let mut k = vec![false; file.num_rows];
            let mut of = vec![NO_LABEL; file.num_rows];
            for_each_key(input, f, |first, keys| {
                for (i, key) in keys.into_iter().enumerate() {
                    let row = first + i;
                    let own = key.as_deref().and_then(|k| self.by_key.get(k).copied());
                    let place = positional_key(&file.path, row);
                    let found = match own {
                        Some(idx) => Some(idx),
                        None => match self.by_key.get(place.as_str()).copied() {
                            Some(idx) if positional == Positional::Allowed => {
                                by_position += 1;
                                Some(idx)
                            }
                            Some(_) => {
                                refused += 1;
                                if refused_examples.len() < EXAMPLES {
                                    refused_examples.push(place.clone());
                                }
                                None
                            }
                            None => None,
                        },
                    };
                    let Some(idx) = found else {
                        missing += 1;
                        if missing_examples.len() < EXAMPLES {
                            missing_examples.push(key.unwrap_or(place));
                        }
                        continue;
                    };
                    let label = &self.labels[idx as usize];
                    if std::mem::replace(&mut used[idx as usize], true) {
                        dups += 1;
                        if dup_examples.len() < EXAMPLES {
                            dup_examples.push(label.key.clone());
                        }
                        continue;
                    }
                    if let (Some(kk), Some(o)) = (k.get_mut(row), of.get_mut(row)) {
                        *kk = pred(label);
                        *o = idx;
                    }
                }
                Ok(())
            })?;
            keep.push(k);
            label_of.push(of);
        }
        if dups > 0 {
            return Err(invalid(format!(
                "{dups} input rows repeat a key another row has (e.g. {}): each row must have its own key for labels to be joined back. \
                 Give the data unique keys (--key-col naming a unique column) and score it again",
                quoted(&dup_examples)
            )));
        }
        if refused > 0 {
            return Err(invalid(format!(
                "{refused} rows have no key of their own (e.g. {}), so they can only be matched by position, \
                 and the input is not the data the labels were made from (its fingerprint differs): \
                 a position there may hold another sample. Filter the data the labels were made from, \
                 or give the data a key column (--key-col) and score it again",
                quoted(&refused_examples)
            )));
        }
        if missing > 0 {
            return Err(invalid(format!(
                "{missing} of the {} input rows have no label (e.g. keys {}): the labels were made from other data. \
                 Score this data first (ncclean score ... --out LABELS), or give the labels made from it",
                input.num_rows(),
                quoted(&missing_examples)
            )));
        }
        let unmatched_examples: Vec<String> = self
            .labels
            .iter()
            .zip(&used)
            .filter(|(_, u)| !**u)
            .take(EXAMPLES)
            .map(|(l, _)| l.key.clone())
            .collect();
        Ok(Joined {
            keep,
            label_of,
            unmatched: used.iter().filter(|u| !**u).count(),
            unmatched_examples,
            positional: by_position,
        })
    }
}

/// Whether the input is the bytes the labels were made from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FingerprintCheck {
    /// Same content fingerprint: positions are as trustworthy as keys.
    Same,
    /// Other bytes: resharded, rewritten, or other data. Keys still join.
    Differs,
    /// Cannot be checked, and why.
    Unknown(String),
}

impl FingerprintCheck {
    /// Compare `input` with the labels' `ncclean.input_fingerprint`
    /// (reads every input byte, as `score` did to make it).
    pub fn of(
        input: &InputSet,
        labels_metadata: &std::collections::BTreeMap<String, String>,
    ) -> Result<FingerprintCheck> {
        Ok(match labels_metadata.get("ncclean.input_fingerprint") {
            None => FingerprintCheck::Unknown(
                "the labels carry no input fingerprint (not written by ncclean fit or score)"
                    .into(),
            ),
            Some(f) if *f == input.fingerprint()? => FingerprintCheck::Same,
            Some(_) => FingerprintCheck::Differs,
        })
    }

    /// Whether rows may be matched by position under this check.
    pub fn positional(&self) -> Positional {
        match self {
            FingerprintCheck::Differs => Positional::Refused,
            _ => Positional::Allowed,
        }
    }

    /// Short form for the output's metadata.
    pub fn tag(&self) -> &'static str {
        match self {
            FingerprintCheck::Same => "same",
            FingerprintCheck::Differs => "differs",
            FingerprintCheck::Unknown(_) => "unknown",
        }
    }
}

/// How users read the check in the log.
impl std::fmt::Display for FingerprintCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FingerprintCheck::Same => write!(
                f,
                "input fingerprint verified: the data is the bytes the labels were made from"
            ),
            FingerprintCheck::Differs => write!(
                f,
                "the input's fingerprint differs from the labels' (not the same bytes: resharded, rewritten or other data); rows are matched by key only"
            ),
            FingerprintCheck::Unknown(why) => {
                write!(f, "input fingerprint not checked: {why}; rows are matched by key")
            }
        }
    }
}

/// `"a", "b"` for messages.
pub(crate) fn quoted<S: AsRef<str>>(keys: &[S]) -> String {
    keys.iter()
        .map(|k| format!("\"{}\"", k.as_ref()))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::testutil::test_input;
    use crate::data::RowStatus;

    fn label(key: &str, clean: bool) -> LabelRow {
        LabelRow {
            key: key.into(),
            source_file: "elsewhere.parquet".into(),
            source_row: 99,
            clean_prob: Some(if clean { 0.9 } else { 0.1 }),
            soft_label: None,
            similarity: None,
            is_clean: clean,
            status: RowStatus::Ok,
            error: None,
        }
    }

    #[test]
    fn positional_keys_match_in_any_order_whatever_source_file_says() {
        // test_input has no key column: rows are keyed train:<row> and part-1:<row>.
        let input = test_input(&[2, 1]);
        let labels = [
            label("part-1:0", true),
            label("train:1", true),
            label("train:0", false),
        ];
        let index = LabelIndex::new(&labels).unwrap();
        let j = index
            .join(&input, Positional::Allowed, |l| l.is_clean)
            .unwrap();
        assert_eq!(j.keep, vec![vec![false, true], vec![true]]);
        assert_eq!(j.label_of, vec![vec![2, 1], vec![0]]);
        assert_eq!((j.unmatched, j.positional), (0, 3));
    }

    #[test]
    fn positional_matches_are_refused_on_other_bytes() {
        let input = test_input(&[1]);
        let labels = [label("train:0", true)];
        let e = LabelIndex::new(&labels)
            .unwrap()
            .join(&input, Positional::Refused, |l| l.is_clean)
            .unwrap_err();
        assert_eq!(e.exit_code(), 3);
        assert!(
            e.to_string()
                .contains("1 rows have no key of their own (e.g. \"train:0\")"),
            "{e}"
        );
    }

    #[test]
    fn missing_rows_and_extra_labels() {
        let input = test_input(&[2]);
        let labels = [label("train:0", true), label("other:5", true)];
        let index = LabelIndex::new(&labels).unwrap();
        let e = index
            .join(&input, Positional::Allowed, |l| l.is_clean)
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("1 of the 2 input rows have no label (e.g. keys \"train:1\")"),
            "{e}"
        );
        let one = test_input(&[1]);
        let j = index.join(&one, Positional::Allowed, |_| true).unwrap();
        assert_eq!(
            (j.unmatched, j.unmatched_examples.clone()),
            (1, vec!["other:5".to_string()])
        );
    }

    #[test]
    fn duplicate_label_keys_are_refused_with_counts() {
        let labels: Vec<LabelRow> = (0..10)
            .map(|i| label(&format!("k{}", i % 3), true))
            .collect();
        let e = LabelIndex::new(&labels).err().unwrap();
        assert_eq!(e.exit_code(), 3);
        assert!(
            e.to_string().contains(
                "the labels hold 10 rows but only 3 distinct keys (e.g. \"k0\", \"k1\", \"k2\")"
            ),
            "{e}"
        );
    }
}
