//! `ncclean --version [--json]` identifies the build (version, git commit,
//! features, target), run.json and the labels record the same, and build.rs
//! says "unknown" outside a git checkout of this repository (a tarball).

mod common;

use std::path::Path;
use std::process::Command;

use common::{demo, ncclean, ok, p, quick_fit};
use ncclean::data::read_labels;

/// The commit a build of this checkout should report, found independently of
/// build.rs: `git rev-parse` when the crate root is the top of a git work
/// tree, else "unknown".
fn expected_commit() -> String {
    let root = env!("CARGO_MANIFEST_DIR");
    let git = |args: &[&str]| {
        Command::new("git")
            .arg("-C")
            .arg(root)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let top = git(&["rev-parse", "--show-toplevel"]);
    let is_top = top
        .is_some_and(|t| Path::new(&t).canonicalize().ok() == Path::new(root).canonicalize().ok());
    if !is_top {
        return "unknown".into();
    }
    git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into())
}

fn expected_features() -> Vec<&'static str> {
    let mut f = Vec::new();
    if cfg!(feature = "cuda") {
        f.push("cuda");
    }
    if cfg!(feature = "hub") {
        f.push("hub");
    }
    if cfg!(feature = "polars") {
        f.push("polars");
    }
    f
}

fn version_json() -> serde_json::Value {
    let out = ok(&["--version", "--json"]);
    serde_json::from_str(out.trim()).expect("--version --json prints one JSON object")
}

#[test]
fn version_names_version_commit_features_and_target() {
    // Where NCCLEAN_GIT_COMMIT was set for the build, it wins over git.
    let commit = std::env::var("NCCLEAN_GIT_COMMIT").unwrap_or_else(|_| expected_commit());
    let features = expected_features();
    let features_line = if features.is_empty() {
        "none".to_string()
    } else {
        features.join(", ")
    };
    for flag in ["--version", "-V"] {
        let text = ok(&[flag]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines.first().copied(),
            Some(format!("ncclean {}", env!("CARGO_PKG_VERSION")).as_str()),
            "{text}"
        );
        assert!(
            lines.contains(&format!("commit: {commit}").as_str()),
            "{text}"
        );
        assert!(
            lines.contains(&format!("features: {features_line}").as_str()),
            "{text}"
        );
        let target = lines.iter().find_map(|l| l.strip_prefix("target: "));
        assert!(
            target.is_some_and(
                |t| t.contains(std::env::consts::ARCH) && t.contains(std::env::consts::OS)
            ),
            "{text}"
        );
    }

    let j = version_json();
    assert_eq!(j["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(j["commit"], commit.as_str());
    assert_eq!(j["features"], serde_json::json!(features));
    let text = ok(&["--version"]);
    let target = j["target"].as_str().expect("target is a string");
    assert!(
        text.contains(&format!("target: {target}\n")),
        "{text} vs {j}"
    );
}

#[test]
fn json_needs_version_and_no_subcommand_is_usage() {
    let out = ncclean(&["--json"]);
    assert_eq!(out.status.code(), Some(2), "--json alone is a usage error");
    let out = ncclean(&[]);
    assert_eq!(out.status.code(), Some(2), "no subcommand is a usage error");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("ncclean --help"), "{err}");
}

#[test]
fn run_json_and_labels_record_the_build() {
    let tmp = tempfile::tempdir().unwrap();
    let data = demo(tmp.path(), 120);
    let run = tmp.path().join("run");
    let out = quick_fit(&data, &run, &["--method", "vanilla"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let build = version_json();

    let run_json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("run.json")).unwrap()).unwrap();
    assert_eq!(run_json["ncclean_build"], build, "run.json: {run_json}");

    let meta_build = |labels: &Path| -> serde_json::Value {
        let (_, meta) = read_labels(labels).unwrap();
        let s = meta
            .get("ncclean.build")
            .expect("labels record ncclean.build");
        serde_json::from_str(s).unwrap()
    };
    assert_eq!(meta_build(&run.join("labels.parquet")), build);

    let scored = tmp.path().join("scored.parquet");
    ok(&[
        "score",
        p(&data),
        "--checkpoint",
        p(&run),
        "--out",
        p(&scored),
    ]);
    assert_eq!(meta_build(&scored), build);

    // The filtered file says which build filtered it.
    let kept = tmp.path().join("kept.parquet");
    ok(&[
        "filter",
        p(&data),
        "--labels",
        p(&run.join("labels.parquet")),
        "--out",
        p(&kept),
    ]);
    let reader =
        parquet::file::reader::SerializedFileReader::new(std::fs::File::open(&kept).unwrap())
            .unwrap();
    use parquet::file::reader::FileReader;
    let kv = reader
        .metadata()
        .file_metadata()
        .key_value_metadata()
        .cloned()
        .unwrap_or_default();
    let filtered = kv
        .iter()
        .find(|e| e.key == "ncclean.build")
        .and_then(|e| e.value.clone())
        .expect("the filtered file records ncclean.build");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&filtered).unwrap(),
        build
    );
}

