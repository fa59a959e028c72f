//! A man page (roff) rendered from a clap command, so it documents exactly
//! this build's flags (`ncclean man`).

use crate::error::{Error, Result};

/// The page of `cmd`, every non-ASCII character escaped for troff.
pub fn render(cmd: clap::Command) -> Result<String> {
    let mut page = Vec::new();
    clap_mangen::Man::new(cmd)
        .source(format!("ncclean {}", env!("CARGO_PKG_VERSION")))
        .manual("ncclean manual")
        .render(&mut page)
        .map_err(|e| Error::Other(anyhow::anyhow!("rendering the man page: {e}")))?;
    let page = String::from_utf8_lossy(&page);
    Ok(ascii_roff(&page))
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
