//! Retention: releasing the prefix of a log that cold storage holds, and
//! starting a log over after a peer's released start.
//!
//! `release_through(upto)` deletes whole segments whose records are all at
//! or before `upto` and durable; never the segment being written. The log
//! then starts ("base") at the last released record. Three steps, in this
//! order:
//!
//! 1. the new base (bookmark, chain, epoch history of the released prefix,
//!    first segment kept) is stored in the `released` marker, atomically
//!    and durably ([`crate::marker`]): this is the commit point;
//! 2. the released segments are unlinked, or those of the full segment
//!    size renamed into the log's pool for reuse while it has room
//!    ([`crate::recycle`]);
//! 3. the directory is synced.
//!
//! A crash before 1 completes leaves the old marker (or none) and every
//! segment: the log reopens as it was. A crash after 1 leaves segments the
//! marker says were released (all, some, or, when the unlinks were not yet
//! durable, all again): `open` removes every segment below the first kept
//! index before it scans. Either way the log reopens at a consistent start.
//!
//! `reset_to(start, ..)` is the same move for a log that ends before a
//! peer's released start: the marker names `start` and a first index above
//! every segment there is, then every segment is unlinked.

use super::{Entry, SegmentError, SegmentLog};
use crate::bookmark::Bookmark;
use crate::chain::ChainHash;
use crate::history::History;
use crate::prealloc;
use crate::recycle;
use crate::unlink::Unlink;

/// What [`SegmentLog::release_through`] released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Released {
    /// Segment files deleted.
    pub segments: usize,
    /// Their bytes on disk.
    pub bytes: u64,
    /// The log's start afterwards (unchanged if nothing was released).
    pub start: Bookmark,
}

/// A release decided but not yet carried out (the steps are separate so
/// tests can stop between them, as a crash would).
#[derive(Debug, Clone)]
pub(super) struct Plan {
    pub(super) marker: base::Base,
    /// Segments to delete, oldest first.
    pub(super) segments: Vec<u64>,
    /// Records released (the first `records` entries).
    pub(super) records: usize,
}

impl SegmentLog {
    /// Where the log starts: the bookmark before its first record (the
    /// last released record once a prefix was released).
    pub fn start(&self) -> Bookmark {
        self.base
    }

    /// Bytes of the segment files on disk.
    pub fn disk_bytes(&self) -> u64 {
        self.sizes.values().sum()
    }

