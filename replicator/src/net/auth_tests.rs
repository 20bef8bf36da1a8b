//! The handshake and the frame tags, alone and over both transports.

use super::*;
use crate::bookmark::{Bookmark, Epoch, Sequence};
use crate::ids::DatabaseId;
use crate::net::{ConnId, NetHandler, Transport, split_frames};
use crate::wire::{Message, Role};
use bytes::BytesMut;
use parking_lot::Mutex;
use std::net::TcpListener;
use std::sync::mpsc;
use std::time::Instant;

const WAIT: Duration = Duration::from_secs(10);

fn key(b: u8) -> ClusterKey {
    ClusterKey::from_bytes([b; 32])
}

fn local() -> SocketAddr {
    "127.0.0.1:0".parse().expect("addr")
}

fn ack(s: u64) -> Message {
    Message::Ack {
        durable: Bookmark::new(Epoch(1), Sequence(s)),
        chain: crate::chain::ChainHash::GENESIS,
    }
}

/// Runs the two halves over a real socket pair; returns both outcomes.
fn handshake(
    dialer: &ClusterKey,
    acceptor: &ClusterKey,
) -> (
    Result<SessionKeys, AuthError>,
    Result<SessionKeys, AuthError>,
) {
    let listener = TcpListener::bind(local()).expect("bind");
    let addr = listener.local_addr().expect("addr");
    let acceptor = acceptor.clone();
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("accept");
        s.set_read_timeout(Some(WAIT)).expect("timeout");
        handshake_as_acceptor(&acceptor, &mut s)
    });
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(WAIT)).expect("timeout");
    let d = handshake_as_dialer(dialer, &mut s);
    drop(s); // a dialer that gave up: the acceptor reads EOF
    (d, server.join().expect("acceptor thread"))
}

#[test]
fn peers_with_the_same_key_agree_on_one_key_per_direction() {
    let (d, a) = handshake(&key(1), &key(1));
    let (d, a) = (d.expect("dialer"), a.expect("acceptor"));
    assert_eq!(d.send, a.receive);
    assert_eq!(d.receive, a.send);
    assert_ne!(d.send, d.receive, "the directions have different keys");
    // Fresh nonces: a second connection gets other keys.
    let (d2, _) = handshake(&key(1), &key(1));
    assert_ne!(d2.expect("dialer").send, d.send);
}

#[test]
fn a_wrong_key_is_refused_by_both_sides() {
    let (d, a) = handshake(&key(1), &key(2));
    assert!(matches!(d, Err(AuthError::BadProof)), "{d:?}");
    // The dialer never sent a proof; the acceptor refuses too.
    assert!(a.is_err(), "{a:?}");
}

#[test]
fn a_dialer_that_guesses_its_proof_is_refused() {
    let listener = TcpListener::bind(local()).expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("accept");
        handshake_as_acceptor(&key(1), &mut s)
    });
    let mut s = TcpStream::connect(addr).expect("connect");
    let mut hello = MAGIC.to_vec();
    hello.extend_from_slice(&[0u8; NONCE_BYTES]);
    s.write_all(&hello).expect("hello");
    let mut challenge = [0u8; CHALLENGE_BYTES];
    s.read_exact(&mut challenge).expect("challenge");
    // Reflect the acceptor's own proof back: the role byte differs.
    s.write_all(&challenge[8 + NONCE_BYTES..]).expect("proof");
    assert!(matches!(
        server.join().expect("thread"),
        Err(AuthError::BadProof)
    ));
}

#[test]
fn a_peer_speaking_the_bare_wire_format_is_refused() {
    let listener = TcpListener::bind(local()).expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("accept");
        handshake_as_acceptor(&key(1), &mut s)
    });
    let mut s = TcpStream::connect(addr).expect("connect");
    let mut frame = Message::CatchUp {
        from: Bookmark::ZERO,
    }
    .encode()
    .expect("encode")
    .to_vec();
    frame.resize(HELLO_BYTES, 0);
    s.write_all(&frame).expect("write");
    assert!(matches!(
        server.join().expect("thread"),
        Err(AuthError::BadMagic)
    ));
}

