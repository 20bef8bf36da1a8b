//! A database's handle on the shared log: the calls a segment log offers,
//! for that database only.

use super::format::{self, Kind};
use super::index::{DbIndex, RecEntry};
use super::{Inner, SharedLog};
use crate::bookmark::Bookmark;
use crate::chain::ChainHash;
use crate::history::History;
use crate::ids::DatabaseId;
use crate::record::Encoded;
use crate::segments::{ReadPlan, Released, SegmentError};
use crate::unlink::Unlink;
use bytes::Bytes;
use parking_lot::MutexGuard;
use std::sync::Arc;

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
    pub(super) fn new(id: DatabaseId, log: Arc<SharedLog>) -> DbLog {
        DbLog { id, log }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.log.inner.lock()
    }

    fn with<R>(&self, f: impl FnOnce(&DbIndex) -> R) -> R {
        let mut inner = self.lock();
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
        self.lock().touched.contains(&self.id)
    }
    /// As [`SegmentLog::release_point`](crate::segments::SegmentLog::release_point),
    /// in records rather than whole segments.
    pub fn release_point(&self, keep_bytes: u64) -> Bookmark {
        self.with(|i| i.release_point(keep_bytes))
    }

    /// Stages a record (validated by the wire decoder); it must follow the
    /// database's log.
    pub fn append_encoded(&self, r: &Encoded) -> Result<(), SegmentError> {
        self.lock().append_record(self.id, r)
    }

    /// Makes this database's (and every other's) staged records durable;
    /// returns this database's durable bookmark.
    pub fn sync(&self) -> Result<Bookmark, SegmentError> {
        let mut inner = self.lock();
        inner.sync()?;
        Ok(inner.db(self.id).durable)
    }

    /// Cuts this database's records after `keep` (never below its start),
    /// durably: the cut entry is synced before this returns. Returns the
    /// record bytes cut.
    pub fn truncate_after(&self, keep: Bookmark) -> Result<u64, SegmentError> {
        let mut inner = self.lock();
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
        let mut inner = self.lock();
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
        let (released, unlink) = self.release_deferred(upto)?;
        unlink.run_logged();
        Ok(released)
    }

    /// [`Self::release_through`] but for the unlinks of the segments it
    /// freed, left to the caller to run once it holds no lock (see
    /// [`crate::unlink`]).
    pub fn release_deferred(&self, upto: Bookmark) -> Result<(Released, Unlink), SegmentError> {
        let mut inner = self.lock();
        inner.check()?;
        let idx = inner.db(self.id);
        let limit = upto.min(idx.durable);
        let Some(last) = idx.newest_at_or_before(limit) else {
            let nothing = Released {
                segments: 0,
                bytes: 0,
                start: idx.base,
            };
            return Ok((nothing, Unlink::none()));
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
        // The release stands whatever maintenance does: it is durable and
        // in the index (a failed sync fails the log for every later call).
        if let Err(err) = inner.maintain() {
            tracing::error!(database = %self.id, %err, "shared log maintenance after a release failed");
        }
        let segments = (inner.stats.segments_deleted - before) as usize;
        let unlink = inner.take_doomed();
        drop(inner);
        tracing::info!(
            database = %self.id,
            start = %last.bookmark,
            records,
            bytes,
            segments,
            "shared log released an archived prefix of a database"
        );
        let released = Released {
            segments,
            bytes,
            start: last.bookmark,
        };
        Ok((released, unlink))
    }

    /// Bytes of this database's durable records after `after` up to
    /// `upto`, from the index (no I/O).
    pub fn bytes_between(&self, after: Bookmark, upto: Bookmark) -> Result<u64, SegmentError> {
        let mut inner = self.lock();
        let span = durable_span(inner.db(self.id), after, upto)?;
        Ok(span.iter().map(|e| e.loc.payload().1).sum())
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
        self.plan_locked(&mut self.lock(), after, upto, max_bytes)
    }

    fn plan_locked(
        &self,
        inner: &mut Inner,
        after: Bookmark,
        upto: Bookmark,
        max_bytes: usize,
    ) -> Result<ReadPlan, SegmentError> {
        let dir = inner.dir.clone();
        let span = durable_span(inner.db(self.id), after, upto)?;
        let mut chosen = 0usize;
        let mut bytes = 0usize;
        for e in span {
            let len = e.loc.payload().1 as usize;
            if chosen > 0 && bytes.saturating_add(len) > max_bytes {
                break;
            }
            bytes += len;
            chosen += 1;
        }
        let parts = span[..chosen].iter().map(|e| {
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
        let mut held = self.lock();
        let plan = self.plan_locked(&mut held, after, upto, max_bytes)?;
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

/// A database's index entries for its durable records after `after` up
/// to `upto`; [`SegmentError::Released`] if `after` is before its start.
fn durable_span(
    idx: &DbIndex,
    after: Bookmark,
    upto: Bookmark,
) -> Result<&[RecEntry], SegmentError> {
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
    Ok(idx.entries.get(start..end).unwrap_or_default())
}
