//! The VFS end to end through real SQLite connections.

use rusqlite::{Connection, OpenFlags};
use std::path::Path;
use std::sync::{Arc, Mutex};
use walrelay_vfs::{CaptureSink, CapturedTransaction, SinkError, VFS_NAME, attach};

#[derive(Default)]
struct Recorder(Mutex<Vec<CapturedTransaction>>);

impl CaptureSink for Recorder {
    fn committed(&self, txn: CapturedTransaction) -> Result<(), SinkError> {
        self.0.lock().expect("not poisoned").push(txn);
        Ok(())
    }
}

fn bootstrap(path: &Path) {
    let c = Connection::open(path).expect("open plain");
    c.query_row("PRAGMA journal_mode=WAL", [], |_| Ok(()))
        .expect("wal");
}

fn open(path: &Path) -> Connection {
    let c = Connection::open_with_flags_and_vfs(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE,
        VFS_NAME,
    )
    .expect("open through walrelay");
    c.execute_batch("PRAGMA wal_autocheckpoint=0;")
        .expect("pragma");
    c
}

/// Applies captured page sets to a copy of the database file.
fn replay(copy: &Path, txns: &[CapturedTransaction]) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(copy)
        .expect("copy");
    for t in txns {
        for (no, img) in t.pages.pages() {
            f.write_all_at(img, no.file_offset(t.pages.page_size()))
                .expect("write");
        }
        f.set_len(u64::from(t.pages.db_size_pages()) * u64::from(t.pages.page_size()))
            .expect("truncate");
    }
}

fn logical_pages(c: &Connection) -> Vec<Vec<u8>> {
    let mut s = c
        .prepare("SELECT data FROM sqlite_dbpage ORDER BY pgno")
        .expect("dbpage");
    s.query_map([], |r| r.get::<_, Vec<u8>>(0))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows")
}

#[test]
fn committed_transactions_replay_to_the_same_pages_and_rollbacks_capture_nothing() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("a.db");
    bootstrap(&path);
    let base = dir.path().join("base.db");
    std::fs::copy(&path, &base).expect("copy");
    let rec = Arc::new(Recorder::default());
    let _att = attach(&path, rec.clone()).expect("attach");
    let c = open(&path);
    c.execute_batch("CREATE TABLE t(a INTEGER PRIMARY KEY, b BLOB);")
        .expect("create");
    for i in 0..50 {
        c.execute("INSERT INTO t(b) VALUES (randomblob(?1))", [i * 300])
            .expect("insert");
    }
    c.execute_batch("BEGIN; INSERT INTO t(b) VALUES (randomblob(10000)); ROLLBACK;")
        .expect("rb");
    let n = rec.0.lock().expect("lock").len();
    assert_eq!(n, 51, "one capture per commit, none for the rollback");
    replay(&base, &rec.0.lock().expect("lock"));
    let want = logical_pages(&c);
    let got = std::fs::read(&base).expect("read");
    assert_eq!(got.len(), want.len() * 4096);
    for (i, p) in want.iter().enumerate() {
        assert!(
            got[i * 4096..(i + 1) * 4096] == p[..],
            "page {} differs",
            i + 1
        );
    }
}

#[test]
fn opening_an_unattached_database_through_the_vfs_fails() {
    walrelay_vfs::register().expect("register");
    let dir = tempfile::tempdir().expect("tmp");
    let r = Connection::open_with_flags_and_vfs(
        dir.path().join("x.db"),
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE,
        VFS_NAME,
    );
    assert!(r.is_err());
}

#[test]
fn exclusive_locking_and_other_journal_modes_are_refused_with_a_clear_error() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("b.db");
    bootstrap(&path);
    let _att = attach(&path, Arc::new(Recorder::default())).expect("attach");
    let c = open(&path);
    let e = c
        .execute_batch("PRAGMA locking_mode=EXCLUSIVE")
        .expect_err("refused");
    assert!(
        e.to_string().contains("locking_mode=EXCLUSIVE is refused"),
        "{e}"
    );
    let e = c
        .execute_batch("PRAGMA journal_mode=DELETE")
        .expect_err("refused");
    assert!(
        e.to_string().contains("journal_mode=delete is refused"),
        "{e}"
    );
    let mode: String = c
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .expect("query");
    assert_eq!(mode, "wal");
}

fn wal_len(path: &Path) -> u64 {
    let wal = format!("{}-wal", path.display());
    std::fs::metadata(wal).map_or(0, |m| m.len())
}

