//! Binds databases to the replicator's runtimes.
//!
//! - [`ReplicatedPrimary`]: a [`Database`] whose commits go to a
//!   [`LeaderNode`] and whose results wait behind the output gate until
//!   their bookmark is confirmed by W of N followers.
//! - [`ReplicatedReplica`]: a [`Replica`] fed by a [`ReplicaNode`].
//!
//! Records are built from captured page sets here: the replicator never
//! sees SQLite, the VFS never sees a socket.

use crate::database::{CommitGate, Database, GateError, Options, ShipError, TransactionSink};
use crate::error::OpenError;
use crate::replica::{Replica, ReplicaOptions};
use crate::stop_marker;
use parking_lot::Mutex;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use walrelay_replicator::leader::FanOut;
use walrelay_replicator::net::Backend;
use walrelay_replicator::net::mux::Mux;
use walrelay_replicator::node::leader::{
    ConfirmError, LeaderNode, LeaderNodeConfig, LeaderStatus, quiet_deadline,
};
use walrelay_replicator::node::replica::{Applier, ApplierError, ReplicaNode, ReplicaNodeConfig};
use walrelay_replicator::{
    Bookmark, ChainHash, ClusterKey, DatabaseId, Encoded, PageCompression, Record, Sequence, record,
};
use walrelay_vfs::{CapturedTransaction, PageNo, PageSet};

/// How to run a replicated primary.
#[derive(Debug, Clone)]
pub struct PrimaryConfig {
    pub database: DatabaseId,
    pub path: PathBuf,
    /// The N durability followers, in a fixed order.
    pub followers: Vec<SocketAddr>,
    /// W (a majority of N).
    pub write_quorum: usize,
    /// Where replicas connect.
    pub listen: Option<SocketAddr>,
    /// How long a result waits with no confirmation at all before failing
    /// (a wait lasts while the confirmed point keeps advancing towards it);
    /// also how long a write waits for room in the unconfirmed window.
    pub confirm_timeout_ms: u64,
    /// Committed-but-unconfirmed bytes past which new writes wait.
    pub max_unconfirmed_bytes: usize,
    /// Confirmed records kept in memory past the unconfirmed ones, for a
    /// follower or replica that falls behind (one behind them catches up
    /// from a follower's log instead). A bound on this primary's memory:
    /// a fleet node, with one primary per open database, keeps it small
    /// ([`crate::fleet::host::FLEET_TAIL_LIMIT_BYTES`]).
    pub tail_limit_bytes: usize,
    /// How long to wait for W followers to promise an epoch at start.
    pub election_timeout_ms: u64,
    /// Followers streamed every record as it commits (None: W, the
    /// thrifty fan-out, the others getting batches every
    /// `lazy_flush_interval_us`, see [`walrelay_replicator::leader::FanOut`];
    /// N: every record to every follower).
    /// W by default since its batches go out without the leader's lock
    /// (papers/performance.md, levers 73 and 74): fewer sends and fewer
    /// followers' wake-ups on a commit's path, which pays where the
    /// followers share the primary's CPUs, as in `walrelay up` (one
    /// session's p50 0.85x, 16 sessions 1.06x, 1.06x requests/s over
    /// HTTP). With N a commit waits for the W-th fastest of N rather than
    /// the slowest of W: better where the machine is oversubscribed (two
    /// clusters on two vCPUs: 0.87x the requests/s with W), and where the
    /// followers are hosts of their own, for which N costs the primary
    /// only two more sends and acks per record.
    pub eager_followers: Option<usize>,
    /// How often the other followers get their batch (and how long an eager
    /// follower may leave a record unacknowledged before one of them takes
    /// its place).
    pub lazy_flush_interval_us: u64,
    pub backend: Backend,
    /// The cluster key every replication connection (to the followers and
    /// from replicas) is authenticated with; None leaves them open.
    pub auth: Option<ClusterKey>,
    /// Cold storage: where a primary that must rebuild its database starts
    /// (the newest archived state), since followers keep only a bounded
    /// log. None: the followers' log alone.
    pub store: Option<walrelay_archive::Store>,
    pub options: Options,
    /// A multiplexer shared by every primary of this process (a fleet
    /// node's): one connection per follower for all of them. None: this
    /// primary's leader has a transport of its own.
    pub mux: Option<Mux>,
}

