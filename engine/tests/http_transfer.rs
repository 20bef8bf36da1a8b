//! Export and import over HTTP (`/v1/databases/{name}/export|import`):
//! an export imported into an empty database gives the same database
//! (schema, rows, blobs, NULLs, unicode, exact reals, infinities,
//! indexes, triggers, views, AUTOINCREMENT counters), an import is all or
//! nothing, and every bad request is a clear 4xx in D1's shape that
//! changes nothing.

mod common;

use common::{HttpCluster, http_kit::BytesReply};
use serde_json::json;
use walrelay_engine::http::auth::{Permission, Scope};
use walrelay_engine::http::server::HttpConfig;
use walrelay_engine::local_cluster::LocalClusterConfig;

/// A database with something of everything a dump must carry.
const SETUP: &[&str] = &[
    "CREATE TABLE kinds(id INTEGER PRIMARY KEY AUTOINCREMENT, i INTEGER, r REAL, t TEXT, b BLOB, \
     g INTEGER GENERATED ALWAYS AS (i * 2) VIRTUAL)",
    "CREATE TABLE \"odd \"\"name\"\"\"(k TEXT PRIMARY KEY, v ANY) STRICT, WITHOUT ROWID",
    "CREATE TABLE parent(id INTEGER PRIMARY KEY)",
    "CREATE TABLE child(id INTEGER PRIMARY KEY, p INTEGER REFERENCES parent(id))",
    "CREATE TABLE audit(msg TEXT)",
    "CREATE INDEX kinds_t ON kinds(t)",
    "CREATE UNIQUE INDEX kinds_i ON kinds(i) WHERE i IS NOT NULL",
    "CREATE VIEW big AS SELECT id, r FROM kinds WHERE r > 1",
    "CREATE TRIGGER kinds_audit AFTER INSERT ON kinds BEGIN INSERT INTO audit VALUES ('row; ' || new.id); END",
];

fn fill(h: &HttpCluster) {
    let reals = [
        0.1,
        -2.5,
        1.0 / 3.0,
        f64::MAX,
        f64::MIN_POSITIVE,
        5e-324,
        123456789.0,
        -0.0,
        1e300,
        f64::EPSILON,
    ];
    let url = h.c.primary_http.url();
    for (n, r) in reals.iter().enumerate() {
        let text = [
            "it's",
            "ünïcödé ✓ 日本",
            "",
            "a\nb\tc",
            "'; DROP TABLE kinds; --",
        ][n % 5];
        let r = h.post(
            &url,
            json!({"sql": "INSERT INTO kinds(i, r, t, b) VALUES (?1, ?2, ?3, NULL)",
                   "params": [n as i64 * 1000 - 3000, r, text]})
            .to_string()
            .as_bytes(),
        );
        assert_eq!(r.status, 200, "{}", r.json);
    }
    for sql in [
        "INSERT INTO kinds(i, r, t, b) VALUES (NULL, 9e999, NULL, x'00ff10fe')",
        "INSERT INTO kinds(i, r, t, b) VALUES (9223372036854775807, -9e999, 'max', x'')",
        "INSERT INTO kinds(i, r, t, b) VALUES (-9223372036854775808, NULL, NULL, randomblob(3000))",
        "INSERT INTO \"odd \"\"name\"\"\" VALUES ('a', 1), ('b', 2.5), ('c', 'x'), ('d', x'01'), ('e', NULL)",
        "INSERT INTO parent VALUES (1), (2)",
        "INSERT INTO child VALUES (10, 1), (11, 2), (12, NULL)",
        "DELETE FROM kinds WHERE id = 2",
    ] {
        let r = h.post(&url, json!({ "sql": sql }).to_string().as_bytes());
        assert_eq!(r.status, 200, "{sql}: {}", r.json);
    }
}

fn export(h: &HttpCluster, url: &str) -> BytesReply {
    h.send(
        "POST",
        &format!("{url}/v1/databases/main/export"),
        Some(&h.admin()),
        b"",
    )
}

fn import(h: &HttpCluster, url: &str, sql: &[u8], bearer: Option<&str>) -> BytesReply {
    let admin = h.admin();
    h.send(
        "POST",
        &format!("{url}/v1/databases/main/import"),
        Some(bearer.unwrap_or(&admin)),
        sql,
    )
}

