//! `ncclean report`: one self-contained HTML page about a finished run.
//!
//! The page shows the distributions of `clean_prob` and the similarity,
//! the statistic the method's mixture was fitted on with the fitted
//! components drawn over it, the training curves, what a range of cuts
//! would keep, and the pictures and captions of the most suspicious,
//! borderline and most confident pairs.
//!
//! Stages, each handing plain data to the next: [`run::load`] reads the run
//! directory, [`build`] computes the page's content ([`Page`]), and
//! [`html::render`] writes it out. The charts come from `plots`
//! (plotters' SVG backend), the pictures from `thumbs`, read back from
//! the run's inputs. What `fit` records for the mixture chart is
//! [`DivisionRecord`](crate::curation::division_record::DivisionRecord).

mod fitted;
mod html;
mod plots;
mod run;
mod select;
mod thumbs;

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::curation::histogram::Histogram;

pub use fitted::Overlay;
pub use html::{escape, render, Chart, Example, Group, Page};
pub use plots::{BAR, CLEAN, NOISY};
pub use run::{load, RunRecord};
pub use select::{pick, Picks};
pub use thumbs::{data_uri, thumbnail, Shown, Source, THUMB_PX};

use ncclean_pipelines::division::{Fallback, MixtureKind};

use crate::curation::threshold::{self, percent, Ranked, Rule};
use crate::data::RowStatus;
use crate::error::Result;

/// Bins of the `clean_prob` and similarity histograms.
pub const HIST_BINS: usize = 40;
/// Pairs shown per group unless asked otherwise.
pub const DEFAULT_PER_GROUP: usize = 8;
/// Most pairs shown per group: each is a thumbnail inside the page.
pub const MAX_PER_GROUP: usize = 100;
/// Kept fractions of the threshold table.
pub const KEEP_FRACTIONS: [f64; 7] = [1.0, 0.95, 0.9, 0.8, 0.7, 0.6, 0.5];
/// Longest caption shown, in characters: a caption column can hold
/// anything, and the page should stay readable and small.
pub const MAX_CAPTION_CHARS: usize = 400;
/// Points at which the mixture's components are drawn.
const OVERLAY_POINTS: usize = 201;

/// How the report is made.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Pairs shown in each of the three groups (at most
    /// [`MAX_PER_GROUP`]).
    pub per_group: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            per_group: DEFAULT_PER_GROUP,
        }
    }
}

/// What a report holds, for the command's summary line.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Where the page was written.
    pub out: PathBuf,
    /// Label rows.
    pub rows: usize,
    /// Scored pairs.
    pub scored: usize,
    /// Pairs shown.
    pub shown: usize,
    /// Shown pairs whose picture could not be read.
    pub pictures_missing: usize,
    /// Whether the fitted mixture is drawn.
    pub mixture_drawn: bool,
}

impl Options {
    /// Refuse a `per_group` outside 1 to [`MAX_PER_GROUP`] (a usage error
    /// naming `--per-group`).
    pub fn check(&self) -> Result<()> {
        if !(1..=MAX_PER_GROUP).contains(&self.per_group) {
            return Err(crate::Error::Usage(format!(
                "--per-group must be between 1 and {MAX_PER_GROUP}, got {}",
                self.per_group
            )));
        }
        Ok(())
    }
}

/// `ncclean report`: write the report of the run in `dir` to `out`
/// (default: `dir/report.html`), warning first when the run's inputs
/// changed since `fit` (the pictures are read back from them by row), and
/// say what it holds on stderr.
pub fn write_run(
    dir: &Path,
    out: Option<PathBuf>,
    opts: &Options,
    rep: &crate::runtime::progress::Reporter,
) -> Result<Summary> {
    let out = out.unwrap_or_else(|| dir.join("report.html"));
    crate::runtime::temp::check_replaceable(&out, "--out")?;
    if crate::run::inputs::recorded_inputs_changed(dir) == Some(true) {
        crate::runtime::progress::warn_once(&format!(
            "the files {}/run.json names as the training data changed since fit (their content \
             differs from the input_fingerprint it records, or one is gone): the report's \
             pictures are read from them by row and may not show the pairs that were scored",
            dir.display()
        ));
    }
    let s = write(dir, &out, opts)?;
    rep.info(&format!(
        "wrote {}: {} scored pairs, {} shown ({} without a picture){}",
        out.display(),
        s.scored,
        s.shown,
        s.pictures_missing,
        if s.mixture_drawn {
            ""
        } else {
            "; no fitted mixture to draw"
        }
    ));
    Ok(s)
}

