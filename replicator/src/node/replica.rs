//! A read replica's replication runtime: the [`Subscriber`] core driving
//! an [`Applier`] (the engine's replica database) from the leader's
//! stream, with catch-up from a follower when the leader no longer holds
//! the replica's position.
//!
//! When no follower holds it either (each answered that its log starts
//! later: the records were released to cold storage) the subscription
//! stops like on any other fatal condition ([`ReplicaNode::last_error`]),
//! tells the [`Applier`] ([`Applier::archived`]) and is reported by
//! [`ReplicaNode::archived`]; it dials nothing until the applier's
//! confirmed position reaches the followers' start (the engine bootstraps
//! the replica from cold storage), then subscribes from there.

use super::NodeError;
use crate::bookmark::Bookmark;
use crate::chain::ChainHash;
use crate::ids::DatabaseId;
use crate::net::{Backend, ClusterKey, ConnId, NetHandler, Transport};
use crate::record::Encoded;
use crate::subscriber::{Source, Subscriber, SubscriberAction, SubscriberEvent};
use crate::wire::Message;
use parking_lot::Mutex;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

/// An error from below the replicator (the replica's database), kept
/// whole as a source.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a replica could not apply, reveal or discard: the subscriber starts
/// over from what the database shows in every case, and reports which.
#[derive(Debug, thiserror::Error)]
pub enum ApplierError {
    /// The record does not decode into pages the replica can write.
    #[error("the record is not valid: {0}")]
    Record(#[source] BoxError),
    /// The record does not follow what the replica holds.
    #[error("the record does not follow the replica's log: {0}")]
    OutOfOrder(#[source] BoxError),
    /// The replica's storage failed (I/O, a full disk, its wal-index).
    #[error("replica storage: {0}")]
    Storage(#[source] BoxError),
}

/// What a replica database must do for its subscriber.
pub trait Applier: Send + Sync {
    /// Applies a record invisibly (it follows the last applied one).
    fn apply(&self, record: &Encoded) -> Result<(), ApplierError>;
    /// Makes everything up to `bookmark` visible at once.
    fn confirm(&self, bookmark: Bookmark) -> Result<(), ApplierError>;
    fn discard_unconfirmed(&self) -> Result<(), ApplierError>;
    /// What is visible now (where a resubscription starts).
    fn confirmed(&self) -> Bookmark;
    /// Deferred work after a confirm (checkpoints, persisting), run once
    /// the confirm's latency has been measured.
    fn housekeeping(&self) -> Result<(), ApplierError> {
        Ok(())
    }
    /// Every follower's log starts at `start` (whose chain is `chain`),
    /// after [`confirmed`](Applier::confirmed): the records in between are
    /// only in cold storage. The subscriber waits until `confirmed`
    /// reaches `start` (the replica bootstrapped from cold storage), then
    /// subscribes from there. Called once per such stop, with the
    /// subscriber's lock held: it must not call back into the node.
    fn archived(&self, start: Bookmark, chain: ChainHash) {
        let _ = (start, chain);
    }
}

/// Why a subscription stopped and started over.
#[derive(Debug, thiserror::Error)]
enum Stopped {
    #[error(transparent)]
    Applier(#[from] ApplierError),
    #[error("the leader refused this replica: {0:?}")]
    Refused(crate::wire::RefuseReason),
    #[error(
        "the followers' logs start at {start}, after this replica's {held}: the records in between are in cold storage only; bootstrap the replica from there"
    )]
    Archived { start: Bookmark, held: Bookmark },
}

/// How to run a replica's subscriber.
#[derive(Debug, Clone)]
pub struct ReplicaNodeConfig {
    pub database: DatabaseId,
    pub leader: SocketAddr,
    /// Followers to catch up from.
    pub followers: Vec<SocketAddr>,
    /// The replica's confirmed position at start.
    pub start: Bookmark,
    pub redial_interval_ms: u64,
    pub backend: Backend,
    /// The cluster key every replication connection is authenticated
    /// with; None runs this node's connections unauthenticated (anyone who
    /// can reach its ports can read and write the log).
    pub auth: Option<ClusterKey>,
    /// Injected replication delay: every message is held this long before
    /// it is acted on (tests of session consistency under lag). 0: none.
    pub delay_ms: u64,
    /// Subscribe over a shared multiplexer (a node keeping many replicas:
    /// one connection per peer node, each replica a channel; `backend`
    /// and `auth` are then the mux's). None: connections of its own.
    pub mux: Option<crate::net::mux::Mux>,
}

/// A leader connection silent this long is closed (see `leader_seen`).
pub const LEADER_SILENCE: Duration = Duration::from_secs(2);

const LEADER_TAG: u64 = 0;
const FOLLOWER_TAG: u64 = 1;

#[derive(Debug, Default, Clone, Copy)]
struct Links {
    leader: Option<ConnId>,
    follower: Option<ConnId>,
    dialing: bool,
    /// Catch up from a follower before the next leader connection.
    need_catch_up: bool,
    next_follower: usize,
    /// When the catch-up source last spoke (a silent one is dropped).
    catch_up_seen: Option<Instant>,
    /// Followers that answered, one after another, that their log starts
    /// after this replica's position.
    archived_answers: usize,
    /// Stopped until the applier's confirmed position reaches this start.
    archived: Option<Bookmark>,
}

struct State {
    config: ReplicaNodeConfig,
    /// Where the leader is now (starts as `config.leader`; a leader that
    /// moved is followed with [`ReplicaNode::set_leader`]).
    leader: Mutex<SocketAddr>,
    /// Shut down: nothing is dialed again and the threads end.
    stopped: std::sync::atomic::AtomicBool,
    /// When the leader connection last delivered anything (it sends a
    /// heartbeat at least every few tens of ms): a leader silent for
    /// [`LEADER_SILENCE`] is hung or cut off, and its connection is closed
    /// so the replica dials again (and its owner may point it elsewhere).
    leader_seen: Mutex<Option<Instant>>,
    core: Mutex<(Subscriber, Links)>,
    applier: Arc<dyn Applier>,
    transport: OnceLock<Arc<dyn Transport>>,
    last_error: Mutex<Option<String>>,
    /// Confirm lag samples (leader's quorum → visible here), µs.
    lags_us: Mutex<Vec<u64>>,
    /// The newest watermark the leader announced (for lag reporting).
    leader_confirmed: Mutex<Bookmark>,
    /// Messages held back by the delay knob, in arrival order.
    delayed: Mutex<std::collections::VecDeque<(Instant, ConnId, Message)>>,
    delayed_ready: parking_lot::Condvar,
}

/// Samples kept between two [`ReplicaNode::take_confirm_lags_us`] calls.
const MAX_LAG_SAMPLES: usize = 1 << 20;

/// A running replica subscriber.
pub struct ReplicaNode {
    state: Arc<State>,
}

impl std::fmt::Debug for ReplicaNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicaNode")
            .field("confirmed", &self.confirmed())
            .finish()
    }
}

