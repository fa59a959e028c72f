//! The project's one non-cryptographic hash: 64-bit FNV-1a, fed bytes or
//! whole 32-bit words, and SplitMix64's finaliser for where the low bits
//! must mix too. Fixed constants, no per-process seed (unlike std's
//! `DefaultHasher`), so a value written into a checkpoint or derived into
//! a random stream is the same on every run, machine and version.

/// FNV-1a's 64-bit offset basis: the hash of nothing.
pub const OFFSET: u64 = 0xCBF2_9CE4_8422_2325;
/// FNV-1a's 64-bit prime.
pub const PRIME: u64 = 0x0000_0100_0000_01B3;

/// A 64-bit FNV-1a state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fnv(pub u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(OFFSET)
    }
}

impl Fnv {
    /// Feed bytes, one step each (FNV-1a proper).
    pub fn bytes(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.word(u32::from(b));
        }
    }

    /// Feed one 32-bit word in one step: a quarter of the multiplies of
    /// its four bytes, for hashing the bits of float vectors.
    pub fn word(&mut self, w: u32) {
        self.0 = (self.0 ^ u64::from(w)).wrapping_mul(PRIME);
    }

    /// The hash so far.
    pub fn finish(self) -> u64 {
        self.0
    }
}

/// SplitMix64's finaliser: every input bit moves about half the output
/// bits (FNV's low bits mix poorly, and callers that cut a hash to its high
/// bits or seed a generator from it need them mixed).
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_matches_the_published_test_vectors() {
        // From the FNV reference (draft-eastlake-fnv): "", "a", "foobar".
        let of = |s: &str| {
            let mut h = Fnv::default();
            h.bytes(s.as_bytes());
            h.finish()
        };
        assert_eq!(of(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(of("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(of("foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn a_word_is_one_step_and_mix64_is_splitmix() {
        let mut a = Fnv::default();
        a.word(0x61);
        let mut b = Fnv::default();
        b.bytes(b"a");
        assert_eq!(a, b);
        // SplitMix64's first output for seed 0 is mix64 of its increment.
        assert_eq!(mix64(0x9E37_79B9_7F4A_7C15), 0xE220_A839_7B1D_CDAF);
        assert_eq!(mix64(0), 0);
    }
}
