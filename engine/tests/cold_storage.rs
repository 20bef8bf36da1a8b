//! Cold storage through a whole cluster (in one process): followers
//! upload, restores equal the primary page for page, time travel restores
//! in place and can be undone, replicas bootstrap from the store. Each
//! test runs against the filesystem store and the S3 emulator.

mod common;

use serde_json::json;
use std::path::Path;
use std::time::{Duration, Instant};
use walrelay_archive::testing::each_store;
use walrelay_archive::{Archive, ArchiverConfig, NoProgress, Store, restore_to_file};
use walrelay_engine::local_cluster::{LocalCluster, LocalClusterConfig};
use walrelay_engine::replication::{ReplicaConfig, ReplicatedReplica};
use walrelay_engine::{Constraint, ReplicaOptions, Value};
use walrelay_replicator::net::Backend;
use walrelay_replicator::{Bookmark, DatabaseId};

/// A cluster whose followers upload at once (no lag bound), snapshot every
/// `snapshot_log_bytes` and keep nothing archived locally.
fn cluster(dir: &Path, store: &Store, snapshot_log_bytes: u64) -> LocalCluster {
    let mut a = ArchiverConfig::new(DatabaseId(1), dir.join("unused"));
    a.max_lag_ms = 0;
    a.max_lag_bytes = 0;
    a.object_bytes = 1 << 20;
    a.snapshot_log_bytes = snapshot_log_bytes;
    a.local_keep_bytes = 0;
    LocalCluster::start(
        dir,
        LocalClusterConfig {
            replica_regions: vec!["region-a".into()],
            archive: Some((store.clone(), a)),
            ..LocalClusterConfig::default()
        },
    )
    .expect("cluster")
}