impl ReplicaNode {
    pub fn start(
        config: ReplicaNodeConfig,
        applier: Arc<dyn Applier>,
    ) -> Result<ReplicaNode, NodeError> {
        let state = Arc::new(State {
            core: Mutex::new((
                Subscriber::new(config.database, config.start),
                Links::default(),
            )),
            applier,
            transport: OnceLock::new(),
            last_error: Mutex::new(None),
            lags_us: Mutex::new(Vec::new()),
            leader_confirmed: Mutex::new(config.start),
            delayed: Mutex::new(std::collections::VecDeque::new()),
            delayed_ready: parking_lot::Condvar::new(),
            leader: Mutex::new(config.leader),
            stopped: std::sync::atomic::AtomicBool::new(false),
            leader_seen: Mutex::new(None),
            config,
        });
        match &state.config.mux {
            Some(mux) => {
                let t = mux.endpoint(Arc::clone(&state) as Arc<dyn NetHandler>);
                let _ = state.transport.set(t);
            }
            None => {
                super::open_transport(
                    state.config.backend,
                    Arc::clone(&state) as Arc<dyn NetHandler>,
                    state.config.auth.clone(),
                    &state.transport,
                )?;
            }
        }
        state.dial();
        let weak = Arc::downgrade(&state);
        std::thread::Builder::new()
            .name("walrelay-replica-dial".into())
            .spawn(move || redialer(weak))
            .map_err(NodeError::io("starting the replica's threads"))?;
        if state.config.delay_ms > 0 {
            let weak = Arc::downgrade(&state);
            std::thread::Builder::new()
                .name("walrelay-replica-delay".into())
                .spawn(move || release_delayed(weak))
                .map_err(NodeError::io("starting the replica's threads"))?;
        }
        Ok(ReplicaNode { state })
    }

