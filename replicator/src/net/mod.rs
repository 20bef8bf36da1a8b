//! Transports: move framed [`Message`]s over TCP between nodes.
//!
//! # Contract
//!
//! A transport owns sockets and nothing else. It dials and accepts
//! connections, sends messages (an `Append` is written as a frame header
//! followed by the record's shared bytes, never a copy) and hands every
//! decoded message to a [`NetHandler`] on the transport's own threads. When
//! a read yields several messages, each is handed over and then
//! [`NetHandler::drained`] is called once: the point where a follower
//! issues one sync for everything that arrived together (group commit).
//!
//! Two implementations share this contract: [`std_net::StdTransport`]
//! (portable: blocking sockets, a reader and a writer thread per
//! connection, sends queued) and, on Linux, an io_uring transport. Which one runs
//! is chosen at run time ([`open`]).
//!
//! Sizes are checked before allocation: a frame longer than
//! [`crate::wire::MAX_FRAME_BYTES`] closes its connection.
//!
//! With a [`ClusterKey`] ([`open`]'s `key`), every connection is
//! authenticated before the handler hears of it, and every frame after
//! that carries a tag ([`auth`] holds that format). A connection whose
//! handshake or any tag fails is closed; no message of it reaches the
//! handler, and the refusal is counted ([`Transport::auth_refusals`]).

pub mod auth;
pub mod cluster_key;
pub mod mux;
pub mod mux_wire;
pub mod std_net;
#[cfg(target_os = "linux")]
pub mod uring_net;

pub use auth::Auth;
pub use cluster_key::{ClusterKey, KeyFileError};

use crate::wire::{FRAME_HEADER_BYTES, MAX_FRAME_BYTES, Message};
use auth::{Opener, Session, TAG_BYTES};
use bytes::{Buf, Bytes, BytesMut};
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// A connection, unique for the transport's lifetime.
pub type ConnId = u64;

/// Receives what happens on a transport's connections. Called from the
/// transport's threads; must not block for long (a follower's sync is the
/// exception: it is what paces a connection).
pub trait NetHandler: Send + Sync {
    /// An inbound connection was accepted.
    fn accepted(&self, conn: ConnId, from: SocketAddr);
    /// An outbound connection asked for with `tag` is up.
    fn connected(&self, conn: ConnId, tag: u64);
    /// An outbound connection asked for with `tag` could not be made.
    fn connect_failed(&self, tag: u64, error: io::Error);
    fn message(&self, conn: ConnId, message: Message);
    /// Every complete message of the last read was handed over.
    fn drained(&self, conn: ConnId) {
        let _ = conn;
    }
    /// Every `drained` of one round of reads was called: on io_uring once
    /// per batch of completions (however many connections it drained), on
    /// the std transport right after each `drained` (each connection reads
    /// on a thread of its own). A handler serving many databases issues
    /// their syncs together here (group commit across databases).
    fn drains_done(&self) {}
    /// The connection is gone (peer closed, error, bad frame, or `close`).
    fn closed(&self, conn: ConnId, error: Option<String>);
}

/// What every transport offers.
pub trait Transport: Send + Sync {
    /// Starts accepting on `addr`; returns the bound address.
    fn listen(&self, addr: SocketAddr) -> io::Result<SocketAddr>;
    /// Dials `addr` in the background; reports `connected` or
    /// `connect_failed` with `tag`.
    fn connect(&self, addr: SocketAddr, tag: u64);
    /// Sends one message. An error shuts the connection down; its reader
    /// then reports `closed`. Neither `send` nor `close` ever calls the
    /// handler on the caller's thread, so callers may hold their own locks
    /// (which the handler also takes) while calling them.
    fn send(&self, conn: ConnId, message: &Message);
    /// Sends each message to its connection, as [`Transport::send`] would
    /// one after another. A transport may write them all with one system
    /// call (a record's Appends to every peer).
    fn send_many(&self, sends: &[(ConnId, &Message)]) {
        for (conn, message) in sends {
            self.send(*conn, message);
        }
    }
    fn close(&self, conn: ConnId);
    /// "std" or "io_uring".
    fn backend(&self) -> &'static str;
    /// Connections and frames refused by authentication so far.
    fn auth_refusals(&self) -> u64;
    /// Stops the transport: every connection is shut down, nothing new is
    /// accepted or dialed, and its threads end (each dropping its handle on
    /// the handler, so a runtime that owns its transport can be freed).
    /// Idempotent.
    fn shutdown(&self);
}

/// A write that makes no progress this long closes its connection.
pub const WRITE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);
pub const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);
/// Bytes queued for one peer past which it is closed as not keeping up.
pub const MAX_QUEUED_BYTES: u64 = 256 << 20;
const READ_CHUNK: usize = 256 * 1024;

/// Hands every complete frame at the front of `buf` to `deliver` (both
/// transports' readers); returns whether any was handed over and whether
/// the stream is still sound. A frame's length is checked against
/// [`MAX_FRAME_BYTES`] first, and the buffer grows only as bytes arrive.
/// With an `opener` every frame must be followed by its valid tag before it
/// is even decoded.
pub(crate) fn split_frames(
    buf: &mut BytesMut,
    mut opener: Option<&mut Opener>,
    mut deliver: impl FnMut(Message),
) -> (bool, io::Result<()>) {
    let mut handed = false;
    loop {
        if buf.len() < FRAME_HEADER_BYTES {
            return (handed, Ok(()));
        }
        let len = u64::from(u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]])) + 4;
        if len > MAX_FRAME_BYTES {
            let e = io::Error::new(
                io::ErrorKind::InvalidData,
                format!("frame of {len} bytes exceeds the limit"),
            );
            return (handed, Err(e));
        }
        let tag = if opener.is_some() { TAG_BYTES } else { 0 };
        if (buf.len() as u64) < len + tag as u64 {
            // Grow only as bytes arrive: a header alone must not make
            // this side allocate the size it claims.
            return (handed, Ok(()));
        }
        if let Some(o) = opener.as_deref_mut() {
            let (frame, rest) = buf.split_at(len as usize);
            if let Err(e) = o.open(frame, &rest[..TAG_BYTES]) {
                return (handed, Err(io::Error::new(io::ErrorKind::InvalidData, e)));
            }
        }
        let frame: Bytes = buf.split_to(len as usize).freeze();
        buf.advance(tag);
        match Message::decode(&frame) {
            Ok((message, _)) => {
                deliver(message);
                handed = true;
            }
            Err(e) => {
                let e = io::Error::new(io::ErrorKind::InvalidData, e.to_string());
                return (handed, Err(e));
            }
        }
    }
}

