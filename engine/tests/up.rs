//! `walrelay up`, the README's main command: a local cluster of real
//! processes that reports commit latency and confirm lag, and stops
//! cleanly on Ctrl-C (SIGINT) — every process, with the primary's commits
//! all confirmed — and starts again from the same directory, with the same
//! cluster key.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A base port with every port `up` derives from it free (best effort;
/// ports are only probed, then released).
fn free_base() -> u16 {
    for _ in 0..200 {
        let base = 20_000 + (std::process::id() as u16 % 20_000) + rand_u16() % 5_000;
        // The primary and followers use base..=base+5, HTTP base+10..=base+12.
        let all_free = (0..13).all(|i| TcpListener::bind(("127.0.0.1", base + i)).is_ok());
        if all_free {
            return base;
        }
    }
    panic!("no free port range");
}

fn rand_u16() -> u16 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    (nanos >> 8) as u16
}

/// Runs `up` until it has reported `want` primary lines, then sends SIGINT;
/// returns every line printed.
fn run_up(dir: &std::path::Path, base: u16) -> Vec<String> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_walrelay"))
        .args([
            "up",
            "--dir",
            &dir.display().to_string(),
            "--base-port",
            &base.to_string(),
            "--writers",
            "2",
        ])
        .env("RUST_BACKTRACE", "0")
        .stdout(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("spawn walrelay up");
    let out = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut lines = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut primary_reports = 0;
    let mut lag_reports = 0;
    while primary_reports < 2 || lag_reports < 2 {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx.recv_timeout(left).unwrap_or_else(|_| {
            let _ = child.kill();
            panic!("up did not report in time: {lines:#?}")
        });
        if line.contains("commit_p50_us=") {
            primary_reports += 1;
        }
        if line.contains("confirm_lag_p50_us=") {
            lag_reports += 1;
        }
        lines.push(line);
    }
    // What a terminal's Ctrl-C does: SIGINT to the foreground process
    // group, which `up` leads here.
    // SAFETY: kill(2) with SIGINT on the process group of our own child.
    unsafe {
        libc::kill(-(child.id() as libc::pid_t), libc::SIGINT);
    }
    let status = child.wait().expect("wait");
    lines.extend(rx.try_iter());
    // Anything still printing arrives shortly after the exit.
    std::thread::sleep(Duration::from_millis(100));
    lines.extend(rx.try_iter());
    assert!(status.success(), "up exited with {status}: {lines:#?}");
    lines
}

#[test]
fn up_runs_a_cluster_reports_latency_and_lag_and_stops_cleanly_on_ctrl_c() {
    let dir = tempfile::tempdir().expect("dir");
    let base = free_base();
    let lines = run_up(dir.path(), base);
    let has = |s: &str| lines.iter().any(|l| l.contains(s));
    assert!(has("primary stopped cleanly at"), "{lines:#?}");
    assert_eq!(
        lines.iter().filter(|l| l.contains("stopping at")).count(),
        7,
        "five followers and two replicas stop: {lines:#?}"
    );
    assert!(has("walrelay up: stopped"));
    assert!(has("replication authenticated with"), "{lines:#?}");
    let key_file = dir.path().join("cluster.key");
    let mode = std::fs::metadata(&key_file).expect("up made a cluster key");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(mode.permissions().mode() & 0o777, 0o600);
    let key = std::fs::read(&key_file).expect("key");

    // Again from the same directory: the log continues in a new epoch,
    // with the same key.
    let lines = run_up(dir.path(), base);
    assert_eq!(std::fs::read(&key_file).expect("key"), key);
    assert!(
        lines.iter().any(|l| l.starts_with("primary epoch 2")),
        "{lines:#?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("primary stopped cleanly at 00000002-"))
    );
}
