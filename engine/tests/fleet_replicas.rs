//! A fleet database's reads are served by the region replicas of `walrelay
//! up` (each keeps replicas of the fleet's databases), with the sessions'
//! contract: a read carrying a write's bookmark sees that write wherever
//! it runs; writes sent to a replica reach the primary; a replica follows
//! its primary when it reopens elsewhere (after kill -9 of its node),
//! resumes from its files after its own kill -9, and is removed with its
//! database.

mod common;

use common::up::{Reply, Up, free_base, signal, until};
use serde_json::json;
use std::path::Path;
use std::time::{Duration, Instant};

/// Nodes of `up`: 0 the primary of `main`, 1 and 2 the region replicas,
/// 3..=5 the fleet nodes.
const REGION_A: u16 = 1;
const REGION_B: u16 = 2;
const FLEET: u16 = 3;

fn count(r: &Reply) -> u64 {
    r.json["result"][0]["results"][0]["n"]
        .as_u64()
        .unwrap_or_else(|| panic!("no count in {}", r.json))
}

fn served_by_replica(r: &Reply) -> bool {
    r.json["result"][0]["meta"]["served_by_primary"] == json!(false)
}

fn replica_files(dir: &Path, slot: &str) -> usize {
    std::fs::read_dir(dir.join(slot).join("fleet-replicas"))
        .map(|d| d.filter_map(Result::ok).count())
        .unwrap_or(0)
}

