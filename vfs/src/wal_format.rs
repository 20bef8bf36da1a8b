//! The SQLite WAL file format: the one place walrelay reads or writes it.
//!
//! All multi-byte fields are big-endian. Checksum words are read in the byte
//! order named by the magic number's low bit, which is independent of the
//! field order.
//!
//! ```text
//! WAL header (32 bytes, at offset 0)
//!  0       4       8       12      16      20      24      28      32
//!  +-------+-------+-------+-------+-------+-------+-------+-------+
//!  | magic |version| page  | ckpt  | salt1 | salt2 | cksum1| cksum2|
//!  |377f068x 3007000| size  | seqno |       |       |  over bytes 0..24
//!  +-------+-------+-------+-------+-------+-------+-------+-------+
//!   magic = 0x377f0682 | big_endian_checksums
//!
//! Frame i (1-based) at 32 + (i - 1) * (24 + page_size)
//!  0       4       8       12      16      20      24         24+page_size
//!  +-------+-------+-------+-------+-------+-------+--------- ... -+
//!  | page  | db    | salt1 | salt2 | cksum1| cksum2| page image    |
//!  | no    | size* |  (must equal header)  | cumulative            |
//!  +-------+-------+-------+-------+-------+-------+--------- ... -+
//!   * db size in pages after commit on a commit frame, 0 otherwise
//! ```
//!
//! A frame is valid iff its salts equal the header's and its checksum equals
//! the running checksum: seeded by the previous frame's (or the header's for
//! frame 1), extended over frame-header bytes 0..8 and then the page.

use crate::page_set::{FrameNo, PageNo};

/// Size of the WAL file header.
pub const WAL_HEADER_BYTES: usize = 32;
/// Size of each frame header.
pub const FRAME_HEADER_BYTES: usize = 24;
/// WAL magic with little-endian checksum words; `| 1` means big-endian.
pub const WAL_MAGIC: u32 = 0x377f_0682;
/// The only WAL format version SQLite has ever written.
pub const WAL_VERSION: u32 = 3_007_000;
/// SQLite's page size bounds; anything else in a header is corruption.
pub const MIN_PAGE_SIZE: u32 = 512;
pub const MAX_PAGE_SIZE: u32 = 65_536;

/// Why a WAL header or frame was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WalFormatError {
    #[error("WAL header is {len} bytes, expected {WAL_HEADER_BYTES}")]
    ShortHeader { len: usize },
    #[error("WAL header has bad magic {magic:#010x}")]
    BadMagic { magic: u32 },
    #[error("WAL header has unsupported version {version}")]
    BadVersion { version: u32 },
    #[error("WAL header has invalid page size {page_size}")]
    BadPageSize { page_size: u32 },
    #[error("WAL header checksum mismatch")]
    HeaderChecksum,
    #[error("frame {frame} salts do not match the WAL header")]
    FrameSalt { frame: FrameNo },
    #[error("frame {frame} checksum breaks the chain")]
    FrameChecksum { frame: FrameNo },
    #[error("frame {frame} has page number 0")]
    ZeroPageNo { frame: FrameNo },
}

/// A running WAL checksum (the pair SQLite stores in headers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Checksum(pub u32, pub u32);

/// `M^(2^k)` for the checksum's step matrix `M = [[1, 1], [1, 2]]`
/// (wrapping u32 arithmetic), k = 0..16: enough for any page size.
const STEP_POWERS: [[u32; 4]; 17] = {
    let mut t = [[0u32; 4]; 17];
    t[0] = [1, 1, 1, 2];
    let mut k = 1;
    while k < 17 {
        t[k] = mat_mul(t[k - 1], t[k - 1]);
        k += 1;
    }
    t
};

