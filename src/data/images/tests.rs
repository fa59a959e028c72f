use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use super::*;

/// CRC-32 (IEEE, as PNG uses it), bit by bit: tests only.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = 0xFFFF_FFFFu32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// A PNG that declares `w × h` RGB pixels but carries only a tiny IDAT:
/// what a hostile file looks like (a few bytes that promise gigabytes).
pub(crate) fn png_declaring(w: u32, h: u32) -> Vec<u8> {
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut chunk = |kind: &[u8; 4], data: &[u8]| {
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        let mut body = kind.to_vec();
        body.extend_from_slice(data);
        out.extend_from_slice(&body);
        out.extend_from_slice(&crc32(&body).to_be_bytes());
    };
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&w.to_be_bytes());
    ihdr.extend_from_slice(&h.to_be_bytes());
    // 8-bit RGB, deflate, adaptive filtering, not interlaced.
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    chunk(b"IHDR", &ihdr);
    // A zlib stream of nothing.
    chunk(b"IDAT", &[0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01]);
    chunk(b"IEND", &[]);
    out
}

fn png(w: u32, h: u32) -> Vec<u8> {
    let img = image::RgbImage::from_fn(w, h, |x, y| image::Rgb([x as u8, y as u8, 7]));
    let mut buf = Vec::new();
    DynamicImage::ImageRgb8(img)
        .write_to(&mut Cursor::new(&mut buf), image::ImageFormat::Png)
        .unwrap();
    buf
}

#[test]
fn crc32_matches_the_png_specification() {
    // The CRC of an IEND chunk's type, as every PNG ends with it.
    assert_eq!(crc32(b"IEND"), 0xAE42_6082);
}

#[test]
fn relative_paths_stay_inside_the_base() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(root.join("imgs")).unwrap();
    std::fs::write(root.join("imgs/a.png"), b"x").unwrap();
    std::fs::write(dir.path().join("secret.png"), b"x").unwrap();
    let base = ImageBase::new(root.clone(), false);
    let real = root.canonicalize().unwrap();

    assert_eq!(base.resolve("imgs/a.png").unwrap(), real.join("imgs/a.png"));
    assert_eq!(
        base.resolve("./imgs/../imgs/a.png").unwrap(),
        real.join("imgs/a.png")
    );
    // Missing files resolve; opening them says why they cannot be read.
    assert_eq!(
        base.resolve("imgs/nope.png").unwrap(),
        root.join("imgs/nope.png")
    );
    assert_eq!(base.resolve("  ").unwrap_err(), "image path is empty");

    let e = base.resolve("../../etc/passwd").unwrap_err();
    assert!(
        e.contains("leads outside") && e.contains("--allow-absolute-paths"),
        "{e}"
    );
    let e = base.resolve("imgs/../../secret.png").unwrap_err();
    assert!(e.contains("leads outside"), "{e}");
    let e = base.resolve("/etc/passwd").unwrap_err();
    assert!(
        e.contains("is absolute") && e.contains("--allow-absolute-paths"),
        "{e}"
    );

    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(dir.path().join("secret.png"), root.join("link.png")).unwrap();
        std::os::unix::fs::symlink("/etc", root.join("etc")).unwrap();
        std::os::unix::fs::symlink(root.join("imgs/a.png"), root.join("inside.png")).unwrap();
        let e = base.resolve("link.png").unwrap_err();
        assert!(e.contains("through a symbolic link"), "{e}");
        let e = base.resolve("etc/passwd").unwrap_err();
        assert!(e.contains("through a symbolic link"), "{e}");
        assert_eq!(base.resolve("inside.png").unwrap(), real.join("imgs/a.png"));
    }

    let open = ImageBase::new(root.clone(), true);
    assert_eq!(
        open.resolve("/etc/passwd").unwrap(),
        Path::new("/etc/passwd")
    );
    assert_eq!(
        open.resolve("../secret.png").unwrap(),
        root.join("../secret.png")
    );
}

#[test]
fn an_empty_base_is_the_working_directory() {
    let base = ImageBase::new(PathBuf::new(), false);
    let e = base.resolve("../x.png").unwrap_err();
    assert!(e.contains("outside ."), "{e}");
}

