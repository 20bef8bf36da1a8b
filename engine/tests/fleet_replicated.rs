//! Fleet databases replicated to real follower processes: opened and
//! closed again and again (lazy open, idle close, eviction), they keep
//! every write, and a closed one leaves no connection or thread behind.

mod common;

use common::{cluster_key_file, spawn_followers};
use std::sync::Arc;
use walrelay_engine::fleet::host::{Host, HostConfig, ReplicatedOpener};
use walrelay_engine::fleet::names::{AccountId, DatabaseName, DatabaseUuid};
use walrelay_engine::replication::PrimaryConfig;
use walrelay_engine::{Constraint, Value};
use walrelay_replicator::DatabaseId;
use walrelay_replicator::net::Backend;

fn count(path: &str) -> usize {
    std::fs::read_dir(path).map_or(0, |d| d.count())
}

#[test]
fn replicated_databases_reopen_with_every_write_and_a_closed_one_leaves_no_connection_or_thread() {
    let dir = tempfile::tempdir().unwrap();
    let (key_path, key) = cluster_key_file(dir.path());
    let (_followers, addrs) = spawn_followers(dir.path(), 3, &key_path);
    let mut template = PrimaryConfig::new(dir.path().join("unused"), addrs, Some(key));
    template.backend = Backend::Std;
    let host = Arc::new(
        Host::open(
            HostConfig {
                dir: dir.path().join("dbs"),
                max_open: 2,
                idle_close_ms: 0,
                max_hosted: 100,
            },
            Box::new(ReplicatedOpener::new(template, 5_000)),
        )
        .unwrap(),
    );
    let ids: Vec<DatabaseId> = (0..3).map(|i| DatabaseId(1_000 + i)).collect();
    for (i, id) in ids.iter().enumerate() {
        host.init(
            DatabaseUuid::random(),
            *id,
            &AccountId::default_account(),
            &DatabaseName::new(&format!("r{i}")).unwrap(),
        )
        .unwrap();
        host.activate(*id).unwrap();
    }
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
