//! Locating a Hugging Face model directory offline, and fingerprinting it.
//!
//! A pretrained tower is loaded from a directory holding `config.json`,
//! `model.safetensors` and `tokenizer.json`. [`resolve_model_dir`] turns what
//! a user typed (a path or a hub id) into such a directory without touching
//! the network:
//!
//! * an existing directory is used as is;
//! * a hub id (`org/name`, optionally `org/name@revision`) is looked up in the
//!   Hugging Face cache (`models--{org}--{name}/refs/{revision}` → the commit
//!   hash → `snapshots/{hash}/`), the layout `huggingface_hub` and `hf-hub`
//!   write;
//! * `sentence-transformers/all-MiniLM-L6-v2` additionally falls back to the
//!   directory written by `scripts/fetch_minilm.sh` ([`default_minilm_dir`]).
//!
//! With the crate feature `hub` the cache root comes from
//! `hf_hub::resolve_cache_dir()` (which also honours `HUGGINGFACE_HUB_CACHE`
//! and `XDG_CACHE_HOME`). Nothing is downloaded even then: hf-hub 1.0 only
//! offers an async client, and driving it needs a tokio runtime (hf-hub's
//! `blocking` feature), which this crate does not depend on; `HF_HUB_OFFLINE`
//! therefore changes nothing. Files are put in
//! the cache by `huggingface-cli download`, Python's `huggingface_hub`, or any
//! other tool that writes the standard layout.

use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// The files every pretrained tower directory must hold.
pub const REQUIRED_FILES: [&str; 3] = ["config.json", "model.safetensors", "tokenizer.json"];

/// Hub id of the MiniLM text model that `scripts/fetch_minilm.sh` installs.
pub const MINILM_HUB_ID: &str = "sentence-transformers/all-MiniLM-L6-v2";

/// Where to look besides the spec itself; split out so that tests can point
/// the resolution at a directory they built instead of mutating the process
/// environment.
#[derive(Debug, Clone, Default)]
struct Locations {
    /// Root of the Hugging Face hub cache (the directory holding `models--*`).
    hub_cache: Option<PathBuf>,
    /// The directory `scripts/fetch_minilm.sh` writes, when it has the files.
    minilm_dir: Option<PathBuf>,
}

/// Resolve `spec` to a local directory holding config.json / model.safetensors / tokenizer.json:
/// - an existing directory path → itself (a leading `~/` is expanded);
/// - a hub id like "sentence-transformers/all-MiniLM-L6-v2" (optionally
///   suffixed `@revision`, a branch/tag name or a commit hash; default `main`)
///   → the Hugging Face cache snapshot: $HF_HUB_CACHE, else $HF_HOME/hub, else
///   ~/.cache/huggingface/hub; layout models--{org}--{name}/refs/main (a commit
///   hash) → snapshots/{hash}/, falling back to the only (or most recently
///   modified) snapshot when the ref is absent;
/// - for MiniLM, finally the directory of `scripts/fetch_minilm.sh`.
///
/// Never downloads (see the module documentation for the `hub` feature).
/// Errors say which locations were tried and how to provide the model.
pub fn resolve_model_dir(spec: &str) -> Result<PathBuf, String> {
    let locations = Locations {
        hub_cache: hub_cache_root(),
        minilm_dir: default_minilm_dir(),
    };
    resolve_in(spec, &locations)
}

/// The MiniLM directory produced by scripts/fetch_minilm.sh: $NCCLEAN_MINILM_DIR
/// (when set and non-empty; the loader then reports any missing file), else
/// ~/.cache/ncclean/all-MiniLM-L6-v2 if it has the files, else None.
pub fn default_minilm_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("NCCLEAN_MINILM_DIR") {
        if !dir.is_empty() {
            return Some(PathBuf::from(dir));
        }
    }
    let dir = home_dir()?
        .join(".cache")
        .join("ncclean")
        .join("all-MiniLM-L6-v2");
    has_model_files(&dir).then_some(dir)
}

