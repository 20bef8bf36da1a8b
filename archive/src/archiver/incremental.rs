//! A snapshot cut from the one before it. A part whose pages the log since
//! left alone is carried over: its compressed frame as it is, under the
//! new snapshot's header ([`snapshot::reframe_part`]). Only the parts the
//! log wrote or resized are decompressed, patched and compressed again.
//! No image of the database is written: a part is built in memory (at most
//! [`PARTS_AT_ONCE`] parts of up to 16 MiB at once) from the previous
//! snapshot's part and the log's newest pages.
//!
//! The pages come out exactly as a full build's ([`restore::build`]): page
//! `n` of the new snapshot is the log's newest image of `n` if the log
//! wrote it (after the last shrink below `n`); else the previous
//! snapshot's page `n` if no transaction since cut the database below
//! `n`; else zeros. The objects come out byte for byte as a full build's
//! too (an untouched part's pages are the ones its frame was compressed
//! from, and compression is deterministic), so uploaders of either kind
//! racing for one snapshot write identical objects.
//!
//! A full build decompresses and recompresses the whole database at every
//! snapshot; on a database the log touches in a few places (an append-
//! mostly table) this does so for those parts only. Beside durability
//! followers on a small machine, the snapshots' compression was what
//! their commits met (papers/performance.md, lever 71).

use super::Archiver;
use super::snapshots::{Abandon, PARTS_AT_ONCE, each_on_a_thread};
use crate::error::{ArchiveError, FormatError, RestoreError};
use crate::image::Gathered;
use crate::manifest::{Manifest, SnapshotEntry};
use crate::names;
use crate::reader::Plan;
use crate::restore;
use crate::snapshot::{self, SnapshotId};
use bytes::Bytes;
use std::sync::atomic::Ordering;
use walrelay_replicator::Epoch;

/// What a part of the new snapshot is made from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// The previous snapshot's part of the same index holds exactly its
    /// pages: its frame is carried over.
    Carried,
    /// Built from the previous snapshot's part (if it had one) and the
    /// log's pages.
    Rebuilt,
}

/// The previous snapshot's pages that survive into the new one: those up
/// to the smallest size any transaction since left the database at.
fn kept_pages(old: &SnapshotId, log: &Gathered) -> u32 {
    log.min_pages()
        .map_or(old.db_pages, |m| m.min(old.db_pages))
}

/// How part `part` of `new` is made.
fn source(old: &SnapshotId, new: &SnapshotId, part: u32, log: &Gathered) -> Source {
    let (first, count) = new.part_pages(part);
    let carried = count > 0
        && part < old.parts()
        && old.page_size == new.page_size
        && old.part_pages(part) == (first, count)
        && kept_pages(old, log) >= first + count - 1
        && log.pages_in(first, first + count - 1).next().is_none();
    if carried {
        Source::Carried
    } else {
        Source::Rebuilt
    }
}

/// The pages of part `part` of `new`: the previous snapshot's part's pages
/// (`old_pages`, if it had that part) that survive, zeros after them, and
/// the log's pages on top.
fn rebuilt_pages(
    old: &SnapshotId,
    old_pages: Option<Vec<u8>>,
    new: &SnapshotId,
    part: u32,
    log: &Gathered,
) -> Result<Vec<u8>, FormatError> {
    let (first, count) = new.part_pages(part);
    let ps = new.page_size as usize;
    let kept = kept_pages(old, log).saturating_sub(first - 1).min(count) as usize;
    let mut pages = old_pages.unwrap_or_default();
    if pages.len() < kept * ps {
        return Err(FormatError::Invalid {
            what: "snapshot part",
            why: "the previous snapshot's part holds fewer pages than it should",
        });
    }
    pages.truncate(kept * ps);
    pages.resize(count as usize * ps, 0);
    if count > 0 {
        for (n, image) in log.pages_in(first, first + count - 1) {
            if image.len() != ps {
                return Err(FormatError::Invalid {
                    what: "log object",
                    why: "a page image is not one page long",
                });
            }
            let at = (n - first) as usize * ps;
            pages[at..at + ps].copy_from_slice(image);
        }
    }
    Ok(pages)
}

