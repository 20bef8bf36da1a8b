//! One follower host serving many databases, over real loopback sockets
//! and segment files: leaders (real ones, and a raw one speaking the wire
//! by hand) for several databases against the same hosts.

use bytes::Bytes;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;
use walrelay_replicator::net::Backend;
use walrelay_replicator::node::follower_host::{FollowerHost, FollowerHostConfig, HostError};
use walrelay_replicator::node::leader::{LeaderNode, LeaderNodeConfig};
use walrelay_replicator::wire::FRAME_HEADER_BYTES;
use walrelay_replicator::{
    Bookmark, ChainHash, DatabaseId, Encoded, Epoch, History, Message, NodeId, Record,
    RefuseReason, Role, Sequence,
};

fn b(s: u64) -> Bookmark {
    Bookmark::new(Epoch(1), Sequence(s))
}

/// `n` records of epoch 1 for database `db`, chained, each one 512-byte
/// page that says which database and record it is.
fn records(db: u64, n: u64) -> Vec<Encoded> {
    let mut out: Vec<Encoded> = Vec::new();
    for s in 1..=n {
        let mut page = vec![db as u8; 512];
        page[..8].copy_from_slice(&s.to_be_bytes());
        let r = Record {
            bookmark: b(s),
            previous: if s == 1 { Bookmark::ZERO } else { b(s - 1) },
            prev_chain: out.last().map_or(ChainHash::GENESIS, |r| r.chain),
            commit_us: 0,
            page_size: 512,
            db_pages: 1,
            pages: vec![(1, Bytes::from(page))],
        }
        .to_encoded()
        .expect("record");
        out.push(r);
    }
    out
}

fn config(dir: &Path) -> FollowerHostConfig {
    let mut c = FollowerHostConfig::new("127.0.0.1:0".parse().expect("addr"), dir.into());
    c.backend = Backend::Std;
    c
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "timed out: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn leader(db: DatabaseId, followers: Vec<SocketAddr>) -> LeaderNode {
    LeaderNode::start(LeaderNodeConfig {
        database: db,
        epoch: Epoch(1),
        node: NodeId(1),
        start: Bookmark::ZERO,
        start_chain: ChainHash::GENESIS,
        adopted: Vec::new(),
        history: History::new(),
        followers,
        write_quorum: 2,
        listen: None,
        tail_limit_bytes: 1 << 20,
        heartbeat_interval_ms: 5,
        redial_interval_ms: 20,
        fan_out: walrelay_replicator::leader::FanOut::thrifty(2),
        backend: Backend::Std,
        auth: None,
        mux: None,
    })
    .expect("leader")
}

#[test]
fn two_databases_through_one_host_with_interleaved_commits_from_two_leaders_both_reach_quorum_and_read_back_exactly()
 {
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().expect("dir")).collect();
    let hosts: Vec<FollowerHost> = dirs
        .iter()
        .map(|d| FollowerHost::start(config(d.path())).expect("host"))
        .collect();
    let addrs: Vec<SocketAddr> = hosts.iter().map(|h| h.addr()).collect();
    let (a, bb) = (DatabaseId(0xa), DatabaseId(0xb));
    let (la, lb) = (leader(a, addrs.clone()), leader(bb, addrs.clone()));
    let (ra, rb) = (records(0xa, 200), records(0xb, 200));
    for (x, y) in ra.iter().zip(&rb) {
        la.commit(x.clone()).expect("commit a");
        lb.commit(y.clone()).expect("commit b");
    }
    la.wait_confirmed(b(200), Duration::from_secs(20))
        .expect("a confirmed");
    lb.wait_confirmed(b(200), Duration::from_secs(20))
        .expect("b confirmed");
    for (id, want) in [(a, &ra), (bb, &rb)] {
        // Every host learns the confirmed position from the heartbeats.
        for h in &hosts {
            let db = h.database(id).expect("created by the leader's handshake");
            wait_until("confirmed on the host", || {
                db.confirmed().expect("confirmed") == b(200)
            });
            let mut got: Vec<Bytes> = Vec::new();
            while got.len() < want.len() {
                let after = if got.is_empty() {
                    Bookmark::ZERO
                } else {
                    b(got.len() as u64)
                };
                got.extend(db.read_confirmed(after, 1 << 20).expect("read"));
            }
            let want: Vec<&Bytes> = want.iter().map(|r| &r.bytes).collect();
            assert_eq!(got.iter().collect::<Vec<_>>(), want, "database {id}");
        }
    }
    for h in &hosts {
        assert_eq!(h.databases(), vec![a, bb]);
        assert!(
            h.stats()
                .sync_rounds
                .load(std::sync::atomic::Ordering::Relaxed)
                > 0
        );
    }
}

