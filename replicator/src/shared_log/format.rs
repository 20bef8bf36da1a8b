//! The shared log's on-disk entry format. This module is the only place
//! that reads or writes it.
//!
//! A shared segment file begins with a segment header (an entry of kind
//! 5) and holds entries back to back after it; the rest of the file is
//! zeros (a new segment) or the bytes of the segment's earlier life (a
//! segment reused from the pool, see `recycle`). A zero magic, or an entry
//! that does not check, ends a scan.
//!
//! Each segment's header carries a random salt, and every entry of that
//! segment is sealed with it: the entry's tag field holds the salt's top
//! 16 bits and its CRC is taken over the salt and then the entry. An
//! entry of a reused segment's earlier life was sealed with another salt,
//! so whatever lies past the end of this life's entries is not read as
//! one of them, wherever the end falls: the tag and the CRC together
//! leave one chance in 2^48 that an earlier life's entry, lying exactly
//! at this life's end, checks (a CRC-32 alone would leave 2^32). The salt
//! is unknown to anything outside the log, so no page data written into
//! a record can forge an entry of a segment it lands in.
//!
//! The header names its segment's index. A reuse whose new header never
//! reached the disk shows the header of its earlier life, which names a
//! lower index, and the whole segment is then read as holding nothing of
//! this life. That holds because a pool file's header names at most the
//! index in its pool name (the index it had, or a lower one if its own
//! header never landed), and no new segment takes an index at or below a
//! pool file's (the log's index floor; an index can be used again after
//! its file was unlinked, but never by a segment that a pool file could
//! have become).
//!
//! Segments written before headers existed (version 1 entries, CRC over
//! the entry alone, no header) are still read; they are never reused.
//!
//! ```text
//! entry (big-endian)
//!  0  magic     b"WRSL"                                  4
//!  4  kind      u8: 1 record, 2 cut, 3 release, 4 reset, 1
//!               5 segment header
//!  5  version   u8: 2 (1: an unsalted segment's entry)   1
//!  6  tag       u16: the segment salt's top 16 bits     2
//!               (version 1: zero)
//!  8  database  u64 (DatabaseId; 0 in a header)          8
//! 16  lsn       u64: the entry's log sequence number     8
//!               (see "Order" in the parent module; a
//!               copy moved by compaction keeps it; 0
//!               in a header)
//! 24  len       u32: payload bytes                       4
//! 28  payload   len bytes (by kind, below)
//! 28+len crc32  u32 over the segment's salt (u64) and   4
//!               then bytes 0 .. 28+len (version 1: over
//!               bytes 0 .. 28+len alone)
//!
//! payload of a segment   index: u64, the segment's own           8
//! header (offset 0):     salt: u64, random per segment life     8
//!                        flags: u8, bit 0: reused (the bytes    1
//!                        past the entries are an earlier
//!                        life's, not zeros); others zero
//! payload of a record:   one encoded record (see `record`), whole;
//!                        its own CRC and chain are checked too
//! payload of a cut:      keep: bookmark (epoch u32, seq u64)   12
//!                        (every record of the database after
//!                        `keep` with a lower lsn is dropped)
//! payload of a release   start: bookmark                        12
//! and of a reset:        chain: the start record's chain        16
//!                        runs: u16                               2
//!                        runs x (epoch u32, last seq u64)  12 x runs
//!                        (the epoch history up to start). A release
//!                        drops the database's records at or before
//!                        `start` with a lower lsn; a reset drops every
//!                        one with a lower lsn. Both make `start` the
//!                        database's base.
//! ```
//!
//! Every size is checked against the buffer and hard bounds before any
//! slice is taken; decoding never allocates for payloads (they are
//! slices of the input) and never panics on bad input.

use crate::bookmark::{Bookmark, Epoch, Sequence};
use crate::chain::ChainHash;
use crate::history::{History, MAX_RUNS};
use crate::ids::DatabaseId;
use crate::record::MAX_RECORD_BYTES;

