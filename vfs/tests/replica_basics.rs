//! The replica applier against real SQLite readers.

use rusqlite::{Connection, OpenFlags};
use std::path::Path;
use std::sync::{Arc, Mutex};
use walrelay_replicator::{Bookmark, Epoch, Sequence};
use walrelay_vfs::{
    Appended, ApplyError, CaptureSink, CapturedTransaction, ReplicaInit, ReplicaWal, SinkError,
    VFS_NAME, attach,
};

#[derive(Default)]
struct Recorder(Mutex<Vec<CapturedTransaction>>);
impl CaptureSink for Recorder {
    fn committed(&self, txn: CapturedTransaction) -> Result<(), SinkError> {
        self.0.lock().expect("lock").push(txn);
        Ok(())
    }
}

fn open_vfs(path: &Path, flags: OpenFlags) -> Connection {
    let c = Connection::open_with_flags_and_vfs(path, flags, VFS_NAME).expect("open");
    c.busy_timeout(std::time::Duration::from_secs(5))
        .expect("busy");
    c
}

fn pages(c: &Connection) -> Vec<Vec<u8>> {
    let mut s = c
        .prepare("SELECT data FROM sqlite_dbpage ORDER BY pgno")
        .expect("dbpage");
    s.query_map([], |r| r.get(0))
        .expect("q")
        .collect::<Result<_, _>>()
        .expect("rows")
}

fn count(c: &Connection) -> i64 {
    c.query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .unwrap_or(-1)
}

fn open_replica(path: &Path) -> Result<ReplicaWal, walrelay_vfs::ReplicaOpenError> {
    ReplicaWal::open(
        path,
        ReplicaInit {
            page_size: 4096,
            bookmark: Bookmark::ZERO,
        },
    )
}

fn b(seq: u64) -> Bookmark {
    Bookmark::new(Epoch(1), Sequence(seq))
}

struct Pair {
    _dir: tempfile::TempDir,
    primary: Connection,
    rec: Arc<Recorder>,
    _att: walrelay_vfs::Attachment,
    replica_path: std::path::PathBuf,
}

fn pair() -> Pair {
    let dir = tempfile::tempdir().expect("tmp");
    let p = dir.path().join("primary.db");
    {
        let c = Connection::open(&p).expect("create");
        c.execute_batch("PRAGMA journal_mode=WAL;").expect("wal");
    }
    let rec = Arc::new(Recorder::default());
    let att = attach(&p, rec.clone()).expect("attach");
    let primary = open_vfs(&p, OpenFlags::SQLITE_OPEN_READ_WRITE);
    primary
        .execute_batch("PRAGMA wal_autocheckpoint=0;")
        .expect("pragma");
    let replica_path = dir.path().join("replica.db");
    Pair {
        _dir: dir,
        primary,
        rec,
        _att: att,
        replica_path,
    }
}

#[test]
fn appended_transactions_stay_invisible_until_confirmed_then_match_the_primary() {
    let p = pair();
    let mut r = open_replica(&p.replica_path).expect("open replica");
    let reader = open_vfs(&p.replica_path, OpenFlags::SQLITE_OPEN_READ_ONLY);
    p.primary
        .execute_batch("CREATE TABLE t(x INTEGER PRIMARY KEY, v BLOB)")
        .expect("create");
    for i in 1..=40i64 {
        p.primary
            .execute("INSERT INTO t(v) VALUES (randomblob(?1))", [i * 150])
            .expect("insert");
    }
    let txns = p.rec.0.lock().expect("lock").clone();
    assert_eq!(txns.len(), 41);
    for (i, t) in txns.iter().enumerate() {
        let seq = i as u64 + 1;
        let before = count(&reader);
        let a = r.append(b(seq), &t.pages).expect("append");
        assert!(matches!(a, Appended::Applied { .. }));
        assert_eq!(
            count(&reader),
            before,
            "unconfirmed transaction {seq} is invisible"
        );
        r.confirm(b(seq)).expect("confirm");
        assert_eq!(
            count(&reader),
            seq as i64 - 1,
            "transaction {seq} visible after confirm"
        );
    }
    assert!(
        pages(&reader) == pages(&p.primary),
        "replica equals primary page for page"
    );
    let ok: String = reader
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .expect("check");
    assert_eq!(ok, "ok");
}

