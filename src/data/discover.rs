//! Input discovery: what the paths a user typed (files, directories, globs)
//! expand to.
//!
//! The rules, the same for every command:
//! - A path to a file is read as given, whatever its name (even a dotfile).
//! - A directory is read as its `*.tar` shards if it has any, else its
//!   `*.parquet` files (img2dataset's webdataset output puts a metadata
//!   parquet with no images beside each tar). With `--recursive` its
//!   subdirectories are searched too, and the tar-over-parquet choice is made
//!   over the whole tree.
//! - A glob may have wildcards in any path component (`dir*/0000?.parquet`,
//!   `shards/**/*.tar`); a match that is a directory expands as a directory.
//! - Hidden entries (names starting with `.`) are skipped by directory
//!   expansion and by wildcards alike; a glob component that itself starts
//!   with a literal `.` names them on purpose.
//! - Matches are sorted by path, so the row order does not depend on the
//!   file system's listing order, and a file reached twice is an error (its
//!   rows would count twice).

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::error::{invalid, Result};

/// How the given paths are searched.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Discovery {
    /// Search directories' subdirectories too (`--recursive`).
    pub recursive: bool,
}

/// Files named by the user, in the order given; each directory and glob
/// expands to its matches sorted by path (see the module doc for the rules).
pub(crate) fn expand_inputs(inputs: &[PathBuf], how: Discovery) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for input in inputs {
        let text = input.to_string_lossy();
        // An existing path is itself, even with `[` or `*` in its name.
        if !input.exists() && is_glob(&text) {
            let matches = glob_matches(input, how)?;
            if matches.is_empty() {
                return Err(invalid(format!(
                    "{}: no files match; expected parquet files or tar shards{}",
                    input.display(),
                    hidden_hint(input)
                )));
            }
            out.extend(matches);
        } else if input.is_dir() {
            out.extend(directory(input, how)?);
        } else if input.exists() {
            out.push(input.clone());
        } else {
            return Err(invalid(format!(
                "{}: no such file or directory; expected a parquet file or tar shard, a directory of them or a glob",
                input.display()
            )));
        }
    }
    let mut seen = HashSet::new();
    for p in &out {
        let id = std::fs::canonicalize(p).unwrap_or_else(|_| p.clone());
        if !seen.insert(id) {
            return Err(invalid(format!(
                "{}: given more than once (directly, or through a directory or glob); each input file may appear only once",
                p.display()
            )));
        }
    }
    Ok(out)
}

/// Whether `path` has glob syntax the `glob` crate would interpret.
fn is_glob(path: &str) -> bool {
    path.contains(['*', '?', '['])
}

/// The inputs a glob names: its file matches, and the data files of its
/// directory matches.
fn glob_matches(pattern: &Path, how: Discovery) -> Result<Vec<PathBuf>> {
    let text = pattern.to_string_lossy();
    // The glob crate's own leading-dot rule also refuses `.*` and hidden
    // literal directories, so hidden entries are judged by `names_hidden`.
    let options = glob::MatchOptions {
        case_sensitive: true,
        require_literal_separator: true,
        require_literal_leading_dot: false,
    };
    let paths = glob::glob_with(&text, options).map_err(|e| {
        invalid(format!(
            "{}: not a valid glob ({}, at character {}); quote wildcards so the shell leaves them, and write [[] for a literal [",
            pattern.display(),
            e.msg,
            e.pos + 1
        ))
    })?;
    let mut files = Vec::new();
    let mut dirs = Vec::new();
    for entry in paths {
        let path =
            entry.map_err(|e| anyhow::anyhow!("listing {}: {}", e.path().display(), e.error()))?;
        if wildcard_reaches_hidden(pattern, &path) {
            continue;
        }
        if path.is_dir() {
            dirs.push(path);
        } else if path.is_file() {
            files.push(path);
        }
    }
    files.sort();
    dirs.sort();
    for dir in dirs {
        // A directory matched by a glob is named on purpose, but may hold
        // no data files (`runs/*` also matching a scratch folder): only an
        // error when nothing at all matched.
        if let Ok(found) = directory(&dir, how) {
            files.extend(found);
        }
    }
    Ok(files)
}

