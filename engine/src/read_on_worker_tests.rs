//! A short read on the calling thread, on a replica or a primary: the
//! same answer as the pool's, held at a primary's output gate as there,
//! and a decline (changing nothing) for everything else.

use super::*;
use crate::{Access, CancelToken, Constraint, Options, Replica, ReplicaOptions, pair};
use walrelay_replicator::{Epoch, Sequence};

struct Fixture {
    _dir: tempfile::TempDir,
    primary: Database,
    replica: Replica,
}

/// A primary paired with a replica (one reader), with rows 1 to 20.
fn open() -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let (primary, replica) = pair(
        dir.path().join("p.db"),
        dir.path().join("r.db"),
        Options::default(),
        ReplicaOptions {
            readers: 1,
            max_wait_ms: 100,
            ..ReplicaOptions::default()
        },
    )
    .expect("pair");
    let s = primary.session(Constraint::FirstPrimary).expect("session");
    s.exec("CREATE TABLE kv(id INTEGER PRIMARY KEY, v TEXT)", [])
        .expect("create");
    for id in 1..=20 {
        s.exec(
            "INSERT INTO kv VALUES (?1, ?2)",
            [Value::Integer(id), Value::Text(format!("v{id}"))],
        )
        .expect("insert");
    }
    Fixture {
        _dir: dir,
        primary,
        replica,
    }
}

const POINT: &str = "SELECT v FROM kv WHERE id = ?1";

fn point(db: &Database, at_least: Option<Bookmark>) -> Option<Output> {
    let held = db.read_without_thread(POINT, &[Value::Integer(7)], at_least, None)?;
    Some(released(db, held).expect("released"))
}

/// The point read run here, checked against the pool's answer.
fn here_as_on_the_pool(db: &Database) -> Output {
    let here = point(db, None).expect("run here");
    let pooled = db
        .execute(POINT, &[Value::Integer(7)], None, Access::ReadWrite, None)
        .expect("pool");
    assert_eq!(here.rows, pooled.rows);
    assert_eq!(here.columns, pooled.columns);
    assert_eq!(here.meta.bookmark, pooled.meta.bookmark);
    here
}

/// Writes, and several statements, are the threaded path's to route.
fn declines_writes_and_scripts(db: &Database) {
    assert!(
        db.read_without_thread("INSERT INTO kv VALUES (99, 'x')", &[], None, None)
            .is_none()
    );
    assert!(
        db.read_without_thread("SELECT 1; SELECT 2", &[], None, None)
            .is_none()
    );
}

/// A held read's result, released through the output gate.
fn released(db: &Database, held: HeldRead) -> Result<Output, QueryError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(held.release(db.clone()))
}

#[test]
fn a_point_read_on_a_replica_runs_here_and_answers_as_the_pool_does() {
    let f = open();
    let db = f.replica.database();
    let here = here_as_on_the_pool(db);
    assert_eq!(here.rows[0].values(), [Value::Text("v7".into())]);
    assert_eq!(here.meta.bookmark, f.primary.latest_bookmark());
    assert!(!here.meta.served_by_primary);
    assert_eq!(here.meta.rows_read, 1);
    // The reader went back to the pool: a second read runs here too.
    assert!(point(db, Some(here.meta.bookmark)).is_some());
}

#[test]
fn a_read_that_runs_past_its_budget_is_declined_and_runs_whole_on_the_pool() {
    let f = open();
    let db = f.replica.database();
    let long = "WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < 3000000) \
                SELECT count(*) FROM c";
    assert!(db.read_without_thread(long, &[], None, None).is_none());
    let pooled = db
        .execute(long, &[], None, Access::ReadWrite, None)
        .expect("the pool runs it whole");
    assert_eq!(pooled.rows[0].values(), [Value::Integer(3_000_000)]);
    assert!(point(db, None).is_some(), "the reader is free again");
    // Remembered: the next time it goes straight to the pool, without
    // spending the budget first.
    let r = &db.inner;
    assert!(r.long_reads.contains(r.long_reads.key(long)));
    assert!(!r.long_reads.contains(r.long_reads.key(POINT)));
}