#[cfg(unix)]
#[test]
fn devices_fifos_and_directories_are_not_read() {
    let t = Instant::now();
    let e = read_file(Path::new("/dev/zero"), DEFAULT_MAX_IMAGE_BYTES).unwrap_err();
    assert!(
        e.contains("/dev/zero is a character device, not a regular file"),
        "{e}"
    );

    let dir = tempfile::tempdir().unwrap();
    let e = read_file(dir.path(), DEFAULT_MAX_IMAGE_BYTES).unwrap_err();
    assert!(e.contains("is a directory, not a regular file"), "{e}");

    let fifo = dir.path().join("fifo.png");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path; mkfifo has no other preconditions.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    // Without O_NONBLOCK the open blocks until a writer comes: run it on a
    // thread so a regression fails the test instead of hanging it.
    let (tx, rx) = std::sync::mpsc::channel();
    let f = fifo.clone();
    std::thread::spawn(move || {
        let _ = tx.send(read_file(&f, DEFAULT_MAX_IMAGE_BYTES));
    });
    let e = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("reading a FIFO hung")
        .unwrap_err();
    assert!(
        e.contains("is a FIFO (named pipe), not a regular file"),
        "{e}"
    );
    assert!(t.elapsed() < Duration::from_secs(20));
}

#[test]
fn files_over_the_byte_limit_are_not_read() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("big.png");
    std::fs::write(&p, vec![7u8; 5000]).unwrap();
    let e = read_file(&p, 4096).unwrap_err();
    assert!(
        e.ends_with("big.png is 4.9 KiB, over the 4 KiB limit (--max-image-bytes)"),
        "{e}"
    );
    assert_eq!(read_file(&p, 5000).unwrap().len(), 5000);
    let e = read_file(&dir.path().join("missing.png"), 10).unwrap_err();
    assert!(e.starts_with("cannot read image file "), "{e}");
}

#[test]
fn human_sizes() {
    assert_eq!(human_bytes(512), "512 bytes");
    assert_eq!(human_bytes(4096), "4 KiB");
    assert_eq!(human_bytes(DEFAULT_MAX_IMAGE_BYTES), "64 MiB");
    assert_eq!(human_bytes(70 * 1024 * 1024 + 512 * 1024), "70.5 MiB");
    assert_eq!(human_bytes(3 << 30), "3 GiB");
}

fn no_working(_: u32, _: u32) -> u64 {
    0
}

#[test]
fn images_over_the_pixel_limit_are_refused_from_the_header() {
    let budget = DecodeBudget::new();
    let hostile = png_declaring(12_000, 12_000);
    assert!(hostile.len() < 100);
    let called = AtomicBool::new(false);
    let t = Instant::now();
    let e = decode_in(
        &budget,
        &hostile,
        &ImageLimits::default(),
        no_working,
        |_| called.store(true, Ordering::Relaxed),
    )
    .unwrap_err();
    assert_eq!(
        e,
        "image is 12000×12000 pixels (144 megapixels), over the 50 megapixel limit \
         (--max-image-pixels); not decoded"
    );
    assert!(!called.load(Ordering::Relaxed));
    assert_eq!(
        budget.peak(),
        0,
        "nothing was reserved, so nothing was decoded"
    );
    assert!(t.elapsed() < Duration::from_secs(2));

    // The limit is the flag's, and an image at the limit is decoded.
    let limits = ImageLimits {
        max_pixels: 64,
        ..ImageLimits::default()
    };
    assert!(decode_in(&budget, &png(8, 9), &limits, no_working, |_| ()).is_err());
    let img = decode_in(&budget, &png(8, 8), &limits, no_working, |i| i).unwrap();
    assert_eq!((img.width(), img.height()), (8, 8));
}

#[test]
fn absurd_aspect_ratios_are_refused_before_resizing() {
    // 40000 × 1 is within 50 megapixels, but resizing it to a 224 shorter
    // side would make a 8,960,000 × 224 image.
    let pre = ncclean_models::preprocess::ImagePreprocess::imagenet();
    let e = decode(
        &png_declaring(40_000, 1),
        &ImageLimits::default(),
        |w, h| pre.working_bytes(w, h),
        |_| (),
    )
    .unwrap_err();
    assert!(
        e.starts_with("decoding and resizing this 40000×1 image would need"),
        "{e}"
    );
    assert!(
        e.contains("decode budget (32 bytes × --max-image-pixels)"),
        "{e}"
    );
}

#[test]
fn garbage_and_truncated_images_say_they_cannot_be_decoded() {
    let limits = ImageLimits::default();
    let e = decode(b"not an image", &limits, no_working, |_| ()).unwrap_err();
    assert!(e.starts_with("cannot decode image"), "{e}");
    // Within the limits, but the pixel data is missing.
    let e = decode(&png_declaring(64, 64), &limits, no_working, |_| ()).unwrap_err();
    assert!(e.starts_with("cannot decode image"), "{e}");
}

