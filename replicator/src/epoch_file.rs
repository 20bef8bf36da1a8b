//! A follower's accepted epoch, `<dir>/epoch`: the one file that fences old
//! leaders across restarts. Written atomically and durably (see
//! [`crate::marker`]) before the follower acts in the new epoch.
//!
//! ```text
//!  0  magic   b"WREP"                    4
//!  4  epoch   u32 big-endian             4
//!  8  crc32   u32 big-endian, bytes 0..8 4
//! ```
//! Exactly 12 bytes; anything else is refused, never guessed at.

use crate::bookmark::Epoch;
use crate::marker::{self, MarkerError};
use std::path::Path;

const MAGIC: &[u8] = b"WREP";
const NAME: &str = "epoch";

/// Why the epoch file could not be read or written.
pub type EpochFileError = MarkerError;

/// The epoch stored in `dir` (Epoch(0) if there is none yet).
pub fn load(dir: &Path) -> Result<Epoch, EpochFileError> {
    Ok(
        marker::load(&dir.join(NAME), MAGIC, 4)?.map_or(Epoch(0), |p| {
            Epoch(u32::from_be_bytes([p[0], p[1], p[2], p[3]]))
        }),
    )
}

/// Stores `epoch` in `dir` durably.
pub fn store(dir: &Path, epoch: Epoch) -> Result<(), EpochFileError> {
    marker::store(&dir.join(NAME), MAGIC, &epoch.0.to_be_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_epoch_survives_a_round_trip_and_a_damaged_file_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(load(dir.path()).expect("empty"), Epoch(0));
        store(dir.path(), Epoch(9)).expect("store");
        assert_eq!(load(dir.path()).expect("load"), Epoch(9));
        let path = dir.path().join(NAME);
        let mut bytes = std::fs::read(&path).expect("read");
        assert_eq!(bytes.len(), 12, "the layout did not change");
        bytes[5] ^= 1;
        std::fs::write(&path, &bytes).expect("write");
        assert!(matches!(load(dir.path()), Err(MarkerError::Corrupt { .. })));
        std::fs::write(&path, b"short").expect("write");
        assert!(matches!(load(dir.path()), Err(MarkerError::Corrupt { .. })));
    }
}