#[test]
fn duplicates_are_ignored_gaps_name_the_next_bookmark_and_discard_drops_unconfirmed() {
    let p = pair();
    let mut r = open_replica(&p.replica_path).expect("open replica");
    let reader = open_vfs(&p.replica_path, OpenFlags::SQLITE_OPEN_READ_ONLY);
    p.primary
        .execute_batch("CREATE TABLE t(x)")
        .expect("create");
    p.primary
        .execute_batch("INSERT INTO t VALUES (1)")
        .expect("insert");
    p.primary
        .execute_batch("INSERT INTO t VALUES (2)")
        .expect("insert");
    let t = p.rec.0.lock().expect("lock").clone();
    r.append(b(1), &t[0].pages).expect("append 1");
    assert_eq!(
        r.append(b(1), &t[0].pages).expect("dup"),
        Appended::Duplicate
    );
    match r.append(b(3), &t[2].pages) {
        Err(ApplyError::Gap { expected, .. }) => assert_eq!(expected, b(2)),
        other => panic!("expected a gap, got {other:?}"),
    }
    assert!(matches!(
        r.confirm(b(2)),
        Err(ApplyError::NotAppended { .. })
    ));
    r.confirm(b(1)).expect("confirm 1");
    r.append(b(2), &t[1].pages).expect("append 2");
    r.discard_unconfirmed().expect("discard");
    assert_eq!(r.last_appended(), b(1));
    assert_eq!(count(&reader), 0, "only the CREATE TABLE is visible");
    r.append(b(2), &t[1].pages).expect("append 2 again");
    r.append(b(3), &t[2].pages).expect("append 3");
    r.confirm(b(3)).expect("confirm 3");
    assert_eq!(count(&reader), 2);
    assert!(pages(&reader) == pages(&p.primary));
}

#[test]
fn reopening_cuts_everything_past_the_persisted_watermark() {
    let p = pair();
    p.primary
        .execute_batch("CREATE TABLE t(x)")
        .expect("create");
    for i in 0..5 {
        p.primary
            .execute("INSERT INTO t VALUES (?1)", [i])
            .expect("insert");
    }
    let t = p.rec.0.lock().expect("lock").clone();
    {
        let mut r = open_replica(&p.replica_path).expect("open");
        for (i, txn) in t.iter().enumerate().take(4) {
            r.append(b(i as u64 + 1), &txn.pages).expect("append");
        }
        r.confirm(b(2)).expect("confirm");
        r.persist().expect("persist");
        r.confirm(b(3)).expect("confirm, not persisted");
        // dropped with 3 confirmed-not-persisted and 4 unconfirmed
    }
    let r = open_replica(&p.replica_path).expect("reopen");
    assert_eq!(r.confirmed(), b(2));
    let reader = open_vfs(&p.replica_path, OpenFlags::SQLITE_OPEN_READ_ONLY);
    assert_eq!(count(&reader), 1, "exactly the persisted prefix");
}

#[test]
fn checkpoints_and_restarts_keep_the_replica_wal_bounded_while_readers_read() {
    let p = pair();
    p.primary
        .execute_batch("CREATE TABLE t(x INTEGER PRIMARY KEY, v TEXT)")
        .expect("create");
    let mut r = open_replica(&p.replica_path).expect("open replica");
    let reader = open_vfs(&p.replica_path, OpenFlags::SQLITE_OPEN_READ_ONLY);
    let wal = format!("{}-wal", p.replica_path.display());
    let mut seq = 0u64;
    let mut max_wal = 0u64;
    for i in 0..3_000i64 {
        p.primary
            .execute("INSERT INTO t(v) VALUES ('row ' || ?1)", [i])
            .expect("insert");
        let txns: Vec<_> = std::mem::take(&mut *p.rec.0.lock().expect("lock"));
        for t in txns {
            seq += 1;
            r.append(b(seq), &t.pages).expect("append");
            r.confirm(b(seq)).expect("confirm");
        }
        if r.wal_frames() >= 100 {
            r.checkpoint().expect("checkpoint");
        }
        if i % 7 == 0 {
            assert_eq!(count(&reader), i + 1, "reader sees every confirmed row");
        }
        max_wal = max_wal.max(std::fs::metadata(&wal).expect("wal").len());
    }
    // 100 frames before a checkpoint, plus one transaction: the bound.
    let bound = 32 + 110 * (4096 + 24);
    assert!(
        max_wal <= bound,
        "replica WAL reached {max_wal} bytes (bound {bound})"
    );
    assert!(pages(&reader) == pages(&p.primary));
}

