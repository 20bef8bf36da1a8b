//! A replicated primary wins a new epoch at every start and continues the
//! log: after a clean stop from where it stopped, after a crash by
//! rebuilding its database from the followers' log. After `stop`, no write
//! is admitted, and while nothing is confirmed, writes past the
//! unconfirmed bound are refused. The confirmed records a primary keeps
//! for its peers stay within its tail limit, and a replica behind them
//! catches up from the followers.

mod common;

use std::net::SocketAddr;
use std::time::Duration;
use walrelay_engine::replication::{
    PrimaryConfig, ReplicaConfig, ReplicatedPrimary, ReplicatedReplica,
};
use walrelay_engine::{
    ClusterKey, Constraint, GateError, QueryError, ReplicaOptions, Session, Value,
};
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
fn every_start_wins_a_new_epoch_whose_first_record_is_confirmed_before_it_serves() {
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
    assert_eq!(first.epoch.0, 1);

    // A start with no write still commits (and confirms) its epoch's
    // first record: the marker names it.
    let p = start(&path, &addrs);
    assert_eq!(p.status().confirmed.epoch.0, 2, "confirmed before serving");
    let idle = p.stop(Duration::from_secs(10)).expect("stop");
    assert_eq!((idle.epoch.0, idle.sequence.0), (2, 1));

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
    assert_eq!(rows_in_t(&s), Some(2));
    drop(s);
    p.stop(Duration::from_secs(10)).expect("stop");
}

fn count(p: &ReplicatedPrimary) -> Option<i64> {
    let s = p
        .database()
        .session(Constraint::FirstPrimary)
        .expect("session");
    rows_in_t(&s)
}

/// `t`'s row count as `s` sees it (None: no answer row).
fn rows_in_t(s: &Session) -> Option<i64> {
    s.prepare("SELECT count(*) AS n FROM t")
        .first()
        .expect("read")
        .and_then(|row| row.get("n").and_then(|v| v.as_i64()))
}

