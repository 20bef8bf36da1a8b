//! The primary's clean-stop marker, `<db>-walrelay-stopped`.
//!
//! A replicated primary's first record in a new epoch must name the last
//! record of the previous one. After a clean stop (every commit confirmed,
//! then the process exits) that bookmark is known and written here; the
//! next start reads it and deletes it, so a later crash cannot reuse it.
//! Without the marker an existing database cannot be chained onto the
//! followers' log safely: its local WAL may hold a commit the quorum never
//! confirmed. Recovering such a primary from the followers' log is the
//! failover work, not this file's.
//!
//! ```text
//!  0  magic     b"WRSTOP\0\x01"              8
//!  8  bookmark  epoch u32, sequence u64 BE  12
//! 20  crc32     u32 BE over bytes 0..20      4
//! ```
//! Exactly 24 bytes, written atomically ([`walrelay_replicator::marker`]).

use std::path::{Path, PathBuf};
use walrelay_replicator::Bookmark;
use walrelay_replicator::marker;

const MAGIC: &[u8] = b"WRSTOP\0\x01";

/// Why the marker could not be read or written.
pub type StopMarkerError = marker::MarkerError;

pub fn path_for(db: &Path) -> PathBuf {
    let mut p = db.as_os_str().to_owned();
    p.push("-walrelay-stopped");
    PathBuf::from(p)
}

/// Reads the marker (None: the last stop was not clean, or never ran).
pub fn load(db: &Path) -> Result<Option<Bookmark>, StopMarkerError> {
    Ok(
        marker::load(&path_for(db), MAGIC, Bookmark::BYTE_LEN)?.map(|p| {
            let mut raw = [0u8; Bookmark::BYTE_LEN];
            raw.copy_from_slice(&p);
            Bookmark::from_bytes(raw)
        }),
    )
}

/// Writes the marker durably.
pub fn store(db: &Path, bookmark: Bookmark) -> Result<(), StopMarkerError> {
    marker::store(&path_for(db), MAGIC, &bookmark.to_bytes())
}

/// Removes the marker durably (a start has consumed it).
pub fn remove(db: &Path) -> Result<(), StopMarkerError> {
    marker::remove(&path_for(db))
}

#[cfg(test)]
mod tests {
    use super::*;
    use walrelay_replicator::{Epoch, Sequence};

    #[test]
    fn a_marker_round_trips_and_a_damaged_one_is_refused() {
        let dir = tempfile::tempdir().expect("dir");
        let db = dir.path().join("a.db");
        assert_eq!(load(&db).expect("none"), None);
        let b = Bookmark::new(Epoch(3), Sequence(77));
        store(&db, b).expect("store");
        assert_eq!(load(&db).expect("load"), Some(b));
        let mut raw = std::fs::read(path_for(&db)).expect("read");
        assert_eq!(raw.len(), 24, "the layout did not change");
        raw[12] ^= 0x40;
        std::fs::write(path_for(&db), &raw).expect("write");
        assert!(matches!(load(&db), Err(StopMarkerError::Corrupt { .. })));
        remove(&db).expect("remove");
        assert_eq!(load(&db).expect("gone"), None);
    }
}
