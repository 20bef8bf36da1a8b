//! Several statements in one `sql`, and `/raw`, over HTTP against a local
//! cluster (primary and a replica): every statement runs and has its own
//! result; they are one atomic unit; parameters bind to the last one;
//! `/raw` keeps the column names, duplicates included, and the replica
//! forwards what writes.

mod common;

use common::{HttpCluster, assert_d1_error};
use serde_json::json;
use walrelay_engine::local_cluster::LocalClusterConfig;

fn cluster() -> HttpCluster {
    HttpCluster::start(
        LocalClusterConfig::default(),
        &["CREATE TABLE kv(k TEXT PRIMARY KEY, v INTEGER)"],
    )
}

fn body(v: serde_json::Value) -> Vec<u8> {
    v.to_string().into_bytes()
}

#[test]
fn several_statements_in_one_sql_all_run_with_one_result_each_on_the_primary_and_through_a_replica()
{
    let h = cluster();
    for (node, url) in h.nodes() {
        let table = format!("t_{node}");
        let r = h.post(
            &url,
            &body(json!({"sql": format!(
                "CREATE TABLE {table}(x); INSERT INTO {table} VALUES (1), (2); SELECT * FROM {table} ORDER BY x"
            )})),
        );
        assert_eq!(r.status, 200, "{node}: {}", r.json);
        let results = r.json["result"].as_array().expect("results");
        assert_eq!(results.len(), 3, "{node}: one result per statement");
        assert_eq!(results[1]["meta"]["changes"], 2, "{node}");
        assert_eq!(results[2]["results"], json!([{"x": 1}, {"x": 2}]), "{node}");
        assert_eq!(
            results[2]["meta"]["served_by_primary"], true,
            "{node}: a write runs on the primary"
        );
    }
}

#[test]
fn trailing_semicolons_whitespace_and_comments_leave_one_statement() {
    let h = cluster();
    for (node, url) in h.nodes() {
        let r = h.post(
            &url,
            &body(json!({"sql": "SELECT 1 AS one; ;\n -- done\n /* really */ ;  "})),
        );
        assert_eq!(r.status, 200, "{node}: {}", r.json);
        assert_eq!(r.json["result"].as_array().map(Vec::len), Some(1), "{node}");
        assert_eq!(
            r.json["result"][0]["results"],
            json!([{"one": 1}]),
            "{node}"
        );
    }
}

#[test]
fn semicolons_inside_strings_comments_and_trigger_bodies_do_not_split() {
    let h = cluster();
    let url = h.c.primary_http.url();
    let r = h.post(
        &url,
        &body(json!({"sql": "CREATE TABLE log(m TEXT); \
            CREATE TRIGGER kv_log AFTER INSERT ON kv BEGIN INSERT INTO log VALUES ('a;b'); INSERT INTO log VALUES (new.k); END; \
            INSERT INTO kv VALUES ('x;y', 1); /* ; */ SELECT m FROM log ORDER BY rowid"})),
    );
    assert_eq!(r.status, 200, "{}", r.json);
    let results = r.json["result"].as_array().expect("results");
    assert_eq!(results.len(), 4, "{}", r.json);
    assert_eq!(results[3]["results"], json!([{"m": "a;b"}, {"m": "x;y"}]));
}

#[test]
fn a_failing_statement_among_several_changes_nothing() {
    let h = cluster();
    let sql =
        "INSERT INTO kv VALUES ('a', 1); CREATE TABLE fresh(x); INSERT INTO kv VALUES ('a', 2)";
    for (node, url) in h.nodes() {
        let before = h.state();
        let r = h.post(&url, &body(json!({ "sql": sql })));
        assert_d1_error(&r, 400, 7500, "UNIQUE constraint failed", node);
        assert!(
            r.json["errors"][0]["message"]
                .as_str()
                .unwrap_or("")
                .contains("statement 2"),
            "{node}: the message names the failing statement: {}",
            r.json
        );
        before.assert_same(&h.state(), node);
    }
}

#[test]
fn sql_holding_a_nul_character_is_refused_on_every_node_not_cut_short_at_it() {
    let h = cluster();
    for sql in [
        "SELECT 1\u{0}; DELETE FROM kv",
        "INSERT INTO kv VALUES ('n', 1); DELETE FROM kv\u{0} WHERE k = 'none'",
        "DELETE FROM kv WHERE k = 'a'\u{0} OR 1",
    ] {
        h.refuse(
            &format!("{sql:?}"),
            &body(json!({ "sql": sql })),
            400,
            7500,
            "NUL character",
        );
        h.refuse(
            &format!("{sql:?} in a batch"),
            &body(json!([{ "sql": "SELECT 1" }, { "sql": sql }])),
            400,
            7500,
            "NUL character",
        );
    }
}

#[test]
fn parameters_bind_to_the_last_of_several_statements() {
    let h = cluster();
    let url = h.c.primary_http.url();
    let r = h.post(
        &url,
        &body(json!({"sql": "INSERT INTO kv VALUES ('p', 7); SELECT v FROM kv WHERE k = ?1", "params": ["p"]})),
    );
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(r.json["result"][1]["results"], json!([{"v": 7}]));
}

