//! The run directory `fit` writes, committed as a whole.
//!
//! # Protocol
//!
//! For `--out-dir P/NAME`:
//!
//! 1. **Check.** `P/NAME` must be missing, empty, or a complete ncclean run
//!    (a `run.json` naming an `ncclean_version`); anything else is refused
//!    (exit 2) unless `--force`, which replaces its contents. It may not be,
//!    or lie inside, a directory the inputs are listed from (its outputs
//!    would be read as inputs next time; `--force` overrides), and it may
//!    never contain an input file (replacing it would delete that input).
//! 2. **Sweep.** Temporaries of dead processes beside it
//!    (`P/.NAME.tmp-<pid>`, `P/.NAME.old-<pid>`) are removed, or an old run
//!    moved aside is renamed back if `P/NAME` is missing; a live process's
//!    temporary means another `ncclean` is writing there: refused (exit 2).
//! 3. **Stage.** Every output is written into `P/.NAME.tmp-<pid>/`;
//!    `run.json`, last, carries `"complete": true`.
//! 4. **Commit.** The staging directory and `P/NAME` trade places in one
//!    `renameat2(RENAME_EXCHANGE)` (Linux), or, where that is refused, the old
//!    run is renamed aside first (see [`crate::runtime::temp::replace_dir`]); then the
//!    old run is removed.
//!
//! So at every instant `P/NAME` is the complete previous run or the complete
//! new one; an interrupt (or a crash) before the commit leaves the previous
//! run untouched and a staging directory that the next run sweeps away.
//!
//! The epoch checkpoint that `fit --resume` continues from is kept beside
//! the run, in `P/.NAME.resume/`, replaced atomically after every epoch and
//! removed once the new run is committed.

use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::error::{invalid, Error, Result};
use crate::runtime::temp;

/// A run directory being written: outputs go to [`staging`](Self::staging)
/// until [`commit`](Self::commit); dropped uncommitted, the staging
/// directory is removed and the previous run stays as it was.
#[derive(Debug)]
pub struct RunDir {
    out: PathBuf,
    staging: PathBuf,
    committed: bool,
}

/// Where the inputs came from, for the out-dir checks.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    /// The DATA arguments as given (files, directories, globs).
    pub args: &'a [PathBuf],
    /// The parquet files they expanded to.
    pub files: &'a [PathBuf],
}

impl RunDir {
    /// Check `out` (protocol steps 1–2) and create its staging directory.
    pub fn begin(out: &Path, inputs: Inputs<'_>, force: bool) -> Result<RunDir> {
        let out = absolute(out)?;
        if out.file_name().is_none() {
            return Err(Error::Usage(format!(
                "--out-dir {}: expected a directory path that ends in a name",
                out.display()
            )));
        }
        let parent = out.parent().unwrap_or(Path::new("/"));
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
        check_inputs(&out, inputs, force)?;
        if let Some(live) = temp::sweep(&out)?.first() {
            return Err(Error::Usage(format!(
                "{}: another ncclean process (pid {}) is writing this run directory ({}); \
                 wait for it to finish or stop it, or choose another --out-dir",
                out.display(),
                live.pid,
                live.path.display()
            )));
        }
        check_existing(&out, force)?;
        let staging = temp::name(&out, temp::Kind::Tmp);
        std::fs::create_dir(&staging)
            .with_context(|| format!("cannot create {}", staging.display()))?;
        Ok(RunDir {
            out,
            staging,
            committed: false,
        })
    }

    /// The directory outputs are written into until the commit.
    pub fn staging(&self) -> &Path {
        &self.staging
    }

    /// The run directory as the user named it (made absolute).
    pub fn out(&self) -> &Path {
        &self.out
    }

    /// Swap the staged run in (protocol step 4).
    pub fn commit(mut self) -> Result<()> {
        temp::replace_dir(&self.staging, &self.out)?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_dir_all(&self.staging);
        }
    }
}

