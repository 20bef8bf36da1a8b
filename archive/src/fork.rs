//! A fork: a new, independent database whose history is another's up to
//! a bookmark. Nothing of the origin is changed.
//!
//! The fork's store starts with the origin's newest snapshot at or before
//! the bookmark, reused as it is (a hard link on the filesystem, a
//! server-side copy on S3: the bytes never pass through this process),
//! the origin's records after that snapshot up to the bookmark re-packed
//! as the fork's own log objects, and a first manifest whose archived end
//! is the bookmark. From there the fork is a database like any other: a
//! primary started on it bootstraps from its store and begins a new
//! epoch after the bookmark's.

use crate::error::{ArchiveError, RestoreError};
use crate::log_object::LogObject;
use crate::manifest::{self, Manifest, Published};
use crate::names;
use crate::reader::Archive;
use crate::store::{Created, Store};
use bytes::Bytes;
use walrelay_replicator::{Bookmark, DatabaseId, Encoded};

/// Record bytes per re-packed log object.
const OBJECT_BYTES: u64 = 16 << 20;

/// What a fork made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Forked {
    pub database: DatabaseId,
    pub bookmark: Bookmark,
    /// Snapshot parts reused from the origin (linked or copied in place).
    pub parts_reused: u32,
    /// Log objects written for the records after the snapshot.
    pub log_objects: u32,
}

/// Why a fork failed.
#[derive(Debug, thiserror::Error)]
pub enum ForkError {
    #[error(transparent)]
    Restore(#[from] RestoreError),
    #[error(transparent)]
    Archive(#[from] ArchiveError),
    #[error("database {0} already has a history in this store; a fork needs a new id")]
    Exists(DatabaseId),
    #[error("a fork of a database onto itself")]
    SameDatabase,
}

/// Forks `origin` at `at` into the new database `to`.
pub fn fork(
    store: &Store,
    origin: DatabaseId,
    at: Bookmark,
    to: DatabaseId,
) -> Result<Forked, ForkError> {
    if origin == to {
        return Err(ForkError::SameDatabase);
    }
    if manifest::load(store, to)?.is_some() {
        return Err(ForkError::Exists(to));
    }
    let from = Archive::new(store.clone(), origin);
    let m = from.manifest()?;
    let plan = from.plan(&m, at)?;
    let mut parts_reused = 0;
    let mut next = Manifest::empty(to);
    next.sequence = 1;
    next.epoch = m.epoch;
    next.page_size = m.page_size;
    if let Some(s) = plan.snapshot {
        for part in 0..m.snapshot_id(&s).parts() {
            let src = names::snapshot_part_key(origin, s.bookmark, s.generation, part);
            let dst = names::snapshot_part_key(to, s.bookmark, s.generation, part);
            match store.copy(&src, &dst) {
                Ok(Created::New | Created::Existed) => parts_reused += 1,
                Err(crate::error::StoreError::Backend {
                    source: object_store::Error::NotFound { .. },
                    ..
                }) => return Err(RestoreError::Missing { key: src }.into()),
                Err(e) => return Err(ArchiveError::from(e).into()),
            }
        }
        next.snapshots.push(s);
        next.retained_from = s.bookmark;
        next.log_end = s.bookmark;
        next.log_end_chain = s.chain;
        next.log_end_us = s.commit_us;
    }
    // The records after the snapshot, re-packed as the fork's objects.
    let start_chain = plan
        .snapshot
        .map_or(walrelay_replicator::ChainHash::GENESIS, |s| s.chain);
    let objects = from.read_logs(&plan.logs, start_chain)?;
    let records: Vec<Encoded> = objects
        .into_iter()
        .flat_map(|o| o.records)
        .take_while(|r| r.bookmark <= at)
        .collect();
    // Whole transactions per object, about OBJECT_BYTES each.
    let mut log_objects = 0;
    let mut run: Vec<Encoded> = Vec::new();
    let mut run_bytes = 0u64;
    let count = records.len();
    for (i, r) in records.into_iter().enumerate() {
        let ends_txn = !r.continued();
        run_bytes += r.bytes.len() as u64;
        run.push(r);
        if (ends_txn && run_bytes >= OBJECT_BYTES) || i + 1 == count {
            let obj = LogObject::new(to, std::mem::take(&mut run)).map_err(ArchiveError::from)?;
            run_bytes = 0;
            let key = names::log_key(to, &obj.name(m.epoch));
            store
                .create(&key, Bytes::from(obj.encode().map_err(ArchiveError::from)?))
                .map_err(ArchiveError::from)?;
            log_objects += 1;
            next.log_end = obj.last;
            next.log_end_chain = obj.last_chain;
            next.log_end_us = obj.last_us;
        }
    }
    next.history = m.history.clone();
    next.history.cut_after(at);
    // The plan reached `at`, a transaction's end.
    assert_eq!(next.log_end, at, "a fork's log ends at its bookmark");
    match manifest::publish(store, &next)? {
        Published::Done => {}
        Published::Lost => return Err(ForkError::Exists(to)),
    }
    tracing::info!(%origin, %to, bookmark = %at, parts_reused, log_objects, "forked");
    Ok(Forked {
        database: to,
        bookmark: at,
        parts_reused,
        log_objects,
    })
}
