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
//!                                      one larger entry), or reused from
//!                                      the pool, and holding a header and
//!                                      entries (see `format`) from 0
//! <host dir>/shared/<index>.seg.tmp    the next segment while it is
//!                                      built (see `prealloc`; ahead of
//!                                      need, once the active one is an
//!                                      eighth written); removed at open
//! <host dir>/shared/<index>.seg.free   a deleted segment kept for reuse
//!                                      (see `recycle`; at most two)
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
//! order. Recovery replays each database's entries in lsn order: a record
//! is added to the index, a cut drops that database's records after its
//! `keep`, a release drops those at or before its start and a reset all
//! of them. The lsn, not the position, orders: compaction copies live
//! entries forward keeping their lsn, and a copy and its original found
//! together count once. What is left must chain from the database's base
//! (checked at the end, not while replaying: a dead record whose dead
//! predecessor went with a deleted segment replays before what killed
//! it); the first record that does not, and every later one, is dropped
//! (damage; refetched from peers).
//!
//! Why nothing dead comes back: a record is dead only once the entry
//! that killed it (a cut, release or reset) is synced, and a killing
//! entry goes only with the oldest segment, while everything it killed
//! lies in that segment or older (copies are made only of live entries,
//! before the kill).
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
//! A segment more than half live is not compacted (moving it would only
//! churn): the log then stays over its bound, said once in the log, until
//! databases release.
//!
//! A dead segment leaves the index under the log's lock, but its file is
//! unlinked (and the directory synced) after the lock is dropped: that
//! takes milliseconds for a 64 MiB file, and no database's append or sync
//! should wait behind it. A dead segment of the full size is renamed into
//! the pool instead while the pool has room (see `recycle`), and the next
//! roll takes it rather than writing a new segment's zeros: its earlier
//! life's entries, sealed with another salt (see `format`), are never
//! read again. A segment written before salts is never reused.
//!
//! # Segment ends at open
//!
//! Past a segment's last entry lie zeros (a new segment), an earlier
//! life's bytes (a reused one), or the torn tail of a write a crash
//! interrupted. In a new segment anything but zeros there is a torn tail
//! or damage, as before: cut (zeroed) in the newest segment, counted and
//! skipped in older ones. In a reused segment the two cannot be told
//! apart and need not be: nothing is appended to it again (appends go on
//! in a new segment), so every later scan stops where this one did. Only
//! what a poison marker says was never durable is zeroed there (and a
//! reused segment left with zeros past its end by that cut is appended
//! to). Damage inside a reused segment's entries therefore ends its scan
//! without being counted as damage (its records after it do not chain
//! and are fetched again from peers, as any damaged ones are); a header
//! that does not check is counted.
//!
//! # Descriptors
//!
//! The log keeps one file open, the segment being written (plus, until
//! the next sync, one it rolled away from), through two descriptors where
//! the filesystem takes direct I/O (see `direct_io`); reads open and
//! close theirs.
//!
//! # Limits (for now)
//!
//! - Every database's index stays in memory, open or closed: about 64
//!   bytes per record it has not released, and a few hundred bytes per
//!   database (its base and epoch history).
//! - A sync holds the log's lock through its fdatasync: appends of other
//!   databases wait behind it (on the io_uring transport they are on the
//!   same thread anyway).
//! - Recovery reads every kept segment at start (bounded by
//!   `max_segments` x `segment_bytes` while the live data fits).
//! - One failed sync fails the log for every database until it is
//!   reopened (the process restarts).

mod compaction;
pub mod format;
mod handle;
mod index;
mod migrate;
mod recovery;

use crate::direct_io::{RunWrite, SegFile, Tail};
use crate::ids::DatabaseId;
use crate::prealloc::{self, Spare};
use crate::record::Encoded;
use crate::recycle;
use crate::segments::{Io, IoBackend, SegmentError};
use format::{Kind, Seal, SegmentHeader};
use index::{DbIndex, Loc, RecEntry};
use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use handle::DbLog;
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
    /// Segments created from a spare prepared ahead (the others were
    /// zero-filled inline at their roll, or reused).
    pub spares_used: u64,
    /// Segments reused from the pool of deleted ones (see `recycle`).
    pub segments_reused: u64,
}

fn io_at(path: &Path) -> impl Fn(io::Error) -> SegmentError + '_ {
    move |source| SegmentError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Adds to a counter; overflow is a bug, not something to saturate.
fn bump(counter: &mut u64, n: u64) {
    *counter = counter.checked_add(n).expect("shared log counter overflow");
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
    /// How its entries are sealed (None: it holds nothing of this life).
    seal: Option<Seal>,
}

