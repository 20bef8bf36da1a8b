//! Many databases' replication over one authenticated connection per node
//! pair.
//!
//! A [`Mux`] owns one real [`Transport`] (std or io_uring, authenticated
//! with the cluster key as always) and hands out endpoints
//! ([`Mux::endpoint`]), each a [`Transport`] of its own to its user (a
//! [`crate::node::leader::LeaderNode`], a
//! [`crate::node::follower_host::FollowerHost`]):
//!
//! - `connect(addr, tag)` opens a virtual channel to `addr` over the one
//!   real connection the mux keeps to that address: dialed by the first
//!   endpoint that needs it, shared by every endpoint after, and dialed
//!   again by the next `connect` once it died (every channel on it is
//!   reported `closed` when it does).
//! - `listen(addr)` makes the endpoint the mux's acceptor: every channel a
//!   peer opens on a connection accepted there surfaces to it as an
//!   `accepted` virtual connection. A connection whose first frame is not a
//!   channel frame is an older, unmultiplexed peer: it is served as one
//!   virtual connection of its own, passed through as is.
//! - [`Mux::database_endpoint`]: an endpoint that accepts only the
//!   channels of one database, on the mux's one listening port (a fleet
//!   node's hosted leaders each take their replicas there); a channel (or
//!   an unmultiplexed connection) whose handshake names a database with
//!   such an endpoint goes to it, any other to the acceptor.
//! - `shutdown` of an endpoint closes only its channels; [`Mux::shutdown`]
//!   stops everything.
//!
//! Virtual connection ids are unique per mux. A channel is opened on the
//! wire by its first message, which must be a Handshake: the database it
//! names is the channel's, and every frame of the channel carries it
//! (checked on receipt). The format lives in [`super::mux_wire`]; credit
//! and fairness in [`sched`].
//!
//! # Group commit
//!
//! After the real transport hands over the frames of one read, the mux
//! calls `drained` for every channel that got messages, then (at the real
//! transport's `drains_done`) `drains_done` once on every endpoint that
//! had any: a follower host still syncs every database whose records
//! arrived together in one round.
//!
//! # Threads
//!
//! Nothing here calls a handler on the thread of a caller of `connect`,
//! `send` or `close` (which may hold locks the handler takes): reports that
//! such calls cause run on the mux's notifier thread; everything the peer
//! causes runs on the real transport's threads, as it would without the
//! mux. (The one exception is the real transport's own: a dial whose
//! thread cannot even be started is reported on the caller's thread.) A
//! channel whose `connected` went through the notifier has its `closed`
//! queued there too, so no handler hears of them out of order.
//!
//! # Limits
//!
//! [`Limits`]: the credit windows, the queue bounds (per channel and per
//! connection; a refusal closes the channel holding the most), and the
//! channels a peer may open on one connection. Every refusal is a
//! [`MuxError`], logged at `warn` and counted; connections coming and going
//! are logged at `info`, channels at `debug`.
//!
//! # Not covered
//!
//! A receiving handler that blocks (a follower's sync) holds up every
//! channel of its connection, as it held up its own connection before; a
//! peer that does not speak channel frames cannot be dialed through a mux
//! (it closes the connection at the first, unknown, frame kind).

pub mod error;
pub mod sched;

mod endpoint;
mod recv;

pub use error::MuxError;
pub use sched::Limits;

use super::mux_wire::{ChannelId, CloseReason, MuxFrame, MuxOp};
use super::{Backend, ClusterKey, ConnId, NetHandler, Transport};
use crate::ids::DatabaseId;
use crate::wire::Message;
use parking_lot::Mutex;
use sched::{Out, Sched};
use std::collections::{HashMap, HashSet};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, mpsc};

/// Which endpoint of a mux.
type EndpointId = u64;

/// Monotonic counters of a mux.
#[derive(Debug, Default)]
pub struct MuxStats {
    pub dials: AtomicU64,
    pub connections_accepted: AtomicU64,
    pub channels_opened: AtomicU64,
    pub channels_closed: AtomicU64,
    /// Frames, sends and channels refused ([`MuxError`]).
    pub refusals: AtomicU64,
}

/// What a mux holds now, and its counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MuxSnapshot {
    /// Real connections up (dialed and accepted, unmultiplexed ones too).
    pub connections: usize,
    /// Virtual connections (channels, and unmultiplexed peers).
    pub channels: usize,
    pub dials: u64,
    pub connections_accepted: u64,
    pub channels_opened: u64,
    pub channels_closed: u64,
    pub refusals: u64,
}

