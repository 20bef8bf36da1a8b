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

fn key() -> Option<ClusterKey> {
    Some(ClusterKey::from_bytes([0x5a; 32]))
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
}

#[test]
fn records_commit_at_three_of_five_and_reach_the_replica() {
    three_of_five_reach_the_replica(Backend::Std);
}

#[cfg(target_os = "linux")]
#[test]
fn records_commit_at_three_of_five_and_reach_the_replica_over_io_uring() {
    if let Err(e) = io_uring::IoUring::new(8) {
        eprintln!("io_uring unavailable ({e}): skipped");
        return;
    }
    three_of_five_reach_the_replica(Backend::IoUring);
}

/// A leader, five followers and a replica, all on `backend`.
fn three_of_five_reach_the_replica(backend: Backend) {
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
        heartbeat_interval_ms: 5,
        redial_interval_ms: 20,
        backend,
        auth: key(),
    })
    .expect("leader");
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
        backend,
        auth: key(),
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
