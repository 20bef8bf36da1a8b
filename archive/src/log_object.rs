//! A log object: a run of confirmed records, compressed, as the store
//! keeps them. This module is the only place that reads or writes it.
//!
//! ```text
//! log object (big-endian)
//!   0  magic       b"WRLOGOB1"                                 8
//!   8  version     u16 (1), flags u16 (0)                       4
//!  12  database    u64                                          8
//!  20  previous    bookmark before the first record            12
//!  32  prev_chain  the chain at `previous`                     16
//!  48  last        bookmark of the last record                 12
//!  60  last_chain  the chain at `last`                         16
//!  76  records     u32                                          4
//!  80  first_us    u64: the first record's commit time          8
//!  88  last_us     u64: the last record's commit time           8
//!  96  raw_len     u64: bytes of the records uncompressed       8
//! 104  zlen        u64: bytes of the zstd frame                 8
//! 112  frame       one zstd frame (level 3) of the records back
//!                  to back, each a whole record (see
//!                  walrelay_replicator::record)
//!  ..  digest      BLAKE3-256 over every byte before it        32
//! ```
//!
//! The bytes are a function of the records alone (no uploader id, no
//! upload time), so any uploader that archives the same run writes the
//! same object. A run ends at a transaction's last chunk unless one
//! transaction alone outgrows an object; the manifest's archived end is
//! always a transaction's end.
//!
//! Decoding checks the digest, then every record's CRC and that the
//! records chain from `previous`/`prev_chain` to `last`/`last_chain`.

use crate::codec::{self, Put, Reader};
use crate::error::FormatError;
use crate::names::LogName;
use bytes::Bytes;
use walrelay_replicator::record::MAX_RECORD_BYTES;
use walrelay_replicator::{Bookmark, ChainHash, DatabaseId, Encoded, Epoch};

const MAGIC: &[u8; 8] = b"WRLOGOB1";
const VERSION: u16 = 1;
const HEADER_BYTES: usize = 112;
const WHAT: &str = "log object";
/// The most record bytes one object holds: an uploader closes an object
/// at its size target, but a single record may take it past by at most
/// one record.
pub const MAX_RAW_BYTES: u64 = 256 << 20;

/// A decoded log object.
#[derive(Debug, Clone)]
pub struct LogObject {
    pub database: DatabaseId,
    pub previous: Bookmark,
    pub prev_chain: ChainHash,
    pub last: Bookmark,
    pub last_chain: ChainHash,
    pub first_us: u64,
    pub last_us: u64,
    /// Every record, validated and chained.
    pub records: Vec<Encoded>,
}

impl LogObject {
    /// The name the object is stored under, written in `generation`.
    pub fn name(&self, generation: Epoch) -> LogName {
        LogName {
            previous: self.previous,
            last: self.last,
            first_us: self.first_us,
            last_us: self.last_us,
            generation,
        }
    }

    /// Builds the object of a non-empty run of consecutive, chained
    /// records (as a follower's log holds them).
    pub fn new(database: DatabaseId, records: Vec<Encoded>) -> Result<LogObject, FormatError> {
        let (Some(first), Some(last)) = (records.first(), records.last()) else {
            return Err(invalid("no records"));
        };
        check_chain(&records, first.previous, first.prev_chain)?;
        Ok(LogObject {
            database,
            previous: first.previous,
            prev_chain: first.prev_chain,
            last: last.bookmark,
            last_chain: last.chain,
            first_us: first.commit_us(),
            last_us: last.commit_us(),
            records,
        })
    }

    pub fn raw_len(&self) -> u64 {
        self.records.iter().map(|r| r.bytes.len() as u64).sum()
    }

