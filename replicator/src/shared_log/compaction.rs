//! Retention of the shared log: a database's new base (release, reset),
//! deleting segments nothing needs, and compaction (see "Retention and
//! compaction" in the parent module).
//!
//! Crash safety, step by step:
//! - a base entry is synced before the index drops anything for it, and
//!   everything staged is synced before any segment is deleted: whatever
//!   made an entry dead is on disk before the entry's bytes go;
//! - compaction stages copies of the oldest segment's live entries (the
//!   exact frames, lsn included), syncs them, then points the indexes at
//!   the copies, and only then deletes the segment (and syncs the
//!   directory). A crash before the sync leaves the original (a torn copy
//!   is cut); after it, both, and recovery keeps one of each lsn.

use super::format::{self, Base, Kind};
use super::index::Loc;
use super::{Inner, bump, segment_path};
use crate::ids::DatabaseId;
use crate::recycle;
use crate::segments::SegmentError;
use crate::unlink::Unlink;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// A live entry to move: whose, which (a record's position in the index,
/// or the base entry), and where it is.
struct Move {
    db: DatabaseId,
    entry: Option<usize>,
    from: Loc,
}

impl Inner {
    fn active_index(&self) -> Option<u64> {
        self.active.as_ref().map(|a| a.index)
    }

    /// Writes `base` as `id`'s release or reset entry, syncs it, and takes
    /// it into the index. Returns the record bytes and records dropped.
    pub(super) fn rebase(
        &mut self,
        id: DatabaseId,
        base: Base,
        reset: bool,
    ) -> Result<(u64, usize), SegmentError> {
        let kind = if reset { Kind::Reset } else { Kind::Release };
        let loc = self.append(kind, id, &format::base_payload(&base))?;
        self.sync()?;
        self.add_live(loc);
        let (dropped, old) = self.db(id).rebase(base, loc, reset);
        let mut bytes = 0;
        for e in &dropped {
            self.kill(e.loc);
            bytes += e.loc.payload().1;
        }
        if let Some(old) = old {
            self.kill(old);
        }
        Ok((bytes, dropped.len()))
    }

    /// Takes the segments nothing needs out of the index (the caller
    /// unlinks them after dropping the lock: [`Inner::take_doomed`]),
    /// then, while more than `max_segments` are kept, compacts the oldest.
    pub(super) fn maintain(&mut self) -> Result<(), SegmentError> {
        self.check()?;
        self.sync()?;
        self.delete_dead()?;
        let mut budget = self.segments.len();
        while self.segments.len() > self.config.max_segments && budget > 0 {
            budget -= 1;
            let Some((&oldest, info)) = self.segments.iter().next() else {
                break;
            };
            if Some(oldest) == self.active_index() {
                break;
            }
            // Moving a mostly live segment frees little and would churn:
            // the live data itself is over the bound.
            if info.live > info.size / 2 {
                if std::mem::replace(&mut self.over_bound_warned, true) {
                    break;
                }
                tracing::warn!(
                    segment = oldest,
                    live = info.live,
                    size = info.size,
                    segments = self.segments.len(),
                    max = self.config.max_segments,
                    "the shared log's oldest segment is mostly live: over its segment bound until databases release"
                );
                break;
            }
            self.compact(oldest)?;
            self.delete_dead()?;
        }
        if self.segments.len() <= self.config.max_segments {
            self.over_bound_warned = false;
        }
        Ok(())
    }

    /// Takes every segment with nothing live that is not being written
    /// (the oldest ones, and any other holding no cut or base entry) out
    /// of the index, to be unlinked by the caller ([`Inner::take_doomed`]).
    fn delete_dead(&mut self) -> Result<(), SegmentError> {
        let active = self.active_index();
        let mut prefix = true;
        let mut dead = Vec::new();
        for (&index, info) in &self.segments {
            let busy = Some(index) == active || self.rolled.iter().any(|(i, _, _)| *i == index);
            let gone = !busy && info.live == 0 && (prefix || info.controls == 0);
            prefix &= gone;
            if gone {
                dead.push(index);
            }
        }
        if dead.is_empty() {
            return Ok(());
        }
        let full = self.config.segment_bytes;
        for &index in &dead {
            let info = self
                .segments
                .remove(&index)
                .expect("a dead segment is known");
            // Reusable: of the full size, and sealed with salts (or holding
            // nothing of this life); a legacy segment's entries would
            // check again after a reuse whose header never landed.
            let reusable = info.size == full && info.seal != Some(format::Seal::Legacy);
            self.doomed.push((index, reusable));
        }
        let next = dead
            .iter()
            .max()
            .map(|i| i.checked_add(1).expect("segment index overflow"));
        self.index_floor = self.index_floor.max(next.unwrap_or(0));
        bump(&mut self.stats.segments_deleted, dead.len() as u64);
        Ok(())
    }

