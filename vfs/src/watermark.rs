//! The replica's persisted commit watermark: the newest confirmed
//! transaction whose frames are durable in the replica's WAL (or already in
//! its database file), and where that transaction ends in the WAL.
//!
//! On open, everything in the WAL past this point is cut before SQLite reads
//! the WAL, so SQLite's recovery can never reveal an unconfirmed frame. The
//! watermark may lag what readers were shown before a crash (the replica
//! then catches up again); it never leads what is durable.
//!
//! The file holds two 64-byte slots written alternately, each with a
//! sequence number and a CRC32, so a torn write of one slot leaves the other:
//!
//! ```text
//! slot (64 bytes, big-endian), at offset 0 or 64
//!  0  magic     b"WRWMARK1"        8
//!  8  sequence  u64 (higher wins)  8
//! 16  bookmark  epoch u32, seq u64 12
//! 28  salt      WAL header bytes 16..24 of the generation      8
//! 36  frame     u32: last frame of the confirmed transaction (0 = none in this generation)
//! 40  cksum     u32[2]: WAL checksum after that frame          8
//! 48  db_pages  u32: database size in pages after it           4
//! 52  page_size u32                                            4
//! 56  reserved  u32 (0)                                        4
//! 60  crc32     u32 over bytes 0..60                           4
//! ```

use crate::wal_format::Checksum;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use walrelay_replicator::Bookmark;

const MAGIC: &[u8; 8] = b"WRWMARK1";
const SLOT_BYTES: usize = 64;

/// `<db><suffix>`: the naming of every file that belongs to a database.
pub(crate) fn sibling(db: &Path, suffix: &str) -> PathBuf {
    let mut s = db.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// A confirmed position in the replica's WAL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Watermark {
    pub bookmark: Bookmark,
    pub salt: [u8; 8],
    pub frame: u32,
    pub checksum: Checksum,
    pub db_pages: u32,
    pub page_size: u32,
}

impl Watermark {
    fn encode(&self, sequence: u64) -> [u8; SLOT_BYTES] {
        let mut b = [0u8; SLOT_BYTES];
        b[0..8].copy_from_slice(MAGIC);
        b[8..16].copy_from_slice(&sequence.to_be_bytes());
        b[16..28].copy_from_slice(&self.bookmark.to_bytes());
        b[28..36].copy_from_slice(&self.salt);
        b[36..40].copy_from_slice(&self.frame.to_be_bytes());
        b[40..44].copy_from_slice(&self.checksum.0.to_be_bytes());
        b[44..48].copy_from_slice(&self.checksum.1.to_be_bytes());
        b[48..52].copy_from_slice(&self.db_pages.to_be_bytes());
        b[52..56].copy_from_slice(&self.page_size.to_be_bytes());
        let crc = crc32fast::hash(&b[..60]);
        b[60..64].copy_from_slice(&crc.to_be_bytes());
        b
    }

    fn decode(b: &[u8]) -> Option<(u64, Watermark)> {
        if b.len() != SLOT_BYTES || &b[0..8] != MAGIC {
            return None;
        }
        let be32 = |at: usize| u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        if crc32fast::hash(&b[..60]) != be32(60) {
            return None;
        }
        let mut seq = [0u8; 8];
        seq.copy_from_slice(&b[8..16]);
        let mut bm = [0u8; 12];
        bm.copy_from_slice(&b[16..28]);
        let mut salt = [0u8; 8];
        salt.copy_from_slice(&b[28..36]);
        Some((
            u64::from_be_bytes(seq),
            Watermark {
                bookmark: Bookmark::from_bytes(bm),
                salt,
                frame: be32(36),
                checksum: Checksum(be32(40), be32(44)),
                db_pages: be32(48),
                page_size: be32(52),
            },
        ))
    }
}

/// Why the watermark file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum WatermarkError {
    #[error("watermark file I/O: {0}")]
    Io(#[from] io::Error),
    #[error("watermark file {path} is {len} bytes; expected {expected}")]
    Size {
        path: PathBuf,
        len: u64,
        expected: u64,
    },
    #[error("watermark file {0} has no valid slot")]
    NoValidSlot(PathBuf),
}

/// The watermark a replica at `db` last persisted, read without opening
/// the replica (None: no valid watermark file). Safe to call while the
/// replica runs: it only reads the two slots.
pub fn persisted(db: &Path) -> Option<Watermark> {
    let mut buf = [0u8; 2 * SLOT_BYTES];
    let file = File::open(WatermarkFile::path_for(db)).ok()?;
    file.read_exact_at(&mut buf, 0).ok()?;
    [&buf[..SLOT_BYTES], &buf[SLOT_BYTES..]]
        .into_iter()
        .filter_map(Watermark::decode)
        .max_by_key(|(seq, _)| *seq)
        .map(|(_, w)| w)
}

