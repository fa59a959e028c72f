//! Scoring one input file a block at a time, in memory bounded by one
//! scoring block whatever the file's size.
//!
//! Scoring statistics are local to blocks of a file's usable pairs
//! ([`ScoreBlocks`]), and a file's blocks follow from its number of usable
//! pairs. A file of at most one block's rows is one block: it is prepared
//! and scored in one pass, as before streaming existed. A larger file is
//! read twice: a first pass finds which rows are usable (one bit a row;
//! frozen towers encode into the feature cache meanwhile), which places
//! every block's rows; the second pass prepares the rows of one block,
//! scores it as that block of the file ([`ScoreBlocks::part`]), hands its
//! labels to the caller and lets go of it. The labels are those of scoring
//! the file whole, bit for bit. A file's first block is also checked
//! against random pairings of its own images and captions
//! ([`Engine::signal_warning`]): a file unlike the training data, or far
//! noisier or cleaner, is said to be.

use std::time::Instant;

use ncclean_pipelines::scoring::{ScoreBlock, ScoreBlocks, SCORE_BLOCK_PAIRS};
use ncclean_pipelines::PairScores;

use super::labels::label_rows;
use super::prepare::{Prepared, Preparer};
use super::trained::Engine;
use crate::data::READ_BATCH_ROWS;
use crate::data::{InputSet, LabelRow, RowWindows};
use crate::error::{invalid, Result};
use crate::runtime::progress::Reporter;
use crate::towers::features::CacheOptions;

/// The labels of one block of a file, in row order, with its counts.
#[derive(Debug, Clone)]
pub struct BlockLabels {
    /// One label row per input row of the block's stretch of the file.
    pub labels: Vec<LabelRow>,
    /// Usable pairs scored.
    pub pairs: usize,
    /// Usable pairs called noisy: the block's estimated noise (the sum of
    /// `1 - clean_prob`), rounded.
    pub noisy: usize,
    /// The engine's cut over the block's pairs (merged over blocks and
    /// files into the whole input's).
    pub tally: crate::curation::threshold::Tally,
    /// Seconds in the model's scoring pass.
    pub seconds: f64,
    /// What a check against random pairings of the file's first block says
    /// of its cut ([`Engine::signal_warning`]); `None` on later blocks.
    pub warning: Option<String>,
}

/// Which rows of a file are usable pairs: one bit a row.
struct Usable {
    words: Vec<u64>,
}

impl Usable {
    fn new(rows: usize) -> Usable {
        Usable {
            words: vec![0; rows.div_ceil(64)],
        }
    }

    fn set(&mut self, row: usize) {
        if let Some(w) = self.words.get_mut(row / 64) {
            *w |= 1 << (row % 64);
        }
    }

    fn count(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// The row of the `k`-th usable pair (0-based), if there are that many.
    fn row_of(&self, k: usize) -> Option<usize> {
        let mut left = k;
        for (i, &w) in self.words.iter().enumerate() {
            let ones = w.count_ones() as usize;
            if left < ones {
                let mut w = w;
                for _ in 0..left {
                    w &= w - 1;
                }
                return Some(i * 64 + w.trailing_zeros() as usize);
            }
            left -= ones;
        }
        None
    }
}

/// Where each block's stretch of rows ends: block `j` takes the rows from
/// the end of block `j - 1` up to its last usable pair's successor, the last
/// block every remaining row.
fn stretch_ends(blocks: &ScoreBlocks, usable: &Usable, rows: usize) -> Vec<usize> {
    let n = blocks.blocks().len();
    blocks
        .blocks()
        .iter()
        .enumerate()
        .map(|(j, b)| {
            if j + 1 == n {
                rows
            } else {
                usable.row_of(b.start + b.len).unwrap_or(rows)
            }
        })
        .collect()
}

impl Engine {
    /// Score the one file of `input` block by block, handing each block's
    /// labels to `sink` in row order (see the module documentation). The
    /// trained mixture is used (streaming cannot refit it).
    pub fn score_file(
        &self,
        input: &InputSet,
        cache: &CacheOptions,
        rep: &Reporter,
        mut sink: impl FnMut(BlockLabels) -> Result<()>,
    ) -> Result<()> {
        if input.files.len() != 1 {
            return Err(
                anyhow::anyhow!("score_file takes one file, not {}", input.files.len()).into(),
            );
        }
        let preparer = self.preparer(input, cache)?;
        let rows = input.num_rows();
        let size = SCORE_BLOCK_PAIRS.max(self.state.config.batch_size);
        let vocab = self.state.vocab.as_ref();
        if rows <= size {
            let run = preparer.prepare(input.pairs(READ_BATCH_ROWS), rows, vocab, rep)?;
            self.check_features(input, &run)?;
            let n = run.prepared.ok.len();
            let block = ScoreBlock {
                start: 0,
                len: n,
                index: 0,
            };
            return sink(self.score_block(input, &run.prepared, block, rep)?);
        }
        // First pass: which rows are usable, a block's worth of rows at a time.
        let mut usable = Usable::new(rows);
        let mut windows = RowWindows::new(input.pairs(READ_BATCH_ROWS));
        let mut start = 0;
        while start < rows {
            let end = (start + size).min(rows);
            let ok = preparer.usable(windows.before(end), end - start, rep)?;
            for (i, _) in ok.iter().enumerate().filter(|(_, ok)| **ok) {
                usable.set(start + i);
            }
            start = end;
        }
        let n = usable.count();
        let blocks = ScoreBlocks::new(&[n], self.state.config.batch_size);
        if blocks.blocks().is_empty() {
            // No usable pair: the rows are labelled skipped, a stretch at a time.
            let mut windows = RowWindows::new(input.pairs(READ_BATCH_ROWS));
            let mut start = 0;
            while start < rows {
                let end = (start + size).min(rows);
                let run = preparer.prepare(windows.before(end), end - start, vocab, rep)?;
                self.check_features(input, &run)?;
                let block = ScoreBlock {
                    start: 0,
                    len: run.prepared.ok.len(),
                    index: 0,
                };
                sink(self.score_block(input, &run.prepared, block, rep)?)?;
                start = end;
            }
            return Ok(());
        }
        // Second pass: each block's rows, prepared, scored and handed on.
        let ends = stretch_ends(&blocks, &usable, rows);
        drop(usable);
        let mut windows = RowWindows::new(input.pairs(READ_BATCH_ROWS));
        let mut start = 0;
        for (b, &end) in blocks.blocks().iter().zip(&ends) {
            crate::runtime::interrupt::check()?;
            let run = preparer.prepare(windows.before(end), end - start, vocab, rep)?;
            self.check_features(input, &run)?;
            if run.prepared.ok.len() != b.len || run.prepared.rows.len() != end - start {
                return Err(invalid(format!(
                    "{}: rows {start}-{} held {} usable pairs when read again, {} the first time; \
                     was the file changed while it was scored? Score it again",
                    input.display_name(0),
                    end.saturating_sub(1),
                    run.prepared.ok.len(),
                    b.len
                )));
            }
            sink(self.score_block(input, &run.prepared, *b, rep)?)?;
            start = end;
        }
        Ok(())
    }

