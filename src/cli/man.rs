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
    let mut page = Vec::new();
    clap_mangen::Man::new(cmd)
        .source(format!("ncclean {}", env!("CARGO_PKG_VERSION")))
        .manual("ncclean manual")
        .render(&mut page)
        .map_err(|e| Error::Other(anyhow::anyhow!("rendering the man page: {e}")))?;
    let page = String::from_utf8_lossy(&page);
    super::write_stdout(ascii_roff(&page).as_bytes())
}

/// `page` with every non-ASCII character (the help's dashes, arrows, `×`)
/// written as a roff escape, `\[uXXXX]`: troff reads its input as Latin-1
/// unless run through preconv, so raw UTF-8 renders as mojibake with
/// warnings under `groff -man`; groff and mandoc both read the escapes.
fn ascii_roff(page: &str) -> String {
    let mut out = String::with_capacity(page.len());
    for c in page.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            out.push_str(&format!("\\[u{:04X}]", u32::from(c)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::ascii_roff;

    #[test]
    fn non_ascii_becomes_roff_escapes() {
        assert_eq!(ascii_roff("a–b × 2"), "a\\[u2013]b \\[u00D7] 2");
        assert_eq!(ascii_roff("\\fBfit\\fR"), "\\fBfit\\fR");
    }
}
