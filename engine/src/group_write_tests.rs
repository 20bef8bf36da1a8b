//! Group commit on a primary: writes queued behind a busy writer commit
//! together, and each one's outcome is what it would have been alone.
//! The harness is shared with [`crate::group_write_async`]'s tests.

use super::*;
use crate::{CancelToken, Constraint, Limits, Options, QueryResult};
use std::sync::Arc;

pub(crate) struct Fixture {
    _dir: tempfile::TempDir,
    pub(crate) db: Database,
}

pub(crate) fn open(limits: Limits) -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = Database::open(
        dir.path().join("g.db"),
        Options {
            limits,
            ..Options::default()
        },
    )
    .expect("open");
    Fixture { _dir: dir, db }
}

pub(crate) fn exec(db: &Database, sql: &str) -> QueryResult {
    db.session(Constraint::FirstPrimary)
        .expect("session")
        .prepare(sql)
        .run()
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

pub(crate) fn count(db: &Database, sql: &str) -> i64 {
    match exec(db, sql).results[0].values()[0] {
        Value::Integer(n) => n,
        ref v => panic!("not a count: {v:?}"),
    }
}

pub(crate) type Write = Box<dyn FnOnce(&Database) -> Result<QueryResult, QueryError> + Send>;

pub(crate) fn write(sql: &'static str, params: Vec<Value>) -> Write {
    Box::new(move |db| {
        db.session(Constraint::FirstPrimary)
            .expect("session")
            .prepare(sql)
            .bind(params)
            .run()
    })
}

/// Runs `writes` concurrently while the writer is held, so that the first
/// waits for the writer as leader and the rest queue behind it; then lets
/// the writer go. Outcomes in the order given.
pub(crate) fn grouped(db: &Database, writes: Vec<Write>) -> Vec<Result<QueryResult, QueryError>> {
    grouped_then(db, writes, || {})
}

/// [`grouped`], running `queued` once every write waits, before the
/// writer goes.
pub(crate) fn grouped_then(
    db: &Database,
    writes: Vec<Write>,
    queued: impl FnOnce(),
) -> Vec<Result<QueryResult, QueryError>> {
    let p = db.primary().expect("primary");
    let held = p.writer.lock();
    let n = writes.len();
    let mut handles = Vec::new();
    for (i, w) in writes.into_iter().enumerate() {
        let db2 = db.clone();
        handles.push(std::thread::spawn(move || w(&db2)));
        // The first leads (and waits for the writer); the others queue in
        // order.
        let t = Instant::now();
        while p
            .write_groups
            .as_ref()
            .expect("group commit")
            .queue
            .queued()
            < i
            || (i == 0 && t.elapsed().as_millis() < 50)
        {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "write {i} never queued"
            );
            std::thread::yield_now();
        }
    }
    assert_eq!(
        p.write_groups
            .as_ref()
            .expect("group commit")
            .queue
            .queued(),
        n - 1
    );
    queued();
    drop(held);
    handles
        .into_iter()
        .map(|h| h.join().expect("writer"))
        .collect()
}

pub(crate) fn ints(v: impl IntoIterator<Item = i64>) -> Vec<Vec<Value>> {
    v.into_iter().map(|i| vec![Value::Integer(i)]).collect()
}

#[test]
fn plain_dml_is_told_by_its_first_word_after_comments() {
    for sql in [
        "INSERT INTO t VALUES (1)",
        "  insert into t values (1)",
        "-- a note\nUPDATE t SET x = 1",
        "/* c */ DELETE FROM t",
        "replace into t values (1)",
    ] {
        assert!(is_plain_dml(sql), "{sql}");
    }
    for sql in [
        "BEGIN",
        "COMMIT",
        "SAVEPOINT a",
        "PRAGMA foreign_keys = ON",
        "CREATE TABLE x(a)",
        "WITH c AS (SELECT 1) INSERT INTO t SELECT * FROM c",
        "/* unterminated INSERT",
        "-- INSERT\n",
        "INSERTED",
        "",
    ] {
        assert!(!is_plain_dml(sql), "{sql}");
    }
}

