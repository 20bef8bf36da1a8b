//! The Linux transport: one thread owns an io_uring and does every socket
//! read, and every write a sender cannot make at once, through it, many
//! requests per `io_uring_enter`.
//!
//! Other threads never block on a connected socket and never call the
//! handler: `close` posts a command to an inbox and wakes the ring (a byte
//! on a socket pair the ring always has a recv on); `send` writes the
//! frame into the socket itself with one non-blocking `sendmsg` when the
//! ring has nothing of that connection's to send, and posts it otherwise
//! (see [`outlet`]); `send_many` writes frames to several connections
//! that way with one system call (see [`batch`]), and several frames to
//! one connection (a lazy follower's batch) as one run, with one
//! `sendmsg` ([`outlet::Outlet::send_run`]). Accepting and dialing
//! are blocking, on their own threads as in [`super::std_net`]; the
//! socket is then handed to the ring.
//!
//! Each connection keeps one recv outstanding into its own buffer (frames
//! are split out of it, no copy) and at most one `sendmsg` of its queued
//! buffers (an Append's record is one of them, shared, not copied). A send
//! that makes no progress for [`super::WRITE_TIMEOUT`], or a queue past
//! [`super::MAX_QUEUED_BYTES`], closes the connection: a stalled peer cannot make
//! its sender's memory grow without bound. `close` lets what was already
//! sent go out first, then shuts the socket down.
//!
//! `accepted`, `connected` and `connect_failed` are called on the
//! accepting or dialing thread, everything else on the ring thread: a slow
//! handler (a follower's sync) delays every connection of its transport.
//!
//! The ring thread and its connections live in `ring.rs`; see there for
//! what keeps its requests sound.

mod batch;
mod outlet;
mod ring;
#[cfg(test)]
mod tests;

use super::CONNECT_TIMEOUT;
use super::auth::{Auth, Opener, Session};
use super::{ConnId, NetHandler, Transport};
use crate::wire::{Message, encode_parts};
use bytes::Bytes;
use outlet::{Outlet, Parts, Sent};
use parking_lot::{Mutex, RwLock};
use ring::{Ring, new_ring};
use std::collections::HashMap;
use std::io::{self, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::ThreadId;

/// What other threads ask of the ring thread.
enum Cmd {
    /// A connected (and, under a key, authenticated) socket; writes may
    /// start, reads wait for `Start` (the handler learns of the connection
    /// first).
    Add(ConnId, TcpStream, Option<Opener>, Arc<Outlet>),
    Start(ConnId),
    /// A frame, sealed (header, shared record, tag), or the rest of one
    /// the socket took only in part; parts may be empty.
    Send(ConnId, Parts),
    Close(ConnId),
    Fail(ConnId, String),
    /// Reported from the ring thread: the caller of `connect` may hold
    /// locks the handler takes.
    ConnectFailed(u64, io::Error),
    Stop,
}

struct Inbox {
    cmds: Vec<Cmd>,
    /// A wake-up byte was written and the ring has not drained since.
    woken: bool,
    /// Set once the ring stops taking commands, with the reason.
    shut: Option<String>,
}

struct Shared {
    handler: Arc<dyn NetHandler>,
    auth: Arc<Auth>,
    next: AtomicU64,
    inbox: Mutex<Inbox>,
    /// Write end of the wake-up pair (non-blocking).
    waker: UnixStream,
    ring_thread: OnceLock<ThreadId>,
    /// Each connection's sending side, from its registration until the
    /// ring drops it.
    outlets: RwLock<HashMap<ConnId, Arc<Outlet>>>,
}

impl Shared {
    /// Queues `cmd` for the ring thread; `Err` (the reason) once it stopped.
    fn post(&self, cmd: Cmd) -> Result<(), String> {
        // The ring thread drains the inbox before it waits again: posting
        // from its own handler calls needs no wake-up.
        let on_ring = self.on_ring();
        let wake = {
            let mut inbox = self.inbox.lock();
            if let Some(why) = &inbox.shut {
                return Err(why.clone());
            }
            inbox.cmds.push(cmd);
            let wake = !on_ring && !inbox.woken;
            inbox.woken |= wake;
            wake
        };
        if wake {
            self.wake();
        }
        Ok(())
    }

    fn on_ring(&self) -> bool {
        self.ring_thread.get() == Some(&std::thread::current().id())
    }

    fn wake(&self) {
        // WouldBlock means the pair is full: a wake-up is pending anyway.
        let _ = (&self.waker).write(&[1]);
    }

    fn register(&self, stream: TcpStream, session: Option<Session>) -> io::Result<ConnId> {
        stream.set_nodelay(true)?;
        let conn = self.next.fetch_add(1, Ordering::Relaxed);
        let (seal, open) = match session {
            Some(s) => (Some(s.seal), Some(s.open)),
            None => (None, None),
        };
        let outlet = Arc::new(Outlet::new(stream.try_clone()?, seal));
        self.outlets.write().insert(conn, Arc::clone(&outlet));
        if let Err(why) = self.post(Cmd::Add(conn, stream, open, outlet)) {
            self.outlets.write().remove(&conn);
            return Err(io::Error::other(why));
        }
        Ok(conn)
    }

    /// After the handler was told of `conn`: start reading it.
    fn start(&self, conn: ConnId) {
        if let Err(why) = self.post(Cmd::Start(conn)) {
            self.handler.closed(conn, Some(why));
        }
    }
}

/// See the module docs.
pub struct UringTransport {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for UringTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringTransport")
            .field("shut", &self.shared.inbox.lock().shut)
            .finish_non_exhaustive()
    }
}

