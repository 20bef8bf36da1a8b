//! The log record: one committed transaction, as the replicator ships and
//! stores it. This module is the only place that reads or writes it.
//!
//! ```text
//! record (big-endian)
//!  0  magic        b"WRRC"                          4
//!  4  version      u16 (3)                          2
//!  6  flags        u16: bit 0 CONTINUED, bit 1       2
//!                  COMPRESSED, others 0 (CONTINUED: a chunk of
//!                  a transaction whose last chunk follows; it
//!                  commits nothing. COMPRESSED: see below)
//!  8  total_len    u32: bytes of the whole record   4   (header + pages + crc)
//! 12  bookmark     epoch u32, sequence u64         12
//! 24  previous     epoch u32, sequence u64         12   (the record before it)
//! 36  page_size    u32 (power of two, 512..=65536)  4
//! 40  db_pages     u32: database size after commit  4
//! 44  page_count   u32                              4
//! 48  prev_chain   the previous record's chain     16
//! 64  chain        BLAKE3-128 of every byte before  16   (see `chain`)
//!                  it and after it up to the CRC
//! 80  commit_us    u64: the leader's wall clock at   8
//!                  commit, µs since the Unix epoch
//!                  (maps times to bookmarks; never
//!                  used for ordering)
//! 88  pages        page_count x (page_no u32, image[page_size])
//!  .. crc32        u32 over bytes 0 .. total_len-4  4
//! ```
//!
//! With COMPRESSED, the page section is instead
//!
//! ```text
//! 88  page_nos     page_count x u32
//!  .. images       one zstd frame of the page_count images, in order,
//!                  stating its content size (page_count x page_size)
//!  .. crc32        u32 over bytes 0 .. total_len-4  4
//! ```
//!
//! and `total_len` is less than the uncompressed form's: that length bounds
//! it, and the images are decompressed only into a buffer of exactly the
//! size the header implies, after the CRC passed. The encoder compresses
//! only when asked ([`PageCompression`]) and only when the frame saves at
//! least an eighth of the images. Page numbers stay outside the frame, so
//! a follower checks a record without decompressing it ([`Encoded::decode`]
//! reads the frame's headers only); the images are decompressed where a
//! record is built ([`Encoded::record`]). The chain and the CRC cover the
//! bytes as encoded, once, by the leader.
//!
//! Older versions: 1 had no chain fields (48 header bytes), 2 no commit
//! time (80). A log holding one is refused by name
//! ([`legacy_record_len`]), never mistaken for a torn tail.
//!
//! A transaction larger than [`CHUNK_PAGE_BYTES`] of page images travels as
//! several records with consecutive bookmarks: every chunk but the last has
//! the CONTINUED flag, all carry the transaction's final `db_pages`, and
//! their page sets are disjoint and in page order. The transaction's
//! bookmark is its last chunk's; a reader of the log reveals a transaction
//! only at a record without the flag. So no record, whatever the
//! transaction, exceeds [`MAX_RECORD_BYTES`].
//!
//! Every length is checked against hard bounds before anything is
//! allocated, and `total_len` must equal what the header implies (for a
//! compressed record: lie below it), so a decoder never trusts a size it
//! has not verified. Page images decode as
//! slices of the input buffer (no copy), or of the one buffer a compressed
//! record's images decompress into.

use crate::bookmark::Bookmark;
use crate::chain::ChainHash;
use crate::page_zstd;
use bytes::{BufMut, Bytes, BytesMut};

pub const MAGIC: [u8; 4] = *b"WRRC";
pub const VERSION: u16 = 3;
pub const HEADER_BYTES: usize = 88;
const PREV_CHAIN_AT: usize = 48;
const CHAIN_AT: usize = 64;
const COMMIT_AT: usize = 80;
/// Header bytes of the older versions, by version.
const LEGACY_HEADER_BYTES: [(u16, u64); 2] = [(1, 48), (2, 80)];
pub const CRC_BYTES: usize = 4;
/// The largest page count one record may carry (512-byte pages filling
/// [`MAX_RECORD_BYTES`]).
pub const MAX_PAGES: u32 = 32_768;
/// The largest record, whatever its page size: twice a chunk, so a chunk
/// of 64 KiB pages with its page numbers always fits.
pub const MAX_RECORD_BYTES: u64 = 16 << 20;
/// Page-image bytes per chunk of a transaction (see the module docs).
pub const CHUNK_PAGE_BYTES: u64 = 8 << 20;
/// The bounds of version 1 records before transactions travelled as
/// chunks: a log written then may hold records this large.
const LEGACY_MAX_PAGES: u32 = 262_144;
const LEGACY_MAX_RECORD_BYTES: u64 = 1 << 30;

