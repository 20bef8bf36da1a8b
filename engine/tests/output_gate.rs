//! The output gate, with a gate this test controls: results wait for
//! their confirmation while later writes keep committing (pipelining);
//! reads wait for the state they saw; a gate that gives up turns into a
//! typed error; a write the gate does not admit never runs.

mod common;

use common::gate::Gate;
use std::sync::Arc;
use std::time::Duration;
use walrelay_engine::{
    Bookmark, CommitGate, Constraint, Database, Options, QueryError, TransactionSink,
};

fn open(gate: &Arc<Gate>) -> (tempfile::TempDir, Database) {
    open_with(gate, false)
}

fn open_with(gate: &Arc<Gate>, group_commit: bool) -> (tempfile::TempDir, Database) {
    let dir = tempfile::tempdir().expect("dir");
    let db = Database::open(
        dir.path().join("g.db"),
        Options {
            sink: Some(Arc::clone(gate) as Arc<dyn TransactionSink>),
            gate: Some(Arc::clone(gate) as Arc<dyn CommitGate>),
            // Most of these tests count transactions, one per write:
            // group commit would merge concurrent writes into fewer.
            group_commit,
            ..Options::default()
        },
    )
    .expect("open");
    (dir, db)
}

/// `CREATE TABLE t(x)`, committed and confirmed (the first bookmark).
fn create_confirmed(gate: &Gate, db: &Database) {
    let setup = std::thread::spawn({
        let db = db.clone();
        move || {
            db.session(Constraint::FirstPrimary)
                .expect("session")
                .prepare("CREATE TABLE t(x)")
                .run()
                .expect("create")
        }
    });
    common::wait_until("create committed", Duration::from_secs(10), || {
        gate.committed().len() == 1
    });
    gate.release(Bookmark::new(db.epoch(), walrelay_engine::Sequence(1)));
    setup.join().expect("create");
}

/// Writes committed after `create_confirmed`'s, however group commit
/// merged them: each group's writes, and one per other transaction.
fn writes_committed(gate: &Gate, db: &Database) -> u64 {
    let transactions = gate.committed().len() as u64 - 1;
    let stats = db.group_commit_stats();
    stats.grouped_writes + (transactions - stats.groups)
}

/// One writer thread per value, each inserting it into `t`; each answers
/// with its write's bookmark.
fn insert_each(
    db: &Database,
    values: std::ops::Range<i64>,
) -> Vec<std::thread::JoinHandle<Result<Bookmark, walrelay_engine::QueryError>>> {
    values
        .map(|i| {
            let db = db.clone();
            std::thread::spawn(move || {
                db.session(Constraint::FirstPrimary)
                    .expect("session")
                    .prepare("INSERT INTO t VALUES (?1)")
                    .bind([i])
                    .run()
                    .map(|r| r.meta.bookmark)
            })
        })
        .collect()
}

#[test]
fn results_wait_for_confirmation_while_later_writes_keep_committing() {
    let gate = Arc::new(Gate::default());
    let (_dir, db) = open(&gate);
    let epoch = db.epoch();
    let at = |s| Bookmark::new(epoch, walrelay_engine::Sequence(s));
    create_confirmed(&gate, &db);

    // Three writers: each commits, then its result waits at the gate.
    let writers = insert_each(&db, 0..3);
    // All three commit although none is confirmed: pipelining.
    common::wait_until(
        "three commits behind the gate",
        Duration::from_secs(10),
        || gate.committed().len() == 4,
    );
    assert!(
        writers.iter().all(|w| !w.is_finished()),
        "a result escaped the gate"
    );

    // A read on the primary sees those rows, so it waits too.
    let reader = std::thread::spawn({
        let db = db.clone();
        move || {
            db.session(Constraint::FirstPrimary)
                .expect("session")
                .prepare("SELECT count(*) AS n FROM t")
                .first()
                .map(|r| r.and_then(|r| r.get("n").and_then(|v| v.as_i64())))
        }
    });
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        !reader.is_finished(),
        "a read saw unconfirmed rows and returned"
    );

    gate.release(at(4));
    for w in writers {
        let b = w.join().expect("writer").expect("confirmed write");
        assert!(b <= at(4));
    }
    assert_eq!(reader.join().expect("reader").expect("read"), Some(3));
}

