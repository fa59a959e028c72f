//! The report page: plain data in, one self-contained HTML document out
//! (styles inline, charts as inline SVG, pictures as data URIs; nothing is
//! fetched when it is opened).

use std::fmt::Write as _;

use crate::curation::threshold::Cut;

/// Everything the page shows, already computed.
#[derive(Debug, Clone, Default)]
pub struct Page {
    /// Heading.
    pub title: String,
    /// Label–value lines of the summary.
    pub facts: Vec<(String, String)>,
    /// Things the reader should know (an unreadable input, no mixture).
    pub notes: Vec<String>,
    /// Distribution charts (inline SVG), with a sentence under each.
    pub distributions: Vec<Chart>,
    /// Training-curve charts.
    pub curves: Vec<Chart>,
    /// The threshold table's rows.
    pub cuts: Vec<Cut>,
    /// The groups of example pairs.
    pub groups: Vec<Group>,
}

/// One chart and its explanation.
#[derive(Debug, Clone)]
pub struct Chart {
    /// An `<svg>` element.
    pub svg: String,
    /// One sentence under it.
    pub caption: String,
}

/// A group of example pairs.
#[derive(Debug, Clone)]
pub struct Group {
    /// Section heading.
    pub title: String,
    /// What the group is.
    pub about: String,
    /// Its pairs.
    pub pairs: Vec<Example>,
}

/// One example pair.
#[derive(Debug, Clone)]
pub struct Example {
    /// The pair's key.
    pub key: String,
    /// Its clean probability.
    pub clean_prob: f32,
    /// Its similarity.
    pub similarity: Option<f32>,
    /// The caption, or why it could not be read.
    pub caption: Result<String, String>,
    /// A data URI of the thumbnail, or why there is none.
    pub image: Result<String, String>,
}

