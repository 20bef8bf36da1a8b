//! A snapshot: the database's pages at one bookmark, stored as parts of
//! up to [`PART_RAW_BYTES`] of pages each, so parts upload and restore
//! in parallel and no process holds a whole database in memory. This
//! module is the only place that reads or writes a part.
//!
//! ```text
//! snapshot part (big-endian)
//!   0  magic       b"WRSNAPP1"                                 8
//!   8  version     u16 (1), flags u16 (0)                       4
//!  12  database    u64                                          8
//!  20  bookmark    the snapshot's bookmark                     12
//!  32  chain       the chain at that bookmark                  16
//!  48  commit_us   u64: its commit time                         8
//!  56  page_size   u32                                          4
//!  60  db_pages    u32: the database's size in pages            4
//!  64  part        u32, parts u32                               8
//!  72  first_page  u32 (1-based), page_count u32                8
//!  80  zlen        u64: bytes of the zstd frame                 8
//!  88  frame       one zstd frame (level 3) of page_count pages
//!                  in page order, page_size bytes each
//!  ..  digest      BLAKE3-256 over every byte before it        32
//! ```
//!
//! Part `i` holds pages `i * pages_per_part + 1 ..` up to `db_pages`; a
//! database of 0 pages has one empty part. Every part repeats the whole
//! snapshot's identity, so a part of another snapshot is refused, never
//! mixed in. The identity is the history's chain at the bookmark, which
//! names the whole history up to it; `database` is the database the
//! snapshot was first cut for (a fork reuses its origin's parts as they
//! are, so it is informational). The manifest keeps a digest over the
//! parts' digests, so a part replaced by another valid one is refused too.

use crate::codec::{self, Put, Reader};
use crate::error::FormatError;
use walrelay_replicator::{Bookmark, ChainHash, DatabaseId};

const MAGIC: &[u8; 8] = b"WRSNAPP1";
const VERSION: u16 = 1;
const HEADER_BYTES: usize = 88;
const WHAT: &str = "snapshot part";
/// Raw page bytes per part.
pub const PART_RAW_BYTES: u64 = 16 << 20;

/// What identifies a snapshot (every part carries it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotId {
    pub database: DatabaseId,
    pub bookmark: Bookmark,
    pub chain: ChainHash,
    pub commit_us: u64,
    pub page_size: u32,
    pub db_pages: u32,
}

impl SnapshotId {
    pub fn pages_per_part(&self) -> u32 {
        (PART_RAW_BYTES / u64::from(self.page_size.max(1))).max(1) as u32
    }

    pub fn parts(&self) -> u32 {
        self.db_pages.div_ceil(self.pages_per_part()).max(1)
    }

    /// The pages part `part` holds: (first page, count).
    pub fn part_pages(&self, part: u32) -> (u32, u32) {
        let per = self.pages_per_part();
        let first = part.saturating_mul(per).saturating_add(1);
        let count = self.db_pages.saturating_sub(first - 1).min(per);
        (first, count)
    }
}

/// One decoded part.
#[derive(Debug, Clone)]
pub struct Part {
    pub id: SnapshotId,
    pub part: u32,
    pub first_page: u32,
    /// `page_count * page_size` bytes.
    pub pages: Vec<u8>,
}

/// Encodes part `part` of `id` from its pages (`count * page_size` bytes).
pub fn encode_part(id: &SnapshotId, part: u32, pages: &[u8]) -> Result<Vec<u8>, FormatError> {
    let (_, count) = id.part_pages(part);
    if part >= id.parts() || pages.len() as u64 != u64::from(count) * u64::from(id.page_size) {
        return Err(invalid("part pages do not match the snapshot"));
    }
    Ok(seal_part(id, part, &codec::zstd(pages, WHAT)?))
}

/// Part `part` of `to`, from part `part` of `from` holding the same pages:
/// the compressed frame is carried over as it is, under `to`'s header.
/// `from`'s part is checked as [`decode_part`] checks it, except that its
/// frame is not decompressed (it was checked when it was first written,
/// and a restore decompresses it). The caller vouches that the pages did
/// not change between the two snapshots; the page ranges must match.
pub fn reframe_part(
    object: &[u8],
    from: &SnapshotId,
    part: u32,
    to: &SnapshotId,
) -> Result<Vec<u8>, FormatError> {
    if part >= to.parts()
        || from.page_size != to.page_size
        || from.part_pages(part) != to.part_pages(part)
    {
        return Err(invalid("the part holds other pages in the new snapshot"));
    }
    let (_, _, frame) = read_part(object, from, part)?;
    Ok(seal_part(to, part, frame))
}

/// Part `part` of `id` around its compressed frame.
fn seal_part(id: &SnapshotId, part: u32, frame: &[u8]) -> Vec<u8> {
    let (first, count) = id.part_pages(part);
    let mut out = codec::begin(
        MAGIC,
        VERSION,
        id.database.0,
        HEADER_BYTES + frame.len() + codec::DIGEST_BYTES,
    );
    out.bookmark(id.bookmark);
    out.chain(id.chain);
    out.extend_from_slice(&id.commit_us.to_be_bytes());
    out.extend_from_slice(&id.page_size.to_be_bytes());
    out.extend_from_slice(&id.db_pages.to_be_bytes());
    out.extend_from_slice(&part.to_be_bytes());
    out.extend_from_slice(&id.parts().to_be_bytes());
    out.extend_from_slice(&first.to_be_bytes());
    out.extend_from_slice(&count.to_be_bytes());
    out.extend_from_slice(&(frame.len() as u64).to_be_bytes());
    debug_assert_eq!(out.len(), HEADER_BYTES);
    out.extend_from_slice(frame);
    codec::seal(out)
}

