//! Read replicas of the fleet's databases on a replica node (one region):
//! each opened on the first read that reaches the node, following its
//! database's primary from then on, closed when idle, at most `max_open`
//! at once.
//!
//! # How a replica finds its primary
//!
//! A hosted primary takes read replicas on its node's replication port
//! (one for all its databases, routed by database; it changes when the
//! node restarts or the database moves). Every replica here subscribes
//! over one mux: one connection per primary node. The replica node asks
//! the database's host (the node its routing entry names) where the port
//! is, with the internal `replication` call ([`super::link`]):
//!
//! - when the replica opens (the host opens the database if it was idle,
//!   so the replica can catch up at once);
//! - again, at most once a [`RESOLVE_INTERVAL_MS`], while the replica has
//!   no leader connection (its primary was closed, or reopened elsewhere),
//!   asking only where it is if it is open: a replica never keeps an idle
//!   primary open.
//!
//! Nothing here weakens the sessions' contract: a read whose bookmark the
//! replica has not reached within its wait is passed to the primary by
//! the query path, like a write.
//!
//! # At rest
//!
//! ```text
//! <node dir>/fleet-replicas/<database id:016x>.db (+ -wal, -shm, watermark)
//! ```
//!
//! A closed replica is its files; it resumes from its persisted watermark.
//!
//! # Deletion
//!
//! A deleted database's replicas are removed: at once when its routing
//! entry's removal reaches this node (its host sends it on its next tick),
//! when its host answers a `replication` call that it is gone, when the
//! replica closes and its entry is gone, and at start. Until the first of
//! these, at most one tick plus a [`RESOLVE_INTERVAL_MS`] after the
//! deletion, a replica may still answer reads of what the database held.

use crate::replica::ReplicaOptions;
use crate::replication::{ReplicaConfig, ReplicatedReplica};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;
use walrelay_replicator::net::Backend;
use walrelay_replicator::net::mux::{Limits, Mux};
use walrelay_replicator::{ClusterKey, DatabaseId};

/// How often a replica without a leader asks where its primary is.
pub const RESOLVE_INTERVAL_MS: i64 = 1_000;

/// File descriptors one open replica costs (its database, WAL, owner
/// lock and watermark files, a reader's, and its subscription's socket).
pub const FDS_PER_OPEN_REPLICA: u64 = 8;

/// How a node keeps read replicas of fleet databases.
#[derive(Debug, Clone)]
pub struct ReplicaHostConfig {
    pub dir: PathBuf,
    /// The durability followers (catch-up from them).
    pub followers: Vec<SocketAddr>,
    pub backend: Backend,
    pub auth: Option<ClusterKey>,
    /// Cold storage a new replica starts from (its newest archived state).
    pub store: Option<walrelay_archive::Store>,
    /// The region reported in `served_by_region`.
    pub region: String,
    /// How long a read waits for its session's bookmark.
    pub max_wait_ms: u64,
    /// Most replicas open at once (0: from the descriptor limit).
    pub max_open: usize,
    /// An open replica unused this long is closed.
    pub idle_close_ms: u64,
}

/// Why a replica could not serve.
#[derive(Debug, thiserror::Error)]
pub enum ReplicaHostError {
    #[error("all {0} open replicas are in use")]
    Busy(usize),
    /// Its host says it is not there (deleted): the replica is removed.
    #[error("database {id} is gone from its host (deleted)")]
    Gone { id: DatabaseId },
    #[error("where database {id}'s primary takes replicas is not known: {reason}")]
    NoLeader { id: DatabaseId, reason: String },
    #[error("starting the replica of database {id}: {reason}")]
    Start { id: DatabaseId, reason: String },
    #[error("replica storage: {0}")]
    Io(#[from] std::io::Error),
}

/// Where a database's primary takes replicas, and its newest bookmark
/// then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Located {
    pub leader: SocketAddr,
    pub at: Option<walrelay_replicator::Bookmark>,
}