/// The Hugging Face hub cache root that [`resolve_model_dir`] searches
/// ($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub), for
/// listing what is installed.
pub fn hub_cache_dir() -> Option<PathBuf> {
    hub_cache_root()
}

/// The user's home directory, if the environment names one.
pub fn home() -> Option<PathBuf> {
    home_dir()
}

/// Whether `dir` holds every file in [`REQUIRED_FILES`].
pub fn has_model_files(dir: &Path) -> bool {
    REQUIRED_FILES.iter().all(|f| dir.join(f).is_file())
}

fn home_dir() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .or_else(|| std::env::var_os("USERPROFILE"))
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
}

#[cfg(not(feature = "hub"))]
fn env_path(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// The hub cache root from the environment.
#[cfg(feature = "hub")]
fn hub_cache_root() -> Option<PathBuf> {
    Some(hf_hub::resolve_cache_dir())
}

/// The hub cache root from the environment: $HF_HUB_CACHE, else $HF_HOME/hub,
/// else ~/.cache/huggingface/hub.
#[cfg(not(feature = "hub"))]
fn hub_cache_root() -> Option<PathBuf> {
    if let Some(cache) = env_path("HF_HUB_CACHE") {
        return Some(cache);
    }
    if let Some(home) = env_path("HF_HOME") {
        return Some(home.join("hub"));
    }
    home_dir().map(|h| h.join(".cache").join("huggingface").join("hub"))
}

/// A parsed hub id: `org/name@revision` (org optional, as for legacy
/// ids such as `bert-base-uncased`).
#[derive(Debug, PartialEq, Eq)]
struct HubId<'a> {
    org: Option<&'a str>,
    name: &'a str,
    revision: &'a str,
}

impl HubId<'_> {
    /// The cache folder name: `models--{org}--{name}`.
    fn cache_folder(&self) -> String {
        match self.org {
            Some(org) => format!("models--{org}--{}", self.name),
            None => format!("models--{}", self.name),
        }
    }

    fn is_minilm(&self) -> bool {
        self.name.eq_ignore_ascii_case("all-MiniLM-L6-v2")
            && self
                .org
                .is_none_or(|o| o.eq_ignore_ascii_case("sentence-transformers"))
    }
}

fn valid_hub_part(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with('.')
        && !s.starts_with('-')
        && !s.contains("..")
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// `spec` as a hub id, or None when it cannot be one (it then can only be a
/// path).
fn parse_hub_id(spec: &str) -> Option<HubId<'_>> {
    let (id, revision) = match spec.split_once('@') {
        Some((id, rev)) => (id, rev),
        None => (spec, "main"),
    };
    if revision.is_empty() || revision.contains(['/', '\\']) || revision.contains("..") {
        return None;
    }
    let mut parts = id.split('/');
    let (org, name) = match (parts.next(), parts.next(), parts.next()) {
        (Some(name), None, None) => (None, name),
        (Some(org), Some(name), None) => (Some(org), name),
        _ => return None,
    };
    if !valid_hub_part(name) || !org.is_none_or(valid_hub_part) {
        return None;
    }
    Some(HubId {
        org,
        name,
        revision,
    })
}