/// The length of a whole, CRC-valid record of an older version at the
/// start of `buf` (a log written by an older walrelay): such a log is
/// refused by name rather than cut as a torn tail.
pub fn legacy_record_len(buf: &[u8]) -> Option<u64> {
    if buf.len() < 48 || buf[..4] != MAGIC {
        return None;
    }
    let version = u16::from_be_bytes([buf[4], buf[5]]);
    let header = LEGACY_HEADER_BYTES
        .iter()
        .find(|(v, _)| *v == version)
        .map(|(_, h)| *h)?;
    let (page_size, count) = (be32(buf, 36), be32(buf, 44));
    if !valid_page_size(page_size) || count > LEGACY_MAX_PAGES {
        return None;
    }
    let len = header + u64::from(count) * (4 + u64::from(page_size)) + CRC_BYTES as u64;
    if len != u64::from(be32(buf, 8)) || len > LEGACY_MAX_RECORD_BYTES || (buf.len() as u64) < len {
        return None;
    }
    let len_usize = len as usize;
    let stored = be32(buf, len_usize - CRC_BYTES);
    (crc32fast::hash(&buf[..len_usize - CRC_BYTES]) == stored).then_some(len)
}

/// The flag of a chunk that a later chunk of the same transaction follows.
pub const FLAG_CONTINUED: u16 = 0x0001;
/// The flag of a record whose page images travel as one zstd frame.
pub const FLAG_COMPRESSED: u16 = 0x0002;
const KNOWN_FLAGS: u16 = FLAG_CONTINUED | FLAG_COMPRESSED;

/// How an encoder stores a record's page images (a decoder reads both).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PageCompression {
    /// As they are.
    #[default]
    Plain,
    /// As one zstd frame, where that saves at least an eighth of them.
    Zstd,
}

/// Pages per chunk of a transaction with pages of `page_size` bytes.
pub fn pages_per_chunk(page_size: u32) -> usize {
    (CHUNK_PAGE_BYTES / u64::from(page_size.max(1))).max(1) as usize
}

/// How many records a transaction of `page_count` pages travels as.
pub fn chunk_count(page_size: u32, page_count: usize) -> usize {
    page_count.div_ceil(pages_per_chunk(page_size)).max(1)
}

/// One transaction's pages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub bookmark: Bookmark,
    pub previous: Bookmark,
    /// The chain of the record before it ([`ChainHash::GENESIS`] for the
    /// first record of a history); the record's own chain is computed.
    pub prev_chain: ChainHash,
    /// The leader's wall clock when the transaction committed (µs since
    /// the Unix epoch): what maps a time to a bookmark. Informational,
    /// never used for ordering.
    pub commit_us: u64,
    pub page_size: u32,
    pub db_pages: u32,
    /// Strictly increasing page numbers, each image `page_size` bytes.
    pub pages: Vec<(u32, Bytes)>,
}