/// Asks a database's host where its primary takes replicas; `open`: open
/// it if it is idle (else None when it is not open).
pub trait LocateLeader {
    fn locate(&self, open: bool) -> Result<Option<Located>, ReplicaHostError>;
}

/// An open replica.
#[derive(Debug)]
pub struct FleetReplica {
    id: DatabaseId,
    replicated: ReplicatedReplica,
    last_used_ms: AtomicI64,
    resolved_ms: AtomicI64,
}

impl FleetReplica {
    pub fn id(&self) -> DatabaseId {
        self.id
    }
    pub fn database(&self) -> &crate::Database {
        self.replicated.replica().database()
    }
    pub fn replicated(&self) -> &ReplicatedReplica {
        &self.replicated
    }
}

/// Counters for `/metrics`.
#[derive(Debug, Default)]
pub struct ReplicaHostStats {
    pub opened: AtomicU64,
    pub closed_idle: AtomicU64,
    pub evicted: AtomicU64,
    pub rebuilt: AtomicU64,
    pub removed: AtomicU64,
    pub leader_moves: AtomicU64,
}

/// The read replicas a node keeps.
#[derive(Debug)]
pub struct ReplicaHost {
    config: ReplicaHostConfig,
    max_open: usize,
    open: Mutex<HashMap<DatabaseId, Arc<FleetReplica>>>,
    /// Serialises opening (one replica's files are opened once).
    opening: Mutex<()>,
    /// Every replica subscribes over it: one connection per primary node
    /// (and per follower), each replica a channel. Made at the first open.
    mux: std::sync::OnceLock<Mux>,
    pub stats: ReplicaHostStats,
}

fn now_ms() -> i64 {
    super::catalog::now_ms()
}

impl ReplicaHost {
    pub fn new(config: ReplicaHostConfig) -> Result<ReplicaHost, ReplicaHostError> {
        std::fs::create_dir_all(&config.dir)?;
        let max_open = if config.max_open == 0 {
            (super::host::max_open_for_fd_limit() as u64 * super::host::FDS_PER_OPEN_DATABASE
                / FDS_PER_OPEN_REPLICA) as usize
        } else {
            config.max_open
        };
        Ok(ReplicaHost {
            config,
            max_open,
            open: Mutex::new(HashMap::new()),
            opening: Mutex::new(()),
            mux: std::sync::OnceLock::new(),
            stats: ReplicaHostStats::default(),
        })
    }

    /// The replicas' multiplexer, made at the first call.
    fn mux(&self) -> Result<Mux, ReplicaHostError> {
        if let Some(m) = self.mux.get() {
            return Ok(m.clone());
        }
        let made = Mux::open(
            self.config.backend,
            self.config.auth.clone(),
            Limits::default(),
        )?;
        // Opens are serialised (`opening`): nothing raced this one.
        Ok(self.mux.get_or_init(|| made).clone())
    }

    /// The replicas' connections and channels (None before the first).
    pub fn mux_snapshot(&self) -> Option<walrelay_replicator::net::mux::MuxSnapshot> {
        self.mux.get().map(Mux::snapshot)
    }

    pub fn region(&self) -> &str {
        &self.config.region
    }

    pub fn max_open(&self) -> usize {
        self.max_open
    }

    pub fn open_count(&self) -> usize {
        self.open.lock().len()
    }

    fn path(&self, id: DatabaseId) -> PathBuf {
        self.config.dir.join(format!("{:016x}.db", id.0))
    }

