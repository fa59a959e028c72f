//! Image decoding and resizing shared by the image towers.

use image::imageops::FilterType;
use image::{DynamicImage, RgbImage};
use serde::{Deserialize, Serialize};

/// How a pretrained image tower expects its input: geometry and per-channel
/// normalisation. Shared by every pretrained tower so that a feature cache
/// can be keyed on [`ImagePreprocess::cache_tag`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ImagePreprocess {
    /// Output side length in pixels (the result is `size × size`).
    pub size: u32,
    /// How the decoded image is brought to `size × size`.
    pub resize: ResizeMode,
    /// Per-channel (R, G, B) mean subtracted after scaling to [0, 1].
    pub mean: [f32; 3],
    /// Per-channel (R, G, B) standard deviation divided by after the mean.
    pub std: [f32; 3],
}

/// Geometry step of [`ImagePreprocess`].
///
/// Resampling always uses the triangle (bilinear) filter, which in the image
/// crate widens its support when shrinking, like torchvision's antialiased
/// bilinear `Resize`. CLIP's reference pipeline resamples bicubically, so
/// CLIP towers see slightly softer edges than in the original; keeping one
/// filter keeps the struct to the fields that vary between towers. Images
/// already at the target size are not resampled at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResizeMode {
    /// Resize so the shorter side is `size` (keeping the aspect ratio), then
    /// crop the central `size × size` square.
    ShorterSideCentreCrop,
    /// Resize both sides to `size`, distorting the aspect ratio.
    Stretch,
}

impl ResizeMode {
    /// The snake_case name used in serialised configs and cache tags.
    pub fn name(self) -> &'static str {
        match self {
            ResizeMode::ShorterSideCentreCrop => "shorter_side_centre_crop",
            ResizeMode::Stretch => "stretch",
        }
    }
}

/// The one resampling filter; see [`ResizeMode`].
const FILTER: FilterType = FilterType::Triangle;

impl ImagePreprocess {
    /// torchvision's ImageNet evaluation preprocessing at 224 pixels.
    pub fn imagenet() -> Self {
        ImagePreprocess {
            size: 224,
            resize: ResizeMode::ShorterSideCentreCrop,
            mean: [0.485, 0.456, 0.406],
            std: [0.229, 0.224, 0.225],
        }
    }

    /// OpenAI CLIP's preprocessing at 224 pixels (its own mean and std).
    // The constants are written as OpenAI publishes them, so they can be
    // searched for; f32 rounds away the last digit of some.
    #[allow(clippy::excessive_precision)]
    pub fn clip() -> Self {
        ImagePreprocess {
            size: 224,
            resize: ResizeMode::ShorterSideCentreCrop,
            mean: [0.481_454_66, 0.457_827_5, 0.408_210_73],
            std: [0.268_629_54, 0.261_302_58, 0.275_777_11],
        }
    }

    /// Decode any common format, convert to RGB, resize/crop, scale to
    /// [0, 1] and normalise. Returns channel-major `3 × size × size` values;
    /// the error says what could not be decoded.
    ///
    /// This decodes with the image crate's default limits only: bytes from
    /// untrusted data should be decoded under a pixel budget first and then
    /// handed to [`ImagePreprocess::apply_image`].
    pub fn apply(&self, bytes: &[u8]) -> Result<Vec<f32>, String> {
        let img =
            image::load_from_memory(bytes).map_err(|e| format!("cannot decode image: {e}"))?;
        Ok(self.apply_image(&img))
    }

    /// [`ImagePreprocess::apply`] for an already decoded image.
    pub fn apply_image(&self, img: &DynamicImage) -> Vec<f32> {
        let rgb = self.geometry(img.to_rgb8());
        let plane = (self.size * self.size) as usize;
        let mut out = vec![0f32; 3 * plane];
        // Divide rather than multiply by a reciprocal so the values match
        // torchvision's `(x / 255 - mean) / std` to the last bit where possible.
        for (i, px) in rgb.pixels().enumerate() {
            for ch in 0..3 {
                let v = f32::from(px[ch]) / 255.0;
                out[ch * plane + i] = (v - self.mean[ch]) / self.std[ch];
            }
        }
        out
    }