/// The data files in `dir`: its tar shards if any, else its parquet files;
/// with `how.recursive`, over its whole tree of non-hidden subdirectories.
fn directory(dir: &Path, how: Discovery) -> Result<Vec<PathBuf>> {
    let mut tars = Vec::new();
    let mut parquets = Vec::new();
    let depth = if how.recursive { usize::MAX } else { 1 };
    let walk = walkdir::WalkDir::new(dir)
        .min_depth(1)
        .max_depth(depth)
        .follow_links(true)
        .sort_by_file_name()
        .into_iter()
        .filter_entry(|e| !is_hidden(e.file_name()));
    for entry in walk {
        let entry = entry.with_context(|| format!("listing {}", dir.display()))?;
        if !entry.file_type().is_file() {
            continue;
        }
        let name = entry.file_name().to_string_lossy().to_ascii_lowercase();
        if name.ends_with(".tar") {
            tars.push(entry.into_path());
        } else if name.ends_with(".parquet") {
            parquets.push(entry.into_path());
        }
    }
    let mut found = if tars.is_empty() { parquets } else { tars };
    found.sort();
    if found.is_empty() {
        let deeper = if how.recursive {
            ""
        } else if has_subdirectory(dir) {
            "; it has subdirectories: add --recursive to search them"
        } else {
            ""
        };
        return Err(invalid(format!(
            "{}: directory has no *.parquet or *.tar files{deeper}",
            dir.display()
        )));
    }
    Ok(found)
}

/// The length of the data file `path`, which must be a regular file (or a
/// link to one): a pipe, device or socket cannot be read as a parquet file
/// or a tar shard (both are read by seeking), and its length says nothing,
/// so it is named for what it is.
pub(crate) fn regular_file_len(path: &Path) -> Result<u64> {
    let meta = std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
    if meta.is_file() {
        return Ok(meta.len());
    }
    let what = file_kind(&meta.file_type());
    Err(invalid(format!(
        "{}: is {what}, not a regular file; give a parquet file or tar shard on disk \
         (copy a stream to a file first)",
        path.display()
    )))
}

/// `files` without the empty ones (0 rows), each named in a warning: a
/// multi-shard dataset may hold empty shards (img2dataset writes one when
/// every download of a shard fails), and they must not stop the others.
/// When every file is empty, the first one's path is the error.
pub(crate) fn skip_empty<F>(
    files: Vec<F>,
    rows: impl Fn(&F) -> usize,
    path: impl Fn(&F) -> &Path,
) -> std::result::Result<Vec<F>, PathBuf> {
    if files.iter().all(|f| rows(f) == 0) {
        return Err(files
            .first()
            .map(|f| path(f).to_path_buf())
            .unwrap_or_default());
    }
    Ok(files
        .into_iter()
        .filter(|f| {
            let empty = rows(f) == 0;
            if empty {
                crate::runtime::progress::warn_once(&EmptyShard(path(f)).to_string());
            }
            !empty
        })
        .collect())
}

/// The warning for an empty shard that is passed over.
pub(crate) struct EmptyShard<'a>(pub &'a Path);

impl std::fmt::Display for EmptyShard<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: holds no rows (an empty shard, as img2dataset writes when every download of a shard fails); passed over",
            self.0.display()
        )
    }
}

/// A file type in words, for [`regular_file_len`].
fn file_kind(t: &std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "a named pipe (FIFO)";
        }
        if t.is_char_device() {
            return "a character device";
        }
        if t.is_block_device() {
            return "a block device";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    if t.is_dir() {
        "a directory"
    } else {
        "not a file"
    }
}

fn is_hidden(name: &std::ffi::OsStr) -> bool {
    name.to_string_lossy().starts_with('.')
}

fn has_subdirectory(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| e.path().is_dir() && !is_hidden(&e.file_name()))
    })
}

/// Whether a wildcard component of `pattern` matched a hidden name in
/// `path` (a component starting with `.` that the pattern does not spell
/// with a leading `.`). Pattern components before the first `**` align
/// with the path's from the front, those after the last `**` from the
/// back; whatever `**` spans must not be hidden.
fn wildcard_reaches_hidden(pattern: &Path, path: &Path) -> bool {
    let pat: Vec<String> = components(pattern);
    let got: Vec<String> = components(path);
    let hidden_by = |p: &str, q: &str| q.starts_with('.') && !p.starts_with('.') && is_glob(p);
    let first = pat.iter().position(|p| p == "**");
    let Some(first) = first else {
        return pat.iter().zip(&got).any(|(p, q)| hidden_by(p, q));
    };
    let last = pat.iter().rposition(|p| p == "**").unwrap_or(first);
    let tail = pat.len() - last - 1;
    if got.len() < first + tail {
        return false;
    }
    let front = pat[..first]
        .iter()
        .zip(&got[..first])
        .any(|(p, q)| hidden_by(p, q));
    let back = pat[last + 1..]
        .iter()
        .zip(&got[got.len() - tail..])
        .any(|(p, q)| hidden_by(p, q));
    let middle = got[first..got.len() - tail]
        .iter()
        .any(|q| q.starts_with('.'));
    front || back || middle
}

fn components(path: &Path) -> Vec<String> {
    path.components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect()
}

