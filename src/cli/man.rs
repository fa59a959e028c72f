//! `ncclean man [SUBCOMMAND]`: a man page (roff) generated from the clap
//! definitions, so it documents exactly this build's flags.

use clap::{Args, CommandFactory};

use crate::error::{Error, Result};
use crate::runtime::progress::Reporter;

/// Arguments of `ncclean man`.
#[derive(Debug, Args)]
#[command(after_help = "View with `ncclean man | man -l -`, or install:
  ncclean man > ~/.local/share/man/man1/ncclean.1
  ncclean man fit > ~/.local/share/man/man1/ncclean-fit.1")]
pub struct ManArgs {
    /// A subcommand's page (ncclean-SUBCOMMAND(1)) instead of ncclean(1).
    #[arg(value_name = "SUBCOMMAND")]
    pub subcommand: Option<String>,
}

/// Print the page to stdout.
pub fn run(a: ManArgs, _rep: &Reporter) -> Result<()> {
    let top = super::Cli::command();
    let cmd = match &a.subcommand {
        None => top,
        Some(name) => {
            let names: Vec<String> = top
                .get_subcommands()
                .filter(|s| !s.is_hide_set())
                .map(|s| s.get_name().to_string())
                .collect();
            let sub = top
                .get_subcommands()
                .find(|s| s.get_name() == name && !s.is_hide_set())
                .cloned()
                .ok_or_else(|| {
                    Error::Usage(format!(
                        "no subcommand {name:?}; `ncclean man` has pages for: {}",
                        names.join(", ")
                    ))
                })?;
            // The page's title (display name) and its usage line (bin name)
            // name the full command.
            let full = format!("ncclean-{name}");
            sub.bin_name(format!("ncclean {name}")).display_name(full)
        }
    };
    let page = crate::runtime::man_page::render(cmd)?;
    crate::runtime::progress::write_stdout(page.as_bytes())
}
