//! The portable transport: blocking sockets, a reader and a writer thread
//! per connection. `send` only queues (it never blocks on a socket, so a
//! slow or stalled peer cannot stall a sender holding its locks, such as
//! a leader fanning out a commit); the writer drains the queue with
//! vectored writes. A queue over [`MAX_QUEUED_BYTES`] or a write stuck for
//! [`WRITE_TIMEOUT`] closes the connection.

use super::auth::{Auth, Opener, Sealer, Session};
use super::{
    CONNECT_TIMEOUT, ConnId, MAX_QUEUED_BYTES, NetHandler, READ_CHUNK, Transport, WRITE_TIMEOUT,
};
use crate::wire::{Message, encode_parts};
use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// What waits to be written to one peer.
#[derive(Default)]
struct Outbox {
    /// Frames, each as a header and a (possibly empty) shared body.
    queue: std::collections::VecDeque<[Bytes; 2]>,
    bytes: u64,
    /// `close` was called: write what is queued, then shut down.
    closing: bool,
    /// The connection is over: drop whatever is queued.
    dead: bool,
}

struct ConnState {
    stream: TcpStream,
    out: Mutex<Outbox>,
    ready: parking_lot::Condvar,
    /// The authenticated session, until the reader and writer take it.
    session: Mutex<Option<Session>>,
}

impl ConnState {
    fn kill(&self) {
        self.out.lock().dead = true;
        self.ready.notify_all();
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

struct Shared {
    handler: Arc<dyn NetHandler>,
    auth: Arc<Auth>,
    next: AtomicU64,
    conns: Mutex<HashMap<ConnId, Arc<ConnState>>>,
    /// `shutdown` was called: nothing new is registered.
    shut: std::sync::atomic::AtomicBool,
}

/// See the module docs.
pub struct StdTransport {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for StdTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StdTransport")
            .field("connections", &self.shared.conns.lock().len())
            .finish()
    }
}

impl StdTransport {
    /// A transport authenticating its connections with `auth`'s key, if
    /// it has one.
    pub fn new(handler: Arc<dyn NetHandler>, auth: Arc<Auth>) -> StdTransport {
        StdTransport {
            shared: Arc::new(Shared {
                handler,
                auth,
                next: AtomicU64::new(1),
                conns: Mutex::new(HashMap::new()),
                shut: std::sync::atomic::AtomicBool::new(false),
            }),
        }
    }
}

impl Shared {
    /// Registers a connected (and, under a key, authenticated) stream;
    /// returns its id.
    fn register(
        self: &Arc<Self>,
        stream: TcpStream,
        session: Option<Session>,
    ) -> io::Result<ConnId> {
        if self.shut.load(Ordering::SeqCst) {
            let _ = stream.shutdown(Shutdown::Both);
            return Err(io::Error::other("the transport was shut down"));
        }
        stream.set_nodelay(true)?;
        stream.set_write_timeout(Some(WRITE_TIMEOUT))?;
        let conn = self.next.fetch_add(1, Ordering::Relaxed);
        self.conns.lock().insert(
            conn,
            Arc::new(ConnState {
                stream,
                out: Mutex::new(Outbox::default()),
                ready: parking_lot::Condvar::new(),
                session: Mutex::new(session),
            }),
        );
        Ok(conn)
    }

    /// Starts the connection's reader and writer threads.
    fn start_reader(self: &Arc<Self>, conn: ConnId) {
        let Some(state) = self.conns.lock().get(&conn).cloned() else {
            return;
        };
        let (reader, writer) = match (state.stream.try_clone(), state.stream.try_clone()) {
            (Ok(r), Ok(w)) => (r, w),
            (Err(e), _) | (_, Err(e)) => {
                self.drop_conn(conn, Some(e.to_string()));
                return;
            }
        };
        let (seal, open) = match state.session.lock().take() {
            Some(s) => (Some(s.seal), Some(s.open)),
            None => (None, None),
        };
        let out = Arc::clone(&state);
        let spawned = std::thread::Builder::new()
            .name(format!("walrelay-net-w{conn}"))
            .spawn(move || write_loop(&out, writer, seal));
        if let Err(e) = spawned {
            self.drop_conn(conn, Some(e.to_string()));
            return;
        }
        let shared = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name(format!("walrelay-net-{conn}"))
            .spawn(move || {
                let error = shared
                    .read_loop(conn, reader, open)
                    .err()
                    .map(|e| e.to_string());
                shared.drop_conn(conn, error);
            });
        if let Err(e) = spawned {
            self.drop_conn(conn, Some(e.to_string()));
        }
    }

