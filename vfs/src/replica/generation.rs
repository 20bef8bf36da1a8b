//! WAL generations on a replica: a new WAL header with fresh salts, a
//! restart once every reader has moved past the old generation, and
//! the wal-index header that names the frames of the current one.

use super::{ApplyError, ReplicaWal};
use crate::wal_format::{Checksum, WalHeader};
use crate::wal_index::{IndexHeader, Region, WAL_NREADER, WAL_READ_LOCK_0};
use crate::watermark::Watermark;
use libsqlite3_sys as ffi;
use std::ffi::c_int;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

impl ReplicaWal {
    pub(super) fn wal_header(&self) -> WalHeader {
        WalHeader {
            big_endian_checksums: cfg!(target_endian = "big"),
            page_size: self.page_size,
            checkpoint_seq: self.checkpoint_seq,
            salt: [
                u32::from_be_bytes([self.salt[0], self.salt[1], self.salt[2], self.salt[3]]),
                u32::from_be_bytes([self.salt[4], self.salt[5], self.salt[6], self.salt[7]]),
            ],
            checksum: self.generation_checksum,
        }
    }

    /// Writes a new WAL header (new salts): frame numbering restarts at 1.
    pub(super) fn start_generation(&mut self, salt1: u32) -> Result<(), ApplyError> {
        let salt = [salt1, random_u32()];
        self.checkpoint_seq = self.checkpoint_seq.wrapping_add(1);
        let bytes = WalHeader::encode(
            cfg!(target_endian = "big"),
            self.page_size,
            self.checkpoint_seq,
            salt,
        );
        let h = WalHeader::decode(&bytes).map_err(|e| std::io::Error::other(e.to_string()))?;
        self.salt = salt_bytes(&h);
        self.generation_checksum = h.checksum;
        self.wal.write_all_at(&bytes, 0)?;
        self.generation_started = true;
        self.next_frame = 1;
        self.running = h.checksum;
        Ok(())
    }

    /// Restarts the WAL once every confirmed frame is in the database file
    /// and no reader uses the WAL, as SQLite's `walRestartLog` does.
    pub(super) fn maybe_restart(&mut self) -> Result<(), ApplyError> {
        if !self.pending.is_empty() || self.confirmed.frame == 0 {
            return Ok(());
        }
        if self.confirmed.frame < self.wal_limit_frames {
            return self.try_restart().map(|_| ());
        }
        // Over the limit: copy everything into the database file and wait
        // (boundedly) for readers to leave the WAL. Once the WAL is fully
        // backfilled, new readers read the database file alone (SQLite's
        // read lock 0), so only readers already running hold us up.
        let deadline = Instant::now() + self.lock_timeout;
        let mut backoff = Duration::from_micros(20);
        loop {
            self.checkpoint()?;
            if self.try_restart()? || Instant::now() >= deadline {
                return Ok(());
            }
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(Duration::from_millis(2));
        }
    }

    /// Restarts the WAL if it is fully backfilled and no reader holds a
    /// WAL read lock; returns whether it did.
    fn try_restart(&mut self) -> Result<bool, ApplyError> {
        let region0 = self.region(0)?;
        if region0.backfilled() != self.confirmed.frame {
            return Ok(false);
        }
        let readers = (WAL_NREADER - 1) as c_int;
        let first = WAL_READ_LOCK_0 + 1;
        let rc = self.shm_lock(
            first,
            readers,
            ffi::SQLITE_SHM_LOCK | ffi::SQLITE_SHM_EXCLUSIVE,
        );
        if rc == ffi::SQLITE_BUSY {
            return Ok(false); // a reader uses the WAL
        }
        if rc != ffi::SQLITE_OK {
            return Err(ApplyError::Shm(rc));
        }
        let result = self.restart(region0);
        self.shm_lock(
            first,
            readers,
            ffi::SQLITE_SHM_UNLOCK | ffi::SQLITE_SHM_EXCLUSIVE,
        );
        result.map(|()| true)
    }

    fn restart(&mut self, region0: Region) -> Result<(), ApplyError> {
        let old_salt1 =
            u32::from_be_bytes([self.salt[0], self.salt[1], self.salt[2], self.salt[3]]);
        // The new generation's salts are decided before anything is written
        // so that the watermark can name them first: a crash after this
        // store but before the header write leaves an old-salt WAL that the
        // next open truncates (watermark frame 0), with the database file
        // already holding every confirmed page.
        let salt = [old_salt1.wrapping_add(1), random_u32()];
        let seq = self.checkpoint_seq.wrapping_add(1);
        let bytes = WalHeader::encode(cfg!(target_endian = "big"), self.page_size, seq, salt);
        let h = WalHeader::decode(&bytes).map_err(|e| std::io::Error::other(e.to_string()))?;
        let mark = Watermark {
            salt: salt_bytes(&h),
            frame: 0,
            checksum: h.checksum,
            ..self.confirmed
        };
        self.marks.store_with(&mark, self.sync)?;
        self.persisted = mark;
        self.wal.write_all_at(&bytes, 0)?;
        self.checkpoint_seq = seq;
        self.salt = mark.salt;
        self.generation_checksum = h.checksum;
        self.generation_started = true;
        self.next_frame = 1;
        self.running = h.checksum;
        self.confirmed = mark;
        self.change = self.change.wrapping_add(1);
        region0.publish_header(&self.index_header(0, mark.db_pages, h.checksum));
        region0.reset_checkpoint_info();
        Ok(())
    }

    pub(super) fn index_header(
        &self,
        max_frame: u32,
        db_pages: u32,
        checksum: Checksum,
    ) -> IndexHeader {
        IndexHeader {
            change: self.change,
            big_endian_checksums: cfg!(target_endian = "big"),
            page_size: self.page_size,
            max_frame,
            db_pages,
            frame_checksum: checksum,
            salt_bytes: self.salt,
        }
    }
}

pub(super) fn random_u32() -> u32 {
    let mut b = [0u8; 4];
    // SAFETY: sqlite3_randomness writes exactly `n` bytes into the buffer.
    unsafe { ffi::sqlite3_randomness(4, b.as_mut_ptr().cast()) };
    u32::from_ne_bytes(b)
}

pub(super) fn salt_bytes(h: &WalHeader) -> [u8; 8] {
    let mut s = [0u8; 8];
    s[..4].copy_from_slice(&h.salt[0].to_be_bytes());
    s[4..].copy_from_slice(&h.salt[1].to_be_bytes());
    s
}