#[test]
fn parameters_for_an_earlier_statement_of_several_are_a_clear_400_that_changes_nothing() {
    let h = cluster();
    h.refuse(
        "a parameter in the first of two statements",
        &body(json!({"sql": "INSERT INTO kv VALUES (?1, 1); SELECT 1", "params": ["q"]})),
        400,
        7500,
        "only the last statement",
    );
    h.refuse(
        "parameters for a text whose last statement takes none",
        &body(json!({"sql": "INSERT INTO kv VALUES ('q', 1); SELECT 1", "params": ["q"]})),
        400,
        7500,
        "parameters",
    );
}

#[test]
fn several_reads_are_served_by_the_replica_itself() {
    let h = cluster();
    let url = h.c.replica_http[0].url();
    let r = h.post(
        &url,
        &body(json!({"sql": "SELECT 1 AS a; SELECT count(*) AS n FROM kv"})),
    );
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(
        r.json["result"][0]["meta"]["served_by_primary"], false,
        "{}",
        r.json
    );
    assert_eq!(r.json["result"][1]["results"], json!([{"n": 0}]));
}

#[test]
fn several_statements_longer_than_the_sql_limit_in_total_each_within_it_run() {
    let h = cluster();
    let url = h.c.primary_http.url();
    // 30 statements of ~6 KB: 180 KB in all, over the 100 KB statement limit
    // (the body limit is 1 MiB).
    let pad = "x".repeat(6_000);
    let sql: String = (0..30)
        .map(|i| format!("INSERT INTO kv VALUES ('{i}{pad}', {i});"))
        .collect();
    let r = h.post(&url, &body(json!({ "sql": sql })));
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(r.json["result"].as_array().map(Vec::len), Some(30));
    // One statement over the limit is still refused.
    let long = format!("SELECT '{}'; SELECT 1", "y".repeat(120_000));
    h.refuse(
        "a 120 KB statement",
        &body(json!({ "sql": long })),
        400,
        7500,
        "longer than",
    );
}

#[test]
fn raw_answers_columns_and_row_arrays_keeping_duplicate_column_names() {
    let h = cluster();
    for (node, url) in h.nodes() {
        let r = h.post_path(
            &url,
            "/v1/databases/main/raw",
            &body(json!({"sql": "SELECT 1 AS a, 2 AS a, NULL AS b, x'0102' AS c"})),
        );
        assert_eq!(r.status, 200, "{node}: {}", r.json);
        assert_eq!(
            r.json["result"][0]["results"],
            json!({"columns": ["a", "a", "b", "c"], "rows": [[1, 2, null, [1, 2]]]}),
            "{node}"
        );
        // No rows: the columns are still there.
        let r = h.post_path(
            &url,
            "/v1/databases/main/raw",
            &body(json!({"sql": "SELECT k, v FROM kv WHERE 0"})),
        );
        assert_eq!(
            r.json["result"][0]["results"],
            json!({"columns": ["k", "v"], "rows": []}),
            "{node}: {}",
            r.json
        );
    }
}

#[test]
fn raw_through_a_replica_forwards_a_write_and_keeps_the_raw_shape() {
    let h = cluster();
    let url = h.c.replica_http[0].url();
    let r = h.post_path(
        &url,
        "/v1/databases/main/raw",
        &body(json!({"sql": "INSERT INTO kv VALUES ('r', 1) RETURNING k, v"})),
    );
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(
        r.json["result"][0]["results"],
        json!({"columns": ["k", "v"], "rows": [["r", 1]]})
    );
    assert_eq!(r.json["result"][0]["meta"]["served_by_primary"], true);
    let r = h.post_path(
        &url,
        "/v1/databases/main/raw",
        &body(
            json!([{"sql": "INSERT INTO kv VALUES ('s', 2)"}, {"sql": "SELECT count(*) FROM kv"}]),
        ),
    );
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(r.json["result"][1]["results"]["rows"], json!([[2]]));
}

#[test]
fn the_batch_object_form_is_a_batch() {
    let h = cluster();
    let url = h.c.primary_http.url();
    let r = h.post(
        &url,
        &body(json!({"batch": [{"sql": "INSERT INTO kv VALUES (?1, 1)", "params": ["b"]}, {"sql": "SELECT k FROM kv"}]})),
    );
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(r.json["result"][1]["results"], json!([{"k": "b"}]));
    h.refuse(
        "an empty batch object",
        br#"{"batch": []}"#,
        400,
        7400,
        "empty batch",
    );
    h.refuse(
        "a batch object with sql",
        br#"{"batch": [], "sql": "SELECT 1"}"#,
        400,
        7400,
        "the body must be",
    );
}

#[test]
fn raw_refuses_bad_input_in_d1s_shape() {
    let h = cluster();
    for (node, url) in h.nodes() {
        let before = h.state();
        let r = h.post_path(&url, "/v1/databases/main/raw", b"{not json");
        assert_d1_error(&r, 400, 7400, "malformed JSON", node);
        let r = h.post_path(&url, "/v1/databases/nope/raw", br#"{"sql":"SELECT 1"}"#);
        assert_d1_error(&r, 404, 7404, "unknown database", node);
        before.assert_same(&h.state(), node);
    }
}
