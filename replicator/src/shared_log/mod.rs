//! A follower host's shared log: one append-only log of segment files
//! into which every database's records go, with a per-database index in
//! memory. A database costs the host no file and no preallocated segment
//! of its own: at rest, only its share of the shared segments (what it
//! has not released) and its promise file.
//!
//! ```text
//! <host dir>/shared/<index:016x>.seg   segment files, index 0, 1, 2, ...
//!                                      (gaps where whole segments were
//!                                      deleted), each preallocated
//!                                      (zeros) to `segment_bytes` (or to
//!                                      one larger entry) and holding
//!                                      entries (see `format`) from 0
//! <host dir>/shared/poisoned           left by a failed sync: where the
//!                                      log was last known durable
//! ```
//!
//! # Contract
//!
//! A [`DbLog`] (one per database, cheap, holding no file) gives a
//! follower core exactly what a [`SegmentLog`](crate::segments::SegmentLog)
//! gives it, under the same method names: `append_encoded` (staged, no
//! I/O but rolling to a new segment), `durable`, `last`, `last_chain`,
//! `chain_at`, `history`, `start`, `truncate_after`, `reset_to`,
//! `release_through`, `release_point`, `plan_batch`/`read_batch`,
//! `disk_bytes` (the database's live share). [`SharedLog::sync`] writes
//! what every database staged and makes it durable with one `fdatasync`
//! per touched segment (one, unless the batch rolled) — group commit
//! across databases. Nothing is durable (nor served, nor acked by the
//! host) before a sync that covers it completed; after a failed sync the
//! log refuses all work until the process reopens it, and the reopen cuts
//! back to where it was last known durable (the poison marker).
//!
//! # Order
//!
//! Every entry carries a log sequence number (lsn), increasing in append
//! order. Recovery replays each database's entries in lsn order: records
//! must chain (a record that does not is skipped, it is refetched from a
//! peer), a cut drops that database's records after its `keep`, a release
//! drops those at or before its start and a reset all of them. The lsn,
//! not the position, orders: compaction copies live entries forward
//! keeping their lsn, and a copy and its original found together count
//! once.
//!
//! # Retention and compaction
//!
//! A release (after archiving) or reset writes the database's new base as
//! an entry and drops its records from the index; the bytes they held are
//! dead. A segment with nothing live is deleted when it is the oldest
//! (its cut and base entries then only concern records in itself) or
//! holds no cut or base entries at all. When more than `max_segments`
//! segments are kept, the oldest one's live entries (records, and the
//! latest base entry of each database) are copied forward and synced
//! before it is deleted, so one lagging database pins only its own
//! records, never whole segments of everyone's.
//!
//! # Descriptors
//!
//! The log keeps one file open, the segment being written (plus, until
//! the next sync, one it rolled away from); reads open and close theirs.

mod compaction;
pub mod format;
mod index;
mod migrate;
mod recovery;

use crate::bookmark::Bookmark;
use crate::chain::ChainHash;
use crate::history::History;
use crate::ids::DatabaseId;
use crate::record::Encoded;
use crate::segments::{Io, IoBackend, ReadPlan, Released, SegmentError};
use bytes::Bytes;
use format::Kind;
use index::{DbIndex, Loc, RecEntry};
use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use recovery::{Inspected, SharedRecovery};

/// How a shared log is shaped.
#[derive(Debug, Clone, Copy)]
pub struct SharedLogConfig {
    /// Each segment's size (an entry larger gets a segment of its own).
    pub segment_bytes: u64,
    /// Segments kept before compaction moves the oldest one's live
    /// entries forward.
    pub max_segments: usize,
    /// How syncs reach the disk.
    pub backend: IoBackend,
}

impl Default for SharedLogConfig {
    fn default() -> SharedLogConfig {
        SharedLogConfig {
            segment_bytes: 16 << 20,
            max_segments: 64,
            backend: IoBackend::Auto,
        }
    }
}

/// Counters of a shared log (monotonic).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SharedLogStats {
    /// Syncs that wrote something, and their fdatasyncs.
    pub syncs: u64,
    pub fdatasyncs: u64,
    pub segments_created: u64,
    pub segments_deleted: u64,
    /// Segments compacted (live entries moved forward, then deleted).
    pub compactions: u64,
    pub moved_bytes: u64,
}