pub const MAGIC: [u8; 4] = *b"WRSL";
/// The version of every entry written now (sealed with its segment's salt).
pub const VERSION: u8 = 2;
/// The version of an entry of a segment written before segment headers.
pub const LEGACY_VERSION: u8 = 1;
pub const HEADER_BYTES: usize = 28;
pub const CRC_BYTES: usize = 4;
/// Header and CRC: what an entry adds to its payload.
pub const OVERHEAD: usize = HEADER_BYTES + CRC_BYTES;
const BASE_FIXED: usize = Bookmark::BYTE_LEN + ChainHash::BYTE_LEN + 2;
/// The largest payload: a record, or a base with a full history.
pub const MAX_PAYLOAD: usize = {
    let base = BASE_FIXED + 12 * MAX_RUNS;
    let rec = MAX_RECORD_BYTES as usize;
    if base > rec { base } else { rec }
};

/// What an entry says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Record = 1,
    Cut = 2,
    Release = 3,
    Reset = 4,
    /// A segment's header (only at offset 0).
    Segment = 5,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Record,
            2 => Kind::Cut,
            3 => Kind::Release,
            4 => Kind::Reset,
            5 => Kind::Segment,
            _ => return None,
        })
    }
}

/// One decoded entry: a view of the buffer it was decoded from.
#[derive(Debug, Clone, Copy)]
pub struct Frame<'a> {
    pub kind: Kind,
    pub database: DatabaseId,
    pub lsn: u64,
    pub payload: &'a [u8],
    /// Bytes the whole entry takes.
    pub len: usize,
}

/// Why no entry decodes at a position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Zero bytes (or nothing) where a magic would be: the clean end.
    #[error("the end of the entries")]
    End,
    /// Anything else: a torn or damaged entry.
    #[error("a damaged entry: {0}")]
    Damaged(&'static str),
}

fn be32(b: &[u8]) -> u32 {
    let mut raw = [0u8; 4];
    raw.copy_from_slice(&b[..4]);
    u32::from_be_bytes(raw)
}

fn be64(b: &[u8]) -> u64 {
    let mut raw = [0u8; 8];
    raw.copy_from_slice(&b[..8]);
    u64::from_be_bytes(raw)
}

/// How the entries of one segment are sealed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seal {
    /// Version 1: the CRC over the entry alone (a segment without a header).
    Legacy,
    /// Version 2: the CRC over the segment's salt, then the entry.
    Salted(u64),
}

impl Seal {
    fn version(self) -> u8 {
        match self {
            Seal::Legacy => LEGACY_VERSION,
            Seal::Salted(_) => VERSION,
        }
    }

    /// What an entry's tag field (bytes 6..8) holds under this seal.
    fn tag(self) -> [u8; 2] {
        match self {
            Seal::Legacy => [0, 0],
            Seal::Salted(salt) => ((salt >> 48) as u16).to_be_bytes(),
        }
    }

    fn crc(self, body: &[u8]) -> u32 {
        let mut h = crc32fast::Hasher::new();
        if let Seal::Salted(salt) = self {
            h.update(&salt.to_be_bytes());
        }
        h.update(body);
        h.finalize()
    }
}

/// The kind, version and payload length of the entry at the start of
/// `buf`, its whole length checked against `buf` (its tag and CRC not
/// yet).
fn frame_parts(buf: &[u8]) -> Result<(Kind, u8, usize), FrameError> {
    if buf.len() < MAGIC.len() || buf[..MAGIC.len()] == [0u8; 4] {
        return Err(FrameError::End);
    }
    if buf[..4] != MAGIC {
        return Err(FrameError::Damaged("bad magic"));
    }
    if buf.len() < HEADER_BYTES {
        return Err(FrameError::Damaged("short header"));
    }
    let kind = Kind::from_u8(buf[4]).ok_or(FrameError::Damaged("unknown kind"))?;
    let len = be32(&buf[24..]) as usize;
    if len > MAX_PAYLOAD {
        return Err(FrameError::Damaged("payload too large"));
    }
    if buf.len() < HEADER_BYTES + len + CRC_BYTES {
        return Err(FrameError::Damaged("runs past the segment"));
    }
    Ok((kind, buf[5], len))
}