    fn read_loop(
        &self,
        conn: ConnId,
        mut stream: TcpStream,
        mut open: Option<Opener>,
    ) -> io::Result<()> {
        let mut buf = BytesMut::with_capacity(READ_CHUNK);
        let mut scratch = vec![0u8; READ_CHUNK];
        loop {
            let (handed, sound) = super::split_frames(&mut buf, open.as_mut(), |m| {
                self.handler.message(conn, m);
            });
            if handed {
                self.handler.drained(conn);
                self.handler.drains_done();
            }
            sound?;
            // One small copy per read keeps this free of unsafe; page
            // images are sliced out of `buf` without further copies.
            let n = match stream.read(&mut scratch) {
                Ok(0) => return Ok(()), // orderly close
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            buf.extend_from_slice(&scratch[..n]);
        }
    }

    fn drop_conn(&self, conn: ConnId, error: Option<String>) {
        let removed = self.conns.lock().remove(&conn);
        if let Some(s) = removed {
            s.kill();
            self.handler.closed(conn, error);
        }
    }
}

/// Drains one connection's outbox until it is closed or fails; the reader
/// then sees the shutdown and reports `closed`. Under a key each frame is
/// tagged here, in the order it goes out, and its tag written after it.
fn write_loop(state: &ConnState, mut stream: TcpStream, mut seal: Option<Sealer>) {
    loop {
        let batch: Vec<[Bytes; 2]> = {
            let mut out = state.out.lock();
            while out.queue.is_empty() && !out.closing && !out.dead {
                state.ready.wait(&mut out);
            }
            if out.dead {
                return;
            }
            if out.queue.is_empty() {
                // Closing, and everything queued went out.
                drop(out);
                let _ = state.stream.shutdown(Shutdown::Both);
                return;
            }
            out.queue.drain(..).collect()
        };
        let queued: u64 = batch.iter().flatten().map(|p| p.len() as u64).sum();
        let tags: Vec<Bytes> = match &mut seal {
            Some(seal) => batch.iter().map(|[h, b]| seal.seal(h, b)).collect(),
            None => Vec::new(),
        };
        let mut parts: Vec<&[u8]> = Vec::with_capacity(batch.len() * 3);
        for (i, [head, body]) in batch.iter().enumerate() {
            parts.push(head);
            if !body.is_empty() {
                parts.push(body);
            }
            if let Some(tag) = tags.get(i) {
                parts.push(tag);
            }
        }
        if write_all_vectored(&mut stream, &parts).is_err() {
            state.kill();
            return;
        }
        let mut out = state.out.lock();
        out.bytes = out.bytes.saturating_sub(queued);
    }
}

impl Transport for StdTransport {
    fn listen(&self, addr: SocketAddr) -> io::Result<SocketAddr> {
        let listener = TcpListener::bind(addr)?;
        let bound = listener.local_addr()?;
        let shared = Arc::clone(&self.shared);
        let auth = Arc::clone(&shared.auth);
        super::accept_in_background(listener, auth, move |stream, from, session| {
            if let Ok(conn) = shared.register(stream, session) {
                // Announce before reading, so the handler knows the
                // connection before its first message.
                shared.handler.accepted(conn, from);
                shared.start_reader(conn);
            }
            // A shut-down transport's listener ends at its next connection.
            !shared.shut.load(Ordering::SeqCst)
        })?;
        Ok(bound)
    }

    fn connect(&self, addr: SocketAddr, tag: u64) {
        if self.shared.shut.load(Ordering::SeqCst) {
            return;
        }
        let shared = Arc::clone(&self.shared);
        let auth = Arc::clone(&shared.auth);
        let spawned = super::dial_in_background(addr, CONNECT_TIMEOUT, auth, move |dialed| {
            match dialed.and_then(|(s, session)| shared.register(s, session)) {
                Ok(conn) => {
                    shared.handler.connected(conn, tag);
                    shared.start_reader(conn);
                }
                Err(e) => shared.handler.connect_failed(tag, e),
            }
        });
        if let Err(e) = spawned {
            self.shared.handler.connect_failed(tag, e);
        }
    }

    fn send(&self, conn: ConnId, message: &Message) {
        let Some(state) = self.shared.conns.lock().get(&conn).cloned() else {
            return;
        };
        // An Append's record (also inside a channel frame) is shared,
        // not copied.
        let frame = match encode_parts(message) {
            Ok((head, body)) => [head, body],
            Err(_) => {
                // Never called for a message this side cannot encode;
                // drop the connection rather than send half a stream.
                state.kill();
                return;
            }
        };
        let n: u64 = frame.iter().map(|p| p.len() as u64).sum();
        let mut out = state.out.lock();
        if out.dead || out.closing {
            return;
        }
        if out.bytes > 0 && out.bytes + n > MAX_QUEUED_BYTES {
            // The peer is not keeping up. The reader reports `closed`:
            // never call the handler from here, the caller may hold its
            // locks.
            drop(out);
            state.kill();
            return;
        }
        out.bytes += n;
        out.queue.push_back(frame);
        drop(out);
        state.ready.notify_one();
    }

    fn close(&self, conn: ConnId) {
        let state = self.shared.conns.lock().get(&conn).cloned();
        if let Some(s) = state {
            s.out.lock().closing = true;
            s.ready.notify_one();
        }
    }

