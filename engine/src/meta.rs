//! The primary's sidecar metadata file, `<db>-walrelay`.
//!
//! Transaction sequences restart at 0 every time a primary opens, so on their
//! own they would repeat after a restart. Every open of a primary therefore
//! bumps an epoch and persists it here *before* handing out any bookmark in
//! that epoch; (epoch, sequence) then stays strictly increasing across
//! restarts and crashes. The file is tiny and rewritten whole, so it is a
//! fixed-size record replaced atomically rather than anything appendable.
//!
//! # Layout (version 1)
//!
//! ```text
//!  0                         8            12           16           20           24
//!  +-------------------------+------------+------------+------------+------------+
//!  | magic                   | version    | epoch      | reserved   | crc32      |
//!  | "WRMETA" 0x00 0x01      | u32 BE = 1 | u32 BE     | u32 = 0    | u32 BE     |
//!  +-------------------------+------------+------------+------------+------------+
//!  |<------------------ covered by crc32 (bytes 0..20) ------------->|
//! ```
//!
//! The total is always exactly 24 bytes; anything else is not a version 1
//! file. The CRC is CRC-32 (IEEE, as computed by `crc32fast`). The reserved
//! word is written as zero and ignored on read, so it can later carry an
//! optional field without a version bump; anything that changes the meaning
//! of existing bytes must bump the version instead.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

/// Ends in a NUL and a binary byte so the file is never mistaken for text
/// and a text file is never mistaken for it.
pub(crate) const MAGIC: [u8; 8] = *b"WRMETA\0\x01";

/// The only layout this build can read or write.
pub(crate) const VERSION: u32 = 1;

/// Exact size of an encoded file.
pub(crate) const META_LEN: usize = 24;

/// Appended to the database path to name its sidecar, so the two sit side by
/// side and are found, copied and deleted together (like SQLite's own
/// `-wal` and `-shm`).
pub(crate) const SIDECAR_SUFFIX: &str = "-walrelay";

const MAGIC_AT: usize = 0;
const VERSION_AT: usize = 8;
const EPOCH_AT: usize = 12;
const CRC_AT: usize = 20;

/// What the primary must remember between opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MetaFile {
    /// The epoch of the most recent open. The next open must use a larger
    /// one, and must have stored it before issuing bookmarks in it.
    pub epoch: u32,
}

/// Why the metadata file could not be read or written.
///
/// Each decode failure is its own variant because they call for different
/// responses: a wrong magic means someone else's file is in the way, a newer
/// version means an older build is running, and a bad length or checksum
/// means corruption. None of them is safe to "repair" by starting over at
/// epoch 0, since that would reuse bookmarks that replicas already hold.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MetaError {
    #[error("walrelay metadata file I/O failed: {0}")]
    Io(#[from] io::Error),
    #[error("walrelay metadata file is truncated: {len} bytes, expected {META_LEN}")]
    Truncated { len: u64 },
    #[error("walrelay metadata file is too large: {len} bytes, expected {META_LEN}")]
    Oversized { len: u64 },
    #[error("not a walrelay metadata file: magic is {found:02x?}")]
    BadMagic { found: [u8; 8] },
    #[error("unsupported walrelay metadata version {version}; this build reads version {VERSION}")]
    UnsupportedVersion { version: u32 },
    #[error("walrelay metadata checksum mismatch: stored {stored:08x}, computed {computed:08x}")]
    ChecksumMismatch { stored: u32, computed: u32 },
}

impl MetaFile {
    pub(crate) fn encode(&self) -> [u8; META_LEN] {
        let mut out = [0u8; META_LEN];
        out[MAGIC_AT..VERSION_AT].copy_from_slice(&MAGIC);
        out[VERSION_AT..EPOCH_AT].copy_from_slice(&VERSION.to_be_bytes());
        out[EPOCH_AT..EPOCH_AT + 4].copy_from_slice(&self.epoch.to_be_bytes());
        // The reserved word stays zero.
        let crc = crc32fast::hash(&out[..CRC_AT]);
        out[CRC_AT..].copy_from_slice(&crc.to_be_bytes());
        out
    }

