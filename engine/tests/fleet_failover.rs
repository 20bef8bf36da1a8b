//! A fleet node that hangs (SIGSTOP: it neither answers nor exits, so `up`
//! does not restart it) has its databases moved by the control plane to a
//! live node: they serve again with every acknowledged write, the region
//! replicas follow them, and when the old node wakes up it forgets its
//! stale copies instead of taking the databases back.

mod common;

use common::up::{Reply, Up, free_base, signal, until};
use serde_json::json;
use std::path::Path;
use std::time::{Duration, Instant};

const REGION_A: u16 = 1;
const CONTROL: u16 = 3;
/// The fleet node that hangs (`up`'s location `fleet-1`).
const HUNG: u16 = 4;

/// The node a routing table (another process's `routes.db`) names for a
/// database.
fn route_node(node_dir: &Path, uuid: &str) -> Option<String> {
    let db = rusqlite::Connection::open_with_flags(
        node_dir.join("routes.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .ok()?;
    db.query_row("SELECT node FROM routes WHERE uuid = ?1", [uuid], |r| {
        r.get(0)
    })
    .ok()
}

fn count(r: &Reply) -> u64 {
    r.json["result"][0]["results"][0]["n"]
        .as_u64()
        .unwrap_or_else(|| panic!("no count in {}", r.json))
}

#[test]
fn a_hung_nodes_databases_move_to_a_live_node_with_every_acknowledged_write() {
    let dir = tempfile::tempdir().unwrap();
    let base = free_base();
    let args = [
        "--writers",
        "0",
        "--heartbeat-ms",
        "500",
        "--net",
        "std",
        "--fleet-failover-ms",
        "2000",
    ];
    let mut up = Up::start(dir.path(), base, &args);
    up.wait_serving(2, Duration::from_secs(60));
    let created = until("create", 60, || {
        let r = up.call(
            CONTROL,
            "POST",
            "/v1/databases",
            Some(&json!({"name": "far", "primary_location_hint": "fleet-1"})),
        );
        (r.status == 200).then_some(r)
    });
    let uuid = created.json["result"]["uuid"].as_str().unwrap().to_string();
    let sql = |s: &str| json!({ "sql": s });
    let write = |v: u64| {
        up.query_db(
            CONTROL,
            "far",
            "first-primary",
            &sql(&format!("INSERT INTO t VALUES ({v})")),
        )
    };
    until("create table", 60, || {
        let r = up.query_db(CONTROL, "far", "first-primary", &sql("CREATE TABLE t(x)"));
        (r.status == 200).then_some(r)
    });
    let mut acknowledged = 0u64;
    for v in 0..20 {
        let r = write(v);
        assert_eq!(r.status, 200, "{}", r.json);
        assert_eq!(r.json["result"][0]["meta"]["served_by_region"], "fleet-1");
        acknowledged += 1;
    }
    let hosted_dir = dir.path().join("node-1").join("dbs");
    let hosted = |d: &Path| {
        std::fs::read_dir(d).map_or(0, |e| {
            e.filter_map(Result::ok)
                .filter(|e| e.path().join("state.json").exists())
                .count()
        })
    };
    assert_eq!(hosted(&hosted_dir), 1);

    // The node hangs: within the failover time plus an open, writes run
    // again, elsewhere, after every acknowledged one.
    signal(dir.path(), "node-1", libc::SIGSTOP);
    let hung_at = Instant::now();
    // (A request passed to the hung node meanwhile waits for it in vain:
    // clients retry once the database has moved.)
    until("the control plane moves the database", 60, || {
        let moved = up.metric(CONTROL, "walrelay_fleet_failover_databases_moved_total")?;
        (moved >= 1).then_some(Reply {
            status: 200,
            bookmark: None,
            json: json!(moved),
        })
    });
    println!(
        "moved {} ms after the node hung",
        hung_at.elapsed().as_millis()
    );
    let w = until("a write after the failover", 60, || {
        let r = write(100);
        (r.status == 200).then_some(r)
    });
    acknowledged += 1;
    let region = w.json["result"][0]["meta"]["served_by_region"].clone();
    assert_ne!(region, "fleet-1", "{}", w.json);
    println!(
        "writes ran again {} ms after the node hung, on {region}",
        hung_at.elapsed().as_millis()
    );
    let select = sql("SELECT count(*) AS n FROM t");
    let r = up.query_db(CONTROL, "far", w.bookmark.as_deref().unwrap(), &select);
    assert_eq!(count(&r), acknowledged, "{}", r.json);
    // The moved routing entry reaches the region (a request sent there
    // before it does goes to the hung node and times out: clients retry).
    let moved_to = up.http(match region.as_str() {
        Some("fleet-0") => 3,
        Some("fleet-2") => 5,
        other => panic!("moved to {other:?}"),
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while route_node(&dir.path().join("replica-0"), &uuid).as_deref() != Some(moved_to.as_str()) {
        assert!(
            Instant::now() < deadline,
            "the moved route never reached region-a"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The region replica follows the new primary.
    until("the replica follows the moved primary", 30, || {
        // Until the moved route reaches the region, its requests go to the
        // hung node and fail (503): clients retry.
        let r = up.query_db(REGION_A, "far", w.bookmark.as_deref().unwrap(), &select);
        if r.status == 503 {
            return None;
        }
        assert_eq!(r.status, 200, "{}", r.json);
        assert_eq!(count(&r), acknowledged, "{}", r.json);
        (r.json["result"][0]["meta"]["served_by_primary"] == json!(false)).then_some(r)
    });

    // The old node wakes up: its stale copy is forgotten within a
    // heartbeat, and the database stays where it was moved; writes
    // through the old node reach it there.
    signal(dir.path(), "node-1", libc::SIGCONT);
    let deadline = Instant::now() + Duration::from_secs(30);
    while hosted(&hosted_dir) > 0 {
        assert!(
            Instant::now() < deadline,
            "the woken node kept its stale copy"
        );
        let _ = up.query_db(HUNG, "far", "first-unconstrained", &select);
        std::thread::sleep(Duration::from_millis(200));
    }
    let w = until("a write through the woken node", 30, || {
        let r = up.query_db(
            HUNG,
            "far",
            "first-primary",
            &sql("INSERT INTO t VALUES (200)"),
        );
        (r.status == 200).then_some(r)
    });
    acknowledged += 1;
    assert_ne!(w.json["result"][0]["meta"]["served_by_region"], "fleet-1");
    let r = up.query_db(CONTROL, &uuid, w.bookmark.as_deref().unwrap(), &select);
    assert_eq!(count(&r), acknowledged, "{}", r.json);
    let (status, _) = up.interrupt();
    assert!(status.success());
}
