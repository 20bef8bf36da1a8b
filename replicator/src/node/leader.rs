//! The primary's replication runtime: the [`Leader`] core behind a lock,
//! driven by whichever thread has something to say. A commit is fanned out
//! on the committing thread itself (no hop before the first byte leaves);
//! acks are handled on the transport's reader threads; a ticker sends
//! heartbeats and redials followers.
//!
//! The output gate rests on [`LeaderNode::wait_confirmed`]: a write's result
//! is released only once its bookmark is confirmed by W followers.

use super::NodeError;
use super::outbox::{Deferred, Outbox};
use super::waiters::{Waiters, park_until};
use crate::bookmark::{Bookmark, Epoch};
use crate::chain::ChainHash;
use crate::history::History;
use crate::ids::{DatabaseId, NodeId};
use crate::leader::{
    CloseReason, FanOut, Leader, LeaderAction, LeaderConfig, LeaderError, LeaderEvent, PeerId,
};
use crate::net::mux::Mux;
use crate::net::{Backend, ClusterKey, ConnId, NetHandler, Transport};
use crate::record::Encoded;
use crate::wire::Message;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

/// How long a stopping leader waits for its followers' connections to
/// close after its last confirmation went out ([`LeaderNode::shutdown`]):
/// a loopback or LAN close takes a round trip; a peer that does not answer
/// is cut off after this.
pub const FAREWELL_WAIT: Duration = Duration::from_millis(500);

/// How to run a leader.
#[derive(Debug, Clone)]
pub struct LeaderNodeConfig {
    pub database: DatabaseId,
    /// The epoch this node won (see [`super::candidate`]).
    pub epoch: Epoch,
    pub node: NodeId,
    /// A confirmed position, its chain, the adopted records after it and
    /// the epoch history to their end: what the election found
    /// ([`crate::leader::LeaderConfig`]).
    pub start: Bookmark,
    pub start_chain: ChainHash,
    pub adopted: Vec<Encoded>,
    pub history: History,
    /// The N durability followers, in a fixed order.
    pub followers: Vec<SocketAddr>,
    pub write_quorum: usize,
    /// Where replicas connect (None: no replicas).
    pub listen: Option<SocketAddr>,
    pub tail_limit_bytes: usize,
    pub heartbeat_interval_ms: u64,
    pub redial_interval_ms: u64,
    /// Which followers get each record at once; the others' batches go out
    /// on this node's ticks ([`crate::leader::FanOut`]).
    pub fan_out: FanOut,
    pub backend: Backend,
    /// The cluster key every replication connection is authenticated
    /// with; None runs this node's connections unauthenticated (anyone who
    /// can reach its ports can read and write the log).
    pub auth: Option<ClusterKey>,
    /// A multiplexer shared with other leaders of this process: the
    /// followers are reached over its one connection per follower, each
    /// database a channel (`backend` and `auth` are then the mux's). None:
    /// a transport of this leader's own.
    pub mux: Option<Mux>,
}

/// Why a write's confirmation did not arrive.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfirmError {
    #[error(
        "bookmark {bookmark} not confirmed after {waited_ms} ms, the last {quiet_ms} ms with no confirmation at all: fewer than {write_quorum} followers reachable ({streaming} streaming)"
    )]
    Timeout {
        bookmark: Bookmark,
        waited_ms: u64,
        /// How long the confirmed point stood still before the wait gave up.
        quiet_ms: u64,
        write_quorum: usize,
        streaming: usize,
    },
    #[error("this primary was fenced by epoch {0}")]
    Fenced(Epoch),
}

/// What the leader looks like now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaderStatus {
    pub last: Bookmark,
    pub confirmed: Bookmark,
    pub streaming_followers: usize,
    pub unconfirmed_bytes: usize,
    /// Bytes of records held for peers ([`crate::leader::Leader::tail_bytes`]).
    pub tail_bytes: usize,
    /// Eager followers swapped out for falling behind
    /// ([`crate::leader::Leader::eager_swaps`]).
    pub eager_swaps: u64,
}