#[test]
fn writes_queued_behind_a_busy_writer_commit_as_one_transaction_with_one_bookmark() {
    let f = open(Limits::default());
    exec(&f.db, "CREATE TABLE t(id INTEGER PRIMARY KEY, v INTEGER)");
    let before = f.db.latest_bookmark();
    let writes = ints(1..=8)
        .into_iter()
        .map(|p| write("INSERT INTO t(v) VALUES (?1)", p))
        .collect();
    let outs = grouped(&f.db, writes);
    let outs: Vec<QueryResult> = outs.into_iter().map(|o| o.expect("write")).collect();
    let bookmark = outs[0].meta.bookmark;
    assert!(outs.iter().all(|o| o.meta.bookmark == bookmark));
    assert_eq!(bookmark, before.next().expect("next"), "one transaction");
    assert_eq!(f.db.latest_bookmark(), bookmark);
    // Each write's own row id and change count, not the group's.
    for o in &outs {
        assert_eq!(o.meta.changes, 1);
        let id = o.meta.last_row_id;
        let v = count(&f.db, &format!("SELECT v FROM t WHERE id = {id}"));
        assert!((1..=8).contains(&v));
    }
    let mut ids: Vec<i64> = outs.iter().map(|o| o.meta.last_row_id).collect();
    ids.sort();
    assert_eq!(ids, (1..=8).collect::<Vec<_>>());
    let stats = f.db.group_commit_stats();
    assert_eq!(stats.groups, 1);
    assert_eq!(stats.grouped_writes, 8);
    assert_eq!(stats.rerun_alone, 0);
    // Counted by its size: the bucket of 8 writes, and no other.
    let mut sizes = [0; GROUP_SIZE_BOUNDS.len() + 1];
    sizes[size_bucket(8)] = 1;
    assert_eq!(stats.sizes, sizes);
    assert_eq!(GROUP_SIZE_BOUNDS[size_bucket(8)], 8);
}

#[test]
fn a_write_failing_in_a_group_fails_alone_and_the_others_commit() {
    let f = open(Limits::default());
    exec(&f.db, "CREATE TABLE u(k INTEGER PRIMARY KEY)");
    exec(&f.db, "INSERT INTO u VALUES (5)");
    let outs = grouped(
        &f.db,
        ints([1, 5, 2])
            .into_iter()
            .map(|p| write("INSERT INTO u VALUES (?1)", p))
            .collect(),
    );
    assert!(outs[0].is_ok() && outs[2].is_ok());
    let e = outs[1].as_ref().expect_err("duplicate key");
    assert!(e.to_string().contains("UNIQUE"), "{e}");
    assert_eq!(count(&f.db, "SELECT count(*) FROM u"), 3);
    let stats = f.db.group_commit_stats();
    assert_eq!(stats.rerun_alone, 1);
    // Run without savepoints first, then again with one each.
    assert_eq!(stats.guarded_retries, 1);
    assert_eq!(stats.groups, 1);
}

#[test]
fn an_or_fail_write_in_a_group_keeps_what_it_changed_before_failing_as_it_would_alone() {
    let f = open(Limits::default());
    exec(&f.db, "CREATE TABLE u(k INTEGER PRIMARY KEY)");
    exec(&f.db, "INSERT INTO u VALUES (3)");
    let outs = grouped(
        &f.db,
        vec![
            write("INSERT INTO u VALUES (100)", vec![]),
            // Rows 1 and 2 go in, 3 conflicts: alone, 1 and 2 stay.
            write(
                "INSERT OR FAIL INTO u SELECT value FROM json_each('[1,2,3,4]')",
                vec![],
            ),
            write("INSERT INTO u VALUES (101)", vec![]),
        ],
    );
    assert!(outs[0].is_ok() && outs[2].is_ok());
    assert!(outs[1].is_err());
    assert_eq!(count(&f.db, "SELECT count(*) FROM u WHERE k IN (1, 2)"), 2);
    assert_eq!(count(&f.db, "SELECT count(*) FROM u WHERE k = 4"), 0);
    assert_eq!(count(&f.db, "SELECT count(*) FROM u"), 5);
    assert_eq!(f.db.group_commit_stats().guarded_retries, 1);
}