/// The snapshot directory for `id` under the cache root, or a description of
/// what was missing.
fn snapshot_in_cache(cache_root: &Path, id: &HubId<'_>) -> Result<PathBuf, String> {
    let repo = cache_root.join(id.cache_folder());
    if !repo.is_dir() {
        return Err(format!("{} (no such directory)", repo.display()));
    }
    let snapshots = repo.join("snapshots");
    let ref_file = repo.join("refs").join(id.revision);
    if let Ok(hash) = fs::read_to_string(&ref_file) {
        let hash = hash.trim();
        let dir = snapshots.join(hash);
        if !hash.is_empty() && dir.is_dir() {
            return Ok(dir);
        }
        return Err(format!(
            "{} names commit {hash:?}, but {} does not exist",
            ref_file.display(),
            dir.display()
        ));
    }
    // A revision given as a commit hash is a snapshot folder of its own.
    if id.revision != "main" {
        let dir = snapshots.join(id.revision);
        if dir.is_dir() {
            return Ok(dir);
        }
        return Err(format!(
            "{} (neither {} nor {} exists)",
            repo.display(),
            ref_file.display(),
            dir.display()
        ));
    }
    // refs/main absent: the only snapshot, or the most recently modified one.
    let mut candidates: Vec<(std::time::SystemTime, PathBuf)> = fs::read_dir(&snapshots)
        .map_err(|e| format!("{} ({e})", snapshots.display()))?
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.path())
        .filter(|p| p.is_dir())
        .map(|p| {
            let modified = fs::metadata(&p)
                .and_then(|m| m.modified())
                .unwrap_or(std::time::UNIX_EPOCH);
            (modified, p)
        })
        .collect();
    // Newest first; ties broken by name so the choice is deterministic.
    candidates.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| b.1.cmp(&a.1)));
    candidates
        .into_iter()
        .next()
        .map(|(_, p)| p)
        .ok_or_else(|| format!("{} (no snapshots)", snapshots.display()))
}

/// [`resolve_model_dir`] against explicit locations.
fn resolve_in(spec: &str, locations: &Locations) -> Result<PathBuf, String> {
    let spec = spec.trim();
    if spec.is_empty() {
        return Err("empty model spec: give a directory path or a Hugging Face hub id".into());
    }
    let path = match (spec.strip_prefix("~/"), home_dir()) {
        (Some(rest), Some(home)) => home.join(rest),
        _ => PathBuf::from(spec),
    };
    if path.is_dir() {
        return Ok(path);
    }
    let mut tried = vec![format!("{spec} (not an existing directory)")];
    let id = parse_hub_id(spec);
    if let Some(id) = &id {
        match &locations.hub_cache {
            Some(root) => match snapshot_in_cache(root, id) {
                Ok(dir) => return Ok(dir),
                Err(why) => tried.push(format!("Hugging Face cache: {why}")),
            },
            None => tried.push("Hugging Face cache: no cache root (HOME unset)".into()),
        }
        if id.is_minilm() {
            match &locations.minilm_dir {
                Some(dir) if dir.is_dir() => return Ok(dir.clone()),
                Some(dir) => tried.push(format!("{} (no such directory)", dir.display())),
                None => tried.push(
                    "$NCCLEAN_MINILM_DIR / ~/.cache/ncclean/all-MiniLM-L6-v2 (not present)".into(),
                ),
            }
        }
    }
    let mut msg = format!("cannot find model {spec:?}; tried:\n");
    for t in &tried {
        msg.push_str("  - ");
        msg.push_str(t);
        msg.push('\n');
    }
    msg.push_str(
        "Provide the model as a directory holding config.json, model.safetensors and \
         tokenizer.json, or place it in the Hugging Face cache ($HF_HUB_CACHE, $HF_HOME/hub \
         or ~/.cache/huggingface/hub, e.g. with `huggingface-cli download <id>`); \
         ncclean never downloads at run time.",
    );
    if id.as_ref().is_none_or(|id| id.is_minilm()) || spec.contains("MiniLM") {
        msg.push_str(
            " For all-MiniLM-L6-v2, run scripts/fetch_minilm.sh (it installs into \
             $NCCLEAN_MINILM_DIR or ~/.cache/ncclean/all-MiniLM-L6-v2).",
        );
    }
    Err(msg)
}

// ---------------------------------------------------------------------------
// Loading helpers shared by the pretrained towers.