/// Whether the server has answered or closed `stream` (without waiting).
fn answered(stream: &std::net::TcpStream) -> bool {
    stream.set_nonblocking(true).expect("nonblocking");
    let mut byte = [0u8; 1];
    let r = stream.peek(&mut byte);
    stream.set_nonblocking(false).expect("blocking");
    r.is_ok()
}

fn d1_error(r: &BytesReply, status: u16, code: u32, has: &str, what: &str) {
    r.assert_d1_error(status, code, has, what);
}

#[test]
fn an_export_imported_into_an_empty_database_gives_the_same_database() {
    let a = HttpCluster::start(LocalClusterConfig::default(), SETUP);
    fill(&a);
    let dump = export(&a, &a.c.primary_http.url());
    assert_eq!(dump.status, 200, "{}", String::from_utf8_lossy(&dump.body));
    assert_eq!(dump.content_type.as_deref(), Some("application/sql"));
    let text = dump.text();
    assert!(
        text.starts_with("PRAGMA defer_foreign_keys=TRUE;\n"),
        "{text}"
    );
    assert!(
        !text.contains("CREATE TABLE sqlite_"),
        "internal tables are skipped"
    );
    let first_trigger = text.find("CREATE TRIGGER").expect("the trigger");
    assert!(
        text.rfind("INSERT INTO \"kinds\"").expect("rows") < first_trigger,
        "triggers come after every row"
    );
    // The replica exports the same snapshot.
    a.wait_replicas();
    assert_eq!(export(&a, &a.c.replica_http[0].url()).text(), text);

    let b = HttpCluster::start(LocalClusterConfig::default(), &[]);
    let r = import(&b, &b.c.primary_http.url(), text.as_bytes(), None);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let j = r.json();
    assert_eq!(j["success"], true);
    let n = j["result"]["num_queries"].as_u64().expect("num_queries");
    assert_eq!(n as usize, text.matches(";\n").count(), "{j}");
    assert!(j["result"]["final_bookmark"].is_string(), "{j}");
    assert_eq!(
        j["result"]["final_bookmark"].as_str(),
        Some(
            b.c.primary
                .database()
                .latest_bookmark()
                .to_string()
                .as_str()
        )
    );
    // Identical: the second export is the first, byte for byte (reals,
    // blobs and text read back exactly, rowids and counters included).
    let again = export(&b, &b.c.primary_http.url()).text();
    assert_eq!(again, text);
    // And what SQLite says of the values agrees.
    let q = |h: &HttpCluster| {
        h.post_path(
            &h.c.primary_http.url(),
            "/v1/databases/main/raw",
            br#"{"sql":"SELECT id, i, r, typeof(r), t, hex(b), g FROM kinds ORDER BY id; SELECT * FROM audit; SELECT * FROM big; SELECT name, seq FROM sqlite_sequence; PRAGMA foreign_key_check"}"#,
        )
        .json["result"]
            .clone()
    };
    let (qa, qb) = (q(&a), q(&b));
    for i in 0..5 {
        assert_eq!(qa[i]["results"], qb[i]["results"], "statement {i}");
    }
}

#[test]
fn an_import_runs_through_a_replica_and_is_all_or_nothing() {
    let h = HttpCluster::start(LocalClusterConfig::default(), &["CREATE TABLE t(x UNIQUE)"]);
    let replica = h.c.replica_http[0].url();
    let r = import(
        &h,
        &replica,
        b"INSERT INTO t VALUES (1);\nINSERT INTO t VALUES (2);\n",
        None,
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["result"]["num_queries"], 2);
    assert_eq!(r.json()["result"]["meta"]["served_by_primary"], true);
    // The import is acknowledged at the primary's commit; the replicas
    // apply it after. Compare from a settled state.
    h.wait_replicas();
    let before = h.state();
    let r = import(
        &h,
        &replica,
        b"INSERT INTO t VALUES (3);\nCREATE TABLE u(y);\nINSERT INTO t VALUES (1);\n",
        None,
    );
    d1_error(&r, 400, 7500, "UNIQUE", "a failing statement in an import");
    before.assert_same(&h.state(), "a failed import");
}

/// What is sent, with which token, and the refusal expected.
type Case<'a> = (&'a str, Vec<u8>, Option<&'a str>, u16, u32, &'a str);