/// Read the run in `dir` and write its report to `out` atomically.
pub fn write(dir: &Path, out: &Path, opts: &Options) -> Result<Summary> {
    let run = load(dir)?;
    let (page, mut summary) = build(&run, opts)?;
    crate::data::write_atomic(out, render(&page).as_bytes())?;
    summary.out = out.to_path_buf();
    Ok(summary)
}

/// The page for `run` (pictures are read from the run's inputs), section by
/// section: `distributions`, `curves`, the cut table (`cuts`) and the
/// example pairs (`examples`).
pub fn build(run: &RunRecord, opts: &Options) -> Result<(Page, Summary)> {
    let scored: Vec<Option<f32>> = run
        .labels
        .iter()
        .map(|l| match l.status {
            RowStatus::Ok => l.clean_prob.filter(|p| p.is_finite()),
            RowStatus::Skipped => None,
        })
        .collect();
    let probs: Vec<f32> = scored.iter().flatten().copied().collect();
    // fit's warnings first: they say whether the rest can be trusted.
    let mut notes: Vec<String> = run
        .warnings
        .iter()
        .map(|w| format!("fit warned: {w}"))
        .collect();
    let mut page = Page {
        title: format!("ncclean report: {}", run.dir.display()),
        facts: facts(run, &probs),
        ..Page::default()
    };
    let mixture_drawn;
    (page.distributions, mixture_drawn) = distributions(run, &probs, &mut notes)?;
    page.curves = curves(run)?;
    page.cuts = cuts(run);
    let (groups, wanted, missing) = examples(run, &scored, opts);
    page.groups = groups;
    if let Some(first) = missing.first() {
        notes.push(format!(
            "{} of {} pictures could not be shown; the first because: {first}",
            missing.len(),
            wanted
        ));
    }
    page.notes = notes;
    let summary = Summary {
        out: PathBuf::new(),
        rows: run.labels.len(),
        scored: probs.len(),
        shown: wanted,
        pictures_missing: missing.len(),
        mixture_drawn,
    };
    Ok((page, summary))
}

/// The distributions: clean_prob with the threshold, the similarity, and
/// the division statistic with the fitted mixture over it (whether it was
/// drawn is the second value; what is missing goes to `notes`).
fn distributions(
    run: &RunRecord,
    probs: &[f32],
    notes: &mut Vec<String>,
) -> Result<(Vec<Chart>, bool)> {
    let sims: Vec<f64> = run
        .labels
        .iter()
        .filter(|l| l.status == RowStatus::Ok)
        .filter_map(|l| l.similarity.map(f64::from))
        .collect();
    let mut charts = Vec::new();
    let clean_hist = Histogram::of(probs.iter().map(|&p| f64::from(p)), 0.0, 1.0, HIST_BINS);
    let threshold_label = format!("threshold {}", run.threshold);
    charts.push(Chart {
        svg: plots::histogram_svg(&plots::Bars {
            title: "clean_prob",
            x_label: "clean_prob (P(pair is matched))",
            hist: &clean_hist,
            overlay: None,
            marker: Some((run.threshold, &threshold_label)),
        })?,
        caption: format!(
            "{} scored pairs; pairs right of the line are labelled clean.",
            probs.len()
        ),
    });
    charts.push(Chart {
        svg: plots::histogram_svg(&plots::Bars {
            title: "similarity",
            x_label: "image-caption similarity",
            hist: &Histogram::spanning(&sims, HIST_BINS),
            overlay: None,
            marker: None,
        })?,
        caption: "Similarity of each pair's image and caption under the trained model.".into(),
    });
    let mut mixture_drawn = false;
    match &run.division {
        Some(record) => {
            let overlay = record.overlay(OVERLAY_POINTS);
            mixture_drawn = overlay.is_some();
            let family = match record.division.kind {
                MixtureKind::Gmm => "Gaussian",
                MixtureKind::Bmm => "Beta",
            };
            charts.push(Chart {
                svg: plots::histogram_svg(&plots::Bars {
                    title: "division statistic and the fitted mixture",
                    x_label: "statistic, min-max normalised",
                    hist: &record.histogram,
                    overlay: overlay.as_ref(),
                    marker: None,
                })?,
                caption: format!(
                    "Two-component {family} mixture over the statistic{}; {}. The curves are the fitted components scaled to the bars.",
                    record
                        .statistic
                        .as_deref()
                        .map(|s| format!(" ({s})"))
                        .unwrap_or_default(),
                    record.clean_end()
                ),
            });
            if let Some(f) = &record.division.fallback {
                notes.push(fallback_note(f));
            }
        }
        None => notes.push(
            "stats.json holds no division record (runs written before `ncclean report` existed): \
             fit again to see the fitted mixture over its statistic."
                .into(),
        ),
    }
    Ok((charts, mixture_drawn))
}

