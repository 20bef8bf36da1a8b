//! The io_uring transport against real sockets: framing, queues,
//! stalled peers, closing, and allocation bounds.

use super::super::WRITE_TIMEOUT;
use super::*;
use crate::bookmark::{Bookmark, Epoch, Sequence};
use crate::record::Record;
use crate::wire::MAX_FRAME_BYTES;
use bytes::Bytes;
use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Read;
use std::sync::atomic::AtomicUsize;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The system allocator, remembering the largest request (for the
/// test that an oversized length allocates nothing of its size).
struct Largest;
static LARGEST: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator;
// only the requested size is recorded.
unsafe impl GlobalAlloc for Largest {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract for `alloc`, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract for `alloc_zeroed`, passed on.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract for `dealloc`, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        // SAFETY: the caller's contract for `realloc`, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Largest = Largest;

const WAIT: Duration = Duration::from_secs(10);

#[derive(Debug, PartialEq)]
enum Ev {
    Accepted(ConnId),
    Connected(ConnId, u64),
    ConnectFailed(u64),
    Message(ConnId, Message),
    Closed(ConnId, Option<String>),
}

/// Forwards events with the thread they were reported on.
struct Collect(Mutex<mpsc::Sender<(ThreadId, Ev)>>);
impl Collect {
    fn ev(&self, ev: Ev) {
        let _ = self.0.lock().send((std::thread::current().id(), ev));
    }
}
impl NetHandler for Collect {
    fn accepted(&self, conn: ConnId, _: SocketAddr) {
        self.ev(Ev::Accepted(conn));
    }
    fn connected(&self, conn: ConnId, tag: u64) {
        self.ev(Ev::Connected(conn, tag));
    }
    fn connect_failed(&self, tag: u64, _: io::Error) {
        self.ev(Ev::ConnectFailed(tag));
    }
    fn message(&self, conn: ConnId, message: Message) {
        self.ev(Ev::Message(conn, message));
    }
    fn closed(&self, conn: ConnId, error: Option<String>) {
        self.ev(Ev::Closed(conn, error));
    }
}

type Events = mpsc::Receiver<(ThreadId, Ev)>;

/// A transport and its events, or None where io_uring is unavailable.
fn transport() -> Option<(UringTransport, Events)> {
    let (tx, rx) = mpsc::channel();
    let made = UringTransport::new(Arc::new(Collect(Mutex::new(tx))), Auth::new(None));
    crate::uring::available_or_skip(made, "skipped").map(|t| (t, rx))
}

fn next(rx: &Events) -> Ev {
    rx.recv_timeout(WAIT).expect("an event in time").1
}

fn local() -> SocketAddr {
    "127.0.0.1:0".parse().expect("addr")
}

fn b(s: u64) -> Bookmark {
    Bookmark::new(Epoch(1), Sequence(s))
}

/// The Append of record `s` (after `s - 1`), one page of `page`'s bytes.
fn append(s: u64, page: Bytes) -> Message {
    let record = Record {
        bookmark: b(s),
        previous: b(s - 1),
        prev_chain: crate::chain::ChainHash::GENESIS,
        commit_us: 0,
        page_size: page.len() as u32,
        db_pages: 3,
        pages: vec![(2, page)],
    };
    Message::Append(record.to_encoded().expect("encode"))
}

#[test]
fn messages_cross_a_connection_in_order_with_appends_intact() {
    let Some((server, server_rx)) = transport() else {
        return;
    };
    let Some((client, client_rx)) = transport() else {
        return;
    };
    assert_eq!(client.backend(), "io_uring");
    let addr = server.listen(local()).expect("listen");
    client.connect(addr, 7);
    let Ev::Connected(conn, 7) = next(&client_rx) else {
        panic!("not connected");
    };
    let Ev::Accepted(at_server) = next(&server_rx) else {
        panic!("not accepted");
    };
    let mut sent = Vec::new();
    for s in 1..=200u64 {
        let m = append(s, Bytes::from(vec![s as u8; 4096]));
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
    let me = std::thread::current().id();
    for want in sent {
        let (thread, got) = server_rx.recv_timeout(WAIT).expect("message");
        assert_ne!(thread, me);
        assert_eq!(got, Ev::Message(at_server, want));
    }
}

#[test]
fn an_oversized_length_closes_the_connection_without_allocating_it() {
    let Some((server, rx)) = transport() else {
        return;
    };
    let addr = server.listen(local()).expect("listen");
    let mut peer = TcpStream::connect(addr).expect("connect");
    let Ev::Accepted(conn) = next(&rx) else {
        panic!("not accepted");
    };
    // One byte past the limit, then a version and a kind.
    let claimed = MAX_FRAME_BYTES + 1 - 4;
    let mut frame = u32::try_from(claimed).expect("fits").to_be_bytes().to_vec();
    frame.extend_from_slice(&[1, 2, 0, 0]);
    peer.write_all(&frame).expect("write");
    match next(&rx) {
        Ev::Closed(c, Some(e)) => {
            assert_eq!(c, conn);
            assert!(e.contains("exceeds the limit"), "{e}");
        }
        other => panic!("expected a closed connection, got {other:?}"),
    }
    let largest = LARGEST.load(Ordering::Relaxed) as u64;
    assert!(largest < MAX_FRAME_BYTES / 2, "allocated {largest} bytes");
    // The socket was shut down: the peer reads EOF.
    peer.set_read_timeout(Some(WAIT)).expect("timeout");
    let mut rest = Vec::new();
    let _ = peer.read_to_end(&mut rest);
    assert!(rest.is_empty());
}

/// A header claiming a large (but legal) frame, and nothing after it:
/// neither transport may allocate what it claims.
#[test]
fn a_large_claimed_frame_allocates_only_what_arrives_on_either_transport() {
    let (tx, _rx) = mpsc::channel();
    let std_server =
        crate::net::std_net::StdTransport::new(Arc::new(Collect(Mutex::new(tx))), Auth::new(None));
    let mut servers: Vec<Box<dyn Transport>> = vec![Box::new(std_server)];
    if let Some((uring, _)) = transport() {
        servers.push(Box::new(uring));
    }
    for server in &servers {
        let addr = server.listen(local()).expect("listen");
        let mut peer = TcpStream::connect(addr).expect("connect");
        let claimed = MAX_FRAME_BYTES - 64;
        let mut frame = u32::try_from(claimed).expect("fits").to_be_bytes().to_vec();
        frame.extend_from_slice(&[1, 2]);
        frame.extend_from_slice(&[0u8; 4096]);
        peer.write_all(&frame).expect("write");
        std::thread::sleep(Duration::from_millis(200));
        let largest = LARGEST.load(Ordering::Relaxed) as u64;
        assert!(
            largest < MAX_FRAME_BYTES / 2,
            "{}: allocated {largest} bytes for a claim",
            server.backend()
        );
    }
}

#[test]
fn a_peer_disconnect_is_reported_closed_once() {
    let Some((server, rx)) = transport() else {
        return;
    };
    let addr = server.listen(local()).expect("listen");
    let peer = TcpStream::connect(addr).expect("connect");
    let Ev::Accepted(conn) = next(&rx) else {
        panic!("not accepted");
    };
    drop(peer);
    assert_eq!(next(&rx), Ev::Closed(conn, None));
    // Sending to and closing a gone connection reports nothing more.
    server.send(
        conn,
        &Message::Ack {
            durable: b(1),
            chain: crate::chain::ChainHash::GENESIS,
        },
    );
    server.close(conn);
    assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
}

#[test]
fn close_sends_what_was_queued_then_reports_closed_once() {
    let Some((server, server_rx)) = transport() else {
        return;
    };
    let Some((client, client_rx)) = transport() else {
        return;
    };
    let addr = server.listen(local()).expect("listen");
    client.connect(addr, 1);
    let Ev::Connected(conn, 1) = next(&client_rx) else {
        panic!("not connected");
    };
    let Ev::Accepted(at_server) = next(&server_rx) else {
        panic!("not accepted");
    };
    for s in 1..=50 {
        client.send(
            conn,
            &Message::Ack {
                durable: b(s),
                chain: crate::chain::ChainHash::GENESIS,
            },
        );
    }
    client.close(conn);
    client.send(
        conn,
        &Message::Ack {
            durable: b(99),
            chain: crate::chain::ChainHash::GENESIS,
        },
    ); // after close: dropped
    let me = std::thread::current().id();
    let (thread, ev) = client_rx.recv_timeout(WAIT).expect("closed");
    assert_ne!(thread, me, "closed reported on the caller's thread");
    assert_eq!(ev, Ev::Closed(conn, None));
    for s in 1..=50 {
        let want = Message::Ack {
            durable: b(s),
            chain: crate::chain::ChainHash::GENESIS,
        };
        assert_eq!(next(&server_rx), Ev::Message(at_server, want));
    }
    assert_eq!(next(&server_rx), Ev::Closed(at_server, None));
    assert!(client_rx.recv_timeout(Duration::from_millis(200)).is_err());
}

#[test]
fn on_a_kernel_with_deferred_completion_work_the_ring_is_made_for_its_one_thread() {
    let ring = new_ring().expect("a ring");
    if ring.params().is_setup_single_issuer() {
        // Made here: this thread may use it.
        ring.submitter()
            .submit()
            .expect("this thread is its issuer");
    } else {
        // Only kernels before 6.1 refuse the flags.
        assert!(!crate::uring::under_ci(), "flags refused");
    }
}

#[test]
fn a_refused_dial_is_reported() {
    let Some((client, rx)) = transport() else {
        return;
    };
    let port = TcpListener::bind(local())
        .and_then(|l| l.local_addr())
        .expect("a free port");
    client.connect(port, 3);
    assert_eq!(next(&rx), Ev::ConnectFailed(3));
}

#[test]
fn a_peer_that_stops_reading_is_closed_after_the_write_timeout() {
    let Some((client, rx)) = transport() else {
        return;
    };
    let listener = TcpListener::bind(local()).expect("listen");
    client.connect(listener.local_addr().expect("addr"), 1);
    let (_peer, _) = listener.accept().expect("accept"); // never read
    let Ev::Connected(conn, 1) = next(&rx) else {
        panic!("not connected");
    };
    // Far more than the loopback socket buffers hold.
    let page = Bytes::from(vec![7u8; 64 * 1024]);
    for s in 1..=1024u64 {
        client.send(conn, &append(s, page.clone()));
    }
    let started = Instant::now();
    match next(&rx) {
        Ev::Closed(c, Some(e)) => {
            assert_eq!(c, conn);
            assert!(e.contains("no write progress"), "{e}");
        }
        other => panic!("expected a closed connection, got {other:?}"),
    }
    assert!(started.elapsed() >= WRITE_TIMEOUT / 2);
}

/// What [`OnMessage`] does with a message (passing it on or not).
type MessageFn = Box<dyn Fn(&Collect, ConnId, Message) + Send + Sync>;

/// [`Collect`], with its own way of taking messages.
struct OnMessage {
    inner: Collect,
    on: MessageFn,
}
impl NetHandler for OnMessage {
    fn accepted(&self, conn: ConnId, from: SocketAddr) {
        self.inner.accepted(conn, from);
    }
    fn connected(&self, conn: ConnId, tag: u64) {
        self.inner.connected(conn, tag);
    }
    fn connect_failed(&self, tag: u64, e: io::Error) {
        self.inner.connect_failed(tag, e);
    }
    fn message(&self, conn: ConnId, message: Message) {
        (self.on)(&self.inner, conn, message);
    }
    fn closed(&self, conn: ConnId, error: Option<String>) {
        self.inner.closed(conn, error);
    }
}

/// A handler that passes every message on and sleeps 20 ms after every
/// `every`-th: its reader falls behind now and then, so a sender's socket
/// fills and the sender's ring takes its frames over.
fn slow_reader(tx: mpsc::Sender<(ThreadId, Ev)>, every: usize) -> Arc<OnMessage> {
    let seen = AtomicUsize::new(0);
    Arc::new(OnMessage {
        inner: Collect(Mutex::new(tx)),
        on: Box::new(move |inner, conn, message| {
            if seen.fetch_add(1, Ordering::Relaxed) % every == every - 1 {
                std::thread::sleep(Duration::from_millis(20));
            }
            inner.message(conn, message);
        }),
    })
}

#[test]
fn frames_written_directly_and_through_the_ring_arrive_sealed_in_order() {
    let key = || Auth::new(Some(crate::net::ClusterKey::from_bytes([9; 32])));
    let (server_tx, server_rx) = mpsc::channel();
    let slow = slow_reader(server_tx, 64);
    let made = UringTransport::new(slow, key());
    let Some(server) = crate::uring::available_or_skip(made, "skipped") else {
        return;
    };
    let (client_tx, client_rx) = mpsc::channel();
    // Answers every Heartbeat with an Ack, from its ring thread, on the
    // connection this thread sends its Appends on.
    let transport: Arc<OnceLock<Arc<UringTransport>>> = Arc::default();
    let to = Arc::clone(&transport);
    let echo = Arc::new(OnMessage {
        inner: Collect(Mutex::new(client_tx)),
        on: Box::new(move |_, conn, message| {
            if let Message::Heartbeat { confirmed, .. } = message {
                let ack = Message::Ack {
                    durable: confirmed,
                    chain: crate::chain::ChainHash::GENESIS,
                };
                to.get().expect("set").send(conn, &ack);
            }
        }),
    });
    let client = Arc::new(UringTransport::new(echo, key()).expect("ring"));
    let _ = transport.set(Arc::clone(&client));
    let addr = server.listen(local()).expect("listen");
    client.connect(addr, 1);
    let Ev::Connected(conn, 1) = next(&client_rx) else {
        panic!("not connected");
    };
    let Ev::Accepted(at_server) = next(&server_rx) else {
        panic!("not accepted");
    };
    // The server's heartbeats make the client's ring thread send Acks on
    // the connection this thread sends its Appends on.
    let page = Bytes::from(vec![3u8; 32 * 1024]);
    let appends = 600u64;
    for s in 1..=appends {
        client.send(conn, &append(s, page.clone()));
        if s % 8 == 0 {
            let beat = Message::Heartbeat {
                epoch: Epoch(1),
                confirmed: b(s),
                sent_us: s,
            };
            server.send(at_server, &beat);
        }
    }
    let (mut next_append, mut acks) = (1u64, 0u64);
    while next_append <= appends || acks < appends / 8 {
        match server_rx.recv_timeout(WAIT).expect("a frame in time").1 {
            Ev::Message(c, Message::Append(r)) => {
                assert_eq!(c, at_server);
                assert_eq!(r.bookmark, b(next_append), "appends out of order");
                next_append += 1;
            }
            Ev::Message(_, Message::Ack { .. }) => acks += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    let (direct, posted) = client.sent_counts();
    assert!(direct > 0, "no frame was written directly");
    assert!(posted > 0, "no frame went through the ring");
}

/// A client with `n` connections to a server, both under the cluster
/// key `[key; 32]`, whose reader stalls after every `stall_every`-th
/// message ([`slow_reader`]).
struct Connected {
    /// Held to the test's end (dropping it stops it).
    _server: UringTransport,
    server_rx: mpsc::Receiver<(ThreadId, Ev)>,
    client: UringTransport,
    /// Each connection at the client, and the same at the server.
    conns: Vec<ConnId>,
    at_server: Vec<ConnId>,
}

/// Checks that `bookmark` arrived on `c` (one of `at_server`) right after
/// the one before on it, and moves `next` on.
fn next_in_order(at_server: &[ConnId], next: &mut [u64], c: ConnId, bookmark: Bookmark) {
    let i = at_server
        .iter()
        .position(|a| *a == c)
        .expect("a known connection");
    assert_eq!(bookmark, b(next[i]), "appends out of order");
    next[i] += 1;
}

/// [`Connected`], or None where io_uring is refused (a failure under CI).
fn connected(key: u8, stall_every: usize, n: u64) -> Option<Connected> {
    let auth = || Auth::new(Some(crate::net::ClusterKey::from_bytes([key; 32])));
    let (server_tx, server_rx) = mpsc::channel();
    let slow = slow_reader(server_tx, stall_every);
    let server = crate::uring::available_or_skip(UringTransport::new(slow, auth()), "skipped")?;
    let (client_tx, client_rx) = mpsc::channel();
    let client =
        UringTransport::new(Arc::new(Collect(Mutex::new(client_tx))), auth()).expect("ring");
    let addr = server.listen(local()).expect("listen");
    let (mut conns, mut at_server) = (Vec::new(), Vec::new());
    for tag in 1..=n {
        client.connect(addr, tag);
        let Ev::Connected(conn, t) = next(&client_rx) else {
            panic!("not connected");
        };
        assert_eq!(t, tag);
        conns.push(conn);
        let Ev::Accepted(a) = next(&server_rx) else {
            panic!("not accepted");
        };
        at_server.push(a);
    }
    Some(Connected {
        _server: server,
        server_rx,
        client,
        conns,
        at_server,
    })
}

#[test]
fn a_batch_to_several_connections_arrives_sealed_and_in_order_on_each() {
    let Some(t) = connected(7, 97, 3) else {
        return;
    };
    let page = Bytes::from(vec![5u8; 32 * 1024]);
    let appends = 400u64;
    for s in 1..=appends {
        let m = append(s, page.clone());
        let batch: Vec<(ConnId, &Message)> = t.conns.iter().map(|c| (*c, &m)).collect();
        t.client.send_many(&batch);
    }
    // The same connection twice in one batch: both frames, in order.
    let beat = |s| Message::Heartbeat {
        epoch: Epoch(1),
        confirmed: b(s),
        sent_us: s,
    };
    let (one, two) = (beat(1), beat(2));
    t.client
        .send_many(&[(t.conns[0], &one), (t.conns[0], &two)]);
    let mut next_append = [1u64; 3];
    let mut beats = Vec::new();
    while next_append.iter().any(|n| *n <= appends) || beats.len() < 2 {
        match t.server_rx.recv_timeout(WAIT).expect("a frame in time").1 {
            Ev::Message(c, Message::Append(r)) => {
                next_in_order(&t.at_server, &mut next_append, c, r.bookmark);
            }
            Ev::Message(c, Message::Heartbeat { sent_us, .. }) => {
                assert_eq!(c, t.at_server[0]);
                assert_eq!(next_append[0], appends + 1, "a heartbeat passed an append");
                beats.push(sent_us);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(beats, [1, 2]);
    let (direct, posted) = t.client.sent_counts();
    assert!(direct > 0, "no frame was written by its sender");
    assert!(posted > 0, "no frame went through the ring");
}

#[test]
fn runs_to_several_connections_in_one_call_arrive_sealed_and_in_order_on_each() {
    let Some(t) = connected(5, 113, 2) else {
        return;
    };
    // Runs of 40 frames of 32 KiB to each connection, interleaved in each
    // call as a lazy flush queues them: sockets fill mid-run, so the
    // ring takes the rest of some runs over, from inside a frame.
    let page = Bytes::from(vec![6u8; 32 * 1024]);
    let (runs, per_run) = (10u64, 40u64);
    for r in 0..runs {
        let messages: Vec<Message> = (1..=per_run)
            .map(|i| append(r * per_run + i, page.clone()))
            .collect();
        let mut sends: Vec<(ConnId, &Message)> = Vec::new();
        for m in &messages {
            sends.extend(t.conns.iter().map(|c| (*c, m)));
        }
        t.client.send_many(&sends);
    }
    let mut next_append = [1u64; 2];
    while next_append.iter().any(|n| *n <= runs * per_run) {
        match t.server_rx.recv_timeout(WAIT).expect("a frame in time").1 {
            Ev::Message(c, Message::Append(r)) => {
                next_in_order(&t.at_server, &mut next_append, c, r.bookmark);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    let (direct, posted) = t.client.sent_counts();
    assert!(direct > 0, "no frame was written by its sender");
    assert!(posted > 0, "no run was left to the ring");
}