/// 2x2 matrix product, row-major `[a, b, c, d]`, wrapping.
const fn mat_mul(x: [u32; 4], y: [u32; 4]) -> [u32; 4] {
    [
        x[0].wrapping_mul(y[0])
            .wrapping_add(x[1].wrapping_mul(y[2])),
        x[0].wrapping_mul(y[1])
            .wrapping_add(x[1].wrapping_mul(y[3])),
        x[2].wrapping_mul(y[0])
            .wrapping_add(x[3].wrapping_mul(y[2])),
        x[2].wrapping_mul(y[1])
            .wrapping_add(x[3].wrapping_mul(y[3])),
    ]
}

/// The two checksum words of an 8-byte pair, in the order the WAL header
/// names (one 8-byte load instead of eight byte loads).
#[inline(always)]
fn pair<const BE: bool>(p: &[u8]) -> (u32, u32) {
    let mut a = [0u8; 8];
    a.copy_from_slice(p);
    if BE {
        let v = u64::from_be_bytes(a);
        ((v >> 32) as u32, v as u32)
    } else {
        let v = u64::from_le_bytes(a);
        (v as u32, (v >> 32) as u32)
    }
}

/// The checksums of four equal quarters, each from a zero state: four
/// independent chains the CPU can overlap (the portable path).
fn quarter_sums<const BE: bool>(d: [&[u8]; 4]) -> [(u32, u32); 4] {
    let (mut a1, mut a2, mut b1, mut b2) = (0u32, 0u32, 0u32, 0u32);
    let (mut c1, mut c2, mut e1, mut e2) = (0u32, 0u32, 0u32, 0u32);
    let quarters = d[0].chunks_exact(8).zip(d[1].chunks_exact(8));
    let quarters = quarters.zip(d[2].chunks_exact(8).zip(d[3].chunks_exact(8)));
    for ((p0, p1), (p2, p3)) in quarters {
        let (w0, w1, w2, w3) = (
            pair::<BE>(p0),
            pair::<BE>(p1),
            pair::<BE>(p2),
            pair::<BE>(p3),
        );
        a1 = a1.wrapping_add(w0.0).wrapping_add(a2);
        b1 = b1.wrapping_add(w1.0).wrapping_add(b2);
        c1 = c1.wrapping_add(w2.0).wrapping_add(c2);
        e1 = e1.wrapping_add(w3.0).wrapping_add(e2);
        a2 = a2.wrapping_add(w0.1).wrapping_add(a1);
        b2 = b2.wrapping_add(w1.1).wrapping_add(b1);
        c2 = c2.wrapping_add(w2.1).wrapping_add(c1);
        e2 = e2.wrapping_add(w3.1).wrapping_add(e1);
    }
    [(a1, a2), (b1, b2), (c1, c2), (e1, e2)]
}

