//! A synthetic image–caption dataset whose captions really describe the
//! pictures.
//!
//! `ncclean demo`, the end-to-end tests and the README quick start need data
//! that needs no download, yet on which matching is genuinely learnable: a
//! model must be able to tell from the pixels and the words whether a pair
//! belongs together, otherwise injected noise could not be detected. Each
//! image therefore holds one filled shape whose colour, shape, quadrant and
//! size are all visible, and each caption names all four attributes with the
//! same spelling every time, so that even a bag of words can match them.

use std::io::Cursor;

use image::codecs::png::{CompressionType, FilterType, PngEncoder};
use image::{ImageEncoder, Rgb, RgbImage};
use ncclean_models::rng::Rng;

/// Colour names with the RGB value each is drawn in.
///
/// Every colour has at least one channel at or below 60 while backgrounds
/// never drop below 180, so a shape always stands out from its background;
/// the colours also differ from one another by at least 75 in some channel,
/// which keeps them apart after jitter and noise.
const PALETTE: [(&str, [u8; 3]); 6] = [
    ("red", [215, 35, 35]),
    ("green", [40, 160, 60]),
    ("blue", [40, 80, 215]),
    ("yellow", [235, 205, 30]),
    ("purple", [135, 55, 175]),
    ("orange", [240, 130, 25]),
];

/// The colour words a demo caption can use.
pub const COLOURS: [&str; 6] = ["red", "green", "blue", "yellow", "purple", "orange"];

/// The shape words a demo caption can use.
pub const SHAPES: [&str; 4] = ["circle", "square", "triangle", "cross"];

/// The position phrases a demo caption can use, one per quadrant.
pub const POSITIONS: [&str; 4] = ["top left", "top right", "bottom left", "bottom right"];

/// The size words a demo caption can use.
pub const SIZES: [&str; 2] = ["small", "large"];

/// The smallest image side `draw` and `generate` accept; below it the shapes
/// degenerate into a few pixels that no longer show their attributes.
pub const MIN_IMAGE_SIZE: u32 = 8;
/// Largest demo image side: a bound on the memory one image takes
/// (1024² RGB = 3 MiB), far above what the demo towers use.
pub const MAX_IMAGE_SIZE: u32 = 1024;

/// Shape "radius" (half its extent) as a fraction of the image side. With the
/// quadrant centre at 0.25 and jitter of at most 0.06, a large shape reaches
/// at most 0.49 of the side, so it never crosses into a neighbouring quadrant
/// and never leaves the image.
const SMALL_RADIUS: f32 = 0.11;
const LARGE_RADIUS: f32 = 0.18;

/// Largest offset of the shape centre from the quadrant centre, as a fraction
/// of the image side; enough that the position is not a fixed pixel pattern.
const JITTER: f32 = 0.06;

/// Per-pixel noise lies in `-NOISE..=NOISE` for every channel.
const NOISE: i32 = 8;

/// Per-image shift of the shape colour lies in `-SHADE..=SHADE` per channel,
/// so two red shapes are not byte-identical either.
const SHADE: i32 = 12;

/// How many caption templates `caption` knows.
const TEMPLATES: usize = 9;

/// One generated pair and the attributes it was drawn from; the image is
/// PNG bytes ([`DemoPair`]) or an embedding ([`EmbeddingPair`]).
#[derive(Debug, Clone)]
pub struct Pair<I> {
    /// Stable identifier, `demo-000000` upwards, so keys sort in generation order.
    pub key: String,
    /// The picture: PNG bytes, or an embedding (the sum of its attributes'
    /// prototype vectors plus Gaussian noise).
    pub image: I,
    /// A lower-case sentence naming all four attributes.
    pub caption: String,
    /// Colour of the shape; one of [`COLOURS`].
    pub colour: &'static str,
    /// Kind of shape; one of [`SHAPES`].
    pub shape: &'static str,
    /// Quadrant the shape sits in; one of [`POSITIONS`].
    pub position: &'static str,
    /// Size of the shape; one of [`SIZES`].
    pub size: &'static str,
}

/// A pair of the image demo: the picture encoded as PNG.
pub type DemoPair = Pair<Vec<u8>>;