/// Decodes the entry at the start of `buf`, of a segment sealed with
/// `seal`. A segment header decodes here too (kind [`Kind::Segment`]); a
/// scan takes one only at offset 0 ([`segment_start`]).
pub fn decode(buf: &[u8], seal: Seal) -> Result<Frame<'_>, FrameError> {
    let (kind, version, len) = frame_parts(buf)?;
    if version != seal.version() {
        return Err(FrameError::Damaged("unknown version"));
    }
    if buf[6..8] != seal.tag() {
        return Err(FrameError::Damaged("another segment life's tag"));
    }
    let body = HEADER_BYTES + len;
    if seal.crc(&buf[..body]) != be32(&buf[body..]) {
        return Err(FrameError::Damaged("crc mismatch"));
    }
    Ok(Frame {
        kind,
        database: DatabaseId(be64(&buf[8..])),
        lsn: be64(&buf[16..]),
        payload: &buf[HEADER_BYTES..body],
        len: body + CRC_BYTES,
    })
}

/// Appends the entry to `out`, sealed with `seal`; returns its length.
/// The caller bounds the payload ([`MAX_PAYLOAD`]).
pub fn encode(
    out: &mut Vec<u8>,
    kind: Kind,
    database: DatabaseId,
    lsn: u64,
    payload: &[u8],
    seal: Seal,
) -> usize {
    assert!(
        payload.len() <= MAX_PAYLOAD,
        "an entry payload over the bound"
    );
    let start = out.len();
    out.extend_from_slice(&MAGIC);
    out.push(kind as u8);
    out.push(seal.version());
    out.extend_from_slice(&seal.tag());
    out.extend_from_slice(&database.0.to_be_bytes());
    out.extend_from_slice(&lsn.to_be_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    let crc = seal.crc(&out[start..]);
    out.extend_from_slice(&crc.to_be_bytes());
    out.len() - start
}

/// Seals one whole entry (as [`encode`] made it, of any version) anew
/// with `salt`, in place: for a copy going to another segment.
pub fn reseal(entry: &mut [u8], salt: u64) {
    assert!(
        entry.len() >= OVERHEAD,
        "a whole entry is resealed, never a piece"
    );
    let body = entry.len() - CRC_BYTES;
    let seal = Seal::Salted(salt);
    entry[5] = VERSION;
    entry[6..8].copy_from_slice(&seal.tag());
    let crc = seal.crc(&entry[..body]);
    entry[body..].copy_from_slice(&crc.to_be_bytes());
}

/// A segment's header: the entry at its offset 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentHeader {
    pub index: u64,
    pub salt: u64,
    /// The segment was reused: past its entries lie an earlier life's
    /// bytes, not zeros.
    pub reused: bool,
}

const SEGMENT_PAYLOAD_BYTES: usize = 8 + 8 + 1;
/// What a segment header takes at the start of its segment.
pub const SEGMENT_HEADER_BYTES: usize = OVERHEAD + SEGMENT_PAYLOAD_BYTES;

impl SegmentHeader {
    /// The header of a new life of segment `index`, with a fresh salt.
    pub fn new(index: u64, reused: bool) -> SegmentHeader {
        SegmentHeader {
            index,
            salt: rand::random(),
            reused,
        }
    }

    pub fn seal(&self) -> Seal {
        Seal::Salted(self.salt)
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut p = Vec::with_capacity(SEGMENT_PAYLOAD_BYTES);
        p.extend_from_slice(&self.index.to_be_bytes());
        p.extend_from_slice(&self.salt.to_be_bytes());
        p.push(u8::from(self.reused));
        let mut out = Vec::with_capacity(SEGMENT_HEADER_BYTES);
        encode(&mut out, Kind::Segment, DatabaseId(0), 0, &p, self.seal());
        out
    }
}

/// What the start of a segment file says about its entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// Zeros: a new segment whose header was never written.
    Empty,
    /// A version 1 entry: a segment written before headers; its entries
    /// are read from offset 0.
    Legacy,
    /// This segment's header: its entries follow it, sealed with its salt.
    Salted(SegmentHeader),
    /// The header of a lower index: a reuse whose new header never
    /// reached the disk (see above); nothing of this life is in it.
    Earlier(u64),
    /// Anything else (a header that does not check): damage, or a torn
    /// write on a disk that tears sectors; nothing is read from it.
    Stale,
}

