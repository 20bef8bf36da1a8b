//! The mux over real sockets, on both transports.

use super::*;
use crate::bookmark::{Bookmark, Epoch, Sequence};
use crate::chain::ChainHash;
use crate::history::History;
use crate::ids::NodeId;
use crate::net::mux_wire::MuxFrame;
use crate::record::Record;
use crate::wire::Role;
use bytes::Bytes;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);

#[derive(Debug)]
enum Ev {
    Accepted(ConnId),
    Connected(ConnId, u64),
    Failed(u64),
    Message(ConnId, Message),
    Drained(ConnId),
    DrainsDone,
    Closed(ConnId, Option<String>),
}

struct Collect(Mutex<mpsc::Sender<Ev>>);

impl NetHandler for Collect {
    fn accepted(&self, conn: ConnId, _: SocketAddr) {
        let _ = self.0.lock().send(Ev::Accepted(conn));
    }
    fn connected(&self, conn: ConnId, tag: u64) {
        let _ = self.0.lock().send(Ev::Connected(conn, tag));
    }
    fn connect_failed(&self, tag: u64, _: io::Error) {
        let _ = self.0.lock().send(Ev::Failed(tag));
    }
    fn message(&self, conn: ConnId, message: Message) {
        let _ = self.0.lock().send(Ev::Message(conn, message));
    }
    fn drained(&self, conn: ConnId) {
        let _ = self.0.lock().send(Ev::Drained(conn));
    }
    fn drains_done(&self) {
        let _ = self.0.lock().send(Ev::DrainsDone);
    }
    fn closed(&self, conn: ConnId, error: Option<String>) {
        let _ = self.0.lock().send(Ev::Closed(conn, error));
    }
}

fn collector() -> (Arc<Collect>, mpsc::Receiver<Ev>) {
    let (tx, rx) = mpsc::channel();
    (Arc::new(Collect(Mutex::new(tx))), rx)
}

/// The backends to run on: io_uring where the kernel allows it (under
/// CI=true it must).
fn backends() -> Vec<Backend> {
    let mut out = vec![Backend::Std];
    let made =
        crate::net::uring_net::UringTransport::new(collector().0, crate::net::Auth::new(None));
    if let Some(t) = crate::uring::available_or_skip(made, "only std runs") {
        t.shutdown();
        out.push(Backend::IoUring);
    }
    out
}

fn key(b: u8) -> Option<ClusterKey> {
    Some(ClusterKey::from_bytes([b; 32]))
}

fn local() -> SocketAddr {
    "127.0.0.1:0".parse().expect("addr")
}

fn b(s: u64) -> Bookmark {
    Bookmark::new(Epoch(1), Sequence(s))
}

fn handshake(db: u64) -> Message {
    Message::Handshake {
        database: DatabaseId(db),
        epoch: Epoch(1),
        role: Role::Leader,
        node: NodeId(1),
        last_durable: b(0),
        last_chain: ChainHash::GENESIS,
        confirmed: b(0),
        history: History::default(),
    }
}

fn append(s: u64, pages: usize) -> Message {
    Message::Append(
        Record {
            bookmark: b(s),
            previous: b(s - 1),
            prev_chain: ChainHash::GENESIS,
            commit_us: 0,
            page_size: 4096,
            db_pages: pages as u32 + 2,
            pages: (0..pages)
                .map(|i| (i as u32 + 2, Bytes::from(vec![s as u8; 4096])))
                .collect(),
        }
        .to_encoded()
        .expect("record"),
    )
}

fn next(rx: &mpsc::Receiver<Ev>) -> Ev {
    rx.recv_timeout(WAIT).expect("an event in time")
}

/// The next event that is not a drain.
fn next_event(rx: &mpsc::Receiver<Ev>) -> Ev {
    loop {
        match next(rx) {
            Ev::Drained(_) | Ev::DrainsDone => continue,
            e => return e,
        }
    }
}

fn connected(rx: &mpsc::Receiver<Ev>) -> ConnId {
    match next_event(rx) {
        Ev::Connected(c, tag) => {
            assert!(tag < 100);
            c
        }
        e => panic!("expected connected, got {e:?}"),
    }
}

/// A server mux accepting into one collector.
struct Server {
    mux: Mux,
    _endpoint: Arc<dyn Transport>,
}

