//! A replicated primary stopped cleanly continues the log on its next
//! start, including after an epoch in which it committed nothing; after
//! `stop`, no write is admitted.

use std::net::SocketAddr;
use std::time::Duration;
use walrelay_engine::replication::{PrimaryConfig, ReplicatedPrimary};
use walrelay_engine::{ClusterKey, Constraint, QueryError};
use walrelay_replicator::DatabaseId;
use walrelay_replicator::net::Backend;
use walrelay_replicator::node::follower::{CATCH_UP_BATCH_BYTES, FollowerNode, FollowerNodeConfig};

fn key() -> Option<ClusterKey> {
    Some(ClusterKey::from_bytes([0x33; 32]))
}

fn followers(dir: &std::path::Path) -> Vec<FollowerNode> {
    (0..3)
        .map(|i| {
            FollowerNode::start(FollowerNodeConfig {
                database: DatabaseId(1),
                listen: "127.0.0.1:0".parse().expect("addr"),
                dir: dir.join(format!("f{i}")),
                peers: vec![],
                segment_bytes: 1 << 20,
                backend: Backend::Auto,
                auth: key(),
                catch_up_batch_bytes: CATCH_UP_BATCH_BYTES,
            })
            .expect("follower")
        })
        .collect()
}

fn start(path: &std::path::Path, addrs: &[SocketAddr]) -> ReplicatedPrimary {
    let mut c = PrimaryConfig::new(path, addrs.to_vec(), key());
    c.confirm_timeout_ms = 5_000;
    ReplicatedPrimary::start(c).expect("primary")
}

#[test]
fn a_clean_stop_even_after_an_idle_epoch_lets_the_next_start_continue_the_log() {
    let dir = tempfile::tempdir().expect("dir");
    let fs = followers(dir.path());
    let addrs: Vec<SocketAddr> = fs.iter().map(|f| f.addr()).collect();
    let path = dir.path().join("p.db");

    let p = start(&path, &addrs);
    let s = p
        .database()
        .session(Constraint::FirstPrimary)
        .expect("session");
    s.prepare("CREATE TABLE t(x)").run().expect("create");
    s.prepare("INSERT INTO t VALUES (1)").run().expect("insert");
    drop(s); // a session holds the database open
    let first = p.stop(Duration::from_secs(10)).expect("stop");

    // An epoch with no commit at all: its marker must still name a real
    // record (the last of the previous epoch), or the next start could not
    // chain onto the followers' logs.
    let p = start(&path, &addrs);
    let idle = p.stop(Duration::from_secs(10)).expect("stop");
    assert_eq!(idle, first);

    let p = start(&path, &addrs);
    let s = p
        .database()
        .session(Constraint::FirstPrimary)
        .expect("session");
    let r = s
        .prepare("INSERT INTO t VALUES (2)")
        .run()
        .expect("confirmed in epoch 3");
    assert_eq!(r.meta.bookmark.epoch.0, 3);
    let n = s
        .prepare("SELECT count(*) AS n FROM t")
        .first()
        .expect("read")
        .and_then(|row| row.get("n").and_then(|v| v.as_i64()));
    assert_eq!(n, Some(2));
    drop(s);
    p.stop(Duration::from_secs(10)).expect("stop");
}

#[test]
fn after_stop_begins_no_write_is_admitted() {
    let dir = tempfile::tempdir().expect("dir");
    let fs = followers(dir.path());
    let addrs: Vec<SocketAddr> = fs.iter().map(|f| f.addr()).collect();
    let p = start(&dir.path().join("p.db"), &addrs);
    let db = p.database().clone();
    db.session(Constraint::FirstPrimary)
        .expect("session")
        .prepare("CREATE TABLE t(x)")
        .run()
        .expect("create");
    p.stop(Duration::from_secs(10)).expect("stop");
    let err = db
        .session(Constraint::FirstPrimary)
        .expect("session")
        .prepare("INSERT INTO t VALUES (1)")
        .run()
        .expect_err("stopped");
    assert!(matches!(err, QueryError::WriteNotAdmitted { .. }), "{err}");
}

#[test]
fn a_primary_whose_capture_failed_stops_without_a_clean_stop_marker_and_refuses_to_restart() {
    let dir = tempfile::tempdir().expect("dir");
    // Nobody listens at these: no chunk is ever confirmed.
    let addrs: Vec<SocketAddr> = (0..3)
        .map(|_| {
            std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("port")
        })
        .collect();
    let path = dir.path().join("p.db");
    let mut c = PrimaryConfig::new(&path, addrs.clone(), key());
    c.confirm_timeout_ms = 300;
    // A window of two 8 MiB chunks: a 24 MB transaction's third chunk waits
    // for the first to be confirmed, gives up, and the capture fails.
    c.max_unconfirmed_bytes = 16 << 20;
    let p = ReplicatedPrimary::start(c).expect("primary");
    let s = p
        .database()
        .session(Constraint::FirstPrimary)
        .expect("session");
    let big = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x < 24) \
               INSERT INTO t SELECT randomblob(1000000) FROM c";
    // The table's own creation is not confirmed either (no followers), but
    // it commits locally and ships in one record within the window.
    let _ = s.prepare("CREATE TABLE t(v BLOB)").run();
    match s.prepare(big).run() {
        Err(QueryError::CaptureFailed(_)) => {}
        other => panic!("a transaction that could not be shipped: {other:?}"),
    }
    drop(s);
    match p.stop(Duration::from_secs(2)) {
        Err(walrelay_engine::replication::PrimaryError::Poisoned(_)) => {}
        other => panic!("a poisoned primary stopped: {other:?}"),
    }
    let mut c = PrimaryConfig::new(&path, addrs, key());
    c.confirm_timeout_ms = 300;
    match ReplicatedPrimary::start(c) {
        Err(walrelay_engine::replication::PrimaryError::NotCleanlyStopped { .. }) => {}
        other => panic!("restarted on a diverged database: {other:?}"),
    }
}

#[test]
fn a_clean_stop_syncs_the_database_file_and_the_wal_before_its_marker() {
    let dir = tempfile::tempdir().expect("dir");
    let fs = followers(dir.path());
    let addrs: Vec<SocketAddr> = fs.iter().map(|f| f.addr()).collect();
    let path = dir.path().join("p.db");
    let p = start(&path, &addrs);
    let db = p.database().clone();
    let s = db.session(Constraint::FirstPrimary).expect("session");
    s.prepare("CREATE TABLE t(x)").run().expect("create");
    s.prepare("INSERT INTO t VALUES (1)").run().expect("insert");
    drop(s);
    // synchronous=OFF: the writes above synced nothing locally.
    let (db_before, wal_before) = db.file_syncs().expect("a primary");
    p.stop(Duration::from_secs(10)).expect("stop");
    let (db_after, wal_after) = db.file_syncs().expect("a primary");
    assert!(db_after > db_before, "the database file was synced");
    assert!(wal_after > wal_before, "the WAL was synced");
}
