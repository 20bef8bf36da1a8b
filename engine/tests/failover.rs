//! Automatic failover under `walrelay up`, as a user meets it: kill -9 the
//! primary under load (and now and then a follower or a replica) and the
//! writes sent to any node's HTTP port succeed again within seconds; every
//! acknowledged write is there after every recovery; the session
//! consistency checker (`common::consistency`) finds no violation in the
//! recorded history across the failovers; and the cluster restarts from
//! its directory afterwards.
//!
//! 20 primary kills by default, 200 under `WALRELAY_SOAK=1`. Recovery time
//! (kill to the first acknowledged write) is printed as p50/p99 for
//! papers/failover.md.

mod common;

use common::consistency::{CREATE, Event, INDEX, Op, Seen, check, request};
use common::up::{Up, free_base};
use serde_json::json;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use walrelay_engine::http::auth::ApiToken;
use walrelay_engine::http::client::{Client, NodeInfo};

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

/// Sessions running through every node, recorded for the checker.
struct Sessions {
    events: Mutex<Vec<Event>>,
    /// When a write was last acknowledged (ms since the test started).
    last_ack_ms: AtomicU64,
    next_session: AtomicU64,
}

/// One client thread: sessions one after another, each a run of reads and
/// writes sent through the nodes in turn (so through whichever is the
/// primary now, and through replicas that forward), its bookmark carried
/// from each request to the next.
fn client(
    nodes: Vec<NodeInfo>,
    token: Option<ApiToken>,
    log: Arc<Sessions>,
    stop: Arc<AtomicBool>,
    t0: Instant,
) {
    let mut c = Client::new(nodes.clone(), "region-a", "main");
    if let Some(t) = &token {
        c = c.with_token(t);
    }
    let mut k = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let session = log.next_session.fetch_add(1, Ordering::Relaxed) as usize;
        let constraint = if session % 5 == 0 {
            "first-primary"
        } else {
            "first-unconstrained"
        };
        let s = c.session(constraint);
        let mut n = 0;
        for step in 0..12 {
            let op = if step % 3 == 0 {
                Op::Read
            } else {
                n += 1;
                Op::Write { n }
            };
            k += 1;
            let e = request(&s, constraint, session, step, &nodes[k % nodes.len()], op);
            if matches!((e.op, &e.answer), (Op::Write { .. }, Ok(_))) {
                log.last_ack_ms
                    .store(t0.elapsed().as_millis() as u64, Ordering::Relaxed);
            }
            let failed = e.answer.is_err();
            log.events.lock().expect("events").push(e);
            if failed {
                // A session whose write may or may not have run ends
                // here (its later answers could not be judged); the next
                // starts after a pause, as a client backs off.
                std::thread::sleep(Duration::from_millis(20));
                break;
            }
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
    for sql in [CREATE, INDEX] {
        let r = up.query(0, "first-primary", &json!({ "sql": sql }));
        assert_eq!(r.status, 200, "{}", r.json);
    }
    // Every node is addressed as a replica of its own region: the checker
    // then accepts an answer from whichever node is the primary now, and
    // still checks that a node that answers as a replica is the one asked.
    let nodes: Vec<NodeInfo> = ["primary-region", "region-a", "region-b"]
        .iter()
        .enumerate()
        .map(|(i, region)| NodeInfo {
            url: up.http(i as u16),
            region: region.to_string(),
            primary: false,
        })
        .collect();
    let token = up
        .token()
        .map(|t| t.parse::<ApiToken>().expect("the admin token"));
    let log = Arc::new(Sessions {
        events: Mutex::new(Vec::new()),
        last_ack_ms: AtomicU64::new(0),
        next_session: AtomicU64::new(0),
    });
    let stop = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    let clients: Vec<_> = (0..3)
        .map(|_| {
            let (nodes, token, log, stop) = (
                nodes.clone(),
                token.clone(),
                Arc::clone(&log),
                Arc::clone(&stop),
            );
            std::thread::spawn(move || client(nodes, token, log, stop, t0))
        })
        .collect();
    let acked = |log: &Sessions| {
        log.events
            .lock()
            .expect("events")
            .iter()
            .filter(|e| matches!((e.op, &e.answer), (Op::Write { .. }, Ok(_))))
            .count()
    };
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
        let before = acked(&log);
        let deadline = Instant::now() + Duration::from_secs(30);
        while acked(&log) < before + 5 {
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
            let last = log.last_ack_ms.load(Ordering::Relaxed);
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
    for c in clients {
        c.join().expect("client");
    }
    let events = std::mem::take(&mut *log.events.lock().expect("events"));
    let report = check(&events);
    assert!(
        report.violations.is_empty(),
        "the session checker found violations across the failovers:\n{}",
        report.first_violations(20)
    );
    // Every acknowledged write is in the final history.
    let written: BTreeSet<i64> = events
        .iter()
        .filter_map(|e| match (&e.op, &e.answer) {
            (Op::Write { .. }, Ok(a)) => match a.seen {
                Seen::Written { id } => Some(id),
                Seen::State(_) => None,
            },
            _ => None,
        })
        .collect();
    let check_held = |up: &Up| {
        // The last kill's node may still be coming back: ask until it
        // answers.
        let deadline = Instant::now() + Duration::from_secs(60);
        let r = loop {
            let r = up.query(
                0,
                "first-primary",
                &json!({"sql": "SELECT id FROM log ORDER BY id"}),
            );
            if r.status == 200 || Instant::now() >= deadline {
                break r;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        assert_eq!(r.status, 200, "{}", r.json);
        let held: BTreeSet<i64> = r.json["result"][0]["results"]
            .as_array()
            .expect("rows")
            .iter()
            .filter_map(|row| row["id"].as_i64())
            .collect();
        let lost: Vec<&i64> = written.difference(&held).take(10).collect();
        assert!(lost.is_empty(), "acknowledged writes lost: {lost:?}");
    };
    check_held(&up);
    recovery_ms.sort_unstable();
    eprintln!(
        "failover: {kills} primary kills, {} acknowledged writes; checker: {}; recovery (kill to the first acknowledged write) p50 {} ms p99 {} ms max {} ms",
        written.len(),
        report.summary(),
        percentile(&recovery_ms, 50),
        percentile(&recovery_ms, 99),
        recovery_ms.last().copied().unwrap_or(0)
    );
    // And the cluster restarts from its directory with all of it.
    let (status, lines) = up.interrupt();
    assert!(status.success(), "up stopped with {status}: {lines:#?}");
    for l in lines.iter().filter(|l| {
        l.contains("takes over")
            || l.contains("could not promote")
            || l.contains("primary started")
            || l.contains("election won")
    }) {
        eprintln!("{l}");
    }
    let mut again = Up::start(dir.path(), base, &["--writers", "0"]);
    again.wait_serving(2, Duration::from_secs(120));
    check_held(&again);
    let (status, lines) = again.interrupt();
    assert!(status.success(), "up stopped with {status}: {lines:#?}");
}
