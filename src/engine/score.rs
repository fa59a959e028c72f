//! What `ncclean score` needs around [`Engine::score_file`]: streaming a
//! file's blocks into a labels writer with their counts and tally, the rows
//! `--filtered` keeps, the per-file warnings, and the refusal of a run that
//! recorded no signal.

use crate::curation::threshold::Tally;
use crate::data::{InputSet, LabelRow, LabelsWriter};
use crate::engine::Engine;
use crate::error::Result;
use crate::run::shards::Counts;
use crate::runtime::progress::Reporter;
use crate::towers::features::CacheOptions;

/// Refuse a checkpoint whose run recorded that the model cannot tell its
/// training pairs from random pairings (stats.json's `signal`, as runs of
/// earlier versions were written with): its labels would be at random,
/// typically every pair clean. Runs without stats.json are not judged.
pub(crate) fn refuse_without_signal(engine: &Engine) -> Result<()> {
    let Some(run) = engine
        .dir
        .parent()
        .filter(|_| engine.dir.file_name() == Some(std::ffi::OsStr::new("checkpoint")))
    else {
        return Ok(());
    };
    let stats = run.join("stats.json");
    if !stats.is_file() {
        return Ok(());
    }
    let bytes = crate::runtime::small_file::read(
        &stats,
        crate::runtime::small_file::RUN_FILE_LIMIT,
        "run file",
    )?;
    let recorded = serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .and_then(|v| {
            serde_json::from_value::<crate::curation::division_check::SignalCheck>(
                v["signal"].clone(),
            )
            .ok()
        });
    match recorded {
        Some(s) if s.no_signal() => Err(crate::error::invalid(format!(
            "{}: no signal: {} ({}); nothing was scored. Fit again (a lower --lr, or the \
             method's default) and score with the new run",
            run.display(),
            s.no_signal_reason(),
            stats.display()
        ))),
        _ => Ok(()),
    }
}

/// Counts of scored labels: `pairs` usable ones, `noisy` of them noisy.
fn counts(labels: &[LabelRow], pairs: usize, noisy: usize) -> Counts {
    Counts {
        rows: labels.len(),
        usable: pairs,
        skipped: labels.len() - pairs,
        kept: labels.iter().filter(|l| l.is_clean).count(),
        noisy,
    }
}

/// Score the one file of `input` a block at a time ([`Engine::score_file`]):
/// each block's labels go to `out` as they come, and which rows are clean
/// to `keep` (one flag per row of the file) when given; the file's signal
/// warning goes to `warnings`. Returns the file's counts, its tally of the
/// engine's cut and seconds in the model's scoring pass.
pub(crate) fn stream_file(
    engine: &Engine,
    input: &InputSet,
    cache: &CacheOptions,
    rep: &Reporter,
    out: &mut LabelsWriter,
    mut kept: Option<&mut Kept>,
    warnings: &mut FileWarnings,
) -> Result<(Counts, Tally, f64)> {
    let mut total = Counts::default();
    let mut tally = Tally::default();
    let mut seconds = 0.0;
    engine.score_file(input, cache, rep, |block| {
        out.write(&block.labels)?;
        if let Some(kept) = kept.as_deref_mut() {
            kept.add(&block.labels);
        }
        total.add(&counts(&block.labels, block.pairs, block.noisy));
        tally.merge(&block.tally);
        seconds += block.seconds;
        if let Some(w) = block.warning {
            warnings.add(w);
        }
        Ok(())
    })?;
    Ok((total, tally, seconds))
}

/// Files whose check against random pairings warned: the first
/// [`FileWarnings::SHOWN`] are said on stderr as they come, every one is
/// listed in the summary on stdout.
#[derive(Default)]
pub(crate) struct FileWarnings {
    pub(crate) all: Vec<String>,
}

impl FileWarnings {
    /// Warnings said on stderr; more would bury the progress of a
    /// thousand-shard run.
    const SHOWN: usize = 5;

    pub(crate) fn add(&mut self, w: String) {
        if self.all.len() < Self::SHOWN {
            crate::runtime::progress::warn_once(&w);
        }
        self.all.push(w);
    }

    /// Say how many were not shown.
    pub(crate) fn finish(&self) {
        if let Some(more) = self.all.len().checked_sub(Self::SHOWN).filter(|&m| m > 0) {
            let files = if more == 1 { "file" } else { "files" };
            crate::runtime::progress::warn_once(&format!(
                "{more} more {files} warned as above; the summary on stdout lists every warning \
                 (\"warnings\")"
            ));
        }
    }
}

/// What `--filtered` needs of the labels: each row's decision and label
/// index per file, and the labels indexed. While labels stream past, only
/// kept rows' values are held, without keys or messages.
#[derive(Default)]
pub(crate) struct Kept {
    pub(crate) keep: Vec<Vec<bool>>,
    pub(crate) label_of: Vec<Vec<u32>>,
    pub(crate) labels: Vec<LabelRow>,
}

