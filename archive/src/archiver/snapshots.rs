//! Step 3 of a round: a snapshot at the archived end, built from the
//! store itself (the previous snapshot plus the log after it), so any
//! uploader builds the same pages whatever its local state.

use super::{Archiver, now_us, successor};
use crate::error::{ArchiveError, RestoreError};
use crate::manifest::{Manifest, SnapshotEntry};
use crate::names;
use crate::restore::{self, Progress};
use crate::snapshot::{self, SnapshotId};
use bytes::Bytes;
use std::sync::atomic::Ordering;
use walrelay_replicator::{Bookmark, Epoch};

/// The least log between snapshots (a small database would otherwise be
/// snapshotted after every few transactions).
const MIN_SNAPSHOT_LOG_BYTES: u64 = 64 << 20;

/// Parts encoded at once (each holds up to 16 MiB of pages in memory).
pub(super) const PARTS_AT_ONCE: usize = 2;

/// Tries to publish a built snapshot, rebasing it onto the manifests that
/// won meanwhile.
const MAX_PUBLISH_ATTEMPTS: usize = 8;

/// The manifest that adds `entry` (a snapshot at `built_from.log_end`) to
/// `now`, the manifest that won the race, if the snapshot is still one of
/// `now`'s history: same epoch and page size (no cut, no new generation),
/// the same newest snapshot (none newer was published), its bookmark
/// archived and still in the history, and this uploader not fenced. The
/// log archived after the snapshot is what `now` added since `built_from`.
fn rebase(
    built_from: &Manifest,
    now: &Manifest,
    mine: Epoch,
    entry: SnapshotEntry,
    page_size: u32,
) -> Option<Manifest> {
    let same_history = now.epoch == built_from.epoch
        && now.epoch <= mine
        && now.snapshots.last() == built_from.snapshots.last()
        && (now.page_size == 0 || now.page_size == page_size)
        && now.log_end >= entry.bookmark
        && now.history.holds(entry.bookmark);
    if !same_history {
        return None;
    }
    let mut next = successor(now, mine);
    next.page_size = page_size;
    next.snapshots.push(entry);
    // It only grows while the newest snapshot stays; a store that says
    // otherwise is not trusted with a rebase.
    next.since_snapshot_bytes = now
        .since_snapshot_bytes
        .checked_sub(built_from.since_snapshot_bytes)?;
    Some(next)
}

