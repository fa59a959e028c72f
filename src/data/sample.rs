//! `fit --sample N`: the rows a fit on a large input trains on.
//!
//! The input's rows are numbered in input order across all files (the files
//! sorted as given, each file's rows in order). N distinct numbers are drawn
//! uniformly from them with Floyd's algorithm, from the seed stream
//! `fit-sample` of the run's `--seed`: the same input, N and seed give the
//! same sample, on any machine and whatever the batching. Rows are drawn,
//! not usable pairs: a drawn row that cannot be used is skipped as it would
//! be without sampling. Reading stays one streaming pass over every row, and
//! only the drawn rows are decoded and kept.

use std::collections::HashSet;

use ncclean_models::rng::Rng;
use serde::{Deserialize, Serialize};

use crate::data::{InputSet, PairRow};
use crate::error::Result;

/// Name of the seed stream the sample is drawn from.
const STREAM: &str = "fit-sample";

/// A drawn sample of an input's rows.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Drawn row numbers (input order across files), increasing.
    rows: Vec<u64>,
    /// Each file's first row number.
    offsets: Vec<u64>,
    /// Rows in the input.
    total: u64,
    seed: u64,
}

/// What the run records about its sample (`run.json`, `stats.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SampleInfo {
    /// Rows drawn.
    pub rows: usize,
    /// Rows in the input they were drawn from.
    pub of_rows: u64,
    /// The run's seed (the stream is `fit-sample` of it).
    pub seed: u64,
    /// How the rows were drawn, in words.
    pub method: String,
}

impl Sample {
    /// Draw `n` of the rows of `input` with `seed`; `None` when `n` covers
    /// every row (the whole input is the sample).
    pub fn draw(input: &InputSet, n: usize, seed: u64) -> Option<Sample> {
        let mut offsets = Vec::with_capacity(input.files.len());
        let mut total = 0u64;
        for f in &input.files {
            offsets.push(total);
            total += f.num_rows as u64;
        }
        if n as u64 >= total {
            return None;
        }
        let mut rows: Vec<u64> = floyd(total, n as u64, &mut Rng::derive(seed, STREAM))
            .into_iter()
            .collect();
        rows.sort_unstable();
        Some(Sample {
            rows,
            offsets,
            total,
            seed,
        })
    }

    /// Rows drawn.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether `row` (of file `file`) was drawn.
    pub fn contains(&self, file: usize, row: usize) -> bool {
        let Some(&offset) = self.offsets.get(file) else {
            return false;
        };
        self.rows.binary_search(&(offset + row as u64)).is_ok()
    }

    /// `batches` with only the drawn rows (empty batches dropped).
    pub fn filter<'a>(
        &'a self,
        batches: impl Iterator<Item = Result<Vec<PairRow>>> + 'a,
    ) -> impl Iterator<Item = Result<Vec<PairRow>>> + 'a {
        batches.filter_map(move |b| match b {
            Err(e) => Some(Err(e)),
            Ok(rows) => {
                let kept: Vec<PairRow> = rows
                    .into_iter()
                    .filter(|r| self.contains(r.source_file, r.source_row))
                    .collect();
                (!kept.is_empty()).then_some(Ok(kept))
            }
        })
    }

    /// What the run records.
    pub fn info(&self) -> SampleInfo {
        SampleInfo {
            rows: self.rows.len(),
            of_rows: self.total,
            seed: self.seed,
            method: format!(
                "uniform without replacement over the rows in input order (Floyd's algorithm, \
                 seed stream \"{STREAM}\" of seed {})",
                self.seed
            ),
        }
    }
}

/// `k` distinct numbers below `n`, uniformly (Floyd's algorithm: one draw
/// each, memory for the `k` drawn only).
fn floyd(n: u64, k: u64, rng: &mut Rng) -> HashSet<u64> {
    let mut out = HashSet::with_capacity(k as usize);
    for j in n - k..n {
        let t = below(rng, j + 1);
        if !out.insert(t) {
            out.insert(j);
        }
    }
    out
}

/// A uniform number below `n` (rejection keeps it unbiased for any `n`).
fn below(rng: &mut Rng, n: u64) -> u64 {
    let zone = u64::MAX - u64::MAX % n;
    loop {
        let x = rng.next_u64();
        if x < zone {
            return x % n;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::testutil::test_input;

    #[test]
    fn a_sample_is_distinct_sorted_seeded_and_spans_the_files() {
        let input = test_input(&[300, 700]);
        let s = Sample::draw(&input, 100, 7).unwrap();
        assert_eq!(s.len(), 100);
        assert!(s.rows.windows(2).all(|w| w[0] < w[1]));
        assert!(s.rows.iter().all(|&r| r < 1000));
        assert_eq!(Sample::draw(&input, 100, 7), Some(s.clone()));
        assert_ne!(Sample::draw(&input, 100, 8).unwrap().rows, s.rows);
        // Both files are drawn from, about in proportion (30 of 100 expected
        // from the first; 5 standard deviations is about 23).
        let first = s.rows.iter().filter(|&&r| r < 300).count();
        assert!((7..=53).contains(&first), "{first}");
        // Row numbers map back to (file, row).
        let r = s.rows.iter().copied().find(|&r| r >= 300).unwrap();
        assert!(s.contains(1, (r - 300) as usize));
        for row in 0..300 {
            assert_eq!(s.contains(0, row), s.rows.contains(&(row as u64)));
        }
        assert!(!s.contains(2, 0));
        // All rows or more: no sample.
        assert_eq!(Sample::draw(&input, 1000, 7), None);
    }

    #[test]
    fn floyd_draws_every_subset_equally_often() {
        // 2 of 4: 6 subsets, each 1/6 of 6,000 draws = 1,000 (sd ≈ 29).
        let mut rng = Rng::new(1);
        let mut counts = std::collections::BTreeMap::new();
        for _ in 0..6000 {
            let mut s: Vec<u64> = floyd(4, 2, &mut rng).into_iter().collect();
            s.sort_unstable();
            *counts.entry(s).or_insert(0) += 1;
        }
        assert_eq!(counts.len(), 6);
        for (s, c) in counts {
            assert!((850..=1150).contains(&c), "{s:?}: {c}");
        }
    }

    #[test]
    fn filtering_keeps_exactly_the_drawn_rows() {
        let input = test_input(&[5, 5]);
        let s = Sample::draw(&input, 4, 3).unwrap();
        let row = |f: usize, r: usize| PairRow {
            source_file: f,
            source_row: r,
            key: format!("{f}:{r}"),
            image: None,
            caption: String::new(),
            text_embedding: None,
            problem: None,
        };
        let batches: Vec<Result<Vec<PairRow>>> = vec![
            Ok((0..5).map(|r| row(0, r)).collect()),
            Ok((0..5).map(|r| row(1, r)).collect()),
        ];
        let kept: Vec<u64> = s
            .filter(batches.into_iter())
            .flat_map(|b| b.unwrap())
            .map(|r| r.source_file as u64 * 5 + r.source_row as u64)
            .collect();
        assert_eq!(kept, s.rows);
    }
}
