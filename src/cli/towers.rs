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

/// Run `ncclean towers`.
pub fn run(a: TowersArgs, _rep: &Reporter) -> Result<()> {
    let d = installed::discover();
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&d).map_err(anyhow::Error::from)?
        );
    } else {
        print!("{}", d.text());
    }
    Ok(())
}