    /// The segments taken out of the index since the last call, to be
    /// unlinked by the caller once it has dropped the log's lock (see
    /// [`crate::unlink`]; `index_floor` keeps their indexes from reuse).
    pub(super) fn take_doomed(&mut self) -> Unlink {
        let doomed = std::mem::take(&mut self.doomed);
        if !doomed.is_empty() {
            let segments: Vec<u64> = doomed.iter().map(|(i, _)| *i).collect();
            tracing::info!(
                ?segments,
                kept = self.segments.len(),
                "shared log deletes segments nothing needs"
            );
        }
        let files = doomed
            .iter()
            .map(|&(i, reusable)| {
                let pool = reusable.then(|| recycle::free_path(&self.dir, i));
                (segment_path(&self.dir, i), pool)
            })
            .collect();
        Unlink::recycling(self.dir.clone(), files)
    }

    /// Copies the live entries of segment `victim` forward, syncs them,
    /// and points the indexes at the copies (the segment is then dead).
    fn compact(&mut self, victim: u64) -> Result<(), SegmentError> {
        let mut moves = Vec::new();
        for (&db, idx) in &self.dbs {
            for (i, e) in idx.entries.iter().enumerate() {
                if e.loc.segment == victim {
                    moves.push(Move {
                        db,
                        entry: Some(i),
                        from: e.loc,
                    });
                }
            }
            if let Some(b) = idx.base_entry.filter(|b| b.segment == victim) {
                moves.push(Move {
                    db,
                    entry: None,
                    from: b,
                });
            }
        }
        // In the order they were written: copies keep the log's order.
        moves.sort_by_key(|m| m.from.offset);
        let path = segment_path(&self.dir, victim);
        // (A segment with no seal holds nothing of this life: an entry
        // located there is damage, never copied.)
        let seal = self.segments.get(&victim).and_then(|s| s.seal);
        let file = File::open(&path).map_err(|source| SegmentError::Io {
            path: path.clone(),
            source,
        })?;
        let mut to = Vec::with_capacity(moves.len());
        let mut moved = 0u64;
        for m in &moves {
            let mut frame = vec![0u8; m.from.len as usize];
            file.read_exact_at(&mut frame, m.from.offset)
                .map_err(|source| SegmentError::Io {
                    path: path.clone(),
                    source,
                })?;
            // Never copy (and then delete the original of) something that
            // is not exactly the entry the index located there.
            let intact = seal
                .and_then(|seal| format::decode(&frame, seal).ok())
                .is_some_and(|f| f.lsn == m.from.lsn && f.database == m.db && f.len == frame.len());
            if !intact {
                return Err(SegmentError::Io {
                    path,
                    source: io::Error::new(
                        io::ErrorKind::InvalidData,
                        "compaction found a live entry damaged: the segment is kept",
                    ),
                });
            }
            // Sealed anew with the salt of the segment it goes to.
            let loc = self.stage(m.from.len, m.from.lsn, |out, salt| {
                let at = out.len();
                out.extend_from_slice(&frame);
                format::reseal(&mut out[at..], salt);
            })?;
            if m.entry.is_none() {
                self.seg(loc.segment).controls += 1;
            }
            moved += loc.len;
            to.push(loc);
        }
        drop(file);
        self.sync()?;
        for (m, new) in moves.iter().zip(to) {
            let idx = self.dbs.get_mut(&m.db).expect("a moved entry's database");
            match m.entry {
                Some(i) => idx.entries[i].loc = new,
                None => idx.base_entry = Some(new),
            }
            self.kill(m.from);
            self.add_live(new);
        }
        let left = self.segments.get(&victim).map_or(0, |s| s.live);
        assert_eq!(left, 0, "a compacted segment has nothing live left");
        bump(&mut self.stats.compactions, 1);
        bump(&mut self.stats.moved_bytes, moved);
        tracing::info!(
            segment = victim,
            entries = moves.len(),
            moved_bytes = moved,
            "shared log compacted its oldest segment: live entries moved forward"
        );
        Ok(())
    }
}
