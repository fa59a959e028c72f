//! Cutting one file's stream of pairs at given rows, so a caller can take a
//! file a stretch of rows at a time from a single read of it.

use super::PairRow;
use crate::error::Result;

/// The pair batches of one file ([`super::InputSet::pairs`] of a one-file
/// set), handed out in stretches that end at rows the caller names. A batch
/// that crosses the end of a stretch is split and its rest kept for the
/// next stretch, so no row is read twice and memory stays one batch.
pub struct RowWindows<I> {
    batches: I,
    /// Rows read but not handed out yet (the rest of a split batch).
    held: Vec<PairRow>,
    /// The stream ended or failed.
    done: bool,
}

impl<I: Iterator<Item = Result<Vec<PairRow>>>> RowWindows<I> {
    /// Stretches of `batches`, whose rows come in increasing `source_row`.
    pub fn new(batches: I) -> RowWindows<I> {
        RowWindows {
            batches,
            held: Vec::new(),
            done: false,
        }
    }

    /// The next batch of rows before file row `end`, or `None` when the
    /// stretch up to `end` is used up.
    pub fn next_before(&mut self, end: usize) -> Option<Result<Vec<PairRow>>> {
        if self.held.is_empty() {
            if self.done {
                return None;
            }
            match self.batches.next() {
                None => {
                    self.done = true;
                    return None;
                }
                Some(Err(e)) => {
                    self.done = true;
                    return Some(Err(e));
                }
                Some(Ok(rows)) => self.held = rows,
            }
        }
        let cut = self.held.partition_point(|r| r.source_row < end);
        if cut == 0 {
            return None;
        }
        let rest = self.held.split_off(cut);
        Some(Ok(std::mem::replace(&mut self.held, rest)))
    }

    /// The stretch of rows before file row `end`, as an iterator of batches.
    pub fn before(&mut self, end: usize) -> impl Iterator<Item = Result<Vec<PairRow>>> + '_ {
        std::iter::from_fn(move || self.next_before(end))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(range: std::ops::Range<usize>) -> Vec<PairRow> {
        range
            .map(|r| PairRow {
                source_file: 0,
                source_row: r,
                key: format!("k{r}"),
                image: None,
                caption: String::new(),
                text_embedding: None,
                problem: None,
            })
            .collect()
    }

    fn taken(
        w: &mut RowWindows<impl Iterator<Item = Result<Vec<PairRow>>>>,
        end: usize,
    ) -> Vec<Vec<usize>> {
        w.before(end)
            .map(|b| b.unwrap().iter().map(|r| r.source_row).collect())
            .collect()
    }

    #[test]
    fn stretches_split_batches_at_their_ends_and_lose_no_row() {
        let batches = vec![Ok(rows(0..4)), Ok(rows(4..8)), Ok(rows(8..10))];
        let mut w = RowWindows::new(batches.into_iter());
        assert_eq!(taken(&mut w, 3), [vec![0, 1, 2]]);
        assert_eq!(taken(&mut w, 3), Vec::<Vec<usize>>::new(), "used up");
        assert_eq!(taken(&mut w, 9), [vec![3], vec![4, 5, 6, 7], vec![8]]);
        assert_eq!(taken(&mut w, 100), [vec![9]]);
        assert!(w.next_before(100).is_none());
    }

    #[test]
    fn an_error_ends_the_stream() {
        let batches: Vec<Result<Vec<PairRow>>> = vec![
            Ok(rows(0..2)),
            Err(crate::error::invalid("damaged")),
            Ok(rows(2..4)),
        ];
        let mut w = RowWindows::new(batches.into_iter());
        let got: Vec<_> = w.before(10).collect();
        assert_eq!(got.len(), 2);
        assert!(got[1]
            .as_ref()
            .is_err_and(|e| e.to_string().contains("damaged")));
        assert!(w.next_before(10).is_none());
    }
}