/// A leader speaking the wire by hand (no cluster key).
struct RawLeader {
    s: TcpStream,
}

impl RawLeader {
    fn connect(addr: SocketAddr, db: DatabaseId, role: Role) -> (RawLeader, Message) {
        let s = TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let mut l = RawLeader { s };
        l.send(&Message::Handshake {
            database: db,
            epoch: Epoch(1),
            role,
            node: NodeId(1),
            last_durable: Bookmark::ZERO,
            last_chain: ChainHash::GENESIS,
            confirmed: Bookmark::ZERO,
            history: History::new(),
        });
        let answer = if role == Role::Leader {
            l.recv()
        } else {
            // Non-leaders get no answer unless refused: ask something.
            l.send(&Message::CatchUp {
                from: Bookmark::ZERO,
            });
            l.recv()
        };
        (l, answer)
    }

    fn send(&mut self, m: &Message) {
        let frame = match m {
            Message::Append(r) => {
                let (head, body) = walrelay_replicator::wire::encode_append(&r.bytes);
                [head.to_vec(), body.to_vec()].concat()
            }
            m => m.encode().expect("encode").to_vec(),
        };
        self.s.write_all(&frame).expect("write");
    }

    fn recv(&mut self) -> Message {
        let mut head = [0u8; 4];
        self.s.read_exact(&mut head).expect("frame length");
        let len = u32::from_be_bytes(head) as usize;
        assert!(len + 4 >= FRAME_HEADER_BYTES && len < 1 << 20);
        let mut frame = head.to_vec();
        frame.resize(len + 4, 0);
        self.s.read_exact(&mut frame[4..]).expect("frame");
        Message::decode(&Bytes::from(frame)).expect("decode").0
    }

    /// Appends `records` and waits for the ack of the last; confirms it.
    fn append_all(&mut self, records: &[Encoded]) {
        for r in records {
            self.send(&Message::Append(r.clone()));
        }
        let last = records.last().expect("some").bookmark;
        loop {
            if let Message::Ack { durable, .. } = self.recv() {
                if durable >= last {
                    break;
                }
            }
        }
        self.send(&Message::Confirm {
            confirmed: last,
            confirmed_us: 0,
        });
    }
}

#[test]
fn a_database_unknown_to_the_host_is_not_created_by_a_replicas_handshake() {
    let dir = tempfile::tempdir().expect("dir");
    let host = FollowerHost::start(config(dir.path())).expect("host");
    let (_r, answer) = RawLeader::connect(host.addr(), DatabaseId(3), Role::Replica);
    assert!(matches!(
        answer,
        Message::Refuse {
            reason: RefuseReason::WrongDatabase,
            ..
        }
    ));
    assert!(host.databases().is_empty());
    assert!(host.database(DatabaseId(3)).is_none());
    // A leader's handshake creates it; then a replica is served.
    let (_l, answer) = RawLeader::connect(host.addr(), DatabaseId(3), Role::Leader);
    assert!(matches!(
        answer,
        Message::Handshake {
            role: Role::Follower,
            ..
        }
    ));
    let (_r, answer) = RawLeader::connect(host.addr(), DatabaseId(3), Role::Replica);
    assert_eq!(
        answer,
        Message::CatchUpDone {
            upto: Bookmark::ZERO
        }
    );
    assert_eq!(host.databases(), vec![DatabaseId(3)]);
}

#[test]
fn the_hosts_database_cap_refuses_the_next_new_database_with_a_typed_error() {
    let dir = tempfile::tempdir().expect("dir");
    let mut c = config(dir.path());
    c.max_databases = 2;
    let host = FollowerHost::start(c).expect("host");
    for id in [1, 2] {
        let (_l, answer) = RawLeader::connect(host.addr(), DatabaseId(id), Role::Leader);
        assert!(matches!(answer, Message::Handshake { .. }), "{answer:?}");
    }
    let (_l, answer) = RawLeader::connect(host.addr(), DatabaseId(3), Role::Leader);
    assert_eq!(
        answer,
        Message::Refuse {
            epoch: Epoch(0),
            reason: RefuseReason::Unavailable
        }
    );
    assert!(matches!(
        host.create(DatabaseId(4)),
        Err(HostError::Full {
            id: DatabaseId(4),
            max: 2
        })
    ));
    // The ones it holds are still served.
    assert!(host.create(DatabaseId(2)).is_ok());
    assert_eq!(host.databases(), vec![DatabaseId(1), DatabaseId(2)]);
}

/// Descriptors of this process open on files under `dir`.
fn open_fds_under(dir: &Path) -> usize {
    let dir = dir.canonicalize().expect("canonical");
    std::fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.flatten()
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .filter(|p| p.starts_with(&dir))
                .count()
        })
        .unwrap_or(0)
}

