//! Content identity of a log: every record carries the hash of the record
//! before it and its own, so two logs that hold the same bookmark with
//! different content are told apart instead of assumed equal.
//!
//! `chain(r) = BLAKE3(bytes of r before its chain field ‖ r's pages)`,
//! truncated to 128 bits. The bytes before the chain field include the
//! previous record's chain, so equal chains at one bookmark mean equal
//! histories up to it (to the strength of the hash). Where the fields sit
//! is [`crate::record`]'s business; this module only names the value.

use std::fmt;

/// The 128-bit chain hash at one position of a log.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChainHash([u8; ChainHash::BYTE_LEN]);

impl ChainHash {
    pub const BYTE_LEN: usize = 16;
    /// The chain before the first record of a database's history.
    pub const GENESIS: ChainHash = ChainHash([0; ChainHash::BYTE_LEN]);

    pub const fn from_bytes(bytes: [u8; ChainHash::BYTE_LEN]) -> ChainHash {
        ChainHash(bytes)
    }
    pub const fn to_bytes(self) -> [u8; ChainHash::BYTE_LEN] {
        self.0
    }

    /// The chain over `parts`, hashed in order as one input.
    pub fn over(parts: &[&[u8]]) -> ChainHash {
        let mut h = blake3::Hasher::new();
        for p in parts {
            h.update(p);
        }
        let mut out = [0u8; ChainHash::BYTE_LEN];
        out.copy_from_slice(&h.finalize().as_bytes()[..ChainHash::BYTE_LEN]);
        ChainHash(out)
    }

    /// Reads a chain hash at `at` in `b` (the caller checked the length).
    pub(crate) fn at(b: &[u8], at: usize) -> ChainHash {
        let mut out = [0u8; ChainHash::BYTE_LEN];
        out.copy_from_slice(&b[at..at + ChainHash::BYTE_LEN]);
        ChainHash(out)
    }
}

/// Short hex, enough to tell chains apart in logs.
impl fmt::Debug for ChainHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in &self.0[..6] {
            write!(f, "{b:02x}")?;
        }
        f.write_str("…")
    }
}

impl fmt::Display for ChainHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chain_depends_on_every_part_and_their_order() {
        let a = ChainHash::over(&[b"ab", b"c"]);
        assert_eq!(a, ChainHash::over(&[b"a", b"bc"]), "parts are one input");
        assert_ne!(a, ChainHash::over(&[b"abd"]));
        assert_ne!(a, ChainHash::GENESIS);
        assert_eq!(ChainHash::from_bytes(a.to_bytes()), a);
    }
}
