//! Image decoding and resizing shared by the image towers.

use image::imageops::FilterType;

/// Decode any common image format and resize it (stretching, like the
/// from-scratch demo CNN expects) to `size × size` RGB, channel-major
/// (`3 × size × size` bytes). The error says what could not be decoded.
pub fn decode_rgb_square(bytes: &[u8], size: u32) -> Result<Vec<u8>, String> {
    let img = image::load_from_memory(bytes).map_err(|e| format!("cannot decode image: {e}"))?;
    let rgb = img.to_rgb8();
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
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

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
        assert_eq!(out, vec![200, 200, 200, 200, 10, 10, 10, 10, 30, 30, 30, 30]);
        let err = decode_rgb_square(b"not an image", 2).unwrap_err();
        assert!(err.contains("cannot decode image"), "{err}");
    }
}