/// Where `fit` keeps the epoch checkpoint of a run writing to `out`.
pub fn resume_dir(out: &Path) -> PathBuf {
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "run".into());
    out.with_file_name(format!(".{name}.resume"))
}

/// Refuse (exit 2) an output file that is one of the input files: it would
/// be replaced while it is still being read. Checked before any work, with
/// what [`crate::runtime::temp::check_replaceable`] refuses (a directory, a device).
pub fn check_not_an_input(out: &Path, files: &[PathBuf], flag: &str) -> Result<()> {
    crate::runtime::temp::check_replaceable(out, flag)?;
    let out_real = real(&absolute(out)?);
    for f in files {
        if real(&absolute(f)?) == out_real {
            return Err(Error::Usage(format!(
                "{flag} {} is one of the input files; write to another path",
                out.display()
            )));
        }
    }
    Ok(())
}

/// Refuse (exit 2) an output file that the next run over the same DATA
/// `args` would read as one more shard: a `*.parquet` or `*.tar` inside a
/// directory (or a glob's directory) that `args` list, with no hidden
/// component between (directory listing skips those).
pub fn check_not_in_input_dir(out: &Path, args: &[PathBuf], flag: &str) -> Result<()> {
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    if !(name.ends_with(".parquet") || name.ends_with(".tar")) {
        return Ok(());
    }
    let out_real = real(&absolute(out)?);
    for d in listed_dirs(args) {
        let dir = real(&absolute(&d)?);
        let Ok(rest) = out_real.strip_prefix(&dir) else {
            continue;
        };
        if rest
            .components()
            .any(|c| c.as_os_str().to_string_lossy().starts_with('.'))
        {
            continue;
        }
        return Err(Error::Usage(format!(
            "{flag} {} is inside the input directory {}: the next run over {} would read it as \
             one more shard (its rows twice, its keys repeated); write it outside that directory",
            out.display(),
            d.display(),
            d.display()
        )));
    }
    Ok(())
}

/// Whether `dir` holds an ncclean run (its `run.json` names a version).
pub fn is_run(dir: &Path) -> bool {
    crate::runtime::small_file::read(
        &dir.join("run.json"),
        crate::runtime::small_file::RUN_FILE_LIMIT,
        "run record",
    )
    .ok()
    .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
    .is_some_and(|v| v.get("ncclean_version").is_some())
}

/// `p` made absolute against the current directory, `.` and `..` removed
/// lexically (links are not resolved).
pub(crate) fn absolute(p: &Path) -> Result<PathBuf> {
    let cwd = std::env::current_dir().context("cannot read the current directory")?;
    // Lexically: `a/../b` and `./b` must name the same run.
    let mut out = PathBuf::new();
    for c in cwd.join(p).components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    Ok(out)
}

/// `p` with symlinks resolved as far as it exists, so containment checks
/// compare real locations.
fn real(p: &Path) -> PathBuf {
    let mut existing = p.to_path_buf();
    let mut rest = Vec::new();
    while !existing.exists() {
        match (existing.file_name(), existing.parent()) {
            (Some(n), Some(parent)) => {
                rest.push(n.to_owned());
                existing = parent.to_path_buf();
            }
            _ => return p.to_path_buf(),
        }
    }
    let mut out = std::fs::canonicalize(&existing).unwrap_or(existing);
    out.extend(rest.iter().rev());
    out
}

/// The directories the DATA arguments list files from.
fn listed_dirs(args: &[PathBuf]) -> Vec<PathBuf> {
    args.iter()
        .filter_map(|a| {
            let name = a.file_name()?.to_string_lossy().into_owned();
            if name.contains('*') || name.contains('?') {
                Some(match a.parent() {
                    Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
                    _ => PathBuf::from("."),
                })
            } else {
                a.is_dir().then(|| a.clone())
            }
        })
        .collect()
}