fn small_cluster() -> HttpCluster {
    HttpCluster::start(
        LocalClusterConfig {
            http: HttpConfig {
                max_import_bytes: 16 << 10,
                max_export_bytes: 16 << 10,
                ..HttpConfig::default()
            },
            ..LocalClusterConfig::default()
        },
        &["CREATE TABLE t(x)", "INSERT INTO t VALUES (1)"],
    )
}

#[test]
fn bad_imports_are_clear_4xx_in_d1s_shape_and_change_nothing() {
    let h = small_cluster();
    let read_only = h.mint(Scope::All, Permission::Read);
    for (node, url) in h.nodes() {
        let before = h.state();
        let cases: Vec<Case<'_>> = vec![
            (
                "SQL that is not a dump",
                b"this is not SQL at all".to_vec(),
                None,
                400,
                7500,
                "syntax error",
            ),
            (
                "transaction control in the file",
                b"BEGIN TRANSACTION;\nINSERT INTO t VALUES (2);\nCOMMIT;\n".to_vec(),
                None,
                400,
                7500,
                "transaction control",
            ),
            (
                "a file that is not UTF-8",
                vec![0xff, 0xfe, b';'],
                None,
                400,
                7400,
                "UTF-8",
            ),
            (
                "an empty file",
                b"  -- nothing\n".to_vec(),
                None,
                400,
                7500,
                "",
            ),
            (
                "a file over max_import_bytes",
                vec![b' '; 20 << 10],
                None,
                413,
                7413,
                "exceeds the limit",
            ),
            (
                "a read-only token",
                b"INSERT INTO t VALUES (2);".to_vec(),
                Some(read_only.as_str()),
                403,
                10000,
                "read-write",
            ),
            (
                "no token",
                b"INSERT INTO t VALUES (2);".to_vec(),
                Some("Bearer nope"),
                401,
                10000,
                "",
            ),
        ];
        for (what, body, bearer, status, code, has) in cases {
            let r = import(&h, &url, &body, bearer);
            d1_error(&r, status, code, has, &format!("{what} (to the {node})"));
        }
        let r = h.send(
            "POST",
            &format!("{url}/v1/databases/nope/import"),
            Some(&h.admin()),
            b"SELECT 1;",
        );
        d1_error(&r, 404, 7404, "unknown database", node);
        before.assert_same(&h.state(), node);
    }
}