#[test]
fn a_rolled_back_transaction_that_spilled_frames_captures_nothing() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("spill.db");
    bootstrap(&path);
    let rec = Arc::new(Recorder::default());
    let _att = attach(&path, rec.clone()).expect("attach");
    let c = open(&path);
    c.execute_batch("PRAGMA cache_size=10; CREATE TABLE t(b BLOB);")
        .expect("setup");
    let captured = rec.0.lock().expect("lock").len();
    let wal_before = wal_len(&path);
    c.execute_batch("BEGIN").expect("begin");
    for _ in 0..300 {
        c.execute("INSERT INTO t VALUES (randomblob(3000))", [])
            .expect("insert");
    }
    assert!(
        wal_len(&path) > wal_before + 100 * 4096,
        "the cache spilled frames into the WAL"
    );
    c.execute_batch("ROLLBACK").expect("rollback");
    assert_eq!(
        rec.0.lock().expect("lock").len(),
        captured,
        "nothing captured"
    );
    // The next commit overwrites the spilled frames and is captured whole.
    c.execute("INSERT INTO t VALUES (x'01')", [])
        .expect("insert");
    assert_eq!(rec.0.lock().expect("lock").len(), captured + 1);
}

#[test]
fn a_spilling_transaction_with_savepoint_rollbacks_replays_exactly() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("sp.db");
    bootstrap(&path);
    let base = dir.path().join("base.db");
    std::fs::copy(&path, &base).expect("copy");
    let rec = Arc::new(Recorder::default());
    let att = attach(&path, rec.clone()).expect("attach");
    let c = open(&path);
    c.execute_batch("PRAGMA cache_size=10; CREATE TABLE t(a INTEGER PRIMARY KEY, b BLOB);")
        .expect("setup");
    c.execute_batch(
        "BEGIN;
         WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100)
         INSERT INTO t(b) SELECT randomblob(2000) FROM n;
         SAVEPOINT s1;
         UPDATE t SET b = randomblob(5000) WHERE a % 2 = 0;
         WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100)
         INSERT INTO t(b) SELECT randomblob(1000) FROM n;
         ROLLBACK TO s1;
         UPDATE t SET b = randomblob(100) WHERE a % 3 = 0;
         RELEASE s1;
         COMMIT;",
    )
    .expect("transaction");
    // Pages spilled and then changed again are rewritten in place (and the
    // savepoint rewind overwrites frames): capture followed offsets.
    let stats = att.stats();
    assert!(
        stats.overwrites > 0,
        "the transaction rewrote frames: {stats:?}"
    );
    assert_eq!(stats.transactions, 2);
    replay(&base, &rec.0.lock().expect("lock"));
    let want = logical_pages(&c);
    let got = std::fs::read(&base).expect("read");
    assert_eq!(got.len(), want.len() * 4096);
    assert!(
        want.iter()
            .enumerate()
            .all(|(i, p)| got[i * 4096..(i + 1) * 4096] == p[..])
    );
}

#[test]
fn transactions_from_several_connections_are_captured_in_commit_order() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("multi.db");
    bootstrap(&path);
    let rec = Arc::new(Recorder::default());
    let _att = attach(&path, rec.clone()).expect("attach");
    let setup = open(&path);
    setup
        .execute_batch("CREATE TABLE t(conn INTEGER, i INTEGER)")
        .expect("create");
    std::thread::scope(|s| {
        for conn in 0..3 {
            let path = path.clone();
            s.spawn(move || {
                let c = open(&path);
                c.busy_timeout(std::time::Duration::from_secs(10))
                    .expect("busy");
                for i in 0..100 {
                    c.execute("INSERT INTO t VALUES (?1, ?2)", [conn, i])
                        .expect("insert");
                }
            });
        }
    });
    let txns = rec.0.lock().expect("lock");
    assert_eq!(txns.len(), 301, "one capture per commit across connections");
    // Commit order is WAL order: each capture starts right after the last.
    for w in txns.windows(2) {
        let (a, b) = (&w[0].wal, &w[1].wal);
        if a.salt == b.salt {
            assert_eq!(
                b.first_frame.get(),
                a.commit_frame.get() + 1,
                "no gap, no overlap"
            );
        }
    }
}

fn too_large_fixture(
    cache_pages: i64,
) -> (
    tempfile::TempDir,
    Connection,
    Arc<Recorder>,
    walrelay_vfs::Attachment,
) {
    let dir = tempfile::tempdir().expect("tmp");
    let p = dir.path().join("db");
    bootstrap(&p);
    let rec = Arc::new(Recorder::default());
    let att = attach(&p, rec.clone()).expect("attach");
    att.set_max_transaction_bytes(Some(256 * 1024));
    let c = open(&p);
    c.execute_batch(&format!(
        "PRAGMA cache_size={cache_pages}; CREATE TABLE t(x INTEGER PRIMARY KEY, v BLOB);"
    ))
    .expect("create");
    (dir, c, rec, att)
}