#[test]
fn a_write_that_ends_the_whole_transaction_leaves_the_rest_of_its_group_committed() {
    let f = open(Limits::default());
    exec(&f.db, "CREATE TABLE t(v INTEGER)");
    exec(
        &f.db,
        "CREATE TRIGGER no_13 BEFORE INSERT ON t WHEN NEW.v = 13 \
         BEGIN SELECT RAISE(ROLLBACK, 'unlucky'); END",
    );
    let outs = grouped(
        &f.db,
        ints([1, 2, 13, 4])
            .into_iter()
            .map(|p| write("INSERT INTO t VALUES (?1)", p))
            .collect(),
    );
    let e = outs[2].as_ref().expect_err("rolled back");
    assert!(e.to_string().contains("unlucky"), "{e}");
    for i in [0, 1, 3] {
        assert!(outs[i].is_ok(), "{:?}", outs[i]);
    }
    assert_eq!(
        count(&f.db, "SELECT sum(v) FROM t"),
        7,
        "1, 2 and 4 committed"
    );
    assert_eq!(f.db.group_commit_stats().guarded_retries, 1);
}

#[test]
fn a_write_over_the_response_limit_in_a_group_changes_nothing_and_is_not_run_again() {
    let f = open(Limits {
        max_response_bytes: 1_000,
        ..Limits::default()
    });
    exec(&f.db, "CREATE TABLE t(v BLOB)");
    let outs = grouped(
        &f.db,
        vec![
            write("INSERT INTO t VALUES (x'01')", vec![]),
            write("INSERT INTO t VALUES (zeroblob(5000)) RETURNING v", vec![]),
            write("INSERT INTO t VALUES (x'02')", vec![]),
        ],
    );
    assert!(matches!(outs[1], Err(QueryError::ResponseTooLarge { .. })));
    assert!(outs[0].is_ok() && outs[2].is_ok());
    assert_eq!(count(&f.db, "SELECT count(*) FROM t"), 2);
    // Stopped in the group's first pass, it is settled there: the second
    // pass runs the other two in the group and not it.
    let stats = f.db.group_commit_stats();
    assert_eq!(stats.guarded_retries, 1);
    assert_eq!(stats.rerun_alone, 0);
    assert_eq!((stats.groups, stats.grouped_writes), (1, 2));
}

