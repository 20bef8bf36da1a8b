//! The fleet in one process: creation order, lookup by name and uuid,
//! heartbeats repairing every injected fault, lazy open and eviction.

mod common;

use common::fleet::{NODE_URL, one_node};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Duration;
use walrelay_engine::fleet::FleetError;
use walrelay_engine::fleet::catalog::CatalogError;
use walrelay_engine::fleet::control::ControlError;
use walrelay_engine::fleet::heartbeat::beat_due;
use walrelay_engine::fleet::host::{HostError, Lifecycle};
use walrelay_engine::fleet::names::{AccountId, DatabaseName};
use walrelay_engine::{Constraint, Value};
use walrelay_replicator::DatabaseId;

fn name(n: &str) -> DatabaseName {
    DatabaseName::new(n).unwrap()
}

fn acct() -> AccountId {
    AccountId::default_account()
}

/// Runs heartbeats until every due one has beaten once more.
fn one_heartbeat(node: &common::fleet::OneNode, due: &mut HashMap<DatabaseId, std::time::Instant>) {
    std::thread::sleep(Duration::from_millis(
        node.fleet.config.heartbeat_ms + node.fleet.config.heartbeat_jitter_ms + 5,
    ));
    beat_due(&node.fleet, due);
}

#[test]
fn a_created_database_is_queryable_by_name_and_by_uuid_without_reading_the_catalog() {
    let dir = tempfile::tempdir().unwrap();
    let node = one_node(dir.path(), 8, 60_000, 50);
    let row = node.control.create(&acct(), &name("shop"), None).unwrap();
    assert_eq!(row.node, NODE_URL);
    let reads_before = node.reads.total();
    for key in [row.uuid.to_string(), "shop".to_string()] {
        let _on_path = walrelay_engine::fleet::catalog::QueryPathGuard::enter();
        let route = node.fleet.route(&key, &acct()).unwrap();
        let open = node.fleet.acquire(&route).unwrap();
        let s = open.database().session(Constraint::FirstPrimary).unwrap();
        s.prepare("CREATE TABLE IF NOT EXISTS t(x)").run().unwrap();
        s.prepare("INSERT INTO t VALUES (1)").run().unwrap();
    }
    assert_eq!(
        node.reads.total(),
        reads_before,
        "the query path read the catalog"
    );
    assert_eq!(node.reads.on_query_path(), 0);
    assert!(matches!(
        node.fleet.route("nope", &acct()),
        Err(FleetError::Unknown(_))
    ));
}

#[test]
fn names_are_unique_per_account_and_listing_pages_through_them() {
    let dir = tempfile::tempdir().unwrap();
    let node = one_node(dir.path(), 8, 60_000, 50);
    for i in 0..5 {
        node.control
            .create(&acct(), &name(&format!("db-{i}")), None)
            .unwrap();
    }
    let other = AccountId::new("other").unwrap();
    node.control.create(&other, &name("db-0"), None).unwrap();
    assert!(matches!(
        node.control.create(&acct(), &name("db-1"), None),
        Err(ControlError::Catalog(CatalogError::NameTaken(_)))
    ));
    let p1 = node.control.list(&acct(), None, 1, 2).unwrap();
    let p3 = node.control.list(&acct(), None, 3, 2).unwrap();
    assert_eq!(p1.total, 5);
    assert_eq!(p1.rows.len(), 2);
    assert_eq!(p3.rows.len(), 1);
    assert_eq!(node.control.list(&other, None, 1, 10).unwrap().total, 1);
    // A deleted name can be taken again.
    let row = node.control.by_name(&acct(), &name("db-1")).unwrap();
    node.control.delete(row.uuid).unwrap();
    node.control.create(&acct(), &name("db-1"), None).unwrap();
}

#[test]
fn a_catalog_write_that_fails_after_init_leaves_an_orphan_that_deletes_itself_within_one_heartbeat()
{
    let dir = tempfile::tempdir().unwrap();
    let node = one_node(dir.path(), 8, 60_000, 50);
    node.catalog.fail_inserts.store(1, Ordering::SeqCst);
    let row = node.control.create(&acct(), &name("retry"), None).unwrap();
    // Two databases were initialised: the orphan and the one checkpointed.
    let unconfirmed = node.host.unconfirmed_ids();
    assert_eq!(unconfirmed.len(), 1, "only the orphan is unconfirmed");
    let orphan = unconfirmed[0];
    assert_ne!(orphan, row.database_id, "each attempt takes fresh ids");
    assert_eq!(
        node.host.state(orphan).unwrap().unwrap().lifecycle,
        Lifecycle::Initialised
    );
    let mut due = HashMap::new();
    beat_due(&node.fleet, &mut due);
    one_heartbeat(&node, &mut due);
    assert_eq!(
        node.host.state(orphan).unwrap().unwrap().lifecycle,
        Lifecycle::Deleted
    );
    assert!(node.host.unconfirmed_ids().is_empty());
    // The real one serves.
    let route = node.fleet.route("retry", &acct()).unwrap();
    assert_eq!(route.database_id, row.database_id.0);
    node.fleet.acquire(&route).unwrap();
}

