//! `walrelay up`, the README's main command: a local cluster of real
//! processes that reports commit latency and confirm lag, authenticates its
//! HTTP API by default, stops cleanly on Ctrl-C (SIGINT) — every process,
//! with the primary's commits all confirmed — even with runaway queries
//! running, and starts again from the same directory.

mod common;

use common::up::{ThreadPolicy, Up, free_base};
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

/// `up` runs one at a time here: each test takes a port range and a disk
/// share that the others would contend for.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn select_one() -> serde_json::Value {
    serde_json::json!({ "sql": "SELECT 1 AS one" })
}

/// Waits for two latency reports from the primary and two lag reports
/// from a replica.
fn wait_reports(up: &mut Up) {
    for _ in 0..2 {
        up.wait_line("a commit latency report", Duration::from_secs(60), |l| {
            l.contains("commit_p50_us=")
        });
        up.wait_line("a confirm lag report", Duration::from_secs(60), |l| {
            l.contains("confirm_lag_p50_us=")
        });
    }
}

fn mode(path: &std::path::Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

#[test]
fn up_runs_an_authenticated_cluster_reports_latency_and_lag_and_restarts_after_ctrl_c() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().expect("dir");
    let base = free_base();
    let mut up = Up::start(dir.path(), base, &["--writers", "2"]);
    wait_reports(&mut up);
    up.wait_serving(2, Duration::from_secs(30));
    // Authentication is on by default: an admin token for the owner only,
    // used by the printed curl example; the cluster key likewise.
    let token_file = dir.path().join("token");
    assert_eq!(mode(&token_file), 0o600, "DIR/token is the owner's only");
    assert_eq!(mode(&dir.path().join("cluster.key")), 0o600);
    assert!(dir.path().join("tokens").exists(), "the token store");
    let token = up.token().expect("a token");
    let lines = up.drain().to_vec();
    assert!(
        lines.iter().any(|l| l.contains("curl")
            && l.contains(&format!(
                "Authorization: Bearer $(cat {})",
                token_file.display()
            ))),
        "{lines:#?}"
    );
    for node in 0..=2 {
        let r = up.query_as(node, "first-unconstrained", &select_one(), None);
        assert_eq!(r.status, 401, "node {node}: {r:?}");
        let r = up.query_as(node, "first-unconstrained", &select_one(), Some("wrt_0_0"));
        assert_eq!(r.status, 401, "node {node}: {r:?}");
        let r = up.query(node, "first-unconstrained", &select_one());
        assert_eq!(r.status, 200, "node {node}: {r:?}");
    }
    assert_every_thread_runs_under(&up, libc::SCHED_BATCH, libc::SCHED_BATCH);
    let (status, lines) = up.interrupt();
    assert!(status.success(), "{lines:#?}");
    let has = |s: &str| lines.iter().any(|l| l.contains(s));
    assert!(has("primary stopped cleanly at"), "{lines:#?}");
    assert_eq!(
        lines.iter().filter(|l| l.contains("stopping at")).count(),
        7,
        "five followers and two replicas stop: {lines:#?}"
    );
    assert!(has("walrelay up: stopped"));

    // Again from the same directory: the log continues in a new epoch, the
    // token minted on the first start still works, and the key is kept.
    let key = std::fs::read(dir.path().join("cluster.key")).expect("key");
    let mut up = Up::start(dir.path(), base, &["--writers", "2"]);
    wait_reports(&mut up);
    up.wait_serving(2, Duration::from_secs(30));
    assert_eq!(up.token().as_deref(), Some(token.as_str()), "minted once");
    assert_eq!(
        std::fs::read(dir.path().join("cluster.key")).expect("key"),
        key
    );
    let (status, lines) = up.interrupt();
    assert!(status.success(), "{lines:#?}");
    assert!(
        lines.iter().any(|l| l.starts_with("primary epoch 2")),
        "{lines:#?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("primary stopped cleanly at 00000002-")),
        "{lines:#?}"
    );
}