/// Eight chains in the lanes of two pairs of SSE2 registers (baseline on
/// x86_64), for little-endian checksum words, which x86 loads natively.
/// Each step loads 16 bytes (two pairs) from every segment and transposes
/// them so one vector holds the same word of four segments; two register
/// sets keep two dependency chains in flight.
#[cfg(target_arch = "x86_64")]
fn eighth_sums_sse2(d: [&[u8]; 8]) -> [(u32, u32); 8] {
    use std::arch::x86_64::{
        __m128i, _mm_add_epi32, _mm_loadu_si128, _mm_setzero_si128, _mm_storeu_si128,
        _mm_unpackhi_epi32, _mm_unpackhi_epi64, _mm_unpacklo_epi32, _mm_unpacklo_epi64,
    };
    let len = d[0].len();
    assert!(
        d.iter().all(|q| q.len() == len) && len % 16 == 0,
        "equal 16-byte segments"
    );
    // SAFETY: SSE2 is part of the x86_64 baseline, so these intrinsics are
    // always available; every load reads 16 bytes at offset `i` of a slice
    // whose length is a multiple of 16 and greater than `i` (checked above),
    // so it stays in bounds; unaligned loads/stores are used throughout.
    unsafe {
        let load = |q: &[u8], i: usize| _mm_loadu_si128(q.as_ptr().add(i).cast::<__m128i>());
        let z = _mm_setzero_si128();
        let (mut s1, mut s2, mut u1, mut u2) = (z, z, z, z);
        let mut i = 0;
        while i < len {
            let (l0, l1, l2, l3) = (load(d[0], i), load(d[1], i), load(d[2], i), load(d[3], i));
            let (m0, m1, m2, m3) = (load(d[4], i), load(d[5], i), load(d[6], i), load(d[7], i));
            let t0 = _mm_unpacklo_epi32(l0, l1);
            let t1 = _mm_unpacklo_epi32(l2, l3);
            let t2 = _mm_unpackhi_epi32(l0, l1);
            let t3 = _mm_unpackhi_epi32(l2, l3);
            let r0 = _mm_unpacklo_epi32(m0, m1);
            let r1 = _mm_unpacklo_epi32(m2, m3);
            let r2 = _mm_unpackhi_epi32(m0, m1);
            let r3 = _mm_unpackhi_epi32(m2, m3);
            s1 = _mm_add_epi32(_mm_add_epi32(s1, _mm_unpacklo_epi64(t0, t1)), s2);
            u1 = _mm_add_epi32(_mm_add_epi32(u1, _mm_unpacklo_epi64(r0, r1)), u2);
            s2 = _mm_add_epi32(_mm_add_epi32(s2, _mm_unpackhi_epi64(t0, t1)), s1);
            u2 = _mm_add_epi32(_mm_add_epi32(u2, _mm_unpackhi_epi64(r0, r1)), u1);
            s1 = _mm_add_epi32(_mm_add_epi32(s1, _mm_unpacklo_epi64(t2, t3)), s2);
            u1 = _mm_add_epi32(_mm_add_epi32(u1, _mm_unpacklo_epi64(r2, r3)), u2);
            s2 = _mm_add_epi32(_mm_add_epi32(s2, _mm_unpackhi_epi64(t2, t3)), s1);
            u2 = _mm_add_epi32(_mm_add_epi32(u2, _mm_unpackhi_epi64(r2, r3)), u1);
            i += 16;
        }
        let mut x = [[0u32; 4]; 4];
        for (dst, v) in x.iter_mut().zip([s1, s2, u1, u2]) {
            _mm_storeu_si128(dst.as_mut_ptr().cast::<__m128i>(), v);
        }
        std::array::from_fn(|k| {
            if k < 4 {
                (x[0][k], x[1][k])
            } else {
                (x[2][k - 4], x[3][k - 4])
            }
        })
    }
}

/// Folds segment checksums (each from a zero state, each `seg_pairs`
/// pairs long, a power of two) onto `start`.
fn fold(start: Checksum, seg_pairs: usize, sums: &[(u32, u32)]) -> Checksum {
    let m = STEP_POWERS[seg_pairs.trailing_zeros() as usize];
    let (mut s1, mut s2) = (start.0, start.1);
    for &(x1, x2) in sums {
        let t1 = m[0].wrapping_mul(s1).wrapping_add(m[1].wrapping_mul(s2));
        let t2 = m[2].wrapping_mul(s1).wrapping_add(m[3].wrapping_mul(s2));
        s1 = t1.wrapping_add(x1);
        s2 = t2.wrapping_add(x2);
    }
    Checksum(s1, s2)
}

impl Checksum {
    /// Extends the checksum over `data` (length a multiple of 8), reading words
    /// in the order the WAL header names.
    pub fn extend(self, big_endian: bool, data: &[u8]) -> Checksum {
        debug_assert!(
            data.len() % 8 == 0,
            "WAL checksums cover whole 8-byte words"
        );
        if big_endian {
            self.extend_as::<true>(data)
        } else {
            self.extend_as::<false>(data)
        }
    }