/// Why bytes are not a valid record. Decoding never panics.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("record needs {need} bytes, {have} available")]
    Truncated { need: u64, have: u64 },
    #[error("bad record magic {0:02x?}")]
    BadMagic([u8; 4]),
    #[error("unsupported record version {0}")]
    UnsupportedVersion(u16),
    #[error("unknown record flags {0:#06x}")]
    UnknownFlags(u16),
    #[error("page size {0} is not a power of two in 512..=65536")]
    PageSize(u32),
    #[error("{0} pages exceed the limit of {MAX_PAGES}")]
    TooManyPages(u32),
    #[error("record length {stated} does not match the {implied} bytes its header implies")]
    LengthMismatch { stated: u64, implied: u64 },
    #[error("record of {0} bytes exceeds the limit")]
    TooLarge(u64),
    #[error("record checksum mismatch: stored {stored:08x}, computed {computed:08x}")]
    Crc { stored: u32, computed: u32 },
    #[error("page numbers must be nonzero and strictly increasing (page {0})")]
    PageOrder(u32),
    #[error("page {page} lies beyond the database size of {db_pages} pages")]
    PageBeyondEnd { page: u32, db_pages: u32 },
    #[error("the bookmark {bookmark} does not come after the previous one {previous}")]
    BookmarkOrder {
        bookmark: Bookmark,
        previous: Bookmark,
    },
    #[error("a page image is {len} bytes, not the page size {page_size}")]
    ImageSize { len: usize, page_size: u32 },
    #[error(
        "compressed record length {stated} is not below the {implied} bytes its header implies uncompressed"
    )]
    CompressedLength { stated: u64, implied: u64 },
    #[error("the compressed page images are not one zstd frame of {content} bytes")]
    Frame { content: u64 },
    #[error("the compressed page images do not decompress to {content} bytes")]
    Decompress { content: u64 },
}

/// Whether the record whose header starts `b` carries compressed images.
fn is_compressed(b: &[u8]) -> bool {
    u16::from_be_bytes([b[6], b[7]]) & FLAG_COMPRESSED != 0
}

pub(crate) fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn be64(b: &[u8], at: usize) -> u64 {
    let mut raw = [0u8; 8];
    raw.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(raw)
}

pub(crate) fn bookmark_at(b: &[u8], at: usize) -> Bookmark {
    let mut raw = [0u8; Bookmark::BYTE_LEN];
    raw.copy_from_slice(&b[at..at + Bookmark::BYTE_LEN]);
    Bookmark::from_bytes(raw)
}

/// Bytes a record of `page_count` pages of `page_size` occupies.
pub fn encoded_len(page_size: u32, page_count: u32) -> u64 {
    HEADER_BYTES as u64 + u64::from(page_count) * (4 + u64::from(page_size)) + CRC_BYTES as u64
}

fn valid_page_size(page_size: u32) -> bool {
    (512..=65_536).contains(&page_size) && page_size.is_power_of_two()
}

impl Record {
    /// Checks the invariants every record holds.
    pub fn validate(&self) -> Result<(), RecordError> {
        if !valid_page_size(self.page_size) {
            return Err(RecordError::PageSize(self.page_size));
        }
        if self.pages.len() as u64 > u64::from(MAX_PAGES) {
            return Err(RecordError::TooManyPages(
                self.pages.len().min(u32::MAX as usize) as u32,
            ));
        }
        if self.bookmark <= self.previous {
            return Err(RecordError::BookmarkOrder {
                bookmark: self.bookmark,
                previous: self.previous,
            });
        }
        let mut last = 0;
        for (no, image) in &self.pages {
            if *no <= last {
                return Err(RecordError::PageOrder(*no));
            }
            if *no > self.db_pages {
                return Err(RecordError::PageBeyondEnd {
                    page: *no,
                    db_pages: self.db_pages,
                });
            }
            if image.len() != self.page_size as usize {
                return Err(RecordError::ImageSize {
                    len: image.len(),
                    page_size: self.page_size,
                });
            }
            last = *no;
        }
        Ok(())
    }

    /// Encodes the record (validating it first) as a whole transaction.
    pub fn encode(&self) -> Result<Bytes, RecordError> {
        self.encode_flagged(false)
    }

    /// Encodes the record; `continued` marks a chunk that a later chunk of
    /// the same transaction follows.
    pub fn encode_flagged(&self, continued: bool) -> Result<Bytes, RecordError> {
        self.encode_with(continued, PageCompression::Plain)
    }