#[test]
fn a_write_stopped_by_its_time_limit_in_a_group_is_not_run_again_and_the_others_commit() {
    let f = open(Limits {
        query_timeout_ms: 200,
        ..Limits::default()
    });
    exec(&f.db, "CREATE TABLE t(v INTEGER)");
    let started = Instant::now();
    let outs = grouped(
        &f.db,
        vec![
            write("INSERT INTO t VALUES (1)", vec![]),
            write(
                "INSERT INTO t SELECT count(*) FROM (WITH RECURSIVE c(x) AS \
                 (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c)",
                vec![],
            ),
            write("INSERT INTO t VALUES (3)", vec![]),
        ],
    );
    assert!(
        matches!(outs[1], Err(QueryError::Timeout { .. })),
        "{:?}",
        outs[1]
    );
    assert!(outs[0].is_ok() && outs[2].is_ok());
    assert_eq!(count(&f.db, "SELECT sum(v) FROM t"), 4);
    let stats = f.db.group_commit_stats();
    assert_eq!(stats.guarded_retries, 1);
    assert_eq!((stats.rerun_alone, stats.grouped_writes), (0, 2));
    // It ran once: one time limit, not two (a bound, not a benchmark).
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn after_a_group_runs_again_with_savepoints_the_next_groups_start_with_them_then_stop() {
    let f = open(Limits::default());
    exec(&f.db, "CREATE TABLE u(k INTEGER PRIMARY KEY)");
    exec(&f.db, "INSERT INTO u VALUES (0)");
    // Each group: two new keys and one duplicate, which fails.
    let failing_group = |n: i64| -> Vec<Write> {
        ints([n, 0, n + 1])
            .into_iter()
            .map(|p| write("INSERT INTO u VALUES (?1)", p))
            .collect()
    };
    let retries = || f.db.group_commit_stats().guarded_retries;
    let mut key = 1;
    let mut run = |want_retries: u64| {
        let outs = grouped(&f.db, failing_group(key));
        key += 2;
        assert!(outs[0].is_ok() && outs[1].is_err() && outs[2].is_ok());
        assert_eq!(retries(), want_retries, "group of keys from {}", key - 2);
    };
    run(1);
    for _ in 0..GUARDED_AFTER_FAILURE {
        // Guarded from the start: nothing to run twice.
        run(1);
    }
    run(2);
    assert_eq!(count(&f.db, "SELECT count(*) FROM u"), key);
    let stats = f.db.group_commit_stats();
    assert_eq!(stats.groups, u64::from(GUARDED_AFTER_FAILURE) + 2);
    assert_eq!(stats.rerun_alone, stats.groups);
}

#[test]
fn a_group_over_the_transaction_size_limit_commits_each_write_alone() {
    let f = open(Limits {
        max_transaction_bytes: 6 * 4096,
        ..Limits::default()
    });
    exec(&f.db, "CREATE TABLE t(v BLOB)");
    let before = f.db.latest_bookmark();
    let outs = grouped(
        &f.db,
        (0..6)
            .map(|_| write("INSERT INTO t VALUES (zeroblob(3000))", vec![]))
            .collect(),
    );
    let mut bookmarks = Vec::new();
    for o in outs {
        bookmarks.push(o.expect("each fits alone").meta.bookmark);
    }
    bookmarks.sort();
    bookmarks.dedup();
    assert_eq!(bookmarks.len(), 6, "one transaction each");
    assert!(bookmarks[0] > before);
    assert_eq!(count(&f.db, "SELECT count(*) FROM t"), 6);
    assert_eq!(f.db.group_commit_stats().groups, 0);
}

#[test]
fn a_queued_write_cancelled_before_its_group_runs_changes_nothing() {
    let f = open(Limits::default());
    exec(&f.db, "CREATE TABLE t(v INTEGER)");
    let token = CancelToken::new();
    let t2 = token.clone();
    let cancelled: Write = Box::new(move |db| {
        db.session(Constraint::FirstPrimary)
            .expect("session")
            .cancel_with(t2)
            .prepare("INSERT INTO t VALUES (2)")
            .run()
    });
    let outs = grouped_then(
        &f.db,
        vec![
            write("INSERT INTO t VALUES (1)", vec![]),
            cancelled,
            write("INSERT INTO t VALUES (3)", vec![]),
        ],
        || token.cancel(),
    );
    assert!(outs[0].is_ok() && outs[2].is_ok());
    assert!(
        matches!(outs[1], Err(QueryError::Cancelled)),
        "{:?}",
        outs[1]
    );
    assert_eq!(count(&f.db, "SELECT sum(v) FROM t"), 4);
    // It never ran, so the others needed no second pass.
    assert_eq!(f.db.group_commit_stats().guarded_retries, 0);
}

#[test]
fn a_queued_write_waits_for_the_writer_at_most_its_pool_wait() {
    let f = open(Limits {
        pool_wait_ms: 100,
        ..Limits::default()
    });
    exec(&f.db, "CREATE TABLE t(v INTEGER)");
    let p = f.db.primary().expect("primary");
    let held = p.writer.lock();
    let db = Arc::new(f.db.clone());
    let writers: Vec<_> = (0..3)
        .map(|i| {
            let db = Arc::clone(&db);
            std::thread::spawn(move || {
                db.session(Constraint::FirstPrimary)
                    .expect("session")
                    .prepare("INSERT INTO t VALUES (?1)")
                    .bind([i])
                    .run()
            })
        })
        .collect();
    for w in writers {
        let e = w.join().expect("writer").expect_err("writer held");
        assert!(matches!(e, QueryError::Busy { .. }), "{e}");
    }
    drop(held);
    assert_eq!(count(&f.db, "SELECT count(*) FROM t"), 0);
    assert_eq!(
        p.write_groups
            .as_ref()
            .expect("group commit")
            .queue
            .queued(),
        0
    );
    // The queue is usable again.
    exec(&f.db, "INSERT INTO t VALUES (9)");
}

#[test]
fn writes_bringing_more_than_the_group_byte_budget_commit_in_several_groups() {
    let f = open(Limits::default());
    exec(&f.db, "CREATE TABLE t(v BLOB)");
    let blob = || {
        vec![Value::Blob(vec![
            7u8;
            (MAX_GROUP_BYTES / 2 - 1_000) as usize
        ])]
    };
    let outs = grouped(
        &f.db,
        (0..4)
            .map(|_| write("INSERT INTO t VALUES (?1)", blob()))
            .collect(),
    );
    for o in outs {
        o.expect("write");
    }
    let stats = f.db.group_commit_stats();
    assert_eq!((stats.groups, stats.grouped_writes), (2, 4), "two of two");
    assert_eq!(stats.sizes[size_bucket(2)], 2, "{:?}", stats.sizes);
    assert_eq!(count(&f.db, "SELECT count(*) FROM t"), 4);
}

#[test]
fn a_leader_waits_for_more_writes_only_while_enough_writes_wait_at_the_gate() {
    let g = WriteGroups::new(Duration::from_micros(300));
    assert_eq!(g.worth_waiting(), None, "a lone writer never waits");
    let mut at_gate: Vec<AtGate> = (0..GROUP_DELAY_SIBLINGS - 1)
        .map(|_| AtGate::enter(Some(&g)))
        .collect();
    assert_eq!(g.worth_waiting(), None);
    at_gate.push(AtGate::enter(Some(&g)));
    assert_eq!(
        g.worth_waiting(),
        Some(GROUP_DELAY_SIBLINGS),
        "{GROUP_DELAY_SIBLINGS} at the gate, waited for"
    );
    at_gate.clear();
    assert_eq!(g.worth_waiting(), None, "each one counted out as it leaves");

    let off = WriteGroups::new(Duration::ZERO);
    let _at_gate: Vec<AtGate> = (0..2 * GROUP_DELAY_SIBLINGS)
        .map(|_| AtGate::enter(Some(&off)))
        .collect();
    assert_eq!(off.worth_waiting(), None, "a delay of 0 never waits");
}

#[test]
fn a_group_commit_delay_past_the_bound_is_refused_at_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    let r = Database::open(
        dir.path().join("d.db"),
        Options {
            group_commit_delay_us: crate::MAX_GROUP_COMMIT_DELAY_US + 1,
            ..Options::default()
        },
    );
    assert!(matches!(r, Err(crate::OpenError::Options(_))));
}