struct Core {
    leader: Leader,
    followers: HashMap<ConnId, usize>,
    follower_conn: Vec<Option<ConnId>>,
    dialing: Vec<bool>,
}

struct Watch {
    confirmed: Bookmark,
    /// When `confirmed` last moved (or the leader started): a wait gives
    /// up only after its timeout passes with no confirmation at all.
    advanced_at: Instant,
    fenced: Option<Epoch>,
    /// Sessions waiting at the output gate, each woken only once its
    /// bookmark is confirmed (or the leader is fenced or shut down).
    waiters: Waiters<Bookmark>,
}

impl Watch {
    /// How a wait for `bookmark` ends now: None while it may still be
    /// confirmed.
    fn settled(&self, bookmark: Bookmark) -> Option<Result<(), ConfirmError>> {
        if let Some(e) = self.fenced {
            return Some(Err(ConfirmError::Fenced(e)));
        }
        (self.confirmed >= bookmark).then_some(Ok(()))
    }
}

struct State {
    config: LeaderNodeConfig,
    core: Mutex<Core>,
    watch: Mutex<Watch>,
    transport: OnceLock<Arc<dyn Transport>>,
    started: Instant,
    /// [`LeaderNode::shutdown`] was called: no ticks, no dials.
    shut: std::sync::atomic::AtomicBool,
    /// The core's unconfirmed bytes, published after every change under
    /// the core's lock, so admission reads it without that lock (which
    /// the ring thread holds while it handles acks).
    unconfirmed_bytes: AtomicUsize,
    /// The ticker thread, and whether it sleeps for a whole heartbeat
    /// because no lazy follower misses anything: the next commit wakes it,
    /// so a batch waits one lazy flush interval, not a heartbeat.
    ticker: OnceLock<std::thread::Thread>,
    ticker_idle: std::sync::atomic::AtomicBool,
    /// The ticker's sends, written after it releases the core's lock.
    outbox: Outbox,
    /// Connections closed because their peer saw a gap.
    resyncs: AtomicU64,
}

/// A running leader.
#[derive(Clone)]
pub struct LeaderNode {
    state: Arc<State>,
    replica_addr: Option<SocketAddr>,
}

impl std::fmt::Debug for LeaderNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderNode")
            .field("status", &self.status())
            .finish()
    }
}

impl LeaderNode {
    /// Checks the quorum (W a majority of N), listens for replicas and
    /// starts dialing the followers.
    pub fn start(config: LeaderNodeConfig) -> Result<LeaderNode, NodeError> {
        let n = config.followers.len();
        let leader = Leader::new(LeaderConfig {
            database: config.database,
            epoch: config.epoch,
            node: config.node,
            followers: n,
            write_quorum: config.write_quorum,
            start: config.start,
            start_chain: config.start_chain,
            adopted: config.adopted.clone(),
            history: config.history.clone(),
            tail_limit_bytes: config.tail_limit_bytes,
            heartbeat_interval_us: config.heartbeat_interval_ms * 1_000,
            fan_out: config.fan_out,
        })
        .map_err(NodeError::Leader)?;
        let unconfirmed_bytes = AtomicUsize::new(leader.unconfirmed_bytes());
        let state = Arc::new(State {
            core: Mutex::new(Core {
                leader,
                followers: HashMap::new(),
                follower_conn: vec![None; n],
                dialing: vec![false; n],
            }),
            watch: Mutex::new(Watch {
                confirmed: config.start,
                advanced_at: Instant::now(),
                fenced: None,
                waiters: Waiters::default(),
            }),
            transport: OnceLock::new(),
            started: Instant::now(),
            shut: std::sync::atomic::AtomicBool::new(false),
            unconfirmed_bytes,
            ticker: OnceLock::new(),
            ticker_idle: std::sync::atomic::AtomicBool::new(false),
            outbox: Outbox::default(),
            resyncs: AtomicU64::new(0),
            config,
        });
        let transport = match &state.config.mux {
            Some(mux) => {
                // Its replicas reach it on the mux's one port, by database.
                let handler = Arc::clone(&state) as Arc<dyn NetHandler>;
                let t = match state.config.listen {
                    Some(_) => mux.database_endpoint(handler, state.config.database),
                    None => mux.endpoint(handler),
                };
                let _ = state.transport.set(Arc::clone(&t));
                t
            }
            None => super::open_transport(
                state.config.backend,
                Arc::clone(&state) as Arc<dyn NetHandler>,
                state.config.auth.clone(),
                &state.transport,
            )?,
        };
        let replica_addr = match state.config.listen {
            Some(addr) => Some(
                transport
                    .listen(addr)
                    .map_err(NodeError::io(format!("listening on {addr}")))?,
            ),
            None => None,
        };
        state.redial();
        let weak = Arc::downgrade(&state);
        let ticking = std::thread::Builder::new()
            .name("walrelay-leader-tick".into())
            .spawn(move || ticker(weak))
            .map_err(NodeError::io("starting the ticker thread"))?;
        let _ = state.ticker.set(ticking.thread().clone());
        Ok(LeaderNode {
            state,
            replica_addr,
        })
    }