    /// Segments holding records, oldest first, each with its last entry.
    fn runs(&self) -> impl DoubleEndedIterator<Item = Entry> + '_ {
        self.entries
            .chunk_by(|a, b| a.segment == b.segment)
            .map(|run| run[run.len() - 1])
    }

    fn current_index(&self) -> Option<u64> {
        self.current.as_ref().map(|(i, _)| *i)
    }

    /// A release point that keeps at least `keep_bytes` of the newest
    /// records here: the last record of the newest whole, durable segment
    /// (not the one being written) such that the segment files after it
    /// hold at least `keep_bytes`. The log's start if there is none.
    pub fn release_point(&self, keep_bytes: u64) -> Bookmark {
        let current = self.current_index();
        let mut newer = 0u64;
        let mut sizes = self.sizes.iter().rev().peekable();
        for last in self.runs().rev() {
            while let Some((_, size)) = sizes.next_if(|(i, _)| **i > last.segment) {
                newer += size;
            }
            if Some(last.segment) != current && last.bookmark <= self.durable && newer >= keep_bytes
            {
                return last.bookmark;
            }
        }
        self.base
    }

    /// What releasing through `upto` would do: None if nothing can go.
    pub(super) fn plan_release(&self, upto: Bookmark) -> Option<Plan> {
        let limit = upto.min(self.durable);
        let current = self.current_index();
        let mut segments = Vec::new();
        let mut history = self.base_history.clone();
        let mut records = 0;
        let mut last = None;
        for run in self.entries.chunk_by(|a, b| a.segment == b.segment) {
            let end = run[run.len() - 1];
            if Some(end.segment) == current || end.bookmark > limit {
                break;
            }
            for e in run {
                history.record(e.bookmark);
            }
            records += run.len();
            segments.push(end.segment);
            last = Some(end);
        }
        let last = last?;
        Some(Plan {
            marker: base::Base {
                start: last.bookmark,
                chain: last.chain,
                // Segments are numbered without gaps from the first.
                first_kept: last.segment + 1,
                history,
            },
            segments,
            records,
        })
    }

    /// Takes a stored plan into the log's state (the marker is the commit
    /// point: from here the released segments are gone for `open` too).
    pub(super) fn commit_plan(&mut self, plan: &Plan) -> u64 {
        self.entries.drain(..plan.records);
        self.base = plan.marker.start;
        self.base_chain = Some(plan.marker.chain);
        self.base_history = plan.marker.history.clone();
        self.first_index = plan.marker.first_kept;
        plan.segments
            .iter()
            .filter_map(|i| self.sizes.remove(i))
            .sum()
    }

    /// The files of `segments` (each an index and whether it may be
    /// reused), to unlink (see [`crate::unlink`]); the reusable ones may go
    /// to the pool instead ([`crate::recycle`]).
    pub(super) fn unlinking(&self, segments: &[(u64, bool)]) -> Unlink {
        let files = segments
            .iter()
            .map(|&(i, reuse)| {
                (
                    Self::segment_path(&self.dir, i),
                    reuse.then(|| recycle::free_path(&self.dir, i)),
                )
            })
            .collect();
        Unlink::recycling(self.dir.clone(), files)
    }

    /// Each of `segments` with whether it may be reused: a segment of the
    /// full size (a smaller first one, or one sized for an odd record, is
    /// not worth keeping).
    pub(super) fn reusable(&self, segments: &[u64]) -> Vec<(u64, bool)> {
        segments
            .iter()
            .map(|i| (*i, self.sizes.get(i) == Some(&self.segment_bytes)))
            .collect()
    }

    /// Deletes the whole segment files whose records are all at or before
    /// `upto` and durable; never the segment being written, nor one holding
    /// a later or not yet durable record. Afterwards the log starts at the
    /// last released record (`chain_at` still answers for it, `history`
    /// still covers the released prefix), and reads from before it are
    /// refused with [`SegmentError::Released`].
    ///
    /// The caller (the archiver) must have made the records durable in
    /// cold storage first, and must release only confirmed records.
    pub fn release_through(&mut self, upto: Bookmark) -> Result<Released, SegmentError> {
        let (released, unlink) = self.release_deferred(upto)?;
        unlink.run()?;
        Ok(released)
    }

    /// [`Self::release_through`] but for the unlinks: the released
    /// segments leave the log (its marker is the commit point), and the
    /// caller unlinks their files after it has dropped its locks (see
    /// [`crate::unlink`]).
    pub fn release_deferred(&mut self, upto: Bookmark) -> Result<(Released, Unlink), SegmentError> {
        if self.failed {
            return Err(SegmentError::Failed);
        }
        let Some(plan) = self.plan_release(upto) else {
            let nothing = Released {
                segments: 0,
                bytes: 0,
                start: self.base,
            };
            return Ok((nothing, Unlink::none()));
        };
        base::store(&self.dir, &plan.marker)?;
        let segments = self.reusable(&plan.segments);
        let bytes = self.commit_plan(&plan);
        tracing::info!(
            start = %self.base,
            segments = plan.segments.len(),
            records = plan.records,
            bytes,
            disk_bytes = self.disk_bytes(),
            "released an archived prefix of the log"
        );
        let released = Released {
            segments: plan.segments.len(),
            bytes,
            start: self.base,
        };
        Ok((released, self.unlinking(&segments)))
    }

    /// Empties the log and starts it at `start` (a confirmed record whose
    /// chain is `chain`, with `history` the epoch history up to it), for a
    /// log that ends before a peer's released start: what it held is
    /// older than `start` (or diverged from the history that reaches it)
    /// and is dropped. Staged records are dropped too. Returns the bytes
    /// of the segment files removed.
    pub fn reset_to(
        &mut self,
        start: Bookmark,
        chain: ChainHash,
        history: History,
    ) -> Result<u64, SegmentError> {
        if self.failed {
            return Err(SegmentError::Failed);
        }
        if start <= self.last() {
            return Err(SegmentError::Reset {
                start,
                why: "the log already reaches it",
            });
        }
        if history.last() != start {
            return Err(SegmentError::Reset {
                start,
                why: "the epoch history does not end at it",
            });
        }
        let next = self
            .sizes
            .keys()
            .next_back()
            .map(|i| i + 1)
            .into_iter()
            .chain(self.current_index().map(|i| i + 1))
            .fold(self.first_index, u64::max);
        base::store(
            &self.dir,
            &base::Base {
                start,
                chain,
                first_kept: next,
                history: history.clone(),
            },
        )?;
        // Unlinked, not reused: what they hold is not of the history the
        // log now follows.
        let old: Vec<(u64, bool)> = self.sizes.keys().map(|i| (*i, false)).collect();
        let bytes = self.disk_bytes();
        self.entries.clear();
        self.pending.clear();
        self.rolled.clear();
        self.current = None;
        self.write_offset = 0;
        self.tail = Default::default();
        self.current_bytes = 0;
        self.sizes.clear();
        self.base = start;
        self.base_chain = Some(chain);
        self.base_history = history;
        self.first_index = next;
        self.durable = start;
        // A spare prepared for `next` (the usual case: the index after the
        // current segment) stays good: a spare is only zeros, and nothing
        // but its index and size decide whether the next roll takes it.
        prealloc::keep_only_for(&mut self.spare, next);
        self.unlinking(&old).run()?;
        Ok(bytes)
    }
}

