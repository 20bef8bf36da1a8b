//! The host's sync rounds: group commit across databases (see the
//! parent module's "Group commit across databases").

use super::super::follower_db::Db;
use super::super::follower_db_log::HostedLog;
use super::Shared;
use crate::bookmark::Bookmark;
use crate::follower::FollowerEvent;
use crate::segments::SegmentLog;
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
            for &i in &asking {
                cores[i].sync_requested = false;
            }
            let mut results: Vec<(usize, Result<Bookmark, String>)> =
                Vec::with_capacity(asking.len());
            let mut fdatasyncs = 0usize;
            let mut submissions = 0usize;
            // Databases on logs of their own: the group syncer.
            let own: Vec<usize> = asking
                .iter()
                .copied()
                .filter(|&i| matches!(cores[i].log, HostedLog::Own(_)))
                .collect();
            if !own.is_empty() {
                let mut logs: Vec<&mut SegmentLog> = cores
                    .iter_mut()
                    .enumerate()
                    .filter(|(i, _)| own.contains(i))
                    .filter_map(|(_, c)| match &mut c.log {
                        HostedLog::Own(l) => Some(&mut **l),
                        HostedLog::Shared(_) => None,
                    })
                    .collect();
                let outcome = self.syncer.lock().sync(&mut logs);
                fdatasyncs += outcome.fdatasyncs;
                submissions += outcome.submissions;
                results.extend(
                    own.iter().copied().zip(
                        outcome
                            .results
                            .into_iter()
                            .map(|r| r.map_err(|e| e.to_string())),
                    ),
                );
            }
            // Databases in the shared log: one sync makes every one durable.
            let shared: Vec<usize> = asking
                .iter()
                .copied()
                .filter(|&i| matches!(cores[i].log, HostedLog::Shared(_)))
                .collect();
            if !shared.is_empty() {
                let outcome = match &self.log {
                    Some(log) => log.sync().map_err(|e| e.to_string()),
                    None => Err("a database in a shared log the host does not have".to_string()),
                };
                if let Ok(s) = &outcome {
                    fdatasyncs += s.fdatasyncs;
                    submissions += usize::from(s.fdatasyncs > 0);
                }
                for &i in &shared {
                    let r = match &outcome {
                        Ok(_) => {
                            let durable = cores[i].log.durable();
                            // Every record staged before the sync is durable.
                            assert_eq!(
                                durable,
                                cores[i].log.last(),
                                "database {}: a shared sync left records not durable",
                                batch[i].id
                            );
                            Ok(durable)
                        }
                        Err(e) => Err(e.clone()),
                    };
                    results.push((i, r));
                }
            }
            if fdatasyncs > 0 {
                let s = &self.stats;
                s.sync_rounds.fetch_add(1, Ordering::Relaxed);
                s.fdatasyncs.fetch_add(fdatasyncs as u64, Ordering::Relaxed);
                s.sync_submissions
                    .fetch_add(submissions as u64, Ordering::Relaxed);
                s.databases_synced
                    .fetch_add(asking.len() as u64, Ordering::Relaxed);
            }
            for (i, result) in results {
                let core = &mut *cores[i];
                match result {
                    Ok(upto) => {
                        let actions = core.follower.handle(FollowerEvent::Synced { upto });
                        batch[i].run(self, core, actions);
                    }
                    Err(err) => {
                        tracing::error!(database = %batch[i].id, %err, "a sync failed: the database stops taking records");
                        core.broken = Some(err);
                    }
                }
            }
        }
    }
}
