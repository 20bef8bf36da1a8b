//! A follower process serving many databases: one listener, one
//! transport, one sync ring, and per database its own [`Follower`] core,
//! promise and log ([`super::follower_db`]).
//!
//! # Routing
//!
//! Every connection introduces itself: its first message is a Handshake
//! naming the database (leaders and candidates always did; replicas and
//! followers catching up do so now, see `subscriber` and `follower`). The
//! host binds the connection to that database for its lifetime and feeds
//! everything on it to that database's core; nothing else is shared
//! between databases: promises and fencing, catch-up (asked of the peer
//! hosts for the same database), confirms, `Archived` answers.
//!
//! The host listens (and dials peers) through a [`Mux`]: one real
//! connection per peer node, each database a channel the host sees as a
//! connection ([`Shared::route`] binds it as before; the mux checks each
//! frame names the channel's database). Unmultiplexed peers still work.
//!
//! A database the host has never seen is created only by a leader's (or
//! candidate's) handshake; a replica or a follower asking about it is
//! refused (`WrongDatabase`) and nothing is created. The databases a host
//! holds are bounded (`max_databases`: the next new one is refused,
//! `Unavailable`, [`HostError::Full`]) and so are the ones open at once
//! (`max_open`: the least recently used idle one is closed to make room,
//! or, all in use, the new one is refused, [`HostError::Busy`]).
//!
//! # At rest
//!
//! Every database's records go to the host's shared log
//! ([`crate::shared_log`]), which holds one descriptor for all of them
//! (its active segment); a database, open or closed, holds none, and on
//! disk only its promise file and its live share of the shared segments
//! (nothing once archived and released). Retention and compaction work
//! per database there. (With `per_database_logs`, and for the legacy
//! database, each log is a segment log of its own: an open database then
//! holds one descriptor, its current segment, whose first segment is
//! small, `first_segment_bytes`, and grows by doubling.) A database with no
//! connection and no activity for `idle_close` is closed (after its last
//! sync; nothing is closed with records staged or a catch-up running) and
//! reopened on the next connection or archiver call (a shared-log index
//! stays in memory: only the promise is read). A failed sync of the shared
//! log breaks every database in it until the host restarts.
//!
//! # Group commit across databases
//!
//! A connection's `drained` only queues its database if it asked for a
//! sync; `drains_done` (once per batch of completions on io_uring, after
//! each `drained` on the std transport) runs sync rounds until the queue
//! is empty: each round takes every queued database, locks them in id
//! order, and makes all their staged records durable in one
//! [`SharedLog::sync`](crate::shared_log::SharedLog::sync): one
//! fdatasync of the shared log's active segment for all of them (and
//! [`GroupSyncer::sync`], one io_uring submission, for databases on logs
//! of their own), then tells each core its own outcome; only then do acks
//! go out. At most one round runs at a
//! time; databases queued meanwhile form the next.

use super::NodeError;
use super::follower_db::{Db, DbSummary, FollowerDb, LogShape};
use crate::bookmark::{Bookmark, Epoch};
use crate::follower::FollowerEvent;
use crate::ids::DatabaseId;
use crate::leader::PeerId;
use crate::net::mux::{Limits, Mux, MuxSnapshot};
use crate::net::{Backend, ClusterKey, ConnId, NetHandler, Transport};
use crate::segments::{GroupSyncer, IoBackend};
use crate::shared_log::{SharedLog, SharedLogConfig, SharedRecovery};
use crate::wire::{Message, RefuseReason, Role};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