/// Reads the start of segment `index`'s bytes.
pub fn segment_start(buf: &[u8], index: u64) -> Start {
    let (kind, version, len) = match frame_parts(buf) {
        Ok(parts) => parts,
        Err(FrameError::End) => return Start::Empty,
        Err(FrameError::Damaged(_)) => return Start::Stale,
    };
    if version == LEGACY_VERSION {
        return match decode(buf, Seal::Legacy) {
            Ok(f) if f.kind != Kind::Segment => Start::Legacy,
            _ => Start::Stale,
        };
    }
    if kind != Kind::Segment || len != SEGMENT_PAYLOAD_BYTES {
        return Start::Stale;
    }
    let p = &buf[HEADER_BYTES..HEADER_BYTES + len];
    let header = SegmentHeader {
        index: be64(p),
        salt: be64(&p[8..]),
        reused: p[16] == 1,
    };
    match decode(buf, header.seal()) {
        Ok(_) if p[16] > 1 => Start::Stale,
        Ok(_) if header.index == index => Start::Salted(header),
        Ok(_) if header.index < index => Start::Earlier(header.index),
        _ => Start::Stale,
    }
}

/// A cut's payload.
pub fn cut_payload(keep: Bookmark) -> Vec<u8> {
    keep.to_bytes().to_vec()
}

pub fn decode_cut(p: &[u8]) -> Result<Bookmark, FrameError> {
    if p.len() != Bookmark::BYTE_LEN {
        return Err(FrameError::Damaged("a cut of the wrong size"));
    }
    let mut raw = [0u8; Bookmark::BYTE_LEN];
    raw.copy_from_slice(p);
    Ok(Bookmark::from_bytes(raw))
}

/// A release's or reset's payload: the new base.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Base {
    pub start: Bookmark,
    pub chain: ChainHash,
    pub history: History,
}

pub fn base_payload(base: &Base) -> Vec<u8> {
    let runs = base.history.runs();
    let runs = &runs[runs.len().saturating_sub(MAX_RUNS)..];
    let mut p = Vec::with_capacity(BASE_FIXED + 12 * runs.len());
    p.extend_from_slice(&base.start.to_bytes());
    p.extend_from_slice(&base.chain.to_bytes());
    p.extend_from_slice(&(runs.len() as u16).to_be_bytes());
    for (e, s) in runs {
        p.extend_from_slice(&e.0.to_be_bytes());
        p.extend_from_slice(&s.0.to_be_bytes());
    }
    p
}