/// build.rs compiled on its own (std only) and run as cargo would, in a
/// copy of the crate root that is not a git checkout of its own but lies
/// inside another repository, as a tarball unpacked in a home directory
/// under git would.
#[test]
fn build_script_says_unknown_outside_a_checkout() {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let git_ok = Command::new("git").arg("--version").output().is_ok();
    if Command::new(&rustc).arg("--version").output().is_err() || !git_ok {
        eprintln!("skipped: rustc or git not on PATH");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let bin = tmp.path().join("build-script");
    let built = Command::new(&rustc)
        .args(["--edition", "2021", "-o"])
        .arg(&bin)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("build.rs"))
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    // An outer repository with a commit, and the "tarball" inside it.
    let outer = tmp.path().join("home");
    let crate_root = outer.join("ncclean-0.1.0");
    std::fs::create_dir_all(&crate_root).unwrap();
    std::fs::write(outer.join("notes.txt"), "x").unwrap();
    let git = |args: &[&str]| {
        let o = Command::new("git")
            .current_dir(&outer)
            .args(args)
            .env("GIT_AUTHOR_NAME", "t")
            .env("GIT_AUTHOR_EMAIL", "t@example.com")
            .env("GIT_COMMITTER_NAME", "t")
            .env("GIT_COMMITTER_EMAIL", "t@example.com")
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    };
    git(&["init", "-q"]);
    git(&["add", "notes.txt"]);
    git(&["commit", "-q", "-m", "outer"]);

    let run = |dir: &Path, commit_env: Option<&str>| -> String {
        let mut cmd = Command::new(&bin);
        cmd.env("CARGO_MANIFEST_DIR", dir)
            .env("TARGET", "x86_64-unknown-linux-gnu")
            .env("PROFILE", "release")
            .env_remove("NCCLEAN_GIT_COMMIT")
            .env_remove("GIT_DIR");
        if let Some(c) = commit_env {
            cmd.env("NCCLEAN_GIT_COMMIT", c);
        }
        let o = cmd.output().unwrap();
        assert!(o.status.success());
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let out = run(&crate_root, None);
    assert!(
        out.contains("cargo:rustc-env=NCCLEAN_GIT_COMMIT=unknown\n"),
        "inside another repository: {out}"
    );
    assert!(out.contains("cargo:rustc-env=NCCLEAN_TARGET=x86_64-unknown-linux-gnu\n"));
    // The outer repository's own root does report its commit.
    let out = run(&outer, None);
    let commit = out
        .lines()
        .find_map(|l| l.strip_prefix("cargo:rustc-env=NCCLEAN_GIT_COMMIT="))
        .unwrap();
    assert_eq!(commit.len(), 12, "{out}");
    assert!(commit.chars().all(|c| c.is_ascii_hexdigit()), "{out}");
    // A packager names the commit.
    let out = run(&crate_root, Some("0123abcd"));
    assert!(
        out.contains("cargo:rustc-env=NCCLEAN_GIT_COMMIT=0123abcd\n"),
        "{out}"
    );
}