    /// Stops this leader's replication: its ticker, its dials, every
    /// connection and the transport's threads. Nothing is confirmed after
    /// it; the runtime's memory is freed once the last handle is dropped
    /// (the transport held the runtime, and the runtime the transport).
    /// Idempotent.
    ///
    /// The followers are told the confirmed watermark first (they learn it
    /// from heartbeats otherwise), and their connections are closed after
    /// what was sent, waited for at most [`FAREWELL_WAIT`].
    pub fn shutdown(&self) {
        if self
            .state
            .shut
            .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            return;
        }
        if let Some(t) = self.state.transport.get() {
            {
                let mut core = self.state.core.lock();
                let actions = core.leader.farewell();
                self.state.run(&core, actions, false);
            }
            let deadline = Instant::now() + FAREWELL_WAIT;
            while !self.state.core.lock().followers.is_empty() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            t.shutdown();
        }
        let woken = self.state.watch.lock().waiters.all();
        woken.wake();
    }

    /// Connections closed because their peer refused a record as a gap
    /// (it reconnects and resumes): none while sends keep their order.
    pub fn resyncs(&self) -> u64 {
        self.state.resyncs.load(Ordering::Relaxed)
    }

    /// Where replicas connect.
    pub fn replica_addr(&self) -> Option<SocketAddr> {
        self.replica_addr
    }

    pub fn backend(&self) -> &'static str {
        self.state.transport().backend()
    }

    /// Replication connections (or frames) refused by authentication.
    pub fn auth_refusals(&self) -> u64 {
        self.state.transport().auth_refusals()
    }

    /// Fans out the next committed record (its `previous` must be the last
    /// one's bookmark).
    pub fn commit(&self, record: Encoded) -> Result<(), LeaderError> {
        let mut core = self.state.core.lock();
        core.leader.set_clock_us(wall_clock_us());
        let actions = core.leader.committed(record)?;
        self.state.run(&core, actions, false);
        drop(core);
        if self.state.ticker_idle.load(Ordering::Relaxed)
            && self.state.ticker_idle.swap(false, Ordering::AcqRel)
            && let Some(t) = self.state.ticker.get()
        {
            t.unpark();
        }
        Ok(())
    }

    pub fn confirmed(&self) -> Bookmark {
        self.state.watch.lock().confirmed
    }

    /// The newer epoch that fenced this leader, if one did: it must stop
    /// serving writes.
    pub fn fenced(&self) -> Option<Epoch> {
        self.state.watch.lock().fenced
    }

    /// The last record committed (or adopted) and its chain: what the next
    /// record must name as its previous.
    pub fn last_end(&self) -> (Bookmark, ChainHash) {
        let core = self.state.core.lock();
        (core.leader.last(), core.leader.last_chain())
    }

    /// What follower `index` last reported durable (None: never).
    pub fn follower_durable(&self, index: usize) -> Option<Bookmark> {
        self.state.core.lock().leader.follower_durable(index)
    }

    /// Bytes of records committed and not yet confirmed, as of the last
    /// change; read without the core's lock (see [`LeaderStatus`] for the
    /// rest, which takes it).
    pub fn unconfirmed_bytes(&self) -> usize {
        self.state.unconfirmed_bytes.load(Ordering::Acquire)
    }

    pub fn status(&self) -> LeaderStatus {
        let core = self.state.core.lock();
        LeaderStatus {
            last: core.leader.last(),
            confirmed: core.leader.confirmed(),
            streaming_followers: core.leader.streaming_followers(),
            unconfirmed_bytes: core.leader.unconfirmed_bytes(),
            tail_bytes: core.leader.tail_bytes(),
            eager_swaps: core.leader.eager_swaps(),
        }
    }

    /// Runs `call` once `bookmark` is confirmed, or once it never can be
    /// here (fenced, shut down); at once if it already is. It runs on the
    /// thread that moved the watermark (or this one), so it must be quick:
    /// typically it wakes a waiter, which then checks with
    /// [`Self::wait_confirmed`] without sleeping. Nothing withdraws it: the
    /// caller bounds how many it leaves (the unconfirmed-bytes bound on
    /// writes bounds the bookmarks left to confirm).
    pub fn on_confirmed(&self, bookmark: Bookmark, call: super::waiters::Call) {
        {
            let mut watch = self.state.watch.lock();
            let never =
                watch.fenced.is_some() || self.state.shut.load(std::sync::atomic::Ordering::SeqCst);
            if !never && watch.confirmed < bookmark {
                watch.waiters.register_call(bookmark, call);
                return;
            }
        }
        call();
    }

    /// [`Self::wait_confirmed`] without waiting: None while `bookmark` is
    /// not confirmed and still may be.
    pub fn poll_confirmed(&self, bookmark: Bookmark) -> Option<Result<(), ConfirmError>> {
        self.state.watch.lock().settled(bookmark)
    }

    /// When the confirmed point last moved (or the leader started).
    pub fn confirmed_advanced_at(&self) -> Instant {
        self.state.watch.lock().advanced_at
    }

    /// Waits until `bookmark` is confirmed, or until `timeout` passes with
    /// the confirmed point standing still (see [`quiet_deadline`]): slow
    /// followers that are still confirming the records ahead of it do not
    /// fail the wait, a lost quorum does. The wait stays bounded because
    /// the records ahead of `bookmark` are (the unconfirmed-bytes window),
    /// and each advance confirms at least one.
    pub fn wait_confirmed(
        &self,
        bookmark: Bookmark,
        timeout: Duration,
    ) -> Result<(), ConfirmError> {
        let started = Instant::now();
        let mut watch = self.state.watch.lock();
        loop {
            if let Some(settled) = watch.settled(bookmark) {
                return settled;
            }
            let deadline = quiet_deadline(started, watch.advanced_at, timeout);
            if Instant::now() >= deadline {
                drop(watch);
                let waited_ms = started.elapsed().as_millis() as u64;
                return Err(ConfirmError::Timeout {
                    bookmark,
                    waited_ms,
                    quiet_ms: timeout.as_millis() as u64,
                    write_quorum: self.state.config.write_quorum,
                    streaming: self.status().streaming_followers,
                });
            }
            let ticket = watch.waiters.register(bookmark);
            drop(watch);
            park_until(deadline);
            watch = self.state.watch.lock();
            watch.waiters.withdraw(ticket);
        }
    }
}

