//! Progress bars and logs on stderr.
//!
//! stdout carries only the final summary. On a terminal, stages show
//! indicatif bars; otherwise one plain line per finished stage or epoch;
//! with `--log-format json`, one JSON object per event.

use std::collections::HashSet;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

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
    /// Seconds and count of the epochs logged so far, for the fit's ETA.
    epochs_timed: Arc<Mutex<(f64, u32)>>,
}

impl Reporter {
    /// A reporter for `format`, detecting whether stderr is a terminal.
    pub fn new(format: LogFormat) -> Self {
        WARN_JSON.store(format == LogFormat::Json, Ordering::Relaxed);
        Reporter {
            format,
            tty: std::io::stderr().is_terminal(),
            epochs_timed: Arc::default(),
        }
    }

    /// A reporter that never draws bars (tests, nested work).
    pub fn plain(format: LogFormat) -> Self {
        Reporter {
            format,
            tty: false,
            epochs_timed: Arc::default(),
        }
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
            eprintln!("{}", json_line(kind, fields));
        }
    }

    /// Log one finished epoch (`stats.epoch` is 0-based; people read
    /// 1-based epochs in every output) with the fit's remaining time,
    /// estimated from the mean epoch so far.
    pub fn epoch(&self, stats: &EpochStats, total: usize, seconds: f64) {
        let eta = {
            let mut t = self.epochs_timed.lock().unwrap_or_else(|e| e.into_inner());
            t.0 += seconds;
            t.1 += 1;
            t.0 / f64::from(t.1) * total.saturating_sub(stats.epoch + 1) as f64
        };
        match self.format {
            LogFormat::Text => {
                let clean = stats
                    .clean_fraction
                    .map(|c| format!(", clean {:.1}%", 100.0 * c))
                    .unwrap_or_default();
                let eta = if stats.epoch + 1 < total {
                    format!(", fit eta {}", human_duration(eta))
                } else {
                    String::new()
                };
                eprintln!(
                    "epoch {}/{} [{}] loss {:.4}{clean}, {} pairs, {}{eta}",
                    stats.epoch + 1,
                    total,
                    stats.phase,
                    stats.loss,
                    stats.pairs,
                    human_duration(seconds)
                );
            }
            LogFormat::Json => {
                // EpochStats serialises its epoch 1-based.
                let mut v = serde_json::to_value(stats).unwrap_or_default();
                if let Some(o) = v.as_object_mut() {
                    o.insert("seconds".into(), seconds.into());
                    o.insert("epochs".into(), total.into());
                    o.insert("eta_seconds".into(), eta.into());
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
            json_line("warning", serde_json::json!({ "message": msg }))
        );
    } else {
        eprintln!("warning: {msg}");
    }
}

/// Write the error that ends the command: `error: ...` with its causes, or
/// one `error` event (with the exit code) under `--log-format json`.
pub fn report_error(e: &crate::Error) {
    let causes: Vec<String> = match e {
        crate::Error::Other(inner) => inner.chain().skip(1).map(|c| c.to_string()).collect(),
        _ => Vec::new(),
    };
    if WARN_JSON.load(Ordering::Relaxed) {
        eprintln!(
            "{}",
            json_line(
                "error",
                serde_json::json!({ "message": e.to_string(), "causes": causes, "exit_code": e.exit_code() })
            )
        );
    } else {
        eprintln!("error: {e}");
        for cause in causes {
            eprintln!("  caused by: {cause}");
        }
    }
}

/// One JSON log line: timestamp, level, event, then the event's fields.
fn json_line(kind: &str, fields: serde_json::Value) -> serde_json::Value {
    let level = match kind {
        "warning" | "error" => kind,
        _ => "info",
    };
    let mut obj = serde_json::json!({ "ts": utc_timestamp(SystemTime::now()), "level": level, "event": kind });
    if let (Some(o), serde_json::Value::Object(f)) = (obj.as_object_mut(), fields) {
        o.extend(f);
    }
    obj
}

/// RFC 3339 UTC with milliseconds (`2026-11-24T10:21:05.123Z`), without a
/// date-time dependency: days since the epoch to a civil date (proleptic
/// Gregorian, H. Hinnant's algorithm).
pub fn utc_timestamp(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3_600,
        rem % 3_600 / 60,
        rem % 60,
        d.subsec_millis()
    )
}