/// The digest an encoded part ends with (what the manifest's snapshot
/// digest is built from).
pub fn part_digest(object: &[u8]) -> [u8; 32] {
    let mut d = [0u8; 32];
    if object.len() >= 32 {
        d.copy_from_slice(&object[object.len() - 32..]);
    }
    d
}

/// The digest over a snapshot's part digests, in part order.
pub fn snapshot_digest(part_digests: &[[u8; 32]]) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    for d in part_digests {
        h.update(d);
    }
    *h.finalize().as_bytes()
}

/// Decodes a part, checking it belongs to `expected` and is part `part`.
pub fn decode_part(object: &[u8], expected: &SnapshotId, part: u32) -> Result<Part, FormatError> {
    let (id, (first, count), frame) = read_part(object, expected, part)?;
    let raw_len = u64::from(count) * u64::from(id.page_size);
    let pages = codec::unzstd(frame, raw_len, PART_RAW_BYTES.max(65536), WHAT)?;
    Ok(Part {
        id,
        part,
        first_page: first,
        pages,
    })
}

/// A part's identity as it carries it, its page range and its compressed
/// frame.
type PartView<'a> = (SnapshotId, (u32, u32), &'a [u8]);

/// Checks a part's digest and header against `expected` and part `part`.
fn read_part<'a>(
    object: &'a [u8],
    expected: &SnapshotId,
    part: u32,
) -> Result<PartView<'a>, FormatError> {
    let body = codec::check_digest(object, WHAT)?;
    let mut r = Reader::new(body, WHAT);
    r.header(MAGIC, VERSION)?;
    let id = SnapshotId {
        database: DatabaseId(r.u64()?),
        bookmark: r.bookmark()?,
        chain: r.chain()?,
        commit_us: r.u64()?,
        page_size: r.u32()?,
        db_pages: r.u32()?,
    };
    let (at, parts) = (r.u32()?, r.u32()?);
    let (first, count) = (r.u32()?, r.u32()?);
    let zlen = r.u64()?;
    let same = SnapshotId {
        database: expected.database,
        ..id
    } == *expected;
    if !same || at != part || parts != expected.parts() {
        return Err(invalid("the part belongs to another snapshot"));
    }
    if (first, count) != expected.part_pages(part) {
        return Err(invalid("the part's page range is wrong"));
    }
    let frame = r.take(usize::try_from(zlen).map_err(|_| invalid("frame length"))?)?;
    if r.position() != body.len() {
        return Err(invalid("bytes after the frame"));
    }
    Ok((id, (first, count), frame))
}

fn invalid(why: &'static str) -> FormatError {
    FormatError::Invalid { what: WHAT, why }
}

#[cfg(test)]
mod tests {
    use super::*;
    use walrelay_replicator::{Epoch, Sequence};

    fn id(db_pages: u32) -> SnapshotId {
        SnapshotId {
            database: DatabaseId(1),
            bookmark: Bookmark::new(Epoch(1), Sequence(5)),
            chain: ChainHash::from_bytes([7; 16]),
            commit_us: 99,
            page_size: 4096,
            db_pages,
        }
    }

    #[test]
    fn parts_cover_every_page_once() {
        let s = id(4096 * 2 + 3);
        let mut next = 1;
        for p in 0..s.parts() {
            let (first, count) = s.part_pages(p);
            assert_eq!(first, next);
            next += count;
        }
        assert_eq!(next, s.db_pages + 1);
        assert_eq!(id(0).parts(), 1);
        assert_eq!(id(0).part_pages(0), (1, 0));
    }

    #[test]
    fn a_part_round_trips_and_refuses_another_snapshot_or_damage() {
        let s = id(3);
        let pages: Vec<u8> = (0..3 * 4096).map(|i| (i % 251) as u8).collect();
        let bytes = encode_part(&s, 0, &pages).unwrap();
        assert_eq!(decode_part(&bytes, &s, 0).unwrap().pages, pages);
        let other = SnapshotId { commit_us: 1, ..s };
        assert!(decode_part(&bytes, &other, 0).is_err());
        let mut bad = bytes.clone();
        bad[100] ^= 1;
        assert!(matches!(
            decode_part(&bad, &s, 0),
            Err(FormatError::Digest { .. })
        ));
    }

    #[test]
    fn a_part_carried_to_a_later_snapshot_decodes_as_its_own_and_only_where_its_pages_stay() {
        let old = id(4096 + 10);
        let new = SnapshotId {
            bookmark: Bookmark::new(Epoch(1), Sequence(9)),
            db_pages: 4096 + 20,
            ..old
        };
        let pages: Vec<u8> = (0..4096 * 4096).map(|i| (i % 13) as u8).collect();
        let bytes = encode_part(&old, 0, &pages).unwrap();
        let carried = reframe_part(&bytes, &old, 0, &new).unwrap();
        assert_eq!(carried, encode_part(&new, 0, &pages).unwrap());
        assert_eq!(decode_part(&carried, &new, 0).unwrap().pages, pages);
        assert!(decode_part(&carried, &old, 0).is_err());
        // Part 1 grows: its range in the new snapshot is not the old one's.
        let tail = vec![0u8; 10 * 4096];
        let last = encode_part(&old, 1, &tail).unwrap();
        assert!(reframe_part(&last, &old, 1, &new).is_err());
        // Damage is refused, not carried.
        let mut bad = bytes.clone();
        bad[90] ^= 1;
        assert!(matches!(
            reframe_part(&bad, &old, 0, &new),
            Err(FormatError::Digest { .. })
        ));
    }
}