/// When a glob matched nothing but would have matched hidden files, say
/// why they were left out.
fn hidden_hint(pattern: &Path) -> &'static str {
    let text = pattern.to_string_lossy();
    let any = glob::glob(&text)
        .map(|mut paths| paths.any(|p| p.is_ok()))
        .unwrap_or(false);
    if any {
        " (hidden files and directories, whose names start with '.', match only a pattern component that starts with '.')"
    } else {
        ""
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(root: &Path, rel: &str) -> PathBuf {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, b"x").unwrap();
        p
    }

    fn names(root: &Path, found: &[PathBuf]) -> Vec<String> {
        found
            .iter()
            .map(|p| {
                p.strip_prefix(root)
                    .unwrap()
                    .to_string_lossy()
                    .replace('\\', "/")
            })
            .collect()
    }

    fn expand(root: &Path, given: &[&str], recursive: bool) -> Result<Vec<String>> {
        let inputs: Vec<PathBuf> = given.iter().map(|g| root.join(g)).collect();
        expand_inputs(&inputs, Discovery { recursive }).map(|f| names(root, &f))
    }

    fn layout() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for rel in [
            "dir1/00001.parquet",
            "dir1/00000.parquet",
            "dir1/.00002.parquet",
            "dir1/notes.txt",
            "dir2/00000.parquet",
            "dir2/sub/00003.parquet",
            "dir2/.hidden/00004.parquet",
            "other/00000.parquet",
        ] {
            touch(d.path(), rel);
        }
        d
    }

    #[test]
    fn globs_match_in_any_component_sorted_without_hidden_files() {
        let d = layout();
        assert_eq!(
            expand(d.path(), &["dir*/0000?.parquet"], false).unwrap(),
            [
                "dir1/00000.parquet",
                "dir1/00001.parquet",
                "dir2/00000.parquet"
            ]
        );
        // `**` descends, but not into hidden directories.
        assert_eq!(
            expand(d.path(), &["dir2/**/*.parquet"], false).unwrap(),
            ["dir2/00000.parquet", "dir2/sub/00003.parquet"]
        );
        // A literal leading dot names hidden files on purpose.
        assert_eq!(
            expand(d.path(), &["dir1/.*.parquet"], false).unwrap(),
            ["dir1/.00002.parquet"]
        );
    }

    #[test]
    fn directories_skip_hidden_entries_and_recurse_only_when_asked() {
        let d = layout();
        assert_eq!(
            expand(d.path(), &["dir2"], false).unwrap(),
            ["dir2/00000.parquet"]
        );
        assert_eq!(
            expand(d.path(), &["dir2"], true).unwrap(),
            ["dir2/00000.parquet", "dir2/sub/00003.parquet"]
        );
        assert_eq!(
            expand(d.path(), &["dir1"], false).unwrap(),
            ["dir1/00000.parquet", "dir1/00001.parquet"]
        );
        // A glob that matches directories expands them like directories.
        assert_eq!(
            expand(d.path(), &["dir*"], false).unwrap(),
            [
                "dir1/00000.parquet",
                "dir1/00001.parquet",
                "dir2/00000.parquet"
            ]
        );
    }

    #[test]
    fn files_given_by_name_are_read_even_when_hidden() {
        let d = layout();
        assert_eq!(
            expand(d.path(), &["dir1/.00002.parquet"], false).unwrap(),
            ["dir1/.00002.parquet"]
        );
    }

    #[test]
    fn a_tree_with_tars_is_read_as_tars() {
        let d = tempfile::tempdir().unwrap();
        touch(d.path(), "wds/00000.parquet");
        touch(d.path(), "wds/part/00000.tar");
        assert_eq!(
            expand(d.path(), &["wds"], false).unwrap(),
            ["wds/00000.parquet"]
        );
        assert_eq!(
            expand(d.path(), &["wds"], true).unwrap(),
            ["wds/part/00000.tar"]
        );
    }

    #[test]
    fn errors_say_what_to_do() {
        let d = layout();
        let e = expand(d.path(), &["nothing*/x.parquet"], false).unwrap_err();
        assert_eq!(e.exit_code(), 3);
        assert!(e.to_string().contains("no files match"), "{e}");

        let e = expand(d.path(), &["dir2/.hid*/*.parquet"], false);
        assert_eq!(e.unwrap(), ["dir2/.hidden/00004.parquet"]);
        let e = expand(d.path(), &["dir2/*/00004.parquet"], false).unwrap_err();
        assert!(e.to_string().contains("hidden files"), "{e}");

        touch(d.path(), "deep/a/b.parquet");
        let e = expand(d.path(), &["deep"], false).unwrap_err();
        assert!(e.to_string().contains("--recursive"), "{e}");

        let e = expand(d.path(), &["dir1", "dir1/00000.parquet"], false).unwrap_err();
        assert!(e.to_string().contains("more than once"), "{e}");

        let e = expand(d.path(), &["dir[1.parquet"], false).unwrap_err();
        assert!(e.to_string().contains("not a valid glob"), "{e}");
    }
}