fn disk_bytes_under(dir: &Path) -> u64 {
    let mut total = 0;
    for e in std::fs::read_dir(dir).expect("dir").flatten() {
        let m = e.metadata().expect("meta");
        total += if m.is_dir() {
            disk_bytes_under(&e.path())
        } else {
            m.len()
        };
    }
    total
}

#[test]
fn an_idle_database_closes_its_files_and_reopens_with_its_log_intact() {
    idle_database(false);
}

#[test]
fn with_per_database_logs_an_idle_database_closes_its_files_and_reopens_with_its_log_intact() {
    idle_database(true);
}

fn idle_database(per_database_logs: bool) {
    let dir = tempfile::tempdir().expect("dir");
    let mut c = config(dir.path());
    c.idle_close = Duration::from_millis(50);
    c.per_database_logs = per_database_logs;
    let host = FollowerHost::start(c).expect("host");
    let id = DatabaseId(0x42);
    let recs = records(0x42, 60);
    {
        let (mut l, answer) = RawLeader::connect(host.addr(), id, Role::Leader);
        assert!(matches!(answer, Message::Handshake { .. }));
        l.append_all(&recs[..40]);
        wait_until("confirmed", || {
            host.database(id).expect("db").confirmed().expect("c") == b(40)
        });
        assert!(open_fds_under(dir.path()) >= 1, "open: its segment");
    } // the leader hangs up
    wait_until("closed when idle", || host.open_databases().is_empty());
    let db_dir = dir.path().join("db").join(id.to_string());
    let fds = open_fds_under(&db_dir);
    let bytes = disk_bytes_under(&db_dir);
    eprintln!(
        "an idle database: {fds} open descriptors, {bytes} bytes on disk of its own (40 records of 512-byte pages)"
    );
    assert_eq!(fds, 0, "an idle database holds no descriptor");
    if per_database_logs {
        assert_eq!(open_fds_under(dir.path()), 0);
        // The promise (20 bytes) and one 64 KiB segment: nothing
        // preallocated beyond the first small segment.
        assert!(bytes <= (64 << 10) + 64, "{bytes} bytes at rest");
    } else {
        // The promise only; its records are its share of the shared log,
        // which holds its active segment open (a page-cache and a direct
        // descriptor) for every database.
        assert!(bytes <= 64, "{bytes} bytes at rest");
        assert!(open_fds_under(&dir.path().join("shared")) <= 2);
        let share = host.database(id).expect("db").disk_bytes().expect("bytes");
        assert!(share <= 40 * 700, "{share} bytes of the shared log");
    }
    // What the archiver asks is answered without reopening it.
    let db = host.database(id).expect("held");
    assert_eq!(db.durable().expect("durable"), b(40));
    assert_eq!(db.confirmed().expect("confirmed"), b(40));
    assert!(host.open_databases().is_empty());
    // Reading reopens it, with the log intact.
    let got = db.read_confirmed(Bookmark::ZERO, 1 << 20).expect("read");
    assert_eq!(got.len(), 40);
    assert!(got.iter().zip(&recs).all(|(g, r)| *g == r.bytes));
    assert_eq!(host.open_databases(), vec![id]);
    // And the leader carries on where it was.
    let (mut l, answer) = RawLeader::connect(host.addr(), id, Role::Leader);
    assert!(
        matches!(answer, Message::Handshake { last_durable, .. } if last_durable == b(40)),
        "{answer:?}"
    );
    l.append_all(&recs[40..]);
    assert_eq!(db.durable().expect("durable"), b(60));
    assert!(
        host.stats()
            .closed
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 1
    );
}

#[test]
fn a_crash_of_the_host_loses_no_acked_record_of_any_database() {
    host_crash(false);
}

#[test]
fn with_per_database_logs_a_crash_of_the_host_loses_no_acked_record_of_any_database() {
    host_crash(true);
}