    /// One step is affine: `(s1, s2) <- M (s1, s2) + (a, a + b)` with
    /// `M = [[1, 1], [1, 2]]`, so `n` steps from state `S` give
    /// `M^n S + (the same steps from zero)`. A page is therefore cut into
    /// equal contiguous segments checksummed from zero as independent chains
    /// (eight SIMD lanes on x86_64, four scalar chains elsewhere) and folded
    /// with `M^segment`: the same result as SQLite's serial loop, in a
    /// fraction of the cycles.
    fn extend_as<const BE: bool>(self, data: &[u8]) -> Checksum {
        let pairs = data.len() / 8;
        if pairs < 64 || !pairs.is_power_of_two() {
            return self.serial::<BE>(data);
        }
        #[cfg(target_arch = "x86_64")]
        if !BE {
            let e = data.len() / 8;
            let seg: [&[u8]; 8] = std::array::from_fn(|k| &data[k * e..(k + 1) * e]);
            return fold(self, pairs / 8, &eighth_sums_sse2(seg));
        }
        let q = data.len() / 4;
        let seg: [&[u8]; 4] = std::array::from_fn(|k| &data[k * q..(k + 1) * q]);
        fold(self, pairs / 4, &quarter_sums::<BE>(seg))
    }

    fn serial<const BE: bool>(self, data: &[u8]) -> Checksum {
        let (mut s1, mut s2) = (self.0, self.1);
        for p in data.chunks_exact(8) {
            let (a, b) = pair::<BE>(p);
            s1 = s1.wrapping_add(a).wrapping_add(s2);
            s2 = s2.wrapping_add(b).wrapping_add(s1);
        }
        Checksum(s1, s2)
    }

    /// The checksum exactly as SQLite's `walChecksumBytes` computes it, one
    /// pair at a time: the reference the fast path is tested against.
    pub fn extend_serial(self, big_endian: bool, data: &[u8]) -> Checksum {
        if big_endian {
            self.serial::<true>(data)
        } else {
            self.serial::<false>(data)
        }
    }
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn put_be32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

/// A parsed, validated WAL header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WalHeader {
    pub big_endian_checksums: bool,
    pub page_size: u32,
    pub checkpoint_seq: u32,
    pub salt: [u32; 2],
    pub checksum: Checksum,
}

impl WalHeader {
    /// Parses and validates the 32-byte header.
    pub fn decode(bytes: &[u8]) -> Result<WalHeader, WalFormatError> {
        if bytes.len() < WAL_HEADER_BYTES {
            return Err(WalFormatError::ShortHeader { len: bytes.len() });
        }
        let magic = be32(bytes, 0);
        if magic & !1 != WAL_MAGIC {
            return Err(WalFormatError::BadMagic { magic });
        }
        let version = be32(bytes, 4);
        if version != WAL_VERSION {
            return Err(WalFormatError::BadVersion { version });
        }
        let page_size = be32(bytes, 8);
        if !(MIN_PAGE_SIZE..=MAX_PAGE_SIZE).contains(&page_size) || !page_size.is_power_of_two() {
            return Err(WalFormatError::BadPageSize { page_size });
        }
        let big_endian_checksums = magic & 1 == 1;
        let checksum = Checksum(be32(bytes, 24), be32(bytes, 28));
        if Checksum::default().extend(big_endian_checksums, &bytes[..24]) != checksum {
            return Err(WalFormatError::HeaderChecksum);
        }
        Ok(WalHeader {
            big_endian_checksums,
            page_size,
            checkpoint_seq: be32(bytes, 12),
            salt: [be32(bytes, 16), be32(bytes, 20)],
            checksum,
        })
    }

