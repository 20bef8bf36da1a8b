//! Read replicas: a database written only by its applier, read through the
//! same sessions API as the primary.
//!
//! Two positions matter on a replica:
//! - `visible`: the newest confirmed bookmark whose wal-index header has
//!   been published. A read that needs bookmark `b` may start once
//!   `visible >= b`: everything up to `b` is then in its snapshot.
//! - `reported`: raised to a confirm's bookmark *before* the header is
//!   published. A read reports it after finishing, so the bookmark a read
//!   returns is never older than what it saw (possibly newer, which only
//!   makes later reads wait for more).

use crate::database::{
    CheckpointStats, Database, Inner, Options, Role, TransactionSink, configure, map_open_error,
};
use crate::error::{CheckpointError, OpenError, QueryError, SessionError};
use crate::limits::Limits;
use crate::pool::{Opener, Pooled, ReaderPool};
use crate::session::{Constraint, Session};
use parking_lot::{Condvar, Mutex, RwLock};
use rusqlite::{Connection, OpenFlags};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};
use walrelay_replicator::Bookmark;
use walrelay_vfs::{Appended, ApplyError, CapturedTransaction, PageSet, ReplicaInit, ReplicaWal};

/// How to open a replica.
#[derive(Debug, Clone)]
pub struct ReplicaOptions {
    /// Most reader connections (at least 1), opened on demand.
    pub readers: usize,
    /// What a query may cost (the time limit, result size, connection
    /// wait; D1's limits by default).
    pub limits: Limits,
    /// The region label reported in `served_by_region`.
    pub region: String,
    pub busy_timeout_ms: u64,
    /// How long a read waits for the replica to reach its session's
    /// bookmark before failing with `ReplicaBehind`.
    pub max_wait_ms: u64,
    /// The most frames the replica's WAL holds; a PASSIVE checkpoint runs
    /// once it holds half as many, and the applier restarts the WAL once
    /// all of it is copied.
    pub checkpoint_threshold_frames: u32,
    /// Make the watermark durable after this many confirms (and whenever
    /// [`Replica::persist`] is called). 1 = after every confirm.
    pub persist_every_confirms: u32,
    /// ...and no sooner than this long after the last time. Each persist
    /// syncs twice on the replica's apply path: at thousands of confirms a
    /// second, every 64 confirms kept the replica's apply waiting on the
    /// disk most of the time, and its confirm lag grew to tens of
    /// milliseconds (papers/performance.md, lever 72). 0: by count only.
    pub persist_min_interval_ms: u64,
    /// fsync the replica's WAL and watermark when persisting (power-loss
    /// safe). Off: like SQLite at synchronous=OFF, safe against process
    /// crashes only.
    pub durable: bool,
    /// For a replica that does not exist yet: its page size, and the
    /// bookmark its initial (empty) database stands for.
    pub page_size: u32,
    pub initial_bookmark: Bookmark,
}

impl Default for ReplicaOptions {
    fn default() -> ReplicaOptions {
        ReplicaOptions {
            readers: 16,
            limits: Limits::default(),
            region: "local".into(),
            busy_timeout_ms: 5_000,
            max_wait_ms: 1_000,
            // As the primary's (`DatabaseOptions`): at 1,000 a replica
            // receiving thousands of one-page transactions a second
            // checkpointed (and synced its database file) a dozen times a
            // second, on its apply path (lever 72).
            checkpoint_threshold_frames: 4_096,
            persist_every_confirms: 64,
            persist_min_interval_ms: 100,
            durable: true,
            page_size: 4096,
            initial_bookmark: Bookmark::ZERO,
        }
    }
}

struct Positions {
    visible: Bookmark,
    reported: Bookmark,
    confirms_since_persist: u32,
    last_persist: Instant,
}

pub(crate) struct ReplicaRole {
    applier: Mutex<ReplicaWal>,
    positions: Mutex<Positions>,
    advanced: Condvar,
    max_wait: Duration,
    checkpoint_threshold_frames: u32,
    persist_every_confirms: u32,
    persist_min_interval: Duration,
}

impl ReplicaRole {
    /// Counts a persist from now.
    fn persisted_now(&self) {
        let mut p = self.positions.lock();
        p.confirms_since_persist = 0;
        p.last_persist = Instant::now();
    }