#[test]
fn concurrent_decodes_stay_within_the_budget_whatever_the_thread_count() {
    let budget = DecodeBudget::new();
    // Budget 32 × 4096 bytes; each 64 × 64 image costs 12 × 4096 + 20000,
    // so two fit at once, never three, however many threads decode.
    let limits = ImageLimits {
        max_pixels: 64 * 64,
        ..ImageLimits::default()
    };
    let cost = 12 * 64 * 64 + 10_000;
    assert!(2 * cost <= limits.decode_budget() && 3 * cost > limits.decode_budget());
    let bytes = png(64, 64);
    let done = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..16 {
            s.spawn(|| {
                for _ in 0..4 {
                    decode_in(
                        &budget,
                        &bytes,
                        &limits,
                        |_, _| 10_000,
                        |img| {
                            // Hold the image a little, so decodes overlap.
                            std::thread::sleep(Duration::from_millis(2));
                            assert_eq!(img.width(), 64);
                        },
                    )
                    .unwrap();
                    done.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    });
    assert_eq!(done.load(Ordering::Relaxed), 64);
    assert!(budget.peak() <= limits.decode_budget(), "{}", budget.peak());
    assert!(budget.peak() > cost, "decodes did run side by side");
    assert_eq!(
        *budget.in_use.lock().unwrap(),
        0,
        "every reservation was returned"
    );
}

#[test]
fn a_panicking_preprocessing_returns_its_reservation() {
    let budget = DecodeBudget::new();
    let bytes = png(4, 4);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        decode_in(&budget, &bytes, &ImageLimits::default(), no_working, |_| {
            panic!("decoder bug")
        })
    }));
    assert!(r.is_err());
    assert!(budget.peak() > 0);
    assert_eq!(*budget.in_use.lock().unwrap(), 0);
}

/// A JPEG of `w × h` pixels, left half black and right half white, with an
/// EXIF APP1 segment declaring `orientation` (none when 0). The segment is
/// written by hand: a little-endian TIFF header and one IFD entry, tag
/// 0x0112 (Orientation), type SHORT, count 1.
fn jpeg_with_orientation(w: u32, h: u32, orientation: u16) -> Vec<u8> {
    let img = image::RgbImage::from_fn(w, h, |x, _| {
        if x < w / 2 {
            image::Rgb([0, 0, 0])
        } else {
            image::Rgb([255, 255, 255])
        }
    });
    let mut jpeg = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut jpeg, 95)
        .encode_image(&img)
        .unwrap();
    if orientation == 0 {
        return jpeg;
    }
    let mut tiff = b"II*\0".to_vec();
    tiff.extend_from_slice(&8u32.to_le_bytes()); // first IFD at offset 8
    tiff.extend_from_slice(&1u16.to_le_bytes()); // one entry
    tiff.extend_from_slice(&0x0112u16.to_le_bytes());
    tiff.extend_from_slice(&3u16.to_le_bytes()); // SHORT
    tiff.extend_from_slice(&1u32.to_le_bytes()); // count
    tiff.extend_from_slice(&orientation.to_le_bytes());
    tiff.extend_from_slice(&[0, 0]); // value padding
    tiff.extend_from_slice(&0u32.to_le_bytes()); // no next IFD
    let mut app1 = b"Exif\0\0".to_vec();
    app1.extend_from_slice(&tiff);
    let mut out = jpeg[..2].to_vec(); // SOI
    out.extend_from_slice(&[0xFF, 0xE1]);
    out.extend_from_slice(&((app1.len() + 2) as u16).to_be_bytes());
    out.extend_from_slice(&app1);
    out.extend_from_slice(&jpeg[2..]);
    out
}

#[test]
fn exif_orientation_is_applied_before_preprocessing() {
    let limits = ImageLimits::default();
    let upright = jpeg_with_orientation(8, 4, 0);
    let rotated = jpeg_with_orientation(8, 4, 6); // 6: rotate 90° clockwise
    assert_eq!(exif_orientation(&upright, &limits), None);
    assert_eq!(exif_orientation(&rotated, &limits), Some(6));
    assert_eq!(exif_orientation(b"not an image", &limits), None);

    let decode_rgb = |b: &[u8]| decode(b, &limits, no_working, |img| img.to_rgb8()).unwrap();
    let a = decode_rgb(&upright);
    assert_eq!(a.dimensions(), (8, 4));
    // Rotated clockwise, the black left half becomes the top half.
    let b = decode_rgb(&rotated);
    assert_eq!(b.dimensions(), (4, 8));
    let luma = |img: &image::RgbImage, x: u32, y: u32| img.get_pixel(x, y).0[0];
    assert!(luma(&b, 2, 1) < 64 && luma(&b, 2, 6) > 192, "{b:?}");
    assert!(luma(&a, 1, 2) < 64 && luma(&a, 6, 2) > 192);
}