impl PrimaryConfig {
    /// How long a result waits for its confirmation unless configured.
    pub const DEFAULT_CONFIRM_TIMEOUT_MS: u64 = 5_000;

    /// Defaults for everything but what must be chosen: the followers and
    /// whether replication is authenticated (`auth`: None leaves the ports
    /// open to anyone who can reach them).
    pub fn new(
        path: impl Into<PathBuf>,
        followers: Vec<SocketAddr>,
        auth: Option<ClusterKey>,
    ) -> PrimaryConfig {
        PrimaryConfig {
            database: DatabaseId(1),
            auth,
            path: path.into(),
            write_quorum: followers.len() / 2 + 1,
            followers,
            listen: None,
            confirm_timeout_ms: PrimaryConfig::DEFAULT_CONFIRM_TIMEOUT_MS,
            max_unconfirmed_bytes: 64 << 20,
            tail_limit_bytes: 64 << 20,
            election_timeout_ms: 10_000,
            eager_followers: None,
            lazy_flush_interval_us: FanOut::DEFAULT_LAZY_FLUSH_INTERVAL_US,
            backend: Backend::Auto,
            store: None,
            mux: None,
            // The quorum log is the durability; the local WAL is a cache
            // of it, so its own fsync buys nothing.
            options: Options {
                synchronous: crate::Synchronous::Off,
                ..Options::default()
            },
        }
    }
}

/// The sink and gate between a primary database and its leader.
struct Link {
    leader: OnceLock<LeaderNode>,
    /// The last record shipped and its chain: what the next names.
    previous: Mutex<(Bookmark, ChainHash)>,
    confirm_timeout: Duration,
    max_unconfirmed_bytes: usize,
    /// The log position this leader started after (a stop with no commit
    /// in this epoch leaves it as the marker).
    start: Bookmark,
    /// Set by `stop`: no write is admitted any more.
    stopping: std::sync::atomic::AtomicBool,
}

impl TransactionSink for Link {
    fn positions(&self, txn: &CapturedTransaction) -> u64 {
        record::chunk_count(txn.pages.page_size(), txn.pages.len()) as u64
    }

    /// Ships the transaction as its chunks, `bookmark` being the last one's
    /// (the issuer reserved one position per chunk). A transaction larger
    /// than the unconfirmed-bytes window waits, chunk by chunk, for earlier
    /// chunks to be confirmed, so no queue holds more than the window.
    fn committed(&self, bookmark: Bookmark, txn: &CapturedTransaction) -> Result<(), ShipError> {
        let leader = self.leader.get().ok_or(ShipError::NotStarted)?;
        let mut previous = self.previous.lock();
        let pages = txn.pages.pages();
        let per_chunk = record::pages_per_chunk(txn.pages.page_size());
        // One record even for a transaction with no pages left to ship.
        let parts: Vec<&[(PageNo, bytes::Bytes)]> = if pages.is_empty() {
            vec![pages]
        } else {
            pages.chunks(per_chunk).collect()
        };
        assert_eq!(
            parts.len() as u64,
            self.positions(txn),
            "one position per chunk"
        );
        let first_seq = bookmark
            .sequence
            .0
            .checked_sub(parts.len() as u64 - 1)
            .filter(|s| *s > 0)
            .ok_or(ShipError::Positions {
                reserved: bookmark.sequence.0,
                chunks: parts.len() as u64,
            })?;
        let window = (self.max_unconfirmed_bytes as u64 / record::CHUNK_PAGE_BYTES).max(2) as usize;
        // One time for every chunk of the transaction.
        let commit_us = walrelay_replicator::node::leader::wall_clock_us();
        let mut in_flight = std::collections::VecDeque::new();
        for (i, part) in parts.iter().enumerate() {
            let at = Bookmark::new(bookmark.epoch, Sequence(first_seq + i as u64));
            if in_flight.len() >= window {
                let oldest = in_flight.pop_front().expect("window is at least 2");
                leader
                    .wait_confirmed(oldest, self.confirm_timeout)
                    .map_err(|e| ShipError::Chunk(e.into()))?;
            }
            let continued = i + 1 < parts.len();
            let record = encode_chunk(at, *previous, &txn.pages, part, continued, commit_us)?;
            let chain = record.chain;
            leader.commit(record)?;
            *previous = (at, chain);
            in_flight.push_back(at);
        }
        assert_eq!(
            previous.0, bookmark,
            "a transaction's last chunk carries its bookmark"
        );
        Ok(())
    }
}