impl SegInfo {
    fn new(size: u64, seal: Option<Seal>) -> SegInfo {
        SegInfo {
            size,
            live: 0,
            controls: 0,
            seal,
        }
    }
}

/// The segment being appended to.
#[derive(Debug)]
struct Active {
    index: u64,
    file: SegFile,
    write_offset: u64,
    size: u64,
    /// The bytes before `write_offset` in its block (see `direct_io`).
    tail: Tail,
    /// Its header's salt, which seals every entry appended.
    salt: u64,
}

impl Active {
    /// Segment `index` at `path`, open as `file`, appended to from
    /// `write_offset`, its entries sealed with `salt`.
    fn open(
        index: u64,
        path: &Path,
        file: File,
        write_offset: u64,
        size: u64,
        salt: u64,
    ) -> Result<Active, SegmentError> {
        let tail = Tail::read(&file, write_offset).map_err(io_at(path))?;
        Ok(Active {
            index,
            file: SegFile::new(file, path).map_err(io_at(path))?,
            write_offset,
            size,
            tail,
            salt,
        })
    }
}

/// Bytes appended but not written yet, contiguous in one segment.
#[derive(Debug)]
struct Staged {
    segment: u64,
    offset: u64,
    /// The segment's bytes before `offset` in its block.
    tail: Tail,
    bytes: Vec<u8>,
}

#[derive(Debug)]
struct Inner {
    dir: PathBuf,
    config: SharedLogConfig,
    segments: BTreeMap<u64, SegInfo>,
    active: Option<Active>,
    /// Segments rolled away from that still have staged bytes, with
    /// their sizes.
    rolled: Vec<(u64, SegFile, u64)>,
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
    /// The next segment, prepared ahead once the active one is an eighth
    /// written (see `prealloc`).
    spare: Option<Spare>,
    /// Segments retention took out of the index, whose files are
    /// unlinked (or pooled, where the flag says they may be) after the
    /// lock is dropped (see [`crate::unlink`]).
    doomed: Vec<(u64, bool)>,
    /// Whether the pool held a segment for the roll to this index, as
    /// looked at when its spare would have started.
    pool_for: Option<(u64, bool)>,
    /// No new segment takes an index below this: a doomed segment's file
    /// may still be there.
    index_floor: u64,
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

    /// The index the next roll creates (the newest segment is the
    /// active one).
    fn next_index(&self) -> u64 {
        self.segments
            .keys()
            .next_back()
            .map_or(0, |i| i.checked_add(1).expect("segment index overflow"))
            .max(self.index_floor)
    }

    /// Makes the next segment the active one: reused from the pool, or
    /// preallocated (from the spare prepared ahead when it fits; see
    /// `prealloc`). Its header is staged at offset 0.
    fn roll(&mut self, at_least: u64) -> Result<(), SegmentError> {
        let size = self
            .config
            .segment_bytes
            .max(at_least + format::SEGMENT_HEADER_BYTES as u64);
        let index = self.next_index();
        let path = segment_path(&self.dir, index);
        let (created, reused) =
            recycle::reuse_or_create(&self.dir, &path, index, size, self.spare.take())?;
        let size = created.size;
        let header = SegmentHeader::new(index, reused);
        self.segments
            .insert(index, SegInfo::new(size, Some(header.seal())));
        bump(&mut self.stats.segments_created, 1);
        bump(&mut self.stats.spares_used, u64::from(created.from_spare));
        bump(&mut self.stats.segments_reused, u64::from(reused));
        let active = Active::open(index, &path, created.file, 0, size, header.salt)?;
        if let Some(old) = self.active.replace(active) {
            if self.staged.iter().any(|s| s.segment == old.index) {
                self.rolled.push((old.index, old.file, old.size));
            }
        }
        self.put(|out, _| {
            out.extend_from_slice(&header.encode());
        });
        tracing::debug!(
            segment = index,
            size,
            prepared = created.from_spare,
            reused,
            "shared log rolled to a new segment"
        );
        Ok(())
    }

    /// Once the active segment is an eighth written, starts preparing the next
    /// one on a thread of its own (see `prealloc`): the roll then finds it
    /// ready instead of zero-filling inline under the log's lock.
    fn prepare_next(&mut self) {
        if let Some((written, size)) = self.active.as_ref().map(|a| (a.write_offset, a.size)) {
            let index = self.next_index();
            // No spare while the pool holds a segment for that roll
            // (looked for once per roll, when a spare would start).
            if prealloc::spare_due(written, size)
                && self.spare.is_none()
                && recycle::serves(
                    &mut self.pool_for,
                    &self.dir,
                    index,
                    self.config.segment_bytes,
                )
            {
                return;
            }
            prealloc::keep_ready(
                &mut self.spare,
                written,
                size,
                index,
                self.config.segment_bytes,
                || segment_path(&self.dir, index),
            );
        }
    }

