//! Writes waited for by tasks meet the same group commit as threaded
//! ones, with the same outcomes; what cannot skip the thread is declined.

use crate::group_write::tests::{Fixture, Write, count, exec, grouped, ints, open, write};
use crate::{CancelToken, Limits, QueryResult, Value};
use std::time::{Duration, Instant};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime")
}

/// A write that a task waits for (it must be taken, not declined).
fn task_write(sql: &'static str, params: Vec<Value>) -> Write {
    Box::new(move |db| {
        let write = db
            .write_without_thread(sql, &params, crate::Access::ReadWrite, None)
            .unwrap_or_else(|| panic!("{sql} was declined"));
        runtime().block_on(write).map(|o| QueryResult {
            results: o.rows,
            meta: o.meta,
        })
    })
}

fn declined(f: &Fixture, sql: &str, access: crate::Access) -> bool {
    f.db.write_without_thread(sql, &[], access, None).is_none()
}

#[test]
fn writes_waited_for_by_tasks_commit_in_one_group_with_threaded_writes() {
    let f = open(Limits::default());
    exec(&f.db, "CREATE TABLE t(id INTEGER PRIMARY KEY, v INTEGER)");
    let before = f.db.latest_bookmark();
    let writes: Vec<Write> = ints(1..=6)
        .into_iter()
        .enumerate()
        .map(|(i, p)| match i % 2 {
            0 => write("INSERT INTO t(v) VALUES (?1)", p),
            _ => task_write("INSERT INTO t(v) VALUES (?1)", p),
        })
        .collect();
    let outs: Vec<QueryResult> = grouped(&f.db, writes)
        .into_iter()
        .map(|o| o.expect("write"))
        .collect();
    let bookmark = before.next().expect("next");
    assert!(
        outs.iter().all(|o| o.meta.bookmark == bookmark),
        "one transaction"
    );
    let mut ids: Vec<i64> = outs.iter().map(|o| o.meta.last_row_id).collect();
    ids.sort();
    assert_eq!(ids, (1..=6).collect::<Vec<_>>(), "each write's own row id");
    let stats = f.db.group_commit_stats();
    assert_eq!((stats.groups, stats.grouped_writes), (1, 6));
}

#[test]
fn a_task_whose_write_fails_in_a_group_gets_the_error_it_would_get_alone() {
    let f = open(Limits::default());
    exec(&f.db, "CREATE TABLE u(k INTEGER PRIMARY KEY)");
    exec(&f.db, "INSERT INTO u VALUES (5)");
    let outs = grouped(
        &f.db,
        vec![
            write("INSERT INTO u VALUES (?1)", vec![Value::Integer(1)]),
            task_write("INSERT INTO u VALUES (?1)", vec![Value::Integer(5)]),
            task_write("INSERT INTO nowhere VALUES (?1)", vec![Value::Integer(6)]),
            task_write("INSERT INTO u VALUES (?1)", vec![Value::Integer(2)]),
        ],
    );
    assert!(outs[0].is_ok() && outs[3].is_ok());
    let e = outs[1].as_ref().expect_err("duplicate key");
    assert!(e.to_string().contains("UNIQUE"), "{e}");
    let e = outs[2].as_ref().expect_err("no such table");
    assert!(e.to_string().contains("no such table"), "{e}");
    assert_eq!(count(&f.db, "SELECT count(*) FROM u"), 3);
}

#[test]
fn a_task_that_finds_no_leader_leads_its_group_on_a_blocking_thread() {
    let f = open(Limits::default());
    exec(&f.db, "CREATE TABLE t(v INTEGER)");
    let out = task_write("INSERT INTO t VALUES (7)", vec![])(&f.db).expect("write");
    assert_eq!(out.meta.changes, 1);
    assert_eq!(out.meta.bookmark, f.db.latest_bookmark());
    assert_eq!(count(&f.db, "SELECT sum(v) FROM t"), 7);
}