/// A pair of the embedding demo: the image given as an embedding instead
/// of pixels.
pub type EmbeddingPair = Pair<Vec<f32>>;

/// Options for the generator.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// How many pairs to generate.
    pub pairs: usize,
    /// Seed fixing every random choice, so a run can be reproduced exactly.
    pub seed: u64,
    /// Side of the square images in pixels; at least [`MIN_IMAGE_SIZE`].
    pub image_size: u32,
}

impl Default for DemoOptions {
    /// 2000 pairs of 64×64 images: enough for a model to learn the matching
    /// in a quick start, small enough to generate in well under a second.
    fn default() -> Self {
        DemoOptions {
            pairs: 2000,
            seed: 0,
            image_size: 64,
        }
    }
}

/// Generate `opts.pairs` pairs deterministically from `opts.seed`.
///
/// The same options always give byte-identical pairs, and a shorter run is a
/// prefix of a longer one with the same seed and image size.
///
/// # Panics
///
/// If `opts.image_size` is below [`MIN_IMAGE_SIZE`].
pub fn generate(opts: &DemoOptions) -> Vec<DemoPair> {
    pairs(opts).collect()
}

/// The pairs of [`generate`] one at a time, so that a large demo is written
/// without holding it.
///
/// # Panics
///
/// If `opts.image_size` is below [`MIN_IMAGE_SIZE`].
pub fn pairs(opts: &DemoOptions) -> impl Iterator<Item = DemoPair> {
    check_size(opts.image_size);
    // A labelled stream, so other consumers of the same seed stay independent.
    let mut rng = Rng::derive(opts.seed, "demo");
    let image_size = opts.image_size;
    (0..opts.pairs).map(move |i| {
        let colour = COLOURS[rng.below(COLOURS.len())];
        let shape = SHAPES[rng.below(SHAPES.len())];
        let position = POSITIONS[rng.below(POSITIONS.len())];
        let size = SIZES[rng.below(SIZES.len())];
        let template = rng.below(TEMPLATES);
        let picture = draw(colour, shape, position, size, image_size, &mut rng);
        DemoPair {
            key: format!("demo-{i:06}"),
            image: encode_png(&picture),
            caption: caption(template, colour, shape, position, size),
            colour,
            shape,
            position,
            size,
        }
    })
}

/// A generator of embedding pairs (scale tests: no pixels to draw or
/// decode). Pair `i` depends on the seed and `i` only, so any slice of the
/// dataset can be generated on its own, in any shard layout.
#[derive(Debug, Clone)]
pub struct EmbeddingDemo {
    seed: u64,
    dim: usize,
    /// One prototype per attribute value: colours, shapes, positions, sizes.
    prototypes: Vec<Vec<f32>>,
}

impl EmbeddingDemo {
    /// Prototypes of width `dim` drawn from `seed`.
    pub fn new(dim: usize, seed: u64) -> EmbeddingDemo {
        let mut rng = Rng::derive(seed, "demo-embedding-prototypes");
        let values = COLOURS.len() + SHAPES.len() + POSITIONS.len() + SIZES.len();
        let prototypes = (0..values)
            .map(|_| (0..dim).map(|_| rng.normal() as f32).collect())
            .collect();
        EmbeddingDemo {
            seed,
            dim,
            prototypes,
        }
    }

    /// Pair `i`.
    pub fn pair(&self, i: usize) -> EmbeddingPair {
        let mut rng = Rng::derive(self.seed, &format!("demo-embedding-{i}"));
        let c = rng.below(COLOURS.len());
        let s = rng.below(SHAPES.len());
        let p = rng.below(POSITIONS.len());
        let z = rng.below(SIZES.len());
        let template = rng.below(TEMPLATES);
        let offsets = [
            c,
            COLOURS.len() + s,
            COLOURS.len() + SHAPES.len() + p,
            COLOURS.len() + SHAPES.len() + POSITIONS.len() + z,
        ];
        let embedding = (0..self.dim)
            .map(|d| {
                let signal: f32 = offsets.iter().map(|&o| self.prototypes[o][d]).sum();
                signal + 0.5 * rng.normal() as f32
            })
            .collect();
        let (colour, shape, position, size) = (COLOURS[c], SHAPES[s], POSITIONS[p], SIZES[z]);
        EmbeddingPair {
            key: format!("demo-{i:06}"),
            image: embedding,
            caption: caption(template, colour, shape, position, size),
            colour,
            shape,
            position,
            size,
        }
    }
}

