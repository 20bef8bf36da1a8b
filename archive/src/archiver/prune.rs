//! Step 4 of a round: retention in the store, garbage, and the local log.
//!
//! Retention keeps every bookmark of the last `retention_ms` restorable:
//! snapshots older than that are dropped from the manifest except the
//! newest of them, which becomes `retained_from`. Only after that manifest
//! is published are objects deleted: parts of snapshots the manifest no
//! longer lists (and older than its newest snapshot, so never one still
//! being uploaded), and log objects that end at or before
//! `retained_from`. A crash between the publish and the deletes leaves
//! garbage the next sweep removes; never a needed object gone.

use super::{Archiver, Source, now_us, successor};
use crate::error::ArchiveError;
use crate::manifest::Manifest;
use crate::names;
use std::collections::HashSet;
use std::sync::atomic::Ordering;
use walrelay_replicator::{Bookmark, Epoch};

/// Sweeps list whole prefixes: at most one a minute.
const SWEEP_EVERY_US: u64 = 60_000_000;

impl Archiver {
    pub(super) fn prune(&mut self, m: &mut Manifest, mine: Epoch) -> Result<u32, ArchiveError> {
        let horizon_us = now_us().saturating_sub(self.config.retention_ms.saturating_mul(1000));
        // The newest snapshot at or before the horizon stays (it restores
        // the horizon); everything older goes.
        let keep_from = m
            .snapshots
            .iter()
            .rposition(|s| s.commit_us <= horizon_us)
            .unwrap_or(0);
        let mut changed = false;
        if keep_from > 0 {
            let mut next = successor(m, mine);
            next.snapshots.drain(..keep_from);
            next.retained_from = next.snapshots[0].bookmark;
            if !self.publish(m, next)? {
                return Ok(0);
            }
            tracing::info!(database = %self.config.database, retained_from = %m.retained_from, "store retention moved");
            changed = true;
        }
        let now = now_us();
        if !changed && now.saturating_sub(self.last_sweep_us) < SWEEP_EVERY_US {
            return Ok(0);
        }
        self.last_sweep_us = now;
        self.sweep(m)
    }

    /// Deletes objects no manifest version from `m` on can need.
    pub(crate) fn sweep(&self, m: &Manifest) -> Result<u32, ArchiveError> {
        let store = self.archive.store();
        let db = self.config.database;
        let listed: HashSet<(Bookmark, Epoch)> = m
            .snapshots
            .iter()
            .map(|s| (s.bookmark, s.generation))
            .collect();
        let newest = m.snapshots.last().map_or(Bookmark::ZERO, |s| s.bookmark);
        let mut deleted = 0;
        for l in store.list(&names::snapshot_prefix(db), None)? {
            let Some((b, g, _)) = names::parse_snapshot_key(db, &l.key) else {
                continue;
            };
            if !listed.contains(&(b, g)) && b < newest {
                store.delete(&l.key)?;
                deleted += 1;
            }
        }
        if m.retained_from > Bookmark::ZERO {
            for l in store.list(&names::log_prefix(db), None)? {
                let Some(n) = names::parse_log_key(db, &l.key) else {
                    continue;
                };
                if n.previous >= m.retained_from {
                    break;
                }
                if n.last <= m.retained_from {
                    store.delete(&l.key)?;
                    deleted += 1;
                }
            }
        }
        self.stats
            .objects_deleted
            .fetch_add(u64::from(deleted), Ordering::Relaxed);
        Ok(deleted)
    }

    /// Releases local segments the store covers, keeping the newest
    /// `local_keep_bytes`.
    pub(super) fn release(
        &self,
        source: &dyn Source,
        m: &Manifest,
    ) -> Result<Option<Bookmark>, ArchiveError> {
        let upto = m
            .log_end
            .min(source.release_point(self.config.local_keep_bytes));
        if upto <= source.log_start() {
            return Ok(None);
        }
        source.release_through(upto).map_err(ArchiveError::Source)?;
        Ok(Some(upto))
    }
}
