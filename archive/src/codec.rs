//! Bounds-checked big-endian reading and writing shared by the object
//! formats (`log_object`, `snapshot`, `manifest`); the formats themselves
//! live in those modules.

use crate::error::FormatError;
use walrelay_replicator::{Bookmark, ChainHash};

/// A cursor that never reads past its input: every read is checked and a
/// short input is a [`FormatError::Truncated`].
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8], what: &'static str) -> Reader<'a> {
        Reader { buf, at: 0, what }
    }

    pub(crate) fn position(&self) -> usize {
        self.at
    }

    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], FormatError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or(FormatError::Truncated {
                what: self.what,
                need: self.at.saturating_add(n) as u64,
                have: self.buf.len() as u64,
            })?;
        let s = &self.buf[self.at..end];
        self.at = end;
        Ok(s)
    }

    pub(crate) fn u16(&mut self) -> Result<u16, FormatError> {
        Ok(u16::from_be_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }

    pub(crate) fn u32(&mut self) -> Result<u32, FormatError> {
        Ok(u32::from_be_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, FormatError> {
        Ok(u64::from_be_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }

    pub(crate) fn bookmark(&mut self) -> Result<Bookmark, FormatError> {
        let raw: [u8; Bookmark::BYTE_LEN] = self.take(Bookmark::BYTE_LEN)?.try_into().expect("12");
        Ok(Bookmark::from_bytes(raw))
    }

    pub(crate) fn chain(&mut self) -> Result<ChainHash, FormatError> {
        let raw: [u8; ChainHash::BYTE_LEN] =
            self.take(ChainHash::BYTE_LEN)?.try_into().expect("16");
        Ok(ChainHash::from_bytes(raw))
    }

    /// Checks the magic and the version at the cursor.
    pub(crate) fn header(&mut self, magic: &[u8; 8], version: u16) -> Result<(), FormatError> {
        if self.take(8)? != magic {
            return Err(FormatError::Magic { what: self.what });
        }
        let v = self.u16()?;
        if v != version {
            return Err(FormatError::Version {
                what: self.what,
                version: v,
            });
        }
        let _flags = self.u16()?;
        Ok(())
    }
}

/// Big-endian writing into a growing buffer.
pub(crate) trait Put {
    fn bookmark(&mut self, b: Bookmark);
    fn chain(&mut self, c: ChainHash);
}

impl Put for Vec<u8> {
    fn bookmark(&mut self, b: Bookmark) {
        self.extend_from_slice(&b.to_bytes());
    }
    fn chain(&mut self, c: ChainHash) {
        self.extend_from_slice(&c.to_bytes());
    }
}

/// Starts an object: magic, version and zero flags (every format's first
/// 12 bytes), then the database id, in a buffer of `capacity`.
pub(crate) fn begin(magic: &[u8; 8], version: u16, database: u64, capacity: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(capacity);
    out.extend_from_slice(magic);
    out.extend_from_slice(&version.to_be_bytes());
    out.extend_from_slice(&0u16.to_be_bytes());
    out.extend_from_slice(&database.to_be_bytes());
    out
}

/// Ends an object: appends the digest of everything before it.
pub(crate) fn seal(mut out: Vec<u8>) -> Vec<u8> {
    let d = digest(&out);
    out.extend_from_slice(&d);
    out
}

/// BLAKE3-256 over `bytes`: the digest every object ends with.
pub(crate) fn digest(bytes: &[u8]) -> [u8; 32] {
    *blake3::hash(bytes).as_bytes()
}

pub(crate) const DIGEST_BYTES: usize = 32;

/// Splits an object into its body and trailing digest, checking it.
pub(crate) fn check_digest<'a>(
    object: &'a [u8],
    what: &'static str,
) -> Result<&'a [u8], FormatError> {
    if object.len() < DIGEST_BYTES {
        return Err(FormatError::Truncated {
            what,
            need: DIGEST_BYTES as u64,
            have: object.len() as u64,
        });
    }
    let (body, stored) = object.split_at(object.len() - DIGEST_BYTES);
    if digest(body) != stored {
        return Err(FormatError::Digest { what });
    }
    Ok(body)
}

/// Decompresses one zstd frame that must hold exactly `raw_len` bytes; the
/// bound is checked before anything is allocated.
pub(crate) fn unzstd(
    frame: &[u8],
    raw_len: u64,
    max: u64,
    what: &'static str,
) -> Result<Vec<u8>, FormatError> {
    if raw_len > max {
        return Err(FormatError::TooLarge {
            what,
            len: raw_len,
            max,
        });
    }
    let out =
        zstd::bulk::decompress(frame, raw_len as usize).map_err(|e| FormatError::Compression {
            what,
            why: e.to_string(),
        })?;
    if out.len() as u64 != raw_len {
        return Err(FormatError::Truncated {
            what,
            need: raw_len,
            have: out.len() as u64,
        });
    }
    Ok(out)
}

/// The compression level of every object: fixed, so any uploader that
/// compresses the same bytes with the same library produces the same
/// object.
pub(crate) const ZSTD_LEVEL: i32 = 3;

pub(crate) fn zstd(raw: &[u8], what: &'static str) -> Result<Vec<u8>, FormatError> {
    zstd::bulk::compress(raw, ZSTD_LEVEL).map_err(|e| FormatError::Compression {
        what,
        why: e.to_string(),
    })
}
