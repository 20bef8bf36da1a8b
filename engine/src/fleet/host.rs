//! The databases a node hosts (D1's Durable Objects): each one's own
//! state, opened on its first query and closed when idle.
//!
//! A hosted database lives in `DIR/<database id>/`: its SQLite file (`db`,
//! with its WAL and metadata) and `state.json`, the database's own record
//! of what it is (written atomically: temporary file, fsync, rename,
//! directory fsync):
//!
//! ```text
//! {"uuid": "9f1c…", "database_id": 1234, "account": "acct", "name": "shop",
//!  "lifecycle": "initialised" | "active" | "deleted", "created_at_ms": 1764540000000}
//! ```
//!
//! `initialised`: created by the control plane's first step, not yet known
//! to serve; `active`: confirmed by activation or a heartbeat; `deleted`:
//! told so (by the control plane or a heartbeat), refuses every query even
//! when a stale route leads here, and its data files are removed.
//! Databases still `initialised` are listed in `DIR/unconfirmed/` so that
//! a restarted node keeps heartbeating them (an orphan must learn it is one).
//!
//! Only open databases take memory and file descriptors: at most
//! `max_open` at once (by default derived from the descriptor limit),
//! least recently used first out, and each closes after `idle_close_ms`
//! without a query.

use super::names::{AccountId, DatabaseName, DatabaseUuid};
use crate::{Database, OpenError, Options};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use walrelay_replicator::DatabaseId;
use walrelay_replicator::net::mux::{Limits, Mux, MuxSnapshot};

/// Where a hosted database is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Lifecycle {
    Initialised,
    Active,
    Deleted,
}

/// A hosted database's own record (`state.json`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HostedState {
    pub uuid: String,
    pub database_id: u64,
    pub account: String,
    pub name: String,
    pub lifecycle: Lifecycle,
    pub created_at_ms: i64,
}

impl HostedState {
    pub fn uuid(&self) -> Option<DatabaseUuid> {
        self.uuid.parse().ok()
    }
    pub fn account(&self) -> Option<AccountId> {
        AccountId::new(&self.account).ok()
    }
}

/// An open database and whatever keeps it served (a replicated primary's
/// leader, say).
pub trait Hosted: Send + Sync + fmt::Debug {
    fn database(&self) -> &Database;
    /// Where its read replicas subscribe (None: it has none).
    fn replica_addr(&self) -> Option<std::net::SocketAddr> {
        None
    }
    /// Another node took the database over (won a newer epoch): this copy
    /// must close; the next query reopens it, behind the newer one.
    fn fenced(&self) -> bool {
        false
    }
    /// Stops it; called once no query uses it.
    fn close(self: Box<Self>);
}

/// Opens a hosted database's file.
pub trait Opener: Send + Sync + fmt::Debug {
    fn open(&self, id: DatabaseId, path: &Path) -> Result<Box<dyn Hosted>, HostError>;
    /// How the opener's shared replication connections stand (None: it
    /// has none).
    fn mux(&self) -> Option<MuxSnapshot> {
        None
    }
}

/// A database served from this node alone (its WAL synced locally).
#[derive(Debug)]
pub struct LocalOpener {
    pub options: Options,
}

#[derive(Debug)]
struct Local(Database);

impl Hosted for Local {
    fn database(&self) -> &Database {
        &self.0
    }
    fn close(self: Box<Self>) {
        self.0.stop_queries();
    }
}

impl Opener for LocalOpener {
    fn open(&self, id: DatabaseId, path: &Path) -> Result<Box<dyn Hosted>, HostError> {
        let db = Database::open(path, self.options.clone())
            .map_err(|source| HostError::Open { id, source })?;
        Ok(Box::new(Local(db)))
    }
}

/// A database replicated to W of N followers (the followers host many
/// databases each): every open wins a new epoch from them and brings the
/// local file to the end of their log; a close stops cleanly.
///
/// Every database it opens replicates over one shared [`Mux`] (the
/// template's, or one made at the first open with the template's backend
/// and key): one authenticated connection per follower for the whole
/// process, each database a channel on it.
#[derive(Debug)]
pub struct ReplicatedOpener {
    /// Everything but the database's id and path. Its `listen`, if set,
    /// is where the node's mux takes every open database's read replicas
    /// (port 0: a free one, the same for all); the host tells replicas.
    pub template: crate::replication::PrimaryConfig,
    /// How long a close waits for the last writes to be confirmed.
    pub stop_timeout_ms: u64,
    mux: std::sync::OnceLock<Mux>,
}

