//! Snapshot tests of what a user sees when a command fails, in the style
//! of `insta` but without the dependency: the exit code and stderr, with
//! temporary paths replaced by `[TMP]`, compared with a committed file
//! `tests/snapshots/<name>.snap`.
//!
//! A missing snapshot is written (and the test passes) so that a new test
//! records its first output; under `CI` a missing snapshot fails instead,
//! so snapshots must be committed. `UPDATE_SNAPSHOTS=1` rewrites every
//! snapshot a run compares; review the diff before committing it.

use std::path::{Path, PathBuf};
use std::process::Output;

/// `exit code: N`, then stderr with every spelling of `tmp` replaced by
/// `[TMP]`.
pub fn render(out: &Output, tmp: &Path) -> String {
    let code = out.status.code().map_or_else(
        || "none (killed by a signal)".to_string(),
        |c| c.to_string(),
    );
    let mut stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    // The canonical form first: it may extend the given one (/tmp → /private/tmp).
    let mut spellings = vec![tmp.to_string_lossy().into_owned()];
    if let Ok(c) = tmp.canonicalize() {
        spellings.insert(0, c.to_string_lossy().into_owned());
    }
    for s in spellings.iter().filter(|s| !s.is_empty()) {
        stderr = stderr.replace(s.as_str(), "[TMP]");
    }
    format!("exit code: {code}\n--- stderr\n{stderr}")
}

fn snapshot_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("snapshots")
        .join(format!("{name}.snap"))
}

/// Messages are for people: no Rust Debug output, panics or backtraces.
fn assert_readable(name: &str, rendered: &str) {
    for bad in [
        "panicked at",
        "stack backtrace",
        "RUST_BACKTRACE",
        "Os { code",
        "kind: ",
        "Error {",
        "Custom {",
    ] {
        assert!(
            !rendered.contains(bad),
            "snapshot {name}: the message contains {bad:?}, which is not for users:\n{rendered}"
        );
    }
}

/// Compare the rendered `out` with `tests/snapshots/<name>.snap` (see the
/// module documentation for when it is written instead).
pub fn assert_snapshot(name: &str, out: &Output, tmp: &Path) {
    let rendered = render(out, tmp);
    assert_readable(name, &rendered);
    let path = snapshot_path(name);
    let update = std::env::var_os("UPDATE_SNAPSHOTS").is_some_and(|v| v == "1");
    let expected = std::fs::read_to_string(&path).ok();
    match expected {
        Some(e) if e == rendered => {}
        Some(_) | None if update => write(&path, &rendered),
        None if std::env::var_os("CI").is_some() => panic!(
            "snapshot {} is missing; run the tests with UPDATE_SNAPSHOTS=1 and commit it. Got:\n{rendered}",
            path.display()
        ),
        None => write(&path, &rendered),
        Some(e) => panic!(
            "snapshot {} differs (rerun with UPDATE_SNAPSHOTS=1 to accept the new output)\n\
             --- expected\n{e}\n--- got\n{rendered}",
            path.display()
        ),
    }
}

fn write(path: &Path, rendered: &str) {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).expect("create tests/snapshots");
    }
    std::fs::write(path, rendered)
        .unwrap_or_else(|e| panic!("cannot write snapshot {}: {e}", path.display()));
}
