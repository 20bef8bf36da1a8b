//! A durability follower process's runtime: the [`Follower`] core over a
//! [`SegmentLog`] and a transport.
//!
//! Group commit falls out of the transport contract: every message of one
//! read is appended (staged) first, then `drained` issues one sync for all
//! of them and the ack goes out. While that sync runs, new records wait in
//! the socket and form the next group.
//!
//! Retention: an archiver in the same process uploads confirmed records to
//! cold storage and then releases the log's prefix, through
//! [`FollowerNode::confirmed`], [`FollowerNode::read_confirmed`],
//! [`FollowerNode::release_point`] and [`FollowerNode::release_through`],
//! from its own thread while the node runs. Reads lock the node only to
//! locate the records (a copy of their index entries) and read the files
//! after the lock is released. That is sound because the records located
//! are confirmed, and a segment holding confirmed records is deleted only
//! by `release_through`, which the archiver itself calls (the contract: it
//! does not release what it is still reading), or by a reset to a peer's
//! later start, after which segment numbers are never reused: a read then
//! fails or returns the old records, never other bytes (and every record
//! read is checked against the bookmark it was located at).

use super::NodeError;
use crate::bookmark::{Bookmark, Epoch};
use crate::chain::ChainHash;
use crate::epoch_file;
use crate::follower::{Follower, FollowerAction, FollowerEvent, LogEnd};
use crate::ids::DatabaseId;
use crate::leader::PeerId;
use crate::net::{Backend, ClusterKey, ConnId, NetHandler, Transport};
use crate::segments::{Recovery, Released, SegmentError, SegmentLog};
use crate::wire::Message;
use bytes::Bytes;
use parking_lot::Mutex;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

/// How to run a follower.
#[derive(Debug, Clone)]
pub struct FollowerNodeConfig {
    pub database: DatabaseId,
    pub listen: SocketAddr,
    pub dir: PathBuf,
    /// The other followers, to catch up from when the leader is past us.
    pub peers: Vec<SocketAddr>,
    pub segment_bytes: u64,
    pub backend: Backend,
    /// The cluster key every replication connection is authenticated
    /// with; None runs this node's connections unauthenticated (anyone who
    /// can reach its ports can read and write the log).
    pub auth: Option<ClusterKey>,
    /// Bytes of records served per catch-up request
    /// ([`CATCH_UP_BATCH_BYTES`] by default).
    pub catch_up_batch_bytes: usize,
}

/// Bytes of records served per catch-up request, by default.
pub const CATCH_UP_BATCH_BYTES: usize = 4 << 20;

/// Why [`FollowerNode::release_through`] released nothing.
#[derive(Debug, thiserror::Error)]
pub enum ReleaseError {
    /// Only confirmed records, durable here, may be released.
    #[error("cannot release through {upto}: only {confirmed} is confirmed and durable here")]
    NotConfirmed { upto: Bookmark, confirmed: Bookmark },
    /// The follower stopped after a storage failure.
    #[error("the follower is broken: {0}")]
    Broken(String),
    #[error(transparent)]
    Log(#[from] SegmentError),
}

struct Core {
    follower: Follower,
    log: SegmentLog,
    sync_requested: bool,
    next_peer: usize,
    /// A storage failure stops the follower taking records: acking after
    /// one could claim durability it does not have.
    broken: Option<String>,
    /// A catch-up source to dial after the lock is released.
    dial: Option<SocketAddr>,
    /// When the catch-up source last spoke (or was dialed): a silent one is
    /// dropped by the watchdog.
    catch_up_seen: Option<std::time::Instant>,
}

struct State {
    config: FollowerNodeConfig,
    core: Mutex<Core>,
    transport: OnceLock<Arc<dyn Transport>>,
}

/// A running follower. Dropping it does not stop its threads; the process
/// owns them.
pub struct FollowerNode {
    state: Arc<State>,
    addr: SocketAddr,
    recovery: Recovery,
}

impl std::fmt::Debug for FollowerNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FollowerNode")
            .field("addr", &self.addr)
            .finish()
    }
}