#[test]
fn a_remembered_read_is_tried_here_again_now_and_then_and_forgotten_once_it_fits() {
    let f = open();
    let db = f.replica.database();
    let r = &db.inner;
    // As if its first run had been slow (a cold cache).
    let key = r.long_reads.key(POINT);
    r.long_reads.insert(key);
    // Tried here once in so many reads, and forgotten once it fits (a
    // retry that a busy machine made overrun waits for the next turn).
    let mut reads = 0;
    while r.long_reads.contains(key) {
        assert!(reads < 3 * LONG_READ_RETRY_EVERY, "never forgotten");
        let _ = point(db, None);
        reads += 1;
    }
    assert_eq!(reads % LONG_READ_RETRY_EVERY, 0, "{reads}");
    assert!(point(db, None).is_some());
}

#[test]
fn the_memory_of_long_reads_is_bounded_and_keeps_the_newest() {
    let reads = LongReads::default();
    let key = |i: usize| reads.key(&format!("SELECT {i}"));
    for i in 0..LONG_READ_SLOTS * 8 {
        reads.insert(key(i));
    }
    let remembered = (0..LONG_READ_SLOTS * 8)
        .filter(|&i| reads.contains(key(i)))
        .count();
    assert!(remembered <= LONG_READ_SLOTS, "{remembered}");
    // The newest is always remembered.
    assert!(reads.contains(key(LONG_READ_SLOTS * 8 - 1)));
}

#[test]
fn a_read_of_few_costly_instructions_is_stopped_by_its_budget_too() {
    let f = open();
    let db = f.replica.database();
    // About 60 instructions, each column generating 2 MB: never a
    // thousand instructions, but far past the budget.
    let costly = format!(
        "SELECT {}",
        vec!["length(randomblob(2000000))"; 20].join(", ")
    );
    assert!(db.read_without_thread(&costly, &[], None, None).is_none());
    let r = &db.inner;
    assert!(
        r.long_reads.contains(r.long_reads.key(&costly)),
        "stopped by the budget"
    );
    let pooled = db
        .execute(&costly, &[], None, Access::ReadWrite, None)
        .expect("the pool runs it whole");
    assert_eq!(pooled.rows[0].values()[19], Value::Integer(2_000_000));
}

#[test]
fn what_would_wait_write_or_fail_is_declined() {
    let f = open();
    let db = f.replica.database();
    let one = [Value::Integer(1)];
    declines_writes_and_scripts(db);
    // A bookmark this replica has not reached would wait for it.
    let ahead = Bookmark::new(Epoch(u32::MAX), Sequence(1));
    assert!(point(db, Some(ahead)).is_none());
    // Errors are the threaded path's to give.
    assert!(
        db.read_without_thread("SELECT nope FROM kv", &[], None, None)
            .is_none()
    );
    assert!(db.read_without_thread(POINT, &[], None, None).is_none());
    // A cancelled request.
    let cancelled = CancelToken::new();
    cancelled.cancel();
    assert!(
        db.read_without_thread(POINT, &one, None, Some(&cancelled))
            .is_none()
    );
    // Every reader busy.
    let held = db
        .inner
        .readers
        .try_take()
        .expect("take")
        .expect("a reader");
    assert!(point(db, None).is_none());
    drop(held);
    assert!(point(db, None).is_some());
    // A result larger than a few rows is the pool's to give (its JSON
    // would cost the worker more than the read).
    let big = "SELECT zeroblob(100000)";
    assert!(db.read_without_thread(big, &[], None, None).is_none());
    let pooled = db
        .execute(big, &[], None, Access::ReadWrite, None)
        .expect("the pool gives it");
    assert_eq!(pooled.rows.len(), 1);
}

#[test]
fn no_reader_is_opened_on_the_calling_thread() {
    let f = open();
    let db = f.replica.database();
    // The pool may open up to 1 reader and has one, idle: lent out, and
    // none is idle, so the read declines rather than open another.
    let held = db.inner.readers.try_take_idle().expect("the idle reader");
    assert!(db.inner.readers.try_take_idle().is_none());
    assert!(point(db, None).is_none());
    drop(held);
    assert!(point(db, None).is_some());
}

