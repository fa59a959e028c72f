//! Reading and decoding the user's images within fixed limits.
//!
//! Image paths and bytes come from the user's data and may be hostile: a
//! path column value of `/dev/zero` or a FIFO, `../../etc/passwd`, or a
//! 420 KB PNG whose header declares 12000×12000 pixels. Everything that
//! touches an image before a tower sees it goes through this module, so the
//! rules live in one place:
//!
//! - [`ImageBase::resolve`] (called where rows are read): a relative path
//!   is resolved against the parquet file's directory or `--image-root` and
//!   must stay inside it, after `..` and symbolic links; an absolute path is
//!   refused. `--allow-absolute-paths` lifts both rules.
//! - [`read_file`]: opens without blocking (`O_NONBLOCK`, so a FIFO cannot
//!   hang the open), refuses anything that is not a regular file (checked
//!   with `fstat` on the opened handle, so a swap between check and open
//!   cannot slip a device in), and reads at most `--max-image-bytes`.
//! - [`decode`]: reads the dimensions from the header first and skips
//!   images over `--max-image-pixels` without decoding them; the decoder
//!   gets strict width/height limits and an allocation limit, so a header
//!   that lies cannot make it allocate more than was admitted.
//!
//! Every refusal is a sentence for the row's `error`, never a panic.
//!
//! # Memory bound
//!
//! Decoding memory is bounded for the whole process, independent of the
//! number of cores (and so of the decode threads of
//! `parallel::parallel_map`): before decoding, a decode reserves
//! its cost from one process-wide budget of
//! [`BUDGET_BYTES_PER_PIXEL`] × `--max-image-pixels` bytes (1.6 GB at the
//! default 50 megapixels) and waits while the decodes in flight hold too
//! much of it. The cost of a `w × h` image is estimated from its header as
//! [`DECODER_BYTES_PER_PIXEL`] × w × h (the decoder's output buffer and
//! working memory) plus what the caller's preprocessing allocates (its RGB
//! copy and resampling buffers, `working_bytes` in `ncclean-models`). A
//! maximal image costs about 15 bytes per pixel, so two of them fit the
//! budget at once; an image whose cost exceeds the whole budget (only an
//! absurd aspect ratio, e.g. 50,000,000 × 1, can) is skipped. The budget
//! does not cover the encoded bytes: for path images those are at most one
//! read batch of files of at most `--max-image-bytes` each, for byte
//! columns the parquet batch that already holds them.
//!
//! # JPEG downscaling
//!
//! The image crate (0.25, decoding JPEG with zune-jpeg 0.5) has no
//! scaled (DCT-domain 1/2, 1/4, 1/8) JPEG decoding, and neither do its PNG,
//! WebP, GIF or BMP decoders, so every admitted image is decoded at full
//! size and then resized. The pixel limit and the budget above are what
//! bound that.

use std::io::{Cursor, Read};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};

use image::metadata::Orientation;
use image::{DynamicImage, ImageDecoder, ImageReader, Limits};

/// Default of `--max-image-bytes`: 64 MiB, far above any photograph.
pub const DEFAULT_MAX_IMAGE_BYTES: u64 = 64 << 20;
/// Default of `--max-image-pixels`: 50 megapixels (8660 × 5773), the size of
/// the largest camera sensors in common use.
pub const DEFAULT_MAX_IMAGE_PIXELS: u64 = 50_000_000;
/// Bytes per pixel a decoder may hold while decoding, over the formats
/// built in: the output buffer (at most 8: 16-bit RGBA PNG) or, for a
/// progressive JPEG, its coefficients (2 bytes per component, up to 4
/// components) plus the RGB output; rounded up.
pub const DECODER_BYTES_PER_PIXEL: u64 = 12;
/// The process-wide decode budget, in bytes per `--max-image-pixels`:
/// room for two maximal images (about 15 bytes per pixel each with the RGB
/// copy) and their resampling buffers.
pub const BUDGET_BYTES_PER_PIXEL: u64 = 32;

