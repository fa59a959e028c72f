//! Temporary names for atomic outputs, and the sweep of those that dead
//! processes left behind.
//!
//! Every output is first written beside its final path, under
//! `.<name>.tmp-<pid>`, and renamed into place. A replaced directory is moved
//! aside to `.<name>.old-<pid>` until its successor is in place. Both names
//! carry the writer's process id, so a later run can tell a temporary of a
//! live writer (left alone) from one of a process that died (removed, or for
//! an aside copy whose successor never arrived, renamed back).

use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::error::Result;

/// What a temporary is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A new output being written.
    Tmp,
    /// An old output moved aside while its successor is renamed in.
    Old,
}

impl Kind {
    fn tag(self) -> &'static str {
        match self {
            Kind::Tmp => "tmp",
            Kind::Old => "old",
        }
    }
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "output".into())
}

/// Refuse (exit 2) to write the file `path` when something other than a
/// file is there: an output is renamed into place, so a directory would
/// fail only after all the work, and a device or pipe (`/dev/stdout`,
/// `/dev/null`, a FIFO) would be replaced by a plain file, as root even in
/// `/dev`. `what` names the output in the message (`--out`, "output").
pub fn check_replaceable(path: &Path, what: &str) -> Result<()> {
    // Followed through links: `/dev/stdout` is a link to a pipe or terminal.
    let Ok(meta) = std::fs::metadata(path) else {
        return Ok(());
    };
    let kind = if meta.is_file() {
        return Ok(());
    } else if meta.is_dir() {
        "a directory"
    } else {
        special_kind(&meta)
    };
    let p = path.display();
    Err(crate::Error::Usage(if meta.is_dir() {
        format!("{what} {p} is a directory, not a file; name the file to write (a path inside it, for example)")
    } else {
        format!(
            "{what} {p} is {kind}, not a file: ncclean writes a temporary file and renames it \
             into place, which would replace it; write to a file and read that instead"
        )
    }))
}

/// What a path that is neither a file nor a directory is.
fn special_kind(meta: &std::fs::Metadata) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        let t = meta.file_type();
        if t.is_char_device() {
            return "a character device";
        }
        if t.is_block_device() {
            return "a block device";
        }
        if t.is_fifo() {
            return "a named pipe";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    let _ = meta;
    "not a regular file"
}

/// This process's temporary of `kind` for `path`: `.<name>.<tag>-<pid>` in
/// the same directory, so the final rename stays on one filesystem.
pub fn name(path: &Path, kind: Kind) -> PathBuf {
    path.with_file_name(format!(
        ".{}.{}-{}",
        file_name(path),
        kind.tag(),
        std::process::id()
    ))
}

/// Whether process `pid` exists (signal 0 probes without sending). Where
/// that cannot be asked, every process counts as alive, so nothing another
/// process may still be writing is removed.
pub fn pid_alive(pid: u32) -> bool {
    #[cfg(unix)]
    {
        let Ok(pid) = libc::pid_t::try_from(pid) else {
            return false;
        };
        // SAFETY: kill with signal 0 only checks whether the process exists.
        let r = unsafe { libc::kill(pid, 0) };
        r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
    }
    #[cfg(not(unix))]
    {
        let _ = pid;
        true
    }
}

/// A temporary of `path` found on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// Its path.
    pub path: PathBuf,
    /// What it is for.
    pub kind: Kind,
    /// The process that made it.
    pub pid: u32,
}

/// The temporaries of `path` in its directory, of any process.
pub fn find(path: &Path) -> Result<Vec<Found>> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let prefix = format!(".{}.", file_name(path));
    // A writer that put its own temporary inside this path's temporary
    // (`..<name>.tmp-<pid>.tmp-<pid>`, as `score --out` once did)
    // leaves a name no sweep of the temporary itself would ever look for:
    // it is this path's temporary too, owned by the last pid.
    let nested = format!("..{}.{}-", file_name(path), Kind::Tmp.tag());
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(anyhow::anyhow!("cannot list {}: {e}", dir.display()).into()),
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.with_context(|| format!("listing {}", dir.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(pid) = name.strip_prefix(&nested).and_then(nested_pid) {
            found.push(Found {
                path: entry.path(),
                kind: Kind::Tmp,
                pid,
            });
            continue;
        }
        let Some(rest) = name.strip_prefix(&prefix) else {
            continue;
        };
        for kind in [Kind::Tmp, Kind::Old] {
            let pid = rest
                .strip_prefix(kind.tag())
                .and_then(|r| r.strip_prefix('-'))
                .and_then(|p| p.parse::<u32>().ok());
            if let Some(pid) = pid {
                found.push(Found {
                    path: entry.path(),
                    kind,
                    pid,
                });
            }
        }
    }
    found.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(found)
}