impl std::ops::Deref for Server {
    type Target = Mux;
    fn deref(&self) -> &Mux {
        &self.mux
    }
}

fn server(backend: Backend, k: Option<ClusterKey>) -> (Server, SocketAddr, mpsc::Receiver<Ev>) {
    let mux = Mux::open(backend, k, Limits::default()).expect("mux");
    let (h, rx) = collector();
    let ep = mux.endpoint(h);
    let addr = ep.listen(local()).expect("listen");
    (Server { mux, _endpoint: ep }, addr, rx)
}

#[test]
fn many_databases_share_one_real_connection_with_every_message_delivered_and_drained() {
    for backend in backends() {
        let (srv, addr, srx) = server(backend, key(1));
        let client = Mux::open(backend, key(1), Limits::default()).expect("mux");
        let mut eps = Vec::new();
        for db in 0..8u64 {
            let (h, rx) = collector();
            let ep = client.endpoint(h);
            ep.connect(addr, db);
            let conn = connected(&rx);
            ep.send(conn, &handshake(db));
            for s in 1..=20 {
                ep.send(conn, &append(s, 2));
            }
            eps.push((ep, rx, conn));
        }
        // Every channel arrives at the acceptor, each with its messages in
        // order, each drained.
        let mut per: HashMap<ConnId, Vec<Message>> = HashMap::new();
        let mut drained = HashSet::new();
        let mut done = 0;
        while per.values().map(Vec::len).sum::<usize>() < 8 * 21 {
            match next(&srx) {
                Ev::Accepted(c) => {
                    per.insert(c, Vec::new());
                }
                Ev::Message(c, m) => per.get_mut(&c).expect("accepted first").push(m),
                Ev::Drained(c) => {
                    drained.insert(c);
                }
                Ev::DrainsDone => done += 1,
                e => panic!("unexpected {e:?}"),
            }
        }
        assert_eq!(per.len(), 8);
        for msgs in per.values() {
            let Message::Handshake { database, .. } = &msgs[0] else {
                panic!("a channel starts with its handshake");
            };
            for (i, m) in msgs[1..].iter().enumerate() {
                assert_eq!(m, &append(i as u64 + 1, 2), "database {database}");
            }
        }
        // Drains of the last read may still be on their way.
        while drained.len() < 8 || done == 0 {
            match next(&srx) {
                Ev::Drained(c) => {
                    drained.insert(c);
                }
                Ev::DrainsDone => done += 1,
                e => panic!("unexpected {e:?}"),
            }
        }
        let (c, s) = (client.snapshot(), srv.snapshot());
        assert_eq!(
            (c.connections, c.dials),
            (1, 1),
            "{backend:?}: one real connection"
        );
        assert_eq!((s.connections, s.connections_accepted), (1, 1));
        assert_eq!((c.channels, s.channels), (8, 8));
        assert!(
            s.metrics_text("walrelay_")
                .contains("walrelay_mux_channels 8")
        );
        client.shutdown();
        srv.shutdown();
    }
}

#[test]
fn closing_one_endpoint_leaves_the_others_and_the_connection_working() {
    for backend in backends() {
        let (srv, addr, srx) = server(backend, None);
        let client = Mux::open(backend, None, Limits::default()).expect("mux");
        let (ha, rxa) = collector();
        let (hb, rxb) = collector();
        let (a, b_ep) = (client.endpoint(ha), client.endpoint(hb));
        a.connect(addr, 1);
        let ca = connected(&rxa);
        a.send(ca, &handshake(1));
        b_ep.connect(addr, 2);
        let cb = connected(&rxb);
        b_ep.send(cb, &handshake(2));
        let mut accepted = Vec::new();
        while accepted.len() < 2 {
            if let Ev::Accepted(c) = next_event(&srx) {
                accepted.push(c);
            }
        }
        a.shutdown();
        // The server sees A's channel close; B's still carries messages.
        let mut closed = None;
        let mut got_b = false;
        b_ep.send(cb, &append(1, 1));
        while closed.is_none() || !got_b {
            match next_event(&srx) {
                Ev::Closed(c, why) => closed = Some((c, why)),
                Ev::Message(_, m) if m == append(1, 1) => got_b = true,
                Ev::Message(..) => {}
                e => panic!("unexpected {e:?}"),
            }
        }
        assert_eq!(closed.expect("closed").1, None, "a clean close");
        assert_eq!(client.snapshot().connections, 1);
        assert_eq!(client.snapshot().channels, 1);
        // A's handler is not told of its own shutdown.
        assert!(rxa.recv_timeout(Duration::from_millis(200)).is_err());
        // Closing a channel reports it to its own handler, once.
        b_ep.close(cb);
        assert!(matches!(next_event(&rxb), Ev::Closed(c, None) if c == cb));
        assert_eq!(client.snapshot().connections, 1, "the connection stays");
        client.shutdown();
        srv.shutdown();
    }
}

