//! Shard-at-a-time work for many shards and many machines (`score
//! --out-dir`, `filter --out-dir`).
//!
//! - Selection: the inputs (paths, directories, globs, `--files-from`) are
//!   expanded and sorted by path, and worker `I` of `N` takes the files whose
//!   position is `I` modulo `N`, so any scheduler can hand out work with two
//!   numbers and every worker agrees on the split.
//! - Outputs: each shard writes `OUT/<stem>.parquet` under a temporary name
//!   and renames it into place, then a completion marker `OUT/<stem>.done.json`
//!   ([`Marker`]). A rerun skips a shard whose marker and output exist and
//!   whose marker names the same input content (fingerprint) and the same
//!   source (checkpoint, labels); anything else is done again. A process
//!   killed at any point leaves, per shard, either nothing, a complete output
//!   without a marker (redone), or both.
//!
//! A shard is opaque here: it is opened with [`InputSet::open`] on its one
//! path, whatever its format.

use std::io::{BufRead, Read};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::data::{self, InputSet};
use crate::error::{invalid, Error, Result};
use crate::runtime::progress::Reporter;

/// Largest `--files-from` list read (bytes): a million paths of 256 bytes.
const MAX_LIST_BYTES: u64 = 256 << 20;
/// Largest completion marker read back; a real one is under a kilobyte.
const MAX_MARKER_BYTES: u64 = 1 << 20;

/// Which part of the inputs this process works on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    /// Number of workers the inputs are split between (≥ 1).
    pub num_shards: usize,
    /// This worker's index, `0..num_shards`.
    pub shard_index: usize,
}

impl Split {
    /// Check the numbers (usage errors name the flags).
    pub fn new(num_shards: usize, shard_index: usize) -> Result<Split> {
        if num_shards == 0 {
            return Err(Error::Usage(
                "--num-shards must be at least 1 (the number of workers sharing the inputs)".into(),
            ));
        }
        if shard_index >= num_shards {
            return Err(Error::Usage(format!(
                "--shard-index {shard_index} is out of range for --num-shards {num_shards}; \
                 worker indices run from 0 to {}",
                num_shards - 1
            )));
        }
        Ok(Split {
            num_shards,
            shard_index,
        })
    }

    /// The whole input, one worker.
    pub fn all() -> Split {
        Split {
            num_shards: 1,
            shard_index: 0,
        }
    }

    /// Whether this worker takes the file at `position` of the sorted list.
    pub fn takes(&self, position: usize) -> bool {
        position % self.num_shards == self.shard_index
    }
}

/// One input file and the stem its outputs are named after.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shard {
    /// The file as expanded from the user's input.
    pub path: PathBuf,
    /// Its file name without the format extension(s).
    pub stem: String,
}

/// Read `--files-from`: one path per line; blank lines and lines starting
/// with `#` are ignored; relative paths are taken relative to the current
/// directory, like paths on the command line.
pub fn read_list(path: &Path) -> Result<Vec<PathBuf>> {
    let file = std::fs::File::open(path).map_err(|e| {
        invalid(format!(
            "--files-from {}: cannot open it ({e}); expected a text file with one input path per line",
            path.display()
        ))
    })?;
    let mut out = Vec::new();
    let mut reader = std::io::BufReader::new(file.take(MAX_LIST_BYTES + 1));
    let mut line = Vec::new();
    let mut read = 0u64;
    let mut number = 0usize;
    loop {
        line.clear();
        let n = reader
            .read_until(b'\n', &mut line)
            .with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        read += n as u64;
        number += 1;
        if read > MAX_LIST_BYTES {
            return Err(invalid(format!(
                "--files-from {}: longer than {} MiB; split the list between workers",
                path.display(),
                MAX_LIST_BYTES >> 20
            )));
        }
        let text = std::str::from_utf8(&line).map_err(|_| {
            invalid(format!(
                "--files-from {}: line {number} is not valid UTF-8; expected one path per line",
                path.display()
            ))
        })?;
        let text = text.trim_end_matches(['\n', '\r']);
        if text.trim().is_empty() || text.starts_with('#') {
            continue;
        }
        if text.contains('\0') {
            return Err(invalid(format!(
                "--files-from {}: line {number} holds a NUL byte; expected one path per line",
                path.display()
            )));
        }
        out.push(PathBuf::from(text));
    }
    if out.is_empty() {
        return Err(invalid(format!(
            "--files-from {}: lists no paths; expected one input path per line",
            path.display()
        )));
    }
    Ok(out)
}

