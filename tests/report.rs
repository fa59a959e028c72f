//! `ncclean report`: the page's sections, numbers, inlining and escaping,
//! and what headless Chromium actually draws of it.

mod common;

use std::collections::BTreeMap;
use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use arrow_array::{ArrayRef, BinaryArray, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use base64::Engine as _;
use common::{ncclean, noisy_demo_of, ok, p};
use ncclean::data::{write_labels, AtomicParquetWriter, LabelRow, RowStatus};

/// Fit a short vanilla run (one warm-up epoch, two divided ones) on 300
/// noisy demo pairs; returns the run directory.
fn fitted_run(dir: &Path) -> PathBuf {
    let data = noisy_demo_of(dir, 300);
    let run = dir.join("run");
    let out = ncclean(&[
        "fit",
        p(&data),
        "--out-dir",
        p(&run),
        "--method",
        "vanilla",
        "--epochs",
        "3",
        "--warmup-epochs",
        "1",
    ]);
    assert!(
        out.status.success(),
        "fit failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    run
}

/// Run `ncclean report` and return its summary and the page.
fn report(run: &Path, out: &Path, extra: &[&str]) -> (serde_json::Value, String) {
    let mut args = vec!["report", p(run), "--out", p(out)];
    args.extend_from_slice(extra);
    let summary: serde_json::Value = serde_json::from_str(ok(&args).trim()).unwrap();
    (summary, std::fs::read_to_string(out).unwrap())
}

/// The `data:` URIs of the page's `<img>` elements.
fn img_sources(html: &str) -> Vec<&str> {
    html.split("<img src=\"")
        .skip(1)
        .map(|s| &s[..s.find('"').unwrap()])
        .collect()
}

#[test]
fn report_of_a_fitted_run_is_one_self_contained_page() {
    let tmp = tempfile::tempdir().unwrap();
    let run = fitted_run(tmp.path());

    // fit recorded its division: the statistic of every pair, binned.
    let stats: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("stats.json")).unwrap()).unwrap();
    let counts = stats["division"]["histogram"]["counts"].as_array().unwrap();
    assert_eq!(
        counts.len(),
        ncclean::curation::division_record::STATISTIC_BINS
    );
    let binned: u64 = counts.iter().map(|c| c.as_u64().unwrap()).sum();
    assert_eq!(binned, stats["pairs"].as_u64().unwrap());
    assert_eq!(stats["division"]["division"]["kind"], "gmm");

    let (summary, html) = report(&run, &tmp.path().join("r.html"), &[]);
    assert_eq!(summary["scored"], 300);
    assert_eq!(summary["shown"], 24);
    assert_eq!(summary["pictures_missing"], 0);
    assert_eq!(summary["mixture_drawn"], true);

    for id in [
        "summary",
        "distributions",
        "training",
        "thresholds",
        "pairs-0",
        "pairs-1",
        "pairs-2",
    ] {
        assert!(
            html.contains(&format!("<section id=\"{id}\"")),
            "section {id}"
        );
    }
    // Three distributions and two training curves (loss, clean fraction).
    assert_eq!(html.matches("<svg ").count(), 5);
    assert!(html.contains("clean component") && html.contains("noisy component"));
    // fit's check against random pairings (all 300 pairs: fewer than the
    // sample's 1,024), as stats.json recorded it.
    let matched = stats["signal"]["matched_share"].as_f64().unwrap();
    assert!(
        html.contains(&format!(
            "{} of 300 sampled pairs score above 99% of random pairings",
            ncclean::curation::threshold::percent(matched)
        )),
        "no random-pairings fact"
    );
    // Nothing is fetched: no address, no script, no stylesheet link, and
    // every picture is inline.
    assert!(!html.contains("http"), "the page names an address");
    assert!(!html.contains("<script") && !html.contains("<link"));
    let images = img_sources(&html);
    assert_eq!(images.len(), 24);
    for src in images {
        let b64 = src.strip_prefix("data:image/jpeg;base64,").unwrap();
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap();
        let img = image::load_from_memory(&bytes).unwrap();
        assert!(img.width() <= 128 && img.height() <= 128);
    }
    // The default output lies in the run directory.
    ok(&["report", p(&run)]);
    assert!(run.join("report.html").is_file());
}

