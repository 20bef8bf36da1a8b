//! Authentication of the replication ports, with real processes: three
//! `walrelay follower` processes and a `walrelay replica` process around a
//! primary in this process (so the test sees each write's outcome), all
//! sharing one cluster key. A rogue that speaks the wire format (the
//! replicator's own encoders) but lacks the key tries to read the log with
//! a catch-up, fence the primary with a huge epoch, append a forged record,
//! ack on the primary's replica port as if it were a follower, and
//! subscribe as a replica — first as the bare wire format, then going
//! through the auth handshake with a guessed proof. Every attempt must get
//! no log bytes and change nothing, while writes keep committing before,
//! during and after. A control run shows the same rogue succeeds against a
//! follower started with `--insecure-replication`.

mod common;

use bytes::Bytes;
use common::{Proc, cluster_key_file, free_port, join_addrs, key_args, wait_accepting};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use walrelay_engine::replication::{PrimaryConfig, ReplicatedPrimary};
use walrelay_engine::{Bookmark, Constraint, Epoch, Sequence, Value};
use walrelay_replicator::net::Backend;
use walrelay_replicator::net::auth::{CHALLENGE_BYTES, MAGIC, NONCE_BYTES, PROOF_BYTES, TAG_BYTES};
use walrelay_replicator::wire::{Message, Role};
use walrelay_replicator::{ChainHash, DatabaseId, History, NodeId, Record, SegmentLog, epoch_file};

const N: usize = 3;
const W: usize = 2;
/// The forged record's page: a pattern no real page of this test holds.
const FORGED: u8 = 0xEE;

// ---- the rogue ----------------------------------------------------------

/// How the rogue opens a connection.
#[derive(Debug, Clone, Copy)]
enum Rogue {
    /// Straight to protocol frames, as before authentication existed.
    Bare,
    /// Through the auth handshake with a made-up proof (it lacks the key),
    /// then frames with made-up tags.
    Guessing,
}

fn frames(messages: &[Message]) -> Vec<u8> {
    messages
        .iter()
        .flat_map(|m| m.encode().expect("encode").to_vec())
        .collect()
}

/// Everything `stream` sends until it closes or is silent for `quiet`.
fn read_all(stream: &mut TcpStream, quiet: Duration) -> Vec<u8> {
    stream.set_read_timeout(Some(quiet)).expect("timeout");
    let mut got = Vec::new();
    let mut buf = [0u8; 64 * 1024];
    loop {
        match stream.read(&mut buf) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Ok(0) | Err(_) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// Plays `messages` at `addr` the `how` way; returns the bytes that came
/// back after the handshake (for `Guessing`, after the acceptor's
/// challenge, which holds no log data) until the peer closed or was quiet
/// for `quiet`.
fn attack(addr: SocketAddr, how: Rogue, messages: &[Message], quiet: Duration) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).expect("the rogue reaches the port");
    let mut out = Vec::new();
    if let Rogue::Guessing = how {
        let mut hello = MAGIC.to_vec();
        hello.extend_from_slice(&[0x42; NONCE_BYTES]);
        s.write_all(&hello).expect("hello");
        let mut challenge = [0u8; CHALLENGE_BYTES];
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        s.read_exact(&mut challenge).expect("a challenge");
        assert_eq!(challenge[..8], MAGIC);
        out.extend_from_slice(&[0x13; PROOF_BYTES]); // a guess
        for m in messages {
            out.extend_from_slice(&m.encode().expect("encode"));
            out.extend_from_slice(&[0x37; TAG_BYTES]);
        }
    } else {
        out = frames(messages);
    }
    // The peer may close mid-write: what it read is what counts.
    let _ = s.write_all(&out);
    read_all(&mut s, quiet)
}

fn b(epoch: u32, seq: u64) -> Bookmark {
    Bookmark::new(Epoch(epoch), Sequence(seq))
}

fn leader_handshake(epoch: u32) -> Message {
    Message::Handshake {
        database: DatabaseId(1),
        epoch: Epoch(epoch),
        role: Role::Leader,
        last_durable: Bookmark::ZERO,
        node: NodeId(7),
        last_chain: ChainHash::GENESIS,
        confirmed: Bookmark::ZERO,
        history: History::new(),
    }
}