/// Draw one image (RGB) for given attributes; exposed for tests.
///
/// The background is a random light pastel, the shape is filled with its
/// colour (slightly shaded per image) and centred near the middle of its
/// quadrant, and every pixel gets mild noise.
///
/// # Panics
///
/// If an attribute is not one of [`COLOURS`], [`SHAPES`], [`POSITIONS`] or
/// [`SIZES`], or `image_size` is below [`MIN_IMAGE_SIZE`].
pub fn draw(
    colour: &str,
    shape: &str,
    position: &str,
    size: &str,
    image_size: u32,
    rng: &mut Rng,
) -> RgbImage {
    check_size(image_size);
    let base = PALETTE
        .iter()
        .find(|(name, _)| *name == colour)
        .map(|(_, rgb)| *rgb)
        .unwrap_or_else(|| panic!("unknown demo colour {colour:?}"));
    let kind = match shape {
        "circle" => Shape::Circle,
        "square" => Shape::Square,
        "triangle" => Shape::Triangle,
        "cross" => Shape::Cross,
        other => panic!("unknown demo shape {other:?}"),
    };
    let (qx, qy) = match position {
        "top left" => (0.25, 0.25),
        "top right" => (0.75, 0.25),
        "bottom left" => (0.25, 0.75),
        "bottom right" => (0.75, 0.75),
        other => panic!("unknown demo position {other:?}"),
    };
    let radius = match size {
        "small" => SMALL_RADIUS,
        "large" => LARGE_RADIUS,
        other => panic!("unknown demo size {other:?}"),
    };

    let side = image_size as f32;
    // A light grey tinted a little per channel reads as a pastel; the range
    // keeps every background channel at or above 180.
    let grey = 195 + rng.below(46) as i32;
    let background: [i32; 3] = std::array::from_fn(|_| grey + rng.below(31) as i32 - 15);
    let fill: [i32; 3] =
        std::array::from_fn(|c| base[c] as i32 + rng.below(2 * SHADE as usize + 1) as i32 - SHADE);
    let cx = (qx + (rng.uniform() as f32 * 2.0 - 1.0) * JITTER) * side;
    let cy = (qy + (rng.uniform() as f32 * 2.0 - 1.0) * JITTER) * side;
    let r = radius * side;

    RgbImage::from_fn(image_size, image_size, |x, y| {
        // Sample at the pixel centre so shapes are symmetric about (cx, cy).
        let inside = kind.contains(x as f32 + 0.5 - cx, y as f32 + 0.5 - cy, r);
        let colour = if inside { &fill } else { &background };
        // One 64-bit draw gives the noise for all three channels, which keeps
        // the generator fast without visibly correlating the channels.
        let bits = rng.next_u64();
        Rgb(std::array::from_fn(|c| {
            let noise = ((bits >> (16 * c)) & 0xFFFF) as i32 % (2 * NOISE + 1) - NOISE;
            (colour[c] + noise).clamp(0, 255) as u8
        }))
    })
}

/// The four shapes, each tested against a point relative to its centre.
#[derive(Debug, Clone, Copy)]
enum Shape {
    Circle,
    Square,
    Triangle,
    Cross,
}

impl Shape {
    /// Whether the offset `(dx, dy)` from the shape centre lies inside a shape
    /// of "radius" `r`. The proportions make the four shapes easy to tell
    /// apart: the square fills its box, the circle about 79% of it, and the
    /// triangle and cross about half, the triangle narrowing upwards.
    fn contains(self, dx: f32, dy: f32, r: f32) -> bool {
        match self {
            Shape::Circle => dx * dx + dy * dy <= r * r,
            Shape::Square => {
                let half = 0.85 * r;
                dx.abs() <= half && dy.abs() <= half
            }
            Shape::Triangle => {
                // Apex up, base below; the vertical extent is set so the
                // centroid stays within a few percent of r of the centre.
                let a = (0.0, -r);
                let b = (r, 0.6 * r);
                let c = (-r, 0.6 * r);
                let p = (dx, dy);
                let e0 = edge(a, b, p);
                let e1 = edge(b, c, p);
                let e2 = edge(c, a, p);
                (e0 >= 0.0 && e1 >= 0.0 && e2 >= 0.0) || (e0 <= 0.0 && e1 <= 0.0 && e2 <= 0.0)
            }
            Shape::Cross => {
                let arm = 0.3 * r;
                (dx.abs() <= arm && dy.abs() <= r) || (dy.abs() <= arm && dx.abs() <= r)
            }
        }
    }
}

