//! A follower's promise, `<dir>/epoch`: the highest epoch it has accepted
//! and the leader it promised that epoch to. It fences old leaders across
//! restarts, and no second leader can win the same epoch from it. Written
//! atomically and durably (see [`crate::marker`]) before the follower
//! answers in the new epoch.
//!
//! ```text
//!  0  magic   b"WRPR"                    4
//!  4  epoch   u32 big-endian             4
//!  8  leader  u64 big-endian (NodeId)    8
//! 16  crc32   u32 big-endian, bytes 0..16 4
//! ```
//! Exactly 20 bytes; anything else is refused, never guessed at. A file
//! from before promises named a leader (`b"WREP"`, epoch only, 12 bytes)
//! still loads, promised to no leader: every new leader claims a higher
//! epoch anyway.

use crate::bookmark::Epoch;
use crate::ids::NodeId;
use crate::marker::{self, MarkerError};
use std::path::Path;

const MAGIC: &[u8] = b"WRPR";
const LEGACY_MAGIC: &[u8] = b"WREP";
const NAME: &str = "epoch";

/// Why the promise file could not be read or written.
pub type EpochFileError = MarkerError;

/// An epoch and the leader it was promised to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Promise {
    pub epoch: Epoch,
    pub leader: NodeId,
}

impl Promise {
    pub const NONE: Promise = Promise {
        epoch: Epoch(0),
        leader: NodeId::NONE,
    };
}

/// The promise stored in `dir` ([`Promise::NONE`] if there is none yet).
pub fn load(dir: &Path) -> Result<Promise, EpochFileError> {
    let path = dir.join(NAME);
    match marker::load(&path, MAGIC, 12) {
        Ok(Some(p)) => {
            let epoch = Epoch(u32::from_be_bytes([p[0], p[1], p[2], p[3]]));
            let mut id = [0u8; 8];
            id.copy_from_slice(&p[4..12]);
            Ok(Promise {
                epoch,
                leader: NodeId(u64::from_be_bytes(id)),
            })
        }
        Ok(None) => Ok(Promise::NONE),
        Err(e) => match marker::load(&path, LEGACY_MAGIC, 4) {
            Ok(Some(p)) => Ok(Promise {
                epoch: Epoch(u32::from_be_bytes([p[0], p[1], p[2], p[3]])),
                leader: NodeId::NONE,
            }),
            _ => Err(e),
        },
    }
}

/// Stores `promise` in `dir` durably.
pub fn store(dir: &Path, promise: Promise) -> Result<(), EpochFileError> {
    let mut payload = [0u8; 12];
    payload[..4].copy_from_slice(&promise.epoch.0.to_be_bytes());
    payload[4..].copy_from_slice(&promise.leader.0.to_be_bytes());
    marker::store(&dir.join(NAME), MAGIC, &payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_promise_survives_a_round_trip_and_a_damaged_file_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(load(dir.path()).expect("empty"), Promise::NONE);
        let p = Promise {
            epoch: Epoch(9),
            leader: NodeId(77),
        };
        store(dir.path(), p).expect("store");
        assert_eq!(load(dir.path()).expect("load"), p);
        let path = dir.path().join(NAME);
        let mut bytes = std::fs::read(&path).expect("read");
        assert_eq!(bytes.len(), 20, "the layout did not change");
        bytes[5] ^= 1;
        std::fs::write(&path, &bytes).expect("write");
        assert!(matches!(load(dir.path()), Err(MarkerError::Corrupt { .. })));
        std::fs::write(&path, b"short").expect("write");
        assert!(matches!(load(dir.path()), Err(MarkerError::Corrupt { .. })));
    }

    #[test]
    fn an_epoch_file_from_before_promises_loads_as_promised_to_no_leader() {
        let dir = tempfile::tempdir().expect("tempdir");
        marker::store(&dir.path().join(NAME), LEGACY_MAGIC, &5u32.to_be_bytes()).expect("store");
        assert_eq!(
            load(dir.path()).expect("load"),
            Promise {
                epoch: Epoch(5),
                leader: NodeId::NONE
            }
        );
    }
}