fn io_at(path: &Path) -> impl Fn(io::Error) -> SegmentError + '_ {
    move |source| SegmentError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn sync_dir(dir: &Path) -> Result<(), SegmentError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_at(dir))
}

pub(crate) fn segment_path(dir: &Path, index: u64) -> PathBuf {
    dir.join(format!("{index:016x}.seg"))
}

/// What the log knows of one segment file.
#[derive(Debug, Default, Clone, Copy)]
struct SegInfo {
    size: u64,
    /// Bytes of entries some index still refers to.
    live: u64,
    /// Cut, release and reset entries in it (dead or not): while one is
    /// here the segment goes only as the oldest (see "Retention").
    controls: u64,
}

/// The segment being appended to.
#[derive(Debug)]
struct Active {
    index: u64,
    file: File,
    write_offset: u64,
    size: u64,
}

/// Bytes appended but not written yet, contiguous in one segment.
#[derive(Debug)]
struct Staged {
    segment: u64,
    offset: u64,
    bytes: Vec<u8>,
}

#[derive(Debug)]
struct Inner {
    dir: PathBuf,
    config: SharedLogConfig,
    segments: BTreeMap<u64, SegInfo>,
    active: Option<Active>,
    /// Segments rolled away from that still have staged bytes.
    rolled: Vec<(u64, File)>,
    staged: Vec<Staged>,
    /// Databases with entries staged since the last sync.
    touched: BTreeSet<DatabaseId>,
    dbs: HashMap<DatabaseId, DbIndex>,
    next_lsn: u64,
    io: Io,
    failed: bool,
    /// Where the log is known durable: (segment, offset) of the end.
    durable_pos: (u64, u64),
    /// Said once that live data holds the log over its bound.
    over_bound_warned: bool,
    stats: SharedLogStats,
}

/// The host-wide log (see the module docs).
#[derive(Debug)]
pub struct SharedLog {
    dir: PathBuf,
    inner: Mutex<Inner>,
}

/// What one [`SharedLog::sync`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedSync {
    pub fdatasyncs: usize,
}

impl Inner {
    fn db(&mut self, id: DatabaseId) -> &mut DbIndex {
        self.dbs.entry(id).or_default()
    }

    fn lsn(&mut self) -> u64 {
        let l = self.next_lsn;
        self.next_lsn = l.checked_add(1).expect("shared log lsn overflow");
        l
    }

    fn seg(&mut self, index: u64) -> &mut SegInfo {
        self.segments
            .get_mut(&index)
            .expect("an entry's segment is known")
    }

    fn add_live(&mut self, loc: Loc) {
        let s = self.seg(loc.segment);
        s.live = s.live.checked_add(loc.len).expect("live bytes overflow");
    }

    fn kill(&mut self, loc: Loc) {
        let s = self.seg(loc.segment);
        s.live = s
            .live
            .checked_sub(loc.len)
            .expect("a segment's live bytes never go below zero");
    }

    fn check(&self) -> Result<(), SegmentError> {
        if self.failed {
            Err(SegmentError::Failed)
        } else {
            Ok(())
        }
    }

    /// Creates the next segment, preallocated, and makes it the active
    /// one (see `SegmentLog::roll` for why zeros are written and synced).
    fn roll(&mut self, at_least: u64) -> Result<(), SegmentError> {
        let size = self.config.segment_bytes.max(at_least);
        let index = self
            .segments
            .keys()
            .next_back()
            .map_or(0, |i| i.checked_add(1).expect("segment index overflow"));
        let path = segment_path(&self.dir, index);
        let tmp = path.with_extension("seg.tmp");
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .map_err(io_at(&tmp))?;
        let zeros = vec![0u8; size.min(1 << 20) as usize];
        let mut at = 0u64;
        while at < size {
            let n = (size - at).min(zeros.len() as u64) as usize;
            file.write_all_at(&zeros[..n], at).map_err(io_at(&tmp))?;
            at += n as u64;
        }
        file.sync_all().map_err(io_at(&tmp))?;
        std::fs::rename(&tmp, &path).map_err(io_at(&path))?;
        sync_dir(&self.dir)?;
        self.segments.insert(
            index,
            SegInfo {
                size,
                ..SegInfo::default()
            },
        );
        self.stats.segments_created += 1;
        let old = self.active.replace(Active {
            index,
            file,
            write_offset: 0,
            size,
        });
        if let Some(old) = old {
            if self.staged.iter().any(|s| s.segment == old.index) {
                self.rolled.push((old.index, old.file));
            }
        }
        tracing::debug!(segment = index, size, "shared log rolled to a new segment");
        Ok(())
    }

