//! The mux as the real transport's handler: routes what arrives on a real
//! connection to the channels' endpoints, returns credit, passes `drained`
//! and `drains_done` on, and reports every channel of a lost connection.

use super::{Chan, Event, Inner, Kind, Mode, MuxError, Peer, Real, Route, run};
use crate::net::mux_wire::{ChannelId, MuxFrame, MuxOp, charge};
use crate::net::{ConnId, NetHandler};
use crate::wire::Message;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

pub(super) struct RealHandler {
    pub(super) inner: Weak<Inner>,
}

/// A message to hand over once the lock is released.
struct Delivery {
    handler: Arc<dyn NetHandler>,
    vconn: ConnId,
    /// The channel and the credit to count once handed (None: raw).
    credit: Option<(ChannelId, u64)>,
    message: Message,
}

impl NetHandler for RealHandler {
    fn accepted(&self, real: ConnId, from: SocketAddr) {
        let Some(inner) = self.inner.upgrade() else {
            return;
        };
        let mut st = inner.state.lock();
        if st.shut {
            drop(st);
            inner.transport().close(real);
            return;
        }
        inner
            .stats
            .connections_accepted
            .fetch_add(1, Ordering::Relaxed);
        tracing::info!(real, %from, "mux connection accepted");
        st.conns.insert(
            real,
            Real::new(
                Kind::Accepted {
                    from,
                    mode: Mode::Unknown,
                },
                inner.limits,
            ),
        );
    }

    fn connected(&self, real: ConnId, tag: u64) {
        let Some(inner) = self.inner.upgrade() else {
            return;
        };
        let mut events = Vec::new();
        {
            let mut st = inner.state.lock();
            let addr = st.dials.remove(&tag);
            let waiting = match addr.and_then(|a| st.peers.get(&a).map(|p| (a, p))) {
                Some((a, Peer::Dialing(_))) if !st.shut => {
                    match st.peers.insert(a, Peer::Up(real)) {
                        Some(Peer::Dialing(w)) => Some((a, w)),
                        _ => None,
                    }
                }
                _ => None,
            };
            let Some((addr, waiting)) = waiting else {
                drop(st);
                inner.transport().close(real);
                return;
            };
            tracing::info!(real, %addr, "mux connection dialed");
            st.conns
                .insert(real, Real::new(Kind::Dialed(addr), inner.limits));
            inner.attach(&mut st, real, waiting, false, &mut events);
        }
        run(events);
    }

    fn connect_failed(&self, tag: u64, error: io::Error) {
        let Some(inner) = self.inner.upgrade() else {
            return;
        };
        let mut events = Vec::new();
        {
            let mut st = inner.state.lock();
            let Some(addr) = st.dials.remove(&tag) else {
                return;
            };
            tracing::debug!(%addr, %error, "mux dial failed");
            if let Some(Peer::Dialing(waiting)) = st.peers.remove(&addr) {
                for w in waiting {
                    if let Some(h) = st.endpoints.get(&w.endpoint) {
                        let e = io::Error::new(error.kind(), error.to_string());
                        events.push(Event::ConnectFailed(Arc::clone(h), w.tag, e));
                    }
                }
            }
        }
        run(events);
    }

    fn message(&self, real: ConnId, message: Message) {
        let Some(inner) = self.inner.upgrade() else {
            return;
        };
        let mut events = Vec::new();
        let delivery = {
            let mut st = inner.state.lock();
            inner.route(&mut st, real, message, &mut events)
        };
        run(events);
        let Some(d) = delivery else {
            return;
        };
        d.handler.message(d.vconn, d.message);
        let mut st = inner.state.lock();
        let Some(conn) = st.conns.get_mut(&real) else {
            return;
        };
        match d.credit {
            Some((channel, n)) => {
                conn.sched.handed(channel, n);
                if !conn.touched.contains(&channel) {
                    conn.touched.push(channel);
                }
            }
            None => conn.raw_touched = true,
        }
    }

    fn drained(&self, real: ConnId) {
        let Some(inner) = self.inner.upgrade() else {
            return;
        };
        let mut drained: Vec<(Arc<dyn NetHandler>, ConnId)> = Vec::new();
        {
            let mut st = inner.state.lock();
            let st = &mut *st;
            let Some(conn) = st.conns.get_mut(&real) else {
                return;
            };
            let touched = std::mem::take(&mut conn.touched);
            let mut hit = Vec::new();
            for channel in touched {
                let Some(database) = conn.sched.database(channel) else {
                    continue;
                };
                if let Some(n) = conn.sched.take_credit(channel) {
                    inner.send_ctl(real, channel, database, MuxOp::Credit(n));
                }
                if let Some(chan) = conn.chans.get(&channel) {
                    hit.push((chan.endpoint, chan.vconn));
                }
            }
            if std::mem::take(&mut conn.raw_touched)
                && let Kind::Accepted {
                    mode: Mode::Raw(vconn, endpoint),
                    ..
                } = conn.kind
            {
                hit.push((endpoint, vconn));
            }
            for (endpoint, vconn) in hit {
                if let Some(h) = st.endpoints.get(&endpoint) {
                    drained.push((Arc::clone(h), vconn));
                    st.pending_done.insert(endpoint);
                }
            }
        }
        for (h, vconn) in drained {
            h.drained(vconn);
        }
    }

