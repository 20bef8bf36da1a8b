//! The VFS end to end through real SQLite connections.

use rusqlite::{Connection, OpenFlags};
use std::path::Path;
use std::sync::{Arc, Mutex};
use walrelay_vfs::{Attachment, CaptureSink, CapturedTransaction, SinkError, VFS_NAME, attach};

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

/// Write-behind (`vfs/src/write_behind.rs`): a hold's frames kept back and
/// written to the WAL file as one run. A database in WAL mode, attached,
/// with table `t(a INTEGER PRIMARY KEY,
/// b BLOB)` committed.
fn write_behind_fixture(dir: &Path) -> (std::path::PathBuf, Attachment, Connection) {
    let path = dir.join("wb.db");
    bootstrap(&path);
    let att = attach(&path, Arc::new(Recorder::default())).expect("attach");
    let c = open(&path);
    c.execute_batch("CREATE TABLE t(a INTEGER PRIMARY KEY, b BLOB);")
        .expect("table");
    (path, att, c)
}

#[test]
fn a_one_row_commit_reaches_the_wal_file_in_one_write() {
    let dir = tempfile::tempdir().expect("tmp");
    let (path, att, c) = write_behind_fixture(dir.path());
    for i in 0..20 {
        let (writes, len) = (att.stats().wal_file_writes, wal_len(&path));
        c.execute("INSERT INTO t(b) VALUES (randomblob(100))", [])
            .expect("insert");
        let frames = (wal_len(&path) - len) / (24 + 4096);
        assert!(frames >= 1, "insert {i} appended {frames} frames");
        assert_eq!(
            att.stats().wal_file_writes - writes,
            1,
            "insert {i}: {frames} frames (SQLite's {} calls) in one write",
            2 * frames
        );
    }
}

#[test]
fn a_commit_is_whole_in_the_wal_file_when_it_returns() {
    // What a crash right after the commit returned would leave: SQLite's own
    // recovery, on copies of the files, finds every committed row.
    for sync in ["OFF", "NORMAL", "FULL"] {
        let dir = tempfile::tempdir().expect("tmp");
        let (path, att, c) = write_behind_fixture(dir.path());
        c.execute_batch(&format!("PRAGMA synchronous={sync};"))
            .expect("synchronous");
        let syncs = att.syncs();
        commits_are_whole_in_the_wal_file(&path, &c, sync);
        if sync != "FULL" {
            assert_eq!(att.syncs(), syncs, "no sync wrote the runs at {sync}");
        }
    }
}

fn commits_are_whole_in_the_wal_file(path: &Path, c: &Connection, sync: &str) {
    let copies = tempfile::tempdir().expect("tmp");
    for rows in [1i64, 2, 50] {
        c.execute_batch("BEGIN").expect("begin");
        for _ in 0..rows {
            c.execute("INSERT INTO t(b) VALUES (randomblob(3000))", [])
                .expect("insert");
        }
        c.execute_batch("COMMIT").expect("commit");
        let copy = copies.path().join(format!("after-{rows}.db"));
        std::fs::copy(path, &copy).expect("copy db");
        std::fs::copy(
            format!("{}-wal", path.display()),
            format!("{}-wal", copy.display()),
        )
        .expect("copy wal");
        let plain = Connection::open(&copy).expect("open the copy plainly");
        let (theirs, ours): (i64, i64) = (
            plain
                .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
                .expect("count the copy"),
            c.query_row("SELECT count(*) FROM t", [], |r| r.get(0))
                .expect("count"),
        );
        assert_eq!(theirs, ours, "after committing {rows} rows at {sync}");
    }
}

#[test]
fn a_transaction_larger_than_a_run_streams_to_the_file_and_another_connection_reads_it_after_commit()
 {
    let dir = tempfile::tempdir().expect("tmp");
    let (path, att, c) = write_behind_fixture(dir.path());
    let reader = open(&path);
    let writes = att.stats().wal_file_writes;
    c.execute_batch("BEGIN").expect("begin");
    // About 4 MiB of pages: several runs of at most 1 MiB, each written in
    // pieces SQLite's unix VFS takes (under 128 KiB a call).
    for _ in 0..1000 {
        c.execute("INSERT INTO t(b) VALUES (randomblob(4000))", [])
            .expect("insert");
    }
    let count = |conn: &Connection| -> i64 {
        conn.query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .expect("count")
    };
    assert_eq!(count(&reader), 0, "nothing visible before the commit");
    c.execute_batch("COMMIT").expect("commit");
    assert_eq!(count(&reader), 1000);
    let frames = wal_len(&path) / (24 + 4096);
    let made = att.stats().wal_file_writes - writes;
    assert!(
        made < frames,
        "{made} writes for about {frames} frames (SQLite makes two calls a frame)"
    );
    assert!(att.poisoned().is_none());
}

