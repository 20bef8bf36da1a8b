//! Runtime limits in the engine: the query time limit (reads, writes,
//! batches), cancellation, stopping, the reader pool's bound and growth,
//! classification while every reader is busy, the response cap, and the
//! epoch counter's end.

mod common;

use common::RUNAWAY;
use std::time::{Duration, Instant};
use walrelay_engine::{
    CancelToken, Constraint, Database, Limits, OpenError, Options, QueryError, Value,
};

fn limits(f: impl FnOnce(&mut Limits)) -> Options {
    let mut l = Limits::default();
    f(&mut l);
    Options {
        limits: l,
        ..Options::default()
    }
}

fn open(options: Options) -> (tempfile::TempDir, Database) {
    let dir = tempfile::tempdir().expect("dir");
    let db = Database::open(dir.path().join("l.db"), options).expect("open");
    (dir, db)
}

fn count(db: &Database, table: &str) -> i64 {
    let r = db
        .session(Constraint::FirstPrimary)
        .expect("session")
        .prepare(format!("SELECT count(*) AS n FROM {table}"))
        .first()
        .expect("count")
        .expect("a row");
    match r.get("n") {
        Some(Value::Integer(n)) => *n,
        other => panic!("count is {other:?}"),
    }
}

/// Runs `sql` on a thread under a session cancelled by the returned token.
fn spawn_runaway(
    db: &Database,
    sql: &'static str,
) -> (CancelToken, std::thread::JoinHandle<Result<(), QueryError>>) {
    let token = CancelToken::new();
    let s = db
        .session(Constraint::FirstUnconstrained)
        .expect("session")
        .cancel_with(token.clone());
    let h = std::thread::spawn(move || s.prepare(sql).all().map(|_| ()));
    (token, h)
}

#[test]
fn a_runaway_read_ends_with_a_timeout_error_at_the_query_time_limit() {
    let (_dir, db) = open(limits(|l| l.query_timeout_ms = 300));
    let s = db.session(Constraint::FirstUnconstrained).expect("session");
    let e = s.prepare(RUNAWAY).all().expect_err("stopped");
    assert!(matches!(e, QueryError::Timeout { limit_ms: 300 }), "{e:?}");
    // The reader is usable again at once.
    s.prepare("SELECT 1").all().expect("a later read");
}