/// The released marker, `<dir>/released` (a [`crate::marker`] of bounded
/// size): where the log starts once a prefix was released.
///
/// ```text
///  0  magic       b"WRRELEAS"                                       8
///  8  start       bookmark: epoch u32, sequence u64 BE             12
/// 20  chain       the start record's chain                         16
/// 36  first_kept  u64 BE: the first segment index kept; every
///                 segment below it is released                       8
/// 44  runs        u16 BE                                             2
/// 46  runs x      (epoch u32, last sequence u64 BE): the epoch
///                 history of the released prefix, ending at start
///                                                          12 x runs
/// 46+12r crc32    u32 BE over everything before it                   4
/// ```
pub(super) mod base {
    use super::super::{SegmentError, io_at};
    use crate::bookmark::{Bookmark, Epoch, Sequence};
    use crate::chain::ChainHash;
    use crate::history::{History, MAX_RUNS};
    use crate::marker::{self, MarkerError};
    use std::path::Path;

    pub(in crate::segments) const NAME: &str = "released";
    const MAGIC: &[u8] = b"WRRELEAS";
    const FIXED: usize = 12 + 16 + 8 + 2;

    /// What the marker holds.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub(in crate::segments) struct Base {
        pub(in crate::segments) start: Bookmark,
        pub(in crate::segments) chain: ChainHash,
        pub(in crate::segments) first_kept: u64,
        pub(in crate::segments) history: History,
    }

    fn damaged(dir: &Path, why: impl Into<String>) -> SegmentError {
        SegmentError::BaseMarker {
            path: dir.join(NAME),
            why: why.into(),
        }
    }

    pub(in crate::segments) fn store(dir: &Path, base: &Base) -> Result<(), SegmentError> {
        let runs = base.history.runs();
        let runs = &runs[runs.len().saturating_sub(MAX_RUNS)..];
        let mut payload = Vec::with_capacity(FIXED + 12 * runs.len());
        payload.extend_from_slice(&base.start.to_bytes());
        payload.extend_from_slice(&base.chain.to_bytes());
        payload.extend_from_slice(&base.first_kept.to_be_bytes());
        payload.extend_from_slice(&(runs.len() as u16).to_be_bytes());
        for (e, s) in runs {
            payload.extend_from_slice(&e.0.to_be_bytes());
            payload.extend_from_slice(&s.0.to_be_bytes());
        }
        marker::store(&dir.join(NAME), MAGIC, &payload).map_err(|e| match e {
            MarkerError::Io { source, .. } => io_at(dir)(source),
            MarkerError::Corrupt { why, .. } => damaged(dir, why),
        })
    }

    /// The marker, if a prefix was ever released. A damaged one is an
    /// error: the log's start is not guessed.
    pub(in crate::segments) fn load(dir: &Path) -> Result<Option<Base>, SegmentError> {
        let p = match marker::load_bounded(&dir.join(NAME), MAGIC, FIXED + 12 * MAX_RUNS) {
            Ok(None) => return Ok(None),
            Ok(Some(p)) => p,
            Err(MarkerError::Io { source, .. }) => return Err(io_at(dir)(source)),
            Err(MarkerError::Corrupt { why, .. }) => return Err(damaged(dir, why)),
        };
        if p.len() < FIXED {
            return Err(damaged(dir, "shorter than its fixed part"));
        }
        let be64 = |at: usize| {
            let mut raw = [0u8; 8];
            raw.copy_from_slice(&p[at..at + 8]);
            u64::from_be_bytes(raw)
        };
        let mut raw = [0u8; Bookmark::BYTE_LEN];
        raw.copy_from_slice(&p[..Bookmark::BYTE_LEN]);
        let start = Bookmark::from_bytes(raw);
        let mut raw = [0u8; ChainHash::BYTE_LEN];
        raw.copy_from_slice(&p[12..12 + ChainHash::BYTE_LEN]);
        let chain = ChainHash::from_bytes(raw);
        let first_kept = be64(28);
        let count = usize::from(u16::from_be_bytes([p[36], p[37]]));
        if p.len() != FIXED + 12 * count {
            return Err(damaged(dir, "its run count does not match its size"));
        }
        let runs = (0..count)
            .map(|i| {
                let at = FIXED + 12 * i;
                let epoch = u32::from_be_bytes([p[at], p[at + 1], p[at + 2], p[at + 3]]);
                (Epoch(epoch), Sequence(be64(at + 4)))
            })
            .collect();
        let history = History::from_runs(runs)
            .ok_or_else(|| damaged(dir, "its epoch history is out of order"))?;
        if history.last() != start {
            return Err(damaged(dir, "its epoch history does not end at its start"));
        }
        Ok(Some(Base {
            start,
            chain,
            first_kept,
            history,
        }))
    }
}
