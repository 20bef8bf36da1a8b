//! The uploader: runs beside a durability follower, off the commit path,
//! and moves the follower's confirmed records into the store; cuts
//! snapshots; prunes what the retention no longer needs; and lets the
//! follower delete local segments the store covers.
//!
//! One round ([`Archiver::round`]):
//! 1. Load the manifest. An uploader whose epoch is older than the
//!    manifest's is fenced and does nothing.
//! 2. If the confirmed records after the archived end are old enough
//!    (`max_lag_ms`) or many enough (`max_lag_bytes`), read them from the
//!    local log in runs of up to `object_bytes`, ending at a transaction's
//!    end, upload each as a log object (create-only), and publish a
//!    manifest whose archived end covers them (compare-and-swap: on a lost
//!    race, reload and go on from what won). (`upload`)
//! 3. If enough log (`snapshot_log_bytes`) or time (`snapshot_every_ms`)
//!    has passed since the newest snapshot, cut a snapshot at the archived
//!    end from the store, upload it and publish it. (`snapshots`) It is
//!    cut from the newest snapshot and the log after it: the parts the log
//!    left alone are carried over, the others rebuilt (`incremental`); the
//!    first snapshot is built whole.
//! 4. Drop snapshots older than the retention (keeping the newest of
//!    them, so the horizon stays restorable), publish, then delete their
//!    parts and the log objects before the new horizon; then release the
//!    local segments the store covers, keeping the newest
//!    `local_keep_bytes` for fast catch-up of peers. (`prune`)
//!
//! Several followers may run an uploader for the same database: they
//! produce identical objects for identical runs, and the manifest's
//! compare-and-swap orders their publishes. A follower of `rank` r waits
//! (1 + 2r) times as long before acting, so normally the rank 0 follower
//! uploads and the others step in only when it is gone.
//!
//! A crash between any two steps leaves a store that restores exactly:
//! objects are published by the manifest only after they exist, and are
//! deleted only after a manifest that no longer needs them exists.

mod incremental;
mod prune;
mod snapshots;
mod upload;

use crate::error::{ArchiveError, RestoreError};
use crate::manifest::{self, Manifest, Published};
use crate::reader::Archive;
use crate::store::Store;
use bytes::Bytes;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use walrelay_replicator::{Bookmark, DatabaseId, Epoch};

/// Where the uploader reads confirmed records from and releases local
/// segments: a durability follower's log.
pub trait Source: Send + Sync {
    /// The newest bookmark known confirmed and held durably here.
    fn confirmed(&self) -> Bookmark;
    /// The epoch this follower has promised (names the uploads).
    fn epoch(&self) -> Epoch;
    /// Where the local log starts (records up to it were released).
    fn log_start(&self) -> Bookmark;
    /// Encoded confirmed records after `after`, up to about `max_bytes`
    /// (at least one if there is one).
    fn read_confirmed(&self, after: Bookmark, max_bytes: usize) -> Result<Vec<Bytes>, SourceError>;
    /// Bytes of the confirmed records after `after` up to `upto`, from the
    /// log's index alone: nothing is read from disk (a round that is not
    /// due asks only this, for the records new since the last round; see
    /// `upload`).
    fn confirmed_bytes_between(&self, after: Bookmark, upto: Bookmark) -> Result<u64, SourceError>;
    /// Bytes of log on local disk.
    fn disk_bytes(&self) -> u64;
    /// The newest point up to which releasing still keeps at least
    /// `keep_bytes` of the newest records.
    fn release_point(&self, keep_bytes: u64) -> Bookmark;
    /// Deletes local segments whose records are all at or before `upto`.
    fn release_through(&self, upto: Bookmark) -> Result<(), SourceError>;
}

/// A [`Source`]'s own error, carried as it is.
pub type SourceError = Box<dyn std::error::Error + Send + Sync>;

/// How an uploader runs.
#[derive(Debug, Clone)]
pub struct ArchiverConfig {
    pub database: DatabaseId,
    /// Scratch space for building snapshots (one database image at a time).
    pub work_dir: PathBuf,
    /// 0 for the preferred uploader; higher ranks wait longer.
    pub rank: u32,
    /// Upload once the oldest unarchived confirmed record is this old...
    pub max_lag_ms: u64,
    /// ...or this many bytes of records are unarchived.
    pub max_lag_bytes: u64,
    /// Record bytes per log object (a target; one record may pass it).
    pub object_bytes: u64,
    /// Snapshot after this much log since the newest snapshot, or after
    /// half the database's size (at least 64 MiB) if that is less...
    pub snapshot_log_bytes: u64,
    /// ...or after this long with any new log.
    pub snapshot_every_ms: u64,
    /// History kept restorable in the store.
    pub retention_ms: u64,
    /// Newest log bytes kept on local disk after they are archived.
    pub local_keep_bytes: u64,
}

