//! A durability follower process's runtime: the [`Follower`] core over a
//! [`SegmentLog`] and a transport.
//!
//! Group commit falls out of the transport contract: every message of one
//! read is appended (staged) first, then `drained` issues one sync for all
//! of them and the ack goes out. While that sync runs, new records wait in
//! the socket and form the next group.

use super::NodeError;
use crate::bookmark::Bookmark;
use crate::epoch_file;
use crate::follower::{Follower, FollowerAction, FollowerEvent};
use crate::ids::DatabaseId;
use crate::net::{Backend, ConnId, NetHandler, Transport};
use crate::segments::{Recovery, SegmentLog};
use crate::wire::{Message, Role};
use parking_lot::Mutex;
use std::collections::HashMap;
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
    /// Bytes of records served per catch-up request
    /// ([`CATCH_UP_BATCH_BYTES`] by default).
    pub catch_up_batch_bytes: usize,
}

/// Bytes of records served per catch-up request, by default.
pub const CATCH_UP_BATCH_BYTES: usize = 4 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Conn {
    /// Accepted: a leader, or a peer/replica asking for catch-up.
    Inbound,
    /// Dialed by us to catch up; the position last asked from.
    CatchUpSource { from: Bookmark },
}

struct Core {
    follower: Follower,
    log: SegmentLog,
    conns: HashMap<ConnId, Conn>,
    leader: Option<ConnId>,
    sync_requested: bool,
    next_peer: usize,
    /// A storage failure stops the follower taking records: acking after
    /// one could claim durability it does not have.
    broken: Option<String>,
    /// A catch-up source to dial after the lock is released.
    dial: Option<SocketAddr>,
    /// Catching up from a peer: when it started or its source last spoke.
    catch_up: Option<std::time::Instant>,
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
        std::fs::create_dir_all(&config.dir).map_err(|e| NodeError::Io(e.to_string()))?;
        let epoch = epoch_file::load(&config.dir).map_err(|e| NodeError::Storage(e.to_string()))?;
        let (log, recovery) = SegmentLog::open(
            &config.dir.join("log"),
            config.segment_bytes,
            Bookmark::ZERO,
        )
        .map_err(|e| NodeError::Storage(e.to_string()))?;
        let last = log.last();
        let state = Arc::new(State {
            core: Mutex::new(Core {
                follower: Follower::new(config.database, epoch, last),
                log,
                conns: HashMap::new(),
                leader: None,
                sync_requested: false,
                next_peer: 0,
                broken: None,
                dial: None,
                catch_up: None,
            }),
            transport: OnceLock::new(),
            config,
        });
        let transport = super::open_transport(
            state.config.backend,
            Arc::clone(&state) as Arc<dyn NetHandler>,
            &state.transport,
        )?;
        let addr = transport
            .listen(state.config.listen)
            .map_err(|e| NodeError::Io(format!("listen on {}: {e}", state.config.listen)))?;
        let weak = Arc::downgrade(&state);
        std::thread::Builder::new()
            .name("walrelay-follower-watch".into())
            .spawn(move || watch_catch_up(weak))
            .map_err(|e| NodeError::Io(e.to_string()))?;
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
}

fn watch_catch_up(state: std::sync::Weak<State>) {
    loop {
        std::thread::sleep(std::time::Duration::from_millis(500));
        let Some(s) = state.upgrade() else { return };
        let stale: Vec<ConnId> = {
            let mut core = s.core.lock();
            if core
                .catch_up
                .is_none_or(|t| t.elapsed() <= super::CATCH_UP_IDLE)
            {
                continue;
            }
            core.catch_up = None;
            core.conns
                .iter()
                .filter(|(_, k)| matches!(k, Conn::CatchUpSource { .. }))
                .map(|(c, _)| *c)
                .collect()
        };
        for c in stale {
            s.transport().close(c);
        }
    }
}

impl State {
    fn transport(&self) -> &Arc<dyn Transport> {
        self.transport
            .get()
            .expect("transport set before any connection")
    }

