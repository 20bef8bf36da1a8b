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
//! Exactly 24 bytes.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use walrelay_replicator::Bookmark;

const MAGIC: [u8; 8] = *b"WRSTOP\0\x01";
const LEN: usize = 24;

/// Why the marker could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StopMarkerError {
    #[error("stop marker {path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("stop marker {path} is damaged ({why})")]
    Corrupt { path: String, why: &'static str },
}

pub fn path_for(db: &Path) -> PathBuf {
    let mut p = db.as_os_str().to_owned();
    p.push("-walrelay-stopped");
    PathBuf::from(p)
}

/// Reads the marker (None: the last stop was not clean, or never ran).
pub fn load(db: &Path) -> Result<Option<Bookmark>, StopMarkerError> {
    let path = path_for(db);
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(StopMarkerError::Io {
                path: path.display().to_string(),
                source,
            });
        }
    };
    let corrupt = |why| StopMarkerError::Corrupt {
        path: path.display().to_string(),
        why,
    };
    if bytes.len() != LEN {
        return Err(corrupt("wrong size"));
    }
    if bytes[..8] != MAGIC {
        return Err(corrupt("bad magic"));
    }
    let crc = u32::from_be_bytes([bytes[20], bytes[21], bytes[22], bytes[23]]);
    if crc != crc32fast::hash(&bytes[..20]) {
        return Err(corrupt("bad checksum"));
    }
    let mut raw = [0u8; 12];
    raw.copy_from_slice(&bytes[8..20]);
    Ok(Some(Bookmark::from_bytes(raw)))
}

/// Writes the marker durably.
pub fn store(db: &Path, bookmark: Bookmark) -> Result<(), StopMarkerError> {
    let path = path_for(db);
    let io = |source| StopMarkerError::Io {
        path: path.display().to_string(),
        source,
    };
    let mut bytes = Vec::with_capacity(LEN);
    bytes.extend_from_slice(&MAGIC);
    bytes.extend_from_slice(&bookmark.to_bytes());
    bytes.extend_from_slice(&crc32fast::hash(&bytes).to_be_bytes());
    let mut f = File::create(&path).map_err(io)?;
    f.write_all(&bytes).map_err(io)?;
    f.sync_all().map_err(io)?;
    if let Some(dir) = path.parent() {
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        File::open(dir).and_then(|d| d.sync_all()).map_err(io)?;
    }
    Ok(())
}

/// Removes the marker durably (a start has consumed it).
pub fn remove(db: &Path) -> Result<(), StopMarkerError> {
    let path = path_for(db);
    match fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(StopMarkerError::Io {
            path: path.display().to_string(),
            source,
        }),
    }
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
        let mut raw = fs::read(path_for(&db)).expect("read");
        raw[12] ^= 0x40;
        fs::write(path_for(&db), &raw).expect("write");
        assert!(matches!(load(&db), Err(StopMarkerError::Corrupt { .. })));
        remove(&db).expect("remove");
        assert_eq!(load(&db).expect("gone"), None);
    }
}