/// The writer's pid of a nested temporary's tail, `<pid>.tmp-<pid>`.
fn nested_pid(rest: &str) -> Option<u32> {
    let (outer, inner) = rest.split_once('.')?;
    outer.parse::<u32>().ok()?;
    inner
        .strip_prefix(Kind::Tmp.tag())?
        .strip_prefix('-')?
        .parse()
        .ok()
}

fn remove(path: &Path) -> Result<()> {
    let r = if path.is_dir() {
        std::fs::remove_dir_all(path)
    } else {
        std::fs::remove_file(path)
    };
    match r {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(anyhow::anyhow!("cannot remove stale {}: {e}", path.display()).into()),
    }
}

/// Clean up after dead writers of `path`: their temporaries are removed; an
/// old copy moved aside is renamed back when `path` itself is missing (the
/// writer died between its two renames), else removed. Temporaries of live
/// processes other than this one are returned untouched.
pub fn sweep(path: &Path) -> Result<Vec<Found>> {
    let me = std::process::id();
    let mut live = Vec::new();
    for f in find(path)? {
        if f.pid != me && pid_alive(f.pid) {
            live.push(f);
        } else if f.kind == Kind::Old && f.pid != me && !path.exists() {
            std::fs::rename(&f.path, path).with_context(|| {
                format!(
                    "cannot restore {} from {}",
                    path.display(),
                    f.path.display()
                )
            })?;
        } else if f.pid != me || f.kind == Kind::Tmp {
            remove(&f.path)?;
        }
    }
    Ok(live)
}

/// A file output written under this process's temporary name, renamed into
/// place by [`commit`](Self::commit) and removed if dropped before. Lets a
/// command finish several outputs first and rename them in together, with no
/// interrupt check between the renames, so a stop never leaves one new and
/// one old.
#[derive(Debug)]
pub struct Pending {
    tmp: PathBuf,
    path: PathBuf,
}

impl Pending {
    /// A pending output for `path`, after sweeping dead writers' temporaries.
    pub fn new(path: &Path) -> Result<Pending> {
        check_replaceable(path, "output")?;
        sweep(path)?;
        Ok(Pending {
            tmp: name(path, Kind::Tmp),
            path: path.to_path_buf(),
        })
    }

    /// Where to write the output meanwhile.
    pub fn tmp_path(&self) -> &Path {
        &self.tmp
    }