/// When a wait that began at `started` with `timeout` gives up, the
/// confirmed point having last moved at `advanced_at`: `timeout` after
/// whichever is later. A confirmation before the wait began does not
/// shorten it.
pub fn quiet_deadline(started: Instant, advanced_at: Instant, timeout: Duration) -> Instant {
    started.max(advanced_at) + timeout
}

/// Microseconds since the Unix epoch: comparable across processes on one
/// host, which is what a confirm-lag measurement needs.
pub fn wall_clock_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// How often the ticker drives the core: every heartbeat, and every lazy
/// flush interval while some lazy follower misses a record.
fn tick_intervals(config: &LeaderNodeConfig) -> (Duration, Option<Duration>) {
    let heartbeat = Duration::from_millis(config.heartbeat_interval_ms.max(1));
    let lazy = config
        .fan_out
        .batches(config.followers.len())
        .then(|| Duration::from_micros(config.fan_out.tick_us().max(100)))
        .map(|l| l.min(heartbeat));
    (heartbeat, lazy)
}

fn ticker(state: Weak<State>) {
    let mut last_redial = Instant::now();
    loop {
        let Some(s) = state.upgrade() else { return };
        if s.shut.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let (heartbeat, lazy) = tick_intervals(&s.config);
        let busy = {
            let mut core = s.core.lock();
            let now_us = s.started.elapsed().as_micros() as u64;
            let actions = core.leader.handle(LeaderEvent::Tick { now_us });
            s.run(&core, actions, true);
            // Set under the core's lock, so a commit after it sees it.
            let busy = lazy.is_some() && core.leader.lazy_pending();
            s.ticker_idle
                .store(lazy.is_some() && !busy, Ordering::Release);
            busy
        };
        // The tick's records (a lazy flush, a promoted follower's catch-up)
        // go out without the lock that acks and commits wait for.
        s.outbox.drain(s.transport().as_ref());
        if last_redial.elapsed() >= Duration::from_millis(s.config.redial_interval_ms) {
            last_redial = Instant::now();
            s.redial();
        }
        drop(s);
        match lazy {
            Some(lazy) if busy => std::thread::sleep(lazy),
            Some(lazy) => {
                std::thread::park_timeout(heartbeat);
                // A commit woke it: its batch goes out one interval on.
                let woken = state
                    .upgrade()
                    .is_some_and(|s| !s.ticker_idle.load(Ordering::Acquire));
                if woken {
                    std::thread::sleep(lazy);
                }
            }
            None => std::thread::sleep(heartbeat),
        }
    }
}

