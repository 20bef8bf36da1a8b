//! `walrelay up` runs a small fleet: databases created through any node,
//! replicated to the followers, queried through every node by name or
//! uuid, surviving kill -9 of their node and a restart of the whole
//! cluster from its directory.

mod common;

use common::up::{Up, free_base, signal};
use serde_json::json;
use std::time::{Duration, Instant};

fn until_ok(what: &str, mut f: impl FnMut() -> common::up::Reply) -> common::up::Reply {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = f();
        if r.status == 200 {
            return r;
        }
        assert!(Instant::now() < deadline, "{what}: {} {}", r.status, r.json);
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn up_runs_a_fleet_whose_databases_survive_kill_9_of_their_node_and_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let base = free_base();
    let args = ["--writers", "1", "--heartbeat-ms", "500", "--net", "std"];
    let mut up = Up::start(dir.path(), base, &args);
    up.wait_serving(2, Duration::from_secs(60));
    // Nodes 3..=5 are the fleet's; 3 runs the control plane.
    let mut uuids = Vec::new();
    for (i, name) in ["alpha", "beta", "gamma"].iter().enumerate() {
        let via = [0, 1, 4][i]; // any node passes the call on
        let r = until_ok("create", || {
            up.call(via, "POST", "/v1/databases", Some(&json!({ "name": name })))
        });
        uuids.push(r.json["result"]["uuid"].as_str().unwrap().to_string());
        let q = |sql: &str, node: u16| {
            up.call(
                node,
                "POST",
                &format!("/v1/databases/{name}/query"),
                Some(&json!({ "sql": sql })),
            )
        };
        until_ok("create table", || q("CREATE TABLE IF NOT EXISTS t(x)", 2));
        until_ok("insert", || q(&format!("INSERT INTO t VALUES ({i})"), 5));
    }
    let list = up.call(2, "GET", "/v1/databases", None);
    assert_eq!(list.json["result_info"]["total_count"], 3, "{}", list.json);

    // kill -9 every fleet node: `up` restarts them and each database
    // reopens from the followers' log with every acknowledged write.
    for node in 0..3 {
        signal(dir.path(), &format!("node-{node}"), libc::SIGKILL);
    }
    for (i, uuid) in uuids.iter().enumerate() {
        let r = until_ok("read after kill -9", || {
            up.call(
                1,
                "POST",
                &format!("/v1/databases/{uuid}/query"),
                Some(&json!({"sql": "SELECT x FROM t"})),
            )
        });
        assert_eq!(
            r.json["result"][0]["results"][0]["x"], i as u64,
            "{}",
            r.json
        );
    }
    let (status, _) = up.interrupt();
    assert!(status.success());

    // The whole cluster again, from its directory.
    let mut up = Up::start(dir.path(), base, &args);
    up.wait_serving(2, Duration::from_secs(60));
    for (i, name) in ["alpha", "beta", "gamma"].iter().enumerate() {
        let r = until_ok("read after restart", || {
            up.call(
                3,
                "POST",
                &format!("/v1/databases/{name}/query"),
                Some(&json!({"sql": "SELECT x FROM t"})),
            )
        });
        assert_eq!(
            r.json["result"][0]["results"][0]["x"], i as u64,
            "{}",
            r.json
        );
    }
    // Deleting through a replica's port; the database is gone everywhere.
    assert_eq!(up.call(2, "DELETE", "/v1/databases/beta", None).status, 200);
    for node in 0..6 {
        let r = up.call(
            node,
            "POST",
            "/v1/databases/beta/query",
            Some(&json!({"sql": "SELECT 1"})),
        );
        assert_eq!(r.status, 404, "node {node}: {}", r.json);
    }
    let (status, _) = up.interrupt();
    assert!(status.success());
}

#[test]
fn a_fleet_database_travels_back_in_time_through_any_node() {
    let dir = tempfile::tempdir().unwrap();
    let base = free_base();
    let args = [
        "--writers",
        "0",
        "--heartbeat-ms",
        "500",
        "--net",
        "std",
        "--archive-lag-ms",
        "200",
    ];
    let mut up = Up::start(dir.path(), base, &args);
    up.wait_serving(2, Duration::from_secs(60));
    until_ok("create", || {
        up.call(3, "POST", "/v1/databases", Some(&json!({"name": "tt"})))
    });
    let q = |node: u16, sql: &str| {
        up.call(
            node,
            "POST",
            "/v1/databases/tt/query",
            Some(&json!({ "sql": sql })),
        )
    };
    until_ok("create table", || q(1, "CREATE TABLE IF NOT EXISTS t(x)"));
    let first = until_ok("insert", || q(4, "INSERT INTO t VALUES (1)"));
    let b1 = first.json["result"][0]["meta"]["bookmark"]
        .as_str()
        .unwrap()
        .to_string();
    until_ok("more", || q(5, "INSERT INTO t VALUES (2), (3)"));
    // The bookmark a time names, then a restore to the first insert, each
    // through a node that may not host the database.
    let now = chrono_now();
    let r = until_ok("bookmark at a time", || {
        up.call(
            0,
            "GET",
            &format!("/v1/databases/tt/time_travel/bookmark?timestamp={now}"),
            None,
        )
    });
    assert!(r.json["result"]["bookmark"].is_string(), "{}", r.json);
    let r = until_ok("restore", || {
        up.call(
            2,
            "POST",
            &format!("/v1/databases/tt/time_travel/restore?bookmark={b1}"),
            None,
        )
    });
    assert!(
        r.json["result"]["previous_bookmark"].is_string(),
        "{}",
        r.json
    );
    let rows = until_ok("read", || q(3, "SELECT x FROM t ORDER BY x"));
    assert_eq!(
        rows.json["result"][0]["results"],
        json!([{"x": 1}]),
        "{}",
        rows.json
    );
    let (status, _) = up.interrupt();
    assert!(status.success());
}

/// Now as Unix seconds (the endpoint takes RFC 3339 or Unix seconds).
fn chrono_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}