    /// Encodes a header with a freshly computed checksum. Writers pass
    /// `big_endian_checksums = cfg!(target_endian = "big")` so the checksum
    /// loop reads native words, as SQLite does.
    pub fn encode(
        big_endian_checksums: bool,
        page_size: u32,
        checkpoint_seq: u32,
        salt: [u32; 2],
    ) -> [u8; WAL_HEADER_BYTES] {
        let mut b = [0u8; WAL_HEADER_BYTES];
        put_be32(&mut b, 0, WAL_MAGIC | u32::from(big_endian_checksums));
        put_be32(&mut b, 4, WAL_VERSION);
        put_be32(&mut b, 8, page_size);
        put_be32(&mut b, 12, checkpoint_seq);
        put_be32(&mut b, 16, salt[0]);
        put_be32(&mut b, 20, salt[1]);
        let ck = Checksum::default().extend(big_endian_checksums, &b[..24]);
        put_be32(&mut b, 24, ck.0);
        put_be32(&mut b, 28, ck.1);
        b
    }

    /// Bytes one frame occupies in the file.
    pub fn frame_bytes(&self) -> u64 {
        frame_bytes(self.page_size)
    }
}

/// Bytes one frame occupies for a given page size.
pub fn frame_bytes(page_size: u32) -> u64 {
    FRAME_HEADER_BYTES as u64 + u64::from(page_size)
}

/// File offset of frame `frame` (1-based).
pub fn frame_offset(page_size: u32, frame: FrameNo) -> u64 {
    debug_assert!(frame.get() >= 1);
    WAL_HEADER_BYTES as u64 + (u64::from(frame.get()) - 1) * frame_bytes(page_size)
}

/// The frame containing file offset `offset` (which must be past the header).
pub fn frame_at(page_size: u32, offset: u64) -> FrameNo {
    debug_assert!(offset >= WAL_HEADER_BYTES as u64);
    let idx = (offset - WAL_HEADER_BYTES as u64) / frame_bytes(page_size);
    // WAL files are bounded far below 2^32 frames by SQLite itself.
    FrameNo::new(u32::try_from(idx + 1).unwrap_or(u32::MAX))
}

/// The fields of one frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub page_no: u32,
    /// Database size in pages after commit; 0 on a non-commit frame.
    pub commit_db_pages: u32,
    pub salt: [u32; 2],
    pub checksum: Checksum,
}

impl FrameHeader {
    /// Reads the header fields without validating them.
    pub fn decode(bytes: &[u8; FRAME_HEADER_BYTES]) -> FrameHeader {
        FrameHeader {
            page_no: be32(bytes, 0),
            commit_db_pages: be32(bytes, 4),
            salt: [be32(bytes, 8), be32(bytes, 12)],
            checksum: Checksum(be32(bytes, 16), be32(bytes, 20)),
        }
    }

    pub fn is_commit(&self) -> bool {
        self.commit_db_pages != 0
    }

    /// Validates a frame (header + page) against the WAL header and the
    /// checksum of the frame before it; returns this frame's checksum.
    pub fn validate(
        &self,
        wal: &WalHeader,
        frame: FrameNo,
        prev: Checksum,
        header_bytes: &[u8],
        page: &[u8],
    ) -> Result<Checksum, WalFormatError> {
        if self.salt != wal.salt {
            return Err(WalFormatError::FrameSalt { frame });
        }
        if self.page_no == 0 {
            return Err(WalFormatError::ZeroPageNo { frame });
        }
        let be = wal.big_endian_checksums;
        let ck = prev.extend(be, &header_bytes[..8]).extend(be, page);
        if ck != self.checksum {
            return Err(WalFormatError::FrameChecksum { frame });
        }
        Ok(ck)
    }