    /// Encodes the record with its images stored as `compression` asks;
    /// `continued` as in [`Record::encode_flagged`].
    pub fn encode_with(
        &self,
        continued: bool,
        compression: PageCompression,
    ) -> Result<Bytes, RecordError> {
        self.validate()?;
        let plain = encoded_len(self.page_size, self.pages.len() as u32);
        if plain > MAX_RECORD_BYTES {
            return Err(RecordError::TooLarge(plain));
        }
        let images = self.pages.len() * self.page_size as usize;
        let frame = match compression {
            PageCompression::Zstd if images > 0 => page_zstd::compress(
                self.pages.iter().map(|(_, image)| &image[..]),
                images,
                images - images / 8,
            ),
            _ => None,
        };
        let total = match &frame {
            Some(f) => (HEADER_BYTES + 4 * self.pages.len() + f.len() + CRC_BYTES) as u64,
            None => plain,
        };
        let mut flags = if continued { FLAG_CONTINUED } else { 0 };
        if frame.is_some() {
            flags |= FLAG_COMPRESSED;
        }
        let mut b = BytesMut::with_capacity(total as usize);
        b.put_slice(&MAGIC);
        b.put_u16(VERSION);
        b.put_u16(flags);
        b.put_u32(total as u32);
        b.put_slice(&self.bookmark.to_bytes());
        b.put_slice(&self.previous.to_bytes());
        b.put_u32(self.page_size);
        b.put_u32(self.db_pages);
        b.put_u32(self.pages.len() as u32);
        b.put_slice(&self.prev_chain.to_bytes());
        b.put_slice(&[0u8; ChainHash::BYTE_LEN]); // the chain, once known
        b.put_u64(self.commit_us);
        match &frame {
            Some(f) => {
                self.pages.iter().for_each(|(no, _)| b.put_u32(*no));
                b.put_slice(f);
            }
            None => {
                for (no, image) in &self.pages {
                    b.put_u32(*no);
                    b.put_slice(image);
                }
            }
        }
        let chain = ChainHash::over(&[&b[..CHAIN_AT], &b[COMMIT_AT..]]);
        b[CHAIN_AT..COMMIT_AT].copy_from_slice(&chain.to_bytes());
        let crc = crc32fast::hash(&b);
        b.put_u32(crc);
        debug_assert_eq!(b.len() as u64, total);
        Ok(b.freeze())
    }

    /// The length of the record at the start of `buf`, from its header
    /// alone (so a stream reader knows how much to wait for), with every
    /// bound checked.
    pub fn peek_len(buf: &[u8]) -> Result<u64, RecordError> {
        Record::peek_len_within(buf, MAX_PAGES, MAX_RECORD_BYTES)
    }

    fn peek_len_within(buf: &[u8], max_pages: u32, max_bytes: u64) -> Result<u64, RecordError> {
        if buf.len() < HEADER_BYTES {
            return Err(RecordError::Truncated {
                need: HEADER_BYTES as u64,
                have: buf.len() as u64,
            });
        }
        let magic = [buf[0], buf[1], buf[2], buf[3]];
        if magic != MAGIC {
            return Err(RecordError::BadMagic(magic));
        }
        let version = u16::from_be_bytes([buf[4], buf[5]]);
        if version != VERSION {
            return Err(RecordError::UnsupportedVersion(version));
        }
        let flags = u16::from_be_bytes([buf[6], buf[7]]);
        if flags & !KNOWN_FLAGS != 0 {
            return Err(RecordError::UnknownFlags(flags));
        }
        let stated = u64::from(be32(buf, 8));
        let page_size = be32(buf, 36);
        if !valid_page_size(page_size) {
            return Err(RecordError::PageSize(page_size));
        }
        let count = be32(buf, 44);
        if count > max_pages {
            return Err(RecordError::TooManyPages(count));
        }
        let implied = encoded_len(page_size, count);
        if implied > max_bytes {
            return Err(RecordError::TooLarge(implied));
        }
        if flags & FLAG_COMPRESSED != 0 {
            // Page numbers, then a frame of at least one byte, and shorter
            // than the images it holds.
            let least = (HEADER_BYTES + CRC_BYTES) as u64 + 4 * u64::from(count) + 1;
            if stated < least || stated >= implied {
                return Err(RecordError::CompressedLength { stated, implied });
            }
            return Ok(stated);
        }
        if stated != implied {
            return Err(RecordError::LengthMismatch { stated, implied });
        }
        Ok(implied)
    }