fn sealed_pair() -> (Sealer, Opener, Arc<Auth>) {
    let auth = Auth::new(Some(key(1)));
    let k = [7u8; 32];
    let seal = Sealer { key: k, seq: 0 };
    let open = Opener {
        key: k,
        seq: 0,
        auth: Arc::clone(&auth),
        peer: local(),
    };
    (seal, open, auth)
}

/// `frames` sealed in order as the transports seal them (from their two
/// parts), each followed by its tag.
fn sealed(seal: &mut Sealer, frames: &[Message]) -> Vec<Vec<u8>> {
    frames
        .iter()
        .map(|m| {
            let (head, body) = crate::wire::encode_parts(m).expect("encode");
            let mut out = [&head[..], &body[..]].concat();
            assert_eq!(
                out,
                m.encode().expect("encode")[..],
                "the parts are the frame"
            );
            out.extend_from_slice(&seal.seal(&head, &body));
            out
        })
        .collect()
}

/// An Append of a record of `pages` 4 KiB page images filled with `fill`.
fn append(pages: u32, fill: u8) -> Message {
    let b = |s| Bookmark::new(Epoch(1), Sequence(s));
    Message::Append(
        crate::record::Record {
            bookmark: b(u64::from(fill) + 1),
            previous: b(u64::from(fill)),
            prev_chain: crate::chain::ChainHash::GENESIS,
            commit_us: 0,
            page_size: 4096,
            db_pages: pages,
            pages: (1..=pages)
                .map(|p| (p, Bytes::from(vec![fill; 4096])))
                .collect(),
        }
        .to_encoded()
        .expect("valid record"),
    )
}

/// What `split_frames` delivers from `stream` before it stops, and whether
/// it stopped on an error.
fn deliver(open: &mut Opener, stream: &[u8]) -> (Vec<Message>, bool) {
    let mut buf = BytesMut::from(stream);
    let mut got = Vec::new();
    let (_, sound) = split_frames(&mut buf, Some(open), |m| got.push(m));
    (got, sound.is_err())
}

#[test]
fn sealed_frames_open_in_order() {
    let (mut seal, mut open, auth) = sealed_pair();
    let frames: Vec<Message> = (1..=5).map(ack).collect();
    let wire = sealed(&mut seal, &frames).concat();
    assert_eq!(deliver(&mut open, &wire), (frames, false));
    assert_eq!(auth.refusals(), 0);
}

#[test]
fn a_tampered_frame_is_refused_before_it_is_decoded() {
    let (mut seal, mut open, auth) = sealed_pair();
    let mut wire = sealed(&mut seal, &[ack(1), ack(2)]);
    let last = wire[1].len() - TAG_BYTES - 1;
    wire[1][last] ^= 1; // a bit of the bookmark
    assert_eq!(deliver(&mut open, &wire.concat()), (vec![ack(1)], true));
    assert_eq!(auth.refusals(), 1);
}

#[test]
fn a_tampered_tag_is_refused() {
    let (mut seal, mut open, _) = sealed_pair();
    let mut wire = sealed(&mut seal, &[ack(1)]);
    let end = wire[0].len() - 1;
    wire[0][end] ^= 0x80;
    assert_eq!(deliver(&mut open, &wire.concat()), (vec![], true));
}

#[test]
fn a_replayed_frame_is_refused() {
    let (mut seal, mut open, _) = sealed_pair();
    let wire = sealed(&mut seal, &[ack(1), ack(2)]);
    let replayed = [wire[0].clone(), wire[1].clone(), wire[1].clone()].concat();
    assert_eq!(deliver(&mut open, &replayed), (vec![ack(1), ack(2)], true));
}

