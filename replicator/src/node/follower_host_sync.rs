//! The host's sync rounds: group commit across databases (see the
//! parent module's "Group commit across databases").

use super::super::follower_db::Db;
use super::Shared;
use crate::follower::FollowerEvent;
use std::sync::Arc;
use std::sync::atomic::Ordering;

impl Shared {
    /// Queues `db` for the next sync round if it asked for one.
    pub(super) fn queue(&self, db: &Arc<Db>) {
        let mut core = db.core.lock();
        if core.sync_requested && !core.queued && !core.closed && core.broken.is_none() {
            core.queued = true;
            self.queue.lock().pending.push(Arc::clone(db));
        }
    }

    /// Runs sync rounds until none is queued, unless another thread runs
    /// them (it then takes what was queued here too).
    pub(super) fn sync_rounds(&self) {
        let mut q = self.queue.lock();
        if q.running {
            return;
        }
        q.running = true;
        loop {
            let batch = std::mem::take(&mut q.pending);
            if batch.is_empty() {
                q.running = false;
                return;
            }
            drop(q);
            self.sync_round(batch);
            q = self.queue.lock();
        }
    }

    /// One round: every database of `batch` made durable together.
    fn sync_round(&self, mut batch: Vec<Arc<Db>>) {
        batch.sort_by_key(|db| db.id);
        batch.dedup_by_key(|db| db.id);
        // Locked in id order (the only place more than one is held).
        let mut cores: Vec<_> = batch.iter().map(|db| db.core.lock()).collect();
        for core in cores.iter_mut() {
            core.queued = false;
        }
        // A core may ask again right after a sync (records that came in
        // behind the first one); those have no I/O left, so loop here.
        loop {
            let asking: Vec<usize> = (0..cores.len())
                .filter(|&i| {
                    let c = &cores[i];
                    c.sync_requested && c.broken.is_none() && !c.closed
                })
                .collect();
            if asking.is_empty() {
                break;
            }
            let outcome = {
                let mut logs: Vec<&mut crate::segments::SegmentLog> = cores
                    .iter_mut()
                    .enumerate()
                    .filter(|(i, _)| asking.contains(i))
                    .map(|(_, c)| {
                        c.sync_requested = false;
                        &mut c.log
                    })
                    .collect();
                self.syncer.lock().sync(&mut logs)
            };
            if outcome.fdatasyncs > 0 {
                let s = &self.stats;
                s.sync_rounds.fetch_add(1, Ordering::Relaxed);
                s.fdatasyncs
                    .fetch_add(outcome.fdatasyncs as u64, Ordering::Relaxed);
                s.sync_submissions
                    .fetch_add(outcome.submissions as u64, Ordering::Relaxed);
                s.databases_synced
                    .fetch_add(asking.len() as u64, Ordering::Relaxed);
            }
            for (i, result) in asking.into_iter().zip(outcome.results) {
                let core = &mut *cores[i];
                match result {
                    Ok(upto) => {
                        let actions = core.follower.handle(FollowerEvent::Synced { upto });
                        batch[i].run(self, core, actions);
                    }
                    Err(err) => {
                        tracing::error!(database = %batch[i].id, %err, "a sync failed: the database stops taking records");
                        core.broken = Some(err.to_string());
                    }
                }
            }
        }
    }
}