    /// Stages one encoded entry (`lsn` its own); returns where it will
    /// be.
    fn stage(&mut self, frame: &[u8], lsn: u64) -> Result<Loc, SegmentError> {
        let len = frame.len() as u64;
        let room = self
            .active
            .as_ref()
            .is_some_and(|a| a.write_offset + len <= a.size);
        if !room {
            self.roll(len)?;
        }
        let a = self.active.as_mut().expect("a segment after the roll");
        let (segment, offset) = (a.index, a.write_offset);
        a.write_offset += len;
        match self.staged.last_mut() {
            Some(s) if s.segment == segment && s.offset + s.bytes.len() as u64 == offset => {
                s.bytes.extend_from_slice(frame)
            }
            _ => self.staged.push(Staged {
                segment,
                offset,
                bytes: frame.to_vec(),
            }),
        }
        Ok(Loc {
            segment,
            offset,
            len,
            lsn,
        })
    }

    fn append(&mut self, kind: Kind, id: DatabaseId, payload: &[u8]) -> Result<Loc, SegmentError> {
        let lsn = self.lsn();
        let mut frame = Vec::with_capacity(format::OVERHEAD + payload.len());
        format::encode(&mut frame, kind, id, lsn, payload);
        let loc = self.stage(&frame, lsn)?;
        if kind != Kind::Record {
            self.seg(loc.segment).controls += 1;
        }
        self.touched.insert(id);
        Ok(loc)
    }

    /// Stages a record of `id`; it must follow the database's log.
    fn append_record(&mut self, id: DatabaseId, r: &Encoded) -> Result<(), SegmentError> {
        self.check()?;
        let idx = self.db(id);
        if r.previous != idx.last() {
            return Err(SegmentError::Discontinuous {
                previous: r.previous,
                last: idx.last(),
            });
        }
        if !idx.follows(r.previous, r.prev_chain) || r.bookmark <= r.previous {
            return Err(SegmentError::ChainMismatch {
                bookmark: r.bookmark,
            });
        }
        let loc = self.append(Kind::Record, id, &r.bytes)?;
        self.add_live(loc);
        self.db(id).push(RecEntry {
            bookmark: r.bookmark,
            chain: r.chain,
            loc,
        });
        Ok(())
    }

    /// Writes everything staged and makes it durable.
    fn sync(&mut self) -> Result<SharedSync, SegmentError> {
        self.check()?;
        if self.staged.is_empty() {
            self.mark_durable();
            return Ok(SharedSync { fdatasyncs: 0 });
        }
        let done = self.write_staged();
        if let Err(e) = done {
            self.failed = true;
            tracing::error!(error = %e, "a shared log sync failed: the log takes nothing until reopened");
            let _ = poison::store(&self.dir, self.durable_pos);
            return Err(e);
        }
        let fdatasyncs = self.touched_segments().len();
        self.staged.clear();
        self.rolled.clear();
        if let Some(a) = &self.active {
            self.durable_pos = (a.index, a.write_offset);
        }
        self.stats.syncs += 1;
        self.stats.fdatasyncs += fdatasyncs as u64;
        self.mark_durable();
        Ok(SharedSync { fdatasyncs })
    }

    fn mark_durable(&mut self) {
        for id in std::mem::take(&mut self.touched) {
            if let Some(idx) = self.dbs.get_mut(&id) {
                idx.durable = idx.last();
            }
        }
    }

    fn touched_segments(&self) -> Vec<u64> {
        let mut t: Vec<u64> = self.staged.iter().map(|s| s.segment).collect();
        t.dedup();
        t
    }

    fn file(&self, segment: u64) -> Result<&File, SegmentError> {
        self.active
            .iter()
            .map(|a| (a.index, &a.file))
            .chain(self.rolled.iter().map(|(i, f)| (*i, f)))
            .find(|(i, _)| *i == segment)
            .map(|(_, f)| f)
            .ok_or_else(|| SegmentError::Io {
                path: segment_path(&self.dir, segment),
                source: io::Error::other("staged bytes' segment is not open"),
            })
    }

