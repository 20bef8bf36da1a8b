//! A durability follower's log on disk: records appended to segment files,
//! made durable in groups, scanned and cut back to the last valid record on
//! open.
//!
//! ```text
//! <dir>/<index:016x>.seg   index = 0, 1, 2, ... (or from the first index
//!                           the `released` marker keeps); each segment is
//!                           set to its size at creation (`segment_bytes`,
//!                           or with growth, see `grow_from`, the first
//!                           small and each next twice the newest up to
//!                           `segment_bytes`; or the size of a larger
//!                           record, which then has a segment of its own)
//!                           and holds records
//!                           (see `record`) back to back from offset 0;
//!                           the rest is zero (a zero magic ends the scan)
//! <dir>/<index:016x>.seg.tmp the next segment while it is built (see
//!                           `prealloc`; ahead of need, once the current
//!                           one is an eighth written); removed at open
//! <dir>/released           where the log starts once a prefix archived in
//!                           cold storage was released (see `release`)
//! <dir>/poisoned           left by a failed sync (see `poison`)
//! ```
//!
//! Durability is explicit: `append` checks a record and stages it (no I/O
//! but rolling to a new segment: a rename and a directory sync when the
//! segment was prepared ahead, see `prealloc`); `sync` writes everything
//! staged and makes it durable with one `fdatasync` per touched segment,
//! and returns the newest durable bookmark — one sync covers every record
//! appended before it (group commit). On Linux the writes and fdatasyncs of a sync go to
//! the kernel in one io_uring submission, each sync linked behind its
//! segment's writes; where io_uring is unavailable (or `WALRELAY_NO_URING`
//! is set) plain `pwrite` + `fdatasync` do the same. Either way a run of
//! records goes to the disk as whole blocks through an `O_DIRECT`
//! descriptor where the filesystem takes one (see `direct_io`: the block
//! holding the log's end is kept in memory and written again). Staged records are
//! not in the files until `sync`: catch-up (`read_after`) serves only
//! durable ones.
//!
//! Recovery (`open`) reads each segment in order and keeps records while
//! they decode (magic, bounds, CRC) and chain (`previous` = the bookmark
//! before). The first record that does not — a torn or corrupt tail — and
//! everything after it is cut: its bytes are zeroed so later scans stop
//! there too, and later segments are removed. Cut records are fetched again
//! from the leader or a peer.
//!
//! Retention: once cold storage holds a confirmed prefix, whole segments of
//! it are released (`release_through`) and the log starts after them (its
//! "base", kept in the `released` marker with its chain and epoch
//! history); reads from before the start are refused
//! ([`SegmentError::Released`]), never silently skipped.

use crate::bookmark::Bookmark;
use crate::chain::ChainHash;
use crate::direct_io::{RunWrite, SegFile, Tail};
use crate::history::History;
use crate::prealloc::{self, Spare};
use crate::record::{Encoded, RecordError};
use crate::recycle;
use bytes::Bytes;
use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

#[cfg(target_os = "linux")]
use crate::uring;

/// Requests per io_uring submission: a sync is one writev per run of up to
/// 1024 records plus one fdatasync per segment, so this rarely splits.
#[cfg(target_os = "linux")]
const RING_ENTRIES: u32 = 32;

/// Why the segment log failed.
#[derive(Debug, thiserror::Error)]
pub enum SegmentError {
    #[error("segment I/O on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("record does not follow the log: previous {previous}, log ends at {last}")]
    Discontinuous { previous: Bookmark, last: Bookmark },
    #[error(transparent)]
    Record(#[from] RecordError),
    /// After a failed sync what reached the disk is unknown, and a retried
    /// fdatasync can report success for pages the kernel already dropped.
    #[error("an earlier sync failed; reopen the log to recover")]
    Failed,
    #[error(
        "{path} holds a valid record of {len} bytes in an older format (an older walrelay wrote it); refusing to open rather than cut it"
    )]
    LegacyRecord { path: PathBuf, len: u64 },
    #[error("record {bookmark} does not chain onto the log's last record")]
    ChainMismatch { bookmark: Bookmark },
    /// The records after `after` up to `start` were released to cold
    /// storage: this log cannot serve them.
    #[error(
        "the records after {after} were released (the log starts at {start}); fetch them from cold storage"
    )]
    Released { after: Bookmark, start: Bookmark },
    /// The `released` marker and the first segment kept disagree: the
    /// first record does not chain onto the released base. Refused rather
    /// than cut (nothing here says which of the two is wrong).
    #[error(
        "{path}: the first record kept ({bookmark}, after {previous}) does not chain onto the released base {start}"
    )]
    BaseMismatch {
        path: PathBuf,
        start: Bookmark,
        bookmark: Bookmark,
        previous: Bookmark,
    },
    /// The `released` marker cannot be read: where the log starts is not
    /// known, so it is not opened.
    #[error("{path} is damaged ({why}); refusing to open a log whose start is unknown")]
    BaseMarker { path: PathBuf, why: String },
    #[error("cannot reset the log to start at {start}: {why}")]
    Reset { start: Bookmark, why: &'static str },
    /// A record read without the log's lock is not the one located there
    /// (its segment was released or rewritten in between).
    #[error("record {bookmark} is no longer where the log located it")]
    Moved { bookmark: Bookmark },
}