    pub(crate) fn visible(&self) -> Bookmark {
        self.positions.lock().visible
    }

    pub(crate) fn reported(&self) -> Bookmark {
        self.positions.lock().reported
    }

    /// Waits (boundedly) until bookmark `b` is visible.
    pub(crate) fn wait_visible(&self, b: Bookmark) -> Result<(), QueryError> {
        let deadline = Instant::now() + self.max_wait;
        let mut p = self.positions.lock();
        while p.visible < b {
            if self.advanced.wait_until(&mut p, deadline).timed_out() && p.visible < b {
                return Err(QueryError::ReplicaBehind {
                    requested: b,
                    visible: p.visible,
                    waited_ms: self.max_wait.as_millis() as u64,
                });
            }
        }
        Ok(())
    }

    pub(crate) fn checkpoint(&self) -> Result<CheckpointStats, CheckpointError> {
        let (wal_frames, backfilled_frames) =
            self.applier
                .lock()
                .checkpoint()
                .map_err(|_| CheckpointError::Sqlite {
                    code: rusqlite::ffi::SQLITE_ERROR,
                })?;
        Ok(CheckpointStats {
            wal_frames,
            backfilled_frames,
        })
    }
}

/// A read replica. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Replica {
    db: Database,
}

impl Replica {
    /// Opens the replica at `path`, creating it (empty, at
    /// `options.initial_bookmark`) if needed. Before SQLite reads the WAL,
    /// everything past the persisted watermark is cut.
    pub fn open(path: impl AsRef<Path>, options: ReplicaOptions) -> Result<Replica, OpenError> {
        let path = path.as_ref();
        if options.readers == 0 {
            return Err(OpenError::Options("readers must be at least 1".into()));
        }
        let applier = ReplicaWal::open(
            path,
            ReplicaInit {
                page_size: options.page_size,
                bookmark: options.initial_bookmark,
            },
        )?;
        let mut applier = applier;
        applier.set_wal_limit(options.checkpoint_threshold_frames);
        applier
            .set_sync(options.durable)
            .map_err(|e| OpenError::CantOpen {
                path: path.display().to_string(),
                reason: e.to_string(),
            })?;
        let confirmed = applier.confirmed();
        let conn_opts = Options {
            busy_timeout_ms: options.busy_timeout_ms,
            region: options.region.clone(),
            limits: options.limits,
            ..Options::default()
        };
        let opener_path = path.to_path_buf();
        let opener: Opener = Box::new(move || {
            let c = Connection::open_with_flags_and_vfs(
                &opener_path,
                OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
                walrelay_vfs::VFS_NAME,
            )?;
            configure(c, &conn_opts, false)
        });
        let stopping = Arc::new(AtomicBool::new(false));
        let reader = || -> Result<Pooled, OpenError> {
            opener()
                .and_then(|c| Pooled::new(c, &stopping))
                .map_err(|e| map_open_error(path, e))
        };
        let first = reader()?;
        let classifier = reader()?;
        let role = ReplicaRole {
            applier: Mutex::new(applier),
            positions: Mutex::new(Positions {
                visible: confirmed,
                reported: confirmed,
                confirms_since_persist: 0,
                last_persist: Instant::now(),
            }),
            advanced: Condvar::new(),
            max_wait: Duration::from_millis(options.max_wait_ms),
            checkpoint_threshold_frames: options.checkpoint_threshold_frames,
            persist_every_confirms: options.persist_every_confirms.max(1),
            persist_min_interval: Duration::from_millis(options.persist_min_interval_ms),
        };
        Ok(Replica {
            db: Database {
                inner: Arc::new(Inner {
                    readers: ReaderPool::new(first, options.readers, opener, Arc::clone(&stopping)),
                    classifier: parking_lot::Mutex::new(classifier),
                    role: Role::Replica(role),
                    path: path.to_path_buf(),
                    region: options.region,
                    limits: options.limits,
                    stopping,
                    long_reads: crate::read_on_worker::LongReads::default(),
                    reader_busy_timeout: Duration::from_millis(options.busy_timeout_ms),
                }),
            },
        })
    }

