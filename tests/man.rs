//! `ncclean man [SUBCOMMAND]`: man pages generated from the clap definitions
//! that groff renders without a warning.

mod common;

use std::process::{Command, Stdio};

use common::{ncclean, ok};

/// `groff -man -Tutf8 -ww` of `page`: (rendered text, warnings), or None
/// when groff is not installed.
fn groff(page: &str) -> Option<(String, String)> {
    use std::io::Write;
    let mut child = Command::new("groff")
        .args(["-man", "-Tutf8", "-ww"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .ok()?;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(page.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "groff failed");
    Some((
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

#[test]
fn man_pages_render_without_warnings() {
    let page = ok(&["man"]);
    assert!(
        page.starts_with(".ie") || page.contains(".TH ncclean 1"),
        "{}",
        &page[..200.min(page.len())]
    );
    assert!(page.contains(".TH ncclean 1"), "not a section-1 page");
    let fit = ok(&["man", "fit"]);
    assert!(
        fit.contains(".TH ncclean-fit 1"),
        "{}",
        &fit[..300.min(fit.len())]
    );
    assert!(
        fit.contains("target\\-precision"),
        "fit's page lacks its flags"
    );

    let Some((text, warnings)) = groff(&page) else {
        eprintln!(
            "skipped the rendering check: groff is not installed (apt-get install groff-base)"
        );
        return;
    };
    assert_eq!(warnings, "", "groff warns about ncclean(1)");
    for sub in ["fit", "score", "filter", "completions", "man"] {
        assert!(
            text.contains(&format!("ncclean-{sub}(1)")),
            "ncclean(1) lacks {sub}:\n{text}"
        );
    }
    for sub in ["fit", "score", "filter", "report", "eval", "inspect"] {
        let (_, warnings) = groff(&ok(&["man", sub])).unwrap();
        assert_eq!(warnings, "", "groff warns about ncclean-{sub}(1)");
    }
}

#[test]
fn man_of_an_unknown_subcommand_lists_the_pages() {
    let out = ncclean(&["man", "fitt"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("fit") && err.contains("score"), "{err}");
}
