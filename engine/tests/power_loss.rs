//! Power loss, simulated on real files: the followers and a replica (real
//! processes) and the primary lose what they had not synced at a random
//! point, round after round, and no acknowledged write is ever lost.
//!
//! A power cut here: every follower is SIGKILLed and its log loses a random
//! part of what follows the last position it acknowledged (what a sync did
//! not cover may be gone, or torn: cut at a random record boundary, then a
//! random run of garbage); the primary is dropped without a stop and its
//! files (synchronous=OFF) are truncated or scribbled on. Then everything
//! restarts: the primary wins a new epoch, rebuilds from the followers' log
//! and must hold every acknowledged write, with `integrity_check` ok. A
//! replica (a process) loses the WAL frames past its persisted watermark at
//! a random point, with a torn run of garbage, and its wal-index is
//! scribbled on; restarted, it must catch up to every acknowledged write and
//! pass `integrity_check`. (More replica crash states: the
//! `wal_crash_recovery` fuzz target.)
//!
//! 4 rounds by default, 40 under `WALRELAY_SOAK=1`.

mod common;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeSet;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Duration;
use walrelay_engine::replication::{PrimaryConfig, ReplicatedPrimary};
use walrelay_engine::{Constraint, Value};
use walrelay_replicator::{Bookmark, Encoded};

/// Cuts `dir`'s follower log somewhere after the record at `keep` (which
/// it acknowledged, so synced) and leaves a torn run of garbage after the
/// cut; later segments lose everything.
fn lose_unsynced(dir: &Path, keep: Bookmark, rng: &mut SmallRng) {
    let mut cut_done = false;
    for seg in common::procs::segment_files(dir) {
        let bytes = std::fs::read(&seg).expect("read segment");
        // Segments are preallocated with zeros: only the written part
        // matters.
        let used = bytes.iter().rposition(|b| *b != 0).map_or(0, |i| i + 1);
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&seg)
            .expect("open segment");
        if cut_done {
            file.write_all_at(&vec![0u8; used], 0)
                .expect("write segment");
            continue;
        }
        let buf = bytes::Bytes::from(bytes.clone());
        // Boundaries after which a cut keeps `keep`.
        let mut ends = Vec::new();
        let mut reached = keep == Bookmark::ZERO;
        if reached {
            ends.push(0);
        }
        let mut at = 0usize;
        while let Ok((r, used)) = Encoded::decode(&buf.slice(at..)) {
            at += used;
            if r.bookmark == keep {
                reached = true;
            }
            if reached {
                ends.push(at);
            }
        }
        if !reached {
            continue; // all of this segment is before `keep`
        }
        let cut = ends[rng.random_range(0..ends.len())];
        let mut tail = vec![0u8; used.max(cut) - cut];
        let torn = rng.random_range(0..=64.min(bytes.len() - cut));
        tail.resize(tail.len().max(torn), 0);
        for b in &mut tail[..torn] {
            *b = rng.random();
        }
        file.write_all_at(&tail, cut as u64).expect("write segment");
        cut_done = true;
    }
}

/// A replica's files after a power cut: the WAL keeps what its last
/// persist synced (up to the watermark's frame) and a random part of the
/// rest, torn; the wal-index (never synced) holds anything.
fn lose_replica_unsynced(db: &Path, rng: &mut SmallRng) {
    let Some(w) = walrelay_vfs::watermark::persisted(db) else {
        return;
    };
    let [_, wal, shm, _] = walrelay_vfs::replica_files(db);
    if let Ok(len) = std::fs::metadata(&wal).map(|m| m.len()) {
        let synced = if w.frame == 0 {
            0
        } else {
            walrelay_vfs::wal_format::WAL_HEADER_BYTES as u64
                + u64::from(w.frame) * walrelay_vfs::wal_format::frame_bytes(w.page_size)
        };
        if len > synced {
            let cut = rng.random_range(synced..=len);
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(&wal)
                .expect("open wal");
            f.set_len(cut).expect("cut wal");
            let torn: Vec<u8> = (0..rng.random_range(0..64)).map(|_| rng.random()).collect();
            f.write_all_at(&torn, cut).expect("torn tail");
        }
    }
    if let Ok(mut bytes) = std::fs::read(&shm) {
        for _ in 0..8 {
            if !bytes.is_empty() {
                let i = rng.random_range(0..bytes.len());
                bytes[i] = rng.random();
            }
        }
        std::fs::write(&shm, &bytes).expect("write shm");
    }
}