    /// The replica of `id`, opened (and subscribed) if needed.
    pub fn acquire(
        &self,
        id: DatabaseId,
        locate: &dyn LocateLeader,
    ) -> Result<Arc<FleetReplica>, ReplicaHostError> {
        let found = self.open.lock().get(&id).cloned();
        if let Some(r) = found {
            r.last_used_ms.store(now_ms(), Ordering::Relaxed);
            // Behind the followers' retained log: rebuilt from cold
            // storage, once no query reads it (until then it serves what
            // it has, and reads it cannot answer go to the primary).
            let rebuild = r.replicated.node().archived().is_some() && Arc::strong_count(&r) == 2;
            if !rebuild {
                if let Err(e @ ReplicaHostError::Gone { .. }) = self.follow_leader(&r, locate) {
                    drop(r);
                    tracing::warn!(database = %id, "a fleet replica's database is gone from its host: removing the replica");
                    self.close(id, true);
                    return Err(e);
                }
                return Ok(r);
            }
            drop(r);
            tracing::warn!(database = %id, "a fleet replica fell behind the followers' log: rebuilding it from cold storage");
            self.stats.rebuilt.fetch_add(1, Ordering::Relaxed);
            self.close(id, true);
        }
        let _opening = self.opening.lock();
        if let Some(r) = self.open.lock().get(&id) {
            return Ok(Arc::clone(r));
        }
        self.make_room()?;
        let Located { leader, at } =
            locate
                .locate(true)?
                .ok_or_else(|| ReplicaHostError::NoLeader {
                    id,
                    reason: "its host did not open it".into(),
                })?;
        let mux = self.mux()?;
        let replicated = ReplicatedReplica::start(ReplicaConfig {
            database: id,
            path: self.path(id),
            leader,
            followers: self.config.followers.clone(),
            backend: self.config.backend,
            auth: self.config.auth.clone(),
            options: ReplicaOptions {
                readers: 2,
                region: self.config.region.clone(),
                max_wait_ms: self.config.max_wait_ms,
                ..ReplicaOptions::default()
            },
            delay_ms: 0,
            store: self.config.store.clone(),
            mux: Some(mux),
        })
        .map_err(|e| ReplicaHostError::Start {
            id,
            reason: e.to_string(),
        })?;
        // A new replica first catches up to where the database was when
        // it was asked (within the read wait): its first unconstrained
        // reads are then as fresh as that, not empty.
        if let Some(at) = at
            && !replicated
                .node()
                .wait_confirmed(at, Duration::from_millis(self.config.max_wait_ms))
        {
            tracing::info!(database = %id, %at, confirmed = %replicated.replica().confirmed(), "a new fleet replica serves before catching up to its primary");
        }
        let r = Arc::new(FleetReplica {
            id,
            replicated,
            last_used_ms: AtomicI64::new(now_ms()),
            resolved_ms: AtomicI64::new(now_ms()),
        });
        self.open.lock().insert(id, Arc::clone(&r));
        self.stats.opened.fetch_add(1, Ordering::Relaxed);
        tracing::info!(database = %id, %leader, region = %self.config.region, "fleet replica opened");
        Ok(r)
    }

