//! The runtimes over real loopback sockets and segment files, in one
//! process: a leader, five followers and a replica subscriber, every
//! connection authenticated with one cluster key.

use bytes::Bytes;
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;
use walrelay_replicator::net::Backend;
use walrelay_replicator::node::follower::{FollowerNode, FollowerNodeConfig};
use walrelay_replicator::node::leader::{LeaderNode, LeaderNodeConfig};
use walrelay_replicator::node::replica::{Applier, ApplierError, ReplicaNode, ReplicaNodeConfig};
use walrelay_replicator::{
    Bookmark, ChainHash, ClusterKey, DatabaseId, Encoded, Epoch, History, NodeId, Record, Sequence,
};

const DB: DatabaseId = DatabaseId(5);

/// The cluster key of the test running on this thread: every test's
/// cluster has its own. Tests run at once in one process (and CI runs
/// binaries beside each other), a leader redials a stopped or reserved
/// follower's address every few milliseconds, and the kernel hands a
/// freed port to the next listener: with one key for all, a leader could
/// join another test's follower (same database, epoch and node), count its
/// acks and confirm what its own followers do not hold. A stranger's key
/// is refused at the handshake instead.
fn key() -> Option<ClusterKey> {
    thread_local!(static KEY: [u8; 32] = rand::random());
    Some(ClusterKey::from_bytes(KEY.with(|k| *k)))
}

fn b(s: u64) -> Bookmark {
    Bookmark::new(Epoch(1), Sequence(s))
}

/// Record `s` of epoch 1, chained onto record `s - 1` (built once).
fn record(s: u64) -> Encoded {
    static BUILT: std::sync::Mutex<Vec<Encoded>> = std::sync::Mutex::new(Vec::new());
    let mut built = BUILT.lock().expect("lock");
    while built.len() < s as usize {
        let n = built.len() as u64 + 1;
        let prev_chain = built.last().map_or(ChainHash::GENESIS, |r| r.chain);
        let r = Record {
            bookmark: b(n),
            previous: if n == 1 { Bookmark::ZERO } else { b(n - 1) },
            prev_chain,
            commit_us: 0,
            page_size: 4096,
            db_pages: 2,
            pages: vec![(2, Bytes::from(vec![n as u8; 4096]))],
        }
        .to_encoded()
        .expect("valid");
        built.push(r);
    }
    built[s as usize - 1].clone()
}

#[derive(Default)]
struct Memory {
    applied: Mutex<Vec<Bookmark>>,
    visible: Mutex<Bookmark>,
    /// Where the followers said their logs start, when they did.
    archived: Mutex<Option<Bookmark>>,
}

impl Applier for Memory {
    fn apply(&self, record: &Encoded) -> Result<(), ApplierError> {
        self.applied.lock().push(record.bookmark);
        Ok(())
    }
    fn confirm(&self, bookmark: Bookmark) -> Result<(), ApplierError> {
        assert!(self.applied.lock().contains(&bookmark));
        *self.visible.lock() = bookmark;
        Ok(())
    }
    fn confirmed(&self) -> Bookmark {
        *self.visible.lock()
    }
    fn discard_unconfirmed(&self) -> Result<(), ApplierError> {
        let v = *self.visible.lock();
        self.applied.lock().retain(|b| *b <= v);
        Ok(())
    }
    fn archived(&self, start: Bookmark, _chain: ChainHash) {
        *self.archived.lock() = Some(start);
    }
}

#[test]
fn records_commit_at_three_of_five_and_reach_the_replica() {
    three_of_five_reach_the_replica(Backend::Std);
}

#[cfg(target_os = "linux")]
#[test]
fn records_commit_at_three_of_five_and_reach_the_replica_over_io_uring() {
    if !uring_or_skip() {
        return;
    }
    three_of_five_reach_the_replica(Backend::IoUring);
}