/// How to run a follower host.
#[derive(Debug, Clone)]
pub struct FollowerHostConfig {
    pub listen: SocketAddr,
    pub dir: PathBuf,
    /// The other hosts, to catch up from (for the same database).
    pub peers: Vec<SocketAddr>,
    /// The largest segment (new segments double up to it).
    pub segment_bytes: u64,
    /// A database's first segment.
    pub first_segment_bytes: u64,
    pub backend: Backend,
    /// How syncs reach the disk (io_uring where allowed, by default).
    pub storage: IoBackend,
    pub auth: Option<ClusterKey>,
    pub catch_up_batch_bytes: usize,
    /// Databases this host may hold.
    pub max_databases: usize,
    /// Databases open at once.
    pub max_open: usize,
    /// A database without connections idle this long is closed.
    pub idle_close: Duration,
    /// A database kept in the single-database layout (its `epoch` and
    /// `log/` in `dir` itself), opened at start; connections that do not
    /// introduce themselves (older peers) are served as this one.
    pub legacy: Option<DatabaseId>,
    /// Give every database a segment log of its own (the layout before
    /// the shared log) instead of a share of the host's shared log.
    pub per_database_logs: bool,
    /// The shared log's segments.
    pub shared_segment_bytes: u64,
    /// Shared segments kept before compaction moves the oldest one's live
    /// entries forward.
    pub shared_max_segments: usize,
}

impl FollowerHostConfig {
    /// Defaults for everything but where to listen and store.
    pub fn new(listen: SocketAddr, dir: PathBuf) -> FollowerHostConfig {
        FollowerHostConfig {
            listen,
            dir,
            peers: Vec::new(),
            segment_bytes: 64 << 20,
            first_segment_bytes: FIRST_SEGMENT_BYTES,
            backend: Backend::Auto,
            storage: IoBackend::Auto,
            auth: None,
            catch_up_batch_bytes: super::follower::CATCH_UP_BATCH_BYTES,
            max_databases: 100_000,
            // A third of a 20,000-descriptor limit, with room for sockets.
            max_open: 4_096,
            idle_close: Duration::from_secs(60),
            legacy: None,
            per_database_logs: false,
            shared_segment_bytes: SharedLogConfig::default().segment_bytes,
            shared_max_segments: SharedLogConfig::default().max_segments,
        }
    }
}

/// A database's first segment, by default.
pub const FIRST_SEGMENT_BYTES: u64 = 64 << 10;

/// Why a host would not serve a database.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("database {id} is not held here")]
    Unknown { id: DatabaseId },
    #[error("this host holds {max} databases, its limit: database {id} is refused")]
    Full { id: DatabaseId, max: usize },
    #[error("{max} databases are open here, all in use: database {id} cannot be opened now")]
    Busy { id: DatabaseId, max: usize },
    #[error("database {id}: {source}")]
    Open {
        id: DatabaseId,
        #[source]
        source: NodeError,
    },
}

/// Counters of a host (monotonic).
#[derive(Debug, Default)]
pub struct HostStats {
    /// Sync rounds that issued at least one fdatasync.
    pub sync_rounds: AtomicU64,
    /// fdatasyncs issued, over all rounds.
    pub fdatasyncs: AtomicU64,
    /// Submissions to the kernel those took (io_uring: one per round).
    pub sync_submissions: AtomicU64,
    /// Databases made durable, summed over rounds.
    pub databases_synced: AtomicU64,
    pub opened: AtomicU64,
    pub closed: AtomicU64,
    pub created: AtomicU64,
    pub refused: AtomicU64,
}

struct Slot {
    open: Option<Arc<Db>>,
    /// Kept when it was last closed.
    summary: Option<DbSummary>,
    /// Connections bound to it and catch-up dials under way.
    users: usize,
    last_used: Instant,
}

/// An open database, or what was kept of a closed one.
pub(super) type Known = Result<Arc<Db>, DbSummary>;

impl Slot {
    fn known(&self) -> Option<Known> {
        match (&self.open, self.summary) {
            (Some(db), _) => Some(Ok(Arc::clone(db))),
            (None, Some(s)) => Some(Err(s)),
            (None, None) => None,
        }
    }
}

#[derive(Default)]
struct Registry {
    slots: HashMap<DatabaseId, Slot>,
    conns: HashMap<ConnId, Arc<Db>>,
    dials: HashMap<u64, Arc<Db>>,
    next_tag: u64,
    open: usize,
}