#[test]
fn a_primary_that_crashed_is_rebuilt_from_the_followers_log_with_every_acknowledged_write() {
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
    for i in 0..40 {
        s.prepare("INSERT INTO t VALUES (?1)")
            .bind([walrelay_engine::Value::Integer(i)])
            .run()
            .expect("acknowledged");
    }
    drop(s);
    let epoch = p.database().epoch();
    // A crash: no stop, no marker. Its leader is left running in this
    // process, as an old primary cut off would be.
    let old = p.leader().clone();
    drop(p);
    // And its file is not to be trusted: damage it.
    std::fs::write(&path, b"not a database any more").expect("damage");
    let p = start(&path, &addrs);
    assert!(p.database().epoch() > epoch, "a newer epoch");
    assert_eq!(count(&p), Some(40), "every acknowledged write is there");
    // The old leader, still running, is fenced as soon as it meets a
    // follower that promised the newer epoch, and confirms nothing more.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while old.fenced().is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "the old leader was never fenced"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(old.fenced(), Some(p.database().epoch()));
    let s = p
        .database()
        .session(Constraint::FirstPrimary)
        .expect("session");
    s.prepare("INSERT INTO t VALUES (40)")
        .run()
        .expect("writes go on");
    assert_eq!(common::integrity(&s), "ok");
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

/// Creates `t(v BLOB)` on `p`, then kills every follower: nothing written
/// after it is ever confirmed.
fn blob_table_then_followers_gone(
    p: &ReplicatedPrimary,
    followers: &mut [common::procs::Proc],
) -> walrelay_engine::Session {
    let s = p
        .database()
        .session(Constraint::FirstPrimary)
        .expect("session");
    s.prepare("CREATE TABLE t(v BLOB)").run().expect("create");
    for f in followers {
        f.kill();
    }
    s
}

#[test]
fn a_primary_whose_capture_failed_leaves_no_marker_and_restarts_from_the_followers_log() {
    let dir = tempfile::tempdir().expect("dir");
    let (key_path, key) = common::procs::cluster_key_file(dir.path());
    let (mut procs, addrs) = common::procs::spawn_followers(dir.path(), 3, &key_path);
    let path = dir.path().join("p.db");
    let config = || {
        let mut c = PrimaryConfig::new(&path, addrs.clone(), Some(key.clone()));
        c.confirm_timeout_ms = 300;
        // A window of two 8 MiB chunks: a 24 MB transaction's third chunk
        // waits for the first to be confirmed, gives up, and the capture
        // fails.
        c.max_unconfirmed_bytes = 16 << 20;
        c
    };
    let p = ReplicatedPrimary::start(config()).expect("primary");
    // No chunk is ever confirmed.
    let s = blob_table_then_followers_gone(&p, &mut procs);
    let big = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x < 24) \
               INSERT INTO t SELECT randomblob(1000000) FROM c";
    match s.prepare(big).run() {
        Err(QueryError::CaptureFailed(_)) => {}
        other => panic!("a transaction that could not be shipped: {other:?}"),
    }
    drop(s);
    match p.stop(Duration::from_secs(2)) {
        Err(walrelay_engine::replication::PrimaryError::Poisoned(_)) => {}
        other => panic!("a poisoned primary stopped: {other:?}"),
    }
    assert!(
        !walrelay_engine::stop_marker::path_for(&path).exists(),
        "no clean-stop marker"
    );
    // The followers come back: the next start rebuilds the database from
    // their log, which never held the unshipped transaction.
    let _procs = common::procs::spawn_followers_at(dir.path(), &addrs, &key_path);
    let p = ReplicatedPrimary::start(config()).expect("restart from the log");
    assert_eq!(count(&p), Some(0), "the unshipped transaction is gone");
    p.stop(Duration::from_secs(10)).expect("stop");
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

#[test]
fn writes_past_the_unconfirmed_bound_are_refused_as_a_backlog_while_nothing_is_confirmed() {
    let dir = tempfile::tempdir().expect("dir");
    let (key_path, key) = common::procs::cluster_key_file(dir.path());
    let (mut procs, addrs) = common::procs::spawn_followers(dir.path(), 3, &key_path);
    let path = dir.path().join("p.db");
    let mut c = PrimaryConfig::new(&path, addrs.clone(), Some(key));
    c.confirm_timeout_ms = 300;
    c.max_unconfirmed_bytes = 64 << 10;
    let p = ReplicatedPrimary::start(c).expect("primary");
    let s = blob_table_then_followers_gone(&p, &mut procs);
    // Each write commits locally, ships and is never confirmed (its
    // answer is an error); the records pile up until admission refuses.
    let mut not_confirmed = 0;
    let refused =
        (0..20).find_map(
            |_| match s.prepare("INSERT INTO t VALUES (randomblob(30000))").run() {
                Err(QueryError::WriteNotAdmitted {
                    reason:
                        GateError::Backlog {
                            unconfirmed_bytes,
                            limit_bytes,
                            ..
                        },
                }) => Some((unconfirmed_bytes, limit_bytes)),
                Err(QueryError::NotConfirmed { .. }) => {
                    not_confirmed += 1;
                    None
                }
                other => panic!("a write nothing confirms: {other:?}"),
            },
        );
    let (unconfirmed, limit) = refused.expect("a write refused as a backlog");
    assert_eq!(limit, 64 << 10);
    assert!(unconfirmed > limit, "{unconfirmed} bytes over {limit}");
    // Three 30 KB records fit under 64 KiB of unconfirmed bytes at most.
    assert!(
        (1..=3).contains(&not_confirmed),
        "{not_confirmed} writes shipped before the refusal"
    );
    drop(s);
    let _ = p.stop(Duration::from_secs(2));
}

#[test]
fn a_second_process_on_a_running_primarys_files_is_refused_before_it_changes_anything() {
    let dir = tempfile::tempdir().expect("dir");
    let (key_path, _) = common::procs::cluster_key_file(dir.path());
    let (_followers, addrs) = common::procs::spawn_followers(dir.path(), 3, &key_path);
    let primary_dir = dir.path().join("primary");
    let args = || {
        let mut a = vec![
            "primary".to_string(),
            "--dir".into(),
            primary_dir.display().to_string(),
            "--followers".into(),
            common::procs::join_addrs(&addrs),
            "--listen".into(),
            common::procs::free_port().to_string(),
        ];
        a.extend(common::procs::key_args(&key_path));
        a
    };
    let mut running = common::procs::Proc::spawn("primary", &args());
    running.wait_line("primary epoch");
    let path = walrelay_engine::replication::database_path(&primary_dir);
    let meta = std::fs::read(primary_dir.join("db.sqlite-walrelay")).expect("epoch file");
    // This process: refused with a typed error, and the epoch on disk
    // has not moved.
    match walrelay_engine::Database::open(&path, walrelay_engine::Options::default()) {
        Err(walrelay_engine::OpenError::Attach(walrelay_vfs::AttachError::Owner(
            walrelay_vfs::owner_lock::OwnerLockError::InUse { db, .. },
        ))) => assert_eq!(db, path),
        other => panic!("a second opener: {other:?}"),
    }
    assert_eq!(
        std::fs::read(primary_dir.join("db.sqlite-walrelay")).expect("epoch file"),
        meta
    );
    // Another primary process on the same directory exits saying why.
    let mut second = common::procs::Proc::spawn("second primary", &args());
    assert!(!second.wait_exit().success());
    assert!(
        second
            .lines()
            .iter()
            .any(|l| l.contains("in use by another process")),
        "{:#?}",
        second.lines()
    );
    running.assert_running();
}

#[test]
fn a_primary_keeps_at_most_its_tail_limit_of_confirmed_records_and_a_replica_behind_them_catches_up_from_the_followers()
 {
    const TAIL: usize = 64 << 10;
    let dir = tempfile::tempdir().expect("dir");
    let fs = followers(dir.path());
    let addrs: Vec<SocketAddr> = fs.iter().map(|f| f.addr()).collect();
    let mut c = PrimaryConfig::new(dir.path().join("p.db"), addrs.clone(), key());
    c.confirm_timeout_ms = 5_000;
    c.tail_limit_bytes = TAIL;
    c.listen = Some("127.0.0.1:0".parse().expect("addr"));
    let p = ReplicatedPrimary::start(c).expect("primary");
    let s = p
        .database()
        .session(Constraint::FirstPrimary)
        .expect("session");
    s.prepare("CREATE TABLE t(id INTEGER PRIMARY KEY, body BLOB)")
        .run()
        .expect("create");
    // About 1 MiB of log: sixteen times the tail.
    for i in 0..200 {
        s.prepare("INSERT INTO t(id, body) VALUES (?1, randomblob(4000))")
            .bind([Value::Integer(i)])
            .run()
            .expect("insert");
        let held = p.status().tail_bytes;
        assert!(
            held <= TAIL + (64 << 10),
            "after write {i} the primary holds {held} bytes for its peers"
        );
    }
    let last = s.bookmark().expect("bookmark");
    let held = p.status().tail_bytes;
    assert!(
        held <= TAIL,
        "{held} bytes held once everything is confirmed"
    );

    // A replica starting now is behind the tail: the leader turns it to
    // the followers, and it reaches the last write all the same.
    let replica = ReplicatedReplica::start(ReplicaConfig {
        store: None,
        mux: None,
        database: DatabaseId(1),
        path: dir.path().join("replica.db"),
        leader: p.replica_addr().expect("listening"),
        followers: addrs,
        backend: Backend::Auto,
        auth: key(),
        options: ReplicaOptions::default(),
        delay_ms: 0,
    })
    .expect("replica");
    assert!(
        replica.node().wait_confirmed(last, Duration::from_secs(20)),
        "the replica caught up"
    );
    let rs = replica
        .replica()
        .session(Constraint::Bookmark(last))
        .expect("replica session");
    assert_eq!(rows_in_t(&rs), Some(200));
}