/// Edge function: twice the signed area of triangle `a, b, p`; its sign says
/// on which side of the line `a → b` the point `p` lies.
fn edge(a: (f32, f32), b: (f32, f32), p: (f32, f32)) -> f32 {
    (b.0 - a.0) * (p.1 - a.1) - (b.1 - a.1) * (p.0 - a.0)
}

/// "a" or "an", so that templates with the colour right after the article
/// read naturally ("an orange cross").
fn article(word: &str) -> &'static str {
    if word.starts_with(['a', 'e', 'i', 'o', 'u']) {
        "an"
    } else {
        "a"
    }
}

/// Caption `template` (0..TEMPLATES) for the given attributes. Several
/// phrasings keep a text model from keying on a fixed word order, while the
/// attribute words are always spelled the same so a bag of words still works.
/// Filler words avoid every attribute word, so a caption never names a
/// second colour, shape, size or side.
fn caption(template: usize, colour: &str, shape: &str, position: &str, size: &str) -> String {
    let (c, s, p, z) = (colour, shape, position, size);
    match template {
        0 => format!("a {z} {c} {s} in the {p}"),
        1 => format!("a {z} {c} {s} at the {p} of the picture"),
        2 => format!("{p}: a {z} {c} {s}"),
        3 => format!("there is a {z} {c} {s} in the {p} corner"),
        4 => format!("a picture of a {z} {c} {s} in the {p}"),
        5 => format!("the {p} of the image shows a {z} {c} {s}"),
        6 => format!("{} {c} {s}, {z}, sitting in the {p}", article(c)),
        7 => format!("in the {p} corner there is a {z} {c} {s}"),
        _ => format!("{z} {c} {s} placed at the {p}"),
    }
}

/// Encode as PNG. Fast compression: the noise makes the pixels nearly
/// incompressible anyway, and the default level would dominate run time.
fn encode_png(picture: &RgbImage) -> Vec<u8> {
    let mut out = Cursor::new(Vec::new());
    PngEncoder::new_with_quality(&mut out, CompressionType::Fast, FilterType::Adaptive)
        .write_image(
            picture.as_raw(),
            picture.width(),
            picture.height(),
            image::ExtendedColorType::Rgb8,
        )
        .expect("encoding an in-memory RGB image of valid size into a Vec cannot fail");
    out.into_inner()
}