impl ReplicatedOpener {
    /// Each database it opens keeps [`FLEET_TAIL_LIMIT_BYTES`] of confirmed
    /// records for its peers (set on `template`, which stays public).
    pub fn new(mut template: crate::replication::PrimaryConfig, stop_timeout_ms: u64) -> Self {
        template.tail_limit_bytes = FLEET_TAIL_LIMIT_BYTES;
        ReplicatedOpener {
            template,
            stop_timeout_ms,
            mux: std::sync::OnceLock::new(),
        }
    }

    /// The process-wide multiplexer, made at the first call.
    fn mux(&self) -> Result<Mux, std::io::Error> {
        if let Some(m) = self.template.mux.as_ref().or(self.mux.get()) {
            return Ok(m.clone());
        }
        let made = Mux::open(
            self.template.backend,
            self.template.auth.clone(),
            Limits::default(),
        )?;
        // A racing open may have set one first: use that one.
        Ok(self.mux.get_or_init(|| made).clone())
    }
}

#[derive(Debug)]
struct Replicated {
    primary: crate::replication::ReplicatedPrimary,
    stop_timeout_ms: u64,
}

impl Hosted for Replicated {
    fn database(&self) -> &Database {
        self.primary.database()
    }
    fn replica_addr(&self) -> Option<std::net::SocketAddr> {
        self.primary.replica_addr()
    }
    fn fenced(&self) -> bool {
        self.primary.leader().fenced().is_some()
    }
    fn close(self: Box<Self>) {
        self.primary.database().stop_queries();
        let path = self.primary.database().path().display().to_string();
        // A clean stop shuts the leader down; a failed one must too, or its
        // connections and threads outlive the database (the leader and its
        // transport hold each other).
        let leader = self.primary.leader().clone();
        if let Err(e) = self
            .primary
            .stop(std::time::Duration::from_millis(self.stop_timeout_ms))
        {
            // The next open recovers it from the followers' log.
            tracing::warn!(path, error = %e, "a hosted database did not stop cleanly");
        }
        leader.shutdown();
    }
}

impl Opener for ReplicatedOpener {
    fn open(&self, id: DatabaseId, path: &Path) -> Result<Box<dyn Hosted>, HostError> {
        let mut config = self.template.clone();
        config.database = id;
        config.path = path.to_path_buf();
        config.mux = Some(self.mux().map_err(|e| HostError::Replication {
            id,
            reason: format!("opening the replication multiplexer: {e}"),
        })?);
        let primary = crate::replication::ReplicatedPrimary::start(config).map_err(|e| {
            HostError::Replication {
                id,
                reason: e.to_string(),
            }
        })?;
        Ok(Box::new(Replicated {
            primary,
            stop_timeout_ms: self.stop_timeout_ms,
        }))
    }

    fn mux(&self) -> Option<MuxSnapshot> {
        self.template
            .mux
            .as_ref()
            .or(self.mux.get())
            .map(Mux::snapshot)
    }
}

/// Why a hosted database could not serve or change.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("database {0} is not hosted on this node")]
    NotHosted(DatabaseId),
    #[error("database {0} was deleted")]
    Deleted(DatabaseId),
    #[error("database {0} is not active yet")]
    NotActive(DatabaseId),
    #[error("database {0} already exists on this node")]
    Exists(DatabaseId),
    #[error("this node hosts its limit of {0} databases")]
    Full(u64),
    #[error("all {0} open databases are in use; retry")]
    Busy(usize),
    #[error("opening database {id}: {source}")]
    Open {
        id: DatabaseId,
        #[source]
        source: OpenError,
    },
    #[error("replicating database {id}: {reason}")]
    Replication { id: DatabaseId, reason: String },
    #[error("database {id}'s state: {reason}")]
    State { id: DatabaseId, reason: String },
    #[error("host storage: {0}")]
    Io(#[from] std::io::Error),
    #[error("database {id}'s host: {reason}")]
    Remote { id: DatabaseId, reason: String },
    #[error("a malformed request: {0}")]
    BadRequest(String),
}