/// The training curves: loss and the share called clean, per epoch.
fn curves(run: &RunRecord) -> Result<Vec<Chart>> {
    let loss: Vec<(f64, f64)> = run
        .epochs
        .iter()
        .map(|e| ((e.epoch + 1) as f64, e.loss))
        .collect();
    let clean_fraction: Vec<(f64, f64)> = run
        .epochs
        .iter()
        .filter_map(|e| e.clean_fraction.map(|c| ((e.epoch + 1) as f64, c)))
        .collect();
    let mut charts = Vec::new();
    if !loss.is_empty() {
        charts.push(Chart {
            svg: plots::curve_svg("training loss", "mean loss", &loss, None)?,
            caption: "Mean training loss of each epoch.".into(),
        });
    }
    if !clean_fraction.is_empty() {
        charts.push(Chart {
            svg: plots::curve_svg(
                "clean fraction",
                "fraction called clean",
                &clean_fraction,
                Some((0.0, 1.0)),
            )?,
            caption: "Share of the pairs the epoch's division called clean (none during warm-up)."
                .into(),
        });
    }
    Ok(charts)
}

/// What a range of cuts would keep: the keep fractions, the run's own
/// threshold and the estimated noise rate removed.
fn cuts(run: &RunRecord) -> Vec<threshold::Cut> {
    let ranked: Vec<Ranked> = run
        .labels
        .iter()
        .filter(|l| l.status == RowStatus::Ok)
        .filter_map(|l| l.clean_prob.map(|p| Ranked::new(p, l.similarity)))
        .collect();
    let mut cuts = threshold::table(&ranked, &KEEP_FRACTIONS);
    cuts.push(Rule::MinProb(run.threshold).resolve(&ranked));
    cuts.push(Rule::RemoveNoise(None).resolve(&ranked));
    cuts
}

/// The example pairs: the most suspicious, borderline and most confident,
/// with their pictures and captions read from the run's inputs. Also the
/// number of pictures asked for and why those that could not be shown
/// were not.
fn examples(
    run: &RunRecord,
    scored: &[Option<f32>],
    opts: &Options,
) -> (Vec<Group>, usize, Vec<String>) {
    let per_group = opts.per_group.min(MAX_PER_GROUP);
    let picks = pick(scored, per_group, run.threshold);
    let groups = [
        (
            "Most suspicious pairs",
            "The lowest clean_prob: the pairs most likely mismatched.",
            &picks.suspicious,
        ),
        (
            "Borderline pairs",
            "clean_prob nearest the threshold: where the division is least sure.",
            &picks.borderline,
        ),
        (
            "Most confident pairs",
            "The highest clean_prob: the pairs most likely matched.",
            &picks.confident,
        ),
    ];
    let wanted: Vec<(String, u64)> = groups
        .iter()
        .flat_map(|g| g.2.iter())
        .map(|&i| (run.labels[i].source_file.clone(), run.labels[i].source_row))
        .collect();
    let mut shown = thumbs::read(&run.source, &wanted).into_iter();
    let mut missing = Vec::new();
    let mut out = Vec::new();
    for (title, about, rows) in groups {
        let mut pairs = Vec::with_capacity(rows.len());
        for &i in rows {
            let l = &run.labels[i];
            let s = shown.next().unwrap_or_else(|| Shown {
                caption: Err("not read".into()),
                image: Err("not read".into()),
            });
            if let Err(why) = &s.image {
                missing.push(why.clone());
            }
            pairs.push(Example {
                key: l.key.clone(),
                clean_prob: l.clean_prob.unwrap_or(f32::NAN),
                similarity: l.similarity,
                caption: s.caption.map(|c| shorten(&c, MAX_CAPTION_CHARS)),
                image: s.image,
            });
        }
        out.push(Group {
            title: title.into(),
            about: about.into(),
            pairs,
        });
    }
    (out, wanted.len(), missing)
}