#[derive(Default)]
struct SyncQueue {
    pending: Vec<Arc<Db>>,
    running: bool,
}

pub(super) struct Shared {
    pub(super) config: FollowerHostConfig,
    transport: OnceLock<Arc<dyn Transport>>,
    registry: Mutex<Registry>,
    queue: Mutex<SyncQueue>,
    syncer: Mutex<GroupSyncer>,
    /// The databases' shared log (None with `per_database_logs`).
    pub(super) log: Option<Arc<SharedLog>>,
    log_recovery: SharedRecovery,
    stats: HostStats,
}

/// A running follower host. Dropping it does not stop its threads; the
/// process owns them.
pub struct FollowerHost {
    shared: Arc<Shared>,
    addr: SocketAddr,
    mux: Mux,
}

impl std::fmt::Debug for FollowerHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FollowerHost")
            .field("addr", &self.addr)
            .finish()
    }
}

fn parse_id(name: &str) -> Option<DatabaseId> {
    (name.len() == DatabaseId::TEXT_LEN)
        .then(|| u64::from_str_radix(name, 16).ok())
        .flatten()
        .map(DatabaseId)
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

impl FollowerHost {
    /// Finds the databases held in `dir` (opening only the legacy one),
    /// then listens.
    pub fn start(config: FollowerHostConfig) -> Result<FollowerHost, NodeError> {
        let dbs = config.dir.join("db");
        std::fs::create_dir_all(&dbs)
            .map_err(NodeError::io(format!("creating {}", dbs.display())))?;
        let mut registry = Registry::default();
        let now = Instant::now();
        for entry in std::fs::read_dir(&dbs)
            .map_err(NodeError::io(format!("listing {}", dbs.display())))?
            .flatten()
        {
            if let Some(id) = entry.file_name().to_str().and_then(parse_id) {
                registry.slots.insert(
                    id,
                    Slot {
                        open: None,
                        summary: None,
                        users: 0,
                        last_used: now,
                    },
                );
            }
        }
        let (log, log_recovery) = storage::open_shared_log(&config)?;
        let shared = Arc::new(Shared {
            transport: OnceLock::new(),
            registry: Mutex::new(registry),
            queue: Mutex::new(SyncQueue::default()),
            syncer: Mutex::new(GroupSyncer::new(config.storage)),
            log,
            log_recovery,
            stats: HostStats::default(),
            config,
        });
        if let Some(id) = shared.config.legacy {
            let mut reg = shared.registry.lock();
            shared.resolve(&mut reg, id, true).map_err(|e| match e {
                HostError::Open { source, .. } => source,
                e => NodeError::Io {
                    what: format!("opening database {id}"),
                    source: io::Error::other(e.to_string()),
                },
            })?;
        }
        let mux = Mux::open(
            shared.config.backend,
            shared.config.auth.clone(),
            Limits::default(),
        )
        .map_err(NodeError::io("opening the transport"))?;
        let transport = mux.endpoint(Arc::clone(&shared) as Arc<dyn NetHandler>);
        let _ = shared.transport.set(Arc::clone(&transport));
        let addr = transport
            .listen(shared.config.listen)
            .map_err(NodeError::io(format!(
                "listening on {}",
                shared.config.listen
            )))?;
        let weak = Arc::downgrade(&shared);
        std::thread::Builder::new()
            .name("walrelay-host-watch".into())
            .spawn(move || watch(weak))
            .map_err(NodeError::io("starting the host's watchdog"))?;
        Ok(FollowerHost { shared, addr, mux })
    }

    /// The multiplexer's connections, channels and refusals.
    pub fn mux(&self) -> MuxSnapshot {
        self.mux.snapshot()
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
    /// The transport: "std" or "io_uring".
    pub fn backend(&self) -> &'static str {
        self.shared.transport().backend()
    }
    pub fn auth_refusals(&self) -> u64 {
        self.shared.transport().auth_refusals()
    }
    pub fn stats(&self) -> &HostStats {
        &self.shared.stats
    }

    /// A database this host holds (open or not), for its archiver; None
    /// if it holds no such database.
    pub fn database(&self, id: DatabaseId) -> Option<FollowerDb> {
        self.shared
            .registry
            .lock()
            .slots
            .contains_key(&id)
            .then(|| FollowerDb {
                host: Arc::clone(&self.shared),
                id,
            })
    }

    /// Creates (or opens) database `id` as a leader's handshake would:
    /// refused with [`HostError::Full`] past `max_databases`, or
    /// [`HostError::Busy`] when `max_open` are open and all in use.
    pub fn create(&self, id: DatabaseId) -> Result<FollowerDb, HostError> {
        let mut reg = self.shared.registry.lock();
        self.shared.resolve(&mut reg, id, true)?;
        Ok(FollowerDb {
            host: Arc::clone(&self.shared),
            id,
        })
    }

    /// Every database this host holds, in id order.
    pub fn databases(&self) -> Vec<DatabaseId> {
        let mut ids: Vec<DatabaseId> = self.shared.registry.lock().slots.keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    /// Every database held, with its confirmed position where the host
    /// knows it without opening the database (as
    /// [`FollowerDb::known_confirmed`]), in one pass over the registry.
    pub fn known_confirmed(&self) -> Vec<(DatabaseId, Option<Bookmark>)> {
        let confirmed = |k: Known| match k {
            Ok(db) => db.core.lock().follower.confirmed(),
            Err(s) => s.confirmed,
        };
        let all = self.shared.all_known();
        all.into_iter()
            .map(|(id, k)| (id, k.map(confirmed)))
            .collect()
    }

    /// The databases open now, in id order.
    pub fn open_databases(&self) -> Vec<DatabaseId> {
        let reg = self.shared.registry.lock();
        let mut ids: Vec<DatabaseId> = reg
            .slots
            .iter()
            .filter(|(_, s)| s.open.is_some())
            .map(|(id, _)| *id)
            .collect();
        ids.sort_unstable();
        ids
    }

    /// Closes every idle database now (as the watchdog does after
    /// `idle_close`); returns how many were closed.
    pub fn close_idle(&self, idle: Duration) -> usize {
        self.shared.close_idle(idle)
    }
}

impl Shared {
    pub(super) fn transport(&self) -> &Arc<dyn Transport> {
        self.transport
            .get()
            .expect("transport set before any connection")
    }

    fn db_dir(&self, id: DatabaseId) -> PathBuf {
        if self.config.legacy == Some(id) {
            self.config.dir.clone()
        } else {
            self.config.dir.join("db").join(id.to_string())
        }
    }

    fn shape(&self) -> LogShape {
        LogShape {
            segment_bytes: self.config.segment_bytes,
            first_segment_bytes: self.config.first_segment_bytes,
        }
    }

    /// The open database `id`, opening it if it is closed and (with
    /// `create`) creating it if it is new.
    fn resolve(
        &self,
        reg: &mut Registry,
        id: DatabaseId,
        create: bool,
    ) -> Result<Arc<Db>, HostError> {
        let now = Instant::now();
        let known = match reg.slots.get_mut(&id) {
            Some(slot) => {
                slot.last_used = now;
                if let Some(db) = &slot.open {
                    return Ok(Arc::clone(db));
                }
                true
            }
            None if !create => return Err(HostError::Unknown { id }),
            None => false,
        };
        if !known && reg.slots.len() >= self.config.max_databases {
            let max = self.config.max_databases;
            tracing::warn!(database = %id, max, "follower host is full: a new database is refused");
            self.stats.refused.fetch_add(1, Ordering::Relaxed);
            return Err(HostError::Full { id, max });
        }
        self.make_room(reg, id)?;
        let dir = self.db_dir(id);
        let fresh = !dir.join("epoch").exists() && !dir.join("log").exists();
        if !known && self.config.legacy != Some(id) {
            // The database's directory entry is durable before anything
            // in it is promised.
            let fail = |what: String| {
                move |source| HostError::Open {
                    id,
                    source: NodeError::Io { what, source },
                }
            };
            std::fs::create_dir_all(&dir).map_err(fail(format!("creating {}", dir.display())))?;
            let parent = self.config.dir.join("db");
            sync_dir(&parent).map_err(fail(format!("syncing {}", parent.display())))?;
        }
        let confirmed = reg
            .slots
            .get(&id)
            .and_then(|s| s.summary)
            .map_or(Bookmark::ZERO, |s| s.confirmed);
        let shared = self.log.as_ref().filter(|_| self.config.legacy != Some(id));
        let db = Arc::new(Db::open(id, &dir, self.shape(), confirmed, shared)?);
        let slot = reg.slots.entry(id).or_insert(Slot {
            open: None,
            summary: None,
            users: 0,
            last_used: now,
        });
        slot.open = Some(Arc::clone(&db));
        reg.open += 1;
        self.stats.opened.fetch_add(1, Ordering::Relaxed);
        if fresh {
            self.stats.created.fetch_add(1, Ordering::Relaxed);
            tracing::info!(database = %id, "follower host created a database");
        } else {
            tracing::debug!(database = %id, records = db.recovery.records, "follower host opened a database");
        }
        Ok(db)
    }

    /// Closes the least recently used idle database if `max_open` are
    /// open; refuses if every open one is in use.
    fn make_room(&self, reg: &mut Registry, id: DatabaseId) -> Result<(), HostError> {
        while reg.open >= self.config.max_open {
            let mut idle: Vec<(Instant, DatabaseId)> = reg
                .slots
                .iter()
                .filter(|(_, s)| s.open.is_some() && s.users == 0)
                .map(|(id, s)| (s.last_used, *id))
                .collect();
            idle.sort_unstable();
            if !idle.into_iter().any(|(_, victim)| self.close(reg, victim)) {
                let max = self.config.max_open;
                tracing::warn!(database = %id, max, "follower host has every open database in use: one more is refused");
                self.stats.refused.fetch_add(1, Ordering::Relaxed);
                return Err(HostError::Busy { id, max });
            }
        }
        Ok(())
    }

    /// Closes `id` if it is open, unused and closable; true if it did.
    fn close(&self, reg: &mut Registry, id: DatabaseId) -> bool {
        let Some(slot) = reg.slots.get_mut(&id) else {
            return false;
        };
        let Some(db) = slot.open.clone().filter(|_| slot.users == 0) else {
            return false;
        };
        // Busy (a sync round holds it): not idle, and the registry must
        // not wait behind a sync.
        let Some(mut core) = db.core.try_lock() else {
            return false;
        };
        if core.closed || !Db::closable(&core) {
            return false;
        }
        core.closed = true;
        slot.summary = Some(Db::summary(&core));
        slot.open = None;
        drop(core);
        reg.open -= 1;
        self.stats.closed.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(database = %id, "follower host closed an idle database");
        // The log's files close with the last reference, which is gone or
        // about to be (only a call in progress can still hold one).
        drop(db);
        true
    }

    fn close_idle(&self, idle: Duration) -> usize {
        let mut reg = self.registry.lock();
        let ids: Vec<DatabaseId> = reg
            .slots
            .iter()
            .filter(|(_, s)| s.open.is_some() && s.users == 0 && s.last_used.elapsed() >= idle)
            .map(|(id, _)| *id)
            .collect();
        ids.into_iter()
            .filter(|id| self.close(&mut reg, *id))
            .count()
    }

    /// For the archiver's questions: the open database, or what was kept
    /// of a closed one (opening it only if nothing was kept).
    pub(super) fn peek(&self, id: DatabaseId) -> Result<Result<Arc<Db>, DbSummary>, HostError> {
        let mut reg = self.registry.lock();
        match reg.slots.get(&id) {
            None => Err(HostError::Unknown { id }),
            Some(Slot { open: Some(db), .. }) => Ok(Ok(Arc::clone(db))),
            Some(Slot {
                summary: Some(s), ..
            }) => Ok(Err(*s)),
            Some(_) => self.resolve(&mut reg, id, false).map(Ok),
        }
    }

    /// As [`Shared::peek`], but never opening: None for a closed database
    /// the host has no summary of (not opened since it started).
    pub(super) fn peek_known(&self, id: DatabaseId) -> Result<Option<Known>, HostError> {
        let reg = self.registry.lock();
        reg.slots
            .get(&id)
            .map(Slot::known)
            .ok_or(HostError::Unknown { id })
    }

    /// [`Shared::peek_known`] of every database, in one pass.
    fn all_known(&self) -> Vec<(DatabaseId, Option<Known>)> {
        let reg = self.registry.lock();
        reg.slots.iter().map(|(id, s)| (*id, s.known())).collect()
    }

    /// The database `id`, opened if it is closed (never created).
    pub(super) fn open(&self, id: DatabaseId) -> Result<Arc<Db>, HostError> {
        let mut reg = self.registry.lock();
        self.resolve(&mut reg, id, false)
    }

    /// The database a message on `conn` is for: the one the connection is
    /// bound to, or, for its first message, the one its handshake names
    /// (bound from then on). None: refused and closed.
    fn route(&self, conn: ConnId, message: &Message) -> Option<Arc<Db>> {
        let mut reg = self.registry.lock();
        if let Some(db) = reg.conns.get(&conn).cloned() {
            if let Some(slot) = reg.slots.get_mut(&db.id) {
                slot.last_used = Instant::now();
            }
            return Some(db);
        }
        let (id, create) = match message {
            Message::Handshake { database, role, .. } => (*database, *role == Role::Leader),
            _ => match self.config.legacy {
                Some(id) => (id, false),
                None => {
                    tracing::warn!(
                        conn,
                        "a connection that did not say which database it is for is closed"
                    );
                    drop(reg);
                    self.transport().close(conn);
                    return None;
                }
            },
        };
        match self.resolve(&mut reg, id, create) {
            Ok(db) => {
                reg.conns.insert(conn, Arc::clone(&db));
                if let Some(slot) = reg.slots.get_mut(&id) {
                    slot.users += 1;
                }
                Some(db)
            }
            Err(err) => {
                drop(reg);
                let reason = match err {
                    HostError::Unknown { .. } => {
                        tracing::info!(database = %id, "refused a connection for a database this host does not hold");
                        RefuseReason::WrongDatabase
                    }
                    HostError::Open { .. } => {
                        tracing::error!(database = %id, %err, "follower host could not open a database");
                        RefuseReason::Unavailable
                    }
                    HostError::Full { .. } | HostError::Busy { .. } => RefuseReason::Unavailable,
                };
                let refuse = Message::Refuse {
                    epoch: Epoch(0),
                    reason,
                };
                self.transport().send(conn, &refuse);
                self.transport().close(conn);
                None
            }
        }
    }

    /// Feeds `event` to `db`'s core and carries out what follows, dialing
    /// (if asked) after the lock is released.
    fn event(&self, db: &Arc<Db>, event: FollowerEvent) {
        let mut core = db.core.lock();
        if core.closed {
            return;
        }
        let actions = core.follower.handle(event);
        db.run(self, &mut core, actions);
        let dial = core.dial.take();
        drop(core);
        if let Some(peer) = dial {
            let tag = {
                let mut reg = self.registry.lock();
                reg.next_tag += 1;
                let tag = reg.next_tag;
                reg.dials.insert(tag, Arc::clone(db));
                if let Some(slot) = reg.slots.get_mut(&db.id) {
                    slot.users += 1;
                }
                tag
            };
            self.transport().connect(peer, tag);
        }
    }

    fn watch_catch_up(&self) {
        let open: Vec<Arc<Db>> = {
            let reg = self.registry.lock();
            reg.slots.values().filter_map(|s| s.open.clone()).collect()
        };
        for db in open {
            let stale = {
                let mut core = db.core.lock();
                let idle = core
                    .catch_up_seen
                    .is_some_and(|t| t.elapsed() > super::CATCH_UP_IDLE);
                match core.follower.catch_up_source() {
                    Some(peer) if idle => {
                        core.catch_up_seen = None;
                        Some(peer)
                    }
                    _ => None,
                }
            };
            // Closing reports `closed`, which tells the core.
            if let Some(peer) = stale {
                self.transport().close(peer.0);
            }
        }
    }
}

fn watch(shared: Weak<Shared>) {
    loop {
        let every = match shared.upgrade() {
            Some(s) => (s.config.idle_close / 4)
                .clamp(Duration::from_millis(5), Duration::from_millis(500)),
            None => return,
        };
        std::thread::sleep(every);
        let Some(s) = shared.upgrade() else { return };
        s.watch_catch_up();
        s.close_idle(s.config.idle_close);
        if let Some(log) = s.log.as_ref().filter(|l| !l.failed()) {
            // Retention: segments nothing needs go, the oldest compacts.
            if let Err(err) = log.maintain() {
                tracing::error!(%err, "shared log maintenance failed");
            }
        }
    }
}

impl NetHandler for Shared {
    fn accepted(&self, _conn: ConnId, _from: SocketAddr) {}

    fn connected(&self, conn: ConnId, tag: u64) {
        let db = {
            let mut reg = self.registry.lock();
            let Some(db) = reg.dials.remove(&tag) else {
                drop(reg);
                self.transport().close(conn);
                return;
            };
            reg.conns.insert(conn, Arc::clone(&db));
            db
        };
        db.core.lock().catch_up_seen = Some(Instant::now());
        self.event(&db, FollowerEvent::CatchUpConnected { peer: PeerId(conn) });
    }

    fn connect_failed(&self, tag: u64, _error: io::Error) {
        let db = {
            let mut reg = self.registry.lock();
            let Some(db) = reg.dials.remove(&tag) else {
                return;
            };
            if let Some(slot) = reg.slots.get_mut(&db.id) {
                slot.users = slot.users.saturating_sub(1);
            }
            db
        };
        self.event(&db, FollowerEvent::CatchUpFailed);
    }

    fn message(&self, conn: ConnId, message: Message) {
        let Some(db) = self.route(conn, &message) else {
            return;
        };
        {
            let mut core = db.core.lock();
            if core.broken.is_some() || core.closed {
                drop(core);
                self.transport().close(conn);
                return;
            }
            if core.follower.catch_up_source() == Some(PeerId(conn)) {
                core.catch_up_seen = Some(Instant::now());
            }
        }
        self.event(
            &db,
            FollowerEvent::Received {
                peer: PeerId(conn),
                message,
            },
        );
    }

    fn drained(&self, conn: ConnId) {
        let db = self.registry.lock().conns.get(&conn).cloned();
        if let Some(db) = db {
            self.queue(&db);
        }
    }

    fn drains_done(&self) {
        self.sync_rounds();
    }

    fn closed(&self, conn: ConnId, _error: Option<String>) {
        let db = {
            let mut reg = self.registry.lock();
            let Some(db) = reg.conns.remove(&conn) else {
                return;
            };
            if let Some(slot) = reg.slots.get_mut(&db.id) {
                slot.users = slot.users.saturating_sub(1);
                slot.last_used = Instant::now();
            }
            db
        };
        self.event(&db, FollowerEvent::Disconnected { peer: PeerId(conn) });
        // Make whatever a catch-up fetched durable before anyone relies on
        // it.
        self.queue(&db);
        self.sync_rounds();
    }
}

#[path = "follower_host_sync.rs"]
mod sync;

#[path = "follower_host_storage.rs"]
mod storage;

#[cfg(test)]
#[path = "follower_host_tests.rs"]
mod tests;