/// How a node hosts databases.
#[derive(Debug, Clone)]
pub struct HostConfig {
    pub dir: PathBuf,
    /// Most databases open at once (0: derived from the descriptor limit).
    pub max_open: usize,
    /// An open database unused this long is closed.
    pub idle_close_ms: u64,
    /// Most databases this node will host.
    pub max_hosted: u64,
}

/// File descriptors one open database costs (its writer's database and
/// WAL files, its owner lock (in place of the shared-memory file the
/// `unix` VFS used to keep open), one reader's, and slack), measured in
/// `papers/fleet.md`.
pub const FDS_PER_OPEN_DATABASE: u64 = 8;

/// Confirmed records each open database's primary keeps in memory for a
/// follower or replica that falls behind (`PrimaryConfig::tail_limit_bytes`;
/// one behind them catches up from a follower's log). A dedicated primary
/// keeps 64 MiB; a node with thousands of databases open cannot, so its
/// primaries (and the embedded catalog's) keep this much each.
pub const FLEET_TAIL_LIMIT_BYTES: usize = 1 << 20;

/// Descriptors kept for the HTTP connections a node may hold, and for
/// replication sockets, logs and everything else.
const FD_RESERVE: u64 = crate::http::server::DEFAULT_MAX_CONNECTIONS as u64 + 512;

/// The open-database cap the descriptor limit allows.
pub fn max_open_for_fd_limit() -> usize {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct we own.
    let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut lim) } == 0 {
        lim.rlim_cur
    } else {
        1024
    };
    (soft.saturating_sub(FD_RESERVE) / FDS_PER_OPEN_DATABASE).clamp(4, 1 << 20) as usize
}

/// An open database in use by a query (holding it keeps it open).
#[derive(Debug)]
pub struct OpenDb {
    id: DatabaseId,
    hosted: Mutex<Option<Box<dyn Hosted>>>,
    database: Database,
    pub state: HostedState,
    last_used_ms: AtomicI64,
}

impl OpenDb {
    pub fn id(&self) -> DatabaseId {
        self.id
    }
    pub fn database(&self) -> &Database {
        &self.database
    }
    /// Where its read replicas subscribe, while it is open.
    pub fn replica_addr(&self) -> Option<std::net::SocketAddr> {
        self.hosted.lock().as_ref().and_then(|h| h.replica_addr())
    }
    /// Whether another node won a newer epoch for it.
    pub fn fenced(&self) -> bool {
        self.hosted.lock().as_ref().is_some_and(|h| h.fenced())
    }
}

/// Counters for `/metrics` and the fleet benchmark.
#[derive(Debug, Default)]
pub struct HostStats {
    pub opened: AtomicU64,
    pub closed_idle: AtomicU64,
    pub evicted: AtomicU64,
    pub created: AtomicU64,
    pub deleted: AtomicU64,
    /// Taken over from another node (failover).
    pub adopted: AtomicU64,
    /// Given up: another node hosts them now.
    pub forgotten: AtomicU64,
}

/// The databases this node hosts.
#[derive(Debug)]
pub struct Host {
    config: HostConfig,
    max_open: usize,
    opener: Box<dyn Opener>,
    open: Mutex<HashMap<DatabaseId, Arc<OpenDb>>>,
    /// Serialises opening and state changes of one database at a time.
    changing: Mutex<()>,
    unconfirmed: Mutex<HashSet<DatabaseId>>,
    hosted: AtomicU64,
    pub stats: HostStats,
}

fn now_ms() -> i64 {
    super::catalog::now_ms()
}

fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

impl Host {
    /// The opener's shared replication connections, if it has any.
    pub fn replication_mux(&self) -> Option<MuxSnapshot> {
        self.opener.mux()
    }