/// `s` cut to at most `max` characters, an ellipsis saying it was cut.
fn shorten(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((end, _)) => format!("{}…", &s[..end]),
        None => s.to_string(),
    }
}

/// A division's fallback in words for the page.
fn fallback_note(f: &Fallback) -> String {
    let unfitted = "no mixture was fitted, so every pair got clean_prob 1 \
                    (no evidence of noise is no reason to drop data)";
    match f {
        Fallback::TooFew { n } => {
            format!("The division saw only {n} finite statistics, too few for a mixture: {unfitted}.")
        }
        Fallback::Constant => {
            format!("Every pair had the same statistic, so there was nothing to divide: {unfitted}.")
        }
        Fallback::Collapsed { weight } => format!(
            "The mixture collapsed (one component's weight fell to {weight:.1e}): {unfitted}."
        ),
        Fallback::NonFinite { count } => format!(
            "{count} pairs had a non-finite statistic: they were left out of the mixture and got clean_prob 0.5."
        ),
    }
}

/// The summary lines at the top of the page.
fn facts(run: &RunRecord, probs: &[f32]) -> Vec<(String, String)> {
    let rows = run.labels.len();
    let clean = run.labels.iter().filter(|l| l.is_clean).count();
    let mut facts = vec![
        ("method".to_string(), run.method.clone()),
        (
            "pairs".into(),
            format!(
                "{rows} rows: {} scored, {} skipped",
                probs.len(),
                rows - probs.len()
            ),
        ),
        (
            "labelled clean".into(),
            format!(
                "{clean} ({} of the scored pairs, clean_prob >= {})",
                percent(clean as f64 / probs.len().max(1) as f64),
                run.threshold
            ),
        ),
        (
            "estimated noise rate".into(),
            format!(
                "{} (mean of 1 - clean_prob)",
                percent(threshold::estimated_noise_rate(probs))
            ),
        ),
        ("epochs".into(), run.epochs.len().to_string()),
    ];
    if let Some(s) = &run.signal {
        facts.push((
            "against random pairings".into(),
            format!(
                "{} of {} sampled pairs score above 99% of random pairings of the same images \
                 and captions (chance: 1%); {} score like them (twice the share below their \
                 median: a lower bound of the noise rate)",
                percent(s.matched_share),
                s.pairs,
                percent(s.random_like_share)
            ),
        ));
    }
    if let Some(seed) = run.seed {
        facts.push(("seed".into(), seed.to_string()));
    }
    facts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_captions_are_cut_at_a_character_boundary() {
        assert_eq!(shorten("abc", 3), "abc");
        assert_eq!(shorten("abcd", 3), "abc…");
        assert_eq!(shorten("ééééé", 2), "éé…");
        assert_eq!(shorten("", 2), "");
    }

    #[test]
    fn fallbacks_read_as_sentences() {
        let n = fallback_note(&Fallback::TooFew { n: 3 });
        assert!(
            n.starts_with("The division saw only 3 finite statistics"),
            "{n}"
        );
        assert!(n.contains("every pair got clean_prob 1"), "{n}");
        let n = fallback_note(&Fallback::Collapsed { weight: 0.0004 });
        assert!(n.contains("weight fell to 4.0e-4"), "{n}");
        let n = fallback_note(&Fallback::NonFinite { count: 2 });
        assert!(n.starts_with("2 pairs had a non-finite statistic"), "{n}");
        assert!(!fallback_note(&Fallback::Constant).contains('{'));
    }
}