fn forged_record(bookmark: Bookmark, previous: Bookmark) -> Message {
    let record = Record {
        bookmark,
        previous,
        prev_chain: ChainHash::GENESIS,
        commit_us: 0,
        page_size: 4096,
        db_pages: 1,
        pages: vec![(1, Bytes::from(vec![FORGED; 4096]))],
    };
    Message::Append(record.to_encoded().expect("a well-formed record"))
}

fn holds_forgery(bytes: &[u8]) -> bool {
    bytes.windows(64).any(|w| w.iter().all(|b| *b == FORGED))
}

// ---- the cluster --------------------------------------------------------

fn follower_args(addr: SocketAddr, dir: &Path, peers: &[SocketAddr], net: &str) -> Vec<String> {
    vec![
        "follower".into(),
        "--listen".into(),
        addr.to_string(),
        "--dir".into(),
        dir.display().to_string(),
        "--peers".into(),
        join_addrs(peers),
        "--net".into(),
        net.into(),
    ]
}

fn start_follower(name: &str, args: Vec<String>, addr: SocketAddr) -> Proc {
    let mut p = Proc::spawn(name, &args);
    p.wait_line("listening");
    wait_accepting(addr, name);
    p
}

fn insert(p: &ReplicatedPrimary, n: i64) -> Result<Bookmark, walrelay_engine::QueryError> {
    let s = p
        .database()
        .session(Constraint::FirstPrimary)
        .expect("session");
    let r = s
        .prepare("INSERT INTO t(n, pad) VALUES (?1, ?2)")
        .bind([Value::Integer(n), Value::Text("x".repeat(200))])
        .run()?;
    Ok(r.meta.bookmark)
}

fn log_records(dir: &Path) -> Vec<Bytes> {
    let (log, _) = SegmentLog::open(&dir.join("log"), 64 << 20, Bookmark::ZERO).expect("open log");
    log.read_after(Bookmark::ZERO).expect("read log")
}

fn replica_confirmed(p: &Proc) -> Option<Bookmark> {
    p.lines.lock().expect("lines").iter().rev().find_map(|l| {
        let v = l.split("confirmed=").nth(1)?;
        v.split_whitespace().next()?.parse().ok()
    })
}

fn refusals(p: &Proc) -> usize {
    p.error_lines("replication auth refused").len()
}

#[test]
fn over_io_uring_a_rogue_without_the_key_gets_nothing_and_changes_nothing() {
    rogue_scenario("io_uring");
}

#[test]
fn over_std_sockets_a_rogue_without_the_key_gets_nothing_and_changes_nothing() {
    rogue_scenario("std");
}