#[test]
fn a_failed_activation_is_completed_by_the_next_heartbeat() {
    let dir = tempfile::tempdir().unwrap();
    let node = one_node(dir.path(), 8, 60_000, 50);
    node.api.fail_activate.store(1, Ordering::SeqCst);
    let row = node.control.create(&acct(), &name("late"), None).unwrap();
    assert!(node.fleet.route("late", &acct()).is_err(), "no route yet");
    let mut due = HashMap::new();
    beat_due(&node.fleet, &mut due);
    one_heartbeat(&node, &mut due);
    let route = node.fleet.route("late", &acct()).unwrap();
    assert_eq!(route.database_id, row.database_id.0);
    node.fleet.acquire(&route).unwrap();
}

#[test]
fn a_removed_or_misdirected_routing_entry_is_rewritten_within_one_heartbeat() {
    let dir = tempfile::tempdir().unwrap();
    let node = one_node(dir.path(), 8, 60_000, 50);
    let row = node.control.create(&acct(), &name("moved"), None).unwrap();
    let route = node.fleet.route("moved", &acct()).unwrap();
    node.fleet.acquire(&route).unwrap(); // open: it heartbeats
    let mut due = HashMap::new();
    beat_due(&node.fleet, &mut due);

    node.routes.remove(row.uuid, row.database_id).unwrap();
    assert!(node.fleet.route("moved", &acct()).is_err());
    one_heartbeat(&node, &mut due);
    assert_eq!(node.fleet.route("moved", &acct()).unwrap().node, NODE_URL);

    let mut wrong = node.fleet.route("moved", &acct()).unwrap();
    wrong.node = "http://127.0.0.1:1".into();
    node.routes.put(wrong.clone()).unwrap();
    assert!(matches!(
        node.fleet.acquire(&wrong),
        Err(FleetError::Elsewhere(_))
    ));
    one_heartbeat(&node, &mut due);
    let fixed = node.fleet.route("moved", &acct()).unwrap();
    assert_eq!(fixed.node, NODE_URL);
    node.fleet.acquire(&fixed).unwrap();
    assert!(node.fleet.stats.routes_repaired.load(Ordering::Relaxed) >= 2);
}

#[test]
fn a_deleted_database_refuses_queries_even_when_a_stale_route_leads_to_it() {
    let dir = tempfile::tempdir().unwrap();
    let node = one_node(dir.path(), 8, 60_000, 50);
    let row = node.control.create(&acct(), &name("gone"), None).unwrap();
    let route = node.fleet.route("gone", &acct()).unwrap();
    {
        let open = node.fleet.acquire(&route).unwrap();
        open.database()
            .session(Constraint::FirstPrimary)
            .unwrap()
            .prepare("CREATE TABLE t(x)")
            .run()
            .unwrap();
    }
    let mut due = HashMap::new();
    beat_due(&node.fleet, &mut due);
    // The host is not told (a lost best-effort call): the catalog says
    // deleted, the route and the host do not, yet.
    node.api.fail_delete.store(1, Ordering::SeqCst);
    node.control.delete(row.uuid).unwrap();
    assert!(
        node.fleet.route("gone", &acct()).is_ok(),
        "the route is stale"
    );
    one_heartbeat(&node, &mut due);
    assert!(
        node.fleet.route("gone", &acct()).is_err(),
        "the route was removed"
    );
    // A stale copy of the route (another node's, say) still leads here.
    node.routes.put(route.clone()).unwrap();
    assert!(matches!(
        node.fleet.acquire(&route),
        Err(FleetError::Host(HostError::Deleted(_)))
    ));
    assert!(matches!(
        node.control.get(row.uuid),
        Err(ControlError::NotFound(_))
    ));
}

#[test]
fn open_databases_are_capped_least_recently_used_first_and_closed_when_idle() {
    let dir = tempfile::tempdir().unwrap();
    let node = one_node(dir.path(), 2, 100, 60_000);
    let mut routes = Vec::new();
    for i in 0..3 {
        node.control
            .create(&acct(), &name(&format!("lru-{i}")), None)
            .unwrap();
        routes.push(node.fleet.route(&format!("lru-{i}"), &acct()).unwrap());
    }
    for (i, r) in routes.iter().enumerate() {
        let open = node.fleet.acquire(r).unwrap();
        let s = open.database().session(Constraint::FirstPrimary).unwrap();
        s.prepare("CREATE TABLE t(x)").run().unwrap();
        s.prepare("INSERT INTO t VALUES (?1)")
            .bind([Value::Integer(i as i64)])
            .run()
            .unwrap();
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(node.host.open_ids().len(), 2, "the cap holds");
    assert_eq!(node.host.stats.evicted.load(Ordering::Relaxed), 1);
    // The evicted one reopens transparently with its data.
    let open = node.fleet.acquire(&routes[0]).unwrap();
    let row = open
        .database()
        .session(Constraint::FirstPrimary)
        .unwrap()
        .prepare("SELECT x FROM t")
        .first()
        .unwrap()
        .unwrap();
    assert_eq!(row.get("x"), Some(&Value::Integer(0)));
    // In use, it is not closed; idle, it is.
    std::thread::sleep(Duration::from_millis(150));
    node.host.close_idle();
    assert_eq!(node.host.open_ids(), vec![open.id()]);
    drop(open);
    node.host.close_idle();
    assert!(node.host.open_ids().is_empty());
    // Every database is busy: the next open is refused, not over the cap.
    let a = node.fleet.acquire(&routes[0]).unwrap();
    let b = node.fleet.acquire(&routes[1]).unwrap();
    assert!(matches!(
        node.fleet.acquire(&routes[2]),
        Err(FleetError::Host(HostError::Busy(2)))
    ));
    drop((a, b));
}