impl MuxSnapshot {
    /// Prometheus-style lines, each name prefixed with `prefix`.
    pub fn metrics_text(&self, prefix: &str) -> String {
        format!(
            "{prefix}mux_connections {}\n{prefix}mux_channels {}\n{prefix}mux_dials_total {}\n\
             {prefix}mux_connections_accepted_total {}\n{prefix}mux_channels_opened_total {}\n\
             {prefix}mux_channels_closed_total {}\n{prefix}mux_refusals_total {}\n",
            self.connections,
            self.channels,
            self.dials,
            self.connections_accepted,
            self.channels_opened,
            self.channels_closed,
            self.refusals
        )
    }
}

/// A report to a handler, made once the mux's lock is released.
enum Event {
    Connected(Arc<dyn NetHandler>, ConnId, u64),
    ConnectFailed(Arc<dyn NetHandler>, u64, io::Error),
    Accepted(Arc<dyn NetHandler>, ConnId, SocketAddr),
    Closed(Arc<dyn NetHandler>, ConnId, Option<String>),
}

fn run(events: Vec<Event>) {
    for e in events {
        match e {
            Event::Connected(h, c, tag) => h.connected(c, tag),
            Event::ConnectFailed(h, tag, e) => h.connect_failed(tag, e),
            Event::Accepted(h, c, from) => h.accepted(c, from),
            Event::Closed(h, c, why) => h.closed(c, why),
        }
    }
}

/// A channel of a real connection.
struct Chan {
    vconn: ConnId,
    endpoint: EndpointId,
    /// Its Open went out (or came in): it is in the scheduler.
    opened: bool,
    /// Its `connected` went through the notifier thread: so must its
    /// `closed`, or the handler could hear of them in the wrong order.
    deferred: bool,
}

/// How a real connection came to be and what it carries.
enum Kind {
    Dialed(SocketAddr),
    /// Accepted; its first frame tells whether it is multiplexed.
    Accepted {
        from: SocketAddr,
        mode: Mode,
    },
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Unknown,
    Mux,
    /// An unmultiplexed peer, served as one virtual connection.
    Raw(ConnId, EndpointId),
}

struct Real {
    kind: Kind,
    sched: Sched,
    chans: HashMap<ChannelId, Chan>,
    /// Dialed: the next channel id to open. Accepted: one past the
    /// highest the peer opened.
    next_channel: u64,
    /// Channels (or the raw peer) that got messages since the last drain.
    touched: Vec<ChannelId>,
    raw_touched: bool,
    /// Refused: closing; nothing more of it is delivered.
    refused: bool,
}

impl Real {
    fn new(kind: Kind, limits: Limits) -> Real {
        Real {
            kind,
            sched: Sched::new(limits),
            chans: HashMap::new(),
            next_channel: 1,
            touched: Vec::new(),
            raw_touched: false,
            refused: false,
        }
    }
}

/// A virtual connection.
#[derive(Clone, Copy)]
struct Route {
    endpoint: EndpointId,
    real: ConnId,
    /// None: an unmultiplexed peer (the real connection is its own).
    channel: Option<ChannelId>,
}

/// A `connect` waiting for its peer's real connection.
struct Waiting {
    vconn: ConnId,
    endpoint: EndpointId,
    tag: u64,
}

enum Peer {
    Dialing(Vec<Waiting>),
    Up(ConnId),
}

#[derive(Default)]
struct State {
    shut: bool,
    endpoints: HashMap<EndpointId, Arc<dyn NetHandler>>,
    next_endpoint: EndpointId,
    acceptor: Option<EndpointId>,
    /// Endpoints that accept the channels of one database each (a node's
    /// hosted leaders taking their replicas), before the acceptor.
    db_acceptors: HashMap<DatabaseId, EndpointId>,
    /// Where the real transport listens, once it does.
    listening: Option<SocketAddr>,
    peers: HashMap<SocketAddr, Peer>,
    /// Real dials under way, by their tag.
    dials: HashMap<u64, SocketAddr>,
    next_tag: u64,
    conns: HashMap<ConnId, Real>,
    vconns: HashMap<ConnId, Route>,
    /// Endpoints that were `drained` and await `drains_done`.
    pending_done: HashSet<EndpointId>,
}

struct Inner {
    real: OnceLock<Arc<dyn Transport>>,
    state: Mutex<State>,
    limits: Limits,
    stats: MuxStats,
    next_vconn: AtomicU64,
    /// Reports caused by callers' threads run on the notifier thread.
    notify: Mutex<Option<mpsc::Sender<Vec<Event>>>>,
}

/// See the module docs. Cloning shares the mux.
#[derive(Clone)]
pub struct Mux {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Mux {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mux")
            .field("stats", &self.snapshot())
            .finish()
    }
}