/// A run directory made by hand: labels with known probabilities, one
/// input parquet of `captions` (PNG images) unless `input` is false.
fn hand_made_run(dir: &Path, probs: &[Option<f32>], captions: &[&str], input: bool) -> PathBuf {
    let data = dir.join("pairs.parquet");
    if input {
        let png = |i: usize| {
            let img = image::RgbImage::from_fn(200, 100, |x, y| {
                image::Rgb([(x + i as u32 * 40) as u8, y as u8, 180])
            });
            let mut out = Vec::new();
            image::DynamicImage::ImageRgb8(img)
                .write_to(&mut Cursor::new(&mut out), image::ImageFormat::Png)
                .unwrap();
            out
        };
        let schema = Arc::new(Schema::new(vec![
            Field::new("key", DataType::Utf8, false),
            Field::new("image", DataType::Binary, false),
            Field::new("caption", DataType::Utf8, false),
        ]));
        let pngs: Vec<Vec<u8>> = (0..captions.len()).map(png).collect();
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(StringArray::from_iter_values(
                    (0..captions.len()).map(|i| format!("k{i}")),
                )) as ArrayRef,
                Arc::new(BinaryArray::from_iter_values(pngs.iter())),
                Arc::new(StringArray::from_iter_values(captions.iter())),
            ],
        )
        .unwrap();
        let mut w = AtomicParquetWriter::create(&data, schema, &BTreeMap::new()).unwrap();
        w.write(&batch).unwrap();
        w.finish().unwrap();
    }
    let run = dir.join("run");
    std::fs::create_dir_all(&run).unwrap();
    let rows: Vec<LabelRow> = probs
        .iter()
        .enumerate()
        .map(|(i, &prob)| LabelRow {
            key: format!("k{i}"),
            source_file: data.display().to_string(),
            source_row: i as u64,
            clean_prob: prob,
            soft_label: prob,
            similarity: prob.map(|p| p / 2.0),
            is_clean: prob.is_some_and(|p| p > 0.5),
            status: if prob.is_some() {
                RowStatus::Ok
            } else {
                RowStatus::Skipped
            },
            error: prob.is_none().then(|| "caption is empty".to_string()),
        })
        .collect();
    write_labels(&run.join("labels.parquet"), &rows, &BTreeMap::new()).unwrap();
    let run_json = serde_json::json!({
        "ncclean_version": "0.1.0", "method": "vanilla", "seed": 3,
        "config": {"threshold": 0.5},
        "columns": {"image": "image", "image_kind": "bytes", "caption": "caption", "key": "key"},
        "image_root": null,
        "image_limits": {"max_bytes": 1_000_000, "max_pixels": 1_000_000, "allow_absolute_paths": false},
        "inputs": [data.display().to_string()],
        "complete": true,
    });
    std::fs::write(run.join("run.json"), run_json.to_string()).unwrap();
    let stats = serde_json::json!({"epochs": [
        {"epoch": 1, "phase": "warmup", "loss": 0.5, "clean_fraction": null, "pairs": 6},
        {"epoch": 2, "phase": "train", "loss": 0.3, "clean_fraction": 0.7, "pairs": 6},
    ]});
    std::fs::write(run.join("stats.json"), stats.to_string()).unwrap();
    run
}

/// Six probabilities (and one skipped row) whose cuts are worked out by
/// hand below.
const PROBS: [Option<f32>; 7] = [
    Some(0.9),
    Some(0.2),
    Some(0.6),
    Some(0.6),
    Some(1.0),
    Some(0.1),
    None,
];

/// The table row of `rule`, as one string.
fn table_row<'a>(html: &'a str, rule: &str) -> &'a str {
    let start = html
        .find(&format!("<tr><td>{rule}</td>"))
        .unwrap_or_else(|| panic!("no row for {rule}"));
    let row = &html[start..];
    &row[..row.find("</tr>").unwrap() + 5]
}