    fn drains_done(&self) {
        let Some(inner) = self.inner.upgrade() else {
            return;
        };
        let handlers: Vec<Arc<dyn NetHandler>> = {
            let mut st = inner.state.lock();
            let done: Vec<u64> = st.pending_done.drain().collect();
            done.iter()
                .filter_map(|e| st.endpoints.get(e).cloned())
                .collect()
        };
        for h in handlers {
            h.drains_done();
        }
    }

    fn closed(&self, real: ConnId, error: Option<String>) {
        let Some(inner) = self.inner.upgrade() else {
            return;
        };
        let mut events = Vec::new();
        {
            let mut st = inner.state.lock();
            let Some(conn) = st.conns.remove(&real) else {
                return;
            };
            let why = MuxError::ConnectionLost(error.unwrap_or_else(|| "closed".into()));
            tracing::info!(real, channels = conn.chans.len(), %why, "mux connection gone");
            match conn.kind {
                Kind::Dialed(addr) => {
                    if matches!(st.peers.get(&addr), Some(Peer::Up(r)) if *r == real) {
                        st.peers.remove(&addr);
                    }
                }
                Kind::Accepted {
                    mode: Mode::Raw(vconn, endpoint),
                    ..
                } => {
                    st.vconns.remove(&vconn);
                    inner.stats.channels_closed.fetch_add(1, Ordering::Relaxed);
                    if let Some(h) = st.endpoints.get(&endpoint) {
                        events.push(Event::Closed(Arc::clone(h), vconn, Some(why.to_string())));
                    }
                }
                Kind::Accepted { .. } => {}
            }
            let mut deferred = Vec::new();
            for (_, chan) in conn.chans {
                st.vconns.remove(&chan.vconn);
                inner.stats.channels_closed.fetch_add(1, Ordering::Relaxed);
                if let Some(h) = st.endpoints.get(&chan.endpoint) {
                    let e = Event::Closed(Arc::clone(h), chan.vconn, Some(why.to_string()));
                    if chan.deferred {
                        deferred.push(e);
                    } else {
                        events.push(e);
                    }
                }
            }
            // Queued behind their `connected`, still under the lock.
            inner.defer(deferred);
        }
        run(events);
    }
}

impl Inner {
    /// Where `message`, arriving on `real`, goes: a delivery, or nothing
    /// (a control frame, or refused).
    fn route(
        &self,
        st: &mut super::State,
        real: ConnId,
        message: Message,
        events: &mut Vec<Event>,
    ) -> Option<Delivery> {
        let conn = st.conns.get_mut(&real)?;
        if conn.refused {
            return None;
        }
        let is_mux = matches!(message, Message::Mux(_));
        match (&mut conn.kind, is_mux) {
            (Kind::Dialed(_), true) => {}
            (Kind::Accepted { mode, .. }, true) if matches!(mode, Mode::Unknown | Mode::Mux) => {
                *mode = Mode::Mux;
            }
            (Kind::Accepted { mode, .. }, false) if *mode != Mode::Mux => {
                return self.route_raw(st, real, message, events);
            }
            _ => {
                self.refuse_connection(st, real, &MuxError::Unmultiplexed);
                return None;
            }
        }
        let Message::Mux(frame) = message else {
            return None;
        };
        self.route_frame(st, real, frame, events)
    }

    /// A frame of an unmultiplexed peer: the first makes it a virtual
    /// connection of the acceptor.
    fn route_raw(
        &self,
        st: &mut super::State,
        real: ConnId,
        message: Message,
        events: &mut Vec<Event>,
    ) -> Option<Delivery> {
        // A database's own acceptor takes it when its handshake names one.
        let acceptor = match &message {
            Message::Handshake { database, .. } => st.db_acceptors.get(database).copied(),
            _ => None,
        }
        .or(st.acceptor);
        let conn = st.conns.get_mut(&real)?;
        let Kind::Accepted { from, mode } = &mut conn.kind else {
            return None;
        };
        let (vconn, endpoint) = match *mode {
            Mode::Raw(v, e) => (v, e),
            _ => {
                let from = *from;
                let Some(endpoint) = acceptor else {
                    *mode = Mode::Mux; // nothing more of it is delivered
                    conn.refused = true;
                    self.transport().close(real);
                    return None;
                };
                let vconn = self.vconn();
                *mode = Mode::Raw(vconn, endpoint);
                st.vconns.insert(
                    vconn,
                    Route {
                        endpoint,
                        real,
                        channel: None,
                    },
                );
                self.stats.channels_opened.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(real, vconn, %from, "an unmultiplexed peer, served as one virtual connection");
                let h = st.endpoints.get(&endpoint)?;
                events.push(Event::Accepted(Arc::clone(h), vconn, from));
                (vconn, endpoint)
            }
        };
        let handler = st.endpoints.get(&endpoint)?.clone();
        Some(Delivery {
            handler,
            vconn,
            credit: None,
            message,
        })
    }