#[test]
fn a_write_reports_its_own_inserted_row_id_and_zero_when_it_inserted_none() {
    let f = open(Limits::default());
    exec(&f.db, "CREATE TABLE t(id INTEGER PRIMARY KEY, v INTEGER)");
    let inserted = exec(&f.db, "INSERT INTO t(v) VALUES (7)");
    assert_eq!(inserted.meta.last_row_id, 1);
    // Another writer's insert is not reported by a later statement of the
    // shared writer connection that inserted nothing.
    for sql in [
        "UPDATE t SET v = 8",
        "DELETE FROM t WHERE v = 99",
        "CREATE TABLE u(a)",
    ] {
        assert_eq!(exec(&f.db, sql).meta.last_row_id, 0, "{sql}");
    }
    let batch =
        f.db.session(Constraint::FirstPrimary)
            .expect("session")
            .exec("UPDATE t SET v = 9; UPDATE t SET v = 10", [])
            .expect("batch");
    assert!(batch.iter().all(|r| r.meta.last_row_id == 0));
    assert_eq!(
        exec(&f.db, "INSERT INTO t(v) VALUES (8)").meta.last_row_id,
        2
    );
}

#[test]
fn a_group_counts_in_the_first_size_bucket_at_or_above_its_writes() {
    assert_eq!(size_bucket(2), 0);
    assert_eq!(GROUP_SIZE_BOUNDS[size_bucket(5)], 6);
    assert_eq!(GROUP_SIZE_BOUNDS[size_bucket(16)], 16);
    assert_eq!(GROUP_SIZE_BOUNDS[size_bucket(17)], 24);
    assert_eq!(size_bucket(49), GROUP_SIZE_BOUNDS.len(), "past the bounds");
    assert_eq!(size_bucket(MAX_GROUP as u64), GROUP_SIZE_BOUNDS.len());
}