fn assert_refused_as_full(r: rusqlite::Result<impl std::fmt::Debug>) {
    match r {
        Err(e) => assert_eq!(
            e.sqlite_error_code(),
            Some(rusqlite::ErrorCode::DiskFull),
            "refused with SQLITE_FULL: {e}"
        ),
        Ok(v) => panic!("an oversized transaction committed: {v:?}"),
    }
}

#[test]
fn a_transaction_over_the_size_limit_is_refused_before_commit_and_changes_nothing() {
    for cache_pages in [2000, 4] {
        // 4 pages of cache: the transaction spills frames to the WAL before
        // its commit, and the refusal lands mid-statement.
        let (_dir, c, rec, att) = too_large_fixture(cache_pages);
        let before = logical_pages(&c);
        let captured = rec.0.lock().expect("lock").len();
        assert_refused_as_full(c.execute(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM n WHERE i < 100) \
             INSERT INTO t(v) SELECT randomblob(4000) FROM n",
            [],
        ));
        assert!(
            att.take_refused_too_large(),
            "the refusal is the size limit"
        );
        assert!(!att.take_refused_too_large(), "taken once");
        assert!(
            att.poisoned().is_none(),
            "a size refusal is not a capture failure"
        );
        assert_eq!(att.stats().too_large_refusals, 1);
        assert_eq!(
            rec.0.lock().expect("lock").len(),
            captured,
            "nothing captured"
        );
        assert!(c.is_autocommit(), "rolled back");
        assert!(
            logical_pages(&c) == before,
            "nothing changed ({cache_pages} pages of cache)"
        );
        // The connection goes on: a small write commits and is captured.
        c.execute("INSERT INTO t(v) VALUES (randomblob(100))", [])
            .expect("a small write after the refusal");
        assert_eq!(rec.0.lock().expect("lock").len(), captured + 1);
        let n: i64 = c
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .expect("count");
        assert_eq!(n, 1);
    }
}

#[test]
fn an_explicit_transaction_over_the_size_limit_fails_its_statement_and_rolls_back() {
    let (_dir, c, rec, att) = too_large_fixture(2000);
    let before = logical_pages(&c);
    c.execute_batch("BEGIN IMMEDIATE").expect("begin");
    c.execute("INSERT INTO t(v) VALUES (randomblob(100))", [])
        .expect("small insert");
    let big = c.execute(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM n WHERE i < 100) \
         INSERT INTO t(v) SELECT randomblob(4000) FROM n",
        [],
    );
    // With a large cache the pages reach the WAL only at COMMIT.
    let commit = big.and_then(|_| c.execute_batch("COMMIT"));
    assert_refused_as_full(commit);
    if !c.is_autocommit() {
        c.execute_batch("ROLLBACK").expect("rollback");
    }
    assert!(att.take_refused_too_large());
    assert!(att.poisoned().is_none());
    assert!(logical_pages(&c) == before, "nothing changed");
    assert_eq!(rec.0.lock().expect("lock").len(), 1, "only the CREATE");
    c.execute("INSERT INTO t(v) VALUES (1)", [])
        .expect("write after");
}

#[test]
fn a_commit_that_sqlite_fails_after_writing_its_commit_frame_is_shipped_to_nobody() {
    let dir = tempfile::tempdir().expect("tmp");
    let p = dir.path().join("db");
    bootstrap(&p);
    let rec = Arc::new(Recorder::default());
    let att = attach(&p, rec.clone()).expect("attach");
    let c = open(&p);
    // FULL syncs the WAL after the commit frame and before SQLite publishes
    // the wal-index header: a failed sync there fails the commit.
    c.execute_batch("PRAGMA synchronous=FULL; CREATE TABLE t(x INTEGER PRIMARY KEY, v TEXT);")
        .expect("create");
    let shipped = rec.0.lock().expect("lock").len();
    let before = logical_pages(&c);
    att.fail_next_wal_sync();
    let r = c.execute("INSERT INTO t(v) VALUES ('never committed')", []);
    assert!(r.is_err(), "the commit failed: {r:?}");
    assert_eq!(
        rec.0.lock().expect("lock").len(),
        shipped,
        "a transaction SQLite rolled back reached the sink"
    );
    assert_eq!(att.stats().unpublished_commits, 1);
    assert!(att.poisoned().is_none());
    assert!(logical_pages(&c) == before, "SQLite kept nothing either");
    // Later commits are captured and still reproduce the database.
    c.execute("INSERT INTO t(v) VALUES ('committed')", [])
        .expect("a later write");
    let txns = rec.0.lock().expect("lock").clone();
    assert_eq!(txns.len(), shipped + 1);
    let n: i64 = c
        .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .expect("count");
    assert_eq!(n, 1);
}
