//! Running cold storage beside a node: the uploader thread of a
//! durability follower (its confirmed log into the store, snapshots,
//! retention, releasing local segments the store covers), and the
//! command-line options that configure it.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;
use walrelay_archive::{
    Archiver, ArchiverConfig, ArchiverStats, Flush, Source, SourceError, Store, StoreError,
};
use walrelay_replicator::node::follower::FollowerNode;
use walrelay_replicator::{Bookmark, DatabaseId, Epoch};

/// How often the uploader looks at the log.
const ROUND_EVERY: Duration = Duration::from_millis(500);

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

/// A follower's log as the uploader sees it.
struct NodeSource(Arc<FollowerNode>);

impl Source for NodeSource {
    fn confirmed(&self) -> Bookmark {
        self.0.confirmed()
    }
    fn epoch(&self) -> Epoch {
        self.0.epoch()
    }
    fn log_start(&self) -> Bookmark {
        self.0.log_start()
    }
    fn read_confirmed(
        &self,
        after: Bookmark,
        max_bytes: usize,
    ) -> Result<Vec<bytes::Bytes>, SourceError> {
        Ok(self.0.read_confirmed(after, max_bytes)?)
    }
    fn disk_bytes(&self) -> u64 {
        self.0.disk_bytes()
    }
    fn release_point(&self, keep_bytes: u64) -> Bookmark {
        self.0.release_point(keep_bytes)
    }
    fn release_through(&self, upto: Bookmark) -> Result<(), SourceError> {
        self.0.release_through(upto)?;
        Ok(())
    }
}

/// The uploader thread of one follower.
#[derive(Debug)]
pub struct Uploader {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    stats: Arc<ArchiverStats>,
}

impl Uploader {
    /// Starts uploading `node`'s confirmed log.
    pub fn start(
        node: Arc<FollowerNode>,
        store: Store,
        config: ArchiverConfig,
    ) -> std::io::Result<Uploader> {
        let mut archiver = Archiver::new(store, config);
        let stats = archiver.stats();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("walrelay-archiver".into())
            .spawn(move || {
                let source = NodeSource(node);
                while !flag.load(Ordering::Relaxed) {
                    let _ = archiver.round(&source, Flush::No);
                    std::thread::sleep(ROUND_EVERY);
                }
                // A clean stop leaves nothing confirmed unarchived.
                if let Err(e) = archiver.round(&source, Flush::Log) {
                    tracing::warn!(error = %e, "the last upload before stopping failed");
                }
            })?;
        Ok(Uploader {
            stop,
            thread: Some(thread),
            stats,
        })
    }

    /// One status line's worth: what is archived and how far behind.
    pub fn summary(&self) -> String {
        let s = &self.stats;
        let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        format!(
            "archived={:08x}-{:016x} archive_lag_ms={} archive_lag_bytes={} objects={} snapshots={} uploaded_bytes={} failures={}",
            get(&s.archived_epoch),
            get(&s.archived_sequence),
            get(&s.lag_ms),
            get(&s.lag_bytes),
            get(&s.objects_uploaded),
            get(&s.snapshots_uploaded),
            get(&s.bytes_uploaded) + get(&s.snapshot_bytes_uploaded),
            get(&s.failures)
        )
    }

    /// Uploads what is confirmed and stops.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