impl State {
    fn transport(&self) -> &Arc<dyn Transport> {
        self.transport.get().expect("transport set at start")
    }

    fn redial(&self) {
        if self.shut.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let due: Vec<usize> = {
            let mut core = self.core.lock();
            let mut due = Vec::new();
            for i in 0..self.config.followers.len() {
                if core.follower_conn[i].is_none() && !core.dialing[i] {
                    core.dialing[i] = true;
                    due.push(i);
                }
            }
            due
        };
        // Dial outside the lock: a transport may report a failed dial on
        // this thread, and that report takes the lock.
        if let Some(t) = self.transport.get() {
            for i in due {
                t.connect(self.config.followers[i], i as u64);
            }
        }
    }

    /// Carries out `actions`, which `core` (still locked) has just given,
    /// and publishes what admission reads of it. A send or close on a
    /// connection with deferred entries is deferred behind them
    /// ([`super::outbox`]); with `defer_appends` (the ticker's) every
    /// record is too, for the ticker to write once the lock is released.
    fn run(&self, core: &Core, actions: Vec<LeaderAction>, defer_appends: bool) {
        self.unconfirmed_bytes
            .store(core.leader.unconfirmed_bytes(), Ordering::Release);
        // Sends in a row go out together (one system call where the
        // transport can), before whatever action follows them. A send
        // kept here was decided while nothing of its connection was queued;
        // what this run queues for it after (only the ticker's records) is
        // drained after this run flushes, so order holds.
        let mut sends: Vec<(ConnId, Message)> = Vec::new();
        let flush = |sends: &mut Vec<(ConnId, Message)>| {
            if !sends.is_empty() {
                let batch: Vec<(ConnId, &Message)> = sends.iter().map(|(c, m)| (*c, m)).collect();
                self.transport().send_many(&batch);
                sends.clear();
            }
        };
        for action in actions {
            if let LeaderAction::Send { peer, message } = action {
                let entry = Deferred::Send(peer.0, message);
                if defer_appends && matches!(entry, Deferred::Send(_, Message::Append(_))) {
                    self.outbox.push([entry]);
                } else if let Some(Deferred::Send(conn, message)) = self.outbox.queue_if_held(entry)
                {
                    sends.push((conn, message));
                }
                continue;
            }
            if let LeaderAction::Close { peer, reason } = &action {
                if *reason == CloseReason::Resync {
                    self.resyncs.fetch_add(1, Ordering::Relaxed);
                }
                if self.outbox.queue_if_held(Deferred::Close(peer.0)).is_none() {
                    tracing::debug!(conn = peer.0, ?reason, "closing after its deferred sends");
                    continue;
                }
            }
            flush(&mut sends);
            match action {
                LeaderAction::Send { .. } => unreachable!("sends are batched above"),
                LeaderAction::Confirmed(b) => {
                    let woken = {
                        let mut w = self.watch.lock();
                        if b > w.confirmed {
                            w.confirmed = b;
                            w.advanced_at = Instant::now();
                        }
                        let reached = w.confirmed;
                        w.waiters.reached(reached)
                    };
                    woken.wake();
                }
                LeaderAction::Close { peer, .. } => self.transport().close(peer.0),
                LeaderAction::Fenced(e) => {
                    tracing::warn!(
                        epoch = e.0,
                        "leader fenced: a follower has accepted a newer epoch"
                    );
                    let woken = {
                        let mut w = self.watch.lock();
                        w.fenced = Some(e);
                        w.waiters.all()
                    };
                    woken.wake();
                }
            }
        }
        flush(&mut sends);
    }
}

