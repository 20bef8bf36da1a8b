//! The SQLite WAL-index (`-shm`) format: the one place walrelay reads or
//! writes it. Every field is in the host's native byte order, except the
//! salts, which are the WAL header's big-endian bytes copied verbatim.
//!
//! ```text
//! region 0 (32 KiB)
//!   0   WalIndexHdr copy 0 (48 bytes)      readers read copy 0, then copy 1,
//!  48   WalIndexHdr copy 1 (48 bytes)      and trust them only if equal
//!  96   WalCkptInfo (40 bytes)
//! 136   aPgno[4062]  u32: page number of frame (iZero + i + 1)
//! 16384 aHash[8192]  u16: 1-based index into aPgno, 0 = empty
//! region k >= 1 (32 KiB)
//!   0   aPgno[4096], then aHash[8192] at 16384; iZero = 4062 + (k-1)*4096
//!
//! WalIndexHdr                          WalCkptInfo (at 96)
//!  0 iVersion    u32 (3007000)          96 nBackfill           u32
//!  4 unused      u32                   100 aReadMark[5]        u32 (0xffffffff = unused)
//!  8 iChange     u32 (+1 per commit)   120 aLock[8]            lock bytes of xShmLock
//! 12 isInit u8, bigEndCksum u8,        128 nBackfillAttempted  u32
//!    szPage u16 (65536 stored as 1)    132 notUsed0            u32
//! 16 mxFrame     u32  last valid frame
//! 20 nPage       u32  db size in pages
//! 24 aFrameCksum u32[2] of frame mxFrame
//! 32 aSalt       [u8; 8] WAL header bytes 16..24
//! 40 aCksum      u32[2] over bytes 0..40, native order
//! ```
//!
//! Hash: slot `(pgno * 383) & 8191`, linear probing upwards. A writer
//! publishes a header by writing copy 1, a memory barrier, then copy 0.
//! Readers ignore every frame above their snapshot's `mxFrame`, so index
//! entries for frames beyond it are invisible until a header names them.

use crate::wal_format::Checksum;
use std::sync::atomic::{AtomicU16, AtomicU32, Ordering, fence};

pub const REGION_BYTES: usize = 32 * 1024;
pub const HEADER_BYTES: usize = 48;
pub const CKPT_INFO_OFFSET: usize = 96;
/// `WALINDEX_HDR_SIZE`: two headers and the checkpoint info.
pub const INDEX_HEADER_BYTES: usize = 136;
pub const HASHTABLE_NPAGE: u32 = 4096;
pub const HASHTABLE_NPAGE_ONE: u32 = HASHTABLE_NPAGE - (INDEX_HEADER_BYTES / 4) as u32;
pub const HASHTABLE_NSLOT: usize = 2 * HASHTABLE_NPAGE as usize;
pub const HASHTABLE_HASH_1: u32 = 383;
pub const WAL_NREADER: usize = 5;
pub const READMARK_NOT_USED: u32 = 0xffff_ffff;
pub const INDEX_VERSION: u32 = 3_007_000;

/// `xShmLock` lock indexes.
pub const WAL_WRITE_LOCK: i32 = 0;
pub const WAL_CKPT_LOCK: i32 = 1;
pub const WAL_READ_LOCK_0: i32 = 3;

/// A WAL-index header, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IndexHeader {
    pub change: u32,
    pub big_endian_checksums: bool,
    pub page_size: u32,
    pub max_frame: u32,
    pub db_pages: u32,
    pub frame_checksum: Checksum,
    /// The WAL header's salt bytes (16..24), as stored.
    pub salt_bytes: [u8; 8],
}

impl IndexHeader {
    /// The 12 native-order words of the header, checksum included.
    pub fn to_words(&self) -> [u32; 12] {
        let mut w = [0u32; 12];
        w[0] = INDEX_VERSION;
        w[2] = self.change;
        let sz = ((self.page_size & 0xff00) | (self.page_size >> 16)) as u16;
        let mut b = [0u8; 4];
        b[0] = 1; // isInit
        b[1] = u8::from(self.big_endian_checksums);
        b[2..4].copy_from_slice(&sz.to_ne_bytes());
        w[3] = u32::from_ne_bytes(b);
        w[4] = self.max_frame;
        w[5] = self.db_pages;
        w[6] = self.frame_checksum.0;
        w[7] = self.frame_checksum.1;
        w[8] = u32::from_ne_bytes([
            self.salt_bytes[0],
            self.salt_bytes[1],
            self.salt_bytes[2],
            self.salt_bytes[3],
        ]);
        w[9] = u32::from_ne_bytes([
            self.salt_bytes[4],
            self.salt_bytes[5],
            self.salt_bytes[6],
            self.salt_bytes[7],
        ]);
        let mut bytes = [0u8; 40];
        for (i, word) in w[..10].iter().enumerate() {
            bytes[i * 4..i * 4 + 4].copy_from_slice(&word.to_ne_bytes());
        }
        let ck = Checksum::default().extend(cfg!(target_endian = "big"), &bytes);
        w[10] = ck.0;
        w[11] = ck.1;
        w
    }

