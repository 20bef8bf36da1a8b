//! Restoring a database at a bookmark into a standalone SQLite file: the
//! newest snapshot at or before it, then the log after the snapshot up to
//! it. Parts are fetched and decompressed in parallel and written where
//! they belong; the file is built under a temporary name, fsynced and
//! renamed into place, so a failed or interrupted restore never leaves a
//! partial file under the destination's name.

use crate::error::RestoreError;
use crate::image::Image;
use crate::manifest::Manifest;
use crate::names;
use crate::reader::{Archive, Plan};
use crate::snapshot;
use crate::store::PARALLEL_REQUESTS;
use std::path::{Path, PathBuf};
use walrelay_replicator::{Bookmark, ChainHash};

/// Told how far a restore is (for a progress bar); all calls come from the
/// restoring thread.
pub trait Progress {
    /// The restore will read `objects` objects from the store (snapshot
    /// parts and log objects).
    fn start(&self, _objects: u64) {}
    /// `objects` more are read and applied.
    fn advance(&self, _objects: u64) {}
    fn finish(&self) {}
    /// Whether the caller wants the restore abandoned; checked between
    /// batches of objects (a stopping process must not wait for a whole
    /// database to be built).
    fn abandoned(&self) -> bool {
        false
    }
}

/// Reports nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProgress;
impl Progress for NoProgress {}

/// What a restore wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Restored {
    pub bookmark: Bookmark,
    pub chain: ChainHash,
    pub page_size: u32,
    pub db_pages: u32,
    /// Bytes of snapshot parts (as stored) and of log records (decoded)
    /// read from the store.
    pub fetched_bytes: u64,
}

fn tmp_path(out: &Path) -> PathBuf {
    let mut s = out.as_os_str().to_owned();
    s.push(".restoring");
    PathBuf::from(s)
}