/// Escape text for HTML element content and quoted attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const STYLE: &str = "
body{font-family:sans-serif;margin:24px;color:#222;max-width:1200px}
h1{font-size:24px;margin:0 0 8px}h2{font-size:19px;margin:28px 0 8px;border-bottom:1px solid #ccc}
.facts td{padding:1px 14px 1px 0}.note{background:#fff4d6;border-left:4px solid #e0a800;padding:6px 10px;margin:6px 0}
.charts{display:flex;flex-wrap:wrap;gap:16px}.chart{width:560px;margin:0}.chart p{font-size:13px;margin:4px 0 0;color:#555}
table.cuts{border-collapse:collapse;font-size:14px}table.cuts td,table.cuts th{border:1px solid #ccc;padding:3px 10px;text-align:right}
table.cuts td:first-child,table.cuts th:first-child{text-align:left}
.pairs{display:flex;flex-wrap:wrap;gap:8px}.pair{width:140px;font-size:12px;border:1px solid #ddd;padding:5px}
.pair img{display:block;max-width:128px;max-height:128px;margin:0 auto 4px}
.missing{width:128px;height:64px;background:#eee;color:#777;font-size:11px;overflow:hidden;margin:0 auto 4px}
.prob{font-weight:bold}.cap{overflow-wrap:anywhere}.key{color:#777;overflow-wrap:anywhere}
";

/// Render `page` as a complete HTML document.
pub fn render(page: &Page) -> String {
    let mut h = String::new();
    let title = escape(&page.title);
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>{title}</title><style>{STYLE}</style></head><body>\n<h1>{title}</h1>\n"
    );
    h.push_str("<section id=\"summary\"><table class=\"facts\">");
    for (k, v) in &page.facts {
        let _ = write!(h, "<tr><td>{}</td><td>{}</td></tr>", escape(k), escape(v));
    }
    h.push_str("</table>");
    for n in &page.notes {
        let _ = write!(h, "<p class=\"note\">{}</p>", escape(n));
    }
    h.push_str("</section>\n");
    charts(
        &mut h,
        "distributions",
        "Distributions",
        &page.distributions,
    );
    charts(&mut h, "training", "Training", &page.curves);
    cuts(&mut h, &page.cuts);
    for (i, g) in page.groups.iter().enumerate() {
        group(&mut h, i, g);
    }
    h.push_str("</body></html>\n");
    h
}

fn charts(h: &mut String, id: &str, title: &str, charts: &[Chart]) {
    let _ = write!(h, "<section id=\"{id}\"><h2>{title}</h2>");
    if charts.is_empty() {
        h.push_str("<p>Nothing recorded.</p>");
    }
    h.push_str("<div class=\"charts\">");
    for c in charts {
        // The SVG comes from our own plotting code, which escapes its text.
        let _ = write!(
            h,
            "<figure class=\"chart\">{}<p>{}</p></figure>",
            c.svg,
            escape(&c.caption)
        );
    }
    h.push_str("</div></section>\n");
}

fn cuts(h: &mut String, cuts: &[Cut]) {
    h.push_str(
        "<section id=\"thresholds\"><h2>Thresholds</h2>\
         <p>What each cut keeps, reading <code>clean_prob</code> as a calibrated probability: \
         the expected precision is the mean <code>clean_prob</code> of the kept pairs, the \
         noise removed the share of the estimated noise (the sum of \
         <code>1 - clean_prob</code>) held by the removed pairs.</p>\
         <table class=\"cuts\"><tr><th>rule</th><th>keeps</th><th>kept pairs</th>\
         <th>kept fraction</th><th>expected precision</th><th>noise removed</th></tr>",
    );
    for c in cuts {
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{} of {}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&c.rule.to_string()),
            escape(&c.condition()),
            c.kept,
            c.scored,
            pct(c.kept_fraction()),
            pct(c.expected_precision),
            pct(c.expected_noise_removed),
        );
    }
    h.push_str("</table></section>\n");
}

/// A share as a percentage with one decimal; adding 0 turns the -0 of an
/// empty float sum into 0, so nothing reads "-0.0%".
fn pct(x: f64) -> String {
    format!("{:.1}%", 100.0 * x + 0.0)
}

fn group(h: &mut String, i: usize, g: &Group) {
    let _ = write!(
        h,
        "<section id=\"pairs-{i}\" class=\"group\"><h2>{}</h2><p>{}</p><div class=\"pairs\">",
        escape(&g.title),
        escape(&g.about)
    );
    if g.pairs.is_empty() {
        h.push_str("<p>No pairs.</p>");
    }
    for p in &g.pairs {
        h.push_str("<div class=\"pair\">");
        match &p.image {
            Ok(uri) => {
                let _ = write!(h, "<img src=\"{}\" alt=\"\">", escape(uri));
            }
            Err(why) => {
                let _ = write!(
                    h,
                    "<div class=\"missing\">no picture: {}</div>",
                    escape(why)
                );
            }
        }
        let _ = write!(
            h,
            "<div class=\"prob\">clean_prob {:.3}</div>",
            p.clean_prob
        );
        if let Some(s) = p.similarity {
            let _ = write!(h, "<div>similarity {s:.3}</div>");
        }
        match &p.caption {
            Ok(c) => {
                let _ = write!(h, "<div class=\"cap\">{}</div>", escape(c));
            }
            Err(why) => {
                let _ = write!(
                    h,
                    "<div class=\"cap missing-cap\">caption unavailable: {}</div>",
                    escape(why)
                );
            }
        }
        let _ = write!(h, "<div class=\"key\">{}</div></div>", escape(&p.key));
    }
    h.push_str("</div></section>\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_covers_markup_and_quotes() {
        assert_eq!(
            escape("<script>alert('x')</script> & \"y\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;y&quot;"
        );
        assert_eq!(escape("plain ünïcode"), "plain ünïcode");
    }

    #[test]
    fn a_page_escapes_every_text_it_is_given() {
        let page = Page {
            title: "run <b>".into(),
            facts: vec![("method".into(), "<i>".into())],
            notes: vec!["<u>".into()],
            groups: vec![Group {
                title: "<h>".into(),
                about: "a".into(),
                pairs: vec![Example {
                    key: "<k>".into(),
                    clean_prob: 0.25,
                    similarity: None,
                    caption: Ok("<script>alert(1)</script>".into()),
                    image: Err("<gone>".into()),
                }],
            }],
            ..Page::default()
        };
        let html = render(&page);
        for raw in ["<b>", "<i>", "<u>", "<h>", "<k>", "<script>", "<gone>"] {
            assert!(!html.contains(raw), "{raw} unescaped");
        }
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(html.contains("clean_prob 0.250"));
    }
}