    fn role(&self) -> &ReplicaRole {
        match &self.db.inner.role {
            Role::Replica(r) => r,
            Role::Primary(_) => unreachable!("a Replica always wraps a replica role"),
        }
    }

    /// The read side, with the primary's API (writes are refused).
    pub fn database(&self) -> &Database {
        &self.db
    }

    /// Starts a session on this replica.
    pub fn session(&self, constraint: Constraint) -> Result<Session, SessionError> {
        self.db.session(constraint)
    }

    /// The newest confirmed (and visible) bookmark.
    pub fn confirmed(&self) -> Bookmark {
        self.role().visible()
    }

    /// The newest appended bookmark, confirmed or not.
    pub fn last_appended(&self) -> Bookmark {
        self.role().applier.lock().last_appended()
    }

    /// The newest bookmark whose watermark is durable.
    pub fn persisted(&self) -> Bookmark {
        self.role().applier.lock().persisted()
    }

    /// Writes a transaction past the watermark: durable-ish, invisible.
    pub fn append(&self, bookmark: Bookmark, pages: &PageSet) -> Result<Appended, ApplyError> {
        self.role().applier.lock().append(bookmark, pages)
    }

    /// Writes one chunk of a transaction that travels as several records;
    /// `commits` marks its last chunk. Chunks become visible together, when
    /// a confirm covers the last one.
    pub fn append_chunk(
        &self,
        bookmark: Bookmark,
        pages: &PageSet,
        commits: bool,
    ) -> Result<Appended, ApplyError> {
        self.role()
            .applier
            .lock()
            .append_chunk(bookmark, pages, commits)
    }

    /// Makes every appended transaction up to `bookmark` visible to reads
    /// that start from now on.
    pub fn confirm(&self, bookmark: Bookmark) -> Result<(), ApplyError> {
        self.publish(bookmark)?;
        self.housekeeping()
    }

    /// The visible half of [`Replica::confirm`]: publishes the watermark
    /// (readers starting from now see everything up to `bookmark`) and
    /// wakes waiting reads; the caller runs [`Replica::housekeeping`]
    /// after. Split so that a confirm's latency is measured at the moment
    /// it becomes visible, not after the checkpoint that may follow it.
    pub fn publish(&self, bookmark: Bookmark) -> Result<(), ApplyError> {
        let role = self.role();
        let mut applier = role.applier.lock();
        if bookmark <= applier.confirmed() {
            return Ok(());
        }
        let last = applier.last_appended();
        if bookmark > last {
            return Err(ApplyError::NotAppended {
                requested: bookmark,
                last_appended: last,
            });
        }
        // A bookmark inside a chunked transaction reveals only the whole
        // transactions before it.
        let revealed = applier.revealed_by(bookmark);
        if revealed <= applier.confirmed() {
            return Ok(());
        }
        {
            let mut p = role.positions.lock();
            p.reported = p.reported.max(revealed);
        }
        applier.confirm(revealed)?;
        let visible = applier.confirmed();
        {
            let mut p = role.positions.lock();
            p.visible = visible;
            p.confirms_since_persist += 1;
        }
        role.advanced.notify_all();
        Ok(())
    }

    /// What follows a publish: a checkpoint ahead of the WAL limit (so the
    /// restart at the limit rarely has to wait) and, every
    /// `persist_every_confirms` but at most once per
    /// `persist_min_interval_ms`, a durable watermark.
    pub fn housekeeping(&self) -> Result<(), ApplyError> {
        let role = self.role();
        let mut applier = role.applier.lock();
        if applier.wal_frames() >= role.checkpoint_threshold_frames / 2 {
            applier.checkpoint()?;
        }
        let due = {
            let p = role.positions.lock();
            p.confirms_since_persist >= role.persist_every_confirms
                && p.last_persist.elapsed() >= role.persist_min_interval
        };
        if due {
            applier.persist()?;
            role.persisted_now();
        }
        Ok(())
    }

    /// Drops every unconfirmed transaction.
    pub fn discard_unconfirmed(&self) -> Result<(), ApplyError> {
        self.role().applier.lock().discard_unconfirmed()
    }

    /// Makes the confirmed watermark durable now.
    pub fn persist(&self) -> Result<(), ApplyError> {
        self.role().applier.lock().persist()?;
        self.role().persisted_now();
        Ok(())
    }

