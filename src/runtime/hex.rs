//! Lower-case hex rendering of digests.
//!
//! A leaf module (no crate imports) so that `checkpoint`, `encoders`,
//! `features`, `engine` and `data` can all name digests without importing
//! one another.

use sha2::{Digest, Sha256};

/// Lower-case hex of `bytes`, two digits per byte.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Size and sha256 of one file, as a checkpoint's manifest and a shard's
/// completion marker record it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FileDigest {
    /// Bytes.
    pub bytes: u64,
    /// SHA-256, lower-case hex.
    pub sha256: String,
}

impl FileDigest {
    /// The digest of the file `path`, read a MiB at a time.
    pub fn of(path: &std::path::Path) -> std::io::Result<FileDigest> {
        let file = std::fs::File::open(path)?;
        let bytes = file.metadata()?.len();
        let sha256 = sha256_hex_of(file)?;
        Ok(FileDigest { bytes, sha256 })
    }
}

/// Lower-case hex of the SHA-256 of `bytes` (64 digits).
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// Lower-case hex of the SHA-256 of everything `r` yields, read a MiB at a
/// time (model weights and shards are hashed without holding them).
pub fn sha256_hex_of(mut r: impl std::io::Read) -> std::io::Result<String> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match r.read(&mut buf) {
            Ok(0) => return Ok(hex(&h.finalize())),
            Ok(n) => h.update(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streamed_sha256_equals_the_one_of_the_whole() {
        let bytes: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        assert_eq!(sha256_hex_of(&bytes[..]).unwrap(), sha256_hex(&bytes));
        assert_eq!(sha256_hex_of(&b"abc"[..]).unwrap(), sha256_hex(b"abc"));
    }

    #[test]
    fn hex_pads_every_byte_to_two_digits() {
        assert_eq!(hex(&[]), "");
        assert_eq!(hex(&[0x00, 0x0f, 0xa0, 0xff]), "000fa0ff");
    }

    #[test]
    fn sha256_hex_matches_known_vector() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
