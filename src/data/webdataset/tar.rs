//! A tar reader that walks member headers and reads only the data asked for.
//!
//! Written here rather than taken from the `tar` crate because a shard is
//! user data that may be cut short or damaged: this reader bounds every
//! allocation (extension headers at [`MAX_EXTENSION_BYTES`], member data at
//! the caller's limit), tells a member cut short by the end of the file from
//! a complete one without reading its data, and reports each member's raw
//! byte span (its extension headers, header, data and padding) so a
//! filtered shard can copy kept members byte for byte.
//!
//! Formats read: ustar (name + prefix), GNU long names (`L`), pax local
//! headers (`x`: `path` and `size`), octal and base-256 sizes. Anything that
//! is not a regular file (directories, links, pax global headers) comes out
//! as [`Entry::Other`].
//!
//! Damage does not end the archive: as GNU tar does ("Skipping to next
//! header"), a block that is not a valid header (bad checksum, unreadable
//! size), a lone zero block followed by more data, or an extension header
//! over [`MAX_EXTENSION_BYTES`] (with the member it describes) comes out as
//! [`Entry::Damaged`] with the byte span passed over, and reading resumes at
//! the next valid header. Only the end of the file ends the archive early.

use std::fs::File;
use std::io::{BufReader, Read, Seek};
use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::error::Result;

const BLOCK: u64 = 512;
/// Largest pax or GNU long-name extension header read: real ones hold a
/// path and a few numbers, far below this.
pub(crate) const MAX_EXTENSION_BYTES: u64 = 1 << 20;

/// A regular file in the tar.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Member {
    /// The member's path inside the tar, as written (lossy UTF-8).
    pub name: String,
    /// Data bytes according to the header.
    pub size: u64,
    /// Offset of the member's first block (its first extension header).
    pub start: u64,
    /// Offset of its data.
    pub data_at: u64,
    /// Offset after its data's padding: where the next entry starts.
    pub end: u64,
    /// The file ends inside the member's data: only this many of its
    /// `size` bytes exist.
    pub truncated: Option<u64>,
}

/// What [`TarReader::next_entry`] finds.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Entry {
    /// A regular file.
    File(Member),
    /// Anything else, with its raw span `start..end`: `global` says whether
    /// it is a pax global header, which applies to every later member.
    Other { start: u64, end: u64, global: bool },
    /// Bytes `start..end` could not be read as members: whatever members
    /// lay there are lost. The words say why; reading goes on at `end`.
    Damaged { start: u64, end: u64, why: String },
}

/// What the extension headers before a member said about it.
#[derive(Default)]
struct Extensions {
    /// A GNU long name (`L`).
    long_name: Option<String>,
    /// A pax `path` record.
    pax_path: Option<String>,
    /// A pax `size` record.
    pax_size: Option<u64>,
    /// Why an extension header was passed over unread: the member it
    /// describes goes with it, since its name or size is not known.
    oversized: Option<String>,
}

/// Where a member lies: its entry's first header, its data, its size and
/// the end of its padded data.
struct Span {
    start: u64,
    data_at: u64,
    size: u64,
    end: u64,
}

/// A tar file read entry by entry.
pub(crate) struct TarReader {
    file: BufReader<File>,
    path: PathBuf,
    /// Where the reader's file position is, and the file's length.
    pos: u64,
    len: u64,
    /// Offset of the next entry's first block.
    next: u64,
    done: bool,
}

impl TarReader {
    /// Open `path` for reading.
    pub fn open(path: &Path) -> Result<TarReader> {
        // Checked before opening: opening a FIFO would wait for a writer.
        crate::data::regular_file_len(path)?;
        let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let len = file
            .metadata()
            .with_context(|| format!("reading {}", path.display()))?
            .len();
        Ok(TarReader {
            file: BufReader::with_capacity(64 * 1024, file),
            path: path.to_path_buf(),
            pos: 0,
            len,
            next: 0,
            done: false,
        })
    }

    fn seek_to(&mut self, at: u64) -> std::io::Result<()> {
        if at != self.pos {
            let delta = at as i128 - self.pos as i128;
            match i64::try_from(delta) {
                Ok(d) => self.file.seek_relative(d)?,
                Err(_) => {
                    self.file.seek(std::io::SeekFrom::Start(at))?;
                }
            }
            self.pos = at;
        }
        Ok(())
    }