/// Starts the replica process.
fn spawn_replica(
    dir: &Path,
    leader: std::net::SocketAddr,
    followers: &[std::net::SocketAddr],
    key: &Path,
) -> common::procs::Proc {
    let mut args = vec![
        "replica".to_string(),
        "--dir".into(),
        dir.display().to_string(),
        "--leader".into(),
        leader.to_string(),
        "--followers".into(),
        common::procs::join_addrs(followers),
    ];
    args.extend(common::procs::key_args(key));
    let mut p = common::procs::Proc::spawn("replica", &args);
    p.wait_line("following");
    p
}

/// The ids a stopped replica at `dir` shows, and its integrity check.
fn replica_ids(dir: &Path) -> (BTreeSet<i64>, String) {
    let r = walrelay_engine::Replica::open(
        walrelay_engine::replication::database_path(dir),
        walrelay_engine::ReplicaOptions::default(),
    )
    .expect("the replica reopens");
    let s = r.session(Constraint::FirstUnconstrained).expect("session");
    let ids = s
        .prepare("SELECT id FROM t")
        .all()
        .map(|q| {
            q.results
                .iter()
                .filter_map(|row| row.get("id").and_then(Value::as_i64))
                .collect()
        })
        .unwrap_or_default();
    let check = common::integrity(&s);
    (ids, check)
}

/// The primary's files after a power cut at synchronous=OFF: anything.
fn scribble_primary(path: &Path, rng: &mut SmallRng) {
    for suffix in ["", "-wal"] {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        let Ok(mut bytes) = std::fs::read(&p) else {
            continue;
        };
        match rng.random_range(0..3) {
            0 => bytes.truncate(rng.random_range(0..=bytes.len())),
            1 => {
                for _ in 0..16 {
                    if !bytes.is_empty() {
                        let i = rng.random_range(0..bytes.len());
                        bytes[i] = rng.random();
                    }
                }
            }
            _ => {}
        }
        std::fs::write(&p, &bytes).expect("write");
    }
}

