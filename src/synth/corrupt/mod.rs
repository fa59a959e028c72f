//! Synthetic noisy correspondence with ground truth (METHODS.md §6, the NCR
//! convention): a chosen fraction of pairs get their images permuted among
//! themselves, and a `noisy` column records which pairs no longer point at
//! their own image.
//!
//! Three kinds of noise ([`NoiseMode`]): `random` (NCR's permutation: a
//! caption gets an unrelated image), `hard` (a caption gets the image of a
//! *similar* image, [`neighbours`]: the mismatch is partial, as in scraped
//! data where a caption describes a similar scene) and `mixed` (a fraction
//! of the chosen pairs hard, the rest random).
//!
//! The whole table is held in memory: this is a benchmark tool for datasets
//! that a method is then trained on, and a global permutation needs random
//! access to every row anyway.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use arrow_array::{Array, ArrayRef, BooleanArray, RecordBatch, UInt64Array};
use arrow_schema::{DataType, Field, Schema};
use ncclean_models::rng::Rng;

use crate::data::{check_same_schema, image_columns, AtomicParquetWriter, InputSet};
use crate::error::{invalid, Error, Result};

pub mod neighbours;

/// Which pairs replace a chosen pair's image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum NoiseMode {
    /// The chosen pairs' images are permuted among themselves (NCR's
    /// benchmark noise: mostly unrelated images).
    #[default]
    Random,
    /// Each chosen pair gets the image of one of the 3 images most similar
    /// to its own by caption words, never its own image: the caption is
    /// partly right for it.
    Hard,
    /// --hard-fraction of the chosen pairs hard, the rest random.
    Mixed,
}

impl NoiseMode {
    /// The name on the command line and in the output's metadata.
    pub fn name(self) -> &'static str {
        match self {
            NoiseMode::Random => "random",
            NoiseMode::Hard => "hard",
            NoiseMode::Mixed => "mixed",
        }
    }
}

/// What noise to inject.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Noise {
    /// Fraction of the pairs chosen for corruption, in [0, 1].
    pub rate: f64,
    /// Seed of every random choice.
    pub seed: u64,
    /// Kind of replacement image.
    pub mode: NoiseMode,
    /// Fraction of the chosen pairs that get hard noise in `mixed` mode, in
    /// [0, 1] (1 for `hard`, 0 for `random`).
    pub hard_fraction: f64,
}

impl Noise {
    /// The noise `ncclean corrupt`'s flags ask for: `rate` in [0, 1], and
    /// `hard_fraction` (default 0.5) only with `mode` mixed (usage errors
    /// naming the flags).
    pub fn from_flags(
        rate: f64,
        seed: u64,
        mode: NoiseMode,
        hard_fraction: Option<f64>,
    ) -> Result<Noise> {
        if !(0.0..=1.0).contains(&rate) || rate.is_nan() {
            return Err(Error::Usage(format!(
                "--rate must be between 0 and 1, got {rate}"
            )));
        }
        if mode != NoiseMode::Mixed && hard_fraction.is_some() {
            return Err(Error::Usage(format!(
                "--hard-fraction only applies to --mode mixed (got --mode {})",
                mode.name()
            )));
        }
        Ok(Noise {
            rate,
            seed,
            mode,
            hard_fraction: hard_fraction.unwrap_or(0.5),
        })
    }
}

/// Nearest neighbours a hard-noise replacement is drawn from: more than one
/// so that the captions of one image do not all get the same wrong image.
const HARD_NEIGHBOURS: usize = 3;

/// Name of the ground-truth column added to the output.
pub const NOISY_COLUMN: &str = "noisy";

/// Rows read and written per batch; the table is assembled in memory anyway,
/// this only keeps row groups a reasonable size.
const BATCH_ROWS: usize = 8192;

/// What `corrupt` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CorruptSummary {
    /// Rows written.
    pub rows: usize,
    /// Rows whose image now comes from another row (`noisy = true`).
    pub noisy: usize,
    /// Positions chosen for permutation, ⌊rate·N⌋; at least `noisy`, since a
    /// chosen position may draw its own image back.
    pub chosen: usize,
}

