//! DataComp's subset format: the kept samples' `uid`s as a NumPy `.npy`
//! array, which its `resharder.py --subset-file` reads to build the
//! filtered shards.
//!
//! The format (DataComp README, "Selecting samples"): a one-dimensional
//! structured array of dtype `numpy.dtype("u8,u8")`, each uid (128 bits
//! written as 32 hex digits) split into its high and low 64 bits, in
//! lexicographic order.

use std::path::Path;

use crate::error::{invalid, Result};

/// NPY format 1.0: the header, magic and length prefix included, is padded
/// to a multiple of this.
const ALIGN: usize = 64;

/// A DataComp uid as its (high, low) 64-bit halves.
fn parse_uid(uid: &str) -> Option<(u64, u64)> {
    if uid.len() != 32 || !uid.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let hi = u64::from_str_radix(&uid[..16], 16).ok()?;
    let lo = u64::from_str_radix(&uid[16..], 16).ok()?;
    Some((hi, lo))
}

/// The whole `.npy` file for `uids` (already parsed and sorted).
fn npy_bytes(uids: &[(u64, u64)]) -> Vec<u8> {
    let dict = format!(
        "{{'descr': [('f0', '<u8'), ('f1', '<u8')], 'fortran_order': False, 'shape': ({},), }}",
        uids.len()
    );
    // magic (6) + version (2) + header length (2) + dict + padding + '\n'.
    let unpadded = 10 + dict.len() + 1;
    let header_len = dict.len() + 1 + (ALIGN - unpadded % ALIGN) % ALIGN;
    let mut out = Vec::with_capacity(10 + header_len + uids.len() * 16);
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    // Under 64 KiB by construction: the dict is short.
    out.extend_from_slice(&(header_len as u16).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out.resize(10 + header_len - 1, b' ');
    out.push(b'\n');
    for (hi, lo) in uids {
        out.extend_from_slice(&hi.to_le_bytes());
        out.extend_from_slice(&lo.to_le_bytes());
    }
    out
}

/// Write `uids` (32-hex-digit DataComp uids, any case, any order) to
/// `path` as the sorted `u8,u8` array DataComp's resharder reads, written
/// atomically; returns how many were written. A key that is not such a uid
/// is [`crate::Error::InvalidInput`] naming it: the export only makes sense
/// for data keyed by DataComp's `uid` column.
pub fn write_uids_npy(path: &Path, uids: &[String]) -> Result<usize> {
    let mut parsed = Vec::with_capacity(uids.len());
    for u in uids {
        parsed.push(parse_uid(u).ok_or_else(|| {
            invalid(format!(
                "key \"{u}\" is not a DataComp uid (32 hexadecimal digits); --uids-out needs data keyed by DataComp's uid column (--key-col uid)"
            ))
        })?);
    }
    parsed.sort_unstable();
    super::write_atomic(path, &npy_bytes(&parsed))?;
    Ok(parsed.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uid_halves_are_the_hex_digits() {
        assert_eq!(
            parse_uid("139e4a9b22a614771f06c700a8ebe150"),
            Some((0x139e4a9b22a61477, 0x1f06c700a8ebe150))
        );
        assert_eq!(
            parse_uid("139E4A9B22A614771F06C700A8EBE150"),
            Some((0x139e4a9b22a61477, 0x1f06c700a8ebe150))
        );
        assert_eq!(parse_uid("139e4a9b22a61477"), None);
        assert_eq!(parse_uid("+39e4a9b22a614771f06c700a8ebe150"), None);
        assert_eq!(parse_uid("xyz"), None);
    }

    #[test]
    fn header_is_aligned_and_data_little_endian() {
        let b = npy_bytes(&[(1, 2)]);
        // 10 + 82 (dict) + 1 (newline) = 93 bytes, padded to 128.
        assert_eq!(b.len(), 128 + 16);
        assert_eq!(&b[..8], b"\x93NUMPY\x01\x00");
        assert_eq!(u16::from_le_bytes([b[8], b[9]]), 118);
        assert_eq!(b[127], b'\n');
        let header = std::str::from_utf8(&b[10..128]).unwrap();
        assert!(header.starts_with(
            "{'descr': [('f0', '<u8'), ('f1', '<u8')], 'fortran_order': False, 'shape': (1,), }"
        ));
        assert_eq!(&b[128..136], &[1, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&b[136..144], &[2, 0, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn non_uid_keys_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let e = write_uids_npy(&dir.path().join("u.npy"), &["img#0".into()]).unwrap_err();
        assert_eq!(e.exit_code(), 3);
        assert!(
            e.to_string().contains("\"img#0\" is not a DataComp uid"),
            "{e}"
        );
    }

    /// numpy reads the file as the resharder does and gets the uids sorted.
    #[test]
    fn numpy_loads_the_sorted_uids() {
        let ok = std::process::Command::new("python3")
            .args(["-c", "import numpy"])
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            println!("skipped: python3 with numpy is not available");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("uids.npy");
        let uids = [
            "6e356964a967af455c8016b75d691203",
            "139e4a9b22a614771f06c700a8ebe150",
            "139e4a9b22a614770000000000000001",
        ];
        let owned: Vec<String> = uids.iter().map(|s| s.to_string()).collect();
        assert_eq!(write_uids_npy(&path, &owned).unwrap(), 3);
        let script = "import sys, numpy as np\n\
                      a = np.load(sys.argv[1], allow_pickle=False)\n\
                      assert a.dtype == np.dtype('u8,u8'), a.dtype\n\
                      assert a.ndim == 1\n\
                      assert (np.sort(a) == a).all()\n\
                      print(' '.join('%016x%016x' % (int(x), int(y)) for x, y in a))";
        let out = std::process::Command::new("python3")
            .args(["-c", script])
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "139e4a9b22a614770000000000000001 139e4a9b22a614771f06c700a8ebe150 6e356964a967af455c8016b75d691203"
        );
    }
}