/// Limits on reading and decoding images (flags `--max-image-bytes`,
/// `--max-image-pixels`, `--allow-absolute-paths`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ImageLimits {
    /// Largest image file read from a path, in bytes.
    pub max_bytes: u64,
    /// Largest image decoded, in pixels (width × height from the header).
    pub max_pixels: u64,
    /// Read absolute paths and paths that lead outside the image base.
    pub allow_absolute_paths: bool,
}

impl Default for ImageLimits {
    fn default() -> Self {
        ImageLimits {
            max_bytes: DEFAULT_MAX_IMAGE_BYTES,
            max_pixels: DEFAULT_MAX_IMAGE_PIXELS,
            allow_absolute_paths: false,
        }
    }
}

impl ImageLimits {
    /// Bytes that all decodes in flight may hold together (see the module
    /// documentation).
    pub fn decode_budget(&self) -> u64 {
        self.max_pixels.saturating_mul(BUDGET_BYTES_PER_PIXEL)
    }
}

/// The directory that relative image paths of one input file are resolved
/// against, with the confinement rule.
#[derive(Debug, Clone)]
pub struct ImageBase {
    /// As given (the parquet file's directory or `--image-root`).
    dir: PathBuf,
    /// `dir` with symbolic links resolved, when it exists; resolved paths
    /// must start with it.
    canonical: Option<PathBuf>,
    /// `--allow-absolute-paths`.
    allow_outside: bool,
}

impl ImageBase {
    /// The base `dir` (an empty path is the working directory); with
    /// `allow_outside`, paths are not confined.
    pub fn new(dir: PathBuf, allow_outside: bool) -> ImageBase {
        let dir = if dir.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            dir
        };
        let canonical = if allow_outside {
            None
        } else {
            std::fs::canonicalize(&dir).ok()
        };
        ImageBase {
            dir,
            canonical,
            allow_outside,
        }
    }

    /// The file a path column value names, or why it is not read.
    ///
    /// Confined (the default), the result is the path with symbolic links
    /// resolved when the file exists, so the file opened later is the one
    /// checked here; a path that does not exist is returned as joined, and
    /// opening it reports why.
    pub fn resolve(&self, raw: &str) -> Result<PathBuf, String> {
        if raw.trim().is_empty() {
            return Err("image path is empty".into());
        }
        let p = Path::new(raw);
        if self.allow_outside {
            return Ok(if p.is_absolute() {
                p.to_path_buf()
            } else {
                self.dir.join(p)
            });
        }
        let outside = || {
            format!(
                "image path {raw} leads outside {}; pass --allow-absolute-paths to read it",
                self.dir.display()
            )
        };
        // Lexically first, so a path that escapes is refused whether or not
        // its target exists.
        let mut depth = 0usize;
        for c in p.components() {
            match c {
                Component::Normal(_) => depth += 1,
                Component::CurDir => {}
                Component::ParentDir => depth = depth.checked_sub(1).ok_or_else(outside)?,
                Component::RootDir | Component::Prefix(_) => {
                    return Err(format!(
                        "image path {raw} is absolute; image paths are read relative to {} \
                         unless --allow-absolute-paths is given",
                        self.dir.display()
                    ))
                }
            }
        }
        let joined = self.dir.join(p);
        // Then for real: a symbolic link inside the base may point anywhere.
        match (std::fs::canonicalize(&joined), &self.canonical) {
            (Ok(real), Some(base)) if !real.starts_with(base) => Err(format!(
                "image path {raw} leads outside {} through a symbolic link (to {}); \
                 pass --allow-absolute-paths to read it",
                self.dir.display(),
                real.display()
            )),
            (Ok(real), Some(_)) => Ok(real),
            // Missing (or the base itself is): opening it says why.
            _ => Ok(joined),
        }
    }
}

/// Why `path` (with metadata `meta`, not a regular file) is not read.
fn not_regular(path: &Path, meta: &std::fs::Metadata) -> String {
    let mut kind = if meta.is_dir() {
        Some("a directory")
    } else {
        None
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        let t = meta.file_type();
        if t.is_char_device() {
            kind = Some("a character device");
        } else if t.is_block_device() {
            kind = Some("a block device");
        } else if t.is_fifo() {
            kind = Some("a FIFO (named pipe)");
        } else if t.is_socket() {
            kind = Some("a socket");
        }
    }
    match kind {
        Some(k) => format!("image file {} is {k}, not a regular file", path.display()),
        None => format!("image file {} is not a regular file", path.display()),
    }
}