    /// Hosts databases under `config.dir`, opening them with `opener`.
    pub fn open(config: HostConfig, opener: Box<dyn Opener>) -> Result<Host, HostError> {
        std::fs::create_dir_all(config.dir.join("unconfirmed"))?;
        let mut unconfirmed = HashSet::new();
        for entry in std::fs::read_dir(config.dir.join("unconfirmed"))? {
            let entry = entry?;
            if let Some(id) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<walrelay_replicator::DatabaseId>().ok())
            {
                unconfirmed.insert(id);
            }
        }
        let hosted = std::fs::read_dir(&config.dir)?
            .filter_map(Result::ok)
            .filter(|e| e.path().join("state.json").exists())
            .count() as u64;
        let max_open = if config.max_open == 0 {
            max_open_for_fd_limit()
        } else {
            config.max_open
        };
        Ok(Host {
            config,
            max_open,
            opener,
            open: Mutex::new(HashMap::new()),
            changing: Mutex::new(()),
            unconfirmed: Mutex::new(unconfirmed),
            hosted: AtomicU64::new(hosted),
            stats: HostStats::default(),
        })
    }

    pub fn max_open(&self) -> usize {
        self.max_open
    }

    fn db_dir(&self, id: DatabaseId) -> PathBuf {
        self.config.dir.join(id.to_string())
    }

    /// The SQLite file of a hosted database.
    pub fn db_path(&self, id: DatabaseId) -> PathBuf {
        self.db_dir(id).join("db")
    }

    /// A hosted database's own record, from disk (None: not hosted here).
    pub fn state(&self, id: DatabaseId) -> Result<Option<HostedState>, HostError> {
        if let Some(open) = self.open.lock().get(&id) {
            return Ok(Some(open.state.clone()));
        }
        let path = self.db_dir(id).join("state.json");
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        if bytes.len() > 64 << 10 {
            return Err(HostError::State {
                id,
                reason: "state.json is larger than 64 KiB".into(),
            });
        }
        let state: HostedState = serde_json::from_slice(&bytes).map_err(|e| HostError::State {
            id,
            reason: e.to_string(),
        })?;
        if state.database_id != id.0 {
            return Err(HostError::State {
                id,
                reason: format!("it names database {}", state.database_id),
            });
        }
        Ok(Some(state))
    }

    fn write_state(&self, state: &HostedState) -> Result<(), HostError> {
        let id = DatabaseId(state.database_id);
        let bytes = serde_json::to_vec(state).map_err(|e| HostError::State {
            id,
            reason: e.to_string(),
        })?;
        write_atomically(&self.db_dir(id).join("state.json"), &bytes)?;
        Ok(())
    }

    fn set_unconfirmed(&self, id: DatabaseId, unconfirmed: bool) -> Result<(), HostError> {
        let marker = self.config.dir.join("unconfirmed").join(id.to_string());
        if unconfirmed {
            write_atomically(&marker, b"")?;
            self.unconfirmed.lock().insert(id);
        } else {
            match std::fs::remove_file(&marker) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e.into()),
            }
            self.unconfirmed.lock().remove(&id);
        }
        Ok(())
    }

    /// A new database's record (not written yet), if the host has room;
    /// its directory is made.
    fn new_record(
        &self,
        uuid: DatabaseUuid,
        id: DatabaseId,
        account: &AccountId,
        name: &DatabaseName,
        lifecycle: Lifecycle,
    ) -> Result<HostedState, HostError> {
        let hosted = self.hosted.load(Ordering::Relaxed);
        if hosted >= self.config.max_hosted {
            tracing::warn!(database = %id, hosted, ?lifecycle, "refusing a database: the host is full");
            return Err(HostError::Full(self.config.max_hosted));
        }
        std::fs::create_dir_all(self.db_dir(id))?;
        Ok(HostedState {
            uuid: uuid.to_string(),
            database_id: id.0,
            account: account.to_string(),
            name: name.to_string(),
            lifecycle,
            created_at_ms: now_ms(),
        })
    }

    /// Creation's first step: the database exists on this node, with its
    /// own record, before the catalog knows it.
    pub fn init(
        &self,
        uuid: DatabaseUuid,
        id: DatabaseId,
        account: &AccountId,
        name: &DatabaseName,
    ) -> Result<HostedState, HostError> {
        let _changing = self.changing.lock();
        if self.db_dir(id).join("state.json").exists() {
            return Err(HostError::Exists(id));
        }
        let state = self.new_record(uuid, id, account, name, Lifecycle::Initialised)?;
        self.set_unconfirmed(id, true)?;
        self.write_state(&state)?;
        // Its SQLite file is made by its first open: at rest a database
        // is its directory and its record.
        self.hosted.fetch_add(1, Ordering::Relaxed);
        self.stats.created.fetch_add(1, Ordering::Relaxed);
        tracing::info!(database = %id, %uuid, %account, %name, "database initialised");
        Ok(state)
    }

    /// Takes over a live database another node hosted (failover): its
    /// record is written active at once (it exists: the catalog says so);
    /// its data comes from the followers' log and cold storage when it
    /// first opens. Idempotent; a deleted one stays deleted.
    pub fn adopt(
        &self,
        uuid: DatabaseUuid,
        id: DatabaseId,
        account: &AccountId,
        name: &DatabaseName,
    ) -> Result<HostedState, HostError> {
        let _changing = self.changing.lock();
        if let Some(state) = self.state(id)? {
            if state.uuid != uuid.to_string() {
                return Err(HostError::Exists(id));
            }
            return match state.lifecycle {
                Lifecycle::Deleted => Err(HostError::Deleted(id)),
                Lifecycle::Active => Ok(state),
                Lifecycle::Initialised => {
                    drop(_changing);
                    self.activate(id)
                }
            };
        }
        let state = self.new_record(uuid, id, account, name, Lifecycle::Active)?;
        self.write_state(&state)?;
        self.hosted.fetch_add(1, Ordering::Relaxed);
        self.stats.adopted.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(database = %id, %uuid, "database adopted from another node (failover)");
        Ok(state)
    }

    /// Stops hosting a database another node now hosts (it moved while
    /// this node was away): closes it and removes its record and files.
    /// Its history is the followers' and cold storage's, not this copy's.
    pub fn forget(&self, id: DatabaseId) -> Result<(), HostError> {
        let _changing = self.changing.lock();
        let closed = self.open.lock().remove(&id);
        if let Some(open) = closed {
            open.database.stop_queries();
            close(&open);
        }
        self.set_unconfirmed(id, false)?;
        match std::fs::remove_dir_all(self.db_dir(id)) {
            Ok(()) => {
                self.hosted.fetch_sub(1, Ordering::Relaxed);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
        self.stats.forgotten.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(database = %id, "database moved to another node: no longer hosted here");
        Ok(())
    }

    /// Marks a database active (idempotent; a deleted one stays deleted).
    pub fn activate(&self, id: DatabaseId) -> Result<HostedState, HostError> {
        self.set_lifecycle(id, Lifecycle::Active)
    }

    /// Marks a database deleted, closes it and removes its data files.
    pub fn delete(&self, id: DatabaseId) -> Result<HostedState, HostError> {
        let state = self.set_lifecycle(id, Lifecycle::Deleted)?;
        let db = self.db_dir(id).join("db");
        for suffix in ["db", "db-wal", "db-shm", "db-walrelay"] {
            let _ = std::fs::remove_file(self.db_dir(id).join(suffix));
        }
        let _ = std::fs::remove_file(walrelay_vfs::owner_lock::lock_path(&db));
        Ok(state)
    }

    fn set_lifecycle(&self, id: DatabaseId, to: Lifecycle) -> Result<HostedState, HostError> {
        let _changing = self.changing.lock();
        let mut state = self.state(id)?.ok_or(HostError::NotHosted(id))?;
        if state.lifecycle == to || state.lifecycle == Lifecycle::Deleted {
            return Ok(state);
        }
        state.lifecycle = to;
        self.write_state(&state)?;
        self.set_unconfirmed(id, false)?;
        if to == Lifecycle::Deleted {
            let closed = self.open.lock().remove(&id);
            if let Some(open) = closed {
                open.database.stop_queries();
                close(&open);
            }
            self.stats.deleted.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(database = %id, uuid = %state.uuid, "database marked deleted");
        } else {
            // Never open before: only an active database opens.
            tracing::info!(database = %id, uuid = %state.uuid, "database active");
        }
        Ok(state)
    }

    /// The open database `id`, opening it if needed, for a query: only an
    /// active database serves.
    pub fn acquire(&self, id: DatabaseId) -> Result<Arc<OpenDb>, HostError> {
        let found = self.open.lock().get(&id).cloned();
        if let Some(open) = found {
            if !open.fenced() {
                open.last_used_ms.store(now_ms(), Ordering::Relaxed);
                return Ok(open);
            }
            // Another node won a newer epoch (a failover moved it there,
            // or this node came back from one): this copy is stale. It is
            // closed and reopened behind the newer epoch; the heartbeat
            // tells this node whether it still hosts the database at all.
            tracing::warn!(database = %id, "a hosted database was fenced by a newer epoch: reopening it");
            let removed = {
                let mut map = self.open.lock();
                match map.get(&id) {
                    Some(o) if Arc::ptr_eq(o, &open) => map.remove(&id),
                    _ => None,
                }
            };
            drop(open);
            if let Some(o) = removed {
                o.database.stop_queries();
                close(&o);
            }
        }
        let _changing = self.changing.lock();
        if let Some(open) = self.open.lock().get(&id) {
            return Ok(Arc::clone(open));
        }
        let state = self.state(id)?.ok_or(HostError::NotHosted(id))?;
        match state.lifecycle {
            Lifecycle::Deleted => return Err(HostError::Deleted(id)),
            Lifecycle::Initialised => return Err(HostError::NotActive(id)),
            Lifecycle::Active => {}
        }
        self.make_room()?;
        let hosted = self.opener.open(id, &self.db_path(id))?;
        let open = Arc::new(OpenDb {
            id,
            database: hosted.database().clone(),
            hosted: Mutex::new(Some(hosted)),
            state,
            last_used_ms: AtomicI64::new(now_ms()),
        });
        self.open.lock().insert(id, Arc::clone(&open));
        self.stats.opened.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(database = %id, "database opened");
        Ok(open)
    }

    /// Closes the least recently used idle database while at the cap.
    fn make_room(&self) -> Result<(), HostError> {
        let mut open = self.open.lock();
        while open.len() >= self.max_open {
            let victim = open
                .values()
                .filter(|o| Arc::strong_count(o) == 1)
                .min_by_key(|o| o.last_used_ms.load(Ordering::Relaxed))
                .map(|o| o.id);
            let Some(id) = victim else {
                return Err(HostError::Busy(self.max_open));
            };
            if let Some(o) = open.remove(&id) {
                close(&o);
                self.stats.evicted.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// Closes every open database unused for `idle_close_ms`.
    pub fn close_idle(&self) -> usize {
        let cutoff = now_ms() - self.config.idle_close_ms as i64;
        let mut open = self.open.lock();
        let idle: Vec<DatabaseId> = open
            .values()
            .filter(|o| {
                Arc::strong_count(o) == 1 && o.last_used_ms.load(Ordering::Relaxed) <= cutoff
            })
            .map(|o| o.id)
            .collect();
        for id in &idle {
            if let Some(o) = open.remove(id) {
                close(&o);
                self.stats.closed_idle.fetch_add(1, Ordering::Relaxed);
            }
        }
        idle.len()
    }

    /// The database `id` if it is open now (nothing is opened, and its
    /// idle time is not reset).
    pub fn get_open(&self, id: DatabaseId) -> Option<Arc<OpenDb>> {
        self.open.lock().get(&id).cloned()
    }

    /// Databases open now.
    pub fn open_ids(&self) -> Vec<DatabaseId> {
        self.open.lock().keys().copied().collect()
    }

    /// Databases initialised and not yet confirmed.
    pub fn unconfirmed_ids(&self) -> Vec<DatabaseId> {
        self.unconfirmed.lock().iter().copied().collect()
    }

    /// Databases hosted (every lifecycle).
    pub fn hosted_count(&self) -> u64 {
        self.hosted.load(Ordering::Relaxed)
    }

    /// The size of a hosted database's files (database and WAL), for the
    /// storage limit.
    pub fn size_bytes(&self, id: DatabaseId) -> u64 {
        ["db", "db-wal"]
            .iter()
            .filter_map(|s| std::fs::metadata(self.db_dir(id).join(s)).ok())
            .map(|m| m.len())
            .sum()
    }

    /// Closes everything (a stopping node).
    pub fn close_all(&self) {
        let all: Vec<Arc<OpenDb>> = self.open.lock().drain().map(|(_, o)| o).collect();
        for o in all {
            o.database.stop_queries();
            close(&o);
        }
    }
}

fn close(open: &OpenDb) {
    if let Some(h) = open.hosted.lock().take() {
        h.close();
    }
}