    /// An upper bound on the bytes [`ImagePreprocess::apply_image`]
    /// allocates for a decoded `w × h` image, besides the image itself: its
    /// RGB copy, the resampling buffers (the image crate resizes through a
    /// `w × new height` RGBA f32 intermediate) and the output. An absurd
    /// aspect ratio (a 50,000,000 × 1 image) gives a huge number (at most
    /// `u64::MAX`) rather than an overflow, so callers can refuse it before
    /// decoding.
    pub fn working_bytes(&self, w: u32, h: u32) -> u64 {
        // u128: no product of u32 sides and small factors can overflow it.
        let (w, h, size) = (u128::from(w), u128::from(h), u128::from(self.size));
        let (nw, nh) = match self.resize {
            ResizeMode::Stretch => (size, size),
            ResizeMode::ShorterSideCentreCrop => {
                let scaled = |long: u128, short: u128| size * long / short.max(1);
                let (nw, nh) = if w <= h {
                    (size, scaled(h, w))
                } else {
                    (scaled(w, h), size)
                };
                (nw.max(size), nh.max(size))
            }
        };
        let plane = size * size;
        clamp(3 * w * h + resize_bytes(w, nw, nh) + 3 * plane + 3 * plane * 4)
    }

    /// A stable string naming this preprocessing, for feature-cache keys.
    /// Floats are printed with Rust's shortest round-trip formatting, so two
    /// configurations share a tag exactly when they are equal.
    pub fn cache_tag(&self) -> String {
        let join = |v: &[f32; 3]| format!("{},{},{}", v[0], v[1], v[2]);
        format!(
            "{}-{}-mean{}-std{}",
            self.size,
            self.resize.name(),
            join(&self.mean),
            join(&self.std)
        )
    }

    /// Bring `rgb` to `size × size`. Images already at the target geometry
    /// are passed through untouched: resampling is not the identity even at
    /// scale 1 in every library, and reference outputs assume no resize.
    fn geometry(&self, rgb: RgbImage) -> RgbImage {
        let size = self.size;
        let (w, h) = rgb.dimensions();
        match self.resize {
            ResizeMode::Stretch => {
                if (w, h) == (size, size) {
                    rgb
                } else {
                    image::imageops::resize(&rgb, size, size, FILTER)
                }
            }
            ResizeMode::ShorterSideCentreCrop => {
                // Truncating the longer side matches torchvision's
                // `int(size * long / short)`.
                let scaled = |long: u32, short: u32| {
                    (u64::from(size) * u64::from(long) / u64::from(short.max(1))) as u32
                };
                let (nw, nh) = if w <= h {
                    (size, scaled(h, w))
                } else {
                    (scaled(w, h), size)
                };
                let (nw, nh) = (nw.max(size), nh.max(size));
                let resized = if (nw, nh) == (w, h) {
                    rgb
                } else {
                    image::imageops::resize(&rgb, nw, nh, FILTER)
                };
                if (nw, nh) == (size, size) {
                    return resized;
                }
                // Odd margins put the extra pixel after the crop (torchvision
                // rounds half to even, so it can differ by one pixel).
                let (x0, y0) = ((nw - size) / 2, (nh - size) / 2);
                image::imageops::crop_imm(&resized, x0, y0, size, size).to_image()
            }
        }
    }
}

/// Bytes of `image::imageops::resize` from width `w` to `nw × nh`: the
/// vertical pass writes a `w × nh` RGBA f32 image, the horizontal pass the
/// `nw × nh` RGB8 result.
fn resize_bytes(w: u128, nw: u128, nh: u128) -> u128 {
    16 * w * nh + 3 * nw * nh
}

/// A byte count that does not fit u64 is as good as infinite.
fn clamp(bytes: u128) -> u64 {
    u64::try_from(bytes).unwrap_or(u64::MAX)
}

/// Decode any common image format and resize it (stretching, like the
/// from-scratch demo CNN expects) to `size × size` RGB, channel-major
/// (`3 × size × size` bytes). The error says what could not be decoded.
///
/// Like [`ImagePreprocess::apply`], this uses the image crate's default
/// limits only; untrusted bytes should be decoded under a budget and passed
/// to [`rgb_square`].
pub fn decode_rgb_square(bytes: &[u8], size: u32) -> Result<Vec<u8>, String> {
    let img = image::load_from_memory(bytes).map_err(|e| format!("cannot decode image: {e}"))?;
    Ok(rgb_square(img, size))
}

/// An upper bound on the bytes [`rgb_square`] allocates for a decoded
/// `w × h` image besides the image itself (see
/// [`ImagePreprocess::working_bytes`]).
pub fn rgb_square_working_bytes(w: u32, h: u32, size: u32) -> u64 {
    let (w, h, size) = (u128::from(w), u128::from(h), u128::from(size));
    clamp(3 * w * h + resize_bytes(w, size, size) + 3 * size * size)
}