    fn write_staged(&self) -> Result<(), SegmentError> {
        let touched = self.touched_segments();
        match &self.io {
            Io::Std => {
                for s in &self.staged {
                    self.file(s.segment)?
                        .write_all_at(&s.bytes, s.offset)
                        .map_err(io_at(&segment_path(&self.dir, s.segment)))?;
                }
                for seg in touched {
                    self.file(seg)?
                        .sync_data()
                        .map_err(io_at(&segment_path(&self.dir, seg)))?;
                }
            }
            #[cfg(target_os = "linux")]
            Io::Uring(ring) => {
                use std::os::fd::AsFd;
                let mut writes = Vec::with_capacity(self.staged.len());
                for s in &self.staged {
                    writes.push((self.file(s.segment)?.as_fd(), s.offset, &s.bytes[..]));
                }
                let mut syncs = Vec::with_capacity(touched.len());
                for seg in &touched {
                    syncs.push(self.file(*seg)?.as_fd());
                }
                ring.lock()
                    .write_and_sync(&writes, &syncs)
                    .map_err(io_at(&self.dir))?;
            }
        }
        Ok(())
    }
}

impl SharedLog {
    /// The log's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The handle of database `id` (its index is created empty if the log
    /// holds nothing of it).
    pub fn database(self: &Arc<Self>, id: DatabaseId) -> DbLog {
        self.inner.lock().db(id);
        DbLog {
            id,
            log: Arc::clone(self),
        }
    }

    /// Whether the log holds anything of `id` (records or a base).
    pub fn holds(&self, id: DatabaseId) -> bool {
        self.inner
            .lock()
            .dbs
            .get(&id)
            .is_some_and(|i| !i.entries.is_empty() || i.base_entry.is_some())
    }

    /// Makes every database's staged entries durable: one fdatasync per
    /// touched segment. After an error the log refuses all work
    /// ([`SegmentError::Failed`]) until reopened.
    pub fn sync(&self) -> Result<SharedSync, SegmentError> {
        self.inner.lock().sync()
    }

    /// `"io_uring"` or `"std"`.
    pub fn io_backend(&self) -> &'static str {
        self.inner.lock().io.name()
    }

    pub fn stats(&self) -> SharedLogStats {
        self.inner.lock().stats
    }

    /// Segment files kept.
    pub fn segments(&self) -> usize {
        self.inner.lock().segments.len()
    }

    /// Bytes of the segment files kept.
    pub fn disk_bytes(&self) -> u64 {
        self.inner.lock().segments.values().map(|s| s.size).sum()
    }

    /// Bytes of entries some database still needs.
    pub fn live_bytes(&self) -> u64 {
        self.inner.lock().segments.values().map(|s| s.live).sum()
    }

    /// Retention: deletes the segments nothing needs and, while more than
    /// `max_segments` are kept, compacts the oldest (see the module docs).
    pub fn maintain(&self) -> Result<(), SegmentError> {
        self.inner.lock().maintain()
    }

    /// Whether a sync failed (the log takes nothing until reopened).
    pub fn failed(&self) -> bool {
        self.inner.lock().failed
    }
}

/// One database's view of the shared log: the calls a
/// [`SegmentLog`](crate::segments::SegmentLog) offers. Holds no file.
#[derive(Clone)]
pub struct DbLog {
    id: DatabaseId,
    log: Arc<SharedLog>,
}

impl std::fmt::Debug for DbLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DbLog").field("id", &self.id).finish()
    }
}

impl DbLog {
    fn with<R>(&self, f: impl FnOnce(&DbIndex) -> R) -> R {
        let mut inner = self.log.inner.lock();
        f(inner.db(self.id))
    }