#[test]
fn a_lost_connection_closes_every_channel_and_the_next_connect_redials() {
    for backend in backends() {
        let (srv, addr, srx) = server(backend, None);
        let client = Mux::open(backend, None, Limits::default()).expect("mux");
        let mut eps = Vec::new();
        for db in 0..3 {
            let (h, rx) = collector();
            let ep = client.endpoint(h);
            ep.connect(addr, db);
            let c = connected(&rx);
            ep.send(c, &handshake(db));
            eps.push((ep, rx, c));
        }
        for _ in 0..3 {
            while !matches!(next_event(&srx), Ev::Accepted(_)) {}
        }
        srv.shutdown();
        for (_, rx, c) in &eps {
            match next_event(rx) {
                Ev::Closed(got, Some(why)) => {
                    assert_eq!(got, *c);
                    assert!(why.contains("connection was lost"), "{why}");
                }
                e => panic!("expected closed, got {e:?}"),
            }
        }
        assert_eq!(client.snapshot().channels, 0);
        // A new server on the same address: the channels come back over
        // one new connection.
        let srv2 = Mux::open(backend, None, Limits::default()).expect("mux");
        let (h2, srx2) = collector();
        let ep2 = srv2.endpoint(h2);
        // The old listener ends at its next connection: poke it until the
        // address is free.
        let mut tries = 0;
        while let Err(e) = ep2.listen(addr) {
            assert!(tries < 200, "listen again: {e}");
            tries += 1;
            let _ = std::net::TcpStream::connect(addr);
            std::thread::sleep(Duration::from_millis(20));
        }
        for (db, (ep, rx, _)) in eps.iter().enumerate() {
            ep.connect(addr, db as u64);
            let c = connected(rx);
            ep.send(c, &handshake(db as u64));
            ep.send(c, &append(1, 1));
        }
        let mut got = 0;
        while got < 6 {
            if let Ev::Message(..) = next_event(&srx2) {
                got += 1;
            }
        }
        let s = client.snapshot();
        assert_eq!((s.connections, s.dials, s.channels), (1, 2, 3));
        client.shutdown();
        srv2.shutdown();
    }
}

#[test]
fn a_wrong_cluster_key_is_refused_and_no_channel_opens() {
    for backend in backends() {
        let (srv, addr, srx) = server(backend, key(1));
        let client = Mux::open(backend, key(2), Limits::default()).expect("mux");
        let (h, rx) = collector();
        let ep = client.endpoint(h);
        ep.connect(addr, 9);
        assert!(matches!(next_event(&rx), Ev::Failed(9)));
        assert!(srx.recv_timeout(Duration::from_millis(200)).is_err());
        assert_eq!(srv.snapshot().channels, 0);
        client.shutdown();
        srv.shutdown();
    }
}

/// A plain transport speaking channel frames by hand, to send what a mux
/// never would.
fn raw_client(addr: SocketAddr) -> (Arc<dyn Transport>, mpsc::Receiver<Ev>, ConnId) {
    let (h, rx) = collector();
    let t = crate::net::open(Backend::Std, h, None).expect("transport");
    t.connect(addr, 0);
    let c = connected(&rx);
    (t, rx, c)
}

fn mux_frame(channel: u64, database: u64, op: MuxOp) -> Message {
    Message::Mux(MuxFrame {
        channel: ChannelId(channel),
        database: DatabaseId(database),
        op,
    })
}