impl NetHandler for State {
    fn accepted(&self, conn: ConnId, _from: SocketAddr) {
        let mut core = self.core.lock();
        let actions = core
            .leader
            .handle(LeaderEvent::ReplicaConnected { peer: PeerId(conn) });
        self.run(&core, actions, false);
    }

    fn connected(&self, conn: ConnId, tag: u64) {
        let index = tag as usize;
        let mut core = self.core.lock();
        if index < core.dialing.len() {
            core.dialing[index] = false;
            core.follower_conn[index] = Some(conn);
        }
        core.followers.insert(conn, index);
        let actions = core.leader.handle(LeaderEvent::FollowerConnected {
            peer: PeerId(conn),
            index,
        });
        self.run(&core, actions, false);
    }

    fn connect_failed(&self, tag: u64, _error: io::Error) {
        let mut core = self.core.lock();
        if let Some(d) = core.dialing.get_mut(tag as usize) {
            *d = false;
        }
    }

    fn message(&self, conn: ConnId, message: Message) {
        if self.shut.load(Ordering::SeqCst) {
            return; // stopping: nothing is confirmed any more
        }
        let mut core = self.core.lock();
        core.leader.set_clock_us(wall_clock_us());
        let actions = core.leader.handle(LeaderEvent::Received {
            peer: PeerId(conn),
            message,
        });
        self.run(&core, actions, false);
    }

    fn closed(&self, conn: ConnId, _error: Option<String>) {
        let mut core = self.core.lock();
        if let Some(index) = core.followers.remove(&conn)
            && core.follower_conn.get(index) == Some(&Some(conn))
        {
            core.follower_conn[index] = None;
        }
        let actions = core
            .leader
            .handle(LeaderEvent::Disconnected { peer: PeerId(conn) });
        self.run(&core, actions, false);
    }
}
