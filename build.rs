//! Records what identifies this build for `ncclean --version`, run.json and
//! the labels' metadata: the git commit (when built from a git checkout of
//! this repository; "unknown" from a tarball or a crate download), the target
//! triple and the profile. std only, so it adds nothing to the build.
//!
//! `NCCLEAN_GIT_COMMIT` set at build time wins: a packager building from a
//! tarball can still name the commit.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=NCCLEAN_GIT_COMMIT");
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let commit = match std::env::var("NCCLEAN_GIT_COMMIT") {
        Ok(c) if !c.trim().is_empty() => c.trim().to_string(),
        _ => git_commit(&manifest).unwrap_or_else(|| "unknown".to_string()),
    };
    println!("cargo:rustc-env=NCCLEAN_GIT_COMMIT={commit}");
    let target = std::env::var("TARGET").unwrap_or_else(|_| "unknown".to_string());
    println!("cargo:rustc-env=NCCLEAN_TARGET={target}");
    let profile = std::env::var("PROFILE").unwrap_or_else(|_| "unknown".to_string());
    println!("cargo:rustc-env=NCCLEAN_PROFILE={profile}");
}

/// The checked-out commit (12 hex digits), or None when `manifest` is not
/// the top of a git work tree: a tarball unpacked inside some other
/// repository must not report that repository's commit. Uncommitted changes
/// are not flagged: tracking them would rebuild the crate on every edit.
fn git_commit(manifest: &Path) -> Option<String> {
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git")
            .arg("-C")
            .arg(manifest)
            .args(args)
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        Some(String::from_utf8(out.stdout).ok()?.trim().to_string())
    };
    let top = PathBuf::from(git(&["rev-parse", "--show-toplevel"])?);
    if top.canonicalize().ok()? != manifest.canonicalize().ok()? {
        return None;
    }
    let commit = git(&["rev-parse", "--short=12", "HEAD"])?;
    // Rerun when HEAD moves: a checkout changes HEAD, a commit the branch's
    // ref (a loose file, else packed-refs). In a worktree the git dir is not
    // `.git/`, hence --git-path. A watched file that does not exist would
    // rerun this script, and rebuild the crate, on every build.
    let mut watch = vec!["HEAD".to_string()];
    if let Some(head_ref) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watch.extend([head_ref, "packed-refs".to_string()]);
    }
    for file in watch {
        if let Some(path) = git(&["rev-parse", "--git-path", &file]) {
            let path = manifest.join(path);
            if path.exists() {
                println!("cargo:rerun-if-changed={}", path.display());
            }
        }
    }
    Some(commit)
}