#[test]
fn after_power_cuts_on_the_followers_the_primary_and_a_replica_no_acknowledged_write_is_lost() {
    let rounds = if common::soak() { 40 } else { 4 };
    let seed = common::seeds(1, 1)[0];
    let mut rng = SmallRng::seed_from_u64(seed);
    eprintln!("power loss seed {seed}");
    let dir = tempfile::tempdir().expect("dir");
    let (key_path, key) = common::procs::cluster_key_file(dir.path());
    let (mut procs, addrs) = common::procs::spawn_followers(dir.path(), 3, &key_path);
    let path = dir.path().join("p.db");
    let replica_dir = dir.path().join("replica");
    let mut replica: Option<common::procs::Proc> = None;
    let mut acked: BTreeSet<i64> = BTreeSet::new();
    let mut next_id = 0i64;
    for round in 0..=rounds {
        let mut config = PrimaryConfig::new(&path, addrs.clone(), Some(key.clone()));
        config.confirm_timeout_ms = 5_000;
        // A dropped primary's leader keeps its listening socket in this
        // process: each round listens for the replica on a new port, and
        // the replica restarts with it.
        let leader = common::procs::free_port();
        config.listen = Some(leader);
        let p = ReplicatedPrimary::start(config).expect("the primary recovers");
        // One process at a time on the replica's files (its node holds
        // them exclusively): a replica that survived the last cut stops
        // cleanly before the next one starts on the new port.
        if let Some(mut r) = replica.take() {
            r.interrupt();
        }
        replica = Some(spawn_replica(&replica_dir, leader, &addrs, &key_path));
        let s = p
            .database()
            .session(Constraint::FirstPrimary)
            .expect("session");
        s.prepare("CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY)")
            .run()
            .expect("create");
        // Every write acknowledged before is here.
        let held: BTreeSet<i64> = s
            .prepare("SELECT id FROM t")
            .all()
            .expect("read")
            .results
            .iter()
            .filter_map(|r| r.get("id").and_then(Value::as_i64))
            .collect();
        let lost: Vec<&i64> = acked.difference(&held).take(10).collect();
        assert!(
            lost.is_empty(),
            "round {round}: acknowledged writes lost: {lost:?}"
        );
        assert_eq!(common::integrity(&s), "ok", "round {round}");
        if round == rounds {
            drop(s);
            // The replica catches up with everything acknowledged.
            let last = p.database().latest_bookmark();
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            loop {
                let caught_up = replica.as_ref().expect("running").lines().iter().any(|l| {
                    l.split("confirmed=")
                        .nth(1)
                        .and_then(|b| b.split_whitespace().next())
                        .and_then(|b| b.parse::<Bookmark>().ok())
                        .is_some_and(|b| b >= last)
                });
                if caught_up {
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "the replica never caught up to {last}"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
            replica.take().expect("running").interrupt();
            let (ids, check) = replica_ids(&replica_dir);
            let missing: Vec<&i64> = acked.difference(&ids).take(10).collect();
            assert!(
                missing.is_empty(),
                "the replica lacks acknowledged writes: {missing:?}"
            );
            assert_eq!(check, "ok", "the replica's integrity check");
            p.stop(Duration::from_secs(10))
                .expect("a clean stop at the end");
            break;
        }
        for _ in 0..rng.random_range(5..40) {
            next_id += 1;
            s.prepare("INSERT INTO t(id) VALUES (?1)")
                .bind([Value::Integer(next_id)])
                .run()
                .expect("acknowledged");
            acked.insert(next_id);
        }
        let durable: Vec<Bookmark> = (0..addrs.len())
            .map(|i| p.leader().follower_durable(i).unwrap_or(Bookmark::ZERO))
            .collect();
        drop(s);
        // The power goes: followers first, the primary and the replica
        // with them.
        for f in &mut procs {
            f.kill();
        }
        drop(p);
        if round % 2 == 1 {
            if let Some(mut r) = replica.take() {
                r.kill();
            }
            lose_replica_unsynced(
                &walrelay_engine::replication::database_path(&replica_dir),
                &mut rng,
            );
        }
        for (i, keep) in durable.iter().enumerate() {
            lose_unsynced(&dir.path().join(format!("follower-{i}")), *keep, &mut rng);
        }
        scribble_primary(&path, &mut rng);
        procs = common::procs::spawn_followers_at(dir.path(), &addrs, &key_path);
    }
    eprintln!(
        "power loss: {rounds} cuts, {} acknowledged writes kept",
        acked.len()
    );
}

/// A rollback journal left beside a database by a writer that lost power
/// mid-transaction is rolled back when walrelay opens it: the database
/// opens as of its last commit, in WAL mode, and takes writes. The same
/// holds when page 1 already said WAL (a cut in the middle of the open's
/// own switch to WAL). The walrelay VFS never opens a rollback journal,
/// so the open rolls it back through SQLite's own VFS first.
#[test]
fn a_hot_rollback_journal_left_by_a_power_cut_is_rolled_back_at_open() {
    use walrelay_engine::{Database, Options};
    for header_says_wal in [false, true] {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("writer.sqlite");
        let c = rusqlite::Connection::open(&path).expect("plain open");
        c.execute_batch(
            "PRAGMA journal_mode=DELETE; PRAGMA cache_size=2;
             CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB NOT NULL);
             WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100)
             INSERT INTO t(v) SELECT randomblob(500) FROM n;
             BEGIN;
             WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2000)
             INSERT INTO t(v) SELECT randomblob(500) FROM n;",
        )
        .expect("a transaction that spills into the database file");
        // The power cut: the files as they are mid-transaction.
        let cut = dir.path().join("cut.sqlite");
        std::fs::copy(&path, &cut).expect("copy the database");
        let journal = dir.path().join("cut.sqlite-journal");
        std::fs::copy(dir.path().join("writer.sqlite-journal"), &journal)
            .expect("a journal exists mid-transaction");
        drop(c);
        if header_says_wal {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(&cut)
                .expect("db");
            f.write_all_at(&[2, 2], 18).expect("header");
        }
        let db = Database::open(&cut, Options::default()).expect("opens");
        assert!(!journal.exists(), "rolled back and removed");
        let s = db.session(Constraint::FirstPrimary).expect("session");
        let count = |s: &walrelay_engine::Session| {
            let r = s
                .prepare("SELECT count(*) AS n FROM t")
                .all()
                .expect("count");
            r.results[0].get("n").cloned()
        };
        assert_eq!(
            count(&s),
            Some(Value::Integer(100)),
            "as of the last commit"
        );
        s.prepare("INSERT INTO t(v) VALUES (x'00')")
            .run()
            .expect("takes writes");
        assert_eq!(count(&s), Some(Value::Integer(101)));
    }
}
