//! Bad input over HTTP, sent raw to both the primary and a replica of a
//! local cluster: every bad request is a 4xx in D1's error shape
//! (`success: false`, one error with a code and a clear message, no
//! results), issues no bookmark, changes nothing on any node, leaves the
//! node serving, and is counted in `/metrics` by status.
//!
//! Requests are built by hand (not with the crate's client or `api`
//! types) so that what is tested is the wire format itself.

mod common;

use common::{ClusterState, HttpCluster, assert_d1_error};
use serde_json::json;
use std::collections::BTreeMap;
use walrelay_engine::http::server::HttpConfig;
use walrelay_engine::local_cluster::LocalClusterConfig;
use walrelay_engine::{Bookmark, Constraint, Epoch, Sequence};

/// Small, so a 10 KB body is over it.
const MAX_BODY: usize = 4096;

/// D1-style error codes, as documented in `http::server::codes` (spelled
/// out here so a renumbering shows up as a failing test).
const BAD_REQUEST: u32 = 7400;
const BOOKMARK: u32 = 7401;
const UNKNOWN_DATABASE: u32 = 7404;
const TOO_LARGE: u32 = 7413;
const SQL: u32 = 7500;

/// The shared HTTP cluster kit, plus this file's checksum of table t.
struct Fixture {
    h: HttpCluster,
}

impl std::ops::Deref for Fixture {
    type Target = HttpCluster;
    fn deref(&self) -> &HttpCluster {
        &self.h
    }
}

fn fixture() -> Fixture {
    Fixture {
        h: HttpCluster::start(
            LocalClusterConfig {
                // A replica waits this long for a bookmark it has not
                // applied before the primary answers: short, because the
                // future bookmarks sent here never arrive.
                replica_max_wait_ms: 200,
                http: HttpConfig {
                    max_body_bytes: MAX_BODY,
                    ..HttpConfig::default()
                },
                ..LocalClusterConfig::default()
            },
            // The replicas must know table t (the kit waits for them), or
            // reads of it there would be refused for the wrong reason.
            &[
                "CREATE TABLE t(id INTEGER PRIMARY KEY, name TEXT NOT NULL, n INTEGER) STRICT",
                "INSERT INTO t(name, n) VALUES ('a', 1), ('b', 2), ('c', 3)",
            ],
        ),
    }
}

impl Fixture {
    fn primary(&self) -> String {
        self.c.primary_http.url()
    }

    fn replica(&self) -> String {
        self.c.replica_http[0].url()
    }

    /// Everything a bad request must leave as it was: the kit's cluster
    /// state (bookmark, every page of every node, replica positions) and
    /// the rows of t.
    fn state(&self) -> State {
        let db = self.c.primary.database();
        let s = db.session(Constraint::FirstPrimary).expect("session");
        let row = s
            .prepare(
                "SELECT count(*) AS n, total(n) AS sum, group_concat(name, ',') AS names FROM t",
            )
            .first()
            .expect("checksum query")
            .expect("a row");
        State {
            rows: format!(
                "count={:?} sum={:?} names={:?}",
                row.get("n"),
                row.get("sum"),
                row.get("names")
            ),
            cluster: self.h.state(),
        }
    }

    /// Sends `case` to every node and checks the answer and that nothing
    /// changed.
    fn refuse(&self, case: &Case) {
        for (node, url) in self.nodes() {
            let before = self.state();
            let r = self.post_raw(&url, case.database, case.header.as_deref(), &case.body);
            let what = format!("{} (sent to the {node})", case.what);
            assert_d1_error(&r, case.status, case.code, case.message_has, &what);
            // A refused request gives the session no new position.
            if let Some(b) = &r.bookmark {
                assert!(
                    b.as_str() <= before.cluster.bookmark.to_string().as_str(),
                    "{what}: answered with bookmark {b}, beyond the latest {}",
                    before.cluster.bookmark
                );
            }
            let after = self.state();
            assert_eq!(after.rows, before.rows, "{what}: the rows changed");
            before.cluster.assert_same(&after.cluster, &what);
        }
    }