impl FollowerNode {
    /// Recovers the log (cutting a torn or corrupt tail), then listens.
    pub fn start(config: FollowerNodeConfig) -> Result<FollowerNode, NodeError> {
        std::fs::create_dir_all(&config.dir)
            .map_err(NodeError::io(format!("creating {}", config.dir.display())))?;
        let promise = epoch_file::load(&config.dir)?;
        let (log, recovery) = SegmentLog::open(
            &config.dir.join("log"),
            config.segment_bytes,
            Bookmark::ZERO,
        )?;
        let end = LogEnd {
            last: log.last(),
            chain: log.last_chain().unwrap_or(ChainHash::GENESIS),
        };
        let start = LogEnd {
            last: log.start(),
            chain: log.chain_at(log.start()).unwrap_or(ChainHash::GENESIS),
        };
        let history = log.history();
        let state = Arc::new(State {
            core: Mutex::new(Core {
                follower: Follower::new(config.database, promise, end, history).with_start(start),
                log,
                sync_requested: false,
                next_peer: 0,
                broken: None,
                dial: None,
                catch_up_seen: None,
            }),
            transport: OnceLock::new(),
            config,
        });
        let transport = super::open_transport(
            state.config.backend,
            Arc::clone(&state) as Arc<dyn NetHandler>,
            state.config.auth.clone(),
            &state.transport,
        )?;
        let addr = transport
            .listen(state.config.listen)
            .map_err(NodeError::io(format!(
                "listening on {}",
                state.config.listen
            )))?;
        let weak = Arc::downgrade(&state);
        std::thread::Builder::new()
            .name("walrelay-follower-watch".into())
            .spawn(move || watch_catch_up(weak))
            .map_err(NodeError::io("starting the catch-up watchdog"))?;
        Ok(FollowerNode {
            state,
            addr,
            recovery,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
    pub fn recovery(&self) -> Recovery {
        self.recovery
    }
    pub fn durable(&self) -> Bookmark {
        self.state.core.lock().follower.durable()
    }
    /// The transport: "std" or "io_uring".
    pub fn backend(&self) -> &'static str {
        self.state.transport().backend()
    }

    /// Replication connections (or frames) refused by authentication.
    pub fn auth_refusals(&self) -> u64 {
        self.state.transport().auth_refusals()
    }
    /// Why the follower stopped taking records (a storage failure), if it
    /// did. It then refuses everything: a process supervisor should
    /// restart it, which cuts the log back to what was durable.
    pub fn broken(&self) -> Option<String> {
        self.state.core.lock().broken.clone()
    }

    /// How the log reaches the disk: "std" or "io_uring".
    pub fn storage_backend(&self) -> &'static str {
        self.state.core.lock().log.io_backend()
    }

    /// Whether the log appends with direct writes (`SegmentLog::direct_io`).
    pub fn direct_io(&self) -> bool {
        self.state.core.lock().log.direct_io()
    }

    /// Segments this process's log took from its pool of released ones
    /// (`SegmentLog::segments_recycled`): none until a prefix was released.
    pub fn segments_recycled(&self) -> u64 {
        self.state.core.lock().log.segments_recycled()
    }

    // ---- for the archiver (see the module doc) ----

    /// The newest bookmark this follower knows confirmed and holds
    /// durably: what may be uploaded to cold storage (and then released).
    pub fn confirmed(&self) -> Bookmark {
        self.state.core.lock().follower.confirmed()
    }

    /// The epoch this follower has promised (for naming uploads).
    pub fn epoch(&self) -> Epoch {
        self.state.core.lock().follower.epoch()
    }

    /// The encoded records after `after`, up to the confirmed position,
    /// about `max_bytes` of them (at least one if there is one), read
    /// without holding the node's lock. [`SegmentError::Released`] if
    /// `after` is before the log's start.
    pub fn read_confirmed(
        &self,
        after: Bookmark,
        max_bytes: usize,
    ) -> Result<Vec<Bytes>, SegmentError> {
        let plan = {
            let core = self.state.core.lock();
            let upto = core.follower.confirmed();
            core.log.plan_batch(after, upto, max_bytes)?
        };
        // What was located under the lock must be what is read (see the
        // module doc): every record whole and the one located there.
        let records = plan.read_checked()?;
        Ok(records)
    }

    /// Bytes of the records after `after` up to `upto`, at most to the
    /// confirmed position, from the log's index (no I/O).
    /// [`SegmentError::Released`] if `after` is before the log's start.
    pub fn confirmed_bytes_between(
        &self,
        after: Bookmark,
        upto: Bookmark,
    ) -> Result<u64, SegmentError> {
        let core = self.state.core.lock();
        let upto = upto.min(core.follower.confirmed());
        core.log.bytes_between(after, upto)
    }

    /// Where the log starts (the last released record; ZERO if nothing
    /// was ever released).
    pub fn log_start(&self) -> Bookmark {
        self.state.core.lock().log.start()
    }

    /// Bytes of the log's segment files on disk.
    pub fn disk_bytes(&self) -> u64 {
        self.state.core.lock().log.disk_bytes()
    }

    /// A bookmark to release through that keeps at least `keep_bytes` of
    /// the newest records here (see [`SegmentLog::release_point`]), never
    /// past the confirmed position.
    pub fn release_point(&self, keep_bytes: u64) -> Bookmark {
        let core = self.state.core.lock();
        let start = core.log.start();
        core.log
            .release_point(keep_bytes)
            .min(core.follower.confirmed())
            .max(start)
    }

    /// Releases the log's whole segments up to `upto` (see
    /// [`SegmentLog::release_through`]): the caller has made them durable
    /// in cold storage. Refused for anything past the confirmed position.
    /// Holds the node's lock for the marker's fsyncs (appends wait that
    /// long; releases are rare) but not for the unlinks (see
    /// [`crate::unlink`]).
    pub fn release_through(&self, upto: Bookmark) -> Result<Released, ReleaseError> {
        let mut core = self.state.core.lock();
        if let Some(why) = &core.broken {
            return Err(ReleaseError::Broken(why.clone()));
        }
        let confirmed = core.follower.confirmed();
        if upto > confirmed {
            return Err(ReleaseError::NotConfirmed { upto, confirmed });
        }
        let (released, unlink) = core.log.release_deferred(upto)?;
        if released.segments > 0 {
            let chain = core
                .log
                .chain_at(released.start)
                .unwrap_or(ChainHash::GENESIS);
            let actions = core.follower.handle(FollowerEvent::Released {
                start: released.start,
                chain,
            });
            self.state.run(&mut core, actions);
        }
        drop(core);
        unlink.run_logged();
        Ok(released)
    }
}

fn watch_catch_up(state: std::sync::Weak<State>) {
    loop {
        std::thread::sleep(std::time::Duration::from_millis(500));
        let Some(s) = state.upgrade() else { return };
        let stale = {
            let mut core = s.core.lock();
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
            s.transport().close(peer.0);
        }
    }
}

impl State {
    fn transport(&self) -> &Arc<dyn Transport> {
        self.transport
            .get()
            .expect("transport set before any connection")
    }