    /// Checks run in a fixed order, each relying on the ones before it: the
    /// length first so every later read is in bounds, then the magic so a
    /// foreign file is reported as such rather than as corruption, then the
    /// version because it defines where (and whether) the checksum lives,
    /// and only then the checksum.
    pub(crate) fn decode(bytes: &[u8]) -> Result<MetaFile, MetaError> {
        let Ok(bytes) = <&[u8; META_LEN]>::try_from(bytes) else {
            return Err(length_error(bytes.len() as u64));
        };

        let mut found = [0u8; 8];
        found.copy_from_slice(&bytes[MAGIC_AT..VERSION_AT]);
        if found != MAGIC {
            return Err(MetaError::BadMagic { found });
        }

        let version = be_u32_at(bytes, VERSION_AT);
        if version != VERSION {
            return Err(MetaError::UnsupportedVersion { version });
        }

        let stored = be_u32_at(bytes, CRC_AT);
        let computed = crc32fast::hash(&bytes[..CRC_AT]);
        if stored != computed {
            return Err(MetaError::ChecksumMismatch { stored, computed });
        }

        Ok(MetaFile {
            epoch: be_u32_at(bytes, EPOCH_AT),
        })
    }
}

/// The sidecar path for the database at `db`.
pub(crate) fn sidecar_path(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push(SIDECAR_SUFFIX);
    PathBuf::from(name)
}

/// Reads the metadata file at `path`.
///
/// `Ok(None)` means the file does not exist, i.e. this database has never
/// been opened as a primary. Every other problem is an error, never `None`:
/// treating a damaged file as absent would restart epochs at the beginning.
///
/// The size is checked from the open handle before reading, and the read is
/// bounded anyway, so pointing this at a large file (or one that grows
/// concurrently) costs nothing.
pub(crate) fn load(path: &Path) -> Result<Option<MetaFile>, MetaError> {
    let file = match File::open(path) {
        Ok(file) => file,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(err) => return Err(err.into()),
    };
    let metadata = file.metadata()?;
    if !metadata.is_file() {
        // A directory or device in the way is a setup problem, not a
        // malformed metadata file; reading a FIFO could also block forever.
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a regular file", path.display()),
        )
        .into());
    }
    if metadata.len() > META_LEN as u64 {
        return Err(MetaError::Oversized {
            len: metadata.len(),
        });
    }

    // One byte of slack so a file that grew since the size check is still
    // reported as oversized by `decode`.
    let mut bytes = Vec::with_capacity(META_LEN + 1);
    file.take(META_LEN as u64 + 1).read_to_end(&mut bytes)?;
    MetaFile::decode(&bytes).map(Some)
}

/// Replaces the metadata file at `path` so that, after any crash, it holds
/// either the old contents or the new ones in full, never a mix.
///
/// Writes `<path>.tmp`, syncs it, renames it over `path`, then syncs the
/// parent directory so the rename itself is durable. Only once this returns
/// `Ok` may the caller issue bookmarks in the new epoch: if the rename were
/// lost in a crash, the old epoch would come back and be bumped to the same
/// value again, and bookmarks would repeat.
///
/// Assumes a single writer per database (the primary holds the database
/// exclusively), since concurrent stores would share the temporary file.
pub(crate) fn store(path: &Path, meta: &MetaFile) -> Result<(), MetaError> {
    let tmp = tmp_path(path);
    let replaced = write_synced(&tmp, &meta.encode()).and_then(|()| fs::rename(&tmp, path));
    if let Err(err) = replaced {
        // Best effort: the write or rename error is the one worth reporting,
        // and a leftover temporary file is harmless because the next store
        // truncates it.
        let _ = fs::remove_file(&tmp);
        return Err(err.into());
    }
    sync_parent_dir(path)?;
    Ok(())
}

fn length_error(len: u64) -> MetaError {
    if len < META_LEN as u64 {
        MetaError::Truncated { len }
    } else {
        MetaError::Oversized { len }
    }
}

fn be_u32_at(bytes: &[u8; META_LEN], at: usize) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&bytes[at..at + 4]);
    u32::from_be_bytes(word)
}

fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".tmp");
    PathBuf::from(name)
}

