//! Small checksummed marker files: a follower's epoch, a log's poison
//! marker and its released base, a primary's stop marker. One layout and
//! one way to write them:
//!
//! ```text
//!  0        magic     (per kind, e.g. b"WREP")
//!  m        payload   (fixed size per kind; or, for a kind holding a
//!                      list, bounded and describing its own length,
//!                      read with `load_bounded`)
//!  m+p      crc32     u32 big-endian over magic + payload
//! ```
//!
//! A marker is written whole to a temporary file, synced, renamed over the
//! old one and the directory synced, so a crash leaves either the old
//! marker or the new one, never a torn mix. Reading checks the size, the
//! magic and the CRC; anything else is `Corrupt`, never guessed at.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::Path;

/// Why a marker could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum MarkerError {
    #[error("{path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("{path} is damaged ({why})")]
    Corrupt { path: String, why: &'static str },
}

fn io_err(path: &Path) -> impl Fn(io::Error) -> MarkerError + '_ {
    move |source| MarkerError::Io {
        path: path.display().to_string(),
        source,
    }
}

fn sync_dir(path: &Path) -> Result<(), MarkerError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(dir))
}

/// Writes the marker at `path` durably and atomically.
pub fn store(path: &Path, magic: &[u8], payload: &[u8]) -> Result<(), MarkerError> {
    let mut bytes = Vec::with_capacity(magic.len() + payload.len() + 4);
    bytes.extend_from_slice(magic);
    bytes.extend_from_slice(payload);
    bytes.extend_from_slice(&crc32fast::hash(&bytes).to_be_bytes());
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = Path::new(&tmp);
    let mut f = File::create(tmp).map_err(io_err(tmp))?;
    f.write_all(&bytes).map_err(io_err(tmp))?;
    f.sync_all().map_err(io_err(tmp))?;
    fs::rename(tmp, path).map_err(io_err(path))?;
    sync_dir(path)
}

/// The marker's payload, or None if there is no marker.
pub fn load(path: &Path, magic: &[u8], payload_len: usize) -> Result<Option<Vec<u8>>, MarkerError> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err(path)(e)),
    };
    let corrupt = |why| MarkerError::Corrupt {
        path: path.display().to_string(),
        why,
    };
    let body = magic.len() + payload_len;
    if bytes.len() != body + 4 {
        return Err(corrupt("wrong size"));
    }
    if &bytes[..magic.len()] != magic {
        return Err(corrupt("bad magic"));
    }
    if crc32fast::hash(&bytes[..body]).to_be_bytes()[..] != bytes[body..] {
        return Err(corrupt("bad checksum"));
    }
    Ok(Some(bytes[magic.len()..body].to_vec()))
}

/// The payload of a marker whose size varies (a kind holding a list): any
/// length up to `max_payload`, checked for magic and CRC like [`load`];
/// the kind checks that the payload describes its own length. None if
/// there is no marker.
pub fn load_bounded(
    path: &Path,
    magic: &[u8],
    max_payload: usize,
) -> Result<Option<Vec<u8>>, MarkerError> {
    let len = match fs::metadata(path) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err(path)(e)),
    };
    let smallest = magic.len() + 4;
    if len < smallest as u64 || len > (smallest + max_payload) as u64 {
        return Err(MarkerError::Corrupt {
            path: path.display().to_string(),
            why: "wrong size",
        });
    }
    load(path, magic, len as usize - smallest)
}

/// Removes the marker durably (no marker is fine).
pub fn remove(path: &Path) -> Result<(), MarkerError> {
    match fs::remove_file(path) {
        Ok(()) => sync_dir(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_err(path)(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marker_round_trips_and_any_damage_is_corrupt_not_a_guess() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("m");
        assert!(load(&path, b"MAGC", 3).expect("none").is_none());
        store(&path, b"MAGC", &[1, 2, 3]).expect("store");
        assert_eq!(load(&path, b"MAGC", 3).expect("load"), Some(vec![1, 2, 3]));
        assert!(!dir.path().join("m.tmp").exists());
        let good = fs::read(&path).expect("read");
        for i in 0..good.len() {
            let mut bad = good.clone();
            bad[i] ^= 0x01;
            fs::write(&path, &bad).expect("write");
            assert!(matches!(
                load(&path, b"MAGC", 3),
                Err(MarkerError::Corrupt { .. })
            ));
        }
        fs::write(&path, &good[..good.len() - 1]).expect("write");
        assert!(matches!(
            load(&path, b"MAGC", 3),
            Err(MarkerError::Corrupt { .. })
        ));
        remove(&path).expect("remove");
        remove(&path).expect("remove twice");
        assert!(load(&path, b"MAGC", 3).expect("gone").is_none());
    }

    #[test]
    fn a_bounded_marker_takes_any_length_up_to_its_bound_and_refuses_more() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("m");
        assert!(load_bounded(&path, b"MAGC", 8).expect("none").is_none());
        for payload in [&[][..], &[1, 2, 3][..], &[9; 8][..]] {
            store(&path, b"MAGC", payload).expect("store");
            assert_eq!(
                load_bounded(&path, b"MAGC", 8).expect("load"),
                Some(payload.to_vec())
            );
        }
        store(&path, b"MAGC", &[9; 9]).expect("store");
        assert!(matches!(
            load_bounded(&path, b"MAGC", 8),
            Err(MarkerError::Corrupt { .. })
        ));
        fs::write(&path, b"MAG").expect("write");
        assert!(matches!(
            load_bounded(&path, b"MAGC", 8),
            Err(MarkerError::Corrupt { .. })
        ));
    }
}