    pub fn id(&self) -> DatabaseId {
        self.id
    }
    pub fn shared(&self) -> &Arc<SharedLog> {
        &self.log
    }
    pub fn last(&self) -> Bookmark {
        self.with(DbIndex::last)
    }
    pub fn last_chain(&self) -> Option<ChainHash> {
        self.with(DbIndex::last_chain)
    }
    pub fn chain_at(&self, at: Bookmark) -> Option<ChainHash> {
        self.with(|i| i.chain_at(at))
    }
    pub fn history(&self) -> History {
        self.with(DbIndex::history)
    }
    pub fn start(&self) -> Bookmark {
        self.with(|i| i.base)
    }
    pub fn durable(&self) -> Bookmark {
        self.with(|i| i.durable)
    }
    pub fn len(&self) -> usize {
        self.with(|i| i.entries.len())
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Bytes of the shared log this database keeps live (its records and
    /// its base entry).
    pub fn disk_bytes(&self) -> u64 {
        self.with(DbIndex::live_bytes)
    }
    /// Whether entries of this database wait for a sync.
    pub fn has_staged(&self) -> bool {
        self.log.inner.lock().touched.contains(&self.id)
    }
    /// As [`SegmentLog::release_point`](crate::segments::SegmentLog::release_point),
    /// in records rather than whole segments.
    pub fn release_point(&self, keep_bytes: u64) -> Bookmark {
        self.with(|i| i.release_point(keep_bytes))
    }

    /// Stages a record (validated by the wire decoder); it must follow the
    /// database's log.
    pub fn append_encoded(&self, r: &Encoded) -> Result<(), SegmentError> {
        self.log.inner.lock().append_record(self.id, r)
    }

    /// Makes this database's (and every other's) staged records durable;
    /// returns this database's durable bookmark.
    pub fn sync(&self) -> Result<Bookmark, SegmentError> {
        let mut inner = self.log.inner.lock();
        inner.sync()?;
        Ok(inner.db(self.id).durable)
    }

    /// Cuts this database's records after `keep` (never below its start),
    /// durably: the cut entry is synced before this returns. Returns the
    /// record bytes cut.
    pub fn truncate_after(&self, keep: Bookmark) -> Result<u64, SegmentError> {
        let mut inner = self.log.inner.lock();
        inner.check()?;
        let idx = inner.db(self.id);
        if keep < idx.base {
            tracing::warn!(database = %self.id, keep = %keep, start = %idx.base, "a cut below the released start stops at the start");
        }
        let keep = keep.max(idx.base);
        if idx.last() > keep {
            inner.append(Kind::Cut, self.id, &format::cut_payload(keep))?;
        }
        inner.sync()?;
        let cut = inner.db(self.id).cut_after(keep);
        let mut bytes = 0;
        for e in &cut {
            inner.kill(e.loc);
            bytes += e.loc.payload().1;
        }
        if !cut.is_empty() {
            tracing::info!(database = %self.id, keep = %keep, records = cut.len(), bytes, "shared log cut a database's suffix");
        }
        Ok(bytes)
    }

    /// Empties this database's log and starts it at `start` (see
    /// [`SegmentLog::reset_to`](crate::segments::SegmentLog::reset_to)),
    /// durably. Returns the record bytes dropped.
    pub fn reset_to(
        &self,
        start: Bookmark,
        chain: ChainHash,
        history: History,
    ) -> Result<u64, SegmentError> {
        let mut inner = self.log.inner.lock();
        inner.check()?;
        if start <= inner.db(self.id).last() {
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
        let base = format::Base {
            start,
            chain,
            history,
        };
        inner.rebase(self.id, base, true).map(|(bytes, _)| bytes)
    }

    /// Releases this database's records through `upto` (archived in cold
    /// storage), never past what is durable; then deletes and compacts
    /// segments as retention allows. `segments` in the answer counts the
    /// shared segments deleted; the start moved if `start` did.
    pub fn release_through(&self, upto: Bookmark) -> Result<Released, SegmentError> {
        let mut inner = self.log.inner.lock();
        inner.check()?;
        let idx = inner.db(self.id);
        let limit = upto.min(idx.durable);
        let Some(last) = idx.newest_at_or_before(limit) else {
            return Ok(Released {
                segments: 0,
                bytes: 0,
                start: idx.base,
            });
        };
        let mut history = idx.base_history.clone();
        for e in idx
            .entries
            .iter()
            .take_while(|e| e.bookmark <= last.bookmark)
        {
            history.record(e.bookmark);
        }
        let base = format::Base {
            start: last.bookmark,
            chain: last.chain,
            history,
        };
        let (bytes, records) = inner.rebase(self.id, base, false)?;
        let before = inner.stats.segments_deleted;
        inner.maintain()?;
        let segments = (inner.stats.segments_deleted - before) as usize;
        tracing::info!(
            database = %self.id,
            start = %last.bookmark,
            records,
            bytes,
            segments,
            "shared log released an archived prefix of a database"
        );
        Ok(Released {
            segments,
            bytes,
            start: last.bookmark,
        })
    }

    /// Where the durable records after `after` up to `upto` (about
    /// `max_bytes`, at least one) are, to be read later without the log.
    /// The plan is valid until the segments holding them are compacted or
    /// deleted; [`ReadPlan::read_checked`] then fails (an I/O error for a
    /// deleted segment, [`SegmentError::Moved`] for other bytes), never
    /// serving anything else.
    pub fn plan_batch(
        &self,
        after: Bookmark,
        upto: Bookmark,
        max_bytes: usize,
    ) -> Result<ReadPlan, SegmentError> {
        let mut inner = self.log.inner.lock();
        let dir = inner.dir.clone();
        let idx = inner.db(self.id);
        if after < idx.base {
            return Err(SegmentError::Released {
                after,
                start: idx.base,
            });
        }
        let start = idx.entries.partition_point(|e| e.bookmark <= after);
        let end = idx
            .entries
            .partition_point(|e| e.bookmark <= idx.durable.min(upto));
        let mut chosen = 0usize;
        let mut bytes = 0usize;
        for e in idx.entries.get(start..end).unwrap_or_default() {
            let len = e.loc.payload().1 as usize;
            if chosen > 0 && bytes.saturating_add(len) > max_bytes {
                break;
            }
            bytes += len;
            chosen += 1;
        }
        let parts = idx.entries[start..start + chosen].iter().map(|e| {
            let (offset, len) = e.loc.payload();
            (e.bookmark, e.chain, e.loc.segment, offset, len)
        });
        Ok(ReadPlan::from_parts(dir, parts.collect::<Vec<_>>()))
    }

    /// The batch [`plan_batch`](DbLog::plan_batch) locates, read while
    /// the log is held (nothing moves meanwhile).
    pub fn read_batch(
        &self,
        after: Bookmark,
        upto: Bookmark,
        max_bytes: usize,
    ) -> Result<Vec<Bytes>, SegmentError> {
        let plan = self.plan_batch(after, upto, max_bytes)?;
        let _held = self.log.inner.lock();
        plan.read()
    }

    /// Every durable record after `after`.
    pub fn read_after(&self, after: Bookmark) -> Result<Vec<Bytes>, SegmentError> {
        self.read_batch(
            after,
            Bookmark::new(
                crate::bookmark::Epoch(u32::MAX),
                crate::bookmark::Sequence(u64::MAX),
            ),
            usize::MAX,
        )
    }
}

/// The poison marker, `<dir>/poisoned` (a [`crate::marker`]): written
/// when a sync fails, naming where the log was last known durable; the
/// next open cuts everything after it.
///
/// ```text
///  0  magic    b"WRSLPOIS"              8
///  8  segment  u64 BE                   8
/// 16  offset   u64 BE                   8
/// 24  crc32    u32 BE over bytes 0..24  4
/// ```
mod poison {
    use super::io_at;
    use crate::marker::{self, MarkerError};
    use crate::segments::SegmentError;
    use std::path::Path;

    const NAME: &str = "poisoned";
    const MAGIC: &[u8] = b"WRSLPOIS";

    fn err(dir: &Path, e: MarkerError) -> SegmentError {
        match e {
            MarkerError::Io { source, .. } => io_at(dir)(source),
            MarkerError::Corrupt { why, .. } => {
                io_at(dir)(std::io::Error::new(std::io::ErrorKind::InvalidData, why))
            }
        }
    }

    pub(super) fn store(dir: &Path, (segment, offset): (u64, u64)) -> Result<(), SegmentError> {
        let mut p = [0u8; 16];
        p[..8].copy_from_slice(&segment.to_be_bytes());
        p[8..].copy_from_slice(&offset.to_be_bytes());
        marker::store(&dir.join(NAME), MAGIC, &p).map_err(|e| err(dir, e))
    }

    /// The position; a damaged marker trusts nothing (position zero).
    pub(super) fn load(dir: &Path) -> Result<Option<(u64, u64)>, SegmentError> {
        match marker::load(&dir.join(NAME), MAGIC, 16) {
            Ok(None) => Ok(None),
            Ok(Some(p)) => {
                let mut a = [0u8; 8];
                let mut b = [0u8; 8];
                a.copy_from_slice(&p[..8]);
                b.copy_from_slice(&p[8..16]);
                Ok(Some((u64::from_be_bytes(a), u64::from_be_bytes(b))))
            }
            Err(MarkerError::Corrupt { .. }) => Ok(Some((0, 0))),
            Err(e) => Err(err(dir, e)),
        }
    }

    pub(super) fn clear(dir: &Path) -> Result<(), SegmentError> {
        marker::remove(&dir.join(NAME)).map_err(|e| err(dir, e))
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod crash_tests;