/// Five followers and a leader over them on `backend` (W = 3), the
/// leader listening for replicas and heartbeating every `heartbeat_ms`.
fn five_followers_and_a_leader(
    backend: Backend,
    heartbeat_ms: u64,
) -> (Vec<tempfile::TempDir>, Vec<FollowerNode>, LeaderNode) {
    five_followers_and_a_leader_fanning_out(
        backend,
        heartbeat_ms,
        walrelay_replicator::leader::FanOut::thrifty(3),
    )
}

/// [`five_followers_and_a_leader`] with the given fan-out.
fn five_followers_and_a_leader_fanning_out(
    backend: Backend,
    heartbeat_ms: u64,
    fan_out: walrelay_replicator::leader::FanOut,
) -> (Vec<tempfile::TempDir>, Vec<FollowerNode>, LeaderNode) {
    let dirs: Vec<_> = (0..5).map(|_| tempfile::tempdir().expect("dir")).collect();
    let followers: Vec<FollowerNode> = dirs
        .iter()
        .map(|d| {
            FollowerNode::start(FollowerNodeConfig {
                database: DB,
                listen: "127.0.0.1:0".parse().expect("addr"),
                dir: d.path().to_path_buf(),
                peers: vec![],
                segment_bytes: 1 << 20,
                backend,
                auth: key(),
                catch_up_batch_bytes: walrelay_replicator::node::follower::CATCH_UP_BATCH_BYTES,
            })
            .expect("follower")
        })
        .collect();
    let leader = LeaderNode::start(LeaderNodeConfig {
        database: DB,
        epoch: Epoch(1),
        node: NodeId(1),
        start: Bookmark::ZERO,
        start_chain: ChainHash::GENESIS,
        adopted: Vec::new(),
        history: History::new(),
        followers: followers.iter().map(|f| f.addr()).collect(),
        write_quorum: 3,
        listen: Some("127.0.0.1:0".parse().expect("addr")),
        tail_limit_bytes: 1 << 20,
        heartbeat_interval_ms: heartbeat_ms,
        redial_interval_ms: 20,
        fan_out,
        backend,
        auth: key(),
        mux: None,
    })
    .expect("leader");
    (dirs, followers, leader)
}

/// A leader, five followers and a replica, all on `backend`.
fn three_of_five_reach_the_replica(backend: Backend) {
    let (_dirs, followers, leader) = five_followers_and_a_leader(backend, 5);
    let memory = Arc::new(Memory::default());
    let replica = ReplicaNode::start(
        ReplicaNodeConfig {
            database: DB,
            leader: leader.replica_addr().expect("listening"),
            followers: followers.iter().map(|f| f.addr()).collect(),
            start: Bookmark::ZERO,
            redial_interval_ms: 20,
            backend,
            auth: key(),
            delay_ms: 0,
            mux: None,
        },
        Arc::clone(&memory) as Arc<dyn Applier>,
    )
    .expect("replica");
    let want = if backend == Backend::IoUring {
        "io_uring"
    } else {
        "std"
    };
    assert_eq!(leader.backend(), want);
    assert!(followers.iter().all(|f| f.backend() == want));
    for s in 1..=300 {
        leader.commit(record(s)).expect("commit");
    }
    leader
        .wait_confirmed(b(300), Duration::from_secs(20))
        .expect("confirmed");
    let holding = followers.iter().filter(|f| f.durable() >= b(300)).count();
    assert!(holding >= 3, "confirmed but durable on {holding}");
    assert!(replica.wait_confirmed(b(300), Duration::from_secs(20)));
    assert_eq!(memory.applied.lock().len(), 300);
}

