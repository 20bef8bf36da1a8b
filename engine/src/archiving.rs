//! Running cold storage beside a durability follower: the uploader thread
//! (its confirmed log into the store, snapshots, retention, releasing local
//! segments the store covers).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;
use walrelay_archive::{
    Archiver, ArchiverConfig, ArchiverStats, Flush, Source, SourceError, Store,
};
use walrelay_replicator::node::follower::FollowerNode;
use walrelay_replicator::node::follower_db::FollowerDb;
use walrelay_replicator::{Bookmark, Epoch};

/// How often the uploader looks at the log.
const ROUND_EVERY: Duration = Duration::from_millis(500);

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

/// One database of a follower host as the uploader sees it. The questions
/// that cannot fail on a single-database follower answer "nothing yet"
/// (ZERO, 0) if the host cannot open the database right now; the next
/// round asks again.
struct DbSource(FollowerDb);

impl Source for DbSource {
    fn confirmed(&self) -> Bookmark {
        self.0.confirmed().unwrap_or(Bookmark::ZERO)
    }
    fn epoch(&self) -> Epoch {
        self.0.epoch().unwrap_or(Epoch(0))
    }
    fn log_start(&self) -> Bookmark {
        self.0.log_start().unwrap_or(Bookmark::ZERO)
    }
    fn read_confirmed(
        &self,
        after: Bookmark,
        max_bytes: usize,
    ) -> Result<Vec<bytes::Bytes>, SourceError> {
        Ok(self.0.read_confirmed(after, max_bytes)?)
    }
    fn disk_bytes(&self) -> u64 {
        self.0.disk_bytes().unwrap_or(0)
    }
    fn release_point(&self, keep_bytes: u64) -> Bookmark {
        // Nothing to release when it cannot be asked: the log's start.
        self.0
            .release_point(keep_bytes)
            .unwrap_or_else(|_| self.log_start())
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
        Self::start_source(NodeSource(node), store, config)
    }

    /// Starts uploading one database of a follower host.
    pub fn start_db(
        db: FollowerDb,
        store: Store,
        config: ArchiverConfig,
    ) -> std::io::Result<Uploader> {
        Self::start_source(DbSource(db), store, config)
    }

    fn start_source(
        source: impl Source + 'static,
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
        ) + &s
            .last_error
            .lock()
            .as_ref()
            .map(|e| format!(" last_error={e:?}"))
            .unwrap_or_default()
    }

    /// Uploads what is confirmed and stops.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