    /// Encodes a frame header, computing its checksum from `prev` and `page`.
    pub fn encode(
        wal: &WalHeader,
        page_no: PageNo,
        commit_db_pages: u32,
        prev: Checksum,
        page: &[u8],
    ) -> ([u8; FRAME_HEADER_BYTES], Checksum) {
        let mut b = [0u8; FRAME_HEADER_BYTES];
        put_be32(&mut b, 0, page_no.get());
        put_be32(&mut b, 4, commit_db_pages);
        put_be32(&mut b, 8, wal.salt[0]);
        put_be32(&mut b, 12, wal.salt[1]);
        let be = wal.big_endian_checksums;
        let ck = prev.extend(be, &b[..8]).extend(be, page);
        put_be32(&mut b, 16, ck.0);
        put_be32(&mut b, 20, ck.1);
        (b, ck)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> WalHeader {
        WalHeader::decode(&WalHeader::encode(false, 4096, 7, [0xdead_beef, 42])).expect("valid")
    }

    #[test]
    fn header_round_trips_and_validates_its_checksum() {
        let h = header();
        assert_eq!(h.page_size, 4096);
        assert_eq!(h.checkpoint_seq, 7);
        assert_eq!(h.salt, [0xdead_beef, 42]);
        let mut bytes = WalHeader::encode(true, 512, 0, [1, 2]);
        assert!(
            WalHeader::decode(&bytes)
                .expect("valid")
                .big_endian_checksums
        );
        bytes[13] ^= 1;
        assert_eq!(
            WalHeader::decode(&bytes),
            Err(WalFormatError::HeaderChecksum)
        );
    }

    #[test]
    fn header_rejects_bad_magic_version_and_page_size() {
        let mut b = WalHeader::encode(false, 4096, 0, [1, 2]);
        b[0] = 0;
        assert!(matches!(
            WalHeader::decode(&b),
            Err(WalFormatError::BadMagic { .. })
        ));
        let mut b = WalHeader::encode(false, 4096, 0, [1, 2]);
        b[7] ^= 1;
        assert!(matches!(
            WalHeader::decode(&b),
            Err(WalFormatError::BadVersion { .. })
        ));
        let b = WalHeader::encode(false, 3000, 0, [1, 2]);
        assert!(matches!(
            WalHeader::decode(&b),
            Err(WalFormatError::BadPageSize { .. })
        ));
        assert!(matches!(
            WalHeader::decode(&b[..10]),
            Err(WalFormatError::ShortHeader { .. })
        ));
    }

    #[test]
    fn frames_chain_and_any_flipped_bit_breaks_the_chain() {
        let h = header();
        let page = vec![7u8; 4096];
        let (b1, c1) = FrameHeader::encode(&h, PageNo::new(1), 0, h.checksum, &page);
        let (b2, c2) = FrameHeader::encode(&h, PageNo::new(2), 2, c1, &page);
        let f1 = FrameHeader::decode(&b1);
        let f2 = FrameHeader::decode(&b2);
        assert_eq!(
            f1.validate(&h, FrameNo::new(1), h.checksum, &b1, &page),
            Ok(c1)
        );
        assert_eq!(f2.validate(&h, FrameNo::new(2), c1, &b2, &page), Ok(c2));
        assert!(f2.is_commit() && !f1.is_commit());
        let mut bad = page.clone();
        bad[100] ^= 0x10;
        assert_eq!(
            f2.validate(&h, FrameNo::new(2), c1, &b2, &bad),
            Err(WalFormatError::FrameChecksum {
                frame: FrameNo::new(2)
            })
        );
    }

    #[test]
    fn the_four_chain_checksum_equals_sqlites_serial_loop() {
        let mut x = 0x1234_5678_9abc_def0u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for len in [8usize, 24, 256, 512, 1024, 4096, 4104, 8192, 65_536] {
            let data: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            for be in [false, true] {
                let seed = Checksum(next() as u32, next() as u32);
                assert_eq!(
                    seed.extend(be, &data),
                    seed.extend_serial(be, &data),
                    "len {len} big_endian {be}"
                );
            }
        }
    }

    #[test]
    fn frame_offsets_map_back_to_their_frame() {
        for ps in [512u32, 4096, 65536] {
            for f in 1..50u32 {
                let off = frame_offset(ps, FrameNo::new(f));
                assert_eq!(frame_at(ps, off), FrameNo::new(f));
                assert_eq!(frame_at(ps, off + frame_bytes(ps) - 1), FrameNo::new(f));
            }
        }
    }
}