#[test]
fn writes_committed_together_by_group_commit_all_wait_at_the_gate_and_count_there_until_confirmed()
{
    let gate = Arc::new(Gate::default());
    let (_dir, db) = open_with(&gate, true);
    create_confirmed(&gate, &db);

    let writers = insert_each(&db, 0..8);
    // However they were grouped, every write commits (8 rows in at most
    // 8 transactions) and none answers before its bookmark is confirmed.
    common::wait_until("every write committed", Duration::from_secs(10), || {
        writes_committed(&gate, &db) >= 8
    });
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        writers.iter().all(|w| !w.is_finished()),
        "a result escaped the gate"
    );
    // Every one of them counts as at the gate, a group's members handed
    // back quietly included: the next leader's delay is judged by them.
    assert_eq!(db.group_commit_stats().at_gate, 8);
    let last = *gate.committed().last().expect("commits");
    gate.release(last);
    let mut bookmarks: Vec<Bookmark> = writers
        .into_iter()
        .map(|w| w.join().expect("writer").expect("confirmed write"))
        .collect();
    assert_eq!(db.group_commit_stats().at_gate, 0, "each counted out");
    assert!(bookmarks.iter().all(|&b| b <= last));
    bookmarks.sort();
    bookmarks.dedup();
    assert_eq!(
        bookmarks.len(),
        gate.committed().len() - 1,
        "one per transaction"
    );
}

#[test]
fn a_gate_that_gives_up_is_a_typed_error_and_an_unadmitted_write_never_runs() {
    let gate = Arc::new(Gate::default());
    let (_dir, db) = open(&gate);
    *gate.give_up.lock() = true;
    let s = db.session(Constraint::FirstPrimary).expect("session");
    let err = s
        .prepare("CREATE TABLE t(x)")
        .run()
        .expect_err("not confirmed");
    assert!(matches!(err, QueryError::NotConfirmed { .. }), "{err}");
    // It did commit locally (the ambiguous outcome the error describes).
    assert_eq!(gate.committed().len(), 1);

    *gate.closed.lock() = true;
    let err = s
        .prepare("INSERT INTO t VALUES (1)")
        .run()
        .expect_err("not admitted");
    assert!(matches!(err, QueryError::WriteNotAdmitted { .. }), "{err}");
    assert_eq!(gate.committed().len(), 1, "an unadmitted write ran");
}

/// Commits `t`'s schema, confirmed; returns the bookmark maker.
fn confirmed_schema(gate: &Gate, db: &Database, sql: &'static str) -> impl Fn(u64) -> Bookmark {
    let epoch = db.epoch();
    let at = move |s| Bookmark::new(epoch, walrelay_engine::Sequence(s));
    let setup = std::thread::spawn({
        let db = db.clone();
        move || {
            db.session(Constraint::FirstPrimary)
                .expect("session")
                .prepare(sql)
                .run()
                .expect("create")
        }
    });
    common::wait_until("schema committed", Duration::from_secs(10), || {
        gate.committed().len() == 1
    });
    gate.release(at(1));
    setup.join().expect("create");
    at
}

/// Commits one row (`sql`) whose result waits at the gate, unconfirmed.
fn unconfirmed_write(
    gate: &Gate,
    db: &Database,
    sql: &'static str,
) -> std::thread::JoinHandle<Result<walrelay_engine::QueryResult, QueryError>> {
    let before = gate.committed().len();
    let h = std::thread::spawn({
        let db = db.clone();
        move || {
            db.session(Constraint::FirstPrimary)
                .expect("session")
                .prepare(sql)
                .run()
        }
    });
    common::wait_until("the row committed", Duration::from_secs(10), || {
        gate.committed().len() == before + 1
    });
    h
}

#[test]
fn a_write_failing_on_an_unconfirmed_row_answers_only_once_that_row_is_confirmed() {
    let gate = Arc::new(Gate::default());
    let (_dir, db) = open(&gate);
    let at = confirmed_schema(&gate, &db, "CREATE TABLE t(x UNIQUE)");
    let first = unconfirmed_write(&gate, &db, "INSERT INTO t VALUES (1)");
    // The duplicate fails against the unconfirmed row: the failure itself
    // says the row exists, so it must wait like the row's own result.
    let dup = std::thread::spawn({
        let db = db.clone();
        move || {
            db.session(Constraint::FirstPrimary)
                .expect("session")
                .prepare("INSERT INTO t VALUES (1)")
                .run()
        }
    });
    std::thread::sleep(Duration::from_millis(200));
    assert!(!dup.is_finished(), "the error escaped before confirmation");
    gate.release(at(2));
    let e = dup.join().expect("thread").expect_err("a UNIQUE violation");
    assert!(e.to_string().contains("UNIQUE"), "{e}");
    first.join().expect("thread").expect("the first insert");
}