/// Restores `target` from `m` into the file `out` (replacing it).
pub fn restore_to_file(
    archive: &Archive,
    m: &Manifest,
    target: Bookmark,
    out: &Path,
    progress: &dyn Progress,
) -> Result<Restored, RestoreError> {
    let plan = archive.plan(m, target)?;
    let tmp = tmp_path(out);
    let result = build(archive, m, &plan, &tmp, progress).and_then(|r| {
        std::fs::File::open(&tmp)
            .and_then(|f| f.sync_all())
            .map_err(|source| RestoreError::Io {
                path: tmp.clone(),
                source,
            })?;
        Ok(r)
    });
    match result {
        Ok(r) => {
            std::fs::rename(&tmp, out).map_err(|source| RestoreError::Io {
                path: out.to_path_buf(),
                source,
            })?;
            if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::File::open(dir)
                    .and_then(|d| d.sync_all())
                    .map_err(|source| RestoreError::Io {
                        path: dir.to_path_buf(),
                        source,
                    })?;
            }
            progress.finish();
            Ok(r)
        }
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// Builds the image of `plan` at `path` (not renamed, not removed on
/// failure, not synced): restores and the archiver's whole snapshots (the
/// first of a history) share it.
/// A restore syncs the image before it renames it into place. The
/// archiver reads its scratch image back and removes it within seconds,
/// and nothing reads it after a crash, so it is never synced: its pages
/// are dropped with the file before the kernel's writeback reaches them
/// (30 s by default), and a snapshot writes nothing to the follower's
/// disk, which the quorum's syncs share. Syncing it was a burst of the
/// whole database's size on that disk at every snapshot
/// (papers/performance.md, lever 70).
pub fn build(
    archive: &Archive,
    m: &Manifest,
    plan: &Plan,
    path: &Path,
    progress: &dyn Progress,
) -> Result<Restored, RestoreError> {
    let db = archive.database();
    let (mut image, chain, fetched) = match &plan.snapshot {
        Some(s) => {
            let id = m.snapshot_id(s);
            progress.start(u64::from(id.parts()) + plan.logs.len() as u64);
            let image = Image::create(path, id.page_size, id.db_pages)?;
            let keys: Vec<String> = (0..id.parts())
                .map(|p| names::snapshot_part_key(db, s.bookmark, s.generation, p))
                .collect();
            let mut digests = Vec::with_capacity(keys.len());
            let mut fetched = 0u64;
            for (batch_no, batch) in keys.chunks(PARALLEL_REQUESTS).enumerate() {
                if progress.abandoned() {
                    return Err(RestoreError::Abandoned);
                }
                let got = archive.store().get_many(batch)?;
                let first_part = (batch_no * PARALLEL_REQUESTS) as u32;
                // Decompress and write the batch's parts on every core.
                let results: Vec<Result<[u8; 32], RestoreError>> = std::thread::scope(|sc| {
                    let handles: Vec<_> = got
                        .iter()
                        .zip(batch)
                        .enumerate()
                        .map(|(i, (bytes, key))| {
                            let (image, id) = (&image, &id);
                            sc.spawn(move || -> Result<[u8; 32], RestoreError> {
                                let bytes = bytes
                                    .as_ref()
                                    .ok_or_else(|| RestoreError::Missing { key: key.clone() })?;
                                let part = snapshot::decode_part(bytes, id, first_part + i as u32)
                                    .map_err(|source| RestoreError::Format {
                                        key: key.clone(),
                                        source,
                                    })?;
                                image.write_part(&part)?;
                                Ok(snapshot::part_digest(bytes))
                            })
                        })
                        .collect();
                    handles
                        .into_iter()
                        .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                        .collect()
                });
                for (r, bytes) in results.into_iter().zip(&got) {
                    digests.push(r?);
                    let n = bytes.as_ref().map_or(0, |b| b.len() as u64);
                    fetched += n;
                    progress.advance(1);
                }
            }
            check_parts_listed(db, s, &digests)?;
            (image, s.chain, fetched)
        }
        None => {
            progress.start(plan.logs.len() as u64);
            (
                Image::create(path, m.page_size.max(512), 0)?,
                ChainHash::GENESIS,
                0,
            )
        }
    };
    let walked = walk_log(archive, plan, chain, progress, |g, e| image.gather(g, e))?;
    image.write_gathered(walked.gathered)?;
    Ok(Restored {
        bookmark: walked.at,
        chain: walked.chain,
        page_size: image.page_size(),
        db_pages: image.db_pages(),
        fetched_bytes: fetched + walked.fetched,
    })
}

/// Checks that `part_digests`, those of the parts read of snapshot `s` of
/// database `db`, are the parts the manifest lists for it (a part
/// replaced by another valid one is refused).
pub(crate) fn check_parts_listed(
    db: walrelay_replicator::DatabaseId,
    s: &crate::manifest::SnapshotEntry,
    part_digests: &[[u8; 32]],
) -> Result<(), RestoreError> {
    if snapshot::snapshot_digest(part_digests) == s.digest {
        return Ok(());
    }
    Err(RestoreError::Format {
        key: names::snapshot_dir(db, s.bookmark, s.generation),
        source: crate::error::FormatError::Digest {
            what: "snapshot (its parts are not the ones the manifest lists)",
        },
    })
}

/// The log of a plan, walked from its snapshot to its target.
pub(crate) struct Walked {
    /// The newest image of each page the log wrote, and its sizes.
    pub gathered: crate::image::Gathered,
    /// The target, reached.
    pub at: Bookmark,
    /// The history's chain there.
    pub chain: ChainHash,
    /// Bytes of log records (decoded) read from the store.
    pub fetched: u64,
}

/// Reads the log objects of `plan` in batches, in order, checking them
/// against the history from `chain` (the snapshot's, or the genesis), and
/// hands each record up to the target to `take`. The walk must end on the
/// target, at a transaction's end.
pub(crate) fn walk_log(
    archive: &Archive,
    plan: &Plan,
    mut chain: ChainHash,
    progress: &dyn Progress,
    mut take: impl FnMut(
        &mut crate::image::Gathered,
        &walrelay_replicator::Encoded,
    ) -> Result<(), RestoreError>,
) -> Result<Walked, RestoreError> {
    let mut at = plan.snapshot.map_or(Bookmark::ZERO, |s| s.bookmark);
    let mut inside = false;
    let mut fetched = 0u64;
    let mut gathered = crate::image::Gathered::default();
    for batch in plan.logs.chunks(PARALLEL_REQUESTS) {
        if progress.abandoned() {
            return Err(RestoreError::Abandoned);
        }
        let objects = archive.read_logs(batch, chain)?;
        for obj in &objects {
            for r in obj.records.iter().take_while(|r| r.bookmark <= plan.target) {
                take(&mut gathered, r)?;
                at = r.bookmark;
                chain = r.chain;
                inside = r.continued();
            }
            fetched += obj.raw_len();
            progress.advance(1);
        }
    }
    // The walk reaches the target; a target inside a transaction, or not
    // a record of the history, ends elsewhere.
    if at != plan.target || inside {
        return Err(RestoreError::NotInHistory {
            bookmark: plan.target,
        });
    }
    Ok(Walked {
        gathered,
        at,
        chain,
        fetched,
    })
}
