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
