//! The pictures and captions of the pairs the report shows, read back from
//! the run's inputs through the same readers `fit` used, within the run's
//! image limits, and embedded as small JPEG data URIs.
//!
//! Anything that cannot be read (an input moved away, a row that was
//! skipped, an embedding column) becomes a reason shown in place of the
//! picture: the report always renders.

use std::collections::BTreeMap;
use std::io::Cursor;
use std::path::PathBuf;

use base64::Engine as _;

use crate::data::images::{self, ImageLimits};
use crate::data::{ColumnMap, ColumnOptions, ImageValue, InputSet};

/// Longest side of a thumbnail, in pixels.
pub const THUMB_PX: u32 = 128;
/// JPEG quality of the thumbnails: small files, no visible blocks at 128 px.
const JPEG_QUALITY: u8 = 85;
/// Rows read at a time while looking for the wanted ones.
const BATCH_ROWS: usize = 64;

/// Where the run's pairs came from, as `run.json` records it.
#[derive(Debug, Clone)]
pub struct Source {
    /// The input files, as `fit` was given them (the labels' `source_file`).
    pub inputs: Vec<String>,
    /// The columns `fit` resolved (parquet inputs).
    pub columns: Option<ColumnMap>,
    /// `--image-root` of the fit.
    pub image_root: Option<PathBuf>,
    /// The fit's image limits, which the thumbnails are read within too.
    pub image_limits: ImageLimits,
    /// run.json's `input_files` (absolute paths, tar sources), when the
    /// run records them: the inputs are then found from any directory.
    pub recorded: Option<crate::run::inputs::RunInputs>,
}

/// A pair as read back for the report.
#[derive(Debug, Clone, PartialEq)]
pub struct Shown {
    /// The caption as stored, or why it could not be read.
    pub caption: Result<String, String>,
    /// A `data:image/jpeg;base64,…` URI of the thumbnail, or why there is
    /// none.
    pub image: Result<String, String>,
}

/// Read the pairs at `(source_file, source_row)` of `wanted`; the answer
/// has one entry per wanted pair, in order. Only the files that hold a
/// wanted row are opened, each read up to its last wanted row, one batch of
/// rows at a time.
pub fn read(source: &Source, wanted: &[(String, u64)]) -> Vec<Shown> {
    let mut by_file: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for (file, row) in wanted {
        by_file.entry(file.as_str()).or_default().push(*row);
    }
    let mut found: BTreeMap<(String, u64), Shown> = BTreeMap::new();
    for (file, rows) in by_file {
        match read_file_rows(source, file, &rows) {
            Ok(shown) => {
                for (row, s) in shown {
                    found.insert((file.to_string(), row), s);
                }
            }
            Err(why) => {
                for &row in &rows {
                    let s = Shown {
                        caption: Err(why.clone()),
                        image: Err(why.clone()),
                    };
                    found.insert((file.to_string(), row), s);
                }
            }
        }
    }
    wanted
        .iter()
        .map(|w| {
            found.remove(w).unwrap_or_else(|| Shown {
                caption: Err("row not found in its input".into()),
                image: Err("row not found in its input".into()),
            })
        })
        .collect()
}

/// The wanted rows of one input file, or why the file cannot be read.
fn read_file_rows(
    source: &Source,
    file: &str,
    rows: &[u64],
) -> Result<BTreeMap<u64, Shown>, String> {
    let Some(index) = source.inputs.iter().position(|i| i == file) else {
        return Err(format!("{file} is not among the run's inputs (run.json)"));
    };
    let recorded = source.recorded.as_ref();
    let path = match recorded.and_then(|r| r.files.get(index)) {
        Some(absolute) => absolute.clone(),
        None => PathBuf::from(file),
    };
    if !path.is_file() {
        return Err(format!(
            "input {} is no longer readable here{}",
            path.display(),
            if recorded.is_some() {
                ""
            } else {
                " (relative paths are relative to where `fit` ran)"
            }
        ));
    }
    let limits = source.image_limits;
    let image_root = match recorded {
        Some(r) => r.image_root.clone(),
        None => source.image_root.clone(),
    };
    let opts = match (&source.columns, crate::data::is_tar(&path)) {
        // Parquet: the very columns fit used.
        (Some(c), false) => ColumnOptions {
            image_col: Some(c.image.clone()),
            caption_col: Some(c.caption.clone()),
            key_col: c.key.clone(),
            image_root,
            image_limits: limits,
            ..ColumnOptions::default()
        },
        _ => ColumnOptions {
            image_root,
            image_limits: limits,
            caption_from: recorded.and_then(|r| r.caption_from.clone()),
            key_from: recorded.and_then(|r| r.key_from.clone()),
            ..ColumnOptions::default()
        },
    };
    let set = InputSet::open(&[path], &opts).map_err(|e| format!("cannot open {file}: {e}"))?;
    let last = rows.iter().copied().max().unwrap_or(0);
    let mut out = BTreeMap::new();
    for batch in set.pairs(BATCH_ROWS) {
        let batch = batch.map_err(|e| format!("cannot read {file}: {e}"))?;
        let mut past_last = false;
        for pair in batch {
            let row = pair.source_row as u64;
            past_last |= row >= last;
            if !rows.contains(&row) {
                continue;
            }
            let image = match (&pair.image, &pair.problem) {
                (Some(ImageValue::Bytes(b)), _) => thumbnail(b, &limits),
                (Some(ImageValue::Path(p)), _) => {
                    images::read_file(p, limits.max_bytes).and_then(|b| thumbnail(&b, &limits))
                }
                (Some(ImageValue::Embedding(_)), _) => {
                    Err("a precomputed embedding: no picture to show".into())
                }
                (None, Some(problem)) => Err(problem.clone()),
                (None, None) => Err("no image".into()),
            };
            out.insert(
                row,
                Shown {
                    caption: Ok(pair.caption),
                    image,
                },
            );
        }
        if past_last {
            break;
        }
    }
    Ok(out)
}