    /// Carries out the core's actions.
    fn run(&self, core: &mut Core, actions: Vec<FollowerAction>) {
        for action in actions {
            match action {
                FollowerAction::PersistPromise(p) => {
                    tracing::info!(
                        epoch = p.epoch.0,
                        leader = %p.leader,
                        "follower promises a new epoch to a leader"
                    );
                    if let Err(err) = epoch_file::store(&self.config.dir, p) {
                        tracing::error!(epoch = p.epoch.0, %err, "follower could not persist its promise");
                        core.broken = Some(err.to_string());
                        return;
                    }
                }
                FollowerAction::Truncate { after } => match core.log.truncate_after(after) {
                    Ok(cut) => {
                        tracing::warn!(after = %after, cut_bytes = cut, "follower cut a diverged suffix");
                        let end = LogEnd {
                            last: core.log.last(),
                            chain: core.log.last_chain().unwrap_or(ChainHash::GENESIS),
                        };
                        let more = core.follower.handle(FollowerEvent::Truncated {
                            last: end.last,
                            chain: end.chain,
                        });
                        self.run(core, more);
                    }
                    Err(err) => {
                        tracing::error!(%err, "follower could not cut its log");
                        core.broken = Some(err.to_string());
                        return;
                    }
                },
                FollowerAction::ResetToArchived {
                    start,
                    chain,
                    history,
                } => {
                    // Safe (see the follower core's "Retention"): `start`
                    // is a confirmed record a peer released, so everything
                    // up to it is committed history, held by the peers and
                    // cold storage; this log ends before it, so it drops
                    // only that history's prefix or an unconfirmed tail
                    // that left it, and its end only moves forward.
                    let from = core.log.last();
                    match core.log.reset_to(start, chain, history) {
                        Ok(bytes) => {
                            tracing::info!(
                                from = %from,
                                start = %start,
                                removed_bytes = bytes,
                                "follower starts its log over at a peer's archived start; the records before it are in cold storage"
                            );
                            let more = core.follower.handle(FollowerEvent::Reset {
                                start: core.log.start(),
                                chain: core.log.last_chain().unwrap_or(chain),
                                history: core.log.history(),
                            });
                            self.run(core, more);
                        }
                        Err(err) => {
                            tracing::error!(%err, "follower could not start its log over");
                            core.broken = Some(err.to_string());
                            return;
                        }
                    }
                }
                FollowerAction::Append(record) => {
                    if let Err(err) = core.log.append_encoded(&record) {
                        core.broken = Some(err.to_string());
                        return;
                    }
                }
                FollowerAction::Sync { .. } => core.sync_requested = true,
                FollowerAction::ServeCatchUp { peer, after, upto } => {
                    // One bounded batch per request: the peer asks again
                    // from where it ended, so a long catch-up never queues
                    // more than a batch.
                    match core
                        .log
                        .read_batch(after, upto, self.config.catch_up_batch_bytes)
                    {
                        Ok(records) => {
                            let mut last = after;
                            for bytes in records {
                                match crate::record::Encoded::decode(&bytes) {
                                    Ok((e, _)) => {
                                        last = e.bookmark;
                                        self.transport().send(peer.0, &Message::Append(e));
                                    }
                                    Err(_) => break,
                                }
                            }
                            self.transport()
                                .send(peer.0, &Message::CatchUpDone { upto: last });
                        }
                        Err(_) => self.transport().close(peer.0),
                    }
                }
                FollowerAction::Send { peer, message } => self.transport().send(peer.0, &message),
                FollowerAction::Close { peer } => self.transport().close(peer.0),
                FollowerAction::DialCatchUp => {
                    if self.config.peers.is_empty() {
                        let more = core.follower.handle(FollowerEvent::CatchUpFailed);
                        self.run(core, more);
                    } else {
                        let peer = self.config.peers[core.next_peer % self.config.peers.len()];
                        core.next_peer += 1;
                        core.catch_up_seen = Some(std::time::Instant::now());
                        // Dialed once the lock is released: a failed dial
                        // may be reported on this thread.
                        core.dial = Some(peer);
                    }
                }
            }
        }
    }