/// How `sync` does its I/O.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IoBackend {
    /// io_uring when the kernel allows it and `WALRELAY_NO_URING` is unset
    /// (or empty or `0`), else `Std`.
    #[default]
    Auto,
    /// `pwrite` + `fdatasync`.
    Std,
}

fn uring_forbidden() -> bool {
    std::env::var_os("WALRELAY_NO_URING").is_some_and(|v| !v.is_empty() && v != "0")
}

pub(crate) enum Io {
    Std,
    #[cfg(target_os = "linux")]
    Uring(Box<parking_lot::Mutex<uring::SyncRing>>),
}

impl std::fmt::Debug for Io {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Io {
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Io::Std => "std",
            #[cfg(target_os = "linux")]
            Io::Uring(_) => "io_uring",
        }
    }

    /// Writes each run (tagged with its segment's index) and makes it
    /// durable, one sync per run's descriptor: on io_uring all in one
    /// submission, each sync linked behind its run's writes. An error
    /// comes with the segment it is tied to (none for a submission).
    pub(crate) fn write_runs(
        &self,
        runs: &[(u64, RunWrite<'_>)],
    ) -> Result<(), (Option<u64>, io::Error)> {
        match self {
            Io::Std => {
                for (index, run) in runs {
                    for (offset, bytes) in run.writes() {
                        run.file()
                            .write_all_at(bytes, offset)
                            .map_err(|e| (Some(*index), e))?;
                    }
                }
                for (index, run) in runs {
                    run.file().sync_data().map_err(|e| (Some(*index), e))?;
                }
                Ok(())
            }
            #[cfg(target_os = "linux")]
            Io::Uring(ring) => {
                use std::os::fd::AsFd;
                let mut writes = Vec::new();
                let mut syncs = Vec::new();
                for (_, run) in runs {
                    let fd = run.file().as_fd();
                    writes.extend(
                        run.writes()
                            .into_iter()
                            .map(|(offset, bytes)| (fd, offset, bytes)),
                    );
                    syncs.push(fd);
                }
                // The ring is behind a lock only so that the runs can
                // borrow the files while it runs (one sync at a time
                // anyway: a log's `sync` takes `&mut self`).
                ring.lock()
                    .write_and_sync(&writes, &syncs)
                    .map_err(|e| (None, e))
            }
        }
    }

    pub(crate) fn choose(backend: IoBackend) -> Io {
        if backend == IoBackend::Std || uring_forbidden() {
            return Io::Std;
        }
        #[cfg(target_os = "linux")]
        if let Ok(ring) = uring::SyncRing::new(RING_ENTRIES) {
            return Io::Uring(Box::new(parking_lot::Mutex::new(ring)));
        }
        Io::Std
    }
}

/// A staged record: bytes to write at `offset` of segment `segment`.
struct Pending {
    segment: u64,
    offset: u64,
    bytes: Bytes,
    /// For the first record staged in its segment since the last sync
    /// (where a run of records written together starts): the segment's
    /// bytes before `offset` in its block.
    run_tail: Option<Tail>,
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}+{}", self.segment, self.offset, self.bytes.len())
    }
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    bookmark: Bookmark,
    chain: ChainHash,
    segment: u64,
    offset: u64,
    len: u64,
}