    fn read_exact_at(&mut self, at: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.seek_to(at)?;
        self.file.read_exact(buf)?;
        self.pos += buf.len() as u64;
        Ok(())
    }

    /// The next entry, or `None` after the end of the archive (two zero
    /// blocks, or the end of the file at an entry boundary). After damage
    /// inside the file, reading resumes at the next valid header; after a
    /// truncated member or header, nothing more comes.
    ///
    /// Phases: [`TarReader::header`] reads and checks one header block,
    /// extension headers are gathered by [`TarReader::extension`] until a
    /// member's header, which [`TarReader::member`] turns into the entry.
    pub fn next_entry(&mut self) -> Result<Option<Entry>> {
        if self.done {
            return Ok(None);
        }
        let start = self.next;
        let mut ext = Extensions::default();
        loop {
            let at = self.next;
            let h = match self.header(start, at)? {
                Ok(h) => h,
                Err(entry) => return Ok(entry),
            };
            let Some(size) = header_size(&h) else {
                return self.skip_damage(
                    start,
                    at,
                    format!("the header at byte {at} has an unreadable size field"),
                );
            };
            let kind = h[156];
            let data_at = at + BLOCK;
            let extension = matches!(kind, b'x' | b'L');
            let ext_size = if extension {
                size
            } else {
                ext.pax_size.unwrap_or(size)
            };
            let Some(end) = ext_size
                .checked_add(BLOCK - 1)
                .and_then(|s| data_at.checked_add(s & !(BLOCK - 1)))
            else {
                return self.skip_damage(
                    start,
                    at,
                    format!("the header at byte {at} declares an impossible size"),
                );
            };
            self.next = end;
            if extension {
                match self.extension(&mut ext, start, at, size, kind)? {
                    Some(damaged) => return Ok(Some(damaged)),
                    None => continue,
                }
            }
            let member = Span {
                start,
                data_at,
                size: ext_size,
                end,
            };
            return Ok(Some(self.member(ext, &h, member)));
        }
    }

    /// The header block at `at` (entries from `start`), or what ends the
    /// entry there instead (`Err`): the end of the file or of the archive,
    /// a truncated header, or damage.
    fn header(
        &mut self,
        start: u64,
        at: u64,
    ) -> Result<std::result::Result<[u8; BLOCK as usize], Option<Entry>>> {
        if at >= self.len {
            self.done = true;
            // Extension headers read but no member after them.
            return Ok(Err((at > start).then(|| Entry::Damaged {
                start,
                end: self.len,
                why: format!(
                    "the file ends after an extension header at byte {start}, before the member it describes (a truncated tar)"
                ),
            })));
        }
        if self.len - at < BLOCK {
            self.done = true;
            return Ok(Err(Some(Entry::Damaged {
                start,
                end: self.len,
                why: format!("the file ends inside a member header at byte {at} (a truncated tar)"),
            })));
        }
        let mut h = [0u8; BLOCK as usize];
        self.read_exact_at(at, &mut h)
            .with_context(|| format!("reading {}", self.path.display()))?;
        if h.iter().all(|&b| b == 0) {
            return self.zero_block(start, at).map(Err);
        }
        if !checksum_ok(&h) {
            return self
                .skip_damage(
                    start,
                    at,
                    format!("the block at byte {at} is not a valid tar header (checksum mismatch)"),
                )
                .map(Err);
        }
        Ok(Ok(h))
    }

    /// The extension header (`x`: pax, `L`: GNU long name) of `size` bytes
    /// at `at`, its records kept in `ext` for the member it describes; the
    /// damage when the file ends inside it.
    fn extension(
        &mut self,
        ext: &mut Extensions,
        start: u64,
        at: u64,
        size: u64,
        kind: u8,
    ) -> Result<Option<Entry>> {
        let data_at = at + BLOCK;
        if data_at.saturating_add(size) > self.len {
            self.done = true;
            return Ok(Some(Entry::Damaged {
                start,
                end: self.len,
                why: format!(
                    "the file ends inside the extension header at byte {at} (a truncated tar)"
                ),
            }));
        }
        if size > MAX_EXTENSION_BYTES {
            // Legal, but no real name or record list is this long: pass
            // over it unread, with the member it describes.
            let what = if kind == b'L' {
                "GNU long name"
            } else {
                "pax header"
            };
            ext.oversized.get_or_insert(format!(
                "the {what} at byte {at} is {size} bytes, more than the {MAX_EXTENSION_BYTES} ncclean reads, so the member it describes is passed over"
            ));
            return Ok(None);
        }
        let mut data = vec![0u8; size as usize];
        self.read_exact_at(data_at, &mut data)
            .with_context(|| format!("reading {}", self.path.display()))?;
        if kind == b'L' {
            ext.long_name = Some(c_string(&data));
        } else {
            for (k, v) in pax_records(&data) {
                match k.as_str() {
                    "path" => ext.pax_path = Some(v),
                    "size" => ext.pax_size = v.trim().parse().ok(),
                    _ => {}
                }
            }
        }
        Ok(None)
    }