/// A captured page set as one log record (the pages' bytes are shared),
/// chained onto `previous` (a bookmark and its chain).
pub fn encode(
    bookmark: Bookmark,
    previous: (Bookmark, ChainHash),
    pages: &PageSet,
) -> Result<Encoded, walrelay_replicator::RecordError> {
    let now_us = walrelay_replicator::node::leader::wall_clock_us();
    encode_chunk(bookmark, previous, pages, pages.pages(), false, now_us)
}

/// `part` of a captured page set as one record; `continued` when a later
/// chunk of the same transaction follows; `commit_us` the transaction's
/// commit time (the same for all its chunks).
fn encode_chunk(
    bookmark: Bookmark,
    (previous, prev_chain): (Bookmark, ChainHash),
    pages: &PageSet,
    part: &[(PageNo, bytes::Bytes)],
    continued: bool,
    commit_us: u64,
) -> Result<Encoded, walrelay_replicator::RecordError> {
    Record {
        bookmark,
        previous,
        prev_chain,
        commit_us,
        page_size: pages.page_size(),
        db_pages: pages.db_size_pages(),
        pages: part
            .iter()
            .map(|(no, image)| (no.get(), image.clone()))
            .collect(),
    }
    .to_encoded_with(continued, PageCompression::Zstd)
}