/// `n` bytes for people: `512 bytes`, `4 KiB`, `70.5 MiB`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} bytes");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{} {}", one_decimal(v), UNITS[unit])
}

/// One decimal, without a trailing `.0`.
fn one_decimal(v: f64) -> String {
    let s = format!("{v:.1}");
    s.strip_suffix(".0").map(str::to_string).unwrap_or(s)
}

/// Read the image file at `path` (as resolved by [`ImageBase::resolve`]):
/// regular files only, at most `max_bytes` bytes.
pub fn read_file(path: &Path, max_bytes: u64) -> Result<Vec<u8>, String> {
    let cannot = |e: std::io::Error| format!("cannot read image file {}: {e}", path.display());
    // A look before opening, so a device is not even opened (opening some
    // has side effects); the check on the handle below is the one that
    // counts.
    if let Ok(meta) = std::fs::metadata(path) {
        if !meta.is_file() {
            return Err(not_regular(path, &meta));
        }
    }
    let mut opts = std::fs::OpenOptions::new();
    opts.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        // Opening a FIFO for reading blocks until a writer comes, unless
        // non-blocking; a terminal must not become our controlling one.
        // Neither flag changes how a regular file is read.
        opts.custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY);
    }
    let file = opts.open(path).map_err(cannot)?;
    let meta = file.metadata().map_err(cannot)?;
    if !meta.is_file() {
        return Err(not_regular(path, &meta));
    }
    let over = |size: &str| {
        format!(
            "image file {} is {size}, over the {} limit (--max-image-bytes)",
            path.display(),
            human_bytes(max_bytes)
        )
    };
    if meta.len() > max_bytes {
        return Err(over(&human_bytes(meta.len())));
    }
    // The size can change after the fstat: read one byte past the limit to
    // tell, never more.
    let mut buf = Vec::with_capacity(meta.len() as usize);
    file.take(max_bytes.saturating_add(1))
        .read_to_end(&mut buf)
        .map_err(cannot)?;
    if buf.len() as u64 > max_bytes {
        return Err(over("larger than that (it grew while being read)"));
    }
    Ok(buf)
}

/// A counting semaphore in bytes: decodes reserve their cost before
/// decoding and give it back when done, so the decodes in flight never hold
/// more than the budget together.
pub(crate) struct DecodeBudget {
    in_use: Mutex<u64>,
    freed: Condvar,
    /// Highest `in_use` seen, for tests.
    peak: AtomicU64,
}

/// The process-wide budget every decode draws from.
static DECODES: DecodeBudget = DecodeBudget::new();

impl DecodeBudget {
    pub(crate) const fn new() -> DecodeBudget {
        DecodeBudget {
            in_use: Mutex::new(0),
            freed: Condvar::new(),
            peak: AtomicU64::new(0),
        }
    }

    /// Wait until `cost` fits under `budget` next to the decodes in flight.
    /// A decode is always let in when none is in flight, so a cost up to
    /// the whole budget never waits forever.
    fn reserve(&self, cost: u64, budget: u64) -> Reservation<'_> {
        // Poisoning only means a holder panicked; the count is still right
        // because reservations are returned on unwinding too.
        let mut in_use = self.in_use.lock().unwrap_or_else(PoisonError::into_inner);
        while *in_use > 0 && in_use.saturating_add(cost) > budget {
            in_use = self
                .freed
                .wait(in_use)
                .unwrap_or_else(PoisonError::into_inner);
        }
        *in_use += cost;
        self.peak.fetch_max(*in_use, Ordering::Relaxed);
        Reservation { budget: self, cost }
    }

    #[cfg(test)]
    pub(crate) fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }
}

/// A held part of a [`DecodeBudget`], given back on drop (also when a
/// decoder panics).
struct Reservation<'a> {
    budget: &'a DecodeBudget,
    cost: u64,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        let mut in_use = self
            .budget
            .in_use
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *in_use -= self.cost;
        self.budget.freed.notify_all();
    }
}