/// What `ncclean corrupt` prints on stdout.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CorruptPrinted {
    /// The output file.
    pub out: String,
    /// Rows written.
    pub rows: usize,
    /// Positions chosen for permutation.
    pub chosen: usize,
    /// Rows whose image now comes from another row.
    pub noisy: usize,
}

/// `ncclean corrupt`: [`corrupt`] `input` into `out`, which may not be one
/// of the input files, and say what changed on stderr.
pub fn corrupt_file(
    input: &InputSet,
    noise: &Noise,
    out: &Path,
    rep: &crate::runtime::progress::Reporter,
) -> Result<CorruptPrinted> {
    let files: Vec<std::path::PathBuf> = input.files.iter().map(|f| f.path.clone()).collect();
    crate::run::dir::check_not_an_input(out, &files, "--out")?;
    let s = corrupt(input, noise, out)?;
    rep.info(&format!(
        "replaced the images of {} of {} rows ({} noise); {} pairs are now mismatched",
        s.chosen,
        s.rows,
        noise.mode.name(),
        s.noisy
    ));
    Ok(CorruptPrinted {
        out: out.display().to_string(),
        rows: s.rows,
        chosen: s.chosen,
        noisy: s.noisy,
    })
}

/// ⌊rate·N⌋; the epsilon keeps 0.29·100 at 29 despite binary floating point.
fn chosen_count(n: usize, rate: f64) -> usize {
    (((rate * n as f64) + 1e-9).floor() as usize).min(n)
}

/// `perm[i]` is the row whose image row `i` gets. ⌊rate·N⌋ positions are
/// chosen at random (stream `Rng::derive(seed, "corrupt")`) and their images
/// shuffled among themselves, exactly as NCR does, so a chosen position may
/// keep its own image; every other position maps to itself. `rate` is
/// clamped to [0, 1].
pub fn noise_permutation(n: usize, rate: f64, seed: u64) -> Vec<usize> {
    let rate = if rate.is_nan() {
        0.0
    } else {
        rate.clamp(0.0, 1.0)
    };
    let k = chosen_count(n, rate);
    let mut rng = Rng::derive(seed, "corrupt");
    let order = rng.permutation(n);
    let chosen = &order[..k];
    let mut sources = chosen.to_vec();
    rng.shuffle(&mut sources);
    let mut perm: Vec<usize> = (0..n).collect();
    for (&target, &source) in chosen.iter().zip(&sources) {
        perm[target] = source;
    }
    perm
}

/// `source[i]` is the row whose image row `i` gets, for `noise` over `n`
/// rows whose images are `image_of[i]` (rows with equal ids show the same
/// image) and whose captions are `captions[i]`.
///
/// ⌊rate·N⌋ positions are chosen exactly as [`noise_permutation`] chooses
/// them (so `random` is that permutation); in `hard` and `mixed` mode the
/// first ⌊hard_fraction·chosen⌋ of them (in the random order) each get a row
/// of one of their image's `HARD_NEIGHBOURS` nearest other images by
/// caption words (picked at random, stream `corrupt-hard`), and the rest are
/// permuted among themselves. A hard position whose image shares no content
/// word with any other image gets a random other image; with a single
/// distinct image there is nothing to swap in and the row stays clean.
pub fn noise_sources(noise: &Noise, image_of: &[usize], captions: &[&str]) -> Vec<usize> {
    let n = image_of.len();
    let rate = if noise.rate.is_nan() {
        0.0
    } else {
        noise.rate.clamp(0.0, 1.0)
    };
    let hard_fraction = match noise.mode {
        NoiseMode::Random => 0.0,
        NoiseMode::Hard => 1.0,
        NoiseMode::Mixed => noise.hard_fraction.clamp(0.0, 1.0),
    };
    let k = chosen_count(n, rate);
    let h = chosen_count(k, hard_fraction);
    let mut rng = Rng::derive(noise.seed, "corrupt");
    let order = rng.permutation(n);
    let mut perm: Vec<usize> = (0..n).collect();
    let random = &order[h..k];
    let mut sources = random.to_vec();
    rng.shuffle(&mut sources);
    for (&target, &source) in random.iter().zip(&sources) {
        perm[target] = source;
    }
    if h == 0 {
        return perm;
    }
    // Documents: the captions of each distinct image.
    let images = image_of.iter().copied().max().map_or(0, |m| m + 1);
    let mut rows_of: Vec<Vec<usize>> = vec![Vec::new(); images];
    for (i, &g) in image_of.iter().enumerate() {
        rows_of[g].push(i);
    }
    let texts: Vec<Vec<&str>> = rows_of
        .iter()
        .map(|rows| rows.iter().map(|&r| captions[r]).collect())
        .collect();
    let index = neighbours::WordIndex::new(&texts);
    let mut near: HashMap<usize, Vec<usize>> = HashMap::new();
    let mut pick = Rng::derive(noise.seed, "corrupt-hard");
    for &target in &order[..h] {
        let own = image_of[target];
        let cands = near
            .entry(own)
            .or_insert_with(|| index.nearest(own, HARD_NEIGHBOURS));
        let image = if !cands.is_empty() {
            cands[pick.below(cands.len())]
        } else if images > 1 {
            // No shared content word: any other image. Ids are dense, so
            // draw among images - 1 and skip over the own one.
            let j = pick.below(images - 1);
            if j >= own {
                j + 1
            } else {
                j
            }
        } else {
            continue;
        };
        let rows = &rows_of[image];
        perm[target] = rows[pick.below(rows.len())];
    }
    perm
}