#[test]
fn reordered_or_dropped_frames_are_refused() {
    let (mut seal, mut open, _) = sealed_pair();
    let wire = sealed(&mut seal, &[ack(1), ack(2), ack(3)]);
    let swapped = [wire[1].clone(), wire[0].clone()].concat();
    assert_eq!(deliver(&mut open, &swapped), (vec![], true));
    let (_, mut open, _) = sealed_pair();
    let dropped = [wire[0].clone(), wire[2].clone()].concat();
    assert_eq!(deliver(&mut open, &dropped), (vec![ack(1)], true));
}

#[test]
fn a_frame_from_another_connection_is_refused() {
    let (mut seal, _, _) = sealed_pair();
    let (_, mut other, _) = sealed_pair();
    other.key = [8u8; 32]; // another session's key
    let wire = sealed(&mut seal, &[ack(1)]).concat();
    assert_eq!(deliver(&mut other, &wire), (vec![], true));
}

#[test]
fn a_truncated_tag_is_never_accepted() {
    let (mut seal, mut open, _) = sealed_pair();
    let wire = sealed(&mut seal, &[ack(1), ack(2)]);
    // The tag cut short, then the stream ends: nothing is delivered.
    let cut = &wire[0][..wire[0].len() - 1];
    assert_eq!(deliver(&mut open, cut), (vec![], false));
    // The tag cut short and the next frame after it: the shifted bytes
    // make a bad tag.
    let spliced = [cut, &wire[1][..]].concat();
    assert_eq!(deliver(&mut open, &spliced), (vec![], true));
    // A bare frame with no tag at all, then more frames.
    let (_, mut open, _) = sealed_pair();
    let bare = ack(1).encode().expect("encode");
    let untagged = [&bare[..], &bare[..], &bare[..]].concat();
    assert_eq!(deliver(&mut open, &untagged), (vec![], true));
}

// ---- over the transports ----------------------------------------------

#[derive(Debug, PartialEq)]
enum Ev {
    Up(ConnId),
    DialFailed(u64),
    Message(ConnId, Message),
    Closed(ConnId),
}

struct Collect(Mutex<mpsc::Sender<Ev>>);

impl NetHandler for Collect {
    fn accepted(&self, conn: ConnId, _: SocketAddr) {
        let _ = self.0.lock().send(Ev::Up(conn));
    }
    fn connected(&self, conn: ConnId, _: u64) {
        let _ = self.0.lock().send(Ev::Up(conn));
    }
    fn connect_failed(&self, tag: u64, _: io::Error) {
        let _ = self.0.lock().send(Ev::DialFailed(tag));
    }
    fn message(&self, conn: ConnId, message: Message) {
        let _ = self.0.lock().send(Ev::Message(conn, message));
    }
    fn closed(&self, conn: ConnId, _: Option<String>) {
        let _ = self.0.lock().send(Ev::Closed(conn));
    }
}

type Side = (Box<dyn Transport>, mpsc::Receiver<Ev>);
/// A transport, its events and its authentication.
type KeyedSide = (Box<dyn Transport>, mpsc::Receiver<Ev>, Arc<Auth>);

/// Both transports (io_uring where the kernel allows it), with `key`.
fn transports(key: Option<ClusterKey>) -> Vec<Side> {
    transports_with_auth(key)
        .into_iter()
        .map(|(t, rx, _)| (t, rx))
        .collect()
}