/// Splits a captured page set into `parts` disjoint page sets that keep
/// the transaction's final database size, as the replicator's chunks do.
fn split(ps: &walrelay_vfs::PageSet, parts: usize) -> Vec<walrelay_vfs::PageSet> {
    let per = ps.len().div_ceil(parts);
    ps.pages()
        .chunks(per)
        .map(|c| {
            walrelay_vfs::PageSet::new(ps.page_size(), ps.db_size_pages(), c.to_vec())
                .expect("chunk")
        })
        .collect()
}

#[test]
fn a_chunked_transaction_stays_invisible_until_a_confirm_covers_its_last_chunk() {
    let p = pair();
    let mut r = open_replica(&p.replica_path).expect("open replica");
    let reader = open_vfs(&p.replica_path, OpenFlags::SQLITE_OPEN_READ_ONLY);
    p.primary
        .execute_batch("CREATE TABLE t(x INTEGER PRIMARY KEY, v BLOB)")
        .expect("create");
    p.primary
        .execute(
            "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM c WHERE i < 40) \
             INSERT INTO t(v) SELECT randomblob(3000) FROM c",
            [],
        )
        .expect("insert");
    let txns = p.rec.0.lock().expect("lock").clone();
    r.append(b(1), &txns[0].pages).expect("append schema");
    r.confirm(b(1)).expect("confirm schema");
    let chunks = split(&txns[1].pages, 3);
    assert_eq!(chunks.len(), 3);
    // Positions 2, 3, 4: the transaction's bookmark is its last chunk's.
    r.append_chunk(b(2), &chunks[0], false).expect("chunk 1");
    r.append_chunk(b(3), &chunks[1], false).expect("chunk 2");
    assert_eq!(r.last_appended(), b(3));
    r.confirm(b(3)).expect("a confirm inside the transaction");
    assert_eq!(r.confirmed(), b(1), "nothing of an unfinished transaction");
    assert_eq!(count(&reader), 0);
    assert_eq!(r.revealed_by(b(3)), b(1));
    r.append_chunk(b(4), &chunks[2], true).expect("last chunk");
    assert_eq!(r.revealed_by(b(4)), b(4));
    r.confirm(b(4)).expect("confirm the last chunk");
    assert_eq!(r.confirmed(), b(4));
    assert_eq!(count(&reader), 40, "the whole transaction at once");
    assert!(
        pages(&reader) == pages(&p.primary),
        "replica equals primary"
    );
}

#[test]
fn discarding_an_unfinished_chunked_transaction_leaves_the_confirmed_state() {
    let p = pair();
    let mut r = open_replica(&p.replica_path).expect("open replica");
    let reader = open_vfs(&p.replica_path, OpenFlags::SQLITE_OPEN_READ_ONLY);
    p.primary
        .execute_batch("CREATE TABLE t(x INTEGER PRIMARY KEY, v BLOB)")
        .expect("create");
    p.primary
        .execute(
            "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM c WHERE i < 20) \
             INSERT INTO t(v) SELECT randomblob(3000) FROM c",
            [],
        )
        .expect("insert");
    p.primary
        .execute("INSERT INTO t(v) VALUES (1)", [])
        .expect("insert one");
    let txns = p.rec.0.lock().expect("lock").clone();
    r.append(b(1), &txns[0].pages).expect("append schema");
    r.confirm(b(1)).expect("confirm schema");
    let chunks = split(&txns[1].pages, 2);
    r.append_chunk(b(2), &chunks[0], false).expect("chunk 1");
    r.discard_unconfirmed().expect("discard");
    assert_eq!(r.last_appended(), b(1));
    // The same transaction again, whole this time, then the next one.
    r.append_chunk(b(2), &chunks[0], false)
        .expect("chunk 1 again");
    r.append_chunk(b(3), &chunks[1], true).expect("chunk 2");
    r.append(b(4), &txns[2].pages).expect("next transaction");
    r.confirm(b(4)).expect("confirm");
    assert_eq!(count(&reader), 21);
    assert!(
        pages(&reader) == pages(&p.primary),
        "replica equals primary"
    );
}