#[test]
fn a_fleet_database_is_read_from_each_region_replica_with_its_sessions_bookmarks() {
    let dir = tempfile::tempdir().unwrap();
    let base = free_base();
    let args = ["--writers", "0", "--heartbeat-ms", "500", "--net", "std"];
    let mut up = Up::start(dir.path(), base, &args);
    up.wait_serving(2, Duration::from_secs(60));
    until("create", 60, || {
        let r = up.call(
            FLEET,
            "POST",
            "/v1/databases",
            Some(&json!({"name": "shop"})),
        );
        (r.status == 200).then_some(r)
    });
    let sql = |s: &str| json!({ "sql": s });
    until("create table", 60, || {
        let r = up.query_db(FLEET, "shop", "first-primary", &sql("CREATE TABLE t(x)"));
        (r.status == 200).then_some(r)
    });

    // Until its routing entry reaches a region, the database's reads
    // there go to its host (by way of the control plane's node): still
    // right, just not local.
    let select = sql("SELECT count(*) AS n FROM t");
    for node in [REGION_A, REGION_B] {
        until("the route reaches the region", 30, || {
            let r = up.query_db(node, "shop", "first-unconstrained", &select);
            assert_eq!(r.status, 200, "{}", r.json);
            assert_eq!(count(&r), 0, "{}", r.json);
            served_by_replica(&r).then_some(r)
        });
    }

    // Each write's bookmark, read at both regions: the write is there,
    // and the replica (not the primary) answered.
    for round in 1..=5u64 {
        let w = up.query_db(
            FLEET,
            "shop",
            "first-primary",
            &sql("INSERT INTO t VALUES (1)"),
        );
        assert_eq!(w.status, 200, "{}", w.json);
        let bookmark = w.bookmark.clone().expect("a write's bookmark");
        for (node, region) in [(REGION_A, "region-a"), (REGION_B, "region-b")] {
            let r = up.query_db(node, "shop", &bookmark, &select);
            assert_eq!(r.status, 200, "{}", r.json);
            assert_eq!(count(&r), round, "node {node}: {}", r.json);
            assert_eq!(
                r.json["result"][0]["meta"]["served_by_region"], region,
                "{}",
                r.json
            );
            assert!(served_by_replica(&r), "{}", r.json);
        }
    }

    // A write sent to a replica runs on the primary; its bookmark reads
    // back at the other region.
    let w = up.query_db(
        REGION_A,
        "shop",
        "first-unconstrained",
        &sql("INSERT INTO t VALUES (2)"),
    );
    assert_eq!(w.status, 200, "{}", w.json);
    assert_eq!(w.json["result"][0]["meta"]["served_by_primary"], true);
    let r = up.query_db(REGION_B, "shop", w.bookmark.as_deref().unwrap(), &select);
    assert_eq!(count(&r), 6, "{}", r.json);
    let reads = up
        .metric(REGION_B, "walrelay_fleet_replica_reads_total")
        .expect("the replica reads metric");
    assert!(reads >= 6, "replica reads {reads}");

    // kill -9 every fleet node: the database's primary reopens on another
    // port, and each replica follows it there. Every answer meanwhile is
    // right; within a few seconds the replicas serve the new writes.
    for node in 0..3 {
        signal(dir.path(), &format!("node-{node}"), libc::SIGKILL);
    }
    let w = until("a write after kill -9", 60, || {
        let r = up.query_db(
            FLEET,
            "shop",
            "first-primary",
            &sql("INSERT INTO t VALUES (3)"),
        );
        (r.status == 200).then_some(r)
    });
    let bookmark = w.bookmark.clone().unwrap();
    for node in [REGION_A, REGION_B] {
        until("the replica follows the reopened primary", 30, || {
            let r = up.query_db(node, "shop", &bookmark, &select);
            assert_eq!(r.status, 200, "{}", r.json);
            assert_eq!(count(&r), 7, "{}", r.json);
            served_by_replica(&r).then_some(r)
        });
    }

    let moves = up
        .metric(REGION_B, "walrelay_fleet_replica_leader_moves_total")
        .expect("the leader moves metric");
    assert!(
        moves >= 1,
        "the replica never followed its primary: {moves}"
    );

    // kill -9 a region replica: `up` restarts it and it resumes from its
    // files.
    signal(dir.path(), "slot-1", libc::SIGKILL);
    let w = up.query_db(
        FLEET,
        "shop",
        "first-primary",
        &sql("INSERT INTO t VALUES (4)"),
    );
    assert_eq!(w.status, 200, "{}", w.json);
    let bookmark = w.bookmark.clone().unwrap();
    until("the restarted replica serves again", 60, || {
        let r = up.query_db(REGION_A, "shop", &bookmark, &select);
        if r.status != 200 {
            return None;
        }
        assert_eq!(count(&r), 8, "{}", r.json);
        served_by_replica(&r).then_some(r)
    });

    // Export through every kind of node that does not host it: a region
    // (from its replica) and another fleet node (passed to the host);
    // import through a region (passed to the host).
    for node in [REGION_A, 5] {
        let (status, sql) = up.post_text(node, "/v1/databases/shop/export", "");
        assert_eq!(status, 200, "node {node}: {sql}");
        assert!(sql.contains("CREATE TABLE t(x)"), "node {node}: {sql}");
        assert_eq!(sql.matches("INSERT INTO").count(), 8, "node {node}: {sql}");
    }
    let (status, answer) = up.post_text(
        REGION_B,
        "/v1/databases/shop/import",
        "CREATE TABLE u(y); INSERT INTO u VALUES (1), (2);",
    );
    assert_eq!(status, 200, "{answer}");
    let r = up.query_db(
        FLEET,
        "shop",
        "first-primary",
        &sql("SELECT count(*) AS n FROM u"),
    );
    assert_eq!(count(&r), 2, "{}", r.json);

    // Deleted: no region answers it, and the replicas' files go.
    assert!(replica_files(dir.path(), "replica-0") > 0);
    let d = up.call(FLEET, "DELETE", "/v1/databases/shop", None);
    assert_eq!(d.status, 200, "{}", d.json);
    for node in [REGION_A, REGION_B] {
        until("a deleted database's replica refuses", 30, || {
            let r = up.query_db(node, "shop", "first-unconstrained", &select);
            (r.status == 404).then_some(r)
        });
    }
    for slot in ["replica-0", "replica-1"] {
        let deadline = Instant::now() + Duration::from_secs(30);
        while replica_files(dir.path(), slot) > 0 {
            assert!(
                Instant::now() < deadline,
                "{slot}: a deleted database's replica files stay"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let (status, _) = up.interrupt();
    assert!(status.success());
}