/// Fail, naming the file, when any of `files` is missing from `dir`.
pub(crate) fn require_files(dir: &Path, files: &[&str], tower: &str) -> candle_core::Result<()> {
    if !dir.is_dir() {
        candle_core::bail!(
            "{tower}: model directory {} does not exist (give a directory holding {}, \
             or resolve a hub id with hf_dir::resolve_model_dir)",
            dir.display(),
            files.join(", ")
        );
    }
    for file in files {
        if !dir.join(file).is_file() {
            let mut hint = String::new();
            if *file == "model.safetensors" && dir.join("pytorch_model.bin").is_file() {
                hint.push_str(
                    " (only pytorch_model.bin is there: convert it to safetensors, \
                     or fetch the repository's model.safetensors)",
                );
            }
            candle_core::bail!(
                "{tower}: {} is missing from {} (a model directory needs {}){hint}",
                file,
                dir.display(),
                files.join(", ")
            );
        }
    }
    Ok(())
}

/// Parse `dir/file` as JSON, naming the file in errors.
pub(crate) fn read_json(dir: &Path, file: &str) -> candle_core::Result<serde_json::Value> {
    let path = dir.join(file);
    let text = fs::read_to_string(&path)
        .map_err(|e| candle_core::Error::Msg(format!("reading {}: {e}", path.display())))?;
    serde_json::from_str(&text)
        .map_err(|e| candle_core::Error::Msg(format!("parsing {}: {e}", path.display())))
}

/// Load `dir/tokenizer.json` with padding disabled (the caller pads to the
/// batch maximum) and truncation to `max_len` tokens, special tokens
/// included. Returns the tokenizer and the pad id its file configured, if any.
pub(crate) fn load_tokenizer(
    dir: &Path,
    max_len: usize,
) -> candle_core::Result<(tokenizers::Tokenizer, Option<u32>)> {
    let path = dir.join("tokenizer.json");
    let mut tokenizer = tokenizers::Tokenizer::from_file(&path)
        .map_err(|e| candle_core::Error::Msg(format!("loading {}: {e}", path.display())))?;
    let pad_id = tokenizer.get_padding().map(|p| p.pad_id);
    tokenizer.with_padding(None);
    let truncation = tokenizers::TruncationParams {
        max_length: max_len,
        ..Default::default()
    };
    tokenizer
        .with_truncation(Some(truncation))
        .map_err(|e| candle_core::Error::Msg(format!("{}: truncation: {e}", path.display())))?;
    Ok((tokenizer, pad_id))
}

/// Bytes of a text the tokenizer reads: the towers keep at most 128
/// (MiniLM) or 77 (CLIP) tokens, so this prefix holds them unless the text
/// is hostile (runs of kilobytes of spaces), and a scraped caption of
/// megabytes costs no more than it. Tokenising it whole held about 40 bytes
/// per byte of text for tokens that truncation then threw away.
pub const MAX_TEXT_BYTES: usize = 64 * 1024;