/// Write `input` as one parquet file at `out` with synthetic noise: the image
/// column — and every other column that belongs to the image (other image
/// or embedding columns, `url`, `width`, `height`, `sha256`...; see
/// [`crate::data::image_columns`]) — is taken from the row
/// [`noise_sources`] says; captions, keys and all other columns stay. A
/// boolean `noisy` column marks rows whose image now comes from another row.
/// Rows with identical image values (bytes, paths, Hugging Face structs,
/// embeddings) count as one image when hard noise looks for similar ones.
///
/// Footer metadata: `ncclean.corrupt.rate`, `ncclean.corrupt.seed`,
/// `ncclean.corrupt.mode`, `ncclean.corrupt.hard_fraction`,
/// `ncclean.corrupt.permutation` (JSON `[[target_row, source_row], ...]` for
/// the changed rows, global row indices; a permutation of the changed rows
/// in `random` mode, a many-to-one map in `hard`),
/// `ncclean.corrupt.image_columns` and `ncclean.version`.
///
/// An input that already has a `noisy` column is refused rather than
/// overwritten, since its ground truth would be silently lost. `rate` or
/// `hard_fraction` outside [0, 1] is [`Error::Usage`].
pub fn corrupt(input: &InputSet, noise: &Noise, out: &Path) -> Result<CorruptSummary> {
    let (rate, seed) = (noise.rate, noise.seed);
    if !(0.0..=1.0).contains(&rate) {
        return Err(Error::Usage(format!(
            "--rate {rate} is outside [0, 1]; it is the fraction of pairs to corrupt"
        )));
    }
    if !(0.0..=1.0).contains(&noise.hard_fraction) {
        return Err(Error::Usage(format!(
            "--hard-fraction {} is outside [0, 1]; it is the fraction of the corrupted pairs that get a similar image",
            noise.hard_fraction
        )));
    }
    for f in &input.files {
        if f.schema.field_with_name(NOISY_COLUMN).is_ok() {
            return Err(invalid(format!(
                "{}: already has a \"{NOISY_COLUMN}\" column (was it corrupted before?); \
                 drop that column first, or corrupt the original data",
                f.path.display()
            )));
        }
    }
    check_same_schema(input)?;

    let schema = input.files[0].schema.clone();
    let table = read_all(input)?;
    let n = table.num_rows();
    let perm = if noise.mode == NoiseMode::Random {
        noise_permutation(n, rate, seed)
    } else {
        let image_of = image_ids(&table, &input.columns.image)?;
        let caps = table
            .column_by_name(&input.columns.caption)
            .map(crate::data::plain)
            .transpose()?
            .ok_or_else(|| invalid(format!("no caption column {:?}", input.columns.caption)))?;
        let captions: Vec<String> = (0..n)
            .map(|i| crate::data::string_at(caps.as_ref(), i).unwrap_or_default())
            .collect();
        let captions: Vec<&str> = captions.iter().map(String::as_str).collect();
        noise_sources(noise, &image_of, &captions)
    };
    crate::runtime::interrupt::check()?;
    let moved = image_columns(&schema, &input.columns);

    let indices = UInt64Array::from_iter_values(perm.iter().map(|&s| s as u64));
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len() + 1);
    for (field, column) in schema.fields().iter().zip(table.columns()) {
        if moved.contains(field.name()) {
            let taken = arrow_select::take::take(column.as_ref(), &indices, None)
                .with_context(|| format!("permuting column {}", field.name()))?;
            columns.push(taken);
        } else {
            columns.push(column.clone());
        }
    }
    let noisy: BooleanArray = perm
        .iter()
        .enumerate()
        .map(|(i, &s)| Some(i != s))
        .collect();
    let noisy_count = noisy.true_count();
    columns.push(Arc::new(noisy));

    let mut fields: Vec<Arc<Field>> = schema.fields().iter().cloned().collect();
    fields.push(Arc::new(Field::new(NOISY_COLUMN, DataType::Boolean, false)));
    let out_schema = Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()));
    let batch = RecordBatch::try_new(out_schema.clone(), columns)
        .context("assembling the corrupted table")?;

    let changed: Vec<[usize; 2]> = perm
        .iter()
        .enumerate()
        .filter(|(i, s)| i != *s)
        .map(|(i, &s)| [i, s])
        .collect();
    let mut metadata = crate::data::Metadata::versioned();
    metadata.put("corrupt.rate", rate.to_string());
    metadata.put("corrupt.seed", seed.to_string());
    metadata.put("corrupt.mode", noise.mode.name());
    metadata.put(
        "corrupt.hard_fraction",
        match noise.mode {
            NoiseMode::Random => 0.0,
            NoiseMode::Hard => 1.0,
            NoiseMode::Mixed => noise.hard_fraction,
        }
        .to_string(),
    );
    metadata.put(
        "corrupt.permutation",
        serde_json::to_string(&changed).context("encoding the permutation")?,
    );
    metadata.put(
        "corrupt.image_columns",
        serde_json::to_string(&moved).context("encoding the image columns")?,
    );
    let metadata = metadata.into_map();

    let mut writer = AtomicParquetWriter::create(out, out_schema, &metadata)?;
    let mut start = 0;
    while start < n {
        // A first Ctrl-C stops here (the temporary is removed), as in
        // every other command, instead of being ignored until the end.
        crate::runtime::interrupt::check()?;
        let len = BATCH_ROWS.min(n - start);
        writer.write(&batch.slice(start, len))?;
        start += len;
    }
    crate::runtime::interrupt::check()?;
    writer.finish()?;
    Ok(CorruptSummary {
        rows: n,
        noisy: noisy_count,
        chosen: chosen_count(n, rate),
    })
}