    fn backend(&self) -> &'static str {
        "std"
    }

    fn auth_refusals(&self) -> u64 {
        self.shared.auth.refusals()
    }

    fn shutdown(&self) {
        self.shared.shut.store(true, Ordering::SeqCst);
        let conns: Vec<Arc<ConnState>> = self.shared.conns.lock().drain().map(|(_, c)| c).collect();
        // Each reader then sees its socket shut and ends; the handler is
        // not told (the runtime asked for this).
        for c in conns {
            c.kill();
        }
    }
}

/// Writes every byte of `parts`, in order, with as few syscalls as the
/// kernel allows.
fn write_all_vectored(stream: &mut TcpStream, parts: &[&[u8]]) -> io::Result<()> {
    let mut index = 0;
    let mut offset = 0;
    while index < parts.len() {
        let slices: Vec<IoSlice<'_>> = std::iter::once(&parts[index][offset..])
            .chain(parts[index + 1..].iter().copied())
            .map(IoSlice::new)
            .collect();
        let mut n = match stream.write_vectored(&slices) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        while index < parts.len() && n >= parts[index].len() - offset {
            n -= parts[index].len() - offset;
            index += 1;
            offset = 0;
        }
        offset += n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bookmark::{Bookmark, Epoch, Sequence};
    use crate::record::Record;
    use std::sync::mpsc;

    struct Collect(Mutex<mpsc::Sender<(ConnId, Option<Message>)>>);
    impl NetHandler for Collect {
        fn accepted(&self, _: ConnId, _: SocketAddr) {}
        fn connected(&self, conn: ConnId, _: u64) {
            let _ = self.0.lock().send((conn, None));
        }
        fn connect_failed(&self, _: u64, e: io::Error) {
            panic!("connect failed: {e}");
        }
        fn message(&self, conn: ConnId, message: Message) {
            let _ = self.0.lock().send((conn, Some(message)));
        }
        fn closed(&self, conn: ConnId, _: Option<String>) {
            let _ = self.0.lock().send((conn, None));
        }
    }

    #[test]
    fn a_peer_that_stops_reading_is_closed_and_sends_only_ever_queue() {
        let (tx, rx) = mpsc::channel();
        let client = StdTransport::new(Arc::new(Collect(Mutex::new(tx))), Auth::new(None));
        let listener = TcpListener::bind("127.0.0.1:0").expect("listen");
        client.connect(listener.local_addr().expect("addr"), 1);
        let (_peer, _) = listener.accept().expect("accept"); // never reads
        let (conn, _) = rx.recv().expect("connected");
        let b = |s| Bookmark::new(Epoch(1), Sequence(s));
        let page = Bytes::from(vec![7u8; 64 * 1024]);
        // Far more than the socket buffers hold: with blocking sends the
        // loop itself would stall here; queued, it runs through.
        for s in 1..=512u64 {
            let record = Record {
                bookmark: b(s),
                previous: b(s - 1),
                prev_chain: crate::chain::ChainHash::GENESIS,
                commit_us: 0,
                page_size: 64 * 1024,
                db_pages: 3,
                pages: vec![(2, page.clone())],
            };
            client.send(conn, &Message::Append(record.to_encoded().expect("encode")));
        }
        // The writer is stuck; the write timeout closes the connection.
        let (closed, what) = rx
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("closed reported");
        assert_eq!((closed, what), (conn, None));
    }

    #[test]
    fn messages_cross_a_connection_in_order_with_appends_intact() {
        let (tx, rx) = mpsc::channel();
        let server = StdTransport::new(Arc::new(Collect(Mutex::new(tx.clone()))), Auth::new(None));
        let addr = server
            .listen("127.0.0.1:0".parse().expect("addr"))
            .expect("listen");
        let client = StdTransport::new(Arc::new(Collect(Mutex::new(tx))), Auth::new(None));
        client.connect(addr, 7);
        let (conn, first) = rx.recv().expect("connected");
        assert!(first.is_none());
        let b = |s| Bookmark::new(Epoch(1), Sequence(s));
        let mut sent = Vec::new();
        for s in 1..=200u64 {
            let record = Record {
                bookmark: b(s),
                previous: b(s - 1),
                prev_chain: crate::chain::ChainHash::GENESIS,
                commit_us: 0,
                page_size: 4096,
                db_pages: 3,
                pages: vec![(2, Bytes::from(vec![s as u8; 4096]))],
            };
            let m = Message::Append(record.to_encoded().expect("encode"));
            client.send(conn, &m);
            client.send(
                conn,
                &Message::Ack {
                    durable: b(s),
                    chain: crate::chain::ChainHash::GENESIS,
                },
            );
            sent.push(m);
            sent.push(Message::Ack {
                durable: b(s),
                chain: crate::chain::ChainHash::GENESIS,
            });
        }
        for want in sent {
            let (_, got) = rx.recv().expect("message");
            assert_eq!(got, Some(want));
        }
    }
}