/// Part `part` of `new`, encoded, from the previous snapshot's part of the
/// same index (`old_object`, if it had one).
fn encode(
    old: &SnapshotId,
    old_object: Option<&Bytes>,
    new: &SnapshotId,
    part: u32,
    log: &Gathered,
) -> Result<(Vec<u8>, Source), FormatError> {
    match (source(old, new, part, log), old_object) {
        (Source::Carried, Some(object)) => Ok((
            snapshot::reframe_part(object, old, part, new)?,
            Source::Carried,
        )),
        (_, object) => {
            let old_pages = object
                .map(|o| snapshot::decode_part(o, old, part).map(|p| p.pages))
                .transpose()?;
            let pages = rebuilt_pages(old, old_pages, new, part, log)?;
            Ok((snapshot::encode_part(new, part, &pages)?, Source::Rebuilt))
        }
    }
}

impl Archiver {
    /// Uploads (does not publish) a snapshot at `plan.target` cut from
    /// `prev`, the plan's snapshot, which must hold pages (a database of
    /// none may take its page size from the log: a full build serves it).
    pub(super) fn upload_incremental(
        &self,
        m: &Manifest,
        plan: &Plan,
        prev: &SnapshotEntry,
        generation: Epoch,
    ) -> Result<(SnapshotId, Vec<[u8; 32]>), ArchiveError> {
        let db = self.config.database;
        let old = m.snapshot_id(prev);
        assert!(old.db_pages > 0, "an incremental snapshot needs pages");
        let abandon = Abandon(&self.stopping);
        let mut page_size = old.page_size;
        let walked = restore::walk_log(&self.archive, plan, prev.chain, &abandon, |g, e| {
            g.take(e, &mut page_size, old.db_pages)
        })?;
        let log = walked.gathered;
        let new = SnapshotId {
            database: db,
            bookmark: walked.at,
            chain: walked.chain,
            commit_us: m.log_end_us,
            page_size,
            db_pages: log.db_pages().unwrap_or(old.db_pages),
        };
        let old_key = |p: u32| {
            names::snapshot_part_key(self.archive.database(), prev.bookmark, prev.generation, p)
        };
        let part_error = |p: u32| {
            let key = old_key(p);
            move |source| ArchiveError::from(RestoreError::Format { key, source })
        };
        let mut old_digests = Vec::with_capacity(old.parts() as usize);
        let mut digests = Vec::with_capacity(new.parts() as usize);
        let parts: Vec<u32> = (0..new.parts()).collect();
        for batch in parts.chunks(PARTS_AT_ONCE) {
            if self.stopping() {
                return Err(ArchiveError::SnapshotAbandoned);
            }
            let keys: Vec<String> = batch
                .iter()
                .filter(|&&p| p < old.parts())
                .map(|&p| old_key(p))
                .collect();
            let fetched = self.archive.store().get_many(&keys)?;
            let mut olds: Vec<Option<Bytes>> = Vec::with_capacity(batch.len());
            for (i, object) in fetched.into_iter().enumerate() {
                let object = object.ok_or_else(|| RestoreError::Missing {
                    key: keys[i].clone(),
                })?;
                old_digests.push(snapshot::part_digest(&object));
                olds.push(Some(object));
            }
            olds.resize(batch.len(), None);
            let jobs: Vec<(u32, Option<Bytes>)> = batch.iter().copied().zip(olds).collect();
            let encoded = each_on_a_thread(&jobs, |(p, object)| {
                encode(&old, object.as_ref(), &new, *p, &log).map_err(part_error(*p))
            });
            for (&p, result) in batch.iter().zip(encoded) {
                let (bytes, how) = result?;
                let key = names::snapshot_part_key(db, new.bookmark, generation, p);
                digests.push(self.put_part(&key, bytes)?);
                if how == Source::Carried {
                    self.stats
                        .snapshot_parts_carried
                        .fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        // The parts past the new end, read only to check that every part
        // read was one the manifest lists.
        let rest: Vec<String> = (new.parts()..old.parts()).map(old_key).collect();
        for chunk in rest.chunks(crate::store::PARALLEL_REQUESTS) {
            for (key, object) in chunk.iter().zip(self.archive.store().get_many(chunk)?) {
                let object = object.ok_or_else(|| RestoreError::Missing { key: key.clone() })?;
                old_digests.push(snapshot::part_digest(&object));
            }
        }
        restore::check_parts_listed(self.archive.database(), prev, &old_digests)?;
        Ok((new, digests))
    }
}

#[cfg(test)]
mod tests;
