//! Progress bars and logs on stderr.
//!
//! stdout carries only the final summary. On a terminal, stages show
//! indicatif bars; otherwise one plain line per finished stage or epoch;
//! with `--log-format json`, one JSON object per event.

use std::collections::HashSet;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use ncclean_pipelines::{EpochStats, Observer};

/// How logs are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable: bars on a terminal, plain lines otherwise.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Writes progress and events for one command.
#[derive(Debug, Clone)]
pub struct Reporter {
    format: LogFormat,
    tty: bool,
}

impl Reporter {
    /// A reporter for `format`, detecting whether stderr is a terminal.
    pub fn new(format: LogFormat) -> Self {
        WARN_JSON.store(format == LogFormat::Json, Ordering::Relaxed);
        Reporter {
            format,
            tty: std::io::stderr().is_terminal(),
        }
    }

    /// A reporter that never draws bars (tests, nested work).
    pub fn plain(format: LogFormat) -> Self {
        Reporter { format, tty: false }
    }

    /// An informational message.
    pub fn info(&self, msg: &str) {
        match self.format {
            LogFormat::Text => eprintln!("{msg}"),
            LogFormat::Json => self.event("info", serde_json::json!({ "message": msg })),
        }
    }

    /// A structured event; in text mode only its message-like summary is shown.
    pub fn event(&self, kind: &str, fields: serde_json::Value) {
        if self.format == LogFormat::Json {
            let mut obj = serde_json::json!({ "event": kind });
            if let (Some(o), serde_json::Value::Object(f)) = (obj.as_object_mut(), fields) {
                o.extend(f);
            }
            eprintln!("{obj}");
        }
    }

    /// Log one finished epoch.
    pub fn epoch(&self, stats: &EpochStats, total: usize, seconds: f64) {
        match self.format {
            LogFormat::Text => {
                let clean = stats
                    .clean_fraction
                    .map(|c| format!(", clean {:.1}%", 100.0 * c))
                    .unwrap_or_default();
                eprintln!(
                    "epoch {}/{} [{}] loss {:.4}{clean}, {} pairs, {seconds:.1}s",
                    stats.epoch + 1,
                    total,
                    stats.phase,
                    stats.loss,
                    stats.pairs
                );
            }
            LogFormat::Json => {
                let mut v = serde_json::to_value(stats).unwrap_or_default();
                if let Some(o) = v.as_object_mut() {
                    o.insert("seconds".into(), seconds.into());
                    o.insert("epochs".into(), total.into());
                }
                self.event("epoch", v);
            }
        }
    }

    /// A progress observer for a stage of work.
    pub fn observer(&self) -> StageObserver {
        StageObserver {
            reporter: self.clone(),
            bar: None,
            stage: String::new(),
            done: 0,
            total: 0,
            started: Instant::now(),
            last_line: Instant::now(),
        }
    }
}

/// Whether [`warn_once`] writes JSON: set by the command's [`Reporter::new`],
/// because warnings come from deep in the data layer, which has no reporter.
static WARN_JSON: AtomicBool = AtomicBool::new(false);
/// Warnings already written by [`warn_once`].
static WARNED: Mutex<Option<HashSet<String>>> = Mutex::new(None);

/// Write a warning line on stderr (`warning: ...`, or a `warning` event with
/// `--log-format json`), once per process for each distinct message: data
/// read twice in one command (e.g. for training and again for the filtered
/// output) must not repeat its warnings.
pub fn warn_once(msg: &str) {
    let mut seen = WARNED.lock().unwrap_or_else(|e| e.into_inner());
    if !seen
        .get_or_insert_with(HashSet::new)
        .insert(msg.to_string())
    {
        return;
    }
    drop(seen);
    if WARN_JSON.load(Ordering::Relaxed) {
        eprintln!(
            "{}",
            serde_json::json!({ "event": "warning", "message": msg })
        );
    } else {
        eprintln!("warning: {msg}");
    }
}

/// Turns pipeline and engine progress into bars or lines.
pub struct StageObserver {
    reporter: Reporter,
    bar: Option<ProgressBar>,
    stage: String,
    done: u64,
    total: u64,
    started: Instant,
    last_line: Instant,
}

/// Seconds between plain progress lines when stderr is not a terminal.
const LINE_EVERY_SECS: f64 = 15.0;

impl Observer for StageObserver {
    fn start(&mut self, stage: &str, total: u64) {
        self.finish();
        self.stage = stage.to_string();
        self.done = 0;
        self.total = total;
        self.started = Instant::now();
        self.last_line = Instant::now();
        if self.reporter.tty && self.reporter.format == LogFormat::Text {
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template(
                    "{msg:>14} [{bar:30}] {pos}/{len} {per_sec} eta {eta}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
            );
            bar.set_message(stage.to_string());
            self.bar = Some(bar);
        }
    }

    fn advance(&mut self, n: u64) {
        self.done += n;
        if let Some(b) = &self.bar {
            b.inc(n);
        } else if self.reporter.format == LogFormat::Text
            && self.last_line.elapsed().as_secs_f64() >= LINE_EVERY_SECS
        {
            // Long stages in logs (not a terminal) still show they are alive.
            self.last_line = Instant::now();
            let secs = self.started.elapsed().as_secs_f64();
            eprintln!(
                "{}: {}/{} ({:.1}/s)",
                self.stage,
                self.done,
                self.total,
                self.done as f64 / secs.max(1e-9)
            );
        }
    }

    fn finish(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
        if !self.stage.is_empty() {
            let secs = self.started.elapsed().as_secs_f64();
            self.reporter.event(
                "stage",
                serde_json::json!({ "stage": self.stage, "units": self.done, "seconds": secs }),
            );
            self.stage.clear();
        }
    }

    fn cancelled(&self) -> bool {
        crate::interrupt::requested()
    }
}

impl Drop for StageObserver {
    fn drop(&mut self) {
        self.finish();
    }
}
