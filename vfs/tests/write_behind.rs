//! A hold's frames kept back and written to the WAL file as one run, end to
//! end through real SQLite connections: what reaches the file, and when.

use rusqlite::{Connection, OpenFlags};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use walrelay_vfs::{Attachment, CaptureSink, CapturedTransaction, SinkError, VFS_NAME, attach};

#[derive(Default)]
struct Counter(AtomicU64);

impl CaptureSink for Counter {
    fn committed(&self, _txn: CapturedTransaction) -> Result<(), SinkError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
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

/// A database in WAL mode, attached, with table `t(a INTEGER PRIMARY KEY,
/// b BLOB)` committed.
fn fixture(dir: &Path) -> (std::path::PathBuf, Attachment, Connection) {
    let path = dir.join("wb.db");
    Connection::open(&path)
        .expect("open plain")
        .query_row("PRAGMA journal_mode=WAL", [], |_| Ok(()))
        .expect("wal");
    let att = attach(&path, Arc::new(Counter::default())).expect("attach");
    let c = open(&path);
    c.execute_batch("CREATE TABLE t(a INTEGER PRIMARY KEY, b BLOB);")
        .expect("table");
    (path, att, c)
}

fn wal_len(path: &Path) -> u64 {
    std::fs::metadata(format!("{}-wal", path.display())).map_or(0, |m| m.len())
}

#[test]
fn a_one_row_commit_reaches_the_wal_file_in_one_write() {
    let dir = tempfile::tempdir().expect("tmp");
    let (path, att, c) = fixture(dir.path());
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
        let (path, att, c) = fixture(dir.path());
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
    let (path, att, c) = fixture(dir.path());
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
    let (_path, att, c) = fixture(dir.path());
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
