//! Migration: a database kept in a segment log of its own
//! (`<db dir>/log/`, as hosts wrote before the shared log) is imported
//! into the shared log when it is first opened, then its old log is
//! removed. Crash-safe at every step:
//!
//! 1. a reset entry (the old log's start, its chain and history) and
//!    every record of the old log are appended and synced; the reset
//!    drops whatever an interrupted earlier import left;
//! 2. `log/` is renamed to `log.imported` and the directory synced: the
//!    commit point (an old log found next to a shared index that already
//!    ends where it ends is also taken as imported: a crash between 1
//!    and 2);
//! 3. `log.imported` is removed (again at the next open if a crash
//!    interrupts it).

use super::format::{self, Kind};
use super::{SharedLog, io_at, sync_dir};
use crate::bookmark::Bookmark;
use crate::chain::ChainHash;
use crate::ids::DatabaseId;
use crate::record::Encoded;
use crate::segments::{IoBackend, SegmentError, SegmentLog};
use std::path::Path;

/// Records read from the old log per batch.
const BATCH_BYTES: usize = 4 << 20;

impl SharedLog {
    /// Imports database `id`'s own segment log in `log_dir` (if there is
    /// one) and removes it; returns the records imported (None: there was
    /// nothing to import).
    pub fn import(&self, id: DatabaseId, log_dir: &Path) -> Result<Option<usize>, SegmentError> {
        let parent = log_dir.parent().unwrap_or(Path::new("."));
        let done = log_dir.with_extension("imported");
        if done.exists() {
            std::fs::remove_dir_all(&done).map_err(io_at(&done))?;
            sync_dir(parent)?;
        }
        if !log_dir.exists() {
            return Ok(None);
        }
        let (old, _) = SegmentLog::open_with(log_dir, 64 << 20, Bookmark::ZERO, IoBackend::Std)?;
        let mut records = 0;
        {
            let mut inner = self.inner.lock();
            inner.check()?;
            let idx = inner.db(id);
            let imported = idx.last() == old.last()
                && idx.last_chain() == old.last_chain()
                && idx.durable == idx.last();
            if !imported {
                let start = old.start();
                let chain = match old.chain_at(start) {
                    Some(c) => c,
                    None if start == Bookmark::ZERO => ChainHash::GENESIS,
                    None => {
                        return Err(SegmentError::Reset {
                            start,
                            why: "the old log's start chain is unknown: not imported",
                        });
                    }
                };
                let mut history = old.history();
                history.cut_after(start);
                let base = format::Base {
                    start,
                    chain,
                    history,
                };
                let loc = inner.append(Kind::Reset, id, &format::base_payload(&base))?;
                inner.add_live(loc);
                let (dropped, prior) = inner.db(id).rebase(base, loc, true);
                for e in dropped {
                    inner.kill(e.loc);
                }
                if let Some(prior) = prior {
                    inner.kill(prior);
                }
                let mut after = start;
                while after < old.last() {
                    let batch = old.read_batch(after, old.last(), BATCH_BYTES)?;
                    if batch.is_empty() {
                        break;
                    }
                    for bytes in batch {
                        let (r, _) = Encoded::decode(&bytes)?;
                        after = r.bookmark;
                        inner.append_record(id, &r)?;
                        records += 1;
                    }
                }
                inner.sync()?;
                // The invariant the rest relies on: the import is whole.
                let idx = inner.db(id);
                assert!(
                    idx.last() == old.last() && idx.durable == old.last(),
                    "database {id}: an import that ends at {} instead of {}",
                    idx.last(),
                    old.last()
                );
            }
        }
        drop(old);
        std::fs::rename(log_dir, &done).map_err(io_at(log_dir))?;
        sync_dir(parent)?;
        std::fs::remove_dir_all(&done).map_err(io_at(&done))?;
        sync_dir(parent)?;
        tracing::info!(database = %id, records, "imported a database's own segment log into the shared log");
        Ok(Some(records))
    }
}