    fn route_frame(
        &self,
        st: &mut super::State,
        real: ConnId,
        frame: MuxFrame,
        events: &mut Vec<Event>,
    ) -> Option<Delivery> {
        let MuxFrame {
            channel,
            database,
            op,
        } = frame;
        let acceptor = st.db_acceptors.get(&database).copied().or(st.acceptor);
        let conn = st.conns.get_mut(&real)?;
        let dialed = matches!(conn.kind, Kind::Dialed(_));
        if let MuxOp::Open = op {
            if dialed {
                self.refuse_connection(st, real, &MuxError::OpenOnDialed { channel });
                return None;
            }
            if channel.0 < conn.next_channel {
                self.refuse_connection(st, real, &MuxError::DuplicateChannel { channel });
                return None;
            }
            conn.next_channel = channel.0 + 1;
            let endpoint = acceptor.filter(|e| st.endpoints.contains_key(e));
            let refusal = match endpoint {
                None => Some(MuxError::NoAcceptor { channel, database }),
                Some(_) if conn.chans.len() >= self.limits.max_channels => {
                    Some(MuxError::TooManyChannels {
                        channel,
                        database,
                        limit: self.limits.max_channels,
                    })
                }
                Some(_) => None,
            };
            let (Some(endpoint), None) = (endpoint, &refusal) else {
                let error = refusal.unwrap_or(MuxError::NoAcceptor { channel, database });
                self.refused(&error);
                self.send_ctl(real, channel, database, MuxOp::Close(error.close_reason()));
                return None;
            };
            let from = match conn.kind {
                Kind::Accepted { from, .. } => from,
                Kind::Dialed(a) => a,
            };
            let vconn = self.vconn();
            conn.sched.open(channel, database);
            conn.chans.insert(
                channel,
                Chan {
                    vconn,
                    endpoint,
                    opened: true,
                    deferred: false,
                },
            );
            st.vconns.insert(
                vconn,
                Route {
                    endpoint,
                    real,
                    channel: Some(channel),
                },
            );
            self.stats.channels_opened.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(real, %channel, %database, vconn, "mux channel accepted");
            let h = st.endpoints.get(&endpoint)?;
            events.push(Event::Accepted(Arc::clone(h), vconn, from));
            return None;
        }
        let Some(expected) = conn.sched.database(channel) else {
            // A channel closed meanwhile (its id was used): frames in
            // flight are dropped. One never opened breaks the stream.
            if channel.0 == 0 || channel.0 >= conn.next_channel {
                self.refuse_connection(st, real, &MuxError::UnknownChannel { channel });
            }
            return None;
        };
        if expected != database {
            let error = MuxError::WrongDatabase {
                channel,
                expected,
                got: database,
            };
            self.refuse_channel(st, real, channel, &error, events);
            return None;
        }
        match op {
            MuxOp::Open => None,
            MuxOp::Credit(n) => {
                conn.sched.credit(channel, n);
                self.pump(st, real, events);
                None
            }
            MuxOp::Close(reason) => {
                tracing::debug!(real, %channel, ?reason, "mux channel closed by the peer");
                let why = match reason {
                    crate::net::mux_wire::CloseReason::Closed => None,
                    r => Some(MuxError::PeerClosed(r).to_string()),
                };
                self.forget(st, real, channel, Some(why), events);
                None
            }
            MuxOp::Data(message) => {
                let n = charge(&message);
                if let Err(error) = conn.sched.received(channel, n) {
                    self.refuse_channel(st, real, channel, &error, events);
                    return None;
                }
                if conn.sched.is_closing(channel) {
                    // `close` was called: deliver nothing more.
                    conn.sched.handed(channel, n);
                    return None;
                }
                let chan = conn.chans.get(&channel)?;
                let (vconn, endpoint) = (chan.vconn, chan.endpoint);
                let handler = st.endpoints.get(&endpoint)?.clone();
                Some(Delivery {
                    handler,
                    vconn,
                    credit: Some((channel, n)),
                    message: *message,
                })
            }
        }
    }
}