#[test]
fn the_engines_cached_transaction_statements_give_a_user_of_the_same_text_what_a_fresh_writer_would()
 {
    let cached = open(Limits::default());
    let fresh = open(Limits::default());
    for f in [&cached, &fresh] {
        exec(&f.db, "CREATE TABLE t(v INTEGER)");
    }
    // A group with a failing write leaves BEGIN IMMEDIATE, SAVEPOINT,
    // RELEASE and COMMIT in the writer's statement cache (its second pass
    // runs each write in a savepoint); the other writer never ran one.
    let inserts = |range| -> Vec<Write> {
        ints(range)
            .into_iter()
            .map(|p| write("INSERT INTO t(v) VALUES (?1)", p))
            .collect()
    };
    let mut writes = inserts(1..=3);
    writes.push(write("INSERT INTO no_such_table VALUES (1)", vec![]));
    let outs = grouped(&cached.db, writes);
    assert!(outs[..3].iter().all(Result::is_ok) && outs[3].is_err());
    assert_eq!(cached.db.group_commit_stats().guarded_retries, 1);
    exec(&fresh.db, "INSERT INTO t(v) VALUES (1), (2), (3)");
    assert_eq!(cached.db.group_commit_stats().groups, 1);
    assert_eq!(fresh.db.group_commit_stats().groups, 0);
    let outcome = |f: &Fixture, sql: &str, in_batch: bool| -> String {
        let s = f.db.session(Constraint::FirstPrimary).expect("session");
        let r = if in_batch {
            s.batch([s.prepare("INSERT INTO t(v) VALUES (9)"), s.prepare(sql)])
                .map(drop)
        } else {
            s.prepare(sql).run().map(drop)
        };
        format!("{r:?} rows {}", count(&f.db, "SELECT count(*) FROM t"))
    };
    for sql in [
        "BEGIN IMMEDIATE",
        "SAVEPOINT walrelay_group",
        "RELEASE walrelay_group",
        "COMMIT",
    ] {
        for in_batch in [false, true] {
            let (c, f) = (
                outcome(&cached, sql, in_batch),
                outcome(&fresh, sql, in_batch),
            );
            assert_eq!(c, f, "{sql} (in a batch: {in_batch})");
        }
        // Alone, each is refused or fails: none leaves a transaction open.
        assert!(outcome(&cached, sql, false).starts_with("Err"), "{sql}");
    }
    // BEGIN and COMMIT are refused inside a batch.
    assert!(outcome(&cached, "COMMIT", true).starts_with("Err(Batch"));
    // The writer still groups, and commits what it groups.
    let before = count(&cached.db, "SELECT count(*) FROM t");
    assert!(
        grouped(&cached.db, inserts(4..=5))
            .iter()
            .all(Result::is_ok)
    );
    assert_eq!(count(&cached.db, "SELECT count(*) FROM t"), before + 2);
    assert_eq!(cached.db.group_commit_stats().groups, 2);
}