#[test]
fn threshold_table_matches_hand_computed_cuts() {
    let tmp = tempfile::tempdir().unwrap();
    let captions = ["a"; 7];
    let run = hand_made_run(tmp.path(), &PROBS, &captions, true);
    let (summary, html) = report(&run, &tmp.path().join("r.html"), &["--per-group", "2"]);
    assert_eq!(
        (summary["rows"].as_u64(), summary["scored"].as_u64()),
        (Some(7), Some(6))
    );
    // Sorted: 1.0 0.9 0.6 0.6 0.2 0.1; sum 3.4, estimated noise 2.6.
    // Top 50% = 3 pairs, whose cut falls inside the tie at 0.6; its pairs
    // are equal in similarity too (p / 2), so it keeps both: 4 kept, precision
    // 3.1/4, the removed 0.2 and 0.1 hold 1.7 of the 2.6 noise.
    assert_eq!(
        table_row(&html, "keep the top 50%"),
        "<tr><td>keep the top 50%</td><td>clean_prob &gt; 0.6, or = 0.6 with similarity &gt;= 0.3000</td><td>4 of 6</td><td>66.7%</td><td>77.5%</td><td>65.4%</td></tr>"
    );
    // Top 80% = round(4.8) = 5 pairs, cut 0.2: precision 3.3/5, the
    // removed 0.1 holds 0.9 of 2.6.
    assert_eq!(
        table_row(&html, "keep the top 80%"),
        "<tr><td>keep the top 80%</td><td>clean_prob &gt;= 0.2000</td><td>5 of 6</td><td>83.3%</td><td>66.0%</td><td>34.6%</td></tr>"
    );
    assert_eq!(
        table_row(&html, "keep the top 100%"),
        "<tr><td>keep the top 100%</td><td>clean_prob &gt;= 0.1000</td><td>6 of 6</td><td>100.0%</td><td>56.7%</td><td>0.0%</td></tr>"
    );
    // The run's own threshold, 0.5, keeps the same four.
    assert_eq!(
        table_row(&html, "clean_prob &gt;= 0.5"),
        "<tr><td>clean_prob &gt;= 0.5</td><td>clean_prob &gt;= 0.5000</td><td>4 of 6</td><td>66.7%</td><td>77.5%</td><td>65.4%</td></tr>"
    );
    // Two pairs a group: lowest 0.1, 0.2; highest 1.0, 0.9; the 0.6 pair
    // nearest 0.5 (the earlier of the tie) and the other 0.6.
    let probs_in = |group: &str| -> Vec<String> {
        let start = html.find(&format!("<section id=\"{group}\"")).unwrap();
        let section = &html[start..start + html[start..].find("</section>").unwrap()];
        section
            .split("<div class=\"prob\">clean_prob ")
            .skip(1)
            .map(|s| s[..5].to_string())
            .collect()
    };
    assert_eq!(probs_in("pairs-0"), ["0.100", "0.200"]);
    assert_eq!(probs_in("pairs-1"), ["0.600", "0.600"]);
    assert_eq!(probs_in("pairs-2"), ["1.000", "0.900"]);
    assert_eq!(img_sources(&html).len(), 6);
    // No division record in this stats.json: said, not drawn.
    assert_eq!(summary["mixture_drawn"], false);
    assert!(html.contains("holds no division record"));
}

#[test]
fn captions_are_escaped() {
    let tmp = tempfile::tempdir().unwrap();
    let evil = "<script>alert('x')</script> & <img src=x onerror=alert(1)>";
    let captions = ["a", evil, "b", "c", "d", "e", "f"];
    let run = hand_made_run(tmp.path(), &PROBS, &captions, true);
    let (_, html) = report(&run, &tmp.path().join("r.html"), &["--per-group", "2"]);
    // Row 1 (0.2) is among the most suspicious.
    assert!(html.contains(
        "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &lt;img src=x onerror=alert(1)&gt;"
    ));
    assert!(!html.contains("<script") && !html.contains("<img src=x"));
}

#[test]
fn a_run_whose_input_is_gone_still_renders_and_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let run = hand_made_run(tmp.path(), &PROBS, &[], false);
    let (summary, html) = report(&run, &tmp.path().join("r.html"), &["--per-group", "2"]);
    assert_eq!(summary["pictures_missing"], 6);
    assert!(img_sources(&html).is_empty());
    assert!(
        html.contains("6 of 6 pictures could not be shown"),
        "no note"
    );
    assert!(html.contains("is no longer readable here"));
    assert!(html.contains("<section id=\"thresholds\""));
}

#[test]
fn report_refuses_what_is_not_a_finished_run() {
    let tmp = tempfile::tempdir().unwrap();
    let out = ncclean(&["report", p(tmp.path())]);
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not an ncclean run directory"), "{err}");
    assert!(!tmp.path().join("report.html").exists());

    let run = hand_made_run(tmp.path(), &PROBS, &[], false);
    let out = ncclean(&["report", p(&run), "--per-group", "0"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--per-group must be between 1 and 100"),
        "{err}"
    );
}

/// The headless Chromium here, if any (`NCCLEAN_CHROMIUM` names another).
fn chromium() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("NCCLEAN_CHROMIUM") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).find_map(|dir| {
        ["chromium", "chromium-browser", "google-chrome"]
            .iter()
            .map(|n| dir.join(n))
            .find(|c| c.is_file())
    })
}

