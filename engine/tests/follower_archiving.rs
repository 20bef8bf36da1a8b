//! A follower archives every database it holds, not only `--database`:
//! real `walrelay follower` processes with a `--store` directory, fed by
//! in-process primaries of databases other than the followers' own. Each
//! database's history reaches the store (`walrelay restore --database
//! <id>` gives its rows), each follower's log of it is released down to
//! `--local-keep-bytes`, a clean stop archives what is confirmed, and a
//! killed follower restarts and goes on. In process, with a follower host
//! and its `HostArchiver`: an archived database the host closed is not
//! reopened, and one uploader slot serves several databases in turn.
//! And `walrelay up`'s fleet databases reach its store.

mod common;

use common::{Proc, cluster_key_file, free_port, join_addrs, key_args, wait_accepting};
use serde_json::json;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};
use walrelay_archive::{Archive, ArchiverConfig, Store};
use walrelay_engine::host_archiving::{HostArchiver, HostArchiverConfig};
use walrelay_engine::replication::{PrimaryConfig, ReplicatedPrimary};
use walrelay_engine::{ClusterKey, Constraint, Value};
use walrelay_replicator::net::Backend;
use walrelay_replicator::node::follower_host::{FollowerHost, FollowerHostConfig};
use walrelay_replicator::shared_log::{Inspected, SharedLog};
use walrelay_replicator::{Bookmark, DatabaseId};

const KEEP_BYTES: u64 = 64 << 10;

/// The databases the primaries write (neither is the followers' own, 1).
const DATABASES: [u64; 2] = [100, 101];

struct Followers {
    root: PathBuf,
    store: PathBuf,
    key: PathBuf,
    addrs: Vec<SocketAddr>,
    procs: Vec<Proc>,
}

impl Followers {
    /// Followers 0, 1, 2 with these upload lags.
    fn start(root: &Path, key: &Path, archive_lag_ms: [u64; 3]) -> Followers {
        let addrs: Vec<SocketAddr> = (0..3).map(|_| free_port()).collect();
        let mut f = Followers {
            root: root.to_path_buf(),
            store: root.join("store"),
            key: key.to_path_buf(),
            addrs,
            procs: Vec::new(),
        };
        f.procs = (0..3).map(|i| f.spawn(i, archive_lag_ms[i])).collect();
        f
    }

    fn dir(&self, i: usize) -> PathBuf {
        self.root.join(format!("follower-{i}"))
    }

    /// Starts (or restarts) follower `i`: rank i, uploading at once (or
    /// after `archive_lag_ms`), keeping `KEEP_BYTES` archived locally.
    fn spawn(&self, i: usize, archive_lag_ms: u64) -> Proc {
        let addr = self.addrs[i];
        let peers: Vec<SocketAddr> = self.addrs.iter().filter(|p| **p != addr).copied().collect();
        let mut args: Vec<String> = [
            "follower",
            "--listen",
            &addr.to_string(),
            "--dir",
            &self.dir(i).display().to_string(),
            "--peers",
            &join_addrs(&peers),
            "--store",
            &self.store.display().to_string(),
            "--archive-rank",
            &i.to_string(),
            "--archive-lag-ms",
            &archive_lag_ms.to_string(),
            "--archive-lag-bytes",
            &(1u64 << 20).to_string(),
            "--local-keep-bytes",
            &KEEP_BYTES.to_string(),
        ]
        .map(String::from)
        .to_vec();
        args.extend(key_args(&self.key));
        let mut p = Proc::spawn(&format!("follower {i}"), &args);
        p.wait_line("listening");
        wait_accepting(addr, "a follower");
        p
    }
}

fn primary(dir: &Path, id: u64, addrs: &[SocketAddr], key: &ClusterKey) -> ReplicatedPrimary {
    let mut c = PrimaryConfig::new(
        dir.join(format!("db-{id}.sqlite")),
        addrs.to_vec(),
        Some(key.clone()),
    );
    c.database = DatabaseId(id);
    c.confirm_timeout_ms = 10_000;
    ReplicatedPrimary::start(c).expect("primary")
}