impl Mux {
    /// Opens the real transport ([`super::open`]: `backend`, `key`) and
    /// the notifier thread.
    pub fn open(backend: Backend, key: Option<ClusterKey>, limits: Limits) -> io::Result<Mux> {
        let (tx, rx) = mpsc::channel::<Vec<Event>>();
        std::thread::Builder::new()
            .name("walrelay-mux".into())
            .spawn(move || {
                while let Ok(events) = rx.recv() {
                    run(events);
                }
            })?;
        let inner = Arc::new(Inner {
            real: OnceLock::new(),
            state: Mutex::new(State {
                next_endpoint: 1,
                next_tag: 1,
                ..State::default()
            }),
            limits,
            stats: MuxStats::default(),
            next_vconn: AtomicU64::new(1),
            notify: Mutex::new(Some(tx)),
        });
        let handler = Arc::new(recv::RealHandler {
            inner: Arc::downgrade(&inner),
        });
        let real = super::open(backend, handler, key)?;
        let _ = inner.real.set(real);
        Ok(Mux { inner })
    }

    /// A transport whose connections are channels of this mux, reporting
    /// to `handler`.
    pub fn endpoint(&self, handler: Arc<dyn NetHandler>) -> Arc<dyn Transport> {
        self.make_endpoint(handler, None)
    }

    /// An endpoint that accepts the channels (and unmultiplexed
    /// connections) whose handshake names `database`: its `listen` makes
    /// the mux listen (once, on the first such address; later calls return
    /// where it listens) and registers it for that database only, so many
    /// databases' leaders take their replicas on one port. A second
    /// endpoint for the same database replaces the first.
    pub fn database_endpoint(
        &self,
        handler: Arc<dyn NetHandler>,
        database: DatabaseId,
    ) -> Arc<dyn Transport> {
        self.make_endpoint(handler, Some(database))
    }

    fn make_endpoint(
        &self,
        handler: Arc<dyn NetHandler>,
        database: Option<DatabaseId>,
    ) -> Arc<dyn Transport> {
        let id = {
            let mut st = self.inner.state.lock();
            let id = st.next_endpoint;
            st.next_endpoint += 1;
            if !st.shut {
                st.endpoints.insert(id, handler);
            }
            id
        };
        Arc::new(endpoint::Endpoint {
            inner: Arc::clone(&self.inner),
            id,
            database,
        })
    }

    /// "std" or "io_uring".
    pub fn backend(&self) -> &'static str {
        self.inner.transport().backend()
    }

    pub fn stats(&self) -> &MuxStats {
        &self.inner.stats
    }

    pub fn snapshot(&self) -> MuxSnapshot {
        self.inner.snapshot()
    }

    /// Stops everything: every connection, the listeners, the threads.
    /// Handlers are not told. Idempotent.
    pub fn shutdown(&self) {
        self.inner.shutdown();
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(t) = self.real.get() {
            t.shutdown();
        }
    }
}

impl Inner {
    fn transport(&self) -> &Arc<dyn Transport> {
        self.real.get().expect("the real transport is set at open")
    }

    fn snapshot(&self) -> MuxSnapshot {
        let (connections, channels) = {
            let st = self.state.lock();
            (st.conns.len(), st.vconns.len())
        };
        let s = &self.stats;
        MuxSnapshot {
            connections,
            channels,
            dials: s.dials.load(Ordering::Relaxed),
            connections_accepted: s.connections_accepted.load(Ordering::Relaxed),
            channels_opened: s.channels_opened.load(Ordering::Relaxed),
            channels_closed: s.channels_closed.load(Ordering::Relaxed),
            refusals: s.refusals.load(Ordering::Relaxed),
        }
    }

    fn shutdown(&self) {
        // Handlers are dropped after the lock is released: a handler's
        // last reference may hold an endpoint, whose drop takes the lock.
        let _handlers = {
            let mut st = self.state.lock();
            st.shut = true;
            let handlers = std::mem::take(&mut st.endpoints);
            st.acceptor = None;
            st.peers.clear();
            st.dials.clear();
            st.conns.clear();
            st.vconns.clear();
            st.pending_done.clear();
            handlers
        };
        if let Some(t) = self.real.get() {
            t.shutdown();
        }
        self.notify.lock().take();
    }

    /// Runs `events` on the notifier thread (the caller may hold locks).
    fn defer(&self, events: Vec<Event>) {
        if events.is_empty() {
            return;
        }
        if let Some(tx) = self.notify.lock().as_ref() {
            let _ = tx.send(events);
        }
    }