    /// Follows a leader that moved (a primary reopened on another port):
    /// the current leader connection, if any, is closed and the next dial
    /// goes to `addr`. The subscription resumes from what is visible.
    pub fn set_leader(&self, addr: SocketAddr) {
        let old = std::mem::replace(&mut *self.state.leader.lock(), addr);
        if old == addr {
            return;
        }
        tracing::info!(from = %old, to = %addr, database = %self.state.config.database, "replica follows its leader to a new address");
        let conn = self.state.core.lock().1.leader;
        if let Some(c) = conn {
            self.state.transport().close(c);
        }
    }

    /// Where the leader is dialed.
    pub fn leader(&self) -> SocketAddr {
        *self.state.leader.lock()
    }

    /// Whether a leader connection is up now.
    pub fn leader_connected(&self) -> bool {
        self.state.core.lock().1.leader.is_some()
    }

    /// Stops the subscription for good: its connections are shut, nothing
    /// is dialed again, and its threads end. What the applier holds stays
    /// as it is (visible up to its confirmed position). Idempotent.
    pub fn shutdown(&self) {
        self.state
            .stopped
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.state.delayed_ready.notify_all();
        if let Some(t) = self.state.transport.get() {
            t.shutdown();
        }
    }

    /// Replication connections (or frames) refused by authentication.
    pub fn auth_refusals(&self) -> u64 {
        self.state.transport().auth_refusals()
    }

    pub fn confirmed(&self) -> Bookmark {
        self.state.core.lock().0.confirmed()
    }

    /// The last apply or protocol error, if any.
    pub fn last_error(&self) -> Option<String> {
        self.state.last_error.lock().clone()
    }

    /// Where the followers' logs start, when every follower answered that
    /// it starts after this replica's position: the replica waits (dials
    /// nothing) until its applier is bootstrapped to there from cold
    /// storage. None while it follows.
    pub fn archived(&self) -> Option<Bookmark> {
        self.state.core.lock().1.archived
    }

    /// Confirm lags measured since the last call: for each confirm that
    /// revealed something, the leader's quorum time to the moment the
    /// confirm was visible here (same-host wall clocks), in µs.
    pub fn take_confirm_lags_us(&self) -> Vec<u64> {
        std::mem::take(&mut *self.state.lags_us.lock())
    }

    /// The newest confirmed watermark the leader announced.
    pub fn leader_confirmed(&self) -> Bookmark {
        *self.state.leader_confirmed.lock()
    }