    /// Decodes a header from its words; `None` if uninitialised or its
    /// checksum does not match.
    pub fn from_words(w: &[u32; 12]) -> Option<IndexHeader> {
        let mut bytes = [0u8; 40];
        for (i, word) in w[..10].iter().enumerate() {
            bytes[i * 4..i * 4 + 4].copy_from_slice(&word.to_ne_bytes());
        }
        let ck = Checksum::default().extend(cfg!(target_endian = "big"), &bytes);
        if ck != Checksum(w[10], w[11]) || bytes[12] != 1 {
            return None;
        }
        let sz = u16::from_ne_bytes([bytes[14], bytes[15]]) as u32;
        let mut salt_bytes = [0u8; 8];
        salt_bytes.copy_from_slice(&bytes[32..40]);
        Some(IndexHeader {
            change: w[2],
            big_endian_checksums: bytes[13] != 0,
            page_size: (sz & 0xfe00) + ((sz & 0x0001) << 16),
            max_frame: w[4],
            db_pages: w[5],
            frame_checksum: Checksum(w[6], w[7]),
            salt_bytes,
        })
    }
}

/// The wal-index region holding frame `frame`'s entry, and the frame number
/// that region's index 0 stands for (`iZero`).
pub fn region_of(frame: u32) -> (usize, u32) {
    debug_assert!(frame >= 1);
    let region = (frame + HASHTABLE_NPAGE - HASHTABLE_NPAGE_ONE - 1) / HASHTABLE_NPAGE;
    let zero = if region == 0 {
        0
    } else {
        HASHTABLE_NPAGE_ONE + (region - 1) * HASHTABLE_NPAGE
    };
    (region as usize, zero)
}

/// A mapped 32 KiB wal-index region, accessed word by word with atomics:
/// the memory is shared with SQLite connections in this and other
/// processes, which read it concurrently.
#[derive(Debug, Clone, Copy)]
pub struct Region {
    base: *mut u8,
    index: usize,
}

// SAFETY: a Region is a pointer into a shared mapping that outlives it (the
// owner keeps the mapping connection open); all access is atomic.
unsafe impl Send for Region {}

impl Region {
    /// # Safety
    /// `base` must point to a mapped, 8-byte aligned region of
    /// [`REGION_BYTES`] that stays mapped for the Region's lifetime, and
    /// `index` must be its region number.
    pub unsafe fn new(base: *mut u8, index: usize) -> Region {
        Region { base, index }
    }

    fn u32_at(&self, byte_offset: usize) -> &AtomicU32 {
        assert!(byte_offset % 4 == 0 && byte_offset + 4 <= REGION_BYTES);
        // SAFETY: in bounds and aligned (checked above, base is aligned per
        // `new`'s contract); AtomicU32 has u32's layout; the mapping lives
        // as long as self.
        unsafe { &*(self.base.add(byte_offset).cast::<AtomicU32>()) }
    }

    fn u16_at(&self, byte_offset: usize) -> &AtomicU16 {
        assert!(byte_offset % 2 == 0 && byte_offset + 2 <= REGION_BYTES);
        // SAFETY: as for u32_at.
        unsafe { &*(self.base.add(byte_offset).cast::<AtomicU16>()) }
    }

    fn pgno_base(&self) -> usize {
        if self.index == 0 {
            INDEX_HEADER_BYTES
        } else {
            0
        }
    }

    fn hash_slot(&self, slot: usize) -> &AtomicU16 {
        self.u16_at(HASHTABLE_NPAGE as usize * 4 + slot * 2)
    }

    fn pgno(&self, idx0: usize) -> &AtomicU32 {
        self.u32_at(self.pgno_base() + idx0 * 4)
    }

    /// Records that frame `frame` (which must live in this region, whose
    /// first frame is `zero + 1`) holds page `pgno`, as `walIndexAppend`.
    pub fn append(&self, frame: u32, zero: u32, pgno: u32) -> Result<(), IndexError> {
        let idx = (frame - zero) as usize; // 1-based
        let capacity = if self.index == 0 {
            HASHTABLE_NPAGE_ONE
        } else {
            HASHTABLE_NPAGE
        };
        if idx == 0 || idx > capacity as usize {
            return Err(IndexError::FrameOutsideRegion { frame });
        }
        if idx == 1 {
            self.clear_from(0);
        } else if self.pgno(idx - 1).load(Ordering::Relaxed) != 0 {
            // Leftovers of frames discarded without cleanup: drop them.
            self.clear_from(idx - 1);
        }
        self.pgno(idx - 1).store(pgno, Ordering::Relaxed);
        let mut key = (pgno.wrapping_mul(HASHTABLE_HASH_1) as usize) & (HASHTABLE_NSLOT - 1);
        for _ in 0..=idx {
            let slot = self.hash_slot(key);
            if slot.load(Ordering::Relaxed) == 0 {
                slot.store(idx as u16, Ordering::Relaxed);
                return Ok(());
            }
            key = (key + 1) & (HASHTABLE_NSLOT - 1);
        }
        Err(IndexError::HashFull { frame })
    }

