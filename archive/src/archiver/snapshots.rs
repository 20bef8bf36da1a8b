//! Step 3 of a round: a snapshot at the archived end, built from the
//! store itself (the previous snapshot plus the log after it), so any
//! uploader builds the same pages whatever its local state.

use super::{Archiver, now_us, successor};
use crate::error::ArchiveError;
use crate::manifest::{Manifest, SnapshotEntry};
use crate::names;
use crate::restore::{self, NoProgress};
use crate::snapshot::{self, SnapshotId};
use bytes::Bytes;
use std::sync::atomic::Ordering;
use walrelay_replicator::{Bookmark, Epoch};

/// The least log between snapshots (a small database would otherwise be
/// snapshotted after every few transactions).
const MIN_SNAPSHOT_LOG_BYTES: u64 = 64 << 20;

/// Parts encoded at once (each holds up to 16 MiB of pages in memory).
const PARTS_AT_ONCE: usize = 2;

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
        if !due {
            return Ok(None);
        }
        let (entry, page_size) = self.upload_snapshot(m, mine)?;
        let mut next = successor(m, mine);
        next.page_size = page_size;
        next.snapshots.push(entry);
        next.since_snapshot_bytes = 0;
        if self.publish(m, next)? {
            self.stats
                .snapshots_uploaded
                .fetch_add(1, Ordering::Relaxed);
            tracing::info!(database = %self.config.database, bookmark = %entry.bookmark, pages = entry.db_pages, "snapshot archived");
            Ok(Some(entry.bookmark))
        } else {
            // Another uploader moved first. Its manifest may hold a newer
            // snapshot; the parts just written are swept as garbage once
            // one newer than them is published.
            Ok(None)
        }
    }

    /// Builds the database at `m.log_end` and uploads it as a snapshot
    /// (not yet published).
    pub(crate) fn upload_snapshot(
        &self,
        m: &Manifest,
        generation: Epoch,
    ) -> Result<(SnapshotEntry, u32), ArchiveError> {
        std::fs::create_dir_all(&self.config.work_dir).map_err(|source| ArchiveError::Io {
            path: self.config.work_dir.clone(),
            source,
        })?;
        let path = self.config.work_dir.join("snapshot.image");
        let plan = self.archive.plan(m, m.log_end)?;
        let built = restore::build(&self.archive, m, &plan, &path, &NoProgress);
        let result = built.map_err(ArchiveError::from).and_then(|r| {
            let id = SnapshotId {
                database: self.config.database,
                bookmark: r.bookmark,
                chain: r.chain,
                commit_us: m.log_end_us,
                page_size: r.page_size,
                db_pages: r.db_pages,
            };
            let digests = self.upload_parts(&id, generation, &path)?;
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
            let encoded: Vec<Result<Vec<u8>, ArchiveError>> = std::thread::scope(|sc| {
                let handles: Vec<_> = batch
                    .iter()
                    .map(|&p| {
                        let image = &image;
                        sc.spawn(move || -> Result<Vec<u8>, ArchiveError> {
                            let (first, count) = id.part_pages(p);
                            let pages = image.read_pages(first, count)?;
                            Ok(snapshot::encode_part(id, p, &pages)?)
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                    .collect()
            });
            for (&p, bytes) in batch.iter().zip(encoded) {
                let bytes = bytes?;
                digests.push(snapshot::part_digest(&bytes));
                let key = names::snapshot_part_key(id.database, id.bookmark, generation, p);
                let n = bytes.len() as u64;
                self.archive.store().create(&key, Bytes::from(bytes))?;
                self.stats
                    .snapshot_bytes_uploaded
                    .fetch_add(n, Ordering::Relaxed);
            }
        }
        Ok(digests)
    }
}