/// Per row, the id of its image: rows whose image column holds equal values
/// (the same bytes, path, struct or embedding) share an id; ids count from 0
/// in order of first appearance. Values are compared by their SHA-256.
fn image_ids(table: &RecordBatch, column: &str) -> Result<Vec<usize>> {
    use sha2::{Digest, Sha256};
    let col = table
        .column_by_name(column)
        .ok_or_else(|| invalid(format!("no image column {column:?}")))?;
    let col = crate::data::plain(col)?;
    let mut ids: HashMap<[u8; 32], usize> = HashMap::new();
    let mut out = Vec::with_capacity(col.len());
    for i in 0..col.len() {
        let mut h = Sha256::new();
        if col.is_null(i) {
            // Nulls are never the same image as anything: the row index.
            h.update(b"null");
            h.update(i.to_le_bytes());
        } else {
            value_bytes(col.as_ref(), i, &mut h);
        }
        let key: [u8; 32] = h.finalize().into();
        let next = ids.len();
        out.push(*ids.entry(key).or_insert(next));
    }
    Ok(out)
}

/// Feed the content of `array[row]` to `h`: bytes and strings as they are,
/// structs field by field, lists and other types by arrow's display form.
fn value_bytes(array: &dyn arrow_array::Array, row: usize, h: &mut sha2::Sha256) {
    use arrow_array::cast::AsArray;
    use sha2::Digest;
    if let Some(b) = crate::data::bytes_at(array, row) {
        h.update(b"b");
        h.update(b);
    } else if let Some(s) = crate::data::string_at(array, row) {
        h.update(b"s");
        h.update(s.as_bytes());
    } else if let Some(st) = array.as_struct_opt() {
        for c in st.columns() {
            h.update(b"f");
            if c.is_null(row) {
                h.update(b"null");
            } else {
                value_bytes(c.as_ref(), row, h);
            }
        }
    } else {
        let slice = array.slice(row, 1);
        h.update(format!("{slice:?}").as_bytes());
    }
}