    /// Waits until the replica has confirmed `bookmark`, at most `timeout`.
    pub fn wait_confirmed(&self, bookmark: Bookmark, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.confirmed() >= bookmark {
                return true;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        self.confirmed() >= bookmark
    }
}

/// Acts on delayed messages once their time has come, in order.
fn release_delayed(state: Weak<State>) {
    loop {
        let Some(s) = state.upgrade() else { return };
        if s.is_stopped() {
            return;
        }
        let due = {
            let mut q = s.delayed.lock();
            match q.front() {
                Some((at, _, _)) if *at <= Instant::now() => q.pop_front(),
                Some((at, _, _)) => {
                    let at = *at;
                    s.delayed_ready.wait_until(&mut q, at);
                    None
                }
                None => {
                    s.delayed_ready.wait_for(&mut q, Duration::from_millis(100));
                    None
                }
            }
        };
        if let Some((_, conn, message)) = due {
            s.act(conn, message);
        }
    }
}

fn redialer(state: Weak<State>) {
    loop {
        let Some(s) = state.upgrade() else { return };
        if s.is_stopped() {
            return;
        }
        let interval = Duration::from_millis(s.config.redial_interval_ms.max(1));
        let (stale, silent) = {
            let core = s.core.lock();
            let stale = match (core.1.follower, core.1.catch_up_seen) {
                (Some(c), Some(seen)) if seen.elapsed() > super::CATCH_UP_IDLE => Some(c),
                _ => None,
            };
            let seen = *s.leader_seen.lock();
            let silent = match (core.1.leader, seen) {
                (Some(c), Some(seen)) if seen.elapsed() > LEADER_SILENCE => Some(c),
                _ => None,
            };
            (stale, silent)
        };
        if let Some(c) = stale {
            s.transport().close(c);
        }
        if let Some(c) = silent {
            tracing::warn!(database = %s.config.database, leader = %*s.leader.lock(), "the replica's leader went silent: closing its connection");
            s.transport().close(c);
        }
        s.dial();
        drop(s);
        std::thread::sleep(interval);
    }
}

impl State {
    fn is_stopped(&self) -> bool {
        self.stopped.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn transport(&self) -> &Arc<dyn Transport> {
        self.transport.get().expect("transport set at start")
    }

    /// Dials the leader, or a follower when a catch-up is due.
    fn dial(&self) {
        let Some(t) = self.transport.get() else {
            return;
        };
        if self.is_stopped() {
            return;
        }
        let (addr, tag) = {
            let mut core = self.core.lock();
            if core.1.dialing || core.1.leader.is_some() || core.1.follower.is_some() {
                return;
            }
            if let Some(start) = core.1.archived {
                let held = self.applier.confirmed();
                if held < start {
                    return; // waiting for a bootstrap from cold storage
                }
                tracing::info!(start = %start, held = %held, "replica bootstrapped past the archived start: subscribing again");
                core.1.archived = None;
                core.1.archived_answers = 0;
                core.0 = Subscriber::new(self.config.database, held);
            }
            let links = &mut core.1;
            links.dialing = true;
            if links.need_catch_up && !self.config.followers.is_empty() {
                let f = self.config.followers[links.next_follower % self.config.followers.len()];
                links.next_follower += 1;
                (f, FOLLOWER_TAG)
            } else {
                (*self.leader.lock(), LEADER_TAG)
            }
        };
        // Outside the lock: a failed dial may be reported on this thread.
        t.connect(addr, tag);
    }

    fn conn_of(links: &Links, source: Source) -> Option<ConnId> {
        match source {
            Source::Leader => links.leader,
            Source::Follower => links.follower,
        }
    }

    fn fail(&self, why: impl std::fmt::Display) {
        tracing::warn!(%why, "replica subscription starts over");
        *self.last_error.lock() = Some(why.to_string());
    }

    fn run(&self, core: &mut (Subscriber, Links), actions: Vec<SubscriberAction>) {
        for action in actions {
            let result = match action {
                SubscriberAction::DiscardUnconfirmed => {
                    self.applier.discard_unconfirmed().map_err(Stopped::from)
                }
                SubscriberAction::Apply(record) => {
                    self.applier.apply(&record).map_err(Stopped::from)
                }
                SubscriberAction::Confirm(b) => self.applier.confirm(b).map_err(Stopped::from),
                SubscriberAction::Send(source, m) => {
                    if let Some(c) = Self::conn_of(&core.1, source) {
                        self.transport().send(c, &m);
                    }
                    Ok(())
                }
                SubscriberAction::Close(source) => {
                    if let Some(c) = Self::conn_of(&core.1, source) {
                        self.transport().close(c);
                    }
                    Ok(())
                }
                SubscriberAction::CatchUpFromFollower => {
                    core.1.need_catch_up = true;
                    Ok(())
                }
                SubscriberAction::Refused(r) => Err(Stopped::Refused(r)),
                SubscriberAction::Archived { start, chain } => {
                    // Another follower may not have released as much yet:
                    // ask each before giving up on them.
                    core.1.archived_answers += 1;
                    if core.1.archived_answers < self.config.followers.len() {
                        tracing::info!(start = %start, "a follower's log starts after this replica: trying another");
                        Ok(())
                    } else {
                        core.1.archived = Some(start);
                        self.applier.archived(start, chain);
                        Err(Stopped::Archived {
                            start,
                            held: core.0.confirmed(),
                        })
                    }
                }
            };
            if let Err(e) = result {
                // The replica's database could not follow: drop the streams
                // and start again from what the database really shows (the
                // core may have moved past it), without its unconfirmed tail.
                self.fail(e);
                let _ = self.applier.discard_unconfirmed();
                core.0 = Subscriber::new(self.config.database, self.applier.confirmed());
                for c in [core.1.leader, core.1.follower].into_iter().flatten() {
                    self.transport().close(c);
                }
                return;
            }
        }
    }
}

impl NetHandler for State {
    fn accepted(&self, conn: ConnId, _from: SocketAddr) {
        self.transport().close(conn); // replicas accept nothing
    }

