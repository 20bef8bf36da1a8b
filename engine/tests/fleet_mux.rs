//! A fleet node's replicated databases share the node's replication
//! connections: one per follower, each database a channel on it (its own
//! process: it counts this process's sockets).

mod common;

use walrelay_engine::{Constraint, Value};
use walrelay_replicator::DatabaseId;

/// Distinct sockets this process holds open (the std transport holds
/// each connection's socket under three descriptors).
fn sockets() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| {
        d.flatten()
            .filter_map(|e| std::fs::read_link(e.path()).ok())
            .map(|l| l.to_string_lossy().into_owned())
            .filter(|l| l.starts_with("socket:"))
            .collect::<std::collections::HashSet<_>>()
            .len()
    })
}

#[test]
fn a_nodes_replicated_databases_share_one_connection_per_follower() {
    let dir = tempfile::tempdir().unwrap();
    let node = common::fleet::ReplicatedHost::start(dir.path(), 3, 16, 60_000);
    let host = &node.host;
    assert!(host.replication_mux().is_none(), "made at the first open");
    let ids: Vec<DatabaseId> = (0..6).map(|i| DatabaseId(2_000 + i)).collect();
    node.add(&ids, "m");
    let mut open = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let db = host.acquire(*id).unwrap();
        let s = db.database().session(Constraint::FirstPrimary).unwrap();
        s.prepare("CREATE TABLE t(x)").run().unwrap();
        s.prepare("INSERT INTO t VALUES (?1)")
            .bind([Value::Integer(i as i64)])
            .run()
            .unwrap();
        open.push(db);
    }
    // Six open databases, three followers: three real connections, a
    // channel per database and follower.
    let m = host.replication_mux().expect("the shared mux");
    assert_eq!(m.connections, 3, "{m:?}");
    assert_eq!(m.channels, 18, "{m:?}");
    assert_eq!(m.refusals, 0);
    // And the process holds no other socket: the elections that opened
    // the databases ran over the same connections.
    assert_eq!(sockets(), 3, "sockets of this process");
    drop(open);
    host.close_all();
    // Every write was confirmed by the followers: reopening finds them.
    for (i, id) in ids.iter().enumerate() {
        let db = host.acquire(*id).unwrap();
        let n = db
            .database()
            .session(Constraint::FirstPrimary)
            .unwrap()
            .prepare("SELECT x FROM t")
            .first()
            .unwrap()
            .unwrap();
        assert_eq!(n.get("x"), Some(&Value::Integer(i as i64)));
    }
    let m = host.replication_mux().expect("the shared mux");
    assert_eq!(
        m.connections, 3,
        "reopened over the same connections: {m:?}"
    );
    host.close_all();
}