/// The stem outputs of `path` are named after: the file name without its
/// last extension, and without `.tar` before a compression extension
/// (`part-0001.parquet` and `part-0001.tar.gz` → `part-0001`).
pub fn stem_of(path: &Path) -> String {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let strip = |n: &str| -> String {
        match n.rfind('.') {
            Some(i) if i > 0 => n[..i].to_string(),
            _ => n.to_string(),
        }
    };
    let once = strip(&name);
    if once.to_ascii_lowercase().ends_with(".tar") {
        strip(&once)
    } else {
        once
    }
}

/// Expand `data` and the paths of `files_from`, sort them by path, check
/// that their stems are distinct, and return this worker's part.
pub fn select(
    data: &[PathBuf],
    how: data::Discovery,
    files_from: Option<&Path>,
    split: &Split,
) -> Result<Vec<Shard>> {
    let mut given = data.to_vec();
    if let Some(list) = files_from {
        given.extend(read_list(list)?);
    }
    if given.is_empty() {
        return Err(Error::Usage(
            "no inputs: give shard paths, directories or globs, or --files-from FILE".into(),
        ));
    }
    let mut paths = data::expand_inputs(&given, how)?;
    // Sorted, so the split does not depend on the order inputs were given in.
    paths.sort();
    let mut seen = std::collections::BTreeMap::new();
    for p in &paths {
        if let Some(other) = seen.insert(stem_of(p), p.clone()) {
            return Err(invalid(format!(
                "{} and {} would both write {}.parquet; per-shard outputs need distinct file names",
                other.display(),
                p.display(),
                stem_of(p)
            )));
        }
    }
    Ok(paths
        .into_iter()
        .enumerate()
        .filter(|(i, _)| split.takes(*i))
        .map(|(_, path)| Shard {
            stem: stem_of(&path),
            path,
        })
        .collect())
}

/// The completion marker of one shard's output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Marker {
    /// ncclean version that wrote it.
    pub ncclean_version: String,
    /// `score` or `filter`.
    pub command: String,
    /// The input shard as given.
    pub shard: String,
    /// Output file name inside the output directory.
    pub output: String,
    /// [`InputSet::fingerprint`] of the shard (its content).
    pub input_fingerprint: String,
    /// What the output was made from: the checkpoint's sha256 for `score`,
    /// the labels' and the rule's for `filter`.
    pub source: String,
    /// Size and sha256 of the output as written: a rerun redoes a shard
    /// whose output was truncated, replaced or swapped with another's
    /// (absent in markers of earlier versions, which are redone).
    #[serde(default)]
    pub output_digest: Option<crate::runtime::hex::FileDigest>,
    /// The shard's counts.
    pub counts: Counts,
    /// Seconds the shard took.
    pub seconds: f64,
}

/// Per-shard counts, summed over shards in the summary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Counts {
    /// Input rows.
    pub rows: usize,
    /// Usable pairs.
    pub usable: usize,
    /// Rows that could not be used (`score`), or kept rows that could not
    /// be read back into the output (`filter`).
    pub skipped: usize,
    /// Rows called clean (`score`) or written (`filter`).
    pub kept: usize,
    /// Usable pairs called noisy (`score`).
    pub noisy: usize,
}