/// The bookmark of [`persisted`].
pub fn persisted_bookmark(db: &Path) -> Option<Bookmark> {
    persisted(db).map(|w| w.bookmark)
}

/// The open watermark file.
#[derive(Debug)]
pub struct WatermarkFile {
    file: File,
    path: PathBuf,
    sequence: u64,
}

impl WatermarkFile {
    /// `<db>-walrelay-replica`.
    pub fn path_for(db: &Path) -> PathBuf {
        sibling(db, "-walrelay-replica")
    }

    /// Opens (or creates, with `initial`) the watermark file and returns the
    /// newest valid watermark in it.
    pub fn open(
        path: &Path,
        initial: Watermark,
    ) -> Result<(WatermarkFile, Watermark), WatermarkError> {
        let exists = path.exists();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        if !exists || file.metadata()?.len() == 0 {
            let mut wf = WatermarkFile {
                file,
                path: path.to_path_buf(),
                sequence: 0,
            };
            wf.store(&initial)?;
            wf.store(&initial)?; // both slots valid
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                File::open(dir)?.sync_all()?;
            }
            return Ok((wf, initial));
        }
        let len = file.metadata()?.len();
        if len != 2 * SLOT_BYTES as u64 {
            return Err(WatermarkError::Size {
                path: path.to_path_buf(),
                len,
                expected: 2 * SLOT_BYTES as u64,
            });
        }
        let mut buf = [0u8; 2 * SLOT_BYTES];
        file.read_exact_at(&mut buf, 0)?;
        let best = [&buf[..SLOT_BYTES], &buf[SLOT_BYTES..]]
            .into_iter()
            .filter_map(Watermark::decode)
            .max_by_key(|(seq, _)| *seq)
            .ok_or_else(|| WatermarkError::NoValidSlot(path.to_path_buf()))?;
        Ok((
            WatermarkFile {
                file,
                path: path.to_path_buf(),
                sequence: best.0,
            },
            best.1,
        ))
    }

    /// Durably replaces the watermark (the older slot is overwritten).
    pub fn store(&mut self, w: &Watermark) -> Result<(), WatermarkError> {
        self.store_with(w, true)
    }

    /// Replaces the watermark; `sync` = false leaves it in the page cache
    /// (survives a process crash, not a power loss).
    pub fn store_with(&mut self, w: &Watermark, sync: bool) -> Result<(), WatermarkError> {
        self.sequence += 1;
        let slot = (self.sequence % 2) * SLOT_BYTES as u64;
        self.file.write_all_at(&w.encode(self.sequence), slot)?;
        if sync {
            self.file.sync_data()?;
        }
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use walrelay_replicator::{Epoch, Sequence};

    fn mark(seq: u64) -> Watermark {
        Watermark {
            bookmark: Bookmark::new(Epoch(2), Sequence(seq)),
            salt: [1, 2, 3, 4, 5, 6, 7, 8],
            frame: seq as u32 * 3,
            checksum: Checksum(9, 10),
            db_pages: 42,
            page_size: 4096,
        }
    }

    #[test]
    fn the_newest_stored_watermark_is_read_back() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("w");
        let (mut f, w) = WatermarkFile::open(&p, mark(0)).expect("create");
        assert_eq!(w, mark(0));
        for s in 1..=5 {
            f.store(&mark(s)).expect("store");
        }
        drop(f);
        let (_, w) = WatermarkFile::open(&p, mark(0)).expect("reopen");
        assert_eq!(w, mark(5));
    }

    #[test]
    fn a_torn_slot_falls_back_to_the_other() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("w");
        let (mut f, _) = WatermarkFile::open(&p, mark(0)).expect("create");
        f.store(&mark(1)).expect("store");
        f.store(&mark(2)).expect("store");
        drop(f);
        // Corrupt the slot holding sequence 4 (mark 2): even sequence, slot 0.
        let file = OpenOptions::new().write(true).open(&p).expect("open");
        file.write_all_at(&[0xff; 8], 20).expect("tear");
        let (_, w) = WatermarkFile::open(&p, mark(0)).expect("reopen");
        assert_eq!(w, mark(1));
    }

    #[test]
    fn a_file_of_the_wrong_size_is_refused() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("w");
        std::fs::write(&p, b"short").expect("write");
        assert!(matches!(
            WatermarkFile::open(&p, mark(0)),
            Err(WatermarkError::Size { .. })
        ));
    }
}