    /// A replica without a leader connection asks (at most once an
    /// interval) where its primary is now, without opening it.
    fn follow_leader(
        &self,
        r: &FleetReplica,
        locate: &dyn LocateLeader,
    ) -> Result<(), ReplicaHostError> {
        let node = r.replicated.node();
        if node.leader_connected() {
            return Ok(());
        }
        let now = now_ms();
        let last = r.resolved_ms.load(Ordering::Relaxed);
        if now - last < RESOLVE_INTERVAL_MS
            || r.resolved_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return Ok(());
        }
        match locate.locate(false) {
            Ok(Some(Located { leader: addr, .. })) if addr != node.leader() => {
                self.stats.leader_moves.fetch_add(1, Ordering::Relaxed);
                node.set_leader(addr);
                Ok(())
            }
            Ok(_) => Ok(()),
            Err(e @ ReplicaHostError::Gone { .. }) => Err(e),
            Err(e) => {
                tracing::debug!(database = %r.id, error = %e, "could not learn where the primary is");
                Ok(())
            }
        }
    }

    /// Closes the least recently used idle replica while at the cap.
    fn make_room(&self) -> Result<(), ReplicaHostError> {
        loop {
            let victim = {
                let open = self.open.lock();
                if open.len() < self.max_open {
                    return Ok(());
                }
                open.values()
                    .filter(|r| Arc::strong_count(r) == 1)
                    .min_by_key(|r| r.last_used_ms.load(Ordering::Relaxed))
                    .map(|r| r.id)
            };
            let Some(id) = victim else {
                return Err(ReplicaHostError::Busy(self.max_open));
            };
            self.close(id, false);
            self.stats.evicted.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Closes replica `id` (its subscription stopped, its watermark made
    /// durable); `remove`: its files too.
    pub fn close(&self, id: DatabaseId, remove: bool) {
        let Some(r) = self.open.lock().remove(&id) else {
            if remove {
                self.remove_files(id);
            }
            return;
        };
        r.replicated.node().shutdown();
        if let Err(e) = r.replicated.replica().persist() {
            tracing::warn!(database = %id, error = %e, "could not persist a fleet replica's watermark");
        }
        drop(r);
        if remove {
            self.remove_files(id);
        }
        tracing::debug!(database = %id, remove, "fleet replica closed");
    }

    fn remove_files(&self, id: DatabaseId) {
        // Closed by now: its lock file goes with the rest.
        for p in walrelay_vfs::closed_replica_files(&self.path(id)) {
            match std::fs::remove_file(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(path = %p.display(), error = %e, "could not remove a fleet replica's file")
                }
            }
        }
        self.stats.removed.fetch_add(1, Ordering::Relaxed);
    }

    /// Closes every replica unused for `idle_close_ms`; those `exists`
    /// says are gone (deleted databases) lose their files too.
    pub fn close_idle(&self, exists: &dyn Fn(DatabaseId) -> bool) -> usize {
        let cutoff = now_ms() - self.config.idle_close_ms as i64;
        let idle: Vec<DatabaseId> = self
            .open
            .lock()
            .values()
            .filter(|r| {
                Arc::strong_count(r) == 1 && r.last_used_ms.load(Ordering::Relaxed) <= cutoff
            })
            .map(|r| r.id)
            .collect();
        for id in &idle {
            self.close(*id, !exists(*id));
            self.stats.closed_idle.fetch_add(1, Ordering::Relaxed);
        }
        idle.len()
    }

    /// Removes the files of closed replicas whose databases `exists` says
    /// are gone (run at start).
    pub fn sweep(&self, exists: &dyn Fn(DatabaseId) -> bool) -> Result<usize, ReplicaHostError> {
        let mut removed = 0;
        for entry in std::fs::read_dir(&self.config.dir)? {
            let name = entry?.file_name();
            let Some(id) = replica_id(Path::new(&name)) else {
                continue;
            };
            if !self.open.lock().contains_key(&id) && !exists(id) {
                self.remove_files(id);
                removed += 1;
            }
        }
        if removed > 0 {
            tracing::info!(removed, "removed the replicas of deleted fleet databases");
        }
        Ok(removed)
    }

    /// Closes every replica (the node stops).
    pub fn close_all(&self) {
        let ids: Vec<DatabaseId> = self.open.lock().keys().copied().collect();
        for id in ids {
            self.close(id, false);
        }
        if let Some(m) = self.mux.get() {
            m.shutdown();
        }
    }
}

/// The database id a replica's main file is named after.
fn replica_id(name: &Path) -> Option<DatabaseId> {
    let stem = name.to_str()?.strip_suffix(".db")?;
    (stem.len() == 16)
        .then(|| u64::from_str_radix(stem, 16).ok())
        .flatten()
        .map(DatabaseId)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replica_file_name_gives_back_its_database_id_and_nothing_else_does() {
        assert_eq!(
            replica_id(Path::new("00000000000003e8.db")),
            Some(DatabaseId(1000))
        );
        for other in [
            "00000000000003e8.db-wal",
            "00000000000003e8.db-shm",
            "3e8.db",
            "zzzzzzzzzzzzzzzz.db",
            "routes.db",
        ] {
            assert_eq!(replica_id(Path::new(other)), None, "{other}");
        }
    }
}