impl Archiver {
    pub(super) fn maybe_snapshot(
        &mut self,
        m: &mut Manifest,
        mine: Epoch,
        force: bool,
    ) -> Result<Option<Bookmark>, ArchiveError> {
        let newest = m.snapshots.last().copied();
        if m.log_end == Bookmark::ZERO || newest.is_some_and(|s| s.bookmark >= m.log_end) {
            return Ok(None);
        }
        let since_ms = now_us().saturating_sub(newest.map_or(0, |s| s.commit_us)) / 1000;
        // The log a restore replays is bounded by half the database (at
        // least 64 MiB), and never more than the configured bytes: a
        // restore costs about a snapshot plus half of one more.
        let db_bytes = newest.map_or(0, |s| u64::from(s.db_pages) * u64::from(m.page_size));
        let log_bound = self
            .config
            .snapshot_log_bytes
            .min((db_bytes / 2).max(MIN_SNAPSHOT_LOG_BYTES));
        let due = force
            || m.since_snapshot_bytes >= log_bound * self.patience()
            || (newest.is_some() && since_ms >= self.config.snapshot_every_ms * self.patience());
        if !due || self.stopping() {
            return Ok(None);
        }
        let built_from = m.clone();
        let (entry, page_size) = match self.upload_snapshot(m, mine) {
            Ok(built) => built,
            Err(
                ArchiveError::SnapshotAbandoned | ArchiveError::Restore(RestoreError::Abandoned),
            ) => {
                tracing::info!(database = %self.config.database, at = %m.log_end, "snapshot abandoned: the uploader is stopping");
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        let mut next = successor(m, mine);
        next.page_size = page_size;
        next.snapshots.push(entry);
        next.since_snapshot_bytes = 0;
        for _ in 0..MAX_PUBLISH_ATTEMPTS {
            if self.publish(m, next)? {
                self.stats
                    .snapshots_uploaded
                    .fetch_add(1, Ordering::Relaxed);
                tracing::info!(database = %self.config.database, bookmark = %entry.bookmark, pages = entry.db_pages, "snapshot archived");
                return Ok(Some(entry.bookmark));
            }
            // Another uploader moved first (`m` is now what it published).
            // Log uploads go on while a snapshot builds, so on a busy
            // database this is the usual case: the snapshot still holds
            // if nothing but log was added after it.
            match rebase(&built_from, m, mine, entry, page_size) {
                Some(n) => next = n,
                None => break,
            }
        }
        // A newer snapshot, another epoch's manifest, or no luck: the
        // parts just written are swept as garbage once a snapshot newer
        // than them is published.
        Ok(None)
    }

    /// Uploads a snapshot at `m.log_end` (not yet published): cut from the
    /// previous snapshot where there is one with pages (`incremental`),
    /// else built whole from the log.
    pub(crate) fn upload_snapshot(
        &self,
        m: &Manifest,
        generation: Epoch,
    ) -> Result<(SnapshotEntry, u32), ArchiveError> {
        let plan = self.archive.plan(m, m.log_end)?;
        let prev = plan.snapshot.filter(|s| s.db_pages > 0);
        let (id, digests) = match prev {
            Some(prev) => self.upload_incremental(m, &plan, &prev, generation)?,
            None => self.upload_whole(m, &plan, generation)?,
        };
        Ok((
            SnapshotEntry {
                bookmark: id.bookmark,
                chain: id.chain,
                commit_us: id.commit_us,
                db_pages: id.db_pages,
                generation,
                digest: snapshot::snapshot_digest(&digests),
            },
            id.page_size,
        ))
    }

    /// Builds the database of `plan` as an image and uploads it whole as
    /// a snapshot.
    fn upload_whole(
        &self,
        m: &Manifest,
        plan: &crate::reader::Plan,
        generation: Epoch,
    ) -> Result<(SnapshotId, Vec<[u8; 32]>), ArchiveError> {
        std::fs::create_dir_all(&self.config.work_dir).map_err(|source| ArchiveError::Io {
            path: self.config.work_dir.clone(),
            source,
        })?;
        let path = self.config.work_dir.join("snapshot.image");
        let abandon = Abandon(&self.stopping);
        let built = restore::build(&self.archive, m, plan, &path, &abandon);
        let result = built.map_err(ArchiveError::from).and_then(|r| {
            let id = SnapshotId {
                database: self.config.database,
                bookmark: r.bookmark,
                chain: r.chain,
                commit_us: m.log_end_us,
                page_size: r.page_size,
                db_pages: r.db_pages,
            };
            Ok((id, self.upload_parts(&id, generation, &path)?))
        });
        let _ = std::fs::remove_file(&path);
        result
    }

    fn upload_parts(
        &self,
        id: &SnapshotId,
        generation: Epoch,
        path: &std::path::Path,
    ) -> Result<Vec<[u8; 32]>, ArchiveError> {
        let image = crate::image::Image::open(path, id.page_size, id.db_pages)?;
        let parts: Vec<u32> = (0..id.parts()).collect();
        let mut digests = Vec::with_capacity(parts.len());
        for batch in parts.chunks(PARTS_AT_ONCE) {
            if self.stopping() {
                return Err(ArchiveError::SnapshotAbandoned);
            }
            let encoded = each_on_a_thread(batch, |&p| -> Result<Vec<u8>, ArchiveError> {
                let (first, count) = id.part_pages(p);
                let pages = image.read_pages(first, count)?;
                Ok(snapshot::encode_part(id, p, &pages)?)
            });
            for (&p, bytes) in batch.iter().zip(encoded) {
                let key = names::snapshot_part_key(id.database, id.bookmark, generation, p);
                digests.push(self.put_part(&key, bytes?)?);
            }
        }
        Ok(digests)
    }
}

impl Archiver {
    /// Puts an encoded snapshot part under `key`; returns its digest.
    pub(super) fn put_part(&self, key: &str, bytes: Vec<u8>) -> Result<[u8; 32], ArchiveError> {
        let digest = snapshot::part_digest(&bytes);
        let n = bytes.len() as u64;
        self.archive.store().create(key, Bytes::from(bytes))?;
        self.stats
            .snapshot_bytes_uploaded
            .fetch_add(n, Ordering::Relaxed);
        Ok(digest)
    }
}

/// `f` of each item, each on a thread of its own (a snapshot's parts are
/// encoded on every core); the results in order. A panic is passed on.
pub(super) fn each_on_a_thread<I: Sync, T: Send>(
    items: &[I],
    f: impl Fn(&I) -> T + Sync,
) -> Vec<T> {
    std::thread::scope(|sc| {
        let handles: Vec<_> = items
            .iter()
            .map(|item| {
                let f = &f;
                sc.spawn(move || f(item))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}

/// Builds a snapshot's image until the archiver abandons snapshots.
pub(super) struct Abandon<'a>(pub(super) &'a std::sync::atomic::AtomicBool);

impl Progress for Abandon<'_> {
    fn abandoned(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use walrelay_replicator::{ChainHash, DatabaseId, Sequence};

    fn at(e: u32, s: u64) -> Bookmark {
        Bookmark::new(Epoch(e), Sequence(s))
    }

    fn snapshot(bookmark: Bookmark) -> SnapshotEntry {
        SnapshotEntry {
            bookmark,
            chain: ChainHash::from_bytes([7; 16]),
            commit_us: 1,
            db_pages: 3,
            generation: Epoch(1),
            digest: [9; 32],
        }
    }

    /// A manifest of epoch 1 archived to `end`, `since` bytes after a
    /// snapshot at sequence 10.
    fn manifest(sequence: u64, end: u64, since: u64) -> Manifest {
        let mut m = Manifest::empty(DatabaseId(1));
        m.sequence = sequence;
        m.epoch = Epoch(1);
        m.page_size = 4096;
        m.log_end = at(1, end);
        m.history.record(at(1, end));
        m.since_snapshot_bytes = since;
        m.snapshots.push(snapshot(at(1, 10)));
        m
    }

    #[test]
    fn a_snapshot_outrun_by_log_uploads_is_rebased_onto_the_winning_manifest() {
        let built_from = manifest(5, 40, 1000);
        let won = manifest(8, 70, 1600);
        let ours = snapshot(at(1, 40));
        let next = rebase(&built_from, &won, Epoch(1), ours, 4096).expect("rebased");
        assert_eq!(next.sequence, 9);
        assert_eq!(next.log_end, at(1, 70), "the log that won stays");
        assert_eq!(next.snapshots.last(), Some(&ours));
        assert_eq!(
            next.since_snapshot_bytes, 600,
            "only the log archived after the snapshot counts"
        );
    }

    #[test]
    fn a_snapshot_is_not_rebased_past_a_newer_snapshot_an_epoch_change_or_a_fence() {
        let built_from = manifest(5, 40, 1000);
        let ours = snapshot(at(1, 40));

        let mut newer = manifest(8, 70, 100);
        newer.snapshots.push(snapshot(at(1, 60)));
        assert!(rebase(&built_from, &newer, Epoch(1), ours, 4096).is_none());

        let mut next_epoch = manifest(8, 70, 1600);
        next_epoch.epoch = Epoch(2);
        assert!(rebase(&built_from, &next_epoch, Epoch(2), ours, 4096).is_none());
        assert!(
            rebase(&built_from, &manifest(8, 70, 1600), Epoch(0), ours, 4096).is_none(),
            "an uploader the manifest's epoch fences"
        );

        let mut other_page_size = manifest(8, 70, 1600);
        other_page_size.page_size = 1024;
        assert!(rebase(&built_from, &other_page_size, Epoch(1), ours, 4096).is_none());
    }
}