impl ArchiverConfig {
    /// The defaults: upload within 10 s or 16 MiB, snapshot every 256 MiB
    /// of log or hour, keep 30 days, keep 64 MiB of archived log locally.
    pub fn new(database: DatabaseId, work_dir: PathBuf) -> ArchiverConfig {
        ArchiverConfig {
            database,
            work_dir,
            rank: 0,
            max_lag_ms: 10_000,
            max_lag_bytes: 16 << 20,
            object_bytes: 16 << 20,
            snapshot_log_bytes: 256 << 20,
            snapshot_every_ms: 3_600_000,
            retention_ms: 30 * 24 * 3_600_000,
            local_keep_bytes: 64 << 20,
        }
    }
}

/// Counters and gauges an operator reads.
#[derive(Debug, Default)]
pub struct ArchiverStats {
    pub objects_uploaded: AtomicU64,
    pub bytes_uploaded: AtomicU64,
    pub snapshots_uploaded: AtomicU64,
    pub snapshot_bytes_uploaded: AtomicU64,
    /// Snapshot parts carried over from the previous snapshot unchanged
    /// (their frames not compressed again).
    pub snapshot_parts_carried: AtomicU64,
    pub manifests_published: AtomicU64,
    pub races_lost: AtomicU64,
    pub objects_deleted: AtomicU64,
    pub failures: AtomicU64,
    /// Gauges: how far the store is behind this follower's confirmed log.
    pub lag_bytes: AtomicU64,
    pub lag_ms: AtomicU64,
    /// Gauge: the archived end's sequence and epoch.
    pub archived_epoch: AtomicU64,
    pub archived_sequence: AtomicU64,
    /// The last failed round's error (cleared by a good round).
    pub last_error: parking_lot::Mutex<Option<String>>,
}

/// How [`Archiver::round_off_path`] runs a round's work off the commit
/// path: it calls the work it is given, once, before it returns (on
/// another thread, say).
pub type OffPath<'a> = dyn Fn(&mut (dyn FnMut() + Send)) + Sync + 'a;

/// How many times its thresholds the unarchived tail may grow before
/// [`Archiver::behind`] says the uploads fall behind.
const BEHIND_FACTOR: u64 = 2;

/// Whether a round waits for its thresholds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flush {
    /// Upload and snapshot only when due.
    No,
    /// Upload every confirmed record now (a clean stop, a time-travel
    /// request); snapshot when due.
    Log,
    /// Upload everything and snapshot if anything is new.
    All,
    /// A stopping process's last round: upload every confirmed record
    /// until `deadline`, ending between two objects; no snapshot.
    Stop { deadline: Instant },
}

/// What a round did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RoundReport {
    pub archived_to: Bookmark,
    pub objects: u32,
    pub snapshot: Option<Bookmark>,
    pub deleted: u32,
    pub released_to: Option<Bookmark>,
    pub fenced: bool,
}

/// One follower's uploader.
#[derive(Debug)]
pub struct Archiver {
    archive: Archive,
    config: ArchiverConfig,
    stats: Arc<ArchiverStats>,
    /// When garbage was last swept (µs); sweeps list whole prefixes, so
    /// they run at most once per `SWEEP_EVERY_US`.
    last_sweep_us: u64,
    /// The unarchived tail's first record, once read, so a round that is
    /// not due reads nothing.
    tail: Option<upload::TailStart>,
    /// Set when the process stops (see [`Archiver::stopping_flag`]).
    stopping: Arc<AtomicBool>,
}

/// The wall clock in µs since the Unix epoch.
pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

impl Archiver {
    pub fn new(store: Store, config: ArchiverConfig) -> Archiver {
        Archiver {
            archive: Archive::new(store, config.database),
            config,
            stats: Arc::default(),
            last_sweep_us: 0,
            tail: None,
            stopping: Arc::default(),
        }
    }