fn write_synced(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

/// On Unix a rename is only durable once the directory holding the entry
/// has been synced.
#[cfg(unix)]
fn sync_parent_dir(path: &Path) -> io::Result<()> {
    let parent = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    File::open(parent)?.sync_all()
}

/// Other platforms offer no portable way to sync a directory entry; the
/// rename is still atomic, just not guaranteed durable on return.
#[cfg(not(unix))]
fn sync_parent_dir(_path: &Path) -> io::Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pins the format independently of `encode`: epoch 0x01020304, with the
    /// CRC computed by an independent implementation (Python's zlib.crc32).
    const GOLDEN: [u8; META_LEN] = [
        0x57, 0x52, 0x4d, 0x45, 0x54, 0x41, 0x00, 0x01, // magic
        0x00, 0x00, 0x00, 0x01, // version
        0x01, 0x02, 0x03, 0x04, // epoch
        0x00, 0x00, 0x00, 0x00, // reserved
        0x7c, 0x3b, 0xfd, 0x64, // crc32
    ];

    /// Re-seals `bytes` with a correct CRC so a test can reach the checks
    /// that come after the checksum's position in the order.
    fn reseal(mut bytes: [u8; META_LEN]) -> [u8; META_LEN] {
        let crc = crc32fast::hash(&bytes[..CRC_AT]);
        bytes[CRC_AT..].copy_from_slice(&crc.to_be_bytes());
        bytes
    }

    fn meta_path(dir: &tempfile::TempDir) -> PathBuf {
        sidecar_path(&dir.path().join("app.db"))
    }

    #[test]
    fn encoding_matches_the_documented_layout() {
        assert_eq!(MetaFile { epoch: 0x0102_0304 }.encode(), GOLDEN);
        assert_eq!(
            MetaFile::decode(&GOLDEN).unwrap(),
            MetaFile { epoch: 0x0102_0304 }
        );
    }

    #[test]
    fn encode_decode_round_trips() {
        for epoch in [0, 1, 0x8000_0000, u32::MAX] {
            let meta = MetaFile { epoch };
            assert_eq!(MetaFile::decode(&meta.encode()).unwrap(), meta);
        }
    }

    #[test]
    fn store_then_load_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let path = meta_path(&dir);
        store(&path, &MetaFile { epoch: 42 }).unwrap();
        assert_eq!(load(&path).unwrap(), Some(MetaFile { epoch: 42 }));
        assert_eq!(fs::read(&path).unwrap().len(), META_LEN);
    }

    #[test]
    fn sidecar_sits_next_to_the_database_with_suffix() {
        assert_eq!(
            sidecar_path(Path::new("/data/app.db")),
            PathBuf::from("/data/app.db-walrelay")
        );
    }

    #[test]
    fn missing_file_loads_as_none() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(load(&meta_path(&dir)).unwrap(), None);
    }

    #[test]
    fn decode_reports_short_input_as_truncated_before_any_other_check() {
        // Garbage magic too: length must win.
        assert!(matches!(
            MetaFile::decode(&[]),
            Err(MetaError::Truncated { len: 0 })
        ));
        assert!(matches!(
            MetaFile::decode(&[0xff; 10]),
            Err(MetaError::Truncated { len: 10 })
        ));
        assert!(matches!(
            MetaFile::decode(&GOLDEN[..META_LEN - 1]),
            Err(MetaError::Truncated { len: 23 })
        ));
    }

    #[test]
    fn decode_reports_long_input_as_oversized() {
        let mut long = GOLDEN.to_vec();
        long.push(0);
        assert!(matches!(
            MetaFile::decode(&long),
            Err(MetaError::Oversized { len: 25 })
        ));
    }

    #[test]
    fn load_reports_truncated_and_empty_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = meta_path(&dir);
        fs::write(&path, &GOLDEN[..12]).unwrap();
        assert!(matches!(load(&path), Err(MetaError::Truncated { len: 12 })));
        fs::write(&path, b"").unwrap();
        assert!(matches!(load(&path), Err(MetaError::Truncated { len: 0 })));
    }

    #[test]
    fn load_refuses_oversized_file_by_its_size() {
        let dir = tempfile::tempdir().unwrap();
        let path = meta_path(&dir);
        // A valid record followed by more data must still be refused.
        let file = File::create(&path).unwrap();
        (&file).write_all(&GOLDEN).unwrap();
        // Sparse, so the test is cheap; reading it fully would not be.
        file.set_len(1 << 30).unwrap();
        drop(file);
        assert!(matches!(
            load(&path),
            Err(MetaError::Oversized { len }) if len == 1 << 30
        ));
    }

    #[test]
    fn load_refuses_a_directory_in_the_way() {
        let dir = tempfile::tempdir().unwrap();
        let path = meta_path(&dir);
        fs::create_dir(&path).unwrap();
        assert!(matches!(load(&path), Err(MetaError::Io(_))));
    }

    #[test]
    fn bad_magic_is_reported_with_what_was_found() {
        let mut bytes = GOLDEN;
        bytes[..8].copy_from_slice(b"SQLite f");
        let bytes = reseal(bytes);
        assert!(matches!(
            MetaFile::decode(&bytes),
            Err(MetaError::BadMagic { found }) if &found == b"SQLite f"
        ));
    }

    #[test]
    fn other_versions_are_unsupported_even_with_a_valid_checksum() {
        for version in [0u32, 2, u32::MAX] {
            let mut bytes = GOLDEN;
            bytes[VERSION_AT..EPOCH_AT].copy_from_slice(&version.to_be_bytes());
            let bytes = reseal(bytes);
            assert!(matches!(
                MetaFile::decode(&bytes),
                Err(MetaError::UnsupportedVersion { version: v }) if v == version
            ));
        }
    }

    #[test]
    fn version_is_checked_before_checksum() {
        // A future layout may put its checksum elsewhere, so an unknown
        // version must not be reported as corruption.
        let mut bytes = GOLDEN;
        bytes[VERSION_AT + 3] = 2;
        assert!(matches!(
            MetaFile::decode(&bytes),
            Err(MetaError::UnsupportedVersion { version: 2 })
        ));
    }

    #[test]
    fn any_flipped_bit_after_the_version_fails_the_checksum() {
        for byte in EPOCH_AT..META_LEN {
            for bit in 0..8 {
                let mut bytes = GOLDEN;
                bytes[byte] ^= 1 << bit;
                assert!(
                    matches!(
                        MetaFile::decode(&bytes),
                        Err(MetaError::ChecksumMismatch { .. })
                    ),
                    "byte {byte} bit {bit}"
                );
            }
        }
    }

    #[test]
    fn checksum_mismatch_reports_both_values() {
        let mut bytes = GOLDEN;
        bytes[EPOCH_AT] ^= 0x80;
        match MetaFile::decode(&bytes) {
            Err(MetaError::ChecksumMismatch { stored, computed }) => {
                assert_eq!(stored, 0x7c3b_fd64);
                assert_eq!(computed, crc32fast::hash(&bytes[..CRC_AT]));
            }
            other => panic!("expected ChecksumMismatch, got {other:?}"),
        }
    }

    #[test]
    fn store_atomically_replaces_an_existing_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = meta_path(&dir);
        store(&path, &MetaFile { epoch: 1 }).unwrap();
        #[cfg(unix)]
        let before = fs::metadata(&path).unwrap();

        store(&path, &MetaFile { epoch: 2 }).unwrap();
        assert_eq!(load(&path).unwrap(), Some(MetaFile { epoch: 2 }));

        // Replaced by rename, not rewritten in place: a fresh inode, and no
        // temporary file left behind.
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            let after = fs::metadata(&path).unwrap();
            assert_ne!(before.ino(), after.ino());
        }
        assert!(!tmp_path(&path).exists());
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|entry| entry.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![path.file_name().unwrap().to_owned()]);
    }

    #[test]
    fn store_overwrites_a_stale_temporary_file_from_a_crashed_store() {
        let dir = tempfile::tempdir().unwrap();
        let path = meta_path(&dir);
        store(&path, &MetaFile { epoch: 7 }).unwrap();
        // Longer than a record, so a missing truncate would corrupt it.
        fs::write(tmp_path(&path), [0xaa; 100]).unwrap();

        store(&path, &MetaFile { epoch: 8 }).unwrap();
        assert_eq!(load(&path).unwrap(), Some(MetaFile { epoch: 8 }));
        assert!(!tmp_path(&path).exists());
    }

    #[test]
    fn failed_store_leaves_the_old_file_and_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = meta_path(&dir);
        store(&path, &MetaFile { epoch: 3 }).unwrap();
        // Renaming a file over a non-empty directory fails on every platform.
        let blocked = dir.path().join("blocked");
        fs::create_dir(&blocked).unwrap();
        fs::write(blocked.join("occupant"), b"x").unwrap();

        assert!(matches!(
            store(&blocked, &MetaFile { epoch: 4 }),
            Err(MetaError::Io(_))
        ));
        assert!(!tmp_path(&blocked).exists());
        assert_eq!(load(&path).unwrap(), Some(MetaFile { epoch: 3 }));
    }

    #[test]
    fn store_into_a_missing_directory_is_an_io_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("no-such-dir").join("app.db-walrelay");
        assert!(matches!(
            store(&path, &MetaFile { epoch: 1 }),
            Err(MetaError::Io(_))
        ));
    }
}
