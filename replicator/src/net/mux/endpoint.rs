//! An endpoint: what one user of a mux sees as its transport.

use super::{EndpointId, Event, Inner, MuxError, Peer, Route, Waiting};
use crate::net::mux_wire::{ChannelId, CloseReason, MuxOp};
use crate::net::{ConnId, Transport};
use crate::wire::Message;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

pub(super) struct Endpoint {
    pub(super) inner: Arc<Inner>,
    pub(super) id: EndpointId,
    /// Accepts this database's channels only ([`super::Mux::database_endpoint`]).
    pub(super) database: Option<crate::ids::DatabaseId>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MuxEndpoint").field("id", &self.id).finish()
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl Endpoint {
    /// The route of `vconn` if it is this endpoint's.
    fn route(&self, st: &super::State, vconn: ConnId) -> Option<Route> {
        st.vconns
            .get(&vconn)
            .copied()
            .filter(|r| r.endpoint == self.id)
    }
}

impl Transport for Endpoint {
    fn listen(&self, addr: SocketAddr) -> io::Result<SocketAddr> {
        if let Some(database) = self.database {
            let mut st = self.inner.state.lock();
            if st.shut || !st.endpoints.contains_key(&self.id) {
                return Err(io::Error::other("the mux endpoint was shut down"));
            }
            let at = match st.listening {
                Some(at) => at,
                None => {
                    let at = self.inner.transport().listen(addr)?;
                    st.listening = Some(at);
                    at
                }
            };
            st.db_acceptors.insert(database, self.id);
            return Ok(at);
        }
        {
            let mut st = self.inner.state.lock();
            if st.shut || !st.endpoints.contains_key(&self.id) {
                return Err(io::Error::other("the mux endpoint was shut down"));
            }
            match st.acceptor {
                Some(e) if e != self.id => {
                    return Err(io::Error::new(
                        io::ErrorKind::AddrInUse,
                        "another endpoint of this mux accepts its channels",
                    ));
                }
                _ => st.acceptor = Some(self.id),
            }
        }
        self.inner.transport().listen(addr)
    }

    fn connect(&self, addr: SocketAddr, tag: u64) {
        let mut events = Vec::new();
        let dial = {
            let mut st = self.inner.state.lock();
            if st.shut || !st.endpoints.contains_key(&self.id) {
                return;
            }
            let waiting = Waiting {
                vconn: self.inner.vconn(),
                endpoint: self.id,
                tag,
            };
            match st.peers.get_mut(&addr) {
                Some(Peer::Up(real)) => {
                    let real = *real;
                    self.inner
                        .attach(&mut st, real, vec![waiting], true, &mut events);
                    // Queued under the lock: a `closed` of the connection
                    // is queued behind it.
                    self.inner.defer(std::mem::take(&mut events));
                    None
                }
                Some(Peer::Dialing(w)) => {
                    w.push(waiting);
                    None
                }
                None => {
                    let t = st.next_tag;
                    st.next_tag += 1;
                    st.dials.insert(t, addr);
                    st.peers.insert(addr, Peer::Dialing(vec![waiting]));
                    self.inner.stats.dials.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(%addr, "mux dialing");
                    Some(t)
                }
            }
        };
        self.inner.defer(events);
        if let Some(t) = dial {
            self.inner.transport().connect(addr, t);
        }
    }

