//! The single-node engine through its D1-shaped sessions API.

mod common;

use common::Recorder;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use walrelay_engine::{
    Access, Bookmark, CapturedTransaction, CheckpointMode, Constraint, Database, Epoch, Options,
    QueryError, Sequence, ShipError, TransactionSink, Value,
};

fn open(dir: &tempfile::TempDir, opts: Options) -> Database {
    Database::open(dir.path().join("db.sqlite"), opts).expect("open")
}

#[test]
fn every_commit_advances_the_bookmark_and_reads_do_not() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = open(&dir, Options::default());
    let s = db.session(Constraint::FirstUnconstrained).expect("session");
    assert_eq!(
        s.bookmark(),
        None,
        "an unconstrained session starts without a bookmark"
    );
    let r = s
        .prepare("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
        .run()
        .expect("create");
    assert_eq!(r.meta.bookmark, Bookmark::new(db.epoch(), Sequence(1)));
    let mut last = r.meta.bookmark;
    for i in 0..20 {
        let w = s
            .prepare("INSERT INTO t(v) VALUES (?1)")
            .bind([format!("row {i}")])
            .run()
            .expect("insert");
        assert!(
            w.meta.bookmark > last,
            "write {i} got a new, larger bookmark"
        );
        assert!(
            w.meta.bookmark.to_string() > last.to_string(),
            "text form sorts the same way"
        );
        assert_eq!(w.meta.changes, 1);
        assert_eq!(w.meta.rows_written, 1);
        assert_eq!(w.meta.last_row_id, i + 1);
        last = w.meta.bookmark;
        let r = s
            .prepare("SELECT count(*) AS n FROM t")
            .all()
            .expect("read");
        assert_eq!(r.meta.bookmark, last, "a read reports the state it saw");
        assert_eq!(r.results[0].get("n"), Some(&Value::Integer(i + 1)));
        assert_eq!(s.bookmark(), Some(last));
    }
    // A write that changes nothing commits nothing.
    let r = s
        .prepare("UPDATE t SET v = 'x' WHERE id = -1")
        .run()
        .expect("no-op update");
    assert_eq!(r.meta.changes, 0);
    assert_eq!(r.meta.bookmark, last);
}

#[test]
fn results_have_d1_shapes_and_meta() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = open(
        &dir,
        Options {
            region: "weur".into(),
            ..Options::default()
        },
    );
    let s = db.session(Constraint::FirstPrimary).expect("session");
    s.prepare("CREATE TABLE t(id INTEGER PRIMARY KEY, name TEXT, score REAL, data BLOB)")
        .run()
        .expect("create");
    s.prepare("INSERT INTO t(name, score, data) VALUES (?1, ?2, ?3), ('b', NULL, NULL)")
        .bind([
            Value::from("a"),
            Value::from(1.5),
            Value::from(vec![1u8, 2, 3]),
        ])
        .run()
        .expect("insert");

    let all = s.prepare("SELECT * FROM t ORDER BY id").all().expect("all");
    assert_eq!(all.results.len(), 2);
    assert_eq!(all.results[0].get("name"), Some(&Value::from("a")));
    assert_eq!(all.results[0].get("score"), Some(&Value::Real(1.5)));
    assert_eq!(
        all.results[0].get("data"),
        Some(&Value::Blob(vec![1, 2, 3]))
    );
    assert_eq!(all.results[1].get("score"), Some(&Value::Null));
    assert!(all.meta.served_by_primary);
    assert_eq!(all.meta.served_by_region, "weur");
    assert!(
        all.meta.rows_read >= 2,
        "rows_read counts at least the rows returned"
    );
    assert_eq!(all.meta.rows_written, 0);

    let raw = s
        .prepare("SELECT id, name FROM t ORDER BY id")
        .raw()
        .expect("raw");
    assert_eq!(raw.columns, vec!["id".to_string(), "name".to_string()]);
    assert_eq!(raw.rows[1], vec![Value::Integer(2), Value::from("b")]);

    let first = s
        .prepare("SELECT name FROM t WHERE id = ?")
        .bind([2])
        .first()
        .expect("first");
    assert_eq!(
        first.and_then(|r| r.get("name").cloned()),
        Some(Value::from("b"))
    );
    let none = s
        .prepare("SELECT name FROM t WHERE id = ?")
        .bind([99])
        .first()
        .expect("first");
    assert!(none.is_none());
}

