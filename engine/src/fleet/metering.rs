//! A host node's side of the limits: the rows its databases serve and the
//! sizes they reach, gathered into one [`Report`] per tick, and its copy of
//! the limit cache's keys (the only thing the query path checks).

use super::host::Host;
use super::limits::{LimitKeys, Report, ReportAnswer, SizeReport, UsageEvent};
use parking_lot::Mutex;
use std::collections::HashMap;
use walrelay_replicator::DatabaseId;

/// Most databases with unsent usage; past it a tick's events are sent
/// before more are counted (the map is drained every tick anyway).
const MAX_METERED: usize = 1_000_000;

#[derive(Debug, Default)]
pub struct Metering {
    /// (uuid, account) → rows read, rows written since the last report.
    usage: Mutex<HashMap<(String, String), (u64, u64)>>,
    /// The size last sent per database.
    published: Mutex<HashMap<DatabaseId, u64>>,
    /// The limit cache's keys, as of the last report's answer.
    pub keys: LimitKeys,
}

impl Metering {
    /// Counts one query's rows (the query path: a map update).
    pub fn record(&self, uuid: &str, account: &str, rows_read: u64, rows_written: u64) {
        if rows_read == 0 && rows_written == 0 {
            return;
        }
        let mut usage = self.usage.lock();
        if usage.len() >= MAX_METERED
            && !usage.contains_key(&(uuid.to_string(), account.to_string()))
        {
            return;
        }
        let e = usage
            .entry((uuid.to_string(), account.to_string()))
            .or_insert((0, 0));
        e.0 = e.0.saturating_add(rows_read);
        e.1 = e.1.saturating_add(rows_written);
    }

    /// This tick's report: the usage since the last, and every open
    /// database's size that changed.
    pub fn collect(&self, host: Option<&Host>) -> Report {
        let now = super::catalog::now_ms();
        let usage = std::mem::take(&mut *self.usage.lock())
            .into_iter()
            .map(|((uuid, account), (r, w))| UsageEvent {
                uuid,
                account,
                rows_read: r,
                rows_written: w,
                at_ms: now,
            })
            .collect();
        let mut sizes = Vec::new();
        if let Some(host) = host {
            let mut published = self.published.lock();
            let open = host.open_ids();
            published.retain(|id, _| open.contains(id));
            for id in open {
                let Ok(Some(state)) = host.state(id) else {
                    continue;
                };
                let size = host.size_bytes(id);
                if published.get(&id) != Some(&size) {
                    published.insert(id, size);
                    sizes.push(SizeReport {
                        uuid: state.uuid,
                        account: state.account,
                        size_bytes: size,
                    });
                }
            }
        }
        Report { sizes, usage }
    }

    /// Takes the control plane's answer.
    pub fn apply(&self, answer: &ReportAnswer) {
        self.keys.replace(&answer.blocked);
    }

    /// A report that was not delivered: its sizes are sent again at the
    /// next change (forgotten here), its usage is counted again.
    pub fn undelivered(&self, report: Report) {
        let mut published = self.published.lock();
        published.clear();
        drop(published);
        for e in report.usage {
            self.record(&e.uuid, &e.account, e.rows_read, e.rows_written);
        }
    }
}