impl UringTransport {
    /// Sets up the ring and starts its thread. Fails where io_uring is
    /// unusable (the `io_uring_disabled` sysctl, seccomp, a kernel before
    /// 5.6), so the caller can fall back to the std transport. Connections
    /// are authenticated with `auth`'s key, if it has one.
    pub fn new(handler: Arc<dyn NetHandler>, auth: Arc<Auth>) -> io::Result<UringTransport> {
        let (wake_rx, waker) = UnixStream::pair()?;
        waker.set_nonblocking(true)?;
        let shared = Arc::new(Shared {
            handler,
            auth,
            next: AtomicU64::new(1),
            inbox: Mutex::new(Inbox {
                cmds: Vec::new(),
                woken: false,
                shut: None,
            }),
            waker,
            ring_thread: OnceLock::new(),
            outlets: RwLock::new(HashMap::new()),
        });
        let for_ring = Arc::clone(&shared);
        // The ring is made on its own thread (its single issuer), which
        // says whether that worked before anything is posted to it.
        let (made_tx, made_rx) = std::sync::mpsc::sync_channel(1);
        std::thread::Builder::new()
            .name("walrelay-uring".into())
            .spawn(move || match new_ring() {
                Ok(ring) => {
                    let _ = made_tx.send(Ok(()));
                    Ring::new(ring, for_ring, wake_rx).run();
                }
                Err(e) => {
                    let _ = made_tx.send(Err(e));
                }
            })?;
        made_rx.recv().map_err(|_| {
            io::Error::other("the io_uring thread ended before its ring was made")
        })??;
        Ok(UringTransport { shared })
    }
}

impl UringTransport {
    /// Frames written directly by their senders and frames posted to the
    /// ring, summed over the open connections.
    #[cfg(test)]
    fn sent_counts(&self) -> (u64, u64) {
        self.shared
            .outlets
            .read()
            .values()
            .map(|o| o.counts())
            .fold((0, 0), |(d, r), (a, b)| (d + a, r + b))
    }
}

impl Drop for UringTransport {
    fn drop(&mut self) {
        self.stop();
    }
}

impl UringTransport {
    fn stop(&self) {
        {
            let mut inbox = self.shared.inbox.lock();
            if inbox.shut.is_some() {
                return;
            }
            inbox.shut = Some("transport stopped".into());
            inbox.cmds.push(Cmd::Stop);
        }
        self.shared.wake();
    }

    /// Sends each connection's messages of `sends` as one run, in their
    /// order ([`Outlet::send_run`]: one `sendmsg` for all of them where
    /// the socket takes them); connections one after another.
    fn send_runs(&self, sends: &[(ConnId, &Message)]) {
        let mut runs: Vec<(ConnId, Vec<&Message>)> = Vec::new();
        for &(conn, message) in sends {
            match runs.iter_mut().find(|(c, _)| *c == conn) {
                Some((_, run)) => run.push(message),
                None => runs.push((conn, vec![message])),
            }
        }
        for (conn, run) in runs {
            if let [message] = run[..] {
                self.send(conn, message);
                continue;
            }
            let mut frames = Vec::with_capacity(run.len());
            for message in run {
                match encode_parts(message) {
                    Ok(parts) => frames.push(parts),
                    Err(e) => {
                        // Nothing of the run is sent: its frames after this
                        // one must not pass it.
                        let _ = self.shared.post(Cmd::Fail(conn, e.to_string()));
                        frames.clear();
                        break;
                    }
                }
            }
            if frames.is_empty() {
                continue;
            }
            let Some(outlet) = self.shared.outlets.read().get(&conn).cloned() else {
                continue; // never registered, or already gone
            };
            let direct = !self.shared.on_ring();
            let post = |parts| self.shared.post(Cmd::Send(conn, parts)).is_ok();
            if let Sent::Failed(e) = outlet.send_run(frames, direct, post) {
                let _ = self.shared.post(Cmd::Fail(conn, e.to_string()));
            }
        }
    }
}