/// Dials `addr` on a short-lived thread, so a slow connect never stalls
/// the caller, authenticates it with `auth` there, and hands the outcome
/// to `then`. Errs only if the thread cannot be started (`then` is then
/// never called).
pub(crate) fn dial_in_background(
    addr: SocketAddr,
    timeout: std::time::Duration,
    auth: Arc<Auth>,
    then: impl FnOnce(io::Result<(std::net::TcpStream, Option<Session>)>) + Send + 'static,
) -> io::Result<()> {
    std::thread::Builder::new()
        .name("walrelay-dial".into())
        .spawn(move || {
            let dialed = std::net::TcpStream::connect_timeout(&addr, timeout).and_then(|mut s| {
                let session = auth.dial(&mut s, addr).map_err(io::Error::other)?;
                Ok((s, session))
            });
            then(dialed)
        })
        .map(|_| ())
}

/// A pending-handshake slot, given back when dropped.
struct Slot(Arc<Auth>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.release();
    }
}

/// Accepts on `listener` from a thread of its own and hands each stream,
/// with its peer's address and, under a key, its session, to `on_stream`,
/// which returns false to stop accepting. Under a key each handshake runs
/// on a thread of its own (at most [`auth::MAX_PENDING_HANDSHAKES`] at
/// once), so a silent peer cannot hold up the others; a stream whose
/// handshake fails is closed without `on_stream` hearing of it.
pub(crate) fn accept_in_background(
    listener: std::net::TcpListener,
    auth: Arc<Auth>,
    on_stream: impl Fn(std::net::TcpStream, SocketAddr, Option<Session>) -> bool + Send + Sync + 'static,
) -> io::Result<()> {
    let on_stream = Arc::new(on_stream);
    let stop = Arc::new(AtomicBool::new(false));
    std::thread::Builder::new()
        .name("walrelay-accept".into())
        .spawn(move || {
            for stream in listener.incoming() {
                if stop.load(Ordering::Acquire) {
                    return;
                }
                let Ok(mut stream) = stream else {
                    // Out of descriptors (or similar): back off rather than
                    // spin on the same error.
                    std::thread::sleep(std::time::Duration::from_millis(10));
                    continue;
                };
                let from = stream
                    .peer_addr()
                    .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
                if !auth.enabled() {
                    if !on_stream(stream, from, None) {
                        return;
                    }
                    continue;
                }
                if !auth.reserve(from) {
                    continue; // dropped: closed
                }
                let slot = Slot(Arc::clone(&auth));
                let (on_stream, stop) = (Arc::clone(&on_stream), Arc::clone(&stop));
                // A failed spawn drops the closure, the slot and the stream.
                let _ = std::thread::Builder::new()
                    .name("walrelay-auth".into())
                    .spawn(move || {
                        let session = slot.0.accept(&mut stream, from);
                        drop(slot);
                        if let Ok(session) = session
                            && !on_stream(stream, from, session)
                        {
                            stop.store(true, Ordering::Release);
                        }
                    });
            }
        })
        .map(|_| ())
}

/// Which transport to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// io_uring where the kernel allows it, std otherwise.
    Auto,
    Std,
    IoUring,
}

/// Opens a transport delivering to `handler`. `Auto` picks io_uring when
/// it is available and std otherwise; `WALRELAY_NET=std` forces std. With
/// a `key` every connection is authenticated ([`auth`]); None runs the
/// replication ports open to anyone who can reach them.
pub fn open(
    backend: Backend,
    handler: Arc<dyn NetHandler>,
    key: Option<ClusterKey>,
) -> io::Result<Arc<dyn Transport>> {
    let forced_std = std::env::var("WALRELAY_NET").is_ok_and(|v| v == "std");
    let auth = Auth::new(key);
    let std_transport = |handler, auth| -> Arc<dyn Transport> {
        Arc::new(std_net::StdTransport::new(handler, auth))
    };
    match backend {
        Backend::Std => Ok(std_transport(handler, auth)),
        Backend::Auto if forced_std => Ok(std_transport(handler, auth)),
        #[cfg(target_os = "linux")]
        Backend::Auto => {
            match uring_net::UringTransport::new(Arc::clone(&handler), Arc::clone(&auth)) {
                Ok(t) => Ok(Arc::new(t)),
                // Refused by the kernel (sysctl, seccomp, too old): run portable.
                Err(_) => Ok(std_transport(handler, auth)),
            }
        }
        #[cfg(target_os = "linux")]
        Backend::IoUring => Ok(Arc::new(uring_net::UringTransport::new(handler, auth)?)),
        #[cfg(not(target_os = "linux"))]
        Backend::Auto => Ok(std_transport(handler, auth)),
        #[cfg(not(target_os = "linux"))]
        Backend::IoUring => Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "the io_uring transport is Linux-only",
        )),
    }
}