    fn connected(&self, conn: ConnId, tag: u64) {
        let mut core = self.core.lock();
        core.1.dialing = false;
        let source = if tag == FOLLOWER_TAG {
            core.1.follower = Some(conn);
            core.1.catch_up_seen = Some(Instant::now());
            Source::Follower
        } else {
            core.1.leader = Some(conn);
            *self.leader_seen.lock() = Some(Instant::now());
            Source::Leader
        };
        let actions = core.0.handle(SubscriberEvent::Connected(source));
        self.run(&mut core, actions);
    }

    fn connect_failed(&self, _tag: u64, _error: io::Error) {
        self.core.lock().1.dialing = false;
    }

    fn message(&self, conn: ConnId, message: Message) {
        if self.core.lock().1.leader == Some(conn) {
            *self.leader_seen.lock() = Some(Instant::now());
        }
        if self.config.delay_ms > 0 {
            let at = Instant::now() + Duration::from_millis(self.config.delay_ms);
            self.delayed.lock().push_back((at, conn, message));
            self.delayed_ready.notify_one();
            return;
        }
        self.act(conn, message);
    }

    fn closed(&self, conn: ConnId, _error: Option<String>) {
        self.disconnected(conn);
    }
}

impl State {
    fn act(&self, conn: ConnId, message: Message) {
        let mut core = self.core.lock();
        let source = if core.1.leader == Some(conn) {
            Source::Leader
        } else if core.1.follower == Some(conn) {
            core.1.catch_up_seen = Some(Instant::now());
            Source::Follower
        } else {
            return;
        };
        let stamp = match &message {
            Message::Confirm { confirmed_us, .. } => Some(*confirmed_us),
            _ => None,
        };
        if let Message::Confirm { confirmed, .. } | Message::Heartbeat { confirmed, .. } = &message
            && source == Source::Leader
        {
            let mut lc = self.leader_confirmed.lock();
            *lc = (*lc).max(*confirmed);
        }
        let before = core.0.confirmed();
        let actions = core.0.handle(SubscriberEvent::Received(source, message));
        self.run(&mut core, actions);
        if core.0.confirmed() > before {
            core.1.archived_answers = 0;
        }
        if let Some(at) = stamp
            && core.0.confirmed() > before
        {
            let lag = super::leader::wall_clock_us().saturating_sub(at);
            let mut lags = self.lags_us.lock();
            if lags.len() < MAX_LAG_SAMPLES {
                lags.push(lag);
            }
        }
        if core.0.confirmed() > before
            && let Err(e) = self.applier.housekeeping()
        {
            self.fail(e);
        }
    }

    fn disconnected(&self, conn: ConnId) {
        let mut core = self.core.lock();
        let source = if core.1.leader == Some(conn) {
            core.1.leader = None;
            Source::Leader
        } else if core.1.follower == Some(conn) {
            core.1.follower = None;
            // Whether it finished or broke, the leader is next.
            core.1.need_catch_up = false;
            Source::Follower
        } else {
            return;
        };
        let actions = core.0.handle(SubscriberEvent::Disconnected(source));
        self.run(&mut core, actions);
    }
}
