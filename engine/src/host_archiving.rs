//! Cold storage for every database a follower host holds: a supervisor
//! thread that runs an [`Uploader`] for each database with confirmed
//! records the store does not have yet, at most `max_running` at once.
//!
//! Every tick the supervisor asks each database for what the host answers
//! without reopening it (confirmed, disk bytes); one the host has not
//! opened since it started is skipped (nothing is known confirmed there
//! until a leader opens it, and its records reached the store through the
//! followers that stayed up, or will after that). A database it has not
//! seen since the process started has its archived end read from the
//! store's manifest (so a restarted follower continues where the store
//! is); one whose uploader ended idle is remembered with the archived end
//! it left. A database runs an uploader again only when its confirmed
//! position passes that archived end, or when a snapshot of the log after
//! the newest one falls due by time. An uploader ends by itself once a
//! couple of rounds find nothing to do (everything archived, the log
//! released down to `local_keep_bytes`), so a closed, archived database
//! costs a map entry and nothing else. When databases wait for a slot,
//! an uploader that has run longer than its slice is asked to stop (it
//! uploads everything confirmed first) and its database goes to the back
//! of the queue.

use crate::archiving::{Idle, Uploader};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use walrelay_archive::{Archive, ArchiverConfig, RestoreError, Store};
use walrelay_replicator::node::follower_host::FollowerHost;
use walrelay_replicator::{Bookmark, DatabaseId};

/// How often the supervisor looks at the databases.
const TICK: Duration = Duration::from_millis(500);

/// Manifests read per tick for databases not seen yet (a restarted host
/// with many databases catches up over a few ticks).
const LOOKUPS_PER_TICK: usize = 64;

/// How the host's uploaders run.
#[derive(Debug, Clone)]
pub struct HostArchiverConfig {
    /// Every uploader's configuration; `database` and `work_dir` are set
    /// per database (`work_dir/<id>`).
    pub archiver: ArchiverConfig,
    /// Where each database's snapshot scratch space goes.
    pub work_dir: PathBuf,
    /// Uploaders running at once.
    pub max_running: usize,
    /// A database archived elsewhere (the follower's own, with its own
    /// always-running uploader), skipped here.
    pub skip: Option<DatabaseId>,
}

/// Why the host archiver did not start.
#[derive(Debug, thiserror::Error)]
pub enum HostArchiverError {
    #[error("starting the host archiver's thread: {0}")]
    Spawn(#[source] std::io::Error),
    #[error("max_running must be at least 1")]
    NoSlots,
}

/// What an operator reads of the host archiver.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct HostArchiverStatus {
    /// Uploaders running now.
    pub running: usize,
    /// Databases waiting for a slot.
    pub waiting: usize,
    /// Databases whose archived end is known and which need nothing now.
    pub idle: usize,
    /// Uploaders started since the process started.
    pub started: u64,
    /// Uploaders that ended since the process started.
    pub ended: u64,
}

/// The supervisor of a follower host's uploaders.
#[derive(Debug)]
pub struct HostArchiver {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    status: Arc<Mutex<HostArchiverStatus>>,
}