    /// Decodes the record at the start of `buf`; returns it and the bytes
    /// it used. Page images are slices of `buf`.
    pub fn decode(buf: &Bytes) -> Result<(Record, usize), RecordError> {
        let total = Record::check(buf)?;
        Ok((Record::parse_checked(buf, total)?, total))
    }

    /// Checks the record at the start of `buf` without building it: every
    /// bound, the CRC, and the header and page-number invariants
    /// `validate` enforces. Returns its length.
    fn check(buf: &[u8]) -> Result<usize, RecordError> {
        let total = Record::peek_len(buf)?;
        if (buf.len() as u64) < total {
            return Err(RecordError::Truncated {
                need: total,
                have: buf.len() as u64,
            });
        }
        let total = total as usize;
        let body = &buf[..total - CRC_BYTES];
        let stored = be32(buf, total - CRC_BYTES);
        let computed = crc32fast::hash(body);
        if stored != computed {
            return Err(RecordError::Crc { stored, computed });
        }
        // peek_len bounded the page size and count against the length.
        let (bookmark, previous) = (bookmark_at(buf, 12), bookmark_at(buf, 24));
        if bookmark <= previous {
            return Err(RecordError::BookmarkOrder { bookmark, previous });
        }
        let page_size = be32(buf, 36) as usize;
        let db_pages = be32(buf, 40);
        let count = be32(buf, 44) as usize;
        let compressed = is_compressed(buf);
        let mut last = 0;
        let mut at = HEADER_BYTES;
        for _ in 0..count {
            let no = be32(buf, at);
            if no <= last {
                return Err(RecordError::PageOrder(no));
            }
            if no > db_pages {
                return Err(RecordError::PageBeyondEnd { page: no, db_pages });
            }
            last = no;
            at += if compressed { 4 } else { 4 + page_size };
        }
        if compressed {
            let content = (count * page_size) as u64;
            if !page_zstd::frame_states(&buf[at..total - CRC_BYTES], content) {
                return Err(RecordError::Frame { content });
            }
        }
        Ok(total)
    }

    /// Builds a record already `check`ed (no second CRC pass).
    fn parse_checked(buf: &Bytes, total: usize) -> Result<Record, RecordError> {
        let page_size = be32(buf, 36);
        let size = page_size as usize;
        let count = be32(buf, 44) as usize;
        let mut pages = Vec::with_capacity(count);
        if is_compressed(buf) {
            // `check` bounded count x page_size by MAX_RECORD_BYTES.
            let frame = HEADER_BYTES + 4 * count;
            let content = count * size;
            let images = page_zstd::decompress(&buf[frame..total - CRC_BYTES], content)
                .map(Bytes::from)
                .ok_or(RecordError::Decompress {
                    content: content as u64,
                })?;
            for i in 0..count {
                let no = be32(buf, HEADER_BYTES + 4 * i);
                pages.push((no, images.slice(i * size..(i + 1) * size)));
            }
        } else {
            let mut at = HEADER_BYTES;
            for _ in 0..count {
                let no = be32(buf, at);
                pages.push((no, buf.slice(at + 4..at + 4 + size)));
                at += 4 + size;
            }
            debug_assert_eq!(at + CRC_BYTES, total);
        }
        let record = Record {
            bookmark: bookmark_at(buf, 12),
            previous: bookmark_at(buf, 24),
            prev_chain: ChainHash::at(buf, PREV_CHAIN_AT),
            commit_us: be64(buf, COMMIT_AT),
            page_size,
            db_pages: be32(buf, 40),
            pages,
        };
        // Cheap (no CRC); keeps the one definition of a valid record.
        record.validate()?;
        Ok(record)
    }
}

/// A validated record still in its encoded form: the position fields the
/// protocol needs plus the bytes that are stored and sent as they are. The
/// replicator moves records in this form (followers never look at pages);
/// only a replica decodes the pages, with [`Encoded::record`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encoded {
    pub bookmark: Bookmark,
    pub previous: Bookmark,
    /// The previous record's chain, and this record's.
    pub prev_chain: ChainHash,
    pub chain: ChainHash,
    /// Exactly one whole record, CRC checked.
    pub bytes: Bytes,
}