/// What `open` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Recovery {
    pub records: usize,
    /// Bytes of a torn or corrupt tail that were cut.
    pub cut_bytes: u64,
    /// A damaged record with valid records after it (not a torn tail: bit
    /// rot, a bad sector, a stray write): the log ends at this bookmark,
    /// the last good one, and what followed was moved to `quarantine/` to
    /// be fetched again from the leader and peers.
    pub mid_log_corruption: Option<Bookmark>,
    /// Valid-looking records found after the damage (refetched, not kept).
    pub records_after_corruption: usize,
    pub segments_removed: usize,
    /// Segments the `released` marker says were released that a crash
    /// (between the marker and their unlink) left behind, removed now.
    pub released_removed: usize,
    /// Segments reused from the pool whose earlier records lie past the
    /// log's end (stale: never kept, overwritten as the log grows; see
    /// `crate::recycle`).
    pub stale_segments: usize,
}

/// The log of one follower.
#[derive(Debug)]
pub struct SegmentLog {
    dir: PathBuf,
    segment_bytes: u64,
    /// The size of a log's first segment (`segment_bytes` unless
    /// `grow_from` set it lower): each later one doubles the newest, up to
    /// `segment_bytes`.
    first_segment_bytes: u64,
    /// Where the log starts: the bookmark before its first record (the
    /// last released one, or the start given to `open`).
    base: Bookmark,
    /// The base's chain, if known (always, once a prefix was released).
    base_chain: Option<ChainHash>,
    /// The epoch history up to the base (of the released prefix).
    base_history: History,
    /// The first segment's index (the next segment's, when there is none).
    first_index: u64,
    /// The size of every segment file, by index.
    sizes: BTreeMap<u64, u64>,
    entries: Vec<Entry>,
    current: Option<(u64, SegFile)>,
    write_offset: u64,
    /// The current segment's bytes before `write_offset` in its block (see
    /// `direct_io`).
    tail: Tail,
    /// The current segment's size (`segment_bytes`, or more for one that
    /// holds an oversized record).
    current_bytes: u64,
    /// Records appended since the last sync, in order.
    pending: Vec<Pending>,
    /// Segments rolled away from that still have pending records.
    rolled: Vec<(u64, SegFile)>,
    durable: Bookmark,
    io: Io,
    failed: bool,
    /// The next segment, prepared ahead once the current one is an eighth
    /// written (see `prealloc`).
    spare: Option<Spare>,
    spares_used: u64,
    /// Whether the pool held a file for the next roll, as last looked
    /// for that roll's index (once per segment, when a spare would start).
    pool_for: Option<(u64, bool)>,
    /// Segments reused from the pool ([`crate::recycle`]).
    recycled: u64,
}

