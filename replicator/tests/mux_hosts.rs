//! Many databases of one process replicating to follower hosts through
//! one shared mux: one real connection per host, a channel per database.

use bytes::Bytes;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;
use walrelay_replicator::net::mux::{Limits, Mux};
use walrelay_replicator::net::{Backend, ClusterKey};
use walrelay_replicator::node::follower_host::{FollowerHost, FollowerHostConfig};
use walrelay_replicator::node::leader::{LeaderNode, LeaderNodeConfig};
use walrelay_replicator::{
    Bookmark, ChainHash, DatabaseId, Encoded, Epoch, History, NodeId, Record, Sequence,
};

fn b(s: u64) -> Bookmark {
    Bookmark::new(Epoch(1), Sequence(s))
}

/// Records `from..=to` of database `db`, chained after `prev`.
fn records(db: u64, from: u64, to: u64, mut prev: ChainHash) -> Vec<Encoded> {
    let mut out = Vec::new();
    for s in from..=to {
        let mut page = vec![db as u8; 512];
        page[..8].copy_from_slice(&s.to_be_bytes());
        let r = Record {
            bookmark: b(s),
            previous: if s == 1 { Bookmark::ZERO } else { b(s - 1) },
            prev_chain: prev,
            commit_us: 0,
            page_size: 512,
            db_pages: 1,
            pages: vec![(1, Bytes::from(page))],
        }
        .to_encoded()
        .expect("record");
        prev = r.chain;
        out.push(r);
    }
    out
}

/// Cluster key `b` of the test running on this thread: the same `b` is
/// the same key within a test, and no two tests share one. Tests run at
/// once in one process, and a node redials a freed port that the kernel
/// may have handed to another test's host: with keys shared between tests
/// it could join a stranger's cluster (the node tests' cf520b0); a
/// stranger's key is refused at the handshake instead.
fn key(b: u8) -> Option<ClusterKey> {
    thread_local!(static BASE: [u8; 32] = rand::random());
    Some(ClusterKey::from_bytes(BASE.with(|k| k.map(|x| x ^ b))))
}

/// The backends to run on: io_uring too where the kernel allows it (under
/// CI=true it must).
fn backends() -> Vec<Backend> {
    let mut out = vec![Backend::Std];
    match Mux::open(Backend::IoUring, None, Limits::default()) {
        Ok(m) => {
            m.shutdown();
            out.push(Backend::IoUring);
        }
        Err(e) if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("io_uring is unavailable under CI=true: {e}")
        }
        Err(e) => eprintln!("io_uring unavailable ({e}): only std runs"),
    }
    out
}

fn host(dir: &Path, backend: Backend, k: Option<ClusterKey>) -> FollowerHost {
    let mut c = FollowerHostConfig::new("127.0.0.1:0".parse().expect("addr"), dir.into());
    c.backend = backend;
    c.auth = k;
    FollowerHost::start(c).expect("host")
}

fn leader(db: DatabaseId, followers: Vec<SocketAddr>, mux: &Mux) -> LeaderNode {
    LeaderNode::start(leader_config(db, followers, mux)).expect("leader")
}