    fn send(&self, vconn: ConnId, message: &Message) {
        let mut events: Vec<Event> = Vec::new();
        {
            let mut st = self.inner.state.lock();
            let Some(route) = self.route(&st, vconn) else {
                return;
            };
            let Some(mut channel) = route.channel else {
                self.inner.transport().send(route.real, message);
                return;
            };
            let real = route.real;
            let state = &mut *st;
            let Some(conn) = state.conns.get_mut(&real) else {
                return;
            };
            let Some(chan) = conn.chans.get(&channel) else {
                return;
            };
            if !chan.opened {
                // The first message opens the channel for the database its
                // handshake names.
                let Message::Handshake { database, .. } = message else {
                    let error = MuxError::NotIntroduced;
                    self.inner.refused(&error);
                    self.inner.forget(
                        &mut st,
                        real,
                        channel,
                        Some(Some(error.to_string())),
                        &mut events,
                    );
                    drop(st);
                    self.inner.defer(events);
                    return;
                };
                // Opened under a fresh id: the peer sees channel ids
                // opened in increasing order (whichever channel of the
                // connection speaks first).
                let opened = ChannelId(conn.next_channel);
                conn.next_channel += 1;
                if let Some(mut chan) = conn.chans.remove(&channel) {
                    chan.opened = true;
                    conn.chans.insert(opened, chan);
                }
                if let Some(r) = state.vconns.get_mut(&vconn) {
                    r.channel = Some(opened);
                }
                channel = opened;
                conn.sched.open(channel, *database);
                self.inner.send_ctl(real, channel, *database, MuxOp::Open);
                tracing::debug!(real, %channel, database = %database, vconn, "mux channel opened");
            }
            // Each refusal closes a channel holding queued bytes (this one,
            // or the one holding the most), so this ends.
            while let Some(conn) = st.conns.get_mut(&real) {
                match conn.sched.enqueue(channel, message.clone()) {
                    Ok(()) => {
                        self.inner.pump(&mut st, real, &mut events);
                        break;
                    }
                    Err(error) => {
                        let worst = error.channel().unwrap_or(channel);
                        self.inner
                            .refuse_channel(&mut st, real, worst, &error, &mut events);
                        if worst == channel {
                            break;
                        }
                    }
                }
            }
        }
        self.inner.defer(events);
    }

    fn close(&self, vconn: ConnId) {
        let mut events = Vec::new();
        {
            let mut st = self.inner.state.lock();
            let Some(route) = self.route(&st, vconn) else {
                return;
            };
            let real = route.real;
            let Some(channel) = route.channel else {
                // An unmultiplexed peer: its connection is its own; the
                // real `closed` reports it.
                self.inner.transport().close(real);
                return;
            };
            let Some(conn) = st.conns.get_mut(&real) else {
                return;
            };
            let opened = conn.chans.get(&channel).is_some_and(|c| c.opened);
            if !opened {
                self.inner
                    .forget(&mut st, real, channel, Some(None), &mut events);
            } else if let Some(database) = conn.sched.close(channel) {
                self.inner
                    .send_ctl(real, channel, database, MuxOp::Close(CloseReason::Closed));
                self.inner
                    .forget(&mut st, real, channel, Some(None), &mut events);
            } else {
                // Closes after what it queued ([`super::sched::Out::Close`]).
                self.inner.pump(&mut st, real, &mut events);
            }
        }
        self.inner.defer(events);
    }

    fn backend(&self) -> &'static str {
        self.inner.transport().backend()
    }

    fn auth_refusals(&self) -> u64 {
        self.inner.transport().auth_refusals()
    }

    /// Closes this endpoint's channels (the peer is told; the handler is
    /// not) and forgets its handler; the shared connections stay.
    fn shutdown(&self) {
        let mut st = self.inner.state.lock();
        // Dropped once the lock is released (see `Inner::shutdown`).
        let Some(_handler) = st.endpoints.remove(&self.id) else {
            return;
        };
        if st.acceptor == Some(self.id) {
            st.acceptor = None;
        }
        if let Some(d) = self.database
            && st.db_acceptors.get(&d) == Some(&self.id)
        {
            st.db_acceptors.remove(&d);
        }
        st.pending_done.remove(&self.id);
        for peer in st.peers.values_mut() {
            if let Peer::Dialing(w) = peer {
                w.retain(|w| w.endpoint != self.id);
            }
        }
        let mine: Vec<(ConnId, Route)> = st
            .vconns
            .iter()
            .filter(|(_, r)| r.endpoint == self.id)
            .map(|(v, r)| (*v, *r))
            .collect();
        let mut none = Vec::new();
        for (vconn, route) in mine {
            match route.channel {
                None => {
                    st.vconns.remove(&vconn);
                    if let Some(conn) = st.conns.get_mut(&route.real) {
                        conn.refused = true;
                    }
                    self.inner.transport().close(route.real);
                }
                Some(channel) => {
                    if let Some(conn) = st.conns.get_mut(&route.real)
                        && let Some(database) = conn.sched.remove(channel)
                    {
                        self.inner.send_ctl(
                            route.real,
                            channel,
                            database,
                            MuxOp::Close(CloseReason::Closed),
                        );
                    }
                    self.inner
                        .forget(&mut st, route.real, channel, None, &mut none);
                }
            }
        }
        drop(st);
        tracing::debug!(endpoint = self.id, "mux endpoint shut down");
    }
}