pub fn decode_base(p: &[u8]) -> Result<Base, FrameError> {
    if p.len() < BASE_FIXED {
        return Err(FrameError::Damaged("a base shorter than its fixed part"));
    }
    let start = decode_cut(&p[..Bookmark::BYTE_LEN])?;
    let mut raw = [0u8; ChainHash::BYTE_LEN];
    raw.copy_from_slice(&p[Bookmark::BYTE_LEN..Bookmark::BYTE_LEN + ChainHash::BYTE_LEN]);
    let chain = ChainHash::from_bytes(raw);
    let count = usize::from(u16::from_be_bytes([p[BASE_FIXED - 2], p[BASE_FIXED - 1]]));
    if count > MAX_RUNS || p.len() != BASE_FIXED + 12 * count {
        return Err(FrameError::Damaged("a base whose run count does not match"));
    }
    let runs = (0..count)
        .map(|i| {
            let at = BASE_FIXED + 12 * i;
            (Epoch(be32(&p[at..])), Sequence(be64(&p[at + 4..])))
        })
        .collect();
    let history =
        History::from_runs(runs).ok_or(FrameError::Damaged("a base history out of order"))?;
    if history.last() != start {
        return Err(FrameError::Damaged(
            "a base history not ending at its start",
        ));
    }
    Ok(Base {
        start,
        chain,
        history,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cut entry of database 7 (lsn 42), sealed with `seal`.
    fn cut_entry(seal: Seal) -> Vec<u8> {
        let mut out = Vec::new();
        encode(
            &mut out,
            Kind::Cut,
            DatabaseId(7),
            42,
            &cut_payload(Bookmark::ZERO),
            seal,
        );
        out
    }

    #[test]
    fn an_entry_round_trips_and_every_truncation_or_bit_flip_is_refused() {
        for seal in [Seal::Salted(0x5eed), Seal::Legacy] {
            let mut buf = Vec::new();
            let n = encode(
                &mut buf,
                Kind::Cut,
                DatabaseId(7),
                42,
                &cut_payload(Bookmark::ZERO),
                seal,
            );
            assert_eq!(n, buf.len());
            let f = decode(&buf, seal).expect("decodes");
            assert_eq!(
                (f.kind, f.database, f.lsn, f.len),
                (Kind::Cut, DatabaseId(7), 42, n)
            );
            for cut in 0..n {
                assert!(decode(&buf[..cut], seal).is_err(), "a truncation at {cut}");
            }
            for at in 0..n {
                let mut bad = buf.clone();
                bad[at] ^= 0x40;
                assert!(decode(&bad, seal).is_err(), "a flip at {at}");
            }
            assert_eq!(decode(&[0u8; 64], seal).err(), Some(FrameError::End));
        }
    }

    #[test]
    fn an_entry_checks_only_under_the_salt_it_was_sealed_with() {
        let buf = cut_entry(Seal::Salted(1));
        assert!(decode(&buf, Seal::Salted(1)).is_ok());
        assert!(
            decode(&buf, Seal::Salted(2)).is_err(),
            "another life's salt"
        );
        assert!(decode(&buf, Seal::Legacy).is_err(), "an unsalted segment");
        let mut legacy = cut_entry(Seal::Legacy);
        assert!(decode(&legacy, Seal::Salted(1)).is_err());
        reseal(&mut legacy, 2);
        let f = decode(&legacy, Seal::Salted(2)).expect("a resealed copy checks");
        assert_eq!((f.kind, f.database, f.lsn), (Kind::Cut, DatabaseId(7), 42));
        assert!(decode(&legacy, Seal::Legacy).is_err());
    }

    #[test]
    fn a_segment_start_is_its_own_header_or_else_nothing_of_this_life() {
        let h = SegmentHeader::new(9, true);
        let mut seg = h.encode();
        assert_eq!(seg.len(), SEGMENT_HEADER_BYTES);
        seg.resize(4096, 0);
        assert_eq!(segment_start(&seg, 9), Start::Salted(h));
        assert_eq!(
            segment_start(&seg, 10),
            Start::Earlier(9),
            "a lower index's"
        );
        assert_eq!(segment_start(&seg, 8), Start::Stale, "a higher index's");
        assert_eq!(segment_start(&[0u8; 4096], 9), Start::Empty);
        assert_eq!(segment_start(&[], 9), Start::Empty);
        for at in 0..SEGMENT_HEADER_BYTES {
            let mut torn = seg.clone();
            torn[at] ^= 0x01;
            assert_eq!(segment_start(&torn, 9), Start::Stale, "a flip at {at}");
        }
        let legacy = cut_entry(Seal::Legacy);
        assert_eq!(segment_start(&legacy, 0), Start::Legacy);
        let entry = cut_entry(h.seal());
        assert_eq!(segment_start(&entry, 9), Start::Stale, "no header first");
        assert_ne!(SegmentHeader::new(9, false).salt, h.salt, "a salt per life");
    }

    #[test]
    fn a_base_round_trips() {
        let mut history = History::new();
        history.record(Bookmark::new(Epoch(1), Sequence(3)));
        history.record(Bookmark::new(Epoch(2), Sequence(9)));
        let base = Base {
            start: Bookmark::new(Epoch(2), Sequence(9)),
            chain: ChainHash::from_bytes([5; 16]),
            history,
        };
        assert_eq!(decode_base(&base_payload(&base)).expect("base"), base);
        assert!(decode_base(&[1u8; 5]).is_err());
    }
}