    /// The entry of the member header `h` spanning `m`, named by the
    /// extension headers before it (`ext`) when they give a name: a file,
    /// another kind of member, or damage when an extension header of it
    /// was passed over.
    fn member(&mut self, ext: Extensions, h: &[u8; BLOCK as usize], m: Span) -> Entry {
        let (start, end) = (m.start, m.end.min(self.len));
        if let Some(why) = ext.oversized {
            if m.end > self.len {
                self.done = true;
            }
            return Entry::Damaged { start, end, why };
        }
        let kind = h[156];
        if matches!(kind, b'0' | 0 | b'7') {
            let name = ext
                .long_name
                .or(ext.pax_path)
                .unwrap_or_else(|| ustar_name(h));
            let truncated = (m.data_at.saturating_add(m.size) > self.len)
                .then(|| self.len.saturating_sub(m.data_at));
            if truncated.is_some() {
                self.done = true;
            }
            return Entry::File(Member {
                name,
                size: m.size,
                start,
                data_at: m.data_at,
                end,
                truncated,
            });
        }
        Entry::Other {
            start,
            end,
            global: kind == b'g',
        }
    }

    /// A zero block at `at` (entries from `start`): the end of the archive
    /// when the next block is zero too or the file ends; otherwise a lone
    /// zero block (a zeroed header), damage up to the next valid header, or
    /// to the end of the file when none follows.
    fn zero_block(&mut self, start: u64, at: u64) -> Result<Option<Entry>> {
        let after = at + BLOCK;
        let mut next = [0u8; BLOCK as usize];
        let ends = self.len - after < BLOCK || {
            self.read_exact_at(after, &mut next)
                .with_context(|| format!("reading {}", self.path.display()))?;
            next.iter().all(|&b| b == 0)
        };
        if ends {
            self.done = true;
            return Ok((at > start).then(|| Entry::Damaged {
                start,
                end: at,
                why: format!(
                    "the archive ends at byte {at}, after an extension header at byte {start} and before the member it describes"
                ),
            }));
        }
        let why =
            format!("a lone zero block at byte {at} inside the archive (its end is marked by two)");
        let resume = match self.find_header(after)? {
            Some(resume) => resume,
            None => {
                self.done = true;
                self.len
            }
        };
        self.next = resume;
        Ok(Some(Entry::Damaged {
            start,
            end: resume,
            why,
        }))
    }

    /// Damage found at `at` (entries from `start`): skip to the next valid
    /// header, as GNU tar does, and say what was passed over.
    fn skip_damage(&mut self, start: u64, at: u64, why: String) -> Result<Option<Entry>> {
        let resume = self.find_header(at + BLOCK)?.unwrap_or(self.len);
        self.next = resume;
        Ok(Some(Entry::Damaged {
            start,
            end: resume,
            why,
        }))
    }

    /// The offset of the first block from `from` on that is a valid header
    /// (a checksum that adds up, not all zeros), block by block.
    fn find_header(&mut self, from: u64) -> Result<Option<u64>> {
        let mut h = [0u8; BLOCK as usize];
        let mut at = from;
        let mut blocks = 0u64;
        while self.len.saturating_sub(at) >= BLOCK {
            blocks += 1;
            if blocks.is_multiple_of(65_536) {
                crate::runtime::interrupt::check()?;
            }
            self.read_exact_at(at, &mut h)
                .with_context(|| format!("reading {}", self.path.display()))?;
            if !h.iter().all(|&b| b == 0) && checksum_ok(&h) {
                return Ok(Some(at));
            }
            at += BLOCK;
        }
        Ok(None)
    }