#[test]
fn a_batch_commits_atomically_as_one_transaction() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rec = Arc::new(Recorder::default());
    let db = open(
        &dir,
        Options {
            sink: Some(rec.clone()),
            ..Options::default()
        },
    );
    let s = db.session(Constraint::FirstPrimary).expect("session");
    let before = rec.len();
    let results = s
        .batch([
            s.prepare("CREATE TABLE acct(id INTEGER PRIMARY KEY, bal INTEGER)"),
            s.prepare("INSERT INTO acct(bal) VALUES (100), (0)"),
            s.prepare("UPDATE acct SET bal = bal - 30 WHERE id = 1"),
            s.prepare("UPDATE acct SET bal = bal + 30 WHERE id = 2"),
            s.prepare("SELECT sum(bal) AS total FROM acct"),
        ])
        .expect("batch");
    assert_eq!(rec.len(), before + 1, "one batch, one captured transaction");
    assert_eq!(results.len(), 5);
    assert_eq!(results[1].meta.changes, 2);
    assert_eq!(
        results[4].results[0].get("total"),
        Some(&Value::Integer(100))
    );
    let b = results[0].meta.bookmark;
    assert!(
        results.iter().all(|r| r.meta.bookmark == b),
        "all statements share the commit"
    );
    assert_eq!(s.bookmark(), Some(b));
}

#[test]
fn each_open_is_a_new_epoch_so_bookmarks_keep_increasing_across_restarts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut last = Bookmark::ZERO;
    for round in 1..=3u32 {
        let db = open(&dir, Options::default());
        assert_eq!(db.epoch(), Epoch(round));
        let s = db
            .session(Constraint::Bookmark(last))
            .expect("an older bookmark is servable");
        if round == 1 {
            s.prepare("CREATE TABLE t(x)").run().expect("create");
        }
        let w = s
            .prepare("INSERT INTO t VALUES (?1)")
            .bind([round])
            .run()
            .expect("insert");
        assert!(w.meta.bookmark > last);
        last = w.meta.bookmark;
        let n = s
            .prepare("SELECT count(*) AS n FROM t")
            .first()
            .expect("count")
            .expect("row");
        assert_eq!(
            n.get("n"),
            Some(&Value::Integer(i64::from(round))),
            "data survives reopen"
        );
    }
}

#[test]
fn a_read_never_reports_a_bookmark_older_than_what_it_saw() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = open(
        &dir,
        Options {
            synchronous: walrelay_engine::Synchronous::Off,
            ..Options::default()
        },
    );
    let s = db.session(Constraint::FirstPrimary).expect("session");
    s.prepare("CREATE TABLE t(i INTEGER PRIMARY KEY)")
        .run()
        .expect("create");
    let written: Arc<Mutex<BTreeMap<i64, Bookmark>>> = Arc::default();
    let n = 2_000;
    std::thread::scope(|scope| {
        let w = written.clone();
        let db2 = db.clone();
        scope.spawn(move || {
            let s = db2.session(Constraint::FirstPrimary).expect("session");
            for i in 1..=n {
                let r = s
                    .prepare("INSERT INTO t(i) VALUES (?1)")
                    .bind([i])
                    .run()
                    .expect("insert");
                w.lock().expect("lock").insert(i, r.meta.bookmark);
            }
        });
        for _ in 0..2 {
            let w = written.clone();
            let db2 = db.clone();
            scope.spawn(move || {
                let s = db2
                    .session(Constraint::FirstUnconstrained)
                    .expect("session");
                loop {
                    let r = s
                        .prepare("SELECT coalesce(max(i), 0) AS m FROM t")
                        .all()
                        .expect("read");
                    let m = r.results[0].get("m").and_then(Value::as_i64).expect("int");
                    if m > 0 {
                        // The insert of row m may not have returned yet; its
                        // bookmark is then assigned by the time we look.
                        let seen = loop {
                            if let Some(b) = w.lock().expect("lock").get(&m) {
                                break *b;
                            }
                            std::thread::yield_now();
                        };
                        assert!(
                            r.meta.bookmark >= seen,
                            "read saw row {m} at {seen} but reported {}",
                            r.meta.bookmark
                        );
                    }
                    if m == n {
                        break;
                    }
                }
            });
        }
    });
}