#[test]
fn a_read_whose_error_is_built_from_unconfirmed_rows_answers_only_once_they_are_confirmed() {
    let gate = Arc::new(Gate::default());
    let (_dir, db) = open(&gate);
    let at = confirmed_schema(&gate, &db, "CREATE TABLE t(v TEXT)");
    let first = unconfirmed_write(&gate, &db, "INSERT INTO t VALUES ('not json')");
    // The error message comes from the unconfirmed row.
    let read = std::thread::spawn({
        let db = db.clone();
        move || {
            db.session(Constraint::FirstUnconstrained)
                .expect("session")
                .prepare("SELECT json((SELECT v FROM t))")
                .all()
        }
    });
    std::thread::sleep(Duration::from_millis(200));
    assert!(!read.is_finished(), "the error escaped before confirmation");
    gate.release(at(2));
    let e = read.join().expect("thread").expect_err("malformed JSON");
    assert!(e.to_string().contains("JSON"), "{e}");
    first.join().expect("thread").expect("the insert");
}

/// An HTTP server for `db` as a primary, and its query URL.
fn serve_primary(db: &Database) -> (walrelay_engine::http::server::HttpServer, String) {
    use walrelay_engine::http::server::{HttpConfig, Node, Role, serve};
    let node = Node::new(
        Role::Primary(db.clone()),
        HttpConfig::default(),
        walrelay_engine::http::auth::Auth::Insecure,
    );
    let server = serve(
        Arc::new(node),
        std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
    )
    .expect("serve");
    let url = format!("{}/v1/databases/main/query", server.url());
    (server, url)
}

/// `INSERT INTO t VALUES (i)` over HTTP on a thread: the answer's bookmark.
fn insert_over_http(url: &str, i: i64) -> std::thread::JoinHandle<Bookmark> {
    let url = url.to_string();
    std::thread::spawn(move || {
        let body = format!(r#"{{"sql": "INSERT INTO t VALUES (?1)", "params": [{i}]}}"#);
        let mut resp = ureq::post(&url)
            .header("content-type", "application/json")
            .send(body)
            .expect("an answer");
        let text = resp.body_mut().read_to_string().expect("body");
        let json: serde_json::Value = serde_json::from_str(&text).expect("json");
        json["result"][0]["meta"]["bookmark"]
            .as_str()
            .expect("a bookmark")
            .parse::<Bookmark>()
            .expect("bookmark")
    })
}

#[test]
fn a_lone_write_over_http_is_led_by_its_task_and_answers_only_once_confirmed() {
    let gate = Arc::new(Gate::default());
    let (_dir, db) = open_with(&gate, true);
    create_confirmed(&gate, &db);
    let (_server, url) = serve_primary(&db);
    let writer = insert_over_http(&url, 1);
    common::wait_until("the write committed", Duration::from_secs(10), || {
        writes_committed(&gate, &db) >= 1
    });
    // Its task, not a blocking thread, asked to be woken at the
    // confirmation.
    common::wait_until(
        "a wake-up left with the gate",
        Duration::from_secs(10),
        || !gate.calls.lock().is_empty(),
    );
    assert!(!writer.is_finished(), "an answer escaped the gate");
    let last = *gate.committed().last().expect("commits");
    gate.release(last);
    assert_eq!(writer.join().expect("writer"), last);
}

#[test]
fn a_write_led_on_a_blocking_thread_leaves_its_confirmation_wait_to_its_task() {
    let gate = Arc::new(Gate::default());
    let (_dir, db) = open_with(&gate, true);
    create_confirmed(&gate, &db);
    let (_server, url) = serve_primary(&db);
    // The first write waits at the gate, so the second does not find the
    // writer quiet: it leads on a blocking thread.
    let first = insert_over_http(&url, 1);
    common::wait_until("the first write committed", Duration::from_secs(10), || {
        writes_committed(&gate, &db) >= 1
    });
    let second = insert_over_http(&url, 2);
    common::wait_until(
        "the second write committed",
        Duration::from_secs(10),
        || writes_committed(&gate, &db) >= 2,
    );
    let last = *gate.committed().last().expect("commits");
    // Its task, not the thread that led it, left a wake-up with the gate
    // for the second write's bookmark.
    common::wait_until(
        "a wake-up for the second write",
        Duration::from_secs(10),
        || gate.calls.lock().iter().any(|(b, _)| *b == last),
    );
    std::thread::sleep(Duration::from_millis(20));
    assert!(
        !first.is_finished() && !second.is_finished(),
        "an answer escaped the gate"
    );
    gate.release(last);
    assert!(first.join().expect("first") < last);
    assert_eq!(second.join().expect("second"), last);
    common::wait_until("each counted out", Duration::from_secs(10), || {
        db.group_commit_stats().at_gate == 0
    });
}

#[test]
fn writes_over_http_waited_for_by_tasks_answer_only_once_confirmed_and_count_once_at_the_gate() {
    let gate = Arc::new(Gate::default());
    let (_dir, db) = open_with(&gate, true);
    create_confirmed(&gate, &db);
    let (_server, url) = serve_primary(&db);
    let writers: Vec<_> = (0..8).map(|i| insert_over_http(&url, i)).collect();
    common::wait_until("every write committed", Duration::from_secs(10), || {
        writes_committed(&gate, &db) >= 8
    });
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        writers.iter().all(|w| !w.is_finished()),
        "an answer escaped the gate"
    );
    assert_eq!(db.group_commit_stats().at_gate, 8, "each counted once");
    let last = *gate.committed().last().expect("commits");
    gate.release(last);
    for w in writers {
        assert!(w.join().expect("writer") <= last);
    }
    common::wait_until("each counted out", Duration::from_secs(10), || {
        db.group_commit_stats().at_gate == 0
    });
    assert!(
        gate.polls.load(std::sync::atomic::Ordering::SeqCst) > 0,
        "no write was waited for by its task"
    );
}