/// As [`transports`], with each one's [`Auth`].
fn transports_with_auth(key: Option<ClusterKey>) -> Vec<KeyedSide> {
    let mut out: Vec<KeyedSide> = Vec::new();
    let (tx, rx) = mpsc::channel();
    let handler = Arc::new(Collect(Mutex::new(tx)));
    let auth = Auth::new(key.clone());
    out.push((
        Box::new(crate::net::std_net::StdTransport::new(
            handler,
            Arc::clone(&auth),
        )),
        rx,
        auth,
    ));
    #[cfg(target_os = "linux")]
    {
        let (tx, rx) = mpsc::channel();
        let handler = Arc::new(Collect(Mutex::new(tx)));
        let auth = Auth::new(key);
        let made = crate::net::uring_net::UringTransport::new(handler, Arc::clone(&auth));
        if let Some(t) = crate::uring::available_or_skip(made, "only std tested") {
            out.push((Box::new(t), rx, auth));
        }
    }
    out
}

fn next(rx: &mpsc::Receiver<Ev>) -> Ev {
    rx.recv_timeout(WAIT).expect("an event in time")
}

fn quiet(rx: &mpsc::Receiver<Ev>) {
    if let Ok(ev) = rx.recv_timeout(Duration::from_millis(300)) {
        panic!("unexpected event {ev:?}");
    }
}