/// [`decode_rgb_square`] for an already decoded image.
pub fn rgb_square(img: DynamicImage, size: u32) -> Vec<u8> {
    // An RGB8 image is moved, not copied.
    let rgb = img.into_rgb8();
    let rgb = if rgb.width() == size && rgb.height() == size {
        rgb
    } else {
        image::imageops::resize(&rgb, size, size, FilterType::Triangle)
    };
    let plane = (size * size) as usize;
    let mut out = vec![0u8; 3 * plane];
    for (i, px) in rgb.pixels().enumerate() {
        out[i] = px[0];
        out[plane + i] = px[1];
        out[2 * plane + i] = px[2];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    fn png_bytes(img: RgbImage) -> Vec<u8> {
        let mut buf = Vec::new();
        DynamicImage::ImageRgb8(img)
            .write_to(&mut Cursor::new(&mut buf), image::ImageFormat::Png)
            .unwrap();
        buf
    }

    #[test]
    fn normalises_a_2x2_image_by_hand() {
        let mut img = RgbImage::new(2, 2);
        img.put_pixel(0, 0, image::Rgb([0, 0, 0]));
        img.put_pixel(1, 0, image::Rgb([255, 255, 255]));
        img.put_pixel(0, 1, image::Rgb([51, 102, 153]));
        img.put_pixel(1, 1, image::Rgb([255, 0, 102]));
        let p = ImagePreprocess {
            size: 2,
            resize: ResizeMode::ShorterSideCentreCrop,
            mean: [0.5, 0.25, 0.0],
            std: [0.5, 0.25, 2.0],
        };
        let out = p.apply(&png_bytes(img)).unwrap();
        // Pixel order within a plane is row-major: (0,0), (1,0), (0,1), (1,1).
        #[rustfmt::skip]
        let want = [
            // R: (v/255 - 0.5) / 0.5
            -1.0, 1.0, -0.6, 1.0,
            // G: (v/255 - 0.25) / 0.25
            -1.0, 3.0, 0.6, -1.0,
            // B: (v/255 - 0) / 2
            0.0, 0.5, 0.3, 0.2,
        ];
        assert_eq!(out.len(), want.len());
        for (i, (a, b)) in out.iter().zip(want).enumerate() {
            assert!((a - b).abs() < 1e-6, "value {i}: {a} vs {b}");
        }
    }

    /// A `w × h` image that is red inside the central `inner × inner`
    /// square and blue elsewhere.
    fn red_centre(w: u32, h: u32, inner: u32) -> RgbImage {
        RgbImage::from_fn(w, h, |x, y| {
            let (x0, y0) = ((w - inner) / 2, (h - inner) / 2);
            if (x0..x0 + inner).contains(&x) && (y0..y0 + inner).contains(&y) {
                image::Rgb([255, 0, 0])
            } else {
                image::Rgb([0, 0, 255])
            }
        })
    }

    #[test]
    fn shorter_side_resize_then_centre_crop_keeps_the_centre() {
        // Landscape 200×100, red centre 50×50, blue border. At size 20 the
        // shorter side scales by 0.2 → 40×20 with red at x 15..25, y 5..15;
        // the crop keeps x 10..30, so red lands at 5..15 on both axes.
        let p = ImagePreprocess {
            size: 20,
            resize: ResizeMode::ShorterSideCentreCrop,
            mean: [0.0; 3],
            std: [1.0; 3],
        };
        let out = p.apply_image(&DynamicImage::ImageRgb8(red_centre(200, 100, 50)));
        assert_eq!(out.len(), 3 * 20 * 20);
        let at = |ch: usize, x: usize, y: usize| out[ch * 400 + y * 20 + x];
        // Centre is red, the crop's left/right edges and corners are blue.
        assert!(at(0, 10, 10) > 0.95 && at(2, 10, 10) < 0.05);
        for (x, y) in [
            (0, 0),
            (19, 0),
            (0, 19),
            (19, 19),
            (0, 10),
            (19, 10),
            (10, 0),
        ] {
            assert!(at(2, x, y) > 0.95 && at(0, x, y) < 0.05, "({x},{y})");
        }
        // Portrait works the same way and the crop is square.
        let out = p.apply_image(&DynamicImage::ImageRgb8(red_centre(100, 300, 50)));
        assert_eq!(out.len(), 3 * 20 * 20);
        assert!(out[10 * 20 + 10] > 0.95);

        let stretch = ImagePreprocess {
            resize: ResizeMode::Stretch,
            ..p
        };
        assert_eq!(
            stretch
                .apply_image(&DynamicImage::ImageRgb8(red_centre(200, 100, 50)))
                .len(),
            3 * 20 * 20
        );
    }

    #[test]
    fn no_resampling_when_already_at_size() {
        // A checkerboard is changed by any real resampling.
        let img = RgbImage::from_fn(8, 8, |x, y| {
            let v = if (x + y) % 2 == 0 { 255 } else { 0 };
            image::Rgb([v, 255 - v, (x * 30) as u8])
        });
        for resize in [ResizeMode::ShorterSideCentreCrop, ResizeMode::Stretch] {
            let p = ImagePreprocess {
                size: 8,
                resize,
                mean: [0.0; 3],
                std: [1.0; 3],
            };
            let out = p.apply_image(&DynamicImage::ImageRgb8(img.clone()));
            for (i, px) in img.pixels().enumerate() {
                for ch in 0..3 {
                    assert_eq!(out[ch * 64 + i], f32::from(px[ch]) / 255.0);
                }
            }
        }
        // A non-square image whose shorter side already matches is only cropped.
        let wide = RgbImage::from_fn(12, 8, |x, y| {
            image::Rgb([(x * 20) as u8, (y * 30) as u8, 7])
        });
        let p = ImagePreprocess {
            size: 8,
            resize: ResizeMode::ShorterSideCentreCrop,
            mean: [0.0; 3],
            std: [1.0; 3],
        };
        let out = p.apply_image(&DynamicImage::ImageRgb8(wide.clone()));
        assert_eq!(out[0], f32::from(wide.get_pixel(2, 0)[0]) / 255.0);
        assert_eq!(out[63], f32::from(wide.get_pixel(9, 7)[0]) / 255.0);
    }

    #[test]
    fn garbage_is_an_error_and_tags_are_stable() {
        let err = ImagePreprocess::imagenet()
            .apply(b"definitely not a jpeg")
            .unwrap_err();
        assert!(err.contains("cannot decode image"), "{err}");
        assert_eq!(
            ImagePreprocess::imagenet().cache_tag(),
            "224-shorter_side_centre_crop-mean0.485,0.456,0.406-std0.229,0.224,0.225"
        );
        assert_ne!(
            ImagePreprocess::imagenet().cache_tag(),
            ImagePreprocess::clip().cache_tag()
        );
        let json = serde_json::to_string(&ImagePreprocess::clip()).unwrap();
        assert!(json.contains("\"shorter_side_centre_crop\""), "{json}");
        let back: ImagePreprocess = serde_json::from_str(&json).unwrap();
        assert_eq!(back, ImagePreprocess::clip());
    }

    #[test]
    fn working_bytes_cover_the_rgb_copy_and_the_resize() {
        let p = ImagePreprocess::imagenet();
        // A 500 × 375 photo: RGB copy, a 500 × 224 f32 RGBA intermediate,
        // the 298 × 224 resized image, the crop and the f32 output.
        let want = 3 * 500 * 375 + 16 * 500 * 224 + 3 * 298 * 224 + 3 * 224 * 224 + 12 * 224 * 224;
        assert_eq!(p.working_bytes(500, 375), want);
        // An absurd aspect ratio needs gigabytes to resize, and says so
        // rather than overflowing.
        assert!(p.working_bytes(40_000, 1) > 6_000_000_000);
        assert!(p.working_bytes(u32::MAX, 1) > 1 << 40);
        assert_eq!(p.working_bytes(u32::MAX, u32::MAX), u64::MAX);
        assert_eq!(
            rgb_square_working_bytes(64, 32, 8),
            3 * 64 * 32 + 16 * 64 * 8 + 3 * 8 * 8 + 3 * 8 * 8
        );
    }

    #[test]
    fn decodes_png_to_channel_major_and_rejects_garbage() {
        let mut img = image::RgbImage::new(4, 4);
        for p in img.pixels_mut() {
            *p = image::Rgb([200, 10, 30]);
        }
        let mut buf = Vec::new();
        image::DynamicImage::ImageRgb8(img)
            .write_to(&mut Cursor::new(&mut buf), image::ImageFormat::Png)
            .unwrap();
        let out = decode_rgb_square(&buf, 2).unwrap();
        assert_eq!(
            out,
            vec![200, 200, 200, 200, 10, 10, 10, 10, 30, 30, 30, 30]
        );
        let err = decode_rgb_square(b"not an image", 2).unwrap_err();
        assert!(err.contains("cannot decode image"), "{err}");
    }
}