#[test]
fn a_lone_write_over_the_calling_threads_budget_runs_once_on_a_blocking_thread_and_goes_there_after()
 {
    let f = open(Limits::default());
    exec(&f.db, "CREATE TABLE t(v INTEGER)");
    // Pure VM work, far over the budget; one row written.
    const SLOW: &str = "INSERT INTO t SELECT count(*) FROM (WITH RECURSIVE c(x) AS \
                        (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 300000) \
                        SELECT x FROM c)";
    let long = &f.db.inner.long_reads;
    let key = long.key(SLOW);
    assert!(!long.contains(key));
    let first = f.db.latest_bookmark();
    let out = task_write(SLOW, vec![])(&f.db).expect("write");
    assert_eq!(out.meta.changes, 1);
    // Stopped here, rolled back, run again on the pool: committed once.
    assert_eq!(out.meta.bookmark, first.next().expect("next"));
    assert_eq!(count(&f.db, "SELECT count(*) FROM t"), 1);
    assert_eq!(count(&f.db, "SELECT sum(v) FROM t"), 300_000);
    assert!(long.contains(key), "remembered as over the budget");
    // Remembered: the next one goes straight to the pool, with the same
    // outcome; a short write still runs here and is not remembered.
    task_write(SLOW, vec![])(&f.db).expect("write");
    task_write("INSERT INTO t VALUES (1)", vec![])(&f.db).expect("write");
    assert_eq!(count(&f.db, "SELECT count(*) FROM t"), 3);
    assert!(!long.contains(long.key("INSERT INTO t VALUES (1)")));
    assert_eq!(
        f.db.latest_bookmark(),
        first
            .next()
            .and_then(|b| b.next())
            .and_then(|b| b.next())
            .expect("three")
    );
}

#[test]
fn what_must_run_on_a_thread_is_declined_and_changes_nothing() {
    let f = open(Limits::default());
    exec(&f.db, "CREATE TABLE t(v INTEGER)");
    let before = f.db.latest_bookmark();
    let rw = crate::Access::ReadWrite;
    assert!(declined(&f, "SELECT 1", rw));
    assert!(declined(&f, "CREATE TABLE x(a)", rw));
    assert!(declined(&f, "BEGIN", rw));
    assert!(declined(
        &f,
        "INSERT INTO t VALUES (1); INSERT INTO t VALUES (2)",
        rw
    ));
    assert!(declined(
        &f,
        "INSERT INTO t VALUES (1)",
        crate::Access::ReadOnly
    ));
    let cancelled = CancelToken::new();
    cancelled.cancel();
    assert!(
        f.db.write_without_thread("INSERT INTO t VALUES (1)", &[], rw, Some(&cancelled))
            .is_none()
    );
    assert_eq!(f.db.latest_bookmark(), before);
    assert_eq!(count(&f.db, "SELECT count(*) FROM t"), 0);
}

#[test]
fn a_task_dropped_while_queued_never_runs_its_write_and_does_not_stall_the_queue() {
    let f = open(Limits::default());
    exec(&f.db, "CREATE TABLE t(v INTEGER)");
    let p = f.db.primary().expect("primary");
    let queue = &p.write_groups.as_ref().expect("group commit").queue;
    let held = p.writer.lock();
    // A thread leads and waits for the writer.
    let db = f.db.clone();
    let leader = std::thread::spawn(move || exec(&db, "INSERT INTO t VALUES (1)"));
    let t = Instant::now();
    while !queue.leading() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the thread never led"
        );
        std::thread::yield_now();
    }
    let write =
        f.db.write_without_thread(
            "INSERT INTO t VALUES (100)",
            &[],
            crate::Access::ReadWrite,
            None,
        )
        .expect("taken");
    assert_eq!(queue.queued(), 1);
    drop(write);
    assert_eq!(queue.queued(), 0, "a dropped task leaves the queue");
    drop(held);
    leader.join().expect("leader");
    assert_eq!(
        count(&f.db, "SELECT sum(v) FROM t"),
        1,
        "the dropped write never ran"
    );
    // The queue still works: a task and a thread write after it.
    let t = Instant::now();
    task_write("INSERT INTO t VALUES (10)", vec![])(&f.db).expect("write");
    exec(&f.db, "INSERT INTO t VALUES (20)");
    assert!(t.elapsed() < Duration::from_secs(5));
    assert_eq!(count(&f.db, "SELECT sum(v) FROM t"), 31);
}