/// Every row of every file as one batch, in input order.
fn read_all(input: &InputSet) -> Result<RecordBatch> {
    let schema = input.files[0].schema.clone();
    let mut batches = Vec::new();
    for f in 0..input.files.len() {
        for b in input.record_batches(f, BATCH_ROWS)? {
            crate::runtime::interrupt::check()?;
            // Shards may differ in schema-level metadata only; re-tag them.
            let b = b?;
            let b = RecordBatch::try_new(schema.clone(), b.columns().to_vec())
                .with_context(|| format!("reading {}", input.display_name(f)))?;
            batches.push(b);
        }
    }
    Ok(arrow_select::concat::concat_batches(&schema, &batches)
        .context("concatenating the input files")?)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::fs::File;

    use arrow_array::cast::AsArray;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    use super::*;
    use crate::data::testutil::{binaries, strings, write_parquet};
    use crate::data::ColumnOptions;

    #[test]
    fn permutation_moves_exactly_the_chosen_positions() {
        for (n, rate) in [
            (100, 0.2),
            (100, 0.29),
            (7, 0.5),
            (10, 1.0),
            (10, 0.0),
            (0, 0.5),
        ] {
            let p = noise_permutation(n, rate, 42);
            assert_eq!(p, noise_permutation(n, rate, 42), "deterministic");
            let mut sorted = p.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "a permutation");
            let moved = p.iter().enumerate().filter(|(i, s)| i != *s).count();
            assert!(moved <= chosen_count(n, rate));
            // Sources of moved rows are themselves moved rows: the chosen
            // set is closed under the permutation.
            assert!(p.iter().enumerate().all(|(i, &s)| s == i || p[s] != s));
        }
        assert_eq!(chosen_count(100, 0.29), 29);
        assert_eq!(chosen_count(7, 0.5), 3);
        assert_ne!(
            noise_permutation(100, 0.5, 1),
            noise_permutation(100, 0.5, 2)
        );
        // With many chosen positions, nearly all of them actually move.
        let p = noise_permutation(1000, 0.4, 3);
        let moved = p.iter().enumerate().filter(|(i, s)| i != *s).count();
        assert!((390..=400).contains(&moved), "{moved}");
    }

    fn random(rate: f64, seed: u64) -> Noise {
        Noise {
            rate,
            seed,
            mode: NoiseMode::Random,
            hard_fraction: 0.0,
        }
    }

    fn input(dir: &Path, n: usize) -> InputSet {
        let mut paths = Vec::new();
        for (f, range) in [(0, 0..n / 2), (1, n / 2..n)] {
            let caps: Vec<String> = range.clone().map(|i| format!("cap{i}")).collect();
            let imgs: Vec<String> = range.clone().map(|i| format!("img{i}")).collect();
            let urls: Vec<String> = range.map(|i| format!("http://x/{i}")).collect();
            let c: Vec<Option<&str>> = caps.iter().map(|s| Some(s.as_str())).collect();
            let i: Vec<Option<&[u8]>> = imgs.iter().map(|s| Some(s.as_bytes())).collect();
            let u: Vec<Option<&str>> = urls.iter().map(|s| Some(s.as_str())).collect();
            paths.push(write_parquet(
                dir,
                &format!("s{f}.parquet"),
                vec![
                    ("key", strings(&c)),
                    ("jpg", binaries(&i)),
                    ("caption", strings(&c)),
                    ("url", strings(&u)),
                ],
            ));
        }
        InputSet::open(&paths, &ColumnOptions::default()).unwrap()
    }

    #[test]
    fn corrupt_permutes_images_and_records_ground_truth() {
        let dir = tempfile::tempdir().unwrap();
        let n = 40;
        let set = input(dir.path(), n);
        let out = dir.path().join("noisy.parquet");
        let s = corrupt(&set, &random(0.5, 9), &out).unwrap();
        let perm = noise_permutation(n, 0.5, 9);
        let moved = perm.iter().enumerate().filter(|(i, s)| i != *s).count();
        assert_eq!(
            s,
            CorruptSummary {
                rows: n,
                noisy: moved,
                chosen: 20
            }
        );
        assert!(moved > 10);

        let b = ParquetRecordBatchReaderBuilder::try_new(File::open(&out).unwrap()).unwrap();
        let kv: BTreeMap<String, String> = b
            .metadata()
            .file_metadata()
            .key_value_metadata()
            .unwrap()
            .iter()
            .map(|k| (k.key.clone(), k.value.clone().unwrap_or_default()))
            .collect();
        assert_eq!(kv["ncclean.corrupt.rate"], "0.5");
        assert_eq!(kv["ncclean.corrupt.seed"], "9");
        assert!(kv.contains_key("ncclean.version"));
        let pairs: Vec<[usize; 2]> =
            serde_json::from_str(&kv["ncclean.corrupt.permutation"]).unwrap();
        assert_eq!(pairs.len(), moved);
        assert!(pairs.iter().all(|&[t, s]| perm[t] == s && t != s));
        assert_eq!(kv["ncclean.corrupt.image_columns"], r#"["jpg","url"]"#);

        let schema = b.schema().clone();
        let batches: Vec<RecordBatch> = b.build().unwrap().map(|b| b.unwrap()).collect();
        let t = arrow_select::concat::concat_batches(&schema, &batches).unwrap();
        assert_eq!(t.num_rows(), n);
        let caps = t
            .column_by_name("caption")
            .unwrap()
            .as_string::<i32>()
            .clone();
        let keys = t.column_by_name("key").unwrap().as_string::<i32>().clone();
        let imgs = t.column_by_name("jpg").unwrap().as_binary::<i32>().clone();
        let urls = t.column_by_name("url").unwrap().as_string::<i32>().clone();
        let noisy = t.column_by_name("noisy").unwrap().as_boolean().clone();
        for (i, &src) in perm.iter().enumerate() {
            assert_eq!(caps.value(i), format!("cap{i}"));
            assert_eq!(keys.value(i), format!("cap{i}"));
            assert_eq!(imgs.value(i), format!("img{src}").as_bytes());
            assert_eq!(urls.value(i), format!("http://x/{src}"));
            assert_eq!(noisy.value(i), src != i);
        }

        let again = InputSet::open(std::slice::from_ref(&out), &ColumnOptions::default()).unwrap();
        let e = corrupt(&again, &random(0.2, 1), &dir.path().join("twice.parquet")).unwrap_err();
        assert_eq!(e.exit_code(), 3);
        assert!(
            e.to_string().contains("already has a \"noisy\" column"),
            "{e}"
        );
    }

    fn noise(mode: NoiseMode, rate: f64, seed: u64, hard_fraction: f64) -> Noise {
        Noise {
            rate,
            seed,
            mode,
            hard_fraction,
        }
    }

    /// 6 images, 3 captions each (rows 3g..3g+3 show image g); images come
    /// in pairs that share content words (0-1 dogs, 2-3 cars, 4-5 boats)
    /// and no word crosses pairs.
    fn paired_scenes() -> (Vec<usize>, Vec<String>) {
        let scenes = [
            "dog ball grass",
            "dog frisbee grass",
            "car road city",
            "car street city",
            "boat lake sunset",
            "boat river sunset",
        ];
        let mut image_of = Vec::new();
        let mut caps = Vec::new();
        for (g, s) in scenes.iter().enumerate() {
            for c in 0..3 {
                image_of.push(g);
                caps.push(format!("A {s} caption{g}x{c}"));
            }
        }
        (image_of, caps)
    }

    #[test]
    fn random_mode_is_the_ncr_permutation() {
        let (image_of, caps) = paired_scenes();
        let caps: Vec<&str> = caps.iter().map(String::as_str).collect();
        for rate in [0.2, 0.5, 1.0] {
            assert_eq!(
                noise_sources(&noise(NoiseMode::Random, rate, 4, 0.7), &image_of, &caps),
                noise_permutation(image_of.len(), rate, 4)
            );
        }
    }

    #[test]
    fn hard_noise_picks_a_similar_image_never_its_own() {
        let (image_of, caps) = paired_scenes();
        let caps: Vec<&str> = caps.iter().map(String::as_str).collect();
        let n = image_of.len();
        for seed in 0..5 {
            let s = noise_sources(&noise(NoiseMode::Hard, 0.5, seed, 0.0), &image_of, &caps);
            assert_eq!(
                s,
                noise_sources(&noise(NoiseMode::Hard, 0.5, seed, 0.0), &image_of, &caps),
                "deterministic"
            );
            let changed: Vec<usize> = (0..n).filter(|&i| s[i] != i).collect();
            // Rate respected: every chosen row gets another image.
            assert_eq!(changed.len(), chosen_count(n, 0.5));
            for &i in &changed {
                // The only image sharing words with image g is its partner g ^ 1.
                assert_eq!(image_of[s[i]], image_of[i] ^ 1, "row {i} got row {}", s[i]);
            }
        }
        // The chosen rows are NCR's: the same positions as random noise.
        let hard = noise_sources(&noise(NoiseMode::Hard, 0.5, 3, 0.0), &image_of, &caps);
        let random = noise_permutation(n, 0.5, 3);
        let mut rng = Rng::derive(3, "corrupt");
        let mut chosen = rng.permutation(n)[..chosen_count(n, 0.5)].to_vec();
        chosen.sort_unstable();
        let hard_changed: Vec<usize> = (0..n).filter(|&i| hard[i] != i).collect();
        assert_eq!(hard_changed, chosen);
        assert!((0..n)
            .filter(|&i| random[i] != i)
            .all(|i| chosen.contains(&i)));
        assert_ne!(
            noise_sources(&noise(NoiseMode::Hard, 0.5, 1, 0.0), &image_of, &caps),
            noise_sources(&noise(NoiseMode::Hard, 0.5, 2, 0.0), &image_of, &caps)
        );
    }

    #[test]
    fn hard_noise_without_shared_words_or_other_images() {
        // No content word in common: any other image, never the own one.
        let image_of = vec![0, 0, 1, 2, 3];
        let caps = ["apple", "apple pie", "zebra", "violin", "glacier"];
        for seed in 0..20 {
            let s = noise_sources(&noise(NoiseMode::Hard, 1.0, seed, 0.0), &image_of, &caps);
            assert!((0..5).all(|i| image_of[s[i]] != image_of[i]), "{s:?}");
        }
        // One image only: nothing to swap in, every row stays clean.
        let s = noise_sources(
            &noise(NoiseMode::Hard, 1.0, 0, 0.0),
            &[0, 0, 0],
            &["a dog", "the dog", "dogs"],
        );
        assert_eq!(s, [0, 1, 2]);
    }

    #[test]
    fn mixed_noise_splits_the_chosen_rows() {
        let (image_of, caps) = paired_scenes();
        let caps: Vec<&str> = caps.iter().map(String::as_str).collect();
        let n = image_of.len();
        let k = chosen_count(n, 1.0);
        let h = chosen_count(k, 0.5);
        let s = noise_sources(&noise(NoiseMode::Mixed, 1.0, 11, 0.5), &image_of, &caps);
        let order = Rng::derive(11, "corrupt").permutation(n);
        // The first h chosen rows: a neighbour's image.
        assert!(order[..h]
            .iter()
            .all(|&i| image_of[s[i]] == image_of[i] ^ 1));
        // The rest: permuted among themselves (NCR).
        let mut rest: Vec<usize> = order[h..k].iter().map(|&i| s[i]).collect();
        let mut want = order[h..k].to_vec();
        rest.sort_unstable();
        want.sort_unstable();
        assert_eq!(rest, want);
        // Fractions 0 and 1 are random and hard.
        assert_eq!(
            noise_sources(&noise(NoiseMode::Mixed, 0.5, 2, 0.0), &image_of, &caps),
            noise_sources(&noise(NoiseMode::Random, 0.5, 2, 0.0), &image_of, &caps)
        );
        assert_eq!(
            noise_sources(&noise(NoiseMode::Mixed, 0.5, 2, 1.0), &image_of, &caps),
            noise_sources(&noise(NoiseMode::Hard, 0.5, 2, 0.0), &image_of, &caps)
        );
    }

    #[test]
    fn corrupt_hard_groups_rows_by_image_bytes() {
        // 8 images of 2 rows each (same bytes, different captions), words
        // shared within pairs of images: 2k and 2k + 1.
        let dir = tempfile::tempdir().unwrap();
        let topics = ["kite beach", "piano concert", "horse farm", "snow skier"];
        let caps: Vec<String> = (0..16)
            .map(|r| format!("{} number{}", topics[r / 4], r))
            .collect();
        let imgs: Vec<String> = (0..16).map(|r| format!("img{}", r / 2)).collect();
        let c: Vec<Option<&str>> = caps.iter().map(|s| Some(s.as_str())).collect();
        let i: Vec<Option<&[u8]>> = imgs.iter().map(|s| Some(s.as_bytes())).collect();
        let path = write_parquet(
            dir.path(),
            "d.parquet",
            vec![("jpg", binaries(&i)), ("caption", strings(&c))],
        );
        let set = InputSet::open(&[path], &ColumnOptions::default()).unwrap();
        let out = dir.path().join("hard.parquet");
        let s = corrupt(&set, &noise(NoiseMode::Hard, 0.5, 5, 0.5), &out).unwrap();
        assert_eq!((s.rows, s.chosen, s.noisy), (16, 8, 8));
        let b = ParquetRecordBatchReaderBuilder::try_new(File::open(&out).unwrap()).unwrap();
        let kv: BTreeMap<String, String> = b
            .metadata()
            .file_metadata()
            .key_value_metadata()
            .unwrap()
            .iter()
            .map(|k| (k.key.clone(), k.value.clone().unwrap_or_default()))
            .collect();
        assert_eq!(kv["ncclean.corrupt.mode"], "hard");
        assert_eq!(kv["ncclean.corrupt.hard_fraction"], "1");
        let t = b.build().unwrap().next().unwrap().unwrap();
        let jpg = t.column_by_name("jpg").unwrap().as_binary::<i32>().clone();
        let noisy = t.column_by_name("noisy").unwrap().as_boolean().clone();
        for r in 0..16 {
            let got = std::str::from_utf8(jpg.value(r)).unwrap();
            let own = r / 2;
            if noisy.value(r) {
                // The other image of the same topic: img 2k <-> img 2k + 1.
                assert_eq!(got, format!("img{}", own ^ 1), "row {r}");
            } else {
                assert_eq!(got, format!("img{own}"));
            }
        }
        let e = corrupt(&set, &noise(NoiseMode::Mixed, 0.5, 5, 1.5), &out).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("--hard-fraction"), "{e}");
    }

    #[test]
    fn rate_outside_unit_interval_is_usage_error() {
        let dir = tempfile::tempdir().unwrap();
        let set = input(dir.path(), 4);
        for rate in [-0.1, 1.5, f64::NAN] {
            let e = corrupt(&set, &random(rate, 0), &dir.path().join("o.parquet")).unwrap_err();
            assert_eq!(e.exit_code(), 2);
        }
    }
}
