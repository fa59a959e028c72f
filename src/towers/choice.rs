//! Which towers a fit uses: the ones the flags name, or, when none is
//! named and the data holds photos, the pretrained towers installed here
//! (the toy towers would learn little from photos; the run says so).

use crate::data::{ColumnOptions, ImageKind, ImageValue, InputSet, TextEmbeddings};
use crate::error::Result;
use crate::runtime::progress::Reporter;
use crate::towers::encoders::{EncoderSpec, ImageEncoder, TextEncoder, TowerDtype};
use crate::towers::installed;

/// The towers as the flags name them (each `None` when not given).
#[derive(Debug, Clone)]
pub struct TowerFlags {
    /// `--image-encoder`.
    pub image_encoder: Option<ImageEncoder>,
    /// `--text-encoder`.
    pub text_encoder: Option<TextEncoder>,
    /// `--image-model`.
    pub image_model: Option<String>,
    /// `--text-model`.
    pub text_model: Option<String>,
    /// `--tower-dtype`.
    pub tower_dtype: TowerDtype,
}

/// The towers of a fit on `input`: the flags' choice, resolved against the
/// data; with no tower named and a photo first, the installed pretrained
/// towers (said on `rep`); the toy-tower warning when photos go to the
/// demo CNN anyway.
pub fn choose(input: &InputSet, flags: &TowerFlags, rep: &Reporter) -> Result<EncoderSpec> {
    let mut chosen = (
        flags.image_encoder,
        flags.text_encoder,
        flags.image_model.clone(),
        flags.text_model.clone(),
    );
    // Photos and no tower named: the toy towers would learn little from
    // them, so installed pretrained towers are taken, and the run says so.
    let unnamed = flags.image_encoder.is_none()
        && flags.text_encoder.is_none()
        && flags.image_model.is_none()
        && flags.text_model.is_none();
    let photo = if unnamed && input.columns.image_kind != ImageKind::Embedding {
        first_photo(input)
    } else {
        None
    };
    let auto = photo.and_then(|_| installed::auto_towers(&installed::discover().found));
    if let (Some((w, h)), Some(t)) = (photo, &auto) {
        rep.info(&format!(
            "towers: the first image is a {w}×{h} photo, so fit uses the pretrained towers \
             installed here: {} (--image-encoder demo-cnn keeps the toy towers)",
            t.flags
        ));
        chosen = (
            Some(t.image),
            Some(t.text),
            Some(t.image_model.clone()),
            t.text_model.clone(),
        );
    }
    let (image_encoder, text_encoder, image_model, text_model) = chosen;
    let mut encoders =
        EncoderSpec::resolve(input, image_encoder, text_encoder, image_model, text_model)?;
    encoders.tower_dtype = flags.tower_dtype;
    if image_encoder.is_none() && encoders.image == ImageEncoder::DemoCnn {
        if let Some((w, h)) = photo.or_else(|| first_photo(input)) {
            crate::runtime::progress::warn_once(&installed::toy_tower_warning(w, h));
        }
    }
    Ok(encoders)
}

/// The column options that also look for a text-embedding column, when
/// `input` (opened with `opts`) holds image embeddings and no tower is
/// named: LAION- and DataComp-style files carry the caption's embedding from
/// the same model beside the image's (`text_emb`, `l14_txt`), and encoding
/// the captions with the toy bag-of-words tower instead would throw away
/// the half of the pair that is already in the images' space. `None` when
/// the text side is already decided (a tower or `--text-emb-col` named,
/// images that are not embeddings); the caller opens the input again with
/// the options and keeps it when a column was found.
pub fn text_embedding_lookup(
    input: &InputSet,
    opts: &ColumnOptions,
    flags: &TowerFlags,
) -> Option<ColumnOptions> {
    let undecided = flags.text_encoder.is_none()
        && flags.text_model.is_none()
        && matches!(flags.image_encoder, None | Some(ImageEncoder::Precomputed))
        && opts.text_emb_col.is_none()
        && opts.text_embeddings == TextEmbeddings::Ignore;
    (undecided && input.columns.image_kind == ImageKind::Embedding).then(|| ColumnOptions {
        text_embeddings: TextEmbeddings::IfPresent,
        ..opts.clone()
    })
}

/// What the run says when [`text_embedding_lookup`] found `column`.
pub fn text_embedding_line(column: &str) -> String {
    format!(
        "towers: the images are embeddings and column \"{column}\" holds text embeddings, so both \
         are used as given (--text-encoder demo-bow or minilm encodes the captions instead)"
    )
}

/// The size of the first image when it looks like a photo (JPEG or WebP,
/// at least 100 pixels on its short side): the toy towers' default is for
/// the synthetic demo's small PNGs.
fn first_photo(input: &InputSet) -> Option<(u32, u32)> {
    let rows = input.pairs(1).next()?.ok()?;
    let bytes = match rows.first()?.image.as_ref()? {
        ImageValue::Bytes(b) => b.clone(),
        ImageValue::Path(p) => {
            crate::data::images::read_file(p, input.image_limits.max_bytes).ok()?
        }
        ImageValue::Embedding(_) => return None,
    };
    let (format, w, h) = crate::data::images::header(&bytes)?;
    let photo = matches!(format, image::ImageFormat::Jpeg | image::ImageFormat::WebP);
    (photo && w.min(h) >= 100).then_some((w, h))
}
