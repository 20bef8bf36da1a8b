//! The cold-storage options of `walrelay follower` (and `up`).

use std::path::Path;
use walrelay_archive::{ArchiverConfig, Store, StoreError};
use walrelay_replicator::DatabaseId;

/// Cold-storage options of a follower (`walrelay follower`, `up`).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ArchiveArgs {
    /// The store confirmed records and snapshots go to: a directory,
    /// `file:///dir`, or `s3://bucket/prefix?endpoint=...`. None: no cold
    /// storage, and the log grows without bound.
    #[arg(long)]
    pub store: Option<String>,
    /// 0 for the follower that normally uploads; others step in after
    /// (1 + 2 x rank) times the lag bounds.
    #[arg(long, default_value_t = 0)]
    pub archive_rank: u32,
    /// Upload once the oldest unarchived record is this old...
    #[arg(long, default_value_t = 10_000)]
    pub archive_lag_ms: u64,
    /// ...or this many bytes are unarchived.
    #[arg(long, default_value_t = 16 << 20)]
    pub archive_lag_bytes: u64,
    /// Snapshot after this much log since the newest snapshot...
    #[arg(long, default_value_t = 256 << 20)]
    pub snapshot_log_bytes: u64,
    /// ...or after this long.
    #[arg(long, default_value_t = 3_600_000)]
    pub snapshot_every_ms: u64,
    /// History kept restorable in the store.
    #[arg(long, default_value_t = 30)]
    pub retention_days: u64,
    /// Archived log kept on local disk for peers to catch up from.
    #[arg(long, default_value_t = 64 << 20)]
    pub local_keep_bytes: u64,
    /// Uploaders a follower runs at once for the databases other than
    /// `--database` (each runs while its database has confirmed records
    /// the store lacks, then ends).
    #[arg(long, default_value_t = 16)]
    pub max_uploaders: usize,
}

impl ArchiveArgs {
    /// The store and the uploader's configuration, if a store is set.
    pub fn config(
        &self,
        database: DatabaseId,
        work_dir: &Path,
    ) -> Result<Option<(Store, ArchiverConfig)>, StoreError> {
        let Some(url) = &self.store else {
            return Ok(None);
        };
        let store = Store::open(url)?;
        let mut c = ArchiverConfig::new(database, work_dir.to_path_buf());
        c.rank = self.archive_rank;
        c.max_lag_ms = self.archive_lag_ms;
        c.max_lag_bytes = self.archive_lag_bytes;
        c.object_bytes = self.archive_lag_bytes.clamp(1 << 20, 64 << 20);
        c.snapshot_log_bytes = self.snapshot_log_bytes;
        c.snapshot_every_ms = self.snapshot_every_ms;
        c.retention_ms = self.retention_days.saturating_mul(86_400_000);
        c.local_keep_bytes = self.local_keep_bytes;
        Ok(Some((store, c)))
    }
}