#[test]
fn a_runaway_write_times_out_and_changes_nothing() {
    let (_dir, db) = open(limits(|l| l.query_timeout_ms = 300));
    let s = db.session(Constraint::FirstPrimary).expect("session");
    s.prepare("CREATE TABLE t(x)").run().expect("create");
    let before = db.latest_bookmark();
    let e = s
        .prepare(
            "INSERT INTO t WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) \
             SELECT x FROM c",
        )
        .run()
        .expect_err("stopped");
    assert!(matches!(e, QueryError::Timeout { .. }), "{e:?}");
    assert_eq!(count(&db, "t"), 0);
    assert_eq!(db.latest_bookmark(), before, "nothing committed");

    // A batch is bounded as a whole and rolled back as a whole.
    let e = s
        .batch([s.prepare("INSERT INTO t VALUES (1)"), s.prepare(RUNAWAY)])
        .expect_err("stopped");
    match e {
        QueryError::Batch { index: 1, source } => {
            assert!(matches!(*source, QueryError::Timeout { .. }), "{source:?}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(count(&db, "t"), 0);
    assert_eq!(db.latest_bookmark(), before, "nothing committed");
    s.prepare("INSERT INTO t VALUES (1)")
        .run()
        .expect("the writer works");
    assert_eq!(count(&db, "t"), 1);
}

#[test]
fn a_cancelled_session_stops_its_running_query() {
    let (_dir, db) = open(Options::default());
    let (token, h) = spawn_runaway(&db, RUNAWAY);
    common::wait_until("the read runs", Duration::from_secs(20), || {
        db.readers_in_use().0 == 1
    });
    token.cancel();
    let e = h.join().expect("thread").expect_err("cancelled");
    assert!(matches!(e, QueryError::Cancelled), "{e:?}");
    common::wait_until("the reader is back", Duration::from_secs(20), || {
        db.readers_in_use().0 == 0
    });
}

#[test]
fn stop_queries_stops_every_running_query_and_refuses_new_ones() {
    let (_dir, db) = open(Options::default());
    let runs: Vec<_> = (0..3).map(|_| spawn_runaway(&db, RUNAWAY)).collect();
    common::wait_until("three reads run", Duration::from_secs(20), || {
        db.readers_in_use().0 == 3
    });
    db.stop_queries();
    for (_, h) in runs {
        let e = h.join().expect("thread").expect_err("stopped");
        assert!(matches!(e, QueryError::Stopping), "{e:?}");
    }
    let e = db
        .session(Constraint::FirstPrimary)
        .expect("session")
        .prepare("SELECT 1")
        .all()
        .expect_err("refused");
    assert!(matches!(e, QueryError::Stopping), "{e:?}");
}

#[test]
fn the_reader_pool_opens_connections_on_demand_up_to_its_maximum() {
    let (_dir, db) = open(Options::default());
    assert_eq!(db.readers_in_use(), (0, 1), "one reader opens with the db");
    // Eight runaway reads do not exhaust the default pool (16).
    let runs: Vec<_> = (0..8).map(|_| spawn_runaway(&db, RUNAWAY)).collect();
    common::wait_until("eight reads run", Duration::from_secs(20), || {
        db.readers_in_use() == (8, 8)
    });
    let r = db
        .session(Constraint::FirstUnconstrained)
        .expect("session")
        .prepare("SELECT 1 AS one")
        .all()
        .expect("a ninth read is served");
    assert_eq!(r.results.len(), 1);
    for (t, _) in &runs {
        t.cancel();
    }
    for (_, h) in runs {
        let _ = h.join().expect("thread");
    }
    assert_eq!(db.readers_in_use(), (0, 9), "readers stay open for reuse");
}

#[test]
fn with_every_reader_busy_a_write_is_classified_and_runs_and_a_read_waits_boundedly() {
    let mut options = limits(|l| l.pool_wait_ms = 200);
    options.readers = 2;
    let (_dir, db) = open(options);
    let s = db.session(Constraint::FirstPrimary).expect("session");
    s.prepare("CREATE TABLE t(x)").run().expect("create");
    let runs: Vec<_> = (0..2).map(|_| spawn_runaway(&db, RUNAWAY)).collect();
    common::wait_until("both readers busy", Duration::from_secs(20), || {
        db.readers_in_use() == (2, 2)
    });

    let w = s
        .prepare("INSERT INTO t VALUES (?1)")
        .bind([7])
        .run()
        .expect("the write needs no reader");
    assert_eq!(w.meta.changes, 1);

    let started = Instant::now();
    let e = s.prepare("SELECT x FROM t").all().expect_err("no reader");
    assert!(
        matches!(e, QueryError::Busy { waited_ms: 200, .. }),
        "{e:?}"
    );
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert_eq!(db.readers_in_use(), (2, 2), "the runaways still run");

    for (t, _) in &runs {
        t.cancel();
    }
    for (_, h) in runs {
        let _ = h.join().expect("thread");
    }
    assert_eq!(count(&db, "t"), 1);
}

#[test]
fn a_result_past_the_response_cap_is_refused_and_a_write_behind_it_changes_nothing() {
    let (_dir, db) = open(limits(|l| l.max_response_bytes = 10_000));
    let s = db.session(Constraint::FirstPrimary).expect("session");
    s.prepare("CREATE TABLE t(v)").run().expect("create");
    // 100 rows of 99 bytes fit; 100 rows of 101 do not.
    let fill = "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 100) \
                SELECT zeroblob(?1) FROM c";
    let r = s.prepare(fill).bind([99]).all().expect("under the cap");
    assert_eq!(r.results.len(), 100);
    let e = s.prepare(fill).bind([101]).all().expect_err("over");
    assert!(
        matches!(
            e,
            QueryError::ResponseTooLarge {
                limit_bytes: 10_000
            }
        ),
        "{e:?}"
    );
    // One value larger than the whole cap stops at that value.
    let e = s
        .prepare("SELECT zeroblob(1000000)")
        .all()
        .expect_err("over");
    assert!(matches!(e, QueryError::ResponseTooLarge { .. }), "{e:?}");

    let before = db.latest_bookmark();
    let e = s
        .prepare(format!(
            "INSERT INTO t {} RETURNING v",
            fill.replace("?1", "101")
        ))
        .run()
        .expect_err("over");
    assert!(matches!(e, QueryError::ResponseTooLarge { .. }), "{e:?}");
    assert_eq!(count(&db, "t"), 0, "the write was rolled back");
    assert_eq!(db.latest_bookmark(), before);
}

#[test]
fn a_database_whose_epoch_counter_is_exhausted_refuses_to_open_and_changes_nothing() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("e.db");
    // The sidecar (engine/src/meta.rs): magic, version 1, epoch, reserved,
    // crc32 of bytes 0..20.
    let mut meta = Vec::with_capacity(24);
    meta.extend_from_slice(b"WRMETA\0\x01");
    meta.extend_from_slice(&1u32.to_be_bytes());
    meta.extend_from_slice(&u32::MAX.to_be_bytes());
    meta.extend_from_slice(&0u32.to_be_bytes());
    let crc = crc32fast::hash(&meta);
    meta.extend_from_slice(&crc.to_be_bytes());
    let sidecar = dir.path().join("e.db-walrelay");
    std::fs::write(&sidecar, &meta).expect("write meta");

    let e = Database::open(&path, Options::default()).expect_err("refused");
    assert!(
        matches!(e, OpenError::EpochExhausted { epoch: u32::MAX }),
        "{e:?}"
    );
    assert_eq!(std::fs::read(&sidecar).expect("meta"), meta);
    assert!(!path.exists(), "no database file was created");
}

#[test]
fn a_statement_valid_for_the_current_schema_runs_on_a_reader_that_cached_an_older_one() {
    let (_dir, db) = open(Options {
        readers: 1,
        ..Options::default()
    });
    let s = db.session(Constraint::FirstPrimary).expect("session");
    s.prepare("CREATE TABLE t1(a, b, c, d, e)")
        .run()
        .expect("create");
    // The reader caches the five-column schema.
    s.prepare("SELECT * FROM t1").all().expect("read");
    // The writer replaces t1 (a batch runs on the writer, unclassified).
    s.batch([
        s.prepare("DROP TABLE t1"),
        s.prepare("CREATE TABLE t1(a, b, c, d, e, f)"),
    ])
    .expect("replace t1");
    // Classified on the reader whose cached schema says five columns.
    s.prepare("INSERT INTO t1 VALUES (1, 2, 3, 4, 5, 6)")
        .run()
        .expect("six values fit the current t1");
    // A read-only statement whose error would come from the stale copy.
    let r = s
        .prepare("SELECT * FROM t1 UNION ALL SELECT 1, 2, 3, 4, 5, 6")
        .all()
        .expect("six columns on both sides");
    assert_eq!(r.results.len(), 2);
}

#[test]
fn a_cancel_token_cancels_its_children_and_a_child_not_its_parent() {
    let parent = CancelToken::new();
    let a = parent.child();
    let b = parent.child();
    a.cancel();
    assert!(a.is_cancelled() && !b.is_cancelled() && !parent.is_cancelled());
    parent.cancel();
    assert!(b.is_cancelled());
}

#[test]
fn a_runaway_read_on_a_replica_ends_with_a_timeout_error_at_the_replicas_limit() {
    let dir = tempfile::tempdir().expect("dir");
    let (_db, replica) = walrelay_engine::pair(
        dir.path().join("p.db"),
        dir.path().join("r.db"),
        Options::default(),
        walrelay_engine::ReplicaOptions {
            limits: Limits {
                query_timeout_ms: 300,
                ..Limits::default()
            },
            ..walrelay_engine::ReplicaOptions::default()
        },
    )
    .expect("pair");
    let s = replica
        .session(Constraint::FirstUnconstrained)
        .expect("session");
    let e = s.prepare(RUNAWAY).all().expect_err("stopped");
    assert!(matches!(e, QueryError::Timeout { limit_ms: 300 }), "{e:?}");
    s.prepare("SELECT 1").all().expect("a later read");
}