fn wait_refusals(t: &dyn Transport, at_least: u64) {
    let deadline = Instant::now() + WAIT;
    while t.auth_refusals() < at_least {
        assert!(Instant::now() < deadline, "refusal not counted");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn same_key_peers_exchange_messages_and_appends_on_both_transports() {
    for (server, server_rx) in transports(Some(key(1))) {
        for (client, client_rx) in transports(Some(key(1))) {
            let addr = server.listen(local()).expect("listen");
            client.connect(addr, 1);
            let Ev::Up(conn) = next(&client_rx) else {
                panic!("not connected");
            };
            let Ev::Up(at_server) = next(&server_rx) else {
                panic!("not accepted");
            };
            let record = crate::record::Record {
                bookmark: Bookmark::new(Epoch(1), Sequence(1)),
                previous: Bookmark::ZERO,
                prev_chain: crate::chain::ChainHash::GENESIS,
                commit_us: 0,
                page_size: 4096,
                db_pages: 2,
                pages: vec![(2, bytes::Bytes::from(vec![9u8; 4096]))],
            };
            let append = Message::Append(record.to_encoded().expect("encode"));
            for m in [ack(1), append.clone(), ack(2)] {
                client.send(conn, &m);
            }
            server.send(at_server, &ack(3));
            for want in [ack(1), append, ack(2)] {
                assert_eq!(next(&server_rx), Ev::Message(at_server, want));
            }
            assert_eq!(next(&client_rx), Ev::Message(conn, ack(3)));
            assert_eq!((server.auth_refusals(), client.auth_refusals()), (0, 0));
        }
    }
}

#[test]
fn a_dialer_with_another_key_is_never_announced_on_both_transports() {
    for (server, server_rx) in transports(Some(key(1))) {
        for (client, client_rx) in transports(Some(key(2))) {
            let addr = server.listen(local()).expect("listen");
            client.connect(addr, 4);
            assert_eq!(next(&client_rx), Ev::DialFailed(4));
            wait_refusals(&*client, 1);
            wait_refusals(&*server, 1);
            quiet(&server_rx);
        }
    }
}

#[test]
fn an_unauthenticated_dialer_gets_nothing_through_on_both_transports() {
    for (server, server_rx) in transports(Some(key(1))) {
        let addr = server.listen(local()).expect("listen");
        let mut rogue = TcpStream::connect(addr).expect("connect");
        let handshake = Message::Handshake {
            database: DatabaseId(1),
            epoch: Epoch(u32::MAX),
            role: Role::Leader,
            last_durable: Bookmark::ZERO,
            node: crate::ids::NodeId(1),
            last_chain: crate::chain::ChainHash::GENESIS,
            confirmed: Bookmark::ZERO,
            history: crate::history::History::new(),
        };
        let mut bytes = handshake.encode().expect("encode").to_vec();
        bytes.extend_from_slice(&ack(1).encode().expect("encode"));
        bytes.resize(HELLO_BYTES + PROOF_BYTES, 0);
        rogue.write_all(&bytes).expect("write");
        rogue.set_read_timeout(Some(WAIT)).expect("timeout");
        let mut back = Vec::new();
        let _ = rogue.read_to_end(&mut back);
        assert!(back.is_empty(), "{}: the rogue got bytes", server.backend());
        wait_refusals(&*server, 1);
        quiet(&server_rx);
    }
}

#[test]
fn a_keyed_peer_that_plays_a_bad_tag_is_closed_before_delivery_on_both_transports() {
    for (server, server_rx) in transports(Some(key(1))) {
        let addr = server.listen(local()).expect("listen");
        let mut peer = TcpStream::connect(addr).expect("connect");
        let keys = handshake_as_dialer(&key(1), &mut peer).expect("handshake");
        let Ev::Up(conn) = next(&server_rx) else {
            panic!("not accepted");
        };
        let mut seal = Sealer {
            key: keys.send,
            seq: 0,
        };
        let first = sealed(&mut seal, &[ack(1)]).concat();
        peer.write_all(&first).expect("write");
        assert_eq!(next(&server_rx), Ev::Message(conn, ack(1)));
        // The same frame again: a replay.
        peer.write_all(&first).expect("write");
        assert_eq!(next(&server_rx), Ev::Closed(conn));
        assert_eq!(server.auth_refusals(), 1, "{}", server.backend());
    }
}

#[test]
fn an_unkeyed_transport_cannot_talk_to_a_keyed_one() {
    for (server, server_rx) in transports(Some(key(1))) {
        for (client, client_rx) in transports(None) {
            let addr = server.listen(local()).expect("listen");
            client.connect(addr, 2);
            // The open side connects at TCP level and may send; the keyed
            // side never announces it and refuses it.
            if let Ev::Up(conn) = next(&client_rx) {
                client.send(conn, &ack(1));
                assert_eq!(next(&client_rx), Ev::Closed(conn));
            }
            wait_refusals(&*server, 1);
            quiet(&server_rx);
        }
    }
}

#[test]
fn past_the_pending_handshake_bound_connections_close_at_once_and_slots_come_back() {
    for (server, server_rx, auth) in transports_with_auth(Some(key(1))) {
        let addr = server.listen(local()).expect("listen");
        // Silent peers fill every slot (each held until its deadline).
        let silent: Vec<TcpStream> = (0..MAX_PENDING_HANDSHAKES)
            .map(|_| TcpStream::connect(addr).expect("connect"))
            .collect();
        // Make sure the accept loop has taken every one of them.
        let deadline = Instant::now() + WAIT;
        while auth.pending() < MAX_PENDING_HANDSHAKES {
            assert!(
                Instant::now() < deadline,
                "the silent peers were not all accepted"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        // One more: closed at once, long before the handshake deadline.
        let started = Instant::now();
        let mut extra = TcpStream::connect(addr).expect("connect");
        extra.set_read_timeout(Some(WAIT)).expect("timeout");
        assert_eq!(read_past_signals(&mut extra), 0, "{}", server.backend());
        assert!(
            started.elapsed() < HANDSHAKE_TIMEOUT,
            "{}",
            server.backend()
        );
        wait_refusals(&*server, 1);
        // The silent ones go away (or would time out) and give their slots
        // back: a keyed peer gets through again.
        drop(silent);
        let (client, client_rx) = transports(Some(key(1))).remove(0);
        client.connect(addr, 9);
        let Ev::Up(_) = next(&client_rx) else {
            panic!("{}: no slot came back", server.backend());
        };
        assert!(matches!(next(&server_rx), Ev::Up(_)));
    }
}

#[test]
fn a_silent_peer_is_refused_at_the_handshake_deadline() {
    let (server, _rx) = transports(Some(key(1))).remove(0);
    let addr = server.listen(local()).expect("listen");
    let started = Instant::now();
    let mut silent = TcpStream::connect(addr).expect("connect");
    silent.set_read_timeout(Some(WAIT)).expect("timeout");
    assert_eq!(read_past_signals(&mut silent), 0, "closed, nothing sent");
    let waited = started.elapsed();
    assert!(
        waited >= HANDSHAKE_TIMEOUT / 2 && waited < WAIT,
        "{waited:?}"
    );
    wait_refusals(&*server, 1);
}

/// One read, retried when a signal interrupts it: the bytes read (0 at
/// EOF, a reset or the read timeout).
fn read_past_signals(s: &mut TcpStream) -> usize {
    let mut buf = [0u8; 1];
    loop {
        match s.read(&mut buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => return r.unwrap_or(0),
        }
    }
}

#[test]
fn a_peer_trickling_its_hello_is_refused_at_the_handshake_deadline_not_later() {
    use std::io::Write;
    let (server, _rx) = transports(Some(key(1))).remove(0);
    let addr = server.listen(local()).expect("listen");
    let started = Instant::now();
    let mut slow = TcpStream::connect(addr).expect("connect");
    // One byte every quarter of the deadline: each read would finish well
    // inside a per-read timeout, so only a deadline for the whole
    // handshake ends it.
    let step = HANDSHAKE_TIMEOUT / 4;
    let mut refused_after = None;
    for _ in 0..40 {
        if slow.write_all(&[0u8]).is_err() {
            refused_after = Some(started.elapsed());
            break;
        }
        std::thread::sleep(step);
        if server.auth_refusals() > 0 {
            refused_after = Some(started.elapsed());
            break;
        }
    }
    let after = refused_after.expect("the trickling peer was never refused");
    assert!(after < HANDSHAKE_TIMEOUT * 2, "held for {after:?}");
}

#[test]
fn one_record_sealed_for_several_connections_opens_on_each() {
    // The same shared record buffer tagged on three connections in turn
    // (its digest computed once per thread), then another record.
    let session_key = |k: u8| [k; 32];
    let mut seals: Vec<Sealer> = (1..=3)
        .map(|k| Sealer {
            key: session_key(k),
            seq: 0,
        })
        .collect();
    let auth = Auth::new(Some(key(1)));
    let mut opens: Vec<Opener> = (1..=3)
        .map(|k| Opener {
            key: session_key(k),
            seq: 0,
            auth: Arc::clone(&auth),
            peer: local(),
        })
        .collect();
    let records = [append(2, 1), append(2, 2), append(1, 3)];
    let mut streams = vec![Vec::new(); 3];
    for m in &records {
        for (seal, stream) in seals.iter_mut().zip(&mut streams) {
            stream.extend(sealed(seal, std::slice::from_ref(m)).concat());
        }
    }
    for (open, stream) in opens.iter_mut().zip(&streams) {
        assert_eq!(deliver(open, stream), (records.to_vec(), false));
    }
    // Each connection's tags are its own: one stream opened with another
    // connection's key is refused at its first frame.
    let mut wrong = Opener {
        key: session_key(2),
        seq: 0,
        auth: Arc::clone(&auth),
        peer: local(),
    };
    assert_eq!(deliver(&mut wrong, &streams[0]), (vec![], true));
    assert_eq!(auth.refusals(), 1);
}

#[test]
fn a_tampered_record_byte_is_refused() {
    let (mut seal, mut open, auth) = sealed_pair();
    let mut wire = sealed(&mut seal, &[append(2, 1), append(2, 2)]);
    let middle = wire[1].len() / 2;
    wire[1][middle] ^= 0x80; // a byte of the second record's page
    assert_eq!(
        deliver(&mut open, &wire.concat()),
        (vec![append(2, 1)], true)
    );
    assert_eq!(auth.refusals(), 1);
}

#[test]
fn a_frame_sealed_from_its_parts_or_whole_gets_the_same_tag() {
    let (mut by_parts, _, _) = sealed_pair();
    let (mut whole, _, _) = sealed_pair();
    for m in [append(1, 9), ack(4)] {
        let (head, body) = crate::wire::encode_parts(&m).expect("encode");
        let frame = m.encode().expect("encode");
        assert_eq!(
            by_parts.seal(&head, &body),
            whole.seal(&frame, &Bytes::new()),
            "{m:?}"
        );
        // And from a head shorter than the frame header.
        let (mut short, _, _) = sealed_pair();
        let (mut reference, _, _) = sealed_pair();
        assert_eq!(
            short.seal(&frame[..3], &frame.slice(3..)),
            reference.seal(&frame, &Bytes::new())
        );
    }
}

#[test]
fn the_recent_digests_find_a_body_by_its_buffer_and_bytes_and_replace_the_oldest() {
    let mut recent = Recent {
        entries: Vec::new(),
        next: 0,
    };
    let bodies: Vec<Bytes> = (0..=RECENT_DIGESTS)
        .map(|i| Bytes::from((i as u32).to_be_bytes().repeat(64)))
        .collect();
    for b in &bodies[..RECENT_DIGESTS] {
        recent.put(b, blake3::hash(b));
    }
    assert_eq!(recent.get(&bodies[0]), Some(blake3::hash(&bodies[0])));
    assert_eq!(
        recent.get(&bodies[0].clone()),
        Some(blake3::hash(&bodies[0]))
    );
    // Equal bytes in another buffer are another body.
    assert_eq!(recent.get(&Bytes::copy_from_slice(&bodies[0])), None);
    // The same buffer holding other bytes (an address reused) is too.
    let mut reused = bodies[2].to_vec();
    let at = reused.as_ptr() as usize;
    recent.put(&reused, blake3::hash(&reused));
    reused[0] ^= 1;
    assert_eq!(reused.as_ptr() as usize, at);
    assert_eq!(recent.get(&reused), None);
    // Past the bound, the oldest go and the rest stay.
    let newest = &bodies[RECENT_DIGESTS];
    recent.put(newest, blake3::hash(newest));
    assert_eq!(recent.get(&bodies[0]), None);
    assert_eq!(recent.get(&bodies[1]), None);
    assert_eq!(recent.get(&bodies[2]), Some(blake3::hash(&bodies[2])));
    assert_eq!(recent.get(newest), Some(blake3::hash(newest)));
    assert_eq!(recent.entries.len(), RECENT_DIGESTS);
}

#[test]
fn a_record_tagged_by_one_thread_then_another_gets_the_same_tags_as_from_scratch() {
    let records: Vec<(Bytes, Bytes)> = (1..=5)
        .map(|s| crate::wire::encode_parts(&append(s, s as u8)).expect("encode"))
        .collect();
    // A committing session tags each record for its eager peers...
    let (mut eager, _, _) = sealed_pair();
    let first: Vec<Bytes> = records.iter().map(|(h, b)| eager.seal(h, b)).collect();
    // ...and the ticker, on its own thread, for each lazy follower in turn.
    let copy = records.clone();
    let tags = std::thread::spawn(move || {
        let mut tags = Vec::new();
        for _ in 0..2 {
            let (mut lazy, _, _) = sealed_pair();
            tags.push(
                copy.iter()
                    .map(|(h, b)| lazy.seal(h, b))
                    .collect::<Vec<_>>(),
            );
        }
        tags
    })
    .join()
    .expect("ticker");
    // Same key, same sequence numbers: the same tags, and the same as
    // tags over copies no cache holds.
    assert_eq!(tags, [first.clone(), first.clone()]);
    let (mut fresh, _, _) = sealed_pair();
    let scratch: Vec<Bytes> = records
        .iter()
        .map(|(h, b)| fresh.seal(h, &Bytes::copy_from_slice(b)))
        .collect();
    assert_eq!(scratch, first);
}