#[test]
fn bad_exports_are_clear_4xx_in_d1s_shape() {
    let h = small_cluster();
    for (node, url) in h.nodes() {
        let r = h.send(
            "POST",
            &format!("{url}/v1/databases/nope/export"),
            Some(&h.admin()),
            b"",
        );
        d1_error(&r, 404, 7404, "unknown database", node);
        let r = h.send(
            "POST",
            &format!("{url}/v1/databases/main/export"),
            Some(&h.admin()),
            b"{oops",
        );
        d1_error(&r, 400, 7400, "malformed export request", node);
        let r = h.send(
            "POST",
            &format!("{url}/v1/databases/main/export"),
            Some(&h.admin()),
            br#"{"dump_options": {"tables": ["missing"]}}"#,
        );
        d1_error(&r, 400, 7400, "no table", node);
        let r = h.send(
            "POST",
            &format!("{url}/v1/databases/main/export"),
            None,
            b"",
        );
        d1_error(&r, 401, 10000, "", node);
    }
    // Past max_export_bytes: 413, and nothing is held.
    let url = h.c.primary_http.url();
    let r = h.post(&url, br#"{"sql":"INSERT INTO t SELECT randomblob(1000) FROM (WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n+1 FROM c WHERE n < 40) SELECT n FROM c)"}"#);
    assert_eq!(r.status, 200, "{}", r.json);
    let r = export(&h, &url);
    d1_error(
        &r,
        413,
        7413,
        "larger than the limit",
        "an export past the limit",
    );
    // A virtual table refuses the export, as in D1.
    let r = h.post(
        &url,
        br#"{"sql":"CREATE VIRTUAL TABLE docs USING fts5(body)"}"#,
    );
    if r.status == 200 {
        let r = h.send(
            "POST",
            &format!("{url}/v1/databases/main/export"),
            Some(&h.admin()),
            br#"{"dump_options":{"no_data":true}}"#,
        );
        d1_error(
            &r,
            400,
            7400,
            "virtual table",
            "a database with a virtual table",
        );
    }
}

#[test]
fn export_options_select_tables_and_leave_out_rows_or_schema() {
    let h = HttpCluster::start(LocalClusterConfig::default(), SETUP);
    fill(&h);
    let url = h.c.primary_http.url();
    let opts = |o: serde_json::Value| {
        let r = h.send(
            "POST",
            &format!("{url}/v1/databases/main/export"),
            Some(&h.admin()),
            json!({ "dump_options": o }).to_string().as_bytes(),
        );
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        r.text()
    };
    let only_parent = opts(json!({"tables": ["parent"]}));
    assert!(
        only_parent.contains("CREATE TABLE parent") && !only_parent.contains("kinds"),
        "{only_parent}"
    );
    let no_data = opts(json!({"no_data": true}));
    assert!(
        no_data.contains("CREATE TABLE") && !no_data.contains("INSERT INTO \""),
        "{no_data}"
    );
    let no_schema = opts(json!({"no_schema": true}));
    assert!(
        !no_schema.contains("CREATE ") && no_schema.contains("INSERT INTO"),
        "{no_schema}"
    );
}

#[test]
fn an_unknown_transfer_link_is_a_404_for_download_and_upload() {
    let h = small_cluster();
    let url = h.c.primary_http.url();
    let r = h.send(
        "GET",
        &format!("{url}/v1/transfers/{}", "0".repeat(64)),
        None,
        b"",
    );
    d1_error(&r, 404, 7404, "no such transfer link", "download");
    let r = h.send(
        "PUT",
        &format!("{url}/v1/transfers/abc"),
        None,
        b"SELECT 1;",
    );
    d1_error(&r, 404, 7404, "no such transfer link", "upload");
}

#[test]
fn past_the_running_transfers_an_import_or_export_is_503_with_retry_after_until_one_ends() {
    use std::io::Write;
    let h = HttpCluster::start(LocalClusterConfig::default(), &["CREATE TABLE t(x)"]);
    let url = h.c.primary_http.url();
    let addr = h.c.primary_http.addr();
    // Imports whose bodies are still on their way hold every slot.
    let hold = || {
        let mut s = std::net::TcpStream::connect(addr).expect("connect");
        write!(
            s,
            "POST /v1/databases/main/import HTTP/1.1\r\nhost: x\r\nauthorization: {}\r\n\
             content-length: 1000\r\n\r\nINSERT INTO t VALUES (1);",
            h.admin()
        )
        .expect("send");
        s
    };
    let mut holding: Vec<std::net::TcpStream> = (0..walrelay_engine::http::transfer::MAX_RUNNING)
        .map(|_| hold())
        .collect();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let r = import(&h, &url, b"INSERT INTO t VALUES (2);", None);
        if r.status == 503 {
            break;
        }
        // The last probe's answer says why, if they never fill.
        assert!(
            std::time::Instant::now() < deadline,
            "the slots never filled; the last probe: {} {}",
            r.status,
            String::from_utf8_lossy(&r.body)
        );
        // A holder whose head the server read while that probe held a
        // slot was refused (answered and closed): it is sent again.
        for held in &mut holding {
            if answered(held) {
                *held = hold();
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // An import that took a slot while they filled may still be on its
    // way to the replicas.
    h.wait_replicas();
    let before = h.state();
    for (what, r) in [
        (
            "an import",
            import(&h, &url, b"INSERT INTO t VALUES (3);", None),
        ),
        ("an export", export(&h, &url)),
    ] {
        d1_error(&r, 503, 7503, "exports and imports are running", what);
        assert_eq!(r.retry_after.as_deref(), Some("1"), "{what}");
    }
    before.assert_same(&h.state(), "refused transfers");
    // The held imports' clients go away: the slots come back.
    drop(holding);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let r = import(&h, &url, b"INSERT INTO t VALUES (4);", None);
        if r.status == 200 {
            break;
        }
        assert_eq!(r.status, 503, "{}", String::from_utf8_lossy(&r.body));
        assert!(
            std::time::Instant::now() < deadline,
            "the slots never came back"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(export(&h, &url).status, 200);
}