/// Render `html` to a PNG of `w` × `h` CSS pixels.
fn screenshot(browser: &Path, html: &Path, png: &Path, w: u32, h: u32) -> image::RgbImage {
    let out = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--force-device-scale-factor=1",
            &format!("--screenshot={}", png.display()),
            &format!("--window-size={w},{h}"),
            &format!("file://{}", html.display()),
        ])
        .output()
        .unwrap();
    assert!(
        png.is_file(),
        "chromium wrote no screenshot: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    image::open(png).unwrap().to_rgb8()
}

fn near(p: &image::Rgb<u8>, c: plotters::style::RGBColor, tol: i32) -> bool {
    let d = |a: u8, b: u8| (i32::from(a) - i32::from(b)).abs();
    d(p[0], c.0) <= tol && d(p[1], c.1) <= tol && d(p[2], c.2) <= tol
}

/// What a screenshot of a report shows.
#[derive(Debug)]
struct Seen {
    /// Pixels that are (nearly) white.
    white: usize,
    /// Pixels of the histogram bars' colour.
    bar_pixels: usize,
    /// Bar pixels in the left and in the right half of the page.
    bars_left: bool,
    bars_right: bool,
    /// Vertical bands (gaps over 40 rows apart) holding bar pixels.
    bands: usize,
    /// Pixels of the clean and the noisy component's colour among the charts.
    clean_curve: usize,
    noisy_curve: usize,
    /// Tinted pixels below the charts, where the pictures are.
    tinted_below: usize,
}

fn look(img: &image::RgbImage) -> Seen {
    let (w, h) = img.dimensions();
    let all = |y0: u32, y1: u32| (y0..y1).flat_map(move |y| (0..w).map(move |x| (x, y)));
    let bar_at = |x: u32, y: u32| near(img.get_pixel(x, y), ncclean::report::BAR, 6);
    let rows_with_bars: Vec<u32> = (0..h).filter(|&y| (0..w).any(|x| bar_at(x, y))).collect();
    let last_bar = rows_with_bars.last().copied().unwrap_or(0);
    let curve = |c| {
        all(0, last_bar + 1)
            .filter(|&(x, y)| near(img.get_pixel(x, y), c, 40))
            .count()
    };
    Seen {
        white: img
            .pixels()
            .filter(|p| p.0.iter().all(|&v| v > 245))
            .count(),
        bar_pixels: all(0, h).filter(|&(x, y)| bar_at(x, y)).count(),
        bars_left: all(0, h).any(|(x, y)| x < w / 2 && bar_at(x, y)),
        bars_right: all(0, h).any(|(x, y)| x >= w / 2 && bar_at(x, y)),
        bands: usize::from(!rows_with_bars.is_empty())
            + rows_with_bars
                .windows(2)
                .filter(|p| p[1] - p[0] > 40)
                .count(),
        clean_curve: curve(ncclean::report::CLEAN),
        noisy_curve: curve(ncclean::report::NOISY),
        tinted_below: all((last_bar + 400).min(h), h)
            .filter(|&(x, y)| {
                let p = img.get_pixel(x, y).0;
                p.iter().max().unwrap() - p.iter().min().unwrap() >= 8
            })
            .count(),
    }
}