    pub fn encode(&self) -> Result<Vec<u8>, FormatError> {
        let raw_len = self.raw_len();
        if raw_len > MAX_RAW_BYTES {
            return Err(FormatError::TooLarge {
                what: WHAT,
                len: raw_len,
                max: MAX_RAW_BYTES,
            });
        }
        let mut raw = Vec::with_capacity(raw_len as usize);
        for r in &self.records {
            raw.extend_from_slice(&r.bytes);
        }
        let frame = codec::zstd(&raw, WHAT)?;
        let mut out = codec::begin(
            MAGIC,
            VERSION,
            self.database.0,
            HEADER_BYTES + frame.len() + codec::DIGEST_BYTES,
        );
        out.bookmark(self.previous);
        out.chain(self.prev_chain);
        out.bookmark(self.last);
        out.chain(self.last_chain);
        let count = u32::try_from(self.records.len()).map_err(|_| invalid("too many records"))?;
        out.extend_from_slice(&count.to_be_bytes());
        out.extend_from_slice(&self.first_us.to_be_bytes());
        out.extend_from_slice(&self.last_us.to_be_bytes());
        out.extend_from_slice(&raw_len.to_be_bytes());
        out.extend_from_slice(&(frame.len() as u64).to_be_bytes());
        debug_assert_eq!(out.len(), HEADER_BYTES);
        out.extend_from_slice(&frame);
        Ok(codec::seal(out))
    }

    /// The header alone (no decompression): what a lookup by time needs.
    pub fn decode_header(object: &[u8]) -> Result<Header, FormatError> {
        let mut r = Reader::new(object, WHAT);
        r.header(MAGIC, VERSION)?;
        Ok(Header {
            database: DatabaseId(r.u64()?),
            previous: r.bookmark()?,
            prev_chain: r.chain()?,
            last: r.bookmark()?,
            last_chain: r.chain()?,
            records: r.u32()?,
            first_us: r.u64()?,
            last_us: r.u64()?,
            raw_len: r.u64()?,
            zlen: r.u64()?,
        })
    }

    /// Decodes and validates a whole object.
    pub fn decode(object: &[u8]) -> Result<LogObject, FormatError> {
        let body = codec::check_digest(object, WHAT)?;
        let h = Self::decode_header(body)?;
        let mut r = Reader::new(body, WHAT);
        r.take(HEADER_BYTES)?;
        let frame = r.take(usize::try_from(h.zlen).map_err(|_| invalid("frame length"))?)?;
        if r.position() != body.len() {
            return Err(invalid("bytes after the frame"));
        }
        let raw = Bytes::from(codec::unzstd(frame, h.raw_len, MAX_RAW_BYTES, WHAT)?);
        // Each record is at least a header; bound the count before
        // reserving for it.
        let max_records = raw.len() / walrelay_replicator::record::HEADER_BYTES + 1;
        if h.records as usize > max_records || h.records == 0 {
            return Err(invalid("record count does not fit the records"));
        }
        let mut records = Vec::with_capacity(h.records as usize);
        let mut at = 0usize;
        while at < raw.len() {
            let (e, used) = Encoded::decode(&raw.slice(at..))
                .map_err(|source| FormatError::Record { what: WHAT, source })?;
            debug_assert!(used as u64 <= MAX_RECORD_BYTES);
            records.push(e);
            at += used;
        }
        if records.len() != h.records as usize {
            return Err(invalid("record count does not match the header"));
        }
        check_chain(&records, h.previous, h.prev_chain)?;
        let (first, last) = (&records[0], &records[records.len() - 1]);
        if last.bookmark != h.last
            || last.chain != h.last_chain
            || first.commit_us() != h.first_us
            || last.commit_us() != h.last_us
        {
            return Err(invalid("the header does not describe the records"));
        }
        Ok(LogObject {
            database: h.database,
            previous: h.previous,
            prev_chain: h.prev_chain,
            last: h.last,
            last_chain: h.last_chain,
            first_us: h.first_us,
            last_us: h.last_us,
            records,
        })
    }
}

/// A log object's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub database: DatabaseId,
    pub previous: Bookmark,
    pub prev_chain: ChainHash,
    pub last: Bookmark,
    pub last_chain: ChainHash,
    pub records: u32,
    pub first_us: u64,
    pub last_us: u64,
    pub raw_len: u64,
    pub zlen: u64,
}

fn invalid(why: &'static str) -> FormatError {
    FormatError::Invalid { what: WHAT, why }
}

/// Records must follow each other: each one's `previous` and `prev_chain`
/// are the bookmark and chain of the one before, starting from the given
/// point.
fn check_chain(
    records: &[Encoded],
    mut at: Bookmark,
    mut chain: ChainHash,
) -> Result<(), FormatError> {
    for r in records {
        if r.previous != at || r.prev_chain != chain || r.bookmark <= at {
            return Err(invalid("records do not chain"));
        }
        at = r.bookmark;
        chain = r.chain;
    }
    Ok(())
}