    /// Rename the written output into place.
    pub fn commit(mut self) -> Result<()> {
        std::fs::rename(&self.tmp, &self.path).with_context(|| {
            format!("renaming {} to {}", self.tmp.display(), self.path.display())
        })?;
        self.tmp = PathBuf::new();
        Ok(())
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.tmp.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Put the complete directory `new` (this process's temporary) in place of
/// `dir`, and remove what `dir` held before.
///
/// On Linux the two directories trade places in one `renameat2` call with
/// `RENAME_EXCHANGE`, so `dir` names the complete old or the complete new
/// directory at every instant. Where that call is refused (another system,
/// a filesystem without it), the old directory is renamed aside to
/// `.<name>.old-<pid>` first: an interrupt between the two renames leaves
/// `dir` missing, and the next [`sweep`] renames the old one back.
pub fn replace_dir(new: &Path, dir: &Path) -> Result<()> {
    if dir.exists() && exchange(new, dir) {
        // `new` now names the previous directory.
        return remove(new);
    }
    let old = name(dir, Kind::Old);
    if dir.exists() {
        std::fs::rename(dir, &old).with_context(|| format!("cannot replace {}", dir.display()))?;
    }
    std::fs::rename(new, dir)
        .with_context(|| format!("cannot move {} into {}", new.display(), dir.display()))?;
    remove(&old)
}

/// Swap two existing paths atomically; false where the system cannot.
#[cfg(target_os = "linux")]
fn exchange(a: &Path, b: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let (Ok(a), Ok(b)) = (
        std::ffi::CString::new(a.as_os_str().as_bytes()),
        std::ffi::CString::new(b.as_os_str().as_bytes()),
    ) else {
        return false;
    };
    // SAFETY: both are valid NUL-terminated paths; AT_FDCWD resolves them
    // like rename(2) does.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    r == 0
}

#[cfg(not(target_os = "linux"))]
fn exchange(_a: &Path, _b: &Path) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_files_and_free_paths_may_be_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("labels.parquet");
        assert!(check_replaceable(&file, "--out").is_ok(), "absent");
        std::fs::write(&file, b"x").unwrap();
        assert!(check_replaceable(&file, "--out").is_ok(), "a file");
        let e = check_replaceable(dir.path(), "--out").unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(
            e.to_string().starts_with(&format!(
                "--out {} is a directory, not a file",
                dir.path().display()
            )),
            "{e}"
        );
        #[cfg(unix)]
        {
            let e = check_replaceable(Path::new("/dev/null"), "--out").unwrap_err();
            assert!(
                e.to_string().contains("is a character device, not a file"),
                "{e}"
            );
            let fifo = dir.path().join("pipe");
            let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
            // SAFETY: mkfifo reads a NUL-terminated path and creates a node.
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
            let e = check_replaceable(&fifo, "output").unwrap_err();
            assert!(e.to_string().starts_with("output"), "{e}");
            assert!(e.to_string().contains("is a named pipe, not a file"), "{e}");
            // Through a link, the thing linked to counts.
            let link = dir.path().join("link");
            std::os::unix::fs::symlink(&fifo, &link).unwrap();
            assert!(check_replaceable(&link, "--out").is_err());
        }
    }

    /// A process id that is not running: a child that has been reaped.
    fn dead_pid() -> u32 {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        pid
    }

    #[test]
    fn names_carry_the_pid_and_stay_beside_the_target() {
        let p = Path::new("/x/run");
        let me = std::process::id();
        assert_eq!(
            name(p, Kind::Tmp),
            PathBuf::from(format!("/x/.run.tmp-{me}"))
        );
        assert_eq!(
            name(p, Kind::Old),
            PathBuf::from(format!("/x/.run.old-{me}"))
        );
    }

    #[test]
    fn liveness_of_this_process_and_a_reaped_child() {
        assert!(pid_alive(std::process::id()));
        assert!(!pid_alive(dead_pid()));
    }

    #[test]
    fn sweep_removes_dead_temporaries_keeps_live_ones_and_unrelated_files() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("labels.parquet");
        std::fs::write(&out, b"current").unwrap();
        let dead = dead_pid();
        let stale = dir.path().join(format!(".labels.parquet.tmp-{dead}"));
        std::fs::write(&stale, b"half").unwrap();
        let stale_old = dir.path().join(format!(".labels.parquet.old-{dead}"));
        std::fs::create_dir(&stale_old).unwrap();
        // PID 1 is always alive: its temporary belongs to someone else.
        let live = dir.path().join(".labels.parquet.tmp-1");
        std::fs::write(&live, b"busy").unwrap();
        let other = dir.path().join(".labels.parquet.tmp-notapid");
        std::fs::write(&other, b"x").unwrap();
        // A temporary's own temporary, as `score --out` used to leave.
        let nested = dir
            .path()
            .join(format!("..labels.parquet.tmp-{dead}.tmp-{dead}"));
        std::fs::write(&nested, b"half").unwrap();
        let found = sweep(&out).unwrap();
        assert!(!nested.exists());
        assert_eq!(found.len(), 1);
        assert_eq!((found[0].pid, found[0].kind), (1, Kind::Tmp));
        assert!(!stale.exists() && !stale_old.exists());
        assert!(live.exists() && other.exists());
        assert_eq!(std::fs::read(&out).unwrap(), b"current");
    }

    #[test]
    fn replace_dir_swaps_in_the_new_directory_and_drops_the_old() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("run");
        for (round, content) in [b"first", b"secnd"].iter().enumerate() {
            let tmp = name(&out, Kind::Tmp);
            std::fs::create_dir(&tmp).unwrap();
            std::fs::write(tmp.join("run.json"), content).unwrap();
            replace_dir(&tmp, &out).unwrap();
            assert_eq!(&std::fs::read(out.join("run.json")).unwrap(), content);
            let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
            assert_eq!(names.len(), 1, "round {round}: only the run is left");
        }
    }

    #[test]
    fn pending_outputs_appear_on_commit_and_vanish_when_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("labels.parquet");
        let b = dir.path().join("filtered.parquet");
        std::fs::write(&a, b"old").unwrap();
        let (pa, pb) = (Pending::new(&a).unwrap(), Pending::new(&b).unwrap());
        std::fs::write(pa.tmp_path(), b"new").unwrap();
        std::fs::write(pb.tmp_path(), b"new").unwrap();
        assert_eq!(std::fs::read(&a).unwrap(), b"old");
        pa.commit().unwrap();
        drop(pb);
        assert_eq!(std::fs::read(&a).unwrap(), b"new");
        assert!(!b.exists());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn sweep_restores_an_old_copy_whose_successor_never_arrived() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("run");
        let dead = dead_pid();
        let aside = dir.path().join(format!(".run.old-{dead}"));
        std::fs::create_dir(&aside).unwrap();
        std::fs::write(aside.join("run.json"), b"{}").unwrap();
        let half = dir.path().join(format!(".run.tmp-{dead}"));
        std::fs::create_dir(&half).unwrap();
        sweep(&out).unwrap();
        assert_eq!(std::fs::read(out.join("run.json")).unwrap(), b"{}");
        assert!(!aside.exists() && !half.exists());
    }
}