/// A rate rounded for people: `12,345/s`, `123/s`, `12.3/s`, `1.23/s`.
pub fn human_rate(per_sec: f64) -> String {
    if !per_sec.is_finite() {
        return "-".into();
    }
    if per_sec >= 1000.0 {
        let n = per_sec.round() as u64;
        let digits = n.to_string();
        let mut out = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i).is_multiple_of(3) {
                out.push(',');
            }
            out.push(c);
        }
        format!("{out}/s")
    } else if per_sec >= 100.0 {
        format!("{per_sec:.0}/s")
    } else if per_sec >= 10.0 {
        format!("{per_sec:.1}/s")
    } else {
        format!("{per_sec:.2}/s")
    }
}

/// A duration for people: `0.4s`, `12s`, `3m 05s`, `2h 07m`.
pub fn human_duration(secs: f64) -> String {
    if !secs.is_finite() || secs < 0.0 {
        return "-".into();
    }
    if secs < 10.0 {
        return format!("{secs:.1}s");
    }
    let s = secs.round() as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3_599 => format!("{}m {:02}s", s / 60, s % 60),
        _ => format!("{}h {:02}m", s / 3_600, s % 3_600 / 60),
    }
}

/// What a stage counts, for its bar and progress lines.
fn unit_of(stage: &str) -> &'static str {
    match stage {
        "reading" | "encoding" => "row",
        "scoring" | "final division" => "pair",
        _ => "batch",
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
            let template = format!(
                "{{msg:>14}} [{{bar:30}}] {} {{pos}}/{{len}} {{rate}} eta {{eta}}",
                unit_of(stage)
            );
            bar.set_style(
                ProgressStyle::with_template(&template)
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .with_key(
                        "rate",
                        |s: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                            let _ = w.write_str(&human_rate(s.per_sec()));
                        },
                    )
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
            let rate = self.done as f64 / secs.max(1e-9);
            eprintln!(
                "{}: {} {}/{} ({}, eta {})",
                self.stage,
                unit_of(&self.stage),
                self.done,
                self.total,
                human_rate(rate),
                human_duration(self.total.saturating_sub(self.done) as f64 / rate.max(1e-9))
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
        crate::runtime::interrupt::requested()
    }
}

impl Drop for StageObserver {
    fn drop(&mut self) {
        self.finish();
    }
}

/// Write generated text (a completion script, a man page) to stdout. A
/// reader that stops early (`| head`) is not an error.
pub fn write_stdout(bytes: &[u8]) -> crate::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(crate::Error::Other(
            anyhow::anyhow!("writing to stdout: {e}"),
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn timestamps_are_rfc3339_utc() {
        let at = |secs: u64, ms: u64| {
            utc_timestamp(UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_millis(ms))
        };
        assert_eq!(at(0, 0), "1970-01-01T00:00:00.000Z");
        // `date -u -d @1795516865` = Tue Nov 24 10:41:05 UTC 2026.
        assert_eq!(at(1_795_516_865, 7), "2026-11-24T10:41:05.007Z");
        // 2024-02-29 (leap day) 23:59:59 = 1709251199.
        assert_eq!(at(1_709_251_199, 999), "2024-02-29T23:59:59.999Z");
        assert_eq!(at(951_782_400, 0), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn json_lines_carry_time_level_and_event_first() {
        let w = json_line("warning", serde_json::json!({"message": "m"}));
        assert_eq!(w["level"], "warning");
        assert_eq!(w["event"], "warning");
        assert_eq!(w["message"], "m");
        assert!(w["ts"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z') && t.len() == 24));
        assert_eq!(json_line("epoch", serde_json::json!({}))["level"], "info");
        assert_eq!(json_line("error", serde_json::json!({}))["level"], "error");
    }

    #[test]
    fn rates_and_durations_are_rounded_for_people() {
        assert_eq!(human_rate(2.5009), "2.50/s");
        assert_eq!(human_rate(27.46), "27.5/s");
        assert_eq!(human_rate(275.4), "275/s");
        assert_eq!(human_rate(84_123.7), "84,124/s");
        assert_eq!(human_rate(1_234_567.0), "1,234,567/s");
        assert_eq!(human_rate(f64::NAN), "-");
        assert_eq!(human_duration(0.42), "0.4s");
        assert_eq!(human_duration(42.4), "42s");
        assert_eq!(human_duration(185.0), "3m 05s");
        assert_eq!(human_duration(7_620.0), "2h 07m");
    }

    #[test]
    fn stages_name_what_they_count() {
        assert_eq!(unit_of("encoding"), "row");
        assert_eq!(unit_of("warmup"), "batch");
        assert_eq!(unit_of("scoring"), "pair");
    }
}