/// The first [`MAX_TEXT_BYTES`] of `text`, cut at a character boundary.
pub(crate) fn text_prefix(text: &str) -> &str {
    if text.len() <= MAX_TEXT_BYTES {
        return text;
    }
    let mut end = MAX_TEXT_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Token ids of each text (special tokens added, truncated, unpadded),
/// read from its first [`MAX_TEXT_BYTES`].
pub(crate) fn encode_texts(
    tokenizer: &tokenizers::Tokenizer,
    texts: &[&str],
) -> candle_core::Result<Vec<Vec<u32>>> {
    if texts.is_empty() {
        candle_core::bail!("cannot tokenise an empty batch of texts");
    }
    texts
        .iter()
        .map(|text| {
            tokenizer
                .encode(text_prefix(text), true)
                .map(|enc| enc.get_ids().to_vec())
                .map_err(|e| {
                    let shown: String = text.chars().take(80).collect();
                    candle_core::Error::Msg(format!(
                        "tokenising {shown:?} ({} bytes): {e}",
                        text.len()
                    ))
                })
        })
        .collect()
}

/// Right-pad `ids` with `pad_id` to the longest row: (ids `[B, L]` u32,
/// attention mask `[B, L]` f32 with 1 on real tokens).
pub(crate) fn pad_batch(
    ids: &[Vec<u32>],
    pad_id: u32,
    device: &candle_core::Device,
) -> candle_core::Result<(candle_core::Tensor, candle_core::Tensor)> {
    let b = ids.len();
    let l = ids.iter().map(Vec::len).max().unwrap_or(0).max(1);
    let mut flat = Vec::with_capacity(b * l);
    let mut mask = Vec::with_capacity(b * l);
    for row in ids {
        flat.extend_from_slice(row);
        flat.extend(std::iter::repeat_n(pad_id, l - row.len()));
        mask.extend(std::iter::repeat_n(1f32, row.len()));
        mask.extend(std::iter::repeat_n(0f32, l - row.len()));
    }
    Ok((
        candle_core::Tensor::from_vec(flat, (b, l), device)?,
        candle_core::Tensor::from_vec(mask, (b, l), device)?,
    ))
}

/// A VarBuilder over `dir/model.safetensors` (read into memory; tensors are
/// converted to `dtype` when fetched, so f32/f16/bf16 checkpoints all load
/// in any of the three).
pub(crate) fn safetensors_var_builder(
    dir: &Path,
    device: &candle_core::Device,
    dtype: candle_core::DType,
) -> candle_core::Result<candle_nn::VarBuilder<'static>> {
    let path = dir.join("model.safetensors");
    let data = fs::read(&path)
        .map_err(|e| candle_core::Error::Msg(format!("reading {}: {e}", path.display())))?;
    candle_nn::VarBuilder::from_buffered_safetensors(data, dtype, device)
        .map_err(|e| candle_core::Error::Msg(format!("parsing {}: {e}", path.display())))
}

// ---------------------------------------------------------------------------
// Fingerprints for feature-cache tags.

/// Bytes read from each end of a large file when fingerprinting it.
const SAMPLE_BYTES: u64 = 1 << 20;

/// A short, stable content fingerprint of files in a model directory: the
/// first 16 hex digits of a SHA-256 over each file's name and size and its
/// whole content (files up to 2 MiB) or its first and last MiB (larger ones;
/// for safetensors the first MiB holds the header with every tensor's name,
/// dtype, shape and offset). Independent of where the directory lives.
pub fn fingerprint_files(dir: &Path, files: &[&str]) -> std::io::Result<String> {
    let mut data = Vec::new();
    for name in files {
        let path = dir.join(name);
        let mut file = fs::File::open(&path)?;
        let size = file.metadata()?.len();
        data.extend_from_slice(name.as_bytes());
        data.push(0);
        data.extend_from_slice(&size.to_le_bytes());
        if size <= 2 * SAMPLE_BYTES {
            file.read_to_end(&mut data)?;
        } else {
            let mut buf = vec![0u8; SAMPLE_BYTES as usize];
            file.read_exact(&mut buf)?;
            data.extend_from_slice(&buf);
            file.seek(SeekFrom::End(-(SAMPLE_BYTES as i64)))?;
            file.read_exact(&mut buf)?;
            data.extend_from_slice(&buf);
        }
    }
    let digest = sha256(&data);
    Ok(digest[..8].iter().map(|b| format!("{b:02x}")).collect())
}

/// SHA-256 of `data`; used only for cache fingerprints.
fn sha256(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}

/// Test helpers shared with the tower modules' tests.
#[cfg(test)]
pub(crate) mod test_util {
    use std::fs;
    use std::path::PathBuf;

    /// A fresh, empty directory under the system temp dir, removed on drop.
    pub(crate) struct TempDir(pub PathBuf);

    impl TempDir {
        pub(crate) fn new(label: &str) -> Self {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0);
            let dir = std::env::temp_dir()
                .join(format!("ncclean-{label}-{}-{nanos}", std::process::id()));
            fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_util::TempDir;
    use super::*;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn write_model_files(dir: &Path) {
        fs::create_dir_all(dir).unwrap();
        for f in REQUIRED_FILES {
            fs::write(dir.join(f), b"{}").unwrap();
        }
    }