    /// Carries out actions; `reply` is where a `Send` goes.
    fn run(&self, core: &mut Core, reply: Option<ConnId>, actions: Vec<FollowerAction>) {
        for action in actions {
            match action {
                FollowerAction::PersistEpoch(e) => {
                    if let Err(err) = epoch_file::store(&self.config.dir, e) {
                        core.broken = Some(err.to_string());
                        return;
                    }
                }
                FollowerAction::Append(record) => {
                    if let Err(err) = core.log.append_encoded(&record) {
                        core.broken = Some(err.to_string());
                        return;
                    }
                }
                FollowerAction::Sync { .. } => core.sync_requested = true,
                FollowerAction::ServeCatchUp { after, upto } => {
                    // One bounded batch per request: the peer asks again
                    // from where the batch ended (pull-based, so a long
                    // catch-up never queues more than a batch).
                    let Some(to) = reply else { continue };
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
                                        self.transport().send(to, &Message::Append(e));
                                    }
                                    Err(_) => break,
                                }
                            }
                            self.transport()
                                .send(to, &Message::CatchUpDone { upto: last });
                        }
                        Err(_) => self.transport().close(to),
                    }
                }
                FollowerAction::Send(m) => {
                    if let Some(to) = reply.or(core.leader) {
                        self.transport().send(to, &m);
                    }
                }
                FollowerAction::CatchUpFromPeer { .. } => {
                    if core.catch_up.is_none() && !self.config.peers.is_empty() {
                        core.catch_up = Some(std::time::Instant::now());
                        let peer = self.config.peers[core.next_peer % self.config.peers.len()];
                        core.next_peer += 1;
                        // Dialed once the lock is released: a failed dial
                        // may be reported on this thread.
                        core.dial = Some(peer);
                    }
                }
                FollowerAction::AbandonCatchUp => {
                    let sources: Vec<ConnId> = core
                        .conns
                        .iter()
                        .filter(|(_, k)| matches!(k, Conn::CatchUpSource { .. }))
                        .map(|(c, _)| *c)
                        .collect();
                    for c in sources {
                        self.transport().close(c);
                    }
                }
            }
        }
    }

    fn sync(&self, core: &mut Core) {
        while core.sync_requested && core.broken.is_none() {
            core.sync_requested = false;
            match core.log.sync() {
                Ok(upto) => {
                    let actions = core.follower.handle(FollowerEvent::Synced { upto });
                    self.run(core, None, actions);
                }
                Err(e) => core.broken = Some(e.to_string()),
            }
        }
    }
}

impl NetHandler for State {
    fn accepted(&self, conn: ConnId, _from: SocketAddr) {
        self.core.lock().conns.insert(conn, Conn::Inbound);
    }

    fn connected(&self, conn: ConnId, _tag: u64) {
        let mut core = self.core.lock();
        let from = core.follower.last_appended();
        core.conns.insert(conn, Conn::CatchUpSource { from });
        self.transport().send(conn, &Message::CatchUp { from });
    }

    fn connect_failed(&self, _tag: u64, _error: io::Error) {
        // Try another peer the next time the leader sends us away.
        self.core.lock().catch_up = None;
    }

    fn message(&self, conn: ConnId, message: Message) {
        let mut core = self.core.lock();
        if core.broken.is_some() {
            self.transport().close(conn);
            return;
        }
        let kind = core.conns.get(&conn).copied();
        if matches!(kind, Some(Conn::CatchUpSource { .. })) {
            core.catch_up = Some(std::time::Instant::now());
        }
        let event = match (kind, message) {
            (Some(Conn::CatchUpSource { .. }), Message::Append(record)) => {
                FollowerEvent::CatchUpRecord(record)
            }
            (Some(Conn::CatchUpSource { from }), Message::CatchUpDone { upto }) => {
                if upto > from {
                    // A batch ended: ask for the next one.
                    let next = core.follower.last_appended().max(upto);
                    core.conns.insert(conn, Conn::CatchUpSource { from: next });
                    self.transport()
                        .send(conn, &Message::CatchUp { from: next });
                } else {
                    self.transport().close(conn);
                }
                FollowerEvent::CatchUpDone { upto }
            }
            (Some(Conn::CatchUpSource { .. }), _) => {
                self.transport().close(conn);
                return;
            }
            (_, Message::Append(_) | Message::Confirm { .. } | Message::Heartbeat { .. })
                if core.leader != Some(conn) =>
            {
                // Log traffic is taken only from the connection whose
                // leader handshake was accepted.
                self.transport().close(conn);
                return;
            }
            (_, m) => FollowerEvent::Received(m),
        };
        let actions = core.follower.handle(event);
        // The follower answers a leader handshake it accepts with its own:
        // from then on that connection is the leader's.
        if actions.iter().any(|a| {
            matches!(
                a,
                FollowerAction::Send(Message::Handshake {
                    role: Role::Follower,
                    ..
                })
            )
        }) {
            core.leader = Some(conn);
        }
        let reply = (!matches!(kind, Some(Conn::CatchUpSource { .. }))).then_some(conn);
        self.run(&mut core, reply, actions);
        let dial = core.dial.take();
        drop(core);
        if let Some(peer) = dial {
            self.transport().connect(peer, 0);
        }
    }

    fn drained(&self, _conn: ConnId) {
        let mut core = self.core.lock();
        self.sync(&mut core);
    }

    fn closed(&self, conn: ConnId, _error: Option<String>) {
        let mut core = self.core.lock();
        if matches!(core.conns.remove(&conn), Some(Conn::CatchUpSource { .. })) {
            core.catch_up = None;
            // Make what was fetched durable before anyone relies on it.
            self.sync(&mut core);
        }
        if core.leader == Some(conn) {
            core.leader = None;
        }
    }
}