    /// The flag a stopping process sets, from any thread, to wind the
    /// archiver down: no snapshot starts, one being built or uploaded
    /// stops at its next batch of objects, and a log upload under way
    /// ends before its next object; the process's last round
    /// ([`Flush::Stop`]) then uploads what it can in its time. Nothing is
    /// lost: the confirmed log stays on the followers, and the next round
    /// (after a restart, or another follower's) archives it and takes the
    /// snapshot. Parts of an abandoned snapshot are swept as garbage.
    pub fn stopping_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.stopping)
    }

    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Relaxed)
    }

    pub fn stats(&self) -> Arc<ArchiverStats> {
        Arc::clone(&self.stats)
    }

    pub fn archive(&self) -> &Archive {
        &self.archive
    }

    pub fn config(&self) -> &ArchiverConfig {
        &self.config
    }

    fn load(&self) -> Result<Manifest, ArchiveError> {
        match self.archive.manifest() {
            Ok(m) => Ok(m),
            Err(RestoreError::NoManifest) => Ok(Manifest::empty(self.config.database)),
            Err(e) => Err(e.into()),
        }
    }

    /// The rank's patience: how many times the configured lag it waits
    /// before acting.
    fn patience(&self) -> u64 {
        1 + 2 * u64::from(self.config.rank)
    }

    /// One round of work (see the module docs); `flush` overrides the
    /// thresholds.
    pub fn round(
        &mut self,
        source: &dyn Source,
        flush: Flush,
    ) -> Result<RoundReport, ArchiveError> {
        self.round_off_path(source, flush, &|work| work())
    }

    /// [`Archiver::round`], its uploads, snapshot and pruning run by
    /// `off_path` (on a thread that yields the CPU to the commit path, for
    /// one): the work that takes CPU and holds none of the follower's
    /// locks beyond short reads of its state. The release of local
    /// segments (which writes a marker under the follower's lock) runs on
    /// the calling thread.
    pub fn round_off_path(
        &mut self,
        source: &dyn Source,
        flush: Flush,
        off_path: &OffPath<'_>,
    ) -> Result<RoundReport, ArchiveError> {
        let r = self.round_inner(source, flush, off_path);
        match &r {
            Ok(report) => {
                self.stats
                    .archived_epoch
                    .store(u64::from(report.archived_to.epoch.0), Ordering::Relaxed);
                self.stats
                    .archived_sequence
                    .store(report.archived_to.sequence.0, Ordering::Relaxed);
                *self.stats.last_error.lock() = None;
            }
            Err(e) => {
                self.stats.failures.fetch_add(1, Ordering::Relaxed);
                *self.stats.last_error.lock() = Some(e.to_string());
                tracing::warn!(database = %self.config.database, error = %e, "archive round failed; retrying later");
            }
        }
        r
    }

    /// Whether the uploads are falling behind: the unarchived tail is
    /// twice what makes an upload due (in bytes or in age), as the last
    /// round measured it. A caller that runs rounds at a low priority runs
    /// them at its own then, until [`Archiver::caught_up`].
    pub fn behind(&self) -> bool {
        self.tail_past(BEHIND_FACTOR)
    }

    /// Whether the unarchived tail is below what makes an upload due: the
    /// uploads have caught up.
    pub fn caught_up(&self) -> bool {
        !self.tail_past(1)
    }

    /// Whether the tail the last round measured is at `factor` times the
    /// thresholds (the rank's patience included) or more.
    fn tail_past(&self, factor: u64) -> bool {
        let bytes = self.stats.lag_bytes.load(Ordering::Relaxed);
        let age_ms = self.stats.lag_ms.load(Ordering::Relaxed);
        let p = self.patience().saturating_mul(factor);
        bytes >= self.config.max_lag_bytes.saturating_mul(p)
            || age_ms >= self.config.max_lag_ms.saturating_mul(p)
    }

    fn round_inner(
        &mut self,
        source: &dyn Source,
        flush: Flush,
        off_path: &OffPath<'_>,
    ) -> Result<RoundReport, ArchiveError> {
        let mut done = None;
        off_path(&mut || done = Some(self.archive_and_prune(source, flush)));
        let (mut report, m) = done.expect("the work ran")?;
        if !report.fenced {
            report.released_to = self.release(source, &m)?;
        }
        Ok(report)
    }

    /// A round but its release: uploads, a snapshot if due, pruning; with
    /// the manifest as they left it.
    fn archive_and_prune(
        &mut self,
        source: &dyn Source,
        flush: Flush,
    ) -> Result<(RoundReport, Manifest), ArchiveError> {
        let mine = source.epoch();
        let mut m = self.load()?;
        let mut report = RoundReport {
            archived_to: m.log_end,
            ..RoundReport::default()
        };
        if m.epoch > mine {
            report.fenced = true;
            return Ok((report, m));
        }
        report.objects = self.upload_log(source, &mut m, flush)?;
        report.archived_to = m.log_end;
        if m.epoch > mine {
            report.fenced = true;
            return Ok((report, m));
        }
        report.snapshot = match flush {
            Flush::Stop { .. } => None,
            Flush::No | Flush::Log | Flush::All => {
                self.maybe_snapshot(&mut m, mine, flush == Flush::All)?
            }
        };
        report.deleted = self.prune(&mut m, mine)?;
        Ok((report, m))
    }

    /// Publishes `next` (built from `m` with the next sequence); on a
    /// lost race reloads `m` and returns false.
    fn publish(&self, m: &mut Manifest, next: Manifest) -> Result<bool, ArchiveError> {
        debug_assert_eq!(next.sequence, m.sequence + 1);
        match manifest::publish(self.archive.store(), &next)? {
            Published::Done => {
                self.stats
                    .manifests_published
                    .fetch_add(1, Ordering::Relaxed);
                *m = next;
                Ok(true)
            }
            Published::Lost => {
                self.stats.races_lost.fetch_add(1, Ordering::Relaxed);
                *m = self.load()?;
                Ok(false)
            }
        }
    }
}

/// The next version of `m`, written by an uploader of epoch `mine`.
fn successor(m: &Manifest, mine: Epoch) -> Manifest {
    let mut next = m.clone();
    // A manifest sequence cannot run out: one per upload for 2^64.
    next.sequence = m
        .sequence
        .checked_add(1)
        .expect("manifest sequence overflow");
    next.epoch = m.epoch.max(mine);
    next
}