    #[test]
    fn sha256_known_vectors() {
        assert_eq!(
            hex(&sha256(b"")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            hex(&sha256(b"abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        // Two blocks (56 bytes forces the length into a second block).
        assert_eq!(
            hex(&sha256(
                b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"
            )),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
        );
    }

    #[test]
    fn long_texts_are_cut_at_a_character_boundary() {
        assert_eq!(text_prefix("a dog"), "a dog");
        let exact = "a".repeat(MAX_TEXT_BYTES);
        assert_eq!(text_prefix(&exact).len(), MAX_TEXT_BYTES);
        // '€' is 3 bytes: 65,536 falls inside one, so the cut is at 65,535.
        let euros = "€".repeat(MAX_TEXT_BYTES);
        let cut = text_prefix(&euros);
        assert_eq!(cut.len(), MAX_TEXT_BYTES - 1);
        assert!(cut.chars().all(|c| c == '€'));
    }

    #[test]
    fn a_long_caption_tokenises_as_its_prefix_does() {
        let Some(dir) = default_minilm_dir() else {
            eprintln!("skipped: MiniLM not found (run bash scripts/fetch_minilm.sh)");
            return;
        };
        let (tokenizer, _) = load_tokenizer(&dir, 128).unwrap();
        // 1.1 MB of words: the 128 tokens kept are the same as when the
        // whole text is tokenised and truncated.
        let words: Vec<String> = (0..100_000).map(|i| format!("dog{i}")).collect();
        let long = format!("a brown dog runs on the grass {}", words.join(" "));
        assert!(long.len() > 10 * MAX_TEXT_BYTES);
        let whole = tokenizer.encode(long.as_str(), true).unwrap();
        let ids = encode_texts(&tokenizer, &[long.as_str()]).unwrap();
        assert_eq!(ids[0], whole.get_ids());
        assert_eq!(ids[0].len(), 128);
    }

    #[test]
    fn parses_hub_ids() {
        assert_eq!(
            parse_hub_id("sentence-transformers/all-MiniLM-L6-v2"),
            Some(HubId {
                org: Some("sentence-transformers"),
                name: "all-MiniLM-L6-v2",
                revision: "main"
            })
        );
        assert_eq!(
            parse_hub_id("bert-base-uncased@v1.0"),
            Some(HubId {
                org: None,
                name: "bert-base-uncased",
                revision: "v1.0"
            })
        );
        assert_eq!(parse_hub_id("/abs/path"), None);
        assert_eq!(parse_hub_id("./rel"), None);
        assert_eq!(parse_hub_id("a/b/c"), None);
        assert_eq!(parse_hub_id("../x"), None);
        assert_eq!(parse_hub_id("org/name@"), None);
    }

    #[test]
    fn existing_directory_is_itself() {
        let tmp = TempDir::new("hfdir-path");
        let got = resolve_in(tmp.0.to_str().unwrap(), &Locations::default()).unwrap();
        assert_eq!(got, tmp.0);
    }

    #[test]
    fn resolves_cache_snapshot_through_refs_main() {
        let tmp = TempDir::new("hfdir-cache");
        let repo = tmp.0.join("models--openai--clip-vit-base-patch32");
        let hash = "3d74acf9a28c67741b2f4f2ea7635f0aaf6f0268";
        write_model_files(&repo.join("snapshots").join(hash));
        // A second, older snapshot that refs/main does not point at.
        write_model_files(&repo.join("snapshots").join("0000000000"));
        fs::create_dir_all(repo.join("refs")).unwrap();
        fs::write(repo.join("refs").join("main"), format!("{hash}\n")).unwrap();
        let loc = Locations {
            hub_cache: Some(tmp.0.clone()),
            minilm_dir: None,
        };
        let got = resolve_in("openai/clip-vit-base-patch32", &loc).unwrap();
        assert_eq!(got, repo.join("snapshots").join(hash));
        assert!(has_model_files(&got));
        // Explicit commit revision.
        let got = resolve_in("openai/clip-vit-base-patch32@0000000000", &loc).unwrap();
        assert_eq!(got, repo.join("snapshots").join("0000000000"));
        // A tag ref.
        fs::write(repo.join("refs").join("v1"), "0000000000").unwrap();
        let got = resolve_in("openai/clip-vit-base-patch32@v1", &loc).unwrap();
        assert_eq!(got, repo.join("snapshots").join("0000000000"));
    }

    #[test]
    fn falls_back_to_only_snapshot_without_ref() {
        let tmp = TempDir::new("hfdir-noref");
        let snap = tmp
            .0
            .join("models--sentence-transformers--all-MiniLM-L6-v2")
            .join("snapshots")
            .join("abc123");
        write_model_files(&snap);
        let loc = Locations {
            hub_cache: Some(tmp.0.clone()),
            minilm_dir: None,
        };
        assert_eq!(
            resolve_in("sentence-transformers/all-MiniLM-L6-v2", &loc).unwrap(),
            snap
        );
    }

    #[test]
    fn dangling_ref_is_reported() {
        let tmp = TempDir::new("hfdir-dangling");
        let repo = tmp.0.join("models--org--m");
        fs::create_dir_all(repo.join("refs")).unwrap();
        fs::create_dir_all(repo.join("snapshots")).unwrap();
        fs::write(repo.join("refs").join("main"), "deadbeef").unwrap();
        let loc = Locations {
            hub_cache: Some(tmp.0.clone()),
            minilm_dir: None,
        };
        let err = resolve_in("org/m", &loc).unwrap_err();
        assert!(err.contains("deadbeef"), "{err}");
    }

    #[test]
    fn minilm_falls_back_to_fetch_script_dir() {
        let tmp = TempDir::new("hfdir-minilm");
        let fetched = tmp.0.join("fetched");
        write_model_files(&fetched);
        let loc = Locations {
            hub_cache: Some(tmp.0.join("empty-cache")),
            minilm_dir: Some(fetched.clone()),
        };
        assert_eq!(resolve_in(MINILM_HUB_ID, &loc).unwrap(), fetched);
        // Other ids do not fall back to it.
        assert!(resolve_in("org/other", &loc).is_err());
    }

    #[test]
    fn missing_model_error_lists_locations_and_remedies() {
        let tmp = TempDir::new("hfdir-missing");
        let loc = Locations {
            hub_cache: Some(tmp.0.clone()),
            minilm_dir: None,
        };
        let err = resolve_in(MINILM_HUB_ID, &loc).unwrap_err();
        assert!(
            err.contains("models--sentence-transformers--all-MiniLM-L6-v2"),
            "{err}"
        );
        assert!(err.contains("fetch_minilm.sh"), "{err}");
        assert!(err.contains("huggingface-cli"), "{err}");
        let err = resolve_in("/no/such/dir", &loc).unwrap_err();
        assert!(
            err.contains("/no/such/dir (not an existing directory)"),
            "{err}"
        );
        assert!(resolve_in("  ", &loc).is_err());
    }

    #[test]
    fn fingerprint_depends_on_content_not_location() {
        let a = TempDir::new("hfdir-fp-a");
        let b = TempDir::new("hfdir-fp-b");
        let big: Vec<u8> = (0..(3 * SAMPLE_BYTES as usize))
            .map(|i| (i % 251) as u8)
            .collect();
        for dir in [&a.0, &b.0] {
            fs::write(dir.join("config.json"), b"{\"x\":1}").unwrap();
            fs::write(dir.join("model.safetensors"), &big).unwrap();
        }
        let files = ["config.json", "model.safetensors"];
        let fa = fingerprint_files(&a.0, &files).unwrap();
        assert_eq!(fa.len(), 16);
        assert_eq!(fa, fingerprint_files(&b.0, &files).unwrap());
        fs::write(b.0.join("config.json"), b"{\"x\":2}").unwrap();
        assert_ne!(fa, fingerprint_files(&b.0, &files).unwrap());
        assert!(fingerprint_files(&a.0, &["nope.json"]).is_err());
    }
}
