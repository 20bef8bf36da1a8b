//! The SQL sandbox, over HTTP: hostile statements sent to the primary and a
//! replica of a local cluster are each refused with D1's error shape and
//! change no page anywhere; D1's allowed pragmas work, a setting a client
//! changes does not outlive its request, and the limits SQLite enforces
//! are clear 400s that change nothing.

mod common;

use common::HttpCluster;
use serde_json::{Value as Json, json};
use walrelay_engine::http::server::HttpConfig;
use walrelay_engine::local_cluster::LocalClusterConfig;
use walrelay_engine::{Constraint, Database, Limits, Options, QueryError, Refusal, Value};

/// D1-style error code for SQL errors (spelled out so a renumbering shows
/// up as a failing test).
const SQL: u32 = 7500;

const SETUP: &[&str] = &[
    "CREATE TABLE parent(id INTEGER PRIMARY KEY, name TEXT)",
    "CREATE TABLE child(id INTEGER PRIMARY KEY, parent INTEGER REFERENCES parent(id))",
    "CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)",
    "CREATE INDEX t_v ON t(v)",
    "INSERT INTO parent(id, name) VALUES (1, 'p')",
    "INSERT INTO child(parent) VALUES (1)",
    "INSERT INTO t(v) VALUES ('a'), ('B'), ('c')",
    "CREATE VIEW pages_view AS SELECT pgno, data FROM sqlite_dbpage",
    "CREATE TABLE trap(a)",
    "CREATE TRIGGER trap_ai AFTER INSERT ON trap \
     BEGIN UPDATE sqlite_dbpage SET data = zeroblob(4096) WHERE pgno = 2; END",
];

fn cluster(config: LocalClusterConfig) -> HttpCluster {
    HttpCluster::start(
        LocalClusterConfig {
            replica_regions: vec!["region-a".into()],
            ..config
        },
        SETUP,
    )
}

/// A SQLite file next to the cluster, holding a secret: what an ATTACH
/// would reach.
fn secret_file(h: &HttpCluster) -> String {
    let path = h.dir.path().join("secret.db");
    let c = rusqlite::Connection::open(&path).expect("secret db");
    c.execute_batch("CREATE TABLE secret(s TEXT); INSERT INTO secret VALUES ('hunter2');")
        .expect("secret");
    path.display().to_string()
}

fn one(sql: &str) -> Json {
    json!({ "sql": sql })
}

fn with(sql: &str, params: Json) -> Json {
    json!({ "sql": sql, "params": params })
}

