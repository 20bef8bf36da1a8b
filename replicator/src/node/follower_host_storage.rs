//! The storage side of a [`FollowerHost`]: its shared log, how syncs
//! reach the disk, what recovery found, which databases broke.

use super::{FollowerHost, FollowerHostConfig};
use crate::ids::DatabaseId;
use crate::node::NodeError;
use crate::node::follower_db::Db;
use crate::shared_log::{SharedLog, SharedLogConfig, SharedRecovery};
use std::sync::Arc;

/// Opens the host's shared log (`<dir>/shared`), unless it keeps a log
/// per database.
pub(super) fn open_shared_log(
    config: &FollowerHostConfig,
) -> Result<(Option<Arc<SharedLog>>, SharedRecovery), NodeError> {
    if config.per_database_logs {
        return Ok((None, SharedRecovery::default()));
    }
    let (log, rec) = SharedLog::open(
        &config.dir.join("shared"),
        SharedLogConfig {
            segment_bytes: config.shared_segment_bytes,
            max_segments: config.shared_max_segments,
            backend: config.storage,
        },
    )?;
    Ok((Some(log), rec))
}

impl FollowerHost {
    /// How syncs reach the disk: "std" or "io_uring".
    pub fn storage_backend(&self) -> &'static str {
        match &self.shared.log {
            Some(log) => log.io_backend(),
            None => self.shared.syncer.lock().io_backend(),
        }
    }
    /// The databases' shared log (None with `per_database_logs`).
    pub fn shared_log(&self) -> Option<&Arc<SharedLog>> {
        self.shared.log.as_ref()
    }
    /// What opening the shared log found.
    pub fn shared_log_recovery(&self) -> SharedRecovery {
        self.shared.log_recovery
    }
    /// What recovery found when `id` was last opened (None if closed).
    pub fn recovery(&self, id: DatabaseId) -> Option<crate::segments::Recovery> {
        let reg = self.shared.registry.lock();
        reg.slots.get(&id)?.open.as_ref().map(|db| db.recovery)
    }

    /// The databases that stopped taking records after a storage failure,
    /// with why.
    pub fn broken(&self) -> Vec<(DatabaseId, String)> {
        let open: Vec<Arc<Db>> = {
            let reg = self.shared.registry.lock();
            reg.slots.values().filter_map(|s| s.open.clone()).collect()
        };
        open.iter()
            .filter_map(|db| db.core.lock().broken.clone().map(|w| (db.id, w)))
            .collect()
    }
}