    /// A good read on every node, after the bad ones: they are still
    /// serving, and the rows are the setup's.
    fn assert_still_serving(&self) {
        for (node, url) in self.nodes() {
            let r = self.post(&url, br#"{"sql": "SELECT count(*) AS n FROM t"}"#);
            assert_eq!(r.status, 200, "the {node} stopped serving: {:?}", r.json);
            assert_eq!(r.json["result"][0]["results"][0]["n"], 3, "{node}");
        }
    }
}

struct State {
    rows: String,
    cluster: ClusterState,
}

/// One bad request and how it must be refused.
struct Case {
    what: &'static str,
    database: &'static str,
    header: Option<Vec<u8>>,
    body: Vec<u8>,
    status: u16,
    code: u32,
    message_has: &'static str,
}

fn case(
    what: &'static str,
    body: impl Into<Vec<u8>>,
    status: u16,
    code: u32,
    message_has: &'static str,
) -> Case {
    Case {
        what,
        database: "main",
        header: Some(b"first-unconstrained".to_vec()),
        body: body.into(),
        status,
        code,
        message_has,
    }
}

/// A body that would write if it were accepted.
const INSERT: &str = r#"{"sql": "INSERT INTO t(name, n) VALUES ('x', 9)"}"#;

fn body_cases() -> Vec<Case> {
    vec![
        case(
            "malformed JSON",
            r#"{"sql": "INSERT INTO t(name) VALUES ('x')""#,
            400,
            BAD_REQUEST,
            "malformed JSON",
        ),
        case(
            "not JSON at all",
            "INSERT INTO t(name) VALUES ('x')",
            400,
            BAD_REQUEST,
            "malformed JSON",
        ),
        case("an empty body", "", 400, BAD_REQUEST, "malformed JSON"),
        case("a number", "42", 400, BAD_REQUEST, "must be {\"sql\""),
        case(
            "a string",
            r#""SELECT 1""#,
            400,
            BAD_REQUEST,
            "must be {\"sql\"",
        ),
        case("an empty array", "[]", 400, BAD_REQUEST, "empty batch"),
        case(
            "a missing sql",
            r#"{"params": []}"#,
            400,
            BAD_REQUEST,
            "\"sql\" must be a string",
        ),
        case(
            "sql as a number",
            r#"{"sql": 1}"#,
            400,
            BAD_REQUEST,
            "\"sql\" must be a string",
        ),
        case(
            "sql as an array",
            r#"{"sql": ["INSERT INTO t(name) VALUES ('x')"]}"#,
            400,
            BAD_REQUEST,
            "\"sql\" must be a string",
        ),
        case(
            "params as an object",
            r#"{"sql": "INSERT INTO t(name) VALUES (?1)", "params": {"1": "x"}}"#,
            400,
            BAD_REQUEST,
            "\"params\" must be an array",
        ),
        case(
            "params as a string",
            r#"{"sql": "INSERT INTO t(name) VALUES (?1)", "params": "x"}"#,
            400,
            BAD_REQUEST,
            "\"params\" must be an array",
        ),
        case(
            "an object parameter",
            r#"{"sql": "INSERT INTO t(name) VALUES (?1)", "params": [{"a": 1}]}"#,
            400,
            BAD_REQUEST,
            "parameter 0: an object is not a supported parameter type",
        ),
        case(
            "an array parameter",
            r#"{"sql": "INSERT INTO t(name, n) VALUES (?1, ?2)", "params": ["x", [1, 2]]}"#,
            400,
            BAD_REQUEST,
            "parameter 1: an array is not a supported parameter type",
        ),
        case(
            "an unknown field",
            r#"{"sql": "INSERT INTO t(name) VALUES ('x')", "params": [], "extra": 1}"#,
            400,
            BAD_REQUEST,
            "must be {\"sql\"",
        ),
        case(
            "a batch with one bad statement after a good one",
            r#"[{"sql": "INSERT INTO t(name) VALUES ('x')"}, {"sql": 7}]"#,
            400,
            BAD_REQUEST,
            "statement 1: \"sql\" must be a string",
        ),
    ]
}

#[test]
fn malformed_or_wrongly_shaped_bodies_are_400_bad_request_and_change_nothing() {
    let fx = fixture();
    for c in body_cases() {
        fx.refuse(&c);
    }
    fx.assert_still_serving();
}

/// A valid insert of about 10 KB: only its size is wrong.
fn oversized_insert() -> Vec<u8> {
    let body = json!({
        "sql": "INSERT INTO t(name, n) VALUES (?1, 1)",
        "params": ["x".repeat(10 * 1024)],
    })
    .to_string();
    assert!(body.len() > 2 * MAX_BODY);
    body.into_bytes()
}

#[test]
fn a_body_over_the_configured_limit_is_413_and_changes_nothing() {
    let fx = fixture();
    fx.refuse(&case(
        "a 10 KB body over a 4 KB limit",
        oversized_insert(),
        413,
        TOO_LARGE,
        "exceeds the limit of 4096 bytes",
    ));
    // One byte over is as over as ten thousand (the server reads one byte
    // past the limit to know); exactly at the limit is fine.
    let at = |len: usize| {
        let fixed = r#"{"sql": "SELECT ?1 AS s", "params": [""]}"#.len();
        format!(
            r#"{{"sql": "SELECT ?1 AS s", "params": ["{}"]}}"#,
            "y".repeat(len - fixed)
        )
        .into_bytes()
    };
    fx.refuse(&case(
        "a body one byte over the limit",
        at(MAX_BODY + 1),
        413,
        TOO_LARGE,
        "exceeds the limit",
    ));
    for (node, url) in fx.nodes() {
        let r = fx.post(&url, &at(MAX_BODY));
        assert_eq!(r.status, 200, "a body at the limit ({node}): {}", r.json);
    }
    fx.assert_still_serving();
}

#[test]
fn an_unknown_database_name_is_404_and_changes_nothing() {
    let fx = fixture();
    for database in ["nope", "Main", "main2"] {
        fx.refuse(&Case {
            database,
            ..case(
                "an unknown database",
                INSERT,
                404,
                UNKNOWN_DATABASE,
                "unknown database",
            )
        });
    }
    fx.assert_still_serving();
}

/// The query routes are matched by hand before the router (lever 68); a
/// path that matcher leaves alone must still be read as the router reads
/// it.
#[test]
fn a_percent_escaped_database_name_is_the_name_it_decodes_to_on_both_apis_and_near_miss_paths_are_404()
 {
    let fx = fixture();
    let read = br#"{"sql": "SELECT count(*) AS n FROM t"}"#;
    for (node, url) in fx.nodes() {
        let plain = fx.post_raw(&url, "main", Some(b"first-primary"), read);
        let escaped = fx.post_raw(&url, "ma%69n", Some(b"first-primary"), read);
        assert_eq!(plain.status, 200, "{node}: {}", plain.json);
        assert_eq!(escaped.status, 200, "{node}: {}", escaped.json);
        let rows = |r: &serde_json::Value| r["result"][0]["results"].clone();
        assert_eq!(rows(&plain.json), rows(&escaped.json), "{node}");
        assert_eq!(rows(&plain.json)[0]["n"], 3, "{node}");
        // Cloudflare's path (any account on a node outside a fleet), plain
        // and escaped.
        for path in [
            "/client/v4/accounts/acct/d1/database/main/query",
            "/client/v4/accounts/ac%63t/d1/database/ma%69n/query",
        ] {
            let r = fx.send("POST", &format!("{url}{path}"), Some(&fx.admin()), read);
            assert_eq!(r.status, 200, "{node}: POST {path}");
            assert_eq!(rows(&r.json()), rows(&plain.json), "{node}: POST {path}");
        }
        for path in [
            "/v1/databases/main/query/",
            "/v1/databases//query",
            "/v1/databases/main/queryx",
            "/client/v4/accounts/acct/d1/database/main/query/",
            "/client/v4/accounts/acct/d1/database//query",
        ] {
            let r = fx.send("POST", &format!("{url}{path}"), Some(&fx.admin()), read);
            assert_eq!(r.status, 404, "{node}: POST {path}");
        }
        let r = fx.send(
            "GET",
            &format!("{url}/v1/databases/main/query"),
            Some(&fx.admin()),
            b"",
        );
        assert_eq!(r.status, 405, "{node}: GET of the query route");
    }
    fx.assert_still_serving();
}

/// The primary's latest bookmark moved forward by `epochs` and `sequences`.
fn beyond(latest: Bookmark, epochs: u32, sequences: u64) -> String {
    Bookmark::new(
        Epoch(latest.epoch.0 + epochs),
        Sequence(latest.sequence.0 + sequences),
    )
    .to_string()
}

#[test]
fn malformed_and_future_bookmarks_are_400_bookmark_errors_and_change_nothing() {
    let fx = fixture();
    let latest = fx.c.primary.database().latest_bookmark();
    let real = latest.to_string();
    // Every malformed spelling is refused before the body runs; the body
    // is a write, so running it would show.
    let malformed: Vec<(&'static str, Vec<u8>)> = vec![
        ("a word", b"not-a-bookmark".to_vec()),
        ("an empty header", b"".to_vec()),
        (
            "a short bookmark",
            real.as_bytes()[..real.len() - 1].to_vec(),
        ),
        // (Lowercase, it would be a well-formed future bookmark.)
        (
            "an uppercase bookmark",
            b"0000000A-000000000000000F".to_vec(),
        ),
        ("no separator", real.replace('-', "0").into_bytes()),
        // (Inside: HTTP trims spaces around a header's value.)
        (
            "a bookmark with a space inside",
            format!("{} {}", &real[..3], &real[4..]).into_bytes(),
        ),
        ("a misspelled constraint", b"first_primary".to_vec()),
    ];
    for (what, header) in malformed {
        fx.refuse(&Case {
            header: Some(header),
            ..case(what, INSERT, 400, BOOKMARK, "malformed bookmark")
        });
    }
    fx.refuse(&Case {
        header: Some(b"\xff\xfe-bookmark".to_vec()),
        ..case(
            "a header that is not text",
            INSERT,
            400,
            BOOKMARK,
            "not text",
        )
    });
    // A bookmark the primary never issued: one step ahead, far ahead, and
    // in a later epoch. A replica cannot know it is bogus (it may just be
    // behind), so it waits, then the primary refuses it.
    for (what, header) in [
        ("the next sequence", beyond(latest, 0, 1)),
        ("a far sequence", beyond(latest, 0, 1 << 40)),
        ("a later epoch", beyond(latest, 1, 0)),
    ] {
        fx.refuse(&Case {
            header: Some(header.into_bytes()),
            ..case(what, INSERT, 400, BOOKMARK, "beyond the latest")
        });
    }
    // The real bookmark is fine: the refusals were about the header only.
    for (node, url) in fx.nodes() {
        let r = fx.post_raw(
            &url,
            "main",
            Some(real.as_bytes()),
            br#"{"sql": "SELECT count(*) AS n FROM t"}"#,
        );
        assert_eq!(r.status, 200, "the real bookmark ({node}): {}", r.json);
        assert_eq!(r.bookmark.as_deref(), Some(real.as_str()), "{node}");
    }
    fx.assert_still_serving();
}

fn sql_cases() -> Vec<Case> {
    vec![
        case(
            "a syntax error",
            r#"{"sql": "SELEC 1"}"#,
            400,
            SQL,
            "syntax error",
        ),
        case(
            "a syntax error in a write",
            r#"{"sql": "INSERT INTO t(name) VALUE ('x')"}"#,
            400,
            SQL,
            "syntax error",
        ),
        case(
            "an empty statement",
            r#"{"sql": ""}"#,
            400,
            SQL,
            "SQL is empty",
        ),
        case(
            "a write to a missing table",
            r#"{"sql": "INSERT INTO missing(x) VALUES (1)"}"#,
            400,
            SQL,
            "no such table: missing",
        ),
        case(
            "a read of a missing table",
            r#"{"sql": "SELECT * FROM missing"}"#,
            400,
            SQL,
            "no such table: missing",
        ),
        case(
            "a write to a missing column",
            r#"{"sql": "UPDATE t SET nope = 1"}"#,
            400,
            SQL,
            "no such column: nope",
        ),
        case(
            "too few parameters for a write",
            r#"{"sql": "INSERT INTO t(name, n) VALUES (?1, ?2)", "params": ["x"]}"#,
            400,
            SQL,
            "expects 2 parameters, 1 given",
        ),
        case(
            "too many parameters for a write",
            r#"{"sql": "INSERT INTO t(name) VALUES (?1)", "params": ["x", 2]}"#,
            400,
            SQL,
            "expects 1 parameters, 2 given",
        ),
        case(
            "too few parameters for a read",
            r#"{"sql": "SELECT * FROM t WHERE n = ?1"}"#,
            400,
            SQL,
            "expects 1 parameters, 0 given",
        ),
        case(
            "a constraint violation",
            r#"{"sql": "INSERT INTO t(name, n) VALUES (NULL, 1)"}"#,
            400,
            SQL,
            "NOT NULL",
        ),
        case(
            "a type violation in a STRICT table",
            r#"{"sql": "INSERT INTO t(name, n) VALUES ('x', ?1)", "params": ["not a number"]}"#,
            400,
            SQL,
            "cannot store TEXT value in INTEGER column",
        ),
        case(
            // Several statements run as one unit: the second's failure
            // undoes the first.
            "two statements in one, the second failing",
            r#"{"sql": "INSERT INTO t(name) VALUES ('x'); DELETE FROM no_such_table"}"#,
            400,
            SQL,
            "no such table",
        ),
    ]
}

#[test]
fn sql_errors_missing_tables_and_parameter_mismatches_are_400_sql_errors_and_change_nothing() {
    let fx = fixture();
    for c in sql_cases() {
        fx.refuse(&c);
    }
    fx.assert_still_serving();
}

/// Sums the samples of `name` whose labels include all of `labels`.
fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> u64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (n, rest) = series.split_once('{')?;
            if n != name {
                return None;
            }
            let have: BTreeMap<&str, &str> = rest
                .trim_end_matches('}')
                .split(',')
                .filter_map(|kv| {
                    let (k, v) = kv.split_once('=')?;
                    Some((k, v.trim_matches('"')))
                })
                .collect();
            labels
                .iter()
                .all(|(k, v)| have.get(k) == Some(v))
                .then(|| value.parse::<u64>().expect("a counter"))
        })
        .sum()
}