/// The `commits/s=N` of a primary status line.
fn commits_per_s(line: &str) -> Option<u64> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("commits/s="))
        .and_then(|n| n.parse().ok())
}

/// Every thread of every process `up` runs (followers, primary, fleet
/// nodes) is scheduled under `policy` (`--cpu-scheduling`, batch by
/// default) and every replica's under `replica_policy`
/// (`--replica-cpu-scheduling`), but a follower's upload work: a round's
/// thread and the store's helper threads it started run under
/// `SCHED_IDLE` (lever 67).
fn assert_every_thread_runs_under(up: &Up, policy: i32, replica_policy: i32) {
    let threads = up.thread_policies();
    let names: std::collections::BTreeSet<&str> =
        threads.iter().map(|t| t.process.as_str()).collect();
    assert!(
        names.len() >= 8,
        "five followers and three data nodes: {names:?}"
    );
    let upload_work = |t: &ThreadPolicy| {
        t.process.starts_with("follower")
            && t.policy == libc::SCHED_IDLE
            && ["walrelay-idle", "walrelay-store"].contains(&t.thread.as_str())
    };
    // Slot 0 is the primary until a failover (none here).
    let replica = |t: &ThreadPolicy| t.process.starts_with("slot-") && t.process != "slot-0";
    let wanted = |t: &ThreadPolicy| if replica(t) { replica_policy } else { policy };
    assert!(
        threads.iter().any(replica),
        "the replicas' threads are seen: {threads:?}"
    );
    let other: Vec<_> = threads
        .iter()
        .filter(|t| t.policy != wanted(t) && !upload_work(t))
        .collect();
    assert!(
        other.is_empty(),
        "threads not under policy {policy}: {other:?}"
    );
}

#[test]
fn up_insecure_serves_without_a_token_and_warns_on_every_start() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().expect("dir");
    let base = free_base();
    for start in 0..2 {
        // The second start hands `normal` scheduling to every process but
        // the replicas, which keep `batch`.
        let extra: &[&str] = if start == 0 {
            &["--writers", "0", "--insecure"]
        } else {
            &[
                "--writers",
                "0",
                "--insecure",
                "--cpu-scheduling",
                "normal",
                "--replica-cpu-scheduling",
                "batch",
            ]
        };
        let mut up = Up::start(dir.path(), base, extra);
        up.wait_line("the insecure warning", Duration::from_secs(30), |l| {
            l.contains("WARNING") && l.contains("insecure")
        });
        up.wait_serving(2, Duration::from_secs(30));
        assert!(up.token().is_none(), "no token is minted");
        for node in 0..=2 {
            let r = up.query_as(node, "first-unconstrained", &select_one(), None);
            assert_eq!(r.status, 200, "{:?}", r.json);
        }
        if start == 0 {
            status_line_counts_http_writes(&mut up);
        } else {
            assert_every_thread_runs_under(&up, libc::SCHED_OTHER, libc::SCHED_BATCH);
        }
        let (status, lines) = up.interrupt();
        assert!(status.success(), "{lines:#?}");
    }
}

/// With no demo writers, the primary's status line still counts the
/// writes clients make over HTTP (to the primary and through a replica).
fn status_line_counts_http_writes(up: &mut Up) {
    let create = serde_json::json!({ "sql": "CREATE TABLE t(x)" });
    assert_eq!(up.query_as(0, "first-primary", &create, None).status, 200);
    let client = up.client();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let done = std::sync::Arc::clone(&done);
        std::thread::spawn(move || {
            let insert = serde_json::json!({ "sql": "INSERT INTO t VALUES (1)" });
            let mut n = 0u64;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let r = client.query((n % 2) as u16, "first-primary", &insert);
                assert_eq!(r.status, 200, "{:?}", r.json);
                n += 1;
            }
            n
        })
    };
    let line = up.wait_line(
        "a status line counting HTTP writes",
        Duration::from_secs(30),
        |l| l.starts_with("primary confirmed=") && commits_per_s(l).is_some_and(|n| n > 0),
    );
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let written = writer.join().expect("writer");
    assert!(written > 0, "{line}");
    assert!(
        !line.contains("commit_p50_us="),
        "no demo writer, no demo latency: {line}"
    );
}