/// Reject sizes too small to show a shape, with a message naming the limit.
fn check_size(image_size: u32) {
    assert!(
        image_size >= MIN_IMAGE_SIZE,
        "demo image size {image_size} is below the minimum of {MIN_IMAGE_SIZE}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pixels of the shape, found without knowing its colour: everything
    /// far from the background, which is estimated from the border (shapes
    /// never touch the border). Independent of the palette, so a wrong fill
    /// colour or position shows up instead of being filtered away.
    fn shape_pixels(img: &RgbImage) -> Vec<(u32, u32, [u8; 3])> {
        let (w, h) = img.dimensions();
        let mut border: [Vec<u8>; 3] = Default::default();
        for (x, y, p) in img.enumerate_pixels() {
            if x == 0 || y == 0 || x == w - 1 || y == h - 1 {
                for (channel, value) in border.iter_mut().zip(p.0) {
                    channel.push(value);
                }
            }
        }
        let bg: [i32; 3] = std::array::from_fn(|c| {
            border[c].sort_unstable();
            border[c][border[c].len() / 2] as i32
        });
        img.enumerate_pixels()
            .filter(|(_, _, p)| (0..3).any(|c| (p.0[c] as i32 - bg[c]).abs() > 50))
            .map(|(x, y, p)| (x, y, p.0))
            .collect()
    }

    fn palette_rgb(colour: &str) -> [u8; 3] {
        PALETTE.iter().find(|(n, _)| *n == colour).unwrap().1
    }

    /// Name a drawn shape from its pixels alone: the square fills its
    /// bounding box, the circle about π/4 of it, the triangle is much
    /// narrower at the top than at the bottom, and the cross is neither.
    fn classify(pixels: &[(u32, u32, [u8; 3])]) -> &'static str {
        let x0 = pixels.iter().map(|p| p.0).min().unwrap();
        let x1 = pixels.iter().map(|p| p.0).max().unwrap();
        let y0 = pixels.iter().map(|p| p.1).min().unwrap();
        let y1 = pixels.iter().map(|p| p.1).max().unwrap();
        let (bw, bh) = (x1 - x0 + 1, y1 - y0 + 1);
        let fill = pixels.len() as f64 / (bw * bh) as f64;
        if fill > 0.92 {
            return "square";
        }
        if (0.68..0.88).contains(&fill) {
            return "circle";
        }
        let band = (bh / 4).max(1);
        let width_in = |lo: u32, hi: u32| {
            pixels.iter().filter(|p| p.1 >= lo && p.1 < hi).count() as f64 / band as f64
        };
        let top = width_in(y0, y0 + band);
        let bottom = width_in(y1 + 1 - band, y1 + 1);
        if top < 0.6 * bottom {
            "triangle"
        } else {
            "cross"
        }
    }

    fn all_combinations() -> Vec<(&'static str, &'static str, &'static str, &'static str)> {
        let mut out = Vec::new();
        for c in COLOURS {
            for s in SHAPES {
                for p in POSITIONS {
                    for z in SIZES {
                        out.push((c, s, p, z));
                    }
                }
            }
        }
        out
    }

    #[test]
    fn palette_and_colour_list_agree() {
        let names: Vec<&str> = PALETTE.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, COLOURS);
    }

    #[test]
    fn same_seed_is_byte_identical_and_different_seed_differs() {
        let opts = DemoOptions {
            pairs: 50,
            seed: 7,
            image_size: 32,
        };
        let a = generate(&opts);
        let b = generate(&opts);
        assert_eq!(a.len(), 50);
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(x.key, y.key);
            assert_eq!(x.image, y.image);
            assert_eq!(x.caption, y.caption);
            assert_eq!(
                (x.colour, x.shape, x.position, x.size),
                (y.colour, y.shape, y.position, y.size)
            );
        }
        let c = generate(&DemoOptions { seed: 8, ..opts });
        let differing_images = a.iter().zip(&c).filter(|(x, y)| x.image != y.image).count();
        let differing_captions = a
            .iter()
            .zip(&c)
            .filter(|(x, y)| x.caption != y.caption)
            .count();
        assert_eq!(differing_images, 50);
        assert!(differing_captions > 40, "{differing_captions}");
    }

    #[test]
    fn shorter_run_is_a_prefix_of_a_longer_one() {
        let short = generate(&DemoOptions {
            pairs: 5,
            seed: 3,
            image_size: 24,
        });
        let long = generate(&DemoOptions {
            pairs: 20,
            seed: 3,
            image_size: 24,
        });
        for (x, y) in short.iter().zip(&long) {
            assert_eq!(x.image, y.image);
            assert_eq!(x.caption, y.caption);
        }
    }

    #[test]
    fn keys_are_numbered_in_order() {
        let pairs = generate(&DemoOptions {
            pairs: 3,
            seed: 0,
            image_size: 16,
        });
        let keys: Vec<&str> = pairs.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(keys, ["demo-000000", "demo-000001", "demo-000002"]);
    }

    #[test]
    fn png_decodes_to_the_requested_size_and_matches_a_redraw() {
        for size in [MIN_IMAGE_SIZE, 48, 64, 100] {
            let opts = DemoOptions {
                pairs: 4,
                seed: 11,
                image_size: size,
            };
            let pairs = generate(&opts);
            // Replaying the same stream must give exactly the decoded pixels,
            // which checks that the PNG is lossless RGB of the drawn image.
            let mut rng = Rng::derive(opts.seed, "demo");
            for pair in &pairs {
                let decoded =
                    image::load_from_memory_with_format(&pair.image, image::ImageFormat::Png)
                        .unwrap();
                assert_eq!((decoded.width(), decoded.height()), (size, size));
                for _ in 0..5 {
                    rng.next_u64(); // the attribute and template draws
                }
                let redrawn = draw(
                    pair.colour,
                    pair.shape,
                    pair.position,
                    pair.size,
                    size,
                    &mut rng,
                );
                assert_eq!(decoded.to_rgb8(), redrawn);
            }
        }
    }

    #[test]
    fn shape_pixels_sit_in_the_named_quadrant() {
        let mut rng = Rng::new(21);
        let side = 64u32;
        let half = side as f64 / 2.0;
        for (c, s, p, z) in all_combinations() {
            let img = draw(c, s, p, z, side, &mut rng);
            let px = shape_pixels(&img);
            assert!(px.len() > 20, "{c} {s} {p} {z}: only {} pixels", px.len());
            let mx = px.iter().map(|q| q.0 as f64 + 0.5).sum::<f64>() / px.len() as f64;
            let my = px.iter().map(|q| q.1 as f64 + 0.5).sum::<f64>() / px.len() as f64;
            let want_right = p.ends_with("right");
            let want_bottom = p.starts_with("bottom");
            // A centroid near the quadrant centre, not just on the right side
            // of the midline, and every shape pixel inside the quadrant.
            assert_eq!(mx > half, want_right, "{c} {s} {p} {z}: x {mx}");
            assert_eq!(my > half, want_bottom, "{c} {s} {p} {z}: y {my}");
            let qx = if want_right { 0.75 } else { 0.25 } * side as f64;
            let qy = if want_bottom { 0.75 } else { 0.25 } * side as f64;
            assert!(
                (mx - qx).abs() < 0.1 * side as f64,
                "{c} {s} {p} {z}: x {mx}"
            );
            assert!(
                (my - qy).abs() < 0.1 * side as f64,
                "{c} {s} {p} {z}: y {my}"
            );
            for q in &px {
                assert_eq!(q.0 as f64 + 0.5 > half, want_right, "{c} {s} {p} {z}");
                assert_eq!(q.1 as f64 + 0.5 > half, want_bottom, "{c} {s} {p} {z}");
            }
        }
    }

    #[test]
    fn shape_colour_matches_its_name() {
        let mut rng = Rng::new(5);
        for (c, s, p, z) in all_combinations() {
            let img = draw(c, s, p, z, 64, &mut rng);
            let px = shape_pixels(&img);
            let mean: [f64; 3] = std::array::from_fn(|k| {
                px.iter().map(|q| q.2[k] as f64).sum::<f64>() / px.len() as f64
            });
            let want = palette_rgb(c);
            for k in 0..3 {
                assert!(
                    (mean[k] - want[k] as f64).abs() <= SHADE as f64 + 3.0,
                    "{c} {s} {p} {z}: mean {mean:?} vs {want:?}"
                );
            }
            // And it is nearer its own colour than any other palette entry.
            let nearest = PALETTE
                .iter()
                .min_by(|a, b| {
                    let d = |rgb: &[u8; 3]| {
                        (0..3)
                            .map(|k| (mean[k] - rgb[k] as f64).powi(2))
                            .sum::<f64>()
                    };
                    d(&a.1).total_cmp(&d(&b.1))
                })
                .unwrap()
                .0;
            assert_eq!(nearest, c);
        }
    }

    #[test]
    fn shape_and_size_are_recognisable_from_pixels() {
        let mut rng = Rng::new(9);
        for (c, s, p, z) in all_combinations() {
            let img = draw(c, s, p, z, 64, &mut rng);
            let px = shape_pixels(&img);
            assert_eq!(classify(&px), s, "{c} {s} {p} {z}");
        }
        // Large shapes cover well over twice the pixels of small ones.
        for s in SHAPES {
            let small = shape_pixels(&draw("blue", s, "top left", "small", 64, &mut rng)).len();
            let large = shape_pixels(&draw("blue", s, "top left", "large", 64, &mut rng)).len();
            assert!(large as f64 > 2.0 * small as f64, "{s}: {small} vs {large}");
        }
    }

    #[test]
    fn backgrounds_vary_between_images() {
        let mut rng = Rng::new(1);
        let corners: Vec<[u8; 3]> = (0..10)
            .map(|_| {
                draw("red", "circle", "top left", "small", 32, &mut rng)
                    .get_pixel(31, 31)
                    .0
            })
            .collect();
        let first = corners[0];
        assert!(corners.iter().any(|&c| c != first));
    }

    #[test]
    fn caption_names_exactly_the_drawn_attributes() {
        let pairs = generate(&DemoOptions {
            pairs: 500,
            seed: 2,
            image_size: 16,
        });
        let has_word = |caption: &str, word: &str| {
            caption
                .split(|ch: char| !ch.is_ascii_alphabetic())
                .any(|w| w == word)
        };
        for pair in &pairs {
            let cap = &pair.caption;
            assert_eq!(cap, &cap.to_lowercase());
            assert!(has_word(cap, pair.colour), "{cap}");
            assert!(has_word(cap, pair.shape), "{cap}");
            assert!(has_word(cap, pair.size), "{cap}");
            assert!(cap.contains(pair.position), "{cap}");
            for other in COLOURS.iter().chain(&SHAPES).chain(&SIZES) {
                if ![pair.colour, pair.shape, pair.size].contains(other) {
                    assert!(!has_word(cap, other), "{cap} names {other}");
                }
            }
            for side in ["top", "bottom", "left", "right"] {
                let count = cap
                    .split(|ch: char| !ch.is_ascii_alphabetic())
                    .filter(|w| *w == side)
                    .count();
                let want = pair.position.split(' ').filter(|w| *w == side).count();
                assert_eq!(count, want, "{cap}: {side}");
            }
        }
    }

    #[test]
    fn captions_use_many_templates() {
        let pairs = generate(&DemoOptions {
            pairs: 500,
            seed: 4,
            image_size: 16,
        });
        let mut skeletons: Vec<String> = pairs
            .iter()
            .map(|p| {
                p.caption
                    .replace(p.position, "<p>")
                    .replace(p.colour, "<c>")
                    .replace(p.shape, "<s>")
                    .replace(p.size, "<z>")
                    .replace("an <c>", "a <c>")
            })
            .collect();
        skeletons.sort();
        skeletons.dedup();
        assert_eq!(skeletons.len(), TEMPLATES, "{skeletons:?}");
    }

    #[test]
    fn attributes_are_roughly_uniform() {
        let pairs = generate(&DemoOptions {
            pairs: 2000,
            seed: 0,
            image_size: MIN_IMAGE_SIZE,
        });
        fn check(values: Vec<&str>, names: &[&str]) {
            let expected = values.len() as f64 / names.len() as f64;
            for name in names {
                let n = values.iter().filter(|v| *v == name).count() as f64;
                assert!(
                    (n - expected).abs() < 0.2 * expected,
                    "{name}: {n} vs {expected}"
                );
            }
        }
        check(pairs.iter().map(|p| p.colour).collect(), &COLOURS);
        check(pairs.iter().map(|p| p.shape).collect(), &SHAPES);
        check(pairs.iter().map(|p| p.position).collect(), &POSITIONS);
        check(pairs.iter().map(|p| p.size).collect(), &SIZES);
    }

    #[test]
    #[should_panic(expected = "unknown demo colour")]
    fn unknown_colour_is_rejected() {
        draw("teal", "circle", "top left", "small", 32, &mut Rng::new(0));
    }

    #[test]
    fn embedding_pairs_depend_on_their_index_only() {
        let g = EmbeddingDemo::new(8, 3);
        let a = g.pair(5);
        let b = EmbeddingDemo::new(8, 3).pair(5);
        assert_eq!((a.key.as_str(), &a.image), (b.key.as_str(), &b.image));
        assert_eq!(a.image.len(), 8);
        assert_ne!(g.pair(6).image, a.image);
        for word in [a.colour, a.shape, a.size] {
            assert!(a.caption.contains(word), "{} lacks {word}", a.caption);
        }
    }

    #[test]
    #[should_panic(expected = "below the minimum")]
    fn tiny_images_are_rejected() {
        generate(&DemoOptions {
            pairs: 1,
            seed: 0,
            image_size: 4,
        });
    }
}