/// The ticker writes its lazy flushes after releasing the leader's lock,
/// while commits flush the lazy followers too (every 16 KiB here) and
/// stream to the eager ones: each follower must still get its records in
/// order, so none refuses one as a gap and none is reconnected.
fn lazy_flushes_racing_commits_keep_every_followers_records_in_order(backend: Backend) {
    let fan_out = walrelay_replicator::leader::FanOut {
        eager: 3,
        lazy_flush_interval_us: 1_000,
        stall_after_us: 1_000,
        lazy_batch_bytes: 16 << 10,
    };
    let (_dirs, followers, leader) = five_followers_and_a_leader_fanning_out(backend, 5, fan_out);
    let last = 4_000;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while leader.status().streaming_followers < 5 {
        assert!(
            std::time::Instant::now() < deadline,
            "followers not streaming"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    for s in 1..=last {
        leader.commit(record(s)).expect("commit");
        if s % 50 == 0 {
            // Lets ticks (and their flushes) fall between commits.
            std::thread::sleep(Duration::from_micros(700));
        }
    }
    leader
        .wait_confirmed(b(last), Duration::from_secs(20))
        .expect("confirmed");
    while followers.iter().any(|f| f.durable() < b(last)) {
        assert!(
            std::time::Instant::now() < deadline,
            "followers at {:?}",
            followers.iter().map(|f| f.durable()).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(leader.resyncs(), 0, "a follower saw a gap");
}

#[test]
fn lazy_flushes_racing_commits_keep_every_followers_records_in_order_on_std() {
    lazy_flushes_racing_commits_keep_every_followers_records_in_order(Backend::Std);
}

#[cfg(target_os = "linux")]
#[test]
fn lazy_flushes_racing_commits_keep_every_followers_records_in_order_over_io_uring() {
    if !uring_or_skip() {
        return;
    }
    lazy_flushes_racing_commits_keep_every_followers_records_in_order(Backend::IoUring);
}

/// io_uring is what defers sends (the std transport sends at once); under
/// CI it must be there.
fn uring_or_skip() -> bool {
    match io_uring::IoUring::new(8) {
        Ok(_) => true,
        Err(e) if std::env::var_os("CI").is_some() => panic!("io_uring unavailable under CI: {e}"),
        Err(e) => {
            eprintln!("io_uring unavailable ({e}): skipped");
            false
        }
    }
}

#[test]
fn peers_behind_the_leaders_tail_catch_up_from_followers_then_stream_skipping_a_frozen_one() {
    let backend = Backend::Auto;
    let dirs: Vec<_> = (0..5).map(|_| tempfile::tempdir().expect("dir")).collect();
    // The fifth follower's address is reserved now and started later.
    let late_addr = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port");
    let start = |i: usize, listen, peers: Vec<std::net::SocketAddr>| {
        FollowerNode::start(FollowerNodeConfig {
            database: DB,
            listen,
            dir: dirs[i].path().to_path_buf(),
            peers,
            segment_bytes: 1 << 20,
            backend,
            auth: key(),
            // Small batches: a catch-up takes many requests.
            catch_up_batch_bytes: 64 << 10,
        })
        .expect("follower")
    };
    let early: Vec<FollowerNode> = (0..4)
        .map(|i| start(i, "127.0.0.1:0".parse().expect("addr"), vec![]))
        .collect();
    let mut addrs: Vec<_> = early.iter().map(|f| f.addr()).collect();
    addrs.push(late_addr);
    let leader = LeaderNode::start(LeaderNodeConfig {
        database: DB,
        epoch: Epoch(1),
        node: NodeId(1),
        start: Bookmark::ZERO,
        start_chain: ChainHash::GENESIS,
        adopted: Vec::new(),
        history: History::new(),
        followers: addrs.clone(),
        write_quorum: 3,
        listen: Some("127.0.0.1:0".parse().expect("addr")),
        // Small: most of the history falls out of the tail.
        tail_limit_bytes: 64 << 10,
        heartbeat_interval_ms: 5,
        redial_interval_ms: 20,
        fan_out: walrelay_replicator::leader::FanOut::thrifty(3),
        backend,
        auth: key(),
        mux: None,
    })
    .expect("leader");
    for s in 1..=200 {
        leader.commit(record(s)).expect("commit");
    }
    leader
        .wait_confirmed(b(200), Duration::from_secs(20))
        .expect("confirmed by four followers");
    // Let the early followers learn the watermark (they serve only
    // confirmed records).
    std::thread::sleep(Duration::from_millis(50));

    let late = start(4, late_addr, addrs[..4].to_vec());
    // The replica's first catch-up source accepts and then says nothing (a
    // frozen peer): the replica must give up on it and use the next.
    let frozen = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let frozen_addr = frozen.local_addr().expect("addr");
    let _frozen_peer = std::thread::spawn(move || {
        let held: Vec<_> = frozen.incoming().take(4).collect();
        std::thread::sleep(Duration::from_secs(60));
        drop(held);
    });
    let mut sources = vec![frozen_addr];
    sources.extend_from_slice(&addrs[..4]);
    let memory = Arc::new(Memory::default());
    let replica = ReplicaNode::start(
        ReplicaNodeConfig {
            database: DB,
            leader: leader.replica_addr().expect("listening"),
            followers: sources,
            start: Bookmark::ZERO,
            redial_interval_ms: 20,
            backend,
            auth: key(),
            delay_ms: 0,
            mux: None,
        },
        Arc::clone(&memory) as Arc<dyn Applier>,
    )
    .expect("replica");
    for s in 201..=220 {
        leader.commit(record(s)).expect("commit");
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while late.durable() < b(220) {
        assert!(
            std::time::Instant::now() < deadline,
            "the late follower is stuck at {}",
            late.durable()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        replica.wait_confirmed(b(220), Duration::from_secs(30)),
        "replica stuck at {} ({:?})",
        replica.confirmed(),
        replica.last_error()
    );
    let applied = memory.applied.lock().clone();
    assert_eq!(applied, (1..=220).map(b).collect::<Vec<_>>());
}

/// Four followers (A first) and a leader with a small tail, 200 records
/// confirmed, and A's archiver done: A released all but its newest
/// 128 KiB. The fifth follower's address is reserved, not started.
struct Released {
    dirs: Vec<tempfile::TempDir>,
    early: Vec<FollowerNode>,
    late_addr: std::net::SocketAddr,
    leader: LeaderNode,
    /// A's log start after the release.
    start_at: Bookmark,
    /// A's disk bytes before it.
    disk_before: u64,
}

fn follower_at(
    dir: &std::path::Path,
    listen: std::net::SocketAddr,
    peers: Vec<std::net::SocketAddr>,
) -> FollowerNode {
    FollowerNode::start(FollowerNodeConfig {
        database: DB,
        listen,
        dir: dir.to_path_buf(),
        peers,
        // About fifteen records a segment: many segments to release.
        segment_bytes: 64 << 10,
        backend: Backend::Std,
        auth: key(),
        catch_up_batch_bytes: 64 << 10,
    })
    .expect("follower")
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "timed out: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn cluster_with_a_released_prefix() -> Released {
    use walrelay_replicator::SegmentError;
    use walrelay_replicator::node::follower::ReleaseError;
    let dirs: Vec<_> = (0..5).map(|_| tempfile::tempdir().expect("dir")).collect();
    let late_addr = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port");
    // B, C and D first, so that A can name them as its peers: a follower
    // that falls behind the leader's small tail (a connection dropped under
    // load) is sent to catch up from its peers, and one with none would
    // wait there for good.
    let any: std::net::SocketAddr = "127.0.0.1:0".parse().expect("addr");
    let others: Vec<FollowerNode> = (1..4)
        .map(|i| follower_at(dirs[i].path(), any, vec![]))
        .collect();
    let a = follower_at(
        dirs[0].path(),
        any,
        others.iter().map(|f| f.addr()).collect(),
    );
    let early: Vec<FollowerNode> = std::iter::once(a).chain(others).collect();
    let mut addrs: Vec<_> = early.iter().map(|f| f.addr()).collect();
    addrs.push(late_addr);
    let leader = LeaderNode::start(LeaderNodeConfig {
        database: DB,
        epoch: Epoch(1),
        node: NodeId(1),
        start: Bookmark::ZERO,
        start_chain: ChainHash::GENESIS,
        adopted: Vec::new(),
        history: History::new(),
        followers: addrs,
        write_quorum: 3,
        listen: Some("127.0.0.1:0".parse().expect("addr")),
        // Small: a peer at the beginning is behind the leader's tail.
        tail_limit_bytes: 64 << 10,
        heartbeat_interval_ms: 5,
        redial_interval_ms: 20,
        fan_out: walrelay_replicator::leader::FanOut::thrifty(3),
        backend: Backend::Std,
        auth: key(),
        mux: None,
    })
    .expect("leader");
    for s in 1..=200 {
        leader.commit(record(s)).expect("commit");
    }
    leader
        .wait_confirmed(b(200), Duration::from_secs(20))
        .expect("confirmed by four followers");
    let a = &early[0];
    wait_until("A learns the watermark", || a.confirmed() >= b(200));

    // The archiver on A: nothing past the confirmed position, then a
    // release that keeps the newest 128 KiB.
    assert!(matches!(
        a.release_through(b(201)),
        Err(ReleaseError::NotConfirmed { .. })
    ));
    assert_eq!(a.log_start(), Bookmark::ZERO);
    let disk_before = a.disk_bytes();
    let point = a.release_point(128 << 10);
    assert!(point > b(100) && point < b(200), "release point {point}");
    let released = a.release_through(point).expect("release");
    assert!(released.segments > 5, "{released:?}");
    assert_eq!(a.log_start(), released.start);
    assert_eq!(a.disk_bytes(), disk_before - released.bytes);
    assert!(a.disk_bytes() >= 128 << 10);
    let start_at = released.start;
    assert!(matches!(
        a.read_confirmed(b(1), 1 << 20),
        Err(SegmentError::Released { .. })
    ));
    let a_tail = a.read_confirmed(start_at, usize::MAX).expect("A's tail");
    assert_eq!(a_tail.len() as u64, 200 - start_at.sequence.0);
    Released {
        dirs,
        early,
        late_addr,
        leader,
        start_at,
        disk_before,
    }
}

#[test]
fn a_new_follower_catching_up_from_a_peer_that_released_its_prefix_starts_at_its_start_and_holds_its_tail()
 {
    use walrelay_replicator::SegmentError;
    let c = cluster_with_a_released_prefix();
    let (a, start_at) = (&c.early[0], c.start_at);
    // B starts empty: the leader sends it away (its tail starts far
    // later), A answers that it starts at `start_at`, B starts its log
    // over there and fetches the rest from A, then streams from the
    // leader.
    let late = follower_at(c.dirs[4].path(), c.late_addr, vec![a.addr()]);
    for s in 201..=220 {
        c.leader.commit(record(s)).expect("commit");
    }
    c.leader
        .wait_confirmed(b(220), Duration::from_secs(20))
        .expect("confirmed");
    wait_until("B and A confirm everything", || {
        late.confirmed() >= b(220) && a.confirmed() >= b(220)
    });
    assert_eq!(late.broken(), None);
    assert_eq!(late.log_start(), start_at, "B starts where A does");
    assert!(matches!(
        late.read_confirmed(Bookmark::ZERO, 1 << 20),
        Err(SegmentError::Released { .. })
    ));
    let b_tail = late.read_confirmed(start_at, usize::MAX).expect("B's tail");
    let a_tail = a.read_confirmed(start_at, usize::MAX).expect("A's tail");
    assert_eq!(b_tail.len() as u64, 220 - start_at.sequence.0);
    assert_eq!(b_tail, a_tail, "B holds the same tail as A");
    assert_eq!(
        b_tail.last().map(|r| r.as_ref()),
        Some(record(220).bytes.as_ref())
    );
    assert!(late.disk_bytes() < c.disk_before, "B holds only the tail");
    assert_eq!(late.epoch(), Epoch(1));
}

#[test]
fn a_replica_whose_followers_released_its_position_stops_says_so_and_resumes_once_bootstrapped() {
    let c = cluster_with_a_released_prefix();
    let (a, start_at) = (&c.early[0], c.start_at);
    // A replica at the beginning whose only follower is A: the records it
    // lacks are in cold storage only. It stops, says so, and waits.
    let memory = Arc::new(Memory::default());
    let replica = ReplicaNode::start(
        ReplicaNodeConfig {
            database: DB,
            leader: c.leader.replica_addr().expect("listening"),
            followers: vec![a.addr()],
            start: Bookmark::ZERO,
            redial_interval_ms: 20,
            backend: Backend::Std,
            auth: key(),
            delay_ms: 0,
            mux: None,
        },
        Arc::clone(&memory) as Arc<dyn Applier>,
    )
    .expect("replica");
    wait_until("the replica is sent to cold storage", || {
        replica.archived().is_some()
    });
    assert_eq!(replica.archived(), Some(start_at));
    assert_eq!(*memory.archived.lock(), Some(start_at));
    assert!(
        replica
            .last_error()
            .is_some_and(|e| e.contains("cold storage")),
        "{:?}",
        replica.last_error()
    );
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(replica.confirmed(), Bookmark::ZERO, "nothing skipped");
    assert!(memory.applied.lock().is_empty());
    // The engine bootstraps it from cold storage up to A's start: it
    // subscribes from there and follows.
    *memory.applied.lock() = (1..=start_at.sequence.0).map(b).collect();
    *memory.visible.lock() = start_at;
    for s in 201..=220 {
        c.leader.commit(record(s)).expect("commit");
    }
    assert!(
        replica.wait_confirmed(b(220), Duration::from_secs(20)),
        "replica stuck at {} ({:?})",
        replica.confirmed(),
        replica.last_error()
    );
    assert_eq!(replica.archived(), None);
    assert_eq!(*memory.applied.lock(), (1..=220).map(b).collect::<Vec<_>>());
}

/// Commits records `from..=to` one every `every`, on a thread.
fn trickle(
    leader: &Arc<LeaderNode>,
    from: u64,
    to: u64,
    every: Duration,
) -> std::thread::JoinHandle<()> {
    let leader = Arc::clone(leader);
    std::thread::spawn(move || {
        for s in from..=to {
            std::thread::sleep(every);
            leader.commit(record(s)).expect("commit");
        }
    })
}

#[test]
fn a_wait_for_confirmation_lasts_while_the_confirmed_point_keeps_advancing() {
    let (_dirs, _followers, leader) = five_followers_and_a_leader(Backend::Std, 5);
    let leader = Arc::new(leader);
    // Record 30 is confirmed about 1.5 s from now, the confirmed point
    // moving every 50 ms on the way: three times a 500 ms timeout in all,
    // but never standing still for it.
    let committing = trickle(&leader, 1, 30, Duration::from_millis(50));
    let started = std::time::Instant::now();
    leader
        .wait_confirmed(b(30), Duration::from_millis(500))
        .expect("confirmed while the point advanced");
    assert!(started.elapsed() >= Duration::from_millis(1_400));
    committing.join().expect("committer");
}

#[test]
fn a_wait_for_confirmation_fails_once_the_confirmed_point_stands_still_for_the_timeout() {
    let (_dirs, _followers, leader) = five_followers_and_a_leader(Backend::Std, 5);
    let leader = Arc::new(leader);
    let committing = trickle(&leader, 1, 6, Duration::from_millis(50));
    let started = std::time::Instant::now();
    // Record 7 is never committed: the wait ends 300 ms after the last
    // confirmation (about 300 ms in), with how long it stood still.
    let err = leader
        .wait_confirmed(b(7), Duration::from_millis(300))
        .expect_err("nothing confirms record 7");
    committing.join().expect("committer");
    assert!(leader.confirmed() >= b(6));
    match err {
        walrelay_replicator::node::leader::ConfirmError::Timeout {
            bookmark,
            waited_ms,
            quiet_ms,
            ..
        } => {
            assert_eq!(bookmark, b(7));
            assert_eq!(quiet_ms, 300);
            assert!(waited_ms >= 550, "waited {waited_ms} ms");
        }
        other => panic!("{other}"),
    }
    assert!(started.elapsed() < Duration::from_secs(5));
}