#[test]
fn a_frame_naming_another_database_than_its_channel_closes_that_channel_with_a_typed_refusal() {
    for backend in backends() {
        let (srv, addr, srx) = server(backend, None);
        let (t, rx, c) = raw_client(addr);
        t.send(c, &mux_frame(1, 5, MuxOp::Open));
        t.send(c, &mux_frame(2, 6, MuxOp::Open));
        t.send(c, &mux_frame(1, 5, MuxOp::Data(Box::new(handshake(5)))));
        t.send(c, &mux_frame(1, 7, MuxOp::Data(Box::new(append(1, 1)))));
        let mut closed = None;
        while closed.is_none() {
            if let Ev::Closed(v, why) = next_event(&srx) {
                closed = Some((v, why));
            }
        }
        let why = closed.expect("closed").1.expect("a reason");
        assert!(why.contains("opened for database"), "{why}");
        // The peer is told, by a Close naming the reason (after the
        // credit for the handshake its handler took, maybe).
        loop {
            match next_event(&rx) {
                Ev::Message(_, Message::Mux(f)) if matches!(f.op, MuxOp::Credit(_)) => {}
                Ev::Message(_, Message::Mux(f)) => {
                    assert_eq!(f.channel, ChannelId(1));
                    assert_eq!(f.op, MuxOp::Close(CloseReason::WrongDatabase));
                    break;
                }
                e => panic!("expected a close frame, got {e:?}"),
            }
        }
        // The other channel and the connection still work.
        t.send(c, &mux_frame(2, 6, MuxOp::Data(Box::new(handshake(6)))));
        assert!(matches!(next_event(&srx), Ev::Message(_, m) if m == handshake(6)));
        assert_eq!(srv.snapshot().refusals, 1);
        assert_eq!(srv.snapshot().connections, 1);
        t.shutdown();
        srv.shutdown();
    }
}

#[test]
fn a_frame_for_a_channel_never_opened_closes_the_connection() {
    for backend in backends() {
        let (srv, addr, _srx) = server(backend, None);
        let (t, rx, c) = raw_client(addr);
        t.send(c, &mux_frame(1, 5, MuxOp::Open));
        t.send(c, &mux_frame(9, 5, MuxOp::Data(Box::new(handshake(5)))));
        loop {
            match next_event(&rx) {
                Ev::Closed(got, _) => {
                    assert_eq!(got, c);
                    break;
                }
                Ev::Message(..) => {}
                e => panic!("unexpected {e:?}"),
            }
        }
        assert_eq!(srv.snapshot().refusals, 1);
        // Re-opening a used channel id is refused the same way.
        let (t2, rx2, c2) = raw_client(addr);
        t2.send(c2, &mux_frame(3, 5, MuxOp::Open));
        t2.send(c2, &mux_frame(3, 5, MuxOp::Open));
        assert!(matches!(next_event(&rx2), Ev::Closed(got, _) if got == c2));
        assert_eq!(srv.snapshot().refusals, 2);
        t.shutdown();
        t2.shutdown();
        srv.shutdown();
    }
}