/// `sql` over HTTP on a thread: the answer's status and JSON.
fn query_over_http(
    url: &str,
    sql: &'static str,
) -> std::thread::JoinHandle<(u16, serde_json::Value)> {
    let url = url.to_string();
    std::thread::spawn(move || {
        let body = serde_json::json!({ "sql": sql }).to_string();
        let mut resp = ureq::post(&url)
            .config()
            .http_status_as_error(false)
            .build()
            .header("content-type", "application/json")
            .send(body)
            .expect("an answer");
        let status = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().expect("body");
        (status, serde_json::from_str(&text).expect("json"))
    })
}

#[test]
fn a_read_over_http_on_the_primary_runs_on_its_task_and_answers_only_once_what_it_saw_is_confirmed()
{
    let gate = Arc::new(Gate::default());
    let (_dir, db) = open(&gate);
    let at = confirmed_schema(&gate, &db, "CREATE TABLE t(x)");
    let (_server, url) = serve_primary(&db);
    // Nothing unconfirmed: answered at once.
    let (status, json) = query_over_http(&url, "SELECT count(*) AS n FROM t")
        .join()
        .expect("reader");
    assert_eq!(status, 200, "{json}");
    assert_eq!(json["result"][0]["results"][0]["n"], 0);
    // A row committed, not confirmed: a read that sees it waits, and its
    // task (not a blocking thread, which would wait in wait_confirmed)
    // leaves a wake-up with the gate.
    let first = unconfirmed_write(&gate, &db, "INSERT INTO t VALUES (1)");
    let reader = query_over_http(&url, "SELECT count(*) AS n FROM t");
    common::wait_until(
        "a wake-up left with the gate",
        Duration::from_secs(10),
        || !gate.calls.lock().is_empty(),
    );
    std::thread::sleep(Duration::from_millis(50));
    assert!(!reader.is_finished(), "a read escaped the gate");
    gate.release(at(2));
    let (status, json) = reader.join().expect("reader");
    assert_eq!(status, 200, "{json}");
    assert_eq!(json["result"][0]["results"][0]["n"], 1);
    assert_eq!(
        json["result"][0]["meta"]["bookmark"].as_str(),
        Some(at(2).to_string().as_str())
    );
    first.join().expect("writer").expect("the insert");
}

#[test]
fn a_read_over_http_on_the_primary_whose_gate_gives_up_answers_an_error_not_the_rows() {
    let gate = Arc::new(Gate::default());
    let (_dir, db) = open(&gate);
    let _ = confirmed_schema(&gate, &db, "CREATE TABLE t(x)");
    let (_server, url) = serve_primary(&db);
    let first = unconfirmed_write(&gate, &db, "INSERT INTO t VALUES (1)");
    let reader = query_over_http(&url, "SELECT count(*) AS n FROM t");
    common::wait_until(
        "a wake-up left with the gate",
        Duration::from_secs(10),
        || !gate.calls.lock().is_empty(),
    );
    *gate.give_up.lock() = true;
    let (status, json) = reader.join().expect("reader");
    assert!(status >= 500, "{status} {json}");
    assert_eq!(json["success"], false, "{json}");
    assert!(
        json["result"].as_array().is_none_or(|r| r.is_empty()),
        "{json}"
    );
    first.join().expect("writer").expect_err("the gate gave up");
}