impl HostArchiver {
    /// Starts the supervisor for `host`'s databases.
    pub fn start(
        host: Arc<FollowerHost>,
        store: Store,
        config: HostArchiverConfig,
    ) -> Result<HostArchiver, HostArchiverError> {
        if config.max_running == 0 {
            return Err(HostArchiverError::NoSlots);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let status = Arc::new(Mutex::new(HostArchiverStatus::default()));
        let mut sup = Supervisor {
            host,
            store,
            config,
            known: HashMap::new(),
            running: HashMap::new(),
            queue: VecDeque::new(),
            queued: HashSet::new(),
            status: Arc::clone(&status),
            started: 0,
            ended: 0,
        };
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("walrelay-host-archiver".into())
            .spawn(move || {
                walrelay_replicator::background::lower_this_thread();
                while !flag.load(Ordering::Relaxed) {
                    sup.tick();
                    std::thread::sleep(TICK);
                }
                sup.stop_all();
            })
            .map_err(HostArchiverError::Spawn)?;
        Ok(HostArchiver {
            stop,
            thread: Some(thread),
            status,
        })
    }

    pub fn status(&self) -> HostArchiverStatus {
        *self.status.lock()
    }

    /// One status line's worth.
    pub fn summary(&self) -> String {
        let s = self.status();
        format!(
            "db_uploaders={} db_waiting={} db_archived_idle={} db_uploaders_started={}",
            s.running, s.waiting, s.idle, s.started
        )
    }

    /// Stops every uploader (each uploads what is confirmed first, for at
    /// most [`crate::archiving::STOP_UPLOAD`]) and
    /// the supervisor.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for HostArchiver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What the supervisor knows of a database with no uploader running.
#[derive(Debug, Clone, Copy)]
struct Known {
    archived: Bookmark,
    /// When a snapshot falls due by time alone (µs since the Unix epoch).
    snapshot_due_us: Option<u64>,
    /// Read from the store, not left by an uploader of this process: the
    /// local log may still hold archived segments to release.
    from_store: bool,
}

struct Running {
    uploader: Uploader,
    since: Instant,
    stopping: bool,
}

struct Supervisor {
    host: Arc<FollowerHost>,
    store: Store,
    config: HostArchiverConfig,
    known: HashMap<DatabaseId, Known>,
    running: HashMap<DatabaseId, Running>,
    queue: VecDeque<DatabaseId>,
    queued: HashSet<DatabaseId>,
    status: Arc<Mutex<HostArchiverStatus>>,
    started: u64,
    ended: u64,
}

impl Supervisor {
    fn tick(&mut self) {
        self.reap();
        self.scan();
        self.preempt();
        self.start_waiting();
        *self.status.lock() = HostArchiverStatus {
            running: self.running.len(),
            waiting: self.queue.len(),
            idle: self.known.len(),
            started: self.started,
            ended: self.ended,
        };
    }

    /// Takes in the uploaders that ended.
    fn reap(&mut self) {
        let done: Vec<DatabaseId> = self
            .running
            .iter()
            .filter(|(_, r)| r.uploader.is_finished())
            .map(|(id, _)| *id)
            .collect();
        for id in done {
            if let Some(r) = self.running.remove(&id) {
                let idle = r.uploader.stop();
                self.ended(id, idle, r.since);
            }
        }
    }

    fn ended(&mut self, id: DatabaseId, idle: Option<Idle>, since: Instant) {
        self.ended += 1;
        match idle {
            Some(i) => {
                tracing::info!(database = %id, archived = %i.archived, ran_ms = since.elapsed().as_millis() as u64, "uploader stopped: everything confirmed is archived");
                self.known.insert(
                    id,
                    Known {
                        archived: i.archived,
                        snapshot_due_us: i.snapshot_due_us,
                        from_store: false,
                    },
                );
            }
            None => {
                // Stopped for a slice, or left work behind: look again.
                tracing::info!(database = %id, ran_ms = since.elapsed().as_millis() as u64, "uploader stopped with work left; queued again");
                self.known.remove(&id);
            }
        }
    }

    /// Queues the databases that need an uploader.
    fn scan(&mut self) {
        let now_us = walrelay_archive::archiver::now_us();
        let mut lookups = 0;
        let all = self.host.known_confirmed();
        // Forget what the host no longer holds.
        if self.known.len() > all.len() {
            let held: HashSet<DatabaseId> = all.iter().map(|(id, _)| *id).collect();
            self.known.retain(|id, _| held.contains(id));
        }
        // Answered from the host's summary for a closed database, never
        // by opening it: one not opened since the host started knows
        // nothing confirmed until a leader opens it.
        for (id, confirmed) in all {
            let Some(confirmed) = confirmed else {
                continue;
            };
            if Some(id) == self.config.skip
                || self.running.contains_key(&id)
                || self.queued.contains(&id)
            {
                continue;
            }
            let known = match self.known.get(&id) {
                Some(k) => *k,
                None => {
                    if lookups >= LOOKUPS_PER_TICK {
                        continue;
                    }
                    lookups += 1;
                    match self.archived_in_store(id) {
                        Some(k) => {
                            self.known.insert(id, k);
                            k
                        }
                        None => continue,
                    }
                }
            };
            // Archived before a restart, maybe not yet released.
            let unreleased = || {
                let keep = self.config.archiver.local_keep_bytes;
                known.from_store
                    && known.archived > Bookmark::ZERO
                    && self.host.database(id).is_some_and(|db| {
                        db.log_start().is_ok_and(|s| s < known.archived)
                            && db.disk_bytes().is_ok_and(|b| b > keep)
                    })
            };
            let needs = confirmed > known.archived
                || known.snapshot_due_us.is_some_and(|t| t <= now_us)
                || unreleased();
            if needs {
                self.known.remove(&id);
                self.queued.insert(id);
                self.queue.push_back(id);
            }
        }
    }

    /// The store's archived end of `id` (None if the store cannot be read
    /// now; the next tick asks again).
    fn archived_in_store(&self, id: DatabaseId) -> Option<Known> {
        let archive = Archive::new(self.store.clone(), id);
        let m = match archive.manifest() {
            Ok(m) => m,
            Err(RestoreError::NoManifest) => {
                return Some(Known {
                    archived: Bookmark::ZERO,
                    snapshot_due_us: None,
                    from_store: true,
                });
            }
            Err(e) => {
                tracing::warn!(database = %id, error = %e, "reading the archived end failed; retrying later");
                return None;
            }
        };
        Some(Known {
            archived: m.log_end,
            // A snapshot due by time is found by the next uploader.
            snapshot_due_us: None,
            from_store: true,
        })
    }

    /// The slice an uploader has before it yields to a waiting database:
    /// time to reach its lag bound, and a little more.
    fn slice(&self) -> Duration {
        let a = &self.config.archiver;
        let patience = 1 + 2 * u64::from(a.rank);
        Duration::from_millis(a.max_lag_ms.saturating_mul(patience)) + Duration::from_secs(2)
    }

    /// Asks the longest-running uploaders past their slice to yield, one
    /// for each waiting database.
    fn preempt(&mut self) {
        if self.queue.is_empty() || self.running.len() < self.config.max_running {
            return;
        }
        let slice = self.slice();
        let mut over: Vec<(Instant, DatabaseId)> = self
            .running
            .iter()
            .filter(|(_, r)| !r.stopping && r.since.elapsed() >= slice)
            .map(|(id, r)| (r.since, *id))
            .collect();
        over.sort_unstable();
        for (_, id) in over.into_iter().take(self.queue.len()) {
            if let Some(r) = self.running.get_mut(&id) {
                tracing::info!(database = %id, "uploader yields its slot to a waiting database");
                r.uploader.request_stop();
                r.stopping = true;
            }
        }
    }

    fn start_waiting(&mut self) {
        while self.running.len() < self.config.max_running {
            let Some(id) = self.queue.pop_front() else {
                return;
            };
            self.queued.remove(&id);
            let Some(db) = self.host.database(id) else {
                continue;
            };
            let mut c = self.config.archiver.clone();
            c.database = id;
            c.work_dir = self.config.work_dir.join(id.to_string());
            match Uploader::start_db_until_idle(db, self.store.clone(), c) {
                Ok(uploader) => {
                    tracing::info!(database = %id, running = self.running.len() + 1, "uploader started");
                    self.started += 1;
                    self.running.insert(
                        id,
                        Running {
                            uploader,
                            since: Instant::now(),
                            stopping: false,
                        },
                    );
                }
                Err(e) => {
                    tracing::warn!(database = %id, error = %e, "starting an uploader failed; retrying later");
                    return;
                }
            }
        }
    }

    /// Stops every uploader: all are asked at once (snapshots abandoned),
    /// then waited for.
    fn stop_all(&mut self) {
        for r in self.running.values() {
            r.uploader.request_shutdown();
        }
        for (id, r) in std::mem::take(&mut self.running) {
            let idle = r.uploader.stop();
            self.ended(id, idle, r.since);
        }
        *self.status.lock() = HostArchiverStatus {
            running: 0,
            waiting: self.queue.len(),
            idle: self.known.len(),
            started: self.started,
            ended: self.ended,
        };
    }
}
