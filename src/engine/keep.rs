//! The keep mask: which input rows `filtered.parquet` keeps, from label
//! rows matched back to the input files.

use std::path::Path;

use super::join::{Joined, NO_LABEL};
use crate::data::{InputSet, LabelRow};
use crate::error::{invalid, Result};

/// The file name of a path as written in labels.
fn base(s: &str) -> String {
    Path::new(s)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// `keep[file][row]` = `pred(label)` for each input row, with each row's
/// label index. Labels are matched to input files by their `source_file`
/// (as written, or by file name) and row: for labels just made from
/// `input` itself (`fit`), where position is identity. Data that may have
/// changed since is joined by key ([`super::LabelIndex`]). With
/// `every_row` the labels must cover every row of `input`; without (a fit
/// on a sample), rows without a label are not kept.
pub fn join_by_position(
    input: &InputSet,
    labels: &[LabelRow],
    pred: impl Fn(&LabelRow) -> bool,
    every_row: bool,
) -> Result<Joined> {
    let mut keep: Vec<Vec<bool>> = input
        .files
        .iter()
        .map(|f| vec![false; f.num_rows])
        .collect();
    let mut label_of: Vec<Vec<u32>> = input
        .files
        .iter()
        .map(|f| vec![NO_LABEL; f.num_rows])
        .collect();
    let names: Vec<String> = (0..input.files.len())
        .map(|f| input.display_name(f))
        .collect();
    let mut seen = vec![0usize; input.files.len()];
    for (i, l) in labels.iter().enumerate() {
        let f = names
            .iter()
            .position(|n| *n == l.source_file)
            .or_else(|| names.iter().position(|n| base(n) == base(&l.source_file)))
            .ok_or_else(|| {
                invalid(format!(
                    "labels refer to {:?}, which is not among the input files ({}); pass the data the labels were made from",
                    l.source_file,
                    names.join(", ")
                ))
            })?;
        let row = l.source_row as usize;
        let slot = keep[f].get_mut(row).ok_or_else(|| {
            invalid(format!(
                "labels refer to row {row} of {}, which has only {} rows; were the labels made from this data?",
                names[f],
                input.files[f].num_rows
            ))
        })?;
        *slot = pred(l);
        if let Some(o) = label_of[f].get_mut(row) {
            *o = u32::try_from(i).unwrap_or(NO_LABEL);
        }
        seen[f] += 1;
    }
    for (f, n) in seen.iter().enumerate() {
        if every_row && *n != input.files[f].num_rows {
            return Err(invalid(format!(
                "labels cover {n} of the {} rows of {}; were they made from this data?",
                input.files[f].num_rows, names[f]
            )));
        }
    }
    Ok(Joined {
        keep,
        label_of,
        unmatched: 0,
        unmatched_examples: Vec::new(),
        positional: labels.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::testutil::test_input;
    use crate::data::RowStatus;

    /// `keep[file][row]` = `pred(label)`, every row labelled.
    fn keep_mask_by(
        input: &InputSet,
        labels: &[LabelRow],
        pred: impl Fn(&LabelRow) -> bool,
    ) -> Result<Vec<Vec<bool>>> {
        Ok(join_by_position(input, labels, pred, true)?.keep)
    }

    /// `keep[file][row]` from the labels' `is_clean`.
    fn keep_mask(input: &InputSet, labels: &[LabelRow]) -> Result<Vec<Vec<bool>>> {
        keep_mask_by(input, labels, |l| l.is_clean)
    }

    fn label(file: &str, row: u64, clean: bool) -> LabelRow {
        LabelRow {
            key: format!("{file}:{row}"),
            source_file: file.into(),
            source_row: row,
            clean_prob: None,
            soft_label: None,
            similarity: None,
            is_clean: clean,
            status: RowStatus::Ok,
            error: None,
        }
    }

    #[test]
    fn rows_are_matched_by_file_and_row_in_any_order() {
        let input = test_input(&[2, 1]);
        let labels = [
            label("part-1.parquet", 0, true),
            label("train.parquet", 1, true),
            label("train.parquet", 0, false),
        ];
        assert_eq!(
            keep_mask(&input, &labels).unwrap(),
            vec![vec![false, true], vec![true]]
        );
        let all = keep_mask_by(&input, &labels, |_| true).unwrap();
        assert_eq!(all, vec![vec![true, true], vec![true]]);
    }

    #[test]
    fn labels_written_elsewhere_match_by_file_name() {
        let input = test_input(&[1]);
        let labels = [label("/elsewhere/train.parquet", 0, true)];
        assert_eq!(keep_mask(&input, &labels).unwrap(), vec![vec![true]]);
    }

    #[test]
    fn labels_of_other_data_are_refused_with_the_reason() {
        let input = test_input(&[2]);
        let e = keep_mask(&input, &[label("other.parquet", 0, true)])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"other.parquet\", which is not among the input files"),
            "{e}"
        );
        let e = keep_mask(&input, &[label("train.parquet", 5, true)])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("row 5 of data/train.parquet, which has only 2 rows"),
            "{e}"
        );
        let e = keep_mask(&input, &[label("train.parquet", 0, true)])
            .unwrap_err()
            .to_string();
        assert!(e.contains("labels cover 1 of the 2 rows"), "{e}");
    }
}