fn leader_config(db: DatabaseId, followers: Vec<SocketAddr>, mux: &Mux) -> LeaderNodeConfig {
    LeaderNodeConfig {
        database: db,
        epoch: Epoch(1),
        node: NodeId(1),
        start: Bookmark::ZERO,
        start_chain: ChainHash::GENESIS,
        adopted: Vec::new(),
        history: History::new(),
        followers,
        write_quorum: 3,
        listen: None,
        tail_limit_bytes: 1 << 20,
        heartbeat_interval_ms: 5,
        redial_interval_ms: 20,
        fan_out: walrelay_replicator::leader::FanOut::thrifty(3),
        backend: Backend::Std,
        auth: None,
        mux: Some(mux.clone()),
    }
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "timed out: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

const DBS: u64 = 12;

#[test]
fn many_databases_replicate_to_five_hosts_over_one_connection_each_all_durable_and_acked() {
    for backend in backends() {
        let dirs: Vec<_> = (0..5).map(|_| tempfile::tempdir().expect("dir")).collect();
        let hosts: Vec<FollowerHost> = dirs
            .iter()
            .map(|d| host(d.path(), backend, key(7)))
            .collect();
        let addrs: Vec<SocketAddr> = hosts.iter().map(|h| h.addr()).collect();
        let mux = Mux::open(backend, key(7), Limits::default()).expect("mux");
        let leaders: Vec<LeaderNode> = (0..DBS)
            .map(|d| leader(DatabaseId(0x100 + d), addrs.clone(), &mux))
            .collect();
        let all: Vec<Vec<Encoded>> = (0..DBS)
            .map(|d| records(0x100 + d, 1, 50, ChainHash::GENESIS))
            .collect();
        for s in 0..50 {
            for (l, rs) in leaders.iter().zip(&all) {
                l.commit(rs[s].clone()).expect("commit");
            }
        }
        for l in &leaders {
            l.wait_confirmed(b(50), Duration::from_secs(20))
                .expect("confirmed");
        }
        // Every host acked every database (durable there).
        for l in &leaders {
            wait_until("every follower durable", || {
                (0..5).all(|i| l.follower_durable(i) == Some(b(50)))
            });
        }
        for (i, h) in hosts.iter().enumerate() {
            assert_eq!(h.databases().len() as u64, DBS, "host {i}");
            let m = h.mux();
            assert_eq!(
                m.connections, 1,
                "{backend:?}: host {i} has one real connection"
            );
            assert_eq!(m.channels as u64, DBS, "host {i}: a channel per database");
            // Group commit across databases still happens over channels:
            // never more sync rounds than databases synced.
            let st = h.stats();
            assert!(
                st.databases_synced.load(Ordering::Relaxed)
                    >= st.sync_rounds.load(Ordering::Relaxed)
            );
            let db = h.database(DatabaseId(0x100)).expect("held");
            wait_until("confirmed on the host", || {
                db.confirmed().expect("confirmed") == b(50)
            });
        }
        let s = mux.snapshot();
        assert_eq!(
            (s.connections, s.dials),
            (5, 5),
            "{backend:?}: one connection per host"
        );
        assert_eq!(s.channels as u64, 5 * DBS);
        assert_eq!(s.refusals, 0);
        for l in &leaders {
            l.shutdown();
        }
        mux.shutdown();
    }
}

#[test]
fn a_closed_database_leaves_the_others_replicating_over_the_same_connections() {
    for backend in backends() {
        let dirs: Vec<_> = (0..5).map(|_| tempfile::tempdir().expect("dir")).collect();
        let hosts: Vec<FollowerHost> = dirs.iter().map(|d| host(d.path(), backend, None)).collect();
        let addrs: Vec<SocketAddr> = hosts.iter().map(|h| h.addr()).collect();
        let mux = Mux::open(backend, None, Limits::default()).expect("mux");
        let (l1, l2) = (
            leader(DatabaseId(1), addrs.clone(), &mux),
            leader(DatabaseId(2), addrs.clone(), &mux),
        );
        let (r1, r2) = (
            records(1, 1, 10, ChainHash::GENESIS),
            records(2, 1, 20, ChainHash::GENESIS),
        );
        for r in &r1 {
            l1.commit(r.clone()).expect("commit");
        }
        for r in &r2[..10] {
            l2.commit(r.clone()).expect("commit");
        }
        l1.wait_confirmed(b(10), Duration::from_secs(20))
            .expect("1 confirmed");
        l2.wait_confirmed(b(10), Duration::from_secs(20))
            .expect("2 confirmed");
        l1.shutdown();
        wait_until("database 1's channels closed", || {
            mux.snapshot().channels == 5
        });
        for r in &r2[10..] {
            l2.commit(r.clone()).expect("commit");
        }
        l2.wait_confirmed(b(20), Duration::from_secs(20))
            .expect("2 confirmed after 1 closed");
        let s = mux.snapshot();
        assert_eq!(
            (s.connections, s.dials),
            (5, 5),
            "the shared connections stayed up"
        );
        // The hosts saw database 1's channels close, not their connection.
        for h in &hosts {
            wait_until("host channels", || h.mux().channels == 1);
            assert_eq!(h.mux().connections, 1);
        }
        l2.shutdown();
        mux.shutdown();
    }
}

#[test]
fn a_mux_with_the_wrong_cluster_key_is_refused_by_the_hosts() {
    for backend in backends() {
        let dirs: Vec<_> = (0..5).map(|_| tempfile::tempdir().expect("dir")).collect();
        let hosts: Vec<FollowerHost> = dirs
            .iter()
            .map(|d| host(d.path(), backend, key(1)))
            .collect();
        let addrs: Vec<SocketAddr> = hosts.iter().map(|h| h.addr()).collect();
        let mux = Mux::open(backend, key(2), Limits::default()).expect("mux");
        let l = leader(DatabaseId(3), addrs, &mux);
        l.commit(records(3, 1, 1, ChainHash::GENESIS).remove(0))
            .expect("commit");
        assert!(l.wait_confirmed(b(1), Duration::from_millis(500)).is_err());
        wait_until("refused", || hosts.iter().all(|h| h.auth_refusals() > 0));
        for h in &hosts {
            assert_eq!(h.mux().channels, 0);
            assert!(h.databases().is_empty());
        }
        l.shutdown();
        mux.shutdown();
    }
}

/// A TCP relay to `upstream` whose connections can be cut.
struct Relay {
    addr: SocketAddr,
    live: std::sync::Arc<std::sync::Mutex<Vec<std::net::TcpStream>>>,
}

impl Relay {
    fn start(upstream: SocketAddr) -> Relay {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let live = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let keep = std::sync::Arc::clone(&live);
        std::thread::spawn(move || {
            for down in listener.incoming().flatten() {
                let Ok(up) = std::net::TcpStream::connect(upstream) else {
                    continue;
                };
                let pipe = |mut from: std::net::TcpStream, mut to: std::net::TcpStream| {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                };
                let mut l = keep.lock().expect("relay");
                for s in [&down, &up] {
                    l.push(s.try_clone().expect("clone"));
                }
                pipe(
                    down.try_clone().expect("clone"),
                    up.try_clone().expect("clone"),
                );
                pipe(up, down);
            }
        });
        Relay { addr, live }
    }

    /// Cuts every connection relayed so far.
    fn cut(&self) {
        for s in self.live.lock().expect("relay").drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

#[test]
fn a_cut_connection_closes_every_database_channel_on_it_and_they_all_come_back_on_one_redial() {
    for backend in backends() {
        let dirs: Vec<_> = (0..5).map(|_| tempfile::tempdir().expect("dir")).collect();
        let hosts: Vec<FollowerHost> = dirs
            .iter()
            .map(|d| host(d.path(), backend, key(3)))
            .collect();
        let mut addrs: Vec<SocketAddr> = hosts.iter().map(|h| h.addr()).collect();
        // Follower 0 is reached through a relay that can be cut.
        let relay = Relay::start(addrs[0]);
        addrs[0] = relay.addr;
        let mux = Mux::open(backend, key(3), Limits::default()).expect("mux");
        let dbs: Vec<u64> = (0..3).collect();
        let leaders: Vec<LeaderNode> = dbs
            .iter()
            .map(|d| leader(DatabaseId(0x300 + d), addrs.clone(), &mux))
            .collect();
        let all: Vec<Vec<Encoded>> = dbs
            .iter()
            .map(|d| records(0x300 + d, 1, 40, ChainHash::GENESIS))
            .collect();
        for (l, rs) in leaders.iter().zip(&all) {
            for r in &rs[..20] {
                l.commit(r.clone()).expect("commit");
            }
        }
        for l in &leaders {
            wait_until("follower 0 durable", || {
                l.follower_durable(0) == Some(b(20))
            });
        }
        let before = mux.snapshot();
        assert_eq!(before.dials, 5);
        relay.cut();
        // Every database's channel on the cut connection closes; the
        // leaders redial, over one new connection for all of them.
        for (l, rs) in leaders.iter().zip(&all) {
            for r in &rs[20..] {
                l.commit(r.clone()).expect("commit");
            }
        }
        for l in &leaders {
            l.wait_confirmed(b(40), Duration::from_secs(20))
                .expect("confirmed");
            wait_until("follower 0 back and durable", || {
                l.follower_durable(0) == Some(b(40))
            });
        }
        let after = mux.snapshot();
        assert_eq!(after.dials, 6, "{backend:?}: one redial for every database");
        assert_eq!(after.connections, 5);
        assert_eq!(after.channels, 15);
        assert!(after.channels_closed >= 3, "{after:?}");
        for l in &leaders {
            l.shutdown();
        }
        mux.shutdown();
    }
}

/// A replica that only keeps what is visible.
#[derive(Default)]
struct Visible {
    last: std::sync::Mutex<Bookmark>,
    shown: std::sync::Mutex<Bookmark>,
    foreign: std::sync::atomic::AtomicU64,
    database: u64,
}

impl walrelay_replicator::node::replica::Applier for Visible {
    fn apply(&self, r: &Encoded) -> Result<(), walrelay_replicator::node::replica::ApplierError> {
        // Page bytes carry their database (see `records`).
        if r.record().map(|rec| rec.pages[0].1[8]).ok() != Some(self.database as u8) {
            self.foreign.fetch_add(1, Ordering::Relaxed);
        }
        *self.last.lock().expect("lock") = r.bookmark;
        Ok(())
    }
    fn confirm(&self, b: Bookmark) -> Result<(), walrelay_replicator::node::replica::ApplierError> {
        *self.shown.lock().expect("lock") = b;
        Ok(())
    }
    fn discard_unconfirmed(&self) -> Result<(), walrelay_replicator::node::replica::ApplierError> {
        Ok(())
    }
    fn confirmed(&self) -> Bookmark {
        *self.shown.lock().expect("lock")
    }
}

#[test]
fn many_databases_leaders_take_their_replicas_on_one_port_over_one_connection_each_its_own() {
    use std::sync::Arc;
    use walrelay_replicator::node::replica::{ReplicaNode, ReplicaNodeConfig};
    for backend in backends() {
        let dirs: Vec<_> = (0..5).map(|_| tempfile::tempdir().expect("dir")).collect();
        let hosts: Vec<FollowerHost> = dirs
            .iter()
            .map(|d| host(d.path(), backend, key(7)))
            .collect();
        let addrs: Vec<SocketAddr> = hosts.iter().map(|h| h.addr()).collect();
        // Node A hosts the primaries; node B keeps their replicas.
        let a = Mux::open(backend, key(7), Limits::default()).expect("mux");
        let b_mux = Mux::open(backend, key(7), Limits::default()).expect("mux");
        let n = 6u64;
        let leaders: Vec<LeaderNode> = (0..n)
            .map(|d| {
                let mut c = leader_config(DatabaseId(0x200 + d), addrs.clone(), &a);
                c.listen = Some("127.0.0.1:0".parse().expect("addr"));
                LeaderNode::start(c).expect("leader")
            })
            .collect();
        let port = leaders[0].replica_addr().expect("listens");
        assert!(
            leaders.iter().all(|l| l.replica_addr() == Some(port)),
            "{backend:?}: every database's leader takes replicas on the node's one port"
        );
        let appliers: Vec<Arc<Visible>> = (0..n)
            .map(|d| {
                Arc::new(Visible {
                    database: 0x200 + d,
                    ..Visible::default()
                })
            })
            .collect();
        let replicas: Vec<ReplicaNode> = (0..n)
            .map(|d| {
                ReplicaNode::start(
                    ReplicaNodeConfig {
                        database: DatabaseId(0x200 + d),
                        leader: port,
                        followers: addrs.clone(),
                        start: Bookmark::ZERO,
                        redial_interval_ms: 20,
                        backend,
                        auth: key(7),
                        delay_ms: 0,
                        mux: Some(b_mux.clone()),
                    },
                    Arc::clone(&appliers[d as usize]) as _,
                )
                .expect("replica")
            })
            .collect();
        for d in 0..n {
            for r in records(0x200 + d, 1, 20, ChainHash::GENESIS) {
                leaders[d as usize].commit(r).expect("commit");
            }
        }
        for (d, r) in replicas.iter().enumerate() {
            assert!(
                r.wait_confirmed(b(20), Duration::from_secs(20)),
                "{backend:?}: replica {d} sees its database's records"
            );
            assert_eq!(
                appliers[d].foreign.load(Ordering::Relaxed),
                0,
                "only its own"
            );
        }
        let s = b_mux.snapshot();
        assert_eq!(
            s.connections, 1,
            "{backend:?}: the replicas' node holds one connection, to the primaries' node"
        );
        assert_eq!(s.channels as u64, n, "a channel per replica");
        for r in &replicas {
            r.shutdown();
        }
        for l in &leaders {
            l.shutdown();
        }
        a.shutdown();
        b_mux.shutdown();
    }
}