#[test]
fn a_transaction_that_reads_back_its_spilled_pages_commits_them_exactly() {
    let dir = tempfile::tempdir().expect("tmp");
    let (_path, att, c) = write_behind_fixture(dir.path());
    // A cache of ten pages: the transaction's pages spill to the WAL and are
    // read back from it while the transaction goes on.
    c.execute_batch("PRAGMA cache_size=10;").expect("cache");
    c.execute_batch("BEGIN").expect("begin");
    for i in 0..300i64 {
        c.execute("INSERT INTO t(a, b) VALUES (?1, zeroblob(1500) || ?1)", [i])
            .expect("insert");
    }
    let sum: i64 = c
        .query_row(
            "SELECT sum(a) FROM t WHERE b = zeroblob(1500) || a",
            [],
            |r| r.get(0),
        )
        .expect("read back");
    assert_eq!(sum, (0..300).sum::<i64>());
    c.execute("UPDATE t SET b = x'00' WHERE a % 7 = 0", [])
        .expect("update");
    c.execute_batch("COMMIT").expect("commit");
    let fresh = open(&dir.path().join("wb.db"));
    let changed: i64 = fresh
        .query_row("SELECT count(*) FROM t WHERE b = x'00'", [], |r| r.get(0))
        .expect("count");
    assert_eq!(changed, (0..300).filter(|a| a % 7 == 0).count() as i64);
    assert!(att.poisoned().is_none());
}

/// Found by the `wal_crash_recovery` fuzz target: SQLite falls back to
/// rollback mode when page 1 no longer says WAL (media damage), and a
/// write then opened a rollback journal beside the database. The write
/// failed (the database file is written only by a checkpoint), but the
/// journal stayed behind, hot, and every later open failed trying to roll
/// it back. The VFS now refuses the journal before anything is created.
#[test]
fn a_write_to_a_primary_whose_header_lost_wal_mode_fails_and_leaves_no_rollback_journal() {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("db.sqlite");
    {
        // A WAL database with one row, all in the database file (the last
        // connection's close checkpoints it and removes the WAL).
        let c = Connection::open(&path).expect("open plain");
        c.execute_batch("CREATE TABLE t(x); INSERT INTO t VALUES (1); PRAGMA journal_mode=WAL;")
            .expect("bootstrap");
    }
    let set_format = |versions: [u8; 2]| {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("db file");
        // Bytes 18 and 19: the file format's write and read versions.
        f.write_all_at(&versions, 18).expect("header");
    };
    let journal = dir.path().join("db.sqlite-journal");
    set_format([1, 1]);
    {
        let a = attach(&path, Arc::new(Recorder::default())).expect("attach");
        let c = open(&path);
        let count: i64 = c
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .expect("a read needs no journal");
        assert_eq!(count, 1);
        let e = c
            .execute("INSERT INTO t VALUES (2)", [])
            .expect_err("no rollback journal for a walrelay database");
        assert_eq!(
            e.sqlite_error_code(),
            Some(rusqlite::ErrorCode::CannotOpen),
            "{e}"
        );
        assert!(!journal.exists(), "no journal was created");
        assert!(a.poisoned().is_none(), "nothing was written");
    }
    // The header repaired, the database opens and takes writes as before,
    // even beside an empty journal (not hot: SQLite leaves it be).
    set_format([2, 2]);
    std::fs::write(&journal, b"").expect("an empty journal");
    let rec = Arc::new(Recorder::default());
    let a = attach(&path, rec.clone()).expect("attach");
    let c = open(&path);
    c.execute("INSERT INTO t VALUES (2)", []).expect("write");
    let count: i64 = c
        .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .expect("read");
    assert_eq!(count, 2);
    assert_eq!(rec.0.lock().expect("recorder").len(), 1, "captured");
    assert!(a.poisoned().is_none());
}