impl Kept {
    /// The next input file, of `rows` rows.
    pub(crate) fn start_file(&mut self, rows: usize) {
        self.keep.push(vec![false; rows]);
        self.label_of.push(vec![crate::engine::NO_LABEL; rows]);
    }

    /// Labels of the current file.
    pub(crate) fn add(&mut self, labels: &[LabelRow]) {
        let (Some(keep), Some(label_of)) = (self.keep.last_mut(), self.label_of.last_mut()) else {
            return;
        };
        for l in labels.iter().filter(|l| l.is_clean) {
            let row = l.source_row as usize;
            if let (Some(k), Some(of)) = (keep.get_mut(row), label_of.get_mut(row)) {
                *k = true;
                *of = self.labels.len() as u32;
                self.labels.push(LabelRow {
                    key: String::new(),
                    source_file: String::new(),
                    error: None,
                    ..*l
                });
            }
        }
    }
}

/// The input as a set of its file `i` alone (same columns and limits).
fn file_of(input: &InputSet, i: usize) -> InputSet {
    InputSet {
        files: vec![input.files[i].clone()],
        fingerprint: Default::default(),
        ..input.clone()
    }
}

/// What scoring an input into one labels file gave.
pub(crate) struct Scoring {
    /// Counts over every file.
    pub(crate) total: Counts,
    /// The engine's cut over the usable pairs.
    pub(crate) tally: Tally,
    /// Seconds in the model's scoring passes.
    pub(crate) seconds: f64,
    /// What `--filtered` keeps (empty without it).
    pub(crate) kept: Kept,
}

/// Score `input` a file and a block at a time into `writer` (what
/// `--filtered` keeps gathered when `filtered`).
pub(crate) fn score_streaming(
    engine: &Engine,
    input: &InputSet,
    cache: &CacheOptions,
    rep: &Reporter,
    writer: &mut LabelsWriter,
    filtered: bool,
    warnings: &mut FileWarnings,
) -> Result<Scoring> {
    let mut total = Counts::default();
    let mut tally = Tally::default();
    let mut seconds = 0.0;
    // `--filtered`: each file's decisions and kept rows' label values.
    let mut kept = Kept::default();
    for i in 0..input.files.len() {
        let piece = file_of(input, i);
        let filtered = filtered.then(|| {
            kept.start_file(piece.num_rows());
            &mut kept
        });
        let (c, t, s) = stream_file(engine, &piece, cache, rep, writer, filtered, warnings)?;
        total.add(&c);
        tally.merge(&t);
        seconds += s;
    }
    Ok(Scoring {
        total,
        tally,
        seconds,
        kept,
    })
}

/// `--refit`: score the whole of `input` at once (the refitted mixture
/// needs every pair's statistic), each file checked against random
/// pairings on its own, into `writer`.
pub(crate) fn score_refit(
    engine: &Engine,
    input: &InputSet,
    cache: &CacheOptions,
    rep: &Reporter,
    writer: &mut LabelsWriter,
    filtered: bool,
    warnings: &mut FileWarnings,
) -> Result<Scoring> {
    let prepared = engine.prepare(input, cache, rep)?;
    let scored = engine.score_rows(input, &prepared, true, rep)?;
    // Each file's pairs and cut, found in one pass over the pairs.
    let files = input.files.len();
    let mut pairs_of = vec![Vec::new(); files];
    let mut tally_of = vec![Tally::default(); files];
    for (k, &row) in prepared.ok.iter().enumerate() {
        let f = prepared.rows[row].file;
        pairs_of[f].push(k);
        let l = &scored.labels[row];
        if let Some(p) = l.clean_prob {
            let pair = crate::curation::threshold::Ranked::new(p, l.similarity);
            tally_of[f].add(&[pair], engine.cut().bound());
        }
    }
    for (f, (pairs, tally)) in pairs_of.iter().zip(&tally_of).enumerate() {
        let name = input.display_name(f);
        if let Some(w) = engine.signal_warning(&name, &prepared.inputs, pairs, tally)? {
            warnings.add(w);
        }
    }
    writer.write(&scored.labels)?;
    let noisy = (scored.estimated_noise_rate * scored.pairs as f64).round() as usize;
    let total = counts(&scored.labels, scored.pairs, noisy);
    let mut tally = Tally::default();
    tally.merge(&scored.tally);
    let mut kept = Kept::default();
    if filtered {
        let joined = super::join_by_position(input, &scored.labels, |l| l.is_clean, true)?;
        kept = Kept {
            keep: joined.keep,
            label_of: joined.label_of,
            labels: scored.labels,
        };
    }
    Ok(Scoring {
        total,
        tally,
        seconds: scored.seconds,
        kept,
    })
}