impl Transport for UringTransport {
    fn listen(&self, addr: SocketAddr) -> io::Result<SocketAddr> {
        let listener = TcpListener::bind(addr)?;
        let bound = listener.local_addr()?;
        let shared = Arc::clone(&self.shared);
        let auth = Arc::clone(&shared.auth);
        // Blocking accepts; the thread ends at the first connection after
        // the transport stopped.
        super::accept_in_background(listener, auth, move |stream, from, session| {
            match shared.register(stream, session) {
                Ok(conn) => {
                    // Announce before reading, so the handler knows the
                    // connection before its first message.
                    shared.handler.accepted(conn, from);
                    shared.start(conn);
                    true
                }
                Err(_) => shared.inbox.lock().shut.is_none(),
            }
        })?;
        Ok(bound)
    }

    fn connect(&self, addr: SocketAddr, tag: u64) {
        let shared = Arc::clone(&self.shared);
        let auth = Arc::clone(&shared.auth);
        let spawned = super::dial_in_background(addr, CONNECT_TIMEOUT, auth, move |dialed| {
            match dialed.and_then(|(s, session)| shared.register(s, session)) {
                Ok(conn) => {
                    shared.handler.connected(conn, tag);
                    shared.start(conn);
                }
                Err(e) => shared.handler.connect_failed(tag, e),
            }
        });
        if let Err(e) = spawned {
            let _ = self.shared.post(Cmd::ConnectFailed(tag, e));
        }
    }

    fn send(&self, conn: ConnId, message: &Message) {
        // An Append's record (also inside a channel frame) is shared,
        // not copied.
        let (head, body) = match encode_parts(message) {
            Ok(parts) => parts,
            Err(e) => {
                let _ = self.shared.post(Cmd::Fail(conn, e.to_string()));
                return;
            }
        };
        let Some(outlet) = self.shared.outlets.read().get(&conn).cloned() else {
            return; // never registered, or already gone
        };
        // The ring thread's own frames join its next submission.
        let direct = !self.shared.on_ring();
        let post = |parts| self.shared.post(Cmd::Send(conn, parts)).is_ok();
        if let Sent::Failed(e) = outlet.send(head, body, direct, post) {
            let _ = self.shared.post(Cmd::Fail(conn, e.to_string()));
        }
    }

    fn send_many(&self, sends: &[(ConnId, &Message)]) {
        // A connection twice in one batch would be sealed twice under one
        // lock: such a batch (never a record's fan-out) goes one by one.
        let distinct = || {
            sends
                .iter()
                .enumerate()
                .all(|(i, (c, _))| sends[..i].iter().all(|(d, _)| d != c))
        };
        if sends.len() < 2 || sends.len() > batch::MAX_BATCH || self.shared.on_ring() || !distinct()
        {
            self.send_runs(sends);
            return;
        }
        let mut outlets: Vec<(ConnId, Arc<Outlet>)> = Vec::with_capacity(sends.len());
        let mut payloads: Vec<Option<(Bytes, Bytes)>> = Vec::with_capacity(sends.len());
        {
            let registered = self.shared.outlets.read();
            for (conn, message) in sends {
                match encode_parts(message) {
                    Ok(parts) => {
                        if let Some(o) = registered.get(conn) {
                            outlets.push((*conn, Arc::clone(o)));
                            payloads.push(Some(parts));
                        }
                    }
                    Err(e) => {
                        let _ = self.shared.post(Cmd::Fail(*conn, e.to_string()));
                    }
                }
            }
        }
        // Sealed (and locked) in connection order, written in the given one.
        let mut order: Vec<usize> = (0..outlets.len()).collect();
        order.sort_unstable_by_key(|&i| outlets[i].0);
        let mut sealed: Vec<Option<outlet::Sealed<'_>>> =
            (0..outlets.len()).map(|_| None).collect();
        for &i in &order {
            let (head, body) = payloads[i].take().expect("each frame is sealed once");
            sealed[i] = outlets[i].1.seal(head, body, true);
        }
        let (at, live): (Vec<usize>, Vec<outlet::Sealed<'_>>) = sealed
            .into_iter()
            .enumerate()
            .filter_map(|(i, s)| s.map(|s| (i, s)))
            .unzip();
        let written = batch::write_all(&live);
        for ((i, frame), written) in at.into_iter().zip(live).zip(written) {
            let conn = outlets[i].0;
            let post = |parts| self.shared.post(Cmd::Send(conn, parts)).is_ok();
            if let Sent::Failed(e) = frame.finish(written, post) {
                let _ = self.shared.post(Cmd::Fail(conn, e.to_string()));
            }
        }
    }

    fn close(&self, conn: ConnId) {
        // Frames sent before this go out first; later ones are dropped.
        if let Some(outlet) = self.shared.outlets.read().get(&conn) {
            outlet.shut();
        }
        let _ = self.shared.post(Cmd::Close(conn));
    }

    fn backend(&self) -> &'static str {
        "io_uring"
    }

    fn auth_refusals(&self) -> u64 {
        self.shared.auth.refusals()
    }

    fn shutdown(&self) {
        self.stop();
    }
}