/// Decode `bytes` within `limits`, shrink to at most [`THUMB_PX`] a side
/// and return it as a JPEG data URI.
pub fn thumbnail(bytes: &[u8], limits: &ImageLimits) -> Result<String, String> {
    let small = images::decode(
        bytes,
        limits,
        // The thumbnail itself, in RGBA at most.
        |_, _| u64::from(THUMB_PX * THUMB_PX * 4),
        |img| {
            // `thumbnail` also enlarges; a small picture is shown as it is.
            if img.width() <= THUMB_PX && img.height() <= THUMB_PX {
                img.to_rgb8()
            } else {
                img.thumbnail(THUMB_PX, THUMB_PX).to_rgb8()
            }
        },
    )?;
    let mut jpeg = Vec::new();
    let encoder =
        image::codecs::jpeg::JpegEncoder::new_with_quality(Cursor::new(&mut jpeg), JPEG_QUALITY);
    small
        .write_with_encoder(encoder)
        .map_err(|e| format!("cannot encode the thumbnail: {e}"))?;
    Ok(data_uri("image/jpeg", &jpeg))
}

/// `bytes` as a base64 data URI of type `mime`.
pub fn data_uri(mime: &str, bytes: &[u8]) -> String {
    format!(
        "data:{mime};base64,{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn png(w: u32, h: u32) -> Vec<u8> {
        let img = image::RgbImage::from_fn(w, h, |x, _| image::Rgb([(x % 256) as u8, 10, 200]));
        let mut out = Vec::new();
        image::DynamicImage::ImageRgb8(img)
            .write_to(&mut Cursor::new(&mut out), image::ImageFormat::Png)
            .unwrap();
        out
    }

    fn decode_uri(uri: &str) -> image::DynamicImage {
        let b64 = uri.strip_prefix("data:image/jpeg;base64,").unwrap();
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap();
        image::load_from_memory(&bytes).unwrap()
    }

    #[test]
    fn data_uris_are_standard_base64() {
        // "Man" -> TWFu; "Ma" -> TWE= (RFC 4648 examples).
        assert_eq!(
            data_uri("text/plain", b"Man"),
            "data:text/plain;base64,TWFu"
        );
        assert_eq!(data_uri("a/b", b"Ma"), "data:a/b;base64,TWE=");
    }

    #[test]
    fn thumbnails_keep_the_aspect_within_128_pixels() {
        let img = decode_uri(&thumbnail(&png(512, 256), &ImageLimits::default()).unwrap());
        assert_eq!((img.width(), img.height()), (128, 64));
        // Small images are not enlarged.
        let img = decode_uri(&thumbnail(&png(40, 30), &ImageLimits::default()).unwrap());
        assert_eq!((img.width(), img.height()), (40, 30));
    }

    #[test]
    fn oversized_or_broken_images_give_a_reason() {
        let limits = ImageLimits {
            max_pixels: 1000,
            ..ImageLimits::default()
        };
        let e = thumbnail(&png(100, 100), &limits).unwrap_err();
        assert!(e.contains("--max-image-pixels"), "{e}");
        assert!(thumbnail(b"not an image", &ImageLimits::default())
            .unwrap_err()
            .starts_with("cannot decode image"));
    }

    #[test]
    fn a_missing_input_is_a_reason_for_each_of_its_rows() {
        let source = Source {
            inputs: vec!["/nonexistent/x.parquet".into()],
            columns: None,
            image_root: None,
            image_limits: ImageLimits::default(),
            recorded: None,
        };
        let shown = read(
            &source,
            &[
                ("/nonexistent/x.parquet".into(), 3),
                ("other.parquet".into(), 0),
            ],
        );
        assert_eq!(shown.len(), 2);
        assert!(shown[0]
            .image
            .as_ref()
            .unwrap_err()
            .contains("no longer readable"));
        assert!(shown[1]
            .caption
            .as_ref()
            .unwrap_err()
            .contains("not among the run's inputs"));
    }
}
