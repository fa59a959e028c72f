//! `ncclean inspect`: what ncclean sees in the data, before any work.

use clap::Args;

use crate::data::TextEmbeddings;
use crate::error::Result;
use crate::runtime::progress::Reporter;

use super::{DataArgs, ImageArgs};

/// Arguments of `ncclean inspect`.
#[derive(Debug, Args)]
pub struct InspectArgs {
    #[command(flatten)]
    pub data: DataArgs,
    #[command(flatten)]
    pub images: ImageArgs,
    /// Skip decoding images (faster; only reports missing values and bad embeddings).
    #[arg(long)]
    pub no_decode: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Run `ncclean inspect`.
pub fn run(a: InspectArgs, rep: &Reporter) -> Result<()> {
    // Shown when present; read (and checked) the way fit would read it.
    let mut opts = a.data.options_with(&a.images);
    if opts.text_embeddings == TextEmbeddings::Ignore {
        opts.text_embeddings = TextEmbeddings::IfPresent;
    }
    let input = a.data.open_options(&opts)?;
    let found = crate::engine::inspect::inspect(&input, !a.no_decode, rep)?;
    if a.json {
        return super::print_summary(&found);
    }
    print!("{}", found.text());
    Ok(())
}