fn check_inputs(out: &Path, inputs: Inputs<'_>, force: bool) -> Result<()> {
    let out_real = real(out);
    for f in inputs.files {
        if real(&absolute(f)?).starts_with(&out_real) {
            return Err(Error::Usage(format!(
                "--out-dir {} contains the input {}: the run directory is replaced as a whole, \
                 which would delete it; choose another --out-dir",
                out.display(),
                f.display()
            )));
        }
    }
    if force {
        return Ok(());
    }
    for d in listed_dirs(inputs.args) {
        if out_real.starts_with(real(&absolute(&d)?)) {
            return Err(Error::Usage(format!(
                "--out-dir {} is inside the input directory {}: the next run would read its \
                 parquet outputs as inputs; choose an --out-dir outside it (or pass --force)",
                out.display(),
                d.display()
            )));
        }
    }
    Ok(())
}

fn check_existing(out: &Path, force: bool) -> Result<()> {
    let meta = match std::fs::symlink_metadata(out) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(anyhow::anyhow!("cannot inspect {}: {e}", out.display()).into()),
    };
    if !meta.is_dir() {
        return Err(Error::Usage(format!(
            "--out-dir {} exists and is not a directory; choose another path",
            out.display()
        )));
    }
    if force || is_run(out) {
        return Ok(());
    }
    let first = std::fs::read_dir(out)
        .with_context(|| format!("cannot list {}", out.display()))?
        .next()
        .transpose()
        .with_context(|| format!("cannot list {}", out.display()))?;
    match first {
        None => Ok(()),
        Some(entry) => Err(Error::Usage(format!(
            "--out-dir {} holds files that are not an ncclean run (e.g. {}), and a run directory \
             is replaced as a whole; choose an empty or new directory, or pass --force to \
             replace its contents",
            out.display(),
            entry.file_name().to_string_lossy()
        ))),
    }
}

/// Parse a run file's JSON, of at most [`crate::runtime::small_file::RUN_FILE_LIMIT`]:
/// how `report` and `score` (without DATA) read run.json and stats.json.
pub fn read_json(path: &Path) -> Result<serde_json::Value> {
    let bytes = crate::runtime::small_file::read(
        path,
        crate::runtime::small_file::RUN_FILE_LIMIT,
        "run file",
    )?;
    serde_json::from_slice(&bytes).map_err(|e| {
        invalid(format!(
            "{}: not valid JSON ({e}); was the run written by ncclean?",
            path.display()
        ))
    })
}

