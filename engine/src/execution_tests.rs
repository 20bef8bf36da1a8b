//! The watch stops what runs, and never reports what ended as stopped.

use super::*;

fn connection() -> (rusqlite::Connection, Arc<Watch>) {
    let mut conn = rusqlite::Connection::open_in_memory().expect("open");
    conn.execute_batch("CREATE TABLE t(v INTEGER)")
        .expect("table");
    let watch = Watch::new(Arc::new(AtomicBool::new(false)));
    watch.install(&mut conn).expect("install");
    (conn, watch)
}

fn rows(conn: &rusqlite::Connection) -> i64 {
    conn.query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .expect("count")
}

#[test]
fn an_autocommit_write_stopped_by_the_watch_changed_nothing_and_one_that_committed_is_not_stopped()
{
    let (conn, watch) = connection();
    let mut stopped = 0;
    let mut committed = 0;
    // One row, by programs of every length around the handler's
    // interval (`random()` is not factored out as a constant): SQLite also
    // calls the handler as a statement returns, after its commit.
    // Several rows, by a loop, which the handler is called inside.
    let one_row = (1..=40_i64).map(|n| {
        let terms: Vec<&str> = (0..n).map(|_| "random() * 0").collect();
        (format!("INSERT INTO t VALUES ({})", terms.join(" + ")), 1)
    });
    let rows_by_loop = (1..=40_i64).map(|n| {
        let values: Vec<String> = (0..n).map(|i| format!("({i})")).collect();
        (format!("INSERT INTO t VALUES {}", values.join(",")), n)
    });
    for (sql, n) in one_row.chain(rows_by_loop) {
        let before = rows(&conn);
        let r = {
            // A budget already spent: the handler fires at its first call.
            let _armed = watch.arm_budget(Some(Duration::from_nanos(1)), 60_000, None);
            std::thread::sleep(Duration::from_micros(50));
            conn.execute(&sql, [])
        };
        let after = rows(&conn);
        match r {
            Ok(changed) => {
                assert_eq!(changed as i64, n);
                assert_eq!(after, before + n, "{sql}");
                committed += 1;
            }
            Err(e) => {
                assert_eq!(
                    e.sqlite_error_code(),
                    Some(rusqlite::ErrorCode::OperationInterrupted),
                    "{e}"
                );
                assert!(watch.over_budget());
                assert_eq!(after, before, "stopped, yet it changed the table: {sql}");
                stopped += 1;
            }
        }
    }
    // Both happened: short programs end before the handler's first call.
    assert!(
        stopped > 0 && committed > 0,
        "{stopped} stopped, {committed} committed"
    );
}

#[test]
fn a_running_statement_with_no_transaction_is_still_stopped_by_its_budget() {
    let (conn, watch) = connection();
    let _armed = watch.arm_budget(Some(Duration::from_millis(5)), 60_000, None);
    let r: rusqlite::Result<i64> = conn.query_row(
        "SELECT count(*) FROM (WITH RECURSIVE c(x) AS \
         (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c)",
        [],
        |r| r.get(0),
    );
    assert!(r.is_err(), "an endless computation must be stopped");
    assert!(watch.over_budget());
}