    /// Frames in the replica's current WAL generation.
    pub fn wal_frames(&self) -> u32 {
        self.role().applier.lock().wal_frames()
    }
}

/// Feeds a primary's committed transactions to in-process replicas,
/// confirming each at once (the replicator takes this over next).
#[derive(Default)]
pub struct ReplicaFeed {
    replicas: RwLock<Vec<Replica>>,
}

impl std::fmt::Debug for ReplicaFeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicaFeed")
            .field("replicas", &self.replicas.read().len())
            .finish()
    }
}

impl ReplicaFeed {
    pub fn add(&self, replica: Replica) {
        self.replicas.write().push(replica);
    }
}

impl TransactionSink for ReplicaFeed {
    fn committed(
        &self,
        bookmark: Bookmark,
        txn: &CapturedTransaction,
    ) -> Result<(), crate::database::ShipError> {
        for r in self.replicas.read().iter() {
            r.append(bookmark, &txn.pages)?;
            r.confirm(bookmark)?;
        }
        Ok(())
    }
}

/// Opens the primary at `primary` and a fresh in-process replica of it at
/// `replica` (see [`Replica::clone_of`]), wired so that every commit is
/// appended to the replica and confirmed at once.
///
/// ```
/// use walrelay_engine::{Constraint, Options, ReplicaOptions, pair};
/// # let dir = tempfile::tempdir()?;
/// let (db, replica) = pair(
///     dir.path().join("app.db"),
///     dir.path().join("app-replica.db"),
///     Options::default(),
///     ReplicaOptions::default(),
/// )?;
/// let w = db.session(Constraint::FirstPrimary)?;
/// w.prepare("CREATE TABLE orders(id INTEGER PRIMARY KEY, item TEXT)").run()?;
/// let written = w.prepare("INSERT INTO orders(item) VALUES ('pen')").run()?;
/// // A replica serves a session at least as new as its bookmark.
/// let r = replica.session(Constraint::Bookmark(written.meta.bookmark))?;
/// let rows = r.prepare("SELECT item FROM orders").all()?;
/// assert_eq!(rows.results.len(), 1);
/// assert!(!rows.meta.served_by_primary);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn pair(
    primary: impl AsRef<Path>,
    replica: impl AsRef<Path>,
    mut primary_options: Options,
    replica_options: ReplicaOptions,
) -> Result<(Database, Replica), OpenError> {
    if primary_options.sink.is_some() {
        return Err(OpenError::Options("pair() installs its own sink".into()));
    }
    let feed = Arc::new(ReplicaFeed::default());
    primary_options.sink = Some(feed.clone());
    let db = Database::open(primary, primary_options)?;
    let r = Replica::clone_of(&db, replica, replica_options)?;
    feed.add(r.clone());
    Ok((db, r))
}

impl Replica {
    /// Creates a replica at `path` as a page-for-page copy of `primary` as
    /// it stands now, at its latest bookmark (any previous replica files
    /// there are replaced). The primary's writes pause while its WAL is
    /// checkpointed (TRUNCATE) and its database file is read through
    /// SQLite's own file object. Transactions the primary commits
    /// afterwards must be fed to the replica in order, starting with the
    /// next one.
    pub fn clone_of(
        primary: &Database,
        path: impl AsRef<Path>,
        options: ReplicaOptions,
    ) -> Result<Replica, OpenError> {
        let path = path.as_ref();
        let cant = |reason: String| OpenError::CantOpen {
            path: path.display().to_string(),
            reason,
        };
        let (image, at) = primary.snapshot_image().map_err(|e| cant(e.to_string()))?;
        let page_size = if image.len() >= 18 {
            match u16::from_be_bytes([image[16], image[17]]) {
                1 => 65_536,
                n => u32::from(n),
            }
        } else {
            options.page_size
        };
        for p in walrelay_vfs::replica_files(path) {
            match std::fs::remove_file(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(cant(e.to_string())),
            }
        }
        std::fs::write(path, &image).map_err(|e| cant(e.to_string()))?;
        Replica::open(
            path,
            ReplicaOptions {
                page_size,
                initial_bookmark: at,
                ..options
            },
        )
    }
}