/// Why a log record is not a page set.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error(transparent)]
    Record(#[from] walrelay_replicator::RecordError),
    #[error(transparent)]
    Pages(#[from] walrelay_vfs::PageSetError),
}

/// A log record as a page set for a replica.
pub fn decode(record: &Encoded) -> Result<PageSet, DecodeError> {
    let r = record.record()?;
    let pages = r
        .pages
        .into_iter()
        .map(|(no, image)| (PageNo::new(no), image))
        .collect();
    Ok(PageSet::new(r.page_size, r.db_pages, pages)?)
}

impl CommitGate for Link {
    fn admit_write(&self) -> Result<(), GateError> {
        if let Some(now) = self.try_admit_write() {
            return now;
        }
        let Some(leader) = self.leader.get() else {
            return Err(GateError::NotStarted);
        };
        let started = Instant::now();
        loop {
            let status = leader.status();
            if status.unconfirmed_bytes <= self.max_unconfirmed_bytes {
                return Ok(());
            }
            // As a result's wait: room that keeps freeing is worth waiting
            // for; a window that stands still for the timeout is not.
            let deadline = quiet_deadline(
                started,
                leader.confirmed_advanced_at(),
                self.confirm_timeout,
            );
            if Instant::now() >= deadline {
                return Err(GateError::Backlog {
                    unconfirmed_bytes: status.unconfirmed_bytes,
                    limit_bytes: self.max_unconfirmed_bytes,
                    streaming: status.streaming_followers,
                });
            }
            // Room frees as confirms arrive; a fenced leader never frees
            // any, so say so at once.
            if let Err(e @ ConfirmError::Fenced(_)) =
                leader.wait_confirmed(status.last, Duration::from_millis(10))
            {
                return Err(e.into());
            }
        }
    }

    fn wait_confirmed(&self, bookmark: Bookmark) -> Result<(), GateError> {
        if bookmark.sequence.0 == 0 {
            // Nothing committed in this epoch yet: the state is the
            // previous epoch's, confirmed before this leader started.
            return Ok(());
        }
        let Some(leader) = self.leader.get() else {
            return Err(GateError::NotStarted);
        };
        leader
            .wait_confirmed(bookmark, self.confirm_timeout)
            .map_err(|e| {
                tracing::warn!(%bookmark, error = %e, "a write's result was refused at the output gate");
                GateError::from(e)
            })
    }

    fn on_confirmed(&self, bookmark: Bookmark, wake: Box<dyn FnOnce() + Send>) {
        match self.leader.get() {
            Some(leader) if bookmark.sequence.0 > 0 => leader.on_confirmed(bookmark, wake),
            _ => wake(),
        }
    }

    fn try_admit_write(&self) -> Option<Result<(), GateError>> {
        let Some(leader) = self.leader.get() else {
            return Some(Err(GateError::NotStarted));
        };
        if self.stopping.load(std::sync::atomic::Ordering::Acquire) {
            return Some(Err(GateError::Stopping));
        }
        (leader.unconfirmed_bytes() <= self.max_unconfirmed_bytes).then_some(Ok(()))
    }

    fn poll_confirmed(&self, bookmark: Bookmark) -> Option<Result<(), GateError>> {
        if bookmark.sequence.0 == 0 {
            // As in `wait_confirmed`: the previous epoch's state.
            return Some(Ok(()));
        }
        let Some(leader) = self.leader.get() else {
            return Some(Err(GateError::NotStarted));
        };
        Some(leader.poll_confirmed(bookmark)?.map_err(GateError::from))
    }
}

/// Why a replicated primary could not start or stop.
#[derive(Debug, thiserror::Error)]
pub enum PrimaryError {
    #[error(transparent)]
    Open(#[from] OpenError),
    #[error(
        "{path} exists but was not stopped cleanly: its WAL may hold commits the quorum never confirmed, and recovering it from the followers' log needs failover (not built yet). Do not start a fresh primary against the same followers: they would count its new records as ones they already hold"
    )]
    NotCleanlyStopped { path: String },
    #[error(
        "capture failed ({0}): the local database holds a transaction the followers may not, so no clean-stop marker is written"
    )]
    Poisoned(#[source] walrelay_vfs::CaptureError),
    #[error(transparent)]
    Marker(#[from] stop_marker::StopMarkerError),
    #[error(transparent)]
    Recovery(#[from] crate::recovery::RecoveryError),
    #[error("replication: {0}")]
    Node(#[from] walrelay_replicator::node::NodeError),
    #[error("bootstrapping from cold storage: {0}")]
    Bootstrap(#[from] walrelay_archive::RestoreError),
    #[error("replication: {0}")]
    Replication(String),
    #[error("stop: {0}")]
    Stop(String),
}

/// A primary database replicating to W of N followers and to replicas.
pub struct ReplicatedPrimary {
    db: Database,
    leader: LeaderNode,
    link: Arc<Link>,
    path: PathBuf,
    /// The database's files are this process's from before the election
    /// (a second process on them would otherwise fence the first).
    _owner: walrelay_vfs::owner_lock::OwnerLock,
}

impl std::fmt::Debug for ReplicatedPrimary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicatedPrimary")
            .field("path", &self.path)
            .field("leader", &self.leader)
            .finish()
    }
}

impl ReplicatedPrimary {
    /// Wins an epoch from W followers, brings the database to the end of
    /// the log they hold ([`crate::recovery`]: after a clean stop it
    /// usually is there already; after a crash it is rebuilt), starts
    /// replicating, and returns once the epoch's first record is
    /// confirmed.
    pub fn start(config: PrimaryConfig) -> Result<ReplicatedPrimary, PrimaryError> {
        // Before the election: a primary already running on these files
        // must not be fenced by one that cannot open them.
        let owner = walrelay_vfs::owner_lock::OwnerLock::acquire(&config.path)
            .map_err(|e| crate::database::attach_error(&config.path, e.into()))?;
        let adopted = crate::recovery::adopt(&config)?;
        let link = Arc::new(Link {
            leader: OnceLock::new(),
            previous: Mutex::new((adopted.end, adopted.end_chain)),
            confirm_timeout: Duration::from_millis(config.confirm_timeout_ms),
            max_unconfirmed_bytes: config.max_unconfirmed_bytes,
            start: adopted.end,
            stopping: std::sync::atomic::AtomicBool::new(false),
        });
        let mut options = config.options.clone();
        options.sink = Some(Arc::clone(&link) as Arc<dyn TransactionSink>);
        options.gate = Some(Arc::clone(&link) as Arc<dyn CommitGate>);
        options.epoch = Some(adopted.epoch);
        let db = Database::open(&config.path, options)?;
        let leader = LeaderNode::start(LeaderNodeConfig {
            database: config.database,
            epoch: adopted.epoch,
            node: adopted.node,
            start: adopted.start,
            start_chain: adopted.start_chain,
            adopted: adopted.tail,
            history: adopted.history,
            followers: config.followers.clone(),
            write_quorum: config.write_quorum,
            listen: config.listen,
            tail_limit_bytes: config.tail_limit_bytes,
            heartbeat_interval_ms: 50,
            redial_interval_ms: 100,
            fan_out: FanOut {
                eager: config.eager_followers.unwrap_or(config.write_quorum),
                lazy_flush_interval_us: config.lazy_flush_interval_us,
                ..FanOut::thrifty(config.write_quorum)
            },
            backend: config.backend,
            auth: config.auth.clone(),
            mux: config.mux.clone(),
        })?;
        let _ = link.leader.set(leader.clone());
        // Consumed: from here a crash must not find it.
        stop_marker::remove(&config.path)?;
        let first = crate::recovery::commit_barrier(
            &db,
            &leader,
            Duration::from_millis(config.election_timeout_ms.max(config.confirm_timeout_ms)),
        )?;
        tracing::info!(
            epoch = adopted.epoch.0,
            after = %adopted.end,
            first = %first,
            rebuilt = adopted.rebuilt,
            applied = adopted.applied,
            "primary started: its epoch continues the log"
        );
        Ok(ReplicatedPrimary {
            db,
            leader,
            link,
            path: config.path,
            _owner: owner,
        })
    }

    pub fn database(&self) -> &Database {
        &self.db
    }
    pub fn leader(&self) -> &LeaderNode {
        &self.leader
    }
    pub fn status(&self) -> LeaderStatus {
        self.leader.status()
    }
    /// Where replicas connect.
    pub fn replica_addr(&self) -> Option<SocketAddr> {
        self.leader.replica_addr()
    }

    /// Stops cleanly: waits until every commit is confirmed, then writes
    /// the stop marker so the next start can continue the log. Writes
    /// arriving meanwhile are the caller's to prevent.
    pub fn stop(self, timeout: Duration) -> Result<Bookmark, PrimaryError> {
        // No write starts from here; one already admitted may still commit,
        // so wait until the newest bookmark stops moving and is confirmed.
        self.link
            .stopping
            .store(true, std::sync::atomic::Ordering::Release);
        let deadline = Instant::now() + timeout;
        loop {
            // A failed capture left a transaction in the local WAL that the
            // log may not hold: a marker would let the next start continue
            // the log on a diverged database.
            if let Some(e) = self.db.capture_failure() {
                tracing::error!(%e, "primary stops without a clean-stop marker");
                return Err(PrimaryError::Poisoned(e));
            }
            let last = self.db.latest_bookmark();
            let left = deadline.saturating_duration_since(Instant::now());
            if last.sequence.0 > 0 {
                self.leader
                    .wait_confirmed(last, left)
                    .map_err(|e| PrimaryError::Stop(e.to_string()))?;
            }
            // Every commit holds the writer lock; taking it means none is
            // in flight, so `last` is final if it has not moved.
            let settled = self.db.quiesce(|| {
                self.db.latest_bookmark() == last && self.db.capture_failure().is_none()
            });
            if settled {
                // synchronous=OFF wrote the WAL without fsync: make the
                // local files hold what the marker claims before writing it.
                self.db
                    .sync_files()
                    .map_err(|e| PrimaryError::Stop(format!("syncing the database files: {e}")))?;
                let mark = if last.sequence.0 == 0 {
                    self.link.start
                } else {
                    last
                };
                stop_marker::store(&self.path, mark)?;
                self.leader.shutdown();
                tracing::info!(at = %mark, "primary stopped cleanly");
                return Ok(mark);
            }
            if Instant::now() >= deadline {
                return Err(PrimaryError::Stop("writes kept committing".into()));
            }
        }
    }
}

/// The replica's refusals, sorted for the subscriber: a record out of
/// order is the stream's fault, anything else the replica's storage.
fn applier_error(e: walrelay_vfs::ApplyError) -> ApplierError {
    match e {
        e @ (walrelay_vfs::ApplyError::Gap { .. }
        | walrelay_vfs::ApplyError::NotAppended { .. }) => ApplierError::OutOfOrder(Box::new(e)),
        e
        @ (walrelay_vfs::ApplyError::PageSize { .. } | walrelay_vfs::ApplyError::EmptyPageSet) => {
            ApplierError::Record(Box::new(e))
        }
        e => ApplierError::Storage(Box::new(e)),
    }
}

impl Applier for Replica {
    fn apply(&self, record: &Encoded) -> Result<(), ApplierError> {
        let pages = decode(record).map_err(|e| ApplierError::Record(Box::new(e)))?;
        self.append_chunk(record.bookmark, &pages, !record.continued())
            .map(|_| ())
            .map_err(applier_error)
    }
    fn confirm(&self, bookmark: Bookmark) -> Result<(), ApplierError> {
        self.publish(bookmark).map_err(applier_error)
    }
    fn housekeeping(&self) -> Result<(), ApplierError> {
        Replica::housekeeping(self).map_err(applier_error)
    }
    fn discard_unconfirmed(&self) -> Result<(), ApplierError> {
        Replica::discard_unconfirmed(self).map_err(applier_error)
    }
    fn confirmed(&self) -> Bookmark {
        Replica::confirmed(self)
    }
}

/// How to run a replica fed over the network.
#[derive(Debug, Clone)]
pub struct ReplicaConfig {
    pub database: DatabaseId,
    pub path: PathBuf,
    pub leader: SocketAddr,
    pub followers: Vec<SocketAddr>,
    pub backend: Backend,
    /// The cluster key (None: unauthenticated replication).
    pub auth: Option<ClusterKey>,
    pub options: ReplicaOptions,
    /// Injected replication delay (ms), for consistency tests. 0: none.
    pub delay_ms: u64,
    /// Cold storage: a replica with no database yet starts from its
    /// newest archived state instead of the beginning of the log.
    pub store: Option<walrelay_archive::Store>,
    /// A shared multiplexer to subscribe over (a node keeping many
    /// replicas); None: connections of its own.
    pub mux: Option<walrelay_replicator::net::mux::Mux>,
}

/// A read replica streaming from a primary.
pub struct ReplicatedReplica {
    replica: Replica,
    node: ReplicaNode,
}

impl std::fmt::Debug for ReplicatedReplica {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicatedReplica")
            .field("node", &self.node)
            .finish()
    }
}

impl ReplicatedReplica {
    pub fn start(mut config: ReplicaConfig) -> Result<ReplicatedReplica, PrimaryError> {
        if let Some(store) = &config.store
            && let Some(r) = bootstrap(store, config.database, &config.path)?
        {
            config.options.initial_bookmark = r.bookmark;
            config.options.page_size = r.page_size;
        }
        let replica = Replica::open(&config.path, config.options.clone())?;
        let node = ReplicaNode::start(
            ReplicaNodeConfig {
                database: config.database,
                leader: config.leader,
                followers: config.followers,
                start: replica.confirmed(),
                redial_interval_ms: 100,
                backend: config.backend,
                auth: config.auth,
                delay_ms: config.delay_ms,
                mux: config.mux,
            },
            Arc::new(replica.clone()) as Arc<dyn Applier>,
        )?;
        Ok(ReplicatedReplica { replica, node })
    }

    pub fn replica(&self) -> &Replica {
        &self.replica
    }
    pub fn node(&self) -> &ReplicaNode {
        &self.node
    }
}

/// Builds a replica's database from cold storage when it has none yet
/// (no file, or an empty one): the newest archived state, so the replica
/// catches up from there instead of from the beginning of the log. Returns
/// what was restored, or None (a database exists, or the store holds no
/// history yet).
pub fn bootstrap(
    store: &walrelay_archive::Store,
    database: DatabaseId,
    path: &Path,
) -> Result<Option<walrelay_archive::Restored>, walrelay_archive::RestoreError> {
    let fresh = std::fs::metadata(path).map_or(true, |m| m.len() == 0);
    // A replica whose database is gone but whose WAL or watermark is not
    // is refused by the replica's open, not papered over here.
    let rest_exists = walrelay_vfs::replica_files(path)
        .iter()
        .skip(1)
        .any(|p| p.exists());
    if !fresh || rest_exists {
        return Ok(None);
    }
    let archive = walrelay_archive::Archive::new(store.clone(), database);
    let m = match archive.manifest() {
        Ok(m) if m.log_end > Bookmark::ZERO => m,
        Ok(_) | Err(walrelay_archive::RestoreError::NoManifest) => return Ok(None),
        Err(e) => return Err(e),
    };
    let started = std::time::Instant::now();
    let r = walrelay_archive::restore_to_file(
        &archive,
        &m,
        m.log_end,
        path,
        &walrelay_archive::NoProgress,
    )?;
    tracing::info!(
        path = %path.display(),
        at = %r.bookmark,
        pages = r.db_pages,
        ms = started.elapsed().as_millis() as u64,
        "replica bootstrapped from cold storage"
    );
    Ok(Some(r))
}

/// The database file inside a node's data directory.
pub fn database_path(dir: &Path) -> PathBuf {
    dir.join("db.sqlite")
}

#[cfg(test)]
mod record_tests {
    use super::*;

    fn page_set(image: &[u8]) -> PageSet {
        let pages = (1..=3)
            .map(|no| (PageNo::new(no), bytes::Bytes::copy_from_slice(image)))
            .collect();
        PageSet::new(4096, 3, pages).expect("page set")
    }

    #[test]
    fn the_primary_ships_compressible_pages_compressed_and_a_replica_reads_them_back() {
        let mut image = vec![0u8; 4096];
        image[3000..].fill(0x5a);
        let pages = page_set(&image);
        let previous = (Bookmark::ZERO, ChainHash::GENESIS);
        let at = Bookmark::first_of(walrelay_replicator::Epoch(1));
        let e = encode(at, previous, &pages).expect("encode");
        let flags = u16::from_be_bytes([e.bytes[6], e.bytes[7]]);
        assert_ne!(flags & record::FLAG_COMPRESSED, 0, "compressed");
        assert!(e.bytes.len() < 4096, "{} bytes for 3 pages", e.bytes.len());
        assert_eq!(decode(&e).expect("decode"), pages);
    }
}