    /// Feeds one event to the core and carries out what follows, dialing
    /// (if asked) only after the lock is released.
    fn event(&self, event: FollowerEvent) {
        let mut core = self.core.lock();
        let actions = core.follower.handle(event);
        self.run(&mut core, actions);
        let dial = core.dial.take();
        drop(core);
        if let Some(peer) = dial {
            self.transport().connect(peer, 0);
        }
    }

    fn sync(&self, core: &mut Core) {
        while core.sync_requested && core.broken.is_none() {
            core.sync_requested = false;
            match core.log.sync() {
                Ok(upto) => {
                    let actions = core.follower.handle(FollowerEvent::Synced { upto });
                    self.run(core, actions);
                }
                Err(e) => core.broken = Some(e.to_string()),
            }
        }
    }
}

impl NetHandler for State {
    fn accepted(&self, _conn: ConnId, _from: SocketAddr) {}

    fn connected(&self, conn: ConnId, _tag: u64) {
        self.core.lock().catch_up_seen = Some(std::time::Instant::now());
        self.event(FollowerEvent::CatchUpConnected { peer: PeerId(conn) });
    }

    fn connect_failed(&self, _tag: u64, _error: io::Error) {
        // Another peer is tried the next time the leader sends us away.
        self.event(FollowerEvent::CatchUpFailed);
    }

    fn message(&self, conn: ConnId, message: Message) {
        {
            let mut core = self.core.lock();
            if core.broken.is_some() {
                self.transport().close(conn);
                return;
            }
            if core.follower.catch_up_source() == Some(PeerId(conn)) {
                core.catch_up_seen = Some(std::time::Instant::now());
            }
        }
        self.event(FollowerEvent::Received {
            peer: PeerId(conn),
            message,
        });
    }

    fn drained(&self, _conn: ConnId) {
        let mut core = self.core.lock();
        self.sync(&mut core);
    }

    fn closed(&self, conn: ConnId, _error: Option<String>) {
        self.event(FollowerEvent::Disconnected { peer: PeerId(conn) });
        // Make whatever a catch-up fetched durable before anyone relies on
        // it.
        let mut core = self.core.lock();
        self.sync(&mut core);
    }
}