impl Counts {
    /// Add `o`'s counts to these (shards, or blocks of one shard).
    pub fn add(&mut self, o: &Counts) {
        self.rows += o.rows;
        self.usable += o.usable;
        self.skipped += o.skipped;
        self.kept += o.kept;
        self.noisy += o.noisy;
    }
}

/// What a run over the selected shards did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Summary {
    /// Shards this worker was given.
    pub shards: usize,
    /// Of those, done in this run.
    pub done: usize,
    /// Of those, complete from an earlier run and skipped.
    pub already_done: usize,
    /// Counts over all of this worker's shards (skipped ones from their
    /// markers).
    pub counts: Counts,
    /// Seconds spent on the shards done in this run.
    pub seconds: f64,
}

/// Where one shard's output goes.
pub struct ShardOutput<'a> {
    /// The shard.
    pub shard: &'a Shard,
    /// Its opened input.
    pub input: &'a InputSet,
    /// The final output path (write it atomically: temporary name + rename).
    pub path: PathBuf,
}

/// `OUT/<stem>.done.json`.
pub fn marker_path(out_dir: &Path, stem: &str) -> PathBuf {
    out_dir.join(format!("{stem}.done.json"))
}

/// `OUT/<stem>.parquet`.
pub fn output_path(out_dir: &Path, stem: &str) -> PathBuf {
    output_path_as(out_dir, stem, "parquet")
}

/// `OUT/<stem>.<ext>` (a filtered tar shard stays a tar).
pub fn output_path_as(out_dir: &Path, stem: &str, ext: &str) -> PathBuf {
    out_dir.join(format!("{stem}.{ext}"))
}

/// The marker of `stem` if it exists, parses, and its output is there;
/// anything else (missing, damaged, foreign) is `None`: the shard is redone.
pub fn read_marker(out_dir: &Path, stem: &str) -> Option<Marker> {
    let file = std::fs::File::open(marker_path(out_dir, stem)).ok()?;
    let mut bytes = Vec::new();
    file.take(MAX_MARKER_BYTES).read_to_end(&mut bytes).ok()?;
    let m: Marker = serde_json::from_slice(&bytes).ok()?;
    out_dir.join(&m.output).is_file().then_some(m)
}

/// Whether the output a marker describes is still the one it recorded
/// (size, then sha256); said when not, so "already done" is never claimed
/// for a truncated or swapped file.
fn output_intact(out_dir: &Path, m: &Marker, rep: &Reporter) -> bool {
    let path = out_dir.join(&m.output);
    let Some(want) = &m.output_digest else {
        return false;
    };
    let intact = std::fs::metadata(&path).is_ok_and(|md| md.len() == want.bytes)
        && crate::runtime::hex::FileDigest::of(&path).is_ok_and(|d| &d == want);
    if !intact {
        rep.info(&format!(
            "{}: differs from what its completion marker recorded (truncated, replaced or \
             another shard's): done again",
            path.display()
        ));
    }
    intact
}

/// Check `out_dir` against the shards: it may not be where a shard lives
/// (its outputs would be read as inputs next time), and it is created.
pub fn prepare_out_dir(out_dir: &Path, shards: &[Shard]) -> Result<()> {
    if out_dir.exists() && !out_dir.is_dir() {
        return Err(Error::Usage(format!(
            "--out-dir {} exists and is not a directory; choose another path",
            out_dir.display()
        )));
    }
    std::fs::create_dir_all(out_dir)
        .with_context(|| format!("cannot create {}", out_dir.display()))?;
    let real = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let out = real(out_dir);
    for s in shards {
        let parent = s
            .path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        if real(parent) == out {
            return Err(Error::Usage(format!(
                "--out-dir {} holds the input {}: its outputs would be read as inputs next time; \
                 choose another directory",
                out_dir.display(),
                s.path.display()
            )));
        }
    }
    Ok(())
}

