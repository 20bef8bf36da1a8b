//! The shared log's on-disk entry format. This module is the only place
//! that reads or writes it.
//!
//! A shared segment file holds entries back to back from offset 0; the
//! rest of the (preallocated) file is zero, and a zero magic ends a scan.
//!
//! ```text
//! entry (big-endian)
//!  0  magic     b"WRSL"                                  4
//!  4  kind      u8: 1 record, 2 cut, 3 release, 4 reset  1
//!  5  version   u8 (1)                                   1
//!  6  reserved  u16, zero                                2
//!  8  database  u64 (DatabaseId)                         8
//! 16  lsn       u64: the entry's log sequence number     8
//!               (see "Order" in the parent module; a
//!               copy moved by compaction keeps it)
//! 24  len       u32: payload bytes                       4
//! 28  payload   len bytes (by kind, below)
//! 28+len crc32  u32 over bytes 0 .. 28+len               4
//!
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
pub const VERSION: u8 = 1;
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
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Record,
            2 => Kind::Cut,
            3 => Kind::Release,
            4 => Kind::Reset,
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

/// Decodes the entry at the start of `buf`.
pub fn decode(buf: &[u8]) -> Result<Frame<'_>, FrameError> {
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
    if buf[5] != VERSION {
        return Err(FrameError::Damaged("unknown version"));
    }
    if buf[6..8] != [0, 0] {
        return Err(FrameError::Damaged("reserved bytes set"));
    }
    let len = be32(&buf[24..]) as usize;
    if len > MAX_PAYLOAD {
        return Err(FrameError::Damaged("payload too large"));
    }
    let total = HEADER_BYTES + len + CRC_BYTES;
    if buf.len() < total {
        return Err(FrameError::Damaged("runs past the segment"));
    }
    let body = HEADER_BYTES + len;
    if crc32fast::hash(&buf[..body]) != be32(&buf[body..]) {
        return Err(FrameError::Damaged("crc mismatch"));
    }
    Ok(Frame {
        kind,
        database: DatabaseId(be64(&buf[8..])),
        lsn: be64(&buf[16..]),
        payload: &buf[HEADER_BYTES..body],
        len: total,
    })
}

/// Appends the entry to `out`; returns its length. The caller bounds the
/// payload ([`MAX_PAYLOAD`]).
pub fn encode(
    out: &mut Vec<u8>,
    kind: Kind,
    database: DatabaseId,
    lsn: u64,
    payload: &[u8],
) -> usize {
    assert!(
        payload.len() <= MAX_PAYLOAD,
        "an entry payload over the bound"
    );
    let start = out.len();
    out.extend_from_slice(&MAGIC);
    out.push(kind as u8);
    out.push(VERSION);
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(&database.0.to_be_bytes());
    out.extend_from_slice(&lsn.to_be_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    let crc = crc32fast::hash(&out[start..]);
    out.extend_from_slice(&crc.to_be_bytes());
    out.len() - start
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

    #[test]
    fn an_entry_round_trips_and_every_truncation_or_bit_flip_is_refused() {
        let mut buf = Vec::new();
        let n = encode(
            &mut buf,
            Kind::Cut,
            DatabaseId(7),
            42,
            &cut_payload(Bookmark::ZERO),
        );
        assert_eq!(n, buf.len());
        let f = decode(&buf).expect("decodes");
        assert_eq!(
            (f.kind, f.database, f.lsn, f.len),
            (Kind::Cut, DatabaseId(7), 42, n)
        );
        for cut in 0..n {
            assert!(decode(&buf[..cut]).is_err(), "a truncation at {cut}");
        }
        for at in 0..n {
            let mut bad = buf.clone();
            bad[at] ^= 0x40;
            assert!(decode(&bad).is_err(), "a flip at {at}");
        }
        assert_eq!(decode(&[0u8; 64]).err(), Some(FrameError::End));
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