#[test]
fn up_stops_promptly_on_ctrl_c_with_runaway_queries_running_and_starts_again() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().expect("dir");
    let base = free_base();
    let mut up = Up::start(dir.path(), base, &["--writers", "2"]);
    wait_reports(&mut up);
    up.wait_serving(2, Duration::from_secs(30));
    let token = up.token().expect("token");
    // Five on the primary, two on each replica: each would run for the
    // whole 30 s query time limit.
    let mut runaways = Vec::new();
    for (port, n) in [(base + 10, 5), (base + 11, 2), (base + 12, 2)] {
        for _ in 0..n {
            let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
            runaways.push(common::raw_http::send_query(
                addr,
                common::RUNAWAY,
                Some(&token),
            ));
        }
    }
    // Let them reach SQLite.
    std::thread::sleep(Duration::from_millis(500));
    let (status, lines, took) = up.interrupt_timed();
    println!("up stopped {took:?} after SIGINT with runaway queries running");
    assert!(status.success(), "{lines:#?}");
    // Generous: proves it does not hang (30 s runaways, a 2 s HTTP grace).
    assert!(
        took < Duration::from_secs(15),
        "stopping took {took:?}: {lines:#?}"
    );
    // Every runaway got an answer (503: stopped), none was left hanging.
    for mut s in runaways {
        use std::io::Read;
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        assert!(
            answer.starts_with("HTTP/1.1 503"),
            "a runaway's answer: {answer:?}"
        );
    }
    let mut up = Up::start(dir.path(), base, &["--writers", "2"]);
    wait_reports(&mut up);
    let (status, lines) = up.interrupt();
    assert!(status.success(), "{lines:#?}");
    assert!(
        lines.iter().any(|l| l.starts_with("primary epoch 2")),
        "{lines:#?}"
    );
}

/// Runs `walrelay up --dir dir` with `args`, which it must refuse: its exit
/// code and standard error.
fn up_refusing(dir: &std::path::Path, args: &[&str]) -> (Option<i32>, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_walrelay"))
        .args(["up", "--dir", &dir.display().to_string()])
        .args(args)
        .output()
        .expect("run walrelay up");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn up_refuses_options_out_of_range_with_a_clear_error_and_starts_nothing() {
    let dir = tempfile::tempdir().expect("dir");
    for (args, says) in [
        (&["--writers", "100000"][..], "0..=64"),
        (&["--followers", "0"][..], "1..=9"),
        (&["--base-port", "0"][..], "1..=65535"),
        (&["--max-transaction-bytes", "0"][..], "16384.."),
        (
            &["--group-commit-delay-us", "99999999999"][..],
            "0..=100000",
        ),
        (&["--heartbeat-ms", "0"][..], "100.."),
        (&["--confirm-timeout-ms", "0"][..], "1.."),
    ] {
        let (code, stderr) = up_refusing(dir.path(), args);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains("invalid value") && stderr.contains(says),
            "{args:?}: {stderr}"
        );
    }
    // Checked against the follower count, before anything starts.
    for args in [&["--eager-followers", "2"][..], &["--eager-followers", "6"]] {
        let (code, stderr) = up_refusing(dir.path(), args);
        assert_eq!(code, Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.contains("between W (3) and N (5)"),
            "{args:?}: {stderr}"
        );
    }
    assert_eq!(
        std::fs::read_dir(dir.path()).expect("dir").count(),
        0,
        "nothing was written"
    );
}