#[test]
fn metrics_count_every_refused_request_by_status_and_none_as_served() {
    let fx = fixture();
    // Every kind of refusal, each sent once to each node.
    let mut cases = body_cases();
    cases.extend(sql_cases());
    cases.push(case(
        "too large",
        oversized_insert(),
        413,
        TOO_LARGE,
        "exceeds the limit",
    ));
    cases.push(Case {
        database: "nope",
        ..case(
            "unknown database",
            INSERT,
            404,
            UNKNOWN_DATABASE,
            "unknown database",
        )
    });
    cases.push(Case {
        header: Some(b"not-a-bookmark".to_vec()),
        ..case(
            "malformed bookmark",
            INSERT,
            400,
            BOOKMARK,
            "malformed bookmark",
        )
    });
    cases.push(Case {
        header: Some(b"\xff-not-text".to_vec()),
        ..case("non-text bookmark", INSERT, 400, BOOKMARK, "not text")
    });
    let future = beyond(fx.c.primary.database().latest_bookmark(), 0, 5).into_bytes();
    cases.push(Case {
        header: Some(future),
        ..case(
            "future bookmark",
            INSERT,
            400,
            BOOKMARK,
            "beyond the latest",
        )
    });
    for c in &cases {
        fx.refuse(c);
    }
    let mut sent: BTreeMap<u16, u64> = BTreeMap::new();
    for c in &cases {
        *sent.entry(c.status).or_insert(0) += 1;
    }
    let replica = fx.metrics(&fx.replica());
    let primary = fx.metrics(&fx.primary());
    let refused = |text: &str, status: u16| {
        metric(
            text,
            "walrelay_refused_total",
            &[("status", &status.to_string())],
        )
    };
    // Every discrepancy is collected, so one run shows them all.
    let mut wrong = Vec::new();
    // The replica counts every refusal it answered, its own and the
    // primary's it relayed.
    for (&status, &n) in &sent {
        let got = refused(&replica, status);
        if got != n {
            wrong.push(format!(
                "replica, status {status}: counted {got}, answered {n}"
            ));
        }
    }
    // The primary counts the refusals sent to it and those the replica
    // forwarded to it (all 400s here: names and sizes are checked before
    // anything is forwarded, and the forwarded ones came back refused).
    let forwarded = metric(&replica, "walrelay_forwarded_total", &[]);
    assert!(forwarded > 0, "the replica forwarded nothing:\n{replica}");
    for (&status, &n) in &sent {
        let want = n + if status == 400 { forwarded } else { 0 };
        let got = refused(&primary, status);
        if got != want {
            wrong.push(format!(
                "primary, status {status}: counted {got}, answered {want}"
            ));
        }
    }
    // No refused request was counted as a query served.
    for (node, text) in [("replica", &replica), ("primary", &primary)] {
        let served = metric(text, "walrelay_queries_total", &[]);
        if served != 0 {
            wrong.push(format!("{node}: {served} refusals counted as served"));
        }
    }
    assert!(
        wrong.is_empty(),
        "walrelay_refused_total disagrees with the answers:\n  {}\n--- replica\n{replica}--- primary\n{primary}",
        wrong.join("\n  ")
    );
}