fn rogue_scenario(net: &str) {
    let root = tempfile::tempdir().expect("tempdir");
    let (key_file, key) = cluster_key_file(root.path());
    let addrs: Vec<SocketAddr> = (0..N).map(|_| free_port()).collect();
    let dirs: Vec<PathBuf> = (0..N).map(|i| root.path().join(format!("f{i}"))).collect();
    let mut followers: Vec<Proc> = (0..N)
        .map(|i| {
            let peers: Vec<SocketAddr> =
                addrs.iter().filter(|a| **a != addrs[i]).copied().collect();
            let mut args = follower_args(addrs[i], &dirs[i], &peers, net);
            args.extend(key_args(&key_file));
            start_follower(&format!("follower {i}"), args, addrs[i])
        })
        .collect();
    let mut config = PrimaryConfig::new(root.path().join("primary.db"), addrs.clone(), Some(key));
    config.write_quorum = W;
    config.listen = Some(free_port());
    // Generous: the followers share this machine's disk with other work.
    config.confirm_timeout_ms = 20_000;
    config.backend = if net == "io_uring" {
        Backend::IoUring
    } else {
        Backend::Std
    };
    let primary = Arc::new(ReplicatedPrimary::start(config).expect("primary"));
    let replica_port = primary.replica_addr().expect("listening");
    let mut replica_args = vec![
        "replica".to_string(),
        "--dir".into(),
        root.path().join("replica").display().to_string(),
        "--leader".into(),
        replica_port.to_string(),
        "--followers".into(),
        join_addrs(&addrs),
        "--net".into(),
        net.into(),
    ];
    replica_args.extend(key_args(&key_file));
    let mut replica = Proc::spawn("replica", &replica_args);
    replica.wait_line("following");

    // Before: writes commit.
    let s = primary
        .database()
        .session(Constraint::FirstPrimary)
        .expect("session");
    s.prepare("CREATE TABLE t(id INTEGER PRIMARY KEY, n INTEGER, pad TEXT)")
        .run()
        .expect("create");
    let mut last = Bookmark::ZERO;
    for n in 0..20 {
        last = insert(&primary, n).expect("a write before the attacks");
    }
    let epoch = primary.database().epoch();
    assert_eq!(epoch_file::load(&dirs[0]).expect("epoch file").epoch, epoch);
    let refused_before: Vec<usize> = followers.iter().map(refusals).collect();

    // During: a writer keeps committing while the rogue attacks.
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let writer = {
        let (p, stop, ok, failed) = (
            Arc::clone(&primary),
            Arc::clone(&stop),
            Arc::clone(&ok),
            Arc::clone(&failed),
        );
        std::thread::spawn(move || {
            let mut n = 1_000;
            let mut last = Bookmark::ZERO;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                match insert(&p, n) {
                    Ok(b) => {
                        last = b;
                        ok.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        eprintln!("write during the attacks failed: {e}");
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            last
        })
    };
    let ok_before_attacks = {
        let started = Instant::now();
        while ok.load(Ordering::Relaxed) < 5 {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the writer never got going"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        ok.load(Ordering::Relaxed)
    };

    let next = b(epoch.0, last.sequence.0 + 1);
    let forged = forged_record(next, last);
    let mut attacks: Vec<(&str, SocketAddr, Vec<Message>)> = Vec::new();
    for &f in &addrs {
        attacks.push((
            "read the log with a catch-up from a follower",
            f,
            vec![Message::CatchUp {
                from: Bookmark::ZERO,
            }],
        ));
        attacks.push((
            "fence through a follower with a huge epoch",
            f,
            vec![leader_handshake(u32::MAX - 1)],
        ));
        attacks.push((
            "append a forged record to a follower",
            f,
            vec![
                leader_handshake(epoch.0),
                forged.clone(),
                Message::Confirm {
                    confirmed: next,
                    confirmed_us: 0,
                },
            ],
        ));
    }
    attacks.push((
        "ack on the primary's replica port as a follower",
        replica_port,
        vec![
            Message::Handshake {
                database: DatabaseId(1),
                epoch,
                role: Role::Follower,
                last_durable: b(epoch.0, 1 << 40),
                node: NodeId(7),
                last_chain: ChainHash::GENESIS,
                confirmed: Bookmark::ZERO,
                history: History::new(),
            },
            Message::Ack {
                durable: b(epoch.0, 1 << 40),
                chain: ChainHash::GENESIS,
            },
        ],
    ));
    attacks.push((
        "subscribe as a replica at the primary",
        replica_port,
        vec![Message::Handshake {
            database: DatabaseId(1),
            epoch: Epoch(0),
            role: Role::Replica,
            last_durable: Bookmark::ZERO,
            node: NodeId(7),
            last_chain: ChainHash::GENESIS,
            confirmed: Bookmark::ZERO,
            history: History::new(),
        }],
    ));
    let attempts: Vec<_> = [Rogue::Bare, Rogue::Guessing]
        .into_iter()
        .flat_map(|how| attacks.iter().map(move |a| (how, a.clone())))
        .map(|(how, (what, addr, messages))| {
            let got =
                std::thread::spawn(move || attack(addr, how, &messages, Duration::from_secs(5)));
            (how, what, addr, got)
        })
        .collect();
    let count = attempts.len();
    for (how, what, addr, got) in attempts {
        let got = got.join().expect("rogue thread");
        assert!(
            got.is_empty(),
            "{how:?} rogue trying to {what} at {addr} got {} bytes back",
            got.len()
        );
    }
    let ok_during = ok.load(Ordering::Relaxed) - ok_before_attacks;
    stop.store(true, Ordering::Relaxed);
    let writer_last = writer.join().expect("writer");
    assert_eq!(failed.load(Ordering::Relaxed), 0, "every write commits");
    assert!(ok_during > 0, "writes committed while the rogue attacked");

    // After: writes still commit, and the replica follows.
    for n in 0..20 {
        last = insert(&primary, 2_000 + n).expect("a write after the attacks");
    }
    assert!(last > writer_last);
    let deadline = Instant::now() + Duration::from_secs(30);
    while replica_confirmed(&replica).is_none_or(|c| c < last) {
        assert!(
            Instant::now() < deadline,
            "the replica never reached {last}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // Nothing changed: no fence, no forged ack counted, every refusal
    // counted and reported.
    let status = primary.status();
    assert_eq!(status.confirmed, last, "confirmed is the real last write");
    assert!(status.streaming_followers >= W);
    for (i, dir) in dirs.iter().enumerate() {
        assert_eq!(
            epoch_file::load(dir).expect("epoch").epoch,
            epoch,
            "follower {i} was fenced"
        );
    }
    // Two attempts at the replica port per rogue kind.
    assert!(
        primary.leader().auth_refusals() >= 4,
        "the primary counted {} refusals",
        primary.leader().auth_refusals()
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    for (i, f) in followers.iter().enumerate() {
        // Three attacks per follower per rogue kind.
        while refusals(f) < refused_before[i] + 6 {
            assert!(
                Instant::now() < deadline,
                "follower {i} reported {} refusals: {:#?}",
                refusals(f) - refused_before[i],
                f.errors.lock().expect("errors")
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    // The forged record is in no log, and the last write is in W of them.
    let mut holding_last = 0;
    for (i, f) in followers.iter_mut().enumerate() {
        f.kill();
        let records = log_records(&dirs[i]);
        assert!(
            !records.iter().any(|r| holds_forgery(r)),
            "follower {i} holds the forged record"
        );
        let has_last = records.iter().any(|r| {
            walrelay_replicator::Encoded::decode(r).is_ok_and(|(e, _)| e.bookmark == last)
        });
        holding_last += usize::from(has_last);
    }
    assert!(
        holding_last >= W,
        "the last write is in {holding_last} logs"
    );
    eprintln!("{count} rogue attempts refused; {ok_during} writes committed meanwhile");
}

/// The same rogue, against a follower whose replication port is open: it
/// fences it, lands its forged record and reads it back with a catch-up.
/// Shows the rogue above is a competent one.
#[test]
fn an_open_follower_is_fenced_forged_and_read_by_the_same_rogue() {
    let root = tempfile::tempdir().expect("tempdir");
    let addr = free_port();
    let dir = root.path().join("f");
    let mut args = follower_args(addr, &dir, &[], "auto");
    args.push("--insecure-replication".into());
    let follower = start_follower("open follower", args, addr);
    assert!(
        !follower
            .error_lines("WARNING: --insecure-replication")
            .is_empty(),
        "the open port is warned about"
    );

    let forged = forged_record(b(7, 1), Bookmark::ZERO);
    let reply = attack(
        addr,
        Rogue::Bare,
        &[
            leader_handshake(7),
            forged,
            Message::Confirm {
                confirmed: b(7, 1),
                confirmed_us: 0,
            },
        ],
        Duration::from_secs(1),
    );
    assert!(!reply.is_empty(), "the open follower answered the rogue");
    assert_eq!(
        epoch_file::load(&dir).expect("epoch").epoch,
        Epoch(7),
        "fenced"
    );
    let log = attack(
        addr,
        Rogue::Bare,
        &[Message::CatchUp {
            from: Bookmark::ZERO,
        }],
        Duration::from_secs(1),
    );
    assert!(holds_forgery(&log), "the rogue read its forged record back");
}

#[test]
fn processes_refuse_to_start_without_a_key_or_with_an_exposed_one() {
    let root = tempfile::tempdir().expect("tempdir");
    let dir = root.path().join("f");
    let run = |extra: &[String]| {
        let mut args = follower_args(free_port(), &dir, &[], "auto");
        args.extend_from_slice(extra);
        std::process::Command::new(env!("CARGO_BIN_EXE_walrelay"))
            .args(&args)
            .output()
            .expect("run walrelay")
    };
    let out = run(&[]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--cluster-key"), "{err}");

    let (key_file, _) = cluster_key_file(root.path());
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let out = run(&key_args(&key_file));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("chmod 600"), "{err}");

    let mut both = key_args(&key_file).to_vec();
    both.push("--insecure-replication".into());
    let out = run(&both);
    assert!(
        !out.status.success(),
        "a key and --insecure-replication conflict"
    );
    assert!(!dir.exists(), "a refused start leaves nothing behind");
}