impl Encoded {
    /// Validates the record at the start of `buf` (every bound and the CRC)
    /// and keeps a slice of it; returns the bytes it used.
    pub fn decode(buf: &Bytes) -> Result<(Encoded, usize), RecordError> {
        // Checked in place: no page list is built for a record that is only
        // stored and forwarded.
        let used = Record::check(buf)?;
        Ok((
            Encoded {
                bookmark: bookmark_at(buf, 12),
                previous: bookmark_at(buf, 24),
                prev_chain: ChainHash::at(buf, PREV_CHAIN_AT),
                chain: ChainHash::at(buf, CHAIN_AT),
                bytes: buf.slice(..used),
            },
            used,
        ))
    }

    /// The record's pages (slices of `bytes`, no copy; the CRC was checked
    /// when this was decoded or encoded).
    pub fn record(&self) -> Result<Record, RecordError> {
        Record::parse_checked(&self.bytes, self.bytes.len())
    }

    /// The leader's wall clock at commit (see [`Record::commit_us`]).
    pub fn commit_us(&self) -> u64 {
        be64(&self.bytes, COMMIT_AT)
    }

    /// Whether the stored chain is the hash of what it covers (a full pass
    /// over the record; the CRC already guards against damage, so this is
    /// for audits and tests, not the hot path).
    pub fn chain_is_valid(&self) -> bool {
        let b = &self.bytes;
        b.len() >= HEADER_BYTES + CRC_BYTES
            && ChainHash::over(&[&b[..CHAIN_AT], &b[COMMIT_AT..b.len() - CRC_BYTES]]) == self.chain
    }

    /// Whether a later chunk of the same transaction follows this record
    /// (it commits nothing by itself).
    pub fn continued(&self) -> bool {
        self.bytes.len() >= HEADER_BYTES
            && u16::from_be_bytes([self.bytes[6], self.bytes[7]]) & FLAG_CONTINUED != 0
    }
}

impl Record {
    /// Encodes the record once, for storing and sending.
    pub fn to_encoded(&self) -> Result<Encoded, RecordError> {
        self.to_encoded_chunk(false)
    }

    /// Encodes one chunk of a transaction; `continued` as in
    /// [`Record::encode_flagged`].
    pub fn to_encoded_chunk(&self, continued: bool) -> Result<Encoded, RecordError> {
        self.to_encoded_with(continued, PageCompression::Plain)
    }

    /// Encodes one chunk with its images stored as `compression` asks.
    pub fn to_encoded_with(
        &self,
        continued: bool,
        compression: PageCompression,
    ) -> Result<Encoded, RecordError> {
        let bytes = self.encode_with(continued, compression)?;
        Ok(Encoded {
            bookmark: self.bookmark,
            previous: self.previous,
            prev_chain: self.prev_chain,
            chain: ChainHash::at(&bytes, CHAIN_AT),
            bytes,
        })
    }
}

/// Test support: records that chain without each test tracking hashes.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;
    use std::cell::RefCell;
    use std::collections::HashMap;

    thread_local! {
        static CHAINS: RefCell<HashMap<Bookmark, ChainHash>> = RefCell::new(HashMap::new());
    }

    /// The chain of the record last built at `at` by [`chained`] on this
    /// thread (the genesis chain if none).
    pub(crate) fn chain_at(at: Bookmark) -> ChainHash {
        CHAINS.with(|m| m.borrow().get(&at).copied().unwrap_or(ChainHash::GENESIS))
    }

    /// `r` chained onto the record last built at its `previous`, encoded.
    pub(crate) fn chained(mut r: Record, continued: bool) -> Encoded {
        r.prev_chain = chain_at(r.previous);
        let e = r.to_encoded_chunk(continued).expect("valid record");
        CHAINS.with(|m| m.borrow_mut().insert(e.bookmark, e.chain));
        e
    }
}

#[cfg(test)]
#[path = "record_tests.rs"]
mod tests;