    /// Score the prepared pairs of one block (`block.len` of them) as block
    /// `block.index` of its file.
    fn score_block(
        &self,
        input: &InputSet,
        prepared: &Prepared,
        block: ScoreBlock,
        rep: &Reporter,
    ) -> Result<BlockLabels> {
        let started = Instant::now();
        let scores = if prepared.ok.is_empty() {
            PairScores::default()
        } else {
            let mut obs = rep.observer();
            self.pipeline()
                .score_blocks(&prepared.inputs, &ScoreBlocks::part(block), &mut obs)
                .map_err(|e| self.scoring_error(e))?
        };
        let seconds = started.elapsed().as_secs_f64();
        let bound = self.cut().bound();
        let labels = label_rows(input, prepared, &scores, bound);
        let mut tally = crate::curation::threshold::Tally::default();
        let pairs =
            crate::curation::threshold::Ranked::pairs(&scores.clean_prob, &scores.similarity);
        tally.add(&pairs, bound);
        let pairs = prepared.ok.len();
        let noise = crate::curation::threshold::estimated_noise_rate(&scores.clean_prob);
        // One check a file, on its first block (a file's blocks are alike).
        let warning = if block.index == 0 {
            let all: Vec<usize> = (0..pairs).collect();
            let name = input.display_name(0);
            self.signal_warning(&name, &prepared.inputs, &all, &tally)?
        } else {
            None
        };
        Ok(BlockLabels {
            labels,
            pairs,
            noisy: (noise * pairs as f64).round() as usize,
            tally,
            seconds,
            warning,
        })
    }

    /// The towers and image path of this checkpoint, for `input`.
    fn preparer<'a>(
        &'a self,
        input: &'a InputSet,
        cache: &'a CacheOptions,
    ) -> Result<Preparer<'a>> {
        self.check_input(input)?;
        Preparer::new(
            input,
            &self.state.encoders,
            &self.state.config,
            self.state.model.head.local,
            cache,
            self.device(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kth_usable_row_is_found_across_words() {
        let mut u = Usable::new(200);
        for r in [3, 64, 65, 130, 199] {
            u.set(r);
        }
        assert_eq!(u.count(), 5);
        let found: Vec<Option<usize>> = (0..6).map(|k| u.row_of(k)).collect();
        assert_eq!(
            found,
            [Some(3), Some(64), Some(65), Some(130), Some(199), None]
        );
    }

    #[test]
    fn stretches_end_where_the_next_block_starts() {
        // One block: it takes every row.
        let mut u = Usable::new(10);
        for r in [1, 2, 4, 7, 8] {
            u.set(r);
        }
        assert_eq!(stretch_ends(&ScoreBlocks::new(&[5], 3), &u, 10), [10]);
        // Rows 0-9 unusable, then SCORE_BLOCK_PAIRS + 1 usable ones: two
        // blocks of 32,769 and 32,768 pairs; the first stretch holds the 10
        // unusable rows and its 32,769 pairs, the second the rest.
        let rows = SCORE_BLOCK_PAIRS + 11;
        let two = ScoreBlocks::new(&[SCORE_BLOCK_PAIRS + 1], 3);
        assert_eq!(two.blocks()[0].len, 32_769);
        let mut many = Usable::new(rows);
        for r in 10..rows {
            many.set(r);
        }
        assert_eq!(stretch_ends(&two, &many, rows), [10 + 32_769, rows]);
    }
}
