//! Automatic failover under `walrelay up`, as a user meets it: kill -9 the
//! primary under load (and now and then a follower or a replica) and the
//! writes sent to any node's HTTP port succeed again within seconds; every
//! acknowledged write is there after every recovery; sessions (a bookmark
//! carried from each write to the next read, on any node) never see an
//! older state; and the cluster restarts from its directory afterwards.
//!
//! 20 primary kills by default, 200 under `WALRELAY_SOAK=1`. Recovery time
//! (kill to the first acknowledged write) is printed as p50/p99 for
//! papers/failover.md.

mod common;

use common::up::{Up, UpClient, free_base};
use serde_json::json;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Node ports `up` serves HTTP on: slot 0 and two replicas.
const NODES: u16 = 3;

fn pid(dir: &std::path::Path, name: &str) -> Option<i32> {
    std::fs::read_to_string(dir.join("pids").join(name))
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn kill9(pid: i32) {
    // SAFETY: kill(2) with SIGKILL on a pid `up` reported for one of its
    // children; at worst the process is already gone and this fails.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
}

/// What the writers saw.
#[derive(Default)]
struct Ledger {
    acked: Mutex<BTreeSet<i64>>,
    violations: Mutex<Vec<String>>,
    /// When the last write was acknowledged (ms since the test started).
    last_ack_ms: AtomicU64,
}

/// A client writing unique ids through the nodes in turn, each write's
/// bookmark carried to a read of it on another node.
fn writer(up: UpClient, w: i64, ledger: Arc<Ledger>, stop: Arc<AtomicBool>, t0: Instant) {
    let mut n = 0i64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let id = w * 1_000_000_000 + n;
        let node = (n as u16) % NODES;
        let r = up.query(
            node,
            "first-unconstrained",
            &json!({"sql": "INSERT INTO acked(id) VALUES (?1)", "params": [id]}),
        );
        if r.status != 200 || r.json["success"] != json!(true) {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        ledger.acked.lock().expect("ledger").insert(id);
        ledger
            .last_ack_ms
            .store(t0.elapsed().as_millis() as u64, Ordering::Relaxed);
        // Read-your-writes on another node, through the session bookmark.
        let Some(b) = r.bookmark else {
            ledger
                .violations
                .lock()
                .expect("ledger")
                .push(format!("write {id} came back without a bookmark"));
            continue;
        };
        let other = (node + 1) % NODES;
        let read = up.query(
            other,
            &b,
            &json!({"sql": "SELECT count(*) AS n FROM acked WHERE id = ?1", "params": [id]}),
        );
        if read.status == 200 && read.json["result"][0]["results"][0]["n"] != json!(1) {
            ledger.violations.lock().expect("ledger").push(format!(
                "node {other} at bookmark {b} did not see write {id}: {}",
                read.json
            ));
        }
    }
}

fn percentile(sorted: &[u64], p: usize) -> u64 {
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)]
}

#[test]
fn killing_the_primary_under_load_fails_over_within_seconds_and_loses_no_acknowledged_write() {
    let kills = if common::soak() { 200 } else { 20 };
    let dir = tempfile::tempdir().expect("dir");
    let base = free_base();
    let mut up = Up::start(dir.path(), base, &["--writers", "1"]);
    up.wait_serving(2, Duration::from_secs(120));
    let create = up.query(
        0,
        "first-primary",
        &json!({"sql": "CREATE TABLE acked(id INTEGER PRIMARY KEY)"}),
    );
    assert_eq!(create.status, 200, "{}", create.json);
    let ledger = Arc::new(Ledger::default());
    let stop = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    let writers: Vec<_> = (1..=3)
        .map(|w| {
            let (up, ledger, stop) = (up.client(), Arc::clone(&ledger), Arc::clone(&stop));
            std::thread::spawn(move || writer(up, w, ledger, stop, t0))
        })
        .collect();
    let mut recovery_ms = Vec::new();
    let mut rng_state = 0x9e37_79b9_u64;
    let mut next = || {
        rng_state ^= rng_state << 13;
        rng_state ^= rng_state >> 7;
        rng_state ^= rng_state << 17;
        rng_state
    };
    for k in 0..kills {
        // Load first: acknowledged writes keep coming before each kill.
        let before = ledger.acked.lock().expect("ledger").len();
        let deadline = Instant::now() + Duration::from_secs(30);
        while ledger.acked.lock().expect("ledger").len() < before + 5 {
            assert!(
                Instant::now() < deadline,
                "kill {k}: no writes before the kill"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // Now and then a follower or a replica goes too.
        match next() % 4 {
            0 => {
                if let Some(p) = pid(dir.path(), &format!("follower-{}", next() % 5)) {
                    kill9(p);
                }
            }
            1 => {
                let primary = std::fs::read_to_string(dir.path().join("primary-slot"))
                    .ok()
                    .and_then(|s| s.trim().parse::<u64>().ok())
                    .unwrap_or(0);
                let slot = (primary + 1 + next() % 2) % u64::from(NODES);
                if let Some(p) = pid(dir.path(), &format!("slot-{slot}")) {
                    kill9(p);
                }
            }
            _ => {}
        }
        let primary = std::fs::read_to_string(dir.path().join("primary.pid"))
            .expect("primary.pid")
            .trim()
            .parse::<i32>()
            .expect("a pid");
        let killed_ms = t0.elapsed().as_millis() as u64;
        kill9(primary);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let last = ledger.last_ack_ms.load(Ordering::Relaxed);
            if last > killed_ms {
                recovery_ms.push(last - killed_ms);
                break;
            }
            assert!(
                Instant::now() < deadline,
                "kill {k}: no write acknowledged within 60 s of the kill"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.join().expect("writer");
    }
    let violations = ledger.violations.lock().expect("ledger").clone();
    assert!(violations.is_empty(), "session violations: {violations:#?}");
    let acked = ledger.acked.lock().expect("ledger").clone();
    let check = |up: &Up| {
        let r = up.query(
            0,
            "first-primary",
            &json!({"sql": "SELECT id FROM acked ORDER BY id"}),
        );
        assert_eq!(r.status, 200, "{}", r.json);
        let held: BTreeSet<i64> = r.json["result"][0]["results"]
            .as_array()
            .expect("rows")
            .iter()
            .filter_map(|row| row["id"].as_i64())
            .collect();
        let lost: Vec<&i64> = acked.difference(&held).take(10).collect();
        assert!(lost.is_empty(), "acknowledged writes lost: {lost:?}");
    };
    check(&up);
    recovery_ms.sort_unstable();
    eprintln!(
        "failover: {kills} primary kills, {} acknowledged writes, recovery (kill to first acknowledged write) p50 {} ms p99 {} ms max {} ms",
        acked.len(),
        percentile(&recovery_ms, 50),
        percentile(&recovery_ms, 99),
        recovery_ms.last().copied().unwrap_or(0)
    );
    // And the cluster restarts from its directory with all of it.
    let (status, lines) = up.interrupt();
    assert!(status.success(), "up stopped with {status}: {lines:#?}");
    let mut again = Up::start(dir.path(), base, &["--writers", "0"]);
    again.wait_serving(2, Duration::from_secs(120));
    check(&again);
    let (status, lines) = again.interrupt();
    assert!(status.success(), "up stopped with {status}: {lines:#?}");
}