/// Hostile statements, each with what its refusal must say.
fn hostile(secret: &str, out: &str) -> Vec<(String, Json, &'static str)> {
    const NOT_AUTHORIZED: &str = "not authorized";
    const ATTACH: &str = "ATTACH, DETACH and VACUUM INTO are not allowed";
    let uri_ro = format!("file:{secret}?vfs=unix&mode=ro");
    let mut cases: Vec<(String, Json, &'static str)> = vec![
        // ATTACH in every form: the filename reaches the authorizer only
        // when it is a literal.
        one(&format!("ATTACH '{secret}' AS x")).into_case("ATTACH a path", ATTACH),
        one(&format!("ATTACH DATABASE '{secret}' AS x")).into_case("ATTACH DATABASE", ATTACH),
        one(&format!("ATTACH 'file:{secret}?mode=ro' AS x")).into_case("ATTACH a URI", ATTACH),
        one(&format!("ATTACH '{uri_ro}' AS x")).into_case("ATTACH a URI naming vfs=unix", ATTACH),
        with("ATTACH ?1 AS x", json!([uri_ro])).into_case("ATTACH a bound URI", ATTACH),
        with("ATTACH ?1 AS x", json!([secret])).into_case("ATTACH a bound path", ATTACH),
        with("ATTACH ?1 || '' AS x", json!([secret])).into_case("ATTACH an expression", ATTACH),
        with("ATTACH (SELECT ?1) AS x", json!([secret])).into_case("ATTACH (SELECT ...)", ATTACH),
        with("ATTACH printf('%s', ?1) AS x", json!([secret]))
            .into_case("ATTACH a function's result", ATTACH),
        one("ATTACH '' AS x").into_case("ATTACH a nameless temporary database", ATTACH),
        one("ATTACH ':memory:' AS x").into_case("ATTACH :memory:", ATTACH),
        one("ATTACH 'file::memory:?cache=shared' AS x")
            .into_case("ATTACH a shared-cache memory URI", ATTACH),
        one("DETACH x").into_case("DETACH", ATTACH),
        one("DETACH DATABASE temp").into_case("DETACH temp", ATTACH),
        one(&format!("VACUUM INTO '{out}'")).into_case("VACUUM INTO a file", ATTACH),
        with("VACUUM INTO ?1", json!([out])).into_case("VACUUM INTO a bound file", ATTACH),
        one(&format!("VACUUM main INTO 'file:{out}?vfs=unix'"))
            .into_case("VACUUM INTO a URI", ATTACH),
        // Raw pages.
        one("SELECT * FROM sqlite_dbpage").into_case("read sqlite_dbpage", "raw page access"),
        one("SELECT count(*) FROM sqlite_dbpage")
            .into_case("count sqlite_dbpage", "raw page access"),
        one("SELECT data FROM sqlite_dbpage('main') WHERE pgno = 1")
            .into_case("sqlite_dbpage as a function", "raw page access"),
        one("INSERT INTO sqlite_dbpage(pgno, data) VALUES (1, zeroblob(4096))")
            .into_case("write sqlite_dbpage", "raw page access"),
        one("UPDATE sqlite_dbpage SET data = zeroblob(4096) WHERE pgno = 2")
            .into_case("update sqlite_dbpage", "raw page access"),
        one("SELECT * FROM dbstat").into_case("read dbstat", "raw page access"),
        one("CREATE VIRTUAL TABLE pages USING dbstat")
            .into_case("a dbstat table", "raw page access"),
        // A schema may name sqlite_dbpage (SETUP's view and trigger); using
        // it is refused.
        one("SELECT * FROM pages_view").into_case("a view over sqlite_dbpage", "sqlite_dbpage"),
        one("INSERT INTO trap(a) VALUES (1)")
            .into_case("a trigger writing sqlite_dbpage", "sqlite_dbpage"),
        one("PRAGMA no_such_pragma=1").into_case("an unknown pragma", "not authorized: PRAGMA"),
        // Code from outside.
        one("SELECT load_extension('/tmp/evil.so')").into_case("load_extension", "load_extension"),
        with("SELECT load_extension(?1, 'init')", json!(["/tmp/evil.so"]))
            .into_case("load_extension of a bound path", "load_extension"),
        one("SELECT fts3_tokenizer('simple')").into_case("fts3_tokenizer read", "fts3_tokenizer"),
        one("SELECT fts3_tokenizer('evil', X'4141414141414141')")
            .into_case("fts3_tokenizer set", "fts3_tokenizer"),
        // Objects that would outlive the request on a pooled connection.
        one("CREATE TEMP TABLE tmp(a)").into_case("a temporary table", "temporary"),
        one("CREATE TABLE temp.tmp(a)").into_case("a table in temp", "temporary"),
        one("CREATE TEMP VIEW tv AS SELECT 1").into_case("a temporary view", "temporary"),
        one("CREATE TEMP TRIGGER tt AFTER INSERT ON t BEGIN DELETE FROM t; END")
            .into_case("a temporary trigger on a main table", "temporary"),
        one("CREATE TRIGGER temp.tt AFTER INSERT ON t BEGIN DELETE FROM t; END")
            .into_case("a trigger in temp", "temporary"),
        one("CREATE VIEW temp.tv AS SELECT 1").into_case("a view in temp", "temporary"),
        one("CREATE TABLE temp.tmp AS SELECT * FROM t")
            .into_case("a temp table from a query", "temporary"),
        one("CREATE VIRTUAL TABLE temp.ft USING fts5(a)")
            .into_case("a temp virtual table", "temporary"),
        // writable_schema games.
        one("PRAGMA writable_schema=ON").into_case("writable_schema on", "PRAGMA writable_schema"),
        one("PRAGMA writable_schema=RESET")
            .into_case("writable_schema reset", "PRAGMA writable_schema"),
        json!([
            { "sql": "PRAGMA writable_schema=1" },
            { "sql": "UPDATE sqlite_schema SET sql = 'CREATE TABLE t(x)' WHERE name = 't'" },
        ])
        .into_case("a batch that rewrites the schema", "PRAGMA writable_schema"),
        one("UPDATE sqlite_schema SET sql = 'CREATE TABLE t(x)' WHERE name = 't'")
            .into_case("a direct schema rewrite", "may not be modified"),
        json!([
            { "sql": "INSERT INTO t(v) VALUES ('x')" },
            { "sql": "ATTACH ?1 AS x", "params": [secret] },
        ])
        .into_case("an ATTACH inside a batch", ATTACH),
        // Pragma table-valued functions reach the same policy.
        one("SELECT * FROM pragma_journal_mode").into_case("pragma_journal_mode()", NOT_AUTHORIZED),
        one("SELECT * FROM pragma_compile_options")
            .into_case("pragma_compile_options()", NOT_AUTHORIZED),
    ];
    // Every pragma outside D1's list, in get and set form, bare and with a
    // schema prefix.
    for (name, value) in [
        ("journal_mode", "DELETE"),
        ("synchronous", "OFF"),
        ("wal_checkpoint", "TRUNCATE"),
        ("wal_autocheckpoint", "1"),
        ("locking_mode", "EXCLUSIVE"),
        ("writable_schema", "ON"),
        ("max_page_count", "1"),
        ("page_size", "512"),
        ("cache_size", "1"),
        ("mmap_size", "1000000"),
        ("temp_store", "FILE"),
        ("temp_store_directory", "'/tmp'"),
        ("schema_version", "1"),
        ("user_version", "7"),
        ("application_id", "7"),
        ("query_only", "1"),
        ("trusted_schema", "1"),
        ("cell_size_check", "0"),
        ("secure_delete", "0"),
        ("auto_vacuum", "FULL"),
        ("journal_size_limit", "0"),
        ("busy_timeout", "0"),
        ("threads", "8"),
        ("soft_heap_limit", "1"),
        ("hard_heap_limit", "1"),
        ("shrink_memory", ""),
        ("incremental_vacuum", "1"),
        ("read_uncommitted", "1"),
        ("automatic_index", "0"),
        ("analysis_limit", "1"),
        ("compile_options", ""),
        ("database_list", ""),
        ("page_count", ""),
        ("freelist_count", ""),
        ("data_version", ""),
    ] {
        let needle = "not authorized: PRAGMA";
        cases.push(one(&format!("PRAGMA {name}")).into_case(&format!("PRAGMA {name}"), needle));
        if !value.is_empty() {
            cases.push(
                one(&format!("PRAGMA {name}={value}"))
                    .into_case(&format!("PRAGMA {name}={value}"), needle),
            );
            cases.push(
                one(&format!("PRAGMA main.{name}={value}"))
                    .into_case(&format!("PRAGMA main.{name}={value}"), needle),
            );
        }
    }
    cases.push(one("PRAGMA temp.journal_mode=OFF").into_case("PRAGMA temp.journal_mode", "PRAGMA"));
    cases
}