#[test]
fn engine_checkpoints_keep_the_wal_bounded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = open(
        &dir,
        Options {
            checkpoint_threshold_frames: 200,
            synchronous: walrelay_engine::Synchronous::Off,
            ..Options::default()
        },
    );
    let s = db.session(Constraint::FirstPrimary).expect("session");
    s.prepare("CREATE TABLE t(x BLOB)").run().expect("create");
    let wal = dir.path().join("db.sqlite-wal");
    let mut max_len = 0;
    for _ in 0..3_000 {
        s.prepare("INSERT INTO t VALUES (randomblob(100))")
            .run()
            .expect("insert");
        max_len = max_len.max(std::fs::metadata(&wal).expect("wal").len());
    }
    // 200 frames of 4 KiB plus the header and one transaction's frames.
    let bound = 32 + 210 * (4096 + 24);
    assert!(
        max_len <= bound,
        "WAL reached {max_len} bytes, bound {bound}"
    );
    let stats = db.checkpoint(CheckpointMode::Truncate).expect("truncate");
    assert_eq!(stats.wal_frames, 0);
    assert_eq!(std::fs::metadata(&wal).expect("wal").len(), 0);
    s.prepare("INSERT INTO t VALUES (1)")
        .run()
        .expect("write after truncate is captured");
}

struct Refusing;
impl TransactionSink for Refusing {
    fn committed(&self, _: Bookmark, _: &CapturedTransaction) -> Result<(), ShipError> {
        Err(ShipError::NotStarted)
    }
}

#[test]
fn a_sink_that_refuses_stops_the_database_with_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = open(
        &dir,
        Options {
            sink: Some(Arc::new(Refusing)),
            ..Options::default()
        },
    );
    let s = db.session(Constraint::FirstPrimary).expect("session");
    let e = s.prepare("CREATE TABLE t(x)").run().expect_err("refused");
    assert!(matches!(e, QueryError::CaptureFailed(_)), "{e:?}");
    assert!(e.to_string().contains("replication is not started"), "{e}");
    let e = s
        .prepare("CREATE TABLE u(x)")
        .run()
        .expect_err("still refused");
    assert!(matches!(e, QueryError::CaptureFailed(_)), "{e:?}");
    // The refused transaction sits in the local WAL without a bookmark: no
    // read may reveal it.
    let e = s
        .prepare("SELECT count(*) FROM sqlite_master")
        .all()
        .expect_err("reads stop too");
    assert!(matches!(e, QueryError::CaptureFailed(_)), "{e:?}");
    assert_eq!(
        db.latest_bookmark().sequence,
        Sequence(0),
        "no bookmark was issued"
    );
}

#[test]
fn a_read_only_session_reads_and_its_writes_and_batches_with_a_write_are_refused_changing_nothing()
{
    let dir = tempfile::tempdir().expect("tempdir");
    let db = open(&dir, Options::default());
    let rw = db.session(Constraint::FirstPrimary).expect("session");
    rw.prepare("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
        .run()
        .expect("create");
    rw.prepare("INSERT INTO t(v) VALUES ('a'), ('b')")
        .run()
        .expect("insert");
    let ro = db
        .session(Constraint::FirstPrimary)
        .expect("session")
        .with_access(Access::ReadOnly);
    assert_eq!(ro.access(), Access::ReadOnly);
    let before = (db.latest_bookmark(), common::logical_pages(&rw));
    let n = ro
        .prepare("SELECT count(*) AS n FROM t")
        .first()
        .expect("read")
        .expect("row");
    assert_eq!(n.get("n"), Some(&Value::Integer(2)));
    for sql in [
        "INSERT INTO t(v) VALUES ('c')",
        "UPDATE t SET v = 'x'",
        "DELETE FROM t",
        "CREATE TABLE u(x)",
        "DROP TABLE t",
        "ALTER TABLE t ADD COLUMN w TEXT",
    ] {
        match ro.prepare(sql).run() {
            Err(QueryError::ReadOnlyAccess) => {}
            other => panic!("{sql}: {other:?}"),
        }
    }
    // A batch is refused at its first write, before it runs, and rolled
    // back as a whole.
    match ro.batch([
        ro.prepare("SELECT count(*) FROM t"),
        ro.prepare("INSERT INTO t(v) VALUES ('c')"),
        ro.prepare("SELECT 1"),
    ]) {
        Err(QueryError::Batch { index: 1, source }) => {
            assert!(matches!(*source, QueryError::ReadOnlyAccess), "{source:?}")
        }
        other => panic!("batch with a write: {other:?}"),
    }
    assert_eq!(
        (db.latest_bookmark(), common::logical_pages(&rw)),
        before,
        "nothing changed"
    );
    // A batch of reads runs.
    let rs = ro
        .batch([
            ro.prepare("SELECT count(*) AS n FROM t"),
            ro.prepare("SELECT v FROM t ORDER BY id"),
        ])
        .expect("reads");
    assert_eq!(rs[1].results.len(), 2);
    assert_eq!(
        db.latest_bookmark(),
        before.0,
        "a batch of reads commits nothing"
    );
    // The read-write session is unaffected.
    rw.prepare("INSERT INTO t(v) VALUES ('c')")
        .run()
        .expect("write");
}