    /// The data of `m`, which must be complete and at most `limit` bytes
    /// (the caller checks both and words the refusal).
    pub fn read_data(&mut self, m: &Member) -> Result<Vec<u8>> {
        let mut data = vec![0u8; m.size as usize];
        self.read_exact_at(m.data_at, &mut data)
            .with_context(|| format!("reading {} from {}", m.name, self.path.display()))?;
        Ok(data)
    }

    /// Copy the raw bytes `start..end` of the tar to `out`.
    pub fn copy_raw(&mut self, start: u64, end: u64, out: &mut impl std::io::Write) -> Result<()> {
        self.seek_to(start)
            .with_context(|| format!("reading {}", self.path.display()))?;
        let n = end.saturating_sub(start);
        let copied = std::io::copy(&mut (&mut self.file).take(n), out)
            .with_context(|| format!("copying from {}", self.path.display()))?;
        self.pos += copied;
        if copied != n {
            return Err(anyhow::anyhow!(
                "{} changed while it was being copied (it ended early)",
                self.path.display()
            )
            .into());
        }
        Ok(())
    }
}

/// The header checksum: the sum of its bytes with the checksum field read
/// as spaces; old writers summed signed bytes, so either sum is accepted.
fn checksum_ok(h: &[u8; BLOCK as usize]) -> bool {
    let Some(want) = octal(&h[148..156]) else {
        return false;
    };
    let (mut unsigned, mut signed) = (0i64, 0i64);
    for (i, &b) in h.iter().enumerate() {
        let b = if (148..156).contains(&i) { b' ' } else { b };
        unsigned += b as i64;
        signed += b as i8 as i64;
    }
    want as i64 == unsigned || want as i64 == signed
}

/// An octal field: digits, padded by spaces or NULs.
fn octal(field: &[u8]) -> Option<u64> {
    let s: Vec<u8> = field
        .iter()
        .copied()
        .skip_while(|&b| b == b' ')
        .take_while(|&b| b != 0 && b != b' ')
        .collect();
    if s.is_empty() {
        return Some(0);
    }
    let s = std::str::from_utf8(&s).ok()?;
    u64::from_str_radix(s, 8).ok()
}

/// The size field: octal, or base-256 (high bit set) for sizes of 8 GiB and
/// more.
fn header_size(h: &[u8; BLOCK as usize]) -> Option<u64> {
    let field = &h[124..136];
    if field[0] & 0x80 != 0 {
        let mut v: u64 = (field[0] & 0x7f) as u64;
        for &b in &field[1..] {
            v = v.checked_mul(256)?.checked_add(b as u64)?;
        }
        Some(v)
    } else {
        octal(field)
    }
}

/// Bytes up to the first NUL, as lossy UTF-8.
fn c_string(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// The name field, with the ustar prefix where the header is POSIX ustar.
fn ustar_name(h: &[u8; BLOCK as usize]) -> String {
    let name = c_string(&h[0..100]);
    // POSIX ustar ("ustar\0") has a prefix; GNU ("ustar  ") uses those
    // bytes for other fields.
    if &h[257..263] == b"ustar\0" {
        let prefix = c_string(&h[345..500]);
        if !prefix.is_empty() {
            return format!("{prefix}/{name}");
        }
    }
    name
}

/// The `key=value` records of a pax header (`<len> <key>=<value>\n`); a
/// malformed record ends the list.
fn pax_records(data: &[u8]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = data;
    while !rest.is_empty() {
        let Some(sp) = rest.iter().position(|&b| b == b' ') else {
            break;
        };
        let Some(len) = std::str::from_utf8(&rest[..sp])
            .ok()
            .and_then(|s| s.parse::<usize>().ok())
        else {
            break;
        };
        if len <= sp + 1 || len > rest.len() {
            break;
        }
        let record = &rest[sp + 1..len];
        let record = record.strip_suffix(b"\n").unwrap_or(record);
        if let Some(eq) = record.iter().position(|&b| b == b'=') {
            out.push((
                String::from_utf8_lossy(&record[..eq]).into_owned(),
                String::from_utf8_lossy(&record[eq + 1..]).into_owned(),
            ));
        }
        rest = &rest[len..];
    }
    out
}