#[test]
fn an_oversize_frame_closes_the_connection_before_anything_is_allocated() {
    use std::io::{Read, Write};
    for backend in backends() {
        let (srv, addr, _srx) = server(backend, None);
        let mut s = std::net::TcpStream::connect(addr).expect("connect");
        let mut frame = (crate::wire::MAX_FRAME_BYTES as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(&[crate::wire::VERSION, crate::net::mux_wire::KIND, 2]);
        s.write_all(&frame).expect("write");
        s.set_read_timeout(Some(WAIT)).expect("timeout");
        let mut buf = [0u8; 16];
        assert_eq!(s.read(&mut buf).expect("closed, not timed out"), 0);
        assert_eq!(srv.snapshot().channels, 0);
        srv.shutdown();
    }
}

#[test]
fn an_unmultiplexed_peer_is_served_as_one_virtual_connection() {
    for backend in backends() {
        let (srv, addr, srx) = server(backend, None);
        let (t, rx, c) = raw_client(addr);
        t.send(c, &handshake(4));
        let v = match next_event(&srx) {
            Ev::Accepted(v) => v,
            e => panic!("expected accepted, got {e:?}"),
        };
        assert!(matches!(next_event(&srx), Ev::Message(got, m) if got == v && m == handshake(4)));
        // No channel frames come back to it.
        assert!(rx.recv_timeout(Duration::from_millis(100)).is_err());
        t.shutdown();
        assert!(matches!(next_event(&srx), Ev::Closed(got, _) if got == v));
        srv.shutdown();
    }
}

/// An acceptor that blocks on each large append until let go.
struct Slow(Arc<Collect>, Mutex<mpsc::Receiver<()>>);
impl NetHandler for Slow {
    fn accepted(&self, c: ConnId, f: SocketAddr) {
        self.0.accepted(c, f)
    }
    fn connected(&self, c: ConnId, t: u64) {
        self.0.connected(c, t)
    }
    fn connect_failed(&self, t: u64, e: io::Error) {
        self.0.connect_failed(t, e)
    }
    fn message(&self, c: ConnId, m: Message) {
        let big = matches!(&m, Message::Append(r) if r.bytes.len() > 100_000);
        self.0.message(c, m);
        if big {
            let _ = self.1.lock().recv_timeout(WAIT);
        }
    }
    fn closed(&self, c: ConnId, e: Option<String>) {
        self.0.closed(c, e)
    }
}

#[test]
fn a_flooding_database_does_not_hold_back_another_databases_small_commit() {
    for backend in backends() {
        let limits = Limits {
            channel_window: 512 << 10,
            connection_window: 1 << 20,
            ..Limits::default()
        };
        let srv = Mux::open(backend, None, limits).expect("mux");
        // The acceptor blocks on A's messages until told to go on: A's
        // window fills and stays full.
        let (gate_tx, gate_rx) = mpsc::channel::<()>();
        let (h, srx) = collector();
        let ep = srv.endpoint(Arc::new(Slow(h, Mutex::new(gate_rx))));
        let addr = ep.listen(local()).expect("listen");
        let client = Mux::open(backend, None, limits).expect("mux");
        let (ha, rxa) = collector();
        let (hb, rxb) = collector();
        let (a, bb) = (client.endpoint(ha), client.endpoint(hb));
        a.connect(addr, 1);
        let ca = connected(&rxa);
        bb.connect(addr, 2);
        let cb = connected(&rxb);
        a.send(ca, &handshake(1));
        bb.send(cb, &handshake(2));
        // A floods: 64 records of 256 KiB (16 MiB), far past its window.
        for s in 1..=64 {
            a.send(ca, &append(s, 64));
        }
        // B's small commit, queued behind all of that.
        bb.send(cb, &append(1, 1));
        // Let A's records through one by one; B's commit must arrive before
        // more than A's window (plus the frame in hand) of A's records did.
        let mut a_records = 0;
        loop {
            match next_event(&srx) {
                Ev::Message(_, m @ Message::Append(_)) if m == append(1, 1) => break,
                Ev::Message(_, Message::Append(_)) => {
                    a_records += 1;
                    let _ = gate_tx.send(());
                }
                Ev::Message(..) | Ev::Accepted(_) => {}
                e => panic!("unexpected {e:?}"),
            }
        }
        let per = 64 * 4096 + 64;
        assert!(
            a_records as u64 <= limits.channel_window / per as u64 + 2,
            "{backend:?}: {a_records} of A's records went before B's commit"
        );
        // Unblock the rest.
        for _ in 0..64 {
            let _ = gate_tx.send(());
        }
        client.shutdown();
        srv.shutdown();
    }
}

#[test]
fn a_flood_past_the_connections_queue_bound_closes_the_flooding_channel_not_the_others() {
    for backend in backends() {
        let limits = Limits {
            channel_window: 64 << 10,
            connection_window: 128 << 10,
            max_channel_queued: 4 << 20,
            max_connection_queued: 1 << 20,
            ..Limits::default()
        };
        let srv = Mux::open(backend, None, Limits::default()).expect("mux");
        let (gate_tx, gate_rx) = mpsc::channel::<()>();
        let (h, srx) = collector();
        let ep = srv.endpoint(Arc::new(Slow(h, Mutex::new(gate_rx))));
        let addr = ep.listen(local()).expect("listen");
        let client = Mux::open(backend, None, limits).expect("mux");
        let (ha, rxa) = collector();
        let (hb, rxb) = collector();
        let (a, bb) = (client.endpoint(ha), client.endpoint(hb));
        a.connect(addr, 1);
        let ca = connected(&rxa);
        bb.connect(addr, 2);
        let cb = connected(&rxb);
        bb.send(cb, &handshake(2));
        bb.send(cb, &append(1, 1));
        a.send(ca, &handshake(1));
        // Far more than the window lets out and the connection may queue,
        // faster than any credit can come back.
        for s in 1..=16 {
            a.send(ca, &append(s, 64));
        }
        match next_event(&rxa) {
            Ev::Closed(c, Some(why)) => {
                assert_eq!(c, ca);
                assert!(why.contains("over all channels"), "{why}");
            }
            e => panic!("expected A closed, got {e:?}"),
        }
        // B still works, on the same connection.
        bb.send(cb, &append(2, 1));
        for _ in 0..16 {
            let _ = gate_tx.send(());
        }
        let mut got_b = 0;
        while got_b < 2 {
            match next_event(&srx) {
                Ev::Message(_, m) if m == append(1, 1) || m == append(2, 1) => got_b += 1,
                _ => {}
            }
        }
        let s = client.snapshot();
        assert_eq!((s.connections, s.channels), (1, 1));
        assert!(s.refusals >= 1);
        client.shutdown();
        srv.shutdown();
    }
}

#[test]
fn frames_of_many_channels_in_one_read_are_drained_per_channel_then_done_once_per_endpoint() {
    // The real transport's side driven by hand: one read brought frames
    // of two channels (databases); the endpoint hears `drained` once for
    // each, then one `drains_done` (a follower host's single sync round).
    let mux = Mux::open(Backend::Std, None, Limits::default()).expect("mux");
    let (h, rx) = collector();
    let ep = mux.endpoint(h);
    ep.listen(local()).expect("listen");
    let real = recv::RealHandler {
        inner: Arc::downgrade(&mux.inner),
    };
    let from = local();
    real.accepted(999, from);
    real.message(999, mux_frame(1, 10, MuxOp::Open));
    real.message(999, mux_frame(2, 20, MuxOp::Open));
    for (ch, db) in [(1, 10), (2, 20), (1, 10), (2, 20)] {
        real.message(999, mux_frame(ch, db, MuxOp::Data(Box::new(append(1, 1)))));
    }
    real.drained(999);
    real.drains_done();
    let mut events = Vec::new();
    while let Ok(e) = rx.recv_timeout(Duration::from_millis(100)) {
        events.push(e);
    }
    let accepted: Vec<ConnId> = events
        .iter()
        .filter_map(|e| match e {
            Ev::Accepted(v) => Some(*v),
            _ => None,
        })
        .collect();
    assert_eq!(accepted.len(), 2);
    let messages = events
        .iter()
        .filter(|e| matches!(e, Ev::Message(..)))
        .count();
    assert_eq!(messages, 4);
    let mut drained: Vec<ConnId> = events
        .iter()
        .filter_map(|e| match e {
            Ev::Drained(v) => Some(*v),
            _ => None,
        })
        .collect();
    drained.sort_unstable();
    assert_eq!(drained, accepted, "each channel drained once");
    assert!(matches!(events.last(), Some(Ev::DrainsDone)));
    let done = events
        .iter()
        .filter(|e| matches!(e, Ev::DrainsDone))
        .count();
    assert_eq!(done, 1, "one drains_done for the endpoint");
    // A read that brought nothing for the endpoint drains nothing.
    real.drained(999);
    real.drains_done();
    assert!(rx.recv_timeout(Duration::from_millis(100)).is_err());
    mux.shutdown();
}

#[test]
fn a_peer_opening_more_channels_than_allowed_is_refused_the_extra_ones() {
    let srv = Mux::open(
        Backend::Std,
        None,
        Limits {
            max_channels: 2,
            ..Limits::default()
        },
    )
    .expect("mux");
    let (h, srx) = collector();
    let ep = srv.endpoint(h);
    let addr = ep.listen(local()).expect("listen");
    let (t, rx, c) = raw_client(addr);
    for ch in 1..=3 {
        t.send(c, &mux_frame(ch, ch, MuxOp::Open));
    }
    match next_event(&rx) {
        Ev::Message(_, Message::Mux(f)) => {
            assert_eq!(f.channel, ChannelId(3));
            assert_eq!(f.op, MuxOp::Close(CloseReason::Refused));
        }
        e => panic!("expected a refusal, got {e:?}"),
    }
    let accepted = std::iter::from_fn(|| srx.recv_timeout(Duration::from_millis(200)).ok())
        .filter(|e| matches!(e, Ev::Accepted(_)))
        .count();
    assert_eq!(accepted, 2);
    assert_eq!(srv.snapshot().refusals, 1);
    assert_eq!(srv.snapshot().connections, 1, "the connection stays");
    t.shutdown();
    srv.shutdown();
}