/// Run `work` on every shard that is not complete in `out_dir` for
/// `command` and its `source` (what the output is made from besides the
/// shard): open the shard with `open`, fingerprint it, skip it when its
/// marker matches, else remove the stale marker, let `work` write
/// `OUT/<stem>.<ext>` atomically, and write the marker. Stops at the first
/// error (a scheduler retries the worker; done shards are kept).
// Each argument is one decision of the caller (which shards, which command,
// output format, provenance, how to open, how to report, the work); a struct
// of closures would only rename them.
#[allow(clippy::too_many_arguments)]
pub fn run(
    out_dir: &Path,
    shards: &[Shard],
    command: &str,
    ext: impl Fn(&Shard) -> &'static str,
    source: impl Fn(&Shard) -> Result<String>,
    open: impl Fn(&Path) -> Result<InputSet>,
    rep: &Reporter,
    mut work: impl FnMut(&ShardOutput) -> Result<Counts>,
) -> Result<Summary> {
    let mut summary = Summary {
        shards: shards.len(),
        ..Summary::default()
    };
    for (i, shard) in shards.iter().enumerate() {
        crate::runtime::interrupt::check()?;
        let ext = ext(shard);
        let path = output_path_as(out_dir, &shard.stem, ext);
        let marker = marker_path(out_dir, &shard.stem);
        // Temporaries of killed workers are removed; a live one's are left.
        crate::runtime::temp::sweep(&path)?;
        crate::runtime::temp::sweep(&marker)?;
        let input = match open(&shard.path) {
            Ok(input) => input,
            // An empty shard has nothing to write; the others go on.
            Err(_) if data::is_empty_shard(&shard.path) => {
                crate::runtime::progress::warn_once(&data::EmptyShard(&shard.path).to_string());
                continue;
            }
            Err(e) => return Err(e),
        };
        let fingerprint = input.fingerprint()?;
        let source = source(shard)?;
        if let Some(m) = read_marker(out_dir, &shard.stem) {
            if m.command == command
                && m.source == source
                && m.input_fingerprint == fingerprint
                && output_intact(out_dir, &m, rep)
            {
                rep.info(&format!(
                    "shard {}/{} {}: already done, skipped",
                    i + 1,
                    shards.len(),
                    shard.path.display()
                ));
                summary.already_done += 1;
                summary.counts.add(&m.counts);
                continue;
            }
        }
        // A stale marker goes first, so no crash below can leave it beside
        // a new output.
        match std::fs::remove_file(&marker) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(anyhow::anyhow!("cannot remove {}: {e}", marker.display()).into()),
        }
        let started = Instant::now();
        let counts = work(&ShardOutput {
            shard,
            input: &input,
            path: path.clone(),
        })?;
        let seconds = started.elapsed().as_secs_f64();
        let output_digest = crate::runtime::hex::FileDigest::of(&path)
            .with_context(|| format!("cannot read {} back", path.display()))?;
        let m = Marker {
            ncclean_version: env!("CARGO_PKG_VERSION").to_string(),
            command: command.to_string(),
            shard: shard.path.display().to_string(),
            output: format!("{}.{ext}", shard.stem),
            input_fingerprint: fingerprint,
            source,
            output_digest: Some(output_digest),
            counts,
            seconds,
        };
        let json = serde_json::to_vec_pretty(&m).context("serialising a completion marker")?;
        data::write_atomic(&marker, &json)?;
        rep.info(&format!(
            "shard {}/{} {}: {} rows in {seconds:.2}s",
            i + 1,
            shards.len(),
            shard.path.display(),
            counts.rows
        ));
        summary.done += 1;
        summary.counts.add(&counts);
        summary.seconds += seconds;
    }
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn none() -> data::Discovery {
        data::Discovery::default()
    }

    #[test]
    fn stems_drop_the_format_extensions() {
        assert_eq!(stem_of(Path::new("a/part-0001.parquet")), "part-0001");
        assert_eq!(stem_of(Path::new("part-0001.tar")), "part-0001");
        assert_eq!(stem_of(Path::new("x/00001.tar.gz")), "00001");
        assert_eq!(stem_of(Path::new("x/data.v2.parquet")), "data.v2");
        assert_eq!(stem_of(Path::new("noext")), "noext");
        assert_eq!(stem_of(Path::new(".hidden")), ".hidden");
    }

    #[test]
    fn split_assigns_every_position_to_exactly_one_worker() {
        for n in 1..5 {
            for pos in 0..20 {
                let takers = (0..n)
                    .filter(|&i| Split::new(n, i).unwrap().takes(pos))
                    .count();
                assert_eq!(takers, 1);
            }
        }
        assert!(matches!(Split::new(0, 0), Err(Error::Usage(_))));
        let e = Split::new(2, 2).unwrap_err().to_string();
        assert!(e.contains("--shard-index 2") && e.contains("0 to 1"), "{e}");
    }

    #[test]
    fn selection_is_sorted_split_and_refuses_colliding_stems() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["c.parquet", "a.parquet", "b.parquet", "d.parquet"] {
            std::fs::write(dir.path().join(name), b"x").unwrap();
        }
        let list = dir.path().join("list.txt");
        let c = dir.path().join("c.parquet");
        let a = dir.path().join("a.parquet");
        std::fs::write(
            &list,
            format!("# shards\n{}\n\n{}\n", c.display(), a.display()),
        )
        .unwrap();
        let b = dir.path().join("b.parquet");
        let stems = |s: &Split| -> Vec<String> {
            select(std::slice::from_ref(&b), none(), Some(&list), s)
                .unwrap()
                .into_iter()
                .map(|s| s.stem)
                .collect()
        };
        assert_eq!(stems(&Split::all()), ["a", "b", "c"]);
        assert_eq!(stems(&Split::new(2, 0).unwrap()), ["a", "c"]);
        assert_eq!(stems(&Split::new(2, 1).unwrap()), ["b"]);

        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        std::fs::write(sub.join("a.tar"), b"x").unwrap();
        let e = select(&[a.clone(), sub.join("a.tar")], none(), None, &Split::all()).unwrap_err();
        assert!(matches!(e, Error::InvalidInput(_)), "{e}");
        assert!(e.to_string().contains("distinct file names"), "{e}");

        let empty = dir.path().join("empty.txt");
        std::fs::write(&empty, "\n# nothing\n").unwrap();
        let e = select(&[], none(), Some(&empty), &Split::all()).unwrap_err();
        assert!(e.to_string().contains("lists no paths"), "{e}");
        let e = select(
            &[],
            none(),
            Some(&dir.path().join("missing.txt")),
            &Split::all(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("cannot open it"), "{e}");
        std::fs::write(&empty, b"\xff\xfe\n").unwrap();
        let e = select(&[], none(), Some(&empty), &Split::all()).unwrap_err();
        assert!(e.to_string().contains("line 1 is not valid UTF-8"), "{e}");
    }

    #[test]
    fn a_marker_counts_only_with_its_output() {
        let dir = tempfile::tempdir().unwrap();
        let m = Marker {
            ncclean_version: "x".into(),
            command: "score".into(),
            shard: "s.parquet".into(),
            output: "s.parquet".into(),
            input_fingerprint: "f".into(),
            source: "c".into(),
            output_digest: None,
            counts: Counts::default(),
            seconds: 0.0,
        };
        let json = serde_json::to_vec(&m).unwrap();
        std::fs::write(marker_path(dir.path(), "s"), &json).unwrap();
        assert_eq!(read_marker(dir.path(), "s"), None, "no output yet");
        std::fs::write(output_path(dir.path(), "s"), b"p").unwrap();
        assert_eq!(read_marker(dir.path(), "s"), Some(m));
        std::fs::write(marker_path(dir.path(), "s"), b"{ damaged").unwrap();
        assert_eq!(read_marker(dir.path(), "s"), None);
    }
}