/// Decode `bytes` within `limits` and hand the image to `finish` (the
/// caller's preprocessing) while its memory is reserved.
/// `working(w, h)` is what `finish` allocates for a `w × h` image besides
/// the image itself. Images over `limits.max_pixels` are refused from their
/// header, without decoding.
pub fn decode<T>(
    bytes: &[u8],
    limits: &ImageLimits,
    working: impl Fn(u32, u32) -> u64,
    finish: impl FnOnce(DynamicImage) -> T,
) -> Result<T, String> {
    decode_in(&DECODES, bytes, limits, working, finish)
}

pub(crate) fn decode_in<T>(
    budget: &DecodeBudget,
    bytes: &[u8],
    limits: &ImageLimits,
    working: impl Fn(u32, u32) -> u64,
    finish: impl FnOnce(DynamicImage) -> T,
) -> Result<T, String> {
    let cannot = |e: &dyn std::fmt::Display| format!("cannot decode image: {e}");
    let total = limits.decode_budget();
    let mut reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| cannot(&e))?;
    // Reading the header may allocate too (PNG text and colour-profile
    // chunks): never more than the budget.
    let mut header_limits = Limits::default();
    header_limits.max_alloc = Some(total);
    reader.limits(header_limits);
    let mut decoder = reader.into_decoder().map_err(|e| cannot(&e))?;
    let (w, h) = decoder.dimensions();
    let pixels = u64::from(w) * u64::from(h);
    if pixels > limits.max_pixels {
        return Err(format!(
            "image is {w}×{h} pixels ({} megapixels), over the {} megapixel limit \
             (--max-image-pixels); not decoded",
            one_decimal(pixels as f64 / 1e6),
            one_decimal(limits.max_pixels as f64 / 1e6)
        ));
    }
    let cost = pixels
        .saturating_mul(DECODER_BYTES_PER_PIXEL)
        .saturating_add(working(w, h));
    if cost > total {
        return Err(format!(
            "decoding and resizing this {w}×{h} image would need {}, over the {} decode budget \
             ({BUDGET_BYTES_PER_PIXEL} bytes × --max-image-pixels); not decoded",
            human_bytes(cost),
            human_bytes(total)
        ));
    }
    // Strict limits: the decoder may not produce more than the header
    // promised, nor allocate more than was reserved for it.
    let mut strict = Limits::default();
    strict.max_image_width = Some(w);
    strict.max_image_height = Some(h);
    strict.max_alloc = Some(cost);
    decoder.set_limits(strict).map_err(|e| cannot(&e))?;
    // Phones store photos sideways and say so in EXIF; a tower must see
    // them upright. Rotating copies the decoded image once more.
    let orientation = decoder.orientation().unwrap_or(Orientation::NoTransforms);
    let cost = if orientation == Orientation::NoTransforms {
        cost
    } else {
        cost.saturating_add(decoder.total_bytes())
    };
    let _reserved = budget.reserve(cost, total);
    let mut img = DynamicImage::from_decoder(decoder).map_err(|e| cannot(&e))?;
    img.apply_orientation(orientation);
    Ok(finish(img))
}

/// Format and size from the header of `bytes`, without decoding pixels
/// (None when the header cannot be read).
pub fn header(bytes: &[u8]) -> Option<(image::ImageFormat, u32, u32)> {
    let reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .ok()?;
    let format = reader.format()?;
    let (w, h) = reader.into_dimensions().ok()?;
    Some((format, w, h))
}

/// The EXIF orientation code (1–8) that the header of `bytes` declares, or
/// `None` for upright images, unknown formats and unreadable headers. Reads
/// headers only, within the decode budget: cheap enough to run before a
/// cache lookup, so that a rotated photo's cached features are keyed apart
/// from features computed before orientation was applied.
pub fn exif_orientation(bytes: &[u8], limits: &ImageLimits) -> Option<u8> {
    let mut reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .ok()?;
    let mut header_limits = Limits::default();
    header_limits.max_alloc = Some(limits.decode_budget());
    reader.limits(header_limits);
    let o = reader.into_decoder().ok()?.orientation().ok()?;
    (o != Orientation::NoTransforms).then(|| o.to_exif())
}

#[cfg(test)]
mod tests;
