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
    let dir = config.dir.join("shared");
    if config.per_database_logs {
        // Records already in a shared log would look lost to logs of
        // their own: refused rather than served from the wrong place.
        let in_use = std::fs::read_dir(&dir).is_ok_and(|d| {
            d.flatten()
                .any(|e| e.file_name().to_string_lossy().ends_with(".seg"))
        });
        if in_use {
            return Err(NodeError::Io {
                what: format!(
                    "{} holds a shared log: this host's databases are there, not in logs of their own (per_database_logs)",
                    dir.display()
                ),
                source: std::io::Error::from(std::io::ErrorKind::AlreadyExists),
            });
        }
        return Ok((None, SharedRecovery::default()));
    }
    let (log, rec) = SharedLog::open(
        &dir,
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
    /// Whether the shared log appends with direct writes (see
    /// `SharedLog::direct_io`; false with `per_database_logs`).
    pub fn direct_io(&self) -> bool {
        self.shared.log.as_ref().is_some_and(|l| l.direct_io())
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