/// Field `name` of a run file's JSON as a `T`; `None` when it is missing or
/// of another shape (what runs of older versions, or made by hand, hold).
pub fn json_field<T: serde::de::DeserializeOwned>(
    json: &serde_json::Value,
    name: &str,
) -> Option<T> {
    serde_json::from_value(json.get(name)?.clone()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_fields_missing_or_misshapen_are_none() {
        let v = serde_json::json!({"seed": 3, "inputs": ["a", "b"], "root": null});
        assert_eq!(json_field::<u64>(&v, "seed"), Some(3));
        assert_eq!(
            json_field::<Vec<String>>(&v, "inputs"),
            Some(vec!["a".to_string(), "b".to_string()])
        );
        assert_eq!(json_field::<Vec<String>>(&v, "seed"), None);
        assert_eq!(json_field::<u64>(&v, "absent"), None);
        assert_eq!(json_field::<Option<String>>(&v, "root"), Some(None));
    }

    fn inputs<'a>(args: &'a [PathBuf], files: &'a [PathBuf]) -> Inputs<'a> {
        Inputs { args, files }
    }

    fn write_run(dir: &Path, tag: &str) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("labels.parquet"), tag).unwrap();
        std::fs::write(
            dir.join("run.json"),
            format!("{{\"ncclean_version\":\"0\",\"tag\":\"{tag}\"}}"),
        )
        .unwrap();
    }

    #[test]
    fn a_staged_run_replaces_the_old_one_whole() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("run");
        write_run(&out, "old");
        let run = RunDir::begin(&out, inputs(&[], &[]), false).unwrap();
        // Until the commit, the old run is what is visible.
        write_run(run.staging(), "new");
        assert_eq!(std::fs::read(out.join("labels.parquet")).unwrap(), b"old");
        run.commit().unwrap();
        assert_eq!(std::fs::read(out.join("labels.parquet")).unwrap(), b"new");
        let names: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "nothing but the run is left beside it");
    }

    #[test]
    fn an_uncommitted_run_leaves_the_old_one_and_no_temporary() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("run");
        write_run(&out, "old");
        {
            let run = RunDir::begin(&out, inputs(&[], &[]), false).unwrap();
            write_run(run.staging(), "half");
        }
        assert_eq!(std::fs::read(out.join("labels.parquet")).unwrap(), b"old");
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_directory_that_is_not_a_run_needs_force() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("photos");
        std::fs::create_dir(&out).unwrap();
        std::fs::write(out.join("holiday.jpg"), b"x").unwrap();
        let e = RunDir::begin(&out, inputs(&[], &[]), false).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("holiday.jpg"), "{e}");
        assert!(e.to_string().contains("--force"), "{e}");
        let run = RunDir::begin(&out, inputs(&[], &[]), true).unwrap();
        write_run(run.staging(), "new");
        run.commit().unwrap();
        assert!(!out.join("holiday.jpg").exists());
        // Empty directories and files that are not directories.
        let empty = tmp.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        assert!(RunDir::begin(&empty, inputs(&[], &[]), false).is_ok());
        let file = tmp.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        let e = RunDir::begin(&file, inputs(&[], &[]), true).unwrap_err();
        assert!(e.to_string().contains("not a directory"), "{e}");
    }

    #[test]
    fn out_dir_inside_an_input_directory_is_refused_and_inputs_are_never_inside_it() {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path().join("data");
        std::fs::create_dir(&data).unwrap();
        let shard = data.join("a.parquet");
        std::fs::write(&shard, b"x").unwrap();
        let files = [shard.clone()];
        for args in [vec![data.clone()], vec![data.join("*.parquet")]] {
            for out in [data.clone(), data.join("run")] {
                let e = RunDir::begin(&out, inputs(&args, &files), false).unwrap_err();
                assert_eq!(e.exit_code(), 2, "{e}");
            }
        }
        // A file argument's directory is not listed: a run beside it is fine.
        let beside = data.join("run");
        let run =
            RunDir::begin(&beside, inputs(std::slice::from_ref(&shard), &files), false).unwrap();
        drop(run);
        // --force allows a run inside a listed directory, never around an input.
        assert!(RunDir::begin(&beside, inputs(std::slice::from_ref(&data), &files), true).is_ok());
        let e =
            RunDir::begin(&data, inputs(std::slice::from_ref(&shard), &files), true).unwrap_err();
        assert!(e.to_string().contains("would delete it"), "{e}");
    }

    #[test]
    fn a_live_writer_is_refused_and_a_dead_ones_temporary_is_swept() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("run");
        let busy = tmp.path().join(".run.tmp-1");
        std::fs::create_dir(&busy).unwrap();
        let e = RunDir::begin(&out, inputs(&[], &[]), false).unwrap_err();
        assert!(e.to_string().contains("pid 1"), "{e}");
        std::fs::remove_dir(&busy).unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let stale = tmp.path().join(format!(".run.tmp-{dead}"));
        std::fs::create_dir(&stale).unwrap();
        let run = RunDir::begin(&out, inputs(&[], &[]), false).unwrap();
        assert!(!stale.exists());
        drop(run);
    }

    #[test]
    fn the_resume_directory_sits_beside_the_run() {
        assert_eq!(
            resume_dir(Path::new("/a/run")),
            PathBuf::from("/a/.run.resume")
        );
    }
}