/// Inserts rows `from..from + n` (each with a `blob`-byte body, one
/// transaction each); the bookmark after them.
fn write_rows(p: &ReplicatedPrimary, from: i64, n: i64, blob: i64) -> Bookmark {
    let s = p
        .database()
        .session(Constraint::FirstPrimary)
        .expect("session");
    s.prepare("CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, body BLOB)")
        .run()
        .expect("create");
    for i in from..from + n {
        s.prepare("INSERT INTO t(id, body) VALUES (?1, randomblob(?2))")
            .bind([Value::Integer(i), Value::Integer(blob)])
            .run()
            .expect("insert");
    }
    s.bookmark().expect("bookmark")
}

/// Waits until the store's archived end of `id` reaches `at`.
fn wait_archived(store: &Path, id: u64, at: Bookmark, within: Duration) {
    let store = Store::open(store.to_str().expect("utf-8")).expect("store");
    let archive = Archive::new(store, DatabaseId(id));
    let deadline = Instant::now() + within;
    loop {
        if archive.manifest().is_ok_and(|m| m.log_end >= at) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "database {id}: the store never reached {at}: {:?}",
            archive.manifest().map(|m| m.log_end)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// What a follower's shared log holds of database `id` (read without
/// changing it, while the follower runs).
fn in_shared_log(follower_dir: &Path, id: u64) -> Option<Inspected> {
    SharedLog::inspect(&follower_dir.join("shared"))
        .ok()?
        .into_iter()
        .find(|i| i.database == DatabaseId(id))
}

/// Waits until a follower released a prefix of database `id` and keeps
/// no more of its records live than about the keep size (the release
/// keeps at least `KEEP_BYTES` of the newest records, plus the one that
/// crosses it).
fn wait_released(follower_dir: &Path, id: u64, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let held = in_shared_log(follower_dir, id);
        if held.is_some_and(|i| i.start > Bookmark::ZERO && i.live_bytes <= 2 * KEEP_BYTES) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{}: database {id}'s log was never released down to {KEEP_BYTES} bytes: {held:?}",
            follower_dir.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `walrelay restore` of database `id`'s newest archived state: its rows'
/// ids and total body bytes.
fn restored(root: &Path, store: &Path, id: u64) -> (Vec<i64>, i64) {
    let out = root.join(format!("restored-{id}.db"));
    let _ = std::fs::remove_file(&out);
    let r = Command::new(env!("CARGO_BIN_EXE_walrelay"))
        .args(["restore", "--store"])
        .arg(store)
        .args(["--database", &id.to_string(), "--out"])
        .arg(&out)
        .output()
        .expect("run walrelay restore");
    assert!(
        r.status.success(),
        "walrelay restore --database {id}: {}",
        String::from_utf8_lossy(&r.stderr)
    );
    let c = rusqlite::Connection::open(&out).expect("open the restored database");
    let mut q = c.prepare("SELECT id FROM t ORDER BY id").expect("select");
    let ids: Vec<i64> = q
        .query_map([], |r| r.get(0))
        .expect("query")
        .map(|r| r.expect("row"))
        .collect();
    let bytes: i64 = c
        .query_row("SELECT total(length(body)) FROM t", [], |r| {
            r.get::<_, f64>(0)
        })
        .expect("sum") as i64;
    (ids, bytes)
}

#[test]
fn every_database_a_follower_holds_reaches_the_store_and_its_log_is_released_down_to_the_keep_size()
{
    let dir = tempfile::tempdir().expect("dir");
    let (key_path, key) = cluster_key_file(dir.path());
    let f = Followers::start(dir.path(), &key_path, [0; 3]);
    let primaries: Vec<ReplicatedPrimary> = DATABASES
        .iter()
        .map(|id| primary(dir.path(), *id, &f.addrs, &key))
        .collect();
    // Enough log for several segments (64 KiB, then doubling).
    let ends: Vec<Bookmark> = primaries
        .iter()
        .map(|p| write_rows(p, 0, 150, 8000))
        .collect();
    for (id, at) in DATABASES.iter().zip(&ends) {
        wait_archived(&f.store, *id, *at, Duration::from_secs(60));
    }
    for id in DATABASES {
        for i in 0..3 {
            wait_released(&f.dir(i), id, Duration::from_secs(30));
        }
        let (ids, bytes) = restored(dir.path(), &f.store, id);
        assert_eq!(ids, (0..150).collect::<Vec<_>>(), "database {id}'s rows");
        assert_eq!(bytes, 150 * 8000, "database {id}'s bodies");
    }
    // With nothing left to archive, the uploaders end (and say so).
    let deadline = Instant::now() + Duration::from_secs(30);
    for p in &f.procs {
        for id in DATABASES {
            let needle = format!("database={}", DatabaseId(id));
            while p
                .error_lines("uploader stopped: everything confirmed is archived")
                .iter()
                .all(|l| !l.contains(&needle))
            {
                assert!(
                    Instant::now() < deadline,
                    "{}: no idle uploader of database {id}: {:#?}",
                    p.name,
                    p.lines()
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    // The followers' own database was never written: nothing of it here.
    let store = Store::open(f.store.to_str().expect("utf-8")).expect("store");
    assert!(Archive::new(store, DatabaseId(1)).manifest().is_err());
    for p in primaries {
        p.stop(Duration::from_secs(10)).expect("primary stops");
    }
}

#[test]
fn stopping_a_follower_archives_what_every_database_confirmed_before_it_exits() {
    let dir = tempfile::tempdir().expect("dir");
    let (key_path, key) = cluster_key_file(dir.path());
    // Uploads wait ten minutes: only the stop moves records into the
    // store within the test.
    let mut f = Followers::start(dir.path(), &key_path, [600_000; 3]);
    let primaries: Vec<ReplicatedPrimary> = DATABASES
        .iter()
        .map(|id| primary(dir.path(), *id, &f.addrs, &key))
        .collect();
    let ends: Vec<Bookmark> = primaries
        .iter()
        .map(|p| write_rows(p, 0, 20, 1000))
        .collect();
    for p in primaries {
        p.stop(Duration::from_secs(10)).expect("primary stops");
    }
    // The leaders' last confirmation, sent as each stops, tells the
    // followers the last records are confirmed.
    std::thread::sleep(Duration::from_millis(500));
    let store = Store::open(f.store.to_str().expect("utf-8")).expect("store");
    for id in DATABASES {
        assert!(archived(&store, id) == Bookmark::ZERO, "nothing yet");
    }
    // A clean stop of the rank 0 follower alone.
    let p = &mut f.procs[0];
    p.interrupt();
    let status = p.child.try_wait().ok().flatten();
    assert!(
        status.is_some_and(|s| s.success()),
        "{} stopped cleanly: {:#?}",
        p.name,
        p.lines()
    );
    for (id, at) in DATABASES.iter().zip(&ends) {
        assert!(archived(&store, *id) >= *at, "database {id} archived");
        let (ids, _) = restored(dir.path(), &f.store, *id);
        assert_eq!(ids, (0..20).collect::<Vec<_>>(), "database {id}'s rows");
    }
}

#[test]
fn a_killed_follower_restarts_and_archives_its_databases_from_where_the_store_is() {
    let dir = tempfile::tempdir().expect("dir");
    let (key_path, key) = cluster_key_file(dir.path());
    // Only follower 0 uploads within the test.
    let mut f = Followers::start(dir.path(), &key_path, [0, 600_000, 600_000]);
    let primaries: Vec<ReplicatedPrimary> = DATABASES
        .iter()
        .map(|id| primary(dir.path(), *id, &f.addrs, &key))
        .collect();
    let ends: Vec<Bookmark> = primaries
        .iter()
        .map(|p| write_rows(p, 0, 20, 1000))
        .collect();
    for (id, at) in DATABASES.iter().zip(&ends) {
        wait_archived(&f.store, *id, *at, Duration::from_secs(30));
    }
    // kill -9 follower 0; the others confirm more; it comes back.
    f.procs[0].kill();
    let more: Vec<Bookmark> = primaries
        .iter()
        .map(|p| write_rows(p, 20, 20, 1000))
        .collect();
    f.procs[0] = f.spawn(0, 0);
    for (id, at) in DATABASES.iter().zip(&more) {
        wait_archived(&f.store, *id, *at, Duration::from_secs(30));
        let (ids, _) = restored(dir.path(), &f.store, *id);
        assert_eq!(ids, (0..40).collect::<Vec<_>>(), "database {id}'s rows");
    }
    for p in primaries {
        p.stop(Duration::from_secs(10)).expect("primary stops");
    }
}

/// An in-process follower host (the only follower: W = 1) whose
/// databases a [`HostArchiver`] archives into `store` with `max_running`
/// uploaders.
fn host_with_archiver(
    dir: &Path,
    store: &Store,
    max_running: usize,
) -> (Arc<FollowerHost>, HostArchiver) {
    let mut config = FollowerHostConfig::new(free_port(), dir.join("follower"));
    config.backend = Backend::Std;
    let host = Arc::new(FollowerHost::start(config).expect("host"));
    let mut a = ArchiverConfig::new(DatabaseId(0), dir.join("unused"));
    a.max_lag_ms = 0;
    a.max_lag_bytes = 0;
    a.local_keep_bytes = KEEP_BYTES;
    let archiver = HostArchiver::start(
        Arc::clone(&host),
        store.clone(),
        HostArchiverConfig {
            archiver: a,
            work_dir: dir.join("follower").join("archive"),
            max_running,
            skip: None,
        },
    )
    .expect("host archiver");
    (host, archiver)
}

fn unauthenticated_primary(dir: &Path, id: u64, host: &FollowerHost) -> ReplicatedPrimary {
    let mut c = PrimaryConfig::new(dir.join(format!("db-{id}.sqlite")), vec![host.addr()], None);
    c.database = DatabaseId(id);
    ReplicatedPrimary::start(c).expect("primary")
}

/// Runs `walrelay primary` for database `id` against `host` with one
/// demo writer for a couple of seconds; it stops cleanly and exits, which
/// hangs up its connection (an in-process primary's would stay open).
fn primary_process(dir: &Path, id: u64, host: &FollowerHost) {
    let args: Vec<String> = [
        "primary",
        "--dir",
        &dir.join(format!("primary-{id}")).display().to_string(),
        "--followers",
        &host.addr().to_string(),
        "--listen",
        &free_port().to_string(),
        "--database",
        &id.to_string(),
        "--demo-writers",
        "1",
        "--seconds",
        "2",
        "--insecure-replication",
    ]
    .map(String::from)
    .to_vec();
    let mut p = Proc::spawn(&format!("primary {id}"), &args);
    let status = p.wait_exit();
    assert!(status.success(), "primary {id}: {:#?}", p.lines());
}

/// The store's archived end of `id`.
fn archived(store: &Store, id: u64) -> Bookmark {
    Archive::new(store.clone(), DatabaseId(id))
        .manifest()
        .map_or(Bookmark::ZERO, |m| m.log_end)
}

#[test]
fn an_archived_database_the_host_closed_stays_closed_and_its_uploader_returns_with_new_records() {
    let dir = tempfile::tempdir().expect("dir");
    let store = Store::open(dir.path().join("store").to_str().expect("utf-8")).expect("store");
    let (host, archiver) = host_with_archiver(dir.path(), &store, 16);
    primary_process(dir.path(), 100, &host);
    let db = host.database(DatabaseId(100)).expect("held");
    let confirmed = db.confirmed().expect("confirmed");
    assert!(confirmed > Bookmark::ZERO);
    common::wait_until(
        "everything confirmed archived",
        Duration::from_secs(30),
        || archived(&store, 100) >= confirmed,
    );
    common::wait_until("the uploader ends", Duration::from_secs(30), || {
        archiver.status().running == 0
    });
    common::wait_until(
        "the host closes the database",
        Duration::from_secs(30),
        || {
            host.close_idle(Duration::ZERO);
            host.open_databases().is_empty()
        },
    );
    let started = archiver.status().started;
    // Several of the supervisor's ticks: it reopens nothing, starts nothing.
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        host.open_databases().is_empty(),
        "{:?}",
        host.open_databases()
    );
    assert_eq!(archiver.status().started, started);
    assert_eq!(archiver.status().idle, 1);

    // New records: an uploader again, and they reach the store.
    primary_process(dir.path(), 100, &host);
    let more = db.confirmed().expect("confirmed");
    assert!(more > confirmed);
    common::wait_until("the new records archived", Duration::from_secs(30), || {
        archived(&store, 100) >= more
    });
    assert!(archiver.status().started > started);
    archiver.stop();
}

#[test]
fn with_one_uploader_slot_every_database_still_reaches_the_store_in_turn() {
    let dir = tempfile::tempdir().expect("dir");
    let store = Store::open(dir.path().join("store").to_str().expect("utf-8")).expect("store");
    let (host, archiver) = host_with_archiver(dir.path(), &store, 1);
    let ids = [100u64, 101, 102];
    let primaries: Vec<ReplicatedPrimary> = ids
        .iter()
        .map(|id| unauthenticated_primary(dir.path(), *id, &host))
        .collect();
    // Writes keep coming to every database while they wait their turn.
    for round in 0..3 {
        for p in &primaries {
            write_rows(p, round * 10, 10, 100);
        }
        assert!(archiver.status().running <= 1);
    }
    let ends: Vec<Bookmark> = primaries
        .iter()
        .map(|p| write_rows(p, 30, 1, 100))
        .collect();
    for (id, at) in ids.iter().zip(&ends) {
        wait_archived(&dir.path().join("store"), *id, *at, Duration::from_secs(60));
        assert!(archiver.status().running <= 1);
    }
    for p in primaries {
        p.stop(Duration::from_secs(10)).expect("primary stops");
    }
    archiver.stop();
}

/// The databases the store holds history of (the first part of its keys).
fn databases_in_store(store: &Store) -> Vec<u64> {
    let mut ids: Vec<u64> = store
        .list("", None)
        .unwrap_or_default()
        .iter()
        .filter_map(|l| l.key.split('/').next())
        .filter_map(|p| u64::from_str_radix(p, 16).ok())
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// Rows of `t` in database `id`'s newest archived state (None if it
/// cannot be restored yet or has no such table).
fn archived_rows(root: &Path, store: &Path, id: u64) -> Option<i64> {
    let out = root.join(format!("restored-{id}.db"));
    let _ = std::fs::remove_file(&out);
    let r = Command::new(env!("CARGO_BIN_EXE_walrelay"))
        .args(["restore", "--store"])
        .arg(store)
        .args(["--database", &id.to_string(), "--out"])
        .arg(&out)
        .output()
        .ok()?;
    if !r.status.success() {
        return None;
    }
    let c = rusqlite::Connection::open(&out).ok()?;
    c.query_row("SELECT count(*) FROM t", [], |r| r.get(0)).ok()
}

#[test]
fn up_archives_the_fleet_databases_its_nodes_replicate_to_its_followers() {
    let dir = tempfile::tempdir().expect("dir");
    let base = common::up::free_base();
    let args = [
        "--writers",
        "1",
        "--heartbeat-ms",
        "500",
        "--net",
        "std",
        "--archive-lag-ms",
        "200",
    ];
    let mut up = common::up::Up::start(dir.path(), base, &args);
    up.wait_serving(2, Duration::from_secs(60));
    let until_ok = |what: &str, f: &dyn Fn() -> common::up::Reply| {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let r = f();
            if r.status == 200 {
                return;
            }
            assert!(Instant::now() < deadline, "{what}: {} {}", r.status, r.json);
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    // Nodes 3..=5 are the fleet's.
    for name in ["alpha", "beta"] {
        until_ok("create", &|| {
            up.call(3, "POST", "/v1/databases", Some(&json!({ "name": name })))
        });
        let path = format!("/v1/databases/{name}/query");
        until_ok("create table", &|| {
            up.call(
                4,
                "POST",
                &path,
                Some(&json!({ "sql": "CREATE TABLE IF NOT EXISTS t(x)" })),
            )
        });
        for i in 0..10 {
            until_ok("insert", &|| {
                up.call(
                    5,
                    "POST",
                    &path,
                    Some(&json!({ "sql": format!("INSERT INTO t VALUES ({i})") })),
                )
            });
        }
    }
    // Both reach the store (beside `main`, 1, and the fleet's catalog).
    let store_dir = dir.path().join("store");
    let store = Store::open(store_dir.to_str().expect("utf-8")).expect("store");
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let fleet: Vec<u64> = databases_in_store(&store)
            .into_iter()
            .filter(|id| *id >= 16)
            .collect();
        let full = fleet
            .iter()
            .filter(|id| archived_rows(dir.path(), &store_dir, **id) == Some(10))
            .count();
        if full == 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the fleet's databases never reached the store: {fleet:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let (status, lines) = up.interrupt();
    assert!(status.success(), "up stopped cleanly: {lines:#?}");
}