#[test]
fn a_discarded_reader_is_replaced_by_a_new_one() {
    let f = open();
    let db = f.replica.database();
    db.inner.readers.try_take_idle().expect("idle").discard();
    assert!(
        db.inner.readers.try_take_idle().is_none(),
        "closed, not idle"
    );
    let pooled = db
        .execute(POINT, &[Value::Integer(7)], None, Access::ReadWrite, None)
        .expect("the pool opens another");
    assert_eq!(pooled.rows[0].values(), [Value::Text("v7".into())]);
    assert!(point(db, None).is_some(), "and it is idle again after");
}

#[test]
fn a_statement_that_opens_a_transaction_is_declined_and_leaves_none_open() {
    let f = open();
    let db = f.replica.database();
    assert!(db.read_without_thread("BEGIN", &[], None, None).is_none());
    let after = point(db, None).expect("runs here");
    assert_eq!(after.rows[0].values(), [Value::Text("v7".into())]);
    // A newer commit is seen: the reader is not stuck in an old snapshot.
    f.primary
        .session(Constraint::FirstPrimary)
        .expect("session")
        .exec("UPDATE kv SET v = 'new' WHERE id = 7", [])
        .expect("update");
    let newer = point(db, None).expect("runs here");
    assert_eq!(newer.rows[0].values(), [Value::Text("new".into())]);
}

#[test]
fn a_point_read_on_a_primary_runs_here_and_answers_as_the_pool_does() {
    let f = open();
    let db = &f.primary;
    let here = here_as_on_the_pool(db);
    assert_eq!(here.meta.bookmark, db.latest_bookmark());
    assert!(here.meta.served_by_primary);
    assert_eq!(here.meta.rows_read, 1);
    declines_writes_and_scripts(db);
}

/// A sink that holds each commit's hand-off until the test lets it go.
#[derive(Default)]
struct HeldSink {
    handing_off: std::sync::atomic::AtomicBool,
    go: parking_lot::Mutex<bool>,
    changed: parking_lot::Condvar,
}

impl crate::TransactionSink for HeldSink {
    fn committed(
        &self,
        _: Bookmark,
        _: &walrelay_vfs::CapturedTransaction,
    ) -> Result<(), crate::ShipError> {
        self.handing_off
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let mut go = self.go.lock();
        while !*go {
            self.changed.wait(&mut go);
        }
        Ok(())
    }
}

#[test]
fn a_primary_read_ending_while_a_commit_is_in_hand_off_waits_for_it_and_takes_its_bookmark() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sink = std::sync::Arc::new(HeldSink::default());
    *sink.go.lock() = true;
    let db = Database::open(
        dir.path().join("p.db"),
        Options {
            sink: Some(sink.clone()),
            ..Options::default()
        },
    )
    .expect("open");
    let s = db.session(Constraint::FirstPrimary).expect("session");
    s.exec("CREATE TABLE kv(id INTEGER PRIMARY KEY, v TEXT)", [])
        .expect("create");
    s.exec("INSERT INTO kv VALUES (7, 'v7')", [])
        .expect("insert");
    let before = db.latest_bookmark();
    let here = point(&db, None).expect("nothing in flight: runs here");
    assert_eq!(here.meta.bookmark, before);
    // The next commit's frame is in the WAL (a read may see it) but the
    // replicator does not have it yet: it has no bookmark to wait for.
    *sink.go.lock() = false;
    sink.handing_off
        .store(false, std::sync::atomic::Ordering::SeqCst);
    let writer = std::thread::spawn({
        let db = db.clone();
        move || {
            db.session(Constraint::FirstPrimary)
                .expect("session")
                .exec("UPDATE kv SET v = 'new' WHERE id = 7", [])
                .expect("update")
        }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !sink.handing_off.load(std::sync::atomic::Ordering::SeqCst) {
        assert!(std::time::Instant::now() < deadline, "never handed off");
        std::thread::sleep(Duration::from_millis(1));
    }
    let held = db
        .read_without_thread(POINT, &[Value::Integer(7)], None, None)
        .expect("runs here");
    let release = std::thread::spawn({
        let db = db.clone();
        move || released(&db, held)
    });
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        !release.is_finished(),
        "answered before the hand-off settled"
    );
    *sink.go.lock() = true;
    sink.changed.notify_all();
    writer.join().expect("writer");
    let out = release.join().expect("release").expect("released");
    // Whatever it saw of the update, its bookmark covers it.
    assert!(out.meta.bookmark > before);
    assert_eq!(out.meta.bookmark, db.latest_bookmark());
}