    fn refused(&self, error: &MuxError) {
        self.stats.refusals.fetch_add(1, Ordering::Relaxed);
        match error {
            // A channel for a database nobody here takes now (a fleet
            // database closed while idle, its replicas still redialing):
            // routine, and it repeats at the peers' redial rate.
            MuxError::NoAcceptor { .. } => tracing::debug!(%error, "mux refusal"),
            _ => tracing::warn!(%error, "mux refusal"),
        }
    }

    fn send_ctl(&self, real: ConnId, channel: ChannelId, database: DatabaseId, op: MuxOp) {
        self.transport().send(
            real,
            &Message::Mux(MuxFrame {
                channel,
                database,
                op,
            }),
        );
    }

    /// Sends what the scheduler of `real` lets go now.
    fn pump(&self, st: &mut State, real: ConnId, events: &mut Vec<Event>) {
        loop {
            let Some(conn) = st.conns.get_mut(&real) else {
                return;
            };
            let Some(out) = conn.sched.next_out() else {
                return;
            };
            match out {
                Out::Data {
                    channel,
                    database,
                    message,
                } => self.send_ctl(real, channel, database, MuxOp::Data(Box::new(message))),
                Out::Close { channel, database } => {
                    self.send_ctl(real, channel, database, MuxOp::Close(CloseReason::Closed));
                    self.forget(st, real, channel, None, events);
                }
            }
        }
    }

    /// Removes `channel` of `real` (already out of the scheduler or not)
    /// and, with `report`, tells its handler it closed.
    fn forget(
        &self,
        st: &mut State,
        real: ConnId,
        channel: ChannelId,
        report: Option<Option<String>>,
        events: &mut Vec<Event>,
    ) {
        let Some(conn) = st.conns.get_mut(&real) else {
            return;
        };
        conn.sched.remove(channel);
        let Some(chan) = conn.chans.remove(&channel) else {
            return;
        };
        st.vconns.remove(&chan.vconn);
        self.stats.channels_closed.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(real, %channel, vconn = chan.vconn, "mux channel closed");
        if let (Some(why), Some(h)) = (report, st.endpoints.get(&chan.endpoint)) {
            events.push(Event::Closed(Arc::clone(h), chan.vconn, why));
        }
    }

    /// Closes `channel` at once for `error`: the peer is told why, the
    /// handler too.
    fn refuse_channel(
        &self,
        st: &mut State,
        real: ConnId,
        channel: ChannelId,
        error: &MuxError,
        events: &mut Vec<Event>,
    ) {
        self.refused(error);
        if let Some(conn) = st.conns.get_mut(&real)
            && let Some(database) = conn.sched.remove(channel)
        {
            self.send_ctl(real, channel, database, MuxOp::Close(error.close_reason()));
        }
        self.forget(st, real, channel, Some(Some(error.to_string())), events);
    }

    /// Closes a real connection that broke the protocol; its `closed`
    /// then reports every channel on it.
    fn refuse_connection(&self, st: &mut State, real: ConnId, error: &MuxError) {
        self.refused(error);
        if let Some(conn) = st.conns.get_mut(&real) {
            conn.refused = true;
        }
        self.transport().close(real);
    }

    /// A new virtual connection id.
    fn vconn(&self) -> ConnId {
        self.next_vconn.fetch_add(1, Ordering::Relaxed)
    }

    /// Opens channels for `waiting` on the dialed connection `real`;
    /// `deferred`: their reports go through the notifier.
    fn attach(
        &self,
        st: &mut State,
        real: ConnId,
        waiting: Vec<Waiting>,
        deferred: bool,
        events: &mut Vec<Event>,
    ) {
        for w in waiting {
            let Some(h) = st.endpoints.get(&w.endpoint).cloned() else {
                continue;
            };
            let Some(conn) = st.conns.get_mut(&real) else {
                events.push(Event::ConnectFailed(
                    h,
                    w.tag,
                    io::Error::new(io::ErrorKind::ConnectionAborted, "connection lost"),
                ));
                continue;
            };
            let channel = ChannelId(conn.next_channel);
            conn.next_channel += 1;
            conn.chans.insert(
                channel,
                Chan {
                    vconn: w.vconn,
                    endpoint: w.endpoint,
                    opened: false,
                    deferred,
                },
            );
            st.vconns.insert(
                w.vconn,
                Route {
                    endpoint: w.endpoint,
                    real,
                    channel: Some(channel),
                },
            );
            self.stats.channels_opened.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(real, %channel, vconn = w.vconn, "mux channel connected");
            events.push(Event::Connected(h, w.vconn, w.tag));
        }
    }
}

#[cfg(test)]
#[path = "mux_tests.rs"]
mod tests;
