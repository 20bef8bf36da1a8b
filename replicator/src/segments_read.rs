//! The read side of a segment log: a batch of records located in the
//! log's segment files ([`ReadPlan`], made by `SegmentLog::plan_batch`, or
//! by the shared log over its own segments), read with one read per run of
//! close records, and checked when read without the log's lock.
//!
//! A read made without the log's lock is an uploader's, taking the
//! confirmed tail to cold storage: it is not on any commit's path, and it
//! yields the disk to the durable writes of the followers that share it
//! ([`Pace::Yielding`]). A read made under the lock (a peer's catch-up)
//! reads at once.

use super::{Entry, SegmentError, SegmentLog, io_at};
use crate::bookmark::Bookmark;
use crate::chain::ChainHash;
use crate::direct_io::{Advice, advise};
use crate::record::Encoded;
use bytes::Bytes;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Bytes between two records of a plan up to which they are read
/// together (reading a little more beats another read).
pub const READ_GAP: u64 = 64 << 10;

/// The most one read asks of the disk at once (see [`ReadPlan::read`]).
const READ_PIECE: usize = 256 << 10;

/// The longest a yielding read leaves the disk to others after a piece
/// (see [`pause_after`]).
const MAX_PAUSE: Duration = Duration::from_millis(4);

/// How a read shares the disk with the log's durable writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pace {
    /// Piece after piece, with the kernel's readahead (a peer's catch-up,
    /// read under the log's lock).
    AtOnce,
    /// No readahead, and after each piece the disk left to others for as
    /// long as the piece took ([`pause_after`]); the pages read are dropped
    /// from the page cache afterwards. For an uploader's read of the
    /// confirmed tail, which otherwise came as a burst of 16-26 MiB of
    /// reads every 16 MiB of log, with a lone writer's slow commits (over
    /// 3 ms) in clusters at each (papers/performance.md, lever 67).
    Yielding,
}

/// The pause after a piece that took `took` to read: as long again, so
/// that the uploader holds the disk at most half the time while it reads,
/// and at most [`MAX_PAUSE`], so that an upload's read stays bounded (a
/// 16 MiB object is 64 pieces: at most 256 ms of pauses).
fn pause_after(took: Duration) -> Duration {
    took.min(MAX_PAUSE)
}

/// A batch of records located in the log's files, read by [`read`]
/// (see [`SegmentLog::plan_batch`]).
///
/// [`read`]: ReadPlan::read
#[derive(Debug, Clone)]
pub struct ReadPlan {
    pub(super) dir: PathBuf,
    pub(super) entries: Vec<Entry>,
}

impl ReadPlan {
    /// A plan over segment files `<dir>/<index:016x>.seg` another log
    /// keeps (the shared log's): per record its bookmark, chain, segment,
    /// offset and length.
    pub(crate) fn from_parts(
        dir: PathBuf,
        parts: impl IntoIterator<Item = (Bookmark, ChainHash, u64, u64, u64)>,
    ) -> ReadPlan {
        let entries = parts
            .into_iter()
            .map(|(bookmark, chain, segment, offset, len)| Entry {
                bookmark,
                chain,
                segment,
                offset,
                len,
            })
            .collect();
        ReadPlan { dir, entries }
    }

    /// How many records the plan reads.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The reads `read` makes: runs of the plan's records (by index) in
    /// one segment whose bytes lie close together, each with the span
    /// covering them. In a segment log a segment's records are back to
    /// back (one read per segment); in the shared log a database's records
    /// are interleaved with others', and compaction may have moved an
    /// older one behind a newer one: a gap over [`READ_GAP`] starts a new
    /// read rather than reading everyone's records in between.
    fn reads(&self) -> Vec<(u64, u64, u64, std::ops::Range<usize>)> {
        let mut out: Vec<(u64, u64, u64, std::ops::Range<usize>)> = Vec::new();
        for (i, e) in self.entries.iter().enumerate() {
            let end = e.offset + e.len;
            if let Some((seg, lo, hi, run)) = out.last_mut() {
                let near =
                    e.offset <= hi.saturating_add(READ_GAP) && end.saturating_add(READ_GAP) >= *lo;
                if *seg == e.segment && near {
                    *lo = (*lo).min(e.offset);
                    *hi = (*hi).max(end);
                    run.end = i + 1;
                    continue;
                }
            }
            out.push((e.segment, e.offset, end, i..i + 1));
        }
        out
    }

    /// Bytes `read` reads from the files.
    pub fn span_bytes(&self) -> u64 {
        self.reads().iter().map(|(_, lo, hi, _)| hi - lo).sum()
    }

    /// The encoded records, in order: each run of close records with one
    /// read.
    pub fn read(&self) -> Result<Vec<Bytes>, SegmentError> {
        self.read_paced(Pace::AtOnce)
    }

    fn read_paced(&self, pace: Pace) -> Result<Vec<Bytes>, SegmentError> {
        let mut out = Vec::with_capacity(self.entries.len());
        let mut open: Option<(u64, File)> = None;
        for (segment, lo, hi, run) in self.reads() {
            let path = SegmentLog::segment_path(&self.dir, segment);
            if open.as_ref().is_none_or(|(s, _)| *s != segment) {
                let file = File::open(&path).map_err(io_at(&path))?;
                if pace == Pace::Yielding {
                    advise(&file, 0, 0, Advice::Random);
                }
                open = Some((segment, file));
            }
            let Some((_, file)) = &open else {
                continue;
            };
            let mut buf = vec![0u8; (hi - lo) as usize];
            // In pieces: one large read queues all of itself at the disk
            // at once, and every durable write behind it waits (16 MiB,
            // 15-20 ms on the test machine's disk, on every follower
            // sharing it). A piece at a time lets them in between; a
            // yielding read also waits between pieces (see `Pace`).
            let pieces = buf.len().div_ceil(READ_PIECE);
            for (i, piece) in buf.chunks_mut(READ_PIECE).enumerate() {
                let at = lo + (i * READ_PIECE) as u64;
                let started = Instant::now();
                file.read_exact_at(piece, at).map_err(io_at(&path))?;
                if pace == Pace::Yielding && i + 1 < pieces {
                    std::thread::sleep(pause_after(started.elapsed()));
                }
            }
            if pace == Pace::Yielding {
                advise(file, lo, hi - lo, Advice::DontNeed);
            }
            let buf = Bytes::from(buf);
            for e in &self.entries[run] {
                let at = (e.offset - lo) as usize;
                out.push(buf.slice(at..at + e.len as usize));
            }
        }
        Ok(out)
    }

    /// [`read`](ReadPlan::read), each record decoded (its CRC checked) and
    /// checked to be the one located there (bookmark and chain): for a read
    /// made after the log's lock was released. [`SegmentError::Moved`]
    /// otherwise.
    ///
    /// Such a read is an uploader's: it yields the disk ([`Pace`]).
    pub fn read_checked(&self) -> Result<Vec<Bytes>, SegmentError> {
        let out = self.read_paced(Pace::Yielding)?;
        for (bytes, e) in out.iter().zip(&self.entries) {
            match Encoded::decode(bytes) {
                Ok((r, used))
                    if r.bookmark == e.bookmark && r.chain == e.chain && used == bytes.len() => {}
                _ => {
                    return Err(SegmentError::Moved {
                        bookmark: e.bookmark,
                    });
                }
            }
        }
        Ok(out)
    }
}