    /// Removes every entry for index positions `>= keep` (0-based count of
    /// entries to keep), as `walCleanupHash`.
    pub fn clear_from(&self, keep: usize) {
        for slot in 0..HASHTABLE_NSLOT {
            let s = self.hash_slot(slot);
            if s.load(Ordering::Relaxed) as usize > keep {
                s.store(0, Ordering::Relaxed);
            }
        }
        let capacity = if self.index == 0 {
            HASHTABLE_NPAGE_ONE
        } else {
            HASHTABLE_NPAGE
        };
        for i in keep..capacity as usize {
            self.pgno(i).store(0, Ordering::Relaxed);
        }
    }

    /// Reads header copy `copy` (0 or 1) of region 0.
    pub fn read_header_words(&self, copy: usize) -> [u32; 12] {
        assert_eq!(self.index, 0);
        std::array::from_fn(|i| {
            self.u32_at(copy * HEADER_BYTES + i * 4)
                .load(Ordering::Relaxed)
        })
    }

    /// Publishes a header as SQLite's `walIndexWriteHdr`: copy 1, barrier,
    /// copy 0, so a reader that sees copy 0 match copy 1 sees all of it, and
    /// every index entry written before the call.
    pub fn publish_header(&self, h: &IndexHeader) {
        assert_eq!(self.index, 0);
        let w = h.to_words();
        fence(Ordering::SeqCst);
        for (i, word) in w.iter().enumerate() {
            self.u32_at(HEADER_BYTES + i * 4)
                .store(*word, Ordering::Relaxed);
        }
        fence(Ordering::SeqCst);
        for (i, word) in w.iter().enumerate() {
            self.u32_at(i * 4).store(*word, Ordering::Relaxed);
        }
        fence(Ordering::SeqCst);
    }

    pub fn backfilled(&self) -> u32 {
        self.u32_at(CKPT_INFO_OFFSET).load(Ordering::SeqCst)
    }

    /// Resets the checkpoint info for a new WAL generation, as
    /// `walRestartHdr` (the caller holds the write lock and read locks 1..).
    pub fn reset_checkpoint_info(&self) {
        self.u32_at(CKPT_INFO_OFFSET).store(0, Ordering::SeqCst);
        self.u32_at(128).store(0, Ordering::SeqCst); // nBackfillAttempted
        self.u32_at(CKPT_INFO_OFFSET + 4 + 4)
            .store(0, Ordering::SeqCst); // aReadMark[1]
        for i in 2..WAL_NREADER {
            self.u32_at(CKPT_INFO_OFFSET + 4 + 4 * i)
                .store(READMARK_NOT_USED, Ordering::SeqCst);
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IndexError {
    #[error("frame {frame} does not belong to this wal-index region")]
    FrameOutsideRegion { frame: u32 },
    #[error("wal-index hash table full at frame {frame}")]
    HashFull { frame: u32 },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_through_their_native_words() {
        let h = IndexHeader {
            change: 7,
            big_endian_checksums: false,
            page_size: 65536,
            max_frame: 12,
            db_pages: 9,
            frame_checksum: Checksum(1, 2),
            salt_bytes: [1, 2, 3, 4, 5, 6, 7, 8],
        };
        assert_eq!(IndexHeader::from_words(&h.to_words()), Some(h));
        let mut w = h.to_words();
        w[4] += 1;
        assert_eq!(
            IndexHeader::from_words(&w),
            None,
            "checksum guards the header"
        );
    }

    #[test]
    fn frames_map_to_regions_as_sqlite_lays_them_out() {
        assert_eq!(region_of(1), (0, 0));
        assert_eq!(region_of(4062), (0, 0));
        assert_eq!(region_of(4063), (1, 4062));
        assert_eq!(region_of(4062 + 4096), (1, 4062));
        assert_eq!(region_of(4062 + 4096 + 1), (2, 4062 + 4096));
    }

    #[test]
    fn appended_frames_are_found_by_hash_and_cleared_beyond_a_point() {
        let mut mem = vec![0u64; REGION_BYTES / 8];
        // SAFETY: `mem` is 8-byte aligned, REGION_BYTES long and outlives `r`.
        let r = unsafe { Region::new(mem.as_mut_ptr().cast(), 1) };
        let zero = 4062;
        for (i, pgno) in [5u32, 5 + 8192 / 383 * 383, 17].iter().enumerate() {
            r.append(zero + 1 + i as u32, zero, *pgno).expect("append");
        }
        let slots: Vec<u16> = (0..HASHTABLE_NSLOT)
            .map(|s| r.hash_slot(s).load(Ordering::Relaxed))
            .filter(|&v| v != 0)
            .collect();
        assert_eq!(slots.len(), 3);
        r.clear_from(1);
        let left: Vec<u16> = (0..HASHTABLE_NSLOT)
            .map(|s| r.hash_slot(s).load(Ordering::Relaxed))
            .filter(|&v| v != 0)
            .collect();
        assert_eq!(left, vec![1]);
        assert_eq!(r.pgno(0).load(Ordering::Relaxed), 5);
        assert_eq!(r.pgno(1).load(Ordering::Relaxed), 0);
    }
}