trait IntoCase {
    fn into_case(self, what: &str, needle: &'static str) -> (String, Json, &'static str);
}

impl IntoCase for Json {
    fn into_case(self, what: &str, needle: &'static str) -> (String, Json, &'static str) {
        (what.to_string(), self, needle)
    }
}

/// A good read on every node: they are still serving and still see only
/// their own database.
fn assert_still_serving(h: &HttpCluster) {
    for (node, url) in h.nodes() {
        let r = h.post(&url, br#"{"sql": "SELECT count(*) AS n FROM t"}"#);
        assert_eq!(r.status, 200, "the {node} stopped serving: {}", r.json);
        assert_eq!(r.json["result"][0]["results"][0]["n"], 3, "{node}");
        let r = h.post(&url, br#"{"sql": "SELECT name FROM pragma_database_list"}"#);
        assert_eq!(r.status, 400, "{node}: {}", r.json);
    }
}

#[test]
fn hostile_statements_are_refused_with_a_d1_error_on_the_primary_and_a_replica_and_change_no_page()
{
    let h = cluster(LocalClusterConfig::default());
    let secret = secret_file(&h);
    let out = h.dir.path().join("copy.db").display().to_string();
    let cases = hostile(&secret, &out);
    assert!(cases.len() >= 40, "{} cases", cases.len());
    for (what, body, needle) in &cases {
        let body = serde_json::to_vec(body).expect("json");
        h.refuse(what, &body, 400, SQL, needle);
    }
    assert!(
        !std::path::Path::new(&out).exists(),
        "VACUUM INTO wrote a file"
    );
    assert_still_serving(&h);
}

#[test]
fn d1s_introspection_pragmas_and_per_request_settings_work_over_http() {
    let h = cluster(LocalClusterConfig::default());
    for (node, url) in h.nodes() {
        for (sql, want) in [
            ("PRAGMA table_list", json!("table")),
            ("PRAGMA table_info(t)", json!("id")),
            ("PRAGMA main.table_info(t)", json!("id")),
            ("PRAGMA table_xinfo(t)", json!("id")),
            ("PRAGMA index_list(t)", json!("t_v")),
            ("PRAGMA index_info(t_v)", json!("v")),
            ("PRAGMA index_xinfo(t_v)", json!("v")),
            ("PRAGMA foreign_key_list(child)", json!("parent")),
            ("PRAGMA quick_check", json!("ok")),
            ("PRAGMA integrity_check", json!("ok")),
            ("PRAGMA foreign_keys", json!(1)),
            ("SELECT * FROM pragma_table_info('t')", json!("v")),
        ] {
            let r = h.post(&url, &serde_json::to_vec(&one(sql)).expect("json"));
            assert_eq!(r.status, 200, "{sql} on the {node}: {}", r.json);
            let text = r.json["result"][0]["results"].to_string();
            let needle = match &want {
                Json::String(s) => format!("\"{s}\""),
                other => other.to_string(),
            };
            assert!(text.contains(&needle), "{sql} on the {node}: {text}");
        }
        for sql in [
            "PRAGMA foreign_key_check",
            "PRAGMA foreign_key_check(child)",
            "PRAGMA case_sensitive_like=ON",
        ] {
            let r = h.post(&url, &serde_json::to_vec(&one(sql)).expect("json"));
            assert_eq!(r.status, 200, "{sql} on the {node}: {}", r.json);
            assert_eq!(
                r.json["result"][0]["results"],
                json!([]),
                "{sql} on the {node}"
            );
        }
    }
    // PRAGMA optimize may write (ANALYZE) though SQLite calls it read-only:
    // a reader's SQLITE_READONLY sends it where writes run, alone, in a
    // batch and through a replica.
    for (i, url) in [h.c.primary_http.url(), h.c.replica_http[0].url()]
        .iter()
        .enumerate()
    {
        // A fresh indexed table that was never analysed: optimize runs
        // ANALYZE on it.
        let setup = format!(
            r#"[{{"sql": "CREATE TABLE opt{i}(x INTEGER)"}}, {{"sql": "CREATE INDEX opt{i}_x ON opt{i}(x)"}},
               {{"sql": "WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n+1 FROM c WHERE n < 20000) INSERT INTO opt{i} SELECT n FROM c"}}]"#
        );
        let r = h.post(&h.c.primary_http.url(), setup.as_bytes());
        assert_eq!(r.status, 200, "{}", r.json);
        h.wait_replicas();
        let r = h.post(url, br#"{"sql": "PRAGMA optimize(0x10002)"}"#);
        assert_eq!(r.status, 200, "PRAGMA optimize alone at {url}: {}", r.json);
    }
    let r = h.post(
        &h.c.primary_http.url(),
        br#"[{"sql": "PRAGMA optimize"}, {"sql": "PRAGMA optimize(0x10002)"}]"#,
    );
    assert_eq!(r.status, 200, "PRAGMA optimize in a batch: {}", r.json);
    h.wait_replicas();
    // A batch may defer foreign keys within itself: a child before its
    // parent commits.
    let before = h.state();
    let r = h.post(
        &h.c.primary_http.url(),
        &serde_json::to_vec(&json!([
            { "sql": "PRAGMA defer_foreign_keys=ON" },
            { "sql": "INSERT INTO child(parent) VALUES (2)" },
            { "sql": "INSERT INTO parent(id, name) VALUES (2, 'q')" },
        ]))
        .expect("json"),
    );
    assert_eq!(r.status, 200, "{}", r.json);
    assert_ne!(h.state().bookmark, before.bookmark);
    // Without it the same order fails, and changes nothing: foreign keys are
    // on again for the next request.
    h.wait_replicas();
    h.refuse(
        "a child before its parent, deferral not carried over",
        &serde_json::to_vec(&json!([
            { "sql": "INSERT INTO child(parent) VALUES (3)" },
            { "sql": "INSERT INTO parent(id, name) VALUES (3, 'r')" },
        ]))
        .expect("json"),
        400,
        SQL,
        "FOREIGN KEY constraint failed",
    );
}

/// A primary with one reader, so every read reuses the same connection.
fn one_reader_db() -> (tempfile::TempDir, Database) {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = Database::open(
        dir.path().join("db.sqlite"),
        Options {
            readers: 1,
            ..Options::default()
        },
    )
    .expect("open");
    let s = db.session(Constraint::FirstPrimary).expect("session");
    for sql in SETUP {
        s.prepare(*sql).run().expect("setup");
    }
    (dir, db)
}

fn setting(db: &Database, name: &str) -> Value {
    let s = db.session(Constraint::FirstUnconstrained).expect("session");
    s.prepare(format!("PRAGMA {name}"))
        .raw()
        .expect("read setting")
        .rows
        .first()
        .and_then(|r| r.first().cloned())
        .unwrap_or(Value::Null)
}

#[test]
fn a_setting_a_client_changes_does_not_reach_the_next_client_on_the_same_connection() {
    let (_dir, db) = one_reader_db();
    for (name, changed, default) in [
        ("foreign_keys", "OFF", 1),
        ("recursive_triggers", "ON", 0),
        ("reverse_unordered_selects", "ON", 0),
        ("legacy_alter_table", "ON", 0),
        ("ignore_check_constraints", "ON", 0),
        ("defer_foreign_keys", "ON", 0),
    ] {
        // Twice: the second time the setter comes from a statement cache.
        for round in 0..2 {
            let s = db.session(Constraint::FirstUnconstrained).expect("session");
            s.prepare(format!("PRAGMA {name}={changed}"))
                .run()
                .unwrap_or_else(|e| panic!("{name} round {round}: {e}"));
            assert_eq!(
                setting(&db, name),
                Value::Integer(default),
                "{name} leaked to the next request (round {round})"
            );
        }
    }
    // The writer too: foreign keys switched off by one request are on for
    // the next write.
    let s = db.session(Constraint::FirstPrimary).expect("session");
    s.prepare("PRAGMA foreign_keys=OFF").run().expect("off");
    let e = s
        .prepare("INSERT INTO child(parent) VALUES (99)")
        .run()
        .expect_err("foreign keys are enforced again");
    assert!(e.to_string().contains("FOREIGN KEY"), "{e}");
    // case_sensitive_like has no read form: its effect is the test.
    s.prepare("PRAGMA case_sensitive_like=ON")
        .run()
        .expect("case sensitive");
    let r = s
        .prepare("SELECT count(*) AS n FROM t WHERE v LIKE 'b'")
        .first()
        .expect("like")
        .expect("row");
    assert_eq!(
        r.get("n"),
        Some(&Value::Integer(1)),
        "LIKE is case-blind again"
    );
}

#[test]
fn plain_vacuum_still_works_and_vacuum_into_is_refused_in_the_library_api() {
    let (dir, db) = one_reader_db();
    let s = db.session(Constraint::FirstPrimary).expect("session");
    s.prepare("VACUUM").run().expect("plain VACUUM");
    let out = dir.path().join("copy.db");
    let e = s
        .prepare("VACUUM INTO ?1")
        .bind([out.display().to_string()])
        .run()
        .expect_err("VACUUM INTO");
    assert!(
        matches!(e, QueryError::NotAuthorized(Refusal::Attach)),
        "{e:?}"
    );
    assert!(!out.exists());
    // ATTACH with a bound filename: refused, and nothing stays attached.
    let e = s
        .prepare("ATTACH ?1 AS x")
        .bind([dir.path().join("db.sqlite").display().to_string()])
        .run()
        .expect_err("ATTACH");
    assert!(
        matches!(e, QueryError::NotAuthorized(Refusal::Attach)),
        "{e:?}"
    );
    let e = s
        .prepare("SELECT name FROM pragma_database_list")
        .all()
        .expect_err("database_list is not D1's");
    assert!(matches!(e, QueryError::NotAuthorized(_)), "{e:?}");
}

/// The limits SQLite enforces, small enough to reach.
fn limited_cluster() -> HttpCluster {
    cluster(LocalClusterConfig {
        http: HttpConfig {
            max_body_bytes: 8 << 20,
            ..HttpConfig::default()
        },
        limits: Limits {
            max_database_bytes: 256 * 1024,
            ..Limits::default()
        },
        ..LocalClusterConfig::default()
    })
}

#[test]
fn each_sqlite_limit_is_a_clear_400_that_changes_nothing() {
    let h = limited_cluster();
    let limits = Limits::default();
    // SQL over 100 KB: a statement padded with a comment.
    let long = format!("SELECT 1 /*{}*/", "x".repeat(limits.max_sql_bytes as usize));
    h.refuse(
        "SQL over the length limit",
        &serde_json::to_vec(&one(&long)).expect("json"),
        400,
        SQL,
        "max_sql_bytes",
    );
    // 101 parameters.
    let n = limits.max_params as usize + 1;
    let marks = vec!["?"; n].join(", ");
    let params: Vec<i64> = (0..n as i64).collect();
    h.refuse(
        "101 anonymous parameters",
        &serde_json::to_vec(&with(&format!("SELECT {marks}"), json!(params))).expect("json"),
        400,
        SQL,
        "max_params",
    );
    h.refuse(
        "a parameter numbered past the limit",
        &serde_json::to_vec(&with(&format!("SELECT ?{n}"), json!(params))).expect("json"),
        400,
        SQL,
        "max_params",
    );
    // A value of 2 MB + 1.
    let big = "x".repeat(limits.max_value_bytes as usize + 1);
    h.refuse(
        "a bound string over the value limit",
        &serde_json::to_vec(&with("INSERT INTO t(v) VALUES (?1)", json!([big]))).expect("json"),
        400,
        SQL,
        "max_value_bytes",
    );
    h.refuse(
        "a blob made over the value limit",
        &serde_json::to_vec(&one(&format!(
            "SELECT zeroblob({})",
            limits.max_value_bytes + 1
        )))
        .expect("json"),
        400,
        SQL,
        "max_value_bytes",
    );
    // 101 columns, in a table and in a result.
    let cols: Vec<String> = (0..=limits.max_columns).map(|i| format!("c{i}")).collect();
    h.refuse(
        "a table of 101 columns",
        &serde_json::to_vec(&one(&format!("CREATE TABLE wide({})", cols.join(", "))))
            .expect("json"),
        400,
        SQL,
        "max_columns",
    );
    let ones = vec!["1"; limits.max_columns as usize + 1].join(", ");
    h.refuse(
        "a result of 101 columns",
        &serde_json::to_vec(&one(&format!("SELECT {ones}"))).expect("json"),
        400,
        SQL,
        "max_columns",
    );
    // The database size limit: grow until a write would pass it.
    let primary = h.c.primary_http.url();
    // Each row is stored twice (the table and the index on v).
    let grow =
        serde_json::to_vec(&one("INSERT INTO t(v) VALUES (randomblob(20000))")).expect("json");
    let mut grown = 0;
    loop {
        let before = h.state();
        let r = h.post(&primary, &grow);
        if r.status == 200 {
            grown += 1;
            assert!(grown < 20, "256 KB held {grown} x 40 KB");
            h.wait_replicas();
            continue;
        }
        common::assert_d1_error(
            &r,
            400,
            SQL,
            "the database size limit was reached",
            "a write past max_database_bytes",
        );
        before.assert_same(&h.state(), "a write past max_database_bytes");
        break;
    }
    assert!(grown >= 2, "the limit was reached after {grown} rows");
    // The same in a batch, and the database still takes small writes.
    h.refuse(
        "a batch past max_database_bytes",
        &serde_json::to_vec(&json!([
            { "sql": "INSERT INTO t(v) VALUES ('small')" },
            { "sql": "INSERT INTO t(v) VALUES (randomblob(200000))" },
        ]))
        .expect("json"),
        400,
        SQL,
        "the database size limit was reached",
    );
    let r = h.post(&primary, br#"{"sql": "INSERT INTO t(v) VALUES ('small')"}"#);
    assert_eq!(r.status, 200, "{}", r.json);
}

/// A database with an indexed table of 20,000 rows that was never
/// analysed: `PRAGMA optimize(0x10002)` decides to run ANALYZE on it.
fn indexed_table_never_analysed() -> (tempfile::TempDir, Database, walrelay_engine::Session) {
    let dir = tempfile::tempdir().expect("tmp");
    let db = Database::open(dir.path().join("a.db"), Options::default()).expect("open");
    let s = db.session(Constraint::FirstPrimary).expect("session");
    s.batch([
        s.prepare("CREATE TABLE t(x)"),
        s.prepare("CREATE INDEX tx ON t(x)"),
        s.prepare(
            "WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n+1 FROM c WHERE n < 20000) \
             INSERT INTO t SELECT n FROM c",
        ),
    ])
    .expect("setup");
    (dir, db, s)
}

#[test]
fn pragma_optimize_that_decides_to_analyze_runs_where_writes_run() {
    let (_dir, db, s) = indexed_table_never_analysed();
    // SQLite calls it read-only, so it lands on a reader, which cannot
    // write the statistics it decides to gather.
    let before = db.latest_bookmark();
    s.prepare("PRAGMA optimize(0x10002)")
        .all()
        .expect("optimize alone");
    assert!(db.latest_bookmark() > before, "ANALYZE committed a write");
    let n = s
        .prepare("SELECT count(*) FROM sqlite_stat1")
        .raw()
        .expect("stat1")
        .rows[0][0]
        .as_i64();
    assert!(n.is_some_and(|n| n > 0), "statistics were gathered");
}

#[test]
fn a_read_only_batch_cannot_write_through_a_statement_sqlite_calls_read_only() {
    let (_dir, db, _) = indexed_table_never_analysed();
    let before = db.latest_bookmark();
    let ro = db
        .session(Constraint::FirstPrimary)
        .expect("session")
        .with_access(walrelay_engine::Access::ReadOnly);
    // ANALYZE would commit statistics: refused, and nothing is written.
    match ro.batch([
        ro.prepare("SELECT count(*) FROM t"),
        ro.prepare("PRAGMA optimize(0x10002)"),
    ]) {
        Err(QueryError::Batch { index: 1, source }) => {
            assert!(matches!(*source, QueryError::ReadOnlyAccess), "{source:?}")
        }
        other => panic!("a read-only batch that writes: {other:?}"),
    }
    assert_eq!(db.latest_bookmark(), before, "nothing committed");
    // A read-only batch of reads works, served at the latest bookmark.
    let r = ro
        .batch([
            ro.prepare("SELECT count(*) AS n FROM t"),
            ro.prepare("SELECT 1"),
        ])
        .expect("reads");
    assert_eq!(
        r[0].results[0].get("n").and_then(Value::as_i64),
        Some(20000)
    );
    assert_eq!(r[0].meta.bookmark, before);
}
