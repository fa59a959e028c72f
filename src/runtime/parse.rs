//! Parsers of values given on the command line (clap's `value_parser`s):
//! byte sizes, pixel counts and fractions. Their errors are what clap
//! prints after the flag's name.

/// A positive byte count: digits with an optional K, M or G suffix
/// (powers of 1024; `KiB`/`KB` spellings accepted).
pub fn byte_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let digits = t.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit = t[digits.len()..].to_ascii_lowercase();
    let shift = match unit.as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        _ => return Err(format!("expected a number of bytes such as 64M, got {s:?}")),
    };
    match digits
        .trim()
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1 << shift))
    {
        Some(0) => Err("must be at least 1 byte".into()),
        Some(n) => Ok(n),
        None => Err(format!("expected a number of bytes such as 64M, got {s:?}")),
    }
}

/// A positive pixel count.
pub fn pixel_count(s: &str) -> std::result::Result<u64, String> {
    match s.trim().parse::<u64>() {
        Ok(0) => Err("must be at least 1 pixel".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!(
            "expected a number of pixels such as 50000000, got {s:?}"
        )),
    }
}

/// A number in [0, 1] (`--max-skipped`).
pub fn fraction(s: &str) -> std::result::Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!("expected a fraction between 0 and 1, got {s:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes_take_binary_suffixes() {
        assert_eq!(byte_size("64M"), Ok(64 << 20));
        assert_eq!(byte_size(" 2kib "), Ok(2048));
        assert_eq!(byte_size("3G"), Ok(3 << 30));
        assert_eq!(byte_size("17"), Ok(17));
        assert_eq!(byte_size("0"), Err("must be at least 1 byte".into()));
        assert!(byte_size("5T").unwrap_err().contains("such as 64M"));
        assert!(byte_size("99999999999G").is_err());
    }

    #[test]
    fn pixel_counts_and_fractions_are_checked() {
        assert_eq!(pixel_count("50000000"), Ok(50_000_000));
        assert_eq!(pixel_count("0"), Err("must be at least 1 pixel".into()));
        assert!(pixel_count("lots").is_err());
        assert_eq!(fraction("0.25"), Ok(0.25));
        assert!(fraction("1.5").is_err());
        assert!(fraction("NaN").is_err());
    }
}
