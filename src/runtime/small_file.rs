//! Reading the small files ncclean is given or wrote (a `--config`, a
//! checkpoint's `state.json`), with a size limit: such a file is read whole,
//! so a path to something huge (or endless, like `/dev/zero`) would
//! otherwise exhaust memory before any parser could object.

use std::io::Read;
use std::path::Path;

use crate::error::{invalid, Result};

/// Limit of a configuration file a user writes (`--config`).
pub const CONFIG_LIMIT: u64 = 1 << 20;

/// Limit of a JSON file a run writes (`state.json`, `threshold.json`,
/// `run.json`, `stats.json`, `resume.json`): a few KiB to a few hundred KiB
/// in practice (stats.json grows by a line an epoch), so anything near this
/// is not an ncclean file.
pub const RUN_FILE_LIMIT: u64 = 16 << 20;

/// Refuse (exit 3) a path that is there but not a regular file: opening a
/// named pipe waits for a writer forever (and a signal does not end the
/// wait), a device like `/dev/zero` never ends. A missing path passes, for
/// the open to say so.
pub fn check_regular(path: &Path, what: &str) -> Result<()> {
    match std::fs::metadata(path) {
        Ok(m) if !m.is_file() => Err(invalid(format!(
            "{what} {} is {}, not a regular file; give the path of a file",
            path.display(),
            if m.is_dir() {
                "a directory"
            } else {
                special(&m)
            }
        ))),
        _ => Ok(()),
    }
}

/// What a path that is neither a file nor a directory is.
fn special(m: &std::fs::Metadata) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        let t = m.file_type();
        if t.is_fifo() {
            return "a named pipe";
        }
        if t.is_char_device() || t.is_block_device() {
            return "a device";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    let _ = m;
    "something else"
}

/// The bytes of `path` when it holds at most `limit` of them; `what` names
/// the file in the errors ("config file", "checkpoint state").
pub fn read(path: &Path, limit: u64, what: &str) -> Result<Vec<u8>> {
    check_regular(path, what)?;
    let cannot = |e: std::io::Error| invalid(format!("cannot read {what} {}: {e}", path.display()));
    let file = std::fs::File::open(path).map_err(cannot)?;
    let mut bytes = Vec::new();
    // One byte past the limit tells "exactly at the limit" from "more".
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(cannot)?;
    if bytes.len() as u64 > limit {
        return Err(invalid(format!(
            "{what} {} is larger than {} MiB; is it the right file?",
            path.display(),
            limit >> 20
        )));
    }
    Ok(bytes)
}

/// [`read`] as UTF-8 text.
pub fn read_text(path: &Path, limit: u64, what: &str) -> Result<String> {
    String::from_utf8(read(path, limit, what)?).map_err(|_| {
        invalid(format!(
            "{what} {} is not UTF-8 text; is it the right file?",
            path.display()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_up_to_the_limit_are_read_and_larger_ones_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(&p, vec![b'a'; 2 << 20]).unwrap();
        assert_eq!(read(&p, 2 << 20, "config file").unwrap().len(), 2 << 20);
        let e = read(&p, 1 << 20, "config file").unwrap_err();
        assert_eq!(e.exit_code(), 3);
        assert!(e.to_string().contains("larger than 1 MiB"), "{e}");
        std::fs::write(&p, [0xff, 0xfe]).unwrap();
        let e = read_text(&p, 1 << 20, "config file").unwrap_err();
        assert!(e.to_string().contains("is not UTF-8 text"), "{e}");
        let e = read(&dir.path().join("none"), 10, "config file").unwrap_err();
        assert!(e.to_string().starts_with("cannot read config file"), "{e}");
    }

    #[cfg(unix)]
    #[test]
    fn endless_and_blocking_files_are_refused_before_they_are_opened() {
        let e = read(Path::new("/dev/zero"), 1 << 20, "config file").unwrap_err();
        assert_eq!(e.exit_code(), 3);
        assert!(
            e.to_string()
                .contains("/dev/zero is a device, not a regular file"),
            "{e}"
        );
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("pipe");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo reads a NUL-terminated path and creates a node.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // Opened, this would wait for a writer forever.
        let e = read(&fifo, 1 << 20, "config file").unwrap_err();
        assert!(e.to_string().contains("is a named pipe"), "{e}");
    }
}