#[test]
fn report_screenshot_shows_charts_and_pictures() {
    let Some(browser) = chromium() else {
        eprintln!(
            "skipping the report screenshot test: no chromium on PATH \
             (apt-get install chromium, or set NCCLEAN_CHROMIUM)"
        );
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let run = fitted_run(tmp.path());
    let page = tmp.path().join("r.html");
    report(&run, &page, &[]);
    let (w, h) = (1280u32, 3000u32);
    let img = screenshot(&browser, &page, &tmp.path().join("shot.png"), w, h);
    assert_eq!(img.dimensions(), (w, h));
    let seen = look(&img);
    eprintln!("screenshot: {seen:?}");
    assert!(
        seen.white < (w * h) as usize * 97 / 100,
        "the page is (nearly) blank: {seen:?}"
    );
    // The clean_prob and similarity histograms side by side, the
    // statistic's histogram below them.
    assert!(seen.bars_left && seen.bars_right, "{seen:?}");
    assert!(seen.bands >= 2 && seen.bar_pixels > 2000, "{seen:?}");
    // The fitted components over the statistic's histogram.
    assert!(seen.clean_curve > 30 && seen.noisy_curve > 30, "{seen:?}");
    // Pictures below the charts: the demo's backgrounds are pastels (each
    // channel a grey ± 15) under coloured shapes, where the page's text and
    // borders are neutral greys. 24 thumbnails of 64 × 64 pixels.
    let pictures = 24 * 64 * 64;
    assert!(seen.tinted_below > pictures / 4, "{seen:?}");

    // The same page without its pictures (the input moved away) has none
    // of that tint: the measure sees the pictures, not the text.
    std::fs::rename(
        tmp.path().join("noisy.parquet"),
        tmp.path().join("moved.parquet"),
    )
    .unwrap();
    report(&run, &page, &[]);
    let bare = look(&screenshot(
        &browser,
        &page,
        &tmp.path().join("bare.png"),
        w,
        h,
    ));
    eprintln!("without pictures: {bare:?}");
    assert!(bare.tinted_below < pictures / 40, "{bare:?}");
    assert!(bare.bands >= 2, "{bare:?}");
}

#[test]
fn fit_warnings_lead_the_page() {
    let tmp = tempfile::tempdir().unwrap();
    let run = hand_made_run(tmp.path(), &PROBS, &[], false);
    let (_, html) = report(&run, &tmp.path().join("r.html"), &[]);
    assert!(!html.contains("fit warned") && !html.contains("random pairings"));
    let stats = serde_json::json!({
        "epochs": [],
        "warnings": ["noise understated: 52% of 6 pairs <score> like random pairings"],
        "signal": {"pairs": 6, "auroc": 0.68, "matched_share": 0.074,
                   "random_like_share": 0.52},
    });
    std::fs::write(run.join("stats.json"), stats.to_string()).unwrap();
    let (_, html) = report(&run, &tmp.path().join("r.html"), &[]);
    let warned = html
        .find("<p class=\"note\">fit warned: noise understated: 52% of 6 pairs &lt;score&gt;")
        .expect("the warning is a note, escaped");
    // Before the other notes (here: the missing division record).
    assert!(warned < html.find("holds no division record").unwrap());
    assert!(html.contains(
        "7.4% of 6 sampled pairs score above 99% of random pairings of the same images and \
         captions (chance: 1%); 52% score like them"
    ));
    // A stats.json whose warnings are not strings still renders, without them.
    let stats = serde_json::json!({"epochs": [], "warnings": [3]});
    std::fs::write(run.join("stats.json"), stats.to_string()).unwrap();
    let (_, html) = report(&run, &tmp.path().join("r.html"), &[]);
    assert!(!html.contains("fit warned"));
}

#[test]
fn a_division_that_fell_back_is_said_and_not_drawn() {
    let tmp = tempfile::tempdir().unwrap();
    let run = hand_made_run(tmp.path(), &PROBS, &[], false);
    let record = |mixture: serde_json::Value, fallback: serde_json::Value| {
        serde_json::json!({"epochs": [], "division": {
            "statistic": null,
            "division": {"kind": "bmm", "side": "low_mean",
                         "normaliser": {"min": 0.0, "max": 2.0}, "mixture": mixture,
                         "clean_component": 0, "fallback": fallback,
                         "iterations": 10, "converged": true},
            "histogram": {"lo": 0.0, "hi": 1.0, "counts": [3, 0, 1, 2]},
        }})
    };
    std::fs::write(
        run.join("stats.json"),
        record(serde_json::Value::Null, serde_json::json!("constant")).to_string(),
    )
    .unwrap();
    let (summary, html) = report(&run, &tmp.path().join("r.html"), &[]);
    assert_eq!(summary["mixture_drawn"], false);
    assert!(
        html.contains("Every pair had the same statistic"),
        "no note"
    );
    assert!(html.contains("division statistic and the fitted mixture"));
    assert!(!html.contains("clean component"));
    // The same record with a fitted Beta mixture draws both components.
    let bmm = serde_json::json!({"kind": "bmm", "weights": [0.7, 0.3],
                                 "alphas": [2.0, 5.0], "betas": [5.0, 2.0]});
    std::fs::write(
        run.join("stats.json"),
        record(bmm, serde_json::Value::Null).to_string(),
    )
    .unwrap();
    let (summary, html) = report(&run, &tmp.path().join("r.html"), &[]);
    assert_eq!(summary["mixture_drawn"], true);
    assert!(html.contains("Two-component Beta mixture"));
    assert!(html.contains("clean component") && html.contains("noisy component"));
}