fn io_at(path: &Path) -> impl Fn(io::Error) -> SegmentError + '_ {
    move |source| SegmentError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl SegmentLog {
    fn segment_path(dir: &Path, index: u64) -> PathBuf {
        dir.join(format!("{index:016x}.seg"))
    }

    /// The newest record's bookmark (or the base).
    pub fn last(&self) -> Bookmark {
        self.entries.last().map_or(self.base, |e| e.bookmark)
    }

    /// The newest record's chain; for an empty log, the base's: the
    /// genesis chain if it starts at the beginning of history, the last
    /// released record's after a release, None (not known) otherwise.
    pub fn last_chain(&self) -> Option<ChainHash> {
        match self.entries.last() {
            Some(e) => Some(e.chain),
            None => self.base_chain,
        }
    }

    /// The chain of the record at `at` (the base's if it is the base and
    /// known: after a release, the last released record's).
    pub fn chain_at(&self, at: Bookmark) -> Option<ChainHash> {
        if at == self.base {
            return self.base_chain;
        }
        let i = self
            .entries
            .binary_search_by(|e| e.bookmark.cmp(&at))
            .ok()?;
        Some(self.entries[i].chain)
    }

    /// The log's epoch history, the released prefix's included.
    pub fn history(&self) -> History {
        let mut h = self.base_history.clone();
        for e in &self.entries {
            h.record(e.bookmark);
        }
        h
    }

    /// Cuts every record after `keep` (a bookmark the log holds, or its
    /// base), durably: what was staged is written first, so nothing cut
    /// comes back at the next sync. Returns the bytes cut. Never cuts
    /// below the base: a released prefix is confirmed history.
    pub fn truncate_after(&mut self, keep: Bookmark) -> Result<u64, SegmentError> {
        if keep < self.base {
            tracing::warn!(keep = %keep, start = %self.base, "a cut below the released start stops at the start");
        }
        let keep = keep.max(self.base);
        self.sync()?;
        let cut = self.cut_after(keep)?;
        self.durable = self.durable.min(self.last());
        Ok(cut)
    }

    /// The newest bookmark made durable by `sync`.
    pub fn durable(&self) -> Bookmark {
        self.durable
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// `"io_uring"` or `"std"`: what `sync` uses, chosen at `open`.
    pub fn io_backend(&self) -> &'static str {
        self.io.name()
    }

    /// Whether appends go to the disk as direct writes (see `direct_io`):
    /// the segment being written has a direct descriptor.
    pub fn direct_io(&self) -> bool {
        self.current
            .as_ref()
            .is_some_and(|(_, f)| f.direct.is_some())
    }

    /// Makes new segments start small: the next one created is
    /// `first_bytes` if the log has none (else twice the newest), each
    /// later one twice the one before, up to `segment_bytes`. A database
    /// that writes little then holds little on disk (a follower hosting
    /// many databases), and a busy one reaches full-size segments after a
    /// few rolls. Existing segments keep their sizes.
    pub fn grow_from(&mut self, first_bytes: u64) {
        self.first_segment_bytes = first_bytes.clamp(1, self.segment_bytes.max(1));
    }

    /// The size of the next segment: see `grow_from`.
    fn next_segment_bytes(&self) -> u64 {
        let newest = self.sizes.values().next_back().copied().unwrap_or(0);
        newest
            .saturating_mul(2)
            .max(self.first_segment_bytes)
            .min(self.segment_bytes)
    }

    /// Whether records are staged that no `sync` has written yet.
    pub fn has_staged(&self) -> bool {
        !self.pending.is_empty()
    }

    /// The index the next roll creates.
    fn next_index(&self) -> u64 {
        self.current
            .as_ref()
            .map_or(self.first_index, |(i, _)| i + 1)
    }

    fn roll(&mut self, at_least: u64) -> Result<(), SegmentError> {
        let size = self.next_segment_bytes().max(at_least);
        let index = self.next_index();
        let path = Self::segment_path(&self.dir, index);
        // A released segment from the pool, the spare prepared ahead, or
        // zeros written inline (see `recycle` and `prealloc`).
        let (created, reused) =
            recycle::reuse_or_create(&self.dir, &path, index, size, self.spare.take())?;
        self.recycled += u64::from(reused);
        self.spares_used += u64::from(created.from_spare);
        let size = created.size;
        self.sizes.insert(index, size);
        if let Some((old, old_file)) = self.set_current(index, created.file, 0, size)? {
            // Its staged records are written at the next sync.
            if self.pending.last().is_some_and(|p| p.segment == old) {
                self.rolled.push((old, old_file));
            }
        }
        Ok(())
    }

    /// Makes segment `index`, open as `file` (read-write), of `size`
    /// bytes, the one appended to from `write_offset`; returns the one it
    /// replaces.
    fn set_current(
        &mut self,
        index: u64,
        file: File,
        write_offset: u64,
        size: u64,
    ) -> Result<Option<(u64, SegFile)>, SegmentError> {
        let path = Self::segment_path(&self.dir, index);
        self.tail = Tail::read(&file, write_offset).map_err(io_at(&path))?;
        let file = SegFile::new(file, &path).map_err(io_at(&path))?;
        self.write_offset = write_offset;
        self.current_bytes = size;
        Ok(self.current.replace((index, file)))
    }

    /// Once the current segment is an eighth written, starts preparing the next
    /// one on a thread of its own (see `prealloc`), so the roll finds it
    /// ready instead of zero-filling inline on the caller's (the
    /// transport's) thread.
    fn prepare_next(&mut self) {
        if self.current.is_some() {
            let (index, size) = (self.next_index(), self.next_segment_bytes());
            // No spare while the pool holds a segment for that roll
            // (looked for once per roll, when a spare would start).
            if prealloc::spare_due(self.write_offset, self.current_bytes)
                && self.spare.is_none()
                && recycle::serves(&mut self.pool_for, &self.dir, index, size)
            {
                return;
            }
            prealloc::keep_ready(
                &mut self.spare,
                self.write_offset,
                self.current_bytes,
                index,
                size,
                || Self::segment_path(&self.dir, index),
            );
        }
    }

    /// Segments created from a spare prepared ahead (the others were
    /// zero-filled inline at their roll).
    pub fn spares_used(&self) -> u64 {
        self.spares_used
    }

    /// Segments reused from the pool of released ones instead of written
    /// anew ([`crate::recycle`]).
    pub fn segments_recycled(&self) -> u64 {
        self.recycled
    }

    /// Appends one encoded record, staged until the next `sync` (which
    /// writes it). It must follow the log: its `previous` is the log's last
    /// bookmark.
    pub fn append(&mut self, record: &Bytes) -> Result<(), SegmentError> {
        let (r, _) = Encoded::decode(record)?;
        self.append_encoded(&r)
    }

    /// Appends a record already validated as [`Encoded`] (by the wire
    /// decoder): no second CRC pass over its bytes.
    pub fn append_encoded(&mut self, r: &Encoded) -> Result<(), SegmentError> {
        if self.failed {
            return Err(SegmentError::Failed);
        }
        let used = r.bytes.len();
        let record = &r.bytes;
        let len = used as u64;
        if r.previous != self.last() {
            return Err(SegmentError::Discontinuous {
                previous: r.previous,
                last: self.last(),
            });
        }
        if self.last_chain().is_some_and(|c| c != r.prev_chain) {
            return Err(SegmentError::ChainMismatch {
                bookmark: r.bookmark,
            });
        }
        // A record larger than a segment gets a segment of its own: every
        // valid record fits somewhere (bounded by MAX_RECORD_BYTES).
        if self.current.is_none() || self.write_offset + len > self.current_bytes {
            self.roll(len)?;
        }
        let index = self
            .current
            .as_ref()
            .map(|(i, _)| *i)
            .ok_or_else(|| SegmentError::Io {
                path: self.dir.clone(),
                source: io::Error::other("no current segment"),
            })?;
        let starts_run = self.pending.last().is_none_or(|p| p.segment != index);
        self.pending.push(Pending {
            segment: index,
            offset: self.write_offset,
            bytes: record.slice(..used),
            run_tail: starts_run.then(|| self.tail.clone()),
        });
        self.tail.advance(record);
        self.entries.push(Entry {
            bookmark: r.bookmark,
            chain: r.chain,
            segment: index,
            offset: self.write_offset,
            len,
        });
        self.write_offset += len;
        self.prepare_next();
        Ok(())
    }

    /// Writes every staged record and makes it durable; returns the durable
    /// bookmark. After an error the log refuses all work
    /// ([`SegmentError::Failed`]) until reopened.
    pub fn sync(&mut self) -> Result<Bookmark, SegmentError> {
        if self.failed {
            return Err(SegmentError::Failed);
        }
        let upto = self.last();
        let done = self.write_pending();
        self.finish_sync(upto, done)
    }

    /// Ends a sync of everything staged up to `upto` that `done` says
    /// succeeded or failed (see `sync`).
    fn finish_sync(
        &mut self,
        upto: Bookmark,
        done: Result<(), SegmentError>,
    ) -> Result<Bookmark, SegmentError> {
        if let Err(e) = done {
            self.failed = true;
            // Best effort: a reopen must not trust what this failed sync
            // may or may not have written (a retried fdatasync can report
            // success for pages the kernel already dropped).
            let _ = recovery::poison::store(&self.dir, self.durable);
            return Err(e);
        }
        self.pending.clear();
        self.rolled.clear();
        self.durable = upto;
        Ok(upto)
    }

    /// The staged records as they go to the disk: one run per touched
    /// segment (records staged in a segment since the last sync lie back
    /// to back), each written directly where it can be (see `direct_io`).
    fn staged_runs(&self) -> Result<Vec<(u64, RunWrite<'_>)>, SegmentError> {
        let mut runs = Vec::new();
        let mut at = 0;
        while let Some(first) = self.pending.get(at) {
            let segment = first.segment;
            let n = self.pending[at..]
                .iter()
                .take_while(|p| p.segment == segment)
                .count();
            let run = &self.pending[at..at + n];
            at += n;
            let file = self
                .current
                .iter()
                .chain(self.rolled.iter())
                .find(|(i, _)| *i == segment)
                .map(|(_, f)| f)
                .ok_or_else(|| SegmentError::Io {
                    path: Self::segment_path(&self.dir, segment),
                    source: io::Error::other("staged record's segment is not open"),
                })?;
            let tail = first
                .run_tail
                .as_ref()
                .expect("a segment's first staged record carries its run's tail");
            let size = self.sizes.get(&segment).copied().unwrap_or(0);
            let pieces = run.iter().map(|p| (p.offset, &p.bytes[..])).collect();
            runs.push((segment, RunWrite::plan(file, size, tail.bytes(), pieces)));
        }
        Ok(runs)
    }

    /// The fdatasyncs a `sync` now would issue (one per touched segment).
    pub fn staged_segments(&self) -> usize {
        let mut n = 0;
        let mut last = None;
        for p in &self.pending {
            if last != Some(p.segment) {
                n += 1;
                last = Some(p.segment);
            }
        }
        n
    }

    fn write_pending(&self) -> Result<(), SegmentError> {
        let runs = self.staged_runs()?;
        let dir = &self.dir;
        self.io.write_runs(&runs).map_err(|(segment, source)| {
            // One io_uring submission ties no error to a segment.
            let path = match (segment, &runs[..]) {
                (Some(index), _) | (None, &[(index, _)]) => Self::segment_path(dir, index),
                _ => dir.clone(),
            };
            SegmentError::Io { path, source }
        })
    }

    /// The encoded records after `after`, in order (catch-up). Only durable
    /// records: ones appended since the last `sync` are not returned (they
    /// are not in the files yet, and catch-up must not serve them anyway).
    pub fn read_after(&self, after: Bookmark) -> Result<Vec<Bytes>, SegmentError> {
        self.read_batch(after, self.durable, usize::MAX)
    }

    /// The durable records after `after` and up to `upto`, in order, up to
    /// about `max_bytes` (always at least one record if there is one):
    /// catch-up is served in bounded batches.
    /// Refused ([`SegmentError::Released`]) for `after` before the log's
    /// start.
    pub fn read_batch(
        &self,
        after: Bookmark,
        upto: Bookmark,
        max_bytes: usize,
    ) -> Result<Vec<Bytes>, SegmentError> {
        self.plan_batch(after, upto, max_bytes)?.read()
    }

    /// Bytes of the durable records after `after` up to `upto`, from the
    /// index (no I/O). [`SegmentError::Released`] if `after` is before
    /// the log's start.
    pub fn bytes_between(&self, after: Bookmark, upto: Bookmark) -> Result<u64, SegmentError> {
        Ok(self.durable_span(after, upto)?.iter().map(|e| e.len).sum())
    }

    /// The index entries of the durable records after `after` up to
    /// `upto`; [`SegmentError::Released`] if `after` is before the start.
    fn durable_span(&self, after: Bookmark, upto: Bookmark) -> Result<&[Entry], SegmentError> {
        if after < self.base {
            return Err(SegmentError::Released {
                after,
                start: self.base,
            });
        }
        let start = self.entries.partition_point(|e| e.bookmark <= after);
        let end = self
            .entries
            .partition_point(|e| e.bookmark <= self.durable.min(upto));
        Ok(self.entries.get(start..end).unwrap_or_default())
    }

    /// Where the batch `read_batch` would return lies, to be read later
    /// ([`ReadPlan::read`]) without the log: a caller holding the log
    /// under a lock reads outside it. The plan stays valid as long as its
    /// segments are not deleted or reused, and only `release_through` (or
    /// a `reset_to`) deletes segments holding durable records that `cut`s
    /// never reach (a cut only removes records after a kept position); a
    /// released segment may be reused under a new index, which a read
    /// made meanwhile finds with [`ReadPlan::read_checked`].
    pub fn plan_batch(
        &self,
        after: Bookmark,
        upto: Bookmark,
        max_bytes: usize,
    ) -> Result<ReadPlan, SegmentError> {
        let span = self.durable_span(after, upto)?;
        // Choose the batch first (at least one record), then read each
        // segment's share with one read and slice the records out of it.
        let mut chosen = 0usize;
        let mut bytes = 0usize;
        for e in span {
            if chosen > 0 && bytes.saturating_add(e.len as usize) > max_bytes {
                break;
            }
            bytes += e.len as usize;
            chosen += 1;
        }
        Ok(ReadPlan {
            dir: self.dir.clone(),
            entries: span[..chosen].to_vec(),
        })
    }
}

#[path = "segments_read.rs"]
mod read;
pub use read::{READ_GAP, ReadPlan};

#[path = "segments_recovery.rs"]
mod recovery;

#[path = "segments_release.rs"]
mod release;

#[path = "segments_group.rs"]
mod group;
pub use group::{GroupSync, GroupSyncer};
pub use release::Released;

#[cfg(test)]
#[path = "segments_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "segments_release_tests.rs"]
mod release_tests;

#[cfg(test)]
#[path = "segments_recycle_tests.rs"]
mod recycle_tests;