/// Waits until the store's archived end reaches `at`.
fn wait_archived(store: &Store, at: Bookmark) {
    let archive = Archive::new(store.clone(), DatabaseId(1));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if archive.manifest().is_ok_and(|m| m.log_end >= at) {
            return;
        }
        assert!(Instant::now() < deadline, "the store never reached {at}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn write_rows(c: &LocalCluster, from: i64, n: i64, blob: usize) -> Bookmark {
    let s = c
        .primary
        .database()
        .session(Constraint::FirstPrimary)
        .unwrap();
    s.prepare("CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, body BLOB)")
        .run()
        .unwrap();
    for i in from..from + n {
        s.prepare("INSERT INTO t(id, body) VALUES (?1, randomblob(?2))")
            .bind([Value::Integer(i), Value::Integer(blob as i64)])
            .run()
            .unwrap();
    }
    s.prepare("DELETE FROM t WHERE id % 7 = 3").run().unwrap();
    s.bookmark().unwrap()
}

#[test]
fn a_restore_of_any_archived_bookmark_equals_the_primary_there_page_for_page() {
    let dir = tempfile::tempdir().unwrap();
    each_store("pages", dir.path(), false, |kind, store| {
        let cdir = dir.path().join(format!("c-{kind}"));
        let c = cluster(&cdir, store, 256 << 10);
        let archive = Archive::new(store.clone(), DatabaseId(1));
        // Rounds of writes, each archived before the next, until the
        // history holds a snapshot with log after it (so restores are
        // from the log alone, from a snapshot, and from both).
        let mut shadows = Vec::new();
        let m = loop {
            let round = shadows.len() as i64;
            let at = write_rows(&c, round * 100, 60, 3000);
            // The test's shadow copy: the primary's pages at `at`.
            let s = c
                .primary
                .database()
                .session(Constraint::Bookmark(at))
                .unwrap();
            shadows.push((at, s.page_images().unwrap().concat()));
            wait_archived(store, at);
            let m = archive.manifest().unwrap();
            if shadows.len() >= 3 && m.snapshots.first().is_some_and(|s| s.bookmark < at) {
                break m;
            }
            assert!(
                round < 20,
                "{kind}: no snapshot after 20 rounds: {:?}",
                c.uploaders.iter().map(|u| u.summary()).collect::<Vec<_>>()
            );
        };
        for (at, want) in &shadows {
            let out = cdir.join("restored.db");
            restore_to_file(&archive, &m, *at, &out, &NoProgress).unwrap();
            let got = std::fs::read(&out).unwrap();
            assert_eq!(got.len(), want.len(), "{kind}: size at {at}");
            assert!(got == *want, "{kind}: pages at {at} differ");
        }
    });
}

fn post(url: &str, bearer: &str) -> (u16, serde_json::Value) {
    let agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .new_agent();
    let mut r = agent
        .post(url)
        .header("authorization", bearer)
        .send(&[] as &[u8])
        .expect("request");
    let status = r.status().as_u16();
    let body: serde_json::Value =
        serde_json::from_slice(&r.body_mut().read_to_vec().unwrap()).unwrap_or(json!(null));
    (status, body)
}

fn count(c: &LocalCluster, at: Bookmark, replica: bool) -> i64 {
    let db = if replica {
        c.replicas[0].replica().database().clone()
    } else {
        c.primary.database().clone()
    };
    let s = db.session(Constraint::Bookmark(at)).unwrap();
    let r = s.prepare("SELECT count(*) AS n FROM t").all().unwrap();
    match r.results[0].get("n") {
        Some(Value::Integer(n)) => *n,
        other => panic!("count: {other:?}"),
    }
}

#[test]
fn time_travel_restores_in_place_as_a_new_commit_that_replicas_follow_and_can_be_undone() {
    let dir = tempfile::tempdir().unwrap();
    each_store("travel", dir.path(), false, |kind, store| {
        let cdir = dir.path().join(format!("c-{kind}"));
        let c = cluster(&cdir, store, 1 << 20);
        let bearer = common::admin_bearer(&c);
        let base = c.primary_http.url();
        let early = write_rows(&c, 0, 20, 100);
        let early_n = count(&c, early, false);
        std::thread::sleep(Duration::from_millis(20));
        let t_early = walrelay_archive::archiver::now_us();
        std::thread::sleep(Duration::from_millis(20));
        let late = write_rows(&c, 1000, 50, 100);
        let late_n = count(&c, late, false);
        assert!(late_n > early_n);

        // The bookmark of a time.
        let (status, body) = post(
            &format!(
                "{base}/v1/databases/main/time_travel/bookmark?timestamp={}",
                t_early / 1_000_000
            ),
            &bearer,
        );
        assert_eq!(status, 200, "{kind}: {body}");
        let named: Bookmark = body["result"]["bookmark"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            named <= early,
            "{kind}: the time names a bookmark at or before it"
        );

        // Restore to the time just after `early` (RFC 3339, to the µs),
        // through a replica (forwarded).
        let replica_base = c.replica_http[0].url();
        let when = chrono::DateTime::from_timestamp_micros(t_early as i64)
            .unwrap()
            .to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
        let (status, body) = post(
            &format!("{replica_base}/v1/databases/main/time_travel/restore?timestamp={when}"),
            &bearer,
        );
        if status != 200 {
            let keys: Vec<String> = store
                .list("0000000000000001/", None)
                .unwrap()
                .into_iter()
                .map(|l| l.key)
                .collect();
            let m = Archive::new(store.clone(), DatabaseId(1))
                .manifest()
                .unwrap();
            panic!(
                "{kind}: {body}\nearly {early}\nkeys {keys:#?}\nmanifest end {} snaps {:?} hist {:?}",
                m.log_end,
                m.snapshots
                    .iter()
                    .map(|s| s.bookmark.to_string())
                    .collect::<Vec<_>>(),
                m.history.runs()
            );
        }
        let restored: Bookmark = body["result"]["bookmark"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        let previous: Bookmark = body["result"]["previous_bookmark"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            restored > previous && previous >= late,
            "{kind}: a new commit after the old state"
        );
        assert_eq!(count(&c, restored, false), early_n, "{kind}: primary");
        assert_eq!(
            count(&c, restored, true),
            early_n,
            "{kind}: the replica follows"
        );
        let s = c
            .primary
            .database()
            .session(Constraint::Bookmark(restored))
            .unwrap();
        assert_eq!(common::integrity(&s), "ok");

        // Undo it: restore the bookmark before it.
        let (status, body) = post(
            &format!("{base}/v1/databases/main/time_travel/restore?bookmark={previous}"),
            &bearer,
        );
        assert_eq!(status, 200, "{kind}: {body}");
        let undone: Bookmark = body["result"]["bookmark"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(count(&c, undone, false), late_n, "{kind}: undone");
        assert_eq!(
            count(&c, undone, true),
            late_n,
            "{kind}: undone on the replica"
        );

        // Bad requests change nothing.
        for (q, status_want) in [
            ("bookmark=nonsense", 400),
            ("", 400),
            ("bookmark=00000001-0000000000000001&timestamp=5", 400),
            ("timestamp=yesterday", 400),
            ("bookmark=7fffffff-0000000000000001", 400),
        ] {
            let (status, body) = post(
                &format!("{base}/v1/databases/main/time_travel/restore?{q}"),
                &bearer,
            );
            assert_eq!(status, status_want, "{kind}: ?{q}: {body}");
            assert_eq!(body["success"], json!(false));
        }
        assert_eq!(
            count(&c, undone, false),
            late_n,
            "{kind}: refusals changed nothing"
        );
    });
}

#[test]
fn a_new_replica_starts_from_the_newest_archived_state_not_the_first_record() {
    let dir = tempfile::tempdir().unwrap();
    each_store("bootstrap", dir.path(), false, |kind, store| {
        let cdir = dir.path().join(format!("c-{kind}"));
        let c = cluster(&cdir, store, 4 << 20);
        // Enough log that the followers release their first segments
        // (16 MiB each in a local cluster).
        // More than the leader keeps in memory (64 MiB), too.
        let at = write_rows(&c, 0, 800, 100_000);
        wait_archived(store, at);
        let deadline = Instant::now() + Duration::from_secs(30);
        while c.followers.iter().any(|f| f.log_start() == Bookmark::ZERO) {
            assert!(
                Instant::now() < deadline,
                "{kind}: the followers never released: {:?} {:?}",
                c.uploaders.iter().map(|u| u.summary()).collect::<Vec<_>>(),
                c.followers
                    .iter()
                    .map(|f| (f.log_start(), f.disk_bytes(), f.confirmed()))
                    .collect::<Vec<_>>()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let leader = c.primary.replica_addr().unwrap();
        let followers: Vec<_> = c.followers.iter().map(|f| f.addr()).collect();
        let config = |path: &Path, store: Option<Store>| ReplicaConfig {
            store,
            mux: None,
            database: DatabaseId(1),
            path: path.to_path_buf(),
            leader,
            followers: followers.clone(),
            backend: Backend::Auto,
            auth: Some(c.cluster_key().clone()),
            options: ReplicaOptions::default(),
            delay_ms: 0,
        };
        let want = count(&c, at, false);
        let archived_to = Archive::new(store.clone(), DatabaseId(1))
            .manifest()
            .unwrap()
            .log_end;
        let started = Instant::now();
        let r = ReplicatedReplica::start(config(&cdir.join("new-replica.db"), Some(store.clone())))
            .unwrap();
        assert!(
            r.replica().confirmed() >= archived_to,
            "{kind}: it opens at the archived state, before any record arrives"
        );
        let s = r
            .replica()
            .database()
            .session(Constraint::Bookmark(at))
            .unwrap();
        let n = s.prepare("SELECT count(*) AS n FROM t").all().unwrap();
        assert_eq!(n.results[0].get("n"), Some(&Value::Integer(want)), "{kind}");
        assert_eq!(common::integrity(&s), "ok");
        eprintln!(
            "{kind}: a replica of {} joined at {archived_to} and served {at} in {:?}",
            c.primary.database().latest_bookmark(),
            started.elapsed()
        );
        // Without cold storage a new replica cannot start: the log from
        // the first record is gone from every follower, and it says so.
        let lost = ReplicatedReplica::start(config(&cdir.join("no-store.db"), None)).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while lost.node().archived().is_none() {
            assert!(
                Instant::now() < deadline,
                "{kind}: the replica never reported the released log"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(
            lost.replica().confirmed(),
            Bookmark::ZERO,
            "{kind}: nothing skipped"
        );
    });
}
