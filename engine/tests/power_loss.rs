//! Power loss, simulated on real files: the followers (real processes) and
//! the primary lose what they had not synced at a random point, round
//! after round, and no acknowledged write is ever lost.
//!
//! A power cut here: every follower is SIGKILLed and its log loses a random
//! part of what follows the last position it acknowledged (what a sync did
//! not cover may be gone, or torn: cut at a random record boundary, then a
//! random run of garbage); the primary is dropped without a stop and its
//! files (synchronous=OFF) are truncated or scribbled on. Then everything
//! restarts: the primary wins a new epoch, rebuilds from the followers' log
//! and must hold every acknowledged write, with `integrity_check` ok.
//! Replicas' crash states are the `wal_crash_recovery` fuzz target's.
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
fn after_power_cuts_on_the_followers_and_the_primary_no_acknowledged_write_is_lost() {
    let rounds = if common::soak() { 40 } else { 4 };
    let seed = common::seeds(1, 1)[0];
    let mut rng = SmallRng::seed_from_u64(seed);
    eprintln!("power loss seed {seed}");
    let dir = tempfile::tempdir().expect("dir");
    let (key_path, key) = common::procs::cluster_key_file(dir.path());
    let (mut procs, addrs) = common::procs::spawn_followers(dir.path(), 3, &key_path);
    let path = dir.path().join("p.db");
    let mut acked: BTreeSet<i64> = BTreeSet::new();
    let mut next_id = 0i64;
    for round in 0..=rounds {
        let mut config = PrimaryConfig::new(&path, addrs.clone(), Some(key.clone()));
        config.confirm_timeout_ms = 5_000;
        let p = ReplicatedPrimary::start(config).expect("the primary recovers");
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
        let check = s
            .prepare("PRAGMA integrity_check")
            .first()
            .expect("check")
            .and_then(|r| {
                r.get("integrity_check")
                    .and_then(|v| v.as_str().map(String::from))
            });
        assert_eq!(check.as_deref(), Some("ok"), "round {round}");
        if round == rounds {
            drop(s);
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
        // The power goes: followers first, the primary with them.
        for f in &mut procs {
            f.kill();
        }
        drop(p);
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
