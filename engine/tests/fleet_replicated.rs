//! Fleet databases replicated to real follower processes: opened and
//! closed again and again (lazy open, idle close, eviction), they keep
//! every write, and a closed one leaves no connection or thread behind.
//! Each keeps only the fleet's small tail of confirmed records in memory.

mod common;

use walrelay_engine::{Constraint, Value};
use walrelay_replicator::DatabaseId;

fn count(path: &str) -> usize {
    std::fs::read_dir(path).map_or(0, |d| d.count())
}

#[test]
fn replicated_databases_reopen_with_every_write_and_a_closed_one_leaves_no_connection_or_thread() {
    let dir = tempfile::tempdir().unwrap();
    let node = common::fleet::ReplicatedHost::start(dir.path(), 3, 2, 0);
    let host = &node.host;
    let ids: Vec<DatabaseId> = (0..3).map(|i| DatabaseId(1_000 + i)).collect();
    node.add(&ids, "r");
    let write = |id: DatabaseId, round: i64| {
        let open = host.acquire(id).unwrap();
        let s = open.database().session(Constraint::FirstPrimary).unwrap();
        s.prepare("CREATE TABLE IF NOT EXISTS t(x)").run().unwrap();
        s.prepare("INSERT INTO t VALUES (?1)")
            .bind([Value::Integer(round)])
            .run()
            .unwrap();
    };
    // A first round, then the baseline: nothing open.
    for id in &ids {
        write(*id, 0);
    }
    host.close_idle();
    assert!(host.open_ids().is_empty());
    std::thread::sleep(std::time::Duration::from_millis(300));
    let (fds0, threads0) = (count("/proc/self/fd"), count("/proc/self/task"));
    // Ten rounds of open, write, evict (cap 2 of 3) and close.
    for round in 1..=10 {
        for id in &ids {
            write(*id, round);
        }
        host.close_idle();
    }
    // Connections and threads end asynchronously after a close: wait (up
    // to 10 s, so a loaded machine does not fail it) until they are back
    // near the baseline; a leak never gets there.
    let settled = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let (fds1, threads1) = loop {
        std::thread::sleep(std::time::Duration::from_millis(100));
        let now = (count("/proc/self/fd"), count("/proc/self/task"));
        if (now.0 <= fds0 + 2 && now.1 <= threads0 + 2) || std::time::Instant::now() > settled {
            break now;
        }
    };
    println!("fds {fds0} -> {fds1}, threads {threads0} -> {threads1} after 30 opens and closes");
    assert!(fds1 <= fds0 + 2, "connections leak: {fds0} -> {fds1} fds");
    assert!(
        threads1 <= threads0 + 2,
        "threads leak: {threads0} -> {threads1}"
    );
    // Every write of every round is there.
    for id in &ids {
        let open = host.acquire(*id).unwrap();
        let n = open
            .database()
            .session(Constraint::FirstPrimary)
            .unwrap()
            .prepare("SELECT count(*) AS n FROM t")
            .first()
            .unwrap()
            .unwrap();
        assert_eq!(n.get("n"), Some(&Value::Integer(11)));
    }
    host.close_all();
}

#[test]
fn every_database_a_fleet_node_opens_keeps_the_fleets_small_tail_not_a_dedicated_primarys() {
    use walrelay_engine::fleet::host::{FLEET_TAIL_LIMIT_BYTES, ReplicatedOpener};
    use walrelay_engine::replication::PrimaryConfig;
    let dedicated = PrimaryConfig::new("unused", vec![], None);
    let opener = ReplicatedOpener::new(dedicated.clone(), 5_000);
    assert_eq!(opener.template.tail_limit_bytes, FLEET_TAIL_LIMIT_BYTES);
    assert!(FLEET_TAIL_LIMIT_BYTES * 16 <= dedicated.tail_limit_bytes);
}
