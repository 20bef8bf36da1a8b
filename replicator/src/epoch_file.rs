//! A follower's accepted epoch, `<dir>/epoch`: the one file that fences old
//! leaders across restarts. Written whole (temp file, fsync, rename, fsync
//! of the directory) before the follower acts in the new epoch.
//!
//! ```text
//!  0  magic   b"WREP"                    4
//!  4  epoch   u32 big-endian             4
//!  8  crc32   u32 big-endian, bytes 0..8 4
//! ```
//! Exactly 12 bytes; anything else is refused, never guessed at.

use crate::bookmark::Epoch;
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::Path;

const MAGIC: [u8; 4] = *b"WREP";
const LEN: usize = 12;
const NAME: &str = "epoch";

/// Why the epoch file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum EpochFileError {
    #[error("epoch file {path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("epoch file {path} is not a valid epoch file ({why})")]
    Corrupt { path: String, why: &'static str },
}

/// The epoch stored in `dir` (Epoch(0) if there is none yet).
pub fn load(dir: &Path) -> Result<Epoch, EpochFileError> {
    let path = dir.join(NAME);
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Epoch(0)),
        Err(source) => {
            return Err(EpochFileError::Io {
                path: path.display().to_string(),
                source,
            });
        }
    };
    let corrupt = |why| EpochFileError::Corrupt {
        path: path.display().to_string(),
        why,
    };
    if bytes.len() != LEN {
        return Err(corrupt("wrong size"));
    }
    if bytes[..4] != MAGIC {
        return Err(corrupt("bad magic"));
    }
    let stored = u32::from_be_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
    if stored != crc32fast::hash(&bytes[..8]) {
        return Err(corrupt("bad checksum"));
    }
    Ok(Epoch(u32::from_be_bytes([
        bytes[4], bytes[5], bytes[6], bytes[7],
    ])))
}

/// Stores `epoch` in `dir` durably.
pub fn store(dir: &Path, epoch: Epoch) -> Result<(), EpochFileError> {
    let path = dir.join(NAME);
    let io = |source| EpochFileError::Io {
        path: path.display().to_string(),
        source,
    };
    let mut bytes = Vec::with_capacity(LEN);
    bytes.extend_from_slice(&MAGIC);
    bytes.extend_from_slice(&epoch.0.to_be_bytes());
    bytes.extend_from_slice(&crc32fast::hash(&bytes).to_be_bytes());
    let tmp = dir.join(format!("{NAME}.tmp"));
    let mut f = File::create(&tmp).map_err(io)?;
    f.write_all(&bytes).map_err(io)?;
    f.sync_all().map_err(io)?;
    fs::rename(&tmp, &path).map_err(io)?;
    File::open(dir).and_then(|d| d.sync_all()).map_err(io)?;
    Ok(())
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
        let mut bytes = fs::read(&path).expect("read");
        bytes[5] ^= 1;
        fs::write(&path, &bytes).expect("write");
        assert!(matches!(
            load(dir.path()),
            Err(EpochFileError::Corrupt { .. })
        ));
        fs::write(&path, b"short").expect("write");
        assert!(matches!(
            load(dir.path()),
            Err(EpochFileError::Corrupt { .. })
        ));
    }
}