    /// Stages `len` bytes at the active segment's end, written into the
    /// staged buffer by `write` (given the segment's salt); no room check.
    fn put(&mut self, write: impl FnOnce(&mut Vec<u8>, u64)) -> (u64, u64) {
        let a = self.active.as_mut().expect("an active segment to put into");
        let (segment, offset) = (a.index, a.write_offset);
        let contiguous = self
            .staged
            .last()
            .is_some_and(|s| s.segment == segment && s.offset + s.bytes.len() as u64 == offset);
        if !contiguous {
            self.staged.push(Staged {
                segment,
                offset,
                tail: a.tail.clone(),
                bytes: Vec::new(),
            });
        }
        let s = self.staged.last_mut().expect("a staged run to put into");
        let from = s.bytes.len();
        write(&mut s.bytes, a.salt);
        let put = &s.bytes[from..];
        a.write_offset += put.len() as u64;
        a.tail.advance(put);
        (segment, offset)
    }

    /// Stages one entry of `len` bytes (`lsn` its own), rolling first
    /// when the active segment has no room; `write` writes it sealed with
    /// the salt it is given. Returns where it will be.
    fn stage(
        &mut self,
        len: u64,
        lsn: u64,
        write: impl FnOnce(&mut Vec<u8>, u64),
    ) -> Result<Loc, SegmentError> {
        let room = self
            .active
            .as_ref()
            .is_some_and(|a| a.write_offset + len <= a.size);
        if !room {
            self.roll(len)?;
        }
        let (segment, offset) = self.put(write);
        let end = self.active.as_ref().map_or(0, |a| a.write_offset);
        assert_eq!(end - offset, len, "an entry staged at its own length");
        self.prepare_next();
        Ok(Loc {
            segment,
            offset,
            len,
            lsn,
        })
    }

    fn append(&mut self, kind: Kind, id: DatabaseId, payload: &[u8]) -> Result<Loc, SegmentError> {
        let lsn = self.lsn();
        let len = (format::OVERHEAD + payload.len()) as u64;
        let loc = self.stage(len, lsn, |out, salt| {
            format::encode(out, kind, id, lsn, payload, Seal::Salted(salt));
        })?;
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
        bump(&mut self.stats.syncs, 1);
        bump(&mut self.stats.fdatasyncs, fdatasyncs as u64);
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

    /// A staged segment's file and size.
    fn file(&self, segment: u64) -> Result<(&SegFile, u64), SegmentError> {
        self.active
            .iter()
            .map(|a| (a.index, &a.file, a.size))
            .chain(self.rolled.iter().map(|(i, f, size)| (*i, f, *size)))
            .find(|(i, _, _)| *i == segment)
            .map(|(_, f, size)| (f, size))
            .ok_or_else(|| SegmentError::Io {
                path: segment_path(&self.dir, segment),
                source: io::Error::other("staged bytes' segment is not open"),
            })
    }

    /// Writes everything staged as runs (see `direct_io`; one per touched
    /// segment, appends being contiguous) and makes them durable.
    fn write_staged(&self) -> Result<(), SegmentError> {
        let mut runs = Vec::with_capacity(self.staged.len());
        for s in &self.staged {
            let (seg, size) = self.file(s.segment)?;
            let pieces = vec![(s.offset, &s.bytes[..])];
            runs.push((s.segment, RunWrite::plan(seg, size, s.tail.bytes(), pieces)));
        }
        self.io.write_runs(&runs).map_err(|(segment, source)| {
            let path = segment.map_or_else(|| self.dir.clone(), |i| segment_path(&self.dir, i));
            SegmentError::Io { path, source }
        })
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
        DbLog::new(id, Arc::clone(self))
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

    /// Whether appends go to the disk as direct writes (see
    /// `direct_io`): the segment being written has a direct descriptor.
    pub fn direct_io(&self) -> bool {
        self.inner
            .lock()
            .active
            .as_ref()
            .is_some_and(|a| a.file.direct.is_some())
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
        let (done, unlink) = {
            let mut inner = self.inner.lock();
            (inner.maintain(), inner.take_doomed())
        };
        let unlinked = unlink.run();
        done.and(unlinked)
    }

    /// Whether a sync failed (the log takes nothing until reopened).
    pub fn failed(&self) -> bool {
        self.inner.lock().failed
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

#[cfg(test)]
mod model_tests;

#[cfg(test)]
mod reuse_tests;