fn host_crash(per_database_logs: bool) {
    let dir = tempfile::tempdir().expect("dir");
    let mut c = config(dir.path());
    c.per_database_logs = per_database_logs;
    let host = FollowerHost::start(c.clone()).expect("host");
    let ids: Vec<DatabaseId> = (1..=4).map(DatabaseId).collect();
    let mut leaders: Vec<RawLeader> = ids
        .iter()
        .map(|id| RawLeader::connect(host.addr(), *id, Role::Leader).0)
        .collect();
    // Interleaved: every database acked through 30, then more sent that
    // nobody waits for (maybe durable, maybe not).
    let recs: Vec<Vec<Encoded>> = ids.iter().map(|id| records(id.0, 40)).collect();
    for chunk in 0..3 {
        for (l, r) in leaders.iter_mut().zip(&recs) {
            l.append_all(&r[chunk * 10..chunk * 10 + 10]);
        }
    }
    for (l, r) in leaders.iter_mut().zip(&recs) {
        for rec in &r[30..] {
            l.send(&Message::Append(rec.clone()));
        }
    }
    // The crash: the files as they are now (no sync, no clean close),
    // with a torn record written past each log's end.
    let copy = tempfile::tempdir().expect("copy");
    copy_tree(dir.path(), copy.path());
    if per_database_logs {
        for id in &ids {
            tear_tail(&copy.path().join("db").join(id.to_string()).join("log"));
        }
    } else {
        // Every database's records are in the shared log: its newest
        // segment gets the torn tail.
        tear_tail(&copy.path().join("shared"));
    }
    drop(leaders);
    let mut c = config(copy.path());
    c.per_database_logs = per_database_logs;
    let restarted = FollowerHost::start(c).expect("restart");
    assert_eq!(restarted.databases(), ids);
    for (id, r) in ids.iter().zip(&recs) {
        let db = restarted.database(*id).expect("held");
        let durable = db.durable().expect("durable");
        assert!(durable >= b(30), "database {id}: acked 30, holds {durable}");
        let (mut l, answer) = RawLeader::connect(restarted.addr(), *id, Role::Leader);
        assert!(
            matches!(answer, Message::Handshake { last_durable, .. } if last_durable == durable)
        );
        let next = durable.sequence.0 as usize;
        if next < r.len() {
            l.append_all(&r[next..]);
        }
        assert_eq!(db.durable().expect("durable"), b(40));
    }
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("dir").flatten() {
        let target = to.join(e.file_name());
        if e.file_type().expect("type").is_dir() {
            copy_tree(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).expect("copy");
        }
    }
}

/// Writes half a record's worth of junk right after the last non-zero
/// byte of the newest segment in `log` (a segment log's or the shared
/// log's directory).
fn tear_tail(log: &Path) {
    let mut segs: Vec<_> = std::fs::read_dir(log)
        .expect("log")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    segs.sort();
    let Some(newest) = segs.last() else { return };
    let mut data = std::fs::read(newest).expect("segment");
    let end = data.iter().rposition(|&x| x != 0).map_or(0, |i| i + 1);
    let junk = (end + 300).min(data.len());
    for (k, x) in data[end..junk].iter_mut().enumerate() {
        *x = 0x5a ^ k as u8;
    }
    std::fs::write(newest, data).expect("tear");
}

#[test]
fn a_host_that_kept_a_log_per_database_imports_them_into_the_shared_log_when_they_open() {
    let dir = tempfile::tempdir().expect("dir");
    let ids: Vec<DatabaseId> = (1..=3).map(DatabaseId).collect();
    let recs: Vec<Vec<Encoded>> = ids.iter().map(|id| records(id.0, 30)).collect();
    {
        let mut c = config(dir.path());
        c.per_database_logs = true;
        let host = FollowerHost::start(c).expect("host");
        for (id, r) in ids.iter().zip(&recs) {
            let (mut l, _) = RawLeader::connect(host.addr(), *id, Role::Leader);
            l.append_all(&r[..20]);
        }
    }
    // The same files under a host with the shared log (a copy: the first
    // host's threads live on in this process).
    let copy = tempfile::tempdir().expect("copy");
    copy_tree(dir.path(), copy.path());
    let host = FollowerHost::start(config(copy.path())).expect("restart");
    assert_eq!(host.databases(), ids);
    for (id, r) in ids.iter().zip(&recs) {
        let db = host.database(*id).expect("held");
        assert_eq!(db.durable().expect("durable"), b(20), "database {id}");
        let old = copy.path().join("db").join(id.to_string()).join("log");
        assert!(
            !old.exists(),
            "database {id}: its own log is gone once imported"
        );
        let got = db.read_confirmed(Bookmark::ZERO, 1 << 20);
        // Nothing is known confirmed before a leader says so again.
        assert!(got.is_ok());
        let (mut l, answer) = RawLeader::connect(host.addr(), *id, Role::Leader);
        assert!(matches!(answer, Message::Handshake { last_durable, .. } if last_durable == b(20)));
        l.append_all(&r[20..]);
        assert_eq!(db.durable().expect("durable"), b(30));
        wait_until("confirmed", || db.confirmed().expect("c") == b(30));
        let all = db.read_confirmed(Bookmark::ZERO, 1 << 20).expect("read");
        let want: Vec<Bytes> = r.iter().map(|e| e.bytes.clone()).collect();
        assert_eq!(all.len(), want.len(), "database {id}: every record, once");
        assert!(all == want, "database {id}: the same bytes");
    }
    let held = walrelay_replicator::shared_log::SharedLog::inspect(&copy.path().join("shared"))
        .expect("inspect");
    assert_eq!(held.len(), ids.len());
}
